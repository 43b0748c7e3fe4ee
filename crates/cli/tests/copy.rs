//! copy_file_range through the real mount: the storage targets copy the
//! chunks among themselves (between files of different stripe patterns,
//! across storage servers), the results match the local disk's, and the
//! bytes do not pass through the mount.

// Raw system calls on the mount, as a program would make them (exact
// arguments, errno): the point of these tests.
#![allow(unsafe_code)]

mod common;

use common::*;
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::Command;

/// copy_file_range(2) with explicit offsets: bytes copied, or the errno.
fn copy(src: &File, off_in: i64, dst: &File, off_out: i64, len: usize) -> Result<usize, i32> {
    let (mut i, mut o) = (off_in, off_out);
    // SAFETY: copy_file_range(2) between two open descriptors with explicit offsets.
    let r = unsafe { libc::copy_file_range(src.as_raw_fd(), &mut i, dst.as_raw_fd(), &mut o, len, 0) };
    if r >= 0 {
        Ok(r as usize)
    } else {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(-1))
    }
}

fn rw(p: &Path) -> File {
    OpenOptions::new().read(true).write(true).create(true).truncate(false).open(p).unwrap()
}

fn contents(p: &Path) -> Vec<u8> {
    std::fs::read(p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
}

/// Bytes the process read and wrote through system calls (files, sockets, /dev/fuse).
fn io_bytes(pid: i32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/io")).unwrap();
    s.lines()
        .filter(|l| l.starts_with("rchar:") || l.starts_with("wchar:"))
        .map(|l| l.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap())
        .sum()
}

#[test]
fn copy_file_range_copies_on_the_servers_and_matches_the_local_disk() {
    let fs = TestFs::up(&[]);
    for (d, cs, stripe) in [("a", "64k", "4"), ("b", "128k", "3")] {
        std::fs::create_dir(fs.path(d)).unwrap();
        hivefs_ok(&["pattern", "set", fs.path(d).to_str().unwrap(), "--chunk-size", cs, "--stripe", stripe]);
    }
    let local = tempfile::tempdir_in("/var/tmp").unwrap();
    let data = random_bytes(21, (3 << 20) + 12345);
    let (ms, ls) = (rw(&fs.path("a/src")), rw(&local.path().join("src")));
    let (md, ld) = (rw(&fs.path("b/dst")), rw(&local.path().join("dst")));
    for (s, d) in [(&ms, &md), (&ls, &ld)] {
        s.write_all_at(&data, 0).unwrap();
        // A hole in the source's middle: copied as zeroes.
        // SAFETY: fallocate(2) on an open descriptor.
        let r = unsafe {
            libc::fallocate(s.as_raw_fd(), libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE, 1 << 20, 256 << 10)
        };
        assert_eq!(r, 0);
        d.write_all_at(&random_bytes(22, 1 << 20), 0).unwrap();
    }
    // (offset in, offset out, length): whole, misaligned to both patterns,
    // past the source's end, starting past it.
    let cases: [(i64, i64, usize); 5] = [
        (0, 0, 4 << 20),
        (100_000, 777, 1 << 20),
        ((3 << 20) - 5, 5 << 20, 1 << 20),
        (65_536, 65_536 * 3 + 1, 300_000),
        (10 << 20, 0, 100),
    ];
    for (i, (off_in, off_out, len)) in cases.into_iter().enumerate() {
        let (mut got_m, mut got_l) = (0, 0);
        // The kernel may split a call; go on until it copies nothing more.
        for (s, d, got) in [(&ms, &md, &mut got_m), (&ls, &ld, &mut got_l)] {
            while *got < len {
                let n = copy(s, off_in + *got as i64, d, off_out + *got as i64, len - *got)
                    .unwrap_or_else(|e| panic!("case {i}: errno {e}"));
                if n == 0 {
                    break;
                }
                *got += n;
            }
        }
        assert_eq!(got_m, got_l, "case {i}: bytes copied");
        assert!(contents(&fs.path("b/dst")) == contents(&local.path().join("dst")), "case {i}: contents differ");
    }
    // Another mount sees the result.
    let m2 = fs.second_mount();
    assert!(contents(&m2.mnt.join("b/dst")) == contents(&local.path().join("dst")));

    // Overlapping ranges of one file: the kernel's EINVAL, as on the local disk.
    assert_eq!(copy(&ms, 0, &ms, 100, 1000), Err(libc::EINVAL));
    assert_eq!(copy(&ls, 0, &ls, 100, 1000), Err(libc::EINVAL));
    // Non-overlapping ranges of one file work.
    assert_eq!(copy(&ms, 0, &ms, 8 << 20, 4096), Ok(4096));
    assert_eq!(ms.metadata().unwrap().len(), (8 << 20) + 4096);

    // coreutils cp: the copy runs on the servers, the mount moves almost nothing.
    let big = fs.path("a/big");
    std::fs::write(&big, random_bytes(23, 64 << 20)).unwrap();
    let pid = fs.pid("mount");
    let before = io_bytes(pid);
    let o = Command::new("cp").arg(&big).arg(fs.path("b/big-copy")).output().unwrap();
    assert!(o.status.success(), "cp: {}", String::from_utf8_lossy(&o.stderr));
    let moved = io_bytes(pid) - before;
    assert!(moved < 8 << 20, "the mount read and wrote {moved} bytes for a 64 MiB server-side copy");
    assert!(contents(&fs.path("b/big-copy")) == contents(&big));
    // The same copy through the mount (read, then write) moves it all: the
    // measure above would see a client-side copy.
    let before = io_bytes(pid);
    let o = Command::new("dd")
        .arg(format!("if={}", big.display()))
        .arg(format!("of={}", fs.path("b/big-dd").display()))
        .args(["bs=4M", "status=none"])
        .output()
        .unwrap();
    assert!(o.status.success());
    assert!(io_bytes(pid) - before >= 64 << 20);
}

/// A copy that keeps trying a dead storage node's address (its port since
/// taken by another program) follows the node to the address it
/// re-registered from, as reads and writes do: without that the copy
/// failed with the "moved" error. The source's chunks are on the node that
/// stays up (its size is asked first), the destination's on the one that moves.
#[test]
fn a_copy_repeating_towards_a_moved_storage_node_follows_it() {
    let fs = TestFs::up(&["--storage", "2", "--targets-per-storage", "1"]);
    let m = fs.mnt_s();
    // Target 2's service (mgmtd numbers the concurrently registering services in either order).
    let serves_2 = |k: usize| {
        let t = std::fs::read_to_string(fs.dir.join(format!("storage{k}/target1/target.toml"))).unwrap();
        t.parse::<toml::Table>().unwrap()["target_id"].as_integer() == Some(2)
    };
    let k = if serves_2(2) { 2 } else { 1 };
    let pool = json(&["pool", "create", "--json", "--mount", m, "second"])["id"].as_u64().unwrap();
    hivefs_ok(&["pool", "add-target", "--mount", m, "second", "2"]);
    std::fs::create_dir(fs.path("b")).unwrap();
    hivefs_ok(&["pattern", "set", fs.path("b").to_str().unwrap(), "--pool", &pool.to_string()]);
    let data = random_bytes(23, 3 << 20);
    std::fs::write(fs.path("src"), &data).unwrap();
    std::fs::write(fs.path("b/dst"), b"").unwrap();
    assert_eq!(targets_of(&fs.entry_info("b/dst")), vec![2]);
    assert_eq!(targets_of(&fs.entry_info("src")), vec![1]);
    // A mount that does its chunk I/O over TCP.
    let m2 = fs.extra_mount("m2", &["--no-short-circuit"]);
    let (src, dst) = (rw(&m2.mnt.join("src")), rw(&m2.mnt.join("b/dst")));
    let v: toml::Value = toml::from_str(&std::fs::read_to_string(fs.dir.join("fs.toml")).unwrap()).unwrap();
    let port = v["storage_ports"][k - 1].as_integer().unwrap() as u16;
    fs.kill9(&format!("storage{k}"));
    let _taken = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
    let len = data.len();
    let copier = std::thread::spawn(move || {
        let mut done = 0;
        while done < len {
            match copy(&src, done as i64, &dst, done as i64, len - done) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) => return Err(e),
            }
        }
        Ok(done)
    });
    std::thread::sleep(std::time::Duration::from_millis(500));
    let o = hivefs(&["up", "--dir", fs.dir_s()]);
    assert!(o.status.success() && String::from_utf8_lossy(&o.stderr).contains(&format!("storage{k}: ")), "{}", out(&o));
    let copied = copier.join().unwrap();
    let log = std::fs::read_to_string(&m2.log).unwrap();
    assert_eq!(copied, Ok(len), "the copy that waited for the moved storage node (Err: errno); mount log:\n{log}");
    assert!(contents(&fs.path("b/dst")) == data, "contents differ");
    // The node's id is mgmtd's choice (the services register concurrently): its old address names it.
    assert!(log.contains(&format!("moved from 127.0.0.1:{port} ")), "{log}");
}
