//! Write-back of small writes (cache mode `buffered`): a file's writes are
//! kept in memory, adjacent and overlapping ones merged, and sent to the
//! storage targets in the background, several flushes in flight at once.
//!
//! A write returns once its data is copied here. The buffer goes out when
//! it holds [`WriteBackLimits::bytes`] or [`WriteBackLimits::extents`], when
//! its oldest write is [`WriteBackLimits::delay`] old, and whenever the
//! owner calls [`WriteBack::flush`] (fsync, close, locks, reads, truncation:
//! the mount decides). A failed flush is kept and returned by the next write
//! and by the next [`WriteBack::flush`], so it reaches the application at
//! the latest at fsync or close, as POSIX allows.
//!
//! Ordering: a flush whose ranges overlap a flush still in flight waits for
//! it, so two writes to the same bytes reach the targets in the order they
//! were made. It owns no consistency with other clients beyond that: they
//! see the data once it is flushed.

use crate::Client;
use bytes::{Bytes, BytesMut};
use hivefs_types::error::{ErrorCode, FsError, FsResult};
use hivefs_types::ids::EntryId;
use hivefs_types::pattern::Pattern;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;
use tracing::debug;

/// How much a file's write-back holds and for how long.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WriteBackLimits {
    /// Bytes buffered before a flush starts.
    pub bytes: usize,
    /// Separate ranges buffered before a flush starts (each is one write
    /// per chunk it covers).
    pub extents: usize,
    /// Flushes of one file in flight at once; a write finding the buffer
    /// full and this many in flight waits for one to end.
    pub in_flight: usize,
    /// The longest a write stays buffered without a reason to flush.
    pub delay: Duration,
    /// Bytes all files' buffers of one client hold together, in flight
    /// included ([`WriteBackBudget`]).
    pub total: usize,
}

impl Default for WriteBackLimits {
    fn default() -> Self {
        WriteBackLimits {
            bytes: 1 << 20,
            extents: 64,
            in_flight: 4,
            delay: Duration::from_millis(100),
            total: 64 << 20,
        }
    }
}

/// What all write-back buffers of one client hold together (buffered and in
/// flight), and its bound: a write that would go beyond it waits until its
/// file's flush lands, unless its file holds nothing (each file may always
/// buffer one write, so a writer never waits on other files' buffers alone;
/// those go out within their delay).
pub struct WriteBackBudget {
    max: usize,
    used: std::sync::atomic::AtomicUsize,
}

impl WriteBackBudget {
    /// A budget of `max` bytes.
    pub fn new(max: usize) -> Arc<WriteBackBudget> {
        Arc::new(WriteBackBudget { max, used: Default::default() })
    }

    /// Bytes held now.
    pub fn used(&self) -> usize {
        self.used.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn add(&self, n: usize) {
        self.used.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
    }

    fn sub(&self, n: usize) {
        self.used.fetch_sub(n, std::sync::atomic::Ordering::Relaxed);
    }
}

#[derive(Default)]
struct State {
    /// Buffered ranges by offset: disjoint and not adjacent (adjacent ones
    /// are merged).
    extents: BTreeMap<u64, BytesMut>,
    bytes: usize,
    /// Ranges of the flushes in flight, one list per flush, by flush number,
    /// and the bytes of each.
    flying: BTreeMap<u64, (Vec<(u64, u64)>, usize)>,
    next_flush: u64,
    /// The first error of a flush no caller has been told of yet.
    error: Option<FsError>,
    /// Bumped by every flush start: a timer armed for an earlier buffer
    /// does not flush a later one early.
    generation: u64,
    timer_armed: bool,
}

impl State {
    fn overlaps_flying(&self, ranges: &[(u64, u64)]) -> bool {
        self.flying.values().flat_map(|(r, _)| r).any(|&(s, e)| ranges.iter().any(|&(a, b)| a < e && s < b))
    }
}

/// One file's write-back buffer on one client.
pub struct WriteBack {
    client: Arc<Client>,
    pattern: Pattern,
    entry: EntryId,
    limits: WriteBackLimits,
    budget: Arc<WriteBackBudget>,
    rt: tokio::runtime::Handle,
    st: Mutex<State>,
    /// Woken whenever a flush ends.
    landed: Notify,
}

impl WriteBack {
    pub fn new(
        client: Arc<Client>,
        pattern: Pattern,
        entry: EntryId,
        limits: WriteBackLimits,
        budget: Arc<WriteBackBudget>,
        rt: tokio::runtime::Handle,
    ) -> Arc<WriteBack> {
        Arc::new(WriteBack {
            client,
            pattern,
            entry,
            limits,
            budget,
            rt,
            st: Mutex::new(State::default()),
            landed: Notify::new(),
        })
    }

    /// Nothing buffered and nothing in flight.
    pub fn is_clean(&self) -> bool {
        let st = self.st.lock().expect("write-back");
        st.extents.is_empty() && st.flying.is_empty()
    }

    /// Buffers `data` at `offset` without waiting: `None` when that would
    /// need to wait for a flush in flight (then [`WriteBack::write`]), else
    /// the write's result (an error of an earlier flush, which the next
    /// [`WriteBack::flush`] returns again).
    pub fn try_write(self: &Arc<Self>, offset: u64, data: &[u8]) -> Option<FsResult<()>> {
        let mut st = self.st.lock().expect("write-back");
        if let Some(e) = &st.error {
            // Kept for fsync and close too.
            return Some(Err(e.clone()));
        }
        let full = st.bytes + data.len() > self.limits.bytes || st.extents.len() >= self.limits.extents;
        if full && !st.extents.is_empty() && !self.start_flush(&mut st) {
            return None;
        }
        let holds = !st.extents.is_empty() || !st.flying.is_empty();
        if holds && self.budget.used() + data.len() > self.budget.max {
            // The client's buffers are full: this file's go out, and the write waits.
            if !st.extents.is_empty() {
                self.start_flush(&mut st);
            }
            return None;
        }
        let large = data.len() >= self.limits.bytes;
        if large && st.flying.len() >= self.limits.in_flight {
            return None;
        }
        let before = st.bytes;
        Self::insert(&mut st, offset, data);
        self.budget.add(st.bytes - before);
        // Too large to be worth keeping: sent at once, in the background
        // like the rest so that it stays ordered with them.
        if large && self.start_flush(&mut st) {
            return Some(Ok(()));
        }
        if !st.timer_armed {
            st.timer_armed = true;
            let (me, gen, delay) = (self.clone(), st.generation, self.limits.delay);
            self.rt.spawn(async move {
                tokio::time::sleep(delay).await;
                let mut st = me.st.lock().expect("write-back");
                if st.generation == gen && !st.extents.is_empty() {
                    st.timer_armed = false;
                    // With every flight busy, the next write or flush sends it.
                    me.start_flush(&mut st);
                }
            });
        }
        Some(Ok(()))
    }

    /// Buffers `data` at `offset`, waiting for a flush in flight when the
    /// buffer is full.
    pub async fn write(self: &Arc<Self>, offset: u64, data: &[u8]) -> FsResult<()> {
        loop {
            let landed = self.landed.notified();
            if let Some(r) = self.try_write(offset, data) {
                return r;
            }
            landed.await;
        }
    }

    /// Sends everything buffered and waits until every flush landed; the
    /// first error since the last report, if any.
    pub async fn flush(self: &Arc<Self>) -> FsResult<()> {
        loop {
            let landed = self.landed.notified();
            {
                let mut st = self.st.lock().expect("write-back");
                if !st.extents.is_empty() {
                    self.start_flush(&mut st);
                }
                if st.extents.is_empty() && st.flying.is_empty() {
                    return st.error.take().map_or(Ok(()), Err);
                }
            }
            landed.await;
        }
    }

    /// Merges `data` at `offset` into the buffer: the new range and every
    /// range it overlaps or touches become one (the new bytes on top).
    fn insert(st: &mut State, offset: u64, data: &[u8]) {
        let end = offset + data.len() as u64;
        let touching: Vec<u64> = st
            .extents
            .range(..=end)
            .rev()
            .take_while(|(s, b)| **s + b.len() as u64 >= offset)
            .map(|(s, _)| *s)
            .collect();
        if touching.is_empty() {
            st.bytes += data.len();
            st.extents.insert(offset, BytesMut::from(data));
            return;
        }
        if let [s] = touching[..] {
            if s <= offset {
                // The common case (sequential writes): the one range touched
                // starts at or before the new bytes, which go into it in place.
                let b = st.extents.get_mut(&s).expect("touching");
                let (at, len) = ((offset - s) as usize, b.len());
                let inside = data.len().min(len.saturating_sub(at));
                b[at..at + inside].copy_from_slice(&data[..inside]);
                b.extend_from_slice(&data[inside..]);
                st.bytes += b.len() - len;
                return;
            }
        }
        // `touching` runs from the highest offset down: the last is the lowest.
        let start = offset.min(*touching.last().expect("touching"));
        let last_end = touching.iter().map(|s| s + st.extents[s].len() as u64).max().expect("touching").max(end);
        let mut merged = BytesMut::zeroed((last_end - start) as usize);
        for s in touching {
            let b = st.extents.remove(&s).expect("touching");
            st.bytes -= b.len();
            let at = (s - start) as usize;
            merged[at..at + b.len()].copy_from_slice(&b);
        }
        let at = (offset - start) as usize;
        merged[at..at + data.len()].copy_from_slice(data);
        st.bytes += merged.len();
        st.extents.insert(start, merged);
    }

    /// Starts a flush of the whole buffer in the background; `false` when
    /// every flight is busy or the buffer overlaps one in flight (nothing
    /// started, the buffer kept).
    fn start_flush(self: &Arc<Self>, st: &mut State) -> bool {
        let ranges: Vec<(u64, u64)> = st.extents.iter().map(|(s, b)| (*s, s + b.len() as u64)).collect();
        if st.flying.len() >= self.limits.in_flight || st.overlaps_flying(&ranges) {
            return false;
        }
        let extents: Vec<(u64, Bytes)> =
            std::mem::take(&mut st.extents).into_iter().map(|(s, b)| (s, b.freeze())).collect();
        let bytes = std::mem::take(&mut st.bytes);
        st.generation += 1;
        st.timer_armed = false;
        let n = st.next_flush;
        st.next_flush += 1;
        st.flying.insert(n, (ranges, bytes));
        let me = self.clone();
        tracing::trace!("write-back of file {}: flush {n}, {} ranges", self.entry, extents.len());
        self.rt.spawn(async move {
            let mut set = tokio::task::JoinSet::new();
            for (off, data) in extents {
                let me = me.clone();
                set.spawn(async move { me.client.write_bytes(&me.pattern, me.entry, off, data).await });
            }
            let mut err = None;
            while let Some(r) = set.join_next().await {
                let r = r.map_err(|e| FsError::new(ErrorCode::Internal, e.to_string())).and_then(|r| r);
                if let Err(e) = r {
                    err.get_or_insert(e);
                }
            }
            let mut st = me.st.lock().expect("write-back");
            if let Some((_, bytes)) = st.flying.remove(&n) {
                me.budget.sub(bytes);
            }
            if let Some(e) = err {
                debug!("write-back of file {} failed: {e}", me.entry);
                st.error.get_or_insert(e);
            }
            // A timer that found every flight busy left the buffer waiting.
            if !st.extents.is_empty() && !st.timer_armed {
                me.start_flush(&mut st);
            }
            drop(st);
            me.landed.notify_waiters();
        });
        true
    }
}

impl Drop for WriteBack {
    fn drop(&mut self) {
        // Left unsent (its file was given up after a failed flush): no longer held.
        // Flights hold the write-back, so none is in flight now.
        let st = self.st.get_mut().expect("write-back");
        self.budget.sub(st.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ranges(st: &State) -> Vec<(u64, Vec<u8>)> {
        st.extents.iter().map(|(s, b)| (*s, b.to_vec())).collect()
    }

    #[test]
    fn adjacent_and_overlapping_writes_merge_with_the_newest_bytes_on_top() {
        let mut st = State::default();
        WriteBack::insert(&mut st, 10, b"bbbb");
        WriteBack::insert(&mut st, 20, b"dd");
        WriteBack::insert(&mut st, 0, b"aaaa");
        assert_eq!(ranges(&st), vec![(0, b"aaaa".to_vec()), (10, b"bbbb".to_vec()), (20, b"dd".to_vec())]);
        // Adjacent to the end of one range and the start of the next: one range.
        WriteBack::insert(&mut st, 14, b"cccccc");
        assert_eq!(ranges(&st), vec![(0, b"aaaa".to_vec()), (10, b"bbbbccccccdd".to_vec())]);
        // Overlapping the middle: newest bytes win, length unchanged.
        WriteBack::insert(&mut st, 12, b"XX");
        assert_eq!(ranges(&st), vec![(0, b"aaaa".to_vec()), (10, b"bbXXccccccdd".to_vec())]);
        // Covering everything and beyond.
        WriteBack::insert(&mut st, 2, &[b'Z'; 30]);
        let mut want = b"aa".to_vec();
        want.extend([b'Z'; 30]);
        assert_eq!(ranges(&st), vec![(0, want)]);
        assert_eq!(st.bytes, 32);
    }

    #[test]
    fn sequential_writes_grow_one_range_in_place() {
        let mut st = State::default();
        let mut want = Vec::new();
        for i in 0..100u8 {
            let piece = vec![i; 1000 + usize::from(i)];
            WriteBack::insert(&mut st, want.len() as u64, &piece);
            want.extend_from_slice(&piece);
        }
        // Overlapping its end and running past it.
        WriteBack::insert(&mut st, want.len() as u64 - 10, &[0xff; 20]);
        want.truncate(want.len() - 10);
        want.extend_from_slice(&[0xff; 20]);
        assert_eq!(ranges(&st), vec![(0, want.clone())]);
        assert_eq!(st.bytes, want.len());
    }

    #[test]
    fn flights_that_overlap_are_found() {
        let mut st = State::default();
        st.flying.insert(0, (vec![(100, 200)], 100));
        assert!(st.overlaps_flying(&[(150, 160)]));
        assert!(st.overlaps_flying(&[(0, 101)]));
        assert!(!st.overlaps_flying(&[(0, 100), (200, 300)]));
    }
}
