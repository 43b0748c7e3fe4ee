//! The kernel's interrupts of requests (`FUSE_INTERRUPT`), and answering a
//! request early when its caller is being killed.
//!
//! A task blocked in a FUSE request cannot die until the request is
//! answered: the kernel waits for the answer even after a fatal signal.
//! With a server that does not answer (a dead node, a cut link), Ctrl-C or
//! `kill -9` of such a process would wait out the I/O timeout. For requests
//! whose answer carries nothing the kernel keeps (no inode, no handle:
//! reads, writes, attributes, syncs; see `run_killable!`), the mount answers
//! `EINTR` as soon as the caller has a fatal signal pending, and lets the
//! handler run on; its own answer then finds the request gone. A caller
//! that merely handles a signal is never answered early (a read returning
//! `EINTR` there would break programs, as NFS's old `intr` option did).
//! Early answers go through `/dev/fuse` only; over io_uring a request's
//! answer is tied to its queue entry, and such requests wait as before.
//!
//! Lock waits use the same registry: any interrupt ends their wait
//! (`locks::setlk`), as a local file system's `F_SETLKW` ends with `EINTR`.
//! This module must not answer anything itself but through the
//! [`Interrupter`] it is handed.

use super::*;
use hivefs_client::Interrupt;
use hivefs_fusewire::Interrupter;

/// How often an interrupted request whose caller is not being killed (yet)
/// looks again: the kernel sends one interrupt per request, at its first
/// signal, and a fatal one may follow a handled one.
const KILL_POLL: Duration = Duration::from_millis(100);

/// Interrupts of requests not found registered that are remembered.
const EARLY_INTERRUPTS: usize = 64;

/// Registered requests by FUSE request id, and interrupts that came before
/// their request's handler registered it.
#[derive(Default)]
pub(super) struct Waits {
    waiting: HashMap<u64, Arc<Interrupt>>,
    /// Interrupts of requests not (yet) registered, newest last: most are
    /// of requests that finished or are not interruptible; a few are of a
    /// request whose handler has not run yet.
    early: VecDeque<u64>,
}

impl Waits {
    /// A request that may wait: its interrupt, fired already if the
    /// kernel's interrupt came first. Pair with [`Waits::done`].
    pub(super) fn register(&mut self, unique: u64) -> Arc<Interrupt> {
        let i = Arc::new(Interrupt::default());
        if let Some(at) = self.early.iter().position(|u| *u == unique) {
            self.early.remove(at);
            i.set();
        }
        self.waiting.insert(unique, i.clone());
        i
    }

    pub(super) fn done(&mut self, unique: u64) {
        self.waiting.remove(&unique);
    }

    pub(super) fn interrupt(&mut self, unique: u64) {
        match self.waiting.get(&unique) {
            Some(i) => {
                debug!("FUSE request {unique} interrupted");
                i.set()
            }
            None => {
                if self.early.len() == EARLY_INTERRUPTS {
                    self.early.pop_front();
                }
                self.early.push_back(unique);
            }
        }
    }
}

/// Whether thread `pid` has SIGKILL pending (the kernel turns every fatal
/// signal into one for each thread of the dying process); `None` when its
/// status cannot be read (gone, or in a PID namespace this one does not see).
fn sigkill_pending(pid: u32) -> Option<bool> {
    if pid == 0 {
        return None;
    }
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let sigkill = 1u64 << (libc::SIGKILL - 1);
    Some(status.lines().any(|l| {
        let mut it = l.split_whitespace();
        matches!(it.next(), Some("SigPnd:" | "ShdPnd:"))
            && it.next().and_then(|h| u64::from_str_radix(h, 16).ok()).is_some_and(|m| m & sigkill != 0)
    }))
}

/// Whether thread `pid` is gone or being killed (a lock wait gives up then).
pub(super) fn fatal_signal_pending(pid: u32) -> bool {
    sigkill_pending(pid).unwrap_or(true)
}

/// Returns once request's caller `pid` is being killed, after the
/// request's interrupt `i` came; never for a caller that only handles signals.
async fn caller_killed(i: &Interrupt, pid: u32) {
    i.wait().await;
    loop {
        match sigkill_pending(pid) {
            Some(true) => return,
            Some(false) => tokio::time::sleep(KILL_POLL).await,
            // Not visible from here: not answered early.
            None => std::future::pending().await,
        }
    }
}

/// Runs `work` (request `unique`'s handler up to its answer, for caller
/// thread `pid`) and gives its result. A request that waits past its first
/// poll is registered for the kernel's interrupt, if `interrupter` gives a
/// way to answer early: then it is answered `EINTR` at once when the caller
/// is being killed, and `work` still runs to its end. Most requests finish
/// in their first poll (caches, leases) and cost nothing here.
pub(super) async fn killable<T>(
    inner: &Inner,
    unique: u64,
    pid: u32,
    interrupter: impl FnOnce() -> Option<Interrupter>,
    work: impl std::future::Future<Output = FsResult<T>>,
) -> FsResult<T> {
    tokio::pin!(work);
    let first = std::future::poll_fn(|cx| std::task::Poll::Ready(work.as_mut().poll(cx))).await;
    if let std::task::Poll::Ready(r) = first {
        return r;
    }
    let Some(interrupter) = interrupter() else { return work.await };
    // An interrupt that came meanwhile was kept for it (`Waits::early`).
    let interrupt = inner.waits.lock().expect("interrupt waits").register(unique);
    let r = tokio::select! {
        biased;
        r = &mut work => r,
        () = caller_killed(&interrupt, pid) => {
            debug!("FUSE request {unique}: its caller (thread {pid}) is being killed: answered EINTR, the handler goes on");
            interrupter.answer(Errno::EINTR);
            work.await
        }
    };
    inner.waits.lock().expect("interrupt waits").done(unique);
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_interrupt_before_its_request_registered_is_kept_for_it() {
        let mut w = Waits::default();
        w.interrupt(7);
        assert!(w.register(7).is_set(), "the early interrupt fired it");
        assert!(!w.register(8).is_set());
        w.interrupt(8);
        assert!(w.waiting[&8].is_set());
        w.done(7);
        w.done(8);
        assert!(w.waiting.is_empty());
        for u in 100..100 + 2 * EARLY_INTERRUPTS as u64 {
            w.interrupt(u);
        }
        assert_eq!(w.early.len(), EARLY_INTERRUPTS, "bounded");
        assert!(!w.register(100).is_set(), "the oldest went");
    }

    #[test]
    fn this_process_is_not_being_killed_and_pid_0_is_unknown() {
        assert_eq!(sigkill_pending(std::process::id()), Some(false));
        assert_eq!(sigkill_pending(0), None);
        assert!(fatal_signal_pending(0), "a lock wait of an unknown caller gives up");
    }
}
