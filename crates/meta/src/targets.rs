//! The metadata node's view of the storage side: which targets may take new
//! files, and the two chunk operations metadata needs (truncate, unlink).
//!
//! A trait ([`DataTargets`]) so that namespace tests run without a cluster;
//! [`ClusterTargets`] is the real one over `hivefs-cluster`. It must not
//! decide policy: reachability comes from mgmtd, choice from `chooser`.

use hivefs_cluster::Cluster;
use hivefs_proto::{CapacityPool, Reachability, Request, UNLINK_CHUNKS_MAX};
use hivefs_types::error::{ErrorCode, FsResult};
use hivefs_types::ids::{EntryId, NodeId, PoolId, TargetId};
use hivefs_types::pattern::StripeUnit;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

pub type BoxFut<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

pub trait DataTargets: Send + Sync + 'static {
    /// Online targets of `pool` in the normal capacity pool: `(target, server, free bytes)`.
    fn candidates(&self, pool: PoolId) -> Vec<(TargetId, NodeId, u64)>;
    /// Online targets of `pool` in the low capacity pool, used only when the
    /// normal ones cannot fill a stripe.
    fn low_candidates(&self, _pool: PoolId) -> Vec<(TargetId, NodeId, u64)> {
        Vec::new()
    }
    /// Storage buddy groups of `pool` usable for mirrored files: both members
    /// online with room (`low`: only the primary online with room, or a member
    /// low on space); `(group id as a stripe id, the primary's server, free
    /// bytes of the fuller member)`.
    fn group_candidates(&self, _pool: PoolId, _low: bool) -> Vec<(TargetId, NodeId, u64)> {
        Vec::new()
    }
    /// Reloads the view of targets and pools now (mgmtd says they changed).
    fn refresh(&self) -> BoxFut<FsResult<()>> {
        Box::pin(async { Ok(()) })
    }
    /// Fails unless storage pool `pool` exists.
    fn check_pool(&self, _pool: PoolId) -> BoxFut<FsResult<()>> {
        Box::pin(async { Ok(()) })
    }
    /// Sets the length of `entry`'s chunk file on `target` (a target or a buddy group).
    fn truncate_chunk(&self, target: StripeUnit, entry: EntryId, len: u64) -> BoxFut<FsResult<()>>;
    /// The lengths of `entry`'s chunk files on `units` (a missing file: 0),
    /// in their order, asked concurrently. The default knows none.
    fn chunk_lens(&self, _units: Vec<StripeUnit>, entry: EntryId) -> BoxFut<FsResult<Vec<u64>>> {
        Box::pin(async move {
            Err(hivefs_types::fs_err!(NotSupported, "no storage targets to read the chunk files of {entry} from"))
        })
    }
    /// Deletes `entry`'s chunk file on `target`; a missing file is success.
    fn unlink_chunk(&self, target: StripeUnit, entry: EntryId) -> BoxFut<FsResult<()>>;
    /// Deletes the chunk files of all `entries` on `target`; missing files are
    /// success. Fails as a whole (the caller retries the whole batch, which is
    /// safe since unlink is idempotent). The default sends one
    /// [`DataTargets::unlink_chunk`] per entry, one after the other.
    fn unlink_chunks(&self, target: StripeUnit, entries: Vec<EntryId>) -> BoxFut<FsResult<()>> {
        let futs: Vec<_> = entries.into_iter().map(|e| self.unlink_chunk(target, e)).collect();
        Box::pin(async move {
            for f in futs {
                f.await?;
            }
            Ok(())
        })
    }
    /// Makes sure the view of targets is current when it offers no usable one,
    /// or when some target was unusable at the last look (right after start,
    /// before the periodic refresh has seen new targets or their first
    /// capacity report; or a target that came back).
    fn refresh_if_empty(&self) -> BoxFut<()> {
        Box::pin(async {})
    }
}

/// How old a view with unusable targets may get before a create looks again.
const STALE_AFTER: std::time::Duration = std::time::Duration::from_millis(500);

/// [`DataTargets`] over the cluster view refreshed from mgmtd.
pub struct ClusterTargets {
    pub cluster: Arc<Cluster>,
}

impl ClusterTargets {
    fn online(&self, pool: PoolId, class: CapacityPool) -> Vec<(TargetId, NodeId, u64)> {
        self.cluster
            .view()
            .targets
            .values()
            .filter(|t| t.pool == pool && t.reachability == Reachability::Online && t.capacity_pool == class)
            .map(|t| (t.id, t.node, t.capacity.free_bytes))
            .collect()
    }
}

/// How long a metadata node retries a chunk request to a buddy group whose
/// primary does not answer (a failover); the disposal task retries later anyway.
const MIRROR_RETRY: std::time::Duration = std::time::Duration::from_secs(60);

impl DataTargets for ClusterTargets {
    fn candidates(&self, pool: PoolId) -> Vec<(TargetId, NodeId, u64)> {
        self.online(pool, CapacityPool::Normal)
    }

    fn low_candidates(&self, pool: PoolId) -> Vec<(TargetId, NodeId, u64)> {
        self.online(pool, CapacityPool::Low)
    }

    fn group_candidates(&self, pool: PoolId, low: bool) -> Vec<(TargetId, NodeId, u64)> {
        let view = self.cluster.view();
        view.groups
            .values()
            .filter(|g| g.kind == hivefs_proto::GroupKind::Storage)
            .filter_map(|g| {
                let p = view.targets.get(&TargetId(g.primary))?;
                let s = view.targets.get(&TargetId(g.secondary));
                let both = s.is_some_and(|s| s.reachability == Reachability::Online);
                let worst = s.map_or(p.capacity_pool, |s| p.capacity_pool.max(s.capacity_pool));
                // Normal: both members online with room. Low: the rest whose primary
                // is online with room (a degraded group still takes new files: a
                // create must not fail while one buddy lives).
                let normal = both && worst == CapacityPool::Normal;
                let usable = p.reachability == Reachability::Online && p.capacity_pool != CapacityPool::Emergency;
                (p.pool == pool && usable && normal != low).then(|| {
                    let free = s.map_or(p.capacity.free_bytes, |s| p.capacity.free_bytes.min(s.capacity.free_bytes));
                    (TargetId(g.id.0), p.node, free)
                })
            })
            .collect()
    }

    fn refresh(&self) -> BoxFut<FsResult<()>> {
        let cluster = self.cluster.clone();
        Box::pin(async move { cluster.refresh().await.map(|_| ()) })
    }

    fn check_pool(&self, pool: PoolId) -> BoxFut<FsResult<()>> {
        let cluster = self.cluster.clone();
        Box::pin(async move {
            if cluster.view().pools.contains_key(&pool) {
                return Ok(());
            }
            let v = cluster.refresh().await?;
            if v.pools.contains_key(&pool) {
                Ok(())
            } else {
                Err(hivefs_types::fs_err!(NotFound, "storage pool {pool} does not exist"))
            }
        })
    }

    fn refresh_if_empty(&self) -> BoxFut<()> {
        let cluster = self.cluster.clone();
        Box::pin(async move {
            let view = cluster.view();
            let usable = |t: &hivefs_proto::TargetInfo| {
                t.reachability == Reachability::Online && t.capacity_pool != CapacityPool::Emergency
            };
            let none_usable = !view.targets.values().any(usable);
            // A target that is not usable may have come back (or reported its
            // first capacity) since the last refresh: look again, at most
            // every STALE_AFTER, instead of waiting for the periodic refresh.
            let some_unusable = view.targets.values().any(|t| !usable(t));
            let old = view.loaded_at.is_none_or(|at| at.elapsed() > STALE_AFTER);
            if none_usable || (some_unusable && old) {
                if let Err(e) = cluster.refresh().await {
                    tracing::debug!("cluster view refresh failed: {e}");
                }
            }
        })
    }

    fn truncate_chunk(&self, unit: StripeUnit, entry: EntryId, len: u64) -> BoxFut<FsResult<()>> {
        let cluster = self.cluster.clone();
        Box::pin(async move {
            let req = Request::TruncateChunk { target: placeholder(unit), entry, len };
            cluster.call_unit(unit, req, bytes::Bytes::new(), MIRROR_RETRY).await.map(|_| ())
        })
    }

    fn chunk_lens(&self, units: Vec<StripeUnit>, entry: EntryId) -> BoxFut<FsResult<Vec<u64>>> {
        let cluster = self.cluster.clone();
        Box::pin(async move { cluster.chunk_lens(&units, entry, MIRROR_RETRY).await })
    }

    fn unlink_chunk(&self, unit: StripeUnit, entry: EntryId) -> BoxFut<FsResult<()>> {
        let cluster = self.cluster.clone();
        Box::pin(async move {
            // Storage answers Ok for a missing chunk file (unlink is idempotent);
            // NotFound means the target itself is unknown there, so it is a failure.
            let req = Request::UnlinkChunk { target: placeholder(unit), entry };
            cluster.call_unit(unit, req, bytes::Bytes::new(), MIRROR_RETRY).await.map(|_| ())
        })
    }

    fn unlink_chunks(&self, unit: StripeUnit, entries: Vec<EntryId>) -> BoxFut<FsResult<()>> {
        let cluster = self.cluster.clone();
        Box::pin(async move {
            let target = placeholder(unit);
            for batch in entries.chunks(UNLINK_CHUNKS_MAX) {
                let req = Request::UnlinkChunks { target, entries: batch.to_vec() };
                match cluster.call_unit(unit, req, bytes::Bytes::new(), MIRROR_RETRY).await {
                    Ok(_) => {}
                    // A storage node that predates UnlinkChunks (it cannot
                    // decode it, or does not serve it): one request per entry.
                    Err(e) if matches!(e.code, ErrorCode::Protocol | ErrorCode::NotSupported) => {
                        tracing::debug!("target {target} refused UnlinkChunks ({e}); unlinking one by one");
                        for &entry in batch {
                            let req = Request::UnlinkChunk { target, entry };
                            cluster.call_unit(unit, req, bytes::Bytes::new(), MIRROR_RETRY).await?;
                        }
                    }
                    Err(e) => return Err(e),
                }
            }
            Ok(())
        })
    }
}

/// The target a chunk request names before routing: the target itself, or
/// a stand-in that `Cluster::call_unit` replaces with the group's primary.
fn placeholder(unit: StripeUnit) -> TargetId {
    TargetId(unit.raw())
}
