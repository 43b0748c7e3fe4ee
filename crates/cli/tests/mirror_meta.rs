//! Metadata buddy mirroring against real services and a real mount
//! (`docs/design-mirror.md`, "Metadata groups"): mirroring every namespace
//! of a running file system, a metadata server killed with `kill -9` and its
//! namespace served by its buddy without an error for the application, the
//! returning server resynced, and then its buddy killed in turn.

mod common;
use common::*;
use std::path::PathBuf;
use std::time::{Duration, Instant};

fn groups(m: &str) -> Vec<serde_json::Value> {
    let v: serde_json::Value =
        serde_json::from_str(&hivefs_ok(&["mirror", "list", "--json", "--type", "meta", "--mount", m]))
            .expect("mirror list --json");
    v.as_array().unwrap().clone()
}

fn all_good(m: &str) -> bool {
    groups(m).iter().all(|g| g["primary"]["state"] == "good" && g["secondary"]["state"] == "good")
}

/// The service (`metaN`) whose data directory holds metadata node `id`.
fn service_of_node(fs: &TestFs, id: u64) -> String {
    for e in std::fs::read_dir(&fs.dir).unwrap() {
        let p: PathBuf = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if !name.starts_with("meta") {
            continue;
        }
        let toml = std::fs::read_to_string(p.join("node.toml")).unwrap_or_default();
        if toml.lines().any(|l| l.replace(' ', "") == format!("node_id={id}")) {
            return name;
        }
    }
    panic!("no metadata service holds node {id}")
}

/// The last lines of every service's and the mount's log (for a failure message).
fn logs(fs: &TestFs) -> String {
    let mut out = String::new();
    for e in std::fs::read_dir(&fs.dir).unwrap() {
        let d = e.unwrap().path();
        for f in std::fs::read_dir(&d).into_iter().flatten() {
            let f = f.unwrap().path();
            if f.extension().is_some_and(|x| x == "log") {
                let text = std::fs::read_to_string(&f).unwrap_or_default();
                let lines: Vec<&str> = text.lines().collect();
                out.push_str(&format!("--- {}\n", f.display()));
                for l in &lines[lines.len().saturating_sub(25)..] {
                    out.push_str(l);
                    out.push('\n');
                }
            }
        }
    }
    out
}

/// Every file `d{i}/f{j}` of the tree made by `make`, read back.
fn check_tree(fs: &TestFs, dirs: usize, files: usize, tag: &str) {
    for i in 0..dirs {
        for j in 0..files {
            let p = fs.path(&format!("{tag}{i}/f{j}"));
            let got = std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            assert_eq!(got, format!("{tag} {i} {j}").into_bytes(), "{}", p.display());
        }
        let n = std::fs::read_dir(fs.path(&format!("{tag}{i}")))
            .unwrap()
            .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().starts_with('f'))
            .count();
        assert_eq!(n, files, "files f* of {tag}{i}");
    }
}

fn make_tree(fs: &TestFs, dirs: usize, files: usize, tag: &str) {
    for i in 0..dirs {
        std::fs::create_dir(fs.path(&format!("{tag}{i}"))).unwrap();
        for j in 0..files {
            std::fs::write(fs.path(&format!("{tag}{i}/f{j}")), format!("{tag} {i} {j}")).unwrap();
        }
    }
}

#[test]
fn mirrored_namespaces_survive_a_dead_metadata_server_and_its_buddy_in_turn() {
    let fs = TestFs::up_with(&["--meta", "2", "--storage", "1"], |fs| {
        std::fs::create_dir_all(fs.dir.join("mgmtd")).unwrap();
        std::fs::write(fs.dir.join("mgmtd/mgmtd.toml"), FAST_FAILOVER).unwrap();
    });
    let m = fs.mnt_s();
    // Made before mirroring: reaches the secondaries by a full copy.
    make_tree(&fs, 6, 5, "a");
    let owners: std::collections::BTreeSet<u64> =
        (0..6).map(|i| fs.entry_info(&format!("a{i}"))["owner_meta_node"].as_u64().unwrap()).collect();
    assert_eq!(owners.len(), 2, "directories on both metadata nodes");

    // One host: the pair needs --force. --auto mirrors both namespaces (a ring).
    let out = hivefs(&["mirror", "create", "--type", "meta", "--primary", "1", "--secondary", "2", "--mount", m]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("both on host"), "{out:?}");
    hivefs_ok(&["mirror", "create", "--type", "meta", "--auto", "--force", "--mount", m]);
    let list = groups(m);
    assert_eq!(list.len(), 2, "{list:?}");
    wait_for("both metadata secondaries resynced", Duration::from_secs(60), || all_good(m));

    // Made while mirrored: forwarded record by record.
    make_tree(&fs, 4, 5, "b");
    std::fs::rename(fs.path("a0/f0"), fs.path("b0/moved")).unwrap();
    std::fs::remove_file(fs.path("a1/f1")).unwrap();
    std::fs::write(fs.path("a1/f1"), "a 1 1").unwrap();
    std::fs::rename(fs.path("b0/moved"), fs.path("a0/f0")).unwrap();

    // The server of the root's namespace dies: its buddy serves it.
    let root_owner = fs.entry_info("")["owner_meta_node"].as_u64().unwrap();
    let victim = service_of_node(&fs, root_owner);
    fs.kill9(&victim);
    let t0 = Instant::now();
    // The application sees a pause, not an error.
    std::fs::write(fs.path("a2/after-kill"), "written during the failover")
        .unwrap_or_else(|e| panic!("write during the failover: {e}\n{}", logs(&fs)));
    let pause = t0.elapsed();
    eprintln!("first write after the kill completed after {pause:?}");
    let g = groups(m).into_iter().find(|g| g["primary"]["id"] != root_owner && g["secondary"]["id"] == root_owner);
    assert!(g.is_some(), "the group of namespace {root_owner} switched over: {:?}", groups(m));
    check_tree(&fs, 6, 5, "a");
    check_tree(&fs, 4, 5, "b");
    make_tree(&fs, 2, 3, "c");

    // The old primary returns as secondary and is brought up to date.
    fs.reup();
    wait_for("both buddies good again", Duration::from_secs(60), || all_good(m));

    // Now its buddy dies: every namespace is served by the returned node,
    // with what was made while it was away.
    let other = groups(m)[0]["primary"]["id"].as_u64().unwrap();
    let other = if other == root_owner { groups(m)[1]["primary"]["id"].as_u64().unwrap() } else { other };
    assert_ne!(other, root_owner);
    fs.kill9(&service_of_node(&fs, other));
    std::fs::write(fs.path("c0/after-second-kill"), "x")
        .unwrap_or_else(|e| panic!("write during the second failover: {e}\n{}", logs(&fs)));
    check_tree(&fs, 6, 5, "a");
    check_tree(&fs, 4, 5, "b");
    for i in 0..2 {
        assert_eq!(std::fs::read_dir(fs.path(&format!("c{i}"))).unwrap().count(), 3 + usize::from(i == 0));
    }
    assert_eq!(std::fs::read_to_string(fs.path("a2/after-kill")).unwrap(), "written during the failover");
    for g in groups(m) {
        assert_ne!(g["primary"]["id"], other, "{g}");
    }
    fs.reup();
    wait_for("both buddies good again", Duration::from_secs(60), || all_good(m));
    fs.assert_fsck_clean();
}

/// One worker of the storm: creates, renames (in its directory and across
/// to another namespace's directory) and unlinks, remembering what each
/// acknowledged operation left; any error fails the test.
fn storm(
    fs_root: PathBuf,
    mine: String,
    other: String,
    w: usize,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> (std::collections::BTreeSet<String>, std::collections::BTreeSet<String>, usize) {
    use std::collections::BTreeSet;
    let (mut here, mut there) = (BTreeSet::new(), BTreeSet::new());
    let mut i = 0usize;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) || i < 50 {
        let name = format!("w{w}-{i}");
        let p = fs_root.join(&mine).join(&name);
        std::fs::write(&p, name.as_bytes()).unwrap_or_else(|e| panic!("create {}: {e}", p.display()));
        here.insert(name.clone());
        match i % 6 {
            2 => {
                let to = format!("{name}-r");
                std::fs::rename(&p, fs_root.join(&mine).join(&to)).unwrap_or_else(|e| panic!("rename {name}: {e}"));
                here.remove(&name);
                here.insert(to);
            }
            4 => {
                std::fs::rename(&p, fs_root.join(&other).join(&name))
                    .unwrap_or_else(|e| panic!("rename {name} to {other}: {e}"));
                here.remove(&name);
                there.insert(name);
            }
            5 => {
                std::fs::remove_file(&p).unwrap_or_else(|e| panic!("unlink {name}: {e}"));
                here.remove(&name);
            }
            _ => {}
        }
        i += 1;
    }
    (here, there, i)
}

#[test]
fn a_metadata_primary_killed_during_a_storm_loses_and_doubles_nothing() {
    let fs = TestFs::up_with(&["--meta", "2", "--storage", "1"], |fs| {
        std::fs::create_dir_all(fs.dir.join("mgmtd")).unwrap();
        std::fs::write(fs.dir.join("mgmtd/mgmtd.toml"), FAST_FAILOVER).unwrap();
    });
    let m = fs.mnt_s();
    hivefs_ok(&["mirror", "create", "--type", "meta", "--auto", "--force", "--mount", m]);
    wait_for("both metadata secondaries resynced", Duration::from_secs(60), || all_good(m));
    // One directory in each namespace (the chooser decides: names are tried).
    let mut by_owner = std::collections::BTreeMap::new();
    for k in 0..20 {
        let d = format!("s{k}");
        std::fs::create_dir(fs.path(&d)).unwrap();
        by_owner.entry(fs.entry_info(&d)["owner_meta_node"].as_u64().unwrap()).or_insert(d);
        if by_owner.len() == 2 {
            break;
        }
    }
    assert_eq!(by_owner.len(), 2, "directories in both namespaces");
    let dirs: Vec<(u64, String)> = by_owner.into_iter().collect();
    // Settle: the mount knows both groups before anything dies.
    std::thread::sleep(Duration::from_secs(6));

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let workers: Vec<_> = (0..2)
        .map(|w| {
            let (mine, other) = (dirs[w].1.clone(), dirs[1 - w].1.clone());
            let (root, stop) = (fs.mnt.clone(), stop.clone());
            std::thread::spawn(move || storm(root, mine, other, w, stop))
        })
        .collect();
    std::thread::sleep(Duration::from_millis(1500));
    let root_owner = fs.entry_info("")["owner_meta_node"].as_u64().unwrap();
    fs.kill9(&service_of_node(&fs, root_owner));
    wait_for("the switch-over", Duration::from_secs(30), || {
        groups(m).iter().any(|g| g["secondary"]["id"] == root_owner && g["epoch"] == 1)
    });
    std::thread::sleep(Duration::from_secs(3));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut expect: Vec<std::collections::BTreeSet<String>> = vec![Default::default(), Default::default()];
    let mut ops = 0;
    for (w, h) in workers.into_iter().enumerate() {
        let (here, there, n) = h.join().unwrap_or_else(|_| panic!("worker {w} failed\n{}", logs(&fs)));
        ops += n;
        expect[w].extend(here);
        expect[1 - w].extend(there);
    }
    eprintln!("{ops} storm rounds");
    // Every acknowledged entry exactly once: the listing is the model.
    for (w, (_, d)) in dirs.iter().enumerate() {
        let got: std::collections::BTreeSet<String> = std::fs::read_dir(fs.path(d))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(got, expect[w], "entries of {d}");
        for name in &got {
            let body = std::fs::read_to_string(fs.path(&format!("{d}/{name}"))).unwrap();
            assert!(name.starts_with(&body), "{d}/{name} holds {body:?}");
        }
    }
    fs.reup();
    wait_for("both buddies good again", Duration::from_secs(60), || all_good(m));
    fs.assert_fsck_clean();
}

#[test]
fn both_metadata_buddies_dead_fail_in_bounded_time_and_everything_returns() {
    let fs = TestFs::up(&["--meta", "2", "--storage", "1"]);
    let m = fs.mnt_s();
    make_tree(&fs, 4, 3, "a");
    hivefs_ok(&["mirror", "create", "--type", "meta", "--auto", "--force", "--mount", m]);
    wait_for("both metadata secondaries resynced", Duration::from_secs(60), || all_good(m));
    let m2 = fs.extra_mount("m2", &["--mirror-retry-ms", "4000", "--io-timeout-ms", "2000"]);
    assert_eq!(std::fs::read(m2.mnt.join("a1/f1")).unwrap(), b"a 1 1");
    fs.kill9("meta1");
    fs.kill9("meta2");
    // In a child process: a call that hung would hang the test's later spawns too.
    let start = Instant::now();
    let mut touch = std::process::Command::new("touch")
        .arg(m2.mnt.join("a2/new"))
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let status = wait_child(&mut touch, Duration::from_secs(90), "a create with both metadata buddies dead");
    let took = start.elapsed();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut touch.stderr.take().unwrap(), &mut err).unwrap();
    assert!(!status.success(), "a create succeeded with both metadata buddies dead");
    eprintln!("with both metadata buddies dead a create failed after {took:?}: {}", err.trim());
    // Both return: the same mount works again and nothing was lost.
    fs.reup();
    wait_for("a create through the second mount", Duration::from_secs(60), || {
        std::fs::write(m2.mnt.join("a2/new"), "x").is_ok()
    });
    check_tree(&fs, 4, 3, "a");
    wait_for("both buddies good again", Duration::from_secs(60), || all_good(m));
    fs.assert_fsck_clean();
}

#[test]
fn fsck_compares_metadata_buddies_and_repairs_a_copy_that_differs() {
    let fs = TestFs::up(&["--meta", "2", "--storage", "1"]);
    let m = fs.mnt_s();
    make_tree(&fs, 4, 3, "a");
    hivefs_ok(&["mirror", "create", "--type", "meta", "--auto", "--force", "--mount", m]);
    wait_for("both metadata secondaries resynced", Duration::from_secs(60), || all_good(m));
    fs.assert_fsck_clean();

    // Node 2's copy of namespace 1 gets a record its primary never had
    // (edited while node 2 is down, too briefly for a failover).
    let service = service_of_node(&fs, 2);
    fs.kill9(&service);
    {
        let path = fs.dir.join(&service).join("ns-1").join(hivefs_meta::DB_FILE);
        let mut copy = hivefs_meta::store::Store::open_replica(&path, false, 1 << 20).unwrap();
        copy.edit(|t| t.xattrs.insert(&[[0u8; 16].as_slice(), b"user.stray"].concat(), b"x")).unwrap();
    }
    fs.reup();
    let out = hivefs(&["fsck", "--json", "--mount", m]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let problems = report["problems"].as_array().unwrap();
    assert_eq!(problems.len(), 1, "{report}");
    assert_eq!((problems[0]["kind"].as_str(), problems[0]["meta_node"].as_u64()), (Some("buddy-mismatch"), Some(1)));
    assert!(problems[0]["detail"].as_str().unwrap().contains("differ"), "{report}");

    // --repair asks for a full copy from the primary; then both copies agree.
    hivefs(&["fsck", "--repair", "--mount", m]);
    wait_for("both buddies good again", Duration::from_secs(60), || all_good(m));
    fs.assert_fsck_clean();
    check_tree(&fs, 4, 3, "a");
}

#[test]
fn a_metadata_secondary_with_a_full_disk_degrades_its_group_and_creates_go_on() {
    let mut fs = TestFs::up(&["--meta", "2", "--storage", "1"]);
    let m = fs.mnt_s().to_string();
    let root_owner = fs.entry_info("")["owner_meta_node"].as_u64().unwrap();
    let other = 3 - root_owner;
    // The copy of the root's namespace kept by the other node, on a 4 MiB file system.
    let rel = format!("{}/ns-{root_owner}", service_of_node(&fs, other));
    fs.mount_tmpfs(&rel, "4m");
    let (p, s) = (root_owner.to_string(), other.to_string());
    hivefs_ok(&["mirror", "create", "--type", "meta", "--primary", &p, "--secondary", &s, "--force", "--mount", &m]);
    wait_for("the first copy", Duration::from_secs(60), || all_good(&m));

    // Files in the root until the copy's disk is full: every create succeeds.
    let mut made = 0;
    while groups(&m)[0]["secondary"]["state"] == "good" {
        assert!(made < 100_000, "the copy never filled up");
        let names: Vec<String> = (made..made + 2000).map(|i| format!("file-{i}")).collect();
        let st = std::process::Command::new("touch").args(&names).current_dir(&fs.mnt).status().unwrap();
        assert!(st.success(), "creates failed while the secondary's disk filled up\n{}", logs(&fs));
        made += 2000;
    }
    eprintln!("the copy's disk was full after {made} creates");
    let g = &groups(&m)[0];
    // Degraded, no switch; the primary may already be trying a resync (which fails
    // again while the disk is full).
    let state = g["secondary"]["state"].as_str().unwrap_or_default();
    assert!(["needs-resync", "resyncing"].contains(&state) && g["epoch"] == 0, "{g}");
    let st = std::process::Command::new("touch").arg("after").current_dir(&fs.mnt).status().unwrap();
    assert!(st.success());

    // Space again: the secondary is resynced and the copies agree.
    let dir = fs.dir.join(&rel);
    let st = std::process::Command::new("mount").args(["-o", "remount,size=256m"]).arg(&dir).status().unwrap();
    assert!(st.success());
    wait_for("the resync after space came back", Duration::from_secs(60), || all_good(&m));
    assert_eq!(std::fs::read_dir(&fs.mnt).unwrap().count(), made + 1);
    fs.assert_fsck_clean();
}

#[test]
fn a_secondary_away_through_many_checkpoints_gets_only_what_it_missed() {
    // Checkpoints every 64 KiB of journal: many run while the secondary is away.
    let fs = TestFs::up_with(&["--meta", "2", "--storage", "1"], |fs| {
        for s in ["meta1", "meta2"] {
            std::fs::create_dir_all(fs.dir.join(s)).unwrap();
            std::fs::write(fs.dir.join(format!("{s}/meta.toml")), "checkpoint_bytes = 65536\n").unwrap();
        }
    });
    let m = fs.mnt_s().to_string();
    let root_owner = fs.entry_info("")["owner_meta_node"].as_u64().unwrap();
    let other = 3 - root_owner;
    let (p, s) = (root_owner.to_string(), other.to_string());
    hivefs_ok(&["mirror", "create", "--type", "meta", "--primary", &p, "--secondary", &s, "--force", "--mount", &m]);
    wait_for("the first copy", Duration::from_secs(60), || all_good(&m));

    let away = service_of_node(&fs, other);
    fs.kill9(&away);
    for k in 0..4 {
        let names: Vec<String> = (k * 1000..(k + 1) * 1000).map(|i| format!("file-{i}")).collect();
        let st = std::process::Command::new("touch").args(&names).current_dir(&fs.mnt).status().unwrap();
        assert!(st.success(), "creates while the secondary is away\n{}", logs(&fs));
    }
    fs.reup();
    wait_for("the resync after its return", Duration::from_secs(60), || all_good(&m));
    // About 1.5 MiB of journal meanwhile: some 20 checkpoints, which kept the
    // segments the secondary missed.
    let service = service_of_node(&fs, root_owner);
    let primary_log = std::fs::read_to_string(fs.dir.join(&service).join(format!("{service}.log"))).unwrap();
    let full = primary_log.matches("full copy of a mirrored namespace to its secondary").count();
    assert_eq!(full, 1, "only the first copy was a full one\n{}", logs(&fs));
    assert_eq!(std::fs::read_dir(&fs.mnt).unwrap().count(), 4000);
    fs.assert_fsck_clean();
}

/// Directories made below a mirrored namespace stay in mirrored namespaces:
/// with only the root's namespace mirrored, every new directory below the
/// root is owned by it, never by the unmirrored second node.
#[test]
fn new_directories_below_a_mirrored_namespace_stay_mirrored() {
    let fs = TestFs::up(&["--meta", "2", "--storage", "1"]);
    let m = fs.mnt_s();
    let root = fs.entry_info("")["owner_meta_node"].as_u64().unwrap();
    let other = if root == 1 { "2" } else { "1" };
    hivefs_ok(&[
        "mirror",
        "create",
        "--type",
        "meta",
        "--primary",
        &root.to_string(),
        "--secondary",
        other,
        "--force",
        "--mount",
        m,
    ]);
    wait_for("the root's namespace mirrored", Duration::from_secs(60), || {
        let gs = groups(m);
        gs.len() == 1 && all_good(m)
    });
    // Time for the metadata nodes to see the group in their view.
    std::thread::sleep(Duration::from_secs(3));
    for i in 0..12 {
        let d = format!("d{i}");
        std::fs::create_dir(fs.path(&d)).unwrap();
        let owner = fs.entry_info(&d)["owner_meta_node"].as_u64().unwrap();
        assert_eq!(owner, root, "{d} is owned by unmirrored metadata node {owner}");
    }
}
