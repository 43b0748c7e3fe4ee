//! HiveFS metadata service (`hivefs meta`): one metadata target.
//!
//! Owns the part of the namespace stored on this node: directories, their
//! entries, inodes, extended attributes, stripe settings and the choice of
//! storage targets for new files; the count of open handles; and the deletion
//! of removed files' chunk files on the storage targets. Records are served
//! from memory layers over a redb checkpoint store (`meta.redb` in the data
//! dir; key schema in [`store`] and `docs/design-meta.md`); every mutation
//! goes through one writer that journals many operations as one record
//! (group commit, [`writer`], `store::journal`) and answers only after the
//! append; background checkpoints move the changes into `meta.redb`.
//!
//! It must not hold file contents (storage targets do), decide node or target
//! states (mgmtd does), check permission bits or ACLs (the kernel does, with
//! `default_permissions` and `FUSE_POSIX_ACL`), or map errors to errno (the
//! FUSE crate does). What the kernel leaves to the file system once it
//! enforces ACLs is here: default ACL inheritance and the umask in creates,
//! the mode set from an access ACL, and chmod rewriting it (`ops`).
//!
//! Layout, each module using only those before it: `store` (records, keys,
//! the journal, the memory layers of a batch, checkpoints, opening, quota
//! usage) → `quota` (limits in force) → `ops` (POSIX rules of one node
//! over one transaction) → `cross` (the transactions of operations that
//! touch two metadata nodes) and `fsck` (scans and repairs) → `leases`,
//! `locks` (client state in memory) → `writer` (group commit of `ops`,
//! `cross` and `fsck` changes) → `namespace` (reads, submitting changes,
//! running cross-node operations, request dispatch) → `gc` (chunk disposal)
//! → `mirror` (the namespaces this node serves or keeps copies of, buddy
//! mirroring) → this file (configuration, mgmtd, serving). `chooser` and `targets` (the
//! storage targets' view) stand apart.

#![forbid(unsafe_code)]

pub mod chooser;
pub mod cross;
pub mod events;
pub mod fsck;
pub mod gc;
pub mod leases;
pub mod locks;
pub mod mirror;
pub mod namespace;
pub mod ops;
pub mod quota;
mod replies;
pub mod store;
pub mod targets;
pub mod writer;

#[cfg(test)]
mod tests;

pub use namespace::{Namespace, NamespaceOptions, DB_FILE};
pub use store::StoreError;
pub use targets::DataTargets;

use hivefs_cluster::{register_node, Cluster, NodeIdentity};
pub use hivefs_net::Net;
use hivefs_net::{load_secret, serve, ClientConfig, Handler, Peer, Pools, ServerConfig, ServerHandle};
use hivefs_proto::{Envelope, Reply, Request, Response};
use hivefs_types::error::FsError;
use hivefs_types::fs_err;
use hivefs_types::ids::{NodeId, NodeType};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

/// How long `start` keeps trying to reach mgmtd.
pub const MGMTD_DEADLINE: Duration = Duration::from_secs(30);

/// Configuration of a metadata service (one TOML file; every key has a default).
#[derive(Clone, Debug, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Data dir: `node.toml`, `meta.redb`, `journal/`.
    pub dir: PathBuf,
    /// Address to listen on.
    pub listen: String,
    /// Address of the Prometheus scrape endpoint (`GET /metrics`, text format), e.g.
    /// `0.0.0.0:9100`; absent: no endpoint. Served by the `hivefs` binary
    /// (`hivefs_metrics`); `hivefs up` turns it on with a free port per service.
    pub metrics_listen: Option<String>,
    /// Address others use to reach this node; default: the bound local address.
    pub advertise: Option<String>,
    /// Address of mgmtd.
    pub mgmtd: String,
    /// Shared secret file; `None` disables authentication.
    pub secret_file: Option<PathBuf>,
    /// fdatasync the journal (one per group commit) before acknowledging.
    /// With `false` (the default), an acknowledged operation survives
    /// `kill -9` of the service, not a power loss — as file data that was
    /// not fsynced.
    pub sync: bool,
    /// Journal bytes after which a background checkpoint writes the
    /// changed records into `meta.redb` and deletes the journal segments
    /// (at least 65536). Bounds the memory of changed records and the
    /// replay at start; a filling disk checkpoints earlier.
    pub checkpoint_bytes: u64,
    /// Modification events kept for `hivefs events` consumers (about 160 bytes each);
    /// older ones are dropped and counted. 0: no events are kept.
    pub event_buffer: usize,
    pub heartbeat_interval_ms: u64,
    /// How often the cluster view (targets for new files) is refreshed.
    pub target_refresh_ms: u64,
    /// Creates, mkdirs, links and new xattrs are refused with ENOSPC while
    /// the data dir's file system has less free space than this; removals
    /// still work. It keeps the store from hitting a full disk mid-commit.
    pub min_free_bytes: u64,
    /// File locks of a client (mount) not heard from for this long are
    /// released; clients send keep-alives every third of it.
    pub lock_lease_ms: u64,
    /// How long a mount may cache a file's attributes before asking again
    /// (an attribute lease; changes by others revoke it first, see
    /// `leases`). 0 turns leases off: every `stat` asks this node. At most
    /// 60000.
    pub attr_lease_ms: u64,
    /// Size of the metadata store's page cache in bytes (memory bound of the
    /// node; the kernel's page cache holds the store file as well).
    pub store_cache_bytes: u64,
    /// Threads that serve requests (the `hivefs` binary's async runtime);
    /// 0: one per two cores, at least one ([`Config::worker_threads`]).
    /// Commits run one at a time and a request is mostly memory work, so a
    /// worker more costs wake-ups before it adds throughput.
    pub workers: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            dir: PathBuf::from("/var/lib/hivefs/meta"),
            listen: "127.0.0.1:8005".into(),
            metrics_listen: None,
            advertise: None,
            mgmtd: "127.0.0.1:8008".into(),
            secret_file: None,
            sync: false,
            checkpoint_bytes: store::log::DEFAULT_CHECKPOINT_BYTES,
            event_buffer: events::DEFAULT_CAPACITY,
            heartbeat_interval_ms: 1000,
            target_refresh_ms: 2000,
            min_free_bytes: 64 << 20,
            lock_lease_ms: locks::DEFAULT_LEASE.as_millis() as u64,
            attr_lease_ms: leases::DEFAULT_DURATION.as_millis() as u64,
            store_cache_bytes: store::DEFAULT_CACHE_BYTES,
            workers: 0,
        }
    }
}

impl Config {
    /// The request-serving threads to start: `workers`, or with 0 one per
    /// two of this machine's cores (at least one). On 2 cores shared with
    /// a mount and storage services, one worker instead of two cut the
    /// node's CPU per create and remove by 10-30 % and raised 2-rank
    /// creates and removes 12-47 % (docs/decisions.md).
    pub fn worker_threads(&self) -> usize {
        match self.workers {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get() / 2).max(1),
            n => n,
        }
    }

    /// Reads a TOML configuration file.
    pub fn load(path: &Path) -> Result<Config, MetaError> {
        let s = std::fs::read_to_string(path)
            .map_err(|e| MetaError::Config { path: path.to_path_buf(), message: e.to_string() })?;
        let c: Config =
            toml::from_str(&s).map_err(|e| MetaError::Config { path: path.to_path_buf(), message: e.to_string() })?;
        if c.checkpoint_bytes < store::log::MIN_CHECKPOINT_BYTES {
            return Err(MetaError::Config {
                path: path.to_path_buf(),
                message: format!(
                    "checkpoint_bytes = {} is below the least allowed, {}",
                    c.checkpoint_bytes,
                    store::log::MIN_CHECKPOINT_BYTES
                ),
            });
        }
        Ok(c)
    }
}

/// Why the metadata service could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MetaError {
    #[error("metadata config {path}: {message}")]
    Config { path: PathBuf, message: String },
    #[error("metadata data dir {path}: {source}")]
    DataDir { path: PathBuf, source: std::io::Error },
    #[error("{message}")]
    Secret { path: PathBuf, message: String },
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The transport's message names the address ("cannot listen on …").
    #[error("{source}")]
    Listen { addr: String, source: std::io::Error },
    #[error("cannot register this metadata node (data dir {dir}) with mgmtd at {mgmtd}: {source}")]
    Register { mgmtd: String, dir: PathBuf, source: FsError },
    #[error("mgmtd at {mgmtd} did not name the owner of the root directory: {message}")]
    RootOwner { mgmtd: String, message: String },
    #[error("cannot load the cluster view from mgmtd at {mgmtd}: {message} (a node must know its buddy groups before it serves)")]
    View { mgmtd: String, message: String },
    #[error("cannot create the root directory in {path}: {source}")]
    Root { path: PathBuf, source: FsError },
}

/// The request handler: the namespaces once registration is done.
struct MetaHandler {
    mirrors: RwLock<Option<Arc<mirror::Mirrors>>>,
    /// Refreshed on mgmtd's request even while the namespace is not ready,
    /// so no change notification is lost during start-up.
    cluster: Arc<Cluster>,
    /// Requests answered since start, lease polls not counted (`MetaOpCount`,
    /// for `hivefs bench md`).
    requests: std::sync::atomic::AtomicU64,
}

impl MetaHandler {
    fn mirrors(&self) -> Option<Arc<mirror::Mirrors>> {
        self.mirrors.read().expect("handler lock").clone()
    }
}

impl Handler for MetaHandler {
    /// Metadata requests are CPU work on memory, and a mutation commits in
    /// the task that submits it when no other commit runs (see `writer`):
    /// a connection's lone request is answered in its reader's task.
    fn run_inline(&self, req: &Request) -> bool {
        !matches!(req, Request::LeaseWait { .. } | Request::LeaseWaitDirs { .. } | Request::Events { .. })
    }

    async fn handle(&self, env: Envelope, req: Request, payload: Vec<u8>, _peer: &Peer) -> (Response, Vec<u8>) {
        if req == Request::RefreshView {
            let r = self.cluster.refresh().await.map(|_| Reply::Ok);
            // A group made or switched over: take the new role now.
            if let Some(m) = self.mirrors() {
                let m2 = m.clone();
                m.spawn(async move { m2.follow_roles().await });
            }
            return (r, Vec::new());
        }
        let Some(m) = self.mirrors() else { return (Err(mirror::not_ready()), Vec::new()) };
        if req == Request::MetaOpCount {
            let requests = self.requests.load(std::sync::atomic::Ordering::Relaxed);
            return (Ok(Reply::MetaOpCount { node: m.me, requests }), Vec::new());
        }
        if req == Request::Ping {
            // Served whether or not this node serves a namespace now.
            return (Ok(Reply::Pong { node_type: NodeType::Meta, node: m.me }), Vec::new());
        }
        if let Request::Events { after, max, wait_ms } = req {
            let wait = std::time::Duration::from_millis(u64::from(wait_ms));
            return (Ok(events::log().read(m.me, after, max, wait).await), Vec::new());
        }
        if let Request::MetaMirror { step } = req {
            return (m.step(&env, step, payload).await, Vec::new());
        }
        // Lease polls are the mounts' background traffic, not operations.
        if !matches!(req, Request::LeaseWait { .. } | Request::LeaseWaitDirs { .. }) {
            self.requests.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        let r = match m.serving(env.mirror.as_ref()) {
            Ok(ns) => ns.handle_env(env, req).await,
            Err(e) => Err(e),
        };
        (r, Vec::new())
    }
}

/// A running metadata service.
pub struct MetaService {
    /// The bound listen address (`Net::Tcp`); unspecified with `Net::Pools`.
    pub local_addr: SocketAddr,
    pub node_id: NodeId,
    server: Option<ServerHandle>,
    tasks: Vec<JoinHandle<()>>,
    handler: Arc<MetaHandler>,
}

impl MetaService {
    /// Serves one request as if it had arrived over the network (`Net::Pools`).
    pub async fn handle(&self, env: Envelope, req: Request, payload: Vec<u8>) -> (Response, Vec<u8>) {
        let peer = Peer { addr: SocketAddr::from(([0, 0, 0, 0], 0)) };
        self.handler.handle(env, req, payload, &peer).await
    }

    /// The namespaces this node serves and keeps copies of.
    pub fn mirrors(&self) -> Option<Arc<mirror::Mirrors>> {
        self.handler.mirrors()
    }

    /// This node's own namespace, when it serves it (for in-process tools and tests).
    pub fn namespace(&self) -> Option<Arc<Namespace>> {
        self.handler.mirrors()?.own()
    }

    /// Resolves when the store failed and needs reopening (see
    /// [`Namespace::store_failed`]): the process should exit with an error so
    /// that its supervisor (systemd, `hivefs up`) starts it again.
    pub async fn store_failed(&self) {
        // The failure flag, not the namespace: a namespace given up (demoted) must close.
        match self.handler.mirrors() {
            Some(m) => m.failed.clone().wait().await,
            None => std::future::pending().await,
        }
    }

    /// Stops serving, waits for requests in progress, and closes the stores
    /// (their file locks are released when this returns).
    pub async fn stop(mut self) {
        if let Some(s) = &self.server {
            s.abort();
        }
        for t in self.tasks.drain(..) {
            t.abort();
            let _ = t.await;
        }
        let Some(m) = self.handler.mirrors.write().expect("handler lock").take() else { return };
        m.close_all().await;
    }
}

impl Drop for MetaService {
    fn drop(&mut self) {
        if let Some(s) = &self.server {
            s.abort();
        }
        for t in &self.tasks {
            t.abort();
        }
        if let Some(m) = self.handler.mirrors.write().expect("handler lock").take() {
            m.stop_tasks();
            for s in std::mem::take(&mut *m.slots.write().expect("slots")).into_values() {
                if let mirror::Slot::Serving { ns, .. } = s {
                    ns.stop_tasks();
                }
            }
        }
    }
}

async fn root_owner(cluster: &Cluster, mgmtd: &str) -> Result<NodeId, MetaError> {
    let start = tokio::time::Instant::now();
    loop {
        let r = cluster.mgmt().rpc(&Request::GetRootOwner).await;
        match r {
            Ok(Reply::RootOwner(Some(n))) => return Ok(n),
            Ok(Reply::RootOwner(None)) | Err(_) if start.elapsed() < MGMTD_DEADLINE => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Ok(Reply::RootOwner(None)) => {
                return Err(MetaError::RootOwner { mgmtd: mgmtd.into(), message: "no owner assigned".into() })
            }
            Ok(other) => {
                return Err(MetaError::RootOwner {
                    mgmtd: mgmtd.into(),
                    message: format!("unexpected reply {other:?}"),
                })
            }
            Err(e) => return Err(MetaError::RootOwner { mgmtd: mgmtd.into(), message: e.to_string() }),
        }
    }
}

/// Serves namespace `node` from an opened store in `dir`: starts its
/// writer, creates the root directory if the namespace owns it, and starts
/// its background work (chunk disposal, counts, lease and lock expiry, the
/// cross-node operations it left pending). `grace`: another node served it
/// until now, and clients may hold leases it granted for this much longer.
async fn serve_namespace(
    cluster: Arc<Cluster>,
    cfg: Config,
    sim: Option<Simulated>,
    store: store::Store,
    node: NodeId,
    dir: PathBuf,
    grace: Option<Duration>,
) -> Result<Arc<Namespace>, FsError> {
    let mut opts = NamespaceOptions {
        dir: dir.clone(),
        sync: cfg.sync,
        node,
        seed: None,
        clock: None,
        min_free_bytes: cfg.min_free_bytes,
        inline_writer: None,
    };
    let targets: Arc<dyn DataTargets> = match &sim {
        Some(s) => {
            opts.seed = Some((s.seed)());
            opts.clock = Some(s.clock.clone());
            opts.inline_writer = Some(s.latency.clone());
            s.targets.clone()
        }
        None => Arc::new(targets::ClusterTargets { cluster: cluster.clone() }),
    };
    // Blocking: the batches of opening go through the mirroring hook.
    let ns = store::off_workers(move || Namespace::from_store(store, opts, targets))
        .await
        .map_err(|e| fs_err!(Internal, "{e}"))?
        .map_err(|e| fs_err!(Io, "{e}"))?;
    let ns = Arc::new(ns);
    let root = root_owner(&cluster, &cfg.mgmtd).await.map_err(|e| fs_err!(Unavailable, "{e}"))?;
    if root == node {
        ns.ensure_root().await?;
        info!("namespace {node} holds the root directory");
    }
    ns.add_task(gc::spawn_disposal(ns.clone()));
    ns.set_peers(Arc::new(cross::ClusterPeers { cluster: cluster.clone() }));
    ns.set_crash_hook(cross::CrashHook::from_env());
    // Read before serving: a client retrying one of these waits for it.
    let pending = ns.load_pending()?;
    {
        let ns2 = ns.clone();
        let every = Duration::from_millis(cfg.target_refresh_ms.max(10));
        ns.add_task(tokio::spawn(async move {
            loop {
                ns2.refresh_counts().await;
                tokio::time::sleep(every).await;
            }
        }));
    }
    ns.add_task(tokio::spawn(report_quotas(cluster.clone(), Arc::downgrade(&ns))));
    ns.locks.set_lease(Duration::from_millis(cfg.lock_lease_ms.max(1)));
    if let Some(grace) = grace {
        let until = leases::unix_ms() + grace.min(leases::MAX_DURATION).as_millis() as u64;
        if let Err(e) = hivefs_cluster::write_atomic(&dir.join(leases::UNTIL_FILE), until.to_string().as_bytes()) {
            warn!("{}: {e}", dir.join(leases::UNTIL_FILE).display());
        }
    }
    ns.leases.start_recorded(&dir, Duration::from_millis(cfg.attr_lease_ms));
    ns.add_task(namespace::spawn_lease_recorder(ns.clone()));
    ns.add_task(namespace::spawn_held_settler(ns.clone()));
    ns.add_task(namespace::spawn_lock_expiry(ns.clone()));
    if !pending.is_empty() {
        info!("{} cross-node operations of namespace {node} were pending; finishing them", pending.len());
    }
    ns.add_task(tokio::spawn(ns.clone().recover_intents(pending)));
    Ok(ns)
}

/// What a deterministic simulation (`crates/sim`) puts in place of a
/// metadata service's own sources of time, randomness, threads and storage
/// targets. With it, every namespace served commits in the submitting task
/// after the latency it draws (`Writer::inline`); the simulation also
/// makes blocking work run in place ([`store::run_blocking_in_place_on_this_thread`]).
#[derive(Clone)]
pub struct Simulated {
    pub latency: writer::CommitLatency,
    pub clock: writer::Clock,
    /// Seeds of the choosers, one drawn per namespace served.
    pub seed: Arc<dyn Fn() -> u64 + Send + Sync>,
    pub targets: Arc<dyn DataTargets>,
}

/// Starts a metadata service: opens the store, binds, registers with mgmtd,
/// serves its namespace (or keeps it as a copy when its buddy group made
/// this node the secondary), starts heartbeats (which bring the lease for
/// mirrored namespaces), the cluster view refresh and following the roles
/// of its buddy groups. Returns once serving.
pub async fn start(cfg: Config) -> Result<MetaService, MetaError> {
    start_with(cfg, Net::Tcp, None).await
}

/// [`start`] on the network `net`, with a simulation's seams when given.
pub async fn start_with(cfg: Config, net: Net, sim: Option<Simulated>) -> Result<MetaService, MetaError> {
    let dir = cfg.dir.clone();
    std::fs::create_dir_all(&dir).map_err(|source| MetaError::DataDir { path: dir.clone(), source })?;
    let secret = match &cfg.secret_file {
        Some(p) => Some(load_secret(p).map_err(|message| MetaError::Secret { path: p.clone(), message })?),
        None => None,
    };
    let mut identity =
        NodeIdentity::load_or_create(&dir).map_err(|source| MetaError::DataDir { path: dir.clone(), source })?;
    // Opened before binding: a second service on the same data dir fails
    // here. No new boot epoch yet: a mirrored namespace's copy takes none.
    let mut store = store::Store::open_replica(&dir.join(DB_FILE), cfg.sync, cfg.store_cache_bytes)?;
    store.log.checkpoint_bytes = cfg.checkpoint_bytes;
    events::log().set_capacity(cfg.event_buffer);
    let pools = match &net {
        Net::Tcp => Pools::new(ClientConfig::new(secret.clone())),
        Net::Pools(p) => p.with_config(ClientConfig::new(secret.clone())),
    };
    let cluster = Cluster::new(&cfg.mgmtd, pools);
    let handler =
        Arc::new(MetaHandler { mirrors: RwLock::new(None), cluster: cluster.clone(), requests: Default::default() });
    let server = match net {
        Net::Tcp => Some(
            serve(&cfg.listen, ServerConfig::new(NodeType::Meta, secret.clone()), handler.clone())
                .await
                .map_err(|source| MetaError::Listen { addr: cfg.listen.clone(), source })?,
        ),
        Net::Pools(_) => None,
    };
    let abort = |server: &Option<ServerHandle>| {
        if let Some(s) = server {
            s.abort();
        }
    };
    let local_addr = server.as_ref().map_or(SocketAddr::from(([0, 0, 0, 0], 0)), |s| s.local_addr);
    let advertise = match &cfg.advertise {
        Some(a) => a.clone(),
        // A wildcard reaches no one: registering it would make this node unreachable.
        None if local_addr.ip().is_unspecified() => {
            abort(&server);
            return Err(MetaError::Config {
                path: dir.clone(),
                message: format!(
                    "listen address {} is not reachable by peers; set `advertise` to the address they should use",
                    cfg.listen
                ),
            });
        }
        None => local_addr.to_string(),
    };
    let lease = Arc::new(mirror::Lease::default());

    let setup = async {
        let node = register_node(&*cluster.mgmt(), NodeType::Meta, &dir, &mut identity, &advertise, MGMTD_DEADLINE)
            .await
            .map_err(|source| MetaError::Register { mgmtd: cfg.mgmtd.clone(), dir: dir.clone(), source })?;
        // The view decides whether this node serves its namespace as a
        // group's primary (every commit forwarded) or keeps it as a copy:
        // served alone on a view that failed to load, its commits would
        // reach no secondary while mgmtd holds that secondary current.
        let asked = tokio::time::Instant::now();
        while let Err(e) = cluster.refresh().await {
            if asked.elapsed() > MGMTD_DEADLINE {
                return Err(MetaError::View { mgmtd: cfg.mgmtd.clone(), message: e.to_string() });
            }
            debug!("cluster view refresh from mgmtd {} failed: {e}; trying again", cfg.mgmtd);
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        heartbeat(&cluster, node, &dir, &lease).await;
        let serve_cfg = cfg.clone();
        let serve_cluster = cluster.clone();
        let mirrors = Arc::new(mirror::Mirrors {
            me: node,
            cluster: cluster.clone(),
            lease: lease.clone(),
            cfg: cfg.clone(),
            slots: Default::default(),
            following: Default::default(),
            failed: Default::default(),
            tasks: Default::default(),
            serve: Box::new(move |store, ns, dir, grace| {
                Box::pin(serve_namespace(serve_cluster.clone(), serve_cfg.clone(), sim.clone(), store, ns, dir, grace))
            }),
        });
        let group = cluster.meta_group(node);
        match &group {
            Some(g) if g.secondary == node.0 => {
                info!(group = %g.id, "this node's namespace is served by metadata node {} now: keeping a copy", g.primary);
                mirrors.keep_copy(node, store);
            }
            g => mirrors
                .start_serving(node, store, g.as_ref(), false)
                .await
                .map_err(|source| MetaError::Root { path: dir.clone(), source })?,
        }
        Ok::<_, MetaError>((node, mirrors))
    };
    let (node, mirrors) = match setup.await {
        Ok(x) => x,
        Err(e) => {
            abort(&server);
            return Err(e);
        }
    };

    let mut tasks = Vec::new();
    {
        let (cluster, lease) = (cluster.clone(), lease.clone());
        let every = Duration::from_millis(cfg.heartbeat_interval_ms.max(10));
        let dir = dir.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                heartbeat(&cluster, node, &dir, &lease).await;
            }
        }));
    }
    {
        let (cluster, mirrors) = (cluster.clone(), mirrors.clone());
        let every = Duration::from_millis(cfg.target_refresh_ms.max(10));
        tasks.push(tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                if let Err(e) = cluster.refresh().await {
                    debug!("cluster view refresh failed: {e}");
                }
                mirrors.follow_roles().await;
            }
        }));
    }
    *handler.mirrors.write().expect("handler lock") = Some(mirrors.clone());
    // Copies of other namespaces are opened now, not at the first refresh.
    let m = mirrors.clone();
    mirrors.spawn(async move { m.follow_roles().await });
    info!(%local_addr, %node, %advertise, "metadata service ready");
    Ok(MetaService { local_addr, node_id: node, server, tasks, handler })
}

/// Reports the namespace's usage of every limited user and group to mgmtd
/// and installs the limits and summed usage it answers, as often as its
/// answer says; a failed report keeps the limits in force.
async fn report_quotas(cluster: Arc<Cluster>, ns: std::sync::Weak<Namespace>) {
    let mut every = Duration::from_secs(2);
    loop {
        let Some(n) = ns.upgrade() else { return };
        let req = match n.quota_report() {
            Ok(req) => req,
            Err(e) => {
                warn!("quota usage of namespace {}: {e}", n.node());
                tokio::time::sleep(every).await;
                continue;
            }
        };
        drop(n);
        // mgmtd's sums include this node's usage as reported here, not as it
        // is when the answer arrives: what changed meanwhile is counted as
        // changed since (a removal in between makes room at once).
        let reported: std::collections::HashMap<_, _> = match &req {
            Request::QuotaReport { usage, .. } => usage.iter().copied().collect(),
            _ => Default::default(),
        };
        match cluster.mgmt().rpc(&req).await {
            Ok(Reply::Quotas { interval_ms, quotas, .. }) => {
                let Some(ns) = ns.upgrade() else { return };
                ns.set_quotas(quotas, &reported);
                every = Duration::from_millis(interval_ms.clamp(100, 60_000));
            }
            Ok(r) => debug!("mgmtd answered a quota report with {r:?}"),
            Err(e) => debug!("quota report to mgmtd {}: {e}", cluster.mgmt().addr()),
        }
        tokio::time::sleep(every).await;
    }
}

/// One heartbeat to mgmtd; its answer renews the lease for mirrored namespaces.
async fn heartbeat(cluster: &Cluster, node: NodeId, dir: &Path, lease: &mirror::Lease) {
    let meta = match hivefs_cluster::capacity_of(dir) {
        Ok(c) => Some(c),
        Err(e) => {
            warn!("statvfs of {}: {e}", dir.display());
            None
        }
    };
    let hb = Request::Heartbeat { node_type: NodeType::Meta, node, targets: Vec::new(), meta };
    let sent = tokio::time::Instant::now();
    match cluster.mgmt().rpc(&hb).await {
        Ok(Reply::HeartbeatAck { lease_ms }) => {
            // With metadata groups, the lease counts only with a view loaded
            // after its grant: a group switched over while this node was cut
            // off from mgmtd shows there, so the node never serves reads as a
            // former primary under a fresh lease (`Primary::check`).
            let mirrored = cluster.view().groups.values().any(|g| g.kind == hivefs_proto::GroupKind::Meta);
            if mirrored {
                if let Err(e) = cluster.refresh().await {
                    debug!("cluster view refresh after a heartbeat failed: {e}; the lease is not renewed");
                    return;
                }
            }
            lease.renew(sent, lease_ms)
        }
        Ok(_) => {}
        Err(e) => warn!("heartbeat to mgmtd {} failed: {e}", cluster.mgmt().addr()),
    }
}
