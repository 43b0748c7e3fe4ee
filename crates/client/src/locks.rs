//! The client's side of global file locks and of the global append lock.
//!
//! Locks are checked on the metadata node that owns the entry's inode.
//! A blocking request waits there for at most [`Client::wait_slice`]
//! (below the request timeout) and is sent again until it is granted, so no
//! request outlives its timeout. While a client has used locks on a metadata
//! node, a background task sends it keep-alives every third of the node's
//! lease, so a live client keeps its locks and a dead one loses them.

use crate::{unexpected, Client, Ent};
use hivefs_proto::{FileLock, LockKind, Reply, Request};
use hivefs_types::error::{ErrorCode, FsError, FsResult};
use hivefs_types::ids::{EntryId, NodeId};
use hivefs_types::pattern::Pattern;
use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tracing::{debug, warn};

/// Keep-alive state shared with the background task.
#[derive(Default)]
pub(crate) struct LockSession {
    /// Metadata nodes this client has taken locks on.
    nodes: Mutex<BTreeSet<NodeId>>,
    started: AtomicBool,
    /// Owners of append locks (unique per lock taken).
    next_append_owner: AtomicU64,
    /// Append locks kept between appends, per file.
    appends: Mutex<HashMap<EntryId, Arc<AppendSlot>>>,
    /// `appends` has entries (written under its lock): plain writes, which
    /// look for a kept lock of their file, skip the lock while it has none.
    any_appends: AtomicBool,
    /// The client, for letting kept locks go when a metadata node asks.
    client: std::sync::OnceLock<std::sync::Weak<Client>>,
}

impl LockSession {
    /// Remembers the client these locks are of (once, at its start).
    pub(crate) fn set_client(&self, client: &Arc<Client>) {
        let _ = self.client.set(Arc::downgrade(client));
    }

    /// A metadata node revoked `ids` (it does so for an entry whose append
    /// lock this client keeps and another client asked for): those kept
    /// locks go after the append in progress, in the background.
    pub(crate) fn revoked(&self, ids: &[EntryId]) {
        let Some(client) = self.client.get().and_then(|c| c.upgrade()) else { return };
        let wanted: Vec<Arc<AppendSlot>> = {
            let all = self.appends.lock().expect("append locks");
            ids.iter().filter_map(|id| all.get(id).cloned()).collect()
        };
        for slot in wanted {
            let client = client.clone();
            tokio::spawn(async move {
                let mut kept = slot.kept.lock().await;
                if let Some(k) = kept.take() {
                    debug!("letting the append lock of {} go: another client wants it", k.ent.id);
                    hivefs_metrics::append_lock_let_go("revoked");
                    client.forget_slot(k.ent.id, &slot);
                    client.unlock_append(k.ent, k.lock).await;
                }
            });
        }
    }
}

/// How long this client trusts an append lock it keeps, from the sending
/// of the request that granted or confirmed it; the metadata node's
/// `locks::APPEND_HOLD` (its grace after a start is longer).
const APPEND_HOLD: Duration = Duration::from_millis(1000);
/// A kept lock is confirmed (and the end read again) when less than this is left.
const APPEND_CONFIRM: Duration = Duration::from_millis(500);
/// No append starts on a kept lock with less than this left (the write
/// must land while the lock is still this client's).
const APPEND_MARGIN: Duration = Duration::from_millis(250);

/// One file's append lock as this client keeps it.
#[derive(Default)]
struct AppendSlot {
    /// Held across an append: this client's appends to the file, one at a time.
    kept: tokio::sync::Mutex<Option<Kept>>,
    /// Set by this client's other writes and truncations of the file: the
    /// end is read again (under the lock) before the next append.
    stale: AtomicBool,
}

struct Kept {
    ent: Ent,
    lock: FileLock,
    /// The end of the file: where the next append goes.
    end: u64,
    /// The lock is this client's until then (see [`APPEND_HOLD`]).
    until: Instant,
}

/// Interval of keep-alives before a node told its lease.
const FIRST_KEEPALIVE: Duration = Duration::from_secs(1);

impl Client {
    /// This client instance's id, the first half of every lock owner.
    pub fn client_id(&self) -> u64 {
        self.ops.client
    }

    async fn lock_rpc(&self, owner: NodeId, req: &Request) -> FsResult<Reply> {
        // A file made ahead is on its node before anything locks it (see `ahead`).
        self.ahead_landed().await;
        self.cluster.call_meta(owner, &Default::default(), req, self.mirror_retry).await
    }

    /// Starts keep-alives to `node` (once per node).
    fn keep_alive(&self, node: NodeId) {
        self.locks.nodes.lock().expect("lock nodes").insert(node);
        if self.locks.started.swap(true, Ordering::AcqRel) {
            return;
        }
        let (session, cluster, client) = (self.locks.clone(), self.cluster.clone(), self.ops.client);
        tokio::spawn(async move {
            let mut every = FIRST_KEEPALIVE;
            loop {
                let nodes: Vec<NodeId> = session.nodes.lock().expect("lock nodes").iter().copied().collect();
                for node in nodes {
                    let r = cluster.meta_rpc(node, &Request::LockKeepAlive { client }).await;
                    match r {
                        Ok(Reply::LockLease { lease_ms, known }) => {
                            every = (Duration::from_millis(lease_ms) / 3)
                                .clamp(Duration::from_millis(10), Duration::from_secs(10));
                            if !known {
                                debug!("metadata node {node} had no lock lease for this client (expired or restarted)");
                            }
                        }
                        Ok(r) => warn!("metadata node {node}: odd keep-alive reply {r:?}"),
                        Err(e) => warn!("lock keep-alive to metadata node {node} failed: {e}"),
                    }
                }
                tokio::time::sleep(every).await;
            }
        });
    }

    /// Tries once to set `lock` on `e`, waiting on the node at most `wait`.
    /// `Ok(None)`: granted; `Ok(Some(c))`: refused by `c`.
    async fn lock_once(&self, e: Ent, lock: FileLock, wait: Duration) -> FsResult<Option<FileLock>> {
        self.keep_alive(e.owner);
        let req = Request::LockAcquire { entry: e.id, lock, wait_ms: wait.as_millis() as u32 };
        match self.lock_rpc(e.owner, &req).await? {
            Reply::Lock(c) => Ok(c),
            r => Err(unexpected(r)),
        }
    }

    /// Sets `lock` on `e` (its `client` is filled in). Without `wait`, a
    /// conflict is returned at once; with `wait`, the call returns when the
    /// lock is granted, or fails when `give_up` says so between two waits,
    /// or when `interrupt` fires (the node is told to end the wait at once,
    /// `LockCancel`; a lock granted before that is kept and the call succeeds).
    pub async fn lock(
        &self,
        e: Ent,
        mut lock: FileLock,
        wait: bool,
        give_up: impl Fn() -> bool,
        interrupt: Option<&Interrupt>,
    ) -> FsResult<Option<FileLock>> {
        lock.client = self.ops.client;
        if !wait {
            return self.lock_once(e, lock, Duration::ZERO).await;
        }
        loop {
            let once = self.lock_once(e, lock, self.wait_slice());
            tokio::pin!(once);
            let r = match interrupt {
                None => once.await,
                Some(i) => {
                    tokio::select! {
                        r = &mut once => r,
                        () = i.wait() => self.cancel_wait(e, lock, once).await,
                    }
                }
            };
            match r {
                Ok(None) => return Ok(None),
                Ok(Some(_)) => {}
                // The wait may have taken the whole request timeout on a busy node.
                Err(err) if err.code == ErrorCode::TimedOut => debug!("lock on {} timed out; asking again", e.id),
                Err(err) => return Err(err),
            }
            if interrupt.is_some_and(Interrupt::is_set) {
                return Err(FsError::new(
                    ErrorCode::Busy,
                    format!("waiting for a lock on {} interrupted by a signal", e.id),
                ));
            }
            if give_up() {
                return Err(FsError::new(
                    ErrorCode::Busy,
                    format!("waiting for a lock on {} abandoned: the waiting process is being killed", e.id),
                ));
            }
        }
    }

    /// Asks the node to end the wait of `lock`'s owner on `e`, again every
    /// 200 ms (the cancel may overtake the wait on another connection),
    /// until the waiting request `once` answers; returns that answer.
    async fn cancel_wait(
        &self,
        e: Ent,
        lock: FileLock,
        mut once: std::pin::Pin<&mut impl std::future::Future<Output = FsResult<Option<FileLock>>>>,
    ) -> FsResult<Option<FileLock>> {
        let mut supported = true;
        loop {
            let cancel = async {
                if supported {
                    match self.lock_rpc(e.owner, &Request::LockCancel { entry: e.id, lock }).await {
                        // A node of an older version: its wait runs out instead.
                        Err(err) if err.code == ErrorCode::Protocol => supported = false,
                        Err(err) => debug!("cancelling the lock wait on {}: {err}", e.id),
                        Ok(_) => {}
                    }
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            };
            tokio::select! {
                r = once.as_mut() => return r,
                () = cancel => {}
            }
        }
    }

    /// Unlocks the range of `lock` for its owner (the whole range drops all
    /// of the owner's locks of that kind).
    pub async fn unlock(&self, e: Ent, mut lock: FileLock) -> FsResult<()> {
        lock.client = self.ops.client;
        match self.lock_rpc(e.owner, &Request::LockRelease { entry: e.id, lock }).await? {
            Reply::Ok => Ok(()),
            r => Err(unexpected(r)),
        }
    }

    /// F_GETLK: the first lock of another owner conflicting with `lock`.
    pub async fn test_lock(&self, e: Ent, mut lock: FileLock) -> FsResult<Option<FileLock>> {
        lock.client = self.ops.client;
        match self.lock_rpc(e.owner, &Request::LockTest { entry: e.id, lock }).await? {
            Reply::Lock(c) => Ok(c),
            r => Err(unexpected(r)),
        }
    }

    /// Appends `data` at the end of file `e` as every client sees it: under
    /// the entry's global append lock, at the end read from the chunk files.
    /// Returns the offset written at.
    ///
    /// The lock is kept after the append, and later appends of this client
    /// go to the end it knows without asking anyone, while the lock is
    /// trusted ([`APPEND_HOLD`] from the request that granted or confirmed
    /// it). A confirmation, with less than [`APPEND_CONFIRM`] left, also
    /// reads the end again (a truncation by another client is seen then). The
    /// lock is let go when the metadata node tells this client (through the
    /// lease poll) that another client asked for it, or refuses a
    /// confirmation because one waits, when it runs out unused, on a failed
    /// write, and by [`Client::let_go_append`].
    pub async fn append(self: &Arc<Self>, e: Ent, pattern: &Pattern, data: &[u8]) -> FsResult<u64> {
        loop {
            let slot = {
                let mut all = self.locks.appends.lock().expect("append locks");
                self.locks.any_appends.store(true, Ordering::Release);
                all.entry(e.id).or_default().clone()
            };
            let kept = slot.kept.lock().await;
            // A slot let go while this append waited for it is out of the
            // map: a lock taken in it would be one nobody finds (and the
            // next append's own lock would wait for it to run out).
            if self.is_slot(e.id, &slot) {
                return self.append_in(e, pattern, data, &slot, kept).await;
            }
        }
    }

    /// [`Client::append`] in `slot`, the file's slot, with its lock `kept`.
    async fn append_in(
        self: &Arc<Self>,
        e: Ent,
        pattern: &Pattern,
        data: &[u8],
        slot: &Arc<AppendSlot>,
        mut kept: tokio::sync::MutexGuard<'_, Option<Kept>>,
    ) -> FsResult<u64> {
        // Why the lock goes after this append, if it does.
        let mut last: Option<&'static str> = None;
        if let Some(k) = kept.as_mut() {
            if Instant::now() + APPEND_CONFIRM >= k.until {
                let sent = Instant::now();
                let answer = self.lock_once(e, k.lock, Duration::ZERO).await;
                let in_time = Instant::now() + APPEND_MARGIN < k.until;
                match answer {
                    // This client's all along: trusted for longer, the end read again.
                    Ok(None) if in_time => {
                        k.until = sent + APPEND_HOLD;
                        slot.stale.store(true, Ordering::Release);
                    }
                    // Refused because another client waits: one more append, then it goes.
                    Ok(Some(_)) if in_time => last = Some("refused"),
                    // Too late to know that it stayed this client's (or failed):
                    // let go, and start afresh below.
                    r => {
                        if let Err(err) = r {
                            debug!("confirming the append lock of {} failed: {err}", e.id);
                        }
                        let k = kept.take().expect("kept");
                        hivefs_metrics::append_lock_let_go("late");
                        self.unlock_append(e, k.lock).await;
                    }
                }
            }
        }
        if kept.is_none() {
            let lock = FileLock {
                kind: LockKind::Append,
                client: self.ops.client,
                owner: self.locks.next_append_owner.fetch_add(1, Ordering::Relaxed),
                pid: 0,
                start: 0,
                end: u64::MAX,
                exclusive: true,
            };
            let sent = Instant::now();
            self.lock(e, lock, true, || false, None).await?;
            // The end is read below, under the lock.
            slot.stale.store(true, Ordering::Release);
            let until = sent + APPEND_HOLD;
            // Granted after a long wait: trusted for this append only.
            if Instant::now() + APPEND_CONFIRM >= until {
                last = Some("waited");
            } else {
                self.expire_append(e, slot.clone(), lock.owner);
            }
            *kept = Some(Kept { ent: e, lock, end: 0, until });
        }
        let k = kept.as_mut().expect("kept");
        let r = async {
            if slot.stale.swap(false, Ordering::AcqRel) {
                k.end = self.size_from_targets(pattern, e.id).await?;
            }
            self.write(pattern, e.id, k.end, data).await?;
            Ok(k.end)
        }
        .await;
        match &r {
            Ok(at) => k.end = at + data.len() as u64,
            // Part of it may have landed: the end is not known.
            Err(_) => last = Some("failed"),
        }
        if let Some(why) = last {
            // Out of the map before the lock goes (an append waiting for
            // this slot then starts a new one).
            let k = kept.take().expect("kept");
            hivefs_metrics::append_lock_let_go(why);
            self.forget_slot(e.id, slot);
            self.unlock_append(e, k.lock).await;
        }
        r
    }

    /// Whether `slot` is the slot of file `id` in the map.
    fn is_slot(&self, id: EntryId, slot: &Arc<AppendSlot>) -> bool {
        self.locks.appends.lock().expect("append locks").get(&id).is_some_and(|s| Arc::ptr_eq(s, slot))
    }

    fn forget_slot(&self, id: EntryId, slot: &Arc<AppendSlot>) {
        let mut all = self.locks.appends.lock().expect("append locks");
        if all.get(&id).is_some_and(|s| Arc::ptr_eq(s, slot)) {
            all.remove(&id);
            self.locks.any_appends.store(!all.is_empty(), Ordering::Release);
        }
    }

    /// [`Client::append`] on the calling thread, without the async runtime:
    /// only on a kept lock with more than [`APPEND_CONFIRM`] left, an end
    /// known, no append in progress and the chunk files held here
    /// ([`Client::write_now`]); `None` otherwise, having written nothing.
    pub fn append_now(&self, id: EntryId, pattern: &Pattern, data: &[u8]) -> Option<FsResult<u64>> {
        let slot = self.locks.appends.lock().expect("append locks").get(&id)?.clone();
        let mut kept = slot.kept.try_lock().ok()?;
        let k = kept.as_mut()?;
        if slot.stale.load(Ordering::Acquire) || Instant::now() + APPEND_CONFIRM >= k.until {
            return None;
        }
        match self.write_now(pattern, id, k.end, data)? {
            Ok(n) => {
                let at = k.end;
                k.end += n as u64;
                Some(Ok(at))
            }
            Err(e) => {
                // Part of it may have landed: the next append reads the end again.
                slot.stale.store(true, Ordering::Release);
                Some(Err(e))
            }
        }
    }

    /// This client wrote to or truncated file `id` other than by appending:
    /// the next append reads the end again.
    pub fn note_other_write(&self, id: EntryId) {
        if !self.locks.any_appends.load(Ordering::Acquire) {
            return;
        }
        if let Some(slot) = self.locks.appends.lock().expect("append locks").get(&id) {
            slot.stale.store(true, Ordering::Release);
        }
    }

    /// Whether this client keeps the append lock of file `id`.
    pub fn keeps_append(&self, id: EntryId) -> bool {
        self.locks.any_appends.load(Ordering::Acquire)
            && self.locks.appends.lock().expect("append locks").contains_key(&id)
    }

    /// Lets the append lock this client keeps on `e` go (when the last
    /// handle on the file closes), after an append in progress.
    pub async fn let_go_append(&self, e: Ent) {
        let slot = {
            let mut all = self.locks.appends.lock().expect("append locks");
            let slot = all.remove(&e.id);
            self.locks.any_appends.store(!all.is_empty(), Ordering::Release);
            slot
        };
        if let Some(slot) = slot {
            if let Some(k) = slot.kept.lock().await.take() {
                hivefs_metrics::append_lock_let_go("closed");
                self.unlock_append(e, k.lock).await;
            }
        }
    }

    async fn unlock_append(&self, e: Ent, lock: FileLock) {
        if let Err(err) = self.unlock(e, lock).await {
            // The lease ends it if the node cannot be told.
            warn!("releasing the append lock of {} failed: {err}", e.id);
        }
    }

    /// Lets a kept append lock go once it runs out unused (another client
    /// may wait for it without this client ever asking again).
    fn expire_append(self: &Arc<Self>, e: Ent, slot: Arc<AppendSlot>, owner: u64) {
        let me = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                let until = match slot.kept.lock().await.as_ref() {
                    Some(k) if k.lock.owner == owner => k.until,
                    // Let go already (a later lock has a task of its own).
                    _ => return,
                };
                tokio::time::sleep_until(until.into()).await;
                let Some(client) = me.upgrade() else { return };
                let mut kept = slot.kept.lock().await;
                if kept.as_ref().is_some_and(|k| k.lock.owner == owner && Instant::now() >= k.until) {
                    let k = kept.take().expect("kept");
                    hivefs_metrics::append_lock_let_go("expired");
                    client.forget_slot(e.id, &slot);
                    client.unlock_append(e, k.lock).await;
                    return;
                }
            }
        });
    }
}

pub(crate) fn new_session() -> Arc<LockSession> {
    Arc::new(LockSession::default())
}

/// Set when the process waiting for a lock got a signal (the kernel's
/// FUSE interrupt of its request): [`Client::lock`] then stops waiting.
pub type Interrupt = hivefs_cluster::Latch;
