//! Cache mode `buffered` through real mounts that write over TCP
//! (`--no-short-circuit`, as a client on another host): small writes are
//! kept in the mount and sent merged, the writing mount reads its own
//! writes at once, other clients see them after fsync and close, a lock
//! operation flushes them, and a failed flush reaches the writer at the
//! latest at fsync or close.

// Raw fcntl locks and close(2), whose results are the point here.
#![allow(unsafe_code)]

mod common;

use common::*;
use std::io::Write;
use std::os::unix::fs::FileExt;

/// IOR-hard's layout: rank `r`'s `i`-th block of `block` bytes sits at
/// `(i * ranks + r) * block`; each block is filled with a byte of its own.
fn interleaved(ranks: usize, blocks: usize, block: usize) -> Vec<u8> {
    let mut want = vec![0u8; ranks * blocks * block];
    for (n, b) in want.chunks_mut(block).enumerate() {
        b.fill((n % 251) as u8 + 1);
    }
    want
}

#[test]
fn interleaved_small_writes_are_merged_read_back_at_once_and_seen_by_others_after_close() {
    let fs = TestFs::up(&["--storage", "1", "--chunk-size", "512k"]);
    let port = free_port();
    let buffered = fs.extra_mount(
        "buffered",
        &["--cache-mode", "buffered", "--no-short-circuit", "--metrics-listen", &format!("127.0.0.1:{port}")],
    );
    let (p, other) = (buffered.mnt.join("shared"), fs.path("shared"));
    let (ranks, blocks, block) = (4, 64, 47_008);
    let want = interleaved(ranks, blocks, block);
    let f = std::fs::File::create(&p).unwrap();
    // Each rank writes its blocks through its own descriptor, as IOR does.
    std::thread::scope(|s| {
        for r in 0..ranks {
            let (f, want) = (f.try_clone().unwrap(), &want);
            s.spawn(move || {
                for i in 0..blocks {
                    let at = (i * ranks + r) * block;
                    f.write_all_at(&want[at..at + block], at as u64).unwrap();
                }
            });
        }
    });
    // The writing mount reads its own writes before anything was flushed by
    // fsync or close.
    let mut got = vec![0u8; want.len()];
    std::fs::File::open(&p).unwrap().read_exact_at(&mut got, 0).unwrap();
    assert!(got == want, "the writing mount reads back something else");
    f.sync_all().unwrap();
    assert!(std::fs::read(&other).unwrap() == want, "another mount after fsync");
    // An overwrite of part of a block and of a whole block, then close.
    let mut want = want;
    want[100..160].fill(0xee);
    want[block * 7..block * 8].fill(0xdd);
    f.write_all_at(&want[100..160], 100).unwrap();
    f.write_all_at(&want[block * 7..block * 8], (block * 7) as u64).unwrap();
    drop(f);
    assert!(std::fs::read(&other).unwrap() == want, "another mount after close");
    assert_eq!(std::fs::metadata(&other).unwrap().len(), want.len() as u64);

    // Adjacent writes are merged: one writer (as one rank's contiguous
    // block, or ranks taking turns) makes 256 writes of 47,008 bytes, each
    // one or two chunk writes without buffering; buffered they go out as
    // far fewer.
    let before = calls_sent(port, "WriteChunk");
    let f = std::fs::File::create(buffered.mnt.join("one")).unwrap();
    for (n, b) in want.chunks(block).enumerate() {
        f.write_all_at(b, (n * block) as u64).unwrap();
    }
    drop(f);
    assert!(std::fs::read(fs.path("one")).unwrap() == want, "another mount after close");
    let calls = calls_sent(port, "WriteChunk") - before;
    let writes = want.len().div_ceil(block) as u64;
    assert!(calls * 4 < writes, "{calls} chunk writes for {writes} writes: not merged");
}

#[test]
fn a_lock_operation_flushes_buffered_writes_for_the_next_lock_holder() {
    let fs = TestFs::up(&["--storage", "1"]);
    let buffered = fs.extra_mount("buffered", &["--cache-mode", "buffered", "--no-short-circuit"]);
    let (p, other) = (buffered.mnt.join("counter"), fs.path("counter"));
    std::fs::write(&p, [0u8; 8]).unwrap();
    let writer = std::fs::OpenOptions::new().read(true).write(true).open(&p).unwrap();
    let reader = std::fs::OpenOptions::new().read(true).write(true).open(&other).unwrap();
    let lock = |f: &std::fs::File, kind: libc::c_short| {
        let fl = libc::flock { l_type: kind, l_whence: libc::SEEK_SET as i16, l_start: 0, l_len: 0, l_pid: 0 };
        // SAFETY: F_SETLKW with a valid flock struct on an open descriptor.
        let r = unsafe { libc::fcntl(std::os::fd::AsRawFd::as_raw_fd(f), libc::F_SETLKW, &fl) };
        assert_eq!(r, 0, "fcntl: {}", std::io::Error::last_os_error());
    };
    for n in 1..=20u64 {
        // Write under the lock on the buffered mount, unlock, and read under
        // the lock on the other: the value written must be there.
        lock(&writer, libc::F_WRLCK as i16);
        writer.write_all_at(&n.to_le_bytes(), 0).unwrap();
        lock(&writer, libc::F_UNLCK as i16);
        lock(&reader, libc::F_RDLCK as i16);
        let mut b = [0u8; 8];
        reader.read_exact_at(&mut b, 0).unwrap();
        lock(&reader, libc::F_UNLCK as i16);
        assert_eq!(u64::from_le_bytes(b), n, "round {n}: the lock's next holder missed the write");
    }
}

#[test]
fn a_failed_flush_reaches_the_writer_at_fsync_and_close() {
    let fs = TestFs::up_with(&["--storage", "1", "--targets-per-storage", "1"], |fs| {
        fs.mount_tmpfs("storage1/target1", "8m");
        std::fs::create_dir_all(fs.dir.join("mgmtd")).unwrap();
        std::fs::write(
            fs.dir.join("mgmtd/mgmtd.toml"),
            "space_low_limit_bytes = 0\nspace_emergency_limit_bytes = 0\ninodes_low_limit = 0\ninodes_emergency_limit = 0\n",
        )
        .unwrap();
    });
    let buffered = fs.extra_mount("buffered", &["--cache-mode", "buffered", "--no-short-circuit"]);
    let p = buffered.mnt.join("big");
    let mut f = std::fs::File::create(&p).unwrap();
    // 16 MiB into an 8 MiB target, in small writes: some are acknowledged
    // before their flush finds the disk full; the error must come back by
    // the end (a later write, fsync or close), never be lost.
    let piece = random_bytes(3, 64 << 10);
    let mut failed = None;
    for _ in 0..256 {
        if let Err(e) = f.write_all(&piece) {
            failed = Some(e);
            break;
        }
    }
    let failed = failed.or_else(|| f.sync_all().err());
    let e = failed.expect("neither a write nor fsync reported the full disk");
    assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
    drop(f);
    // A write the mount acknowledged and whose flush then failed: close says so.
    let g = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
    g.write_all_at(&piece, 32 << 20).expect("a buffered write returns once copied");
    let fd = std::os::fd::IntoRawFd::into_raw_fd(g);
    // SAFETY: closing the descriptor this test owns (taken out of `g`).
    let r = unsafe { libc::close(fd) };
    let e = std::io::Error::last_os_error();
    assert_eq!((r, e.raw_os_error()), (-1, Some(libc::ENOSPC)), "close after a failed flush: {e}");
}

/// A small xorshift generator: the operations of a seed are the same on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[test]
fn random_writes_truncates_and_reads_match_a_model_of_the_file() {
    // fsx-like: random writes (small, crossing chunks, overlapping), truncations,
    // reads and fsyncs through a buffered mount, each read compared with an
    // in-memory model; at the end another mount reads the same bytes.
    let fs = TestFs::up(&["--storage", "1", "--chunk-size", "64k"]);
    let buffered = fs.extra_mount("buffered", &["--cache-mode", "buffered", "--no-short-circuit"]);
    let (p, other) = (buffered.mnt.join("fsx"), fs.path("fsx"));
    let f = std::fs::OpenOptions::new().create(true).read(true).write(true).truncate(true).open(&p).unwrap();
    let mut model: Vec<u8> = Vec::new();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    const MAX: u64 = 1 << 20;
    for step in 0..600 {
        match rng.below(20) {
            0..=11 => {
                let largest = if rng.below(4) == 0 { 200_000 } else { 9_000 };
                let len = 1 + rng.below(largest);
                let at = rng.below(MAX - len);
                let byte = (step % 251) as u8 + 1;
                let data = vec![byte; len as usize];
                f.write_all_at(&data, at).unwrap();
                let end = (at + len) as usize;
                if model.len() < end {
                    model.resize(end, 0);
                }
                model[at as usize..end].copy_from_slice(&data);
            }
            12 | 13 => {
                let to = rng.below(MAX);
                f.set_len(to).unwrap();
                model.resize(to as usize, 0);
            }
            14 => f.sync_all().unwrap(),
            _ => {
                let at = rng.below(MAX);
                let len = 1 + rng.below(150_000);
                let mut got = vec![0u8; len as usize];
                let mut n = 0;
                while n < got.len() {
                    match f.read_at(&mut got[n..], at + n as u64).unwrap() {
                        0 => break,
                        k => n += k,
                    }
                }
                let want = model.get(at as usize..(at as usize + len as usize).min(model.len())).unwrap_or(&[]);
                assert!(got[..n] == *want, "step {step}: read of {len} at {at} differs from the model");
                assert_eq!(f.metadata().unwrap().len(), model.len() as u64, "step {step}: size");
            }
        }
    }
    drop(f);
    let got = std::fs::read(&other).unwrap();
    assert_eq!(got.len(), model.len(), "size seen by another mount");
    assert!(got == model, "contents seen by another mount differ from the model");
}

#[test]
fn an_open_with_o_trunc_truncates_what_other_handles_wrote_and_did_not_publish() {
    let fs = TestFs::up(&["--storage", "1"]);
    let buffered = fs.extra_mount("buffered", &["--cache-mode", "buffered", "--no-short-circuit"]);
    // Through the buffered mount (writes still in the mount) and the native one
    // (writes on the targets, their size not yet on the metadata node).
    for (p, name) in [(buffered.mnt.join("b"), "b"), (fs.path("n"), "n")] {
        let f = std::fs::File::create(&p).unwrap();
        f.write_all_at(&[7u8; 5000], 0).unwrap();
        let g = std::fs::OpenOptions::new().write(true).truncate(true).open(&p).unwrap();
        assert_eq!(g.metadata().unwrap().len(), 0, "{name}: size after O_TRUNC");
        g.write_all_at(b"new", 0).unwrap();
        drop(g);
        drop(f);
        let got = std::fs::read(fs.path(name)).unwrap();
        assert!(got == b"new", "{name}: {} bytes after the truncating open, not 3", got.len());
    }
}

#[test]
fn many_files_written_at_once_through_small_buffers_arrive_whole() {
    // 4 KiB buffers: the mount holds 256 KiB in all, so eight writers of
    // 1 MiB files keep running into the client-wide bound and wait on it.
    let fs = TestFs::up(&["--storage", "1"]);
    let buffered =
        fs.extra_mount("buffered", &["--cache-mode", "buffered", "--no-short-circuit", "--writeback-buffer", "4k"]);
    let files: Vec<(std::path::PathBuf, Vec<u8>)> =
        (0..8).map(|i| (buffered.mnt.join(format!("f{i}")), random_bytes(10 + i, 1 << 20))).collect();
    std::thread::scope(|s| {
        for (p, data) in &files {
            s.spawn(move || {
                let mut f = std::fs::File::create(p).unwrap();
                for piece in data.chunks(1000) {
                    f.write_all(piece).unwrap();
                }
            });
        }
    });
    for (i, (_, data)) in files.iter().enumerate() {
        let got = std::fs::read(fs.path(&format!("f{i}"))).unwrap();
        assert!(got == *data, "f{i}: {} bytes differ from what was written", got.len());
    }
}
