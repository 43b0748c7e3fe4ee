//! Files made ahead (write-back creates): while this client holds the lease
//! on a directory's names (see `leases`), it knows that a name absent there
//! is absent everywhere, so it can make a regular file there without a round
//! trip. The metadata node hands it entry ids with stripe patterns ahead
//! (`ReserveCreates`, refilled in the background); [`Client::create_ahead`]
//! takes one, answers at once, and a task per node sends the new files in
//! batches (`CreateMany`): one request carries every file made while the
//! previous batch was on its way.
//!
//! Order and visibility:
//! - every other metadata request of this client waits until the files
//!   made before it have landed ([`Client::ahead_landed`]), so nothing this
//!   client does can overtake a file it made;
//! - another client's request that reads or changes the directory's names
//!   recalls the lease first; the lease poll acknowledges that only after
//!   the files made so far have landed, so others never see the directory
//!   without them.
//!
//! Durability: a file made ahead is on its metadata node within one batch
//! (about a round trip). Its close waits for that
//! ([`Client::ahead_file_landed`]), and so does `fsync` of the file or of
//! its directory: a close that returned means the file is there, and a file
//! the node refuses when its batch lands (a full metadata target, say) gets
//! the refusal from its close. Meanwhile the program goes on with other
//! creates, and they share the batches. A client killed before a batch left
//! loses those files, none of which was closed yet.
//!
//! This module must not decide when making ahead is allowed beyond the
//! lease it checks (the program opts in: [`Client::enable_ahead`]).

use crate::{unexpected, Client, Ent};
use hivefs_proto::{Caller, NewFile, Reply, Request, CREATE_MANY_MAX};
use hivefs_types::attr::{EntryAttr, FileKind, Timespec};
use hivefs_types::error::{ErrorCode, FsError, FsResult};
use hivefs_types::ids::{EntryId, NodeId};
use hivefs_types::pattern::Pattern;
use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
use tokio::sync::Notify;
use tracing::{debug, error, warn};

/// Ids asked for at a time, and the count left that asks for more.
const RESERVE: u32 = 128;
const LOW: usize = 32;
/// A directory whose node gave no ids is not asked again for this long.
const REASK_AFTER: Duration = Duration::from_secs(1);
/// Files are made ahead only while the lease on the names has this much left.
const MARGIN: Duration = Duration::from_millis(1000);
/// Directories with ids in hand at most (beyond, the hand is emptied).
const DIRS_MAX: usize = 256;
/// About the most bytes of files in one `CreateMany`.
const BATCH_BYTES_MAX: usize = 256 << 10;
/// How long a batch is sent again while its node is unreachable.
const RESEND_FOR: Duration = Duration::from_secs(120);

#[derive(Default)]
pub(crate) struct Ahead {
    on: AtomicBool,
    /// Reserved ids with their patterns per directory, and whether a
    /// reservation is on its way.
    slots: Mutex<HashMap<EntryId, (Slots, bool)>>,
    /// Bumped when reserved patterns may have gone stale: a reservation
    /// that left before is dropped.
    generation: AtomicU64,
    /// Per metadata node: files not sent yet, and whether its task runs.
    queue: Mutex<HashMap<NodeId, (Vec<Pending>, bool)>>,
    /// Sequence numbers of files made and not landed (or given up).
    open: Mutex<(u64, BTreeSet<u64>)>,
    /// Files not landed or given up (fast check of [`Client::ahead_landed`]).
    pending: AtomicU64,
    /// Those files by id, with their sequence numbers.
    files: Mutex<HashMap<EntryId, u64>>,
    landed: Notify,
    /// Files the node refused, until their next fsync or close.
    failed: Mutex<HashMap<EntryId, FsError>>,
    /// Entries of `failed` (a close looks without the lock while none).
    failures: AtomicU64,
    /// Nodes that make no files ahead (refused the reservation for good).
    refused: Mutex<HashSet<NodeId>>,
}

/// Reserved ids of a directory, with the patterns of their files.
type Slots = VecDeque<(EntryId, Pattern)>;

struct Pending {
    seq: u64,
    parent: EntryId,
    file: NewFile,
}

impl Ahead {
    /// `req` may change how new files of a directory are made (its stripe
    /// settings, default ACL, mode): the ids and patterns held for it go.
    pub(crate) fn before(&self, req: &Request) {
        let dir = match req {
            Request::SetDirPattern { id, .. }
            | Request::SetAttr { id, .. }
            | Request::SetXattr { id, .. }
            | Request::RemoveXattr { id, .. } => *id,
            _ => return,
        };
        let mut slots = self.slots.lock().expect("ahead slots");
        if slots.remove(&dir).is_some() {
            self.generation.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// See [`Client::ahead_landed`].
    pub(crate) async fn landed(&self) {
        if self.pending.load(Ordering::Acquire) == 0 {
            return;
        }
        let upto = self.open.lock().expect("ahead open").0;
        loop {
            let landed = self.landed.notified();
            if self.open.lock().expect("ahead open").1.first().is_none_or(|&s| s > upto) {
                return;
            }
            landed.await;
        }
    }
}

fn now() -> Timespec {
    let d = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    Timespec { sec: d.as_secs() as i64, nsec: d.subsec_nanos() }
}

impl Client {
    /// Makes regular files ahead from now on where this client holds the
    /// lease on the directory's names (needs leases on).
    pub fn enable_ahead(&self) {
        self.ahead.on.store(true, Ordering::Release);
    }

    /// Makes regular file `name` in `parent` without asking, if this client
    /// may (see the module doc): its attributes, open with a handle that
    /// holds its size (release it with [`Client::release_held_later`]), and
    /// how long its name and attributes may be cached. `None`: make it the
    /// usual way.
    pub fn create_ahead(
        self: &Arc<Self>,
        parent: Ent,
        name: &[u8],
        mode: u32,
        caller: Caller,
    ) -> Option<(EntryAttr, Duration)> {
        if !self.ahead.on.load(Ordering::Acquire) || self.ahead.refused.lock().expect("ahead").contains(&parent.owner) {
            return None;
        }
        let session = self.leases.get()?;
        let mode = match caller.umask {
            Some(umask) => hivefs_types::acl::create_mode(None, mode & 0o7777, umask, false).mode,
            None => mode & 0o7777,
        };
        let mut low = false;
        let made = session.with_dir_absent(parent.id, name, MARGIN, |left| {
            let mut slots = self.ahead.slots.lock().expect("ahead slots");
            let (free, asking) = slots.entry(parent.id).or_default();
            let Some((id, pattern)) = free.pop_front() else {
                low = !*asking;
                return None;
            };
            low = free.len() < LOW && !*asking;
            drop(slots);
            let at = now();
            let attr = EntryAttr {
                id,
                kind: FileKind::File,
                mode,
                uid: caller.uid,
                gid: caller.gid,
                size: 0,
                nlink: 1,
                atime: at,
                mtime: at,
                ctime: at,
                rdev: 0,
                owner: parent.owner,
                pattern: Some(pattern.clone()),
                dir_pattern: None,
            };
            let file = NewFile { name: name.to_vec(), id, pattern, mode, caller, at };
            self.queue_ahead(parent, file);
            Some((attr, left))
        });
        if low {
            self.reserve_ahead(parent);
        }
        if let Some((a, left)) = &made {
            session.made_ahead(a, std::time::Instant::now() + *left);
            if let Some(d) = self.dir_attrs.get() {
                d.made_ahead(parent.id, a.ctime);
            }
        }
        made
    }

    /// Queues a file made ahead for its node's next batch.
    fn queue_ahead(self: &Arc<Self>, parent: Ent, file: NewFile) {
        let seq = {
            let mut open = self.ahead.open.lock().expect("ahead open");
            open.0 += 1;
            let seq = open.0;
            open.1.insert(seq);
            seq
        };
        self.ahead.pending.fetch_add(1, Ordering::AcqRel);
        self.ahead.files.lock().expect("ahead files").insert(file.id, seq);
        let mut q = self.ahead.queue.lock().expect("ahead queue");
        let (files, running) = q.entry(parent.owner).or_default();
        files.push(Pending { seq, parent: parent.id, file });
        if !*running {
            *running = true;
            tokio::spawn(send_batches(Arc::downgrade(self), parent.owner));
        }
    }

    /// Asks `parent`'s node for more ids in the background.
    fn reserve_ahead(self: &Arc<Self>, parent: Ent) {
        {
            let mut slots = self.ahead.slots.lock().expect("ahead slots");
            if slots.len() > DIRS_MAX {
                slots.clear();
            }
            let (_, asking) = slots.entry(parent.id).or_default();
            if std::mem::replace(asking, true) {
                return;
            }
        }
        let c = Arc::downgrade(self);
        tokio::spawn(async move {
            let Some(c) = c.upgrade() else { return };
            let generation = c.ahead.generation.load(Ordering::Acquire);
            let req = Request::ReserveCreates { parent: parent.id, count: RESERVE };
            let r = c.meta(parent.owner, &req).await;
            let got = match r {
                // Patterns chosen before a change of the directory's settings are not used.
                Ok(Reply::Reserved { .. }) if c.ahead.generation.load(Ordering::Acquire) != generation => Vec::new(),
                Ok(Reply::Reserved { slots, lease_ms: _ }) => slots,
                r => {
                    match r {
                        Ok(r) => {
                            warn!("metadata node {}: odd answer to ReserveCreates: {}", parent.owner, unexpected(r))
                        }
                        Err(e) if e.code == ErrorCode::Protocol => {
                            debug!("metadata node {} makes no files ahead: {e}", parent.owner);
                            c.ahead.refused.lock().expect("ahead").insert(parent.owner);
                        }
                        Err(e) => {
                            debug!("no ids ahead for directory {} (metadata node {}): {e}", parent.id, parent.owner)
                        }
                    }
                    // Not asked again for a while (a full target, a directory that needs its node).
                    tokio::time::sleep(REASK_AFTER).await;
                    Vec::new()
                }
            };
            let mut slots = c.ahead.slots.lock().expect("ahead slots");
            let (free, asking) = slots.entry(parent.id).or_default();
            *asking = false;
            free.extend(got);
        });
    }

    /// Waits until every file made ahead so far has landed on its node (or
    /// was given up: see [`Client::ahead_failed`]).
    pub async fn ahead_landed(&self) {
        self.ahead.landed().await
    }

    /// Whether file `id` was made ahead and is not known to have landed
    /// (on its way, or refused and not reported yet).
    pub fn ahead_pending(&self, id: EntryId) -> bool {
        self.on_its_way(id) || {
            self.ahead.failures.load(Ordering::Acquire) > 0
                && self.ahead.failed.lock().expect("ahead failed").contains_key(&id)
        }
    }

    fn on_its_way(&self, id: EntryId) -> bool {
        self.ahead.pending.load(Ordering::Acquire) > 0
            && self.ahead.files.lock().expect("ahead files").contains_key(&id)
    }

    /// Waits until file `id`, if made ahead, has landed on its node; the
    /// node's refusal if it did not (once). A close waits for this, so a
    /// close that returned means the file is there.
    pub async fn ahead_file_landed(&self, id: EntryId) -> FsResult<()> {
        loop {
            let landed = self.ahead.landed.notified();
            if !self.on_its_way(id) {
                break;
            }
            landed.await;
        }
        match self.ahead_failed(id) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Why file `id`, made ahead, did not land (once; `None`: it did, or
    /// it was not made ahead).
    pub fn ahead_failed(&self, id: EntryId) -> Option<FsError> {
        if self.ahead.failures.load(Ordering::Acquire) == 0 {
            return None;
        }
        let mut failed = self.ahead.failed.lock().expect("ahead failed");
        let e = failed.remove(&id);
        self.ahead.failures.store(failed.len() as u64, Ordering::Release);
        e
    }

    /// One batch to `node` answered (or given up): the files' leases are
    /// taken, refused files noted.
    fn batch_done(
        &self,
        node: NodeId,
        parent: EntryId,
        batch: Vec<Pending>,
        r: Result<Reply, FsError>,
        sent: std::time::Instant,
    ) {
        let session = self.leases.get();
        match r {
            Ok(Reply::CreatedMany { leases, failed, lease_ms }) => {
                let failed: HashMap<u32, FsError> = failed.into_iter().collect();
                if let Some(s) = session {
                    s.granted_dirs(&[(parent, lease_ms)], None, sent);
                }
                for (k, p) in batch.iter().enumerate() {
                    if let Some(e) = failed.get(&(k as u32)) {
                        self.give_up(node, parent, p, e.clone());
                        continue;
                    }
                    let (attr_ms, name_ms) = leases.get(k).copied().unwrap_or((0, 0));
                    if let Some(s) = session {
                        s.granted(p.file.id, Some((parent, &p.file.name)), sent, attr_ms, name_ms);
                        if attr_ms == 0 || name_ms == 0 {
                            // Cached by the kernel since its create: dropped now.
                            s.drop_copies(p.file.id, name_ms == 0);
                        }
                    }
                }
            }
            Ok(r) => {
                let e = unexpected(r);
                for p in &batch {
                    self.give_up(node, parent, p, e.clone());
                }
            }
            Err(e) => {
                for p in &batch {
                    self.give_up(node, parent, p, e.clone());
                }
            }
        }
        let mut open = self.ahead.open.lock().expect("ahead open");
        for p in &batch {
            open.1.remove(&p.seq);
        }
        drop(open);
        let mut files = self.ahead.files.lock().expect("ahead files");
        for p in &batch {
            files.remove(&p.file.id);
        }
        drop(files);
        self.ahead.pending.fetch_sub(batch.len() as u64, Ordering::AcqRel);
        self.ahead.landed.notify_waiters();
    }

    fn give_up(&self, node: NodeId, parent: EntryId, p: &Pending, e: FsError) {
        // Ids held for the directory are not used after a refusal (a full
        // metadata target refuses the next reservation: creates there ask).
        if self.ahead.slots.lock().expect("ahead slots").remove(&parent).is_some() {
            self.ahead.generation.fetch_add(1, Ordering::AcqRel);
        }
        error!(
            "file {:?} (entry {}) made in directory {parent} did not land on metadata node {node}: {e}",
            String::from_utf8_lossy(&p.file.name),
            p.file.id
        );
        let mut failed = self.ahead.failed.lock().expect("ahead failed");
        failed.insert(p.file.id, e);
        self.ahead.failures.store(failed.len() as u64, Ordering::Release);
    }
}

/// The task sending `node`'s files made ahead: each round takes every file
/// queued, one batch per directory (more for a very long one), all sent at
/// once, until nothing is queued.
async fn send_batches(client: std::sync::Weak<Client>, node: NodeId) {
    loop {
        let Some(c) = client.upgrade() else { return };
        let batches = {
            let mut q = c.ahead.queue.lock().expect("ahead queue");
            let Some((files, running)) = q.get_mut(&node) else { return };
            if files.is_empty() {
                *running = false;
                return;
            }
            batches(std::mem::take(files))
        };
        let mut sends = tokio::task::JoinSet::new();
        for (parent, batch) in batches {
            let c = c.clone();
            sends.spawn(async move { send_batch(&c, node, parent, batch).await });
        }
        while sends.join_next().await.is_some() {}
    }
}

/// Files in the order they were made, cut into batches per directory, each
/// well inside a frame however long the names and wide the patterns.
fn batches(files: Vec<Pending>) -> Vec<(EntryId, Vec<Pending>)> {
    let mut out: Vec<(EntryId, Vec<Pending>, usize)> = Vec::new();
    let mut open: HashMap<EntryId, usize> = HashMap::new();
    for p in files {
        let bytes = 64 + p.file.name.len() + 5 * p.file.pattern.stripe_count();
        let k = match open.get(&p.parent) {
            Some(&k) if out[k].1.len() < CREATE_MANY_MAX && out[k].2 + bytes <= BATCH_BYTES_MAX => k,
            _ => {
                out.push((p.parent, Vec::new(), 0));
                open.insert(p.parent, out.len() - 1);
                out.len() - 1
            }
        };
        out[k].1.push(p);
        out[k].2 += bytes;
    }
    out.into_iter().map(|(parent, batch, _)| (parent, batch)).collect()
}

/// Sends one batch, again while its node is unreachable (a repeat finds
/// the files the first attempt made), and takes the answer.
async fn send_batch(c: &Arc<Client>, node: NodeId, parent: EntryId, batch: Vec<Pending>) {
    let req = Request::CreateMany { parent, files: batch.iter().map(|p| p.file.clone()).collect() };
    let mut sent = std::time::Instant::now();
    let mut r = c.meta(node, &req).await;
    let start = tokio::time::Instant::now();
    let mut backoff = Duration::from_millis(50);
    while matches!(&r, Err(e) if matches!(e.code, ErrorCode::Unavailable | ErrorCode::TimedOut))
        && start.elapsed() < RESEND_FOR
    {
        warn!(
            "{} files made ahead in directory {parent} wait for metadata node {node}: {}",
            batch.len(),
            r.as_ref().err().map(|e| e.to_string()).unwrap_or_default()
        );
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(2));
        sent = std::time::Instant::now();
        r = c.meta(node, &req).await;
    }
    c.batch_done(node, parent, batch, r, sent);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending(seq: u64, parent: u64, name_len: usize) -> Pending {
        let id = EntryId { node: 1, epoch: 1, counter: 100 + seq };
        let pattern =
            Pattern::new(hivefs_types::pattern::PatternKind::Raid0, 4096, vec![hivefs_types::ids::TargetId(1)])
                .unwrap();
        Pending {
            seq,
            parent: EntryId { node: 1, epoch: 1, counter: parent },
            file: NewFile {
                name: vec![b'n'; name_len],
                id,
                pattern,
                mode: 0o644,
                caller: Caller::new(0, 0),
                at: now(),
            },
        }
    }

    /// A round's files go as one batch per directory, in the order they
    /// were made; a directory whose files would not fit a frame gets more.
    #[test]
    fn a_round_is_one_batch_per_directory_each_inside_a_frame() {
        let files: Vec<Pending> = (0..6).map(|i| pending(i, 1 + i % 2, 10)).collect();
        let got: Vec<(u64, Vec<u64>)> =
            batches(files).into_iter().map(|(p, b)| (p.counter, b.iter().map(|f| f.seq).collect())).collect();
        assert_eq!(got, vec![(1, vec![0, 2, 4]), (2, vec![1, 3, 5])]);
        // Names of 255 bytes: about 800 per batch of 256 KiB.
        let long: Vec<Pending> = (0..2000).map(|i| pending(i, 7, 255)).collect();
        let sizes: Vec<usize> = batches(long).iter().map(|(_, b)| b.len()).collect();
        assert!(sizes.len() == 3 && sizes.iter().sum::<usize>() == 2000, "{sizes:?}");
        assert!(sizes.iter().all(|&n| n <= CREATE_MANY_MAX && n * (64 + 255 + 5) <= BATCH_BYTES_MAX), "{sizes:?}");
    }
}
