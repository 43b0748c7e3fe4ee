//! The management state machine: the persistent [`Registry`] plus in-memory
//! liveness (last heartbeat per node and per target, reported capacities),
//! and the answer to every management request.
//!
//! Time is a parameter (`now`), so tests drive ages without sleeping. Every
//! change of the registry is persisted before it is applied in memory and
//! acknowledged: the mutation runs on a copy, the copy is written, then it
//! replaces the current registry. A failed write changes nothing.

use crate::registry::{Registry, REGISTRY_FILE};
use crate::MgmtError;
use hivefs_proto::{Capacity, NodeInfo, Reachability, Reply, Request, TargetInfo};
use hivefs_types::error::FsError;
use hivefs_types::fs_err;
use hivefs_types::ids::{NodeId, NodeType, TargetId};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;
use tracing::{info, warn};

/// The node id mgmtd answers `Ping` with: there is one management node.
pub const MGMT_NODE_ID: NodeId = NodeId(1);

/// Reachability thresholds, in milliseconds since the last report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts {
    pub probably_offline_after_ms: u64,
    pub offline_after_ms: u64,
}

/// Online below `probably_offline_after_ms`, probably-offline below
/// `offline_after_ms`, offline from then on.
pub fn classify(age_ms: u64, t: Timeouts) -> Reachability {
    if age_ms < t.probably_offline_after_ms {
        Reachability::Online
    } else if age_ms < t.offline_after_ms {
        Reachability::ProbablyOffline
    } else {
        Reachability::Offline
    }
}

fn age_ms(now: Instant, since: Instant) -> u64 {
    u64::try_from(now.saturating_duration_since(since).as_millis()).unwrap_or(u64::MAX)
}

#[derive(Clone, Copy, Debug)]
struct NodeLive {
    last_seen: Instant,
    meta: Option<Capacity>,
}

#[derive(Clone, Copy, Debug)]
struct TargetLive {
    last_seen: Instant,
    capacity: Capacity,
}

pub struct Mgmt {
    path: PathBuf,
    reg: Registry,
    timeouts: Timeouts,
    /// When this mgmtd started: the age of a node not heard from since.
    started: Instant,
    nodes: HashMap<(NodeType, NodeId), NodeLive>,
    targets: HashMap<TargetId, TargetLive>,
}

impl Mgmt {
    /// Loads `<dir>/registry.toml` (an absent file is an empty registry).
    pub fn open(dir: &Path, timeouts: Timeouts, now: Instant) -> Result<Mgmt, MgmtError> {
        std::fs::create_dir_all(dir).map_err(|source| MgmtError::Io { path: dir.to_path_buf(), source })?;
        let path = dir.join(REGISTRY_FILE);
        let reg = Registry::load(&path)?.unwrap_or_default();
        info!(
            registry = %path.display(),
            nodes = reg.nodes.len(),
            targets = reg.targets.len(),
            "registry loaded"
        );
        Ok(Mgmt { path, reg, timeouts, started: now, nodes: HashMap::new(), targets: HashMap::new() })
    }

    pub fn registry(&self) -> &Registry {
        &self.reg
    }

    /// Applies `f` to a copy of the registry, persists the copy if `f` says
    /// it changed, then makes it current.
    fn mutate<T>(&mut self, f: impl FnOnce(&mut Registry) -> Result<(T, bool), FsError>) -> Result<T, FsError> {
        let mut next = self.reg.clone();
        let (out, changed) = f(&mut next)?;
        if changed {
            next.save(&self.path)?;
            self.reg = next;
        } else {
            debug_assert_eq!(next, self.reg);
        }
        Ok(out)
    }

    /// Answers one request. Only registrations touch the disk.
    pub fn handle(&mut self, req: Request, now: Instant) -> Result<Reply, FsError> {
        match req {
            Request::Ping => Ok(Reply::Pong { node_type: NodeType::Mgmt, node: MGMT_NODE_ID }),
            Request::RegisterNode { node_type, uuid, addr, hostname } => {
                let node = self.mutate(|r| r.register_node(node_type, &uuid, &addr, &hostname))?;
                info!(%node_type, %node, %addr, %uuid, "node registered");
                let live = self.nodes.entry((node_type, node)).or_insert(NodeLive { last_seen: now, meta: None });
                live.last_seen = now;
                Ok(Reply::NodeRegistered { node })
            }
            Request::RegisterTarget { node, uuid } => {
                let (target, pool) = self.mutate(|r| {
                    let (t, p, changed) = r.register_target(node, &uuid)?;
                    Ok(((t, p), changed))
                })?;
                info!(%target, storage_node = %node, %uuid, "target registered");
                let live =
                    self.targets.entry(target).or_insert(TargetLive { last_seen: now, capacity: Capacity::default() });
                live.last_seen = now;
                Ok(Reply::TargetRegistered { target, pool })
            }
            Request::Heartbeat { node_type, node, targets, meta } => {
                if self.reg.node(node_type, node).is_none() {
                    return Err(fs_err!(
                        NotFound,
                        "{node_type} node {node} is not registered with this mgmtd; register again"
                    ));
                }
                self.nodes.insert((node_type, node), NodeLive { last_seen: now, meta });
                for tc in targets {
                    match self.reg.target(tc.target) {
                        Some(t) if node_type == NodeType::Storage && t.node == node => {
                            self.targets.insert(tc.target, TargetLive { last_seen: now, capacity: tc.capacity });
                        }
                        Some(t) => warn!(
                            "{node_type} node {node} reported target {}, which belongs to storage node {}; ignored",
                            tc.target, t.node
                        ),
                        None => warn!("{node_type} node {node} reported unknown target {}; ignored", tc.target),
                    }
                }
                Ok(Reply::Ok)
            }
            Request::ListNodes { node_type } => Ok(Reply::Nodes(self.list_nodes(node_type, now))),
            Request::ListTargets => Ok(Reply::Targets(self.list_targets(now))),
            Request::GetRootOwner => Ok(Reply::RootOwner(self.reg.root_owner)),
            other => Err(fs_err!(NotSupported, "mgmtd does not serve {}", request_name(&other))),
        }
    }

    pub fn list_nodes(&self, filter: Option<NodeType>, now: Instant) -> Vec<NodeInfo> {
        let mut out: Vec<NodeInfo> = self
            .reg
            .nodes
            .iter()
            .filter(|n| filter.is_none_or(|t| t == n.node_type))
            .map(|n| {
                let live = self.nodes.get(&(n.node_type, n.id));
                let age = age_ms(now, live.map_or(self.started, |l| l.last_seen));
                NodeInfo {
                    id: n.id,
                    node_type: n.node_type,
                    addr: n.addr.clone(),
                    hostname: n.hostname.clone(),
                    last_seen_ms: age,
                    reachability: classify(age, self.timeouts),
                    capacity: live.and_then(|l| l.meta),
                }
            })
            .collect();
        out.sort_by_key(|n| (n.node_type as u8, n.id));
        out
    }

    /// A target's age is that of its own last report (registration or a
    /// heartbeat of its node that included it): a node that stops reporting
    /// one of its targets lets that target go offline alone.
    pub fn list_targets(&self, now: Instant) -> Vec<TargetInfo> {
        let mut out: Vec<TargetInfo> = self
            .reg
            .targets
            .iter()
            .map(|t| {
                let live = self.targets.get(&t.id);
                let age = age_ms(now, live.map_or(self.started, |l| l.last_seen));
                TargetInfo {
                    id: t.id,
                    node: t.node,
                    pool: t.pool,
                    capacity: live.map(|l| l.capacity).unwrap_or_default(),
                    last_seen_ms: age,
                    reachability: classify(age, self.timeouts),
                }
            })
            .collect();
        out.sort_by_key(|t| t.id);
        out
    }
}

/// The variant name of a request, for error messages (no field contents).
fn request_name(r: &Request) -> String {
    let s = format!("{r:?}");
    let end = s.find([' ', '{', '(']).unwrap_or(s.len());
    s[..end].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use hivefs_proto::TargetCapacity;
    use hivefs_types::error::ErrorCode;
    use hivefs_types::ids::{EntryId, PoolId};
    use std::time::Duration;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    const T: Timeouts = Timeouts { probably_offline_after_ms: 10_000, offline_after_ms: 30_000 };

    #[test]
    fn classification_by_age() {
        assert_eq!(classify(0, T), Reachability::Online);
        assert_eq!(classify(9_999, T), Reachability::Online);
        assert_eq!(classify(10_000, T), Reachability::ProbablyOffline);
        assert_eq!(classify(29_999, T), Reachability::ProbablyOffline);
        assert_eq!(classify(30_000, T), Reachability::Offline);
        assert_eq!(classify(u64::MAX, T), Reachability::Offline);
    }

    fn reg_node(m: &mut Mgmt, t: NodeType, uuid: &str, now: Instant) -> NodeId {
        match m
            .handle(
                Request::RegisterNode {
                    node_type: t,
                    uuid: uuid.into(),
                    addr: "127.0.0.1:1".into(),
                    hostname: "h".into(),
                },
                now,
            )
            .unwrap()
        {
            Reply::NodeRegistered { node } => node,
            r => panic!("{r:?}"),
        }
    }

    #[test]
    fn ages_and_reachability_follow_heartbeats() {
        let d = tempfile::tempdir().unwrap();
        let t0 = Instant::now();
        let mut m = Mgmt::open(d.path(), T, t0).unwrap();
        let s = reg_node(&mut m, NodeType::Storage, "s", t0 + ms(1_000));
        let meta = reg_node(&mut m, NodeType::Meta, "m", t0 + ms(1_000));
        let Reply::TargetRegistered { target, pool } =
            m.handle(Request::RegisterTarget { node: s, uuid: "t".into() }, t0 + ms(1_000)).unwrap()
        else {
            panic!()
        };
        assert_eq!((target, pool), (TargetId(1), PoolId::DEFAULT));
        let cap = Capacity { total_bytes: 100, free_bytes: 50, total_inodes: 10, free_inodes: 5 };
        let hb = Request::Heartbeat {
            node_type: NodeType::Storage,
            node: s,
            targets: vec![TargetCapacity { target, capacity: cap }],
            meta: None,
        };
        m.handle(hb, t0 + ms(20_000)).unwrap();

        let now = t0 + ms(25_000);
        let nodes = m.list_nodes(None, now);
        assert_eq!(nodes.len(), 2);
        let sn = nodes.iter().find(|n| n.node_type == NodeType::Storage).unwrap();
        assert_eq!((sn.last_seen_ms, sn.reachability), (5_000, Reachability::Online));
        let mn = nodes.iter().find(|n| n.node_type == NodeType::Meta).unwrap();
        assert_eq!((mn.id, mn.last_seen_ms, mn.reachability), (meta, 24_000, Reachability::ProbablyOffline));
        assert_eq!(m.list_nodes(Some(NodeType::Meta), now).len(), 1);
        assert_eq!(m.list_nodes(Some(NodeType::Client), now).len(), 0);

        let ts = m.list_targets(now);
        assert_eq!(ts.len(), 1);
        assert_eq!((ts[0].capacity, ts[0].last_seen_ms, ts[0].node), (cap, 5_000, s));
        let ts = m.list_targets(t0 + ms(50_000));
        assert_eq!(ts[0].reachability, Reachability::Offline);
    }

    #[test]
    fn nodes_not_heard_from_count_from_mgmtd_start() {
        let d = tempfile::tempdir().unwrap();
        let t0 = Instant::now();
        let mut m = Mgmt::open(d.path(), T, t0).unwrap();
        let s = reg_node(&mut m, NodeType::Storage, "s", t0);
        m.handle(Request::RegisterTarget { node: s, uuid: "t".into() }, t0).unwrap();
        drop(m);
        // Restarted mgmtd: registry reloaded, nobody heard from yet.
        let t1 = t0 + ms(100_000);
        let m = Mgmt::open(d.path(), T, t1).unwrap();
        let n = &m.list_nodes(None, t1 + ms(12_000))[0];
        assert_eq!((n.last_seen_ms, n.reachability), (12_000, Reachability::ProbablyOffline));
        let t = &m.list_targets(t1 + ms(3_000))[0];
        assert_eq!((t.last_seen_ms, t.reachability), (3_000, Reachability::Online));
    }

    #[test]
    fn heartbeat_of_unknown_node_asks_to_register_again() {
        let d = tempfile::tempdir().unwrap();
        let t0 = Instant::now();
        let mut m = Mgmt::open(d.path(), T, t0).unwrap();
        let hb = |node| Request::Heartbeat { node_type: NodeType::Meta, node, targets: vec![], meta: None };
        assert_eq!(m.handle(hb(NodeId(1)), t0).unwrap_err().code, ErrorCode::NotFound);
        let id = reg_node(&mut m, NodeType::Meta, "m", t0);
        let cap = Capacity { total_bytes: 1, ..Default::default() };
        m.handle(Request::Heartbeat { node_type: NodeType::Meta, node: id, targets: vec![], meta: Some(cap) }, t0)
            .unwrap();
        assert_eq!(m.list_nodes(None, t0)[0].capacity, Some(cap));
        // A storage node with the same number is another node.
        let e = m
            .handle(Request::Heartbeat { node_type: NodeType::Storage, node: id, targets: vec![], meta: None }, t0)
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::NotFound);
        assert!(e.message.contains("storage node 1"), "{e}");
    }

    #[test]
    fn registry_survives_restart_and_root_owner_is_fixed() {
        let d = tempfile::tempdir().unwrap();
        let t0 = Instant::now();
        let mut m = Mgmt::open(d.path(), T, t0).unwrap();
        assert_eq!(m.handle(Request::GetRootOwner, t0).unwrap(), Reply::RootOwner(None));
        let s1 = reg_node(&mut m, NodeType::Storage, "s1", t0);
        let m1 = reg_node(&mut m, NodeType::Meta, "m1", t0);
        let m2 = reg_node(&mut m, NodeType::Meta, "m2", t0);
        assert_eq!((s1, m1, m2), (NodeId(1), NodeId(1), NodeId(2)));
        let reg = m.registry().clone();
        drop(m);

        let mut m = Mgmt::open(d.path(), T, t0).unwrap();
        assert_eq!(m.registry(), &reg);
        assert_eq!(reg_node(&mut m, NodeType::Meta, "m2", t0), m2);
        assert_eq!(reg_node(&mut m, NodeType::Meta, "m3", t0), NodeId(3));
        assert_eq!(reg_node(&mut m, NodeType::Storage, "s2", t0), NodeId(2));
        assert_eq!(m.handle(Request::GetRootOwner, t0).unwrap(), Reply::RootOwner(Some(m1)));
    }

    #[test]
    fn failed_persist_changes_nothing() {
        let d = tempfile::tempdir().unwrap();
        let t0 = Instant::now();
        let mut m = Mgmt::open(d.path(), T, t0).unwrap();
        reg_node(&mut m, NodeType::Storage, "s1", t0);
        // Make the temp file path a directory: write_atomic cannot create it.
        std::fs::create_dir(d.path().join(".registry.toml.tmp")).unwrap();
        let e = m
            .handle(
                Request::RegisterNode {
                    node_type: NodeType::Storage,
                    uuid: "s2".into(),
                    addr: "a:1".into(),
                    hostname: "h".into(),
                },
                t0,
            )
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::Io);
        assert!(e.message.contains("registry.toml"), "{e}");
        assert_eq!(m.registry().nodes.len(), 1);
        assert_eq!(m.registry().next_ids.storage, 2);
    }

    #[test]
    fn corrupt_registry_is_a_startup_error_naming_the_file() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join(REGISTRY_FILE), "format_version = \"x\"").unwrap();
        let e = Mgmt::open(d.path(), T, Instant::now()).err().expect("corrupt registry refused");
        assert!(e.to_string().contains(&d.path().join(REGISTRY_FILE).display().to_string()), "{e}");
    }

    #[test]
    fn other_requests_are_not_supported() {
        let d = tempfile::tempdir().unwrap();
        let mut m = Mgmt::open(d.path(), T, Instant::now()).unwrap();
        let e = m.handle(Request::GetAttr { id: EntryId::ROOT }, Instant::now()).unwrap_err();
        assert_eq!(e.code, ErrorCode::NotSupported);
        assert_eq!(e.message, "mgmtd does not serve GetAttr");
    }
}
