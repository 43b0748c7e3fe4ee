//! The records of one metadata target: the checkpoint store `meta.redb`
//! (a redb database), the journal beside it (`journal`), the memory layers
//! every read and batch goes through (`mem`) and committing and
//! checkpointing (`log`).
//!
//! Owns table definitions, key encodings, record types and opening the
//! store (format check, journal replay, boot epoch). It must not contain
//! namespace rules: those are in `ops`, which reads and writes these records
//! through one batch's [`Tables`].
//!
//! # Key schema (format version 4; the journal carries the same keys and values)
//!
//! | table      | key                                   | value (postcard)                 |
//! |------------|---------------------------------------|----------------------------------|
//! | `dentries` | parent `EntryId` (16 B, big-endian) ++ name bytes | [`Dentry`] `{ id, kind, owner }` |
//! | `inodes`   | `EntryId` (16 B)                      | [`Inode`]                        |
//! | `xattrs`   | `EntryId` (16 B) ++ attribute name    | raw value bytes                  |
//! | `disposal` | `EntryId` (16 B)                      | [`Disposal`] `{ state, targets }`|
//! | `system`   | `&str` counter name                   | `u64`                            |
//! | `intents`  | intent id (16 B)                      | [`Intent`]                       |
//! | `locked_dentries` | parent ++ name                 | intent id (16 B)                 |
//! | `dir_extra`| directory `EntryId` (16 B)            | [`DirExtra`]                     |
//! | `peer_done`| intent id (16 B)                      | empty                            |
//! |            | intent id ++ tag ++ entry id (33 B)   | the step's answer (`cross::step`)|
//! |            | namespace node id (u32 BE, 4 B)       | its floor: an intent id (16 B)   |
//! | `replies`  | client id ++ seq (u64 BE each)        | version ++ time ++ answer (see `replies`) |
//! | `quota_usage` | kind (0 user, 1 group) ++ id (u32 BE) | inodes ++ bytes (u64 LE each), see `usage` |
//!
//! The last four tables came with several metadata nodes; they are new
//! tables (absent records mean "nothing pending", "parent on this node",
//! "default chooser"), so no existing record changed and the format version
//! stays 1.
//!
//! `EntryId::to_bytes` is fixed-width big-endian, so all dentries of one
//! directory are contiguous and sorted by name bytes: `readdir` is a range
//! scan, and sharding a huge directory by name hash later only changes which
//! node holds a key range, not the key format.
//!
//! Values are postcard-encoded, which is not self-describing: any change of a
//! record type must bump [`FORMAT_VERSION`] and migrate. Version 4 added the
//! `quota_usage` table, counted from the inodes at the first start of an
//! older store (older builds refuse a version 4 store, whose usage records
//! they would not keep). Version 3 changed no
//! record (a journal now holds the newest changes; version 2 builds refuse
//! the store instead of ignoring it). Version 2 added
//! `mirror` to a directory's [`DirPattern`] and `mirrored` to [`Disposal`];
//! [`Store::open`] migrates a version 1 store in place ([`migrate_v1`]). `replies` values
//! are the exception: they carry their own record version (see `replies`).

pub mod journal;
pub mod log;
pub mod mem;
mod multi;
mod tables;
pub mod usage;

pub(crate) use mem::{sys_get, sys_put};
pub use mem::{Kv, Mem, ReadTables, Tables};
pub(crate) use multi::{clear_intent, load_dirx, load_intent, put_dirx, put_intent};
pub use multi::{DirExtra, Intent, IntentStep, Xattrs};
pub use tables::{LeaseKey, OpError, OpResult};

use hivefs_types::attr::{FileKind, Timespec};

thread_local! {
    /// Blocking work runs where it is asked for instead of on tokio's
    /// blocking pool (see [`run_blocking_in_place_on_this_thread`]).
    static IN_PLACE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Makes every metadata service task polled by this thread do its blocking
/// work (store opening and closing, journal reads, dumps, copies' steps) in
/// place instead of on tokio's blocking pool, and a copy's checkpoints in
/// its commits instead of on a thread of their own: for a deterministic
/// simulation, which runs all nodes on one current-thread runtime and must
/// not let another thread's timing decide the order of events.
pub fn run_blocking_in_place_on_this_thread(on: bool) {
    IN_PLACE.with(|c| c.set(on));
}

/// Whether blocking work runs in place on this thread.
pub fn blocking_in_place() -> bool {
    IN_PLACE.with(|c| c.get())
}

/// Runs disk or CPU-heavy work (a journal read, a dump of the namespace,
/// opening a store) on the blocking pool, not on a runtime worker (in place
/// under [`run_blocking_in_place_on_this_thread`]); `Err` when it panicked.
pub async fn off_workers<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T, String> {
    if blocking_in_place() {
        return Ok(f());
    }
    tokio::task::spawn_blocking(f).await.map_err(|e| e.to_string())
}
use hivefs_types::ids::{BuddyGroupId, EntryId, NodeId, TargetId};
use hivefs_types::pattern::{DirPattern, Pattern, StripeSet, StripeUnit};
use redb::backends::FileBackend;
use redb::{ReadableTable, TableDefinition};
use serde::{de::DeserializeOwned, Deserialize, Serialize};
use std::fs::OpenOptions;
use std::io;
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub(crate) const DENTRIES: TableDefinition<&[u8], &[u8]> = TableDefinition::new("dentries");
pub(crate) const INODES: TableDefinition<&[u8], &[u8]> = TableDefinition::new("inodes");
pub(crate) const XATTRS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("xattrs");
pub(crate) const DISPOSAL: TableDefinition<&[u8], &[u8]> = TableDefinition::new("disposal");
pub(crate) const SYSTEM: TableDefinition<&str, u64> = TableDefinition::new("system");
/// Pending cross-node operations: intent id → postcard [`Intent`].
pub(crate) const INTENTS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("intents");
/// Dentries held by a pending intent: parent ++ name → intent id.
pub(crate) const LOCKED: TableDefinition<&[u8], &[u8]> = TableDefinition::new("locked_dentries");
/// Directory settings beside the inode: dir id → postcard [`DirExtra`].
pub(crate) const DIRX: TableDefinition<&[u8], &[u8]> = TableDefinition::new("dir_extra");
/// Destination halves of renames applied here: intent id → empty.
pub(crate) const PEER_DONE: TableDefinition<&[u8], &[u8]> = TableDefinition::new("peer_done");
/// Answers of client operations that may be retried: client ++ seq → record (see `replies`).
pub(crate) const REPLIES: TableDefinition<&[u8], &[u8]> = TableDefinition::new("replies");
/// What each user's and group's inodes hold (see `usage`): kind ++ id → inodes ++ bytes.
pub(crate) const USAGE: TableDefinition<&[u8], &[u8]> = TableDefinition::new("quota_usage");

/// Test hook: `HIVEFS_CRASH_AT=<op>:<step>` makes the metadata service abort
/// (as `kill -9`) at a step of a cross-node protocol (`cross`) or of a
/// commit or checkpoint (`log`).
pub const CRASH_ENV: &str = "HIVEFS_CRASH_AT";

/// File name of the store inside the data dir.
pub const DB_FILE: &str = "meta.redb";

/// Version of the key schema and record encodings above.
pub const FORMAT_VERSION: u64 = 4;

/// Names of the counters in the `system` table.
pub(crate) mod sys {
    pub const FORMAT: &str = "format_version";
    /// Incremented and persisted at every start; part of every minted EntryId.
    pub const EPOCH: &str = "boot_epoch";
    /// Live non-directory inodes (regular files, symlinks, special files).
    pub const FILES: &str = "files";
    /// Live directories, including the root if this node owns it.
    pub const DIRS: &str = "dirs";
    /// The last journal batch the store holds (written by each checkpoint).
    pub const JOURNAL_SEQ: &str = "journal_seq";
    /// The checksum of that batch, when the checkpoint knew it (a mirror's
    /// copy compares it with its primary's journal after a restart).
    pub const JOURNAL_CRC: &str = "journal_crc";
    /// 1 once the `quota_usage` table holds a count of every inode (a store
    /// of format version 3 or older is counted at its first start).
    pub const USAGE_COUNTED: &str = "usage_counted";
}

/// A name in a directory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dentry {
    pub id: EntryId,
    pub kind: FileKind,
    /// Metadata node that stores the entry's inode: this node for files,
    /// symlinks and special files; the directory's owner for subdirectories.
    pub owner: NodeId,
}

/// Attributes of one file system object.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Inode {
    pub kind: FileKind,
    /// Permission bits only (`& 0o7777`).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub nlink: u32,
    pub atime: Timespec,
    pub mtime: Timespec,
    pub ctime: Timespec,
    pub rdev: u32,
    /// Regular files: the stripe pattern fixed at creation.
    pub pattern: Option<Pattern>,
    /// Directories: settings for new files and subdirectories.
    pub dir_pattern: Option<DirPattern>,
    /// Symlinks: the target.
    pub symlink: Option<Vec<u8>>,
    /// Directories: the parent directory (the root points to itself). Used for
    /// `..` and for the rename loop check.
    pub parent: Option<EntryId>,
}

/// Why an entry is in the `disposal` table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DisposalState {
    /// Unlinked while open: the inode stays in `inodes` with `nlink == 0` so
    /// that open handles keep working; the chunks go when the last handle is
    /// released (or at the next start of this node).
    OpenUnlinked,
    /// The inode is gone; the chunk files on `targets` must be deleted.
    DeleteChunks,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Disposal {
    pub state: DisposalState,
    /// The file's stripe: targets, or buddy groups when `mirrored`.
    pub targets: Vec<TargetId>,
    pub mirrored: bool,
}

impl Disposal {
    /// Where the chunk files to delete are.
    pub fn units(&self) -> Vec<StripeUnit> {
        self.targets
            .iter()
            .map(|t| if self.mirrored { StripeUnit::Group(BuddyGroupId(t.0)) } else { StripeUnit::Target(*t) })
            .collect()
    }

    /// The record with only the targets at stripe positions in `known`
    /// (`None`: unknown, every target stays), filtered in place.
    pub fn only(mut self, known: Option<StripeSet>) -> Disposal {
        if let Some(s) = known {
            let mut idx = 0;
            self.targets.retain(|_| {
                idx += 1;
                s.contains(idx - 1)
            });
        }
        self
    }

    /// The disposal record of a file with pattern `p` (none: no chunks)
    /// whose chunk files can be only at the stripe positions in `known`
    /// (`None`: anywhere). A file known to have none gets no targets, and
    /// no list is allocated.
    pub fn of(state: DisposalState, p: Option<&Pattern>, known: Option<StripeSet>) -> Disposal {
        let targets = match (p, known) {
            (None, _) => Vec::new(),
            (Some(p), None) => p.targets().to_vec(),
            (Some(p), Some(s)) => s.pick(p.targets()),
        };
        Disposal { state, targets, mirrored: p.is_some_and(|p| p.is_mirrored()) }
    }
}

pub(crate) fn id_key(id: EntryId) -> [u8; EntryId::LEN] {
    id.to_bytes()
}

/// `parent ++ name`: the key of a dentry, and of an xattr (`id ++ name`).
pub(crate) fn child_key(parent: EntryId, name: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(EntryId::LEN + name.len());
    k.extend_from_slice(&parent.to_bytes());
    k.extend_from_slice(name);
    k
}

/// One `(name, value)` pair of a scan.
pub(crate) type KvResult = OpResult<(Vec<u8>, Vec<u8>)>;

/// Iterates the `(name, value)` pairs under `prefix` (an EntryId) with names
/// strictly after `after`, in name order. Bounded memory: a range scan.
pub(crate) fn scan_children<'t>(
    table: &'t impl Kv,
    prefix: EntryId,
    after: Option<&[u8]>,
) -> OpResult<impl Iterator<Item = KvResult> + 't> {
    let p = prefix.to_bytes();
    let start = match after {
        Some(a) => Bound::Excluded(child_key(prefix, a)),
        None => Bound::Included(p.to_vec()),
    };
    let range = table.range_from(start.as_ref().map(Vec::as_slice))?;
    Ok(range
        .take_while(move |r| match r {
            Ok((k, _)) => k.starts_with(&p),
            Err(_) => true,
        })
        .map(|r| r.map(|(k, v)| (k[EntryId::LEN..].to_vec(), v))))
}

pub(crate) fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    // Serialising plain data into a Vec cannot fail.
    postcard::to_allocvec(v).expect("postcard encoding into a Vec")
}

pub(crate) fn decode<T: DeserializeOwned>(what: &str, key: impl std::fmt::Display, b: &[u8]) -> Result<T, String> {
    postcard::from_bytes(b).map_err(|e| format!("corrupt {what} record {key}: {e}"))
}

/// Failure to open the store.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    #[error("cannot open metadata store {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("metadata store {path} is in use by another process (is another `hivefs meta` running on this data dir?)")]
    InUse { path: PathBuf },
    #[error("metadata store {path}: {message}")]
    Db { path: PathBuf, message: String },
    #[error("metadata store {path} has format version {found}, this build reads version {FORMAT_VERSION}")]
    Format { path: PathBuf, found: u64 },
}

/// Default size of the store's page cache. The store file is read through the
/// kernel's page cache as well, so a small cache costs little (see
/// docs/decisions.md) and keeps the node's memory bounded whatever the
/// namespace's size.
pub const DEFAULT_CACHE_BYTES: u64 = 64 << 20;

/// An opened store: the checkpoint store and the journal replayed over it
/// (the [`log::Log`] the writer commits through), and the epoch of this boot.
pub struct Store {
    pub log: log::Log,
    pub epoch: u32,
    /// The last id counter taken in `epoch` (0 after open; tests start near
    /// the end of an epoch).
    pub counter: u64,
    pub path: PathBuf,
}

impl Store {
    /// Opens (or creates) `path` and the journal beside it, checks the
    /// format version, replays the journal and increments the boot epoch
    /// durably (so EntryIds minted in this boot cannot collide with any
    /// earlier boot's). `sync`: every journal append is fdatasynced.
    pub fn open(path: &Path, sync: bool) -> Result<Store, StoreError> {
        Self::open_with_cache(path, sync, DEFAULT_CACHE_BYTES)
    }

    /// [`Store::open`] with a page cache of at most `cache_bytes` (redb's own
    /// default, 1 GiB, would let a large namespace fill the node's memory).
    pub fn open_with_cache(path: &Path, sync: bool, cache_bytes: u64) -> Result<Store, StoreError> {
        let mut s = Self::open_replica(path, sync, cache_bytes)?;
        s.count_usage_once()?;
        s.bump_epoch()?;
        Ok(s)
    }

    /// Opens the store without a new boot epoch: nothing is written, so a
    /// mirrored namespace's copy stays batch for batch what its primary
    /// sent. [`Store::bump_epoch`] before minting ids.
    pub fn open_replica(path: &Path, sync: bool, cache_bytes: u64) -> Result<Store, StoreError> {
        let p = path.to_path_buf();
        let db_err = |e: &dyn std::fmt::Display| StoreError::Db { path: p.clone(), message: e.to_string() };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(|source| StoreError::Io { path: p.clone(), source })?;
        #[allow(deprecated)] // FileBackend::new's signature changes in redb 5; both forms are fine here.
        let inner = FileBackend::new(file).map_err(|e| db_err(&e))?;
        // The store is written by checkpoints only (in the background, and
        // journal segments are deleted after them): always fsynced.
        let db =
            redb::Builder::new().set_cache_size(cache_bytes as usize).create_with_backend(inner).map_err(
                |e| match e {
                    redb::DatabaseError::DatabaseAlreadyOpen => StoreError::InUse { path: p.clone() },
                    e => db_err(&e),
                },
            )?;
        let txn = db.begin_write().map_err(|e| db_err(&e))?;
        let checkpoint_seq = {
            // Opening every table here means readers never see a missing table.
            for t in [DENTRIES, INODES, XATTRS, DISPOSAL, INTENTS, LOCKED, DIRX, PEER_DONE, REPLIES, USAGE] {
                txn.open_table(t).map_err(|e| db_err(&e))?;
            }
            let mut sys_t = txn.open_table(SYSTEM).map_err(|e| db_err(&e))?;
            let format = sys_t.get(sys::FORMAT).map_err(|e| db_err(&e))?.map(|v| v.value());
            match format {
                None => {
                    sys_t.insert(sys::FORMAT, FORMAT_VERSION).map_err(|e| db_err(&e))?;
                }
                Some(FORMAT_VERSION) => {}
                Some(2 | 3) => {
                    // Same records; from now on the journal beside the store
                    // holds the newest changes, which version 2 would ignore.
                    sys_t.insert(sys::FORMAT, FORMAT_VERSION).map_err(|e| db_err(&e))?;
                }
                Some(1) => {
                    let n = migrate_v1(&txn).map_err(|m| db_err(&m))?;
                    sys_t.insert(sys::FORMAT, FORMAT_VERSION).map_err(|e| db_err(&e))?;
                    tracing::info!(store = %p.display(), directories = n, "metadata store migrated from format version 1 to {FORMAT_VERSION}");
                }
                Some(found) => return Err(StoreError::Format { path: p.clone(), found }),
            }
            let seq = sys_t.get(sys::JOURNAL_SEQ).map_err(|e| db_err(&e))?.map_or(0, |v| v.value());
            let crc = sys_t.get(sys::JOURNAL_CRC).map_err(|e| db_err(&e))?.map(|v| v.value() as u32);
            (seq, crc)
        };
        let (checkpoint_seq, checkpoint_crc) = checkpoint_seq;
        txn.commit().map_err(|e| db_err(&e))?;
        let mem = Arc::new(Mem::new(Arc::new(db)));
        let jdir = path.parent().unwrap_or(Path::new(".")).join(journal::JOURNAL_DIR);
        let (journal, replayed) = journal::Journal::open(&jdir, sync, (checkpoint_seq, checkpoint_crc), |_, body| {
            mem.apply(mem::decode_changes(body)?);
            Ok(())
        })
        .map_err(|m| db_err(&m))?;
        for (seg, off) in &replayed.torn {
            tracing::warn!(journal = %jdir.display(), segment = seg, offset = off, "torn journal record cut off (the last write before a crash)");
        }
        if replayed.records > 0 {
            tracing::info!(journal = %jdir.display(), batches = replayed.records, bytes = replayed.bytes, "metadata journal replayed");
        }
        let log = log::Log::new(mem, journal);
        Ok(Store { log, epoch: 0, counter: 0, path: p })
    }

    /// Increments the boot epoch durably (one batch, through the mirror hook
    /// if one is set), so EntryIds minted from now on cannot collide with
    /// any earlier boot's.
    pub fn bump_epoch(&mut self) -> Result<(), StoreError> {
        log::run_to_end(self.bump_epoch_async())
    }

    /// [`Store::bump_epoch`], waiting asynchronously for a mirror's secondary.
    pub async fn bump_epoch_async(&mut self) -> Result<(), StoreError> {
        let p = self.path.clone();
        let db_err = |e: &dyn std::fmt::Display| StoreError::Db { path: p.clone(), message: e.to_string() };
        let old = self.log.mem.read(|t| sys_get(&t.system, sys::EPOCH)).map_err(|e| db_err(&format!("{e:?}")))?;
        let epoch = old + 1;
        if epoch > u64::from(EntryId::MAX_EPOCH) {
            return Err(db_err(&format!("entry ids exhausted: epoch {epoch} is beyond {}", EntryId::MAX_EPOCH)));
        }
        let ((), changes) =
            self.log.mem.batch(|t| sys_put(&mut t.system, sys::EPOCH, epoch)).map_err(|e| db_err(&format!("{e:?}")))?;
        let jdir = self.log.journal_dir().to_path_buf();
        self.log.commit_async(changes).await.map_err(|e| db_err(&format!("journal {}: {e:?}", jdir.display())))?;
        self.epoch = epoch as u32;
        self.counter = 0;
        Ok(())
    }

    /// A store written before quota usage was kept: count every inode once
    /// (one batch; then the records follow every inode change).
    fn count_usage_once(&mut self) -> Result<(), StoreError> {
        let p = self.path.clone();
        let db_err = |e: &dyn std::fmt::Display| StoreError::Db { path: p.clone(), message: e.to_string() };
        let done = self.log.mem.read(|t| sys_get(&t.system, sys::USAGE_COUNTED)).map_err(|e| db_err(&e))?;
        if done == 1 {
            return Ok(());
        }
        let start = std::time::Instant::now();
        let (n, changes) = self
            .log
            .mem
            .batch(|t| {
                let n = usage::recount(t, true)?.len();
                sys_put(&mut t.system, sys::USAGE_COUNTED, 1)?;
                Ok(n)
            })
            .map_err(|e| db_err(&e))?;
        self.log.commit(changes).map_err(|e| db_err(&format!("journal: {e:?}")))?;
        if n > 0 {
            tracing::info!(store = %p.display(), users_and_groups = n, elapsed = ?start.elapsed(), "quota usage counted");
        }
        Ok(())
    }

    /// Applies `f` as one batch outside the writer (a stopped node's offline
    /// edits and tests), journaled and checkpointed at once.
    pub fn edit(&mut self, f: impl FnOnce(&mut Tables<'_>) -> OpResult<()>) -> Result<(), String> {
        let ((), changes) = self.log.mem.batch(f).map_err(|e| format!("{}: {e:?}", self.path.display()))?;
        self.log.commit(changes).map_err(|e| format!("{}: {e:?}", self.path.display()))?;
        self.log.checkpoint_now();
        Ok(())
    }
}

/// Directory, inside a store's directory, where a full copy from a
/// mirror's primary is assembled before it replaces the store.
pub const INCOMING_DIR: &str = "resync";

/// A full copy of a mirrored namespace being received: a fresh store in
/// [`INCOMING_DIR`], filled piece by piece, then put in place of the old
/// store and journal at once ([`Incoming::finish`]).
pub struct Incoming {
    store: Store,
    seq: u64,
    crc: Option<u32>,
    dir: PathBuf,
}

impl Incoming {
    /// Starts a copy of the primary's records as of batch `seq` for the
    /// store at `path` (which must be closed by the time of `finish`).
    pub fn begin(path: &Path, seq: u64, crc: Option<u32>) -> Result<Incoming, StoreError> {
        let dir = path.parent().unwrap_or(Path::new(".")).join(INCOMING_DIR);
        let io_err = |source| StoreError::Io { path: dir.clone(), source };
        if dir.exists() {
            std::fs::remove_dir_all(&dir).map_err(io_err)?;
        }
        std::fs::create_dir_all(&dir).map_err(io_err)?;
        let store = Store::open_replica(&dir.join(DB_FILE), false, DEFAULT_CACHE_BYTES)?;
        Ok(Incoming { store, seq, crc, dir })
    }

    /// Writes one piece (a record body of puts) into the new store.
    pub fn add(&mut self, piece: &[u8]) -> Result<(), String> {
        let mut maps = mem::Maps::default();
        maps.absorb(mem::decode_changes(piece)?);
        self.store.log.mem.write_checkpoint(&maps, self.seq, self.crc, &|| {})?;
        Ok(())
    }

    /// Puts the new store in place of the one at `path` and the journal
    /// beside it. A crash on the way leaves either store with no journal
    /// records beyond it, or the new one: a consistent (older) copy either
    /// way, which the next resync brings up to date.
    pub fn finish(self, path: &Path) -> Result<(), StoreError> {
        let Incoming { store, dir, .. } = self;
        drop(store);
        let parent = path.parent().unwrap_or(Path::new(".")).to_path_buf();
        let io_err = |source| StoreError::Io { path: parent.clone(), source };
        let journal = parent.join(journal::JOURNAL_DIR);
        let old = parent.join("journal.old");
        if journal.exists() {
            if old.exists() {
                std::fs::remove_dir_all(&old).map_err(io_err)?;
            }
            std::fs::rename(&journal, &old).map_err(io_err)?;
            std::fs::remove_dir_all(&old).map_err(io_err)?;
        }
        std::fs::rename(dir.join(DB_FILE), path).map_err(io_err)?;
        std::fs::rename(dir.join(journal::JOURNAL_DIR), &journal).map_err(io_err)?;
        std::fs::remove_dir_all(&dir).map_err(io_err)?;
        std::fs::File::open(&parent).and_then(|d| d.sync_all()).map_err(io_err)?;
        Ok(())
    }
}

/// Records of format version 1 that differ from version 2.
mod v1 {
    use super::*;
    use hivefs_types::ids::PoolId;
    use hivefs_types::pattern::Chooser;

    #[derive(Deserialize)]
    pub struct DirPattern {
        chunk_size: u32,
        stripe_count: u32,
        pool: PoolId,
        chooser: Chooser,
    }

    #[derive(Deserialize)]
    pub struct Inode {
        kind: FileKind,
        mode: u32,
        uid: u32,
        gid: u32,
        size: u64,
        nlink: u32,
        atime: Timespec,
        mtime: Timespec,
        ctime: Timespec,
        rdev: u32,
        pattern: Option<Pattern>,
        pub dir_pattern: Option<DirPattern>,
        symlink: Option<Vec<u8>>,
        parent: Option<EntryId>,
    }

    #[derive(Deserialize)]
    pub struct Disposal {
        state: super::DisposalState,
        targets: Vec<TargetId>,
    }

    impl From<Disposal> for super::Disposal {
        fn from(d: Disposal) -> super::Disposal {
            super::Disposal { state: d.state, targets: d.targets, mirrored: false }
        }
    }

    impl From<Inode> for super::Inode {
        fn from(i: Inode) -> super::Inode {
            let Inode {
                kind,
                mode,
                uid,
                gid,
                size,
                nlink,
                atime,
                mtime,
                ctime,
                rdev,
                pattern,
                dir_pattern,
                symlink,
                parent,
            } = i;
            let dir_pattern = dir_pattern.map(|d| super::DirPattern {
                chunk_size: d.chunk_size,
                stripe_count: d.stripe_count,
                pool: d.pool,
                chooser: d.chooser,
                mirror: false,
            });
            super::Inode {
                kind,
                mode,
                uid,
                gid,
                size,
                nlink,
                atime,
                mtime,
                ctime,
                rdev,
                pattern,
                dir_pattern,
                symlink,
                parent,
            }
        }
    }
}

/// Rewrites a format version 1 store's directory inodes (their
/// [`DirPattern`] gained `mirror`, false for all of them; file inodes
/// encode the same in both versions) and disposal records (`mirrored`, false). Pending cross-node intents may hold
/// directory inodes too: a store with any is refused, to be opened by the
/// previous version once, which finishes them. Returns the directories
/// rewritten.
fn migrate_v1(txn: &redb::WriteTransaction) -> Result<u64, String> {
    let e = |e: &dyn std::fmt::Display| e.to_string();
    if txn.open_table(INTENTS).map_err(|x| e(&x))?.iter().map_err(|x| e(&x))?.next().is_some() {
        return Err("format version 1 store has pending cross-node operations: start the previous HiveFS \
                    version on it once to finish them, then this one"
            .into());
    }
    let mut inodes = txn.open_table(INODES).map_err(|x| e(&x))?;
    let mut rewrite = Vec::new();
    for r in inodes.iter().map_err(|x| e(&x))? {
        let (k, v) = r.map_err(|x| e(&x))?;
        let old: v1::Inode = decode("inode (format 1)", hex_key(k.value()), v.value())?;
        if old.dir_pattern.is_some() {
            rewrite.push((k.value().to_vec(), encode(&Inode::from(old))));
        }
    }
    for (k, v) in &rewrite {
        inodes.insert(k.as_slice(), v.as_slice()).map_err(|x| e(&x))?;
    }
    let mut disposal = txn.open_table(DISPOSAL).map_err(|x| e(&x))?;
    let mut again = Vec::new();
    for r in disposal.iter().map_err(|x| e(&x))? {
        let (k, v) = r.map_err(|x| e(&x))?;
        let old: v1::Disposal = decode("disposal (format 1)", hex_key(k.value()), v.value())?;
        again.push((k.value().to_vec(), encode(&Disposal::from(old))));
    }
    for (k, v) in &again {
        disposal.insert(k.as_slice(), v.as_slice()).map_err(|x| e(&x))?;
    }
    Ok(rewrite.len() as u64)
}

fn hex_key(k: &[u8]) -> String {
    k.iter().map(|b| format!("{b:02x}")).collect()
}

/// Shows a name in messages: quoted, lossy UTF-8.
pub fn q(name: &[u8]) -> String {
    format!("{:?}", String::from_utf8_lossy(name))
}

/// Reads and decodes a postcard record.
pub(crate) fn get_record<R: DeserializeOwned>(table: &impl Kv, what: &str, id: EntryId) -> OpResult<Option<R>> {
    match table.get(id_key(id).as_slice())? {
        None => Ok(None),
        Some(v) => Ok(Some(decode(what, id, &v).map_err(OpError::Fatal)?)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hivefs_types::pattern::{Chooser, DirPattern, PatternKind};
    use redb::ReadableDatabase;

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    /// The store's records as they are on disk (format version 2), the
    /// cross-node intents included: a change of any record type shows here
    /// first, and needs a format version and a migration (the metadata
    /// journal will carry the same records).
    #[test]
    fn record_encodings_are_pinned() {
        let id = EntryId { node: 1, epoch: 2, counter: 3 };
        let t = |sec| Timespec { sec, nsec: 7 };
        let file = Inode {
            kind: FileKind::File,
            mode: 0o644,
            uid: 1000,
            gid: 100,
            size: 70_000,
            nlink: 1,
            atime: t(1),
            mtime: t(2),
            ctime: t(3),
            rdev: 0,
            pattern: Some(Pattern::new(PatternKind::Raid0, 65_536, vec![TargetId(4), TargetId(9)]).unwrap()),
            dir_pattern: None,
            symlink: None,
            parent: None,
        };
        let dir = Inode {
            kind: FileKind::Dir,
            mode: 0o2755,
            nlink: 3,
            size: 0,
            pattern: None,
            dir_pattern: Some(DirPattern {
                chunk_size: 524_288,
                stripe_count: 0,
                pool: hivefs_types::ids::PoolId(1),
                chooser: Chooser::Balanced,
                mirror: true,
            }),
            parent: Some(EntryId::ROOT),
            ..file.clone()
        };
        let cases: [(&str, Vec<u8>, &str); 7] = [
            ("dentry", encode(&Dentry { id, kind: FileKind::Dir, owner: NodeId(2) }), "0102030102"),
            ("file inode", encode(&file), "00a403e80764f0a20401020704070607000100808004020409000000"),
            ("directory inode", encode(&dir), "01ed0be807640003020704070607000001808020000103010001000001"),
            (
                "disposal",
                encode(&Disposal { state: DisposalState::DeleteChunks, targets: vec![TargetId(4)], mirrored: true }),
                "01010401",
            ),
            (
                "dir extra",
                encode(&DirExtra {
                    parent_owner: Some(NodeId(3)),
                    chooser: Some(hivefs_proto::MetaChooser::RoundRobin),
                }),
                "01030102",
            ),
            (
                "rmdir intent",
                encode(&Intent {
                    op: Some(hivefs_proto::OpId { client: 7, seq: 300, done_below: 299 }),
                    step: IntentStep::Rmdir { parent: EntryId::ROOT, name: b"d".to_vec(), id, owner: NodeId(2) },
                }),
                "0107ac02ab0201000001016401020302",
            ),
            (
                "rename intent with a moved file",
                encode(&Intent {
                    op: None,
                    step: IntentStep::Rename {
                        parent: EntryId::ROOT,
                        name: b"a".to_vec(),
                        new_parent: id,
                        new_owner: NodeId(2),
                        new_name: b"b".to_vec(),
                        flags: 1,
                        id,
                        kind: FileKind::File,
                        owner: NodeId(1),
                        moved: Some((file.clone(), vec![(b"user.x".to_vec(), b"1".to_vec())])),
                    },
                }),
                "000200000101610102030201620101020300010100a403e80764f0a204010207040706070001008080040204090000000106757365722e780131",
            ),
        ];
        for (what, got, want) in cases {
            assert_eq!(hex(&got), want, "{what}");
        }
    }

    fn unhex(s: &str) -> Vec<u8> {
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
    }

    /// Makes `path` a format version 1 store holding `inode` (version 1
    /// bytes) under `key`, and an intent when `intent` is set.
    fn make_v1(path: &Path, key: [u8; EntryId::LEN], inode: &[u8], intent: bool) {
        let s = Store::open(path, false).unwrap();
        let txn = s.log.mem.cold.begin_write().unwrap();
        {
            txn.open_table(SYSTEM).unwrap().insert(sys::FORMAT, 1).unwrap();
            txn.open_table(INODES).unwrap().insert(key.as_slice(), inode).unwrap();
            if intent {
                txn.open_table(INTENTS).unwrap().insert([7u8; 16].as_slice(), [0u8].as_slice()).unwrap();
            }
        }
        txn.commit().unwrap();
    }

    #[test]
    fn a_format_1_store_is_migrated_and_one_with_pending_intents_refused() {
        // A directory inode as format version 1 wrote it (the pin above before `mirror`).
        let v1_dir = unhex("01ed0be8076400030207040706070000018080200001030001000001");
        let key = EntryId { node: 1, epoch: 2, counter: 3 }.to_bytes();
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join(DB_FILE);
        make_v1(&path, key, &v1_dir, false);
        let s = Store::open(&path, false).unwrap();
        let txn = s.log.mem.cold.begin_read().unwrap();
        let format = txn.open_table(SYSTEM).unwrap().get(sys::FORMAT).unwrap().unwrap().value();
        assert_eq!(format, FORMAT_VERSION);
        let t = txn.open_table(INODES).unwrap();
        let got: Inode = decode("inode", "x", t.get(key.as_slice()).unwrap().unwrap().value()).unwrap();
        let dp = got.dir_pattern.expect("directory pattern kept");
        assert_eq!((dp.chunk_size, dp.stripe_count, dp.chooser, dp.mirror), (524_288, 0, Chooser::Balanced, false));
        assert_eq!((got.kind, got.mode, got.nlink, got.parent), (FileKind::Dir, 0o2755, 3, Some(EntryId::ROOT)));
        drop((t, txn, s));

        let path = tmp.path().join("pending.redb");
        make_v1(&path, key, &v1_dir, true);
        let e = Store::open(&path, false).err().expect("refused").to_string();
        assert!(e.contains("pending cross-node operations"), "{e}");
    }
}
