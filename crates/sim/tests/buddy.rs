//! Seeds of the storage buddy-mirroring simulation (part of the CI suite)
//! and its determinism.
//!
//! `HIVEFS_SIM_BUDDY_SEEDS` (default `hivefs_sim::buddy::DEFAULT_SEEDS`)
//! seeds from `HIVEFS_SIM_BUDDY_SEED_START` (default
//! `hivefs_sim::buddy::DEFAULT_SEED_START`); `HIVEFS_SIM_BUDDY_SEED=<n>`
//! replays one seed, printing its trace; `HIVEFS_SIM_BUDDY_OPS` sets the
//! operations per client (a replay needs the same value).

use hivefs_sim::buddy::{run, BuddyConfig, DEFAULT_SEEDS, DEFAULT_SEED_START};
use hivefs_sim::env_u64;
use std::time::Instant;

/// Failures reported before the run stops.
const MAX_FAILURES: usize = 3;

fn config() -> BuddyConfig {
    let mut cfg = BuddyConfig::default();
    if let Some(ops) = env_u64("HIVEFS_SIM_BUDDY_OPS") {
        cfg.ops_per_client = ops as usize;
    }
    cfg
}

#[test]
fn buddy_seeds() {
    if let Some(seed) = env_u64("HIVEFS_SIM_BUDDY_SEED") {
        let cfg = BuddyConfig { echo: true, trace_tail: 0, ..config() };
        match run(seed, &cfg) {
            Ok(o) => eprintln!("seed {seed} passed: {o:?}"),
            Err(f) => panic!("{f}"),
        }
        return;
    }
    let start = env_u64("HIVEFS_SIM_BUDDY_SEED_START").unwrap_or(DEFAULT_SEED_START);
    let count = env_u64("HIVEFS_SIM_BUDDY_SEEDS").unwrap_or(DEFAULT_SEEDS);
    let cfg = config();
    let t0 = Instant::now();
    let mut failures = Vec::new();
    let mut totals = hivefs_sim::buddy::Stats::default();
    let mut ran = 0;
    for seed in start..start + count {
        ran += 1;
        match run(seed, &cfg) {
            Ok(o) => {
                let s = &o.stats;
                totals.messages += s.messages;
                totals.crashes += s.crashes;
                totals.step_crashes += s.step_crashes;
                totals.partitions += s.partitions;
                totals.failovers += s.failovers;
                totals.client_ops += s.client_ops;
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
        "{ran} buddy seeds from {start} in {:.1} s ({} failed); passing ones: {} client operations, {} messages, {} crashes ({} at a protocol step), {} partitions, {} failovers",
        t0.elapsed().as_secs_f64(),
        failures.len(),
        totals.client_ops,
        totals.messages,
        totals.crashes,
        totals.step_crashes,
        totals.partitions,
        totals.failovers
    );
    if !failures.is_empty() {
        let cmds: Vec<String> =
            failures.iter().map(|&s| format!("  {}", hivefs_sim::buddy::replay_command(s))).collect();
        panic!("buddy simulation seeds {failures:?} failed (see above); replay with:\n{}", cmds.join("\n"));
    }
}

#[test]
fn a_buddy_seed_replays_the_same_trace() {
    let cfg = BuddyConfig::default();
    for seed in [DEFAULT_SEED_START + 1000, DEFAULT_SEED_START + 1001] {
        let a = run(seed, &cfg).unwrap_or_else(|f| panic!("{f}"));
        let b = run(seed, &cfg).unwrap_or_else(|f| panic!("{f}"));
        assert_eq!((a.trace_hash, a.trace_lines), (b.trace_hash, b.trace_lines), "seed {seed} is not deterministic");
        assert!(a.stats.client_ops > 0 && a.stats.failovers + a.stats.crashes > 0, "seed {seed} did nothing: {a:?}");
    }
}
