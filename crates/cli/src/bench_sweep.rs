//! `hivefs bench sweep|report|tune-chunk`: argument handling around
//! `hivefs_bench::{sweep, report, tune}`.

use crate::admin::{resolve, Conn};
use crate::bench::{mount_of, size_u32, ReportArgs, SweepArgs, TuneArgs};
use crate::util::{absolute, hivefs_mounts, human, parse_size, print_table};
use anyhow::{anyhow, bail, Result};
use hivefs_bench::sweep::{Axes, Control, Place, SweepParams};
use hivefs_bench::{report as rep, sweep as sw, tune};
use hivefs_types::pattern::Chooser;
use std::path::{Path, PathBuf};

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

/// Where a sweep runs: through the mount holding `path`, or the native client.
fn place(path: Option<&Path>, native: bool, c: &Conn) -> Result<Place> {
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
        return Ok(Place { mgmtd: r.mgmtd, secret: r.secret, inside, mount_dir: None });
    }
    let Some(path) = path else { bail!("give the directory to run in (PATH), or --native") };
    if !path.is_dir() {
        bail!("{} is not a directory", path.display());
    }
    let mnt = mount_of(path).ok_or_else(|| anyhow!("{} is not inside a HiveFS mount", path.display()))?;
    let r = resolve(&Conn { mount: Some(mnt.clone()), ..c.clone() })?;
    Ok(Place { mgmtd: r.mgmtd, secret: r.secret, inside: inside_of(&mnt, path)?, mount_dir: Some(absolute(path)?) })
}

pub(crate) fn sweep_params(a: &SweepArgs) -> Result<SweepParams> {
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
            caches: a.cache.clone(),
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
    let p = sweep_params(&a)?;
    let pl = place(a.path.as_deref(), a.native, &a.common.conn)?;
    let s = sw::run(&pl, &p, !a.common.no_progress)?;
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
