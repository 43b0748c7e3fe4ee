//! HiveFS management service (`hivefs mgmtd`).
//!
//! Owns the registry of nodes and storage targets (ids assigned here, stable
//! per uuid and persisted in `<dir>/registry.toml`), the owner of the root
//! directory (the first metadata node ever registered), and the liveness of
//! every node and target (heartbeats, reported capacities, reachability).
//!
//! It must not touch file data or the namespace, and must not hold anything
//! in memory that a restart cannot rebuild: the registry is written before a
//! registration is acknowledged; liveness restarts from "not heard from since
//! mgmtd started". It answers only management requests; everything else gets
//! `ErrorCode::NotSupported`.
//!
//! The service is a library: [`start`] runs it inside the caller's tokio
//! runtime, so tests run it in-process and the binary stays thin.

pub mod registry;
pub mod state;

pub use registry::{NodeRecord, Registry, TargetRecord, REGISTRY_FILE};
pub use state::{classify, Mgmt, Timeouts, MGMT_NODE_ID};

use hivefs_net::{serve, Handler, Peer, ServerConfig, ServerHandle};
use hivefs_proto::{Request, Response};
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
    /// Shared secret file; `None` disables authentication.
    pub secret_file: Option<PathBuf>,
    /// A node or target is probably-offline once its last report is this old.
    pub probably_offline_after_ms: u64,
    /// … and offline once it is this old.
    pub offline_after_ms: u64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            dir: PathBuf::from("/var/lib/hivefs/mgmtd"),
            listen: "127.0.0.1:8008".into(),
            secret_file: None,
            probably_offline_after_ms: 10_000,
            offline_after_ms: 30_000,
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
}

impl MgmtService {
    /// Stops accepting connections. (Connections already accepted are
    /// served until their peers close them: a transport limitation.)
    pub fn stop(self) {}
}

impl Drop for MgmtService {
    fn drop(&mut self) {
        self.server.abort();
    }
}

struct MgmtHandler {
    state: Arc<Mutex<Mgmt>>,
}

impl Handler for MgmtHandler {
    async fn handle(&self, req: Request, _payload: Vec<u8>, _peer: &Peer) -> (Response, Vec<u8>) {
        let resp = match req {
            // Registrations write the registry (fsync): off the async workers.
            Request::RegisterNode { .. } | Request::RegisterTarget { .. } => {
                let state = self.state.clone();
                tokio::task::spawn_blocking(move || lock(&state).handle(req, Instant::now()))
                    .await
                    .unwrap_or_else(|e| Err(fs_err!(Internal, "mgmtd registration task failed: {e}")))
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
    if cfg.probably_offline_after_ms == 0 || cfg.probably_offline_after_ms > cfg.offline_after_ms {
        return Err(MgmtError::Config(format!(
            "need 0 < probably_offline_after_ms ({}) <= offline_after_ms ({})",
            cfg.probably_offline_after_ms, cfg.offline_after_ms
        )));
    }
    let secret = match &cfg.secret_file {
        Some(p) => Some(hivefs_net::load_secret(p).map_err(MgmtError::Secret)?),
        None => None,
    };
    let timeouts =
        Timeouts { probably_offline_after_ms: cfg.probably_offline_after_ms, offline_after_ms: cfg.offline_after_ms };
    let dir = cfg.dir.clone();
    let mgmt = tokio::task::spawn_blocking(move || Mgmt::open(&dir, timeouts, Instant::now()))
        .await
        .map_err(|e| MgmtError::Config(format!("registry loader failed: {e}")))??;
    let handler = Arc::new(MgmtHandler { state: Arc::new(Mutex::new(mgmt)) });
    let server = serve(&cfg.listen, ServerConfig::new(NodeType::Mgmt, secret), handler)
        .await
        .map_err(|source| MgmtError::Listen { addr: cfg.listen.clone(), source })?;
    tracing::info!(addr = %server.local_addr, dir = %cfg.dir.display(), "mgmtd started");
    Ok(MgmtService { local_addr: server.local_addr, server })
}

#[cfg(test)]
mod tests {
    use super::*;
    use hivefs_net::{call_once, ClientConfig};
    use hivefs_proto::Reply;
    use hivefs_types::ids::NodeId;

    #[test]
    fn config_defaults_and_unknown_keys() {
        let c: Config = toml::from_str("dir = \"/x\"").unwrap();
        assert_eq!(
            (c.listen.as_str(), c.probably_offline_after_ms, c.offline_after_ms),
            ("127.0.0.1:8008", 10_000, 30_000)
        );
        assert!(toml::from_str::<Config>("dri = \"/x\"").is_err());
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
        std::fs::write(d.path().join(REGISTRY_FILE), "nodes = 3").unwrap();
        let cfg = Config { probably_offline_after_ms: 1, ..cfg };
        let e = start(cfg).await.err().unwrap();
        let msg = e.to_string();
        assert!(matches!(e, MgmtError::CorruptRegistry { .. }) && msg.contains("registry.toml"), "{msg}");
    }
}
