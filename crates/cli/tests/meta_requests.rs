//! Metadata requests per operation through the mount (`MetaOpCount`):
//! create, stat, open+read+close and unlink of one file must not regress
//! to more round trips than the kernel asks for, nor a rename across metadata
//! nodes to more steps between them; and what the mount lets the
//! kernel cache (directory attributes, for a bounded time) stays bounded.

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

/// Requests the metadata nodes answered for `f`: counted once the count
/// stops moving, so that what the mount sends after the kernel call
/// returned (the release after a close) is counted with it and not with
/// the next run.
fn requests(m: &MetaCounts, f: impl FnOnce()) -> u64 {
    let before = total(m);
    f();
    let mut last = total(m);
    loop {
        std::thread::sleep(std::time::Duration::from_millis(50));
        let now = total(m);
        if now == last {
            return now - before;
        }
        last = now;
    }
}

/// Runs `f` five times and returns the fewest requests one run took (a
/// stray request of the mount's own, such as a lock lease renewal, can
/// only add to a run). Before each run, uncounted, `warm` refreshes what the
/// kernel caches for a bounded time (names, directory attributes): on a
/// loaded machine the runs are far enough apart for it to expire.
fn fewest_requests(m: &MetaCounts, mut warm: impl FnMut(u32), mut f: impl FnMut(u32)) -> u64 {
    (0..5)
        .map(|round| {
            warm(round);
            requests(m, || f(round))
        })
        .min()
        .expect("five rounds")
}

#[test]
fn hot_paths_send_one_request_per_kernel_call() {
    let fs = TestFs::up(&["--storage", "1"]);
    let secret = hivefs_net::load_secret(&fs.secret()).expect("secret");
    let m = MetaCounts::connect(&FsConn { mgmtd: fs.mgmtd_addr(), secret: Some(secret) }).expect("connect");
    let dir = fs.path("d");
    std::fs::create_dir(&dir).unwrap();
    let file = |round: u32| dir.join(format!("f{round}"));
    // Refreshes `d`'s attributes and, once the file exists, its name.
    let warm = |round: u32| {
        std::fs::metadata(&dir).unwrap();
        let _ = std::fs::metadata(file(round));
    };

    // create + close of a new empty file (O_EXCL): one request creates it
    // and counts the open, one releases it.
    let create = fewest_requests(&m, warm, |r| {
        std::fs::OpenOptions::new().write(true).create_new(true).mode(0o644).open(file(r)).unwrap();
    });
    // stat of a file whose name the kernel has cached.
    let stat = fewest_requests(&m, warm, |r| {
        assert_eq!(std::fs::metadata(file(r)).unwrap().len(), 0);
    });
    // Files with contents for the read phase.
    for r in 0..5 {
        std::fs::write(file(r), b"hello").unwrap();
    }
    // open + read + close: one open, one release (data goes to the targets).
    let read = fewest_requests(&m, warm, |r| {
        let mut s = String::new();
        std::fs::File::open(file(r)).unwrap().read_to_string(&mut s).unwrap();
        assert_eq!(s, "hello");
    });
    // A close of a descriptor that never wrote sends no size report, and a
    // write sends one (on close), not more.
    let rewrite = fewest_requests(&m, warm, |r| {
        let mut f = std::fs::OpenOptions::new().write(true).open(file(r)).unwrap();
        f.write_all(b"HELLO").unwrap();
    });
    // unlink: one request of its own.
    let unlink = fewest_requests(&m, warm, |r| std::fs::remove_file(file(r)).unwrap());
    eprintln!("metadata requests: create {create}, stat {stat}, read {read}, write {rewrite}, unlink {unlink}");
    // Upper bounds: one metadata request per kernel call (a permission
    // check the kernel skips only lowers a count). With `default_permissions`
    // the kernel checks search permission on the mount root and on `d` for
    // every path walk and write permission on `d` for a create or unlink,
    // from directory attributes it caches for the mount's --dir-attr-ttl-ms
    // (1 s, refreshed by `warm`): no request for them. Files' attributes are
    // cached only under a lease (tests/leases.rs); the bounds below hold
    // without one, where every open's permission check and every fstat is a
    // getattr.
    // create-and-open, and the release (sent in the background). No lookup:
    // the mount made `d` and holds the lease on its names, so it knows the
    // new name is absent; no getattr of `d`: its attributes came with the
    // last change's answer; no size report (nothing was written).
    assert!(create <= 2, "create + close: {create} requests");
    // The name is cached (`warm`): the stat's getattr.
    assert!(stat <= 1, "stat: {stat} requests");
    // getattr (the open's check), open, getattr (read_to_string's fstat),
    // release.
    assert!(read <= 4, "open + read + close: {read} requests");
    // getattr (the open's check), open, size report, release (and no second
    // report on release).
    assert!(rewrite <= 4, "open + write + close: {rewrite} requests");
    // unlink.
    assert!(unlink <= 1, "unlink: {unlink} requests");
}

/// A file system with two metadata nodes, its request counts, and directory
/// `d`, which the balanced chooser puts on the node that does not own the root.
fn two_nodes() -> (TestFs, MetaCounts, std::path::PathBuf) {
    let fs = TestFs::up(&["--storage", "1", "--meta", "2"]);
    let secret = hivefs_net::load_secret(&fs.secret()).expect("secret");
    let m = MetaCounts::connect(&FsConn { mgmtd: fs.mgmtd_addr(), secret: Some(secret) }).expect("connect");
    let dir = fs.path("d");
    std::fs::create_dir(&dir).unwrap();
    let (root, d) = (fs.entry_info(""), fs.entry_info("d"));
    assert_ne!(root["owner_meta_node"], d["owner_meta_node"], "the balanced chooser puts d on the other node");
    (fs, m, dir)
}

/// A directory made through another metadata node (its parent's) gets the
/// lease on its names from its own node: creates in it need no lookup of
/// their new names, as in a directory its parent's node made itself.
#[test]
fn creates_in_a_directory_made_on_another_node_need_no_lookup() {
    let (_fs, m, dir) = two_nodes();
    let file = |round: u32| dir.join(format!("f{round}"));
    let warm = |_| {
        std::fs::metadata(&dir).unwrap();
    };
    let create = fewest_requests(&m, warm, |r| {
        std::fs::OpenOptions::new().write(true).create_new(true).mode(0o644).open(file(r)).unwrap();
    });
    // create-and-open, and the release: no lookup of the new name.
    assert!(create <= 2, "create + close in a directory made elsewhere: {create} requests");
}

/// A rename of a file into a directory of another metadata node sends no
/// `Forget` after its commit: the step's record on the other node goes when
/// a later step's floor passes it. 3 requests in all through the mount
/// (4 with the `Forget`).
#[test]
fn a_rename_to_another_node_sends_no_forget() {
    let (fs, m, dir) = two_nodes();
    let name = |round: u32| format!("f{round}");
    // Until the counts stop moving: the file's release goes in the background.
    let warm = |round| {
        requests(&m, || {
            std::fs::write(fs.path(&name(round)), b"x").unwrap();
            std::fs::metadata(fs.path(&name(round))).unwrap();
            std::fs::metadata(&dir).unwrap();
        });
    };
    let rename = fewest_requests(&m, warm, |r| std::fs::rename(fs.path(&name(r)), dir.join(name(r))).unwrap());
    assert!(rename <= 3, "rename across nodes: {rename} requests");
}

/// Directory attributes are cached for the mount's --dir-attr-ttl-ms (1 s by
/// default): another mount's chmod of a directory shows after about that
/// long, and at once on a mount with 0.
#[test]
fn directory_attributes_changed_elsewhere_show_within_the_ttl() {
    use std::os::unix::fs::PermissionsExt;
    let fs = TestFs::up(&["--storage", "1"]);
    let uncached = fs.extra_mount("uncached", &["--dir-attr-ttl-ms", "0"]);
    let other = fs.second_mount();
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
    let (here, there, nocache) = (fs.path("d"), other.mnt.join("d"), uncached.mnt.join("d"));
    std::fs::create_dir(&here).unwrap();
    std::fs::set_permissions(&here, std::fs::Permissions::from_mode(0o755)).unwrap();
    // Through this mount its own change shows at once.
    assert_eq!(mode(&here), 0o755);
    assert_eq!(mode(&nocache), 0o755);
    std::fs::set_permissions(&there, std::fs::Permissions::from_mode(0o700)).unwrap();
    assert_eq!(mode(&nocache), 0o700, "a mount with --dir-attr-ttl-ms 0 sees the change at once");
    let start = std::time::Instant::now();
    while mode(&here) != 0o700 {
        // The bound is the TTL (1 s); the margin is for a loaded machine.
        assert!(start.elapsed() < std::time::Duration::from_secs(10), "chmod by another mount never showed");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    eprintln!("another mount's chmod showed after {:?}", start.elapsed());
}

/// The attributes of a lookup or create are cached by the kernel only under
/// a lease: a `stat` right after one still sees what another mount left on
/// close.
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
