//! mdtest-like metadata rates: `ranks` ranks (threads, or threads of several
//! processes, see [`Driver`] and [`run_part`]) each create, then stat, then
//! read, then remove `files_per_rank` files of `file_bytes` bytes, in a
//! directory per rank or in one shared directory. Every phase starts on all
//! ranks at once; its rate is the operations of all ranks over the time from
//! the first start to the last end.
//!
//! Through the native client, each rank's phase runs as one task on the
//! client's runtime (the rank's thread waits for it), as an application on
//! the async API would; through a mount or a plain directory, on the rank's
//! thread.
//!
//! Operations: create = open(O_CREAT) + write the contents (if any) + close;
//! stat = stat of the path; read = open + read the contents + close;
//! remove = unlink. Besides rates, each phase reports CPU time per operation
//! of this process and, when known, of the HiveFS services (their pids from a
//! `hivefs up` directory), and how many requests each metadata node answered.
//!
//! The files live in a fresh directory `hivefs-bench-md.<pid>` under the
//! backend's base, removed at the end (also after a failure) unless `keep`.

use crate::backend::{Backend, MdOps};
use crate::cpu::Snapshot;
use crate::progress::{Counter, Progress};
use crate::ranks::{self, Driver, Part, PartResult, PhaseSync};
use crate::{BenchError, FsConn, Result};
use hivefs_cluster::Cluster;
use hivefs_proto::{Reply, Request};
use hivefs_types::ids::NodeType;
use serde::Serialize;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub const PHASES: [&str; 4] = ["create", "stat", "read", "remove"];
pub const FILE_BYTES_MAX: u32 = 64 << 20;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MdParams {
    pub ranks: u32,
    pub files_per_rank: u32,
    pub file_bytes: u32,
    /// One directory for all ranks instead of one per rank.
    pub shared_dir: bool,
    /// Drop the kernel's caches (page cache, dentries, inodes) before each
    /// phase after the first: the stats and reads then find nothing of the
    /// files cached, as on a client that did not create them.
    pub drop_caches: bool,
    pub keep: bool,
}

impl MdParams {
    pub fn validate(&self) -> Result<()> {
        if !(1..=crate::io::RANKS_MAX).contains(&self.ranks) {
            return Err(BenchError::Invalid(format!("ranks must be 1..={}, not {}", crate::io::RANKS_MAX, self.ranks)));
        }
        if self.files_per_rank == 0 {
            return Err(BenchError::Invalid("files per rank must be at least 1".into()));
        }
        if self.file_bytes > FILE_BYTES_MAX {
            return Err(BenchError::Invalid(format!("file size must be at most {FILE_BYTES_MAX} bytes")));
        }
        Ok(())
    }

    pub fn ops_per_phase(&self) -> u64 {
        u64::from(self.ranks) * u64::from(self.files_per_rank)
    }
}

/// Requests answered by each metadata node, read with `MetaOpCount`.
pub struct MetaCounts {
    rt: tokio::runtime::Runtime,
    cluster: Arc<Cluster>,
}

impl MetaCounts {
    pub fn connect(conn: &FsConn) -> Result<MetaCounts> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| BenchError::io("cannot start a runtime", e))?;
        let cluster = rt.block_on(conn.cluster(Duration::from_secs(30), 1))?;
        Ok(MetaCounts { rt, cluster })
    }

    /// Node id → requests answered so far, for every metadata node.
    pub fn snapshot(&self) -> Result<BTreeMap<String, u64>> {
        self.rt.block_on(async {
            let view = self.cluster.view();
            let mut out = BTreeMap::new();
            for n in view.nodes.values().filter(|n| n.node_type == NodeType::Meta) {
                let what = || format!("request count of metadata node {} at {}", n.id, n.addr);
                let pool = self.cluster.node_pool(NodeType::Meta, n.id).await.map_err(|e| BenchError::fs(what(), e))?;
                match pool.rpc(&Request::MetaOpCount).await {
                    Ok(Reply::MetaOpCount { requests, .. }) => out.insert(n.id.to_string(), requests),
                    Ok(r) => return Err(BenchError::Invalid(format!("{}: unexpected reply {r:?}", what()))),
                    Err(e) => return Err(BenchError::fs(what(), e)),
                };
            }
            Ok(out)
        })
    }
}

/// What besides the rates a run observes.
#[derive(Default)]
pub struct Observers {
    /// Service name → pid (see [`crate::cpu::up_service_pids`]).
    pub services: BTreeMap<String, i32>,
    pub meta: Option<MetaCounts>,
}

#[derive(Clone, Debug, Serialize)]
pub struct MdPhase {
    pub phase: &'static str,
    pub ops: u64,
    pub seconds: f64,
    pub ops_per_s: f64,
    /// CPU time (user + system) of this benchmark process per operation.
    pub cpu_us_per_op: f64,
    /// The same for each HiveFS service (empty when unknown).
    pub service_cpu_us_per_op: BTreeMap<String, f64>,
    /// Requests each metadata node answered during the phase (empty when unknown).
    pub meta_requests: BTreeMap<String, u64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct MdRun {
    /// "mount", "native" or "plain".
    pub api: &'static str,
    pub path: String,
    pub phases: Vec<MdPhase>,
}

#[derive(Clone, Debug, Serialize)]
pub struct MdReport {
    pub benchmark: &'static str,
    pub ranks: u32,
    pub files_per_rank: u32,
    pub file_bytes: u32,
    pub shared_dir: bool,
    pub drop_caches: bool,
    pub run: MdRun,
    /// The same workload on a plain local directory, in the same invocation.
    pub compare: Option<MdRun>,
    /// Phase → ops/s of `run` divided by ops/s of `compare`.
    pub ratio: BTreeMap<String, f64>,
}

pub fn report(p: &MdParams, run: MdRun, compare: Option<MdRun>) -> MdReport {
    let mut ratio = BTreeMap::new();
    if let Some(c) = &compare {
        for (a, b) in run.phases.iter().zip(&c.phases) {
            if b.ops_per_s > 0.0 {
                ratio.insert(a.phase.to_string(), a.ops_per_s / b.ops_per_s);
            }
        }
    }
    MdReport {
        benchmark: "md",
        ranks: p.ranks,
        files_per_rank: p.files_per_rank,
        file_bytes: p.file_bytes,
        shared_dir: p.shared_dir,
        drop_caches: p.drop_caches,
        run,
        compare,
        ratio,
    }
}

/// Removes whatever is left of the benchmark's tree when dropped.
pub struct Cleanup<'a> {
    backend: &'a dyn Backend,
    dir: String,
    subdirs: Vec<String>,
    /// Until the remove phase completes: the run's parameters, to remove every
    /// file a rank may have created (paths are derived, not stored: a run may
    /// have hundreds of millions).
    files: Option<MdParams>,
    /// Whether the remove phase has started: files then exist from some index
    /// to the end of each rank's list, else from its start up to some index.
    removing: std::cell::Cell<bool>,
    keep: bool,
}

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        if self.keep {
            return;
        }
        if let Some(p) = &self.files {
            let removing = self.removing.get();
            for r in 0..p.ranks {
                // Each rank creates and removes its files in order, so those left are a
                // prefix of its list (before the remove phase) or a suffix (during it):
                // find the boundary with a binary search, then remove exactly those.
                let exists = |i: u32| self.backend.stat(&file_path(p, &self.dir, r, i)).is_ok();
                let (mut lo, mut hi) = (0u32, p.files_per_rank);
                while lo < hi {
                    let mid = lo + (hi - lo) / 2;
                    if exists(mid) != removing {
                        lo = mid + 1;
                    } else {
                        hi = mid;
                    }
                }
                let left = if removing { lo..p.files_per_rank } else { 0..lo };
                for i in left {
                    let _ = self.backend.unlink(&file_path(p, &self.dir, r, i));
                }
            }
        }
        for d in self.subdirs.iter().chain(std::iter::once(&self.dir)) {
            if let Err(e) = self.backend.rmdir(d) {
                tracing::warn!("cannot remove benchmark directory {}: {e}", self.backend.describe(d));
            }
        }
    }
}

/// The run's own directory name (`hivefs-bench-md.<pid>` of the process that prepares it).
pub fn run_dir() -> String {
    format!("hivefs-bench-md.{}", std::process::id())
}

fn subdirs(p: &MdParams, dir: &str) -> Vec<String> {
    if p.shared_dir {
        vec![format!("{dir}/shared")]
    } else {
        (0..p.ranks).map(|r| format!("{dir}/r{r}")).collect()
    }
}

fn file_path(p: &MdParams, dir: &str, rank: u32, i: u32) -> String {
    if p.shared_dir {
        format!("{dir}/shared/f.{rank}.{i}")
    } else {
        format!("{dir}/r{rank}/f.{rank}.{i}")
    }
}

/// Creates the run's directory tree; the returned guard removes it, and
/// every file the ranks may have created, unless the run completes.
fn prepare<'a>(b: &'a dyn Backend, p: &MdParams, dir: &str) -> Result<Cleanup<'a>> {
    let mkdir = |d: &str| b.mkdir(d).map_err(|e| BenchError::io(format!("cannot create {}", b.describe(d)), e));
    mkdir(dir)?;
    let mut cleanup = Cleanup {
        backend: b,
        dir: dir.to_string(),
        subdirs: Vec::new(),
        files: None,
        removing: std::cell::Cell::new(false),
        keep: p.keep,
    };
    for d in subdirs(p, dir) {
        mkdir(&d)?;
        cleanup.subdirs.push(d);
    }
    // Until the remove phase completes, a failure must remove every file.
    cleanup.files = Some(p.clone());
    Ok(cleanup)
}

/// One rank's work in one phase, on the backend's runtime as one task when
/// it has one (see [`MdOps`]), else on this thread. `stop` is set when it
/// fails, and tells the tasks of the other ranks to stop (they cannot see
/// `failed`).
#[allow(clippy::too_many_arguments)]
fn run_rank(
    b: &Arc<dyn Backend>,
    p: &MdParams,
    dir: &str,
    rank: u32,
    ph: usize,
    failed: &AtomicBool,
    stop: &Arc<AtomicBool>,
    counter: &Counter,
) -> Result<u64> {
    let r = match b.runtime() {
        None => {
            let ops = b.clone().md_ops();
            block_here(rank_work(&**b, &*ops, p, dir, rank, ph, failed, counter))
        }
        Some(rt) => {
            let (b, p, dir, stop2, counter) = (b.clone(), p.clone(), dir.to_string(), stop.clone(), counter.clone());
            let task = rt.spawn(async move {
                let ops = b.clone().md_ops();
                rank_work(&*b, &*ops, &p, &dir, rank, ph, &stop2, &counter).await
            });
            rt.block_on(task).unwrap_or_else(|e| Err(BenchError::Invalid(format!("rank {rank}'s task failed: {e}"))))
        }
    };
    if r.is_err() {
        stop.store(true, Ordering::SeqCst);
    }
    r
}

/// Runs `f` to completion on this thread (the futures of a backend without
/// a runtime are ready when first polled).
fn block_here<F: Future>(f: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Arc::new(Unpark(std::thread::current())).into();
    let mut cx = std::task::Context::from_waker(&waker);
    let mut f = std::pin::pin!(f);
    loop {
        if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park();
    }
}

/// One rank's work in one phase: `files_per_rank` operations; returns how many were done.
#[allow(clippy::too_many_arguments)]
async fn rank_work(
    b: &dyn Backend,
    ops: &dyn MdOps,
    p: &MdParams,
    dir: &str,
    rank: u32,
    ph: usize,
    failed: &AtomicBool,
    counter: &Counter,
) -> Result<u64> {
    let content = vec![0x6du8; p.file_bytes as usize];
    let mut buf = vec![0u8; p.file_bytes as usize];
    let mut done = 0u64;
    for i in 0..p.files_per_rank {
        if failed.load(Ordering::Relaxed) || crate::interrupted() {
            break;
        }
        let f = file_path(p, dir, rank, i);
        let err = |doing: &str, e| BenchError::io(format!("rank {rank} {doing} {}", b.describe(&f)), e);
        match PHASES[ph] {
            "create" => ops.create_file(&f, &content).await.map_err(|e| err("creating", e))?,
            "stat" => {
                let size = ops.stat_file(&f).await.map_err(|e| err("stat of", e))?;
                if size != u64::from(p.file_bytes) {
                    return Err(BenchError::Invalid(format!(
                        "rank {rank}: {} has {size} bytes, not {}",
                        b.describe(&f),
                        p.file_bytes
                    )));
                }
            }
            "read" => {
                let n = ops.read_file(&f, &mut buf).await.map_err(|e| err("reading", e))?;
                if n != buf.len() || buf != content {
                    return Err(BenchError::Invalid(format!(
                        "rank {rank}: {} does not hold the data written",
                        b.describe(&f)
                    )));
                }
            }
            _ => ops.unlink_file(&f).await.map_err(|e| err("removing", e))?,
        }
        done += 1;
        counter.add(1);
    }
    Ok(done)
}

pub fn run(backend: Arc<dyn Backend>, p: &MdParams, obs: &Observers, progress: bool) -> Result<MdRun> {
    run_with(backend, p, obs, progress, None)
}

/// A whole run: its ranks in this process's threads, or run by `driver`.
pub fn run_with(
    backend: Arc<dyn Backend>,
    p: &MdParams,
    obs: &Observers,
    progress: bool,
    driver: Option<&mut dyn Driver>,
) -> Result<MdRun> {
    p.validate()?;
    let b: &dyn Backend = &*backend;
    let stop = Arc::new(AtomicBool::new(false));
    let dir = run_dir();
    let mut cleanup = prepare(b, p, &dir)?;
    let ops = p.ops_per_phase();
    let counter = Counter::default();
    let bar: RefCell<Option<Progress>> = RefCell::new(None);
    // Per phase: (ranks' CPU seconds, snapshot, requests per metadata node) at its start and end.
    type Mark = (f64, Snapshot, BTreeMap<String, u64>);
    let marks: RefCell<Vec<(Mark, Option<Mark>)>> = RefCell::new(Vec::new());
    let take = |cpu: f64| -> Result<Mark> {
        let meta = match &obs.meta {
            Some(m) => m.snapshot()?,
            None => BTreeMap::new(),
        };
        Ok((cpu, Snapshot::take(&obs.services), meta))
    };
    let threads = driver.is_none();
    let removing = &cleanup.removing;
    let mut before = |ph: usize, cpu: f64| -> Result<()> {
        if PHASES[ph] == "remove" {
            removing.set(true);
        }
        if p.drop_caches && ph > 0 {
            crate::io::drop_caches()?;
        }
        counter.reset();
        marks.borrow_mut().push((take(cpu)?, None));
        if threads {
            *bar.borrow_mut() =
                Some(Progress::start(progress, format!("md {}", PHASES[ph]), ops, "ops", counter.clone()));
        }
        Ok(())
    };
    let mut after = |ph: usize, cpu: f64| -> Result<()> {
        bar.borrow_mut().take();
        marks.borrow_mut()[ph].1 = Some(take(cpu)?);
        Ok(())
    };
    let spans = match driver {
        Some(d) => d.run(&PHASES, &mut before, &mut after)?.spans,
        None => {
            let unix0 = crate::unix_now_s();
            let spans = ranks::run(
                p.ranks,
                PHASES.len(),
                |ph| before(ph, crate::cpu::self_cpu_s()),
                |ph, _| after(ph, crate::cpu::self_cpu_s()),
                |rank, ph, failed| run_rank(&backend, p, &dir, rank, ph, failed, &stop, &counter),
            )?;
            PartResult::new(Part::all(p.ranks), unix0, spans, 0).spans
        }
    };
    let marks = marks.into_inner();
    if spans.len() != PHASES.len() || marks.len() != PHASES.len() {
        return Err(BenchError::Invalid(format!("{} of {} phases were run", spans.len(), PHASES.len())));
    }
    let mut phases = Vec::new();
    for (ph, (spans, (m0, m1))) in spans.iter().zip(marks).enumerate() {
        let (cpu0, snap0, meta0) = m0;
        let (cpu1, snap1, meta1) =
            m1.ok_or_else(|| BenchError::Invalid(format!("phase {} did not end", PHASES[ph])))?;
        let (_, svc) = snap0.per_op_us(&snap1, ops);
        let first = spans.iter().map(|s| s.start_s).fold(f64::INFINITY, f64::min);
        let last = spans.iter().map(|s| s.end_s).fold(f64::NEG_INFINITY, f64::max);
        let secs = (last - first).max(0.0);
        phases.push(MdPhase {
            phase: PHASES[ph],
            ops: spans.iter().map(|s| s.bytes).sum(),
            seconds: secs,
            ops_per_s: if secs > 0.0 { ops as f64 / secs } else { 0.0 },
            cpu_us_per_op: if ops > 0 { (cpu1 - cpu0) * 1e6 / ops as f64 } else { 0.0 },
            service_cpu_us_per_op: svc,
            meta_requests: meta1.iter().map(|(n, v)| (n.clone(), v - meta0.get(n).copied().unwrap_or(0))).collect(),
        });
    }
    cleanup.files = None;
    drop(cleanup);
    Ok(MdRun { api: b.kind(), path: b.describe(""), phases })
}

/// Runs the ranks of `part` through every phase in the run directory `dir`
/// prepared by the driving process, each phase on `sync`'s word.
pub fn run_part(
    b: &Arc<dyn Backend>,
    p: &MdParams,
    dir: &str,
    part: Part,
    sync: &mut dyn PhaseSync,
) -> Result<PartResult> {
    p.validate()?;
    part.check(p.ranks)?;
    let sync = RefCell::new(sync);
    let counter = Counter::default();
    let stop = Arc::new(AtomicBool::new(false));
    let unix0 = crate::unix_now_s();
    let spans = ranks::run(
        part.count,
        PHASES.len(),
        |ph| sync.borrow_mut().ready(ph),
        |ph, _| sync.borrow_mut().done(ph),
        |local, ph, failed| run_rank(b, p, dir, part.first + local, ph, failed, &stop, &counter),
    )?;
    Ok(PartResult::new(part, unix0, spans, 0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Posix;

    #[test]
    fn parameters_are_checked() {
        let p = MdParams {
            ranks: 2,
            files_per_rank: 5,
            file_bytes: 4096,
            shared_dir: false,
            drop_caches: false,
            keep: false,
        };
        assert!(p.validate().is_ok());
        assert_eq!(p.ops_per_phase(), 10);
        assert!(MdParams { files_per_rank: 0, ..p.clone() }.validate().is_err());
        assert!(MdParams { ranks: 0, ..p.clone() }.validate().is_err());
        assert!(MdParams { file_bytes: FILE_BYTES_MAX + 1, ..p }.validate().is_err());
    }

    /// A run that stops half-way leaves a prefix (creating) or a suffix
    /// (removing) of each rank's files: the cleanup finds and removes exactly those.
    #[test]
    fn cleanup_after_a_stop_removes_what_is_left() {
        for removing in [false, true] {
            let d = tempfile::tempdir().unwrap();
            let b = Posix::new(d.path().to_path_buf(), "plain");
            let p = MdParams {
                ranks: 3,
                files_per_rank: 50,
                file_bytes: 0,
                shared_dir: false,
                drop_caches: false,
                keep: false,
            };
            let c = prepare(&b, &p, "run").unwrap();
            c.removing.set(removing);
            for (r, k) in [(0u32, 0u32), (1, 17), (2, 50)] {
                let left = if removing { k..50 } else { 0..k };
                for i in left {
                    std::fs::write(d.path().join(file_path(&p, "run", r, i)), b"").unwrap();
                }
            }
            drop(c);
            assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 0, "removing {removing}: files left behind");
        }
    }

    #[test]
    fn all_phases_on_a_plain_directory_with_a_comparison() {
        for shared in [false, true] {
            let d = tempfile::tempdir().unwrap();
            let p = MdParams {
                ranks: 3,
                files_per_rank: 7,
                file_bytes: 4096,
                shared_dir: shared,
                drop_caches: false,
                keep: false,
            };
            let b: Arc<dyn Backend> = Arc::new(Posix::new(d.path().to_path_buf(), "plain"));
            let obs = Observers::default();
            let a = run(b.clone(), &p, &obs, false).unwrap();
            let c = run(b, &p, &obs, false).unwrap();
            let r = report(&p, a, Some(c));
            let names: Vec<_> = r.run.phases.iter().map(|x| x.phase).collect();
            assert_eq!(names, PHASES);
            assert!(r.run.phases.iter().all(|x| x.ops == 21 && x.ops_per_s > 0.0));
            assert_eq!(r.ratio.len(), 4);
            assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 0, "files left behind");
        }
    }
}
