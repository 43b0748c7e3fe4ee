//! The namespace's side of cross-node operations: deciding whether an
//! operation needs the protocol, running it (intent, remote step, commit;
//! see `crate::cross`), answering peers' steps, recovering intents at start,
//! lookups of entries stored elsewhere, and forwarding requests about files
//! a rename moved away.

use super::Namespace;
use crate::cross::settled;
use crate::cross::{choose_owner, op_key, CrashHook, MultiMut, Peers};
use crate::cross::{
    Abort, ExchangeCommit, ExchangeIntent, LinkAbort, LinkCommit, LinkIntent, MkdirAbort, MkdirCommit, MkdirIntent,
    PeerCreateDir, PeerDropLink, PeerExchangeIn, PeerForget, PeerLinkIn, PeerRemoveDir, PeerRenameIn, PeerSetParent,
    PeerStep, RenameCommit, RenameIntent, RmdirCommit, RmdirIntent, SetChooser, StepId, UnlinkCommit, UnlinkIntent,
};
use crate::ops::{check_name, dir_inode, is_needs_protocol, load_dentry, load_inode, Mutation};
use crate::store::Kv;
use crate::store::{decode, encode, id_key, load_dirx, load_intent, q, Dentry, Inode, Intent, IntentStep, OpError};
use hivefs_proto::{
    Caller, Envelope, MetaChooser, OpId, PeerOp, Reply, Request, Response, RENAME_EXCHANGE, RENAME_NOREPLACE,
};
use hivefs_types::attr::{EntryAttr, FileKind};
use hivefs_types::error::{ErrorCode, FsError, FsResult};
use hivefs_types::fs_err;
use hivefs_types::ids::{EntryId, NodeId};
use rand::Rng;
use std::collections::HashSet;
use std::hash::Hash;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;
use tracing::{debug, info, warn};

/// Transport failures, after which a step is sent again.
fn transient(e: &FsError) -> bool {
    matches!(e.code, ErrorCode::Unavailable | ErrorCode::TimedOut | ErrorCode::Io)
}

fn unexpected(r: Reply) -> FsError {
    fs_err!(Protocol, "unexpected reply {r:?} from a metadata peer")
}

/// How the remote part of a cross-node operation went.
enum Remote {
    /// The peer refused its step: the intent is undone, answering this error.
    Refused(FsError),
    Done {
        /// Finishes the operation here (and records the client's answer).
        commit: Box<MultiMut>,
        /// The peer that keeps a record of its step until told to forget it.
        forget: Option<NodeId>,
        /// A file whose inode moved to that node: its open handles follow.
        hand_over: Option<(EntryId, NodeId)>,
    },
}

impl Remote {
    fn done(commit: MultiMut) -> Remote {
        Remote::Done { commit: Box::new(commit), forget: None, hand_over: None }
    }
}

/// The undo of an intent whose remote step was refused.
fn undo(step: &IntentStep, intent: EntryId, err: FsError) -> MultiMut {
    match step {
        IntentStep::Mkdir { .. } | IntentStep::MkdirXattrs { .. } => MultiMut::MkdirAbort(MkdirAbort { intent, err }),
        IntentStep::Link { .. } => MultiMut::LinkAbort(LinkAbort { intent, err }),
        _ => MultiMut::Abort(Abort { intent, err }),
    }
}

/// A key held in one of the namespace's in-memory claim sets: a client
/// operation an attempt is carrying out ([`Namespace::claim`]), or an
/// intent whose peer step runs here ([`Namespace::step_lock`]). Dropping
/// it lets a waiting repeat go on.
struct Claim<'a, K: Eq + Hash + Copy> {
    set: &'a Mutex<HashSet<K>>,
    released: &'a Notify,
    key: Option<K>,
}

impl<K: Eq + Hash + Copy> Drop for Claim<'_, K> {
    fn drop(&mut self) {
        if let Some(key) = self.key {
            self.set.lock().expect("claims lock").remove(&key);
            self.released.notify_waiters();
        }
    }
}

/// Takes `key` in `set`, waiting while someone else holds it; whether it waited.
async fn hold<'a, K: Eq + Hash + Copy>(
    set: &'a Mutex<HashSet<K>>,
    released: &'a Notify,
    key: K,
) -> (Claim<'a, K>, bool) {
    let mut waited = false;
    loop {
        let notified = released.notified();
        if set.lock().expect("claims lock").insert(key) {
            return (Claim { set, released, key: Some(key) }, waited);
        }
        waited = true;
        let _ = tokio::time::timeout(Duration::from_secs(1), notified).await;
    }
}

impl Namespace {
    pub fn set_peers(&self, peers: Arc<dyn Peers>) {
        *self.multi.peers.write().expect("peers lock") = Some(peers);
    }

    /// Sets the crash hook (the service reads [`CRASH_ENV`]; unit tests use [`CrashHook::Stop`]).
    pub fn set_crash_hook(&self, hook: CrashHook) {
        *self.multi.crash.write().expect("crash lock") = hook;
    }

    async fn crash(&self, op: &str, step: &str) -> FsResult<()> {
        let hook = self.multi.crash.read().expect("crash lock").clone();
        let r = hook.reached(op, step).await;
        if r.is_err() {
            // As after a crash, nothing this node started goes on: the
            // operation is left to the restart's recovery.
            self.halt();
        }
        r
    }

    /// Makes every step sent to a peer wait for `gate` (see `Multi::gate`):
    /// a former primary that has not yet seen its demotion must not drive a
    /// cross-node operation its successor may have finished already (the
    /// peer, told to forget the step, would apply it again).
    pub fn set_gate(&self, gate: crate::cross::Gate) {
        *self.multi.gate.write().expect("gate lock") = Some(gate);
    }

    fn may_act(&self) -> FsResult<()> {
        self.multi.gate.read().expect("gate lock").as_ref().map_or(Ok(()), |g| g())
    }

    pub(super) fn peers(&self) -> Option<Arc<dyn Peers>> {
        self.multi.peers.read().expect("peers lock").clone()
    }

    fn next_intent(&self) -> EntryId {
        // Minted and noted under one lock: ids enter `minting` in order.
        let mut minting = self.multi.minting.lock().expect("minting lock");
        let c = self.multi.intent_seq.fetch_add(1, Ordering::Relaxed) + 1;
        let id = EntryId { node: self.node().0, epoch: self.epoch(), counter: c };
        minting.insert(id);
        id
    }

    /// The floor sent with a step of `intent` (`crate::cross::step`): the
    /// lowest of the namespace's unfinished intents, minted or recorded.
    /// (A step of another namespace's intent that this node passes on
    /// without that namespace's floor gets the lowest floor, which tells
    /// nothing.)
    fn floor(&self, intent: EntryId) -> FsResult<EntryId> {
        let lo = EntryId { node: intent.node, epoch: 0, counter: 0 };
        if intent.node != self.node().0 {
            return Ok(lo);
        }
        // `minting` first: an intent leaves it only once it is recorded.
        let minting = self.multi.minting.lock().expect("minting lock").first().copied();
        let recorded =
            self.read(|t| match t.intents.range_from(std::ops::Bound::Included(lo.to_bytes().as_slice()))?.next() {
                Some(r) => Ok(EntryId::from_bytes(r?.0.as_slice()).filter(|i| i.node == intent.node)),
                None => Ok(None),
            })?;
        Ok([Some(intent), minting, recorded].into_iter().flatten().min().expect("intent is one"))
    }

    /// Sends step `op` of `intent` to metadata node `node` ([`Namespace::peer_call`]),
    /// applied there at most once ever (`Request::PeerStep`). `floor`: the
    /// coordinator's, when this node passes a step on for it (else this
    /// node's own).
    fn step_call<'a>(
        &'a self,
        node: NodeId,
        intent: EntryId,
        floor: Option<EntryId>,
        op: PeerOp,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = FsResult<Reply>> + Send + 'a>> {
        self.send_peer(node, Some((intent, floor)), op)
    }

    /// Sends a step to metadata node `node` (this node: answered here),
    /// again and again while the peer is unreachable or its commit failed
    /// for now (a mirrored namespace's secondary or mgmtd out of reach):
    /// every step is idempotent, and what comes back is the peer's answer.
    fn peer_call<'a>(
        &'a self,
        node: NodeId,
        op: PeerOp,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = FsResult<Reply>> + Send + 'a>> {
        self.send_peer(node, None, op)
    }

    fn send_peer<'a>(
        &'a self,
        node: NodeId,
        step: Option<(EntryId, Option<EntryId>)>,
        op: PeerOp,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = FsResult<Reply>> + Send + 'a>> {
        Box::pin(async move {
            let peers = match node == self.node() {
                true => None,
                false => Some(self.peers().ok_or_else(|| {
                    fs_err!(Unavailable, "metadata node {node} is not reachable: no peers configured")
                })?),
            };
            let mut backoff = Duration::from_millis(100);
            loop {
                // Not while this node may not act for the namespace: wait
                // (its lease may return). Once it gives the namespace up,
                // the error left is not the peer's refusal, but it is read
                // as one: the undo it leads to is refused by the same check
                // on the commit, and the intent stays.
                let step = match step {
                    Some((intent, Some(floor))) => Some((intent, floor)),
                    Some((intent, None)) => Some((intent, self.floor(intent)?)),
                    None => None,
                };
                let old = self.multi.old_peers.lock().expect("old peers lock").contains(&node);
                let r = match (self.may_act(), &peers, step) {
                    (Err(e), _, _) => Err(e),
                    (Ok(()), None, Some((intent, floor))) => self.peer_step(intent, floor, op.clone()).await,
                    (Ok(()), None, None) => self.peer(op.clone(), None).await,
                    (Ok(()), Some(p), Some((intent, floor))) if !old => {
                        let req = Request::PeerStep { intent, floor, op: op.clone() };
                        match p.call(node, req).await {
                            Err(e) if matches!(e.code, ErrorCode::Protocol | ErrorCode::NotSupported) => {
                                warn!("metadata node {node} does not take PeerStep ({e}); its steps go as MetaPeer");
                                self.multi.old_peers.lock().expect("old peers lock").insert(node);
                                continue;
                            }
                            r => r,
                        }
                    }
                    (Ok(()), Some(p), _) => p.call(node, Request::MetaPeer { op: op.clone() }).await,
                };
                match r {
                    Err(e) if transient(&e) && !self.stopping() => {
                        warn!("metadata node {node} did not take a cross-node step (trying again): {e}");
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(Duration::from_secs(2));
                    }
                    r => return r,
                }
            }
        })
    }

    /// Records a directory count reported by (or chosen for) a node.
    pub fn set_dir_count(&self, node: NodeId, dirs: u64) {
        self.multi.counts.lock().expect("counts lock").insert(node, dirs);
    }

    /// Refreshes the directory counts of all metadata nodes (balanced chooser).
    pub async fn refresh_counts(&self) {
        let Some(peers) = self.peers() else { return };
        for n in peers.meta_nodes() {
            let dirs = if n == self.node() {
                self.counts().map(|(_, d)| d).ok()
            } else {
                match peers.call(n, Request::MetaStat).await {
                    Ok(Reply::MetaStat { dirs, .. }) => Some(dirs),
                    _ => None,
                }
            };
            if let Some(d) = dirs {
                self.set_dir_count(n, d);
            }
        }
    }

    fn choose_owner(&self, chooser: MetaChooser) -> NodeId {
        let me = self.node();
        let Some(peers) = self.peers() else { return me };
        let nodes = peers.new_dir_owners(me);
        if nodes.len() <= 1 {
            return me;
        }
        let mut counts = self.multi.counts.lock().expect("counts lock");
        let random = self.multi.rng.lock().expect("chooser rng lock").gen();
        let n = choose_owner(chooser, &nodes, &counts, &self.multi.rr, random);
        *counts.entry(n).or_insert(0) += 1;
        n
    }

    /// Claims client operation `op` for this attempt, waiting while another
    /// attempt of it runs here (the client repeated it after a timeout) or
    /// its intent is pending (after a restart, recovery finishes it); then
    /// its recorded answer if it was applied. A repeat thus never runs
    /// beside the first attempt: it gets that attempt's answer. The claim
    /// ends when the returned guard is dropped.
    async fn claim(&self, op: Option<OpId>) -> FsResult<(Claim<'_, (u64, u64)>, Option<Response>)> {
        let (set, released) = (&self.multi.pending, &self.multi.finished);
        let Some(op) = op else { return Ok((Claim { set, released, key: None }, None)) };
        let (claim, waited) = hold(set, released, op_key(&op)).await;
        // A wait may have outlasted this node's right to the namespace (a
        // switch-over): the client asks the new primary, whose copy has the
        // attempt's intent or answer. (Without a wait, the request's own
        // check on arrival stands.)
        if waited {
            if self.stopping() {
                return Err(fs_err!(Unavailable, "metadata node {} no longer serves this namespace", self.node()));
            }
            self.may_act()?;
        }
        Ok((claim, self.recorded_reply(&op)?))
    }

    /// Peer steps of one intent run one at a time on this node: a repeat
    /// that arrives while an earlier delivery of the step still runs (its
    /// coordinator gave up on that one, or restarted and drives the intent
    /// again) waits for it. So the repeat reads the record that makes the
    /// step idempotent after that delivery wrote it, and a `Forget` cannot
    /// drop the record while a delivery that would act again without it
    /// (a rename's step on the replaced entry's owner) still runs.
    async fn step_lock(&self, intent: EntryId) -> Claim<'_, EntryId> {
        hold(&self.multi.steps, &self.multi.finished, intent).await.0
    }

    fn set_pending(&self, op: Option<OpId>, on: bool) {
        if let Some(op) = op {
            let mut p = self.multi.pending.lock().expect("pending lock");
            if on {
                p.insert(op_key(&op));
            } else {
                p.remove(&op_key(&op));
                self.multi.finished.notify_waiters();
            }
        }
    }

    async fn submit_multi(&self, op: Option<OpId>, m: MultiMut) -> FsResult<Reply> {
        self.submit_op(op, m).await
    }

    /// Mkdir, on the node chosen by the parent's metadata-node chooser.
    pub(crate) async fn mkdir_any(
        &self,
        parent: EntryId,
        name: Vec<u8>,
        mode: u32,
        caller: Caller,
        op: Option<OpId>,
    ) -> Response {
        let (_claim, first) = self.claim(op).await?;
        if let Some(r) = first {
            return r;
        }
        let chooser = self.read(|t| load_dirx(&t.dirx, parent))?.and_then(|x| x.chooser).unwrap_or_default();
        let owner = self.choose_owner(chooser);
        let Caller { uid, gid, umask } = caller;
        if owner == self.node() {
            return self.submit_op(op, Mutation::Mkdir { parent, name, mode, uid, gid, umask }).await;
        }
        let intent = self.next_intent();
        self.start_protocol(
            "mkdir",
            intent,
            MultiMut::MkdirIntent(MkdirIntent { intent, parent, name, mode, uid, gid, umask, owner, op }),
        )
        .await
    }

    /// Rmdir (`dir`) or unlink; a name whose inode is on another node goes
    /// through the protocol.
    pub(crate) async fn remove_any(&self, parent: EntryId, name: Vec<u8>, dir: bool, op: Option<OpId>) -> Response {
        let (_claim, first) = self.claim(op).await?;
        if let Some(r) = first {
            return r;
        }
        let local = match dir {
            true => Mutation::Rmdir { parent, name: name.clone() },
            false => Mutation::Unlink { parent, name: name.clone() },
        };
        match self.submit_op(op, local).await {
            Err(e) if is_needs_protocol(&e) => {}
            r => return r,
        }
        let intent = self.next_intent();
        let (what, m) = match dir {
            true => ("rmdir", MultiMut::RmdirIntent(RmdirIntent { intent, parent, name, op })),
            false => ("unlink", MultiMut::UnlinkIntent(UnlinkIntent { intent, parent, name, op })),
        };
        self.start_protocol(what, intent, m).await
    }

    /// Rename; `new_owner` is the node owning `new_parent` (`None`: this node).
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn rename_any(
        &self,
        parent: EntryId,
        name: Vec<u8>,
        new_parent: EntryId,
        new_owner: Option<NodeId>,
        new_name: Vec<u8>,
        flags: u32,
        op: Option<OpId>,
    ) -> Response {
        let (_claim, first) = self.claim(op).await?;
        if let Some(r) = first {
            return r;
        }
        let new_owner = new_owner.unwrap_or(self.node());
        if new_owner == self.node() {
            let m = Mutation::Rename { parent, name: name.clone(), new_parent, new_name: new_name.clone(), flags };
            match self.submit_op(op, m).await {
                Err(e) if is_needs_protocol(&e) => {}
                r => return r,
            }
        }
        check_name(&name)?;
        check_name(&new_name)?;
        if flags == RENAME_EXCHANGE {
            return self.exchange_any(parent, name, new_parent, new_owner, new_name, op).await;
        }
        let src = self
            .read(|t| load_dentry(&t.dentries, parent, &name))?
            .ok_or_else(|| fs_err!(NotFound, "no entry {} in directory {parent}", q(&name)))?;
        if src.kind == FileKind::Dir
            && new_parent != parent
            && self.is_within_any(new_parent, new_owner, src.id).await?
        {
            return Err(fs_err!(
                Invalid,
                "cannot move directory {} ({}) into its own subtree ({new_parent})",
                q(&name),
                src.id
            ));
        }
        if src.kind != FileKind::Dir && self.may_have_other_names(&src)? {
            // Two names of one file: POSIX renames nothing (as the local rule).
            match self.lookup_at(new_owner, new_parent, &new_name).await {
                Ok(dst) if dst.id == src.id => return Ok(Reply::Ok),
                Err(e) if transient(&e) => return Err(e),
                _ => {}
            }
        }
        let intent = self.next_intent();
        let m =
            MultiMut::RenameIntent(RenameIntent { intent, parent, name, new_parent, new_owner, new_name, flags, op });
        self.start_protocol("rename", intent, m).await
    }

    /// Whether the non-directory that dentry `src` (held here) names may
    /// have other names: its inode is elsewhere or has more than one link.
    fn may_have_other_names(&self, src: &Dentry) -> FsResult<bool> {
        if src.owner != self.node() {
            return Ok(true);
        }
        Ok(self.read(|t| load_inode(&t.inodes, src.id))?.is_none_or(|i| i.nlink > 1))
    }

    /// Lookup of `parent/name` on metadata node `owner` (this node: here).
    async fn lookup_at(&self, owner: NodeId, parent: EntryId, name: &[u8]) -> FsResult<EntryAttr> {
        if owner == self.node() {
            return self.lookup_any(parent, name).await;
        }
        let peers = self.peers().ok_or_else(|| fs_err!(Unavailable, "metadata node {owner}: no peers configured"))?;
        match peers.call(owner, Request::Lookup { parent, name: name.to_vec() }).await? {
            Reply::Entry(e) => Ok(e),
            r => Err(unexpected(r)),
        }
    }

    /// Sets the ctime of inode `id` on metadata node `owner` to now.
    async fn touch_ctime(&self, owner: NodeId, id: EntryId) -> FsResult<()> {
        if owner == self.node() {
            self.submit_op(None, Mutation::SetAttr { id, attr: Default::default(), privileged: true }).await?;
            return Ok(());
        }
        let peers = self.peers().ok_or_else(|| fs_err!(Unavailable, "metadata node {owner}: no peers configured"))?;
        let req = Request::SetAttr { id, attr: Default::default(), caller: Default::default() };
        peers.call(owner, req).await.map(|_| ())
    }

    /// `RENAME_EXCHANGE` where a part is on another node: only the dentries
    /// swap (inodes stay with their owners, which the dentries name).
    async fn exchange_any(
        &self,
        parent: EntryId,
        name: Vec<u8>,
        new_parent: EntryId,
        new_owner: NodeId,
        new_name: Vec<u8>,
        op: Option<OpId>,
    ) -> Response {
        let a = self
            .read(|t| load_dentry(&t.dentries, parent, &name))?
            .ok_or_else(|| fs_err!(NotFound, "no entry {} in directory {parent}", q(&name)))?;
        let battr = self.lookup_at(new_owner, new_parent, &new_name).await?;
        let b = Dentry { id: battr.id, kind: battr.kind, owner: battr.owner };
        if a.id == b.id {
            return Ok(Reply::Ok);
        }
        if parent != new_parent {
            let into = |d: &Dentry, to: EntryId, to_owner: NodeId| {
                let d = d.clone();
                async move {
                    if d.kind == FileKind::Dir && self.is_within_any(to, to_owner, d.id).await? {
                        return Err(fs_err!(
                            Invalid,
                            "cannot exchange directory {} with an entry inside its own subtree ({to})",
                            d.id
                        ));
                    }
                    Ok(())
                }
            };
            into(&a, new_parent, new_owner).await?;
            into(&b, parent, self.node()).await?;
        }
        let intent = self.next_intent();
        let m =
            MultiMut::ExchangeIntent(ExchangeIntent { intent, parent, name, new_parent, new_owner, new_name, b, op });
        self.start_protocol("exchange", intent, m).await
    }

    /// After rename `intent` moved file `id` to `new_owner`: its open
    /// handles count there (once, however often the hand-over is
    /// delivered), and their requests that reach this node are forwarded.
    async fn hand_over_opens(&self, intent: EntryId, id: EntryId, new_owner: NodeId) {
        let count = {
            let mut opens = self.opens.state.lock().expect("opens lock");
            let count = opens.counts.remove(&id).unwrap_or(0);
            if count > 0 {
                self.multi.moved.lock().expect("moved lock").insert(id, (new_owner, count));
            }
            count
        };
        if count > 0 {
            info!("file {id} moved to metadata node {new_owner} with {count} open handles: they count there now");
            let r = match self.peer_call(new_owner, PeerOp::HandOver { intent, id, count }).await {
                Err(e) if matches!(e.code, ErrorCode::Protocol | ErrorCode::NotSupported) => {
                    debug!("metadata node {new_owner} does not take HandOver ({e}): sent as Opened");
                    self.peer_call(new_owner, PeerOp::Opened { id, count }).await
                }
                r => r,
            };
            if let Err(e) = r {
                warn!("file {id}: handing {count} open handles over to metadata node {new_owner}: {e}");
            }
        }
    }

    /// A request about a file that a rename moved to another node, sent to
    /// that node (the answer of the client's handle opened here).
    pub(crate) async fn forward_moved(&self, op: Option<OpId>, req: &Request) -> Option<Response> {
        let to = {
            let moved = self.multi.moved.lock().expect("moved lock");
            if moved.is_empty() {
                return None;
            }
            let id = match req {
                Request::Open { id, .. }
                | Request::Release { id, .. }
                | Request::UpdateSize { id, .. }
                | Request::UpdateSizeIf { id, .. }
                | Request::TouchAtime { id, .. }
                | Request::GetAttr { id }
                | Request::SetAttr { id, .. } => *id,
                _ => return None,
            };
            let (node, _) = *moved.get(&id)?;
            drop(moved);
            // Only while the inode is not back here (a later rename may return it).
            if !matches!(self.read(|t| load_inode(&t.inodes, id)), Ok(None)) {
                self.multi.moved.lock().expect("moved lock").remove(&id);
                return None;
            }
            // Count handles opened or released through this node.
            let mut moved = self.multi.moved.lock().expect("moved lock");
            match (req, moved.get_mut(&id)) {
                (Request::Open { .. }, Some((_, n))) => *n += 1,
                (Request::Release { .. }, Some((_, n))) => {
                    *n = n.saturating_sub(1);
                    if *n == 0 {
                        moved.remove(&id);
                    }
                }
                _ => {}
            }
            node
        };
        let peers = self.peers()?;
        // The operation id goes along: the new owner applies it once.
        Some(peers.call_with(to, Envelope { op, lease_client: None, mirror: None }, req.clone()).await)
    }

    /// Hard link of file `id` (on this node) as `new_parent/new_name` on
    /// `new_owner`: this node keeps the inode and its link count.
    pub(crate) async fn link_any(
        &self,
        id: EntryId,
        new_parent: EntryId,
        new_owner: NodeId,
        new_name: Vec<u8>,
        op: Option<OpId>,
    ) -> Response {
        let (_claim, first) = self.claim(op).await?;
        if let Some(r) = first {
            return r;
        }
        if new_owner == self.node() {
            return self.submit_op(op, Mutation::Link { id, new_parent, new_name }).await;
        }
        let intent = self.next_intent();
        let m = MultiMut::LinkIntent(LinkIntent { intent, id, new_parent, new_owner, new_name, op });
        self.start_protocol("link", intent, m).await
    }

    /// True if `dir` (owned by `owner`) is `ancestor` or below it, walking
    /// `parent` pointers across nodes.
    async fn is_within_any(&self, dir: EntryId, owner: NodeId, ancestor: EntryId) -> FsResult<bool> {
        let (mut cur, mut owner) = (dir, owner);
        for _ in 0..(1 << 16) {
            if cur == ancestor {
                return Ok(true);
            }
            if cur.is_root() {
                return Ok(false);
            }
            match self.peer_call(owner, PeerOp::GetParent { id: cur }).await? {
                Reply::DirParent { parent, owner: o } => (cur, owner) = (parent, o),
                r => return Err(unexpected(r)),
            }
        }
        Err(fs_err!(Io, "parent chain of {dir} is longer than 65536 directories: corrupt parent pointers"))
    }

    /// Starts a cross-node operation (of client operation `op`, which the
    /// caller has claimed): records its intent, then drives it. `what`
    /// names the operation for the crash hook.
    async fn start_protocol(&self, what: &str, intent: EntryId, m: MultiMut) -> Response {
        let recorded = self.submit_multi(None, m).await;
        self.multi.minting.lock().expect("minting lock").remove(&intent);
        if recorded.is_err() {
            // The intent may have taken a file's inode in a batch that failed.
            self.opens.moving.end(intent, false);
        }
        recorded?;
        self.crash(what, "intent").await?;
        self.drive(intent).await
    }

    /// Carries an intent from its remote step to its commit (or undo): the
    /// one shape of every cross-node operation. The operation's remote step
    /// ([`Namespace::remote`]) says how it went; then the crash points, the
    /// commit (or the undo of a refused step) with the client's answer, and
    /// the clean-up on the peer follow, the same for every operation.
    ///
    /// A transient failure leaves the intent in place (a peer's step that
    /// kept failing, or a commit this node could not make now: on a
    /// mirrored namespace, when the secondary and mgmtd are out of reach).
    /// The intent is then driven again, from its remote step, until it ends,
    /// while this node serves the namespace: left to the next start, it
    /// would hold its names locked, and a repeat of the client's request
    /// (which waits for this attempt) would run the operation again.
    pub(crate) async fn drive(&self, intent: EntryId) -> Response {
        let mut backoff = Duration::from_millis(100);
        loop {
            let r = self.drive_once(intent).await;
            match &r {
                Err(e) if transient(e) && !self.stopping() => {
                    warn!("cross-node operation {intent} did not finish (trying again in {backoff:?}): {e}");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                }
                _ => return r,
            }
        }
    }

    async fn drive_once(&self, intent: EntryId) -> Response {
        let Some(rec) = self.read(|t| load_intent(&t.intents, intent))? else {
            return Err(fs_err!(Busy, "cross-node operation {intent} already finished"));
        };
        let what = rec.step.op_name();
        match self.remote(intent, &rec.step).await? {
            Remote::Refused(err) => {
                let r = self.submit_multi(rec.op, undo(&rec.step, intent, err)).await;
                self.moved(intent, false);
                r
            }
            Remote::Done { commit, forget, hand_over } => {
                self.crash(what, "remote").await?;
                let r = self.submit_multi(rec.op, *commit).await;
                self.crash(what, "commit").await?;
                if let (Ok(_), Some((id, to))) = (&r, hand_over) {
                    self.hand_over_opens(intent, id, to).await;
                }
                // Changes that waited for a moved file go to its new owner now.
                self.moved(intent, true);
                // Only after the commit: while the intent stands, driving it
                // again repeats the peer's step, which its record keeps
                // from acting twice.
                if let (Ok(_), Some(peer)) = (&r, forget) {
                    self.forget(peer, intent).await;
                }
                r
            }
        }
    }

    /// Once intent `intent` is gone (committed or undone): the file it
    /// moved, if any, takes changes again (see `moving`).
    fn moved(&self, intent: EntryId, committed: bool) {
        if matches!(self.read(|t| load_intent(&t.intents, intent)), Ok(None)) {
            self.opens.moving.end(intent, committed);
        }
    }

    /// The remote part of the operation `step` records: the peer's step
    /// (refused: undone), then changes that follow from it on the inodes'
    /// owners (best effort: a failure there is logged, not undone). An
    /// error leaves the intent for the recovery at the next start.
    async fn remote(&self, intent: EntryId, step: &IntentStep) -> FsResult<Remote> {
        let me = self.node();
        let refused = |r: FsResult<Reply>| r.err().map(Remote::Refused);
        Ok(match step.clone() {
            step @ (IntentStep::Mkdir { .. } | IntentStep::MkdirXattrs { .. }) => {
                let (id, owner, inode, chooser, xattrs) = match step {
                    IntentStep::Mkdir { id, owner, inode, chooser, .. } => (id, owner, inode, chooser, Vec::new()),
                    IntentStep::MkdirXattrs { id, owner, inode, chooser, xattrs, .. } => {
                        (id, owner, inode, chooser, xattrs)
                    }
                    _ => unreachable!("matched above"),
                };
                let req = PeerOp::CreateDir { id, inode: encode(&inode), parent_owner: me, chooser, xattrs };
                match self.step_call(owner, intent, None, req).await {
                    Ok(Reply::Entry(attr)) => Remote::done(MultiMut::MkdirCommit(MkdirCommit { intent, attr })),
                    Ok(r) => return Err(unexpected(r)),
                    Err(err) => Remote::Refused(err),
                }
            }
            IntentStep::Rmdir { id, owner, .. } => {
                match self.step_call(owner, intent, None, PeerOp::RemoveDir { id }).await {
                    Ok(_) => Remote::done(MultiMut::RmdirCommit(RmdirCommit { intent })),
                    Err(err) => Remote::Refused(err),
                }
            }
            IntentStep::Rename { parent, new_parent, new_owner, new_name, flags, id, kind, owner, moved, .. } => {
                let moved_file = moved.is_some();
                let (inode, xattrs) = match moved {
                    Some((i, x)) => (Some(encode(&i)), x),
                    None => (None, Vec::new()),
                };
                let req = PeerOp::RenameIn {
                    intent,
                    src_parent: parent,
                    new_parent,
                    new_name,
                    flags,
                    id,
                    kind,
                    owner,
                    inode,
                    xattrs,
                };
                if let Some(r) = refused(self.step_call(new_owner, intent, None, req).await) {
                    return Ok(r);
                }
                if kind == FileKind::Dir && parent != new_parent {
                    let set = PeerOp::SetParent { id, parent: new_parent, parent_owner: new_owner };
                    if let Err(e) = self.step_call(owner, intent, None, set).await {
                        warn!("rename of directory {id}: its parent pointer on metadata node {owner}: {e}");
                    }
                } else if kind != FileKind::Dir && !moved_file {
                    // The inode stays on its owner: a rename changes its ctime (as Linux).
                    if let Err(e) = self.touch_ctime(owner, id).await {
                        warn!("rename of {id}: its ctime on metadata node {owner}: {e}");
                    }
                }
                let away = new_owner != me;
                Remote::Done {
                    commit: Box::new(MultiMut::RenameCommit(RenameCommit { intent })),
                    forget: away.then_some(new_owner),
                    hand_over: (moved_file && away).then_some((id, new_owner)),
                }
            }
            IntentStep::Link { new_parent, new_owner, new_name, id, kind } => {
                let req = PeerOp::LinkIn { intent, new_parent, new_name, id, kind, owner: me };
                if let Some(r) = refused(self.step_call(new_owner, intent, None, req).await) {
                    return Ok(r);
                }
                Remote::Done {
                    commit: Box::new(MultiMut::LinkCommit(LinkCommit { intent })),
                    forget: Some(new_owner),
                    hand_over: None,
                }
            }
            IntentStep::Exchange { parent, new_parent, new_owner, new_name, a, b, .. } => {
                let req = PeerOp::ExchangeIn {
                    intent,
                    new_parent,
                    new_name,
                    expect: b.id,
                    id: a.id,
                    kind: a.kind,
                    owner: a.owner,
                };
                if let Some(r) = refused(self.step_call(new_owner, intent, None, req).await) {
                    return Ok(r);
                }
                for (d, to, to_owner) in [(&a, new_parent, new_owner), (&b, parent, me)] {
                    let r = if d.kind == FileKind::Dir && parent != new_parent {
                        let set = PeerOp::SetParent { id: d.id, parent: to, parent_owner: to_owner };
                        self.step_call(d.owner, intent, None, set).await.map(|_| ())
                    } else if d.kind == FileKind::Dir {
                        Ok(())
                    } else {
                        self.touch_ctime(d.owner, d.id).await
                    };
                    if let Err(e) = r {
                        warn!("exchange of {}: its parent or ctime on metadata node {}: {e}", d.id, d.owner);
                    }
                }
                let forget = (new_owner != me).then_some(new_owner);
                Remote::Done {
                    commit: Box::new(MultiMut::ExchangeCommit(ExchangeCommit { intent })),
                    forget,
                    hand_over: None,
                }
            }
            IntentStep::Unlink { id, owner, .. } => {
                if let Some(r) = refused(self.step_call(owner, intent, None, PeerOp::DropLink { intent, id }).await) {
                    return Ok(r);
                }
                Remote::Done {
                    commit: Box::new(MultiMut::UnlinkCommit(UnlinkCommit { intent })),
                    forget: Some(owner),
                    hand_over: None,
                }
            }
        })
    }

    /// Intents left by an earlier run, and the client operations waiting on them.
    pub fn load_pending(&self) -> FsResult<Vec<(EntryId, Intent)>> {
        let list = self.read(|t| {
            let mut out = Vec::new();
            for r in t.intents.iter()? {
                let (k, v) = r?;
                let id = EntryId::from_bytes(k.as_slice())
                    .ok_or_else(|| OpError::Fatal(format!("intent key of {} bytes", k.as_slice().len())))?;
                out.push((id, decode::<Intent>("intent", id, v.as_slice()).map_err(OpError::Fatal)?));
            }
            Ok(out)
        })?;
        for (intent, i) in &list {
            self.set_pending(i.op, true);
            if let IntentStep::Rename { id, new_owner, moved: Some(_), .. } = &i.step {
                self.opens.moving.start(*id, *intent, *new_owner);
            }
        }
        Ok(list)
    }

    /// Finishes (or undoes) the intents an earlier run left (from
    /// [`Namespace::load_pending`], called before serving), retrying until
    /// the peers answer.
    pub async fn recover_intents(self: Arc<Self>, list: Vec<(EntryId, Intent)>) {
        for (intent, rec) in list {
            info!("finishing pending cross-node operation: {rec}");
            let r = self.drive(intent).await;
            if let Err(e) = &r {
                info!("pending {} {intent} ended with: {e}", rec.step.op_name());
            }
            self.set_pending(rec.op, false);
        }
    }

    /// Pending intents as text (for `hivefs fsck`).
    pub fn intents_text(&self) -> FsResult<Vec<String>> {
        let list = self.read(|t| {
            let mut out = Vec::new();
            for r in t.intents.iter()? {
                let (k, v) = r?;
                let s = match decode::<Intent>("intent", format_args!("{:?}", k.as_slice()), v.as_slice()) {
                    Ok(i) => i.to_string(),
                    Err(e) => e,
                };
                out.push(s);
            }
            Ok(out)
        })?;
        Ok(list)
    }

    /// Lookup of a name whose inode may be on another node (asked there).
    pub(crate) async fn lookup_any(&self, parent: EntryId, name: &[u8]) -> FsResult<EntryAttr> {
        let node = self.node();
        let remote = self.read(|t| {
            if name == b".." {
                let p = dir_inode(&t.inodes, parent)?;
                let owner = load_dirx(&t.dirx, parent)?.and_then(|x| x.parent_owner).filter(|o| *o != node);
                return Ok(owner.map(|o| (p.parent.unwrap_or(EntryId::ROOT), o)));
            }
            if name == b"." {
                return Ok(None);
            }
            Ok(load_dentry(&t.dentries, parent, name)?.filter(|d| d.owner != node).map(|d| (d.id, d.owner)))
        })?;
        match remote {
            None => self.lookup(parent, name),
            Some((id, owner)) => {
                let peers =
                    self.peers().ok_or_else(|| fs_err!(Unavailable, "entry {id} is on metadata node {owner}"))?;
                match peers.call(owner, Request::GetAttr { id }).await? {
                    Reply::Entry(a) => Ok(a),
                    r => Err(unexpected(r)),
                }
            }
        }
    }

    /// After the commit of `intent`: a peer that took its step as
    /// `MetaPeer` (an older build) may drop its record of it. (A peer that
    /// took `PeerStep` drops it once the floor passes the intent.)
    async fn forget(&self, peer: NodeId, intent: EntryId) {
        if self.multi.old_peers.lock().expect("old peers lock").contains(&peer) {
            let _ = self.peer_call(peer, PeerOp::Forget { intent }).await;
        }
    }

    /// Answers step `op` of `intent` sent with `Request::PeerStep`: at most
    /// once ever (`crate::cross::step`).
    pub(crate) async fn peer_step(&self, intent: EntryId, floor: EntryId, op: PeerOp) -> Response {
        let (tag, subject) = match &op {
            PeerOp::CreateDir { id, .. } => (1, *id),
            PeerOp::RemoveDir { id } => (2, *id),
            PeerOp::SetParent { id, .. } => (3, *id),
            PeerOp::RenameIn { id, .. } => (4, *id),
            PeerOp::LinkIn { id, .. } => (5, *id),
            PeerOp::DropLink { id, .. } => (6, *id),
            PeerOp::ExchangeIn { id, .. } => (7, *id),
            PeerOp::GetParent { .. } | PeerOp::Forget { .. } | PeerOp::Opened { .. } | PeerOp::HandOver { .. } => {
                return Err(fs_err!(
                    Protocol,
                    "PeerStep of intent {intent}: GetParent, Forget and Opened are not steps"
                ));
            }
        };
        self.peer(op, Some(StepId { intent, floor, tag, subject })).await
    }

    /// Answers a step sent by the coordinating node: with `Request::MetaPeer`
    /// (`step` is `None`), or `Request::PeerStep` (applied once per `step`).
    pub(crate) async fn peer(&self, op: PeerOp, step: Option<StepId>) -> Response {
        let _step = match (&step, &op) {
            (Some(s), _) => Some(self.step_lock(s.intent).await),
            (
                None,
                PeerOp::RenameIn { intent, .. }
                | PeerOp::Forget { intent }
                | PeerOp::LinkIn { intent, .. }
                | PeerOp::DropLink { intent, .. }
                | PeerOp::ExchangeIn { intent, .. },
            ) => Some(self.step_lock(*intent).await),
            _ => None,
        };
        // A rename's step passes a step on before its own commit: settled
        // already (a late delivery, or a repeat of one applied), nothing of
        // it runs again. (Every other step is checked in its commit only.)
        if let (Some(s), PeerOp::RenameIn { .. }) = (&step, &op) {
            if let Some(r) = self.read(|t| settled(&t.peer_done, s))? {
                return r;
            }
        }
        let submit = |m: MultiMut| {
            let m = match step {
                Some(step) => MultiMut::PeerStep(PeerStep { step, inner: Box::new(m) }),
                None => m,
            };
            self.submit_multi(None, m)
        };
        match op {
            PeerOp::CreateDir { id, inode, parent_owner, chooser, xattrs } => {
                let inode: Inode = decode("inode", id, &inode).map_err(|m| fs_err!(Protocol, "{m}"))?;
                let m = PeerCreateDir { id, inode, parent_owner, chooser, xattrs };
                let r = submit(MultiMut::PeerCreateDir(m)).await;
                self.crash("mkdir", "peer").await?;
                r
            }
            PeerOp::RemoveDir { id } => {
                let r = submit(MultiMut::PeerRemoveDir(PeerRemoveDir { id })).await;
                self.crash("rmdir", "peer").await?;
                r
            }
            PeerOp::SetParent { id, parent, parent_owner } => {
                submit(MultiMut::PeerSetParent(PeerSetParent { id, parent, parent_owner })).await
            }
            PeerOp::GetParent { id } => {
                let node = self.node();
                self.read(|t| {
                    let i = dir_inode(&t.inodes, id)?;
                    let owner = load_dirx(&t.dirx, id)?.and_then(|x| x.parent_owner).unwrap_or(node);
                    Ok(Reply::DirParent { parent: i.parent.unwrap_or(EntryId::ROOT), owner })
                })
            }
            PeerOp::RenameIn { intent, src_parent, new_parent, new_name, flags, id, kind, owner, inode, xattrs } => {
                let node = self.node();
                // A directory being replaced that lives on another node goes
                // first (emptiness checked there, atomically with its removal).
                let victim = self.read(|t| {
                    if t.peer_done.get(id_key(intent).as_slice())?.is_some() {
                        return Ok(None);
                    }
                    Ok(load_dentry(&t.dentries, new_parent, &new_name)?.filter(|d| d.id != id && d.owner != node))
                })?;
                let mut dropped = None;
                if let Some(d) = victim {
                    let is_dir = d.kind == FileKind::Dir;
                    if flags & RENAME_NOREPLACE == 0 && is_dir == (kind == FileKind::Dir) {
                        let floor = step.map(|s| s.floor);
                        if is_dir {
                            self.step_call(d.owner, intent, floor, PeerOp::RemoveDir { id: d.id }).await?;
                        } else {
                            self.step_call(d.owner, intent, floor, PeerOp::DropLink { intent, id: d.id }).await?;
                            dropped = Some(d.owner);
                        }
                    }
                }
                let inode = match inode {
                    Some(b) => Some(decode::<Inode>("inode", id, &b).map_err(|m| fs_err!(Protocol, "{m}"))?),
                    None => None,
                };
                let m = MultiMut::PeerRenameIn(PeerRenameIn {
                    intent,
                    src_parent,
                    new_parent,
                    new_name,
                    flags,
                    dentry: Dentry { id, kind, owner },
                    inode,
                    xattrs,
                });
                let r = submit(m).await;
                if let (Ok(_), Some(o)) = (&r, dropped) {
                    self.forget(o, intent).await;
                }
                self.crash("rename", "peer").await?;
                r
            }
            PeerOp::Forget { intent } => self.submit_multi(None, MultiMut::PeerForget(PeerForget { intent })).await,
            PeerOp::LinkIn { intent, new_parent, new_name, id, kind, owner } => {
                let dentry = Dentry { id, kind, owner };
                let r = submit(MultiMut::PeerLinkIn(PeerLinkIn { intent, new_parent, new_name, dentry })).await;
                self.crash("link", "peer").await?;
                r
            }
            PeerOp::DropLink { intent, id } => {
                let r = submit(MultiMut::PeerDropLink(PeerDropLink { intent, id })).await;
                self.crash("unlink", "peer").await?;
                r
            }
            PeerOp::ExchangeIn { intent, new_parent, new_name, expect, id, kind, owner } => {
                let put = Dentry { id, kind, owner };
                let m = MultiMut::PeerExchangeIn(PeerExchangeIn { intent, new_parent, new_name, expect, put });
                let r = submit(m).await;
                self.crash("exchange", "peer").await?;
                r
            }
            PeerOp::Opened { id, count } => {
                if count > 0 {
                    *self.opens.state.lock().expect("opens lock").counts.entry(id).or_insert(0) += count;
                }
                Ok(Reply::Ok)
            }
            PeerOp::HandOver { intent, id, count } => {
                if !self.opens.handed_over(intent, id, count) {
                    debug!("open handles of {id} handed over by {intent} again: counted once");
                }
                Ok(Reply::Ok)
            }
        }
    }

    pub(crate) fn meta_chooser(&self, id: EntryId) -> FsResult<MetaChooser> {
        self.read(|t| {
            dir_inode(&t.inodes, id)?;
            Ok(load_dirx(&t.dirx, id)?.and_then(|x| x.chooser).unwrap_or_default())
        })
    }

    pub(crate) async fn set_meta_chooser(&self, id: EntryId, chooser: MetaChooser, op: Option<OpId>) -> Response {
        self.submit_multi(op, MultiMut::SetChooser(SetChooser { id, chooser })).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::namespace::NamespaceOptions;
    use crate::targets::{BoxFut, DataTargets};
    use hivefs_proto::Caller;
    use hivefs_types::ids::{PoolId, TargetId};
    use std::collections::HashMap;
    use std::sync::atomic::AtomicBool;
    use std::sync::{Mutex, Weak};

    struct OneTarget;
    impl DataTargets for OneTarget {
        fn candidates(&self, _pool: PoolId) -> Vec<(TargetId, NodeId, u64)> {
            vec![(TargetId(1), NodeId(9), 1 << 30)]
        }
        fn truncate_chunk(&self, _t: hivefs_types::pattern::StripeUnit, _e: EntryId, _l: u64) -> BoxFut<FsResult<()>> {
            Box::pin(async { Ok(()) })
        }
        fn unlink_chunk(&self, _t: hivefs_types::pattern::StripeUnit, _e: EntryId) -> BoxFut<FsResult<()>> {
            Box::pin(async { Ok(()) })
        }
    }

    /// In-process metadata nodes that reach each other through `handle`.
    #[derive(Default)]
    struct Net(Mutex<HashMap<NodeId, Weak<Namespace>>>);

    impl Peers for Net {
        fn meta_nodes(&self) -> Vec<NodeId> {
            let mut v: Vec<NodeId> = self.0.lock().unwrap().keys().copied().collect();
            v.sort();
            v
        }
        fn call_with(&self, node: NodeId, env: Envelope, req: Request) -> BoxFut<FsResult<Reply>> {
            let ns = self.0.lock().unwrap().get(&node).and_then(|w| w.upgrade());
            Box::pin(async move {
                match ns {
                    Some(ns) => ns.handle_env(env, req).await,
                    None => Err(fs_err!(Unavailable, "metadata node {node} is down")),
                }
            })
        }
    }

    struct Cluster {
        net: Arc<Net>,
        dirs: Vec<tempfile::TempDir>,
        nodes: Vec<Option<Arc<Namespace>>>,
    }

    impl Cluster {
        fn new(n: usize) -> Cluster {
            let mut c = Cluster { net: Arc::new(Net::default()), dirs: Vec::new(), nodes: Vec::new() };
            for _ in 0..n {
                c.dirs.push(tempfile::tempdir().unwrap());
                c.nodes.push(None);
            }
            for i in 0..n {
                c.start(i);
            }
            c
        }

        fn start(&mut self, i: usize) -> Vec<(EntryId, Intent)> {
            let opts = NamespaceOptions {
                dir: self.dirs[i].path().to_path_buf(),
                sync: false,
                node: NodeId(i as u32 + 1),
                seed: Some(7),
                clock: None,
                min_free_bytes: 0,
                inline_writer: None,
            };
            let ns = Arc::new(Namespace::open(opts, Arc::new(OneTarget)).unwrap());
            ns.set_peers(self.net.clone());
            let pending = ns.load_pending().unwrap();
            self.net.0.lock().unwrap().insert(ns.node(), Arc::downgrade(&ns));
            self.nodes[i] = Some(ns);
            pending
        }

        fn ns(&self, i: usize) -> Arc<Namespace> {
            self.nodes[i].clone().expect("node running")
        }

        /// Stops node `i` as a crash would (nothing after the last commit)
        /// and starts it again, finishing its pending intents.
        async fn restart(&mut self, i: usize) {
            let ns = self.nodes[i].take().unwrap();
            self.net.0.lock().unwrap().remove(&ns.node());
            let mut ns = ns;
            let ns = loop {
                match Arc::try_unwrap(ns) {
                    Ok(n) => break n,
                    Err(still) => {
                        ns = still;
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                }
            };
            ns.close();
            let pending = self.start(i);
            self.ns(i).recover_intents(pending).await;
        }
    }

    fn mkdir_req(parent: EntryId, name: &str) -> Request {
        Request::Mkdir { parent, name: name.into(), mode: 0o755, caller: Caller::default() }
    }

    fn create_req(parent: EntryId, name: &str) -> Request {
        let caller = Caller::default();
        Request::Create { parent, name: name.into(), kind: FileKind::File, mode: 0o644, rdev: 0, excl: true, caller }
    }

    fn retryable(seq: u64, req: &Request) -> (Envelope, Request) {
        (Envelope { op: Some(OpId { client: 5, seq, done_below: 0 }), lease_client: None, mirror: None }, req.clone())
    }

    fn attr(r: Response) -> EntryAttr {
        match r.unwrap() {
            Reply::Entry(a) => a,
            r => panic!("{r:?}"),
        }
    }

    fn intents(ns: &Namespace) -> Vec<String> {
        ns.intents_text().unwrap()
    }

    async fn setup() -> Cluster {
        let c = Cluster::new(2);
        c.ns(0).ensure_root().await.unwrap();
        // Node 2 owns fewer directories: balanced puts new ones there.
        c.ns(0).set_dir_count(NodeId(1), 100);
        c
    }

    /// A step delivered again after its operation finished (a request the
    /// coordinator gave up on, read late) changes nothing: while the floor
    /// is below its intent, the recorded answer; once the coordinator's
    /// floor passed it, a refusal, and the records below the floor are gone.
    /// The same delivery as `MetaPeer` (no record, no floor) makes the
    /// removed directory come back.
    #[tokio::test]
    async fn a_step_delivered_after_its_operation_finished_is_not_applied_again() {
        let c = setup().await;
        let (n1, n2) = (c.ns(0), c.ns(1));
        let id = EntryId { node: 1, epoch: 9, counter: 1 };
        let mut inode = crate::ops::new_inode(FileKind::Dir, 0o755, 0, 0, Default::default());
        inode.parent = Some(EntryId::ROOT);
        let create =
            PeerOp::CreateDir { id, inode: encode(&inode), parent_owner: NodeId(1), chooser: None, xattrs: Vec::new() };
        let step = |intent, floor, op: &PeerOp| Request::PeerStep { intent, floor, op: op.clone() };
        let remove = PeerOp::RemoveDir { id };
        let (i1, i2, i3) = (n1.next_intent(), n1.next_intent(), n1.next_intent());
        assert_eq!(attr(n2.handle(step(i1, i1, &create)).await).id, id);
        assert_eq!(attr(n2.handle(step(i1, i1, &create)).await).id, id, "a repeat: the first answer");
        n2.handle(step(i2, i1, &remove)).await.unwrap();
        assert!(n2.getattr(id).is_err());
        // Late, with the floor still at i1: the first answer, and nothing is made.
        assert_eq!(attr(n2.handle(step(i1, i1, &create)).await).id, id);
        assert!(n2.getattr(id).is_err(), "the removed directory came back");
        // A step of i3 tells that i1 and i2 finished.
        let other = PeerOp::RemoveDir { id: EntryId { node: 1, epoch: 9, counter: 2 } };
        n2.handle(step(i3, i3, &other)).await.unwrap();
        let records = n2.read(|t| Ok(t.peer_done.iter()?.count())).unwrap();
        assert_eq!(records, 2, "the floor and i3's step");
        let late = n2.handle(step(i1, i1, &create)).await.unwrap_err();
        assert_eq!(late.code, ErrorCode::Invalid, "{late}");
        assert!(n2.getattr(id).is_err(), "the removed directory came back");
        // Without the records: it does.
        attr(n2.handle(Request::MetaPeer { op: create }).await);
        assert!(n2.getattr(id).is_ok());
    }

    #[tokio::test]
    async fn mkdir_lookup_rename_rmdir_across_two_nodes() {
        let c = setup().await;
        let (n1, n2) = (c.ns(0), c.ns(1));
        let d = attr(n1.handle(mkdir_req(EntryId::ROOT, "d")).await);
        assert_eq!(d.owner, NodeId(2));
        assert_eq!(n2.getattr(d.id).unwrap().kind, FileKind::Dir);
        assert_eq!(
            attr(n1.handle(Request::Lookup { parent: EntryId::ROOT, name: b"d".to_vec() }).await).owner,
            NodeId(2)
        );
        assert_eq!(n1.getattr(EntryId::ROOT).unwrap().nlink, 3);
        // `..` of d is the root on node 1.
        let up = attr(n2.handle(Request::Lookup { parent: d.id, name: b"..".to_vec() }).await);
        assert_eq!((up.id, up.owner), (EntryId::ROOT, NodeId(1)));
        // A file moves from the root (node 1) into d (node 2) with its xattr.
        let create = create_req(EntryId::ROOT, "f");
        let f = attr(n1.handle(create).await);
        let sx = Request::SetXattr { id: f.id, name: b"user.a".to_vec(), value: b"1".to_vec(), flags: 0 };
        n1.handle(sx).await.unwrap();
        let mv = Request::RenameTo {
            parent: EntryId::ROOT,
            name: b"f".to_vec(),
            new_parent: d.id,
            new_parent_owner: NodeId(2),
            new_name: b"g".to_vec(),
            flags: 0,
        };
        n1.handle_env(retryable(1, &mv).0, mv.clone()).await.unwrap();
        assert!(n1.getattr(f.id).is_err(), "the inode left node 1");
        assert_eq!(n2.lookup(d.id, b"g").unwrap().pattern, f.pattern);
        assert_eq!(n2.getxattr(f.id, b"user.a").unwrap(), b"1");
        // A repeat of the same operation gets the first answer.
        n1.handle_env(retryable(1, &mv).0, mv.clone()).await.unwrap();
        // Non-empty, then empty rmdir of the remote directory.
        let rm = Request::Rmdir { parent: EntryId::ROOT, name: b"d".to_vec() };
        assert_eq!(n1.handle(rm.clone()).await.unwrap_err().code, ErrorCode::NotEmpty);
        n2.handle(Request::Unlink { parent: d.id, name: b"g".to_vec() }).await.unwrap();
        n1.handle(rm).await.unwrap();
        assert!(n2.getattr(d.id).is_err());
        assert_eq!(n1.getattr(EntryId::ROOT).unwrap().nlink, 2);
        assert!(intents(&n1).is_empty());
    }

    /// A directory made on another node inherits the default ACL of its
    /// parent (which lives on the coordinator): access and default ACL
    /// arrive with the inode.
    #[tokio::test]
    async fn a_directory_on_another_node_inherits_the_default_acl() {
        use hivefs_types::acl::{Acl, Entry, Tag, XATTR_ACCESS, XATTR_DEFAULT};
        let c = setup().await;
        let (n1, n2) = (c.ns(0), c.ns(1));
        let dflt = Acl::new(
            [(Tag::UserObj, 7), (Tag::User(1001), 7), (Tag::GroupObj, 5), (Tag::Mask, 7), (Tag::Other, 0)]
                .into_iter()
                .map(|(tag, perm)| Entry { tag, perm })
                .collect(),
        )
        .unwrap();
        let sx = Request::SetXattr { id: EntryId::ROOT, name: XATTR_DEFAULT.to_vec(), value: dflt.encode(), flags: 0 };
        n1.handle(sx).await.unwrap();
        let caller = Caller { umask: Some(0o077), ..Caller::default() };
        let d =
            attr(n1.handle(Request::Mkdir { parent: EntryId::ROOT, name: b"d".to_vec(), mode: 0o750, caller }).await);
        assert_eq!((d.owner, d.mode), (NodeId(2), 0o750), "mode from the default ACL masked by 0750, umask unused");
        let mut access = dflt.clone();
        access.chmod(0o750);
        assert_eq!(n2.getxattr(d.id, XATTR_ACCESS).unwrap(), access.encode());
        assert_eq!(n2.getxattr(d.id, XATTR_DEFAULT).unwrap(), dflt.encode());
        assert!(intents(&n1).is_empty());
    }

    /// Peers whose destination half of a rename waits for a permit.
    struct HeldRenameIn {
        net: Arc<Net>,
        permits: Arc<tokio::sync::Semaphore>,
    }

    impl Peers for HeldRenameIn {
        fn meta_nodes(&self) -> Vec<NodeId> {
            self.net.meta_nodes()
        }
        fn call_with(&self, node: NodeId, env: Envelope, req: Request) -> BoxFut<FsResult<Reply>> {
            let wait = matches!(&req, Request::PeerStep { op: PeerOp::RenameIn { .. }, .. });
            let (net, permits) = (self.net.clone(), self.permits.clone());
            Box::pin(async move {
                if wait {
                    permits.acquire().await.expect("open").forget();
                }
                net.call_with(node, env, req).await
            })
        }
    }

    /// Changes to a file's inode made on its old node while a rename moves
    /// it to another one (between the intent, which takes the inode, and the
    /// commit, which removes it) wait for the move and land at the new
    /// owner. They used to land on the copy the commit removed: a size
    /// reported at a close right then was lost.
    #[tokio::test]
    async fn changes_made_while_a_rename_moves_the_inode_land_where_it_went() {
        let c = setup().await;
        let (n1, n2) = (c.ns(0), c.ns(1));
        let d = attr(n1.handle(mkdir_req(EntryId::ROOT, "d")).await);
        assert_eq!(d.owner, NodeId(2));
        let f = attr(n1.handle(create_req(EntryId::ROOT, "f")).await);
        let permits = Arc::new(tokio::sync::Semaphore::new(0));
        n1.set_peers(Arc::new(HeldRenameIn { net: c.net.clone(), permits: permits.clone() }));
        let rename = tokio::spawn({
            let n1 = n1.clone();
            let to_d = Request::RenameTo {
                parent: EntryId::ROOT,
                name: b"f".to_vec(),
                new_parent: d.id,
                new_parent_owner: NodeId(2),
                new_name: b"f".to_vec(),
                flags: 0,
            };
            async move { n1.handle(to_d).await }
        });
        while intents(&n1).is_empty() {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        // The intent took the inode: a close's size report and a chmod come now.
        let size = Request::UpdateSize { id: f.id, size: 12_345, mtime: None };
        let size = tokio::spawn({
            let n1 = n1.clone();
            async move { n1.handle_env(retryable(1, &size).0, size).await }
        });
        let chmod = Request::SetAttr {
            id: f.id,
            attr: hivefs_types::attr::SetAttr { mode: Some(0o600), ..Default::default() },
            caller: Caller::default(),
        };
        let chmod = tokio::spawn({
            let n1 = n1.clone();
            async move { n1.handle(chmod).await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!size.is_finished() && !chmod.is_finished(), "changes wait while the inode moves");
        permits.add_permits(1);
        rename.await.unwrap().unwrap();
        assert_eq!(attr(size.await.unwrap()).size, 12_345);
        assert_eq!(attr(chmod.await.unwrap()).mode & 0o7777, 0o600);
        let moved = n2.lookup_any(d.id, b"f").await.unwrap();
        assert_eq!(
            (moved.owner, moved.size, moved.mode & 0o7777),
            (NodeId(2), 12_345, 0o600),
            "landed at the new owner"
        );
        assert!(n1.getattr(f.id).is_err(), "nothing left on the old node");
        assert!(intents(&n1).is_empty() && !n1.opens.moving.contains(f.id));
    }

    /// A rename across nodes onto another name of the same file renames
    /// nothing (POSIX), as the local rule does: both names stay. (It used
    /// to remove the source name and leave the link count one too high.)
    #[tokio::test]
    async fn renaming_a_file_onto_its_other_name_across_nodes_changes_nothing() {
        let c = setup().await;
        let (n1, n2) = (c.ns(0), c.ns(1));
        let d = attr(n1.handle(mkdir_req(EntryId::ROOT, "d")).await);
        assert_eq!(d.owner, NodeId(2));
        let create = create_req(EntryId::ROOT, "f");
        let f = attr(n1.handle(create).await);
        // d/g on node 2 names f, whose inode stays on node 1.
        let link = Request::LinkTo { id: f.id, new_parent: d.id, new_parent_owner: NodeId(2), new_name: b"g".to_vec() };
        attr(n1.handle(link).await);
        let to_root = Request::RenameTo {
            parent: d.id,
            name: b"g".to_vec(),
            new_parent: EntryId::ROOT,
            new_parent_owner: NodeId(1),
            new_name: b"f".to_vec(),
            flags: 0,
        };
        let to_d = Request::RenameTo {
            parent: EntryId::ROOT,
            name: b"f".to_vec(),
            new_parent: d.id,
            new_parent_owner: NodeId(2),
            new_name: b"g".to_vec(),
            flags: RENAME_NOREPLACE,
        };
        for (coordinator, req) in [(&n2, to_root), (&n1, to_d)] {
            coordinator.handle(req.clone()).await.unwrap_or_else(|e| panic!("{req:?}: {e}"));
            assert_eq!(n1.lookup(EntryId::ROOT, b"f").unwrap().id, f.id, "{req:?}");
            assert_eq!(n2.lookup_any(d.id, b"g").await.unwrap().id, f.id, "{req:?}");
            assert_eq!(n1.getattr(f.id).unwrap().nlink, 2, "{req:?}");
            assert!(intents(&n1).is_empty() && intents(&n2).is_empty());
        }
    }

    /// A client's repeat of an operation (same id; its transport timed out)
    /// that arrives while the first attempt is still before its intent —
    /// here walking the destination's parents on a node that does not
    /// answer — waits for that attempt and gets its answer: it does not run
    /// a second attempt (which met the first one's intent and answered
    /// `Busy` although the rename was done).
    #[tokio::test]
    async fn a_repeat_waits_for_the_attempt_in_progress() {
        let c = setup().await;
        let (n1, n2) = (c.ns(0), c.ns(1));
        let d = attr(n1.handle(mkdir_req(EntryId::ROOT, "d")).await);
        let e = attr(n1.handle(mkdir_req(EntryId::ROOT, "e")).await);
        assert_eq!((d.owner, e.owner), (NodeId(2), NodeId(2)));
        let mv = Request::RenameTo {
            parent: EntryId::ROOT,
            name: b"e".to_vec(),
            new_parent: d.id,
            new_parent_owner: NodeId(2),
            new_name: b"e".to_vec(),
            flags: 0,
        };
        let away = c.net.0.lock().unwrap().remove(&NodeId(2)).unwrap();
        let attempt = |n: Arc<Namespace>| {
            let (env, req) = retryable(7, &mv);
            tokio::spawn(async move { n.handle_env(env, req).await })
        };
        let first = attempt(n1.clone());
        tokio::time::sleep(Duration::from_millis(50)).await;
        let repeat = attempt(n1.clone());
        tokio::time::sleep(Duration::from_millis(50)).await;
        c.net.0.lock().unwrap().insert(NodeId(2), away);
        first.await.unwrap().unwrap();
        repeat.await.unwrap().unwrap();
        assert!(n1.lookup(EntryId::ROOT, b"e").is_err());
        assert_eq!(n2.lookup(d.id, b"e").unwrap().id, e.id);
        assert!(intents(&n1).is_empty());
    }

    /// Two deliveries of one rename's destination step on the peer (the
    /// coordinator sent it again; the first still runs, waiting for the
    /// owner of the file it replaces): the second waits for the first, so
    /// the replaced file loses one link, not two. (The second used to
    /// finish first and `Forget` the replaced file's record on its owner;
    /// the first then dropped the link again.)
    #[tokio::test]
    async fn a_repeated_peer_step_waits_for_the_delivery_in_progress() {
        let c = setup().await;
        let (n1, n2) = (c.ns(0), c.ns(1));
        let d = attr(n1.handle(mkdir_req(EntryId::ROOT, "d")).await);
        let create = |name: &str| create_req(EntryId::ROOT, name);
        // d/x on node 2 names v, whose inode (two links) is on node 1.
        let v = attr(n1.handle(create("v")).await);
        let link = Request::LinkTo { id: v.id, new_parent: d.id, new_parent_owner: NodeId(2), new_name: b"x".to_vec() };
        attr(n1.handle(link).await);
        let f = attr(n1.handle(create("f")).await);
        // The step of "rename /f over d/x", as node 1 would send it.
        let step = Request::MetaPeer {
            op: PeerOp::RenameIn {
                intent: n1.next_intent(),
                src_parent: EntryId::ROOT,
                new_parent: d.id,
                new_name: b"x".to_vec(),
                flags: 0,
                id: f.id,
                kind: FileKind::File,
                owner: NodeId(1),
                inode: None,
                xattrs: Vec::new(),
            },
        };
        // Node 1 does not answer: the first delivery waits to drop v's link.
        let away = c.net.0.lock().unwrap().remove(&NodeId(1)).unwrap();
        let deliver = || {
            let (n2, step) = (n2.clone(), step.clone());
            tokio::spawn(async move { n2.handle(step).await })
        };
        let first = deliver();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let second = deliver();
        tokio::time::sleep(Duration::from_millis(70)).await;
        c.net.0.lock().unwrap().insert(NodeId(1), away);
        second.await.unwrap().unwrap();
        first.await.unwrap().unwrap();
        assert_eq!(n2.lookup_any(d.id, b"x").await.unwrap().id, f.id);
        assert_eq!(n1.getattr(v.id).unwrap().nlink, 1, "v lost exactly one link");
        assert_eq!(n1.lookup(EntryId::ROOT, b"v").unwrap().id, v.id);
    }

    /// `CrashHook::Halt`: the task that reaches the step stops there for
    /// good (its caller gets no answer) and the notify fires; the intent
    /// stays, and a restart finishes it.
    #[tokio::test]
    async fn a_halted_step_stops_its_task_and_tells() {
        let mut c = setup().await;
        let fired = Arc::new(tokio::sync::Notify::new());
        c.ns(0).set_crash_hook(CrashHook::Halt("mkdir:remote".into(), fired.clone()));
        let n1 = c.ns(0);
        let call = tokio::spawn(async move { n1.handle(mkdir_req(EntryId::ROOT, "new")).await });
        fired.notified().await;
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!call.is_finished(), "the halted call never answers");
        call.abort();
        let _ = call.await;
        assert_eq!(intents(&c.ns(0)).len(), 1);
        c.restart(0).await;
        assert!(intents(&c.ns(0)).is_empty());
        assert_eq!(c.ns(0).lookup_any(EntryId::ROOT, b"new").await.unwrap().owner, NodeId(2));
    }

    /// The `random` metadata-node chooser draws from `NamespaceOptions::seed`.
    #[tokio::test]
    async fn the_random_meta_chooser_follows_the_seed() {
        let mut owners = Vec::new();
        for _ in 0..2 {
            let c = Cluster::new(3);
            let n1 = c.ns(0);
            n1.ensure_root().await.unwrap();
            n1.handle(Request::SetMetaChooser { id: EntryId::ROOT, chooser: MetaChooser::Random }).await.unwrap();
            let mut v = Vec::new();
            for i in 0..12 {
                v.push(attr(n1.handle(mkdir_req(EntryId::ROOT, &format!("d{i}"))).await).owner);
            }
            owners.push(v);
        }
        assert_eq!(owners[0], owners[1]);
        assert!(owners[0].iter().any(|&o| o != owners[0][0]), "spread over the nodes: {:?}", owners[0]);
    }

    #[tokio::test]
    async fn renaming_a_directory_into_its_subtree_across_nodes_is_invalid() {
        let c = setup().await;
        let (n1, n2) = (c.ns(0), c.ns(1));
        let d = attr(n1.handle(mkdir_req(EntryId::ROOT, "d")).await);
        let e = attr(n2.handle(mkdir_req(d.id, "e")).await);
        let mv = Request::RenameTo {
            parent: EntryId::ROOT,
            name: b"d".to_vec(),
            new_parent: e.id,
            new_parent_owner: e.owner,
            new_name: b"x".to_vec(),
            flags: 0,
        };
        assert_eq!(n1.handle(mv).await.unwrap_err().code, ErrorCode::Invalid);
    }

    /// Every step of mkdir and of a file rename, stopped as by a crash of
    /// the node that runs it; after a restart of that node, the operation is
    /// complete and a retry of the client's operation gets its answer.
    #[tokio::test]
    async fn a_crash_at_each_step_is_recovered_after_restart() {
        for op in ["mkdir", "rename", "rmdir"] {
            for step in ["intent", "peer", "remote", "commit"] {
                let mut c = setup().await;
                let d = attr(c.ns(0).handle(mkdir_req(EntryId::ROOT, "d")).await);
                let create = create_req(EntryId::ROOT, "f");
                c.ns(0).handle(create).await.unwrap();
                // The new directory inherits a default ACL: the intent carries it.
                let dflt = hivefs_types::acl::Acl::from_mode(0o750).encode();
                let xattr = hivefs_types::acl::XATTR_DEFAULT.to_vec();
                let sx = Request::SetXattr { id: EntryId::ROOT, name: xattr.clone(), value: dflt.clone(), flags: 0 };
                c.ns(0).handle(sx).await.unwrap();
                let req = match op {
                    "mkdir" => {
                        let caller = Caller { umask: Some(0o022), ..Caller::default() };
                        Request::Mkdir { parent: EntryId::ROOT, name: b"new".to_vec(), mode: 0o777, caller }
                    }
                    "rmdir" => Request::Rmdir { parent: EntryId::ROOT, name: b"d".to_vec() },
                    _ => Request::RenameTo {
                        parent: EntryId::ROOT,
                        name: b"f".to_vec(),
                        new_parent: d.id,
                        new_parent_owner: NodeId(2),
                        new_name: b"g".to_vec(),
                        flags: 0,
                    },
                };
                let fired = Arc::new(AtomicBool::new(false));
                // The peer step runs on node 2, the others on node 1.
                let victim = if step == "peer" { 1 } else { 0 };
                c.ns(victim).set_crash_hook(CrashHook::Stop(format!("{op}:{step}"), fired.clone()));
                let n1 = c.ns(0);
                let (env, r1) = retryable(9, &req);
                let call = tokio::spawn(async move { n1.handle_env(env, r1).await });
                while !fired.load(Ordering::SeqCst) {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                if victim == 0 {
                    assert!(call.await.unwrap().is_err(), "{op}:{step}: the stopped call fails");
                    c.restart(victim).await;
                } else {
                    c.restart(victim).await;
                    call.await.unwrap().unwrap_or_else(|e| panic!("{op}:{step}: {e}"));
                }
                let (n1, n2) = (c.ns(0), c.ns(1));
                assert!(intents(&n1).is_empty(), "{op}:{step}: {:?}", intents(&n1));
                // The client's retry gets the outcome; the state is complete.
                let (env, r1) = retryable(9, &req);
                n1.handle_env(env, r1).await.unwrap_or_else(|e| panic!("{op}:{step} retry: {e}"));
                match op {
                    "mkdir" => {
                        let a = n1.lookup_any(EntryId::ROOT, b"new").await.unwrap();
                        assert_eq!((a.owner, a.mode), (NodeId(2), 0o750), "{op}:{step}");
                        assert_eq!(n2.getxattr(a.id, &xattr).unwrap(), dflt, "{op}:{step}");
                        assert_eq!(n1.getattr(EntryId::ROOT).unwrap().nlink, 4, "{op}:{step}");
                    }
                    "rmdir" => {
                        assert!(n1.lookup_any(EntryId::ROOT, b"d").await.is_err());
                        assert!(n2.getattr(d.id).is_err(), "{op}:{step}: no orphaned inode");
                        assert_eq!(n1.getattr(EntryId::ROOT).unwrap().nlink, 2, "{op}:{step}");
                    }
                    _ => {
                        assert!(n1.lookup(EntryId::ROOT, b"f").is_err(), "{op}:{step}");
                        let g = n2.lookup(d.id, b"g").unwrap();
                        assert!(n1.getattr(g.id).is_err(), "{op}:{step}: the inode is only on node 2");
                        assert_eq!(n2.counts().unwrap().0, 1);
                        assert_eq!(n1.counts().unwrap().0, 0);
                    }
                }
            }
        }
    }
}
