//! Buddy mirroring on a storage node (`docs/design-mirror.md`).
//!
//! Owns, per target: the store of mirrored chunk files (`<target>/mirror/`),
//! the dirty list (entries the secondary misses, `<target>/mirror/dirty`),
//! the entries recently forwarded to it as a secondary, and the per-entry
//! locks that keep a resync copy and a write apart; for the node: the lease
//! from mgmtd and the roles it had at the last look.
//!
//! As primary it forwards every change to the secondary before applying it,
//! degrades the group (with mgmtd's agreement) when that fails, and resyncs
//! a returning secondary; as secondary it applies forwards of the current
//! epoch only. It must not decide roles: mgmtd does, this module reads them.

use crate::Ready;
use crate::{Disk, Store};
use bytes::Bytes;
use hivefs_cluster::Cluster;
use hivefs_net::Call;
use hivefs_proto::{Consistency, Envelope, GroupInfo, MirrorHdr, MirrorRole, Reply, Request, Response};
use hivefs_types::error::FsResult;
use hivefs_types::fs_err;
use hivefs_types::ids::{BuddyGroupId, EntryId, NodeId, TargetId};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::task::AbortHandle;
// tokio's clock: the real one in the service, the simulation's paused one in `hivefs-sim`.
use tokio::time::Instant;
use tracing::{debug, error, info, warn};

/// The directory of a target holding mirrored chunk files (as `chunks/` below it).
pub const MIRROR_DIR: &str = "mirror";
/// The dirty list inside [`MIRROR_DIR`]: one entry id per line.
pub const DIRTY_FILE: &str = "dirty";
/// Written inside [`MIRROR_DIR`] at a target's first start: a later start
/// knows forwards may have reached it before.
pub const STARTED_FILE: &str = "started";
/// This target's mirroring session as a secondary, inside [`MIRROR_DIR`] (a number).
pub const SESSION_FILE: &str = "session";
/// Entry lock stripes per target.
const LOCK_STRIPES: usize = 64;
/// Most entries remembered as recently forwarded; beyond, a promotion asks
/// for a full resync.
const RECENT_MAX: usize = 1 << 20;
/// A mirrored chunk is handed to a reader on this host only while the lease
/// lasts at least this long (a shorter time would cost a request per read).
const HANDOUT_MIN: Duration = Duration::from_millis(200);
/// The steps of the mirroring protocol where a simulation may stop a node
/// (`StorageService::halt_at`): a primary with the secondary's answer to a
/// forward, before its own change; a secondary with a forward applied,
/// before its answer; a degrade with the entries marked dirty, before
/// mgmtd is told; a resync that has set the secondary resyncing, that has
/// copied an entry (before taking it off the dirty list), and that has
/// copied everything (before asking mgmtd for good); a new primary that
/// noticed its promotion, before it marks the recent entries dirty.
pub const STEPS: [&str; 7] = [
    "forward:answered",
    "forward:applied",
    "degrade:marked",
    "resync:started",
    "resync:copied",
    "resync:done",
    "promoted:noticed",
];
/// Bytes copied per request during a resync.
const RESYNC_PIECE: u64 = 4 << 20;
/// Default of `mirror_forward_timeout_ms`: a forward to the secondary that
/// takes longer fails (and degrades the group); below the clients' I/O
/// timeout, so they see the degraded write succeed instead of timing out.
pub const FORWARD_TIMEOUT: Duration = Duration::from_secs(10);

struct Recent {
    entries: VecDeque<(Instant, EntryId)>,
    /// More than [`RECENT_MAX`] within the window: the list is incomplete.
    overflowed: bool,
    /// When this node started: the list knows nothing from before, so it is
    /// incomplete until a whole window has passed since, unless this is the
    /// target's first start (nothing was forwarded to it before).
    started: Instant,
    first_start: bool,
}

/// Mirroring state of one target.
pub(crate) struct TargetMirror {
    target: TargetId,
    store: Store,
    dirty: Mutex<BTreeSet<EntryId>>,
    dirty_path: PathBuf,
    recent: Mutex<Recent>,
    locks: Vec<tokio::sync::RwLock<()>>,
    resyncing: AtomicBool,
    /// As primary, this target sends every change to its secondary: set by
    /// a resync before it reads the dirty list, cleared when a forward fails
    /// and on a change of role. (A resync checks it to notice a failed forward.)
    forwarding: AtomicBool,
    /// Whether this primary may apply a change without forwarding it (and
    /// mark it dirty instead): only while mgmtd is known to hold the
    /// secondary as needing a resync, so that it never promotes a copy that
    /// misses an acknowledged change. `(generation << 1) | skip`: the skip
    /// bit is set by a degrade that mgmtd confirmed, or at a promotion
    /// (mgmtd's switch marks the old primary needs-resync); every resync
    /// step that may make the secondary good at mgmtd moves the generation
    /// on and clears the bit first, and a confirmation that arrives after
    /// such a step sets nothing. A group view alone never decides to skip:
    /// it may be older than mgmtd's state (a resync sets it good).
    skip: std::sync::atomic::AtomicU64,
    /// As secondary: the current mirroring session (`Request::MirrorFence`)
    /// and its file; forwards and resync requests of another are refused.
    session: std::sync::atomic::AtomicU64,
    session_path: PathBuf,
    /// Held shared while a forward or resync request is checked and applied,
    /// exclusively while a fence starts a new session: once a fence has
    /// answered, no request of an older session runs or will run here.
    session_lock: tokio::sync::RwLock<()>,
    /// As primary: the session its secondary gave it (0: none, fence first;
    /// a fence never answers 0). Dropped when a forward or a resync fails:
    /// the failed request may still land at the secondary.
    held: std::sync::atomic::AtomicU64,
    /// One fence at a time: concurrent first forwards share one session.
    fencing: tokio::sync::Mutex<()>,
}

impl TargetMirror {
    fn open(target: TargetId, dir: &Path, disk: &Disk) -> std::io::Result<TargetMirror> {
        let root = dir.join(MIRROR_DIR);
        std::fs::create_dir_all(root.join(hivefs_chunk::CHUNKS_DIR))?;
        let dirty_path = root.join(DIRTY_FILE);
        let mut dirty = BTreeSet::new();
        match std::fs::read_to_string(&dirty_path) {
            Ok(s) => {
                for line in s.lines().filter(|l| !l.is_empty()) {
                    match EntryId::parse(line) {
                        Some(e) => {
                            dirty.insert(e);
                        }
                        None => warn!(%target, "{}: {line:?} is not an entry id; skipped", dirty_path.display()),
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        if !dirty.is_empty() {
            info!(%target, entries = dirty.len(), "mirrored chunks the buddy misses, from {}", dirty_path.display());
        }
        let started_path = root.join(STARTED_FILE);
        let first_start = !started_path.exists();
        if first_start {
            hivefs_cluster::write_atomic(&started_path, b"")?;
        }
        let session_path = root.join(SESSION_FILE);
        let session = match std::fs::read_to_string(&session_path) {
            Ok(s) => s.trim().parse::<u64>().map_err(|e| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("{}: {s:?} is not a session number: {e}", session_path.display()),
                )
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
            Err(e) => return Err(e),
        };
        Ok(TargetMirror {
            target,
            store: disk.open(target, &root),
            dirty: Mutex::new(dirty),
            dirty_path,
            recent: Mutex::new(Recent {
                entries: VecDeque::new(),
                overflowed: false,
                started: Instant::now(),
                first_start,
            }),
            locks: (0..LOCK_STRIPES).map(|_| tokio::sync::RwLock::new(())).collect(),
            resyncing: AtomicBool::new(false),
            forwarding: AtomicBool::new(false),
            skip: std::sync::atomic::AtomicU64::new(0),
            session: std::sync::atomic::AtomicU64::new(session),
            session_path,
            session_lock: tokio::sync::RwLock::new(()),
            held: std::sync::atomic::AtomicU64::new(0),
            fencing: tokio::sync::Mutex::new(()),
        })
    }

    /// As secondary: starts a new session (after every request of the
    /// current one has finished) and persists it.
    async fn fence(&self) -> FsResult<u64> {
        let _all = self.session_lock.write().await;
        let next = self.session.load(Ordering::SeqCst) + 1;
        let path = self.session_path.clone();
        crate::blocking(move || {
            hivefs_cluster::write_atomic(&path, format!("{next}\n").as_bytes())
                .map_err(|e| fs_err!(Io, "writing {}: {e}", path.display()))
        })
        .await?;
        self.session.store(next, Ordering::SeqCst);
        Ok(next)
    }

    /// Whether a change may skip its forward (see `skip`).
    fn may_skip_forward(&self) -> bool {
        !self.forwarding.load(Ordering::SeqCst) && self.skip.load(Ordering::SeqCst) & 1 == 1
    }

    /// The skip generation now, to confirm a degrade against.
    fn skip_generation(&self) -> u64 {
        self.skip.load(Ordering::SeqCst) >> 1
    }

    /// mgmtd confirmed the secondary needs a resync: changes may skip their
    /// forwards, unless a resync step came between (`seen` is older).
    fn confirm_skip(&self, seen: u64) {
        let _ = self.skip.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |s| (s >> 1 == seen).then_some(s | 1));
    }

    /// A step that may make the secondary good at mgmtd: forward from now on.
    fn new_skip_generation(&self, skip: bool) {
        let _ = self
            .skip
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |s| Some((((s >> 1) + 1) << 1) | u64::from(skip)));
    }

    fn lock(&self, e: EntryId) -> &tokio::sync::RwLock<()> {
        &self.locks[usize::from(e.hash_dir()) % LOCK_STRIPES]
    }

    /// Waits until every change that holds an entry lock now has finished
    /// (a change decides whether to forward while it holds its lock).
    async fn drain_changes(&self) {
        for l in &self.locks {
            drop(l.write().await);
        }
    }

    /// Adds entries to the dirty list, appending the new ones to its file
    /// before the change they stand for is applied (not fsynced: it survives
    /// a crash of the process; after a power loss, ask for a full resync).
    /// An append starts a new line: the torn end of one that failed (a full
    /// disk) stays a line of its own instead of spoiling the next entry.
    fn mark_dirty(&self, entries: &[EntryId]) -> FsResult<()> {
        let mut d = self.dirty.lock().expect("dirty lock");
        let new: Vec<EntryId> = entries.iter().copied().filter(|e| !d.contains(e)).collect();
        if new.is_empty() {
            return Ok(());
        }
        let mut text = String::from("\n");
        for e in &new {
            text.push_str(&e.to_string());
            text.push('\n');
        }
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.dirty_path)
            .and_then(|mut f| f.write_all(text.as_bytes()))
            .map_err(|e| fs_err!(Io, "target {}: appending to {}: {e}", self.target, self.dirty_path.display()))?;
        d.extend(new);
        Ok(())
    }

    /// Rewrites the dirty list's file from memory (after a resync).
    fn persist_dirty(&self) -> FsResult<()> {
        let d = self.dirty.lock().expect("dirty lock");
        let text: String = d.iter().map(|e| format!("{e}\n")).collect();
        hivefs_cluster::write_atomic(&self.dirty_path, text.as_bytes())
            .map_err(|e| fs_err!(Io, "target {}: writing {}: {e}", self.target, self.dirty_path.display()))
    }

    fn note_recent(&self, entries: &[EntryId], window: Duration) {
        let now = Instant::now();
        let mut r = self.recent.lock().expect("recent lock");
        while r.entries.front().is_some_and(|(t, _)| now.duration_since(*t) > window) {
            r.entries.pop_front();
        }
        for &e in entries {
            if r.entries.len() >= RECENT_MAX {
                r.entries.pop_front();
                r.overflowed = true;
            }
            r.entries.push_back((now, e));
        }
    }
}

/// Mirroring state of this node.
pub(crate) struct Mirror {
    node: NodeId,
    mgmt: Arc<dyn Call>,
    /// For the group view and the buddies (forward timeout [`FORWARD_TIMEOUT`]).
    cluster: Arc<Cluster>,
    targets: BTreeMap<TargetId, Arc<TargetMirror>>,
    /// Until when this node may act as a primary, and the last lease length.
    lease: Mutex<(Option<Instant>, Duration)>,
    /// Per group of this node: (epoch, this node was primary) at the last look.
    roles: Mutex<BTreeMap<BuddyGroupId, (u64, bool)>>,
    /// An [`Mirror::after_heartbeat`] runs.
    looking: AtomicBool,
    /// Tasks this node started (role looks, resyncs), stopped with the service.
    tasks: Mutex<Vec<AbortHandle>>,
    /// A simulation's crash point: the task reaching this step stops there
    /// for good and the notify fires ([`STEPS`]).
    halt: Mutex<Option<(String, Arc<tokio::sync::Notify>)>>,
    armed: AtomicBool,
}

impl Mirror {
    pub fn open(
        node: NodeId,
        mgmt: Arc<dyn Call>,
        cluster: Arc<Cluster>,
        targets: &[(TargetId, PathBuf)],
        disk: &Disk,
    ) -> Result<Mirror, crate::StorageError> {
        let mut m = BTreeMap::new();
        for (t, dir) in targets {
            let tm = TargetMirror::open(*t, dir, disk).map_err(|e| crate::StorageError::io(dir.join(MIRROR_DIR), e))?;
            m.insert(*t, Arc::new(tm));
        }
        Ok(Mirror {
            node,
            mgmt,
            cluster,
            targets: m,
            lease: Mutex::new((None, Duration::ZERO)),
            roles: Mutex::new(BTreeMap::new()),
            looking: AtomicBool::new(false),
            tasks: Mutex::default(),
            halt: Mutex::default(),
            armed: AtomicBool::new(false),
        })
    }

    /// Makes the first task that reaches `step` stop there for good and fire `notify`.
    pub fn halt_at(&self, step: &str, notify: Arc<tokio::sync::Notify>) {
        *self.halt.lock().expect("halt lock") = Some((step.to_string(), notify));
        self.armed.store(true, Ordering::SeqCst);
    }

    /// A step of the protocol ([`STEPS`]): where [`Mirror::halt_at`] stops a task.
    async fn step(&self, name: &str) {
        if !self.armed.load(Ordering::Relaxed) {
            return;
        }
        let hit = {
            let mut h = self.halt.lock().expect("halt lock");
            match &*h {
                Some((s, _)) if s == name => h.take(),
                _ => None,
            }
        };
        if let Some((_, notify)) = hit {
            self.armed.store(false, Ordering::SeqCst);
            notify.notify_one();
            std::future::pending::<()>().await;
        }
    }

    /// Runs `fut` as a task of this node: [`Mirror::stop_tasks`] stops it.
    fn spawn(&self, fut: impl std::future::Future<Output = ()> + Send + 'static) {
        let h = tokio::spawn(fut);
        let mut t = self.tasks.lock().expect("tasks lock");
        t.retain(|h| !h.is_finished());
        t.push(h.abort_handle());
    }

    /// Stops every task of this node (the service stops).
    pub fn stop_tasks(&self) {
        for h in self.tasks.lock().expect("tasks lock").drain(..) {
            h.abort();
        }
    }

    pub fn store(&self, target: TargetId) -> Option<Store> {
        self.targets.get(&target).map(|t| t.store.clone())
    }

    /// mgmtd answered a heartbeat sent at `sent` with a lease of `lease_ms`.
    pub fn renew(&self, sent: Instant, lease_ms: u64) {
        let len = Duration::from_millis(lease_ms);
        *self.lease.lock().expect("lease lock") = (Some(sent + len), len);
    }

    fn lease_valid(&self) -> bool {
        self.lease_left().is_some()
    }

    /// How long the lease from mgmtd lasts from now (`None`: none is held).
    fn lease_left(&self) -> Option<Duration> {
        let until = self.lease.lock().expect("lease lock").0?;
        until.checked_duration_since(Instant::now()).filter(|d| !d.is_zero())
    }

    /// A mirrored chunk of `target` for a reader on this host (short-circuit):
    /// read-only, and only while `target` is `group`'s primary at `epoch`
    /// and holds the lease, with how long that lasts. mgmtd switches a group
    /// over only after its primary was silent for longer than a lease, so a
    /// reader that stops at the end of this time never reads a copy that has
    /// stopped being the primary's.
    pub fn open_to_read(
        &self,
        target: TargetId,
        entry: EntryId,
        group: BuddyGroupId,
        epoch: u64,
    ) -> FsResult<(hivefs_chunk::local::Offer, Duration)> {
        use hivefs_chunk::local::Offer;
        let Some(tm) = self.targets.get(&target) else {
            let why = format!("target {target} is not served by storage node {}", self.node);
            return Ok((Offer::Refused(why), Duration::ZERO));
        };
        let primary = self.cluster.view().groups.get(&group).is_some_and(|g| g.epoch == epoch && g.primary == target.0);
        if !primary {
            return Err(fs_err!(
                Unavailable,
                "storage target {target} (node {}) is not the primary of buddy group {group} at epoch {epoch}",
                self.node
            ));
        }
        let Some(left) = self.lease_left().filter(|d| *d >= HANDOUT_MIN) else {
            return Err(fs_err!(
                Unavailable,
                "storage node {} holds no lease from mgmtd long enough to hand out buddy group {group}'s chunks",
                self.node
            ));
        };
        let offer = match tm.store.open_readonly(entry)? {
            Some(f) => Offer::File(f),
            None => Offer::NoChunk,
        };
        Ok((offer, left))
    }

    /// How long a secondary remembers forwarded entries: longer than any
    /// failover can take (`failover_after_ms` is twice the lease).
    fn recent_window(&self) -> Duration {
        let lease = self.lease.lock().expect("lease lock").1;
        (lease * 3).max(Duration::from_secs(10))
    }

    /// The group as mgmtd has it, at least at `epoch` (refreshing once when
    /// unknown or older).
    async fn group(&self, id: BuddyGroupId, epoch: u64) -> FsResult<GroupInfo> {
        if let Some(g) = self.cluster.view().groups.get(&id).filter(|g| g.epoch >= epoch) {
            return Ok(g.clone());
        }
        let v = self.cluster.refresh().await?;
        v.groups.get(&id).cloned().ok_or_else(|| fs_err!(NotFound, "buddy group {id} is not registered with mgmtd"))
    }

    /// Runs [`Mirror::after_heartbeat`] in its own task, unless the last one
    /// still runs; `lease`: the heartbeat sent at this instant was granted a
    /// lease of this many ms.
    pub fn spawn_after_heartbeat(self: &Arc<Self>, lease: Option<(Instant, u64)>) {
        if self.looking.swap(true, Ordering::SeqCst) {
            return;
        }
        let me = self.clone();
        self.spawn(async move {
            me.after_heartbeat(lease).await;
            me.looking.store(false, Ordering::SeqCst);
        });
    }

    /// After each heartbeat: reload the view, take the lease the heartbeat
    /// was granted, notice a promotion (the entries recently forwarded here
    /// become dirty: the old primary may miss them), and start a resync of
    /// every secondary that needs one.
    async fn after_heartbeat(self: &Arc<Self>, lease: Option<(Instant, u64)>) {
        let view = match self.cluster.refresh().await {
            Ok(v) => v,
            Err(e) => {
                debug!("cluster view refresh failed: {e}");
                return;
            }
        };
        // The lease counts only with a view loaded after mgmtd granted it: a
        // group switched over while this node was cut off from mgmtd shows
        // in that view, so the node never serves as a primary it no longer
        // is under a fresh lease (a read from a former primary would return
        // old data).
        if let Some((sent, ms)) = lease {
            self.renew(sent, ms);
        }
        let mine: Vec<GroupInfo> = view
            .groups
            .values()
            .filter(|g| g.kind == hivefs_proto::GroupKind::Storage)
            .filter(|g| {
                self.targets.contains_key(&TargetId(g.primary)) || self.targets.contains_key(&TargetId(g.secondary))
            })
            .cloned()
            .collect();
        for g in mine {
            let primary = self.targets.contains_key(&TargetId(g.primary));
            let before = self.roles.lock().expect("roles lock").insert(g.id, (g.epoch, primary));
            if primary && matches!(before, Some((e, false)) if e < g.epoch) {
                self.promoted(&g).await;
            }
            if !primary {
                if let Some(tm) = self.targets.get(&TargetId(g.secondary)) {
                    tm.forwarding.store(false, Ordering::SeqCst);
                }
            }
            if !primary && !matches!(before, Some((_, false))) {
                // Demoted (or first seen as secondary after a restart): the
                // primary decides what this copy misses; a list kept from an
                // earlier time as primary is stale.
                if let Some(tm) = self.targets.get(&TargetId(g.secondary)) {
                    tm.dirty.lock().expect("dirty lock").clear();
                    if let Err(e) = tm.persist_dirty() {
                        warn!("{e}");
                    }
                }
            }
            let needs =
                matches!(g.secondary_state, Consistency::NeedsResync | Consistency::Resyncing | Consistency::Bad);
            let reachable = view
                .targets
                .get(&TargetId(g.secondary))
                .is_some_and(|t| t.reachability == hivefs_proto::Reachability::Online);
            if primary && needs && reachable && self.lease_valid() {
                let tm = self.targets[&TargetId(g.primary)].clone();
                if !tm.resyncing.swap(true, Ordering::SeqCst) {
                    let me = self.clone();
                    self.spawn(async move {
                        let group = g.id;
                        if let Err(e) = me.resync(&tm, g.clone()).await {
                            // A request of it may still land at the secondary.
                            tm.held.store(0, Ordering::SeqCst);
                            warn!(%group, target = %tm.target, "resync stopped, retried when the secondary is back: {e}");
                            // What is left stays in the dirty list; the member shows it needs it.
                            if let Err(e) = me.set_state(&g, Consistency::NeedsResync).await {
                                debug!(%group, "could not mark the secondary needs-resync again: {e}");
                            }
                        }
                        tm.resyncing.store(false, Ordering::SeqCst);
                    });
                }
            }
        }
    }

    /// This node became `g`'s primary: what was forwarded to it lately may
    /// be missing on the old primary (a write it had not applied yet).
    async fn promoted(&self, g: &GroupInfo) {
        let Some(tm) = self.targets.get(&TargetId(g.primary)) else { return };
        let window = self.recent_window();
        let (entries, overflowed) = {
            let r = tm.recent.lock().expect("recent lock");
            // Started less than a window ago: forwards taken before the start
            // (the old primary may miss them) are not known.
            let incomplete = r.overflowed || (!r.first_start && r.started.elapsed() < window);
            (r.entries.iter().map(|(_, e)| *e).collect::<BTreeSet<_>>(), incomplete)
        };
        self.step("promoted:noticed").await;
        warn!(group = %g.id, target = %tm.target, epoch = g.epoch, recent = entries.len(), "this target is now the primary of its buddy group");
        // The old primary is a secondary that needs a resync (mgmtd's switch
        // made it so at this epoch): only that turns forwarding on.
        tm.forwarding.store(false, Ordering::SeqCst);
        tm.new_skip_generation(g.secondary_state != Consistency::Good);
        // A session from an earlier time as primary: start a new one.
        tm.held.store(0, Ordering::SeqCst);
        if let Err(e) = tm.mark_dirty(&entries.into_iter().collect::<Vec<_>>()) {
            error!("{e}");
        }
        if overflowed {
            warn!(group = %g.id, "the entries forwarded here lately are not all known (a restart or too many): asking for a full resync");
            let req = Request::SetMemberState {
                group: g.id,
                epoch: Some(g.epoch),
                member: g.secondary,
                state: Consistency::Bad,
            };
            if let Err(e) = self.mgmt.rpc(&req).await {
                error!(group = %g.id, "too many recent entries to name: asking for a full resync failed: {e}");
            }
        }
    }

    /// The session this (primary) target holds with `g`'s secondary: the
    /// one it has, else a new one from a fence. Every request of a session
    /// this target still holds has been answered or is still awaited by its
    /// sender: one that failed dropped the session.
    async fn session(&self, tm: &TargetMirror, g: &GroupInfo) -> FsResult<u64> {
        let held = || Some(tm.held.load(Ordering::SeqCst)).filter(|&s| s != 0);
        if let Some(s) = held() {
            return Ok(s);
        }
        let _one = tm.fencing.lock().await;
        if let Some(s) = held() {
            return Ok(s);
        }
        let sec = TargetId(g.secondary);
        let env = Envelope {
            mirror: Some(MirrorHdr { group: g.id, epoch: g.epoch, role: MirrorRole::Resync, session: 0 }),
            ..Envelope::default()
        };
        let pool = self.cluster.group_target_pool(sec).await?;
        match pool.call_with(&env, &Request::MirrorFence { target: sec }, Bytes::new()).await?.0 {
            Reply::Fenced { session } => {
                tm.held.store(session, Ordering::SeqCst);
                Ok(session)
            }
            r => Err(fs_err!(Protocol, "target {sec}: odd MirrorFence reply {r:?}")),
        }
    }

    async fn set_state(&self, g: &GroupInfo, state: Consistency) -> FsResult<()> {
        let req = Request::SetMemberState { group: g.id, epoch: Some(g.epoch), member: g.secondary, state };
        self.mgmt.rpc(&req).await.map(|_| ())
    }

    /// Brings `g`'s secondary up to date from this (primary) target: every
    /// entry of the dirty list (all mirrored chunks for a full resync) is
    /// copied, or deleted where this target has none.
    async fn resync(&self, tm: &TargetMirror, g: GroupInfo) -> FsResult<()> {
        let full = g.secondary_state == Consistency::Bad;
        let sec = TargetId(g.secondary);
        tm.new_skip_generation(false);
        self.set_state(&g, Consistency::Resyncing).await?;
        // From here every change is forwarded; a change that decided not to
        // forward before this has marked its entries dirty once it lets go of
        // its lock, so the dirty list read after the drain is complete.
        tm.forwarding.store(true, Ordering::SeqCst);
        tm.drain_changes().await;
        // A session no failed request belongs to: requests of earlier
        // resyncs and forwards that failed, still on their way or running at
        // the secondary, can no longer land after this resync's copies.
        let session = self.session(tm, &g).await?;
        self.step("resync:started").await;
        let pool = self.cluster.group_target_pool(sec).await?;
        let env = Envelope {
            mirror: Some(MirrorHdr { group: g.id, epoch: g.epoch, role: MirrorRole::Resync, session }),
            ..Envelope::default()
        };
        if full {
            let mut after = None;
            loop {
                let store = tm.store.clone();
                let (page, more) = crate::blocking(move || store.list(after, 4096)).await?;
                tm.mark_dirty(&page.iter().map(|(e, _)| *e).collect::<Vec<_>>())?;
                after = page.last().map(|(e, _)| *e);
                if !more {
                    break;
                }
            }
            // The secondary's own chunks: those this target lacks are deleted.
            let mut after = None;
            loop {
                let req = Request::ListChunks { target: sec, after, max: 4096 };
                let (page, more) = match pool.call_with(&env, &req, Bytes::new()).await?.0 {
                    Reply::Chunks { chunks, more } => (chunks, more),
                    r => return Err(fs_err!(Protocol, "target {sec}: odd ListChunks reply {r:?}")),
                };
                tm.mark_dirty(&page.iter().map(|(e, _)| *e).collect::<Vec<_>>())?;
                after = page.last().map(|(e, _)| *e);
                if !more {
                    break;
                }
            }
        }
        let todo: Vec<EntryId> = tm.dirty.lock().expect("dirty lock").iter().copied().collect();
        let mut total = todo.len() as u64;
        info!(group = %g.id, from = %tm.target, to = %sec, chunks = total, full, "resync started");
        let mut last_report = Instant::now();
        let mut done = 0u64;
        let mut todo = todo;
        while !todo.is_empty() {
            for e in todo {
                if !tm.forwarding.load(Ordering::SeqCst) {
                    return Err(fs_err!(Unavailable, "a forward to target {sec} failed during the resync"));
                }
                {
                    let _held = tm.lock(e).write().await;
                    self.copy_entry(tm, &*pool, &env, sec, e).await?;
                    self.step("resync:copied").await;
                    tm.dirty.lock().expect("dirty lock").remove(&e);
                }
                done += 1;
                if last_report.elapsed() > Duration::from_secs(1) {
                    last_report = Instant::now();
                    let _ = self.mgmt.rpc(&Request::ResyncProgress { group: g.id, done, total }).await;
                }
            }
            // Entries a change marked dirty while the list was being read.
            todo = tm.dirty.lock().expect("dirty lock").iter().copied().collect();
            total += todo.len() as u64;
        }
        let _ = self.mgmt.rpc(&Request::ResyncProgress { group: g.id, done: total, total }).await;
        tm.persist_dirty()?;
        self.step("resync:done").await;
        // Refused when a forward failed meanwhile (the member went back to needs-resync).
        tm.new_skip_generation(false);
        self.set_state(&g, Consistency::Good).await?;
        info!(group = %g.id, from = %tm.target, to = %sec, chunks = total, "resync done: both copies are equal");
        let _ = self.cluster.refresh().await;
        Ok(())
    }

    /// Makes `e`'s chunk file on the secondary equal to this target's:
    /// deleted where it has none, else emptied, its data regions written
    /// (holes stay holes) and its length set.
    async fn copy_entry(
        &self,
        tm: &TargetMirror,
        pool: &dyn Call,
        env: &Envelope,
        sec: TargetId,
        e: EntryId,
    ) -> FsResult<()> {
        let store = tm.store.clone();
        let len = {
            let s = store.clone();
            crate::blocking(move || s.open(e, false).map(|f| f.map(|f| f.metadata().map(|m| m.len())))).await?
        };
        let len = match len {
            None => {
                pool.call_with(env, &Request::UnlinkChunk { target: sec, entry: e }, Bytes::new()).await?;
                return Ok(());
            }
            Some(l) => l.map_err(|x| fs_err!(Io, "target {}, chunk {e}: {x}", tm.target))?,
        };
        pool.call_with(env, &Request::TruncateChunk { target: sec, entry: e, len: 0 }, Bytes::new()).await?;
        let mut at = 0u64;
        while at < len {
            let s = store.clone();
            let data_at = crate::blocking(move || s.seek(e, at, false)).await?;
            let Some(start) = data_at else { break };
            let s = store.clone();
            let end = crate::blocking(move || s.seek(e, start, true)).await?.unwrap_or(len).min(len);
            let mut off = start;
            while off < end {
                let n = (end - off).min(RESYNC_PIECE) as u32;
                let s = store.clone();
                let data = crate::blocking(move || s.read(e, off, n)).await?;
                if data.is_empty() {
                    break;
                }
                let got = data.len() as u64;
                let req = Request::WriteChunk { target: sec, entry: e, offset: off };
                pool.call_with(env, &req, Bytes::from(data)).await?;
                off += got;
            }
            at = end;
        }
        pool.call_with(env, &Request::TruncateChunk { target: sec, entry: e, len }, Bytes::new()).await?;
        Ok(())
    }
}

/// The entries a chunk request changes or reads.
fn entries_of(req: &Request) -> Vec<EntryId> {
    match req {
        Request::WriteChunk { entry, .. }
        | Request::ReadChunk { entry, .. }
        | Request::TruncateChunk { entry, .. }
        | Request::UnlinkChunk { entry, .. }
        | Request::StatChunk { entry, .. }
        | Request::FsyncChunk { entry, .. }
        | Request::FallocateChunk { entry, .. }
        | Request::SeekChunk { entry, .. } => vec![*entry],
        Request::UnlinkChunks { entries, .. } => entries.clone(),
        _ => Vec::new(),
    }
}

/// Whether a chunk request changes a chunk file (and is forwarded).
fn changes(req: &Request) -> bool {
    matches!(
        req,
        Request::WriteChunk { .. }
            | Request::TruncateChunk { .. }
            | Request::UnlinkChunk { .. }
            | Request::UnlinkChunks { .. }
            | Request::FallocateChunk { .. }
            | Request::FsyncChunk { .. }
    )
}

fn is_chunk_io(req: &Request) -> bool {
    changes(req)
        || matches!(
            req,
            Request::ReadChunk { .. }
                | Request::StatChunk { .. }
                | Request::SeekChunk { .. }
                | Request::ListChunks { .. }
                | Request::DigestChunks { .. }
        )
}

/// A chunk request carrying a mirroring header.
pub(crate) async fn handle(ready: &Ready, h: MirrorHdr, req: Request, payload: Vec<u8>) -> (Response, Vec<u8>) {
    let payload = Bytes::from(payload);
    let r = match (h.role, &req) {
        (MirrorRole::Forward | MirrorRole::Resync, Request::MirrorFence { target }) => {
            match secondary_of(ready, h, *target).await {
                Ok(tm) => tm.fence().await.map(|session| (Ok(Reply::Fenced { session }), Vec::new())),
                Err(e) => Err(e),
            }
        }
        (_, Request::MirrorFence { .. }) => Err(fs_err!(Invalid, "MirrorFence comes from a buddy group's primary")),
        (MirrorRole::Client, _) => as_primary(ready, h, req, payload).await,
        (MirrorRole::Forward | MirrorRole::Resync, _) => as_secondary(ready, h, req, payload).await,
        (MirrorRole::Check, _) => as_member(ready, h, req, payload).await,
    };
    match r {
        Ok(answer) => answer,
        Err(e) => (Err(e), Vec::new()),
    }
}

fn target_of(req: &mut Request) -> FsResult<TargetId> {
    if !is_chunk_io(req) {
        return Err(fs_err!(NotSupported, "{} is not served for mirrored chunks", req.name()));
    }
    req.chunk_target_mut().map(|t| *t).ok_or_else(|| fs_err!(Invalid, "{} names no target", req.name()))
}

async fn as_primary(ready: &Ready, h: MirrorHdr, mut req: Request, payload: Bytes) -> FsResult<(Response, Vec<u8>)> {
    let m = &ready.mirror;
    let target = target_of(&mut req)?;
    let g = m.group(h.group, h.epoch).await?;
    let Some(tm) = m.targets.get(&target).filter(|_| g.primary == target.0).cloned() else {
        return Err(fs_err!(
            Unavailable,
            "storage target {target} (node {}) is not the primary of buddy group {} (epoch {}, primary {})",
            m.node,
            g.id,
            g.epoch,
            g.primary
        ));
    };
    if !m.lease_valid() {
        return Err(fs_err!(
            Unavailable,
            "storage node {} holds no lease from mgmtd: not serving buddy group {} as its primary",
            m.node,
            g.id
        ));
    }
    if !changes(&req) {
        return Ok(ready.apply(req, payload, true).await);
    }
    let entries = entries_of(&req);
    let mut guards = Vec::with_capacity(entries.len());
    let mut stripes: Vec<usize> = entries.iter().map(|e| usize::from(e.hash_dir()) % LOCK_STRIPES).collect();
    stripes.sort_unstable();
    stripes.dedup();
    for s in stripes {
        guards.push(tm.locks[s].read().await);
    }
    let sec = TargetId(g.secondary);
    // A forward too many is harmless; one too few loses data at the next
    // failover: skip it only while mgmtd is known to hold the secondary as
    // needing a resync.
    if !tm.may_skip_forward() {
        let mut freq = req.clone();
        if let Some(t) = freq.chunk_target_mut() {
            *t = sec;
        }
        let sent = match m.session(&tm, &g).await {
            Ok(session) => {
                let env = Envelope {
                    mirror: Some(MirrorHdr { group: g.id, epoch: g.epoch, role: MirrorRole::Forward, session }),
                    ..Envelope::default()
                };
                match m.cluster.group_target_pool(sec).await {
                    Ok(pool) => pool.call_with(&env, &freq, payload.clone()).await,
                    Err(e) => Err(e),
                }
            }
            Err(e) => Err(e),
        };
        match sent {
            Ok(_) => {
                m.step("forward:answered").await;
                let (r, data) = ready.apply(req, payload, true).await;
                if let Err(e) = &r {
                    // The secondary has the change, this copy does not: make them equal again.
                    warn!(group = %g.id, %target, "local change failed after the secondary took it: {e}");
                    degrade(m, &tm, &g, &entries, &e.to_string()).await?;
                }
                return Ok((r, data));
            }
            Err(e) => {
                degrade(m, &tm, &g, &entries, &e.to_string()).await?;
            }
        }
    } else {
        tm.mark_dirty(&entries)?;
    }
    Ok(ready.apply(req, payload, true).await)
}

/// `hivefs fsck` reads this member's own copy, whatever its role.
async fn as_member(ready: &Ready, h: MirrorHdr, mut req: Request, payload: Bytes) -> FsResult<(Response, Vec<u8>)> {
    let m = &ready.mirror;
    let target = target_of(&mut req)?;
    if changes(&req) {
        return Err(fs_err!(Invalid, "{} changes a chunk file: not a check", req.name()));
    }
    let g = m.group(h.group, h.epoch).await?;
    if !(g.primary == target.0 || g.secondary == target.0) || !m.targets.contains_key(&target) {
        return Err(fs_err!(
            Unavailable,
            "storage target {target} (node {}) is not a member of buddy group {}",
            m.node,
            g.id
        ));
    }
    Ok(ready.apply(req, payload, true).await)
}

/// The secondary missed (or may have missed) a change of `entries`: they
/// join the dirty list and mgmtd is told the secondary needs a resync. Fails
/// unless mgmtd agrees (it refuses a primary of an older epoch), so a
/// primary cut off from mgmtd acknowledges nothing with one copy.
async fn degrade(m: &Mirror, tm: &TargetMirror, g: &GroupInfo, entries: &[EntryId], why: &str) -> FsResult<()> {
    // First: a resync running now must not end as good (it checks this).
    tm.forwarding.store(false, Ordering::SeqCst);
    // The failed request may still land at the secondary: the next forward
    // or resync starts a new session first.
    tm.held.store(0, Ordering::SeqCst);
    tm.mark_dirty(entries)?;
    m.step("degrade:marked").await;
    let seen = tm.skip_generation();
    if let Err(e) = m.set_state(g, Consistency::NeedsResync).await {
        return Err(fs_err!(
            Unavailable,
            "buddy group {}: secondary target {} failed ({why}), and mgmtd did not confirm it needs a resync: {e}",
            g.id,
            g.secondary
        ));
    }
    tm.confirm_skip(seen);
    warn!(group = %g.id, secondary = g.secondary, "secondary target needs a resync: {why}");
    if let Err(e) = m.cluster.refresh().await {
        debug!("cluster view refresh failed: {e}");
    }
    Ok(())
}

/// This node's `target`, if it is the secondary of `h`'s group at `h`'s epoch.
async fn secondary_of(ready: &Ready, h: MirrorHdr, target: TargetId) -> FsResult<Arc<TargetMirror>> {
    let m = &ready.mirror;
    let g = m.group(h.group, h.epoch).await?;
    if h.epoch < g.epoch {
        return Err(fs_err!(
            Unavailable,
            "buddy group {} is at epoch {}: a request of epoch {} comes from a former primary and is refused",
            g.id,
            g.epoch,
            h.epoch
        ));
    }
    let Some(tm) = m.targets.get(&target).filter(|_| g.secondary == target.0).cloned() else {
        return Err(fs_err!(
            Unavailable,
            "storage target {target} (node {}) is not the secondary of buddy group {} (epoch {}, secondary {})",
            m.node,
            g.id,
            g.epoch,
            g.secondary
        ));
    };
    Ok(tm)
}

async fn as_secondary(ready: &Ready, h: MirrorHdr, mut req: Request, payload: Bytes) -> FsResult<(Response, Vec<u8>)> {
    let m = &ready.mirror;
    let target = target_of(&mut req)?;
    let tm = secondary_of(ready, h, target).await?;
    // Checked and applied under the session lock: a fence waits for this.
    let _session = tm.session_lock.read().await;
    let current = tm.session.load(Ordering::SeqCst);
    if h.session != current {
        return Err(fs_err!(
            Unavailable,
            "storage target {target} (node {}): {} of mirroring session {} refused, the session is {current}",
            m.node,
            req.name(),
            h.session
        ));
    }
    if h.role == MirrorRole::Forward && changes(&req) {
        tm.note_recent(&entries_of(&req), m.recent_window());
        let answer = ready.apply(req, payload, true).await;
        m.step("forward:applied").await;
        return Ok(answer);
    }
    Ok(ready.apply(req, payload, true).await)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_marked_after_a_torn_append_survives_a_restart() {
        let d = tempfile::tempdir().unwrap();
        let (t, e) = (TargetId(5), EntryId { node: 1, epoch: 1, counter: 0xC });
        let tm = TargetMirror::open(t, d.path(), &Disk::Files).unwrap();
        // An append that failed part-way (a full disk) left a torn line.
        std::fs::write(d.path().join(MIRROR_DIR).join(DIRTY_FILE), "1-1-A").unwrap();
        tm.mark_dirty(&[e]).unwrap();
        drop(tm);
        let tm = TargetMirror::open(t, d.path(), &Disk::Files).unwrap();
        assert!(tm.dirty.lock().unwrap().contains(&e), "the entry marked after the torn line was lost");
    }
}
