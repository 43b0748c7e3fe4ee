//! A failing disk under a storage node's chunk files: the real files
//! (`hivefs_chunk::ChunkStore`), with operations that fail as a disk's do,
//! drawn from the run's RNG while the run is not calm.
//!
//! A failed change is refused before it touches the file (`NoSpace` or
//! `Io`), or, for a write or copy, fails after part of it landed (a torn
//! write: the first part of the data is in the file, the answer is `Io`).
//! A failed read, stat, seek, listing or fsync changes nothing. What a
//! failure must not do is leave the buddies of a group different for good
//! or lose a change the service acknowledged; the end checks of the run
//! find both.

use crate::buddy::world::StorageWorld as World;
use hivefs_chunk::ChunkFiles;
use hivefs_types::error::{ErrorCode, FsError, FsResult};
use hivefs_types::ids::{EntryId, TargetId};
use rand::Rng;
use std::fs::File;
use std::path::Path;
use std::sync::{Arc, Weak};

/// Chunk files of one target of node `node`, failing now and then.
pub struct FailingDisk {
    inner: Arc<dyn ChunkFiles>,
    world: Weak<World>,
    node: usize,
}

impl std::fmt::Debug for FailingDisk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "failing disk of node {} under {:?}", self.node, self.inner)
    }
}

/// How an operation fails.
enum Failure {
    /// Nothing happened.
    Refused(FsError),
    /// A write or copy: part of it landed.
    Torn,
}

impl FailingDisk {
    /// Wraps the chunk files of every target of node `node`.
    pub fn wrap(world: &Arc<World>, node: usize) -> hivefs_chunk::Wrap {
        let world = Arc::downgrade(world);
        Arc::new(move |inner| Arc::new(FailingDisk { inner, world: world.clone(), node }))
    }

    /// Whether `op` on `entry` fails now, and how. `changes`: a change may
    /// run out of space; `tears`: a write may land in part.
    fn fault(&self, op: &str, entry: Option<EntryId>, changes: bool, tears: bool) -> Option<Failure> {
        let world = self.world.upgrade()?;
        if world.is_calm() || !world.chance(world.faults.disk_error) {
            return None;
        }
        let (torn, code) = {
            let mut r = world.rng();
            let torn = tears && r.gen_bool(0.5);
            let code = if changes && r.gen_bool(0.3) { ErrorCode::NoSpace } else { ErrorCode::Io };
            (torn, code)
        };
        world.stat(|s| s.disk_faults += 1);
        let t = self.inner.target();
        let what = entry.map_or_else(String::new, |e| format!(" of {e}"));
        world.trace(format_args!(
            "n{} target {t}: disk fails {op}{what} ({})",
            self.node,
            if torn { "torn".to_string() } else { format!("{code:?}") }
        ));
        Some(if torn {
            Failure::Torn
        } else {
            Failure::Refused(FsError::new(code, format!("target {t}: simulated disk failure in {op}{what}")))
        })
    }

    fn check(&self, op: &str, entry: Option<EntryId>, changes: bool) -> FsResult<()> {
        match self.fault(op, entry, changes, false) {
            None => Ok(()),
            Some(Failure::Refused(e)) => Err(e),
            Some(Failure::Torn) => unreachable!("only writes tear"),
        }
    }

    fn torn(&self, op: &str, entry: EntryId) -> FsError {
        FsError::new(
            ErrorCode::Io,
            format!("target {}: simulated disk failure in {op} of {entry} (part of it written)", self.inner.target()),
        )
    }
}

impl ChunkFiles for FailingDisk {
    fn target(&self) -> TargetId {
        self.inner.target()
    }
    fn dir(&self) -> &Path {
        self.inner.dir()
    }
    fn open(&self, entry: EntryId, create: bool) -> FsResult<Option<File>> {
        self.check("open", Some(entry), create)?;
        self.inner.open(entry, create)
    }
    fn open_readonly(&self, entry: EntryId) -> FsResult<Option<File>> {
        self.check("open", Some(entry), false)?;
        self.inner.open_readonly(entry)
    }
    fn make_subdirs(&self) -> std::io::Result<usize> {
        self.inner.make_subdirs()
    }
    fn write(&self, entry: EntryId, offset: u64, data: &[u8]) -> FsResult<u32> {
        match self.fault("write", Some(entry), true, data.len() > 1) {
            None => self.inner.write(entry, offset, data),
            Some(Failure::Refused(e)) => Err(e),
            Some(Failure::Torn) => {
                self.inner.write(entry, offset, &data[..data.len() / 2])?;
                Err(self.torn("write", entry))
            }
        }
    }
    fn digest(&self, entry: EntryId) -> FsResult<Option<u32>> {
        self.check("digest", Some(entry), false)?;
        self.inner.digest(entry)
    }
    fn read(&self, entry: EntryId, offset: u64, len: u32) -> FsResult<Vec<u8>> {
        self.check("read", Some(entry), false)?;
        self.inner.read(entry, offset, len)
    }
    fn open_read(&self, entry: EntryId, offset: u64, len: u32) -> FsResult<Option<(File, usize)>> {
        self.check("read", Some(entry), false)?;
        self.inner.open_read(entry, offset, len)
    }
    fn read_open(&self, entry: EntryId, f: &File, offset: u64, want: usize) -> FsResult<Vec<u8>> {
        self.inner.read_open(entry, f, offset, want)
    }
    fn read_cached(&self, entry: EntryId, f: &File, offset: u64, want: usize) -> FsResult<Option<Vec<u8>>> {
        self.inner.read_cached(entry, f, offset, want)
    }
    fn truncate(&self, entry: EntryId, len: u64) -> FsResult<()> {
        self.check("truncate", Some(entry), len > 0)?;
        self.inner.truncate(entry, len)
    }
    fn fallocate(&self, entry: EntryId, mode: u32, offset: u64, len: u64) -> FsResult<()> {
        self.check("fallocate", Some(entry), true)?;
        self.inner.fallocate(entry, mode, offset, len)
    }
    fn seek(&self, entry: EntryId, offset: u64, hole: bool) -> FsResult<Option<u64>> {
        self.check("seek", Some(entry), false)?;
        self.inner.seek(entry, offset, hole)
    }
    fn copy_from(&self, to: (EntryId, u64), src: &dyn ChunkFiles, from: (EntryId, u64), len: u32) -> FsResult<u32> {
        let entry = to.0;
        match self.fault("copy", Some(entry), true, len > 1) {
            None => self.inner.copy_from(to, src, from, len),
            Some(Failure::Refused(e)) => Err(e),
            Some(Failure::Torn) => {
                self.inner.copy_from(to, src, from, len / 2)?;
                Err(self.torn("copy", entry))
            }
        }
    }
    fn unlink(&self, entry: EntryId) -> FsResult<()> {
        self.check("unlink", Some(entry), false)?;
        self.inner.unlink(entry)
    }
    fn unlink_batch(&self, entries: &[EntryId]) -> FsResult<()> {
        self.check("unlink", entries.first().copied(), false)?;
        self.inner.unlink_batch(entries)
    }
    fn stat(&self, entry: EntryId) -> FsResult<u64> {
        self.check("stat", Some(entry), false)?;
        self.inner.stat(entry)
    }
    fn list(&self, after: Option<EntryId>, max: usize) -> FsResult<(Vec<(EntryId, u64)>, bool)> {
        self.check("list", None, false)?;
        self.inner.list(after, max)
    }
    fn fsync(&self, entry: EntryId) -> FsResult<()> {
        self.check("fsync", Some(entry), false)?;
        self.inner.fsync(entry)
    }
}
