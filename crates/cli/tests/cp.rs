//! `hivefs cp` between the local disk and a real HiveFS mount: a tree with
//! every type of entry goes in and comes back out the same (`diff -r`, and
//! entry by entry: type, mode, owner, size, times to the nanosecond, device
//! numbers, link groups; the sparse file's allocation), `--update` resumes,
//! `--part` runs plus `--dir-attrs-only` make the tree one run makes, and bad
//! input is refused.

mod common;

use common::*;
use hivefs_copy::snapshot::{differences, snapshot, Compare, Item};
use serde_json::Value;
use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

const MIB: u64 = 1 << 20;

/// A tree of every type of entry, made with the shell tools a user would
/// use: `d/sub/big` is 5.5 ranges of 1 MiB, `d/sparse` 8 MiB with 2 small
/// data regions (one at 3 MiB + 7, inside a range), links/a has 3 names.
const TREE: &str = r#"set -e
cd "$1"
mkdir -p d/empty d/sub odd links
printf hello > d/small
: > d/empty-file
head -c 5767168 /dev/urandom > d/sub/big
head -c 10000 /dev/urandom > d/sparse
printf middle | dd of=d/sparse bs=1 seek=3145735 conv=notrunc status=none
truncate -s 8M d/sparse
ln -s small d/link
ln -s ../nowhere/at/all d/dangling
printf 'one inode, three names' > links/a
ln links/a links/b
ln links/a d/c
mkfifo -m 640 d/fifo
mknod -m 666 d/null c 1 3
printf theirs > d/theirs
chown -h 1234:5678 d/theirs d/dangling d/sub
printf '#!/bin/sh\n' > odd/suid
chmod 4755 odd/suid
printf ro > odd/ro
chmod 444 odd/ro
"#;

fn make_tree(root: &Path) {
    std::fs::create_dir_all(root).unwrap();
    let st = Command::new("sh").args(["-c", TREE, "sh"]).arg(root).status().unwrap();
    assert!(st.success(), "building the tree");
    // Each entry its own time, deepest first (a child's time leaves its parent's).
    let mut rels: Vec<PathBuf> = snapshot(root).unwrap().into_keys().collect();
    rels.sort_by_key(|r| std::cmp::Reverse(r.components().count()));
    for (i, rel) in rels.iter().enumerate() {
        let at = format!("@{}.{:09}", 1_600_000_000 + i, 123_456_789 + i);
        let st = Command::new("touch").args(["-h", "-d", &at]).arg(root.join(rel)).status().unwrap();
        assert!(st.success());
    }
    for (mode, rel) in [("1751", "odd"), ("500", "d/empty")] {
        assert!(Command::new("chmod").args([mode, root.join(rel).to_str().unwrap()]).status().unwrap().success());
    }
}

/// `hivefs cp --json ARGS`, which must succeed; its summary.
fn cp(args: &[&Path]) -> Value {
    let mut all: Vec<&str> = vec!["cp", "--json", "--progress", "never", "--range-size", "1m"];
    all.extend(args.iter().map(|p| p.to_str().unwrap()));
    serde_json::from_str(&hivefs_ok(&all)).unwrap()
}

fn counts(v: &Value, keys: &[&str]) -> Vec<u64> {
    keys.iter().map(|k| v[k].as_u64().unwrap_or_else(|| panic!("{k} in {v}"))).collect()
}

fn assert_same(before: &BTreeMap<PathBuf, Item>, copy: &Path) {
    let d = differences(before, &snapshot(copy).unwrap(), Compare { atime: true, skip_owner: false });
    assert!(d.is_empty(), "{} differences in {}:\n{}", d.len(), copy.display(), d.join("\n"));
}

/// `diff -r` without following symlinks: nothing may be reported but special
/// files of the same type on both sides (diff does not compare FIFOs, and
/// device nodes only sometimes).
fn assert_diff_r(a: &Path, b: &Path) {
    let o = Command::new("diff").args(["-r", "--no-dereference"]).arg(a).arg(b).output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    let same_kind = |l: &str| {
        let kinds: Vec<&str> = l.split(" is a ").skip(1).map(|k| k.split(" while file ").next().unwrap()).collect();
        l.starts_with("File ") && kinds.len() == 2 && kinds[0] == kinds[1]
    };
    let other: Vec<&str> = out.lines().filter(|l| !same_kind(l)).collect();
    assert!(
        other.is_empty() && o.stderr.is_empty(),
        "diff -r {a:?} {b:?}:\n{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(out.contains("fifo"), "diff did not see the FIFOs: {out}");
}

fn local_dir() -> tempfile::TempDir {
    tempfile::tempdir_in("/var/tmp").unwrap()
}

/// A file system, a local directory with the tree in `src`, and its snapshot.
fn with_tree() -> (TestFs, tempfile::TempDir, PathBuf, BTreeMap<PathBuf, Item>) {
    let fs = TestFs::up(&[]);
    let local = local_dir();
    let src = local.path().join("src");
    make_tree(&src);
    let before = snapshot(&src).unwrap();
    (fs, local, src, before)
}

#[test]
fn a_tree_of_every_type_goes_into_hivefs_and_back_out_the_same() {
    let (fs, local, src, before) = with_tree();

    let into = cp(&[&src, &fs.mnt]);
    let keys = ["errors", "files", "symlinks", "hard_links", "specials", "dirs"];
    assert_eq!(counts(&into, &keys), [0, 8, 2, 2, 2, 6], "{into}");
    assert_eq!(into["bytes"].as_u64().unwrap() + into["hole_bytes"].as_u64().unwrap(), 8 * MIB + 5_767_168 + 45);
    assert!(into["hole_bytes"].as_u64().unwrap() > 7 * MIB, "{into}");
    let inside = fs.path("src");
    assert_same(&before, &inside);
    assert_diff_r(&src, &inside);
    // The holes are holes on the storage targets too.
    let allocated = fs.chunk_blocks("src/d/sparse");
    assert!(allocated < MIB, "{allocated} bytes of chunk files for 10 KB of data");
    assert!(fs.chunk_blocks("src/d/sub/big") >= 5_767_168);

    let back = local.path().join("back");
    let out = cp(&[&inside, &back]);
    assert_eq!(counts(&out, &keys), [0, 8, 2, 2, 2, 6], "{out}");
    assert_same(&before, &back);
    assert_diff_r(&src, &back);
    let blocks = std::fs::metadata(back.join("d/sparse")).unwrap().blocks() * 512;
    assert!(blocks < MIB, "the copy out of HiveFS has {blocks} bytes allocated");
    let ino = |p: &str| std::fs::metadata(back.join(p)).unwrap().ino();
    assert!(ino("links/a") == ino("links/b") && ino("links/a") == ino("d/c"));

    // Within the mount (copy_file_range: the storage servers copy), then out again.
    let again = cp(&[&inside, &fs.path("again")]);
    assert_eq!(counts(&again, &keys), [0, 8, 2, 2, 2, 6], "{again}");
    assert_same(&before, &fs.path("again"));
    fs.assert_fsck_clean();
}

#[test]
fn update_copies_nothing_the_second_time_and_then_only_what_changed() {
    let (fs, _local, src, _) = with_tree();
    let first = cp(&[Path::new("-u"), &src, &fs.mnt]);
    assert_eq!(counts(&first, &["errors", "files", "skipped"]), [0, 8, 0]);
    let second = cp(&[Path::new("-u"), &src, &fs.mnt]);
    let nothing = ["files", "bytes", "symlinks", "specials", "hard_links", "errors"];
    assert_eq!(counts(&second, &nothing), [0; 6], "{second}");
    // 8 files, 2 symlinks, 2 specials, 2 names already linked.
    assert_eq!(counts(&second, &["skipped"]), [14], "{second}");

    // A source file changed (same size), and a copy left half-written (as by
    // an interrupted run: its time is not the source's yet).
    std::fs::write(src.join("d/small"), b"HELLO").unwrap();
    let big = fs.path("src/d/sub/big");
    let f = std::fs::OpenOptions::new().write(true).open(&big).unwrap();
    f.set_len(MIB).unwrap();
    drop(f);
    let third = cp(&[Path::new("-u"), &src, &fs.mnt]);
    assert_eq!(counts(&third, &["files", "bytes", "errors"]), [2, 5 + 5_767_168, 0], "{third}");
    assert_same(&snapshot(&src).unwrap(), &fs.path("src"));
}

#[test]
fn parts_and_a_final_attributes_pass_make_the_tree_one_run_makes() {
    let (fs, _local, src, before) = with_tree();
    let one = cp(&[&src, &fs.path("one")]);
    let parts = fs.path("parts");
    std::fs::create_dir(&parts).unwrap();
    let mut bytes = 0;
    for i in [2, 4, 1, 3] {
        let v = cp(&[Path::new("--part"), Path::new(&format!("{i}/4")), &src, &parts]);
        assert_eq!(v["errors"], 0, "{v}");
        assert_eq!(v["part"], format!("{i}/4"));
        bytes += v["bytes"].as_u64().unwrap();
    }
    // Every byte copied once, by one part.
    assert_eq!(bytes, one["bytes"].as_u64().unwrap());
    let last = cp(&[Path::new("--dir-attrs-only"), &src, &parts]);
    assert_eq!(counts(&last, &["files", "bytes", "errors", "dirs"]), [0, 0, 0, 6], "{last}");
    assert_same(&before, &parts.join("src"));
    assert_same(&snapshot(&fs.path("one")).unwrap(), &parts.join("src"));
}

#[test]
fn bad_input_is_refused_and_a_failing_entry_does_not_stop_the_others() {
    let fs = TestFs::up(&[]);
    let local = local_dir();
    let src = local.path().join("src");
    std::fs::create_dir_all(src.join("sub")).unwrap();
    for i in 0..50 {
        std::fs::write(src.join(format!("f{i}")), format!("{i}")).unwrap();
    }
    std::fs::write(fs.path("file"), b"x").unwrap();
    let s = |p: &Path| p.to_str().unwrap().to_string();
    let cases: [(Vec<String>, &str); 8] = [
        (vec![s(&local.path().join("nope")), s(&fs.mnt)], "cannot stat"),
        (vec![s(&src), s(&src.join("sub"))], "into itself"),
        (vec![s(&src), s(&src.join("f1")), s(&fs.path("new"))], "is not a directory"),
        (vec![s(&src), s(&fs.path("file"))], "cannot overwrite non-directory"),
        (vec![s(&src.join("f1")), s(&src.join("f1"))], "same file"),
        (vec!["--part".into(), "0/2".into(), s(&src), s(&fs.mnt)], "--part"),
        (vec!["--range-size".into(), "3000".into(), s(&src), s(&fs.mnt)], "multiple of 1 MiB"),
        (vec!["--part".into(), "1/2".into(), s(&src), s(&fs.path("new"))], "must be an existing directory"),
    ];
    for (args, want) in cases {
        let mut all = vec!["cp"];
        all.extend(args.iter().map(String::as_str));
        let o = hivefs(&all);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(if want == "--part" { 2 } else { 1 }), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
    assert!(!fs.path("new").exists() && !fs.path("src").exists());

    // A directory in the mount where f7 goes: that file fails, named; the rest is copied.
    std::fs::create_dir_all(fs.path("src/f7/in-the-way")).unwrap();
    let o = hivefs(&["cp", "--json", s(&src).as_str(), fs.mnt_s()]);
    assert_eq!(o.status.code(), Some(1));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(counts(&v, &["errors", "files"]), [1, 49], "{v}");
    let path = s(&fs.path("src/f7"));
    assert_eq!(v["failures"][0]["path"], path.as_str());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains(&format!("{path}: cannot overwrite directory")) && err.contains("1 entries failed"), "{err}");
    assert_eq!(std::fs::read(fs.path("src/f49")).unwrap(), b"49");
}

/// Times set on an open file before its close survive the close (the size the close
/// publishes must not stamp its own time over them): what `cp -a` does.
#[test]
fn times_set_before_close_survive_it_as_cp_a_needs() {
    let fs = TestFs::up(&["--storage", "1"]);
    let when = std::time::UNIX_EPOCH + std::time::Duration::new(1_500_000_000, 123_456_789);
    let f = std::fs::File::create(fs.path("f")).unwrap();
    std::io::Write::write_all(&mut &f, b"written before the times are set").unwrap();
    f.set_modified(when).unwrap();
    // Before the close too (the close's release reaches the mount after `close` returns,
    // so a stat right after it may still find the file open there).
    let m = f.metadata().unwrap();
    assert_eq!((m.mtime(), m.mtime_nsec()), (1_500_000_000, 123_456_789));
    drop(f);
    let m = std::fs::metadata(fs.path("f")).unwrap();
    assert_eq!((m.mtime(), m.mtime_nsec()), (1_500_000_000, 123_456_789));
    assert_eq!(m.len(), 32);
    // And the tool itself, from the local disk.
    let src = fs.tmp.path().join("src");
    std::fs::write(&src, vec![5u8; 3 << 20]).unwrap();
    std::fs::File::options().write(true).open(&src).unwrap().set_modified(when).unwrap();
    let o = std::process::Command::new("cp").arg("-a").arg(&src).arg(fs.path("copy")).output().unwrap();
    assert!(o.status.success(), "{}", out(&o));
    let m = std::fs::metadata(fs.path("copy")).unwrap();
    assert_eq!((m.mtime(), m.mtime_nsec(), m.len()), (1_500_000_000, 123_456_789, 3 << 20));
}
