//! `hivefs bench sweep|report|tune-chunk`: argument handling around
//! `hivefs_bench::{sweep, report, tune}`.

use crate::admin::{resolve, Conn};
use crate::bench_args::{ReportArgs, SweepArgs, TuneArgs};
use crate::services::{mount_record, MountRecord};
use crate::up::log_tail;
use crate::util::{absolute, hivefs_mounts, human, is_mounted, parse_size, print_table};
use crate::util::{mount_of, size_u32};
use anyhow::{anyhow, bail, Context, Result};
use hivefs_bench::sweep::{Axes, Control, Place, SweepParams};
use hivefs_bench::{report as rep, sweep as sw, tune};
use hivefs_types::pattern::Chooser;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The path of `path` from the root of the HiveFS mount `mnt`.
fn inside_of(mnt: &Path, path: &Path) -> Result<String> {
    let canon = std::fs::canonicalize(path).map_err(|e| anyhow!("{}: {e}", path.display()))?;
    let m = std::fs::canonicalize(mnt).map_err(|e| anyhow!("{}: {e}", mnt.display()))?;
    Ok(canon
        .strip_prefix(&m)
        .map_err(|_| anyhow!("{} is not inside {}", path.display(), mnt.display()))?
        .to_string_lossy()
        .into_owned())
}

/// Where a sweep runs: through the mount holding `path` (with its record), or the native
/// client. The place's only mount directory is `path`'s, under the mount's own cache mode.
fn place(path: Option<&Path>, native: bool, c: &Conn) -> Result<(Place, Option<MountRecord>)> {
    if native {
        let r = resolve(c)?;
        let mnt = c.mount.clone().or_else(|| if c.mgmtd.is_none() { hivefs_mounts().pop().map(|m| m.0) } else { None });
        let inside = match (path, &mnt) {
            (None, _) => String::new(),
            (Some(p), Some(m)) if absolute(p)?.starts_with(std::fs::canonicalize(m).unwrap_or_default()) => {
                inside_of(m, p)?
            }
            (Some(p), _) => p.to_string_lossy().trim_matches('/').to_string(),
        };
        return Ok((Place { mgmtd: r.mgmtd, secret: r.secret, inside, mount_dirs: BTreeMap::new() }, None));
    }
    let Some(path) = path else { bail!("give the directory to run in (PATH), or --native") };
    if !path.is_dir() {
        bail!("{} is not a directory", path.display());
    }
    let mnt = mount_of(path).ok_or_else(|| anyhow!("{} is not inside a HiveFS mount", path.display()))?;
    let rec = mount_record(&std::fs::canonicalize(&mnt)?)?;
    let r = resolve(&Conn { mount: Some(mnt.clone()), ..c.clone() })?;
    let place = Place {
        mgmtd: r.mgmtd,
        secret: r.secret,
        inside: inside_of(&mnt, path)?,
        mount_dirs: [(rec.cache_mode.clone(), absolute(path)?)].into(),
    };
    Ok((place, Some(rec)))
}

/// The mounts a sweep made for cache modes other than its mount's own: private
/// mounts under the temporary directory, unmounted and removed when dropped
/// (also after a failed run).
#[derive(Default)]
struct SweepMounts {
    /// (mount point, mount process, directory holding both the mount point and the log)
    mounts: Vec<(PathBuf, Child, PathBuf)>,
}

impl SweepMounts {
    /// Mounts the file system of `rec` with cache mode `cache`; returns the mount point.
    fn add(&mut self, rec: &MountRecord, cache: &str) -> Result<PathBuf> {
        let base = std::env::temp_dir().join(format!("hivefs-sweep-{}-{cache}", std::process::id()));
        let mnt = base.join("mnt");
        std::fs::create_dir_all(&mnt).with_context(|| format!("creating {}", mnt.display()))?;
        let log_path = base.join("mount.log");
        let log = std::fs::File::create(&log_path).with_context(|| format!("creating {}", log_path.display()))?;
        let mut cmd = Command::new(std::env::current_exe().context("cannot find the hivefs executable")?);
        cmd.args(["mount", "--private", "--cache-mode", cache, "--mgmtd", &rec.mgmtd]);
        if let Some(s) = &rec.secret_file {
            cmd.arg("--secret-file").arg(s);
        }
        let child = cmd
            .arg(&mnt)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("cannot start hivefs mount")?;
        self.mounts.push((mnt.clone(), child, base));
        let child = &mut self.mounts.last_mut().expect("just pushed").1;
        let what = format!("the cache mode {cache} mount on {}", mnt.display());
        crate::up::wait_until(&what, MOUNT_TIMEOUT, || {
            if let Some(st) = child.try_wait()? {
                bail!("mounting {} with cache mode {cache} failed ({st}):\n{}", mnt.display(), log_tail(&log_path));
            }
            Ok(is_mounted(&mnt))
        })?;
        eprintln!("sweep: mounted the file system with cache mode {cache} on {}", mnt.display());
        Ok(mnt)
    }
}

const MOUNT_TIMEOUT: Duration = Duration::from_secs(30);

impl Drop for SweepMounts {
    fn drop(&mut self) {
        for (mnt, mut child, base) in self.mounts.drain(..) {
            if is_mounted(&mnt) && !crate::up::unmount(&mnt, false).unwrap_or(false) {
                eprintln!("sweep: {} is busy; detaching it lazily", mnt.display());
                let _ = crate::up::unmount(&mnt, true);
            }
            let start = Instant::now();
            while matches!(child.try_wait(), Ok(None)) && start.elapsed() < MOUNT_TIMEOUT {
                std::thread::sleep(Duration::from_millis(50));
            }
            if matches!(child.try_wait(), Ok(None)) {
                eprintln!("sweep: the mount process of {} did not stop; killing it", mnt.display());
                let _ = child.kill();
                let _ = child.wait();
            }
            if let Err(e) = std::fs::remove_dir_all(&base) {
                eprintln!("sweep: cannot remove {}: {e}", base.display());
            }
        }
    }
}

pub(crate) fn sweep_params(a: &SweepArgs, caches: Vec<String>) -> Result<SweepParams> {
    if a.hosts != 1 {
        bail!(
            "--hosts {}: `bench sweep` runs on one client host; multi-host sweeps use the hivefs-testbed scripts",
            a.hosts
        );
    }
    let chunk_sizes = a.chunk_size.iter().map(|s| size_u32(s, "chunk size")).collect::<Result<Vec<_>>>()?;
    let choosers = a
        .chooser
        .iter()
        .map(|s| {
            Chooser::parse(s).ok_or_else(|| {
                anyhow!("unknown chooser {s:?}: use random, roundrobin, randomized-roundrobin or balanced")
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let p = SweepParams {
        axes: Axes {
            stripe_counts: a.stripe.clone(),
            chunk_sizes,
            choosers,
            caches,
            transfer_bytes: a.transfer_size.iter().map(|s| parse_size(s)).collect::<Result<Vec<_>>>()?,
            ranks: a.ranks.clone(),
        },
        repeat: a.repeat,
        seed: a.seed,
        pause_min_ms: a.pause_min_ms,
        pause_max_ms: a.pause_max_ms,
        block_bytes: parse_size(&a.block_size)?,
        segments: a.segments,
        file_per_rank: a.file_per_rank,
        fsync: a.fsync,
        drop_caches: a.drop_caches,
        out: a.out.clone(),
    };
    p.validate()?;
    Ok(p)
}

pub fn sweep(a: SweepArgs) -> Result<()> {
    let mut caches: Vec<String> = Vec::new();
    for c in &a.cache {
        if !caches.contains(c) {
            caches.push(c.clone());
        }
    }
    // The arguments first: a bad value is reported before anything is contacted or mounted.
    sweep_params(&a, if caches.is_empty() { vec!["native".into()] } else { caches.clone() })?;
    let (mut pl, rec) = place(a.path.as_deref(), a.native, &a.common.conn)?;
    if caches.is_empty() {
        caches.push(rec.as_ref().map_or("native".to_string(), |r| r.cache_mode.clone()));
    }
    let p = sweep_params(&a, caches)?;
    let mut mounts = SweepMounts::default();
    if let Some(rec) = &rec {
        for c in &p.axes.caches {
            if !pl.mount_dirs.contains_key(c) {
                let m = mounts.add(rec, c)?;
                pl.mount_dirs.insert(c.clone(), m.join(&pl.inside));
            }
        }
    }
    let s = sw::run(&pl, &p, !a.common.no_progress)?;
    drop(mounts);
    if a.common.conn.json {
        println!("{}", serde_json::json!({ "runs": s.runs, "out": s.out }));
    } else {
        println!("sweep: {} runs appended to {}", s.runs, s.out.display());
    }
    Ok(())
}

pub fn report(a: ReportArgs) -> Result<()> {
    let runs = rep::read_runs(&a.runs)?;
    let w = rep::write(&runs, &a.out)?;
    if let Some(n) = &w.png_note {
        eprintln!("{n}");
    }
    println!("{} runs: {}", runs.len(), w.csv.display());
    for p in w.svgs.iter().chain(&w.pngs) {
        println!("{}", p.display());
    }
    Ok(())
}

pub fn tune_chunk(a: TuneArgs) -> Result<()> {
    if !a.dir.is_dir() {
        bail!("{} is not a directory", a.dir.display());
    }
    let mnt = mount_of(&a.dir).ok_or_else(|| anyhow!("{} is not inside a HiveFS mount", a.dir.display()))?;
    let r = resolve(&Conn { mount: Some(mnt.clone()), mgmtd: None, secret_file: None, json: false })?;
    let ctl = Control::connect(&r.mgmtd, r.secret)?;
    let p = tune::TuneParams {
        dir: a.dir.clone(),
        inside: inside_of(&mnt, &a.dir)?,
        command: a.command.clone(),
        repeat: a.repeat,
        clean: a.clean,
    };
    let t = tune::run(&ctl, &p, !a.no_progress)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&t)?);
        return Ok(());
    }
    let rows: Vec<Vec<String>> = t
        .trials
        .iter()
        .map(|x| {
            vec![
                human(u64::from(x.chunk_size)),
                format!("{:.3}", x.median_wall_s),
                format!("{:.3}", x.spread_s),
                format!("{:.3}", x.median_user_s),
                format!("{:.3}", x.median_sys_s),
                x.wall_s.iter().map(|w| format!("{w:.3}")).collect::<Vec<_>>().join(" "),
            ]
        })
        .collect();
    print_table(&["CHUNK", "MEDIAN WALL s", "SPREAD s", "USER s", "SYS s", "RUNS (wall s)"], &rows);
    println!(
        "recommended chunk size: {} (median {:.3} s, spread {:.3} s over {} runs); {} now uses it",
        human(u64::from(t.recommended_chunk_size)),
        t.recommended_median_wall_s,
        t.recommended_spread_s,
        t.repeat,
        PathBuf::from(&t.dir).display()
    );
    Ok(())
}
