//! Multi-host tests: every service on its own "host" (a network namespace of a
//! `hivefs-testbed` test bed), bound to that host's address, started by hand as an
//! administrator would; clients mount from their own hosts. Needs root.

mod common;
#[path = "common/netcluster.rs"]
mod netcluster;

use common::{random_bytes, targets_of};
use netcluster::{bounded, NetCluster, IO_TIMEOUT_MS};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const MIB: usize = 1 << 20;

fn check_same(path: &Path, want: &[u8], what: &str) {
    let got = std::fs::read(path).unwrap_or_else(|e| panic!("{what}: read {}: {e}", path.display()));
    assert_eq!(got.len(), want.len(), "{what}: size of {}", path.display());
    assert!(got == want, "{what}: contents of {} differ", path.display());
}

#[test]
fn two_clients_see_each_others_data() {
    let c = NetCluster::start("mh-data", 2, 4, 2);
    let (m1, m2) = (c.clients[0].mnt.clone(), c.clients[1].mnt.clone());
    let pat: serde_json::Value =
        serde_json::from_str(&c.hivefs_ok_on(&c.clients[0].host, &["pattern", "get", "--json", m1.to_str().unwrap()]))
            .unwrap();
    let cs = pat["chunk_size"].as_u64().unwrap() as usize;
    let sizes = [0, 1, cs - 1, cs + 1, 5 * MIB + 4097];

    for (writer, reader, dir, seed) in [(&m1, &m2, "from1", 100u64), (&m2, &m1, "from2", 200)] {
        std::fs::create_dir(writer.join(dir)).unwrap();
        let files: Vec<(String, Vec<u8>)> =
            sizes.iter().enumerate().map(|(i, &n)| (format!("{dir}/f{i}"), random_bytes(seed + i as u64, n))).collect();
        for (rel, data) in &files {
            std::fs::write(writer.join(rel), data)
                .unwrap_or_else(|e| panic!("write {rel} through {}: {e}", writer.display()));
        }
        for (i, (rel, data)) in files.iter().enumerate() {
            check_same(
                &reader.join(rel),
                data,
                &format!("seed {}, written through {}", seed + i as u64, writer.display()),
            );
        }
    }

    // The big file is striped over targets of both storage hosts.
    let info = c.entry_info(&m1.join("from1/f4"));
    let node_of: BTreeMap<u64, u64> =
        c.targets().iter().map(|t| (t["id"].as_u64().unwrap(), t["node"].as_u64().unwrap())).collect();
    let nodes: std::collections::BTreeSet<u64> = targets_of(&info).iter().map(|t| node_of[t]).collect();
    for s in &c.storage {
        let id = c.node_id_of(&s.host);
        assert!(nodes.contains(&id), "no target of {} (node {id}) in {info}", s.host.name);
    }
}

/// States of the cut host's targets, each as the sequence of distinct states seen, and
/// the states seen of the other host's targets; polls until the cut ones are offline.
fn watch_targets(c: &NetCluster, cut: &[u64], other: &[u64]) -> (BTreeMap<u64, Vec<String>>, Vec<String>) {
    let mut seq: BTreeMap<u64, Vec<String>> = cut.iter().map(|t| (*t, Vec::new())).collect();
    let mut others = Vec::new();
    let start = Instant::now();
    loop {
        for t in c.targets() {
            let (id, state) = (t["id"].as_u64().unwrap(), t["state"].as_str().unwrap().to_string());
            if let Some(s) = seq.get_mut(&id) {
                if s.last() != Some(&state) {
                    s.push(state);
                }
            } else if other.contains(&id) && !others.contains(&state) {
                others.push(state);
            }
        }
        if seq.values().all(|s| s.last().is_some_and(|x| x == "offline")) {
            return (seq, others);
        }
        assert!(start.elapsed() < Duration::from_secs(30), "the cut host's targets did not go offline: {seq:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn link_cut_to_one_storage_host() {
    let c = NetCluster::start("mh-cut", 2, 2, 1);
    let (host_a, host_b) = (c.storage[0].host.clone(), c.storage[1].host.clone());
    let (ta, tb) = (c.target_ids_of(&host_a), c.target_ids_of(&host_b));
    assert!(!ta.is_empty() && !tb.is_empty());
    // One storage pool per host, one directory per pool.
    let mnt = c.clients[0].mnt.clone();
    let client = c.clients[0].host.clone();
    for (pool, targets, dir) in [("hosta", &ta, "a"), ("hostb", &tb, "b")] {
        let id = c.create_pool(pool);
        c.move_targets(pool, targets);
        let d = mnt.join(dir);
        std::fs::create_dir(&d).unwrap();
        c.hivefs_ok_on(&client, &["pattern", "set", "--pool", &id.to_string(), d.to_str().unwrap()]);
    }
    let (file_a, file_b) = (mnt.join("a/file"), mnt.join("b/file"));
    let (data_a, data_b) = (random_bytes(1, 2 * MIB + 3), random_bytes(2, 2 * MIB + 5));
    std::fs::write(&file_a, &data_a).unwrap();
    std::fs::write(&file_b, &data_b).unwrap();
    // Written to during the cut; a failed write may still land later, so it is not read back.
    let victim_a = mnt.join("a/victim");
    std::fs::write(&victim_a, random_bytes(5, 64 * 1024)).unwrap();
    let on_a = targets_of(&c.entry_info(&file_a));
    let on_b = targets_of(&c.entry_info(&file_b));
    assert!(!on_a.is_empty() && on_a.iter().all(|t| ta.contains(t)), "a/file on {on_a:?}, host A has {ta:?}");
    assert!(!on_b.is_empty() && on_b.iter().all(|t| tb.contains(t)), "b/file on {on_b:?}, host B has {tb:?}");

    c.tb.cut(&host_a).unwrap();
    std::thread::scope(|s| {
        let watcher = s.spawn(|| watch_targets(&c, &ta, &tb));

        // I/O on A's files fails (it must not hang), while B's file keeps working meanwhile.
        let mut read = Command::new("dd");
        read.arg(format!("if={}", file_a.display())).args(["of=/dev/null", "bs=1M"]);
        let read_a = bounded("a read of A's file", read);
        let mut write = Command::new("dd");
        write.args(["if=/dev/zero", "bs=8k", "count=1", "seek=1", "conv=notrunc,fsync"]);
        write.arg(format!("of={}", victim_a.display()));
        let write_a = bounded("a write to A's file", write);

        check_same(&file_b, &data_b, "B's file while A is cut");
        let new_b = random_bytes(3, MIB + 17);
        std::fs::write(mnt.join("b/new"), &new_b).expect("write a new file on host B while A is cut");
        check_same(&mnt.join("b/new"), &new_b, "B's new file while A is cut");

        let limit = Duration::from_secs(60);
        for (what, op) in [("read of A's file", read_a), ("write to A's file", write_a)] {
            let (out, took) = op.wait(limit);
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success(), "{what} succeeded over a cut link");
            assert!(
                err.contains("Input/output error") || err.contains("Connection timed out"),
                "{what} failed otherwise than with EIO or ETIMEDOUT: {err}"
            );
            eprintln!(
                "{what} failed after {took:?} (I/O timeout {IO_TIMEOUT_MS} ms): {}",
                err.lines().next().unwrap_or("")
            );
        }

        let (seq, others) = watcher.join().expect("target state watcher");
        eprintln!("after the cut, host A's targets went {seq:?}; host B's were {others:?}");
        for (t, states) in &seq {
            let po = states.iter().position(|s| s == "probably-offline");
            let off = states.iter().position(|s| s == "offline");
            assert!(
                po.is_some() && po < off,
                "target {t} of the cut host went {states:?}, want probably-offline then offline"
            );
        }
        assert!(!others.iter().any(|s| s == "offline"), "host B's targets went {others:?} while only A was cut");
    });

    c.tb.heal(&host_a).unwrap();
    let healed = Instant::now();
    c.wait_for("host A's targets back online", Duration::from_secs(30), |c| {
        let t = c.targets();
        ta.iter().all(|id| t.iter().any(|x| x["id"] == *id && x["state"] == "online"))
    });
    eprintln!("host A's targets online again {:?} after the heal", healed.elapsed());
    // The same mount, without remounting: A's file reads and writes again.
    check_same(&file_a, &data_a, "A's file after heal");
    let again = random_bytes(4, MIB + 1);
    std::fs::write(&file_a, &again).expect("write A's file after heal");
    check_same(&file_a, &again, "A's file rewritten after heal");
}

#[test]
fn link_cut_to_the_mgmtd_and_metadata_hosts() {
    let c = NetCluster::start("mh-mdcut", 1, 2, 1);
    let mnt = c.clients[0].mnt.clone();
    let data = random_bytes(7, MIB + 9);
    std::fs::write(mnt.join("f"), &data).unwrap();

    // mgmtd unreachable: clients and servers need it only for registration, heartbeats
    // and the cluster view, so namespace and data operations go on.
    c.tb.cut(&c.mgmtd_host).unwrap();
    let during = random_bytes(8, 3 * MIB + 1);
    std::fs::create_dir(mnt.join("during-mgmtd-cut")).expect("mkdir while mgmtd is cut off");
    std::fs::write(mnt.join("during-mgmtd-cut/g"), &during).expect("write while mgmtd is cut off");
    check_same(&mnt.join("during-mgmtd-cut/g"), &during, "a file written while mgmtd was cut off");
    check_same(&mnt.join("f"), &data, "an old file while mgmtd is cut off");
    std::thread::sleep(Duration::from_millis(netcluster::OFFLINE_MS + 500));
    c.tb.heal(&c.mgmtd_host).unwrap();
    c.wait_for("every node and target back online after mgmtd's link returned", Duration::from_secs(30), |c| {
        c.targets().iter().all(|t| t["state"] == "online") && c.nodes().iter().all(|n| n["state"] == "online")
    });

    // The metadata host unreachable: namespace operations fail within the I/O timeout,
    // a file opened before goes on reading (the data path needs only the storage hosts).
    let mut held = std::fs::File::open(mnt.join("f")).unwrap();
    c.tb.cut(&c.meta_host).unwrap();
    let mut touch = Command::new("touch");
    touch.arg(mnt.join("new"));
    let create = bounded("a create while the metadata host is cut off", touch);
    let mut again = Vec::new();
    std::io::Read::read_to_end(&mut held, &mut again).expect("read an open file while the metadata host is cut off");
    assert!(again == data, "an open file read while the metadata host was cut off differs");
    let (out, took) = create.wait(Duration::from_secs(60));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a create succeeded with the metadata host cut off");
    assert!(
        err.contains("Input/output error") || err.contains("Connection timed out"),
        "a create failed otherwise than with EIO or ETIMEDOUT: {err}"
    );
    eprintln!("a create failed after {took:?} with the metadata host cut off (I/O timeout {IO_TIMEOUT_MS} ms)");
    drop(held);
    c.tb.heal(&c.meta_host).unwrap();
    let healed = Instant::now();
    c.wait_for("creates to work again after the metadata host's link returned", Duration::from_secs(30), |_| {
        std::fs::write(mnt.join("after"), b"back").is_ok()
    });
    eprintln!("namespace operations work again {:?} after the heal", healed.elapsed());
    assert_eq!(std::fs::read(mnt.join("after")).unwrap(), b"back");
    check_same(&mnt.join("during-mgmtd-cut/g"), &during, "the file written while mgmtd was cut off, at the end");
}

/// A checksummed fio write-and-verify of `size` at `rate` in the background.
fn fio_verify(path: &Path, size: &str, rate: &str) -> netcluster::Bounded {
    let mut fio = Command::new("fio");
    fio.args([
        "--name=mirror",
        "--ioengine=psync",
        "--rw=write",
        "--bs=256k",
        &format!("--size={size}"),
        &format!("--rate={rate}"),
        "--verify=crc32c",
        "--do_verify=1",
        "--verify_fatal=1",
        "--end_fsync=1",
    ]);
    fio.arg(format!("--filename={}", path.display()));
    bounded("fio write and verify", fio)
}

/// Mirrored chunk files of a target directory (name → bytes).
fn mirrored_chunks(target: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    for sub in std::fs::read_dir(target.join("mirror/chunks")).unwrap() {
        for f in std::fs::read_dir(sub.unwrap().path()).unwrap() {
            let f = f.unwrap().path();
            out.insert(f.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read(&f).unwrap());
        }
    }
    out
}

/// `hivefs mirror list --json` from the client host (storage groups).
fn mirror_list(c: &NetCluster) -> Vec<serde_json::Value> {
    groups_of(c, "storage")
}

/// `hivefs mirror list --json --type KIND` from the client host; empty when it fails.
fn groups_of(c: &NetCluster, kind: &str) -> Vec<serde_json::Value> {
    let m = c.clients[0].mnt.to_str().unwrap().to_string();
    let out = c.hivefs_on(&c.clients[0].host, &["mirror", "list", "--json", "--type", kind, "--mount", &m]);
    serde_json::from_slice::<serde_json::Value>(&out.stdout)
        .ok()
        .and_then(|v| v.as_array().cloned())
        .unwrap_or_default()
}

/// Both metadata groups have both members good.
fn meta_groups_good(c: &NetCluster) -> bool {
    let gs = groups_of(c, "meta");
    gs.len() == 2 && gs.iter().all(|g| g["primary"]["state"] == "good" && g["secondary"]["state"] == "good")
}

/// A mirrored directory `d` on a cluster of 2 storage hosts x 2 targets (one group's
/// primary on each host); returns the storage service holding group 1's primary and
/// each target's directory.
fn mirrored_setup(c: &NetCluster) -> (String, BTreeMap<u64, std::path::PathBuf>) {
    let client = c.clients[0].host.clone();
    let mnt = c.clients[0].mnt.clone();
    let m = mnt.to_str().unwrap();
    c.hivefs_ok_on(&client, &["mirror", "create", "--type", "storage", "--auto", "--mount", m]);
    std::fs::create_dir(mnt.join("d")).unwrap();
    c.hivefs_ok_on(&client, &["pattern", "set", "--mirror", mnt.join("d").to_str().unwrap()]);
    let mut service = BTreeMap::new();
    let mut dirs = BTreeMap::new();
    for (i, s) in c.storage.iter().enumerate() {
        for (t, dir) in c.target_ids_of(&s.host).into_iter().zip(&s.targets) {
            service.insert(t, format!("storage{}", i + 1));
            dirs.insert(t, dir.clone());
        }
    }
    let groups = mirror_list(c);
    assert_eq!(groups.len(), 2, "{groups:?}");
    let primaries: std::collections::BTreeSet<&String> =
        groups.iter().map(|g| &service[&g["primary"]["id"].as_u64().unwrap()]).collect();
    assert_eq!(primaries.len(), 2, "one primary per host: {groups:?}");
    for g in &groups {
        let (p, s) = (g["primary"]["id"].as_u64().unwrap(), g["secondary"]["id"].as_u64().unwrap());
        assert_ne!(service[&p], service[&s], "a group's targets are on different hosts: {g}");
    }
    (service[&groups[0]["primary"]["id"].as_u64().unwrap()].clone(), dirs)
}

/// Both members of every group hold the same mirrored chunk files.
fn assert_buddies_equal(c: &NetCluster, dirs: &BTreeMap<u64, std::path::PathBuf>) {
    for g in mirror_list(c) {
        let (a, b) = (&dirs[&g["primary"]["id"].as_u64().unwrap()], &dirs[&g["secondary"]["id"].as_u64().unwrap()]);
        let (x, y) = (mirrored_chunks(a), mirrored_chunks(b));
        assert!(!x.is_empty(), "no mirrored chunk file in {}", a.display());
        assert_eq!(x.keys().collect::<Vec<_>>(), y.keys().collect::<Vec<_>>(), "{} vs {}", a.display(), b.display());
        for (name, bytes) in &x {
            assert!(bytes == &y[name], "chunk file {name} differs between {} and {}", a.display(), b.display());
        }
    }
}

/// Waits until every member of every group is good and group 1 switched over once.
fn wait_all_good(c: &NetCluster, limit: Duration) {
    c.wait_for("every buddy group good again, group 1 switched over", limit, |c| {
        let gs = mirror_list(c);
        !gs.is_empty()
            && gs[0]["epoch"] == 1
            && gs.iter().all(|g| g["primary"]["state"] == "good" && g["secondary"]["state"] == "good")
    });
}

#[test]
fn mirrored_fio_survives_kill_of_a_storage_primary() {
    let mut c = NetCluster::start("mh-mkill", 2, 2, 1);
    let (victim, dirs) = mirrored_setup(&c);
    let file = c.clients[0].mnt.join("d/fio");
    let fio = fio_verify(&file, "96m", "24m");
    std::thread::sleep(Duration::from_millis(1500));
    let killed = Instant::now();
    c.kill9(&victim);
    let (out, took) = fio.wait(Duration::from_secs(120));
    assert!(
        out.status.success(),
        "fio write+verify across a primary's kill -9 failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("fio finished {:?} after the kill ({took:?} in all)", killed.elapsed());
    // The killed server returns as secondary; it is resynced and equal to the new primary.
    c.restart(&victim);
    wait_all_good(&c, Duration::from_secs(60));
    assert_buddies_equal(&c, &dirs);
}

#[test]
fn mirrored_fio_survives_a_link_cut_to_a_primary() {
    let c = NetCluster::start("mh-mcut", 2, 2, 1);
    let (victim, dirs) = mirrored_setup(&c);
    let host =
        c.storage.iter().enumerate().find(|(i, _)| format!("storage{}", i + 1) == victim).unwrap().1.host.clone();
    let file = c.clients[0].mnt.join("d/fio");
    let fio = fio_verify(&file, "96m", "24m");
    std::thread::sleep(Duration::from_millis(1500));
    c.tb.cut(&host).unwrap();
    let (out, took) = fio.wait(Duration::from_secs(120));
    assert!(
        out.status.success(),
        "fio write+verify across a cut link to the primary failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("fio finished in {took:?} across the cut");
    c.tb.heal(&host).unwrap();
    wait_all_good(&c, Duration::from_secs(60));
    assert_buddies_equal(&c, &dirs);
}

/// `hivefs fsck` from the first client host finds nothing.
fn assert_fsck_clean(c: &NetCluster) {
    let m = c.clients[0].mnt.to_str().unwrap();
    let out = c.hivefs_on(&c.clients[0].host, &["fsck", "--mount", m]);
    assert!(
        out.status.success(),
        "fsck: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A cluster with two metadata hosts (one storage host, one client): the cluster,
/// the client host, its mount point and that as a string.
fn two_metadata_hosts(tag: &str) -> (NetCluster, hivefs_testbed::Host, std::path::PathBuf, String) {
    let mut c = NetCluster::start(tag, 1, 1, 1);
    c.add_meta("meta2");
    let (client, mnt) = (c.clients[0].host.clone(), c.clients[0].mnt.clone());
    let m = mnt.to_str().unwrap().to_string();
    (c, client, mnt, m)
}

#[test]
fn a_metadata_primary_behind_a_cut_link_is_replaced_and_resynced() {
    let (c, client, mnt, m) = two_metadata_hosts("mh-mdcut");
    for i in 0..6 {
        std::fs::create_dir(mnt.join(format!("d{i}"))).unwrap();
        std::fs::write(mnt.join(format!("d{i}/f")), format!("file {i}")).unwrap();
    }
    // The hosts are network namespaces of one machine: one hostname, so --force.
    c.hivefs_ok_on(&client, &["mirror", "create", "--type", "meta", "--auto", "--force", "--mount", &m]);
    let groups = |c: &NetCluster| groups_of(c, "meta");
    c.wait_for("both metadata groups good", Duration::from_secs(60), meta_groups_good);
    // The root's namespace is the first metadata host's (node 1): cut its link.
    let root = c.entry_info(&mnt)["owner_meta_node"].as_u64().unwrap();
    let meta_host = c.meta_host.clone();
    let host_of_root = if root == 1 { meta_host } else { panic!("root owned by node {root}") };
    c.tb.cut(&host_of_root).unwrap();
    // A create through the mount waits for the switch-over, then succeeds.
    let mut touch = Command::new("sh");
    touch.arg("-c").arg(format!("echo after > {}", mnt.join("d0/after-cut").display()));
    let (out, took) = netcluster::bounded("a create across the cut", touch).wait(Duration::from_secs(90));
    assert!(out.status.success(), "create across a cut link failed: {}", String::from_utf8_lossy(&out.stderr));
    eprintln!("a create across the cut link took {took:?}");
    let g = groups(&c).into_iter().find(|g| g["secondary"]["id"] == root).expect("the root's group switched over");
    assert_eq!(g["epoch"], 1, "{g}");
    for i in 0..6 {
        assert_eq!(std::fs::read_to_string(mnt.join(format!("d{i}/f"))).unwrap(), format!("file {i}"));
    }
    // The old primary, which lost mgmtd too, never served alone; healed, it is resynced.
    c.tb.heal(&host_of_root).unwrap();
    c.wait_for("both metadata groups good again", Duration::from_secs(60), meta_groups_good);
    assert_eq!(std::fs::read_to_string(mnt.join("d0/after-cut")).unwrap(), "after\n");
    assert_fsck_clean(&c);
}

/// One storm worker, a shell in a child process (I/O that waits for a failover stays
/// out of the test's threads): in `$1` it creates, renames, moves to `$2` (another
/// namespace's directory) and unlinks, appending each acknowledged operation to the
/// local file `$4`; it stops once `$5` exists (after at least 50 rounds) and fails at
/// the first error.
const STORM: &str = r#"set -eu
mine=$1 other=$2 w=$3 log=$4 stop=$5
i=0
while [ ! -e "$stop" ] || [ "$i" -lt 50 ]; do
  n="w$w-$i"
  printf %s "$n" > "$mine/$n"; echo "create $n" >> "$log"
  case $((i % 6)) in
    2) mv "$mine/$n" "$mine/$n-r"; echo "rename $n" >> "$log" ;;
    4) mv "$mine/$n" "$other/$n"; echo "move $n" >> "$log" ;;
    5) rm "$mine/$n"; echo "unlink $n" >> "$log" ;;
  esac
  i=$((i + 1))
done
"#;

/// What the storm logs say each directory holds: (worker's own, the other's).
fn storm_model(log: &str) -> (std::collections::BTreeSet<String>, std::collections::BTreeSet<String>) {
    let (mut here, mut there) = (std::collections::BTreeSet::new(), std::collections::BTreeSet::new());
    for line in log.lines() {
        let (op, n) = line.split_once(' ').unwrap_or_else(|| panic!("storm log line {line:?}"));
        let n = n.to_string();
        match op {
            "create" => {
                here.insert(n);
            }
            "rename" => {
                here.remove(&n);
                here.insert(format!("{n}-r"));
            }
            "move" => {
                here.remove(&n);
                there.insert(n);
            }
            "unlink" => {
                here.remove(&n);
            }
            _ => panic!("storm log line {line:?}"),
        }
    }
    (here, there)
}

#[test]
fn a_metadata_primary_killed_during_a_storm_loses_and_doubles_nothing() {
    let (mut c, client, mnt, m) = two_metadata_hosts("mh-mdstorm");
    c.hivefs_ok_on(&client, &["mirror", "create", "--type", "meta", "--auto", "--force", "--mount", &m]);
    c.wait_for("both metadata groups good", Duration::from_secs(60), meta_groups_good);
    // One directory in each namespace (the chooser decides: names are tried).
    let mut by_owner = BTreeMap::new();
    for k in 0..20 {
        let d = mnt.join(format!("s{k}"));
        std::fs::create_dir(&d).unwrap();
        by_owner.entry(c.entry_info(&d)["owner_meta_node"].as_u64().unwrap()).or_insert(d);
        if by_owner.len() == 2 {
            break;
        }
    }
    assert_eq!(by_owner.len(), 2, "directories in both namespaces");
    let dirs: Vec<std::path::PathBuf> = by_owner.into_values().collect();
    // Settle: the mount knows both groups before anything dies.
    std::thread::sleep(Duration::from_secs(4));
    let stop = c.tmp.path().join("storm-stop");
    let logs: Vec<std::path::PathBuf> = (0..2).map(|w| c.tmp.path().join(format!("storm{w}.log"))).collect();
    let workers: Vec<netcluster::Bounded> = (0..2)
        .map(|w| {
            let mut sh = Command::new("sh");
            sh.args(["-c", STORM, "storm"]).arg(&dirs[w]).arg(&dirs[1 - w]).arg(w.to_string()).arg(&logs[w]).arg(&stop);
            bounded(&format!("storm worker {w}"), sh)
        })
        .collect();
    std::thread::sleep(Duration::from_millis(1500));
    // The root's namespace is the first metadata host's (node 1): kill its server.
    let root = c.entry_info(&mnt)["owner_meta_node"].as_u64().unwrap();
    assert_eq!(root, 1, "the root is served by the first metadata node");
    let killed = Instant::now();
    c.kill9("meta");
    c.wait_for("the switch-over", Duration::from_secs(30), |c| {
        groups_of(c, "meta").iter().any(|g| g["secondary"]["id"] == root && g["epoch"] == 1)
    });
    eprintln!("switched over {:?} after the kill", killed.elapsed());
    std::thread::sleep(Duration::from_secs(3));
    std::fs::write(&stop, b"").unwrap();
    for (w, worker) in workers.into_iter().enumerate() {
        let (out, took) = worker.wait(Duration::from_secs(120));
        assert!(
            out.status.success(),
            "storm worker {w} failed after {took:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let mut expect = [std::collections::BTreeSet::new(), std::collections::BTreeSet::new()];
    let mut ops = 0;
    for (w, log) in logs.iter().enumerate() {
        let text = std::fs::read_to_string(log).unwrap();
        ops += text.lines().count();
        let (here, there) = storm_model(&text);
        expect[w].extend(here);
        expect[1 - w].extend(there);
    }
    eprintln!("{ops} acknowledged storm operations");
    // Every acknowledged entry exactly once: the listing is the model.
    for (w, d) in dirs.iter().enumerate() {
        let got: std::collections::BTreeSet<String> =
            std::fs::read_dir(d).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        assert_eq!(got, expect[w], "entries of {}", d.display());
        for name in &got {
            let body = std::fs::read_to_string(d.join(name)).unwrap();
            assert!(name.starts_with(&body), "{}/{name} holds {body:?}", d.display());
        }
    }
    // The killed server returns as secondary and is resynced; fsck is clean.
    c.restart("meta");
    c.wait_for("both metadata groups good again", Duration::from_secs(60), meta_groups_good);
    assert_fsck_clean(&c);
}

/// Copies local `src` to `dst` inside the mount in a child process, bounded.
fn copy_in(src: &Path, dst: &Path) {
    let mut cp = Command::new("cp");
    cp.arg(src).arg(dst);
    let (out, _) = bounded("cp into the mount", cp).wait(Duration::from_secs(90));
    assert!(out.status.success(), "cp {} {}: {}", src.display(), dst.display(), String::from_utf8_lossy(&out.stderr));
}

#[test]
fn a_storage_resync_interrupted_by_a_kill_goes_on_after_the_next_return() {
    let mut c = NetCluster::start("mh-resync", 2, 2, 1);
    let (primary_service, dirs) = mirrored_setup(&c);
    let away = if primary_service == "storage1" { "storage2" } else { "storage1" };
    let away_host = c.storage[if away == "storage1" { 0 } else { 1 }].host.clone();
    let mnt = c.clients[0].mnt.clone();
    let local = c.tmp.path().join("local");
    std::fs::create_dir(&local).unwrap();
    let mut files = Vec::new();
    for (i, len) in [1, 12, 12, 12].into_iter().enumerate() {
        let src = local.join(format!("f{i}"));
        std::fs::write(&src, random_bytes(60 + i as u64, len * MIB)).unwrap();
        files.push((src, mnt.join(format!("d/f{i}"))));
    }
    copy_in(&files[0].0, &files[0].1);
    // The server of group 1's secondary (and group 2's primary) dies: group 2 switches
    // over; what is written meanwhile is in its groups' dirty lists.
    c.kill9(away);
    for (src, dst) in &files[1..] {
        copy_in(src, dst);
    }
    let state = |c: &NetCluster, want: &str| {
        let gs = mirror_list(c);
        gs.len() == 2 && gs.iter().all(|g| g["secondary"]["state"] == want)
    };
    c.wait_for("both groups degraded", Duration::from_secs(30), |c| state(c, "needs-resync"));
    // It returns behind a slow link, so its resync takes seconds; it dies in the middle.
    c.tb.shape(&away_host, 64_000_000).unwrap();
    c.restart(away);
    c.wait_for("a resync to start", Duration::from_secs(30), |c| {
        mirror_list(c).iter().any(|g| g["secondary"]["state"] == "resyncing")
    });
    std::thread::sleep(Duration::from_millis(1000));
    let gs = mirror_list(&c);
    assert!(gs.iter().any(|g| g["secondary"]["state"] == "resyncing"), "the resyncs ended before the kill: {gs:?}");
    c.kill9(away);
    c.wait_for("the cut resyncs noticed", Duration::from_secs(30), |c| state(c, "needs-resync"));
    // A write meanwhile joins what the next resync copies.
    let late = local.join("late");
    std::fs::write(&late, random_bytes(70, 3 * MIB)).unwrap();
    copy_in(&late, &mnt.join("d/late"));
    files.push((late, mnt.join("d/late")));
    c.tb.unshape(&away_host).unwrap();
    c.restart(away);
    c.wait_for("every group good again", Duration::from_secs(90), |c| state(c, "good"));
    assert_buddies_equal(&c, &dirs);
    for (src, dst) in &files {
        check_same(dst, &std::fs::read(src).unwrap(), "after the interrupted resync");
    }
    assert_fsck_clean(&c);
}
