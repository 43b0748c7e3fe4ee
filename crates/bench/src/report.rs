//! `hivefs bench report`: figures and a CSV from a sweep's `runs.jsonl`.
//!
//! For write and read bandwidth: by stripe count (dots coloured by chunk
//! size; the analogue of the seed study's Figure 6) and by `(min,max)`
//! allocation (dots coloured by stripe count; Figures 8 and 10), and by
//! client cache mode when the runs hold more than one. Every run is a dot,
//! every group a box plot. SVGs are converted to PNG when
//! `rsvg-convert` is installed.

use crate::svg::{box_chart, Group};
use crate::sweep::RunRecord;
use crate::{BenchError, Result};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Reads every JSON line of a sweep's output (blank lines are skipped).
pub fn read_runs(path: &Path) -> Result<Vec<RunRecord>> {
    let s = std::fs::read_to_string(path).map_err(|e| BenchError::io(format!("reading {}", path.display()), e))?;
    s.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l)
                .map_err(|e| BenchError::Invalid(format!("{} line {}: not a sweep run: {e}", path.display(), i + 1)))
        })
        .collect()
}

/// Groups runs by `key` (ordered by `order`), each point coloured by its `series`.
fn groups<K: Ord + Clone, S: Ord + Clone>(
    runs: &[RunRecord],
    key: impl Fn(&RunRecord) -> (K, String),
    series: impl Fn(&RunRecord) -> (S, String),
    value: impl Fn(&RunRecord) -> f64,
) -> (Vec<Group>, Vec<String>) {
    let series_names: BTreeMap<S, String> = runs.iter().map(&series).collect();
    let idx: BTreeMap<S, usize> = series_names.keys().cloned().enumerate().map(|(i, s)| (s, i)).collect();
    let mut g: BTreeMap<K, Group> = BTreeMap::new();
    for r in runs {
        let (k, label) = key(r);
        let s = idx[&series(r).0];
        g.entry(k).or_insert_with(|| Group { label, points: Vec::new() }).points.push((value(r), s));
    }
    (g.into_values().collect(), series_names.into_values().collect())
}

fn size_label(b: u64) -> String {
    match b {
        b if b >= 1 << 30 && b.is_multiple_of(1 << 30) => format!("{}G", b >> 30),
        b if b >= 1 << 20 && b.is_multiple_of(1 << 20) => format!("{}M", b >> 20),
        b if b >= 1 << 10 && b.is_multiple_of(1 << 10) => format!("{}K", b >> 10),
        b => format!("{b}"),
    }
}

/// The CSV of all runs, one line per run.
pub fn csv(runs: &[RunRecord]) -> String {
    let mut s = String::from(
        "run,block,config,repetition,stripe_count,chunk_size,chooser,cache,transfer_bytes,ranks,block_bytes,segments,\
         file_per_rank,api,hosts,allocation,alloc_min,alloc_max,targets,write_mib_s,read_mib_s,write_seconds,\
         read_seconds,bytes,start_unix_s\n",
    );
    for r in runs {
        let targets: Vec<String> =
            r.files.first().map(|f| f.targets.iter().map(u32::to_string).collect()).unwrap_or_default();
        let c = &r.config;
        s.push_str(&format!(
            "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},\"{}\",{},{},{},{:.3},{:.3},{:.6},{:.6},{},{:.3}\n",
            r.run,
            r.block,
            r.config_index,
            r.repetition,
            c.stripe_count,
            c.chunk_size,
            c.chooser,
            c.cache,
            c.transfer_bytes,
            c.ranks,
            r.block_bytes,
            r.segments,
            r.file_per_rank,
            r.api,
            r.hosts,
            r.allocation,
            r.alloc_min,
            r.alloc_max,
            targets.join(" "),
            r.write_mib_s,
            r.read_mib_s,
            r.write_seconds,
            r.read_seconds,
            r.bytes,
            r.start_unix_s
        ));
    }
    s
}

/// What `write` produced.
#[derive(Debug, Default)]
pub struct Written {
    pub svgs: Vec<PathBuf>,
    pub pngs: Vec<PathBuf>,
    pub csv: PathBuf,
    /// Why no PNGs were made, when they were not.
    pub png_note: Option<String>,
}

/// The figures (SVG) of `runs`, by file name.
pub fn figures(runs: &[RunRecord]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let several_caches = runs.iter().any(|r| r.config.cache != runs[0].config.cache);
    for (phase, value) in
        [("write", (|r: &RunRecord| r.write_mib_s) as fn(&RunRecord) -> f64), ("read", |r: &RunRecord| r.read_mib_s)]
    {
        let mut chart = |by: &str, what: &str, x_label: &str, (g, s): (Vec<Group>, Vec<String>)| {
            let title = format!("{} bandwidth by {what} ({} runs)", cap(phase), runs.len());
            out.push((
                format!("bandwidth_by_{by}_{phase}.svg"),
                box_chart(&title, x_label, "aggregate bandwidth (MiB/s)", &g, &s),
            ));
        };
        let by_stripe = |r: &RunRecord| (r.config.stripe_count, format!("stripe {}", r.config.stripe_count));
        chart(
            "stripe",
            "stripe count",
            "stripe count",
            groups(
                runs,
                |r| (r.config.stripe_count, r.config.stripe_count.to_string()),
                |r| (r.config.chunk_size, format!("chunk {}", size_label(u64::from(r.config.chunk_size)))),
                value,
            ),
        );
        chart(
            "allocation",
            "(min,max) target allocation",
            "(min,max) stripe targets per storage server",
            groups(runs, |r| ((r.alloc_min, r.alloc_max), r.allocation.clone()), by_stripe, value),
        );
        if several_caches {
            chart(
                "cache",
                "client cache mode",
                "cache mode",
                groups(runs, |r| (r.config.cache.clone(), r.config.cache.clone()), by_stripe, value),
            );
        }
    }
    out
}

fn cap(s: &str) -> String {
    let mut c = s.chars();
    c.next().map(|f| f.to_uppercase().chain(c).collect()).unwrap_or_default()
}

/// Writes the SVGs, the PNGs (when `rsvg-convert` exists) and `runs.csv` into `dir`.
pub fn write(runs: &[RunRecord], dir: &Path) -> Result<Written> {
    if runs.is_empty() {
        return Err(BenchError::Invalid("no runs to report".into()));
    }
    std::fs::create_dir_all(dir).map_err(|e| BenchError::io(format!("creating {}", dir.display()), e))?;
    let mut w = Written { csv: dir.join("runs.csv"), ..Default::default() };
    std::fs::write(&w.csv, csv(runs)).map_err(|e| BenchError::io(format!("writing {}", w.csv.display()), e))?;
    let have_rsvg = std::process::Command::new("rsvg-convert")
        .arg("--version")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !have_rsvg {
        w.png_note = Some("rsvg-convert is not installed (Debian: librsvg2-bin): only SVG figures written".into());
    }
    for (name, svg) in figures(runs) {
        let p = dir.join(&name);
        std::fs::write(&p, svg).map_err(|e| BenchError::io(format!("writing {}", p.display()), e))?;
        if have_rsvg {
            let png = p.with_extension("png");
            let st = std::process::Command::new("rsvg-convert")
                .arg("-o")
                .arg(&png)
                .arg(&p)
                .status()
                .map_err(|e| BenchError::io(format!("running rsvg-convert on {}", p.display()), e))?;
            if !st.success() {
                return Err(BenchError::Invalid(format!("rsvg-convert failed on {} ({st})", p.display())));
            }
            w.pngs.push(png);
        }
        w.svgs.push(p);
    }
    Ok(w)
}
