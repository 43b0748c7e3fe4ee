//! Whole copies between directories of the local disk: every type of entry,
//! `--update`, `--part` with `--dir-attrs-only`, failures of single entries.

use crate::attrs::is_root;
use crate::snapshot::{differences, snapshot, Compare};
use crate::{copy, plan, Failure, Options, Part, Progress, Summary};
use rustix::fs::{AtFlags, Mode, Timespec, Timestamps, CWD};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

const MIB: u64 = 1 << 20;

fn set_times(p: &Path, sec: i64, nsec: i64) {
    let t = Timestamps {
        last_access: Timespec { tv_sec: sec - 1000, tv_nsec: nsec / 3 },
        last_modification: Timespec { tv_sec: sec, tv_nsec: nsec },
    };
    rustix::fs::utimensat(CWD, p, &t, AtFlags::SYMLINK_NOFOLLOW).unwrap();
}

fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A tree with every type of entry the copy keeps; times set last.
fn sample(root: &Path) {
    let p = |s: &str| root.join(s);
    for d in ["d", "d/empty", "d/sub", "odd", "links"] {
        std::fs::create_dir(p(d)).unwrap();
    }
    std::fs::write(p("d/small"), b"hello").unwrap();
    std::fs::write(p("d/empty-file"), b"").unwrap();
    // 5.5 ranges of 1 MiB, each range different.
    let big: Vec<u8> = (0..(5 * MIB + MIB / 2)).map(|i| (i / 4099 % 253) as u8).collect();
    std::fs::write(p("d/sub/big"), &big).unwrap();
    // Sparse: data at 0, at 3 MiB + 7 (a range boundary inside a hole), a hole at the end.
    let f = std::fs::File::create(p("d/sparse")).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &[1u8; 10_000], 0).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, b"middle", 3 * MIB + 7).unwrap();
    f.set_len(6 * MIB).unwrap();
    std::os::unix::fs::symlink("small", p("d/link")).unwrap();
    std::os::unix::fs::symlink("../nowhere/at/all", p("d/dangling")).unwrap();
    std::fs::write(p("links/a"), b"one inode, three names").unwrap();
    std::fs::hard_link(p("links/a"), p("links/b")).unwrap();
    std::fs::hard_link(p("links/a"), p("d/c")).unwrap();
    std::fs::write(p("links/big1"), &big[..(2 * MIB + 3) as usize]).unwrap();
    std::fs::hard_link(p("links/big1"), p("links/big2")).unwrap();
    rustix::fs::mknodat(CWD, p("d/fifo"), rustix::fs::FileType::Fifo, Mode::from_raw_mode(0o640), 0).unwrap();
    std::fs::write(p("odd/suid"), b"#!/bin/sh\n").unwrap();
    chmod(&p("odd/suid"), 0o4755);
    std::fs::write(p("odd/ro"), b"read only").unwrap();
    chmod(&p("odd/ro"), 0o444);
    if is_root() {
        let dev = rustix::fs::makedev(1, 3);
        rustix::fs::mknodat(CWD, p("d/null"), rustix::fs::FileType::CharacterDevice, Mode::from_raw_mode(0o666), dev)
            .unwrap();
        std::fs::write(p("d/theirs"), b"owned by someone else").unwrap();
        std::os::unix::fs::lchown(p("d/theirs"), Some(1234), Some(5678)).unwrap();
        std::os::unix::fs::lchown(p("d/dangling"), Some(4321), Some(8765)).unwrap();
        std::os::unix::fs::lchown(p("d/sub"), Some(1234), Some(5678)).unwrap();
    }
    let _ = rustix::fs::lsetxattr(p("d/small"), "user.origin", b"sample", rustix::fs::XattrFlags::empty());
    let mut all = snapshot(root).unwrap().into_keys().collect::<Vec<_>>();
    // Deepest first: setting a time does not touch the parent's.
    all.sort_by_key(|r| std::cmp::Reverse(r.components().count()));
    for (i, rel) in all.iter().enumerate() {
        set_times(&root.join(rel), 1_600_000_000 + i as i64, 123_456_789 + i as i64);
    }
    chmod(&p("odd"), 0o1751);
    chmod(&p("d/empty"), 0o500);
}

fn run(srcs: &[PathBuf], dst: &Path, opts: &Options) -> Summary {
    let jobs = plan(srcs, dst, false, opts.part.is_split() || opts.dir_attrs_only).unwrap();
    let seen = Mutex::new(Vec::new());
    let s = copy(&jobs, opts, &Progress::default(), &|f: &Failure| seen.lock().unwrap().push(f.clone()));
    assert_eq!(seen.lock().unwrap().len() as u64, s.errors);
    s
}

fn opts() -> Options {
    Options { workers: 4, range_size: MIB, ..Options::default() }
}

type Snap = std::collections::BTreeMap<PathBuf, crate::snapshot::Item>;

/// The copy at `dst` against a snapshot of its source taken before the copy.
fn assert_same(src: &Snap, dst: &Path) {
    let c = Compare { atime: true, skip_owner: !is_root() };
    let d = differences(src, &snapshot(dst).unwrap(), c);
    assert!(d.is_empty(), "{} differences:\n{}", d.len(), d.join("\n"));
}

#[test]
fn a_copy_keeps_every_type_attribute_hole_and_link() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    std::fs::create_dir(&src).unwrap();
    sample(&src);
    let before = snapshot(&src).unwrap();
    let s = run(std::slice::from_ref(&src), &t.path().join("dst"), &opts());
    assert_eq!(s.errors, 0, "{:?}", s.failures);
    let dst = t.path().join("dst");
    assert_same(&before, &dst);
    // links/{a,b} and d/c are one inode; big1 and big2 another.
    assert_eq!((s.hard_links, s.symlinks), (3, 2));
    assert_eq!(
        std::fs::metadata(dst.join("links/b")).unwrap().ino(),
        std::fs::metadata(dst.join("d/c")).unwrap().ino()
    );
    let blocks = std::fs::metadata(dst.join("d/sparse")).unwrap().blocks() * 512;
    assert!(blocks < MIB, "the sparse copy has {blocks} bytes allocated");
    assert!(s.hole_bytes > 5 * MIB, "{s:?}");
    if rustix::fs::lgetxattr(src.join("d/small"), "user.origin", &mut [0u8; 16][..]).is_ok() {
        let mut v = [0u8; 16];
        let n = rustix::fs::lgetxattr(dst.join("d/small"), "user.origin", &mut v[..]).unwrap();
        assert_eq!(&v[..n], b"sample");
    }
}

#[test]
fn update_copies_nothing_again_then_only_what_changed() {
    let t = tempfile::tempdir().unwrap();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    std::fs::create_dir(&src).unwrap();
    sample(&src);
    // Into an existing directory: each run copies to dst/src (`cp -a` semantics).
    std::fs::create_dir(&dst).unwrap();
    let o = Options { update: true, ..opts() };
    let first = run(std::slice::from_ref(&src), &dst, &o);
    assert!(first.files > 0 && first.errors == 0);
    let again = run(std::slice::from_ref(&src), &dst, &Options { workers: 1, ..o.clone() });
    assert_eq!(
        (again.files, again.bytes, again.symlinks, again.specials, again.hard_links),
        (0, 0, 0, 0, 0),
        "{again:?}"
    );
    assert!(again.skipped >= first.files + first.symlinks, "{again:?}");
    // Same size, other contents and time: only this file again.
    std::fs::write(src.join("d/small"), b"HELLO").unwrap();
    let third = run(std::slice::from_ref(&src), &dst, &o);
    assert_eq!((third.files, third.bytes, third.errors), (1, 5, 0), "{third:?}");
    assert_same(&snapshot(&src).unwrap(), &dst.join("src"));
}

#[test]
fn parts_and_a_final_attributes_pass_make_the_same_tree_as_one_run() {
    let t = tempfile::tempdir().unwrap();
    let (src, one, parts) = (t.path().join("src"), t.path().join("one"), t.path().join("parts"));
    std::fs::create_dir(&src).unwrap();
    sample(&src);
    let before = snapshot(&src).unwrap();
    run(std::slice::from_ref(&src), &one, &opts());
    std::fs::create_dir(&parts).unwrap();
    let n = 3;
    let mut files = 0;
    for i in (1..=n).rev() {
        let s = run(std::slice::from_ref(&src), &parts, &Options { part: Part { index: i, count: n }, ..opts() });
        assert_eq!(s.errors, 0, "{:?}", s.failures);
        files += s.files;
    }
    // The big file's ranges went to several parts (each counts it).
    assert!(files >= 10, "{files}");
    let s = run(std::slice::from_ref(&src), &parts, &Options { dir_attrs_only: true, ..opts() });
    assert_eq!((s.files, s.bytes, s.errors), (0, 0, 0));
    assert_same(&before, &parts.join("src"));
    assert_same(&snapshot(&one).unwrap(), &parts.join("src"));
}

#[test]
fn a_failing_entry_is_reported_with_its_path_and_the_others_are_copied() {
    let t = tempfile::tempdir().unwrap();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    std::fs::create_dir_all(&src).unwrap();
    for i in 0..20 {
        std::fs::write(src.join(format!("f{i}")), format!("{i}")).unwrap();
    }
    // A directory where the copy of f7 should go.
    std::fs::create_dir_all(dst.join("src/f7/inside")).unwrap();
    let s = run(std::slice::from_ref(&src), &dst, &Options { workers: 3, ..opts() });
    assert_eq!((s.errors, s.files), (1, 19), "{s:?}");
    assert_eq!(s.failures[0].path, dst.join("src/f7").display().to_string());
    assert!(s.failures[0].op.contains("overwrite directory"), "{:?}", s.failures);
    assert_eq!(std::fs::read(dst.join("src/f19")).unwrap(), b"19");
}

#[test]
fn existing_entries_of_another_type_are_replaced() {
    let t = tempfile::tempdir().unwrap();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    std::fs::create_dir_all(&src).unwrap();
    std::fs::create_dir_all(dst.join("src")).unwrap();
    std::fs::write(src.join("was-link"), b"file").unwrap();
    std::os::unix::fs::symlink("target", src.join("was-file")).unwrap();
    std::fs::write(t.path().join("outside"), b"must stay").unwrap();
    // A symlink in the destination is replaced, not written through.
    std::os::unix::fs::symlink(t.path().join("outside"), dst.join("src/was-link")).unwrap();
    std::fs::write(dst.join("src/was-file"), b"old").unwrap();
    let before = snapshot(&src).unwrap();
    let s = run(std::slice::from_ref(&src), &dst, &opts());
    assert_eq!(s.errors, 0, "{:?}", s.failures);
    assert_eq!(std::fs::read(t.path().join("outside")).unwrap(), b"must stay");
    assert_same(&before, &dst.join("src"));
    assert!(std::fs::symlink_metadata(dst.join("src/was-file")).unwrap().file_type().is_symlink());
}
