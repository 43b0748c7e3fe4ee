//! The chunk files of one target, as the storage service uses them: the
//! seam between the service and its disks.
//!
//! [`ChunkStore`](crate::ChunkStore) (files below a target directory) is the
//! implementation the service runs with. A simulation wraps it (see
//! [`Wrap`]) to make chosen operations fail as a failing disk would, with
//! the error a disk gives (`Io`, `NoSpace`) and with or without part of the
//! change applied; the service must answer such failures without losing an
//! acknowledged change or letting buddies diverge for good.
//!
//! Every method blocks on the disk: callers run them on a blocking thread,
//! or inline for small requests. Errors name the target and the chunk.

use hivefs_types::error::FsResult;
use hivefs_types::ids::{EntryId, TargetId};
use std::fs::File;
use std::path::Path;
use std::sync::Arc;

/// The chunk files of one target. A missing chunk file reads as empty and
/// has length 0; changes create it as needed (see each method).
pub trait ChunkFiles: Send + Sync + std::fmt::Debug + 'static {
    /// The target these chunk files belong to.
    fn target(&self) -> TargetId;
    /// The directory holding them (below it, `chunks/`).
    fn dir(&self) -> &Path;
    /// Opens the chunk file for reading and writing (a short-circuit client
    /// gets the descriptor); `None` if it does not exist and `create` is false.
    fn open(&self, entry: EntryId, create: bool) -> FsResult<Option<File>>;
    /// Opens the chunk file for reading only; `None` if it does not exist.
    fn open_readonly(&self, entry: EntryId) -> FsResult<Option<File>>;
    /// Prepares the layout below the directory (done once at start); how
    /// many directories it made.
    fn make_subdirs(&self) -> std::io::Result<usize>;
    /// Writes all of `data` at `offset`; the bytes written.
    fn write(&self, entry: EntryId, offset: u64, data: &[u8]) -> FsResult<u32>;
    /// CRC-32 of the whole chunk file (`None`: there is none).
    fn digest(&self, entry: EntryId) -> FsResult<Option<u32>>;
    /// Up to `len` bytes at `offset`: fewer at the end, none past it.
    fn read(&self, entry: EntryId, offset: u64, len: u32) -> FsResult<Vec<u8>>;
    /// Opens the chunk file for a read of up to `len` bytes at `offset`,
    /// with the bytes there are to read; `None` when there are none.
    fn open_read(&self, entry: EntryId, offset: u64, len: u32) -> FsResult<Option<(File, usize)>>;
    /// Reads `want` bytes at `offset` of a file from [`ChunkFiles::open_read`].
    fn read_open(&self, entry: EntryId, f: &File, offset: u64, want: usize) -> FsResult<Vec<u8>>;
    /// Like [`ChunkFiles::read_open`], but `None` unless the page cache
    /// holds the whole range (the read would not wait for the disk).
    fn read_cached(&self, entry: EntryId, f: &File, offset: u64, want: usize) -> FsResult<Option<Vec<u8>>>;
    /// Sets the chunk file's length (a missing file is created unless `len` is 0).
    fn truncate(&self, entry: EntryId, len: u64) -> FsResult<()>;
    /// fallocate(2) of `[offset, offset+len)` with `Request::FallocateChunk`'s modes.
    fn fallocate(&self, entry: EntryId, mode: u32, offset: u64, len: u64) -> FsResult<()>;
    /// The next data (`hole: false`) or hole at or after `offset`, as lseek(2) finds it.
    fn seek(&self, entry: EntryId, offset: u64, hole: bool) -> FsResult<Option<u64>>;
    /// Copies `len` bytes from `from` (entry, offset) in `src` (a target of
    /// the same node, maybe this one) to `to`; zeroes past the source's end,
    /// so exactly `len` bytes land.
    fn copy_from(&self, to: (EntryId, u64), src: &dyn ChunkFiles, from: (EntryId, u64), len: u32) -> FsResult<u32>;
    /// Removes the chunk file (a missing one is not an error).
    fn unlink(&self, entry: EntryId) -> FsResult<()>;
    /// Removes several; goes on past a failure and reports the first.
    fn unlink_batch(&self, entries: &[EntryId]) -> FsResult<()>;
    /// The chunk file's length (0: there is none).
    fn stat(&self, entry: EntryId) -> FsResult<u64>;
    /// Chunk files with their lengths in (hash directory, entry id) order,
    /// strictly after `after`; at most `max`, and whether more follow.
    fn list(&self, after: Option<EntryId>, max: usize) -> FsResult<(Vec<(EntryId, u64)>, bool)>;
    /// Makes the chunk file's data, length and directory entry durable.
    fn fsync(&self, entry: EntryId) -> FsResult<()>;
}

/// What a service does with each target's chunk files before it uses them
/// (a simulation's failing disk); given the files on disk, returns the ones
/// to use.
pub type Wrap = Arc<dyn Fn(Arc<dyn ChunkFiles>) -> Arc<dyn ChunkFiles> + Send + Sync>;
