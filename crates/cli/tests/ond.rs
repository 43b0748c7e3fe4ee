//! `hivefs ond` across machines: test bed hosts that each run sshd and have their own
//! hostname, /etc/hosts and directories (common/sshbed.rs). The instance is started
//! over ssh from the first host, every host does I/O through its own mount, and stop
//! must finish in bounded time with a node dead. Needs root.

mod common;
#[path = "common/sshbed.rs"]
mod sshbed;

use common::out;
use sshbed::SshBed;
use std::process::Output;
use std::time::{Duration, Instant};

/// Arguments every ond command of the bed takes.
fn reach(bed: &SshBed, name: &str) -> Vec<String> {
    vec![
        "--nodes".into(),
        bed.node_list(),
        "--name".into(),
        name.into(),
        "--ssh-config".into(),
        bed.ssh_config.display().to_string(),
        "--state-dir".into(),
        bed.state().display().to_string(),
        "--connect-timeout".into(),
        "2".into(),
    ]
}

fn start_args(bed: &SshBed, name: &str, extra: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = vec!["ond".into(), "start".into()];
    a.extend(reach(bed, name));
    a.extend(
        ["--data", &bed.data().display().to_string(), "--mount", &bed.mnt().display().to_string()]
            .iter()
            .map(|s| s.to_string()),
    );
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

fn run(bed: &SshBed, i: usize, args: &[String]) -> Output {
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    bed.hivefs(i, &a)
}

fn status_json(bed: &SshBed, name: &str) -> serde_json::Value {
    let mut a: Vec<String> = vec!["ond".into(), "status".into()];
    a.extend(reach(bed, name));
    a.push("--json".into());
    let o = run(bed, 0, &a);
    assert!(o.status.success(), "ond status: {}", out(&o));
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("status JSON: {e}: {}", out(&o)))
}

/// Nothing of an instance is left on host `i`: no hivefs process, no FUSE mount, no data.
fn assert_clean(bed: &SshBed, i: usize) {
    let node = &bed.hosts[i].name;
    assert_eq!(bed.hivefs_pids(i), Vec::<String>::new(), "hivefs processes left on {node}");
    assert_eq!(bed.fuse_mounts(i), Vec::<String>::new(), "mounts left on {node}");
    // (--delete-data removes the data directory itself when nothing else is in it.)
    for dir in ["data", "state"] {
        let left: Vec<_> = std::fs::read_dir(bed.own(node, dir))
            .map(|rd| rd.flatten().map(|e| e.file_name()).collect())
            .unwrap_or_default();
        assert!(left.is_empty(), "{dir} left on {node}: {left:?}");
    }
}

#[test]
fn ond_over_four_hosts_serves_io_everywhere_and_stops_with_a_node_dead() {
    let bed = SshBed::start("ond", 4);
    let bin = common::hivefs_bin().to_string();
    let mnt = bed.mnt().display().to_string();

    // Start, with per-job parameters.
    let o = run(
        &bed,
        0,
        &start_args(
            &bed,
            "job1",
            &[
                "--remote-bin",
                &bin,
                "--meta",
                "2",
                "--chunk-size",
                "256k",
                "--stripe",
                "3",
                "--cache-mode",
                "paged",
                "--set",
                "storage.heartbeat_interval_ms=500",
                "--set",
                "meta.heartbeat_interval_ms=500",
                "--set",
                "mgmtd.offline_after_ms=3000",
                "--set",
                "mgmtd.probably_offline_after_ms=1500",
            ],
        ),
    );
    assert!(o.status.success(), "ond start: {}", out(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("is mounted on"), "{}", out(&o));

    // Status: every node's services and mount, the instance document.
    let st = status_json(&bed, "job1");
    let inst = &st["instance"];
    assert_eq!(inst["root_pattern"]["chunk_size"], 256 * 1024, "{st:#}");
    assert_eq!(inst["root_pattern"]["stripe"], 3);
    assert_eq!(inst["cache_mode"], "paged");
    assert_eq!(inst["effective"]["storage@n3"]["heartbeat_interval_ms"], 500, "{st:#}");
    assert_eq!(inst["effective"]["meta@n2"]["heartbeat_interval_ms"], 500);
    assert!(inst["effective"]["meta@n3"].is_null(), "only the first 2 nodes run metadata");
    let nodes = st["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 4);
    for n in nodes {
        assert_eq!(n["reachable"], true, "{n:#}");
        assert_eq!(n["mounted"], true, "{n:#}");
        for s in n["services"].as_array().unwrap() {
            assert_eq!(s["running"], true, "{n:#}");
        }
    }
    // The same document lies beside the data.
    let doc: serde_json::Value =
        serde_json::from_slice(&std::fs::read(bed.own("n1", "data").join("instance.json")).unwrap()).unwrap();
    assert_eq!(doc["fs_uuid"], inst["fs_uuid"]);

    // IOR-like I/O from every node at once through its own mount.
    let handles: Vec<_> = (0..4)
        .map(|i| {
            let host = bed.hosts[i].clone();
            let (bin, mnt) = (bin.clone(), mnt.clone());
            std::thread::spawn(move || {
                host.command(&bin)
                    .args(["bench", "io", &mnt, "--ranks", "2", "--block-size", "8m", "--file-per-rank", "--reorder"])
                    .args(["--json", "--no-progress"])
                    .output()
                    .unwrap()
            })
        })
        .collect();
    for (i, h) in handles.into_iter().enumerate() {
        let o = h.join().unwrap();
        assert!(o.status.success(), "bench io on n{}: {}", i + 1, out(&o));
    }
    // What one node writes, every other reads; files carry the job's pattern.
    bed.sh_ok(
        0,
        &format!("head -c 3000000 /dev/urandom > {mnt}/shared && sha256sum < {mnt}/shared > {mnt}/shared.sum"),
    );
    let want = bed.sh_ok(0, &format!("cat {mnt}/shared.sum"));
    for i in 1..4 {
        assert_eq!(bed.sh_ok(i, &format!("sha256sum < {mnt}/shared")), want, "n{} reads other bytes", i + 1);
    }
    let info =
        String::from_utf8_lossy(&bed.hivefs(3, &["entry", "info", &format!("{mnt}/shared")]).stdout).into_owned();
    assert!(info.contains("256") && info.contains('3'), "entry info: {info}");

    // Memory of one node's services under that load (the instance's own report).
    let st = status_json(&bed, "job1");
    for n in st["nodes"].as_array().unwrap() {
        let peak_mib = n["total_peak_rss_kib"].as_u64().unwrap() / 1024;
        assert!(peak_mib < 300, "{}: services' peak RSS {peak_mib} MiB", n["name"]);
    }

    // Stage in and out with the copy spread over the 4 nodes: a tree on a file system
    // every host sees (here: the machine's disk outside the hosts' own directories).
    let src = bed.tmp.path().join("stage/src");
    std::fs::create_dir_all(src.join("sub")).unwrap();
    for i in 0..200 {
        std::fs::write(src.join("sub").join(format!("f{i}")), format!("file {i}\n").repeat(i + 1)).unwrap();
    }
    std::fs::write(src.join("big"), common::random_bytes(9, 20 << 20)).unwrap();
    std::os::unix::fs::symlink("sub/f1", src.join("link")).unwrap();
    bed.sh_ok(0, &format!("mkdir {mnt}/in"));
    let ond_cp = |srcs: &[String], dst: &str| {
        let mut a: Vec<String> = vec!["ond".into(), "cp".into()];
        a.extend(reach(&bed, "job1"));
        a.extend(["--remote-bin".into(), bin.clone(), "--range-size".into(), "4m".into(), "--json".into()]);
        a.extend(srcs.iter().cloned());
        a.push(dst.into());
        let o = run(&bed, 0, &a);
        assert!(o.status.success(), "ond cp: {}", out(&o));
        serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap()
    };
    let r = ond_cp(&[src.display().to_string()], &format!("{mnt}/in"));
    assert_eq!(r["nodes"].as_array().unwrap().len(), 4, "{r:#}");
    // (A file split into ranges counts in each part that copied one of its ranges.)
    assert!((201..=205).contains(&r["total"]["files"].as_u64().unwrap()), "{r:#}");
    let small: u64 = (0..200).map(|i| std::fs::metadata(src.join("sub").join(format!("f{i}"))).unwrap().len()).sum();
    assert_eq!(r["total"]["bytes"].as_u64().unwrap(), (20 << 20) + small, "every byte copied once: {r:#}");
    let busy = r["nodes"].as_array().unwrap().iter().filter(|n| n["summary"]["bytes"].as_u64().unwrap() > 0).count();
    assert!(busy >= 3, "the work is spread over the nodes: {r:#}");
    // Every node sees the same tree, identical to the source.
    for i in [1, 3] {
        bed.sh_ok(i, &format!("diff -r --no-dereference {} {mnt}/in/src", src.display()));
    }
    let back = bed.tmp.path().join("stage/out");
    std::fs::create_dir_all(&back).unwrap();
    ond_cp(&[format!("{mnt}/in/src")], &back.display().to_string());
    let o = std::process::Command::new("diff")
        .arg("-r")
        .arg("--no-dereference")
        .arg(&src)
        .arg(back.join("src"))
        .output()
        .unwrap();
    assert!(o.status.success(), "stage-out differs: {}", out(&o));
    bed.sh_ok(0, &format!("rm -rf {mnt}/in"));

    // Stop with node 4 dead (its link cut): bounded, the others cleaned up.
    bed.tb.cut(&bed.hosts[3]).unwrap();
    let mut a: Vec<String> = vec!["ond".into(), "stop".into()];
    a.extend(reach(&bed, "job1"));
    a.extend(["--delete-data".into(), "--timeout".into(), "20".into()]);
    let t = Instant::now();
    let o = run(&bed, 0, &a);
    let took = t.elapsed();
    assert!(!o.status.success(), "stop must report the dead node: {}", out(&o));
    let text = out(&o);
    assert!(text.contains("n4") && text.contains("NOT CLEANED UP"), "{text}");
    // Bounded by the connect timeout and --timeout per round, not by the dead node.
    assert!(took < Duration::from_secs(60), "stop took {took:?}");
    for i in 0..3 {
        assert_clean(&bed, i);
    }

    // The node comes back: its leftovers are stopped, and a new instance starts on all
    // four, with the binary pushed.
    bed.tb.heal(&bed.hosts[3]).unwrap();
    let mut a: Vec<String> = vec!["ond".into(), "stop".into(), "--delete-data".into()];
    a.extend(reach(&bed, "job1"));
    let o = run(&bed, 0, &a);
    assert!(o.status.success(), "stop after heal: {}", out(&o));
    assert_clean(&bed, 3);
    let o = run(&bed, 0, &start_args(&bed, "job2", &["--push", "--remote-bin", "/nonexistent/hivefs"]));
    assert!(o.status.success(), "second ond start: {}", out(&o));
    bed.sh_ok(2, &format!("echo again > {mnt}/f && cat {mnt}/f"));
    assert_eq!(bed.sh_ok(1, &format!("cat {mnt}/f")), "again\n");
    let mut a: Vec<String> = vec!["ond".into(), "stop".into(), "--delete-data".into()];
    a.extend(reach(&bed, "job2"));
    let o = run(&bed, 0, &a);
    assert!(o.status.success(), "ond stop: {}", out(&o));
    for i in 0..4 {
        assert_clean(&bed, i);
    }
}

#[test]
fn a_failing_node_is_named_and_nothing_is_left_and_a_busy_mount_is_detached_naming_its_holder() {
    let bed = SshBed::start("ond-fail", 3);
    let real = common::hivefs_bin().to_string();
    let mnt = bed.mnt().display().to_string();
    let clean_all = |bed: &SshBed| (0..3).for_each(|i| assert_clean(bed, i));

    // A node that fails the check: nothing starts anywhere.
    std::fs::write(bed.own("n2", "mnt").join("stray"), b"x").unwrap();
    let o = run(&bed, 0, &start_args(&bed, "j", &["--remote-bin", &real]));
    assert!(!o.status.success(), "{}", out(&o));
    let e = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(e.contains("node n2") && e.contains("not empty") && e.contains("nothing was started"), "{e}");
    clean_all(&bed);
    std::fs::remove_file(bed.own("n2", "mnt").join("stray")).unwrap();

    // A node that fails half-way (its servers do not start): named with its reason, and
    // what had started on the others is stopped and its data deleted.
    for h in &bed.hosts {
        let fail = if h.name == "n3" {
            r#"case "$*" in *"node servers"*) echo "target disk is on fire" >&2; exit 1;; esac"#
        } else {
            ""
        };
        let wrapper = bed.own(&h.name, "bin").join("hivefs");
        std::fs::write(&wrapper, format!("#!/bin/sh\n{fail}\nexec {real} \"$@\"\n")).unwrap();
        std::fs::set_permissions(&wrapper, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    }
    let wrapper = bed.path("bin").join("hivefs").display().to_string();
    let o = run(&bed, 0, &start_args(&bed, "j", &["--remote-bin", &wrapper]));
    assert!(!o.status.success(), "{}", out(&o));
    let e = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(e.contains("node n3: target disk is on fire"), "{e}");
    assert!(e.contains("every node was cleaned up"), "{e}");
    clean_all(&bed);

    // A busy mount: stop detaches it lazily and names the process holding it.
    let o = run(&bed, 0, &start_args(&bed, "j", &["--remote-bin", &real]));
    assert!(o.status.success(), "{}", out(&o));
    let mut holder = bed.hosts[1].command("sh");
    holder.args(["-c", &format!("cd {mnt} && exec sleep 1000")]);
    let holder_pid = bed.tb.spawn("process in the mount", holder).unwrap();
    common::wait_for("the holder to enter the mount", Duration::from_secs(10), || {
        std::fs::read_link(format!("/proc/{holder_pid}/cwd")).is_ok_and(|c| c.ends_with("mnt"))
    });
    let mut a: Vec<String> = vec!["ond".into(), "stop".into(), "--delete-data".into()];
    a.extend(reach(&bed, "j"));
    let o = run(&bed, 0, &a);
    assert!(o.status.success(), "ond stop: {}", out(&o));
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(text.contains(&format!("n2: mount busy (held by {holder_pid} (sleep))")), "{text}");
    bed.tb.stop(holder_pid, Duration::from_secs(1)).unwrap();
    clean_all(&bed);
}
