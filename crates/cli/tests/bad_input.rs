//! Bad input gets a clear error and leaves the file system working.

mod common;
use common::*;
use std::io::{Read, Write};
use std::time::Duration;

fn stderr_of(args: &[&str]) -> String {
    let o = hivefs(args);
    assert!(!o.status.success(), "hivefs {args:?} should fail");
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn bad_input_is_refused_clearly() {
    let fs = TestFs::up(&["--storage", "1", "--targets-per-storage", "2"]);
    std::fs::write(fs.path("canary"), b"still here").unwrap();
    let tmp = tempfile::tempdir().unwrap();

    // Unknown config key.
    let cfg = tmp.path().join("meta.toml");
    std::fs::write(&cfg, "dir = \"/tmp/x\"\nlisten_adress = \"127.0.0.1:1\"\n").unwrap();
    let e = stderr_of(&["meta", "--config", cfg.to_str().unwrap()]);
    assert!(e.contains("listen_adress") && e.contains("meta.toml"), "{e}");
    // A value the node refuses.
    std::fs::write(&cfg, "dir = \"/tmp/x\"\ncheckpoint_bytes = 1\n").unwrap();
    let e = stderr_of(&["meta", "--config", cfg.to_str().unwrap()]);
    assert!(e.contains("checkpoint_bytes") && e.contains("meta.toml"), "{e}");

    // Busy mount point (already mounted) and non-empty mount point.
    let e =
        stderr_of(&["mount", "--mgmtd", &fs.mgmtd_addr(), "--secret-file", fs.secret().to_str().unwrap(), fs.mnt_s()]);
    assert!(e.contains("busy"), "{e}");
    let full = tmp.path().join("full");
    std::fs::create_dir(&full).unwrap();
    std::fs::write(full.join("x"), b"").unwrap();
    let e = stderr_of(&[
        "mount",
        "--mgmtd",
        &fs.mgmtd_addr(),
        "--secret-file",
        fs.secret().to_str().unwrap(),
        full.to_str().unwrap(),
    ]);
    assert!(e.contains("not empty"), "{e}");

    // Port in use: mgmtd's own port.
    let mdir = tmp.path().join("m2");
    let e = stderr_of(&["mgmtd", "--dir", mdir.to_str().unwrap(), "--listen", &fs.mgmtd_addr()]);
    assert!(e.to_lowercase().contains("in use"), "{e}");

    // Wrong shared secret.
    let wrong = tmp.path().join("wrong");
    std::fs::write(&wrong, "not-the-secret\n").unwrap();
    std::fs::set_permissions(&wrong, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let e = stderr_of(&["nodes", "--mgmtd", &fs.mgmtd_addr(), "--secret-file", wrong.to_str().unwrap()]);
    assert!(e.contains("authentication failed"), "{e}");
    // No secret at all.
    let e = stderr_of(&["nodes", "--mgmtd", &fs.mgmtd_addr()]);
    assert!(e.contains("requires authentication"), "{e}");
    // A world-readable secret file is refused.
    std::fs::set_permissions(&wrong, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    let e = stderr_of(&["nodes", "--mgmtd", &fs.mgmtd_addr(), "--secret-file", wrong.to_str().unwrap()]);
    assert!(e.contains("accessible by other users"), "{e}");

    // Malformed frames: garbage, then a header announcing a huge body.
    for junk in [b"GET / HTTP/1.1\r\n\r\n".to_vec(), {
        let mut h = vec![0x46, 0x48, 1, 1, 0, 0, 0, 0];
        h.extend_from_slice(&7u64.to_le_bytes());
        h.extend_from_slice(&u32::MAX.to_le_bytes());
        h.extend_from_slice(&0u32.to_le_bytes());
        h
    }] {
        let mut s = std::net::TcpStream::connect(fs.mgmtd_addr()).unwrap();
        s.set_read_timeout(Some(std::time::Duration::from_secs(10))).unwrap();
        let _ = s.write_all(&junk);
        let mut buf = Vec::new();
        // The server answers with its hello, refuses the handshake and closes.
        let _ = s.read_to_end(&mut buf);
    }
    // Bad patterns.
    let e = stderr_of(&["pattern", "set", fs.mnt_s(), "--chunk-size", "3000"]);
    assert!(e.contains("power of two"), "{e}");
    let e = stderr_of(&["pattern", "set", fs.mnt_s(), "--chooser", "fastest"]);
    assert!(e.contains("unknown chooser"), "{e}");
    let e = stderr_of(&["pattern", "set", fs.path("canary").to_str().unwrap(), "--stripe", "1"]);
    assert!(e.contains("not a directory"), "{e}");

    // Still working.
    assert_eq!(std::fs::read(fs.path("canary")).unwrap(), b"still here");
    hivefs_ok(&["nodes", "--mount", fs.mnt_s()]);
}

/// A new file system's port taken by another program between `up`'s choice
/// and the service's start (another `up` at the same time, say): the
/// service gets another port, and the file system works.
#[test]
fn a_port_taken_before_its_service_started_is_replaced() {
    let mgmtd = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let storage = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let (m, s) = (mgmtd.local_addr().unwrap().port(), storage.local_addr().unwrap().port());
    // Services in order: mgmtd, meta1, storage1.
    let ports = format!("{m},,{s}");
    let fs = TestFs::up_env(
        &["--storage", "1", "--targets-per-storage", "1"],
        &[("HIVEFS_UP_PORTS", ports.as_str())],
        |_| {},
    );
    let layout = std::fs::read_to_string(fs.dir.join("fs.toml")).unwrap();
    let port_of = |key: &str| -> u16 {
        let line = layout.lines().find(|l| l.starts_with(key)).unwrap_or_else(|| panic!("{key} in {layout}"));
        line.trim_start_matches(|c: char| !c.is_ascii_digit()).trim_end_matches(']').trim().parse().unwrap()
    };
    assert_ne!(port_of("mgmtd_port"), m, "{layout}");
    assert_ne!(port_of("storage_ports"), s, "{layout}");
    std::fs::write(fs.path("f"), b"works").unwrap();
    assert_eq!(std::fs::read(fs.path("f")).unwrap(), b"works");
    // The file system comes up again on the ports it recorded.
    fs.down();
    drop((mgmtd, storage));
    fs.reup();
    assert_eq!(std::fs::read(fs.path("f")).unwrap(), b"works");
}

/// A node's port taken by another program while the node was down: the
/// restarted metadata and storage nodes get other ports and register them
/// with mgmtd, and the running mount finds them there. mgmtd cannot move
/// while nodes or the mount run (they know its address): its restart then
/// fails, naming the port, until the port is free again. After a `down`
/// it moves, and everything is started with its new address.
#[test]
fn a_restarted_nodes_port_taken_while_it_was_down_is_replaced() {
    let fs = TestFs::up(&["--storage", "1", "--targets-per-storage", "1"]);
    std::fs::write(fs.path("f"), b"before").unwrap();
    let layout =
        || -> toml::Value { toml::from_str(&std::fs::read_to_string(fs.dir.join("fs.toml")).unwrap()).unwrap() };
    let port = |v: &toml::Value, key: &str| v[key][0].as_integer().unwrap() as u16;
    let before = layout();
    let (meta, storage) = (port(&before, "meta_ports"), port(&before, "storage_ports"));
    fs.kill9("meta1");
    fs.kill9("storage1");
    let _taken = [meta, storage].map(|p| std::net::TcpListener::bind(("127.0.0.1", p)).unwrap());
    let o = hivefs(&["up", "--dir", fs.dir_s()]);
    assert!(o.status.success(), "{}", out(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("meta1: ") && err.contains("storage1: ") && err.contains("was taken"), "{}", out(&o));
    let after = layout();
    assert_ne!(port(&after, "meta_ports"), meta);
    assert_ne!(port(&after, "storage_ports"), storage);
    // The mount that ran all along reads and writes through the new addresses.
    wait_for("the file readable through the moved nodes", Duration::from_secs(30), || {
        std::fs::read(fs.path("f")).is_ok_and(|d| d == b"before")
    });
    std::fs::write(fs.path("g"), b"after").unwrap();
    assert_eq!(std::fs::read(fs.path("g")).unwrap(), b"after");

    fs.kill9("mgmtd");
    let taken = std::net::TcpListener::bind(("127.0.0.1", after["mgmtd_port"].as_integer().unwrap() as u16)).unwrap();
    let o = hivefs(&["up", "--dir", fs.dir_s()]);
    assert!(!o.status.success(), "mgmtd started on a taken port: {}", out(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("Address already in use"), "{}", out(&o));
    drop(taken);
    fs.reup();
    assert_eq!(std::fs::read(fs.path("g")).unwrap(), b"after");

    fs.down();
    let port = layout()["mgmtd_port"].as_integer().unwrap() as u16;
    let _taken = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
    let o = hivefs(&["up", "--dir", fs.dir_s()]);
    assert!(o.status.success() && String::from_utf8_lossy(&o.stderr).contains("mgmtd: "), "{}", out(&o));
    assert_ne!(layout()["mgmtd_port"].as_integer().unwrap() as u16, port);
    assert_eq!(std::fs::read(fs.path("g")).unwrap(), b"after");
}

/// A read that keeps trying a dead storage node's address (its port
/// since taken by another program) follows the node to the address it
/// re-registered from: the mount's view refresh tells the repeating call to
/// stop, and the read is sent to the new address. Without that the read
/// would try the old address until its deadline and fail.
#[test]
fn a_read_repeating_towards_a_moved_storage_node_follows_it() {
    let fs = TestFs::up(&["--storage", "1", "--targets-per-storage", "1"]);
    let data = random_bytes(5, 3 << 20);
    std::fs::write(fs.path("f"), &data).unwrap();
    // A mount that has not read the file and does its chunk I/O over TCP.
    let m2 = fs.extra_mount("m2", &["--no-short-circuit"]);
    let v: toml::Value = toml::from_str(&std::fs::read_to_string(fs.dir.join("fs.toml")).unwrap()).unwrap();
    let port = v["storage_ports"][0].as_integer().unwrap() as u16;
    fs.kill9("storage1");
    let _taken = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
    let reader = {
        let f = m2.mnt.join("f");
        std::thread::spawn(move || std::fs::read(f))
    };
    std::thread::sleep(Duration::from_millis(500));
    let o = hivefs(&["up", "--dir", fs.dir_s()]);
    assert!(o.status.success() && String::from_utf8_lossy(&o.stderr).contains("storage1: "), "{}", out(&o));
    let got = reader.join().unwrap().expect("the read that waited for the moved storage node");
    assert!(got == data, "contents differ");
    let log = std::fs::read_to_string(&m2.log).unwrap();
    assert!(log.contains("storage node 1 moved from"), "{log}");
}

/// The same for a service's and the mount's metrics ports: the service (the mount)
/// fails to start on it, and gets other ports.
#[test]
fn a_metrics_port_taken_before_its_service_started_is_replaced() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let m = taken.local_addr().unwrap().port();
    let taken2 = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let m2 = taken2.local_addr().unwrap().port();
    // Services mgmtd, meta1, storage1, then the metrics ports of mgmtd, meta1 (the
    // fifth), storage1 and the mount (the seventh).
    let ports = format!(",,,,{m},,{m2}");
    let fs = TestFs::up_env(
        &["--storage", "1", "--targets-per-storage", "1"],
        &[("HIVEFS_UP_PORTS", ports.as_str())],
        |_| {},
    );
    let layout = std::fs::read_to_string(fs.dir.join("fs.toml")).unwrap();
    assert!(!layout.contains(&m.to_string()) && !layout.contains(&m2.to_string()), "{layout}");
    std::fs::write(fs.path("f"), b"works").unwrap();
    assert_eq!(std::fs::read(fs.path("f")).unwrap(), b"works");
    drop((taken, taken2));
}
