//! `hivefs mgmtd|meta|storage|mount`: run one service in the foreground
//! until SIGTERM/SIGINT. Config comes from a TOML file (`--config`), then
//! flags override single keys.

use crate::notify::notify;
use crate::util::{init_logging, load_config, wait_for_signal};
use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use hivefs_client::{Client, Options};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tracing::info;

#[derive(Args, Debug)]
pub struct Common {
    /// TOML config file; every key has a default, unknown keys are refused.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Data directory of the service.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Address to listen on, host:port.
    #[arg(long)]
    pub listen: Option<String>,
    /// Shared secret file for connection authentication (must not be readable by others).
    #[arg(long)]
    pub secret_file: Option<PathBuf>,
    /// Log level (error, warn, info, debug, trace); HIVEFS_LOG overrides.
    #[arg(long, default_value = "info")]
    pub log_level: String,
    /// Serve Prometheus metrics (`GET /metrics`) on this address, host:port
    /// (the config key `metrics_listen`).
    #[arg(long)]
    pub metrics_listen: Option<String>,
}

#[derive(Args, Debug)]
pub struct MgmtdArgs {
    #[command(flatten)]
    pub common: Common,
}

/// Flags of services that join a file system through mgmtd.
#[derive(Args, Debug)]
pub struct Member {
    /// Address of mgmtd, host:port.
    #[arg(long)]
    pub mgmtd: Option<String>,
    /// Address other nodes use to reach this one (default: the listen address).
    #[arg(long)]
    pub advertise: Option<String>,
}

impl Member {
    fn apply(&self, mgmtd: &mut String, advertise: &mut Option<String>) {
        if let Some(m) = &self.mgmtd {
            *mgmtd = m.clone();
        }
        if self.advertise.is_some() {
            *advertise = self.advertise.clone();
        }
    }
}

#[derive(Args, Debug)]
pub struct MetaArgs {
    #[command(flatten)]
    pub common: Common,
    #[command(flatten)]
    pub member: Member,
}

#[derive(Args, Debug)]
pub struct StorageArgs {
    #[command(flatten)]
    pub common: Common,
    #[command(flatten)]
    pub member: Member,
    /// A storage target directory (repeat for several targets).
    #[arg(long = "target")]
    pub targets: Vec<PathBuf>,
    /// Uuid of the file system the targets belong to.
    #[arg(long)]
    pub fs_uuid: Option<String>,
    /// Format the target directories (needs --fs-uuid) and exit.
    #[arg(long)]
    pub init: bool,
}

#[derive(Args, Debug)]
pub struct MountArgs {
    /// Address of mgmtd, host:port.
    #[arg(long, default_value = "127.0.0.1:8008")]
    pub mgmtd: String,
    /// Shared secret file.
    #[arg(long)]
    pub secret_file: Option<PathBuf>,
    /// Only the mounting user may use the mount (default: every user, allow_other).
    #[arg(long)]
    pub private: bool,
    /// Threads reading /dev/fuse (requests themselves run concurrently on the async runtime).
    #[arg(long, default_value_t = 2)]
    pub fuse_threads: usize,
    /// How the kernel's requests reach the mount: `io_uring` (FUSE over io_uring, Linux
    /// 6.14+ with the fuse module's `enable_uring` parameter set; one queue per CPU),
    /// `dev` (read and write on /dev/fuse), or `auto`: io_uring when the kernel offers it.
    /// Forgets and interrupts always come through /dev/fuse.
    #[arg(long, default_value = "auto", value_parser = ["auto", "dev", "io_uring"])]
    pub fuse_transport: String,
    /// Longest a file-system operation waits for a server that does not answer (a dead
    /// node, a cut link), retries and reconnects included, before it fails with EIO or
    /// ETIMEDOUT. Operations on other servers go on meanwhile. A process killed while it
    /// waits in a read, write, sync or stat (Ctrl-C) is let go at once (over /dev/fuse).
    #[arg(long, default_value_t = 30_000)]
    pub io_timeout_ms: u64,
    /// Longest an operation on a mirrored file waits for its buddy group to have a
    /// primary that answers (a failover takes mgmtd's `failover_after_ms`); then it
    /// fails with EIO. Both buddies dead: EIO after this long.
    #[arg(long, default_value_t = 90_000)]
    pub mirror_retry_ms: u64,
    /// Leave flock/fcntl locks to this machine's kernel and append at the offset it
    /// passes (default: global file locks and appends, checked by the metadata nodes
    /// across all clients).
    #[arg(long)]
    pub local_locks: bool,
    /// Send all chunk I/O over TCP. By default, the chunk files of storage services on
    /// this machine (same network namespace) are read and written directly through file
    /// descriptors the service hands over on a local socket: the same files and the
    /// same page cache, so nothing changes for other clients, without a network round
    /// trip per request. Targets with a rate limit always go over TCP.
    #[arg(long)]
    pub no_short_circuit: bool,
    /// How long the kernel may use a directory's attributes (mode, owner, times) without
    /// asking the metadata node, in milliseconds. Saves the round trips of the kernel's
    /// permission checks on every directory of a path. Changes through this mount are seen
    /// at once, changes by other clients after at most this long. Files' attributes are
    /// never cached. 0: directories' are not cached either.
    #[arg(long, default_value_t = hivefs_fuse::DIR_ATTR_TTL.as_millis() as u64)]
    pub dir_attr_ttl_ms: u64,
    /// What the kernel may cache of files' contents. `native`: nothing, every read and
    /// write goes to the storage targets (direct I/O), and clients see each other's
    /// writes as soon as they return. `paged`: the kernel's page cache serves reads and
    /// reads ahead, writes go through to the targets before they return, and a file's
    /// cache is dropped when it is opened: a client sees what others left on close
    /// (close-to-open), not what they write while it keeps the file open. `buffered`:
    /// direct I/O, but writes are kept in the mount (per file, adjacent ones merged) and
    /// sent in the background, several flushes in flight; a write returns once copied.
    /// Reads through this mount see its writes; other clients see them once flushed: at
    /// the latest at fsync, close, a lock operation, a full buffer (`--writeback-buffer`)
    /// or 100 ms after the write. A failed flush is returned by the next write, fsync or
    /// close. O_APPEND writes bypass caching in every mode (the metadata node picks
    /// their offset).
    #[arg(long, default_value = "native", value_parser = ["native", "paged", "buffered"])]
    pub cache_mode: String,
    /// Cache mode buffered: bytes of one file's writes kept before they are sent
    /// (suffixes k, m). Up to four such buffers per file are in flight at once; all files
    /// together hold at most 64 buffers' worth (64 MiB by default), beyond which writes
    /// wait for their file's flush.
    #[arg(long, default_value = "1m", value_parser = crate::util::parse_size)]
    pub writeback_buffer: u64,
    /// When reads move access times (kept by the metadata nodes, seen by every client).
    /// `noatime`: never (no metadata request for reads). `relatime`: Linux's default rule,
    /// a read moves the access time when it is not newer than the modification or change
    /// time, or is a day old (one request per open file or directory that is read, only
    /// committed when the rule says so). `strictatime`: every read (requests coalesced per
    /// file: one in flight at a time; directories once per open).
    #[arg(long, default_value = "noatime", value_parser = ["noatime", "relatime", "strictatime"])]
    pub atime: String,
    /// Do not enforce POSIX ACLs: the mode bits alone decide access, the kernel applies
    /// the umask, and new entries do not inherit their directory's default ACL. ACL
    /// attributes are still stored and shown (getfacl), and a chmod still updates them.
    /// By default the kernel checks access ACLs with the mode bits and new entries
    /// inherit default ACLs (see docs/decisions.md, "POSIX ACLs").
    #[arg(long)]
    pub no_acl: bool,
    /// Ask the metadata node at every create. By default a file created in a directory
    /// this mount made (while it holds the lease on that directory's names) is answered
    /// at once under an id the node handed out ahead, and sent to the node with the other
    /// new files of that moment in one request, within about a round trip. Other clients
    /// see it whenever they look (they recall the lease, which waits for it); its close and
    /// fsync (of the file or the directory) return once it is on the node, with the node's
    /// error if it refused it; a mount killed before it was sent loses it (not closed yet).
    #[arg(long)]
    pub no_create_ahead: bool,
    /// Log level.
    #[arg(long, default_value = "info")]
    pub log_level: String,
    /// Serve Prometheus metrics (`GET /metrics`) of this mount on this address, host:port.
    #[arg(long)]
    pub metrics_listen: Option<String>,
    /// Empty directory to mount on.
    pub mountpoint: PathBuf,
}

/// The write-back limits of `hivefs mount --writeback-buffer BYTES`.
fn writeback_limits(bytes: u64) -> Result<hivefs_client::writeback::WriteBackLimits> {
    const MAX: u64 = 64 << 20;
    if !(4096..=MAX).contains(&bytes) {
        bail!("--writeback-buffer must be 4k..=64m, not {bytes} bytes");
    }
    // The mount's buffers hold 64 files' worth at most in all.
    let bytes = bytes as usize;
    Ok(hivefs_client::writeback::WriteBackLimits { bytes, total: 64 * bytes, ..Default::default() })
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread().enable_all().build().context("cannot start the async runtime")
}

/// The runtime of a service with `workers` threads.
fn runtime_with(workers: usize) -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

/// Starts the metrics endpoint of this process (named `service`) when it has an address.
async fn serve_metrics(service: &'static str, listen: Option<&str>) -> Result<()> {
    hivefs_metrics::set_service(service);
    if let Some(l) = listen {
        let (addr, _task) = hivefs_metrics::serve(l).await?;
        info!("{service}: metrics at http://{addr}/metrics");
    }
    Ok(())
}

fn apply_common(c: &Common, dir: &mut PathBuf, listen: &mut String, secret: &mut Option<PathBuf>) {
    if let Some(d) = &c.dir {
        *dir = d.clone();
    }
    if let Some(l) = &c.listen {
        *listen = l.clone();
    }
    if let Some(s) = &c.secret_file {
        *secret = Some(s.clone());
    }
}

pub fn run_mgmtd(a: MgmtdArgs) -> Result<()> {
    init_logging(&a.common.log_level);
    let mut cfg: hivefs_mgmtd::Config = load_config(a.common.config.as_deref())?;
    apply_common(&a.common, &mut cfg.dir, &mut cfg.listen, &mut cfg.secret_file);
    cfg.metrics_listen = a.common.metrics_listen.clone().or(cfg.metrics_listen);
    runtime()?.block_on(async {
        serve_metrics("mgmtd", cfg.metrics_listen.as_deref()).await?;
        let svc = hivefs_mgmtd::start(cfg).await.map_err(|e| anyhow!("mgmtd: {e}"))?;
        info!("mgmtd serving on {}", svc.local_addr);
        notify(&format!("READY=1\nSTATUS=serving on {}", svc.local_addr));
        wait_for_signal().await;
        notify("STOPPING=1");
        info!("mgmtd stopping");
        Ok(())
    })
}

pub fn run_meta(a: MetaArgs) -> Result<()> {
    init_logging(&a.common.log_level);
    // With the node's own checks (e.g. the least checkpoint_bytes), not only the keys'.
    let mut cfg = match &a.common.config {
        Some(p) => hivefs_meta::Config::load(p).map_err(|e| anyhow!("{e}"))?,
        None => hivefs_meta::Config::default(),
    };
    apply_common(&a.common, &mut cfg.dir, &mut cfg.listen, &mut cfg.secret_file);
    a.member.apply(&mut cfg.mgmtd, &mut cfg.advertise);
    cfg.metrics_listen = a.common.metrics_listen.clone().or(cfg.metrics_listen);
    let workers = cfg.worker_threads();
    runtime_with(workers)?.block_on(async {
        serve_metrics("meta", cfg.metrics_listen.as_deref()).await?;
        let svc = hivefs_meta::start(cfg).await.map_err(|e| anyhow!("meta: {e}"))?;
        info!("metadata node {} serving on {} (workers: {workers})", svc.node_id, svc.local_addr);
        notify(&format!("READY=1\nSTATUS=metadata node {} serving on {}", svc.node_id, svc.local_addr));
        tokio::select! {
            _ = wait_for_signal() => {
                notify("STOPPING=1");
                info!("metadata node stopping");
                Ok(())
            }
            _ = svc.store_failed() => {
                tracing::error!("metadata store failed and must be reopened (it repairs itself at start); exiting");
                Err(anyhow!("metadata store failed; restart the service to repair it"))
            }
        }
    })
}

pub fn run_storage(a: StorageArgs) -> Result<()> {
    init_logging(&a.common.log_level);
    let mut cfg: hivefs_storage::Config = load_config(a.common.config.as_deref())?;
    apply_common(&a.common, &mut cfg.dir, &mut cfg.listen, &mut cfg.secret_file);
    a.member.apply(&mut cfg.mgmtd, &mut cfg.advertise);
    if !a.targets.is_empty() {
        cfg.targets = a.targets;
    }
    if a.fs_uuid.is_some() {
        cfg.fs_uuid = a.fs_uuid;
    }
    if a.init {
        let fs = cfg.fs_uuid.clone().ok_or_else(|| anyhow!("--init needs --fs-uuid (or fs_uuid in the config)"))?;
        anyhow::ensure!(!cfg.targets.is_empty(), "--init needs at least one --target DIR");
        for t in &cfg.targets {
            let had = t.join(hivefs_storage::TARGET_FILE).exists();
            hivefs_storage::init_target(t, &fs).map_err(|e| anyhow!("{e}"))?;
            if had {
                println!("storage target {} was formatted for this file system already; left as it is", t.display());
            } else {
                println!("formatted storage target {}", t.display());
            }
        }
        return Ok(());
    }
    cfg.metrics_listen = a.common.metrics_listen.clone().or(cfg.metrics_listen);
    runtime()?.block_on(async {
        serve_metrics("storage", cfg.metrics_listen.as_deref()).await?;
        let svc = hivefs_storage::start(cfg).await.map_err(|e| anyhow!("storage: {e}"))?;
        info!("storage node {} serving targets {:?} on {}", svc.node_id, svc.targets, svc.local_addr);
        notify(&format!("READY=1\nSTATUS=storage node {} serving on {}", svc.node_id, svc.local_addr));
        wait_for_signal().await;
        notify("STOPPING=1");
        info!("storage node stopping");
        Ok(())
    })
}

const MOUNT_RECORDS: &str = "/run/hivefs/mounts";

/// Where a mount records how to reach its file system, for admin commands given `--mount`:
/// keyed by the mount namespace and the path, so that the same path mounted in two
/// namespaces (containers, test-bed hosts) has two records.
pub fn mount_record_path(mnt: &Path) -> PathBuf {
    let key: String = mnt.to_string_lossy().chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
    let ns = std::fs::read_link("/proc/self/ns/mnt")
        .ok()
        .and_then(|l| l.to_string_lossy().trim_start_matches("mnt:[").trim_end_matches(']').parse::<u64>().ok());
    let name = match ns {
        Some(ns) => format!("{ns}-{key}.toml"),
        None => format!("{key}.toml"),
    };
    PathBuf::from(MOUNT_RECORDS).join(name)
}

/// Removes the records of mounts whose process is gone (a killed mount leaves its record).
fn sweep_mount_records() {
    let Ok(rd) = std::fs::read_dir(MOUNT_RECORDS) else { return };
    for e in rd.flatten() {
        let rec = std::fs::read_to_string(e.path()).ok().and_then(|s| toml::from_str::<MountRecord>(&s).ok());
        if rec.is_some_and(|r| !crate::util::pid_alive(r.pid as i32)) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

#[derive(serde::Serialize, serde::Deserialize)]
pub struct MountRecord {
    pub mgmtd: String,
    pub secret_file: Option<PathBuf>,
    pub pid: u32,
    /// The mount's `--cache-mode` (records from before it existed: native).
    #[serde(default = "native_cache_mode")]
    pub cache_mode: String,
}

/// The cache mode of mounts and file systems whose records predate cache modes.
pub(crate) fn native_cache_mode() -> String {
    "native".into()
}

/// The record of the HiveFS mount `mnt` (a canonical path), if it has one.
pub fn mount_record(mnt: &Path) -> Result<MountRecord> {
    let rec = mount_record_path(mnt);
    let s = std::fs::read_to_string(&rec)
        .map_err(|e| anyhow!("{} is not a HiveFS mount of this machine ({}: {e})", mnt.display(), rec.display()))?;
    toml::from_str(&s).map_err(|e| anyhow!("{}: {e}", rec.display()))
}

/// Raises the soft limit of open descriptors to the hard one: a mount holds
/// a descriptor per chunk file it reads or writes directly (short-circuit).
fn raise_nofile_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let r = getrlimit(Resource::Nofile);
    // None is RLIM_INFINITY.
    let (cur, max) = (r.current.unwrap_or(u64::MAX), r.maximum.unwrap_or(u64::MAX));
    if cur < max {
        let raised = Rlimit { current: Some(max.min(1 << 20)), maximum: r.maximum };
        if let Err(e) = setrlimit(Resource::Nofile, raised) {
            tracing::debug!("cannot raise the open-file limit: {}", std::io::Error::from(e));
        }
    }
}

pub fn run_mount(a: MountArgs) -> Result<()> {
    init_logging(&a.log_level);
    raise_nofile_limit();
    let mnt = crate::util::absolute(&a.mountpoint)?;
    hivefs_fuse::check_mountpoint(&mnt).map_err(|e| anyhow!(e))?;
    let secret = match &a.secret_file {
        Some(p) => Some(hivefs_net::load_secret(p).map_err(|e| anyhow!(e))?),
        None => None,
    };
    let rt = runtime()?;
    rt.block_on(serve_metrics("mount", a.metrics_listen.as_deref()))?;
    let client = rt.block_on(async {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let mut opts = Options::new(a.mgmtd.clone(), secret.clone());
            opts.io_timeout = Duration::from_millis(a.io_timeout_ms.max(100));
            opts.short_circuit = !a.no_short_circuit;
            opts.mirror_retry = Duration::from_millis(a.mirror_retry_ms);
            match Client::connect(opts).await {
                Ok(c) => return Ok(c),
                Err(e) if e.code == hivefs_types::ErrorCode::Auth => return Err(anyhow!("{e}")),
                Err(e) if tokio::time::Instant::now() < deadline => {
                    tracing::debug!("file system not ready: {e}");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => return Err(anyhow!("cannot reach the file system through mgmtd {}: {e}", a.mgmtd)),
            }
        }
    })?;
    sweep_mount_records();
    let record = mount_record_path(&mnt);
    if let Some(d) = record.parent() {
        let _ = std::fs::create_dir_all(d);
    }
    let rec = MountRecord {
        mgmtd: a.mgmtd.clone(),
        secret_file: a.secret_file.clone(),
        pid: std::process::id(),
        cache_mode: a.cache_mode.clone(),
    };
    let _ = std::fs::write(&record, toml::to_string(&rec)?);
    let (stop_tx, stop_rx) = std::sync::mpsc::channel();
    rt.spawn(async move {
        wait_for_signal().await;
        notify("STOPPING=1");
        let _ = stop_tx.send(());
    });
    let opts = hivefs_fuse::MountOptions {
        allow_other: !a.private,
        fuse_threads: a.fuse_threads,
        fuse_transport: a.fuse_transport.parse().map_err(|e: String| anyhow::anyhow!(e))?,
        global_file_locks: !a.local_locks,
        dir_attr_ttl: std::time::Duration::from_millis(a.dir_attr_ttl_ms),
        cache_mode: a.cache_mode.parse().map_err(|e: String| anyhow::anyhow!(e))?,
        writeback: writeback_limits(a.writeback_buffer)?,
        atime: a.atime.parse().map_err(|e: String| anyhow::anyhow!(e))?,
        acl: !a.no_acl,
        create_ahead: !a.no_create_ahead,
    };
    info!("mounting HiveFS (mgmtd {}) on {}", a.mgmtd, mnt.display());
    let mounted = format!("READY=1\nSTATUS=mounted on {}", mnt.display());
    let r = hivefs_fuse::mount(client, rt.handle().clone(), &mnt, &opts, stop_rx, move || notify(&mounted));
    let _ = std::fs::remove_file(&record);
    info!("{} unmounted", mnt.display());
    r.with_context(|| format!("mount on {}", mnt.display()))
}
