//! Seeds of the storage buddy-mirroring simulation (part of the CI suite)
//! and its determinism.
//!
//! `HIVEFS_SIM_BUDDY_SEEDS` (default `hivefs_sim::buddy::DEFAULT_SEEDS`)
//! seeds from `HIVEFS_SIM_BUDDY_SEED_START` (default
//! `hivefs_sim::buddy::DEFAULT_SEED_START`); `HIVEFS_SIM_BUDDY_SEED=<n>`
//! replays one seed, printing its trace; `HIVEFS_SIM_BUDDY_OPS` sets the
//! operations per client and `HIVEFS_SIM_BUDDY_DISK_ERROR_PERMILLE` how
//! often a chunk-file operation fails on a disk (a replay needs the same
//! values).

use hivefs_sim::buddy::{replay_command, run, BuddyConfig, DEFAULT_SEEDS, DEFAULT_SEED_START};
use hivefs_sim::{env_u64, Sweep};

fn config() -> BuddyConfig {
    let mut cfg = BuddyConfig::default();
    if let Some(ops) = env_u64("HIVEFS_SIM_BUDDY_OPS") {
        cfg.ops_per_client = ops as usize;
    }
    if let Some(p) = env_u64("HIVEFS_SIM_BUDDY_DISK_ERROR_PERMILLE") {
        cfg.faults.disk_error = p as f64 / 1000.0;
    }
    cfg
}

#[test]
fn buddy_seeds() {
    let cfg = config();
    let run_one = |seed, replay| match replay {
        true => run(seed, &BuddyConfig { echo: true, trace_tail: 0, ..cfg.clone() }),
        false => run(seed, &cfg),
    };
    Sweep {
        env: "HIVEFS_SIM_BUDDY",
        start: DEFAULT_SEED_START,
        count: DEFAULT_SEEDS,
        run: &run_one,
        stats: |o| &o.stats,
        replay: replay_command,
    }
    .check();
}

#[test]
fn a_buddy_seed_replays_the_same_trace() {
    let cfg = BuddyConfig::default();
    for seed in [DEFAULT_SEED_START + 1000, DEFAULT_SEED_START + 1001] {
        let a = run(seed, &cfg).unwrap_or_else(|f| panic!("{f}"));
        let b = run(seed, &cfg).unwrap_or_else(|f| panic!("{f}"));
        assert_eq!((a.trace_hash, a.trace_lines), (b.trace_hash, b.trace_lines), "seed {seed} is not deterministic");
        assert!(a.stats.client_ops > 0 && a.stats.failovers + a.stats.crashes > 0, "seed {seed} did nothing: {a:?}");
        assert!(a.stats.disk_faults > 0, "seed {seed} met no disk failure: {a:?}");
    }
}
