//! Test beds for real: namespaces, veths, a bridge, TCP between hosts, link control and
//! cleanup. Needs root (fails with a clear message otherwise).

use hivefs_testbed::{link_qdiscs, link_up, sweep_stale, Host, Testbed};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_hivefs-testbed");

fn testbed(tag: &str) -> Testbed {
    Testbed::new(tag).unwrap_or_else(|e| panic!("cannot create test bed {tag} (these tests need root): {e:#}"))
}

/// One echo round trip from `from` to `addr`, with a time limit per step.
fn probe(from: &Host, addr: &str, timeout_ms: u64) -> bool {
    from.command(BIN)
        .args(["probe", addr, "--timeout-ms", &timeout_ms.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("run hivefs-testbed probe")
        .success()
}

/// Polls until `from` reaches `addr` (the echo server may still be starting).
fn wait_reachable(from: &Host, addr: &str) {
    let start = Instant::now();
    while !probe(from, addr, 1000) {
        assert!(start.elapsed() < Duration::from_secs(20), "{} cannot reach {addr}", from.name);
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn echo_server(tb: &Testbed, h: &Host, port: u16) -> String {
    let addr = h.addr(port);
    let mut cmd = h.command(BIN);
    cmd.args(["echo-server", &addr]).stdin(Stdio::null());
    tb.spawn(&format!("echo server on {}", h.name), cmd).expect("start echo server");
    addr
}

fn netns_list() -> String {
    String::from_utf8(Command::new("ip").args(["netns", "list"]).output().expect("ip netns list").stdout).unwrap()
}

fn has_netns(name: &str) -> bool {
    netns_list().lines().any(|l| l.split_whitespace().next() == Some(name))
}

#[test]
fn two_hosts_talk_over_tcp() {
    let tb = testbed("nt-tcp");
    let a = tb.add_host("a").unwrap();
    let b = tb.add_host("b").unwrap();
    assert_ne!(a.ip, b.ip);
    let addr = echo_server(&tb, &b, 7000);
    wait_reachable(&a, &addr);
    // And the other way round.
    let back = echo_server(&tb, &a, 7001);
    wait_reachable(&b, &back);
}

#[test]
fn cut_blocks_and_heal_restores() {
    let tb = testbed("nt-cut");
    let a = tb.add_host("a").unwrap();
    let b = tb.add_host("b").unwrap();
    let addr = echo_server(&tb, &b, 7000);
    wait_reachable(&a, &addr);

    tb.cut(&b).unwrap();
    assert!(link_up(&b).unwrap().iter().all(|(_, _, up)| !up), "both ends of b's link are down");
    assert!(!probe(&a, &addr, 1000), "a reached b through a cut link");
    assert!(!probe(&b, &a.addr(7000), 1000), "b sent through a cut link");

    tb.heal(&b).unwrap();
    assert!(link_up(&b).unwrap().iter().all(|(_, _, up)| *up));
    wait_reachable(&a, &addr);
}

#[test]
fn shape_installs_tbf_on_both_ends() {
    let tb = testbed("nt-shape");
    let a = tb.add_host("a").unwrap();
    let b = tb.add_host("b").unwrap();
    let addr = echo_server(&tb, &b, 7000);
    tb.shape(&b, 10_000_000).unwrap();
    for (ns, dev, q) in link_qdiscs(&b).unwrap() {
        assert!(q.contains("tbf") && q.contains("10Mbit"), "{ns}/{dev}: {q}");
    }
    wait_reachable(&a, &addr);
    tb.unshape(&b).unwrap();
    tb.unshape(&b).unwrap(); // nothing left to remove is fine
    for (ns, dev, q) in link_qdiscs(&b).unwrap() {
        assert!(!q.contains("tbf"), "{ns}/{dev} still shaped: {q}");
    }
    wait_reachable(&a, &addr);
    let e = tb.delay(&b, 10);
    if let Err(e) = e {
        assert!(format!("{e:#}").contains("netem"), "{e:#}");
    }
}

#[test]
fn loss_drops_packets_or_says_what_it_needs() {
    let tb = testbed("nt-loss");
    let a = tb.add_host("a").unwrap();
    let b = tb.add_host("b").unwrap();
    let addr = echo_server(&tb, &b, 7000);
    wait_reachable(&a, &addr);
    match tb.loss(&a, 100) {
        Ok(()) => {
            assert!(!probe(&a, &addr, 1000), "a reached b with 100% loss");
            tb.loss(&a, 0).unwrap();
            wait_reachable(&a, &addr);
        }
        Err(e) => {
            let m = format!("{e:#}");
            assert!(m.contains("netem") && m.contains("nftables"), "unclear error: {m}");
        }
    }
}

#[test]
fn drop_leaves_nothing_behind() {
    let names: Vec<String>;
    let pid;
    {
        let tb = testbed("nt-drop");
        let a = tb.add_host("a").unwrap();
        let b = tb.add_host("b").unwrap();
        names = vec![a.netns.clone(), b.netns.clone(), format!("hfs{}_sw", a.ip.octets()[2])];
        for n in &names {
            assert!(has_netns(n), "{n} missing while the test bed lives");
        }
        let mut sleeper = a.command("sleep");
        sleeper.arg("1000");
        pid = tb.spawn("sleeper", sleeper).unwrap();
        // A process started outside `spawn` dies with its namespace too.
        let mut stray = b.command("sleep");
        stray.arg("1000").stdin(Stdio::null());
        let stray = stray.spawn().unwrap();
        std::mem::forget(stray);
    }
    for n in &names {
        assert!(!has_netns(n), "{n} left behind:\n{}", netns_list());
    }
    assert!(!std::path::Path::new(&format!("/proc/{pid}/cmdline")).exists(), "process {pid} outlived its test bed");
}

#[test]
fn two_testbeds_get_different_subnets_and_do_not_see_each_other() {
    let t1 = testbed("nt-two");
    let t2 = testbed("nt-two");
    assert_ne!(t1.subnet(), t2.subnet());
    assert_ne!(t1.name(), t2.name());
    let a1 = t1.add_host("a").unwrap();
    let a2 = t2.add_host("a").unwrap();
    let b2 = t2.add_host("b").unwrap();
    assert_ne!(a1.netns, a2.netns);
    let addr = echo_server(&t2, &b2, 7000);
    wait_reachable(&a2, &addr);
    assert!(!probe(&a1, &addr, 500), "a host of one test bed reached another test bed");
}

#[test]
fn sweep_removes_test_beds_of_dead_processes() {
    // A process that creates a test bed owned by itself and exits without cleaning up,
    // as a crashed test run would.
    let mut holder = Command::new("sleep").arg("1000").spawn().unwrap();
    let name = format!("nt-sweep-{}", std::process::id());
    let out = Command::new(BIN)
        .args(["create", &name, "--hosts", "x,y", "--owner-pid", &holder.id().to_string()])
        .output()
        .unwrap();
    assert!(out.status.success(), "create: {}", String::from_utf8_lossy(&out.stderr));
    let tb = Testbed::open(&name).unwrap();
    let x = tb.host("x").unwrap();
    assert!(has_netns(&x.netns));
    // Still owned by a live process: a sweep leaves it alone.
    sweep_stale().unwrap();
    assert!(has_netns(&x.netns), "sweep removed a live test bed");

    holder.kill().unwrap();
    holder.wait().unwrap();
    let removed = sweep_stale().unwrap();
    // A concurrent test's sweep may have got there first.
    assert!(removed.contains(&name) || Testbed::open(&name).is_err(), "{removed:?}");
    assert!(!has_netns(&x.netns), "{} left behind", x.netns);
    assert!(Testbed::open(&name).is_err(), "state of {name} left behind");
}

#[test]
fn an_isolated_host_has_its_own_hostname_and_bind_mounts() {
    let tmp = tempfile::tempdir().unwrap();
    let (shared, a_dir, b_dir) = (tmp.path().join("shared"), tmp.path().join("a"), tmp.path().join("b"));
    for d in [&shared, &a_dir, &b_dir] {
        std::fs::create_dir(d).unwrap();
    }
    let tb = testbed("nt-iso");
    let a = tb.add_host("a").unwrap();
    let b = tb.add_host("b").unwrap();
    let a = tb.isolate(&a, &[(a_dir.clone(), shared.clone())]).unwrap();
    let b = tb.isolate(&b, &[(b_dir.clone(), shared.clone())]).unwrap();
    assert!(a.isolated() && tb.host("b").unwrap().isolated());
    let run = |h: &Host, script: &str| {
        let o = h.command("sh").args(["-c", script]).output().unwrap();
        assert!(o.status.success(), "{script} on {}: {}", h.name, String::from_utf8_lossy(&o.stderr));
        String::from_utf8(o.stdout).unwrap()
    };
    assert_eq!(run(&a, "hostname").trim(), "a");
    assert_eq!(run(&b, "hostname").trim(), "b");
    let path = shared.join("f");
    run(&a, &format!("echo from-a > {}", path.display()));
    run(&b, &format!("echo from-b > {}", path.display()));
    // Each host wrote into its own directory; the shared path is empty outside.
    assert_eq!(std::fs::read_to_string(a_dir.join("f")).unwrap(), "from-a\n");
    assert_eq!(std::fs::read_to_string(b_dir.join("f")).unwrap(), "from-b\n");
    assert!(!path.exists(), "a bind mount leaked into the caller's mount namespace");
    assert_eq!(run(&a, &format!("cat {}", path.display())), "from-a\n");
    // Its network is the host's: it reaches the other host.
    let addr = echo_server(&tb, &b, 7000);
    wait_reachable(&a, &addr);
    // Binding a missing target fails with the reason.
    let c = tb.add_host("c").unwrap();
    let e = tb.isolate(&c, &[(a_dir.clone(), tmp.path().join("missing"))]).unwrap_err();
    assert!(format!("{e:#}").contains("missing"), "{e:#}");
}
