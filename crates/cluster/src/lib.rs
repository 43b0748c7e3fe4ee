//! What every participant of a HiveFS cluster needs to find the others.
//!
//! Owns: a service's persistent identity (`node.toml`: uuid and assigned id),
//! registration with mgmtd, the heartbeat loop, and a cached, periodically
//! refreshed view of nodes and targets used to route requests by node or
//! target id, requests to several storage nodes at once (`chunks`: the
//! lengths of a file's chunk files), and [`Latch`], the set-once flag
//! services and clients wait on. It must not hold policy (choosers,
//! states): mgmtd decides, this crate only reads.

#![forbid(unsafe_code)]

mod chunks;
mod latch;
pub use chunks::{concurrently, unit_err, Pending};
pub use latch::Latch;

use hivefs_net::{Call, Pools};
use hivefs_proto::{
    Capacity, Envelope, GroupInfo, GroupKind, MirrorHdr, MirrorRole, NodeInfo, PoolInfo, Reply, Request,
    TargetCapacity, TargetInfo,
};
use hivefs_types::error::{ErrorCode, FsError};
use hivefs_types::ids::{BuddyGroupId, NodeId, NodeType, PoolId, TargetId};
use hivefs_types::pattern::StripeUnit;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tracing::{debug, info, warn};

/// A service's identity, persisted in `<data dir>/node.toml` so that a
/// restarted service registers under the same uuid and gets its old id back.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct NodeIdentity {
    pub uuid: String,
    #[serde(default)]
    pub node_id: Option<u32>,
}

/// Space and inodes of the file system holding `path` (statvfs(3)): what
/// a service reports of its data directories in heartbeats.
pub fn capacity_of(path: &Path) -> std::io::Result<hivefs_proto::Capacity> {
    let s = rustix::fs::statvfs(path)?;
    Ok(hivefs_proto::Capacity {
        total_bytes: s.f_blocks.saturating_mul(s.f_frsize),
        free_bytes: s.f_bavail.saturating_mul(s.f_frsize),
        total_inodes: s.f_files,
        free_inodes: s.f_favail,
    })
}

pub fn new_uuid() -> String {
    let b: [u8; 16] = rand::random();
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!("{}-{}-{}-{}-{}", &h[0..8], &h[8..12], &h[12..16], &h[16..20], &h[20..32])
}

/// Writes a file atomically: temp file, fsync, rename, fsync of the directory.
pub fn write_atomic(path: &Path, data: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let dir = path.parent().unwrap_or(Path::new("."));
    let tmp = dir.join(format!(".{}.tmp", path.file_name().and_then(|n| n.to_str()).unwrap_or("file")));
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(data)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    std::fs::File::open(dir)?.sync_all()
}

impl NodeIdentity {
    pub fn load_or_create(dir: &Path) -> std::io::Result<NodeIdentity> {
        let p = dir.join("node.toml");
        match std::fs::read_to_string(&p) {
            Ok(s) => toml::from_str(&s)
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, format!("{}: {e}", p.display()))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let id = NodeIdentity { uuid: new_uuid(), node_id: None };
                id.save(dir)?;
                Ok(id)
            }
            Err(e) => Err(std::io::Error::new(e.kind(), format!("{}: {e}", p.display()))),
        }
    }

    pub fn save(&self, dir: &Path) -> std::io::Result<()> {
        let s = toml::to_string(self).expect("identity serialises");
        write_atomic(&dir.join("node.toml"), s.as_bytes())
    }
}

/// Registers this node with mgmtd (retrying until mgmtd answers or
/// `deadline` passes) and persists the assigned id.
pub async fn register_node(
    mgmt: &dyn Call,
    node_type: NodeType,
    dir: &Path,
    identity: &mut NodeIdentity,
    addr: &str,
    deadline: Duration,
) -> Result<NodeId, FsError> {
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into());
    let req = Request::RegisterNode { node_type, uuid: identity.uuid.clone(), addr: addr.to_string(), hostname };
    let start = tokio::time::Instant::now();
    loop {
        match mgmt.rpc(&req).await {
            Ok(Reply::NodeRegistered { node }) => {
                if let Some(old) = identity.node_id {
                    if old != node.0 {
                        return Err(FsError::new(
                            ErrorCode::Invalid,
                            format!("mgmtd {} assigned node id {node}, but this {node_type} node was {old}: wrong mgmtd or a lost registry", mgmt.addr()),
                        ));
                    }
                } else {
                    identity.node_id = Some(node.0);
                    identity.save(dir).map_err(|e| FsError::new(ErrorCode::Io, format!("{}: {e}", dir.display())))?;
                }
                info!(%node, %node_type, "registered with mgmtd {}", mgmt.addr());
                return Ok(node);
            }
            Ok(other) => return Err(FsError::new(ErrorCode::Protocol, format!("unexpected reply {other:?}"))),
            Err(e) if e.code == ErrorCode::Auth => return Err(e),
            Err(e) if start.elapsed() < deadline => {
                debug!("mgmtd not reachable yet: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Sends heartbeats forever; `sample` is called for fresh capacity figures.
pub fn spawn_heartbeat<F>(mgmt: Arc<dyn Call>, node_type: NodeType, node: NodeId, every: Duration, sample: F)
where
    F: Fn() -> (Vec<TargetCapacity>, Option<Capacity>) + Send + 'static,
{
    tokio::spawn(async move {
        loop {
            let (targets, meta) = sample();
            if let Err(e) = mgmt.rpc(&Request::Heartbeat { node_type, node, targets, meta }).await {
                warn!("heartbeat to mgmtd {} failed: {e}", mgmt.addr());
            }
            tokio::time::sleep(every).await;
        }
    });
}

/// A snapshot of the registry as seen from mgmtd.
#[derive(Default, Debug)]
pub struct ClusterView {
    // Ordered maps: whatever walks the view (a resync per group, a
    // chooser over targets) does so in the same order on every run, which
    // the deterministic simulation needs.
    pub nodes: BTreeMap<(NodeType, NodeId), NodeInfo>,
    pub targets: BTreeMap<TargetId, TargetInfo>,
    pub pools: BTreeMap<PoolId, PoolInfo>,
    /// Buddy groups of both kinds.
    pub groups: BTreeMap<BuddyGroupId, GroupInfo>,
    pub root_owner: Option<NodeId>,
    /// When this view was loaded (None for the empty initial view), on the
    /// runtime's clock (a simulation's paused time decides when a
    /// view is stale, not the real one).
    pub loaded_at: Option<tokio::time::Instant>,
}

impl ClusterView {
    /// A stripe's targets counted per storage server, with every storage server of the
    /// view present (0 where it has none): the basis of the `(min,max)` allocation notation.
    pub fn targets_per_server(&self, targets: &[TargetId]) -> std::collections::BTreeMap<u32, usize> {
        let mut per_server: std::collections::BTreeMap<u32, usize> =
            self.nodes.keys().filter(|(t, _)| *t == NodeType::Storage).map(|(_, id)| (id.0, 0)).collect();
        for t in targets {
            if let Some(info) = self.targets.get(t) {
                *per_server.entry(info.node.0).or_default() += 1;
            }
        }
        per_server
    }
}

/// The routing map plus the connection pools to reach everything in it.
pub struct Cluster {
    pools: Pools,
    /// For buddy groups' primaries: no retries inside a call, so a refused
    /// or lost connection comes back at once and [`Cluster::call_unit`]
    /// asks mgmtd for the group's primary before it tries again.
    group_pools: Pools,
    mgmt: Arc<dyn Call>,
    view: RwLock<Arc<ClusterView>>,
}

impl Cluster {
    pub fn new(mgmt_addr: &str, pools: Pools) -> Arc<Cluster> {
        let mgmt = pools.get(mgmt_addr);
        let mut gcfg = pools.config().clone();
        gcfg.retries = 0;
        gcfg.connect_timeout = gcfg.connect_timeout.min(Duration::from_secs(2));
        let group_pools = pools.with_config(gcfg);
        Arc::new(Cluster { pools, group_pools, mgmt, view: RwLock::new(Arc::default()) })
    }

    pub fn mgmt(&self) -> Arc<dyn Call> {
        self.mgmt.clone()
    }

    pub fn pools(&self) -> &Pools {
        &self.pools
    }

    pub fn view(&self) -> Arc<ClusterView> {
        self.view.read().expect("view lock").clone()
    }

    /// Reloads nodes, targets, storage pools and the root owner from mgmtd.
    pub async fn refresh(&self) -> Result<Arc<ClusterView>, FsError> {
        let nodes = match self.mgmt.rpc(&Request::ListNodes { node_type: None }).await? {
            Reply::Nodes(n) => n,
            r => return Err(FsError::new(ErrorCode::Protocol, format!("unexpected reply {r:?}"))),
        };
        let targets = match self.mgmt.rpc(&Request::ListTargets).await? {
            Reply::Targets(t) => t,
            r => return Err(FsError::new(ErrorCode::Protocol, format!("unexpected reply {r:?}"))),
        };
        let root_owner = match self.mgmt.rpc(&Request::GetRootOwner).await? {
            Reply::RootOwner(o) => o,
            r => return Err(FsError::new(ErrorCode::Protocol, format!("unexpected reply {r:?}"))),
        };
        let pools = match self.mgmt.rpc(&Request::ListPools).await? {
            Reply::Pools(p) => p,
            r => return Err(FsError::new(ErrorCode::Protocol, format!("unexpected reply {r:?}"))),
        };
        let groups = match self.mgmt.rpc(&Request::ListGroups { kind: None }).await? {
            Reply::Groups(g) => g,
            r => return Err(FsError::new(ErrorCode::Protocol, format!("unexpected reply {r:?}"))),
        };
        let v = Arc::new(ClusterView {
            nodes: nodes.into_iter().map(|n| ((n.node_type, n.id), n)).collect(),
            targets: targets.into_iter().map(|t| (t.id, t)).collect(),
            pools: pools.into_iter().map(|p| (p.id, p)).collect(),
            groups: groups.into_iter().map(|g| (g.id, g)).collect(),
            root_owner,
            loaded_at: Some(tokio::time::Instant::now()),
        });
        let old = std::mem::replace(&mut *self.view.write().expect("view lock"), v.clone());
        // A node that re-registered from another address (restarted on a
        // port another program had taken, a new host address): calls still
        // repeating towards its old address stop there and find it anew.
        for (key, n) in &old.nodes {
            if v.nodes.get(key).is_some_and(|now| now.addr != n.addr) {
                info!("{} node {} moved from {} to {}", n.node_type, n.id, n.addr, v.nodes[key].addr);
                self.pools.moved(&n.addr);
                self.group_pools.moved(&n.addr);
            }
        }
        Ok(v)
    }

    /// Refreshes the view every `every` in the background.
    pub fn spawn_refresh(self: &Arc<Self>, every: Duration) {
        let me = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(c) = me.upgrade() else { return };
                if let Err(e) = c.refresh().await {
                    debug!("cluster view refresh failed: {e}");
                }
            }
        });
    }

    /// Address of a node, refreshing the view once if it is unknown.
    pub async fn node_addr(&self, node_type: NodeType, node: NodeId) -> Result<String, FsError> {
        if let Some(n) = self.view().nodes.get(&(node_type, node)) {
            return Ok(n.addr.clone());
        }
        let v = self.refresh().await?;
        v.nodes.get(&(node_type, node)).map(|n| n.addr.clone()).ok_or_else(|| {
            FsError::new(ErrorCode::NotFound, format!("{node_type} node {node} is not registered with mgmtd"))
        })
    }

    pub async fn node_pool(&self, node_type: NodeType, node: NodeId) -> Result<Arc<dyn Call>, FsError> {
        Ok(self.pools.get(&self.node_addr(node_type, node).await?))
    }

    /// The way to the storage node of `target` for a buddy group's forwards
    /// and copies: no retries inside a call (a failure goes back to the caller at once).
    pub async fn group_target_pool(&self, target: TargetId) -> Result<Arc<dyn Call>, FsError> {
        let node = match self.view().targets.get(&target) {
            Some(t) => t.node,
            None => self.refresh().await?.targets.get(&target).map(|t| t.node).ok_or_else(|| {
                FsError::new(ErrorCode::NotFound, format!("storage target {target} is not registered with mgmtd"))
            })?,
        };
        Ok(self.group_pools.get(&self.node_addr(NodeType::Storage, node).await?))
    }

    /// The pool of the storage node that holds `target`.
    pub async fn target_pool(&self, target: TargetId) -> Result<Arc<dyn Call>, FsError> {
        let node = match self.view().targets.get(&target) {
            Some(t) => t.node,
            None => {
                let v = self.refresh().await?;
                v.targets.get(&target).map(|t| t.node).ok_or_else(|| {
                    FsError::new(ErrorCode::NotFound, format!("storage target {target} is not registered with mgmtd"))
                })?
            }
        };
        self.node_pool(NodeType::Storage, node).await
    }

    /// Where a stripe unit's requests go: a target itself, or the current
    /// primary of a storage buddy group with the mirroring header
    /// (`docs/design-mirror.md`). Refreshes the view once for an unknown group.
    pub async fn route(&self, unit: StripeUnit) -> Result<Route, FsError> {
        let g = match unit {
            StripeUnit::Target(target) => {
                return Ok(Route { target, call: self.target_pool(target).await?, env: Envelope::default() })
            }
            StripeUnit::Group(g) => g,
        };
        let info = match self.view().groups.get(&g) {
            Some(i) => i.clone(),
            None => self.refresh().await?.groups.get(&g).cloned().ok_or_else(|| {
                FsError::new(ErrorCode::NotFound, format!("buddy group {g} is not registered with mgmtd"))
            })?,
        };
        if info.kind != GroupKind::Storage {
            return Err(FsError::new(ErrorCode::Invalid, format!("buddy group {g} is a metadata group")));
        }
        let target = TargetId(info.primary);
        let env = Envelope {
            mirror: Some(MirrorHdr { group: g, epoch: info.epoch, role: MirrorRole::Client, session: 0 }),
            ..Default::default()
        };
        Ok(Route { target, call: self.group_target_pool(target).await?, env })
    }

    /// Sends `req` to a stripe unit (naming the group's current primary as
    /// its target, [`Request::chunk_target_mut`]) and waits for the answer. For a
    /// buddy group, a failure that a failover cures (`Unavailable`,
    /// `TimedOut`: a lost connection or a refused one) is retried against the group's
    /// current primary, with the view refreshed before each retry, until
    /// `budget` has passed: an application sees a pause, not an error.
    pub async fn call_unit(
        &self,
        unit: StripeUnit,
        mut req: Request,
        payload: bytes::Bytes,
        budget: Duration,
    ) -> Result<(Reply, Vec<u8>), FsError> {
        let start = tokio::time::Instant::now();
        let mut wait = Duration::from_millis(100);
        let mut moves = 0;
        loop {
            let r = match self.route(unit).await {
                Ok(route) => {
                    if let Some(t) = req.chunk_target_mut() {
                        *t = route.target;
                    }
                    route.call.call_with(&route.env, &req, payload.clone()).await
                }
                Err(e) => Err(e),
            };
            let e = match r {
                // The node re-registered from another address while the call
                // repeated: the view has that address now.
                Err(e) if hivefs_net::node_moved(&e) && moves < MAX_MOVES => {
                    moves += 1;
                    debug!("{unit}: {e}");
                    continue;
                }
                Err(e) if matches!(unit, StripeUnit::Group(_)) && retry_on_failover(&e) => e,
                r => return r,
            };
            if start.elapsed() + wait > budget {
                warn!("{unit}: no primary answered within {budget:?}: {e}");
                return Err(FsError::new(e.code, format!("{unit}: {}", e.message)));
            }
            debug!("{unit}: {e}; asking mgmtd for the group's primary again in {wait:?}");
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(Duration::from_secs(1));
            if let Err(re) = self.refresh().await {
                debug!("cluster view refresh failed: {re}");
            }
        }
    }
}

impl Cluster {
    /// The metadata buddy group mirroring the namespace of metadata node
    /// `owner`, in the current view.
    pub fn meta_group(&self, owner: NodeId) -> Option<GroupInfo> {
        self.view().groups.values().find(|g| g.kind == GroupKind::Meta && g.serves == Some(owner)).cloned()
    }

    /// Where requests for the namespace of metadata node `owner` go: that
    /// node, or the current primary of the group mirroring it, with the
    /// mirroring header (`docs/design-mirror.md`, "Metadata groups").
    pub async fn meta_route(&self, owner: NodeId) -> Result<(Arc<dyn Call>, Option<MirrorHdr>), FsError> {
        match self.meta_group(owner) {
            None => Ok((self.node_pool(NodeType::Meta, owner).await?, None)),
            Some(g) => {
                let addr = self.node_addr(NodeType::Meta, NodeId(g.primary)).await?;
                let hdr = MirrorHdr { group: g.id, epoch: g.epoch, role: MirrorRole::Client, session: 0 };
                Ok((self.group_pools.get(&addr), Some(hdr)))
            }
        }
    }

    /// The way to metadata node `node` for a group's forwards and resyncs:
    /// no retries inside a call (a failure goes back to the caller at once).
    pub async fn meta_peer_pool(&self, node: NodeId) -> Result<Arc<dyn Call>, FsError> {
        Ok(self.group_pools.get(&self.node_addr(NodeType::Meta, node).await?))
    }

    /// One attempt of a request for the namespace of metadata node `owner`
    /// (background traffic that repeats anyway: lease polls, keep-alives).
    pub async fn meta_rpc(&self, owner: NodeId, req: &Request) -> Result<Reply, FsError> {
        self.call_meta(owner, &Envelope::default(), req, Duration::ZERO).await
    }

    /// Sends a request for the namespace of metadata node `owner`.
    ///
    /// For a mirrored namespace, a failure a failover cures is retried
    /// against the group's current primary (view refreshed before each
    /// retry) until `budget` has passed, if the request may be repeated or
    /// surely was not applied; the envelope's operation id makes a change
    /// happen once however often it is sent (the record of its answer is
    /// mirrored with it).
    ///
    /// An unmirrored namespace gets one attempt without retries first: if
    /// the node cannot be reached, the view is refreshed, and a namespace
    /// mirrored since is asked at its group's primary; otherwise the
    /// ordinary way (retries up to the deadline) rides out a restart.
    pub async fn call_meta(
        &self,
        owner: NodeId,
        env: &Envelope,
        req: &Request,
        budget: Duration,
    ) -> Result<Reply, FsError> {
        let start = tokio::time::Instant::now();
        let mut wait = Duration::from_millis(100);
        let mut refreshed = false;
        let again = |e: &FsError| retry_on_failover(e) && (env.may_repeat(req) || surely_not_applied(e));
        loop {
            let Some(g) = self.meta_group(owner) else {
                let addr = self.node_addr(NodeType::Meta, owner).await?;
                match self.group_pools.get(&addr).rpc_with(env, req).await {
                    Err(e) if again(&e) && !refreshed => {
                        refreshed = true;
                        if self.refresh().await.is_ok() && self.meta_group(owner).is_some() {
                            debug!("namespace of metadata node {owner} is mirrored now: asking its group ({e})");
                            continue;
                        }
                        // At the address mgmtd has now (the node may have
                        // moved), and again wherever it moves meanwhile.
                        let mut moves = 0;
                        loop {
                            let addr = self.node_addr(NodeType::Meta, owner).await?;
                            match self.pools.get(&addr).rpc_with(env, req).await {
                                Err(e) if hivefs_net::node_moved(&e) && moves < MAX_MOVES => {
                                    moves += 1;
                                    debug!("metadata node {owner}: {e}");
                                }
                                r => return r,
                            }
                        }
                    }
                    r => return r,
                }
            };
            let addr = self.node_addr(NodeType::Meta, NodeId(g.primary)).await?;
            let mut env = *env;
            env.mirror = Some(MirrorHdr { group: g.id, epoch: g.epoch, role: MirrorRole::Client, session: 0 });
            let e = match self.group_pools.get(&addr).rpc_with(&env, req).await {
                Err(e) if again(&e) => e,
                r => return r,
            };
            if start.elapsed() + wait > budget {
                if !budget.is_zero() {
                    warn!("namespace of metadata node {owner}: no primary answered within {budget:?}: {e}");
                }
                return Err(e);
            }
            debug!("namespace of metadata node {owner}: {e}; asking mgmtd for its primary again in {wait:?}");
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(Duration::from_secs(1));
            if let Err(re) = self.refresh().await {
                debug!("cluster view refresh failed: {re}");
            }
        }
    }
}

/// Times one call follows its node to a new address before the error
/// stands (a node moving again and again is not waited for).
const MAX_MOVES: u32 = 3;

/// Whether a failed request surely did not reach (or was refused by) its
/// node, so that even a request that must not be repeated may be sent
/// again: no connection, or an answer of a node that does not serve what
/// it names. A connection lost in flight may have delivered it.
pub fn surely_not_applied(e: &FsError) -> bool {
    match e.code {
        ErrorCode::Unavailable => !e.message.contains("connection lost"),
        ErrorCode::TimedOut => e.message.contains("connect timed out") || e.message.contains("handshake timed out"),
        _ => false,
    }
}

/// Errors of a mirrored request that a switch-over or a returning primary cures.
pub fn retry_on_failover(e: &FsError) -> bool {
    matches!(e.code, ErrorCode::Unavailable | ErrorCode::TimedOut)
}

/// Where one stripe unit's requests go ([`Cluster::route`]).
pub struct Route {
    /// The target to name in the request.
    pub target: TargetId,
    pub call: Arc<dyn Call>,
    /// Carries the mirroring header for a buddy group.
    pub env: Envelope,
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use hivefs_net::{CallFuture, ClientConfig};
    use hivefs_proto::{Envelope, Reachability};

    /// A service answered in this process: a mgmtd that knows one metadata
    /// node, and that node, which answers pings.
    struct InProcess(String);

    impl Call for InProcess {
        fn addr(&self) -> &str {
            &self.0
        }

        fn call_with<'a>(&'a self, _env: &'a Envelope, req: &'a Request, _payload: Bytes) -> CallFuture<'a> {
            Box::pin(async move {
                let meta = NodeInfo {
                    id: NodeId(2),
                    node_type: NodeType::Meta,
                    addr: "meta-2".into(),
                    hostname: "h".into(),
                    last_seen_ms: 0,
                    reachability: Reachability::Online,
                    capacity: None,
                };
                let r = match (self.0.as_str(), req) {
                    ("mgmtd", Request::ListNodes { .. }) => Reply::Nodes(vec![meta]),
                    ("mgmtd", Request::ListTargets) => Reply::Targets(vec![]),
                    ("mgmtd", Request::GetRootOwner) => Reply::RootOwner(Some(NodeId(2))),
                    ("mgmtd", Request::ListPools) => Reply::Pools(vec![]),
                    ("mgmtd", Request::ListGroups { .. }) => Reply::Groups(vec![]),
                    ("meta-2", Request::Ping) => Reply::Pong { node_type: NodeType::Meta, node: NodeId(2) },
                    (who, r) => return Err(FsError::new(ErrorCode::NotSupported, format!("{who}: {r:?}"))),
                };
                Ok((r, Vec::new()))
            })
        }
    }

    /// The cluster view and the ways to nodes work over any `Call`, not
    /// only TCP pools: the seam a simulated network plugs into.
    #[tokio::test]
    async fn a_cluster_reaches_its_nodes_through_the_pools_connector() {
        let pools = Pools::with_connector(
            ClientConfig::new(None),
            Arc::new(|addr: &str| Arc::new(InProcess(addr.to_string())) as Arc<dyn Call>),
        );
        let c = Cluster::new("mgmtd", pools);
        let v = c.refresh().await.unwrap();
        assert_eq!(v.root_owner, Some(NodeId(2)));
        let meta = c.node_pool(NodeType::Meta, NodeId(2)).await.unwrap();
        assert_eq!(meta.addr(), "meta-2");
        let pong = meta.rpc(&Request::Ping).await.unwrap();
        assert_eq!(pong, Reply::Pong { node_type: NodeType::Meta, node: NodeId(2) });
        assert!(Arc::ptr_eq(&meta, &c.node_pool(NodeType::Meta, NodeId(2)).await.unwrap()), "one way per address");
        let e = c.node_pool(NodeType::Meta, NodeId(3)).await.err().unwrap();
        assert_eq!(e.code, ErrorCode::NotFound);
    }
}
