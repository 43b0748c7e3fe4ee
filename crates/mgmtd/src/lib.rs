//! HiveFS management service (`hivefs mgmtd`).
//!
//! Owns the registry of nodes, storage targets and storage pools (ids
//! assigned here, stable per uuid and persisted in `<dir>/registry.toml`),
//! the owner of the root directory (the first metadata node ever
//! registered), the liveness of every node and target (heartbeats, reported
//! capacities, reachability) and each target's capacity pool (normal, low,
//! emergency: derived from its reported free space and free inodes).
//!
//! It must not touch file data or the namespace, and must not hold anything
//! in memory that a restart cannot rebuild: the registry is written before a
//! registration is acknowledged; liveness restarts from "not heard from since
//! mgmtd started". It answers only management requests; everything else gets
//! `ErrorCode::NotSupported`.
//!
//! The service is a library: [`start`] runs it inside the caller's tokio
//! runtime, so tests run it in-process and the binary stays thin.
//!
//! # Configuration
//!
//! One TOML file ([`Config`]); every key is optional, unknown keys are an
//! error:
//!
//! | key | default | meaning |
//! |---|---|---|
//! | `dir` | `/var/lib/hivefs/mgmtd` | holds `registry.toml` |
//! | `listen` | `127.0.0.1:8008` | address to serve on |
//! | `secret_file` | none: no authentication | shared secret file |
//! | `probably_offline_after_ms` | `10000` | not heard from this long: probably-offline (> 0) |
//! | `offline_after_ms` | `30000` | … this long: offline (>= `probably_offline_after_ms`) |
//! | `space_low_limit_bytes` | `1073741824` (1 GiB) | less free space: not in the normal capacity pool |
//! | `space_emergency_limit_bytes` | `268435456` (256 MiB) | less: emergency (<= `space_low_limit_bytes`) |
//! | `inodes_low_limit` | `10000` | fewer free inodes: not in the normal capacity pool |
//! | `inodes_emergency_limit` | `1000` | fewer: emergency (<= `inodes_low_limit`) |
//!
//! A target is in the normal capacity pool when its free space and its free
//! inodes are both at least the low limits, in the low pool when both are at
//! least the emergency limits, else in the emergency pool (as is a target
//! that has not reported its capacity yet); a file system that reports no
//! inode count at all (btrfs) is classified by its free space alone. See
//! [`capacity_pool`]. The limits apply to every storage pool alike.

#![forbid(unsafe_code)]

pub mod quota;
pub mod registry;
pub mod state;

pub use registry::{NodeRecord, PoolRecord, Registry, TargetRecord, DEFAULT_POOL_NAME, REGISTRY_FILE};
pub use state::{capacity_pool, classify, CapacityLimits, Mgmt, Timeouts, MGMT_NODE_ID};

use hivefs_net::{serve, Handler, Peer, ServerConfig, ServerHandle};
use hivefs_proto::{Reachability, Request, Response};
use hivefs_types::fs_err;
use hivefs_types::ids::NodeType;
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// The registry lives here (`registry.toml`).
    pub dir: PathBuf,
    pub listen: String,
    /// Address of the Prometheus scrape endpoint (`GET /metrics`, text format), e.g.
    /// `0.0.0.0:9100`; absent: no endpoint. Served by the `hivefs` binary
    /// (`hivefs_metrics`); `hivefs up` turns it on with a free port per service.
    pub metrics_listen: Option<String>,
    /// Shared secret file; `None` disables authentication.
    pub secret_file: Option<PathBuf>,
    /// A node or target is probably-offline once its last report is this old.
    pub probably_offline_after_ms: u64,
    /// … and offline once it is this old.
    pub offline_after_ms: u64,
    /// A buddy group's primary whose last report is this old is replaced by
    /// its secondary (when that is online and good); primaries hold leases
    /// of half of it (`docs/design-mirror.md`). Default: the offline timeout.
    pub failover_after_ms: u64,
    /// A target with less free space than this is not in the normal
    /// capacity pool.
    pub space_low_limit_bytes: u64,
    /// A target with less free space than this is in the emergency capacity
    /// pool. At most `space_low_limit_bytes`.
    pub space_emergency_limit_bytes: u64,
    /// A target with fewer free inodes than this is not in the normal
    /// capacity pool.
    pub inodes_low_limit: u64,
    /// A target with fewer free inodes than this is in the emergency
    /// capacity pool. At most `inodes_low_limit`.
    pub inodes_emergency_limit: u64,
    /// How often each metadata namespace reports its quota usage (and
    /// fetches the limits): the slack of quota enforcement across nodes
    /// (`docs/design-quota.md`). 100 ms to 60 s.
    pub quota_interval_ms: u64,
}

impl Config {
    pub fn capacity_limits(&self) -> CapacityLimits {
        CapacityLimits {
            space_low_limit_bytes: self.space_low_limit_bytes,
            space_emergency_limit_bytes: self.space_emergency_limit_bytes,
            inodes_low_limit: self.inodes_low_limit,
            inodes_emergency_limit: self.inodes_emergency_limit,
        }
    }

    /// Checks the relations between keys; [`start`] refuses a config that fails.
    pub fn validate(&self) -> Result<(), MgmtError> {
        if self.probably_offline_after_ms == 0 || self.probably_offline_after_ms > self.offline_after_ms {
            return Err(MgmtError::Config(format!(
                "need 0 < probably_offline_after_ms ({}) <= offline_after_ms ({})",
                self.probably_offline_after_ms, self.offline_after_ms
            )));
        }
        if self.failover_after_ms < self.probably_offline_after_ms {
            return Err(MgmtError::Config(format!(
                "need failover_after_ms ({}) >= probably_offline_after_ms ({})",
                self.failover_after_ms, self.probably_offline_after_ms
            )));
        }
        if !(100..=60_000).contains(&self.quota_interval_ms) {
            return Err(MgmtError::Config(format!(
                "quota_interval_ms ({}) must be 100 to 60000",
                self.quota_interval_ms
            )));
        }
        self.capacity_limits().validate().map_err(MgmtError::Config)
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            dir: PathBuf::from("/var/lib/hivefs/mgmtd"),
            listen: "127.0.0.1:8008".into(),
            metrics_listen: None,
            secret_file: None,
            probably_offline_after_ms: 10_000,
            offline_after_ms: 30_000,
            failover_after_ms: 30_000,
            space_low_limit_bytes: CapacityLimits::DEFAULT.space_low_limit_bytes,
            space_emergency_limit_bytes: CapacityLimits::DEFAULT.space_emergency_limit_bytes,
            inodes_low_limit: CapacityLimits::DEFAULT.inodes_low_limit,
            inodes_emergency_limit: CapacityLimits::DEFAULT.inodes_emergency_limit,
            quota_interval_ms: quota::DEFAULT_INTERVAL_MS,
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MgmtError {
    #[error("invalid mgmtd configuration: {0}")]
    Config(String),
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    #[error("registry {} is corrupt: {reason} (fix or restore it; mgmtd will not start over it)", path.display())]
    CorruptRegistry { path: PathBuf, reason: String },
    #[error("{0}")]
    Secret(String),
    #[error("mgmtd cannot listen on {addr}: {source}")]
    Listen { addr: String, source: std::io::Error },
}

/// A running management service. Dropping it (or [`MgmtService::stop`])
/// stops accepting connections.
#[must_use = "the service stops when this handle is dropped"]
pub struct MgmtService {
    pub local_addr: SocketAddr,
    server: ServerHandle,
    failover: tokio::task::JoinHandle<()>,
}

impl MgmtService {
    /// Stops accepting connections. (Connections already accepted are
    /// served until their peers close them: a transport limitation.)
    pub fn stop(self) {}
}

impl Drop for MgmtService {
    fn drop(&mut self) {
        self.server.abort();
        self.failover.abort();
    }
}

struct MgmtHandler {
    state: Arc<Mutex<Mgmt>>,
    /// Connections to the metadata nodes, for change notifications.
    pools: hivefs_net::Pools,
}

/// Time a change notification may take; a metadata node that does not answer
/// by then picks the change up with its periodic refresh.
const NOTIFY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

impl MgmtHandler {
    async fn notify_metas(&self) {
        notify_metas(&self.state, &self.pools).await
    }
}

/// Tells every online metadata node to reload its view (as BeeGFS's mgmtd
/// pushes target maps), and waits for them, bounded by [`NOTIFY_TIMEOUT`]:
/// a file created after a target registration is acknowledged can use it,
/// a directory created after a metadata node's registration may live there,
/// and a metadata group's new primary takes over at once.
async fn notify_metas(state: &Mutex<Mgmt>, pools: &hivefs_net::Pools) {
    let addrs: Vec<String> = lock(state)
        .list_nodes(Some(NodeType::Meta), Instant::now())
        .into_iter()
        .filter(|n| n.reachability == hivefs_proto::Reachability::Online)
        .map(|n| n.addr)
        .collect();
    let mut set = tokio::task::JoinSet::new();
    for addr in addrs {
        let pool = pools.get(&addr);
        set.spawn(async move {
            if let Err(e) = pool.rpc(&Request::RefreshView).await {
                tracing::debug!("metadata node {addr} did not take the view refresh: {e}");
            }
        });
    }
    let _ = tokio::time::timeout(NOTIFY_TIMEOUT, async { while set.join_next().await.is_some() {} }).await;
}

impl Handler for MgmtHandler {
    async fn handle(
        &self,
        _env: hivefs_proto::Envelope,
        req: Request,
        _payload: Vec<u8>,
        _peer: &Peer,
    ) -> (Response, Vec<u8>) {
        let resp = match req {
            // These write the registry (fsync): off the async workers.
            Request::RegisterNode { .. }
            | Request::RegisterTarget { .. }
            | Request::CreatePool { .. }
            | Request::CreateGroup { .. }
            | Request::SetMemberState { .. }
            | Request::SetQuota(_)
            | Request::MoveTargetToPool { .. } => {
                // Metadata nodes choose owners of new directories among the
                // metadata nodes they know: a new one is usable once `up` sees it.
                let changes_view = !matches!(
                    req,
                    Request::RegisterNode { .. } | Request::SetMemberState { .. } | Request::SetQuota(_)
                ) || matches!(req, Request::RegisterNode { node_type: NodeType::Meta, .. });
                let state = self.state.clone();
                let r = tokio::task::spawn_blocking(move || lock(&state).handle(req, Instant::now()))
                    .await
                    .unwrap_or_else(|e| Err(fs_err!(Internal, "mgmtd registry task failed: {e}")));
                if changes_view && r.is_ok() {
                    self.notify_metas().await;
                }
                r
            }
            _ => lock(&self.state).handle(req, Instant::now()),
        };
        (resp, Vec::new())
    }
}

fn lock(state: &Mutex<Mgmt>) -> std::sync::MutexGuard<'_, Mgmt> {
    // A panic while holding the lock cannot leave the registry half-changed
    // (mutations run on a copy), so a poisoned lock is still consistent.
    state.lock().unwrap_or_else(|p| p.into_inner())
}

/// Loads the registry and serves management requests on `cfg.listen`.
pub async fn start(cfg: Config) -> Result<MgmtService, MgmtError> {
    cfg.validate()?;
    let secret = match &cfg.secret_file {
        Some(p) => Some(hivefs_net::load_secret(p).map_err(MgmtError::Secret)?),
        None => None,
    };
    let timeouts = Timeouts {
        probably_offline_after_ms: cfg.probably_offline_after_ms,
        offline_after_ms: cfg.offline_after_ms,
        failover_after_ms: cfg.failover_after_ms,
    };
    let limits = cfg.capacity_limits();
    let dir = cfg.dir.clone();
    let mut mgmt = tokio::task::spawn_blocking(move || Mgmt::open(&dir, timeouts, limits, Instant::now()))
        .await
        .map_err(|e| MgmtError::Config(format!("registry loader failed: {e}")))??;
    mgmt.set_quota_interval(cfg.quota_interval_ms);
    let mut ccfg = hivefs_net::ClientConfig::new(secret.clone());
    ccfg.request_timeout = NOTIFY_TIMEOUT;
    ccfg.connect_timeout = NOTIFY_TIMEOUT;
    ccfg.retries = 0;
    ccfg.conns_per_peer = 1;
    let state = Arc::new(Mutex::new(mgmt));
    scrape_registry(&state);
    let pools = hivefs_net::Pools::new(ccfg);
    let failover = tokio::spawn(failover_loop(state.clone(), pools.clone()));
    let handler = Arc::new(MgmtHandler { state, pools });
    let server = serve(&cfg.listen, ServerConfig::new(NodeType::Mgmt, secret), handler)
        .await
        .map_err(|source| MgmtError::Listen { addr: cfg.listen.clone(), source })?;
    tracing::info!(addr = %server.local_addr, dir = %cfg.dir.display(), "mgmtd started");
    Ok(MgmtService { local_addr: server.local_addr, server, failover })
}

/// At each scrape: nodes and targets by reachability, and every target's space (what
/// mgmtd last heard), so one scrape of mgmtd shows the whole file system.
fn scrape_registry(state: &Arc<Mutex<Mgmt>>) {
    let weak = Arc::downgrade(state);
    hivefs_metrics::on_scrape(move || {
        let Some(st) = weak.upgrade() else { return };
        let now = Instant::now();
        let (nodes, targets) = {
            let g = st.lock().unwrap_or_else(|e| e.into_inner());
            (g.list_nodes(None, now), g.list_targets(now))
        };
        let states = [Reachability::Online, Reachability::ProbablyOffline, Reachability::Offline];
        for r in states {
            for (kind, t) in [("meta", NodeType::Meta), ("storage", NodeType::Storage)] {
                let n = nodes.iter().filter(|n| n.node_type == t && n.reachability == r).count();
                hivefs_metrics::registered(true, kind, r.as_str(), n);
            }
            let n = targets.iter().filter(|t| t.reachability == r).count();
            hivefs_metrics::registered(false, "storage", r.as_str(), n);
        }
        for t in &targets {
            hivefs_metrics::target_space(t.id.0, t.node.0, t.capacity.total_bytes, t.capacity.free_bytes);
        }
    });
}

/// How often mgmtd looks for buddy groups to switch over.
const FAILOVER_CHECK: std::time::Duration = std::time::Duration::from_millis(500);

/// Switches buddy groups over when their primaries go silent
/// ([`Mgmt::failover`]) and tells the metadata nodes (a metadata group's new
/// primary serves at once); a registry write failure is retried at the next check.
async fn failover_loop(state: Arc<Mutex<Mgmt>>, pools: hivefs_net::Pools) {
    loop {
        tokio::time::sleep(FAILOVER_CHECK).await;
        let st = state.clone();
        match tokio::task::spawn_blocking(move || lock(&st).failover(Instant::now())).await {
            Ok(Ok(switched)) if !switched.is_empty() => notify_metas(&state, &pools).await,
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::error!("buddy group failover not persisted, retried: {e}"),
            Err(e) => tracing::error!("failover check failed: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hivefs_net::{call_once, ClientConfig};
    use hivefs_proto::{CapacityPool, PoolInfo, Reply};
    use hivefs_types::ids::{NodeId, PoolId, TargetId};

    #[test]
    fn config_defaults_and_unknown_keys() {
        let c: Config = toml::from_str("dir = \"/x\"").unwrap();
        assert_eq!(
            (c.listen.as_str(), c.probably_offline_after_ms, c.offline_after_ms),
            ("127.0.0.1:8008", 10_000, 30_000)
        );
        assert!(toml::from_str::<Config>("dri = \"/x\"").is_err());
        assert_eq!(c.capacity_limits(), CapacityLimits::DEFAULT);
        assert_eq!(
            (c.space_low_limit_bytes, c.space_emergency_limit_bytes, c.inodes_low_limit, c.inodes_emergency_limit),
            (1 << 30, 256 << 20, 10_000, 1_000)
        );
        assert!(c.validate().is_ok());
        assert!(Config::default().validate().is_ok());

        let c: Config = toml::from_str(
            "space_low_limit_bytes = 5000\nspace_emergency_limit_bytes = 500\n\
             inodes_low_limit = 70\ninodes_emergency_limit = 7",
        )
        .unwrap();
        assert_eq!(
            c.capacity_limits(),
            CapacityLimits {
                space_low_limit_bytes: 5000,
                space_emergency_limit_bytes: 500,
                inodes_low_limit: 70,
                inodes_emergency_limit: 7
            }
        );
        assert!(toml::from_str::<Config>("space_low_limit = 1").is_err());
    }

    #[test]
    fn capacity_limits_are_validated() {
        let c = Config { space_low_limit_bytes: 100, space_emergency_limit_bytes: 101, ..Default::default() };
        let e = c.validate().unwrap_err();
        assert!(matches!(e, MgmtError::Config(_)), "{e}");
        assert_eq!(
            e.to_string(),
            "invalid mgmtd configuration: need space_emergency_limit_bytes (101) <= space_low_limit_bytes (100)"
        );
        let c = Config { inodes_low_limit: 0, ..Default::default() };
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("need inodes_emergency_limit (1000) <= inodes_low_limit (0)"), "{e}");
        // Equal limits are fine: there is then no low pool.
        let c = Config {
            space_low_limit_bytes: 1,
            space_emergency_limit_bytes: 1,
            inodes_low_limit: 0,
            inodes_emergency_limit: 0,
            ..Default::default()
        };
        assert!(c.validate().is_ok());
    }

    #[tokio::test]
    async fn service_keeps_ids_across_restart() {
        let d = tempfile::tempdir().unwrap();
        let cfg = Config { dir: d.path().to_path_buf(), listen: "127.0.0.1:0".into(), ..Default::default() };
        let reg = |uuid: &str| Request::RegisterNode {
            node_type: NodeType::Storage,
            uuid: uuid.into(),
            addr: "127.0.0.1:9".into(),
            hostname: "h".into(),
        };
        let cc = ClientConfig::new(None);
        let svc = start(cfg.clone()).await.unwrap();
        let addr = svc.local_addr.to_string();
        assert_eq!(
            call_once(&addr, &cc, &Request::Ping).await.unwrap(),
            Reply::Pong { node_type: NodeType::Mgmt, node: MGMT_NODE_ID }
        );
        assert_eq!(call_once(&addr, &cc, &reg("a")).await.unwrap(), Reply::NodeRegistered { node: NodeId(1) });
        assert_eq!(call_once(&addr, &cc, &reg("b")).await.unwrap(), Reply::NodeRegistered { node: NodeId(2) });
        svc.stop();

        let svc = start(cfg.clone()).await.unwrap();
        let addr = svc.local_addr.to_string();
        assert_eq!(call_once(&addr, &cc, &reg("b")).await.unwrap(), Reply::NodeRegistered { node: NodeId(2) });
        assert_eq!(call_once(&addr, &cc, &reg("c")).await.unwrap(), Reply::NodeRegistered { node: NodeId(3) });
        let e = call_once(&addr, &cc, &Request::MetaStat).await.unwrap_err();
        assert_eq!(e.code, hivefs_types::ErrorCode::NotSupported);
    }

    #[tokio::test]
    async fn storage_pools_over_the_wire_and_across_restart() {
        let d = tempfile::tempdir().unwrap();
        let cfg = Config { dir: d.path().to_path_buf(), listen: "127.0.0.1:0".into(), ..Default::default() };
        let cc = ClientConfig::new(None);
        let svc = start(cfg.clone()).await.unwrap();
        let addr = svc.local_addr.to_string();
        let reg = Request::RegisterNode {
            node_type: NodeType::Storage,
            uuid: "s".into(),
            addr: "127.0.0.1:9".into(),
            hostname: "h".into(),
        };
        assert_eq!(call_once(&addr, &cc, &reg).await.unwrap(), Reply::NodeRegistered { node: NodeId(1) });
        let reg_t =
            |uuid: &str| Request::RegisterTarget { node: NodeId(1), uuid: uuid.into(), capacity: Default::default() };
        for (i, uuid) in ["t1", "t2"].into_iter().enumerate() {
            let r = call_once(&addr, &cc, &reg_t(uuid)).await.unwrap();
            assert_eq!(r, Reply::TargetRegistered { target: TargetId(i as u32 + 1), pool: PoolId::DEFAULT });
        }
        let create = Request::CreatePool { name: "ssd".into() };
        assert_eq!(call_once(&addr, &cc, &create).await.unwrap(), Reply::PoolCreated { pool: PoolId(2) });
        let e = call_once(&addr, &cc, &create).await.unwrap_err();
        assert_eq!(e.code, hivefs_types::ErrorCode::Exists);
        let mv = Request::MoveTargetToPool { target: TargetId(2), pool: PoolId(2) };
        assert_eq!(call_once(&addr, &cc, &mv).await.unwrap(), Reply::Ok);
        let want = Reply::Pools(vec![
            PoolInfo { id: PoolId::DEFAULT, name: "default".into(), targets: vec![TargetId(1)] },
            PoolInfo { id: PoolId(2), name: "ssd".into(), targets: vec![TargetId(2)] },
        ]);
        assert_eq!(call_once(&addr, &cc, &Request::ListPools).await.unwrap(), want);
        // Nothing reported yet: every target is in the emergency capacity pool.
        let Reply::Targets(ts) = call_once(&addr, &cc, &Request::ListTargets).await.unwrap() else { panic!() };
        assert!(ts.iter().all(|t| t.capacity_pool == CapacityPool::Emergency), "{ts:?}");
        svc.stop();

        let svc = start(cfg).await.unwrap();
        let addr = svc.local_addr.to_string();
        assert_eq!(call_once(&addr, &cc, &Request::ListPools).await.unwrap(), want);
        let r = call_once(&addr, &cc, &reg_t("t2")).await.unwrap();
        assert_eq!(r, Reply::TargetRegistered { target: TargetId(2), pool: PoolId(2) });
    }

    /// Counts the view refreshes mgmtd asks of it (a metadata node's stand-in).
    struct Views(std::sync::atomic::AtomicU32);

    impl Handler for Views {
        async fn handle(
            &self,
            _env: hivefs_proto::Envelope,
            req: Request,
            _payload: Vec<u8>,
            _peer: &Peer,
        ) -> (Response, Vec<u8>) {
            if req == Request::RefreshView {
                self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
            (Ok(Reply::Ok), Vec::new())
        }
    }

    #[tokio::test]
    async fn metadata_nodes_hear_of_new_metadata_nodes_and_targets_before_the_answer() {
        let d = tempfile::tempdir().unwrap();
        let cfg = Config { dir: d.path().to_path_buf(), listen: "127.0.0.1:0".into(), ..Default::default() };
        let cc = ClientConfig::new(None);
        let svc = start(cfg).await.unwrap();
        let addr = svc.local_addr.to_string();
        let views = Arc::new(Views(Default::default()));
        let meta = serve("127.0.0.1:0", ServerConfig::new(NodeType::Meta, None), views.clone()).await.unwrap();
        let count = || views.0.load(std::sync::atomic::Ordering::SeqCst);
        let reg = |node_type: NodeType, uuid: &str, addr: String| Request::RegisterNode {
            node_type,
            uuid: uuid.into(),
            addr,
            hostname: "h".into(),
        };
        call_once(&addr, &cc, &reg(NodeType::Meta, "m1", meta.local_addr.to_string())).await.unwrap();
        let after_first = count();
        call_once(&addr, &cc, &reg(NodeType::Meta, "m2", "127.0.0.1:9".into())).await.unwrap();
        assert_eq!(count(), after_first + 1, "a second metadata node registered");
        let r = call_once(&addr, &cc, &reg(NodeType::Storage, "s", "127.0.0.1:9".into())).await.unwrap();
        let Reply::NodeRegistered { node } = r else { panic!("{r:?}") };
        assert_eq!(count(), after_first + 1, "a storage node alone changes nothing a metadata node chooses from");
        let t = Request::RegisterTarget { node, uuid: "t".into(), capacity: Default::default() };
        call_once(&addr, &cc, &t).await.unwrap();
        assert_eq!(count(), after_first + 2, "a target registered");
        meta.abort();
    }

    #[tokio::test]
    async fn bad_config_and_corrupt_registry_fail_start() {
        let d = tempfile::tempdir().unwrap();
        let cfg = Config {
            dir: d.path().to_path_buf(),
            listen: "127.0.0.1:0".into(),
            probably_offline_after_ms: 5,
            offline_after_ms: 4,
            ..Default::default()
        };
        assert!(matches!(start(cfg.clone()).await, Err(MgmtError::Config(_))));
        let limits = Config { inodes_emergency_limit: 20_000, probably_offline_after_ms: 1, ..cfg.clone() };
        let e = start(limits).await.err().unwrap();
        assert!(matches!(e, MgmtError::Config(_)) && e.to_string().contains("inodes_low_limit"), "{e}");
        std::fs::write(d.path().join(REGISTRY_FILE), "nodes = 3").unwrap();
        let cfg = Config { probably_offline_after_ms: 1, ..cfg };
        let e = start(cfg).await.err().unwrap();
        let msg = e.to_string();
        assert!(matches!(e, MgmtError::CorruptRegistry { .. }) && msg.contains("registry.toml"), "{msg}");
    }
}
