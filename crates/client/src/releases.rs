//! Handles released in the background: [`Client::release_later`] queues a
//! release per metadata node and one task sends them, as one `ReleaseMany`
//! per node and round, while the program goes on. A round gathers for
//! [`GATHER`] (2 ms) and releases queued while a round is on its way go
//! together in the next, so many closes share a request.
//!
//! A release only lowers the node's count of open handles (an unlinked
//! file's chunks are deleted at the last one): sent later, the chunks of a
//! file unlinked while open go later, nothing else changes. Before the
//! program exits it calls [`Client::flush_releases`]. This module must not
//! release anything itself (the program decides what is closed).
//!
//! A handle made with `CreateOpenHeld` ([`Client::create_open_held`])
//! holds its file's size: its release carries the size its writes left
//! (`ReleaseSized`, [`Client::release_held_later`]), which lands on the
//! metadata node before the handle is released. Until then
//! [`Client::owed_size`] has it, answers to this client's requests are
//! raised to it ([`Client::request_ends`]), and [`Client::wait_owed`]
//! lets a change that must come after it (a truncation, a time set, an
//! inode moved to another node) wait for it.
//!
//! A release also says which stripe positions' chunk files the client
//! changed since its previous release of the file ([`Client::note_written`],
//! noted before each write goes out): a file its metadata node made has
//! chunk files only where a release reported writes, and its removal
//! deletes only those (none when nothing was written).

use crate::overlap::Ticket;
use crate::{Client, Ent};
use hivefs_proto::{Envelope, HeldSize, Reply, Request, SizedRelease, RELEASE_MANY_MAX};
use hivefs_types::attr::{EntryAttr, FileKind};
use hivefs_types::error::ErrorCode;
use hivefs_types::ids::{EntryId, NodeId};
use hivefs_types::pattern::{Pattern, StripeSet};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;
use tracing::{debug, warn};

/// Per metadata node, handles to release.
type Batch = HashMap<NodeId, Vec<Handle>>;

/// A handle to release: the file, the stripe positions whose chunk files
/// this client changed, and what a handle that held the size reports.
struct Handle {
    id: EntryId,
    wrote: StripeSet,
    held: Option<HeldHandle>,
}

/// A handle opened with `CreateOpenHeld` ([`Client::create_open_held`]).
struct HeldHandle {
    /// The size its writes left, and the file's pattern (to read the size
    /// off the chunk files if the node cannot take the report).
    size: Option<(HeldSize, Pattern)>,
    /// This client's change of the file's size in flight until the report
    /// lands (its attributes as this client last saw them are stale).
    ticket: Option<Ticket>,
}

#[derive(Default)]
pub(crate) struct Releases {
    /// Per metadata node, handles to release (and where each wrote), and
    /// whether a round is on its way.
    queued: Mutex<(Batch, bool)>,
    /// Files whose chunk files this client changed since it last released
    /// a handle of theirs, and at which stripe positions.
    written: Mutex<HashMap<EntryId, StripeSet>>,
    wake: Notify,
    /// Rung when a round ends with nothing queued.
    drained: Notify,
    started: AtomicBool,
    /// Nodes that answered `ReleaseWritten` with `Protocol` (older): a
    /// `ReleaseMany`, and if that is refused too, one `Release` per handle.
    older: Mutex<HashMap<NodeId, Older>>,
    /// Sizes held by released handles and not yet landed, per file: the
    /// largest, and how many reports are on their way.
    owed: Mutex<HashMap<EntryId, (HeldSize, u32)>>,
    /// Nodes that refused `CreateOpenHeld` (older, or leases off there).
    pub(crate) no_holds: Mutex<HashSet<NodeId>>,
    /// Held sizes that landed while metadata requests were on their way.
    landings: Mutex<Landings>,
    /// Rung when an owed size landed.
    owed_gone: Notify,
}

/// An answer to a request sent before a held size landed may carry the
/// size from before: [`Client::owed_size`] no longer covers it then. So
/// while requests are on their way, each landing is kept with its number,
/// and their answers are raised to the sizes that landed after they left.
#[derive(Default)]
struct Landings {
    /// Landings so far.
    seq: u64,
    /// Requests on their way, by the landings before them.
    in_flight: std::collections::BTreeMap<u64, u32>,
    /// Landings after the oldest request on its way: (number, file, size).
    recent: std::collections::VecDeque<(u64, EntryId, HeldSize)>,
}

/// A metadata request on its way ([`Client::request_begins`]); it stops
/// counting when dropped (also when the request was given up).
pub(crate) struct InFlight(u64, Arc<Releases>);

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut l = self.1.landings.lock().expect("landings");
        if let Some(n) = l.in_flight.get_mut(&self.0) {
            *n -= 1;
            if *n == 0 {
                l.in_flight.remove(&self.0);
            }
        }
        // What no request on its way can need any more.
        let oldest = l.in_flight.keys().next().copied().unwrap_or(u64::MAX);
        while l.recent.front().is_some_and(|(seq, _, _)| *seq <= oldest) {
            l.recent.pop_front();
        }
    }
}

impl Client {
    /// Releases the handle of `id` (stored on `owner`) in the background.
    /// Call it inside the tokio runtime (the first call starts the task).
    pub fn release_later(self: &Arc<Self>, id: EntryId, owner: NodeId) {
        self.local.forget(id);
        self.queue_release(owner, id, None);
    }

    /// Releases a handle opened by [`Client::create_open_held`] in the
    /// background, with the size its writes left and the file's pattern
    /// (`None`: nothing written since the size was last reported). Until
    /// the node has it,
    /// [`Client::owed_size`] gives it, and this client's copies of the
    /// file's attributes are not kept.
    pub fn release_held_later(self: &Arc<Self>, e: Ent, size: Option<(HeldSize, &Pattern)>) {
        self.local.forget(e.id);
        let mut ticket = None;
        if let Some((s, _)) = size {
            let mut owed = self.releases.owed.lock().expect("owed sizes");
            let o = owed.entry(e.id).or_insert((s, 0));
            if s.size >= o.0.size {
                o.0 = s;
            }
            o.1 += 1;
            drop(owed);
            let change = Request::UpdateSize { id: e.id, size: s.size, mtime: Some(s.mtime) };
            ticket = self.leases.get().map(|session| session.begin(&change));
        }
        let held = HeldHandle { size: size.map(|(s, p)| (s, p.clone())), ticket };
        self.queue_release(e.owner, e.id, Some(held));
    }

    /// Waits until no size of `id` released here is on its way (a time
    /// set after writes must come after the size they left, which stamps
    /// the writes' time).
    pub async fn wait_owed(&self, id: EntryId) {
        loop {
            let gone = self.releases.owed_gone.notified();
            if !self.releases.owed.lock().expect("owed sizes").contains_key(&id) {
                return;
            }
            gone.await;
        }
    }

    /// Waits until the sizes owed now have landed: before a rename or link
    /// moves a file's inode to another metadata node, which takes the inode
    /// as it is then.
    pub async fn wait_owed_now(&self) {
        let ids: Vec<EntryId> = self.releases.owed.lock().expect("owed sizes").keys().copied().collect();
        for id in ids {
            self.wait_owed(id).await;
        }
    }

    /// The size a released handle of `id` holds that its metadata node has
    /// not taken yet: the largest of them.
    pub fn owed_size(&self, id: EntryId) -> Option<HeldSize> {
        self.releases.owed.lock().expect("owed sizes").get(&id).map(|o| o.0)
    }

    fn queue_release(self: &Arc<Self>, owner: NodeId, id: EntryId, held: Option<HeldHandle>) {
        let wrote = self.take_written(id);
        let r = &self.releases;
        r.queued.lock().expect("releases").0.entry(owner).or_default().push(Handle { id, wrote, held });
        if !r.started.swap(true, Ordering::AcqRel) {
            tokio::spawn(run(Arc::downgrade(self), r.clone()));
        }
        r.wake.notify_one();
    }

    /// A report of `id`'s held size `s` landed (or was given up on).
    fn owed_landed(&self, id: EntryId, s: HeldSize) {
        {
            let mut l = self.releases.landings.lock().expect("landings");
            l.seq += 1;
            if !l.in_flight.is_empty() {
                let seq = l.seq;
                l.recent.push_back((seq, id, s));
            }
        }
        let mut owed = self.releases.owed.lock().expect("owed sizes");
        if let Some(o) = owed.get_mut(&id) {
            o.1 -= 1;
            if o.1 == 0 {
                owed.remove(&id);
                self.releases.owed_gone.notify_waiters();
            }
        }
    }

    /// A metadata request leaves: see [`Client::request_ends`].
    pub(crate) fn request_begins(&self) -> InFlight {
        let mut l = self.releases.landings.lock().expect("landings");
        let seq = l.seq;
        *l.in_flight.entry(seq).or_default() += 1;
        InFlight(seq, self.releases.clone())
    }

    /// Its answer came: a file's attributes in it are raised to the held
    /// sizes of this client not landed yet and those that landed after it left.
    pub(crate) fn request_ends(&self, f: InFlight, answer: Option<&mut EntryAttr>) {
        let Some(a) = answer.filter(|a| a.kind == FileKind::File) else { return };
        let raise = |a: &mut EntryAttr, s: &HeldSize| {
            a.size = a.size.max(s.size);
            a.mtime = a.mtime.max(s.mtime);
            a.ctime = a.ctime.max(s.mtime);
        };
        // Owed ones first: a landing is counted here before its size
        // leaves `owed`.
        if let Some(s) = self.owed_size(a.id) {
            raise(a, &s);
        }
        let id = a.id;
        let l = self.releases.landings.lock().expect("landings");
        if l.seq > f.0 {
            for (_, _, s) in l.recent.iter().filter(|(seq, x, _)| *seq > f.0 && *x == id) {
                raise(a, s);
            }
        }
        drop(l);
        drop(f);
    }

    /// This client is about to change the chunk files of `id` at stripe
    /// positions `at` (a write, an allocation, a copy into it): the next
    /// release of a handle of `id` says so.
    pub fn note_written(&self, id: EntryId, at: StripeSet) {
        let mut w = self.releases.written.lock().expect("written");
        let s = w.entry(id).or_default();
        *s = s.union(at);
    }

    /// Where this client changed the chunk files of `id` since the last
    /// call (empty: nowhere); forgets it (the release that asks reports it).
    pub(crate) fn take_written(&self, id: EntryId) -> StripeSet {
        self.releases.written.lock().expect("written").remove(&id).unwrap_or_default()
    }

    /// Waits until every release queued so far was sent and answered (or failed).
    pub async fn flush_releases(&self) {
        let r = &self.releases;
        loop {
            let drained = r.drained.notified();
            {
                let q = r.queued.lock().expect("releases");
                if q.0.is_empty() && !q.1 {
                    return;
                }
            }
            drained.await;
        }
    }

    /// One round: every queued release, one request per node (more for
    /// more than [`RELEASE_MANY_MAX`]), the nodes at once.
    async fn release_round(self: &Arc<Self>, batch: Batch) {
        // Files made ahead land before their releases (see `ahead`).
        self.ahead_landed().await;
        let mut sends = tokio::task::JoinSet::new();
        for (node, mut handles) in batch {
            let c = self.clone();
            sends.spawn(async move {
                while !handles.is_empty() {
                    let rest = handles.split_off(handles.len().min(RELEASE_MANY_MAX));
                    c.release_on(node, std::mem::replace(&mut handles, rest)).await;
                }
            });
        }
        while sends.join_next().await.is_some() {}
    }

    async fn release_on(&self, node: NodeId, handles: Vec<Handle>) {
        if handles.iter().any(|h| h.held.is_some()) {
            return self.release_sized(node, handles).await;
        }
        let handles: Vec<(EntryId, StripeSet)> = handles.iter().map(|h| (h.id, h.wrote)).collect();
        let older = self.releases.older.lock().expect("releases").get(&node).copied();
        // An older request is built only after the newer one was refused.
        if older.is_none() && self.ask(node, &Request::ReleaseWritten { handles: handles.clone() }, Older::Many).await {
            return;
        }
        if older != Some(Older::Single) {
            let ids = handles.iter().map(|h| h.0).collect();
            let wrote = handles.iter().filter(|h| !h.1.is_empty()).map(|h| h.0).collect();
            if self.ask(node, &Request::ReleaseMany { ids, wrote }, Older::Single).await {
                return;
            }
        }
        for (id, wrote) in handles {
            if let Err(e) = self.release_now(id, node, !wrote.is_empty()).await {
                warn!("release of {id} on metadata node {node} failed: {e}");
            }
        }
    }

    /// Releases with held sizes (`ReleaseSized`, naming this client). A
    /// size whose release failed goes as at a close (the node may have
    /// restarted and forgotten what the handle held).
    async fn release_sized(&self, node: NodeId, handles: Vec<Handle>) {
        let req = Request::ReleaseSized {
            handles: handles
                .iter()
                .map(|h| SizedRelease {
                    id: h.id,
                    wrote: h.wrote,
                    held: h.held.is_some(),
                    size: h.held.as_ref().and_then(|x| x.size.as_ref().map(|(s, _)| *s)),
                })
                .collect(),
        };
        let env = Envelope { op: None, lease_client: Some(self.ops.client), mirror: None };
        let sent = std::time::Instant::now();
        let mut attrs = HashMap::new();
        let landed = match self.cluster.call_meta(node, &env, &req, self.mirror_retry).await {
            Ok(Reply::Landed { attrs: a }) => {
                attrs = a.into_iter().map(|(a, ms)| (a.id, (a, ms))).collect();
                true
            }
            Ok(r) => {
                warn!("metadata node {node}: odd answer to ReleaseSized: {}", crate::unexpected(r));
                false
            }
            Err(e) => {
                warn!("ReleaseSized of {} handles on metadata node {node} failed: {e}", handles.len());
                false
            }
        };
        for h in handles {
            let Some(held) = h.held else { continue };
            if let Some((s, pattern)) = held.size {
                if !landed {
                    let e = Ent { id: h.id, owner: node };
                    if let Err(err) = self.report_size(e, &pattern, s.size, s.seen, s.mtime).await {
                        warn!("size {} of file {} (metadata node {node}) not reported: {err}", s.size, h.id);
                    }
                }
                self.owed_landed(h.id, s);
            }
            if let (Some(t), Some(session)) = (held.ticket, self.leases.get()) {
                // The file's attributes after the size landed are this
                // client's to keep while the lease granted with them lasts,
                // as after a size reported at a close.
                let landed = attrs.get(&h.id).map(|(a, ms)| (a, *ms));
                if let Some((_, ms)) = landed {
                    session.granted(h.id, None, sent, ms, 0);
                }
                session.end(t, landed, sent);
            }
        }
    }

    /// Sends a batch release; false when the node refused it as unknown
    /// (`Protocol`: it is older), which it is then not asked again
    /// (`refused`: what it takes instead).
    async fn ask(&self, node: NodeId, req: &Request, refused: Older) -> bool {
        match self.cluster.meta_rpc(node, req).await {
            Ok(Reply::Ok) => {}
            Err(e) if e.code == ErrorCode::Protocol => {
                debug!("metadata node {node} takes no {} ({e})", req.name());
                self.releases.older.lock().expect("releases").insert(node, refused);
                return false;
            }
            Ok(r) => warn!("metadata node {node}: odd answer to {}: {}", req.name(), crate::unexpected(r)),
            Err(e) => warn!("{} on metadata node {node} failed: {e}", req.name()),
        }
        true
    }
}

/// What an older metadata node takes instead of `ReleaseWritten`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Older {
    /// `ReleaseMany` (which says only whether each handle wrote).
    Many,
    /// One `Release` per handle.
    Single,
}

/// How long the first release of a round waits for others to join it,
/// unless [`GATHER_MAX`] are queued sooner: closes one at a time (creates
/// in one directory, which the kernel serializes) then share a request.
pub const GATHER: std::time::Duration = std::time::Duration::from_millis(2);
const GATHER_MAX: usize = 256;

/// The sending task; it ends at its first wake after the client is gone.
async fn run(client: std::sync::Weak<Client>, r: Arc<Releases>) {
    loop {
        let wake = r.wake.notified();
        let queued = r.queued.lock().expect("releases").0.values().map(Vec::len).sum::<usize>();
        if queued > 0 && queued < GATHER_MAX {
            tokio::time::sleep(GATHER).await;
        }
        let batch = {
            let mut q = r.queued.lock().expect("releases");
            q.1 = !q.0.is_empty();
            std::mem::take(&mut q.0)
        };
        if batch.is_empty() {
            r.drained.notify_waiters();
            wake.await;
            continue;
        }
        let Some(c) = client.upgrade() else { return };
        c.release_round(batch).await;
        drop(c);
        r.queued.lock().expect("releases").1 = false;
    }
}
