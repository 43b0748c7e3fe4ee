//! HiveFS storage service (`hivefs storage`).
//!
//! Owns one or more storage targets: directories on local file systems,
//! formatted by [`init_target`], holding one chunk file per (file, target)
//! (see [`hivefs_chunk::store`] for paths and I/O, [`target`] for the on-disk format). It
//! registers itself and its targets with mgmtd (persisting the assigned ids in
//! `<dir>/node.toml` and in each `target.toml`), sends heartbeats with each
//! target's capacity, and serves the chunk requests of clients.
//!
//! It must not know about files, directories, patterns or sizes: a chunk
//! file is bytes at offsets, addressed by (target, entry id). It must never
//! derive a path from anything but a typed id, and never serve a target it
//! was not configured with.
//!
//! The service is a library: [`start`] runs it inside the caller's tokio
//! runtime, so tests run it in-process and the binary stays thin.
//! [`start_with`] takes the two seams a simulation replaces: the network
//! ([`Net`]) and the chunk files ([`Disk`]: through the
//! [`hivefs_chunk::ChunkFiles`] trait, the files on disk by default).

#![forbid(unsafe_code)]

pub mod bench;
pub mod error;
mod mirror;
pub mod ratelimit;
pub mod target;

pub use error::StorageError;
pub use mirror::STEPS as MIRROR_STEPS;
pub use ratelimit::{RateLimit, RateSetting};
pub use target::{init_target, open_target, TargetFile, CHUNKS_DIR, TARGET_FILE};

use bytes::Bytes;
use hivefs_chunk::{ChunkFiles, ChunkStore};
use hivefs_cluster::NodeIdentity;
use hivefs_net::{serve, Call, ClientConfig, Handler, Peer, ServerConfig, ServerHandle};
use hivefs_proto::{ChunkCopy, Reply, Request, Response, TargetCapacity, MAX_PAYLOAD_LEN};
use hivefs_types::error::{ErrorCode, FsError, FsResult};
use hivefs_types::fs_err;
use hivefs_types::ids::{EntryId, NodeId, NodeType, TargetId};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tracing::{debug, error, info, warn};

/// Largest page of a `ListChunks` answer.
pub const LIST_CHUNKS_MAX: u32 = 4096;

/// How long [`start`] waits for mgmtd to answer the registration.
pub const REGISTER_DEADLINE: Duration = Duration::from_secs(30);

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Service data dir (`node.toml`: this node's uuid and id).
    pub dir: PathBuf,
    /// Target directories, each formatted by [`init_target`].
    pub targets: Vec<PathBuf>,
    pub listen: String,
    /// Address of the Prometheus scrape endpoint (`GET /metrics`, text format), e.g.
    /// `0.0.0.0:9100`; absent: no endpoint. Served by the `hivefs` binary
    /// (`hivefs_metrics`); `hivefs up` turns it on with a free port per service.
    pub metrics_listen: Option<String>,
    /// Address peers reach this service at; default: the bound listen address.
    pub advertise: Option<String>,
    /// Address of mgmtd.
    pub mgmtd: String,
    /// Shared secret file; `None` disables authentication.
    pub secret_file: Option<PathBuf>,
    pub heartbeat_interval_ms: u64,
    /// When set, targets formatted for another file system are refused.
    pub fs_uuid: Option<String>,
    /// For experiments: limit every target to this many bytes per second of chunk reads
    /// and writes together (a token bucket per target, so the cluster behaves as if its
    /// disks had that speed). Bytes per second as a number, or with a binary unit:
    /// `target_rate_limit = "40MiB"` (also `"512k"`, `"1g"`); absent or 0: no limit.
    /// StorageBench (`hivefs bench storage`) and NetBench are not limited.
    pub target_rate_limit: Option<RateSetting>,
    /// Hand chunk files to clients on this host (same network namespace)
    /// over an abstract Unix socket, so they read and write them without a
    /// request over TCP (see `hivefs_chunk::local`). Targets with a rate limit
    /// are never handed out.
    pub short_circuit: bool,
    /// A forward of a mirrored change to the buddy that takes longer fails, and the
    /// buddy is marked needs-resync (`docs/design-mirror.md`). Below the clients'
    /// I/O timeout (30 s), above a loaded disk's worst write latency.
    pub mirror_forward_timeout_ms: u64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            dir: PathBuf::from("/var/lib/hivefs/storage"),
            targets: Vec::new(),
            listen: "127.0.0.1:8003".into(),
            metrics_listen: None,
            advertise: None,
            mgmtd: "127.0.0.1:8008".into(),
            secret_file: None,
            heartbeat_interval_ms: 1000,
            fs_uuid: None,
            target_rate_limit: None,
            short_circuit: true,
            mirror_forward_timeout_ms: mirror::FORWARD_TIMEOUT.as_millis() as u64,
        }
    }
}

/// How a storage service meets its peers (with `Net::Tcp` it also offers
/// short-circuit access when configured).
pub use hivefs_net::Net;

thread_local! {
    /// Chunk-file I/O runs where it is asked for instead of on tokio's
    /// blocking pool (see [`run_io_in_place_on_this_thread`]).
    static IO_IN_PLACE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Makes every storage service task polled by this thread do its file I/O
/// in place instead of on tokio's blocking pool: for a deterministic
/// simulation, which runs all nodes on one current-thread runtime and
/// must not let another thread's timing decide the order of events.
pub fn run_io_in_place_on_this_thread(on: bool) {
    IO_IN_PLACE.with(|c| c.set(on));
}

/// A running storage service. Dropping it (or [`StorageService::stop`])
/// stops accepting connections, the heartbeats and its mirroring tasks
/// (resyncs, role changes).
#[must_use = "the service stops when this handle is dropped"]
pub struct StorageService {
    /// The bound listen address (`Net::Tcp`); unspecified with `Net::Pools`.
    pub local_addr: SocketAddr,
    pub node_id: NodeId,
    /// The served targets, in the order of `Config::targets`.
    pub targets: Vec<TargetId>,
    server: Option<ServerHandle>,
    handler: Arc<StorageHandler>,
    heartbeat: tokio::task::JoinHandle<()>,
    mirror: Arc<mirror::Mirror>,
    /// The short-circuit socket, when offered.
    _local: Option<hivefs_chunk::local::LocalServer>,
}

impl StorageService {
    /// Stops accepting connections and sending heartbeats. (Connections
    /// already accepted are served until their peers close them: a transport
    /// limitation.)
    pub fn stop(self) {}

    /// Makes the first task of this node that reaches `step` of the
    /// mirroring protocol ([`MIRROR_STEPS`]) stop there for good, and fires
    /// `notify`: a simulation then crashes the whole node.
    pub fn halt_at(&self, step: &str, notify: Arc<tokio::sync::Notify>) {
        self.mirror.halt_at(step, notify);
    }

    /// Serves one request as if it had arrived over the network (`Net::Pools`).
    pub async fn handle(&self, env: hivefs_proto::Envelope, req: Request, payload: Vec<u8>) -> (Response, Vec<u8>) {
        self.handler.serve(env, req, payload).await
    }
}

impl Drop for StorageService {
    fn drop(&mut self) {
        if let Some(s) = &self.server {
            s.abort();
        }
        self.heartbeat.abort();
        self.mirror.stop_tasks();
    }
}

/// What the handler needs once registration is done.
struct Ready {
    node: NodeId,
    /// Other storage nodes, for copies whose source is elsewhere.
    cluster: Arc<hivefs_cluster::Cluster>,
    stores: HashMap<TargetId, Store>,
    /// Per-target rate limits (`target_rate_limit`); empty when unlimited.
    limits: HashMap<TargetId, Arc<RateLimit>>,
    /// Buddy mirroring of this node's targets (`docs/design-mirror.md`).
    mirror: Arc<mirror::Mirror>,
}

struct StorageHandler {
    /// Empty until registration with mgmtd is complete; requests that arrive
    /// before are answered `Unavailable` (clients retry those).
    ready: OnceLock<Ready>,
}

/// Hands chunk files to short-circuit clients (`Config::short_circuit`).
struct LocalOpener {
    node: NodeId,
    stores: HashMap<TargetId, Store>,
    /// Targets with a rate limit: their I/O must pass the service's bucket.
    limited: std::collections::HashSet<TargetId>,
    /// Mirrored chunks, handed out to read while this node is their primary.
    mirror: Arc<mirror::Mirror>,
}

impl hivefs_chunk::local::ChunkOpener for LocalOpener {
    fn open(&self, target: TargetId, entry: EntryId, create: bool) -> FsResult<hivefs_chunk::local::Offer> {
        use hivefs_chunk::local::Offer;
        if self.limited.contains(&target) {
            return Ok(Offer::Refused(format!("target {target} has a rate limit (target_rate_limit)")));
        }
        let Some(store) = self.stores.get(&target) else {
            return Ok(Offer::Refused(format!("target {target} is not served by storage node {}", self.node)));
        };
        Ok(match store.open(entry, create)? {
            Some(f) => Offer::File(f),
            None => Offer::NoChunk,
        })
    }

    fn open_mirrored(
        &self,
        target: TargetId,
        entry: EntryId,
        group: hivefs_types::ids::BuddyGroupId,
        epoch: u64,
    ) -> FsResult<(hivefs_chunk::local::Offer, std::time::Duration)> {
        use hivefs_chunk::local::Offer;
        if self.limited.contains(&target) {
            let why = format!("target {target} has a rate limit (target_rate_limit)");
            return Ok((Offer::Refused(why), std::time::Duration::ZERO));
        }
        self.mirror.open_to_read(target, entry, group, epoch)
    }

    fn open_chunks_dir(&self, target: TargetId) -> FsResult<hivefs_chunk::local::Offer> {
        use hivefs_chunk::local::Offer;
        use std::os::unix::fs::OpenOptionsExt;
        if self.limited.contains(&target) {
            return Ok(Offer::Refused(format!("target {target} has a rate limit (target_rate_limit)")));
        }
        let Some(store) = self.stores.get(&target) else {
            return Ok(Offer::Refused(format!("target {target} is not served by storage node {}", self.node)));
        };
        let dir = store.dir().join(hivefs_chunk::store::CHUNKS_DIR);
        let f = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECTORY).open(&dir);
        f.map(Offer::File)
            .map_err(|e| FsError::new(ErrorCode::Io, format!("target {target}: cannot open {}: {e}", dir.display())))
    }
}

/// Runs blocking file work off the async workers (in place under
/// [`run_io_in_place_on_this_thread`]); `Err` when the task panicked.
async fn io_task<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T, String> {
    if IO_IN_PLACE.with(|c| c.get()) {
        return Ok(f());
    }
    tokio::task::spawn_blocking(f).await.map_err(|e| e.to_string())
}

/// Runs blocking file I/O off the async workers.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> FsResult<T> + Send + 'static) -> FsResult<T> {
    io_task(f).await.unwrap_or_else(|e| Err(fs_err!(Internal, "chunk I/O task failed: {e}")))
}

/// Writes of at most this many bytes, and reads of at most this many that the
/// page cache holds, run on the async worker that received them instead of a
/// blocking thread: the hop to the blocking pool and back (two wake-ups) costs
/// more than a small `pread`/`pwrite` of cached pages (see docs/decisions.md,
/// "Small chunk I/O inline").
pub const INLINE_IO_MAX: usize = 64 << 10;

/// A chunk read: answered on this worker when it is small and in the page
/// cache, else on a blocking thread (a read from the disk must not hold a
/// worker: reads that miss the cache get the blocking pool's queue depth).
async fn cached_read(s: Store, entry: hivefs_types::ids::EntryId, offset: u64, len: u32) -> FsResult<Vec<u8>> {
    if len as usize > INLINE_IO_MAX {
        return blocking(move || s.read(entry, offset, len)).await;
    }
    let Some((f, want)) = s.open_read(entry, offset, len)? else {
        return Ok(Vec::new());
    };
    if let Some(data) = s.read_cached(entry, &f, offset, want)? {
        return Ok(data);
    }
    // Not cached: the blocking thread reads from the file already open.
    blocking(move || s.read_open(entry, &f, offset, want)).await
}

/// Runs chunk I/O of `bytes` bytes inline when it is small, else on a blocking thread.
async fn chunk_io<T: Send + 'static>(bytes: usize, f: impl FnOnce() -> FsResult<T> + Send + 'static) -> FsResult<T> {
    if bytes <= INLINE_IO_MAX {
        f()
    } else {
        blocking(f).await
    }
}

impl Ready {
    fn store(&self, target: TargetId) -> FsResult<Store> {
        self.stores
            .get(&target)
            .cloned()
            .ok_or_else(|| fs_err!(NotFound, "storage target {target} is not served by storage node {}", self.node))
    }

    /// The store of `target` for mirrored chunks (`<target>/mirror/`) or the plain one.
    fn store_of(&self, target: TargetId, mirrored: bool) -> FsResult<Store> {
        if !mirrored {
            return self.store(target);
        }
        self.mirror
            .store(target)
            .ok_or_else(|| fs_err!(NotFound, "storage target {target} is not served by storage node {}", self.node))
    }

    /// `Request::StatChunks` (its length checked by `Request::check_batch`):
    /// every named target must be served here (unmirrored); one blocking
    /// task stats them all.
    async fn stat_chunks(&self, entry: EntryId, targets: Vec<TargetId>, mirrored: bool) -> FsResult<Reply> {
        if mirrored {
            return Err(fs_err!(Invalid, "StatChunks of file {entry} names buddy groups: ask each group's primary"));
        }
        let stores = targets.iter().map(|t| self.store(*t)).collect::<FsResult<Vec<_>>>()?;
        blocking(move || stores.iter().map(|s| s.stat(entry)).collect::<FsResult<Vec<u64>>>())
            .await
            .map(Reply::ChunkLens)
    }

    /// `Request::CopyChunk`: within this node's disks, or reading the source
    /// from the node that serves it.
    async fn copy_chunk(&self, c: ChunkCopy) -> FsResult<u32> {
        let ChunkCopy { target, entry, offset, src_target, src_entry, src_offset, len } = c;
        if len > MAX_PAYLOAD_LEN {
            return Err(fs_err!(
                Invalid,
                "target {target}, chunk {entry}: copy of {len} bytes exceeds the limit of {MAX_PAYLOAD_LEN}"
            ));
        }
        let dst = self.store(target)?;
        self.throttle(target, u64::from(len)).await;
        if let Some(src) = self.stores.get(&src_target).cloned() {
            self.throttle(src_target, u64::from(len)).await;
            return blocking(move || dst.copy_from((entry, offset), &*src, (src_entry, src_offset), len)).await;
        }
        let read = Request::ReadChunk { target: src_target, entry: src_entry, offset: src_offset, len };
        let pool = self.cluster.target_pool(src_target).await?;
        let mut data = match pool.call(&read, Vec::new()).await {
            Ok((Reply::Data, data)) => data,
            Ok((r, _)) => return Err(fs_err!(Protocol, "storage target {src_target}: odd read reply {r:?}")),
            Err(e) => {
                return Err(FsError::new(e.code, format!("copy from storage target {src_target}: {}", e.message)))
            }
        };
        // Past the source chunk file's end: zeroes.
        data.resize(len as usize, 0);
        chunk_io(data.len(), move || dst.write(entry, offset, &data)).await
    }

    /// Waits for `target`'s rate limit, if it has one, to admit `bytes`.
    async fn throttle(&self, target: TargetId, bytes: u64) {
        if let Some(l) = self.limits.get(&target) {
            l.acquire(bytes).await;
        }
    }

    /// The stores a `StorageBench` names (all of this node's when `targets` is empty), sorted by id then.
    fn bench_stores(&self, targets: &[TargetId]) -> FsResult<Vec<Store>> {
        if targets.is_empty() {
            let mut all: Vec<_> = self.stores.values().cloned().collect();
            all.sort_by_key(|s| s.target());
            return Ok(all);
        }
        targets.iter().map(|&t| self.store(t)).collect()
    }

    /// Applies a chunk request to this node's own copy: the plain chunk
    /// files, or the mirrored ones (`mirrored`) once `mirror` has decided
    /// this node may.
    async fn apply(&self, req: Request, payload: Bytes, mirrored: bool) -> (Response, Vec<u8>) {
        if let Err(e) = req.check_batch() {
            return (Err(e), Vec::new());
        }
        let r = match req {
            Request::Ping => Ok(Reply::Pong { node_type: NodeType::Storage, node: self.node }),
            Request::WriteChunk { target, entry, offset } => match self.store_of(target, mirrored) {
                Ok(s) => {
                    self.throttle(target, payload.len() as u64).await;
                    hivefs_metrics::target_io(target.0, "write", payload.len() as u64);
                    chunk_io(payload.len(), move || s.write(entry, offset, &payload)).await.map(Reply::Written)
                }
                Err(e) => Err(e),
            },
            Request::ReadChunk { target, entry, offset, len } => {
                if len > MAX_PAYLOAD_LEN {
                    Err(fs_err!(
                        Invalid,
                        "target {target}, chunk {entry}: read of {len} bytes exceeds the limit of {MAX_PAYLOAD_LEN}"
                    ))
                } else {
                    match self.store_of(target, mirrored) {
                        Ok(s) => match cached_read(s, entry, offset, len).await {
                            Ok(data) => {
                                self.throttle(target, data.len() as u64).await;
                                hivefs_metrics::target_io(target.0, "read", data.len() as u64);
                                return (Ok(Reply::Data), data);
                            }
                            Err(e) => Err(e),
                        },
                        Err(e) => Err(e),
                    }
                }
            }
            Request::TruncateChunk { target, entry, len } => match self.store_of(target, mirrored) {
                Ok(s) => blocking(move || s.truncate(entry, len)).await.map(|()| Reply::Ok),
                Err(e) => Err(e),
            },
            Request::UnlinkChunk { target, entry } => match self.store_of(target, mirrored) {
                Ok(s) => blocking(move || s.unlink(entry)).await.map(|()| Reply::Ok),
                Err(e) => Err(e),
            },
            // One blocking task for the whole batch (ChunkFiles::unlink_batch bounds its length).
            Request::UnlinkChunks { target, entries } => match self.store_of(target, mirrored) {
                Ok(s) => blocking(move || s.unlink_batch(&entries)).await.map(|()| Reply::Ok),
                Err(e) => Err(e),
            },
            Request::StatChunk { target, entry } => match self.store_of(target, mirrored) {
                Ok(s) => blocking(move || s.stat(entry)).await.map(Reply::ChunkLen),
                Err(e) => Err(e),
            },
            Request::StatChunks { entry, targets } => self.stat_chunks(entry, targets, mirrored).await,
            Request::FallocateChunk { target, entry, mode, offset, len } => match self.store_of(target, mirrored) {
                Ok(s) => blocking(move || s.fallocate(entry, mode, offset, len)).await.map(|()| Reply::Ok),
                Err(e) => Err(e),
            },
            Request::SeekChunk { target, entry, offset, hole } => match self.store_of(target, mirrored) {
                Ok(s) => blocking(move || s.seek(entry, offset, hole)).await.map(Reply::Seek),
                Err(e) => Err(e),
            },
            Request::CopyChunk(c) => self.copy_chunk(c).await.map(Reply::Written),
            Request::FsyncChunk { target, entry } => match self.store_of(target, mirrored) {
                Ok(s) => blocking(move || s.fsync(entry)).await.map(|()| Reply::Ok),
                Err(e) => Err(e),
            },
            Request::ListChunks { target, after, max } => match self.store_of(target, mirrored) {
                Ok(s) => blocking(move || s.list(after, max.clamp(1, LIST_CHUNKS_MAX) as usize))
                    .await
                    .map(|(chunks, more)| Reply::Chunks { chunks, more }),
                Err(e) => Err(e),
            },
            Request::DigestChunks { target, entries } => match self.store_of(target, mirrored) {
                Ok(s) => blocking(move || entries.iter().map(|e| s.digest(*e)).collect::<FsResult<Vec<_>>>())
                    .await
                    .map(Reply::ChunkDigests),
                Err(e) => Err(e),
            },
            Request::StorageBench { targets, bytes_per_target, block_bytes, threads, direct } => {
                let params = bench::Params { bytes_per_target, block_bytes, threads, direct };
                match self.bench_stores(&targets) {
                    Ok(stores) => bench::run(stores, params).await.map(Reply::StorageBench),
                    Err(e) => Err(e),
                }
            }
            Request::NetBenchWrite => Ok(Reply::Written(payload.len() as u32)),
            Request::NetBenchRead { len } if len > MAX_PAYLOAD_LEN => Err(fs_err!(
                Invalid,
                "storage node {}: net bench read of {len} bytes exceeds {MAX_PAYLOAD_LEN}",
                self.node
            )),
            Request::NetBenchRead { len } => return (Ok(Reply::Data), vec![0u8; len as usize]),
            other => Err(fs_err!(NotSupported, "storage node {} does not serve {}", self.node, other.name())),
        };
        (r, Vec::new())
    }
}

impl Handler for StorageHandler {
    async fn handle(
        &self,
        env: hivefs_proto::Envelope,
        req: Request,
        payload: Vec<u8>,
        _peer: &Peer,
    ) -> (Response, Vec<u8>) {
        self.serve(env, req, payload).await
    }
}

impl StorageHandler {
    async fn serve(&self, env: hivefs_proto::Envelope, req: Request, payload: Vec<u8>) -> (Response, Vec<u8>) {
        match self.ready.get() {
            Some(ready) => match env.mirror {
                Some(h) => mirror::handle(ready, h, req, payload).await,
                None => ready.apply(req, Bytes::from(payload), false).await,
            },
            None => {
                (Err(fs_err!(Unavailable, "storage service is starting (not yet registered with mgmtd)")), Vec::new())
            }
        }
    }
}

/// One target as opened at start.
struct Opened {
    dir: PathBuf,
    file: TargetFile,
}

/// Registers each target with mgmtd and persists its id; checks stored ids.
async fn register_targets(mgmt: &dyn Call, node: NodeId, opened: &mut [Opened]) -> Result<Vec<TargetId>, StorageError> {
    let mut ids = Vec::with_capacity(opened.len());
    for t in opened.iter_mut() {
        if let Some(stored) = t.file.node_id {
            if stored != node {
                return Err(StorageError::TargetNodeMismatch { dir: t.dir.clone(), stored, node });
            }
        }
        let mgmt_err = |source: FsError| StorageError::Mgmt { mgmtd: mgmt.addr().to_string(), source };
        // A target whose space cannot be read registers without capacity
        // (mgmtd then keeps it in the emergency pool until a heartbeat says more).
        let capacity = hivefs_cluster::capacity_of(&t.dir).unwrap_or_default();
        let req = Request::RegisterTarget { node, uuid: t.file.uuid.clone(), capacity };
        let assigned = match mgmt.rpc(&req).await {
            Ok(Reply::TargetRegistered { target, .. }) => target,
            Ok(other) => return Err(mgmt_err(fs_err!(Protocol, "unexpected reply to RegisterTarget: {other:?}"))),
            Err(e) => return Err(mgmt_err(e)),
        };
        match t.file.target_id {
            Some(stored) if stored != assigned => {
                return Err(StorageError::TargetIdMismatch {
                    dir: t.dir.clone(),
                    stored,
                    assigned,
                    mgmtd: mgmt.addr().to_string(),
                    uuid: t.file.uuid.clone(),
                })
            }
            Some(_) if t.file.node_id == Some(node) => {}
            _ => {
                t.file.target_id = Some(assigned);
                t.file.node_id = Some(node);
                let (file, dir) = (t.file.clone(), t.dir.clone());
                io_task(move || file.save(&dir))
                    .await
                    .map_err(|e| StorageError::Config(format!("target file writer failed: {e}")))??;
            }
        }
        info!(target = %assigned, dir = %t.dir.display(), "target registered");
        ids.push(assigned);
    }
    Ok(ids)
}

/// Opens the targets, registers with mgmtd and serves chunk requests over TCP.
pub async fn start(cfg: Config) -> Result<StorageService, StorageError> {
    start_with(cfg, Net::Tcp, Disk::Files).await
}

/// The chunk files of one target, as the service uses them.
type Store = Arc<dyn ChunkFiles>;

/// How the service reaches its targets' chunk files.
#[derive(Clone, Default)]
pub enum Disk {
    /// The files below the target directories.
    #[default]
    Files,
    /// Those, through a wrapper: a simulation's failing disk (`hivefs-sim`).
    Wrapped(hivefs_chunk::Wrap),
}

impl Disk {
    /// The chunk files below `dir` (a target's, or its `mirror/`) of `target`.
    fn open(&self, target: TargetId, dir: &std::path::Path) -> Store {
        let files: Store = Arc::new(ChunkStore::new(target, dir));
        match self {
            Disk::Files => files,
            Disk::Wrapped(wrap) => wrap(files),
        }
    }
}

/// [`start`] on the network `net`, with the chunk files as `disk` has them.
pub async fn start_with(cfg: Config, net: Net, disk: Disk) -> Result<StorageService, StorageError> {
    if cfg.targets.is_empty() {
        return Err(StorageError::Config("no storage targets configured".into()));
    }
    if cfg.heartbeat_interval_ms == 0 {
        return Err(StorageError::Config("heartbeat_interval_ms must be at least 1".into()));
    }
    let rate_limit = match &cfg.target_rate_limit {
        Some(r) => r.bytes_per_s()?,
        None => None,
    };
    let secret = match &cfg.secret_file {
        Some(p) => Some(hivefs_net::load_secret(p).map_err(StorageError::Secret)?),
        None => None,
    };
    std::fs::create_dir_all(&cfg.dir).map_err(|e| StorageError::io(&cfg.dir, e))?;
    let mut opened: Vec<Opened> = Vec::with_capacity(cfg.targets.len());
    for dir in &cfg.targets {
        let file = open_target(dir, cfg.fs_uuid.as_deref())?;
        if let Some(o) = opened.iter().find(|o| o.file.uuid == file.uuid) {
            return Err(StorageError::DuplicateTarget { first: o.dir.clone(), second: dir.clone(), uuid: file.uuid });
        }
        opened.push(Opened { dir: dir.clone(), file });
    }
    let mut identity = NodeIdentity::load_or_create(&cfg.dir).map_err(|e| StorageError::io(&cfg.dir, e))?;

    let handler = Arc::new(StorageHandler { ready: OnceLock::new() });
    let pools = match &net {
        Net::Tcp => hivefs_net::Pools::new(ClientConfig::new(secret.clone())),
        Net::Pools(p) => p.with_config(ClientConfig::new(secret.clone())),
    };
    let server = match net {
        Net::Tcp => Some(
            serve(&cfg.listen, ServerConfig::new(NodeType::Storage, secret.clone()), handler.clone())
                .await
                .map_err(|source| StorageError::Listen { addr: cfg.listen.clone(), source })?,
        ),
        Net::Pools(_) => None,
    };
    // From here on, an error drops `server`'s task (abort) before returning.
    let server = AbortOnDrop(server);
    let local_addr = match &server.0 {
        Some(s) => s.local_addr,
        None => SocketAddr::from(([0, 0, 0, 0], 0)),
    };
    let advertise = match &cfg.advertise {
        Some(a) => a.clone(),
        None if local_addr.ip().is_unspecified() => {
            return Err(StorageError::Config(format!(
                "listen address {} is not reachable by peers; set `advertise` to the address they should use",
                cfg.listen
            )))
        }
        None => local_addr.to_string(),
    };

    let mgmt: Arc<dyn Call> = pools.get(&cfg.mgmtd);
    let node = hivefs_cluster::register_node(
        &*mgmt,
        NodeType::Storage,
        &cfg.dir,
        &mut identity,
        &advertise,
        REGISTER_DEADLINE,
    )
    .await
    .map_err(|source| StorageError::Mgmt { mgmtd: cfg.mgmtd.clone(), source })?;
    let ids = register_targets(&*mgmt, node, &mut opened).await?;

    let stores: HashMap<TargetId, Store> =
        ids.iter().zip(&opened).map(|(&id, o)| (id, disk.open(id, &o.dir))).collect();
    if server.0.is_some() {
        let space: Vec<(TargetId, PathBuf)> = ids.iter().zip(&opened).map(|(&id, o)| (id, o.dir.clone())).collect();
        hivefs_metrics::on_scrape(move || {
            for t in sample(&space) {
                hivefs_metrics::target_space(t.target.0, node.0, t.capacity.total_bytes, t.capacity.free_bytes);
            }
        });
    }
    for s in stores.values() {
        // Otherwise made one by one, each with an fsync, under the first files.
        if let Err(e) = s.make_subdirs() {
            warn!(target = %s.target(), dir = %s.dir().display(), "making the chunk sub-directories: {e}; they are made as needed");
        }
    }
    let limits = match rate_limit {
        Some(r) => {
            info!(bytes_per_s = r, targets = ?ids, "target rate limit (target_rate_limit) in force");
            ids.iter().map(|&id| (id, Arc::new(RateLimit::new(r)))).collect()
        }
        None => HashMap::new(),
    };
    let cluster = hivefs_cluster::Cluster::new(&cfg.mgmtd, pools.with_config(ClientConfig::new(secret.clone())));
    let forward_cfg =
        ClientConfig::new(secret.clone()).with_timeout(Duration::from_millis(cfg.mirror_forward_timeout_ms.max(100)));
    let mirror_cluster = hivefs_cluster::Cluster::new(&cfg.mgmtd, pools.with_config(forward_cfg));
    let dirs: Vec<(TargetId, PathBuf)> = ids.iter().zip(&opened).map(|(&id, o)| (id, o.dir.clone())).collect();
    let mirror = Arc::new(mirror::Mirror::open(node, mgmt.clone(), mirror_cluster, &dirs, &disk)?);
    let local = if cfg.short_circuit && server.0.is_some() {
        let name = hivefs_chunk::local::socket_name(node, local_addr.port());
        let limited = limits.keys().copied().collect();
        let opener = Arc::new(LocalOpener { node, stores: stores.clone(), limited, mirror: mirror.clone() });
        match hivefs_chunk::local::serve_local(&name, node, secret.clone(), opener) {
            Ok(l) => {
                debug!(socket = %name, "short-circuit chunk access offered to clients on this host");
                Some(l)
            }
            Err(e) => {
                warn!(socket = %name, "short-circuit chunk access not offered: cannot listen: {e}");
                None
            }
        }
    } else {
        None
    };
    if handler.ready.set(Ready { node, cluster, stores, limits, mirror: mirror.clone() }).is_err() {
        unreachable!("the handler is made ready once");
    }
    let hb = Heartbeat {
        mgmt,
        node,
        identity,
        dir: cfg.dir.clone(),
        advertise,
        targets: ids.iter().zip(&opened).map(|(&id, o)| (id, o.file.uuid.clone(), o.dir.clone())).collect(),
        every: Duration::from_millis(cfg.heartbeat_interval_ms),
        mirror: mirror.clone(),
    };
    let heartbeat = tokio::spawn(hb.run());
    info!(%node, addr = %local_addr, targets = ?ids, "storage service started");
    Ok(StorageService {
        local_addr,
        node_id: node,
        targets: ids,
        server: server.take(),
        handler,
        heartbeat,
        mirror,
        _local: local,
    })
}

struct AbortOnDrop(Option<ServerHandle>);

impl AbortOnDrop {
    fn take(mut self) -> Option<ServerHandle> {
        self.0.take()
    }
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        if let Some(s) = &self.0 {
            s.abort();
        }
    }
}

/// The heartbeat loop: capacities every `every`; if mgmtd no longer knows
/// this node (its registry was replaced), registers again under the same
/// uuids and checks that the ids did not change.
struct Heartbeat {
    mgmt: Arc<dyn Call>,
    node: NodeId,
    identity: NodeIdentity,
    dir: PathBuf,
    advertise: String,
    /// (id, uuid, directory) of each target.
    targets: Vec<(TargetId, String, PathBuf)>,
    every: Duration,
    /// Takes the lease of each answer; reloads roles and starts resyncs.
    mirror: Arc<mirror::Mirror>,
}

impl Heartbeat {
    async fn run(mut self) {
        let mut failing = false;
        loop {
            let dirs: Vec<(TargetId, PathBuf)> = self.targets.iter().map(|(id, _, d)| (*id, d.clone())).collect();
            let targets = io_task(move || sample(&dirs)).await.unwrap_or_default();
            let req = Request::Heartbeat { node_type: NodeType::Storage, node: self.node, targets, meta: None };
            let sent = tokio::time::Instant::now();
            match self.mgmt.rpc(&req).await {
                Ok(r) => {
                    if failing {
                        info!("heartbeats to mgmtd {} work again", self.mgmt.addr());
                    }
                    failing = false;
                    let lease = match r {
                        Reply::HeartbeatAck { lease_ms } => Some((sent, lease_ms)),
                        _ => None,
                    };
                    // Off the heartbeat's beat: a slow view refresh must not delay the next heartbeat.
                    self.mirror.spawn_after_heartbeat(lease);
                }
                Err(e) if e.code == ErrorCode::NotFound => {
                    warn!("mgmtd {} does not know this node: {e}; registering again", self.mgmt.addr());
                    if let Err(e) = self.register_again().await {
                        error!("registering again with mgmtd {} failed: {e}", self.mgmt.addr());
                    }
                }
                Err(e) if !failing => {
                    warn!("heartbeat to mgmtd {} failed: {e}", self.mgmt.addr());
                    failing = true;
                }
                Err(e) => debug!("heartbeat to mgmtd {} failed: {e}", self.mgmt.addr()),
            }
            tokio::time::sleep(self.every).await;
        }
    }

    async fn register_again(&mut self) -> Result<(), FsError> {
        let node = hivefs_cluster::register_node(
            &*self.mgmt,
            NodeType::Storage,
            &self.dir,
            &mut self.identity,
            &self.advertise,
            Duration::ZERO,
        )
        .await?;
        debug_assert_eq!(node, self.node, "register_node refuses a changed id");
        for (id, uuid, dir) in &self.targets {
            let capacity = hivefs_cluster::capacity_of(dir).unwrap_or_default();
            match self.mgmt.rpc(&Request::RegisterTarget { node, uuid: uuid.clone(), capacity }).await? {
                Reply::TargetRegistered { target, .. } if target == *id => {}
                Reply::TargetRegistered { target, .. } => {
                    return Err(fs_err!(
                        Invalid,
                        "mgmtd assigned target {target} to target dir {} (uuid {uuid}), which is target {id}",
                        dir.display()
                    ))
                }
                other => return Err(fs_err!(Protocol, "unexpected reply to RegisterTarget: {other:?}")),
            }
        }
        Ok(())
    }
}

/// Capacities of the targets. A target whose file system cannot be queried
/// is left out, so mgmtd sees it stop reporting and marks it offline.
fn sample(targets: &[(TargetId, PathBuf)]) -> Vec<TargetCapacity> {
    targets
        .iter()
        .filter_map(|(target, dir)| match hivefs_cluster::capacity_of(dir) {
            Ok(capacity) => Some(TargetCapacity { target: *target, capacity }),
            Err(e) => {
                warn!(%target, "statvfs of {} failed: {e}", dir.display());
                None
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_defaults_and_unknown_keys() {
        let c: Config = toml::from_str("targets = [\"/a\"]\nfs_uuid = \"x\"").unwrap();
        assert_eq!(c.listen, "127.0.0.1:8003");
        assert_eq!(c.mgmtd, "127.0.0.1:8008");
        assert_eq!(c.heartbeat_interval_ms, 1000);
        assert_eq!(c.targets, vec![PathBuf::from("/a")]);
        assert!(toml::from_str::<Config>("target = []").is_err());
        assert_eq!(c.target_rate_limit, None);
        let c: Config = toml::from_str("target_rate_limit = \"40MiB\"").unwrap();
        assert_eq!(c.target_rate_limit.unwrap().bytes_per_s().unwrap(), Some(40 << 20));
        let c: Config = toml::from_str("target_rate_limit = 0").unwrap();
        assert_eq!(c.target_rate_limit.unwrap().bytes_per_s().unwrap(), None);
    }

    #[test]
    fn statvfs_reports_space() {
        let d = tempfile::tempdir().unwrap();
        let c = hivefs_cluster::capacity_of(d.path()).unwrap();
        assert!(c.total_bytes > 0 && c.free_bytes <= c.total_bytes, "{c:?}");
        assert!(hivefs_cluster::capacity_of(&d.path().join("missing")).is_err());
    }

    #[tokio::test]
    async fn unlink_chunks_request_deletes_a_batch_in_one_go() {
        use hivefs_types::ids::EntryId;
        let d = tempfile::tempdir().unwrap();
        init_target(d.path(), "fs").unwrap();
        let store: Store = Arc::new(ChunkStore::new(TargetId(5), d.path()));
        let cluster = hivefs_cluster::Cluster::new("127.0.0.1:1", hivefs_net::Pools::new(ClientConfig::new(None)));
        let mgmt = cluster.mgmt();
        let mirror =
            mirror::Mirror::open(NodeId(2), mgmt, cluster.clone(), &[(TargetId(5), d.path().into())], &Disk::Files)
                .unwrap();
        let ready = Ready {
            node: NodeId(2),
            cluster,
            stores: HashMap::from([(TargetId(5), store.clone())]),
            limits: HashMap::new(),
            mirror: Arc::new(mirror),
        };
        let ids: Vec<EntryId> = (1..=6).map(|c| EntryId { node: 1, epoch: 1, counter: c }).collect();
        for id in &ids[..3] {
            store.write(*id, 0, b"chunk").unwrap();
        }
        // Existing and missing chunk files together: Ok, and all are gone.
        let req = Request::UnlinkChunks { target: TargetId(5), entries: ids.clone() };
        assert_eq!(ready.apply(req.clone(), Bytes::new(), false).await.0, Ok(Reply::Ok));
        assert!(ids.iter().all(|id| !d.path().join(hivefs_chunk::chunk_rel_path(*id)).exists()));
        assert_eq!(ready.apply(req, Bytes::new(), false).await.0, Ok(Reply::Ok), "idempotent");
        // Over-long: refused, naming the target; nothing removed.
        store.write(ids[0], 0, b"chunk").unwrap();
        let long = vec![ids[0]; hivefs_proto::UNLINK_CHUNKS_MAX + 1];
        let e = ready.apply(Request::UnlinkChunks { target: TargetId(5), entries: long }, Bytes::new(), false).await.0;
        let e = e.unwrap_err();
        assert_eq!(e.code, ErrorCode::Invalid);
        assert!(e.message.contains("target 5"), "{e}");
        assert!(d.path().join(hivefs_chunk::chunk_rel_path(ids[0])).exists());
        // A target this node does not serve.
        let e = ready.apply(Request::UnlinkChunks { target: TargetId(6), entries: ids }, Bytes::new(), false).await.0;
        let e = e.unwrap_err();
        assert_eq!(e.code, ErrorCode::NotFound);
        assert!(e.message.contains("storage target 6"), "{e}");
    }

    #[test]
    fn short_circuit_hands_out_only_unlimited_targets_of_this_node() {
        use hivefs_chunk::local::{ChunkOpener, Offer};
        let d = tempfile::tempdir().unwrap();
        init_target(d.path(), "fs").unwrap();
        let store: Store = Arc::new(ChunkStore::new(TargetId(5), d.path()));
        let stores = HashMap::from([(TargetId(5), store.clone()), (TargetId(7), store.clone())]);
        let cluster = hivefs_cluster::Cluster::new("127.0.0.1:1", hivefs_net::Pools::new(ClientConfig::new(None)));
        let mirror =
            mirror::Mirror::open(NodeId(2), cluster.mgmt(), cluster, &[(TargetId(5), d.path().into())], &Disk::Files)
                .unwrap();
        let o = LocalOpener { node: NodeId(2), stores, limited: [TargetId(7)].into(), mirror: Arc::new(mirror) };
        let e = EntryId { node: 1, epoch: 1, counter: 9 };
        assert!(matches!(o.open(TargetId(5), e, false), Ok(Offer::NoChunk)));
        let Ok(Offer::File(f)) = o.open(TargetId(5), e, true) else { panic!("no file for a write") };
        std::os::unix::fs::FileExt::write_all_at(&f, b"direct", 0).unwrap();
        assert_eq!(store.read(e, 0, 64).unwrap(), b"direct", "the handed-out file is the chunk file");
        let Ok(Offer::Refused(why)) = o.open(TargetId(7), e, false) else { panic!("rate-limited target handed out") };
        assert!(why.contains("target 7") && why.contains("rate limit"), "{why}");
        let Ok(Offer::Refused(why)) = o.open(TargetId(6), e, true) else { panic!("unknown target handed out") };
        assert!(why.contains("target 6") && why.contains("storage node 2"), "{why}");
        // Mirrored chunks: only from the group's primary (this node knows of no
        // group here), never from a rate-limited target.
        let g = hivefs_types::ids::BuddyGroupId(1);
        let err = o.open_mirrored(TargetId(5), e, g, 0).unwrap_err();
        assert!(err.message.contains("not the primary of buddy group 1"), "{err}");
        let Ok((Offer::Refused(why), _)) = o.open_mirrored(TargetId(7), e, g, 0) else { panic!("rate-limited") };
        assert!(why.contains("rate limit"), "{why}");
        assert!(toml::from_str::<Config>("short_circuit = false").is_ok_and(|c| !c.short_circuit));
        assert!(Config::default().short_circuit);
    }

    #[tokio::test]
    async fn start_refuses_bad_targets_before_contacting_mgmtd() {
        let d = tempfile::tempdir().unwrap();
        let t = d.path().join("t");
        std::fs::create_dir(&t).unwrap();
        let cfg = Config {
            dir: d.path().join("svc"),
            targets: vec![t.clone()],
            listen: "127.0.0.1:0".into(),
            mgmtd: "127.0.0.1:1".into(),
            ..Default::default()
        };
        let e = start(cfg.clone()).await.err().unwrap();
        assert_eq!(e.to_string(), format!("target dir {} is not formatted; run hivefs storage --init", t.display()));

        init_target(&t, "fs-a").unwrap();
        let e = start(Config { fs_uuid: Some("fs-b".into()), ..cfg.clone() }).await.err().unwrap();
        assert!(matches!(e, StorageError::ForeignFileSystem { .. }), "{e}");

        let e = start(Config { targets: vec![t.clone(), t.clone()], ..cfg.clone() }).await.err().unwrap();
        assert!(matches!(e, StorageError::DuplicateTarget { .. }), "{e}");

        let bad_rate = Some(RateSetting::Text("quick".into()));
        let e = start(Config { target_rate_limit: bad_rate, ..cfg.clone() }).await.err().unwrap().to_string();
        assert!(e.contains("target_rate_limit") && e.contains("quick"), "{e}");

        let e = start(Config { targets: vec![], ..cfg.clone() }).await.err().unwrap();
        assert!(matches!(e, StorageError::Config(_)), "{e}");

        let e = start(Config { listen: "0.0.0.0:0".into(), ..cfg }).await.err().unwrap();
        assert!(e.to_string().contains("advertise"), "{e}");
    }
}
