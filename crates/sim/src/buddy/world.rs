//! The buddy-mirroring world: mgmtd's state, the nodes' slots (storage
//! nodes here, metadata nodes in `metabuddy`: the world is generic over
//! the [`Service`] a node runs), the one seeded RNG, the network between
//! them and the clients, the trace.
//!
//! mgmtd is `hivefs_mgmtd::Mgmt` answered in place (its clock is tokio's
//! paused one), and a task runs its failover check as the service does; a
//! restart of mgmtd loads its registry from disk again and forgets what it
//! had heard from the nodes (as the process would). A node is the real
//! service started with `Net::Pools`: it listens nowhere,
//! its requests arrive as tasks of the node, and everything it sends goes
//! through [`call`]. A crash stops every task of the node (requests it
//! serves, its start, its heartbeats, resyncs) and drops the service.

use crate::buddy::BuddyFaults;
pub use crate::net::Stats;
use crate::net::{draw_fate, lost, outcome, panic_message, CatchUnwind, Core, Fate};
use bytes::Bytes;
use hivefs_mgmtd::{CapacityLimits, Mgmt, Timeouts};
use hivefs_net::{Call, CallFuture, ClientConfig, Connector, Pools};
use hivefs_proto::{Envelope, Reply, Request, Response};
use hivefs_types::error::FsResult;
use rand::seq::SliceRandom;
use rand::Rng;
use std::fmt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// mgmtd's address.
pub const MGMTD: &str = "mgmtd";
/// Nodes' heartbeat interval.
pub const HEARTBEAT_MS: u64 = 250;
/// mgmtd's timeouts: a primary silent for 2 s is replaced (leases of 1 s).
pub const TIMEOUTS: Timeouts =
    Timeouts { probably_offline_after_ms: 1000, offline_after_ms: 2000, failover_after_ms: 2000 };
/// How often mgmtd looks for groups to switch over (as the service does).
const FAILOVER_CHECK: Duration = Duration::from_millis(500);

/// What a node runs: a service that answers requests delivered to it.
pub trait Service: Send + Sync + 'static {
    fn handle(
        &self,
        env: Envelope,
        req: Request,
        payload: Vec<u8>,
    ) -> impl std::future::Future<Output = (Response, Vec<u8>)> + Send;
}

impl Service for hivefs_storage::StorageService {
    fn handle(
        &self,
        env: Envelope,
        req: Request,
        payload: Vec<u8>,
    ) -> impl std::future::Future<Output = (Response, Vec<u8>)> + Send {
        hivefs_storage::StorageService::handle(self, env, req, payload)
    }
}

impl Service for hivefs_meta::MetaService {
    fn handle(
        &self,
        env: Envelope,
        req: Request,
        payload: Vec<u8>,
    ) -> impl std::future::Future<Output = (Response, Vec<u8>)> + Send {
        hivefs_meta::MetaService::handle(self, env, req, payload)
    }
}

/// The id mgmtd gave a running service.
pub trait NodeId {
    fn node_id(&self) -> hivefs_types::ids::NodeId;
}

impl NodeId for hivefs_storage::StorageService {
    fn node_id(&self) -> hivefs_types::ids::NodeId {
        self.node_id
    }
}

impl NodeId for hivefs_meta::MetaService {
    fn node_id(&self) -> hivefs_types::ids::NodeId {
        self.node_id
    }
}

/// The storage buddy-mirroring world.
pub type StorageWorld = World<hivefs_storage::StorageService>;

/// Who sends a message, or receives one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ep {
    Mgmt,
    /// Node `k` (1-based), at address `n<k>`.
    Node(usize),
    Client(usize),
}

impl Ep {
    fn of_addr(addr: &str) -> Option<Ep> {
        if addr == MGMTD {
            return Some(Ep::Mgmt);
        }
        addr.strip_prefix('n').and_then(|k| k.parse().ok()).map(Ep::Node)
    }
}

impl fmt::Display for Ep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Ep::Mgmt => write!(f, "mgmtd"),
            Ep::Node(k) => write!(f, "n{k}"),
            Ep::Client(k) => write!(f, "c{k}"),
        }
    }
}

/// One node: its directories and, while it runs, its service and the
/// tasks running its code.
pub struct Slot<S> {
    pub dir: PathBuf,
    /// A storage node's targets.
    pub targets: Vec<PathBuf>,
    pub svc: Option<Arc<S>>,
    pub boot: u32,
    /// Its start (registration with mgmtd) and the requests it serves.
    pub tasks: Vec<JoinHandle<()>>,
    /// Fired when a task of this boot stopped at its crash step.
    pub halt: Arc<tokio::sync::Notify>,
    /// Waits for `halt`, then crashes the node.
    pub watcher: Option<JoinHandle<()>>,
}

/// A partition: the endpoints in `side` cannot reach the other servers
/// (both ways) until `until`. Clients reach every server.
struct Cut {
    side: Vec<Ep>,
    until: Instant,
}

pub struct World<S> {
    core: Core,
    pub faults: BuddyFaults,
    pub mgmt: Mutex<Mgmt>,
    mgmt_dir: PathBuf,
    /// mgmtd runs (it is down between a crash and its restart).
    mgmt_up: AtomicBool,
    pub nodes: Vec<Mutex<Slot<S>>>,
    cuts: Mutex<Vec<Cut>>,
    calm: AtomicBool,
    pub stats: Mutex<Stats>,
    next_msg: AtomicU64,
    /// Crash-and-restart tasks in flight.
    pub restarts: Mutex<Vec<JoinHandle<()>>>,
    /// The directories of the run (mgmtd's, the nodes').
    root: tempfile::TempDir,
}

impl<S> std::ops::Deref for World<S> {
    type Target = Core;

    fn deref(&self) -> &Core {
        &self.core
    }
}

impl<S: Service> World<S> {
    /// `nodes[k]`: the service directory and the targets (a storage
    /// node's, formatted) of node `k + 1`.
    pub fn new(
        seed: u64,
        faults: BuddyFaults,
        nodes: Vec<(PathBuf, Vec<PathBuf>)>,
        root: tempfile::TempDir,
        keep: usize,
        echo: bool,
    ) -> Arc<World<S>> {
        let mgmt_dir = root.path().join("mgmtd");
        let mgmt = Mgmt::open(&mgmt_dir, TIMEOUTS, CapacityLimits::default(), Instant::now().into_std())
            .expect("opening the simulated mgmtd");
        let nodes = nodes
            .into_iter()
            .map(|(dir, targets)| {
                Mutex::new(Slot {
                    dir,
                    targets,
                    svc: None,
                    boot: 0,
                    tasks: Vec::new(),
                    halt: Arc::default(),
                    watcher: None,
                })
            })
            .collect();
        Arc::new(World {
            core: Core::new(seed, keep, echo),
            faults,
            mgmt: Mutex::new(mgmt),
            mgmt_dir,
            mgmt_up: AtomicBool::new(true),
            nodes,
            cuts: Mutex::default(),
            calm: AtomicBool::new(true),
            stats: Mutex::default(),
            next_msg: AtomicU64::new(0),
            restarts: Mutex::default(),
            root,
        })
    }

    pub fn set_calm(&self, calm: bool) {
        self.calm.store(calm, Ordering::SeqCst);
        if calm {
            self.cuts.lock().expect("cuts lock").clear();
        }
    }

    pub fn is_calm(&self) -> bool {
        self.calm.load(Ordering::SeqCst)
    }

    pub fn stat(&self, f: impl FnOnce(&mut Stats)) {
        f(&mut self.stats.lock().expect("stats lock"))
    }

    pub fn slot(&self, k: usize) -> MutexGuard<'_, Slot<S>> {
        self.nodes[k - 1].lock().expect("slot lock")
    }

    pub fn node_ids(&self) -> Vec<usize> {
        (1..=self.nodes.len()).collect()
    }

    pub fn up_nodes(&self) -> Vec<usize> {
        self.node_ids().into_iter().filter(|&k| self.slot(k).svc.is_some()).collect()
    }

    /// mgmtd's state, with its clock's now.
    pub fn mgmt(&self) -> (MutexGuard<'_, Mgmt>, std::time::Instant) {
        (self.mgmt.lock().expect("mgmt lock"), Instant::now().into_std())
    }

    /// mgmtd crashes; [`World::restart_mgmt`] brings it back.
    pub fn crash_mgmt(&self) {
        self.trace("mgmtd crashes");
        self.stat(|s| s.crashes += 1);
        self.mgmt_up.store(false, Ordering::SeqCst);
    }

    /// mgmtd starts again from its registry on disk.
    pub fn restart_mgmt(&self) {
        let m = Mgmt::open(&self.mgmt_dir, TIMEOUTS, CapacityLimits::default(), Instant::now().into_std());
        match m {
            Ok(m) => {
                *self.mgmt.lock().expect("mgmt lock") = m;
                self.mgmt_up.store(true, Ordering::SeqCst);
                self.trace("mgmtd up");
            }
            Err(e) => self.violation(format!("mgmtd does not start again: {e}")),
        }
    }

    pub fn mgmt_is_up(&self) -> bool {
        self.mgmt_up.load(Ordering::SeqCst)
    }

    /// Cuts `side` off the other servers for `dur`.
    pub fn partition(&self, side: Vec<Ep>, dur: Duration) {
        let names: Vec<String> = side.iter().map(|e| e.to_string()).collect();
        self.trace(format_args!("partition [{}] | rest for {} ms", names.join(" "), dur.as_millis()));
        self.stat(|s| s.partitions += 1);
        self.cuts.lock().expect("cuts lock").push(Cut { side, until: Instant::now() + dur });
    }

    fn cut(&self, a: Ep, b: Ep) -> bool {
        if matches!(a, Ep::Client(_)) || matches!(b, Ep::Client(_)) {
            return false;
        }
        let now = Instant::now();
        let mut cuts = self.cuts.lock().expect("cuts lock");
        cuts.retain(|c| c.until > now);
        cuts.iter().any(|c| c.side.contains(&a) != c.side.contains(&b))
    }

    fn up(&self, ep: Ep) -> bool {
        match ep {
            Ep::Node(k) => self.slot(k).svc.is_some(),
            Ep::Mgmt => self.mgmt_is_up(),
            Ep::Client(_) => true,
        }
    }

    /// Runs `fut` as a task of node `k` (stopped when `k` crashes).
    pub fn spawn_on<Fut>(self: &Arc<Self>, k: usize, fut: Fut)
    where
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let world = Arc::downgrade(self);
        let fut = CatchUnwind(Box::pin(fut));
        let h = tokio::spawn(async move {
            if let Err(panic) = fut.await {
                if let Some(w) = world.upgrade() {
                    w.violation(format!("code of node n{k} panicked: {}", panic_message(&*panic)));
                }
            }
        });
        let mut slot = self.slot(k);
        slot.tasks.retain(|t| !t.is_finished());
        slot.tasks.push(h);
    }

    /// Begins boot `n + 1` of node `k`: a halt at a crash step of this boot
    /// crashes the node and starts it again after a drawn delay, through
    /// `restart(world, k, boot, delay)`. Returns the node's directory and
    /// the boot.
    pub fn next_boot<Fut>(
        self: &Arc<Self>,
        k: usize,
        restart: impl FnOnce(Arc<World<S>>, usize, u32, Duration) -> Fut + Send + 'static,
    ) -> (PathBuf, u32)
    where
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let mut slot = self.slot(k);
        assert!(slot.svc.is_none(), "node n{k} is already running");
        slot.boot += 1;
        slot.halt = Arc::default();
        let (halt, boot, w) = (slot.halt.clone(), slot.boot, self.clone());
        slot.watcher = Some(tokio::spawn(async move {
            halt.notified().await;
            w.trace(format_args!("n{k} halted at its crash step"));
            w.stat(|s| s.step_crashes += 1);
            let delay = w.ms(w.faults.restart_ms);
            let again = tokio::spawn(restart(w.clone(), k, boot, delay));
            w.restarts.lock().expect("restarts lock").push(again);
        }));
        (slot.dir.clone(), slot.boot)
    }

    /// Starts boot `boot` of node `k` as a task of the node, with `start`
    /// tried again every second until it returns a service (as a service
    /// manager would); the node is up (takes requests) from then on.
    pub fn start_node<Fut, E>(self: &Arc<Self>, k: usize, boot: u32, start: impl Fn() -> Fut + Send + 'static)
    where
        Fut: std::future::Future<Output = Result<S, E>> + Send,
        E: fmt::Display + Send,
        S: NodeId,
    {
        let w = Arc::downgrade(self);
        self.spawn_on(k, async move {
            loop {
                let r = start().await;
                let Some(w) = w.upgrade() else { return };
                match r {
                    Ok(svc) => {
                        w.trace(format_args!("n{k} up, boot {boot}, node {}", svc.node_id()));
                        w.slot(k).svc = Some(Arc::new(svc));
                        return;
                    }
                    Err(e) => {
                        // Without the run's temporary directory, which differs between runs of a seed.
                        let e = e.to_string().replace(&*w.root.path().to_string_lossy(), "<dir>");
                        w.trace(format_args!("n{k} start failed ({e}); again in 1 s"));
                        drop(w);
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                }
            }
        });
    }

    /// Whether node `k` runs or starts (of boot `boot`, if given).
    pub fn alive(&self, k: usize, boot: Option<u32>) -> bool {
        let slot = self.slot(k);
        let starting = slot.tasks.iter().any(|t| !t.is_finished());
        (slot.svc.is_some() || starting) && boot.is_none_or(|b| b == slot.boot)
    }

    /// Crashes node `k` (of boot `boot`, if given): every task running its
    /// code stops, then the service is dropped. False if it was not running.
    pub async fn crash(self: &Arc<Self>, k: usize, boot: Option<u32>, why: &str) -> bool {
        if !self.alive(k, boot) {
            return false;
        }
        let (svc, tasks, watcher) = {
            let mut slot = self.slot(k);
            (slot.svc.take(), std::mem::take(&mut slot.tasks), slot.watcher.take())
        };
        self.trace(format_args!("n{k} crashes ({why})"));
        self.stat(|s| s.crashes += 1);
        if let Some(w) = watcher {
            w.abort();
        }
        for t in &tasks {
            t.abort();
        }
        for t in tasks {
            if let Err(e) = t.await {
                if e.is_panic() {
                    self.violation(format!("a task of node n{k} panicked: {e}"));
                }
            }
        }
        // Dropping the service stops its heartbeats and mirroring tasks.
        drop(svc);
        true
    }

    fn fate(&self) -> (Fate, Duration, Duration) {
        if self.calm.load(Ordering::SeqCst) {
            return (Fate::Deliver, Duration::ZERO, Duration::ZERO);
        }
        draw_fate(&mut self.rng(), &self.faults.net)
    }
}

/// Sends `req` from `from` to the service at `to` and waits for the answer.
/// A client's lost answer is reported once the request has finished on the
/// node (a client never overlaps two attempts of one change; see
/// `docs/simulation.md`); a node's request whose answer is lost arrives
/// late, after the sender has given up on it.
pub async fn call<S: Service>(
    world: Arc<World<S>>,
    from: Ep,
    to_addr: String,
    env: Envelope,
    req: Request,
    payload: Bytes,
) -> FsResult<(Reply, Vec<u8>)> {
    let Some(to) = Ep::of_addr(&to_addr) else {
        return Err(lost("no such address"));
    };
    let m = world.next_msg.fetch_add(1, Ordering::Relaxed);
    let (fate, d1, d2) = world.fate();
    world.stat(|s| s.messages += 1);
    let role = env.mirror.map(|h| format!(" {:?}@{}", h.role, h.epoch)).unwrap_or_default();
    let what = match &req {
        Request::SetMemberState { group, epoch, member, state } => {
            format!("SetMemberState(group {group} at {epoch:?}: {member} {state:?})")
        }
        r => r.name().to_string(),
    };
    world.trace(format_args!("m{m} {from}->{to} {what}{role} {fate:?} +{}ms", d1.as_millis()));
    tokio::time::sleep(d1).await;
    if !world.up(to) || world.cut(from, to) {
        world.trace(format_args!("m{m} refused"));
        world.stat(|s| s.refused += 1);
        return Err(lost("node down or partitioned"));
    }
    if fate == Fate::Drop {
        world.stat(|s| s.dropped += 1);
        return Err(lost("request lost"));
    }
    let r: (Response, Vec<u8>) = match to {
        Ep::Mgmt => {
            if !world.mgmt_is_up() {
                return Err(lost("mgmtd down"));
            }
            let (mut g, now) = world.mgmt();
            (g.handle(req, now), Vec::new())
        }
        Ep::Node(k) => {
            let Some(svc) = world.slot(k).svc.clone() else {
                return Err(lost("node down"));
            };
            if fate == Fate::LoseReply && !matches!(from, Ep::Client(_)) && world.faults.net.late_requests {
                // The sender gives up on the connection; the request, still
                // on its way (or queued at the receiver), runs later.
                let late = world.ms(world.faults.net.slow_ms);
                let w = world.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(late).await;
                    let svc = w.slot(k).svc.clone();
                    match svc {
                        Some(svc) if !w.cut(from, to) => {
                            w.trace(format_args!("m{m} delivered late"));
                            w.spawn_on(k, async move {
                                let _ = svc.handle(env, req, payload.to_vec()).await;
                            });
                        }
                        _ => w.trace(format_args!("m{m} lost late")),
                    }
                });
                tokio::time::sleep(d2).await;
                world.trace(format_args!("m{m} connection lost"));
                world.stat(|s| s.replies_lost += 1);
                return Err(lost("connection lost, the request may still arrive"));
            }
            let (tx, rx) = oneshot::channel();
            world.spawn_on(k, async move {
                let _ = tx.send(svc.handle(env, req, payload.to_vec()).await);
            });
            match rx.await {
                Ok(r) => r,
                Err(_) => {
                    world.trace(format_args!("m{m} no answer: {to} crashed"));
                    return Err(lost("node crashed before answering"));
                }
            }
        }
        Ep::Client(_) => return Err(lost("clients serve nothing")),
    };
    tokio::time::sleep(d2).await;
    if fate == Fate::LoseReply {
        world.trace(format_args!("m{m} connection lost after the answer"));
        world.stat(|s| s.replies_lost += 1);
        return Err(lost("connection lost, the request may have been applied"));
    }
    if world.cut(from, to) {
        world.trace(format_args!("m{m} answer cut off"));
        return Err(lost("answer cut off"));
    }
    world.trace(format_args!("m{m} answer {}", outcome(&r.0)));
    r.0.map(|reply| (reply, r.1))
}

/// Until `stop`: every so often, crash a node (`restart` brings it back
/// after a drawn delay) or mgmtd now, arm a node to stop at a step of its
/// protocol (`arm`, which draws the step), or cut the servers (mgmtd and
/// the nodes) in two for a while.
pub async fn chaos<S: Service, Fut>(
    world: Arc<World<S>>,
    stop: Arc<AtomicBool>,
    restart: impl Fn(Arc<World<S>>, usize, Duration) -> Fut,
    arm: impl Fn(&World<S>, usize),
) where
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let f = world.faults.clone();
    loop {
        let wait = world.ms(f.chaos_every_ms);
        tokio::time::sleep(wait).await;
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let total = f.crash_now + f.crash_at_step + f.partition + f.mgmt_crash + f.nothing;
        let roll = world.rng().gen_range(0..total.max(1));
        if roll < f.crash_now {
            let up = world.up_nodes();
            let Some(&k) = up.choose(&mut *world.rng()) else { continue };
            let delay = world.ms(f.restart_ms);
            let h = tokio::spawn(restart(world.clone(), k, delay));
            world.restarts.lock().expect("restarts lock").push(h);
        } else if roll < f.crash_now + f.crash_at_step {
            let up = world.up_nodes();
            let Some(&k) = up.choose(&mut *world.rng()) else { continue };
            arm(&world, k);
        } else if roll < f.crash_now + f.crash_at_step + f.partition {
            let mut servers = vec![Ep::Mgmt];
            servers.extend(world.node_ids().into_iter().map(Ep::Node));
            let side: Vec<Ep> = {
                let mut r = world.rng();
                let n = r.gen_range(1..servers.len());
                servers.choose_multiple(&mut *r, n).copied().collect()
            };
            let dur = world.ms(f.partition_ms);
            world.partition(side, dur);
        } else if roll < f.crash_now + f.crash_at_step + f.partition + f.mgmt_crash && world.mgmt_is_up() {
            world.crash_mgmt();
            let delay = world.ms(f.restart_ms);
            let w = world.clone();
            let h = tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                w.restart_mgmt();
            });
            world.restarts.lock().expect("restarts lock").push(h);
        }
    }
}

/// The way from `from` to one address: [`call`], once, or under the
/// retry policy of a TCP pool (`hivefs_net::repeat`) with `repeat`'s settings.
struct SimCall<S> {
    world: Weak<World<S>>,
    from: Ep,
    addr: String,
    repeat: Option<ClientConfig>,
}

impl<S: Service> Call for SimCall<S> {
    fn addr(&self) -> &str {
        &self.addr
    }

    fn call_with<'a>(&'a self, env: &'a Envelope, req: &'a Request, payload: Bytes) -> CallFuture<'a> {
        let (world, from, addr, env, req) = (self.world.clone(), self.from, self.addr.clone(), *env, req.clone());
        let once = move |world: Weak<World<S>>, addr: String, req: Request, payload: Bytes| async move {
            match world.upgrade() {
                Some(w) => call(w, from, addr, env, req, payload).await,
                None => Err(lost("simulation over")),
            }
        };
        let Some(cfg) = self.repeat.clone() else {
            return Box::pin(once(world, addr, req, payload));
        };
        Box::pin(async move {
            hivefs_net::repeat(
                &cfg,
                &addr,
                &env,
                &req,
                || false,
                |_left| {
                    let answer = once(world.clone(), addr.clone(), req.clone(), payload.clone());
                    async move { answer.await.map(|(reply, data)| (Ok(reply), data)) }
                },
            )
            .await
        })
    }
}

/// Pools whose every call is one [`call`] from `from`.
pub fn pools<S: Service>(world: &Arc<World<S>>, from: Ep) -> Pools {
    sim_pools(world, from, None)
}

/// Pools whose calls from `from` are repeated as a TCP pool's are
/// (`hivefs_net::repeat`, with the default client settings): what the
/// client library expects below it.
pub fn repeating_pools<S: Service>(world: &Arc<World<S>>, from: Ep) -> Pools {
    sim_pools(world, from, Some(ClientConfig::new(None)))
}

fn sim_pools<S: Service>(world: &Arc<World<S>>, from: Ep, repeat: Option<ClientConfig>) -> Pools {
    let w = Arc::downgrade(world);
    let connect: Connector = Arc::new(move |addr: &str| {
        Arc::new(SimCall { world: w.clone(), from, addr: addr.to_string(), repeat: repeat.clone() }) as Arc<dyn Call>
    });
    Pools::with_connector(ClientConfig::new(None), connect)
}

/// mgmtd's failover check, every [`FAILOVER_CHECK`], for the whole run.
pub async fn failover_loop<S: Service>(world: Weak<World<S>>) {
    loop {
        tokio::time::sleep(FAILOVER_CHECK).await;
        let Some(w) = world.upgrade() else { return };
        if !w.mgmt_is_up() {
            continue;
        }
        let switched = {
            let (mut g, now) = w.mgmt();
            g.failover(now)
        };
        match switched {
            Ok(groups) => {
                for id in groups {
                    let (g, _) = w.mgmt();
                    if let Some(info) = g.list_groups(None).into_iter().find(|i| i.id == id) {
                        drop(g);
                        w.trace(format_args!(
                            "mgmtd: group {id} fails over to target {} (epoch {})",
                            info.primary, info.epoch
                        ));
                        w.stat(|s| s.failovers += 1);
                    }
                }
            }
            Err(e) => w.violation(format!("mgmtd's failover check failed: {e}")),
        }
    }
}
