//! Sizes held by clients. A client that makes and opens a file with
//! `CreateOpenHeld` reports the size its writes left with the handle's
//! release (`ReleaseSized`, sent in the background) instead of at close.
//! Until that release this node answers other clients' requests for the
//! file's attributes with the size read off its chunk files (the writer
//! wrote them before its close returned) and leases those attributes to
//! nobody else, so a close is seen by every later open or stat anywhere.
//! A held size whose report cannot land, or whose client went silent
//! (killed after its close), is read off the chunk files in the background
//! ([`spawn_held_settler`]).
//!
//! Holds live in memory ([`super::Opens`]), as open counts do: a node
//! restarted between a client's close and its release forgets the hold,
//! and until the release lands (milliseconds after the close) others see
//! the size recorded before. This module must not decide what a client
//! holds (the client asks) nor keep sizes of its own (they land through
//! the writer as `UpdateSize`).

use super::{is_moving, Namespace, ORPHAN, REQUESTER};
use crate::leases::{LeaseKey, Requester};
use crate::ops::Mutation;
use hivefs_cluster::concurrently;
use hivefs_proto::{Caller, HeldSize, OpId, Reply, Request, Response, SizedRelease};
use hivefs_types::attr::{EntryAttr, FileKind};
use hivefs_types::error::{ErrorCode, FsResult};
use hivefs_types::fs_err;
use hivefs_types::ids::EntryId;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;
use tracing::{info, warn};

/// How often held sizes are looked at for settling.
const SETTLE_EVERY: Duration = Duration::from_secs(2);
/// A hold of a client that no longer polls (see `Leases::session_alive`)
/// is settled once its last handle is this old.
const SILENT_AFTER: Duration = Duration::from_secs(10);

impl Namespace {
    /// `CreateOpenHeld` of lease client `client`: `CreateOpen`, and a
    /// regular file stored here then has its size held by the client.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn create_open_held(
        &self,
        client: u64,
        op: Option<OpId>,
        parent: EntryId,
        name: Vec<u8>,
        mode: u32,
        excl: bool,
        caller: Caller,
    ) -> Response {
        if self.leases.duration().is_zero() {
            // Without leases nothing tells this node a client went silent.
            return Err(fs_err!(Protocol, "metadata node {} holds no sizes: its leases are off", self.node));
        }
        // A repeat's first attempt took the hold.
        let repeat = match &op {
            Some(op) => self.recorded_reply(op)?.is_some(),
            None => false,
        };
        let r = self.handle_leasing(client, op, Request::CreateOpen { parent, name, mode, excl, caller }).await?;
        if let Some(a) = answered_entry(&r) {
            if !repeat && a.kind == FileKind::File && a.owner == self.node {
                self.opens.hold(a.id, client);
                // An existing file opened: copies others lease go first.
                let me = Requester { client, token: self.leases.mark().token };
                self.leases.revoke(&[LeaseKey::Attr(a.id)], Some(me)).await;
            }
        }
        Ok(r)
    }

    /// `ReleaseSized` of `client`: the sizes land (together, in one commit
    /// when they can), then the handles are released. The client gets the
    /// attributes the landed sizes left, leased as an answer to its own
    /// change would be.
    pub(super) async fn release_sized(&self, client: Option<u64>, handles: Vec<SizedRelease>) -> Response {
        let since = self.leases.mark();
        let me = client.map(|c| Requester { client: c, token: since.token });
        let landings: Vec<_> = handles.iter().filter_map(|h| Some((h.id, h.size?))).collect();
        // All at once, in this task; each outcome kept (none ends the wait).
        let lands: Vec<Landing<'_>> = landings
            .iter()
            .map(|&(id, s)| Box::pin(async move { Ok((id, self.land_held(id, s, me).await)) }) as Landing<'_>)
            .collect();
        let mut attrs = Vec::new();
        for (id, r) in concurrently(lands).await? {
            match r {
                Ok(Some(a)) => {
                    let ms = match client {
                        Some(c) if a.owner == self.node => self.leases.grant(c, LeaseKey::Attr(id), since),
                        _ => 0,
                    };
                    attrs.push((a, ms));
                }
                Ok(None) => {}
                Err(e) => {
                    warn!("metadata node {}: size of file {id} reported at its release did not land: {e}", self.node);
                    // Read off the chunk files later; others' requests do meanwhile.
                    self.opens.hold(id, ORPHAN);
                }
            }
        }
        for h in handles {
            if let (Some(c), true) = (client, h.held) {
                self.opens.unhold(h.id, c);
            }
            self.release_one(h.id, h.wrote).await;
        }
        Ok(Reply::Landed { attrs })
    }

    /// One held size lands: exactly when the file did not change since its
    /// client saw it, else read off its chunk files. The file's attributes
    /// then, when it is still stored here.
    async fn land_held(&self, id: EntryId, s: HeldSize, me: Option<Requester>) -> FsResult<Option<EntryAttr>> {
        loop {
            match self.land_held_once(id, s, me).await {
                // Being renamed onto another node: lands where it went.
                Err(e) if is_moving(&e) => self.opens.moving.wait(id).await,
                r => return r,
            }
        }
    }

    async fn land_held_once(&self, id: EntryId, s: HeldSize, me: Option<Requester>) -> FsResult<Option<EntryAttr>> {
        // Renamed into a directory of another node meanwhile: the size goes there.
        let moved = Request::UpdateSize { id, size: s.size, mtime: Some(s.mtime) };
        if let Some(r) = self.forward_moved(None, &moved).await {
            return r.map(|_| None);
        }
        let submit = |m: Mutation| async move {
            match me {
                Some(me) => REQUESTER.scope(me, self.submit_op(None, m)).await,
                None => self.submit_op(None, m).await,
            }
        };
        let exact = match s.seen {
            Some(ctime) => {
                submit(Mutation::UpdateSize {
                    id,
                    size: s.size,
                    mtime: Some(s.mtime),
                    if_ctime: Some(ctime),
                    held: true,
                })
                .await
            }
            None => Err(fs_err!(Busy, "file {id}: its writer's size is a lower bound")),
        };
        let mut r = exact;
        // Read off the chunk files; applied only if nothing (a truncation)
        // changed the file while they were read, else read again.
        for _ in 0..8 {
            if !matches!(&r, Err(e) if e.code == ErrorCode::Busy && !is_moving(e)) {
                break;
            }
            let a = match self.getattr(id) {
                Err(e) if e.code == ErrorCode::NotFound => return Ok(None),
                a => a?,
            };
            let size = self.size_on_targets(&a).await?;
            let m = Mutation::UpdateSize { id, size, mtime: Some(s.mtime), if_ctime: Some(a.ctime), held: true };
            r = submit(m).await;
        }
        match r {
            Ok(Reply::Entry(a)) => Ok(Some(a)),
            Ok(_) => Ok(None),
            Err(e) if e.code == ErrorCode::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// `r`, answered to `requester`: when it carries the attributes of a
    /// file whose size another client holds, with the size read off the
    /// file's chunk files (or the recorded one, if larger), and `true`
    /// (the answer must not be leased).
    pub(super) async fn unheld(&self, requester: Option<u64>, r: Reply) -> FsResult<(Reply, bool)> {
        match r {
            Reply::Entry(mut a)
                if a.kind == FileKind::File && a.owner == self.node && self.opens.held_by_other(a.id, requester) =>
            {
                a.size = a.size.max(self.size_on_targets(&a).await?);
                Ok((Reply::Entry(a), true))
            }
            r => Ok((r, false)),
        }
    }

    /// The size the chunk files of `a` imply.
    async fn size_on_targets(&self, a: &EntryAttr) -> FsResult<u64> {
        let Some(p) = &a.pattern else { return Ok(a.size) };
        let units = (0..p.targets().len()).map(|i| p.unit(i)).collect();
        let lens = self.targets.chunk_lens(units, a.id).await?;
        Ok(p.size_from_chunk_lens(&lens))
    }

    /// A held size nobody will report: read off the chunk files, recorded
    /// when larger than the recorded one.
    async fn settle_held(&self, id: EntryId) -> FsResult<Option<u64>> {
        let a = match self.getattr(id) {
            Err(e) if e.code == ErrorCode::NotFound => return Ok(None),
            r => r?,
        };
        let size = self.size_on_targets(&a).await?;
        if size <= a.size {
            return Ok(None);
        }
        // Not over a change (a truncation) made while the chunk files were read.
        let m = Mutation::UpdateSize { id, size, mtime: None, if_ctime: Some(a.ctime), held: true };
        self.submit_op(None, m).await?;
        Ok(Some(size))
    }
}

/// Settles, every [`SETTLE_EVERY`], the held sizes that no client will
/// report: orphans, and those of clients silent for [`SILENT_AFTER`].
pub fn spawn_held_settler(ns: Arc<Namespace>) -> JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(SETTLE_EVERY).await;
            for id in ns.opens.take_to_settle(|c| ns.leases.session_alive(c), SILENT_AFTER) {
                match ns.settle_held(id).await {
                    Ok(Some(size)) => info!(
                        "metadata node {}: file {id}'s size held by a silent client read off its chunk files: {size}",
                        ns.node
                    ),
                    Ok(None) => {}
                    Err(e) => {
                        warn!("metadata node {}: size of file {id} not read off its chunk files yet: {e}", ns.node);
                        ns.opens.hold(id, ORPHAN);
                    }
                }
            }
        }
    })
}

/// A held size landing: the file, and its attributes then (or why not).
type Landing<'a> = Pin<Box<dyn Future<Output = FsResult<(EntryId, FsResult<Option<EntryAttr>>)>> + Send + 'a>>;

/// The entry an answer carries, under the wrappers a leasing answer may have.
fn answered_entry(r: &Reply) -> Option<&EntryAttr> {
    match r {
        Reply::Entry(a) | Reply::Leased { attr: a, .. } => Some(a),
        Reply::WithParent { reply, .. } | Reply::DirNames { reply, .. } => answered_entry(reply),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::super::Opens;
    use super::*;

    #[test]
    fn holds_count_handles_per_client_and_settle_only_silent_or_orphaned_ones() {
        let o = Opens::default();
        let f = EntryId { node: 1, epoch: 1, counter: 9 };
        o.hold(f, 7);
        o.hold(f, 7);
        assert!(!o.held_by_other(f, Some(7)), "the holder's own answers are left alone");
        assert!(o.held_by_other(f, Some(8)) && o.held_by_other(f, None));
        o.unhold(f, 7);
        assert!(o.held_by_other(f, Some(8)), "one handle still holds it");
        o.unhold(f, 7);
        assert!(!o.held_by_other(f, Some(8)), "released");

        o.hold(f, 7);
        assert!(o.take_to_settle(|_| false, Duration::from_secs(60)).is_empty(), "a hold this recent stays");
        assert!(o.take_to_settle(|_| true, Duration::ZERO).is_empty(), "a polling client's hold stays");
        assert_eq!(o.take_to_settle(|_| false, Duration::ZERO), vec![f], "a silent client's hold is settled");
        assert!(!o.held_by_other(f, None));

        o.hold(f, ORPHAN);
        assert!(o.held_by_other(f, Some(ORPHAN)), "an orphan is nobody's own");
        assert_eq!(o.take_to_settle(|_| true, Duration::from_secs(60)), vec![f], "orphans go at once");
        assert!(!o.held_by_other(f, None));
    }
}
