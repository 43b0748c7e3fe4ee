//! A flag set once, which tasks can wait for.

use std::sync::atomic::{AtomicBool, Ordering};
use tokio::sync::Notify;

/// Set once and never cleared; [`Latch::wait`] returns once it is set.
#[derive(Default)]
pub struct Latch {
    set: AtomicBool,
    notify: Notify,
}

impl Latch {
    pub fn set(&self) {
        self.set.store(true, Ordering::Release);
        self.notify.notify_waiters();
    }

    pub fn is_set(&self) -> bool {
        self.set.load(Ordering::Acquire)
    }

    pub async fn wait(&self) {
        loop {
            // Made before the look at the flag: a `set` in between wakes it.
            let n = self.notify.notified();
            if self.is_set() {
                return;
            }
            n.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[tokio::test]
    async fn waiters_return_once_set_and_later_waits_at_once() {
        let l = Arc::new(Latch::default());
        let w = tokio::spawn({
            let l = l.clone();
            async move { l.wait().await }
        });
        tokio::task::yield_now().await;
        assert!(!w.is_finished() && !l.is_set());
        l.set();
        w.await.unwrap();
        assert!(l.is_set());
        l.wait().await;
    }
}
