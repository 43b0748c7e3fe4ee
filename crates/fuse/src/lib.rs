//! The HiveFS FUSE mount.
//!
//! Owns the translation between the kernel's FUSE requests and the native
//! client library: inode numbers for entry ids, open file and directory
//! handles, attribute conversion, the capabilities negotiated with the kernel
//! (with POSIX ACLs the kernel checks them and creates carry the umask to the
//! metadata node), and the mapping of HiveFS error codes to errno (the only
//! place in HiveFS that does it). A request's handler runs on
//! the thread that read it until it first waits, and then on the async
//! runtime (`lazy`), so the mount serves many requests at once; a close with
//! nothing to send or wait for is answered on the thread that read it. It must not talk to services itself: all traffic goes
//! through `hivefs-client`.
//!
//! The kernel protocol and its transports (`/dev/fuse`, FUSE over io_uring)
//! are `hivefs-fusewire`'s; `fuser` only mounts, answers INIT and sends
//! notifications (`fs::session`).

#![forbid(unsafe_code)]

mod errno;
mod fs;
mod inodes;
mod lazy;

pub use fs::{check_mountpoint, mount, Atime, CacheMode, FuseTransport, MountOptions, DIR_ATTR_TTL};
