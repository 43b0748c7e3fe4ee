//! Group commit: the single writer of the metadata store.
//!
//! Owns the write side of the records. Every mutation is queued; one task
//! at a time commits: it takes all queued mutations (up to [`BATCH_MAX`]),
//! applies them in order to ONE batch layer (each sees the effects of the
//! ones before it), appends the batch's changes to the journal as one record
//! (one write, one fdatasync with `sync`), makes them visible, and only then
//! answers all of them; checkpoints follow in the background (`store::log`).
//! One journal write is thus shared by every operation that arrived while
//! the previous one was running. It must not be bypassed: nothing else
//! writes the records once the writer runs.
//!
//! Combining: a submitter that finds no commit running commits the queue
//! itself, in its own task, once; if more arrived meanwhile, a task of their
//! own commits them until the queue is empty. A lone operation thus commits
//! without any hand-over to another thread or task (the dedicated writer
//! thread this replaced cost two thread wake-ups per batch); under load one
//! task spawn per batch. With `sync = true` the commit runs under
//! `block_in_place`, so an fdatasync does not hold up an async worker's
//! other tasks.
//!
//! A mutation refused by the namespace rules fails alone (rules check before
//! they write, see `ops`); a store failure fails the whole batch, and nothing
//! of it is journaled or visible.
//!
//! [`Writer::inline`] is the deterministic variant for simulations
//! (`crates/sim`): no thread; submits commit in their order, one at a time,
//! each after its [`CommitLatency`] (at least one yield, so other tasks
//! interleave where a queued submit would), as a batch of one in the
//! submitting task. The service always uses [`Writer::spawn`].

use crate::chooser;
use crate::cross::MultiMut;
use crate::ops::{is_moving, is_needs_protocol, Ctx, Mutation};
use crate::replies;
use crate::store::journal::AppendError;
use crate::store::log::Log;
use crate::store::{sys, sys_get, sys_put, LeaseKey, OpError, OpResult, Tables};
use crate::targets::DataTargets;
use hivefs_proto::{FsckFix, OpId, Reply};
use hivefs_types::attr::Timespec;
use hivefs_types::error::{FsError, FsResult};
use hivefs_types::fs_err;
use hivefs_types::ids::NodeId;
use hivefs_types::pattern::{DirPattern, Pattern, PatternKind};
use rand::rngs::StdRng;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::sync::{oneshot, Notify};
use tracing::error;

/// Most mutations committed in one transaction (bounds a batch's latency and memory).
pub const BATCH_MAX: usize = 1024;

/// The clock seam: the writer reads the time once per batch.
pub type Clock = Arc<dyn Fn() -> Timespec + Send + Sync>;

pub fn system_clock() -> Clock {
    Arc::new(|| {
        let d = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        Timespec { sec: d.as_secs() as i64, nsec: d.subsec_nanos() }
    })
}

/// How long a commit of [`Writer::inline`] takes, drawn per commit (a
/// simulation's seeded choice; zero: the submitter only yields once).
pub type CommitLatency = Arc<dyn Fn() -> std::time::Duration + Send + Sync>;

/// Counts of batches and mutations, to see how well commits are shared.
#[derive(Debug, Default)]
pub struct WriterStats {
    pub batches: AtomicU64,
    pub mutations: AtomicU64,
}

/// Everything the committing task owns besides the database.
pub struct WriterState {
    pub node: NodeId,
    /// Epoch of the ids minted now: the boot epoch, moved on when an epoch's
    /// counters are used up.
    pub epoch: u32,
    /// The epoch the store holds (committed); a larger `epoch` is written
    /// with the next batch.
    pub epoch_saved: u32,
    /// Last EntryId counter minted in this epoch.
    pub counter: u64,
    pub targets: Arc<dyn DataTargets>,
    /// Round-robin cursor of the target choosers.
    pub rr: u64,
    pub rng: StdRng,
    pub handles: Arc<dyn crate::ops::Handles>,
    pub clock: Clock,
    /// Woken after a commit that queued chunk deletions or parked an orphan.
    pub disposal_wakeup: Arc<Notify>,
    /// Where the next sweep of old retry records starts, and when the last ran.
    pub reply_sweep: (Vec<u8>, u64),
    /// Data dir and the free space below which growing operations are refused.
    pub space_reserve: Option<(std::path::PathBuf, u64)>,
    /// The last "too little space" finding (free bytes) and until when it stands.
    pub low_space: Option<(std::time::Instant, u64)>,
    /// The data dir's free bytes and when they were asked (asked again
    /// after [`DISK_FREE_TTL`], not for every batch).
    pub disk_free: Option<(std::time::Instant, u64)>,
    /// Raised when a commit failed in a way that needs the store reopened.
    pub failed: Arc<StoreFailure>,
    /// Where the last client operation's confirmed retry records were
    /// removed up to, per client: the next removal starts there (the
    /// removed ones stay as deletions in memory until a checkpoint).
    pub reply_floor: std::collections::HashMap<u64, u64>,
    /// Quota limits in force (see `quota`).
    pub quota: Arc<crate::quota::QuotaGate>,
}

/// Set once the store cannot commit any more: the journal could not be cut
/// back after a failed append, or a checkpoint failed (after an I/O error
/// redb refuses every further transaction until the database is opened
/// again). The journal holds every acknowledged batch; a restart replays it.
pub type StoreFailure = hivefs_cluster::Latch;

/// The error code of a journal write that failed: a full disk is `NoSpace`, the rest `Io`.
fn failure_code(e: &std::io::Error) -> hivefs_types::ErrorCode {
    match e.kind() {
        std::io::ErrorKind::StorageFull => hivefs_types::ErrorCode::NoSpace,
        _ => hivefs_types::ErrorCode::Io,
    }
}

/// How long a statvfs of the data dir stands.
const DISK_FREE_TTL: std::time::Duration = std::time::Duration::from_millis(100);

impl WriterState {
    /// Free bytes of the data dir's file system (`None` without a reserve
    /// or when statvfs fails).
    fn disk_free(&mut self) -> Option<u64> {
        let (dir, _) = self.space_reserve.as_ref()?;
        match self.disk_free {
            Some((at, free)) if at.elapsed() < DISK_FREE_TTL => Some(free),
            _ => {
                let free = hivefs_cluster::capacity_of(dir).ok()?.free_bytes;
                self.disk_free = Some((std::time::Instant::now(), free));
                Some(free)
            }
        }
    }

    /// Chooses a new file's targets: from the normal capacity pool, and from
    /// the low one only for the part of the stripe the normal pool cannot fill
    /// (emergency targets are never offered).
    ///
    /// A mirrored directory's files stripe over storage buddy groups with
    /// both members online; the choosers see each group as its primary's
    /// server, so the balanced one spreads primaries over servers.
    fn make_pattern(&mut self, dp: &DirPattern) -> FsResult<Pattern> {
        let (normal, low, kind, what) = if dp.mirror {
            let normal = self.targets.group_candidates(dp.pool, false);
            let low = self.targets.group_candidates(dp.pool, true);
            (normal, low, PatternKind::BuddyMirror, "storage buddy group (both members)")
        } else {
            (
                self.targets.candidates(dp.pool),
                self.targets.low_candidates(dp.pool),
                PatternKind::Raid0,
                "storage target",
            )
        };
        if normal.is_empty() && low.is_empty() {
            return Err(fs_err!(
                NoSpace,
                "no {what} of pool {} is online with free space (all are offline or in the emergency capacity pool)",
                dp.pool
            ));
        }
        let want = match dp.stripe_count {
            0 if normal.is_empty() => low.len(),
            0 => normal.len(),
            n => n as usize,
        };
        let mut targets = chooser::choose(dp.chooser, &normal, want, &mut self.rr, &mut self.rng);
        if targets.len() < want {
            let more = chooser::choose(dp.chooser, &low, want - targets.len(), &mut self.rr, &mut self.rng);
            targets.extend(more);
        }
        assert!(!targets.is_empty(), "a chooser returns at least one target when there are candidates");
        Pattern::new(kind, dp.chunk_size, targets)
            .map_err(|m| fs_err!(Internal, "stripe pattern chosen for pool {}: {m}", dp.pool))
    }
}

/// What the writer applies: an operation of this node alone, a step of a
/// cross-node operation, or a repair asked for by `hivefs fsck`.
#[derive(Debug)]
pub enum Change {
    Op(Mutation),
    Cross(MultiMut),
    Fsck(FsckFix),
}

impl From<Mutation> for Change {
    fn from(m: Mutation) -> Change {
        Change::Op(m)
    }
}

impl From<MultiMut> for Change {
    fn from(m: MultiMut) -> Change {
        Change::Cross(m)
    }
}

impl From<FsckFix> for Change {
    fn from(f: FsckFix) -> Change {
        Change::Fsck(f)
    }
}

impl Change {
    /// Whether it adds entries or attributes (refused when the disk is nearly full).
    fn adds_to_namespace(&self) -> bool {
        match self {
            Change::Op(m) => m.adds_to_namespace(),
            Change::Cross(m) => m.adds_to_namespace(),
            Change::Fsck(_) => false,
        }
    }

    /// Applies it in the batch's layer (see `ops` for the error rule).
    fn apply(self, t: &mut Tables<'_>, ctx: &mut Ctx<'_>) -> OpResult<Reply> {
        match self {
            Change::Op(m) => crate::ops::apply(t, ctx, m),
            Change::Cross(m) => crate::cross::apply(t, ctx, m),
            Change::Fsck(fix) => crate::fsck::apply_fix(t, ctx, fix),
        }
    }
}

/// A change, and the id of the client operation it carries out when the
/// client may retry it (see [`replies`]).
pub type Queued = (Change, Option<OpId>);

/// How often a batch also sweeps retry records of vanished clients.
const REPLY_SWEEP_EVERY_MS: u64 = 60_000;

/// A mutation's outcome, and the non-directory inodes and the names it wrote
/// or removed (whose cached copies must be revoked before it is acknowledged).
pub type Done = (FsResult<Reply>, Vec<LeaseKey>);

struct Job {
    m: Queued,
    reply: oneshot::Sender<Done>,
}

pub struct Writer {
    /// [`Writer::spawn`]: the queue and the store, committed by submitters.
    combiner: Option<Arc<Combiner>>,
    /// [`Writer::inline`]: what the submitting task commits with.
    inline: Option<Inline>,
    pub stats: Arc<WriterStats>,
}

/// The service's writer (see the module doc, "Combining").
struct Combiner {
    pending: std::sync::Mutex<Pending>,
    /// The store and the writer's state; `None` once closed. Only the task
    /// that commits takes it.
    core: tokio::sync::Mutex<Option<(Log, WriterState)>>,
    /// Commits wait for the disk (`sync = true`).
    blocking: bool,
    stats: Arc<WriterStats>,
}

#[derive(Default)]
struct Pending {
    jobs: Vec<Job>,
    /// A task commits (or is about to): submitters only queue.
    committing: bool,
    closed: bool,
}

impl Pending {
    /// With nothing left to commit (or the writer closed), the committing
    /// role is given up; whether it was.
    fn give_up_if_done(&mut self) -> bool {
        if !self.jobs.is_empty() && !self.closed {
            return false;
        }
        self.committing = false;
        self.jobs.clear();
        true
    }
}

/// The committing role of one task: given up when dropped unfinished (the
/// task was cancelled), with what is queued handed to a new task.
struct Role<'a> {
    c: &'a Arc<Combiner>,
    done: bool,
}

impl Drop for Role<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.c.hand_over();
        }
    }
}

/// The writer's side of [`Writer::inline`]: the log and the state (taken
/// by one submit at a time, in order), and the commit latency.
struct Inline {
    db_state: tokio::sync::Mutex<(Log, WriterState)>,
    latency: CommitLatency,
}

fn stopped() -> FsError {
    fs_err!(Unavailable, "the metadata writer has stopped")
}

impl Combiner {
    /// Commits what is queued (at most [`BATCH_MAX`]) as one batch, as the
    /// task holding the committing role. Returns whether more is queued now
    /// (the role is still this task's: it goes on or hands over); else the
    /// role is given up.
    async fn commit_next(&self) -> bool {
        let jobs = {
            let mut p = self.pending.lock().expect("writer queue lock");
            if p.give_up_if_done() {
                return false;
            }
            match p.jobs.len() {
                n if n <= BATCH_MAX => std::mem::take(&mut p.jobs),
                _ => p.jobs.drain(..BATCH_MAX).collect(),
            }
        };
        let (muts, replies): (Vec<Queued>, Vec<oneshot::Sender<Done>>) =
            jobs.into_iter().map(|j| (j.m, j.reply)).unzip();
        let results = {
            let mut core = self.core.lock().await;
            let Some((log, st)) = core.as_mut() else {
                // Closed: the senders go, their submitters hear "stopped".
                return false;
            };
            self.stats.batches.fetch_add(1, Ordering::Relaxed);
            self.stats.mutations.fetch_add(muts.len() as u64, Ordering::Relaxed);
            let multi_thread = || {
                tokio::runtime::Handle::try_current()
                    .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread)
            };
            let results = if self.blocking && multi_thread() {
                tokio::task::block_in_place(|| crate::store::log::run_to_end(run_batch(log, st, muts)))
            } else {
                run_batch(log, st, muts).await
            };
            if self.pending.lock().expect("writer queue lock").closed {
                // Closed while this batch ran: the store closes now.
                core.take();
            }
            results
        };
        // Answers go out only now: after the commit.
        for (r, tx) in results.into_iter().zip(replies) {
            let _ = tx.send(r);
        }
        !self.pending.lock().expect("writer queue lock").give_up_if_done()
    }

    /// Commits batch after batch in a task of its own until the queue is empty.
    fn spawn_committer(self: Arc<Self>) {
        tokio::spawn(async move { while self.commit_next().await {} });
    }

    /// The committing role is free again; what is queued gets a task of its own.
    fn hand_over(self: &Arc<Self>) {
        let mut p = self.pending.lock().expect("writer queue lock");
        if p.give_up_if_done() || tokio::runtime::Handle::try_current().is_err() {
            p.committing = false;
            return;
        }
        drop(p);
        self.clone().spawn_committer();
    }
}

impl Writer {
    pub fn spawn(mut log: Log, state: WriterState) -> std::io::Result<Writer> {
        let stats = Arc::new(WriterStats::default());
        log.spawn_checkpointer()?;
        let blocking = log.syncs();
        let combiner = Arc::new(Combiner {
            pending: std::sync::Mutex::default(),
            core: tokio::sync::Mutex::new(Some((log, state))),
            blocking,
            stats: stats.clone(),
        });
        Ok(Writer { combiner: Some(combiner), inline: None, stats })
    }

    /// A writer without thread: submits commit one at a time in the order
    /// they came (as the thread takes its queue); each waits `latency` (in
    /// tokio time), then commits its mutation alone in the submitting task,
    /// blocking it for the commit. For deterministic simulations on one
    /// thread (paused time).
    pub fn inline(log: Log, state: WriterState, latency: CommitLatency) -> Writer {
        Writer {
            combiner: None,
            inline: Some(Inline { db_state: tokio::sync::Mutex::new((log, state)), latency }),
            stats: Arc::new(WriterStats::default()),
        }
    }

    /// Queues a mutation and waits until it is committed (or refused).
    pub async fn submit(&self, m: Queued) -> FsResult<Done> {
        if let Some(inline) = &self.inline {
            // Boxed: the service's submits (and every request future that
            // awaits one) do not carry the inline path's state.
            return Box::pin(self.submit_inline(inline, m)).await;
        }
        let c = self.combiner.as_ref().ok_or_else(stopped)?;
        let (reply, rx) = oneshot::channel();
        let commit = {
            let mut p = c.pending.lock().expect("writer queue lock");
            if p.closed {
                return Err(stopped());
            }
            p.jobs.push(Job { m, reply });
            !std::mem::replace(&mut p.committing, true)
        };
        if commit {
            // No commit running: this task commits the queue, once.
            let mut role = Role { c, done: false };
            let more = c.commit_next().await;
            role.done = true;
            if more {
                // More came meanwhile: a task of their own commits them.
                c.clone().spawn_committer();
            }
        }
        rx.await.map_err(|_| stopped())
    }

    /// [`Writer::submit`] of an inline writer.
    async fn submit_inline(&self, inline: &Inline, m: Queued) -> FsResult<Done> {
        // In the order of submission, one at a time, as the thread
        // commits its queue; while one commits, other tasks run.
        let mut guard = inline.db_state.lock().await;
        match (inline.latency)() {
            d if d.is_zero() => tokio::task::yield_now().await,
            d => tokio::time::sleep(d).await,
        }
        let (log, st) = &mut *guard;
        self.stats.batches.fetch_add(1, Ordering::Relaxed);
        self.stats.mutations.fetch_add(1, Ordering::Relaxed);
        run_batch(log, st, vec![m]).await.pop().ok_or_else(stopped)
    }

    /// Stops accepting mutations and closes the store: at once, or when the
    /// batch running now ends (its task closes it then).
    pub fn shutdown(&mut self) {
        self.inline = None;
        if let Some(c) = self.combiner.take() {
            {
                let mut p = c.pending.lock().expect("writer queue lock");
                p.closed = true;
                p.jobs.clear();
            }
            if let Ok(mut core) = c.core.try_lock() {
                core.take();
            }
        }
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        // Joining releases the database (and its file lock) deterministically.
        self.shutdown();
    }
}

/// Applies and commits one batch; one result per mutation, in order. It
/// waits only on a mirrored primary (see `Log::commit_async`).
pub async fn run_batch(log: &mut Log, st: &mut WriterState, muts: Vec<Queued>) -> Vec<Done> {
    let n = muts.len();
    let fail_all = |code: hivefs_types::ErrorCode, msg: &str| -> Vec<Done> {
        error!("metadata store failure, batch of {n} operations not committed: {msg}");
        (0..n).map(|_| (Err(FsError::new(code, format!("metadata store failure: {msg}"))), Vec::new())).collect()
    };
    if log.failed() {
        st.failed.set();
        return fail_all(hivefs_types::ErrorCode::Io, "a checkpoint failed; the service must be restarted");
    }
    let used = log.store_used();
    let drafts: Vec<crate::events::Draft> = muts
        .iter()
        .map(|(c, _)| match c {
            Change::Op(m) => crate::events::draft_op(m),
            Change::Cross(m) => crate::events::draft_cross(m),
            Change::Fsck(_) => crate::events::Draft::None,
        })
        .collect();
    let mut results = Vec::with_capacity(n);
    let (wake, changes) = match log.mem.batch(|t| apply_all(t, st, muts, &mut results, used).map_err(OpError::Fatal)) {
        Ok(r) => r,
        Err(e) => return fail_all(hivefs_types::ErrorCode::Io, &e.to_string()),
    };
    let start = std::time::Instant::now();
    let committed = log.commit_async(changes).await;
    hivefs_metrics::committed(n, start.elapsed());
    if let Err(e) = committed {
        return match e {
            AppendError::Refused(e) => fail_all(failure_code(&e), &format!("journal write: {e}")),
            AppendError::Unavailable(m) => {
                tracing::warn!("batch of {n} operations not committed: {m}");
                (0..n)
                    .map(|_| (Err(FsError::new(hivefs_types::ErrorCode::Unavailable, m.clone())), Vec::new()))
                    .collect()
            }
            AppendError::Broken(m) => {
                st.failed.set();
                fail_all(hivefs_types::ErrorCode::Io, &format!("journal write: {m}"))
            }
        };
    }
    st.epoch_saved = st.epoch;
    // In the journal: what it changed is told now, in the batch's order.
    crate::events::log().committed(drafts, results.iter().map(|(r, _)| r));
    if wake {
        st.disposal_wakeup.notify_one();
    }
    // A disk filling up checkpoints early: the store reuses the space of
    // removed records, and the checkpointed journal segments are deleted.
    let limit = match st.low_space {
        Some(_) => 0,
        None => st.disk_free().map_or(u64::MAX, |f| f / 8),
    };
    log.maybe_checkpoint(limit);
    results
}

fn apply_all(
    t: &mut Tables<'_>,
    st: &mut WriterState,
    muts: Vec<Queued>,
    results: &mut Vec<Done>,
    store_used: Option<u64>,
) -> Result<bool, String> {
    let fatal = |e: OpError| e.to_string();
    let now = (st.clock)();
    let now_ms = (now.sec.max(0) as u64).saturating_mul(1000) + u64::from(now.nsec / 1_000_000);
    let sweep_due = now_ms.saturating_sub(st.reply_sweep.1) >= REPLY_SWEEP_EVERY_MS;
    // Below the reserve, only operations that do not add to the namespace
    // run. Space freed inside the store (removed entries) counts as free: the
    // store file never shrinks, but its free pages are reused by the next
    // checkpoint (which starts at once when space is low).
    // A finding of too little space stands for a second.
    let free = match (st.space_reserve.as_ref().map(|(_, min)| *min), st.low_space) {
        (Some(min), Some((until, free))) if std::time::Instant::now() < until => Some((free, min)),
        (Some(min), _) => match st.disk_free() {
            Some(free) if free < min => {
                let dir = &st.space_reserve.as_ref().expect("a reserve").0;
                // Only the part of the file that has disk blocks: the store
                // grows its file sparsely, and writing into a hole takes
                // space the file system's free count already includes.
                let on_disk = std::fs::metadata(dir.join(crate::store::DB_FILE))
                    .map_or(0, |m| m.len().min(std::os::unix::fs::MetadataExt::blocks(&m) * 512));
                let free = free + on_disk.saturating_sub(store_used.unwrap_or(u64::MAX));
                (free < min).then_some((free, min))
            }
            _ => None,
        },
        (None, _) => None,
    };
    st.low_space = free.map(|(f, _)| (std::time::Instant::now() + std::time::Duration::from_secs(1), f));
    // Ids for files made ahead go already below twice the reserve, so that
    // files made with ids in hand still find room when they land.
    let ahead_low = match st.space_reserve.as_ref().map(|(_, min)| *min) {
        Some(min) => free.is_some() || st.disk_free().is_some_and(|f| f < 2 * min),
        None => false,
    };
    let (node, epoch) = (st.node, st.epoch);
    let handles = st.handles.clone();
    let mut counter = st.counter;
    let mut reply_floor = std::mem::take(&mut st.reply_floor);
    let quota = st.quota.clone();
    let mut choose = |dp: &DirPattern| st.make_pattern(dp);
    let mut ctx = Ctx {
        node,
        epoch,
        counter: &mut counter,
        now,
        choose: &mut choose,
        handles: &*handles,
        files_delta: 0,
        dirs_delta: 0,
        disposal_queued: false,
        quota: &quota,
    };
    for (m, op) in muts {
        if let Some(op) = &op {
            // A repeat of an operation applied before: its first answer, no change.
            if let Some(first) = replies::get(&t.replies, op)? {
                results.push((first, Vec::new()));
                continue;
            }
        }
        let r = match (free, m.adds_to_namespace()) {
            (Some((free, min)), true) => Err(fs_err!(
                NoSpace,
                "metadata node {node}: its data dir has {free} bytes free, less than min_free_bytes = {min}"
            )),
            _ if ahead_low && matches!(m, Change::Op(Mutation::Reserve { .. })) => Err(fs_err!(
                NoSpace,
                "metadata node {node}: its data dir has less than twice min_free_bytes free: no ids ahead"
            )),
            _ => match m.apply(t, &mut ctx) {
                Ok(r) => Ok(r),
                Err(OpError::Fs(e)) => Err(e),
                Err(OpError::Fatal(msg)) => return Err(msg),
            },
        };
        // A refusal that hands the operation to the cross-node protocol is
        // not its outcome: the protocol records the outcome later.
        // Nor is one that waits for its file to move (`namespace::moving`).
        let handed_over = matches!(&r, Err(e) if is_needs_protocol(e) || is_moving(e));
        if let (Some(op), false) = (&op, handed_over) {
            replies::put(&mut t.replies, op, now_ms, &r, &mut reply_floor)?;
        }
        results.push((r, std::mem::take(&mut t.touched)));
    }
    let (files_delta, dirs_delta, wake) = (ctx.files_delta, ctx.dirs_delta, ctx.disposal_queued);
    st.epoch = ctx.epoch;
    st.reply_floor = reply_floor;
    st.counter = counter;
    if sweep_due {
        replies::sweep(&mut t.replies, now_ms, &mut st.reply_sweep.0)?;
        st.reply_sweep.1 = now_ms;
    }
    if st.epoch > st.epoch_saved {
        // Ids of the new epoch are in this batch: a restart must start beyond it.
        sys_put(&mut t.system, sys::EPOCH, u64::from(st.epoch)).map_err(fatal)?;
    }
    for (key, d) in [(sys::FILES, files_delta), (sys::DIRS, dirs_delta)] {
        if d != 0 {
            let v = sys_get(&t.system, key).map_err(fatal)?;
            let v = if d >= 0 { v.saturating_add(d as u64) } else { v.saturating_sub(d.unsigned_abs()) };
            sys_put(&mut t.system, key, v).map_err(fatal)?;
        }
    }
    Ok(wake)
}
