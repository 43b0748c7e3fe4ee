//! Which operation updates which timestamp. Times have nanosecond resolution
//! and every operation is its own metadata request, so "updated" is checked
//! as "strictly later than before".

use crate::*;

/// Snapshot of (atime, mtime, ctime).
fn t(p: &Path) -> [(i64, i64); 3] {
    let st = lstat(p);
    [atime(&st), mtime(&st), ctime(&st)]
}

#[track_caller]
fn later(before: (i64, i64), after: (i64, i64), what: &str) {
    assert!(after > before, "{what}: expected a later time than {before:?}, got {after:?}");
}

#[track_caller]
fn same(before: (i64, i64), after: (i64, i64), what: &str) {
    assert_eq!(before, after, "{what}: time must not change");
}

const A: usize = 0;
const M: usize = 1;
const C: usize = 2;

pub fn timestamps(fs: &TestFs) {
    let d = base(fs, "times", 0o755);
    let d2 = base(fs, "times/other", 0o755);
    let f = d.join("f");

    // create: the parent's mtime and ctime.
    let pd = t(&d);
    write_file(&f, b"");
    let (pd2, tf) = (t(&d), t(&f));
    later(pd[M], pd2[M], "create: parent mtime");
    later(pd[C], pd2[C], "create: parent ctime");
    assert_eq!(tf[M], tf[C], "a new file's mtime equals its ctime");
    // mkdir / symlink / mknod: the same.
    for (what, mk) in [
        ("mkdir", Box::new(|p: &Path| mkdir(p, 0o755)) as Box<dyn Fn(&Path)>),
        ("symlink", Box::new(|p: &Path| std::os::unix::fs::symlink("f", p).unwrap())),
        // SAFETY: valid C string.
        (
            "mkfifo",
            Box::new(|p: &Path| {
                ok(unsafe { libc::mkfifo(cs(p).as_ptr(), 0o644) }, "mkfifo");
            }),
        ),
    ] {
        let before = t(&d);
        mk(&d.join(what));
        let after = t(&d);
        later(before[M], after[M], &format!("{what}: parent mtime"));
        later(before[C], after[C], &format!("{what}: parent ctime"));
    }
    let pd = t(&d);
    // SAFETY: valid C string.
    ok(unsafe { libc::rmdir(cs(&d.join("mkdir")).as_ptr()) }, "rmdir");
    let after = t(&d);
    later(pd[M], after[M], "rmdir: parent mtime");
    later(pd[C], after[C], "rmdir: parent ctime");

    // write: mtime and ctime of the file, not of the parent.
    let (b, pd) = (t(&f), t(&d));
    write_file(&f, b"hello");
    let a = t(&f);
    later(b[M], a[M], "write: mtime");
    later(b[C], a[C], "write: ctime");
    same(pd[M], t(&d)[M], "write: parent mtime");
    // ... also seen through the writer's descriptor before it is closed.
    let mut file = std::fs::OpenOptions::new().write(true).open(&f).unwrap();
    let b = t(&f);
    std::io::Write::write_all(&mut file, b"J").unwrap();
    let a = t(&f);
    later(b[M], a[M], "write (file still open): mtime");
    later(b[C], a[C], "write (file still open): ctime");
    drop(file);

    // truncate and ftruncate.
    let b = t(&f);
    // SAFETY: valid C string.
    ok(unsafe { libc::truncate(cs(&f).as_ptr(), 2) }, "truncate");
    let a = t(&f);
    later(b[M], a[M], "truncate: mtime");
    later(b[C], a[C], "truncate: ctime");
    let file = std::fs::OpenOptions::new().write(true).open(&f).unwrap();
    let b = t(&f);
    file.set_len(1).unwrap();
    let a = t(&f);
    later(b[M], a[M], "ftruncate: mtime");
    later(b[C], a[C], "ftruncate: ctime");
    drop(file);
    // open(O_TRUNC) of a non-empty file.
    let b = t(&f);
    write_file(&f, b"");
    let a = t(&f);
    later(b[M], a[M], "O_TRUNC: mtime");
    later(b[C], a[C], "O_TRUNC: ctime");
    // ... also of an empty file: Linux updates the times whenever O_TRUNC is given.
    let b = t(&f);
    assert_eq!(open_e(&cs(&f), libc::O_WRONLY | libc::O_TRUNC, 0), 0);
    let a = t(&f);
    later(b[M], a[M], "O_TRUNC of an empty file: mtime");
    later(b[C], a[C], "O_TRUNC of an empty file: ctime");

    // chmod / chown: ctime only.
    for (what, op) in [
        ("chmod", Box::new(|p: &Path| chmod(p, 0o640)) as Box<dyn Fn(&Path)>),
        ("chown", Box::new(|p: &Path| chown(p, 5, 6))),
    ] {
        let b = t(&f);
        op(&f);
        let a = t(&f);
        same(b[M], a[M], &format!("{what}: mtime"));
        same(b[A], a[A], &format!("{what}: atime"));
        later(b[C], a[C], &format!("{what}: ctime"));
    }

    // link: the inode's ctime, the new parent's mtime and ctime.
    let (b, pd) = (t(&f), t(&d2));
    std::fs::hard_link(&f, d2.join("hl")).unwrap();
    let (a, pa) = (t(&f), t(&d2));
    later(b[C], a[C], "link: ctime of the inode");
    same(b[M], a[M], "link: mtime of the inode");
    later(pd[M], pa[M], "link: parent mtime");
    later(pd[C], pa[C], "link: parent ctime");
    // unlink of one link: the same.
    let (b, pd) = (t(&f), t(&d));
    std::fs::remove_file(&f).unwrap();
    let (a, pa) = (t(&d2.join("hl")), t(&d));
    later(b[C], a[C], "unlink: ctime of the remaining inode");
    later(pd[M], pa[M], "unlink: parent mtime");
    later(pd[C], pa[C], "unlink: parent ctime");

    // rename across directories: the moved inode's ctime (as Linux), both parents.
    let src = d2.join("hl");
    let (b, p1, p2) = (t(&src), t(&d2), t(&d));
    std::fs::rename(&src, d.join("moved")).unwrap();
    let (a, q1, q2) = (t(&d.join("moved")), t(&d2), t(&d));
    later(b[C], a[C], "rename: ctime of the moved inode");
    same(b[M], a[M], "rename: mtime of the moved inode");
    later(p1[M], q1[M], "rename: source parent mtime");
    later(p1[C], q1[C], "rename: source parent ctime");
    later(p2[M], q2[M], "rename: target parent mtime");
    later(p2[C], q2[C], "rename: target parent ctime");
    // rename within one directory.
    let (b, p) = (t(&d.join("moved")), t(&d));
    std::fs::rename(d.join("moved"), d.join("moved2")).unwrap();
    let (a, q) = (t(&d.join("moved2")), t(&d));
    later(b[C], a[C], "rename in place: ctime");
    later(p[M], q[M], "rename in place: parent mtime");

    // xattr changes touch ctime.
    let g = d.join("moved2");
    let b = t(&g);
    // SAFETY: valid C strings and buffer.
    ok(unsafe { libc::setxattr(cs(&g).as_ptr(), c"user.t".as_ptr(), b"v".as_ptr().cast(), 1, 0) }, "setxattr");
    let a = t(&g);
    later(b[C], a[C], "setxattr: ctime");
    same(b[M], a[M], "setxattr: mtime");

    // utimensat: explicit times, UTIME_NOW and UTIME_OMIT.
    let cg = cs(&g);
    let set = |ts: [libc::timespec; 2]| {
        // SAFETY: valid C string and two-element array.
        ok(unsafe { libc::utimensat(libc::AT_FDCWD, cg.as_ptr(), ts.as_ptr(), 0) }, "utimensat");
    };
    let at = |s: i64, ns: i64| libc::timespec { tv_sec: s, tv_nsec: ns };
    let b = t(&g);
    set([at(1_000, 1), at(2_000, 2)]);
    let a = t(&g);
    assert_eq!((a[A], a[M]), ((1_000, 1), (2_000, 2)), "explicit times with nanoseconds");
    later(b[C], a[C], "utimensat: ctime");
    set([at(0, libc::UTIME_OMIT), at(3_000, 0)]);
    let a2 = t(&g);
    assert_eq!((a2[A], a2[M]), ((1_000, 1), (3_000, 0)), "UTIME_OMIT leaves atime");
    set([at(4_000, 0), at(0, libc::UTIME_OMIT)]);
    let a3 = t(&g);
    assert_eq!((a3[A], a3[M]), ((4_000, 0), (3_000, 0)), "UTIME_OMIT leaves mtime");
    let wall = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    set([at(0, libc::UTIME_NOW), at(0, libc::UTIME_OMIT)]);
    let a4 = t(&g);
    assert!(a4[A].0 >= wall - 60 && a4[A].0 <= wall + 60, "UTIME_NOW sets atime to the present: {:?}", a4[A]);
    assert_eq!(a4[M], (3_000, 0));
    set([at(0, libc::UTIME_NOW), at(0, libc::UTIME_NOW)]);
    let a5 = t(&g);
    assert!(a5[M].0 >= wall - 60, "UTIME_NOW sets mtime to the present: {:?}", a5[M]);
    later(a4[C], a5[C], "utimensat(now): ctime");
    // Times before the epoch round-trip.
    set([at(-100, 0), at(-200, 0)]);
    let a6 = t(&g);
    assert_eq!((a6[A].0, a6[M].0), (-100, -200), "times before 1970");

    // Reading never changes mtime or ctime (the mount is noatime: atime stays too).
    set([at(5_000, 0), at(6_000, 0)]);
    let b = t(&g);
    let _ = std::fs::read(&g).unwrap();
    let a = t(&g);
    same(b[M], a[M], "read: mtime");
    same(b[C], a[C], "read: ctime");
    same(b[A], a[A], "read on a noatime mount: atime");
}
