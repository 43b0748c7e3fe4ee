//! On-demand file systems across the nodes of a job: `hivefs ond start|stop|status`.
//!
//! The orchestrator (this module) runs on one machine, usually the job's first node, and
//! drives every node over OpenSSH ([`ssh`]) by running `hivefs ond node PHASE` there
//! ([`node`]), all nodes of a phase in parallel:
//!
//! 1. `check`: version, the node's own address, free ports, empty or reusable data
//!    directories and mount point. Nothing is started when a node fails it.
//! 2. `mgmtd` on the first node, 3. `servers` (metadata on the first `--meta` nodes,
//!    storage on every node), 4. `setup` on the first node (registration, mirroring, the
//!    root's pattern), 5. `mount` on every node, which returns once its mount has written
//!    and read back a file.
//!
//! A failure in 2-5 names the node and the reason, and stops what was started. Stop runs
//! `hivefs ond stop --local` on every node (first only the mounts, then the services),
//! each call bounded in time, so dead nodes are reported, never waited for.
//!
//! It must not hold file-system logic: the services are the ordinary `hivefs mgmtd|meta|
//! storage|mount` processes, started as `hivefs up` starts them.

pub mod node;
pub mod ssh;

use crate::util::{human, parse_size, print_table};
use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Subcommand, ValueEnum};
use serde::{Deserialize, Serialize};
use ssh::{all_ok, parse_nodes, sh_quote, Ssh};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[derive(Subcommand, Debug)]
pub enum OndCmd {
    /// Start a file system over the given nodes (mgmtd on the first, metadata on the first
    /// --meta, storage and a mount on every node) and return once every node's mount
    /// serves I/O. A node that fails makes the whole start fail (named, with the reason)
    /// and what was started is stopped again.
    Start(StartArgs),
    /// Unmount the instance on every node (lazily when busy, naming the processes that
    /// hold it), stop its services, and with --delete-data remove its data. Bounded in
    /// time: unreachable or dead nodes are reported, not waited for. Exit status 1 when
    /// some node could not be cleaned up.
    Stop(StopArgs),
    /// Every node's services (running, memory), mount and free memory; --json adds the
    /// instance document (every effective parameter of the instance).
    Status(StatusArgs),
    /// A parallel copy spread over the nodes (beeond-cp): every node runs `hivefs cp
    /// --part I/N` of the same SRC... DST (paths every node sees: a shared file system
    /// or the instance's mount), then the first node sets the directories' attributes.
    /// Exit status 1 when a node failed or some entry could not be copied.
    Cp(OndCpArgs),
    /// One node's part of an instance (run by the orchestrator over ssh).
    #[command(hide = true)]
    Node(NodeArgs),
}

/// Which nodes.
#[derive(Args, Debug, Clone)]
pub struct NodesArg {
    /// Comma-separated nodes: host names or addresses, as ssh reaches them and as each
    /// node resolves its own name (the first is the instance's head: mgmtd, first
    /// metadata node).
    #[arg(long, value_delimiter = ',')]
    pub nodes: Vec<String>,
    /// File with one node per line (blank lines, `#` comments and words after the name
    /// ignored); added before --nodes.
    #[arg(long)]
    pub nodefile: Option<PathBuf>,
}

/// How to reach the nodes and where the instance keeps its state on them.
#[derive(Args, Debug, Clone)]
pub struct Reach {
    /// Instance name: several instances (jobs) may share nodes under different names
    /// (and --port-base).
    #[arg(long, default_value = "default")]
    pub name: String,
    /// Directory on every node for the instances' state (pids, logs, secret, configs):
    /// <state-dir>/<name>. Default: /run/hivefs-ond as root, else $XDG_RUNTIME_DIR or
    /// /tmp/hivefs-ond-<uid>.
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// ssh client config file (`ssh -F`): user, identity, known hosts, proxies. ssh
    /// always runs with BatchMode=yes (never asks for a password).
    #[arg(long)]
    pub ssh_config: Option<PathBuf>,
    /// Seconds ssh waits for a node's connection.
    #[arg(long, default_value_t = 5)]
    pub connect_timeout: u64,
    /// The hivefs program on the nodes (a name on their PATH or an absolute path).
    #[arg(long, default_value = "hivefs")]
    pub remote_bin: String,
}

impl Reach {
    fn ssh(&self) -> Ssh {
        Ssh { config: self.ssh_config.clone(), connect_timeout: Duration::from_secs(self.connect_timeout) }
    }

    fn state_dir(&self) -> PathBuf {
        self.state_dir.clone().unwrap_or_else(default_state_dir)
    }

    /// A shell command line that runs `hivefs ARGS` on a node as the instance's start
    /// did (its state keeps a link to that binary, or the pushed copy), or, where the
    /// node knows no such instance, prints `unknown` (a JSON document) without needing
    /// any hivefs there.
    fn run_instance_bin(&self, args: &str, unknown: &str) -> String {
        let dir = node::state_of(&self.state_dir(), &self.name);
        format!(
            "d={}; if [ ! -d \"$d\" ]; then printf '%s\\n' {}; exit 0; fi; b=\"$d/hivefs\"; [ -x \"$b\" ] || b={}; \
             exec \"$b\" {args}",
            sh_quote(&dir.display().to_string()),
            sh_quote(unknown),
            sh_quote(&self.remote_bin)
        )
    }
}

fn default_state_dir() -> PathBuf {
    if rustix::process::geteuid().is_root() {
        return PathBuf::from("/run/hivefs-ond");
    }
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(d) => PathBuf::from(d).join("hivefs-ond"),
        None => std::env::temp_dir().join(format!("hivefs-ond-{}", rustix::process::geteuid().as_raw())),
    }
}

#[derive(Args, Debug)]
pub struct StartArgs {
    #[command(flatten)]
    pub nodes: NodesArg,
    #[command(flatten)]
    pub reach: Reach,
    /// Data directory on every node (absolute). Repeat for several: each is one storage
    /// target of the node's storage server (the first also holds mgmtd's and the
    /// metadata node's data and the instance document, instance.json).
    #[arg(long = "data", required = true)]
    pub data: Vec<PathBuf>,
    /// Mount point on every node (absolute; created if missing; must be empty).
    #[arg(long)]
    pub mount: PathBuf,
    /// Number of metadata servers (on the first N nodes).
    #[arg(long, default_value_t = 1)]
    pub meta: u32,
    /// Chunk size of the root directory (power of two, 4k to 1g).
    #[arg(long, default_value = "512k")]
    pub chunk_size: String,
    /// Stripe count of the root directory (0 = all targets).
    #[arg(long, default_value_t = 0)]
    pub stripe: u32,
    /// Target chooser of the root directory: random, roundrobin, randomized-roundrobin,
    /// balanced.
    #[arg(long, default_value = "balanced")]
    pub chooser: String,
    /// Metadata-node chooser of the root directory: balanced, random, roundrobin.
    #[arg(long)]
    pub meta_chooser: Option<String>,
    /// Cache mode of the mounts: native (direct I/O), paged (page cache, close-to-open)
    /// or buffered (direct I/O, small writes kept in the mount and sent in the background).
    #[arg(long, default_value = "native", value_parser = ["native", "paged", "buffered"])]
    pub cache_mode: String,
    /// When reads move access times: noatime, relatime, strictatime.
    #[arg(long, default_value = "noatime", value_parser = ["noatime", "relatime", "strictatime"])]
    pub atime: String,
    /// Mirror data (targets paired over different nodes, root files striped over the
    /// groups) and, with --meta 2 or more, every namespace onto the next metadata node.
    /// Needs 2 or more nodes.
    #[arg(long)]
    pub mirror: bool,
    /// A service setting, SERVICE.KEY=VALUE with SERVICE one of mgmtd, meta, storage and
    /// KEY a key of its config file (docs/operations.md), e.g. meta.sync=false or
    /// storage.heartbeat_interval_ms=500. VALUE is a TOML value (a bare word is a
    /// string). Repeatable; checked before any node is contacted.
    #[arg(long = "set", value_name = "SERVICE.KEY=VALUE")]
    pub set: Vec<String>,
    /// First of the instance's 3 TCP ports on every node: mgmtd, metadata, storage.
    #[arg(long, default_value_t = 18000)]
    pub port_base: u16,
    /// Copy this hivefs binary to every node (into the instance's state directory) and
    /// run that, instead of the one on the nodes.
    #[arg(long)]
    pub push: bool,
    /// Seconds each phase may take on a node (service start, registration, mount).
    #[arg(long, default_value_t = 120)]
    pub timeout: u64,
    /// Print the instance document (JSON) when started, instead of a summary.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct StopArgs {
    #[command(flatten)]
    pub nodes: NodesArg,
    #[command(flatten)]
    pub reach: Reach,
    /// Also delete the instance's data on every node (targets, metadata, mgmtd) and
    /// remove the data and mount directories when that leaves them empty.
    #[arg(long)]
    pub delete_data: bool,
    /// Stop only this machine's part of the instance, without ssh (a Slurm epilog on
    /// each node).
    #[arg(long)]
    pub local: bool,
    /// Only unmount (lazily when busy); leave the services running.
    #[arg(long)]
    pub mount_only: bool,
    /// Seconds a node may take to stop before it is reported as not cleaned up.
    #[arg(long, default_value_t = 90)]
    pub timeout: u64,
    /// Machine-readable report.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct StatusArgs {
    #[command(flatten)]
    pub nodes: NodesArg,
    #[command(flatten)]
    pub reach: Reach,
    /// Machine-readable: the instance document and every node's state.
    #[arg(long)]
    pub json: bool,
    /// Seconds to wait for a node's answer.
    #[arg(long, default_value_t = 30)]
    pub timeout: u64,
}

#[derive(Args, Debug)]
pub struct OndCpArgs {
    #[command(flatten)]
    pub nodes: NodesArg,
    #[command(flatten)]
    pub reach: Reach,
    #[command(flatten)]
    pub what: crate::cp::CopyWhat,
    /// Seconds a node's part may take.
    #[arg(long, default_value_t = 86400)]
    pub timeout: u64,
    /// Print every node's summary and the total as JSON (in the total, a file split
    /// into ranges counts once per node that copied a range of it; bytes count once).
    #[arg(long)]
    pub json: bool,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Phase {
    Check,
    Mgmtd,
    Servers,
    Setup,
    Mount,
    Status,
    Logs,
}

#[derive(Args, Debug)]
pub struct NodeArgs {
    pub phase: Phase,
    /// (status, logs) Instance name.
    #[arg(long, default_value = "default")]
    pub name: String,
    /// (status, logs) State directory.
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
}

/// The instance document: every effective parameter of an on-demand file system, kept in
/// each node's state and beside its data (`<data1>/instance.json`), shown by
/// `ond status --json`.
#[derive(Serialize, Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct Instance {
    pub name: String,
    pub fs_uuid: String,
    /// When the file system was created (seconds since the epoch), and last started.
    pub created_unix: u64,
    pub started_unix: u64,
    pub hivefs_version: String,
    pub nodes: Vec<NodeEntry>,
    /// Metadata servers: on the first `meta` nodes.
    pub meta: u32,
    /// mgmtd's address (first node).
    pub mgmtd: String,
    /// mgmtd listens on port_base, metadata servers on +1, storage servers on +2.
    pub port_base: u16,
    pub data: Vec<PathBuf>,
    pub mount: PathBuf,
    pub state_dir: PathBuf,
    pub root_pattern: RootPattern,
    pub cache_mode: String,
    pub atime: String,
    /// Settings given with --set, per service (its config file).
    pub settings: BTreeMap<String, toml::Table>,
    /// Every setting of every service as it runs, defaults included: "<role>@<node>".
    pub effective: BTreeMap<String, serde_json::Value>,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct NodeEntry {
    pub name: String,
    /// Its address, as the node resolved its own name.
    pub addr: Option<String>,
    pub services: Vec<String>,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RootPattern {
    pub chunk_size: u32,
    pub stripe: u32,
    pub chooser: String,
    pub meta_chooser: Option<String>,
    pub mirror: bool,
}

pub fn ond(cmd: OndCmd) -> Result<()> {
    match cmd {
        OndCmd::Start(a) => start(a),
        OndCmd::Stop(a) => stop(a),
        OndCmd::Status(a) => status(a),
        OndCmd::Cp(a) => copy(a),
        OndCmd::Node(a) => node_phase(a),
    }
}

fn now_unix() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// `--set SERVICE.KEY=VALUE` items as one TOML table per service.
fn parse_sets(items: &[String]) -> Result<BTreeMap<String, toml::Table>> {
    let mut out: BTreeMap<String, toml::Table> = BTreeMap::new();
    for item in items {
        let (lhs, value) = item.split_once('=').ok_or_else(|| anyhow!("--set {item}: expected SERVICE.KEY=VALUE"))?;
        let (svc, key) = lhs.split_once('.').ok_or_else(|| anyhow!("--set {item}: expected SERVICE.KEY=VALUE"))?;
        if !["mgmtd", "meta", "storage"].contains(&svc) {
            bail!("--set {item}: unknown service {svc:?} (mgmtd, meta or storage)");
        }
        if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            bail!("--set {item}: {key:?} is not a config key");
        }
        let v = toml::from_str::<toml::Table>(&format!("v = {value}"))
            .ok()
            .and_then(|mut t| t.remove("v"))
            .unwrap_or_else(|| toml::Value::String(value.to_string()));
        out.entry(svc.to_string()).or_default().insert(key.to_string(), v);
    }
    Ok(out)
}

fn config_of<T: serde::de::DeserializeOwned>(inst: &Instance, role: &str) -> Result<T> {
    let table = inst.settings.get(role).cloned().unwrap_or_default();
    toml::Value::Table(table).try_into().map_err(|e| anyhow!("--set {role}.*: {}", e.to_string().trim()))
}

/// The full configuration of every service of the instance (also checks --set).
fn effective(inst: &Instance) -> Result<BTreeMap<String, serde_json::Value>> {
    let mut out = BTreeMap::new();
    let secret = Some(node::state_of(&inst.state_dir, &inst.name).join("secret"));
    for (i, n) in inst.nodes.iter().enumerate() {
        let addr = n.addr.clone().unwrap_or_else(|| n.name.clone());
        for (role, off) in node::roles(inst, i) {
            let dir = inst.data[0].join(role);
            let listen = format!("{addr}:{}", inst.port_base + off);
            let v = match role {
                "mgmtd" => {
                    let mut c: hivefs_mgmtd::Config = config_of(inst, role)?;
                    (c.dir, c.listen, c.secret_file) = (dir, listen, secret.clone());
                    serde_json::to_value(c)?
                }
                "meta" => {
                    let mut c: hivefs_meta::Config = config_of(inst, role)?;
                    (c.dir, c.listen, c.secret_file, c.mgmtd) = (dir, listen, secret.clone(), inst.mgmtd.clone());
                    serde_json::to_value(c)?
                }
                _ => {
                    let mut c: hivefs_storage::Config = config_of(inst, role)?;
                    (c.dir, c.listen, c.secret_file, c.mgmtd) = (dir, listen, secret.clone(), inst.mgmtd.clone());
                    c.targets = inst.data.iter().map(|d| d.join("target")).collect();
                    c.fs_uuid = Some(inst.fs_uuid.clone());
                    serde_json::to_value(c)?
                }
            };
            out.insert(format!("{role}@{}", n.name), v);
        }
    }
    Ok(out)
}

fn progress(t0: Instant, msg: &str) {
    eprintln!("[{:6.1}s] {msg}", t0.elapsed().as_secs_f64());
}

/// The instance as the start arguments describe it (addresses and uuid not known yet).
fn draft(a: &StartArgs, nodes: &[String]) -> Result<Instance> {
    let n = nodes.len() as u32;
    anyhow::ensure!((1..=n.min(64)).contains(&a.meta), "--meta must be 1 to {} (the number of nodes)", n.min(64));
    anyhow::ensure!(!a.mirror || n >= 2, "--mirror needs 2 or more nodes: buddies live on different nodes");
    for p in a.data.iter().chain([&a.mount]) {
        anyhow::ensure!(p.is_absolute(), "{} must be an absolute path (it is used on every node)", p.display());
    }
    let mut seen = std::collections::HashSet::new();
    if let Some(d) = a.data.iter().find(|d| !seen.insert(*d)) {
        bail!("--data {} is given twice", d.display());
    }
    if a.data.iter().any(|d| a.mount.starts_with(d) || d.starts_with(&a.mount)) {
        bail!("the mount point {} must not be inside a data directory, nor contain one", a.mount.display());
    }
    anyhow::ensure!(a.port_base <= u16::MAX - 2, "--port-base must leave room for 3 ports");
    let chunk_size = hivefs_types::pattern::validate_chunk_size(parse_size(&a.chunk_size)?).map_err(|e| anyhow!(e))?;
    let chooser = hivefs_types::pattern::Chooser::parse(&a.chooser).ok_or_else(|| {
        anyhow!("unknown chooser {:?}: use random, roundrobin, randomized-roundrobin or balanced", a.chooser)
    })?;
    if let Some(m) = &a.meta_chooser {
        hivefs_proto::MetaChooser::parse(m)
            .ok_or_else(|| anyhow!("unknown metadata chooser {m:?}: use balanced, random or roundrobin"))?;
    }
    let state_dir = a.reach.state_dir();
    anyhow::ensure!(state_dir.is_absolute(), "--state-dir must be an absolute path");
    let mut inst = Instance {
        name: a.reach.name.clone(),
        fs_uuid: hivefs_cluster::new_uuid(),
        created_unix: now_unix(),
        started_unix: now_unix(),
        hivefs_version: env!("CARGO_PKG_VERSION").to_string(),
        nodes: Vec::new(),
        meta: a.meta,
        mgmtd: String::new(),
        port_base: a.port_base,
        data: a.data.clone(),
        mount: a.mount.clone(),
        state_dir,
        root_pattern: RootPattern {
            chunk_size,
            stripe: a.stripe,
            chooser: chooser.to_string(),
            meta_chooser: a.meta_chooser.clone(),
            mirror: a.mirror,
        },
        cache_mode: a.cache_mode.clone(),
        atime: a.atime.clone(),
        settings: parse_sets(&a.set)?,
        effective: BTreeMap::new(),
    };
    anyhow::ensure!(
        !inst.name.is_empty()
            && inst.name.len() <= 64
            && inst.name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
            && !inst.name.starts_with('.'),
        "--name must be 1-64 of a-z A-Z 0-9 - _ . (not starting with .)"
    );
    for (i, name) in nodes.iter().enumerate() {
        let mut e = NodeEntry { name: name.clone(), addr: None, services: Vec::new() };
        inst.nodes.push(e.clone());
        e.services = node::roles(&inst, i).iter().map(|r| r.0.to_string()).chain(["mount".to_string()]).collect();
        inst.nodes[i] = e;
    }
    inst.mgmtd = format!("{}:{}", nodes[0], a.port_base);
    // Unknown or ill-typed settings fail here, before any node is touched.
    effective(&inst)?;
    Ok(inst)
}

fn node_command(bin: &str, phase: &str) -> String {
    format!("{} ond node {phase}", sh_quote(bin))
}

fn job_input(inst: &Instance, index: usize, secret: Option<&str>, fresh: bool, timeout: u64) -> Vec<u8> {
    let job = node::Job { instance: inst.clone(), index, secret: secret.map(str::to_string), fresh, timeout };
    serde_json::to_vec(&job).expect("instance serializes")
}

pub fn start(a: StartArgs) -> Result<()> {
    let t0 = Instant::now();
    let nodes = parse_nodes(&a.nodes.nodes, a.nodes.nodefile.as_deref())?;
    let mut inst = draft(&a, &nodes)?;
    let ssh = a.reach.ssh();
    let limit = Duration::from_secs(a.timeout + 15);
    let check_limit = Duration::from_secs(a.reach.connect_timeout + 30);
    progress(t0, &format!("instance {}: {} nodes ({})", inst.name, nodes.len(), nodes.join(", ")));

    let bin = if a.push {
        let exe = std::env::current_exe().context("cannot find this hivefs binary to push")?;
        let bytes = std::fs::read(&exe).with_context(|| format!("cannot read {}", exe.display()))?;
        let dir = node::state_of(&inst.state_dir, &inst.name);
        let (dir_s, dst) = (dir.display().to_string(), dir.join("hivefs").display().to_string());
        let tmp = format!("{dst}.tmp");
        let cmd = format!(
            "mkdir -p {d} && chmod 700 {d} && cat > {t} && chmod 755 {t} && mv -f {t} {f}",
            d = sh_quote(&dir_s),
            t = sh_quote(&tmp),
            f = sh_quote(&dst)
        );
        progress(t0, &format!("pushing {} ({}) to every node", exe.display(), human(bytes.len() as u64)));
        let r = ssh.run_all(&nodes, Duration::from_secs(a.timeout.max(120)), |_| (cmd.clone(), bytes.clone()));
        all_ok(&nodes, r, "pushing the hivefs binary")?;
        dst
    } else {
        a.reach.remote_bin.clone()
    };

    // 1. Check every node; nothing runs yet.
    progress(t0, "checking nodes");
    let r =
        ssh.run_all(&nodes, check_limit, |i| (node_command(&bin, "check"), job_input(&inst, i, None, true, a.timeout)));
    let mut reports = Vec::new();
    for (n, out) in nodes.iter().zip(all_ok(&nodes, r, "the check")?) {
        let rep: node::CheckReport =
            serde_json::from_str(&out).map_err(|e| anyhow!("node {n}: unexpected answer to the check ({e}): {out}"))?;
        reports.push(rep);
    }
    let mut problems = Vec::new();
    for (n, rep) in nodes.iter().zip(&reports) {
        if rep.version != inst.hivefs_version {
            problems.push(format!(
                "node {n}: hivefs {} there, {} here (use --push, or install the same version)",
                rep.version, inst.hivefs_version
            ));
        }
        problems.extend(rep.problems.iter().map(|p| format!("node {n}: {p}")));
    }
    if !problems.is_empty() {
        bail!("cannot start instance {} (nothing was started):\n  {}", inst.name, problems.join("\n  "));
    }
    for (e, rep) in inst.nodes.iter_mut().zip(&reports) {
        e.addr = rep.addr.clone();
    }
    inst.mgmtd = format!("{}:{}", inst.nodes[0].addr.as_deref().unwrap_or(&nodes[0]), inst.port_base);
    let fresh = match reuse(&inst, &reports)? {
        Some(prev) => {
            progress(t0, &format!("bringing back file system {} (its data is on the nodes)", prev.fs_uuid));
            inst.fs_uuid = prev.fs_uuid.clone();
            inst.created_unix = prev.created_unix;
            inst.root_pattern = prev.root_pattern.clone();
            false
        }
        None => true,
    };
    inst.effective = effective(&inst)?;
    let secret = {
        let tmp = tempfile_path();
        hivefs_net::generate_secret_file(&tmp).context("cannot make the instance's secret")?;
        let s = std::fs::read_to_string(&tmp)?;
        let _ = std::fs::remove_file(&tmp);
        s
    };

    // Phase `phase` on the first node only (`head`) or on every node, all at once.
    let phase = |phase: &str, head: bool, what: &str| -> Result<()> {
        let on = if head { &nodes[..1] } else { &nodes[..] };
        let r = ssh
            .run_all(on, limit, |i| (node_command(&bin, phase), job_input(&inst, i, Some(&secret), fresh, a.timeout)));
        all_ok(on, r, what).map(|_| ())
    };
    let run = || -> Result<()> {
        progress(t0, &format!("starting mgmtd on {}", nodes[0]));
        phase("mgmtd", true, "starting mgmtd")?;
        progress(t0, "starting metadata and storage servers");
        phase("servers", false, "starting the servers")?;
        progress(t0, "waiting for every server to register");
        phase("setup", true, "setting up the file system")?;
        progress(t0, "mounting on every node");
        phase("mount", false, "mounting")
    };
    if let Err(e) = run() {
        progress(t0, "start failed; stopping what was started");
        let reach = Reach { remote_bin: bin.clone(), state_dir: Some(inst.state_dir.clone()), ..a.reach.clone() };
        let cleanup = stop_nodes(&reach, &nodes, fresh, Duration::from_secs(90));
        let left: Vec<String> =
            cleanup.iter().filter(|(_, ok, _)| !ok).map(|(n, _, why)| format!("{n}: {why}")).collect();
        if left.is_empty() {
            bail!("{e:#}\n(every node was cleaned up{})", if fresh { ", data deleted" } else { "" });
        }
        bail!("{e:#}\nnot cleaned up:\n  {}", left.join("\n  "));
    }
    progress(t0, "started");
    if a.json {
        println!("{}", serde_json::to_string_pretty(&inst)?);
    } else {
        println!(
            "HiveFS instance {} ({}) is mounted on {} on {} nodes: mgmtd {}, {} metadata, {} storage targets; \
             root stripe: chunk {}, {}, chooser {}{}; cache mode {}.",
            inst.name,
            inst.fs_uuid,
            inst.mount.display(),
            nodes.len(),
            inst.mgmtd,
            inst.meta,
            nodes.len() * inst.data.len(),
            human(u64::from(inst.root_pattern.chunk_size)),
            if inst.root_pattern.stripe == 0 {
                "all targets".to_string()
            } else {
                format!("{} targets", inst.root_pattern.stripe)
            },
            inst.root_pattern.chooser,
            if inst.root_pattern.mirror { ", mirrored" } else { "" },
            inst.cache_mode
        );
        println!("Instance document: {}", inst.data[0].join("instance.json").display());
        let nodes_arg = nodes.join(",");
        println!("Stop it with: hivefs ond stop --nodes {nodes_arg} --name {} [--delete-data]", inst.name);
    }
    Ok(())
}

/// A unique path for a moment (the secret before it is sent).
fn tempfile_path() -> PathBuf {
    std::env::temp_dir().join(format!(".hivefs-ond-secret-{}-{}", std::process::id(), now_unix()))
}

/// The file system in the nodes' data directories to bring back, if they hold one (all
/// of them the same, made for these nodes and data directories); none when all are empty.
fn reuse<'a>(inst: &Instance, reports: &'a [node::CheckReport]) -> Result<Option<&'a Instance>> {
    let prev: Vec<Option<&Instance>> = reports.iter().map(|r| r.existing.as_ref()).collect();
    if prev.iter().all(Option::is_none) {
        return Ok(None);
    }
    let first = prev.iter().flatten().next().expect("one is some");
    let names: Vec<&str> = inst.nodes.iter().map(|n| n.name.as_str()).collect();
    let prev_names: Vec<&str> = first.nodes.iter().map(|n| n.name.as_str()).collect();
    let mut why = Vec::new();
    for (n, p) in inst.nodes.iter().zip(&prev) {
        match p {
            None => why.push(format!("node {}: its data directory {} is empty", n.name, inst.data[0].display())),
            Some(p) if p.fs_uuid != first.fs_uuid => {
                why.push(format!("node {}: holds file system {}, not {}", n.name, p.fs_uuid, first.fs_uuid))
            }
            _ => {}
        }
    }
    if prev_names != names {
        why.push(format!("it was made for nodes {}", prev_names.join(",")));
    }
    if first.meta != inst.meta || first.data != inst.data {
        why.push(format!("it was made with --meta {} and data {:?}", first.meta, first.data));
    }
    if !why.is_empty() {
        bail!(
            "the data directories hold file system {} of instance {}, which cannot be brought back here:\n  {}\n\
             stop it with --delete-data, or give other --data directories",
            first.fs_uuid,
            first.name,
            why.join("\n  ")
        );
    }
    Ok(Some(first))
}

/// `ond stop --local` on every node in two rounds (mounts, then services); per node:
/// (node, cleaned up, what happened).
fn stop_nodes(reach: &Reach, nodes: &[String], delete_data: bool, limit: Duration) -> Vec<(String, bool, String)> {
    let ssh = reach.ssh();
    let state = reach.state_dir();
    let base = format!(
        "ond stop --local --json --name {} --state-dir {}",
        sh_quote(&reach.name),
        sh_quote(&state.display().to_string()),
    );
    let unknown = r#"{"absent":true}"#;
    // Mounts first: a mount's last requests still find every server.
    let cmd = reach.run_instance_bin(&format!("{base} --mount-only"), unknown);
    let mounts = ssh.run_all(nodes, limit, |_| (cmd.clone(), Vec::new()));
    let cmd = reach.run_instance_bin(&if delete_data { format!("{base} --delete-data") } else { base }, unknown);
    let r = ssh.run_all(nodes, limit, |_| (cmd.clone(), Vec::new()));
    let parse = |out: &str| {
        serde_json::from_str::<node::StopReport>(out).map_err(|e| format!("unexpected answer ({e}): {out}"))
    };
    nodes
        .iter()
        .zip(r.into_iter().zip(mounts))
        .map(|(n, (r, m))| match r.and_then(|out| parse(&out)) {
            Err(e) => (n.clone(), false, e),
            Ok(mut rep) => {
                // What the first round did to the mount belongs to the node's report.
                if let Some(m) = m.ok().and_then(|out| parse(&out).ok()) {
                    rep.absent &= m.absent;
                    rep.unmounted |= m.unmounted;
                    rep.lazy |= m.lazy;
                    rep.holders.extend(m.holders);
                    rep.stopped.splice(0..0, m.stopped);
                    rep.problems.extend(m.problems);
                }
                (n.clone(), rep.problems.is_empty(), describe_stop(&rep))
            }
        })
        .collect()
}

fn describe_stop(r: &node::StopReport) -> String {
    if r.absent {
        return "no such instance here (nothing to do)".into();
    }
    let mut parts = Vec::new();
    if r.lazy {
        parts.push(format!("mount busy (held by {}), detached lazily", r.holders.join(", ")));
    } else if r.unmounted {
        parts.push("unmounted".to_string());
    }
    if !r.stopped.is_empty() {
        parts.push(format!("stopped {}", r.stopped.join(", ")));
    }
    if !r.killed.is_empty() {
        parts.push(format!("killed {} (did not stop on SIGTERM)", r.killed.join(", ")));
    }
    if r.data_deleted {
        parts.push("data deleted".into());
    }
    parts.extend(r.problems.iter().map(|p| format!("PROBLEM: {p}")));
    if parts.is_empty() {
        "nothing was running".into()
    } else {
        parts.join("; ")
    }
}

pub fn stop(a: StopArgs) -> Result<()> {
    if a.local {
        let state = a.reach.state_dir();
        let rep = if a.mount_only {
            node::unmount_only(&state, &a.reach.name)
        } else {
            node::stop_local(&state, &a.reach.name, a.delete_data)
        };
        if a.json {
            println!("{}", serde_json::to_string(&rep)?);
        } else {
            println!("{}: {}", rep.node, describe_stop(&rep));
        }
        if !rep.problems.is_empty() && !a.json {
            bail!("{} could not be cleaned up completely", rep.node);
        }
        return Ok(());
    }
    let nodes = parse_nodes(&a.nodes.nodes, a.nodes.nodefile.as_deref())?;
    let t0 = Instant::now();
    let results = stop_nodes(&a.reach, &nodes, a.delete_data, Duration::from_secs(a.timeout));
    let failed: Vec<&str> = results.iter().filter(|r| !r.1).map(|r| r.0.as_str()).collect();
    if a.json {
        let v: Vec<serde_json::Value> = results
            .iter()
            .map(|(n, ok, what)| serde_json::json!({ "node": n, "cleaned_up": ok, "report": what }))
            .collect();
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        for (n, ok, what) in &results {
            println!("{n}: {}{what}", if *ok { "" } else { "NOT CLEANED UP: " });
        }
    }
    progress(
        t0,
        &format!("stopped instance {} on {} of {} nodes", a.reach.name, nodes.len() - failed.len(), nodes.len()),
    );
    if !failed.is_empty() {
        bail!("instance {} is not cleaned up on: {}", a.reach.name, failed.join(", "));
    }
    Ok(())
}

pub fn status(a: StatusArgs) -> Result<()> {
    let nodes = parse_nodes(&a.nodes.nodes, a.nodes.nodefile.as_deref())?;
    let ssh = a.reach.ssh();
    let cmd = a.reach.run_instance_bin(
        &format!(
            "ond node status --name {} --state-dir {}",
            sh_quote(&a.reach.name),
            sh_quote(&a.reach.state_dir().display().to_string())
        ),
        r#"{"known":false}"#,
    );
    let r = ssh.run_all(&nodes, Duration::from_secs(a.timeout), |_| (cmd.clone(), Vec::new()));
    let mut states: Vec<(String, Result<node::NodeStatus, String>)> = Vec::new();
    for (n, r) in nodes.iter().zip(r) {
        let st = r.and_then(|out| serde_json::from_str::<node::NodeStatus>(&out).map_err(|e| format!("{e}: {out}")));
        states.push((n.clone(), st));
    }
    let instance = states.iter().find_map(|(_, s)| s.as_ref().ok().and_then(|s| s.instance.clone()));
    if a.json {
        let nodes_v: Vec<serde_json::Value> = states
            .iter()
            .map(|(n, s)| match s {
                Ok(st) => {
                    let mut v = serde_json::to_value(st).unwrap_or_default();
                    if let Some(o) = v.as_object_mut() {
                        o.remove("instance");
                        o.insert("name".into(), serde_json::json!(n));
                        o.insert("reachable".into(), serde_json::json!(true));
                    }
                    v
                }
                Err(e) => serde_json::json!({ "name": n, "reachable": false, "error": e }),
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&serde_json::json!({ "instance": instance, "nodes": nodes_v }))?);
        return Ok(());
    }
    match &instance {
        Some(i) => println!(
            "instance {} ({}), mounted at {}, mgmtd {}, created {} s ago",
            i.name,
            i.fs_uuid,
            i.mount.display(),
            i.mgmtd,
            now_unix().saturating_sub(i.created_unix)
        ),
        None => println!("instance {}: not known on any reachable node", a.reach.name),
    }
    let mib = |k: u64| format!("{:.1}", k as f64 / 1024.0);
    let rows: Vec<Vec<String>> = states
        .iter()
        .map(|(n, s)| match s {
            Err(e) => vec![n.clone(), "unreachable".into(), "-".into(), "-".into(), "-".into(), e.replace('\n', " ")],
            Ok(st) if !st.known => {
                vec![n.clone(), "no instance".into(), "-".into(), "-".into(), "-".into(), String::new()]
            }
            Ok(st) => {
                let svc: Vec<String> = st
                    .services
                    .iter()
                    .map(|s| format!("{}{}", s.name, if s.running { "" } else { "(DOWN)" }))
                    .collect();
                vec![
                    n.clone(),
                    svc.join(","),
                    if st.mounted { "mounted".into() } else { "NOT MOUNTED".into() },
                    format!("{} (peak {})", mib(st.total_rss_kib), mib(st.total_peak_rss_kib)),
                    st.mem_available_kib.map(mib).unwrap_or_default(),
                    String::new(),
                ]
            }
        })
        .collect();
    print_table(&["NODE", "SERVICES", "MOUNT", "RSS MiB", "MEM FREE MiB", "ERROR"], &rows);
    Ok(())
}

/// `hivefs cp` on every node, each a part of the work, then the directories' attributes.
fn copy(a: OndCpArgs) -> Result<()> {
    let t0 = Instant::now();
    let nodes = parse_nodes(&a.nodes.nodes, a.nodes.nodefile.as_deref())?;
    let w = &a.what;
    for p in w.srcs.iter().chain([&w.dst]) {
        anyhow::ensure!(p.is_absolute(), "{} must be an absolute path (it is used on every node)", p.display());
    }
    let mut common = format!("--json --progress never --workers {} --range-size {}", w.workers, w.range_size);
    for (on, flag) in [(w.no_target_directory, "-T"), (w.update, "--update"), (w.no_xattrs, "--no-xattrs")] {
        if on {
            common.push(' ');
            common.push_str(flag);
        }
    }
    let paths: Vec<String> = w.srcs.iter().chain([&w.dst]).map(|p| sh_quote(&p.display().to_string())).collect();
    let paths = paths.join(" ");
    let bin = |args: String| {
        let pushed = node::state_of(&a.reach.state_dir(), &a.reach.name).join("hivefs");
        format!(
            "b={}; [ -x \"$b\" ] || b={}; exec \"$b\" {args}",
            sh_quote(&pushed.display().to_string()),
            sh_quote(&a.reach.remote_bin)
        )
    };
    let n = nodes.len();
    progress(t0, &format!("copying in {n} parts, one per node"));
    let ssh = a.reach.ssh();
    let limit = Duration::from_secs(a.timeout);
    let parts = ssh.run_all(&nodes, limit, |i| (bin(format!("cp --part {}/{n} {common} {paths}", i + 1)), Vec::new()));
    let mut summaries = Vec::new();
    let mut failed = Vec::new();
    for (node, r) in nodes.iter().zip(parts) {
        // A part with failed entries exits 1 but still prints its summary.
        let (out, err) = match r {
            Ok(out) => (out, None),
            Err(e) => (String::new(), Some(e)),
        };
        match serde_json::from_str::<serde_json::Value>(out.trim()) {
            Ok(v) => summaries.push((node.clone(), v)),
            Err(_) => failed.push(format!("node {node}: {}", err.unwrap_or_else(|| "no summary".into()))),
        }
    }
    if failed.len() == n {
        bail!("the copy failed on every node:\n  {}", failed.join("\n  "));
    }
    progress(t0, "setting the directories' attributes");
    let last =
        ssh.run(&nodes[0], &bin(format!("cp --dir-attrs-only {common} {paths}").replace(" --update", "")), &[], limit);
    if let Err(e) = &last {
        failed.push(format!("node {}: setting the directories' attributes: {e}", nodes[0]));
    }
    let sum = |k: &str| summaries.iter().map(|(_, v)| v[k].as_u64().unwrap_or(0)).sum::<u64>();
    let elapsed = t0.elapsed().as_secs_f64();
    let keys =
        ["files", "symlinks", "hard_links", "specials", "bytes", "hole_bytes", "skipped", "skipped_bytes", "errors"];
    let mut total: serde_json::Map<String, serde_json::Value> =
        keys.iter().map(|k| (k.to_string(), serde_json::json!(sum(k)))).collect();
    total.insert("elapsed_s".into(), serde_json::json!(elapsed));
    total.insert("bytes_per_s".into(), serde_json::json!(sum("bytes") as f64 / elapsed.max(1e-9)));
    let errors = sum("errors");
    if a.json {
        let per: Vec<serde_json::Value> =
            summaries.iter().map(|(n, v)| serde_json::json!({ "node": n, "summary": v })).collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({ "nodes": per, "total": total, "failed": failed }))?
        );
    } else {
        for (node, v) in &summaries {
            println!(
                "{node}: {} files, {} in {:.1} s, {} errors",
                v["files"],
                human(v["bytes"].as_u64().unwrap_or(0)),
                v["elapsed_s"].as_f64().unwrap_or(0.0),
                v["errors"]
            );
            for f in v["failures"].as_array().into_iter().flatten() {
                eprintln!("{node}: {}: {}: {}", f["path"], f["op"], f["error"]);
            }
        }
        println!(
            "copied {} files, {} ({}/s) on {n} nodes in {elapsed:.1} s; {} skipped, {errors} errors",
            sum("files"),
            human(sum("bytes")),
            human((sum("bytes") as f64 / elapsed.max(1e-9)) as u64),
            sum("skipped")
        );
    }
    if !failed.is_empty() || errors > 0 {
        bail!(
            "the copy is incomplete:{}{}",
            if failed.is_empty() { String::new() } else { format!("\n  {}", failed.join("\n  ")) },
            if errors > 0 { format!("\n  {errors} entries failed") } else { String::new() }
        );
    }
    Ok(())
}

fn node_phase(a: NodeArgs) -> Result<()> {
    let state_dir = a.state_dir.clone().unwrap_or_else(default_state_dir);
    let out = match a.phase {
        Phase::Status => serde_json::to_value(node::status(&state_dir, &a.name))?,
        Phase::Logs => serde_json::json!({ "logs": node::logs(&state_dir, &a.name) }),
        phase => {
            let job = node::read_job()?;
            anyhow::ensure!(job.index < job.instance.nodes.len(), "node index {} out of range", job.index);
            match phase {
                Phase::Check => serde_json::to_value(node::check(&job))?,
                Phase::Mgmtd => node::phase_mgmtd(&job)?,
                Phase::Servers => node::phase_servers(&job)?,
                Phase::Setup => node::phase_setup(&job)?,
                Phase::Mount => node::phase_mount(&job)?,
                Phase::Status | Phase::Logs => unreachable!("handled above"),
            }
        }
    };
    println!("{}", serde_json::to_string(&out)?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_parse_and_are_checked() {
        let s = parse_sets(&["meta.sync=false".into(), "storage.heartbeat_interval_ms=500".into()]).unwrap();
        assert_eq!(s["meta"]["sync"], toml::Value::Boolean(false));
        assert_eq!(s["storage"]["heartbeat_interval_ms"], toml::Value::Integer(500));
        assert!(parse_sets(&["disk.x=1".into()]).unwrap_err().to_string().contains("unknown service"));
        assert!(parse_sets(&["meta=1".into()]).is_err());
        let mut inst = sample();
        inst.settings = parse_sets(&["meta.no_such_key=1".into()]).unwrap();
        let e = effective(&inst).unwrap_err().to_string();
        assert!(e.contains("no_such_key"), "{e}");
        inst.settings = parse_sets(&["meta.sync=false".into()]).unwrap();
        let eff = effective(&inst).unwrap();
        assert_eq!(eff["meta@n1"]["sync"], serde_json::json!(false));
        assert_eq!(eff["storage@n2"]["listen"], serde_json::json!("10.0.0.2:18002"));
        assert!(!eff.contains_key("meta@n2"));
    }

    fn sample() -> Instance {
        let mut inst = Instance {
            name: "t".into(),
            fs_uuid: "u".into(),
            created_unix: 0,
            started_unix: 0,
            hivefs_version: "0".into(),
            nodes: Vec::new(),
            meta: 1,
            mgmtd: "10.0.0.1:18000".into(),
            port_base: 18000,
            data: vec!["/d".into()],
            mount: "/m".into(),
            state_dir: "/s".into(),
            root_pattern: RootPattern {
                chunk_size: 1 << 19,
                stripe: 0,
                chooser: "balanced".into(),
                meta_chooser: None,
                mirror: false,
            },
            cache_mode: "native".into(),
            atime: "noatime".into(),
            settings: BTreeMap::new(),
            effective: BTreeMap::new(),
        };
        for (n, a) in [("n1", "10.0.0.1"), ("n2", "10.0.0.2")] {
            inst.nodes.push(NodeEntry { name: n.into(), addr: Some(a.into()), services: Vec::new() });
        }
        inst
    }

    #[test]
    fn roles_follow_the_node_order() {
        let inst = sample();
        let names = |i| node::roles(&inst, i).iter().map(|r| r.0).collect::<Vec<_>>();
        assert_eq!(names(0), ["mgmtd", "meta", "storage"]);
        assert_eq!(names(1), ["storage"]);
    }

    #[test]
    fn a_data_dir_of_another_file_system_is_not_reused() {
        let inst = sample();
        let mut other = sample();
        other.fs_uuid = "v".into();
        let rep = |p: Option<Instance>| node::CheckReport { existing: p, ..Default::default() };
        assert!(reuse(&inst, &[rep(None), rep(None)]).unwrap().is_none());
        assert_eq!(reuse(&inst, &[rep(Some(inst.clone())), rep(Some(inst.clone()))]).unwrap().unwrap().fs_uuid, "u");
        let e = reuse(&inst, &[rep(Some(inst.clone())), rep(Some(other))]).unwrap_err().to_string();
        assert!(e.contains("holds file system v"), "{e}");
        let e = reuse(&inst, &[rep(Some(inst.clone())), rep(None)]).unwrap_err().to_string();
        assert!(e.contains("empty"), "{e}");
    }
}
