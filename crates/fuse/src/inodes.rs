//! Inode numbers handed to the kernel, and the entries they stand for.
//!
//! An entry's inode number is [`EntryId::ino`], a pure function of its id:
//! the same on every mount, after the kernel forgot the inode, after
//! restarts, and for every hard link. The kernel's node id is that number
//! too (it is never reused for another entry, so the generation is always
//! 0). This table maps the numbers the kernel holds references to (lookup
//! count) to where the entries live, so memory follows what the kernel
//! caches, not the size of the file system. A number the kernel comes back
//! with after forgetting it (a file handle, NFS re-export) is resolved from
//! the id again (`EntryId::from_ino`).
//!
//! For directories it also keeps the attributes last shown to the kernel: a
//! directory removed while the kernel still holds it (an open descriptor, a
//! process's current directory) keeps answering `fstat` and attribute
//! changes from them, with no links, as Linux does (the metadata node has
//! forgotten it; see `docs/design-meta.md`, "Known gaps").

use hivefs_client::Ent;
use hivefs_types::attr::{EntryAttr, FileKind};
use hivefs_types::ids::EntryId;
use std::collections::HashMap;
use tracing::error;

pub const ROOT_INO: u64 = 1;

struct Node {
    ent: Ent,
    nlookup: u64,
    /// Directories: the attributes last shown to the kernel.
    dir: Option<Box<EntryAttr>>,
}

pub struct Inodes {
    by_ino: HashMap<u64, Node>,
}

impl Inodes {
    pub fn new(root: Ent) -> Inodes {
        debug_assert_eq!(root.id.ino(), ROOT_INO);
        let mut by_ino = HashMap::new();
        by_ino.insert(ROOT_INO, Node { ent: root, nlookup: 1, dir: None });
        Inodes { by_ino }
    }

    /// The inode number for `ent`, taking one kernel reference.
    pub fn remember(&mut self, ent: Ent) -> u64 {
        let ino = ent.id.ino();
        let n = self.by_ino.entry(ino).or_insert(Node { ent, nlookup: 0, dir: None });
        if n.ent.id != ent.id {
            // Only ids outside the exact space (a store from before its
            // bounds) have hashed numbers that can meet; the newer wins.
            error!("inode number {ino:#x} of {} is also that of {}: the older entry is shadowed", ent.id, n.ent.id);
        }
        n.nlookup += 1;
        n.ent = ent; // the owner may have changed (rename across nodes)
        ino
    }

    /// Updates where a known entry lives (a file moved to another metadata
    /// node by a rename), without taking a reference.
    pub fn update(&mut self, ent: Ent) {
        if let Some(n) = self.by_ino.get_mut(&ent.id.ino()).filter(|n| n.ent.id == ent.id) {
            n.ent = ent;
        }
    }

    /// The inode number the kernel knows `id` by, if it holds a reference.
    pub fn ino_of(&self, id: &EntryId) -> Option<u64> {
        let ino = id.ino();
        self.by_ino.get(&ino).filter(|n| n.ent.id == *id).map(|_| ino)
    }

    /// Notes the attributes of a directory the kernel is shown.
    pub fn shown(&mut self, ino: u64, a: &EntryAttr) {
        if a.kind != FileKind::Dir {
            return;
        }
        if let Some(n) = self.by_ino.get_mut(&ino).filter(|n| n.ent.id == a.id) {
            match &mut n.dir {
                Some(d) => (**d).clone_from(a),
                None => n.dir = Some(Box::new(a.clone())),
            }
        }
    }

    /// A directory the kernel still holds that its metadata node no longer
    /// has (removed): its last attributes, without links or size, changed
    /// by `change` (an attribute change through a descriptor). `None` for
    /// anything else.
    pub fn removed_dir(&mut self, ino: u64, change: impl FnOnce(&mut EntryAttr)) -> Option<EntryAttr> {
        let d = self.by_ino.get_mut(&ino)?.dir.as_mut()?;
        d.nlink = 0;
        d.size = 0;
        change(d);
        Some((**d).clone())
    }

    pub fn get(&self, ino: u64) -> Option<Ent> {
        self.by_ino.get(&ino).map(|n| n.ent)
    }

    pub fn forget(&mut self, ino: u64, n: u64) {
        if ino == ROOT_INO {
            return;
        }
        if let Some(node) = self.by_ino.get_mut(&ino) {
            node.nlookup = node.nlookup.saturating_sub(n);
            if node.nlookup == 0 {
                self.by_ino.remove(&ino);
            }
        }
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.by_ino.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hivefs_types::ids::NodeId;

    #[test]
    fn numbers_are_the_ids_and_live_while_referenced() {
        let root = Ent { id: EntryId::ROOT, owner: NodeId(1) };
        let mut t = Inodes::new(root);
        let e = Ent { id: EntryId { node: 1, epoch: 1, counter: 9 }, owner: NodeId(1) };
        let a = t.remember(e);
        assert_eq!(a, e.id.ino());
        assert_eq!(t.remember(e), a);
        t.forget(a, 1);
        assert_eq!(t.get(a), Some(e));
        assert_eq!(t.ino_of(&e.id), Some(a));
        t.forget(a, 1);
        assert_eq!(t.get(a), None);
        assert_eq!(t.ino_of(&e.id), None);
        assert_eq!(t.len(), 1);
        // Forgotten and found again: the same number.
        assert_eq!(t.remember(e), a);
        t.forget(ROOT_INO, 10);
        assert_eq!(t.get(ROOT_INO), Some(root));
    }

    #[test]
    fn a_moved_entry_keeps_its_number() {
        let mut t = Inodes::new(Ent { id: EntryId::ROOT, owner: NodeId(1) });
        let id = EntryId { node: 2, epoch: 5, counter: 3 };
        let a = t.remember(Ent { id, owner: NodeId(2) });
        t.update(Ent { id, owner: NodeId(3) });
        assert_eq!(t.get(a), Some(Ent { id, owner: NodeId(3) }));
        assert_eq!(t.remember(Ent { id, owner: NodeId(3) }), a);
    }
}
