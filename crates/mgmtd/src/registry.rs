//! The persistent registry: which nodes, targets and storage pools exist,
//! their ids, which pool each target belongs to, and the owner of the root
//! directory.
//!
//! Pure data and pure mutations; the only I/O is [`Registry::load`] and
//! [`Registry::save`]. Liveness (heartbeats, capacities) is not here: it is
//! in-memory state in [`crate::state`] and is rebuilt after a restart.
//!
//! On-disk format: `<dir>/registry.toml`, written with
//! `hivefs_cluster::write_atomic` (temp file, fsync, rename, fsync dir):
//!
//! ```toml
//! format_version = 1
//! root_owner = 1                 # absent until the first meta node registers
//!
//! [next_ids]                     # next id to hand out, per kind (ids start at 1)
//! meta = 2
//! storage = 2
//! client = 1
//! target = 3
//! pool = 3                       # absent in registries written before storage pools: 2
//!
//! [[nodes]]
//! node_type = "Storage"          # "Meta" | "Storage" | "Client"
//! id = 1
//! uuid = "…"
//! addr = "127.0.0.1:8003"
//! hostname = "host1"
//!
//! [[targets]]
//! id = 1
//! uuid = "…"
//! node = 1                       # storage node id
//! pool = 1                       # storage pool id
//!
//! [[pools]]                      # absent in registries written before storage
//! id = 1                         # pools: then exactly the default pool
//! name = "default"
//!
//! [[pools]]
//! id = 2
//! name = "ssd"
//!
//! [[groups]]                     # buddy groups; absent until one is made
//! id = 1
//! kind = "Storage"               # "Storage" (members are targets) | "Meta" (metadata nodes)
//! primary = 1
//! secondary = 2
//! epoch = 0                      # role switches so far
//! primary_state = "Good"         # "Good" | "NeedsResync" | "Resyncing" | "Bad"
//! secondary_state = "Good"
//!
//! [[quotas]]                     # quota limits; absent until one is set
//! kind = "User"                  # "User" | "Group"
//! id = 1001
//! pool = 2                       # absent: the whole file system, else its files in this storage pool
//! bytes = 10737418240            # absent: no space limit
//! inodes = 100000                # absent: no inode limit
//! ```
//!
//! Storage pools: pool 1 ([`PoolId::DEFAULT`], named [`DEFAULT_POOL_NAME`])
//! always exists and every newly registered target joins it. Created pools
//! get ids 2, 3, … that are never reused. A target belongs to exactly one
//! pool; moving it changes where new files may be placed, not where existing
//! files live. The pool fields were added without a new `format_version`:
//! this mgmtd reads older registries (serde defaults), and an older mgmtd
//! refuses a newer one (unknown fields) instead of dropping its pools.

use hivefs_proto::{Consistency, GroupKind, QuotaId, QuotaKind, QuotaLimit};
use hivefs_types::error::{ErrorCode, FsError};
use hivefs_types::fs_err;
use hivefs_types::ids::{BuddyGroupId, EntryId, NodeId, NodeType, PoolId, TargetId};
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::path::Path;

pub const REGISTRY_FILE: &str = "registry.toml";
pub const FORMAT_VERSION: u32 = 1;

/// Limits on what a peer may make us store (and persist on every change).
pub const UUID_LEN_MAX: usize = 128;
pub const ADDR_LEN_MAX: usize = 256;
pub const HOSTNAME_LEN_MAX: usize = 256;
pub const NODES_MAX: usize = 65_536;
pub const TARGETS_MAX: usize = 65_536;
/// Storage pools, including the default pool.
pub const POOLS_MAX: usize = 1_024;
pub const GROUPS_MAX: usize = 65_536;
/// Storage pool names: 1 to this many characters of `[A-Za-z0-9._-]`.
pub const POOL_NAME_LEN_MAX: usize = 64;
pub const DEFAULT_POOL_NAME: &str = "default";
/// The id the first created storage pool gets (1 is the default pool).
pub const FIRST_CREATED_POOL_ID: u16 = 2;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeRecord {
    pub node_type: NodeType,
    pub id: NodeId,
    pub uuid: String,
    pub addr: String,
    pub hostname: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TargetRecord {
    pub id: TargetId,
    pub uuid: String,
    /// The storage node that serves the target.
    pub node: NodeId,
    pub pool: PoolId,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolRecord {
    pub id: PoolId,
    pub name: String,
}

/// The next id to assign, per kind. Ids are never reused, even if a record
/// were ever removed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NextIds {
    pub meta: u32,
    pub storage: u32,
    pub client: u32,
    pub target: u32,
    #[serde(default = "first_created_pool_id")]
    pub pool: u16,
    #[serde(default = "one")]
    pub group: u32,
}

fn one() -> u32 {
    1
}

/// A buddy group (`docs/design-mirror.md`): members are target ids
/// (storage) or metadata node ids (meta).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GroupRecord {
    pub id: BuddyGroupId,
    pub kind: GroupKind,
    pub primary: u32,
    pub secondary: u32,
    pub epoch: u64,
    #[serde(default)]
    pub primary_state: Consistency,
    #[serde(default)]
    pub secondary_state: Consistency,
    /// A metadata group: the namespace it mirrors (the metadata node id
    /// its entries name as owner; its first primary).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serves: Option<NodeId>,
}

impl GroupRecord {
    pub fn has(&self, member: u32) -> bool {
        self.primary == member || self.secondary == member
    }

    /// The other member of the group.
    pub fn buddy_of(&self, member: u32) -> Option<u32> {
        if self.primary == member {
            Some(self.secondary)
        } else if self.secondary == member {
            Some(self.primary)
        } else {
            None
        }
    }

    /// Swaps the roles: the secondary becomes primary, the old primary
    /// secondary in `needs-resync`, and the epoch moves on.
    pub fn switch_over(&mut self) {
        std::mem::swap(&mut self.primary, &mut self.secondary);
        self.primary_state = self.secondary_state;
        self.secondary_state = Consistency::NeedsResync;
        self.epoch += 1;
    }
}

fn first_created_pool_id() -> u16 {
    FIRST_CREATED_POOL_ID
}

/// What a registry has before any pool was created, and what a registry
/// written before storage pools existed loads as.
fn default_pools() -> Vec<PoolRecord> {
    vec![PoolRecord { id: PoolId::DEFAULT, name: DEFAULT_POOL_NAME.to_string() }]
}

impl Default for NextIds {
    fn default() -> Self {
        NextIds { meta: 1, storage: 1, client: 1, target: 1, pool: FIRST_CREATED_POOL_ID, group: 1 }
    }
}

impl NextIds {
    fn slot(&mut self, t: NodeType) -> Option<&mut u32> {
        match t {
            NodeType::Meta => Some(&mut self.meta),
            NodeType::Storage => Some(&mut self.storage),
            NodeType::Client => Some(&mut self.client),
            NodeType::Mgmt => None,
        }
    }

    fn get(&self, t: NodeType) -> Option<u32> {
        match t {
            NodeType::Meta => Some(self.meta),
            NodeType::Storage => Some(self.storage),
            NodeType::Client => Some(self.client),
            NodeType::Mgmt => None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Registry {
    pub format_version: u32,
    /// The first metadata node ever registered; fixed forever once set.
    pub root_owner: Option<NodeId>,
    pub next_ids: NextIds,
    #[serde(default)]
    pub nodes: Vec<NodeRecord>,
    #[serde(default)]
    pub targets: Vec<TargetRecord>,
    /// Sorted by id (ids are assigned in increasing order and never removed).
    #[serde(default = "default_pools")]
    pub pools: Vec<PoolRecord>,
    #[serde(default)]
    pub groups: Vec<GroupRecord>,
    /// Sorted by (kind, id).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub quotas: Vec<QuotaRecord>,
}

/// The limits of one user or group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QuotaRecord {
    pub kind: QuotaKind,
    pub id: u32,
    /// Limits on the regular files in this storage pool; absent: on everything.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<PoolId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inodes: Option<u64>,
}

impl QuotaRecord {
    pub fn limit(&self) -> QuotaLimit {
        QuotaLimit {
            who: QuotaId { kind: self.kind, id: self.id },
            pool: self.pool,
            bytes: self.bytes,
            inodes: self.inodes,
        }
    }

    fn key(&self) -> (QuotaKind, u32, Option<PoolId>) {
        (self.kind, self.id, self.pool)
    }
}

impl Default for Registry {
    fn default() -> Self {
        Registry {
            format_version: FORMAT_VERSION,
            root_owner: None,
            next_ids: NextIds::default(),
            nodes: Vec::new(),
            targets: Vec::new(),
            pools: default_pools(),
            groups: Vec::new(),
            quotas: Vec::new(),
        }
    }
}

fn check_text(what: &str, s: &str, max: usize) -> Result<(), FsError> {
    if s.is_empty() {
        return Err(fs_err!(Invalid, "{what} is empty"));
    }
    if s.len() > max {
        return Err(fs_err!(Invalid, "{what} is {} bytes long (at most {max})", s.len()));
    }
    if s.chars().any(char::is_control) {
        return Err(fs_err!(Invalid, "{what} {s:?} contains control characters"));
    }
    Ok(())
}

fn member_name(kind: GroupKind) -> &'static str {
    match kind {
        GroupKind::Storage => "storage target",
        GroupKind::Meta => "metadata node",
    }
}

/// A storage pool name is 1 to [`POOL_NAME_LEN_MAX`] characters of
/// `[A-Za-z0-9._-]`: safe in paths, TOML, command lines and log lines.
pub fn check_pool_name(name: &str) -> Result<(), FsError> {
    let ok = !name.is_empty()
        && name.len() <= POOL_NAME_LEN_MAX
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        return Ok(());
    }
    // Quote (escaped) at most a bounded prefix of what the peer sent.
    let shown: String = name.chars().take(POOL_NAME_LEN_MAX + 1).collect();
    let shown =
        if shown.len() < name.len() { format!("{shown:?}… ({} bytes)", name.len()) } else { format!("{shown:?}") };
    let rule = "A-Z, a-z, 0-9, '.', '_' and '-'";
    Err(fs_err!(
        Invalid,
        "storage pool name {shown} is invalid: a name is 1 to {POOL_NAME_LEN_MAX} characters of {rule}"
    ))
}

impl Registry {
    /// Sets the limits of one user or group; both `None` removes them.
    /// Returns whether anything changed.
    pub fn set_quota(&mut self, l: QuotaLimit) -> Result<bool, FsError> {
        if l.inodes == Some(0) || l.bytes == Some(0) {
            return Err(fs_err!(Invalid, "a quota limit of 0 allows nothing; to remove a limit, leave it unset"));
        }
        if let Some(p) = l.pool {
            if self.pool(p).is_none() {
                return Err(fs_err!(NotFound, "storage pool {p} does not exist"));
            }
        }
        let rec = QuotaRecord { kind: l.who.kind, id: l.who.id, pool: l.pool, bytes: l.bytes, inodes: l.inodes };
        let at = self.quotas.binary_search_by_key(&rec.key(), QuotaRecord::key);
        match (at, l.bytes.is_none() && l.inodes.is_none()) {
            (Ok(i), true) => {
                self.quotas.remove(i);
            }
            (Ok(i), false) if self.quotas[i] == rec => return Ok(false),
            (Ok(i), false) => self.quotas[i] = rec,
            (Err(_), true) => return Ok(false),
            (Err(i), false) => self.quotas.insert(i, rec),
        }
        Ok(true)
    }

    pub fn node(&self, node_type: NodeType, id: NodeId) -> Option<&NodeRecord> {
        self.nodes.iter().find(|n| n.node_type == node_type && n.id == id)
    }

    pub fn target(&self, id: TargetId) -> Option<&TargetRecord> {
        self.targets.iter().find(|t| t.id == id)
    }

    pub fn pool(&self, id: PoolId) -> Option<&PoolRecord> {
        self.pools.iter().find(|p| p.id == id)
    }

    /// Creates a storage pool named `name` and returns its id (2, 3, …;
    /// never reused). Names are unique (compared exactly, case included).
    pub fn create_pool(&mut self, name: &str) -> Result<PoolId, FsError> {
        check_pool_name(name)?;
        if let Some(p) = self.pools.iter().find(|p| p.name == name) {
            return Err(fs_err!(Exists, "storage pool \"{name}\" already exists (id {})", p.id));
        }
        if self.pools.len() >= POOLS_MAX {
            return Err(fs_err!(NoSpace, "registry is full ({POOLS_MAX} storage pools)"));
        }
        let id = PoolId(self.next_ids.pool);
        self.next_ids.pool =
            self.next_ids.pool.checked_add(1).ok_or_else(|| fs_err!(NoSpace, "storage pool ids are exhausted"))?;
        debug_assert!(self.pools.last().is_none_or(|p| p.id < id), "pool ids increase");
        self.pools.push(PoolRecord { id, name: name.to_string() });
        Ok(id)
    }

    /// Moves `target` into `pool`, and its buddy with it when it is a
    /// member of a storage buddy group (a group's members share a pool).
    /// Returns whether the registry changed (moving a target to the pool it
    /// is in is not an error).
    pub fn move_target_to_pool(&mut self, target: TargetId, pool: PoolId) -> Result<bool, FsError> {
        if self.target(target).is_none() {
            return Err(fs_err!(NotFound, "storage target {target} is not registered"));
        }
        if self.pool(pool).is_none() {
            return Err(fs_err!(NotFound, "storage pool {pool} does not exist"));
        }
        let buddy = self.storage_group_of(target).and_then(|g| g.buddy_of(target.0)).map(TargetId);
        let mut changed = false;
        for t in self.targets.iter_mut().filter(|t| t.id == target || Some(t.id) == buddy) {
            changed |= t.pool != pool;
            t.pool = pool;
        }
        Ok(changed)
    }

    /// The storage pool of a stripe unit: a target's, or a storage group's
    /// (its members share one: the primary's).
    pub fn pool_of_unit(&self, unit: hivefs_types::pattern::StripeUnit) -> Option<PoolId> {
        let target = match unit {
            hivefs_types::pattern::StripeUnit::Target(t) => t,
            hivefs_types::pattern::StripeUnit::Group(g) => TargetId(self.group(g)?.primary),
        };
        Some(self.target(target)?.pool)
    }

    pub fn group(&self, id: BuddyGroupId) -> Option<&GroupRecord> {
        self.groups.iter().find(|g| g.id == id)
    }

    /// The storage buddy group `target` is a member of.
    pub fn storage_group_of(&self, target: TargetId) -> Option<&GroupRecord> {
        self.groups.iter().find(|g| g.kind == GroupKind::Storage && g.has(target.0))
    }

    /// Makes a buddy group of `primary` and `secondary` (targets or
    /// metadata nodes by `kind`): both registered, distinct, in no group of
    /// that kind yet; storage members in one pool and, unless `force`, on
    /// different storage nodes (a group on one server survives no server
    /// failure).
    pub fn create_group(
        &mut self,
        kind: GroupKind,
        primary: u32,
        secondary: u32,
        force: bool,
    ) -> Result<BuddyGroupId, FsError> {
        if primary == secondary {
            return Err(fs_err!(
                Invalid,
                "a buddy group needs two different members ({} {primary} twice)",
                kind.as_str()
            ));
        }
        if kind == GroupKind::Storage {
            for m in [primary, secondary] {
                if let Some(g) = self.groups.iter().find(|g| g.kind == kind && g.has(m)) {
                    return Err(fs_err!(
                        Exists,
                        "{} {m} is already a member of buddy group {}",
                        member_name(kind),
                        g.id
                    ));
                }
            }
        }
        let mut serves = None;
        match kind {
            GroupKind::Storage => {
                let get = |m: u32| {
                    self.target(TargetId(m)).ok_or_else(|| fs_err!(NotFound, "storage target {m} is not registered"))
                };
                let (p, s) = (get(primary)?, get(secondary)?);
                if p.pool != s.pool {
                    return Err(fs_err!(
                        Invalid,
                        "targets {primary} (pool {}) and {secondary} (pool {}) are in different storage pools; \
                         move one first",
                        p.pool,
                        s.pool
                    ));
                }
                if p.node == s.node && !force {
                    return Err(fs_err!(
                        Invalid,
                        "targets {primary} and {secondary} are both on storage node {}: such a group survives no \
                         server failure (force it to make it anyway)",
                        p.node
                    ));
                }
            }
            GroupKind::Meta => {
                // A group mirrors the namespace of its primary (the node id
                // its entries name as owner); a node may also hold copies of
                // other nodes' namespaces as their secondary.
                let mut hosts = Vec::new();
                for m in [primary, secondary] {
                    match self.node(NodeType::Meta, NodeId(m)) {
                        Some(n) => hosts.push(n.hostname.clone()),
                        None => return Err(fs_err!(NotFound, "metadata node {m} is not registered")),
                    }
                }
                if let Some(g) = self.groups.iter().find(|g| g.serves == Some(NodeId(primary))) {
                    return Err(fs_err!(
                        Exists,
                        "the namespace of metadata node {primary} is already mirrored by buddy group {}",
                        g.id
                    ));
                }
                if hosts[0] == hosts[1] && !force {
                    return Err(fs_err!(
                        Invalid,
                        "metadata nodes {primary} and {secondary} are both on host {}: such a group survives no \
                         server failure (force it to make it anyway)",
                        hosts[0]
                    ));
                }
                serves = Some(NodeId(primary));
            }
        }
        if self.groups.len() >= GROUPS_MAX {
            return Err(fs_err!(NoSpace, "registry is full ({GROUPS_MAX} buddy groups)"));
        }
        let id = BuddyGroupId(self.next_ids.group);
        self.next_ids.group =
            self.next_ids.group.checked_add(1).ok_or_else(|| fs_err!(NoSpace, "buddy group ids are exhausted"))?;
        self.groups.push(GroupRecord {
            id,
            kind,
            primary,
            secondary,
            epoch: 0,
            primary_state: Consistency::Good,
            // A new metadata secondary holds nothing of the namespace yet.
            secondary_state: if kind == GroupKind::Meta { Consistency::NeedsResync } else { Consistency::Good },
            serves,
        });
        Ok(id)
    }

    /// Registers a node, or re-registers a known uuid (same id, address and
    /// hostname updated). Returns the id and whether the registry changed.
    pub fn register_node(
        &mut self,
        node_type: NodeType,
        uuid: &str,
        addr: &str,
        hostname: &str,
    ) -> Result<(NodeId, bool), FsError> {
        check_text("node uuid", uuid, UUID_LEN_MAX)?;
        check_text("node address", addr, ADDR_LEN_MAX)?;
        check_text("node hostname", hostname, HOSTNAME_LEN_MAX)?;
        if node_type == NodeType::Mgmt {
            return Err(fs_err!(Invalid, "mgmt nodes do not register with mgmtd (uuid {uuid})"));
        }
        if let Some(n) = self.nodes.iter_mut().find(|n| n.uuid == uuid) {
            if n.node_type != node_type {
                return Err(fs_err!(
                    Invalid,
                    "uuid {uuid} is registered as {} node {}, not as a {node_type} node",
                    n.node_type,
                    n.id
                ));
            }
            let changed = n.addr != addr || n.hostname != hostname;
            n.addr = addr.to_string();
            n.hostname = hostname.to_string();
            return Ok((n.id, changed));
        }
        if self.nodes.len() >= NODES_MAX {
            return Err(fs_err!(NoSpace, "registry is full ({NODES_MAX} nodes)"));
        }
        let slot = self.next_ids.slot(node_type).expect("mgmt nodes were refused above");
        let id = NodeId(*slot);
        if node_type == NodeType::Meta && id.0 > EntryId::MAX_NODE {
            // A metadata node's id is part of the ids (and inode numbers) it mints.
            return Err(fs_err!(NoSpace, "metadata node ids are exhausted ({} at most)", EntryId::MAX_NODE));
        }
        *slot = slot.checked_add(1).ok_or_else(|| fs_err!(NoSpace, "{node_type} node ids are exhausted"))?;
        self.nodes.push(NodeRecord {
            node_type,
            id,
            uuid: uuid.to_string(),
            addr: addr.to_string(),
            hostname: hostname.to_string(),
        });
        if node_type == NodeType::Meta && self.root_owner.is_none() {
            self.root_owner = Some(id);
        }
        Ok((id, true))
    }

    /// Registers a storage target of storage node `node` by its uuid, or
    /// returns the id a known uuid already has. Returns the id, its pool and
    /// whether the registry changed.
    pub fn register_target(&mut self, node: NodeId, uuid: &str) -> Result<(TargetId, PoolId, bool), FsError> {
        check_text("target uuid", uuid, UUID_LEN_MAX)?;
        if self.node(NodeType::Storage, node).is_none() {
            return Err(fs_err!(NotFound, "storage node {node} is not registered (target uuid {uuid})"));
        }
        if let Some(t) = self.targets.iter().find(|t| t.uuid == uuid) {
            if t.node != node {
                return Err(fs_err!(
                    Invalid,
                    "target uuid {uuid} is registered as target {} of storage node {}, not of storage node {node}",
                    t.id,
                    t.node
                ));
            }
            return Ok((t.id, t.pool, false));
        }
        if self.targets.len() >= TARGETS_MAX {
            return Err(fs_err!(NoSpace, "registry is full ({TARGETS_MAX} targets)"));
        }
        let id = TargetId(self.next_ids.target);
        self.next_ids.target =
            self.next_ids.target.checked_add(1).ok_or_else(|| fs_err!(NoSpace, "target ids are exhausted"))?;
        let pool = PoolId::DEFAULT;
        self.targets.push(TargetRecord { id, uuid: uuid.to_string(), node, pool });
        Ok((id, pool, true))
    }

    /// Checks the invariants a loaded registry must satisfy.
    pub fn validate(&self) -> Result<(), String> {
        if self.format_version != FORMAT_VERSION {
            return Err(format!(
                "format_version {} is not supported (this mgmtd reads version {FORMAT_VERSION})",
                self.format_version
            ));
        }
        if let Some(w) = self.quotas.windows(2).find(|w| w[0].key() >= w[1].key()) {
            return Err(format!(
                "quotas are not sorted by kind, id and pool, or name {:?} {} twice",
                w[1].kind, w[1].id
            ));
        }
        let mut uuids = HashSet::new();
        let mut ids = HashSet::new();
        for n in &self.nodes {
            let next = self.next_ids.get(n.node_type).ok_or_else(|| format!("node {} has type mgmt", n.uuid))?;
            if n.id.0 == 0 || n.id.0 >= next {
                return Err(format!("{} node {} has an id outside 1..{next}", n.node_type, n.id));
            }
            if !uuids.insert(n.uuid.as_str()) {
                return Err(format!("node uuid {} appears twice", n.uuid));
            }
            if !ids.insert((n.node_type, n.id)) {
                return Err(format!("{} node id {} appears twice", n.node_type, n.id));
            }
        }
        let mut tuuids = HashSet::new();
        let mut tids = HashSet::new();
        for t in &self.targets {
            if t.id.0 == 0 || t.id.0 >= self.next_ids.target {
                return Err(format!("target {} has an id outside 1..{}", t.id, self.next_ids.target));
            }
            if !tuuids.insert(t.uuid.as_str()) {
                return Err(format!("target uuid {} appears twice", t.uuid));
            }
            if !tids.insert(t.id) {
                return Err(format!("target id {} appears twice", t.id));
            }
            if self.node(NodeType::Storage, t.node).is_none() {
                return Err(format!("target {} belongs to storage node {}, which is not registered", t.id, t.node));
            }
        }
        let mut pids = HashSet::new();
        let mut pnames = HashSet::new();
        if self.next_ids.pool < FIRST_CREATED_POOL_ID {
            return Err(format!("next storage pool id {} is below {FIRST_CREATED_POOL_ID}", self.next_ids.pool));
        }
        for p in &self.pools {
            if p.id.0 == 0 || p.id.0 >= self.next_ids.pool {
                return Err(format!("storage pool {} has an id outside 1..{}", p.id, self.next_ids.pool));
            }
            check_pool_name(&p.name).map_err(|e| format!("storage pool {}: {}", p.id, e.message))?;
            if !pids.insert(p.id) {
                return Err(format!("storage pool id {} appears twice", p.id));
            }
            if !pnames.insert(p.name.as_str()) {
                return Err(format!("storage pool name \"{}\" appears twice", p.name));
            }
        }
        if !self.pools.is_sorted_by_key(|p| p.id) {
            return Err("storage pools are not sorted by id".to_string());
        }
        match self.pool(PoolId::DEFAULT) {
            Some(p) if p.name == DEFAULT_POOL_NAME => {}
            Some(p) => {
                return Err(format!(
                    "the default storage pool {} is named \"{}\", not \"{DEFAULT_POOL_NAME}\"",
                    p.id, p.name
                ))
            }
            None => return Err(format!("the default storage pool {} is missing", PoolId::DEFAULT)),
        }
        let mut gids = HashSet::new();
        let mut served = HashSet::new();
        let mut members = HashSet::new();
        for g in &self.groups {
            if g.id.0 == 0 || g.id.0 >= self.next_ids.group {
                return Err(format!("buddy group {} has an id outside 1..{}", g.id, self.next_ids.group));
            }
            if !gids.insert(g.id) {
                return Err(format!("buddy group id {} appears twice", g.id));
            }
            if g.primary == g.secondary {
                return Err(format!("buddy group {} has {} twice", g.id, g.primary));
            }
            if (g.kind == GroupKind::Meta) != g.serves.is_some() {
                return Err(format!("buddy group {}: only a metadata group names the namespace it serves", g.id));
            }
            if let Some(n) = g.serves {
                if !served.insert(n) {
                    return Err(format!("the namespace of metadata node {n} is mirrored by two buddy groups"));
                }
            }
            for m in [g.primary, g.secondary] {
                if g.kind == GroupKind::Storage && !members.insert((g.kind, m)) {
                    return Err(format!("{} {m} is in two buddy groups", member_name(g.kind)));
                }
                let known = match g.kind {
                    GroupKind::Storage => self.target(TargetId(m)).is_some(),
                    GroupKind::Meta => self.node(NodeType::Meta, NodeId(m)).is_some(),
                };
                if !known {
                    return Err(format!("buddy group {}: {} {m} is not registered", g.id, member_name(g.kind)));
                }
            }
        }
        for t in &self.targets {
            if self.pool(t.pool).is_none() {
                return Err(format!("target {} is in storage pool {}, which does not exist", t.id, t.pool));
            }
        }
        if let Some(r) = self.root_owner {
            if self.node(NodeType::Meta, r).is_none() {
                return Err(format!("root owner is meta node {r}, which is not registered"));
            }
        }
        Ok(())
    }

    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("the registry serialises to TOML")
    }

    pub fn from_toml(s: &str) -> Result<Registry, String> {
        let r: Registry = toml::from_str(s).map_err(|e| e.to_string())?;
        r.validate()?;
        Ok(r)
    }

    /// Loads `path`; `Ok(None)` if it does not exist.
    pub fn load(path: &Path) -> Result<Option<Registry>, crate::MgmtError> {
        match std::fs::read_to_string(path) {
            Ok(s) => Registry::from_toml(&s)
                .map(Some)
                .map_err(|reason| crate::MgmtError::CorruptRegistry { path: path.to_path_buf(), reason }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(crate::MgmtError::Io { path: path.to_path_buf(), source }),
        }
    }

    pub fn save(&self, path: &Path) -> Result<(), FsError> {
        debug_assert_eq!(self.validate(), Ok(()));
        hivefs_cluster::write_atomic(path, self.to_toml().as_bytes())
            .map_err(|e| FsError::new(ErrorCode::Io, format!("cannot write registry {}: {e}", path.display())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_ids_start_at_one_per_type_and_are_stable_per_uuid() {
        let mut r = Registry::default();
        assert_eq!(r.register_node(NodeType::Storage, "s1", "a:1", "h").unwrap(), (NodeId(1), true));
        assert_eq!(r.register_node(NodeType::Meta, "m1", "a:2", "h").unwrap(), (NodeId(1), true));
        assert_eq!(r.register_node(NodeType::Storage, "s2", "a:3", "h").unwrap(), (NodeId(2), true));
        // Same uuid, same address: same id, nothing to persist.
        assert_eq!(r.register_node(NodeType::Storage, "s1", "a:1", "h").unwrap(), (NodeId(1), false));
        // Same uuid, new address: same id, address updated.
        assert_eq!(r.register_node(NodeType::Storage, "s1", "b:1", "h2").unwrap(), (NodeId(1), true));
        let n = r.node(NodeType::Storage, NodeId(1)).unwrap();
        assert_eq!((n.addr.as_str(), n.hostname.as_str()), ("b:1", "h2"));
        assert_eq!(r.validate(), Ok(()));
    }

    #[test]
    fn uuid_cannot_change_type_and_mgmt_cannot_register() {
        let mut r = Registry::default();
        r.register_node(NodeType::Meta, "u", "a:1", "h").unwrap();
        let e = r.register_node(NodeType::Storage, "u", "a:1", "h").unwrap_err();
        assert_eq!(e.code, ErrorCode::Invalid);
        assert!(e.message.contains("meta node 1"), "{e}");
        assert_eq!(r.register_node(NodeType::Mgmt, "x", "a:1", "h").unwrap_err().code, ErrorCode::Invalid);
        assert_eq!(r.register_node(NodeType::Meta, "", "a:1", "h").unwrap_err().code, ErrorCode::Invalid);
        let long = "x".repeat(UUID_LEN_MAX + 1);
        assert_eq!(r.register_node(NodeType::Meta, &long, "a:1", "h").unwrap_err().code, ErrorCode::Invalid);
    }

    #[test]
    fn root_owner_is_the_first_meta_node_forever() {
        let mut r = Registry::default();
        r.register_node(NodeType::Storage, "s", "a:1", "h").unwrap();
        assert_eq!(r.root_owner, None);
        r.register_node(NodeType::Meta, "m1", "a:2", "h").unwrap();
        r.register_node(NodeType::Meta, "m2", "a:3", "h").unwrap();
        r.register_node(NodeType::Meta, "m1", "a:9", "h").unwrap();
        assert_eq!(r.root_owner, Some(NodeId(1)));
    }

    #[test]
    fn targets_keep_their_ids_and_their_node() {
        let mut r = Registry::default();
        let e = r.register_target(NodeId(1), "t1").unwrap_err();
        assert_eq!(e.code, ErrorCode::NotFound);
        r.register_node(NodeType::Storage, "s1", "a:1", "h").unwrap();
        r.register_node(NodeType::Storage, "s2", "a:2", "h").unwrap();
        // A meta node with id 3 does not make storage node 3 exist.
        r.register_node(NodeType::Meta, "m1", "a:3", "h").unwrap();
        assert_eq!(r.register_target(NodeId(3), "t").unwrap_err().code, ErrorCode::NotFound);
        assert_eq!(r.register_target(NodeId(1), "t1").unwrap(), (TargetId(1), PoolId::DEFAULT, true));
        assert_eq!(r.register_target(NodeId(2), "t2").unwrap(), (TargetId(2), PoolId::DEFAULT, true));
        assert_eq!(r.register_target(NodeId(1), "t1").unwrap(), (TargetId(1), PoolId::DEFAULT, false));
        let e = r.register_target(NodeId(2), "t1").unwrap_err();
        assert_eq!(e.code, ErrorCode::Invalid);
        assert!(e.message.contains("storage node 1") && e.message.contains("storage node 2"), "{e}");
        assert_eq!(r.validate(), Ok(()));
    }

    #[test]
    fn toml_round_trip_and_validation() {
        let mut r = Registry::default();
        assert_eq!(Registry::from_toml(&r.to_toml()).unwrap(), r);
        r.register_node(NodeType::Meta, "m1", "a:2", "h").unwrap();
        r.register_node(NodeType::Storage, "s1", "a:1", "h").unwrap();
        r.register_target(NodeId(1), "t1").unwrap();
        let text = r.to_toml();
        assert_eq!(Registry::from_toml(&text).unwrap(), r);

        let mut bad = r.clone();
        bad.next_ids.target = 1;
        assert!(bad.validate().unwrap_err().contains("target 1"));
        let mut bad = r.clone();
        bad.nodes.push(bad.nodes[0].clone());
        assert!(bad.validate().is_err());
        let mut bad = r.clone();
        bad.targets[0].node = NodeId(7);
        assert!(bad.validate().unwrap_err().contains("storage node 7"));
        assert!(Registry::from_toml("format_version = 2\n[next_ids]\nmeta=1\nstorage=1\nclient=1\ntarget=1\n")
            .unwrap_err()
            .contains("format_version 2"));
        assert!(Registry::from_toml("garbage").is_err());
    }

    /// A registry with storage nodes 1 and 2 and targets 1 (node 1), 2 (node 2), 3 (node 1).
    fn with_targets() -> Registry {
        let mut r = Registry::default();
        r.register_node(NodeType::Storage, "s1", "a:1", "h").unwrap();
        r.register_node(NodeType::Storage, "s2", "a:2", "h").unwrap();
        for (node, uuid) in [(1, "t1"), (2, "t2"), (1, "t3")] {
            r.register_target(NodeId(node), uuid).unwrap();
        }
        r
    }

    #[test]
    fn default_pool_exists_and_created_pools_get_increasing_ids() {
        let mut r = Registry::default();
        assert_eq!(r.pools, vec![PoolRecord { id: PoolId::DEFAULT, name: "default".into() }]);
        assert_eq!(r.create_pool("ssd").unwrap(), PoolId(2));
        assert_eq!(r.create_pool("hdd").unwrap(), PoolId(3));
        assert_eq!(r.create_pool("a.B_c-9").unwrap(), PoolId(4));
        assert_eq!(r.create_pool(&"x".repeat(POOL_NAME_LEN_MAX)).unwrap(), PoolId(5));
        assert_eq!(r.next_ids.pool, 6);
        assert_eq!(r.pool(PoolId(3)).unwrap().name, "hdd");
        assert_eq!(r.validate(), Ok(()));
    }

    #[test]
    fn pool_names_are_unique_and_follow_the_rule() {
        let mut r = Registry::default();
        r.create_pool("ssd").unwrap();
        let e = r.create_pool("ssd").unwrap_err();
        assert_eq!((e.code, e.message.as_str()), (ErrorCode::Exists, "storage pool \"ssd\" already exists (id 2)"));
        let e = r.create_pool("default").unwrap_err();
        assert_eq!((e.code, e.message.as_str()), (ErrorCode::Exists, "storage pool \"default\" already exists (id 1)"));
        // Names compare exactly: another case is another name.
        assert_eq!(r.create_pool("SSD").unwrap(), PoolId(3));
        let too_long = "y".repeat(POOL_NAME_LEN_MAX + 1);
        for bad in ["", "a b", "a/b", "tab\t", "ü", "x:y", too_long.as_str()] {
            let e = r.create_pool(bad).unwrap_err();
            assert_eq!(e.code, ErrorCode::Invalid, "{bad:?}");
            assert!(e.message.contains(&format!("{bad:?}")), "{bad:?}: {e}");
            assert!(e.message.contains("1 to 64 characters of A-Z, a-z, 0-9, '.', '_' and '-'"), "{e}");
        }
        // A huge name is quoted only in part.
        let huge = "z".repeat(100_000);
        let e = r.create_pool(&huge).unwrap_err();
        assert!(e.message.len() < 400 && e.message.contains("(100000 bytes)"), "{e}");
        // Refusals change nothing.
        assert_eq!(r.next_ids.pool, 4);
        assert_eq!(r.pools.len(), 3);
    }

    #[test]
    fn pool_count_is_bounded() {
        let mut r = Registry::default();
        for i in 1..POOLS_MAX {
            r.create_pool(&format!("p{i}")).unwrap();
        }
        let e = r.create_pool("one-more").unwrap_err();
        assert_eq!(e.code, ErrorCode::NoSpace, "{e}");
        assert_eq!(r.validate(), Ok(()));
    }

    #[test]
    fn targets_move_between_existing_pools() {
        let mut r = with_targets();
        assert!(r.targets.iter().all(|t| t.pool == PoolId::DEFAULT));
        let ssd = r.create_pool("ssd").unwrap();
        assert_eq!(r.move_target_to_pool(TargetId(2), ssd), Ok(true));
        assert_eq!(r.target(TargetId(2)).unwrap().pool, ssd);
        // Moving to the current pool is fine and changes nothing.
        assert_eq!(r.move_target_to_pool(TargetId(2), ssd), Ok(false));
        assert_eq!(r.move_target_to_pool(TargetId(1), PoolId::DEFAULT), Ok(false));

        let e = r.move_target_to_pool(TargetId(9), ssd).unwrap_err();
        assert_eq!((e.code, e.message.as_str()), (ErrorCode::NotFound, "storage target 9 is not registered"));
        let e = r.move_target_to_pool(TargetId(1), PoolId(7)).unwrap_err();
        assert_eq!((e.code, e.message.as_str()), (ErrorCode::NotFound, "storage pool 7 does not exist"));
        assert_eq!(r.target(TargetId(1)).unwrap().pool, PoolId::DEFAULT);

        // Back to the default pool; a re-registration keeps the pool.
        assert_eq!(r.move_target_to_pool(TargetId(2), PoolId::DEFAULT), Ok(true));
        assert_eq!(r.move_target_to_pool(TargetId(3), ssd), Ok(true));
        assert_eq!(r.register_target(NodeId(1), "t3").unwrap(), (TargetId(3), ssd, false));
        // A new target joins the default pool whatever the others are in.
        assert_eq!(r.register_target(NodeId(2), "t4").unwrap(), (TargetId(4), PoolId::DEFAULT, true));
        assert_eq!(r.validate(), Ok(()));
    }

    #[test]
    fn pools_round_trip_through_toml() {
        let mut r = with_targets();
        let ssd = r.create_pool("ssd").unwrap();
        let hdd = r.create_pool("hdd").unwrap();
        r.move_target_to_pool(TargetId(1), ssd).unwrap();
        r.move_target_to_pool(TargetId(3), hdd).unwrap();
        let back = Registry::from_toml(&r.to_toml()).unwrap();
        assert_eq!(back, r);
        assert_eq!(back.next_ids.pool, 4);
    }

    #[test]
    fn registry_written_before_storage_pools_loads() {
        // Exactly what the mgmtd before storage pools wrote.
        let old = r#"format_version = 1
root_owner = 1

[next_ids]
meta = 2
storage = 2
client = 1
target = 3

[[nodes]]
node_type = "Meta"
id = 1
uuid = "m"
addr = "127.0.0.1:8005"
hostname = "h"

[[nodes]]
node_type = "Storage"
id = 1
uuid = "s"
addr = "127.0.0.1:8003"
hostname = "h"

[[targets]]
id = 1
uuid = "t1"
node = 1
pool = 1

[[targets]]
id = 2
uuid = "t2"
node = 1
pool = 1
"#;
        let mut r = Registry::from_toml(old).unwrap();
        assert_eq!(r.pools, default_pools());
        assert_eq!(r.next_ids.pool, FIRST_CREATED_POOL_ID);
        assert_eq!(r.targets.len(), 2);
        assert_eq!(r.create_pool("ssd").unwrap(), PoolId(2));
        assert_eq!(r.move_target_to_pool(TargetId(2), PoolId(2)), Ok(true));
        assert_eq!(Registry::from_toml(&r.to_toml()).unwrap(), r);
    }

    #[test]
    fn pool_invariants_are_checked_on_load() {
        let mut r = with_targets();
        r.create_pool("ssd").unwrap();
        r.move_target_to_pool(TargetId(1), PoolId(2)).unwrap();
        assert_eq!(r.validate(), Ok(()));

        let mut bad = r.clone();
        bad.targets[1].pool = PoolId(9);
        assert_eq!(bad.validate().unwrap_err(), "target 2 is in storage pool 9, which does not exist");
        // The pool a target is in cannot disappear.
        let mut bad = r.clone();
        bad.pools.retain(|p| p.id != PoolId(2));
        bad.next_ids.pool = 3;
        assert!(bad.validate().unwrap_err().contains("storage pool 2, which does not exist"));
        let mut bad = r.clone();
        bad.pools.remove(0);
        assert!(bad.validate().unwrap_err().contains("default storage pool 1 is missing"));
        let mut bad = r.clone();
        bad.pools[0].name = "main".into();
        assert!(bad.validate().unwrap_err().contains("is named \"main\""));
        let mut bad = r.clone();
        bad.pools[1].name = "default".into();
        assert!(bad.validate().unwrap_err().contains("\"default\" appears twice"));
        let mut bad = r.clone();
        bad.pools[1].name = "no spaces".into();
        assert!(bad.validate().unwrap_err().contains("storage pool 2: storage pool name \"no spaces\" is invalid"));
        let mut bad = r.clone();
        bad.next_ids.pool = 2;
        assert!(bad.validate().unwrap_err().contains("storage pool 2 has an id outside 1..2"));
        let mut bad = r.clone();
        bad.next_ids.pool = 1;
        assert!(bad.validate().unwrap_err().contains("below 2"));
        let mut bad = r.clone();
        bad.pools.swap(0, 1);
        assert!(bad.validate().unwrap_err().contains("not sorted"));

        // An explicit empty list is not an old registry: the default pool is missing.
        let text = r.to_toml();
        let cut = text.find("[[pools]]").unwrap();
        let no_pools = format!("pools = []\n{}", &text[..cut]);
        let e = Registry::from_toml(&no_pools).unwrap_err();
        assert!(e.contains("default storage pool 1 is missing") || e.contains("storage pool 2"), "{e}");
        assert!(Registry::from_toml(&format!("{text}\n[[pools]]\nid = 3\nname = \"x\"\ncolor = 1\n")).is_err());
    }
}
