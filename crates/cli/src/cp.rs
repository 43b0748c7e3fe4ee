//! `hivefs cp SRC... DST`: the command line of the parallel copy in
//! `hivefs_copy` (which see for the workers, ranges, attributes and parts).
//! Here: the arguments, the progress line on a terminal, errors as they
//! happen, the JSON summary and the exit status.

use crate::util::{human, parse_size};
use anyhow::{bail, Result};
use clap::{Args, ValueEnum};
use hivefs_copy::{Failure, Options, Part, Progress, Summary};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// What to copy and how: shared by `hivefs cp` and `hivefs ond cp`.
#[derive(Args, Debug)]
pub struct CopyWhat {
    /// Files, directories or symlinks (not followed) to copy.
    #[arg(value_name = "SRC", num_args = 1.., required = true)]
    pub srcs: Vec<PathBuf>,
    /// Where to copy: an existing directory to copy into, or the name of the copy.
    #[arg(value_name = "DST", required = true)]
    pub dst: PathBuf,
    /// Treat DST as the copy of the single SRC, even if DST is an existing directory
    /// (copy into it, merging) instead of copying to DST/NAME.
    #[arg(short = 'T', long)]
    pub no_target_directory: bool,
    /// Resume or refresh: skip a destination file whose size and modification time
    /// equal the source's (a symlink with the same target and time, a special file of
    /// the same type and device). Files are written before their times are set, so an
    /// interrupted copy run again copies only what is missing or differs.
    #[arg(short, long)]
    pub update: bool,
    /// Worker threads, each with one file-system call in flight: a network file
    /// system wants many (1 to 1024).
    #[arg(short, long, default_value_t = hivefs_copy::DEFAULT_WORKERS)]
    pub workers: usize,
    /// Files larger than this are copied in ranges of this size by several workers at
    /// once (a multiple of 1 MiB; k, m, g suffixes).
    #[arg(long, default_value = "64m", value_parser = parse_size)]
    pub range_size: u64,
    /// Do not copy extended attributes (saves a listxattr per entry, a metadata
    /// request on a network file system).
    #[arg(long)]
    pub no_xattrs: bool,
}

/// Copy files and trees in parallel, keeping what `cp -a` keeps (into and out of HiveFS, or between any file systems).
///
/// Keeps modes (setuid, setgid, sticky), owners (when run as root), access and
/// modification times to the nanosecond (directories' after their contents), symlinks
/// (dangling ones too), hard links, holes of sparse files, FIFOs, sockets and device
/// nodes, extended attributes.
///
/// SRC... DST as `cp -a`: into an existing directory DST each SRC becomes DST/NAME
/// (`a/` gives `a`); one SRC and a DST that does not exist make DST. Workers share a
/// queue of directories and entries; files larger than --range-size are split into
/// ranges copied at once by several workers. `copy_file_range` is used where both
/// sides allow it (within one HiveFS the storage servers copy the data themselves),
/// read/write with a 1 MiB buffer elsewhere.
///
/// A failed entry does not stop the others: each failure is printed (path, operation,
/// error) and counted. Exit status: 0 all copied, 1 any entry failed or bad usage.
#[derive(Args, Debug)]
#[command(after_help = "Examples:
  hivefs cp ~/dataset /mnt/hivefs/                  # makes /mnt/hivefs/dataset
  hivefs cp -u ~/dataset /mnt/hivefs/               # again: copies only what is missing or differs
  hivefs cp /mnt/hivefs/results/ /scratch/run42     # makes /scratch/run42 (if it did not exist)
  # one copy over 4 nodes (what `hivefs ond cp` runs), then the directories' attributes:
  hivefs cp --part 2/4 /data /mnt/hivefs/           # on node 2 of 4 (each node its own part)
  hivefs cp --dir-attrs-only /data /mnt/hivefs/     # once, after all parts finished")]
pub struct CpArgs {
    #[command(flatten)]
    pub what: CopyWhat,
    /// Copy only part I of N (1-based) of the work, for spreading one copy over N
    /// processes or machines: each file (or each range of a large file) belongs to one
    /// part by a hash of its path; a hard-link group goes by its first path in sorted
    /// order; every part creates the directories. DST must exist (or give -T). Run
    /// --dir-attrs-only once after all parts finished.
    #[arg(long, value_name = "I/N", value_parser = Part::parse)]
    pub part: Option<Part>,
    /// Only set the owners, modes and times of the directories already copied (and of
    /// the files split into ranges that several parts wrote): the last pass after the
    /// runs of --part. Copies nothing; DST must exist (or give -T).
    #[arg(long, conflicts_with_all = ["part", "update"])]
    pub dir_attrs_only: bool,
    /// The progress line on stderr (files, bytes, rate, ETA from a count of the
    /// sources made beside the copy): auto shows it when stderr is a terminal.
    #[arg(long, value_enum, default_value_t = When::Auto)]
    pub progress: When,
    /// Print a summary as JSON on stdout: files, dirs, symlinks, hard_links,
    /// specials, bytes, hole_bytes, skipped (by --update), skipped_bytes, errors,
    /// failures (path, op, error; the first 1000), elapsed_s, bytes_per_s.
    #[arg(long)]
    pub json: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum When {
    Auto,
    Always,
    Never,
}

pub fn cp(a: CpArgs) -> Result<()> {
    let show = match a.progress {
        When::Always => true,
        When::Never => false,
        When::Auto => std::io::stderr().is_terminal(),
    };
    let opts = Options {
        workers: a.what.workers,
        range_size: a.what.range_size,
        update: a.what.update,
        part: a.part.unwrap_or(Part::WHOLE),
        dir_attrs_only: a.dir_attrs_only,
        xattrs: !a.what.no_xattrs,
        precount: show,
    };
    opts.check()?;
    let fixed_target = opts.part.is_split() || opts.dir_attrs_only;
    let jobs = hivefs_copy::plan(&a.what.srcs, &a.what.dst, a.what.no_target_directory, fixed_target)?;
    let progress = Progress::default();
    let done = AtomicBool::new(false);
    let on_failure = |f: &Failure| {
        let clear = if show { "\r\x1b[K" } else { "" };
        eprintln!("{clear}hivefs cp: {f}");
    };
    let summary = std::thread::scope(|s| {
        if show {
            s.spawn(|| show_progress(&progress, &done));
        }
        let summary = hivefs_copy::copy(&jobs, &opts, &progress, &on_failure);
        done.store(true, Ordering::Relaxed);
        summary
    });
    if a.json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else if show {
        eprintln!("{}", one_line(&summary));
    }
    if summary.errors > 0 {
        bail!("{} entries failed (listed above)", summary.errors);
    }
    Ok(())
}

fn one_line(s: &Summary) -> String {
    let mut l = format!(
        "copied {} files ({}), {} dirs, {} symlinks, {} hard links, {} special files in {:.1} s, {}/s",
        s.files,
        human(s.bytes),
        s.dirs,
        s.symlinks,
        s.hard_links,
        s.specials,
        s.elapsed_s,
        human(s.bytes_per_s as u64)
    );
    if s.skipped > 0 {
        l += &format!("; {} up to date ({})", s.skipped, human(s.skipped_bytes));
    }
    if s.hole_bytes > 0 {
        l += &format!("; {} of holes kept", human(s.hole_bytes));
    }
    l
}

/// Rewrites one line of stderr four times a second until `done`.
fn show_progress(p: &Progress, done: &AtomicBool) {
    let start = Instant::now();
    while !done.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(250));
        eprint!("\r{}\x1b[K", progress_line(p, start.elapsed()));
    }
    eprint!("\r\x1b[K");
}

fn progress_line(p: &Progress, elapsed: Duration) -> String {
    let get = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    let (files, bytes, skipped, errors) = (get(&p.files), get(&p.bytes), get(&p.skipped), get(&p.errors));
    let secs = elapsed.as_secs_f64().max(0.001);
    let mut l = format!("{files} files, {}, {}/s", human(bytes), human((bytes as f64 / secs) as u64));
    if skipped > 0 {
        l += &format!(", {skipped} up to date");
    }
    if errors > 0 {
        l += &format!(", {errors} errors");
    }
    let (total_files, total_bytes) = (get(&p.total_files), get(&p.total_bytes));
    if !p.counted.load(Ordering::Relaxed) {
        return l + &format!(" (counting: {total_files} files, {} so far)", human(total_bytes));
    }
    // Bytes skipped (up to date, holes) count as done; the rates are of what was copied.
    let done_bytes = bytes + get(&p.skipped_bytes);
    let left_bytes = total_bytes.saturating_sub(done_bytes) as f64;
    let left_files = total_files.saturating_sub(files + skipped) as f64;
    let by_bytes = if bytes > 0 { left_bytes / (bytes as f64 / secs) } else { 0.0 };
    let by_files = if files > 0 { left_files / (files as f64 / secs) } else { 0.0 };
    let eta = by_bytes.max(by_files) as u64;
    l + &format!(" of {total_files} files, {}, ETA {}:{:02}", human(total_bytes), eta / 60, eta % 60)
}
