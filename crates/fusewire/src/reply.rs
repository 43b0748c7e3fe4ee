//! Answers to the kernel. Each request gets exactly one: a typed reply is
//! consumed by the call that sends it, and one dropped unanswered sends
//! `EIO` (a request never answered would hang its caller).

use crate::types::{time_parts, ttl_parts, Errno, FileAttr, FileHandle, FileType, FopenFlags, Generation, INodeNo};
use crate::Sink;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::time::Duration;
use tracing::warn;

/// The bytes of an answer's arguments, built on the stack (the largest,
/// `fuse_entry_out` and `fuse_open_out` of a create, is 144 bytes): no
/// allocation per answer.
pub(crate) struct Enc {
    b: [u8; 144],
    n: usize,
}

impl Default for Enc {
    fn default() -> Enc {
        Enc { b: [0; 144], n: 0 }
    }
}

impl Enc {
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.b[..self.n]
    }
    fn put(&mut self, v: &[u8]) -> &mut Enc {
        self.b[self.n..self.n + v.len()].copy_from_slice(v);
        self.n += v.len();
        self
    }
    fn u32(&mut self, v: u32) -> &mut Enc {
        self.put(&v.to_ne_bytes())
    }
    fn u64(&mut self, v: u64) -> &mut Enc {
        self.put(&v.to_ne_bytes())
    }
    /// `struct fuse_attr` (88 bytes).
    fn attr(&mut self, a: &FileAttr) -> &mut Enc {
        let (at, atn) = time_parts(a.atime);
        let (mt, mtn) = time_parts(a.mtime);
        let (ct, ctn) = time_parts(a.ctime);
        self.u64(a.ino.0).u64(a.size).u64(a.blocks).u64(at).u64(mt).u64(ct);
        self.u32(atn).u32(mtn).u32(ctn);
        self.u32(a.kind.mode_bits() | u32::from(a.perm) & 0o7777);
        self.u32(a.nlink).u32(a.uid).u32(a.gid).u32(a.rdev).u32(a.blksize).u32(0)
    }
    /// `struct fuse_entry_out` (128 bytes).
    fn entry(&mut self, attr_ttl: Duration, entry_ttl: Duration, a: &FileAttr, g: Generation) -> &mut Enc {
        let (es, en) = ttl_parts(entry_ttl);
        let (as_, an) = ttl_parts(attr_ttl);
        self.u64(a.ino.0).u64(g.0).u64(es).u64(as_).u32(en).u32(an).attr(a)
    }
    /// `struct fuse_open_out` (16 bytes).
    fn open(&mut self, fh: FileHandle, flags: FopenFlags) -> &mut Enc {
        self.u64(fh.0).u32(flags.bits()).u32(0)
    }
}

/// Where an answer goes and which request it answers.
pub struct Reply {
    unique: u64,
    sink: Option<Sink>,
}

impl Reply {
    pub(crate) fn new(unique: u64, sink: Sink) -> Reply {
        Reply { unique, sink: Some(sink) }
    }

    pub(crate) fn send(mut self, error: i32, args: &[&[u8]]) {
        if let Some(s) = self.sink.take() {
            s.send(self.unique, error, args);
        }
    }

    pub fn error(self, e: Errno) {
        self.send(-e.code(), &[]);
    }

    pub fn ok(self) {
        self.send(0, &[]);
    }

    /// A way to answer this request with an error before its handler
    /// answers it ([`Interrupter::answer`]), for a caller that is being
    /// killed while the handler waits: only over `/dev/fuse`, where the
    /// handler's own answer then finds the request gone and is dropped by
    /// the kernel. An io_uring entry carries one answer and then the next
    /// request, so it has none (`None`).
    pub fn interrupter(&self) -> Option<Interrupter> {
        match &self.sink {
            Some(s @ Sink::Dev(_)) => Some(Interrupter { unique: self.unique, sink: s.clone() }),
            #[cfg(test)]
            Some(s @ Sink::Test(_)) => Some(Interrupter { unique: self.unique, sink: s.clone() }),
            _ => None,
        }
    }
}

/// An early answer to one request ([`Reply::interrupter`]).
pub struct Interrupter {
    unique: u64,
    sink: Sink,
}

impl Interrupter {
    pub fn answer(self, e: Errno) {
        self.sink.send(self.unique, -e.code(), &[]);
    }
}

impl Drop for Reply {
    fn drop(&mut self) {
        if let Some(s) = self.sink.take() {
            warn!("request {} was dropped unanswered: answering EIO", self.unique);
            s.send(self.unique, -libc::EIO, &[]);
        }
    }
}

macro_rules! typed {
    ($($(#[$m:meta])* $name:ident;)*) => {$(
        $(#[$m])*
        pub struct $name(pub(crate) Reply);
        impl $name {
            pub fn error(self, e: Errno) {
                self.0.error(e)
            }

            /// See [`Reply::interrupter`].
            pub fn interrupter(&self) -> Option<Interrupter> {
                self.0.interrupter()
            }
        }
    )*};
}

typed! {
    /// A name looked up or made: `fuse_entry_out`.
    ReplyEntry;
    /// Attributes: `fuse_attr_out`.
    ReplyAttr;
    /// Bytes (a read, a link target).
    ReplyData;
    /// Nothing but success or an error.
    ReplyEmpty;
    /// An open file or directory: `fuse_open_out`.
    ReplyOpen;
    /// A file made and opened: `fuse_entry_out` and `fuse_open_out`.
    ReplyCreate;
    /// Bytes written (or copied): `fuse_write_out`.
    ReplyWrite;
    /// A conflicting lock, or F_UNLCK: `fuse_lk_out`.
    ReplyLock;
    /// File system usage: `fuse_statfs_out`.
    ReplyStatfs;
    /// An extended attribute's value or the list of names, or the size they need.
    ReplyXattr;
    /// A seek's result: `fuse_lseek_out`.
    ReplyLseek;
}

impl ReplyEntry {
    pub fn entry(self, ttl: &Duration, attr: &FileAttr, generation: Generation) {
        self.entry_with_ttls(ttl, ttl, attr, generation)
    }

    /// Separate lifetimes for the attributes and for the name.
    pub fn entry_with_ttls(self, attr_ttl: &Duration, entry_ttl: &Duration, attr: &FileAttr, generation: Generation) {
        let mut e = Enc::default();
        e.entry(*attr_ttl, *entry_ttl, attr, generation);
        self.0.send(0, &[e.bytes()]);
    }
}

impl ReplyAttr {
    pub fn attr(self, ttl: &Duration, attr: &FileAttr) {
        let (s, n) = ttl_parts(*ttl);
        let mut e = Enc::default();
        e.u64(s).u32(n).u32(0).attr(attr);
        self.0.send(0, &[e.bytes()]);
    }
}

impl ReplyData {
    pub fn data(self, data: &[u8]) {
        self.0.send(0, &[data]);
    }
}

impl ReplyEmpty {
    pub fn ok(self) {
        self.0.ok()
    }
}

impl ReplyOpen {
    pub fn opened(self, fh: FileHandle, flags: FopenFlags) {
        let mut e = Enc::default();
        e.open(fh, flags);
        self.0.send(0, &[e.bytes()]);
    }
}

impl ReplyCreate {
    pub fn created(self, ttl: &Duration, attr: &FileAttr, generation: Generation, fh: FileHandle, flags: FopenFlags) {
        let mut e = Enc::default();
        e.entry(*ttl, *ttl, attr, generation).open(fh, flags);
        self.0.send(0, &[e.bytes()]);
    }
}

impl ReplyWrite {
    pub fn written(self, size: u32) {
        let mut e = Enc::default();
        e.u32(size).u32(0);
        self.0.send(0, &[e.bytes()]);
    }
}

impl ReplyLock {
    pub fn locked(self, start: u64, end: u64, typ: i32, pid: u32) {
        let mut e = Enc::default();
        e.u64(start).u64(end).u32(typ as u32).u32(pid);
        self.0.send(0, &[e.bytes()]);
    }
}

impl ReplyStatfs {
    #[allow(clippy::too_many_arguments)]
    pub fn statfs(
        self,
        blocks: u64,
        bfree: u64,
        bavail: u64,
        files: u64,
        ffree: u64,
        bsize: u32,
        namelen: u32,
        frsize: u32,
    ) {
        let mut e = Enc::default();
        e.u64(blocks).u64(bfree).u64(bavail).u64(files).u64(ffree).u32(bsize).u32(namelen).u32(frsize).u32(0);
        // `spare[6]`.
        e.put(&[0; 24]);
        self.0.send(0, &[e.bytes()]);
    }
}

impl ReplyXattr {
    /// The size the value or list needs (the caller asked with size 0).
    pub fn size(self, size: u32) {
        let mut e = Enc::default();
        e.u32(size).u32(0);
        self.0.send(0, &[e.bytes()]);
    }

    pub fn data(self, data: &[u8]) {
        self.0.send(0, &[data]);
    }
}

impl ReplyLseek {
    pub fn offset(self, offset: i64) {
        self.0.send(0, &[&offset.to_ne_bytes()]);
    }
}

/// A page of directory entries (`struct fuse_dirent` each), at most the
/// size the kernel asked for.
pub struct ReplyDirectory {
    reply: Reply,
    buf: Vec<u8>,
    max: usize,
}

impl ReplyDirectory {
    pub(crate) fn new(reply: Reply, max: usize) -> ReplyDirectory {
        ReplyDirectory { reply, buf: Vec::with_capacity(max.min(64 << 10)), max }
    }

    /// Adds an entry; true when it did not fit (the page is full).
    pub fn add(&mut self, ino: INodeNo, offset: u64, kind: FileType, name: impl AsRef<OsStr>) -> bool {
        let name = name.as_ref().as_bytes();
        let len = (24 + name.len()).next_multiple_of(8);
        if self.buf.len() + len > self.max {
            return true;
        }
        let b = &mut self.buf;
        b.extend_from_slice(&ino.0.to_ne_bytes());
        b.extend_from_slice(&offset.to_ne_bytes());
        b.extend_from_slice(&(name.len() as u32).to_ne_bytes());
        b.extend_from_slice(&(kind.mode_bits() >> 12).to_ne_bytes());
        b.extend_from_slice(name);
        b.resize(b.len().next_multiple_of(8), 0);
        false
    }

    pub fn ok(self) {
        self.reply.send(0, &[&self.buf]);
    }

    pub fn error(self, e: Errno) {
        self.reply.error(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::UNIX_EPOCH;

    fn attr() -> FileAttr {
        FileAttr {
            ino: INodeNo(7),
            size: 4096,
            blocks: 8,
            atime: UNIX_EPOCH,
            mtime: UNIX_EPOCH + Duration::new(5, 6),
            ctime: UNIX_EPOCH,
            kind: FileType::RegularFile,
            perm: 0o644,
            nlink: 1,
            uid: 10,
            gid: 20,
            rdev: 0,
            blksize: 4096,
        }
    }

    #[test]
    fn answers_have_the_kernels_sizes_and_field_places() {
        let mut e = Enc::default();
        e.attr(&attr());
        assert_eq!(e.bytes().len(), 88);
        assert_eq!(u64::from_ne_bytes(e.bytes()[32..40].try_into().unwrap()), 5, "mtime seconds");
        assert_eq!(u32::from_ne_bytes(e.bytes()[52..56].try_into().unwrap()), 6, "mtime nanoseconds");
        assert_eq!(u32::from_ne_bytes(e.bytes()[60..64].try_into().unwrap()), libc::S_IFREG | 0o644, "mode");
        let mut e = Enc::default();
        e.entry(Duration::from_millis(1500), Duration::from_secs(2), &attr(), Generation(0));
        assert_eq!(e.bytes().len(), 128);
        assert_eq!(u64::from_ne_bytes(e.bytes()[16..24].try_into().unwrap()), 2, "entry_valid");
        assert_eq!(u64::from_ne_bytes(e.bytes()[24..32].try_into().unwrap()), 1, "attr_valid");
        assert_eq!(u32::from_ne_bytes(e.bytes()[36..40].try_into().unwrap()), 500_000_000, "attr_valid_nsec");
        let mut e = Enc::default();
        e.open(FileHandle(3), FopenFlags::FOPEN_DIRECT_IO);
        assert_eq!(e.bytes().len(), 16);
    }

    #[test]
    fn an_interrupter_answers_first_and_the_handlers_answer_still_goes_out() {
        let answers = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let reply = ReplyWrite(Reply::new(9, Sink::Test(answers.clone())));
        reply.interrupter().expect("a /dev/fuse-like sink").answer(Errno::EINTR);
        reply.written(5);
        let got = answers.lock().unwrap().clone();
        assert_eq!(got.len(), 2);
        assert_eq!((got[0].0, got[0].1), (9, -libc::EINTR));
        assert_eq!((got[1].0, got[1].1), (9, 0), "the kernel drops this one (the request is gone)");
        let discard = ReplyEmpty(Reply::new(10, Sink::Discard));
        assert!(discard.interrupter().is_none());
        discard.ok();
    }
}
