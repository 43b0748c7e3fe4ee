//! SRC... DST as `cp -a` reads them: into an existing directory DST each SRC
//! becomes DST/NAME (NAME the last component of SRC, so `a/` gives `a`); a
//! single SRC with a DST that does not exist becomes DST. Refuses, before
//! anything is written: a missing SRC, several SRCs and a DST that is not a
//! directory, a directory copied into itself, a directory over a file, a file
//! onto itself.

use crate::attrs::{Kind, Meta};
use std::path::{Path, PathBuf};

/// Why a copy cannot start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UsageError {
    #[error("missing SRC or DST operand")]
    NoOperands,
    #[error("cannot stat {path}: {error}")]
    Source { path: PathBuf, error: std::io::Error },
    #[error("target {0} is not a directory")]
    NotADirectory(PathBuf),
    #[error("cannot copy a directory, {src}, into itself, {dst}")]
    IntoItself { src: PathBuf, dst: PathBuf },
    #[error("{src} and {dst} are the same file")]
    SameFile { src: PathBuf, dst: PathBuf },
    #[error("cannot overwrite non-directory {dst} with directory {src}")]
    DirOverNonDir { src: PathBuf, dst: PathBuf },
    #[error("cannot look at {path}: {error}")]
    Destination { path: PathBuf, error: std::io::Error },
    #[error(
        "{0} does not exist: with --part or --dir-attrs-only, DST must be an existing directory (or give -T to copy SRC as DST)"
    )]
    PartsNeedTarget(PathBuf),
    #[error("{0}")]
    Option(String),
}

/// One top-level copy: the source (not followed if a symlink) and where it goes.
#[derive(Clone, Debug)]
pub struct Job {
    pub src: PathBuf,
    pub dst: PathBuf,
    /// `dst` relative to DST (empty when `dst` is DST): what `--part` hashes.
    pub rel: PathBuf,
    pub(crate) meta: Meta,
}

/// Resolves SRC... DST. `as_target` (`-T`): DST is the copy of the single
/// SRC even if it is an existing directory. `fixed_target`: DST must already
/// exist unless `as_target`, so that runs started at different times (the
/// parts of one copy) read it the same way.
pub fn plan(sources: &[PathBuf], dst: &Path, as_target: bool, fixed_target: bool) -> Result<Vec<Job>, UsageError> {
    if sources.is_empty() {
        return Err(UsageError::NoOperands);
    }
    let dst_meta = match std::fs::metadata(dst) {
        Ok(m) => Some(m),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(error) => return Err(UsageError::Destination { path: dst.to_path_buf(), error }),
    };
    if as_target && sources.len() > 1 {
        return Err(UsageError::Option("-T takes exactly one SRC".into()));
    }
    let into_dir = !as_target && dst_meta.as_ref().is_some_and(|m| m.is_dir());
    if sources.len() > 1 && !into_dir {
        return Err(UsageError::NotADirectory(dst.to_path_buf()));
    }
    if fixed_target && !as_target && dst_meta.is_none() {
        return Err(UsageError::PartsNeedTarget(dst.to_path_buf()));
    }
    let mut jobs = Vec::with_capacity(sources.len());
    for src in sources {
        let meta = Meta::lstat(src).map_err(|error| UsageError::Source { path: src.clone(), error })?;
        let (target, rel) = if into_dir {
            match src.file_name() {
                Some(name) => (dst.join(name), PathBuf::from(name)),
                // "." or "..": its contents go into DST itself.
                None => (dst.to_path_buf(), PathBuf::new()),
            }
        } else {
            (dst.to_path_buf(), PathBuf::new())
        };
        if ends_with_slash(dst) && meta.kind != Kind::Dir && dst_meta.is_none() {
            return Err(UsageError::NotADirectory(dst.to_path_buf()));
        }
        check_target(src, &meta, &target)?;
        jobs.push(Job { src: src.clone(), dst: target, rel, meta });
    }
    Ok(jobs)
}

fn ends_with_slash(p: &Path) -> bool {
    p.as_os_str().as_encoded_bytes().last() == Some(&b'/')
}

/// Refuses a directory copied into itself (or below), a directory over a
/// non-directory and a file onto itself.
fn check_target(src: &Path, m: &Meta, target: &Path) -> Result<(), UsageError> {
    let is_dir = m.kind == Kind::Dir;
    if let Ok(t) = Meta::lstat(target) {
        if (t.dev, t.ino) == (m.dev, m.ino) && !is_dir {
            return Err(UsageError::SameFile { src: src.to_path_buf(), dst: target.to_path_buf() });
        }
        if is_dir && t.kind != Kind::Dir {
            return Err(UsageError::DirOverNonDir { src: src.to_path_buf(), dst: target.to_path_buf() });
        }
    }
    if is_dir {
        let s = src.canonicalize().map_err(|error| UsageError::Source { path: src.to_path_buf(), error })?;
        if canonical_target(target).is_some_and(|t| t.starts_with(&s)) {
            return Err(UsageError::IntoItself { src: src.to_path_buf(), dst: target.to_path_buf() });
        }
    }
    Ok(())
}

/// The target with every existing ancestor resolved (symlinks, "..").
fn canonical_target(target: &Path) -> Option<PathBuf> {
    let mut rest = Vec::new();
    let mut p = target.to_path_buf();
    loop {
        if let Ok(c) = p.canonicalize() {
            return Some(rest.into_iter().rev().fold(c, |acc, n: std::ffi::OsString| acc.join(n)));
        }
        rest.push(p.file_name()?.to_os_string());
        p = match p.parent() {
            Some(q) if !q.as_os_str().is_empty() => q.to_path_buf(),
            _ => PathBuf::from("."),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn tree() -> tempfile::TempDir {
        let t = tempfile::tempdir().unwrap();
        fs::create_dir_all(t.path().join("a/sub")).unwrap();
        fs::write(t.path().join("a/f"), b"x").unwrap();
        fs::write(t.path().join("file"), b"y").unwrap();
        fs::create_dir(t.path().join("d")).unwrap();
        t
    }

    fn targets(jobs: &[Job]) -> Vec<PathBuf> {
        jobs.iter().map(|j| j.dst.clone()).collect()
    }

    #[test]
    fn sources_go_into_an_existing_directory_or_become_a_new_dst() {
        let t = tree();
        let p = |s: &str| t.path().join(s);
        let a_slash = PathBuf::from(format!("{}/", p("a").display()));
        let j = plan(&[a_slash], &p("d"), false, false).unwrap();
        assert_eq!(targets(&j), [p("d/a")]);
        assert_eq!(j[0].rel, Path::new("a"));
        let j = plan(&[p("a")], &p("new"), false, false).unwrap();
        assert_eq!(targets(&j), [p("new")]);
        assert_eq!(j[0].rel, Path::new(""));
        let j = plan(&[p("a"), p("file")], &p("d"), false, false).unwrap();
        assert_eq!(targets(&j), [p("d/a"), p("d/file")]);
        // -T: DST itself, even an existing directory.
        let j = plan(&[p("a")], &p("d"), true, false).unwrap();
        assert_eq!(targets(&j), [p("d")]);
        // A file onto an existing file overwrites it.
        let j = plan(&[p("file")], &p("a/f"), false, false).unwrap();
        assert_eq!(targets(&j), [p("a/f")]);
    }

    #[test]
    fn bad_usage_is_refused_before_anything_is_written() {
        let t = tree();
        let p = |s: &str| t.path().join(s);
        let err = |r: Result<Vec<Job>, UsageError>| r.unwrap_err().to_string();
        assert!(err(plan(&[p("nope")], &p("d"), false, false)).contains("cannot stat"));
        assert!(err(plan(&[p("a"), p("file")], &p("new"), false, false)).contains("is not a directory"));
        assert!(err(plan(&[p("a"), p("file")], &p("file"), false, false)).contains("is not a directory"));
        assert!(err(plan(&[p("a")], &p("a/sub"), false, false)).contains("into itself"));
        assert!(err(plan(&[p("a")], &p("a/sub/deeper/x"), false, false)).contains("into itself"));
        assert!(err(plan(&[p("a")], &p("a"), true, false)).contains("into itself"));
        assert!(err(plan(&[p("a")], &p("file"), false, false)).contains("cannot overwrite non-directory"));
        assert!(err(plan(&[p("file")], &p("file"), false, false)).contains("same file"));
        assert!(err(plan(&[], &p("d"), false, false)).contains("missing"));
        assert!(err(plan(&[p("a")], &p("new"), false, true)).contains("existing directory"));
        assert!(plan(&[p("a")], &p("new"), true, true).is_ok());
        let slash = PathBuf::from(format!("{}/", p("newdir").display()));
        assert!(err(plan(&[p("file")], &slash, false, false)).contains("is not a directory"));
        // Nothing was created.
        assert!(!p("new").exists() && !p("d/a").exists());
    }
}
