//! Inode numbers handed to the kernel, and the entries they stand for.
//!
//! Entry ids are 128 bits; the kernel wants 64-bit inode numbers. Numbers are
//! assigned on first sight and kept while the kernel holds a reference
//! (lookup count), so memory follows what the kernel caches, not the size of
//! the file system.

use hivefs_client::Ent;
use hivefs_types::ids::EntryId;
use std::collections::HashMap;

pub const ROOT_INO: u64 = 1;

struct Node {
    ent: Ent,
    nlookup: u64,
}

pub struct Inodes {
    by_ino: HashMap<u64, Node>,
    by_id: HashMap<EntryId, u64>,
    next: u64,
}

impl Inodes {
    pub fn new(root: Ent) -> Inodes {
        let mut by_ino = HashMap::new();
        by_ino.insert(ROOT_INO, Node { ent: root, nlookup: 1 });
        let mut by_id = HashMap::new();
        by_id.insert(root.id, ROOT_INO);
        Inodes { by_ino, by_id, next: ROOT_INO + 1 }
    }

    /// The inode number for `ent`, taking one kernel reference.
    pub fn remember(&mut self, ent: Ent) -> u64 {
        if let Some(&ino) = self.by_id.get(&ent.id) {
            let n = self.by_ino.get_mut(&ino).expect("by_id and by_ino agree");
            n.nlookup += 1;
            n.ent = ent; // the owner may have changed (rename across nodes)
            return ino;
        }
        let ino = self.next;
        self.next += 1;
        self.by_ino.insert(ino, Node { ent, nlookup: 1 });
        self.by_id.insert(ent.id, ino);
        ino
    }

    /// Updates where a known entry lives (a file moved to another metadata
    /// node by a rename), without taking a reference.
    pub fn update(&mut self, ent: Ent) {
        if let Some(n) = self.by_id.get(&ent.id).and_then(|ino| self.by_ino.get_mut(ino)) {
            n.ent = ent;
        }
    }

    /// The inode number the kernel knows `id` by, if it knows it.
    pub fn ino_of(&self, id: &EntryId) -> Option<u64> {
        self.by_id.get(id).copied()
    }

    pub fn get(&self, ino: u64) -> Option<Ent> {
        self.by_ino.get(&ino).map(|n| n.ent)
    }

    /// Inode number for a directory listing without taking a reference:
    /// the known number, or a stable hash that cannot collide with assigned ones.
    pub fn peek_ino(&self, id: &EntryId) -> u64 {
        self.by_id
            .get(id)
            .copied()
            .unwrap_or_else(|| (1 << 63) | (id.counter ^ (u64::from(id.node) << 40) ^ (u64::from(id.epoch) << 20)))
    }

    pub fn forget(&mut self, ino: u64, n: u64) {
        if ino == ROOT_INO {
            return;
        }
        if let Some(node) = self.by_ino.get_mut(&ino) {
            node.nlookup = node.nlookup.saturating_sub(n);
            if node.nlookup == 0 {
                let id = node.ent.id;
                self.by_ino.remove(&ino);
                self.by_id.remove(&id);
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
    fn numbers_live_while_referenced() {
        let root = Ent { id: EntryId::ROOT, owner: NodeId(1) };
        let mut t = Inodes::new(root);
        let e = Ent { id: EntryId { node: 1, epoch: 1, counter: 9 }, owner: NodeId(1) };
        let a = t.remember(e);
        assert_eq!(t.remember(e), a);
        t.forget(a, 1);
        assert_eq!(t.get(a), Some(e));
        t.forget(a, 1);
        assert_eq!(t.get(a), None);
        assert_eq!(t.len(), 1);
        t.forget(ROOT_INO, 10);
        assert_eq!(t.get(ROOT_INO), Some(root));
    }
}
