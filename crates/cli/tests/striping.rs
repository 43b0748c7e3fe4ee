//! Striping control through the mount: patterns and their inheritance,
//! choosers, storage pools, capacity pools, and refusals of bad settings.

mod common;
use common::*;
use std::time::{Duration, Instant};

#[test]
fn patterns_round_trip_inherit_and_clamp() {
    let fs = TestFs::up(&["--storage", "2", "--targets-per-storage", "2"]);
    let d = fs.path("d");
    std::fs::create_dir(&d).unwrap();
    let ds = d.to_str().unwrap();
    hivefs_ok(&["pattern", "set", ds, "--chunk-size", "1m", "--stripe", "3", "--chooser", "roundrobin"]);
    let p = json(&["pattern", "get", "--json", ds]);
    assert_eq!(p["chunk_size"], 1 << 20);
    assert_eq!(p["stripe_count"], "3");
    assert_eq!(p["chooser"], "roundrobin");
    // Inherited by a new subdirectory, applied to files in both.
    std::fs::create_dir(d.join("sub")).unwrap();
    assert_eq!(json(&["pattern", "get", "--json", d.join("sub").to_str().unwrap()]), p);
    std::fs::write(d.join("sub/f"), b"x").unwrap();
    let info = fs.entry_info("d/sub/f");
    assert_eq!(info["chunk_size"], 1 << 20);
    assert_eq!(info["stripe_count"], 3);
    // A subdirectory made before a change keeps its own settings.
    hivefs_ok(&["pattern", "set", ds, "--stripe", "all"]);
    assert_eq!(json(&["pattern", "get", "--json", d.join("sub").to_str().unwrap()])["stripe_count"], "3");
    // Stripe count above the pool's size is clamped; entry info shows what was used.
    hivefs_ok(&["pattern", "set", ds, "--stripe", "100", "--chooser", "balanced"]);
    std::fs::write(d.join("wide"), b"y").unwrap();
    let info = fs.entry_info("d/wide");
    assert_eq!(info["stripe_count"], 4);
    let mut t = targets_of(&info);
    t.sort();
    t.dedup();
    assert_eq!(t.len(), 4, "distinct targets");
}

#[test]
fn balanced_gives_even_allocations_and_roundrobin_rotates() {
    let fs = TestFs::up(&["--storage", "2", "--targets-per-storage", "4"]);
    for (dir, chooser) in [("bal", "balanced"), ("rr", "roundrobin")] {
        let d = fs.path(dir);
        std::fs::create_dir(&d).unwrap();
        hivefs_ok(&["pattern", "set", d.to_str().unwrap(), "--stripe", "4", "--chooser", chooser]);
        for i in 0..12 {
            std::fs::write(d.join(format!("f{i}")), b"z").unwrap();
        }
    }
    let paths: Vec<String> = (0..12).map(|i| fs.path(&format!("bal/f{i}")).to_str().unwrap().to_string()).collect();
    let mut args = vec!["entry", "info", "--json"];
    args.extend(paths.iter().map(String::as_str));
    for info in json(&args).as_array().unwrap() {
        assert_eq!(
            (info["allocation"]["min"].as_u64(), info["allocation"]["max"].as_u64()),
            (Some(2), Some(2)),
            "{info}"
        );
    }
    // Round-robin: each file starts where the previous one ended, over the sorted target ids.
    let paths: Vec<String> = (0..12).map(|i| fs.path(&format!("rr/f{i}")).to_str().unwrap().to_string()).collect();
    let mut args = vec!["entry", "info", "--json"];
    args.extend(paths.iter().map(String::as_str));
    let infos = json(&args);
    let seqs: Vec<Vec<u64>> = infos.as_array().unwrap().iter().map(targets_of).collect();
    for w in seqs.windows(2) {
        let last = *w[0].last().unwrap();
        let next = if last == 8 { 1 } else { last + 1 };
        assert_eq!(w[1][0], next, "rotation continues: {seqs:?}");
        for k in 1..4 {
            assert_eq!(w[1][k], if w[1][k - 1] == 8 { 1 } else { w[1][k - 1] + 1 }, "{seqs:?}");
        }
    }
}

#[test]
fn storage_pools_decide_where_new_files_go() {
    let fs = TestFs::up(&["--storage", "2", "--targets-per-storage", "2"]);
    let m = fs.mnt_s();
    std::fs::create_dir(fs.path("fast")).unwrap();
    hivefs_ok(&["pattern", "set", fs.path("fast").to_str().unwrap(), "--stripe", "all"]);
    std::fs::write(fs.path("fast/old"), random_bytes(5, 3 << 20)).unwrap();
    let old = fs.entry_info("fast/old");
    assert_eq!(targets_of(&old).len(), 4);

    let created = json(&["pool", "create", "--json", "--mount", m, "fast"]);
    let pool = created["id"].as_u64().unwrap();
    assert_eq!(pool, 2);
    hivefs_ok(&["pool", "add-target", "--mount", m, "fast", "1", "3"]);
    let pools = json(&["pool", "list", "--json", "--mount", m]);
    assert_eq!(pools[1]["targets"], serde_json::json!([1, 3]));
    assert_eq!(pools[0]["targets"], serde_json::json!([2, 4]));
    hivefs_ok(&["pattern", "set", fs.path("fast").to_str().unwrap(), "--pool", &pool.to_string()]);
    // Unknown pools are refused and nothing changes.
    let before = json(&["pattern", "get", "--json", fs.path("fast").to_str().unwrap()]);
    let o = hivefs(&["pattern", "set", fs.path("fast").to_str().unwrap(), "--pool", "9"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("does not exist"), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(json(&["pattern", "get", "--json", fs.path("fast").to_str().unwrap()]), before);

    for i in 0..6 {
        std::fs::write(fs.path(&format!("fast/new{i}")), b"n").unwrap();
        let mut t = targets_of(&fs.entry_info(&format!("fast/new{i}")));
        t.sort();
        assert_eq!(t, vec![1, 3], "new files use only the pool's targets");
    }
    // The old file keeps its four targets and stays readable.
    assert_eq!(targets_of(&fs.entry_info("fast/old")), targets_of(&old));
    assert!(std::fs::read(fs.path("fast/old")).unwrap() == random_bytes(5, 3 << 20));
}

fn wait_capacity(fs: &TestFs, target: u64, class: &str) {
    let start = Instant::now();
    loop {
        let ts = json(&["targets", "--json", "--mount", fs.mnt_s()]);
        let t = ts.as_array().unwrap().iter().find(|t| t["id"] == target).cloned().unwrap();
        if t["capacity_pool"] == class {
            return;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "target {target} never became {class}: {t}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn choosers_avoid_emergency_targets_and_prefer_normal_ones() {
    // One storage server with three 64 MiB tmpfs targets; limits: low below 40 MiB free, emergency below 20 MiB.
    let fs = TestFs::up_with(&["--storage", "1", "--targets-per-storage", "3", "--chunk-size", "1m"], |fs| {
        for t in 1..=3 {
            fs.mount_tmpfs(&format!("storage1/target{t}"), "64m");
        }
        std::fs::create_dir_all(fs.dir.join("mgmtd")).unwrap();
        std::fs::write(
            fs.dir.join("mgmtd/mgmtd.toml"),
            "space_low_limit_bytes = 41943040\nspace_emergency_limit_bytes = 20971520\ninodes_low_limit = 10\ninodes_emergency_limit = 5\n",
        )
        .unwrap();
    });
    let dirs = fs.target_dirs();
    for t in 1..=3 {
        wait_capacity(&fs, t, "normal");
    }
    // Fill target 1 to emergency (50 MiB used) and target 2 to low (30 MiB used), outside HiveFS.
    std::fs::write(dirs[&1].join("filler"), vec![1u8; 50 << 20]).unwrap();
    std::fs::write(dirs[&2].join("filler"), vec![1u8; 30 << 20]).unwrap();
    wait_capacity(&fs, 1, "emergency");
    wait_capacity(&fs, 2, "low");
    let df = json(&["df", "--json", "--mount", fs.mnt_s()]);
    assert_eq!(df["pools"][0]["emergency"], 1, "{df}");
    std::thread::sleep(Duration::from_secs(3)); // the metadata node refreshes its view every 2 s
                                                // Stripe 1: only the normal target. Stripe all: normal and low, never emergency.
    std::fs::create_dir(fs.path("one")).unwrap();
    hivefs_ok(&["pattern", "set", fs.path("one").to_str().unwrap(), "--stripe", "1"]);
    for i in 0..5 {
        std::fs::write(fs.path(&format!("one/f{i}")), b"x").unwrap();
        assert_eq!(targets_of(&fs.entry_info(&format!("one/f{i}"))), vec![3]);
    }
    std::fs::create_dir(fs.path("two")).unwrap();
    hivefs_ok(&["pattern", "set", fs.path("two").to_str().unwrap(), "--stripe", "2"]);
    std::fs::write(fs.path("two/f"), b"x").unwrap();
    let mut t = targets_of(&fs.entry_info("two/f"));
    t.sort();
    assert_eq!(t, vec![2, 3], "the low target fills what the normal one cannot");
    // Free the space again: the target returns to normal.
    std::fs::remove_file(dirs[&1].join("filler")).unwrap();
    wait_capacity(&fs, 1, "normal");
}

#[test]
fn up_sets_the_file_systems_default_chooser() {
    let fs = TestFs::up(&["--storage", "1", "--targets-per-storage", "2", "--chooser", "roundrobin", "--stripe", "1"]);
    let root = json(&["pattern", "get", "--json", fs.mnt_s()]);
    assert_eq!((root["chooser"].as_str(), root["stripe_count"].as_str()), (Some("roundrobin"), Some("1")));
    std::fs::create_dir(fs.path("d")).unwrap();
    assert_eq!(json(&["pattern", "get", "--json", fs.path("d").to_str().unwrap()])["chooser"], "roundrobin");
    let tmp = tempfile::tempdir().unwrap();
    let o = hivefs(&[
        "up",
        "--dir",
        tmp.path().join("fs").to_str().unwrap(),
        "--mount",
        tmp.path().join("mnt").to_str().unwrap(),
        "--chooser",
        "fastest",
    ]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("unknown chooser"));
}
