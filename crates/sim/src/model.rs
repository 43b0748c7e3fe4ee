//! A client's expected tree: the exact outcome of every operation in the
//! client's own subtree, which no one else touches, so that a sequential
//! client can predict each answer (`Ok` or the POSIX error) and the tree
//! the nodes must hold at the end.
//!
//! Entries are kept in an arena: a directory knows its parent, children
//! and the id and owner the nodes gave it; a file its id and link count
//! (hard links share one entry). Where several errors apply at once the
//! model allows each of them (the order of checks is the node's business,
//! not the protocol's).

use hivefs_proto::Reply;
use hivefs_types::error::ErrorCode;
use hivefs_types::ids::{EntryId, NodeId};
use std::collections::BTreeMap;
use std::fmt;

pub type Mid = usize;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Dir,
    File,
}

#[derive(Clone, Debug)]
pub struct Entry {
    pub kind: Kind,
    /// Directories: name → entry.
    pub children: BTreeMap<Vec<u8>, Mid>,
    /// Directories: the directory holding it (the subtree root: itself).
    pub parent: Mid,
    /// Files: names that name it.
    pub links: u32,
    pub id: EntryId,
    /// Directories: the metadata node that owns it (never changes).
    pub owner: NodeId,
}

/// One operation of a client, on entries of its model.
#[derive(Clone, Debug)]
pub enum Op {
    Mkdir { dir: Mid, name: Vec<u8> },
    Create { dir: Mid, name: Vec<u8> },
    Unlink { dir: Mid, name: Vec<u8> },
    Rmdir { dir: Mid, name: Vec<u8> },
    Rename { dir: Mid, name: Vec<u8>, to: Mid, to_name: Vec<u8>, noreplace: bool },
    Exchange { dir: Mid, name: Vec<u8>, to: Mid, to_name: Vec<u8> },
    Link { dir: Mid, name: Vec<u8>, to: Mid, to_name: Vec<u8> },
    Lookup { dir: Mid, name: Vec<u8> },
}

/// What the model accepts as the answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Expect {
    Ok,
    /// Any of these codes (several checks fail at once).
    Err(Vec<ErrorCode>),
}

impl fmt::Display for Expect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Expect::Ok => write!(f, "ok"),
            Expect::Err(codes) => {
                let names: Vec<String> = codes.iter().map(|c| format!("{c:?}")).collect();
                write!(f, "{}", names.join("|"))
            }
        }
    }
}

pub struct Model {
    pub nodes: Vec<Entry>,
    pub root: Mid,
    /// Name of the subtree root (`c0`, …), for paths in traces.
    label: String,
}

fn err(codes: Vec<ErrorCode>) -> Expect {
    if codes.is_empty() {
        Expect::Ok
    } else {
        Expect::Err(codes)
    }
}

impl Model {
    /// A model whose subtree root is directory `id` on `owner`, empty.
    pub fn new(label: String, id: EntryId, owner: NodeId) -> Model {
        let root = Entry { kind: Kind::Dir, children: BTreeMap::new(), parent: 0, links: 1, id, owner };
        Model { nodes: vec![root], root: 0, label }
    }

    pub fn child(&self, dir: Mid, name: &[u8]) -> Option<Mid> {
        self.nodes[dir].children.get(name).copied()
    }

    /// Directories of the subtree, the root first, in a stable order.
    pub fn dirs(&self) -> Vec<Mid> {
        let mut out = vec![self.root];
        let mut i = 0;
        while i < out.len() {
            let d = out[i];
            out.extend(self.nodes[d].children.values().copied().filter(|&c| self.nodes[c].kind == Kind::Dir));
            i += 1;
        }
        out
    }

    /// True if `a` is directory `d` or one of its ancestors.
    fn encloses(&self, a: Mid, mut d: Mid) -> bool {
        loop {
            if d == a {
                return true;
            }
            if d == self.root {
                return false;
            }
            d = self.nodes[d].parent;
        }
    }

    pub fn path(&self, mid: Mid) -> String {
        let mut parts = Vec::new();
        let mut d = mid;
        while d != self.root {
            let p = self.nodes[d].parent;
            let name = self.nodes[p].children.iter().find(|(_, &c)| c == d).map(|(n, _)| n.clone());
            parts.push(String::from_utf8_lossy(&name.unwrap_or_default()).into_owned());
            d = p;
        }
        parts.push(self.label.clone());
        parts.reverse();
        parts.join("/")
    }

    fn at(&self, dir: Mid, name: &[u8]) -> String {
        format!("{}/{}", self.path(dir), String::from_utf8_lossy(name))
    }

    pub fn describe(&self, op: &Op) -> String {
        match op {
            Op::Mkdir { dir, name } => format!("mkdir {}", self.at(*dir, name)),
            Op::Create { dir, name } => format!("create {}", self.at(*dir, name)),
            Op::Unlink { dir, name } => format!("unlink {}", self.at(*dir, name)),
            Op::Rmdir { dir, name } => format!("rmdir {}", self.at(*dir, name)),
            Op::Rename { dir, name, to, to_name, noreplace } => format!(
                "rename{} {} {}",
                if *noreplace { "(noreplace)" } else { "" },
                self.at(*dir, name),
                self.at(*to, to_name)
            ),
            Op::Exchange { dir, name, to, to_name } => {
                format!("exchange {} {}", self.at(*dir, name), self.at(*to, to_name))
            }
            Op::Link { dir, name, to, to_name } => format!("link {} {}", self.at(*dir, name), self.at(*to, to_name)),
            Op::Lookup { dir, name } => format!("lookup {}", self.at(*dir, name)),
        }
    }

    fn is_empty_dir(&self, m: Mid) -> bool {
        self.nodes[m].children.is_empty()
    }

    /// The answer `op` must get in the current state.
    pub fn expect(&self, op: &Op) -> Expect {
        use ErrorCode::*;
        match op {
            Op::Mkdir { dir, name } | Op::Create { dir, name } => {
                err(if self.child(*dir, name).is_some() { vec![Exists] } else { vec![] })
            }
            Op::Lookup { dir, name } => err(if self.child(*dir, name).is_none() { vec![NotFound] } else { vec![] }),
            Op::Unlink { dir, name } => match self.child(*dir, name) {
                None => err(vec![NotFound]),
                Some(m) if self.nodes[m].kind == Kind::Dir => err(vec![IsDir]),
                Some(_) => Expect::Ok,
            },
            Op::Rmdir { dir, name } => match self.child(*dir, name) {
                None => err(vec![NotFound]),
                Some(m) if self.nodes[m].kind != Kind::Dir => err(vec![NotDir]),
                Some(m) if !self.is_empty_dir(m) => err(vec![NotEmpty]),
                Some(_) => Expect::Ok,
            },
            Op::Rename { dir, name, to, to_name, noreplace } => {
                let Some(src) = self.child(*dir, name) else { return err(vec![NotFound]) };
                let dst = self.child(*to, to_name);
                if dst == Some(src) {
                    return Expect::Ok;
                }
                let mut codes = Vec::new();
                let src_dir = self.nodes[src].kind == Kind::Dir;
                if src_dir && self.encloses(src, *to) {
                    codes.push(Invalid);
                }
                if let Some(d) = dst {
                    if *noreplace {
                        codes.push(Exists);
                    }
                    match (src_dir, self.nodes[d].kind == Kind::Dir) {
                        (true, false) => codes.push(NotDir),
                        (false, true) => codes.push(IsDir),
                        (true, true) if !self.is_empty_dir(d) => codes.push(NotEmpty),
                        _ => {}
                    }
                }
                err(codes)
            }
            Op::Exchange { dir, name, to, to_name } => {
                let (Some(a), Some(b)) = (self.child(*dir, name), self.child(*to, to_name)) else {
                    return err(vec![NotFound]);
                };
                if a == b {
                    return Expect::Ok;
                }
                let mut codes = Vec::new();
                if dir != to {
                    let into = |m: Mid, d: Mid| self.nodes[m].kind == Kind::Dir && self.encloses(m, d);
                    if into(a, *to) || into(b, *dir) {
                        codes.push(Invalid);
                    }
                }
                err(codes)
            }
            Op::Link { dir, name, to, to_name } => {
                let Some(src) = self.child(*dir, name) else { return err(vec![NotFound]) };
                let mut codes = Vec::new();
                if self.nodes[src].kind == Kind::Dir {
                    codes.push(NotPermitted);
                }
                if self.child(*to, to_name).is_some() {
                    codes.push(Exists);
                }
                err(codes)
            }
        }
    }

    fn add(&mut self, e: Entry) -> Mid {
        self.nodes.push(e);
        self.nodes.len() - 1
    }

    /// Drops one name of `m` (its last: the entry is gone).
    fn unname(&mut self, m: Mid) {
        if self.nodes[m].kind == Kind::File {
            self.nodes[m].links -= 1;
        }
    }

    /// Applies `op`, answered `Ok` with `reply` (the new entry of a
    /// mkdir or create).
    pub fn apply(&mut self, op: &Op, reply: &Reply) {
        let new_entry = |kind| match reply {
            Reply::Entry(a) => (a.id, a.owner, kind),
            r => panic!("model: {kind:?} answered {r:?}"),
        };
        match op {
            Op::Lookup { .. } => {}
            Op::Mkdir { dir, name } => {
                let (id, owner, _) = new_entry(Kind::Dir);
                let m =
                    self.add(Entry { kind: Kind::Dir, children: BTreeMap::new(), parent: *dir, links: 1, id, owner });
                self.nodes[*dir].children.insert(name.clone(), m);
            }
            Op::Create { dir, name } => {
                let (id, owner, _) = new_entry(Kind::File);
                let m =
                    self.add(Entry { kind: Kind::File, children: BTreeMap::new(), parent: *dir, links: 1, id, owner });
                self.nodes[*dir].children.insert(name.clone(), m);
            }
            Op::Unlink { dir, name } | Op::Rmdir { dir, name } => {
                if let Some(m) = self.nodes[*dir].children.remove(name) {
                    self.unname(m);
                }
            }
            Op::Rename { dir, name, to, to_name, .. } => {
                let src = self.nodes[*dir].children[name];
                if self.child(*to, to_name) == Some(src) {
                    return;
                }
                self.nodes[*dir].children.remove(name);
                if let Some(old) = self.nodes[*to].children.insert(to_name.clone(), src) {
                    self.unname(old);
                }
                if self.nodes[src].kind == Kind::Dir {
                    self.nodes[src].parent = *to;
                }
            }
            Op::Exchange { dir, name, to, to_name } => {
                let a = self.nodes[*dir].children[name];
                let b = self.nodes[*to].children[to_name];
                self.nodes[*dir].children.insert(name.clone(), b);
                self.nodes[*to].children.insert(to_name.clone(), a);
                if self.nodes[a].kind == Kind::Dir {
                    self.nodes[a].parent = *to;
                }
                if self.nodes[b].kind == Kind::Dir {
                    self.nodes[b].parent = *dir;
                }
            }
            Op::Link { dir, name, to, to_name } => {
                let src = self.nodes[*dir].children[name];
                self.nodes[src].links += 1;
                self.nodes[*to].children.insert(to_name.clone(), src);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hivefs_types::attr::{EntryAttr, FileKind};

    fn entry(counter: u64) -> Reply {
        let t = Default::default();
        Reply::Entry(EntryAttr {
            id: EntryId { node: 1, epoch: 1, counter },
            kind: FileKind::Dir,
            mode: 0o755,
            uid: 0,
            gid: 0,
            size: 0,
            nlink: 2,
            atime: t,
            mtime: t,
            ctime: t,
            rdev: 0,
            owner: NodeId(1),
            pattern: None,
            dir_pattern: None,
        })
    }

    fn n(s: &str) -> Vec<u8> {
        s.as_bytes().to_vec()
    }

    #[test]
    fn predicts_posix_answers() {
        use ErrorCode::*;
        let mut m = Model::new("c0".into(), EntryId::ROOT, NodeId(1));
        let r = m.root;
        let mkdir = |d, s: &str| Op::Mkdir { dir: d, name: n(s) };
        assert_eq!(m.expect(&mkdir(r, "a")), Expect::Ok);
        m.apply(&mkdir(r, "a"), &entry(2));
        assert_eq!(m.expect(&mkdir(r, "a")), Expect::Err(vec![Exists]));
        let a = m.child(r, b"a").unwrap();
        m.apply(&mkdir(a, "b"), &entry(3));
        let b = m.child(a, b"b").unwrap();
        assert_eq!(m.path(b), "c0/a/b");
        // A directory into its own subtree; a non-empty one replaced.
        let into = Op::Rename { dir: r, name: n("a"), to: b, to_name: n("x"), noreplace: false };
        assert_eq!(m.expect(&into), Expect::Err(vec![Invalid]));
        m.apply(&Op::Create { dir: r, name: n("f") }, &entry(4));
        let over = Op::Rename { dir: r, name: n("f"), to: r, to_name: n("a"), noreplace: false };
        assert_eq!(m.expect(&over), Expect::Err(vec![IsDir]));
        assert_eq!(m.expect(&Op::Rmdir { dir: r, name: n("a") }), Expect::Err(vec![NotEmpty]));
        // A hard link renamed onto its other name: nothing happens.
        let link = Op::Link { dir: r, name: n("f"), to: a, to_name: n("g") };
        m.apply(&link, &entry(4));
        let f = m.child(r, b"f").unwrap();
        assert_eq!(m.nodes[f].links, 2);
        let same = Op::Rename { dir: r, name: n("f"), to: a, to_name: n("g"), noreplace: false };
        assert_eq!(m.expect(&same), Expect::Ok);
        m.apply(&same, &Reply::Ok);
        assert_eq!((m.child(r, b"f"), m.child(a, b"g")), (Some(f), Some(f)));
        // Exchange of a directory with a file inside it.
        let x = Op::Exchange { dir: r, name: n("a"), to: a, to_name: n("g") };
        assert_eq!(m.expect(&x), Expect::Err(vec![Invalid]));
        m.apply(&Op::Unlink { dir: a, name: n("g") }, &Reply::Ok);
        assert_eq!(m.nodes[f].links, 1);
        assert_eq!(m.dirs(), vec![r, a, b]);
    }
}
