//! IOR-like sequential bandwidth: `ranks` threads write, then read back,
//! either one shared file (N-1) or a file each (N-N).
//!
//! Layout (as IOR's): a rank writes `segments` blocks of `block_bytes`, each
//! in calls of `transfer_bytes`. In N-1, segment `s` of rank `r` starts at
//! `(s * ranks + r) * block_bytes` — with one segment every rank owns one
//! contiguous block, with more the ranks' blocks interleave. In N-N, rank
//! `r`'s file holds its segments back to back. Every transfer starts with its
//! own offset (8 bytes, little-endian), which the read phase checks.
//!
//! Each phase is timed from open to close (fsync included when asked) per
//! rank; the aggregate is Equation 1 over the ranks. Ranks are threads of one
//! process, or spread over several processes ([`run_part`], one
//! [`ranks::Part`] per process, phases kept in lock step through a
//! [`ranks::PhaseSync`], the whole run driven by a [`ranks::Driver`] in
//! [`run_with`]): the command line's `--processes` starts them. Each phase also carries
//! its first start and last end as Unix times, so that runs on several client
//! hosts can be combined into one aggregate (see [`crate::combine`]). Files live in a fresh
//! directory `hivefs-bench-io.<pid>` under the backend's base and are removed
//! at the end unless `keep` is set.

use crate::backend::{Backend, BenchFile};
use crate::progress::{Counter, Progress};
use crate::ranks::{self, Driver, Part, PartResult, PhaseSync};
use crate::{aggregate_mib_per_s, BenchError, Result, Span};
use serde::Serialize;
use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub const TRANSFER_BYTES_MAX: u64 = 64 << 20;
pub const PHASES: [&str; 2] = ["write", "read"];
pub const RANKS_MAX: u32 = 1024;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IoParams {
    pub ranks: u32,
    pub transfer_bytes: u64,
    pub block_bytes: u64,
    pub segments: u32,
    /// N-N (a file per rank) instead of N-1 (one shared file).
    pub file_per_rank: bool,
    /// fsync each file at the end of the write phase (timed).
    pub fsync: bool,
    /// `echo 3 > /proc/sys/vm/drop_caches` between the phases.
    pub drop_caches: bool,
    /// Read back the data another rank wrote (rank + 1), as IOR's `-C`.
    pub reorder: bool,
    pub keep: bool,
}

impl IoParams {
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(BenchError::Invalid(m));
        if !(1..=RANKS_MAX).contains(&self.ranks) {
            return bad(format!("ranks must be 1..={RANKS_MAX}, not {}", self.ranks));
        }
        if self.transfer_bytes == 0 || self.transfer_bytes > TRANSFER_BYTES_MAX {
            return bad(format!("transfer size must be 1..={TRANSFER_BYTES_MAX} bytes, not {}", self.transfer_bytes));
        }
        if self.transfer_bytes < 8 {
            return bad("transfer size must be at least 8 bytes (each transfer carries its offset)".into());
        }
        if self.block_bytes == 0 || !self.block_bytes.is_multiple_of(self.transfer_bytes) {
            return bad(format!(
                "block size {} must be a positive multiple of the transfer size {}",
                self.block_bytes, self.transfer_bytes
            ));
        }
        if self.segments == 0 {
            return bad("segments must be at least 1".into());
        }
        if self.bytes_per_rank().checked_mul(u64::from(self.ranks)).is_none() {
            return bad("the total volume overflows".into());
        }
        Ok(())
    }

    pub fn bytes_per_rank(&self) -> u64 {
        self.block_bytes.saturating_mul(u64::from(self.segments))
    }

    pub fn mode(&self) -> &'static str {
        if self.file_per_rank {
            "N-N"
        } else {
            "N-1"
        }
    }

    /// File offset of transfer `i` of segment `seg` of `rank`.
    pub fn offset(&self, rank: u32, seg: u32, i: u64) -> u64 {
        let block_index =
            if self.file_per_rank { u64::from(seg) } else { u64::from(seg) * u64::from(self.ranks) + u64::from(rank) };
        block_index * self.block_bytes + i * self.transfer_bytes
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct RankResult {
    pub rank: u32,
    /// The process that ran the rank.
    pub pid: u32,
    pub write_bytes: u64,
    pub write_mib_s: f64,
    pub read_bytes: u64,
    pub read_mib_s: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct PhaseResult {
    pub bytes: u64,
    /// Last end − first start over the ranks.
    pub seconds: f64,
    /// Equation 1 over the ranks.
    pub aggregate_mib_s: f64,
    pub min_rank_mib_s: f64,
    pub max_rank_mib_s: f64,
    /// First start over the ranks, seconds since the Unix epoch (wall clock).
    pub start_unix_s: f64,
    /// Last end over the ranks, seconds since the Unix epoch.
    pub end_unix_s: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct IoReport {
    pub benchmark: &'static str,
    /// "mount", "native" or "plain".
    pub api: &'static str,
    pub path: String,
    /// The run's own directory (`hivefs-bench-io.<pid>` under `path`).
    pub dir: String,
    pub mode: &'static str,
    pub ranks: u32,
    /// Processes the ranks ran in (threads of each: ranks / processes, rounded).
    pub processes: u32,
    pub transfer_bytes: u64,
    pub block_bytes: u64,
    pub segments: u32,
    pub fsync: bool,
    pub drop_caches: bool,
    pub reorder: bool,
    pub files: u32,
    pub write: PhaseResult,
    pub read: PhaseResult,
    pub per_rank: Vec<RankResult>,
}

/// `unix0`: the wall-clock time of the spans' origin.
fn phase_result(spans: &[Span], unix0: f64) -> PhaseResult {
    let rates: Vec<f64> = spans.iter().map(Span::mib_per_s).collect();
    let first = spans.iter().map(|s| s.start_s).fold(f64::INFINITY, f64::min);
    let last = spans.iter().map(|s| s.end_s).fold(f64::NEG_INFINITY, f64::max);
    PhaseResult {
        bytes: spans.iter().map(|s| s.bytes).sum(),
        seconds: (last - first).max(0.0),
        aggregate_mib_s: aggregate_mib_per_s(spans),
        min_rank_mib_s: rates.iter().copied().fold(f64::INFINITY, f64::min),
        max_rank_mib_s: rates.iter().copied().fold(0.0, f64::max),
        start_unix_s: unix0 + if first.is_finite() { first } else { 0.0 },
        end_unix_s: unix0 + if last.is_finite() { last } else { 0.0 },
    }
}

/// The benchmark's directory and files, removed when dropped (unless kept).
pub struct Cleanup<'a> {
    backend: &'a dyn Backend,
    dir: String,
    files: Vec<String>,
    keep: bool,
}

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        if self.keep {
            return;
        }
        for f in &self.files {
            let _ = self.backend.unlink(f);
        }
        if let Err(e) = self.backend.rmdir(&self.dir) {
            tracing::warn!("cannot remove benchmark directory {}: {e}", self.backend.describe(&self.dir));
        }
    }
}

pub fn drop_caches() -> Result<()> {
    rustix::fs::sync();
    std::fs::write("/proc/sys/vm/drop_caches", b"3\n")
        .map_err(|e| BenchError::io("dropping the page cache (/proc/sys/vm/drop_caches; needs root)", e))
}

/// The run's own directory name (`hivefs-bench-io.<pid>` of the process that prepares it).
pub fn run_dir() -> String {
    format!("hivefs-bench-io.{}", std::process::id())
}

fn file_of(p: &IoParams, dir: &str, rank: u32) -> String {
    if p.file_per_rank {
        format!("{dir}/data.{rank}")
    } else {
        format!("{dir}/data")
    }
}

/// Creates the run's directory `dir` and its (empty) files.
pub fn prepare<'a>(b: &'a dyn Backend, p: &IoParams, dir: &str) -> Result<Cleanup<'a>> {
    p.validate()?;
    b.mkdir(dir).map_err(|e| BenchError::io(format!("cannot create {}", b.describe(dir)), e))?;
    let nfiles = if p.file_per_rank { p.ranks } else { 1 };
    let mut cleanup = Cleanup { backend: b, dir: dir.to_string(), files: Vec::new(), keep: p.keep };
    for r in 0..nfiles {
        let f = file_of(p, dir, r);
        let h = b.open(&f, true, true).map_err(|e| BenchError::io(format!("cannot create {}", b.describe(&f)), e))?;
        cleanup.files.push(f.clone());
        h.close().map_err(|e| BenchError::io(format!("closing {}", b.describe(&f)), e))?;
    }
    Ok(cleanup)
}

pub fn run(backend: Arc<dyn Backend>, p: &IoParams, progress: bool) -> Result<IoReport> {
    run_with(backend, p, progress, None)
}

/// A whole run: its ranks in this process's threads, or run by `driver`
/// (the page cache is then dropped between the phases, when asked, while no
/// rank works).
pub fn run_with(
    backend: Arc<dyn Backend>,
    p: &IoParams,
    progress: bool,
    driver: Option<&mut dyn Driver>,
) -> Result<IoReport> {
    let b: &dyn Backend = &*backend;
    let dir = run_dir();
    let cleanup = prepare(b, p, &dir)?;
    let m = match driver {
        None => ranks::merge(vec![run_part(b, p, &dir, Part::all(p.ranks), None, progress)?], PHASES.len()),
        Some(d) => {
            d.run(&PHASES, &mut |ph, _| if ph == 1 && p.drop_caches { drop_caches() } else { Ok(()) }, &mut |_, _| {
                Ok(())
            })?
        }
    };
    check_verified(b, &dir, m.verify_errors)?;
    drop(cleanup);
    Ok(IoReport { processes: m.processes, ..report(b, p, &dir, &m.spans, &m.pids) })
}

/// Fails the run if any transfer read back wrong.
pub fn check_verified(b: &dyn Backend, dir: &str, bad: u64) -> Result<()> {
    if bad > 0 {
        return Err(BenchError::Invalid(format!(
            "{bad} transfers read back from {} did not hold the data written",
            b.describe(dir)
        )));
    }
    Ok(())
}

/// Runs the ranks of `part` through both phases in the prepared directory
/// `dir`. With `sync`, each phase starts when it says so (and caches are
/// dropped by whoever drives it); without, this process is the whole run.
pub fn run_part(
    b: &dyn Backend,
    p: &IoParams,
    dir: &str,
    part: Part,
    sync: Option<&mut dyn PhaseSync>,
    progress: bool,
) -> Result<PartResult> {
    p.validate()?;
    part.check(p.ranks)?;
    let sync = RefCell::new(sync);
    let total = p.bytes_per_rank() * u64::from(part.count);
    let counter = Counter::default();
    let verify_errors = AtomicU64::new(0);
    let progress_bar: RefCell<Option<Progress>> = RefCell::new(None);
    // The ranks' clock starts right after this (within microseconds).
    let unix0 = crate::unix_now_s();
    let spans = ranks::run(
        part.count,
        2,
        |ph| {
            match sync.borrow_mut().as_mut() {
                Some(s) => s.ready(ph)?,
                None if ph == 1 && p.drop_caches => drop_caches()?,
                None => {}
            }
            counter.reset();
            *progress_bar.borrow_mut() = Some(Progress::start(
                progress,
                format!("io {} {}", p.mode(), PHASES[ph]),
                total,
                "MiB",
                counter.clone(),
            ));
            Ok(())
        },
        |ph, _| {
            progress_bar.borrow_mut().take();
            match sync.borrow_mut().as_mut() {
                Some(s) => s.done(ph),
                None => Ok(()),
            }
        },
        |local, ph, failed| {
            let rank = part.first + local;
            let data_rank = if ph == 1 && p.reorder { (rank + 1) % p.ranks } else { rank };
            let path = file_of(p, dir, data_rank);
            let what = |doing: &str| format!("rank {rank} {doing} {}", b.describe(&path));
            let write = ph == 0;
            let mut f: Box<dyn BenchFile> =
                b.open(&path, false, write).map_err(|e| BenchError::io(what("opening"), e))?;
            let mut buf = vec![0xa5u8; p.transfer_bytes as usize];
            let mut moved = 0u64;
            'outer: for seg in 0..p.segments {
                for i in 0..p.block_bytes / p.transfer_bytes {
                    if failed.load(Ordering::Relaxed) || crate::interrupted() {
                        break 'outer;
                    }
                    let off = p.offset(data_rank, seg, i);
                    if write {
                        buf[..8].copy_from_slice(&off.to_le_bytes());
                        f.write_at(off, &buf).map_err(|e| BenchError::io(what("writing"), e))?;
                    } else {
                        let n = f.read_at(off, &mut buf).map_err(|e| BenchError::io(what("reading"), e))?;
                        if n != buf.len() || buf[..8] != off.to_le_bytes() {
                            verify_errors.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    moved += p.transfer_bytes;
                    counter.add(p.transfer_bytes);
                }
            }
            if write && p.fsync {
                f.sync().map_err(|e| BenchError::io(what("fsyncing"), e))?;
            }
            f.close().map_err(|e| BenchError::io(what("closing"), e))?;
            Ok(moved)
        },
    )?;
    Ok(PartResult::new(part, unix0, spans, verify_errors.load(Ordering::Relaxed)))
}

/// The report of a whole run from every rank's spans (Unix seconds, ranks in
/// order) and the process that ran each rank.
pub fn report(b: &dyn Backend, p: &IoParams, dir: &str, spans: &[Vec<Span>], pids: &[u32]) -> IoReport {
    IoReport {
        benchmark: "io",
        api: b.kind(),
        path: b.describe(""),
        dir: b.describe(dir),
        mode: p.mode(),
        ranks: p.ranks,
        processes: 1,
        transfer_bytes: p.transfer_bytes,
        block_bytes: p.block_bytes,
        segments: p.segments,
        fsync: p.fsync,
        drop_caches: p.drop_caches,
        reorder: p.reorder,
        files: if p.file_per_rank { p.ranks } else { 1 },
        write: phase_result(&spans[0], 0.0),
        read: phase_result(&spans[1], 0.0),
        per_rank: (0..spans[0].len().min(spans[1].len()))
            .map(|r| RankResult {
                rank: r as u32,
                pid: pids.get(r).copied().unwrap_or(0),
                write_bytes: spans[0][r].bytes,
                write_mib_s: spans[0][r].mib_per_s(),
                read_bytes: spans[1][r].bytes,
                read_mib_s: spans[1][r].mib_per_s(),
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Posix;

    fn params() -> IoParams {
        IoParams {
            ranks: 3,
            transfer_bytes: 4096,
            block_bytes: 16384,
            segments: 2,
            file_per_rank: false,
            fsync: true,
            drop_caches: false,
            reorder: false,
            keep: false,
        }
    }

    #[test]
    fn offsets_of_the_two_layouts() {
        let p = params();
        // N-1: segment 0 holds ranks 0, 1, 2; segment 1 starts at 3 blocks.
        assert_eq!(p.offset(0, 0, 0), 0);
        assert_eq!(p.offset(1, 0, 1), 16384 + 4096);
        assert_eq!(p.offset(2, 1, 0), (3 + 2) * 16384);
        let nn = IoParams { file_per_rank: true, ..p };
        assert_eq!(nn.offset(2, 1, 3), 16384 + 3 * 4096);
    }

    #[test]
    fn parameters_are_checked() {
        assert!(params().validate().is_ok());
        assert!(IoParams { block_bytes: 5000, ..params() }.validate().is_err());
        assert!(IoParams { ranks: 0, ..params() }.validate().is_err());
        assert!(IoParams { segments: 0, ..params() }.validate().is_err());
        assert!(IoParams { transfer_bytes: 4, block_bytes: 8, ..params() }.validate().is_err());
        assert!(IoParams { transfer_bytes: 128 << 20, block_bytes: 128 << 20, ..params() }.validate().is_err());
    }

    /// Two parts driven in lock step (as two processes would be): every
    /// write ends before any read starts, and the reads check the data.
    #[test]
    fn two_parts_in_lock_step() {
        use std::sync::{Barrier, Mutex};
        struct Step<'a>(&'a Barrier, &'a Mutex<Vec<String>>, u32);
        impl PhaseSync for Step<'_> {
            fn ready(&mut self, ph: usize) -> Result<()> {
                self.1.lock().unwrap().push(format!("ready {ph} {}", self.2));
                self.0.wait();
                Ok(())
            }
            fn done(&mut self, ph: usize) -> Result<()> {
                self.1.lock().unwrap().push(format!("done {ph} {}", self.2));
                self.0.wait();
                Ok(())
            }
        }
        let d = tempfile::tempdir().unwrap();
        let b = Posix::new(d.path().to_path_buf(), "plain");
        let p = IoParams { ranks: 3, reorder: true, ..params() };
        let cleanup = prepare(&b, &p, "run").unwrap();
        let (barrier, log) = (Barrier::new(2), Mutex::new(Vec::new()));
        let results: Vec<PartResult> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..2)
                .map(|i| {
                    let (b, p, barrier, log) = (&b, &p, &barrier, &log);
                    s.spawn(move || {
                        let mut st = Step(barrier, log, i);
                        run_part(b, p, "run", Part::of(3, i, 2), Some(&mut st), false).unwrap()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let ranks::Merged { spans, pids, processes, verify_errors } = ranks::merge(results, 2);
        assert_eq!((processes, verify_errors), (2, 0));
        let rep = report(&b, &p, "run", &spans, &pids);
        assert_eq!(rep.per_rank.iter().map(|r| r.pid).collect::<Vec<_>>(), vec![std::process::id(); 3]);
        assert_eq!(rep.per_rank.len(), 3);
        assert_eq!(rep.write.bytes, 3 * 32768);
        let last_write = spans[0].iter().map(|s| s.end_s).fold(0.0, f64::max);
        assert!(spans[1].iter().all(|s| s.start_s >= last_write), "a read started before every write ended");
        let log = log.into_inner().unwrap();
        assert_eq!(log.iter().filter(|l| l.starts_with("ready 1")).count(), 2, "{log:?}");
        drop(cleanup);
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 0);
    }

    /// `--processes 2` as the command line drives it, with the two parts in
    /// threads of this process and the phase steps over channels.
    struct TwoParts {
        b: Arc<dyn Backend>,
        p: IoParams,
        /// Part 1 says some of its reads did not check out.
        tamper: bool,
        steps: Vec<String>,
    }

    impl Driver for TwoParts {
        fn run(
            &mut self,
            phases: &[&str],
            before: &mut dyn FnMut(usize, f64) -> Result<()>,
            after: &mut dyn FnMut(usize, f64) -> Result<()>,
        ) -> Result<ranks::Merged> {
            use std::sync::mpsc::{channel, Receiver, Sender};
            struct Chan(Sender<()>, Receiver<()>);
            impl PhaseSync for Chan {
                fn ready(&mut self, _: usize) -> Result<()> {
                    self.0.send(()).unwrap();
                    self.1.recv().unwrap();
                    Ok(())
                }
                fn done(&mut self, _: usize) -> Result<()> {
                    self.0.send(()).unwrap();
                    Ok(())
                }
            }
            let dir = run_dir();
            let (b, p, steps) = (&*self.b, &self.p, &mut self.steps);
            let mut parts: Vec<PartResult> = std::thread::scope(|s| {
                let mut kids = Vec::new();
                for i in 0..2 {
                    let ((say, heard), (go, wait)) = (channel(), channel());
                    let dir = &dir;
                    let h = s.spawn(move || {
                        run_part(b, p, dir, Part::of(p.ranks, i, 2), Some(&mut Chan(say, wait)), false).unwrap()
                    });
                    kids.push((h, heard, go));
                }
                for (ph, name) in phases.iter().enumerate() {
                    kids.iter().for_each(|k| k.1.recv().unwrap());
                    before(ph, 0.0).unwrap();
                    steps.push(format!("go {name}"));
                    kids.iter().for_each(|k| k.2.send(()).unwrap());
                    kids.iter().for_each(|k| k.1.recv().unwrap());
                    after(ph, 0.0).unwrap();
                }
                kids.into_iter().map(|k| k.0.join().unwrap()).collect()
            });
            if self.tamper {
                parts[1].verify_errors = 3;
            }
            Ok(ranks::merge(parts, phases.len()))
        }
    }

    #[test]
    fn a_run_of_parts_in_lock_step_is_reported_and_checked_as_one() {
        let d = tempfile::tempdir().unwrap();
        let b: Arc<dyn Backend> = Arc::new(Posix::new(d.path().to_path_buf(), "plain"));
        let p = IoParams { ranks: 3, reorder: true, ..params() };
        let mut two = TwoParts { b: b.clone(), p: p.clone(), tamper: false, steps: Vec::new() };
        let r = run_with(b.clone(), &p, false, Some(&mut two)).unwrap();
        assert_eq!(two.steps, ["go write", "go read"]);
        assert_eq!((r.processes, r.ranks, r.per_rank.len()), (2, 3, 3));
        assert_eq!(r.write.bytes, 3 * 32768);
        assert_eq!(r.read.bytes, r.write.bytes);
        assert!(r.read.start_unix_s >= r.write.end_unix_s, "a read started before every write ended");
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 0, "files left behind");

        let mut bad = TwoParts { tamper: true, ..two };
        let e = run_with(b, &p, false, Some(&mut bad)).unwrap_err().to_string();
        assert!(e.contains("3 transfers read back"), "{e}");
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 0, "files left behind after a failure");
    }

    #[test]
    fn both_layouts_on_a_plain_directory() {
        for (nn, reorder) in [(false, false), (true, true)] {
            let d = tempfile::tempdir().unwrap();
            let b: Arc<dyn Backend> = Arc::new(Posix::new(d.path().to_path_buf(), "plain"));
            let p = IoParams { file_per_rank: nn, reorder, ..params() };
            let r = run(b, &p, false).unwrap();
            assert_eq!(r.files, if nn { 3 } else { 1 });
            assert_eq!(r.write.bytes, 3 * 2 * 16384);
            assert_eq!(r.read.bytes, r.write.bytes);
            assert!(r.per_rank.iter().all(|x| x.write_bytes == 32768 && x.read_bytes == 32768));
            assert!(r.write.aggregate_mib_s > 0.0 && r.read.aggregate_mib_s > 0.0);
            // Absolute times: read follows write, and each phase spans its `seconds`.
            assert!(r.write.start_unix_s > 1.0e9 && r.write.end_unix_s >= r.write.start_unix_s);
            assert!(r.read.start_unix_s >= r.write.end_unix_s);
            assert!((r.write.end_unix_s - r.write.start_unix_s - r.write.seconds).abs() < 1e-6);
            assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 0, "files left behind");
        }
    }
}
