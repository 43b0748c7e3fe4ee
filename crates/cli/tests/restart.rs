//! Restarts: `down` + `up` keeps every file; `kill -9` of each service in
//! turn, then `up`, loses nothing that was acknowledged.

mod common;
use common::*;

fn write_set(fs: &TestFs, prefix: &str, seed: u64) -> Vec<(String, Vec<u8>)> {
    let mut v = Vec::new();
    std::fs::create_dir_all(fs.path(prefix)).unwrap();
    for i in 0..5u64 {
        let name = format!("{prefix}/file{i}");
        let data = random_bytes(seed + i, (i as usize) * 300_000 + 1);
        std::fs::write(fs.path(&name), &data).unwrap();
        v.push((name, data));
    }
    v
}

fn check_set(fs: &TestFs, set: &[(String, Vec<u8>)]) {
    for (name, data) in set {
        let got = std::fs::read(fs.path(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(got == *data, "{name}: contents differ after restart");
    }
}

#[test]
fn down_then_up_keeps_everything() {
    let fs = TestFs::up(&["--storage", "2", "--targets-per-storage", "2"]);
    let set = write_set(&fs, "keep", 100);
    std::fs::create_dir_all(fs.path("a/b/c")).unwrap();
    std::os::unix::fs::symlink("../keep/file1", fs.path("a/link")).unwrap();
    let before = fs.entry_info("keep/file3");
    fs.down();
    assert!(!is_mounted(&fs.mnt));
    fs.reup();
    check_set(&fs, &set);
    assert!(fs.path("a/b/c").is_dir());
    assert_eq!(std::fs::read_link(fs.path("a/link")).unwrap().to_str().unwrap(), "../keep/file1");
    let after = fs.entry_info("keep/file3");
    assert_eq!(before["entry_id"], after["entry_id"]);
    assert_eq!(before["targets"], after["targets"]);
    // The restarted services kept their ids.
    let nodes = hivefs_ok(&["nodes", "--json", "--mount", fs.mnt_s()]);
    let nodes: serde_json::Value = serde_json::from_str(&nodes).unwrap();
    assert_eq!(nodes.as_array().unwrap().len(), 3, "1 meta + 2 storage nodes, no duplicates: {nodes}");
    let targets: serde_json::Value =
        serde_json::from_str(&hivefs_ok(&["targets", "--json", "--mount", fs.mnt_s()])).unwrap();
    assert_eq!(targets.as_array().unwrap().len(), 4);
}

#[test]
fn kill9_of_each_service_loses_nothing_acknowledged() {
    let fs = TestFs::up(&["--storage", "2", "--targets-per-storage", "2"]);
    let mut all = Vec::new();
    for (round, svc) in ["meta1", "storage1", "storage2", "mgmtd", "mount"].iter().enumerate() {
        let set = write_set(&fs, &format!("round{round}"), 1000 * round as u64);
        std::fs::create_dir(fs.path(&format!("round{round}/dir"))).unwrap();
        all.extend(set);
        fs.kill9(svc);
        if *svc == "mount" {
            // A dead mount process leaves a dead mount behind; `up` repairs it.
            assert!(is_mounted(&fs.mnt));
        }
        fs.reup();
        check_set(&fs, &all);
        assert!(fs.path(&format!("round{round}/dir")).is_dir(), "mkdir acknowledged before kill of {svc}");
    }
}
