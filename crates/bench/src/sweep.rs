//! `hivefs bench sweep`: the `io` benchmark over a matrix of parameters,
//! run as in the seed striping study's execution protocol.
//!
//! Every configuration (stripe count × chunk size × chooser × cache mode ×
//! transfer size × ranks) is repeated `repeat` times; the list of all runs
//! (configuration-major) is cut into blocks of [`BLOCK_RUNS`] consecutive
//! runs, the blocks are executed in a random order drawn from `seed`, one run
//! at a time, with a random pause between blocks. Each run works in a fresh
//! sub-directory whose stripe pattern is set first; afterwards the files'
//! stripe targets are counted per storage server (the `(min,max)` allocation
//! of `hivefs entry info`) and one JSON line is appended to the output file.

use crate::backend::{Backend, Native, Posix};
use crate::{io, BenchError, Result};
use hivefs_client::{Client, Ent, Options};
use hivefs_cluster::ClusterView;
use hivefs_net::Secret;
use hivefs_proto::Caller;
use hivefs_types::attr::{EntryAttr, FileKind};
use hivefs_types::pattern::{Chooser, DirPattern};
use rustix::process::{getgid, getuid};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Runs per block, as in the seed study.
pub const BLOCK_RUNS: usize = 10;

/// The cache modes a sweep can run through a mount (`hivefs mount
/// --cache-mode`). The native client has no kernel cache: its runs are
/// `native` only.
pub const CACHE_MODES: [&str; 3] = ["native", "paged", "buffered"];

/// A small deterministic generator (SplitMix64): the block order and the
/// pauses depend on the seed only.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            return lo;
        }
        lo + self.next_u64() % (hi - lo + 1)
    }

    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.range(0, i as u64) as usize;
            v.swap(i, j);
        }
    }
}

/// One configuration of the matrix.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Config {
    pub stripe_count: u32,
    pub chunk_size: u32,
    pub chooser: String,
    pub cache: String,
    pub transfer_bytes: u64,
    pub ranks: u32,
}

/// The values of each axis.
#[derive(Clone, Debug)]
pub struct Axes {
    pub stripe_counts: Vec<u32>,
    pub chunk_sizes: Vec<u32>,
    pub choosers: Vec<Chooser>,
    pub caches: Vec<String>,
    pub transfer_bytes: Vec<u64>,
    pub ranks: Vec<u32>,
}

impl Axes {
    /// The cartesian product, first axis outermost.
    pub fn configs(&self) -> Vec<Config> {
        let mut out = Vec::new();
        for &s in &self.stripe_counts {
            for &c in &self.chunk_sizes {
                for ch in &self.choosers {
                    for cache in &self.caches {
                        for &t in &self.transfer_bytes {
                            for &r in &self.ranks {
                                out.push(Config {
                                    stripe_count: s,
                                    chunk_size: c,
                                    chooser: ch.to_string(),
                                    cache: cache.clone(),
                                    transfer_bytes: t,
                                    ranks: r,
                                });
                            }
                        }
                    }
                }
            }
        }
        out
    }
}

/// One run of the plan: configuration index, repetition, and the block it belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Planned {
    pub config: usize,
    pub repetition: u32,
    pub block: usize,
}

/// The execution order: all runs (configuration-major) cut into blocks of
/// `block_runs`, the blocks shuffled with `seed`. Returns the blocks in
/// execution order, each with its runs.
pub fn plan(configs: usize, repeat: u32, block_runs: usize, seed: u64) -> Vec<Vec<Planned>> {
    let all: Vec<(usize, u32)> = (0..configs).flat_map(|c| (0..repeat).map(move |r| (c, r))).collect();
    let mut blocks: Vec<Vec<Planned>> = all
        .chunks(block_runs.max(1))
        .enumerate()
        .map(|(b, runs)| runs.iter().map(|&(config, repetition)| Planned { config, repetition, block: b }).collect())
        .collect();
    Rng::new(seed).shuffle(&mut blocks);
    blocks
}

/// Stripe targets of one file per storage server, and their `(min,max)`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Allocation {
    pub path: String,
    pub targets: Vec<u32>,
    pub per_server: BTreeMap<u32, usize>,
    pub min: usize,
    pub max: usize,
}

/// Counts `targets` on every storage server of the cluster (0 for servers without any).
pub fn allocation(view: &ClusterView, path: &str, targets: &[hivefs_types::TargetId]) -> Allocation {
    let per_server = view.targets_per_server(targets);
    Allocation {
        path: path.to_string(),
        targets: targets.iter().map(|t| t.0).collect(),
        min: per_server.values().copied().min().unwrap_or(0),
        max: per_server.values().copied().max().unwrap_or(0),
        per_server,
    }
}

/// One JSON line of `runs.jsonl`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunRecord {
    pub seed: u64,
    /// Position in the execution order (0-based).
    pub run: usize,
    pub runs: usize,
    pub block: usize,
    pub config_index: usize,
    pub repetition: u32,
    #[serde(flatten)]
    pub config: Config,
    pub block_bytes: u64,
    pub segments: u32,
    pub file_per_rank: bool,
    pub api: String,
    pub hosts: u32,
    pub start_unix_s: f64,
    /// `(min,max)` of the first file (every file's is in `files`).
    pub allocation: String,
    pub alloc_min: usize,
    pub alloc_max: usize,
    pub files: Vec<Allocation>,
    pub write_mib_s: f64,
    pub read_mib_s: f64,
    pub write_seconds: f64,
    pub read_seconds: f64,
    pub bytes: u64,
}

/// Where the sweep runs: the file system and a directory in it.
#[derive(Clone, Debug)]
pub struct Place {
    pub mgmtd: String,
    pub secret: Option<Secret>,
    /// The directory, as a path from the file system's root.
    pub inside: String,
    /// The same directory through a mount, per cache mode (runs use plain
    /// file I/O there); empty: runs use the native client.
    pub mount_dirs: BTreeMap<String, PathBuf>,
}

impl Place {
    /// Where runs of cache mode `cache` do their I/O: a mount's directory, or
    /// `None` for the native client.
    pub fn mount_dir(&self, cache: &str) -> Result<Option<&PathBuf>> {
        if self.mount_dirs.is_empty() {
            return if cache == "native" {
                Ok(None)
            } else {
                Err(BenchError::Invalid(format!(
                    "cache mode {cache:?}: the native client has no kernel cache; sweep cache modes through a mount"
                )))
            };
        }
        self.mount_dirs.get(cache).map(Some).ok_or_else(|| {
            BenchError::Invalid(format!(
                "no mount with cache mode {cache:?} to run in (mounts: {:?})",
                self.mount_dirs.keys().collect::<Vec<_>>()
            ))
        })
    }
}

#[derive(Clone, Debug)]
pub struct SweepParams {
    pub axes: Axes,
    pub repeat: u32,
    pub seed: u64,
    pub pause_min_ms: u64,
    pub pause_max_ms: u64,
    pub block_bytes: u64,
    pub segments: u32,
    pub file_per_rank: bool,
    pub fsync: bool,
    pub drop_caches: bool,
    pub out: PathBuf,
}

impl SweepParams {
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(BenchError::Invalid(m));
        let a = &self.axes;
        if a.stripe_counts.is_empty()
            || a.chunk_sizes.is_empty()
            || a.choosers.is_empty()
            || a.caches.is_empty()
            || a.transfer_bytes.is_empty()
            || a.ranks.is_empty()
        {
            return bad("every axis needs at least one value".into());
        }
        if let Some(c) = a.caches.iter().find(|c| !CACHE_MODES.contains(&c.as_str())) {
            return bad(format!("unknown cache mode {c:?}: use {}", CACHE_MODES.join(" or ")));
        }
        if a.stripe_counts.contains(&0) {
            return bad("stripe counts must be positive".into());
        }
        for &c in &a.chunk_sizes {
            hivefs_types::pattern::validate_chunk_size(u64::from(c)).map_err(|e| BenchError::Invalid(e.to_string()))?;
        }
        if self.repeat == 0 {
            return bad("repetitions must be at least 1".into());
        }
        if self.pause_min_ms > self.pause_max_ms {
            return bad(format!(
                "pause minimum {} ms is above the maximum {} ms",
                self.pause_min_ms, self.pause_max_ms
            ));
        }
        for c in a.configs() {
            self.io_params(&c).validate()?;
        }
        Ok(())
    }

    fn io_params(&self, c: &Config) -> io::IoParams {
        io::IoParams {
            ranks: c.ranks,
            transfer_bytes: c.transfer_bytes,
            block_bytes: self.block_bytes,
            segments: self.segments,
            file_per_rank: self.file_per_rank,
            fsync: self.fsync,
            drop_caches: self.drop_caches,
            reorder: false,
            keep: true,
        }
    }
}

/// A client and a runtime for the sweep's own metadata work (directories,
/// patterns, allocations), also used by `bench tune-chunk`.
pub struct Control {
    rt: tokio::runtime::Runtime,
    client: Arc<Client>,
    caller: Caller,
}

fn fs_err(what: String) -> impl FnOnce(hivefs_types::error::FsError) -> BenchError {
    move |e| BenchError::fs(what, e)
}

impl Control {
    pub fn connect(mgmtd: &str, secret: Option<Secret>) -> Result<Control> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| BenchError::io("starting a runtime", e))?;
        let client = rt
            .block_on(Client::connect(Options::new(mgmtd.to_string(), secret)))
            .map_err(fs_err(format!("connecting to mgmtd {mgmtd}")))?;
        rt.block_on(client.cluster().refresh()).map_err(fs_err(format!("cluster view from mgmtd {mgmtd}")))?;
        let caller = Caller::new(getuid().as_raw(), getgid().as_raw());
        Ok(Control { rt, client, caller })
    }

    /// The entry at `path` (from the file system's root).
    pub fn resolve(&self, path: &str) -> Result<EntryAttr> {
        self.rt.block_on(self.client.resolve(path)).map_err(fs_err(format!("hivefs:/{path}")))
    }

    /// The stripe settings of directory `path`.
    pub fn dir_pattern(&self, path: &str) -> Result<DirPattern> {
        let a = self.resolve(path)?;
        a.dir_pattern.ok_or_else(|| BenchError::Invalid(format!("hivefs:/{path} is not a directory")))
    }

    /// Sets directory `path`'s stripe settings for new files.
    pub fn set_dir_pattern(&self, path: &str, p: DirPattern) -> Result<()> {
        let a = self.resolve(path)?;
        if a.kind != FileKind::Dir {
            return Err(BenchError::Invalid(format!("hivefs:/{path} is not a directory")));
        }
        self.rt
            .block_on(self.client.set_dir_pattern(Ent::from(&a), p))
            .map_err(fs_err(format!("setting the pattern of hivefs:/{path}")))?;
        Ok(())
    }

    fn mkdir(&self, parent: &str, name: &str) -> Result<()> {
        let p = self.resolve(parent)?;
        self.rt
            .block_on(self.client.mkdir(Ent::from(&p), name.as_bytes(), 0o755, self.caller))
            .map_err(fs_err(format!("creating hivefs:/{}", join(parent, name))))?;
        Ok(())
    }

    fn rmdir(&self, parent: &str, name: &str) -> Result<()> {
        let p = self.resolve(parent)?;
        self.rt
            .block_on(self.client.rmdir(Ent::from(&p), name.as_bytes()))
            .map_err(fs_err(format!("removing hivefs:/{}", join(parent, name))))
    }

    /// The allocation of file `path`.
    pub fn allocation(&self, path: &str) -> Result<Allocation> {
        let a = self.resolve(path)?;
        let p = a.pattern.ok_or_else(|| BenchError::Invalid(format!("hivefs:/{path} is not a file")))?;
        Ok(allocation(&self.client.cluster().view(), &format!("/{path}"), p.targets()))
    }
}

fn join(a: &str, b: &str) -> String {
    let a = a.trim_matches('/');
    if a.is_empty() {
        b.to_string()
    } else {
        format!("{a}/{b}")
    }
}

pub struct SweepSummary {
    pub runs: usize,
    pub out: PathBuf,
}

/// Removes a run's files and directories when dropped, also after a failure.
struct RunCleanup<'a> {
    ctl: &'a Control,
    place: &'a Place,
    /// The mount directory the run used (`None`: native client).
    mount_dir: Option<&'a PathBuf>,
    name: String,
    backend: Option<Arc<dyn Backend>>,
    io_dir: String,
    files: Vec<String>,
}

impl Drop for RunCleanup<'_> {
    fn drop(&mut self) {
        if let Some(b) = &self.backend {
            for f in &self.files {
                let _ = b.unlink(f);
            }
            let _ = b.rmdir(&self.io_dir);
        }
        self.backend = None;
        let r = match self.mount_dir {
            Some(d) => std::fs::remove_dir(d.join(&self.name))
                .map_err(|e| BenchError::io(format!("removing {}", d.join(&self.name).display()), e)),
            None => self.ctl.rmdir(&self.place.inside, &self.name),
        };
        if let Err(e) = r {
            tracing::warn!("sweep run directory left behind: {e}");
        }
    }
}

/// Runs the sweep, appending one JSON line per run to `p.out`.
pub fn run(place: &Place, p: &SweepParams, progress: bool) -> Result<SweepSummary> {
    p.validate()?;
    for c in &p.axes.caches {
        place.mount_dir(c)?;
    }
    let configs = p.axes.configs();
    let blocks = plan(configs.len(), p.repeat, BLOCK_RUNS, p.seed);
    let total: usize = blocks.iter().map(Vec::len).sum();
    let ctl = Control::connect(&place.mgmtd, place.secret.clone())?;
    let base = ctl.dir_pattern(&place.inside)?;
    let mut out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&p.out)
        .map_err(|e| BenchError::io(format!("opening {}", p.out.display()), e))?;
    let mut rng = Rng::new(p.seed ^ 0x05ee_d0f5_a05e);
    let started = Instant::now();
    let mut k = 0usize;
    for (bi, block) in blocks.iter().enumerate() {
        if bi > 0 {
            std::thread::sleep(Duration::from_millis(rng.range(p.pause_min_ms, p.pause_max_ms)));
        }
        for planned in block {
            crate::check_interrupted()?;
            let c = &configs[planned.config];
            if progress {
                let eta = if k == 0 {
                    "?".to_string()
                } else {
                    format!("{:.0}s", started.elapsed().as_secs_f64() / k as f64 * (total - k) as f64)
                };
                eprintln!(
                    "sweep: run {} of {total} (block {}, stripe {}, chunk {}, cache {}, {} ranks, repetition {}), ETA {eta}",
                    k + 1,
                    planned.block,
                    c.stripe_count,
                    c.chunk_size,
                    c.cache,
                    c.ranks,
                    planned.repetition + 1
                );
            }
            let rec = one_run(&ctl, place, p, &base, c, planned, k, total)?;
            let line = serde_json::to_string(&rec).map_err(|e| BenchError::Invalid(e.to_string()))?;
            writeln!(out, "{line}").map_err(|e| BenchError::io(format!("writing {}", p.out.display()), e))?;
            k += 1;
        }
    }
    Ok(SweepSummary { runs: k, out: p.out.clone() })
}

#[allow(clippy::too_many_arguments)]
fn one_run(
    ctl: &Control,
    place: &Place,
    p: &SweepParams,
    base: &DirPattern,
    c: &Config,
    planned: &Planned,
    k: usize,
    total: usize,
) -> Result<RunRecord> {
    let name = format!("sweep.{}.{}.{k}", std::process::id(), p.seed);
    let rel = join(&place.inside, &name);
    let mount_dir = place.mount_dir(&c.cache)?;
    match mount_dir {
        Some(d) => std::fs::create_dir(d.join(&name))
            .map_err(|e| BenchError::io(format!("creating {}", d.join(&name).display()), e))?,
        None => ctl.mkdir(&place.inside, &name)?,
    }
    let io_dir = format!("hivefs-bench-io.{}", std::process::id());
    let nfiles = if p.file_per_rank { c.ranks } else { 1 };
    let files: Vec<String> = (0..nfiles)
        .map(|r| if p.file_per_rank { format!("{io_dir}/data.{r}") } else { format!("{io_dir}/data") })
        .collect();
    let mut guard =
        RunCleanup { ctl, place, mount_dir, name: name.clone(), backend: None, io_dir, files: files.clone() };
    let chooser = Chooser::parse(&c.chooser).ok_or_else(|| BenchError::Invalid(format!("chooser {}", c.chooser)))?;
    ctl.set_dir_pattern(
        &rel,
        DirPattern {
            chunk_size: c.chunk_size,
            stripe_count: c.stripe_count,
            chooser,
            pool: base.pool,
            mirror: base.mirror,
        },
    )?;
    let backend: Arc<dyn Backend> = match mount_dir {
        Some(d) => Arc::new(Posix::new(d.join(&name), "mount")),
        None => Arc::new(
            Native::connect(Options::new(place.mgmtd.clone(), place.secret.clone()), &rel)
                .map_err(|e| BenchError::io(format!("native client on hivefs:/{rel}"), e))?,
        ),
    };
    guard.backend = Some(backend.clone());
    let start_unix_s = crate::unix_now_s();
    let r = io::run(backend.clone(), &p.io_params(c), false)?;
    let allocs = files.iter().map(|f| ctl.allocation(&join(&rel, f))).collect::<Result<Vec<_>>>()?;
    drop(guard);
    let first = &allocs[0];
    Ok(RunRecord {
        seed: p.seed,
        run: k,
        runs: total,
        block: planned.block,
        config_index: planned.config,
        repetition: planned.repetition,
        config: c.clone(),
        block_bytes: p.block_bytes,
        segments: p.segments,
        file_per_rank: p.file_per_rank,
        api: r.api.to_string(),
        hosts: 1,
        start_unix_s,
        allocation: format!("({},{})", first.min, first.max),
        alloc_min: first.min,
        alloc_max: first.max,
        files: allocs,
        write_mib_s: r.write.aggregate_mib_s,
        read_mib_s: r.read.aggregate_mib_s,
        write_seconds: r.write.seconds,
        read_seconds: r.read.seconds,
        bytes: r.write.bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_a_seeded_permutation_of_whole_blocks() {
        // 3 configurations × 7 repetitions = 21 runs: blocks of 10, 10 and 1.
        let b = plan(3, 7, 10, 42);
        assert_eq!(b.iter().map(Vec::len).sum::<usize>(), 21);
        let mut ids: Vec<usize> = b.iter().map(|blk| blk[0].block).collect();
        ids.sort();
        assert_eq!(ids, vec![0, 1, 2]);
        for blk in &b {
            // Every run of a block carries its block id, and block k holds runs 10k..10k+9.
            for (i, r) in blk.iter().enumerate() {
                assert_eq!(r.block, blk[0].block);
                let global = r.config * 7 + r.repetition as usize;
                assert_eq!(global, r.block * 10 + i);
            }
        }
        // Every (configuration, repetition) exactly once.
        let mut all: Vec<(usize, u32)> = b.iter().flatten().map(|r| (r.config, r.repetition)).collect();
        all.sort();
        assert_eq!(all, (0..3).flat_map(|c| (0..7).map(move |r| (c, r))).collect::<Vec<_>>());
        // Same seed, same order; the order does change across seeds.
        assert_eq!(plan(3, 7, 10, 42), b);
        let orders: std::collections::HashSet<Vec<usize>> =
            (0..20).map(|s| plan(3, 7, 10, s).iter().map(|blk| blk[0].block).collect()).collect();
        assert!(orders.len() > 1);
    }

    #[test]
    fn runs_go_to_the_mount_of_their_cache_mode() {
        let native_client =
            Place { mgmtd: "m".into(), secret: None, inside: String::new(), mount_dirs: BTreeMap::new() };
        assert_eq!(native_client.mount_dir("native").unwrap(), None);
        let e = native_client.mount_dir("paged").unwrap_err().to_string();
        assert!(e.contains("native client"), "{e}");
        let mounts = Place {
            mount_dirs: [("native".to_string(), PathBuf::from("/a")), ("paged".to_string(), PathBuf::from("/b"))]
                .into(),
            ..native_client
        };
        assert_eq!(mounts.mount_dir("paged").unwrap(), Some(&PathBuf::from("/b")));
        assert_eq!(mounts.mount_dir("native").unwrap(), Some(&PathBuf::from("/a")));
        let one = Place { mount_dirs: [("native".to_string(), PathBuf::from("/a"))].into(), ..mounts };
        assert!(one.mount_dir("paged").unwrap_err().to_string().contains("no mount with cache mode"));
    }

    #[test]
    fn rng_range_stays_in_bounds() {
        let mut r = Rng::new(7);
        for _ in 0..1000 {
            let x = r.range(5, 9);
            assert!((5..=9).contains(&x));
        }
        assert_eq!(r.range(3, 3), 3);
    }

    #[test]
    fn matrix_and_cache_axis() {
        let axes = Axes {
            stripe_counts: vec![1, 2],
            chunk_sizes: vec![65536, 1 << 20],
            choosers: vec![Chooser::Balanced],
            caches: vec!["native".into()],
            transfer_bytes: vec![65536],
            ranks: vec![1, 2],
        };
        let cs = axes.configs();
        assert_eq!(cs.len(), 8);
        assert_eq!((cs[0].stripe_count, cs[0].chunk_size, cs[0].ranks), (1, 65536, 1));
        assert_eq!((cs[7].stripe_count, cs[7].chunk_size, cs[7].ranks), (2, 1 << 20, 2));
        let mut p = SweepParams {
            axes,
            repeat: 2,
            seed: 1,
            pause_min_ms: 0,
            pause_max_ms: 10,
            block_bytes: 1 << 20,
            segments: 1,
            file_per_rank: false,
            fsync: false,
            drop_caches: false,
            out: "x".into(),
        };
        assert!(p.validate().is_ok());
        p.axes.caches.push("paged".into());
        assert!(p.validate().is_ok());
        p.axes.caches.push("writeback".into());
        let e = p.validate().unwrap_err().to_string();
        assert!(e.contains("writeback") && e.contains("paged"), "{e}");
    }
}
