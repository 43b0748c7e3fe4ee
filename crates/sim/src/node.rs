//! A metadata node's life: start (open the store, join the network, read
//! its pending intents and recover them in a task, as `hivefs meta` does),
//! crash (every task running its code stops where it is: what it committed
//! stays, nothing after happens) and restart after a delay.
//!
//! A crash at a protocol step arms `CrashHook::Halt("op:step")`: the task
//! that reaches the step stops there for good and a watcher crashes the
//! whole node.

use crate::net::{SimPeers, World};
use hivefs_meta::cross::CrashHook;
use hivefs_meta::targets::{BoxFut, DataTargets};
use hivefs_meta::writer::CommitLatency;
use hivefs_meta::{Namespace, NamespaceOptions};
use hivefs_types::attr::Timespec;
use hivefs_types::error::FsResult;
use hivefs_types::ids::{EntryId, NodeId, PoolId, TargetId};
use rand::Rng;
use std::sync::Arc;
use std::time::Duration;

/// Operations and steps of the cross-node protocol (see `CrashHook`).
pub const OPS: [&str; 6] = ["mkdir", "rmdir", "rename", "link", "unlink", "exchange"];
pub const STEPS: [&str; 4] = ["intent", "peer", "remote", "commit"];

/// One storage target whose chunk operations always succeed: files get a
/// pattern, and no chunk file is ever written.
pub(crate) struct OneTarget;

impl DataTargets for OneTarget {
    fn candidates(&self, _pool: PoolId) -> Vec<(TargetId, NodeId, u64)> {
        vec![(TargetId(1), NodeId(100), 1 << 40)]
    }
    fn truncate_chunk(&self, _t: hivefs_types::pattern::StripeUnit, _e: EntryId, _len: u64) -> BoxFut<FsResult<()>> {
        Box::pin(async { Ok(()) })
    }
    fn unlink_chunk(&self, _t: hivefs_types::pattern::StripeUnit, _e: EntryId) -> BoxFut<FsResult<()>> {
        Box::pin(async { Ok(()) })
    }
}

/// Journal bytes after which a simulated node checkpoints.
const CHECKPOINT_BYTES: u64 = 4096;

/// Starts node `n` on its data dir: what `hivefs meta` does before and
/// after it starts serving (pending intents are read first; their
/// recovery runs as a task of the node).
pub fn start(world: &Arc<World>, n: NodeId) {
    let seed = world.rng().gen::<u64>();
    let w = Arc::downgrade(world);
    let latency: CommitLatency = Arc::new(move || match w.upgrade() {
        Some(w) if !w.is_calm() && w.chance(w.faults.commit_latency) => w.ms(w.faults.commit_ms),
        _ => Duration::ZERO,
    });
    let w = Arc::downgrade(world);
    let clock = Arc::new(move || {
        let ms = w.upgrade().map_or(0, |w| w.elapsed_ms());
        Timespec { sec: 1_700_000_000 + (ms / 1000) as i64, nsec: (ms % 1000) as u32 * 1_000_000 }
    });
    let mut slot = world.slot(n);
    assert!(slot.ns.is_none(), "node {n} is already running");
    let opts = NamespaceOptions {
        dir: slot.dir.path().to_path_buf(),
        sync: false,
        node: n,
        seed: Some(seed),
        clock: Some(clock),
        min_free_bytes: 0,
        inline_writer: Some(latency),
    };
    let mut store = hivefs_meta::store::Store::open(&opts.dir.join(hivefs_meta::namespace::DB_FILE), false)
        .expect("opening a simulated metadata store");
    // Checkpoints every few batches (the service starts one at 16 MiB of
    // journal), so that restarts replay a journal over a checkpoint, not
    // the whole history. (They run inside a commit here: a crash lands
    // between checkpoints, never inside one; the mount tests cover that.)
    store.log.checkpoint_bytes = CHECKPOINT_BYTES;
    let ns =
        Arc::new(Namespace::from_store(store, opts, Arc::new(OneTarget)).expect("opening a simulated metadata store"));
    ns.set_peers(Arc::new(SimPeers { world: Arc::downgrade(world), me: n, all: world.node_ids() }));
    let pending = ns.load_pending().expect("reading pending intents");
    slot.boot += 1;
    slot.halt = Arc::default();
    world.trace(format_args!("n{n} up, boot {}, {} pending intents", slot.boot, pending.len()));
    slot.ns = Some(ns.clone());
    let boot = slot.boot;
    let halt = slot.halt.clone();
    let w = world.clone();
    slot.watcher = Some(tokio::spawn(async move {
        halt.notified().await;
        w.trace(format_args!("n{n} halted at its crash step"));
        w.stat(|s| s.step_crashes += 1);
        let delay = w.ms(w.faults.restart_ms);
        let again = tokio::spawn(crash_and_restart(w.clone(), n, Some(boot), "crash step", delay));
        w.restarts.lock().expect("restarts lock").push(again);
    }));
    drop(slot);
    if !pending.is_empty() {
        let _ = world.spawn_on(n, move |ns| async move {
            ns.recover_intents(pending).await;
            Ok(hivefs_proto::Reply::Ok)
        });
    }
}

/// Makes node `n` halt at `op:step` (until it restarts).
pub fn arm(world: &World, n: NodeId, op_step: String) {
    let slot = world.slot(n);
    if let Some(ns) = &slot.ns {
        world.trace(format_args!("n{n} armed to crash at {op_step}"));
        ns.set_crash_hook(CrashHook::Halt(op_step, slot.halt.clone()));
    }
}

/// Turns the crash hook of every running node off.
pub fn disarm_all(world: &World) {
    for n in world.node_ids() {
        if let Some(ns) = world.ns(n) {
            ns.set_crash_hook(CrashHook::Off);
        }
    }
}

/// Crashes node `n` (of boot `boot`, if given): every task running its
/// code stops, then the store is closed as the process exit would leave
/// it. False if it was not running (or runs another boot).
pub async fn crash(world: &Arc<World>, n: NodeId, boot: Option<u32>, why: &str) -> bool {
    let (ns, tasks, watcher) = {
        let mut slot = world.slot(n);
        if slot.ns.is_none() || boot.is_some_and(|b| b != slot.boot) {
            return false;
        }
        (slot.ns.take(), std::mem::take(&mut slot.tasks), slot.watcher.take())
    };
    world.trace(format_args!("n{n} crashes ({why})"));
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
                world.violation(format!("a task of metadata node {n} panicked: {e}"));
            }
        }
    }
    let mut ns = ns.expect("checked above");
    for _ in 0..10_000 {
        match Arc::try_unwrap(ns) {
            Ok(done) => {
                done.close();
                return true;
            }
            Err(still) => {
                ns = still;
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
    }
    world.violation(format!("metadata node {n} is still referenced 10 s after its crash"));
    false
}

/// Crashes node `n` and starts it again after `delay`.
pub async fn crash_and_restart(world: Arc<World>, n: NodeId, boot: Option<u32>, why: &str, delay: Duration) {
    if crash(&world, n, boot, why).await {
        tokio::time::sleep(delay).await;
        start(&world, n);
    }
}
