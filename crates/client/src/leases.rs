//! The client's side of attribute leases (see the meta crate's `leases`).
//!
//! Off unless the embedding program turns them on ([`Client::enable_leases`];
//! the mount does, because the kernel caches attributes and names for it).
//! Then every metadata request names this client's lease session in its
//! envelope; an answer that grants
//! a lease on the entry's attributes or on the name it was looked up by is
//! remembered with its end, counted from when the request was sent (so this
//! side's copy never outlives the node's record). One task per metadata node
//! polls it (`LeaseWait`) for revocations, hands each to the program's
//! callback ([`Revocation`]; a revoked name drops every name lease) and
//! acknowledges with its next poll.
//!
//! The callback and [`Client::with_lease`] run under the same lock, so a
//! program that answers its kernel inside `with_lease` never sends a copy
//! after the revocation of that copy was handled: either the kernel gets
//! the copy first and the callback drops it, or the callback runs first and
//! `with_lease` finds no lease. A grant for a request sent before a
//! revocation of the same entry arrived is not remembered.

use crate::{unexpected, Client};
use hivefs_cluster::Cluster;
use hivefs_proto::{Reply, Request};
use hivefs_types::ids::{EntryId, NodeId, NodeType};
use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tracing::{debug, warn};

/// What a metadata node revoked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Revocation {
    /// The attributes of this entry.
    Attrs(EntryId),
    /// A name this client leased: every cached name must go.
    Names,
}

/// Called with every revocation.
pub type OnRevoke = Box<dyn Fn(Revocation) + Send + Sync>;

#[derive(Default)]
struct Held {
    /// Entries with a lease on their attributes, and when it ends.
    ends: HashMap<EntryId, Instant>,
    /// Leased names per directory, and when each lease ends.
    names: HashMap<EntryId, HashMap<Vec<u8>, Instant>>,
    name_count: usize,
    /// Recently revoked entries, and when: grants of requests sent before
    /// that are stale.
    revoked: HashMap<EntryId, Instant>,
    /// The last revocation of names: name grants sent before it are stale.
    names_revoked: Option<Instant>,
    longest: Duration,
    swept_ends: usize,
    swept_names: usize,
    swept_revoked: usize,
}

pub(crate) struct LeaseSession {
    on_revoke: OnRevoke,
    held: Mutex<Held>,
    /// Metadata nodes polled.
    nodes: Mutex<BTreeSet<NodeId>>,
}

impl LeaseSession {
    pub(crate) fn new(on_revoke: OnRevoke) -> LeaseSession {
        LeaseSession { on_revoke, held: Mutex::default(), nodes: Mutex::default() }
    }

    /// A node granted a request sent at `sent` a lease on `id`'s
    /// attributes for `ms` and on `name` for `name_ms` (0: none).
    pub(crate) fn granted(&self, id: EntryId, name: Option<(EntryId, &[u8])>, sent: Instant, ms: u32, name_ms: u32) {
        let mut h = self.held.lock().expect("leases");
        let now = Instant::now();
        if ms > 0 && h.revoked.get(&id).is_none_or(|&at| at < sent) {
            let d = Duration::from_millis(ms.into());
            h.longest = h.longest.max(d);
            let end = sent + d;
            let e = h.ends.entry(id).or_insert(end);
            *e = (*e).max(end);
            if h.ends.len() > 2 * h.swept_ends + 1024 {
                h.ends.retain(|_, end| *end > now);
                h.swept_ends = h.ends.len();
            }
        }
        if let (Some((parent, name)), true) = (name, name_ms > 0) {
            if h.names_revoked.is_some_and(|at| at >= sent) {
                return;
            }
            let d = Duration::from_millis(name_ms.into());
            h.longest = h.longest.max(d);
            let end = sent + d;
            let dir = h.names.entry(parent).or_default();
            let e = dir.entry(name.to_vec()).or_insert(end);
            *e = (*e).max(end);
            h.name_count += 1;
            if h.name_count > 2 * h.swept_names + 1024 {
                h.names.retain(|_, dir| {
                    dir.retain(|_, end| *end > now);
                    !dir.is_empty()
                });
                h.name_count = h.names.values().map(HashMap::len).sum();
                h.swept_names = h.name_count;
            }
        }
    }

    fn revoke(&self, ids: &[EntryId], names: bool) {
        let mut h = self.held.lock().expect("leases");
        let now = Instant::now();
        for &id in ids {
            h.ends.remove(&id);
            h.revoked.insert(id, now);
            (self.on_revoke)(Revocation::Attrs(id));
        }
        if names {
            h.names.clear();
            h.name_count = 0;
            h.names_revoked = Some(now);
            (self.on_revoke)(Revocation::Names);
        }
        if h.revoked.len() > 2 * h.swept_revoked + 1024 {
            // A request older than the longest lease gets no usable grant anyway.
            let keep = h.longest + Duration::from_secs(1);
            h.revoked.retain(|_, at| now.saturating_duration_since(*at) < keep);
            h.swept_revoked = h.revoked.len();
        }
    }

    fn left(h: &Held, id: EntryId) -> Duration {
        h.ends.get(&id).map_or(Duration::ZERO, |end| end.saturating_duration_since(Instant::now()))
    }

    fn name_left(h: &Held, parent: EntryId, name: &[u8]) -> Duration {
        h.names
            .get(&parent)
            .and_then(|d| d.get(name))
            .map_or(Duration::ZERO, |end| end.saturating_duration_since(Instant::now()))
    }
}

impl Client {
    /// Takes attribute leases from now on: `on_revoke` is called (never
    /// concurrently with [`Client::with_lease`]) for each entry whose lease
    /// a metadata node revokes. Returns false if leases were on already.
    /// Call it inside the tokio runtime (it starts a poll task).
    pub fn enable_leases(&self, on_revoke: OnRevoke) -> bool {
        let session = Arc::new(LeaseSession::new(on_revoke));
        if self.leases.set(session.clone()).is_err() {
            return false;
        }
        // The root's node at once (the first requests go there); others on first use.
        self.poll_leases(&session, self.root.owner);
        true
    }

    /// Runs `f` with how much longer this client's lease on `id`'s
    /// attributes lasts (zero without one), excluding revocations while `f`
    /// runs.
    pub fn with_lease<R>(&self, id: EntryId, f: impl FnOnce(Duration) -> R) -> R {
        self.with_leases(id, None, |attrs, _| f(attrs))
    }

    /// Like [`Client::with_lease`], also with the lease left on `name`
    /// (directory, name).
    pub fn with_leases<R>(
        &self,
        id: EntryId,
        name: Option<(EntryId, &[u8])>,
        f: impl FnOnce(Duration, Duration) -> R,
    ) -> R {
        match self.leases.get() {
            Some(s) => {
                let h = s.held.lock().expect("leases");
                let name_left = name.map_or(Duration::ZERO, |(p, n)| LeaseSession::name_left(&h, p, n));
                f(LeaseSession::left(&h, id), name_left)
            }
            None => f(Duration::ZERO, Duration::ZERO),
        }
    }

    /// Starts polling `node` for revocations (once per node).
    pub(crate) fn poll_leases(&self, session: &Arc<LeaseSession>, node: NodeId) {
        if !session.nodes.lock().expect("lease nodes").insert(node) {
            return;
        }
        let (session, cluster, client, wait) =
            (session.clone(), self.cluster.clone(), self.ops.client, self.wait_slice());
        tokio::spawn(poll(session, cluster, client, node, wait));
    }
}

async fn poll(session: Arc<LeaseSession>, cluster: Arc<Cluster>, client: u64, node: NodeId, wait: Duration) {
    let mut acked = 0;
    let mut backoff = Duration::from_millis(50);
    loop {
        let req = Request::LeaseWait { client, acked, wait_ms: wait.as_millis() as u32 };
        let r = match cluster.node_pool(NodeType::Meta, node).await {
            Ok(pool) => pool.rpc(&req).await,
            Err(e) => Err(e),
        };
        match r {
            Ok(Reply::Revoked { ids, names, upto }) => {
                if !ids.is_empty() || names {
                    debug!(
                        "metadata node {node} revoked {} attribute leases{}",
                        ids.len(),
                        if names { " and names" } else { "" }
                    );
                }
                session.revoke(&ids, names);
                acked = upto;
                backoff = Duration::from_millis(50);
                continue;
            }
            Ok(r) => warn!("metadata node {node}: odd answer to a lease poll: {}", unexpected(r)),
            // The node is away: it grants nothing to this client until the
            // next poll arrives, and its changes wait for the leases to end.
            Err(e) => debug!("lease poll of metadata node {node} failed: {e}"),
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}
