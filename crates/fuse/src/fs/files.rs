//! Open files of the mount: their handles, the sizes and write-back of
//! files open for writing here, quotas of their growth, publishing sizes
//! to the metadata node, and opening (with O_TRUNC and the permission check
//! of a create that found the file). The request handlers in `fs.rs` call
//! these; this module answers no FUSE request itself.

use super::*;

pub(super) struct OpenFile {
    pub(super) ent: Ent,
    pub(super) pattern: Pattern,
    pub(super) write: bool,
    /// ctime, mtime and size at this open equal those at the file's previous open
    /// through this mount (its cached pages may be kept).
    pub(super) unchanged: bool,
    /// Writes completed since the size was last published. Set after a
    /// write returns (so a publish running meanwhile cannot clear it for a
    /// write it did not see), cleared by the publish that reports it.
    pub(super) dirty: AtomicBool,
    /// Held across a publish: a flush that finds another publish running
    /// (a forked child closing its inherited descriptor flushes the same
    /// handle) waits for it, so every close returns after the size of the
    /// writes before it is on the metadata node.
    pub(super) publishing: tokio::sync::Mutex<()>,
    /// The file had suid or group-executable sgid when opened: the first
    /// write by an unprivileged caller clears them (the kernel leaves this
    /// to the file system for direct I/O).
    pub(super) kill_privs: AtomicBool,
    /// Access times: reported once for this handle (relatime); a report in
    /// flight, and reads that came in meanwhile (strictatime).
    pub(super) atime_sent: AtomicBool,
    pub(super) atime_busy: AtomicBool,
    pub(super) atime_again: AtomicBool,
    /// Lock owners that set locks through this handle, with the kind of
    /// lock each set (flock or fcntl). Its release (the last close of the
    /// open file description) drops them: open file description locks
    /// (F_OFD_SETLK) are owned by the description, and the kernel does not
    /// say at release which owners those are.
    pub(super) lock_owners: Mutex<Vec<(u64, LockKind)>>,
    /// Held shared by writes, allocations and copies into the file through
    /// this handle, taken whole by its release: the kernel sends a release
    /// only after its requests were answered, but one answered early for a
    /// caller being killed (`interrupts`) may still be writing, and the
    /// release publishes the size after it.
    pub(super) changing: tokio::sync::RwLock<()>,
    /// Made and opened with `CreateOpenHeld`: the size its writes leave
    /// goes to the metadata node with its release, not at each close
    /// (`Client::release_held_later`). Set before the kernel hears of it.
    pub(super) held: AtomicBool,
}

/// Sizes known locally for files this mount has open for writing: writes
/// extend the file before the metadata node hears of it (on close/fsync).
#[derive(Default)]
pub(super) struct LocalSize {
    pub(super) size: u64,
    pub(super) writers: u32,
    /// Cache mode paged: the file's `security.capability` (`Some(None)`: it
    /// has none), once asked for since the last open for writing.
    pub(super) caps: Option<Option<Vec<u8>>>,
    /// Time of the last write through this mount, reported as mtime and
    /// ctime until the metadata node hears of the writes.
    pub(super) mtime: Option<Timespec>,
    /// The file's owner and group at open: whose space quota its growth
    /// uses, and the storage pool of its pattern (pool quotas).
    pub(super) owner: (u32, u32),
    pub(super) pool: Option<hivefs_types::ids::PoolId>,
    /// The size the metadata node knows (its quota usage counts it); growth
    /// beyond it is this mount's to count against quotas.
    pub(super) published: u64,
    /// Cache mode buffered: the file's writes not yet on the targets.
    pub(super) wb: Option<Arc<WriteBack>>,
    /// The file's ctime as this mount last saw it, while `size` is exactly
    /// where this mount's own writes since then end: a close reports that
    /// size unless the file changed meanwhile (`Client::update_size_if`)
    /// instead of asking every target for its chunk's length. `None` once
    /// a write failed (it may have left bytes past `size`) or the file
    /// changed under this mount: sizes come from the chunk files until the
    /// last writer here closes.
    pub(super) seen_ctime: Option<Timespec>,
}

impl Inner {
    pub(super) fn note_write(&self, id: EntryId, end: u64) {
        if let Some(l) = self.local_sizes.lock().expect("sizes").get_mut(&id) {
            l.size = l.size.max(end);
            l.mtime = Some(system_to_ts(SystemTime::now()));
        }
    }

    /// A handle of `a` (the attributes its open answered with) opened for writing.
    pub(super) fn add_writer(&self, a: &EntryAttr, pattern: &Pattern) {
        let (id, size, owner) = (a.id, a.size, (a.uid, a.gid));
        let pool = self.client.pool_of(pattern);
        let mut m = self.local_sizes.lock().expect("sizes");
        let l = m.entry(id).or_default();
        if l.writers == 0 {
            l.seen_ctime = Some(a.ctime);
            l.published = size;
            if self.cache_mode == CacheMode::Buffered {
                let (c, rt) = (self.client.clone(), self.rt.clone());
                let budget = self.writeback_budget.clone();
                l.wb = Some(WriteBack::new(c, pattern.clone(), id, self.writeback, budget, rt));
            }
        }
        if l.seen_ctime != Some(a.ctime) {
            // Changed since this mount looked: by whom, and how, is not known.
            l.seen_ctime = None;
        }
        l.writers += 1;
        l.owner = owner;
        l.pool = pool;
        l.size = l.size.max(size);
        // Each open asks again (close-to-open).
        l.caps = None;
    }

    pub(super) fn drop_writer(&self, id: EntryId) {
        let mut m = self.local_sizes.lock().expect("sizes");
        if let Some(l) = m.get_mut(&id) {
            l.writers -= 1;
            if l.writers == 0 {
                m.remove(&id);
            }
        }
    }

    /// A setattr set `id`'s mtime: the writes before it were published
    /// (`publish_before_times`), so their time no longer shows over the one
    /// set (until the next write).
    pub(super) fn times_set(&self, id: EntryId) {
        if let Some(l) = self.local_sizes.lock().expect("sizes").get_mut(&id) {
            l.mtime = None;
        }
    }

    pub(super) fn set_local_size(&self, id: EntryId, size: u64) {
        if let Some(l) = self.local_sizes.lock().expect("sizes").get_mut(&id) {
            l.size = size;
            l.published = size;
        }
    }

    /// A write, allocation or copy into `id` failed (it may have left bytes
    /// past what this mount knows): from now on its size is read off the
    /// chunk files (see `LocalSize::seen_ctime`). Changes of the file's
    /// attributes need no call: they move its ctime, which the metadata
    /// node checks.
    pub(super) fn size_unsure(&self, id: EntryId) {
        if let Some(l) = self.local_sizes.lock().expect("sizes").get_mut(&id) {
            l.seen_ctime = None;
        }
    }

    /// Cache mode buffered: file `id`'s write-back, while this mount has
    /// it open for writing.
    pub(super) fn write_back(&self, id: EntryId) -> Option<Arc<WriteBack>> {
        if self.cache_mode != CacheMode::Buffered {
            return None;
        }
        self.local_sizes.lock().expect("sizes").get(&id).and_then(|l| l.wb.clone())
    }

    /// Cache mode buffered: sends file `id`'s buffered writes to the targets
    /// and waits for them (before reads, truncation, locks, fsync and close);
    /// a failed earlier flush's error.
    pub(super) async fn settle(&self, id: EntryId) -> FsResult<()> {
        match self.write_back(id) {
            Some(wb) => wb.flush().await,
            None => Ok(()),
        }
    }

    /// [`Inner::settle`] of the file behind `ino`, if this mount knows it.
    pub(super) async fn settle_ino(&self, ino: INodeNo) -> FsResult<()> {
        match self.ent(ino) {
            Ok(e) => self.settle(e.id).await,
            Err(_) => Ok(()),
        }
    }

    /// Refuses growing file `id` to `end` when its owner's or group's space
    /// quota has no room for the growth plus what this mount has written
    /// beyond the sizes the metadata nodes know (`hivefs_client::quota`).
    pub(super) fn check_quota(&self, id: EntryId, end: u64) -> FsResult<()> {
        if !self.client.quota().any() {
            return Ok(());
        }
        let m = self.local_sizes.lock().expect("sizes");
        let Some(l) = m.get(&id) else { return Ok(()) };
        self.check_growth(&m, l.owner, l.pool, l.size, end)
    }

    /// A truncate of `ino` to `size`: refused with EDQUOT, as a write to
    /// that length would be, when it grows a file beyond its owner's room
    /// (space is counted as file length).
    pub(super) async fn check_truncate(&self, ino: INodeNo, size: u64) -> FsResult<()> {
        if !self.client.quota().any() {
            return Ok(());
        }
        let id = self.ent(ino)?.id;
        {
            let m = self.local_sizes.lock().expect("sizes");
            if let Some(l) = m.get(&id) {
                return self.check_growth(&m, l.owner, l.pool, l.size, size);
            }
        }
        let a = self.on_ent(ino, |e| self.client.getattr(e)).await?;
        if a.kind != FileKind::File {
            return Ok(());
        }
        let pool = a.pattern.as_ref().and_then(|p| self.client.pool_of(p));
        self.check_growth(&self.local_sizes.lock().expect("sizes"), (a.uid, a.gid), pool, a.size, size)
    }

    /// Whether a file of `owner` in `pool` may grow from `size` to `end`;
    /// `m`: this mount's files open for writing (their unreported growth counts).
    pub(super) fn check_growth(
        &self,
        m: &HashMap<EntryId, LocalSize>,
        owner: (u32, u32),
        pool: Option<PoolId>,
        size: u64,
        end: u64,
    ) -> FsResult<()> {
        if end <= size {
            return Ok(());
        }
        let q = self.client.quota().get();
        let ((uid, gid), grow) = (owner, end - size);
        let [user, group] = quota::owners(uid, gid);
        let in_pool = pool.into_iter().flat_map(|p| [(user, Some(p)), (group, Some(p))]);
        for key in [(user, None), (group, None)].into_iter().chain(in_pool) {
            if q.contains_key(&key) {
                // What this mount has written for the same user or group (and pool) and not reported.
                let same = |o: (u32, u32)| if key.0 == user { o.0 == uid } else { o.1 == gid };
                let written: u64 = m
                    .values()
                    .filter(|o| same(o.owner) && (key.1.is_none() || o.pool == key.1))
                    .map(|o| o.size.saturating_sub(o.published))
                    .sum();
                let reported = self.client.quota().unsummed(same, key.1);
                quota::check_space(&q, key, written + reported, grow)?;
            }
        }
        Ok(())
    }

    /// Publishes the size of every handle of `ino` with unpublished writes.
    pub(super) async fn publish_before_times(&self, ino: INodeNo) -> FsResult<()> {
        let Ok(e) = self.ent(ino) else { return Ok(()) };
        let dirty: Vec<Arc<OpenFile>> = self
            .files
            .lock()
            .expect("open files")
            .values()
            .filter(|f| f.ent.id == e.id && f.dirty.load(Ordering::Acquire))
            .cloned()
            .collect();
        for f in dirty {
            self.publish_size(&f).await?;
        }
        // And sizes released here that are still on their way.
        self.wait_releases(Some(e.id)).await;
        self.client.wait_owed(e.id).await;
        Ok(())
    }

    /// Whether closing `f` has nothing to send or wait for: no buffered
    /// writes of the file, no global locks of it taken through this mount,
    /// no size to publish and no publish running. A flush or release of
    /// such a handle is answered at once, on the thread that read it from
    /// the kernel (no hand-over to the runtime, no wake-up).
    pub(super) fn quiet_close(&self, f: &OpenFile) -> bool {
        if self.write_back(f.ent.id).is_some() {
            return false;
        }
        if self.global_locks && self.locked.lock().expect("locked").contains(&f.ent.id) {
            return false;
        }
        // Held while looking, so a publish that cleared `dirty` has ended.
        let Ok(_none_running) = f.publishing.try_lock() else { return false };
        // A handle that holds its file's size reports it with its release.
        f.held.load(Ordering::Acquire) || !f.dirty.load(Ordering::Acquire)
    }

    /// At the release of a handle that holds its file's size: that size,
    /// when writes through it are not reported yet (counted as reported
    /// for quotas from now on).
    pub(super) fn held_size(&self, f: &OpenFile) -> Option<HeldSize> {
        if !f.dirty.swap(false, Ordering::AcqRel) {
            return None;
        }
        let mut m = self.local_sizes.lock().expect("sizes");
        let l = m.get_mut(&f.ent.id)?;
        self.client.quota().note_reported(l.owner, l.pool, l.size.saturating_sub(l.published));
        l.published = l.size;
        let s = HeldSize {
            size: l.size,
            mtime: l.mtime.unwrap_or_else(|| system_to_ts(SystemTime::now())),
            seen: l.seen_ctime,
        };
        // The node's ctime moves when it lands: a later report of other
        // handles here reads the size off the chunk files.
        l.seen_ctime = None;
        Some(s)
    }

    /// After writes: tells the metadata node the file's size. That is where
    /// this mount's own writes end when nothing changed the file since it
    /// looked (one request), else the size computed from the chunk files
    /// (a request per storage node first).
    pub(super) async fn publish_size(&self, f: &OpenFile) -> FsResult<()> {
        let _one_at_a_time = f.publishing.lock().await;
        // Buffered writes first: the size is read off the chunk files.
        if let Err(e) = self.settle(f.ent.id).await {
            self.size_unsure(f.ent.id);
            return Err(e);
        }
        if !f.dirty.swap(false, Ordering::AcqRel) {
            return Ok(());
        }
        let now = system_to_ts(SystemTime::now());
        let (own_end, seen) =
            self.local_sizes.lock().expect("sizes").get(&f.ent.id).map_or((0, None), |l| (l.size, l.seen_ctime));
        let r = self.client.report_size(f.ent, &f.pattern, own_end, seen, now).await;
        if r.is_err() {
            f.dirty.store(true, Ordering::Release);
        }
        let (size, seen) = r?;
        if let Some(l) = self.local_sizes.lock().expect("sizes").get_mut(&f.ent.id) {
            self.client.quota().note_reported(l.owner, l.pool, size.saturating_sub(l.published));
            l.published = size;
            // Unless a write failed meanwhile.
            l.seen_ctime = seen.filter(|_| l.seen_ctime.is_some());
        }
        // The metadata node does not revoke the writer's own lease.
        self.drop_kernel_attrs(f.ent.id);
        Ok(())
    }

    pub(super) async fn open_file(&self, ent: Ent, flags: i32, c: Caller) -> FsResult<(u64, Arc<OpenFile>)> {
        let acc = flags & libc::O_ACCMODE;
        let write = acc == libc::O_WRONLY || acc == libc::O_RDWR;
        let attr = self.client.open(ent, write).await?;
        self.opened(ent, attr, flags, c).await
    }

    /// Opens the existing entry `name` of `parent` for a create that found
    /// it (no O_EXCL), checking the caller's access as the kernel would for
    /// an open: its mode bits, and its access ACL when ACLs are on. Returns
    /// the attributes of the file, counted open on its metadata node.
    pub(super) async fn open_existing(
        &self,
        parent: Ent,
        name: &[u8],
        flags: i32,
        c: Caller,
        pid: u32,
    ) -> FsResult<EntryAttr> {
        let a = self.client.lookup(parent, name).await?;
        match a.kind {
            FileKind::File => {}
            FileKind::Dir => return Err(FsError::new(ErrorCode::IsDir, format!("{} is a directory", a.id))),
            _ => return Err(FsError::new(ErrorCode::Exists, format!("{} exists and is not a regular file", a.id))),
        }
        let acc = flags & libc::O_ACCMODE;
        let write = acc == libc::O_WRONLY || acc == libc::O_RDWR;
        let want = match acc {
            libc::O_WRONLY => 2,
            libc::O_RDWR => 6,
            _ => 4,
        } | if flags & libc::O_TRUNC != 0 { 2 } else { 0 };
        let ent = Ent::from(&a);
        let acl = if self.acl.load(Ordering::Relaxed) && c.uid != 0 {
            match self.client.getxattr(ent, acl::XATTR_ACCESS).await {
                Ok(v) => Some(acl::Acl::decode(&v).map_err(|e| {
                    FsError::new(ErrorCode::Io, format!("{}: stored access ACL is not valid: {e}", a.id))
                })?),
                Err(e) if e.code == ErrorCode::NoData => None,
                Err(e) => return Err(e),
            }
        } else {
            None
        };
        let groups = if c.uid == 0 { Vec::new() } else { groups_of(pid, c.gid) };
        let who = acl::Asker { uid: c.uid, groups: &groups };
        if !acl::permits(a.mode, (a.uid, a.gid), acl.as_ref(), &who, want) {
            return Err(FsError::new(
                ErrorCode::AccessDenied,
                format!("user {} may not open {} (mode {:o}) this way", c.uid, a.id, a.mode & 0o7777),
            ));
        }
        self.client.open(ent, write).await
    }

    /// Sets up the handle of a file the metadata node counted open (`attr`
    /// are its fresh attributes); O_TRUNC truncates.
    pub(super) async fn opened(
        &self,
        ent: Ent,
        mut attr: EntryAttr,
        flags: i32,
        c: Caller,
    ) -> FsResult<(u64, Arc<OpenFile>)> {
        let acc = flags & libc::O_ACCMODE;
        let write = acc == libc::O_WRONLY || acc == libc::O_RDWR;
        let truncate = write && flags & libc::O_TRUNC != 0;
        if truncate {
            // As Linux: O_TRUNC updates mtime and ctime even of an empty
            // file, and an unprivileged truncation drops suid/sgid. The size
            // this mount wrote and has not published counts too.
            let local = self.local_sizes.lock().expect("sizes").get(&ent.id).map_or(0, |l| l.size);
            let set = SetAttr {
                size: (attr.size != 0 || local != 0).then_some(0),
                mtime: Some(SetTime::Now),
                mode: (c.uid != 0 && kills_privs(attr.mode)).then(|| without_privs(attr.mode)),
                ..Default::default()
            };
            self.client.note_other_write(ent.id);
            // A size released here and still on its way would land over the truncation.
            self.wait_releases(Some(ent.id)).await;
            self.client.wait_owed(ent.id).await;
            // This mount's buffered writes land first, or after the truncation.
            if let Err(e) = self.settle(ent.id).await {
                let _ = self.client.release(ent, write).await;
                return Err(e);
            }
            attr = match self.client.setattr(ent, set, c).await {
                Ok(a) => a,
                Err(e) => {
                    let _ = self.client.release(ent, write).await;
                    return Err(e);
                }
            };
        }
        let Some(pattern) = attr.pattern.clone() else {
            let _ = self.client.release(ent, write).await;
            return Err(FsError::new(ErrorCode::Invalid, format!("{} has no stripe pattern", ent.id)));
        };
        if write {
            self.add_writer(&attr, &pattern);
        }
        if truncate {
            // Other handles of this mount may have written beyond it.
            self.set_local_size(ent.id, attr.size);
        }
        let kill_privs = AtomicBool::new(write && kills_privs(attr.mode));
        let unchanged = self.cache_mode == CacheMode::Paged && {
            let mut v = self.opened_versions.lock().expect("versions");
            if v.len() >= OPENED_VERSIONS_MAX {
                // Bounded memory: forgetting only costs re-reading.
                v.clear();
            }
            let now = (attr.ctime, attr.mtime, attr.size);
            v.insert(ent.id, now) == Some(now)
        };
        let f = Arc::new(OpenFile {
            ent,
            pattern,
            write,
            dirty: AtomicBool::new(false),
            publishing: tokio::sync::Mutex::new(()),
            unchanged,
            kill_privs,
            atime_sent: AtomicBool::new(false),
            atime_busy: AtomicBool::new(false),
            atime_again: AtomicBool::new(false),
            lock_owners: Mutex::default(),
            changing: tokio::sync::RwLock::new(()),
            held: AtomicBool::new(false),
        });
        let fh = self.new_fh();
        self.files.lock().expect("files").insert(fh, f.clone());
        Ok((fh, f))
    }

    /// After a read of `f`: reports it to the metadata node as the mount's
    /// access-time rule says, in the background.
    pub(super) fn note_read(self: &Arc<Self>, f: &Arc<OpenFile>) {
        let strict = match self.atime {
            Atime::NoAtime => return,
            Atime::Relatime if f.atime_sent.swap(true, Ordering::AcqRel) => return,
            Atime::Relatime => false,
            Atime::StrictAtime => {
                if f.atime_busy.swap(true, Ordering::AcqRel) {
                    f.atime_again.store(true, Ordering::Release);
                    return;
                }
                true
            }
        };
        let (inner, f) = (self.clone(), f.clone());
        self.rt.spawn(async move {
            loop {
                inner.touch_atime(f.ent, strict).await;
                if !strict {
                    return;
                }
                f.atime_busy.store(false, Ordering::Release);
                // Reads that came in while this report ran get one more.
                if !f.atime_again.swap(false, Ordering::AcqRel) || f.atime_busy.swap(true, Ordering::AcqRel) {
                    return;
                }
            }
        });
    }

    /// Reports a read of `ent` now; this mount's kernel then asks for the new attributes.
    pub(super) async fn touch_atime(&self, ent: Ent, strict: bool) {
        let now = system_to_ts(SystemTime::now());
        match self.client.touch_atime(ent, now, strict).await {
            Ok(_) => self.drop_kernel_attrs(ent.id),
            Err(e) => debug!("access time of {}: {e}", ent.id),
        }
    }

    pub(super) fn file(&self, fh: FileHandle) -> FsResult<Arc<OpenFile>> {
        self.files
            .lock()
            .expect("files")
            .get(&fh.0)
            .cloned()
            .ok_or_else(|| FsError::new(ErrorCode::Invalid, format!("unknown file handle {}", fh.0)))
    }
}
