//! Several metadata nodes (`hivefs up --meta 3`): directories spread over
//! the owners, operations across owners through the mount, and the crash
//! safety of the cross-node protocol — each protocol step is hit by the
//! crash hook (`HIVEFS_CRASH_AT`, an abort as `kill -9`), the dead service is
//! restarted by `hivefs up`, and the operation is then either fully applied
//! or not visible, with `hivefs fsck` clean.

// Raw system calls on the mount, as a program would make them (exact
// arguments, errno): the point of these tests.
#![allow(unsafe_code)]

mod common;

use common::*;
use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, Instant};

const UP: &[&str] = &["--meta", "3", "--storage", "1", "--targets-per-storage", "1"];

fn owner(fs: &TestFs, rel: &str) -> u64 {
    fs.entry_info(rel)["owner_meta_node"].as_u64().expect("owner_meta_node")
}

/// Whether `rel` exists, asked from the metadata nodes (`hivefs entry
/// info` walks the path itself; the kernel may cache a name for a second).
fn exists(fs: &TestFs, rel: &str) -> bool {
    hivefs(&["entry", "info", fs.path(rel).to_str().unwrap()]).status.success()
}

fn nlink(p: &Path) -> u64 {
    std::fs::metadata(p).unwrap().nlink()
}

/// Waits until no metadata node has a pending cross-node operation
/// (recovery of a restarted node finishes them), then `hivefs fsck --mount`
/// must be clean.
fn assert_fsck_clean(fs: &TestFs) {
    let start = Instant::now();
    loop {
        let o = hivefs(&["fsck", "--pending", "--mount", fs.mnt_s()]);
        if o.status.code() == Some(0) {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "cross-node operations still pending:\n{}\n{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    fs.assert_fsck_clean();
}

fn meta_dead(fs: &TestFs) -> Option<String> {
    (1..=3).map(|i| format!("meta{i}")).find(|s| !fs.alive(s))
}

/// Runs `op` on a file system armed with `hook`. Returns the op's result
/// and the service that crashed (restarted by `hivefs up`), if one did.
fn crash_case<T: Send + 'static>(
    fs: &TestFs,
    hook: &str,
    op: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> (std::io::Result<T>, Option<String>) {
    fs.arm(hook);
    let t = std::thread::spawn(op);
    let start = Instant::now();
    let crashed = loop {
        if let Some(s) = meta_dead(fs) {
            break Some(s);
        }
        if t.is_finished() {
            break None;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "{hook}: neither finished nor crashed");
        std::thread::sleep(Duration::from_millis(20));
    };
    if crashed.is_some() {
        fs.reup();
    }
    (t.join().expect("op thread"), crashed)
}

/// Directories of the root grouped by owner (created until every node owns one).
fn spread(fs: &TestFs, prefix: &str) -> BTreeMap<u64, Vec<String>> {
    let mut by: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    for i in 0..12 {
        let n = format!("{prefix}{i}");
        std::fs::create_dir(fs.path(&n)).unwrap();
        by.entry(owner(fs, &n)).or_default().push(n);
        if by.len() == 3 && i >= 2 {
            break;
        }
    }
    assert_eq!(by.len(), 3, "directories on all three metadata nodes: {by:?}");
    by
}

#[test]
fn directories_spread_and_cross_owner_operations_work() {
    // No periodic view refresh: each metadata node learns of the others
    // from mgmtd's notification when they register, before `up` returns.
    let fs = TestFs::up_with(UP, |fs| {
        for i in 1..=3 {
            std::fs::create_dir_all(fs.dir.join(format!("meta{i}"))).unwrap();
            std::fs::write(fs.dir.join(format!("meta{i}/meta.toml")), "target_refresh_ms = 3600000\n").unwrap();
        }
    });
    let root_owner = owner(&fs, "");
    // Balanced: six new directories in the root land on all three nodes,
    // counts (with the root) differing by at most one.
    let mut counts: BTreeMap<u64, u32> = BTreeMap::new();
    *counts.entry(root_owner).or_default() += 1;
    for i in 0..6 {
        std::fs::create_dir(fs.path(&format!("d{i}"))).unwrap();
        *counts.entry(owner(&fs, &format!("d{i}"))).or_default() += 1;
    }
    assert_eq!(counts.len(), 3, "owners {counts:?}");
    let (lo, hi) = (counts.values().min().unwrap(), counts.values().max().unwrap());
    assert!(hi - lo <= 1, "balanced owners {counts:?}");
    assert_eq!(nlink(&fs.mnt), 2 + 6);

    // Two directories on different owners.
    let names: Vec<String> = (0..6).map(|i| format!("d{i}")).collect();
    let a = names[0].clone();
    let b = names.iter().find(|n| owner(&fs, n) != owner(&fs, &a)).unwrap().clone();

    // Nested mkdir across owners; rmdir of non-empty and empty remote directories.
    std::fs::create_dir(fs.path(&format!("{a}/sub"))).unwrap();
    std::fs::write(fs.path(&format!("{a}/sub/file")), b"x").unwrap();
    assert_eq!(nlink(&fs.path(&a)), 3);
    assert_eq!(errno_of(std::fs::remove_dir(fs.path(&format!("{a}/sub")))), libc::ENOTEMPTY);
    std::fs::remove_file(fs.path(&format!("{a}/sub/file"))).unwrap();
    std::fs::remove_dir(fs.path(&format!("{a}/sub"))).unwrap();
    assert_eq!(nlink(&fs.path(&a)), 2);
    assert!(!fs.path(&format!("{a}/sub")).exists());

    // A file renamed between directories on different owners keeps its data
    // and xattrs; its inode moves to the new parent's owner.
    let f = fs.path(&format!("{a}/f"));
    std::fs::write(&f, b"hello across nodes").unwrap();
    xattr_set(&f, "user.k", b"v1");
    std::fs::rename(&f, fs.path(&format!("{b}/g"))).unwrap();
    assert!(!f.exists());
    let g = fs.path(&format!("{b}/g"));
    assert_eq!(std::fs::read(&g).unwrap(), b"hello across nodes");
    assert_eq!(xattr_get(&g, "user.k"), b"v1");
    assert_eq!(owner(&fs, &format!("{b}/g")), owner(&fs, &b));

    // Rename over an existing file on another owner (POSIX: replaced).
    std::fs::write(fs.path(&format!("{a}/h")), b"new").unwrap();
    std::fs::rename(fs.path(&format!("{a}/h")), &g).unwrap();
    assert_eq!(std::fs::read(&g).unwrap(), b"new");

    // A directory moved between parents on different owners: link counts
    // of both parents, its `..`, and its contents.
    std::fs::create_dir(fs.path(&format!("{a}/mv"))).unwrap();
    std::fs::write(fs.path(&format!("{a}/mv/in")), b"inside").unwrap();
    std::fs::rename(fs.path(&format!("{a}/mv")), fs.path(&format!("{b}/mv2"))).unwrap();
    assert_eq!(nlink(&fs.path(&a)), 2);
    assert_eq!(nlink(&fs.path(&b)), 3);
    assert_eq!(std::fs::read(fs.path(&format!("{b}/mv2/in"))).unwrap(), b"inside");
    // Over an existing empty directory on a third node, and refusal over a non-empty one.
    std::fs::create_dir(fs.path(&format!("{a}/empty"))).unwrap();
    std::fs::rename(fs.path(&format!("{b}/mv2")), fs.path(&format!("{a}/empty"))).unwrap();
    assert_eq!(std::fs::read(fs.path(&format!("{a}/empty/in"))).unwrap(), b"inside");
    std::fs::create_dir(fs.path(&format!("{b}/full"))).unwrap();
    std::fs::write(fs.path(&format!("{b}/full/x")), b"").unwrap();
    std::fs::create_dir(fs.path(&format!("{a}/other"))).unwrap();
    assert_eq!(
        errno_of(std::fs::rename(fs.path(&format!("{a}/other")), fs.path(&format!("{b}/full")))),
        libc::ENOTEMPTY
    );

    // Renaming a directory into its own subtree fails with EINVAL, across nodes.
    std::fs::create_dir_all(fs.path(&format!("{a}/t1/t2/t3"))).unwrap();
    let owners: Vec<u64> = ["", "/t1", "/t1/t2", "/t1/t2/t3"].iter().map(|s| owner(&fs, &format!("{a}{s}"))).collect();
    assert!(owners.windows(2).any(|w| w[0] != w[1]), "the chain spans nodes: {owners:?}");
    assert_eq!(errno_of(std::fs::rename(fs.path(&a), fs.path(&format!("{a}/t1/t2/t3/x")))), libc::EINVAL);
    assert_eq!(errno_of(std::fs::rename(fs.path(&format!("{a}/t1")), fs.path(&format!("{a}/t1/t2/x")))), libc::EINVAL);

    // Hard links within one owner and across owners: the inode stays on
    // its owner, which keeps the count; the last unlink removes it.
    let (l1, l2, l3) = (fs.path(&format!("{a}/l1")), fs.path(&format!("{a}/l2")), fs.path(&format!("{b}/l3")));
    std::fs::write(&l1, b"linked").unwrap();
    std::fs::hard_link(&l1, &l2).unwrap();
    assert_eq!(nlink(&l1), 2);
    std::fs::hard_link(&l1, &l3).unwrap();
    assert_eq!(nlink(&l1), 3);
    assert_eq!(std::fs::metadata(&l3).unwrap().ino(), std::fs::metadata(&l1).unwrap().ino());
    assert_eq!(std::fs::read(&l3).unwrap(), b"linked");
    assert_eq!(owner(&fs, &format!("{b}/l3")), owner(&fs, &a), "the inode stays with its owner");
    assert_eq!(errno_of(std::fs::hard_link(&l1, &l3)), libc::EEXIST);
    assert_fsck_clean(&fs);
    std::fs::remove_file(&l1).unwrap();
    std::fs::remove_file(&l2).unwrap();
    assert_eq!(nlink(&l3), 1);
    std::fs::write(&l3, b"through the remote name").unwrap();
    // A rename of the remote name (it keeps naming the owner's inode), and
    // a rename of another file over it (its link is dropped on the owner).
    let l4 = fs.path(&format!("{b}/l4"));
    std::fs::rename(&l3, &l4).unwrap();
    assert_eq!(std::fs::read(&l4).unwrap(), b"through the remote name");
    std::fs::hard_link(&l4, fs.path(&format!("{a}/l5"))).unwrap();
    std::fs::write(fs.path(&format!("{b}/over")), b"over").unwrap();
    std::fs::rename(fs.path(&format!("{b}/over")), &l4).unwrap();
    assert_eq!(std::fs::read(&l4).unwrap(), b"over");
    assert_eq!(nlink(&fs.path(&format!("{a}/l5"))), 1);
    std::fs::remove_file(fs.path(&format!("{a}/l5"))).unwrap();
    assert_fsck_clean(&fs);

    assert_fsck_clean(&fs);
    // Restart everything: the namespace is the same.
    fs.down();
    fs.reup();
    assert_eq!(std::fs::read(fs.path(&format!("{a}/empty/in"))).unwrap(), b"inside");
    assert_eq!(std::fs::read(&g).unwrap(), b"new");
    assert_fsck_clean(&fs);
}

fn xattr_set(p: &Path, name: &str, v: &[u8]) {
    let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
    let n = std::ffi::CString::new(name).unwrap();
    // SAFETY: valid C strings and buffer.
    let r = unsafe { libc::setxattr(c.as_ptr(), n.as_ptr(), v.as_ptr().cast(), v.len(), 0) };
    assert_eq!(r, 0, "setxattr {}: {}", p.display(), std::io::Error::last_os_error());
}

fn xattr_get(p: &Path, name: &str) -> Vec<u8> {
    let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
    let n = std::ffi::CString::new(name).unwrap();
    let mut buf = vec![0u8; 256];
    // SAFETY: valid C strings and buffer.
    let r = unsafe { libc::getxattr(c.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    assert!(r >= 0, "getxattr {}: {}", p.display(), std::io::Error::last_os_error());
    buf.truncate(r as usize);
    buf
}

const STEPS: [&str; 4] = ["intent", "peer", "remote", "commit"];

/// renameat2(RENAME_EXCHANGE).
fn exchange(a: &Path, b: &Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let (a, b) = (std::ffi::CString::new(a.as_os_str().as_bytes())?, std::ffi::CString::new(b.as_os_str().as_bytes())?);
    // SAFETY: two valid C strings; renameat2 reads them only.
    let r = unsafe { libc::renameat2(libc::AT_FDCWD, a.as_ptr(), libc::AT_FDCWD, b.as_ptr(), libc::RENAME_EXCHANGE) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// A directory that exists is fully there: a file can be made and removed in it.
fn usable_dir(fs: &TestFs, rel: &str, what: &str) {
    let probe = fs.path(&format!("{rel}/probe"));
    std::fs::write(&probe, b"p").unwrap_or_else(|e| panic!("{what}: {rel} exists but is not usable: {e}"));
    std::fs::remove_file(&probe).unwrap();
}

#[test]
fn each_protocol_step_survives_a_crash_of_either_server() {
    let fs = TestFs::up(UP);
    let by = spread(&fs, "s");
    let owners: Vec<u64> = by.keys().copied().collect();
    let (a, b) = (by[&owners[0]][0].clone(), by[&owners[1]][0].clone());

    // mkdir of a directory whose owner is another node than its parent's
    // (the chooser decides: names are tried until the protocol runs).
    for step in STEPS {
        let hook = format!("mkdir:{step}");
        let mut crashed = None;
        for k in 0..8 {
            let rel = format!("{a}/m-{step}-{k}");
            let p = fs.path(&rel);
            let (r, c) = crash_case(&fs, &hook, move || std::fs::create_dir(&p));
            let there = exists(&fs, &rel);
            assert!(r.is_err() || there, "{hook}: acknowledged mkdir is visible");
            if there {
                usable_dir(&fs, &rel, &hook);
            }
            if c.is_some() {
                crashed = c;
                break;
            }
        }
        assert!(crashed.is_some(), "{hook}: the hook never fired");
        assert_fsck_clean(&fs);
    }

    // rmdir of a directory owned by another node than its parent.
    for step in STEPS {
        let hook = format!("rmdir:{step}");
        let rel = (0..10)
            .map(|k| format!("{a}/r-{step}-{k}"))
            .find(|n| {
                std::fs::create_dir(fs.path(n)).unwrap();
                owner(&fs, n) != owner(&fs, &a)
            })
            .expect("a directory on another node");
        let p = fs.path(&rel);
        let (r, c) = crash_case(&fs, &hook, move || std::fs::remove_dir(&p));
        assert!(c.is_some(), "{hook}: the hook never fired");
        let there = exists(&fs, &rel);
        assert!(r.is_err() || !there, "{hook}: acknowledged rmdir is applied ({r:?})");
        if there {
            usable_dir(&fs, &rel, &hook);
        }
        assert_fsck_clean(&fs);
    }

    // rename of a file, then of a directory, between parents on different nodes.
    for (dir, step) in STEPS.iter().map(|s| (false, *s)).chain([(true, "intent"), (true, "peer")]) {
        let hook = format!("rename:{step}");
        let what = format!("{hook} of a {}", if dir { "directory" } else { "file" });
        let (src, dst) = (format!("{a}/src-{dir}-{step}"), format!("{b}/dst-{dir}-{step}"));
        let body = format!("contents {step}").into_bytes();
        let file = |rel: &str| if dir { fs.path(&format!("{rel}/in")) } else { fs.path(rel) };
        if dir {
            std::fs::create_dir(fs.path(&src)).unwrap();
        }
        std::fs::write(file(&src), &body).unwrap();
        let (s2, d2) = (fs.path(&src), fs.path(&dst));
        let (r, c) = crash_case(&fs, &hook, move || std::fs::rename(&s2, &d2));
        assert!(c.is_some(), "{what}: the hook never fired");
        let (at_src, at_dst) = (exists(&fs, &src), exists(&fs, &dst));
        assert!(r.is_err() || at_dst, "{what}: acknowledged rename is applied ({r:?})");
        assert!(at_src != at_dst, "{what}: exactly one name (source {at_src}, destination {at_dst})");
        let now = if at_dst { &dst } else { &src };
        assert_eq!(std::fs::read(file(now)).unwrap(), body, "{what}: contents");
        assert_fsck_clean(&fs);
    }

    // RENAME_EXCHANGE of two files, then of a directory and a file, in
    // parents on different nodes: afterwards both names exist and hold either
    // both swapped or both original contents.
    for (dir, step) in STEPS.iter().map(|s| (false, *s)).chain([(true, "remote"), (true, "commit")]) {
        let hook = format!("exchange:{step}");
        let what = format!("{hook} with a {}", if dir { "directory" } else { "file" });
        let (x, y) = (format!("{a}/xa-{dir}-{step}"), format!("{b}/xb-{dir}-{step}"));
        if dir {
            std::fs::create_dir(fs.path(&x)).unwrap();
        }
        std::fs::write(if dir { fs.path(&format!("{x}/in")) } else { fs.path(&x) }, b"x").unwrap();
        std::fs::write(fs.path(&y), b"y").unwrap();
        let (x2, y2) = (fs.path(&x), fs.path(&y));
        let (r, c) = crash_case(&fs, &hook, move || exchange(&x2, &y2));
        assert!(c.is_some(), "{what}: the hook never fired");
        assert!(exists(&fs, &x) && exists(&fs, &y), "{what}: both names exist");
        let swapped = if dir { fs.path(&y).is_dir() } else { std::fs::read(fs.path(&x)).unwrap() == b"y" };
        assert!(r.is_err() || swapped, "{what}: acknowledged exchange is applied ({r:?})");
        let (at_x, at_y) = if swapped { (y.clone(), x.clone()) } else { (x.clone(), y.clone()) };
        let inner = if dir { format!("{at_x}/in") } else { at_x.clone() };
        assert_eq!(std::fs::read(fs.path(&inner)).unwrap(), b"x", "{what}: contents of the first entry");
        assert_eq!(std::fs::read(fs.path(&at_y)).unwrap(), b"y", "{what}: contents of the second entry");
        assert_fsck_clean(&fs);
    }

    // A hard link in a directory on another node than the file's, then the
    // unlink of that name.
    for step in STEPS {
        let hook = format!("link:{step}");
        let (src, dst) = (format!("{a}/ls-{step}"), format!("{b}/ld-{step}"));
        std::fs::write(fs.path(&src), step.as_bytes()).unwrap();
        let (s2, d2) = (fs.path(&src), fs.path(&dst));
        let (r, c) = crash_case(&fs, &hook, move || std::fs::hard_link(&s2, &d2));
        assert!(c.is_some(), "{hook}: the hook never fired");
        let there = exists(&fs, &dst);
        assert!(r.is_err() || there, "{hook}: acknowledged link is applied ({r:?})");
        assert_fsck_clean(&fs);
        assert_eq!(nlink(&fs.path(&src)), if there { 2 } else { 1 }, "{hook}: link count");
        if !there {
            std::fs::hard_link(fs.path(&src), fs.path(&dst)).unwrap();
        }
        assert_eq!(std::fs::read(fs.path(&dst)).unwrap(), step.as_bytes(), "{hook}: contents");

        let hook = format!("unlink:{step}");
        let d2 = fs.path(&dst);
        let (r, c) = crash_case(&fs, &hook, move || std::fs::remove_file(&d2));
        assert!(c.is_some(), "{hook}: the hook never fired");
        let there = exists(&fs, &dst);
        assert!(r.is_err() || !there, "{hook}: acknowledged unlink is applied ({r:?})");
        assert_fsck_clean(&fs);
        assert_eq!(nlink(&fs.path(&src)), if there { 2 } else { 1 }, "{hook}: link count");
    }
}

/// A file open while a rename moves its inode to another metadata node:
/// writes and the close through the open handle reach the new owner.
#[test]
fn an_open_file_moved_to_another_node_keeps_working() {
    use std::io::Write;
    let fs = TestFs::up(UP);
    let by = spread(&fs, "o");
    let owners: Vec<u64> = by.keys().copied().collect();
    let (a, b) = (by[&owners[0]][0].clone(), by[&owners[1]][0].clone());
    let src = fs.path(&format!("{a}/open"));
    let dst = fs.path(&format!("{b}/moved"));
    let mut f = std::fs::OpenOptions::new().create(true).write(true).truncate(true).open(&src).unwrap();
    f.write_all(b"before the move, ").unwrap();
    f.flush().unwrap();
    std::fs::rename(&src, &dst).unwrap();
    assert_eq!(owner(&fs, &format!("{b}/moved")), owner(&fs, &b), "the inode moved");
    f.write_all(b"after the move").unwrap();
    f.sync_all().unwrap();
    drop(f);
    let want = b"before the move, after the move";
    assert_eq!(std::fs::metadata(&dst).unwrap().len(), want.len() as u64);
    assert_eq!(std::fs::read(&dst).unwrap(), want);
    // Another mount (no cached attributes) sees the size the metadata node holds.
    let m2 = fs.second_mount();
    assert_eq!(std::fs::metadata(m2.mnt.join(format!("{b}/moved"))).unwrap().len(), want.len() as u64);
    drop(m2);
    assert_fsck_clean(&fs);
}
