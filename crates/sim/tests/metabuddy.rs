//! Seeds of the metadata buddy-mirroring simulation (part of the CI suite)
//! and its determinism.
//!
//! `HIVEFS_SIM_META_BUDDY_SEEDS` (default
//! `hivefs_sim::metabuddy::DEFAULT_SEEDS`) seeds from
//! `HIVEFS_SIM_META_BUDDY_SEED_START` (default
//! `hivefs_sim::metabuddy::DEFAULT_SEED_START`);
//! `HIVEFS_SIM_META_BUDDY_SEED=<n>` replays one seed, printing its trace;
//! `HIVEFS_SIM_META_BUDDY_OPS` sets the operations per client and
//! `HIVEFS_SIM_META_BUDDY_LATE=0` stops delivering nodes' abandoned
//! requests late (a replay needs the same values).

use hivefs_sim::metabuddy::{replay_command, run, MetaBuddyConfig, DEFAULT_SEEDS, DEFAULT_SEED_START};
use hivefs_sim::{env_u64, Sweep};

fn config() -> MetaBuddyConfig {
    let mut cfg = MetaBuddyConfig::default();
    if let Some(ops) = env_u64("HIVEFS_SIM_META_BUDDY_OPS") {
        cfg.ops_per_client = ops as usize;
    }
    if env_u64("HIVEFS_SIM_META_BUDDY_LATE") == Some(0) {
        cfg.faults.net.late_requests = false;
    }
    cfg
}

#[test]
fn meta_buddy_seeds() {
    let cfg = config();
    let run_one = |seed, replay| match replay {
        true => run(seed, &MetaBuddyConfig { echo: true, trace_tail: 0, ..cfg.clone() }),
        false => run(seed, &cfg),
    };
    Sweep {
        env: "HIVEFS_SIM_META_BUDDY",
        start: DEFAULT_SEED_START,
        count: DEFAULT_SEEDS,
        run: &run_one,
        stats: |o| &o.stats,
        replay: replay_command,
    }
    .check();
}

/// Runs `seed` twice with `ops` operations per client: the same trace.
fn replays(seed: u64, ops: usize) {
    let cfg = MetaBuddyConfig { ops_per_client: ops, ..config() };
    let a = run(seed, &cfg).unwrap_or_else(|f| panic!("{f}"));
    let b = run(seed, &cfg).unwrap_or_else(|f| panic!("{f}"));
    assert_eq!((a.trace_hash, a.trace_lines), (b.trace_hash, b.trace_lines));
    assert!(a.stats.client_ops > 0);
}

/// The same seed gives the same trace.
#[test]
fn a_seed_replays_exactly() {
    replays(7, 15);
}

/// The same in a long run (100 operations per client): waits that read
/// the real clock (the leases', the locks', a stale view's, a restart's
/// wait for its previous run's leases) and unordered `select!`s made such
/// runs diverge where short ones did not (seed 12189).
#[test]
fn a_long_run_replays_exactly() {
    replays(12189, 100);
}

#[test]
fn the_real_client_library_runs_exactly_once_over_a_lossy_network() {
    let seeds = env_u64("HIVEFS_SIM_MOUNT_SEEDS").unwrap_or(20);
    let (mut ops, mut lost) = (0, 0);
    for seed in 1..=seeds {
        let o = hivefs_sim::metabuddy::mount::run(seed, 6).unwrap_or_else(|e| panic!("{e}"));
        ops += o.ops;
        lost += o.dropped + o.replies_lost;
    }
    eprintln!("{seeds} seeds: {ops} operations of the real client, {lost} requests or answers lost");
    assert!(lost > 0, "the network lost nothing: the retries were not exercised");
    let twice = [1, 2].map(|_| hivefs_sim::metabuddy::mount::run(7, 6).unwrap_or_else(|e| panic!("{e}")).trace_hash);
    assert_eq!(twice[0], twice[1], "seed 7 of the real client is not deterministic");
}
