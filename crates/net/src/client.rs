//! The client side: multiplexed connections and bounded pools per peer.

use crate::auth::{nonce, Secret};
use crate::io::{read_frame, write_frame};
use crate::unavailable;
use hivefs_proto::{decode_body, encode_body, FrameKind, Hello, Reply, Request, Response, PROTOCOL_VERSION};
use hivefs_types::error::{ErrorCode, FsError};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncWriteExt, BufReader, BufWriter};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, warn};

#[derive(Clone, Debug)]
pub struct ClientConfig {
    pub secret: Option<Secret>,
    pub connect_timeout: Duration,
    /// Time limit of one request (send to reply).
    pub request_timeout: Duration,
    /// Extra attempts for idempotent requests after a timeout or a lost connection.
    pub retries: u32,
    /// Connections per peer (`conn_max_internode`).
    pub conns_per_peer: usize,
}

impl ClientConfig {
    pub fn new(secret: Option<Secret>) -> Self {
        ClientConfig {
            secret,
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(30),
            retries: 2,
            conns_per_peer: 4,
        }
    }
}

type Waiter = oneshot::Sender<Result<(Response, Vec<u8>), FsError>>;

struct Outgoing {
    request_id: u64,
    body: Vec<u8>,
    payload: Vec<u8>,
}

/// One authenticated connection with many requests in flight.
struct Conn {
    tx: mpsc::Sender<Outgoing>,
    pending: Arc<Mutex<HashMap<u64, Waiter>>>,
    next_id: AtomicU64,
    dead: Arc<AtomicBool>,
    inflight: AtomicUsize,
}

async fn connect(addr: &str, cfg: &ClientConfig) -> Result<Conn, FsError> {
    let stream = tokio::time::timeout(cfg.connect_timeout, TcpStream::connect(addr))
        .await
        .map_err(|_| FsError::new(ErrorCode::TimedOut, format!("{addr}: connect timed out")))?
        .map_err(|e| unavailable(addr, format_args!("cannot connect: {e}")))?;
    let _ = stream.set_nodelay(true);
    let (rd, wr) = stream.into_split();
    let mut rd = BufReader::with_capacity(64 << 10, rd);
    let mut wr = BufWriter::with_capacity(64 << 10, wr);
    tokio::time::timeout(cfg.connect_timeout, client_handshake(addr, &mut rd, &mut wr, cfg))
        .await
        .map_err(|_| FsError::new(ErrorCode::TimedOut, format!("{addr}: handshake timed out")))??;

    let pending: Arc<Mutex<HashMap<u64, Waiter>>> = Arc::default();
    let dead = Arc::new(AtomicBool::new(false));
    let (tx, mut rx) = mpsc::channel::<Outgoing>(256);
    let dead_w = dead.clone();
    let addr_w = addr.to_string();
    tokio::spawn(async move {
        while let Some(out) = rx.recv().await {
            let r = write_frame(&mut wr, FrameKind::Request, out.request_id, &out.body, &out.payload).await;
            let r = match r {
                Ok(()) if rx.is_empty() => wr.flush().await,
                r => r,
            };
            if let Err(e) = r {
                debug!(peer = %addr_w, "write failed: {e}");
                dead_w.store(true, Ordering::Release);
                return;
            }
        }
    });
    let pending_r = pending.clone();
    let dead_r = dead.clone();
    let addr_r = addr.to_string();
    tokio::spawn(async move {
        loop {
            match read_frame(&mut rd).await {
                Ok(f) => {
                    let resp = decode_body::<Response>(&f.body)
                        .map_err(|e| FsError::new(ErrorCode::Protocol, format!("{addr_r}: malformed reply: {e}")));
                    let waiter = pending_r.lock().expect("pending lock").remove(&f.header.request_id);
                    match (waiter, resp) {
                        (Some(w), Ok(r)) => {
                            let _ = w.send(Ok((r, f.payload)));
                        }
                        (Some(w), Err(e)) => {
                            let _ = w.send(Err(e));
                        }
                        (None, Ok(Err(e))) if f.header.request_id == 0 => {
                            warn!(peer = %addr_r, "server closed the connection: {e}");
                            break;
                        }
                        (None, _) => debug!(peer = %addr_r, "reply for unknown request {}", f.header.request_id),
                    }
                }
                Err(e) => {
                    debug!(peer = %addr_r, "connection lost: {e}");
                    break;
                }
            }
        }
        dead_r.store(true, Ordering::Release);
        for (_, w) in pending_r.lock().expect("pending lock").drain() {
            let _ = w.send(Err(unavailable(&addr_r, "connection lost")));
        }
    });
    Ok(Conn { tx, pending, next_id: AtomicU64::new(1), dead, inflight: AtomicUsize::new(0) })
}

async fn client_handshake<R, W>(addr: &str, rd: &mut R, wr: &mut W, cfg: &ClientConfig) -> Result<(), FsError>
where
    R: tokio::io::AsyncRead + Unpin,
    W: tokio::io::AsyncWrite + Unpin,
{
    let proto = |m: String| FsError::new(ErrorCode::Protocol, format!("{addr}: {m}"));
    let f = read_frame(rd).await.map_err(|e| unavailable(addr, format_args!("handshake: {e}")))?;
    let Ok(Hello::Server { protocol_version, nonce: server_nonce, auth_required, .. }) = decode_body::<Hello>(&f.body)
    else {
        return Err(proto("peer did not start with a HiveFS handshake".into()));
    };
    if protocol_version != PROTOCOL_VERSION {
        return Err(proto(format!("peer speaks protocol {protocol_version}, we speak {PROTOCOL_VERSION}")));
    }
    let client_nonce = nonce();
    let mac = match &cfg.secret {
        // A server that does not ask for the secret cannot prove it has it either.
        Some(_) if !auth_required => {
            return Err(FsError::new(
                ErrorCode::Auth,
                format!("{addr}: server does not authenticate, but we hold a shared secret; refusing it"),
            ))
        }
        Some(s) => s.mac(b"client", &server_nonce, &client_nonce),
        None if auth_required => {
            return Err(FsError::new(
                ErrorCode::Auth,
                format!("{addr}: server requires authentication but no shared secret is configured"),
            ))
        }
        None => Vec::new(),
    };
    let hello = Hello::Client { protocol_version: PROTOCOL_VERSION, nonce: client_nonce, mac };
    write_frame(wr, FrameKind::Hello, 0, &encode_body(&hello), &[]).await.map_err(|e| unavailable(addr, e))?;
    wr.flush().await.map_err(|e| unavailable(addr, e))?;
    let f = read_frame(rd).await.map_err(|e| unavailable(addr, format_args!("handshake: {e}")))?;
    match decode_body::<Hello>(&f.body) {
        Ok(Hello::Accepted { mac }) => {
            if let Some(s) = &cfg.secret {
                if !s.verify(b"server", &client_nonce, &server_nonce, &mac) {
                    return Err(FsError::new(
                        ErrorCode::Auth,
                        format!("{addr}: server failed to prove the shared secret"),
                    ));
                }
            }
            Ok(())
        }
        Ok(Hello::Refused { reason }) => Err(FsError::new(ErrorCode::Auth, format!("{addr} refused us: {reason}"))),
        _ => Err(proto("malformed handshake reply".into())),
    }
}

impl Conn {
    fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }

    async fn call(
        &self,
        addr: &str,
        body: Vec<u8>,
        payload: Vec<u8>,
        timeout: Duration,
    ) -> Result<(Response, Vec<u8>), FsError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (wtx, wrx) = oneshot::channel();
        self.pending.lock().expect("pending lock").insert(id, wtx);
        self.inflight.fetch_add(1, Ordering::Relaxed);
        let _guard = InflightGuard(&self.inflight);
        if self.tx.send(Outgoing { request_id: id, body, payload }).await.is_err() {
            self.pending.lock().expect("pending lock").remove(&id);
            return Err(unavailable(addr, "connection lost"));
        }
        match tokio::time::timeout(timeout, wrx).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => Err(unavailable(addr, "connection lost")),
            Err(_) => {
                self.pending.lock().expect("pending lock").remove(&id);
                Err(FsError::new(ErrorCode::TimedOut, format!("{addr}: no reply within {timeout:?}")))
            }
        }
    }
}

struct InflightGuard<'a>(&'a AtomicUsize);
impl Drop for InflightGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Connections to one peer: at most `conns_per_peer`, opened on demand,
/// replaced when they die; a request goes to the least busy one.
pub struct Pool {
    addr: String,
    cfg: ClientConfig,
    conns: tokio::sync::Mutex<Vec<Arc<Conn>>>,
}

impl Pool {
    pub fn new(addr: impl Into<String>, cfg: ClientConfig) -> Pool {
        Pool { addr: addr.into(), cfg, conns: tokio::sync::Mutex::new(Vec::new()) }
    }

    pub fn addr(&self) -> &str {
        &self.addr
    }

    async fn conn(&self) -> Result<Arc<Conn>, FsError> {
        let mut conns = self.conns.lock().await;
        conns.retain(|c| !c.is_dead());
        let best = conns.iter().min_by_key(|c| c.inflight.load(Ordering::Relaxed)).cloned();
        match best {
            Some(c) if c.inflight.load(Ordering::Relaxed) == 0 || conns.len() >= self.cfg.conns_per_peer => Ok(c),
            _ => {
                let c = Arc::new(connect(&self.addr, &self.cfg).await?);
                conns.push(c.clone());
                Ok(c)
            }
        }
    }

    /// Sends a request and waits for its reply. Idempotent requests are
    /// retried after a timeout or lost connection, a bounded number of times.
    pub async fn call(&self, req: &Request, payload: Vec<u8>) -> Result<(Reply, Vec<u8>), FsError> {
        let body = encode_body(req);
        let attempts = if req.is_idempotent() { self.cfg.retries + 1 } else { 1 };
        let mut payload = Some(payload);
        let mut last = None;
        for attempt in 0..attempts {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_millis(100 << attempt.min(5))).await;
            }
            let r = match self.conn().await {
                Ok(c) => {
                    // Only the last attempt takes the payload; earlier ones send a copy.
                    let p = if attempt + 1 == attempts {
                        payload.take().unwrap_or_default()
                    } else {
                        payload.clone().unwrap_or_default()
                    };
                    c.call(&self.addr, body.clone(), p, self.cfg.request_timeout).await
                }
                Err(e) => Err(e),
            };
            match r {
                Ok((Ok(reply), data)) => return Ok((reply, data)),
                Ok((Err(e), _)) => return Err(e),
                Err(e) if matches!(e.code, ErrorCode::Unavailable | ErrorCode::TimedOut) => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.expect("at least one attempt"))
    }

    /// Like [`Pool::call`] for requests without payload.
    pub async fn rpc(&self, req: &Request) -> Result<Reply, FsError> {
        self.call(req, Vec::new()).await.map(|(r, _)| r)
    }
}

/// Pools for all peers, by address.
#[derive(Clone)]
pub struct Pools {
    cfg: ClientConfig,
    pools: Arc<Mutex<HashMap<String, Arc<Pool>>>>,
}

impl Pools {
    pub fn new(cfg: ClientConfig) -> Pools {
        Pools { cfg, pools: Arc::default() }
    }

    pub fn config(&self) -> &ClientConfig {
        &self.cfg
    }

    pub fn get(&self, addr: &str) -> Arc<Pool> {
        let mut m = self.pools.lock().expect("pools lock");
        m.entry(addr.to_string()).or_insert_with(|| Arc::new(Pool::new(addr, self.cfg.clone()))).clone()
    }
}

/// One request on a fresh connection (for admin tools and tests).
pub async fn call_once(addr: &str, cfg: &ClientConfig, req: &Request) -> Result<Reply, FsError> {
    Pool::new(addr, cfg.clone()).rpc(req).await
}
