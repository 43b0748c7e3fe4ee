//! Bad input gets a clear error and leaves the file system working.

mod common;
use common::*;
use std::io::{Read, Write};

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
