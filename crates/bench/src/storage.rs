//! StorageBench driver: asks every storage node (all of them, or those
//! serving the selected targets) at once to run `Request::StorageBench` on
//! its targets, and combines the per-target results. The data never crosses
//! the network; this only measures what the targets' disks do.

use crate::progress::{Counter, Progress};
use crate::{aggregate_mib_per_s, BenchError, FsConn, Result, Span};
use hivefs_proto::{Reply, Request, TargetBench};
use hivefs_types::ids::{NodeId, NodeType, TargetId};
use serde::Serialize;
use std::collections::BTreeMap;
use std::time::Duration;

#[derive(Clone, Debug)]
pub struct StorageParams {
    /// Volume written and then read on each target.
    pub bytes_per_target: u64,
    pub block_bytes: u32,
    /// Threads per target, each with its own scratch file.
    pub threads: u32,
    pub direct: bool,
    /// Targets to run on; empty: every registered target.
    pub targets: Vec<TargetId>,
    /// Longest the whole run may take on a node.
    pub timeout: Duration,
}

impl StorageParams {
    pub fn validate(&self) -> Result<()> {
        if self.threads == 0 || self.block_bytes == 0 || self.bytes_per_target == 0 {
            return Err(BenchError::Invalid("volume, block size and threads must be positive".into()));
        }
        if self.bytes_per_target / u64::from(self.threads) < u64::from(self.block_bytes) {
            return Err(BenchError::Invalid(format!(
                "a volume of {} bytes per target gives each of {} threads less than one block of {} bytes",
                self.bytes_per_target, self.threads, self.block_bytes
            )));
        }
        Ok(())
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct TargetResult {
    pub target: u32,
    pub node: u32,
    pub bytes: u64,
    pub write_mib_s: f64,
    pub read_mib_s: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct StorageReport {
    pub benchmark: &'static str,
    pub bytes_per_target: u64,
    pub block_bytes: u32,
    pub threads: u32,
    pub direct: bool,
    pub targets: Vec<TargetResult>,
    pub total_bytes: u64,
    /// Equation 1 over all targets' write intervals.
    pub total_write_mib_s: f64,
    /// Equation 1 over all targets' read intervals.
    pub total_read_mib_s: f64,
}

fn span(start_ns: u64, end_ns: u64, bytes: u64) -> Span {
    Span { start_s: start_ns as f64 / 1e9, end_s: end_ns as f64 / 1e9, bytes }
}

pub async fn run(conn: &FsConn, p: &StorageParams, progress: bool) -> Result<StorageReport> {
    p.validate()?;
    let cluster = conn.cluster(p.timeout, 1).await?;
    let view = cluster.view();
    let mut by_node: BTreeMap<NodeId, Vec<TargetId>> = BTreeMap::new();
    if p.targets.is_empty() {
        for t in view.targets.values() {
            by_node.entry(t.node).or_default().push(t.id);
        }
    } else {
        for &t in &p.targets {
            let info = view
                .targets
                .get(&t)
                .ok_or_else(|| BenchError::Invalid(format!("storage target {t} is not registered with mgmtd")))?;
            by_node.entry(info.node).or_default().push(t);
        }
    }
    if by_node.is_empty() {
        return Err(BenchError::Invalid(format!("mgmtd {} knows no storage targets", conn.mgmtd)));
    }
    let ntargets: usize = by_node.values().map(Vec::len).sum();
    let _progress =
        Progress::start(progress, format!("storage bench on {ntargets} targets"), 0, "", Counter::default());
    let mut tasks = tokio::task::JoinSet::new();
    for (node, mut targets) in by_node {
        targets.sort();
        targets.dedup();
        let pool = cluster
            .node_pool(NodeType::Storage, node)
            .await
            .map_err(|e| BenchError::fs(format!("storage node {node} (targets {})", join(&targets)), e))?;
        let req = Request::StorageBench {
            targets: targets.clone(),
            bytes_per_target: p.bytes_per_target,
            block_bytes: p.block_bytes,
            threads: p.threads,
            direct: p.direct,
        };
        tasks.spawn(async move {
            let what = || format!("storage bench on storage node {node} at {}", pool.addr());
            match pool.rpc(&req).await {
                Ok(Reply::StorageBench(r)) if r.len() == targets.len() => Ok((node, r)),
                Ok(other) => Err(BenchError::Invalid(format!("{}: unexpected reply {other:?}", what()))),
                Err(e) => Err(BenchError::fs(what(), e)),
            }
        });
    }
    let mut results: Vec<(NodeId, TargetBench)> = Vec::new();
    while let Some(r) = tasks.join_next().await {
        let (node, r) = r.map_err(|e| BenchError::Invalid(format!("storage bench task failed: {e}")))??;
        results.extend(r.into_iter().map(|t| (node, t)));
    }
    results.sort_by_key(|(_, t)| t.target);
    Ok(report(p, &results))
}

fn join(t: &[TargetId]) -> String {
    t.iter().map(|t| t.to_string()).collect::<Vec<_>>().join(",")
}

fn report(p: &StorageParams, results: &[(NodeId, TargetBench)]) -> StorageReport {
    let writes: Vec<Span> = results.iter().map(|(_, t)| span(t.write_start_ns, t.write_end_ns, t.bytes)).collect();
    let reads: Vec<Span> = results.iter().map(|(_, t)| span(t.read_start_ns, t.read_end_ns, t.bytes)).collect();
    StorageReport {
        benchmark: "storage",
        bytes_per_target: p.bytes_per_target,
        block_bytes: p.block_bytes,
        threads: p.threads,
        direct: p.direct,
        targets: results
            .iter()
            .zip(writes.iter().zip(&reads))
            .map(|((node, t), (w, r))| TargetResult {
                target: t.target.0,
                node: node.0,
                bytes: t.bytes,
                write_mib_s: w.mib_per_s(),
                read_mib_s: r.mib_per_s(),
            })
            .collect(),
        total_bytes: results.iter().map(|(_, t)| t.bytes).sum(),
        total_write_mib_s: aggregate_mib_per_s(&writes),
        total_read_mib_s: aggregate_mib_per_s(&reads),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_combines_targets_by_equation_1() {
        let p = StorageParams {
            bytes_per_target: 1 << 20,
            block_bytes: 4096,
            threads: 1,
            direct: false,
            targets: vec![],
            timeout: Duration::from_secs(1),
        };
        let s = 1_000_000_000u64;
        let t = |id, ws, we, rs, re| TargetBench {
            target: TargetId(id),
            bytes: 4 << 20,
            write_start_ns: ws * s,
            write_end_ns: we * s,
            read_start_ns: rs * s,
            read_end_ns: re * s,
        };
        let r = report(&p, &[(NodeId(1), t(1, 10, 12, 12, 13)), (NodeId(2), t(2, 11, 14, 14, 16))]);
        assert_eq!(r.total_bytes, 8 << 20);
        assert_eq!(r.targets[0].write_mib_s, 2.0);
        assert_eq!(r.targets[1].read_mib_s, 2.0);
        assert_eq!(r.total_write_mib_s, 2.0); // 8 MiB over 10..14
        assert_eq!(r.total_read_mib_s, 2.0); // 8 MiB over 12..16
    }

    #[test]
    fn parameters_are_checked() {
        let mut p = StorageParams {
            bytes_per_target: 1 << 20,
            block_bytes: 1 << 20,
            threads: 2,
            direct: false,
            targets: vec![],
            timeout: Duration::from_secs(1),
        };
        assert!(p.validate().is_err());
        p.threads = 1;
        assert!(p.validate().is_ok());
        p.threads = 0;
        assert!(p.validate().is_err());
    }
}
