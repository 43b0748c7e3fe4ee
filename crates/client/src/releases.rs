//! Handles released in the background: [`Client::release_later`] queues a
//! release per metadata node and one task sends them, as one `ReleaseMany`
//! per node and round, while the program goes on. A round gathers for
//! [`GATHER`] (2 ms) and releases queued while a round is on its way go
//! together in the next, so many closes share a request.
//!
//! A release only lowers the node's count of open handles (an unlinked
//! file's chunks are deleted at the last one): sent later, the chunks of a
//! file unlinked while open go later, nothing else changes. Before the
//! program exits it calls [`Client::flush_releases`]. This module must not
//! release anything itself (the program decides what is closed).
//!
//! A release also says which stripe positions' chunk files the client
//! changed since its previous release of the file ([`Client::note_written`],
//! noted before each write goes out): a file its metadata node made has
//! chunk files only where a release reported writes, and its removal
//! deletes only those (none when nothing was written).

use crate::Client;
use hivefs_proto::{Reply, Request, RELEASE_MANY_MAX};
use hivefs_types::error::ErrorCode;
use hivefs_types::ids::{EntryId, NodeId};
use hivefs_types::pattern::StripeSet;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;
use tracing::{debug, warn};

/// Per metadata node, handles to release: the file, and the stripe
/// positions whose chunk files this client changed.
type Batch = HashMap<NodeId, Vec<(EntryId, StripeSet)>>;

#[derive(Default)]
pub(crate) struct Releases {
    /// Per metadata node, handles to release (and where each wrote), and
    /// whether a round is on its way.
    queued: Mutex<(Batch, bool)>,
    /// Files whose chunk files this client changed since it last released
    /// a handle of theirs, and at which stripe positions.
    written: Mutex<HashMap<EntryId, StripeSet>>,
    wake: Notify,
    /// Rung when a round ends with nothing queued.
    drained: Notify,
    started: AtomicBool,
    /// Nodes that answered `ReleaseWritten` with `Protocol` (older): a
    /// `ReleaseMany`, and if that is refused too, one `Release` per handle.
    older: Mutex<HashMap<NodeId, Older>>,
}

impl Client {
    /// Releases the handle of `id` (stored on `owner`) in the background.
    /// Call it inside the tokio runtime (the first call starts the task).
    pub fn release_later(self: &Arc<Self>, id: EntryId, owner: NodeId) {
        self.local.forget(id);
        let wrote = self.take_written(id);
        let r = &self.releases;
        r.queued.lock().expect("releases").0.entry(owner).or_default().push((id, wrote));
        if !r.started.swap(true, Ordering::AcqRel) {
            tokio::spawn(run(Arc::downgrade(self), r.clone()));
        }
        r.wake.notify_one();
    }

    /// This client is about to change the chunk files of `id` at stripe
    /// positions `at` (a write, an allocation, a copy into it): the next
    /// release of a handle of `id` says so.
    pub fn note_written(&self, id: EntryId, at: StripeSet) {
        let mut w = self.releases.written.lock().expect("written");
        let s = w.entry(id).or_default();
        *s = s.union(at);
    }

    /// Where this client changed the chunk files of `id` since the last
    /// call (empty: nowhere); forgets it (the release that asks reports it).
    pub(crate) fn take_written(&self, id: EntryId) -> StripeSet {
        self.releases.written.lock().expect("written").remove(&id).unwrap_or_default()
    }

    /// Waits until every release queued so far was sent and answered (or failed).
    pub async fn flush_releases(&self) {
        let r = &self.releases;
        loop {
            let drained = r.drained.notified();
            {
                let q = r.queued.lock().expect("releases");
                if q.0.is_empty() && !q.1 {
                    return;
                }
            }
            drained.await;
        }
    }

    /// One round: every queued release, one request per node (more for
    /// more than [`RELEASE_MANY_MAX`]), the nodes at once.
    async fn release_round(self: &Arc<Self>, batch: Batch) {
        let mut sends = tokio::task::JoinSet::new();
        for (node, ids) in batch {
            let c = self.clone();
            sends.spawn(async move {
                for part in ids.chunks(RELEASE_MANY_MAX) {
                    c.release_on(node, part).await;
                }
            });
        }
        while sends.join_next().await.is_some() {}
    }

    async fn release_on(&self, node: NodeId, handles: &[(EntryId, StripeSet)]) {
        let older = self.releases.older.lock().expect("releases").get(&node).copied();
        // An older request is built only after the newer one was refused.
        if older.is_none() && self.ask(node, &Request::ReleaseWritten { handles: handles.to_vec() }, Older::Many).await
        {
            return;
        }
        if older != Some(Older::Single) {
            let ids = handles.iter().map(|h| h.0).collect();
            let wrote = handles.iter().filter(|h| !h.1.is_empty()).map(|h| h.0).collect();
            if self.ask(node, &Request::ReleaseMany { ids, wrote }, Older::Single).await {
                return;
            }
        }
        for &(id, wrote) in handles {
            if let Err(e) = self.release_now(id, node, !wrote.is_empty()).await {
                warn!("release of {id} on metadata node {node} failed: {e}");
            }
        }
    }

    /// Sends a batch release; false when the node refused it as unknown
    /// (`Protocol`: it is older), which it is then not asked again
    /// (`refused`: what it takes instead).
    async fn ask(&self, node: NodeId, req: &Request, refused: Older) -> bool {
        match self.cluster.meta_rpc(node, req).await {
            Ok(Reply::Ok) => {}
            Err(e) if e.code == ErrorCode::Protocol => {
                debug!("metadata node {node} takes no {} ({e})", req.name());
                self.releases.older.lock().expect("releases").insert(node, refused);
                return false;
            }
            Ok(r) => warn!("metadata node {node}: odd answer to {}: {}", req.name(), crate::unexpected(r)),
            Err(e) => warn!("{} on metadata node {node} failed: {e}", req.name()),
        }
        true
    }
}

/// What an older metadata node takes instead of `ReleaseWritten`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Older {
    /// `ReleaseMany` (which says only whether each handle wrote).
    Many,
    /// One `Release` per handle.
    Single,
}

/// How long the first release of a round waits for others to join it,
/// unless [`GATHER_MAX`] are queued sooner: closes one at a time (creates
/// in one directory, which the kernel serializes) then share a request.
pub const GATHER: std::time::Duration = std::time::Duration::from_millis(2);
const GATHER_MAX: usize = 256;

/// The sending task; it ends at its first wake after the client is gone.
async fn run(client: std::sync::Weak<Client>, r: Arc<Releases>) {
    loop {
        let wake = r.wake.notified();
        let queued = r.queued.lock().expect("releases").0.values().map(Vec::len).sum::<usize>();
        if queued > 0 && queued < GATHER_MAX {
            tokio::time::sleep(GATHER).await;
        }
        let batch = {
            let mut q = r.queued.lock().expect("releases");
            q.1 = !q.0.is_empty();
            std::mem::take(&mut q.0)
        };
        if batch.is_empty() {
            r.drained.notify_waiters();
            wake.await;
            continue;
        }
        let Some(c) = client.upgrade() else { return };
        c.release_round(batch).await;
        drop(c);
        r.queued.lock().expect("releases").1 = false;
    }
}
