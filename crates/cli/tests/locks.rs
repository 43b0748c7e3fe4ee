//! Global file locks and the global append lock, through two (or three)
//! mounts of one file system: `flock`, `fcntl` byte ranges (F_SETLK,
//! F_SETLKW, F_GETLK), lease expiry of a killed client, and O_APPEND writes
//! from two mounts.

// Raw system calls on the mount, as a program would make them (exact
// arguments, errno): the point of these tests.
#![allow(unsafe_code)]

mod common;

use common::*;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// `flock(2)`; 0 or the errno.
fn flock(f: &File, op: i32) -> i32 {
    // SAFETY: a valid descriptor owned by `f`.
    if unsafe { libc::flock(f.as_raw_fd(), op) } == 0 {
        0
    } else {
        std::io::Error::last_os_error().raw_os_error().unwrap()
    }
}

fn flock_struct(typ: i32, start: i64, len: i64) -> libc::flock {
    // SAFETY: plain old data; all-zero is a valid value.
    let mut l: libc::flock = unsafe { std::mem::zeroed() };
    l.l_type = typ as libc::c_short;
    l.l_whence = libc::SEEK_SET as libc::c_short;
    l.l_start = start;
    l.l_len = len;
    l
}

/// `fcntl(F_SETLK or F_SETLKW)`; 0 or the errno.
fn setlk(f: &File, cmd: i32, typ: i32, start: i64, len: i64) -> i32 {
    let l = flock_struct(typ, start, len);
    // SAFETY: a valid descriptor and a valid `struct flock`.
    if unsafe { libc::fcntl(f.as_raw_fd(), cmd, &l) } == 0 {
        0
    } else {
        std::io::Error::last_os_error().raw_os_error().unwrap()
    }
}

/// `fcntl(F_GETLK)`: the conflicting lock as (type, start, len).
fn getlk(f: &File, typ: i32, start: i64, len: i64) -> (i32, i64, i64) {
    let mut l = flock_struct(typ, start, len);
    // SAFETY: a valid descriptor and a valid `struct flock`.
    let r = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_GETLK, &mut l) };
    assert_eq!(r, 0, "F_GETLK: {}", std::io::Error::last_os_error());
    (i32::from(l.l_type), l.l_start, l.l_len)
}

fn rw(p: &std::path::Path) -> File {
    OpenOptions::new().read(true).write(true).open(p).unwrap_or_else(|e| panic!("open {}: {e}", p.display()))
}

/// Polls `f` until it is true, for at most `secs` seconds.
fn wait_for(what: &str, secs: u64, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < Duration::from_secs(secs), "timed out after {secs} s waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether a blocked call has not returned yet (it must wait for a lock).
fn still_blocked<T>(rx: &mpsc::Receiver<T>) -> bool {
    matches!(rx.recv_timeout(Duration::from_millis(500)), Err(mpsc::RecvTimeoutError::Timeout))
}

#[test]
fn flock_is_global_across_mounts() {
    let fs = TestFs::up(&["--storage", "1", "--targets-per-storage", "1"]);
    std::fs::write(fs.path("f"), b"x").unwrap();
    let m2 = fs.second_mount();
    let p2 = m2.mnt.join("f");

    let a = rw(&fs.path("f"));
    assert_eq!(flock(&a, libc::LOCK_EX | libc::LOCK_NB), 0);
    let b = rw(&p2);
    assert_eq!(flock(&b, libc::LOCK_EX | libc::LOCK_NB), libc::EWOULDBLOCK);
    assert_eq!(flock(&b, libc::LOCK_SH | libc::LOCK_NB), libc::EWOULDBLOCK);
    // Another open file description in the same mount is another owner too.
    let a2 = rw(&fs.path("f"));
    assert_eq!(flock(&a2, libc::LOCK_SH | libc::LOCK_NB), libc::EWOULDBLOCK);
    drop(a2);

    // A blocking flock in mount 2 waits until mount 1 unlocks.
    let (tx, rx) = mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let r = flock(&b, libc::LOCK_EX);
        tx.send(r).unwrap();
        b
    });
    assert!(still_blocked(&rx), "a blocking flock in mount 2 returned while mount 1 held the lock");
    assert_eq!(flock(&a, libc::LOCK_UN), 0);
    assert_eq!(rx.recv_timeout(Duration::from_secs(30)).expect("blocking flock granted after unlock"), 0);
    let b = waiter.join().unwrap();
    assert_eq!(flock(&a, libc::LOCK_SH | libc::LOCK_NB), libc::EWOULDBLOCK);

    // Downgrade in place lets shared lockers in; closing the last descriptor drops the lock.
    assert_eq!(flock(&b, libc::LOCK_SH), 0);
    assert_eq!(flock(&a, libc::LOCK_SH | libc::LOCK_NB), 0);
    assert_eq!(flock(&a, libc::LOCK_UN), 0);
    drop(b);
    wait_for("the flock of a closed file to go", 30, || flock(&a, libc::LOCK_EX | libc::LOCK_NB) == 0);

    // A mount with --local-locks leaves locks to its own kernel: no conflict with mount 1.
    let m3 = fs.extra_mount("mnt3", &["--local-locks"]);
    let c = rw(&m3.mnt.join("f"));
    assert_eq!(flock(&c, libc::LOCK_EX | libc::LOCK_NB), 0);
}

/// flock and fcntl locks live apart, as on Linux's local file systems: an
/// exclusive flock in one mount does not stop an fcntl write lock of the
/// same file in another, nor the other way round, while each still conflicts
/// with its own kind across mounts.
#[test]
fn flock_and_fcntl_locks_of_one_file_do_not_conflict() {
    let fs = TestFs::up(&["--storage", "1", "--targets-per-storage", "1"]);
    std::fs::write(fs.path("k"), vec![0u8; 100]).unwrap();
    let m2 = fs.second_mount();
    let (a, b) = (rw(&fs.path("k")), rw(&m2.mnt.join("k")));
    assert_eq!(flock(&a, libc::LOCK_EX | libc::LOCK_NB), 0);
    assert_eq!(setlk(&b, libc::F_SETLK, libc::F_WRLCK, 0, 0), 0, "fcntl lock beside a flock");
    assert_eq!(flock(&b, libc::LOCK_EX | libc::LOCK_NB), libc::EWOULDBLOCK, "flock against flock");
    let a2 = rw(&fs.path("k"));
    assert_eq!(setlk(&a2, libc::F_SETLK, libc::F_WRLCK, 0, 10), libc::EAGAIN, "fcntl against fcntl");
    // Unlocking one kind leaves the other.
    assert_eq!(flock(&a, libc::LOCK_UN), 0);
    assert_eq!(flock(&b, libc::LOCK_EX | libc::LOCK_NB), 0, "flock after the other flock went");
    assert_eq!(setlk(&a2, libc::F_SETLK, libc::F_WRLCK, 0, 10), libc::EAGAIN, "the fcntl lock stays");
    // The last close of b's description drops its flock (and its process's fcntl lock).
    drop(b);
    wait_for("b's locks to go at its close", 30, || flock(&a, libc::LOCK_EX | libc::LOCK_NB) == 0);
    assert_eq!(setlk(&a2, libc::F_SETLK, libc::F_WRLCK, 0, 10), 0);
}

#[test]
fn fcntl_byte_ranges_are_global_across_mounts() {
    let fs = TestFs::up(&["--storage", "1", "--targets-per-storage", "1"]);
    std::fs::write(fs.path("r"), vec![0u8; 4096]).unwrap();
    let m2 = fs.second_mount();
    // This process holds both descriptors, but through two mounts (two
    // clients), so its locks are two owners to the metadata node.
    let a = rw(&fs.path("r"));
    let b = rw(&m2.mnt.join("r"));

    // Non-overlapping exclusive ranges coexist.
    assert_eq!(setlk(&a, libc::F_SETLK, libc::F_WRLCK, 0, 100), 0);
    assert_eq!(setlk(&b, libc::F_SETLK, libc::F_WRLCK, 100, 100), 0);
    // Overlapping ones conflict, shared or exclusive.
    let e = setlk(&b, libc::F_SETLK, libc::F_WRLCK, 50, 10);
    assert!(e == libc::EAGAIN || e == libc::EACCES, "overlapping F_SETLK gave errno {e}");
    let e = setlk(&b, libc::F_SETLK, libc::F_RDLCK, 99, 1);
    assert!(e == libc::EAGAIN || e == libc::EACCES, "overlapping shared F_SETLK gave errno {e}");
    // F_GETLK reports the conflicting lock of mount 1.
    assert_eq!(getlk(&b, libc::F_WRLCK, 50, 10), (libc::F_WRLCK, 0, 100));
    assert_eq!(getlk(&b, libc::F_RDLCK, 300, 10).0, libc::F_UNLCK);
    assert_eq!(getlk(&a, libc::F_RDLCK, 150, 0), (libc::F_WRLCK, 100, 100));

    // Split: unlocking the middle of a range frees just the middle.
    assert_eq!(setlk(&a, libc::F_SETLK, libc::F_WRLCK, 1000, 100), 0);
    assert_eq!(setlk(&a, libc::F_SETLK, libc::F_UNLCK, 1040, 20), 0);
    assert_eq!(getlk(&b, libc::F_WRLCK, 1040, 20).0, libc::F_UNLCK);
    assert_eq!(getlk(&b, libc::F_WRLCK, 1000, 100), (libc::F_WRLCK, 1000, 40));
    assert_eq!(getlk(&b, libc::F_WRLCK, 1050, 100), (libc::F_WRLCK, 1060, 40));
    // Downgrade to shared: mount 2 may share, not take it exclusively.
    assert_eq!(setlk(&a, libc::F_SETLK, libc::F_RDLCK, 1000, 100), 0);
    assert_eq!(setlk(&b, libc::F_SETLK, libc::F_RDLCK, 1000, 10), 0);
    assert_ne!(setlk(&b, libc::F_SETLK, libc::F_WRLCK, 1010, 10), 0);

    // F_SETLKW waits for the conflicting range to be unlocked.
    let (tx, rx) = mpsc::channel();
    let waiter = std::thread::spawn(move || {
        tx.send(setlk(&b, libc::F_SETLKW, libc::F_WRLCK, 50, 10)).unwrap();
        b
    });
    assert!(still_blocked(&rx), "F_SETLKW in mount 2 returned while mount 1 held the range");
    assert_eq!(setlk(&a, libc::F_SETLK, libc::F_UNLCK, 0, 100), 0);
    assert_eq!(rx.recv_timeout(Duration::from_secs(30)).expect("F_SETLKW granted after unlock"), 0);
    let b = waiter.join().unwrap();
    assert_eq!(getlk(&a, libc::F_RDLCK, 0, 0), (libc::F_WRLCK, 50, 10));

    // Closing any descriptor of the file drops this process's locks there.
    let b2 = File::open(m2.mnt.join("r")).unwrap();
    drop(b2);
    assert_eq!(getlk(&a, libc::F_WRLCK, 0, 0).0, libc::F_UNLCK);
    drop(b);
}

#[test]
fn locks_of_a_killed_client_end_with_its_lease() {
    const LEASE_MS: u64 = 2000;
    let fs = TestFs::up_with(&["--storage", "1", "--targets-per-storage", "1"], |fs| {
        std::fs::create_dir_all(fs.dir.join("meta1")).unwrap();
        std::fs::write(fs.dir.join("meta1/meta.toml"), format!("lock_lease_ms = {LEASE_MS}\n")).unwrap();
    });
    std::fs::write(fs.path("k"), b"x").unwrap();
    let m2 = fs.second_mount();
    let b = rw(&m2.mnt.join("k"));
    assert_eq!(setlk(&b, libc::F_SETLK, libc::F_WRLCK, 0, 0), 0);
    let a = rw(&fs.path("k"));
    // Held across more than one lease while its mount lives (keep-alives).
    let held_until = Instant::now() + Duration::from_millis(2 * LEASE_MS);
    while Instant::now() < held_until {
        assert_ne!(setlk(&a, libc::F_SETLK, libc::F_WRLCK, 0, 0), 0, "lock of a live client was lost");
        std::thread::sleep(Duration::from_millis(200));
    }

    // SAFETY: killing the mount process this test started.
    unsafe { libc::kill(m2.pid() as i32, libc::SIGKILL) };
    let killed = Instant::now();
    let e = setlk(&a, libc::F_SETLK, libc::F_WRLCK, 0, 0);
    if killed.elapsed() < Duration::from_millis(LEASE_MS / 2) {
        assert_ne!(e, 0, "the lock went before the lease of the killed client ended");
    }
    wait_for("the killed client's lock to be released", 30, || setlk(&a, libc::F_SETLK, libc::F_WRLCK, 0, 0) == 0);
    drop(b);
}

/// Two mounts append to one file at once: every record lands whole, in
/// each writer's order, and the append lock changes hands when asked for
/// (a mount never waits for a lock it keeps itself, which it did when a
/// lock taken while the revoked one was let go landed in a forgotten slot:
/// each such append waited for that lock to run out).
#[test]
fn o_append_from_two_mounts_never_overwrites() {
    const N: usize = 150;
    const REC: usize = 100;
    // Records straddle 4 KiB chunks on two targets.
    let fs = TestFs::up(&["--storage", "2", "--targets-per-storage", "1", "--chunk-size", "4k"]);
    std::fs::write(fs.path("log"), b"").unwrap();
    let ports = [free_port(), free_port()];
    let mounts =
        [0, 1].map(|i| fs.extra_mount(["a", "b"][i], &["--metrics-listen", &format!("127.0.0.1:{}", ports[i])]));
    let paths = [mounts[0].mnt.join("log"), mounts[1].mnt.join("log")];
    let writers: Vec<_> = paths
        .iter()
        .enumerate()
        .map(|(w, p)| {
            let p = p.clone();
            std::thread::spawn(move || {
                let mut f = OpenOptions::new().append(true).open(&p).unwrap();
                for seq in 0..N {
                    let mut rec = format!("w{w} {seq:06} ").into_bytes();
                    rec.resize(REC - 1, b'a' + w as u8);
                    rec.push(b'\n');
                    f.write_all(&rec).unwrap();
                }
            })
        })
        .collect();
    for t in writers {
        t.join().unwrap();
    }
    let data = std::fs::read(fs.path("log")).unwrap();
    assert_eq!(data.len(), 2 * N * REC, "the file holds {} bytes, not {} records", data.len(), 2 * N);
    let mut next = [0usize; 2];
    for (i, rec) in data.chunks(REC).enumerate() {
        let s = String::from_utf8_lossy(rec);
        let w = match &rec[..2] {
            b"w0" => 0,
            b"w1" => 1,
            _ => panic!("record {i} is damaged: {s:?}"),
        };
        let seq: usize = s[3..9].parse().unwrap_or_else(|_| panic!("record {i} is damaged: {s:?}"));
        assert_eq!(seq, next[w], "record {i}: writer {w} out of order or lost: {s:?}");
        assert!(rec[10..REC - 1].iter().all(|&c| c == b'a' + w as u8) && rec[REC - 1] == b'\n', "record {i}: {s:?}");
        next[w] += 1;
    }
    assert_eq!(next, [N, N]);
    // Kept locks went because the other mount asked, not because they ran
    // out (a writer descheduled for a whole second could let one expire).
    let let_go = |kind: &str| -> u64 {
        ports.iter().map(|&p| counter(p, "hivefs_append_locks_let_go_total", &format!("kind=\"{kind}\""))).sum()
    };
    let (revoked, expired) = (let_go("revoked"), let_go("expired"));
    assert!(revoked > 0, "no append lock was revoked: the two mounts never took turns");
    assert!(expired <= 2, "{expired} append locks ran out while the other mount waited ({revoked} revoked)");
}

/// `fcntl(F_OFD_GETLK)`: the conflicting lock as (type, start, len, pid).
fn ofd_getlk(f: &File, typ: i32, start: i64, len: i64) -> (i32, i64, i64) {
    let mut l = flock_struct(typ, start, len);
    // SAFETY: a valid descriptor and a valid `struct flock` (l_pid 0, as OFD locks need).
    let r = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_OFD_GETLK, &mut l) };
    assert_eq!(r, 0, "F_OFD_GETLK: {}", std::io::Error::last_os_error());
    (i32::from(l.l_type), l.l_start, l.l_len)
}

#[test]
fn open_file_description_locks_belong_to_the_description() {
    use std::os::unix::process::CommandExt;
    let fs = TestFs::up(&["--storage", "1", "--targets-per-storage", "1"]);
    std::fs::write(fs.path("o"), vec![0u8; 4096]).unwrap();
    // Two open file descriptions of one process: OFD locks of one conflict
    // with the other's, and with this process's POSIX locks.
    let a = rw(&fs.path("o"));
    let b = rw(&fs.path("o"));
    assert_eq!(setlk(&a, libc::F_OFD_SETLK, libc::F_WRLCK, 0, 100), 0);
    assert_eq!(setlk(&b, libc::F_OFD_SETLK, libc::F_WRLCK, 50, 10), libc::EAGAIN);
    assert_eq!(ofd_getlk(&b, libc::F_RDLCK, 0, 0), (libc::F_WRLCK, 0, 100));
    assert_eq!(setlk(&b, libc::F_SETLK, libc::F_WRLCK, 0, 10), libc::EAGAIN);
    // A second mount sees it too.
    let m2 = fs.second_mount();
    let c = rw(&m2.mnt.join("o"));
    assert_eq!(ofd_getlk(&c, libc::F_WRLCK, 10, 1), (libc::F_WRLCK, 0, 100));

    // Closing a duplicate keeps the lock (the description lives on).
    drop(a.try_clone().unwrap());
    assert_eq!(ofd_getlk(&b, libc::F_WRLCK, 0, 0).0, libc::F_WRLCK);

    // Shared with a child process: kept after this process closes its
    // descriptor, released when the child's (the last) one closes.
    let fd = a.as_raw_fd();
    let mut cmd = std::process::Command::new("sleep");
    cmd.arg("1");
    // SAFETY: dup2 is async-signal-safe; only this child gets the descriptor (as fd 9, no CLOEXEC).
    unsafe {
        cmd.pre_exec(move || if libc::dup2(fd, 9) < 0 { Err(std::io::Error::last_os_error()) } else { Ok(()) });
    }
    let mut child = cmd.spawn().unwrap();
    drop(a);
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(ofd_getlk(&b, libc::F_WRLCK, 0, 0).0, libc::F_WRLCK, "released while a child holds the description");
    child.wait().unwrap();
    wait_for("the lock's release after the last close", 10, || ofd_getlk(&b, libc::F_WRLCK, 0, 0).0 == libc::F_UNLCK);

    // F_OFD_SETLKW waits for the holder's last close.
    assert_eq!(setlk(&c, libc::F_OFD_SETLK, libc::F_WRLCK, 0, 0), 0);
    let (tx, rx) = mpsc::channel();
    let waiter = std::thread::spawn(move || {
        tx.send(setlk(&b, libc::F_OFD_SETLKW, libc::F_RDLCK, 0, 10)).unwrap();
        b
    });
    assert!(still_blocked(&rx), "F_OFD_SETLKW returned while another description held the range");
    drop(c);
    assert_eq!(rx.recv_timeout(Duration::from_secs(30)).expect("F_OFD_SETLKW granted after close"), 0);
    let b = waiter.join().unwrap();
    let d = rw(&fs.path("o"));
    assert_eq!(ofd_getlk(&d, libc::F_WRLCK, 0, 0), (libc::F_RDLCK, 0, 10));
    drop(b);
}

#[test]
fn a_mount_keeps_the_append_lock_until_another_client_waits_for_it() {
    let fs = TestFs::up(&["--storage", "1"]);
    let port = free_port();
    let a = fs.extra_mount("a", &["--metrics-listen", &format!("127.0.0.1:{port}")]);
    let (pa, pb) = (a.mnt.join("log"), fs.path("log"));
    std::fs::write(&pa, b"").unwrap();
    let mut want = Vec::new();
    let mut fa = OpenOptions::new().append(true).open(&pa).unwrap();
    // One writer: its appends go to the end it knows, under the lock it keeps.
    let before = calls_sent(port, "LockAcquire");
    for i in 0..2000u32 {
        let rec = format!("a{i:05}\n");
        fa.write_all(rec.as_bytes()).unwrap();
        want.extend_from_slice(rec.as_bytes());
    }
    let asked = calls_sent(port, "LockAcquire") - before;
    assert!(asked < 200, "{asked} append lock requests for 2,000 appends: the lock is not kept");
    // A write of this mount past the end: the next append goes after it.
    let plain = OpenOptions::new().write(true).open(&pa).unwrap();
    plain.write_all_at(b"PPPP", want.len() as u64 + 6).unwrap();
    want.extend_from_slice(&[0; 6]);
    want.extend_from_slice(b"PPPP");
    fa.write_all(b"after\n").unwrap();
    want.extend_from_slice(b"after\n");
    // Another mount appends while this one keeps the lock and its file open:
    // it gets the lock (the keeper lets it go), and its record goes after.
    let mut fb = OpenOptions::new().append(true).open(&pb).unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        fb.write_all(b"b-record\n").unwrap();
        tx.send(()).unwrap();
    });
    rx.recv_timeout(Duration::from_secs(30)).expect("the other mount never got the append lock");
    want.extend_from_slice(b"b-record\n");
    // And the first takes it back for its next append, after the other's record.
    fa.write_all(b"a-again\n").unwrap();
    want.extend_from_slice(b"a-again\n");
    drop(fa);
    assert!(std::fs::read(&pb).unwrap() == want, "the log differs from the appends made");
}

extern "C" fn on_signal(_: libc::c_int) {}

/// A signal ends a wait for a lock, as on a local file system: the kernel
/// interrupts the FUSE request, the mount has the metadata node end the
/// wait, and the call fails with EINTR (`flock -w` gives up after its
/// time; an `alarm` around `F_SETLKW` returns). The interrupted wait
/// leaves nothing behind: the lock is taken normally once it is free.
#[test]
fn a_signal_interrupts_a_lock_wait() {
    let fs = TestFs::up(&["--storage", "1", "--targets-per-storage", "1"]);
    std::fs::write(fs.path("s"), vec![0u8; 100]).unwrap();
    let holder = rw(&fs.path("s"));
    assert_eq!(flock(&holder, libc::LOCK_EX | libc::LOCK_NB), 0);
    // util-linux `flock -w 1`: SIGALRM after a second, then exit status 1.
    let mut child =
        std::process::Command::new("flock").args(["-w", "1"]).arg(fs.path("s")).arg("true").spawn().unwrap();
    let status = wait_child(&mut child, Duration::from_secs(30), "flock -w 1 (the signal did not end its wait)");
    assert_eq!(status.code(), Some(1), "flock -w 1 against a held lock");

    // F_OFD_SETLKW of another description, in a thread that gets SIGUSR1
    // (a handler without SA_RESTART, so the call returns EINTR).
    let (a, b) = (rw(&fs.path("s")), rw(&fs.path("s")));
    assert_eq!(setlk(&a, libc::F_OFD_SETLK, libc::F_WRLCK, 0, 10), 0);
    // SAFETY: installs a handler that does nothing, for SIGUSR1, which nothing else here uses.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_signal as *const () as usize;
        assert_eq!(libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut()), 0);
    }
    let (tx, rx) = mpsc::channel();
    let waiter = std::thread::spawn(move || {
        // SAFETY: returns the calling thread's id.
        tx.send(unsafe { libc::pthread_self() }).unwrap();
        (setlk(&b, libc::F_OFD_SETLKW, libc::F_WRLCK, 5, 10), b)
    });
    let tid = rx.recv().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert!(!waiter.is_finished(), "F_OFD_SETLKW returned while another description held the range");
    // Again until it returns: a signal that came before the call began is lost.
    let start = Instant::now();
    while !waiter.is_finished() {
        assert!(start.elapsed() < Duration::from_secs(30), "F_OFD_SETLKW still waits 30 s after signals");
        // SAFETY: the waiter thread runs until `is_finished`, so `tid` is live.
        unsafe { libc::pthread_kill(tid, libc::SIGUSR1) };
        std::thread::sleep(Duration::from_millis(200));
    }
    let (e, b) = waiter.join().unwrap();
    assert_eq!(e, libc::EINTR, "an interrupted F_OFD_SETLKW");
    // Nothing was left behind: b got no lock, and takes it once a lets go.
    assert_eq!(ofd_getlk(&a, libc::F_WRLCK, 0, 0).0, libc::F_UNLCK, "a sees no lock of b's");
    assert_eq!(setlk(&a, libc::F_OFD_SETLK, libc::F_UNLCK, 0, 10), 0);
    assert_eq!(setlk(&b, libc::F_OFD_SETLK, libc::F_WRLCK, 5, 10), 0);
    assert_eq!(flock(&holder, libc::LOCK_UN), 0);
}
