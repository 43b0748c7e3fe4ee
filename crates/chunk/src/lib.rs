//! HiveFS chunk files, below the storage service and the client.
//!
//! Owns the chunk files of a target ([`files`]: the trait the storage
//! service uses them through; [`store`]: the files on disk, their paths below
//! `chunks/`, create/read/write/truncate/fallocate/seek/copy/unlink), the
//! positional I/O on an open chunk file ([`io`]: full reads, reads from the
//! page cache only), the mapping of a failed chunk-file operation's
//! `io::Error` to an [`ErrorCode`](hivefs_types::error::ErrorCode)
//! ([`chunk_io_code`]), and the passing of chunk-file descriptors to clients
//! on the same host ([`local`]: the short-circuit socket, both ends).
//!
//! It must not send TCP requests, know about metadata (files, directories,
//! patterns, sizes), decide which targets a file uses, or run a service
//! loop: the storage service and the client do those, and call in here for
//! the chunk files themselves.

#![forbid(unsafe_code)]

pub mod files;
pub mod io;
pub mod local;
pub mod store;

pub use files::{ChunkFiles, Wrap};
pub use io::chunk_io_code;
pub use store::{chunk_rel_path, ChunkStore, CHUNKS_DIR};
