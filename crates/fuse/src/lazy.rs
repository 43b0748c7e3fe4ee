//! Running a request's handler on the FUSE thread that read it, until it
//! first has to wait.
//!
//! [`start`] polls the handler's future once right there (inside the
//! runtime's context, so it may use sockets, timers and spawn). Most of a
//! mount's requests either finish in that poll (answers from leases and
//! caches, quiet closes) or send one request to a server and wait for its
//! answer: the request leaves from this thread (the transport writes from
//! its caller's thread), and no worker thread is woken to start it. The
//! future is handed to the runtime only when it is woken: by its answer, a
//! timer, a lock. Spawning at once would wake a worker for every request, to
//! do what this thread can do itself; on a machine with few cores those
//! wake-ups were a large part of the mount's CPU per create.
//!
//! This module must not block: a future that waits is parked, never waited for.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};

type Job = Pin<Box<dyn Future<Output = ()> + Send>>;

enum State {
    /// [`start`] is polling it; `woken` when its waker fired meanwhile.
    Polling { woken: bool },
    /// Waiting for its waker.
    Parked(Job),
    /// A runtime task now (or finished).
    Spawned,
}

struct Lazy {
    rt: tokio::runtime::Handle,
    state: Mutex<State>,
}

impl Wake for Lazy {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref()
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let mut s = self.state.lock().expect("lazy task");
        match std::mem::replace(&mut *s, State::Spawned) {
            State::Parked(job) => {
                drop(s);
                self.rt.spawn(job);
            }
            State::Polling { .. } => *s = State::Polling { woken: true },
            State::Spawned => {}
        }
    }
}

/// Runs `fut` on this thread until it first waits, then as a task of `rt`
/// once it is woken.
pub(crate) fn start(rt: &tokio::runtime::Handle, fut: impl Future<Output = ()> + Send + 'static) {
    let _in_runtime = rt.enter();
    let mut job: Job = Box::pin(fut);
    let lazy = Arc::new(Lazy { rt: rt.clone(), state: Mutex::new(State::Polling { woken: false }) });
    let waker = Waker::from(lazy.clone());
    if let Poll::Ready(()) = job.as_mut().poll(&mut Context::from_waker(&waker)) {
        return;
    }
    let mut s = lazy.state.lock().expect("lazy task");
    match *s {
        // Woken while it was polled here: it runs on at once.
        State::Polling { woken: true } => {
            *s = State::Spawned;
            drop(s);
            rt.spawn(job);
        }
        _ => *s = State::Parked(job),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
    }

    /// A future that does not wait runs to its end on the calling thread.
    #[test]
    fn a_future_that_does_not_wait_finishes_on_the_calling_thread() {
        let rt = runtime();
        let me = std::thread::current().id();
        let (tx, rx) = std::sync::mpsc::channel();
        start(rt.handle(), async move { tx.send(std::thread::current().id()).unwrap() });
        assert_eq!(rx.try_recv().unwrap(), me);
    }

    /// Futures that wait (for a message sent only after `start` returned, a
    /// timer, another task, a wake-up during their first poll) finish, each
    /// once; those certain to have waited (the message, the wake-up) on the
    /// runtime. A timer or a task may already be done at the first poll, and
    /// the future then ends on the calling thread, as it should.
    #[test]
    fn waiting_futures_finish_on_the_runtime() {
        let rt = runtime();
        let done = Arc::new(AtomicUsize::new(0));
        let me = std::thread::current().id();
        let n = 200;
        let mut later = Vec::new();
        for i in 0..n {
            let done = done.clone();
            let (tx, rx) = tokio::sync::oneshot::channel::<()>();
            later.push(tx);
            start(rt.handle(), async move {
                let waited = match i % 4 {
                    0 => rx.await.is_ok(),
                    1 => {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                        false
                    }
                    2 => {
                        tokio::spawn(async {}).await.unwrap();
                        false
                    }
                    // Wakes itself while it is being polled here.
                    _ => {
                        tokio::task::yield_now().await;
                        true
                    }
                };
                if waited {
                    assert_ne!(std::thread::current().id(), me, "a woken future runs on the runtime");
                }
                done.fetch_add(1, Ordering::SeqCst);
            });
        }
        for tx in later {
            let _ = tx.send(());
        }
        let end = std::time::Instant::now() + Duration::from_secs(10);
        while done.load(Ordering::SeqCst) < n && std::time::Instant::now() < end {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(done.load(Ordering::SeqCst), n);
    }
}
