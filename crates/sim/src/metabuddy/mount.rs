//! The real client library (`hivefs_client::Client`, what the mount and
//! `bench md --native` run) over the simulated network: two metadata nodes
//! (unmirrored) and mgmtd, messages lost, delayed, delivered late and their
//! answers lost, no crashes. The client's own retries (operation ids,
//! `Cluster::call_meta`) must make every operation happen exactly once: a
//! mkdir applied twice answers `Exists`, an unlink applied twice `NotFound`.
//! Directories are spread over both nodes (round-robin), so renames and
//! removals cross nodes.

use crate::buddy::world::{self, failover_loop, Ep, World, MGMTD};
use crate::metabuddy::node::{self, MetaWorld};
use crate::metabuddy::MetaBuddyConfig;
use hivefs_client::{Client, Ent, Options};
use hivefs_proto::{Caller, MetaChooser};
use hivefs_types::error::FsResult;
use hivefs_types::FileKind;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

/// What a run did: the operations, and the messages the network carried.
#[derive(Clone, Debug)]
pub struct MountOutcome {
    pub ops: usize,
    pub messages: u64,
    pub dropped: u64,
    pub replies_lost: u64,
    /// The same for the same seed.
    pub trace_hash: u64,
}

/// Runs the real client for `rounds` rounds of operations on seed `seed`.
pub fn run(seed: u64, rounds: usize) -> Result<MountOutcome, String> {
    let r = crate::run::paused(hivefs_meta::store::run_blocking_in_place_on_this_thread, run_async(seed, rounds));
    r.unwrap_or_else(|why| Err(format!("seed {seed}: {why}")))
}

async fn run_async(seed: u64, rounds: usize) -> Result<MountOutcome, String> {
    let cfg = MetaBuddyConfig::default();
    let root = crate::run::temp_dir();
    let dirs = (1..=2).map(|k| (root.path().join(format!("n{k}")), Vec::new())).collect();
    let world: Arc<MetaWorld> = World::new(seed, cfg.faults.clone(), dirs, root, 200, false);
    let failover = tokio::spawn(failover_loop(Arc::downgrade(&world)));
    for k in world.node_ids() {
        node::start(&world, k);
    }
    let up = tokio::time::timeout(Duration::from_secs(600), async {
        while world.up_nodes().len() < 2 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let fail = |world: &MetaWorld, why: String| {
        let tail = world.trace_tail().join("\n");
        format!("seed {seed}: {why}\nviolations: {:?}\nlast events:\n{tail}", world.violations())
    };
    if up.await.is_err() {
        return Err(fail(&world, "the metadata nodes did not start".into()));
    }
    let net = hivefs_net::Net::Pools(world::repeating_pools(&world, Ep::Client(0)));
    let client = Client::connect_with(Options::new(MGMTD, None), net).await.map_err(|e| fail(&world, e.to_string()))?;
    let root = client.root();
    client.set_meta_chooser(root, MetaChooser::RoundRobin).await.map_err(|e| fail(&world, e.to_string()))?;

    world.set_calm(false);
    let r = exercise(&client, root, rounds).await;
    world.set_calm(true);
    let ops = r.map_err(|e| fail(&world, e))?;
    // Whatever the network did, the tree is what the answers said.
    let names = list(&client, root).await.map_err(|e| fail(&world, format!("listing /: {e}")))?;
    let want: BTreeSet<Vec<u8>> = (0..rounds).map(|i| format!("d{i}").into_bytes()).collect();
    if names != want {
        return Err(fail(&world, format!("/ holds {} names, {} expected: {names:?}", names.len(), want.len())));
    }
    for i in 0..rounds {
        let d =
            Ent::from(&client.lookup(root, format!("d{i}").as_bytes()).await.map_err(|e| fail(&world, e.to_string()))?);
        let names = list(&client, d).await.map_err(|e| fail(&world, format!("listing /d{i}: {e}")))?;
        let want: BTreeSet<Vec<u8>> = [format!("g{}", (i + rounds - 1) % rounds).into_bytes()].into();
        if names != want {
            return Err(fail(&world, format!("/d{i} holds {names:?}, {want:?} expected")));
        }
    }
    if !world.violations().is_empty() {
        return Err(fail(&world, "violations".into()));
    }
    let stats = world.stats.lock().expect("stats lock").clone();
    let (trace_hash, _) = world.trace_hash();
    failover.abort();
    for k in world.node_ids() {
        world.crash(k, None, "run over").await;
    }
    Ok(MountOutcome {
        ops,
        messages: stats.messages,
        dropped: stats.dropped,
        replies_lost: stats.replies_lost,
        trace_hash,
    })
}

/// Per round `i`: mkdir /d{i}, create /d{i}/f, rename it to /d{i-1}/g{i-1}'s
/// neighbour (/d{i+1}/g{i} once that directory exists), make and remove
/// /d{i}/tmp and a hard link. Every answer must be a success.
async fn exercise(client: &Client, root: Ent, rounds: usize) -> Result<usize, String> {
    let caller = Caller::default();
    let mut ops = 0;
    let mut dirs = Vec::new();
    let ok = |what: String, r: FsResult<()>| r.map_err(|e| format!("{what}: {e}"));
    for i in 0..rounds {
        let d = client.mkdir(root, format!("d{i}").as_bytes(), 0o755, caller).await;
        let d = Ent::from(&d.map_err(|e| format!("mkdir /d{i}: {e}"))?);
        let f = client.create(d, b"f", FileKind::File, 0o644, 0, true, caller).await;
        let f = Ent::from(&f.map_err(|e| format!("create /d{i}/f: {e}"))?);
        let t = client.mkdir(d, b"tmp", 0o755, caller).await.map(|_| ());
        ok(format!("mkdir /d{i}/tmp"), t)?;
        let l = client.link(f, root, format!("l{i}").as_bytes()).await.map(|_| ());
        ok(format!("link /l{i} to /d{i}/f"), l)?;
        ok(format!("rmdir /d{i}/tmp"), client.rmdir(d, b"tmp").await)?;
        ok(format!("unlink /l{i}"), client.unlink(root, format!("l{i}").as_bytes()).await)?;
        ops += 6;
        dirs.push(d);
    }
    // Each file moves to the next round's directory, across nodes.
    for i in 0..rounds {
        let to = dirs[(i + 1) % rounds];
        let r = client.rename(dirs[i], b"f", to, format!("g{i}").as_bytes(), 0).await;
        ok(format!("rename /d{i}/f to /d{}/g{i}", (i + 1) % rounds), r)?;
        ops += 1;
    }
    Ok(ops)
}

/// The names in directory `d`.
async fn list(client: &Client, d: Ent) -> FsResult<BTreeSet<Vec<u8>>> {
    let mut names = BTreeSet::new();
    let mut after = None;
    loop {
        let (page, more) = client.readdir(d, after.clone(), 256).await?;
        for e in &page {
            names.insert(e.name.clone());
        }
        after = page.last().map(|e| e.name.clone());
        if !more || after.is_none() {
            return Ok(names);
        }
    }
}
