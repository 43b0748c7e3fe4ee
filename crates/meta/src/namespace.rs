//! The namespace of one metadata target, as a service without network.
//!
//! Owns the store, the writer (group commit), the in-memory open counts and
//! the request dispatch: reads run in their own read transactions,
//! concurrently with the writer; mutations go through the writer; truncation
//! talks to the storage targets before the size is committed. It must not
//! know about sockets, mgmtd or configuration files (that is `lib.rs`), so
//! tests drive it directly with a fake [`DataTargets`].

use crate::ops::{check_truncatable, load_inode, Mutation, OpError, ReadTables};
use crate::store::{sys, sys_get, Store, StoreError, SYSTEM};
use crate::targets::DataTargets;
use crate::writer::{run_batch, system_clock, Clock, StoreFailure, Writer, WriterState, WriterStats};
use hivefs_cluster::capacity_of;
use hivefs_proto::{decode_body, Caller, OpId, Reply, Request, Response};
use hivefs_types::attr::{EntryAttr, FileKind, SetAttr};
use hivefs_types::error::{FsError, FsResult};
use hivefs_types::fs_err;
use hivefs_types::ids::{EntryId, NodeId, NodeType};
use hivefs_types::pattern::Pattern;
use rand::rngs::StdRng;
use rand::SeedableRng;
use redb::ReadableDatabase;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;

/// File name of the store inside the data dir.
pub const DB_FILE: &str = "meta.redb";

/// How a namespace is opened.
#[derive(Clone)]
pub struct NamespaceOptions {
    /// Data dir: holds [`DB_FILE`]; its file system's space is reported by MetaStat.
    pub dir: PathBuf,
    /// fsync before acknowledging (see `store::SwitchableSyncBackend`).
    pub sync: bool,
    /// This node's id: part of minted EntryIds and of every EntryAttr.
    pub node: NodeId,
    /// Seed of the choosers' randomness; `None` draws one from the OS.
    pub seed: Option<u64>,
    /// Time source; `None` is the system clock.
    pub clock: Option<Clock>,
    /// Operations that add to the namespace are refused with `NoSpace` while
    /// the data dir's file system has less free space than this (removals
    /// still work, so space can be freed); 0 turns the check off.
    pub min_free_bytes: u64,
}

/// Open handles per entry, counted from Open/Release requests. In memory
/// only: after a restart nothing is open, which is why open-unlinked
/// entries are finished at start.
#[derive(Default)]
pub struct Opens(pub(crate) Mutex<HashMap<EntryId, u32>>);

impl Opens {
    pub fn is_open(&self, id: EntryId) -> bool {
        self.0.lock().expect("opens lock").contains_key(&id)
    }
    fn inc(&self, id: EntryId) {
        *self.0.lock().expect("opens lock").entry(id).or_insert(0) += 1;
    }
    /// Returns true when the last handle went away.
    fn dec(&self, id: EntryId) -> bool {
        let mut m = self.0.lock().expect("opens lock");
        match m.get_mut(&id) {
            Some(c) if *c > 1 => {
                *c -= 1;
                false
            }
            Some(_) => {
                m.remove(&id);
                true
            }
            None => false,
        }
    }
}

pub struct Namespace {
    // Field order matters: the writer (and its thread) goes before the database handle.
    writer: Writer,
    db: Arc<redb::Database>,
    node: NodeId,
    epoch: u32,
    dir: PathBuf,
    pub(crate) opens: Arc<Opens>,
    /// Global file locks (in memory; see `locks`).
    pub(crate) locks: Arc<crate::locks::LockTable>,
    pub(crate) targets: Arc<dyn DataTargets>,
    pub(crate) disposal_wakeup: Arc<Notify>,
    failed: Arc<StoreFailure>,
    /// Directories on other metadata nodes and cross-node operations.
    pub(crate) multi: crate::multi::Multi,
    /// Clients' attribute leases (in memory; see `leases`).
    pub leases: crate::leases::Leases,
}

tokio::task_local! {
    /// The client whose `Leasing` request is being answered: its own leases
    /// are not revoked by its changes (see `leases`).
    static REQUESTER: crate::leases::Requester;
}

fn store_err(e: OpError) -> FsError {
    match e {
        OpError::Fs(e) => e,
        OpError::Fatal(m) => fs_err!(Io, "metadata store failure: {m}"),
    }
}

impl Namespace {
    /// Opens the store in `opts.dir` and starts the writer.
    pub fn open(opts: NamespaceOptions, targets: Arc<dyn DataTargets>) -> Result<Namespace, StoreError> {
        let store = Store::open(&opts.dir.join(DB_FILE), opts.sync)?;
        Self::from_store(store, opts, targets)
    }

    /// Starts the writer over an opened store. Entries unlinked while open in
    /// an earlier run are finished first (nothing is open now).
    pub fn from_store(
        store: Store,
        opts: NamespaceOptions,
        targets: Arc<dyn DataTargets>,
    ) -> Result<Namespace, StoreError> {
        let db = Arc::new(store.db);
        let opens = Arc::new(Opens::default());
        let disposal_wakeup = Arc::new(Notify::new());
        let failed = Arc::new(StoreFailure::default());
        let is_open = {
            let o = opens.clone();
            Arc::new(move |id| o.is_open(id))
        };
        let mut state = WriterState {
            node: opts.node,
            epoch: store.epoch,
            epoch_saved: store.epoch,
            counter: store.counter,
            targets: targets.clone(),
            rr: 0,
            rng: match opts.seed {
                Some(s) => StdRng::seed_from_u64(s),
                None => StdRng::from_entropy(),
            },
            is_open,
            clock: opts.clock.unwrap_or_else(system_clock),
            disposal_wakeup: disposal_wakeup.clone(),
            reply_sweep: (Vec::new(), 0),
            space_reserve: (opts.min_free_bytes > 0).then(|| (opts.dir.clone(), opts.min_free_bytes)),
            failed: failed.clone(),
            low_space: None,
        };
        if let Some((Err(e), _)) = run_batch(&db, &mut state, vec![(Mutation::RecoverOrphans, None)]).pop() {
            return Err(StoreError::Db { path: store.path, message: format!("recovering open-unlinked entries: {e}") });
        }
        let writer =
            Writer::spawn(db.clone(), state).map_err(|source| StoreError::Io { path: store.path.clone(), source })?;
        Ok(Namespace {
            writer,
            db,
            node: opts.node,
            epoch: store.epoch,
            dir: opts.dir,
            opens,
            locks: Arc::default(),
            targets,
            disposal_wakeup,
            failed,
            multi: crate::multi::Multi::default(),
            leases: Default::default(),
        })
    }

    /// Resolves when the store can no longer commit (an I/O error left the
    /// database needing the repair it gets when it is opened again): the
    /// service should exit and be restarted.
    pub async fn store_failed(&self) {
        self.failed.wait().await
    }

    pub fn node(&self) -> NodeId {
        self.node
    }

    /// Boot epoch of this run (part of every EntryId minted now).
    pub fn epoch(&self) -> u32 {
        self.epoch
    }

    pub fn writer_stats(&self) -> &WriterStats {
        &self.writer.stats
    }

    /// Stops the writer after its current batch and closes the store.
    pub fn close(mut self) {
        self.writer.shutdown();
    }

    pub(crate) async fn submit(&self, m: Mutation) -> FsResult<Reply> {
        self.submit_op(None, m).await
    }

    /// Like `submit`, for the operation `op` of a client that may retry it:
    /// applied at most once (see `replies`). Answers only after the other
    /// clients caching attributes it changed have dropped them.
    pub(crate) async fn submit_op(&self, op: Option<OpId>, m: Mutation) -> FsResult<Reply> {
        let (r, touched) = self.writer.submit((m, op)).await?;
        if !touched.is_empty() {
            self.leases.revoke(&touched, REQUESTER.try_with(|c| *c).ok()).await;
        }
        r
    }

    pub(crate) fn read<T>(&self, f: impl FnOnce(&ReadTables) -> Result<T, OpError>) -> FsResult<T> {
        let txn = self.db.begin_read().map_err(|e| fs_err!(Io, "metadata store failure: {e}"))?;
        let t = ReadTables::open(&txn).map_err(store_err)?;
        f(&t).map_err(store_err)
    }

    /// The recorded outcome of client operation `op`, if it was applied.
    pub(crate) fn recorded_reply(&self, op: &OpId) -> FsResult<Option<Response>> {
        let txn = self.db.begin_read().map_err(|e| fs_err!(Io, "metadata store failure: {e}"))?;
        let t = match txn.open_table(crate::replies::REPLIES) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
            Err(e) => return Err(fs_err!(Io, "metadata store failure: {e}")),
        };
        crate::replies::get(&t, op).map_err(|m| fs_err!(Io, "metadata store failure: {m}"))
    }

    async fn entry(&self, m: Mutation) -> FsResult<EntryAttr> {
        match self.submit(m).await? {
            Reply::Entry(a) => Ok(a),
            r => Err(fs_err!(Internal, "writer answered {r:?} where an entry was expected")),
        }
    }

    /// Creates the root directory if this node is the root owner and it is missing.
    pub async fn ensure_root(&self) -> FsResult<EntryAttr> {
        self.entry(Mutation::CreateRoot).await
    }

    // ------------------------------------------------------------ reads

    pub fn lookup(&self, parent: EntryId, name: &[u8]) -> FsResult<EntryAttr> {
        self.read(|t| t.lookup(parent, name, self.node))
    }

    pub fn getattr(&self, id: EntryId) -> FsResult<EntryAttr> {
        self.read(|t| t.getattr(id, self.node))
    }

    pub fn readdir(&self, dir: EntryId, after: Option<&[u8]>, max: u32) -> FsResult<Reply> {
        let (entries, more) = self.read(|t| t.readdir(dir, after, max))?;
        Ok(Reply::DirPage { entries, more })
    }

    pub fn readlink(&self, id: EntryId) -> FsResult<Vec<u8>> {
        self.read(|t| t.readlink(id))
    }

    pub fn getxattr(&self, id: EntryId, name: &[u8]) -> FsResult<Vec<u8>> {
        self.read(|t| t.getxattr(id, name))
    }

    pub fn listxattr(&self, id: EntryId) -> FsResult<Vec<Vec<u8>>> {
        self.read(|t| t.listxattr(id))
    }

    /// `(files, dirs)` counted by this node.
    pub fn counts(&self) -> FsResult<(u64, u64)> {
        let txn = self.db.begin_read().map_err(|e| fs_err!(Io, "metadata store failure: {e}"))?;
        let t = txn.open_table(SYSTEM).map_err(|e| fs_err!(Io, "metadata store failure: {e}"))?;
        let get = |k| sys_get(&t, k).map_err(|e| fs_err!(Io, "metadata store failure: {e}"));
        Ok((get(sys::FILES)?, get(sys::DIRS)?))
    }

    pub fn meta_stat(&self) -> FsResult<Reply> {
        let (files, dirs) = self.counts()?;
        let capacity =
            capacity_of(&self.dir).map_err(|e| fs_err!(Io, "statvfs of metadata dir {}: {e}", self.dir.display()))?;
        Ok(Reply::MetaStat { files, dirs, capacity })
    }

    // ------------------------------------------------------ open/release

    /// Counts an open handle and returns fresh attributes (with the pattern).
    pub fn open_file(&self, id: EntryId) -> FsResult<EntryAttr> {
        // Counted before reading: the disposal task never deletes the chunks of
        // an entry that is counted open, and an unlink that commits after this
        // read parks the entry instead of dropping it.
        self.opens.inc(id);
        let r = self.getattr(id);
        if r.is_err() {
            self.opens.dec(id);
        }
        r
    }

    /// Creates a regular file (or finds it, without `excl`) and counts an
    /// open handle on it. A repeat of an operation already answered gets the
    /// first answer without counting again; a node restart forgets the count
    /// as it forgets every open.
    async fn create_open(
        &self,
        parent: EntryId,
        name: Vec<u8>,
        mode: u32,
        excl: bool,
        caller: Caller,
        op: Option<OpId>,
    ) -> FsResult<Reply> {
        if let Some(first) = op.as_ref().map(|op| self.recorded_reply(op)).transpose()?.flatten() {
            return first;
        }
        self.targets.refresh_if_empty().await;
        let kind = FileKind::File;
        let m = Mutation::Create { parent, name, kind, mode, rdev: 0, excl, uid: caller.uid, gid: caller.gid };
        let r = self.submit_op(op, m).await?;
        match &r {
            Reply::Entry(a) if a.kind == FileKind::File => self.opens.inc(a.id),
            Reply::Entry(a) => {
                return Err(fs_err!(IsDir, "{} is not a regular file and cannot be opened by a create", a.id))
            }
            _ => {}
        }
        Ok(r)
    }

    pub async fn release(&self, id: EntryId) -> FsResult<()> {
        if !self.opens.dec(id) {
            return Ok(());
        }
        // Most released files were not unlinked: look before queueing a write.
        if self.read(|t| t.disposal(id))?.is_some() {
            self.submit(Mutation::ReleaseOrphan { id }).await?;
        }
        Ok(())
    }

    // -------------------------------------------------------- setattr

    /// Changes attributes. A size change first truncates (or extends) the
    /// chunk file on every stripe target, then commits the new size.
    pub async fn set_attr(&self, id: EntryId, attr: SetAttr, op: Option<OpId>) -> FsResult<EntryAttr> {
        if let Some(size) = attr.size {
            let i = self
                .read(|t| load_inode(&t.inodes, id))?
                .ok_or_else(|| fs_err!(NotFound, "entry {id} not found on this metadata node"))?;
            check_truncatable(id, &i)?;
            if let Some(p) = &i.pattern {
                self.truncate_chunks(id, p, size).await?;
            }
        }
        match self.submit_op(op, Mutation::SetAttr { id, attr }).await? {
            Reply::Entry(a) => Ok(a),
            r => Err(fs_err!(Internal, "writer answered {r:?} where an entry was expected")),
        }
    }

    async fn truncate_chunks(&self, id: EntryId, p: &Pattern, size: u64) -> FsResult<()> {
        let mut set = tokio::task::JoinSet::new();
        for (idx, &target) in p.targets().iter().enumerate() {
            let len = p.chunk_file_len(size, idx);
            let fut = self.targets.truncate_chunk(target, id, len);
            set.spawn(async move {
                fut.await.map_err(|e| {
                    FsError::new(e.code, format!("truncating {id} to {size} bytes: target {target}: {}", e.message))
                })
            });
        }
        let mut first_err = None;
        while let Some(r) = set.join_next().await {
            let r = r.unwrap_or_else(|e| Err(fs_err!(Internal, "truncate task of {id} failed: {e}")));
            if let (Err(e), None) = (r, &first_err) {
                first_err = Some(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    // -------------------------------------------------------- dispatch

    /// Answers one request.
    pub async fn handle(&self, req: Request) -> Response {
        match req {
            Request::Leasing { client, req, .. } => match decode_body::<Request>(&req) {
                Ok(Request::Leasing { .. }) => Err(fs_err!(Invalid, "a leasing request may not wrap another")),
                Ok(inner) => self.handle_leasing(client, inner).await,
                Err(e) => Err(fs_err!(Protocol, "malformed leasing request: {e}")),
            },
            Request::LeaseWait { client, acked, wait_ms } => {
                Ok(self.leases.wait(client, acked, Duration::from_millis(wait_ms.into())).await)
            }
            req => self.handle_unleased(req, None).await,
        }
    }

    /// A request of a client that takes leases: answered as usual, then an
    /// entry's attributes (a non-directory stored here) and the name it was
    /// looked up or created by (stored here) are leased to the client.
    async fn handle_leasing(&self, client: u64, inner: Request) -> Response {
        use crate::leases::LeaseKey;
        let since = self.leases.mark();
        // A repeat's recorded answer may be older than the mark: no lease on
        // it. Only operations answered with an entry need that look (a read).
        let (fresh, unwrapped) = match &inner {
            Request::Retryable { op, req } => {
                let r = decode_body::<Request>(req).ok();
                let no_entry = matches!(
                    r,
                    Some(
                        Request::Unlink { .. }
                            | Request::Rmdir { .. }
                            | Request::Rename { .. }
                            | Request::RenameTo { .. }
                            | Request::SetXattr { .. }
                            | Request::RemoveXattr { .. }
                    )
                );
                (no_entry || self.recorded_reply(op)?.is_none(), r)
            }
            _ => (true, None),
        };
        let plain = unwrapped.as_ref().unwrap_or(&inner);
        let name = plain.names().map(|(p, n)| LeaseKey::Name(p, n.into()));
        let changed_dir = plain.changed_dir();
        let me = crate::leases::Requester { client, token: since.token };
        let r =
            self.leased(client, fresh, name, since, REQUESTER.scope(me, self.handle_unleased(inner, unwrapped)).await?);
        // The client keeps a changed directory's attributes for as long as
        // it would cache them anyway (client crate's `dirattrs`): read after
        // the change, so they include it.
        let reply = r?;
        match changed_dir.map(|d| self.getattr(d)) {
            Some(Ok(parent)) if parent.kind == FileKind::Dir => {
                Ok(Reply::WithParent { parent, reply: Box::new(reply) })
            }
            _ => Ok(reply),
        }
    }

    /// Leases what a leasing request's answer `r` carries (see `handle_leasing`).
    fn leased(
        &self,
        client: u64,
        fresh: bool,
        name: Option<crate::leases::LeaseKey>,
        since: crate::leases::Mark,
        r: Reply,
    ) -> Response {
        use crate::leases::LeaseKey;
        match r {
            Reply::Entry(a) if fresh => {
                let lease_ms = if a.kind != FileKind::Dir && a.owner == self.node {
                    self.leases.grant(client, LeaseKey::Attr(a.id), since)
                } else {
                    0
                };
                let name_ms = name.map_or(0, |k| self.leases.grant(client, k, since));
                if lease_ms == 0 && name_ms == 0 {
                    Ok(Reply::Entry(a))
                } else {
                    Ok(Reply::Leased { attr: a, lease_ms, name_ms })
                }
            }
            r => Ok(r),
        }
    }

    /// `body`: a `Retryable` request's body when the caller decoded it already.
    async fn handle_unleased(&self, req: Request, body: Option<Request>) -> Response {
        if let Some(r) = self.forward_moved(&req).await {
            return r;
        }
        match req {
            Request::Retryable { op, req } => match body.map_or_else(|| decode_body::<Request>(&req), Ok) {
                Ok(Request::Retryable { .. }) => Err(fs_err!(Invalid, "a retryable request may not wrap another")),
                Ok(inner) => self.handle_op(inner, Some(op)).await,
                Err(e) => Err(fs_err!(Protocol, "malformed retryable request: {e}")),
            },
            req => self.handle_op(req, None).await,
        }
    }

    /// Answers one request; mutations record their outcome under `op`.
    async fn handle_op(&self, req: Request, op: Option<OpId>) -> Response {
        let entry = |r: FsResult<EntryAttr>| r.map(Reply::Entry);
        match req {
            Request::Ping => Ok(Reply::Pong { node_type: NodeType::Meta, node: self.node }),
            Request::Lookup { parent, name } => entry(self.lookup_any(parent, &name).await),
            Request::GetAttr { id } => entry(self.getattr(id)),
            Request::SetAttr { id, attr, caller: _ } => entry(self.set_attr(id, attr, op).await),
            Request::Create { parent, name, kind, mode, rdev, excl, caller } => {
                if kind == FileKind::File {
                    self.targets.refresh_if_empty().await;
                }
                self.submit_op(
                    op,
                    Mutation::Create { parent, name, kind, mode, rdev, excl, uid: caller.uid, gid: caller.gid },
                )
                .await
            }
            Request::Mkdir { parent, name, mode, caller } => {
                self.mkdir_any(parent, name, mode, caller.uid, caller.gid, op).await
            }
            Request::Unlink { parent, name } => self.unlink_any(parent, name, op).await,
            Request::Rmdir { parent, name } => self.rmdir_any(parent, name, op).await,
            Request::Rename { parent, name, new_parent, new_name, flags } => {
                self.rename_any(parent, name, new_parent, None, new_name, flags, op).await
            }
            Request::RenameTo { parent, name, new_parent, new_parent_owner, new_name, flags } => {
                self.rename_any(parent, name, new_parent, Some(new_parent_owner), new_name, flags, op).await
            }
            Request::MetaPeer { op: step } => self.peer(step).await,
            Request::SetMetaChooser { id, chooser } => self.set_meta_chooser(id, chooser, op).await,
            Request::GetMetaChooser { id } => self.meta_chooser(id).map(Reply::MetaChooser),
            Request::FsckIntents => self.intents_text().map(Reply::FsckIntents),
            Request::LinkTo { id, new_parent, new_parent_owner, new_name } => {
                self.link_any(id, new_parent, new_parent_owner, new_name, op).await
            }
            Request::ReadDir { dir, after, max } => self.readdir(dir, after.as_deref(), max),
            Request::ReadDirFirst { dir, max } => self.read(|t| {
                let (entries, more) = t.readdir(dir, None, max)?;
                let parent = crate::ops::load_inode(&t.inodes, dir)?.and_then(|i| i.parent).unwrap_or(dir);
                Ok(Reply::DirPageFirst { parent, entries, more })
            }),
            Request::Symlink { parent, name, target, caller } => {
                self.submit_op(op, Mutation::Symlink { parent, name, target, uid: caller.uid, gid: caller.gid }).await
            }
            Request::ReadLink { id } => self.readlink(id).map(Reply::LinkTarget),
            Request::Link { id, new_parent, new_name } => {
                self.submit_op(op, Mutation::Link { id, new_parent, new_name }).await
            }
            Request::GetXattr { id, name } => self.getxattr(id, &name).map(Reply::Xattr),
            Request::SetXattr { id, name, value, flags } => {
                self.submit_op(op, Mutation::SetXattr { id, name, value, flags }).await
            }
            Request::ListXattr { id } => self.listxattr(id).map(Reply::XattrNames),
            Request::RemoveXattr { id, name } => self.submit_op(op, Mutation::RemoveXattr { id, name }).await,
            Request::SetDirPattern { id, pattern } => {
                self.targets.check_pool(pattern.pool).await?;
                self.submit_op(op, Mutation::SetDirPattern { id, pattern }).await
            }
            Request::Open { id, write: _ } => entry(self.open_file(id)),
            Request::Release { id, write: _ } => self.release(id).await.map(|()| Reply::Ok),
            Request::UpdateSize { id, size, mtime } => {
                self.submit_op(op, Mutation::UpdateSize { id, size, mtime }).await
            }
            Request::TouchAtime { id, at, strict } => {
                // Most reads change nothing (relatime): answered without a commit.
                match self.read(|t| crate::ops::load_inode(&t.inodes, id)) {
                    Ok(Some(i)) if !crate::ops::atime_due(&i, at, strict) => {
                        Ok(Reply::Entry(crate::ops::to_attr(id, &i, self.node)))
                    }
                    _ => self.submit_op(op, Mutation::TouchAtime { id, at, strict }).await,
                }
            }
            Request::CreateOpen { parent, name, mode, excl, caller } => {
                self.create_open(parent, name, mode, excl, caller, op).await
            }
            Request::MetaStat => self.meta_stat(),
            Request::RefreshView => self.targets.refresh().await.map(|()| Reply::Ok),
            r @ (Request::LockAcquire { .. }
            | Request::LockRelease { .. }
            | Request::LockTest { .. }
            | Request::LockKeepAlive { .. }) => crate::locks::handle(self, r).await,
            r @ (Request::FsckDentries { .. }
            | Request::FsckInodes { .. }
            | Request::FsckDisposals { .. }
            | Request::FsckFix { .. }) => crate::fsck::handle(self, r).await,
            other => {
                Err(fs_err!(NotSupported, "{} is not served by a metadata node (node {})", other.name(), self.node))
            }
        }
    }
}
