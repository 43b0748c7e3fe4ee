//! Ranks as threads, in lock step: every phase starts on all ranks at once
//! (after a barrier) and the next phase waits for the slowest rank. The
//! coordinating thread runs a hook before and after each phase (cache drops,
//! CPU and request-counter snapshots) while no rank is working.

use crate::{BenchError, Result, Span};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Barrier, Mutex};
use std::time::Instant;

/// Runs `phases` phases on `ranks` threads. `work(rank, phase, failed)`
/// returns the units (bytes or operations) the rank moved in that phase; it
/// should stop early once `failed` is set. Returns the spans per phase, one
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
