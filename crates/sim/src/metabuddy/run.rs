//! One seed of the metadata buddy-mirroring simulation, from set-up to
//! verdict: the shape drawn from the seed (metadata nodes, clients, the
//! root's chooser of metadata nodes), the nodes started, a ring of groups
//! made (each node's namespace mirrored on the next node) and resynced, the
//! clients' subtrees made (calm); then the clients run while a chaos task
//! crashes nodes and mgmtd and cuts the servers apart; at the end the
//! network heals, every node restarts once, the groups resync until mgmtd
//! shows both members of each good, and the invariants are checked.

use crate::buddy::world::{self, failover_loop, Ep, World, MGMTD};
use crate::client::{Client, Route};
use crate::invariants;
use crate::metabuddy::node::{self, MetaWorld};
use crate::metabuddy::{MetaBuddyConfig, MetaBuddyOutcome};
use crate::model::Model;
use crate::net::{Core, Stats};
use crate::node::{OPS, STEPS};
use crate::Failure;
use hivefs_cluster::Cluster;
use hivefs_meta::mirror::Slot;
use hivefs_meta::Namespace;
use hivefs_proto::{Caller, Consistency, Envelope, GroupKind, MetaChooser, Reply, Request, Response};
use hivefs_types::ids::{EntryId, NodeId};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Longest sim time the clients may take before the run counts as stuck.
const CLIENTS_DEADLINE: Duration = Duration::from_secs(3600);
/// Longest sim time for the nodes to start, or the groups to become good.
const SETTLE_DEADLINE: Duration = Duration::from_secs(600);
/// Time one attempt of a client's request may take (`Cluster::call_meta`'s
/// budget: retried across a switch-over within it).
const CALL_BUDGET: Duration = Duration::from_secs(3);

/// Runs `seed` on a fresh current-thread runtime in paused time.
pub fn run(seed: u64, cfg: &MetaBuddyConfig) -> Result<MetaBuddyOutcome, Failure> {
    let r = crate::run::paused(hivefs_meta::store::run_blocking_in_place_on_this_thread, run_async(seed, cfg));
    r.unwrap_or_else(|why| {
        Err(Failure {
            seed,
            violations: vec![why],
            trace_tail: Vec::new(),
            replay: crate::metabuddy::replay_command(seed),
        })
    })
}

/// The clients' side of the world: one `Cluster` (a mount's routing) each.
struct Clients {
    world: Arc<MetaWorld>,
    mounts: Vec<Arc<Cluster>>,
}

impl std::ops::Deref for Clients {
    type Target = Core;

    fn deref(&self) -> &Core {
        &self.world
    }
}

impl Route for Clients {
    fn stat(&self, f: impl FnOnce(&mut Stats)) {
        self.world.stat(f)
    }

    async fn send(world: Arc<Clients>, client: usize, to: NodeId, env: Envelope, req: Request) -> Response {
        world.mounts[client].call_meta(to, &env, &req, CALL_BUDGET).await
    }
}

/// Waits until `done` holds, checking every 100 ms, for at most `limit`.
async fn settle(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    tokio::time::timeout(limit, async {
        while !done() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .is_ok()
}

/// Every metadata group has both members good, in mgmtd's view.
fn groups_good(world: &MetaWorld) -> bool {
    let (g, _) = world.mgmt();
    g.list_groups(Some(GroupKind::Meta))
        .iter()
        .all(|i| i.primary_state == Consistency::Good && i.secondary_state == Consistency::Good)
}

fn group_states(world: &MetaWorld) -> Vec<String> {
    let (g, _) = world.mgmt();
    g.list_groups(Some(GroupKind::Meta))
        .iter()
        .map(|i| {
            format!(
                "group {} (namespace {:?}, epoch {}): primary {} {:?}, secondary {} {:?}",
                i.id, i.serves, i.epoch, i.primary, i.primary_state, i.secondary, i.secondary_state
            )
        })
        .collect()
}

/// The namespace of node `n`, wherever it is served.
fn served(world: &MetaWorld, n: NodeId) -> Option<Arc<Namespace>> {
    world.node_ids().into_iter().flat_map(|k| node::serving(world, k)).find(|ns| ns.node() == n)
}

async fn run_async(seed: u64, cfg: &MetaBuddyConfig) -> Result<MetaBuddyOutcome, Failure> {
    // ---- the shape, from the seed
    let (nodes, clients, chooser) = {
        let mut r = rand::rngs::StdRng::seed_from_u64(seed ^ 0x4d42_5544_4459);
        let nodes = r.gen_range(cfg.nodes.0..=cfg.nodes.1);
        let clients = r.gen_range(cfg.clients.0..=cfg.clients.1);
        let chooser = [MetaChooser::Random, MetaChooser::RoundRobin, MetaChooser::Balanced][r.gen_range(0..3)];
        (nodes, clients, chooser)
    };
    let root = crate::run::temp_dir();
    let dirs = (1..=nodes).map(|k| (root.path().join(format!("n{k}")), Vec::new())).collect();
    let world: Arc<MetaWorld> = World::new(seed, cfg.faults.clone(), dirs, root, cfg.trace_tail, cfg.echo);
    world.trace(format_args!("seed {seed}: {nodes} metadata nodes, {clients} clients, chooser {chooser:?}"));
    let fail = |world: &Arc<MetaWorld>, mut v: Vec<String>| {
        v.extend(world.violations());
        Failure { seed, violations: v, trace_tail: world.trace_tail(), replay: crate::metabuddy::replay_command(seed) }
    };
    let failover = tokio::spawn(failover_loop(Arc::downgrade(&world)));

    // ---- set-up, calm: nodes up, a ring of groups made and resynced
    for k in world.node_ids() {
        node::start(&world, k);
    }
    if !settle(SETTLE_DEADLINE, || world.up_nodes().len() == nodes).await {
        return Err(fail(&world, vec!["the metadata nodes did not start".into()]));
    }
    let ids: Vec<NodeId> =
        world.node_ids().into_iter().map(|k| world.slot(k).svc.as_ref().expect("up").node_id).collect();
    for i in 0..nodes {
        let (p, s) = (ids[i], ids[(i + 1) % nodes]);
        let req = Request::CreateGroup { kind: GroupKind::Meta, primary: p.0, secondary: s.0, force: true };
        let (mut g, now) = world.mgmt();
        match g.handle(req, now) {
            Ok(Reply::GroupCreated { group }) => {
                drop(g);
                world.trace(format_args!("group {group}: namespace of node {p}, copy on node {s}"));
            }
            r => {
                drop(g);
                return Err(fail(&world, vec![format!("creating the group of nodes {p} and {s}: {r:?}")]));
            }
        }
    }
    if !settle(SETTLE_DEADLINE, || groups_good(&world)).await {
        let why = format!("the groups did not become good after their creation: {:?}", group_states(&world));
        return Err(fail(&world, vec![why]));
    }
    let root_owner = match world.mgmt().0.handle(Request::GetRootOwner, tokio::time::Instant::now().into_std()) {
        Ok(Reply::RootOwner(Some(n))) => n,
        r => return Err(fail(&world, vec![format!("mgmtd names no root owner: {r:?}")])),
    };
    let setup = Cluster::new(MGMTD, world::pools(&world, Ep::Client(clients)));
    let env = Envelope::default();
    let req = Request::SetMetaChooser { id: EntryId::ROOT, chooser };
    if let Err(e) = setup.call_meta(root_owner, &env, &req, CALL_BUDGET).await {
        return Err(fail(&world, vec![format!("setting the root's chooser: {e}")]));
    }
    let mut models = Vec::new();
    for k in 0..clients {
        let label = format!("c{k}");
        let name = label.clone().into_bytes();
        let req = Request::Mkdir { parent: EntryId::ROOT, name, mode: 0o755, caller: Caller::default() };
        match setup.call_meta(root_owner, &env, &req, CALL_BUDGET).await {
            Ok(Reply::Entry(a)) => models.push(Model::new(label, a.id, a.owner)),
            r => return Err(fail(&world, vec![format!("making /{label}: {r:?}")])),
        }
    }
    drop(setup);

    // ---- clients and chaos
    let mounts = (0..clients).map(|k| Cluster::new(MGMTD, world::pools(&world, Ep::Client(k)))).collect();
    let route = Arc::new(Clients { world: world.clone(), mounts });
    world.set_calm(false);
    let stop = Arc::new(AtomicBool::new(false));
    let arm = |w: &MetaWorld, k| {
        let (op, step) = {
            let mut r = w.rng();
            (*OPS.choose(&mut *r).expect("ops"), *STEPS.choose(&mut *r).expect("steps"))
        };
        node::arm(w, k, format!("{op}:{step}"));
    };
    let restart = |w, k, delay| node::crash_and_restart(w, k, None, "chaos", delay);
    let chaos = tokio::spawn(world::chaos(world.clone(), stop.clone(), restart, arm));
    let mut tasks = Vec::new();
    for (k, m) in models.into_iter().enumerate() {
        let c = Client::new(route.clone(), k, m);
        tasks.push(tokio::spawn(c.run(cfg.ops_per_client)));
    }
    let Some(done) = crate::net::join_clients(tasks, CLIENTS_DEADLINE).await else {
        return Err(fail(&world, vec![format!("the clients did not finish within {CLIENTS_DEADLINE:?}")]));
    };
    let models: Vec<Model> = done.into_iter().map(|c| c.model).collect();
    stop.store(true, Ordering::SeqCst);
    chaos.await.expect("the chaos task panicked");
    drop(route);

    // ---- the end: heal, restart every node once, let the groups resync
    world.trace("end: network healed, every node restarts");
    world.set_calm(true);
    node::disarm_all(&world);
    crate::net::await_all(&world.restarts).await;
    if !world.mgmt_is_up() {
        world.restart_mgmt();
    }
    for k in world.node_ids() {
        node::crash_and_restart(world.clone(), k, None, "final restart", Duration::ZERO).await;
        if !world.alive(k, None) {
            node::start(&world, k);
        }
    }
    let mut problems = Vec::new();
    let settled = settle(SETTLE_DEADLINE, || {
        world.up_nodes().len() == nodes
            && groups_good(&world)
            && ids.iter().all(|&n| served(&world, n).is_some_and(|ns| ns.intents_text().is_ok_and(|l| l.is_empty())))
    })
    .await;
    if !settled {
        problems.push(format!(
            "the nodes did not all serve, resync and finish their intents within {SETTLE_DEADLINE:?}: {:?}",
            group_states(&world)
        ));
    }
    let serving = |n: NodeId| served(&world, n);
    let all = invariants::Nodes { ids: ids.clone(), serving: &serving };
    problems.extend(invariants::check(&all, &models).await);
    problems.extend(compare_copies(&world).await);
    let (trace_hash, trace_lines) = world.trace_hash();
    let stats = world.stats.lock().expect("stats lock").clone();
    let sim_ms = world.elapsed_ms();
    failover.abort();
    for k in world.node_ids() {
        world.crash(k, None, "run over").await;
    }
    if !problems.is_empty() || !world.violations().is_empty() {
        for p in &problems {
            world.trace(format_args!("END CHECK {p}"));
        }
        return Err(fail(&world, problems));
    }
    Ok(MetaBuddyOutcome { seed, nodes, clients, trace_hash, trace_lines, sim_ms, stats })
}

/// Both copies of every mirrored namespace hold the same records (the
/// digest comparison `hivefs fsck` asks a primary for).
async fn compare_copies(world: &MetaWorld) -> Vec<String> {
    let mut problems = Vec::new();
    let mut compared = 0;
    for k in world.node_ids() {
        let Some(m) = world.slot(k).svc.as_ref().and_then(|s| s.mirrors()) else { continue };
        let primaries: Vec<_> = m
            .slots
            .read()
            .expect("slots")
            .values()
            .filter_map(|s| match s {
                Slot::Serving { primary: Some(p), .. } => Some(p.clone()),
                _ => None,
            })
            .collect();
        for p in primaries {
            compared += 1;
            if let Err(e) = p.compare().await {
                problems.push(format!("group {} (namespace {}) on n{k}: {e}", p.group, p.ns));
            }
        }
    }
    let groups = world.mgmt().0.list_groups(Some(GroupKind::Meta)).len();
    if compared != groups {
        problems.push(format!("{compared} namespaces are served as a group's primary, mgmtd has {groups} groups"));
    }
    problems
}
