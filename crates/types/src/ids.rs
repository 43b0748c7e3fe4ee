//! Identifiers. Numeric ids of nodes, targets and pools are assigned by mgmtd
//! and persisted by the services; entry ids are minted by metadata servers
//! without coordination.

use serde::{Deserialize, Serialize};
use std::fmt;

macro_rules! small_id {
    ($(#[$m:meta])* $name:ident, $int:ty) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default)]
        pub struct $name(pub $int);
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}", self.0)
            }
        }
    };
}

small_id!(
    /// Id of a service node, unique per [`NodeType`]. 0 means "not assigned".
    NodeId,
    u32
);
small_id!(
    /// Id of a storage target, unique in the file system. 0 means "not assigned".
    TargetId,
    u32
);
small_id!(
    /// Id of a storage pool. Pool 1 is the default pool every new target joins.
    PoolId,
    u16
);
small_id!(
    /// Id of a buddy mirror group.
    BuddyGroupId,
    u32
);

impl PoolId {
    pub const DEFAULT: PoolId = PoolId(1);
}

/// The role of a service node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum NodeType {
    Mgmt,
    Meta,
    Storage,
    Client,
}

impl fmt::Display for NodeType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NodeType::Mgmt => "mgmt",
            NodeType::Meta => "meta",
            NodeType::Storage => "storage",
            NodeType::Client => "client",
        })
    }
}

/// Globally unique id of a file or directory.
///
/// Minted by the metadata server that creates the entry: its node id, the
/// server's boot epoch (incremented and persisted at every start) and a
/// per-boot counter. No two servers and no two boots can mint the same id, and
/// no coordination is needed. The root directory has the fixed id
/// [`EntryId::ROOT`].
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct EntryId {
    pub node: u32,
    pub epoch: u32,
    pub counter: u64,
}

impl EntryId {
    pub const ROOT: EntryId = EntryId { node: 0, epoch: 0, counter: 1 };
    pub const LEN: usize = 16;

    pub fn is_root(&self) -> bool {
        *self == Self::ROOT
    }

    /// Big-endian fixed-width encoding: sorts like the id and is used as a key prefix.
    pub fn to_bytes(&self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[0..4].copy_from_slice(&self.node.to_be_bytes());
        b[4..8].copy_from_slice(&self.epoch.to_be_bytes());
        b[8..16].copy_from_slice(&self.counter.to_be_bytes());
        b
    }

    pub fn from_bytes(b: &[u8]) -> Option<EntryId> {
        if b.len() != 16 {
            return None;
        }
        Some(EntryId {
            node: u32::from_be_bytes(b[0..4].try_into().ok()?),
            epoch: u32::from_be_bytes(b[4..8].try_into().ok()?),
            counter: u64::from_be_bytes(b[8..16].try_into().ok()?),
        })
    }

    /// Parses the textual form produced by `Display` (`N-E-C` in hex, or `root`).
    pub fn parse(s: &str) -> Option<EntryId> {
        if s == "root" {
            return Some(Self::ROOT);
        }
        let mut it = s.split('-');
        let node = u32::from_str_radix(it.next()?, 16).ok()?;
        let epoch = u32::from_str_radix(it.next()?, 16).ok()?;
        let counter = u64::from_str_radix(it.next()?, 16).ok()?;
        if it.next().is_some() {
            return None;
        }
        Some(EntryId { node, epoch, counter })
    }

    /// Stable 8-bit hash used to spread chunk files over 256 sub-directories.
    pub fn hash_dir(&self) -> u8 {
        // FNV-1a over the fixed encoding: stable across versions and platforms.
        let mut h: u32 = 0x811c_9dc5;
        for b in self.to_bytes() {
            h ^= u32::from(b);
            h = h.wrapping_mul(0x0100_0193);
        }
        (h ^ (h >> 8) ^ (h >> 16) ^ (h >> 24)) as u8
    }
}

impl fmt::Display for EntryId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_root() {
            return f.write_str("root");
        }
        write!(f, "{:X}-{:X}-{:X}", self.node, self.epoch, self.counter)
    }
}

impl fmt::Debug for EntryId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_id_text_and_bytes_round_trip() {
        let ids = [EntryId::ROOT, EntryId { node: 7, epoch: 3, counter: 0xABCDEF }];
        for id in ids {
            assert_eq!(EntryId::parse(&id.to_string()), Some(id));
            assert_eq!(EntryId::from_bytes(&id.to_bytes()), Some(id));
        }
        assert_eq!(EntryId::parse("1-2"), None);
        assert_eq!(EntryId::parse("1-2-3-4"), None);
        assert_eq!(EntryId::parse("x-2-3"), None);
        assert_eq!(EntryId::from_bytes(&[0u8; 15]), None);
    }

    #[test]
    fn byte_order_matches_id_order() {
        let a = EntryId { node: 1, epoch: 9, counter: 5 };
        let b = EntryId { node: 2, epoch: 0, counter: 0 };
        assert!(a < b);
        assert!(a.to_bytes() < b.to_bytes());
    }
}
