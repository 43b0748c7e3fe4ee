//! Buddy groups through the CLI against real services: creation rules,
//! `mirror list`, and mgmtd switching a group over when the storage server
//! of its primary is killed (`docs/design-mirror.md`).

mod common;
use common::*;
use std::time::{Duration, Instant};

fn groups(m: &str) -> Vec<serde_json::Value> {
    let v: serde_json::Value =
        serde_json::from_str(&hivefs_ok(&["mirror", "list", "--json", "--mount", m])).expect("mirror list --json");
    v.as_array().unwrap().clone()
}

/// Name of the storage service (`storageN`) whose data directory holds target `t`.
fn service_of_target(fs: &TestFs, t: u64) -> String {
    let dir = fs.target_dirs().remove(&t).unwrap_or_else(|| panic!("no directory of target {t}"));
    dir.parent().unwrap().file_name().unwrap().to_string_lossy().into_owned()
}

#[test]
fn buddy_groups_are_made_listed_and_switched_over_when_a_primary_dies() {
    let fs = TestFs::up_with(&["--storage", "2", "--targets-per-storage", "2"], |fs| {
        std::fs::create_dir_all(fs.dir.join("mgmtd")).unwrap();
        std::fs::write(fs.dir.join("mgmtd/mgmtd.toml"), FAST_FAILOVER).unwrap();
    });
    let m = fs.mnt_s();
    let targets: serde_json::Value = serde_json::from_str(&hivefs_ok(&["targets", "--json", "--mount", m])).unwrap();
    let node_of = |t: u64| {
        targets.as_array().unwrap().iter().find(|x| x["id"] == t).map(|x| x["node"].as_u64().unwrap()).unwrap()
    };
    let same_node: Vec<u64> = (2..=4).filter(|&t| node_of(t) == node_of(1)).collect();
    assert_eq!(same_node.len(), 1, "two targets per storage node: {targets}");

    // A group on one server is refused unless forced; nonsense is refused.
    let out = hivefs(&[
        "mirror",
        "create",
        "--type",
        "storage",
        "--primary",
        "1",
        "--secondary",
        &same_node[0].to_string(),
        "--mount",
        m,
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("both on storage node"), "{out:?}");
    let out = hivefs(&["mirror", "create", "--type", "storage", "--primary", "1", "--secondary", "9", "--mount", m]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("target 9 is not registered"), "{out:?}");

    // --auto pairs every target with one on the other server.
    let made: serde_json::Value =
        serde_json::from_str(&hivefs_ok(&["mirror", "create", "--type", "storage", "--auto", "--json", "--mount", m]))
            .unwrap();
    assert_eq!(made.as_array().unwrap().len(), 2, "{made}");
    let list = groups(m);
    assert_eq!(list.len(), 2);
    for g in &list {
        let (p, s) = (g["primary"]["id"].as_u64().unwrap(), g["secondary"]["id"].as_u64().unwrap());
        assert_ne!(node_of(p), node_of(s), "{g}");
        assert_eq!((g["epoch"].as_u64(), g["type"].as_str()), (Some(0), Some("storage")), "{g}");
        for member in ["primary", "secondary"] {
            assert_eq!(g[member]["state"], "good", "{g}");
            assert_eq!(g[member]["reachability"], "online", "{g}");
        }
    }
    // `targets` shows each target's group and role.
    let ts: serde_json::Value = serde_json::from_str(&hivefs_ok(&["targets", "--json", "--mount", m])).unwrap();
    for t in ts.as_array().unwrap() {
        assert_eq!(t["mirror"]["state"], "good", "{t}");
        assert!(t["mirror"]["role"] == "primary" || t["mirror"]["role"] == "secondary", "{t}");
    }
    // Members are taken: a second --auto finds nothing to pair.
    let out = hivefs(&["mirror", "create", "--type", "storage", "--auto", "--mount", m]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("no storage members"), "{out:?}");

    // Kill the storage server holding group 1's primary: mgmtd promotes the secondary.
    let g1 = &list[0];
    let old_primary = g1["primary"]["id"].as_u64().unwrap();
    let old_secondary = g1["secondary"]["id"].as_u64().unwrap();
    // The service whose directory holds the target (node ids follow the
    // order in which the services registered, not their names).
    let victim = service_of_target(&fs, old_primary);
    fs.kill9(&victim);
    // (Spelled out: a failure shows the group as last seen and mgmtd's log.)
    let start = Instant::now();
    let mut g = groups(m)[0].clone();
    while !(g["epoch"] == 1 && g["primary"]["id"] == old_secondary) {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "failover of group 1 not within 30 s; last seen: {g}\nmgmtd log:\n{}",
            std::fs::read_to_string(fs.dir.join("mgmtd/mgmtd.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
        g = groups(m)[0].clone();
    }
    let g = &groups(m)[0];
    assert_eq!(g["secondary"]["id"], old_primary, "{g}");
    assert_eq!(g["secondary"]["state"], "needs-resync", "{g}");
    assert_eq!(g["primary"]["state"], "good", "{g}");
    assert_ne!(g["secondary"]["reachability"], "online", "{g}");

    // The old primary returns: online again, still secondary (mgmtd never promotes a
    // member that needs a resync). The new primary starts resyncing it as soon as it is
    // back, so by the time it is seen online it may be resyncing or already good.
    fs.reup();
    wait_for("old primary back online", Duration::from_secs(30), || {
        groups(m)[0]["secondary"]["reachability"] == "online"
    });
    let after = groups(m);
    assert_eq!(after[0]["epoch"], 1, "{after:?}");
    assert_eq!(after[0]["secondary"]["id"], old_primary, "{after:?}");
    let state = after[0]["secondary"]["state"].as_str().unwrap_or_default();
    assert!(["needs-resync", "resyncing", "good"].contains(&state), "{after:?}");
}

/// Every mirrored chunk file of `t` (name → bytes).
fn mirrored_chunks(fs: &TestFs, t: u64) -> std::collections::BTreeMap<String, Vec<u8>> {
    let mut out = std::collections::BTreeMap::new();
    let root = fs.target_dirs()[&t].join("mirror/chunks");
    for sub in std::fs::read_dir(&root).unwrap() {
        for f in std::fs::read_dir(sub.unwrap().path()).unwrap() {
            let f = f.unwrap().path();
            out.insert(f.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read(&f).unwrap());
        }
    }
    out
}

/// Both members of every group hold the same mirrored chunk files, byte for
/// byte; returns how many files each group's primary holds.
fn assert_buddies_equal(fs: &TestFs, m: &str) -> Vec<usize> {
    let mut counts = Vec::new();
    for g in groups(m) {
        let (p, s) = (g["primary"]["id"].as_u64().unwrap(), g["secondary"]["id"].as_u64().unwrap());
        let (a, b) = (mirrored_chunks(fs, p), mirrored_chunks(fs, s));
        counts.push(a.len());
        assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>(), "chunk files of targets {p} and {s}");
        for (name, bytes) in &a {
            assert!(bytes == &b[name], "chunk file {name} differs between targets {p} and {s}");
        }
    }
    counts
}

#[test]
fn mirrored_files_survive_a_dead_primary_and_the_returning_buddy_is_resynced() {
    let fs = TestFs::up_with(&["--storage", "2", "--targets-per-storage", "2", "--chunk-size", "64k"], |fs| {
        std::fs::create_dir_all(fs.dir.join("mgmtd")).unwrap();
        std::fs::write(fs.dir.join("mgmtd/mgmtd.toml"), FAST_FAILOVER).unwrap();
    });
    let m = fs.mnt_s();
    hivefs_ok(&["mirror", "create", "--type", "storage", "--auto", "--mount", m]);
    std::fs::create_dir(fs.path("m")).unwrap();
    let out = hivefs_ok(&["pattern", "set", fs.path("m").to_str().unwrap(), "--mirror"]);
    assert!(out.contains("mirrored over buddy groups"), "{out}");

    // Written through the mount: every chunk lands on both members.
    let a = random_bytes(1, 3 << 20);
    std::fs::write(fs.path("m/a"), &a).unwrap();
    let info = fs.entry_info("m/a");
    assert_eq!(info["mirrored"], true, "{info}");
    assert_eq!(info["groups"].as_array().unwrap().len(), 2, "{info}");
    assert_eq!(assert_buddies_equal(&fs, m), vec![1, 1], "one chunk file of m/a per group");
    let removed = random_bytes(2, 300 << 10);
    std::fs::write(fs.path("m/gone"), &removed).unwrap();
    let truncated = random_bytes(3, 1 << 20);
    std::fs::write(fs.path("m/short"), &truncated).unwrap();

    // The storage server of group 1's primary dies; writes go on after the failover.
    let list = groups(m);
    let victim = service_of_target(&fs, list[0]["primary"]["id"].as_u64().unwrap());
    fs.kill9(&victim);
    // Once mgmtd has switched group 1, every group has one member left (the other
    // group's secondary was on the same server): new files still go to them.
    wait_for("the failover", Duration::from_secs(30), || groups(m)[0]["epoch"] == 1);
    let b = random_bytes(4, 2 << 20);
    std::fs::write(fs.path("m/b"), &b).unwrap();
    let mut a2 = a.clone();
    a2[100_000..100_000 + 4096].copy_from_slice(&random_bytes(5, 4096));
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(fs.path("m/a")).unwrap();
        f.write_all_at(&a2[100_000..100_000 + 4096], 100_000).unwrap();
    }
    let gone_id = fs.entry_info("m/gone")["entry_id"].as_str().unwrap().to_string();
    std::fs::remove_file(fs.path("m/gone")).unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(fs.path("m/short")).unwrap();
    f.set_len(100_000).unwrap();
    drop(f);
    assert_eq!(std::fs::read(fs.path("m/a")).unwrap(), a2);
    assert_eq!(std::fs::read(fs.path("m/b")).unwrap(), b);
    assert_eq!(std::fs::read(fs.path("m/short")).unwrap(), truncated[..100_000]);
    let g = &groups(m)[0];
    assert_eq!(g["epoch"], 1, "{g}");
    assert_eq!(g["secondary"]["state"], "needs-resync", "{g}");

    // The server returns as secondary and is resynced: both copies equal again.
    fs.reup();
    wait_for("resync of every group", Duration::from_secs(60), || {
        groups(m).iter().all(|g| g["secondary"]["state"] == "good" && g["primary"]["state"] == "good")
    });
    // m/a and m/short on each group, m/b on those the metadata node saw usable;
    // m/gone's chunk files deleted on both members.
    let counts = assert_buddies_equal(&fs, m);
    assert!(counts.iter().all(|&n| (2..=3).contains(&n)) && counts.iter().sum::<usize>() >= 5, "{counts:?}");
    for g in groups(m) {
        for member in ["primary", "secondary"] {
            let t = g[member]["id"].as_u64().unwrap();
            assert!(!mirrored_chunks(&fs, t).contains_key(&gone_id), "m/gone's chunk file left on target {t}");
        }
    }
    assert_eq!(std::fs::read(fs.path("m/a")).unwrap(), a2);
    assert_eq!(std::fs::read(fs.path("m/b")).unwrap(), b);
    // A full resync on demand: everything copied again, still equal.
    let out = hivefs_ok(&["mirror", "resync", "--group", "1", "--full", "--wait", "--timeout", "60", "--mount", m]);
    assert!(out.is_empty(), "progress and messages go to stderr: {out}");
    assert_eq!(groups(m)[0]["secondary"]["state"], "good");
    assert_eq!(assert_buddies_equal(&fs, m), counts);
    // fsck sizes mirrored files from their groups' chunk files: clean.
    let out = hivefs(&["fsck", "--mount", m]);
    assert!(
        out.status.success(),
        "fsck: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn up_with_mirror_makes_a_mirrored_file_system() {
    let fs = TestFs::up(&["--storage", "2", "--targets-per-storage", "2", "--mirror"]);
    let m = fs.mnt_s();
    assert_eq!(groups(m).len(), 2);
    let data = random_bytes(9, 1 << 20);
    std::fs::write(fs.path("f"), &data).unwrap();
    let info = fs.entry_info("f");
    assert_eq!(info["mirrored"], true, "{info}");
    assert_eq!(std::fs::read(fs.path("f")).unwrap(), data);
    assert_eq!(assert_buddies_equal(&fs, m), vec![1, 1]);
    let other = fs.tmp.path().join("other");
    let (d, mnt) = (other.join("fs"), other.join("mnt"));
    let out =
        hivefs(&["up", "--dir", d.to_str().unwrap(), "--mount", mnt.to_str().unwrap(), "--storage", "1", "--mirror"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("needs at least 2 storage servers"), "{out:?}");
}

#[test]
fn both_buddies_dead_fail_with_eio_in_bounded_time_and_recover() {
    let fs = TestFs::up(&["--storage", "2", "--targets-per-storage", "1", "--mirror"]);
    let data = random_bytes(11, 1 << 20);
    std::fs::write(fs.path("f"), &data).unwrap();
    let m2 = fs.extra_mount("m2", &["--mirror-retry-ms", "4000", "--io-timeout-ms", "2000"]);
    assert_eq!(std::fs::read(m2.mnt.join("f")).unwrap(), data);
    fs.kill9("storage1");
    fs.kill9("storage2");
    // In a child process: a read that hung would hang the test's later spawns too.
    let start = Instant::now();
    let mut dd = std::process::Command::new("dd")
        .arg(format!("if={}", m2.mnt.join("f").display()))
        .args(["of=/dev/null", "bs=1M"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let status = wait_child(&mut dd, Duration::from_secs(60), "a read with both buddies dead");
    let took = start.elapsed();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut dd.stderr.take().unwrap(), &mut err).unwrap();
    assert!(!status.success(), "a read succeeded with both buddies dead");
    assert!(err.contains("Input/output error") || err.contains("timed out"), "{err}");
    eprintln!("with both buddies dead a read failed after {took:?}: {}", err.lines().next().unwrap_or(""));
    // Both return: the same mount reads the file again.
    fs.reup();
    wait_for("the file readable again", Duration::from_secs(30), || {
        std::fs::read(m2.mnt.join("f")).is_ok_and(|d| d == data)
    });
}

/// One buddy group over two storage servers of one target each, limited to
/// 24 MiB/s, so a resync of 16 MiB or more takes a noticeable time.
fn slow_mirrored_pair() -> TestFs {
    TestFs::up_with(&["--storage", "2", "--targets-per-storage", "1", "--mirror", "--chunk-size", "1m"], |fs| {
        std::fs::create_dir_all(fs.dir.join("mgmtd")).unwrap();
        std::fs::write(fs.dir.join("mgmtd/mgmtd.toml"), FAST_FAILOVER).unwrap();
        for s in ["storage1", "storage2"] {
            std::fs::create_dir_all(fs.dir.join(s)).unwrap();
            std::fs::write(fs.dir.join(format!("{s}/storage.toml")), "target_rate_limit = \"24MiB\"\n").unwrap();
        }
    })
}

/// Writes that arrive while a resync runs reach the secondary too: the
/// primary's view of the group still says needs-resync for up to a heartbeat
/// after the resync began (and mgmtd says good as soon as it ended), so a
/// primary trusting its view would skip those forwards and a later failover
/// would serve zeros where acknowledged data was.
#[test]
fn writes_during_a_resync_reach_the_secondary() {
    // Targets limited to 24 MiB/s, so the resync of 16 MiB takes most of a second.
    let fs = slow_mirrored_pair();
    let m = fs.mnt_s();
    let victim = service_of_target(&fs, groups(m)[0]["secondary"]["id"].as_u64().unwrap());
    fs.kill9(&victim);
    // A writer makes small files one after another until told to stop,
    // before, during and after the resync; it returns what it wrote. Each
    // file is written once: a write the secondary missed stays missing.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (stop, dir) = (stop.clone(), fs.mnt.clone());
        std::thread::spawn(move || {
            let mut written = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let d = random_bytes(1000 + written.len() as u64, 16 << 10);
                std::fs::write(dir.join(format!("w{}", written.len())), &d).unwrap();
                written.push(d);
                std::thread::sleep(Duration::from_millis(2));
            }
            written
        })
    };
    std::thread::sleep(Duration::from_millis(500));
    std::fs::write(fs.path("big"), random_bytes(40, 16 << 20)).unwrap();
    fs.reup();
    wait_for("the resync to finish", Duration::from_secs(60), || groups(m)[0]["secondary"]["state"] == "good");
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let written = writer.join().unwrap();
    eprintln!("the writer made {} files", written.len());
    assert_eq!(groups(m)[0]["secondary"]["state"], "good", "a forward failed after the resync");
    assert_eq!(assert_buddies_equal(&fs, m), vec![written.len() + 1]);
    for (i, d) in written.iter().enumerate() {
        assert!(std::fs::read(fs.path(&format!("w{i}"))).unwrap() == *d, "w{i}");
    }
}

#[test]
fn an_interrupted_resync_goes_on_after_the_next_return() {
    // Targets limited to 24 MiB/s, so a resync of 64 MiB takes seconds and can be cut.
    let fs = slow_mirrored_pair();
    let m = fs.mnt_s();
    let g = &groups(m)[0];
    let secondary = g["secondary"]["id"].as_u64().unwrap();
    let victim = service_of_target(&fs, secondary);
    std::fs::write(fs.path("before"), random_bytes(20, 1 << 20)).unwrap();
    fs.kill9(&victim);
    // Written while the secondary is away: the primary lists it as dirty.
    let data: Vec<Vec<u8>> = (0..4).map(|i| random_bytes(21 + i, 16 << 20)).collect();
    for (i, d) in data.iter().enumerate() {
        std::fs::write(fs.path(&format!("f{i}")), d).unwrap();
    }
    assert_eq!(groups(m)[0]["secondary"]["state"], "needs-resync");
    // It returns; the resync starts; it dies again in the middle.
    fs.reup();
    wait_for("the resync to start", Duration::from_secs(30), || groups(m)[0]["secondary"]["state"] == "resyncing");
    std::thread::sleep(Duration::from_millis(700));
    let g = &groups(m)[0];
    assert_eq!(g["secondary"]["state"], "resyncing", "the resync ended before the kill: {g}");
    fs.kill9(&victim);
    wait_for("the cut resync noticed", Duration::from_secs(30), || {
        groups(m)[0]["secondary"]["state"] == "needs-resync"
    });
    // A write meanwhile joins what the next resync copies.
    let late = random_bytes(30, 3 << 20);
    std::fs::write(fs.path("late"), &late).unwrap();
    fs.reup();
    wait_for("the resync to finish", Duration::from_secs(60), || groups(m)[0]["secondary"]["state"] == "good");
    assert_eq!(assert_buddies_equal(&fs, m), vec![6]);
    for (i, d) in data.iter().enumerate() {
        assert!(std::fs::read(fs.path(&format!("f{i}"))).unwrap() == *d, "f{i}");
    }
    assert_eq!(std::fs::read(fs.path("late")).unwrap(), late);
    let out = hivefs(&["fsck", "--mount", m]);
    assert!(out.status.success(), "fsck: {}", String::from_utf8_lossy(&out.stdout));

    // A secondary copy damaged behind HiveFS's back: fsck finds it, --repair resyncs it.
    let g = &groups(m)[0];
    let sec = g["secondary"]["id"].as_u64().unwrap();
    let root = fs.target_dirs()[&sec].join("mirror/chunks");
    let victim_chunk = std::fs::read_dir(&root)
        .unwrap()
        .flat_map(|d| std::fs::read_dir(d.unwrap().path()).unwrap())
        .map(|f| f.unwrap().path())
        .next()
        .expect("a mirrored chunk file on the secondary");
    std::fs::OpenOptions::new().write(true).open(&victim_chunk).unwrap().set_len(100).unwrap();
    let out = hivefs(&["fsck", "--mount", m]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "fsck must report the damaged copy: {text}");
    assert!(text.contains("buddy-mismatch"), "{text}");
    let out = hivefs(&["fsck", "--repair", "--mount", m]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("full resync of buddy group"), "{out:?}");
    wait_for("the repair's resync", Duration::from_secs(60), || groups(m)[0]["secondary"]["state"] == "good");
    assert_eq!(assert_buddies_equal(&fs, m), vec![6]);
    let out = hivefs(&["fsck", "--mount", m]);
    assert!(out.status.success(), "fsck after the repair: {}", String::from_utf8_lossy(&out.stdout));

    // One byte changed, the length kept: fsck compares the contents too.
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().read(true).write(true).open(&victim_chunk).unwrap();
        let mut b = [0u8; 1];
        f.read_exact_at(&mut b, 50).unwrap();
        f.write_all_at(&[b[0] ^ 0xff], 50).unwrap();
    }
    let out = hivefs(&["fsck", "--mount", m]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "fsck must report the changed byte: {text}");
    assert!(text.contains("buddy-mismatch") && text.contains("contents differ"), "{text}");
    hivefs(&["fsck", "--repair", "--mount", m]);
    wait_for("the second repair's resync", Duration::from_secs(60), || groups(m)[0]["secondary"]["state"] == "good");
    assert_eq!(assert_buddies_equal(&fs, m), vec![6]);
    fs.assert_fsck_clean();
}

#[test]
fn a_full_secondary_degrades_its_group_and_writes_go_on() {
    let fs = TestFs::up(&["--storage", "2", "--targets-per-storage", "1", "--mirror"]);
    let m = fs.mnt_s();
    let sec = groups(m)[0]["secondary"]["id"].as_u64().unwrap();
    // The secondary's mirrored chunk files on an 8 MiB file system.
    let chunks = fs.target_dirs()[&sec].join("mirror/chunks");
    let st = std::process::Command::new("mount").args(["-t", "tmpfs", "-o", "size=8m", "tmpfs"]).arg(&chunks).status();
    assert!(st.unwrap().success());
    let data = random_bytes(40, 32 << 20);
    std::fs::write(fs.path("big"), &data).expect("a write goes on when the secondary's disk is full");
    assert_eq!(std::fs::read(fs.path("big")).unwrap(), data);
    let g = &groups(m)[0];
    // Degraded; the primary may already be trying a resync (which fails again while
    // the disk is full).
    let state = g["secondary"]["state"].as_str().unwrap_or_default();
    assert!(["needs-resync", "resyncing"].contains(&state), "{g}");
    assert_eq!(g["epoch"], 0, "no switch: the primary lives");
    // Space again: the secondary is resynced.
    let st = std::process::Command::new("umount").arg("-l").arg(&chunks).status();
    assert!(st.unwrap().success());
    wait_for("the resync after space came back", Duration::from_secs(60), || {
        groups(m)[0]["secondary"]["state"] == "good"
    });
    assert_eq!(assert_buddies_equal(&fs, m), vec![1]);
}

/// Bytes the storage services have served to read over TCP (their metrics).
fn served_reads(fs: &TestFs) -> f64 {
    let st: serde_json::Value = serde_json::from_str(&hivefs_ok(&["status", "--dir", fs.dir_s(), "--json"])).unwrap();
    let mut sum = 0.0;
    for s in st["services"].as_array().unwrap() {
        let Some(url) = s["metrics"].as_str().filter(|_| s["name"].as_str().is_some_and(|n| n.starts_with("storage")))
        else {
            continue;
        };
        let o = std::process::Command::new("curl").args(["-sf", "--max-time", "5", url]).output().unwrap();
        assert!(o.status.success(), "{url} does not answer");
        for l in String::from_utf8_lossy(&o.stdout).lines() {
            if l.starts_with("hivefs_target_io_bytes_total{") && l.contains("direction=\"read\"") {
                sum += l.rsplit(' ').next().unwrap().parse::<f64>().unwrap();
            }
        }
    }
    sum
}

/// A mount on the primaries' host reads a mirrored file's chunks itself
/// (short-circuit, read-only descriptors the primaries hand out while their
/// lease lasts): the services serve only the first read of each chunk file.
#[test]
fn a_mirrored_file_is_read_through_the_primaries_descriptors() {
    let fs = TestFs::up(&["--storage", "2", "--targets-per-storage", "1", "--mirror", "--chunk-size", "1m"]);
    let data = random_bytes(80, 8 << 20);
    std::fs::write(fs.path("f"), &data).unwrap();
    assert_eq!(fs.entry_info("f")["mirrored"], true);
    let before = served_reads(&fs);
    for _ in 0..4 {
        assert!(std::fs::read(fs.path("f")).unwrap() == data, "contents read back");
    }
    let over_tcp = served_reads(&fs) - before;
    eprintln!("{over_tcp} of {} bytes read came over TCP", 4 * data.len());
    assert!(over_tcp < data.len() as f64, "{over_tcp} bytes of 4 reads of {} went over TCP", data.len());
    // Both copies stay equal, and the file is still written through the primaries.
    std::fs::write(fs.path("f"), b"short now").unwrap();
    assert_eq!(std::fs::read(fs.path("f")).unwrap(), b"short now");
    assert_buddies_equal(&fs, fs.mnt_s());
}
