//! The transport over real TCP on 127.0.0.1: authentication, many requests in
//! flight, timeouts, and malformed input that must not disturb other peers.

use hivefs_net::{serve, ClientConfig, Handler, Peer, Pool, Secret, ServerConfig};
use hivefs_proto::{Reply, Request, Response};
use hivefs_types::ids::{EntryId, NodeId, NodeType, TargetId};
use hivefs_types::ErrorCode;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Echoes the payload of a write back as data; sleeps on ReadChunk with len 999.
/// A connection's lone request runs first in its reader's task (so the
/// tests here cover that path, a request that waits included).
struct Echo;

impl Handler for Echo {
    fn run_inline(&self, _req: &Request) -> bool {
        true
    }

    async fn handle(
        &self,
        env: hivefs_proto::Envelope,
        req: Request,
        payload: Vec<u8>,
        _peer: &Peer,
    ) -> (Response, Vec<u8>) {
        match req {
            Request::Ping => (Ok(Reply::Pong { node_type: NodeType::Storage, node: NodeId(1) }), Vec::new()),
            // Tells the envelope it came with: the node id is its lease client.
            Request::GetAttr { .. } => {
                let node = NodeId(env.lease_client.unwrap_or(0) as u32 + env.op.map_or(0, |o| o.seq as u32));
                (Ok(Reply::Pong { node_type: NodeType::Meta, node }), Vec::new())
            }
            Request::WriteChunk { .. } => (Ok(Reply::Data), payload),
            Request::ReadChunk { len: 999, .. } => {
                tokio::time::sleep(Duration::from_secs(5)).await;
                (Ok(Reply::Ok), Vec::new())
            }
            _ => (Err(hivefs_types::FsError::new(ErrorCode::NotSupported, "no")), Vec::new()),
        }
    }
}

async fn server(secret: Option<Secret>) -> String {
    let h = serve("127.0.0.1:0", ServerConfig::new(NodeType::Storage, secret), Arc::new(Echo)).await.unwrap();
    let addr = h.local_addr.to_string();
    std::mem::forget(h);
    addr
}

fn secret() -> Secret {
    Secret::from_bytes(b"correct horse")
}

#[tokio::test]
async fn an_envelope_reaches_the_handler_with_its_request() {
    let addr = server(None).await;
    let pool = Pool::new(addr, ClientConfig::new(None));
    let req = Request::GetAttr { id: EntryId::ROOT };
    let plain = pool.rpc(&req).await.unwrap();
    assert_eq!(plain, Reply::Pong { node_type: NodeType::Meta, node: NodeId(0) });
    let op = hivefs_proto::OpId { client: 3, seq: 40, done_below: 1 };
    let env = hivefs_proto::Envelope { op: Some(op), lease_client: Some(2), mirror: None };
    let r = pool.rpc_with(&env, &req).await.unwrap();
    assert_eq!(r, Reply::Pong { node_type: NodeType::Meta, node: NodeId(42) });
}

#[tokio::test]
async fn many_requests_in_flight_on_few_connections() {
    let addr = server(Some(secret())).await;
    let mut cfg = ClientConfig::new(Some(secret()));
    cfg.conns_per_peer = 2;
    let pool = Arc::new(Pool::new(addr, cfg));
    let mut tasks = Vec::new();
    for i in 0..200u32 {
        let pool = pool.clone();
        tasks.push(tokio::spawn(async move {
            let data: Vec<u8> = (0..(i * 97 % 70_000)).map(|x| (x ^ i) as u8).collect();
            let req = Request::WriteChunk { target: TargetId(1), entry: EntryId::ROOT, offset: 0 };
            let (r, back) = pool.call(&req, data.clone()).await.unwrap();
            assert_eq!(r, Reply::Data);
            assert_eq!(back, data, "request {i} got another request's payload");
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

#[tokio::test]
async fn wrong_or_missing_secret_is_refused() {
    let addr = server(Some(secret())).await;
    let wrong = Pool::new(addr.clone(), ClientConfig::new(Some(Secret::from_bytes(b"guess"))));
    let e = wrong.rpc(&Request::Ping).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::Auth, "{e}");
    assert!(e.message.contains("wrong shared secret"), "{e}");
    let none = Pool::new(addr.clone(), ClientConfig::new(None));
    assert_eq!(none.rpc(&Request::Ping).await.unwrap_err().code, ErrorCode::Auth);
    let right = Pool::new(addr, ClientConfig::new(Some(secret())));
    assert!(matches!(right.rpc(&Request::Ping).await.unwrap(), Reply::Pong { .. }));
}

#[tokio::test]
async fn a_client_holding_a_secret_refuses_a_server_that_cannot_prove_it() {
    let addr = server(None).await;
    let p = Pool::new(addr.clone(), ClientConfig::new(Some(secret())));
    assert_eq!(p.rpc(&Request::Ping).await.unwrap_err().code, ErrorCode::Auth);
    // With authentication disabled on both sides, the connection works.
    let open = Pool::new(addr, ClientConfig::new(None));
    assert!(open.rpc(&Request::Ping).await.is_ok());
}

#[tokio::test]
async fn requests_time_out_and_are_not_retried_forever() {
    let addr = server(Some(secret())).await;
    let mut cfg = ClientConfig::new(Some(secret()));
    cfg.request_timeout = Duration::from_millis(200);
    cfg.retries = 1;
    let p = Pool::new(addr, cfg);
    let start = std::time::Instant::now();
    let e = p
        .rpc(&Request::ReadChunk { target: TargetId(1), entry: EntryId::ROOT, offset: 0, len: 999 })
        .await
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::TimedOut, "{e}");
    assert!(start.elapsed() < Duration::from_secs(3));
}

/// A call repeating towards an address nobody answers on stops once
/// its node is known to have moved, with an error saying so, and a later
/// `get` of that address is a new pool.
#[tokio::test]
async fn a_repeating_call_stops_when_its_node_moved() {
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = dead.local_addr().unwrap().to_string();
    drop(dead);
    let mut cfg = ClientConfig::new(None);
    cfg.deadline = Duration::from_secs(3600);
    let pools = hivefs_net::Pools::new(cfg);
    let pool = pools.get(&addr);
    let first = pool.clone();
    let call = tokio::spawn(async move { pool.rpc(&Request::Ping).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!call.is_finished(), "the call should still be repeating");
    pools.moved(&addr);
    let e = tokio::time::timeout(Duration::from_secs(60), call).await.expect("stopped").unwrap().unwrap_err();
    assert!(hivefs_net::node_moved(&e), "{e}");
    assert!(!Arc::ptr_eq(&pools.get(&addr), &first), "a moved node's pool is not handed out again");
}

#[tokio::test]
async fn malformed_frames_close_only_that_connection() {
    let addr = server(Some(secret())).await;
    let good = Pool::new(addr.clone(), ClientConfig::new(Some(secret())));
    assert!(good.rpc(&Request::Ping).await.is_ok());
    let bad_inputs: Vec<Vec<u8>> = vec![
        b"GET / HTTP/1.1\r\n\r\n".to_vec(),
        vec![0u8; 24],
        {
            // Valid magic and version, a 4 GiB body: refused before allocation.
            let mut h = vec![0x46, 0x48, 1, 3, 0, 0, 0, 0];
            h.extend_from_slice(&0u64.to_le_bytes());
            h.extend_from_slice(&u32::MAX.to_le_bytes());
            h.extend_from_slice(&0u32.to_le_bytes());
            h
        },
        vec![0x46, 0x48, 1], // truncated header, then EOF
    ];
    for junk in bad_inputs {
        let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
        let _ = s.write_all(&junk).await;
        let _ = s.shutdown().await;
        let mut buf = Vec::new();
        let r = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut buf)).await;
        assert!(r.is_ok(), "server must close a connection sending junk, not hang");
    }
    assert!(good.rpc(&Request::Ping).await.is_ok(), "other peers keep being served");
}

/// Round-trip latency of one request at a time (a benchmark, not a test:
/// `cargo test --release -p hivefs-net --test transport -- --ignored --nocapture`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn sequential_round_trip_latency() {
    let addr = server(Some(secret())).await;
    let p = Pool::new(addr, ClientConfig::new(Some(secret())));
    p.rpc(&Request::Ping).await.unwrap();
    let n = 20_000;
    let start = std::time::Instant::now();
    for _ in 0..n {
        p.rpc(&Request::Ping).await.unwrap();
    }
    let per = start.elapsed() / n;
    println!("sequential ping round trip: {per:?}");
}

async fn server_with(cfg: ServerConfig, h: impl Handler) -> String {
    let h = serve("127.0.0.1:0", cfg, Arc::new(h)).await.unwrap();
    let addr = h.local_addr.to_string();
    std::mem::forget(h);
    addr
}

/// Reads until the server closes the connection (EOF or reset); returns what
/// was read, or `None` if it stayed open for `limit`.
async fn until_closed(s: &mut tokio::net::TcpStream, limit: Duration) -> Option<Vec<u8>> {
    let mut got = Vec::new();
    let r = tokio::time::timeout(limit, async {
        let mut buf = [0u8; 4096];
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    r.ok().map(|()| got)
}

#[tokio::test]
async fn idle_and_slow_peers_are_dropped_and_free_their_slots() {
    let mut cfg = ServerConfig::new(NodeType::Storage, Some(secret()));
    cfg.max_connections_per_ip = 4;
    cfg.handshake_timeout = Duration::from_millis(500);
    let addr = server_with(cfg, Echo).await;
    // Four idle peers take all of 127.0.0.1's slots...
    let mut idle = Vec::new();
    for _ in 0..4 {
        idle.push(tokio::net::TcpStream::connect(&addr).await.unwrap());
    }
    // ...so the next is closed at once, before any handshake byte.
    let mut fifth = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let got = until_closed(&mut fifth, Duration::from_secs(5)).await.expect("over the per-IP limit: closed");
    assert!(got.is_empty(), "a refused connection gets no handshake, got {} bytes", got.len());
    // The idle peers are dropped at the handshake deadline.
    for s in &mut idle {
        assert!(until_closed(s, Duration::from_secs(5)).await.is_some(), "idle peer not dropped");
    }
    // A peer trickling its hello (one byte per 100 ms) is dropped by the same deadline.
    let mut slow = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let started = std::time::Instant::now();
    let mut hello = Vec::new();
    hivefs_net::io::write_frame(
        &mut hello,
        hivefs_proto::FrameKind::Hello,
        0,
        0,
        &hivefs_proto::encode_body(&hivefs_proto::Hello::Client {
            protocol_version: hivefs_proto::PROTOCOL_VERSION,
            nonce: [7; 32],
            mac: vec![0; 32],
        }),
        &[],
    )
    .await
    .unwrap();
    let mut closed = false;
    for b in hello {
        if slow.write_all(&[b]).await.is_err() {
            closed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(closed || until_closed(&mut slow, Duration::from_secs(5)).await.is_some());
    assert!(started.elapsed() < Duration::from_secs(5), "trickling peer held on for {:?}", started.elapsed());
    // The slots are free again: an honest client gets in.
    let good = Pool::new(addr, ClientConfig::new(Some(secret())));
    assert!(good.rpc(&Request::Ping).await.is_ok());
}

#[tokio::test]
async fn a_flood_of_unfinished_handshakes_cannot_lock_out_honest_peers() {
    let mut cfg = ServerConfig::new(NodeType::Storage, Some(secret()));
    cfg.max_handshakes = 8;
    cfg.max_connections_per_ip = 1000;
    cfg.handshake_timeout = Duration::from_secs(60);
    let addr = server_with(cfg, Echo).await;
    let mut idle = Vec::new();
    for _ in 0..50 {
        idle.push(tokio::net::TcpStream::connect(&addr).await.unwrap());
    }
    // The oldest idle peers were evicted to keep at most 8 in the handshake.
    let first = until_closed(&mut idle[0], Duration::from_secs(10)).await;
    assert!(first.is_some(), "the oldest unfinished handshake must be evicted");
    let mut cc = ClientConfig::new(Some(secret()));
    cc.retries = 0;
    let good = Pool::new(addr, cc);
    assert!(good.rpc(&Request::Ping).await.is_ok(), "an honest peer gets through a handshake flood");
}

/// Counts requests being handled at once; each waits for a permit of `gate`.
struct Gate {
    gate: Arc<tokio::sync::Semaphore>,
    cur: Arc<std::sync::atomic::AtomicUsize>,
    max: Arc<std::sync::atomic::AtomicUsize>,
}

impl Handler for Gate {
    async fn handle(
        &self,
        _env: hivefs_proto::Envelope,
        _req: Request,
        _payload: Vec<u8>,
        _peer: &Peer,
    ) -> (Response, Vec<u8>) {
        use std::sync::atomic::Ordering::SeqCst;
        let now = self.cur.fetch_add(1, SeqCst) + 1;
        self.max.fetch_max(now, SeqCst);
        self.gate.acquire().await.unwrap().forget();
        self.cur.fetch_sub(1, SeqCst);
        (Ok(Reply::Ok), Vec::new())
    }
}

#[tokio::test]
async fn inflight_requests_are_bounded_per_connection_and_per_ip() {
    use std::sync::atomic::Ordering::SeqCst;
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let cur = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let max = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut cfg = ServerConfig::new(NodeType::Storage, Some(secret()));
    cfg.max_inflight_per_conn = 4;
    cfg.max_inflight_per_ip = 6;
    let addr = server_with(cfg, Gate { gate: gate.clone(), cur: cur.clone(), max: max.clone() }).await;
    let wait_for = |n: usize| {
        let cur = cur.clone();
        async move {
            let start = std::time::Instant::now();
            while cur.load(SeqCst) < n {
                assert!(start.elapsed() < Duration::from_secs(10), "{} in flight, expected {n}", cur.load(SeqCst));
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    };
    let mut tasks = Vec::new();
    let mut fire = |n: usize| {
        let mut cc = ClientConfig::new(Some(secret()));
        cc.conns_per_peer = 1;
        let pool = Arc::new(Pool::new(addr.clone(), cc));
        for _ in 0..n {
            let pool = pool.clone();
            tasks.push(tokio::spawn(async move { pool.rpc(&Request::Ping).await }));
        }
    };
    // One connection: at most 4 of its 20 requests run at once.
    fire(20);
    wait_for(4).await;
    // A second connection from the same IP adds only 2 more (6 per IP).
    fire(20);
    wait_for(6).await;
    gate.add_permits(40);
    for t in tasks {
        assert_eq!(t.await.unwrap().unwrap(), Reply::Ok);
    }
    assert_eq!(max.load(SeqCst), 6, "in-flight requests of one IP exceeded the bound");
}
