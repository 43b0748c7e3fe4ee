//! Short-circuit chunk access for clients on the storage service's host.
//!
//! A storage service listens on an abstract Unix socket
//! ([`socket_name`]); a client on the same host (abstract sockets are
//! scoped to the network namespace, so an emulated host in another
//! namespace never reaches it) asks it for a chunk file and gets the open
//! file descriptor back (`SCM_RIGHTS`), then reads and writes the chunk file
//! itself: no request crosses TCP, no second process touches the data. The
//! service stays in charge of which files are handed out (the same chunk
//! paths it serves, only for targets it offers), and the client hands
//! nothing back: it drops its descriptors when it closes the file or when
//! the service's socket hangs up (the service stopped or died).
//!
//! Admission: the peer must run as root or as the service's own user (the
//! chunk files are theirs anyway), and, when the file system has a shared
//! secret, both sides prove they know it (the challenge/response of
//! [`hivefs_net::auth`]) before any file is handed out.
//!
//! Wire format (all integers little-endian):
//! - hello, service → client: `"HVSC"`, version (1), has-secret (0/1),
//!   service nonce (32), node id (u32);
//! - client → service: client nonce (32), then its MAC (32) if has-secret;
//! - service → client: 0 (admitted) or 1, then its MAC (32) if has-secret;
//! - request, client → service ([`REQUEST_LEN`] bytes): op (1: open,
//!   2: open a mirrored chunk to read, 3: open the target's `chunks/`
//!   directory), target (u32), entry (node u32, epoch u32, counter u64;
//!   zero for op 3), flags (bit 0: create; zero for ops 2 and 3); op 2
//!   (version 2 services and later) is followed by the buddy group (u32)
//!   and its epoch (u64); op 3 needs a version 3 service;
//! - answer: status (0: descriptor attached, 1: no chunk file, 2: not
//!   offered, 3: error, 4: read-only descriptor attached, valid for the
//!   milliseconds in the message, a u32), message length (u16), message
//!   (UTF-8, or the u32 of status 4).
//!
//! A target's `chunks/` directory (op 3) lets the client open and make
//! the target's chunk files of unmirrored files itself
//! ([`crate::store::open_in_chunks_dir`], the service's own path layout):
//! the first access to a chunk file then costs no request at all, where
//! asking for each file (op 1) costs as much as the request it saves. The
//! service hands it out for the targets it would hand files out of.
//!
//! A mirrored chunk is handed out only by its group's primary, read-only
//! (writes must pass the primary, which forwards them), and only for as long
//! as the primary's lease from mgmtd lasts: mgmtd switches a group over only
//! after the old primary's lease ended, so a reader that stops using the
//! descriptor at that time never reads a copy that has stopped being the
//! primary's (`docs/design-mirror.md`).

use hivefs_net::auth::{nonce, Secret};
use hivefs_types::error::{ErrorCode, FsError};
use hivefs_types::ids::{BuddyGroupId, EntryId, NodeId, TargetId};
use rustix::event::{poll, PollFd, PollFlags, Timespec};
use rustix::io::Errno;
use rustix::net::{
    recvmsg, sendmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt, Interest};
use tracing::{debug, warn};

const MAGIC: &[u8; 4] = b"HVSC";
const VERSION: u8 = 3;
/// The oldest service version a client talks to (version 1 has no op 2).
const VERSION_MIN: u8 = 1;
const HELLO_LEN: usize = 4 + 1 + 1 + 32 + 4;
/// Length of a request.
pub const REQUEST_LEN: usize = 1 + 4 + 16 + 1;
const OP_OPEN: u8 = 1;
const OP_OPEN_MIRRORED: u8 = 2;
const OP_OPEN_CHUNKS_DIR: u8 = 3;
/// Bytes after a request of [`OP_OPEN_MIRRORED`]: group (u32), epoch (u64).
const MIRRORED_EXTRA: usize = 4 + 8;
const FLAG_CREATE: u8 = 1;
const STATUS_READ_ONLY: u8 = 4;
/// Longest error message sent back.
const MESSAGE_MAX: usize = 1024;

/// The abstract socket name of storage node `node` whose TCP service is on
/// `port`: unique per network namespace, as the port is.
pub fn socket_name(node: NodeId, port: u16) -> String {
    format!("hivefs/storage/{node}/{port}")
}

/// The service's answer to a request for a chunk file (or a target's
/// `chunks/` directory).
#[derive(Debug)]
pub enum Offer {
    /// The chunk file, open for reading and writing (the directory, open
    /// for reading).
    File(std::fs::File),
    /// The chunk file does not exist (and `create` was not asked).
    NoChunk,
    /// The service does not hand out this target's files (the reason):
    /// use the network path.
    Refused(String),
}

/// What a storage service plugs in: opens chunk files (may block).
pub trait ChunkOpener: Send + Sync + 'static {
    fn open(&self, target: TargetId, entry: EntryId, create: bool) -> Result<Offer, FsError>;

    /// Opens `target`'s copy of a chunk of buddy group `group` for reading,
    /// if `target` is the group's primary at `epoch` now; with the file, how
    /// long it may be read (the rest of the primary's lease). A service that
    /// hands out no mirrored chunks refuses.
    fn open_mirrored(
        &self,
        target: TargetId,
        entry: EntryId,
        group: BuddyGroupId,
        epoch: u64,
    ) -> Result<(Offer, Duration), FsError> {
        let _ = (entry, group, epoch);
        Ok((Offer::Refused(format!("mirrored chunks of target {target} are not handed out")), Duration::ZERO))
    }

    /// Opens `target`'s `chunks/` directory for reading, for a client to
    /// open and make the target's chunk files of unmirrored files itself.
    /// A service that does not hand it out refuses.
    fn open_chunks_dir(&self, target: TargetId) -> Result<Offer, FsError> {
        Ok(Offer::Refused(format!("the chunks directory of target {target} is not handed out")))
    }
}

/// A request, decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpenRequest {
    pub target: TargetId,
    pub what: Wanted,
}

/// What a request asks for of its target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wanted {
    /// A chunk file, made if missing and `create` (op 1).
    Chunk { entry: EntryId, create: bool },
    /// A mirrored chunk to read: its buddy group and the group's epoch as
    /// the client knows it (op 2).
    Mirrored { entry: EntryId, group: BuddyGroupId, epoch: u64 },
    /// The target's `chunks/` directory (op 3).
    ChunksDir,
}

impl OpenRequest {
    /// The first [`REQUEST_LEN`] bytes, and the [`MIRRORED_EXTRA`] of a mirrored open.
    pub fn encode(&self) -> ([u8; REQUEST_LEN], Option<[u8; MIRRORED_EXTRA]>) {
        let mut b = [0u8; REQUEST_LEN];
        let (op, entry, create) = match self.what {
            Wanted::Chunk { entry, create } => (OP_OPEN, Some(entry), create),
            Wanted::Mirrored { entry, .. } => (OP_OPEN_MIRRORED, Some(entry), false),
            Wanted::ChunksDir => (OP_OPEN_CHUNKS_DIR, None, false),
        };
        b[0] = op;
        b[1..5].copy_from_slice(&self.target.0.to_le_bytes());
        if let Some(entry) = entry {
            b[5..9].copy_from_slice(&entry.node.to_le_bytes());
            b[9..13].copy_from_slice(&entry.epoch.to_le_bytes());
            b[13..21].copy_from_slice(&entry.counter.to_le_bytes());
        }
        b[21] = if create { FLAG_CREATE } else { 0 };
        let extra = match self.what {
            Wanted::Mirrored { group, epoch, .. } => {
                let mut x = [0u8; MIRRORED_EXTRA];
                x[..4].copy_from_slice(&group.0.to_le_bytes());
                x[4..].copy_from_slice(&epoch.to_le_bytes());
                Some(x)
            }
            _ => None,
        };
        (b, extra)
    }

    /// Whether a request starting with `b` has [`MIRRORED_EXTRA`] more bytes.
    pub fn has_extra(b: &[u8; REQUEST_LEN]) -> bool {
        b[0] == OP_OPEN_MIRRORED
    }

    /// Decodes a request: `extra` holds the bytes after the first
    /// [`REQUEST_LEN`] when [`OpenRequest::has_extra`] says there are some.
    pub fn decode(b: &[u8; REQUEST_LEN], extra: Option<&[u8; MIRRORED_EXTRA]>) -> Result<OpenRequest, String> {
        if b[21] & !FLAG_CREATE != 0 {
            return Err(format!("unknown flags {:#x}", b[21]));
        }
        let create = b[21] & FLAG_CREATE != 0;
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        let entry = EntryId {
            node: u32_at(5),
            epoch: u32_at(9),
            counter: u64::from_le_bytes(b[13..21].try_into().expect("8 bytes")),
        };
        let what = match (b[0], extra) {
            (OP_OPEN, None) => Wanted::Chunk { entry, create },
            (OP_OPEN_MIRRORED | OP_OPEN_CHUNKS_DIR, _) if create => {
                return Err("only a chunk file of an unmirrored file is made on request".into())
            }
            (OP_OPEN_MIRRORED, Some(x)) => Wanted::Mirrored {
                entry,
                group: BuddyGroupId(u32::from_le_bytes(x[..4].try_into().expect("4 bytes"))),
                epoch: u64::from_le_bytes(x[4..].try_into().expect("8 bytes")),
            },
            (OP_OPEN_MIRRORED, None) => return Err("a mirrored open without its group".into()),
            (OP_OPEN_CHUNKS_DIR, None) => Wanted::ChunksDir,
            (op, _) => return Err(format!("unknown operation {op}")),
        };
        Ok(OpenRequest { target: TargetId(u32_at(1)), what })
    }
}

/// A running short-circuit listener; stops (new connections and served
/// ones) when dropped.
pub struct LocalServer {
    task: tokio::task::JoinHandle<()>,
}

impl Drop for LocalServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Listens on the abstract socket `name` for clients of storage node `node`.
/// Must run inside a tokio runtime.
pub fn serve_local(
    name: &str,
    node: NodeId,
    secret: Option<Secret>,
    opener: Arc<dyn ChunkOpener>,
) -> io::Result<LocalServer> {
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
    let std_listener = std::os::unix::net::UnixListener::bind_addr(&addr)?;
    std_listener.set_nonblocking(true)?;
    let listener = tokio::net::UnixListener::from_std(std_listener)?;
    let task = tokio::spawn(async move {
        // Served connections stop with the listener (abort of this task).
        let mut conns = tokio::task::JoinSet::new();
        loop {
            tokio::select! {
                r = listener.accept() => match r {
                    Ok((stream, _)) => {
                        let (secret, opener) = (secret.clone(), opener.clone());
                        conns.spawn(async move {
                            match serve_conn(stream, node, secret, opener).await {
                                Ok(()) => {}
                                // A client that exits or drops its socket mid-exchange.
                                Err(e) if matches!(
                                    e.kind(),
                                    io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe | io::ErrorKind::UnexpectedEof
                                ) => debug!("short-circuit client went away: {e}"),
                                Err(e) => warn!("short-circuit connection ended by an error: {e}"),
                            }
                        });
                    }
                    Err(e) => {
                        warn!("short-circuit socket: accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                },
                Some(_) = conns.join_next(), if !conns.is_empty() => {}
            }
        }
    });
    Ok(LocalServer { task })
}

/// Whether a peer running as `uid` may have chunk files: root, or the user
/// the service runs as.
fn admitted_uid(uid: u32) -> bool {
    uid == 0 || uid == rustix::process::geteuid().as_raw()
}

async fn serve_conn(
    mut s: tokio::net::UnixStream,
    node: NodeId,
    secret: Option<Secret>,
    opener: Arc<dyn ChunkOpener>,
) -> io::Result<()> {
    let cred = s.peer_cred()?;
    if !admitted_uid(cred.uid()) {
        warn!(uid = cred.uid(), pid = ?cred.pid(), "short-circuit client refused: runs as another user");
        return Ok(());
    }
    let ns = nonce();
    let mut hello = Vec::with_capacity(HELLO_LEN);
    hello.extend_from_slice(MAGIC);
    hello.push(VERSION);
    hello.push(u8::from(secret.is_some()));
    hello.extend_from_slice(&ns);
    hello.extend_from_slice(&node.0.to_le_bytes());
    s.write_all(&hello).await?;
    let mut nc = [0u8; 32];
    s.read_exact(&mut nc).await?;
    if let Some(secret) = &secret {
        let mut mac = [0u8; 32];
        s.read_exact(&mut mac).await?;
        if !secret.verify(b"client", &ns, &nc, &mac) {
            warn!(pid = ?cred.pid(), "short-circuit client refused: wrong shared secret");
            s.write_all(&[1]).await?;
            return Ok(());
        }
        let mut ok = vec![0u8];
        ok.extend_from_slice(&secret.mac(b"server", &nc, &ns));
        s.write_all(&ok).await?;
    } else {
        s.write_all(&[0]).await?;
    }
    loop {
        let mut req = [0u8; REQUEST_LEN];
        match s.read_exact(&mut req).await {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        }
        let mut extra = [0u8; MIRRORED_EXTRA];
        let has_extra = OpenRequest::has_extra(&req);
        if has_extra {
            s.read_exact(&mut extra).await?;
        }
        let req = match OpenRequest::decode(&req, has_extra.then_some(&extra)) {
            Ok(r) => r,
            Err(e) => {
                // A malformed request ends the connection: its framing is lost.
                warn!(pid = ?cred.pid(), "short-circuit client sent a malformed request: {e}");
                send_answer(&s, 3, format!("malformed request: {e}").as_bytes(), None).await?;
                return Ok(());
            }
        };
        let o = opener.clone();
        let r = tokio::task::spawn_blocking(move || match req.what {
            Wanted::Chunk { entry, create } => o.open(req.target, entry, create).map(|f| (f, None)),
            Wanted::Mirrored { entry, group, epoch } => {
                o.open_mirrored(req.target, entry, group, epoch).map(|(f, d)| (f, Some(d)))
            }
            Wanted::ChunksDir => o.open_chunks_dir(req.target).map(|f| (f, None)),
        })
        .await
        .unwrap_or_else(|e| Err(FsError::new(ErrorCode::Internal, format!("chunk open task failed: {e}"))));
        match r {
            Ok((Offer::File(f), None)) => send_answer(&s, 0, b"", Some(f.as_fd())).await?,
            Ok((Offer::File(f), Some(valid))) => {
                let ms = u32::try_from(valid.as_millis()).unwrap_or(u32::MAX);
                send_answer(&s, STATUS_READ_ONLY, &ms.to_le_bytes(), Some(f.as_fd())).await?
            }
            Ok((Offer::NoChunk, _)) => send_answer(&s, 1, b"", None).await?,
            Ok((Offer::Refused(why), _)) => send_answer(&s, 2, why.as_bytes(), None).await?,
            Err(e) => send_answer(&s, 3, e.to_string().as_bytes(), None).await?,
        }
    }
}

fn answer_bytes(status: u8, message: &[u8]) -> Vec<u8> {
    let mut m = message;
    if m.len() > MESSAGE_MAX {
        // Cut at a character boundary (messages are UTF-8).
        let mut end = MESSAGE_MAX;
        while end > 0 && (m[end] & 0xc0) == 0x80 {
            end -= 1;
        }
        m = &m[..end];
    }
    let mut b = Vec::with_capacity(3 + m.len());
    b.push(status);
    b.extend_from_slice(&(m.len() as u16).to_le_bytes());
    b.extend_from_slice(m);
    b
}

async fn send_answer(
    s: &tokio::net::UnixStream,
    status: u8,
    message: &[u8],
    fd: Option<BorrowedFd<'_>>,
) -> io::Result<()> {
    let b = answer_bytes(status, message);
    let mut sent = 0;
    while sent < b.len() {
        s.writable().await?;
        // The descriptor rides on the first bytes only.
        let fd = if sent == 0 { fd } else { None };
        match s.try_io(Interest::WRITABLE, || send_with_fd(s.as_fd(), &b[sent..], fd)) {
            Ok(n) => sent += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn send_with_fd(sock: BorrowedFd<'_>, data: &[u8], fd: Option<BorrowedFd<'_>>) -> io::Result<usize> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if fd.is_some() {
        let pushed = control.push(SendAncillaryMessage::ScmRights(fd.as_slice()));
        assert!(pushed, "room for one descriptor");
    }
    Ok(sendmsg(sock, &[IoSlice::new(data)], &mut control, SendFlags::NOSIGNAL)?)
}

/// Reads into `data`; returns the byte count and the descriptor that came
/// with them, if any (close-on-exec).
fn recv_with_fd(sock: BorrowedFd<'_>, data: &mut [u8]) -> io::Result<(usize, Option<OwnedFd>)> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let msg = loop {
        match recvmsg(sock, &mut [IoSliceMut::new(data)], &mut control, RecvFlags::CMSG_CLOEXEC) {
            Ok(m) => break m,
            Err(Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    };
    let mut got = None;
    for m in control.drain() {
        if let RecvAncillaryMessage::ScmRights(fds) = m {
            for owned in fds {
                if got.is_none() {
                    got = Some(owned);
                } // else dropped: closed
            }
        }
    }
    if msg.flags.contains(ReturnFlags::CTRUNC) {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "descriptor truncated"));
    }
    Ok((msg.bytes, got))
}

/// A client's connection to one storage service's short-circuit socket.
/// Blocking: used for the rare opens (once per file and target).
pub struct LocalConn {
    stream: std::os::unix::net::UnixStream,
    node: NodeId,
    /// The service's protocol version.
    version: u8,
    /// One request and its answer at a time.
    exchange: std::sync::Mutex<()>,
}

/// How long a client waits for a short-circuit answer before giving up on it.
const CONN_TIMEOUT: Duration = Duration::from_secs(5);

fn proto_err(node: NodeId, what: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("short-circuit socket of storage node {node}: {what}"))
}

impl LocalConn {
    /// Connects to storage node `node`'s socket `name`. `Ok(None)`: nobody
    /// listens there (the service is on another host, or does not offer
    /// short-circuit access). An error: something answered but not as
    /// expected (wrong node, secret mismatch, another user's process).
    pub fn connect(name: &str, node: NodeId, secret: Option<&Secret>) -> io::Result<Option<LocalConn>> {
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
        let mut stream = match std::os::unix::net::UnixStream::connect_addr(&addr) {
            Ok(s) => s,
            Err(e) if matches!(Errno::from_io_error(&e), Some(Errno::CONNREFUSED | Errno::NOENT)) => return Ok(None),
            Err(e) => return Err(e),
        };
        stream.set_read_timeout(Some(CONN_TIMEOUT))?;
        stream.set_write_timeout(Some(CONN_TIMEOUT))?;
        let uid = rustix::net::sockopt::socket_peercred(&stream)?.uid.as_raw();
        if !admitted_uid(uid) {
            return Err(proto_err(node, format_args!("served by a process of user {uid}, not root or this user")));
        }
        let mut hello = [0u8; HELLO_LEN];
        stream.read_exact(&mut hello)?;
        if &hello[..4] != MAGIC || !(VERSION_MIN..=VERSION).contains(&hello[4]) {
            return Err(proto_err(node, "not a HiveFS short-circuit socket of a version this client knows"));
        }
        let version = hello[4];
        let has_secret = hello[5] != 0;
        let ns: [u8; 32] = hello[6..38].try_into().expect("32 bytes");
        let their_node = NodeId(u32::from_le_bytes(hello[38..42].try_into().expect("4 bytes")));
        if their_node != node {
            return Err(proto_err(node, format_args!("answered as node {their_node}")));
        }
        match (has_secret, secret) {
            (true, None) => return Err(proto_err(node, "it needs a shared secret and this client has none")),
            (false, Some(_)) => return Err(proto_err(node, "it has no shared secret and this client has one")),
            _ => {}
        }
        let nc = nonce();
        let mut out = nc.to_vec();
        if let Some(s) = secret {
            out.extend_from_slice(&s.mac(b"client", &ns, &nc));
        }
        stream.write_all(&out)?;
        let mut status = [0u8];
        stream.read_exact(&mut status)?;
        if status[0] != 0 {
            return Err(proto_err(node, "refused this client (shared secret)"));
        }
        if let Some(s) = secret {
            let mut mac = [0u8; 32];
            stream.read_exact(&mut mac)?;
            if !s.verify(b"server", &nc, &ns, &mac) {
                return Err(proto_err(node, "did not prove it knows the shared secret"));
            }
        }
        Ok(Some(LocalConn { stream, node, version, exchange: std::sync::Mutex::new(()) }))
    }

    /// Asks for `target`'s chunk file of `entry` (created if `create`).
    pub fn open(&self, target: TargetId, entry: EntryId, create: bool) -> io::Result<Result<Offer, FsError>> {
        Ok(self.ask(OpenRequest { target, what: Wanted::Chunk { entry, create } })?.map(|(o, _)| o))
    }

    /// Asks for the copy on `target` of buddy group `group`'s chunk of
    /// `entry` (to read), `target` being its primary at `epoch` as the
    /// caller knows it; with the file, how long it may be read.
    pub fn open_mirrored(
        &self,
        target: TargetId,
        entry: EntryId,
        group: BuddyGroupId,
        epoch: u64,
    ) -> io::Result<Result<(Offer, Duration), FsError>> {
        if self.version < 2 {
            let why = format!("storage node {} hands out no mirrored chunks (an older version)", self.node);
            return Ok(Ok((Offer::Refused(why), Duration::ZERO)));
        }
        let r = self.ask(OpenRequest { target, what: Wanted::Mirrored { entry, group, epoch } })?;
        Ok(r.map(|(o, valid)| (o, valid.unwrap_or(Duration::ZERO))))
    }

    /// Asks for `target`'s `chunks/` directory (see
    /// [`crate::store::open_in_chunks_dir`]); an older service refuses.
    pub fn open_chunks_dir(&self, target: TargetId) -> io::Result<Result<Offer, FsError>> {
        if self.version < 3 {
            let why = format!("storage node {} hands out no chunks directories (an older version)", self.node);
            return Ok(Ok(Offer::Refused(why)));
        }
        Ok(self.ask(OpenRequest { target, what: Wanted::ChunksDir })?.map(|(o, _)| o))
    }

    fn ask(&self, req: OpenRequest) -> io::Result<Result<(Offer, Option<Duration>), FsError>> {
        let _one = self.exchange.lock().unwrap_or_else(|p| p.into_inner());
        let mut stream = &self.stream;
        let (head, extra) = req.encode();
        match extra {
            Some(x) => stream.write_all(&[&head[..], &x[..]].concat())?,
            None => stream.write_all(&head)?,
        }
        let mut head = [0u8; 3];
        let (mut n, fd) = recv_with_fd(self.stream.as_fd(), &mut head)?;
        if n == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "short-circuit socket closed"));
        }
        while n < head.len() {
            let m = stream.read(&mut head[n..])?;
            if m == 0 {
                return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "short-circuit socket closed"));
            }
            n += m;
        }
        let mut raw = vec![0u8; u16::from_le_bytes([head[1], head[2]]) as usize];
        stream.read_exact(&mut raw)?;
        let msg = String::from_utf8_lossy(&raw).into_owned();
        let mirrored = matches!(req.what, Wanted::Mirrored { .. });
        Ok(match (head[0], fd) {
            (0, Some(fd)) if !mirrored => Ok((Offer::File(std::fs::File::from(fd)), None)),
            (STATUS_READ_ONLY, Some(fd)) if mirrored => {
                let ms: [u8; 4] = raw
                    .as_slice()
                    .try_into()
                    .map_err(|_| proto_err(self.node, "a read-only answer without its validity"))?;
                let valid = Duration::from_millis(u32::from_le_bytes(ms).into());
                Ok((Offer::File(std::fs::File::from(fd)), Some(valid)))
            }
            (0 | STATUS_READ_ONLY, _) => {
                return Err(proto_err(self.node, "answered without the descriptor, or with the wrong kind"))
            }
            (1, _) => Ok((Offer::NoChunk, None)),
            (2, _) => Ok((Offer::Refused(msg), None)),
            (3, _) => Err(FsError::new(ErrorCode::Io, msg)),
            (s, _) => return Err(proto_err(self.node, format_args!("unknown answer status {s}"))),
        })
    }

    /// False once the service's end hung up (it stopped or died): the
    /// descriptors it handed out must not be used any more.
    pub fn alive(&self) -> bool {
        let mut p = [PollFd::new(&self.stream, PollFlags::RDHUP)];
        let no_wait = Timespec { tv_sec: 0, tv_nsec: 0 };
        match poll(&mut p, Some(&no_wait)) {
            Ok(0) => true,
            Ok(_) => !p[0].revents().intersects(PollFlags::RDHUP | PollFlags::HUP | PollFlags::ERR | PollFlags::NVAL),
            Err(_) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    const E: EntryId = EntryId { node: 1, epoch: 2, counter: 0xAB };

    #[test]
    fn requests_round_trip_and_garbage_is_refused() {
        for create in [false, true] {
            let r = OpenRequest { target: TargetId(7), what: Wanted::Chunk { entry: E, create } };
            let (b, x) = r.encode();
            assert!(x.is_none() && !OpenRequest::has_extra(&b));
            assert_eq!(OpenRequest::decode(&b, None), Ok(r));
        }
        let dir = OpenRequest { target: TargetId(7), what: Wanted::ChunksDir };
        let (mut b, x) = dir.encode();
        assert!(x.is_none() && !OpenRequest::has_extra(&b));
        assert_eq!(OpenRequest::decode(&b, None), Ok(dir));
        b[21] = FLAG_CREATE;
        assert!(OpenRequest::decode(&b, None).unwrap_err().contains("made on request"));
        let m = OpenRequest {
            target: TargetId(7),
            what: Wanted::Mirrored { entry: E, group: BuddyGroupId(3), epoch: 1 << 40 },
        };
        let (b, x) = m.encode();
        assert!(OpenRequest::has_extra(&b));
        assert_eq!(OpenRequest::decode(&b, x.as_ref()), Ok(m));
        assert!(OpenRequest::decode(&b, None).unwrap_err().contains("without its group"));
        let (mut created, x) = m.encode();
        created[21] = FLAG_CREATE;
        assert!(OpenRequest::decode(&created, x.as_ref()).unwrap_err().contains("made on request"));
        created[0] = OP_OPEN;
        assert!(OpenRequest::decode(&created, x.as_ref()).unwrap_err().contains("unknown operation"));
        let (mut b, _) = OpenRequest { target: TargetId(7), what: Wanted::Chunk { entry: E, create: true } }.encode();
        b[0] = 9;
        assert!(OpenRequest::decode(&b, None).unwrap_err().contains("unknown operation"));
        b[0] = OP_OPEN;
        b[21] = 0x81;
        assert!(OpenRequest::decode(&b, None).unwrap_err().contains("unknown flags"));
    }

    /// Hands out files below a directory: `<dir>/<target>-<counter>`;
    /// target 9 is refused.
    struct DirOpener(std::path::PathBuf);

    impl ChunkOpener for DirOpener {
        fn open(&self, target: TargetId, entry: EntryId, create: bool) -> Result<Offer, FsError> {
            if target == TargetId(9) {
                return Ok(Offer::Refused("target 9 is rate-limited".into()));
            }
            let p = self.0.join(format!("{target}-{}", entry.counter));
            match std::fs::OpenOptions::new().read(true).write(true).create(create).open(&p) {
                Ok(f) => Ok(Offer::File(f)),
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Offer::NoChunk),
                Err(e) => Err(FsError::new(ErrorCode::Io, format!("{}: {e}", p.display()))),
            }
        }

        /// The directory itself, for target 1 only.
        fn open_chunks_dir(&self, target: TargetId) -> Result<Offer, FsError> {
            if target != TargetId(1) {
                return Ok(Offer::Refused(format!("no chunks directory for target {target}")));
            }
            Ok(Offer::File(std::fs::File::open(&self.0).map_err(|e| FsError::new(ErrorCode::Io, e.to_string()))?))
        }

        /// Group 5 at epoch 2 only, valid for 1.5 s, read-only.
        fn open_mirrored(
            &self,
            target: TargetId,
            entry: EntryId,
            group: BuddyGroupId,
            epoch: u64,
        ) -> Result<(Offer, Duration), FsError> {
            if (group, epoch) != (BuddyGroupId(5), 2) {
                return Err(FsError::new(ErrorCode::Unavailable, format!("not the primary of {group} at {epoch}")));
            }
            let p = self.0.join(format!("{target}-{}", entry.counter));
            let f = std::fs::File::open(&p).map_err(|e| FsError::new(ErrorCode::Io, e.to_string()))?;
            Ok((Offer::File(f), Duration::from_millis(1500)))
        }
    }

    fn name(tag: &str) -> String {
        format!("hivefs-test/{}/{tag}/{}", std::process::id(), nonce()[0])
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn descriptors_are_handed_out_and_the_hang_up_is_seen() {
        let d = tempfile::tempdir().unwrap();
        let name = name("fds");
        let server = serve_local(&name, NodeId(3), None, Arc::new(DirOpener(d.path().into()))).unwrap();
        let (n, root) = (name.clone(), d.path().to_path_buf());
        let c = tokio::task::spawn_blocking(move || LocalConn::connect(&n, NodeId(3), None))
            .await
            .unwrap()
            .unwrap()
            .expect("listening");
        let c = tokio::task::spawn_blocking(move || {
            assert!(matches!(c.open(TargetId(1), E, false).unwrap(), Ok(Offer::NoChunk)));
            let Ok(Offer::File(f)) = c.open(TargetId(1), E, true).unwrap() else { panic!("no file") };
            f.write_all_at(b"through the descriptor", 0).unwrap();
            assert_eq!(std::fs::read(root.join("1-171")).unwrap(), b"through the descriptor");
            let Ok(Offer::Refused(why)) = c.open(TargetId(9), E, true).unwrap() else { panic!("not refused") };
            assert!(why.contains("rate-limited"), "{why}");
            // A mirrored chunk: read-only, with how long it may be read; not
            // from a member that is not the primary at that epoch.
            let Ok((Offer::File(f), valid)) = c.open_mirrored(TargetId(1), E, BuddyGroupId(5), 2).unwrap() else {
                panic!("no mirrored file")
            };
            assert_eq!(valid, Duration::from_millis(1500));
            let mut b = [0u8; 7];
            f.read_exact_at(&mut b, 0).unwrap();
            assert_eq!(&b, b"through");
            assert!(f.write_all_at(b"x", 0).is_err(), "a mirrored chunk is handed out read-only");
            let e = c.open_mirrored(TargetId(1), E, BuddyGroupId(5), 1).unwrap().expect_err("stale epoch");
            assert!(e.to_string().contains("not the primary"), "{e}");
            // A target's chunks directory: chunk files are opened and made through it.
            let Ok(Offer::File(dir)) = c.open_chunks_dir(TargetId(1)).unwrap() else { panic!("no directory") };
            let f = crate::store::open_in_chunks_dir(&dir, None, E, true).unwrap().expect("made");
            f.write_all_at(b"made here", 0).unwrap();
            let again = crate::store::open_in_chunks_dir(&dir, None, E, false).unwrap().expect("found");
            let mut b = [0u8; 9];
            again.read_exact_at(&mut b, 0).unwrap();
            assert_eq!(&b, b"made here");
            let Ok(Offer::Refused(why)) = c.open_chunks_dir(TargetId(2)).unwrap() else { panic!("not refused") };
            assert!(why.contains("target 2"), "{why}");
            assert!(c.alive());
            c
        })
        .await
        .unwrap();
        drop(server);
        // The service's end closes with its task.
        let mut hung_up = false;
        for _ in 0..100 {
            if !c.alive() {
                hung_up = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(hung_up, "a stopped service's socket must read as hung up");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn wrong_node_secret_or_no_listener_is_not_a_connection() {
        let d = tempfile::tempdir().unwrap();
        let name = name("auth");
        let s = Secret::from_bytes(b"right");
        let _server = serve_local(&name, NodeId(3), Some(s.clone()), Arc::new(DirOpener(d.path().into()))).unwrap();
        let n = name.clone();
        tokio::task::spawn_blocking(move || {
            let e = LocalConn::connect(&n, NodeId(4), Some(&s)).err().expect("wrong node");
            assert!(e.to_string().contains("answered as node 3"), "{e}");
            let e = LocalConn::connect(&n, NodeId(3), None).err().expect("no secret");
            assert!(e.to_string().contains("needs a shared secret"), "{e}");
            let e = LocalConn::connect(&n, NodeId(3), Some(&Secret::from_bytes(b"wrong"))).err().expect("wrong secret");
            assert!(e.to_string().contains("refused"), "{e}");
            let c = LocalConn::connect(&n, NodeId(3), Some(&s)).unwrap().expect("right secret");
            assert!(matches!(c.open(TargetId(1), E, false).unwrap(), Ok(Offer::NoChunk)));
            assert!(LocalConn::connect(&format!("{n}/nobody"), NodeId(3), None).unwrap().is_none());
        })
        .await
        .unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_malformed_request_gets_an_error_and_the_connection_ends() {
        let d = tempfile::tempdir().unwrap();
        let name = name("bad");
        let _server = serve_local(&name, NodeId(3), None, Arc::new(DirOpener(d.path().into()))).unwrap();
        tokio::task::spawn_blocking(move || {
            let mut c = LocalConn::connect(&name, NodeId(3), None).unwrap().unwrap();
            let (mut b, _) =
                OpenRequest { target: TargetId(1), what: Wanted::Chunk { entry: E, create: false } }.encode();
            b[0] = 77;
            c.stream.write_all(&b).unwrap();
            let mut head = [0u8; 3];
            c.stream.read_exact(&mut head).unwrap();
            assert_eq!(head[0], 3);
            let mut msg = vec![0u8; u16::from_le_bytes([head[1], head[2]]) as usize];
            c.stream.read_exact(&mut msg).unwrap();
            assert!(String::from_utf8_lossy(&msg).contains("unknown operation 77"));
            let mut rest = Vec::new();
            assert_eq!(c.stream.read_to_end(&mut rest).unwrap(), 0, "the connection ends");
        })
        .await
        .unwrap();
    }
}
