//! Simulation of storage buddy mirroring (`docs/design-mirror.md`): mgmtd,
//! 2–3 real storage services and clients in one process, on one thread in
//! paused time, with every choice drawn from one seeded RNG.
//!
//! mgmtd hands out leases with its heartbeat answers and switches a group
//! over when its primary is silent; a primary forwards every change to its
//! secondary before applying it, degrades the group when that fails, and
//! resyncs a returning secondary. The run loses, delays and reorders
//! messages, crashes storage nodes and mgmtd, cuts the servers apart (a
//! primary from mgmtd, the two members from each other) and fails chunk-file
//! operations on the targets' disks, while clients write,
//! truncate, remove and read their own chunk files through the real
//! client routing. It checks that every read returns what the acknowledged
//! changes before it wrote, and at the end, once every group is good
//! again, that both members of each group hold the same chunk files and
//! that they are the clients' models.
//!
//! Layout: `world` (the network, mgmtd, the nodes' slots) → `disk` (a
//! storage target's failing disk) → `node` (start,
//! crash, restart of a storage node) → `client` (a client and its model)
//! → `run` (one seed, set-up to verdict, and the end checks) → this file.
//! `cargo test -p hivefs-sim --test buddy` runs [`DEFAULT_SEEDS`] seeds;
//! `HIVEFS_SIM_BUDDY_SEED=<n>` replays one (see `docs/simulation.md`).

mod client;
mod disk;
mod node;
mod run;
pub(crate) mod world;

pub use world::Stats;

use crate::{Failure, Faults};

/// Seeds the CI run checks (`HIVEFS_SIM_BUDDY_SEEDS`).
pub const DEFAULT_SEEDS: u64 = 200;
/// First seed of the CI run (`HIVEFS_SIM_BUDDY_SEED_START`).
pub const DEFAULT_SEED_START: u64 = 1;

/// How often things go wrong: the network's faults (as for the metadata
/// simulation), and the chaos task's actions and their weights.
#[derive(Clone, Debug)]
pub struct BuddyFaults {
    pub net: Faults,
    pub chaos_every_ms: (u64, u64),
    /// Crash a storage node now (it restarts after `restart_ms`).
    pub crash_now: u32,
    /// Arm a storage node to crash at a random step of the mirroring
    /// protocol (`hivefs_storage::MIRROR_STEPS`).
    pub crash_at_step: u32,
    /// Cut the servers (mgmtd and the storage nodes) in two for `partition_ms`.
    pub partition: u32,
    /// Crash mgmtd (it restarts after `restart_ms`).
    pub mgmt_crash: u32,
    pub nothing: u32,
    pub restart_ms: (u64, u64),
    pub partition_ms: (u64, u64),
    /// A chunk-file operation on a storage target fails as a disk's does
    /// (see `disk`); not while the run is calm.
    pub disk_error: f64,
}

impl Default for BuddyFaults {
    fn default() -> Self {
        BuddyFaults {
            net: Faults { slow_ms: (50, 600), ..Faults::default() },
            chaos_every_ms: (300, 3000),
            crash_now: 25,
            crash_at_step: 30,
            partition: 40,
            mgmt_crash: 8,
            nothing: 22,
            restart_ms: (10, 4000),
            partition_ms: (200, 5000),
            disk_error: 0.02,
        }
    }
}

/// The size of a run; the seed draws the counts within these ranges.
#[derive(Clone, Debug)]
pub struct BuddyConfig {
    pub nodes: (usize, usize),
    pub groups_max: usize,
    pub clients: (usize, usize),
    pub files_per_client: usize,
    pub ops_per_client: usize,
    pub faults: BuddyFaults,
    pub trace_tail: usize,
    pub echo: bool,
}

impl Default for BuddyConfig {
    fn default() -> Self {
        BuddyConfig {
            nodes: (2, 3),
            groups_max: 2,
            clients: (1, 3),
            files_per_client: 3,
            ops_per_client: 60,
            faults: BuddyFaults::default(),
            trace_tail: 200,
            echo: false,
        }
    }
}

/// A run that kept every invariant.
#[derive(Clone, Debug)]
pub struct BuddyOutcome {
    pub seed: u64,
    pub nodes: usize,
    pub groups: usize,
    pub clients: usize,
    pub trace_hash: u64,
    pub trace_lines: u64,
    pub sim_ms: u64,
    pub stats: Stats,
}

/// The command that replays `seed` with its whole trace printed.
pub fn replay_command(seed: u64) -> String {
    format!("HIVEFS_SIM_BUDDY_SEED={seed} cargo test -p hivefs-sim --test buddy -- --nocapture")
}

/// Runs one seed on a fresh current-thread runtime in paused time.
pub fn run(seed: u64, cfg: &BuddyConfig) -> Result<BuddyOutcome, Failure> {
    run::run(seed, cfg)
}
