//! The management state machine: the persistent [`Registry`] plus in-memory
//! liveness (last heartbeat per node and per target, reported capacities),
//! and the answer to every management request.
//!
//! Capacity pools are derived, never stored: a target's class follows from
//! its last reported capacity and the configured [`CapacityLimits`] each time
//! targets are listed (see [`capacity_pool`]).
//!
//! Time is a parameter (`now`), so tests drive ages without sleeping. Every
//! change of the registry is persisted before it is applied in memory and
//! acknowledged: the mutation runs on a copy, the copy is written, then it
//! replaces the current registry. A failed write changes nothing.

use crate::registry::GroupRecord;
use crate::registry::{Registry, REGISTRY_FILE};
use crate::MgmtError;
use hivefs_proto::{
    Capacity, CapacityPool, Consistency, GroupInfo, GroupKind, NodeInfo, PoolInfo, Reachability, Reply, Request,
    TargetInfo,
};
use hivefs_types::error::FsError;
use hivefs_types::fs_err;
use hivefs_types::ids::{BuddyGroupId, NodeId, NodeType, PoolId, TargetId};
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
    /// A buddy group's primary silent this long is replaced by its
    /// secondary; primaries hold leases of half of it.
    pub failover_after_ms: u64,
}

impl Timeouts {
    /// The lease a heartbeat grants (`docs/design-mirror.md`, "the lease").
    pub fn lease_ms(&self) -> u64 {
        self.failover_after_ms / 2
    }
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

/// Free-space and free-inode limits of the capacity pools.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CapacityLimits {
    pub space_low_limit_bytes: u64,
    pub space_emergency_limit_bytes: u64,
    pub inodes_low_limit: u64,
    pub inodes_emergency_limit: u64,
}

impl CapacityLimits {
    /// 1 GiB / 256 MiB of free space, 10 000 / 1 000 free inodes.
    pub const DEFAULT: CapacityLimits = CapacityLimits {
        space_low_limit_bytes: 1 << 30,
        space_emergency_limit_bytes: 256 << 20,
        inodes_low_limit: 10_000,
        inodes_emergency_limit: 1_000,
    };

    /// The emergency limits must not be above the low limits: otherwise a
    /// target could be normal and yet below the emergency limit.
    pub fn validate(&self) -> Result<(), String> {
        if self.space_emergency_limit_bytes > self.space_low_limit_bytes {
            return Err(format!(
                "need space_emergency_limit_bytes ({}) <= space_low_limit_bytes ({})",
                self.space_emergency_limit_bytes, self.space_low_limit_bytes
            ));
        }
        if self.inodes_emergency_limit > self.inodes_low_limit {
            return Err(format!(
                "need inodes_emergency_limit ({}) <= inodes_low_limit ({})",
                self.inodes_emergency_limit, self.inodes_low_limit
            ));
        }
        Ok(())
    }
}

impl Default for CapacityLimits {
    fn default() -> Self {
        CapacityLimits::DEFAULT
    }
}

/// The capacity pool of a target with capacity `c`:
/// - `Normal` when free bytes >= the space low limit and free inodes >= the
///   inodes low limit;
/// - else `Low` when free bytes >= the space emergency limit and free
///   inodes >= the inodes emergency limit;
/// - else `Emergency`.
///
/// A target that has not reported its capacity yet (`total_bytes == 0`) is
/// `Emergency`: nothing is known about its space, so it gets no new files.
/// A file system that reports no inode count at all (`total_inodes == 0`
/// while `total_bytes > 0`; btrfs does so: it allocates inodes dynamically)
/// has no inode limit, and is classified by its free space alone.
pub fn capacity_pool(c: &Capacity, l: &CapacityLimits) -> CapacityPool {
    if c.total_bytes == 0 {
        return CapacityPool::Emergency;
    }
    let free_inodes = if c.total_inodes == 0 { u64::MAX } else { c.free_inodes };
    if c.free_bytes >= l.space_low_limit_bytes && free_inodes >= l.inodes_low_limit {
        CapacityPool::Normal
    } else if c.free_bytes >= l.space_emergency_limit_bytes && free_inodes >= l.inodes_emergency_limit {
        CapacityPool::Low
    } else {
        CapacityPool::Emergency
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
    limits: CapacityLimits,
    /// When this mgmtd started: the age of a node not heard from since.
    started: Instant,
    nodes: HashMap<(NodeType, NodeId), NodeLive>,
    targets: HashMap<TargetId, TargetLive>,
    /// Last resync progress each group's primary reported.
    resync: HashMap<BuddyGroupId, (u64, u64)>,
    /// Each namespace's last quota usage report.
    quota: crate::quota::Reports,
}

impl Mgmt {
    /// Loads `<dir>/registry.toml` (an absent file is an empty registry).
    pub fn open(dir: &Path, timeouts: Timeouts, limits: CapacityLimits, now: Instant) -> Result<Mgmt, MgmtError> {
        limits.validate().map_err(MgmtError::Config)?;
        std::fs::create_dir_all(dir).map_err(|source| MgmtError::Io { path: dir.to_path_buf(), source })?;
        let path = dir.join(REGISTRY_FILE);
        let reg = Registry::load(&path)?.unwrap_or_default();
        info!(
            registry = %path.display(),
            nodes = reg.nodes.len(),
            targets = reg.targets.len(),
            pools = reg.pools.len(),
            "registry loaded"
        );
        Ok(Mgmt {
            path,
            reg,
            timeouts,
            limits,
            started: now,
            nodes: HashMap::new(),
            targets: HashMap::new(),
            resync: HashMap::new(),
            quota: Default::default(),
        })
    }

    /// How often metadata nodes report quota usage.
    pub fn set_quota_interval(&mut self, interval_ms: u64) {
        self.quota.interval_ms = interval_ms;
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

    /// Answers one request. Only registrations, pool creations and target
    /// moves touch the disk.
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
            Request::RegisterTarget { node, uuid, capacity } => {
                let (target, pool) = self.mutate(|r| {
                    let (t, p, changed) = r.register_target(node, &uuid)?;
                    Ok(((t, p), changed))
                })?;
                info!(%target, storage_node = %node, %uuid, %pool, "target registered");
                let live =
                    self.targets.entry(target).or_insert(TargetLive { last_seen: now, capacity: Capacity::default() });
                live.last_seen = now;
                if capacity.total_bytes > 0 {
                    live.capacity = capacity;
                }
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
                Ok(Reply::HeartbeatAck { lease_ms: self.timeouts.lease_ms() })
            }
            Request::CreateGroup { kind, primary, secondary, force } => {
                let group = self.mutate(|r| Ok((r.create_group(kind, primary, secondary, force)?, true)))?;
                info!(%group, kind = kind.as_str(), primary, secondary, "buddy group created");
                Ok(Reply::GroupCreated { group })
            }
            Request::ListGroups { kind } => Ok(Reply::Groups(self.list_groups(kind))),
            Request::SetMemberState { group, epoch, member, state } => {
                let changed = self.mutate(|r| set_member_state(r, group, epoch, member, state))?;
                if changed {
                    info!(%group, member, state = state.as_str(), by = if epoch.is_some() { "primary" } else { "administrator" }, "buddy group member state set");
                }
                if state != Consistency::Resyncing {
                    self.resync.remove(&group);
                }
                Ok(Reply::Ok)
            }
            Request::ResyncProgress { group, done, total } => {
                if self.reg.group(group).is_none() {
                    return Err(fs_err!(NotFound, "buddy group {group} does not exist"));
                }
                self.resync.insert(group, (done, total));
                Ok(Reply::Ok)
            }
            Request::ListNodes { node_type } => Ok(Reply::Nodes(self.list_nodes(node_type, now))),
            Request::ListTargets => Ok(Reply::Targets(self.list_targets(now))),
            Request::GetRootOwner => Ok(Reply::RootOwner(self.reg.root_owner)),
            Request::CreatePool { name } => {
                let pool = self.mutate(|r| Ok((r.create_pool(&name)?, true)))?;
                info!(%pool, %name, "storage pool created");
                Ok(Reply::PoolCreated { pool })
            }
            Request::MoveTargetToPool { target, pool } => {
                let moved = self.mutate(|r| r.move_target_to_pool(target, pool).map(|changed| (changed, changed)))?;
                if moved {
                    info!(%target, %pool, "target moved to storage pool");
                }
                Ok(Reply::Ok)
            }
            Request::ListPools => Ok(Reply::Pools(self.list_pools())),
            Request::SetQuota(l) => {
                if self.mutate(|r| r.set_quota(l).map(|c| (c, c)))? {
                    let show = |v: Option<u64>| v.map_or("none".to_string(), |v| v.to_string());
                    let pool = l.pool.map_or("all".to_string(), |p| p.to_string());
                    info!(kind = l.who.kind.name(), id = l.who.id, %pool, bytes = %show(l.bytes), inodes = %show(l.inodes), "quota set");
                }
                Ok(Reply::Ok)
            }
            Request::GetQuotas => Ok(self.quota.answer(&self.reg, now)),
            Request::QuotaReport { namespace, usage, by_unit } => {
                if self.reg.node(NodeType::Meta, namespace).is_none() {
                    return Err(fs_err!(NotFound, "namespace {namespace} is not a registered metadata node"));
                }
                self.quota.report(namespace, usage, by_unit, now);
                Ok(self.quota.answer(&self.reg, now))
            }
            other => Err(fs_err!(NotSupported, "mgmtd does not serve {}", other.name())),
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
                let capacity = live.map(|l| l.capacity).unwrap_or_default();
                TargetInfo {
                    id: t.id,
                    node: t.node,
                    pool: t.pool,
                    capacity,
                    last_seen_ms: age,
                    reachability: classify(age, self.timeouts),
                    capacity_pool: capacity_pool(&capacity, &self.limits),
                }
            })
            .collect();
        out.sort_by_key(|t| t.id);
        out
    }

    pub fn list_groups(&self, kind: Option<GroupKind>) -> Vec<GroupInfo> {
        let mut out: Vec<GroupInfo> = self
            .reg
            .groups
            .iter()
            .filter(|g| kind.is_none_or(|k| k == g.kind))
            .map(|g| GroupInfo {
                id: g.id,
                kind: g.kind,
                primary: g.primary,
                secondary: g.secondary,
                epoch: g.epoch,
                primary_state: g.primary_state,
                secondary_state: g.secondary_state,
                resync: self.resync.get(&g.id).copied(),
                serves: g.serves,
            })
            .collect();
        out.sort_by_key(|g| g.id);
        out
    }

    /// Milliseconds since a group member last reported.
    fn member_age(&self, kind: GroupKind, member: u32, now: Instant) -> u64 {
        let seen = match kind {
            GroupKind::Storage => self.targets.get(&TargetId(member)).map(|l| l.last_seen),
            GroupKind::Meta => self.nodes.get(&(NodeType::Meta, NodeId(member))).map(|l| l.last_seen),
        };
        age_ms(now, seen.unwrap_or(self.started))
    }

    /// Switches over every buddy group whose primary has been silent for
    /// `failover_after_ms` while its secondary is online and good
    /// (`docs/design-mirror.md`, "Failover"). Persisted before it returns;
    /// returns the groups switched.
    pub fn failover(&mut self, now: Instant) -> Result<Vec<BuddyGroupId>, FsError> {
        let due: Vec<BuddyGroupId> = self
            .reg
            .groups
            .iter()
            .filter(|g| {
                self.member_age(g.kind, g.primary, now) >= self.timeouts.failover_after_ms
                    && self.member_age(g.kind, g.secondary, now) < self.timeouts.probably_offline_after_ms
                    && g.secondary_state == Consistency::Good
            })
            .map(|g| g.id)
            .collect();
        if due.is_empty() {
            return Ok(due);
        }
        self.mutate(|r| {
            for g in r.groups.iter_mut().filter(|g| due.contains(&g.id)) {
                g.switch_over();
            }
            Ok(((), true))
        })?;
        for id in &due {
            self.resync.remove(id);
            let g = self.reg.group(*id).expect("switched group exists");
            warn!(
                group = %g.id,
                kind = g.kind.as_str(),
                new_primary = g.primary,
                old_primary = g.secondary,
                epoch = g.epoch,
                "buddy group switched over: its primary was silent for {} ms",
                self.timeouts.failover_after_ms
            );
        }
        Ok(due)
    }

    /// Every storage pool by id, each with its targets by id.
    pub fn list_pools(&self) -> Vec<PoolInfo> {
        let mut members: HashMap<PoolId, Vec<TargetId>> = HashMap::new();
        for t in &self.reg.targets {
            members.entry(t.pool).or_default().push(t.id);
        }
        let mut out: Vec<PoolInfo> = self
            .reg
            .pools
            .iter()
            .map(|p| {
                let mut targets = members.remove(&p.id).unwrap_or_default();
                targets.sort_unstable();
                PoolInfo { id: p.id, name: p.name.clone(), targets }
            })
            .collect();
        // The registry's invariants: every target's pool exists.
        debug_assert!(members.is_empty(), "targets in unknown pools: {members:?}");
        out.sort_by_key(|p| p.id);
        out
    }
}

/// `Request::SetMemberState` on the registry: returns (changed, changed).
fn set_member_state(
    r: &mut crate::registry::Registry,
    group: BuddyGroupId,
    epoch: Option<u64>,
    member: u32,
    state: Consistency,
) -> Result<(bool, bool), FsError> {
    let g: &mut GroupRecord = r
        .groups
        .iter_mut()
        .find(|g| g.id == group)
        .ok_or_else(|| fs_err!(NotFound, "buddy group {group} does not exist"))?;
    if member != g.secondary {
        let what = if member == g.primary { "its primary" } else { "not a member" };
        return Err(fs_err!(
            Invalid,
            "buddy group {group}: {member} is {what}; only the secondary's state is set (epoch {})",
            g.epoch
        ));
    }
    use Consistency::*;
    let from = g.secondary_state;
    let allowed = match epoch {
        // The group's primary at the current epoch drives its secondary.
        Some(e) if e != g.epoch => {
            return Err(fs_err!(
                Unavailable,
                "buddy group {group} is at epoch {}, not {e}: the sender is no longer its primary",
                g.epoch
            ))
        }
        Some(_) => matches!(
            (from, state),
            (Good | Resyncing, NeedsResync) | (NeedsResync | Bad, Resyncing) | (Resyncing, Good) | (NeedsResync, Bad)
        ),
        // An administrator asks for a resync (or a full one).
        None => matches!(state, NeedsResync | Bad),
    };
    if from == state {
        return Ok((false, false));
    }
    if !allowed {
        return Err(fs_err!(
            Invalid,
            "buddy group {group}: member {member} cannot go from {} to {}",
            from.as_str(),
            state.as_str()
        ));
    }
    g.secondary_state = state;
    Ok((true, true))
}

#[cfg(test)]
mod tests {
    use super::*;
    use hivefs_proto::TargetCapacity;
    use hivefs_types::error::ErrorCode;
    use hivefs_types::ids::EntryId;
    use std::time::Duration;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    const T: Timeouts =
        Timeouts { probably_offline_after_ms: 10_000, offline_after_ms: 30_000, failover_after_ms: 30_000 };
    const L: CapacityLimits = CapacityLimits::DEFAULT;

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

    fn beat(m: &mut Mgmt, node: NodeId, targets: &[TargetId], now: Instant) -> Reply {
        let targets = targets.iter().map(|&target| TargetCapacity { target, capacity: Capacity::default() }).collect();
        m.handle(Request::Heartbeat { node_type: NodeType::Storage, node, targets, meta: None }, now).unwrap()
    }

    #[test]
    fn buddy_groups_are_checked_switched_over_and_persisted() {
        let d = tempfile::tempdir().unwrap();
        let t0 = Instant::now();
        let mut m = Mgmt::open(d.path(), T, L, t0).unwrap();
        let (s1, s2) = (reg_node(&mut m, NodeType::Storage, "s1", t0), reg_node(&mut m, NodeType::Storage, "s2", t0));
        let (a, a2, b) =
            (reg_target(&mut m, s1, "a", t0).0, reg_target(&mut m, s1, "a2", t0).0, reg_target(&mut m, s2, "b", t0).0);
        let create = |p: TargetId, s: TargetId, force| Request::CreateGroup {
            kind: GroupKind::Storage,
            primary: p.0,
            secondary: s.0,
            force,
        };
        let e = m.handle(create(a, a2, false), t0).unwrap_err();
        assert!(e.message.contains("both on storage node"), "{e}");
        assert_eq!(m.handle(create(a, a, true), t0).unwrap_err().code, ErrorCode::Invalid);
        assert_eq!(m.handle(create(a, TargetId(99), false), t0).unwrap_err().code, ErrorCode::NotFound);
        let Reply::GroupCreated { group } = m.handle(create(a, b, false), t0).unwrap() else { panic!() };
        assert_eq!(m.handle(create(b, a2, true), t0).unwrap_err().code, ErrorCode::Exists);
        // A metadata group mirrors its primary's namespace; a node may hold
        // other namespaces' copies too, but a namespace has one group.
        let meta = |p: NodeId, s: NodeId, force| Request::CreateGroup {
            kind: GroupKind::Meta,
            primary: p.0,
            secondary: s.0,
            force,
        };
        assert_eq!(m.handle(meta(NodeId(1), NodeId(2), false), t0).unwrap_err().code, ErrorCode::NotFound);
        let (m1, m2) = (reg_node(&mut m, NodeType::Meta, "m1", t0), reg_node(&mut m, NodeType::Meta, "m2", t0));
        let e = m.handle(meta(m1, m2, false), t0).unwrap_err();
        assert!(e.message.contains("both on host"), "{e}");
        let Reply::GroupCreated { group: mg } = m.handle(meta(m1, m2, true), t0).unwrap() else { panic!() };
        assert_eq!(m.handle(meta(m1, m2, true), t0).unwrap_err().code, ErrorCode::Exists);
        m.handle(meta(m2, m1, true), t0).unwrap();
        // Heartbeats grant half the failover time as a lease.
        assert_eq!(beat(&mut m, s1, &[a, a2], t0 + ms(1_000)), Reply::HeartbeatAck { lease_ms: 15_000 });
        beat(&mut m, s2, &[b], t0 + ms(1_000));
        // Moving a member moves its buddy.
        let Reply::PoolCreated { pool } = m.handle(Request::CreatePool { name: "p".into() }, t0).unwrap() else {
            panic!()
        };
        m.handle(Request::MoveTargetToPool { target: b, pool }, t0).unwrap();
        assert_eq!(m.registry().target(a).unwrap().pool, pool);

        // The primary goes silent: nothing before the failover time, then a switch.
        beat(&mut m, s2, &[b], t0 + ms(30_000));
        assert!(m.failover(t0 + ms(30_999)).unwrap().is_empty());
        assert_eq!(m.failover(t0 + ms(31_000)).unwrap(), vec![group]);
        let g = &m.list_groups(None)[0];
        assert_eq!((g.primary, g.secondary, g.epoch), (b.0, a.0, 1));
        assert_eq!((g.primary_state, g.secondary_state), (Consistency::Good, Consistency::NeedsResync));
        // A needs-resync secondary is never promoted, however long the primary is gone.
        beat(&mut m, s1, &[a, a2], t0 + ms(90_000));
        assert!(m.failover(t0 + ms(90_000)).unwrap().is_empty());

        // Only the current epoch's primary drives its secondary's state.
        let set = |epoch, state| Request::SetMemberState { group, epoch, member: a.0, state };
        assert_eq!(m.handle(set(Some(0), Consistency::Resyncing), t0).unwrap_err().code, ErrorCode::Unavailable);
        assert_eq!(m.handle(set(Some(1), Consistency::Good), t0).unwrap_err().code, ErrorCode::Invalid);
        m.handle(set(Some(1), Consistency::Resyncing), t0).unwrap();
        m.handle(Request::ResyncProgress { group, done: 3, total: 10 }, t0).unwrap();
        assert_eq!(m.list_groups(Some(GroupKind::Storage))[0].resync, Some((3, 10)));
        m.handle(set(Some(1), Consistency::Good), t0).unwrap();
        assert_eq!(m.list_groups(None)[0].resync, None);
        let primary = Request::SetMemberState { group, epoch: Some(1), member: b.0, state: Consistency::Bad };
        assert_eq!(m.handle(primary, t0).unwrap_err().code, ErrorCode::Invalid);
        // An administrator may ask for a full resync.
        m.handle(set(None, Consistency::Bad), t0).unwrap();
        let metas = m.list_groups(Some(GroupKind::Meta));
        let serves: Vec<_> = metas.iter().map(|g| (g.serves, g.primary, g.secondary_state)).collect();
        assert_eq!(serves, [(Some(m1), m1.0, Consistency::NeedsResync), (Some(m2), m2.0, Consistency::NeedsResync)]);
        assert_eq!(metas[0].id, mg);

        // All of it survives a restart of mgmtd.
        let before = m.list_groups(None);
        drop(m);
        let m = Mgmt::open(d.path(), T, L, t0).unwrap();
        assert_eq!(m.list_groups(None), before);
    }

    #[test]
    fn ages_and_reachability_follow_heartbeats() {
        let d = tempfile::tempdir().unwrap();
        let t0 = Instant::now();
        let mut m = Mgmt::open(d.path(), T, L, t0).unwrap();
        let s = reg_node(&mut m, NodeType::Storage, "s", t0 + ms(1_000));
        let meta = reg_node(&mut m, NodeType::Meta, "m", t0 + ms(1_000));
        let Reply::TargetRegistered { target, pool } = m
            .handle(
                Request::RegisterTarget { node: s, uuid: "t".into(), capacity: Capacity::default() },
                t0 + ms(1_000),
            )
            .unwrap()
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
        let mut m = Mgmt::open(d.path(), T, L, t0).unwrap();
        let s = reg_node(&mut m, NodeType::Storage, "s", t0);
        m.handle(Request::RegisterTarget { node: s, uuid: "t".into(), capacity: Capacity::default() }, t0).unwrap();
        drop(m);
        // Restarted mgmtd: registry reloaded, nobody heard from yet.
        let t1 = t0 + ms(100_000);
        let m = Mgmt::open(d.path(), T, L, t1).unwrap();
        let n = &m.list_nodes(None, t1 + ms(12_000))[0];
        assert_eq!((n.last_seen_ms, n.reachability), (12_000, Reachability::ProbablyOffline));
        let t = &m.list_targets(t1 + ms(3_000))[0];
        assert_eq!((t.last_seen_ms, t.reachability), (3_000, Reachability::Online));
    }

    #[test]
    fn heartbeat_of_unknown_node_asks_to_register_again() {
        let d = tempfile::tempdir().unwrap();
        let t0 = Instant::now();
        let mut m = Mgmt::open(d.path(), T, L, t0).unwrap();
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
        let mut m = Mgmt::open(d.path(), T, L, t0).unwrap();
        assert_eq!(m.handle(Request::GetRootOwner, t0).unwrap(), Reply::RootOwner(None));
        let s1 = reg_node(&mut m, NodeType::Storage, "s1", t0);
        let m1 = reg_node(&mut m, NodeType::Meta, "m1", t0);
        let m2 = reg_node(&mut m, NodeType::Meta, "m2", t0);
        assert_eq!((s1, m1, m2), (NodeId(1), NodeId(1), NodeId(2)));
        let reg = m.registry().clone();
        drop(m);

        let mut m = Mgmt::open(d.path(), T, L, t0).unwrap();
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
        let mut m = Mgmt::open(d.path(), T, L, t0).unwrap();
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
        let e = Mgmt::open(d.path(), T, L, Instant::now()).err().expect("corrupt registry refused");
        assert!(e.to_string().contains(&d.path().join(REGISTRY_FILE).display().to_string()), "{e}");
    }

    #[test]
    fn other_requests_are_not_supported() {
        let d = tempfile::tempdir().unwrap();
        let mut m = Mgmt::open(d.path(), T, L, Instant::now()).unwrap();
        let e = m.handle(Request::GetAttr { id: EntryId::ROOT }, Instant::now()).unwrap_err();
        assert_eq!(e.code, ErrorCode::NotSupported);
        assert_eq!(e.message, "mgmtd does not serve GetAttr");
    }

    fn cap(free_bytes: u64, free_inodes: u64) -> Capacity {
        Capacity { total_bytes: 1 << 40, free_bytes, total_inodes: 1 << 30, free_inodes }
    }

    #[test]
    fn capacity_pool_boundaries() {
        let l = CapacityLimits {
            space_low_limit_bytes: 1_000,
            space_emergency_limit_bytes: 100,
            inodes_low_limit: 50,
            inodes_emergency_limit: 5,
        };
        let p = |b, i| capacity_pool(&cap(b, i), &l);
        // Exactly at the low limits: normal; one below either: low.
        assert_eq!(p(1_000, 50), CapacityPool::Normal);
        assert_eq!(p(u64::MAX, u64::MAX), CapacityPool::Normal);
        assert_eq!(p(999, 50), CapacityPool::Low);
        assert_eq!(p(1_000, 49), CapacityPool::Low);
        assert_eq!(p(999, 49), CapacityPool::Low);
        // Plenty of one does not make up for the other.
        assert_eq!(p(u64::MAX, 49), CapacityPool::Low);
        assert_eq!(p(999, u64::MAX), CapacityPool::Low);
        // Exactly at the emergency limits: low; one below either: emergency.
        assert_eq!(p(100, 5), CapacityPool::Low);
        assert_eq!(p(99, 5), CapacityPool::Emergency);
        assert_eq!(p(100, 4), CapacityPool::Emergency);
        assert_eq!(p(u64::MAX, 4), CapacityPool::Emergency);
        assert_eq!(p(99, u64::MAX), CapacityPool::Emergency);
        assert_eq!(p(0, 0), CapacityPool::Emergency);

        // The defaults: 1 GiB / 256 MiB, 10 000 / 1 000 inodes.
        let d = CapacityLimits::default();
        assert_eq!(d, CapacityLimits::DEFAULT);
        assert_eq!(capacity_pool(&cap(1 << 30, 10_000), &d), CapacityPool::Normal);
        assert_eq!(capacity_pool(&cap((1 << 30) - 1, 10_000), &d), CapacityPool::Low);
        assert_eq!(capacity_pool(&cap(1 << 30, 9_999), &d), CapacityPool::Low);
        assert_eq!(capacity_pool(&cap(256 << 20, 1_000), &d), CapacityPool::Low);
        assert_eq!(capacity_pool(&cap((256 << 20) - 1, 1_000), &d), CapacityPool::Emergency);
        assert_eq!(capacity_pool(&cap(256 << 20, 999), &d), CapacityPool::Emergency);

        // Zero limits: every target that reported anything is normal.
        let zero = CapacityLimits {
            space_low_limit_bytes: 0,
            space_emergency_limit_bytes: 0,
            inodes_low_limit: 0,
            inodes_emergency_limit: 0,
        };
        assert_eq!(capacity_pool(&cap(0, 0), &zero), CapacityPool::Normal);
    }

    #[test]
    fn unknown_capacity_is_emergency() {
        let l = CapacityLimits::DEFAULT;
        assert_eq!(capacity_pool(&Capacity::default(), &l), CapacityPool::Emergency);
        // Whatever else it says: without a size nothing is known.
        let c = Capacity { total_bytes: 0, free_bytes: u64::MAX, total_inodes: u64::MAX, free_inodes: u64::MAX };
        assert_eq!(capacity_pool(&c, &l), CapacityPool::Emergency);
        let zero = CapacityLimits {
            space_low_limit_bytes: 0,
            space_emergency_limit_bytes: 0,
            inodes_low_limit: 0,
            inodes_emergency_limit: 0,
        };
        assert_eq!(capacity_pool(&Capacity::default(), &zero), CapacityPool::Emergency);
    }

    #[test]
    fn file_system_without_inode_count_is_classified_by_space() {
        // btrfs reports f_files = f_ffree = 0.
        let l = CapacityLimits::DEFAULT;
        let c = |free_bytes| Capacity { total_bytes: 1 << 40, free_bytes, total_inodes: 0, free_inodes: 0 };
        assert_eq!(capacity_pool(&c(1 << 30), &l), CapacityPool::Normal);
        assert_eq!(capacity_pool(&c((1 << 30) - 1), &l), CapacityPool::Low);
        assert_eq!(capacity_pool(&c((256 << 20) - 1), &l), CapacityPool::Emergency);
        // A file system that counts inodes and has none left is full.
        let full = Capacity { total_bytes: 1 << 40, free_bytes: 1 << 40, total_inodes: 100, free_inodes: 0 };
        assert_eq!(capacity_pool(&full, &l), CapacityPool::Emergency);
    }

    #[test]
    fn capacity_limits_validation() {
        assert_eq!(CapacityLimits::DEFAULT.validate(), Ok(()));
        let equal = CapacityLimits {
            space_low_limit_bytes: 7,
            space_emergency_limit_bytes: 7,
            inodes_low_limit: 3,
            inodes_emergency_limit: 3,
        };
        assert_eq!(equal.validate(), Ok(()));
        let e = CapacityLimits { space_emergency_limit_bytes: 8, ..equal }.validate().unwrap_err();
        assert_eq!(e, "need space_emergency_limit_bytes (8) <= space_low_limit_bytes (7)");
        let e = CapacityLimits { inodes_emergency_limit: 4, ..equal }.validate().unwrap_err();
        assert_eq!(e, "need inodes_emergency_limit (4) <= inodes_low_limit (3)");

        let d = tempfile::tempdir().unwrap();
        let bad = CapacityLimits { inodes_emergency_limit: 4, ..equal };
        let e = Mgmt::open(d.path(), T, bad, Instant::now()).err().expect("bad limits refused");
        assert!(matches!(e, MgmtError::Config(_)) && e.to_string().contains("inodes_emergency_limit"), "{e}");
    }

    fn reg_target(m: &mut Mgmt, node: NodeId, uuid: &str, now: Instant) -> (TargetId, PoolId) {
        match m.handle(Request::RegisterTarget { node, uuid: uuid.into(), capacity: Capacity::default() }, now).unwrap()
        {
            Reply::TargetRegistered { target, pool } => (target, pool),
            r => panic!("{r:?}"),
        }
    }

    fn create_pool(m: &mut Mgmt, name: &str) -> Result<PoolId, FsError> {
        match m.handle(Request::CreatePool { name: name.into() }, Instant::now())? {
            Reply::PoolCreated { pool } => Ok(pool),
            r => panic!("{r:?}"),
        }
    }

    fn move_target(m: &mut Mgmt, target: u32, pool: u16) -> Result<Reply, FsError> {
        m.handle(Request::MoveTargetToPool { target: TargetId(target), pool: PoolId(pool) }, Instant::now())
    }

    fn pools(m: &mut Mgmt) -> Vec<(u16, String, Vec<u32>)> {
        match m.handle(Request::ListPools, Instant::now()).unwrap() {
            Reply::Pools(ps) => {
                ps.into_iter().map(|p| (p.id.0, p.name, p.targets.iter().map(|t| t.0).collect())).collect()
            }
            r => panic!("{r:?}"),
        }
    }

    fn pool(id: u16, name: &str, targets: &[u32]) -> (u16, String, Vec<u32>) {
        (id, name.to_string(), targets.to_vec())
    }

    #[test]
    fn storage_pools_create_move_list() {
        let d = tempfile::tempdir().unwrap();
        let t0 = Instant::now();
        let mut m = Mgmt::open(d.path(), T, L, t0).unwrap();
        assert_eq!(pools(&mut m), vec![pool(1, "default", &[])]);
        let s1 = reg_node(&mut m, NodeType::Storage, "s1", t0);
        let s2 = reg_node(&mut m, NodeType::Storage, "s2", t0);
        for (node, uuid) in [(s1, "t1"), (s2, "t2"), (s1, "t3"), (s2, "t4")] {
            assert_eq!(reg_target(&mut m, node, uuid, t0).1, PoolId::DEFAULT);
        }
        assert_eq!(create_pool(&mut m, "ssd"), Ok(PoolId(2)));
        assert_eq!(create_pool(&mut m, "hdd"), Ok(PoolId(3)));
        let e = create_pool(&mut m, "ssd").unwrap_err();
        assert_eq!((e.code, e.message.as_str()), (ErrorCode::Exists, "storage pool \"ssd\" already exists (id 2)"));
        let e = create_pool(&mut m, "s s d").unwrap_err();
        assert_eq!(e.code, ErrorCode::Invalid);
        assert!(e.message.contains("\"s s d\"") && e.message.contains("A-Z, a-z, 0-9"), "{e}");

        // Moved in an order that is not the id order: listed by id anyway.
        assert_eq!(move_target(&mut m, 4, 2), Ok(Reply::Ok));
        assert_eq!(move_target(&mut m, 1, 2), Ok(Reply::Ok));
        assert_eq!(move_target(&mut m, 3, 3), Ok(Reply::Ok));
        assert_eq!(move_target(&mut m, 3, 3), Ok(Reply::Ok));
        let e = move_target(&mut m, 9, 2).unwrap_err();
        assert_eq!((e.code, e.message.as_str()), (ErrorCode::NotFound, "storage target 9 is not registered"));
        let e = move_target(&mut m, 1, 7).unwrap_err();
        assert_eq!((e.code, e.message.as_str()), (ErrorCode::NotFound, "storage pool 7 does not exist"));
        let want = vec![pool(1, "default", &[2]), pool(2, "ssd", &[1, 4]), pool(3, "hdd", &[3])];
        assert_eq!(pools(&mut m), want);

        // Re-registration answers with the pool the target was moved to.
        assert_eq!(reg_target(&mut m, s2, "t4", t0), (TargetId(4), PoolId(2)));
        assert_eq!(reg_target(&mut m, s1, "t5", t0), (TargetId(5), PoolId::DEFAULT));
        let ts = m.list_targets(t0);
        assert_eq!(ts.iter().map(|t| (t.id.0, t.pool.0)).collect::<Vec<_>>(), [(1, 2), (2, 1), (3, 3), (4, 2), (5, 1)]);
    }

    #[test]
    fn storage_pools_survive_restart() {
        let d = tempfile::tempdir().unwrap();
        let t0 = Instant::now();
        let mut m = Mgmt::open(d.path(), T, L, t0).unwrap();
        let s = reg_node(&mut m, NodeType::Storage, "s", t0);
        reg_target(&mut m, s, "t1", t0);
        reg_target(&mut m, s, "t2", t0);
        assert_eq!(create_pool(&mut m, "ssd"), Ok(PoolId(2)));
        assert_eq!(create_pool(&mut m, "hdd"), Ok(PoolId(3)));
        move_target(&mut m, 2, 3).unwrap();
        let before = pools(&mut m);
        let reg = m.registry().clone();
        drop(m);

        let mut m = Mgmt::open(d.path(), T, L, t0).unwrap();
        assert_eq!(m.registry(), &reg);
        assert_eq!(pools(&mut m), before);
        assert_eq!(reg_target(&mut m, s, "t2", t0), (TargetId(2), PoolId(3)));
        // Ids continue after the last one handed out.
        assert_eq!(create_pool(&mut m, "nvme"), Ok(PoolId(4)));
        let e = create_pool(&mut m, "hdd").unwrap_err();
        assert_eq!(e.message, "storage pool \"hdd\" already exists (id 3)");
    }

    #[test]
    fn registry_without_pools_loads_into_the_default_pool() {
        let d = tempfile::tempdir().unwrap();
        let old = "format_version = 1\n\n[next_ids]\nmeta = 1\nstorage = 2\nclient = 1\ntarget = 2\n\n\
                   [[nodes]]\nnode_type = \"Storage\"\nid = 1\nuuid = \"s\"\naddr = \"a:1\"\nhostname = \"h\"\n\n\
                   [[targets]]\nid = 1\nuuid = \"t\"\nnode = 1\npool = 1\n";
        std::fs::write(d.path().join(REGISTRY_FILE), old).unwrap();
        let t0 = Instant::now();
        let mut m = Mgmt::open(d.path(), T, L, t0).unwrap();
        assert_eq!(pools(&mut m), vec![pool(1, "default", &[1])]);
        assert_eq!(create_pool(&mut m, "ssd"), Ok(PoolId(2)));
        move_target(&mut m, 1, 2).unwrap();
        drop(m);
        let mut m = Mgmt::open(d.path(), T, L, t0).unwrap();
        assert_eq!(pools(&mut m), vec![pool(1, "default", &[]), pool(2, "ssd", &[1])]);
    }

    #[test]
    fn registry_with_a_target_in_a_missing_pool_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let text = "format_version = 1\n\n[next_ids]\nmeta = 1\nstorage = 2\nclient = 1\ntarget = 2\n\n\
                    [[nodes]]\nnode_type = \"Storage\"\nid = 1\nuuid = \"s\"\naddr = \"a:1\"\nhostname = \"h\"\n\n\
                    [[targets]]\nid = 1\nuuid = \"t\"\nnode = 1\npool = 2\n";
        std::fs::write(d.path().join(REGISTRY_FILE), text).unwrap();
        let e = Mgmt::open(d.path(), T, L, Instant::now()).err().expect("refused");
        let msg = e.to_string();
        assert!(matches!(e, MgmtError::CorruptRegistry { .. }), "{msg}");
        assert!(msg.contains("target 1 is in storage pool 2, which does not exist"), "{msg}");
    }

    #[test]
    fn failed_pool_persist_changes_nothing() {
        let d = tempfile::tempdir().unwrap();
        let t0 = Instant::now();
        let mut m = Mgmt::open(d.path(), T, L, t0).unwrap();
        let s = reg_node(&mut m, NodeType::Storage, "s", t0);
        reg_target(&mut m, s, "t1", t0);
        assert_eq!(create_pool(&mut m, "ssd"), Ok(PoolId(2)));
        let tmp = d.path().join(".registry.toml.tmp");
        std::fs::create_dir(&tmp).unwrap();
        assert_eq!(create_pool(&mut m, "hdd").unwrap_err().code, ErrorCode::Io);
        assert_eq!(move_target(&mut m, 1, 2).unwrap_err().code, ErrorCode::Io);
        // A move that changes nothing writes nothing, so it cannot fail.
        assert_eq!(move_target(&mut m, 1, 1), Ok(Reply::Ok));
        assert_eq!(pools(&mut m), vec![pool(1, "default", &[1]), pool(2, "ssd", &[])]);
        std::fs::remove_dir(&tmp).unwrap();
        assert_eq!(create_pool(&mut m, "hdd"), Ok(PoolId(3)));
    }

    #[test]
    fn listed_targets_carry_their_capacity_pool() {
        let d = tempfile::tempdir().unwrap();
        let t0 = Instant::now();
        let limits = CapacityLimits {
            space_low_limit_bytes: 1_000,
            space_emergency_limit_bytes: 100,
            inodes_low_limit: 50,
            inodes_emergency_limit: 5,
        };
        let mut m = Mgmt::open(d.path(), T, limits, t0).unwrap();
        let s = reg_node(&mut m, NodeType::Storage, "s", t0);
        for uuid in ["t1", "t2", "t3", "t4"] {
            reg_target(&mut m, s, uuid, t0);
        }
        // Registered, capacity not reported yet: emergency.
        assert!(m.list_targets(t0).iter().all(|t| t.capacity_pool == CapacityPool::Emergency));
        let c = |free_bytes, free_inodes| Capacity { total_bytes: 10_000, free_bytes, total_inodes: 100, free_inodes };
        let report = [(1, c(1_000, 50)), (2, c(999, 50)), (3, c(1_000, 4))];
        let hb = Request::Heartbeat {
            node_type: NodeType::Storage,
            node: s,
            targets: report.iter().map(|&(t, capacity)| TargetCapacity { target: TargetId(t), capacity }).collect(),
            meta: None,
        };
        m.handle(hb, t0).unwrap();
        let got: Vec<_> = m.list_targets(t0).iter().map(|t| (t.id.0, t.capacity_pool)).collect();
        assert_eq!(
            got,
            [
                (1, CapacityPool::Normal),
                (2, CapacityPool::Low),
                (3, CapacityPool::Emergency),
                (4, CapacityPool::Emergency)
            ]
        );
    }
}
