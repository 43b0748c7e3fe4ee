//! File-system modification events of this metadata node (`hivefs events`): every
//! committed change that a consumer (an indexer, a policy engine) cares about, numbered
//! in commit order, kept in a bounded buffer that consumers read with `Request::Events`.
//!
//! - An event is published only after its batch is in the journal, in the batch's order.
//! - A cross-node operation's event is drafted at its intent and published at its
//!   commit (dropped at its abort); an intent finished after a restart publishes none.
//! - The buffer holds `event_buffer` events (meta.toml, default [`DEFAULT_CAPACITY`]):
//!   older ones are dropped and counted, so a
//!   consumer that went away costs bounded memory, and one that comes back sees the gap
//!   (its next sequence number is below `oldest`).
//! - Numbering starts at 1 in each run of the process (`boot` tells runs apart).
//!
//! It must not decide anything about the namespace: it only reads what the writer did.

use crate::cross::MultiMut;
use crate::ops::Mutation;
use hivefs_proto::{Event, EventKind, Reply, EVENTS_MAX};
use hivefs_types::attr::FileKind;
use hivefs_types::error::FsResult;
use hivefs_types::ids::{EntryId, NodeId};
use std::collections::{HashMap, VecDeque};
use std::sync::{LazyLock, Mutex};
use std::time::Duration;
use tokio::sync::Notify;

/// `HIVEFS_EVENTS=off` in the metadata node's environment: no events are drafted. For
/// measuring what they cost.
static OFF: LazyLock<bool> = LazyLock::new(|| std::env::var("HIVEFS_EVENTS").is_ok_and(|v| v == "off"));

/// Events held for consumers by default: about 160 bytes each with their names, 5 MiB
/// (a burst of creates at 14,000/s fills it in 2 s; a following consumer empties it
/// every poll).
pub const DEFAULT_CAPACITY: usize = 32_768;
/// Longest wait of one `Events` request.
pub const WAIT_MAX: Duration = Duration::from_secs(10);

struct Ring {
    buf: VecDeque<Event>,
    /// The next sequence number.
    next: u64,
    dropped: u64,
    /// Drafts of cross-node operations, by intent, until their commit.
    pending: HashMap<EntryId, Event>,
}

/// The event stream of this process.
pub struct EventLog {
    ring: Mutex<Ring>,
    arrived: Notify,
    boot: u64,
    capacity: std::sync::atomic::AtomicUsize,
}

static LOG: LazyLock<EventLog> = LazyLock::new(|| EventLog::new(DEFAULT_CAPACITY));

/// The process's event log (one per metadata node process).
pub fn log() -> &'static EventLog {
    &LOG
}

fn now_ns() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
}

fn event(kind: EventKind) -> Event {
    Event {
        seq: 0,
        time_ns: 0,
        kind,
        entry: None,
        parent: None,
        name: Vec::new(),
        new_parent: None,
        new_name: Vec::new(),
        uid: None,
    }
}

/// What a change will publish when its batch commits.
pub enum Draft {
    None,
    /// Published with the commit (`entry` filled from the answer when unset).
    Now(Event),
    /// A cross-node intent: held until its commit.
    Hold(EntryId, Event),
    Commit(EntryId),
    Abort(EntryId),
}

/// The draft of a single-node mutation (the writer asks, layers point down).
pub fn draft_op(m: &Mutation) -> Draft {
    if *OFF {
        return Draft::None;
    }
    match m {
        Mutation::Create { parent, name, kind, uid, .. } => {
            let k = if *kind == FileKind::File { EventKind::Create } else { EventKind::Mknod };
            Draft::Now(Event { parent: Some(*parent), name: name.clone(), uid: Some(*uid), ..event(k) })
        }
        Mutation::CreateAs { parent, name, uid, .. } => {
            Draft::Now(Event { parent: Some(*parent), name: name.clone(), uid: Some(*uid), ..event(EventKind::Create) })
        }
        Mutation::Mkdir { parent, name, uid, .. } => {
            Draft::Now(Event { parent: Some(*parent), name: name.clone(), uid: Some(*uid), ..event(EventKind::Mkdir) })
        }
        Mutation::Symlink { parent, name, uid, .. } => Draft::Now(Event {
            parent: Some(*parent),
            name: name.clone(),
            uid: Some(*uid),
            ..event(EventKind::Symlink)
        }),
        Mutation::Link { id, new_parent, new_name } => Draft::Now(Event {
            entry: Some(*id),
            new_parent: Some(*new_parent),
            new_name: new_name.clone(),
            ..event(EventKind::Link)
        }),
        Mutation::Unlink { parent, name } => {
            Draft::Now(Event { parent: Some(*parent), name: name.clone(), ..event(EventKind::Unlink) })
        }
        Mutation::Rmdir { parent, name } => {
            Draft::Now(Event { parent: Some(*parent), name: name.clone(), ..event(EventKind::Rmdir) })
        }
        Mutation::Rename { parent, name, new_parent, new_name, .. } => Draft::Now(Event {
            parent: Some(*parent),
            name: name.clone(),
            new_parent: Some(*new_parent),
            new_name: new_name.clone(),
            ..event(EventKind::Rename)
        }),
        Mutation::SetAttr { id, attr, .. } => {
            let k = if attr.size.is_some() { EventKind::Truncate } else { EventKind::SetAttr };
            Draft::Now(Event { entry: Some(*id), ..event(k) })
        }
        Mutation::UpdateSize { id, .. } => Draft::Now(Event { entry: Some(*id), ..event(EventKind::CloseWrite) }),
        Mutation::SetXattr { id, name, .. } => {
            Draft::Now(Event { entry: Some(*id), name: name.clone(), ..event(EventKind::SetXattr) })
        }
        Mutation::RemoveXattr { id, name } => {
            Draft::Now(Event { entry: Some(*id), name: name.clone(), ..event(EventKind::RemoveXattr) })
        }
        Mutation::SetDirPattern { id, .. } => Draft::Now(Event { entry: Some(*id), ..event(EventKind::SetPattern) }),
        _ => Draft::None,
    }
}

/// The draft of a step of a cross-node operation.
pub fn draft_cross(m: &MultiMut) -> Draft {
    if *OFF {
        return Draft::None;
    }
    match m {
        MultiMut::MkdirIntent(i) => Draft::Hold(
            i.intent,
            Event { parent: Some(i.parent), name: i.name.clone(), uid: Some(i.uid), ..event(EventKind::Mkdir) },
        ),
        MultiMut::RmdirIntent(i) => {
            Draft::Hold(i.intent, Event { parent: Some(i.parent), name: i.name.clone(), ..event(EventKind::Rmdir) })
        }
        MultiMut::UnlinkIntent(i) => {
            Draft::Hold(i.intent, Event { parent: Some(i.parent), name: i.name.clone(), ..event(EventKind::Unlink) })
        }
        MultiMut::LinkIntent(i) => Draft::Hold(
            i.intent,
            Event {
                entry: Some(i.id),
                new_parent: Some(i.new_parent),
                new_name: i.new_name.clone(),
                ..event(EventKind::Link)
            },
        ),
        MultiMut::RenameIntent(i) => Draft::Hold(
            i.intent,
            Event {
                parent: Some(i.parent),
                name: i.name.clone(),
                new_parent: Some(i.new_parent),
                new_name: i.new_name.clone(),
                ..event(EventKind::Rename)
            },
        ),
        MultiMut::MkdirCommit(c) => Draft::Commit(c.intent),
        MultiMut::RmdirCommit(c) => Draft::Commit(c.intent),
        MultiMut::UnlinkCommit(c) => Draft::Commit(c.intent),
        MultiMut::LinkCommit(c) => Draft::Commit(c.intent),
        MultiMut::RenameCommit(c) => Draft::Commit(c.intent),
        MultiMut::MkdirAbort(a) => Draft::Abort(a.intent),
        MultiMut::LinkAbort(a) => Draft::Abort(a.intent),
        MultiMut::Abort(a) => Draft::Abort(a.intent),
        _ => Draft::None,
    }
}

/// The entry an answer names.
fn answered_entry(r: &Reply) -> Option<EntryId> {
    match r {
        Reply::Entry(a) => Some(a.id),
        Reply::Leased { attr, .. } => Some(attr.id),
        Reply::WithParent { reply, .. } => answered_entry(reply),
        _ => None,
    }
}

impl EventLog {
    pub fn new(capacity: usize) -> EventLog {
        EventLog {
            ring: Mutex::new(Ring { buf: VecDeque::new(), next: 1, dropped: 0, pending: HashMap::new() }),
            arrived: Notify::new(),
            boot: now_ns(),
            capacity: capacity.into(),
        }
    }

    /// Keeps at most `n` events from now on (0: none).
    pub fn set_capacity(&self, n: usize) {
        self.capacity.store(n, std::sync::atomic::Ordering::Relaxed);
        let mut ring = self.ring();
        self.trim(&mut ring);
    }

    fn trim(&self, ring: &mut Ring) {
        while ring.buf.len() > self.capacity.load(std::sync::atomic::Ordering::Relaxed) {
            ring.buf.pop_front();
            ring.dropped += 1;
            hivefs_metrics::event(false);
        }
    }

    fn ring(&self) -> std::sync::MutexGuard<'_, Ring> {
        self.ring.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Publishes the drafts of a committed batch, in order (`results`: the answers).
    pub fn committed<'a>(&self, drafts: Vec<Draft>, results: impl IntoIterator<Item = &'a FsResult<Reply>>) {
        let mut published = false;
        {
            let mut ring = self.ring();
            for (d, r) in drafts.into_iter().zip(results) {
                let Ok(reply) = r else { continue };
                let e = match d {
                    Draft::None => continue,
                    Draft::Now(mut e) => {
                        if e.entry.is_none() {
                            e.entry = answered_entry(reply);
                        }
                        e
                    }
                    Draft::Hold(intent, e) => {
                        ring.pending.insert(intent, e);
                        continue;
                    }
                    Draft::Commit(intent) => match ring.pending.remove(&intent) {
                        Some(e) => e,
                        None => continue,
                    },
                    Draft::Abort(intent) => {
                        ring.pending.remove(&intent);
                        continue;
                    }
                };
                self.push(&mut ring, e);
                published = true;
            }
        }
        if published {
            self.arrived.notify_waiters();
        }
    }

    fn push(&self, ring: &mut Ring, mut e: Event) {
        e.seq = ring.next;
        e.time_ns = now_ns();
        ring.next += 1;
        ring.buf.push_back(e);
        hivefs_metrics::event(true);
        self.trim(ring);
    }

    fn answer(&self, node: NodeId, after: u64, max: u32) -> Reply {
        let ring = self.ring();
        let oldest = ring.buf.front().map_or(ring.next, |e| e.seq);
        let max = max.clamp(1, EVENTS_MAX) as usize;
        let events: Vec<Event> = if after == u64::MAX {
            Vec::new()
        } else {
            // Sequence numbers are consecutive in the buffer.
            let skip = after.saturating_add(1).saturating_sub(oldest) as usize;
            ring.buf.iter().skip(skip).take(max).cloned().collect()
        };
        Reply::Events { node, boot: self.boot, oldest, last: ring.next - 1, dropped: ring.dropped, events }
    }

    /// Events after `after` (waiting up to `wait` for the first one).
    pub async fn read(&self, node: NodeId, after: u64, max: u32, wait: Duration) -> Reply {
        let deadline = tokio::time::Instant::now() + wait.min(WAIT_MAX);
        loop {
            let arrived = self.arrived.notified();
            let r = self.answer(node, after, max);
            let empty = matches!(&r, Reply::Events { events, .. } if events.is_empty());
            if !empty || after == u64::MAX || tokio::time::Instant::now() >= deadline {
                return r;
            }
            if tokio::time::timeout_at(deadline, arrived).await.is_err() {
                return self.answer(node, after, max);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unlink(name: &str) -> Draft {
        Draft::Now(Event { parent: Some(EntryId::ROOT), name: name.into(), ..event(EventKind::Unlink) })
    }

    fn events(r: &Reply) -> (u64, u64, Vec<u64>) {
        let Reply::Events { oldest, last, events, .. } = r else { panic!("{r:?}") };
        (*oldest, *last, events.iter().map(|e| e.seq).collect())
    }

    #[tokio::test]
    async fn numbered_in_order_bounded_and_gaps_show() {
        let log = EventLog::new(3);
        let node = NodeId(1);
        let ok = |n| (0..n).map(|_| Ok(Reply::Ok)).collect::<Vec<_>>();
        log.committed(vec![unlink("a"), unlink("b")], &ok(2));
        assert_eq!(events(&log.answer(node, 0, 10)), (1, 2, vec![1, 2]));
        // A failed operation publishes nothing.
        log.committed(vec![unlink("c")], &[Err(hivefs_types::fs_err!(NotFound, "c"))]);
        assert_eq!(events(&log.answer(node, 2, 10)), (1, 2, vec![]));
        log.committed(vec![unlink("d"), unlink("e"), unlink("f")], &ok(3));
        // Only 3 held: 1 and 2 dropped; a consumer at 0 sees oldest 3 > 1 (a gap).
        assert_eq!(events(&log.answer(node, 0, 10)), (3, 5, vec![3, 4, 5]));
        assert_eq!(events(&log.answer(node, 4, 10)), (3, 5, vec![5]));
        assert_eq!(events(&log.answer(node, u64::MAX, 10)), (3, 5, vec![]));
        let Reply::Events { dropped, .. } = log.answer(node, 0, 1) else { unreachable!() };
        assert_eq!(dropped, 2);
    }

    #[tokio::test]
    async fn cross_node_drafts_wait_for_their_commit() {
        let log = EventLog::new(10);
        let (i1, i2) = (EntryId { node: 1, epoch: 1, counter: 7 }, EntryId { node: 1, epoch: 1, counter: 8 });
        let held = |i| Draft::Hold(i, event(EventKind::Mkdir));
        log.committed(vec![held(i1), held(i2)], &[Ok(Reply::Ok), Ok(Reply::Ok)]);
        assert_eq!(events(&log.answer(NodeId(1), 0, 10)).2, Vec::<u64>::new());
        log.committed(vec![Draft::Abort(i1), Draft::Commit(i2)], &[Ok(Reply::Ok), Ok(Reply::Ok)]);
        assert_eq!(events(&log.answer(NodeId(1), 0, 10)).2, vec![1]);
    }

    #[tokio::test]
    async fn a_reader_waits_for_the_next_event() {
        let log = std::sync::Arc::new(EventLog::new(10));
        let l = log.clone();
        let reader = tokio::spawn(async move { l.read(NodeId(1), 0, 10, Duration::from_secs(5)).await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        log.committed(vec![unlink("x")], &[Ok(Reply::Ok)]);
        assert_eq!(events(&reader.await.unwrap()).2, vec![1]);
    }
}
