//! Any byte stream sent to a server connection (authentication off, so the
//! bytes reach the request loop): the server answers or closes, and never
//! panics or hangs. Every service uses this loop with its own handler; the
//! handler here answers every decoded request, as the services do.
#![no_main]
use hivefs_net::server::serve_conn;
use hivefs_net::{Handler, Peer, ServerConfig};
use hivefs_proto::{Reply, Request, Response};
use hivefs_types::ids::NodeType;
use libfuzzer_sys::fuzz_target;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

struct Answer;

impl Handler for Answer {
    async fn handle(&self, req: Request, _payload: Vec<u8>, _peer: &Peer) -> (Response, Vec<u8>) {
        match req {
            Request::Ping => (Ok(Reply::Ok), Vec::new()),
            _ => (Err(hivefs_types::FsError::new(hivefs_types::ErrorCode::NotSupported, "fuzz")), Vec::new()),
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
    rt.block_on(async {
        let (mut client, server) = tokio::io::duplex(1 << 16);
        let mut cfg = ServerConfig::new(NodeType::Storage, None);
        cfg.handshake_timeout = std::time::Duration::from_millis(50);
        let peer = Peer { addr: "127.0.0.1:1".parse().unwrap() };
        let task = tokio::spawn(serve_conn(server, peer, Arc::new(cfg), Arc::new(Answer)));
        // A valid client hello first, so the fuzzed bytes reach the request loop.
        let hello = hivefs_proto::encode_body(&hivefs_proto::Hello::Client {
            protocol_version: hivefs_proto::PROTOCOL_VERSION,
            nonce: [0; 32],
            mac: Vec::new(),
        });
        let mut pre = Vec::new();
        hivefs_net::io::write_frame(&mut pre, hivefs_proto::FrameKind::Hello, 0, &hello, &[]).await.unwrap();
        let _ = client.write_all(&pre).await;
        let _ = client.write_all(data).await;
        let _ = client.shutdown().await;
        let mut sink = Vec::new();
        let r = tokio::time::timeout(std::time::Duration::from_secs(5), client.read_to_end(&mut sink)).await;
        assert!(r.is_ok(), "server neither answered nor closed within 5 s");
        let _ = task.await;
    });
});
