//! Arguments of `hivefs bench` shared by its commands and the sweep
//! (`bench_sweep`), so both depend on this and not on each other.

use crate::admin::Conn;
use clap::Args;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct SweepArgs {
    #[command(flatten)]
    pub common: Common,
    /// Directory to run in: inside a HiveFS mount; with --native a path inside the file system
    /// (default /). Each run works in a new sub-directory that it removes afterwards.
    pub path: Option<PathBuf>,
    /// Use the native client library instead of the mount.
    #[arg(long)]
    pub native: bool,
    /// Stripe counts (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    pub stripe: Vec<u32>,
    /// Chunk sizes (comma-separated, powers of two from 4k).
    #[arg(long, value_delimiter = ',', default_value = "512k")]
    pub chunk_size: Vec<String>,
    /// Target choosers (comma-separated): random, roundrobin, randomized-roundrobin, balanced.
    #[arg(long, value_delimiter = ',', default_value = "balanced")]
    pub chooser: Vec<String>,
    /// Client cache modes (comma-separated): native, paged, buffered. Runs of the mount's own mode use
    /// PATH's mount; for each other mode the sweep mounts the file system once more
    /// (`hivefs mount --cache-mode`, private, under the temporary directory) and unmounts it
    /// at the end. Default: the mount's mode (native with --native, which has no other).
    #[arg(long, value_delimiter = ',')]
    pub cache: Vec<String>,
    /// Transfer sizes (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "1m")]
    pub transfer_size: Vec<String>,
    /// Ranks (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "2")]
    pub ranks: Vec<u32>,
    /// Repetitions of every configuration.
    #[arg(long, default_value_t = 10)]
    pub repeat: u32,
    /// Seed of the block order and the pauses.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Shortest pause between blocks, in milliseconds.
    #[arg(long, default_value_t = 0)]
    pub pause_min_ms: u64,
    /// Longest pause between blocks, in milliseconds.
    #[arg(long, default_value_t = 200)]
    pub pause_max_ms: u64,
    /// Contiguous bytes per rank per segment.
    #[arg(long, default_value = "64m")]
    pub block_size: String,
    /// Segments per rank.
    #[arg(long, default_value_t = 1)]
    pub segments: u32,
    /// N-N: a file per rank (default N-1: one shared file).
    #[arg(long)]
    pub file_per_rank: bool,
    /// fsync each file at the end of the write phase.
    #[arg(long)]
    pub fsync: bool,
    /// Drop the page cache between write and read (root only).
    #[arg(long)]
    pub drop_caches: bool,
    /// Client hosts: only 1 here; multi-host sweeps use the `hivefs-testbed` scripts.
    #[arg(long, default_value_t = 1)]
    pub hosts: u32,
    /// JSON lines output (appended to).
    #[arg(long, default_value = "runs.jsonl")]
    pub out: PathBuf,
}

#[derive(Args, Debug)]
pub struct ReportArgs {
    /// The JSON lines written by `bench sweep`.
    pub runs: PathBuf,
    /// Directory for the figures and runs.csv.
    #[arg(long, default_value = "figures")]
    pub out: PathBuf,
}

#[derive(Args, Debug)]
pub struct TuneArgs {
    /// A directory inside a HiveFS mount (the command is expected to work in it).
    pub dir: PathBuf,
    /// Repetitions per chunk size.
    #[arg(long, default_value_t = 3)]
    pub repeat: u32,
    /// Remove DIR's contents before every run (otherwise the command must cope with existing files).
    #[arg(long)]
    pub clean: bool,
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
    /// No progress lines on stderr.
    #[arg(long)]
    pub no_progress: bool,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

#[derive(Args, Debug)]
pub struct Common {
    #[command(flatten)]
    pub conn: Conn,
    /// No progress display on stderr (it is shown only when stderr is a terminal anyway).
    #[arg(long)]
    pub no_progress: bool,
}
