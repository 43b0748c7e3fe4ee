//! Seeds of the metadata buddy-mirroring simulation (part of the CI suite)
//! and its determinism.
//!
//! `HIVEFS_SIM_META_BUDDY_SEEDS` (default
//! `hivefs_sim::metabuddy::DEFAULT_SEEDS`) seeds from
//! `HIVEFS_SIM_META_BUDDY_SEED_START` (default
//! `hivefs_sim::metabuddy::DEFAULT_SEED_START`);
//! `HIVEFS_SIM_META_BUDDY_SEED=<n>` replays one seed, printing its trace;
//! `HIVEFS_SIM_META_BUDDY_OPS` sets the operations per client and
//! `HIVEFS_SIM_META_BUDDY_LATE=1` delivers nodes' abandoned requests late
//! (a replay needs the same values).

use hivefs_sim::metabuddy::{replay_command, run, MetaBuddyConfig, DEFAULT_SEEDS, DEFAULT_SEED_START};
use hivefs_sim::{env_u64, Sweep};

fn config() -> MetaBuddyConfig {
    let mut cfg = MetaBuddyConfig::default();
    if let Some(ops) = env_u64("HIVEFS_SIM_META_BUDDY_OPS") {
        cfg.ops_per_client = ops as usize;
    }
    if env_u64("HIVEFS_SIM_META_BUDDY_LATE") == Some(1) {
        cfg.faults.late_requests = true;
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

/// The same seed gives the same trace.
#[test]
fn a_seed_replays_exactly() {
    let cfg = MetaBuddyConfig { ops_per_client: 15, ..config() };
    let a = run(7, &cfg).unwrap_or_else(|f| panic!("{f}"));
    let b = run(7, &cfg).unwrap_or_else(|f| panic!("{f}"));
    assert_eq!((a.trace_hash, a.trace_lines), (b.trace_hash, b.trace_lines));
    assert!(a.stats.client_ops > 0);
}
