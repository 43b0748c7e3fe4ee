//! A metadata node's life: start (the real service on its directory,
//! registering with mgmtd over the simulated network, with the
//! simulation's clock, seeds, commit latencies and a storage target that
//! holds nothing; retried as a service manager would), crash (every task
//! running its code stops where it is: what reached its journal stays) and
//! restart after a delay.

use crate::buddy::world::{self, Ep, World, HEARTBEAT_MS, MGMTD};
use hivefs_meta::cross::CrashHook;
use hivefs_meta::mirror::Slot;
use hivefs_meta::writer::CommitLatency;
use hivefs_meta::{Config, MetaService, Namespace, Net, Simulated};
use hivefs_types::attr::Timespec;
use rand::Rng;
use std::sync::Arc;
use std::time::Duration;

pub type MetaWorld = World<MetaService>;

/// Journal bytes after which a simulated node checkpoints.
const CHECKPOINT_BYTES: u64 = 4096;
/// How often a node refreshes its view and follows its groups' roles.
const REFRESH_MS: u64 = 300;

/// The seams of node `k`'s service: the world's clock, seeds drawn from the
/// world's RNG, commit latencies drawn per commit.
fn simulated(world: &Arc<MetaWorld>) -> Simulated {
    let w = Arc::downgrade(world);
    let latency: CommitLatency = Arc::new(move || match w.upgrade() {
        Some(w) if !w.is_calm() && w.chance(w.faults.net.commit_latency) => w.ms(w.faults.net.commit_ms),
        _ => Duration::ZERO,
    });
    let w = Arc::downgrade(world);
    let clock = Arc::new(move || {
        let ms = w.upgrade().map_or(0, |w| w.elapsed_ms());
        Timespec { sec: 1_700_000_000 + (ms / 1000) as i64, nsec: (ms % 1000) as u32 * 1_000_000 }
    });
    let w = Arc::downgrade(world);
    let seed = Arc::new(move || w.upgrade().map_or(0, |w| w.rng().gen::<u64>()));
    Simulated { latency, clock, seed, targets: Arc::new(crate::node::OneTarget) }
}

/// Starts node `k` as a task of the node: it is up (takes requests) once
/// its service has registered and serves or keeps its namespaces.
pub fn start(world: &Arc<MetaWorld>, k: usize) {
    let (dir, boot) = world.next_boot(k, |w, k, boot, delay| crash_and_restart(w, k, Some(boot), "crash step", delay));
    world.trace(format_args!("n{k} starts, boot {boot}"));
    let cfg = Config {
        dir,
        listen: "simulated".into(),
        advertise: Some(format!("n{k}")),
        mgmtd: MGMTD.into(),
        heartbeat_interval_ms: HEARTBEAT_MS,
        target_refresh_ms: REFRESH_MS,
        checkpoint_bytes: CHECKPOINT_BYTES,
        ..Config::default()
    };
    let pools = world::pools(world, Ep::Node(k));
    let sim = simulated(world);
    world.start_node(k, boot, move || {
        hivefs_meta::start_with(cfg.clone(), Net::Pools(pools.clone()), Some(sim.clone()))
    });
}

/// The namespaces node `k` serves now.
pub fn serving(world: &MetaWorld, k: usize) -> Vec<Arc<Namespace>> {
    let Some(m) = world.slot(k).svc.as_ref().and_then(|s| s.mirrors()) else { return Vec::new() };
    let slots = m.slots.read().expect("slots");
    slots
        .values()
        .filter_map(|s| match s {
            Slot::Serving { ns, .. } => Some(ns.clone()),
            _ => None,
        })
        .collect()
}

/// Makes node `k` stop at `op:step` of a cross-node operation of any
/// namespace it serves now (until it restarts).
pub fn arm(world: &MetaWorld, k: usize, op_step: String) {
    let halt = world.slot(k).halt.clone();
    let served = serving(world, k);
    if !served.is_empty() {
        world.trace(format_args!("n{k} armed to crash at {op_step}"));
    }
    for ns in served {
        ns.set_crash_hook(CrashHook::Halt(op_step.clone(), halt.clone()));
    }
}

/// Turns the crash hooks of every running node off.
pub fn disarm_all(world: &MetaWorld) {
    for k in world.node_ids() {
        for ns in serving(world, k) {
            ns.set_crash_hook(CrashHook::Off);
        }
    }
}

/// Crashes node `k` and starts it again after `delay`.
pub async fn crash_and_restart(world: Arc<MetaWorld>, k: usize, boot: Option<u32>, why: &str, delay: Duration) {
    if world.crash(k, boot, why).await {
        tokio::time::sleep(delay).await;
        start(&world, k);
    }
}
