//! The server side: accept loop, handshake, request dispatch with limits.

use crate::auth::{nonce, Secret};
use crate::io::{read_frame, write_frame, ReadError};
use hivefs_proto::{decode_body, encode_body, FrameKind, Hello, Reply, Request, Response, PROTOCOL_VERSION};
use hivefs_types::error::{ErrorCode, FsError};
use hivefs_types::ids::NodeType;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, Semaphore};
use tracing::{debug, info, warn};

/// Who sent a request.
#[derive(Clone, Debug)]
pub struct Peer {
    pub addr: SocketAddr,
}

/// A service's request handler. Returns the response and a raw data payload
/// (empty unless the reply carries bytes, as `Reply::Data` does).
pub trait Handler: Send + Sync + 'static {
    fn handle(&self, req: Request, payload: Vec<u8>, peer: &Peer) -> impl Future<Output = (Response, Vec<u8>)> + Send;
}

#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub node_type: NodeType,
    /// `None` disables authentication (every peer is accepted).
    pub secret: Option<Secret>,
    /// Connections served at once; further connections are refused.
    pub max_connections: usize,
    /// Requests of one connection handled at once; the connection is not
    /// read further until one finishes (backpressure).
    pub max_inflight_per_conn: usize,
    pub handshake_timeout: Duration,
}

impl ServerConfig {
    pub fn new(node_type: NodeType, secret: Option<Secret>) -> Self {
        ServerConfig {
            node_type,
            secret,
            max_connections: 1024,
            max_inflight_per_conn: 64,
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

/// Binds `addr` and serves connections until the returned handle is aborted.
pub async fn serve<H: Handler>(addr: &str, cfg: ServerConfig, handler: Arc<H>) -> std::io::Result<ServerHandle> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| std::io::Error::new(e.kind(), format!("cannot listen on {addr}: {e}")))?;
    let local_addr = listener.local_addr()?;
    info!(%local_addr, node_type = %cfg.node_type, "listening");
    let cfg = Arc::new(cfg);
    let conns = Arc::new(Semaphore::new(cfg.max_connections));
    let task = tokio::spawn(async move {
        loop {
            let (stream, peer_addr) = match listener.accept().await {
                Ok(x) => x,
                Err(e) => {
                    warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let _ = stream.set_nodelay(true);
            let Ok(permit) = conns.clone().try_acquire_owned() else {
                warn!(%peer_addr, "connection limit reached; refusing");
                drop(stream);
                continue;
            };
            let cfg = cfg.clone();
            let handler = handler.clone();
            tokio::spawn(async move {
                let _permit = permit;
                serve_conn(stream, Peer { addr: peer_addr }, cfg, handler).await;
            });
        }
    });
    Ok(ServerHandle { local_addr, task })
}

struct Outgoing {
    request_id: u64,
    body: Vec<u8>,
    payload: Vec<u8>,
}

async fn handshake<S: AsyncRead + AsyncWrite + Unpin>(stream: &mut S, cfg: &ServerConfig) -> Result<(), String> {
    let server_nonce = nonce();
    let hello = Hello::Server {
        protocol_version: PROTOCOL_VERSION,
        node_type: cfg.node_type,
        nonce: server_nonce,
        auth_required: cfg.secret.is_some(),
    };
    write_frame(stream, FrameKind::Hello, 0, &encode_body(&hello), &[]).await.map_err(|e| e.to_string())?;
    stream.flush().await.map_err(|e| e.to_string())?;
    let f = read_frame(stream).await.map_err(|e| e.to_string())?;
    if f.header.kind != FrameKind::Hello {
        return Err("first frame is not a handshake".into());
    }
    let refuse = |reason: String| Hello::Refused { reason };
    let reply = match decode_body::<Hello>(&f.body) {
        Ok(Hello::Client { protocol_version, nonce: client_nonce, mac }) => {
            if protocol_version != PROTOCOL_VERSION {
                Err(refuse(format!(
                    "protocol version {protocol_version} not supported (server speaks {PROTOCOL_VERSION})"
                )))
            } else if let Some(secret) = &cfg.secret {
                if secret.verify(b"client", &server_nonce, &client_nonce, &mac) {
                    Ok(Hello::Accepted { mac: secret.mac(b"server", &client_nonce, &server_nonce) })
                } else {
                    Err(refuse("authentication failed: wrong shared secret".into()))
                }
            } else {
                Ok(Hello::Accepted { mac: Vec::new() })
            }
        }
        Ok(_) => Err(refuse("unexpected handshake message".into())),
        Err(e) => Err(refuse(format!("malformed handshake: {e}"))),
    };
    let (msg, result) = match reply {
        Ok(m) => (m, Ok(())),
        Err(m) => {
            let reason = match &m {
                Hello::Refused { reason } => reason.clone(),
                _ => unreachable!(),
            };
            (m, Err(reason))
        }
    };
    write_frame(stream, FrameKind::Hello, 0, &encode_body(&msg), &[]).await.map_err(|e| e.to_string())?;
    stream.flush().await.map_err(|e| e.to_string())?;
    result
}

/// Serves one connection on any byte stream (the transport seam).
pub async fn serve_conn<S, H>(mut stream: S, peer: Peer, cfg: Arc<ServerConfig>, handler: Arc<H>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    H: Handler,
{
    match tokio::time::timeout(cfg.handshake_timeout, handshake(&mut stream, &cfg)).await {
        Ok(Ok(())) => debug!(peer = %peer.addr, "peer authenticated"),
        Ok(Err(reason)) => {
            warn!(peer = %peer.addr, "handshake refused: {reason}");
            return;
        }
        Err(_) => {
            warn!(peer = %peer.addr, "handshake timed out");
            return;
        }
    }
    let (mut rd, wr) = tokio::io::split(stream);
    let (tx, mut rx) = mpsc::channel::<Outgoing>(cfg.max_inflight_per_conn);
    let writer = tokio::spawn(async move {
        let mut w = BufWriter::with_capacity(64 << 10, wr);
        while let Some(out) = rx.recv().await {
            if write_frame(&mut w, FrameKind::Response, out.request_id, &out.body, &out.payload).await.is_err() {
                return;
            }
            // Flush only when nothing else is queued: batches small replies.
            if rx.is_empty() && w.flush().await.is_err() {
                return;
            }
        }
    });
    let inflight = Arc::new(Semaphore::new(cfg.max_inflight_per_conn));
    loop {
        let frame = match read_frame(&mut rd).await {
            Ok(f) => f,
            Err(ReadError::Closed) => break,
            Err(ReadError::Io(e)) => {
                debug!(peer = %peer.addr, "connection error: {e}");
                break;
            }
            Err(ReadError::Frame(e)) => {
                // The header itself is bad: the stream cannot be resynchronised.
                warn!(peer = %peer.addr, "malformed frame, closing connection: {e}");
                let resp: Response = Err(FsError::new(ErrorCode::Protocol, e.to_string()));
                let _ = tx.send(Outgoing { request_id: 0, body: encode_body(&resp), payload: Vec::new() }).await;
                break;
            }
        };
        let rid = frame.header.request_id;
        if frame.header.kind != FrameKind::Request {
            let resp: Response = Err(FsError::new(ErrorCode::Protocol, "expected a request frame"));
            let _ = tx.send(Outgoing { request_id: rid, body: encode_body(&resp), payload: Vec::new() }).await;
            continue;
        }
        let req = match decode_body::<Request>(&frame.body) {
            Ok(r) => r,
            Err(e) => {
                warn!(peer = %peer.addr, msg_type = frame.header.msg_type, "malformed request: {e}");
                let resp: Response = Err(FsError::new(ErrorCode::Protocol, e.to_string()));
                if tx.send(Outgoing { request_id: rid, body: encode_body(&resp), payload: Vec::new() }).await.is_err() {
                    break;
                }
                continue;
            }
        };
        let Ok(permit) = inflight.clone().acquire_owned().await else { break };
        let handler = handler.clone();
        let tx = tx.clone();
        let peer = peer.clone();
        tokio::spawn(async move {
            let (resp, payload) = handler.handle(req, frame.payload, &peer).await;
            let _ = tx.send(Outgoing { request_id: rid, body: encode_body(&resp), payload }).await;
            drop(permit);
        });
    }
    drop(tx);
    let _ = writer.await;
}

/// Helper for handlers: a reply without payload.
pub fn reply(r: Result<Reply, FsError>) -> (Response, Vec<u8>) {
    (r, Vec::new())
}
