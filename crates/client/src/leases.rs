//! The client's side of attribute leases (see the meta crate's `leases`).
//!
//! Off unless the embedding program turns them on ([`Client::enable_leases`];
//! the mount does, because the kernel caches attributes and names for it).
//! Then every metadata request names this client's lease session in its
//! envelope; an answer that grants
//! a lease on the entry's attributes or on the name it was looked up by is
//! remembered with its end, counted from when the request was sent (so this
//! side's copy never outlives the node's record). One task per metadata node
//! polls it (`LeaseWait`) for revocations, hands each to the program's
//! callback ([`Revocation`]; a revoked name drops every name lease) and
//! acknowledges with its next poll.
//!
//! Directories' names: the client polls with `LeaseWaitDirs`, so the node
//! leases it the set of names of a directory it made (empty) and renews the
//! lease with each of its changes there (`Reply::DirNames`). While such a
//! lease lasts the client knows every name that may exist there (its own
//! creations added, anyone else's revoked first), and
//! [`Client::known_absent`] answers a lookup of any other name without a
//! request: a create through the mount then needs no negative lookup.
//!
//! The callback and [`Client::with_lease`] run under the same lock, so a
//! program that answers its kernel inside `with_lease` never sends a copy
//! after the revocation of that copy was handled: either the kernel gets
//! the copy first and the callback drops it, or the callback runs first and
//! `with_lease` finds no lease. A grant for a request sent before a
//! revocation of the same entry arrived is not remembered.
//!
//! Files' attributes after this client's own changes: the node does not
//! revoke the requester's lease, so the attributes answering a change of
//! one file (a size report on close, a `SetAttr`) stay true while the lease
//! lasts, except for this client's own later changes. They are kept here
//! ([`Client::leased_attr`]) when no other change of this client to the
//! same file (or to files not known, as an unlink by name) overlapped the
//! request, until the lease held then ends (a later grant does not extend
//! them), and dropped when such a change starts or the lease is revoked:
//! the mount answers the kernel's next `getattr` with them instead of
//! asking the node (the kernel drops a file's attributes after its writes).

use crate::overlap::{Changes, Ticket, Touches};
use crate::{unexpected, Client};
use hivefs_cluster::Cluster;
use hivefs_proto::{Reply, Request, RENAME_NOREPLACE};
use hivefs_types::attr::{EntryAttr, FileKind};
use hivefs_types::error::{ErrorCode, FsResult};
use hivefs_types::ids::{EntryId, NodeId};
use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tracing::{debug, warn};

/// What a metadata node revoked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Revocation {
    /// The attributes of this entry.
    Attrs(EntryId),
    /// A name this client leased: every cached name must go.
    Names,
}

/// Called with every revocation.
pub type OnRevoke = Box<dyn Fn(Revocation) + Send + Sync>;

#[derive(Default)]
struct Held {
    /// Entries with a lease on their attributes, and when it ends.
    ends: HashMap<EntryId, Instant>,
    /// Leased names per directory, and when each lease ends.
    names: HashMap<EntryId, HashMap<Vec<u8>, Instant>>,
    name_count: usize,
    /// Recently revoked entries, and when: grants of requests sent before
    /// that are stale.
    revoked: HashMap<EntryId, Instant>,
    /// The last revocation of names: name grants sent before it are stale.
    names_revoked: Option<Instant>,
    longest: Duration,
    swept_ends: usize,
    swept_names: usize,
    swept_revoked: usize,
    /// Directories whose set of names is leased: every name that may exist
    /// there (at most [`DIR_NAMES_MAX`] over all of them).
    dirs: HashMap<EntryId, DirSet>,
    dir_names: usize,
    swept_dirs: usize,
    /// Files' attributes as answers to this client's changes carried them
    /// (see the module doc), and until when: the end of the lease held when
    /// they came. A later grant does not make them last longer: the lease
    /// may have lapsed in between, and a change then was told to nobody.
    attrs: HashMap<EntryId, (EntryAttr, Instant)>,
    /// This client's changes of files in flight.
    changing: Changes,
}

/// Which files' attributes a request of this client may change: none for
/// reads, opens and releases, and creations of new names (an existing file
/// found by a create is only opened); any for an unlink or a rename by
/// name, and for request kinds added later.
fn file_touch(req: &Request) -> Touches {
    match req {
        Request::SetAttr { id, .. }
        | Request::SetXattr { id, .. }
        | Request::RemoveXattr { id, .. }
        | Request::UpdateSize { id, .. }
        | Request::UpdateSizeIf { id, .. }
        | Request::TouchAtime { id, .. }
        | Request::Link { id, .. } => Touches::One(*id),
        Request::Create { .. }
        | Request::CreateOpen { .. }
        | Request::CreateOpenHeld { .. }
        | Request::Mkdir { .. }
        | Request::Symlink { .. }
        | Request::Open { .. }
        | Request::Release { .. }
        | Request::ReleaseMany { .. } => Touches::Nothing,
        r if r.is_idempotent() => Touches::Nothing,
        _ => Touches::Any,
    }
}

struct DirSet {
    end: Instant,
    names: HashSet<Box<[u8]>>,
}

/// Most names the leased directories hold together (about 64 bytes each):
/// a directory that would go beyond is dropped (its lookups ask the node).
pub const DIR_NAMES_MAX: usize = 262_144;

impl Held {
    fn drop_dir(&mut self, dir: EntryId) {
        if let Some(d) = self.dirs.remove(&dir) {
            self.dir_names -= d.names.len();
        }
    }

    /// `name` may exist in `dir` from now on.
    fn add_name(&mut self, dir: EntryId, name: &[u8]) {
        if !self.dirs.contains_key(&dir) {
            return;
        }
        if self.dir_names >= DIR_NAMES_MAX {
            return self.drop_dir(dir);
        }
        let added = self.dirs.get_mut(&dir).is_some_and(|d| d.names.insert(name.into()));
        self.dir_names += usize::from(added);
    }

    fn remove_name(&mut self, dir: EntryId, name: &[u8]) {
        if self.dirs.get_mut(&dir).is_some_and(|d| d.names.remove(name)) {
            self.dir_names -= 1;
        }
    }
}

pub(crate) struct LeaseSession {
    on_revoke: OnRevoke,
    held: Mutex<Held>,
    /// Metadata nodes polled.
    nodes: Mutex<BTreeSet<NodeId>>,
}

impl LeaseSession {
    pub(crate) fn new(on_revoke: OnRevoke) -> LeaseSession {
        LeaseSession { on_revoke, held: Mutex::default(), nodes: Mutex::default() }
    }

    /// A node granted a request sent at `sent` a lease on `id`'s
    /// attributes for `ms` and on `name` for `name_ms` (0: none).
    pub(crate) fn granted(&self, id: EntryId, name: Option<(EntryId, &[u8])>, sent: Instant, ms: u32, name_ms: u32) {
        let mut h = self.held.lock().expect("leases");
        let now = Instant::now();
        if ms > 0 && h.revoked.get(&id).is_none_or(|&at| at < sent) {
            let d = Duration::from_millis(ms.into());
            h.longest = h.longest.max(d);
            let end = sent + d;
            let e = h.ends.entry(id).or_insert(end);
            *e = (*e).max(end);
            if h.ends.len() > 2 * h.swept_ends + 1024 {
                h.ends.retain(|_, end| *end > now);
                h.swept_ends = h.ends.len();
            }
        }
        if let (Some((parent, name)), true) = (name, name_ms > 0) {
            if h.names_revoked.is_some_and(|at| at >= sent) {
                return;
            }
            let d = Duration::from_millis(name_ms.into());
            h.longest = h.longest.max(d);
            let end = sent + d;
            let dir = h.names.entry(parent).or_default();
            let e = dir.entry(name.to_vec()).or_insert(end);
            *e = (*e).max(end);
            h.name_count += 1;
            if h.name_count > 2 * h.swept_names + 1024 {
                h.names.retain(|_, dir| {
                    dir.retain(|_, end| *end > now);
                    !dir.is_empty()
                });
                h.name_count = h.names.values().map(HashMap::len).sum();
                h.swept_names = h.name_count;
            }
        }
    }

    /// Leases on directories' names (`Reply::DirNames`) for a request sent
    /// at `sent`; `made`: the directory the request made (granted empty).
    pub(crate) fn granted_dirs(&self, grants: &[(EntryId, u32)], made: Option<EntryId>, sent: Instant) {
        let mut h = self.held.lock().expect("leases");
        for &(dir, ms) in grants {
            if ms == 0 || h.revoked.get(&dir).is_some_and(|&at| at >= sent) {
                continue;
            }
            let d = Duration::from_millis(ms.into());
            h.longest = h.longest.max(d);
            let end = sent + d;
            if made == Some(dir) {
                h.drop_dir(dir);
                h.dirs.insert(dir, DirSet { end, names: HashSet::new() });
            } else if let Some(set) = h.dirs.get_mut(&dir) {
                set.end = set.end.max(end);
            }
        }
        if h.dirs.len() > 2 * h.swept_dirs + 64 {
            let now = Instant::now();
            h.dirs.retain(|_, d| d.end > now);
            h.dir_names = h.dirs.values().map(|d| d.names.len()).sum();
            h.swept_dirs = h.dirs.len();
        }
    }

    /// Runs `f` with the time left on this client's lease on `dir`'s names
    /// while it lasts at least `margin` more and `name` is not among them;
    /// when `f` makes the name (returns `Some`), it is among them after.
    /// Under the lock revocations take: a revocation handled after this
    /// sees what `f` did.
    pub(crate) fn with_dir_absent<R>(
        &self,
        dir: EntryId,
        name: &[u8],
        margin: Duration,
        f: impl FnOnce(Duration) -> Option<R>,
    ) -> Option<R> {
        if name.len() > hivefs_types::NAME_MAX {
            return None;
        }
        let mut h = self.held.lock().expect("leases");
        let left = h.dirs.get(&dir).map(|d| d.end.saturating_duration_since(Instant::now()))?;
        if left < margin || h.dirs.get(&dir).is_some_and(|d| d.names.contains(name)) {
            return None;
        }
        let r = f(left)?;
        h.add_name(dir, name);
        Some(r)
    }

    /// File `a`, made ahead by this client, is known to nobody else until
    /// `until` (the lease on its directory's names then): its attributes
    /// answer this client's asks meanwhile, as after its own change.
    pub(crate) fn made_ahead(&self, a: &EntryAttr, until: Instant) {
        let mut h = self.held.lock().expect("leases");
        let e = h.ends.entry(a.id).or_insert(until);
        *e = (*e).max(until);
        h.attrs.insert(a.id, (a.clone(), until));
    }

    /// Drops what the kernel may cache of file `id` (and, with `names`,
    /// every cached name) as a revocation would, without one.
    pub(crate) fn drop_copies(&self, id: EntryId, names: bool) {
        self.revoke(&[id], names);
    }

    /// Keeps the leased directories' names true after this client's request
    /// `req`: a name it may have made may exist, whatever the outcome (a
    /// name too many only costs a lookup); a name it removed does not.
    fn note_names(&self, req: &Request, ok: bool) {
        // Locked only for requests that change names, and while some directory is leased.
        let held = || Some(self.held.lock().expect("leases")).filter(|h| !h.dirs.is_empty());
        match req {
            Request::Create { parent, name, .. }
            | Request::CreateOpen { parent, name, .. }
            | Request::CreateOpenHeld { parent, name, .. }
            | Request::Mkdir { parent, name, .. }
            | Request::Symlink { parent, name, .. }
            | Request::Link { new_parent: parent, new_name: name, .. }
            | Request::LinkTo { new_parent: parent, new_name: name, .. } => {
                if let Some(mut h) = held() {
                    h.add_name(*parent, name);
                }
            }
            Request::Rename { parent, name, new_parent, new_name, flags }
            | Request::RenameTo { parent, name, new_parent, new_name, flags, .. } => {
                if let Some(mut h) = held() {
                    h.add_name(*new_parent, new_name);
                    // After an exchange (or a whiteout) the old name still exists.
                    let moved = *flags & !RENAME_NOREPLACE == 0;
                    if ok && moved && (parent, name) != (new_parent, new_name) {
                        h.remove_name(*parent, name);
                    }
                }
            }
            Request::Unlink { parent, name } | Request::Rmdir { parent, name } if ok => {
                if let Some(mut h) = held() {
                    h.remove_name(*parent, name);
                }
            }
            _ => {}
        }
    }

    /// A request is about to be sent: the files' attributes it may change
    /// are no longer known.
    pub(crate) fn begin(&self, req: &Request) -> Ticket {
        let touches = file_touch(req);
        if touches == Touches::Nothing {
            return Ticket::read();
        }
        let mut h = self.held.lock().expect("leases");
        let h = &mut *h;
        h.changing.begin_dropping(touches, &mut h.attrs)
    }

    /// The request of `t`, sent at `sent`, was answered (`attr`: the
    /// attributes it carried, and the lease granted with them in ms): they
    /// are kept if it changed that file alone and the lease was granted.
    pub(crate) fn end(&self, t: Ticket, attr: Option<(&EntryAttr, u32)>, sent: Instant) {
        if t.touches == Touches::Nothing {
            return;
        }
        let mut h = self.held.lock().expect("leases");
        let alone = h.changing.end(&t);
        let Touches::One(id) = t.touches else { return };
        let now = Instant::now();
        let keep = attr.filter(|(a, ms)| {
            a.id == id && a.kind != FileKind::Dir && alone && *ms > 0 && h.revoked.get(&id).is_none_or(|&at| at < sent)
        });
        let until = h.ends.get(&id).copied().filter(|end| *end > now);
        if let (Some((a, _)), Some(until)) = (keep, until) {
            if h.attrs.len() > 2 * h.swept_ends + 1024 {
                h.attrs.retain(|_, (_, until)| *until > now);
            }
            h.attrs.insert(id, (a.clone(), until));
        }
    }

    fn revoke(&self, ids: &[EntryId], names: bool) {
        let mut h = self.held.lock().expect("leases");
        let now = Instant::now();
        for &id in ids {
            h.drop_dir(id);
            h.ends.remove(&id);
            h.attrs.remove(&id);
            h.revoked.insert(id, now);
            (self.on_revoke)(Revocation::Attrs(id));
        }
        if names {
            h.names.clear();
            h.name_count = 0;
            h.names_revoked = Some(now);
            (self.on_revoke)(Revocation::Names);
        }
        if h.revoked.len() > 2 * h.swept_revoked + 1024 {
            // A request older than the longest lease gets no usable grant anyway.
            let keep = h.longest + Duration::from_secs(1);
            h.revoked.retain(|_, at| now.saturating_duration_since(*at) < keep);
            h.swept_revoked = h.revoked.len();
        }
    }

    fn left(h: &Held, id: EntryId) -> Duration {
        h.ends.get(&id).map_or(Duration::ZERO, |end| end.saturating_duration_since(Instant::now()))
    }

    fn name_left(h: &Held, parent: EntryId, name: &[u8]) -> Duration {
        h.names
            .get(&parent)
            .and_then(|d| d.get(name))
            .map_or(Duration::ZERO, |end| end.saturating_duration_since(Instant::now()))
    }
}

impl Client {
    /// Takes attribute leases from now on: `on_revoke` is called (never
    /// concurrently with [`Client::with_lease`]) for each entry whose lease
    /// a metadata node revokes. Returns false if leases were on already.
    /// Call it inside the tokio runtime (it starts a poll task).
    pub fn enable_leases(&self, on_revoke: OnRevoke) -> bool {
        let session = Arc::new(LeaseSession::new(on_revoke));
        if self.leases.set(session.clone()).is_err() {
            return false;
        }
        // Every metadata node known now at once (a grant goes only to a
        // client already polling); others on first use.
        self.poll_leases(&session, self.root.owner);
        let view = self.cluster.view();
        for &(t, node) in view.nodes.keys() {
            if t == hivefs_types::ids::NodeType::Meta {
                self.poll_leases(&session, node);
            }
        }
        true
    }

    /// Runs `f` with how much longer this client's lease on `id`'s
    /// attributes lasts (zero without one), excluding revocations while `f`
    /// runs.
    pub fn with_lease<R>(&self, id: EntryId, f: impl FnOnce(Duration) -> R) -> R {
        self.with_leases(id, None, |attrs, _| f(attrs))
    }

    /// Like [`Client::with_lease`], also with the lease left on `name`
    /// (directory, name).
    pub fn with_leases<R>(
        &self,
        id: EntryId,
        name: Option<(EntryId, &[u8])>,
        f: impl FnOnce(Duration, Duration) -> R,
    ) -> R {
        match self.leases.get() {
            Some(s) => {
                let h = s.held.lock().expect("leases");
                let name_left = name.map_or(Duration::ZERO, |(p, n)| LeaseSession::name_left(&h, p, n));
                f(LeaseSession::left(&h, id), name_left)
            }
            None => f(Duration::ZERO, Duration::ZERO),
        }
    }

    /// `id`'s attributes as this client's last change of the file left them,
    /// while the lease on them lasts (see the module doc); `None` when not
    /// known (ask the node).
    pub fn leased_attr(&self, id: EntryId) -> Option<EntryAttr> {
        let s = self.leases.get()?;
        let h = s.held.lock().expect("leases");
        h.attrs.get(&id).filter(|(_, until)| *until > Instant::now()).map(|(a, _)| a.clone())
    }

    /// Whether `name` is known not to exist in `dir`: this client holds a
    /// lease on the directory's names and has no such name in it.
    pub fn known_absent(&self, dir: EntryId, name: &[u8]) -> bool {
        // A name no directory can hold gets the node's own error (ENAMETOOLONG).
        if name.len() > hivefs_types::NAME_MAX {
            return false;
        }
        let Some(s) = self.leases.get() else { return false };
        let h = s.held.lock().expect("leases");
        h.dirs.get(&dir).is_some_and(|d| d.end > Instant::now() && !d.names.contains(name))
    }

    /// After a metadata request of this client with leases on: takes the
    /// leases on directories' names its answer grants and keeps the leased
    /// directories' names true. Returns the answer inside.
    pub(crate) fn dir_names_answer(&self, req: &Request, sent: Instant, r: FsResult<Reply>) -> FsResult<Reply> {
        let Some(s) = self.leases.get() else { return r };
        let r = match r {
            Ok(Reply::DirNames { grants, reply }) => {
                let made = match (req, reply.as_ref()) {
                    (Request::LeaseDirNames { dir }, Reply::Entry(a)) if a.id == *dir => Some(a.id),
                    (Request::Mkdir { .. }, Reply::WithParent { reply, .. }) => match reply.as_ref() {
                        Reply::Entry(a) | Reply::Leased { attr: a, .. } => Some(a.id),
                        _ => None,
                    },
                    (Request::Mkdir { .. }, Reply::Entry(a) | Reply::Leased { attr: a, .. }) => Some(a.id),
                    _ => None,
                };
                s.granted_dirs(&grants, made, sent);
                Ok(*reply)
            }
            r => r,
        };
        s.note_names(req, r.is_ok());
        r
    }

    /// Starts polling `node` for revocations (once per node).
    pub(crate) fn poll_leases(&self, session: &Arc<LeaseSession>, node: NodeId) {
        if !session.nodes.lock().expect("lease nodes").insert(node) {
            return;
        }
        let (session, cluster, client, wait) =
            (session.clone(), self.cluster.clone(), self.ops.client, self.wait_slice());
        let (locks, ahead) = (self.locks.clone(), self.ahead.clone());
        tokio::spawn(poll(session, locks, ahead, cluster, client, node, wait));
    }
}

async fn poll(
    session: Arc<LeaseSession>,
    locks: Arc<crate::locks::LockSession>,
    ahead: Arc<crate::ahead::Ahead>,
    cluster: Arc<Cluster>,
    client: u64,
    node: NodeId,
    wait: Duration,
) {
    let mut acked = 0;
    let mut backoff = Duration::from_millis(50);
    // Until the node turns out not to know `LeaseWaitDirs`.
    let mut dirs = true;
    loop {
        let wait_ms = wait.as_millis() as u32;
        let req = if dirs {
            Request::LeaseWaitDirs { client, acked, wait_ms }
        } else {
            Request::LeaseWait { client, acked, wait_ms }
        };
        let r = cluster.meta_rpc(node, &req).await;
        match r {
            Ok(Reply::Revoked { ids, names, upto }) => {
                if !ids.is_empty() || names {
                    debug!(
                        "metadata node {node} revoked {} attribute leases{}",
                        ids.len(),
                        if names { " and names" } else { "" }
                    );
                }
                session.revoke(&ids, names);
                locks.revoked(&ids);
                if !ids.is_empty() {
                    // A recalled directory's files made ahead land before the acknowledgement.
                    ahead.landed().await;
                }
                acked = upto;
                backoff = Duration::from_millis(50);
                continue;
            }
            Ok(r) => warn!("metadata node {node}: odd answer to a lease poll: {}", unexpected(r)),
            Err(e) if dirs && e.code == ErrorCode::Protocol => {
                debug!("metadata node {node} leases no directories' names ({e})");
                dirs = false;
                continue;
            }
            // The node is away: it grants nothing to this client until the
            // next poll arrives, and its changes wait for the leases to end.
            Err(e) => debug!("lease poll of metadata node {node} failed: {e}"),
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eid(n: u64) -> EntryId {
        EntryId { node: 1, epoch: 1, counter: n }
    }

    fn absent(s: &LeaseSession, dir: EntryId, name: &[u8]) -> bool {
        let h = s.held.lock().unwrap();
        h.dirs.get(&dir).is_some_and(|d| d.end > Instant::now() && !d.names.contains(name))
    }

    fn create(parent: EntryId, name: &[u8]) -> Request {
        Request::Symlink { parent, name: name.to_vec(), target: b"t".to_vec(), caller: Default::default() }
    }

    fn file(n: u64, size: u64) -> EntryAttr {
        EntryAttr {
            id: eid(n),
            kind: FileKind::File,
            mode: 0o644,
            uid: 0,
            gid: 0,
            size,
            nlink: 1,
            atime: Default::default(),
            mtime: Default::default(),
            ctime: Default::default(),
            rdev: 0,
            owner: NodeId(1),
            pattern: None,
            dir_pattern: None,
        }
    }

    fn report(a: &EntryAttr) -> Request {
        Request::UpdateSize { id: a.id, size: a.size, mtime: None }
    }

    fn kept(s: &LeaseSession, id: EntryId) -> Option<EntryAttr> {
        let h = s.held.lock().unwrap();
        h.attrs.get(&id).filter(|(_, until)| *until > Instant::now()).map(|(a, _)| a.clone())
    }

    /// The answer to a change of one file, as the grant of its lease came.
    fn answer(s: &LeaseSession, t: Ticket, a: &EntryAttr, sent: Instant, ms: u32) {
        s.granted(a.id, None, sent, ms, 0);
        s.end(t, Some((a, ms)), sent);
    }

    #[test]
    fn a_files_attributes_after_its_own_lone_change_last_as_the_lease() {
        let s = LeaseSession::new(Box::new(|_| {}));
        let a = file(1, 4096);
        let sent = Instant::now();
        let t = s.begin(&report(&a));
        answer(&s, t, &a, sent, 5000);
        assert_eq!(kept(&s, a.id), Some(a.clone()));
        // Reads, opens and creations of new names change nothing kept.
        for r in [Request::GetAttr { id: a.id }, Request::Open { id: a.id, write: true }, create(eid(9), b"n")] {
            s.end(s.begin(&r), None, Instant::now());
        }
        assert_eq!(kept(&s, a.id), Some(a.clone()));
        // Another client's change: revoked, gone.
        s.revoke(&[a.id], false);
        assert_eq!(kept(&s, a.id), None);
        // An answer without a lease is not kept.
        let t = s.begin(&report(&a));
        answer(&s, t, &file(1, 1), Instant::now(), 0);
        assert_eq!(kept(&s, eid(1)), None);
        // Nor one whose request was sent before a revocation arrived.
        let b = file(2, 10);
        let (sent, t) = (Instant::now(), s.begin(&report(&b)));
        s.revoke(&[b.id], false);
        answer(&s, t, &b, sent, 5000);
        assert_eq!(kept(&s, b.id), None);
        // Kept attributes end with the lease they came with, whatever is
        // granted after it lapsed (a change then was told to nobody).
        let c = file(3, 30);
        let t = s.begin(&report(&c));
        answer(&s, t, &c, Instant::now(), 30);
        assert_eq!(kept(&s, c.id), Some(c.clone()));
        std::thread::sleep(Duration::from_millis(40));
        s.granted(c.id, None, Instant::now(), 5000, 0);
        assert_eq!(kept(&s, c.id), None);
    }

    #[test]
    fn overlapping_changes_of_this_client_keep_nothing() {
        let s = LeaseSession::new(Box::new(|_| {}));
        let (a, b) = (file(1, 100), file(2, 200));
        // Two changes of one file: either answer may predate the other's commit.
        let (t1, t2) = (s.begin(&report(&a)), s.begin(&report(&a)));
        answer(&s, t2, &a, Instant::now(), 5000);
        answer(&s, t1, &a, Instant::now(), 5000);
        assert_eq!(kept(&s, a.id), None);
        // A change of another file does not matter.
        let (t1, t2) = (s.begin(&report(&a)), s.begin(&report(&b)));
        answer(&s, t1, &a, Instant::now(), 5000);
        answer(&s, t2, &b, Instant::now(), 5000);
        assert_eq!((kept(&s, a.id), kept(&s, b.id)), (Some(a.clone()), Some(b.clone())));
        // A change of a file this client changed before drops what was kept of it.
        let t = s.begin(&Request::SetXattr { id: a.id, name: b"user.x".to_vec(), value: Vec::new(), flags: 0 });
        assert_eq!(kept(&s, a.id), None);
        s.end(t, None, Instant::now());
        // An unlink by name may change any file: everything goes, and a
        // change answered while it ran is not kept.
        let u = s.begin(&Request::Unlink { parent: eid(9), name: b"f".to_vec() });
        assert_eq!(kept(&s, b.id), None);
        let t = s.begin(&report(&a));
        answer(&s, t, &a, Instant::now(), 5000);
        s.end(u, None, Instant::now());
        assert_eq!(kept(&s, a.id), None);
        // A change that began while the unlink ran, answered after it ended, neither.
        let u = s.begin(&Request::Unlink { parent: eid(9), name: b"f".to_vec() });
        let t = s.begin(&report(&a));
        s.end(u, None, Instant::now());
        answer(&s, t, &a, Instant::now(), 5000);
        assert_eq!(kept(&s, a.id), None);
    }

    #[test]
    fn a_made_directory_knows_its_names_until_revoked() {
        let s = LeaseSession::new(Box::new(|_| {}));
        let (d, sent) = (eid(1), Instant::now());
        // A renewal of a directory not held, and a zero grant: nothing.
        s.granted_dirs(&[(d, 5000)], None, sent);
        s.granted_dirs(&[(eid(2), 0)], Some(eid(2)), sent);
        assert!(!absent(&s, d, b"x") && !absent(&s, eid(2), b"x"));
        s.granted_dirs(&[(d, 5000)], Some(d), sent);
        assert!(absent(&s, d, b"x"), "a new directory is empty");
        // Own names (also failed attempts) may exist; removed ones do not.
        s.note_names(&create(d, b"x"), true);
        s.note_names(&create(d, b"y"), false);
        assert!(!absent(&s, d, b"x") && !absent(&s, d, b"y") && absent(&s, d, b"z"));
        s.note_names(&Request::Unlink { parent: d, name: b"x".to_vec() }, true);
        s.note_names(&Request::Unlink { parent: d, name: b"y".to_vec() }, false);
        assert!(absent(&s, d, b"x") && !absent(&s, d, b"y"));
        let rename =
            Request::Rename { parent: d, name: b"y".to_vec(), new_parent: d, new_name: b"w".to_vec(), flags: 0 };
        s.note_names(&rename, true);
        assert!(absent(&s, d, b"y") && !absent(&s, d, b"w"));
        // An exchange leaves both names.
        let exchange =
            Request::Rename { parent: d, name: b"w".to_vec(), new_parent: d, new_name: b"v".to_vec(), flags: 2 };
        s.note_names(&exchange, true);
        assert!(!absent(&s, d, b"w") && !absent(&s, d, b"v"));
        // Revoked: nothing is known; a grant sent before the revocation is stale.
        s.revoke(&[d], false);
        assert!(!absent(&s, d, b"z"));
        s.granted_dirs(&[(d, 5000)], Some(d), sent);
        assert!(!absent(&s, d, b"z"), "a grant older than the revocation");
        assert_eq!(s.held.lock().unwrap().dir_names, 0);
    }

    #[test]
    fn the_names_held_are_bounded() {
        let s = LeaseSession::new(Box::new(|_| {}));
        let d = eid(1);
        s.granted_dirs(&[(d, 60_000)], Some(d), Instant::now());
        for i in 0..DIR_NAMES_MAX {
            s.held.lock().unwrap().add_name(d, format!("{i}").as_bytes());
        }
        assert!(absent(&s, d, b"x"));
        s.note_names(&create(d, b"one more"), true);
        assert!(!absent(&s, d, b"x"), "a directory beyond the bound is dropped");
        assert_eq!(s.held.lock().unwrap().dir_names, 0);
    }
}
