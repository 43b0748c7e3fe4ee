//! HiveFS's built-in benchmarks (`hivefs bench storage|net|io|md`).
//!
//! - [`storage`]: StorageBench — every storage node writes and reads a volume
//!   on its own targets, with no client and no network in the data path.
//! - [`net`]: NetBench — streams from this client to every storage node whose
//!   service discards what it receives and answers reads with zeros, so the
//!   disks are out of the picture.
//! - [`io`]: IOR-like — ranks (threads, optionally spread over processes) write then read one shared file (N-1)
//!   or a file each (N-N), through a mount (plain file I/O on a path) or
//!   through the native client library.
//! - [`md`]: mdtest-like — create / stat / read / remove phases of many small
//!   files, in a directory per rank or one shared directory.
//!
//! Aggregate bandwidth follows Equation 1 of the seed striping study: total
//! volume over (last end − first start), see [`aggregate_bandwidth`]. Results
//! are plain `Serialize` structs; the command line prints them as text or as
//! one JSON object. This crate owns measuring, not presenting, and it never
//! asserts anything about speed.

#![forbid(unsafe_code)]

pub mod backend;
pub mod combine;
pub mod cpu;
pub mod io;
pub mod md;
pub mod net;
pub mod progress;
pub mod ranks;
pub mod report;
pub mod storage;
pub mod svg;
pub mod sweep;
pub mod tune;

use hivefs_cluster::Cluster;
use hivefs_net::{ClientConfig, Pools, Secret};
use hivefs_types::error::FsError;
use serde::Serialize;
use std::sync::Arc;

/// Why a benchmark could not run or did not finish.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BenchError {
    #[error("invalid benchmark parameters: {0}")]
    Invalid(String),
    /// A file-system call failed; `what` names the node, target or path.
    #[error("{what}: {source}")]
    Fs { what: String, source: FsError },
    #[error("{what}: {source}")]
    Io { what: String, source: std::io::Error },
    #[error("interrupted (the benchmark's files were removed)")]
    Interrupted,
    /// What runs the ranks for a [`ranks::Driver`] (the command line's child
    /// processes) failed; the message says how.
    #[error("{0}")]
    Driver(String),
}

static INTERRUPTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Asks running benchmarks to stop at their next operation and clean up.
/// Only stores a flag, so a signal handler may call it.
pub fn interrupt() {
    INTERRUPTED.store(true, std::sync::atomic::Ordering::SeqCst);
}

/// Whether [`interrupt`] was called.
pub fn interrupted() -> bool {
    INTERRUPTED.load(std::sync::atomic::Ordering::SeqCst)
}

/// Fails with [`BenchError::Interrupted`] once [`interrupt`] was called.
pub fn check_interrupted() -> Result<()> {
    if interrupted() {
        return Err(BenchError::Interrupted);
    }
    Ok(())
}

impl BenchError {
    pub fn io(what: impl Into<String>, source: std::io::Error) -> BenchError {
        BenchError::Io { what: what.into(), source }
    }

    pub fn fs(what: impl Into<String>, source: FsError) -> BenchError {
        BenchError::Fs { what: what.into(), source }
    }
}

pub type Result<T, E = BenchError> = std::result::Result<T, E>;

/// How to reach a running file system: its mgmtd and shared secret.
#[derive(Clone, Debug)]
pub struct FsConn {
    pub mgmtd: String,
    pub secret: Option<Secret>,
}

impl FsConn {
    /// A cluster view loaded from mgmtd, with pools whose calls time out after `timeout`.
    pub async fn cluster(&self, timeout: std::time::Duration, conns_per_peer: usize) -> Result<Arc<Cluster>> {
        let mut cfg = ClientConfig::new(self.secret.clone()).with_timeout(timeout);
        cfg.conns_per_peer = conns_per_peer.max(1);
        let cluster = Cluster::new(&self.mgmtd, Pools::new(cfg));
        cluster.refresh().await.map_err(|e| BenchError::fs(format!("mgmtd {}", self.mgmtd), e))?;
        Ok(cluster)
    }
}

/// The interval during which one participant (rank, target, stream) moved
/// `bytes`, in seconds since a common origin.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, serde::Deserialize)]
pub struct Span {
    pub start_s: f64,
    pub end_s: f64,
    pub bytes: u64,
}

impl Span {
    /// This participant's own bandwidth in MiB/s (0 for an empty interval).
    pub fn mib_per_s(&self) -> f64 {
        mib_per_s(self.bytes, self.end_s - self.start_s)
    }
}

/// Equation 1 of the seed striping study: the sum of the volumes over the
/// time from the first start to the last end, in bytes per second. `None`
/// when there are no spans or they take no time.
pub fn aggregate_bandwidth(spans: &[Span]) -> Option<f64> {
    let first = spans.iter().map(|s| s.start_s).fold(f64::INFINITY, f64::min);
    let last = spans.iter().map(|s| s.end_s).fold(f64::NEG_INFINITY, f64::max);
    let total: u64 = spans.iter().map(|s| s.bytes).sum();
    let t = last - first;
    (t.is_finite() && t > 0.0).then(|| total as f64 / t)
}

/// Equation 1 in MiB/s (0 when it is undefined).
pub fn aggregate_mib_per_s(spans: &[Span]) -> f64 {
    aggregate_bandwidth(spans).map_or(0.0, |b| b / MIB)
}

pub const MIB: f64 = (1u64 << 20) as f64;

pub fn mib_per_s(bytes: u64, secs: f64) -> f64 {
    if secs > 0.0 {
        bytes as f64 / MIB / secs
    } else {
        0.0
    }
}

/// The wall clock in seconds since the Unix epoch.
pub fn unix_now_s() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(start_s: f64, end_s: f64, bytes: u64) -> Span {
        Span { start_s, end_s, bytes }
    }

    #[test]
    fn equation_1_uses_first_start_and_last_end() {
        // Two applications: 100 MiB in [0, 10] and 300 MiB in [5, 20]:
        // 400 MiB over 20 s, not the sum of 10 + 20 MiB/s.
        let spans = [span(0.0, 10.0, 100 << 20), span(5.0, 20.0, 300 << 20)];
        assert_eq!(aggregate_bandwidth(&spans), Some((400u64 << 20) as f64 / 20.0));
        assert_eq!(aggregate_mib_per_s(&spans), 20.0);
        assert_eq!(spans[0].mib_per_s(), 10.0);
        assert_eq!(spans[1].mib_per_s(), 20.0);
    }

    #[test]
    fn equation_1_with_gaps_and_one_span() {
        // A gap between participants counts against the aggregate.
        let spans = [span(0.0, 1.0, 1 << 20), span(3.0, 4.0, 1 << 20)];
        assert_eq!(aggregate_mib_per_s(&spans), 0.5);
        assert_eq!(aggregate_mib_per_s(&[span(2.0, 4.0, 8 << 20)]), 4.0);
        // Order does not matter.
        let rev = [spans[1], spans[0]];
        assert_eq!(aggregate_bandwidth(&rev), aggregate_bandwidth(&spans));
    }

    #[test]
    fn equation_1_undefined_cases() {
        assert_eq!(aggregate_bandwidth(&[]), None);
        assert_eq!(aggregate_bandwidth(&[span(1.0, 1.0, 10)]), None);
        assert_eq!(aggregate_mib_per_s(&[]), 0.0);
        assert_eq!(mib_per_s(10, 0.0), 0.0);
    }
}
