//! The metadata node's side of `hivefs fsck`: paged read-only scans of its
//! tables and the repairs the checker asks for.
//!
//! Scans run in their own read transactions, one per page, so a walk over a
//! large store never holds a transaction (or much memory) for long; records
//! changing between pages may look inconsistent, which is why the checker
//! re-checks every candidate before reporting it. Repairs are writer
//! mutations ([`Mutation::Fsck`]): each re-reads the records it changes inside
//! the write transaction and is refused with `Busy` if they no longer are what
//! the checker saw, so a repair never undoes a concurrent change.
//!
//! [`offline`] edits a stopped node's store directly: the tool for tests
//! that damage a file system on purpose.

use crate::ops::{load_dentry, load_inode, Ctx};
use crate::store::{child_key, decode, encode, get_record, id_key, Dentry, Disposal, DisposalState, Inode};
use crate::store::{q, Kv, OpError, OpResult, ReadTables, Tables};
use hivefs_proto::{FsckDentry, FsckDisposal, FsckFix, FsckInode, Reply};
use hivefs_types::attr::FileKind;
use hivefs_types::fs_err;
use hivefs_types::ids::EntryId;
use hivefs_types::pattern::DirPattern;
use std::ops::Bound;

/// Largest page of a scan, whatever the checker asks for.
pub const SCAN_MAX: u32 = 4096;
/// Name of the directory below the root that takes orphaned inodes.
pub const LOST_FOUND: &[u8] = b"lost+found";

fn page_len(max: u32) -> usize {
    max.clamp(1, SCAN_MAX) as usize
}

fn bounds(start: &Option<Vec<u8>>) -> (Bound<&[u8]>, Bound<&[u8]>) {
    match start {
        Some(k) => (Bound::Excluded(k.as_slice()), Bound::Unbounded),
        None => (Bound::Unbounded, Bound::Unbounded),
    }
}

/// Dentries in key order strictly after `after`; `more` when the page is full
/// and further ones exist.
pub fn scan_dentries(t: &ReadTables, after: Option<(EntryId, Vec<u8>)>, max: u32) -> OpResult<(Vec<FsckDentry>, bool)> {
    let max = page_len(max);
    let start = after.map(|(p, n)| child_key(p, &n));
    let mut out = Vec::new();
    for r in t.dentries.range_from(bounds(&start).0)? {
        let (k, v) = r?;
        if out.len() == max {
            return Ok((out, true));
        }
        let k = k.as_slice();
        let parent = EntryId::from_bytes(&k[..EntryId::LEN.min(k.len())])
            .ok_or_else(|| OpError::Fatal(format!("dentry key of {} bytes", k.len())))?;
        let name = k[EntryId::LEN..].to_vec();
        let d: Dentry =
            decode("dentry", format_args!("{parent}/{}", q(&name)), v.as_slice()).map_err(OpError::Fatal)?;
        out.push(FsckDentry { parent, name, id: d.id, kind: d.kind, owner: d.owner });
    }
    Ok((out, false))
}

/// Inodes in id order strictly after `after`; `is_open` tells whether a client holds one open.
pub fn scan_inodes(
    t: &ReadTables,
    after: Option<EntryId>,
    max: u32,
    is_open: impl Fn(EntryId) -> bool,
) -> OpResult<(Vec<FsckInode>, bool)> {
    let max = page_len(max);
    let start = after.map(|a| a.to_bytes().to_vec());
    let mut out = Vec::new();
    for r in t.inodes.range_from(bounds(&start).0)? {
        let (k, v) = r?;
        if out.len() == max {
            return Ok((out, true));
        }
        let id = EntryId::from_bytes(k.as_slice())
            .ok_or_else(|| OpError::Fatal(format!("inode key of {} bytes", k.as_slice().len())))?;
        let i: Inode = decode("inode", id, v.as_slice()).map_err(OpError::Fatal)?;
        out.push(FsckInode {
            id,
            kind: i.kind,
            nlink: i.nlink,
            size: i.size,
            pattern: i.pattern,
            parent: i.parent,
            open: is_open(id),
        });
    }
    Ok((out, false))
}

/// Disposal records in id order strictly after `after`.
pub fn scan_disposals(t: &ReadTables, after: Option<EntryId>, max: u32) -> OpResult<(Vec<FsckDisposal>, bool)> {
    let max = page_len(max);
    // One more than a page tells whether more follow.
    let mut recs = t.disposal_scan(after, max + 1)?;
    let more = recs.len() > max;
    recs.truncate(max);
    let records = recs
        .into_iter()
        .map(|(id, d)| FsckDisposal { id, open_unlinked: d.state == DisposalState::OpenUnlinked, targets: d.targets })
        .collect();
    Ok((records, more))
}

fn changed(what: String) -> OpError {
    OpError::Fs(fs_err!(Busy, "{what} changed since it was checked; run fsck again"))
}

fn put_inode(t: &mut Tables<'_>, id: EntryId, i: &Inode) -> OpResult<()> {
    t.put_inode(id, i)
}

fn must_inode(t: &Tables<'_>, id: EntryId) -> OpResult<Inode> {
    load_inode(&t.inodes, id)?.ok_or_else(|| changed(format!("entry {id} (now gone)")))
}

/// Applies one repair inside the writer's transaction. Like every mutation,
/// it checks before its first write.
pub fn apply_fix(t: &mut Tables<'_>, ctx: &mut Ctx<'_>, fix: FsckFix) -> OpResult<Reply> {
    match fix {
        FsckFix::RemoveDentry { parent, name, id } => {
            match load_dentry(&t.dentries, parent, &name)? {
                Some(d) if d.id == id => {}
                _ => return Err(changed(format!("dentry {parent}/{}", q(&name)))),
            }
            if load_inode(&t.inodes, id)?.is_some() {
                return Err(changed(format!("inode {id} of dentry {parent}/{}", q(&name))));
            }
            t.remove_dentry(parent, &name)?;
            Ok(Reply::FsckFixed(format!("removed dentry {parent}/{} naming missing inode {id}", q(&name))))
        }
        FsckFix::SetNlink { id, from, to } => {
            let mut i = must_inode(t, id)?;
            if i.nlink != from {
                return Err(changed(format!("link count of {id} ({from}, now {})", i.nlink)));
            }
            i.nlink = to;
            i.ctime = ctx.now;
            put_inode(t, id, &i)?;
            Ok(Reply::FsckFixed(format!("set link count of {id} from {from} to {to}")))
        }
        FsckFix::SetSize { id, from, to } => {
            let mut i = must_inode(t, id)?;
            if i.kind != FileKind::File || i.size != from || ctx.handles.is_open(id) {
                return Err(changed(format!("size of {id}")));
            }
            i.size = to;
            put_inode(t, id, &i)?;
            Ok(Reply::FsckFixed(format!("set size of {id} from {from} to {to}")))
        }
        FsckFix::SetParent { id, from, to } => {
            let mut i = must_inode(t, id)?;
            if i.kind != FileKind::Dir || i.parent != from {
                return Err(changed(format!("parent pointer of {id}")));
            }
            i.parent = Some(to);
            put_inode(t, id, &i)?;
            Ok(Reply::FsckFixed(format!("set parent of directory {id} to {to}")))
        }
        FsckFix::DropUnlinked { id } => {
            let i = must_inode(t, id)?;
            let rec: Option<Disposal> = get_record(&t.disposal, "disposal", id)?;
            if i.nlink != 0 || i.kind == FileKind::Dir || ctx.handles.is_open(id) {
                return Err(changed(format!("entry {id}")));
            }
            if rec.is_some_and(|d| d.state == DisposalState::OpenUnlinked) {
                return Err(changed(format!("disposal record of {id}")));
            }
            t.remove_inode(id)?;
            let targets = i.pattern.map(|p| p.into_targets()).unwrap_or_default();
            let n = targets.len();
            if !targets.is_empty() {
                let d = Disposal { state: DisposalState::DeleteChunks, targets, mirrored: false };
                t.disposal.insert(id_key(id).as_slice(), encode(&d).as_slice())?;
                ctx.disposal_queued = true;
            }
            Ok(Reply::FsckFixed(format!(
                "removed unlinked inode {id}; its chunk files on {n} targets are queued for deletion"
            )))
        }
        FsckFix::LostFound { id } => lost_found(t, ctx, id),
        FsckFix::CountUsage { apply: false } => Ok(Reply::UsageDiff(crate::store::usage::recount(t, false)?)),
        FsckFix::CountUsage { apply: true } => {
            let n = crate::store::usage::recount(t, true)?.len();
            Ok(Reply::FsckFixed(format!("replaced the quota usage of {n} users and groups with a count of the inodes")))
        }
    }
}

/// Names the orphaned inode `id` `/lost+found/<id>`.
fn lost_found(t: &mut Tables<'_>, ctx: &mut Ctx<'_>, id: EntryId) -> OpResult<Reply> {
    let mut i = must_inode(t, id)?;
    if i.nlink == 0 || id.is_root() {
        return Err(changed(format!("entry {id}")));
    }
    let mut root = load_inode(&t.inodes, EntryId::ROOT)?.ok_or_else(|| {
        OpError::Fs(fs_err!(
            NotSupported,
            "the root directory is not on this metadata node {}: orphan {id} cannot go to /lost+found here",
            ctx.node
        ))
    })?;
    let name = id.to_string().into_bytes();
    let lf = match load_dentry(&t.dentries, EntryId::ROOT, LOST_FOUND)? {
        Some(d) if d.kind == FileKind::Dir && d.owner == ctx.node => Some((d.id, must_inode(t, d.id)?)),
        Some(_) => {
            return Err(OpError::Fs(fs_err!(
                Exists,
                "/lost+found exists but is not a directory on this metadata node {}",
                ctx.node
            )))
        }
        None => None,
    };
    if let Some((lid, _)) = &lf {
        if load_dentry(&t.dentries, *lid, &name)?.is_some() {
            return Err(OpError::Fs(fs_err!(Exists, "/lost+found/{id} already exists")));
        }
    }
    // ---- writes only below this line
    let (lid, mut lfi) = match lf {
        Some(x) => x,
        None => {
            let lid = ctx.mint()?;
            let lfi = Inode {
                kind: FileKind::Dir,
                mode: 0o700,
                uid: 0,
                gid: 0,
                size: 0,
                nlink: 2,
                atime: ctx.now,
                mtime: ctx.now,
                ctime: ctx.now,
                rdev: 0,
                pattern: None,
                dir_pattern: Some(root.dir_pattern.clone().unwrap_or_else(DirPattern::default)),
                symlink: None,
                parent: Some(EntryId::ROOT),
            };
            let d = Dentry { id: lid, kind: FileKind::Dir, owner: ctx.node };
            t.put_dentry(EntryId::ROOT, LOST_FOUND, &d)?;
            root.nlink += 1;
            root.mtime = ctx.now;
            root.ctime = ctx.now;
            put_inode(t, EntryId::ROOT, &root)?;
            ctx.dirs_delta += 1;
            (lid, lfi)
        }
    };
    let d = Dentry { id, kind: i.kind, owner: ctx.node };
    t.put_dentry(lid, &name, &d)?;
    if i.kind == FileKind::Dir {
        i.parent = Some(lid);
        lfi.nlink += 1;
    } else {
        i.nlink = 1;
    }
    i.ctime = ctx.now;
    put_inode(t, id, &i)?;
    lfi.mtime = ctx.now;
    lfi.ctime = ctx.now;
    put_inode(t, lid, &lfi)?;
    Ok(Reply::FsckFixed(format!("moved orphaned {:?} {id} to /lost+found/{id}", i.kind).to_lowercase()))
}

/// Direct edits of a stopped metadata node's store (its service must not
/// run: the store is locked while it does). They bypass every rule on
/// purpose: tests use them to damage a file system the way a bug or a lost
/// write would, so that `hivefs fsck` has something to find.
pub mod offline {
    use super::*;
    use crate::store::Store;
    use std::path::Path;

    fn edit(dir: &Path, f: impl FnOnce(&mut Tables<'_>) -> OpResult<()>) -> Result<(), String> {
        let path = dir.join(crate::DB_FILE);
        let mut store = Store::open(&path, true).map_err(|e| e.to_string())?;
        store.edit(f)
    }

    /// Removes the dentry `parent/name` (its inode stays: an orphan).
    pub fn remove_dentry(dir: &Path, parent: EntryId, name: &[u8]) -> Result<(), String> {
        edit(dir, |t| {
            t.dentries.remove(child_key(parent, name).as_slice())?;
            Ok(())
        })
    }

    /// Records `u` as the quota usage of `who` (whatever the inodes hold).
    pub fn set_usage(dir: &Path, who: hivefs_proto::QuotaId, u: hivefs_proto::QuotaUse) -> Result<(), String> {
        edit(dir, |t| crate::store::usage::put(&mut t.usage, who, u))
    }

    /// Removes the inode `id` (its dentries stay: dangling).
    pub fn remove_inode(dir: &Path, id: EntryId) -> Result<(), String> {
        edit(dir, |t| {
            t.inodes.remove(id_key(id).as_slice())?;
            Ok(())
        })
    }

    /// Sets the link count of `id`.
    pub fn set_nlink(dir: &Path, id: EntryId, nlink: u32) -> Result<(), String> {
        edit(dir, |t| {
            let mut i = load_inode(&t.inodes, id)?.ok_or_else(|| OpError::Fatal(format!("no inode {id}")))?;
            i.nlink = nlink;
            put_inode(t, id, &i)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::namespace::{Namespace, NamespaceOptions};
    use crate::targets::{BoxFut, DataTargets};
    use hivefs_proto::{Caller, Request};
    use hivefs_types::error::{ErrorCode, FsResult};
    use hivefs_types::ids::{NodeId, PoolId, TargetId};
    use std::sync::Arc;

    /// One online target; chunk operations succeed.
    struct OneTarget;

    impl DataTargets for OneTarget {
        fn candidates(&self, _pool: PoolId) -> Vec<(TargetId, NodeId, u64)> {
            vec![(TargetId(1), NodeId(1), 1 << 30)]
        }
        fn truncate_chunk(
            &self,
            _t: hivefs_types::pattern::StripeUnit,
            _e: EntryId,
            _len: u64,
        ) -> BoxFut<FsResult<()>> {
            Box::pin(async { Ok(()) })
        }
        fn unlink_chunk(&self, _t: hivefs_types::pattern::StripeUnit, _e: EntryId) -> BoxFut<FsResult<()>> {
            Box::pin(async { Ok(()) })
        }
    }

    fn open(dir: &std::path::Path) -> Namespace {
        let opts = NamespaceOptions {
            dir: dir.to_path_buf(),
            sync: false,
            node: NodeId(1),
            seed: Some(1),
            clock: None,
            min_free_bytes: 0,
            inline_writer: None,
        };
        Namespace::open(opts, Arc::new(OneTarget)).unwrap()
    }

    async fn create(ns: &Namespace, name: &str) -> EntryId {
        let req = Request::Create {
            parent: EntryId::ROOT,
            name: name.into(),
            kind: FileKind::File,
            mode: 0o644,
            rdev: 0,
            excl: true,
            caller: Caller::default(),
        };
        match ns.handle(req).await.unwrap() {
            Reply::Entry(a) => a.id,
            r => panic!("{r:?}"),
        }
    }

    #[tokio::test]
    async fn scans_page_and_fixes_check_what_they_change() {
        let d = tempfile::tempdir().unwrap();
        let ns = open(d.path());
        ns.ensure_root().await.unwrap();
        let a = create(&ns, "a").await;
        let b = create(&ns, "b").await;
        // Pages of one: every dentry once, in key order.
        let mut after = None;
        let mut names = Vec::new();
        loop {
            let Reply::FsckDentries { entries, more } =
                ns.handle(Request::FsckDentries { after: after.clone(), max: 1 }).await.unwrap()
            else {
                panic!()
            };
            assert!(entries.len() <= 1);
            after = entries.last().map(|e| (e.parent, e.name.clone()));
            names.extend(entries.into_iter().map(|e| (e.name, e.id)));
            if !more {
                break;
            }
        }
        assert_eq!(names, vec![(b"a".to_vec(), a), (b"b".to_vec(), b)]);
        let Reply::FsckInodes { inodes, more: false } =
            ns.handle(Request::FsckInodes { after: None, max: 10 }).await.unwrap()
        else {
            panic!()
        };
        assert_eq!(inodes.iter().map(|i| i.id).collect::<Vec<_>>(), vec![EntryId::ROOT, a, b]);

        // A fix computed from an old state is refused and changes nothing.
        let stale = FsckFix::SetNlink { id: a, from: 4, to: 2 };
        let e = ns.handle(Request::FsckFix { fix: stale }).await.unwrap_err();
        assert_eq!(e.code, ErrorCode::Busy, "{e}");
        let fix = FsckFix::SetNlink { id: a, from: 1, to: 3 };
        assert!(matches!(ns.handle(Request::FsckFix { fix }).await.unwrap(), Reply::FsckFixed(_)));
        assert_eq!(ns.getattr(a).unwrap().nlink, 3);
        // A dentry whose inode exists is not removed.
        let fix = FsckFix::RemoveDentry { parent: EntryId::ROOT, name: b"b".to_vec(), id: b };
        assert_eq!(ns.handle(Request::FsckFix { fix }).await.unwrap_err().code, ErrorCode::Busy);
        ns.close();

        // Orphan b offline, then give it a name in /lost+found.
        offline::remove_dentry(d.path(), EntryId::ROOT, b"b").unwrap();
        let ns = open(d.path());
        let Reply::FsckFixed(msg) = ns.handle(Request::FsckFix { fix: FsckFix::LostFound { id: b } }).await.unwrap()
        else {
            panic!()
        };
        assert!(msg.contains("lost+found"), "{msg}");
        let lf = ns.lookup(EntryId::ROOT, LOST_FOUND).unwrap();
        assert_eq!(ns.lookup(lf.id, b.to_string().as_bytes()).unwrap().id, b);
        assert_eq!(ns.getattr(EntryId::ROOT).unwrap().nlink, 3);
        assert_eq!(ns.counts().unwrap(), (2, 2));
        ns.close();
    }
}
