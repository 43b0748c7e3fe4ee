//! The persistent registry: which nodes and targets exist, their ids, and
//! the owner of the root directory.
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
//! pool = 1
//! ```

use hivefs_types::error::{ErrorCode, FsError};
use hivefs_types::fs_err;
use hivefs_types::ids::{NodeId, NodeType, PoolId, TargetId};
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

/// The next id to assign, per kind. Ids are never reused, even if a record
/// were ever removed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NextIds {
    pub meta: u32,
    pub storage: u32,
    pub client: u32,
    pub target: u32,
}

impl Default for NextIds {
    fn default() -> Self {
        NextIds { meta: 1, storage: 1, client: 1, target: 1 }
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
}

impl Default for Registry {
    fn default() -> Self {
        Registry {
            format_version: FORMAT_VERSION,
            root_owner: None,
            next_ids: NextIds::default(),
            nodes: Vec::new(),
            targets: Vec::new(),
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

impl Registry {
    pub fn node(&self, node_type: NodeType, id: NodeId) -> Option<&NodeRecord> {
        self.nodes.iter().find(|n| n.node_type == node_type && n.id == id)
    }

    pub fn target(&self, id: TargetId) -> Option<&TargetRecord> {
        self.targets.iter().find(|t| t.id == id)
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
}
