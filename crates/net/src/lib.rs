//! HiveFS transport.
//!
//! Owns connections: the handshake (protocol version and shared-secret
//! challenge/response), framing on a byte stream, many requests in flight per
//! connection (matched by request id), per-request timeouts, bounded
//! connection pools per peer, and the server loop with its limits
//! (connections, in-flight requests per connection, frame sizes). A
//! client's request is written by its caller's thread (`send`).
//!
//! It knows nothing of what requests mean: services plug in a [`Handler`],
//! and callers reach a service through the [`Call`] trait ([`Pool`] is its
//! TCP implementation; [`Pools::with_connector`] lets a simulation or a test
//! put another network in its place).
//! The connection code is generic over any `AsyncRead + AsyncWrite` stream;
//! only `listen`/`connect` are TCP-specific, so another transport (RDMA) can
//! be added beside them without touching the services. The short-circuit
//! beside TCP (chunk files handed to clients on the same host) lives in
//! `hivefs_chunk::local`, and uses [`auth`] for its challenge/response.

#![forbid(unsafe_code)]

pub mod auth;
pub mod client;
pub mod io;
mod send;
pub mod server;

pub use auth::{generate_secret_file, load_secret, Secret};
pub use client::{call_once, node_moved, repeat, Call, CallFuture, ClientConfig, Connector, Pool, Pools};
pub use server::{serve, Handler, Peer, ServerConfig, ServerHandle};

/// How a service meets its peers.
pub enum Net {
    /// Listens on its configured address; reaches mgmtd and other nodes
    /// over TCP.
    Tcp,
    /// Listens nowhere: requests arrive through the service's `handle`, and
    /// mgmtd and other nodes are reached through `pools` (a simulated
    /// network, `hivefs-sim`). The service's `advertise` names it there.
    Pools(Pools),
}

use hivefs_types::error::{ErrorCode, FsError};

/// Transport-level failure, converted to an [`FsError`] for callers.
pub(crate) fn unavailable(addr: &str, what: impl std::fmt::Display) -> FsError {
    FsError::new(ErrorCode::Unavailable, format!("{addr}: {what}"))
}
