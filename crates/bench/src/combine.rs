//! `hivefs bench combine`: one aggregate bandwidth from `bench io --json`
//! runs made at the same time on several client hosts ("applications").
//!
//! Per phase, Equation 1 of the seed striping study over the applications:
//! the sum of their volumes over (last end − first start), with each
//! application's start and end taken from its report's `start_unix_s` and
//! `end_unix_s`. The hosts' clocks must agree (on one machine, as in the
//! emulated clusters of `bench/`, they are the same clock).

use crate::{aggregate_mib_per_s, BenchError, Result, Span};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The part of a `bench io --json` phase that combining needs.
#[derive(Clone, Debug, Deserialize)]
struct PhaseIn {
    bytes: u64,
    aggregate_mib_s: f64,
    start_unix_s: Option<f64>,
    end_unix_s: Option<f64>,
}

/// The part of a `bench io --json` report that combining needs.
#[derive(Clone, Debug, Deserialize)]
struct IoIn {
    benchmark: String,
    api: String,
    path: String,
    #[serde(default)]
    dir: Option<String>,
    ranks: u32,
    write: PhaseIn,
    read: PhaseIn,
}

/// One application's share of a phase.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct AppPhase {
    pub bytes: u64,
    pub start_unix_s: f64,
    pub end_unix_s: f64,
    /// The application's own Equation 1 (over its ranks).
    pub mib_s: f64,
}

/// One application: one `bench io --json` report.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct App {
    pub file: PathBuf,
    pub api: String,
    pub path: String,
    /// The run's own directory (when the report names it).
    pub dir: Option<String>,
    pub ranks: u32,
    pub write: AppPhase,
    pub read: AppPhase,
}

/// Equation 1 over all applications, for one phase.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Aggregate {
    pub bytes: u64,
    /// Last end − first start over the applications.
    pub seconds: f64,
    pub aggregate_mib_s: f64,
    /// Sum of the applications' own bandwidths (what stacked bars show).
    pub sum_of_apps_mib_s: f64,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Combined {
    pub benchmark: &'static str,
    pub apps: Vec<App>,
    pub write: Aggregate,
    pub read: Aggregate,
}

fn app_phase(file: &Path, phase: &str, p: &PhaseIn) -> Result<AppPhase> {
    match (p.start_unix_s, p.end_unix_s) {
        (Some(start_unix_s), Some(end_unix_s)) if end_unix_s >= start_unix_s => {
            Ok(AppPhase { bytes: p.bytes, start_unix_s, end_unix_s, mib_s: p.aggregate_mib_s })
        }
        (Some(_), Some(_)) => {
            Err(BenchError::Invalid(format!("{}: the {phase} phase ends before it starts", file.display())))
        }
        _ => Err(BenchError::Invalid(format!(
            "{}: the {phase} phase has no start_unix_s/end_unix_s (made by an older `hivefs bench io --json`?)",
            file.display()
        ))),
    }
}

/// Reads the reports in `text` (one or more JSON objects of `bench io --json`) from `file`.
pub fn parse(file: &Path, text: &str) -> Result<Vec<App>> {
    let mut apps = Vec::new();
    for (i, v) in serde_json::Deserializer::from_str(text).into_iter::<IoIn>().enumerate() {
        let r = v.map_err(|e| {
            BenchError::Invalid(format!("{}: object {} is not a `bench io --json` report: {e}", file.display(), i + 1))
        })?;
        if r.benchmark != "io" {
            return Err(BenchError::Invalid(format!(
                "{}: object {} is a {:?} report, not an io one",
                file.display(),
                i + 1,
                r.benchmark
            )));
        }
        apps.push(App {
            file: file.to_path_buf(),
            write: app_phase(file, "write", &r.write)?,
            read: app_phase(file, "read", &r.read)?,
            api: r.api,
            path: r.path,
            dir: r.dir,
            ranks: r.ranks,
        });
    }
    if apps.is_empty() {
        return Err(BenchError::Invalid(format!("{}: no `bench io --json` report in it", file.display())));
    }
    Ok(apps)
}

fn aggregate(phases: &[&AppPhase]) -> Aggregate {
    let spans: Vec<Span> =
        phases.iter().map(|p| Span { start_s: p.start_unix_s, end_s: p.end_unix_s, bytes: p.bytes }).collect();
    let first = phases.iter().map(|p| p.start_unix_s).fold(f64::INFINITY, f64::min);
    let last = phases.iter().map(|p| p.end_unix_s).fold(f64::NEG_INFINITY, f64::max);
    Aggregate {
        bytes: phases.iter().map(|p| p.bytes).sum(),
        seconds: if last >= first { last - first } else { 0.0 },
        aggregate_mib_s: aggregate_mib_per_s(&spans),
        sum_of_apps_mib_s: phases.iter().map(|p| p.mib_s).sum(),
    }
}

/// Equation 1 over `apps`, per phase.
pub fn combine(apps: Vec<App>) -> Result<Combined> {
    if apps.is_empty() {
        return Err(BenchError::Invalid("no runs to combine".into()));
    }
    let write = aggregate(&apps.iter().map(|a| &a.write).collect::<Vec<_>>());
    let read = aggregate(&apps.iter().map(|a| &a.read).collect::<Vec<_>>());
    Ok(Combined { benchmark: "io-combined", apps, write, read })
}

/// Reads every file and combines all reports in them.
pub fn combine_files(files: &[PathBuf]) -> Result<Combined> {
    let mut apps = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(f).map_err(|e| BenchError::io(format!("reading {}", f.display()), e))?;
        apps.extend(parse(f, &text)?);
    }
    combine(apps)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(bytes: u64, w: (f64, f64), r: (f64, f64)) -> String {
        let ph = |(a, b): (f64, f64)| {
            format!(
                r#"{{"bytes":{bytes},"seconds":{},"aggregate_mib_s":{},"min_rank_mib_s":0,"max_rank_mib_s":0,
                    "start_unix_s":{a},"end_unix_s":{b}}}"#,
                b - a,
                bytes as f64 / (1 << 20) as f64 / (b - a)
            )
        };
        format!(
            r#"{{"benchmark":"io","api":"native","path":"hivefs:/a","mode":"N-1","ranks":2,"write":{},"read":{}}}"#,
            ph(w),
            ph(r)
        )
    }

    #[test]
    fn equation_1_over_hosts() {
        const MIB: u64 = 1 << 20;
        // Two apps of 100 MiB: writes over [1000, 1010] and [1002, 1012]; reads [1020, 1025] and [1021, 1030].
        let a = parse(Path::new("a.json"), &report(100 * MIB, (1000.0, 1010.0), (1020.0, 1025.0))).unwrap();
        let b = parse(Path::new("b.json"), &report(100 * MIB, (1002.0, 1012.0), (1021.0, 1030.0))).unwrap();
        let c = combine([a, b].concat()).unwrap();
        assert_eq!(c.apps.len(), 2);
        assert_eq!((c.write.bytes, c.write.seconds), (200 * MIB, 12.0));
        assert!((c.write.aggregate_mib_s - 200.0 / 12.0).abs() < 1e-9);
        assert!((c.write.sum_of_apps_mib_s - 20.0).abs() < 1e-9);
        assert_eq!(c.read.seconds, 10.0);
        assert!((c.read.aggregate_mib_s - 20.0).abs() < 1e-9);
    }

    #[test]
    fn several_reports_per_file_and_bad_input() {
        let two = format!(
            "{}\n{}",
            report(1 << 20, (1.0e9, 1.0e9 + 1.0), (1.0e9 + 2.0, 1.0e9 + 3.0)),
            report(1 << 20, (1.0e9, 1.0e9 + 2.0), (1.0e9 + 2.0, 1.0e9 + 4.0))
        );
        assert_eq!(parse(Path::new("x"), &two).unwrap().len(), 2);
        let e = parse(Path::new("old.json"), &report(1, (1.0, 2.0), (3.0, 4.0)).replace("start_unix_s", "s0"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("old.json") && e.contains("start_unix_s"), "{e}");
        let e = parse(Path::new("e.json"), "").unwrap_err().to_string();
        assert!(e.contains("e.json"), "{e}");
        let e = parse(Path::new("md.json"), r#"{"benchmark":"md"}"#).unwrap_err().to_string();
        assert!(e.contains("md.json"), "{e}");
        assert!(combine(Vec::new()).is_err());
    }
}
