//! The server side: accept loop, handshake, request dispatch with limits.
//!
//! What any peer can make a server hold is bounded (every limit is a field of
//! [`ServerConfig`]):
//! - connections per peer IP address, counted from `accept`, authenticated or
//!   not; more are closed at once;
//! - connections still in the handshake, and the handshake's deadline: a peer
//!   that sends nothing, or trickles, is dropped after `handshake_timeout`.
//!   When `max_handshakes` connections are in the handshake, a new one
//!   evicts the oldest: an honest peer completes its handshake in a round
//!   trip, so a flood of connections that never authenticate cannot lock
//!   honest peers out. Connections in the handshake never take one of the
//!   `max_connections` slots, which only authenticated connections hold;
//! - handshake frames are small ([`HELLO_MAX_BODY`], no payload); a peer that
//!   fails the handshake only ever gets a refusal and never reaches a handler;
//! - requests in flight per connection and per peer IP, and a server-wide
//!   budget of request bytes (body, payload and the data a read asks for).
//!   While a limit is reached the connection is not read further
//!   (backpressure): only the next frame's 24-byte header is read ahead;
//! - frame lengths are checked against the protocol limits before anything is
//!   allocated; a bad header is answered with an error and the connection
//!   closed.
//!
//! Refusals are logged at `warn` at most once per [`LOG_INTERVAL`] per kind
//! (with the number suppressed since), every one at `debug`.

use crate::auth::{nonce, Secret};
use crate::io::{read_frame_limited, read_header, read_rest, write_frame, ReadError};
use hivefs_proto::{
    decode_body, decode_request, encode_body, Envelope, FrameKind, Hello, Reply, Request, Response, MAX_BODY_LEN,
    MAX_PAYLOAD_LEN, PROTOCOL_VERSION,
};
use hivefs_types::error::{ErrorCode, FsError};
use hivefs_types::ids::NodeType;
use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::TcpListener;
use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};
use tracing::{debug, info, warn};

/// Largest handshake body accepted from a peer (a client hello is about 70 bytes).
pub const HELLO_MAX_BODY: u32 = 1024;
/// At most one `warn` per kind of refusal in this interval.
pub const LOG_INTERVAL: Duration = Duration::from_secs(10);

/// Who sent a request.
#[derive(Clone, Debug)]
pub struct Peer {
    pub addr: SocketAddr,
}

/// A service's request handler. Returns the response and a raw data payload
/// (empty unless the reply carries bytes, as `Reply::Data` does).
pub trait Handler: Send + Sync + 'static {
    /// Answers `req` (with the envelope it came in, empty when it had none)
    /// from `peer`; the answer's payload goes back after its body.
    fn handle(
        &self,
        env: Envelope,
        req: Request,
        payload: Vec<u8>,
        peer: &Peer,
    ) -> impl Future<Output = (Response, Vec<u8>)> + Send;

    /// Whether `req`, when it is its connection's only request in flight,
    /// is first run in the task that reads the connection (answered there
    /// if it ends without waiting, else it goes on in a task of its own).
    /// For requests that are mostly short CPU work; not for disk I/O,
    /// which would hold up the connection's next request.
    fn run_inline(&self, _req: &Request) -> bool {
        false
    }
}

#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub node_type: NodeType,
    /// `None` disables authentication (every peer is accepted).
    pub secret: Option<Secret>,
    /// Authenticated connections served at once; a peer that authenticates
    /// beyond this is refused.
    pub max_connections: usize,
    /// Connections from one IP address at once (in the handshake or
    /// authenticated); further ones are closed at once.
    pub max_connections_per_ip: usize,
    /// Connections in the handshake at once; a new one beyond this evicts
    /// the oldest still in the handshake.
    pub max_handshakes: usize,
    /// Requests of one connection handled at once; the connection is not
    /// read further until one finishes (backpressure).
    pub max_inflight_per_conn: usize,
    /// Requests of all connections from one IP address handled at once
    /// (backpressure as above).
    pub max_inflight_per_ip: usize,
    /// Bytes of requests held at once by the whole server: bodies, payloads
    /// and the data a read asks for (backpressure as above). At least one
    /// request of the largest size always fits.
    pub max_request_bytes: usize,
    /// A peer must complete the handshake within this time.
    pub handshake_timeout: Duration,
}

impl ServerConfig {
    pub fn new(node_type: NodeType, secret: Option<Secret>) -> Self {
        ServerConfig {
            node_type,
            secret,
            max_connections: 1024,
            max_connections_per_ip: 64,
            max_handshakes: 256,
            max_inflight_per_conn: 64,
            max_inflight_per_ip: 512,
            max_request_bytes: 128 << 20,
            handshake_timeout: Duration::from_secs(5),
        }
    }
}

pub struct ServerHandle {
    pub local_addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl ServerHandle {
    pub fn abort(&self) {
        self.task.abort();
    }
}

/// Kinds of refusal, each with its own log throttle.
#[derive(Clone, Copy)]
enum Refusal {
    Admission,
    Handshake,
    BadFrame,
}

/// Lets one warning through per [`LOG_INTERVAL`] and counts the rest.
#[derive(Default)]
struct Throttle {
    last: Mutex<Option<Instant>>,
    suppressed: AtomicU64,
}

impl Throttle {
    /// `Some(number suppressed since the last warning)` when a warning may be logged now.
    fn allow(&self) -> Option<u64> {
        let mut last = self.last.lock().expect("log throttle lock");
        let now = Instant::now();
        if last.is_some_and(|t| now.duration_since(t) < LOG_INTERVAL) {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        *last = Some(now);
        Some(self.suppressed.swap(0, Ordering::Relaxed))
    }
}

/// Per IP address: its connections and its in-flight requests.
struct IpState {
    conns: usize,
    inflight: Arc<Semaphore>,
}

/// Connections in the handshake, oldest first, each with its eviction signal.
#[derive(Default)]
struct Pending {
    next: u64,
    conns: BTreeMap<u64, oneshot::Sender<()>>,
}

/// State shared by all connections of one server.
struct Shared {
    cfg: Arc<ServerConfig>,
    conns: Arc<Semaphore>,
    pending: Mutex<Pending>,
    ips: Mutex<HashMap<IpAddr, IpState>>,
    bytes: Arc<Semaphore>,
    bytes_total: u32,
    throttles: [Throttle; 3],
}

impl Shared {
    fn new(cfg: Arc<ServerConfig>) -> Arc<Shared> {
        let floor = (MAX_BODY_LEN + 2 * MAX_PAYLOAD_LEN) as usize;
        let bytes_total = u32::try_from(cfg.max_request_bytes.max(floor)).unwrap_or(u32::MAX);
        Arc::new(Shared {
            conns: Arc::new(Semaphore::new(cfg.max_connections)),
            pending: Mutex::default(),
            ips: Mutex::default(),
            bytes: Arc::new(Semaphore::new(bytes_total as usize)),
            bytes_total,
            throttles: Default::default(),
            cfg,
        })
    }

    fn refused(&self, kind: Refusal, peer: SocketAddr, what: &str) {
        hivefs_metrics::refused(match kind {
            Refusal::Admission => "admission",
            Refusal::Handshake => "handshake",
            Refusal::BadFrame => "bad_frame",
        });
        match self.throttles[kind as usize].allow() {
            Some(0) => warn!(%peer, "{what}"),
            Some(n) => warn!(%peer, "{what} ({n} more refusals of this kind in the last {LOG_INTERVAL:?})"),
            None => debug!(%peer, "{what}"),
        }
    }

    /// Admits a new connection to the handshake, or says why not.
    fn admit(self: &Arc<Self>, peer: SocketAddr) -> Result<Admission, String> {
        let ip = peer.ip();
        let inflight = {
            let mut ips = self.ips.lock().expect("ip table lock");
            let st = ips.entry(ip).or_insert_with(|| IpState {
                conns: 0,
                inflight: Arc::new(Semaphore::new(self.cfg.max_inflight_per_ip.max(1))),
            });
            if st.conns >= self.cfg.max_connections_per_ip {
                return Err(format!(
                    "{ip} holds {} connections already (max_connections_per_ip); closing",
                    self.cfg.max_connections_per_ip
                ));
            }
            st.conns += 1;
            st.inflight.clone()
        };
        let (tx, evicted) = oneshot::channel();
        let mut pending = self.pending.lock().expect("handshake table lock");
        while pending.conns.len() >= self.cfg.max_handshakes.max(1) {
            let Some((_, oldest)) = pending.conns.pop_first() else { break };
            let _ = oldest.send(());
        }
        let seq = pending.next;
        pending.next += 1;
        pending.conns.insert(seq, tx);
        Ok(Admission { shared: self.clone(), ip, handshake: Some((seq, evicted)), inflight })
    }

    /// The connection `seq` left the handshake.
    fn handshake_done(&self, seq: u64) {
        self.pending.lock().expect("handshake table lock").conns.remove(&seq);
    }
}

/// A connection's claim on the server's limits; released on drop.
struct Admission {
    shared: Arc<Shared>,
    ip: IpAddr,
    /// While in the handshake: its place in the table and its eviction signal.
    handshake: Option<(u64, oneshot::Receiver<()>)>,
    inflight: Arc<Semaphore>,
}

impl Drop for Admission {
    fn drop(&mut self) {
        if let Some((seq, _)) = self.handshake.take() {
            self.shared.handshake_done(seq);
        }
        let mut ips = self.shared.ips.lock().expect("ip table lock");
        if let Some(st) = ips.get_mut(&self.ip) {
            st.conns -= 1;
            if st.conns == 0 {
                ips.remove(&self.ip);
            }
        }
    }
}

/// Binds `addr` and serves connections until the returned handle is aborted.
pub async fn serve<H: Handler>(addr: &str, cfg: ServerConfig, handler: Arc<H>) -> std::io::Result<ServerHandle> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| std::io::Error::new(e.kind(), format!("cannot listen on {addr}: {e}")))?;
    let local_addr = listener.local_addr()?;
    info!(%local_addr, node_type = %cfg.node_type, "listening");
    let shared = Shared::new(Arc::new(cfg));
    // Gauges read at scrape time, at no cost per request.
    let weak = Arc::downgrade(&shared);
    hivefs_metrics::on_scrape(move || {
        if let Some(sh) = weak.upgrade() {
            let m = hivefs_metrics::metrics();
            let l = hivefs_metrics::ServiceLabels { service: hivefs_metrics::service() };
            let held = sh.bytes_total as usize - sh.bytes.available_permits().min(sh.bytes_total as usize);
            m.request_bytes_held.get_or_create(&l).set(held as i64);
            let conns = sh.cfg.max_connections - sh.conns.available_permits().min(sh.cfg.max_connections);
            m.connections.get_or_create(&l).set(conns as i64);
        }
    });
    let task = tokio::spawn(async move {
        let accept_errors = Throttle::default();
        loop {
            let (stream, peer_addr) = match listener.accept().await {
                Ok(x) => x,
                Err(e) => {
                    // E.g. out of file descriptors: the connection waits in the backlog.
                    if let Some(n) = accept_errors.allow() {
                        warn!(%local_addr, "accept failed: {e} ({n} more since the last report)");
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let adm = match shared.admit(peer_addr) {
                Ok(a) => a,
                Err(why) => {
                    shared.refused(Refusal::Admission, peer_addr, &why);
                    drop(stream);
                    continue;
                }
            };
            let _ = stream.set_nodelay(true);
            let handler = handler.clone();
            tokio::spawn(run_conn(stream, Peer { addr: peer_addr }, adm, handler));
        }
    });
    Ok(ServerHandle { local_addr, task })
}

struct Outgoing {
    request_id: u64,
    body: Vec<u8>,
    payload: Vec<u8>,
    /// The request's claims on the limits, released once the reply is written.
    _held: Option<Held>,
}

struct Held {
    _conn: OwnedSemaphorePermit,
    _ip: OwnedSemaphorePermit,
    _bytes: OwnedSemaphorePermit,
}

fn error_reply(request_id: u64, e: FsError) -> Outgoing {
    let resp: Response = Err(e);
    Outgoing { request_id, body: encode_body(&resp), payload: Vec::new(), _held: None }
}

/// The handshake: returns the verdict, then the caller answers it. On
/// success the connection has taken one of the `max_connections` slots.
async fn handshake<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    shared: &Shared,
) -> Result<OwnedSemaphorePermit, String> {
    let cfg = &shared.cfg;
    let server_nonce = nonce();
    let hello = Hello::Server {
        protocol_version: PROTOCOL_VERSION,
        node_type: cfg.node_type,
        nonce: server_nonce,
        auth_required: cfg.secret.is_some(),
    };
    write_frame(stream, FrameKind::Hello, 0, 0, &encode_body(&hello), &[]).await.map_err(|e| e.to_string())?;
    stream.flush().await.map_err(|e| e.to_string())?;
    let verdict = match read_frame_limited(stream, HELLO_MAX_BODY, 0).await {
        Ok(f) if f.header.kind != FrameKind::Hello => Err("first frame is not a handshake".to_string()),
        Ok(f) => match decode_body::<Hello>(&f.body) {
            Ok(Hello::Client { protocol_version, nonce: client_nonce, mac }) => {
                if protocol_version != PROTOCOL_VERSION {
                    Err(format!("protocol version {protocol_version} not supported (server speaks {PROTOCOL_VERSION})"))
                } else if let Some(secret) = &cfg.secret {
                    if secret.verify(b"client", &server_nonce, &client_nonce, &mac) {
                        Ok(secret.mac(b"server", &client_nonce, &server_nonce))
                    } else {
                        Err("authentication failed: wrong shared secret".to_string())
                    }
                } else {
                    Ok(Vec::new())
                }
            }
            Ok(_) => Err("unexpected handshake message".to_string()),
            Err(e) => Err(format!("malformed handshake: {e}")),
        },
        Err(ReadError::Frame(e)) => Err(format!("malformed handshake frame: {e}")),
        // Nothing to answer on a broken or closed connection.
        Err(e) => return Err(format!("handshake: {e}")),
    };
    let (msg, result) = match verdict {
        Ok(mac) => match shared.conns.clone().try_acquire_owned() {
            Ok(permit) => (Hello::Accepted { mac }, Ok(permit)),
            // Full: close without a refusal, which a client would take for an
            // authentication failure; it retries as after a lost connection.
            Err(_) => {
                return Err(format!(
                    "server connection limit reached ({} authenticated connections); closing",
                    cfg.max_connections
                ))
            }
        },
        Err(reason) => (Hello::Refused { reason: reason.clone() }, Err(reason)),
    };
    write_frame(stream, FrameKind::Hello, 0, 0, &encode_body(&msg), &[]).await.map_err(|e| e.to_string())?;
    stream.flush().await.map_err(|e| e.to_string())?;
    result
}

/// Serves one connection on any byte stream (the transport seam), with
/// limits of its own (the connection is the server's only one).
pub async fn serve_conn<S, H>(stream: S, peer: Peer, cfg: Arc<ServerConfig>, handler: Arc<H>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    H: Handler,
{
    let shared = Shared::new(cfg);
    match shared.admit(peer.addr) {
        Ok(adm) => run_conn(stream, peer, adm, handler).await,
        Err(why) => shared.refused(Refusal::Admission, peer.addr, &why),
    }
}

/// Bytes a request holds while it runs: its frame plus the data a read asks for.
fn request_cost(req: &Request, frame_bytes: u32) -> u32 {
    match req {
        Request::ReadChunk { len, .. } | Request::NetBenchRead { len } => {
            frame_bytes.saturating_add((*len).min(MAX_PAYLOAD_LEN))
        }
        _ => frame_bytes,
    }
}

async fn run_conn<S, H>(mut stream: S, peer: Peer, mut adm: Admission, handler: Arc<H>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    H: Handler,
{
    let shared = adm.shared.clone();
    let cfg = shared.cfg.clone();
    let Some((seq, evicted)) = adm.handshake.as_mut() else { return };
    let seq = *seq;
    let outcome = tokio::select! {
        r = tokio::time::timeout(cfg.handshake_timeout, handshake(&mut stream, &shared)) => r,
        _ = evicted => {
            let why = format!(
                "{} connections in the handshake (max_handshakes): closing the oldest", cfg.max_handshakes
            );
            shared.refused(Refusal::Admission, peer.addr, &why);
            return;
        }
    };
    adm.handshake = None;
    shared.handshake_done(seq);
    let _conn_slot = match outcome {
        Ok(Ok(permit)) => {
            debug!(peer = %peer.addr, "peer authenticated");
            permit
        }
        Ok(Err(reason)) => {
            shared.refused(Refusal::Handshake, peer.addr, &format!("handshake refused: {reason}"));
            return;
        }
        Err(_) => {
            shared.refused(
                Refusal::Handshake,
                peer.addr,
                &format!("handshake not completed within {:?}; closing", cfg.handshake_timeout),
            );
            return;
        }
    };

    let (rd, wr) = tokio::io::split(stream);
    // Header, body and a small payload usually arrive in one read.
    let mut rd = BufReader::with_capacity(16 << 10, rd);
    let replies = Arc::new(Replies::new(wr));
    let max_inflight = cfg.max_inflight_per_conn.max(1);
    let conn_inflight = Arc::new(Semaphore::new(max_inflight));
    let in_flight = hivefs_metrics::metrics()
        .requests_in_flight
        .get_or_create_owned(&hivefs_metrics::ServiceLabels { service: hivefs_metrics::service() });
    let client = hivefs_metrics::client_counter(&peer.addr.ip().to_string());
    loop {
        let header = match read_header(&mut rd).await {
            Ok(h) => h,
            Err(ReadError::Closed) => break,
            Err(ReadError::Io(e)) => {
                debug!(peer = %peer.addr, "connection error: {e}");
                break;
            }
            Err(ReadError::Frame(e)) => {
                // The header itself is bad: the stream cannot be resynchronised.
                shared.refused(Refusal::BadFrame, peer.addr, &format!("malformed frame, closing connection: {e}"));
                let _ = replies.send(error_reply(0, FsError::new(ErrorCode::Protocol, e.to_string()))).await;
                break;
            }
        };
        // Backpressure: the body (and any later frame) is read only once the
        // request may run.
        let Ok(p_conn) = conn_inflight.clone().acquire_owned().await else { break };
        let Ok(p_ip) = adm.inflight.clone().acquire_owned().await else { break };
        let frame_bytes = header.body_len + header.payload_len;
        let Ok(mut p_bytes) = shared.bytes.clone().acquire_many_owned(frame_bytes.min(shared.bytes_total)).await else {
            break;
        };
        let frame = match read_rest(&mut rd, header).await {
            Ok(f) => f,
            Err(e) => {
                debug!(peer = %peer.addr, "connection error in a frame: {e}");
                break;
            }
        };
        let rid = frame.header.request_id;
        if frame.header.kind != FrameKind::Request {
            let e = FsError::new(ErrorCode::Protocol, format!("expected a request frame, got {:?}", frame.header.kind));
            if replies.send(error_reply(rid, e)).await.is_err() {
                break;
            }
            continue;
        }
        let (env, req) = match decode_request(frame.header.flags, &frame.body) {
            Ok(r) => r,
            Err(e) => {
                let what = format!("malformed request (type {}): {e}", frame.header.msg_type);
                shared.refused(Refusal::BadFrame, peer.addr, &what);
                if replies.send(error_reply(rid, FsError::new(ErrorCode::Protocol, e.to_string()))).await.is_err() {
                    break;
                }
                continue;
            }
        };
        let cost = request_cost(&req, frame_bytes).min(shared.bytes_total);
        if cost > frame_bytes {
            // Release before waiting for more, so no request holds part of
            // the budget while it waits for the rest.
            drop(p_bytes);
            let Ok(p) = shared.bytes.clone().acquire_many_owned(cost).await else { break };
            p_bytes = p;
        }
        let held = Held { _conn: p_conn, _ip: p_ip, _bytes: p_bytes };
        // The only request of the connection in flight: run here first.
        let lone = conn_inflight.available_permits() + 1 >= max_inflight && handler.run_inline(&req);
        let handler = handler.clone();
        let replies = replies.clone();
        let peer = peer.clone();
        let (in_flight, client) = (in_flight.clone(), client.clone());
        let fut = async move {
            let (op, uid, bytes_in) = (req.kind(), req.caller().map(|c| c.uid), frame.payload.len());
            let start = Instant::now();
            in_flight.inc();
            let (resp, payload) = match req {
                // Every service answers this one the same way.
                Request::Metrics => (Ok(Reply::Metrics(hivefs_metrics::render())), Vec::new()),
                req => handler.handle(env, req, frame.payload, &peer).await,
            };
            in_flight.dec();
            hivefs_metrics::served(op, start.elapsed(), resp.is_ok(), bytes_in, payload.len(), &client, uid);
            let _ =
                replies.send(Outgoing { request_id: rid, body: encode_body(&resp), payload, _held: Some(held) }).await;
        };
        if lone {
            // Most requests of a connection with one at a time in flight end
            // without waiting for anything (a read; a mutation that commits
            // in its own task, see the meta crate's writer): answered here,
            // with no task spawned and no other thread woken. One that waits
            // goes on in a task of its own.
            let mut fut = Box::pin(fut);
            let first = std::future::poll_fn(|cx| std::task::Poll::Ready(fut.as_mut().poll(cx))).await;
            if first.is_pending() {
                tokio::spawn(fut);
            }
        } else if std::mem::size_of_val(&fut) > SPAWN_BOX_MIN {
            // A large future is boxed once instead of being copied by value
            // through the spawn's frames into its task (see SPAWN_BOX_MIN).
            tokio::spawn(Box::pin(fut));
        } else {
            tokio::spawn(fut);
        }
    }
}

/// The replies of one connection. Whichever task has a small reply ready
/// writes it, with those queued meanwhile (one writes at a time; the others
/// queue and go on), and flushes once nothing more is queued: small replies
/// that end together share a `send`, and no task is woken only to write. A
/// reply with [`WRITE_APART_MIN`] bytes of data or more is written by a task
/// of its own, so the copy into the socket runs beside the next request's
/// work (measured: 1 MiB reads over TCP about 10 % slower written in the
/// request's task). A queued reply keeps its request's claims on the limits
/// until written.
struct Replies<W> {
    queue: Mutex<ReplyQueue>,
    w: tokio::sync::Mutex<BufWriter<W>>,
}

#[derive(Default)]
struct ReplyQueue {
    out: Vec<Outgoing>,
    /// A task is writing (and writes what is queued before it stops).
    writing: bool,
    /// A write failed: the connection is gone.
    broken: bool,
}

/// Replies with at least this much data are written by a task of their own.
const WRITE_APART_MIN: usize = 64 << 10;

impl<W: AsyncWrite + Unpin + Send + 'static> Replies<W> {
    fn new(w: W) -> Replies<W> {
        Replies { queue: Mutex::default(), w: tokio::sync::Mutex::new(BufWriter::with_capacity(64 << 10, w)) }
    }

    /// Queues `o` and writes the queue unless another task is writing.
    /// `Err`: the connection is gone.
    async fn send(self: &Arc<Self>, o: Outgoing) -> Result<(), ()> {
        let apart = o.payload.len() >= WRITE_APART_MIN;
        {
            let mut q = self.queue.lock().expect("replies");
            if q.broken {
                return Err(());
            }
            q.out.push(o);
            if std::mem::replace(&mut q.writing, true) {
                return Ok(());
            }
        }
        if apart {
            let me = self.clone();
            tokio::spawn(async move { me.write_queued().await });
            return Ok(());
        }
        self.write_queued().await
    }

    /// Writes what is queued until nothing is (this task has the role).
    async fn write_queued(&self) -> Result<(), ()> {
        let mut w = self.w.lock().await;
        let broken = |q: &mut ReplyQueue| {
            q.broken = true;
            q.writing = false;
            q.out.clear();
            Err(())
        };
        loop {
            let batch = std::mem::take(&mut self.queue.lock().expect("replies").out);
            if batch.is_empty() {
                let flushed = w.flush().await;
                let mut q = self.queue.lock().expect("replies");
                if flushed.is_err() {
                    return broken(&mut q);
                }
                if q.out.is_empty() {
                    q.writing = false;
                    return Ok(());
                }
                continue;
            }
            for o in &batch {
                if write_frame(&mut *w, FrameKind::Response, o.request_id, 0, &o.body, &o.payload).await.is_err() {
                    return broken(&mut self.queue.lock().expect("replies"));
                }
            }
        }
    }
}

/// Request futures larger than this many bytes are boxed before they are
/// spawned. The metadata handler's future is about 9 KiB (the largest state
/// of any request it serves); spawning it by value copied it several times
/// per request, 4-5 % of the metadata node's CPU in memcpy. The storage
/// handler's (about 1.3 KiB) stays unboxed.
const SPAWN_BOX_MIN: usize = 2048;

/// Helper for handlers: a reply without payload.
pub fn reply(r: Result<Reply, FsError>) -> (Response, Vec<u8>) {
    (r, Vec::new())
}
