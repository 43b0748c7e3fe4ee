//! NetBench driver: `streams` concurrent streams from this client to every
//! storage node, each sending blocks that the node discards
//! (`NetBenchWrite`), then asking for blocks it answers with zeros
//! (`NetBenchRead`). No disk is touched on either side, so this measures
//! the network and the transport.

use crate::progress::{Counter, Progress};
use crate::{aggregate_mib_per_s, BenchError, FsConn, Result, Span};
use hivefs_proto::{Reply, Request, MAX_PAYLOAD_LEN};
use hivefs_types::ids::{NodeId, NodeType};
use serde::Serialize;
use std::time::{Duration, Instant};

#[derive(Clone, Debug)]
pub struct NetParams {
    /// Bytes sent to, and then received from, each storage node.
    pub bytes_per_node: u64,
    pub block_bytes: u32,
    /// Concurrent streams per storage node (requests in flight at once).
    pub streams: u32,
    pub timeout: Duration,
}

impl NetParams {
    pub fn validate(&self) -> Result<()> {
        if self.block_bytes == 0 || self.block_bytes > MAX_PAYLOAD_LEN {
            return Err(BenchError::Invalid(format!(
                "net bench block size must be 1..={MAX_PAYLOAD_LEN} bytes, not {}",
                self.block_bytes
            )));
        }
        if !(1..=256).contains(&self.streams) {
            return Err(BenchError::Invalid(format!("net bench streams must be 1..=256, not {}", self.streams)));
        }
        if self.blocks_per_stream() == 0 {
            return Err(BenchError::Invalid(format!(
                "a volume of {} bytes per node gives each of {} streams less than one block of {} bytes",
                self.bytes_per_node, self.streams, self.block_bytes
            )));
        }
        Ok(())
    }

    pub fn blocks_per_stream(&self) -> u64 {
        self.bytes_per_node / u64::from(self.streams.max(1)) / u64::from(self.block_bytes.max(1))
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct NodeResult {
    pub node: u32,
    pub addr: String,
    pub bytes: u64,
    pub requests: u64,
    pub write_mib_s: f64,
    pub read_mib_s: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct NetReport {
    pub benchmark: &'static str,
    pub bytes_per_node: u64,
    pub block_bytes: u32,
    pub streams: u32,
    pub nodes: Vec<NodeResult>,
    pub total_bytes: u64,
    pub total_write_mib_s: f64,
    pub total_read_mib_s: f64,
}

/// Runs one phase on every node at once; returns each node's span.
async fn phase(
    nodes: &[(NodeId, std::sync::Arc<dyn hivefs_net::Call>)],
    p: &NetParams,
    write: bool,
    t0: Instant,
    counter: &Counter,
) -> Result<Vec<Span>> {
    let mut set = tokio::task::JoinSet::new();
    for (i, (node, pool)) in nodes.iter().enumerate() {
        for _ in 0..p.streams {
            let (node, pool, counter) = (*node, pool.clone(), counter.clone());
            let (blocks, block) = (p.blocks_per_stream(), p.block_bytes);
            set.spawn(async move {
                let start = t0.elapsed().as_secs_f64();
                let payload = vec![0x5au8; if write { block as usize } else { 0 }];
                for _ in 0..blocks {
                    let (req, data) = if write {
                        (Request::NetBenchWrite, payload.clone())
                    } else {
                        (Request::NetBenchRead { len: block }, Vec::new())
                    };
                    let what = || format!("net bench with storage node {node} at {}", pool.addr());
                    match pool.call(&req, data).await {
                        Ok((Reply::Written(n), _)) if write && n == block => {}
                        Ok((Reply::Data, d)) if !write && d.len() == block as usize => {}
                        Ok((r, _)) => return Err(BenchError::Invalid(format!("{}: unexpected reply {r:?}", what()))),
                        Err(e) => return Err(BenchError::fs(what(), e)),
                    }
                    counter.add(u64::from(block));
                }
                Ok((i, start, t0.elapsed().as_secs_f64()))
            });
        }
    }
    let mut spans: Vec<Option<Span>> = vec![None; nodes.len()];
    let per_node = p.blocks_per_stream() * u64::from(p.block_bytes) * u64::from(p.streams);
    while let Some(r) = set.join_next().await {
        let (i, start, end) = r.map_err(|e| BenchError::Invalid(format!("net bench task failed: {e}")))??;
        let s = spans[i].get_or_insert(Span { start_s: start, end_s: end, bytes: per_node });
        s.start_s = s.start_s.min(start);
        s.end_s = s.end_s.max(end);
    }
    Ok(spans.into_iter().map(|s| s.expect("every node ran streams")).collect())
}

pub async fn run(conn: &FsConn, p: &NetParams, progress: bool) -> Result<NetReport> {
    p.validate()?;
    let cluster = conn.cluster(p.timeout, p.streams as usize).await?;
    let view = cluster.view();
    let mut ids: Vec<NodeId> = view.nodes.values().filter(|n| n.node_type == NodeType::Storage).map(|n| n.id).collect();
    ids.sort();
    if ids.is_empty() {
        return Err(BenchError::Invalid(format!("mgmtd {} knows no storage nodes", conn.mgmtd)));
    }
    let mut nodes = Vec::new();
    for id in ids {
        let pool = cluster
            .node_pool(NodeType::Storage, id)
            .await
            .map_err(|e| BenchError::fs(format!("storage node {id}"), e))?;
        nodes.push((id, pool));
    }
    let per_node = p.blocks_per_stream() * u64::from(p.block_bytes) * u64::from(p.streams);
    let total = per_node * nodes.len() as u64;
    let t0 = Instant::now();
    let counter = Counter::default();
    let writes = {
        let _pr = Progress::start(progress, "net bench write".into(), total, "MiB", counter.clone());
        phase(&nodes, p, true, t0, &counter).await?
    };
    let counter = Counter::default();
    let reads = {
        let _pr = Progress::start(progress, "net bench read".into(), total, "MiB", counter.clone());
        phase(&nodes, p, false, t0, &counter).await?
    };
    Ok(NetReport {
        benchmark: "net",
        bytes_per_node: p.bytes_per_node,
        block_bytes: p.block_bytes,
        streams: p.streams,
        nodes: nodes
            .iter()
            .zip(writes.iter().zip(&reads))
            .map(|((id, pool), (w, r))| NodeResult {
                node: id.0,
                addr: pool.addr().to_string(),
                bytes: per_node,
                requests: p.blocks_per_stream() * u64::from(p.streams) * 2,
                write_mib_s: w.mib_per_s(),
                read_mib_s: r.mib_per_s(),
            })
            .collect(),
        total_bytes: total,
        total_write_mib_s: aggregate_mib_per_s(&writes),
        total_read_mib_s: aggregate_mib_per_s(&reads),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_are_checked() {
        let p =
            NetParams { bytes_per_node: 8 << 20, block_bytes: 1 << 20, streams: 4, timeout: Duration::from_secs(1) };
        assert!(p.validate().is_ok());
        assert_eq!(p.blocks_per_stream(), 2);
        assert!(NetParams { streams: 16, ..p.clone() }.validate().is_err());
        assert!(NetParams { block_bytes: MAX_PAYLOAD_LEN + 1, ..p.clone() }.validate().is_err());
        assert!(NetParams { streams: 0, ..p }.validate().is_err());
    }
}
