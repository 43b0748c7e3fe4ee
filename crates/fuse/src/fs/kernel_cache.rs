//! What the kernel keeps of this mount's answers: how long it may use a
//! name or attributes (the metadata node's leases), telling it to drop
//! them when a lease is revoked, and the capabilities a paged mount
//! answers from memory. It answers no FUSE request itself.

use super::*;

impl Inner {
    /// A file's `security.capability` ([`CAPS_XATTR`]): from [`LocalSize::caps`]
    /// while it is open for writing here and known, else from the metadata node
    /// (and then remembered if it is open for writing).
    pub(super) async fn caps(&self, ent: Ent) -> FsResult<Vec<u8>> {
        let cached = self.local_sizes.lock().expect("sizes").get(&ent.id).and_then(|l| l.caps.clone());
        let v = match cached {
            Some(v) => v,
            None => {
                let v = match self.client.getxattr(ent, CAPS_XATTR).await {
                    Ok(v) => Some(v),
                    Err(e) if e.code == ErrorCode::NoData => None,
                    Err(e) => return Err(e),
                };
                self.remember_caps(ent.id, v.clone());
                v
            }
        };
        v.ok_or_else(|| FsError::new(ErrorCode::NoData, "no security.capability"))
    }

    /// Caches a file's `security.capability` if it is open for writing here.
    pub(super) fn remember_caps(&self, id: EntryId, v: Option<Vec<u8>>) {
        if let Some(l) = self.local_sizes.lock().expect("sizes").get_mut(&id) {
            l.caps = Some(v);
        }
    }

    pub(super) fn forget_caps(&self, id: EntryId) {
        if let Some(l) = self.local_sizes.lock().expect("sizes").get_mut(&id) {
            l.caps = None;
        }
    }

    /// Runs `reply` with how long the kernel may keep `a`'s attributes: a
    /// directory's for `dir_attr_ttl`; a file's while its lease lasts, unless
    /// this mount writes it (then sizes change here first). Revocations wait
    /// until `reply` returns (see `Client::with_lease`).
    ///
    /// With `name` (the directory and name `a` was found or made by), also
    /// how long the kernel may keep that name: while its lease lasts (when
    /// the kernel can drop names on revocation, see [`Inner::drop_names`]),
    /// else `ENTRY_TTL`.
    pub(super) fn with_ttl<R>(
        &self,
        a: &EntryAttr,
        name: Option<(EntryId, &[u8])>,
        reply: impl FnOnce(Duration, Duration) -> R,
    ) -> R {
        self.client.with_leases(a.id, name, |attrs, name_left| {
            let entry = self.entry_ttl(name_left);
            let attrs = if a.kind == FileKind::Dir {
                self.dir_attr_ttl
            } else if self.local_sizes.lock().expect("sizes").contains_key(&a.id) {
                ATTR_TTL
            } else {
                attrs
            };
            reply(attrs, entry)
        })
    }

    /// How long the kernel may keep a name with `name_left` of its lease.
    pub(super) fn entry_ttl(&self, name_left: Duration) -> Duration {
        if self.epoch_fd.get().is_some() && !name_left.is_zero() {
            name_left
        } else {
            ENTRY_TTL
        }
    }

    /// Answers with a new entry, name and attributes cached as `with_ttl` says.
    pub(super) fn send_entry(&self, reply: ReplyEntry, a: &EntryAttr, name: Option<(EntryId, &[u8])>) {
        self.with_ttl(a, name, |attrs, entry| {
            reply.entry_with_ttls(&attrs, &entry, &self.entry_reply(a), Generation(0))
        });
    }

    pub(super) fn send_attr(&self, reply: ReplyAttr, ino: INodeNo, a: &EntryAttr) {
        self.with_ttl(a, None, |ttl, _| reply.attr(&ttl, &self.to_attr(ino.0, a)));
    }

    /// Makes the kernel look every name up again (a name this mount leased
    /// changed): `FUSE_NOTIFY_INC_EPOCH` (Linux 6.16), which takes no locks.
    /// Unlike dropping one name (`FUSE_NOTIFY_INVAL_ENTRY`), it cannot wait
    /// for the directory's lock, which an operation of this mount may hold
    /// while the metadata node waits for this very revocation.
    pub(super) fn drop_names(&self) {
        if let Some(f) = self.epoch_fd.get() {
            if let Err(e) = session::inc_epoch(f) {
                warn!("dropping the kernel's cached names failed: {e}");
            }
        }
    }

    /// Makes the kernel ask again for `id`'s attributes (after this mount
    /// changed them behind the kernel's back: sizes reported on close).
    pub(super) fn drop_kernel_attrs(&self, id: EntryId) {
        let ino = self.inodes.lock().expect("inodes").ino_of(&id);
        if let (Some(ino), Some(n)) = (ino, self.notifier.get()) {
            // Offset -1: the attributes only, not the cached pages.
            if let Err(e) = n.inval_inode(fuser::INodeNo(ino), -1, 0) {
                debug!("dropping the kernel's attributes of {id} (inode {ino}): {e}");
            }
        }
    }
}
