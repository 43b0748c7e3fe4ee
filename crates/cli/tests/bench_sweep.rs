//! `hivefs bench sweep|report|tune-chunk` against a real file system started
//! by `hivefs up` (2 storage servers × 2 targets): the JSON lines of a tiny
//! sweep, its block order, the balanced chooser's allocations, the figures
//! and CSV made from them, and a chunk-size tuning run of `dd`. Nothing is
//! asserted about speed.

mod common;

use common::{hivefs_ok, TestFs};
use serde_json::Value;
use std::collections::{BTreeSet, HashSet};

#[test]
fn sweep_report_and_tune_chunk() {
    let fs = TestFs::up(&["--storage", "2", "--targets-per-storage", "2"]);
    let dir = fs.path("sweep");
    std::fs::create_dir(&dir).unwrap();
    let out = fs.tmp.path().join("runs.jsonl");
    let out_s = out.to_str().unwrap();

    // 2 stripe counts × 2 chunk sizes × 3 repetitions = 12 runs: blocks of 10 and 2.
    hivefs_ok(&[
        "bench",
        "sweep",
        dir.to_str().unwrap(),
        "--stripe",
        "2,4",
        "--chunk-size",
        "64k,128k",
        "--repeat",
        "3",
        "--ranks",
        "1",
        "--transfer-size",
        "64k",
        "--block-size",
        "512k",
        "--seed",
        "3",
        "--pause-max-ms",
        "20",
        "--no-progress",
        "--out",
        out_s,
    ]);
    let lines: Vec<Value> =
        std::fs::read_to_string(&out).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 12);
    let mut seen = BTreeSet::new();
    for (k, r) in lines.iter().enumerate() {
        assert_eq!(r["run"], k as u64, "{r}");
        assert_eq!(r["runs"], 12);
        for f in ["chooser", "cache", "transfer_bytes", "ranks", "block_bytes", "api", "hosts", "start_unix_s"] {
            assert!(!r[f].is_null(), "{f} missing in {r}");
        }
        assert_eq!(
            (r["chooser"].as_str(), r["cache"].as_str(), r["api"].as_str()),
            (Some("balanced"), Some("native"), Some("mount"))
        );
        assert_eq!(r["bytes"], 512 << 10);
        assert!(r["write_mib_s"].as_f64().unwrap() > 0.0 && r["read_mib_s"].as_f64().unwrap() > 0.0, "{r}");
        let stripe = r["stripe_count"].as_u64().unwrap();
        let chunk = r["chunk_size"].as_u64().unwrap();
        assert!([2, 4].contains(&stripe) && [64 << 10, 128 << 10].contains(&chunk), "{r}");
        // The balanced chooser spreads the targets evenly over the 2 servers.
        let per = stripe as usize / 2;
        assert_eq!((r["alloc_min"].as_u64(), r["alloc_max"].as_u64()), (Some(per as u64), Some(per as u64)), "{r}");
        assert_eq!(r["allocation"], format!("({per},{per})"));
        let f = &r["files"][0];
        assert_eq!(f["targets"].as_array().unwrap().len(), stripe as usize, "{r}");
        assert_eq!(f["per_server"].as_object().unwrap().len(), 2, "{r}");
        assert!(seen.insert((r["config_index"].as_u64().unwrap(), r["repetition"].as_u64().unwrap())));
    }
    assert_eq!(seen.len(), 12, "every (configuration, repetition) exactly once");
    // Blocks: each is one contiguous stretch of the execution order, holds the
    // runs 10b.. of the configuration-major list, and the blocks are a permutation.
    let blocks: Vec<u64> = lines.iter().map(|r| r["block"].as_u64().unwrap()).collect();
    let mut order: Vec<u64> = blocks.clone();
    order.dedup();
    assert_eq!(order.iter().copied().collect::<HashSet<_>>(), HashSet::from([0, 1]));
    assert_eq!(order.len(), 2, "a block was split: {blocks:?}");
    for r in &lines {
        let global = r["config_index"].as_u64().unwrap() * 3 + r["repetition"].as_u64().unwrap();
        assert_eq!(global / 10, r["block"].as_u64().unwrap(), "{r}");
    }
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "sweep left files in {}", dir.display());

    // Figures and CSV.
    let figs = fs.tmp.path().join("figs");
    hivefs_ok(&["bench", "report", out_s, "--out", figs.to_str().unwrap()]);
    let csv = std::fs::read_to_string(figs.join("runs.csv")).unwrap();
    assert_eq!(csv.lines().count(), 13);
    assert!(csv.starts_with("run,block,config,"));
    for phase in ["write", "read"] {
        for (name, boxes) in [("stripe", 2), ("allocation", 2)] {
            let p = figs.join(format!("bandwidth_by_{name}_{phase}.svg"));
            let svg = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            assert!(svg.contains("<svg") && svg.trim_end().ends_with("</svg>"));
            assert_eq!(svg.matches("<circle class=\"run\"").count(), 12, "{}", p.display());
            assert_eq!(svg.matches("<rect class=\"box\"").count(), boxes, "{}", p.display());
            assert_eq!(svg.matches('<').count(), svg.matches('>').count(), "{}", p.display());
        }
    }
    assert!(std::fs::read_to_string(figs.join("bandwidth_by_allocation_write.svg")).unwrap().contains("(1,1)"));

    // tune-chunk: dd writes 256 KiB; the directory keeps stripe count 2.
    let tdir = fs.path("tune");
    std::fs::create_dir(&tdir).unwrap();
    let t = tdir.to_str().unwrap();
    hivefs_ok(&["pattern", "set", t, "--stripe", "2"]);
    let of = format!("of={t}/f");
    let rep: Value = serde_json::from_str(&hivefs_ok(&[
        "bench",
        "tune-chunk",
        t,
        "--repeat",
        "1",
        "--clean",
        "--json",
        "--no-progress",
        "--",
        "dd",
        "if=/dev/zero",
        &of,
        "bs=64k",
        "count=4",
        "conv=fsync",
        "status=none",
    ]))
    .unwrap();
    let tried: Vec<u64> = rep["trials"].as_array().unwrap().iter().map(|x| x["chunk_size"].as_u64().unwrap()).collect();
    assert!(tried.len() >= 8, "{rep}");
    let best = rep["recommended_chunk_size"].as_u64().unwrap();
    assert!(tried.contains(&best), "{rep}");
    let pat: Value = serde_json::from_str(&hivefs_ok(&["pattern", "get", t, "--json"])).unwrap();
    assert_eq!(pat["chunk_size"].as_u64(), Some(best), "{pat}");
    assert_eq!(pat["stripe_count"], "2", "{pat}");
    assert_eq!(pat["chooser"], "balanced", "{pat}");
}

/// `--cache native,paged` through a native mount: the paged runs go through a mount the
/// sweep makes for them, which is gone afterwards.
#[test]
fn sweep_over_cache_modes_mounts_and_unmounts_the_other_mode() {
    let fs = TestFs::up(&["--storage", "1", "--targets-per-storage", "2"]);
    let dir = fs.path("sweep");
    std::fs::create_dir(&dir).unwrap();
    let out = fs.tmp.path().join("runs.jsonl");
    let o = common::hivefs(&[
        "bench",
        "sweep",
        dir.to_str().unwrap(),
        "--cache",
        "native,paged",
        "--stripe",
        "2",
        "--repeat",
        "2",
        "--ranks",
        "2",
        "--transfer-size",
        "64k",
        "--block-size",
        "256k",
        "--pause-max-ms",
        "0",
        "--no-progress",
        "--out",
        out.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    let paged_mnt = err
        .lines()
        .find_map(|l| l.strip_prefix("sweep: mounted the file system with cache mode paged on "))
        .unwrap_or_else(|| panic!("no paged mount reported: {err}"))
        .to_string();
    let lines: Vec<Value> =
        std::fs::read_to_string(&out).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let caches: Vec<&str> = lines.iter().map(|r| r["cache"].as_str().unwrap()).collect();
    assert_eq!(caches.iter().filter(|c| **c == "native").count(), 2, "{caches:?}");
    assert_eq!(caches.iter().filter(|c| **c == "paged").count(), 2, "{caches:?}");
    for r in &lines {
        assert_eq!(r["api"], "mount", "{r}");
        assert_eq!(r["bytes"], 2 * (256 << 10), "{r}");
        assert!(r["read_mib_s"].as_f64().unwrap() > 0.0, "{r}");
    }
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(&paged_mnt), "{paged_mnt} still mounted");
    assert!(!std::path::Path::new(&paged_mnt).exists(), "{paged_mnt} left behind");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "sweep left files in {}", dir.display());

    // A figure per cache mode, and the native client refuses paged.
    let figs = fs.tmp.path().join("figs");
    hivefs_ok(&["bench", "report", out.to_str().unwrap(), "--out", figs.to_str().unwrap()]);
    // A reader that went away ends a report quietly (no panic about a broken pipe).
    let mut child = std::process::Command::new(common::hivefs_bin())
        .args(["bench", "report", out.to_str().unwrap(), "--out", figs.to_str().unwrap()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("panicked"), "{err}");
    let svg = std::fs::read_to_string(figs.join("bandwidth_by_cache_write.svg")).unwrap();
    assert_eq!(svg.matches("<rect class=\"box\"").count(), 2);
    assert!(svg.contains("paged") && svg.contains("native"));
    let o = common::hivefs(&[
        "bench",
        "sweep",
        "--native",
        "--mount",
        fs.mnt_s(),
        "--cache",
        "paged",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("native client has no kernel cache"));
}

#[test]
fn refuses_other_cache_modes_and_hosts() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().to_str().unwrap();
    let o = common::hivefs(&["bench", "sweep", p, "--cache", "writeback"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("native"), "{}", String::from_utf8_lossy(&o.stderr));
    let o = common::hivefs(&["bench", "sweep", p, "--hosts", "2"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("hivefs-testbed"));
}
