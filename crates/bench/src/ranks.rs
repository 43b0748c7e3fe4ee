//! Ranks as threads, in lock step: every phase starts on all ranks at once
//! (after a barrier) and the next phase waits for the slowest rank. The
//! coordinating thread runs a hook before and after each phase (cache drops,
//! CPU and request-counter snapshots) while no rank is working.
//!
//! Ranks can also be spread over processes: each runs a [`Part`] of them
//! as threads, with its phases started and ended through a [`PhaseSync`]
//! by whoever drives the processes (a [`Driver`]), and reports a
//! [`PartResult`]; the driver [`merge`]s them.

use crate::{BenchError, Result, Span};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Barrier, Mutex};
use std::time::Instant;

/// The ranks one process runs: `count` ranks from global rank `first`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Part {
    pub first: u32,
    pub count: u32,
}

impl Part {
    /// Part `i` of `n` of `ranks` ranks, as even as possible (earlier parts take one more).
    pub fn of(ranks: u32, i: u32, n: u32) -> Part {
        let (base, extra) = (ranks / n, ranks % n);
        Part { first: i * base + i.min(extra), count: base + u32::from(i < extra) }
    }

    /// All `ranks` ranks in one process.
    pub fn all(ranks: u32) -> Part {
        Part { first: 0, count: ranks }
    }

    /// Fails unless this part lies within `ranks` ranks.
    pub fn check(&self, ranks: u32) -> Result<()> {
        if self.count == 0 || self.first.checked_add(self.count).is_none_or(|end| end > ranks) {
            return Err(BenchError::Invalid(format!(
                "ranks {}..{} are not within the run's {ranks} ranks",
                self.first,
                self.first.saturating_add(self.count)
            )));
        }
        Ok(())
    }
}

/// Keeps the phases of processes that each run a [`Part`] in lock step.
pub trait PhaseSync {
    /// Before phase `phase`: returns when every process may start it.
    fn ready(&mut self, phase: usize) -> Result<()>;
    /// After this process's ranks have finished phase `phase`.
    fn done(&mut self, phase: usize) -> Result<()>;
}

/// What one process's ranks did: per phase one span per rank, in seconds
/// since the Unix epoch, and how many results did not check out.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PartResult {
    pub part_first: u32,
    pub pid: u32,
    pub spans: Vec<Vec<Span>>,
    pub verify_errors: u64,
}

impl PartResult {
    /// Spans relative to a clock started at `unix0` (Unix seconds), as [`run`] returns them.
    pub fn new(part: Part, unix0: f64, spans: Vec<Vec<Span>>, verify_errors: u64) -> PartResult {
        let spans = spans
            .into_iter()
            .map(|ph| {
                ph.into_iter().map(|s| Span { start_s: unix0 + s.start_s, end_s: unix0 + s.end_s, ..s }).collect()
            })
            .collect();
        PartResult { part_first: part.first, pid: std::process::id(), spans, verify_errors }
    }
}

/// The parts of a run put together: spans per phase of all ranks in rank
/// order, the process of each rank, how many processes ran them and the sum
/// of the verify errors.
#[derive(Clone, Debug, PartialEq)]
pub struct Merged {
    pub spans: Vec<Vec<Span>>,
    pub pids: Vec<u32>,
    pub processes: u32,
    pub verify_errors: u64,
}

/// Puts the parts of a run together (in any order).
pub fn merge(mut parts: Vec<PartResult>, phases: usize) -> Merged {
    parts.sort_by_key(|r| r.part_first);
    let mut spans = vec![Vec::new(); phases];
    let mut pids = Vec::new();
    for r in &parts {
        for (all, part) in spans.iter_mut().zip(&r.spans) {
            all.extend(part);
        }
        pids.extend(std::iter::repeat_n(r.pid, r.spans.first().map_or(0, Vec::len)));
    }
    let verify_errors = parts.iter().map(|r| r.verify_errors).sum();
    Merged { spans, pids, processes: parts.len() as u32, verify_errors }
}

/// Runs the ranks of a whole run somewhere else than in this process's
/// threads (in child processes, each running a [`Part`] with the
/// benchmark's `run_part`).
pub trait Driver {
    /// Runs the phases named `phases`, in order. `before(phase, cpu_s)` and
    /// `after(phase, cpu_s)` are called while no rank works, with the CPU
    /// seconds the ranks' processes have used so far. Returns the parts'
    /// results merged (spans in Unix seconds).
    fn run(
        &mut self,
        phases: &[&str],
        before: &mut dyn FnMut(usize, f64) -> Result<()>,
        after: &mut dyn FnMut(usize, f64) -> Result<()>,
    ) -> Result<Merged>;
}

/// Runs `phases` phases on `ranks` threads. `work(rank, phase, failed)`
/// returns the units (bytes or operations) the rank moved in that phase; it
/// should stop early once `failed` is set or the run is interrupted
/// ([`crate::interrupted`], which fails the run after the phase). Returns the spans per phase, one
/// per rank. The first error of any rank or hook fails the run, but only
/// after every rank has left the phase (no thread is left at a barrier).
pub fn run<W, B, A>(ranks: u32, phases: usize, mut before: B, mut after: A, work: W) -> Result<Vec<Vec<Span>>>
where
    W: Fn(u32, usize, &AtomicBool) -> Result<u64> + Sync,
    B: FnMut(usize) -> Result<()>,
    A: FnMut(usize, &[Span]) -> Result<()>,
{
    let n = ranks as usize;
    let start = Barrier::new(n + 1);
    let end = Barrier::new(n + 1);
    let failed = AtomicBool::new(false);
    let first_err: Mutex<Option<BenchError>> = Mutex::new(None);
    let spans: Mutex<Vec<Vec<Span>>> = Mutex::new(vec![vec![Span { start_s: 0.0, end_s: 0.0, bytes: 0 }; n]; phases]);
    let t0 = Instant::now();
    let fail = |e: BenchError| {
        failed.store(true, Ordering::SeqCst);
        first_err.lock().expect("error slot").get_or_insert(e);
    };
    std::thread::scope(|s| {
        for rank in 0..ranks {
            let (start, end, failed, spans, work, fail) = (&start, &end, &failed, &spans, &work, &fail);
            s.spawn(move || {
                for ph in 0..phases {
                    start.wait();
                    if !failed.load(Ordering::SeqCst) {
                        let a = t0.elapsed().as_secs_f64();
                        match work(rank, ph, failed) {
                            Ok(units) => {
                                let b = t0.elapsed().as_secs_f64();
                                spans.lock().expect("spans")[ph][rank as usize] =
                                    Span { start_s: a, end_s: b, bytes: units };
                            }
                            Err(e) => fail(e),
                        }
                    }
                    end.wait();
                }
            });
        }
        for ph in 0..phases {
            if !failed.load(Ordering::SeqCst) {
                if let Err(e) = before(ph) {
                    fail(e);
                }
            }
            start.wait();
            end.wait();
            if crate::interrupted() && !failed.load(Ordering::SeqCst) {
                fail(BenchError::Interrupted);
            }
            if !failed.load(Ordering::SeqCst) {
                let done = spans.lock().expect("spans")[ph].clone();
                if let Err(e) = after(ph, &done) {
                    fail(e);
                }
            }
        }
    });
    match first_err.into_inner().expect("error slot") {
        Some(e) => Err(e),
        None => Ok(spans.into_inner().expect("spans")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_cover_the_ranks_once() {
        for (ranks, n) in [(8, 3), (3, 3), (7, 2), (5, 1)] {
            let parts: Vec<Part> = (0..n).map(|i| Part::of(ranks, i, n)).collect();
            let mut next = 0;
            for pt in &parts {
                assert_eq!(pt.first, next, "{ranks} over {n}: {parts:?}");
                assert!(pt.count >= ranks / n && pt.count <= ranks / n + 1);
                assert!(pt.check(ranks).is_ok());
                next += pt.count;
            }
            assert_eq!(next, ranks);
        }
        assert!(Part { first: 2, count: 2 }.check(3).is_err());
        assert!(Part { first: 0, count: 0 }.check(3).is_err());
        assert!(Part { first: u32::MAX, count: 2 }.check(3).is_err());
    }

    #[test]
    fn merged_parts_are_in_rank_order() {
        let span = |b| Span { start_s: 1.0, end_s: 2.0, bytes: b };
        let a = PartResult { part_first: 2, pid: 7, spans: vec![vec![span(2)]], verify_errors: 1 };
        let b = PartResult { part_first: 0, pid: 5, spans: vec![vec![span(0), span(1)]], verify_errors: 0 };
        let m = merge(vec![a, b], 1);
        assert_eq!(m.spans[0].iter().map(|s| s.bytes).collect::<Vec<_>>(), [0, 1, 2]);
        assert_eq!((m.pids, m.processes, m.verify_errors), (vec![5, 5, 7], 2, 1));
    }

    #[test]
    fn phases_run_in_lock_step_and_errors_do_not_hang() {
        let mut befores = Vec::new();
        let r = run(
            3,
            2,
            |ph| {
                befores.push(ph);
                Ok(())
            },
            |_, spans| {
                assert_eq!(spans.len(), 3);
                Ok(())
            },
            |rank, ph, _| Ok(u64::from(rank) + 10 * ph as u64),
        )
        .unwrap();
        assert_eq!(befores, vec![0, 1]);
        assert_eq!(r[1][2].bytes, 12);
        // Every rank of phase 1 started after every rank of phase 0 ended.
        let end0 = r[0].iter().map(|s| s.end_s).fold(0.0, f64::max);
        assert!(r[1].iter().all(|s| s.start_s >= end0));

        let e = run(
            4,
            3,
            |_| Ok(()),
            |_, _| Ok(()),
            |rank, _, _| {
                if rank == 2 {
                    Err(BenchError::Invalid("rank 2 failed".into()))
                } else {
                    Ok(1)
                }
            },
        );
        assert!(e.unwrap_err().to_string().contains("rank 2 failed"));
    }
}
