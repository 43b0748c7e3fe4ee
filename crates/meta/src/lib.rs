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
//! states (mgmtd does), check permission bits (the kernel does, with
//! `default_permissions`), or map errors to errno (the FUSE crate does).
//!
//! Layout, each module using only those before it: `store` (records, keys,
//! the journal, the memory layers of a batch, checkpoints, opening) → `ops` (POSIX rules of one node
//! over one transaction) → `cross` (the transactions of operations that
//! touch two metadata nodes) and `fsck` (scans and repairs) → `leases`,
//! `locks` (client state in memory) → `writer` (group commit of `ops`,
//! `cross` and `fsck` changes) → `namespace` (reads, submitting changes,
//! running cross-node operations, request dispatch) → `gc` (chunk disposal)
//! → this file (configuration, mgmtd, serving). `chooser` and `targets` (the
//! storage targets' view) stand apart.

#![forbid(unsafe_code)]

pub mod chooser;
pub mod cross;
pub mod fsck;
pub mod gc;
pub mod leases;
pub mod locks;
pub mod namespace;
pub mod ops;
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
}

impl Default for Config {
    fn default() -> Self {
        Config {
            dir: PathBuf::from("/var/lib/hivefs/meta"),
            listen: "127.0.0.1:8005".into(),
            advertise: None,
            mgmtd: "127.0.0.1:8008".into(),
            secret_file: None,
            sync: false,
            checkpoint_bytes: store::log::DEFAULT_CHECKPOINT_BYTES,
            heartbeat_interval_ms: 1000,
            target_refresh_ms: 2000,
            min_free_bytes: 64 << 20,
            lock_lease_ms: locks::DEFAULT_LEASE.as_millis() as u64,
            attr_lease_ms: leases::DEFAULT_DURATION.as_millis() as u64,
            store_cache_bytes: store::DEFAULT_CACHE_BYTES,
        }
    }
}

impl Config {
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
    #[error("cannot create the root directory in {path}: {source}")]
    Root { path: PathBuf, source: FsError },
}

/// The request handler: the namespace once registration is done.
struct MetaHandler {
    ns: RwLock<Option<Arc<Namespace>>>,
    /// Refreshed on mgmtd's request even while the namespace is not ready,
    /// so no change notification is lost during start-up.
    cluster: Arc<Cluster>,
    /// Requests answered since start, lease polls not counted (`MetaOpCount`,
    /// for `hivefs bench md`).
    requests: std::sync::atomic::AtomicU64,
}

impl MetaHandler {
    fn set(&self, ns: Option<Arc<Namespace>>) -> Option<Arc<Namespace>> {
        std::mem::replace(&mut *self.ns.write().expect("handler lock"), ns)
    }
}

impl Handler for MetaHandler {
    async fn handle(&self, env: Envelope, req: Request, _payload: Vec<u8>, _peer: &Peer) -> (Response, Vec<u8>) {
        if req == Request::RefreshView {
            return (self.cluster.refresh().await.map(|_| Reply::Ok), Vec::new());
        }
        let ns = self.ns.read().expect("handler lock").clone();
        if req == Request::MetaOpCount {
            let requests = self.requests.load(std::sync::atomic::Ordering::Relaxed);
            let r = match ns {
                Some(ns) => Ok(Reply::MetaOpCount { node: ns.node(), requests }),
                None => Err(fs_err!(Unavailable, "metadata service is starting or stopping")),
            };
            return (r, Vec::new());
        }
        // Lease polls are the mounts' background traffic, not operations.
        if !matches!(req, Request::LeaseWait { .. } | Request::LeaseWaitDirs { .. }) {
            self.requests.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        let r = match ns {
            Some(ns) => ns.handle_env(env, req).await,
            None => Err(fs_err!(Unavailable, "metadata service is starting or stopping")),
        };
        (r, Vec::new())
    }
}

/// A running metadata service.
pub struct MetaService {
    pub local_addr: SocketAddr,
    pub node_id: NodeId,
    server: ServerHandle,
    tasks: Vec<JoinHandle<()>>,
    handler: Arc<MetaHandler>,
}

impl MetaService {
    /// The namespace being served (for in-process tools and tests).
    pub fn namespace(&self) -> Option<Arc<Namespace>> {
        self.handler.ns.read().expect("handler lock").clone()
    }

    /// Resolves when the store failed and needs reopening (see
    /// [`Namespace::store_failed`]): the process should exit with an error so
    /// that its supervisor (systemd, `hivefs up`) starts it again.
    pub async fn store_failed(&self) {
        match self.namespace() {
            Some(ns) => ns.store_failed().await,
            None => std::future::pending().await,
        }
    }

    /// Stops serving, waits for requests in progress, and closes the store
    /// (its file lock is released when this returns).
    pub async fn stop(mut self) {
        self.server.abort();
        for t in self.tasks.drain(..) {
            t.abort();
            let _ = t.await;
        }
        let Some(ns) = self.handler.set(None) else { return };
        // Requests in flight hold the namespace; they finish within their timeouts.
        let mut ns = ns;
        for _ in 0..1000 {
            match Arc::try_unwrap(ns) {
                Ok(n) => {
                    let _ = tokio::task::spawn_blocking(move || n.close()).await;
                    return;
                }
                Err(still_shared) => {
                    ns = still_shared;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }
        warn!("metadata namespace still in use 10 s after stop; it closes when the last request ends");
    }
}

impl Drop for MetaService {
    fn drop(&mut self) {
        self.server.abort();
        for t in &self.tasks {
            t.abort();
        }
        self.handler.set(None);
    }
}

/// The address to advertise when none is configured: the bound address, with
/// a wildcard IP replaced by loopback (a wildcard reaches no one).
fn default_advertise(local: SocketAddr) -> String {
    if local.ip().is_unspecified() {
        warn!("listening on {local}: advertising 127.0.0.1:{}; set `advertise` for other hosts", local.port());
        format!("127.0.0.1:{}", local.port())
    } else {
        local.to_string()
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

/// Starts a metadata service: opens the store, binds, registers with mgmtd,
/// creates the root directory if this node owns it, starts heartbeats, the
/// cluster view refresh and chunk disposal. Returns once serving.
pub async fn start(cfg: Config) -> Result<MetaService, MetaError> {
    let dir = cfg.dir.clone();
    std::fs::create_dir_all(&dir).map_err(|source| MetaError::DataDir { path: dir.clone(), source })?;
    let secret = match &cfg.secret_file {
        Some(p) => Some(load_secret(p).map_err(|message| MetaError::Secret { path: p.clone(), message })?),
        None => None,
    };
    let mut identity =
        NodeIdentity::load_or_create(&dir).map_err(|source| MetaError::DataDir { path: dir.clone(), source })?;
    // Opened before binding: a second service on the same data dir fails here.
    let mut store = store::Store::open_with_cache(&dir.join(DB_FILE), cfg.sync, cfg.store_cache_bytes)?;
    store.log.checkpoint_bytes = cfg.checkpoint_bytes;
    let pools = Pools::new(ClientConfig::new(secret.clone()));
    let cluster = Cluster::new(&cfg.mgmtd, pools);
    let handler =
        Arc::new(MetaHandler { ns: RwLock::new(None), cluster: cluster.clone(), requests: Default::default() });
    let server = serve(&cfg.listen, ServerConfig::new(NodeType::Meta, secret.clone()), handler.clone())
        .await
        .map_err(|source| MetaError::Listen { addr: cfg.listen.clone(), source })?;
    let local_addr = server.local_addr;
    let advertise = cfg.advertise.clone().unwrap_or_else(|| default_advertise(local_addr));

    let setup = async {
        let node = register_node(&*cluster.mgmt(), NodeType::Meta, &dir, &mut identity, &advertise, MGMTD_DEADLINE)
            .await
            .map_err(|source| MetaError::Register { mgmtd: cfg.mgmtd.clone(), dir: dir.clone(), source })?;
        let opts = NamespaceOptions {
            dir: dir.clone(),
            sync: cfg.sync,
            node,
            seed: None,
            clock: None,
            min_free_bytes: cfg.min_free_bytes,
            inline_writer: None,
        };
        let targets = Arc::new(targets::ClusterTargets { cluster: cluster.clone() });
        let ns = Arc::new(Namespace::from_store(store, opts, targets)?);
        if let Err(e) = cluster.refresh().await {
            warn!("first cluster view refresh from mgmtd {} failed: {e}", cfg.mgmtd);
        }
        if root_owner(&cluster, &cfg.mgmtd).await? == node {
            ns.ensure_root().await.map_err(|source| MetaError::Root { path: dir.clone(), source })?;
            info!("this metadata node {node} owns the root directory");
        }
        Ok::<_, MetaError>((node, ns))
    };
    let (node, ns) = match setup.await {
        Ok(x) => x,
        Err(e) => {
            server.abort();
            return Err(e);
        }
    };

    let mut tasks = Vec::new();
    {
        let mgmt = cluster.mgmt();
        let every = Duration::from_millis(cfg.heartbeat_interval_ms.max(10));
        let dir = dir.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                let meta = match hivefs_cluster::capacity_of(&dir) {
                    Ok(c) => Some(c),
                    Err(e) => {
                        warn!("statvfs of {}: {e}", dir.display());
                        None
                    }
                };
                let hb = Request::Heartbeat { node_type: NodeType::Meta, node, targets: Vec::new(), meta };
                if let Err(e) = mgmt.rpc(&hb).await {
                    warn!("heartbeat to mgmtd {} failed: {e}", mgmt.addr());
                }
                tokio::time::sleep(every).await;
            }
        }));
    }
    {
        let cluster = cluster.clone();
        let every = Duration::from_millis(cfg.target_refresh_ms.max(10));
        tasks.push(tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                if let Err(e) = cluster.refresh().await {
                    debug!("cluster view refresh failed: {e}");
                }
            }
        }));
    }
    tasks.push(gc::spawn_disposal(ns.clone()));
    ns.set_peers(Arc::new(cross::ClusterPeers { cluster: cluster.clone() }));
    ns.set_crash_hook(cross::CrashHook::from_env());
    // Read before serving: a client retrying one of these waits for it.
    let pending = ns.load_pending().map_err(|source| MetaError::Root { path: dir.clone(), source })?;
    {
        let ns = ns.clone();
        let every = Duration::from_millis(cfg.target_refresh_ms.max(10));
        tasks.push(tokio::spawn(async move {
            loop {
                ns.refresh_counts().await;
                tokio::time::sleep(every).await;
            }
        }));
    }
    ns.locks.set_lease(Duration::from_millis(cfg.lock_lease_ms.max(1)));
    ns.leases.start_recorded(&dir, Duration::from_millis(cfg.attr_lease_ms));
    tasks.push(namespace::spawn_lease_recorder(ns.clone()));
    tasks.push(namespace::spawn_lock_expiry(ns.clone()));
    handler.set(Some(ns.clone()));
    if !pending.is_empty() {
        info!("{} cross-node operations were pending at start; finishing them", pending.len());
    }
    tasks.push(tokio::spawn(ns.recover_intents(pending)));
    info!(%local_addr, %node, %advertise, "metadata service ready");
    Ok(MetaService { local_addr, node_id: node, server, tasks, handler })
}
