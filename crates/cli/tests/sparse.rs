//! fallocate(2) and lseek's SEEK_DATA / SEEK_HOLE through the real mount,
//! over files striped across several targets, each checked against the same
//! sequence on a file of the local disk.

// Raw system calls on the mount, as a program would make them (exact
// arguments, errno): the point of these tests.
#![allow(unsafe_code)]

mod common;

use common::*;
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

const KEEP_SIZE: i32 = libc::FALLOC_FL_KEEP_SIZE;
const PUNCH_HOLE: i32 = libc::FALLOC_FL_PUNCH_HOLE;
const ZERO_RANGE: i32 = libc::FALLOC_FL_ZERO_RANGE;

fn fallocate(f: &File, mode: i32, offset: i64, len: i64) -> std::io::Result<()> {
    // SAFETY: fallocate(2) on an open descriptor.
    if unsafe { libc::fallocate(f.as_raw_fd(), mode, offset, len) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// lseek(2) with SEEK_DATA / SEEK_HOLE: the offset, or the errno.
fn seek(f: &File, offset: i64, whence: i32) -> Result<i64, i32> {
    // SAFETY: lseek(2) on an open descriptor.
    let r = unsafe { libc::lseek(f.as_raw_fd(), offset, whence) };
    if r >= 0 {
        Ok(r)
    } else {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(-1))
    }
}

fn rw(p: &Path) -> File {
    OpenOptions::new().read(true).write(true).create(true).truncate(false).open(p).unwrap()
}

/// A directory of the mount whose new files stripe over 4 targets in 64 KiB chunks.
fn striped_dir(fs: &TestFs, rel: &str) -> PathBuf {
    let d = fs.path(rel);
    std::fs::create_dir(&d).unwrap();
    hivefs_ok(&["pattern", "set", d.to_str().unwrap(), "--chunk-size", "64k", "--stripe", "4"]);
    d
}

fn read_all(f: &File) -> Vec<u8> {
    let len = f.metadata().unwrap().len() as usize;
    let mut v = vec![0u8; len];
    f.read_exact_at(&mut v, 0).unwrap();
    v
}

#[test]
fn fallocate_modes_match_the_local_disk_and_reach_every_chunk() {
    let fs = TestFs::up(&[]);
    striped_dir(&fs, "d");
    let local_dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let (m, l) = (rw(&fs.path("d/f")), rw(&local_dir.path().join("f")));
    let data = random_bytes(15, 1 << 20);
    for f in [&m, &l] {
        f.write_all_at(&data, 0).unwrap();
    }
    let mut blocks = fs.chunk_blocks("d/f");
    assert!(blocks >= 1 << 20, "{blocks}");
    // (mode, offset, len, what the chunk files' allocation must do)
    let steps: [(i32, i64, i64, &str); 7] = [
        (0, 0, 3 << 20, "grow"),                                  // allocate, extends the size
        (KEEP_SIZE, 3 << 20, 2 << 20, "grow"),                    // allocate beyond the end, size kept
        (PUNCH_HOLE | KEEP_SIZE, 100 << 10, 300 << 10, "shrink"), // over 5 chunks on 4 targets
        (ZERO_RANGE, 700 << 10, (20 << 10) + 5, "any"),
        (ZERO_RANGE | KEEP_SIZE, (3 << 20) - 10, 100, "any"),
        (ZERO_RANGE, (3 << 20) + 7, 1000, "any"), // grows the file
        (PUNCH_HOLE | KEEP_SIZE, 0, (3 << 20) + 1007, "shrink"), // all of the file
    ];
    for (i, (mode, off, len, alloc)) in steps.into_iter().enumerate() {
        for f in [&m, &l] {
            fallocate(f, mode, off, len).unwrap_or_else(|e| panic!("step {i}: fallocate mode {mode:#x}: {e}"));
        }
        let (ms, ls) = (m.metadata().unwrap().len(), l.metadata().unwrap().len());
        assert_eq!(ms, ls, "step {i}: size");
        assert!(read_all(&m) == read_all(&l), "step {i}: contents differ from the local disk's");
        let now = fs.chunk_blocks("d/f");
        match alloc {
            "grow" => assert!(now >= blocks + len as u64 / 2, "step {i}: {blocks} -> {now} bytes allocated"),
            "shrink" => assert!(now + (len as u64).min(blocks) / 2 <= blocks, "step {i}: {blocks} -> {now}"),
            _ => {}
        }
        blocks = now;
    }
    // Another mount sees the size and the zeroes.
    let m2 = fs.second_mount();
    let other = File::open(m2.mnt.join("d/f")).unwrap();
    assert!(read_all(&other) == read_all(&l));

    // Bad input: the errors of the local disk.
    let dir = File::open(fs.path("d")).unwrap();
    let ldir = File::open(local_dir.path()).unwrap();
    let ro = File::open(fs.path("d/f")).unwrap();
    let lro = File::open(local_dir.path().join("f")).unwrap();
    let cases: [(&File, &File, i32, i64, i64); 6] = [
        (&m, &l, 0, i64::MAX - 10, 100), // beyond the largest size: EFBIG
        (&m, &l, 0, -1, 10),             // negative offset: EINVAL
        (&m, &l, 0, 0, 0),               // empty: EINVAL
        (&m, &l, PUNCH_HOLE, 0, 10),     // punching needs KEEP_SIZE: EOPNOTSUPP
        (&dir, &ldir, 0, 0, 10),         // a directory
        (&ro, &lro, 0, 0, 10),           // not open for writing: EBADF
    ];
    for (i, (mf, lf, mode, off, len)) in cases.into_iter().enumerate() {
        let (me, le) = (errno_of(fallocate(mf, mode, off, len)), errno_of(fallocate(lf, mode, off, len)));
        assert_ne!(le, 0, "case {i} succeeds on the local disk");
        assert_eq!(me, le, "bad input {i}: errno");
    }
}

#[test]
fn fallocate_on_a_full_target_fails_whole() {
    const NO_CAPACITY_LIMITS: &str =
        "space_low_limit_bytes = 0\nspace_emergency_limit_bytes = 0\ninodes_low_limit = 0\ninodes_emergency_limit = 0\n";
    let fs = TestFs::up_with(&["--storage", "2", "--targets-per-storage", "1"], |fs| {
        fs.mount_tmpfs("storage1/target1", "16m");
        std::fs::create_dir_all(fs.dir.join("mgmtd")).unwrap();
        std::fs::write(fs.dir.join("mgmtd/mgmtd.toml"), NO_CAPACITY_LIMITS).unwrap();
    });
    let d = fs.path("d");
    std::fs::create_dir(&d).unwrap();
    hivefs_ok(&["pattern", "set", d.to_str().unwrap(), "--chunk-size", "64k", "--stripe", "2"]);
    let f = rw(&fs.path("d/f"));
    let data = random_bytes(3, 200 << 10);
    f.write_all_at(&data, 0).unwrap();
    // 64 MiB over two targets: the tmpfs one (16 MiB) runs out.
    let e = fallocate(&f, 0, 0, 64 << 20).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
    assert_eq!(f.metadata().unwrap().len(), 200 << 10, "no size change is visible");
    assert!(read_all(&f) == data);
    assert_eq!(File::open(fs.path("d/f")).unwrap().metadata().unwrap().len(), 200 << 10);
    // The tmpfs target cannot zero a range in place: punched and allocated again.
    fallocate(&f, ZERO_RANGE, 10, 100 << 10).unwrap();
    let mut want = data.clone();
    want[10..10 + (100 << 10)].fill(0);
    assert!(read_all(&f) == want);
    // A range that fits works.
    fallocate(&f, 0, 0, 4 << 20).unwrap();
    assert_eq!(f.metadata().unwrap().len(), 4 << 20);
}

#[test]
fn seek_data_and_hole_match_the_local_disk_over_striped_holes() {
    let fs = TestFs::up(&[]);
    striped_dir(&fs, "d");
    let local_dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let (m, l) = (rw(&fs.path("d/f")), rw(&local_dir.path().join("f")));
    // Data in places (4 KiB aligned, as holes are block-sized): inside one
    // chunk, across a chunk boundary, a whole stripe, then a long hole over
    // every target, data far out, and a hole at the end.
    let pieces: [(u64, usize); 5] =
        [(0, 8 << 10), (60 << 10, 8 << 10), (512 << 10, 256 << 10), (5 << 20, 4 << 10), (9 << 20, 64 << 10)];
    for (i, (off, len)) in pieces.into_iter().enumerate() {
        let d = random_bytes(i as u64 + 1, len);
        m.write_all_at(&d, off).unwrap();
        l.write_all_at(&d, off).unwrap();
    }
    for f in [&m, &l] {
        f.set_len(12 << 20).unwrap();
    }
    let size = 12i64 << 20;
    let mut offsets: Vec<i64> = (0..size + (64 << 10)).step_by(16 << 10).collect();
    offsets.extend([1, 4095, 4097, (60 << 10) - 1, (5 << 20) + 1, (7 << 20) + 12345, size - 1, size, size + 1]);
    for o in offsets {
        for (whence, name) in [(libc::SEEK_DATA, "SEEK_DATA"), (libc::SEEK_HOLE, "SEEK_HOLE")] {
            assert_eq!(seek(&m, o, whence), seek(&l, o, whence), "{name} from {o}");
        }
    }
    // A punched hole in the middle of the stripe is found too.
    for f in [&m, &l] {
        fallocate(f, PUNCH_HOLE | KEEP_SIZE, 576 << 10, 64 << 10).unwrap();
    }
    for o in [512 << 10, 570 << 10, 600 << 10, 700 << 10] {
        for whence in [libc::SEEK_DATA, libc::SEEK_HOLE] {
            assert_eq!(seek(&m, o, whence), seek(&l, o, whence), "after punching: whence {whence} from {o}");
        }
    }
}
