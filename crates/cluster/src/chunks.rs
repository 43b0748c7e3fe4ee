//! Requests to several storage nodes at once, run in the calling task
//! ([`concurrently`]), and the one question about a file that clients and
//! metadata nodes both ask of its targets: how long its chunk files are
//! ([`Cluster::chunk_lens`]). This module must not interpret the lengths
//! (the stripe pattern turns them into a size).

use crate::Cluster;
use hivefs_proto::{Reply, Request};
use hivefs_types::error::{ErrorCode, FsError, FsResult};
use hivefs_types::ids::{EntryId, NodeId, NodeType, TargetId};
use hivefs_types::pattern::StripeUnit;
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

/// A request's future for [`concurrently`].
pub type Pending<T> = Pin<Box<dyn Future<Output = FsResult<T>> + Send>>;

/// Runs `futs` at once inside the calling task instead of as tasks of their
/// own: every request leaves in the first poll, from the calling thread (a
/// mount's FUSE thread, a metadata request's task), and no worker is woken
/// to start one. The results come in completion order; the first error ends
/// the wait (the others are dropped, abandoning their requests).
pub async fn concurrently<'a, T>(
    mut futs: Vec<Pin<Box<dyn Future<Output = FsResult<T>> + Send + 'a>>>,
) -> FsResult<Vec<T>> {
    let mut out = Vec::with_capacity(futs.len());
    std::future::poll_fn(|cx| {
        let mut i = 0;
        while i < futs.len() {
            match futs[i].as_mut().poll(cx) {
                Poll::Ready(Ok(v)) => {
                    out.push(v);
                    drop(futs.swap_remove(i));
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => i += 1,
            }
        }
        if futs.is_empty() {
            Poll::Ready(Ok(()))
        } else {
            Poll::Pending
        }
    })
    .await?;
    Ok(out)
}

/// `e` naming stripe unit `unit` and file `entry`, unless it names a target
/// or group already.
pub fn unit_err(unit: StripeUnit, entry: EntryId, e: FsError) -> FsError {
    if e.message.contains("target") || e.message.contains("group") {
        e
    } else {
        FsError::new(e.code, format!("{unit}, file {entry}: {}", e.message))
    }
}

/// Chunk lengths found by one request, by position in the caller's list.
type Lens = Vec<(usize, u64)>;

impl Cluster {
    /// The lengths of file `entry`'s chunk files on `units` (a missing
    /// file: 0), in their order: one `StatChunks` per storage node for
    /// plain targets, a `StatChunk` per buddy group (answered by its
    /// primary, retried across a failover for up to `budget`), all at once.
    /// A storage node too old for `StatChunks`, or one that moved while the
    /// call repeated, is asked per target.
    pub async fn chunk_lens(
        self: &Arc<Self>,
        units: &[StripeUnit],
        entry: EntryId,
        budget: Duration,
    ) -> FsResult<Vec<u64>> {
        let mut asks: Vec<Pending<Lens>> = Vec::new();
        let mut by_node: BTreeMap<NodeId, Vec<(usize, TargetId)>> = BTreeMap::new();
        let view = self.view();
        for (i, &unit) in units.iter().enumerate() {
            match (unit, unit_target(unit).and_then(|t| view.targets.get(&t))) {
                (StripeUnit::Target(t), Some(info)) => by_node.entry(info.node).or_default().push((i, t)),
                _ => {
                    let call = stat_chunk(self.clone(), budget, unit, entry);
                    asks.push(Box::pin(async move { Ok(vec![(i, call.await?)]) }));
                }
            }
        }
        for (node, at) in by_node {
            let cluster = self.clone();
            asks.push(Box::pin(async move {
                let targets: Vec<TargetId> = at.iter().map(|&(_, t)| t).collect();
                let pool = cluster.node_pool(NodeType::Storage, node).await?;
                let req = Request::StatChunks { entry, targets };
                match pool.call_with(&Default::default(), &req, bytes::Bytes::new()).await {
                    Ok((Reply::ChunkLens(l), _)) if l.len() == at.len() => {
                        Ok(at.iter().map(|&(i, _)| i).zip(l).collect())
                    }
                    Ok((r, _)) => Err(FsError::new(ErrorCode::Protocol, format!("odd StatChunks reply {r:?}"))),
                    Err(e)
                        if matches!(e.code, ErrorCode::Protocol | ErrorCode::NotSupported)
                            || hivefs_net::node_moved(&e) =>
                    {
                        let mut lens = Vec::with_capacity(at.len());
                        for (i, t) in at {
                            lens.push((i, stat_chunk(cluster.clone(), budget, StripeUnit::Target(t), entry).await?));
                        }
                        Ok(lens)
                    }
                    Err(e) => Err(FsError::new(e.code, format!("storage node {node}, file {entry}: {}", e.message))),
                }
            }));
        }
        let mut lens = vec![0; units.len()];
        for (i, l) in concurrently(asks).await?.into_iter().flatten() {
            lens[i] = l;
        }
        Ok(lens)
    }
}

fn unit_target(unit: StripeUnit) -> Option<TargetId> {
    match unit {
        StripeUnit::Target(t) => Some(t),
        StripeUnit::Group(_) => None,
    }
}

/// The length of file `entry`'s chunk file on stripe unit `unit`.
async fn stat_chunk(cluster: Arc<Cluster>, budget: Duration, unit: StripeUnit, entry: EntryId) -> FsResult<u64> {
    // A group's stand-in target is replaced by its primary on the way.
    let req = Request::StatChunk { target: TargetId(unit.raw()), entry };
    match cluster.call_unit(unit, req, bytes::Bytes::new(), budget).await {
        Ok((Reply::ChunkLen(l), _)) => Ok(l),
        Ok((r, _)) => Err(FsError::new(ErrorCode::Protocol, format!("odd StatChunk reply {r:?}"))),
        Err(e) => Err(unit_err(unit, entry, e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn after(ms: u64, r: FsResult<u64>) -> Pending<u64> {
        Box::pin(async move {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            r
        })
    }

    /// Every future runs at once: all results, the whole wait as long as the slowest.
    #[tokio::test(start_paused = true)]
    async fn concurrently_runs_every_future_at_once() {
        let start = tokio::time::Instant::now();
        let mut got = concurrently(vec![after(30, Ok(3)), after(10, Ok(1)), after(20, Ok(2))]).await.unwrap();
        assert_eq!(start.elapsed(), Duration::from_millis(30));
        got.sort();
        assert_eq!(got, vec![1, 2, 3]);
        assert!(concurrently::<u64>(Vec::new()).await.unwrap().is_empty());
    }

    /// The first error ends the wait; slower futures are not waited for.
    #[tokio::test(start_paused = true)]
    async fn concurrently_stops_at_the_first_error() {
        let start = tokio::time::Instant::now();
        let e = FsError::new(ErrorCode::Io, "target 3 failed");
        let r = concurrently(vec![after(1000, Ok(1)), after(10, Err(e)), after(5, Ok(2))]).await;
        assert_eq!(r.unwrap_err().message, "target 3 failed");
        assert_eq!(start.elapsed(), Duration::from_millis(10));
    }
}
