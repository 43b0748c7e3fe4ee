//! HiveFS file-system check and repair (`hivefs fsck [--repair]`): the
//! consistency of a whole file system, every metadata node (from mgmtd's
//! registry) and every storage target.
//!
//! A walk lists every target's chunk files, then every metadata node's
//! disposal records, inodes and dentries, page by page, into a [`Checker`]
//! ([`checker`]: the pure comparison; [`walk`]: the walks). An online walk is
//! not a snapshot, so problems of a first walk are candidates: a second walk
//! re-reads everything and only problems found by both are reported, less
//! those of entries that a pending cross-node operation names (its
//! coordinator resolves them). [`repair`] sends each problem's fix to the
//! metadata node that holds the record or to the storage target. A check
//! ends in a [`Report`], a plain `Serialize` struct.
//!
//! This crate owns checking and repairing, not presenting: it must not print
//! (progress goes to a callback), parse arguments, or start and stop
//! services (the command line starts those of a stopped file system and
//! hands this crate the mgmtd address).

#![forbid(unsafe_code)]

pub mod checker;
pub mod repair;
pub mod walk;

pub use checker::{Checker, Fix, Kind, Problem};
pub use repair::{repair, Repair};
pub use walk::{check, pending_ops, Checked, Nodes, Pending};

use hivefs_types::error::FsError;
use serde::Serialize;
use std::collections::BTreeMap;

/// Why a check could not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FsckError {
    /// A request failed; `what` names it and the node or target it went to.
    #[error("{what}: {error}")]
    Call { what: String, error: FsError },
    /// A node answered with a reply of the wrong kind.
    #[error("{0}")]
    Reply(String),
    /// The file system cannot be checked as it is (a node offline, no
    /// metadata node, a target of an unknown node).
    #[error("{0}")]
    Cluster(String),
}

impl FsckError {
    pub(crate) fn call(what: String, error: FsError) -> FsckError {
        FsckError::Call { what, error }
    }
}

pub type Result<T, E = FsckError> = std::result::Result<T, E>;

/// The outcome of a check (and its repairs): the command line prints it as
/// text or as this JSON object.
#[derive(Debug, Serialize)]
pub struct Report {
    /// No problem found.
    pub clean: bool,
    /// Records the last walk read.
    pub scanned: u64,
    pub problems: Vec<Problem>,
    pub repairs: Vec<Repair>,
    /// Number of problems per kind.
    pub summary: BTreeMap<&'static str, usize>,
    /// Cross-node operations still pending.
    pub pending: Vec<Pending>,
}

impl Report {
    pub fn new(checked: Checked, repairs: Vec<Repair>) -> Report {
        let Checked { problems, scanned, pending } = checked;
        let mut summary = BTreeMap::new();
        for p in &problems {
            *summary.entry(p.kind.as_str()).or_insert(0) += 1;
        }
        Report { clean: problems.is_empty(), scanned, problems, repairs, summary, pending }
    }

    /// Repairs that were done.
    pub fn repaired(&self) -> usize {
        self.repairs.iter().filter(|r| r.done).count()
    }

    /// Problems not repaired.
    pub fn left(&self) -> usize {
        self.problems.len() - self.repaired()
    }
}

/// Checks the file system of `nodes` (two walks, see the crate doc) and, with
/// `repair`, applies the fixes. `progress` hears the number of records a walk
/// has scanned so far, after each page.
pub async fn run(nodes: &Nodes, repair: bool, progress: &mut (dyn FnMut(u64) + Send)) -> Result<Report> {
    let checked = check(nodes, progress).await?;
    let repairs = if repair { self::repair(nodes, &checked.problems).await } else { Vec::new() };
    Ok(Report::new(checked, repairs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use hivefs_types::ids::{EntryId, NodeId, TargetId};

    fn checked() -> Checked {
        let mut c = Checker::default();
        for n in 1..=3 {
            c.add_chunk(TargetId(n), EntryId { node: 1, epoch: 1, counter: 7 }, 10);
        }
        Checked { problems: c.finish(), scanned: 3, pending: Vec::new() }
    }

    #[test]
    fn a_report_counts_problems_per_kind_and_those_left_after_repairs() {
        let ch = checked();
        let repairs: Vec<Repair> = ch
            .problems
            .iter()
            .enumerate()
            .map(|(i, p)| Repair { kind: p.kind, entry: p.entry.clone(), done: i != 1, message: String::new() })
            .collect();
        let r = Report::new(ch, repairs);
        assert!(!r.clean);
        assert_eq!(r.summary, BTreeMap::from([("orphaned-chunk", 3)]));
        assert_eq!((r.repaired(), r.left()), (2, 1));
        let clean = Report::new(Checked { problems: Vec::new(), scanned: 0, pending: Vec::new() }, Vec::new());
        assert!(clean.clean);
        assert_eq!(clean.left(), 0);
    }

    #[test]
    fn the_json_report_keeps_its_field_names() {
        let mut ch = checked();
        ch.pending.push(Pending { meta_node: NodeId(2), operation: "op".into() });
        let v = serde_json::to_value(Report::new(ch, Vec::new())).unwrap();
        let keys: Vec<&str> = v.as_object().unwrap().keys().map(|k| k.as_str()).collect();
        assert_eq!(keys, ["clean", "pending", "problems", "repairs", "scanned", "summary"]);
        let p = &v["problems"][0];
        assert_eq!(p["kind"], "orphaned-chunk");
        assert_eq!(p["entry"], "1-1-7");
        assert_eq!(p["target"], 1);
        assert!(p.get("meta_node").is_none() && p.get("path").is_none() && p.get("fix").is_none());
        assert_eq!(v["summary"]["orphaned-chunk"], 3);
        assert_eq!(v["pending"][0]["meta_node"], 2);
    }

    #[test]
    fn a_check_can_run_on_any_runtime_thread() {
        fn send<T: Send>(_: T) {}
        let nodes = Nodes {
            metas: Vec::new(),
            targets: Vec::new(),
            groups: Vec::new(),
            secondaries: Vec::new(),
            meta_groups: Vec::new(),
            mgmtd: None,
        };
        send(run(&nodes, true, &mut |_| {}));
    }
}
