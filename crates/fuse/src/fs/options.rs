//! Mount options: what the kernel may cache (cache modes), when reads
//! move access times, and whether POSIX ACLs are enforced.

use super::DIR_ATTR_TTL;
use hivefs_fusewire::FopenFlags;
use std::time::Duration;

/// What the kernel may keep of files' contents (BeeGFS's `tuneFileCacheType`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CacheMode {
    /// Direct I/O: every read and write goes to the storage targets, so
    /// clients see each other's writes as soon as they return.
    #[default]
    Native,
    /// The kernel's page cache: reads are served from it and read ahead,
    /// writes go through to the targets before they return (write-through).
    /// An open drops a file's cached pages unless its ctime, mtime and size
    /// are those of its previous open here, so a client sees what another
    /// left on close (close-to-open, as NFS); a file kept open may show data
    /// older than other clients' writes.
    Paged,
    /// Direct I/O with write-back of small writes in the mount (BeeGFS's
    /// `buffered`): a write returns once it is copied into its file's buffer
    /// here; adjacent writes are merged and sent in the background, several
    /// flushes in flight. Reads through this mount see its own writes (a
    /// read first flushes the file's buffer). Other clients see them once
    /// flushed: at the latest at fsync, close or a lock operation on the
    /// file, when the buffer is full, or `MountOptions::writeback`'s delay
    /// after the write. Errors of a flush are returned by the next write,
    /// fsync or close.
    Buffered,
}

impl std::str::FromStr for CacheMode {
    type Err = String;
    fn from_str(s: &str) -> Result<CacheMode, String> {
        match s {
            "native" => Ok(CacheMode::Native),
            "paged" => Ok(CacheMode::Paged),
            "buffered" => Ok(CacheMode::Buffered),
            _ => Err(format!("unknown cache mode {s:?}: native, paged or buffered")),
        }
    }
}

impl CacheMode {
    /// How a file opened with `flags` is opened for the kernel; `unchanged`:
    /// its ctime, mtime and size are those of its previous open through this mount.
    pub(super) fn open_flags(self, flags: i32, global_locks: bool, unchanged: bool) -> FopenFlags {
        // An append's offset is chosen by the metadata node (global append
        // lock), not by the kernel's idea of the end of file: its data
        // must not go through the page cache at the kernel's offset.
        let append = global_locks && flags & libc::O_APPEND != 0;
        match self {
            // Pages cached before are still valid when no one changed the
            // file since (every closed write, truncation or utime sets its ctime).
            CacheMode::Paged if !append && unchanged => FopenFlags::FOPEN_KEEP_CACHE,
            CacheMode::Paged if !append => FopenFlags::empty(),
            _ => FopenFlags::FOPEN_DIRECT_IO,
        }
    }
}

/// How the kernel's requests reach the mount (mount option `fuse_transport`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FuseTransport {
    /// FUSE over io_uring when the kernel offers it, else `/dev/fuse`.
    #[default]
    Auto,
    /// `read(2)` and `writev(2)` on `/dev/fuse`, whatever the kernel offers.
    Dev,
    /// FUSE over io_uring; `/dev/fuse` (with a warning) when the kernel does
    /// not offer it (Linux 6.14 and later, with the `fuse` module's
    /// `enable_uring` parameter set).
    Uring,
}

impl std::str::FromStr for FuseTransport {
    type Err = String;
    fn from_str(s: &str) -> Result<FuseTransport, String> {
        match s {
            "auto" => Ok(FuseTransport::Auto),
            "dev" => Ok(FuseTransport::Dev),
            "io_uring" | "uring" => Ok(FuseTransport::Uring),
            _ => Err(format!("unknown FUSE transport {s:?}: auto, dev or io_uring")),
        }
    }
}

/// When reads move files' and directories' access times (mount option).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Atime {
    /// Never (the default: see docs/decisions.md, "Access times").
    #[default]
    NoAtime,
    /// Linux's default rule: a read moves the access time when it is not
    /// newer than the modification or change time, or is a day old; checked
    /// at the first read of each open file and directory handle.
    Relatime,
    /// Every read moves it (one request in flight per file, coalescing the
    /// reads that arrive meanwhile; directories once per handle).
    StrictAtime,
}

impl std::str::FromStr for Atime {
    type Err = String;
    fn from_str(s: &str) -> Result<Atime, String> {
        match s {
            "noatime" => Ok(Atime::NoAtime),
            "relatime" => Ok(Atime::Relatime),
            "strictatime" => Ok(Atime::StrictAtime),
            _ => Err(format!("unknown access-time mode {s:?}: noatime, relatime or strictatime")),
        }
    }
}

#[derive(Clone, Debug)]
pub struct MountOptions {
    /// Let every user of the machine use the mount (`allow_other`).
    pub allow_other: bool,
    /// Threads reading `/dev/fuse`; the requests themselves run on the async runtime.
    pub fuse_threads: usize,
    /// How requests travel between the kernel and this mount.
    pub fuse_transport: FuseTransport,
    /// `flock`/`fcntl` locks and O_APPEND writes are coordinated by the
    /// metadata nodes across all clients (`global_file_locks`); `false` leaves
    /// locks to the kernel of this machine and appends at the offset it passes.
    pub global_file_locks: bool,
    /// How long the kernel may use a directory's attributes (mode, owner,
    /// times) without asking again. With `default_permissions` the kernel
    /// checks search permission on every directory of a path and write
    /// permission on the parent of every create and unlink from these
    /// attributes; caching them saves those round trips. Changes made through
    /// this mount are seen at once (the kernel drops a parent's attributes
    /// when it changes an entry in it); changes by other clients after at
    /// most this long. Zero: never cached.
    pub dir_attr_ttl: Duration,
    /// What the kernel may keep of files' contents.
    pub cache_mode: CacheMode,
    /// Cache mode buffered: the size, ranges, flushes in flight and delay
    /// of each file's write-back.
    pub writeback: hivefs_client::writeback::WriteBackLimits,
    /// When reads move access times.
    pub atime: Atime,
    /// POSIX ACLs enforced (`hivefs mount --no-acl` turns it off): the
    /// kernel checks access and default ACLs with the mode bits, new
    /// entries inherit their parent's default ACL on the metadata node, and
    /// the umask is applied there too. Off: the mode bits alone decide (ACL
    /// attributes are still stored, and a chmod still updates them).
    pub acl: bool,
    /// Files created in directories whose names this mount leases are
    /// answered at once and sent to the metadata node in batches (the
    /// client crate's `ahead`).
    pub create_ahead: bool,
}

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions {
            allow_other: true,
            fuse_threads: 2,
            fuse_transport: FuseTransport::Auto,
            global_file_locks: true,
            dir_attr_ttl: DIR_ATTR_TTL,
            cache_mode: CacheMode::Native,
            writeback: Default::default(),
            atime: Atime::NoAtime,
            acl: true,
            create_ahead: true,
        }
    }
}
