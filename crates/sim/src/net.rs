//! The simulated world: the nodes' slots, the one seeded RNG, the network
//! between nodes and clients, and the trace.
//!
//! Every message is a [`call`]: its fate (delivered, dropped before
//! delivery, or delivered with its answer lost) and its two delays are
//! drawn from the RNG; a partition (a cut between two sets of metadata
//! nodes, until a time) or a node that is down refuses it. A delivered
//! request runs as a task of the receiving node (so a crash of that node
//! stops it, as a crash of the process would), and its answer is awaited
//! through a channel. Failures reach the caller as `Unavailable`, as the
//! real transport reports a lost connection.

use crate::Faults;
use hivefs_meta::cross::Peers;
use hivefs_meta::targets::BoxFut;
use hivefs_meta::Namespace;
use hivefs_proto::{Envelope, Reply, Request, Response};
use hivefs_types::error::{FsError, FsResult};
use hivefs_types::fs_err;
use hivefs_types::ids::NodeId;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// Who sends a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Node(NodeId),
    Client(usize),
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Endpoint::Node(n) => write!(f, "n{n}"),
            Endpoint::Client(k) => write!(f, "c{k}"),
        }
    }
}

/// One metadata node: its data dir and, while it runs, its namespace and
/// the tasks running its code.
pub struct Slot {
    pub dir: tempfile::TempDir,
    pub ns: Option<Arc<Namespace>>,
    pub boot: u32,
    /// Tasks running this node's code (requests it serves, its recovery).
    pub tasks: Vec<JoinHandle<()>>,
    /// Waits for the crash hook of this boot to fire.
    pub watcher: Option<JoinHandle<()>>,
    pub halt: Arc<tokio::sync::Notify>,
}

/// A partition: nodes in `side` cannot reach the others (both ways) until `until`.
struct Cut {
    side: Vec<NodeId>,
    until: Instant,
}

/// The trace: every event, one line each, hashed as it goes; the last
/// lines are kept for a failure report (all of them when echoing).
pub struct Trace {
    pub(crate) hash: u64,
    pub lines: u64,
    pub(crate) tail: VecDeque<String>,
    keep: usize,
    echo: bool,
}

impl Trace {
    pub(crate) fn new(keep: usize, echo: bool) -> Trace {
        Trace { hash: 0xcbf2_9ce4_8422_2325, lines: 0, tail: VecDeque::new(), keep, echo }
    }

    pub(crate) fn push(&mut self, line: String) {
        // FNV-1a: stable across builds and platforms.
        for b in line.bytes().chain(std::iter::once(b'\n')) {
            self.hash ^= u64::from(b);
            self.hash = self.hash.wrapping_mul(0x0100_0000_01b3);
        }
        self.lines += 1;
        if self.echo {
            eprintln!("{line}");
        }
        if self.keep > 0 {
            if self.tail.len() == self.keep {
                self.tail.pop_front();
            }
            self.tail.push_back(line);
        }
    }
}

/// Counts for the outcome of a run.
#[derive(Clone, Debug, Default)]
pub struct Stats {
    pub messages: u64,
    pub dropped: u64,
    pub replies_lost: u64,
    pub refused: u64,
    pub crashes: u64,
    pub step_crashes: u64,
    pub partitions: u64,
    /// Group switch-overs by mgmtd (the buddy-mirroring simulation).
    pub failovers: u64,
    pub client_ops: u64,
    pub client_retries: u64,
    /// Chunk-file operations a failing disk failed (the buddy-mirroring simulation).
    pub disk_faults: u64,
}

/// What every simulated world has: the one seeded RNG, the trace, the
/// violations found and the simulated clock's start.
pub struct Core {
    rng: Mutex<StdRng>,
    trace: Mutex<Trace>,
    violations: Mutex<Vec<String>>,
    start: Instant,
}

impl Core {
    pub fn new(seed: u64, keep: usize, echo: bool) -> Core {
        Core {
            rng: Mutex::new(StdRng::seed_from_u64(seed)),
            trace: Mutex::new(Trace::new(keep, echo)),
            violations: Mutex::default(),
            start: Instant::now(),
        }
    }

    pub fn rng(&self) -> MutexGuard<'_, StdRng> {
        self.rng.lock().expect("rng lock")
    }

    /// A duration drawn uniformly from `lo..=hi` ms.
    pub fn ms(&self, (lo, hi): (u64, u64)) -> Duration {
        Duration::from_millis(self.rng().gen_range(lo..=hi))
    }

    pub fn chance(&self, p: f64) -> bool {
        p > 0.0 && self.rng().gen_bool(p.min(1.0))
    }

    pub fn elapsed_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    pub fn trace(&self, what: impl fmt::Display) {
        let line = format!("{:>8} {what}", self.elapsed_ms());
        self.trace.lock().expect("trace lock").push(line);
    }

    pub fn trace_hash(&self) -> (u64, u64) {
        let t = self.trace.lock().expect("trace lock");
        (t.hash, t.lines)
    }

    pub fn trace_tail(&self) -> Vec<String> {
        self.trace.lock().expect("trace lock").tail.iter().cloned().collect()
    }

    pub fn violation(&self, what: String) {
        self.trace(format_args!("VIOLATION {what}"));
        self.violations.lock().expect("violations lock").push(what);
    }

    pub fn violations(&self) -> Vec<String> {
        self.violations.lock().expect("violations lock").clone()
    }
}

pub struct World {
    core: Core,
    pub faults: Faults,
    pub nodes: Vec<Mutex<Slot>>,
    cuts: Mutex<Vec<Cut>>,
    /// No faults, no delays (set up and the end of a run).
    calm: AtomicBool,
    pub stats: Mutex<Stats>,
    next_msg: AtomicU64,
    /// Crash-and-restart tasks in flight.
    pub restarts: Mutex<Vec<JoinHandle<()>>>,
}

impl std::ops::Deref for World {
    type Target = Core;

    fn deref(&self) -> &Core {
        &self.core
    }
}

impl World {
    pub fn new(seed: u64, faults: Faults, dirs: Vec<tempfile::TempDir>, keep: usize, echo: bool) -> Arc<World> {
        let nodes = dirs
            .into_iter()
            .map(|dir| {
                Mutex::new(Slot { dir, ns: None, boot: 0, tasks: Vec::new(), watcher: None, halt: Arc::default() })
            })
            .collect();
        Arc::new(World {
            core: Core::new(seed, keep, echo),
            faults,
            nodes,
            cuts: Mutex::default(),
            calm: AtomicBool::new(true),
            stats: Mutex::default(),
            next_msg: AtomicU64::new(0),
            restarts: Mutex::default(),
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

    pub fn slot(&self, n: NodeId) -> MutexGuard<'_, Slot> {
        self.nodes[n.0 as usize - 1].lock().expect("slot lock")
    }

    pub fn node_ids(&self) -> Vec<NodeId> {
        (1..=self.nodes.len() as u32).map(NodeId).collect()
    }

    pub fn ns(&self, n: NodeId) -> Option<Arc<Namespace>> {
        self.slot(n).ns.clone()
    }

    pub fn up_nodes(&self) -> Vec<NodeId> {
        self.node_ids().into_iter().filter(|&n| self.slot(n).ns.is_some()).collect()
    }

    /// Cuts `side` off the other metadata nodes for `dur`.
    pub fn partition(&self, side: Vec<NodeId>, dur: Duration) {
        self.trace(format_args!("partition {side:?} | rest for {} ms", dur.as_millis()));
        self.stat(|s| s.partitions += 1);
        self.cuts.lock().expect("cuts lock").push(Cut { side, until: Instant::now() + dur });
    }

    fn cut(&self, a: NodeId, b: NodeId) -> bool {
        let now = Instant::now();
        let mut cuts = self.cuts.lock().expect("cuts lock");
        cuts.retain(|c| c.until > now);
        cuts.iter().any(|c| c.side.contains(&a) != c.side.contains(&b))
    }

    /// Whether a message from `from` reaches node `to` now.
    fn reaches(&self, from: Endpoint, to: NodeId) -> bool {
        if self.slot(to).ns.is_none() {
            return false;
        }
        match from {
            Endpoint::Node(a) => !self.cut(a, to),
            Endpoint::Client(_) => true,
        }
    }

    /// Runs `f` as a task of node `n` (stopped when `n` crashes); `None`
    /// when `n` is down. The answer arrives on the channel.
    pub fn spawn_on<F, Fut>(self: &Arc<Self>, n: NodeId, f: F) -> Option<oneshot::Receiver<Response>>
    where
        F: FnOnce(Arc<Namespace>) -> Fut,
        Fut: Future<Output = Response> + Send + 'static,
    {
        let mut slot = self.slot(n);
        let ns = slot.ns.clone()?;
        let (tx, rx) = oneshot::channel();
        let fut = CatchUnwind(Box::pin(f(ns)));
        let world = Arc::downgrade(self);
        let h = tokio::spawn(async move {
            match fut.await {
                Ok(r) => {
                    let _ = tx.send(r);
                }
                Err(panic) => {
                    if let Some(w) = world.upgrade() {
                        w.violation(format!("code of metadata node {n} panicked: {}", panic_message(&*panic)));
                    }
                }
            }
        });
        slot.tasks.retain(|t| !t.is_finished());
        slot.tasks.push(h);
        Some(rx)
    }

    /// A message's fate and its two delays (request, answer).
    fn fate(&self) -> (Fate, Duration, Duration) {
        if self.is_calm() {
            return (Fate::Deliver, Duration::ZERO, Duration::ZERO);
        }
        draw_fate(&mut self.rng(), &self.faults)
    }
}

/// A message's fate and its two delays (request, answer), drawn from `r`.
pub(crate) fn draw_fate(r: &mut StdRng, f: &Faults) -> (Fate, Duration, Duration) {
    let fate = if r.gen_bool(f.drop) {
        Fate::Drop
    } else if r.gen_bool(f.lose_reply) {
        Fate::LoseReply
    } else {
        Fate::Deliver
    };
    let mut delay = || {
        let (lo, hi) = if r.gen_bool(f.slow) { f.slow_ms } else { (0, f.max_delay_ms) };
        Duration::from_millis(r.gen_range(lo..=hi))
    };
    let (d1, d2) = (delay(), delay());
    (fate, d1, d2)
}

/// Waits for every task in `tasks`, including those pushed meanwhile.
/// Waits for the clients' tasks, in order, for at most `deadline` (of
/// simulated time): their results, or `None` when they did not all finish.
pub async fn join_clients<T>(tasks: Vec<JoinHandle<T>>, deadline: Duration) -> Option<Vec<T>> {
    tokio::time::timeout(deadline, async {
        let mut out = Vec::with_capacity(tasks.len());
        for t in tasks {
            out.push(t.await.expect("a client task panicked"));
        }
        out
    })
    .await
    .ok()
}

pub async fn await_all(tasks: &Mutex<Vec<JoinHandle<()>>>) {
    loop {
        let pending: Vec<_> = std::mem::take(&mut *tasks.lock().expect("tasks lock"));
        if pending.is_empty() {
            return;
        }
        for t in pending {
            t.await.expect("a restart task panicked");
        }
    }
}

/// The value of environment variable `name` as a number (absent: `None`).
pub fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    Some(v.trim().parse().unwrap_or_else(|_| panic!("{name}={v} is not a number")))
}

/// The message a panic carried.
pub fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

/// A future whose panic is caught (and reported as a violation) instead
/// of ending the task silently.
pub(crate) struct CatchUnwind<F>(pub(crate) Pin<Box<F>>);

impl<F: Future> Future for CatchUnwind<F> {
    type Output = Result<F::Output, Box<dyn std::any::Any + Send>>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let inner = self.0.as_mut();
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| inner.poll(cx))) {
            Ok(Poll::Ready(v)) => Poll::Ready(Ok(v)),
            Ok(Poll::Pending) => Poll::Pending,
            Err(panic) => Poll::Ready(Err(panic)),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fate {
    Deliver,
    Drop,
    LoseReply,
}

pub(crate) fn lost(what: &str) -> FsError {
    fs_err!(Unavailable, "simulated network: {what}")
}

/// A request's name; a peer step's with its kind (`MetaPeer:RenameIn`).
fn request_name(req: &Request) -> String {
    match req {
        Request::MetaPeer { op } | Request::PeerStep { op, .. } => {
            let s = format!("{op:?}");
            let end = s.find([' ', '{', '(']).unwrap_or(s.len());
            format!("{}:{}", req.name(), &s[..end])
        }
        r => r.name(),
    }
}

pub(crate) fn outcome(r: &Response) -> String {
    match r {
        Ok(reply) => {
            let s = format!("{reply:?}");
            let end = s.find([' ', '{', '(']).unwrap_or(s.len());
            s[..end].to_string()
        }
        Err(e) => format!("{:?}", e.code),
    }
}

/// Sends `req` from `from` to metadata node `to` and waits for the answer.
pub async fn call(world: Arc<World>, from: Endpoint, to: NodeId, env: Envelope, req: Request) -> FsResult<Reply> {
    let m = world.next_msg.fetch_add(1, Ordering::Relaxed);
    let (fate, d1, d2) = world.fate();
    world.stat(|s| s.messages += 1);
    world.trace(format_args!("m{m} {from}->n{to} {} {fate:?} +{}ms", request_name(&req), d1.as_millis()));
    tokio::time::sleep(d1).await;
    if !world.reaches(from, to) {
        world.trace(format_args!("m{m} refused"));
        world.stat(|s| s.refused += 1);
        return Err(lost("node down or partitioned"));
    }
    if fate == Fate::Drop {
        world.stat(|s| s.dropped += 1);
        return Err(lost("request lost"));
    }
    if let (Fate::LoseReply, Endpoint::Node(_), true) = (fate, from, world.faults.late_requests) {
        let late = world.ms(world.faults.slow_ms);
        let w = world.clone();
        tokio::spawn(async move {
            tokio::time::sleep(late).await;
            let ran =
                w.reaches(from, to) && w.spawn_on(to, move |ns| async move { ns.handle_env(env, req).await }).is_some();
            w.trace(format_args!("m{m} {}", if ran { "delivered late" } else { "lost late" }));
        });
        tokio::time::sleep(d2).await;
        world.trace(format_args!("m{m} connection lost"));
        world.stat(|s| s.replies_lost += 1);
        return Err(lost("connection lost, the request may still arrive"));
    }
    let Some(rx) = world.spawn_on(to, move |ns| async move { ns.handle_env(env, req).await }) else {
        return Err(lost("node down"));
    };
    if fate == Fate::LoseReply {
        tokio::time::sleep(d2).await;
        world.trace(format_args!("m{m} connection lost"));
        world.stat(|s| s.replies_lost += 1);
        return Err(lost("connection lost, the request may have been applied"));
    }
    let r = match rx.await {
        Ok(r) => r,
        Err(_) => {
            world.trace(format_args!("m{m} no answer: n{to} crashed"));
            return Err(lost("node crashed before answering"));
        }
    };
    tokio::time::sleep(d2).await;
    if let Endpoint::Node(a) = from {
        if world.cut(a, to) {
            world.trace(format_args!("m{m} answer cut off"));
            return Err(lost("answer cut off by a partition"));
        }
    }
    world.trace(format_args!("m{m} answer {}", outcome(&r)));
    r
}

/// How a metadata node reaches its peers: [`call`] from that node.
pub struct SimPeers {
    pub world: Weak<World>,
    pub me: NodeId,
    pub all: Vec<NodeId>,
}

impl Peers for SimPeers {
    fn meta_nodes(&self) -> Vec<NodeId> {
        self.all.clone()
    }

    fn call_with(&self, node: NodeId, env: Envelope, req: Request) -> BoxFut<FsResult<Reply>> {
        let (world, me) = (self.world.clone(), self.me);
        Box::pin(async move {
            match world.upgrade() {
                Some(w) => call(w, Endpoint::Node(me), node, env, req).await,
                None => Err(lost("simulation over")),
            }
        })
    }
}
