//! Errors of starting the storage service and of formatting or opening
//! targets. Errors of single chunk requests travel as `FsError` (with a code
//! the client maps), see [`hivefs_chunk::store`].

use hivefs_types::error::FsError;
use hivefs_types::ids::{NodeId, TargetId};
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StorageError {
    #[error("invalid storage configuration: {0}")]
    Config(String),
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    #[error("target dir {} is not formatted; run hivefs storage --init", dir.display())]
    NotFormatted { dir: PathBuf },
    #[error("{} is not empty and is not a HiveFS storage target (it holds {entry:?}); refusing to format it", dir.display())]
    NotATarget { dir: PathBuf, entry: String },
    #[error("target dir {} belongs to file system {found}, not to file system {expected}", dir.display())]
    ForeignFileSystem { dir: PathBuf, found: String, expected: String },
    #[error("{}: {reason}", path.display())]
    BadTargetFile { path: PathBuf, reason: String },
    #[error(
        "target dir {} was registered as target {stored}, but mgmtd {mgmtd} assigned target {assigned} \
         to its uuid {uuid}: wrong mgmtd or a lost registry",
        dir.display()
    )]
    TargetIdMismatch { dir: PathBuf, stored: TargetId, assigned: TargetId, mgmtd: String, uuid: String },
    #[error("target dir {} belongs to storage node {stored}, but this service is storage node {node}", dir.display())]
    TargetNodeMismatch { dir: PathBuf, stored: NodeId, node: NodeId },
    #[error("target dirs {} and {} are the same target (uuid {uuid})", first.display(), second.display())]
    DuplicateTarget { first: PathBuf, second: PathBuf, uuid: String },
    #[error("{0}")]
    Secret(String),
    #[error("storage service cannot listen on {addr}: {source}")]
    Listen { addr: String, source: std::io::Error },
    #[error("registration with mgmtd {mgmtd} failed: {source}")]
    Mgmt { mgmtd: String, source: FsError },
}

impl StorageError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> StorageError {
        StorageError::Io { path: path.into(), source }
    }
}
