//! File identity through the real mount: inode numbers are a pure function
//! of the entry's id (the same after the kernel forgets an inode, on another
//! mount, after `down`/`up` and a killed mount, after renames across
//! metadata nodes, and for every hard link), tools that find hard links by
//! inode number keep a tree's link structure, and file handles stay valid.

// Raw system calls on the mount, as a program would make them (exact
// arguments, errno): the point of these tests.
#![allow(unsafe_code)]

mod common;

use common::*;
use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

fn ino(p: &Path) -> u64 {
    std::fs::symlink_metadata(p).unwrap_or_else(|e| panic!("stat {}: {e}", p.display())).ino()
}

/// Makes the kernel forget every unused inode and name (as memory pressure does).
fn drop_caches() {
    // SAFETY: sync(2) has no preconditions.
    unsafe { libc::sync() };
    std::fs::write("/proc/sys/vm/drop_caches", "2").expect("drop caches (needs root)");
}

/// Inode numbers of `names` under `root`.
fn inos(root: &Path, names: &[&str]) -> BTreeMap<String, u64> {
    names.iter().map(|n| (n.to_string(), ino(&root.join(n)))).collect()
}

/// d_ino of "." and ".." in a listing of `dir` (read_dir leaves them out).
fn dot_inos(dir: &Path) -> (u64, u64) {
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: opendir/readdir/closedir on a valid path; entries are read before the next call.
    unsafe {
        let d = libc::opendir(c.as_ptr());
        assert!(!d.is_null(), "opendir {}", dir.display());
        let (mut dot, mut dotdot) = (0, 0);
        loop {
            let e = libc::readdir(d);
            if e.is_null() {
                break;
            }
            match std::ffi::CStr::from_ptr((*e).d_name.as_ptr()).to_bytes() {
                b"." => dot = (*e).d_ino,
                b".." => dotdot = (*e).d_ino,
                _ => {}
            }
        }
        libc::closedir(d);
        (dot, dotdot)
    }
}

fn owner(fs: &TestFs, rel: &str) -> u64 {
    fs.entry_info(rel)["owner_meta_node"].as_u64().expect("owner_meta_node")
}

#[test]
fn inode_numbers_survive_eviction_other_mounts_and_restarts() {
    let fs = TestFs::up(&[]);
    std::fs::write(fs.path("a"), b"a").unwrap();
    std::fs::write(fs.path("b"), b"b").unwrap();
    std::fs::create_dir(fs.path("d")).unwrap();
    std::fs::hard_link(fs.path("a"), fs.path("d/hard")).unwrap();
    std::os::unix::fs::symlink("a", fs.path("s")).unwrap();
    let names = ["a", "b", "d", "d/hard", "s"];
    let first = inos(&fs.mnt, &names);
    assert_eq!(first["a"], first["d/hard"], "hard links share the number");
    let mut distinct: Vec<u64> = first.iter().filter(|(n, _)| *n != "d/hard").map(|(_, i)| *i).collect();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), 4, "{first:?}");
    assert!(distinct.iter().all(|&i| i > 1), "never 0, never 1 but the root: {first:?}");
    assert_eq!(ino(&fs.mnt), 1, "the root is 1");
    assert_eq!(fs.entry_info("d/hard")["inode"].as_u64(), Some(first["a"]), "entry info names the number");

    // readdir's d_ino agrees with stat, "." and ".." included.
    assert_eq!(dot_inos(&fs.path("d")), (first["d"], 1));
    assert_eq!(dot_inos(&fs.mnt), (1, 1));
    for e in std::fs::read_dir(&fs.mnt).unwrap() {
        let e = e.unwrap();
        let name = e.file_name().into_string().unwrap();
        assert_eq!(std::os::unix::fs::DirEntryExt::ino(&e), first[&name], "d_ino of {name}");
    }

    drop_caches();
    assert_eq!(inos(&fs.mnt, &names), first, "after the kernel forgot the inodes");

    let m2 = fs.second_mount();
    assert_eq!(inos(&m2.mnt, &names), first, "on a second mount");
    drop(m2);

    fs.down();
    fs.reup();
    assert_eq!(inos(&fs.mnt, &names), first, "after down and up");

    fs.kill9("mount");
    fs.reup();
    assert_eq!(inos(&fs.mnt, &names), first, "after kill -9 of the mount and up");

    // Numbers of new entries are new.
    std::fs::write(fs.path("c"), b"c").unwrap();
    assert!(!first.values().any(|&i| i == ino(&fs.path("c"))));
}

#[test]
fn inode_numbers_survive_renames_across_metadata_nodes() {
    let fs = TestFs::up(&["--meta", "3"]);
    // Directories until two have different owners.
    let mut by_owner: BTreeMap<u64, String> = BTreeMap::new();
    for i in 0..12 {
        let n = format!("d{i}");
        std::fs::create_dir(fs.path(&n)).unwrap();
        by_owner.entry(owner(&fs, &n)).or_insert(n);
        if by_owner.len() >= 2 {
            break;
        }
    }
    assert!(by_owner.len() >= 2, "directories spread over metadata nodes: {by_owner:?}");
    let dirs: Vec<String> = by_owner.values().cloned().collect();
    let (x, y) = (&dirs[0], &dirs[1]);
    let m2 = fs.second_mount();

    std::fs::write(fs.path(&format!("{x}/f")), b"data").unwrap();
    std::fs::create_dir_all(fs.path(&format!("{x}/sub/inner"))).unwrap();
    let f0 = ino(&fs.path(&format!("{x}/f")));
    let s0 = ino(&fs.path(&format!("{x}/sub")));
    let i0 = ino(&fs.path(&format!("{x}/sub/inner")));

    // In quick succession: there and straight back, twice.
    for round in 0..2 {
        for (from, to) in [(x, y), (y, x)] {
            std::fs::rename(fs.path(&format!("{from}/f")), fs.path(&format!("{to}/f"))).unwrap();
            std::fs::rename(fs.path(&format!("{from}/sub")), fs.path(&format!("{to}/sub"))).unwrap();
            assert_eq!(ino(&fs.path(&format!("{to}/f"))), f0, "file in {to}, round {round}");
            assert_eq!(ino(&fs.path(&format!("{to}/sub"))), s0, "directory in {to}, round {round}");
            assert_eq!(ino(&m2.mnt.join(format!("{to}/f"))), f0, "file in {to} on the second mount");
        }
    }
    assert_eq!(owner(&fs, &format!("{x}/f")), owner(&fs, x), "the inode moved back with the file");

    // With pauses (leases and kernel caches run out), and after eviction.
    std::fs::rename(fs.path(&format!("{x}/f")), fs.path(&format!("{y}/g"))).unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    drop_caches();
    assert_eq!(ino(&fs.path(&format!("{y}/g"))), f0);
    assert_eq!(owner(&fs, &format!("{y}/g")), owner(&fs, y), "the file's inode moved to the other node");
    std::fs::rename(fs.path(&format!("{x}/sub")), fs.path(&format!("{y}/sub2"))).unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(ino(&fs.path(&format!("{y}/sub2"))), s0);
    assert_eq!(ino(&fs.path(&format!("{y}/sub2/inner"))), i0);
    assert_eq!(ino(&m2.mnt.join(format!("{y}/sub2/inner"))), i0);
    // ".." of a moved directory names its new parent, on both mounts.
    assert_eq!(dot_inos(&fs.path(&format!("{y}/sub2/inner"))), (i0, s0));
    assert_eq!(dot_inos(&m2.mnt.join(format!("{y}/sub2"))), (s0, ino(&fs.path(y))));

    // Hard links in directories of different owners share the number.
    std::fs::hard_link(fs.path(&format!("{y}/g")), fs.path(&format!("{x}/link"))).unwrap();
    assert_eq!(ino(&fs.path(&format!("{x}/link"))), f0);
    drop_caches();
    assert_eq!(ino(&m2.mnt.join(format!("{x}/link"))), f0);
    assert_eq!(ino(&fs.path(&format!("{x}/link"))), f0);
    assert_eq!(std::fs::read(fs.path(&format!("{x}/link"))).unwrap(), b"data");

    drop(m2);
    fs.down();
    fs.reup();
    assert_eq!(ino(&fs.path(&format!("{y}/g"))), f0, "after down and up");
    assert_eq!(ino(&fs.path(&format!("{y}/sub2/inner"))), i0, "after down and up");
}

/// Groups of paths (relative to `root`) that are one file, found by inode number.
fn link_groups(root: &Path) -> Vec<Vec<String>> {
    let mut by_ino: HashMap<u64, Vec<String>> = HashMap::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        for e in std::fs::read_dir(root.join(&rel)).unwrap() {
            let e = e.unwrap();
            let r = rel.join(e.file_name());
            let md = e.metadata().unwrap();
            if md.is_dir() {
                stack.push(r);
            } else {
                by_ino.entry(md.ino()).or_default().push(r.to_string_lossy().into_owned());
            }
        }
    }
    let mut groups: Vec<Vec<String>> = by_ino
        .into_values()
        .map(|mut g| {
            g.sort();
            g
        })
        .collect();
    groups.sort();
    groups
}

fn run(cmd: &mut Command) {
    let o = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(o.status.success(), "{cmd:?}: {}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn tar_and_rsync_keep_the_link_structure() {
    let fs = TestFs::up(&["--meta", "2"]);
    let src = fs.path("tree");
    for d in ["tree/a", "tree/b/c", "tree/e"] {
        std::fs::create_dir_all(fs.path(d)).unwrap();
    }
    for (i, f) in ["tree/a/one", "tree/b/two", "tree/b/c/three", "tree/e/four"].iter().enumerate() {
        std::fs::write(fs.path(f), random_bytes(i as u64, 1000 + i * 4096)).unwrap();
    }
    std::fs::hard_link(fs.path("tree/a/one"), fs.path("tree/b/one-again")).unwrap();
    std::fs::hard_link(fs.path("tree/a/one"), fs.path("tree/e/one-thrice")).unwrap();
    std::fs::hard_link(fs.path("tree/b/c/three"), fs.path("tree/three-up")).unwrap();
    let want = link_groups(&src);
    assert_eq!(want.iter().filter(|g| g.len() > 1).count(), 2, "{want:?}");
    drop_caches();

    let local = fs.tmp.path().join("local");
    std::fs::create_dir(&local).unwrap();
    // tar: off the mount and back onto it.
    let tarball = fs.tmp.path().join("tree.tar");
    run(Command::new("tar").arg("-C").arg(&fs.mnt).arg("-cf").arg(&tarball).arg("tree"));
    run(Command::new("tar").arg("-C").arg(&local).arg("-xf").arg(&tarball));
    assert_eq!(link_groups(&local.join("tree")), want, "tar off the mount");
    std::fs::create_dir(fs.path("back")).unwrap();
    run(Command::new("tar").arg("-C").arg(fs.path("back")).arg("-xf").arg(&tarball));
    assert_eq!(link_groups(&fs.path("back/tree")), want, "tar onto the mount");

    // rsync -aH: off the mount and back.
    let synced = fs.tmp.path().join("synced");
    run(Command::new("rsync").arg("-aH").arg(format!("{}/", src.display())).arg(&synced));
    assert_eq!(link_groups(&synced), want, "rsync -aH off the mount");
    drop_caches();
    run(Command::new("rsync").arg("-aH").arg(format!("{}/", synced.display())).arg(fs.path("synced")));
    assert_eq!(link_groups(&fs.path("synced")), want, "rsync -aH onto the mount");
    let o = Command::new("diff").arg("-r").arg(&src).arg(fs.path("synced")).output().unwrap();
    assert!(o.status.success(), "contents differ: {}", String::from_utf8_lossy(&o.stdout));
}

/// `struct file_handle` with room for any handle of this kernel.
#[repr(C)]
struct Handle {
    bytes: u32,
    kind: i32,
    data: [u8; 128],
}

fn cpath(p: &Path) -> std::ffi::CString {
    std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap()
}

fn name_to_handle(p: &Path) -> Handle {
    let mut h = Handle { bytes: 128, kind: 0, data: [0; 128] };
    let mut mount_id = 0;
    // SAFETY: `h` is a file_handle with `bytes` of room after its header.
    let r = unsafe {
        libc::name_to_handle_at(libc::AT_FDCWD, cpath(p).as_ptr(), (&mut h as *mut Handle).cast(), &mut mount_id, 0)
    };
    assert_eq!(r, 0, "name_to_handle_at {}: {}", p.display(), std::io::Error::last_os_error());
    h
}

/// Opens `h` (read-only) through the mount on `mnt`.
fn open_handle(mnt: &Path, h: &mut Handle) -> std::io::Result<std::fs::File> {
    use std::os::fd::FromRawFd;
    let m = std::fs::File::open(mnt)?;
    // SAFETY: `h` came from name_to_handle_at; the mount's descriptor is open.
    let fd = unsafe {
        libc::open_by_handle_at(std::os::fd::AsRawFd::as_raw_fd(&m), (h as *mut Handle).cast(), libc::O_RDONLY)
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a new descriptor the caller owns.
    Ok(unsafe { std::fs::File::from_raw_fd(fd) })
}

/// Opens `h` through the mount on `mnt` and reads the file.
fn read_by_handle(mnt: &Path, h: &mut Handle) -> std::io::Result<(Vec<u8>, u64)> {
    use std::io::Read;
    let mut f = open_handle(mnt, h)?;
    let mut v = Vec::new();
    f.read_to_end(&mut v)?;
    Ok((v, f.metadata()?.ino()))
}

#[test]
fn file_handles_stay_valid_after_eviction_renames_and_on_other_mounts() {
    let fs = TestFs::up(&["--meta", "2"]);
    std::fs::create_dir(fs.path("d")).unwrap();
    std::fs::write(fs.path("d/f"), b"by handle").unwrap();
    let f0 = ino(&fs.path("d/f"));
    let mut h = name_to_handle(&fs.path("d/f"));
    let mut hd = name_to_handle(&fs.path("d"));
    assert_eq!(read_by_handle(&fs.mnt, &mut h).unwrap(), (b"by handle".to_vec(), f0));

    drop_caches();
    assert_eq!(read_by_handle(&fs.mnt, &mut h).unwrap(), (b"by handle".to_vec(), f0), "after eviction");
    // A directory's handle opens the directory.
    let d = open_handle(&fs.mnt, &mut hd).expect("directory handle");
    assert_eq!(d.metadata().unwrap().ino(), ino(&fs.path("d")));
    drop(d);

    // Another mount of the same file system takes the handle.
    let m2 = fs.second_mount();
    assert_eq!(read_by_handle(&m2.mnt, &mut h).unwrap(), (b"by handle".to_vec(), f0), "on another mount");

    // Renamed into directories of every metadata node, then evicted.
    for i in 0..4 {
        let n = format!("e{i}");
        std::fs::create_dir(fs.path(&n)).unwrap();
        let from = if i == 0 { fs.path("d/f") } else { fs.path(&format!("e{}/f", i - 1)) };
        std::fs::rename(from, fs.path(&format!("{n}/f"))).unwrap();
        drop_caches();
        assert_eq!(read_by_handle(&fs.mnt, &mut h).unwrap(), (b"by handle".to_vec(), f0), "moved to {n}");
    }
    drop(m2);

    // A removed entry's handle is stale (a directory: a file that any
    // client still holds open may be opened by its handle, as on local file
    // systems, and releases travel after close returns).
    std::fs::create_dir(fs.path("gone")).unwrap();
    let mut hg = name_to_handle(&fs.path("gone"));
    std::fs::remove_dir(fs.path("gone")).unwrap();
    drop_caches();
    assert_eq!(errno_of(open_handle(&fs.mnt, &mut hg)), libc::ESTALE);
}
