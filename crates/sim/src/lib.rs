//! Deterministic simulation of HiveFS nodes and clients in one process:
//! the metadata service's cross-node protocol (`hivefs-meta`'s `cross`
//! module and `namespace/cross.rs`; this file and the modules below), and
//! storage buddy mirroring ([`buddy`]).
//!
//! Owns running several metadata nodes (`hivefs_meta::Namespace` on temp
//! dirs) and clients on one tokio thread in paused time, with every choice
//! — the cluster's shape, the clients' operations, each message's fate and
//! delays, commit latencies, partitions, crashes now or at a protocol step,
//! restart delays — drawn from ONE seeded RNG, so a seed replays exactly;
//! and checking the invariants: every answer a client gets is the one its
//! model predicts (so an acknowledged operation is visible exactly once,
//! and a retried one is not applied twice), and at the end no intent is
//! pending, every client's subtree equals its model, fsck finds nothing
//! (no orphan, no dangling dentry, no wrong link count or parent) and the
//! nodes' counters match their inodes. A run's events form a trace whose
//! hash is the same for the same seed (a tested property).
//!
//! It must not use a real network, threads or the wall clock (time is
//! tokio's paused clock; the nodes commit with `NamespaceOptions::
//! inline_writer` instead of the service's combining writer), nor be used by the
//! services: it is a test tool. The seams it needs in `hivefs-meta` are
//! `NamespaceOptions::{inline_writer, seed, clock}` and `CrashHook::Halt`.
//!
//! Layout, each module using only those before it: `model` (a client's
//! expected tree) → `net` (the world: node slots, the RNG, message fates,
//! partitions, the trace) → `node` (start, crash, restart of a metadata
//! node) → `client` (a client task: operations, routing, retries, checks)
//! → `invariants` (end-of-run checks) → `run` (one seed, set-up to
//! verdict) → this file (configuration, results).
//!
//! Running: `cargo test -p hivefs-sim` runs [`DEFAULT_SEEDS`] seeds from
//! [`DEFAULT_SEED_START`] (`HIVEFS_SIM_SEEDS`, `HIVEFS_SIM_SEED_START`
//! change that); `HIVEFS_SIM_SEED=<n>` replays one seed with its trace
//! printed. A long run by hand:
//! `HIVEFS_SIM_SEEDS=5000 cargo test -p hivefs-sim --release --test seeds -- --nocapture`.
//! See `docs/simulation.md`.

#![forbid(unsafe_code)]

pub mod buddy;
mod client;
mod invariants;
pub mod metabuddy;
mod model;
mod net;
mod node;
mod run;

pub use net::{env_u64, Stats};

use std::fmt;

/// Seeds the CI run checks (`HIVEFS_SIM_SEEDS`).
pub const DEFAULT_SEEDS: u64 = 1000;
/// First seed of the CI run (`HIVEFS_SIM_SEED_START`).
pub const DEFAULT_SEED_START: u64 = 1;

/// How often things go wrong. Probabilities are per message (or per
/// commit); `(lo, hi)` pairs are uniform ranges in ms; the chaos task acts
/// every `chaos_every_ms` and picks one of its actions by the weights.
#[derive(Clone, Debug)]
pub struct Faults {
    /// A request is lost before it reaches the node (the caller hears `Unavailable`).
    pub drop: f64,
    /// A request is delivered and runs, but its connection breaks: the
    /// caller hears `Unavailable` while the node goes on (a retry meets it).
    pub lose_reply: f64,
    /// A message (request or answer) takes `slow_ms` instead of `0..=max_delay_ms`.
    pub slow: f64,
    pub max_delay_ms: u64,
    pub slow_ms: (u64, u64),
    /// A commit takes `commit_ms` (else it only yields once).
    pub commit_latency: f64,
    pub commit_ms: (u64, u64),
    pub chaos_every_ms: (u64, u64),
    /// Weights of the chaos actions: crash a node now; arm a node to crash
    /// at a random `op:step` of the protocol; cut the metadata nodes in two
    /// for `partition_ms`; do nothing.
    pub crash_now: u32,
    pub crash_at_step: u32,
    pub partition: u32,
    pub nothing: u32,
    pub restart_ms: (u64, u64),
    pub partition_ms: (u64, u64),
    /// A request between servers whose connection breaks (`lose_reply`)
    /// runs later, `slow_ms` after its sender gave up on it (false: it runs
    /// at once, and only its answer is lost): as TCP can deliver a request
    /// on a connection its sender abandoned, or one held up behind a lock
    /// runs after its sender stopped waiting.
    pub late_requests: bool,
}

impl Default for Faults {
    fn default() -> Self {
        Faults {
            drop: 0.03,
            lose_reply: 0.03,
            slow: 0.05,
            max_delay_ms: 10,
            slow_ms: (50, 1000),
            commit_latency: 0.5,
            commit_ms: (1, 5),
            chaos_every_ms: (100, 800),
            crash_now: 20,
            crash_at_step: 40,
            partition: 25,
            nothing: 15,
            restart_ms: (10, 1500),
            partition_ms: (100, 3000),
            late_requests: true,
        }
    }
}

/// The size of a run; the seed draws the counts within these ranges.
#[derive(Clone, Debug)]
pub struct Config {
    pub nodes: (usize, usize),
    pub clients: (usize, usize),
    pub ops_per_client: usize,
    pub faults: Faults,
    /// Trace lines kept for a failure report.
    pub trace_tail: usize,
    /// Print every trace line to stderr as it happens (replays).
    pub echo: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            nodes: (2, 4),
            clients: (2, 3),
            ops_per_client: 40,
            faults: Faults::default(),
            trace_tail: 200,
            echo: false,
        }
    }
}

/// A run that kept every invariant.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub seed: u64,
    pub nodes: usize,
    pub clients: usize,
    /// Hash of the trace: equal for equal seeds (and builds).
    pub trace_hash: u64,
    pub trace_lines: u64,
    /// Simulated time the run took.
    pub sim_ms: u64,
    pub stats: Stats,
}

/// A run that broke an invariant.
#[derive(Clone, Debug)]
pub struct Failure {
    pub seed: u64,
    pub violations: Vec<String>,
    /// The last lines of the trace.
    pub trace_tail: Vec<String>,
    /// The command that replays the seed.
    pub replay: String,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "simulation seed {} broke {} invariant(s):", self.seed, self.violations.len())?;
        for v in &self.violations {
            writeln!(f, "  - {v}")?;
        }
        writeln!(f, "last {} trace lines:", self.trace_tail.len())?;
        for l in &self.trace_tail {
            writeln!(f, "  {l}")?;
        }
        write!(f, "replay: {}", self.replay)
    }
}

/// Failures a sweep reports before it stops (a broken protocol fails many seeds).
pub const MAX_FAILURES: usize = 3;

/// One simulation as the seed sweeps of `tests/` run it: `<env>_SEED=<n>`
/// replays seed n with its trace printed; otherwise `<env>_SEEDS` seeds
/// (default `count`) from `<env>_SEED_START` (default `start`).
pub struct Sweep<'a, O> {
    /// Prefix of the environment variables, e.g. `HIVEFS_SIM_BUDDY`.
    pub env: &'a str,
    pub start: u64,
    pub count: u64,
    /// Runs a seed; `true`: a replay (every trace line printed).
    pub run: &'a dyn Fn(u64, bool) -> Result<O, Failure>,
    pub stats: fn(&O) -> &Stats,
    pub replay: fn(u64) -> String,
}

impl<O: fmt::Debug> Sweep<'_, O> {
    /// Runs the sweep (or the replay) and panics naming every failing seed
    /// and how to replay it.
    pub fn check(&self) {
        let var = |what: &str| env_u64(&format!("{}_{what}", self.env));
        if let Some(seed) = var("SEED") {
            match (self.run)(seed, true) {
                Ok(o) => eprintln!("seed {seed} passed: {o:?}"),
                Err(f) => panic!("{f}"),
            }
            return;
        }
        let start = var("SEED_START").unwrap_or(self.start);
        let count = var("SEEDS").unwrap_or(self.count);
        let t0 = std::time::Instant::now();
        let (mut failures, mut ran, mut t) = (Vec::new(), 0, Stats::default());
        for seed in start..start + count {
            ran += 1;
            match (self.run)(seed, false) {
                Ok(o) => {
                    let s = (self.stats)(&o);
                    t.messages += s.messages;
                    t.crashes += s.crashes;
                    t.step_crashes += s.step_crashes;
                    t.partitions += s.partitions;
                    t.failovers += s.failovers;
                    t.client_ops += s.client_ops;
                    t.disk_faults += s.disk_faults;
                }
                Err(f) => {
                    eprintln!("{f}\n");
                    failures.push(f.seed);
                    if failures.len() >= MAX_FAILURES {
                        break;
                    }
                }
            }
        }
        eprintln!(
            "{ran} seeds from {start} in {:.1} s ({} failed); passing ones: {} client operations, {} messages, \
             {} crashes ({} at a protocol step), {} partitions, {} failovers, {} disk faults",
            t0.elapsed().as_secs_f64(),
            failures.len(),
            t.client_ops,
            t.messages,
            t.crashes,
            t.step_crashes,
            t.partitions,
            t.failovers,
            t.disk_faults
        );
        if !failures.is_empty() {
            let cmds: Vec<String> = failures.iter().map(|&s| format!("  {}", (self.replay)(s))).collect();
            panic!("simulation seeds {failures:?} failed (see above); replay with:\n{}", cmds.join("\n"));
        }
    }
}

/// The command that replays `seed` with its whole trace printed.
pub fn replay_command(seed: u64) -> String {
    format!("HIVEFS_SIM_SEED={seed} cargo test -p hivefs-sim --test seeds -- --nocapture")
}

/// Runs one seed on a fresh current-thread runtime in paused time.
pub fn run(seed: u64, cfg: &Config) -> Result<Outcome, Failure> {
    run::run(seed, cfg)
}
