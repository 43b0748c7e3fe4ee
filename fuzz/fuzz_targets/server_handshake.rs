//! Any byte stream sent to a server connection from its first byte, with
//! authentication on: the server refuses or closes within its deadline, never
//! panics, and no request reaches the handler (a peer without the secret
//! cannot produce a valid MAC over the server's fresh nonce).
#![no_main]
use hivefs_net::server::serve_conn;
use hivefs_net::{Handler, Peer, Secret, ServerConfig};
use hivefs_proto::{Request, Response};
use hivefs_types::ids::NodeType;
use libfuzzer_sys::fuzz_target;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

struct MustNotRun;

impl Handler for MustNotRun {
    async fn handle(&self, req: Request, _payload: Vec<u8>, _peer: &Peer) -> (Response, Vec<u8>) {
        panic!("an unauthenticated peer reached the handler with {req:?}");
    }
}

fuzz_target!(|data: &[u8]| {
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
    rt.block_on(async {
        let (mut client, server) = tokio::io::duplex(1 << 16);
        let mut cfg = ServerConfig::new(NodeType::Meta, Some(Secret::from_bytes(b"fuzz secret")));
        cfg.handshake_timeout = std::time::Duration::from_millis(50);
        let peer = Peer { addr: "127.0.0.1:1".parse().unwrap() };
        let task = tokio::spawn(serve_conn(server, peer, Arc::new(cfg), Arc::new(MustNotRun)));
        let _ = client.write_all(data).await;
        let _ = client.shutdown().await;
        let mut sink = Vec::new();
        let r = tokio::time::timeout(std::time::Duration::from_secs(5), client.read_to_end(&mut sink)).await;
        assert!(r.is_ok(), "server neither answered nor closed within 5 s");
        task.await.expect("the connection task must not panic");
    });
});
