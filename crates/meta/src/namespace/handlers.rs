//! Request dispatch of the metadata node: unwraps the envelopes (leasing,
//! retryable), leases what answers carry, and hands each request to the
//! namespace's reads, the writer, the cross-node protocol, the lock table
//! or the fsck scans. Also the node's background tasks that need the whole
//! namespace (lease recorder, lock expiry).

use super::{Namespace, REQUESTER};
use crate::fsck::{scan_dentries, scan_disposals, scan_inodes};
use crate::locks::check_range;
use crate::ops::Mutation;
use hivefs_proto::{Envelope, FileLock, OpId, Reply, Request, Response};
use hivefs_types::attr::{EntryAttr, FileKind};
use hivefs_types::error::FsResult;
use hivefs_types::fs_err;
use hivefs_types::ids::{EntryId, NodeType};
use hivefs_types::pattern::StripeSet;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{debug, warn};

impl Namespace {
    // -------------------------------------------------------- dispatch

    /// Answers one request that came without an envelope.
    pub async fn handle(&self, req: Request) -> Response {
        self.handle_env(Envelope::default(), req).await
    }

    /// Answers one request with its envelope: the operation id makes a
    /// mutation apply once, the lease client takes leases on what the answer
    /// carries.
    pub async fn handle_env(&self, env: Envelope, req: Request) -> Response {
        req.check_batch()?;
        match req {
            Request::LeaseWait { client, acked, wait_ms } => {
                Ok(self.leases.wait(client, acked, Duration::from_millis(wait_ms.into()), false).await)
            }
            Request::LeaseWaitDirs { client, acked, wait_ms } => {
                Ok(self.leases.wait(client, acked, Duration::from_millis(wait_ms.into()), true).await)
            }
            Request::ReleaseMany { ids, mut wrote } => {
                // Looked up per handle: sorted, not scanned (up to 4096 of each).
                wrote.sort_unstable();
                for id in ids {
                    let write = if wrote.binary_search(&id).is_ok() { StripeSet::ALL } else { StripeSet::EMPTY };
                    self.release_one(id, write).await;
                }
                Ok(Reply::Ok)
            }
            Request::ReleaseWritten { handles } => {
                for (id, write) in handles {
                    self.release_one(id, write).await;
                }
                Ok(Reply::Ok)
            }
            Request::ReleaseSized { handles } => self.release_sized(env.lease_client, handles).await,
            Request::CreateOpenHeld { parent, name, mode, excl, caller } => {
                let Some(client) = env.lease_client else {
                    return Err(fs_err!(Invalid, "CreateOpenHeld without the lease client holding the size"));
                };
                self.create_open_held(client, env.op, parent, name, mode, excl, caller).await
            }
            Request::ReserveCreates { parent, count } => {
                let Some(client) = env.lease_client else {
                    return Err(fs_err!(Invalid, "ReserveCreates without the lease client holding the names"));
                };
                self.reserve_creates(client, parent, count).await
            }
            Request::CreateMany { parent, files } => {
                let Some(client) = env.lease_client else {
                    return Err(fs_err!(Invalid, "CreateMany without the lease client holding the names"));
                };
                self.create_many(client, parent, files).await
            }
            Request::RetiredRetryable | Request::RetiredLeasing => {
                Err(fs_err!(NotSupported, "{} is a retired message (the envelope replaced it)", req.name()))
            }
            req => match env.lease_client {
                Some(client) => self.handle_leasing(client, env.op, req).await,
                None => {
                    let r = self.handle_unleased(env.op, req).await?;
                    Ok(self.unheld(None, r).await?.0)
                }
            },
        }
    }

    /// A request of a client that takes leases: answered as usual, then an
    /// entry's attributes (a non-directory stored here) and the name it was
    /// looked up or created by (stored here) are leased to the client.
    pub(super) async fn handle_leasing(&self, client: u64, op: Option<OpId>, req: Request) -> Response {
        use crate::leases::LeaseKey;
        let since = self.leases.mark();
        // A repeat's recorded answer may be older than the mark: no lease on
        // it. Only operations answered with an entry need that look (a read).
        let fresh = match &op {
            Some(op) => {
                let no_entry = matches!(
                    req,
                    Request::Unlink { .. }
                        | Request::Rmdir { .. }
                        | Request::Rename { .. }
                        | Request::RenameTo { .. }
                        | Request::SetXattr { .. }
                        | Request::RemoveXattr { .. }
                );
                no_entry || self.recorded_reply(op)?.is_none()
            }
            None => true,
        };
        let name = req.names().map(|(p, n)| LeaseKey::Name(p, n.into()));
        let changed_dir = req.changed_dir();
        // A directory made here, or made through another node for this client.
        let mkdir = matches!(req, Request::Mkdir { .. } | Request::LeaseDirNames { .. });
        let me = crate::leases::Requester { client, token: since.token };
        let answer = REQUESTER.scope(me, self.handle_unleased(op, req)).await?;
        // Attributes of a file whose size another client holds are not leased.
        let (answer, held) = self.unheld(Some(client), answer).await?;
        let r = self.leased(client, fresh, !held, name, since, answer);
        let reply = r?;
        // A repeat's directory may have got names since it was made.
        let grants = self.dir_names(client, since, changed_dir, (mkdir && fresh).then_some(&reply));
        // The client keeps a changed directory's attributes for as long as
        // it would cache them anyway (client crate's `dirattrs`): read after
        // the change, so they include it.
        let reply = match changed_dir.map(|d| self.getattr(d)) {
            Some(Ok(parent)) if parent.kind == FileKind::Dir => Reply::WithParent { parent, reply: Box::new(reply) },
            _ => reply,
        };
        Ok(if grants.is_empty() { reply } else { Reply::DirNames { grants, reply: Box::new(reply) } })
    }

    /// Before `req` reads or changes a directory's names: a client making
    /// files there ahead of telling this node lands them first (see `ahead`).
    async fn recall_names(&self, req: &Request) {
        if !self.leases.any_write_back() {
            return;
        }
        let me = REQUESTER.try_with(|c| *c).ok();
        let (a, b) = match req {
            Request::ReadDir { dir, .. } | Request::ReadDirFirst { dir, .. } => (Some(*dir), None),
            Request::Rename { parent, new_parent, .. } | Request::RenameTo { parent, new_parent, .. } => {
                (Some(*parent), Some(*new_parent))
            }
            Request::LinkTo { new_parent, .. } => (Some(*new_parent), None),
            // How new files there are made (stripe settings, default ACL, setgid).
            Request::SetDirPattern { id, .. }
            | Request::SetAttr { id, .. }
            | Request::SetXattr { id, .. }
            | Request::RemoveXattr { id, .. } => (Some(*id), None),
            // The directory removed must be seen empty.
            Request::Rmdir { parent, name } => {
                let child = self.read(|t| crate::ops::load_dentry(&t.dentries, *parent, name)).ok().flatten();
                (Some(*parent), child.map(|d| d.id))
            }
            r => (r.names().map(|(p, _)| p).or(r.changed_dir()), None),
        };
        for dir in [a, b].into_iter().flatten() {
            self.leases.recall(dir, me).await;
        }
    }

    /// Leases on directories' names for a client that takes them: the
    /// directory a mkdir (answered `made`) made here, empty; and a renewal
    /// of the lease on the directory the request changed.
    fn dir_names(
        &self,
        client: u64,
        since: crate::leases::Mark,
        changed: Option<EntryId>,
        made: Option<&Reply>,
    ) -> Vec<(EntryId, u32)> {
        if (changed.is_none() && made.is_none()) || !self.leases.takes_dir_names(client) {
            return Vec::new();
        }
        let made = match made {
            Some(Reply::Entry(a) | Reply::Leased { attr: a, .. })
                if a.kind == FileKind::Dir && a.owner == self.node =>
            {
                Some(a.id)
            }
            _ => None,
        };
        let fresh = made.map(|d| (d, self.leases.grant_names(client, d, since, true)));
        if let Some((d, ms)) = fresh {
            if ms > 0 {
                // It may make files there ahead (see `ahead`): nobody else knows the directory yet.
                self.leases.write_back(client, d);
            }
        }
        let renewed = changed.map(|d| (d, self.leases.grant_names(client, d, since, false)));
        fresh.into_iter().chain(renewed).filter(|&(_, ms)| ms > 0).collect()
    }

    /// Leases what a leasing request's answer `r` carries (see `handle_leasing`).
    fn leased(
        &self,
        client: u64,
        fresh: bool,
        attr_lease: bool,
        name: Option<crate::leases::LeaseKey>,
        since: crate::leases::Mark,
        r: Reply,
    ) -> Response {
        use crate::leases::LeaseKey;
        match r {
            Reply::Entry(a) if fresh => {
                let lease_ms = if attr_lease && a.kind != FileKind::Dir && a.owner == self.node {
                    self.leases.grant(client, LeaseKey::Attr(a.id), since)
                } else {
                    0
                };
                let name_ms = name.map_or(0, |k| self.leases.grant(client, k, since));
                if lease_ms == 0 && name_ms == 0 {
                    Ok(Reply::Entry(a))
                } else {
                    Ok(Reply::Leased { attr: a, lease_ms, name_ms })
                }
            }
            r => Ok(r),
        }
    }

    /// One handle of a batch released: as its own `Release`, forwarded if
    /// a rename moved the file (its new owner knows nothing of its chunk
    /// files, so the positions are not needed there).
    pub(super) async fn release_one(&self, id: EntryId, wrote: StripeSet) {
        let req = Request::Release { id, write: !wrote.is_empty() };
        let r = match self.forward_moved(None, &req).await {
            Some(r) => r.map(drop),
            None => self.release(id, wrote).await,
        };
        if let Err(e) = r {
            debug!("release of {id} on metadata node {}: {e}", self.node);
        }
    }

    async fn handle_unleased(&self, op: Option<OpId>, req: Request) -> Response {
        self.recall_names(&req).await;
        if let Some(r) = self.forward_moved(op, &req).await {
            return r;
        }
        match super::moving::changed_file(&req) {
            Some(id) => self.handle_moving(id, op, req).await,
            None => self.handle_op(req, op).await,
        }
    }

    /// Answers one request; mutations record their outcome under `op`.
    pub(super) async fn handle_op(&self, req: Request, op: Option<OpId>) -> Response {
        let entry = |r: FsResult<EntryAttr>| r.map(Reply::Entry);
        match req {
            Request::Ping => Ok(Reply::Pong { node_type: NodeType::Meta, node: self.node }),
            Request::Lookup { parent, name } => entry(self.lookup_any(parent, &name).await),
            Request::GetAttr { id } => entry(self.getattr(id)),
            Request::SetAttr { id, attr, caller } => entry(self.set_attr(id, attr, caller.uid == 0, op).await),
            Request::Create { parent, name, kind, mode, rdev, excl, caller } => {
                if kind == FileKind::File {
                    self.targets.refresh_if_empty().await;
                }
                self.submit_op(
                    op,
                    Mutation::Create {
                        parent,
                        name,
                        kind,
                        mode,
                        rdev,
                        excl,
                        uid: caller.uid,
                        gid: caller.gid,
                        umask: caller.umask,
                        open: false,
                    },
                )
                .await
            }
            Request::Mkdir { parent, name, mode, caller } => self.mkdir_any(parent, name, mode, caller, op).await,
            Request::Unlink { parent, name } => self.remove_any(parent, name, false, op).await,
            Request::Rmdir { parent, name } => self.remove_any(parent, name, true, op).await,
            Request::Rename { parent, name, new_parent, new_name, flags } => {
                self.rename_any(parent, name, new_parent, None, new_name, flags, op).await
            }
            Request::RenameTo { parent, name, new_parent, new_parent_owner, new_name, flags } => {
                self.rename_any(parent, name, new_parent, Some(new_parent_owner), new_name, flags, op).await
            }
            Request::MetaPeer { op: step } => self.peer(step, None).await,
            Request::PeerStep { intent, floor, op } => self.peer_step(intent, floor, op).await,
            Request::SetMetaChooser { id, chooser } => self.set_meta_chooser(id, chooser, op).await,
            Request::GetMetaChooser { id } => self.meta_chooser(id).map(Reply::MetaChooser),
            Request::FsckIntents => self.intents_text().map(Reply::FsckIntents),
            Request::LinkTo { id, new_parent, new_parent_owner, new_name } => {
                self.link_any(id, new_parent, new_parent_owner, new_name, op).await
            }
            Request::ReadDir { dir, after, max } => self.readdir(dir, after.as_deref(), max),
            Request::ReadDirFirst { dir, max } => self.read(|t| {
                let (entries, more) = t.readdir(dir, None, max)?;
                let parent = crate::ops::load_inode(&t.inodes, dir)?.and_then(|i| i.parent).unwrap_or(dir);
                Ok(Reply::DirPageFirst { parent, entries, more })
            }),
            Request::Symlink { parent, name, target, caller } => {
                self.submit_op(op, Mutation::Symlink { parent, name, target, uid: caller.uid, gid: caller.gid }).await
            }
            Request::ReadLink { id } => self.readlink(id).map(Reply::LinkTarget),
            Request::LeaseDirNames { dir } => {
                // Read after the lease mark: an entry added since refuses the grant.
                let a = self.getattr(dir)?;
                if a.kind != FileKind::Dir {
                    return Err(fs_err!(NotDir, "{dir} is not a directory"));
                }
                let empty = self.read(|t| crate::ops::is_empty_dir(&t.dentries, dir))?;
                Ok(if empty { Reply::Entry(a) } else { Reply::Ok })
            }
            Request::Link { id, new_parent, new_name } => {
                self.submit_op(op, Mutation::Link { id, new_parent, new_name }).await
            }
            Request::GetXattr { id, name } => self.getxattr(id, &name).map(Reply::Xattr),
            Request::SetXattr { id, name, value, flags } => {
                self.submit_op(op, Mutation::SetXattr { id, name, value, flags }).await
            }
            Request::ListXattr { id } => self.listxattr(id).map(Reply::XattrNames),
            Request::RemoveXattr { id, name } => self.submit_op(op, Mutation::RemoveXattr { id, name }).await,
            Request::SetDirPattern { id, pattern } => {
                self.targets.check_pool(pattern.pool).await?;
                self.submit_op(op, Mutation::SetDirPattern { id, pattern }).await
            }
            Request::Open { id, write: _ } => entry(self.open_file(id)),
            Request::Release { id, write } => {
                let wrote = if write { StripeSet::ALL } else { StripeSet::EMPTY };
                self.release(id, wrote).await.map(|()| Reply::Ok)
            }
            Request::UpdateSize { id, size, mtime } => {
                self.submit_op(op, Mutation::UpdateSize { id, size, mtime, if_ctime: None, held: false }).await
            }
            Request::UpdateSizeIf { id, size, mtime, ctime } => {
                self.submit_op(op, Mutation::UpdateSize { id, size, mtime, if_ctime: Some(ctime), held: false }).await
            }
            Request::TouchAtime { id, at, strict } => {
                // Most reads change nothing (relatime): answered without a commit.
                match self.read(|t| crate::ops::load_inode(&t.inodes, id)) {
                    Ok(Some(i)) if !crate::ops::atime_due(&i, at, strict) => {
                        Ok(Reply::Entry(crate::ops::to_attr(id, &i, self.node)))
                    }
                    _ => self.submit_op(op, Mutation::TouchAtime { id, at, strict }).await,
                }
            }
            Request::CreateOpen { parent, name, mode, excl, caller } => {
                self.create_open(parent, name, mode, excl, caller, op).await
            }
            Request::MetaStat => self.meta_stat(),
            Request::QuotaUsage { ids } => self.quota_usage(&ids).map(Reply::QuotaUsage),
            Request::RefreshView => self.targets.refresh().await.map(|()| Reply::Ok),
            r @ (Request::LockAcquire { .. }
            | Request::LockRelease { .. }
            | Request::LockTest { .. }
            | Request::LockCancel { .. }
            | Request::LockKeepAlive { .. }) => self.lock_request(r).await,
            r @ (Request::FsckDentries { .. }
            | Request::FsckInodes { .. }
            | Request::FsckDisposals { .. }
            | Request::FsckFix { .. }) => self.fsck_request(r).await,
            other => {
                Err(fs_err!(NotSupported, "{} is not served by a metadata node (node {})", other.name(), self.node))
            }
        }
    }

    /// Answers the fsck requests of a metadata node.
    async fn fsck_request(&self, req: Request) -> Response {
        let ns = self;
        match req {
            Request::FsckDentries { after, max } => {
                let (entries, more) = ns.read(|t| scan_dentries(t, after, max))?;
                Ok(Reply::FsckDentries { entries, more })
            }
            Request::FsckInodes { after, max } => {
                let (inodes, more) = ns.read(|t| scan_inodes(t, after, max, |id| ns.opens.is_open(id)))?;
                Ok(Reply::FsckInodes { inodes, more })
            }
            Request::FsckDisposals { after, max } => {
                let (records, more) = ns.read(|t| scan_disposals(t, after, max))?;
                Ok(Reply::FsckDisposals { records, more })
            }
            Request::FsckFix { fix } => ns.submit(fix).await,
            other => Err(fs_err!(Internal, "{other:?} is not an fsck request")),
        }
    }

    /// Answers the lock requests (the namespace's dispatch hands them here).
    async fn lock_request(&self, req: Request) -> Response {
        let ns = self;
        let t = &ns.locks;
        let now = Instant::now();
        match req {
            Request::LockKeepAlive { client } => {
                let known = t.touch(client, now);
                if !known {
                    debug!("lock lease of client {client:016x} starts");
                }
                Ok(Reply::LockLease { lease_ms: t.lease().as_millis() as u64, known })
            }
            Request::LockAcquire { entry, lock, wait_ms } => {
                check_range(entry, &lock)?;
                // Only entries stored here can be locked here.
                ns.getattr(entry)?;
                t.touch(lock.client, now);
                // A client keeping the append lock lets it go when told (see `locks`).
                let tell = |c: &FileLock| ns.leases.notify(c.client, entry);
                t.acquire_telling(entry, &lock, Duration::from_millis(u64::from(wait_ms)), tell).await.map(Reply::Lock)
            }
            Request::LockRelease { entry, lock } => {
                check_range(entry, &lock)?;
                t.touch(lock.client, now);
                t.unlock(entry, &lock);
                Ok(Reply::Ok)
            }
            Request::LockTest { entry, lock } => {
                check_range(entry, &lock)?;
                Ok(Reply::Lock(t.test(entry, &lock)))
            }
            Request::LockCancel { entry, lock } => {
                let n = t.cancel(entry, &lock);
                debug!("lock waits of client {:016x} owner {:x} on {entry} cancelled: {n}", lock.client, lock.owner);
                Ok(Reply::Ok)
            }
            other => Err(fs_err!(Internal, "{other:?} is not a lock request")),
        }
    }
}

/// Keeps [`UNTIL_FILE`] ahead of the leases granted (every 100 ms at most)
/// and sweeps what ended.
pub fn spawn_lease_recorder(ns: Arc<Namespace>) -> JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let ns = ns.clone();
            // A small file write and a walk of the tables: off the async workers.
            let _ = crate::store::off_workers(move || {
                ns.leases.record();
                ns.leases.sweep();
            })
            .await;
        }
    })
}

/// Drops the locks of clients whose lease ended, checking a few times per lease.
pub fn spawn_lock_expiry(ns: Arc<Namespace>) -> JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let every = (ns.locks.lease() / 4).clamp(Duration::from_millis(20), Duration::from_secs(5));
            tokio::time::sleep(every).await;
            for c in ns.locks.expire(Instant::now()) {
                warn!(
                    "client {c:016x} not heard from for {:?}: its file locks on metadata node {} are released",
                    ns.locks.lease(),
                    ns.node()
                );
            }
        }
    })
}
