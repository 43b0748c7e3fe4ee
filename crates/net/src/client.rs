//! The client side: multiplexed connections and bounded pools per peer.

use crate::auth::{nonce, Secret};
use crate::io::{frame_header, read_frame, write_frame};
use crate::send::Sender;
use crate::unavailable;
use bytes::Bytes;
use hivefs_proto::{
    decode_body, encode_body, encode_request, Envelope, FrameKind, Hello, Reply, Request, Response, PROTOCOL_VERSION,
};
use hivefs_types::error::{ErrorCode, FsError};
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncWriteExt, BufReader, BufWriter};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tracing::{debug, warn};

#[derive(Clone, Debug)]
pub struct ClientConfig {
    pub secret: Option<Secret>,
    pub connect_timeout: Duration,
    /// Time limit of one attempt of a request (send to reply).
    pub request_timeout: Duration,
    /// Time limit of a whole call, every attempt and reconnect included: a
    /// call to an unreachable peer fails after at most this long.
    pub deadline: Duration,
    /// Extra attempts for idempotent requests after a timeout or a lost
    /// connection (with backoff, and only while the deadline allows).
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
            deadline: Duration::from_secs(30),
            // In practice the deadline ends the retries first (backoff caps at 1 s).
            retries: 64,
            conns_per_peer: 4,
        }
    }

    /// One limit for everything: a call (attempts, reconnects, waits for a
    /// reply) fails after at most `t`.
    pub fn with_timeout(mut self, t: Duration) -> Self {
        self.request_timeout = t;
        self.deadline = t;
        self.connect_timeout = self.connect_timeout.min(t);
        self
    }
}

/// Milliseconds since the first use in this process: a cheap clock for
/// "when did this connection last hear from its peer".
fn now_ms() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START.get_or_init(std::time::Instant::now).elapsed().as_millis() as u64
}

type Waiter = oneshot::Sender<Result<(Response, Vec<u8>), FsError>>;

/// One authenticated connection with many requests in flight.
struct Conn {
    /// Requests are written by their callers (see `send`).
    sender: Arc<Sender>,
    pending: Arc<Mutex<HashMap<u64, Waiter>>>,
    next_id: AtomicU64,
    dead: Arc<AtomicBool>,
    inflight: AtomicUsize,
    /// When the last frame arrived from the peer ([`now_ms`]).
    last_rx: Arc<AtomicU64>,
    /// The reader task: it may wait forever on a peer that vanished, so it
    /// is aborted when the connection is dropped.
    reader: tokio::task::AbortHandle,
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.reader.abort();
        self.sender.stop();
    }
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
    // The handshake flushed everything it wrote.
    let sender = Arc::new(Sender::new(wr.into_inner(), dead.clone(), addr));
    let pending_r = pending.clone();
    let dead_r = dead.clone();
    let addr_r = addr.to_string();
    let last_rx = Arc::new(AtomicU64::new(now_ms()));
    let last_rx_r = last_rx.clone();
    let reader = tokio::spawn(async move {
        loop {
            match read_frame(&mut rd).await {
                Ok(f) => {
                    last_rx_r.store(now_ms(), Ordering::Relaxed);
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
    })
    .abort_handle();
    Ok(Conn { sender, pending, next_id: AtomicU64::new(1), dead, inflight: AtomicUsize::new(0), last_rx, reader })
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
    write_frame(wr, FrameKind::Hello, 0, 0, &encode_body(&hello), &[]).await.map_err(|e| unavailable(addr, e))?;
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
        (flags, body): (u16, Bytes),
        payload: Bytes,
        timeout: Duration,
    ) -> Result<(Response, Vec<u8>), FsError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let sent_at = now_ms();
        let (wtx, wrx) = oneshot::channel();
        self.pending.lock().expect("pending lock").insert(id, wtx);
        self.inflight.fetch_add(1, Ordering::Relaxed);
        let _guard = InflightGuard(&self.inflight);
        let exchange = async {
            let header = frame_header(FrameKind::Request, id, flags, &body, payload.len())
                .map_err(|e| FsError::new(ErrorCode::Invalid, format!("{addr}: request too large: {e}")))?;
            if !self.sender.send(header, body, payload) {
                return Err(unavailable(addr, "connection lost"));
            }
            wrx.await.unwrap_or_else(|_| Err(unavailable(addr, "connection lost")))
        };
        match tokio::time::timeout(timeout, exchange).await {
            Ok(r) => {
                if r.is_err() {
                    self.pending.lock().expect("pending lock").remove(&id);
                }
                r
            }
            Err(_) => {
                self.pending.lock().expect("pending lock").remove(&id);
                // A peer that sent nothing at all since this request went out is
                // unreachable (a cut link, a frozen host): give the connection up so
                // that later requests reconnect instead of queueing behind it. A busy
                // peer that answers other requests keeps its connection.
                if self.last_rx.load(Ordering::Relaxed) < sent_at {
                    warn!(peer = %addr, "no reply and nothing else heard within {timeout:?}; dropping the connection");
                    self.dead.store(true, Ordering::Release);
                }
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
    /// The node that served here now serves elsewhere ([`Pools::moved`]):
    /// calls still repeating stop at their next attempt.
    moved: AtomicBool,
}

impl Pool {
    pub fn new(addr: impl Into<String>, cfg: ClientConfig) -> Pool {
        Pool { addr: addr.into(), cfg, conns: tokio::sync::Mutex::new(Vec::new()), moved: AtomicBool::new(false) }
    }

    pub fn addr(&self) -> &str {
        &self.addr
    }

    async fn conn(&self) -> Result<Arc<Conn>, FsError> {
        let mut conns = self.conns.lock().await;
        if self.moved.load(Ordering::Acquire) {
            // Calls that queued here behind a connect to a node that moved
            // meanwhile go no further (each would wait out its own connect).
            return Err(unavailable(&self.addr, MOVED));
        }
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
    /// retried after a timeout or a lost connection, with backoff, at most
    /// `retries` times; the whole call never takes longer than `deadline`.
    /// The payload (a `Vec<u8>` or `Bytes`) is not copied, also not for retries.
    pub async fn call(&self, req: &Request, payload: impl Into<Bytes>) -> Result<(Reply, Vec<u8>), FsError> {
        self.call_with(&Envelope::default(), req, payload).await
    }

    /// Like [`Pool::call`], with an envelope (a metadata request's operation
    /// id and lease session); a request with an operation id is repeated
    /// like an idempotent one.
    pub async fn call_with(
        &self,
        env: &Envelope,
        req: &Request,
        payload: impl Into<Bytes>,
    ) -> Result<(Reply, Vec<u8>), FsError> {
        let start = std::time::Instant::now();
        let r = self.call_inner(env, req, payload.into()).await;
        hivefs_metrics::called(req.kind(), start.elapsed(), r.is_ok());
        r
    }

    async fn call_inner(&self, env: &Envelope, req: &Request, payload: Bytes) -> Result<(Reply, Vec<u8>), FsError> {
        // Encoded once; every attempt shares it.
        let (flags, body) = encode_request(env, req);
        let body = (flags, Bytes::from(body));
        let moved = || self.moved.load(Ordering::Acquire);
        repeat(&self.cfg, &self.addr, env, req, moved, |left| {
            let (body, payload) = (body.clone(), payload.clone());
            async move {
                let end = tokio::time::Instant::now() + left;
                match tokio::time::timeout(left, self.conn()).await {
                    Ok(Ok(c)) => {
                        let left = end.saturating_duration_since(tokio::time::Instant::now());
                        c.call(&self.addr, body, payload, self.cfg.request_timeout.min(left)).await
                    }
                    Ok(Err(e)) => Err(e),
                    Err(_) => Err(FsError::new(
                        ErrorCode::TimedOut,
                        format!("{}: could not connect within {:?}", self.addr, self.cfg.deadline),
                    )),
                }
            }
        })
        .await
    }

    /// Like [`Pool::call`] for requests without payload.
    pub async fn rpc(&self, req: &Request) -> Result<Reply, FsError> {
        self.call(req, Bytes::new()).await.map(|(r, _)| r)
    }

    /// Like [`Pool::call_with`] for requests without payload.
    pub async fn rpc_with(&self, env: &Envelope, req: &Request) -> Result<Reply, FsError> {
        self.call_with(env, req, Bytes::new()).await.map(|(r, _)| r)
    }
}

/// The retry policy of every call to `addr`, over TCP ([`Pool`]) or a
/// simulated network: `attempt(time left)` sends once and gives the answer
/// or the transport's error. A request that may be repeated
/// ([`Envelope::may_repeat`]) is sent again after a lost connection, a
/// timeout or a "not now" (`Unavailable`) answer, with backoff, at most
/// `cfg.retries` times; the whole call never takes longer than `cfg.deadline`.
/// Once `moved()` says the node left `addr`, no further attempt goes there:
/// the call fails with an error [`node_moved`] recognises, for its caller
/// to look the node up again.
pub async fn repeat<F, Fut>(
    cfg: &ClientConfig,
    addr: &str,
    env: &Envelope,
    req: &Request,
    moved: impl Fn() -> bool,
    mut attempt: F,
) -> Result<(Reply, Vec<u8>), FsError>
where
    F: FnMut(Duration) -> Fut,
    Fut: Future<Output = Result<(Response, Vec<u8>), FsError>>,
{
    let attempts = if env.may_repeat(req) { cfg.retries + 1 } else { 1 };
    let deadline = tokio::time::Instant::now() + cfg.deadline;
    let mut last = None;
    for n in 0..attempts {
        if n > 0 {
            let backoff = Duration::from_millis(100 << n.min(4)).min(Duration::from_secs(1));
            if tokio::time::Instant::now() + backoff >= deadline {
                break;
            }
            tokio::time::sleep(backoff).await;
        }
        if moved() {
            return Err(unavailable(addr, MOVED));
        }
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            break;
        }
        match attempt(left).await {
            Ok((Ok(reply), data)) => return Ok((reply, data)),
            // A service that is starting or stopping answers "not now": like a
            // lost connection, worth another attempt while the deadline allows.
            Ok((Err(e), _)) if e.code == ErrorCode::Unavailable => {
                debug!(peer = %addr, attempt = n, "service not ready: {e}");
                last = Some(e)
            }
            Ok((Err(e), _)) => return Err(e),
            Err(e) if matches!(e.code, ErrorCode::Unavailable | ErrorCode::TimedOut) => {
                debug!(peer = %addr, attempt = n, "request failed: {e}");
                last = Some(e)
            }
            Err(e) => return Err(e),
        }
    }
    Err(last
        .unwrap_or_else(|| FsError::new(ErrorCode::TimedOut, format!("{addr}: no reply within {:?}", cfg.deadline))))
}

const MOVED: &str = "the node moved to another address";

/// Whether a call failed because its node moved to another address (it
/// re-registered with mgmtd from there) while the call was repeating: the
/// caller looks the node up again and sends it there. Nothing was sent to the
/// old address after the node left it.
pub fn node_moved(e: &FsError) -> bool {
    e.code == ErrorCode::Unavailable && e.message.ends_with(MOVED)
}

/// The answer of a [`Call`]: the reply and its data payload.
pub type CallFuture<'a> = Pin<Box<dyn Future<Output = Result<(Reply, Vec<u8>), FsError>> + Send + 'a>>;

/// The way to one service: sends a request (with its envelope and data
/// payload) and waits for the answer, repeating it after a lost connection
/// when [`Envelope::may_repeat`] allows. Clients and services reach each
/// other only through this; [`Pool`] (TCP) is the implementation they run
/// with, and a simulation supplies another (see [`Pools::with_connector`]).
pub trait Call: Send + Sync + 'static {
    /// The service's address (for messages).
    fn addr(&self) -> &str;
    fn call_with<'a>(&'a self, env: &'a Envelope, req: &'a Request, payload: Bytes) -> CallFuture<'a>;
    /// The node that served at [`Call::addr`] serves elsewhere now: calls
    /// still repeating stop (see [`repeat`]). Nothing to do for a transport
    /// without repeats of its own.
    fn moved(&self) {}
}

impl Call for Pool {
    fn addr(&self) -> &str {
        Pool::addr(self)
    }

    fn call_with<'a>(&'a self, env: &'a Envelope, req: &'a Request, payload: Bytes) -> CallFuture<'a> {
        Box::pin(Pool::call_with(self, env, req, payload))
    }

    fn moved(&self) {
        self.moved.store(true, Ordering::Release);
    }
}

impl dyn Call {
    /// A request without envelope.
    pub async fn call(&self, req: &Request, payload: impl Into<Bytes>) -> Result<(Reply, Vec<u8>), FsError> {
        self.call_with(&Envelope::default(), req, payload.into()).await
    }

    /// A request without envelope and payload.
    pub async fn rpc(&self, req: &Request) -> Result<Reply, FsError> {
        self.call_with(&Envelope::default(), req, Bytes::new()).await.map(|(r, _)| r)
    }

    /// A request with an envelope, without payload.
    pub async fn rpc_with(&self, env: &Envelope, req: &Request) -> Result<Reply, FsError> {
        self.call_with(env, req, Bytes::new()).await.map(|(r, _)| r)
    }
}

/// Makes the [`Call`] for a service's address.
pub type Connector = Arc<dyn Fn(&str) -> Arc<dyn Call> + Send + Sync>;

/// The ways to every peer, by address: one [`Pool`] each, or what a
/// connector makes.
#[derive(Clone)]
pub struct Pools {
    cfg: ClientConfig,
    connect: Connector,
    /// Made by [`Pools::new`]: TCP pools built from `cfg`.
    tcp: bool,
    pools: Arc<Mutex<HashMap<String, Arc<dyn Call>>>>,
}

impl Pools {
    /// TCP pools with `cfg`.
    pub fn new(cfg: ClientConfig) -> Pools {
        let c = cfg.clone();
        let connect: Connector = Arc::new(move |addr: &str| Arc::new(Pool::new(addr, c.clone())) as Arc<dyn Call>);
        Pools { cfg, connect, tcp: true, pools: Arc::default() }
    }

    /// Pools whose calls `connect` makes (a simulated network).
    pub fn with_connector(cfg: ClientConfig, connect: Connector) -> Pools {
        Pools { cfg, connect, tcp: false, pools: Arc::default() }
    }

    /// Other pools to the same peers with `cfg` (TCP pools are made with it;
    /// a connector's calls stay the connector's), sharing no connection.
    pub fn with_config(&self, cfg: ClientConfig) -> Pools {
        if self.tcp {
            Pools::new(cfg)
        } else {
            Pools::with_connector(cfg, self.connect.clone())
        }
    }

    pub fn config(&self) -> &ClientConfig {
        &self.cfg
    }

    pub fn get(&self, addr: &str) -> Arc<dyn Call> {
        let mut m = self.pools.lock().expect("pools lock");
        m.entry(addr.to_string()).or_insert_with(|| (self.connect)(addr)).clone()
    }

    /// The node that served at `addr` moved elsewhere: calls repeating
    /// towards `addr` stop, and the next [`Pools::get`] of `addr` (some other
    /// node there one day) starts afresh.
    pub fn moved(&self, addr: &str) {
        if let Some(p) = self.pools.lock().expect("pools lock").remove(addr) {
            p.moved();
        }
    }
}

/// One request on a fresh connection (for admin tools and tests).
pub async fn call_once(addr: &str, cfg: &ClientConfig, req: &Request) -> Result<Reply, FsError> {
    Pool::new(addr, cfg.clone()).rpc(req).await
}
