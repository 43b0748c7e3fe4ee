//! A storage node's life: start (the real service on its directories,
//! registering with mgmtd over the simulated network, retried as a service
//! manager would), crash (every task running its code stops where it is:
//! what reached its files stays) and restart after a delay.

use crate::buddy::world::{self, Ep, World, HEARTBEAT_MS, MGMTD};
use hivefs_storage::{Config, Net};
use std::sync::Arc;
use std::time::Duration;

/// Starts node `k` as a task of the node: it is up (takes requests) once
/// its service has registered.
pub fn start(world: &Arc<World>, k: usize) {
    let (dir, targets, boot) = {
        let mut slot = world.slot(k);
        assert!(slot.svc.is_none(), "storage node s{k} is already running");
        slot.boot += 1;
        slot.halt = Arc::default();
        let (halt, boot, w) = (slot.halt.clone(), slot.boot, world.clone());
        slot.watcher = Some(tokio::spawn(async move {
            halt.notified().await;
            w.trace(format_args!("s{k} halted at its crash step"));
            w.stat(|s| s.step_crashes += 1);
            let delay = w.ms(w.faults.restart_ms);
            let again = tokio::spawn(crash_and_restart(w.clone(), k, Some(boot), "crash step", delay));
            w.restarts.lock().expect("restarts lock").push(again);
        }));
        (slot.dir.clone(), slot.targets.clone(), slot.boot)
    };
    world.trace(format_args!("s{k} starts, boot {boot}"));
    let cfg = Config {
        dir,
        targets,
        listen: "simulated".into(),
        advertise: Some(format!("s{k}")),
        mgmtd: MGMTD.into(),
        heartbeat_interval_ms: HEARTBEAT_MS,
        short_circuit: false,
        ..Config::default()
    };
    let pools = world::pools(world, Ep::Node(k));
    let w = Arc::downgrade(world);
    world.spawn_on(k, async move {
        loop {
            let r = hivefs_storage::start_with(cfg.clone(), Net::Pools(pools.clone())).await;
            let Some(w) = w.upgrade() else { return };
            match r {
                Ok(svc) => {
                    w.trace(format_args!("s{k} up, boot {boot}, node {}", svc.node_id));
                    w.slot(k).svc = Some(Arc::new(svc));
                    return;
                }
                Err(e) => {
                    w.trace(format_args!("s{k} start failed ({e}); again in 1 s"));
                    drop(w);
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    });
}

/// Whether node `k` runs or starts (of boot `boot`, if given).
fn alive(world: &World, k: usize, boot: Option<u32>) -> bool {
    let slot = world.slot(k);
    let starting = slot.tasks.iter().any(|t| !t.is_finished());
    (slot.svc.is_some() || starting) && boot.is_none_or(|b| b == slot.boot)
}

/// Crashes node `k` (of boot `boot`, if given): every task running its
/// code stops, then the service is dropped. False if it was not running.
pub async fn crash(world: &Arc<World>, k: usize, boot: Option<u32>, why: &str) -> bool {
    if !alive(world, k, boot) {
        return false;
    }
    let (svc, tasks, watcher) = {
        let mut slot = world.slot(k);
        (slot.svc.take(), std::mem::take(&mut slot.tasks), slot.watcher.take())
    };
    world.trace(format_args!("s{k} crashes ({why})"));
    world.stat(|s| s.crashes += 1);
    if let Some(w) = watcher {
        w.abort();
    }
    for t in &tasks {
        t.abort();
    }
    for t in tasks {
        if let Err(e) = t.await {
            if e.is_panic() {
                world.violation(format!("a task of storage node s{k} panicked: {e}"));
            }
        }
    }
    // Dropping the service stops its heartbeats and mirroring tasks.
    drop(svc);
    true
}

/// Makes node `k` stop at `step` of the mirroring protocol (this boot).
pub fn arm(world: &World, k: usize, step: &str) {
    let slot = world.slot(k);
    if let Some(svc) = &slot.svc {
        world.trace(format_args!("s{k} armed to crash at {step}"));
        svc.halt_at(step, slot.halt.clone());
    }
}

/// Crashes node `k` and starts it again after `delay`.
pub async fn crash_and_restart(world: Arc<World>, k: usize, boot: Option<u32>, why: &str, delay: Duration) {
    if crash(&world, k, boot, why).await {
        tokio::time::sleep(delay).await;
        start(&world, k);
    }
}
