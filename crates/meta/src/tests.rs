//! Namespace tests against a temporary store, without network (a fake
//! [`DataTargets`] records what would be sent to storage), plus one
//! in-process test of `start` against a fake mgmtd.

use crate::gc::{RetryState, RoundOutcome};
use crate::namespace::{Namespace, NamespaceOptions};
use crate::store::{scan_children, DisposalState};
use crate::targets::{BoxFut, DataTargets};
use hivefs_proto::{
    Caller, DirEntry, Envelope, PeerOp, Reply, Request, Response, RENAME_EXCHANGE, RENAME_NOREPLACE,
    XATTR_ACL_KILL_SGID, XATTR_CREATE, XATTR_REPLACE,
};
use hivefs_types::acl;
use hivefs_types::attr::{EntryAttr, FileKind, SetAttr, SetTime, Timespec};
use hivefs_types::error::{ErrorCode, FsResult};
use hivefs_types::fs_err;
use hivefs_types::ids::{EntryId, NodeId, PoolId, TargetId};
use hivefs_types::pattern::{Chooser, DirPattern, StripeSet};
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

const ROOT: EntryId = EntryId::ROOT;
const ME: Caller = Caller::new(1000, 100);

#[derive(Clone, Debug, PartialEq, Eq)]
enum Call {
    Truncate(TargetId, EntryId, u64),
    Unlink(TargetId, EntryId),
}

#[derive(Default)]
struct FakeTargets {
    cands: Mutex<Vec<(TargetId, NodeId, u64)>>,
    calls: Mutex<Vec<Call>>,
    /// The next this many unlinks fail (a batch counts as one).
    fail_unlinks: AtomicU32,
    fail_truncates: AtomicBool,
    /// `unlink_chunks` batches as sent, in call order.
    batches: Mutex<Vec<(TargetId, Vec<EntryId>)>>,
    /// The next this many batches to this target fail.
    fail_target: Mutex<Option<(TargetId, u32)>>,
}

impl FakeTargets {
    fn with_targets(n: u32) -> Arc<FakeTargets> {
        let t = FakeTargets::default();
        // Two servers: odd targets on node 1, even on node 2.
        *t.cands.lock().unwrap() = (1..=n).map(|i| (TargetId(i), NodeId(1 + i % 2), 100 << 30)).collect();
        Arc::new(t)
    }
    fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }
    fn batches(&self) -> Vec<(TargetId, Vec<EntryId>)> {
        self.batches.lock().unwrap().clone()
    }
    fn unlinked(&self, id: EntryId) -> HashSet<TargetId> {
        self.calls()
            .into_iter()
            .filter_map(|c| match c {
                Call::Unlink(t, e) if e == id => Some(t),
                _ => None,
            })
            .collect()
    }
}

impl DataTargets for FakeTargets {
    fn candidates(&self, pool: PoolId) -> Vec<(TargetId, NodeId, u64)> {
        if pool == PoolId::DEFAULT {
            self.cands.lock().unwrap().clone()
        } else {
            Vec::new()
        }
    }
    fn truncate_chunk(
        &self,
        target: hivefs_types::pattern::StripeUnit,
        entry: EntryId,
        len: u64,
    ) -> BoxFut<FsResult<()>> {
        let target = TargetId(target.raw());
        self.calls.lock().unwrap().push(Call::Truncate(target, entry, len));
        let fail = self.fail_truncates.load(Ordering::SeqCst);
        Box::pin(async move {
            if fail {
                Err(fs_err!(Io, "disk on fire"))
            } else {
                Ok(())
            }
        })
    }
    fn unlink_chunk(&self, target: hivefs_types::pattern::StripeUnit, entry: EntryId) -> BoxFut<FsResult<()>> {
        let target = TargetId(target.raw());
        self.calls.lock().unwrap().push(Call::Unlink(target, entry));
        let fail = self.fail_unlinks.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok();
        Box::pin(async move {
            if fail {
                Err(fs_err!(Unavailable, "storage down"))
            } else {
                Ok(())
            }
        })
    }
    fn unlink_chunks(&self, target: hivefs_types::pattern::StripeUnit, entries: Vec<EntryId>) -> BoxFut<FsResult<()>> {
        let target = TargetId(target.raw());
        let mut calls = self.calls.lock().unwrap();
        calls.extend(entries.iter().map(|&e| Call::Unlink(target, e)));
        self.batches.lock().unwrap().push((target, entries));
        let mut ft = self.fail_target.lock().unwrap();
        let target_down = match &mut *ft {
            Some((t, n)) if *t == target && *n > 0 => {
                *n -= 1;
                true
            }
            _ => false,
        };
        let fail = target_down
            || self.fail_unlinks.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok();
        Box::pin(async move {
            if fail {
                Err(fs_err!(Unavailable, "storage target {target} down"))
            } else {
                Ok(())
            }
        })
    }
}

struct H {
    ns: Option<Namespace>,
    t: Arc<FakeTargets>,
    clock: Arc<AtomicI64>,
    dir: tempfile::TempDir,
    sync: bool,
}

fn ts(sec: i64) -> Timespec {
    Timespec { sec, nsec: 0 }
}

fn open_ns(dir: &std::path::Path, t: Arc<FakeTargets>, clock: Arc<AtomicI64>, sync: bool) -> Namespace {
    let c = clock.clone();
    let opts = NamespaceOptions {
        dir: dir.to_path_buf(),
        sync,
        node: NodeId(1),
        seed: Some(42),
        clock: Some(Arc::new(move || ts(c.load(Ordering::SeqCst)))),
        min_free_bytes: 0,
        inline_writer: None,
    };
    Namespace::open(opts, t).expect("open namespace")
}

impl H {
    async fn new() -> H {
        Self::with(FakeTargets::with_targets(4), true).await
    }

    async fn with(t: Arc<FakeTargets>, sync: bool) -> H {
        let dir = tempfile::tempdir().unwrap();
        let clock = Arc::new(AtomicI64::new(1000));
        let ns = open_ns(dir.path(), t.clone(), clock.clone(), sync);
        ns.ensure_root().await.unwrap();
        H { ns: Some(ns), t, clock, dir, sync }
    }

    fn ns(&self) -> &Namespace {
        self.ns.as_ref().unwrap()
    }

    /// Closes the store and opens it again (a restart).
    fn reopen(&mut self) {
        self.ns.take().unwrap().close();
        self.ns = Some(open_ns(self.dir.path(), self.t.clone(), self.clock.clone(), self.sync));
    }

    fn tick(&self) -> i64 {
        self.clock.fetch_add(10, Ordering::SeqCst) + 10
    }

    async fn call(&self, r: impl Into<Sent>) -> Response {
        let Sent(env, req) = r.into();
        self.ns().handle_env(env, req).await
    }

    async fn ok(&self, r: impl Into<Sent>) -> Reply {
        let r = r.into();
        let what = format!("{r:?}");
        self.call(r).await.unwrap_or_else(|e| panic!("{what}: {e}"))
    }

    async fn code(&self, r: impl Into<Sent>) -> ErrorCode {
        let r = r.into();
        let what = format!("{r:?}");
        match self.call(r).await {
            Ok(rep) => panic!("{what} succeeded: {rep:?}"),
            Err(e) => e.code,
        }
    }

    async fn entry(&self, r: impl Into<Sent>) -> EntryAttr {
        match self.ok(r).await {
            Reply::Entry(a) => a,
            other => panic!("expected an entry, got {other:?}"),
        }
    }

    /// A regular file with chunk files: created, then written through a
    /// handle (a file no client wrote has none; `chunkless_files_*`).
    async fn create(&self, parent: EntryId, name: &str) -> EntryAttr {
        let a = self.entry(create_req(parent, name, true)).await;
        if a.kind == FileKind::File {
            self.entry(Request::Open { id: a.id, write: true }).await;
            self.ok(Request::Release { id: a.id, write: true }).await;
        }
        a
    }

    async fn mkdir(&self, parent: EntryId, name: &str) -> EntryAttr {
        self.entry(Request::Mkdir { parent, name: name.into(), mode: 0o755, caller: ME }).await
    }

    async fn attr(&self, id: EntryId) -> EntryAttr {
        self.entry(Request::GetAttr { id }).await
    }

    async fn lookup(&self, parent: EntryId, name: &str) -> Response {
        self.call(Request::Lookup { parent, name: name.into() }).await
    }

    async fn gc(&self) -> RoundOutcome {
        self.ns().disposal_round(&mut RetryState::default()).await.unwrap()
    }

    fn disposal(&self, id: EntryId) -> Option<DisposalState> {
        self.ns().read(|t| t.disposal(id)).unwrap().map(|d| d.state)
    }

    async fn readdir_all(&self, dir: EntryId, page: u32) -> Vec<DirEntry> {
        let mut out = Vec::new();
        let mut after: Option<Vec<u8>> = None;
        loop {
            match self.ok(Request::ReadDir { dir, after: after.clone(), max: page }).await {
                Reply::DirPage { entries, more } => {
                    assert!(entries.len() <= page.max(1) as usize);
                    after = entries.last().map(|e| e.name.clone());
                    out.extend(entries);
                    if !more {
                        return out;
                    }
                }
                r => panic!("{r:?}"),
            }
        }
    }
}

fn create_req(parent: EntryId, name: &str, excl: bool) -> Request {
    Request::Create { parent, name: name.into(), kind: FileKind::File, mode: 0o100644, rdev: 0, excl, caller: ME }
}

fn rename(parent: EntryId, name: &str, new_parent: EntryId, new_name: &str, flags: u32) -> Request {
    Request::Rename { parent, name: name.into(), new_parent, new_name: new_name.into(), flags }
}

fn unlink(parent: EntryId, name: &str) -> Request {
    Request::Unlink { parent, name: name.into() }
}

fn rmdir(parent: EntryId, name: &str) -> Request {
    Request::Rmdir { parent, name: name.into() }
}

// ---------------------------------------------------------------- basics

#[tokio::test]
async fn root_is_created_once_with_defaults() {
    let mut h = H::new().await;
    let r = h.attr(ROOT).await;
    assert_eq!((r.kind, r.mode, r.uid, r.gid, r.nlink), (FileKind::Dir, 0o755, 0, 0, 2));
    assert_eq!(r.dir_pattern, Some(DirPattern::default()));
    assert_eq!(r.owner, NodeId(1));
    assert_eq!(h.ns().counts().unwrap(), (0, 1));
    h.reopen();
    h.ns().ensure_root().await.unwrap();
    assert_eq!(h.attr(ROOT).await, r, "ensure_root is idempotent");
    assert_eq!(h.ns().counts().unwrap(), (0, 1));
}

#[tokio::test]
async fn create_sets_attributes_pattern_and_parent_times() {
    let h = H::new().await;
    let now = h.tick();
    let f = h.create(ROOT, "f").await;
    assert_eq!((f.kind, f.mode, f.uid, f.gid, f.nlink, f.size), (FileKind::File, 0o644, 1000, 100, 1, 0));
    assert_eq!((f.atime, f.mtime, f.ctime), (ts(now), ts(now), ts(now)));
    assert_eq!(f.owner, NodeId(1));
    assert_eq!(f.id.node, 1);
    let p = f.pattern.clone().expect("a regular file has a pattern");
    assert_eq!(p.chunk_size(), 512 << 10);
    assert_eq!(p.stripe_count(), 4, "stripe count 0 means all targets");
    let root = h.attr(ROOT).await;
    assert_eq!((root.mtime, root.ctime), (ts(now), ts(now)));
    assert_eq!(h.entry(Request::Lookup { parent: ROOT, name: b"f".to_vec() }).await, f);
    assert_eq!(h.attr(f.id).await, f);
    assert_eq!(h.ns().counts().unwrap(), (1, 1));
}

#[tokio::test]
async fn create_errors() {
    let h = H::new().await;
    let f = h.create(ROOT, "f").await;
    h.mkdir(ROOT, "d").await;
    assert_eq!(h.code(create_req(ROOT, "f", true)).await, ErrorCode::Exists);
    // open(O_CREAT) without O_EXCL returns the existing file.
    assert_eq!(h.entry(create_req(ROOT, "f", false)).await.id, f.id);
    assert_eq!(h.code(create_req(ROOT, "d", false)).await, ErrorCode::IsDir);
    assert_eq!(h.code(create_req(ROOT, "d", true)).await, ErrorCode::Exists);
    let missing = EntryId { node: 1, epoch: 9, counter: 9 };
    let e = h.call(create_req(missing, "x", true)).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::NotFound);
    assert!(e.message.contains(&missing.to_string()), "{e}");
    assert_eq!(h.code(create_req(f.id, "x", true)).await, ErrorCode::NotDir);
    for bad in ["", ".", "..", "a/b", "a\0b"] {
        assert_eq!(h.code(create_req(ROOT, bad, true)).await, ErrorCode::Invalid, "{bad:?}");
    }
    assert_eq!(h.code(create_req(ROOT, &"n".repeat(256), true)).await, ErrorCode::NameTooLong);
    h.create(ROOT, &"n".repeat(255)).await;
    let dir_kind = Request::Create {
        parent: ROOT,
        name: b"k".to_vec(),
        kind: FileKind::Dir,
        mode: 0o755,
        rdev: 0,
        excl: true,
        caller: ME,
    };
    assert_eq!(h.code(dir_kind).await, ErrorCode::Invalid);
    // Failed creates changed nothing.
    assert_eq!(h.ns().counts().unwrap(), (2, 2));
}

#[tokio::test]
async fn lookup_reports_missing_names_with_the_directory() {
    let h = H::new().await;
    let e = h.lookup(ROOT, "nope").await.unwrap_err();
    assert_eq!(e.code, ErrorCode::NotFound);
    assert!(e.message.contains("\"nope\"") && e.message.contains("root"), "{e}");
    let d = h.mkdir(ROOT, "d").await;
    let sub = h.mkdir(d.id, "s").await;
    assert_eq!(h.entry(Request::Lookup { parent: sub.id, name: b"..".to_vec() }).await.id, d.id);
    assert_eq!(h.entry(Request::Lookup { parent: sub.id, name: b".".to_vec() }).await.id, sub.id);
    assert_eq!(h.entry(Request::Lookup { parent: ROOT, name: b"..".to_vec() }).await.id, ROOT);
}

#[tokio::test]
async fn special_files_and_no_space() {
    let h = H::with(Arc::new(FakeTargets::default()), true).await;
    let e = h.call(create_req(ROOT, "f", true)).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::NoSpace);
    assert!(e.message.contains("pool 1"), "{e}");
    // Special files need no storage target.
    let fifo = h
        .entry(Request::Create {
            parent: ROOT,
            name: b"p".to_vec(),
            kind: FileKind::Fifo,
            mode: 0o600,
            rdev: 0,
            excl: true,
            caller: ME,
        })
        .await;
    assert_eq!((fifo.kind, fifo.pattern), (FileKind::Fifo, None));
    let dev = h
        .entry(Request::Create {
            parent: ROOT,
            name: b"c".to_vec(),
            kind: FileKind::CharDev,
            mode: 0o600,
            rdev: 0x0501,
            excl: true,
            caller: ME,
        })
        .await;
    assert_eq!(dev.rdev, 0x0501);
    h.ok(unlink(ROOT, "p")).await;
    assert_eq!(h.gc().await, RoundOutcome::default(), "nothing to delete for a fifo");
}

#[tokio::test]
async fn dir_patterns_are_validated_inherited_and_applied() {
    let h = H::new().await;
    let d = h.mkdir(ROOT, "d").await;
    let dp = DirPattern {
        chunk_size: 64 << 10,
        stripe_count: 2,
        pool: PoolId::DEFAULT,
        chooser: Chooser::RoundRobin,
        mirror: false,
    };
    let a = h.entry(Request::SetDirPattern { id: d.id, pattern: dp.clone() }).await;
    assert_eq!(a.dir_pattern, Some(dp.clone()));
    let f = h.create(d.id, "f").await;
    let p = f.pattern.unwrap();
    assert_eq!((p.chunk_size(), p.stripe_count()), (64 << 10, 2));
    let g = h.create(d.id, "g").await.pattern.unwrap();
    assert_ne!(p.targets(), g.targets(), "round-robin rotates");
    let sub = h.mkdir(d.id, "sub").await;
    assert_eq!(sub.dir_pattern, Some(dp.clone()), "new directories inherit");
    // Stripe count larger than the pool: all targets.
    let wide = DirPattern { stripe_count: 99, ..dp.clone() };
    h.ok(Request::SetDirPattern { id: sub.id, pattern: wide }).await;
    assert_eq!(h.create(sub.id, "w").await.pattern.unwrap().stripe_count(), 4);
    // A mirrored directory with no buddy groups: files cannot be placed.
    let m = h.entry(Request::Mkdir { parent: ROOT, name: b"m".to_vec(), mode: 0o755, caller: ME }).await;
    let mirrored = DirPattern { mirror: true, ..dp.clone() };
    h.ok(Request::SetDirPattern { id: m.id, pattern: mirrored }).await;
    assert_eq!(h.code(create_req(m.id, "f", false)).await, ErrorCode::NoSpace);
    let bad = DirPattern { chunk_size: 5000, ..dp.clone() };
    assert_eq!(h.code(Request::SetDirPattern { id: d.id, pattern: bad }).await, ErrorCode::Invalid);
    let f = h.lookup(d.id, "f").await.unwrap();
    let Reply::Entry(f) = f else { panic!() };
    assert_eq!(h.code(Request::SetDirPattern { id: f.id, pattern: dp.clone() }).await, ErrorCode::NotDir);
    let other_pool = DirPattern { pool: PoolId(7), ..dp };
    h.ok(Request::SetDirPattern { id: d.id, pattern: other_pool }).await;
    let e = h.call(create_req(d.id, "x", true)).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::NoSpace);
    assert!(e.message.contains("pool 7"), "{e}");
}

// ------------------------------------------------------ directories

#[tokio::test]
async fn mkdir_rmdir_maintain_link_counts_and_errors() {
    let h = H::new().await;
    let t0 = h.tick();
    let a = h.mkdir(ROOT, "a").await;
    assert_eq!((a.kind, a.nlink, a.mode, a.uid), (FileKind::Dir, 2, 0o755, 1000));
    assert_eq!(h.attr(ROOT).await.mtime, ts(t0));
    h.mkdir(ROOT, "b").await;
    assert_eq!(h.attr(ROOT).await.nlink, 4);
    h.mkdir(a.id, "c").await;
    assert_eq!(h.attr(a.id).await.nlink, 3);
    h.create(a.id, "f").await;
    assert_eq!(h.attr(a.id).await.nlink, 3, "files do not count");
    assert_eq!(
        h.code(Request::Mkdir { parent: ROOT, name: b"a".to_vec(), mode: 0o755, caller: ME }).await,
        ErrorCode::Exists
    );
    assert_eq!(h.code(rmdir(ROOT, "a")).await, ErrorCode::NotEmpty);
    assert_eq!(h.code(rmdir(a.id, "f")).await, ErrorCode::NotDir);
    assert_eq!(h.code(unlink(ROOT, "a")).await, ErrorCode::IsDir);
    assert_eq!(h.code(rmdir(ROOT, "zz")).await, ErrorCode::NotFound);
    assert_eq!(h.code(rmdir(ROOT, ".")).await, ErrorCode::Invalid);
    let t1 = h.tick();
    h.ok(rmdir(ROOT, "b")).await;
    let root = h.attr(ROOT).await;
    assert_eq!((root.nlink, root.mtime, root.ctime), (3, ts(t1), ts(t1)));
    h.ok(rmdir(a.id, "c")).await;
    h.ok(unlink(a.id, "f")).await;
    h.ok(rmdir(ROOT, "a")).await;
    assert_eq!(h.code(Request::GetAttr { id: a.id }).await, ErrorCode::NotFound);
    assert_eq!(h.attr(ROOT).await.nlink, 2);
    assert_eq!(h.ns().counts().unwrap(), (0, 1));
}

#[tokio::test]
async fn setgid_directories_pass_on_their_group() {
    let h = H::new().await;
    let d = h.mkdir(ROOT, "d").await;
    h.ok(Request::SetAttr {
        id: d.id,
        attr: SetAttr { mode: Some(0o2775), gid: Some(555), ..Default::default() },
        caller: ME,
    })
    .await;
    let f = h.create(d.id, "f").await;
    assert_eq!((f.gid, f.mode), (555, 0o644));
    let s = h.mkdir(d.id, "s").await;
    assert_eq!((s.gid, s.mode), (555, 0o2755));
}

#[tokio::test]
async fn readdir_pages_5000_entries_exactly_once() {
    let h = Arc::new(H::new().await);
    let d = h.mkdir(ROOT, "big").await;
    // A neighbour directory with entries: its keys sort right after ours.
    let n = h.mkdir(ROOT, "neighbour").await;
    h.create(n.id, "zzz").await;
    let mut tasks = Vec::new();
    for w in 0..8 {
        let h = h.clone();
        tasks.push(tokio::spawn(async move {
            for i in (w..5000).step_by(8) {
                h.create(d.id, &format!("file-{i:05}")).await;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let all = h.readdir_all(d.id, 700).await;
    assert_eq!(all.len(), 5000);
    let names: Vec<Vec<u8>> = all.iter().map(|e| e.name.clone()).collect();
    let mut sorted = names.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(names, sorted, "byte order, no duplicates");
    assert!(all.iter().all(|e| e.kind == FileKind::File));
    // The server caps a page at 1024 entries.
    match h.ok(Request::ReadDir { dir: d.id, after: None, max: 100_000 }).await {
        Reply::DirPage { entries, more } => assert_eq!((entries.len(), more), (1024, true)),
        r => panic!("{r:?}"),
    }
    // The last page says there is no more.
    match h.ok(Request::ReadDir { dir: d.id, after: Some(b"file-04999".to_vec()), max: 10 }).await {
        Reply::DirPage { entries, more } => assert_eq!((entries.len(), more), (0, false)),
        r => panic!("{r:?}"),
    }
    match h.ok(Request::ReadDir { dir: d.id, after: Some(b"file-04997".to_vec()), max: 2 }).await {
        Reply::DirPage { entries, more } => assert_eq!((entries.len(), more), (2, false)),
        r => panic!("{r:?}"),
    }
    let root: Vec<Vec<u8>> = h.readdir_all(ROOT, 1).await.into_iter().map(|e| e.name).collect();
    assert_eq!(root, vec![b"big".to_vec(), b"neighbour".to_vec()]);
    let f = h.lookup(n.id, "zzz").await.unwrap();
    let Reply::Entry(f) = f else { panic!() };
    assert_eq!(h.code(Request::ReadDir { dir: f.id, after: None, max: 10 }).await, ErrorCode::NotDir);
    let missing = EntryId { node: 1, epoch: 77, counter: 1 };
    assert_eq!(h.code(Request::ReadDir { dir: missing, after: None, max: 10 }).await, ErrorCode::NotFound);
}

// ----------------------------------------------------------- rename

#[tokio::test]
async fn rename_within_and_across_directories() {
    let h = H::new().await;
    let a = h.mkdir(ROOT, "a").await;
    let b = h.mkdir(ROOT, "b").await;
    let f = h.create(a.id, "f").await;
    let t = h.tick();
    h.ok(rename(a.id, "f", a.id, "g", 0)).await;
    assert_eq!(h.lookup(a.id, "f").await.unwrap_err().code, ErrorCode::NotFound);
    assert_eq!(h.attr(f.id).await.ctime, ts(t));
    let t = h.tick();
    h.ok(rename(a.id, "g", b.id, "h", 0)).await;
    let Reply::Entry(moved) = h.lookup(b.id, "h").await.unwrap() else { panic!() };
    assert_eq!(moved.id, f.id);
    for dir in [a.id, b.id] {
        let d = h.attr(dir).await;
        assert_eq!((d.mtime, d.ctime), (ts(t), ts(t)), "both parents are touched");
    }
    // A directory moves with its `..` and the parents' link counts.
    let sub = h.mkdir(a.id, "sub").await;
    assert_eq!((h.attr(a.id).await.nlink, h.attr(b.id).await.nlink), (3, 2));
    h.ok(rename(a.id, "sub", b.id, "sub2", 0)).await;
    assert_eq!((h.attr(a.id).await.nlink, h.attr(b.id).await.nlink), (2, 3));
    assert_eq!(h.entry(Request::Lookup { parent: sub.id, name: b"..".to_vec() }).await.id, b.id);
    assert_eq!(h.attr(ROOT).await.nlink, 4);
    assert_eq!(h.ns().counts().unwrap(), (1, 4));
}

#[tokio::test]
async fn rename_replacing_targets() {
    let h = H::new().await;
    let a = h.create(ROOT, "a").await;
    let b = h.create(ROOT, "b").await;
    // File over file: the target's last link goes, its chunks are queued.
    h.ok(rename(ROOT, "a", ROOT, "b", 0)).await;
    let Reply::Entry(now_b) = h.lookup(ROOT, "b").await.unwrap() else { panic!() };
    assert_eq!(now_b.id, a.id);
    assert_eq!(h.code(Request::GetAttr { id: b.id }).await, ErrorCode::NotFound);
    assert_eq!(h.disposal(b.id), Some(DisposalState::DeleteChunks));
    assert_eq!(h.ns().counts().unwrap(), (1, 1));
    // File over one link of a file with two: only the link goes.
    let c = h.create(ROOT, "c").await;
    h.ok(Request::Link { id: c.id, new_parent: ROOT, new_name: b"c2".to_vec() }).await;
    h.ok(rename(ROOT, "b", ROOT, "c", 0)).await;
    assert_eq!(h.attr(c.id).await.nlink, 1);
    assert_eq!(h.disposal(c.id), None);
    // Directory over empty directory.
    let d1 = h.mkdir(ROOT, "d1").await;
    let d2 = h.mkdir(ROOT, "d2").await;
    assert_eq!(h.attr(ROOT).await.nlink, 4);
    h.ok(rename(ROOT, "d1", ROOT, "d2", 0)).await;
    assert_eq!(h.attr(ROOT).await.nlink, 3);
    assert_eq!(h.code(Request::GetAttr { id: d2.id }).await, ErrorCode::NotFound);
    let Reply::Entry(x) = h.lookup(ROOT, "d2").await.unwrap() else { panic!() };
    assert_eq!(x.id, d1.id);
    // Directory over empty directory in another parent.
    let p = h.mkdir(ROOT, "p").await;
    h.mkdir(p.id, "victim").await;
    assert_eq!(h.attr(p.id).await.nlink, 3);
    h.ok(rename(ROOT, "d2", p.id, "victim", 0)).await;
    assert_eq!((h.attr(ROOT).await.nlink, h.attr(p.id).await.nlink), (3, 3));
    // Files: `b` (was `a`) and `c` (still linked as `c2`); dirs: root, p, p/victim.
    assert_eq!(h.ns().counts().unwrap(), (2, 3));
}

#[tokio::test]
async fn rename_errors_and_no_ops() {
    let h = H::new().await;
    let f = h.create(ROOT, "f").await;
    let d = h.mkdir(ROOT, "d").await;
    let full = h.mkdir(ROOT, "full").await;
    h.create(full.id, "x").await;
    let inner = h.mkdir(d.id, "inner").await;
    assert_eq!(h.code(rename(ROOT, "f", ROOT, "d", 0)).await, ErrorCode::IsDir);
    assert_eq!(h.code(rename(ROOT, "d", ROOT, "f", 0)).await, ErrorCode::NotDir);
    assert_eq!(h.code(rename(d.id, "inner", ROOT, "full", 0)).await, ErrorCode::NotEmpty);
    assert_eq!(h.code(rename(ROOT, "d", inner.id, "loop", 0)).await, ErrorCode::Invalid);
    assert_eq!(h.code(rename(ROOT, "d", d.id, "self", 0)).await, ErrorCode::Invalid);
    assert_eq!(h.code(rename(ROOT, "nope", ROOT, "x", 0)).await, ErrorCode::NotFound);
    assert_eq!(h.code(rename(ROOT, "f", f.id, "x", 0)).await, ErrorCode::NotDir);
    assert_eq!(h.code(rename(ROOT, "f", ROOT, "full", RENAME_NOREPLACE)).await, ErrorCode::Exists);
    assert_eq!(h.code(rename(ROOT, "f", ROOT, "d", RENAME_EXCHANGE | RENAME_NOREPLACE)).await, ErrorCode::Invalid);
    assert_eq!(h.code(rename(ROOT, "f", ROOT, "g", 0x80)).await, ErrorCode::Invalid);
    assert_eq!(h.code(rename(ROOT, "f", ROOT, "..", 0)).await, ErrorCode::Invalid);
    h.ok(rename(ROOT, "f", ROOT, "g", RENAME_NOREPLACE)).await;
    // Onto itself, and onto another link of the same inode: nothing happens.
    let before = h.attr(f.id).await;
    h.ok(rename(ROOT, "g", ROOT, "g", 0)).await;
    h.ok(Request::Link { id: f.id, new_parent: d.id, new_name: b"g2".to_vec() }).await;
    h.ok(rename(ROOT, "g", d.id, "g2", 0)).await;
    assert!(h.lookup(ROOT, "g").await.is_ok() && h.lookup(d.id, "g2").await.is_ok());
    assert_eq!(h.attr(f.id).await.nlink, 2);
    assert_eq!(before.id, f.id);
    // Moving a directory up (out of its parent) is fine.
    h.ok(rename(d.id, "inner", ROOT, "inner", 0)).await;
    assert_eq!(h.attr(ROOT).await.nlink, 5);
}

#[tokio::test]
async fn rename_exchange_swaps_entries_links_and_parents() {
    let h = H::new().await;
    let a = h.mkdir(ROOT, "a").await;
    let b = h.mkdir(ROOT, "b").await;
    let f = h.create(a.id, "f").await;
    let d = h.mkdir(b.id, "d").await;
    h.create(d.id, "inside").await;
    let t = h.tick();
    h.ok(rename(a.id, "f", b.id, "d", RENAME_EXCHANGE)).await;
    let Reply::Entry(x) = h.lookup(a.id, "f").await.unwrap() else { panic!() };
    let Reply::Entry(y) = h.lookup(b.id, "d").await.unwrap() else { panic!() };
    assert_eq!((x.id, y.id), (d.id, f.id));
    assert_eq!((x.ctime, y.ctime), (ts(t), ts(t)), "both inodes change");
    assert_eq!((h.attr(a.id).await.nlink, h.attr(b.id).await.nlink), (3, 2), "the directory's link moves");
    assert_eq!((h.attr(a.id).await.mtime, h.attr(b.id).await.mtime), (ts(t), ts(t)));
    let Reply::Entry(up) = h.lookup(d.id, "..").await.unwrap() else { panic!() };
    assert_eq!(up.id, a.id, "the moved directory's parent pointer");
    // Within one directory; with itself; errors.
    h.create(ROOT, "g").await;
    h.ok(rename(ROOT, "a", ROOT, "g", RENAME_EXCHANGE)).await;
    let Reply::Entry(g) = h.lookup(ROOT, "g").await.unwrap() else { panic!() };
    assert_eq!(g.id, a.id);
    h.ok(rename(ROOT, "b", ROOT, "b", RENAME_EXCHANGE)).await;
    assert_eq!(h.code(rename(ROOT, "b", ROOT, "none", RENAME_EXCHANGE)).await, ErrorCode::NotFound);
    assert_eq!(h.code(rename(ROOT, "g", a.id, "f", RENAME_EXCHANGE)).await, ErrorCode::Invalid, "into own subtree");
    assert_eq!(h.code(rename(a.id, "f", ROOT, "g", RENAME_EXCHANGE)).await, ErrorCode::Invalid, "ancestor");
    assert_eq!(h.attr(ROOT).await.nlink, 4);
    assert_eq!(h.ns().counts().unwrap(), (3, 4));
}

// ------------------------------------------------ links and symlinks

#[tokio::test]
async fn hard_links() {
    let h = H::new().await;
    let d = h.mkdir(ROOT, "d").await;
    let f = h.create(ROOT, "f").await;
    let t = h.tick();
    let l = h.entry(Request::Link { id: f.id, new_parent: d.id, new_name: b"l".to_vec() }).await;
    assert_eq!((l.id, l.nlink, l.ctime), (f.id, 2, ts(t)));
    assert_eq!(h.attr(d.id).await.mtime, ts(t));
    let Reply::Entry(via) = h.lookup(d.id, "l").await.unwrap() else { panic!() };
    assert_eq!(via.id, f.id);
    assert_eq!(
        h.code(Request::Link { id: d.id, new_parent: ROOT, new_name: b"dl".to_vec() }).await,
        ErrorCode::NotPermitted
    );
    assert_eq!(h.code(Request::Link { id: f.id, new_parent: ROOT, new_name: b"d".to_vec() }).await, ErrorCode::Exists);
    let missing = EntryId { node: 1, epoch: 50, counter: 3 };
    assert_eq!(
        h.code(Request::Link { id: missing, new_parent: ROOT, new_name: b"m".to_vec() }).await,
        ErrorCode::NotFound
    );
    assert_eq!(h.code(Request::Link { id: f.id, new_parent: f.id, new_name: b"m".to_vec() }).await, ErrorCode::NotDir);
    assert_eq!(h.ns().counts().unwrap(), (1, 2), "a link is not a new file");
    let t = h.tick();
    h.ok(unlink(ROOT, "f")).await;
    let a = h.attr(f.id).await;
    assert_eq!((a.nlink, a.ctime), (1, ts(t)));
    assert_eq!(h.disposal(f.id), None);
    h.ok(unlink(d.id, "l")).await;
    assert_eq!(h.code(Request::GetAttr { id: f.id }).await, ErrorCode::NotFound);
    assert_eq!(h.disposal(f.id), Some(DisposalState::DeleteChunks));
    assert_eq!(h.ns().counts().unwrap(), (0, 2));
}

#[tokio::test]
async fn symlinks() {
    let h = H::new().await;
    let s =
        h.entry(Request::Symlink { parent: ROOT, name: b"s".to_vec(), target: b"../x/y".to_vec(), caller: ME }).await;
    assert_eq!((s.kind, s.mode, s.size, s.pattern.clone()), (FileKind::Symlink, 0o777, 6, None));
    assert_eq!(h.ok(Request::ReadLink { id: s.id }).await, Reply::LinkTarget(b"../x/y".to_vec()));
    let f = h.create(ROOT, "f").await;
    assert_eq!(h.code(Request::ReadLink { id: f.id }).await, ErrorCode::Invalid);
    let sym = |name: &str, target: Vec<u8>| Request::Symlink { parent: ROOT, name: name.into(), target, caller: ME };
    assert_eq!(h.code(sym("s", b"t".to_vec())).await, ErrorCode::Exists);
    assert_eq!(h.code(sym("e", Vec::new())).await, ErrorCode::NotFound);
    assert_eq!(h.code(sym("long", vec![b'a'; 4097])).await, ErrorCode::NameTooLong);
    h.ok(sym("max", vec![b'a'; 4096])).await;
    // Non-excl create on a symlink's name does not open it.
    assert_eq!(h.code(create_req(ROOT, "s", false)).await, ErrorCode::Exists);
    h.ok(unlink(ROOT, "s")).await;
    assert_eq!(h.code(Request::ReadLink { id: s.id }).await, ErrorCode::NotFound);
    assert_eq!(h.ns().counts().unwrap(), (2, 1));
}

// ------------------------------------------------------------ xattrs

#[tokio::test]
async fn xattrs() {
    let h = H::new().await;
    let f = h.create(ROOT, "f").await;
    let set = |name: &[u8], value: &[u8], flags| Request::SetXattr {
        id: f.id,
        name: name.to_vec(),
        value: value.to_vec(),
        flags,
    };
    let t = h.tick();
    h.ok(set(b"user.a", b"1", 0)).await;
    assert_eq!(h.attr(f.id).await.ctime, ts(t));
    h.ok(set(b"user.b", b"", XATTR_CREATE)).await;
    assert_eq!(h.code(set(b"user.a", b"2", XATTR_CREATE)).await, ErrorCode::Exists);
    assert_eq!(h.code(set(b"user.c", b"2", XATTR_REPLACE)).await, ErrorCode::NoData);
    h.ok(set(b"user.a", b"3", XATTR_REPLACE)).await;
    assert_eq!(h.ok(Request::GetXattr { id: f.id, name: b"user.a".to_vec() }).await, Reply::Xattr(b"3".to_vec()));
    assert_eq!(h.ok(Request::GetXattr { id: f.id, name: b"user.b".to_vec() }).await, Reply::Xattr(Vec::new()));
    assert_eq!(h.code(Request::GetXattr { id: f.id, name: b"user.zz".to_vec() }).await, ErrorCode::NoData);
    assert_eq!(
        h.ok(Request::ListXattr { id: f.id }).await,
        Reply::XattrNames(vec![b"user.a".to_vec(), b"user.b".to_vec()])
    );
    assert_eq!(h.code(set(&[b'n'; 256], b"", 0)).await, ErrorCode::NameTooLong);
    assert_eq!(h.code(set(b"user.big", &vec![0; 65537], 0)).await, ErrorCode::Range);
    h.ok(set(b"user.max", &vec![7; 65536], 0)).await;
    assert_eq!(h.code(set(b"user.x", b"", XATTR_CREATE | XATTR_REPLACE)).await, ErrorCode::Invalid);
    assert_eq!(h.code(set(b"", b"", 0)).await, ErrorCode::Invalid);
    h.ok(Request::RemoveXattr { id: f.id, name: b"user.b".to_vec() }).await;
    assert_eq!(h.code(Request::RemoveXattr { id: f.id, name: b"user.b".to_vec() }).await, ErrorCode::NoData);
    // Directories have xattrs too; a neighbouring inode's are not listed.
    let d = h.mkdir(ROOT, "d").await;
    h.ok(Request::SetXattr { id: d.id, name: b"user.d".to_vec(), value: b"x".to_vec(), flags: 0 }).await;
    assert_eq!(h.ok(Request::ListXattr { id: d.id }).await, Reply::XattrNames(vec![b"user.d".to_vec()]));
    // Removing the inode removes its xattrs.
    h.ok(unlink(ROOT, "f")).await;
    assert_eq!(h.code(Request::ListXattr { id: f.id }).await, ErrorCode::NotFound);
    let left = h.ns().read(|t| Ok(scan_children(&t.xattrs, f.id, None)?.count())).unwrap();
    assert_eq!(left, 0);
}

// ---------------------------------------------------- setattr, sizes

// ------------------------------------------------------------ POSIX ACLs

fn acl_of(entries: &[(acl::Tag, u16)]) -> acl::Acl {
    acl::Acl::new(entries.iter().map(|&(tag, perm)| acl::Entry { tag, perm }).collect()).unwrap()
}

/// owner rwx, user 1001 rw-, group r-x, mask rwx, other --x.
fn named_acl() -> acl::Acl {
    use acl::Tag::*;
    acl_of(&[(UserObj, 7), (User(1001), 6), (GroupObj, 5), (Mask, 7), (Other, 1)])
}

impl H {
    async fn set_acl(&self, id: EntryId, name: &[u8], a: &acl::Acl) -> Response {
        self.call(Request::SetXattr { id, name: name.to_vec(), value: a.encode(), flags: 0 }).await
    }

    async fn acl(&self, id: EntryId, name: &[u8]) -> Option<acl::Acl> {
        match self.call(Request::GetXattr { id, name: name.to_vec() }).await {
            Ok(Reply::Xattr(v)) => Some(acl::Acl::decode(&v).expect("a stored ACL decodes")),
            Err(e) if e.code == ErrorCode::NoData => None,
            r => panic!("{r:?}"),
        }
    }
}

#[tokio::test]
async fn access_acl_sets_the_mode_and_minimal_ones_are_not_stored() {
    let h = H::new().await;
    let f = h.create(ROOT, "f").await;
    assert_eq!(f.mode, 0o644);
    h.set_acl(f.id, acl::XATTR_ACCESS, &named_acl()).await.unwrap();
    assert_eq!(h.attr(f.id).await.mode, 0o771, "mode from the ACL: the group bits are the mask's");
    assert_eq!(h.acl(f.id, acl::XATTR_ACCESS).await, Some(named_acl()));
    // An ACL the mode says all of replaces the mode and is not kept.
    h.set_acl(f.id, acl::XATTR_ACCESS, &acl::Acl::from_mode(0o640)).await.unwrap();
    assert_eq!(h.attr(f.id).await.mode, 0o640);
    assert_eq!(h.acl(f.id, acl::XATTR_ACCESS).await, None);
    // Malformed: a named user without a mask, garbage, a wrong version.
    let mut no_mask = named_acl().encode();
    no_mask.drain(28..36); // the mask entry (after the header and 3 entries of 8 bytes)
    for bad in [no_mask, b"garbage".to_vec(), vec![1, 0, 0, 0, 1, 0, 7, 0, 255, 255, 255, 255]] {
        let r = h.call(Request::SetXattr { id: f.id, name: acl::XATTR_ACCESS.to_vec(), value: bad, flags: 0 }).await;
        assert_eq!(r.unwrap_err().code, ErrorCode::Invalid);
    }
    assert_eq!(h.attr(f.id).await.mode, 0o640, "a refused ACL changes nothing");
    // Default ACLs only on directories (EACCES, as ext4).
    let r = h.set_acl(f.id, acl::XATTR_DEFAULT, &named_acl()).await;
    assert_eq!(r.unwrap_err().code, ErrorCode::AccessDenied);
    // Set-id bits survive an ACL.
    h.ok(Request::SetAttr { id: f.id, attr: SetAttr { mode: Some(0o4640), ..Default::default() }, caller: ME }).await;
    h.set_acl(f.id, acl::XATTR_ACCESS, &named_acl()).await.unwrap();
    assert_eq!(h.attr(f.id).await.mode, 0o4771);
    // A caller outside the file's group: setgid goes with the ACL change.
    h.ok(Request::SetAttr { id: f.id, attr: SetAttr { mode: Some(0o6640), ..Default::default() }, caller: ME }).await;
    let kill = |name: &[u8]| Request::SetXattr {
        id: f.id,
        name: name.to_vec(),
        value: named_acl().encode(),
        flags: XATTR_ACL_KILL_SGID,
    };
    h.ok(kill(acl::XATTR_ACCESS)).await;
    assert_eq!(h.attr(f.id).await.mode, 0o4771, "S_ISGID cleared, S_ISUID kept");
    assert_eq!(h.code(kill(b"user.x")).await, ErrorCode::Invalid, "only for the access ACL");
}

#[tokio::test]
async fn chmod_rewrites_the_access_acl() {
    use acl::Tag::*;
    let h = H::new().await;
    let f = h.create(ROOT, "f").await;
    h.set_acl(f.id, acl::XATTR_ACCESS, &named_acl()).await.unwrap();
    let chmod =
        |mode| Request::SetAttr { id: f.id, attr: SetAttr { mode: Some(mode), ..Default::default() }, caller: ME };
    assert_eq!(h.entry(chmod(0o640)).await.mode, 0o640);
    let want = acl_of(&[(UserObj, 6), (User(1001), 6), (GroupObj, 5), (Mask, 4), (Other, 0)]);
    assert_eq!(h.acl(f.id, acl::XATTR_ACCESS).await, Some(want), "owner, mask and other follow; named entries stay");
    // Without a mask the owning group follows.
    let g = h.create(ROOT, "g").await;
    let d = h.mkdir(ROOT, "d").await;
    h.set_acl(d.id, acl::XATTR_DEFAULT, &acl::Acl::from_mode(0o750)).await.unwrap();
    h.entry(Request::SetAttr { id: d.id, attr: SetAttr { mode: Some(0o700), ..Default::default() }, caller: ME }).await;
    assert_eq!(h.acl(d.id, acl::XATTR_DEFAULT).await, Some(acl::Acl::from_mode(0o750)), "chmod leaves default ACLs");
    h.entry(Request::SetAttr { id: g.id, attr: SetAttr { mode: Some(0o600), ..Default::default() }, caller: ME }).await;
    assert_eq!(h.acl(g.id, acl::XATTR_ACCESS).await, None, "no ACL, none made");
}

#[tokio::test]
async fn new_entries_inherit_the_default_acl_or_get_the_umask() {
    use acl::Tag::*;
    let h = H::new().await;
    let acl_caller = Caller { umask: Some(0o027), ..ME };
    let d = h.mkdir(ROOT, "d").await;
    // No default ACL: the umask applies (only for an ACL caller).
    let mk = |parent, name: &str, mode, caller| Request::Mkdir { parent, name: name.into(), mode, caller };
    let create = |parent, name: &str, mode, caller| Request::Create {
        parent,
        name: name.into(),
        kind: FileKind::File,
        mode,
        rdev: 0,
        excl: true,
        caller,
    };
    let open =
        |parent, name: &str, mode, caller| Request::CreateOpen { parent, name: name.into(), mode, excl: true, caller };
    assert_eq!(h.entry(create(d.id, "u", 0o666, acl_caller)).await.mode, 0o640);
    assert_eq!(h.entry(mk(d.id, "ud", 0o777, acl_caller)).await.mode, 0o750);
    assert_eq!(h.entry(create(d.id, "tool", 0o666, ME)).await.mode, 0o666, "no umask: the mode as given");
    // A default ACL: inherited, the umask is not used.
    h.set_acl(d.id, acl::XATTR_DEFAULT, &named_acl()).await.unwrap();
    let f = h.entry(open(d.id, "f", 0o666, acl_caller)).await;
    assert_eq!(f.mode, 0o660);
    let want = acl_of(&[(UserObj, 6), (User(1001), 6), (GroupObj, 5), (Mask, 6), (Other, 0)]);
    assert_eq!(h.acl(f.id, acl::XATTR_ACCESS).await, Some(want));
    assert_eq!(h.acl(f.id, acl::XATTR_DEFAULT).await, None);
    let n = h.entry(create(d.id, "n", 0o600, acl_caller)).await;
    assert_eq!(n.mode, 0o600);
    let want = acl_of(&[(UserObj, 6), (User(1001), 6), (GroupObj, 5), (Mask, 0), (Other, 0)]);
    assert_eq!(h.acl(n.id, acl::XATTR_ACCESS).await, Some(want), "the mask limited by the create mode");
    let sub = h.entry(mk(d.id, "sub", 0o777, acl_caller)).await;
    assert_eq!(sub.mode, 0o771);
    assert_eq!(h.acl(sub.id, acl::XATTR_ACCESS).await, Some(named_acl()));
    assert_eq!(h.acl(sub.id, acl::XATTR_DEFAULT).await, Some(named_acl()), "directories keep the default");
    // ... and pass it on.
    let deeper = h.entry(create(sub.id, "x", 0o640, acl_caller)).await;
    assert_eq!(deeper.mode, 0o640);
    // Symlinks and non-ACL callers inherit nothing.
    let s = h
        .entry(Request::Symlink { parent: d.id, name: b"s".to_vec(), target: b"f".to_vec(), caller: acl_caller })
        .await;
    assert_eq!((s.mode, h.acl(s.id, acl::XATTR_ACCESS).await), (0o777, None));
    let t = h.entry(create(d.id, "t", 0o644, ME)).await;
    assert_eq!((t.mode, h.acl(t.id, acl::XATTR_ACCESS).await), (0o644, None));
}

#[tokio::test]
async fn setattr_modes_owners_times() {
    let h = H::new().await;
    let f = h.create(ROOT, "f").await;
    let t = h.tick();
    let a = h
        .entry(Request::SetAttr {
            id: f.id,
            attr: SetAttr { mode: Some(0o104755), uid: Some(7), gid: Some(8), ..Default::default() },
            caller: ME,
        })
        .await;
    assert_eq!((a.mode, a.uid, a.gid, a.ctime, a.mtime), (0o4755, 7, 8, ts(t), f.mtime));
    let t = h.tick();
    let a = h
        .entry(Request::SetAttr {
            id: f.id,
            attr: SetAttr { atime: Some(SetTime::At(ts(5))), mtime: Some(SetTime::Now), ..Default::default() },
            caller: ME,
        })
        .await;
    assert_eq!((a.atime, a.mtime, a.ctime), (ts(5), ts(t), ts(t)));
    assert!(h.t.calls().is_empty(), "no size, no storage traffic");
}

#[tokio::test]
async fn setattr_size_truncates_every_stripe_target() {
    let h = H::new().await;
    let d = h.mkdir(ROOT, "d").await;
    let dp = DirPattern {
        chunk_size: 4096,
        stripe_count: 3,
        pool: PoolId::DEFAULT,
        chooser: Chooser::Balanced,
        mirror: false,
    };
    h.ok(Request::SetDirPattern { id: d.id, pattern: dp }).await;
    let f = h.create(d.id, "f").await;
    let p = f.pattern.clone().unwrap();
    let t = h.tick();
    let size = 4096 * 4 + 100;
    let a = h
        .entry(Request::SetAttr { id: f.id, attr: SetAttr { size: Some(size), ..Default::default() }, caller: ME })
        .await;
    assert_eq!((a.size, a.mtime, a.ctime), (size, ts(t), ts(t)));
    let mut calls = h.t.calls();
    calls.sort_by_key(|c| format!("{c:?}"));
    let mut want: Vec<Call> =
        p.targets().iter().enumerate().map(|(i, &tg)| Call::Truncate(tg, f.id, p.chunk_file_len(size, i))).collect();
    want.sort_by_key(|c| format!("{c:?}"));
    assert_eq!(calls, want);
    assert_eq!(want.iter().map(|c| if let Call::Truncate(_, _, l) = c { *l } else { 0 }).sum::<u64>(), size);
    // A failing target fails the truncate, names the target, keeps the size.
    h.t.fail_truncates.store(true, Ordering::SeqCst);
    let e = h
        .call(Request::SetAttr { id: f.id, attr: SetAttr { size: Some(1), ..Default::default() }, caller: ME })
        .await
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::Io);
    assert!(e.message.contains("target"), "{e}");
    assert_eq!(h.attr(f.id).await.size, size);
    let size_of = |id| Request::SetAttr { id, attr: SetAttr { size: Some(0), ..Default::default() }, caller: ME };
    assert_eq!(h.code(size_of(d.id)).await, ErrorCode::IsDir);
}

#[tokio::test]
async fn update_size_raises_size_and_mtime() {
    let h = H::new().await;
    let f = h.create(ROOT, "f").await;
    let t = h.tick();
    let a = h.entry(Request::UpdateSize { id: f.id, size: 12345, mtime: Some(ts(77)) }).await;
    assert_eq!(a, h.attr(f.id).await);
    assert_eq!((a.size, a.mtime, a.ctime), (12345, ts(77), ts(t)));
    // Another writer's report computed earlier, arriving later (an N-1
    // shared file closed by two writers): the file keeps the larger size.
    let a = h.entry(Request::UpdateSize { id: f.id, size: 10, mtime: Some(ts(78)) }).await;
    assert_eq!((a.size, a.mtime), (12345, ts(78)));
    // Truncation is how a size goes down.
    let set = SetAttr { size: Some(10), ..Default::default() };
    h.ok(Request::SetAttr { id: f.id, attr: set, caller: Default::default() }).await;
    assert_eq!(h.attr(f.id).await.size, 10);
    assert_eq!(h.code(Request::UpdateSize { id: ROOT, size: 1, mtime: None }).await, ErrorCode::IsDir);
    let missing = EntryId { node: 1, epoch: 9, counter: 1 };
    assert_eq!(h.code(Request::UpdateSize { id: missing, size: 1, mtime: None }).await, ErrorCode::NotFound);
}

#[tokio::test]
async fn a_writers_own_size_lands_only_on_the_file_it_saw() {
    let h = H::new().await;
    let f = h.create(ROOT, "f").await;
    // Unchanged since the writer saw it: applied as UpdateSize.
    h.tick();
    let a = h.entry(Request::UpdateSizeIf { id: f.id, size: 4096, mtime: Some(ts(70)), ctime: f.ctime }).await;
    assert_eq!((a.size, a.mtime), (4096, ts(70)));
    assert_ne!(a.ctime, f.ctime);
    // A repeat of the same report finds the ctime it set: refused, nothing changes.
    let again = Request::UpdateSizeIf { id: f.id, size: 8192, mtime: Some(ts(71)), ctime: f.ctime };
    assert_eq!(h.code(again).await, ErrorCode::Busy);
    assert_eq!(h.attr(f.id).await, a);
    // Another client truncated the file after the writer's writes: the
    // writer's report of where they ended must not bring the size back.
    h.tick();
    let set = SetAttr { size: Some(0), ..Default::default() };
    h.ok(Request::SetAttr { id: f.id, attr: set, caller: Default::default() }).await;
    let stale = Request::UpdateSizeIf { id: f.id, size: 4096, mtime: Some(ts(72)), ctime: a.ctime };
    assert_eq!(h.code(stale).await, ErrorCode::Busy);
    assert_eq!(h.attr(f.id).await.size, 0);
    // The rules of UpdateSize hold: not a directory, not a missing file.
    let c = Timespec::default();
    assert_eq!(h.code(Request::UpdateSizeIf { id: ROOT, size: 1, mtime: None, ctime: c }).await, ErrorCode::IsDir);
}

#[tokio::test]
async fn lease_dir_names_answers_only_for_an_empty_directory() {
    let h = H::new().await;
    let d = h.mkdir(ROOT, "d").await;
    assert!(matches!(h.ok(Request::LeaseDirNames { dir: d.id }).await, Reply::Entry(a) if a.id == d.id));
    let f = h.create(d.id, "f").await;
    assert_eq!(h.ok(Request::LeaseDirNames { dir: d.id }).await, Reply::Ok);
    assert_eq!(h.code(Request::LeaseDirNames { dir: f.id }).await, ErrorCode::NotDir);
}

// ------------------------------------------- unlink, open, disposal

#[tokio::test]
async fn unlink_queues_chunk_deletion_on_every_target() {
    let h = H::new().await;
    let f = h.create(ROOT, "f").await;
    let t = h.tick();
    h.ok(unlink(ROOT, "f")).await;
    assert_eq!(h.attr(ROOT).await.mtime, ts(t));
    assert_eq!(h.code(Request::GetAttr { id: f.id }).await, ErrorCode::NotFound);
    assert_eq!(h.code(unlink(ROOT, "f")).await, ErrorCode::NotFound);
    assert_eq!(h.disposal(f.id), Some(DisposalState::DeleteChunks));
    let r = h.gc().await;
    assert_eq!((r.deleted, r.failed), (1, 0));
    let want: HashSet<TargetId> = f.pattern.unwrap().targets().iter().copied().collect();
    assert_eq!(h.t.unlinked(f.id), want);
    assert_eq!(h.disposal(f.id), None);
    assert_eq!(h.gc().await, RoundOutcome::default());
}

#[tokio::test]
async fn failed_chunk_deletions_are_retried_until_done() {
    let h = H::new().await;
    let f = h.create(ROOT, "f").await;
    h.ok(unlink(ROOT, "f")).await;
    h.t.fail_unlinks.store(2, Ordering::SeqCst);
    let mut st = RetryState::default();
    let r = h.ns().disposal_round(&mut st).await.unwrap();
    assert_eq!((r.deleted, r.failed), (0, 1));
    assert!(r.next_due.is_some());
    assert_eq!(h.disposal(f.id), Some(DisposalState::DeleteChunks), "kept until every target succeeded");
    // Backed off: the same state skips it for now.
    let r = h.ns().disposal_round(&mut st).await.unwrap();
    assert_eq!((r.deleted, r.failed), (0, 0));
    // Survives a restart, and the retry succeeds.
    let mut h = h;
    h.reopen();
    let r = h.gc().await;
    assert_eq!((r.deleted, r.failed), (1, 0));
    assert_eq!(h.disposal(f.id), None);
}

/// The disposal loop waits a moment after a wake-up, so a burst of removals
/// costs one round (one request per target), not a round per removal.
#[tokio::test]
async fn a_burst_of_removals_is_disposed_of_in_few_rounds() {
    let mut h = H::new().await;
    const FILES: usize = 20;
    for i in 0..FILES {
        h.create(ROOT, &format!("f{i}")).await;
    }
    let ns = Arc::new(h.ns.take().unwrap());
    let gc = crate::gc::spawn_disposal(ns.clone());
    for i in 0..FILES {
        ns.handle(unlink(ROOT, &format!("f{i}"))).await.unwrap();
    }
    let start = std::time::Instant::now();
    while !ns.read(|t| t.disposal_scan(None, 1)).unwrap().is_empty() {
        assert!(start.elapsed() < std::time::Duration::from_secs(20), "chunks were never deleted");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    gc.abort();
    // A round sends at most one request to each of the 4 targets; a round
    // per removal would have sent at least one request per removal.
    let sent = h.t.batches().len();
    assert!(sent <= 3 * 4, "{sent} requests for {FILES} removals");
}

#[tokio::test]
async fn chunk_deletions_go_in_one_batch_per_target_and_only_failed_targets_are_retried() {
    let h = H::new().await;
    let mut files = Vec::new();
    for i in 0..6 {
        let name = format!("f{i}");
        files.push(h.create(ROOT, &name).await);
        h.ok(unlink(ROOT, &name)).await;
    }
    let targets_of = |f: &EntryAttr| f.pattern.as_ref().unwrap().targets().to_vec();
    let sorted = |mut v: Vec<EntryId>| {
        v.sort();
        v
    };
    let on = |t: TargetId| sorted(files.iter().filter(|f| targets_of(f).contains(&t)).map(|f| f.id).collect());
    let down = TargetId(2);
    assert!(!on(down).is_empty());
    *h.t.fail_target.lock().unwrap() = Some((down, 1));

    let mut st = RetryState::default();
    let r = h.ns().disposal_round(&mut st).await.unwrap();
    // One request per target, carrying every entry striped over it.
    let mut sent: Vec<(TargetId, Vec<EntryId>)> = h.t.batches().into_iter().map(|(t, ids)| (t, sorted(ids))).collect();
    sent.sort();
    let want: Vec<(TargetId, Vec<EntryId>)> =
        (1..=4).map(TargetId).map(|t| (t, on(t))).filter(|b| !b.1.is_empty()).collect();
    assert_eq!(sent, want);
    assert_eq!((r.deleted, r.failed), (files.len() - on(down).len(), on(down).len()));
    for f in &files {
        let kept = targets_of(f).contains(&down);
        assert_eq!(h.disposal(f.id).is_some(), kept, "{}: kept only while a target failed", f.id);
    }
    // Backed off: nothing is sent until the entries are due again.
    assert_eq!(
        h.ns().disposal_round(&mut st).await.unwrap(),
        RoundOutcome { next_due: r.next_due, ..Default::default() }
    );
    assert_eq!(h.t.batches().len(), want.len());

    // The retry goes only to the target that failed, and finishes the rest.
    st.make_all_due();
    let r = h.ns().disposal_round(&mut st).await.unwrap();
    assert_eq!((r.deleted, r.failed), (on(down).len(), 0));
    let retried: Vec<(TargetId, Vec<EntryId>)> =
        h.t.batches()[want.len()..].iter().map(|(t, ids)| (*t, sorted(ids.clone()))).collect();
    assert_eq!(retried, vec![(down, on(down))]);
    for f in &files {
        assert_eq!(h.disposal(f.id), None);
        assert_eq!(h.t.unlinked(f.id), targets_of(f).into_iter().collect::<HashSet<_>>());
    }
    assert_eq!(h.gc().await, RoundOutcome::default());
}

#[tokio::test]
async fn a_disposal_round_takes_at_most_round_max_entries() {
    let h = H::with(FakeTargets::with_targets(2), false).await;
    let n = crate::gc::ROUND_MAX + 10;
    for i in 0..n {
        let name = format!("f{i}");
        h.create(ROOT, &name).await;
        h.ok(unlink(ROOT, &name)).await;
    }
    let r = h.gc().await;
    assert_eq!(r.deleted, crate::gc::ROUND_MAX);
    assert!(r.more);
    assert!(h.t.batches().iter().all(|(_, ids)| ids.len() <= crate::gc::ROUND_MAX));
    let r = h.gc().await;
    assert_eq!((r.deleted, r.more), (10, false));
    assert_eq!(h.t.batches().len(), 4, "one batch per target per round");
}

#[tokio::test]
async fn open_unlinked_file_keeps_its_chunks_until_the_last_release() {
    let h = H::new().await;
    let f = h.create(ROOT, "f").await;
    let o = h.entry(Request::Open { id: f.id, write: true }).await;
    assert_eq!(o.pattern, f.pattern, "open returns the pattern");
    h.ok(Request::Open { id: f.id, write: false }).await;
    h.ok(unlink(ROOT, "f")).await;
    assert_eq!(h.lookup(ROOT, "f").await.unwrap_err().code, ErrorCode::NotFound);
    // The open handles still see the inode (fstat, ftruncate, size reports).
    assert_eq!(h.attr(f.id).await.nlink, 0);
    h.ok(Request::UpdateSize { id: f.id, size: 5, mtime: None }).await;
    assert_eq!(
        h.code(Request::Link { id: f.id, new_parent: ROOT, new_name: b"back".to_vec() }).await,
        ErrorCode::NotFound
    );
    assert_eq!(h.disposal(f.id), Some(DisposalState::OpenUnlinked));
    assert_eq!(h.ns().counts().unwrap(), (0, 1));
    assert_eq!(h.gc().await.deleted, 0);
    assert!(h.t.unlinked(f.id).is_empty());
    h.ok(Request::Release { id: f.id, write: false }).await;
    assert_eq!(h.disposal(f.id), Some(DisposalState::OpenUnlinked), "one handle left");
    h.ok(Request::Release { id: f.id, write: true }).await;
    assert_eq!(h.code(Request::GetAttr { id: f.id }).await, ErrorCode::NotFound);
    assert_eq!(h.disposal(f.id), Some(DisposalState::DeleteChunks));
    assert_eq!(h.gc().await.deleted, 1);
    assert_eq!(h.t.unlinked(f.id).len(), 4);
    // Releases without opens are harmless.
    h.ok(Request::Release { id: f.id, write: false }).await;
    assert_eq!(h.code(Request::Open { id: f.id, write: false }).await, ErrorCode::NotFound);
    assert!(!h.ns().opens.is_open(f.id), "a failed open is not counted");
}

/// `ReleaseMany` is one `Release` per handle: an unlinked file goes at its
/// last one, unknown and repeated ids are skipped, too many are refused.
#[tokio::test]
async fn released_in_a_batch_an_unlinked_file_goes_at_its_last_handle() {
    let h = H::new().await;
    let (f, g) = (h.create(ROOT, "f").await, h.create(ROOT, "g").await);
    for _ in 0..2 {
        h.ok(Request::Open { id: f.id, write: true }).await;
    }
    h.ok(Request::Open { id: g.id, write: false }).await;
    h.ok(unlink(ROOT, "f")).await;
    h.ok(Request::ReleaseMany { ids: vec![f.id, g.id, EntryId { node: 9, epoch: 9, counter: 9 }], wrote: vec![] })
        .await;
    assert_eq!(h.disposal(f.id), Some(DisposalState::OpenUnlinked), "one handle left");
    assert!(!h.ns().opens.is_open(g.id));
    h.ok(Request::ReleaseMany { ids: vec![f.id, f.id], wrote: vec![f.id] }).await;
    assert_eq!(h.disposal(f.id), Some(DisposalState::DeleteChunks));
    let many = vec![g.id; hivefs_proto::RELEASE_MANY_MAX + 1];
    assert_eq!(h.code(Request::ReleaseMany { ids: many, wrote: vec![] }).await, ErrorCode::Invalid);
}

/// A file this node made that no client reported writing has no chunk
/// files: its removal deletes none (no disposal record, no target asked).
/// Any report of a write, a truncation, or a restart of the
/// node in between makes the removal delete them as for every file.
#[tokio::test]
async fn chunkless_files_are_removed_without_asking_their_targets() {
    let mut h = H::new().await;
    let create_open =
        |name: &str| Request::CreateOpen { parent: ROOT, name: name.into(), mode: 0o644, excl: true, caller: ME };
    let gone_without_chunks = |h: &H, id| {
        assert_eq!(h.disposal(id), None, "{id}: no chunk deletion queued");
        assert!(h.t.unlinked(id).is_empty(), "{id}: no target asked");
    };
    // Created and closed unwritten (the release says so), or made by mknod.
    let a = h.entry(create_open("a")).await;
    h.ok(Request::ReleaseMany { ids: vec![a.id], wrote: vec![] }).await;
    let m = h.entry(create_req(ROOT, "m", true)).await;
    h.ok(Request::Open { id: m.id, write: true }).await;
    h.ok(Request::Release { id: m.id, write: false }).await;
    for (name, id) in [("a", a.id), ("m", m.id)] {
        h.ok(unlink(ROOT, name)).await;
        gone_without_chunks(&h, id);
    }
    assert_eq!(h.gc().await, RoundOutcome::default());
    // Still open at the remove: parked until the last release, which says
    // whether there is anything to delete.
    let (o, p) = (h.entry(create_open("o")).await, h.entry(create_open("p")).await);
    for name in ["o", "p"] {
        h.ok(unlink(ROOT, name)).await;
    }
    assert_eq!(h.disposal(o.id), Some(DisposalState::OpenUnlinked));
    h.ok(Request::ReleaseMany { ids: vec![o.id, p.id], wrote: vec![p.id] }).await;
    gone_without_chunks(&h, o.id);
    assert_eq!(h.disposal(p.id), Some(DisposalState::DeleteChunks));

    // Each of these makes the removal delete chunk files.
    let written = h.entry(create_open("w")).await;
    h.ok(Request::ReleaseMany { ids: vec![written.id], wrote: vec![written.id] }).await;
    let single = h.entry(create_open("s")).await;
    h.ok(Request::Release { id: single.id, write: true }).await;
    // A second client's handle wrote; the creator's did not.
    let other = h.entry(create_open("x")).await;
    h.ok(Request::Open { id: other.id, write: true }).await;
    h.ok(Request::ReleaseMany { ids: vec![other.id], wrote: vec![other.id] }).await;
    h.ok(Request::ReleaseMany { ids: vec![other.id], wrote: vec![] }).await;
    let truncated = h.entry(create_open("t")).await;
    let size = SetAttr { size: Some(10), ..Default::default() };
    h.ok(Request::SetAttr { id: truncated.id, attr: size, caller: ME }).await;
    h.ok(Request::ReleaseMany { ids: vec![truncated.id], wrote: vec![] }).await;
    let restarted = h.entry(create_open("r")).await;
    h.ok(Request::ReleaseMany { ids: vec![restarted.id], wrote: vec![] }).await;
    h.reopen();
    for (name, id) in [("w", written.id), ("s", single.id), ("x", other.id), ("t", truncated.id), ("r", restarted.id)] {
        h.ok(unlink(ROOT, name)).await;
        assert_eq!(h.disposal(id), Some(DisposalState::DeleteChunks), "{name}");
    }
    assert_eq!(h.gc().await.deleted, 6, "five files and the parked one written");
}

/// Releases that name the stripe positions written narrow a removal to
/// those targets: each handle's positions add up, a release without
/// positions or a truncation widens it to the whole stripe, and a file
/// parked open gets the same at its last release.
#[tokio::test]
async fn a_removal_deletes_chunk_files_only_where_releases_said_they_were_written() {
    let h = H::new().await;
    let create_open =
        |name: &str| Request::CreateOpen { parent: ROOT, name: name.into(), mode: 0o644, excl: true, caller: ME };
    let on = |bits: &[usize]| {
        let mut s = StripeSet::EMPTY;
        bits.iter().for_each(|&b| s.insert(b));
        s
    };
    let stripe = |a: &EntryAttr| a.pattern.clone().expect("a file's pattern").targets().to_vec();
    let removed_from = |name: &str, id| {
        let h = &h;
        let name = name.to_string();
        async move {
            h.ok(unlink(ROOT, &name)).await;
            h.gc().await;
            let mut asked: Vec<TargetId> = h.t.unlinked(id).into_iter().collect();
            asked.sort();
            asked
        }
    };
    let sorted = |mut v: Vec<TargetId>| {
        v.sort();
        v
    };

    // One handle wrote position 1, a second one position 3.
    let a = h.entry(create_open("a")).await;
    h.ok(Request::Open { id: a.id, write: true }).await;
    h.ok(Request::ReleaseWritten { handles: vec![(a.id, on(&[1]))] }).await;
    h.ok(Request::ReleaseWritten { handles: vec![(a.id, on(&[3]))] }).await;
    let t = stripe(&a);
    assert_eq!(t.len(), 4);
    assert_eq!(removed_from("a", a.id).await, sorted(vec![t[1], t[3]]));

    // Nothing written: nothing asked, no record.
    let b = h.entry(create_open("b")).await;
    h.ok(Request::ReleaseWritten { handles: vec![(b.id, StripeSet::EMPTY)] }).await;
    assert_eq!(removed_from("b", b.id).await, vec![]);

    // Parked open at the remove; its last release says where it wrote.
    let c = h.entry(create_open("c")).await;
    h.ok(unlink(ROOT, "c")).await;
    assert_eq!(h.disposal(c.id), Some(DisposalState::OpenUnlinked));
    h.ok(Request::ReleaseWritten { handles: vec![(c.id, on(&[2]))] }).await;
    h.gc().await;
    assert_eq!(h.t.unlinked(c.id).into_iter().collect::<Vec<_>>(), vec![stripe(&c)[2]]);

    // Widened to the whole stripe: a release that only says it wrote, or a truncation.
    let d = h.entry(create_open("d")).await;
    h.ok(Request::Open { id: d.id, write: true }).await;
    h.ok(Request::ReleaseWritten { handles: vec![(d.id, on(&[0]))] }).await;
    h.ok(Request::Release { id: d.id, write: true }).await;
    assert_eq!(removed_from("d", d.id).await, sorted(stripe(&d)));
    let e = h.entry(create_open("e")).await;
    h.ok(Request::ReleaseWritten { handles: vec![(e.id, on(&[0]))] }).await;
    let size = SetAttr { size: Some(10 << 20), ..Default::default() };
    h.ok(Request::SetAttr { id: e.id, attr: size, caller: ME }).await;
    assert_eq!(removed_from("e", e.id).await, sorted(stripe(&e)));

    // Too many handles in one request are refused before any is released.
    let many = vec![(a.id, StripeSet::EMPTY); hivefs_proto::RELEASE_MANY_MAX + 1];
    assert_eq!(h.code(Request::ReleaseWritten { handles: many }).await, ErrorCode::Invalid);
}

/// Open handles handed over by a rename count once per rename, however
/// often the hand-over arrives (a repeat after a lost answer, a late
/// delivery): counted twice, the file would stay open after its last
/// release and an unlinked one would keep its chunk files.
#[tokio::test]
async fn handles_handed_over_by_a_rename_count_once() {
    let h = H::new().await;
    let f = h.create(ROOT, "moved-here").await;
    let rename = |counter| EntryId { node: 2, epoch: 1, counter };
    for _ in 0..3 {
        h.ns().peer(PeerOp::HandOver { intent: rename(7), id: f.id, count: 2 }, None).await.unwrap();
    }
    h.ok(unlink(ROOT, "moved-here")).await;
    assert_eq!(h.disposal(f.id), Some(DisposalState::OpenUnlinked));
    h.ok(Request::Release { id: f.id, write: true }).await;
    assert!(h.ns().opens.is_open(f.id), "one handle left");
    h.ok(Request::Release { id: f.id, write: true }).await;
    assert!(!h.ns().opens.is_open(f.id), "two handles were handed over, not six");
    assert_eq!(h.disposal(f.id), Some(DisposalState::DeleteChunks));
    // Another rename's hand-over counts.
    let g = h.create(ROOT, "g").await;
    h.ns().peer(PeerOp::HandOver { intent: rename(8), id: g.id, count: 1 }, None).await.unwrap();
    assert!(h.ns().opens.is_open(g.id));
}

#[tokio::test]
async fn open_unlinked_entries_are_finished_at_restart() {
    let mut h = H::new().await;
    let f = h.create(ROOT, "f").await;
    h.ok(Request::Open { id: f.id, write: true }).await;
    h.ok(unlink(ROOT, "f")).await;
    assert_eq!(h.disposal(f.id), Some(DisposalState::OpenUnlinked));
    h.reopen();
    assert_eq!(h.code(Request::GetAttr { id: f.id }).await, ErrorCode::NotFound);
    assert_eq!(h.disposal(f.id), Some(DisposalState::DeleteChunks));
    assert_eq!(h.gc().await.deleted, 1);
}

#[tokio::test]
async fn an_orphan_released_before_its_unlink_committed_is_finished_by_the_disposal_task() {
    // The race the disposal scan covers: the last release saw no record yet.
    let h = H::new().await;
    let f = h.create(ROOT, "f").await;
    h.ns().opens_for_test_inc(f.id);
    h.ok(unlink(ROOT, "f")).await;
    h.ns().opens_for_test_dec(f.id);
    assert_eq!(h.disposal(f.id), Some(DisposalState::OpenUnlinked));
    let r = h.gc().await;
    assert_eq!(r.orphans_finished, 1);
    assert_eq!(h.gc().await.deleted, 1);
    assert_eq!(h.code(Request::GetAttr { id: f.id }).await, ErrorCode::NotFound);
}

// ------------------------------------------------ persistence, misc

#[tokio::test]
async fn everything_survives_a_restart_and_ids_stay_unique() {
    let mut h = H::new().await;
    let epoch = h.ns().epoch();
    let d = h.mkdir(ROOT, "d").await;
    let f = h.create(d.id, "f").await;
    h.ok(Request::SetXattr { id: f.id, name: b"user.k".to_vec(), value: b"v".to_vec(), flags: 0 }).await;
    let s = h.entry(Request::Symlink { parent: d.id, name: b"s".to_vec(), target: b"f".to_vec(), caller: ME }).await;
    h.reopen();
    assert_eq!(h.ns().epoch(), epoch + 1);
    assert_eq!(h.attr(f.id).await, f);
    assert_eq!(h.attr(d.id).await.nlink, 2);
    assert_eq!(h.ok(Request::GetXattr { id: f.id, name: b"user.k".to_vec() }).await, Reply::Xattr(b"v".to_vec()));
    assert_eq!(h.ok(Request::ReadLink { id: s.id }).await, Reply::LinkTarget(b"f".to_vec()));
    assert_eq!(h.ns().counts().unwrap(), (2, 2));
    let g = h.create(d.id, "g").await;
    assert_eq!(g.id.epoch, epoch + 1);
    assert!(![d.id, f.id, s.id].contains(&g.id));
    assert_eq!(h.readdir_all(d.id, 10).await.len(), 3);
}

#[tokio::test]
async fn the_epoch_moves_on_before_ids_leave_the_inode_number_space() {
    let mut h = H::new().await;
    h.ns.take().unwrap().close();
    let c = h.clock.clone();
    let opts = NamespaceOptions {
        dir: h.dir.path().to_path_buf(),
        sync: true,
        node: NodeId(1),
        seed: Some(42),
        clock: Some(Arc::new(move || ts(c.load(Ordering::SeqCst)))),
        min_free_bytes: 0,
        inline_writer: None,
    };
    let mut store = crate::store::Store::open(&h.dir.path().join(crate::namespace::DB_FILE), true).unwrap();
    let epoch = store.epoch;
    store.counter = EntryId::MAX_COUNTER - 1;
    h.ns = Some(Namespace::from_store(store, opts, h.t.clone()).unwrap());
    let a = h.create(ROOT, "a").await;
    let b = h.create(ROOT, "b").await;
    let d = h.mkdir(ROOT, "d").await;
    assert_eq!((a.id.epoch, a.id.counter), (epoch, EntryId::MAX_COUNTER));
    assert_eq!((b.id.epoch, b.id.counter), (epoch + 1, 1));
    assert_eq!((d.id.epoch, d.id.counter), (epoch + 1, 2));
    for x in [&a, &b, &d] {
        assert!(x.id.has_exact_ino(), "{}", x.id);
    }
    // The moved-on epoch was committed with the ids: the next start is beyond it.
    h.reopen();
    assert_eq!(h.ns().epoch(), epoch + 2);
    let e = h.create(ROOT, "e").await;
    assert_eq!((e.id.epoch, e.id.counter), (epoch + 2, 1));
}

#[tokio::test]
async fn access_times_follow_relatime_and_strictatime() {
    let h = H::new().await;
    let f = h.create(ROOT, "f").await; // atime = mtime = ctime = the clock
    let touch = |at: i64, strict: bool| Request::TouchAtime { id: f.id, at: ts(at), strict };
    let atime = |r: Reply| match r {
        Reply::Entry(a) => a.atime.sec,
        r => panic!("{r:?}"),
    };
    let t0 = f.atime.sec;
    // relatime: an access time not newer than mtime/ctime moves; then it is newer and stays.
    assert_eq!(atime(h.ok(touch(t0 + 10, false)).await), t0 + 10);
    assert_eq!(atime(h.ok(touch(t0 + 20, false)).await), t0 + 10);
    // ... until it is a day old.
    assert_eq!(atime(h.ok(touch(t0 + 10 + 86_400, false)).await), t0 + 10 + 86_400);
    // strictatime: every read, never backwards; the change time stays.
    assert_eq!(atime(h.ok(touch(t0 + 86_500, true)).await), t0 + 86_500);
    assert_eq!(atime(h.ok(touch(t0 + 5, true)).await), t0 + 86_500);
    let a = h.attr(f.id).await;
    assert_eq!((a.atime.sec, a.ctime), (t0 + 86_500, f.ctime));
    assert_eq!(
        h.code(Request::TouchAtime { id: EntryId { node: 1, epoch: 1, counter: 999 }, at: ts(1), strict: true }).await,
        ErrorCode::NotFound
    );
}

#[tokio::test]
async fn sync_false_store_works_and_persists() {
    let mut h = H::with(FakeTargets::with_targets(2), false).await;
    let f = h.create(ROOT, "f").await;
    h.reopen();
    assert_eq!(h.attr(f.id).await, f);
}

#[tokio::test]
async fn meta_stat_ping_and_foreign_requests() {
    let h = H::new().await;
    h.create(ROOT, "f").await;
    h.mkdir(ROOT, "d").await;
    match h.ok(Request::MetaStat).await {
        Reply::MetaStat { files, dirs, capacity } => {
            assert_eq!((files, dirs), (1, 2));
            assert!(capacity.total_bytes > 0 && capacity.free_bytes <= capacity.total_bytes);
        }
        r => panic!("{r:?}"),
    }
    assert_eq!(h.ok(Request::Ping).await, Reply::Pong { node_type: hivefs_types::NodeType::Meta, node: NodeId(1) });
    let e = h.call(Request::UnlinkChunk { target: TargetId(1), entry: ROOT }).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::NotSupported);
    assert!(e.message.contains("UnlinkChunk") && e.message.contains("metadata node"), "{e}");
    assert_eq!(h.code(Request::ListTargets).await, ErrorCode::NotSupported);
}

#[tokio::test]
async fn a_batch_isolates_failing_operations() {
    // Many concurrent creates of partly equal names land in shared batches:
    // each name is created exactly once, every loser gets Exists.
    let h = Arc::new(H::new().await);
    let mut tasks = Vec::new();
    for i in 0..64 {
        let h = h.clone();
        tasks.push(tokio::spawn(async move { h.call(create_req(ROOT, &format!("n{}", i % 16), true)).await }));
    }
    let mut ok = 0;
    for t in tasks {
        match t.await.unwrap() {
            Ok(_) => ok += 1,
            Err(e) => assert_eq!(e.code, ErrorCode::Exists),
        }
    }
    assert_eq!(ok, 16);
    assert_eq!(h.readdir_all(ROOT, 100).await.len(), 16);
    assert_eq!(h.ns().counts().unwrap(), (16, 1));
    let st = h.ns().writer_stats();
    let (b, m) = (st.batches.load(Ordering::Relaxed), st.mutations.load(Ordering::Relaxed));
    assert!(m >= 65 && b <= m, "{b} batches for {m} mutations");
}

impl Namespace {
    fn opens_for_test_inc(&self, id: EntryId) {
        self.open_file(id).unwrap();
    }
    fn opens_for_test_dec(&self, id: EntryId) {
        // Decrement without the release path's disposal check (simulates the race).
        let mut m = self.opens.state.lock().unwrap();
        m.counts.remove(&id);
    }
}

// ------------------------------------------------------ benchmark

/// Group commit benchmark: 10,000 creates with 1 and with 32 concurrent
/// callers, with and without fsync. Run with
/// `cargo test -p hivefs-meta --release -- --ignored --nocapture bench_group_commit`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn bench_group_commit() {
    const N: usize = 10_000;
    for sync in [true, false] {
        for callers in [1usize, 32] {
            let h = Arc::new(H::with(FakeTargets::with_targets(4), sync).await);
            let start = std::time::Instant::now();
            let mut tasks = Vec::new();
            for c in 0..callers {
                let h = h.clone();
                tasks.push(tokio::spawn(async move {
                    for i in (c..N).step_by(callers) {
                        h.create(ROOT, &format!("f{i:06}")).await;
                    }
                }));
            }
            for t in tasks {
                t.await.unwrap();
            }
            let secs = start.elapsed().as_secs_f64();
            let st = h.ns().writer_stats();
            let (b, m) = (st.batches.load(Ordering::Relaxed), st.mutations.load(Ordering::Relaxed));
            println!(
                "sync={sync} callers={callers}: {N} creates in {secs:.2} s = {:.0} creates/s, {b} commits, {:.1} ops/commit",
                N as f64 / secs,
                m as f64 / b as f64
            );
        }
    }
}

// --------------------------------------------- start() against fake mgmtd

mod service {
    use super::*;
    use crate::{start, Config, MetaError};
    use hivefs_net::{call_once, serve, ClientConfig, Handler, Peer, ServerConfig};
    use hivefs_proto::{NodeInfo, Reachability, TargetInfo};
    use hivefs_types::ids::NodeType;

    /// Plays mgmtd (one meta node, one storage target whose node is this
    /// same server) and the storage node (records UnlinkChunk).
    #[derive(Default)]
    struct FakeCluster {
        addr: Mutex<String>,
        unlinked: Mutex<Vec<(TargetId, EntryId)>>,
        heartbeats: AtomicU32,
    }

    impl Handler for FakeCluster {
        async fn handle(
            &self,
            _env: hivefs_proto::Envelope,
            req: Request,
            _p: Vec<u8>,
            _peer: &Peer,
        ) -> (Response, Vec<u8>) {
            let addr = self.addr.lock().unwrap().clone();
            let r = match req {
                Request::RegisterNode { node_type: NodeType::Meta, .. } => {
                    Ok(Reply::NodeRegistered { node: NodeId(3) })
                }
                Request::GetRootOwner => Ok(Reply::RootOwner(Some(NodeId(3)))),
                Request::Heartbeat { meta, .. } => {
                    assert!(meta.is_some_and(|c| c.total_bytes > 0));
                    self.heartbeats.fetch_add(1, Ordering::SeqCst);
                    Ok(Reply::Ok)
                }
                Request::ListNodes { .. } => Ok(Reply::Nodes(vec![NodeInfo {
                    id: NodeId(9),
                    node_type: NodeType::Storage,
                    addr,
                    hostname: "h".into(),
                    last_seen_ms: 0,
                    reachability: Reachability::Online,
                    capacity: None,
                }])),
                Request::ListTargets => Ok(Reply::Targets(vec![TargetInfo {
                    id: TargetId(21),
                    node: NodeId(9),
                    pool: PoolId::DEFAULT,
                    capacity: Default::default(),
                    last_seen_ms: 0,
                    reachability: Reachability::Online,
                    capacity_pool: hivefs_proto::CapacityPool::Normal,
                }])),
                Request::ListPools => Ok(Reply::Pools(vec![hivefs_proto::PoolInfo {
                    id: PoolId::DEFAULT,
                    name: "default".into(),
                    targets: vec![TargetId(21)],
                }])),
                Request::ListGroups { .. } => Ok(Reply::Groups(vec![])),
                Request::UnlinkChunk { target, entry } => {
                    self.unlinked.lock().unwrap().push((target, entry));
                    Ok(Reply::Ok)
                }
                Request::UnlinkChunks { target, entries } => {
                    self.unlinked.lock().unwrap().extend(entries.into_iter().map(|e| (target, e)));
                    Ok(Reply::Ok)
                }
                other => Err(fs_err!(NotSupported, "fake cluster: {other:?}")),
            };
            (r, Vec::new())
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn start_serves_registers_heartbeats_and_restarts() {
        let fake = Arc::new(FakeCluster::default());
        let srv = serve("127.0.0.1:0", ServerConfig::new(NodeType::Mgmt, None), fake.clone()).await.unwrap();
        *fake.addr.lock().unwrap() = srv.local_addr.to_string();
        let dir = tempfile::tempdir().unwrap();
        let cfg = Config {
            dir: dir.path().to_path_buf(),
            listen: "127.0.0.1:0".into(),
            mgmtd: srv.local_addr.to_string(),
            heartbeat_interval_ms: 50,
            target_refresh_ms: 100,
            ..Config::default()
        };
        let svc = start(cfg.clone()).await.unwrap();
        assert_eq!(svc.node_id, NodeId(3));
        let addr = svc.local_addr.to_string();
        let cc = ClientConfig::new(None);
        let f = match call_once(&addr, &cc, &create_req(ROOT, "f", true)).await.unwrap() {
            Reply::Entry(a) => a,
            r => panic!("{r:?}"),
        };
        assert_eq!(f.pattern.unwrap().targets(), vec![TargetId(21)]);
        assert_eq!(f.owner, NodeId(3));
        // A second service on the same data dir is refused, naming the store.
        let e = start(cfg.clone()).await.err().expect("data dir in use");
        assert!(matches!(e, MetaError::Store(_)) && e.to_string().contains("meta.redb"), "{e}");
        // Unlink of a written file: the chunk file is deleted on the target's node.
        call_once(&addr, &cc, &Request::Open { id: f.id, write: true }).await.unwrap();
        call_once(&addr, &cc, &Request::Release { id: f.id, write: true }).await.unwrap();
        call_once(&addr, &cc, &unlink(ROOT, "f")).await.unwrap();
        for _ in 0..200 {
            if !fake.unlinked.lock().unwrap().is_empty() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        assert_eq!(*fake.unlinked.lock().unwrap(), vec![(TargetId(21), f.id)]);
        for _ in 0..250 {
            if fake.heartbeats.load(Ordering::SeqCst) >= 2 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        assert!(fake.heartbeats.load(Ordering::SeqCst) >= 2, "heartbeats repeat");
        let d =
            match call_once(&addr, &cc, &Request::Mkdir { parent: ROOT, name: b"d".to_vec(), mode: 0o700, caller: ME })
                .await
                .unwrap()
            {
                Reply::Entry(a) => a,
                r => panic!("{r:?}"),
            };
        svc.stop().await;
        // Restart on the same data dir: same node id, same namespace.
        let svc = start(Config { listen: "127.0.0.1:0".into(), ..cfg.clone() }).await.unwrap();
        assert_eq!(svc.node_id, NodeId(3));
        let addr2 = svc.local_addr.to_string();
        match call_once(&addr2, &cc, &Request::Lookup { parent: ROOT, name: b"d".to_vec() }).await.unwrap() {
            Reply::Entry(a) => assert_eq!(a.id, d.id),
            r => panic!("{r:?}"),
        }
        // The port is taken: the error names the address.
        let e =
            start(Config { listen: addr2.clone(), dir: dir.path().join("other"), ..cfg.clone() }).await.err().unwrap();
        assert!(e.to_string().contains(&addr2), "{e}");
        // A wildcard address without `advertise` would register an address no peer reaches.
        let e = start(Config { listen: "0.0.0.0:0".into(), dir: dir.path().join("wild"), ..cfg }).await.err().unwrap();
        assert!(e.to_string().contains("advertise"), "{e}");
        svc.stop().await;
        srv.abort();
    }

    #[test]
    fn config_defaults_and_unknown_keys() {
        let c: Config = toml::from_str("dir = \"/tmp/x\"\nsync = false").unwrap();
        assert_eq!((c.listen.as_str(), c.mgmtd.as_str(), c.sync), ("127.0.0.1:8005", "127.0.0.1:8008", false));
        assert_eq!((c.heartbeat_interval_ms, c.target_refresh_ms), (1000, 2000));
        assert!(toml::from_str::<Config>("lisen = \"x\"").is_err());
        assert_eq!(c.checkpoint_bytes, 16 << 20);
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("meta.toml");
        std::fs::write(&f, "checkpoint_bytes = 4096\n").unwrap();
        let e = Config::load(&f).unwrap_err().to_string();
        assert!(e.contains("checkpoint_bytes = 4096 is below the least allowed, 65536"), "{e}");
        std::fs::write(&f, "checkpoint_bytes = 65536\n").unwrap();
        assert_eq!(Config::load(&f).unwrap().checkpoint_bytes, 65536);
        // Worker threads: one per two cores by default, at least one; or as set.
        let cores = std::thread::available_parallelism().unwrap().get();
        assert_eq!(c.workers, 0);
        assert_eq!(c.worker_threads(), (cores / 2).max(1));
        std::fs::write(&f, "workers = 3\n").unwrap();
        assert_eq!(Config::load(&f).unwrap().worker_threads(), 3);
    }
}

// ------------------------------------------------------------ kill -9

const KILL9_DIR: &str = "HIVEFS_META_KILL9_DIR";
const KILL9_SYNC: &str = "HIVEFS_META_KILL9_SYNC";

/// Child half of `kill9_loses_no_acknowledged_mutation`: creates files from
/// 8 concurrent callers and prints each one after its acknowledgement,
/// until it is killed. Does nothing when run on its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn kill9_child() {
    let Ok(dir) = std::env::var(KILL9_DIR) else { return };
    let sync = std::env::var(KILL9_SYNC).as_deref() == Ok("1");
    let clock = Arc::new(AtomicI64::new(1));
    let ns = Arc::new(open_ns(std::path::Path::new(&dir), FakeTargets::with_targets(4), clock, sync));
    ns.ensure_root().await.unwrap();
    let mut tasks = Vec::new();
    for w in 0..8 {
        let ns = ns.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..1_000_000u32 {
                let name = format!("w{w}-{i}");
                ns.handle(create_req(ROOT, &name, true)).await.unwrap();
                use std::io::Write;
                let mut out = std::io::stdout().lock();
                writeln!(out, "ACK {name}").unwrap();
                out.flush().unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

/// An acknowledged create survives `kill -9` of the server process, with
/// `sync = true` and with `sync = false` (no fsync, but every commit is in
/// the kernel before the acknowledgement).
#[test]
fn kill9_loses_no_acknowledged_mutation() {
    use std::io::BufRead;
    for sync in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "tests::kill9_child", "--ignored", "--nocapture", "--test-threads=1"])
            .env(KILL9_DIR, dir.path())
            .env(KILL9_SYNC, if sync { "1" } else { "0" })
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
        let mut acked = Vec::new();
        // Kill it in full flight, after a good number of acknowledgements.
        for line in lines.by_ref() {
            if let Some(name) = line.unwrap().strip_prefix("ACK ") {
                acked.push(name.to_string());
                if acked.len() == 3000 {
                    child.kill().unwrap(); // SIGKILL
                    break;
                }
            }
        }
        // Acknowledgements printed before the kill are still in the pipe.
        for line in lines {
            match line {
                Ok(l) => acked.extend(l.strip_prefix("ACK ").map(str::to_string)),
                Err(_) => break,
            }
        }
        child.wait().unwrap();
        assert!(acked.len() >= 3000, "child acknowledged only {}", acked.len());
        let ns = open_ns(dir.path(), FakeTargets::with_targets(4), Arc::new(AtomicI64::new(2)), sync);
        let names: HashSet<Vec<u8>> = ns
            .read(|t| scan_children(&t.dentries, ROOT, None)?.map(|r| r.map(|(n, _)| n)).collect::<Result<_, _>>())
            .unwrap();
        let lost: Vec<&String> = acked.iter().filter(|n| !names.contains(n.as_bytes())).collect();
        assert!(
            lost.is_empty(),
            "sync={sync}: {} of {} acknowledged creates lost, e.g. {:?}",
            lost.len(),
            acked.len(),
            &lost[..lost.len().min(5)]
        );
        assert_eq!(
            ns.counts().unwrap().0,
            names.len() as u64,
            "sync={sync}: the file counter commits with the creates"
        );
    }
}

// ------------------------------------------------------------- retries

/// A request as it arrives: with its envelope.
#[derive(Clone, Debug)]
struct Sent(Envelope, Request);

impl From<Request> for Sent {
    fn from(r: Request) -> Sent {
        Sent(Envelope::default(), r)
    }
}

fn retryable(client: u64, seq: u64, done_below: u64, r: &Request) -> Sent {
    Sent(
        Envelope { op: Some(hivefs_proto::OpId { client, seq, done_below }), lease_client: None, mirror: None },
        r.clone(),
    )
}

#[tokio::test]
async fn a_repeated_operation_is_applied_once_also_across_a_restart() {
    let mut h = H::new().await;
    let create = retryable(9, 1, 1, &create_req(ROOT, "f", true));
    let first = h.entry(create.clone()).await;
    // The same operation again (the client lost the answer): same answer, no
    // second file, no EEXIST.
    assert_eq!(h.entry(create.clone()).await, first);
    assert_eq!(h.ns().counts().unwrap(), (1, 1));
    h.reopen();
    assert_eq!(h.entry(create.clone()).await, first, "the outcome survives a restart");
    // A repeated unlink answers Ok twice; a new operation with the same
    // request is applied again (it is another operation).
    let rm = retryable(9, 2, 1, &unlink(ROOT, "f"));
    assert_eq!(h.ok(rm.clone()).await, Reply::Ok);
    assert_eq!(h.ok(rm).await, Reply::Ok);
    assert_eq!(h.code(retryable(9, 3, 3, &unlink(ROOT, "f"))).await, ErrorCode::NotFound);
    // A refusal is recorded too, and the same seq of another client is its own.
    let mk = retryable(9, 4, 4, &create_req(ROOT, "g", true));
    h.create(ROOT, "g").await;
    assert_eq!(h.code(mk.clone()).await, ErrorCode::Exists);
    h.ok(unlink(ROOT, "g")).await;
    assert_eq!(h.code(mk).await, ErrorCode::Exists, "a repeat gets the first answer");
    h.entry(retryable(10, 4, 4, &create_req(ROOT, "g", true))).await;
    // Once confirmed (done_below past it), an outcome is forgotten.
    h.ok(retryable(9, 5, 5, &Request::Mkdir { parent: ROOT, name: b"d".to_vec(), mode: 0o755, caller: ME })).await;
    let again = h.entry(retryable(9, 1, 5, &create_req(ROOT, "f", true))).await;
    assert_ne!(again.id, first.id, "a forgotten operation is applied anew");
    // The retired wrappers are refused.
    assert_eq!(h.code(Request::RetiredRetryable).await, ErrorCode::NotSupported);
    assert_eq!(h.code(retryable(9, 6, 6, &Request::RetiredLeasing)).await, ErrorCode::NotSupported);
}

/// A client that polls with `LeaseWaitDirs` gets the names of a directory
/// it made, empty; a repeat of that mkdir (its answer was lost, others may
/// have added names since) does not; renewals come with its changes there,
/// and a client polling with `LeaseWait` gets none.
#[tokio::test]
async fn a_made_directory_is_leased_empty_but_not_on_a_repeat() {
    let h = H::new().await;
    h.ns().leases.set_duration(std::time::Duration::from_millis(300));
    h.ok(Request::LeaseWaitDirs { client: 9, acked: 0, wait_ms: 0 }).await;
    h.ok(Request::LeaseWait { client: 11, acked: 0, wait_ms: 0 }).await;
    let sent = |client: u64, seq: u64, r: Request| {
        Sent(
            Envelope {
                op: Some(hivefs_proto::OpId { client, seq, done_below: seq }),
                lease_client: Some(client),
                mirror: None,
            },
            r,
        )
    };
    let mkdir = |name: &str| Request::Mkdir { parent: ROOT, name: name.into(), mode: 0o755, caller: ME };
    let grants = |r: Reply| match r {
        Reply::DirNames { grants, .. } => grants,
        _ => Vec::new(),
    };
    let first = h.ok(sent(9, 1, mkdir("d"))).await;
    let d = h.lookup(ROOT, "d").await.unwrap();
    let Reply::Entry(d) = d else { panic!("{d:?}") };
    assert!(grants(first).iter().any(|&(dir, ms)| dir == d.id && ms > 0), "the new directory");
    assert!(!grants(h.ok(sent(9, 1, mkdir("d"))).await).iter().any(|&(dir, _)| dir == d.id), "a repeat");
    let g = grants(h.ok(sent(9, 2, create_req(d.id, "f", true))).await);
    assert!(g.iter().any(|&(dir, ms)| dir == d.id && ms > 0), "renewed by a create there: {g:?}");
    assert!(grants(h.ok(sent(11, 1, mkdir("e"))).await).is_empty(), "a client polling without dirs");
}

/// Envelope of lease client `client` without an operation id.
fn leasing(client: u64, r: Request) -> Sent {
    Sent(Envelope { op: None, lease_client: Some(client), mirror: None }, r)
}

/// A directory made by lease client 9 (which holds the lease on its
/// names), and ids with patterns reserved there.
async fn made_ahead_setup(h: &H, n: u32) -> (EntryAttr, Vec<(EntryId, hivefs_types::pattern::Pattern)>) {
    h.ns().leases.set_duration(std::time::Duration::from_secs(2));
    // The first change waits out the leases a previous run may have granted.
    h.mkdir(ROOT, "warm").await;
    h.ok(Request::LeaseWaitDirs { client: 9, acked: 0, wait_ms: 0 }).await;
    h.ok(leasing(9, Request::Mkdir { parent: ROOT, name: b"d".to_vec(), mode: 0o755, caller: ME })).await;
    let Ok(Reply::Entry(d)) = h.lookup(ROOT, "d").await else { panic!("no d") };
    match h.ok(leasing(9, Request::ReserveCreates { parent: d.id, count: n })).await {
        Reply::Reserved { slots, lease_ms } => {
            assert_eq!(slots.len(), n as usize);
            assert!(lease_ms > 0, "the reservation renews the lease on the names");
            (d, slots)
        }
        r => panic!("{r:?}"),
    }
}

fn new_file(name: &str, slot: &(EntryId, hivefs_types::pattern::Pattern), at: i64) -> hivefs_proto::NewFile {
    hivefs_proto::NewFile {
        name: name.into(),
        id: slot.0,
        pattern: slot.1.clone(),
        mode: 0o640,
        caller: ME,
        at: ts(at),
    }
}

/// Per file the leases (attributes, name) granted, and the files refused.
type MadeMany = (Vec<(u32, u32)>, Vec<(u32, ErrorCode)>);

fn made_many(r: Reply) -> MadeMany {
    match r {
        Reply::WithParent { reply, .. } => made_many(*reply),
        Reply::CreatedMany { leases, failed, .. } => (leases, failed.into_iter().map(|(k, e)| (k, e.code)).collect()),
        r => panic!("{r:?}"),
    }
}

/// Files a client made ahead land under the ids and patterns reserved for
/// them, with the client's times, held open by it; a repeat of the batch
/// changes nothing; ids this node did not hand out, taken ids and patterns
/// the directory could not have chosen are refused file by file; a client
/// without the lease on the names gets no ids.
#[tokio::test]
async fn files_made_ahead_land_under_their_reserved_ids_once() {
    let h = H::new().await;
    let (d, slots) = made_ahead_setup(&h, 8).await;
    let files: Vec<_> = (0..3).map(|i| new_file(&format!("f{i}"), &slots[i], 990)).collect();
    let batch = Request::CreateMany { parent: d.id, files: files.clone() };
    let (leases, failed) = made_many(h.ok(leasing(9, batch.clone())).await);
    assert!(failed.is_empty(), "{failed:?}");
    assert!(leases.iter().all(|&(a, n)| a > 0 && n > 0), "attributes and names leased: {leases:?}");
    for (i, f) in files.iter().enumerate() {
        // Asked by its maker (others get the size off the chunk files, which hold it).
        let a = match h.call(leasing(9, Request::Lookup { parent: d.id, name: f.name.clone() })).await {
            Ok(Reply::Entry(a) | Reply::Leased { attr: a, .. }) => a,
            r => panic!("f{i}: {r:?}"),
        };
        assert_eq!((a.id, a.pattern.as_ref(), a.mode, a.uid, a.ctime), (f.id, Some(&f.pattern), 0o640, 1000, ts(990)));
        assert!(h.ns().opens.is_open(a.id), "held open by its maker");
    }
    // A repeat (its answer lost): nothing new, nothing refused.
    let (_, failed) = made_many(h.ok(leasing(9, batch)).await);
    assert!(failed.is_empty(), "{failed:?}");
    assert_eq!(h.readdir_all(d.id, 100).await.len(), 3);
    // Refused one by one: an id never handed out, a taken id under a new
    // name, a pattern with another chunk size; the good one lands.
    let mut unminted = new_file("u", &slots[3], 990);
    unminted.id.counter += 1_000_000;
    let taken = new_file("t", &slots[0], 990);
    let mut wide = new_file("w", &slots[4], 990);
    wide.pattern = hivefs_types::pattern::Pattern::new(
        wide.pattern.kind(),
        wide.pattern.chunk_size() * 2,
        wide.pattern.targets().to_vec(),
    )
    .unwrap();
    let good = new_file("g", &slots[5], 990);
    let (_, failed) = made_many(
        h.ok(leasing(9, Request::CreateMany { parent: d.id, files: vec![unminted, taken, wide, good] })).await,
    );
    assert_eq!(failed, vec![(0, ErrorCode::Invalid), (1, ErrorCode::Exists), (2, ErrorCode::Invalid)]);
    assert!(h.call(leasing(9, Request::Lookup { parent: d.id, name: b"g".to_vec() })).await.is_ok());
    // Another client holds no lease on the names there.
    h.ok(Request::LeaseWaitDirs { client: 11, acked: 0, wait_ms: 0 }).await;
    assert_eq!(h.code(leasing(11, Request::ReserveCreates { parent: d.id, count: 4 })).await, ErrorCode::Busy);
}

/// Another client's look at a directory where a client makes files ahead
/// waits until that client gave back its lease on the names, which it does
/// after its files landed: the look sees them.
#[tokio::test]
async fn another_clients_look_waits_for_the_files_made_ahead() {
    let h = H::new().await;
    let (d, slots) = made_ahead_setup(&h, 2).await;
    let look = h.call(leasing(11, Request::ReadDir { dir: d.id, after: None, max: 100 }));
    tokio::pin!(look);
    assert!(
        tokio::time::timeout(std::time::Duration::from_millis(200), &mut look).await.is_err(),
        "the look waits for the lease holder"
    );
    let upto = match h.ok(Request::LeaseWaitDirs { client: 9, acked: 0, wait_ms: 0 }).await {
        Reply::Revoked { ids, upto, .. } => {
            assert!(ids.contains(&d.id), "the names of d recalled: {ids:?}");
            upto
        }
        r => panic!("{r:?}"),
    };
    let batch = Request::CreateMany { parent: d.id, files: vec![new_file("x", &slots[0], 1000)] };
    assert!(made_many(h.ok(leasing(9, batch)).await).1.is_empty());
    h.ok(Request::LeaseWaitDirs { client: 9, acked: upto, wait_ms: 0 }).await;
    match look.await.unwrap() {
        Reply::DirPage { entries, .. } => {
            assert_eq!(entries.iter().map(|e| e.name.as_slice()).collect::<Vec<_>>(), vec![b"x".as_slice()])
        }
        r => panic!("{r:?}"),
    }
    // The lease went back: no more ids for client 9 there.
    assert_eq!(h.code(leasing(9, Request::ReserveCreates { parent: d.id, count: 4 })).await, ErrorCode::Busy);
}
