//! One seed of the buddy-mirroring simulation, from set-up to verdict: the
//! shape drawn from the seed (storage nodes, targets, groups, clients), the
//! nodes started and the groups made (calm), then the clients run while a
//! chaos task crashes storage nodes and cuts the servers apart; at the end
//! the network heals, every node restarts once, the groups resync until
//! mgmtd shows both members of each good, and the invariants are checked.

use crate::buddy::client::{Client, File};
use crate::buddy::node;
use crate::buddy::world::StorageWorld as World;
use crate::buddy::{BuddyConfig, BuddyOutcome};
use crate::Failure;
use hivefs_chunk::{ChunkFiles, ChunkStore};
use hivefs_proto::{Consistency, GroupKind, Reply, Request};
use hivefs_types::ids::{BuddyGroupId, EntryId, TargetId};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Longest sim time the clients may take before the run counts as stuck.
const CLIENTS_DEADLINE: Duration = Duration::from_secs(3600);
/// Longest sim time for the nodes to start, or the groups to become good at the end.
const SETTLE_DEADLINE: Duration = Duration::from_secs(600);

/// Runs `seed` on a fresh current-thread runtime in paused time.
pub fn run(seed: u64, cfg: &BuddyConfig) -> Result<BuddyOutcome, Failure> {
    let r = crate::run::paused(hivefs_storage::run_io_in_place_on_this_thread, run_async(seed, cfg));
    r.unwrap_or_else(|why| {
        Err(Failure { seed, violations: vec![why], trace_tail: Vec::new(), replay: crate::buddy::replay_command(seed) })
    })
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

async fn run_async(seed: u64, cfg: &BuddyConfig) -> Result<BuddyOutcome, Failure> {
    // ---- the shape, from the seed
    let (targets, groups_wanted, clients) = {
        let mut r = rand::rngs::StdRng::seed_from_u64(seed ^ 0x4255_4444_5953);
        let nodes = r.gen_range(cfg.nodes.0..=cfg.nodes.1);
        let targets: Vec<usize> = (0..nodes).map(|_| r.gen_range(1..=2)).collect();
        let groups = r.gen_range(1..=cfg.groups_max);
        let clients = r.gen_range(cfg.clients.0..=cfg.clients.1);
        (targets, groups, clients)
    };
    let root = crate::run::temp_dir();
    let dirs = targets
        .iter()
        .enumerate()
        .map(|(k, &n)| {
            let dir = root.path().join(format!("n{}", k + 1));
            let ts: Vec<PathBuf> = (0..n).map(|t| dir.join(format!("target{t}"))).collect();
            for t in &ts {
                std::fs::create_dir_all(t).expect("a target dir");
                hivefs_storage::init_target(t, "sim").expect("formatting a simulated target");
            }
            (dir.join("service"), ts)
        })
        .collect();
    let world = World::new(seed, cfg.faults.clone(), dirs, root, cfg.trace_tail, cfg.echo);
    world.trace(format_args!("seed {seed}: storage nodes with {targets:?} targets, {clients} clients"));
    let fail = |world: &Arc<World>, mut v: Vec<String>| {
        v.extend(world.violations());
        Failure { seed, violations: v, trace_tail: world.trace_tail(), replay: crate::buddy::replay_command(seed) }
    };
    let failover = tokio::spawn(crate::buddy::world::failover_loop(Arc::downgrade(&world)));

    // ---- set-up, calm: nodes up, groups made, every node sees them
    for k in world.node_ids() {
        node::start(&world, k);
    }
    if !settle(SETTLE_DEADLINE, || world.up_nodes().len() == world.nodes.len()).await {
        return Err(fail(&world, vec!["the storage nodes did not start".into()]));
    }
    // (node, target id) of every target, in a seeded order.
    let mut all: Vec<(usize, TargetId)> = world
        .node_ids()
        .into_iter()
        .flat_map(|k| {
            let ids = world.slot(k).svc.as_ref().map(|s| s.targets.clone()).unwrap_or_default();
            ids.into_iter().map(move |t| (k, t))
        })
        .collect();
    all.shuffle(&mut *world.rng());
    let mut groups: Vec<BuddyGroupId> = Vec::new();
    while groups.len() < groups_wanted {
        let Some((k, p)) = all.pop() else { break };
        let Some(pos) = all.iter().position(|(k2, _)| *k2 != k) else { break };
        let (_, s) = all.remove(pos);
        let req = Request::CreateGroup { kind: GroupKind::Storage, primary: p.0, secondary: s.0, force: false };
        let (mut g, now) = world.mgmt();
        match g.handle(req, now) {
            Ok(Reply::GroupCreated { group }) => {
                drop(g);
                world.trace(format_args!("group {group}: primary target {p}, secondary target {s}"));
                groups.push(group);
            }
            r => {
                drop(g);
                return Err(fail(&world, vec![format!("creating a group of targets {p} and {s}: {r:?}")]));
            }
        }
    }
    // Every node looks at the view after each heartbeat.
    tokio::time::sleep(Duration::from_secs(2)).await;

    // ---- clients and chaos
    let mut tasks = Vec::new();
    for c in 0..clients {
        let files: Vec<File> = (0..cfg.files_per_client)
            .map(|f| File {
                group: *groups.choose(&mut *world.rng()).expect("a group"),
                entry: EntryId { node: 1, epoch: 1, counter: (c * 100 + f + 1) as u64 },
                data: Vec::new(),
            })
            .collect();
        let client = Client::new(world.clone(), c, files);
        tasks.push(tokio::spawn(client.run(cfg.ops_per_client)));
    }
    world.set_calm(false);
    let stop = Arc::new(AtomicBool::new(false));
    let arm = |w: &World, k| {
        let step = *hivefs_storage::MIRROR_STEPS.choose(&mut *w.rng()).expect("steps");
        node::arm(w, k, step);
    };
    let restart = |w, k, delay| node::crash_and_restart(w, k, None, "chaos", delay);
    let chaos = tokio::spawn(crate::buddy::world::chaos(world.clone(), stop.clone(), restart, arm));
    let Some(done) = crate::net::join_clients(tasks, CLIENTS_DEADLINE).await else {
        return Err(fail(&world, vec![format!("the clients did not finish within {CLIENTS_DEADLINE:?}")]));
    };
    let files: Vec<File> = done.into_iter().flat_map(|c| c.files).collect();
    stop.store(true, Ordering::SeqCst);
    chaos.await.expect("the chaos task panicked");

    // ---- the end: heal, restart every node once, let the groups resync
    world.trace("end: network healed, every node restarts");
    world.set_calm(true);
    crate::net::await_all(&world.restarts).await;
    for k in world.node_ids() {
        node::crash_and_restart(world.clone(), k, None, "final restart", Duration::ZERO).await;
        if world.slot(k).svc.is_none() && !world.slot(k).tasks.iter().any(|t| !t.is_finished()) {
            node::start(&world, k);
        }
    }
    let mut problems = Vec::new();
    let good = settle(SETTLE_DEADLINE, || {
        if world.up_nodes().len() < world.nodes.len() {
            return false;
        }
        let (g, _) = world.mgmt();
        g.list_groups(Some(GroupKind::Storage))
            .iter()
            .all(|i| i.primary_state == Consistency::Good && i.secondary_state == Consistency::Good)
    })
    .await;
    if !good {
        let (g, _) = world.mgmt();
        let states: Vec<String> = g
            .list_groups(Some(GroupKind::Storage))
            .iter()
            .map(|i| format!("group {}: {:?}/{:?}", i.id, i.primary_state, i.secondary_state))
            .collect();
        problems.push(format!("the groups did not all become good within {SETTLE_DEADLINE:?}: {states:?}"));
    }
    problems.extend(check(&world, &files));
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
    Ok(BuddyOutcome {
        seed,
        nodes: targets.len(),
        groups: groups.len(),
        clients,
        trace_hash,
        trace_lines,
        sim_ms,
        stats,
    })
}

/// The mirrored chunk files of a target, read from its disk: entry ->
/// bytes (an empty file counts as none: a missing chunk file reads as empty).
fn contents(dir: PathBuf, target: TargetId) -> Result<BTreeMap<EntryId, Vec<u8>>, String> {
    let store = ChunkStore::new(target, &dir.join("mirror"));
    let mut out = BTreeMap::new();
    let mut after = None;
    loop {
        let (page, more) = store.list(after, 4096).map_err(|e| format!("listing target {target}: {e}"))?;
        for (e, len) in &page {
            let data = store.read(*e, 0, *len as u32).map_err(|x| format!("reading target {target}: {x}"))?;
            if !data.is_empty() {
                out.insert(*e, data);
            }
        }
        after = page.last().map(|(e, _)| *e);
        if !more {
            return Ok(out);
        }
    }
}

/// The end-of-run checks: both members of every group hold the same
/// mirrored chunk files, and the primary's are what the clients' models say.
fn check(world: &World, files: &[File]) -> Vec<String> {
    let mut problems = Vec::new();
    let mut dir_of = BTreeMap::new();
    for k in world.node_ids() {
        let slot = world.slot(k);
        if let Some(svc) = &slot.svc {
            for (t, d) in svc.targets.iter().zip(&slot.targets) {
                dir_of.insert(*t, d.clone());
            }
        }
    }
    let groups = world.mgmt().0.list_groups(Some(GroupKind::Storage));
    for g in &groups {
        let (p, s) = (TargetId(g.primary), TargetId(g.secondary));
        let (Some(pd), Some(sd)) = (dir_of.get(&p), dir_of.get(&s)) else {
            problems.push(format!("group {}: a member's node is not running at the end", g.id));
            continue;
        };
        let (pc, sc) = match (contents(pd.clone(), p), contents(sd.clone(), s)) {
            (Ok(a), Ok(b)) => (a, b),
            (a, b) => {
                problems.push(format!("group {}: {:?} {:?}", g.id, a.err(), b.err()));
                continue;
            }
        };
        for e in pc.keys().chain(sc.keys()).collect::<std::collections::BTreeSet<_>>() {
            let (a, b) = (pc.get(e), sc.get(e));
            if a != b {
                problems.push(format!(
                    "group {} (epoch {}): chunk {e} differs: primary target {p} has {:?} bytes, secondary target {s} has {:?}",
                    g.id,
                    g.epoch,
                    a.map(Vec::len),
                    b.map(Vec::len)
                ));
            }
        }
        for f in files.iter().filter(|f| f.group == g.id) {
            let got = pc.get(&f.entry).cloned().unwrap_or_default();
            if got != f.data {
                let first = got.iter().zip(&f.data).position(|(a, b)| a != b);
                problems.push(format!(
                    "group {}: chunk {} on primary target {p} has {} bytes, the client's model {} (first difference at {first:?})",
                    g.id,
                    f.entry,
                    got.len(),
                    f.data.len()
                ));
            }
        }
    }
    problems
}
