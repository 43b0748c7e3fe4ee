//! `hivefs bench storage|net|io|md`: argument parsing, finding the file
//! system, and printing the results of the `hivefs-bench` library (a text
//! table, or one JSON object with `--json`).

use crate::admin::{resolve, Conn};
use crate::bench_args::{Common, ReportArgs, SweepArgs, TuneArgs};
use crate::bench_procs::{run_child, ProcArgs, Procs};
use crate::util::{absolute, hivefs_mounts, human, mount_of, parse_size, print_table, size_u32};
use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use hivefs_bench::backend::{Backend, Native, Posix};
use hivefs_bench::md::{MetaCounts, Observers};
use hivefs_bench::{io, md, net, storage, FsConn};
use hivefs_client::Options;
use hivefs_types::ids::TargetId;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

#[derive(Subcommand, Debug)]
pub enum BenchCmd {
    /// StorageBench: every storage node writes, then reads back, a volume on each of its targets
    /// locally (no client, no network), in scratch files under `<target>/bench/` that are removed
    /// afterwards. Reports MiB/s per target and in total (total volume / (last end - first start)).
    Storage(StorageArgs),
    /// NetBench: streams from this machine to every storage node, which discards what it receives
    /// and answers reads with zeros (no disk I/O). Reports MiB/s per storage node and in total.
    Net(NetArgs),
    /// IOR-like: ranks (threads, or threads of several processes with --processes) write,
    /// then read back, one shared file (N-1) or a file each (N-N), through a mount (plain
    /// file I/O on PATH) or the native client (--native). Reports the aggregate (total
    /// volume / (last end - first start)) and per-rank MiB/s.
    Io(IoArgs),
    /// mdtest-like: ranks (threads, or threads of several processes with --processes)
    /// create, stat, read and remove small files in a directory per rank or one shared
    /// directory, through a mount or the native client (--native). Reports ops/s per phase,
    /// CPU time per operation and requests per metadata node. Ctrl-C stops a run and
    /// removes its files.
    Md(MdArgs),
    /// A matrix of `io` runs (stripe count x chunk size x chooser x cache mode x transfer size x
    /// ranks) x --repeat repetitions, as the seed striping study's protocol: runs in blocks of 10,
    /// blocks in a random order (--seed), one run at a time, a random pause between blocks. Each
    /// run gets a fresh sub-directory with its stripe pattern; one JSON line per run (parameters,
    /// the files' (min,max) target allocation, bandwidths) is appended to --out. One client host
    /// only (--hosts 1): multi-host sweeps use the `hivefs-testbed` scripts.
    Sweep(SweepArgs),
    /// Figures (SVG, and PNG when rsvg-convert is installed) and a CSV from a sweep's JSON lines:
    /// write and read bandwidth by stripe count, by (min,max) allocation and, when the runs
    /// hold several, by client cache mode; every run a dot over a box plot per group.
    Report(ReportArgs),
    /// Runs COMMAND repeatedly with DIR's chunk size set to 4k, 16k, ... 16m, then the
    /// neighbours (x2, /2) of the best, and recommends the chunk size with the lowest median wall
    /// time. Afterwards DIR keeps its pattern with the recommended chunk size.
    TuneChunk(TuneArgs),
    /// One aggregate bandwidth from `bench io --json` runs made at the same time on several client
    /// hosts (concurrent applications): per phase, total volume / (last end - first start) over all
    /// runs (the seed study's Equation 1), from each report's start_unix_s and end_unix_s (the
    /// hosts' clocks must agree). Also prints each run's own bandwidth and their sum.
    Combine(CombineArgs),
}

#[derive(Args, Debug)]
pub struct CombineArgs {
    /// Files holding the output of `hivefs bench io --json` (one or more reports each).
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct StorageArgs {
    #[command(flatten)]
    pub common: Common,
    /// Volume written and read on each target (e.g. 512m, 4g).
    #[arg(long, default_value = "1g")]
    pub volume: String,
    /// Size of each write and read.
    #[arg(long, default_value = "1m")]
    pub block_size: String,
    /// Threads per target, each writing its own scratch file (the volume is split between them).
    #[arg(long, default_value_t = 1)]
    pub threads: u32,
    /// Bypass the page cache (O_DIRECT); the block size must then be a multiple of 4 KiB.
    #[arg(long)]
    pub direct: bool,
    /// Only these targets (comma-separated ids); default: every target.
    #[arg(long, value_delimiter = ',')]
    pub targets: Vec<u32>,
    /// Seconds the whole run may take.
    #[arg(long, default_value_t = 3600)]
    pub timeout: u64,
}

#[derive(Args, Debug)]
pub struct NetArgs {
    #[command(flatten)]
    pub common: Common,
    /// Volume sent to, and then received from, each storage node.
    #[arg(long, default_value = "1g")]
    pub volume: String,
    /// Size of each request's data (at most 8m).
    #[arg(long, default_value = "1m")]
    pub block_size: String,
    /// Concurrent streams (requests in flight) per storage node.
    #[arg(long, default_value_t = 4)]
    pub streams: u32,
    /// Seconds any one request may take.
    #[arg(long, default_value_t = 60)]
    pub timeout: u64,
}

/// Where the I/O and metadata benchmarks run.
#[derive(Args, Debug)]
pub struct Target {
    /// Directory to run in: inside a HiveFS mount (or any local directory, for comparison);
    /// with --native a path inside the file system (default /). The benchmark works in a new
    /// sub-directory that it removes afterwards.
    pub path: Option<PathBuf>,
    /// Use the native client library instead of the mount (file system from --mount, or
    /// --mgmtd and --secret-file, or the only HiveFS mount of this machine).
    #[arg(long)]
    pub native: bool,
    /// With --native: send all chunk I/O over TCP, also to storage services on this
    /// machine, whose chunk files the native client otherwise reads and writes directly
    /// (short-circuit). Measures the network path on one host.
    #[arg(long, requires = "native")]
    pub no_short_circuit: bool,
    /// Number of ranks (threads; with --processes, spread over that many processes).
    #[arg(long, default_value_t = 2)]
    pub ranks: u32,
    /// Leave the files in place.
    #[arg(long)]
    pub keep: bool,
}

#[derive(Args, Debug)]
pub struct IoArgs {
    #[command(flatten)]
    pub common: Common,
    #[command(flatten)]
    pub target: Target,
    /// Size of each read and write call.
    #[arg(long, default_value = "1m")]
    pub transfer_size: String,
    /// Contiguous bytes per rank per segment (a multiple of the transfer size).
    #[arg(long, default_value = "64m")]
    pub block_size: String,
    /// Segments per rank: with N-1 and more than one, the ranks' blocks interleave.
    #[arg(long, default_value_t = 1)]
    pub segments: u32,
    /// N-N: a file per rank (default N-1: one shared file).
    #[arg(long)]
    pub file_per_rank: bool,
    /// fsync each file at the end of the write phase (timed).
    #[arg(long)]
    pub fsync: bool,
    /// Drop the page cache between write and read (echo 3 > /proc/sys/vm/drop_caches; root only).
    #[arg(long)]
    pub drop_caches: bool,
    /// Each rank reads back what the next rank wrote.
    #[arg(long)]
    pub reorder: bool,
    #[command(flatten)]
    pub procs: ProcArgs,
}

#[derive(Args, Debug)]
pub struct MdArgs {
    #[command(flatten)]
    pub common: Common,
    #[command(flatten)]
    pub target: Target,
    /// Files per rank.
    #[arg(long, default_value_t = 1000)]
    pub files: u32,
    /// Size of each file (e.g. 0, 4k, 32k).
    #[arg(long, default_value = "0")]
    pub file_size: String,
    /// All ranks in one shared directory (default: a directory per rank).
    #[arg(long)]
    pub shared_dir: bool,
    /// Drop the kernel's caches (echo 3 > /proc/sys/vm/drop_caches; root only) before
    /// the stat, read and remove phases: they find nothing cached, as on a client that
    /// did not create the files.
    #[arg(long)]
    pub drop_caches: bool,
    /// Also run the same workload on this plain local directory and print the ratio.
    #[arg(long)]
    pub compare_dir: Option<PathBuf>,
    /// The `hivefs up --dir` of the file system, for the CPU time of its services
    /// (default: found from the mount when it was started by `hivefs up`).
    #[arg(long)]
    pub up_dir: Option<PathBuf>,
    #[command(flatten)]
    pub procs: ProcArgs,
}

pub fn bench(cmd: BenchCmd) -> Result<()> {
    match cmd {
        BenchCmd::Storage(a) => bench_storage(a),
        BenchCmd::Net(a) => bench_net(a),
        BenchCmd::Io(a) => bench_io(a),
        BenchCmd::Md(a) => bench_md(a),
        BenchCmd::Sweep(a) => crate::bench_sweep::sweep(a),
        BenchCmd::Report(a) => crate::bench_sweep::report(a),
        BenchCmd::TuneChunk(a) => crate::bench_sweep::tune_chunk(a),
        BenchCmd::Combine(a) => bench_combine(a),
    }
}

fn fs_conn(c: &Conn) -> Result<FsConn> {
    let r = resolve(c)?;
    Ok(FsConn { mgmtd: r.mgmtd, secret: r.secret })
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?)
}

fn print_json<T: serde::Serialize>(v: &T) -> Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match writeln!(out, "{}", serde_json::to_string_pretty(v)?) {
        // A reader that stopped early (`| head`) is not an error of the benchmark.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => r.context("writing the results to stdout"),
    }
}

pub(crate) fn storage_params(a: &StorageArgs) -> Result<storage::StorageParams> {
    let p = storage::StorageParams {
        bytes_per_target: parse_size(&a.volume)?,
        block_bytes: size_u32(&a.block_size, "block size")?,
        threads: a.threads,
        direct: a.direct,
        targets: a.targets.iter().map(|&t| TargetId(t)).collect(),
        timeout: Duration::from_secs(a.timeout.max(1)),
    };
    p.validate()?;
    Ok(p)
}

fn bench_storage(a: StorageArgs) -> Result<()> {
    let p = storage_params(&a)?;
    let conn = fs_conn(&a.common.conn)?;
    let r = runtime()?.block_on(storage::run(&conn, &p, !a.common.no_progress))?;
    if a.common.conn.json {
        return print_json(&r);
    }
    println!(
        "storage bench: {} per target, block {}, {} thread(s) per target{}",
        human(r.bytes_per_target),
        human(u64::from(r.block_bytes)),
        r.threads,
        if r.direct { ", O_DIRECT" } else { "" }
    );
    let rows: Vec<Vec<String>> = r
        .targets
        .iter()
        .map(|t| {
            vec![
                t.target.to_string(),
                t.node.to_string(),
                human(t.bytes),
                format!("{:.1}", t.write_mib_s),
                format!("{:.1}", t.read_mib_s),
            ]
        })
        .collect();
    print_table(&["TARGET", "NODE", "VOLUME", "WRITE MiB/s", "READ MiB/s"], &rows);
    println!(
        "total: {} on {} targets, write {:.1} MiB/s, read {:.1} MiB/s",
        human(r.total_bytes),
        r.targets.len(),
        r.total_write_mib_s,
        r.total_read_mib_s
    );
    Ok(())
}

pub(crate) fn net_params(a: &NetArgs) -> Result<net::NetParams> {
    let p = net::NetParams {
        bytes_per_node: parse_size(&a.volume)?,
        block_bytes: size_u32(&a.block_size, "block size")?,
        streams: a.streams,
        timeout: Duration::from_secs(a.timeout.max(1)),
    };
    p.validate()?;
    Ok(p)
}

fn bench_net(a: NetArgs) -> Result<()> {
    let p = net_params(&a)?;
    let conn = fs_conn(&a.common.conn)?;
    let r = runtime()?.block_on(net::run(&conn, &p, !a.common.no_progress))?;
    if a.common.conn.json {
        return print_json(&r);
    }
    println!(
        "net bench: {} per storage node, block {}, {} stream(s) per node",
        human(r.bytes_per_node),
        human(u64::from(r.block_bytes)),
        r.streams
    );
    let rows: Vec<Vec<String>> = r
        .nodes
        .iter()
        .map(|n| {
            vec![
                n.node.to_string(),
                n.addr.clone(),
                human(n.bytes),
                format!("{:.1}", n.write_mib_s),
                format!("{:.1}", n.read_mib_s),
            ]
        })
        .collect();
    print_table(&["NODE", "ADDRESS", "VOLUME", "WRITE MiB/s", "READ MiB/s"], &rows);
    println!("total: write {:.1} MiB/s, read {:.1} MiB/s", r.total_write_mib_s, r.total_read_mib_s);
    Ok(())
}

/// A run's backend, the connection to its file system and its mount point (when known).
type Chosen = (Arc<dyn Backend>, Option<FsConn>, Option<PathBuf>);

/// The backend a run uses, and the connection to the file system when known.
fn backend(t: &Target, c: &Conn) -> Result<Chosen> {
    if t.native {
        let r = resolve(c)?;
        let mnt = c.mount.clone().or_else(|| if c.mgmtd.is_none() { hivefs_mounts().pop().map(|m| m.0) } else { None });
        let inside = match &t.path {
            None => String::new(),
            Some(p) => match mnt.as_ref().and_then(|m| std::fs::canonicalize(m).ok()) {
                Some(m) if absolute(p)?.starts_with(&m) => {
                    absolute(p)?.strip_prefix(&m).expect("checked").to_string_lossy().into_owned()
                }
                _ => p.to_string_lossy().into_owned(),
            },
        };
        let mut opts = Options::new(r.mgmtd.clone(), r.secret.clone());
        opts.short_circuit = !t.no_short_circuit;
        let n = Native::connect(opts, &inside).with_context(|| format!("native client, directory /{inside}"))?;
        return Ok((Arc::new(n), Some(FsConn { mgmtd: r.mgmtd, secret: r.secret }), mnt));
    }
    let Some(path) = &t.path else { bail!("give the directory to run in (PATH), or --native") };
    if !path.is_dir() {
        bail!("{} is not a directory", path.display());
    }
    let mnt = mount_of(path);
    let conn = match (&mnt, &c.mgmtd, &c.mount) {
        (_, Some(_), _) | (_, _, Some(_)) => Some(fs_conn(c)?),
        (Some(m), None, None) => Some(fs_conn(&Conn { mount: Some(m.clone()), ..c.clone() })?),
        (None, None, None) => None,
    };
    let kind = if mnt.is_some() { "mount" } else { "plain" };
    Ok((Arc::new(Posix::new(absolute(path)?, kind)), conn, mnt))
}

pub(crate) fn io_params(a: &IoArgs) -> Result<io::IoParams> {
    let p = io::IoParams {
        ranks: a.target.ranks,
        transfer_bytes: parse_size(&a.transfer_size)?,
        block_bytes: parse_size(&a.block_size)?,
        segments: a.segments,
        file_per_rank: a.file_per_rank,
        fsync: a.fsync,
        drop_caches: a.drop_caches,
        reorder: a.reorder,
        keep: a.target.keep,
    };
    p.validate()?;
    Ok(p)
}

fn bench_io(a: IoArgs) -> Result<()> {
    let p = io_params(&a)?;
    let (b, _, _) = backend(&a.target, &a.common.conn)?;
    if let Some((part, dir)) = a.procs.child(p.ranks)? {
        return run_child(|sync| io::run_part(&*b, &p, dir, part, Some(sync), false));
    }
    let progress = !a.common.no_progress;
    let r = match a.procs.processes {
        0 => bail!("--processes must be at least 1"),
        1 => io::run(b, &p, progress)?,
        n => {
            let mut procs = Procs::start(n, p.ranks, &io::run_dir(), &[], &format!("io {}", p.mode()), progress)?;
            io::run_with(b, &p, false, Some(&mut procs))?
        }
    };
    if a.common.conn.json {
        return print_json(&r);
    }
    println!(
        "io bench ({}, {}): {} ranks{}, transfer {}, block {}, {} segment(s), {} file(s){}{}",
        r.api,
        r.mode,
        r.ranks,
        if r.processes > 1 { format!(" in {} processes", r.processes) } else { String::new() },
        human(r.transfer_bytes),
        human(r.block_bytes),
        r.segments,
        r.files,
        if r.fsync { ", fsync" } else { "" },
        if r.drop_caches { ", caches dropped" } else { "" }
    );
    let rows: Vec<Vec<String>> = [("write", &r.write), ("read", &r.read)]
        .iter()
        .map(|(n, ph)| {
            vec![
                n.to_string(),
                human(ph.bytes),
                format!("{:.3}", ph.seconds),
                format!("{:.1}", ph.aggregate_mib_s),
                format!("{:.1}", ph.min_rank_mib_s),
                format!("{:.1}", ph.max_rank_mib_s),
            ]
        })
        .collect();
    print_table(&["PHASE", "VOLUME", "SECONDS", "AGGREGATE MiB/s", "MIN RANK MiB/s", "MAX RANK MiB/s"], &rows);
    Ok(())
}

fn bench_combine(a: CombineArgs) -> Result<()> {
    let c = hivefs_bench::combine::combine_files(&a.files)?;
    if a.json {
        return print_json(&c);
    }
    println!("io bench combined: {} run(s)", c.apps.len());
    let rows: Vec<Vec<String>> = c
        .apps
        .iter()
        .map(|x| {
            vec![
                x.file.display().to_string(),
                x.dir.clone().unwrap_or_else(|| x.path.clone()),
                human(x.write.bytes),
                format!("{:.1}", x.write.mib_s),
                format!("{:.1}", x.read.mib_s),
            ]
        })
        .collect();
    print_table(&["FILE", "DIRECTORY", "VOLUME", "WRITE MiB/s", "READ MiB/s"], &rows);
    for (n, ph) in [("write", &c.write), ("read", &c.read)] {
        println!(
            "{n}: {} in {:.3} s, aggregate {:.1} MiB/s (Equation 1), sum of runs {:.1} MiB/s",
            human(ph.bytes),
            ph.seconds,
            ph.aggregate_mib_s,
            ph.sum_of_apps_mib_s
        );
    }
    Ok(())
}

pub(crate) fn md_params(a: &MdArgs) -> Result<md::MdParams> {
    let p = md::MdParams {
        ranks: a.target.ranks,
        files_per_rank: a.files,
        file_bytes: size_u32(&a.file_size, "file size")?,
        shared_dir: a.shared_dir,
        drop_caches: a.drop_caches,
        keep: a.target.keep,
    };
    p.validate()?;
    Ok(p)
}

/// The `hivefs up` directory behind a mount: its secret file sits at `<dir>/secret` beside `fs.toml`.
fn up_dir_of(mnt: &Path) -> Option<PathBuf> {
    let r = crate::services::mount_record(&std::fs::canonicalize(mnt).ok()?).ok()?;
    let dir = r.secret_file?.parent()?.to_path_buf();
    dir.join("fs.toml").exists().then_some(dir)
}

fn bench_md(a: MdArgs) -> Result<()> {
    let p = md_params(&a)?;
    if let Some((part, dir)) = a.procs.child(p.ranks)? {
        let b: Arc<dyn Backend> = match (&a.compare_dir, a.procs.part_in_compare_dir) {
            (Some(d), true) => Arc::new(Posix::new(absolute(d)?, "plain")),
            _ => backend(&a.target, &a.common.conn)?.0,
        };
        return run_child(|sync| md::run_part(&b, &p, dir, part, sync));
    }
    if a.procs.processes == 0 {
        bail!("--processes must be at least 1");
    }
    // Each run's ranks: threads of this process, or children started for it.
    let progress = !a.common.no_progress;
    let md_run = |b: Arc<dyn Backend>, obs: &Observers, compare: bool| -> Result<md::MdRun> {
        let n = a.procs.processes;
        if n == 1 {
            return Ok(md::run(b, &p, obs, progress)?);
        }
        let extra: &[&str] = if compare { &["--part-in-compare-dir"] } else { &[] };
        let mut procs = Procs::start(n, p.ranks, &md::run_dir(), extra, "md", progress)?;
        Ok(md::run_with(b, &p, obs, false, Some(&mut procs))?)
    };
    let (b, conn, mnt) = backend(&a.target, &a.common.conn)?;
    let up = a.up_dir.clone().or_else(|| mnt.as_deref().and_then(up_dir_of));
    let meta = match &conn {
        Some(c) => match MetaCounts::connect(c) {
            Ok(m) => Some(m),
            Err(e) => {
                tracing::warn!("requests per metadata node will not be reported: {e}");
                None
            }
        },
        None => None,
    };
    let obs = Observers { services: up.map(|d| hivefs_bench::cpu::up_service_pids(&d)).unwrap_or_default(), meta };
    if let Some(d) = &a.compare_dir {
        if !d.is_dir() {
            bail!("--compare-dir {} is not a directory", d.display());
        }
    }
    let run = md_run(b, &obs, false)?;
    let compare = match &a.compare_dir {
        Some(d) => Some(md_run(Arc::new(Posix::new(absolute(d)?, "plain")), &Observers::default(), true)?),
        None => None,
    };
    let r = md::report(&p, run, compare);
    if a.common.conn.json {
        return print_json(&r);
    }
    println!(
        "md bench: {} ranks{} x {} files of {}, {}",
        r.ranks,
        if a.procs.processes > 1 { format!(" in {} processes", a.procs.processes) } else { String::new() },
        r.files_per_rank,
        human(u64::from(r.file_bytes)),
        if r.shared_dir { "one shared directory" } else { "a directory per rank" }
    );
    for run in std::iter::once(&r.run).chain(r.compare.as_ref()) {
        println!("{} ({})", run.path, run.api);
        let mut header = vec!["PHASE", "OPS", "SECONDS", "OPS/s", "CPU us/op"];
        let svc: Vec<String> =
            run.phases.first().map(|p| p.service_cpu_us_per_op.keys().cloned().collect()).unwrap_or_default();
        let svc_h: Vec<String> = svc.iter().map(|s| format!("{s} us/op")).collect();
        header.extend(svc_h.iter().map(String::as_str));
        let meta_h = "REQUESTS PER META NODE";
        let with_meta = run.phases.iter().any(|p| !p.meta_requests.is_empty());
        if with_meta {
            header.push(meta_h);
        }
        let rows: Vec<Vec<String>> = run
            .phases
            .iter()
            .map(|ph| {
                let mut row = vec![
                    ph.phase.to_string(),
                    ph.ops.to_string(),
                    format!("{:.3}", ph.seconds),
                    format!("{:.0}", ph.ops_per_s),
                    format!("{:.1}", ph.cpu_us_per_op),
                ];
                row.extend(
                    svc.iter().map(|s| format!("{:.1}", ph.service_cpu_us_per_op.get(s).copied().unwrap_or(0.0))),
                );
                if with_meta {
                    row.push(ph.meta_requests.iter().map(|(n, c)| format!("{n}:{c}")).collect::<Vec<_>>().join(" "));
                }
                row
            })
            .collect();
        print_table(&header, &rows);
    }
    if !r.ratio.is_empty() {
        let s: Vec<String> = r.ratio.iter().map(|(p, x)| format!("{p} {x:.3}x")).collect();
        println!("ratio {} / plain: {}", r.run.api, s.join(", "));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct T {
        #[command(subcommand)]
        cmd: BenchCmd,
    }

    fn parse(args: &[&str]) -> BenchCmd {
        T::try_parse_from(std::iter::once("bench").chain(args.iter().copied())).unwrap().cmd
    }

    #[test]
    fn storage_arguments() {
        let BenchCmd::Storage(a) =
            parse(&["storage", "--volume", "64m", "--block-size", "128k", "--threads", "2", "--targets", "3,5"])
        else {
            panic!()
        };
        let p = storage_params(&a).unwrap();
        assert_eq!(p.bytes_per_target, 64 << 20);
        assert_eq!(p.block_bytes, 128 << 10);
        assert_eq!(p.targets, vec![TargetId(3), TargetId(5)]);
        let BenchCmd::Storage(a) = parse(&["storage", "--volume", "1m", "--block-size", "1m", "--threads", "2"]) else {
            panic!()
        };
        assert!(storage_params(&a).is_err());
        let BenchCmd::Storage(a) = parse(&["storage", "--block-size", "8g"]) else { panic!() };
        assert!(storage_params(&a).is_err());
    }

    #[test]
    fn net_io_and_md_arguments() {
        let BenchCmd::Net(a) = parse(&["net", "--volume", "8m", "--streams", "2", "--json"]) else { panic!() };
        let p = net_params(&a).unwrap();
        assert_eq!((p.bytes_per_node, p.streams, a.common.conn.json), (8 << 20, 2, true));

        let BenchCmd::Io(a) = parse(&[
            "io",
            "/tmp",
            "--ranks",
            "4",
            "--transfer-size",
            "64k",
            "--block-size",
            "1m",
            "--segments",
            "3",
            "--file-per-rank",
        ]) else {
            panic!()
        };
        let p = io_params(&a).unwrap();
        assert_eq!((p.ranks, p.transfer_bytes, p.block_bytes, p.segments), (4, 64 << 10, 1 << 20, 3));
        assert_eq!(p.mode(), "N-N");
        let BenchCmd::Io(a) = parse(&["io", "--transfer-size", "3k", "--block-size", "4k"]) else { panic!() };
        assert!(io_params(&a).is_err());

        let BenchCmd::Md(a) =
            parse(&["md", "--native", "--mgmtd", "h:1", "--files", "10", "--file-size", "32k", "--shared-dir"])
        else {
            panic!()
        };
        let p = md_params(&a).unwrap();
        assert_eq!((p.files_per_rank, p.file_bytes, p.shared_dir), (10, 32 << 10, true));
        assert!(a.target.native && a.target.path.is_none());
        let BenchCmd::Md(a) = parse(&["md", "/x", "--files", "0"]) else { panic!() };
        assert!(md_params(&a).is_err());
    }
}
