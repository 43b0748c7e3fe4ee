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
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
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

/// Bits of the node id in an inode number (see [`EntryId::ino`]).
const INO_NODE_BITS: u32 = 15;
/// Bits of the epoch in an inode number.
const INO_EPOCH_BITS: u32 = 24;
/// Bits of the counter in an inode number.
const INO_COUNTER_BITS: u32 = 24;

/// FNV-1a, 64 bits: stable across versions and platforms.
fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
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

    /// Highest node id that mints entry ids: mgmtd assigns metadata node ids
    /// up to this, so every minted id has an inode number of its own.
    pub const MAX_NODE: u32 = (1 << INO_NODE_BITS) - 1;
    /// Highest epoch a metadata node mints with (see [`EntryId::ino`]).
    pub const MAX_EPOCH: u32 = (1 << INO_EPOCH_BITS) - 1;
    /// Highest counter minted in one epoch: the minting node moves to the next
    /// epoch (and persists it) before it would go beyond.
    pub const MAX_COUNTER: u64 = (1 << INO_COUNTER_BITS) - 1;

    /// Whether the id lies in the space [`EntryId::ino`] maps one-to-one.
    pub fn has_exact_ino(&self) -> bool {
        self.is_root()
            || ((1..=Self::MAX_NODE).contains(&self.node)
                && self.epoch <= Self::MAX_EPOCH
                && (1..=Self::MAX_COUNTER).contains(&self.counter))
    }

    /// The inode number clients show for this entry (`st_ino`, `d_ino`), a
    /// pure function of the id: the same on every client, after every
    /// restart, and across renames to other metadata nodes (the id moves with
    /// the inode).
    ///
    /// Layout: `0 | node (15 bits) | epoch (24) | counter (24)`. The root is
    /// 1; every other minted id has node >= 1, so its number is >= 2^48 and
    /// never 0 or 1. Inside the bounds the map is one-to-one (and
    /// [`EntryId::from_ino`] inverts it), and the metadata nodes mint only
    /// inside them. Ids outside (none are minted; a store written before
    /// these bounds could hold some) get a 63-bit hash with the top bit set,
    /// which cannot meet an exact number; among themselves they could
    /// collide, which the mount detects.
    pub fn ino(&self) -> u64 {
        if self.is_root() {
            return 1;
        }
        if self.has_exact_ino() {
            (u64::from(self.node) << (INO_EPOCH_BITS + INO_COUNTER_BITS))
                | (u64::from(self.epoch) << INO_COUNTER_BITS)
                | self.counter
        } else {
            (1 << 63) | (fnv1a64(&self.to_bytes()) & !(1 << 63))
        }
    }

    /// The id whose [`EntryId::ino`] is `ino`, for numbers of the exact space
    /// (`None` for 0, hashed numbers and numbers no id maps to).
    pub fn from_ino(ino: u64) -> Option<EntryId> {
        if ino == 1 {
            return Some(Self::ROOT);
        }
        if ino >> 63 != 0 {
            return None;
        }
        let id = EntryId {
            node: (ino >> (INO_EPOCH_BITS + INO_COUNTER_BITS)) as u32,
            epoch: ((ino >> INO_COUNTER_BITS) & u64::from(Self::MAX_EPOCH)) as u32,
            counter: ino & Self::MAX_COUNTER,
        };
        (id.has_exact_ino() && !id.is_root()).then_some(id)
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
    fn inode_numbers_of_minted_ids_round_trip() {
        assert_eq!(EntryId::ROOT.ino(), 1);
        assert_eq!(EntryId::from_ino(1), Some(EntryId::ROOT));
        let first = EntryId { node: 1, epoch: 0, counter: 1 };
        assert_eq!(first.ino(), (1 << 48) | 1);
        let last = EntryId { node: EntryId::MAX_NODE, epoch: EntryId::MAX_EPOCH, counter: EntryId::MAX_COUNTER };
        assert_eq!(last.ino(), (1 << 63) - 1);
        for id in [first, last, EntryId { node: 3, epoch: 17, counter: 99 }] {
            assert!(id.has_exact_ino());
            assert_eq!(EntryId::from_ino(id.ino()), Some(id));
        }
        for ino in [0, 2, 1 << 48, 1 << 63, u64::MAX] {
            assert_eq!(EntryId::from_ino(ino), None, "{ino:#x}");
        }
    }

    #[test]
    fn ids_outside_the_exact_space_get_hashed_numbers() {
        let outside = [
            EntryId { node: 1, epoch: 1, counter: EntryId::MAX_COUNTER + 1 },
            EntryId { node: 1, epoch: EntryId::MAX_EPOCH + 1, counter: 1 },
            EntryId { node: EntryId::MAX_NODE + 1, epoch: 1, counter: 1 },
            EntryId { node: 0, epoch: 0, counter: 2 },
            EntryId { node: 1, epoch: 1, counter: 0 },
        ];
        for id in outside {
            assert!(!id.has_exact_ino());
            assert!(id.ino() >> 63 == 1, "{id}");
            assert_eq!(EntryId::from_ino(id.ino()), None);
        }
    }

    proptest::proptest! {
        #[test]
        fn distinct_minted_ids_have_distinct_inode_numbers(
            a in (1..=EntryId::MAX_NODE, 0..=EntryId::MAX_EPOCH, 1..=EntryId::MAX_COUNTER),
            b in (1..=EntryId::MAX_NODE, 0..=EntryId::MAX_EPOCH, 1..=EntryId::MAX_COUNTER),
        ) {
            let a = EntryId { node: a.0, epoch: a.1, counter: a.2 };
            let b = EntryId { node: b.0, epoch: b.1, counter: b.2 };
            proptest::prop_assert_eq!(a == b, a.ino() == b.ino());
            proptest::prop_assert!(a.ino() > 1);
            proptest::prop_assert_eq!(EntryId::from_ino(a.ino()), Some(a));
        }
    }

    #[test]
    fn byte_order_matches_id_order() {
        let a = EntryId { node: 1, epoch: 9, counter: 5 };
        let b = EntryId { node: 2, epoch: 0, counter: 0 };
        assert!(a < b);
        assert!(a.to_bytes() < b.to_bytes());
    }
}
