//! Parallel copy of file trees (`hivefs cp`), between any file systems: the
//! equivalent of `cp -a` for staging data into and out of a parallel file
//! system, where one process copying one file at a time leaves the servers
//! idle.
//!
//! [`plan`] turns the command line's SRC... DST into [`Job`]s with the
//! semantics of `cp -a` (and refuses bad usage with a [`UsageError`]);
//! [`copy`] runs them on a pool of worker threads sharing one queue of
//! tasks ([`engine`]): listing a directory, copying one entry, or one range
//! of a large file ([`data`]: holes skipped, `copy_file_range` where both
//! sides allow it, else read and write). Attributes ([`attrs`]): modes,
//! owners (as root), access and modification times to the nanosecond,
//! extended attributes; directories' after their contents. Hard links are
//! copied once and linked. [`Part`] selects a share of the work, so several
//! processes (on several machines) can split one copy.
//!
//! This crate owns copying, not presenting: it must not print, parse
//! arguments or exit. Counters for a progress display are [`Progress`]
//! (atomics the caller reads), failures of single entries go to a callback
//! and into the [`Summary`]; they never stop the other entries.

#![forbid(unsafe_code)]

pub mod attrs;
pub mod data;
pub mod engine;
pub mod part;
pub mod plan;
pub mod snapshot;

#[cfg(test)]
mod tests;

pub use engine::copy;
pub use part::Part;
pub use plan::{plan, Job, UsageError};

use serde::Serialize;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Default number of worker threads: enough requests in flight to keep a
/// network file system's servers busy (each worker waits on one call at a
/// time); see docs/decisions.md "hivefs cp".
pub const DEFAULT_WORKERS: usize = 16;
/// Default size of the ranges large files are split into.
pub const DEFAULT_RANGE_SIZE: u64 = 64 << 20;
/// Ranges are multiples of this (and at least one of it).
pub const RANGE_ALIGN: u64 = 1 << 20;
/// Most workers a copy may use.
pub const MAX_WORKERS: usize = 1024;

/// How to copy.
#[derive(Clone, Debug)]
pub struct Options {
    /// Worker threads (1..=[`MAX_WORKERS`]).
    pub workers: usize,
    /// Files larger than this are split into ranges of this size, copied by
    /// several workers at once (a multiple of [`RANGE_ALIGN`]).
    pub range_size: u64,
    /// Skip a destination file whose size and modification time equal the
    /// source's (and a symlink or special file that is the same).
    pub update: bool,
    /// The share of the work this run does.
    pub part: Part,
    /// Only set the attributes of existing destination directories (and of
    /// files split into ranges that several parts wrote): the last pass after
    /// the parts of a copy ran.
    pub dir_attrs_only: bool,
    /// Copy extended attributes.
    pub xattrs: bool,
    /// Count what is to be copied beside the copy (for an ETA).
    pub precount: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            workers: DEFAULT_WORKERS,
            range_size: DEFAULT_RANGE_SIZE,
            update: false,
            part: Part::WHOLE,
            dir_attrs_only: false,
            xattrs: true,
            precount: false,
        }
    }
}

impl Options {
    /// Refuses options no copy can run with.
    pub fn check(&self) -> Result<(), UsageError> {
        if self.workers == 0 || self.workers > MAX_WORKERS {
            return Err(UsageError::Option(format!("--workers must be 1 to {MAX_WORKERS}, not {}", self.workers)));
        }
        if self.range_size < RANGE_ALIGN || !self.range_size.is_multiple_of(RANGE_ALIGN) {
            return Err(UsageError::Option(format!(
                "--range-size must be a multiple of 1 MiB, not {} bytes",
                self.range_size
            )));
        }
        Ok(())
    }
}

/// Live counters, updated by the workers as they go (for a progress display).
#[derive(Debug, Default)]
pub struct Progress {
    /// Regular files whose data was copied.
    pub files: AtomicU64,
    /// Other entries done: directories, symlinks, special files, links.
    pub others: AtomicU64,
    /// Bytes of file data copied (holes not counted).
    pub bytes: AtomicU64,
    /// Entries skipped by `--update`.
    pub skipped: AtomicU64,
    /// Bytes of the files skipped by `--update` and of holes.
    pub skipped_bytes: AtomicU64,
    /// Entries that failed.
    pub errors: AtomicU64,
    /// From the pre-count: regular files, their bytes, other entries.
    pub total_files: AtomicU64,
    pub total_bytes: AtomicU64,
    pub total_others: AtomicU64,
    /// The pre-count is complete (totals are final).
    pub counted: AtomicBool,
}

impl Progress {
    pub(crate) fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }
}

/// One entry that could not be copied.
#[derive(Clone, Debug, Serialize)]
pub struct Failure {
    /// The path the operation was on (source or destination).
    pub path: String,
    /// What was being done (e.g. "open source", "write", "set times").
    pub op: String,
    pub error: String,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}: {}", self.path, self.op, self.error)
    }
}

/// What a copy did.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Summary {
    /// Regular files whose data was copied (a hard-link group counts once).
    pub files: u64,
    /// Directories created or gone through (their attributes set).
    pub dirs: u64,
    pub symlinks: u64,
    /// Extra names of hard-link groups, linked to the first copy.
    pub hard_links: u64,
    /// FIFOs, sockets and device nodes.
    pub specials: u64,
    /// Bytes of file data copied.
    pub bytes: u64,
    /// Bytes of holes of sparse files not copied (the destination has holes there).
    pub hole_bytes: u64,
    /// Entries `--update` found up to date and left alone.
    pub skipped: u64,
    pub skipped_bytes: u64,
    /// Entries that failed, and the first [`MAX_FAILURES_KEPT`] of them.
    pub errors: u64,
    pub failures: Vec<Failure>,
    pub elapsed_s: f64,
    /// Bytes copied per second of the whole run.
    pub bytes_per_s: f64,
    pub workers: usize,
    pub range_size: u64,
    /// `I/N` of `--part`, absent for a whole copy.
    pub part: Option<String>,
}

/// Failures kept in a [`Summary`] (all are counted and passed to the callback).
pub const MAX_FAILURES_KEPT: usize = 1000;

/// A failed system call: on which path, doing what.
#[derive(Debug)]
pub(crate) struct OpError {
    pub path: std::path::PathBuf,
    pub op: String,
    pub error: std::io::Error,
}

/// `.op("what", path)` on a result: names the path and the operation.
pub(crate) trait OpContext<T> {
    fn op(self, op: &str, path: &std::path::Path) -> Result<T, OpError>;
}

impl<T, E: Into<std::io::Error>> OpContext<T> for Result<T, E> {
    fn op(self, op: &str, path: &std::path::Path) -> Result<T, OpError> {
        self.map_err(|e| OpError { path: path.to_path_buf(), op: op.to_string(), error: e.into() })
    }
}
