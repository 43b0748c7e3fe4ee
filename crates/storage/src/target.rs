//! Storage targets on disk: formatting ([`init_target`]) and opening
//! ([`open_target`]).
//!
//! A target is a directory holding:
//!
//! ```text
//! target.toml      format_version = 1
//!                  uuid = "…"          # this target, generated at format time
//!                  fs_uuid = "…"       # the file system it was formatted for
//!                  target_id = 3       # assigned by mgmtd; absent until the first start
//!                  node_id = 1         # storage node serving it; absent until the first start
//! chunks/          mode 0700; sub-directories `00`…`ff` created on demand
//! ```
//!
//! `target.toml` is always replaced atomically (temp file, fsync, rename,
//! fsync of the directory). Formatting creates `chunks/` first and writes
//! `target.toml` last, so a target with a `target.toml` is completely
//! formatted; a crash in between leaves only an empty `chunks/`, which a
//! second format accepts.

use crate::error::StorageError;
use hivefs_types::ids::{NodeId, TargetId};
use serde::{Deserialize, Serialize};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

pub const TARGET_FILE: &str = "target.toml";
pub use hivefs_chunk::CHUNKS_DIR;
pub const TARGET_FORMAT_VERSION: u32 = 1;
/// Longest accepted file-system uuid.
pub const FS_UUID_LEN_MAX: usize = 128;

/// Entries a directory may hold and still be formatted: a file system's
/// `lost+found` (a target may be the root of a mounted disk) and the leftovers
/// of an interrupted format.
const FORMATTABLE_LEFTOVERS: [&str; 3] = ["lost+found", CHUNKS_DIR, ".target.toml.tmp"];

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TargetFile {
    pub format_version: u32,
    pub uuid: String,
    pub fs_uuid: String,
    #[serde(default)]
    pub target_id: Option<TargetId>,
    #[serde(default)]
    pub node_id: Option<NodeId>,
}

impl TargetFile {
    /// Reads `<dir>/target.toml`; `Ok(None)` if it does not exist.
    pub fn load(dir: &Path) -> Result<Option<TargetFile>, StorageError> {
        let path = dir.join(TARGET_FILE);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(StorageError::io(path, e)),
        };
        let bad = |reason: String| StorageError::BadTargetFile { path: path.clone(), reason };
        let tf: TargetFile = toml::from_str(&text).map_err(|e| bad(format!("not a valid target file: {e}")))?;
        if tf.format_version != TARGET_FORMAT_VERSION {
            return Err(bad(format!(
                "target format version {} is not supported (this hivefs reads version {TARGET_FORMAT_VERSION})",
                tf.format_version
            )));
        }
        if tf.uuid.is_empty() || tf.fs_uuid.is_empty() {
            return Err(bad("uuid and fs_uuid must not be empty".into()));
        }
        if tf.target_id == Some(TargetId(0)) || tf.node_id == Some(NodeId(0)) {
            return Err(bad("target_id and node_id must not be 0".into()));
        }
        Ok(Some(tf))
    }

    pub fn save(&self, dir: &Path) -> Result<(), StorageError> {
        let path = dir.join(TARGET_FILE);
        let text = toml::to_string(self).expect("a target file serialises to TOML");
        hivefs_cluster::write_atomic(&path, text.as_bytes()).map_err(|e| StorageError::io(path, e))
    }
}

fn check_fs_uuid(fs_uuid: &str) -> Result<(), StorageError> {
    if fs_uuid.is_empty() || fs_uuid.len() > FS_UUID_LEN_MAX || !fs_uuid.chars().all(|c| c.is_ascii_graphic()) {
        return Err(StorageError::Config(format!(
            "file system uuid {fs_uuid:?} must be 1 to {FS_UUID_LEN_MAX} printable ASCII characters"
        )));
    }
    Ok(())
}

/// Formats a target directory (creating it if needed): writes `target.toml`
/// (format version 1, a new uuid, `fs_uuid`, no target id yet) and `chunks/`.
///
/// Refuses a non-empty directory that is not a HiveFS target, and a target
/// already formatted for another file system. Formatting a target of the same
/// file system again is a no-op.
pub fn init_target(dir: &Path, fs_uuid: &str) -> Result<(), StorageError> {
    check_fs_uuid(fs_uuid)?;
    if let Some(tf) = TargetFile::load(dir)? {
        if tf.fs_uuid != fs_uuid {
            return Err(StorageError::ForeignFileSystem {
                dir: dir.to_path_buf(),
                found: tf.fs_uuid,
                expected: fs_uuid.to_string(),
            });
        }
        return Ok(());
    }
    std::fs::create_dir_all(dir).map_err(|e| StorageError::io(dir, e))?;
    let chunks = dir.join(CHUNKS_DIR);
    for entry in std::fs::read_dir(dir).map_err(|e| StorageError::io(dir, e))? {
        let entry = entry.map_err(|e| StorageError::io(dir, e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let leftover = FORMATTABLE_LEFTOVERS.contains(&name.as_str())
            && (name != CHUNKS_DIR || is_empty_dir(&chunks).map_err(|e| StorageError::io(&chunks, e))?);
        if !leftover {
            return Err(StorageError::NotATarget { dir: dir.to_path_buf(), entry: name });
        }
    }
    match std::fs::DirBuilder::new().mode(0o700).create(&chunks) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(StorageError::io(chunks, e)),
    }
    let tf = TargetFile {
        format_version: TARGET_FORMAT_VERSION,
        uuid: hivefs_cluster::new_uuid(),
        fs_uuid: fs_uuid.to_string(),
        target_id: None,
        node_id: None,
    };
    // write_atomic fsyncs `dir` after the rename, which also makes `chunks/` durable.
    tf.save(dir)?;
    tracing::info!(dir = %dir.display(), uuid = %tf.uuid, %fs_uuid, "storage target formatted");
    Ok(())
}

fn is_empty_dir(p: &Path) -> std::io::Result<bool> {
    Ok(p.is_dir() && std::fs::read_dir(p)?.next().is_none())
}

/// Opens a formatted target: reads `target.toml`, checks the file system
/// (when `fs_uuid` is given) and that `chunks/` exists.
pub fn open_target(dir: &Path, fs_uuid: Option<&str>) -> Result<TargetFile, StorageError> {
    let tf = TargetFile::load(dir)?.ok_or_else(|| StorageError::NotFormatted { dir: dir.to_path_buf() })?;
    if let Some(expected) = fs_uuid {
        if tf.fs_uuid != expected {
            return Err(StorageError::ForeignFileSystem {
                dir: dir.to_path_buf(),
                found: tf.fs_uuid,
                expected: expected.to_string(),
            });
        }
    }
    let chunks: PathBuf = dir.join(CHUNKS_DIR);
    if !chunks.is_dir() {
        return Err(StorageError::BadTargetFile {
            path: chunks,
            reason: "missing: the target is damaged (target.toml exists but its chunks directory does not)".into(),
        });
    }
    Ok(tf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_creates_target_and_is_idempotent() {
        let d = tempfile::tempdir().unwrap();
        let t = d.path().join("t1");
        init_target(&t, "fs-a").unwrap();
        let tf = open_target(&t, Some("fs-a")).unwrap();
        assert_eq!((tf.format_version, tf.fs_uuid.as_str(), tf.target_id, tf.node_id), (1, "fs-a", None, None));
        assert!(t.join(CHUNKS_DIR).is_dir());
        init_target(&t, "fs-a").unwrap();
        assert_eq!(open_target(&t, None).unwrap(), tf, "formatting again changed nothing");
    }

    #[test]
    fn format_refuses_foreign_fs_and_non_empty_dirs() {
        let d = tempfile::tempdir().unwrap();
        let t = d.path().join("t");
        init_target(&t, "fs-a").unwrap();
        let e = init_target(&t, "fs-b").unwrap_err().to_string();
        assert!(e.contains(&t.display().to_string()) && e.contains("fs-a") && e.contains("fs-b"), "{e}");
        let e = open_target(&t, Some("fs-b")).unwrap_err();
        assert!(matches!(e, StorageError::ForeignFileSystem { .. }), "{e}");

        let other = d.path().join("home");
        std::fs::create_dir(&other).unwrap();
        std::fs::write(other.join("precious.txt"), "x").unwrap();
        let e = init_target(&other, "fs-a").unwrap_err().to_string();
        assert!(e.contains("precious.txt") && e.contains("not a HiveFS storage target"), "{e}");
        assert!(!other.join(TARGET_FILE).exists());

        // A non-empty chunks dir without target.toml is not ours either.
        let half = d.path().join("half");
        std::fs::create_dir_all(half.join("chunks/ab")).unwrap();
        assert!(matches!(init_target(&half, "fs-a"), Err(StorageError::NotATarget { .. })));

        assert!(matches!(init_target(&d.path().join("x"), ""), Err(StorageError::Config(_))));
        assert!(matches!(init_target(&d.path().join("x"), "a b"), Err(StorageError::Config(_))));
    }

    #[test]
    fn format_accepts_lost_and_found_and_interrupted_format() {
        let d = tempfile::tempdir().unwrap();
        let t = d.path().join("disk");
        std::fs::create_dir_all(t.join("lost+found")).unwrap();
        std::fs::create_dir_all(t.join(CHUNKS_DIR)).unwrap();
        init_target(&t, "fs").unwrap();
        open_target(&t, Some("fs")).unwrap();
    }

    #[test]
    fn open_refuses_unformatted_corrupt_and_damaged_targets() {
        let d = tempfile::tempdir().unwrap();
        let e = open_target(d.path(), None).unwrap_err().to_string();
        assert_eq!(e, format!("target dir {} is not formatted; run hivefs storage --init", d.path().display()));

        std::fs::write(d.path().join(TARGET_FILE), "format_version = 1\nbogus = 2\n").unwrap();
        let e = open_target(d.path(), None).unwrap_err();
        assert!(matches!(e, StorageError::BadTargetFile { .. }) && e.to_string().contains(TARGET_FILE), "{e}");

        std::fs::write(d.path().join(TARGET_FILE), "format_version = 7\nuuid = \"u\"\nfs_uuid = \"f\"\n").unwrap();
        assert!(open_target(d.path(), None).unwrap_err().to_string().contains("version 7"));

        std::fs::write(d.path().join(TARGET_FILE), "format_version = 1\nuuid = \"u\"\nfs_uuid = \"f\"\n").unwrap();
        let e = open_target(d.path(), None).unwrap_err().to_string();
        assert!(e.contains("chunks") && e.contains("damaged"), "{e}");
        std::fs::create_dir(d.path().join(CHUNKS_DIR)).unwrap();
        open_target(d.path(), Some("f")).unwrap();
    }

    #[test]
    fn ids_round_trip_through_target_file() {
        let d = tempfile::tempdir().unwrap();
        init_target(d.path(), "fs").unwrap();
        let mut tf = open_target(d.path(), None).unwrap();
        tf.target_id = Some(TargetId(3));
        tf.node_id = Some(NodeId(2));
        tf.save(d.path()).unwrap();
        assert_eq!(open_target(d.path(), None).unwrap(), tf);
        let text = std::fs::read_to_string(d.path().join(TARGET_FILE)).unwrap();
        assert!(text.contains("target_id = 3") && text.contains("node_id = 2"), "{text}");
    }
}
