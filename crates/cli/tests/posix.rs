//! POSIX semantics conformance suite, in the spirit of pjdfstest: raw system
//! calls on a real mount, permission-dependent cases run as other users
//! (a forked child that drops to another uid/gid before the call).
//!
//! `run_suite` takes any mounted file system, so the same cases run against
//! one metadata server and against several.

// Raw system calls on the mount, as a program would make them (exact
// arguments, errno): the point of these tests.
#![allow(unsafe_code)]

mod common;
mod posix {
    pub mod access;
    pub mod names;
    pub mod times;
    pub mod xattr;
}

use common::*;
use std::ffi::{CStr, CString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// An unprivileged user ("nobody").
pub const U1: Cred = Cred { uid: 65534, gid: 65534, groups: &[] };
/// A second unprivileged user.
pub const U2: Cred = Cred { uid: 1001, gid: 1001, groups: &[] };
/// A group neither user belongs to unless its `groups` say so.
pub const G3: u32 = 3000;
/// `U1` as a member of `G3`.
pub const U1_IN_G3: Cred = Cred { uid: 65534, gid: 65534, groups: &[G3] };

#[derive(Clone, Copy)]
pub struct Cred {
    pub uid: u32,
    pub gid: u32,
    pub groups: &'static [u32],
}

pub fn errno() -> i32 {
    // SAFETY: the thread's errno location is always valid.
    unsafe { *libc::__errno_location() }
}

/// A system call's return value: negative means failure.
pub trait Ret: Copy {
    fn failed(self) -> bool;
}

impl Ret for i32 {
    fn failed(self) -> bool {
        self < 0
    }
}

impl Ret for isize {
    fn failed(self) -> bool {
        self < 0
    }
}

impl Ret for i64 {
    fn failed(self) -> bool {
        self < 0
    }
}

/// 0 when a system call's result is not negative, else errno.
pub fn e<T: Ret>(r: T) -> i32 {
    if r.failed() {
        errno()
    } else {
        0
    }
}

pub fn cs(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

/// Asserts that a system call succeeded, naming it and the path on failure.
#[track_caller]
pub fn ok<T: Ret>(r: T, what: &str) -> T {
    assert!(!r.failed(), "{what}: {}", std::io::Error::last_os_error());
    r
}

/// Opens and closes `p`: 0 or errno. Safe to call in a forked child (no allocation).
pub fn open_e(p: &CStr, flags: i32, mode: u32) -> i32 {
    // SAFETY: valid C string.
    let fd = unsafe { libc::open(p.as_ptr(), flags | libc::O_CLOEXEC, mode) };
    if fd < 0 {
        return errno();
    }
    // SAFETY: fd was just opened.
    unsafe { libc::close(fd) };
    0
}

/// Writes `data` through a new descriptor: 0 or errno (no allocation).
pub fn write_e(p: &CStr, flags: i32, data: &[u8]) -> i32 {
    // SAFETY: valid C string and buffer.
    unsafe {
        let fd = libc::open(p.as_ptr(), flags | libc::O_WRONLY | libc::O_CLOEXEC, 0o644);
        if fd < 0 {
            return errno();
        }
        let n = libc::write(fd, data.as_ptr().cast(), data.len());
        let err = if n < 0 { errno() } else { 0 };
        libc::close(fd);
        err
    }
}

/// Runs `f` in a forked child with the credentials `c`; returns what `f`
/// returned (an errno, 0 for success). `f` must not allocate: build every
/// path before the call.
pub fn as_user(c: Cred, f: impl FnOnce() -> i32) -> i32 {
    // SAFETY: the child only makes system calls and exits with `_exit`.
    unsafe {
        let pid = libc::fork();
        assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
        if pid == 0 {
            let groups: Vec<libc::gid_t> = Vec::new();
            let gs = if c.groups.is_empty() { groups.as_ptr() } else { c.groups.as_ptr() };
            if libc::setgroups(c.groups.len(), gs) != 0
                || libc::setresgid(c.gid, c.gid, c.gid) != 0
                || libc::setresuid(c.uid, c.uid, c.uid) != 0
            {
                libc::_exit(250);
            }
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or(251);
            libc::_exit(r);
        }
        let mut status = 0;
        assert_eq!(libc::waitpid(pid, &mut status, 0), pid);
        assert!(libc::WIFEXITED(status), "child as uid {} did not exit normally ({status:#x})", c.uid);
        let code = libc::WEXITSTATUS(status);
        assert!(code < 250, "child could not take uid {} gid {} (code {code})", c.uid, c.gid);
        code
    }
}

pub fn lstat(p: &Path) -> libc::stat {
    // SAFETY: zeroed stat is a valid out buffer.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid C string and out pointer.
    ok(unsafe { libc::lstat(cs(p).as_ptr(), &mut st) }, &format!("lstat {}", p.display()));
    st
}

pub fn mode(p: &Path) -> u32 {
    lstat(p).st_mode & 0o7777
}

pub fn chmod(p: &Path, m: u32) {
    // SAFETY: valid C string.
    ok(unsafe { libc::chmod(cs(p).as_ptr(), m) }, &format!("chmod {}", p.display()));
}

pub fn chown(p: &Path, uid: u32, gid: u32) {
    // SAFETY: valid C string.
    ok(unsafe { libc::lchown(cs(p).as_ptr(), uid, gid) }, &format!("chown {}", p.display()));
}

pub fn mkdir(p: &Path, m: u32) {
    // SAFETY: valid C string.
    ok(unsafe { libc::mkdir(cs(p).as_ptr(), m) }, &format!("mkdir {}", p.display()));
}

pub fn write_file(p: &Path, data: &[u8]) {
    let r = write_e(&cs(p), libc::O_CREAT | libc::O_TRUNC, data);
    assert_eq!(r, 0, "write {}: errno {r}", p.display());
}

/// A fresh directory for one group of cases, mode `m`, owned by root.
pub fn base(fs: &TestFs, name: &str, m: u32) -> PathBuf {
    let d = fs.path(name);
    mkdir(&d, m);
    chmod(&d, m);
    d
}

/// Modification and change times as (sec, nsec) pairs.
pub fn mtime(st: &libc::stat) -> (i64, i64) {
    (st.st_mtime, st.st_mtime_nsec)
}

pub fn ctime(st: &libc::stat) -> (i64, i64) {
    (st.st_ctime, st.st_ctime_nsec)
}

pub fn atime(st: &libc::stat) -> (i64, i64) {
    (st.st_atime, st.st_atime_nsec)
}

/// Every case, against the file system mounted at `fs.mnt`.
pub fn run_suite(fs: &TestFs) {
    // SAFETY: umask only affects this test process.
    unsafe { libc::umask(0o022) };
    let f = fs.path("umask");
    write_file(&f, b"");
    assert_eq!(mode(&f), 0o644, "open(O_CREAT, 0644) under umask 022");
    // SAFETY: as above.
    unsafe { libc::umask(0) };
    chmod(&fs.mnt, 0o755);

    posix::access::permission_bits(fs);
    posix::access::sticky_directories(fs);
    posix::access::setgid_and_suid(fs);
    posix::access::chown_rules(fs);
    posix::times::timestamps(fs);
    posix::names::open_flags(fs);
    posix::names::renames(fs);
    posix::names::link_counts(fs);
    posix::names::symlinks(fs);
    posix::names::name_and_path_limits(fs);
    posix::names::special_files(fs);
    posix::names::removed_open_directories(fs);
    posix::xattr::xattrs(fs);
    posix::xattr::posix_acls(fs);
}

#[test]
fn posix_conformance_one_meta() {
    let fs = TestFs::up(&["--storage", "1", "--targets-per-storage", "2"]);
    run_suite(&fs);
}

#[test]
fn posix_conformance_three_meta() {
    let fs = TestFs::up(&["--storage", "1", "--targets-per-storage", "2", "--meta", "3"]);
    run_suite(&fs);
}

/// The suite, 1 MiB reads and writes and a listing of many pages over each
/// FUSE transport: `/dev/fuse`, and FUSE over io_uring where the kernel has
/// it (the fuse module's `enable_uring` is turned on for the mount and put
/// back once it is up; either value is safe for other tests' mounts, which
/// then negotiate one transport or the other).
#[test]
fn posix_conformance_over_each_fuse_transport() {
    const PARAM: &str = "/sys/module/fuse/parameters/enable_uring";
    for t in ["dev", "io_uring"] {
        let before = std::fs::read_to_string(PARAM).ok();
        if t == "io_uring" && (before.is_none() || std::fs::write(PARAM, "Y").is_err()) {
            eprintln!("this kernel has no FUSE over io_uring ({PARAM}): only /dev/fuse was tested");
            return;
        }
        let fs = TestFs::up(&["--storage", "1", "--targets-per-storage", "2", "--fuse-transport", t]);
        if let Some(b) = before {
            let _ = std::fs::write(PARAM, b.trim());
        }
        let log = std::fs::read_to_string(Path::new(fs.dir_s()).join("client/mount.log")).unwrap();
        assert_eq!(log.contains("entries registered"), t == "io_uring", "{t}: {log}");
        run_suite(&fs);
        // Whole-MiB requests fill the io_uring payload buffers exactly.
        let data = random_bytes(7, 3 << 20);
        let f = fs.path("big");
        let mut w = std::fs::File::create(&f).unwrap();
        for c in data.chunks(1 << 20) {
            std::io::Write::write_all(&mut w, c).unwrap();
        }
        drop(w);
        assert!(std::fs::read(&f).unwrap() == data, "{t}: 3 MiB read back");
        let d = fs.path("many");
        std::fs::create_dir(&d).unwrap();
        for i in 0..700 {
            std::fs::write(d.join(format!("entry-with-a-longer-name-{i:04}")), b"").unwrap();
        }
        let mut names: Vec<_> = std::fs::read_dir(&d).unwrap().map(|e| e.unwrap().file_name()).collect();
        names.sort();
        assert_eq!(names.len(), 700, "{t}: listing");
        assert_eq!(names[699], "entry-with-a-longer-name-0699", "{t}");
    }
}

/// (atime, ctime) of `p` as (seconds, nanoseconds) pairs.
fn a_c(p: &Path) -> ((i64, i64), (i64, i64)) {
    let st = std::fs::metadata(p).unwrap();
    use std::os::unix::fs::MetadataExt;
    ((st.atime(), st.atime_nsec()), (st.ctime(), st.ctime_nsec()))
}

/// Reads `p` (a file: its contents; a directory: its entries).
fn read_it(p: &Path) {
    if p.is_dir() {
        std::fs::read_dir(p).unwrap().for_each(drop);
    } else {
        std::fs::read(p).unwrap();
    }
}

/// Waits until `f` holds (reports go to the metadata node in the background).
fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let start = std::time::Instant::now();
    while !f() {
        assert!(start.elapsed() < std::time::Duration::from_secs(10), "{what}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[test]
fn access_times_follow_the_mount_option() {
    let fs = TestFs::up(&["--storage", "1", "--targets-per-storage", "1"]);
    let rel = fs.extra_mount("rel", &["--atime", "relatime"]);
    let strict = fs.extra_mount("strict", &["--atime", "strictatime"]);
    let old = libc::timespec { tv_sec: 1_600_000_000, tv_nsec: 0 };
    for name in ["f", "d"] {
        let p = fs.path(name);
        if name == "f" {
            write_file(&p, b"data");
        } else {
            std::fs::create_dir(&p).unwrap();
            write_file(&p.join("x"), b"");
        }
        // noatime (hivefs up's mount): a read changes nothing.
        let before = a_c(&p);
        read_it(&p);
        std::thread::sleep(std::time::Duration::from_millis(300));
        assert_eq!(a_c(&p), before, "{name}: noatime");

        // relatime: an access time not newer than the change time moves...
        read_it(&rel.mnt.join(name));
        eventually(&format!("{name}: relatime moves an old access time"), || a_c(&p).0 > before.0);
        let (a1, c1) = a_c(&p);
        assert_eq!(c1, before.1, "{name}: the change time stays");
        // ...a newer one does not (until the file changes or a day passes).
        read_it(&rel.mnt.join(name));
        std::thread::sleep(std::time::Duration::from_millis(300));
        assert_eq!(a_c(&p).0, a1, "{name}: relatime, access time newer than the change");
        // An access time a day old moves again (the day rule itself: the meta unit tests).
        let day_old = libc::timespec { tv_sec: now_secs() - 2 * 86_400, tv_nsec: 0 };
        let omit = libc::timespec { tv_sec: 0, tv_nsec: libc::UTIME_OMIT };
        set_times(&p, day_old, omit);
        let before = a_c(&p);
        read_it(&rel.mnt.join(name));
        eventually(&format!("{name}: relatime moves a day-old access time"), || a_c(&p).0 > before.0);

        // strictatime: every read.
        set_times(&p, old, omit);
        let mut last = a_c(&p).0;
        for round in 0..3 {
            read_it(&strict.mnt.join(name));
            eventually(&format!("{name}: strictatime read {round}"), || a_c(&p).0 > last);
            last = a_c(&p).0;
            if name == "d" {
                break; // directories: once per open handle
            }
        }
    }
}

fn now_secs() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64
}

/// utimensat(2) with (atime, mtime).
fn set_times(p: &Path, a: libc::timespec, m: libc::timespec) {
    let c = CString::new(p.as_os_str().as_bytes()).unwrap();
    let ts = [a, m];
    // SAFETY: a valid path and two timespecs.
    assert_eq!(unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), ts.as_ptr(), 0) }, 0);
}
