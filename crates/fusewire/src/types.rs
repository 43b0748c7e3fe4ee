//! The values requests carry and answers hold, as the handlers see them.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A small set of named bits with `empty`, `|`, `bits` and `contains` (the
/// few flags this crate needs do not warrant a dependency).
macro_rules! bitflags_lite {
    ($(#[$m:meta])* $name:ident: $t:ty { $($flag:ident = $v:expr,)* }) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
        pub struct $name($t);
        #[allow(non_upper_case_globals)]
        impl $name {
            $(pub const $flag: $name = $name($v);)*
            pub fn empty() -> $name { $name(0) }
            pub fn bits(self) -> $t { self.0 }
            pub fn contains(self, o: $name) -> bool { self.0 & o.0 == o.0 }
        }
        impl std::ops::BitOr for $name {
            type Output = $name;
            fn bitor(self, o: $name) -> $name { $name(self.0 | o.0) }
        }
    };
}

/// An inode number as the kernel names it (its node id).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct INodeNo(pub u64);

/// A file or directory handle chosen by the file system at open.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FileHandle(pub u64);

/// The kernel's lock owner (a process's files table, or an open file description for flock).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LockOwner(pub u64);

/// The generation of an inode number (HiveFS never reuses one: always 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Generation(pub u64);

/// `open(2)` flags as the kernel passes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpenFlags(pub i32);

/// An error number (positive, as `libc::ENOENT`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Errno(i32);

impl Errno {
    pub const ENOENT: Errno = Errno(libc::ENOENT);
    pub const EIO: Errno = Errno(libc::EIO);
    pub const ENOSYS: Errno = Errno(libc::ENOSYS);
    pub const EINVAL: Errno = Errno(libc::EINVAL);
    pub const EINTR: Errno = Errno(libc::EINTR);

    pub fn from_i32(code: i32) -> Errno {
        Errno(if code > 0 { code } else { libc::EIO })
    }

    pub fn code(self) -> i32 {
        self.0
    }
}

/// A time a `setattr` sets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimeOrNow {
    SpecificTime(SystemTime),
    Now,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileType {
    NamedPipe,
    CharDevice,
    BlockDevice,
    Directory,
    RegularFile,
    Symlink,
    Socket,
}

impl FileType {
    /// The `S_IFMT` bits of the type.
    pub fn mode_bits(self) -> u32 {
        match self {
            FileType::NamedPipe => libc::S_IFIFO,
            FileType::CharDevice => libc::S_IFCHR,
            FileType::BlockDevice => libc::S_IFBLK,
            FileType::Directory => libc::S_IFDIR,
            FileType::RegularFile => libc::S_IFREG,
            FileType::Symlink => libc::S_IFLNK,
            FileType::Socket => libc::S_IFSOCK,
        }
    }
}

/// The attributes of an inode as answered to the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileAttr {
    pub ino: INodeNo,
    pub size: u64,
    pub blocks: u64,
    pub atime: SystemTime,
    pub mtime: SystemTime,
    pub ctime: SystemTime,
    pub kind: FileType,
    /// Permission bits (`0o7777`).
    pub perm: u16,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub blksize: u32,
}

bitflags_lite! {
    /// `FOPEN_*` flags of an open's answer.
    FopenFlags: u32 {
        FOPEN_DIRECT_IO = 1 << 0,
        FOPEN_KEEP_CACHE = 1 << 1,
        FOPEN_NOFLUSH = 1 << 5,
    }
}

/// Seconds and nanoseconds since the epoch (negative before it), as FUSE
/// carries times (the seconds as the bits of an `i64`).
pub(crate) fn time_parts(t: SystemTime) -> (u64, u32) {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => (d.as_secs(), d.subsec_nanos()),
        Err(e) => {
            let d = e.duration();
            // -1.25 s is sec -2, nsec 750_000_000.
            let (mut s, mut n) = (-(d.as_secs() as i64), d.subsec_nanos());
            if n > 0 {
                s -= 1;
                n = 1_000_000_000 - n;
            }
            (s as u64, n)
        }
    }
}

/// A time from FUSE's seconds (bits of an `i64`) and nanoseconds.
pub(crate) fn system_time(sec: u64, nsec: u32) -> SystemTime {
    let s = sec as i64;
    let nsec = nsec.min(999_999_999);
    if s >= 0 {
        UNIX_EPOCH + Duration::new(s as u64, nsec)
    } else {
        UNIX_EPOCH - Duration::from_secs(s.unsigned_abs()) + Duration::from_nanos(u64::from(nsec))
    }
}

/// A TTL as FUSE carries it: seconds and nanoseconds.
pub(crate) fn ttl_parts(d: Duration) -> (u64, u32) {
    (d.as_secs(), d.subsec_nanos())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_round_trip_before_and_after_the_epoch() {
        for (s, n) in [(0i64, 0u32), (1, 5), (-1, 0), (-2, 750_000_000), (1_700_000_000, 999_999_999)] {
            let t = system_time(s as u64, n);
            assert_eq!(time_parts(t), (s as u64, n), "{s}.{n}");
        }
    }
}
