//! One node's part of an on-demand instance: `hivefs ond node PHASE`, run over ssh by the
//! orchestrator, and `hivefs ond stop --local`. Every phase gets the instance document on
//! its standard input and answers with one JSON document on its standard output.
//!
//! A node keeps its instance's state in `<state-dir>/<name>/`: the instance document,
//! the shared secret, the services' config files, pid files and logs (and the pushed
//! binary). Data lives under the `--data` directories: `<data1>/{mgmtd,meta,storage}`
//! and a target `<dataN>/target` per data directory, with a copy of the instance
//! document in `<data1>/instance.json`.

use super::Instance;
use crate::up::{check_alive, log_tail, service_running, spawn_service, stop_pid, unmount, wait_until};
use crate::util::{is_mounted, pid_alive, read_pid};
use anyhow::{anyhow, bail, Context, Result};
use hivefs_net::{call_once, ClientConfig};
use hivefs_proto::Request;
use serde::{Deserialize, Serialize};
use std::io::{Read, Write};
use std::net::ToSocketAddrs;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// What a phase gets on its standard input.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct Job {
    pub instance: Instance,
    /// Index of this node in `instance.nodes`.
    pub index: usize,
    /// The shared secret's file contents (absent for `check`).
    pub secret: Option<String>,
    /// Whether this start makes a new file system (else it brings back the one in the
    /// data directories).
    pub fresh: bool,
    /// Seconds a phase may wait for services.
    pub timeout: u64,
}

/// A node's answer to `check`.
#[derive(Serialize, Deserialize, Debug, Default)]
pub struct CheckReport {
    pub version: String,
    /// The node's own name resolved on the node (IPv4, not loopback unless alone).
    pub addr: Option<String>,
    /// The instance document found in its first data directory, if any.
    pub existing: Option<Instance>,
    /// Reasons the node cannot take part.
    pub problems: Vec<String>,
}

/// Services of an instance on one node: (name, role, port offset).
pub fn roles(inst: &Instance, index: usize) -> Vec<(&'static str, u16)> {
    let mut v = Vec::new();
    if index == 0 {
        v.push(("mgmtd", 0));
    }
    if index < inst.meta as usize {
        v.push(("meta", 1));
    }
    v.push(("storage", 2));
    v
}

pub fn state_of(state_dir: &Path, name: &str) -> PathBuf {
    state_dir.join(name)
}

fn targets(inst: &Instance) -> Vec<PathBuf> {
    inst.data.iter().map(|d| d.join("target")).collect()
}

/// Resolves `node` as the node itself does: the address others reach it at.
fn own_addr(node: &str, alone: bool) -> Result<String> {
    let addrs: Vec<std::net::IpAddr> = (node, 0u16)
        .to_socket_addrs()
        .with_context(|| format!("cannot resolve its own name {node}"))?
        .map(|a| a.ip())
        .collect();
    let pick =
        addrs.iter().find(|a| a.is_ipv4() && !a.is_loopback()).or_else(|| addrs.iter().find(|a| !a.is_loopback()));
    match pick {
        Some(a) => Ok(a.to_string()),
        None if alone => Ok(addrs.first().map(|a| a.to_string()).unwrap_or_else(|| "127.0.0.1".into())),
        None => bail!(
            "its own name {node} resolves only to loopback ({addrs:?}): other nodes could not reach its services; \
             map the name to the node's network address (/etc/hosts, DNS) or list the node by address"
        ),
    }
}

pub fn read_job() -> Result<Job> {
    let mut s = String::new();
    std::io::stdin().read_to_string(&mut s).context("cannot read the instance document on standard input")?;
    serde_json::from_str(&s).context("the instance document on standard input is malformed")
}

pub fn check(job: &Job) -> CheckReport {
    let inst = &job.instance;
    let node = &inst.nodes[job.index].name;
    let mut r = CheckReport { version: env!("CARGO_PKG_VERSION").to_string(), ..CheckReport::default() };
    match own_addr(node, inst.nodes.len() == 1) {
        Ok(a) => r.addr = Some(a),
        Err(e) => r.problems.push(format!("{e:#}")),
    }
    let state = state_of(&inst.state_dir, &inst.name);
    let running: Vec<String> = ["mgmtd", "meta", "storage", "mount"]
        .iter()
        .filter_map(|s| service_running(&state, s).map(|p| format!("{s} (pid {p})")))
        .collect();
    if !running.is_empty() {
        r.problems.push(format!(
            "instance {} runs here already: {}; stop it first (hivefs ond stop)",
            inst.name,
            running.join(", ")
        ));
    }
    for (i, d) in inst.data.iter().enumerate() {
        match std::fs::read_dir(d) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => r.problems.push(format!("data directory {}: {e}", d.display())),
            Ok(mut rd) => {
                if rd.next().is_none() {
                    continue;
                }
                let doc = d.join("instance.json");
                match std::fs::read(&doc).ok().and_then(|b| serde_json::from_slice::<Instance>(&b).ok()) {
                    Some(prev) if i == 0 => r.existing = Some(prev),
                    Some(_) => {}
                    None if d.join("target").exists() && i > 0 => {}
                    None => r.problems.push(format!(
                        "data directory {} holds other files (no HiveFS instance); give an empty or new directory",
                        d.display()
                    )),
                }
            }
        }
    }
    let mnt = &inst.mount;
    if is_mounted(mnt) {
        r.problems.push(format!("{} is mounted already", mnt.display()));
    } else if let Ok(mut rd) = std::fs::read_dir(mnt) {
        if rd.next().is_some() {
            r.problems.push(format!("mount point {} is not empty", mnt.display()));
        }
    } else if mnt.exists() {
        r.problems.push(format!("mount point {} is not a directory", mnt.display()));
    }
    if let Some(addr) = &r.addr {
        for (svc, off) in roles(inst, job.index) {
            let port = inst.port_base + off;
            if let Err(e) = std::net::TcpListener::bind((addr.as_str(), port)) {
                r.problems.push(format!("port {port} on {addr} for {svc}: {e} (choose another --port-base)"));
            }
        }
    }
    r
}

fn write_private(path: &Path, contents: &[u8]) -> Result<()> {
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .with_context(|| format!("cannot write {}", tmp.display()))?;
    f.write_all(contents)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))
}

/// The node's state directory with the instance document, secret and config files.
fn prepare(job: &Job) -> Result<PathBuf> {
    let inst = &job.instance;
    let state = state_of(&inst.state_dir, &inst.name);
    std::fs::create_dir_all(&state).with_context(|| format!("cannot create {}", state.display()))?;
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o700))?;
    let secret = job.secret.as_deref().ok_or_else(|| anyhow!("no shared secret given"))?;
    write_private(&state.join("secret"), secret.as_bytes())?;
    let doc = serde_json::to_vec_pretty(inst)?;
    write_private(&state.join("instance.json"), &doc)?;
    // Later stops and status calls run the same binary (a pushed one is there already).
    let link = state.join("hivefs");
    if std::fs::symlink_metadata(&link).is_err() {
        let exe = std::env::current_exe().context("cannot find the hivefs executable")?;
        std::os::unix::fs::symlink(&exe, &link).with_context(|| format!("cannot create {}", link.display()))?;
    }
    for (svc, table) in &inst.settings {
        write_private(&state.join(format!("{svc}.toml")), toml::to_string(table)?.as_bytes())?;
    }
    Ok(state)
}

fn service_args(inst: &Instance, index: usize, role: &str, state: &Path) -> Vec<String> {
    let node = &inst.nodes[index];
    let addr = node.addr.as_deref().unwrap_or("127.0.0.1");
    let port = inst.port_base + roles(inst, index).iter().find(|r| r.0 == role).map(|r| r.1).unwrap_or(0);
    let data = &inst.data[0];
    let mut a: Vec<String> = vec![
        role.into(),
        "--dir".into(),
        data.join(role).display().to_string(),
        "--listen".into(),
        format!("{addr}:{port}"),
        "--secret-file".into(),
        state.join("secret").display().to_string(),
    ];
    if role != "mgmtd" {
        a.extend(["--mgmtd".into(), inst.mgmtd.clone()]);
    }
    if inst.settings.contains_key(role) {
        a.extend(["--config".into(), state.join(format!("{role}.toml")).display().to_string()]);
    }
    if role == "storage" {
        a.extend(["--fs-uuid".into(), inst.fs_uuid.clone()]);
        for t in targets(inst) {
            a.extend(["--target".into(), t.display().to_string()]);
        }
    }
    a
}

fn client_config(state: &Path) -> Result<ClientConfig> {
    let secret = hivefs_net::load_secret(&state.join("secret")).map_err(|e| anyhow!(e))?;
    Ok(ClientConfig::new(Some(secret)).with_timeout(Duration::from_secs(1)))
}

/// Starts `roles` of this node (skipping running ones) and waits until each answers.
fn start_services(job: &Job, which: &[&str]) -> Result<serde_json::Value> {
    let inst = &job.instance;
    let state = prepare(job)?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let ccfg = client_config(&state)?;
    let timeout = Duration::from_secs(job.timeout);
    let mut started = Vec::new();
    for (role, off) in roles(inst, job.index).into_iter().filter(|r| which.contains(&r.0)) {
        if service_running(&state, role).is_none() {
            std::fs::create_dir_all(inst.data[0].join(role))
                .with_context(|| format!("cannot create {}", inst.data[0].join(role).display()))?;
            if role == "storage" {
                for t in targets(inst) {
                    std::fs::create_dir_all(&t).with_context(|| format!("cannot create {}", t.display()))?;
                    hivefs_storage::init_target(&t, &inst.fs_uuid)
                        .map_err(|e| anyhow!("target {}: {e}", t.display()))?;
                }
            }
            spawn_service(role, &service_args(inst, job.index, role, &state), &state)?;
            started.push(role);
        }
        let addr = format!("{}:{}", inst.nodes[job.index].addr.as_deref().unwrap_or("127.0.0.1"), inst.port_base + off);
        wait_until(&format!("{role} to answer on {addr}"), timeout, || {
            check_alive(role, &state)?;
            Ok(rt.block_on(call_once(&addr, &ccfg, &Request::Ping)).is_ok())
        })?;
    }
    if which.contains(&"storage") {
        // The instance's record beside its data (`ond status --json`, a later start).
        let doc = serde_json::to_vec_pretty(inst)?;
        write_private(&inst.data[0].join("instance.json"), &doc)?;
    }
    Ok(serde_json::json!({ "started": started }))
}

pub fn phase_mgmtd(job: &Job) -> Result<serde_json::Value> {
    start_services(job, &["mgmtd"])
}

pub fn phase_servers(job: &Job) -> Result<serde_json::Value> {
    start_services(job, &["meta", "storage"])
}

/// On the first node: waits for every service to register, then sets up a new file
/// system (mirroring, the root's pattern) and has the metadata nodes load the view.
pub fn phase_setup(job: &Job) -> Result<serde_json::Value> {
    let inst = &job.instance;
    let state = state_of(&inst.state_dir, &inst.name);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let ccfg = client_config(&state)?;
    let timeout = Duration::from_secs(job.timeout);
    let n = inst.nodes.len() as u32;
    let want = crate::up::Want { meta: inst.meta, storage: n, targets: inst.nodes.len() * inst.data.len() };
    let metas = crate::up::wait_registered(&rt, &inst.mgmtd, &ccfg, want, timeout, || Ok(()))?;
    if job.fresh && inst.root_pattern.mirror {
        crate::up::mirror_all(&rt, &inst.mgmtd, &ccfg, &metas, false, timeout)?;
    }
    crate::up::refresh_views(&rt, &ccfg, &metas)?;
    if job.fresh {
        let p = &inst.root_pattern;
        let pat = hivefs_types::pattern::DirPattern {
            chunk_size: p.chunk_size,
            stripe_count: p.stripe,
            chooser: hivefs_types::pattern::Chooser::parse(&p.chooser)
                .ok_or_else(|| anyhow!("unknown chooser {}", p.chooser))?,
            mirror: p.mirror,
            ..Default::default()
        };
        let mc = match &p.meta_chooser {
            Some(m) => {
                Some(hivefs_proto::MetaChooser::parse(m).ok_or_else(|| anyhow!("unknown metadata chooser {m}"))?)
            }
            None => None,
        };
        let opts = hivefs_client::Options::new(inst.mgmtd.clone(), ccfg.secret.clone());
        crate::up::set_root_pattern(&rt, &opts, pat, mc)?;
    }
    Ok(serde_json::json!({ "metadata_nodes": metas.len() }))
}

/// Mounts the instance and proves the mount serves I/O: a file written, synced, read
/// back and removed.
pub fn phase_mount(job: &Job) -> Result<serde_json::Value> {
    let inst = &job.instance;
    let state = prepare(job)?;
    let mnt = &inst.mount;
    let timeout = Duration::from_secs(job.timeout);
    if !(service_running(&state, "mount").is_some() && is_mounted(mnt)) {
        std::fs::create_dir_all(mnt).with_context(|| format!("cannot create mount point {}", mnt.display()))?;
        hivefs_fuse::check_mountpoint(mnt).map_err(|e| anyhow!(e))?;
        let args = vec![
            "mount".to_string(),
            "--mgmtd".into(),
            inst.mgmtd.clone(),
            "--secret-file".into(),
            state.join("secret").display().to_string(),
            "--cache-mode".into(),
            inst.cache_mode.clone(),
            "--atime".into(),
            inst.atime.clone(),
            mnt.display().to_string(),
        ];
        spawn_service("mount", &args, &state)?;
        wait_until(&format!("the mount on {}", mnt.display()), timeout, || {
            check_alive("mount", &state)?;
            Ok(is_mounted(mnt) && std::fs::metadata(mnt).is_ok())
        })?;
    }
    let probe = mnt.join(format!(".hivefs-ond-probe-{}-{}", inst.nodes[job.index].name, std::process::id()));
    let data: Vec<u8> = (0..(1u32 << 20)).map(|i| (i.wrapping_mul(2654435761) >> 24) as u8).collect();
    let t = Instant::now();
    let io = (|| -> std::io::Result<Vec<u8>> {
        let mut f = std::fs::File::create(&probe)?;
        f.write_all(&data)?;
        f.sync_all()?;
        drop(f);
        let back = std::fs::read(&probe)?;
        std::fs::remove_file(&probe)?;
        Ok(back)
    })();
    match io {
        Ok(back) if back == data => {}
        Ok(_) => bail!("the mount {} returned other bytes than were written to {}", mnt.display(), probe.display()),
        Err(e) => bail!("the mount {} does not serve I/O ({}): {e}", mnt.display(), probe.display()),
    }
    Ok(serde_json::json!({ "mount": mnt, "probe_ms": t.elapsed().as_millis() as u64 }))
}

/// Processes holding files, a working directory or a root under `mnt`: (pid, command).
pub fn holders(mnt: &Path) -> Vec<(i32, String)> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir("/proc") else { return out };
    for e in rd.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else { continue };
        let p = e.path();
        let mut links: Vec<PathBuf> = ["cwd", "root", "exe"].iter().map(|l| p.join(l)).collect();
        if let Ok(fds) = std::fs::read_dir(p.join("fd")) {
            links.extend(fds.flatten().map(|f| f.path()));
        }
        // readlink of /proc links never reaches the file system itself.
        if links.iter().any(|l| std::fs::read_link(l).is_ok_and(|t| t.starts_with(mnt))) {
            let comm = std::fs::read_to_string(p.join("comm")).unwrap_or_default().trim().to_string();
            out.push((pid, comm));
        }
    }
    out
}

/// What `ond stop --local` did on this node.
#[derive(Serialize, Deserialize, Debug, Default)]
#[serde(default)]
pub struct StopReport {
    pub node: String,
    /// No instance of that name was known here.
    pub absent: bool,
    pub unmounted: bool,
    /// The mount was busy or its server gone: detached lazily.
    pub lazy: bool,
    /// Processes that held the mount: "pid (command)".
    pub holders: Vec<String>,
    pub stopped: Vec<String>,
    /// Services that did not stop on SIGTERM in time.
    pub killed: Vec<String>,
    pub data_deleted: bool,
    pub problems: Vec<String>,
}

/// Stops this node's part of instance `name`: the mount (lazily when busy, naming the
/// processes that hold it), then its services, then (with `delete_data`) its data and
/// state. Bounded: each unmount try 10 s, each service 5-10 s.
pub fn stop_local(state_dir: &Path, name: &str, delete_data: bool) -> StopReport {
    let state = state_of(state_dir, name);
    let mut r = StopReport { node: hostname(), ..StopReport::default() };
    let inst: Option<Instance> =
        std::fs::read(state.join("instance.json")).ok().and_then(|b| serde_json::from_slice(&b).ok());
    let Some(inst) = inst else {
        r.absent = true;
        return r;
    };
    let mnt = &inst.mount;
    detach(mnt, &mut r);
    for (svc, grace) in [("mount", 5), ("storage", 10), ("meta", 10), ("mgmtd", 10)] {
        if let Some(pid) = service_running(&state, svc) {
            stop_pid(svc, pid, Duration::from_secs(grace));
            if pid_alive(pid) {
                r.problems.push(format!("{svc} (pid {pid}) still runs after SIGKILL"));
            } else {
                r.stopped.push(svc.to_string());
            }
        }
        if read_pid(&state.join(format!("{svc}.pid"))).is_some_and(pid_alive) {
            r.killed.push(svc.to_string());
        }
        let _ = std::fs::remove_file(state.join(format!("{svc}.pid")));
    }
    if delete_data && r.problems.is_empty() {
        let mut gone = true;
        for (i, d) in inst.data.iter().enumerate() {
            let mut parts = vec![d.join("target")];
            if i == 0 {
                parts.extend(["mgmtd", "meta", "storage", "instance.json"].iter().map(|p| d.join(p)));
            }
            for p in parts {
                let res = if p.is_dir() { std::fs::remove_dir_all(&p) } else { std::fs::remove_file(&p) };
                if let Err(e) = res.or_else(|e| if e.kind() == std::io::ErrorKind::NotFound { Ok(()) } else { Err(e) })
                {
                    r.problems.push(format!("cannot delete {}: {e}", p.display()));
                    gone = false;
                }
            }
            // The directory itself when nothing else is left in it.
            let _ = std::fs::remove_dir(d);
        }
        r.data_deleted = gone;
    }
    if r.problems.is_empty() {
        // Its mount point, when empty and made for it; then the state (logs, secret).
        let _ = std::fs::remove_dir(mnt);
        if let Err(e) = std::fs::remove_dir_all(&state) {
            r.problems.push(format!("cannot remove {}: {e}", state.display()));
        }
    }
    r
}

/// Unmounts `mnt` if mounted: normally, or lazily when busy (naming the holders).
fn detach(mnt: &Path, r: &mut StopReport) {
    if is_mounted(mnt) {
        match unmount(mnt, false) {
            Ok(true) => r.unmounted = true,
            _ => {
                r.holders = holders(mnt).into_iter().map(|(p, c)| format!("{p} ({c})")).collect();
                match unmount(mnt, true) {
                    Ok(true) => {
                        r.unmounted = true;
                        r.lazy = true;
                    }
                    Ok(false) => r.problems.push(format!("cannot detach {}", mnt.display())),
                    Err(e) => r.problems.push(format!("{e:#}")),
                }
            }
        }
    }
}

/// `ond stop --local --mount-only`: the mount alone (and its process).
pub fn unmount_only(state_dir: &Path, name: &str) -> StopReport {
    let state = state_of(state_dir, name);
    let mut r = StopReport { node: hostname(), ..StopReport::default() };
    let Some(inst) =
        std::fs::read(state.join("instance.json")).ok().and_then(|b| serde_json::from_slice::<Instance>(&b).ok())
    else {
        r.absent = true;
        return r;
    };
    detach(&inst.mount, &mut r);
    if let Some(pid) = service_running(&state, "mount") {
        stop_pid("mount", pid, Duration::from_secs(5));
        r.stopped.push("mount".into());
    }
    r
}

fn hostname() -> String {
    rustix::system::uname().nodename().to_string_lossy().into_owned()
}

/// One service's state on a node.
#[derive(Serialize, Deserialize, Debug)]
pub struct ServiceState {
    pub name: String,
    pub pid: Option<i32>,
    pub running: bool,
    pub rss_kib: Option<u64>,
    pub peak_rss_kib: Option<u64>,
    /// Last lines of its log when it is not running.
    pub log_tail: Option<String>,
}

/// `ond status` of one node.
#[derive(Serialize, Deserialize, Debug, Default)]
#[serde(default)]
pub struct NodeStatus {
    pub node: String,
    pub known: bool,
    pub services: Vec<ServiceState>,
    pub mount: Option<PathBuf>,
    pub mounted: bool,
    /// Resident memory of the running services together (and their peaks summed).
    pub total_rss_kib: u64,
    pub total_peak_rss_kib: u64,
    pub mem_total_kib: Option<u64>,
    pub mem_available_kib: Option<u64>,
    pub instance: Option<Instance>,
}

pub fn status(state_dir: &Path, name: &str) -> NodeStatus {
    let state = state_of(state_dir, name);
    let mut st = NodeStatus { node: hostname(), ..NodeStatus::default() };
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let field = |k: &str| {
        meminfo
            .lines()
            .find(|l| l.starts_with(k))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
    };
    st.mem_total_kib = field("MemTotal:");
    st.mem_available_kib = field("MemAvailable:");
    let Some(inst) =
        std::fs::read(state.join("instance.json")).ok().and_then(|b| serde_json::from_slice::<Instance>(&b).ok())
    else {
        return st;
    };
    st.known = true;
    let index = inst.nodes.iter().position(|n| n.name == st.node || n.addr.as_deref() == Some(st.node.as_str()));
    let mut names: Vec<&str> = match index {
        Some(i) => roles(&inst, i).into_iter().map(|r| r.0).collect(),
        None => {
            vec!["mgmtd", "meta", "storage"].into_iter().filter(|s| state.join(format!("{s}.pid")).exists()).collect()
        }
    };
    names.push("mount");
    for name in names {
        let pid = read_pid(&state.join(format!("{name}.pid")));
        let running = pid.is_some_and(pid_alive);
        let mem = pid.filter(|_| running).and_then(hivefs_bench::cpu::pid_memory_kib);
        let log_tail = (!running).then(|| log_tail(&state.join(format!("{name}.log")))).filter(|t| !t.is_empty());
        st.services.push(ServiceState {
            name: name.into(),
            pid,
            running,
            rss_kib: mem.map(|m| m.0),
            peak_rss_kib: mem.map(|m| m.1),
            log_tail,
        });
    }
    st.total_rss_kib = st.services.iter().filter_map(|s| s.rss_kib).sum();
    st.total_peak_rss_kib = st.services.iter().filter_map(|s| s.peak_rss_kib).sum();
    st.mounted = is_mounted(&inst.mount);
    st.mount = Some(inst.mount.clone());
    st.instance = Some(inst);
    st
}

/// Last lines of every service log of this node's part of the instance (for the
/// orchestrator's error report).
pub fn logs(state_dir: &Path, name: &str) -> String {
    let state = state_of(state_dir, name);
    let mut out = String::new();
    for svc in ["mgmtd", "meta", "storage", "mount"] {
        let p = state.join(format!("{svc}.log"));
        if p.exists() {
            out.push_str(&format!("--- {svc} ({})\n{}\n", p.display(), log_tail(&p)));
        }
    }
    out
}
