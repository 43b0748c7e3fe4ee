//! Positional reads of an open chunk file and the error code of a failed
//! chunk-file operation, shared by the storage service (its
//! [`ChunkStore`](crate::ChunkStore)) and short-circuit clients (descriptors
//! from [`crate::local`]).

use hivefs_types::error::ErrorCode;
use rustix::io::{Errno, ReadWriteFlags};
use std::io::{self, IoSliceMut};

/// The error code of a failed chunk-file operation: a full (or over-quota)
/// file system is `NoSpace`, a file too large `Invalid`, the rest `Io`.
/// Shared by the storage service and short-circuit clients, so both paths
/// report the same failure the same way.
pub fn chunk_io_code(e: &io::Error) -> ErrorCode {
    match Errno::from_io_error(e) {
        Some(Errno::NOSPC | Errno::DQUOT) => ErrorCode::NoSpace,
        Some(Errno::FBIG) => ErrorCode::Invalid,
        // A mode of fallocate(2) the target's file system does not have.
        Some(Errno::OPNOTSUPP) => ErrorCode::NotSupported,
        _ => ErrorCode::Io,
    }
}

/// Reads up to `len` bytes at `offset` of a chunk file: fewer only at its
/// end (also when it was truncated meanwhile).
pub fn read_at_full(f: &std::fs::File, offset: u64, len: usize) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; len];
    let n = read_at_full_into(f, offset, &mut buf)?;
    buf.truncate(n);
    Ok(buf)
}

/// [`read_at_full`] into `buf`; returns the bytes read (fewer than
/// `buf.len()` only at the end of the file).
pub fn read_at_full_into(f: &std::fs::File, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
    use std::os::unix::fs::FileExt;
    let mut done = 0;
    while done < buf.len() {
        match f.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// [`read_at_full`], but only if the page cache holds the whole range
/// (`preadv2` with `RWF_NOWAIT`): `None` when reading would wait for the
/// disk, when only part of it is cached or the file ends inside it, or when
/// the kernel cannot tell. Lets async code read cached pages on its own
/// thread and send the rest to blocking threads.
pub fn read_at_cached(f: &std::fs::File, offset: u64, len: usize) -> io::Result<Option<Vec<u8>>> {
    let mut buf = vec![0u8; len];
    Ok(read_at_cached_into(f, offset, &mut buf)?.then_some(buf))
}

/// [`read_at_cached`] into `buf`: true if it was filled.
pub fn read_at_cached_into(f: &std::fs::File, offset: u64, buf: &mut [u8]) -> io::Result<bool> {
    // Offsets must fit in off_t.
    if i64::try_from(offset).is_err() {
        return Ok(false);
    }
    let want = buf.len();
    match rustix::io::preadv2(f, &mut [IoSliceMut::new(buf)], offset, ReadWriteFlags::NOWAIT) {
        Ok(n) => Ok(n == want),
        // Not cached, or no RWF_NOWAIT here: the caller reads the usual way.
        Err(Errno::AGAIN | Errno::OPNOTSUPP | Errno::INVAL | Errno::INTR) => Ok(false),
        Err(e) => Err(e.into()),
    }
}
