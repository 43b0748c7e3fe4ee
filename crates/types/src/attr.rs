//! Attributes of namespace entries as they travel between services and clients.

use crate::ids::{EntryId, NodeId};
use crate::pattern::{DirPattern, Pattern};
use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum FileKind {
    File,
    Dir,
    Symlink,
    Fifo,
    Socket,
    CharDev,
    BlockDev,
}

impl FileKind {
    /// The `S_IFMT` bits of this kind.
    pub fn mode_bits(&self) -> u32 {
        match self {
            FileKind::File => 0o100000,
            FileKind::Dir => 0o040000,
            FileKind::Symlink => 0o120000,
            FileKind::Fifo => 0o010000,
            FileKind::Socket => 0o140000,
            FileKind::CharDev => 0o020000,
            FileKind::BlockDev => 0o060000,
        }
    }

    pub fn from_mode(mode: u32) -> Option<FileKind> {
        Some(match mode & 0o170000 {
            0o100000 | 0 => FileKind::File,
            0o040000 => FileKind::Dir,
            0o120000 => FileKind::Symlink,
            0o010000 => FileKind::Fifo,
            0o140000 => FileKind::Socket,
            0o020000 => FileKind::CharDev,
            0o060000 => FileKind::BlockDev,
            _ => return None,
        })
    }
}

/// Seconds and nanoseconds since the Unix epoch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Timespec {
    pub sec: i64,
    pub nsec: u32,
}

/// Everything a client needs to know about an entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EntryAttr {
    pub id: EntryId,
    pub kind: FileKind,
    /// Permission bits (07777), without the file type.
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub nlink: u32,
    pub atime: Timespec,
    pub mtime: Timespec,
    pub ctime: Timespec,
    pub rdev: u32,
    /// Metadata node that stores this entry's inode (for a directory: its owner).
    pub owner: NodeId,
    /// Data layout (regular files only).
    pub pattern: Option<Pattern>,
    /// Stripe settings (directories only).
    pub dir_pattern: Option<DirPattern>,
}

/// A time to set: a given value or the server's clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SetTime {
    Now,
    At(Timespec),
}

/// Attribute changes; `None` leaves a field alone.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<SetTime>,
    pub mtime: Option<SetTime>,
}
