//! Committing batches: the journal append, then the memory layers; and
//! the background checkpoints that move the memory layers into the store.
//!
//! Owns the order that makes a batch durable before it is visible and a
//! checkpoint durable before journal segments go. It must not be used by
//! anything but the writer (and the offline edits of a stopped node).

use super::journal::{self, AppendError, Journal};
use super::mem::{encode_changes, Map, Maps, Mem, NT};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use tracing::{debug, error, info};

/// Default journal size at which a checkpoint starts.
pub const DEFAULT_CHECKPOINT_BYTES: u64 = 16 << 20;
/// The least `checkpoint_bytes` a service may be configured with (tests
/// and simulations set less on the [`Log`] itself).
pub const MIN_CHECKPOINT_BYTES: u64 = 64 << 10;

/// Test hook (`HIVEFS_CRASH_AT`, as for the cross-node steps): aborts the
/// process at `journal:appended` (a batch is in the journal, not yet
/// visible or answered), `checkpoint:commit` (a checkpoint's pages are
/// written, the store not yet committed) or `checkpoint:committed` (the
/// store has it, journal segments not yet deleted).
fn crash_point(point: &str) {
    static AT: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    let at = AT.get_or_init(|| std::env::var(super::CRASH_ENV).ok().filter(|s| !s.is_empty()));
    if at.as_deref() == Some(point) {
        error!("{}={point}: aborting", super::CRASH_ENV);
        std::process::abort();
    }
}

/// The own part of a mirrored commit: the journal append and the memory
/// layers; the checksum of the appended record.
pub type Local<'a> = &'a mut (dyn FnMut() -> Result<u32, AppendError> + Send);

/// The future of [`Replicate::commit`].
pub type CommitFut<'a> = std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), AppendError>> + Send + 'a>>;

/// Where a mirrored namespace's records go before its own journal (buddy
/// mirroring, `crate::mirror`): the hook sends the record to the secondary,
/// or notes that the secondary misses it, and runs `local` (the journal
/// append and the memory layers), holding whatever keeps a resync's
/// snapshot apart from commits. Asynchronous, so that a commit waiting for
/// the secondary holds no thread in a simulation (`crates/sim`) and can run
/// in any task.
pub trait Replicate: Send + Sync {
    fn commit<'a>(&'a self, seq: u64, body: &'a [u8], local: Local<'a>) -> CommitFut<'a>;
}

/// Runs a commit to its end from synchronous code: at once when it needs
/// nothing but this thread (no mirror hook, or a hook that did not wait),
/// else on the runtime this thread is in (the writer's commits under
/// `block_in_place` with `sync = true`, blocking-pool threads). A mirrored commit outside any
/// runtime is a bug.
pub fn run_to_end<F: std::future::Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) {
        return v;
    }
    match tokio::runtime::Handle::try_current() {
        Ok(h) => h.block_on(f),
        Err(_) => panic!("a mirrored metadata commit waited outside the tokio runtime"),
    }
}

/// The journal's last batch and the mirroring hook, shared with whoever
/// installs the hook while the writer runs: every commit holds `hook`'s
/// lock (asynchronous: a mirrored commit holds it while it waits for the
/// secondary), so an installation happens between two commits and sees the
/// last.
pub struct Tip {
    hook: tokio::sync::Mutex<Option<std::sync::Arc<dyn Replicate>>>,
    seq: AtomicU64,
    /// Checksum of batch `seq` (u64::MAX: not known).
    crc: AtomicU64,
    /// Checkpoints keep the journal segments from the one holding this batch
    /// on (a mirror's secondary is behind and resyncs from them); u64::MAX
    /// (the default, see `Tip::new`): none kept.
    keep: AtomicU64,
    /// The first batch of each segment started in this run.
    seg_first: std::sync::Mutex<std::collections::BTreeMap<u64, u64>>,
}

/// Most bytes of journal segments kept for a secondary that is behind;
/// beyond, it gets a full copy when it returns.
pub const KEEP_MAX_BYTES: u64 = 1 << 30;

impl Tip {
    fn new() -> Tip {
        Tip {
            hook: Default::default(),
            seq: AtomicU64::new(0),
            crc: AtomicU64::new(u64::MAX),
            keep: AtomicU64::new(u64::MAX),
            seg_first: Default::default(),
        }
    }

    /// Keep the journal from batch `seq` on (or from an earlier batch already
    /// kept for).
    pub fn keep_from(&self, seq: u64) {
        self.keep.fetch_min(seq, Ordering::AcqRel);
    }

    /// Keep no journal segments for a secondary any more (it is current).
    pub fn keep_none(&self) {
        self.keep.store(u64::MAX, Ordering::Release);
    }

    /// The first segment checkpoints must keep (`None`: none), given the
    /// segments and their sizes below the one a checkpoint may delete to.
    fn keep_segment(&self, dir: &std::path::Path, below: u64) -> Option<u64> {
        let keep = self.keep.load(Ordering::Acquire);
        if keep == u64::MAX {
            return None;
        }
        let firsts = self.seg_first.lock().expect("segments");
        // The last segment starting at or before `keep`; segments of an earlier
        // run (not in the map) come before every known one and are kept too.
        let seg = match firsts.range(..).rev().find(|(_, first)| **first <= keep) {
            Some((seg, _)) => *seg,
            None => 0,
        };
        drop(firsts);
        let bytes: u64 = journal::segment_sizes(dir).iter().filter(|(n, _)| *n >= seg && *n < below).map(|x| x.1).sum();
        if bytes > KEEP_MAX_BYTES {
            self.keep.store(u64::MAX, Ordering::Release);
            tracing::warn!(
                journal = %dir.display(),
                bytes,
                "journal kept for a mirror's secondary passed {KEEP_MAX_BYTES} bytes: deleted; it gets a full copy"
            );
            return None;
        }
        Some(seg)
    }

    /// Installs the hook made by `make` from the last batch and its checksum.
    pub async fn install(&self, make: impl FnOnce((u64, Option<u32>)) -> std::sync::Arc<dyn Replicate>) {
        let mut h = self.hook.lock().await;
        *h = Some(make(self.last()));
    }

    /// Removes the hook (the namespace is served unmirrored again).
    pub async fn uninstall(&self) {
        *self.hook.lock().await = None;
    }

    pub fn last(&self) -> (u64, Option<u32>) {
        let crc = self.crc.load(Ordering::Acquire);
        (self.seq.load(Ordering::Acquire), (crc != u64::MAX).then_some(crc as u32))
    }

    fn set(&self, seq: u64, crc: Option<u32>) {
        self.seq.store(seq, Ordering::Release);
        self.crc.store(crc.map_or(u64::MAX, u64::from), Ordering::Release);
    }
}

/// A checkpoint to run: the frozen layer, the last batch in it, and the
/// first journal segment not in it.
struct Job {
    frozen: Arc<Maps>,
    seq: u64,
    /// Checksum of batch `seq`.
    crc: Option<u32>,
    next_segment: u64,
}

/// State shared with the checkpoint thread.
struct Shared {
    mem: Arc<Mem>,
    dir: PathBuf,
    running: AtomicBool,
    /// Bytes of the store's file in use after the last checkpoint.
    used: AtomicU64,
    /// Set when a checkpoint failed: the store cannot take more (see `Log::failed`).
    failed: AtomicBool,
    tip: Arc<Tip>,
}

/// The writer's way to commit: journal and memory layers, and checkpoints.
pub struct Log {
    pub mem: Arc<Mem>,
    journal: Journal,
    shared: Arc<Shared>,
    /// `None`: checkpoints run in the committing thread (simulations, tests).
    thread: Option<(std::sync::mpsc::Sender<Job>, std::thread::JoinHandle<()>)>,
    /// Journal bytes at which a checkpoint starts.
    pub checkpoint_bytes: u64,
    /// Whether the crash hooks fire (from the writer's start on: the
    /// batches of opening the store never abort).
    armed: bool,
    /// The last batch, and the hook of a mirrored namespace's primary.
    tip: Arc<Tip>,
}

impl Log {
    pub(super) fn new(mem: Arc<Mem>, journal: Journal) -> Log {
        let tip = Arc::new(Tip::new());
        tip.set(journal.last_seq(), journal.last_crc());
        tip.seg_first.lock().expect("segments").insert(journal.segment(), journal.last_seq() + 1);
        let shared = Arc::new(Shared {
            mem: mem.clone(),
            dir: journal.dir().to_path_buf(),
            running: AtomicBool::new(false),
            used: AtomicU64::new(u64::MAX),
            failed: AtomicBool::new(false),
            tip: tip.clone(),
        });
        Log { mem, journal, shared, thread: None, checkpoint_bytes: DEFAULT_CHECKPOINT_BYTES, armed: false, tip }
    }

    /// Runs checkpoints on a thread of their own from now on, and arms the
    /// crash hooks.
    pub fn spawn_checkpointer(&mut self) -> std::io::Result<()> {
        self.armed = true;
        let (tx, rx) = std::sync::mpsc::channel::<Job>();
        let shared = self.shared.clone();
        let h = std::thread::Builder::new().name("meta-checkpoint".into()).spawn(move || {
            while let Ok(job) = rx.recv() {
                run(&shared, job);
            }
        })?;
        self.thread = Some((tx, h));
        Ok(())
    }

    /// [`Log::commit_async`] from synchronous code (see [`run_to_end`]).
    pub fn commit(&mut self, changes: [Map; NT]) -> Result<(), AppendError> {
        run_to_end(self.commit_async(changes))
    }

    /// Appends the changes as one journal record and then makes them
    /// visible (on a mirrored primary: after the secondary has the record).
    /// Nothing changed: nothing is written. Waits only on a mirrored
    /// primary (for the secondary, and for mgmtd when that fails).
    pub async fn commit_async(&mut self, changes: [Map; NT]) -> Result<(), AppendError> {
        if changes.iter().all(Map::is_empty) {
            return Ok(());
        }
        let tip = self.tip.clone();
        let hook = tip.hook.lock().await;
        if let Some(r) = hook.as_ref() {
            let mut body = Vec::new();
            encode_changes(&changes, &mut body);
            let seq = self.journal.last_seq() + 1;
            let mut changes = Some(changes);
            let (journal, mem, armed) = (&mut self.journal, &self.mem, self.armed);
            let body_ref = &body;
            r.commit(seq, &body, &mut || {
                journal.append(|b| b.extend_from_slice(body_ref))?;
                if armed {
                    crash_point("journal:appended");
                }
                if let Some(c) = changes.take() {
                    mem.apply(c);
                }
                Ok(journal.last_crc().unwrap_or_default())
            })
            .await?;
        } else {
            self.journal.append(|b| encode_changes(&changes, b))?;
            if self.armed {
                crash_point("journal:appended");
            }
            self.mem.apply(changes);
        }
        tip.set(self.journal.last_seq(), self.journal.last_crc());
        Ok(())
    }

    /// A record from the primary (a mirrored namespace's secondary): appended
    /// with the same sequence number and bytes, then applied. Err with the
    /// last batch held when `seq` does not follow it; a batch already held
    /// is not applied again.
    pub fn commit_record(&mut self, seq: u64, body: &[u8]) -> Result<(), RecordError> {
        let last = self.journal.last_seq();
        if seq == last && self.journal.last_crc() == Some(super::journal::record_crc(seq, body)) {
            // A forward sent again (its answer was lost): held already.
            return Ok(());
        }
        if seq <= last {
            return Err(RecordError::Conflict { have: last });
        }
        if seq != last + 1 {
            return Err(RecordError::Gap { have: last });
        }
        let changes = super::mem::decode_changes(body).map_err(RecordError::Corrupt)?;
        self.journal.append(|b| b.extend_from_slice(body)).map_err(RecordError::Append)?;
        self.mem.apply(changes);
        self.tip.set(self.journal.last_seq(), self.journal.last_crc());
        Ok(())
    }

    /// The last batch and the mirroring hook (kept by whoever serves the
    /// namespace after the writer took the log).
    pub fn tip(&self) -> Arc<Tip> {
        self.tip.clone()
    }

    /// The last batch committed, and its checksum while the journal has it.
    pub fn last(&self) -> (u64, Option<u32>) {
        (self.journal.last_seq(), self.journal.last_crc())
    }

    /// The journal's directory.
    pub fn journal_dir(&self) -> &std::path::Path {
        self.journal.dir()
    }

    /// Starts a checkpoint when the journal has grown to `checkpoint_bytes`
    /// or to `limit` (less: the disk is filling up), unless one is running.
    pub fn maybe_checkpoint(&mut self, limit: u64) {
        let pending = self.journal.pending_bytes();
        // A filling disk checkpoints early, but not after every batch.
        let want = self.checkpoint_bytes.min(limit.max(MIN_CHECKPOINT_BYTES));
        if pending < want || self.shared.running.load(Ordering::Acquire) {
            return;
        }
        self.checkpoint_now();
    }

    /// Starts a checkpoint of everything journaled so far (waits for it
    /// without a checkpoint thread). False if one is running or it could
    /// not start.
    pub fn checkpoint_now(&mut self) -> bool {
        if self.shared.failed.load(Ordering::Acquire) || self.shared.running.swap(true, Ordering::AcqRel) {
            return false;
        }
        // Rotate first: if that fails, nothing was frozen and the records
        // stay in `live`.
        let next_segment = match self.journal.rotate() {
            Ok(n) => {
                self.tip.seg_first.lock().expect("segments").insert(n, self.journal.last_seq() + 1);
                n
            }
            Err(e) => {
                error!("metadata journal: cannot start a new segment for a checkpoint: {e}");
                self.shared.running.store(false, Ordering::Release);
                return false;
            }
        };
        let Some(frozen) = self.mem.freeze() else {
            self.shared.running.store(false, Ordering::Release);
            return false;
        };
        let job = Job { frozen, seq: self.journal.last_seq(), crc: self.journal.last_crc(), next_segment };
        match &self.thread {
            Some((tx, _)) => {
                if let Err(std::sync::mpsc::SendError(job)) = tx.send(job) {
                    run(&self.shared, job);
                }
            }
            None => run(&self.shared, job),
        }
        true
    }

    /// Bytes of the store's file in use after the last checkpoint (`None`
    /// before the first).
    pub fn store_used(&self) -> Option<u64> {
        Some(self.shared.used.load(Ordering::Relaxed)).filter(|u| *u != u64::MAX)
    }

    /// A checkpoint failed: the store must be opened again (the journal
    /// still holds everything), so the service should stop.
    pub fn failed(&self) -> bool {
        self.shared.failed.load(Ordering::Acquire)
    }

    /// Whether a commit waits for the disk (`sync = true`: an fdatasync per batch).
    pub fn syncs(&self) -> bool {
        self.journal.syncs()
    }
}

/// Why a record from the primary was not taken.
#[derive(Debug)]
pub enum RecordError {
    /// It does not follow the last batch held (`have`): a resync is needed.
    Gap {
        have: u64,
    },
    /// This copy already holds a batch of that number, not that one: the
    /// two histories differ from there (a full copy is needed).
    Conflict {
        have: u64,
    },
    Corrupt(String),
    Append(AppendError),
}

impl std::fmt::Display for RecordError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RecordError::Gap { have } => write!(f, "out of order: this buddy holds batches up to {have}"),
            RecordError::Conflict { have } => {
                write!(f, "a different batch of that number is held (up to {have}): the copies differ")
            }
            RecordError::Corrupt(m) => write!(f, "undecodable record: {m}"),
            RecordError::Append(e) => write!(f, "journal write: {e}"),
        }
    }
}

impl Drop for Log {
    fn drop(&mut self) {
        if let Some((tx, h)) = self.thread.take() {
            drop(tx);
            // Finishes a running checkpoint (the journal has its records
            // anyway; this only saves replaying them).
            let _ = h.join();
        }
    }
}

fn run(s: &Shared, job: Job) {
    let t0 = std::time::Instant::now();
    let records = job.frozen.records;
    match s.mem.write_checkpoint(&job.frozen, job.seq, job.crc, &|| crash_point("checkpoint:commit")) {
        Ok(used) => {
            crash_point("checkpoint:committed");
            s.mem.unfreeze();
            s.used.store(used, Ordering::Relaxed);
            // A mirror's secondary that is behind resyncs from kept segments.
            let upto = match s.tip.keep_segment(&s.dir, job.next_segment) {
                Some(k) => k.min(job.next_segment),
                None => job.next_segment,
            };
            s.tip.seg_first.lock().expect("segments").retain(|n, _| *n >= upto);
            if let Err(e) = journal::remove_before(&s.dir, upto) {
                // Harmless: replay skips batches the store already holds.
                error!("metadata journal {}: deleting checkpointed segments: {e}", s.dir.display());
            }
            let ms = t0.elapsed().as_millis();
            if ms > 1000 {
                info!(records, batch = job.seq, ms, "metadata checkpoint written");
            } else {
                debug!(records, batch = job.seq, ms, "metadata checkpoint written");
            }
            s.running.store(false, Ordering::Release);
        }
        Err(e) => {
            // The frozen layer stays (reads remain right) and the journal
            // keeps every record; the store refuses further commits until
            // it is opened again.
            error!(
                "metadata store failure: checkpoint of {records} records up to journal batch {} failed: {e}; \
                 the journal keeps them, restart the service",
                job.seq
            );
            s.failed.store(true, Ordering::Release);
        }
    }
}
