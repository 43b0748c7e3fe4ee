//! A listing of a tree that says everything a copy must keep (type, mode,
//! owner, size, times, device numbers, symlink targets, contents, which
//! names are links of one inode), to compare a copy with its source: what
//! the tests of this crate and of `hivefs cp` check copies with.

use crate::attrs::{self, Kind, Meta};
use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// One entry of a tree.
#[derive(Clone, Debug)]
pub struct Item {
    pub meta: Meta,
    pub target: Option<PathBuf>,
    /// FNV-1a of a regular file's contents.
    pub digest: u64,
    /// The first name (sorted) of the inode's names in the tree, when it has several.
    pub link_group: Option<PathBuf>,
}

/// Every entry under `root` by its path relative to `root` ("" is `root`),
/// symlinks not followed; files are read without moving access times where
/// the kernel lets us.
pub fn snapshot(root: &Path) -> std::io::Result<BTreeMap<PathBuf, Item>> {
    let mut items = BTreeMap::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let p = root.join(&rel);
        let meta = Meta::lstat(&p)?;
        let (mut target, mut digest) = (None, 0);
        match meta.kind {
            Kind::Dir => attrs::list_dir(&p, |name, _| stack.push(rel.join(name)))?,
            Kind::Symlink => target = Some(std::fs::read_link(&p)?),
            Kind::File => digest = digest_of(&p)?,
            _ => {}
        }
        items.insert(rel, Item { meta, target, digest, link_group: None });
    }
    let mut names: HashMap<(u64, u64), Vec<PathBuf>> = HashMap::new();
    for (rel, it) in &items {
        if it.meta.kind != Kind::Dir && it.meta.nlink > 1 {
            names.entry((it.meta.dev, it.meta.ino)).or_default().push(rel.clone());
        }
    }
    for group in names.into_values().filter(|g| g.len() > 1) {
        // BTreeMap order: the first is the smallest.
        for rel in &group {
            items.get_mut(rel).expect("listed").link_group = Some(group[0].clone());
        }
    }
    Ok(items)
}

fn digest_of(p: &Path) -> std::io::Result<u64> {
    let noatime = rustix::fs::OFlags::NOATIME.bits() as i32;
    let mut f =
        std::fs::OpenOptions::new().read(true).custom_flags(noatime).open(p).or_else(|_| std::fs::File::open(p))?;
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            return Ok(h);
        }
        for &b in &buf[..n] {
            h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
}

/// What [`differences`] compares besides type, contents, size, mode, owner,
/// modification time, device number, symlink target and link grouping.
#[derive(Clone, Copy, Debug, Default)]
pub struct Compare {
    /// Access times too, of files and directories (snapshots read them
    /// without moving them; reading a symlink moves its access time).
    pub atime: bool,
    /// Owners (a copy by a user other than root cannot keep them).
    pub skip_owner: bool,
}

/// Every difference between two snapshots, one line each ("" when none).
pub fn differences(a: &BTreeMap<PathBuf, Item>, b: &BTreeMap<PathBuf, Item>, c: Compare) -> Vec<String> {
    let mut out = Vec::new();
    for (rel, x) in a {
        let Some(y) = b.get(rel) else {
            out.push(format!("{}: missing from the copy", rel.display()));
            continue;
        };
        let (m, n) = (&x.meta, &y.meta);
        let mut diff = |what: &str, l: String, r: String| {
            if l != r {
                out.push(format!("{}: {what} {l} != {r}", rel.display()));
            }
        };
        diff("type", format!("{:?}", m.kind), format!("{:?}", n.kind));
        if m.kind != Kind::Symlink {
            diff("mode", format!("{:o}", m.perm), format!("{:o}", n.perm));
        }
        if !c.skip_owner {
            diff("owner", format!("{}:{}", m.uid, m.gid), format!("{}:{}", n.uid, n.gid));
        }
        diff("mtime", format!("{:?}", m.mtime), format!("{:?}", n.mtime));
        if c.atime && m.kind != Kind::Symlink {
            diff("atime", format!("{:?}", m.atime), format!("{:?}", n.atime));
        }
        if m.kind != Kind::Dir {
            diff("size", m.size.to_string(), n.size.to_string());
        }
        diff("contents", format!("{:x}", x.digest), format!("{:x}", y.digest));
        diff("target", format!("{:?}", x.target), format!("{:?}", y.target));
        diff("rdev", m.rdev.to_string(), n.rdev.to_string());
        diff("hard links", format!("{:?}", x.link_group), format!("{:?}", y.link_group));
    }
    for rel in b.keys().filter(|r| !a.contains_key(*r)) {
        out.push(format!("{}: in the copy only", rel.display()));
    }
    out
}
