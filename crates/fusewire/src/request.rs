//! Decoding the kernel's requests and handing them to a [`Filesystem`].
//!
//! A request arrives as `struct fuse_in_header` and its arguments. Over
//! /dev/fuse the arguments follow the header in one buffer; over io_uring
//! the operation's own header (`fuse_write_in`, ...) and the rest (names,
//! data) arrive in two buffers. [`Args`] reads across both alike. Nothing
//! here trusts a length: a request too short for what its opcode needs is
//! answered `EINVAL`.

use crate::reply::*;
use crate::types::*;
use crate::Sink;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use tracing::{debug, warn};

pub const FUSE_LOOKUP: u32 = 1;
pub const FUSE_FORGET: u32 = 2;
pub const FUSE_GETATTR: u32 = 3;
pub const FUSE_SETATTR: u32 = 4;
pub const FUSE_READLINK: u32 = 5;
pub const FUSE_SYMLINK: u32 = 6;
pub const FUSE_MKNOD: u32 = 8;
pub const FUSE_MKDIR: u32 = 9;
pub const FUSE_UNLINK: u32 = 10;
pub const FUSE_RMDIR: u32 = 11;
pub const FUSE_RENAME: u32 = 12;
pub const FUSE_LINK: u32 = 13;
pub const FUSE_OPEN: u32 = 14;
pub const FUSE_READ: u32 = 15;
pub const FUSE_WRITE: u32 = 16;
pub const FUSE_STATFS: u32 = 17;
pub const FUSE_RELEASE: u32 = 18;
pub const FUSE_FSYNC: u32 = 20;
pub const FUSE_SETXATTR: u32 = 21;
pub const FUSE_GETXATTR: u32 = 22;
pub const FUSE_LISTXATTR: u32 = 23;
pub const FUSE_REMOVEXATTR: u32 = 24;
pub const FUSE_FLUSH: u32 = 25;
pub const FUSE_INIT: u32 = 26;
pub const FUSE_OPENDIR: u32 = 27;
pub const FUSE_READDIR: u32 = 28;
pub const FUSE_RELEASEDIR: u32 = 29;
pub const FUSE_FSYNCDIR: u32 = 30;
pub const FUSE_GETLK: u32 = 31;
pub const FUSE_SETLK: u32 = 32;
pub const FUSE_SETLKW: u32 = 33;
pub const FUSE_CREATE: u32 = 35;
pub const FUSE_INTERRUPT: u32 = 36;
pub const FUSE_DESTROY: u32 = 38;
pub const FUSE_IOCTL: u32 = 39;
pub const FUSE_BATCH_FORGET: u32 = 42;
pub const FUSE_FALLOCATE: u32 = 43;
pub const FUSE_RENAME2: u32 = 45;
pub const FUSE_LSEEK: u32 = 46;
pub const FUSE_COPY_FILE_RANGE: u32 = 47;

/// `struct fuse_in_header`.
pub const IN_HEADER_LEN: usize = 40;

const FUSE_GETATTR_FH: u32 = 1;
const FATTR_MODE: u32 = 1 << 0;
const FATTR_UID: u32 = 1 << 1;
const FATTR_GID: u32 = 1 << 2;
const FATTR_SIZE: u32 = 1 << 3;
const FATTR_ATIME: u32 = 1 << 4;
const FATTR_MTIME: u32 = 1 << 5;
const FATTR_FH: u32 = 1 << 6;
const FATTR_ATIME_NOW: u32 = 1 << 7;
const FATTR_MTIME_NOW: u32 = 1 << 8;
const FUSE_READ_LOCKOWNER: u32 = 1 << 1;
const FUSE_WRITE_LOCKOWNER: u32 = 1 << 1;
const FUSE_RELEASE_FLUSH: u32 = 1 << 0;
const FUSE_RELEASE_FLOCK_UNLOCK: u32 = 1 << 1;
const FUSE_FSYNC_FDATASYNC: u32 = 1 << 0;
const FUSE_LK_FLOCK: u32 = 1 << 0;

/// `struct fuse_in_header`, decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InHeader {
    /// Length of the header and all arguments.
    pub len: u32,
    pub opcode: u32,
    pub unique: u64,
    pub nodeid: u64,
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
}

impl InHeader {
    pub fn parse(b: &[u8]) -> Option<InHeader> {
        if b.len() < IN_HEADER_LEN {
            return None;
        }
        let mut a = Args::new(b, &[]);
        Some(InHeader {
            len: a.u32()?,
            opcode: a.u32()?,
            unique: a.u64()?,
            nodeid: a.u64()?,
            uid: a.u32()?,
            gid: a.u32()?,
            pid: a.u32()?,
        })
    }
}

/// Who asked: the calling thread's ids.
#[derive(Clone, Copy, Debug)]
pub struct Request {
    h: InHeader,
}

impl Request {
    pub fn uid(&self) -> u32 {
        self.h.uid
    }
    pub fn gid(&self) -> u32 {
        self.h.gid
    }
    pub fn pid(&self) -> u32 {
        self.h.pid
    }
    pub fn unique(&self) -> u64 {
        self.h.unique
    }
}

/// A request's arguments: read in order from the first part, then from the
/// second (see the module documentation).
pub(crate) struct Args<'a> {
    parts: [&'a [u8]; 2],
}

impl<'a> Args<'a> {
    pub(crate) fn new(first: &'a [u8], second: &'a [u8]) -> Args<'a> {
        Args { parts: [first, second] }
    }

    fn cur(&mut self) -> &mut &'a [u8] {
        if self.parts[0].is_empty() {
            self.parts.swap(0, 1);
        }
        &mut self.parts[0]
    }

    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let c = self.cur();
        if c.len() < n {
            return None;
        }
        let (h, t) = c.split_at(n);
        *c = t;
        Some(h)
    }

    fn u32(&mut self) -> Option<u32> {
        self.take(4).map(|b| u32::from_ne_bytes(b.try_into().expect("4 bytes")))
    }

    fn u64(&mut self) -> Option<u64> {
        self.take(8).map(|b| u64::from_ne_bytes(b.try_into().expect("8 bytes")))
    }

    /// A NUL-terminated name (without the NUL).
    fn name(&mut self) -> Option<&'a OsStr> {
        let c = self.cur();
        let end = c.iter().position(|&b| b == 0)?;
        let (n, t) = c.split_at(end);
        *c = &t[1..];
        Some(OsStr::from_bytes(n))
    }

    /// All that is left.
    fn rest(&mut self) -> &'a [u8] {
        let c = std::mem::take(self.cur());
        if c.is_empty() {
            std::mem::take(&mut self.parts[1])
        } else {
            c
        }
    }
}

/// The operations HiveFS serves. Every method answers through its reply,
/// now or later from any thread; those not implemented answer `ENOSYS`.
/// `forget` and `interrupt` have no answer.
#[allow(clippy::too_many_arguments, unused_variables)]
pub trait Filesystem: Send + Sync + 'static {
    fn destroy(&self) {}
    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        reply.error(Errno::ENOSYS)
    }
    fn forget(&self, req: &Request, ino: INodeNo, nlookup: u64) {}
    /// The caller of request `unique` got a signal. No answer: the request
    /// itself is answered, early with `EINTR` where the handler can stop
    /// it, or as usual. The interrupt may come before the request's handler
    /// ran (another thread read it first), or after its answer.
    fn interrupt(&self, req: &Request, unique: u64) {}
    fn getattr(&self, req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        reply.error(Errno::ENOSYS)
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
        fh: Option<FileHandle>,
        reply: ReplyAttr,
    ) {
        reply.error(Errno::ENOSYS)
    }
    fn readlink(&self, req: &Request, ino: INodeNo, reply: ReplyData) {
        reply.error(Errno::ENOSYS)
    }
    fn mknod(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, rdev: u32, reply: ReplyEntry) {
        reply.error(Errno::ENOSYS)
    }
    fn mkdir(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
        reply.error(Errno::ENOSYS)
    }
    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::ENOSYS)
    }
    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::ENOSYS)
    }
    fn symlink(&self, req: &Request, parent: INodeNo, link_name: &OsStr, target: &Path, reply: ReplyEntry) {
        reply.error(Errno::ENOSYS)
    }
    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: u32,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::ENOSYS)
    }
    fn link(&self, req: &Request, ino: INodeNo, newparent: INodeNo, newname: &OsStr, reply: ReplyEntry) {
        reply.error(Errno::ENOSYS)
    }
    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        reply.error(Errno::ENOSYS)
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
        reply.error(Errno::ENOSYS)
    }
    fn read(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        flags: OpenFlags,
        lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        reply.error(Errno::ENOSYS)
    }
    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: u32,
        flags: OpenFlags,
        lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        reply.error(Errno::ENOSYS)
    }
    fn flush(&self, req: &Request, ino: INodeNo, fh: FileHandle, lock_owner: LockOwner, reply: ReplyEmpty) {
        reply.error(Errno::ENOSYS)
    }
    fn fsync(&self, req: &Request, ino: INodeNo, fh: FileHandle, datasync: bool, reply: ReplyEmpty) {
        reply.error(Errno::ENOSYS)
    }
    fn release(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        flags: OpenFlags,
        lock_owner: Option<LockOwner>,
        flush: bool,
        reply: ReplyEmpty,
    ) {
        reply.ok()
    }
    fn getlk(
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
        reply: ReplyLock,
    ) {
        reply.error(Errno::ENOSYS)
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
        reply.error(Errno::ENOSYS)
    }
    fn opendir(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        reply.error(Errno::ENOSYS)
    }
    fn readdir(&self, req: &Request, ino: INodeNo, fh: FileHandle, offset: u64, reply: ReplyDirectory) {
        reply.error(Errno::ENOSYS)
    }
    fn releasedir(&self, req: &Request, ino: INodeNo, fh: FileHandle, flags: OpenFlags, reply: ReplyEmpty) {
        reply.ok()
    }
    fn fsyncdir(&self, req: &Request, ino: INodeNo, fh: FileHandle, datasync: bool, reply: ReplyEmpty) {
        reply.error(Errno::ENOSYS)
    }
    fn statfs(&self, req: &Request, ino: INodeNo, reply: ReplyStatfs) {
        reply.error(Errno::ENOSYS)
    }
    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        position: u32,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::ENOSYS)
    }
    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        reply.error(Errno::ENOSYS)
    }
    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        reply.error(Errno::ENOSYS)
    }
    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::ENOSYS)
    }
    fn fallocate(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::ENOSYS)
    }
    fn copy_file_range(
        &self,
        req: &Request,
        ino_in: INodeNo,
        fh_in: FileHandle,
        offset_in: u64,
        ino_out: INodeNo,
        fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        flags: u64,
        reply: ReplyWrite,
    ) {
        reply.error(Errno::ENOSYS)
    }
    fn lseek(&self, req: &Request, ino: INodeNo, fh: FileHandle, offset: i64, whence: i32, reply: ReplyLseek) {
        reply.error(Errno::ENOSYS)
    }
}

/// What became of a request.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Handled {
    Served,
    /// `FUSE_DESTROY`: the session ends.
    Destroyed,
}

fn time_or_now(set: bool, now: bool, sec: u64, nsec: u32) -> Option<TimeOrNow> {
    match (set, now) {
        (false, _) => None,
        (true, true) => Some(TimeOrNow::Now),
        (true, false) => Some(TimeOrNow::SpecificTime(system_time(sec, nsec))),
    }
}

/// Decodes one request (header `h`, arguments `a`) and hands it to `fs`;
/// the answer goes to `sink`. A handler that panics (a bug) costs its
/// request (answered `EIO` as its reply is dropped), not the thread that
/// serves the transport: a `/dev/fuse` reader or an io_uring queue whose
/// thread died would leave later requests unanswered.
pub(crate) fn dispatch<F: Filesystem + ?Sized>(fs: &F, h: InHeader, a: Args<'_>, sink: &Sink) -> Handled {
    let reply = || Reply::new(h.unique, sink.clone());
    let decoded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| decode(fs, h, a, sink)));
    let Ok(decoded) = decoded else {
        tracing::error!("FUSE request {} (opcode {}) panicked; answered EIO", h.unique, h.opcode);
        return Handled::Served;
    };
    if decoded.is_none() {
        warn!("malformed FUSE request: opcode {} unique {} length {}", h.opcode, h.unique, h.len);
        if !matches!(h.opcode, FUSE_FORGET | FUSE_BATCH_FORGET | FUSE_INTERRUPT) {
            reply().error(Errno::EINVAL);
        }
        return Handled::Served;
    }
    if h.opcode == FUSE_DESTROY {
        Handled::Destroyed
    } else {
        Handled::Served
    }
}

/// `None` when the arguments are too short for the opcode (nothing was
/// answered then).
fn decode<F: Filesystem + ?Sized>(fs: &F, h: InHeader, mut a: Args<'_>, sink: &Sink) -> Option<()> {
    let req = Request { h };
    let ino = INodeNo(h.nodeid);
    let reply = || Reply::new(h.unique, sink.clone());
    match h.opcode {
        FUSE_LOOKUP => fs.lookup(&req, ino, a.name()?, ReplyEntry(reply())),
        FUSE_FORGET => fs.forget(&req, ino, a.u64()?),
        FUSE_BATCH_FORGET => {
            let count = a.u32()?;
            a.u32()?;
            for _ in 0..count {
                let (node, n) = (a.u64()?, a.u64()?);
                fs.forget(&req, INodeNo(node), n);
            }
        }
        FUSE_INTERRUPT => fs.interrupt(&req, a.u64()?),
        FUSE_GETATTR => {
            let (flags, _, fh) = (a.u32()?, a.u32()?, a.u64()?);
            fs.getattr(&req, ino, (flags & FUSE_GETATTR_FH != 0).then_some(FileHandle(fh)), ReplyAttr(reply()))
        }
        FUSE_SETATTR => {
            let (valid, _) = (a.u32()?, a.u32()?);
            let (fh, size, _lock_owner, atime, mtime, _ctime) =
                (a.u64()?, a.u64()?, a.u64()?, a.u64()?, a.u64()?, a.u64()?);
            let (atimensec, mtimensec, _ctimensec, mode, _, uid, gid, _) =
                (a.u32()?, a.u32()?, a.u32()?, a.u32()?, a.u32()?, a.u32()?, a.u32()?, a.u32()?);
            let has = |f: u32| valid & f != 0;
            fs.setattr(
                &req,
                ino,
                has(FATTR_MODE).then_some(mode),
                has(FATTR_UID).then_some(uid),
                has(FATTR_GID).then_some(gid),
                has(FATTR_SIZE).then_some(size),
                time_or_now(has(FATTR_ATIME), has(FATTR_ATIME_NOW), atime, atimensec),
                time_or_now(has(FATTR_MTIME), has(FATTR_MTIME_NOW), mtime, mtimensec),
                has(FATTR_FH).then_some(FileHandle(fh)),
                ReplyAttr(reply()),
            )
        }
        FUSE_READLINK => fs.readlink(&req, ino, ReplyData(reply())),
        FUSE_SYMLINK => {
            let (name, target) = (a.name()?, a.name()?);
            fs.symlink(&req, ino, name, Path::new(target), ReplyEntry(reply()))
        }
        FUSE_MKNOD => {
            let (mode, rdev, umask, _) = (a.u32()?, a.u32()?, a.u32()?, a.u32()?);
            fs.mknod(&req, ino, a.name()?, mode, umask, rdev, ReplyEntry(reply()))
        }
        FUSE_MKDIR => {
            let (mode, umask) = (a.u32()?, a.u32()?);
            fs.mkdir(&req, ino, a.name()?, mode, umask, ReplyEntry(reply()))
        }
        FUSE_UNLINK => fs.unlink(&req, ino, a.name()?, ReplyEmpty(reply())),
        FUSE_RMDIR => fs.rmdir(&req, ino, a.name()?, ReplyEmpty(reply())),
        FUSE_RENAME | FUSE_RENAME2 => {
            let newdir = a.u64()?;
            let flags = if h.opcode == FUSE_RENAME2 {
                let f = a.u32()?;
                a.u32()?;
                f
            } else {
                0
            };
            let (name, newname) = (a.name()?, a.name()?);
            fs.rename(&req, ino, name, INodeNo(newdir), newname, flags, ReplyEmpty(reply()))
        }
        FUSE_LINK => {
            let old = a.u64()?;
            fs.link(&req, INodeNo(old), ino, a.name()?, ReplyEntry(reply()))
        }
        FUSE_OPEN => {
            let (flags, _) = (a.u32()?, a.u32()?);
            fs.open(&req, ino, OpenFlags(flags as i32), ReplyOpen(reply()))
        }
        FUSE_OPENDIR => {
            let (flags, _) = (a.u32()?, a.u32()?);
            fs.opendir(&req, ino, OpenFlags(flags as i32), ReplyOpen(reply()))
        }
        FUSE_CREATE => {
            let (flags, mode, umask, _) = (a.u32()?, a.u32()?, a.u32()?, a.u32()?);
            fs.create(&req, ino, a.name()?, mode, umask, flags as i32, ReplyCreate(reply()))
        }
        FUSE_READ | FUSE_READDIR => {
            let (fh, offset, size, read_flags, lock_owner, flags, _) =
                (a.u64()?, a.u64()?, a.u32()?, a.u32()?, a.u64()?, a.u32()?, a.u32()?);
            if h.opcode == FUSE_READDIR {
                fs.readdir(&req, ino, FileHandle(fh), offset, ReplyDirectory::new(reply(), size as usize))
            } else {
                let owner = (read_flags & FUSE_READ_LOCKOWNER != 0).then_some(LockOwner(lock_owner));
                fs.read(&req, ino, FileHandle(fh), offset, size, OpenFlags(flags as i32), owner, ReplyData(reply()))
            }
        }
        FUSE_WRITE => {
            let (fh, offset, size, write_flags, lock_owner, flags, _) =
                (a.u64()?, a.u64()?, a.u32()?, a.u32()?, a.u64()?, a.u32()?, a.u32()?);
            let data = a.rest().get(..size as usize)?;
            let owner = (write_flags & FUSE_WRITE_LOCKOWNER != 0).then_some(LockOwner(lock_owner));
            fs.write(
                &req,
                ino,
                FileHandle(fh),
                offset,
                data,
                write_flags,
                OpenFlags(flags as i32),
                owner,
                ReplyWrite(reply()),
            )
        }
        FUSE_STATFS => fs.statfs(&req, ino, ReplyStatfs(reply())),
        FUSE_RELEASE | FUSE_RELEASEDIR => {
            let (fh, flags, release_flags, lock_owner) = (a.u64()?, a.u32()?, a.u32()?, a.u64()?);
            let (fh, flags) = (FileHandle(fh), OpenFlags(flags as i32));
            if h.opcode == FUSE_RELEASEDIR {
                fs.releasedir(&req, ino, fh, flags, ReplyEmpty(reply()))
            } else {
                let owner = (release_flags & FUSE_RELEASE_FLOCK_UNLOCK != 0).then_some(LockOwner(lock_owner));
                let flush = release_flags & FUSE_RELEASE_FLUSH != 0;
                fs.release(&req, ino, fh, flags, owner, flush, ReplyEmpty(reply()))
            }
        }
        FUSE_FSYNC | FUSE_FSYNCDIR => {
            let (fh, fsync_flags, _) = (a.u64()?, a.u32()?, a.u32()?);
            let datasync = fsync_flags & FUSE_FSYNC_FDATASYNC != 0;
            if h.opcode == FUSE_FSYNC {
                fs.fsync(&req, ino, FileHandle(fh), datasync, ReplyEmpty(reply()))
            } else {
                fs.fsyncdir(&req, ino, FileHandle(fh), datasync, ReplyEmpty(reply()))
            }
        }
        FUSE_SETXATTR => {
            let (size, flags) = (a.u32()?, a.u32()?);
            let name = a.name()?;
            let value = a.rest().get(..size as usize)?;
            fs.setxattr(&req, ino, name, value, flags as i32, 0, ReplyEmpty(reply()))
        }
        FUSE_GETXATTR => {
            let (size, _) = (a.u32()?, a.u32()?);
            fs.getxattr(&req, ino, a.name()?, size, ReplyXattr(reply()))
        }
        FUSE_LISTXATTR => {
            let (size, _) = (a.u32()?, a.u32()?);
            fs.listxattr(&req, ino, size, ReplyXattr(reply()))
        }
        FUSE_REMOVEXATTR => fs.removexattr(&req, ino, a.name()?, ReplyEmpty(reply())),
        FUSE_FLUSH => {
            let (fh, _, _, lock_owner) = (a.u64()?, a.u32()?, a.u32()?, a.u64()?);
            fs.flush(&req, ino, FileHandle(fh), LockOwner(lock_owner), ReplyEmpty(reply()))
        }
        FUSE_GETLK | FUSE_SETLK | FUSE_SETLKW => {
            let (fh, owner, start, end, typ, pid) = (a.u64()?, a.u64()?, a.u64()?, a.u64()?, a.u32()?, a.u32()?);
            let (lk_flags, _) = (a.u32()?, a.u32()?);
            let (fh, owner, flock) = (FileHandle(fh), LockOwner(owner), lk_flags & FUSE_LK_FLOCK != 0);
            if h.opcode == FUSE_GETLK {
                fs.getlk(&req, ino, fh, owner, start, end, typ as i32, pid, flock, ReplyLock(reply()))
            } else {
                let sleep = h.opcode == FUSE_SETLKW;
                fs.setlk(&req, ino, fh, owner, start, end, typ as i32, pid, flock, sleep, ReplyEmpty(reply()))
            }
        }
        FUSE_FALLOCATE => {
            let (fh, offset, length, mode) = (a.u64()?, a.u64()?, a.u64()?, a.u32()?);
            fs.fallocate(&req, ino, FileHandle(fh), offset, length, mode as i32, ReplyEmpty(reply()))
        }
        FUSE_LSEEK => {
            let (fh, offset, whence) = (a.u64()?, a.u64()?, a.u32()?);
            fs.lseek(&req, ino, FileHandle(fh), offset as i64, whence as i32, ReplyLseek(reply()))
        }
        FUSE_COPY_FILE_RANGE => {
            let (fh_in, off_in, node_out, fh_out, off_out, len, flags) =
                (a.u64()?, a.u64()?, a.u64()?, a.u64()?, a.u64()?, a.u64()?, a.u64()?);
            fs.copy_file_range(
                &req,
                ino,
                FileHandle(fh_in),
                off_in,
                INodeNo(node_out),
                FileHandle(fh_out),
                off_out,
                len,
                flags,
                ReplyWrite(reply()),
            )
        }
        FUSE_DESTROY => {
            fs.destroy();
            reply().ok()
        }
        // INIT is answered once, by the mount's handshake, before serving starts.
        FUSE_INIT => reply().error(Errno::from_i32(libc::EPROTO)),
        // No ioctls: ENOTTY, as local file systems answer unknown ones.
        FUSE_IOCTL => reply().error(Errno::from_i32(libc::ENOTTY)),
        op => {
            debug!("FUSE opcode {op} is not implemented");
            reply().error(Errno::ENOSYS)
        }
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// Records the calls it gets as text and answers some.
    #[derive(Default)]
    struct Rec(Mutex<Vec<String>>);

    impl Rec {
        fn note(&self, s: String) {
            self.0.lock().unwrap().push(s);
        }
    }

    impl Filesystem for Rec {
        fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
            self.note(format!("lookup {} {:?} uid {}", parent.0, name, req.uid()));
            reply.error(Errno::ENOENT)
        }
        fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
            self.note(format!("forget {} {nlookup}", ino.0));
        }
        fn interrupt(&self, req: &Request, unique: u64) {
            self.note(format!("interrupt of {unique} by pid {}", req.pid()));
        }
        fn mkdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
            self.note(format!("mkdir {} {:?} {mode:o} {umask:o}", parent.0, name));
            drop(reply);
        }
        fn symlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, target: &Path, reply: ReplyEntry) {
            self.note(format!("symlink {} {:?} {:?}", parent.0, name, target));
            reply.error(Errno::EIO)
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
            self.note(format!("rename {} {:?} {} {:?} {flags}", parent.0, name, newparent.0, newname));
            reply.ok()
        }
        fn write(
            &self,
            _req: &Request,
            ino: INodeNo,
            fh: FileHandle,
            offset: u64,
            data: &[u8],
            _write_flags: u32,
            flags: OpenFlags,
            lock_owner: Option<LockOwner>,
            reply: ReplyWrite,
        ) {
            self.note(format!("write {} {} {offset} {:?} {:o} {lock_owner:?}", ino.0, fh.0, data, flags.0));
            reply.written(data.len() as u32)
        }
        fn setattr(
            &self,
            _req: &Request,
            ino: INodeNo,
            mode: Option<u32>,
            uid: Option<u32>,
            gid: Option<u32>,
            size: Option<u64>,
            atime: Option<TimeOrNow>,
            mtime: Option<TimeOrNow>,
            fh: Option<FileHandle>,
            reply: ReplyAttr,
        ) {
            let mt = mtime.map(|t| match t {
                TimeOrNow::Now => "now".to_string(),
                TimeOrNow::SpecificTime(t) => format!("{:?}", time_parts(t)),
            });
            self.note(format!("setattr {} {mode:?} {uid:?} {gid:?} {size:?} {atime:?} {mt:?} {fh:?}", ino.0));
            reply.error(Errno::EINVAL)
        }
        fn setxattr(
            &self,
            _req: &Request,
            ino: INodeNo,
            name: &OsStr,
            value: &[u8],
            flags: i32,
            _position: u32,
            reply: ReplyEmpty,
        ) {
            self.note(format!("setxattr {} {:?} {:?} {flags}", ino.0, name, value));
            reply.ok()
        }
        fn setlk(
            &self,
            _req: &Request,
            ino: INodeNo,
            fh: FileHandle,
            owner: LockOwner,
            start: u64,
            end: u64,
            typ: i32,
            pid: u32,
            flock: bool,
            sleep: bool,
            reply: ReplyEmpty,
        ) {
            self.note(format!(
                "setlk {} {} {} {start}..{end} {typ} {pid} flock {flock} sleep {sleep}",
                ino.0, fh.0, owner.0
            ));
            reply.ok()
        }
        fn readdir(&self, _req: &Request, ino: INodeNo, fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
            self.note(format!("readdir {} {} {offset}", ino.0, fh.0));
            assert!(!reply.add(INodeNo(5), 1, FileType::Directory, "."));
            assert!(reply.add(INodeNo(6), 2, FileType::RegularFile, "a-name-that-does-not-fit"), "full");
            reply.ok()
        }
    }

    fn header(len: usize, opcode: u32, unique: u64, nodeid: u64) -> Vec<u8> {
        let mut h = Vec::new();
        for v in [len as u32, opcode] {
            h.extend_from_slice(&v.to_ne_bytes());
        }
        h.extend_from_slice(&unique.to_ne_bytes());
        h.extend_from_slice(&nodeid.to_ne_bytes());
        for v in [1000u32, 100, 42, 0] {
            h.extend_from_slice(&v.to_ne_bytes());
        }
        h
    }

    fn u32s(v: &[u32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_ne_bytes()).collect()
    }

    fn u64s(v: &[u64]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_ne_bytes()).collect()
    }

    /// Requests as (opcode, the operation's own header, the rest).
    fn cases() -> Vec<(u32, Vec<u8>, Vec<u8>)> {
        let setattr = [
            u32s(&[(FATTR_MODE | FATTR_SIZE | FATTR_MTIME | FATTR_FH), 0]),
            u64s(&[9, 4096, 0, 0, 7, 0]),
            u32s(&[0, 8, 0, 0o100600, 0, 0, 0, 0]),
        ]
        .concat();
        vec![
            (FUSE_LOOKUP, vec![], b"name\0".to_vec()),
            (FUSE_FORGET, u64s(&[3]), vec![]),
            (FUSE_BATCH_FORGET, u32s(&[2, 0]), u64s(&[10, 1, 11, 2])),
            (FUSE_MKDIR, u32s(&[0o755, 0o022]), b"dir\0".to_vec()),
            (FUSE_SYMLINK, vec![], b"link\0target\0".to_vec()),
            (FUSE_RENAME2, [u64s(&[8]), u32s(&[1, 0])].concat(), b"old\0new\0".to_vec()),
            (FUSE_WRITE, [u64s(&[4, 100]), u32s(&[3, 2]), u64s(&[77]), u32s(&[0o2001, 0])].concat(), b"abc".to_vec()),
            (FUSE_SETATTR, setattr, vec![]),
            (FUSE_SETXATTR, u32s(&[2, 1]), b"user.x\0v1".to_vec()),
            (FUSE_READDIR, [u64s(&[4, 0]), u32s(&[40, 0]), u64s(&[0]), u32s(&[0, 0])].concat(), vec![]),
            (99, vec![], vec![]),
            (FUSE_SETLKW, [u64s(&[4, 99, 0, u64::MAX]), u32s(&[1, 42, 1, 0])].concat(), vec![]),
            (FUSE_SETLK, [u64s(&[4, 99, 5, 9]), u32s(&[2, 42, 0, 0])].concat(), vec![]),
            (FUSE_INTERRUPT, u64s(&[12]), vec![]),
        ]
    }

    const EXPECTED: &[&str] = &[
        "lookup 1 \"name\" uid 1000",
        "forget 1 3",
        "forget 10 1",
        "forget 11 2",
        "mkdir 1 \"dir\" 755 22",
        "symlink 1 \"link\" \"target\"",
        "rename 1 \"old\" 8 \"new\" 1",
        "write 1 4 100 [97, 98, 99] 2001 Some(LockOwner(77))",
        "setattr 1 Some(33152) None None Some(4096) None Some(\"(7, 8)\") Some(FileHandle(9))",
        "setxattr 1 \"user.x\" [118, 49] 1",
        "readdir 1 4 0",
        "setlk 1 4 99 0..18446744073709551615 1 42 flock true sleep true",
        "setlk 1 4 99 5..9 2 42 flock false sleep false",
        "interrupt of 12 by pid 42",
    ];

    /// Runs every case through `dispatch`, laid out as `/dev/fuse` gives it
    /// (`split` false: one buffer) or as io_uring does (the operation's
    /// header apart from the rest); returns the calls and the answers.
    fn run(split: bool) -> (Vec<String>, Vec<crate::Answer>) {
        let fs = Rec::default();
        let answers = Arc::new(Mutex::new(Vec::new()));
        let sink = Sink::Test(answers.clone());
        for (i, (op, head, rest)) in cases().into_iter().enumerate() {
            let h = header(IN_HEADER_LEN + head.len() + rest.len(), op, i as u64 + 1, 1);
            let h = InHeader::parse(&h).unwrap();
            let whole = [head.clone(), rest.clone()].concat();
            let args = if split { Args::new(&head, &rest) } else { Args::new(&whole, &[]) };
            assert_eq!(dispatch(&fs, h, args, &sink), Handled::Served);
        }
        let calls = fs.0.lock().unwrap().clone();
        let answers = answers.lock().unwrap().clone();
        (calls, answers)
    }

    #[test]
    fn requests_decode_alike_from_one_buffer_and_from_io_urings_two() {
        for split in [false, true] {
            let (calls, answers) = run(split);
            assert_eq!(calls, EXPECTED, "split {split}");
            let errors: Vec<_> = answers.iter().map(|(u, e, _)| (*u, *e)).collect();
            // Forgets (2, 3) get no answer; the dropped mkdir reply answers EIO;
            // an unknown opcode ENOSYS.
            assert_eq!(
                errors,
                [
                    (1, -libc::ENOENT),
                    (4, -libc::EIO),
                    (5, -libc::EIO),
                    (6, 0),
                    (7, 0),
                    (8, -libc::EINVAL),
                    (9, 0),
                    (10, 0),
                    (11, -libc::ENOSYS),
                    (12, 0),
                    (13, 0)
                ],
                "split {split}"
            );
            assert_eq!(
                answers[4].2,
                3u32.to_ne_bytes().iter().chain(&[0; 4]).copied().collect::<Vec<u8>>(),
                "written 3"
            );
            let dir = &answers[7].2;
            assert_eq!(dir.len(), 32, "one dirent, padded to 8 bytes");
            assert_eq!(u64::from_ne_bytes(dir[0..8].try_into().unwrap()), 5);
            assert_eq!(u32::from_ne_bytes(dir[20..24].try_into().unwrap()), libc::DT_DIR as u32);
        }
    }

    #[test]
    fn a_handler_that_panics_costs_its_request_only() {
        struct Panics;
        impl Filesystem for Panics {
            fn getattr(&self, _req: &Request, _ino: INodeNo, _fh: Option<FileHandle>, _reply: ReplyAttr) {
                panic!("a bug");
            }
        }
        let answers = Arc::new(Mutex::new(Vec::new()));
        let sink = Sink::Test(answers.clone());
        let h = InHeader::parse(&header(IN_HEADER_LEN + 16, FUSE_GETATTR, 5, 1)).unwrap();
        assert_eq!(dispatch(&Panics, h, Args::new(&[0; 16], &[]), &sink), Handled::Served);
        assert_eq!(answers.lock().unwrap().as_slice(), [(5, -libc::EIO, vec![])]);
    }

    #[test]
    fn random_bytes_never_panic_the_decoder() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..20_000 {
            let len = IN_HEADER_LEN + (next() % 200) as usize;
            let mut b: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            // Mostly opcodes that exist, so their decoders run.
            b[4..8].copy_from_slice(&((next() % 50) as u32).to_ne_bytes());
            let split = (next() % 3 != 0).then(|| (next() % 100) as usize);
            crate::decode_any(&b, split);
        }
    }

    #[test]
    fn short_requests_are_refused_not_read_past() {
        let fs = Rec::default();
        let answers = Arc::new(Mutex::new(Vec::new()));
        let sink = Sink::Test(answers.clone());
        for (i, (op, head, rest)) in cases().into_iter().enumerate() {
            let whole = [head, rest].concat();
            // Every shorter prefix of the arguments.
            for cut in 0..whole.len() {
                let h = InHeader::parse(&header(IN_HEADER_LEN + cut, op, i as u64 + 1, 1)).unwrap();
                dispatch(&fs, h, Args::new(&whole[..cut], &[]), &sink);
            }
        }
        let answers = answers.lock().unwrap();
        // A name without its NUL, a header cut short, a write shorter than
        // its size: refused, except for forgets and interrupts (never answered) and the
        // opcode nobody knows (ENOSYS whatever follows).
        let refused = answers.iter().filter(|(_, e, _)| *e == -libc::EINVAL).count();
        let cuts: usize = cases()
            .iter()
            .filter(|c| !matches!(c.0, FUSE_FORGET | FUSE_BATCH_FORGET | FUSE_INTERRUPT | 99))
            .map(|c| c.1.len() + c.2.len())
            .sum();
        assert_eq!(refused, cuts);
        assert!(InHeader::parse(&[0u8; 39]).is_none());
    }
}
