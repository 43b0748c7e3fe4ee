//! The namespace of one metadata target, as a service without network.
//!
//! Owns the store, the writer (group commit), the in-memory open counts and
//! the request dispatch: reads run in their own read transactions,
//! concurrently with the writer; mutations go through the writer; truncation
//! talks to the storage targets before the size is committed. It must not
//! know about sockets, mgmtd or configuration files (that is `lib.rs`), so
//! tests drive it directly with a fake [`DataTargets`].

use crate::ops::{check_truncatable, load_inode, Mutation};
use crate::store::{sys, sys_get, usage, Store, StoreError};
use crate::store::{OpError, ReadTables};
use crate::targets::DataTargets;

mod ahead;
mod cross;
mod handlers;
mod held;
mod moving;

pub(crate) use crate::ops::is_moving;
use crate::writer::{
    run_batch, system_clock, Change, Clock, CommitLatency, StoreFailure, Writer, WriterState, WriterStats,
};
pub use handlers::{spawn_lease_recorder, spawn_lock_expiry};
pub use held::spawn_held_settler;
use hivefs_cluster::capacity_of;
use hivefs_proto::{Caller, OpId, QuotaId, QuotaState, QuotaUse, Reply, Response, HAND_OVERS_KEPT};
use hivefs_types::attr::{EntryAttr, FileKind, SetAttr};
use hivefs_types::error::{FsError, FsResult};
use hivefs_types::fs_err;
use hivefs_types::ids::{EntryId, NodeId};
use hivefs_types::pattern::{Pattern, StripeSet};
use rand::rngs::StdRng;
use rand::SeedableRng;
use std::collections::{HashMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;

pub use crate::store::DB_FILE;

/// How a namespace is opened.
#[derive(Clone)]
pub struct NamespaceOptions {
    /// Data dir: holds [`DB_FILE`]; its file system's space is reported by MetaStat.
    pub dir: PathBuf,
    /// fsync before acknowledging (see `store::SwitchableSyncBackend`).
    pub sync: bool,
    /// This node's id: part of minted EntryIds and of every EntryAttr.
    pub node: NodeId,
    /// Seed of the choosers' randomness (storage targets of new files,
    /// metadata node of new directories); `None` draws one from the OS.
    pub seed: Option<u64>,
    /// Time source; `None` is the system clock.
    pub clock: Option<Clock>,
    /// Operations that add to the namespace are refused with `NoSpace` while
    /// the data dir's file system has less free space than this (removals
    /// still work, so space can be freed); 0 turns the check off.
    pub min_free_bytes: u64,
    /// `Some`: commit in the submitting task after the latency it draws,
    /// instead of the service's combining writer ([`crate::writer::Writer::inline`]):
    /// deterministic simulations only (`crates/sim`). The service combines
    /// (`None`).
    pub inline_writer: Option<CommitLatency>,
}

/// Open handles per entry, counted from Open/Release requests, and what
/// is known of the chunk files of files this node made. In memory only:
/// after a restart nothing is open (which is why open-unlinked entries are
/// finished at start) and nothing is known of any file's chunk files (a
/// remove then deletes them on every target, as for any file).
#[derive(Default)]
pub struct Opens {
    pub(crate) state: Mutex<OpenState>,
    /// Files a cross-node rename is moving away (see `moving`).
    pub(crate) moving: moving::Moving,
}

#[derive(Default)]
pub(crate) struct OpenState {
    pub(crate) counts: HashMap<EntryId, u32>,
    /// Regular files this node made since it started whose chunk files no
    /// client reported changing (`Release { write }`, `ReleaseMany::wrote`,
    /// `ReleaseWritten`) and that no truncation touched: none of their
    /// chunk files can exist, so their removal deletes none.
    chunkless: IdBits,
    /// Files that left `chunkless` by releases that each named the stripe
    /// positions written, and all of them position 0 only: a file smaller
    /// than a chunk, written from its start (most small files). A bit
    /// each, as `chunkless`.
    first_only: IdBits,
    /// The other files that left `chunkless` by releases that each named
    /// the stripe positions written: chunk files can exist only there. At
    /// most [`WRITTEN_MAX`] files; past that a written file is not kept
    /// (its removal asks every target). A write or truncation reported
    /// without positions forgets the file.
    written: HashMap<EntryId, StripeSet>,
    /// The renames whose hand-over of open handles this node counted
    /// (`PeerOp::HandOver`), the last [`HAND_OVERS_KEPT`] in order.
    handed_over: (HashSet<EntryId>, VecDeque<EntryId>),
    /// Files whose size clients hold: per file, who holds it through how
    /// many `CreateOpenHeld` handles not yet released ([`Hold`]).
    held: HashMap<EntryId, Vec<Hold>>,
}

/// Handles of one lease client holding a file's size (`CreateOpenHeld`).
/// Client [`ORPHAN`]: a size no client holds any more that did not land
/// (its report failed, or its client went silent): the settler reads it
/// off the chunk files.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Hold {
    pub(crate) client: u64,
    count: u32,
    /// When the last of these handles was opened.
    since: std::time::Instant,
}

/// [`Hold::client`] of a size to be read off the chunk files.
pub(crate) const ORPHAN: u64 = 0;

/// Most files [`OpenState::written`] holds (about 50 bytes each: 13 MiB).
pub const WRITTEN_MAX: usize = 1 << 18;

/// A set of entry ids as bits: a 64-bit word per 64 consecutive counters of
/// a node's epoch. A node mints ids in sequence, so the files it makes fill
/// words densely: a million files made in a row take about half a MiB. At
/// most [`CHUNKLESS_WORDS_MAX`] words; an id that needs another is not kept
/// (its file is treated as any other).
#[derive(Default)]
pub(crate) struct IdBits {
    words: HashMap<(u32, u32, u64), u64>,
}

/// Most words an [`IdBits`] holds (about 32 bytes each: 8 MiB).
pub const CHUNKLESS_WORDS_MAX: usize = 1 << 18;

impl IdBits {
    fn key(id: EntryId) -> ((u32, u32, u64), u64) {
        ((id.node, id.epoch, id.counter / 64), 1 << (id.counter % 64))
    }

    fn insert(&mut self, id: EntryId) {
        let (k, bit) = Self::key(id);
        if let Some(w) = self.words.get_mut(&k) {
            *w |= bit;
        } else if self.words.len() < CHUNKLESS_WORDS_MAX {
            self.words.insert(k, bit);
        }
    }

    fn contains(&self, id: EntryId) -> bool {
        let (k, bit) = Self::key(id);
        self.words.get(&k).is_some_and(|w| w & bit != 0)
    }

    /// Whether `id` was in the set; it is not any more.
    fn remove(&mut self, id: EntryId) -> bool {
        let (k, bit) = Self::key(id);
        let Some(w) = self.words.get_mut(&k) else { return false };
        let had = *w & bit != 0;
        *w &= !bit;
        if *w == 0 {
            self.words.remove(&k);
        }
        had
    }
}

impl OpenState {
    /// A client changed the chunk files of `id` at positions `wrote`
    /// ([`StripeSet::ALL`]: anywhere).
    fn wrote(&mut self, id: EntryId, wrote: StripeSet) {
        const FIRST: StripeSet = StripeSet(1);
        if wrote.is_empty() || wrote == FIRST && self.first_only.contains(id) {
            return;
        }
        let Some(known) = self.take_known(id) else { return };
        let now = known.union(wrote);
        if now == FIRST {
            self.first_only.insert(id);
        } else if now != StripeSet::ALL && self.written.len() < WRITTEN_MAX {
            self.written.insert(id, now);
        }
    }

    /// Where `id`'s chunk files can be, if known; forgotten either way.
    fn take_known(&mut self, id: EntryId) -> Option<StripeSet> {
        if self.chunkless.remove(id) {
            Some(StripeSet::EMPTY)
        } else if self.first_only.remove(id) {
            Some(StripeSet(1))
        } else {
            self.written.remove(&id)
        }
    }
}

impl Opens {
    /// `count` handles of file `id` count here now, handed over by rename
    /// `intent`; once per intent. Whether they were counted now.
    pub(crate) fn handed_over(&self, intent: EntryId, id: EntryId, count: u32) -> bool {
        let mut m = self.state.lock().expect("opens lock");
        let (seen, order) = &mut m.handed_over;
        if !seen.insert(intent) {
            return false;
        }
        order.push_back(intent);
        if order.len() > HAND_OVERS_KEPT {
            let old = order.pop_front().expect("more than the bound");
            seen.remove(&old);
        }
        if count > 0 {
            *m.counts.entry(id).or_insert(0) += count;
        }
        true
    }

    pub fn is_open(&self, id: EntryId) -> bool {
        self.state.lock().expect("opens lock").counts.contains_key(&id)
    }
    fn inc(&self, id: EntryId) {
        *self.state.lock().expect("opens lock").counts.entry(id).or_insert(0) += 1;
    }
    /// Returns true when the last handle went away. `wrote`: the stripe
    /// positions whose chunk files the handle may have changed (see
    /// [`OpenState::chunkless`]); noted before the count drops, so that a
    /// remove that sees the file closed also sees the write.
    fn dec(&self, id: EntryId, wrote: StripeSet) -> bool {
        let mut m = self.state.lock().expect("opens lock");
        m.wrote(id, wrote);
        match m.counts.get_mut(&id) {
            Some(c) if *c > 1 => {
                *c -= 1;
                false
            }
            Some(_) => {
                m.counts.remove(&id);
                true
            }
            None => false,
        }
    }
    /// The file's chunk files may exist anywhere now (a truncation).
    pub(crate) fn may_have_chunks(&self, id: EntryId) {
        self.state.lock().expect("opens lock").take_known(id);
    }

    /// A handle of `client` holds the size of `id` now.
    pub(crate) fn hold(&self, id: EntryId, client: u64) {
        let now = std::time::Instant::now();
        let mut m = self.state.lock().expect("opens lock");
        let hs = m.held.entry(id).or_default();
        match hs.iter_mut().find(|h| h.client == client) {
            Some(h) => {
                h.count += 1;
                h.since = now;
            }
            None => hs.push(Hold { client, count: 1, since: now }),
        }
    }

    /// A handle of `client` on `id` holds its size no longer.
    pub(crate) fn unhold(&self, id: EntryId, client: u64) {
        let mut m = self.state.lock().expect("opens lock");
        let Some(hs) = m.held.get_mut(&id) else { return };
        if let Some(i) = hs.iter().position(|h| h.client == client) {
            hs[i].count -= 1;
            if hs[i].count == 0 {
                hs.swap_remove(i);
            }
        }
        if hs.is_empty() {
            m.held.remove(&id);
        }
    }

    /// Whether a client other than `requester` holds the size of `id`
    /// (or a size of it is still to be read off its chunk files).
    pub(crate) fn held_by_other(&self, id: EntryId, requester: Option<u64>) -> bool {
        let m = self.state.lock().expect("opens lock");
        m.held.get(&id).is_some_and(|hs| hs.iter().any(|h| Some(h.client) != requester || h.client == ORPHAN))
    }

    /// Takes the holds to settle from the chunk files: orphans, and those
    /// of clients not `alive` whose last handle is older than `quiet`.
    pub(crate) fn take_to_settle(&self, alive: impl Fn(u64) -> bool, quiet: std::time::Duration) -> Vec<EntryId> {
        let mut m = self.state.lock().expect("opens lock");
        let mut out = Vec::new();
        m.held.retain(|&id, hs| {
            let before = hs.len();
            hs.retain(|h| h.client != ORPHAN && (h.since.elapsed() < quiet || alive(h.client)));
            if hs.len() < before {
                out.push(id);
            }
            !hs.is_empty()
        });
        out
    }
}

impl crate::ops::Handles for Opens {
    fn is_open(&self, id: EntryId) -> bool {
        Opens::is_open(self, id)
    }
    fn created(&self, id: EntryId, open: bool) {
        let mut m = self.state.lock().expect("opens lock");
        if open {
            *m.counts.entry(id).or_insert(0) += 1;
        }
        m.chunkless.insert(id);
    }
    fn opened(&self, id: EntryId) {
        self.inc(id);
    }
    fn take_known(&self, id: EntryId) -> Option<StripeSet> {
        self.state.lock().expect("opens lock").take_known(id)
    }
    fn last_link(&self, id: EntryId) -> crate::ops::LastLink {
        use crate::ops::LastLink;
        // Under the lock a release that reports a write notes it before
        // its handle stops counting.
        let mut m = self.state.lock().expect("opens lock");
        if m.counts.contains_key(&id) {
            LastLink::Open
        } else {
            LastLink::Closed(m.take_known(id))
        }
    }
    fn moving(&self, id: EntryId) -> bool {
        self.moving.contains(id)
    }
    fn start_moving(&self, id: EntryId, intent: EntryId, to: NodeId) {
        self.moving.start(id, intent, to);
    }
}

pub struct Namespace {
    // Field order matters: the writer (and its thread) goes before the records.
    writer: Writer,
    mem: Arc<crate::store::Mem>,
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
    pub(crate) multi: crate::cross::Multi,
    /// Clients' attribute leases (in memory; see `leases`).
    pub leases: crate::leases::Leases,
    /// Background tasks serving this namespace (stopped before it closes).
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// Set when this node stops serving the namespace (`stop_tasks`):
    /// requests still running give up what they retry.
    stopping: std::sync::atomic::AtomicBool,
    /// Quota limits fetched from mgmtd (see `quota`).
    pub quota: Arc<crate::quota::QuotaGate>,
}

tokio::task_local! {
    /// The lease client whose request is being answered: its own leases
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
        let Store { mut log, epoch, counter, path } = store;
        let mem = log.mem.clone();
        let opens = Arc::new(Opens::default());
        let disposal_wakeup = Arc::new(Notify::new());
        let failed = Arc::new(StoreFailure::default());
        let quota = Arc::new(crate::quota::QuotaGate::default());
        let mut state = WriterState {
            node: opts.node,
            epoch,
            epoch_saved: epoch,
            counter,
            targets: targets.clone(),
            rr: 0,
            rng: match opts.seed {
                Some(s) => StdRng::seed_from_u64(s),
                None => StdRng::from_entropy(),
            },
            handles: opens.clone(),
            clock: opts.clock.unwrap_or_else(system_clock),
            disposal_wakeup: disposal_wakeup.clone(),
            reply_sweep: (Vec::new(), 0),
            space_reserve: (opts.min_free_bytes > 0).then(|| (opts.dir.clone(), opts.min_free_bytes)),
            failed: failed.clone(),
            low_space: None,
            disk_free: None,
            reply_floor: Default::default(),
            quota: quota.clone(),
        };
        if let Some((Err(e), _)) = crate::store::log::run_to_end(run_batch(
            &mut log,
            &mut state,
            vec![(Mutation::RecoverOrphans.into(), None)],
        ))
        .pop()
        {
            return Err(StoreError::Db { path, message: format!("recovering open-unlinked entries: {e}") });
        }
        let multi = crate::cross::Multi::new(opts.seed);
        let writer = match opts.inline_writer {
            Some(latency) => Writer::inline(log, state, latency),
            None => Writer::spawn(log, state).map_err(|source| StoreError::Io { path: path.clone(), source })?,
        };
        Ok(Namespace {
            writer,
            mem,
            node: opts.node,
            epoch,
            dir: opts.dir,
            opens,
            locks: Arc::default(),
            targets,
            disposal_wakeup,
            failed,
            multi,
            leases: Default::default(),
            tasks: Mutex::default(),
            stopping: Default::default(),
            quota,
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

    /// Raised when the store can no longer commit (see [`Namespace::store_failed`]);
    /// waiting on it does not keep the namespace open.
    pub fn failure(&self) -> Arc<StoreFailure> {
        self.failed.clone()
    }

    /// Boot epoch of this run (part of every EntryId minted now).
    pub fn epoch(&self) -> u32 {
        self.epoch
    }

    pub fn writer_stats(&self) -> &WriterStats {
        &self.writer.stats
    }

    /// Keeps a background task of this namespace, to stop with it.
    pub fn add_task(&self, t: tokio::task::JoinHandle<()>) {
        self.tasks.lock().expect("tasks lock").push(t);
    }

    /// Stops the background tasks (they hold the namespace).
    pub fn stop_tasks(&self) {
        self.halt();
        for t in self.tasks.lock().expect("tasks lock").drain(..) {
            t.abort();
        }
    }

    /// Stops what this node retries for the namespace (requests running
    /// give up; see `stopping`).
    pub(crate) fn halt(&self) {
        self.stopping.store(true, std::sync::atomic::Ordering::Release);
    }

    /// Whether this node is giving up the namespace (see `stop_tasks`).
    pub fn stopping(&self) -> bool {
        self.stopping.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Stops the writer after its current batch and closes the store.
    pub fn close(mut self) {
        self.writer.shutdown();
    }

    pub(crate) async fn submit(&self, m: impl Into<Change>) -> FsResult<Reply> {
        self.submit_op(None, m).await
    }

    /// Like `submit`, for the operation `op` of a client that may retry it:
    /// applied at most once (see `replies`). Answers only after the other
    /// clients caching attributes it changed have dropped them.
    pub(crate) async fn submit_op(&self, op: Option<OpId>, m: impl Into<Change>) -> FsResult<Reply> {
        let (r, touched) = self.writer.submit((m.into(), op)).await?;
        if !touched.is_empty() {
            self.leases.revoke(&touched, REQUESTER.try_with(|c| *c).ok()).await;
        }
        r
    }

    pub(crate) fn read<T>(&self, f: impl FnOnce(&ReadTables) -> Result<T, OpError>) -> FsResult<T> {
        self.mem.read(f).map_err(store_err)
    }

    /// The recorded outcome of client operation `op`, if it was applied.
    pub(crate) fn recorded_reply(&self, op: &OpId) -> FsResult<Option<Response>> {
        self.read(|t| crate::replies::get(&t.replies, op).map_err(OpError::Fatal))
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
        self.read(|t| Ok((sys_get(&t.system, sys::FILES)?, sys_get(&t.system, sys::DIRS)?)))
    }

    /// What this node's inodes hold for `ids` (empty: every user and group
    /// holding anything).
    pub fn quota_usage(&self, ids: &[QuotaId]) -> FsResult<Vec<(QuotaId, QuotaUse)>> {
        self.read(|t| match ids {
            [] => usage::all(&t.usage),
            ids => {
                let mut ids = ids.to_vec();
                ids.sort_unstable();
                ids.dedup();
                ids.into_iter().map(|w| Ok((w, usage::get(&t.usage, w)?))).collect()
            }
        })
    }

    /// The report of this namespace's usage of the users and groups with
    /// a limit (as of the last limits installed) to mgmtd.
    pub fn quota_report(&self) -> FsResult<hivefs_proto::Request> {
        let ids = self.quota.limited();
        let usage = if ids.is_empty() { Vec::new() } else { self.quota_usage(&ids)? };
        let by_unit = self.read(|t| {
            let mut out = Vec::new();
            for &who in &ids {
                out.extend(usage::by_unit(&t.usage, who)?.into_iter().map(|(u, n)| (who, u, n)));
            }
            Ok(out)
        })?;
        Ok(hivefs_proto::Request::QuotaReport { namespace: self.node, usage, by_unit })
    }

    /// Installs quota limits fetched from mgmtd (see `quota`), whose usage
    /// includes this node's as `reported` with the request that fetched them
    /// (nothing for a user or group it did not report).
    pub fn set_quotas(&self, quotas: Vec<QuotaState>, reported: &HashMap<QuotaId, QuotaUse>) {
        self.quota.set(quotas, |w| reported.get(&w).copied().unwrap_or_default());
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
            self.opens.dec(id, StripeSet::EMPTY);
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
        let (uid, gid, umask) = (caller.uid, caller.gid, caller.umask);
        // The writer counts the handle (`Handles::created`, `Handles::opened`)
        // before the commit: a remove committed after it parks the file.
        let m = Mutation::Create { parent, name, kind, mode, rdev: 0, excl, uid, gid, umask, open: true };
        let r = self.submit_op(op, m).await?;
        if let Reply::Entry(a) = &r {
            if a.kind != FileKind::File {
                return Err(fs_err!(IsDir, "{} is not a regular file and cannot be opened by a create", a.id));
            }
        }
        Ok(r)
    }

    /// A client's handle on `id` is gone; `wrote`: the stripe positions
    /// whose chunk files it may have changed.
    pub async fn release(&self, id: EntryId, wrote: StripeSet) -> FsResult<()> {
        if !self.opens.dec(id, wrote) {
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
    /// `privileged`: asked by root (see `Mutation::SetAttr`).
    pub async fn set_attr(
        &self,
        id: EntryId,
        attr: SetAttr,
        privileged: bool,
        op: Option<OpId>,
    ) -> FsResult<EntryAttr> {
        if let Some(size) = attr.size {
            // Truncating may make chunk files (before it starts: a remove
            // committed meanwhile must delete them).
            self.opens.may_have_chunks(id);
            let i = self
                .read(|t| load_inode(&t.inodes, id))?
                .ok_or_else(|| fs_err!(NotFound, "entry {id} not found on this metadata node"))?;
            check_truncatable(id, &i)?;
            if let Some(p) = &i.pattern {
                self.truncate_chunks(id, p, size).await?;
            }
        }
        match self.submit_op(op, Mutation::SetAttr { id, attr, privileged }).await? {
            Reply::Entry(a) => Ok(a),
            r => Err(fs_err!(Internal, "writer answered {r:?} where an entry was expected")),
        }
    }

    async fn truncate_chunks(&self, id: EntryId, p: &Pattern, size: u64) -> FsResult<()> {
        let mut set = tokio::task::JoinSet::new();
        for idx in 0..p.stripe_count() {
            let len = p.chunk_file_len(size, idx);
            let target = p.unit(idx);
            let fut = self.targets.truncate_chunk(target, id, len);
            set.spawn(async move {
                fut.await.map_err(|e| {
                    FsError::new(e.code, format!("truncating {id} to {size} bytes: {target}: {}", e.message))
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
}

#[cfg(test)]
mod id_bits_tests {
    use super::*;

    #[test]
    fn ids_are_kept_as_bits_of_words_and_a_full_set_keeps_no_new_word() {
        let id = |epoch, counter| EntryId { node: 1, epoch, counter };
        let mut b = IdBits::default();
        for c in 0..1000 {
            b.insert(id(3, c));
        }
        assert_eq!(b.words.len(), 1000usize.div_ceil(64), "dense ids share words");
        assert!(b.remove(id(3, 999)) && !b.remove(id(3, 999)));
        assert!(!b.remove(id(4, 5)), "another epoch is another id");
        assert!(!b.remove(EntryId { node: 2, epoch: 3, counter: 5 }), "another node's id");
        for c in 0..999 {
            assert!(b.remove(id(3, c)), "{c}");
        }
        assert!(b.words.is_empty(), "empty words go");
        // Full: ids in the words it has are kept, others are not.
        for w in 0..CHUNKLESS_WORDS_MAX as u64 {
            b.insert(id(3, w * 64));
        }
        b.insert(id(3, 1));
        b.insert(id(3, CHUNKLESS_WORDS_MAX as u64 * 64));
        assert!(b.remove(id(3, 1)));
        assert!(!b.remove(id(3, CHUNKLESS_WORDS_MAX as u64 * 64)));
    }
}

#[cfg(test)]
mod known_chunks_tests {
    use super::*;

    fn at(bits: &[usize]) -> StripeSet {
        let mut s = StripeSet::EMPTY;
        bits.iter().for_each(|&b| s.insert(b));
        s
    }

    /// Writes add up per file; only files this node made are known, a
    /// write anywhere (or a truncation) forgets the file, and what is taken
    /// is gone.
    #[test]
    fn written_positions_add_up_until_anything_is_unknown() {
        let mut m = OpenState::default();
        let id = |c| EntryId { node: 1, epoch: 1, counter: c };
        for c in 0..6 {
            m.chunkless.insert(id(c));
        }
        assert_eq!(m.take_known(id(0)), Some(StripeSet::EMPTY));
        assert_eq!(m.take_known(id(0)), None, "taken once");
        // A small file: position 0, as a bit.
        m.wrote(id(1), at(&[0]));
        m.wrote(id(1), at(&[0]));
        assert!(m.written.is_empty());
        assert_eq!(m.take_known(id(1)), Some(at(&[0])));
        // From position 0 to more: moved to the map.
        m.wrote(id(2), at(&[0]));
        m.wrote(id(2), at(&[5]));
        assert!(!m.first_only.contains(id(2)));
        assert_eq!(m.take_known(id(2)), Some(at(&[0, 5])));
        m.wrote(id(3), at(&[2]));
        m.wrote(id(3), at(&[70]));
        assert_eq!(m.take_known(id(3)), Some(at(&[2, 63])));
        // Anywhere: forgotten.
        m.wrote(id(4), at(&[1]));
        m.wrote(id(4), StripeSet::ALL);
        assert_eq!(m.take_known(id(4)), None);
        assert!(m.written.is_empty());
        // A file this node did not make (or forgot) stays unknown.
        m.wrote(id(9), at(&[0]));
        assert_eq!(m.take_known(id(9)), None);
        // Nothing written keeps a file chunkless.
        m.wrote(id(5), StripeSet::EMPTY);
        assert_eq!(m.take_known(id(5)), Some(StripeSet::EMPTY));
    }
}
