//! Files made ahead: write-back creates. A client holding the lease on a
//! directory's names knows every name there, so it can make a file there
//! without asking: this node hands it entry ids with stripe patterns ahead
//! (`ReserveCreates`), the client answers its program's create at once and
//! sends its new files in batches (`CreateMany`). Each lands as the create
//! it stands for (`Mutation::CreateAs`), open with a held size, as
//! `CreateOpenHeld` makes it.
//!
//! Nobody else may see the directory without those files: from the
//! reservation on (and for a directory the client just made, from the
//! mkdir), another client's request that reads or changes the directory's
//! names first recalls the lease ([`crate::leases::Leases::recall`]), and
//! the client acknowledges that only once its files there have landed.
//!
//! This module must not choose ids or patterns itself (the writer mints and
//! chooses, `Mutation::Reserve`) nor trust a client's file beyond what the
//! writer checks (an id this node minted and nobody uses, a pattern the
//! directory's settings allow).

use super::{Namespace, REQUESTER};
use crate::leases::{LeaseKey, Requester};
use crate::ops::{load_inode, Mutation};
use crate::store::{child_key, Kv, OpError};
use hivefs_cluster::concurrently;
use hivefs_proto::{NewFile, Reply, Response};
use hivefs_types::acl;
use hivefs_types::error::{FsError, FsResult};
use hivefs_types::fs_err;
use hivefs_types::ids::EntryId;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

/// A reservation needs at least this much left of the lease on the names.
const LEASE_MARGIN: Duration = Duration::from_millis(1500);

type Made<'a> = Pin<Box<dyn Future<Output = FsResult<(usize, FsResult<Reply>)>> + Send + 'a>>;

impl Namespace {
    /// `ReserveCreates` of lease client `client`.
    pub(super) async fn reserve_creates(&self, client: u64, parent: EntryId, count: u32) -> Response {
        if self.leases.duration().is_zero() {
            return Err(fs_err!(Protocol, "metadata node {} makes no files ahead: its leases are off", self.node));
        }
        if !self.leases.holds_names(client, parent, LEASE_MARGIN) {
            return Err(fs_err!(
                Busy,
                "no lease on the names of directory {parent} held on metadata node {}",
                self.node
            ));
        }
        if !self.quota.limited().is_empty() {
            return Err(fs_err!(NotSupported, "metadata node {} checks quota limits at each create", self.node));
        }
        let (setgid, default_acl) = self.read(|t| {
            let dir = load_inode(&t.inodes, parent)?.ok_or(OpError::from(fs_err!(NotFound, "directory {parent}")))?;
            let dflt = t.xattrs.get(child_key(parent, acl::XATTR_DEFAULT).as_slice())?.is_some();
            Ok((dir.mode & 0o2000 != 0, dflt))
        })?;
        if setgid || default_acl {
            return Err(fs_err!(
                NotSupported,
                "directory {parent} hands new files its group or ACL: they are made by metadata node {}",
                self.node
            ));
        }
        self.targets.refresh_if_empty().await;
        let since = self.leases.mark();
        let r = self.submit(Mutation::Reserve { parent, count }).await?;
        self.leases.write_back(client, parent);
        match r {
            Reply::Reserved { slots, .. } => {
                let lease_ms = self.leases.grant_names(client, parent, since, false);
                Ok(Reply::Reserved { slots, lease_ms })
            }
            r => Err(fs_err!(Internal, "writer answered {r:?} to a reservation")),
        }
    }

    /// `CreateMany` of lease client `client`: each file lands as its own
    /// create (the writer commits those together); a file found made
    /// under its id already is a repeat's (its hold was taken then).
    pub(super) async fn create_many(&self, client: u64, parent: EntryId, files: Vec<NewFile>) -> Response {
        let since = self.leases.mark();
        let me = Requester { client, token: since.token };
        let made_before: Vec<bool> = self.read(|t| {
            files.iter().map(|f| Ok(load_inode(&t.inodes, f.id)?.is_some())).collect::<Result<_, OpError>>()
        })?;
        let names: Vec<Vec<u8>> = files.iter().map(|f| f.name.clone()).collect();
        let jobs: Vec<Made<'_>> = files
            .into_iter()
            .enumerate()
            .map(|(k, f)| {
                let m = Mutation::CreateAs {
                    parent,
                    name: f.name,
                    id: f.id,
                    pattern: f.pattern,
                    mode: f.mode,
                    uid: f.caller.uid,
                    gid: f.caller.gid,
                    umask: f.caller.umask,
                    at: f.at,
                };
                Box::pin(async move { Ok((k, REQUESTER.scope(me, self.submit_op(None, m)).await)) }) as Made<'_>
            })
            .collect();
        let mut done = concurrently(jobs).await?;
        done.sort_unstable_by_key(|(k, _)| *k);
        let mut leases = Vec::with_capacity(done.len());
        let mut failed: Vec<(u32, FsError)> = Vec::new();
        for (k, r) in done {
            match r {
                Ok(Reply::Entry(a)) => {
                    if !made_before[k] {
                        self.opens.hold(a.id, client);
                    }
                    let attr_ms = self.leases.grant(client, LeaseKey::Attr(a.id), since);
                    let name_ms = self.leases.grant(client, LeaseKey::Name(parent, names[k].clone().into()), since);
                    leases.push((attr_ms, name_ms));
                }
                Ok(r) => {
                    failed.push((k as u32, fs_err!(Internal, "writer answered {r:?} to a create")));
                    leases.push((0, 0));
                }
                Err(e) => {
                    failed.push((k as u32, e));
                    leases.push((0, 0));
                }
            }
        }
        let lease_ms = self.leases.grant_names(client, parent, since, false);
        let reply = Reply::CreatedMany { leases, failed, lease_ms };
        // The directory's attributes after them, as for any change of its entries.
        Ok(match self.getattr(parent) {
            Ok(parent) => Reply::WithParent { parent, reply: Box::new(reply) },
            Err(_) => reply,
        })
    }
}
