//! `getlk`/`setlk` and the lock clean-up on close, over the metadata nodes'
//! global lock tables (mount option `global_file_locks`).
//!
//! The kernel sends `flock(2)` as a whole-file `setlk` whose owner is the
//! open file description, marked `FUSE_LK_FLOCK`: kept as a
//! [`LockKind::Flock`] lock, which the metadata node keeps apart from the
//! [`LockKind::Posix`] locks of `fcntl(2)` (per process, or per open file
//! description for OFD locks). A flock and an fcntl lock of one file
//! therefore do not conflict, as on Linux's local file systems.

use super::interrupts::fatal_signal_pending;
use super::*;

/// A lock request from the kernel: its owner, range, type (`F_RDLCK`,
/// `F_WRLCK`, `F_UNLCK`), the caller's pid, and whether it is a flock.
pub(super) struct KernelLock {
    pub(super) owner: LockOwner,
    pub(super) start: u64,
    pub(super) end: u64,
    pub(super) typ: i32,
    pub(super) pid: u32,
    pub(super) flock: bool,
}

impl KernelLock {
    /// The lock as the metadata node keeps it; `client` is filled in by the client library.
    fn file_lock(&self) -> FsResult<FileLock> {
        let exclusive = match self.typ {
            libc::F_RDLCK | libc::F_UNLCK => false,
            libc::F_WRLCK => true,
            t => return Err(FsError::new(ErrorCode::Invalid, format!("unknown lock type {t}"))),
        };
        let kind = if self.flock { LockKind::Flock } else { LockKind::Posix };
        let (owner, pid, start, end) = (self.owner.0, self.pid, self.start, self.end);
        Ok(FileLock { kind, client: 0, owner, pid, start, end, exclusive })
    }
}

impl Inner {
    /// Drops the locks of `kind` of `owner` on `ent` (on close: fcntl
    /// locks of the closing process; at the last close of an open file
    /// description also its flock and OFD locks).
    pub(super) async fn drop_locks(&self, ent: Ent, owner: LockOwner, kind: LockKind) {
        if !self.global_locks || !self.locked.lock().expect("locked").contains(&ent.id) {
            return;
        }
        let all = FileLock { kind, client: 0, owner: owner.0, pid: 0, start: 0, end: u64::MAX, exclusive: false };
        if let Err(e) = self.client.unlock(ent, all).await {
            // The metadata node drops them when this mount's lease ends.
            warn!("releasing the locks of owner {:x} on {} failed: {e}", owner.0, ent.id);
        }
    }

    /// Forgets that `id` had locks once this mount has no handle on it left.
    pub(super) fn forget_locked(&self, id: EntryId) {
        let open = self.files.lock().expect("files").values().any(|f| f.ent.id == id);
        if !open {
            self.locked.lock().expect("locked").remove(&id);
        }
    }
}

pub(super) fn setlk(fs: &HiveFs, req: &Request, ino: INodeNo, l: KernelLock, sleep: bool, reply: ReplyEmpty) {
    let inner = fs.inner.clone();
    let waiter = req.pid();
    let unique = req.unique();
    // Registered on the thread that read the request, before any wait.
    let interrupt = sleep.then(|| fs.inner.waits.lock().expect("interrupt waits").register(unique));
    crate::lazy::start(&fs.inner.rt, async move {
        let r: FsResult<bool> = async {
            let ent = inner.ent(ino)?;
            let lock = l.file_lock()?;
            let (start, end) = (l.start, l.end);
            // Writes made under a lock are on the targets before it goes
            // (and before a new one is taken): whoever locks next sees them.
            inner.settle(ent.id).await?;
            if l.typ == libc::F_UNLCK {
                inner.client.unlock(ent, lock).await?;
                return Ok(true);
            }
            inner.locked.lock().expect("locked").insert(ent.id);
            let give_up = || fatal_signal_pending(waiter);
            let refused = inner.client.lock(ent, lock, sleep, give_up, interrupt.as_deref()).await?;
            if let Some(c) = &refused {
                debug!(
                    "lock {start}..={end} on {} refused: held by client {:016x} owner {:x}",
                    ent.id, c.client, c.owner
                );
            }
            Ok(refused.is_none())
        }
        .await;
        if interrupt.is_some() {
            inner.waits.lock().expect("interrupt waits").done(unique);
        }
        match r {
            Ok(true) => reply.ok(),
            Ok(false) => reply.error(Errno::from_i32(libc::EAGAIN)),
            // Not granted, and the caller got a signal: as a local file system answers.
            Err(e) if interrupt.as_ref().is_some_and(|i| i.is_set()) => {
                debug!("setlk interrupted: {e}");
                reply.error(Errno::from_i32(libc::EINTR));
            }
            Err(e) => {
                debug!("setlk failed: {e}");
                reply.error(errno(&e));
            }
        }
    });
}

pub(super) fn getlk(fs: &HiveFs, ino: INodeNo, l: KernelLock, reply: ReplyLock) {
    let inner = fs.inner.clone();
    crate::lazy::start(&fs.inner.rt, async move {
        let r: FsResult<Option<FileLock>> = async {
            let ent = inner.ent(ino)?;
            inner.client.test_lock(ent, l.file_lock()?).await
        }
        .await;
        match r {
            Ok(Some(c)) => {
                let t = if c.exclusive { libc::F_WRLCK } else { libc::F_RDLCK };
                // A pid of another machine means nothing here.
                let pid = if c.client == inner.client.client_id() { c.pid } else { 0 };
                reply.locked(c.start, c.end, t, pid)
            }
            Ok(None) => reply.locked(l.start, l.end, libc::F_UNLCK, 0),
            Err(e) => {
                debug!("getlk failed: {e}");
                reply.error(errno(&e));
            }
        }
    });
}
