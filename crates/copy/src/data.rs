//! Copying the bytes of one range of a file: only the data regions
//! (SEEK_HOLE / SEEK_DATA; the destination was truncated to its final size,
//! so what is skipped stays a hole), with `copy_file_range` where the two
//! file systems allow it (a server-side copy within one HiveFS, a reflink or
//! in-kernel copy within a local file system) and read/write with a 1 MiB
//! buffer elsewhere (the kernel answers EXDEV across file systems, which is
//! remembered per pair of devices so it is asked once).

use crate::{OpContext, OpError};
use rustix::fs::{FallocateFlags, SeekFrom};
use rustix::io::Errno;
use std::cell::RefCell;
use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::sync::Mutex;

/// Read/write buffer per worker: the FUSE mount's largest request.
pub const BUF_BYTES: usize = 1 << 20;
/// Most bytes asked of one `copy_file_range` (progress moves at least this often).
const CFR_BYTES_MAX: u64 = 64 << 20;
/// Files this large are probed for holes even when their block count says
/// they have none: some file systems (a FUSE mount such as HiveFS) report
/// blocks from the size. Smaller files are copied whole with no extra call.
pub const PROBE_MIN_BYTES: u64 = 64 << 10;

thread_local! {
    static BUF: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Whether `copy_file_range` works from one device to another, learnt from
/// the first try of each pair.
#[derive(Debug, Default)]
pub(crate) struct CfrPairs(Mutex<HashMap<(u64, u64), bool>>);

impl CfrPairs {
    fn allowed(&self, pair: (u64, u64)) -> bool {
        *self.0.lock().expect("cfr pairs").get(&pair).unwrap_or(&true)
    }

    fn refuse(&self, pair: (u64, u64)) {
        self.0.lock().expect("cfr pairs").insert(pair, false);
    }
}

/// The files of one copy and how to move their bytes.
pub(crate) struct Files<'a> {
    pub src: &'a File,
    pub dst: &'a File,
    pub src_path: &'a Path,
    pub dst_path: &'a Path,
    /// (source device, destination device).
    pub devs: (u64, u64),
    /// Look for holes (see [`PROBE_MIN_BYTES`]).
    pub probe: bool,
    /// Punch the source's holes into the destination too: it was not
    /// truncated first (other parts of the copy write into it).
    pub punch: bool,
}

/// What a range copy did.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Copied {
    /// Bytes of data copied.
    pub data: u64,
    /// Where the last data copied ends (the destination's length after the
    /// copy if it was not extended otherwise).
    pub data_end: u64,
}

/// Copies `[off, end)` of `f.src` to the same offsets of `f.dst`, skipping
/// holes; adds the bytes to `bytes` as it goes.
pub(crate) fn copy_range(f: &Files, cfr: &CfrPairs, off: u64, end: u64, bytes: &AtomicU64) -> Result<Copied, OpError> {
    let mut done = Copied { data: 0, data_end: off };
    let mut pos = off;
    let mut probe = f.probe;
    while pos < end {
        let (start, stop) = if probe {
            match next_data(f.src, pos, end) {
                Ok(Some(r)) => r,
                Ok(None) => break,
                Err(Errno::NXIO) => return Err(shrank(f.src_path)),
                // No SEEK_HOLE here (EINVAL on some special file systems): all data.
                Err(Errno::INVAL) | Err(Errno::NOSYS) | Err(Errno::NOTSUP) => {
                    probe = false;
                    (pos, end)
                }
                Err(e) => return Err(e).op("seek data or hole", f.src_path),
            }
        } else {
            (pos, end)
        };
        if f.punch && start > pos {
            punch(f.dst, f.dst_path, pos, start)?;
        }
        copy_bytes(f, cfr, start, stop, bytes)?;
        done.data += stop - start;
        done.data_end = stop;
        pos = stop;
    }
    if f.punch && pos < end {
        punch(f.dst, f.dst_path, pos, end)?;
    }
    Ok(done)
}

/// The next data region within `[pos, end)`, or None if only holes are left.
fn next_data(src: &File, pos: u64, end: u64) -> Result<Option<(u64, u64)>, Errno> {
    // A dense file answers this first call with its end: one call.
    let hole = rustix::fs::seek(src, SeekFrom::Hole(pos))?;
    if hole > pos {
        return Ok(Some((pos, hole.min(end))));
    }
    let data = match rustix::fs::seek(src, SeekFrom::Data(pos)) {
        Ok(d) => d,
        // Holes to the end of the file.
        Err(Errno::NXIO) => return Ok(None),
        Err(e) => return Err(e),
    };
    if data >= end {
        return Ok(None);
    }
    let hole = rustix::fs::seek(src, SeekFrom::Hole(data))?;
    Ok(Some((data, hole.min(end))))
}

fn shrank(p: &Path) -> OpError {
    OpError {
        path: p.to_path_buf(),
        op: "read".into(),
        error: std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the file shrank during the copy"),
    }
}

/// `[start, stop)` with copy_file_range while the devices allow it, then
/// read/write.
fn copy_bytes(f: &Files, cfr: &CfrPairs, start: u64, stop: u64, bytes: &AtomicU64) -> Result<(), OpError> {
    let mut pos = start;
    if cfr.allowed(f.devs) {
        while pos < stop {
            let (mut i, mut o) = (pos, pos);
            let want = (stop - pos).min(CFR_BYTES_MAX) as usize;
            match rustix::fs::copy_file_range(f.src, Some(&mut i), f.dst, Some(&mut o), want) {
                // End of the source as the kernel sees it: read/write decides.
                Ok(0) => break,
                Ok(n) => {
                    pos += n as u64;
                    crate::Progress::add(bytes, n as u64);
                }
                Err(Errno::INTR) => {}
                // Not between these two: across file systems (EXDEV), or
                // one of them does not do it.
                Err(Errno::XDEV) | Err(Errno::NOSYS) | Err(Errno::NOTSUP) | Err(Errno::INVAL) => {
                    cfr.refuse(f.devs);
                    break;
                }
                Err(e) => return Err(e).op("copy_file_range", f.dst_path),
            }
        }
    }
    if pos < stop {
        read_write(f, pos, stop, bytes)?;
    }
    Ok(())
}

fn read_write(f: &Files, mut pos: u64, stop: u64, bytes: &AtomicU64) -> Result<(), OpError> {
    BUF.with_borrow_mut(|buf| {
        let want = ((stop - pos) as usize).min(BUF_BYTES);
        if buf.len() < want {
            buf.resize(want, 0);
        }
        while pos < stop {
            let n = ((stop - pos) as usize).min(buf.len());
            let got = match f.src.read_at(&mut buf[..n], pos) {
                Ok(0) => return Err(shrank(f.src_path)),
                Ok(g) => g,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e).op("read", f.src_path),
            };
            f.dst.write_all_at(&buf[..got], pos).op("write", f.dst_path)?;
            pos += got as u64;
            crate::Progress::add(bytes, got as u64);
        }
        Ok(())
    })
}

/// Makes `[start, stop)` of the destination read as zeroes: a punched
/// hole, or written zeroes where the file system cannot punch.
fn punch(dst: &File, p: &Path, start: u64, stop: u64) -> Result<(), OpError> {
    let mode = FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE;
    match rustix::fs::fallocate(dst, mode, start, stop - start) {
        Ok(()) => Ok(()),
        Err(Errno::NOTSUP) | Err(Errno::NOSYS) => {
            let zeroes = vec![0u8; ((stop - start) as usize).min(BUF_BYTES)];
            let mut pos = start;
            while pos < stop {
                let n = ((stop - pos) as usize).min(zeroes.len());
                dst.write_all_at(&zeroes[..n], pos).op("write zeroes", p)?;
                pos += n as u64;
            }
            Ok(())
        }
        Err(e) => Err(e).op("punch hole", p),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;
    use std::sync::atomic::Ordering;

    fn files<'a>(s: &'a File, d: &'a File, p: &'a Path, punch: bool) -> Files<'a> {
        Files { src: s, dst: d, src_path: p, dst_path: p, devs: (1, 2), probe: true, punch }
    }

    /// A 3 MiB file: data at 0..100k, a hole, data at 2 MiB..2 MiB+5, a hole to the end.
    fn sparse(dir: &Path) -> (File, Vec<u8>) {
        let p = dir.join("sparse");
        let f = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&p).unwrap();
        let mut want = vec![0u8; 3 << 20];
        let a: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8 + 1).collect();
        f.write_all_at(&a, 0).unwrap();
        want[..a.len()].copy_from_slice(&a);
        f.write_all_at(b"12345", 2 << 20).unwrap();
        want[(2 << 20)..(2 << 20) + 5].copy_from_slice(b"12345");
        f.set_len(3 << 20).unwrap();
        (f, want)
    }

    #[test]
    fn holes_are_skipped_and_stay_holes_with_either_path() {
        let t = tempfile::tempdir().unwrap();
        let (src, want) = sparse(t.path());
        for (i, allow_cfr) in [true, false].into_iter().enumerate() {
            let dp = t.path().join(format!("dst{i}"));
            let dst = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&dp).unwrap();
            dst.set_len(3 << 20).unwrap();
            let cfr = CfrPairs::default();
            if !allow_cfr {
                cfr.refuse((1, 2));
            }
            let bytes = AtomicU64::new(0);
            // In two ranges, as two workers would.
            let f = files(&src, &dst, &dp, false);
            let a = copy_range(&f, &cfr, 0, 1 << 20, &bytes).unwrap();
            let b = copy_range(&f, &cfr, 1 << 20, 3 << 20, &bytes).unwrap();
            // Data regions are whole blocks of the file system.
            assert!((100_000..=128 << 10).contains(&a.data), "{a:?}");
            assert!((5..=64 << 10).contains(&b.data), "{b:?}");
            assert_eq!(bytes.load(Ordering::Relaxed), a.data + b.data);
            assert!(std::fs::read(&dp).unwrap() == want);
            let blocks = dst.metadata().unwrap().blocks() * 512;
            assert!(blocks < 1 << 20, "{blocks} bytes allocated: holes were written");
        }
    }

    #[test]
    fn punching_clears_old_contents_where_the_source_has_holes() {
        let t = tempfile::tempdir().unwrap();
        let (src, want) = sparse(t.path());
        let dp = t.path().join("old");
        std::fs::write(&dp, vec![7u8; 3 << 20]).unwrap();
        let dst = std::fs::OpenOptions::new().write(true).open(&dp).unwrap();
        let bytes = AtomicU64::new(0);
        copy_range(&files(&src, &dst, &dp, true), &CfrPairs::default(), 0, 3 << 20, &bytes).unwrap();
        assert!(std::fs::read(&dp).unwrap() == want);
    }

    #[test]
    fn a_source_shorter_than_its_range_is_an_error_naming_it() {
        let t = tempfile::tempdir().unwrap();
        let sp = t.path().join("short");
        std::fs::write(&sp, b"abc").unwrap();
        let src = File::open(&sp).unwrap();
        let dp = t.path().join("d");
        let dst = File::create(&dp).unwrap();
        let cfr = CfrPairs::default();
        cfr.refuse((1, 2));
        let mut f = files(&src, &dst, &sp, false);
        f.probe = false;
        let e = copy_range(&f, &cfr, 0, 10, &AtomicU64::new(0)).unwrap_err();
        assert_eq!(e.path, sp);
        assert!(e.error.to_string().contains("shrank"), "{}", e.error);
    }
}
