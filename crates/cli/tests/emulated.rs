//! The emulated clusters of `bench/emulated.sh` (seed 000's scenarios on network
//! namespaces), shortened with `--quick`, through the real script and binaries.
//! Asserts only what is deterministic: the JSON lines and their parameters, the
//! figures, the target layout, the allocations of `balanced` and `roundrobin`, and
//! that the concurrent applications' aggregate is computed from every host. Never
//! any bandwidth. Needs root (network namespaces, tc) and python3.

mod common;

use common::hivefs_bin;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Longest the shortened run may take before the test gives up (it takes about a minute).
const LIMIT: Duration = Duration::from_secs(900);

fn testbed_bin() -> PathBuf {
    let p = Path::new(hivefs_bin()).with_file_name("hivefs-testbed");
    assert!(p.exists(), "{} is missing: build it first (cargo build -p hivefs-testbed)", p.display());
    p
}

/// The running script; dropping it (also when the test fails) kills it and destroys its
/// test bed, which stops every process left in the test bed's namespaces.
struct Script {
    child: Option<Child>,
}

impl Script {
    fn bed_name(&self) -> String {
        format!("emu-{}", self.child.as_ref().map_or(0, Child::id))
    }
}

impl Drop for Script {
    fn drop(&mut self) {
        let name = self.bed_name();
        if let Some(mut c) = self.child.take() {
            if matches!(c.try_wait(), Ok(None)) {
                let _ = c.kill();
            }
            let _ = c.wait();
        }
        // No error if the script removed it already.
        let _ =
            Command::new(testbed_bin()).args(["destroy", &name]).stdout(Stdio::null()).stderr(Stdio::null()).status();
    }
}

fn lines(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{}: {e}: {l}", path.display())))
        .collect()
}

const RUN_KEYS: [&str; 25] = [
    "seed",
    "run",
    "runs",
    "block",
    "config_index",
    "repetition",
    "stripe_count",
    "chunk_size",
    "chooser",
    "cache",
    "transfer_bytes",
    "ranks",
    "block_bytes",
    "segments",
    "file_per_rank",
    "api",
    "hosts",
    "start_unix_s",
    "allocation",
    "alloc_min",
    "alloc_max",
    "files",
    "write_mib_s",
    "read_mib_s",
    "bytes",
];

fn check_runs(what: &str, runs: &[Value]) {
    for r in runs {
        for k in RUN_KEYS {
            assert!(r.get(k).is_some(), "{what}: run without {k}: {r}");
        }
        assert_eq!(r["api"], "native", "{what}: {r}");
        assert!(r["bytes"].as_u64() > Some(0), "{what}: {r}");
    }
}

fn check_figures(dir: &Path) {
    for f in [
        "bandwidth_by_stripe_write.svg",
        "bandwidth_by_stripe_read.svg",
        "bandwidth_by_allocation_write.svg",
        "bandwidth_by_allocation_read.svg",
    ] {
        let p = dir.join(f);
        let s = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        assert!(s.contains("<svg") && s.contains("</svg>"), "{} is not an SVG", p.display());
    }
    assert!(dir.join("runs.csv").is_file(), "{} has no runs.csv", dir.display());
}

fn count(v: &Value, key: &str) -> u64 {
    v[key].as_u64().unwrap_or_else(|| panic!("no {key} in {v}"))
}

#[test]
fn quick_emulated_scenarios() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = tempfile::Builder::new().prefix("hivefs-emulated-").tempdir().unwrap();
    let log = std::fs::File::create(out.path().join("script.log")).unwrap();
    let child = Command::new("bash")
        .arg(repo.join("bench/emulated.sh"))
        .args(["--quick", "--out"])
        .arg(out.path().join("results"))
        .env("HIVEFS", hivefs_bin())
        .env("TESTBED", testbed_bin())
        .current_dir(&repo)
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("run bench/emulated.sh");
    let mut script = Script { child: Some(child) };
    let bed = script.bed_name();
    let start = Instant::now();
    let status = loop {
        if let Some(st) = script.child.as_mut().unwrap().try_wait().unwrap() {
            break st;
        }
        assert!(start.elapsed() < LIMIT, "bench/emulated.sh --quick still runs after {LIMIT:?}");
        std::thread::sleep(Duration::from_millis(200));
    };
    let res = out.path().join("results");
    let log = std::fs::read_to_string(out.path().join("script.log")).unwrap_or_default();
    assert!(status.success(), "bench/emulated.sh --quick failed ({status}):\n{log}");

    // The script removed its test bed.
    let list = Command::new(testbed_bin()).arg("list").output().unwrap();
    assert!(!String::from_utf8_lossy(&list.stdout).contains(&bed), "test bed {bed} left behind");

    // Target ids 1..8 lie on the hosts as the script documents.
    let layout = std::fs::read_to_string(res.join("layout.txt")).unwrap();
    let hosts: Vec<&str> = layout.lines().map(|l| l.rsplit("host ").next().unwrap().trim_end_matches(')')).collect();
    assert_eq!(hosts, ["s1", "s2", "s2", "s2", "s2", "s1", "s1", "s1"], "{layout}");

    // Scenario 1: 3 roundrobin stripe-4 runs, 7 other roundrobin runs, 8 x 2 balanced runs.
    let s1 = lines(&res.join("scenario1.jsonl"));
    check_runs("scenario 1", &s1);
    assert_eq!(s1.len(), 3 + 7 + 16, "scenario 1 runs");
    for r in &s1 {
        let k = count(r, "stripe_count");
        let files = r["files"].as_array().unwrap();
        assert!(!files.is_empty(), "{r}");
        for f in files {
            let (lo, hi) = (count(f, "min"), count(f, "max"));
            assert_eq!(lo + hi, k, "stripe {k} over 2 servers: {r}");
            match (r["chooser"].as_str().unwrap(), k) {
                ("balanced", k) if k % 2 == 0 => assert_eq!((lo, hi), (k / 2, k / 2), "balanced: {r}"),
                ("balanced", k) => assert_eq!((lo, hi), (k / 2, k / 2 + 1), "balanced: {r}"),
                ("roundrobin", 4) => assert_eq!((lo, hi), (1, 3), "roundrobin with 4 targets: {r}"),
                ("roundrobin", _) => {}
                (c, _) => panic!("unexpected chooser {c}: {r}"),
            }
        }
    }
    assert_eq!(s1.iter().filter(|r| r["chooser"] == "roundrobin" && r["stripe_count"] == 4).count(), 3);
    for d in ["scenario1", "scenario1/balanced", "scenario1/roundrobin", "scenario2"] {
        check_figures(&res.join(d));
    }

    // Scenario 2: balanced, stripe counts 1, 2, 4, 8 once each.
    let s2 = lines(&res.join("scenario2.jsonl"));
    check_runs("scenario 2", &s2);
    let mut stripes: Vec<u64> = s2.iter().map(|r| count(r, "stripe_count")).collect();
    stripes.sort();
    assert_eq!(stripes, [1, 2, 4, 8]);

    // Concurrent applications: the aggregate is Equation 1 over every host's run.
    let apps = lines(&res.join("apps.jsonl"));
    assert_eq!(apps.iter().map(|a| count(a, "apps_count")).collect::<Vec<_>>(), [1, 2, 4]);
    for a in &apps {
        let n = count(a, "apps_count") as usize;
        let runs = a["apps"].as_array().unwrap();
        assert_eq!(runs.len(), n, "{a}");
        let mut files: Vec<String> = runs
            .iter()
            .map(|r| Path::new(r["file"].as_str().unwrap()).file_name().unwrap().to_string_lossy().into())
            .collect();
        files.sort();
        let want: Vec<String> = (1..=n).map(|i| format!("c{i}.json")).collect();
        assert_eq!(files, want, "one run per client host: {a}");
        let mut paths: Vec<&str> = runs.iter().map(|r| r["dir"].as_str().unwrap()).collect();
        paths.sort();
        paths.dedup();
        assert_eq!(paths.len(), n, "every application in its own directory: {a}");
        for ph in ["write", "read"] {
            let bytes: u64 = runs.iter().map(|r| count(&r[ph], "bytes")).sum();
            assert_eq!(count(&a[ph], "bytes"), bytes, "{ph} volume of all hosts: {a}");
            let first = runs.iter().map(|r| r[ph]["start_unix_s"].as_f64().unwrap()).fold(f64::INFINITY, f64::min);
            let last = runs.iter().map(|r| r[ph]["end_unix_s"].as_f64().unwrap()).fold(0.0, f64::max);
            let eq1 = bytes as f64 / (1u64 << 20) as f64 / (last - first);
            let got = a[ph]["aggregate_mib_s"].as_f64().unwrap();
            assert!((got - eq1).abs() <= 1e-6 * eq1, "{ph}: aggregate {got} is not Equation 1 ({eq1}): {a}");
        }
    }
    assert!(res.join("summary.txt").is_file());
    drop(script);
}
