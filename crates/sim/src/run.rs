//! One seed, from set-up to verdict: the shape of the cluster drawn from
//! the seed, the nodes started and the clients' subtrees made (calm), then
//! the clients run while a chaos task crashes nodes (now, or armed at a
//! protocol step), cuts the network and heals it; at the end the network
//! heals, every node restarts once, recovers its intents and goes quiet,
//! and the invariants are checked.

use crate::client::Client;
use crate::invariants;
use crate::model::Model;
use crate::net::{panic_message, World};
use crate::node::{self, OPS, STEPS};
use crate::{Config, Failure, Outcome};
use hivefs_proto::{Caller, MetaChooser, Reply, Request};
use hivefs_types::ids::{EntryId, NodeId};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Longest sim time the clients may take before the run counts as stuck.
const CLIENTS_DEADLINE: Duration = Duration::from_secs(3600);
/// Longest sim time the nodes may take to go quiet at the end.
const QUIET_DEADLINE: Duration = Duration::from_secs(600);

pub(crate) fn temp_dir() -> tempfile::TempDir {
    // Memory-backed where there is one: a run writes its stores many times.
    let shm = std::path::Path::new("/dev/shm");
    let b = tempfile::Builder::new().prefix("hivefs-sim-").tempdir_in(shm);
    b.or_else(|_| tempfile::Builder::new().prefix("hivefs-sim-").tempdir()).expect("a temporary directory")
}

/// Runs `seed`; a panic (of the simulation or of node code outside a
/// node's tasks) is a failure of that seed too.
pub fn run(seed: u64, cfg: &Config) -> Result<Outcome, Failure> {
    paused(|_| {}, run_async(seed, cfg)).unwrap_or_else(|why| {
        Err(Failure { seed, violations: vec![why], trace_tail: Vec::new(), replay: crate::replay_command(seed) })
    })
}

/// Runs `fut` on a fresh current-thread runtime in paused time, with
/// `in_place(true)` set meanwhile (a service's switch that keeps its
/// blocking work on this thread, so no other thread decides an order); a
/// panic comes back as its message.
pub(crate) fn paused<T>(in_place: fn(bool), fut: impl std::future::Future<Output = T>) -> Result<T, String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime");
    in_place(true);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| rt.block_on(fut)));
    in_place(false);
    r.map_err(|panic| format!("the simulation panicked: {}", panic_message(&*panic)))
}

async fn run_async(seed: u64, cfg: &Config) -> Result<Outcome, Failure> {
    let (nodes, clients, chooser) = {
        let mut r = rand::rngs::StdRng::seed_from_u64(seed ^ 0x5348_4150_4553);
        let nodes = r.gen_range(cfg.nodes.0..=cfg.nodes.1);
        let clients = r.gen_range(cfg.clients.0..=cfg.clients.1);
        let chooser = [MetaChooser::Random, MetaChooser::RoundRobin, MetaChooser::Balanced][r.gen_range(0..3)];
        (nodes, clients, chooser)
    };
    let dirs = (0..nodes).map(|_| temp_dir()).collect();
    let world = World::new(seed, cfg.faults.clone(), dirs, cfg.trace_tail, cfg.echo);
    world.trace(format_args!("seed {seed}: {nodes} metadata nodes, {clients} clients, chooser {chooser:?}"));
    let fail = |world: &Arc<World>, mut v: Vec<String>| {
        v.extend(world.violations());
        Failure { seed, violations: v, trace_tail: world.trace_tail(), replay: crate::replay_command(seed) }
    };

    // ---- set-up, calm
    for n in world.node_ids() {
        node::start(&world, n);
    }
    let n1 = world.ns(NodeId(1)).expect("node 1 runs");
    n1.ensure_root().await.map_err(|e| fail(&world, vec![format!("creating the root: {e}")]))?;
    n1.handle(Request::SetMetaChooser { id: EntryId::ROOT, chooser })
        .await
        .map_err(|e| fail(&world, vec![format!("setting the root's chooser: {e}")]))?;
    let mut models = Vec::new();
    for k in 0..clients {
        let label = format!("c{k}");
        let req = Request::Mkdir {
            parent: EntryId::ROOT,
            name: label.clone().into_bytes(),
            mode: 0o755,
            caller: Caller::default(),
        };
        match n1.handle(req).await {
            Ok(Reply::Entry(a)) => models.push(Model::new(label, a.id, a.owner)),
            r => return Err(fail(&world, vec![format!("making /{label}: {r:?}")])),
        }
    }
    drop(n1);

    // ---- clients and chaos
    world.set_calm(false);
    let stop = Arc::new(AtomicBool::new(false));
    let chaos = tokio::spawn(chaos(world.clone(), stop.clone()));
    let mut tasks = Vec::new();
    for (k, m) in models.into_iter().enumerate() {
        let c = Client::new(world.clone(), k, m);
        tasks.push(tokio::spawn(c.run(cfg.ops_per_client)));
    }
    let Some(done) = crate::net::join_clients(tasks, CLIENTS_DEADLINE).await else {
        return Err(fail(&world, vec![format!("the clients did not finish within {CLIENTS_DEADLINE:?}")]));
    };
    let models: Vec<Model> = done.into_iter().map(|c| c.model).collect();
    stop.store(true, Ordering::SeqCst);
    chaos.await.expect("the chaos task panicked");

    // ---- the end: heal, restart everything once, recover, go quiet
    world.trace("end: network healed, every node restarts");
    world.set_calm(true);
    node::disarm_all(&world);
    crate::net::await_all(&world.restarts).await;
    for n in world.node_ids() {
        if world.ns(n).is_none() {
            node::start(&world, n);
        }
    }
    for n in world.node_ids() {
        node::crash_and_restart(world.clone(), n, None, "final restart", Duration::ZERO).await;
    }
    let quiet = tokio::time::timeout(QUIET_DEADLINE, async {
        loop {
            let busy = world.node_ids().into_iter().any(|n| world.slot(n).tasks.iter().any(|t| !t.is_finished()));
            if !busy {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    let mut problems = Vec::new();
    if quiet.is_err() {
        problems.push(format!("the nodes did not go quiet within {QUIET_DEADLINE:?} after the final restart"));
    }
    let serving = |n: NodeId| world.ns(n);
    let all = invariants::Nodes { ids: world.node_ids(), serving: &serving };
    problems.extend(invariants::check(&all, &models).await);
    let (trace_hash, trace_lines) = world.trace_hash();
    let stats = world.stats.lock().expect("stats lock").clone();
    let sim_ms = world.elapsed_ms();
    for n in world.node_ids() {
        node::crash(&world, n, None, "run over").await;
    }
    if !problems.is_empty() || !world.violations().is_empty() {
        for p in &problems {
            world.trace(format_args!("END CHECK {p}"));
        }
        return Err(fail(&world, problems));
    }
    Ok(Outcome { seed, nodes, clients, trace_hash, trace_lines, sim_ms, stats })
}

/// Until `stop`: every so often, crash a node now, arm one to crash at a
/// protocol step, or cut the network for a while.
async fn chaos(world: Arc<World>, stop: Arc<AtomicBool>) {
    let f = world.faults.clone();
    loop {
        let wait = world.ms(f.chaos_every_ms);
        tokio::time::sleep(wait).await;
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let total = f.crash_now + f.crash_at_step + f.partition + f.nothing;
        let roll = world.rng().gen_range(0..total.max(1));
        let up = world.up_nodes();
        if roll < f.crash_now {
            let Some(&n) = up.choose(&mut *world.rng()) else { continue };
            let delay = world.ms(f.restart_ms);
            let h = tokio::spawn(node::crash_and_restart(world.clone(), n, None, "chaos", delay));
            world.restarts.lock().expect("restarts lock").push(h);
        } else if roll < f.crash_now + f.crash_at_step {
            let (n, op, step) = {
                let mut r = world.rng();
                let Some(&n) = up.choose(&mut *r) else { continue };
                (n, *OPS.choose(&mut *r).expect("ops"), *STEPS.choose(&mut *r).expect("steps"))
            };
            node::arm(&world, n, format!("{op}:{step}"));
        } else if roll < f.crash_now + f.crash_at_step + f.partition {
            let all = world.node_ids();
            let side: Vec<NodeId> = {
                let mut r = world.rng();
                let k = r.gen_range(1..all.len().max(2));
                all.choose_multiple(&mut *r, k).copied().collect()
            };
            let dur = world.ms(f.partition_ms);
            world.partition(side, dur);
        }
    }
}
