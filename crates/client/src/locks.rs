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
use hivefs_types::ids::NodeId;
use hivefs_types::pattern::Pattern;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tracing::{debug, warn};

/// Keep-alive state shared with the background task.
#[derive(Default)]
pub(crate) struct LockSession {
    /// Metadata nodes this client has taken locks on.
    nodes: Mutex<BTreeSet<NodeId>>,
    started: AtomicBool,
    /// Owners of append locks (unique per append).
    next_append_owner: AtomicU64,
}

/// Interval of keep-alives before a node told its lease.
const FIRST_KEEPALIVE: Duration = Duration::from_secs(1);

impl Client {
    /// This client instance's id, the first half of every lock owner.
    pub fn client_id(&self) -> u64 {
        self.ops.client
    }

    async fn lock_rpc(&self, owner: NodeId, req: &Request) -> FsResult<Reply> {
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
    /// lock is granted, or fails when `give_up` says so between two waits.
    pub async fn lock(
        &self,
        e: Ent,
        mut lock: FileLock,
        wait: bool,
        give_up: impl Fn() -> bool,
    ) -> FsResult<Option<FileLock>> {
        lock.client = self.ops.client;
        if !wait {
            return self.lock_once(e, lock, Duration::ZERO).await;
        }
        loop {
            match self.lock_once(e, lock, self.wait_slice()).await {
                Ok(None) => return Ok(None),
                Ok(Some(_)) => {}
                // The wait may have taken the whole request timeout on a busy node.
                Err(err) if err.code == ErrorCode::TimedOut => debug!("lock on {} timed out; asking again", e.id),
                Err(err) => return Err(err),
            }
            if give_up() {
                return Err(FsError::new(
                    ErrorCode::Busy,
                    format!("waiting for a lock on {} abandoned: the waiting process is being killed", e.id),
                ));
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
    /// the entry's global append lock, the end is read from the chunk files
    /// and the data written there. Returns the offset written at.
    pub async fn append(&self, e: Ent, pattern: &Pattern, data: &[u8]) -> FsResult<u64> {
        let lock = FileLock {
            kind: LockKind::Append,
            client: self.ops.client,
            owner: self.locks.next_append_owner.fetch_add(1, Ordering::Relaxed),
            pid: 0,
            start: 0,
            end: u64::MAX,
            exclusive: true,
        };
        self.lock(e, lock, true, || false).await?;
        let r = async {
            let at = self.size_from_targets(pattern, e.id).await?;
            self.write(pattern, e.id, at, data).await?;
            Ok(at)
        }
        .await;
        if let Err(err) = self.unlock(e, lock).await {
            // The lease ends it if the node cannot be told.
            warn!("releasing the append lock of {} failed: {err}", e.id);
        }
        r
    }
}

pub(crate) fn new_session() -> Arc<LockSession> {
    Arc::new(LockSession::default())
}
