//! On-demand file systems on one machine: `hivefs up`, `down`, `status`.
//!
//! `up` keeps everything under one directory: `fs.toml` (the layout, fixed at
//! the first `up`), the shared secret, and one sub-directory per service with
//! its data, log and pid file. A service started by `up` reads
//! `<dir>/<service>/<role>.toml` (e.g. `mgmtd/mgmtd.toml`, `meta1/meta.toml`)
//! when it exists; flags given by `up` (addresses, data dirs) take precedence.
//! Running `up` again starts only what is not running and brings back the
//! same file system.

use crate::services::mount_record_path;
use crate::util::{absolute, is_mounted, parse_size, pid_alive, print_table, read_pid, send_signal};
use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use hivefs_client::{Client, Options};
use hivefs_net::{call_once, ClientConfig};
use hivefs_proto::{Reachability, Reply, Request};
use hivefs_types::ids::NodeType;
use hivefs_types::pattern::{validate_chunk_size, Chooser, DirPattern};
use rustix::process::Signal;
use serde::{Deserialize, Serialize};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Args, Debug)]
pub struct UpArgs {
    /// Directory holding the whole file system (services' data, logs, pids).
    #[arg(long)]
    pub dir: PathBuf,
    /// Where to mount it (created if missing; must be empty).
    #[arg(long)]
    pub mount: Option<PathBuf>,
    /// Number of metadata servers.
    #[arg(long)]
    pub meta: Option<u32>,
    /// Number of storage servers.
    #[arg(long)]
    pub storage: Option<u32>,
    /// Storage targets per storage server.
    #[arg(long)]
    pub targets_per_storage: Option<u32>,
    /// Chunk size of the root directory (power of two, 4k to 1g).
    #[arg(long)]
    pub chunk_size: Option<String>,
    /// Stripe count of the root directory (0 = all targets).
    #[arg(long)]
    pub stripe: Option<u32>,
    /// Target chooser of the root directory, the file system's default (inherited by new
    /// directories): random, roundrobin, randomized-roundrobin, balanced.
    #[arg(long)]
    pub chooser: Option<String>,
    /// Metadata-node chooser of the root directory (inherited by new directories):
    /// balanced, random, roundrobin. Applies at the first `up`.
    #[arg(long)]
    pub meta_chooser: Option<String>,
    /// Cache mode of the mount (`hivefs mount --cache-mode`): native (direct I/O),
    /// paged (page cache, close-to-open) or buffered (direct I/O, small writes kept in
    /// the mount and sent in the background). Kept for later `up`s; a change applies
    /// when the mount is started again (after `hivefs down`).
    #[arg(long, value_parser = ["native", "paged", "buffered"])]
    pub cache_mode: Option<String>,
    /// When reads move access times (`hivefs mount --atime`): noatime (the default),
    /// relatime or strictatime. Kept for later `up`s like the cache mode.
    #[arg(long, value_parser = ["noatime", "relatime", "strictatime"])]
    pub atime: Option<String>,
    /// How the kernel's requests reach the mount (`hivefs mount --fuse-transport`): auto
    /// (FUSE over io_uring when the kernel offers it, else /dev/fuse), dev or io_uring.
    /// Kept for later `up`s like the cache mode.
    #[arg(long, value_parser = ["auto", "dev", "io_uring"])]
    pub fuse_transport: Option<String>,
    /// POSIX ACL enforcement by the mount (`hivefs mount --no-acl` for off): on (the
    /// default) or off. Kept for later `up`s like the cache mode.
    #[arg(long, value_parser = ["on", "off"])]
    pub acl: Option<String>,
    /// Mirror file data: pair the targets into storage buddy groups over
    /// different storage servers and make the root directory's files stripe
    /// over the groups (inherited by new directories). With --meta 2 or more,
    /// mirror every metadata node's namespace onto the next node too (a ring
    /// of metadata groups). Needs at least 2 storage servers; applies at the
    /// first `up`.
    #[arg(long)]
    pub mirror: bool,
    /// Address the services bind to.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Seconds to wait for services and the mount to come up.
    #[arg(long, default_value_t = 60)]
    pub timeout: u64,
}

#[derive(Args, Debug)]
pub struct DownArgs {
    /// Directory given to `hivefs up`.
    #[arg(long)]
    pub dir: PathBuf,
    /// Detach a busy or dead mount lazily instead of failing (`umount -l`).
    #[arg(long)]
    pub force: bool,
}

#[derive(Args, Debug)]
pub struct StatusArgs {
    /// Directory given to `hivefs up`.
    #[arg(long)]
    pub dir: PathBuf,
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
}

/// The layout of an on-demand file system, fixed at its first `up`.
#[derive(Serialize, Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct Layout {
    pub fs_uuid: String,
    pub host: String,
    pub mountpoint: PathBuf,
    pub meta: u32,
    pub storage: u32,
    pub targets_per_storage: u32,
    pub chunk_size: u32,
    pub stripe: u32,
    #[serde(default)]
    pub chooser: Chooser,
    /// The mount's cache mode (file systems from before it existed: native).
    #[serde(default = "crate::services::native_cache_mode")]
    pub cache_mode: String,
    /// The mount's access-time mode (file systems from before it existed: noatime).
    #[serde(default = "noatime")]
    pub atime: String,
    /// Whether the mount enforces POSIX ACLs (file systems from before it existed: on).
    #[serde(default = "acl_on")]
    pub acl: bool,
    /// The mount's FUSE transport (file systems from before it existed: auto).
    #[serde(default = "transport_auto")]
    pub fuse_transport: String,
    pub mgmtd_port: u16,
    pub meta_ports: Vec<u16>,
    pub storage_ports: Vec<u16>,
    /// Prometheus endpoints (`metrics_listen`), in [`Layout::services`] order, then the
    /// mount's. File systems from before metrics get them at their next `up`.
    #[serde(default)]
    pub metrics_ports: Vec<u16>,
}

impl Layout {
    /// Gives service `name` (as [`Layout::services`] names it) another port.
    fn set_port(&mut self, name: &str, port: u16) {
        let index = |prefix: &str| name.strip_prefix(prefix).and_then(|i| i.parse::<usize>().ok()).map(|i| i - 1);
        if name == "mgmtd" {
            self.mgmtd_port = port;
        } else if let Some(p) = index("meta").and_then(|i| self.meta_ports.get_mut(i)) {
            *p = port;
        } else if let Some(p) = index("storage").and_then(|i| self.storage_ports.get_mut(i)) {
            *p = port;
        }
    }

    pub fn mgmtd_addr(&self) -> String {
        format!("{}:{}", self.host, self.mgmtd_port)
    }

    /// Command-line arguments of one service of this file system: its role, data dir,
    /// address, the shared secret, mgmtd, its config file when an administrator wrote
    /// one (e.g. mgmtd's capacity limits), and a storage service's targets.
    pub fn service_args(&self, role: &str, port: u16, sdir: &Path, secret: &Path) -> Vec<String> {
        let mut args: Vec<String> = vec![
            role.into(),
            "--dir".into(),
            sdir.display().to_string(),
            "--listen".into(),
            format!("{}:{port}", self.host),
            "--secret-file".into(),
            secret.display().to_string(),
        ];
        if role != "mgmtd" {
            args.extend(["--mgmtd".into(), self.mgmtd_addr()]);
        }
        if let Some(m) = self.metrics_port(sdir) {
            args.extend(["--metrics-listen".into(), format!("{}:{m}", self.host)]);
        }
        let cfg_file = sdir.join(format!("{role}.toml"));
        if cfg_file.exists() {
            args.extend(["--config".into(), cfg_file.display().to_string()]);
        }
        if role == "storage" {
            args.extend(["--fs-uuid".into(), self.fs_uuid.clone()]);
            for t in 1..=self.targets_per_storage {
                args.extend(["--target".into(), sdir.join(format!("target{t}")).display().to_string()]);
            }
        }
        args
    }

    /// The metrics port of the service whose directory is `sdir` (or of the mount, for
    /// `<dir>/client`), when the layout has them.
    pub fn metrics_port(&self, sdir: &Path) -> Option<u16> {
        self.metrics_ports.get(self.metrics_index(sdir)?).copied()
    }

    /// Gives the service (or mount) of `sdir` a new free metrics port, when it has one.
    fn new_metrics_port(&mut self, sdir: &Path) -> Result<Option<u16>> {
        match self.metrics_index(sdir) {
            Some(i) if i < self.metrics_ports.len() => {
                let (port, _free_until_here) = free_port(&self.host)?;
                self.metrics_ports[i] = port;
                Ok(Some(port))
            }
            _ => Ok(None),
        }
    }

    fn metrics_index(&self, sdir: &Path) -> Option<usize> {
        let name = sdir.file_name()?.to_str()?;
        let dir = sdir.parent()?;
        match name {
            "client" => Some(self.meta_ports.len() + self.storage_ports.len() + 1),
            _ => self.services(dir).iter().position(|s| s.0 == name),
        }
    }

    /// (name, role, port, service dir)
    pub fn services(&self, dir: &Path) -> Vec<(String, &'static str, u16, PathBuf)> {
        let mut v = vec![("mgmtd".to_string(), "mgmtd", self.mgmtd_port, dir.join("mgmtd"))];
        for (i, p) in self.meta_ports.iter().enumerate() {
            let n = format!("meta{}", i + 1);
            v.push((n.clone(), "meta", *p, dir.join(n)));
        }
        for (i, p) in self.storage_ports.iter().enumerate() {
            let n = format!("storage{}", i + 1);
            v.push((n.clone(), "storage", *p, dir.join(n)));
        }
        v
    }
}

/// A free port for a service, below the kernel's ephemeral range: a port from that
/// range may be taken as the local port of some outgoing connection while its service
/// is down, and the restarted service could not listen on it again.
/// The listener is returned too: while it is held, no other `up` (nor a later
/// call for the same layout) can pick the port.
fn free_port(host: &str) -> Result<(u16, std::net::TcpListener)> {
    let ephemeral_start = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|p| p.parse::<u16>().ok()))
        .unwrap_or(32768);
    let (lo, hi) = (10_000u16, ephemeral_start.max(10_001));
    let start = std::process::id() as u64
        ^ std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_nanos() as u64;
    for i in 0..u64::from(hi - lo) {
        let port = lo + ((start.wrapping_add(i.wrapping_mul(7919))) % u64::from(hi - lo)) as u16;
        if let Ok(l) = std::net::TcpListener::bind((host, port)) {
            return Ok((port, l));
        }
    }
    let l = std::net::TcpListener::bind((host, 0)).with_context(|| format!("cannot bind to {host}"))?;
    Ok((l.local_addr()?.port(), l))
}

/// Test hook: comma-separated ports a new file system's services get, in
/// [`Layout::services`] order, instead of free ones (an empty item keeps
/// the free one).
pub const PORTS_ENV: &str = "HIVEFS_UP_PORTS";

/// Whether a service that exited did so because its port was taken: its
/// last exit message (`hivefs: ...`) says so. Earlier runs' lines in the same
/// log do not count.
fn port_was_taken(name: &str, sdir: &Path) -> bool {
    let tail = log_tail(&sdir.join(format!("{name}.log")));
    tail.lines().rev().find(|l| l.starts_with("hivefs: ")).is_some_and(|l| l.contains("Address already in use"))
}

pub fn load_layout(dir: &Path) -> Result<Layout> {
    let p = dir.join("fs.toml");
    let s = std::fs::read_to_string(&p).with_context(|| {
        format!(
            "{} is not a HiveFS directory (no fs.toml); run `hivefs up --dir {}` first",
            dir.display(),
            dir.display()
        )
    })?;
    toml::from_str(&s).map_err(|e| anyhow!("{}: {e}", p.display()))
}

fn noatime() -> String {
    "noatime".into()
}

fn acl_on() -> bool {
    true
}

fn transport_auto() -> String {
    "auto".into()
}

fn layout_for(a: &UpArgs, dir: &Path) -> Result<Layout> {
    if dir.join("fs.toml").exists() {
        let mut l = load_layout(dir)?;
        if let Some(c) = &a.cache_mode {
            l.cache_mode = c.clone();
        }
        if let Some(t) = &a.atime {
            l.atime = t.clone();
        }
        if let Some(acl) = &a.acl {
            l.acl = acl == "on";
        }
        if let Some(t) = &a.fuse_transport {
            l.fuse_transport = t.clone();
        }
        let check = |name: &str, given: Option<u32>, have: u32| -> Result<()> {
            if let Some(g) = given {
                if g != have {
                    bail!(
                        "{} was created with --{name} {have}; it cannot change to {g} (use a new --dir)",
                        dir.display()
                    );
                }
            }
            Ok(())
        };
        if l.metrics_ports.is_empty() {
            for _ in 0..l.meta + l.storage + 2 {
                l.metrics_ports.push(free_port(&l.host)?.0);
            }
        }
        check("meta", a.meta, l.meta)?;
        check("storage", a.storage, l.storage)?;
        check("targets-per-storage", a.targets_per_storage, l.targets_per_storage)?;
        if let Some(m) = &a.mount {
            if absolute(m)? != l.mountpoint {
                bail!("{} is mounted at {} (given --mount {})", dir.display(), l.mountpoint.display(), m.display());
            }
        }
        return Ok(l);
    }
    let mount = a.mount.clone().ok_or_else(|| anyhow!("a new file system needs --mount MOUNTPOINT"))?;
    let meta = a.meta.unwrap_or(1);
    let storage = a.storage.unwrap_or(2);
    if a.mirror && storage < 2 {
        bail!("--mirror needs at least 2 storage servers (--storage {storage}): a buddy group's targets are on different servers");
    }
    let tps = a.targets_per_storage.unwrap_or(4);
    anyhow::ensure!((1..=64).contains(&meta), "--meta must be 1 to 64");
    anyhow::ensure!((1..=256).contains(&storage), "--storage must be 1 to 256");
    anyhow::ensure!((1..=64).contains(&tps), "--targets-per-storage must be 1 to 64");
    let cs = parse_size(a.chunk_size.as_deref().unwrap_or("512k"))?;
    let chunk_size = validate_chunk_size(cs).map_err(|e| anyhow!(e))?;
    let chooser = match &a.chooser {
        Some(c) => Chooser::parse(c).ok_or_else(|| {
            anyhow!("unknown chooser {c:?}: use random, roundrobin, randomized-roundrobin or balanced")
        })?,
        None => Chooser::Balanced,
    };
    let mut held = Vec::new();
    // Service ports, then metrics ports (services, then the mount).
    for _ in 0..(1 + meta + storage) * 2 + 1 {
        held.push(free_port(&a.host)?);
    }
    let mut ports: Vec<u16> = held.iter().map(|(p, _)| *p).collect();
    // Test hook: the first ports to use, taken or not (how a test makes a
    // port be taken between the choice and the service's start).
    if let Ok(forced) = std::env::var(PORTS_ENV) {
        for (slot, p) in ports.iter_mut().zip(forced.split(',')).filter(|(_, p)| !p.trim().is_empty()) {
            *slot = p.trim().parse().map_err(|_| anyhow!("{PORTS_ENV}: {p:?} is not a port"))?;
        }
    }
    Ok(Layout {
        fs_uuid: hivefs_cluster::new_uuid(),
        host: a.host.clone(),
        mountpoint: absolute(&mount)?,
        meta,
        storage,
        targets_per_storage: tps,
        chunk_size,
        stripe: a.stripe.unwrap_or(0),
        chooser,
        cache_mode: a.cache_mode.clone().unwrap_or_else(crate::services::native_cache_mode),
        atime: a.atime.clone().unwrap_or_else(noatime),
        acl: a.acl.as_deref() != Some("off"),
        fuse_transport: a.fuse_transport.clone().unwrap_or_else(transport_auto),
        mgmtd_port: ports[0],
        meta_ports: ports[1..=meta as usize].to_vec(),
        storage_ports: ports[1 + meta as usize..(1 + meta + storage) as usize].to_vec(),
        metrics_ports: ports[(1 + meta + storage) as usize..].to_vec(),
    })
}

pub(crate) fn log_tail(path: &Path) -> String {
    let s = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(8)..].join("\n")
}

pub(crate) fn spawn_service(name: &str, args: &[String], sdir: &Path) -> Result<i32> {
    std::fs::create_dir_all(sdir).with_context(|| format!("cannot create {}", sdir.display()))?;
    let log_path = sdir.join(format!("{name}.log"));
    let log = std::fs::OpenOptions::new().create(true).append(true).open(&log_path)?;
    let exe = std::env::current_exe().context("cannot find the hivefs executable")?;
    let child = Command::new(exe)
        .args(args)
        // Its readiness is this command's to judge, not a systemd unit's that ran `hivefs up`.
        .env_remove("NOTIFY_SOCKET")
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .process_group(0)
        .spawn()
        .with_context(|| format!("cannot start {name}"))?;
    let pid = child.id() as i32;
    std::fs::write(sdir.join(format!("{name}.pid")), format!("{pid}\n"))?;
    // The child is reaped by whoever outlives it; we do not wait for it.
    std::mem::forget(child);
    Ok(pid)
}

pub(crate) fn service_running(sdir: &Path, name: &str) -> Option<i32> {
    read_pid(&sdir.join(format!("{name}.pid"))).filter(|&p| pid_alive(p))
}

pub(crate) fn wait_until<F: FnMut() -> Result<bool>>(what: &str, timeout: Duration, mut f: F) -> Result<()> {
    let start = Instant::now();
    loop {
        if f()? {
            return Ok(());
        }
        if start.elapsed() > timeout {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

pub(crate) fn check_alive(name: &str, sdir: &Path) -> Result<()> {
    if service_running(sdir, name).is_none() {
        bail!(
            "{name} exited; last lines of {}:\n{}",
            sdir.join(format!("{name}.log")).display(),
            log_tail(&sdir.join(format!("{name}.log")))
        );
    }
    Ok(())
}

pub fn up(a: UpArgs) -> Result<()> {
    let dir = absolute(&a.dir)?;
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut layout = layout_for(&a, &dir)?;
    let timeout = Duration::from_secs(a.timeout);
    let first_up = !dir.join("fs.toml").exists();
    let meta_chooser = a
        .meta_chooser
        .as_deref()
        .map(|s| {
            hivefs_proto::MetaChooser::parse(s)
                .ok_or_else(|| anyhow!("unknown metadata chooser {s:?}: use balanced, random or roundrobin"))
        })
        .transpose()?;
    if first_up
        || a.cache_mode.is_some()
        || a.atime.is_some()
        || a.acl.is_some()
        || a.fuse_transport.is_some()
        || !load_layout(&dir).is_ok_and(|l| l.metrics_ports == layout.metrics_ports)
    {
        hivefs_cluster::write_atomic(&dir.join("fs.toml"), toml::to_string(&layout)?.as_bytes())?;
    }
    let secret = dir.join("secret");
    hivefs_net::generate_secret_file(&secret).with_context(|| format!("cannot write {}", secret.display()))?;
    let secret_s = secret.display().to_string();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    // Local services answer in milliseconds; a check that gets no answer is
    // repeated (until `--timeout`) rather than waited out: something else may
    // be listening on a service's port.
    let ccfg = ClientConfig::new(Some(hivefs_net::load_secret(&secret).map_err(|e| anyhow!(e))?))
        .with_timeout(Duration::from_secs(1));
    // Waits until a started service answers on its address. A new file
    // system's ports were free when chosen, and a stopped service's port is
    // free for anyone, but another program (another `up`) may have taken one
    // since: the service then gets another port. A metadata or storage node
    // registers its new address with mgmtd, where nodes and mounts look it
    // up. mgmtd's own port is known to every running node and mount: it
    // moves only while none of them runs (they are started with its new one).
    let mgmtd_may_move = first_up
        || (layout
            .services(&dir)
            .iter()
            .all(|(n, role, _, sdir)| *role == "mgmtd" || service_running(sdir, n).is_none())
            && service_running(&dir.join("client"), "mount").is_none());
    let serve = |layout: &mut Layout, name: &str, role: &str, sdir: &Path, what: &str| -> Result<String> {
        let mut taken = 0;
        loop {
            let addr =
                layout.services(&dir).into_iter().find(|s| s.0 == name).map(|s| format!("{}:{}", layout.host, s.2));
            let addr = addr.ok_or_else(|| anyhow!("{name} is not a service of {}", dir.display()))?;
            let r = wait_until(&format!("{name} to {what} on {addr}"), timeout, || {
                check_alive(name, sdir)?;
                Ok(rt.block_on(call_once(&addr, &ccfg, &Request::Ping)).is_ok())
            });
            match r {
                Err(e) if (role != "mgmtd" || mgmtd_may_move) && taken < 5 && port_was_taken(name, sdir) => {
                    taken += 1;
                    let (port, l) = free_port(&layout.host)?;
                    eprintln!("{name}: {addr} (or its metrics port) was taken by another program; using port {port}");
                    layout.set_port(name, port);
                    // Either port may be the taken one: the metrics port is chosen again too.
                    layout.new_metrics_port(sdir)?;
                    hivefs_cluster::write_atomic(&dir.join("fs.toml"), toml::to_string(&*layout)?.as_bytes())?;
                    drop(l);
                    spawn_service(name, &layout.service_args(role, port, sdir, &secret), sdir)
                        .with_context(|| format!("after: {e}"))?;
                }
                r => return r.map(|()| addr),
            }
        }
    };

    let mut started = Vec::new();
    for (name, role, port, sdir) in layout.services(&dir) {
        if service_running(&sdir, &name).is_some() {
            continue;
        }
        if role == "storage" {
            for t in 1..=layout.targets_per_storage {
                let tdir = sdir.join(format!("target{t}"));
                std::fs::create_dir_all(&tdir)?;
                hivefs_storage::init_target(&tdir, &layout.fs_uuid).map_err(|e| anyhow!("{e}"))?;
            }
        }
        let args = layout.service_args(role, port, &sdir, &secret);
        spawn_service(&name, &args, &sdir)?;
        if role == "mgmtd" {
            // The others are started with its address.
            serve(&mut layout, &name, role, &sdir, "answer")?;
        }
        started.push((name.clone(), role, sdir.clone()));
    }
    // A started service serves once it answers on its own address (mgmtd may
    // still list a killed predecessor as online for a while).
    for (name, role, sdir) in started.iter().filter(|s| s.1 != "mgmtd") {
        serve(&mut layout, name, role, sdir, "serve")?;
    }
    let mgmtd = layout.mgmtd_addr();
    let mut started: Vec<String> = started.into_iter().map(|(n, _, _)| n).collect();

    // Every node and target registered and online.
    let want_targets = (layout.storage * layout.targets_per_storage) as usize;
    let want = Want { meta: layout.meta, storage: layout.storage, targets: want_targets };
    let metas = wait_registered(&rt, &mgmtd, &ccfg, want, timeout, || {
        for (name, _, _, sdir) in layout.services(&dir) {
            check_alive(&name, &sdir)?;
        }
        Ok(())
    })?;
    if first_up && a.mirror {
        // Every namespace onto the next metadata node (all on this host: forced).
        mirror_all(&rt, &mgmtd, &ccfg, &metas, true, timeout)?;
    }
    refresh_views(&rt, &ccfg, &metas)?;

    let client_opts = Options::new(mgmtd.clone(), ccfg.secret.clone());
    if first_up {
        let pat = DirPattern {
            chunk_size: layout.chunk_size,
            stripe_count: layout.stripe,
            chooser: layout.chooser,
            mirror: a.mirror,
            ..DirPattern::default()
        };
        set_root_pattern(&rt, &client_opts, pat, meta_chooser)?;
    }

    // The mount.
    let mnt = layout.mountpoint.clone();
    let cdir = dir.join("client");
    std::fs::create_dir_all(&cdir)?;
    let mount_alive = service_running(&cdir, "mount").is_some();
    if !(mount_alive && is_mounted(&mnt)) {
        if is_mounted(&mnt) {
            // A mount whose process is gone: detach it before mounting again.
            let _ = unmount(&mnt, true);
        }
        if let Some(pid) = service_running(&cdir, "mount") {
            send_signal(pid, Signal::TERM);
        }
        std::fs::create_dir_all(&mnt).with_context(|| format!("cannot create mount point {}", mnt.display()))?;
        hivefs_fuse::check_mountpoint(&mnt).map_err(|e| anyhow!(e))?;
        let mut taken = 0;
        loop {
            let mut args = vec![
                "mount".to_string(),
                "--mgmtd".into(),
                mgmtd.clone(),
                "--secret-file".into(),
                secret_s.clone(),
                "--cache-mode".into(),
                layout.cache_mode.clone(),
                "--atime".into(),
                layout.atime.clone(),
                "--fuse-transport".into(),
                layout.fuse_transport.clone(),
            ];
            if let Some(m) = layout.metrics_port(&cdir) {
                args.extend(["--metrics-listen".into(), format!("{}:{m}", layout.host)]);
            }
            if !layout.acl {
                args.push("--no-acl".into());
            }
            args.push(mnt.display().to_string());
            spawn_service("mount", &args, &cdir)?;
            let r = wait_until("the mount", timeout, || {
                check_alive("mount", &cdir)?;
                Ok(is_mounted(&mnt) && std::fs::metadata(&mnt).is_ok())
            });
            match r {
                // Its metrics port was taken since it was chosen (as for the services above).
                Err(e) if taken < 5 && port_was_taken("mount", &cdir) => {
                    taken += 1;
                    let Some(port) = layout.new_metrics_port(&cdir)? else { return Err(e) };
                    eprintln!("mount: its metrics port was taken by another program ({e}); using port {port}");
                    hivefs_cluster::write_atomic(&dir.join("fs.toml"), toml::to_string(&layout)?.as_bytes())?;
                }
                r => {
                    r?;
                    break;
                }
            }
        }
        started.push("mount".into());
    }

    print_status(&dir, &layout)?;
    let st = rt.block_on(async { Client::connect(client_opts).await?.statfs().await }).map_err(|e| anyhow!("{e}"))?;
    println!();
    if started.is_empty() {
        println!("HiveFS was already running.");
    } else {
        println!("started: {}", started.join(", "));
    }
    println!(
        "HiveFS is mounted on {}: {} storage targets, {} free of {}; root stripe: chunk {}, {}, chooser {}; cache mode {}, {}{}.",
        mnt.display(),
        want_targets,
        crate::util::human(st.storage.free_bytes),
        crate::util::human(st.storage.total_bytes),
        crate::util::human(u64::from(layout.chunk_size)),
        if layout.stripe == 0 { "all targets".to_string() } else { format!("{} targets", layout.stripe) },
        layout.chooser,
        layout.cache_mode,
        layout.atime,
        if layout.acl { "" } else { ", ACLs not enforced" }
    );
    println!("Stop it with: hivefs down --dir {}", dir.display());
    Ok(())
}

/// How many services a file system has: what [`wait_registered`] waits for.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Want {
    pub meta: u32,
    pub storage: u32,
    pub targets: usize,
}

/// Waits until mgmtd lists the wanted metadata and storage nodes online and the wanted
/// number of targets online with their space known; `alive` fails the wait early (a
/// service that exited). Returns the metadata nodes (id, address).
pub(crate) fn wait_registered(
    rt: &tokio::runtime::Runtime,
    mgmtd: &str,
    ccfg: &ClientConfig,
    want: Want,
    timeout: Duration,
    mut alive: impl FnMut() -> Result<()>,
) -> Result<Vec<(hivefs_types::ids::NodeId, String)>> {
    let mut metas = Vec::new();
    let mut seen = (0, 0, 0);
    wait_until("all services to register with mgmtd", timeout, || {
        alive()?;
        let nodes = match rt.block_on(call_once(mgmtd, ccfg, &Request::ListNodes { node_type: None })) {
            Ok(Reply::Nodes(n)) => n,
            _ => return Ok(false),
        };
        let targets = match rt.block_on(call_once(mgmtd, ccfg, &Request::ListTargets)) {
            Ok(Reply::Targets(t)) => t,
            _ => return Ok(false),
        };
        let online =
            |t: NodeType| nodes.iter().filter(move |n| n.node_type == t && n.reachability == Reachability::Online);
        metas = online(NodeType::Meta).map(|n| (n.id, n.addr.clone())).collect();
        seen = (
            metas.len(),
            online(NodeType::Storage).count(),
            targets.iter().filter(|t| t.reachability == Reachability::Online && t.capacity.total_bytes > 0).count(),
        );
        Ok(seen.0 >= want.meta as usize && seen.1 >= want.storage as usize && seen.2 >= want.targets)
    })
    .with_context(|| {
        format!(
            "online so far: {} of {} metadata nodes, {} of {} storage nodes, {} of {} targets",
            seen.0, want.meta, seen.1, want.storage, seen.2, want.targets
        )
    })?;
    Ok(metas)
}

/// Mirrors a new file system: its targets paired into storage buddy groups over
/// different servers, and with 2 or more metadata nodes every namespace onto the next
/// node (a ring; `force_meta` when they share a machine). Waits for the metadata
/// secondaries' first copies.
pub(crate) fn mirror_all(
    rt: &tokio::runtime::Runtime,
    mgmtd: &str,
    ccfg: &ClientConfig,
    metas: &[(hivefs_types::ids::NodeId, String)],
    force_meta: bool,
    timeout: Duration,
) -> Result<()> {
    let targets = match rt.block_on(call_once(mgmtd, ccfg, &Request::ListTargets)) {
        Ok(Reply::Targets(t)) => t,
        Ok(r) => bail!("mgmtd {mgmtd}: unexpected reply {r:?}"),
        Err(e) => bail!("mgmtd {mgmtd}: {e}"),
    };
    let members: Vec<(u32, u32)> = targets.iter().map(|t| (t.id.0, t.node.0)).collect();
    let (pairs, left) = crate::mirror::pair_up(&members);
    for (primary, secondary) in pairs {
        let req = Request::CreateGroup { kind: hivefs_proto::GroupKind::Storage, primary, secondary, force: false };
        rt.block_on(call_once(mgmtd, ccfg, &req))
            .map_err(|e| anyhow!("buddy group of targets {primary} and {secondary}: {e}"))?;
    }
    if !left.is_empty() {
        eprintln!("mirror: targets {left:?} have no buddy on another server and stay unmirrored");
    }
    let mut ids: Vec<u32> = metas.iter().map(|(id, _)| id.0).collect();
    ids.sort_unstable();
    if ids.len() < 2 {
        return Ok(());
    }
    for (i, &primary) in ids.iter().enumerate() {
        let secondary = ids[(i + 1) % ids.len()];
        let req = Request::CreateGroup { kind: hivefs_proto::GroupKind::Meta, primary, secondary, force: force_meta };
        rt.block_on(call_once(mgmtd, ccfg, &req))
            .map_err(|e| anyhow!("metadata buddy group of nodes {primary} and {secondary}: {e}"))?;
    }
    wait_until("the metadata secondaries' first copies", timeout, || {
        match rt.block_on(call_once(mgmtd, ccfg, &Request::ListGroups { kind: Some(hivefs_proto::GroupKind::Meta) })) {
            Ok(Reply::Groups(gs)) => Ok(gs.iter().all(|g| g.secondary_state == hivefs_proto::Consistency::Good)),
            _ => Ok(false),
        }
    })
}

/// Every metadata node loads the view mgmtd has now. A node's view can lag mgmtd's:
/// pushes on registration are given up after 2 s, and between its periodic refreshes
/// (every 2 s) a node does not see a target turn usable; the first files would then be
/// striped over fewer targets.
pub(crate) fn refresh_views(
    rt: &tokio::runtime::Runtime,
    ccfg: &ClientConfig,
    metas: &[(hivefs_types::ids::NodeId, String)],
) -> Result<()> {
    for (id, addr) in metas {
        rt.block_on(call_once(addr, ccfg, &Request::RefreshView))
            .map_err(|e| anyhow!("metadata node {id} ({addr}) cannot load the cluster view: {e}"))?;
    }
    Ok(())
}

/// Sets the root directory's stripe pattern (and metadata chooser) of a new file system.
pub(crate) fn set_root_pattern(
    rt: &tokio::runtime::Runtime,
    opts: &Options,
    pat: DirPattern,
    meta_chooser: Option<hivefs_proto::MetaChooser>,
) -> Result<()> {
    rt.block_on(async {
        let c = Client::connect(opts.clone()).await?;
        // The root may take a moment to exist after its owner registered.
        let mut last = None;
        for _ in 0..100 {
            match c.set_dir_pattern(c.root(), pat.clone()).await {
                Ok(_) => {
                    if let Some(mc) = meta_chooser {
                        c.set_meta_chooser(c.root(), mc).await?;
                    }
                    return Ok(());
                }
                Err(e) => last = Some(e),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(last.expect("tried"))
    })
    .map_err(|e| anyhow!("cannot set the root directory's stripe pattern: {e}"))
}

#[derive(Serialize)]
struct ServiceStatus {
    name: String,
    role: String,
    address: Option<String>,
    /// Its Prometheus endpoint.
    metrics: Option<String>,
    pid: Option<i32>,
    running: bool,
    log: PathBuf,
    /// Resident memory now and at its peak (KiB), while it runs.
    rss_kib: Option<u64>,
    peak_rss_kib: Option<u64>,
}

impl ServiceStatus {
    fn new(name: String, role: &str, address: Option<String>, pid: Option<i32>, log: PathBuf) -> ServiceStatus {
        let running = pid.is_some_and(pid_alive);
        let mem = pid.filter(|_| running).and_then(hivefs_bench::cpu::pid_memory_kib);
        ServiceStatus {
            name,
            role: role.into(),
            address,
            metrics: None,
            pid,
            running,
            log,
            rss_kib: mem.map(|m| m.0),
            peak_rss_kib: mem.map(|m| m.1),
        }
    }
}

#[derive(Serialize)]
struct Status {
    dir: PathBuf,
    fs_uuid: String,
    mountpoint: PathBuf,
    mounted: bool,
    services: Vec<ServiceStatus>,
    /// Sums over the running services (peaks summed: an upper bound of
    /// their peak together).
    total_rss_kib: u64,
    total_peak_rss_kib: u64,
}

fn collect_status(dir: &Path, layout: &Layout) -> Status {
    let mut services = Vec::new();
    for (name, role, port, sdir) in layout.services(dir) {
        let pid = read_pid(&sdir.join(format!("{name}.pid")));
        let log = sdir.join(format!("{name}.log"));
        let mut st = ServiceStatus::new(name, role, Some(format!("{}:{port}", layout.host)), pid, log);
        st.metrics = layout.metrics_port(&sdir).map(|m| format!("http://{}:{m}/metrics", layout.host));
        services.push(st);
    }
    let cdir = dir.join("client");
    let pid = read_pid(&cdir.join("mount.pid"));
    let mut st = ServiceStatus::new("mount".into(), "client", None, pid, cdir.join("mount.log"));
    st.metrics = layout.metrics_port(&cdir).map(|m| format!("http://{}:{m}/metrics", layout.host));
    services.push(st);
    let running = services.iter().filter(|s| s.running);
    let total_rss_kib = running.clone().filter_map(|s| s.rss_kib).sum();
    let total_peak_rss_kib = running.filter_map(|s| s.peak_rss_kib).sum();
    Status {
        dir: dir.to_path_buf(),
        fs_uuid: layout.fs_uuid.clone(),
        mounted: is_mounted(&layout.mountpoint),
        mountpoint: layout.mountpoint.clone(),
        services,
        total_rss_kib,
        total_peak_rss_kib,
    }
}

fn mib(kib: u64) -> String {
    format!("{:.1}", kib as f64 / 1024.0)
}

fn print_status(dir: &Path, layout: &Layout) -> Result<()> {
    let st = collect_status(dir, layout);
    let rows: Vec<Vec<String>> = st
        .services
        .iter()
        .map(|s| {
            vec![
                s.name.clone(),
                s.address.clone().unwrap_or_else(|| layout.mountpoint.display().to_string()),
                s.pid.map(|p| p.to_string()).unwrap_or_else(|| "-".into()),
                if s.running { "running".into() } else { "stopped".into() },
                s.rss_kib.map(mib).unwrap_or_else(|| "-".into()),
                s.peak_rss_kib.map(mib).unwrap_or_else(|| "-".into()),
                s.log.display().to_string(),
            ]
        })
        .collect();
    print_table(&["SERVICE", "ADDRESS", "PID", "STATE", "RSS MiB", "PEAK RSS MiB", "LOG"], &rows);
    println!(
        "all running services: {} MiB resident, peaks summed {} MiB",
        mib(st.total_rss_kib),
        mib(st.total_peak_rss_kib)
    );
    Ok(())
}

pub fn status(a: StatusArgs) -> Result<()> {
    let dir = absolute(&a.dir)?;
    let layout = load_layout(&dir)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&collect_status(&dir, &layout))?);
    } else {
        println!("file system {} in {}", layout.fs_uuid, dir.display());
        println!(
            "mount point {}: {}",
            layout.mountpoint.display(),
            if is_mounted(&layout.mountpoint) { "mounted" } else { "not mounted" }
        );
        print_status(&dir, &layout)?;
    }
    Ok(())
}

/// Runs `cmd` for at most `limit`: Ok(true) if it succeeded, Ok(false) if
/// it failed or ran too long (then it is killed), Err if it is not installed.
pub(crate) fn run_with_timeout(cmd: &mut Command, limit: Duration) -> std::io::Result<bool> {
    let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped()).spawn()?;
    let start = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(s)) => return Ok(s.success()),
            Ok(None) if start.elapsed() < limit => std::thread::sleep(Duration::from_millis(50)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Ok(false);
            }
        }
    }
}

/// Unmounts the FUSE mount `mnt` (lazily: detaches it even while busy):
/// with fusermount3, or, where that is missing, umount (root only).
/// Ok(false) if the mount is busy or its server does not answer.
pub(crate) fn unmount(mnt: &Path, lazy: bool) -> Result<bool> {
    let limit = Duration::from_secs(10);
    let flag = if lazy { "-uz" } else { "-u" };
    match run_with_timeout(Command::new("fusermount3").arg(flag).arg(mnt), limit) {
        Ok(ok) => return Ok(ok),
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(e).with_context(|| format!("cannot run fusermount3 to unmount {}", mnt.display()))
        }
        Err(_) => {}
    }
    let mut umount = Command::new("umount");
    if lazy {
        umount.arg("-l");
    }
    run_with_timeout(umount.arg(mnt), limit).with_context(|| {
        format!("cannot unmount {}: neither fusermount3 (Debian package fuse3) nor umount is installed", mnt.display())
    })
}

pub(crate) fn stop_pid(name: &str, pid: i32, grace: Duration) {
    // A process this file system started (pid from its pid file).
    send_signal(pid, Signal::TERM);
    let start = Instant::now();
    while pid_alive(pid) && start.elapsed() < grace {
        std::thread::sleep(Duration::from_millis(50));
    }
    if pid_alive(pid) {
        eprintln!("{name} (pid {pid}) did not stop within {grace:?}; killing it");
        send_signal(pid, Signal::KILL);
    }
}

pub fn down(a: DownArgs) -> Result<()> {
    let dir = absolute(&a.dir)?;
    let layout = load_layout(&dir)?;
    let mnt = &layout.mountpoint;
    if is_mounted(mnt) && !unmount(mnt, false)? {
        if a.force {
            eprintln!("{} is busy or its server is gone; detaching it lazily", mnt.display());
            if !unmount(mnt, true)? {
                eprintln!("cannot detach {}; stopping the services anyway", mnt.display());
            }
        } else {
            bail!(
                "cannot unmount {}: it is busy (processes have files open there) or not responding; \
                 close them, or run `hivefs down --dir {} --force` to detach it lazily",
                mnt.display(),
                dir.display()
            );
        }
    }
    let cdir = dir.join("client");
    if let Some(pid) = service_running(&cdir, "mount") {
        stop_pid("mount", pid, Duration::from_secs(5));
    }
    let _ = std::fs::remove_file(mount_record_path(mnt));
    let mut services = layout.services(&dir);
    services.reverse(); // storage, then meta, then mgmtd
    let mut stopped = vec!["mount".to_string()];
    for (name, _, _, sdir) in services {
        if let Some(pid) = service_running(&sdir, &name) {
            stop_pid(&name, pid, Duration::from_secs(10));
            stopped.push(name.clone());
        }
        let _ = std::fs::remove_file(sdir.join(format!("{name}.pid")));
    }
    let _ = std::fs::remove_file(cdir.join("mount.pid"));
    println!(
        "HiveFS in {} is down ({} unmounted; data kept — `hivefs up --dir {}` brings it back).",
        dir.display(),
        mnt.display(),
        dir.display()
    );
    Ok(())
}
