//! A storage node's life: start (the real service on its directories,
//! registering with mgmtd over the simulated network, retried as a service
//! manager would), crash (every task running its code stops where it is:
//! what reached its files stays) and restart after a delay.

use crate::buddy::disk::FailingDisk;
use crate::buddy::world::{self, Ep, StorageWorld as World, HEARTBEAT_MS, MGMTD};
use hivefs_storage::{Config, Disk, Net};
use std::sync::Arc;
use std::time::Duration;

/// Starts node `k` as a task of the node: it is up (takes requests) once
/// its service has registered.
pub fn start(world: &Arc<World>, k: usize) {
    let (dir, boot) = world.next_boot(k, |w, k, boot, delay| crash_and_restart(w, k, Some(boot), "crash step", delay));
    let targets = world.slot(k).targets.clone();
    world.trace(format_args!("n{k} starts, boot {boot}"));
    let cfg = Config {
        dir,
        targets,
        listen: "simulated".into(),
        advertise: Some(format!("n{k}")),
        mgmtd: MGMTD.into(),
        heartbeat_interval_ms: HEARTBEAT_MS,
        short_circuit: false,
        ..Config::default()
    };
    let pools = world::pools(world, Ep::Node(k));
    let disk = Disk::Wrapped(FailingDisk::wrap(world, k));
    world.start_node(k, boot, move || hivefs_storage::start_with(cfg.clone(), Net::Pools(pools.clone()), disk.clone()));
}

/// Makes node `k` stop at `step` of the mirroring protocol (this boot).
pub fn arm(world: &World, k: usize, step: &str) {
    let slot = world.slot(k);
    if let Some(svc) = &slot.svc {
        world.trace(format_args!("n{k} armed to crash at {step}"));
        svc.halt_at(step, slot.halt.clone());
    }
}

/// Crashes node `k` and starts it again after `delay`.
pub async fn crash_and_restart(world: Arc<World>, k: usize, boot: Option<u32>, why: &str, delay: Duration) {
    if world.crash(k, boot, why).await {
        tokio::time::sleep(delay).await;
        start(&world, k);
    }
}
