//! The FUSE wire protocol of the HiveFS mount.
//!
//! Owns the kernel's side of the conversation: decoding requests
//! (`request`), encoding answers (`reply`, `types`) and the two transports
//! they travel on: `/dev/fuse` read and written by a few threads (`dev`),
//! and FUSE over io_uring (`uring`), where the kernel places each request
//! in a buffer registered per CPU queue and the answer goes back with the
//! command that fetches the next request. The handlers implement
//! [`Filesystem`] and never see which transport a request came by.
//!
//! It must not know what the file system means: inode numbers, handles and
//! errors pass through unchanged, and nothing here talks to HiveFS
//! services. Mounting and the INIT handshake stay with the mount crate.
//! This crate is where the mount's `unsafe` lives (the io_uring rings and
//! buffers shared with the kernel, and one ioctl), each use with its reason.

mod dev;
mod reply;
mod request;
mod types;
mod uring;

pub use dev::serve_dev;
pub use reply::{
    Interrupter, Reply, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyLock,
    ReplyLseek, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr,
};
pub use request::{Filesystem, Request};
pub use types::{
    Errno, FileAttr, FileHandle, FileType, FopenFlags, Generation, INodeNo, LockOwner, OpenFlags, TimeOrNow,
};
pub use uring::{serve_uring, UringConfig, UringQueues, UringSession};

use std::sync::Arc;

/// An answer as a test keeps it: unique, error, argument bytes.
#[cfg(test)]
pub(crate) type Answer = (u64, i32, Vec<u8>);

/// Where an answer goes: the `/dev/fuse` descriptor its request was read
/// from, or the io_uring entry that carried it.
#[derive(Clone)]
pub(crate) enum Sink {
    Dev(Arc<std::fs::File>),
    Ring(Arc<uring::Queue>, usize),
    /// Answers thrown away (`decode_any`).
    Discard,
    /// Answers kept for a test.
    #[cfg(test)]
    Test(Arc<std::sync::Mutex<Vec<Answer>>>),
}

impl Sink {
    fn send(&self, unique: u64, error: i32, args: &[&[u8]]) {
        match self {
            Sink::Dev(f) => dev::write_reply(f, unique, error, args),
            Sink::Ring(q, slot) => q.commit(*slot, unique, error, args),
            Sink::Discard => {}
            #[cfg(test)]
            Sink::Test(v) => v.lock().unwrap().push((unique, error, args.concat())),
        }
    }
}

/// Decodes any bytes as a request, laid out as `/dev/fuse` gives it
/// (`split` = `None`) or with the operation's header apart as io_uring does
/// (its length), and serves it with handlers that answer everything: for
/// the fuzz target and tests of hostile input. It must never panic.
#[doc(hidden)]
pub fn decode_any(data: &[u8], split: Option<usize>) {
    struct Answers;
    impl Filesystem for Answers {}
    let Some(h) = request::InHeader::parse(data) else { return };
    let body = &data[request::IN_HEADER_LEN..];
    let args = match split {
        Some(n) => {
            let n = n.min(body.len());
            request::Args::new(&body[..n], &body[n..])
        }
        None => request::Args::new(body, &[]),
    };
    request::dispatch(&Answers, h, args, &Sink::Discard);
}

/// `struct fuse_out_header`: length, error (0 or a negative errno), unique.
fn out_header(len: usize, error: i32, unique: u64) -> [u8; 16] {
    let mut h = [0u8; 16];
    h[0..4].copy_from_slice(&(len as u32).to_ne_bytes());
    h[4..8].copy_from_slice(&error.to_ne_bytes());
    h[8..16].copy_from_slice(&unique.to_ne_bytes());
    h
}
