//! StorageBench: write, then read back, a volume on each target locally —
//! no client and no network in the data path — to learn what the disks
//! behind the targets can do (BeeGFS's StorageBench).
//!
//! Each run works in a scratch directory `bench/` beside `chunks/` in the
//! target directory: every thread writes one file `bench/<thread>.dat`
//! sequentially in blocks, fsyncs it, and reads it back. The directory is
//! removed when the run ends, also when it fails; a `bench/` left by a
//! crashed process is removed before the next run. A run is refused when the
//! target's file system lacks the space for the volume plus
//! [`SPACE_RESERVE_BYTES`], and while another run uses the same target.
//!
//! The write phase includes the fsync. Between the phases the files' pages
//! are dropped from the page cache (`posix_fadvise(DONTNEED)`) so that reads
//! come from the disk; with `direct` (`O_DIRECT`) the cache is bypassed
//! altogether and the block size must be a multiple of [`DIRECT_ALIGN`].
//!
//! It must never touch `chunks/`.

use hivefs_chunk::ChunkFiles;
use hivefs_proto::TargetBench;
use hivefs_types::error::{FsError, FsResult};
use hivefs_types::fs_err;
use hivefs_types::ids::TargetId;
use std::collections::BTreeSet;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};
use tracing::{info, warn};

/// The scratch directory inside a target directory.
pub const BENCH_DIR: &str = "bench";
/// Space that must stay free on the target's file system after the scratch files are written.
pub const SPACE_RESERVE_BYTES: u64 = 64 << 20;
/// Alignment of buffers, offsets and block sizes with `O_DIRECT`.
pub const DIRECT_ALIGN: usize = 4096;
pub const BLOCK_BYTES_MIN: u32 = 512;
pub const BLOCK_BYTES_MAX: u32 = 64 << 20;
pub const THREADS_MAX: u32 = 64;

/// Targets with a run in progress (by directory), process-wide.
static BUSY: Mutex<BTreeSet<PathBuf>> = Mutex::new(BTreeSet::new());

/// Parameters of one run, checked by [`Params::validate`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Params {
    pub bytes_per_target: u64,
    pub block_bytes: u32,
    pub threads: u32,
    pub direct: bool,
}

impl Params {
    pub fn validate(&self) -> FsResult<()> {
        if !(BLOCK_BYTES_MIN..=BLOCK_BYTES_MAX).contains(&self.block_bytes) {
            return Err(fs_err!(
                Invalid,
                "storage bench block size {} is outside {BLOCK_BYTES_MIN}..={BLOCK_BYTES_MAX} bytes",
                self.block_bytes
            ));
        }
        if self.direct && !(self.block_bytes as usize).is_multiple_of(DIRECT_ALIGN) {
            return Err(fs_err!(
                Invalid,
                "storage bench with O_DIRECT needs a block size that is a multiple of {DIRECT_ALIGN}, not {}",
                self.block_bytes
            ));
        }
        if !(1..=THREADS_MAX).contains(&self.threads) {
            return Err(fs_err!(Invalid, "storage bench threads must be 1..={THREADS_MAX}, not {}", self.threads));
        }
        if self.blocks_per_thread() == 0 {
            return Err(fs_err!(
                Invalid,
                "storage bench volume {} bytes is less than one block of {} bytes per thread ({} threads)",
                self.bytes_per_target,
                self.block_bytes,
                self.threads
            ));
        }
        Ok(())
    }

    /// Whole blocks each thread writes (the volume is rounded down to them).
    pub fn blocks_per_thread(&self) -> u64 {
        self.bytes_per_target / u64::from(self.threads.max(1)) / u64::from(self.block_bytes.max(1))
    }

    /// Bytes one target writes and reads.
    pub fn bytes_moved(&self) -> u64 {
        self.blocks_per_thread() * u64::from(self.block_bytes) * u64::from(self.threads)
    }
}

fn now_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
}

/// Runs the benchmark on all `stores` at once (one blocking thread each, plus
/// `threads` workers per target) and returns their results in the same order.
pub async fn run(stores: Vec<Arc<dyn ChunkFiles>>, p: Params) -> FsResult<Vec<TargetBench>> {
    p.validate()?;
    let mut tasks = Vec::with_capacity(stores.len());
    for s in stores {
        tasks.push(tokio::task::spawn_blocking(move || run_target(s.target(), s.dir(), &p)));
    }
    let mut out = Vec::with_capacity(tasks.len());
    let mut first_err = None;
    for t in tasks {
        match t.await {
            Ok(Ok(r)) => out.push(r),
            Ok(Err(e)) => {
                first_err.get_or_insert(e);
            }
            Err(e) => {
                first_err.get_or_insert(fs_err!(Internal, "storage bench task failed: {e}"));
            }
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

/// Holds a target's busy mark and removes the scratch directory when dropped.
struct Scratch {
    target: TargetId,
    dir: PathBuf,
    key: PathBuf,
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            if e.kind() != std::io::ErrorKind::NotFound {
                warn!(target = %self.target, "cannot remove storage bench scratch dir {}: {e}", self.dir.display());
            }
        }
        BUSY.lock().expect("bench busy set").remove(&self.key);
    }
}

/// The whole run on one target: write phase, cache drop, read phase.
pub fn run_target(target: TargetId, dir: &Path, p: &Params) -> FsResult<TargetBench> {
    p.validate()?;
    let io_err = |what: &str, path: &Path, e: std::io::Error| {
        let code = hivefs_chunk::chunk_io_code(&e);
        FsError::new(code, format!("storage bench on target {target}: {what} {}: {e}", path.display()))
    };
    let bytes = p.bytes_moved();
    let cap = hivefs_cluster::capacity_of(dir).map_err(|e| io_err("statvfs of", dir, e))?;
    if cap.free_bytes < bytes.saturating_add(SPACE_RESERVE_BYTES) {
        return Err(fs_err!(
            NoSpace,
            "storage bench on target {target}: {} has {} bytes free, the run needs {bytes} plus a reserve of \
             {SPACE_RESERVE_BYTES}",
            dir.display(),
            cap.free_bytes
        ));
    }
    let key = dir.to_path_buf();
    if !BUSY.lock().expect("bench busy set").insert(key.clone()) {
        return Err(fs_err!(Busy, "storage bench on target {target}: another run is using {}", dir.display()));
    }
    let scratch = Scratch { target, dir: dir.join(BENCH_DIR), key };
    match std::fs::remove_dir_all(&scratch.dir) {
        Ok(()) => warn!(%target, "removed a storage bench scratch dir left by an earlier run"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err("cannot remove the old scratch dir", &scratch.dir, e)),
    }
    std::fs::create_dir(&scratch.dir).map_err(|e| io_err("cannot create", &scratch.dir, e))?;
    let paths: Vec<PathBuf> = (0..p.threads).map(|i| scratch.dir.join(format!("{i}.dat"))).collect();

    let write_start_ns = now_ns();
    each_thread(&paths, |path| write_file(path, p)).map_err(|(path, e)| io_err("writing", &path, e))?;
    let write_end_ns = now_ns();
    if !p.direct {
        for path in &paths {
            drop_cache(path).map_err(|e| io_err("dropping the cache of", path, e))?;
        }
    }
    let read_start_ns = now_ns();
    each_thread(&paths, |path| read_file(path, p)).map_err(|(path, e)| io_err("reading", &path, e))?;
    let read_end_ns = now_ns();
    drop(scratch);
    info!(%target, bytes, "storage bench done");
    Ok(TargetBench { target, bytes, write_start_ns, write_end_ns, read_start_ns, read_end_ns })
}

/// Runs `f` on every path in its own thread; the first error wins.
fn each_thread(
    paths: &[PathBuf],
    f: impl Fn(&Path) -> std::io::Result<()> + Sync,
) -> Result<(), (PathBuf, std::io::Error)> {
    std::thread::scope(|s| {
        let handles: Vec<_> = paths.iter().map(|path| (path, s.spawn(|| f(path)))).collect();
        let mut first = Ok(());
        for (path, h) in handles {
            let r = h.join().unwrap_or_else(|_| Err(std::io::Error::other("bench thread panicked")));
            if let (Err(e), Ok(())) = (r, &first) {
                first = Err((path.clone(), e));
            }
        }
        first
    })
}

fn open(path: &Path, p: &Params, write: bool) -> std::io::Result<File> {
    let mut o = OpenOptions::new();
    o.read(true).write(write).create(write).truncate(write).mode(0o600);
    if p.direct {
        o.custom_flags(libc::O_DIRECT);
    }
    o.open(path)
}

/// A block-sized buffer aligned for `O_DIRECT`, inside an over-allocated vector.
fn aligned(v: &mut Vec<u8>, len: usize) -> &mut [u8] {
    v.resize(len + DIRECT_ALIGN, 0);
    let off = v.as_ptr().align_offset(DIRECT_ALIGN);
    &mut v[off..off + len]
}

fn write_file(path: &Path, p: &Params) -> std::io::Result<()> {
    let f = open(path, p, true)?;
    let mut v = Vec::new();
    let buf = aligned(&mut v, p.block_bytes as usize);
    // Not zeros, so that a compressing or deduplicating file system cannot skip the work.
    for (i, b) in buf.iter_mut().enumerate() {
        *b = (i % 251) as u8 + 1;
    }
    let block = u64::from(p.block_bytes);
    for i in 0..p.blocks_per_thread() {
        f.write_all_at(buf, i * block)?;
    }
    f.sync_all()
}

fn read_file(path: &Path, p: &Params) -> std::io::Result<()> {
    let f = open(path, p, false)?;
    let mut v = Vec::new();
    let buf = aligned(&mut v, p.block_bytes as usize);
    let block = u64::from(p.block_bytes);
    for i in 0..p.blocks_per_thread() {
        f.read_exact_at(buf, i * block)?;
        if buf[0] != 1 {
            return Err(std::io::Error::other(format!("block {i} does not hold the data written")));
        }
    }
    Ok(())
}

fn drop_cache(path: &Path) -> std::io::Result<()> {
    let f = File::open(path)?;
    // Offset 0 and no length: the whole file.
    rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::DontNeed)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use hivefs_types::error::ErrorCode;

    fn params(bytes: u64, block: u32, threads: u32) -> Params {
        Params { bytes_per_target: bytes, block_bytes: block, threads, direct: false }
    }

    #[test]
    fn validation_and_rounding() {
        assert!(params(1 << 20, 4096, 2).validate().is_ok());
        assert_eq!(params(6_000, 4096, 2).bytes_moved(), 0);
        assert!(params(6_000, 4096, 2).validate().is_err());
        assert_eq!(params(20_000, 4096, 2).bytes_moved(), 16_384);
        assert!(params(1 << 20, 100, 1).validate().is_err());
        assert!(params(1 << 20, 4096, 0).validate().is_err());
        let d = Params { direct: true, ..params(1 << 20, 6000, 1) };
        assert!(d.validate().unwrap_err().message.contains("multiple of 4096"));
    }

    #[test]
    fn run_writes_reads_and_cleans_up() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("chunks")).unwrap();
        let r = run_target(TargetId(7), d.path(), &params(3 << 20, 64 << 10, 3)).unwrap();
        assert_eq!(r.target, TargetId(7));
        assert_eq!(r.bytes, 3 << 20);
        assert!(r.write_start_ns <= r.write_end_ns && r.write_end_ns <= r.read_start_ns);
        assert!(r.read_start_ns <= r.read_end_ns);
        assert!(!d.path().join(BENCH_DIR).exists());
        assert!(d.path().join("chunks").exists());
    }

    #[test]
    fn refuses_a_volume_larger_than_the_free_space() {
        let d = tempfile::tempdir().unwrap();
        let free = hivefs_cluster::capacity_of(d.path()).unwrap().free_bytes;
        let e = run_target(TargetId(3), d.path(), &params(free, 1 << 20, 1)).unwrap_err();
        assert_eq!(e.code, ErrorCode::NoSpace);
        assert!(e.message.contains("target 3"), "{e}");
        assert!(!d.path().join(BENCH_DIR).exists());
    }

    #[test]
    fn leftovers_of_a_crashed_run_are_removed() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join(BENCH_DIR)).unwrap();
        std::fs::write(d.path().join(BENCH_DIR).join("9.dat"), b"old").unwrap();
        run_target(TargetId(1), d.path(), &params(1 << 20, 1 << 20, 1)).unwrap();
        assert!(!d.path().join(BENCH_DIR).exists());
    }
}
