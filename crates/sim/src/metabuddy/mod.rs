//! Simulation of metadata buddy mirroring (`docs/design-mirror.md`,
//! "Metadata groups"): mgmtd, 2–3 real metadata services whose namespaces
//! mirror each other in a ring of groups, and clients, in one process, on
//! one thread in paused time, with every choice drawn from one seeded RNG.
//!
//! A primary sends every journal record to its secondary before its own
//! append (the asynchronous commit hook), degrades the group when that
//! fails, and resyncs a returning secondary; mgmtd switches a group over
//! when its primary is silent, and the secondary's copy is promoted. The
//! run loses, delays and reorders messages, crashes metadata nodes (now, or
//! at a step of a cross-node operation) and mgmtd, and cuts the servers
//! apart, while clients run the namespace operations of the metadata
//! simulation (`crate::client`, the same model) through the real client
//! routing (`Cluster::call_meta`: to the group's current primary, with the
//! mirroring header). Checks: every answer is the model's; at the end, once
//! every group is good again, every client's subtree equals its model, no
//! intent is pending, fsck finds nothing, and both copies of every
//! namespace have the same digest (`Primary::compare`, what `hivefs fsck`
//! asks).
//!
//! Layout: `crate::buddy::world` (the network, mgmtd, the nodes' slots;
//! shared with the storage simulation) → `node` (start, crash, restart of a
//! metadata node) → `run` (one seed, set-up to verdict, and the end
//! checks) → this file; `mount` runs the real client library
//! (`hivefs_client::Client`) over the same world. `cargo test -p hivefs-sim --test metabuddy` runs
//! [`DEFAULT_SEEDS`] seeds; `HIVEFS_SIM_META_BUDDY_SEED=<n>` replays one
//! (see `docs/simulation.md`).

pub mod mount;
mod node;
mod run;

pub use crate::buddy::Stats;

use crate::buddy::BuddyFaults;
use crate::Failure;

/// Seeds the CI run checks (`HIVEFS_SIM_META_BUDDY_SEEDS`).
pub const DEFAULT_SEEDS: u64 = 100;
/// First seed of the CI run (`HIVEFS_SIM_META_BUDDY_SEED_START`).
pub const DEFAULT_SEED_START: u64 = 1;

/// The size of a run; the seed draws the counts within these ranges.
#[derive(Clone, Debug)]
pub struct MetaBuddyConfig {
    pub nodes: (usize, usize),
    pub clients: (usize, usize),
    pub ops_per_client: usize,
    /// `crash_at_step` arms a node to stop at a step of a cross-node
    /// operation (`hivefs_meta::cross::CrashHook`).
    pub faults: BuddyFaults,
    pub trace_tail: usize,
    pub echo: bool,
}

impl Default for MetaBuddyConfig {
    fn default() -> Self {
        MetaBuddyConfig {
            nodes: (2, 3),
            clients: (1, 3),
            ops_per_client: 40,
            // Nodes' abandoned requests are delivered late, too (peer steps,
            // mirroring and resync steps); `HIVEFS_SIM_META_BUDDY_LATE=0`
            // turns that off.
            faults: BuddyFaults::default(),
            trace_tail: 200,
            echo: false,
        }
    }
}

/// A run that kept every invariant.
#[derive(Clone, Debug)]
pub struct MetaBuddyOutcome {
    pub seed: u64,
    pub nodes: usize,
    pub clients: usize,
    pub trace_hash: u64,
    pub trace_lines: u64,
    pub sim_ms: u64,
    pub stats: Stats,
}

/// The command that replays `seed` with its whole trace printed.
pub fn replay_command(seed: u64) -> String {
    format!("HIVEFS_SIM_META_BUDDY_SEED={seed} cargo test -p hivefs-sim --test metabuddy -- --nocapture")
}

/// Runs one seed on a fresh current-thread runtime in paused time.
pub fn run(seed: u64, cfg: &MetaBuddyConfig) -> Result<MetaBuddyOutcome, Failure> {
    run::run(seed, cfg)
}
