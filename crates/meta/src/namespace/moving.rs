//! Files whose inode a cross-node rename is moving to another metadata
//! node. The rename's intent takes the inode as it is then, and its new
//! owner gets that copy; its commit removes the inode here. A change to the
//! inode here in between (a size reported at a close or a release, a
//! chmod, a time set, an xattr, a link) would be made to the copy that goes
//! away. So from the intent to its end such changes are refused with
//! [`crate::ops::moving_away`] before they write anything (and are not recorded as the
//! operation's outcome), wait here ([`Moving::wait`]), and then go where
//! the inode is: to the new owner after a commit, here after an undo.
//!
//! In memory, as open counts are: the intents a restart finds set it again
//! before the node serves ([`Namespace::load_pending`]). This module must
//! not decide what moves (the rename's intent does).

use crate::ops::is_moving;
use hivefs_proto::{Envelope, OpId, Request, Response};
use hivefs_types::ids::{EntryId, NodeId};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use tokio::sync::watch;

/// The moves in progress, by file, and where recent ones went.
#[derive(Default)]
pub struct Moving {
    /// How many moves are in progress (most changes look only at this).
    count: AtomicUsize,
    files: Mutex<Files>,
}

#[derive(Default)]
struct Files {
    moving: HashMap<EntryId, Move>,
    /// The last [`RECENT_KEPT`] files moved away, and where to: for a
    /// change that waited for its file's move.
    recent: HashMap<EntryId, NodeId>,
    order: VecDeque<EntryId>,
}

/// Most files [`Files::recent`] remembers.
const RECENT_KEPT: usize = 1024;

struct Move {
    intent: EntryId,
    to: NodeId,
    /// Set once the move ended.
    ended: watch::Sender<bool>,
}

impl Moving {
    /// Whether file `id` is moving.
    pub(crate) fn contains(&self, id: EntryId) -> bool {
        self.count.load(Ordering::Acquire) > 0 && self.files.lock().expect("moving").moving.contains_key(&id)
    }

    /// Rename `intent` moves file `id` to metadata node `to`.
    pub(crate) fn start(&self, id: EntryId, intent: EntryId, to: NodeId) {
        let mut m = self.files.lock().expect("moving");
        let (ended, _) = watch::channel(false);
        if m.moving.insert(id, Move { intent, to, ended }).is_none() {
            self.count.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Rename `intent` ended: `committed` (the inode is at its new owner)
    /// or not (it stays here). Its waiters go on.
    pub(crate) fn end(&self, intent: EntryId, committed: bool) {
        if self.count.load(Ordering::Acquire) == 0 {
            return;
        }
        let mut m = self.files.lock().expect("moving");
        let Some(id) = m.moving.iter().find(|(_, mv)| mv.intent == intent).map(|(id, _)| *id) else { return };
        let mv = m.moving.remove(&id).expect("found");
        self.count.fetch_sub(1, Ordering::AcqRel);
        if committed {
            if m.recent.insert(id, mv.to).is_none() {
                m.order.push_back(id);
            }
            if m.order.len() > RECENT_KEPT {
                let old = m.order.pop_front().expect("more than the bound");
                m.recent.remove(&old);
            }
        }
        drop(m);
        mv.ended.send_replace(true);
    }

    /// Waits until file `id` is not moving.
    pub(crate) async fn wait(&self, id: EntryId) {
        let rx = {
            let m = self.files.lock().expect("moving");
            let Some(mv) = m.moving.get(&id) else { return };
            mv.ended.subscribe()
        };
        let mut rx = rx;
        // An error: the move's record went (it ended).
        let _ = rx.wait_for(|ended| *ended).await;
    }

    /// The node a recent move took file `id` to.
    pub(crate) fn moved_to(&self, id: EntryId) -> Option<NodeId> {
        self.files.lock().expect("moving").recent.get(&id).copied()
    }
}

/// The file whose inode request `req` changes here, if it is one that may
/// be moving (a regular file, symlink or device: never a directory).
pub(crate) fn changed_file(req: &Request) -> Option<EntryId> {
    match req {
        Request::SetAttr { id, .. }
        | Request::UpdateSize { id, .. }
        | Request::UpdateSizeIf { id, .. }
        | Request::TouchAtime { id, .. }
        | Request::SetXattr { id, .. }
        | Request::RemoveXattr { id, .. }
        | Request::Link { id, .. }
        | Request::LinkTo { id, .. } => Some(*id),
        _ => None,
    }
}

/// Request `req` as sent to `to`, the node a file moved to from `me`: a
/// local link becomes a link into a directory of `me`.
pub(crate) fn for_new_owner(req: Request, me: NodeId) -> Request {
    match req {
        Request::Link { id, new_parent, new_name } => {
            Request::LinkTo { id, new_parent, new_parent_owner: me, new_name }
        }
        r => r,
    }
}

impl super::Namespace {
    /// `req` of client operation `op` (which changes file `id`), answered
    /// where the file's inode is: here, or, once a rename moved it while
    /// the request waited, at its new owner.
    pub(super) async fn handle_moving(&self, id: EntryId, op: Option<OpId>, req: Request) -> Response {
        let mut waited = false;
        loop {
            if waited {
                let gone = matches!(self.read(|t| crate::ops::load_inode(&t.inodes, id)), Ok(None));
                if let (true, Some(to), Some(peers)) = (gone, self.opens.moving.moved_to(id), self.peers()) {
                    // The operation id goes along: the new owner applies it once.
                    let env = Envelope { op, lease_client: None, mirror: None };
                    return peers.call_with(to, env, for_new_owner(req, self.node)).await;
                }
            }
            match self.handle_op(req.clone(), op).await {
                Err(e) if is_moving(&e) => {
                    self.opens.moving.wait(id).await;
                    waited = true;
                }
                r => return r,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::moving_away;
    use crate::store::OpError;
    use hivefs_types::error::{ErrorCode, FsError};

    #[tokio::test]
    async fn waiters_go_on_when_the_move_ends_and_learn_where_it_went() {
        let m = std::sync::Arc::new(Moving::default());
        let f = EntryId { node: 1, epoch: 1, counter: 5 };
        let (a, b) = (EntryId { node: 1, epoch: 1, counter: 90 }, EntryId { node: 1, epoch: 1, counter: 91 });
        assert!(!m.contains(f), "nothing moves");
        m.wait(f).await;
        m.start(f, a, NodeId(2));
        assert!(m.contains(f));
        let w = tokio::spawn({
            let m = m.clone();
            async move { m.wait(f).await }
        });
        tokio::task::yield_now().await;
        m.end(b, true);
        assert!(m.contains(f) && !w.is_finished(), "another intent's end leaves it moving");
        m.end(a, true);
        w.await.unwrap();
        assert!(!m.contains(f));
        assert_eq!(m.moved_to(f), Some(NodeId(2)), "committed: the new owner is remembered");

        let g = EntryId { node: 1, epoch: 1, counter: 6 };
        m.start(g, b, NodeId(3));
        let w = tokio::spawn({
            let m = m.clone();
            async move { m.wait(g).await }
        });
        tokio::task::yield_now().await;
        m.end(b, false);
        w.await.unwrap();
        assert_eq!(m.moved_to(g), None, "undone: it stays here");
        let refusal = match moving_away(f) {
            OpError::Fs(e) => e,
            OpError::Fatal(m) => panic!("{m}"),
        };
        assert!(is_moving(&refusal) && !is_moving(&FsError::new(ErrorCode::Busy, "busy")));
    }
}
