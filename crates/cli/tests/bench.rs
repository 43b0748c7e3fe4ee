//! `hivefs bench storage|net|io|md` against real file systems started by
//! `hivefs up`: the JSON is one well-formed object with the right counts and
//! positive figures (never checked against any speed), and nothing is left
//! behind — no scratch files on the targets, no files in the mount.

mod common;

use common::{hivefs, json, TestFs};
use serde_json::Value;

fn positive(v: &Value, key: &str) -> f64 {
    let x = v[key].as_f64().unwrap_or_else(|| panic!("{key} missing in {v}"));
    assert!(x > 0.0, "{key} is not positive in {v}");
    x
}

/// No target of the file system holds a `bench/` scratch directory.
fn no_scratch_left(fs: &TestFs) {
    let dirs = fs.target_dirs();
    assert!(!dirs.is_empty());
    for (t, d) in dirs {
        assert!(!d.join("bench").exists(), "target {t}: {} left behind", d.join("bench").display());
        assert!(d.join("chunks").is_dir(), "target {t}: chunks/ is gone");
    }
}

#[test]
fn storage_and_net_bench() {
    let fs = TestFs::up(&["--storage", "2", "--targets-per-storage", "2"]);
    let m = fs.mnt_s();

    let r =
        json(&["bench", "storage", "--mount", m, "--json", "--volume", "4m", "--block-size", "256k", "--threads", "2"]);
    assert_eq!(r["benchmark"], "storage");
    let targets = r["targets"].as_array().unwrap();
    assert_eq!(targets.len(), 4, "{r}");
    let mut ids: Vec<u64> = targets.iter().map(|t| t["target"].as_u64().unwrap()).collect();
    ids.sort();
    assert_eq!(ids, vec![1, 2, 3, 4]);
    for t in targets {
        assert_eq!(t["bytes"], 4 << 20, "{t}");
        positive(t, "write_mib_s");
        positive(t, "read_mib_s");
    }
    assert_eq!(r["total_bytes"], 16 << 20);
    positive(&r, "total_write_mib_s");
    positive(&r, "total_read_mib_s");
    no_scratch_left(&fs);

    // Selected targets only, through mgmtd directly.
    let r = json(&[
        "bench",
        "storage",
        "--mgmtd",
        &fs.mgmtd_addr(),
        "--secret-file",
        fs.secret().to_str().unwrap(),
        "--json",
        "--volume",
        "1m",
        "--targets",
        "2,3",
    ]);
    let ids: Vec<u64> = r["targets"].as_array().unwrap().iter().map(|t| t["target"].as_u64().unwrap()).collect();
    assert_eq!(ids, vec![2, 3]);
    no_scratch_left(&fs);

    // More than the targets' disks hold: refused, naming the target, nothing written.
    let o = hivefs(&["bench", "storage", "--mount", m, "--volume", "1000t", "--targets", "1"]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("target 1") && err.contains("free"), "{err}");
    no_scratch_left(&fs);

    // An unknown target is named.
    let o = hivefs(&["bench", "storage", "--mount", m, "--volume", "1m", "--targets", "99"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("storage target 99"));

    let r = json(&["bench", "net", "--mount", m, "--json", "--volume", "4m", "--block-size", "512k", "--streams", "2"]);
    assert_eq!(r["benchmark"], "net");
    let nodes = r["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 2, "{r}");
    for n in nodes {
        assert_eq!(n["bytes"], 4 << 20);
        assert_eq!(n["requests"], 16, "8 writes and 8 reads of 512 KiB: {n}");
        positive(n, "write_mib_s");
        positive(n, "read_mib_s");
    }
    assert_eq!(r["total_bytes"], 8 << 20);
    positive(&r, "total_write_mib_s");
    positive(&r, "total_read_mib_s");
    // NetBench touches no disk.
    no_scratch_left(&fs);
    for d in fs.target_dirs().values() {
        // (The 256 sub-directories exist from the start; no chunk file in them.)
        let files: usize = std::fs::read_dir(d.join("chunks"))
            .unwrap()
            .map(|sub| std::fs::read_dir(sub.unwrap().path()).unwrap().count())
            .sum();
        assert_eq!(files, 0, "{}", d.display());
    }
}

fn check_io(r: &Value, api: &str, mode: &str, ranks: u64, files: u64, per_rank: u64) {
    assert_eq!(r["benchmark"], "io");
    assert_eq!(r["api"], api, "{r}");
    assert_eq!(r["mode"], mode);
    assert_eq!(r["files"], files);
    let pr = r["per_rank"].as_array().unwrap();
    assert_eq!(pr.len() as u64, ranks);
    for x in pr {
        assert_eq!(x["write_bytes"], per_rank, "{x}");
        assert_eq!(x["read_bytes"], per_rank, "{x}");
        positive(x, "write_mib_s");
        positive(x, "read_mib_s");
    }
    for ph in ["write", "read"] {
        assert_eq!(r[ph]["bytes"], ranks * per_rank);
        positive(&r[ph], "aggregate_mib_s");
        positive(&r[ph], "seconds");
    }
}

#[test]
fn io_and_md_bench_through_the_mount_and_the_native_client() {
    let fs = TestFs::up(&["--meta", "2", "--storage", "2", "--targets-per-storage", "2"]);
    let m = fs.mnt_s();
    let work = fs.path("work");
    std::fs::create_dir(&work).unwrap();
    let w = work.to_str().unwrap();

    // N-1 through the mount, interleaved segments, fsync.
    let r = json(&[
        "bench",
        "io",
        w,
        "--json",
        "--ranks",
        "3",
        "--transfer-size",
        "128k",
        "--block-size",
        "512k",
        "--segments",
        "2",
        "--fsync",
    ]);
    check_io(&r, "mount", "N-1", 3, 1, 1 << 20);
    // N-N through the native client, reading the neighbour's data.
    let r = json(&[
        "bench",
        "io",
        "--native",
        "--mount",
        m,
        w,
        "--json",
        "--ranks",
        "2",
        "--transfer-size",
        "256k",
        "--block-size",
        "1m",
        "--file-per-rank",
        "--reorder",
    ]);
    check_io(&r, "native", "N-N", 2, 2, 1 << 20);
    // Ranks as processes: 5 ranks over 2 processes (3 + 2 threads), through the mount and
    // through the native client; each rank reads its neighbour's data, across processes.
    for native in [false, true] {
        let mut args = vec!["bench", "io", w, "--json", "--ranks", "5", "--processes", "2", "--reorder"];
        args.extend(["--transfer-size", "64k", "--block-size", "256k", "--drop-caches"]);
        if native {
            // Over TCP, though the storage services are on this machine (the child
            // processes get the flag too).
            args.extend(["--native", "--mount", m, "--no-short-circuit"]);
        }
        let r = json(&args);
        check_io(&r, if native { "native" } else { "mount" }, "N-1", 5, 1, 256 << 10);
        assert_eq!(r["processes"], 2);
        let pids: Vec<u64> = r["per_rank"].as_array().unwrap().iter().map(|x| x["pid"].as_u64().unwrap()).collect();
        assert!(pids[0] == pids[2] && pids[3] == pids[4] && pids[0] != pids[3], "ranks per process: {pids:?}");
        assert!(!pids.contains(&u64::from(std::process::id())));
    }
    let o = common::hivefs(&["bench", "io", w, "--no-short-circuit"]);
    assert!(!o.status.success(), "--no-short-circuit is for the native client");
    let o = common::hivefs(&["bench", "io", w, "--ranks", "2", "--processes", "3"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("every process runs at least one rank"));
    assert_eq!(std::fs::read_dir(&work).unwrap().count(), 0, "io bench left files in {w}");

    // mdtest-like through the mount, compared with a plain directory.
    let plain = tempfile::tempdir().unwrap();
    let r = json(&[
        "bench",
        "md",
        w,
        "--json",
        "--ranks",
        "2",
        "--files",
        "20",
        "--file-size",
        "4k",
        "--compare-dir",
        plain.path().to_str().unwrap(),
        "--up-dir",
        fs.dir_s(),
    ]);
    assert_eq!(r["benchmark"], "md");
    for run in [&r["run"], &r["compare"]] {
        let phases = run["phases"].as_array().unwrap();
        let names: Vec<&str> = phases.iter().map(|p| p["phase"].as_str().unwrap()).collect();
        assert_eq!(names, ["create", "stat", "read", "remove"]);
        for p in phases {
            assert_eq!(p["ops"], 40, "{p}");
            positive(p, "ops_per_s");
            assert!(p["cpu_us_per_op"].as_f64().unwrap() >= 0.0);
        }
    }
    assert_eq!(r["run"]["api"], "mount");
    assert_eq!(r["compare"]["api"], "plain");
    assert_eq!(r["ratio"].as_object().unwrap().len(), 4);
    let create = &r["run"]["phases"][0];
    // Both metadata nodes are counted; the creates reached at least one of them.
    let meta = create["meta_requests"].as_object().unwrap();
    assert_eq!(meta.len(), 2, "{create}");
    // Made ahead in the ranks' directories: batches, at least one request.
    assert!(meta.values().map(|v| v.as_u64().unwrap()).sum::<u64>() >= 1, "{create}");
    let svc = create["service_cpu_us_per_op"].as_object().unwrap();
    for s in ["mgmtd", "meta1", "meta2", "storage1", "storage2", "mount"] {
        assert!(svc.contains_key(s), "{s} missing in {create}");
    }

    // With the kernel's caches dropped, every stat looks its file up on a metadata node.
    let r = json(&["bench", "md", w, "--json", "--ranks", "2", "--files", "20", "--drop-caches"]);
    let stat = &r["run"]["phases"][1];
    assert_eq!(stat["phase"], "stat");
    let asked: u64 = stat["meta_requests"].as_object().unwrap().values().map(|v| v.as_u64().unwrap()).sum();
    assert!(asked >= 40, "{asked} metadata requests for 40 stats after the drop: {stat}");
    assert_eq!(r["drop_caches"], true);

    // Shared directory, through the native client, files of 32 KiB.
    let r = json(&[
        "bench",
        "md",
        "--native",
        "--mgmtd",
        &fs.mgmtd_addr(),
        "--secret-file",
        fs.secret().to_str().unwrap(),
        "/work",
        "--json",
        "--ranks",
        "3",
        "--files",
        "5",
        "--file-size",
        "32k",
        "--shared-dir",
    ]);
    assert_eq!(r["run"]["api"], "native");
    assert_eq!(r["shared_dir"], true);
    assert!(r["compare"].is_null());
    for p in r["run"]["phases"].as_array().unwrap() {
        assert_eq!(p["ops"], 15, "{p}");
        positive(p, "ops_per_s");
        let total: u64 = p["meta_requests"].as_object().unwrap().values().map(|v| v.as_u64().unwrap()).sum();
        // Creates made ahead go to the node in batches: fewer requests than files.
        let least = if p["phase"] == "create" { 1 } else { 15 };
        assert!(total >= least, "{p}");
    }
    assert_eq!(std::fs::read_dir(&work).unwrap().count(), 0, "md bench left files in {w}");
    assert_eq!(std::fs::read_dir(plain.path()).unwrap().count(), 0);

    // Ranks as processes: 3 ranks in 2 processes, through the mount and on the plain
    // directory; the requests the metadata nodes answered are counted for all of them.
    let o = hivefs(&[
        "bench",
        "md",
        w,
        "--json",
        "--ranks",
        "3",
        "--processes",
        "2",
        "--files",
        "10",
        "--file-size",
        "4k",
        "--compare-dir",
        plain.path().to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert_eq!(err.matches("md create: 2 processes").count(), 2, "{err}");
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    for run in [&r["run"], &r["compare"]] {
        for p in run["phases"].as_array().unwrap() {
            assert_eq!(p["ops"], 30, "{p}");
            positive(p, "ops_per_s");
        }
    }
    for p in r["run"]["phases"].as_array().unwrap() {
        let total: u64 = p["meta_requests"].as_object().unwrap().values().map(|v| v.as_u64().unwrap()).sum();
        // Stats of files the mount just wrote are answered with the
        // attributes their size reports left (while leased); the rest ask.
        // Creates made ahead go in batches: at least one request.
        match p["phase"].as_str().unwrap() {
            "stat" => assert!(total < 30, "{p}"),
            "create" => assert!(total >= 1, "{p}"),
            _ => assert!(total >= 30, "{p}"),
        }
    }
    assert_eq!(std::fs::read_dir(&work).unwrap().count(), 0, "md bench left files in {w}");
    assert_eq!(std::fs::read_dir(plain.path()).unwrap().count(), 0);

    // A bad parameter is refused before anything runs.
    let o = hivefs(&["bench", "io", w, "--transfer-size", "3k", "--block-size", "4k"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("multiple of the transfer size"));
}

/// SIGINT (as a terminal's Ctrl-C sends it to the whole process group) stops `bench io`
/// and `bench md`, with ranks as threads or as processes, and they remove their files.
#[test]
fn interrupted_benchmarks_remove_their_files() {
    use std::os::unix::process::CommandExt;
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().to_str().unwrap();
    let runs: [&[&str]; 3] = [
        &["bench", "io", dir, "--ranks", "2", "--block-size", "64g", "--transfer-size", "1m"],
        &["bench", "io", dir, "--ranks", "2", "--processes", "2", "--block-size", "64g", "--transfer-size", "1m"],
        &["bench", "md", dir, "--ranks", "2", "--processes", "2", "--files", "100000000"],
    ];
    for args in runs {
        let child = std::process::Command::new(common::hivefs_bin())
            .args(args)
            .arg("--no-progress")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .process_group(0)
            .spawn()
            .unwrap();
        // Wait until the run is under way (its directory exists and holds files).
        let start = std::time::Instant::now();
        let busy = || {
            std::fs::read_dir(d.path())
                .unwrap()
                .flatten()
                .any(|e| std::fs::read_dir(e.path()).map(|mut r| r.next().is_some()).unwrap_or(false))
        };
        while !busy() {
            assert!(start.elapsed() < std::time::Duration::from_secs(30), "{args:?} did not start");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        std::thread::sleep(std::time::Duration::from_millis(300));
        // The process group of the child started above.
        let group = rustix::process::Pid::from_child(&child);
        rustix::process::kill_process_group(group, rustix::process::Signal::INT).unwrap();
        let o = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(130), "{args:?}: {err}");
        assert!(err.contains("interrupted"), "{args:?}: {err}");
        let left: Vec<_> = std::fs::read_dir(d.path()).unwrap().flatten().map(|e| e.path()).collect();
        assert!(left.is_empty(), "{args:?} left {left:?}");
    }
}
