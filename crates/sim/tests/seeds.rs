//! The simulation's seeds (part of the CI suite) and its determinism.
//!
//! `HIVEFS_SIM_SEEDS` (default `hivefs_sim::DEFAULT_SEEDS`) seeds from
//! `HIVEFS_SIM_SEED_START` (default `hivefs_sim::DEFAULT_SEED_START`);
//! `HIVEFS_SIM_SEED=<n>` replays one seed, printing its trace;
//! `HIVEFS_SIM_OPS` sets the operations per client (default
//! `Config::default().ops_per_client`; a replay needs the same value).

use hivefs_sim::{env_u64, replay_command, run, Config, Sweep, DEFAULT_SEEDS, DEFAULT_SEED_START};

fn config() -> Config {
    let mut cfg = Config::default();
    if let Some(ops) = env_u64("HIVEFS_SIM_OPS") {
        cfg.ops_per_client = ops as usize;
    }
    cfg
}

#[test]
fn seeds() {
    let cfg = config();
    let run_one = |seed, replay| match replay {
        true => run(seed, &Config { echo: true, trace_tail: 0, ..cfg.clone() }),
        false => run(seed, &cfg),
    };
    Sweep {
        env: "HIVEFS_SIM",
        start: DEFAULT_SEED_START,
        count: DEFAULT_SEEDS,
        run: &run_one,
        stats: |o| &o.stats,
        replay: replay_command,
    }
    .check();
}

#[test]
fn a_seed_replays_the_same_trace() {
    let cfg = Config::default();
    for seed in [DEFAULT_SEED_START + 1000, DEFAULT_SEED_START + 1001] {
        let a = run(seed, &cfg).unwrap_or_else(|f| panic!("{f}"));
        let b = run(seed, &cfg).unwrap_or_else(|f| panic!("{f}"));
        assert_eq!((a.trace_hash, a.trace_lines), (b.trace_hash, b.trace_lines), "seed {seed} is not deterministic");
        assert!(a.stats.client_ops > 0 && a.stats.messages > 0, "seed {seed} did nothing: {a:?}");
    }
}
