//! A one-line progress display on stderr, shown only when stderr is a
//! terminal (so logs, pipes and tests see nothing of it).

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What a running phase counts: units done out of a total (0 = unknown).
#[derive(Clone, Default)]
pub struct Counter(Arc<AtomicU64>);

impl Counter {
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }

    pub fn reset(&self) {
        self.0.store(0, Ordering::Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Redraws `label: done/total unit, elapsed` four times a second until dropped.
pub struct Progress {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Progress {
    /// Starts the display if `enabled` and stderr is a terminal; `unit` is
    /// "MiB" (the counter holds bytes) or anything else (plain counts).
    pub fn start(enabled: bool, label: String, total: u64, unit: &'static str, counter: Counter) -> Progress {
        let stop = Arc::new(AtomicBool::new(false));
        if !enabled || !std::io::stderr().is_terminal() {
            return Progress { stop, thread: None };
        }
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            let t0 = Instant::now();
            let show = |v: u64| if unit == "MiB" { v >> 20 } else { v };
            while !s.load(Ordering::Relaxed) {
                let done = counter.get();
                let mut line = format!("\r{label}: ");
                if total == 0 && unit.is_empty() {
                    line += "running";
                } else if total > 0 {
                    line += &format!("{}", show(done));
                    line += &format!("/{} {unit} ({:.0} %)", show(total), done as f64 * 100.0 / total as f64);
                } else {
                    line += &format!("{} {unit}", show(done));
                }
                line += &format!(", {:.1} s   ", t0.elapsed().as_secs_f64());
                let _ = std::io::stderr().write_all(line.as_bytes());
                std::thread::sleep(Duration::from_millis(250));
            }
            let _ = std::io::stderr().write_all(b"\r\x1b[K");
        });
        Progress { stop, thread: Some(thread) }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
