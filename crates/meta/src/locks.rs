//! Global file locks of the entries this metadata node owns.
//!
//! `flock`, `fcntl` byte-range and append locks of every client are checked
//! here, so that they hold across mounts. The table lives in memory only: as
//! in BeeGFS, locks do not survive a restart of the metadata service (a
//! client learns of it from its next keep-alive, answered `known: false`).
//!
//! Owners are `(client, owner)`: the client's random instance id and the
//! kernel's lock owner inside it. Each kind ([`LockKind`]) is its own lock
//! space. Setting a lock replaces whatever its owner held in the range, so
//! ranges of one owner split and merge as POSIX says, and a shared lock
//! becomes exclusive (or back) in place when no other owner is in the way.
//!
//! Leases: every request of a client and its keep-alives (`LockKeepAlive`,
//! every third of the lease) renew its lease; `namespace::spawn_lock_expiry` drops every
//! lock of a client not heard from for `lock_lease_ms`, and ends its waiters.
//!
//! Waiting (F_SETLKW, blocking flock): the request waits here, in its own
//! task, for at most the `wait_ms` it names (the client keeps it below its
//! request timeout and asks again while it wants the lock), woken whenever
//! the table changes. Waiters are not queued in order; a conflict is checked
//! afresh at each wake-up, as Linux does for local locks. Deadlocks between
//! owners are not detected: each wait ends when its process is killed. A
//! waiting process that gets a signal has its client send `LockCancel`,
//! which ends the waits of that owner on the entry at once
//! ([`LockTable::cancel`]), so the signal interrupts the wait as on a local
//! file system (`flock -w`, `alarm` around `F_SETLKW`).
//!
//! Cached append locks: a client may keep the append lock of a file
//! between appends and append at the end it knows. It trusts the lock for
//! [`APPEND_HOLD`] after it sent the request that last granted or
//! confirmed it, and confirms it by asking again with the same owner. That
//! request is refused, and the client lets the lock go, while another
//! client waits for it ([`LockTable::acquire`] counts those waiters). A new
//! table grants no append lock for [`APPEND_GRACE`] after it is made, so a
//! lock a client still trusts from before a restart or a switch-over of
//! this namespace has run out before anyone else can take it.

use hivefs_proto::{FileLock, LockKind};
use hivefs_types::error::FsResult;
use hivefs_types::fs_err;
use hivefs_types::ids::EntryId;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

/// Default of `lock_lease_ms`.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// Longest one request waits for a lock, whatever it asks.
pub const MAX_WAIT: Duration = Duration::from_secs(60);
/// How long a client trusts an append lock it keeps, counted from the
/// sending of the request that granted or last confirmed it (the client
/// library's constant of the same name).
pub const APPEND_HOLD: Duration = Duration::from_millis(1000);
/// No append lock is granted for this long after a table is made (a start
/// or promotion of the namespace): [`APPEND_HOLD`] and room for clocks that
/// run at slightly different rates.
pub const APPEND_GRACE: Duration = Duration::from_millis(1250);

#[derive(Default)]
struct State {
    /// Locks held, per entry (entries without locks have no key).
    files: HashMap<EntryId, Vec<FileLock>>,
    /// Clients with a lease: when each was last heard from.
    clients: HashMap<u64, Instant>,
    /// Entries whose append lock requests of other clients are waiting, and
    /// how many: their holder's confirmation is refused.
    append_waiters: HashMap<EntryId, u32>,
    /// Waiting requests per entry and owner, with the number of
    /// cancellations so far: a waiter ends when that number passes the one
    /// it started with.
    waiting: HashMap<WaitKey, Waits>,
}

/// An entry and a lock owner (kind, client, owner).
type WaitKey = (EntryId, LockKind, u64, u64);

#[derive(Default)]
struct Waits {
    count: u32,
    cancels: u64,
}

fn wait_key(entry: EntryId, l: &FileLock) -> WaitKey {
    (entry, l.kind, l.client, l.owner)
}

pub struct LockTable {
    state: Mutex<State>,
    /// Fired on every change that may end a conflict or a lease.
    changed: Notify,
    lease_ms: std::sync::atomic::AtomicU64,
    /// Append locks are granted from then on ([`APPEND_GRACE`]).
    appends_from: tokio::time::Instant,
}

/// What a refused append lock request is shown: no holder in particular
/// (the grace after a start, or the caller's own kept lock that others want).
fn append_refusal(l: &FileLock) -> FileLock {
    FileLock { client: 0, owner: 0, pid: 0, ..*l }
}

fn same_owner(a: &FileLock, b: &FileLock) -> bool {
    a.kind == b.kind && a.client == b.client && a.owner == b.owner
}

fn overlaps(a: &FileLock, b: &FileLock) -> bool {
    a.start <= b.end && b.start <= a.end
}

/// The first lock of another owner (same kind) that `l` may not coexist with.
pub fn conflict<'a>(held: &'a [FileLock], l: &FileLock) -> Option<&'a FileLock> {
    held.iter().find(|h| {
        h.kind == l.kind && (h.client, h.owner) != (l.client, l.owner) && overlaps(h, l) && (h.exclusive || l.exclusive)
    })
}

/// Removes the range of `l` from its owner's locks (splitting them), then,
/// unless `unlock`, adds `l` and merges it with touching locks of the same
/// owner and type.
pub fn apply(held: &mut Vec<FileLock>, l: &FileLock, unlock: bool) {
    let mut out = Vec::with_capacity(held.len() + 2);
    for h in held.drain(..) {
        if !same_owner(&h, l) || !overlaps(&h, l) {
            out.push(h);
            continue;
        }
        if h.start < l.start {
            out.push(FileLock { end: l.start - 1, ..h });
        }
        if h.end > l.end {
            out.push(FileLock { start: l.end + 1, ..h });
        }
    }
    if !unlock {
        let mut new = *l;
        out.retain(|h| {
            let touches = same_owner(h, &new)
                && h.exclusive == new.exclusive
                && (h.end.checked_add(1) == Some(new.start) || new.end.checked_add(1) == Some(h.start));
            if touches {
                new.start = new.start.min(h.start);
                new.end = new.end.max(h.end);
            }
            !touches
        });
        out.push(new);
        out.sort_by_key(|h| (h.client, h.owner, h.start));
    }
    *held = out;
}

impl Default for LockTable {
    fn default() -> Self {
        LockTable::new(DEFAULT_LEASE)
    }
}

impl LockTable {
    pub fn new(lease: Duration) -> LockTable {
        LockTable {
            state: Mutex::default(),
            changed: Notify::new(),
            lease_ms: std::sync::atomic::AtomicU64::new(lease.as_millis() as u64),
            appends_from: tokio::time::Instant::now() + APPEND_GRACE,
        }
    }

    pub fn set_lease(&self, lease: Duration) {
        self.lease_ms.store(lease.as_millis().max(1) as u64, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn lease(&self) -> Duration {
        Duration::from_millis(self.lease_ms.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// Renews `client`'s lease; false when it had none.
    pub fn touch(&self, client: u64, now: Instant) -> bool {
        self.state.lock().expect("lock table").clients.insert(client, now).is_some()
    }

    /// Sets `l` unless another owner's lock is in the way (returned).
    pub fn try_lock(&self, entry: EntryId, l: &FileLock) -> Option<FileLock> {
        let mut st = self.state.lock().expect("lock table");
        if l.kind == LockKind::Append {
            if tokio::time::Instant::now() < self.appends_from {
                return Some(append_refusal(l));
            }
            // A confirmation of a kept append lock that others wait for: refused
            // (the holder lets it go), nothing changed.
            let kept = st.files.get(&entry).is_some_and(|h| h.iter().any(|h| same_owner(h, l)));
            if kept && st.append_waiters.get(&entry).is_some_and(|n| *n > 0) {
                return Some(append_refusal(l));
            }
        }
        let held = st.files.entry(entry).or_default();
        if let Some(c) = conflict(held, l) {
            let c = *c;
            if held.is_empty() {
                st.files.remove(&entry);
            }
            return Some(c);
        }
        apply(held, l, false);
        drop(st);
        // A downgrade or a shrunk range may let a waiter in.
        self.changed.notify_waiters();
        None
    }

    /// Unlocks the range of `l` for its owner.
    pub fn unlock(&self, entry: EntryId, l: &FileLock) {
        let mut st = self.state.lock().expect("lock table");
        if let Some(held) = st.files.get_mut(&entry) {
            apply(held, l, true);
            if held.is_empty() {
                st.files.remove(&entry);
            }
        }
        drop(st);
        self.changed.notify_waiters();
    }

    /// F_GETLK: the first lock of another owner conflicting with `l`.
    pub fn test(&self, entry: EntryId, l: &FileLock) -> Option<FileLock> {
        let st = self.state.lock().expect("lock table");
        st.files.get(&entry).and_then(|h| conflict(h, l).copied())
    }

    /// Locks held on `entry`, ordered by owner and start.
    pub fn held(&self, entry: EntryId) -> Vec<FileLock> {
        self.state.lock().expect("lock table").files.get(&entry).cloned().unwrap_or_default()
    }

    /// Drops the leases (and all locks) of clients not heard from since
    /// `now - lease`; returns those clients.
    pub fn expire(&self, now: Instant) -> Vec<u64> {
        let lease = self.lease();
        let mut st = self.state.lock().expect("lock table");
        let gone: Vec<u64> =
            st.clients.iter().filter(|(_, &t)| now.saturating_duration_since(t) > lease).map(|(&c, _)| c).collect();
        if gone.is_empty() {
            return gone;
        }
        for c in &gone {
            st.clients.remove(c);
        }
        st.files.retain(|_, held| {
            held.retain(|h| !gone.contains(&h.client));
            !held.is_empty()
        });
        drop(st);
        self.changed.notify_waiters();
        gone
    }

    /// Sets `l`, waiting up to `wait` for conflicting locks to go away.
    /// `Ok(Some(c))`: still refused by `c`. Fails when the client's lease
    /// ends while it waits.
    pub async fn acquire(&self, entry: EntryId, l: &FileLock, wait: Duration) -> FsResult<Option<FileLock>> {
        self.acquire_telling(entry, l, wait, |_| {}).await
    }

    /// [`LockTable::acquire`] that calls `tell` with each lock of another
    /// client found in the way of append lock `l`, once per lock: that
    /// client may keep it between appends and is asked to let it go. While
    /// a request waits the lock can change hands (the holder lets it go and
    /// takes a new one before this waiter looks again), so each new holder
    /// is told, not only the first: a holder nobody told keeps its lock
    /// until it runs out ([`APPEND_HOLD`]).
    pub async fn acquire_telling(
        &self,
        entry: EntryId,
        l: &FileLock,
        wait: Duration,
        mut tell: impl FnMut(&FileLock),
    ) -> FsResult<Option<FileLock>> {
        let deadline = tokio::time::Instant::now() + wait.min(MAX_WAIT);
        let mut waiting = None;
        let mut waiter: Option<Waiter<'_>> = None;
        let mut told: Option<FileLock> = None;
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if !self.state.lock().expect("lock table").clients.contains_key(&l.client) {
                return Err(fs_err!(
                    Unavailable,
                    "lock on {entry}: the lease of client {:016x} ended (not heard from for {:?})",
                    l.client,
                    self.lease()
                ));
            }
            let c = match self.try_lock(entry, l) {
                None => return Ok(None),
                Some(c) => c,
            };
            let other = l.kind == LockKind::Append && c.client != 0 && c.client != l.client;
            if other && told.is_none_or(|t| !same_owner(&t, &c)) {
                tell(&c);
                told = Some(c);
            }
            match &waiter {
                Some(w) if w.cancelled() => return Ok(Some(c)),
                Some(_) => {}
                None => waiter = Some(Waiter::new(self, wait_key(entry, l))),
            }
            if tokio::time::Instant::now() >= deadline {
                return Ok(Some(c));
            }
            if l.kind == LockKind::Append && waiting.is_none() {
                waiting = Some(AppendWaiter::new(self, entry));
            }
            // The end of the grace after a start wakes nobody by itself.
            let wake = match l.kind {
                LockKind::Append if self.appends_from > tokio::time::Instant::now() => deadline.min(self.appends_from),
                _ => deadline,
            };
            // `biased`: polled in order, not in a random one (a simulation replays).
            tokio::select! {
                biased;
                _ = notified => {}
                _ = tokio::time::sleep_until(wake) => {}
            }
        }
    }

    /// Ends the waits of `l`'s owner (kind, client, owner) on `entry` that
    /// run now: each answers refused at its next look, unless the lock is
    /// granted first. Waits that start later are not touched. Returns how
    /// many waits there were.
    pub fn cancel(&self, entry: EntryId, l: &FileLock) -> u32 {
        let mut st = self.state.lock().expect("lock table");
        let n = match st.waiting.get_mut(&wait_key(entry, l)) {
            Some(w) => {
                w.cancels += 1;
                w.count
            }
            None => 0,
        };
        drop(st);
        if n > 0 {
            self.changed.notify_waiters();
        }
        n
    }
}

/// One waiting request, counted in `State::waiting` while it lives.
struct Waiter<'a> {
    table: &'a LockTable,
    key: WaitKey,
    /// `Waits::cancels` when it started.
    cancels: u64,
}

impl<'a> Waiter<'a> {
    fn new(table: &'a LockTable, key: WaitKey) -> Self {
        let mut st = table.state.lock().expect("lock table");
        let w = st.waiting.entry(key).or_default();
        w.count += 1;
        let cancels = w.cancels;
        Waiter { table, key, cancels }
    }

    fn cancelled(&self) -> bool {
        let st = self.table.state.lock().expect("lock table");
        st.waiting.get(&self.key).is_some_and(|w| w.cancels > self.cancels)
    }
}

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        let mut st = self.table.state.lock().expect("lock table");
        if let Some(w) = st.waiting.get_mut(&self.key) {
            w.count -= 1;
            if w.count == 0 {
                st.waiting.remove(&self.key);
            }
        }
    }
}

/// One waiting append lock request, counted in `State::append_waiters`
/// while it lives.
struct AppendWaiter<'a> {
    table: &'a LockTable,
    entry: EntryId,
}

impl<'a> AppendWaiter<'a> {
    fn new(table: &'a LockTable, entry: EntryId) -> Self {
        *table.state.lock().expect("lock table").append_waiters.entry(entry).or_default() += 1;
        AppendWaiter { table, entry }
    }
}

impl Drop for AppendWaiter<'_> {
    fn drop(&mut self) {
        let mut st = self.table.state.lock().expect("lock table");
        if let Some(n) = st.append_waiters.get_mut(&self.entry) {
            *n -= 1;
            if *n == 0 {
                st.append_waiters.remove(&self.entry);
            }
        }
    }
}

pub(crate) fn check_range(entry: EntryId, l: &FileLock) -> FsResult<()> {
    if l.start > l.end {
        return Err(fs_err!(Invalid, "lock on {entry}: range {}..={} is empty", l.start, l.end));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use hivefs_proto::LockKind;
    use std::sync::Arc;

    const E: EntryId = EntryId::ROOT;

    fn lk(client: u64, start: u64, end: u64, exclusive: bool) -> FileLock {
        FileLock { kind: LockKind::Posix, client, owner: 7, pid: 100 + client as u32, start, end, exclusive }
    }

    fn ranges(v: &[FileLock]) -> Vec<(u64, u64, bool)> {
        v.iter().map(|l| (l.start, l.end, l.exclusive)).collect()
    }

    #[test]
    fn split_and_merge_per_owner() {
        let mut h = Vec::new();
        apply(&mut h, &lk(1, 0, 99, false), false);
        // An exclusive lock in the middle splits the shared one into three.
        apply(&mut h, &lk(1, 10, 19, true), false);
        assert_eq!(ranges(&h), vec![(0, 9, false), (10, 19, true), (20, 99, false)]);
        // Unlocking a part of the exclusive range splits it.
        apply(&mut h, &lk(1, 12, 13, false), true);
        assert_eq!(ranges(&h), vec![(0, 9, false), (10, 11, true), (14, 19, true), (20, 99, false)]);
        // Downgrading 10..=19 merges everything back into one shared range.
        apply(&mut h, &lk(1, 10, 19, false), false);
        assert_eq!(ranges(&h), vec![(0, 99, false)]);
        // Touching ranges of the same type merge; up to the end of file too.
        apply(&mut h, &lk(1, 100, u64::MAX, false), false);
        assert_eq!(ranges(&h), vec![(0, u64::MAX, false)]);
        // Another owner's locks are never changed.
        apply(&mut h, &lk(2, 5, 5, false), false);
        apply(&mut h, &lk(1, 0, u64::MAX, false), true);
        assert_eq!(ranges(&h), vec![(5, 5, false)]);
        assert_eq!(h[0].client, 2);
    }

    #[test]
    fn conflicts_by_type_range_owner_and_kind() {
        let t = LockTable::default();
        assert_eq!(t.try_lock(E, &lk(1, 0, 9, true)), None);
        // Non-overlapping ranges coexist.
        assert_eq!(t.try_lock(E, &lk(2, 10, 19, true)), None);
        // Overlapping exclusive conflicts, and the conflicting lock is reported.
        let c = t.try_lock(E, &lk(2, 5, 12, false)).expect("conflict");
        assert_eq!((c.client, c.start, c.end, c.exclusive, c.pid), (1, 0, 9, true, 101));
        assert_eq!(t.test(E, &lk(3, 9, 9, false)).map(|c| c.client), Some(1));
        assert_eq!(t.test(E, &lk(3, 20, 30, true)), None);
        // The owner itself never conflicts with its own locks (upgrade in place).
        assert_eq!(t.try_lock(E, &lk(1, 0, 9, false)), None);
        assert_eq!(t.try_lock(E, &lk(1, 0, 9, true)), None);
        // Shared locks of different owners coexist.
        assert_eq!(t.try_lock(E, &lk(3, 30, 39, false)), None);
        assert_eq!(t.try_lock(E, &lk(4, 35, 49, false)), None);
        // An upgrade that conflicts leaves the old lock in place.
        assert!(t.try_lock(E, &lk(3, 30, 39, true)).is_some());
        assert!(t.held(E).iter().any(|l| l.client == 3 && !l.exclusive));
        // flock and fcntl locks live in separate spaces.
        let fl = FileLock { kind: LockKind::Flock, ..lk(5, 0, u64::MAX, true) };
        assert_eq!(t.try_lock(E, &fl), None);
        let fl2 = FileLock { kind: LockKind::Flock, ..lk(6, 0, u64::MAX, false) };
        assert_eq!(t.try_lock(E, &fl2).map(|c| c.client), Some(5));
        // Unlocking everything of an owner frees its ranges.
        t.unlock(E, &lk(1, 0, u64::MAX, false));
        assert_eq!(t.try_lock(E, &lk(2, 0, 9, true)), None);
    }

    #[test]
    fn lease_expiry_drops_a_clients_locks() {
        let t = LockTable::new(Duration::from_millis(100));
        let t0 = Instant::now();
        assert!(!t.touch(1, t0));
        assert!(!t.touch(2, t0));
        assert_eq!(t.try_lock(E, &lk(1, 0, 9, true)), None);
        assert_eq!(t.try_lock(E, &lk(2, 20, 29, true)), None);
        // Client 2 keeps its lease alive; client 1 goes silent.
        assert!(t.touch(2, t0 + Duration::from_millis(80)));
        assert!(t.expire(t0 + Duration::from_millis(90)).is_empty());
        assert_eq!(t.expire(t0 + Duration::from_millis(150)), vec![1]);
        assert_eq!(t.held(E).iter().map(|l| l.client).collect::<Vec<_>>(), vec![2]);
        assert_eq!(t.try_lock(E, &lk(3, 0, 9, true)), None);
        // A client that comes back starts a new lease without its old locks.
        assert!(!t.touch(1, t0 + Duration::from_millis(200)));
    }

    /// A table with leases for clients 1 to 3 from `now`.
    fn table_of_three(lease: Duration, now: Instant) -> Arc<LockTable> {
        let t = Arc::new(LockTable::new(lease));
        for c in 1..=3 {
            t.touch(c, now);
        }
        t
    }

    #[tokio::test]
    async fn a_waiter_is_granted_on_unlock_and_dropped_on_expiry() {
        let now = Instant::now();
        let t = table_of_three(Duration::from_secs(60), now);
        assert_eq!(t.try_lock(E, &lk(1, 0, 9, true)), None);
        // Without waiting: refused at once.
        assert!(t.acquire(E, &lk(2, 0, 0, true), Duration::ZERO).await.unwrap().is_some());
        let t2 = t.clone();
        let waiter = tokio::spawn(async move { t2.acquire(E, &lk(2, 0, 0, true), Duration::from_secs(30)).await });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        t.unlock(E, &lk(1, 0, 9, false));
        assert_eq!(waiter.await.unwrap().unwrap(), None);
        assert!(t.held(E).iter().any(|l| l.client == 2 && l.exclusive));
        // A waiter whose client's lease ends is dropped with an error.
        let t3 = t.clone();
        let doomed = tokio::spawn(async move { t3.acquire(E, &lk(3, 0, 0, false), Duration::from_secs(30)).await });
        tokio::task::yield_now().await;
        assert!(!doomed.is_finished());
        assert_eq!(t.expire(now + Duration::from_secs(61)).len(), 3);
        assert!(doomed.await.unwrap().is_err());
        assert!(t.held(E).is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_cancel_ends_the_running_waits_of_its_owner_only() {
        let t = table_of_three(Duration::from_secs(600), Instant::now());
        assert_eq!(t.try_lock(E, &lk(1, 0, 9, true)), None);
        // Nothing waits yet: a cancel changes nothing, and a wait that
        // starts afterwards is not ended by it.
        assert_eq!(t.cancel(E, &lk(2, 0, 0, true)), 0);
        let wait = |c: u64| {
            let t = t.clone();
            tokio::spawn(async move { t.acquire(E, &lk(c, 0, 0, true), Duration::from_secs(50)).await })
        };
        let (w2, w3) = (wait(2), wait(3));
        tokio::task::yield_now().await;
        assert!(!w2.is_finished() && !w3.is_finished());
        // Client 2's wait ends at once, refused by the holder; client 3 waits on.
        assert_eq!(t.cancel(E, &lk(2, 5, 5, false)), 1);
        assert_eq!(w2.await.unwrap().unwrap().map(|c| c.client), Some(1));
        tokio::task::yield_now().await;
        assert!(!w3.is_finished());
        // A later wait of the same owner is not ended by the earlier cancel.
        let again = wait(2);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!again.is_finished());
        t.unlock(E, &lk(1, 0, 9, false));
        let granted = [again.await.unwrap().unwrap(), w3.await.unwrap().unwrap()];
        assert_eq!(granted.iter().filter(|g| g.is_none()).count(), 1, "{granted:?}");
    }

    fn append(client: u64, owner: u64) -> FileLock {
        FileLock { kind: LockKind::Append, client, owner, pid: 0, start: 0, end: u64::MAX, exclusive: true }
    }

    #[tokio::test(start_paused = true)]
    async fn a_kept_append_lock_is_confirmed_until_another_client_waits_and_none_is_granted_in_the_grace() {
        let t = Arc::new(LockTable::new(Duration::from_secs(60)));
        let now = Instant::now();
        for c in 1..=2 {
            t.touch(c, now);
        }
        // A fresh table: no append lock until its grace is over (a request
        // waiting through it is granted at its end).
        assert!(t.acquire(E, &append(1, 1), Duration::ZERO).await.unwrap().is_some());
        let started = tokio::time::Instant::now();
        assert_eq!(t.acquire(E, &append(1, 1), Duration::from_secs(30)).await.unwrap(), None);
        assert!(started.elapsed() < APPEND_GRACE + Duration::from_millis(10), "woken at the grace's end");
        // Confirmations by the holder: granted while nobody else waits.
        assert_eq!(t.acquire(E, &append(1, 1), Duration::ZERO).await.unwrap(), None);
        // Another client waits: the holder's confirmation is refused and
        // changes nothing; its unlock lets the waiter in.
        let t2 = t.clone();
        let waiter = tokio::spawn(async move { t2.acquire(E, &append(2, 7), Duration::from_secs(30)).await });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        let refused = t.acquire(E, &append(1, 1), Duration::ZERO).await.unwrap();
        assert_eq!(refused.map(|c| (c.client, c.owner)), Some((0, 0)));
        assert!(t.held(E).iter().any(|l| l.client == 1), "the refusal keeps the lock");
        t.unlock(E, &append(1, 1));
        assert_eq!(waiter.await.unwrap().unwrap(), None);
        assert!(t.state.lock().unwrap().append_waiters.is_empty(), "the waiter is no longer counted");
        // Nobody waits now: the new holder's confirmation is granted.
        assert_eq!(t.acquire(E, &append(2, 7), Duration::ZERO).await.unwrap(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn every_client_that_takes_the_append_lock_while_another_waits_is_told() {
        let t = Arc::new(LockTable::new(Duration::from_secs(60)));
        let now = Instant::now();
        for c in 1..=2 {
            t.touch(c, now);
        }
        tokio::time::sleep(APPEND_GRACE).await;
        assert_eq!(t.acquire(E, &append(1, 1), Duration::ZERO).await.unwrap(), None);
        let told = Arc::new(Mutex::new(Vec::new()));
        let (t2, told2) = (t.clone(), told.clone());
        let waiter = tokio::spawn(async move {
            let tell = |c: &FileLock| told2.lock().unwrap().push((c.client, c.owner));
            t2.acquire_telling(E, &append(2, 7), Duration::from_secs(30), tell).await
        });
        tokio::task::yield_now().await;
        assert_eq!(*told.lock().unwrap(), [(1, 1)], "the holder is told once");
        // The holder lets go and takes the lock again with a new owner before
        // the waiter looks: the new lock's holder is told too.
        t.unlock(E, &append(1, 1));
        assert_eq!(t.acquire(E, &append(1, 2), Duration::ZERO).await.unwrap(), None);
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        assert_eq!(*told.lock().unwrap(), [(1, 1), (1, 2)]);
        // Woken again with the same holder: not told twice.
        t.unlock(E, &append(2, 99));
        tokio::task::yield_now().await;
        assert_eq!(told.lock().unwrap().len(), 2);
        t.unlock(E, &append(1, 2));
        assert_eq!(waiter.await.unwrap().unwrap(), None);
    }
}
