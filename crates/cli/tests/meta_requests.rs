//! Metadata requests per operation through the mount (`MetaOpCount`):
//! create, stat, open+read+close and unlink of one file must not regress
//! to more round trips than the kernel asks for.

mod common;

use common::TestFs;
use hivefs_bench::md::MetaCounts;
use hivefs_bench::FsConn;
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;

/// Requests answered by all metadata nodes so far.
fn total(m: &MetaCounts) -> u64 {
    m.snapshot().expect("request counts of the metadata nodes").values().sum()
}

/// Requests the metadata nodes answered while `f` ran.
fn requests(m: &MetaCounts, f: impl FnOnce()) -> u64 {
    let before = total(m);
    f();
    total(m) - before
}

/// Runs `f` five times and returns the fewest requests one run took (a
/// stray request of the mount's own, such as a lock lease renewal, can
/// only add to a run).
fn fewest_requests(m: &MetaCounts, mut f: impl FnMut(u32)) -> u64 {
    (0..5).map(|round| requests(m, || f(round))).min().expect("five rounds")
}

#[test]
fn hot_paths_send_one_request_per_kernel_call() {
    let fs = TestFs::up(&["--storage", "1"]);
    let secret = hivefs_net::load_secret(&fs.secret()).expect("secret");
    let m = MetaCounts::connect(&FsConn { mgmtd: fs.mgmtd_addr(), secret: Some(secret) }).expect("connect");
    let dir = fs.path("d");
    std::fs::create_dir(&dir).unwrap();
    let file = |round: u32| dir.join(format!("f{round}"));

    // create + close of a new empty file (O_EXCL): one request creates it
    // and counts the open, one releases it.
    let create = fewest_requests(&m, |r| {
        std::fs::OpenOptions::new().write(true).create_new(true).mode(0o644).open(file(r)).unwrap();
    });
    // stat of a file whose name the kernel has cached.
    let stat = fewest_requests(&m, |r| {
        assert_eq!(std::fs::metadata(file(r)).unwrap().len(), 0);
    });
    // Files with contents for the read phase.
    for r in 0..5 {
        std::fs::write(file(r), b"hello").unwrap();
    }
    // open + read + close: one open, one release (data goes to the targets).
    let read = fewest_requests(&m, |r| {
        let mut s = String::new();
        std::fs::File::open(file(r)).unwrap().read_to_string(&mut s).unwrap();
        assert_eq!(s, "hello");
    });
    // A close of a descriptor that never wrote sends no size report, and a
    // write sends one (on close), not more.
    let rewrite = fewest_requests(&m, |r| {
        let mut f = std::fs::OpenOptions::new().write(true).open(file(r)).unwrap();
        f.write_all(b"HELLO").unwrap();
    });
    // unlink: one request of its own.
    let unlink = fewest_requests(&m, |r| std::fs::remove_file(file(r)).unwrap());
    eprintln!("metadata requests: create {create}, stat {stat}, read {read}, write {rewrite}, unlink {unlink}");
    // Upper bounds (a permission check the kernel skips only lowers a
    // count). What the kernel asks for besides: with `default_permissions` and
    // attributes never cached (cache mode native) every permission check
    // fetches the attributes afresh — search permission on the mount root and
    // on `d` for every path walk, write permission on `d` for a create or
    // unlink, and the open's check on the file itself.
    let walk = 2;
    // getattr d (write check), create-and-open, getattr of the new file (the
    // open's check), release; no size report (nothing was written).
    assert!(create <= walk + 4, "create + close: {create} requests");
    // The name of a new file is not cached (its create reply carries
    // attributes that must not be): lookup, then the stat's getattr.
    assert!(stat <= walk + 2, "stat: {stat} requests");
    // getattr (the open's check), open, release: one open request.
    assert!(read <= walk + 3, "open + read + close: {read} requests");
    // open, size report, release (and no second report on release).
    assert!(rewrite <= walk + 3, "open + write + close: {rewrite} requests");
    // getattr d (write check), unlink.
    assert!(unlink <= walk + 2, "unlink: {unlink} requests");
}

/// The attributes of a lookup or create are not cached by the kernel: a
/// `stat` right after one still sees what another mount left on close.
#[test]
fn stat_after_lookup_sees_another_mounts_close() {
    let fs = TestFs::up(&["--storage", "1"]);
    let other = fs.second_mount();
    for (name, created_here) in [("looked-up", false), ("created", true)] {
        let here = fs.path(name);
        let there = other.mnt.join(name);
        if created_here {
            std::fs::File::create(&here).unwrap();
        } else {
            std::fs::File::create(&there).unwrap();
        }
        assert_eq!(std::fs::metadata(&here).unwrap().len(), 0, "{name}");
        std::fs::write(&there, b"hello").unwrap();
        assert_eq!(std::fs::metadata(&here).unwrap().len(), 5, "{name}: size left on close by the other mount");
    }
}
