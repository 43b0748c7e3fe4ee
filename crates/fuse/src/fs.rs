//! The FUSE request handlers (the `Filesystem` implementation) and the
//! state they share (`Inner`). Beside them: `files` (open files, local
//! sizes, write-back, publishing sizes), `interrupts` (the kernel's
//! interrupts, early answers for callers being killed), `kernel_cache`
//! (lease TTLs and notifications to the kernel), `locks` (global file locks), `options`
//! (mount options and cache modes) and `session` (mounting and serving).

mod files;
mod interrupts;
mod kernel_cache;
mod locks;
mod options;
mod session;

use files::{LocalSize, OpenFile};

pub use options::{Atime, CacheMode, FuseTransport, MountOptions};
pub use session::{check_mountpoint, mount};

use crate::errno::errno;
use crate::inodes::{Inodes, ROOT_INO};
use fuser::{InitFlags, KernelConfig, MountOption, SessionACL};
use hivefs_client::writeback::{WriteBack, WriteBackBudget, WriteBackLimits};
use hivefs_client::{quota, Client, Ent, Revocation};
use hivefs_fusewire::{
    serve_dev, serve_uring, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    LockOwner, OpenFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyLock,
    ReplyLseek, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, UringConfig, UringQueues,
};
use hivefs_proto::{Caller, DirEntry, FileLock, HeldSize, LockKind, XATTR_ACL_KILL_SGID};
use hivefs_types::acl;
use hivefs_types::attr::{EntryAttr, FileKind, SetAttr, SetTime, Timespec};
use hivefs_types::error::{ErrorCode, FsError, FsResult};
use hivefs_types::ids::{EntryId, PoolId};
use hivefs_types::pattern::Pattern;
use std::collections::{HashMap, HashSet, VecDeque};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tracing::{debug, info, warn};

/// How long the kernel may trust a name → inode mapping without a lease on
/// the name (with one: while the lease lasts, see `Inner::with_ttl`).
const ENTRY_TTL: Duration = Duration::from_secs(1);
/// Attributes of files are cached by the kernel only while the metadata
/// node's lease on them lasts (it revokes the lease before anyone else's
/// change is acknowledged), so every `stat` sees the size and times other
/// clients left on close. Without a lease, and while this mount has the
/// file open for writing, they are not cached at all.
/// Directories' attributes are cached for `MountOptions::dir_attr_ttl`.
const ATTR_TTL: Duration = Duration::ZERO;
/// Default of `MountOptions::dir_attr_ttl`.
pub const DIR_ATTR_TTL: Duration = Duration::from_secs(1);
const READDIR_PAGE: u32 = 512;
const MAX_IO: u32 = 1 << 20;
/// Files whose version at open cache mode `paged` remembers.
const OPENED_VERSIONS_MAX: usize = 100_000;
/// The extended attribute holding a file's capabilities. The kernel asks for
/// it before every write through the page cache (to drop capabilities on
/// write). While a file is open for writing here, a paged mount answers from
/// [`LocalSize::caps`], fetched on the first ask after each open for writing
/// and forgotten on any change through this mount: one metadata request per
/// open instead of one per write. That fits the mode's close-to-open promise:
/// capabilities another client sets on a file this client keeps open for
/// writing are seen at its next open.
const CAPS_XATTR: &[u8] = b"security.capability";

struct DirHandle {
    ent: Ent,
    /// Offset the next entry in `buf` will get.
    next_off: u64,
    after: Option<Vec<u8>>,
    buf: VecDeque<DirEntry>,
    more: bool,
    /// The access time was reported for this handle.
    atime_sent: bool,
    /// The directory's parent, from the listing's first page (for `..`).
    parent: Option<EntryId>,
}

struct Inner {
    client: Arc<Client>,
    inodes: Mutex<Inodes>,
    files: Mutex<HashMap<u64, Arc<OpenFile>>>,
    dirs: Mutex<HashMap<u64, Arc<tokio::sync::Mutex<DirHandle>>>>,
    local_sizes: Mutex<HashMap<EntryId, LocalSize>>,
    next_fh: AtomicU64,
    global_locks: bool,
    dir_attr_ttl: Duration,
    cache_mode: CacheMode,
    /// Cache mode buffered: how much each file's write-back holds.
    writeback: WriteBackLimits,
    /// Cache mode buffered: what all files' write-back holds together.
    writeback_budget: Arc<WriteBackBudget>,
    atime: Atime,
    /// The mount option: POSIX ACLs enforced.
    acl_wanted: bool,
    /// The kernel enforces ACLs and leaves the umask to the file system
    /// (`FUSE_POSIX_ACL` and `FUSE_DONT_MASK` granted at init): creates send
    /// the umask with the caller (see `Caller::umask`).
    acl: std::sync::atomic::AtomicBool,
    /// Cache mode paged: (ctime, mtime, size) of each file at its last open
    /// (a closed write, a truncation or a utime by anyone changes ctime).
    opened_versions: Mutex<HashMap<EntryId, (Timespec, Timespec, u64)>>,
    /// Files with a handle being released (out of `files`, its held size
    /// not yet owed to the metadata node), and a bell for the end of each.
    releasing: (Mutex<HashMap<EntryId, u32>>, tokio::sync::Notify),
    /// Files this mount has set global locks on: closing them drops the
    /// closing owner's locks at the metadata node.
    locked: Mutex<HashSet<EntryId>>,
    /// Requests that may wait (lock waits, and those `run_killable!`
    /// answers early for a caller being killed), by FUSE request, for the
    /// kernel's interrupts of them.
    waits: Mutex<interrupts::Waits>,
    /// Tells the kernel to drop cached attributes (set once mounted).
    notifier: std::sync::OnceLock<fuser::Notifier>,
    /// The session's `/dev/fuse`, for `FUSE_NOTIFY_INC_EPOCH`; `None` when
    /// the kernel does not take it (names then are not leased).
    epoch_fd: std::sync::OnceLock<std::fs::File>,
    /// Unmounts the session (set once mounted; used when it ends).
    unmounter: std::sync::OnceLock<Mutex<fuser::SessionUnmounter>>,
    /// The runtime requests run on (for background work started on a FUSE thread).
    rt: tokio::runtime::Handle,
}

pub struct HiveFs {
    inner: Arc<Inner>,
}

fn ts_to_system(t: Timespec) -> SystemTime {
    if t.sec >= 0 {
        UNIX_EPOCH + Duration::new(t.sec as u64, t.nsec)
    } else {
        UNIX_EPOCH - Duration::from_secs(t.sec.unsigned_abs()) + Duration::from_nanos(u64::from(t.nsec))
    }
}

fn system_to_ts(t: SystemTime) -> Timespec {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => Timespec { sec: d.as_secs() as i64, nsec: d.subsec_nanos() },
        Err(e) => {
            let d = e.duration();
            Timespec { sec: -(d.as_secs() as i64), nsec: 0 }
        }
    }
}

fn file_type(k: FileKind) -> FileType {
    match k {
        FileKind::File => FileType::RegularFile,
        FileKind::Dir => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
        FileKind::Fifo => FileType::NamedPipe,
        FileKind::Socket => FileType::Socket,
        FileKind::CharDev => FileType::CharDevice,
        FileKind::BlockDev => FileType::BlockDevice,
    }
}

/// Whether a write or truncation by an unprivileged user must clear
/// set-user-id / set-group-id (sgid only with group execute, as Linux).
fn kills_privs(mode: u32) -> bool {
    mode & 0o4000 != 0 || mode & 0o2010 == 0o2010
}

fn without_privs(mode: u32) -> u32 {
    let mut m = mode & 0o7777 & !0o4000;
    if m & 0o2010 == 0o2010 {
        m &= !0o2000;
    }
    m
}

/// The caller's group and supplementary groups (FUSE passes only the
/// first): from `/proc/PID/status`, or the group alone when that is gone.
fn caller_groups(req: &Request) -> Vec<u32> {
    groups_of(req.pid(), req.gid())
}

/// Process `pid`'s groups, `gid` (its file-system group) first.
fn groups_of(pid: u32, gid: u32) -> Vec<u32> {
    let mut groups = vec![gid];
    if let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/status")) {
        if let Some(l) = s.lines().find_map(|l| l.strip_prefix("Groups:")) {
            groups.extend(l.split_whitespace().filter_map(|g| g.parse::<u32>().ok()));
        }
    }
    groups
}

fn caller(req: &Request) -> Caller {
    Caller::new(req.uid(), req.gid())
}

impl Inner {
    /// The caller of a create: with ACLs on, the kernel passed the mode
    /// unmasked, and the umask goes to the metadata node, which applies it
    /// unless the parent has a default ACL.
    fn creator(&self, req: &Request, umask: u32) -> Caller {
        let umask = self.acl.load(std::sync::atomic::Ordering::Relaxed).then_some(umask & 0o777);
        Caller { umask, ..caller(req) }
    }

    /// The mode a create sends: masked here when the metadata node does not
    /// apply the umask (without ACLs the kernel has already masked it).
    fn create_mode(&self, mode: u32, umask: u32) -> u32 {
        if self.acl.load(std::sync::atomic::Ordering::Relaxed) {
            mode & 0o7777
        } else {
            mode & !umask & 0o7777
        }
    }
}

fn stale(ino: u64) -> FsError {
    FsError::new(ErrorCode::NotFound, format!("inode {ino} is not known to this mount"))
}

impl Inner {
    fn ent(&self, ino: INodeNo) -> FsResult<Ent> {
        self.inodes.lock().expect("inodes").get(ino.0).ok_or_else(|| stale(ino.0))
    }

    /// Runs `op` on the entry behind `ino`. A file's inode moves with a
    /// rename to another metadata node; when another client moved it, the
    /// node this mount knows answers "not found": then the entry is found
    /// again by its id and `op` runs once more there (nothing was applied
    /// on the refusing node).
    async fn on_ent<T, F, Fut>(&self, ino: INodeNo, op: F) -> FsResult<T>
    where
        F: Fn(Ent) -> Fut,
        Fut: std::future::Future<Output = FsResult<T>>,
    {
        let e = self.ent(ino)?;
        match op(e).await {
            Err(err) if err.code == ErrorCode::NotFound && !e.id.is_root() => {
                let Ok(found) = self.client.locate(e.id).await.map(|a| Ent::from(&a)) else { return Err(err) };
                if found.owner == e.owner {
                    return Err(err);
                }
                debug!("{} moved from metadata node {} to {}", e.id, e.owner, found.owner);
                self.inodes.lock().expect("inodes").update(found);
                op(found).await
            }
            r => r,
        }
    }

    /// `r`, or, when the metadata node no longer has the directory `ino`
    /// (removed while this mount's kernel holds it open or as a current
    /// directory), its last attributes with no links, changed by `change`.
    /// They are this mount's alone: nobody else can name the directory.
    fn or_removed_dir(
        &self,
        ino: INodeNo,
        r: FsResult<EntryAttr>,
        change: impl FnOnce(&mut EntryAttr),
    ) -> FsResult<EntryAttr> {
        match r {
            Err(e) if e.code == ErrorCode::NotFound => {
                self.inodes.lock().expect("inodes").removed_dir(ino.0, change).ok_or(e)
            }
            r => r,
        }
    }

    fn to_attr(&self, ino: u64, a: &EntryAttr) -> FileAttr {
        if a.kind == FileKind::Dir {
            self.inodes.lock().expect("inodes").shown(ino, a);
        }
        let (mut size, mut mtime, mut ctime) = (a.size, a.mtime, a.ctime);
        if a.kind == FileKind::File {
            if let Some(l) = self.local_sizes.lock().expect("sizes").get(&a.id) {
                size = size.max(l.size);
                if let Some(t) = l.mtime {
                    mtime = mtime.max(t);
                    ctime = ctime.max(t);
                }
            }
            // Released here with a size the metadata node has not taken yet.
            if let Some(o) = self.client.owed_size(a.id) {
                size = size.max(o.size);
                mtime = mtime.max(o.mtime);
                ctime = ctime.max(o.mtime);
            }
        }
        FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            atime: ts_to_system(a.atime),
            mtime: ts_to_system(mtime),
            ctime: ts_to_system(ctime),
            kind: file_type(a.kind),
            perm: (a.mode & 0o7777) as u16,
            nlink: a.nlink,
            uid: a.uid,
            gid: a.gid,
            rdev: a.rdev,
            blksize: a.pattern.as_ref().map(|p| p.chunk_size()).unwrap_or(512 << 10),
        }
    }

    /// Registers a new kernel reference for `a` and builds its attributes.
    fn entry_reply(&self, a: &EntryAttr) -> FileAttr {
        let ino = self.inodes.lock().expect("inodes").remember(Ent::from(a));
        self.to_attr(ino, a)
    }

    /// Releases handle `fh` at once when its close has nothing to send or
    /// wait for ([`Inner::quiet_close`], and no lock owner or kept append
    /// lock to let go); the metadata node hears of it in the background
    /// as always. False, leaving the handle, otherwise.
    fn quiet_release(&self, fh: FileHandle) -> bool {
        let Ok(f) = self.file(fh) else { return false };
        if !f.lock_owners.lock().expect("lock owners").is_empty()
            || self.client.keeps_append(f.ent.id)
            || !self.quiet_close(&f)
            // A change answered early is still running.
            || f.changing.try_write().is_err()
        {
            return false;
        }
        self.release_begins(f.ent.id);
        self.files.lock().expect("files").remove(&fh.0);
        self.forget_locked(f.ent.id);
        // The first release starts the sending task on the runtime.
        let _rt = self.rt.enter();
        self.handle_gone(&f);
        self.release_ends(f.ent.id);
        true
    }

    /// A handle of `id` leaves `files`: until [`Inner::release_ends`],
    /// [`Inner::wait_releases`] waits for it.
    fn release_begins(&self, id: EntryId) {
        *self.releasing.0.lock().expect("releasing").entry(id).or_default() += 1;
    }

    fn release_ends(&self, id: EntryId) {
        let mut m = self.releasing.0.lock().expect("releasing");
        if let Some(n) = m.get_mut(&id) {
            *n -= 1;
            if *n == 0 {
                m.remove(&id);
            }
        }
        self.releasing.1.notify_waiters();
    }

    /// Waits until no handle of `id` (of any file: `None`) is between
    /// leaving `files` and owing its held size (`Client::wait_owed` then
    /// covers it): a close returns before its release is handled.
    pub(super) async fn wait_releases(&self, id: Option<EntryId>) {
        loop {
            let done = self.releasing.1.notified();
            {
                let m = self.releasing.0.lock().expect("releasing");
                if id.map_or(m.is_empty(), |id| !m.contains_key(&id)) {
                    return;
                }
            }
            done.await;
        }
    }

    /// The last step of a release: the file has one writer less here, and
    /// the metadata node hears of the release in the background (batched
    /// with others).
    fn handle_gone(&self, f: &OpenFile) {
        let held = f.held.load(Ordering::Acquire).then(|| self.held_size(f));
        if f.write {
            self.drop_writer(f.ent.id);
        }
        match held {
            Some(size) => self.client.release_held_later(f.ent, size.map(|s| (s, &f.pattern))),
            None => self.client.release_later(f.ent.id, f.ent.owner),
        }
    }

    fn new_fh(&self) -> u64 {
        self.next_fh.fetch_add(1, Ordering::Relaxed)
    }

    async fn fill_dir(&self, h: &mut DirHandle) -> FsResult<()> {
        if h.buf.is_empty() && h.more {
            let (entries, more) = match &h.after {
                None => {
                    let (parent, entries, more) = self.client.readdir_first(h.ent, READDIR_PAGE).await?;
                    h.parent = Some(parent);
                    (entries, more)
                }
                after => self.client.readdir(h.ent, after.clone(), READDIR_PAGE).await?,
            };
            if let Some(last) = entries.last() {
                h.after = Some(last.name.clone());
            }
            h.more = more && !entries.is_empty();
            h.buf.extend(entries);
        }
        Ok(())
    }
}

macro_rules! run {
    ($self:ident, $reply:ident, |$inner:ident| $body:block) => {{
        let $inner = $self.inner.clone();
        crate::lazy::start(&$self.inner.rt, async move {
            let res: FsResult<_> = async move $body.await;
            match res {
                Ok(respond) => respond($reply),
                Err(e) => {
                    debug!("request failed: {e}");
                    $reply.error(errno(&e));
                }
            }
        });
    }};
}

/// [`run!`] for a request whose answer carries nothing the kernel keeps
/// (no inode, no handle): answered `EINTR` at once when its caller is being
/// killed while the handler waits, the handler running on
/// (`interrupts::killable`).
macro_rules! run_killable {
    ($self:ident, $req:ident, $reply:ident, |$inner:ident| $body:block) => {{
        let $inner = $self.inner.clone();
        let me = $self.inner.clone();
        let (unique, pid) = ($req.unique(), $req.pid());
        crate::lazy::start(&$self.inner.rt, async move {
            let early = || $reply.interrupter();
            let res: FsResult<_> = interrupts::killable(&me, unique, pid, early, async move $body).await;
            match res {
                Ok(respond) => respond($reply),
                Err(e) => {
                    debug!("request failed: {e}");
                    $reply.error(errno(&e));
                }
            }
        });
    }};
}

fn name_bytes(n: &OsStr) -> Vec<u8> {
    n.as_bytes().to_vec()
}

fn settime(t: Option<TimeOrNow>) -> Option<SetTime> {
    t.map(|t| match t {
        TimeOrNow::Now => SetTime::Now,
        TimeOrNow::SpecificTime(s) => SetTime::At(system_to_ts(s)),
    })
}

impl Filesystem for HiveFs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        // A name this mount knows does not exist (it holds the lease on the
        // directory's names): answered here, no request, as for a create's lookup.
        let absent = |p: Ent| name != "." && name != ".." && self.inner.client.known_absent(p.id, name.as_bytes());
        if self.inner.ent(parent).is_ok_and(absent) {
            return reply.error(Errno::ENOENT);
        }
        let name = name_bytes(name);
        run!(self, reply, |inner| {
            let p = match inner.ent(parent) {
                Ok(p) => p,
                // A file handle of an inode the kernel forgot: it asks for
                // "." (and ".." of directories) of the handle's number.
                Err(e) => match EntryId::from_ino(parent.0) {
                    Some(id) if name == b"." || name == b".." => Ent::from(&inner.client.locate(id).await?),
                    _ => return Err(e),
                },
            };
            // "." is the directory itself, and no name to cache.
            let dot = name == b".";
            let a = if dot { inner.client.getattr(p).await? } else { inner.client.lookup(p, &name).await? };
            Ok(move |reply: ReplyEntry| inner.send_entry(reply, &a, (!dot).then_some((p.id, name.as_slice()))))
        })
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.inner.inodes.lock().expect("inodes").forget(ino.0, nlookup);
    }

    fn interrupt(&self, _req: &Request, unique: u64) {
        self.inner.waits.lock().expect("interrupt waits").interrupt(unique);
    }

    fn getattr(&self, req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        run_killable!(self, req, reply, |inner| {
            let e = inner.ent(ino)?;
            // A directory this mount just changed: its attributes came with
            // the change's answer (for the rest of the directory TTL).
            // A file this mount just changed (its size reported on close):
            // the answer's attributes, while their lease lasts.
            let (a, cached) = match inner.client.cached_dir_attr(e.id) {
                Some((a, left)) => (a, Some(left)),
                None => match inner.client.leased_attr(e.id) {
                    Some(a) => (a, None),
                    None => {
                        (inner.or_removed_dir(ino, inner.on_ent(ino, |e| inner.client.getattr(e)).await, |_| {})?, None)
                    }
                },
            };
            Ok(move |reply: ReplyAttr| match cached {
                Some(left) => reply.attr(&left, &inner.to_attr(ino.0, &a)),
                None => inner.send_attr(reply, ino, &a),
            })
        })
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _fh: Option<FileHandle>,
        reply: ReplyAttr,
    ) {
        let set =
            SetAttr { mode: mode.map(|m| m & 0o7777), uid, gid, size, atime: settime(atime), mtime: settime(mtime) };
        let c = caller(req);
        run!(self, reply, |inner| {
            if let Some(s) = set.size {
                inner.check_truncate(ino, s).await?;
                // Buffered writes land first, or they would land beyond the new end.
                inner.settle_ino(ino).await?;
                if let Ok(e) = inner.ent(ino) {
                    inner.client.note_other_write(e.id);
                    // A size released here and still on its way would land over the new one.
                    inner.wait_releases(Some(e.id)).await;
                    inner.client.wait_owed(e.id).await;
                }
            }
            if matches!(set.mtime, Some(SetTime::At(_))) {
                // A size published later would stamp its own time over this one (`cp -a`
                // sets the source's times with futimens before it closes the copy): the
                // writes so far are published first.
                inner.publish_before_times(ino).await?;
            }
            let r = inner.on_ent(ino, |e| inner.client.setattr(e, set.clone(), c)).await;
            let a = inner.or_removed_dir(ino, r, |d| {
                let now = system_to_ts(SystemTime::now());
                let at = |t: &SetTime| match t {
                    SetTime::Now => now,
                    SetTime::At(t) => *t,
                };
                d.mode = set.mode.unwrap_or(d.mode);
                d.uid = set.uid.unwrap_or(d.uid);
                d.gid = set.gid.unwrap_or(d.gid);
                d.atime = set.atime.as_ref().map_or(d.atime, at);
                d.mtime = set.mtime.as_ref().map_or(d.mtime, at);
                d.ctime = now;
            })?;
            if let Some(s) = size {
                inner.set_local_size(a.id, s);
            }
            if set.mtime.is_some() {
                inner.times_set(a.id);
            }
            Ok(move |reply: ReplyAttr| inner.send_attr(reply, ino, &a))
        })
    }

    fn readlink(&self, req: &Request, ino: INodeNo, reply: ReplyData) {
        run_killable!(self, req, reply, |inner| {
            let t = inner.on_ent(ino, |e| inner.client.readlink(e)).await?;
            Ok(move |reply: ReplyData| reply.data(&t))
        })
    }

    fn mknod(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, rdev: u32, reply: ReplyEntry) {
        let name = name_bytes(name);
        let (c, m) = (self.inner.creator(req, umask), self.inner.create_mode(mode, umask));
        run!(self, reply, |inner| {
            let kind = FileKind::from_mode(mode).ok_or_else(|| {
                FsError::new(ErrorCode::Invalid, format!("mknod: unknown file type in mode {mode:o}"))
            })?;
            let p = inner.ent(parent)?;
            let a = inner.client.create(p, &name, kind, m, rdev, true, c).await?;
            Ok(move |reply: ReplyEntry| inner.send_entry(reply, &a, Some((p.id, &name))))
        })
    }

    fn mkdir(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
        let name = name_bytes(name);
        let (c, m) = (self.inner.creator(req, umask), self.inner.create_mode(mode, umask));
        run!(self, reply, |inner| {
            let p = inner.ent(parent)?;
            let a = inner.client.mkdir(p, &name, m, c).await?;
            Ok(move |reply: ReplyEntry| inner.send_entry(reply, &a, Some((p.id, &name))))
        })
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let name = name_bytes(name);
        run!(self, reply, |inner| {
            inner.client.unlink(inner.ent(parent)?, &name).await?;
            Ok(move |reply: ReplyEmpty| reply.ok())
        })
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let name = name_bytes(name);
        run!(self, reply, |inner| {
            inner.client.rmdir(inner.ent(parent)?, &name).await?;
            Ok(move |reply: ReplyEmpty| reply.ok())
        })
    }

    fn symlink(&self, req: &Request, parent: INodeNo, link_name: &OsStr, target: &Path, reply: ReplyEntry) {
        let name = name_bytes(link_name);
        let target = target.as_os_str().as_bytes().to_vec();
        let c = caller(req);
        run!(self, reply, |inner| {
            let p = inner.ent(parent)?;
            let a = inner.client.symlink(p, &name, &target, c).await?;
            Ok(move |reply: ReplyEntry| inner.send_entry(reply, &a, Some((p.id, &name))))
        })
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: u32,
        reply: ReplyEmpty,
    ) {
        let (name, newname) = (name_bytes(name), name_bytes(newname));
        run!(self, reply, |inner| {
            let (p, np) = (inner.ent(parent)?, inner.ent(newparent)?);
            if p.owner != np.owner {
                // A file's inode moves as it is: sizes released here land first.
                inner.wait_releases(None).await;
                inner.client.wait_owed_now().await;
            }
            inner.client.rename(p, &name, np, &newname, flags).await?;
            if p.owner != np.owner {
                // A file's inode moved to the new parent's metadata node.
                if let Ok(a) = inner.client.lookup(np, &newname).await {
                    inner.inodes.lock().expect("inodes").update(Ent::from(&a));
                }
            }
            Ok(move |reply: ReplyEmpty| reply.ok())
        })
    }

    fn link(&self, _req: &Request, ino: INodeNo, newparent: INodeNo, newname: &OsStr, reply: ReplyEntry) {
        let newname = name_bytes(newname);
        run!(self, reply, |inner| {
            let np = inner.ent(newparent)?;
            if inner.ent(ino).is_ok_and(|e| e.owner != np.owner) {
                // The inode may move to the new name's node: its released size lands first.
                inner.wait_releases(None).await;
                inner.client.wait_owed_now().await;
            }
            let a = inner.on_ent(ino, |e| inner.client.link(e, np, &newname)).await?;
            Ok(move |reply: ReplyEntry| inner.send_entry(reply, &a, Some((np.id, &newname))))
        })
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let c = caller(req);
        run!(self, reply, |inner| {
            let (fh, f) = inner.on_ent(ino, |e| inner.open_file(e, flags.0, c)).await?;
            let open_flags = inner.cache_mode.open_flags(flags.0, inner.global_locks, f.unchanged);
            Ok(move |reply: ReplyOpen| reply.opened(FileHandle(fh), open_flags))
        })
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let name = name_bytes(name);
        let (c, m) = (self.inner.creator(req, umask), self.inner.create_mode(mode, umask));
        let pid = req.pid();
        run!(self, reply, |inner| {
            let p = inner.ent(parent)?;
            let excl = flags & libc::O_EXCL != 0;
            // Made ahead where this mount leases the directory's names: no
            // request now, and name and attributes cached while that lease lasts.
            let ahead = inner.client.create_ahead(p, &name, m, c);
            // One request creates the file and counts the open. Always
            // exclusive: the kernel takes whatever this answers as a file
            // the call created, and checks neither permissions nor O_TRUNC.
            let mut tries = 0;
            let ((a, held), created) = loop {
                if let Some((a, _)) = &ahead {
                    break ((a.clone(), true), true);
                }
                tries += 1;
                match inner.client.create_open_held(p, &name, m, true, c).await {
                    Ok(a) => break (a, true),
                    // The name appeared after the kernel's lookup (another client
                    // made it): opened here as open(2) opens an existing file,
                    // or created again if it went away meanwhile.
                    Err(e) if !excl && e.code == ErrorCode::Exists => {
                        match inner.open_existing(p, &name, flags, c, pid).await {
                            Err(e) if e.code == ErrorCode::NotFound && tries < 8 => continue,
                            r => break ((r?, false), false),
                        }
                    }
                    Err(e) => return Err(e),
                }
            };
            let ent = Ent::from(&a);
            // A file this call created needs no truncation (nor the time update of O_TRUNC).
            let flags = if created { flags & !libc::O_TRUNC } else { flags };
            let (fh, f) = inner.opened(ent, a.clone(), flags, c).await?;
            f.held.store(held, Ordering::Release);
            if created {
                // A file this call created has no capabilities.
                inner.remember_caps(ent.id, None);
            }
            let open_flags = inner.cache_mode.open_flags(flags, inner.global_locks, f.unchanged);
            Ok(move |reply: ReplyCreate| {
                // `created` has one TTL for the name and the attributes. The
                // handle writes, but the kernel drops size and times at each
                // of its own writes; an existing file's (O_TRUNC) are not
                // cached.
                let leased = created;
                inner.client.with_leases(a.id, Some((p.id, &name)), |attrs, name_left| {
                    let ttl = match ahead {
                        Some((_, left)) => {
                            let left = left.saturating_sub(Duration::from_millis(100));
                            left.min(inner.entry_ttl(left))
                        }
                        None if leased => attrs.min(inner.entry_ttl(name_left)),
                        None => ATTR_TTL,
                    };
                    reply.created(&ttl, &inner.entry_reply(&a), Generation(0), FileHandle(fh), open_flags)
                })
            })
        })
    }

    fn read(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        // Chunk files held here and cached: answered on this thread (unless
        // this mount's buffered writes to the file must land first).
        if let Ok(f) = self.inner.file(fh) {
            let pending = self.inner.write_back(f.ent.id).is_some_and(|wb| !wb.is_clean());
            let now =
                if pending { None } else { self.inner.client.read_now(&f.pattern, f.ent.id, offset, size as usize) };
            if let Some(data) = now {
                self.inner.note_read(&f);
                return reply.data(&data);
            }
        }
        run_killable!(self, req, reply, |inner| {
            let f = inner.file(fh)?;
            inner.settle(f.ent.id).await?;
            let hint = inner.local_sizes.lock().expect("sizes").get(&f.ent.id).map(|l| l.size).unwrap_or(0);
            let data = inner.client.read(&f.pattern, f.ent.id, offset, size as usize, hint).await?;
            inner.note_read(&f);
            Ok(move |reply: ReplyData| reply.data(&data))
        })
    }

    fn write(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: u32,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let c = caller(req);
        if let Ok(f) = self.inner.file(fh) {
            if let Err(e) = self.inner.check_quota(f.ent.id, offset + data.len() as u64) {
                debug!("write refused: {e}");
                return reply.error(errno(&e));
            }
            // Chunk files held here: written on this thread, unless the write
            // must first drop suid/sgid or is an append the metadata node places.
            let append = self.inner.global_locks && flags.0 & libc::O_APPEND != 0;
            let privs_kept = c.uid == 0 || !f.kill_privs.load(Ordering::Acquire);
            if append && privs_kept && self.inner.write_back(f.ent.id).is_none_or(|wb| wb.is_clean()) {
                // On the append lock this mount keeps, at the end it knows.
                if let Some(r) = self.inner.client.append_now(f.ent.id, &f.pattern, data) {
                    f.dirty.store(true, Ordering::Release);
                    return match r {
                        Ok(at) => {
                            self.inner.note_write(f.ent.id, at + data.len() as u64);
                            reply.written(data.len() as u32)
                        }
                        Err(e) => {
                            debug!("append failed: {e}");
                            self.inner.size_unsure(f.ent.id);
                            reply.error(errno(&e))
                        }
                    };
                }
            }
            if !append && privs_kept {
                let wb = self.inner.write_back(f.ent.id);
                // Held chunk files are written directly unless buffered writes
                // are pending (which must not land on top of this one later).
                let direct = wb.as_ref().is_none_or(|wb| wb.is_clean());
                let now = if direct { self.inner.client.write_now(&f.pattern, f.ent.id, offset, data) } else { None };
                if let (None, Some(wb)) = (&now, &wb) {
                    if let Some(r) = wb.try_write(offset, data) {
                        f.dirty.store(true, Ordering::Release);
                        self.inner.client.note_other_write(f.ent.id);
                        return match r {
                            Ok(()) => {
                                self.inner.note_write(f.ent.id, offset + data.len() as u64);
                                reply.written(data.len() as u32)
                            }
                            Err(e) => {
                                debug!("buffered write failed: {e}");
                                self.inner.size_unsure(f.ent.id);
                                reply.error(errno(&e))
                            }
                        };
                    }
                }
                if let Some(r) = now {
                    f.dirty.store(true, Ordering::Release);
                    self.inner.client.note_other_write(f.ent.id);
                    return match r {
                        Ok(n) => {
                            self.inner.note_write(f.ent.id, offset + n as u64);
                            reply.written(n as u32)
                        }
                        Err(e) => {
                            debug!("request failed: {e}");
                            self.inner.size_unsure(f.ent.id);
                            reply.error(errno(&e))
                        }
                    };
                }
            }
        }
        // The one copy of the data: out of the request's buffer; what goes to the
        // targets are slices of it.
        let data = bytes::Bytes::from(data.to_vec());
        run_killable!(self, req, reply, |inner| {
            let f = inner.file(fh)?;
            let _changing = f.changing.read().await;
            if c.uid != 0 && f.kill_privs.swap(false, Ordering::AcqRel) {
                // A write without CAP_FSETID drops suid/sgid first (as Linux's file_remove_privs).
                let a = inner.client.getattr(f.ent).await?;
                if kills_privs(a.mode) {
                    let set = SetAttr { mode: Some(without_privs(a.mode)), ..Default::default() };
                    inner.client.setattr(f.ent, set, c).await?;
                }
            }
            // O_APPEND: the kernel's offset is its idea of the end of file,
            // stale when another client appended; append at the real end.
            let append = inner.global_locks && flags.0 & libc::O_APPEND != 0;
            let wb = inner.write_back(f.ent.id);
            let written = if append {
                // After this mount's buffered writes: the end is read off the targets.
                inner.settle(f.ent.id).await?;
                inner.client.append(f.ent, &f.pattern, &data).await.map(|o| (o, data.len()))
            } else if let Some(wb) = wb {
                inner.client.note_other_write(f.ent.id);
                wb.write(offset, &data).await.map(|()| (offset, data.len()))
            } else {
                inner.client.note_other_write(f.ent.id);
                inner.client.write_bytes(&f.pattern, f.ent.id, offset, data).await.map(|n| (offset, n))
            };
            // Even a failed write may have grown a chunk file: publish.
            f.dirty.store(true, Ordering::Release);
            if written.is_err() {
                inner.size_unsure(f.ent.id);
            }
            let (offset, n) = written?;
            inner.note_write(f.ent.id, offset + n as u64);
            Ok(move |reply: ReplyWrite| reply.written(n as u32))
        })
    }

    fn flush(&self, req: &Request, _ino: INodeNo, fh: FileHandle, lock_owner: LockOwner, reply: ReplyEmpty) {
        // A file made ahead closes once it is on its metadata node (see the client's `ahead`).
        let ahead = |f: &OpenFile| self.inner.client.ahead_pending(f.ent.id);
        if self.inner.file(fh).is_ok_and(|f| !ahead(&f) && self.inner.quiet_close(&f)) {
            return reply.ok();
        }
        run_killable!(self, req, reply, |inner| {
            let f = inner.file(fh)?;
            let landed = inner.client.ahead_file_landed(f.ent.id).await;
            // Buffered writes land before the locks go (whoever takes them next sees them).
            let settled = inner.settle(f.ent.id).await;
            // A close drops the closing process's fcntl locks on the file (POSIX).
            inner.drop_locks(f.ent, lock_owner, LockKind::Posix).await;
            landed?;
            settled?;
            if !f.held.load(Ordering::Acquire) {
                inner.publish_size(&f).await?;
            }
            Ok(move |reply: ReplyEmpty| reply.ok())
        })
    }

    fn fsync(&self, req: &Request, _ino: INodeNo, fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        run_killable!(self, req, reply, |inner| {
            let f = inner.file(fh)?;
            // A file made ahead is on its metadata node first.
            inner.client.ahead_file_landed(f.ent.id).await?;
            inner.settle(f.ent.id).await?;
            inner.client.fsync(&f.pattern, f.ent.id).await?;
            inner.publish_size(&f).await?;
            Ok(move |reply: ReplyEmpty| reply.ok())
        })
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        if self.inner.quiet_release(fh) {
            return reply.ok();
        }
        run!(self, reply, |inner| {
            let f = {
                let mut files = inner.files.lock().expect("files");
                let f = files.remove(&fh.0);
                if let Some(f) = &f {
                    inner.release_begins(f.ent.id);
                }
                f
            };
            if let Some(f) = f {
                let _ends = ReleaseEnds(&inner, f.ent.id);
                // After any change through this handle still running (`OpenFile::changing`).
                drop(f.changing.write().await);
                // The last close of an open file description drops its flock
                // and OFD locks. Every process that locked through it closed
                // it before (each close drops the closer's fcntl locks), so
                // no other owner's lock goes with them.
                let mut owners = std::mem::take(&mut *f.lock_owners.lock().expect("lock owners"));
                // The kernel names the owner of the description's flock.
                if let Some(o) = lock_owner.map(|o| (o.0, LockKind::Flock)) {
                    if !owners.contains(&o) {
                        owners.push(o);
                    }
                }
                for (owner, kind) in owners {
                    inner.drop_locks(f.ent, LockOwner(owner), kind).await;
                }
                inner.forget_locked(f.ent.id);
                if inner.client.keeps_append(f.ent.id)
                    && !inner.files.lock().expect("files").values().any(|o| o.ent.id == f.ent.id)
                {
                    // The last handle here: other clients need not wait for the kept lock to run out.
                    inner.client.let_go_append(f.ent).await;
                }
                // A handle holding the size reports it with the release,
                // after its buffered writes (the size is theirs too).
                let r = if f.held.load(Ordering::Acquire) {
                    let settled = inner.settle(f.ent.id).await;
                    if settled.is_err() {
                        inner.size_unsure(f.ent.id);
                    }
                    settled
                } else {
                    inner.publish_size(&f).await
                };
                inner.handle_gone(&f);
                r?;
            }
            Ok(move |reply: ReplyEmpty| reply.ok())
        })
    }

    fn getlk(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        flock: bool,
        reply: ReplyLock,
    ) {
        let l = locks::KernelLock { owner: lock_owner, start, end, typ, pid, flock };
        locks::getlk(self, ino, l, reply)
    }

    fn setlk(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        flock: bool,
        sleep: bool,
        reply: ReplyEmpty,
    ) {
        if typ != libc::F_UNLCK {
            if let Ok(f) = self.inner.file(fh) {
                let mut owners = f.lock_owners.lock().expect("lock owners");
                let o = (lock_owner.0, if flock { LockKind::Flock } else { LockKind::Posix });
                if !owners.contains(&o) {
                    owners.push(o);
                }
            }
        }
        let l = locks::KernelLock { owner: lock_owner, start, end, typ, pid, flock };
        locks::setlk(self, req, ino, l, sleep, reply)
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.inner.ent(ino) {
            Ok(ent) => {
                let fh = self.inner.new_fh();
                let h = DirHandle {
                    ent,
                    next_off: 3,
                    after: None,
                    buf: VecDeque::new(),
                    more: true,
                    atime_sent: false,
                    parent: None,
                };
                self.inner.dirs.lock().expect("dirs").insert(fh, Arc::new(tokio::sync::Mutex::new(h)));
                reply.opened(FileHandle(fh), FopenFlags::empty());
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let inner = self.inner.clone();
        crate::lazy::start(&self.inner.rt, async move {
            let r: FsResult<()> = async {
                let h = inner.dirs.lock().expect("dirs").get(&fh.0).cloned().ok_or_else(|| stale(ino.0))?;
                let mut h = h.lock().await;
                if inner.atime != Atime::NoAtime && !std::mem::replace(&mut h.atime_sent, true) {
                    let (i, ent) = (inner.clone(), h.ent);
                    tokio::spawn(async move { i.touch_atime(ent, i.atime == Atime::StrictAtime).await });
                }
                // Offsets: "." → 1, ".." → 2, the k-th entry → 3 + k.
                if offset < 2 && h.parent.is_none() {
                    // The first page names the parent (for the inode number of "..").
                    if h.next_off != 3 || h.after.is_some() {
                        (h.next_off, h.after, h.more) = (3, None, true);
                        h.buf.clear();
                    }
                    inner.fill_dir(&mut h).await?;
                }
                if offset == 0 && reply.add(ino, 1, FileType::Directory, ".") {
                    return Ok(());
                }
                let up = h.parent.map_or(ROOT_INO, |p| p.ino());
                if offset < 2 && reply.add(INodeNo(up), 2, FileType::Directory, "..") {
                    return Ok(());
                }
                let want = offset.max(2) + 1;
                if want != h.next_off {
                    // A seek: list again from the start and skip what was returned.
                    h.next_off = 3;
                    h.after = None;
                    h.buf.clear();
                    h.more = true;
                    while h.next_off < want {
                        inner.fill_dir(&mut h).await?;
                        if h.buf.pop_front().is_none() {
                            break;
                        }
                        h.next_off += 1;
                    }
                }
                loop {
                    inner.fill_dir(&mut h).await?;
                    let Some(e) = h.buf.front() else { break };
                    if reply.add(INodeNo(e.id.ino()), h.next_off, file_type(e.kind), OsStr::from_bytes(&e.name)) {
                        break;
                    }
                    h.buf.pop_front();
                    h.next_off += 1;
                }
                Ok(())
            }
            .await;
            match r {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn releasedir(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, _flags: OpenFlags, reply: ReplyEmpty) {
        self.inner.dirs.lock().expect("dirs").remove(&fh.0);
        reply.ok();
    }

    /// Allocation, punching and zeroing on the storage targets, for every
    /// chunk the range covers (`Client::fallocate`). The kernel refuses
    /// other modes (EOPNOTSUPP), bad ranges (EINVAL, EFBIG), directories and
    /// descriptors not open for writing before asking.
    fn fallocate(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        run_killable!(self, req, reply, |inner| {
            let f = inner.file(fh)?;
            let _changing = f.changing.read().await;
            let mode = mode as u32;
            if mode & hivefs_proto::FALLOC_KEEP_SIZE == 0 {
                inner.check_quota(f.ent.id, offset.saturating_add(length))?;
            }
            inner.settle(f.ent.id).await?;
            inner.client.note_other_write(f.ent.id);
            let r = inner.client.fallocate(&f.pattern, f.ent.id, mode, offset, length).await;
            // Punching and zeroing change contents (on some targets even when
            // another failed); a successful allocation without KEEP_SIZE may
            // change the size. Those go to the metadata node now, with the time.
            let zeroes = mode & (hivefs_proto::FALLOC_PUNCH_HOLE | hivefs_proto::FALLOC_ZERO_RANGE) != 0;
            let grows = mode & hivefs_proto::FALLOC_KEEP_SIZE == 0;
            if r.is_ok() && grows {
                inner.note_write(f.ent.id, offset + length);
            }
            if r.is_err() {
                inner.size_unsure(f.ent.id);
            }
            if zeroes || (r.is_ok() && grows) {
                f.dirty.store(true, Ordering::Release);
                inner.publish_size(&f).await?;
            }
            r?;
            Ok(move |reply: ReplyEmpty| reply.ok())
        })
    }

    /// A server-side copy (`Client::copy_range`): the storage targets copy
    /// the chunks among themselves, the bytes do not pass through here. The
    /// kernel refuses overlapping ranges of one file (EINVAL), sizes past the
    /// largest (EFBIG) and files of other file systems (EXDEV) itself, and
    /// falls back to reading and writing when this answers EOPNOTSUPP.
    fn copy_file_range(
        &self,
        req: &Request,
        _ino_in: INodeNo,
        fh_in: FileHandle,
        offset_in: u64,
        _ino_out: INodeNo,
        fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        _flags: u64,
        reply: ReplyWrite,
    ) {
        run_killable!(self, req, reply, |inner| {
            let (src, dst) = (inner.file(fh_in)?, inner.file(fh_out)?);
            let _changing = dst.changing.read().await;
            inner.settle(src.ent.id).await?;
            inner.settle(dst.ent.id).await?;
            inner.client.note_other_write(dst.ent.id);
            // Only what the source has: short at its end, nothing past it.
            let hint = inner.local_sizes.lock().expect("sizes").get(&src.ent.id).map_or(0, |l| l.size);
            let size = inner.client.size_from_targets(&src.pattern, src.ent.id).await?.max(hint);
            let len = len.min(size.saturating_sub(offset_in)).min(u64::from(u32::MAX) & !0xfff);
            inner.check_quota(dst.ent.id, offset_out.saturating_add(len))?;
            if len > 0 {
                let r = inner
                    .client
                    .copy_range((&src.pattern, src.ent.id), offset_in, (&dst.pattern, dst.ent.id), offset_out, len)
                    .await;
                // Even a failed copy may have written some pieces: publish.
                dst.dirty.store(true, Ordering::Release);
                if r.is_err() {
                    inner.size_unsure(dst.ent.id);
                }
                r?;
                inner.note_write(dst.ent.id, offset_out + len);
            }
            Ok(move |reply: ReplyWrite| reply.written(len as u32))
        })
    }

    /// SEEK_DATA and SEEK_HOLE over the striped file (the kernel answers
    /// the other kinds of seek itself).
    fn lseek(&self, req: &Request, _ino: INodeNo, fh: FileHandle, offset: i64, whence: i32, reply: ReplyLseek) {
        run_killable!(self, req, reply, |inner| {
            let f = inner.file(fh)?;
            let hole = match whence {
                libc::SEEK_DATA => false,
                libc::SEEK_HOLE => true,
                _ => return Err(FsError::new(ErrorCode::Invalid, format!("lseek whence {whence}"))),
            };
            inner.settle(f.ent.id).await?;
            let hint = inner.local_sizes.lock().expect("sizes").get(&f.ent.id).map_or(0, |l| l.size);
            let size = inner.client.size_from_targets(&f.pattern, f.ent.id).await?.max(hint);
            let found = match u64::try_from(offset) {
                Ok(o) => inner.client.seek(&f.pattern, f.ent.id, o, size, hole).await?,
                Err(_) => return Err(FsError::new(ErrorCode::Invalid, format!("lseek to offset {offset}"))),
            };
            Ok(move |reply: ReplyLseek| match found {
                Some(at) => reply.offset(at as i64),
                None => reply.error(Errno::from_i32(libc::ENXIO)),
            })
        })
    }

    /// Every namespace change is committed by its metadata node before it is
    /// acknowledged (and on disk with `sync = true`), so a directory has
    /// nothing left to commit but files this mount made ahead.
    fn fsyncdir(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        run!(self, reply, |inner| {
            inner.client.ahead_landed().await;
            Ok(move |reply: ReplyEmpty| reply.ok())
        })
    }

    fn statfs(&self, req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        run_killable!(self, req, reply, |inner| {
            let st = inner.client.statfs().await?;
            const BS: u64 = 4096;
            let c = st.storage;
            Ok(move |reply: ReplyStatfs| {
                reply.statfs(
                    c.total_bytes / BS,
                    c.free_bytes / BS,
                    c.free_bytes / BS,
                    c.total_inodes.max(st.files + st.dirs),
                    c.free_inodes,
                    BS as u32,
                    255,
                    BS as u32,
                )
            })
        })
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let (name, value) = (name_bytes(name), value.to_vec());
        // Setting an access ACL clears S_ISGID when the caller is neither
        // privileged nor in the file's group, as the kernel decides for
        // other file systems (its FUSE_SETXATTR_ACL_KILL_SGID needs
        // FUSE_SETXATTR_EXT, which which HiveFS does not negotiate): its groups.
        let acl_by = (name == acl::XATTR_ACCESS && req.uid() != 0).then(|| caller_groups(req));
        run!(self, reply, |inner| {
            inner.forget_caps(inner.ent(ino)?.id);
            let mut flags = flags as u32;
            if let Some(groups) = &acl_by {
                let a = inner.on_ent(ino, |e| inner.client.getattr(e)).await?;
                if a.mode & 0o2000 != 0 && !groups.contains(&a.gid) {
                    flags |= XATTR_ACL_KILL_SGID;
                }
            }
            inner.on_ent(ino, |e| inner.client.setxattr(e, &name, &value, flags)).await?;
            Ok(move |reply: ReplyEmpty| reply.ok())
        })
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let name = name_bytes(name);
        run_killable!(self, req, reply, |inner| {
            let v = if inner.cache_mode == CacheMode::Paged && name == CAPS_XATTR {
                inner.on_ent(ino, |e| inner.caps(e)).await?
            } else {
                inner.on_ent(ino, |e| inner.client.getxattr(e, &name)).await?
            };
            Ok(move |reply: ReplyXattr| xattr_reply(reply, &v, size))
        })
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        // As Linux file systems: trusted.* names are listed to privileged callers only
        // (the kernel already refuses others to read or write them).
        let privileged = req.uid() == 0;
        run_killable!(self, req, reply, |inner| {
            let names = inner.on_ent(ino, |e| inner.client.listxattr(e)).await?;
            let mut v = Vec::new();
            for n in names.into_iter().filter(|n| privileged || !n.starts_with(b"trusted.")) {
                v.extend_from_slice(&n);
                v.push(0);
            }
            Ok(move |reply: ReplyXattr| xattr_reply(reply, &v, size))
        })
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let name = name_bytes(name);
        run!(self, reply, |inner| {
            inner.forget_caps(inner.ent(ino)?.id);
            inner.on_ent(ino, |e| inner.client.removexattr(e, &name)).await?;
            Ok(move |reply: ReplyEmpty| reply.ok())
        })
    }
}

fn xattr_reply(reply: ReplyXattr, v: &[u8], size: u32) {
    if size == 0 {
        reply.size(v.len() as u32);
    } else if v.len() > size as usize {
        reply.error(Errno::from_i32(libc::ERANGE));
    } else {
        reply.data(v);
    }
}

/// Ends a release begun with `Inner::release_begins` when dropped (also
/// when the release's request is abandoned).
struct ReleaseEnds<'a>(&'a Inner, EntryId);

impl Drop for ReleaseEnds<'_> {
    fn drop(&mut self) {
        self.0.release_ends(self.1);
    }
}
