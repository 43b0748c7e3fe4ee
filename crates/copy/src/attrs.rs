//! What is kept of an entry besides its contents, and setting it on the copy:
//! owner (only as root: others cannot give files away, and `cp -a` skips it
//! for them too), mode with the setuid, setgid and sticky bits, extended
//! attributes, access and modification times to the nanosecond. The order
//! matters: owner before mode (a change of owner clears setuid and setgid),
//! extended attributes after the owner (it clears `security.capability`),
//! times last (so an interrupted copy never has the source's modification
//! time, which `--update` trusts), by path after the file is closed: a FUSE
//! mount may publish a written file's size with the time of the close
//! (HiveFS's does), which would undo times set through the descriptor.

use crate::{OpContext, OpError};
use rustix::fs::{AtFlags, Gid, Mode, Timespec, Timestamps, Uid, XattrFlags, CWD};
use rustix::io::Errno;
use std::ffi::OsString;
use std::fs::File;
use std::os::unix::ffi::OsStringExt;
use std::path::Path;

/// The type of an entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
    Symlink,
    Fifo,
    Socket,
    Char,
    Block,
}

/// What a copy keeps of a source entry, from its `lstat`.
#[derive(Clone, Debug)]
pub struct Meta {
    pub kind: Kind,
    /// Permission bits with setuid, setgid and sticky (mode & 0o7777).
    pub perm: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    /// 512-byte blocks allocated.
    pub blocks: u64,
    pub atime: (i64, i64),
    pub mtime: (i64, i64),
    pub dev: u64,
    pub ino: u64,
    pub nlink: u64,
    pub rdev: u64,
}

impl Meta {
    /// Of an `lstat` (or `fstat`).
    #[allow(clippy::unnecessary_cast)] // the fields' widths differ between targets
    pub fn from_stat(st: &rustix::fs::Stat) -> Meta {
        use rustix::fs::FileType as T;
        let kind = match T::from_raw_mode(st.st_mode) {
            T::Directory => Kind::Dir,
            T::Symlink => Kind::Symlink,
            T::Fifo => Kind::Fifo,
            T::Socket => Kind::Socket,
            T::CharacterDevice => Kind::Char,
            T::BlockDevice => Kind::Block,
            _ => Kind::File,
        };
        Meta {
            kind,
            perm: st.st_mode & 0o7777,
            uid: st.st_uid,
            gid: st.st_gid,
            size: st.st_size as u64,
            blocks: st.st_blocks as u64,
            atime: (st.st_atime as i64, st.st_atime_nsec as i64),
            mtime: (st.st_mtime as i64, st.st_mtime_nsec as i64),
            dev: st.st_dev,
            ino: st.st_ino,
            nlink: st.st_nlink as u64,
            rdev: st.st_rdev,
        }
    }

    /// Of the entry at `p` (a symlink itself, not what it points to).
    pub fn lstat(p: &Path) -> std::io::Result<Meta> {
        Ok(Meta::from_stat(&rustix::fs::lstat(p)?))
    }
}

/// Calls `each` with the name and `lstat` of every entry of directory `p`
/// (not "." and ".."), which is read without moving its access time where
/// the kernel lets us (owner or root).
pub fn list_dir(p: &Path, mut each: impl FnMut(OsString, std::io::Result<Meta>)) -> std::io::Result<()> {
    use rustix::fs::OFlags;
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    let fd = match rustix::fs::open(p, flags | OFlags::NOATIME, Mode::empty()) {
        Err(Errno::PERM) => rustix::fs::open(p, flags, Mode::empty()),
        r => r,
    }?;
    let mut dir = rustix::fs::Dir::new(fd)?;
    while let Some(d) = dir.read() {
        let d = d?;
        let name = d.file_name();
        if name == c"." || name == c".." {
            continue;
        }
        let st = rustix::fs::statat(dir.fd()?, name, AtFlags::SYMLINK_NOFOLLOW);
        each(OsString::from_vec(name.to_bytes().to_vec()), st.map(|s| Meta::from_stat(&s)).map_err(Into::into));
    }
    Ok(())
}

impl Meta {
    fn times(&self) -> Timestamps {
        let ts = |(s, ns): (i64, i64)| Timespec { tv_sec: s, tv_nsec: ns };
        Timestamps { last_access: ts(self.atime), last_modification: ts(self.mtime) }
    }
}

/// What to keep besides modes and times.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Keep {
    /// Owners (we run as root).
    pub owner: bool,
    pub xattrs: bool,
}

/// Owner, mode and extended attributes of an open regular file (its times
/// are for [`set_times`] once it is closed); `now` is its `fstat` from when
/// it was opened (writing since may have cleared setuid and setgid, so a
/// mode with those is always set).
pub(crate) fn finish_file(
    f: &File,
    now: &rustix::fs::Stat,
    src: &Path,
    dst: &Path,
    m: &Meta,
    keep: Keep,
) -> Result<(), OpError> {
    let chowned = keep.owner && (now.st_uid != m.uid || now.st_gid != m.gid);
    if chowned {
        rustix::fs::fchown(f, Some(Uid::from_raw(m.uid)), Some(Gid::from_raw(m.gid))).op("set owner", dst)?;
    }
    if now.st_mode & 0o7777 != m.perm || m.perm & 0o6000 != 0 {
        rustix::fs::fchmod(f, Mode::from_raw_mode(m.perm)).op("set mode", dst)?;
    }
    if keep.xattrs {
        copy_xattrs(src, dst, keep)?;
    }
    Ok(())
}

/// Access and modification times of the entry at `dst` (not followed).
pub(crate) fn set_times(dst: &Path, m: &Meta) -> Result<(), OpError> {
    rustix::fs::utimensat(CWD, dst, &m.times(), AtFlags::SYMLINK_NOFOLLOW).op("set times", dst)
}

/// The same for an entry by path, not followed if a symlink (whose mode
/// Linux does not keep).
pub(crate) fn finish_path(src: &Path, dst: &Path, m: &Meta, keep: Keep) -> Result<(), OpError> {
    let now = rustix::fs::lstat(dst).op("stat", dst)?;
    let chowned = keep.owner && (now.st_uid != m.uid || now.st_gid != m.gid);
    if chowned {
        let (u, g) = (Some(Uid::from_raw(m.uid)), Some(Gid::from_raw(m.gid)));
        rustix::fs::chownat(CWD, dst, u, g, AtFlags::SYMLINK_NOFOLLOW).op("set owner", dst)?;
    }
    if m.kind != Kind::Symlink && (now.st_mode & 0o7777 != m.perm || (chowned && m.perm & 0o6000 != 0)) {
        rustix::fs::chmodat(CWD, dst, Mode::from_raw_mode(m.perm), AtFlags::empty()).op("set mode", dst)?;
    }
    if keep.xattrs {
        copy_xattrs(src, dst, keep)?;
    }
    set_times(dst, m)
}

/// Copies every extended attribute the source lists (symlinks not
/// followed). A destination file system without them (ENOTSUP) gets none,
/// and names only root may set (`trusted.*`, some `security.*`) are skipped
/// for others, silently, as `cp -a` does.
pub(crate) fn copy_xattrs(src: &Path, dst: &Path, keep: Keep) -> Result<(), OpError> {
    let names = match list_xattrs(src) {
        Ok(n) => n,
        Err(Errno::NOTSUP) => return Ok(()),
        Err(e) => return Err(e).op("list extended attributes", src),
    };
    let mut value = Vec::new();
    for name in names.split(|&b| b == 0).filter(|n| !n.is_empty()) {
        match get_xattr(src, name, &mut value) {
            Ok(()) => {}
            // Removed since it was listed.
            Err(Errno::NODATA) => continue,
            Err(e) => return Err(e).op(&format!("get extended attribute {}", show(name)), src),
        }
        match rustix::fs::lsetxattr(dst, name, &value, XattrFlags::empty()) {
            Ok(()) => {}
            Err(Errno::NOTSUP) => return Ok(()),
            Err(Errno::PERM) if !keep.owner => {}
            Err(e) => return Err(e).op(&format!("set extended attribute {}", show(name)), dst),
        }
    }
    Ok(())
}

fn show(name: &[u8]) -> String {
    String::from_utf8_lossy(name).into_owned()
}

/// The NUL-separated names (one call when they fit 1 KiB, the usual case).
fn list_xattrs(p: &Path) -> Result<Vec<u8>, Errno> {
    let mut buf = vec![0u8; 1024];
    loop {
        match rustix::fs::llistxattr(p, &mut buf[..]) {
            Ok(n) => {
                buf.truncate(n);
                return Ok(buf);
            }
            Err(Errno::RANGE) => {
                let want = rustix::fs::llistxattr_query(p)?;
                buf.resize(want.max(buf.len() * 2), 0);
            }
            Err(e) => return Err(e),
        }
    }
}

fn get_xattr(p: &Path, name: &[u8], value: &mut Vec<u8>) -> Result<(), Errno> {
    value.resize(value.capacity().max(4096), 0);
    loop {
        match rustix::fs::lgetxattr(p, name, &mut value[..]) {
            Ok(n) => {
                value.truncate(n);
                return Ok(());
            }
            Err(Errno::RANGE) => {
                let want = rustix::fs::lgetxattr_query(p, name)?;
                value.resize(want.max(value.len() * 2), 0);
            }
            Err(e) => return Err(e),
        }
    }
}

/// Whether the process may give files away (and so keeps owners).
pub(crate) fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn mode_times_and_xattrs_are_set_by_path_and_on_an_open_file() {
        let t = tempfile::tempdir().unwrap();
        let (src, dst, dst2) = (t.path().join("s"), t.path().join("d"), t.path().join("d2"));
        std::fs::write(&src, b"data").unwrap();
        std::fs::set_permissions(&src, std::fs::Permissions::from_mode(0o4751)).unwrap();
        let xattrs = rustix::fs::lsetxattr(&src, "user.hivefs", b"v1", XattrFlags::empty()).is_ok();
        let times = Timestamps {
            last_access: Timespec { tv_sec: 1_000_000_000, tv_nsec: 123_456_789 },
            last_modification: Timespec { tv_sec: 1_234_567_890, tv_nsec: 987_654_321 },
        };
        rustix::fs::utimensat(CWD, &src, &times, AtFlags::empty()).unwrap();
        let m = Meta::lstat(&src).unwrap();
        let keep = Keep { owner: is_root(), xattrs: true };
        std::fs::write(&dst, b"data").unwrap();
        finish_path(&src, &dst, &m, keep).unwrap();
        let f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).open(&dst2).unwrap();
        let now = rustix::fs::fstat(&f).unwrap();
        finish_file(&f, &now, &src, &dst2, &m, keep).unwrap();
        drop(f);
        set_times(&dst2, &m).unwrap();
        for d in [&dst, &dst2] {
            let c = Meta::lstat(d).unwrap();
            assert_eq!((c.perm, c.atime, c.mtime), (0o4751, (1_000_000_000, 123_456_789), m.mtime), "{d:?}");
            if xattrs {
                let mut v = Vec::new();
                get_xattr(d, b"user.hivefs", &mut v).unwrap();
                assert_eq!(v, b"v1");
            }
        }
    }
}
