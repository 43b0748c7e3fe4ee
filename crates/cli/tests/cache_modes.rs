//! Cache mode `paged` through real mounts: reads go through the kernel's
//! page cache (and `native` reads do not), writes go through to the targets,
//! an open sees what another client left on close, and O_APPEND writes
//! from two mounts never overwrite each other.

// Raw system calls on the mount, as a program would make them (exact
// arguments, errno): the point of these tests.
#![allow(unsafe_code)]

mod common;

use common::TestFs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::Path;

/// Share of the file's pages that are in the page cache (mmap + mincore,
/// as util-linux's `fincore`).
fn resident_share(p: &Path) -> f64 {
    let f = std::fs::File::open(p).unwrap();
    let len = f.metadata().unwrap().len() as usize;
    let page = 4096usize;
    let pages = len.div_ceil(page);
    // SAFETY: a read-only shared mapping of an open file, unmapped below;
    // mincore fills one byte per page of it.
    unsafe {
        let m = libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED, f.as_raw_fd(), 0);
        assert_ne!(m, libc::MAP_FAILED, "mmap of {}", p.display());
        let mut v = vec![0u8; pages];
        assert_eq!(libc::mincore(m, len, v.as_mut_ptr()), 0, "mincore");
        libc::munmap(m, len);
        v.iter().filter(|b| **b & 1 != 0).count() as f64 / pages as f64
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u32).wrapping_mul(2654435761).to_le_bytes()[1] ^ seed).collect()
}

/// The kernel's read-ahead of the mount on `mnt`, in KiB.
fn read_ahead_kib(mnt: &Path) -> u32 {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(mnt).unwrap().dev();
    let knob = format!("/sys/class/bdi/{}:{}/read_ahead_kb", libc::major(dev), libc::minor(dev));
    std::fs::read_to_string(&knob).unwrap_or_else(|e| panic!("{knob}: {e}")).trim().parse().unwrap()
}

#[test]
fn paged_mount_caches_reads_writes_through_and_is_close_to_open() {
    let fs = TestFs::up(&["--storage", "1"]);
    let paged = fs.extra_mount("paged", &["--cache-mode", "paged"]);
    let (p, n) = (paged.mnt.join("f"), fs.path("f"));
    let mut want = pattern(4 << 20, 7);
    std::fs::write(&p, &want).unwrap();
    assert_eq!(std::fs::read(&n).unwrap(), want, "written through the paged mount, read through the native one");

    // The paged mount reads ahead 1 MiB (the kernel's default for FUSE is 128 KiB).
    assert_eq!(read_ahead_kib(&paged.mnt), 1024);

    // Reads through the paged mount fill the page cache; the native mount's do not.
    assert_eq!(std::fs::read(&p).unwrap(), want);
    let share = resident_share(&p);
    assert!(share > 0.9, "{:.0}% of the file cached after a read through the paged mount", share * 100.0);
    let g = fs.path("g");
    std::fs::write(&g, &want).unwrap();
    assert_eq!(std::fs::read(&g).unwrap(), want);
    assert!(resident_share(&g) < 0.1, "a native mount's reads must not fill the page cache");

    // Another client overwrites part of the file (same size) and closes: the
    // next open through the paged mount sees it, although the old pages were cached.
    let new = pattern(10_000, 99);
    let f = std::fs::OpenOptions::new().write(true).open(&n).unwrap();
    f.write_all_at(&new, 5000).unwrap();
    drop(f);
    want[5000..15_000].copy_from_slice(&new);
    assert_eq!(std::fs::read(&p).unwrap(), want, "close-to-open: an open sees another client's closed writes");

    // Unaligned writes through the paged mount reach the targets before they return.
    let mut f = std::fs::OpenOptions::new().read(true).write(true).open(&p).unwrap();
    for (i, off) in [0usize, 4095, 70_001, (4 << 20) - 3, 1 << 20].into_iter().enumerate() {
        let data = pattern(4099, i as u8);
        f.write_all_at(&data, off as u64).unwrap();
        let end = off + data.len();
        if end > want.len() {
            want.resize(end, 0);
        }
        want[off..end].copy_from_slice(&data);
        let mut back = vec![0u8; data.len()];
        std::fs::File::open(&n).unwrap().read_exact_at(&mut back, off as u64).unwrap();
        assert_eq!(back, data, "write at {off} seen by the native mount before close");
    }
    let mut all = Vec::new();
    f.seek(SeekFrom::Start(0)).unwrap();
    f.read_to_end(&mut all).unwrap();
    assert_eq!(all, want, "the paged mount's own reads after its writes");
    drop(f);
    assert_eq!(std::fs::read(&n).unwrap(), want, "the native mount after close");
}

#[test]
fn appends_from_a_paged_and_a_native_mount_never_overwrite() {
    let fs = TestFs::up(&["--storage", "1"]);
    let paged = fs.extra_mount("paged", &["--cache-mode", "paged"]);
    std::fs::write(fs.path("log"), b"").unwrap();
    let writers: Vec<_> = [(paged.mnt.join("log"), b'p'), (fs.path("log"), b'n')]
        .into_iter()
        .map(|(path, tag)| {
            std::thread::spawn(move || {
                let mut f = std::fs::OpenOptions::new().append(true).open(&path).unwrap();
                for i in 0..200u32 {
                    f.write_all(format!("{}{i:05}\n", tag as char).as_bytes()).unwrap();
                }
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    for path in [fs.path("log"), paged.mnt.join("log")] {
        let s = std::fs::read_to_string(&path).unwrap();
        let mut lines: Vec<&str> = s.lines().collect();
        assert_eq!(lines.len(), 400, "{}: every append kept", path.display());
        lines.sort_unstable();
        lines.dedup();
        assert_eq!(lines.len(), 400, "{}: no record twice", path.display());
    }
}

/// `hivefs up --cache-mode paged` mounts with it, and a later `up` keeps it.
#[test]
fn up_mounts_with_the_cache_mode_it_was_given_and_keeps_it() {
    let fs = TestFs::up(&["--storage", "1", "--cache-mode", "paged"]);
    let f = fs.path("f");
    let data = pattern(1 << 20, 3);
    for round in ["first up", "after down and up"] {
        if round != "first up" {
            fs.down();
            fs.reup();
        }
        std::fs::write(&f, &data).unwrap();
        assert_eq!(std::fs::read(&f).unwrap(), data);
        let share = resident_share(&f);
        assert!(share > 0.9, "{round}: {:.0}% cached after a read", share * 100.0);
    }
}

/// Requests answered by all metadata nodes so far.
fn meta_requests(m: &hivefs_bench::md::MetaCounts) -> u64 {
    m.snapshot().expect("request counts of the metadata nodes").values().sum()
}

/// The request count once no request arrived for 100 ms: the kernel sends a
/// closed file's `release` in the background, so a close just before a
/// measurement may otherwise land inside it.
fn meta_requests_settled(m: &hivefs_bench::md::MetaCounts) -> u64 {
    let mut last = meta_requests(m);
    for _ in 0..50 {
        std::thread::sleep(std::time::Duration::from_millis(100));
        let now = meta_requests(m);
        if now == last {
            break;
        }
        last = now;
    }
    last
}

/// A `security.capability` value (revision 2, effective, CAP_NET_RAW permitted).
const CAPS: [u8; 20] = [1, 0, 0, 2, 0, 0x20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];

fn get_caps(p: &Path) -> Option<Vec<u8>> {
    let path = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    let mut buf = [0u8; 64];
    // SAFETY: valid C strings and a buffer of the given length.
    let n =
        unsafe { libc::getxattr(path.as_ptr(), c"security.capability".as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    (n >= 0).then(|| buf[..n as usize].to_vec())
}

fn set_caps(p: &Path) {
    let path = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: valid C strings and a value of the given length.
    let r =
        unsafe { libc::setxattr(path.as_ptr(), c"security.capability".as_ptr(), CAPS.as_ptr().cast(), CAPS.len(), 0) };
    assert_eq!(r, 0, "setxattr security.capability on {}: {}", p.display(), std::io::Error::last_os_error());
}

/// Writes through a paged mount: the kernel's capability check before each write
/// is answered by the mount (one metadata request per open, not one per write), and a
/// file's capabilities are still dropped by a write, also when another client set them.
#[test]
fn paged_writes_ask_for_capabilities_once_per_open_and_still_drop_them() {
    let fs = TestFs::up(&["--storage", "1"]);
    let paged = fs.extra_mount("paged", &["--cache-mode", "paged"]);
    let secret = hivefs_net::load_secret(&fs.secret()).expect("secret");
    let conn = hivefs_bench::FsConn { mgmtd: fs.mgmtd_addr(), secret: Some(secret) };
    let m = hivefs_bench::md::MetaCounts::connect(&conn).expect("connect");
    let (p, n) = (paged.mnt.join("f"), fs.path("f"));
    std::fs::write(&n, pattern(1 << 20, 1)).unwrap();

    // The writes come from a process of their own: a file this (multi-threaded)
    // test process holds open is inherited by every child another test spawns
    // meanwhile, and each such exec closes it (FLUSH: the size is published).
    let before = meta_requests_settled(&m);
    let dd = std::process::Command::new("dd")
        .args(["if=/dev/zero", &format!("of={}", p.display()), "bs=4096", "count=200", "conv=notrunc", "status=none"])
        .status()
        .expect("run dd");
    assert!(dd.success(), "dd into {}: {dd}", p.display());
    let used = meta_requests_settled(&m) - before;
    // The path walk (root's attributes, the name: 2), the open, one capability
    // query, the size published at close and the release: 6, some spare, and
    // far from one capability query per write (200).
    assert!(used <= 8, "an open, 200 writes and a close through a paged mount sent {used} metadata requests");

    // Capabilities set by another client are seen at the next open and dropped by a write.
    set_caps(&n);
    assert_eq!(get_caps(&p).as_deref(), Some(&CAPS[..]));
    let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
    f.write_all_at(b"x", 10).unwrap();
    drop(f);
    assert_eq!(get_caps(&n), None, "a write through the paged mount must drop the file's capabilities");
    // ... and set through the paged mount itself, while the file is open there.
    let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
    f.write_all_at(b"y", 11).unwrap();
    set_caps(&p);
    f.write_all_at(b"z", 12).unwrap();
    drop(f);
    assert_eq!(get_caps(&n), None, "capabilities set through the mount are dropped by its next write");
}
