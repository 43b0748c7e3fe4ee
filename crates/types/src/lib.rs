//! HiveFS vocabulary shared by every crate: identifiers, stripe patterns with
//! their offset mapping, entry attributes, error codes and POSIX ACLs (their
//! xattr format and the rules tying them to the mode).
//!
//! This crate owns pure data and pure arithmetic. It must not do I/O, spawn
//! threads, read clocks or depend on any other HiveFS crate: everything above
//! it (protocol, services, client) builds on these definitions, and the wire
//! format embeds them, so changing a field here is a protocol change.

#![forbid(unsafe_code)]

pub mod acl;
pub mod attr;
pub mod error;
pub mod ids;
pub mod pattern;

pub use attr::{EntryAttr, FileKind, SetAttr, Timespec};
pub use error::{ErrorCode, FsError, FsResult};
pub use ids::{BuddyGroupId, EntryId, NodeId, NodeType, PoolId, TargetId};
pub use pattern::{Chooser, DirPattern, Pattern, PatternKind, Piece, StripeSet, StripeUnit};

/// Longest file name component, in bytes (as Linux's NAME_MAX).
pub const NAME_MAX: usize = 255;
/// Longest symlink target, in bytes (as Linux's PATH_MAX).
pub const PATH_MAX: usize = 4096;
/// Largest extended attribute value (as Linux's XATTR_SIZE_MAX).
pub const XATTR_SIZE_MAX: usize = 65536;
/// Longest extended attribute name (as Linux's XATTR_NAME_MAX).
pub const XATTR_NAME_MAX: usize = 255;
