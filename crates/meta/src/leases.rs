//! Attribute leases: which clients may cache which inodes' attributes, and
//! telling them before a change is acknowledged.
//!
//! A client that polls this node (`LeaseWait`) and names itself in its
//! requests' envelopes (`lease_client`) gets, with every answer carrying a non-directory's attributes
//! from this node, a lease of [`Leases::duration`]: a promise that nobody
//! else's change of those attributes is acknowledged before the client has
//! dropped its copy or the lease has ended. Names work the same way: an
//! answer to a lookup (or a create) of a name this node stores leases that
//! name ([`LeaseKey::Name`]); a revoked name tells the client to drop every
//! name it caches (the kernel can do that without locks; see the mount).
//! Every committed mutation lists the inodes and names whose records it
//! wrote (`Tables::touched`); before its answer leaves, [`Leases::revoke`]
//! queues them to each other holder's poll and waits for its
//! acknowledgement, or for the lease's end when the client does not answer.
//! The requester's own copies stay: its kernel already drops what its own
//! operations change (the mount does that itself for sizes it reports on
//! close).
//!
//! A grant comes after the attributes were read; a change committed between
//! the read and the grant would find no holder to tell, so while any client
//! polls, every change is noted with a sequence number and the request that
//! made it, for [`CHANGE_MEMORY`], and a grant for a key changed since the
//! request began by another request is refused (a request's own change is
//! in what it answers with); so is a grant to a client whose first poll
//! came after the request began.
//!
//! Keys are kept as 64-bit hashes (with a per-process random seed), so a
//! lease costs no copy of the name: two keys with one hash only make a
//! revocation or a refusal more than needed, never fewer.
//!
//! Leases live in memory. What survives a restart is a bound: the data dir's
//! [`UNTIL_FILE`] holds a time by which every lease granted so far has ended
//! (moved ahead by `namespace::spawn_lease_recorder` while grants happen; a grant that
//! would end later is refused). After a start, changes are acknowledged no
//! earlier than that time, so copies granted by the previous run have ended
//! even if it was killed. This module must not
//! decide what a change is (the writer reports touched inodes) nor talk to
//! the network (the poll is an ordinary request).

use hivefs_proto::{Reply, REVOKED_MAX};
use hivefs_types::ids::EntryId;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
// The runtime's clock: a simulation's paused time runs these waits too.
use tokio::sync::{watch, Notify};
use tokio::time::Instant;
use tracing::{info, warn};

/// File in the metadata data dir: Unix time (ms) by which every lease this
/// node granted has ended.
pub const UNTIL_FILE: &str = "leases.until";

pub use crate::store::LeaseKey;

/// Default of the metadata config's `attr_lease_ms`.
pub const DEFAULT_DURATION: Duration = Duration::from_secs(5);
/// Longest lease the node grants, whatever it is configured with.
pub const MAX_DURATION: Duration = Duration::from_secs(60);
/// Longest one `LeaseWait` waits, whatever it asks.
pub const MAX_WAIT: Duration = Duration::from_secs(30);
/// How long a change is remembered against grants of older reads.
pub const CHANGE_MEMORY: Duration = Duration::from_secs(1);
/// Most keys with a lease at a time (about 64 bytes each); beyond it no
/// lease is granted until some end.
pub const MAX_LEASED: usize = 300_000;
/// How often expired leases and old change notes are swept.
const SWEEP_EVERY: Duration = Duration::from_secs(1);
/// Waiting for a client that does not answer ends this long after its lease
/// (the kernel rounds a cache time up to its clock tick).
const EXPIRY_SLACK: Duration = Duration::from_millis(50);

struct Session {
    /// Revocations not yet acknowledged, with their sequence numbers; a
    /// poll answers with them again until they are (a lost answer is sent
    /// again, not forgotten). `None`: a name.
    pending: std::collections::VecDeque<(u64, Option<EntryId>)>,
    /// Sequence number of the last revocation queued.
    queued: u64,
    acked: watch::Sender<u64>,
    wake: Arc<Notify>,
    /// Start of its last poll, and how long that poll may wait.
    last_poll: Instant,
    poll_wait: Duration,
    /// Its first poll.
    since: Instant,
    /// It polls with `LeaseWaitDirs`: leases on directories' names.
    dirs: bool,
}

impl Session {
    /// The oldest queued revocations (at most [`REVOKED_MAX`]), and the
    /// sequence number of the last of them.
    fn take_pending(&mut self) -> Reply {
        let batch: Vec<(u64, Option<EntryId>)> = self.pending.iter().take(REVOKED_MAX).copied().collect();
        let upto = batch.last().map_or(self.queued, |&(seq, _)| seq);
        let names = batch.iter().any(|(_, id)| id.is_none());
        Reply::Revoked { ids: batch.into_iter().filter_map(|(_, id)| id).collect(), names, upto }
    }

    fn alive(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.last_poll) < self.poll_wait + Duration::from_secs(5)
    }
}

/// One client's lease on one key.
#[derive(Clone, Copy, Debug)]
struct Holder {
    client: u64,
    end: Instant,
    /// The inode, for an attribute lease.
    item: Option<EntryId>,
    /// A revocation of this copy was queued as this sequence number of the
    /// client's session and is not known to be acknowledged: a later change
    /// waits for the same acknowledgement ([`NO_SESSION`]: for the lease's end).
    revoked: Option<u64>,
}

/// [`Holder::revoked`] of a holder without a session: only its end counts.
const NO_SESSION: u64 = u64::MAX;

#[derive(Default)]
struct State {
    /// Clients holding a lease on a key, per key hash.
    holders: HashMap<u64, Vec<Holder>>,
    sessions: HashMap<u64, Session>,
    /// Recently changed inodes: (change sequence number, when, the
    /// changing request's [`Mark::token`], 0 for none).
    changed: HashMap<u64, (u64, Instant, u64)>,
    change_seq: u64,
    next_token: u64,
    last_sweep: Option<Instant>,
}

pub struct Leases {
    state: Mutex<State>,
    hasher: std::collections::hash_map::RandomState,
    /// In ms; zero: no leases are granted and changes never wait.
    duration_ms: AtomicU64,
    /// Changes are acknowledged no earlier than this (see the module doc);
    /// `in_grace` says whether it may still lie ahead.
    grace_until: Mutex<Option<Instant>>,
    in_grace: AtomicBool,
    /// [`UNTIL_FILE`] and the time it holds (Unix ms); no file: no bound.
    until_file: Mutex<Option<PathBuf>>,
    until_ms: AtomicU64,
    /// A grant was refused or came close to `until_ms`: move it ahead.
    want_later: AtomicBool,
    /// The last write of [`UNTIL_FILE`] failed, and when it was tried (ms).
    record_failed: AtomicBool,
    last_attempt: AtomicU64,
    /// Directories where a client makes files ahead of telling this node
    /// (write-back creates), and which client. Apart from [`State`]: every
    /// request that names a directory looks here while it has entries.
    write_back: Mutex<HashMap<EntryId, u64>>,
    /// Entries of `write_back`: none, no request looks there.
    write_backs: AtomicU64,
}

impl Default for Leases {
    fn default() -> Self {
        Leases {
            state: Mutex::default(),
            hasher: Default::default(),
            duration_ms: AtomicU64::new(0),
            grace_until: Mutex::new(None),
            in_grace: AtomicBool::new(false),
            until_file: Mutex::new(None),
            until_ms: AtomicU64::new(u64::MAX),
            want_later: AtomicBool::new(false),
            record_failed: AtomicBool::new(false),
            last_attempt: AtomicU64::new(0),
            write_back: Mutex::default(),
            write_backs: AtomicU64::new(0),
        }
    }
}

/// Wall-clock milliseconds (what [`UNTIL_FILE`] holds across restarts):
/// read once per process, then moved on by the runtime's clock, so a
/// simulation's paused time moves it too (a restart's wait for the leases
/// of its previous run is then the same in every run of a seed) and a
/// step of the wall clock during a run changes no wait.
pub(crate) fn unix_ms() -> u64 {
    static BASE: std::sync::OnceLock<(u64, Instant)> = std::sync::OnceLock::new();
    let (ms, at) = *BASE.get_or_init(|| {
        (SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64), Instant::now())
    });
    ms + Instant::now().saturating_duration_since(at).as_millis() as u64
}

/// Where a request stood when it began, for [`Leases::grant`].
#[derive(Clone, Copy, Debug)]
pub struct Mark {
    seq: u64,
    at: Instant,
    /// Names the request (never 0).
    pub token: u64,
}

/// Who asks for a change: the client (whose own lease stays) and its
/// request's [`Mark::token`].
#[derive(Clone, Copy, Debug)]
pub struct Requester {
    pub client: u64,
    pub token: u64,
}

impl Leases {
    /// Turns leases on (a zero duration turns them off) without a record in
    /// a data dir: changes wait one duration from now, as leases of a
    /// previous run may still be held.
    pub fn set_duration(&self, d: Duration) {
        let d = d.min(MAX_DURATION);
        self.duration_ms.store(d.as_millis() as u64, Ordering::Release);
        *self.grace_until.lock().expect("lease grace") = (!d.is_zero()).then(|| Instant::now() + d + EXPIRY_SLACK);
        self.in_grace.store(!d.is_zero(), Ordering::Release);
    }

    /// Turns leases on with the bound recorded in `dir` ([`UNTIL_FILE`]):
    /// changes wait until the time it holds (at most one duration from now).
    /// Run `namespace::spawn_lease_recorder` too, or no lease is granted.
    pub fn start_recorded(&self, dir: &Path, d: Duration) {
        let d = d.min(MAX_DURATION);
        let path = dir.join(UNTIL_FILE);
        let now = unix_ms();
        // Unreadable (torn by a crash mid-write): assume a lease may have just been granted.
        let prev = match std::fs::read_to_string(&path) {
            Ok(s) => s.trim().parse::<u64>().unwrap_or(now + d.as_millis() as u64 + 1000),
            Err(_) => 0,
        };
        // Whatever the previous run promised, bounded by the longest lease.
        let wait = Duration::from_millis(prev.saturating_sub(now)).min(MAX_DURATION + Duration::from_secs(1));
        self.duration_ms.store(d.as_millis() as u64, Ordering::Release);
        *self.grace_until.lock().expect("lease grace") =
            (!wait.is_zero()).then(|| Instant::now() + wait + EXPIRY_SLACK);
        self.in_grace.store(!wait.is_zero(), Ordering::Release);
        self.until_ms.store(prev.max(now), Ordering::Release);
        *self.until_file.lock().expect("lease file") = Some(path);
        // Ready for the first grants at once.
        self.want_later.store(true, Ordering::Release);
        self.record();
    }

    /// Moves [`UNTIL_FILE`] ahead when grants need it (called by the recorder).
    pub(crate) fn record(&self) {
        let d = self.duration();
        let left = self.until_ms.load(Ordering::Acquire).saturating_sub(unix_ms());
        if d.is_zero() || !self.want_later.load(Ordering::Acquire) || left > d.as_millis() as u64 + 500 {
            return;
        }
        self.extend();
    }

    /// Writes a new end into [`UNTIL_FILE`]: one duration and a second from now.
    /// After a failure, at most one attempt per 100 ms, and one warning
    /// until it works again (a full data dir must not fill up with warnings).
    fn extend(&self) {
        let d = self.duration();
        let Some(path) = self.until_file.lock().expect("lease file").clone() else { return };
        let now = unix_ms();
        if self.record_failed.load(Ordering::Acquire) && now < self.last_attempt.load(Ordering::Acquire) + 100 {
            return;
        }
        self.last_attempt.store(now, Ordering::Release);
        let until = now + d.as_millis() as u64 + 1000;
        // Overwritten in place, fixed width: after its first page the file
        // never takes more space from a data dir that may be nearly full.
        let write = || {
            use std::os::unix::fs::FileExt;
            let f = std::fs::OpenOptions::new().write(true).create(true).truncate(false).open(&path)?;
            f.write_all_at(format!("{until:020}\n").as_bytes(), 0)
        };
        match write() {
            Ok(()) => {
                self.want_later.store(false, Ordering::Release);
                self.until_ms.store(until, Ordering::Release);
                if self.record_failed.swap(false, Ordering::AcqRel) {
                    info!("recording the end of attribute leases in {} works again", path.display());
                }
            }
            Err(e) => {
                if !self.record_failed.swap(true, Ordering::AcqRel) {
                    warn!("cannot record the end of attribute leases in {}: {e}; no leases granted", path.display());
                }
            }
        }
    }

    pub fn duration(&self) -> Duration {
        Duration::from_millis(self.duration_ms.load(Ordering::Acquire))
    }

    /// Notes when a request begins (see [`Leases::grant`]).
    pub fn mark(&self) -> Mark {
        let mut st = self.state.lock().expect("leases");
        st.next_token += 1;
        Mark { seq: st.change_seq, at: Instant::now(), token: st.next_token }
    }

    /// Grants `client` a lease on `id`'s attributes read by a request that
    /// began at `since`; returns its length in ms (0: none). Refused when the
    /// client does not poll, when `id` changed since, or when the request
    /// took so long that such a change may be forgotten.
    pub fn grant(&self, client: u64, key: LeaseKey, since: Mark) -> u32 {
        self.grant_as(client, key, since, false)
    }

    /// Grants `client` a lease on the set of names in `dir` (a directory
    /// whose entries this node stores), for a request that began at
    /// `since`: only to a client that polls with `LeaseWaitDirs`, and
    /// unless `fresh` (the directory was just made, empty) only as a
    /// renewal of a lease the client holds and that was not revoked.
    pub fn grant_names(&self, client: u64, dir: EntryId, since: Mark, fresh: bool) -> u32 {
        self.grant_as(client, LeaseKey::Names(dir), since, !fresh)
    }

    /// Whether `client` polls with `LeaseWaitDirs` (see [`Leases::grant_names`]).
    pub fn takes_dir_names(&self, client: u64) -> bool {
        self.state.lock().expect("leases").sessions.get(&client).is_some_and(|s| s.dirs)
    }

    /// Whether `client` holds a lease on `dir`'s names that no change is
    /// revoking, with at least `margin` left.
    pub fn holds_names(&self, client: u64, dir: EntryId, margin: Duration) -> bool {
        let h = self.hasher.hash_one(LeaseKey::Names(dir));
        let st = self.state.lock().expect("leases");
        let until = Instant::now() + margin;
        st.holders.get(&h).is_some_and(|hs| {
            hs.iter().any(|x| x.client == client && x.item == Some(dir) && x.revoked.is_none() && x.end > until)
        })
    }

    /// Whether some client makes files ahead somewhere (see [`Leases::write_back`]).
    pub fn any_write_back(&self) -> bool {
        self.write_backs.load(Ordering::Acquire) > 0
    }

    /// `client`, holding the lease on `dir`'s names, makes files there
    /// ahead of telling this node (write-back creates): from now on
    /// [`Leases::recall`] takes that lease back before another client's
    /// request reads or changes `dir`'s names.
    pub fn write_back(&self, client: u64, dir: EntryId) {
        let mut wb = self.write_back.lock().expect("write-back dirs");
        wb.insert(dir, client);
        self.write_backs.store(wb.len() as u64, Ordering::Release);
    }

    /// Before a request of `requester` (`None`: a client without leases,
    /// or another node) reads or changes the names of `dir`: a client that
    /// makes files there ahead of telling this node gives its lease on the
    /// names back first, which it does once those files are here.
    pub async fn recall(&self, dir: EntryId, requester: Option<Requester>) {
        if self.write_backs.load(Ordering::Acquire) == 0 {
            return;
        }
        {
            let mut wb = self.write_back.lock().expect("write-back dirs");
            match wb.get(&dir) {
                Some(&c) if requester.is_none_or(|r| r.client != c) => {
                    wb.remove(&dir);
                    self.write_backs.store(wb.len() as u64, Ordering::Release);
                }
                _ => return,
            }
        }
        self.revoke(&[LeaseKey::Names(dir)], requester).await;
    }

    fn grant_as(&self, client: u64, key: LeaseKey, since: Mark, renewal: bool) -> u32 {
        let d = self.duration();
        let now = Instant::now();
        if d.is_zero() || now.saturating_duration_since(since.at) >= CHANGE_MEMORY / 2 {
            return 0;
        }
        // The recorded bound must cover this lease, with room for a while.
        let end_ms = unix_ms() + d.as_millis() as u64;
        let until = self.until_ms.load(Ordering::Acquire);
        if end_ms + 500 > until {
            self.want_later.store(true, Ordering::Release);
            if end_ms > until {
                // Lapsed (no grants for a while): a small write, here and now.
                self.extend();
                if end_ms > self.until_ms.load(Ordering::Acquire) {
                    return 0;
                }
            }
        }
        let h = self.hasher.hash_one(&key);
        let (item, dirs) = match key {
            LeaseKey::Attr(id) => (Some(id), false),
            LeaseKey::Name(..) => (None, false),
            LeaseKey::Names(dir) => (Some(dir), true),
        };
        let mut st = self.state.lock().expect("leases");
        // Changes made before its first poll were not noted.
        if !st.sessions.get(&client).is_some_and(|s| s.alive(now) && s.since <= since.at && (s.dirs || !dirs)) {
            return 0;
        }
        let held = |hs: &Vec<Holder>| hs.iter().any(|x| x.client == client && x.item == item && x.revoked.is_none());
        if renewal && !st.holders.get(&h).is_some_and(held) {
            return 0;
        }
        if st.changed.get(&h).is_some_and(|&(seq, _, by)| seq > since.seq && by != since.token) {
            return 0;
        }
        if st.holders.len() >= MAX_LEASED && !st.holders.contains_key(&h) {
            return 0;
        }
        let end = now + d;
        let hs = st.holders.entry(h).or_default();
        // A copy granted now is not covered by a revocation queued before:
        // the next change queues another (acknowledged after the older one).
        match hs.iter_mut().find(|x| x.client == client && x.item == item) {
            Some(x) => *x = Holder { end: x.end.max(end), revoked: None, ..*x },
            None => hs.push(Holder { client, end, item, revoked: None }),
        }
        d.as_millis() as u32
    }

    /// Before a change of `ids` by `requester` is acknowledged: tells every
    /// other holder of a lease on them and waits until each has answered or
    /// its lease has ended.
    pub async fn revoke(&self, keys: &[LeaseKey], requester: Option<Requester>) {
        if keys.is_empty() || self.duration().is_zero() {
            return;
        }
        if self.in_grace.load(Ordering::Acquire) {
            let grace = *self.grace_until.lock().expect("lease grace");
            match grace {
                Some(until) if Instant::now() < until => tokio::time::sleep_until(until).await,
                _ => self.in_grace.store(false, Ordering::Release),
            }
        }
        let mut waits = Vec::new();
        {
            let now = Instant::now();
            let mut st = self.state.lock().expect("leases");
            st.change_seq += 1;
            let seq = st.change_seq;
            // Without a polling client no grant can be on its way (see the module doc).
            let note = !st.sessions.is_empty();
            for key in keys {
                let h = self.hasher.hash_one(key);
                if note {
                    st.changed.insert(h, (seq, now, requester.map_or(0, |r| r.token)));
                }
                let Some(mut hs) = st.holders.remove(&h) else { continue };
                hs.retain_mut(|x| {
                    if x.end <= now {
                        return false;
                    }
                    if requester.is_some_and(|r| r.client == x.client) {
                        return true;
                    }
                    let (seq, ack) = match (x.revoked, st.sessions.get_mut(&x.client)) {
                        // Already being revoked: wait for the same answer,
                        // unless it came (then the copy is gone).
                        (Some(seq), Some(s)) if seq != NO_SESSION => {
                            if *s.acked.borrow() >= seq {
                                return false;
                            }
                            (seq, Some((s.acked.subscribe(), seq)))
                        }
                        (None, Some(s)) => {
                            s.queued += 1;
                            s.pending.push_back((s.queued, x.item));
                            s.wake.notify_one();
                            (s.queued, Some((s.acked.subscribe(), s.queued)))
                        }
                        // No session (or none when first revoked): its end.
                        _ => (NO_SESSION, None),
                    };
                    x.revoked = Some(seq);
                    waits.push((ack, x.end));
                    true
                });
                if !hs.is_empty() {
                    st.holders.insert(h, hs);
                }
            }
        }
        for (ack, end) in waits {
            let deadline = end + EXPIRY_SLACK;
            match ack {
                Some((mut rx, seq)) => {
                    let _ = tokio::time::timeout_at(deadline, rx.wait_for(|&a| a >= seq)).await;
                }
                None => tokio::time::sleep_until(deadline).await,
            }
        }
    }

    /// One `LeaseWait` of `client`: records its acknowledgement, then answers
    /// with the revocations queued for it, waiting up to `wait` for some.
    /// `dirs`: the client polls with `LeaseWaitDirs` (see [`Leases::grant_names`]).
    pub async fn wait(&self, client: u64, acked: u64, wait: Duration, dirs: bool) -> Reply {
        let wait = wait.min(MAX_WAIT);
        let wake = {
            let mut st = self.state.lock().expect("leases");
            let now = Instant::now();
            let s = st.sessions.entry(client).or_insert_with(|| Session {
                pending: Default::default(),
                queued: 0,
                acked: watch::channel(0).0,
                wake: Arc::new(Notify::new()),
                last_poll: now,
                since: now,
                poll_wait: wait,
                dirs,
            });
            s.last_poll = now;
            s.poll_wait = wait;
            s.dirs = dirs;
            let queued = s.queued;
            s.acked.send_if_modified(|a| {
                let newer = acked > *a && acked <= queued;
                if newer {
                    *a = acked;
                }
                newer
            });
            let done = *s.acked.borrow();
            while s.pending.front().is_some_and(|&(seq, _)| seq <= done) {
                s.pending.pop_front();
            }
            if !s.pending.is_empty() {
                return s.take_pending();
            }
            s.wake.clone()
        };
        let _ = tokio::time::timeout(wait, wake.notified()).await;
        let mut st = self.state.lock().expect("leases");
        match st.sessions.get_mut(&client) {
            Some(s) => {
                // Waiting counts as hearing from it.
                s.last_poll = Instant::now();
                s.take_pending()
            }
            None => Reply::Revoked { ids: Vec::new(), names: false, upto: acked },
        }
    }

    /// Tells `client`, if it polls, that another client wants `id`: sent
    /// with its next revocations as one of `id`'s attributes (a client that
    /// keeps the append lock of `id` lets it go). Nothing waits for it.
    pub fn notify(&self, client: u64, id: EntryId) {
        let mut st = self.state.lock().expect("leases");
        if let Some(s) = st.sessions.get_mut(&client) {
            s.queued += 1;
            let seq = s.queued;
            s.pending.push_back((seq, Some(id)));
            s.wake.notify_one();
        }
    }

    /// Whether `client` polls this node (it has polled within its wait and
    /// a few seconds more).
    pub fn session_alive(&self, client: u64) -> bool {
        let st = self.state.lock().expect("leases");
        st.sessions.get(&client).is_some_and(|s| s.alive(Instant::now()))
    }

    /// Drops ended leases, old change notes and silent clients (at most
    /// once per [`SWEEP_EVERY`]), so memory follows what is live.
    pub(crate) fn sweep(&self) {
        let now = Instant::now();
        let mut st = self.state.lock().expect("leases");
        if st.last_sweep.is_some_and(|t| now.saturating_duration_since(t) < SWEEP_EVERY) {
            return;
        }
        st.last_sweep = Some(now);
        let State { holders, sessions, .. } = &mut *st;
        holders.retain(|_, hs| {
            hs.retain(|x| {
                let acked =
                    || x.revoked.is_some_and(|seq| sessions.get(&x.client).is_some_and(|s| *s.acked.borrow() >= seq));
                x.end > now && !acked()
            });
            !hs.is_empty()
        });
        st.changed.retain(|_, &mut (_, at, _)| now.saturating_duration_since(at) < CHANGE_MEMORY);
        st.sessions.retain(|_, s| s.alive(now));
        // Write-back ends with the lease on the directory's names.
        if self.any_write_back() {
            let mut wb = self.write_back.lock().expect("write-back dirs");
            wb.retain(|&dir, &mut client| {
                let h = self.hasher.hash_one(LeaseKey::Names(dir));
                st.holders.get(&h).is_some_and(|hs| hs.iter().any(|x| x.client == client && x.item == Some(dir)))
            });
            self.write_backs.store(wb.len() as u64, Ordering::Release);
        }
        if st.holders.capacity() > 4 * st.holders.len() + 1024 {
            st.holders.shrink_to_fit();
        }
        if st.changed.capacity() > 4 * st.changed.len() + 1024 {
            st.changed.shrink_to_fit();
        }
    }

    /// Clients with a live poll, and keys with a lease.
    #[cfg(test)]
    fn counts(&self) -> (usize, usize) {
        let st = self.state.lock().expect("leases");
        let now = Instant::now();
        (
            st.sessions.values().filter(|s| s.alive(now)).count(),
            st.holders.values().filter(|hs| hs.iter().any(|x| x.end > now)).count(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eid(n: u64) -> EntryId {
        EntryId { node: 1, epoch: 1, counter: n }
    }

    fn id(n: u64) -> LeaseKey {
        LeaseKey::Attr(eid(n))
    }

    /// Answers `client`'s revocations up to `upto` with its next poll, in the background.
    fn ack(l: &Arc<Leases>, client: u64, upto: u64) {
        let l = l.clone();
        tokio::spawn(async move { l.wait(client, upto, Duration::from_secs(5), false).await });
    }

    fn leases(d: Duration) -> Arc<Leases> {
        let l = Arc::new(Leases::default());
        l.set_duration(d);
        l.in_grace.store(false, Ordering::Release);
        l
    }

    #[tokio::test]
    async fn no_lease_without_a_poll_nor_when_disabled() {
        let l = leases(Duration::from_secs(1));
        assert_eq!(l.grant(7, id(1), l.mark()), 0, "client 7 never polled");
        let off = leases(Duration::ZERO);
        off.wait(7, 0, Duration::ZERO, false).await;
        assert_eq!(off.grant(7, id(1), off.mark()), 0);
    }

    #[tokio::test]
    async fn a_change_waits_for_the_holder_and_tells_it() {
        let l = leases(Duration::from_secs(5));
        assert_eq!(l.wait(7, 0, Duration::ZERO, false).await, Reply::Revoked { ids: vec![], names: false, upto: 0 });
        assert_eq!(l.grant(7, id(1), l.mark()), 5000);
        let l2 = l.clone();
        let change = tokio::spawn(async move {
            let t = Instant::now();
            l2.revoke(&[id(1)], Some(Requester { client: 8, token: 1 })).await;
            t.elapsed()
        });
        let Reply::Revoked { ids, names, upto } = l.wait(7, 0, Duration::from_secs(5), false).await else { panic!() };
        assert_eq!((ids, names), (vec![eid(1)], false));
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!change.is_finished(), "the change must wait for the acknowledgement");
        // The acknowledgement comes with the next poll.
        ack(&l, 7, upto);
        let took = change.await.unwrap();
        assert!(took < Duration::from_secs(4), "acknowledged, not expired: {took:?}");
        // The lease is gone: the next change does not wait.
        tokio::time::timeout(Duration::from_secs(1), l.revoke(&[id(1)], None)).await.unwrap();
    }

    #[tokio::test]
    async fn revocations_go_out_in_bounded_batches_acknowledged_in_order() {
        let l = leases(Duration::from_secs(5));
        l.wait(7, 0, Duration::ZERO, false).await;
        let n = REVOKED_MAX as u64 + 10;
        for i in 0..n {
            assert!(l.grant(7, id(i), l.mark()) > 0);
        }
        let ids: Vec<LeaseKey> = (0..n).map(id).collect();
        let l2 = l.clone();
        let change = tokio::spawn(async move { l2.revoke(&ids, None).await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        let Reply::Revoked { ids, upto, .. } = l.wait(7, 0, Duration::from_secs(1), false).await else { panic!() };
        assert_eq!((ids.len(), upto), (REVOKED_MAX, REVOKED_MAX as u64));
        let Reply::Revoked { ids, upto, .. } = l.wait(7, upto, Duration::from_secs(1), false).await else { panic!() };
        assert_eq!((ids.len(), upto), (10, n));
        // That answer was lost: a poll without its acknowledgement gets it again.
        let again = l.wait(7, REVOKED_MAX as u64, Duration::from_secs(1), false).await;
        assert_eq!(again, Reply::Revoked { ids, names: false, upto });
        assert!(!change.is_finished(), "the last batch is not acknowledged yet");
        ack(&l, 7, n);
        tokio::time::timeout(Duration::from_secs(3), change).await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn a_changed_name_tells_its_holders_to_drop_names() {
        let l = leases(Duration::from_secs(5));
        l.wait(7, 0, Duration::ZERO, false).await;
        let name = LeaseKey::Name(eid(1), b"f".as_slice().into());
        assert!(l.grant(7, name.clone(), l.mark()) > 0);
        let l2 = l.clone();
        let change = tokio::spawn(async move { l2.revoke(&[name, id(9)], None).await });
        let Reply::Revoked { ids, names, upto } = l.wait(7, 0, Duration::from_secs(5), false).await else { panic!() };
        assert_eq!((ids, names), (vec![], true));
        ack(&l, 7, upto);
        tokio::time::timeout(Duration::from_secs(3), change).await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn directory_names_are_leased_to_clients_that_ask_renewed_and_revoked_by_others() {
        let l = leases(Duration::from_secs(5));
        l.wait(7, 0, Duration::ZERO, false).await;
        assert_eq!(l.grant_names(7, eid(1), l.mark(), true), 0, "client 7 polls without LeaseWaitDirs");
        l.wait(7, 0, Duration::ZERO, true).await;
        assert_eq!(l.grant_names(7, eid(1), l.mark(), false), 0, "a renewal of a lease not held");
        assert!(l.grant_names(7, eid(1), l.mark(), true) > 0, "the directory it made");
        assert!(l.grant_names(7, eid(1), l.mark(), false) > 0, "a renewal");
        // The holder's own new name keeps its lease; another's revokes it.
        let own = l.mark();
        let me = Requester { client: 7, token: own.token };
        l.revoke(&[LeaseKey::Names(eid(1))], Some(me)).await;
        assert!(l.grant_names(7, eid(1), own, false) > 0, "renewed after its own change");
        let l2 = l.clone();
        let change = tokio::spawn(async move { l2.revoke(&[LeaseKey::Names(eid(1))], None).await });
        let Reply::Revoked { ids, names, upto } = l.wait(7, 0, Duration::from_secs(5), true).await else { panic!() };
        assert_eq!((ids, names), (vec![eid(1)], false), "the directory is named");
        // Revoked and not yet answered: no renewal.
        assert_eq!(l.grant_names(7, eid(1), l.mark(), false), 0);
        ack(&l, 7, upto);
        tokio::time::timeout(Duration::from_secs(3), change).await.unwrap().unwrap();
        assert_eq!(l.grant_names(7, eid(1), l.mark(), false), 0, "a revoked lease is not renewed");
    }

    #[tokio::test]
    async fn the_requesters_own_lease_is_kept_and_not_waited_for() {
        let l = leases(Duration::from_secs(5));
        l.wait(7, 0, Duration::ZERO, false).await;
        assert!(l.grant(7, id(1), l.mark()) > 0);
        let me = Requester { client: 7, token: l.mark().token };
        tokio::time::timeout(Duration::from_secs(1), l.revoke(&[id(1)], Some(me))).await.unwrap();
        assert_eq!(l.counts(), (1, 1));
    }

    #[tokio::test]
    async fn a_silent_holder_is_waited_for_until_its_lease_ends() {
        let l = leases(Duration::from_millis(300));
        l.wait(7, 0, Duration::ZERO, false).await;
        assert!(l.grant(7, id(1), l.mark()) > 0);
        let t = Instant::now();
        l.revoke(&[id(1)], None).await;
        let took = t.elapsed();
        assert!(took >= Duration::from_millis(250), "{took:?}");
    }

    #[tokio::test]
    async fn a_change_during_another_ones_revocation_waits_for_the_same_holder() {
        let l = leases(Duration::from_millis(400));
        l.wait(7, 0, Duration::ZERO, false).await;
        assert!(l.grant(7, id(1), l.mark()) > 0);
        // The first change queues the revocation and waits; client 7 is silent.
        let (k1, k2) = ([id(1)], [id(2)]);
        let mut first = std::pin::pin!(l.revoke(&k1, None));
        assert!(tokio::time::timeout(Duration::from_millis(20), &mut first).await.is_err());
        let t = Instant::now();
        l.revoke(&[id(1)], None).await;
        assert!(t.elapsed() >= Duration::from_millis(300), "the second change did not wait: {:?}", t.elapsed());
        first.await;

        // Once the holder answers, both changes end, and the next finds no holder.
        assert!(l.grant(7, id(2), l.mark()) > 0);
        let mut first = std::pin::pin!(l.revoke(&k2, None));
        assert!(tokio::time::timeout(Duration::from_millis(20), &mut first).await.is_err());
        ack(&l, 7, 2);
        let t = Instant::now();
        l.revoke(&[id(2)], None).await;
        first.await;
        l.revoke(&k2, None).await;
        assert!(t.elapsed() < Duration::from_millis(300), "the answer was not taken: {:?}", t.elapsed());
        let h = l.hasher.hash_one(id(2));
        assert!(!l.state.lock().unwrap().holders.contains_key(&h), "an answered revocation stays");
    }

    #[tokio::test]
    async fn a_grant_of_attributes_read_before_a_change_is_refused() {
        let l = leases(Duration::from_secs(1));
        l.wait(7, 0, Duration::ZERO, false).await;
        let before = l.mark();
        l.revoke(&[id(1)], None).await;
        assert_eq!(l.grant(7, id(1), before), 0);
        assert!(l.grant(7, id(2), before) > 0, "other inodes are not affected");
        assert!(l.grant(7, id(1), l.mark()) > 0);
        // A request's own change does not refuse its grant; a later one by another does.
        let own = l.mark();
        l.revoke(&[id(3)], Some(Requester { client: 7, token: own.token })).await;
        assert!(l.grant(7, id(3), own) > 0, "the change is the request's own");
        let own = l.mark();
        l.revoke(&[id(4)], Some(Requester { client: 7, token: own.token })).await;
        l.revoke(&[id(4)], Some(Requester { client: 7, token: l.mark().token })).await;
        assert_eq!(l.grant(7, id(4), own), 0, "another request of the same client changed it since");
    }

    #[tokio::test]
    async fn the_recorded_end_bounds_grants_and_the_next_starts_wait() {
        let dir = tempfile::tempdir().unwrap();
        let l = Leases::default();
        l.start_recorded(dir.path(), Duration::from_millis(300));
        l.wait(7, 0, Duration::ZERO, false).await;
        assert_eq!(l.grant(7, id(1), l.mark()), 300);
        // A grant beyond the recorded end is refused until the end moves.
        l.until_ms.store(unix_ms() + 100, Ordering::Release);
        assert_eq!(l.grant(7, id(1), l.mark()), 300, "a lapsed record is moved at once");
        assert!(l.until_ms.load(Ordering::Acquire) >= unix_ms() + 300);
        // A start right after (a killed node) waits for the recorded end...
        let next = Leases::default();
        next.start_recorded(dir.path(), Duration::from_millis(300));
        let t = Instant::now();
        next.revoke(&[id(2)], None).await;
        assert!(t.elapsed() >= Duration::from_millis(300), "{:?}", t.elapsed());
        // ...and one long after does not.
        std::fs::write(dir.path().join(UNTIL_FILE), "1000\n").unwrap();
        let later = Leases::default();
        later.start_recorded(dir.path(), Duration::from_millis(300));
        tokio::time::timeout(Duration::from_millis(100), later.revoke(&[id(2)], None)).await.unwrap();
    }

    #[tokio::test]
    async fn ended_leases_are_swept_and_the_table_is_bounded() {
        let l = leases(Duration::from_millis(50));
        l.wait(7, 0, Duration::ZERO, false).await;
        for n in 0..1000 {
            assert!(l.grant(7, id(n), l.mark()) > 0);
        }
        assert_eq!(l.counts().1, 1000);
        tokio::time::sleep(Duration::from_millis(60)).await;
        l.sweep();
        assert!(l.state.lock().unwrap().holders.is_empty(), "ended leases stay in memory");
        l.state.lock().unwrap().holders.extend((0..MAX_LEASED as u64).map(|n| (n, Vec::new())));
        assert_eq!(l.grant(7, id(1), l.mark()), 0, "a full table grants nothing new");
    }

    #[tokio::test]
    async fn changes_after_a_start_wait_one_lease() {
        let l = Arc::new(Leases::default());
        l.set_duration(Duration::from_millis(200));
        let t = Instant::now();
        l.revoke(&[id(1)], None).await;
        assert!(t.elapsed() >= Duration::from_millis(200));
    }
}
