//! Buddy mirroring of metadata namespaces (`docs/design-mirror.md`,
//! "Metadata groups").
//!
//! A metadata group mirrors the namespace of one metadata node (the node id
//! its entries name as owner) onto a second node. This module owns, for each
//! namespace this node holds: whether it serves it or keeps a copy
//! ([`Slot`]); the primary's hook that sends every journal record to the
//! secondary before its own append ([`Primary`]), degrades the group when
//! that fails and resyncs a returning secondary; the secondary's copy,
//! which takes those records, or a full copy, batch for batch ([`Replica`]);
//! the lease from mgmtd without which no mirrored namespace is served; and
//! following mgmtd's roles (promotion, demotion).
//!
//! It must not decide roles (mgmtd does) nor know the namespace's rules:
//! records are opaque bytes here, replayed exactly as a start replays them.

use crate::namespace::Namespace;
use crate::store::journal::{self, AppendError};
use crate::store::log::{CommitFut, Local, RecordError, Replicate, Tip};
use crate::store::mem::Mem;
use crate::store::{off_workers, Incoming, Store};
use bytes::Bytes;
use hivefs_cluster::Cluster;
use hivefs_net::Call;
use hivefs_proto::{Consistency, Envelope, GroupInfo, GroupKind, MetaStep, MirrorHdr, MirrorRole, Reply, Request};
use hivefs_types::error::{ErrorCode, FsError, FsResult};
use hivefs_types::fs_err;
use hivefs_types::ids::{BuddyGroupId, NodeId, NodeType};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;
use tracing::{info, warn};

/// A forward to the secondary that takes longer fails (and degrades the group).
pub const FORWARD_TIMEOUT: Duration = Duration::from_secs(10);
/// Bytes of records per piece of a full copy.
const PIECE: usize = 4 << 20;
/// A resync ends (holding commits back) once fewer records than this remain.
const CATCH_UP: usize = 256;

/// Until when this node may serve mirrored namespaces as their primary:
/// each heartbeat mgmtd answers extends it to `sent + lease_ms`. Read on
/// every mirrored request, so kept in atomics (nanoseconds after `base`).
pub struct Lease {
    base: Instant,
    /// 0: no lease yet.
    until_ns: AtomicU64,
    len_ms: AtomicU64,
}

impl Default for Lease {
    fn default() -> Lease {
        Lease { base: Instant::now(), until_ns: AtomicU64::new(0), len_ms: AtomicU64::new(0) }
    }
}

impl Lease {
    pub fn renew(&self, sent: Instant, lease_ms: u64) {
        let until = (sent + Duration::from_millis(lease_ms)).saturating_duration_since(self.base);
        self.until_ns.store((until.as_nanos() as u64).max(1), Ordering::Release);
        self.len_ms.store(lease_ms, Ordering::Release);
    }

    pub fn valid(&self) -> bool {
        let until = self.until_ns.load(Ordering::Acquire);
        until != 0 && (self.base.elapsed().as_nanos() as u64) < until
    }

    /// The length of the last lease mgmtd granted.
    pub fn length(&self) -> Duration {
        Duration::from_millis(self.len_ms.load(Ordering::Acquire))
    }
}

/// What the primary knows of its group; locked across every commit.
struct PState {
    epoch: u64,
    secondary: NodeId,
    /// The secondary takes every record (it is good, or a resync caught up).
    forwarding: bool,
    /// The last batch committed and its checksum.
    last: (u64, Option<u32>),
}

/// The primary's side of a mirrored namespace: the [`Replicate`] hook of
/// its store.
pub struct Primary {
    pub group: BuddyGroupId,
    pub ns: NodeId,
    cluster: Arc<Cluster>,
    lease: Arc<Lease>,
    mem: Arc<Mem>,
    jdir: PathBuf,
    /// Keeps the journal for a secondary that is behind (weak: the tip holds
    /// this hook, and a cycle would keep the store open after a demotion).
    tip: std::sync::Weak<Tip>,
    /// Held across every commit (a forward waits for the network with it;
    /// asynchronous, so waiting for it holds no thread).
    st: tokio::sync::Mutex<PState>,
    /// A copy of `st.epoch` for the request path.
    epoch_now: AtomicU64,
    resyncing: AtomicBool,
    /// The session of the next resync (`MirrorHdr::session`): random at
    /// start, then counted, so no two attempts share one.
    sessions: AtomicU64,
}

fn unavailable(m: String) -> AppendError {
    AppendError::Unavailable(m)
}

impl Primary {
    fn hdr(&self, epoch: u64, role: MirrorRole, session: u64) -> Envelope {
        Envelope { mirror: Some(MirrorHdr { group: self.group, epoch, role, session }), ..Default::default() }
    }

    pub fn epoch(&self) -> u64 {
        self.epoch_now.load(Ordering::Acquire)
    }

    /// Runs `f` on the state (between two commits).
    async fn with_state<T>(self: &Arc<Self>, f: impl FnOnce(&Primary, &mut PState) -> T) -> Result<T, String> {
        let mut st = self.st.lock().await;
        let r = f(self, &mut st);
        self.publish(&st);
        Ok(r)
    }

    /// Updates the copies read without the lock.
    fn publish(&self, st: &PState) {
        self.epoch_now.store(st.epoch, Ordering::Release);
    }

    /// Serving is allowed: the lease holds and the sender's epoch is ours.
    pub fn check(&self, hdr: Option<&MirrorHdr>) -> FsResult<()> {
        if !self.lease.valid() {
            return Err(fs_err!(
                Unavailable,
                "metadata node holds no lease from mgmtd: not serving buddy group {} (namespace {})",
                self.group,
                self.ns
            ));
        }
        let epoch = self.epoch();
        // The lease is taken only after a view refresh that followed its
        // grant (`heartbeat` in lib.rs): a switch-over this node missed while
        // cut off from mgmtd shows there, before its roles are followed.
        if let Some(g) = self.cluster.view().groups.get(&self.group).filter(|g| g.epoch > epoch) {
            return Err(fs_err!(
                Unavailable,
                "buddy group {} is at epoch {} in mgmtd's view, this node serves epoch {epoch}: it is no longer the primary",
                self.group,
                g.epoch
            ));
        }
        match hdr {
            Some(h) if h.epoch != epoch => Err(fs_err!(
                Unavailable,
                "buddy group {} is at epoch {epoch} here, the request names {}: ask mgmtd again",
                self.group,
                h.epoch
            )),
            _ => Ok(()),
        }
    }

    /// [`Primary::check`] as the namespace's gate for steps sent to peers.
    fn gate(self: &Arc<Self>) -> crate::cross::Gate {
        let me = Arc::downgrade(self);
        Arc::new(move || match me.upgrade() {
            Some(p) => p.check(None),
            None => Err(fs_err!(Unavailable, "this node no longer serves the namespace as its group's primary")),
        })
    }

    /// Takes mgmtd's view of the group (called on every view refresh).
    async fn update(self: &Arc<Self>, g: &GroupInfo) {
        let (epoch, secondary) = (g.epoch, NodeId(g.secondary));
        if self.epoch() == epoch && self.st.try_lock().is_ok_and(|st| st.secondary == secondary) {
            return;
        }
        let _ = self
            .with_state(move |_, st| {
                st.epoch = epoch;
                if st.secondary != secondary {
                    st.secondary = secondary;
                    st.forwarding = false;
                }
            })
            .await;
    }

    async fn secondary_call(&self, node: NodeId) -> FsResult<Arc<dyn Call>> {
        self.cluster.meta_peer_pool(node).await
    }

    async fn step(&self, epoch: u64, node: NodeId, role: MirrorRole, step: MetaStep, body: Bytes) -> FsResult<Reply> {
        self.step_in(0, epoch, node, role, step, body).await
    }

    /// A step of resync session `session` (0: none).
    async fn step_in(
        &self,
        session: u64,
        epoch: u64,
        node: NodeId,
        role: MirrorRole,
        step: MetaStep,
        body: Bytes,
    ) -> FsResult<Reply> {
        let call = self.secondary_call(node).await?;
        let env = self.hdr(epoch, role, session);
        let req = Request::MetaMirror { step };
        match tokio::time::timeout(FORWARD_TIMEOUT, call.call_with(&env, &req, body)).await {
            Ok(r) => r.map(|(r, _)| r),
            Err(_) => Err(fs_err!(TimedOut, "metadata node {node} did not answer within {FORWARD_TIMEOUT:?}")),
        }
    }

    async fn set_state(&self, epoch: u64, member: NodeId, state: Consistency) -> FsResult<()> {
        let req = Request::SetMemberState { group: self.group, epoch: Some(epoch), member: member.0, state };
        match self.cluster.mgmt().rpc(&req).await? {
            Reply::Ok => Ok(()),
            r => Err(fs_err!(Protocol, "mgmtd answered {r:?} to SetMemberState")),
        }
    }

    /// Brings the secondary up to date: only the batches it misses when
    /// the journal still holds them, else a full copy and the batches since;
    /// the last ones with commits held back, after which every record is
    /// forwarded again and mgmtd is told the secondary is good.
    pub async fn resync(self: Arc<Self>, full: bool) -> Result<(), String> {
        if self.resyncing.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let r = self.clone().resync_inner(full).await;
        self.resyncing.store(false, Ordering::Release);
        r
    }

    async fn resync_inner(self: Arc<Self>, full: bool) -> Result<(), String> {
        let (epoch, sec) = self.with_state(|_, st| (st.epoch, st.secondary)).await?;
        let what = format!("resync of buddy group {} (namespace {}) to metadata node {sec}", self.group, self.ns);
        let e = |m: &dyn std::fmt::Display| format!("{what}: {m}");
        // mgmtd first (a secondary that is not good is never promoted), then
        // the resync owns the stream: no forwards until its last step, so
        // every batch reaches the secondary exactly once, in order.
        self.set_state(epoch, sec, Consistency::Resyncing).await.map_err(|x| e(&x))?;
        self.with_state(|me, st| {
            if let Some(t) = me.tip.upgrade().filter(|_| st.forwarding) {
                t.keep_from(st.last.0);
            }
            st.forwarding = false;
        })
        .await?;
        // The `Hello` and the full copy that may follow it share a session:
        // the secondary takes a copy's steps only from the session of its
        // last `Hello`, so those of an attempt given up on, should they
        // arrive late, cannot mix into a later copy or reset a finished one.
        let session = self.sessions.fetch_add(1, Ordering::Relaxed).max(1);
        let step = |step: MetaStep, body: Bytes| self.step_in(session, epoch, sec, MirrorRole::Resync, step, body);
        let (seq, crc) = match step(MetaStep::Hello, Bytes::new()).await {
            Ok(Reply::ReplicaAt { seq, crc }) => (seq, crc),
            Ok(r) => return Err(e(&format!("odd answer {r:?}"))),
            Err(x) => return Err(e(&x)),
        };
        let last = self.with_state(|_, st| st.last).await?;
        let jdir = self.jdir.clone();
        let incremental = match crc {
            _ if full => false,
            Some(c) if (seq, Some(c)) == last => true,
            Some(c) => {
                let jd = jdir.clone();
                let found =
                    off_workers(move || journal::read_after(&jd, seq)).await.map_err(|x| e(&x))?.map_err(|x| e(&x))?;
                found.is_some_and(|(at, _)| at == c)
            }
            None => false,
        };
        let mut at = seq;
        if !incremental {
            let (s, s_crc, pieces) = {
                // A snapshot between two commits.
                let st = self.st.lock().await;
                let mem = self.mem.clone();
                let pieces =
                    off_workers(move || mem.dump(PIECE)).await.map_err(|x| e(&x))?.map_err(|x| e(&format!("{x:?}")))?;
                (st.last.0, st.last.1, pieces)
            };
            info!(group = %self.group, ns = %self.ns, secondary = %sec, batch = s, pieces = pieces.len(), "full copy of a mirrored namespace to its secondary");
            let begin = MetaStep::Begin { seq: s, crc: s_crc };
            step(begin, Bytes::new()).await.map_err(|x| e(&x))?;
            let total = pieces.len() as u64;
            for (i, p) in pieces.into_iter().enumerate() {
                step(MetaStep::Piece, Bytes::from(p)).await.map_err(|x| e(&x))?;
                let req = Request::ResyncProgress { group: self.group, done: i as u64 + 1, total };
                let _ = self.cluster.mgmt().rpc(&req).await;
            }
            match step(MetaStep::Finish, Bytes::new()).await {
                Ok(Reply::ReplicaAt { seq, .. }) if seq == s => {}
                Ok(r) => return Err(e(&format!("odd answer to the end of the full copy: {r:?}"))),
                Err(x) => return Err(e(&x)),
            }
            at = s;
        }
        // Batches since, while commits go on; then the rest with commits held.
        loop {
            let jd = jdir.clone();
            let recs =
                off_workers(move || journal::read_after(&jd, at)).await.map_err(|x| e(&x))?.map_err(|x| e(&x))?;
            let recs = match recs {
                Some((_, r)) => r,
                None if at == self.with_state(|_, st| st.last.0).await? => Vec::new(),
                None => return Err(e(&format!("the journal no longer holds batch {at}: a full copy is needed"))),
            };
            if recs.len() < CATCH_UP {
                break;
            }
            for (s, body) in recs {
                self.step(epoch, sec, MirrorRole::Resync, MetaStep::Record { seq: s }, Bytes::from(body))
                    .await
                    .map_err(|x| e(&x))?;
                at = s;
            }
        }
        {
            // The rest with commits held back: the state's lock is held until
            // every record is forwarded again.
            let mut st = self.st.lock().await;
            if st.epoch != epoch || st.secondary != sec {
                return Err(e(&"the group changed during the resync"));
            }
            let jd = jdir.clone();
            let recs =
                off_workers(move || journal::read_after(&jd, at)).await.map_err(|x| e(&x))?.map_err(|x| e(&x))?;
            let recs = match recs {
                Some((_, r)) => r,
                None if at == st.last.0 => Vec::new(),
                None => return Err(e(&format!("the journal no longer holds batch {at}"))),
            };
            for (s, body) in recs {
                self.step(epoch, sec, MirrorRole::Resync, MetaStep::Record { seq: s }, Bytes::from(body))
                    .await
                    .map_err(|x| e(&x))?;
            }
            st.forwarding = true;
            if let Some(t) = self.tip.upgrade() {
                t.keep_none();
            }
            self.publish(&st);
        }
        self.set_state(epoch, sec, Consistency::Good).await.map_err(|x| e(&x))?;
        info!(group = %self.group, ns = %self.ns, secondary = %sec, "metadata secondary resynced: every record is mirrored again");
        Ok(())
    }
}

/// A digest of every record of a namespace (what a buddy comparison checks).
fn digest(mem: &Mem) -> Result<u32, String> {
    let mut h = crc32fast::Hasher::new();
    for piece in mem.dump(PIECE).map_err(|e| format!("{e:?}"))? {
        h.update(&piece);
    }
    Ok(h.finalize())
}

impl Primary {
    /// Compares both copies at one batch, commits held meanwhile (`hivefs fsck`).
    pub async fn compare(self: &Arc<Self>) -> FsResult<Reply> {
        let st = self.st.lock().await;
        if !st.forwarding {
            return Err(fs_err!(
                Unavailable,
                "buddy group {}: the secondary is not current (a resync is due), nothing to compare",
                self.group
            ));
        }
        let mem = self.mem.clone();
        let own = off_workers(move || digest(&mem))
            .await
            .map_err(|e| fs_err!(Internal, "{e}"))?
            .map_err(|m| fs_err!(Io, "namespace {}: {m}", self.ns))?;
        let (epoch, sec, seq) = (st.epoch, st.secondary, st.last.0);
        let theirs = self.step(epoch, sec, MirrorRole::Resync, MetaStep::Digest, Bytes::new()).await?;
        drop(st);
        match theirs {
            Reply::ReplicaAt { seq: s, crc: Some(d) } if s == seq && d == own => {
                Ok(Reply::ReplicaAt { seq, crc: Some(own) })
            }
            Reply::ReplicaAt { seq: s, crc } => Err(fs_err!(
                Io,
                "the copies of namespace {} differ: primary (this node) at batch {seq} digest {own:08x}, \
                 secondary (metadata node {sec}) at batch {s} digest {}",
                self.ns,
                crc.map_or("none".into(), |d| format!("{d:08x}"))
            )),
            r => Err(fs_err!(Protocol, "metadata node {sec}: odd answer {r:?} to a digest")),
        }
    }
}

impl Replicate for Primary {
    fn commit<'a>(&'a self, seq: u64, body: &'a [u8], local: Local<'a>) -> CommitFut<'a> {
        Box::pin(self.commit_inner(seq, body, local))
    }
}

impl Primary {
    async fn commit_inner(&self, seq: u64, body: &[u8], local: Local<'_>) -> Result<(), AppendError> {
        let mut st = self.st.lock().await;
        // The lease, and no newer epoch of the group in mgmtd's view.
        self.check(None).map_err(|e| unavailable(format!("{} takes no changes: {}", self.ns, e.message)))?;
        if st.forwarding {
            let (epoch, sec) = (st.epoch, st.secondary);
            let body = Bytes::copy_from_slice(body);
            let r = self.step(epoch, sec, MirrorRole::Forward, MetaStep::Record { seq }, body).await;
            if let Err(fe) = r {
                // Degrade with mgmtd's agreement, or take nothing: a stale
                // primary must not go on alone.
                let d = self.set_state(epoch, sec, Consistency::NeedsResync).await;
                if let Err(de) = d {
                    return Err(unavailable(format!(
                        "buddy group {}: forward of batch {seq} to metadata node {sec} failed ({fe}) and mgmtd \
                         did not agree to go on without it ({de})",
                        self.group
                    )));
                }
                warn!(group = %self.group, ns = %self.ns, secondary = %sec, "forward of batch {seq} failed ({fe}): the secondary needs a resync; going on alone");
                // Its resync reads what it misses from the journal: keep it.
                if let Some(t) = self.tip.upgrade() {
                    t.keep_from(st.last.0);
                }
                st.forwarding = false;
                self.publish(&st);
            }
        }
        let forwarded = st.forwarding;
        match local() {
            Ok(crc) => {
                st.last = (seq, Some(crc));
                Ok(())
            }
            Err(e) => {
                // The secondary holds a batch this node does not (a full disk
                // here): only a resync makes them agree again.
                if forwarded {
                    let (epoch, sec) = (st.epoch, st.secondary);
                    if let Err(de) = self.set_state(epoch, sec, Consistency::NeedsResync).await {
                        warn!(group = %self.group, "batch {seq} failed here after its forward, and mgmtd was not told: {de}");
                    }
                    st.forwarding = false;
                    self.publish(&st);
                }
                Err(e)
            }
        }
    }
}

/// The secondary's copy of a namespace.
enum RState {
    Open(Store),
    /// A full copy arriving, of the resync session it began in.
    Incoming(Incoming, u64),
    /// Between a failed step and the next `Hello`/`Begin`.
    Closed,
}

pub struct Replica {
    pub ns: NodeId,
    path: PathBuf,
    sync: bool,
    cache_bytes: u64,
    checkpoint_bytes: u64,
    st: Mutex<RState>,
    /// The resync session of the last `Hello` whose full copy has not
    /// begun (locked after `st`).
    hello: Mutex<Option<u64>>,
}

impl Replica {
    fn open_store(&self) -> Result<Store, String> {
        if let Some(d) = self.path.parent() {
            std::fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
        }
        let mut s = Store::open_replica(&self.path, self.sync, self.cache_bytes).map_err(|e| e.to_string())?;
        s.log.checkpoint_bytes = self.checkpoint_bytes;
        // A simulation's node has no threads: its checkpoints run in commits.
        if !crate::store::blocking_in_place() {
            s.log.spawn_checkpointer().map_err(|e| e.to_string())?;
        }
        Ok(s)
    }

    /// Opens the copy on disk (an empty one if there is none) unless it is
    /// open or a full copy is being received.
    fn ensure_open(&self) -> Result<(), String> {
        let mut st = self.st.lock().expect("replica state");
        if matches!(*st, RState::Closed) {
            *st = RState::Open(self.open_store()?);
        }
        Ok(())
    }

    /// Applies one step from the primary (blocking: file writes).
    /// `session`: the resync session the step belongs to (0 from a primary
    /// that has none: nothing is checked).
    fn step(&self, step: MetaStep, session: u64, body: &[u8]) -> FsResult<Reply> {
        let mut st = self.st.lock().expect("replica state");
        let mut hello = self.hello.lock().expect("replica hello");
        let ns = self.ns;
        let err = |m: String| fs_err!(Io, "copy of namespace {ns}: {m}");
        match step {
            MetaStep::Record { seq } => {
                let RState::Open(store) = &mut *st else {
                    return Err(fs_err!(Unavailable, "copy of namespace {ns} is not open (a full copy is due)"));
                };
                match store.log.commit_record(seq, body) {
                    Ok(()) => {
                        store.log.maybe_checkpoint(u64::MAX);
                        if store.log.failed() {
                            // A checkpoint failed (a full disk): the store takes
                            // nothing more until it is opened again, which the
                            // next resync's `Hello` does.
                            *st = RState::Closed;
                            return Err(err("a checkpoint failed; the copy is reopened by the next resync".into()));
                        }
                        Ok(Reply::Ok)
                    }
                    Err(RecordError::Append(AppendError::Broken(m))) => {
                        *st = RState::Closed;
                        Err(err(format!("journal write: {m}; the copy is reopened by the next resync")))
                    }
                    Err(RecordError::Gap { have }) => {
                        Err(fs_err!(Invalid, "copy of namespace {ns} holds batches up to {have}, not {}", seq - 1))
                    }
                    Err(e) => Err(err(e.to_string())),
                }
            }
            MetaStep::Digest => {
                let RState::Open(store) = &*st else {
                    return Err(fs_err!(Unavailable, "copy of namespace {ns} is not open (a full copy is due)"));
                };
                let digest = digest(&store.log.mem).map_err(err)?;
                Ok(Reply::ReplicaAt { seq: store.log.last().0, crc: Some(digest) })
            }
            MetaStep::Compare => Err(fs_err!(Invalid, "a comparison is asked of the group's primary")),
            MetaStep::Hello => {
                *hello = Some(session).filter(|s| *s != 0);
                if !matches!(*st, RState::Open(_)) {
                    *st = RState::Closed;
                    *st = RState::Open(self.open_store().map_err(err)?);
                }
                let RState::Open(store) = &*st else { unreachable!("opened above") };
                let (seq, crc) = store.log.last();
                Ok(Reply::ReplicaAt { seq, crc })
            }
            MetaStep::Begin { seq, crc } => {
                if session != 0 && *hello != Some(session) {
                    return Err(fs_err!(
                        Invalid,
                        "copy of namespace {ns}: a full copy of resync session {session}, not the session of the last \
                         Hello (a late delivery): refused"
                    ));
                }
                *hello = None;
                *st = RState::Closed;
                let inc = Incoming::begin(&self.path, seq, crc).map_err(|e| err(e.to_string()))?;
                *st = RState::Incoming(inc, session);
                Ok(Reply::Ok)
            }
            MetaStep::Piece => {
                let RState::Incoming(inc, s) = &mut *st else {
                    return Err(fs_err!(Invalid, "copy of namespace {ns}: a piece outside a full copy"));
                };
                if *s != session {
                    return Err(fs_err!(
                        Invalid,
                        "copy of namespace {ns}: a piece of resync session {session} in the full copy of session {s}"
                    ));
                }
                inc.add(body).map_err(err)?;
                Ok(Reply::Ok)
            }
            MetaStep::Finish => {
                if !matches!(&*st, RState::Incoming(_, s) if *s == session) {
                    return Err(fs_err!(
                        Invalid,
                        "copy of namespace {ns}: the end of a full copy (resync session {session}) that did not begin"
                    ));
                }
                let RState::Incoming(inc, _) = std::mem::replace(&mut *st, RState::Closed) else {
                    unreachable!("matched above")
                };
                inc.finish(&self.path).map_err(|e| err(e.to_string()))?;
                let store = self.open_store().map_err(err)?;
                let (seq, crc) = store.log.last();
                *st = RState::Open(store);
                info!(ns = %ns, batch = seq, "full copy of a mirrored namespace received");
                Ok(Reply::ReplicaAt { seq, crc })
            }
        }
    }

    /// The copy's store, taken for promotion (`None` while no whole copy is open).
    fn take(&self) -> Option<Store> {
        let mut st = self.st.lock().expect("replica state");
        match std::mem::replace(&mut *st, RState::Closed) {
            RState::Open(s) => Some(s),
            other => {
                *st = other;
                None
            }
        }
    }
}

/// What a served namespace's mirroring hook needs of its store.
#[derive(Clone)]
pub struct Held {
    tip: Arc<Tip>,
    mem: Arc<Mem>,
    jdir: PathBuf,
}

impl Held {
    fn of(s: &Store) -> Held {
        Held { tip: s.log.tip(), mem: s.log.mem.clone(), jdir: s.log.journal_dir().to_path_buf() }
    }
}

/// A namespace this node holds.
pub enum Slot {
    /// Served here: unmirrored, or as the primary of its group.
    Serving { ns: Arc<Namespace>, primary: Option<Arc<Primary>>, store: Held },
    /// A copy kept as the secondary of its group.
    Replica(Arc<Replica>),
    /// Being switched between the two.
    Switching,
}

/// The namespaces of this node and the roles mgmtd gave them.
pub struct Mirrors {
    pub me: NodeId,
    pub cluster: Arc<Cluster>,
    pub lease: Arc<Lease>,
    pub cfg: crate::Config,
    /// Ordered: walks over it (closing, comparing) go the same way every run.
    pub slots: std::sync::RwLock<std::collections::BTreeMap<NodeId, Slot>>,
    /// Held while following roles (the periodic look and mgmtd's notices).
    pub following: tokio::sync::Mutex<()>,
    /// Raised when the store of any namespace served here failed.
    pub failed: Arc<crate::writer::StoreFailure>,
    /// Tasks started here (following roles, resyncs): stopped with the
    /// service, so none goes on in the name of a node that stopped.
    pub tasks: std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// Serves a namespace from an opened store (the service's start-up
    /// steps: writer, peers, leases, recovery of pending intents).
    /// `grace`: it was served by another node until now, whose grants of
    /// attribute leases may last this much longer.
    pub serve: Box<dyn Fn(Store, NodeId, PathBuf, Option<Duration>) -> futures_serve::ServeFut + Send + Sync>,
}

/// The future of [`Mirrors::serve`].
pub mod futures_serve {
    pub type ServeFut = std::pin::Pin<
        Box<dyn std::future::Future<Output = hivefs_types::error::FsResult<std::sync::Arc<crate::Namespace>>> + Send>,
    >;
}

impl Mirrors {
    /// Runs `fut` as a task of this service (see `tasks`).
    pub fn spawn(&self, fut: impl std::future::Future<Output = ()> + Send + 'static) {
        let mut tasks = self.tasks.lock().expect("mirror tasks");
        tasks.retain(|t| !t.is_finished());
        tasks.push(tokio::spawn(fut));
    }

    /// Stops every task started here.
    pub fn stop_tasks(&self) {
        for t in self.tasks.lock().expect("mirror tasks").drain(..) {
            t.abort();
        }
    }

    /// The directory of namespace `ns`'s store on this node.
    pub fn dir_of(&self, ns: NodeId) -> PathBuf {
        if ns == self.me {
            self.cfg.dir.clone()
        } else {
            self.cfg.dir.join(format!("ns-{ns}"))
        }
    }

    /// The namespace served here that a request names (by its group's
    /// header, or this node's own), with the primary's checks done.
    pub fn serving(&self, hdr: Option<&MirrorHdr>) -> FsResult<Arc<Namespace>> {
        let ns = match hdr {
            Some(h) if h.role == MirrorRole::Client => match self.cluster.view().groups.get(&h.group) {
                Some(g) if g.kind == GroupKind::Meta => g.serves.unwrap_or(self.me),
                _ => return Err(fs_err!(Unavailable, "buddy group {} is not a metadata group here", h.group)),
            },
            _ => self.me,
        };
        let slots = self.slots.read().expect("slots");
        match slots.get(&ns) {
            Some(Slot::Serving { ns: n, primary, .. }) => {
                if let Some(p) = primary {
                    p.check(hdr.filter(|h| h.role == MirrorRole::Client))?;
                }
                Ok(n.clone())
            }
            _ => Err(fs_err!(Unavailable, "the namespace of metadata node {ns} is not served by this node now")),
        }
    }

    /// The own namespace when it is served here.
    pub fn own(&self) -> Option<Arc<Namespace>> {
        match self.slots.read().expect("slots").get(&self.me) {
            Some(Slot::Serving { ns, .. }) => Some(ns.clone()),
            _ => None,
        }
    }

    /// A step from a group's primary to this node as its secondary.
    pub async fn step(&self, env: &Envelope, step: MetaStep, body: Vec<u8>) -> FsResult<Reply> {
        if let (Some(h), MetaStep::Compare) = (env.mirror, step) {
            let primary = self.slots.read().expect("slots").values().find_map(|s| match s {
                Slot::Serving { primary: Some(p), .. } if p.group == h.group => Some(p.clone()),
                _ => None,
            });
            return match primary {
                Some(p) => p.compare().await,
                None => Err(fs_err!(Unavailable, "this node is not the primary of buddy group {}", h.group)),
            };
        }
        let Some(h) = env.mirror.filter(|h| matches!(h.role, MirrorRole::Forward | MirrorRole::Resync)) else {
            return Err(fs_err!(Invalid, "a metadata mirroring step without its group header"));
        };
        let mut g = self.cluster.view().groups.get(&h.group).cloned();
        if g.as_ref().is_none_or(|g| g.epoch < h.epoch) {
            g = self.cluster.refresh().await?.groups.get(&h.group).cloned();
        }
        let Some(g) = g.filter(|g| g.kind == GroupKind::Meta) else {
            return Err(fs_err!(NotFound, "metadata buddy group {} is not known to mgmtd", h.group));
        };
        if g.epoch != h.epoch || g.secondary != self.me.0 {
            return Err(fs_err!(
                Unavailable,
                "buddy group {}: this node is not its secondary at epoch {} (mgmtd: epoch {}, secondary {})",
                g.id,
                h.epoch,
                g.epoch,
                g.secondary
            ));
        }
        let ns = g.serves.unwrap_or(NodeId(g.primary));
        let replica = match self.slots.read().expect("slots").get(&ns) {
            Some(Slot::Replica(r)) => r.clone(),
            _ => return Err(fs_err!(Unavailable, "no copy of namespace {ns} is open here yet")),
        };
        let session = h.session;
        off_workers(move || replica.step(step, session, &body))
            .await
            .map_err(|e| fs_err!(Internal, "mirroring step: {e}"))?
    }

    fn replica(&self, ns: NodeId, store: Option<Store>) -> Arc<Replica> {
        let dir = self.dir_of(ns);
        Arc::new(Replica {
            ns,
            path: dir.join(crate::DB_FILE),
            sync: self.cfg.sync,
            cache_bytes: self.cfg.store_cache_bytes,
            checkpoint_bytes: self.cfg.checkpoint_bytes,
            st: Mutex::new(match store {
                Some(s) => RState::Open(s),
                None => RState::Closed,
            }),
            hello: Mutex::new(None),
        })
    }

    /// Keeps the opened store of namespace `ns` as a copy (this node is
    /// its group's secondary).
    pub fn keep_copy(&self, ns: NodeId, store: Store) {
        let r = self.replica(ns, Some(store));
        self.slots.write().expect("slots").insert(ns, Slot::Replica(r));
    }

    /// Installs the primary hook for namespace `ns` of group `g`.
    async fn primary(&self, g: &GroupInfo, ns: NodeId, held: &Held, forwarding: bool) -> Arc<Primary> {
        let mut made = None;
        held.tip
            .install(|last| {
                if !forwarding {
                    // The secondary holds at most one batch less than this copy
                    // (forward first): keep the journal from there for its resync.
                    held.tip.keep_from(last.0.saturating_sub(1));
                }
                let p = Arc::new(Primary {
                    group: g.id,
                    ns,
                    cluster: self.cluster.clone(),
                    lease: self.lease.clone(),
                    mem: held.mem.clone(),
                    jdir: held.jdir.clone(),
                    tip: Arc::downgrade(&held.tip),
                    st: tokio::sync::Mutex::new(PState {
                        epoch: g.epoch,
                        secondary: NodeId(g.secondary),
                        forwarding,
                        last,
                    }),
                    epoch_now: AtomicU64::new(g.epoch),
                    resyncing: AtomicBool::new(false),
                    sessions: AtomicU64::new(rand::random::<u64>() >> 1),
                });
                made = Some(p.clone());
                p
            })
            .await;
        made.expect("installed")
    }

    /// Serves namespace `ns` from `store` (the own one at start, or a copy
    /// being promoted): as its group's primary when it has one.
    pub async fn start_serving(
        &self,
        ns: NodeId,
        store: Store,
        group: Option<&GroupInfo>,
        promoted: bool,
    ) -> FsResult<()> {
        let held = Held::of(&store);
        let primary = match group {
            Some(g) => Some(self.primary(g, ns, &held, g.secondary_state == Consistency::Good).await),
            None => None,
        };
        // A new boot epoch, as a batch of its own (mirrored like any other).
        let mut store = store;
        store.bump_epoch_async().await.map_err(|e| fs_err!(Io, "{e}"))?;
        store.log.checkpoint_bytes = self.cfg.checkpoint_bytes;
        // The former primary granted nothing after its own lease from mgmtd
        // ended, at least one lease length before the switch-over.
        let grace = promoted.then(|| {
            Duration::from_millis(self.cfg.attr_lease_ms).saturating_sub(self.lease.length()) + Duration::from_secs(1)
        });
        let n = (self.serve)(store, ns, self.dir_of(ns), grace).await?;
        if let Some(p) = &primary {
            n.set_gate(p.gate());
        }
        let (one, all) = (n.failure(), self.failed.clone());
        n.add_task(tokio::spawn(async move {
            one.wait().await;
            all.set();
        }));
        self.slots.write().expect("slots").insert(ns, Slot::Serving { ns: n, primary, store: held });
        Ok(())
    }

    /// Follows mgmtd's roles for every metadata group this node is in:
    /// opens copies, promotes a copy whose group made this node primary,
    /// gives up serving a namespace whose group made it secondary, and
    /// starts resyncs of secondaries that need them.
    pub async fn follow_roles(self: &Arc<Self>) {
        let _one_at_a_time = self.following.lock().await;
        let view = self.cluster.view();
        let groups: Vec<GroupInfo> = view
            .groups
            .values()
            .filter(|g| g.kind == GroupKind::Meta && (g.primary == self.me.0 || g.secondary == self.me.0))
            .cloned()
            .collect();
        for g in groups {
            let Some(ns) = g.serves else { continue };
            if let Err(e) = self.follow(&g, ns, &view).await {
                warn!(group = %g.id, ns = %ns, "metadata buddy group: {e}");
            }
        }
    }

    async fn follow(self: &Arc<Self>, g: &GroupInfo, ns: NodeId, view: &hivefs_cluster::ClusterView) -> FsResult<()> {
        enum Now {
            Serving(Option<Arc<Primary>>, Held),
            Copy(Arc<Replica>),
        }
        let now = {
            let mut slots = self.slots.write().expect("slots");
            match slots.get(&ns) {
                Some(Slot::Serving { primary, store, .. }) => Now::Serving(primary.clone(), store.clone()),
                Some(Slot::Replica(r)) => Now::Copy(r.clone()),
                Some(Slot::Switching) => return Ok(()),
                None => {
                    let r = self.replica(ns, None);
                    slots.insert(ns, Slot::Replica(r.clone()));
                    Now::Copy(r)
                }
            }
        };
        // A copy on disk is opened at once: forwards are taken from the start,
        // and a promotion finds it.
        if let Now::Copy(r) = &now {
            let r = r.clone();
            if let Ok(Err(e)) = off_workers(move || r.ensure_open()).await {
                warn!(ns = %ns, "copy of namespace {ns}: {e}");
            }
        }
        let i_am_primary = g.primary == self.me.0;
        match now {
            Now::Serving(Some(p), _) if i_am_primary => {
                p.update(g).await;
                let online = view
                    .nodes
                    .get(&(NodeType::Meta, NodeId(g.secondary)))
                    .is_some_and(|n| n.reachability == hivefs_proto::Reachability::Online);
                // Whatever is not good is resynced (an administrator's request
                // too); `bad` asks for a full copy. A resync that finds the
                // secondary current sends nothing and sets it good again.
                let full = g.secondary_state == Consistency::Bad;
                let due = g.secondary_state != Consistency::Good;
                if due && online && self.lease.valid() {
                    self.spawn(async move {
                        if let Err(e) = p.resync(full).await {
                            warn!("{e}");
                        }
                    });
                }
            }
            Now::Serving(None, held) if i_am_primary => {
                // Mirrored while served alone: every commit from now on goes
                // through the hook; the secondary gets a full copy first.
                let p = self.primary(g, ns, &held, false).await;
                if let Some(Slot::Serving { ns: n, primary, .. }) = self.slots.write().expect("slots").get_mut(&ns) {
                    n.set_gate(p.gate());
                    *primary = Some(p);
                }
                info!(group = %g.id, ns = %ns, "namespace served here is mirrored from now on");
            }
            Now::Copy(r) if i_am_primary => {
                if !self.lease.valid() {
                    return Ok(());
                }
                let Some(store) = r.take() else {
                    return Err(fs_err!(Unavailable, "promoted, but the copy of namespace {ns} here is incomplete"));
                };
                if store.log.last().0 == 0 {
                    // Never received a batch: serving it would serve an empty namespace.
                    *r.st.lock().expect("replica state") = RState::Open(store);
                    return Err(fs_err!(Unavailable, "promoted, but this node holds no copy of namespace {ns}"));
                }
                self.slots.write().expect("slots").insert(ns, Slot::Switching);
                info!(group = %g.id, ns = %ns, epoch = g.epoch, "promoted: serving the namespace of metadata node {ns} as its primary");
                if let Err(e) = self.start_serving(ns, store, Some(g), true).await {
                    let r = self.replica(ns, None);
                    self.slots.write().expect("slots").insert(ns, Slot::Replica(r));
                    return Err(e);
                }
            }
            Now::Serving(..) => {
                let Some(Slot::Serving { ns: n, store, .. }) =
                    self.slots.write().expect("slots").insert(ns, Slot::Switching)
                else {
                    return Ok(());
                };
                warn!(group = %g.id, ns = %ns, epoch = g.epoch, "demoted: this node keeps a copy of the namespace of metadata node {ns} as secondary");
                // The hook stays: without a lease it takes no commit.
                drop(store);
                close_namespace(n).await;
                let r = self.replica(ns, None);
                self.slots.write().expect("slots").insert(ns, Slot::Replica(r));
            }
            Now::Copy(_) => {}
        }
        Ok(())
    }

    /// Closes every namespace served here (stop of the service).
    pub async fn close_all(&self) {
        self.stop_tasks();
        let all: Vec<Slot> = std::mem::take(&mut *self.slots.write().expect("slots")).into_values().collect();
        for s in all {
            if let Slot::Serving { ns, .. } = s {
                close_namespace(ns).await;
            }
        }
    }
}

/// Waits for requests in flight to let go of `ns`, then closes its store.
pub async fn close_namespace(mut ns: Arc<Namespace>) {
    ns.stop_tasks();
    for _ in 0..1000 {
        match Arc::try_unwrap(ns) {
            Ok(n) => {
                let _ = off_workers(move || n.close()).await;
                return;
            }
            Err(still_shared) => {
                ns = still_shared;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
    warn!(
        holders = Arc::strong_count(&ns),
        "metadata namespace still in use 10 s after stop; it closes when the last request ends"
    );
}

/// The error a client sees while no namespace is served.
pub fn not_ready() -> FsError {
    FsError::new(ErrorCode::Unavailable, "metadata service is starting or stopping")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{sys_put, DEFAULT_CACHE_BYTES};

    /// Forwards each record to an in-process copy, as the secondary takes it.
    struct ToCopy(Arc<Mutex<Store>>);

    impl Replicate for ToCopy {
        fn commit<'a>(&'a self, seq: u64, body: &'a [u8], local: Local<'a>) -> CommitFut<'a> {
            Box::pin(async move {
                self.0
                    .lock()
                    .unwrap()
                    .log
                    .commit_record(seq, body)
                    .map_err(|e| AppendError::Unavailable(e.to_string()))?;
                local().map(drop)
            })
        }
    }

    fn edit(s: &mut Store, i: u64) {
        let ((), changes) = s
            .log
            .mem
            .batch(|t| {
                t.dentries.insert(&i.to_be_bytes(), &[i as u8; 40])?;
                if i.is_multiple_of(3) {
                    t.dentries.remove(&(i - 1).to_be_bytes())?;
                }
                sys_put(&mut t.system, "files", i)
            })
            .unwrap();
        s.log.commit(changes).unwrap();
    }

    fn dump(s: &Store) -> Vec<u8> {
        s.log.mem.dump(1 << 30).unwrap().concat()
    }

    #[test]
    fn the_journal_kept_for_a_secondary_outlives_checkpoints_until_let_go() {
        let d = tempfile::tempdir().unwrap();
        let mut s = Store::open(&d.path().join(crate::DB_FILE), false).unwrap();
        for i in 1..10 {
            edit(&mut s, i);
        }
        let at = s.log.last().0;
        s.log.tip().keep_from(at);
        for i in 10..40 {
            edit(&mut s, i);
            if i % 5 == 0 {
                assert!(s.log.checkpoint_now());
            }
        }
        let (_, recs) = journal::read_after(s.log.journal_dir(), at).unwrap().expect("the journal was kept");
        assert_eq!(recs.first().map(|r| r.0), Some(at + 1));
        assert_eq!(recs.last().map(|r| r.0), Some(s.log.last().0));
        // Current again: the next checkpoint deletes what it holds.
        s.log.tip().keep_none();
        edit(&mut s, 40);
        assert!(s.log.checkpoint_now());
        assert!(journal::read_after(s.log.journal_dir(), at).unwrap().is_none());
    }

    /// Steps of a resync attempt the primary gave up on, delivered late,
    /// are refused: a piece into the next attempt's full copy (it would
    /// put stale records into it), and a `Begin` after that copy finished
    /// (it would close the copy a promotion needs).
    #[test]
    fn a_replica_takes_a_full_copy_only_from_the_session_of_its_last_hello() {
        let d = tempfile::tempdir().unwrap();
        let mut primary = Store::open(&d.path().join("p.redb"), false).unwrap();
        for i in 1..20 {
            edit(&mut primary, i);
        }
        let (seq, crc) = primary.log.last();
        let pieces = primary.log.mem.dump(256).unwrap();
        let replica = Replica {
            ns: NodeId(1),
            path: d.path().join("s").join(crate::DB_FILE),
            sync: false,
            cache_bytes: DEFAULT_CACHE_BYTES,
            checkpoint_bytes: u64::MAX,
            st: Mutex::new(RState::Closed),
            hello: Mutex::new(None),
        };
        let step = |step: MetaStep, session: u64, body: &[u8]| replica.step(step, session, body);
        let begin = MetaStep::Begin { seq, crc };
        let refused = |r: FsResult<Reply>| assert_eq!(r.unwrap_err().code, ErrorCode::Invalid);
        // Attempt 7 begins and is given up on; attempt 8 copies everything.
        step(MetaStep::Hello, 7, &[]).unwrap();
        step(begin, 7, &[]).unwrap();
        step(MetaStep::Piece, 7, &pieces[0]).unwrap();
        step(MetaStep::Hello, 8, &[]).unwrap();
        refused(step(begin, 7, &[]));
        step(begin, 8, &[]).unwrap();
        for p in &pieces {
            step(MetaStep::Piece, 8, p).unwrap();
        }
        refused(step(MetaStep::Piece, 7, b"stale"));
        refused(step(MetaStep::Finish, 7, &[]));
        assert!(matches!(step(MetaStep::Finish, 8, &[]).unwrap(), Reply::ReplicaAt { seq: s, .. } if s == seq));
        // Late, after the copy finished: the copy stays open and equal.
        refused(step(begin, 8, &[]));
        refused(step(begin, 7, &[]));
        let RState::Open(copy) = &*replica.st.lock().unwrap() else { panic!("the copy was closed") };
        assert_eq!(dump(copy), dump(&primary));
    }

    #[tokio::test]
    async fn a_full_copy_then_forwarded_records_keep_the_copy_equal_batch_for_batch() {
        let d = tempfile::tempdir().unwrap();
        let (pdir, sdir) = (d.path().join("p"), d.path().join("s"));
        std::fs::create_dir_all(&pdir).unwrap();
        std::fs::create_dir_all(&sdir).unwrap();
        let mut primary = Store::open(&pdir.join(crate::DB_FILE), false).unwrap();
        for i in 1..50 {
            edit(&mut primary, i);
        }
        primary.log.checkpoint_now();
        edit(&mut primary, 50);

        // A full copy in small pieces, put in place of an older store.
        let spath = sdir.join(crate::DB_FILE);
        drop(Store::open(&spath, false).unwrap());
        let (seq, _) = primary.log.last();
        let mut inc = Incoming::begin(&spath, seq, primary.log.last().1).unwrap();
        let pieces = primary.log.mem.dump(256).unwrap();
        assert!(pieces.len() > 3, "several pieces: {}", pieces.len());
        for p in &pieces {
            inc.add(p).unwrap();
        }
        inc.finish(&spath).unwrap();
        let copy = Store::open_replica(&spath, false, DEFAULT_CACHE_BYTES).unwrap();
        assert_eq!(copy.log.last(), primary.log.last(), "the copy knows the checksum of its last batch");
        assert_eq!(dump(&copy), dump(&primary));

        // From now on every batch reaches the copy first, same numbers, same bytes.
        let copy = Arc::new(Mutex::new(copy));
        primary.log.tip().install(|_| Arc::new(ToCopy(copy.clone()))).await;
        for i in 51..120 {
            edit(&mut primary, i);
        }
        primary.bump_epoch().unwrap();
        assert_eq!(copy.lock().unwrap().log.last(), primary.log.last());
        assert_eq!(dump(&copy.lock().unwrap()), dump(&primary));
        // The journal holds what a resync would send after batch 60.
        let (crc60, after) = journal::read_after(primary.log.journal_dir(), seq + 10).unwrap().unwrap();
        assert_eq!(after.first().map(|r| r.0), Some(seq + 11));
        assert_eq!(after.last().map(|r| r.0), Some(primary.log.last().0));
        assert_ne!(crc60, 0);

        // A record that does not follow is refused, naming what the copy holds.
        let last = primary.log.last().0;
        {
            let mut c = copy.lock().unwrap();
            match c.log.commit_record(last + 2, &after[0].1) {
                Err(RecordError::Gap { have }) => assert_eq!(have, last),
                r => panic!("{r:?}"),
            }
            // The last one sent again is taken without being applied twice; another
            // batch under a number already held is a conflict (the histories differ).
            let (lseq, lbody) = after.last().unwrap();
            assert_eq!(*lseq, last);
            c.log.commit_record(last, lbody).unwrap();
            assert_eq!(c.log.last().0, last);
            assert!(matches!(c.log.commit_record(last, &after[0].1), Err(RecordError::Conflict { .. })));
        }

        // Reopened, the copy replays to the same records without a new epoch.
        primary.log.tip().uninstall().await;
        drop(Arc::try_unwrap(copy).ok().expect("the hook let go of the copy"));
        let again = Store::open_replica(&spath, false, DEFAULT_CACHE_BYTES).unwrap();
        assert_eq!(again.log.last().0, last);
        assert_eq!(dump(&again), dump(&primary));
    }
}
