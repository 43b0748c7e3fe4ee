//! The pure comparison of one walk: what the records say against each other.
//!
//! [`Checker`] keeps, per entry id, a small summary of its inode (and the
//! stripe targets of files), the chunk-file lengths per target, link counts
//! and the name of every directory: memory grows with the number of entries
//! and chunk files, never with page contents. [`Checker::finish`] turns that
//! into [`Problem`]s, each with the [`Fix`] that would repair it.

use hivefs_proto::{FsckDentry, FsckDisposal, FsckFix, FsckInode};
use hivefs_types::attr::FileKind;
use hivefs_types::ids::{BuddyGroupId, EntryId, NodeId, TargetId};
use hivefs_types::pattern::StripeUnit;
use serde::Serialize;
use std::collections::{HashMap, HashSet};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    DanglingDentry,
    OrphanedInode,
    OrphanedChunk,
    WrongNlink,
    WrongParent,
    SizeMismatch,
    /// The two copies of a buddy group differ: a storage group's chunk file
    /// (its length, or one missing), or a metadata group's records.
    BuddyMismatch,
    /// A namespace's quota usage record of a user or group differs from a
    /// count of its inodes.
    WrongUsage,
}

impl Kind {
    /// The name of the kind in reports (as in the JSON report).
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::DanglingDentry => "dangling-dentry",
            Kind::OrphanedInode => "orphaned-inode",
            Kind::OrphanedChunk => "orphaned-chunk",
            Kind::WrongNlink => "wrong-nlink",
            Kind::WrongParent => "wrong-parent",
            Kind::SizeMismatch => "size-mismatch",
            Kind::BuddyMismatch => "buddy-mismatch",
            Kind::WrongUsage => "wrong-usage",
        }
    }
}

/// Where a repair goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fix {
    Meta(NodeId, FsckFix),
    UnlinkChunk(StripeUnit, EntryId),
    /// A full resync of the group: the primary's copy replaces the secondary's.
    ResyncGroup(BuddyGroupId),
    /// Nothing safe to do automatically.
    None,
}

impl Fix {
    /// Repairs run in this order: removals first, names for orphans last (a
    /// new `/lost+found` changes the root's link count).
    pub(crate) fn order(&self) -> u8 {
        match self {
            Fix::Meta(_, FsckFix::RemoveDentry { .. }) => 0,
            Fix::UnlinkChunk(..) => 1,
            Fix::Meta(_, FsckFix::DropUnlinked { .. }) => 2,
            Fix::Meta(_, FsckFix::SetSize { .. } | FsckFix::SetParent { .. }) => 3,
            Fix::Meta(_, FsckFix::SetNlink { .. }) => 4,
            Fix::Meta(_, FsckFix::LostFound { .. }) => 5,
            // After every repair that adds or removes inodes.
            Fix::Meta(_, FsckFix::CountUsage { .. }) => 6,
            Fix::ResyncGroup(_) => 7,
            Fix::None => 8,
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct Problem {
    pub kind: Kind,
    pub entry: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub meta_node: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    pub detail: String,
    #[serde(skip)]
    pub fix: Fix,
    /// Same problem in another walk: kind, entry and place.
    #[serde(skip)]
    pub(crate) key: String,
}

impl Problem {
    /// Namespace `n`'s usage record of `who` (a user or group) is
    /// `recorded`, a count of its inodes gives `counted`.
    pub fn wrong_usage(
        n: NodeId,
        who: hivefs_proto::QuotaId,
        recorded: hivefs_proto::QuotaUse,
        counted: hivefs_proto::QuotaUse,
    ) -> Problem {
        let name = format!("{} {}", who.kind.name(), who.id);
        Problem {
            kind: Kind::WrongUsage,
            entry: name.clone(),
            meta_node: Some(n.0),
            target: None,
            path: None,
            key: format!("{} namespace {n} {name}", Kind::WrongUsage.as_str()),
            detail: format!(
                "quota usage of {name} recorded as {} inodes and {} bytes; the inodes count {} and {}",
                recorded.inodes, recorded.bytes, counted.inodes, counted.bytes
            ),
            fix: Fix::Meta(n, FsckFix::CountUsage { apply: true }),
        }
    }

    fn new(kind: Kind, entry: EntryId, place: String, detail: String, fix: Fix) -> Problem {
        Problem {
            kind,
            entry: entry.to_string(),
            meta_node: None,
            target: None,
            path: None,
            key: format!("{} {entry} {place}", kind.as_str()),
            detail,
            fix,
        }
    }
    fn on_node(mut self, n: NodeId) -> Self {
        self.meta_node = Some(n.0);
        self
    }
    fn on_target(mut self, t: StripeUnit) -> Self {
        self.target = Some(t.raw());
        self
    }
}

struct Ino {
    node: NodeId,
    kind: FileKind,
    nlink: u32,
    size: u64,
    open: bool,
    parent: Option<EntryId>,
    /// Files: stripe targets (or buddy groups).
    targets: Vec<StripeUnit>,
    pattern: Option<hivefs_types::pattern::Pattern>,
}

/// The pure comparison: feed it chunk files, disposal records and inodes of
/// every node, then dentries (which are checked against the inodes), then
/// [`Checker::finish`].
#[derive(Default)]
pub struct Checker {
    inodes: HashMap<EntryId, Ino>,
    chunks: HashMap<EntryId, Vec<(StripeUnit, u64)>>,
    /// Secondaries' copies of mirrored chunk files: group → (secondary, entry → length).
    secondary: HashMap<BuddyGroupId, (TargetId, HashMap<EntryId, u64>)>,
    /// Metadata groups whose copies differ: (group, namespace, secondary, what differs).
    meta_mismatch: Vec<(BuddyGroupId, NodeId, u32, String)>,
    /// Storage buddies' chunk files of equal length whose contents differ:
    /// (group, entry, primary's CRC-32, secondary's).
    content_mismatch: Vec<(BuddyGroupId, EntryId, Option<u32>, Option<u32>)>,
    disposal: HashMap<EntryId, bool>,
    /// Dentries naming each id (only those whose inode exists on their owner).
    links: HashMap<EntryId, u32>,
    /// Subdirectory dentries per directory.
    subdirs: HashMap<EntryId, u32>,
    /// Directories: (holder node, parent, name) of their dentry.
    dir_names: HashMap<EntryId, (NodeId, EntryId, Vec<u8>)>,
    /// Names of other entries whose path a report wants.
    want: HashSet<EntryId>,
    names: HashMap<EntryId, (EntryId, Vec<u8>)>,
    problems: Vec<Problem>,
    /// Dangling dentries: (index in `problems`, directory, name) for their path.
    dangling: Vec<(usize, EntryId, Vec<u8>)>,
    pub scanned: u64,
}

impl Checker {
    /// A checker that also collects the names of the files in `want`, so
    /// that their problems carry a path.
    pub(crate) fn with_wanted(want: HashSet<EntryId>) -> Checker {
        Checker { want, ..Default::default() }
    }

    /// The copies of metadata group `group` (the namespace of node `ns`)
    /// differ, as its primary found.
    pub fn add_meta_mismatch(&mut self, group: BuddyGroupId, ns: NodeId, secondary: u32, detail: String) {
        self.meta_mismatch.push((group, ns, secondary, detail));
    }

    /// The chunk files each storage group holds on both members with the same
    /// length (not empty): the ones whose contents a check compares.
    pub fn same_length_pairs(&self) -> Vec<(BuddyGroupId, TargetId, Vec<EntryId>)> {
        let mut groups: Vec<&BuddyGroupId> = self.secondary.keys().collect();
        groups.sort();
        groups
            .into_iter()
            .map(|g| {
                let (sec, theirs) = &self.secondary[g];
                let unit = StripeUnit::Group(*g);
                let mut ids: Vec<EntryId> = theirs
                    .iter()
                    .filter(|(id, len)| {
                        **len > 0
                            && self.chunks.get(id).is_some_and(|l| l.iter().any(|(u, ours)| *u == unit && ours == *len))
                    })
                    .map(|(id, _)| *id)
                    .collect();
                ids.sort();
                (*g, *sec, ids)
            })
            .collect()
    }

    /// The contents of `id`'s chunk files on `group`'s two members differ
    /// (CRC-32 of each, `None`: gone meanwhile).
    pub fn add_content_mismatch(
        &mut self,
        group: BuddyGroupId,
        id: EntryId,
        primary: Option<u32>,
        secondary: Option<u32>,
    ) {
        self.content_mismatch.push((group, id, primary, secondary));
    }

    /// A mirrored chunk file of `id` on `group`'s secondary `target`.
    pub fn add_secondary_chunk(&mut self, group: BuddyGroupId, target: TargetId, id: EntryId, len: u64) {
        self.scanned += 1;
        self.secondary.entry(group).or_insert_with(|| (target, HashMap::new())).1.insert(id, len);
    }

    /// A chunk file of `id` on a target, or a mirrored one of a buddy group (from its primary).
    pub fn add_chunk(&mut self, target: impl Into<StripeUnit>, id: EntryId, len: u64) {
        self.scanned += 1;
        self.chunks.entry(id).or_default().push((target.into(), len));
    }

    pub fn add_disposal(&mut self, d: &FsckDisposal) {
        self.scanned += 1;
        self.disposal.insert(d.id, d.open_unlinked);
    }

    pub fn add_inode(&mut self, node: NodeId, i: FsckInode) {
        self.scanned += 1;
        let targets =
            i.pattern.as_ref().map(|p| (0..p.stripe_count()).map(|k| p.unit(k)).collect()).unwrap_or_default();
        self.inodes.insert(
            i.id,
            Ino {
                node,
                kind: i.kind,
                nlink: i.nlink,
                size: i.size,
                open: i.open,
                parent: i.parent,
                targets,
                pattern: i.pattern,
            },
        );
    }

    /// `holder`: the node whose store holds the dentry.
    pub fn add_dentry(&mut self, holder: NodeId, d: FsckDentry) {
        self.scanned += 1;
        match self.inodes.get(&d.id) {
            Some(i) if i.node == d.owner => {}
            other => {
                let why = match other {
                    Some(i) => format!("its inode is on metadata node {}, not on owner {}", i.node, d.owner),
                    None => format!("inode {} does not exist on metadata node {}", d.id, d.owner),
                };
                let place = format!("{}/{}", d.parent, String::from_utf8_lossy(&d.name));
                let name = String::from_utf8_lossy(&d.name).into_owned();
                let p = Problem::new(
                    Kind::DanglingDentry,
                    d.id,
                    place,
                    format!("dentry {name:?} in directory {}: {why}", d.parent),
                    Fix::Meta(holder, FsckFix::RemoveDentry { parent: d.parent, name: d.name.clone(), id: d.id }),
                )
                .on_node(holder);
                self.dangling.push((self.problems.len(), d.parent, d.name));
                self.problems.push(p);
                return;
            }
        }
        *self.links.entry(d.id).or_default() += 1;
        if d.kind == FileKind::Dir {
            *self.subdirs.entry(d.parent).or_default() += 1;
            self.dir_names.entry(d.id).or_insert((holder, d.parent, d.name));
        } else if self.want.contains(&d.id) {
            self.names.entry(d.id).or_insert((d.parent, d.name));
        }
    }

    /// The path of directory `dir`, if its chain of names reaches the root.
    fn dir_path(&self, dir: EntryId) -> Option<String> {
        let mut parts = Vec::new();
        let mut cur = dir;
        while !cur.is_root() {
            let (_, parent, name) = self.dir_names.get(&cur)?;
            parts.push(String::from_utf8_lossy(name).into_owned());
            cur = *parent;
            if parts.len() > 4096 {
                return None;
            }
        }
        parts.reverse();
        Some(format!("/{}", parts.join("/")))
    }

    fn path_of(&self, id: EntryId) -> Option<String> {
        if self.dir_names.contains_key(&id) || id.is_root() {
            return self.dir_path(id);
        }
        let (parent, name) = self.names.get(&id)?;
        let dp = self.dir_path(*parent)?;
        Some(format!("{}/{}", dp.trim_end_matches('/'), String::from_utf8_lossy(name)))
    }

    pub fn finish(mut self) -> Vec<Problem> {
        let mut out = std::mem::take(&mut self.problems);
        for (i, parent, name) in std::mem::take(&mut self.dangling) {
            out[i].path = self
                .dir_path(parent)
                .map(|dp| format!("{}/{}", dp.trim_end_matches('/'), String::from_utf8_lossy(&name)));
        }
        let mut ids: Vec<&EntryId> = self.inodes.keys().collect();
        ids.sort();
        for &id in ids {
            let i = &self.inodes[&id];
            let links = self.links.get(&id).copied().unwrap_or(0);
            let n = i.node;
            if i.kind == FileKind::Dir {
                if !id.is_root() && links == 0 {
                    let fix = if i.nlink > 0 { Fix::Meta(n, FsckFix::LostFound { id }) } else { Fix::None };
                    out.push(
                        Problem::new(
                            Kind::OrphanedInode,
                            id,
                            n.to_string(),
                            "directory that no dentry names".into(),
                            fix,
                        )
                        .on_node(n),
                    );
                    continue;
                }
                let want = 2 + self.subdirs.get(&id).copied().unwrap_or(0);
                if i.nlink != want {
                    out.push(
                        Problem::new(
                            Kind::WrongNlink,
                            id,
                            n.to_string(),
                            format!("directory has link count {}, expected {want} (2 + subdirectories)", i.nlink),
                            Fix::Meta(n, FsckFix::SetNlink { id, from: i.nlink, to: want }),
                        )
                        .on_node(n),
                    );
                }
                let holder_parent = if id.is_root() { Some(id) } else { self.dir_names.get(&id).map(|x| x.1) };
                if let Some(hp) = holder_parent {
                    if i.parent != Some(hp) {
                        out.push(
                            Problem::new(
                                Kind::WrongParent,
                                id,
                                n.to_string(),
                                format!(
                                    "directory's parent pointer is {}, but its dentry is in directory {hp}",
                                    i.parent.map_or("none".into(), |p| p.to_string())
                                ),
                                Fix::Meta(n, FsckFix::SetParent { id, from: i.parent, to: hp }),
                            )
                            .on_node(n),
                        );
                    }
                }
                continue;
            }
            if i.nlink == 0 {
                if links == 0 && !self.disposal.get(&id).copied().unwrap_or(false) {
                    out.push(
                        Problem::new(
                            Kind::OrphanedInode,
                            id,
                            n.to_string(),
                            "unlinked inode (link count 0) without an open-unlinked disposal record".into(),
                            if i.open { Fix::None } else { Fix::Meta(n, FsckFix::DropUnlinked { id }) },
                        )
                        .on_node(n),
                    );
                }
                continue;
            }
            if links == 0 {
                out.push(
                    Problem::new(
                        Kind::OrphanedInode,
                        id,
                        n.to_string(),
                        format!("{:?} with link count {} that no dentry names", i.kind, i.nlink).to_lowercase(),
                        Fix::Meta(n, FsckFix::LostFound { id }),
                    )
                    .on_node(n),
                );
                continue;
            }
            if i.nlink != links {
                out.push(
                    Problem::new(
                        Kind::WrongNlink,
                        id,
                        n.to_string(),
                        format!("link count {}, but {links} dentries name it", i.nlink),
                        Fix::Meta(n, FsckFix::SetNlink { id, from: i.nlink, to: links }),
                    )
                    .on_node(n),
                );
            }
            if let (Some(p), false) = (&i.pattern, i.open) {
                let have = self.chunks.get(&id);
                let lens: Vec<u64> = i
                    .targets
                    .iter()
                    .map(|t| have.and_then(|c| c.iter().find(|(ct, _)| ct == t)).map_or(0, |(_, l)| *l))
                    .collect();
                let computed = p.size_from_chunk_lens(&lens);
                if computed != i.size {
                    out.push(
                        Problem::new(
                            Kind::SizeMismatch,
                            id,
                            n.to_string(),
                            format!("cached size {} but the chunk files make it {computed}", i.size),
                            Fix::Meta(n, FsckFix::SetSize { id, from: i.size, to: computed }),
                        )
                        .on_node(n),
                    );
                }
            }
        }
        let mut cids: Vec<&EntryId> = self.chunks.keys().collect();
        cids.sort();
        for &id in cids {
            let pending = self.disposal.contains_key(&id);
            let ino = self.inodes.get(&id);
            for &(t, len) in &self.chunks[&id] {
                let why = match ino {
                    Some(i) if i.targets.contains(&t) => continue,
                    Some(_) => "its file's stripe pattern does not include this target",
                    None if pending => continue,
                    None => "no inode and no pending disposal record",
                };
                out.push(
                    Problem::new(
                        Kind::OrphanedChunk,
                        id,
                        t.to_string(),
                        format!("chunk file of {len} bytes: {why}"),
                        Fix::UnlinkChunk(t, id),
                    )
                    .on_target(t),
                );
            }
        }
        // Each listed secondary against its primary: the same chunk files, the same lengths.
        let mut groups: Vec<&BuddyGroupId> = self.secondary.keys().collect();
        groups.sort();
        for g in groups {
            let (sec, theirs) = &self.secondary[g];
            let unit = StripeUnit::Group(*g);
            let mut ours: HashMap<EntryId, u64> = HashMap::new();
            for (id, list) in &self.chunks {
                if let Some((_, len)) = list.iter().find(|(u, _)| *u == unit) {
                    ours.insert(*id, *len);
                }
            }
            let mut ids: Vec<&EntryId> = ours.keys().chain(theirs.keys()).collect();
            ids.sort();
            ids.dedup();
            for id in ids {
                let (a, b) = (ours.get(id), theirs.get(id));
                if a == b {
                    continue;
                }
                let show = |x: Option<&u64>| x.map_or("no chunk file".to_string(), |l| format!("{l} bytes"));
                out.push(
                    Problem::new(
                        Kind::BuddyMismatch,
                        *id,
                        format!("buddy group {g}"),
                        format!("primary copy: {}, secondary (target {sec}): {}", show(a), show(b)),
                        Fix::ResyncGroup(*g),
                    )
                    .on_target(unit),
                );
            }
        }
        for (g, id, a, b) in &self.content_mismatch {
            let show = |x: &Option<u32>| x.map_or("no chunk file".to_string(), |c| format!("CRC-32 {c:08x}"));
            let sec = self.secondary.get(g).map_or(0, |s| s.0 .0);
            out.push(
                Problem::new(
                    Kind::BuddyMismatch,
                    *id,
                    format!("buddy group {g}"),
                    format!("contents differ: primary copy {}, secondary (target {sec}) {}", show(a), show(b)),
                    Fix::ResyncGroup(*g),
                )
                .on_target(StripeUnit::Group(*g)),
            );
        }
        for (g, ns, sec, detail) in &self.meta_mismatch {
            out.push(Problem {
                kind: Kind::BuddyMismatch,
                entry: "-".into(),
                meta_node: Some(ns.0),
                target: None,
                path: None,
                key: format!("{} namespace {ns} buddy group {g}", Kind::BuddyMismatch.as_str()),
                detail: format!("{detail} (secondary: metadata node {sec})"),
                fix: Fix::ResyncGroup(*g),
            });
        }
        for p in &mut out {
            if p.path.is_none() && p.kind != Kind::DanglingDentry && p.kind != Kind::OrphanedChunk {
                if let Some(id) = EntryId::parse(&p.entry) {
                    p.path = self.path_of(id);
                }
            }
        }
        out.sort_by(|a, b| (a.kind, &a.key).cmp(&(b.kind, &b.key)));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hivefs_types::ids::{BuddyGroupId, TargetId};
    use hivefs_types::pattern::{Pattern, PatternKind};

    const N: NodeId = NodeId(1);

    fn id(c: u64) -> EntryId {
        EntryId { node: 1, epoch: 1, counter: c }
    }

    fn dir(i: EntryId, nlink: u32, parent: EntryId) -> FsckInode {
        FsckInode { id: i, kind: FileKind::Dir, nlink, size: 0, pattern: None, parent: Some(parent), open: false }
    }

    fn file(i: EntryId, nlink: u32, size: u64, targets: &[u32]) -> FsckInode {
        let pattern = Pattern::new(PatternKind::Raid0, 4096, targets.iter().map(|&t| TargetId(t)).collect()).unwrap();
        FsckInode { id: i, kind: FileKind::File, nlink, size, pattern: Some(pattern), parent: None, open: false }
    }

    fn dentry(parent: EntryId, name: &str, i: EntryId, kind: FileKind) -> FsckDentry {
        FsckDentry { parent, name: name.as_bytes().to_vec(), id: i, kind, owner: N }
    }

    /// [`healthy`] with root/m (entry 7) of `size` bytes over buddy groups `groups`.
    fn with_mirrored_file(groups: &[u32], size: u64) -> Checker {
        let mut c = healthy();
        let p = Pattern::new(PatternKind::BuddyMirror, 4096, groups.iter().map(|&g| TargetId(g)).collect()).unwrap();
        let mut f = file(id(7), 1, size, &[1]);
        f.pattern = Some(p);
        c.add_inode(N, f);
        c.add_dentry(N, dentry(EntryId::ROOT, "m", id(7), FileKind::File));
        c
    }

    /// root/{d/, d/f (2 targets, 5000 bytes), g (hard link of d/f)}
    fn healthy() -> Checker {
        let mut c = Checker::default();
        c.add_chunk(TargetId(1), id(3), 4096);
        c.add_chunk(TargetId(2), id(3), 904);
        c.add_inode(N, dir(EntryId::ROOT, 3, EntryId::ROOT));
        c.add_inode(N, dir(id(2), 2, EntryId::ROOT));
        c.add_inode(N, file(id(3), 2, 5000, &[1, 2]));
        c.add_dentry(N, dentry(EntryId::ROOT, "d", id(2), FileKind::Dir));
        c.add_dentry(N, dentry(id(2), "f", id(3), FileKind::File));
        c.add_dentry(N, dentry(EntryId::ROOT, "g", id(3), FileKind::File));
        c
    }

    fn kinds(ps: &[Problem]) -> Vec<(Kind, String)> {
        ps.iter().map(|p| (p.kind, p.entry.clone())).collect()
    }

    #[test]
    fn a_consistent_namespace_is_clean() {
        assert!(healthy().finish().is_empty());
    }

    /// Mirrored files: their chunk files are listed per buddy group (from the
    /// primary), sized from those, and a group's stray chunk is an orphan of
    /// that group, removed through it.
    #[test]
    fn mirrored_files_are_checked_by_their_groups() {
        let g = |n| StripeUnit::Group(BuddyGroupId(n));
        let mut c = with_mirrored_file(&[1, 2], 4097);
        c.add_chunk(g(1), id(7), 4096);
        c.add_chunk(g(2), id(7), 1);
        assert!(c.finish().is_empty(), "group chunk files make the size");

        // Target 1's plain chunk of the same id does not count for a mirrored file.
        let mut c = with_mirrored_file(&[1], 10);
        c.add_chunk(TargetId(1), id(7), 10);
        c.add_chunk(g(3), id(9), 5);
        let ps = c.finish();
        let orphans: Vec<_> = ps.iter().filter(|p| p.kind == Kind::OrphanedChunk).map(|p| p.fix.clone()).collect();
        assert_eq!(orphans, vec![Fix::UnlinkChunk(TargetId(1).into(), id(7)), Fix::UnlinkChunk(g(3), id(9))]);
        assert!(ps.iter().any(|p| p.kind == Kind::SizeMismatch && p.entry == id(7).to_string()), "{ps:?}");

        // The secondary's copy against the primary's: equal is clean; a length or a file off is found.
        let mut c = with_mirrored_file(&[1], 10);
        c.add_chunk(g(1), id(7), 10);
        c.add_secondary_chunk(BuddyGroupId(1), TargetId(4), id(7), 10);
        assert!(c.finish().is_empty());
        let mut c = with_mirrored_file(&[1], 10);
        c.add_chunk(g(1), id(7), 10);
        c.add_secondary_chunk(BuddyGroupId(1), TargetId(4), id(7), 9);
        c.add_secondary_chunk(BuddyGroupId(1), TargetId(4), id(9), 1);
        let ps = c.finish();
        let bm: Vec<_> = ps.iter().filter(|p| p.kind == Kind::BuddyMismatch).collect();
        assert_eq!(bm.len(), 2, "{ps:?}");
        assert!(bm.iter().all(|p| p.fix == Fix::ResyncGroup(BuddyGroupId(1))), "{bm:?}");
        assert!(bm[0].detail.contains("primary copy: 10 bytes, secondary (target 4): 9 bytes"), "{}", bm[0].detail);

        // Same lengths: those pairs' contents are compared; a difference is a mismatch too.
        let mut c = with_mirrored_file(&[1], 10);
        c.add_chunk(g(1), id(7), 10);
        c.add_secondary_chunk(BuddyGroupId(1), TargetId(4), id(7), 10);
        assert_eq!(c.same_length_pairs(), vec![(BuddyGroupId(1), TargetId(4), vec![id(7)])]);
        c.add_content_mismatch(BuddyGroupId(1), id(7), Some(1), Some(2));
        let ps = c.finish();
        assert_eq!(ps.len(), 1, "{ps:?}");
        assert!(ps[0].detail.contains("contents differ"), "{}", ps[0].detail);
        assert_eq!(ps[0].fix, Fix::ResyncGroup(BuddyGroupId(1)));

        // A metadata group's copies that differ: one problem of the namespace, a full resync.
        let mut c = healthy();
        c.add_meta_mismatch(BuddyGroupId(5), NodeId(1), 2, "the copies differ".into());
        let ps = c.finish();
        assert_eq!(ps.len(), 1, "{ps:?}");
        assert_eq!(
            (ps[0].kind, ps[0].meta_node, ps[0].fix.clone()),
            (Kind::BuddyMismatch, Some(1), Fix::ResyncGroup(BuddyGroupId(5)))
        );
        assert!(ps[0].detail.contains("secondary: metadata node 2"), "{}", ps[0].detail);
    }

    #[test]
    fn each_kind_of_damage_is_found_with_its_fix() {
        let mut c = Checker::with_wanted([id(3)].into());
        c.add_chunk(TargetId(1), id(3), 4096); // target 2's chunk file is gone: size 4096
        c.add_chunk(TargetId(4), id(9), 10); // nobody's
        c.add_chunk(TargetId(5), id(3), 10); // not in the pattern
        c.add_chunk(TargetId(6), id(8), 10); // pending disposal: fine
        c.add_disposal(&FsckDisposal { id: id(8), open_unlinked: false, targets: vec![TargetId(6)] });
        c.add_inode(N, dir(EntryId::ROOT, 3, EntryId::ROOT));
        c.add_inode(N, dir(id(2), 3, id(7))); // nlink 3 with no subdir; parent pointer wrong
        c.add_inode(N, file(id(3), 1, 5000, &[1, 2])); // named twice
        c.add_inode(N, file(id(5), 1, 0, &[1])); // no dentry
        c.add_inode(N, file(id(6), 0, 0, &[1])); // unlinked, no record
        c.add_dentry(N, dentry(EntryId::ROOT, "d", id(2), FileKind::Dir));
        c.add_dentry(N, dentry(id(2), "f", id(3), FileKind::File));
        c.add_dentry(N, dentry(EntryId::ROOT, "g", id(3), FileKind::File));
        c.add_dentry(N, dentry(id(2), "gone", id(4), FileKind::File));
        let ps = c.finish();
        assert_eq!(
            kinds(&ps),
            vec![
                (Kind::DanglingDentry, id(4).to_string()),
                (Kind::OrphanedInode, id(5).to_string()),
                (Kind::OrphanedInode, id(6).to_string()),
                (Kind::OrphanedChunk, id(3).to_string()),
                (Kind::OrphanedChunk, id(9).to_string()),
                (Kind::WrongNlink, id(2).to_string()),
                (Kind::WrongNlink, id(3).to_string()),
                (Kind::WrongParent, id(2).to_string()),
                (Kind::SizeMismatch, id(3).to_string()),
            ]
        );
        let fix = |k: Kind, e: EntryId| ps.iter().find(|p| p.kind == k && p.entry == e.to_string()).unwrap();
        assert_eq!(fix(Kind::DanglingDentry, id(4)).path.as_deref(), Some("/d/gone"));
        assert_eq!(fix(Kind::SizeMismatch, id(3)).path.as_deref(), Some("/d/f"));
        assert_eq!(fix(Kind::WrongNlink, id(2)).path.as_deref(), Some("/d"));
        assert_eq!(
            fix(Kind::SizeMismatch, id(3)).fix,
            Fix::Meta(N, FsckFix::SetSize { id: id(3), from: 5000, to: 4096 })
        );
        assert_eq!(fix(Kind::WrongNlink, id(3)).fix, Fix::Meta(N, FsckFix::SetNlink { id: id(3), from: 1, to: 2 }));
        assert_eq!(fix(Kind::WrongNlink, id(2)).fix, Fix::Meta(N, FsckFix::SetNlink { id: id(2), from: 3, to: 2 }));
        assert_eq!(fix(Kind::OrphanedInode, id(5)).fix, Fix::Meta(N, FsckFix::LostFound { id: id(5) }));
        assert_eq!(fix(Kind::OrphanedInode, id(6)).fix, Fix::Meta(N, FsckFix::DropUnlinked { id: id(6) }));
        assert_eq!(fix(Kind::OrphanedChunk, id(9)).fix, Fix::UnlinkChunk(TargetId(4).into(), id(9)));
        assert_eq!(fix(Kind::OrphanedChunk, id(3)).target, Some(5));
    }

    #[test]
    fn open_files_and_open_unlinked_entries_are_not_problems() {
        let mut c = healthy();
        let mut f = file(id(10), 1, 1 << 20, &[1]); // size ahead of its chunks while written
        f.open = true;
        c.add_inode(N, f);
        c.add_dentry(N, dentry(EntryId::ROOT, "w", id(10), FileKind::File));
        c.add_disposal(&FsckDisposal { id: id(11), open_unlinked: true, targets: vec![TargetId(1)] });
        c.add_inode(N, file(id(11), 0, 0, &[1]));
        c.add_chunk(TargetId(1), id(11), 3);
        assert!(c.finish().is_empty());
    }

    #[test]
    fn a_subdirectory_dentry_without_inode_does_not_count_as_a_link() {
        let mut c = Checker::default();
        c.add_inode(N, dir(EntryId::ROOT, 3, EntryId::ROOT));
        c.add_dentry(N, dentry(EntryId::ROOT, "x", id(2), FileKind::Dir));
        let ps = c.finish();
        assert_eq!(kinds(&ps), vec![(Kind::DanglingDentry, id(2).to_string()), (Kind::WrongNlink, "root".into())]);
        assert_eq!(ps[0].path.as_deref(), Some("/x"));
        // Removals run before the link count is set.
        assert!(ps[0].fix.order() < ps[1].fix.order());
    }

    #[test]
    fn a_chunk_file_without_inode_is_an_orphan_unless_its_disposal_is_pending() {
        let mut c = healthy();
        c.add_chunk(TargetId(3), id(20), 77);
        c.add_chunk(TargetId(3), id(21), 5);
        c.add_disposal(&FsckDisposal { id: id(21), open_unlinked: false, targets: vec![TargetId(3)] });
        let ps = c.finish();
        assert_eq!(kinds(&ps), vec![(Kind::OrphanedChunk, id(20).to_string())]);
        assert_eq!(ps[0].target, Some(3));
        assert_eq!(ps[0].meta_node, None);
        assert_eq!(ps[0].fix, Fix::UnlinkChunk(TargetId(3).into(), id(20)));
    }

    #[test]
    fn a_dentry_whose_inode_is_missing_or_on_another_node_is_dangling() {
        let mut c = healthy();
        // The inode of "elsewhere" exists, but on node 2, not on its dentry's owner.
        c.add_inode(NodeId(2), file(id(30), 1, 0, &[1]));
        c.add_dentry(N, dentry(id(2), "elsewhere", id(30), FileKind::File));
        c.add_dentry(N, dentry(EntryId::ROOT, "missing", id(31), FileKind::File));
        let ps = c.finish();
        assert_eq!(
            kinds(&ps),
            vec![
                (Kind::DanglingDentry, id(30).to_string()),
                (Kind::DanglingDentry, id(31).to_string()),
                // The dangling dentry is no link: node 2's inode is an orphan.
                (Kind::OrphanedInode, id(30).to_string()),
            ]
        );
        assert_eq!(ps[0].path.as_deref(), Some("/d/elsewhere"));
        assert_eq!(ps[1].path.as_deref(), Some("/missing"));
        assert_eq!(
            ps[0].fix,
            Fix::Meta(N, FsckFix::RemoveDentry { parent: id(2), name: b"elsewhere".to_vec(), id: id(30) })
        );
        assert_eq!(ps[2].fix, Fix::Meta(NodeId(2), FsckFix::LostFound { id: id(30) }));
    }

    #[test]
    fn a_link_count_that_differs_from_the_dentries_is_reported() {
        let mut c = healthy();
        c.add_dentry(N, dentry(EntryId::ROOT, "third", id(3), FileKind::File));
        let ps = c.finish();
        assert_eq!(kinds(&ps), vec![(Kind::WrongNlink, id(3).to_string())]);
        assert_eq!(ps[0].fix, Fix::Meta(N, FsckFix::SetNlink { id: id(3), from: 2, to: 3 }));

        // A directory counts its subdirectories, not its files.
        let mut c = healthy();
        c.add_inode(N, dir(id(4), 2, id(2)));
        c.add_dentry(N, dentry(id(2), "sub", id(4), FileKind::Dir));
        let ps = c.finish();
        assert_eq!(kinds(&ps), vec![(Kind::WrongNlink, id(2).to_string())]);
        assert_eq!(ps[0].fix, Fix::Meta(N, FsckFix::SetNlink { id: id(2), from: 2, to: 3 }));
        assert_eq!(ps[0].path.as_deref(), Some("/d"));
    }
}
