//! The metadata node's view of the storage side: which targets may take new
//! files, and the two chunk operations metadata needs (truncate, unlink).
//!
//! A trait ([`DataTargets`]) so that namespace tests run without a cluster;
//! [`ClusterTargets`] is the real one over `hivefs-cluster`. It must not
//! decide policy: reachability comes from mgmtd, choice from `chooser`.

use hivefs_cluster::Cluster;
use hivefs_proto::{Capacity, Reachability, Request};
use hivefs_types::error::FsResult;
use hivefs_types::ids::{EntryId, NodeId, PoolId, TargetId};
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;

pub type BoxFut<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

pub trait DataTargets: Send + Sync + 'static {
    /// Online targets of `pool`: `(target, server, free bytes)`.
    fn candidates(&self, pool: PoolId) -> Vec<(TargetId, NodeId, u64)>;
    /// Sets the length of `entry`'s chunk file on `target`.
    fn truncate_chunk(&self, target: TargetId, entry: EntryId, len: u64) -> BoxFut<FsResult<()>>;
    /// Deletes `entry`'s chunk file on `target`; a missing file is success.
    fn unlink_chunk(&self, target: TargetId, entry: EntryId) -> BoxFut<FsResult<()>>;
    /// Makes sure the view of targets is current when it offers none at all
    /// (right after start, before the periodic refresh has seen new targets).
    fn refresh_if_empty(&self) -> BoxFut<()> {
        Box::pin(async {})
    }
}

/// [`DataTargets`] over the cluster view refreshed from mgmtd.
pub struct ClusterTargets {
    pub cluster: Arc<Cluster>,
}

impl DataTargets for ClusterTargets {
    fn candidates(&self, pool: PoolId) -> Vec<(TargetId, NodeId, u64)> {
        self.cluster
            .view()
            .targets
            .values()
            .filter(|t| t.pool == pool && t.reachability == Reachability::Online)
            .map(|t| (t.id, t.node, t.capacity.free_bytes))
            .collect()
    }

    fn refresh_if_empty(&self) -> BoxFut<()> {
        let cluster = self.cluster.clone();
        Box::pin(async move {
            if !cluster.view().targets.values().any(|t| t.reachability == Reachability::Online) {
                if let Err(e) = cluster.refresh().await {
                    tracing::debug!("cluster view refresh failed: {e}");
                }
            }
        })
    }

    fn truncate_chunk(&self, target: TargetId, entry: EntryId, len: u64) -> BoxFut<FsResult<()>> {
        let cluster = self.cluster.clone();
        Box::pin(async move {
            let pool = cluster.target_pool(target).await?;
            pool.rpc(&Request::TruncateChunk { target, entry, len }).await.map(|_| ())
        })
    }

    fn unlink_chunk(&self, target: TargetId, entry: EntryId) -> BoxFut<FsResult<()>> {
        let cluster = self.cluster.clone();
        Box::pin(async move {
            let pool = cluster.target_pool(target).await?;
            // Storage answers Ok for a missing chunk file (unlink is idempotent);
            // NotFound means the target itself is unknown there, so it is a failure.
            pool.rpc(&Request::UnlinkChunk { target, entry }).await.map(|_| ())
        })
    }
}

/// Space of the file system holding `dir` (statvfs).
pub fn capacity_of(dir: &Path) -> std::io::Result<Capacity> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "path contains NUL"))?;
    // SAFETY: `statvfs` is plain old data, for which all-zero bytes is a valid value.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated string and `s` a valid, writable statvfs.
    let rc = unsafe { libc::statvfs(c.as_ptr(), &mut s) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let frsize = s.f_frsize as u64;
    Ok(Capacity {
        total_bytes: s.f_blocks as u64 * frsize,
        free_bytes: s.f_bavail as u64 * frsize,
        total_inodes: s.f_files as u64,
        free_inodes: s.f_favail as u64,
    })
}
