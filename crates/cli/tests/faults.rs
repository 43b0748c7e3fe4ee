//! Faults under load: full storage and metadata targets, and `kill -9` of
//! every service kind while clients write and verify checksummed data.
//! Nothing acknowledged may be lost, failed operations must return errors
//! (never hang), and the file system must work again after recovery.

mod common;
use common::*;
use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// mgmtd limits that keep tiny tmpfs targets in the normal capacity pool.
const NO_CAPACITY_LIMITS: &str =
    "space_low_limit_bytes = 0\nspace_emergency_limit_bytes = 0\ninodes_low_limit = 0\ninodes_emergency_limit = 0\n";

/// Appends `chunk` to `path` until a write fails; returns the bytes
/// acknowledged and the error.
fn fill(path: &std::path::Path, chunk: &[u8], max: usize) -> (usize, std::io::Error) {
    let mut f = std::fs::OpenOptions::new().append(true).open(path).unwrap();
    let mut done = 0;
    while done < max {
        match f.write(chunk) {
            Ok(n) => done += n,
            Err(e) => return (done, e),
        }
    }
    panic!("{}: wrote {done} bytes without running out of space", path.display());
}

#[test]
fn a_full_storage_target_gives_enospc_to_its_writer_only_and_recovers() {
    let fs = TestFs::up_with(&["--storage", "1", "--targets-per-storage", "2", "--chunk-size", "1m"], |fs| {
        fs.mount_tmpfs("storage1/target1", "16m");
        std::fs::create_dir_all(fs.dir.join("mgmtd")).unwrap();
        std::fs::write(fs.dir.join("mgmtd/mgmtd.toml"), NO_CAPACITY_LIMITS).unwrap();
    });
    let t1 = fs.target_dirs()[&1].clone();
    std::fs::create_dir(fs.path("d")).unwrap();
    hivefs_ok(&["pattern", "set", fs.path("d").to_str().unwrap(), "--stripe", "1", "--chooser", "roundrobin"]);
    // One file on each target.
    let (mut on1, mut on2) = (None, None);
    for i in 0..8 {
        let name = format!("d/f{i}");
        std::fs::write(fs.path(&name), b"").unwrap();
        match targets_of(&fs.entry_info(&name))[..] {
            [1] => on1 = on1.or(Some(name)),
            [2] => on2 = on2.or(Some(name)),
            ref t => panic!("unexpected targets {t:?}"),
        }
    }
    let (full, other) = (fs.path(&on1.expect("a file on target 1")), fs.path(&on2.expect("a file on target 2")));
    // Something else occupies half of target 1's disk.
    std::fs::write(t1.join("filler"), vec![7u8; 8 << 20]).unwrap();
    let chunk = random_bytes(1, 256 << 10);
    let (acked, e) = fill(&full, &chunk, 64 << 20);
    assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{}: {e}", full.display());
    assert!(acked >= 4 << 20, "only {acked} bytes fitted");
    // The other target's file works meanwhile, and what was acknowledged is intact.
    let data = random_bytes(2, 3 << 20);
    std::fs::write(&other, &data).unwrap();
    assert!(std::fs::read(&other).unwrap() == data);
    let mut got = Vec::new();
    std::fs::File::open(&full).unwrap().read_to_end(&mut got).unwrap();
    assert!(got.len() >= acked, "{} bytes acknowledged, {} readable", acked, got.len());
    for (i, piece) in got[..acked].chunks(chunk.len()).enumerate() {
        assert!(piece == &chunk[..piece.len()], "acknowledged piece {i} damaged");
    }
    // Freeing space makes writes work again.
    std::fs::remove_file(t1.join("filler")).unwrap();
    std::fs::write(&full, &data).unwrap();
    assert!(std::fs::read(&full).unwrap() == data);
}

#[test]
fn a_full_metadata_target_gives_enospc_and_recovers() {
    let fs = TestFs::up_with(&["--storage", "1", "--targets-per-storage", "1"], |fs| {
        fs.mount_tmpfs("meta1", "4m");
        std::fs::write(fs.dir.join("meta1/meta.toml"), "min_free_bytes = 524288\n").unwrap();
    });
    std::fs::create_dir(fs.path("d")).unwrap();
    let long = "n".repeat(200);
    let mut made = Vec::new();
    let err = loop {
        let name = format!("d/{long}{}", made.len());
        match std::fs::write(fs.path(&name), b"x") {
            Ok(()) => made.push(name),
            Err(e) => break e,
        }
        assert!(made.len() < 500_000, "the metadata target never filled up");
    };
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "after {} files: {err}", made.len());
    // The node refused the create: its store did not run out of space
    // mid-commit (which also answers ENOSPC, then stops the service).
    let log = std::fs::read_to_string(fs.dir.join("meta1/meta1.log")).unwrap();
    assert!(!log.contains("metadata store failure"), "the store itself ran out of space:\n{log}");
    assert!(fs.alive("meta1"), "the metadata service stopped");
    // Reads keep working; removing files frees space and creates work again.
    assert_eq!(std::fs::read(fs.path(&made[0])).unwrap(), b"x");
    for name in made.drain(made.len() / 2..) {
        std::fs::remove_file(fs.path(&name)).unwrap();
    }
    // (A refusal stands for a second before space is counted again.)
    std::thread::sleep(Duration::from_millis(1100));
    std::fs::write(fs.path("d/after"), b"again").unwrap();
    // Everything acknowledged survives a restart of the metadata service.
    fs.kill9("meta1");
    fs.reup();
    assert_eq!(std::fs::read(fs.path("d/after")).unwrap(), b"again");
    let listed = std::fs::read_dir(fs.path("d")).unwrap().count();
    assert_eq!(listed, made.len() + 1);
    for name in made.iter().step_by(97) {
        assert_eq!(std::fs::read(fs.path(name)).unwrap(), b"x", "{name}");
    }
}

/// fio writes files with checksummed blocks, then reads and verifies them.
fn fio_verify(dir: &std::path::Path, name: &str) -> std::process::Child {
    std::fs::create_dir_all(dir).unwrap();
    Command::new("fio")
        .args([
            &format!("--name={name}"),
            &format!("--directory={}", dir.display()),
            "--rw=write",
            "--bs=256k",
            "--size=48m",
            // Paced (16 MiB/s per job), so that the kills land mid-phase.
            "--rate=16m",
            "--numjobs=2",
            "--verify=crc32c",
            "--verify_fatal=1",
            "--do_verify=1",
            "--end_fsync=1",
            "--verify_state_save=0",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run fio (Debian package fio)")
}

/// Waits for a child with a bound: a hang is a failure, not a stuck test.
fn wait_bounded(mut c: std::process::Child, limit: Duration, what: &str) -> std::process::Output {
    let start = Instant::now();
    while c.try_wait().unwrap().is_none() {
        if start.elapsed() > limit {
            let _ = c.kill();
            let o = c.wait_with_output().unwrap();
            panic!("{what} hung for {limit:?}: {}", String::from_utf8_lossy(&o.stdout));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    c.wait_with_output().unwrap()
}

#[test]
fn kill9_of_each_service_during_checksummed_io() {
    let fs = TestFs::up(&["--storage", "2", "--targets-per-storage", "2"]);
    // (service, seconds after the start: fio writes for about 3 s, then verifies)
    for (svc, at) in [("storage1", 1.0), ("meta1", 1.0), ("mgmtd", 1.5), ("storage2", 2.0)] {
        let dir = fs.path(&format!("fio-{svc}"));
        let mut fio = fio_verify(&dir, svc);
        std::thread::sleep(Duration::from_secs_f64(at));
        assert!(fio.try_wait().unwrap().is_none(), "fio ended before the kill of {svc}");
        fs.kill9(svc);
        fs.reup();
        let o = wait_bounded(fio, Duration::from_secs(180), &format!("fio during kill -9 of {svc}"));
        // Retries of idempotent chunk requests and of metadata operations make a
        // quick restart invisible: every write succeeded and verifies.
        if !o.status.success() {
            let log = std::fs::read_to_string(fs.dir.join("client/mount.log")).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(30).collect();
            panic!(
                "fio during kill -9 of {svc} failed:\n{}\n{}\nmount log (last lines, newest first):\n{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr),
                tail.join("\n")
            );
        }
    }
    // Everything written in all rounds reads back (sizes as fio wrote them).
    for svc in ["storage1", "meta1", "mgmtd", "storage2"] {
        for job in 0..2 {
            let p = fs.path(&format!("fio-{svc}/{svc}.{job}.0"));
            assert_eq!(std::fs::metadata(&p).unwrap().len(), 48 << 20, "{}", p.display());
        }
    }
    // No half-done operation, orphan or size mismatch is left behind.
    let out = hivefs(&["fsck", "--mount", fs.mnt_s()]);
    assert!(
        out.status.success(),
        "fsck after the kills:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn io_to_a_dead_storage_service_fails_within_the_timeout_and_works_after_restart() {
    let fs = TestFs::up(&["--storage", "2", "--targets-per-storage", "1"]);
    // A mount with a short I/O timeout beside the default one.
    let short = fs.extra_mount("short", &["--io-timeout-ms", "2000"]);
    let mnt2 = short.mnt.clone();
    let data = random_bytes(5, 2 << 20);
    std::fs::write(fs.path("f"), &data).unwrap();
    fs.kill9("storage1");
    let start = Instant::now();
    let r = std::fs::read(mnt2.join("f"));
    let took = start.elapsed();
    let errno = errno_of(r);
    assert!(errno == libc::EIO || errno == libc::ETIMEDOUT, "read with a dead target: errno {errno}");
    assert!(took < Duration::from_secs(30), "a read blocked {took:?} with a 2 s I/O timeout");
    fs.reup();
    assert!(std::fs::read(mnt2.join("f")).unwrap() == data, "I/O works again without remounting");
}

/// `hivefs down` with its arguments, failing the test if it takes longer than a minute.
fn down_bounded(fs: &TestFs, extra: &[&str]) -> std::process::Output {
    let c = Command::new(hivefs_bin())
        .args(["down", "--dir", fs.dir_s()])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_bounded(c, Duration::from_secs(60), "hivefs down")
}

#[test]
fn down_never_hangs_on_dead_servers_and_force_detaches_a_busy_mount() {
    let fs = TestFs::up(&["--storage", "1", "--targets-per-storage", "1"]);
    std::fs::write(fs.path("f"), b"data").unwrap();
    for svc in ["storage1", "meta1", "mgmtd"] {
        fs.kill9(svc);
    }
    let o = down_bounded(&fs, &[]);
    assert!(o.status.success(), "down with dead servers: {}", String::from_utf8_lossy(&o.stderr));
    assert!(!is_mounted(&fs.mnt));
    fs.reup();
    assert_eq!(std::fs::read(fs.path("f")).unwrap(), b"data");
    // A busy mount: plain `down` refuses with advice, `--force` detaches it lazily.
    let held = std::fs::File::open(fs.path("f")).unwrap();
    let o = down_bounded(&fs, &[]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--force"), "{}", String::from_utf8_lossy(&o.stderr));
    let o = down_bounded(&fs, &["--force"]);
    assert!(o.status.success(), "down --force: {}", String::from_utf8_lossy(&o.stderr));
    assert!(!is_mounted(&fs.mnt));
    drop(held);
}
