//! The two ways the I/O and metadata benchmarks reach a file system: plain
//! file system calls on a directory ([`Posix`]: a HiveFS mount, or any local
//! directory for comparison) and the HiveFS native client library
//! ([`Native`]: no FUSE, no kernel). Both are driven from ordinary threads
//! (one per rank); paths are relative to the backend's base directory and
//! use '/' between components. The metadata benchmark's whole-file
//! operations are also futures ([`MdOps`]): a backend with an async runtime
//! of its own runs each rank's phase there as one task, as an application
//! on the async API would, instead of waking the rank's thread from the
//! runtime for every answer.

use hivefs_client::{Client, Ent, Options};
use hivefs_proto::{Caller, HeldSize};
use hivefs_types::attr::{FileKind, Timespec};
use hivefs_types::error::{ErrorCode, FsError};
use hivefs_types::pattern::Pattern;
use rustix::process::{getgid, getuid};
use std::collections::HashMap;
use std::fs::OpenOptions;
use std::future::Future;
use std::io::{Error, ErrorKind};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

pub type IoResult<T> = std::io::Result<T>;

/// A benchmark operation in progress.
pub type OpFuture<'a, T> = Pin<Box<dyn Future<Output = IoResult<T>> + Send + 'a>>;

/// The metadata benchmark's operations, each on a whole file.
pub trait MdOps: Send + Sync {
    /// Creates `rel` (opened with `O_CREAT`), writes `content` at offset 0
    /// unless it is empty, and closes it.
    fn create_file<'a>(&'a self, rel: &'a str, content: &'a [u8]) -> OpFuture<'a, ()>;
    /// The size of `rel` (a `stat`).
    fn stat_file<'a>(&'a self, rel: &'a str) -> OpFuture<'a, u64>;
    /// Opens `rel`, reads into `buf` from offset 0 (all of it unless the file
    /// ends first) and closes it; returns the bytes read.
    fn read_file<'a>(&'a self, rel: &'a str, buf: &'a mut [u8]) -> OpFuture<'a, usize>;
    fn unlink_file<'a>(&'a self, rel: &'a str) -> OpFuture<'a, ()>;
}

/// [`MdOps`] of a backend without a runtime: each future does the work when
/// first polled, through the backend's blocking calls.
pub struct BlockingMd<B: ?Sized>(pub Arc<B>);

impl<B: Backend + ?Sized> MdOps for BlockingMd<B> {
    fn create_file<'a>(&'a self, rel: &'a str, content: &'a [u8]) -> OpFuture<'a, ()> {
        Box::pin(async move {
            let mut h = self.0.open(rel, true, true)?;
            if !content.is_empty() {
                h.write_at(0, content)?;
            }
            h.close()
        })
    }

    fn stat_file<'a>(&'a self, rel: &'a str) -> OpFuture<'a, u64> {
        Box::pin(async move { self.0.stat(rel) })
    }

    fn read_file<'a>(&'a self, rel: &'a str, buf: &'a mut [u8]) -> OpFuture<'a, usize> {
        Box::pin(async move {
            let mut h = self.0.open(rel, false, false)?;
            let n = if buf.is_empty() { 0 } else { h.read_at(0, buf)? };
            h.close()?;
            Ok(n)
        })
    }

    fn unlink_file<'a>(&'a self, rel: &'a str) -> OpFuture<'a, ()> {
        Box::pin(async move { self.0.unlink(rel) })
    }
}

/// File system operations a benchmark rank needs.
pub trait Backend: Send + Sync {
    /// "mount", "native" or "plain": how the numbers were obtained.
    fn kind(&self) -> &'static str;
    /// Where `rel` is, for messages.
    fn describe(&self, rel: &str) -> String;
    fn mkdir(&self, rel: &str) -> IoResult<()>;
    fn rmdir(&self, rel: &str) -> IoResult<()>;
    fn open(&self, rel: &str, create: bool, write: bool) -> IoResult<Box<dyn BenchFile>>;
    /// The size of `rel` (a `stat`).
    fn stat(&self, rel: &str) -> IoResult<u64>;
    fn unlink(&self, rel: &str) -> IoResult<()>;
    /// The runtime a rank's metadata phase runs on as one task, if the
    /// backend has one (see [`MdOps`]).
    fn runtime(&self) -> Option<tokio::runtime::Handle> {
        None
    }
    /// This backend's [`MdOps`].
    fn md_ops(self: Arc<Self>) -> Arc<dyn MdOps>;
}

pub trait BenchFile: Send {
    fn write_at(&mut self, offset: u64, buf: &[u8]) -> IoResult<()>;
    /// Reads into `buf`; returns the bytes read (fewer only at the end of the file).
    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> IoResult<usize>;
    fn sync(&mut self) -> IoResult<()>;
    fn close(self: Box<Self>) -> IoResult<()>;
}

// ------------------------------------------------------------------ posix

/// Plain file system calls under a directory.
pub struct Posix {
    pub base: PathBuf,
    kind: &'static str,
}

impl Posix {
    /// `kind`: "mount" for a HiveFS mount, "plain" for a local directory.
    pub fn new(base: PathBuf, kind: &'static str) -> Posix {
        Posix { base, kind }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.base.join(rel.trim_start_matches('/'))
    }
}

struct PosixFile(std::fs::File);

impl Backend for Posix {
    fn kind(&self) -> &'static str {
        self.kind
    }

    fn describe(&self, rel: &str) -> String {
        self.path(rel).display().to_string()
    }

    fn mkdir(&self, rel: &str) -> IoResult<()> {
        std::fs::create_dir(self.path(rel))
    }

    fn rmdir(&self, rel: &str) -> IoResult<()> {
        std::fs::remove_dir(self.path(rel))
    }

    fn open(&self, rel: &str, create: bool, write: bool) -> IoResult<Box<dyn BenchFile>> {
        let f = OpenOptions::new().read(true).write(write).create(create).mode(0o644).open(self.path(rel))?;
        Ok(Box::new(PosixFile(f)))
    }

    fn stat(&self, rel: &str) -> IoResult<u64> {
        Ok(std::fs::metadata(self.path(rel))?.len())
    }

    fn unlink(&self, rel: &str) -> IoResult<()> {
        std::fs::remove_file(self.path(rel))
    }

    fn md_ops(self: Arc<Self>) -> Arc<dyn MdOps> {
        Arc::new(BlockingMd(self))
    }
}

impl BenchFile for PosixFile {
    fn write_at(&mut self, offset: u64, buf: &[u8]) -> IoResult<()> {
        self.0.write_all_at(buf, offset)
    }

    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> IoResult<usize> {
        let mut done = 0;
        while done < buf.len() {
            match self.0.read_at(&mut buf[done..], offset + done as u64)? {
                0 => break,
                n => done += n,
            }
        }
        Ok(done)
    }

    fn sync(&mut self) -> IoResult<()> {
        self.0.sync_all()
    }

    fn close(self: Box<Self>) -> IoResult<()> {
        // close(2) reports errors of a network file system's final flush,
        // which dropping the file would ignore.
        nix::unistd::close(self.0).map_err(Error::from)
    }
}

// ------------------------------------------------------------------ native

/// The HiveFS native client, driven from rank threads through a runtime of its own.
pub struct Native {
    client: Arc<Client>,
    rt: tokio::runtime::Runtime,
    /// Entries of directories by path (relative to the root, no leading '/').
    dirs: Mutex<HashMap<String, Ent>>,
    base: String,
    caller: Caller,
}

fn fs_io(e: FsError) -> Error {
    let kind = match e.code {
        ErrorCode::NotFound => ErrorKind::NotFound,
        ErrorCode::Exists => ErrorKind::AlreadyExists,
        ErrorCode::AccessDenied | ErrorCode::NotPermitted => ErrorKind::PermissionDenied,
        ErrorCode::TimedOut => ErrorKind::TimedOut,
        _ => ErrorKind::Other,
    };
    Error::new(kind, e.to_string())
}

fn now_ts() -> Timespec {
    let d = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    Timespec { sec: d.as_secs() as i64, nsec: d.subsec_nanos() }
}

fn split(rel: &str) -> (String, String) {
    let rel = rel.trim_matches('/');
    match rel.rsplit_once('/') {
        Some((p, n)) => (p.to_string(), n.to_string()),
        None => (String::new(), rel.to_string()),
    }
}

impl Native {
    /// Connects to the file system; `base` is a directory path from its root.
    pub fn connect(opts: Options, base: &str) -> IoResult<Native> {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
        let mgmtd = opts.mgmtd.clone();
        let client = rt
            .block_on(Client::connect(opts))
            .map_err(|e| Error::other(format!("cannot connect to HiveFS at mgmtd {mgmtd}: {e}")))?;
        // Leases on (nothing here caches attributes, so a revocation needs
        // no action): files made here then hold their size until their
        // release, as the mount's do (`Client::create_open_held`).
        rt.block_on(async { client.enable_leases(Box::new(|_| {})) });
        let caller = Caller::new(getuid().as_raw(), getgid().as_raw());
        let n =
            Native { client, rt, dirs: Mutex::new(HashMap::new()), base: base.trim_matches('/').to_string(), caller };
        n.rt.block_on(n.dir(&n.base))?;
        Ok(n)
    }

    pub fn client(&self) -> &Arc<Client> {
        &self.client
    }

    fn full(&self, rel: &str) -> String {
        let rel = rel.trim_matches('/');
        match (self.base.is_empty(), rel.is_empty()) {
            (true, _) => rel.to_string(),
            (false, true) => self.base.clone(),
            (false, false) => format!("{}/{rel}", self.base),
        }
    }

    /// The entry of directory `path` (from the root), resolved once and then remembered.
    async fn dir(&self, path: &str) -> IoResult<Ent> {
        if let Some(e) = self.dirs.lock().expect("dir cache").get(path) {
            return Ok(*e);
        }
        let a = self.client.resolve(path).await.map_err(fs_io)?;
        if a.kind != FileKind::Dir {
            return Err(Error::other(format!("/{path} is not a directory")));
        }
        let e = Ent::from(&a);
        self.dirs.lock().expect("dir cache").insert(path.to_string(), e);
        Ok(e)
    }

    /// Parent directory entry and the last component of `rel`.
    async fn parent(&self, rel: &str) -> IoResult<(Ent, String)> {
        let (p, name) = split(&self.full(rel));
        Ok((self.dir(&p).await?, name))
    }

    async fn open_file(&self, rel: &str, create: bool, write: bool) -> IoResult<NativeFile> {
        let (parent, name) = self.parent(rel).await?;
        let c = &self.client;
        let (ent, attr, held) = if create {
            // One request creates (or finds) and opens it, as the mount does.
            let (a, held) =
                c.create_open_held(parent, name.as_bytes(), 0o644, false, self.caller).await.map_err(fs_io)?;
            (Ent::from(&a), a, held)
        } else {
            let ent = Ent::from(&c.lookup(parent, name.as_bytes()).await.map_err(fs_io)?);
            (ent, c.open(ent, write).await.map_err(fs_io)?, false)
        };
        let Some(pattern) = attr.pattern.clone() else {
            match held {
                true => c.release_held_later(ent, None),
                false => drop(c.release(ent, write).await),
            }
            return Err(Error::other(format!("{} has no stripe pattern", self.describe(rel))));
        };
        Ok(NativeFile {
            client: c.clone(),
            handle: self.rt.handle().clone(),
            ent,
            pattern,
            write,
            dirty: false,
            size: attr.size,
            seen: Some(attr.ctime),
            held,
            mtime: None,
        })
    }
}

impl Drop for Native {
    /// Releases still on their way are sent before the client goes.
    fn drop(&mut self) {
        // The timer is made inside the runtime.
        let flush =
            async { tokio::time::timeout(std::time::Duration::from_secs(10), self.client.flush_releases()).await };
        if self.rt.block_on(flush).is_err() {
            tracing::warn!("releases of closed files were not all answered within 10 s");
        }
    }
}

struct NativeFile {
    client: Arc<Client>,
    handle: tokio::runtime::Handle,
    ent: Ent,
    pattern: Pattern,
    write: bool,
    dirty: bool,
    size: u64,
    /// The file's ctime as last seen, while `size` is exactly where this
    /// handle's writes end (see `Client::report_size`).
    seen: Option<hivefs_types::attr::Timespec>,
    /// Made with `CreateOpenHeld`: the size goes with the release.
    held: bool,
    /// The time of the last write.
    mtime: Option<Timespec>,
}

impl NativeFile {
    async fn publish_size(&mut self) -> IoResult<()> {
        if self.dirty {
            let report = self.client.report_size(self.ent, &self.pattern, self.size, self.seen, now_ts());
            (_, self.seen) = report.await.map_err(fs_io)?;
            self.dirty = false;
        }
        Ok(())
    }

    async fn write(&mut self, offset: u64, buf: &[u8]) -> IoResult<()> {
        if !self.write {
            return Err(Error::new(ErrorKind::PermissionDenied, "file is open for reading only"));
        }
        self.dirty = true;
        let r = self.client.write(&self.pattern, self.ent.id, offset, buf).await;
        if r.is_err() {
            // It may have left bytes past `size`.
            self.seen = None;
        }
        r.map_err(fs_io)?;
        self.size = self.size.max(offset + buf.len() as u64);
        if self.held {
            self.mtime = Some(now_ts());
        }
        Ok(())
    }

    async fn read(&mut self, offset: u64, buf: &mut [u8]) -> IoResult<usize> {
        let data = self.client.read(&self.pattern, self.ent.id, offset, buf.len(), self.size).await.map_err(fs_io)?;
        buf[..data.len()].copy_from_slice(&data);
        Ok(data.len())
    }

    /// Publishes the size and releases the file (in the background); a
    /// handle that holds the size sends it with the release instead.
    async fn finish(mut self) -> IoResult<()> {
        let published = if self.held { Ok(()) } else { self.publish_size().await };
        // In the background, gathered with other closes, as the mount does.
        let _rt = self.handle.enter();
        if self.held {
            let size = self.dirty.then(|| HeldSize {
                size: self.size,
                mtime: self.mtime.unwrap_or_else(now_ts),
                seen: self.seen,
            });
            self.client.release_held_later(self.ent, size.map(|s| (s, &self.pattern)));
        } else {
            self.client.release_later(self.ent.id, self.ent.owner);
        }
        published
    }
}

impl Backend for Native {
    fn kind(&self) -> &'static str {
        "native"
    }

    fn describe(&self, rel: &str) -> String {
        format!("hivefs:/{}", self.full(rel))
    }

    fn mkdir(&self, rel: &str) -> IoResult<()> {
        self.rt.block_on(async {
            let (parent, name) = self.parent(rel).await?;
            let a = self.client.mkdir(parent, name.as_bytes(), 0o755, self.caller).await.map_err(fs_io)?;
            self.dirs.lock().expect("dir cache").insert(self.full(rel), Ent::from(&a));
            Ok(())
        })
    }

    fn rmdir(&self, rel: &str) -> IoResult<()> {
        self.rt.block_on(async {
            let (parent, name) = self.parent(rel).await?;
            self.client.rmdir(parent, name.as_bytes()).await.map_err(fs_io)?;
            self.dirs.lock().expect("dir cache").remove(&self.full(rel));
            Ok(())
        })
    }

    fn open(&self, rel: &str, create: bool, write: bool) -> IoResult<Box<dyn BenchFile>> {
        Ok(Box::new(self.rt.block_on(self.open_file(rel, create, write))?))
    }

    fn stat(&self, rel: &str) -> IoResult<u64> {
        self.rt.block_on(self.stat_file(rel))
    }

    fn unlink(&self, rel: &str) -> IoResult<()> {
        self.rt.block_on(self.unlink_file(rel))
    }

    fn runtime(&self) -> Option<tokio::runtime::Handle> {
        Some(self.rt.handle().clone())
    }

    fn md_ops(self: Arc<Self>) -> Arc<dyn MdOps> {
        self
    }
}

impl MdOps for Native {
    fn create_file<'a>(&'a self, rel: &'a str, content: &'a [u8]) -> OpFuture<'a, ()> {
        Box::pin(async move {
            let mut f = self.open_file(rel, true, true).await?;
            if !content.is_empty() {
                f.write(0, content).await?;
            }
            f.finish().await
        })
    }

    fn stat_file<'a>(&'a self, rel: &'a str) -> OpFuture<'a, u64> {
        Box::pin(async move {
            let (parent, name) = self.parent(rel).await?;
            Ok(self.client.lookup(parent, name.as_bytes()).await.map_err(fs_io)?.size)
        })
    }

    fn read_file<'a>(&'a self, rel: &'a str, buf: &'a mut [u8]) -> OpFuture<'a, usize> {
        Box::pin(async move {
            let mut f = self.open_file(rel, false, false).await?;
            let n = if buf.is_empty() { 0 } else { f.read(0, buf).await? };
            f.finish().await?;
            Ok(n)
        })
    }

    fn unlink_file<'a>(&'a self, rel: &'a str) -> OpFuture<'a, ()> {
        Box::pin(async move {
            let (parent, name) = self.parent(rel).await?;
            self.client.unlink(parent, name.as_bytes()).await.map_err(fs_io)
        })
    }
}

impl BenchFile for NativeFile {
    fn write_at(&mut self, offset: u64, buf: &[u8]) -> IoResult<()> {
        let h = self.handle.clone();
        h.block_on(self.write(offset, buf))
    }

    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> IoResult<usize> {
        let h = self.handle.clone();
        h.block_on(self.read(offset, buf))
    }

    fn sync(&mut self) -> IoResult<()> {
        let h = self.handle.clone();
        h.block_on(async {
            self.client.fsync(&self.pattern, self.ent.id).await.map_err(fs_io)?;
            self.publish_size().await
        })
    }

    fn close(self: Box<Self>) -> IoResult<()> {
        let h = self.handle.clone();
        h.block_on(self.finish())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_paths() {
        assert_eq!(split("a/b/c"), ("a/b".to_string(), "c".to_string()));
        assert_eq!(split("/c"), (String::new(), "c".to_string()));
    }

    #[test]
    fn posix_backend_round_trip() {
        let d = tempfile::tempdir().unwrap();
        let b = Posix::new(d.path().to_path_buf(), "plain");
        b.mkdir("x").unwrap();
        let mut f = b.open("x/f", true, true).unwrap();
        f.write_at(3, b"abc").unwrap();
        f.sync().unwrap();
        f.close().unwrap();
        assert_eq!(b.stat("x/f").unwrap(), 6);
        let mut f = b.open("x/f", false, false).unwrap();
        let mut buf = [9u8; 10];
        assert_eq!(f.read_at(0, &mut buf).unwrap(), 6);
        assert_eq!(&buf[..6], b"\0\0\0abc");
        f.close().unwrap();
        b.unlink("x/f").unwrap();
        b.rmdir("x").unwrap();
        assert!(!d.path().join("x").exists());
    }
}
