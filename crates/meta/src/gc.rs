//! Disposal: deleting the chunk files of removed files on the storage targets.
//!
//! Owns the background loop over the `disposal` table. A record is removed
//! only after every target of its pattern acknowledged the unlink; failures
//! are retried with exponential backoff, and the loop resumes from the table
//! after a restart. It must not delete the chunks of an entry that is counted
//! open (an open that raced with the unlink still reads them), and it finishes
//! open-unlinked entries whose last handle went away.

use crate::namespace::Namespace;
use crate::ops::Mutation;
use crate::store::DisposalState;
use hivefs_types::error::FsResult;
use hivefs_types::ids::EntryId;
use hivefs_types::pattern::StripeUnit;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tracing::{debug, warn};

/// Entries whose chunks are deleted in one round: one `UnlinkChunks` per
/// target (all targets concurrently), so at most this many ids per request.
pub const ROUND_MAX: usize = 512;
const _: () = assert!(ROUND_MAX <= hivefs_proto::UNLINK_CHUNKS_MAX);
/// Records read per scan page (bounded memory for a long table).
const SCAN_PAGE: usize = 256;
const BACKOFF_MIN: Duration = Duration::from_millis(200);
const BACKOFF_MAX: Duration = Duration::from_secs(60);
/// Rescan even without a wake-up (catches anything a lost wake-up missed).
const IDLE_RESCAN: Duration = Duration::from_secs(30);
/// How long a wake-up waits for more removals before its round: removals
/// come in bursts, and a round costs one request per target and a commit
/// however many entries it takes (docs/performance.md).
const GATHER: Duration = Duration::from_millis(20);

struct Backoff {
    attempts: u32,
    next: Instant,
    /// Targets that already acknowledged the unlink: a retry skips them.
    done: Vec<StripeUnit>,
}

/// Retry state of the disposal loop (in memory: a restart retries at once).
#[derive(Default)]
pub struct RetryState {
    backoff: HashMap<EntryId, Backoff>,
}

#[cfg(test)]
impl RetryState {
    /// Makes every backed-off entry due now (tests need not wait out the backoff).
    pub(crate) fn make_all_due(&mut self) {
        let now = Instant::now();
        for b in self.backoff.values_mut() {
            b.next = now;
        }
    }
}

/// What one round did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct RoundOutcome {
    /// Entries whose chunk files are now gone everywhere.
    pub deleted: usize,
    /// Entries with at least one failed target (retried later).
    pub failed: usize,
    /// Open-unlinked entries finished because nothing holds them any more.
    pub orphans_finished: usize,
    /// More due work than one round takes.
    pub more: bool,
    /// When the earliest backed-off entry is due again.
    pub next_due: Option<Instant>,
}

impl Namespace {
    /// One pass over the disposal table.
    pub async fn disposal_round(&self, st: &mut RetryState) -> FsResult<RoundOutcome> {
        let now = Instant::now();
        let mut out = RoundOutcome::default();
        let mut due: Vec<(EntryId, Vec<StripeUnit>)> = Vec::new();
        let mut orphans = Vec::new();
        let mut after = None;
        'scan: loop {
            let page = self.read(|t| t.disposal_scan(after, SCAN_PAGE))?;
            let Some(last) = page.last() else { break };
            after = Some(last.0);
            for (id, d) in page {
                if self.opens.is_open(id) {
                    continue;
                }
                match d.state {
                    DisposalState::OpenUnlinked => orphans.push(id),
                    DisposalState::DeleteChunks => {
                        if let Some(b) = st.backoff.get(&id) {
                            if b.next > now {
                                out.next_due = Some(out.next_due.map_or(b.next, |n| n.min(b.next)));
                                continue;
                            }
                        }
                        if due.len() == ROUND_MAX {
                            out.more = true;
                            break 'scan;
                        }
                        due.push((id, d.units()));
                    }
                }
            }
        }
        for id in orphans {
            self.submit(Mutation::ReleaseOrphan { id }).await?;
            out.orphans_finished += 1;
        }
        if out.orphans_finished > 0 {
            // Their chunks are now due: take them in the next round.
            out.more = true;
        }

        // One batch per target; an entry retried after a failure skips the
        // targets that already acknowledged it.
        let mut batches: HashMap<StripeUnit, Vec<EntryId>> = HashMap::new();
        for (id, targets) in &due {
            let done = st.backoff.get(id).map_or(&[][..], |b| &b.done[..]);
            for &t in targets {
                if !done.contains(&t) {
                    batches.entry(t).or_default().push(*id);
                }
            }
        }
        let mut set = tokio::task::JoinSet::new();
        for (t, ids) in batches {
            let fut = self.targets.unlink_chunks(t, ids.clone());
            set.spawn(async move { (t, ids, fut.await) });
        }
        // Per entry: the first failure, and the targets that acknowledged.
        let mut failed: HashMap<EntryId, String> = HashMap::new();
        let mut acked: HashMap<EntryId, Vec<StripeUnit>> = HashMap::new();
        while let Some(r) = set.join_next().await {
            match r {
                Ok((t, ids, Ok(()))) => {
                    for id in ids {
                        acked.entry(id).or_default().push(t);
                    }
                }
                Ok((t, ids, Err(e))) => {
                    warn!("deleting the chunk files of {} removed entries on {t} failed: {e}", ids.len());
                    for id in ids {
                        failed.entry(id).or_insert_with(|| format!("{t}: {e}"));
                    }
                }
                Err(e) => {
                    // Cannot say which entries it held: every entry of the
                    // round counts as failed (retried, skipping acknowledged targets).
                    warn!("chunk unlink task failed: {e}");
                    for (id, _) in &due {
                        failed.entry(*id).or_insert_with(|| format!("chunk unlink task failed: {e}"));
                    }
                }
            }
        }
        let done: Vec<EntryId> = due.iter().map(|d| d.0).filter(|id| !failed.contains_key(id)).collect();
        if !done.is_empty() {
            self.submit(Mutation::DropDisposal { ids: done.clone() }).await?;
            for id in &done {
                st.backoff.remove(id);
            }
            debug!("deleted the chunk files of {} removed entries", done.len());
        }
        out.deleted = done.len();
        out.failed = failed.len();
        for (id, why) in failed {
            let b = st.backoff.entry(id).or_insert(Backoff { attempts: 0, next: now, done: Vec::new() });
            b.attempts = b.attempts.saturating_add(1);
            let delay = BACKOFF_MIN.saturating_mul(1 << b.attempts.min(16)).min(BACKOFF_MAX);
            b.next = now + delay;
            b.done.extend(acked.remove(&id).unwrap_or_default());
            out.next_due = Some(out.next_due.map_or(b.next, |n| n.min(b.next)));
            debug!("deleting chunk files of {id} failed (attempt {}, retry in {delay:?}): {why}", b.attempts);
        }
        Ok(out)
    }
}

/// Runs disposal rounds until aborted: after every wake-up from the writer,
/// when a backed-off entry is due, and every [`IDLE_RESCAN`].
pub fn spawn_disposal(ns: Arc<Namespace>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut st = RetryState::default();
        loop {
            let wait = match ns.disposal_round(&mut st).await {
                Ok(r) if r.more => Duration::ZERO,
                Ok(r) => {
                    r.next_due.map_or(IDLE_RESCAN, |d| d.saturating_duration_since(Instant::now()).min(IDLE_RESCAN))
                }
                Err(e) => {
                    warn!("disposal round failed: {e}");
                    BACKOFF_MAX.min(IDLE_RESCAN)
                }
            };
            if wait.is_zero() {
                tokio::task::yield_now().await;
                continue;
            }
            // `biased`: polled in order, not in a random one (a simulation replays).
            tokio::select! {
                biased;
                _ = ns.disposal_wakeup.notified() => tokio::time::sleep(GATHER).await,
                _ = tokio::time::sleep(wait) => {}
            }
        }
    })
}
