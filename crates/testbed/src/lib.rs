//! Multi-host test beds on one machine: every "host" is a Linux network namespace.
//!
//! # What a test bed owns
//!
//! - A **switch** namespace (`hfs<ID>_sw`) holding a Linux bridge `br0`.
//! - One namespace per **host** (`hfs<ID>-<host>`), joined to the bridge by a veth pair:
//!   `eth0` inside the host, `vh<N>` on the bridge. Each host has loopback up and one IPv4
//!   address in the test bed's own `/24`, `10.231.<ID>.0/24` (host N gets `.N`). The ID
//!   (0–255) is claimed atomically in `/run/hivefs-testbed/.subnet-<ID>`, so test beds of
//!   several threads and processes coexist, each with a different subnet. Interfaces are
//!   created directly inside their namespaces, so no name ever appears in the root
//!   namespace and every interface name stays within 15 characters.
//! - **Link control** on a host's veth, applied to both ends (both directions):
//!   [`Testbed::shape`] (tc `tbf` rate limit), [`Testbed::unshape`], [`Testbed::cut`]
//!   (both ends set down: packets to and from the host are lost) and [`Testbed::heal`].
//!   [`Testbed::loss`] drops a share of the host's packets with an nftables
//!   `numgen random` rule inside the host's namespace (needs `nft`). [`Testbed::delay`]
//!   needs the `netem` qdisc; kernels without it get a clear error, as does `loss`
//!   without `nft`.
//! - **Processes** started with [`Testbed::spawn`], and **mounts** under directories given
//!   to [`Testbed::watch_mounts`].
//! - **Cleanup**: dropping a test bed made by [`Testbed::new`] detaches (lazily) every
//!   mount under the watched directories, stops the spawned processes (SIGTERM, then
//!   SIGKILL), stops whatever else still runs in its namespaces and deletes them (which
//!   deletes the veths and the bridge). [`sweep_stale`] (called by [`Testbed::new`]) does
//!   the same for test beds whose creating process is dead, found through their state files
//!   `/run/hivefs-testbed/<NAME>` (owner pid and start time) and the `hfs` prefix of
//!   their namespace names, so a crashed run leaves nothing behind after the next one.
//!
//! # What it must not do
//!
//! It knows nothing of HiveFS services: which programs run on which host, their ports,
//! configs and readiness are the business of the tests that use it.
//!
//! # Processes and mounts inside a host
//!
//! [`Host::command`] enters only the host's **network** namespace (`nsenter --net`),
//! unlike `ip netns exec`, which also gives the program a private mount namespace (to
//! remount `/sys`). That matters for FUSE: a file system mounted under `ip netns exec`
//! lands in that private mount namespace and is invisible to everyone else (reachable only
//! through `/proc/<pid>/root/...` while the mounting process lives). Mounted from a
//! [`Host::command`], it lands in the caller's mount namespace: the test reads and writes
//! it at its path with ordinary system calls, while the file system's own traffic leaves
//! through the host's `eth0`. `/sys` keeps showing the root namespace's interfaces.
//!
//! A hazard for tests that use such mounts: a process spawned while the spawner holds a
//! file of a FUSE mount open inherits the descriptor, its exec closes that copy, and the
//! kernel turns the close into a FUSE FLUSH request. If the file system answers FLUSH only
//! after reaching the file's servers, a cut link stalls every spawn of that program (seen:
//! 3 s each, the file system's I/O timeout). Run I/O expected to block in child processes, not
//! in threads of the program that also spawns commands.
//!
//! Needs root (network and mount namespaces, tc). By-hand use: the `hivefs-testbed` binary.

#![forbid(unsafe_code)]

use anyhow::{anyhow, bail, Context, Result};
use rustix::mount::{unmount, UnmountFlags};
use rustix::process::{geteuid, kill_process, Pid, Signal};
use std::ffi::OsStr;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

/// Every namespace of every test bed starts with this prefix.
pub const PREFIX: &str = "hfs";
/// State files: `<NAME>` per test bed, `.subnet-<ID>` claims.
pub const STATE_DIR: &str = "/run/hivefs-testbed";
const NETNS_DIR: &str = "/run/netns";
/// Name of a host's interface inside its namespace.
pub const HOST_IF: &str = "eth0";
const BRIDGE: &str = "br0";
const NFT_TABLE: &str = "hivefs_testbed";
/// A claim without a state file is a creation in progress for at most this long.
const CLAIM_GRACE: Duration = Duration::from_secs(60);

/// One host of a test bed: a network namespace with one address on the bed's bridge.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Host {
    /// Name given to [`Testbed::add_host`].
    pub name: String,
    /// Name of its network namespace (`ip netns list`).
    pub netns: String,
    /// Its address on the test bed's `/24`.
    pub ip: Ipv4Addr,
    index: u8,
    switch_ns: String,
    /// Set by [`Testbed::isolate`]: the process holding the host's own mount and UTS
    /// namespaces.
    anchor: Option<u32>,
}

impl Host {
    /// A command that runs `program` inside this host's network namespace (and in the
    /// caller's mount namespace; see the crate documentation), through
    /// `nsenter --net=/run/netns/<netns> -- program` (nsenter execs it: same pid).
    /// On an isolated host ([`Testbed::isolate`]) it also enters the host's own mount
    /// and UTS namespaces: `nsenter --target <anchor> --net --mount --uts -- program`.
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        let mut cmd = Command::new("nsenter");
        match self.anchor {
            Some(pid) => {
                cmd.args(["--target", &pid.to_string(), "--net", "--mount", "--uts"]);
            }
            None => {
                cmd.arg(format!("--net={NETNS_DIR}/{}", self.netns));
            }
        }
        cmd.arg("--").arg(program);
        cmd
    }

    /// Whether the host has mount and UTS namespaces of its own ([`Testbed::isolate`]).
    pub fn isolated(&self) -> bool {
        self.anchor.is_some()
    }

    /// `ip:port` of this host.
    pub fn addr(&self, port: u16) -> String {
        format!("{}:{port}", self.ip)
    }

    /// The bridge end of this host's veth pair (in the switch namespace).
    fn switch_if(&self) -> String {
        format!("vh{}", self.index)
    }
}

/// A set of hosts (network namespaces) on one bridge. See the crate documentation.
pub struct Testbed {
    name: String,
    id: u8,
    /// Dropping destroys the test bed (made by [`Testbed::new`]).
    owned: bool,
    owner: Option<(u32, u64)>,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    hosts: Vec<Host>,
    mount_dirs: Vec<PathBuf>,
    children: Vec<(String, Child)>,
}

/// What `hivefs-testbed list` shows of one test bed.
#[derive(Debug, Clone)]
pub struct Summary {
    pub name: String,
    pub subnet: String,
    /// `None` for a test bed made by hand (it lives until `destroy`).
    pub owner_pid: Option<u32>,
    pub owner_alive: bool,
    pub hosts: Vec<Host>,
}

impl Testbed {
    /// A new test bed owned by this process, destroyed on drop. `tag` (lowercase letters,
    /// digits, `-`, at most 24) names it for humans: its name is `<tag>-<ID>`. Removes
    /// the leftovers of dead processes first ([`sweep_stale`]).
    pub fn new(tag: &str) -> Result<Testbed> {
        check_label("test bed tag", tag, 24)?;
        need_root()?;
        sweep_stale().context("cannot sweep stale test beds")?;
        let me = (std::process::id(), process_start_time(std::process::id()).context("own start time")?);
        Self::create_inner(|id| format!("{tag}-{id}"), Some(me))
    }

    /// A test bed made by hand (`hivefs-testbed create`): it has no owner process and
    /// lives until [`Testbed::destroy`].
    pub fn create(name: &str) -> Result<Testbed> {
        check_label("test bed name", name, 32)?;
        need_root()?;
        Self::create_inner(|_| name.to_string(), None)
    }

    /// A test bed recorded as owned by process `pid` (which must be alive now); it is
    /// stale, and swept, once that process is gone.
    pub fn create_owned_by(name: &str, pid: u32) -> Result<Testbed> {
        check_label("test bed name", name, 32)?;
        need_root()?;
        let start = process_start_time(pid).with_context(|| format!("process {pid} is not running"))?;
        Self::create_inner(|_| name.to_string(), Some((pid, start)))
    }

    fn create_inner(name_of: impl Fn(u8) -> String, owner: Option<(u32, u64)>) -> Result<Testbed> {
        std::fs::create_dir_all(STATE_DIR).with_context(|| format!("cannot create {STATE_DIR}"))?;
        let id = claim_subnet()?;
        let name = name_of(id);
        let tb = Testbed { name, id, owned: owner.is_some(), owner, inner: Mutex::new(Inner::default()) };
        let state = state_path(&tb.name);
        let created = std::fs::OpenOptions::new().write(true).create_new(true).open(&state);
        if let Err(e) = created {
            let _ = std::fs::remove_file(claim_path(id));
            // Nothing to destroy: keep Drop away from the other test bed's state.
            std::mem::forget(tb);
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                bail!("a test bed named {:?} exists already ({})", name_of(id), state.display());
            }
            return Err(anyhow!("cannot create {}: {e}", state.display()));
        }
        if let Err(e) = tb.save_state().and_then(|()| tb.add_switch()) {
            let _ = tb.destroy();
            return Err(e);
        }
        Ok(tb)
    }

    fn add_switch(&self) -> Result<()> {
        let sw = self.switch_ns();
        ip(&["netns", "add", &sw])?;
        ip(&["-n", &sw, "link", "set", "lo", "up"])?;
        ip(&["-n", &sw, "link", "add", BRIDGE, "type", "bridge"])?;
        ip(&["-n", &sw, "link", "set", BRIDGE, "up"])?;
        Ok(())
    }

    /// Opens a test bed recorded in `/run/hivefs-testbed/<name>` (without owning it).
    pub fn open(name: &str) -> Result<Testbed> {
        let st = read_state(name)?;
        let hosts = st.hosts.iter().map(|(h, i)| make_host(st.id, h, *i)).collect();
        Ok(Testbed {
            name: name.to_string(),
            id: st.id,
            owned: false,
            owner: st.owner,
            inner: Mutex::new(Inner { hosts, mount_dirs: st.mount_dirs, children: Vec::new() }),
        })
    }

    /// Names of all recorded test beds.
    pub fn names() -> Result<Vec<String>> {
        let mut v = Vec::new();
        let rd = match std::fs::read_dir(STATE_DIR) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(v),
            Err(e) => return Err(anyhow!("cannot read {STATE_DIR}: {e}")),
        };
        for e in rd.flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            if !n.starts_with('.') && !n.ends_with(".tmp") {
                v.push(n);
            }
        }
        v.sort();
        Ok(v)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The test bed's `/24`, e.g. `10.231.7.0/24`.
    pub fn subnet(&self) -> String {
        format!("10.231.{}.0/24", self.id)
    }

    pub fn hosts(&self) -> Vec<Host> {
        self.lock().hosts.clone()
    }

    /// The host called `name`.
    pub fn host(&self, name: &str) -> Result<Host> {
        self.lock()
            .hosts
            .iter()
            .find(|h| h.name == name)
            .cloned()
            .ok_or_else(|| anyhow!("test bed {} has no host {name:?}", self.name))
    }

    pub fn summary(&self) -> Summary {
        Summary {
            name: self.name.clone(),
            subnet: self.subnet(),
            owner_pid: self.owner.map(|o| o.0),
            owner_alive: self.owner.is_some_and(|(p, s)| process_start_time(p).ok() == Some(s)),
            hosts: self.hosts(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn switch_ns(&self) -> String {
        format!("{PREFIX}{}_sw", self.id)
    }

    /// Adds a host (lowercase letters, digits, `-`, at most 32): a namespace on the
    /// bridge with the next address of the subnet and loopback up.
    pub fn add_host(&self, name: &str) -> Result<Host> {
        check_label("host name", name, 32)?;
        let index = {
            let inner = self.lock();
            if inner.hosts.iter().any(|h| h.name == name) {
                bail!("test bed {} has a host {name:?} already", self.name);
            }
            let i = inner.hosts.iter().map(|h| h.index).max().unwrap_or(0);
            if i >= 254 {
                bail!("test bed {} is full (254 hosts)", self.name);
            }
            i + 1
        };
        let h = make_host(self.id, name, index);
        // Record first, so cleanup finds the namespace even if a step below fails.
        self.lock().hosts.push(h.clone());
        self.save_state()?;
        let sw = self.switch_ns();
        let sif = h.switch_if();
        ip(&["netns", "add", &h.netns])?;
        ip(&["-n", &h.netns, "link", "set", "lo", "up"])?;
        ip(&["link", "add", HOST_IF, "netns", &h.netns, "type", "veth", "peer", "name", &sif, "netns", &sw])?;
        ip(&["-n", &sw, "link", "set", &sif, "master", BRIDGE])?;
        ip(&["-n", &sw, "link", "set", &sif, "up"])?;
        ip(&["-n", &h.netns, "addr", "add", &format!("{}/24", h.ip), "dev", HOST_IF])?;
        ip(&["-n", &h.netns, "link", "set", HOST_IF, "up"])?;
        Ok(h)
    }

    /// Makes `host` a machine of its own as far as files go: a private mount namespace and
    /// UTS namespace (its hostname is its name), held by an anchor process (`sleep`)
    /// started inside its network namespace, with each `(source, target)` of `binds`
    /// bind-mounted (`target` must exist: a directory, or a file such as `/etc/hosts`).
    /// Every later [`Host::command`] of the returned host (and of [`Testbed::host`]) runs
    /// in those namespaces, so the host's FUSE mounts, and what it writes under the bind
    /// targets, are its own; the rest of the file system is shared. The namespaces go
    /// away with the host's last process, when the test bed is destroyed. Isolation is
    /// not recorded in the state file: a test bed opened by another process
    /// ([`Testbed::open`]) sees its hosts as plain ones.
    pub fn isolate(&self, host: &Host, binds: &[(PathBuf, PathBuf)]) -> Result<Host> {
        if host.anchor.is_some() {
            bail!("host {} is isolated already", host.name);
        }
        // Positional arguments, so no path is ever parsed by the shell.
        let script = r#"hostname "$1" || exit 1; shift
            while [ $# -gt 0 ]; do mount --bind "$1" "$2" || exit 1; shift 2; done
            echo ready; exec sleep infinity"#;
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net={NETNS_DIR}/{}", host.netns))
            .args(["--", "unshare", "--mount", "--uts", "--propagation", "private", "--", "sh", "-c", script, "sh"])
            .arg(&host.name);
        for (src, dst) in binds {
            cmd.arg(src).arg(dst);
        }
        cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let label = format!("anchor of host {}", host.name);
        let mut child = cmd.spawn().with_context(|| format!("cannot start the {label} (nsenter, unshare)"))?;
        let pid = child.id();
        let stdout = child.stdout.take().expect("piped");
        let stderr = child.stderr.take().expect("piped");
        self.lock().children.push((label.clone(), child));
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line);
            let _ = tx.send(line);
        });
        let ready = rx.recv_timeout(Duration::from_secs(10)).unwrap_or_default();
        if ready.trim() != "ready" {
            // Stopped first: its stderr then ends, and reading it cannot block.
            let _ = self.stop(pid, Duration::from_secs(1));
            let mut err = String::new();
            let _ = std::io::Read::read_to_string(&mut { stderr }, &mut err);
            bail!("cannot isolate host {}: {}", host.name, err.trim());
        }
        let mut h = host.clone();
        h.anchor = Some(pid);
        if let Some(slot) = self.lock().hosts.iter_mut().find(|x| x.name == host.name) {
            slot.anchor = Some(pid);
        }
        Ok(h)
    }

    /// Starts `cmd` (usually from [`Host::command`]) and keeps it: it is stopped when the
    /// test bed is dropped, if still running. `label` names it in errors. Returns its pid.
    pub fn spawn(&self, label: &str, mut cmd: Command) -> Result<u32> {
        let child = cmd.spawn().with_context(|| format!("cannot start {label} ({:?})", cmd.get_program()))?;
        let pid = child.id();
        self.lock().children.push((label.to_string(), child));
        Ok(pid)
    }

    /// Stops a process started by [`Testbed::spawn`]: SIGTERM, then SIGKILL after `grace`.
    pub fn stop(&self, pid: u32, grace: Duration) -> Result<()> {
        let child = {
            let mut inner = self.lock();
            let i = inner
                .children
                .iter()
                .position(|(_, c)| c.id() == pid)
                .ok_or_else(|| anyhow!("process {pid} was not started by test bed {}", self.name))?;
            inner.children.remove(i)
        };
        stop_children(vec![child], grace);
        Ok(())
    }

    /// Whether a process started by [`Testbed::spawn`] is still running.
    pub fn running(&self, pid: u32) -> bool {
        self.lock().children.iter_mut().any(|(_, c)| c.id() == pid && matches!(c.try_wait(), Ok(None)))
    }

    /// Mounts under `dir` (e.g. FUSE mounts of the hosts) are detached at cleanup.
    pub fn watch_mounts(&self, dir: &Path) -> Result<()> {
        let d = std::path::absolute(dir).with_context(|| format!("{}", dir.display()))?;
        self.lock().mount_dirs.push(d);
        self.save_state()
    }

    /// Limits the host's link to `rate_bits_per_s` in both directions (tc `tbf` on both
    /// ends of its veth pair), replacing an earlier shape.
    pub fn shape(&self, host: &Host, rate_bits_per_s: u64) -> Result<()> {
        if rate_bits_per_s < 8_000 {
            bail!("rate {rate_bits_per_s} bit/s for host {} is too low (at least 8kbit)", host.name);
        }
        // A burst of 20 ms at the rate, at least 64 KiB so that one GSO packet fits.
        let burst = (rate_bits_per_s / 8 / 50).max(64 * 1024);
        for (ns, dev) in self.link_ends(host) {
            tc(&[
                "-n",
                &ns,
                "qdisc",
                "replace",
                "dev",
                &dev,
                "root",
                "tbf",
                "rate",
                &format!("{rate_bits_per_s}bit"),
                "burst",
                &burst.to_string(),
                "latency",
                "100ms",
            ])?;
        }
        Ok(())
    }

    /// Removes a shape or delay from the host's link (no error if there is none).
    pub fn unshape(&self, host: &Host) -> Result<()> {
        for (ns, dev) in self.link_ends(host) {
            let out = tc_qdisc_show(&ns, &dev)?;
            if out.contains(" root ") && !out.contains("noqueue") {
                tc(&["-n", &ns, "qdisc", "del", "dev", &dev, "root"])?;
            }
        }
        Ok(())
    }

    /// Cuts the host off: both ends of its veth pair go down, so nothing passes either way
    /// (local sends fail at once with "network unreachable"; peers' packets are lost).
    pub fn cut(&self, host: &Host) -> Result<()> {
        for (ns, dev) in self.link_ends(host) {
            ip(&["-n", &ns, "link", "set", &dev, "down"])?;
        }
        Ok(())
    }

    /// Undoes [`Testbed::cut`].
    pub fn heal(&self, host: &Host) -> Result<()> {
        for (ns, dev) in self.link_ends(host) {
            ip(&["-n", &ns, "link", "set", &dev, "up"])?;
        }
        Ok(())
    }

    /// Drops `percent` % of the host's packets on its link (not loopback), in and out, at random (an nftables
    /// `numgen random` rule in the host's namespace); 0 removes the rule. Needs `nft`.
    pub fn loss(&self, host: &Host, percent: u8) -> Result<()> {
        if percent > 100 {
            bail!("loss of {percent}% for host {}: give 0 to 100", host.name);
        }
        if !program_exists("nft") {
            bail!(
                "packet loss on host {} needs the netem qdisc (not in this kernel) or nftables: \
                 `nft` is not installed (apt-get install nftables)",
                host.name
            );
        }
        let ns = &host.netns;
        // No table yet is fine: the delete then fails and changes nothing.
        let _ = host.command("nft").args(["delete", "table", "inet", NFT_TABLE]).output();
        if percent == 0 {
            return Ok(());
        }
        let rule = if percent == 100 { "drop".to_string() } else { format!("numgen random mod 100 < {percent} drop") };
        let rules = format!(
            "table inet {NFT_TABLE} {{\n\
             chain input {{ type filter hook input priority 0; policy accept; iifname {HOST_IF} {rule}; }}\n\
             chain output {{ type filter hook output priority 0; policy accept; oifname {HOST_IF} {rule}; }}\n\
             }}\n"
        );
        let mut child = host
            .command("nft")
            .args(["-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("cannot run nft")?;
        use std::io::Write;
        child.stdin.take().expect("piped").write_all(rules.as_bytes())?;
        let out = child.wait_with_output()?;
        if !out.status.success() {
            bail!(
                "nft could not add a {percent}% loss rule on host {} (namespace {ns}): {}",
                host.name,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(())
    }

    /// Delays the host's packets by `ms` in both directions with the `netem` qdisc
    /// (replacing a shape). Kernels without netem (like the one HiveFS's CI runs on) get
    /// an error saying so; delay has no nftables fallback.
    pub fn delay(&self, host: &Host, ms: u32) -> Result<()> {
        for (ns, dev) in self.link_ends(host) {
            let r = tc(&["-n", &ns, "qdisc", "replace", "dev", &dev, "root", "netem", "delay", &format!("{ms}ms")]);
            if let Err(e) = r {
                bail!(
                    "delay on host {} needs the netem qdisc, which this kernel does not provide \
                     (only rate shaping with tbf, cut/heal and, with nftables, packet loss work): {e:#}",
                    host.name
                );
            }
        }
        Ok(())
    }

    /// Both ends of the host's veth pair: (namespace, device).
    fn link_ends(&self, host: &Host) -> [(String, String); 2] {
        [(host.netns.clone(), HOST_IF.to_string()), (host.switch_ns.clone(), host.switch_if())]
    }

    fn save_state(&self) -> Result<()> {
        let inner = self.lock();
        let mut s = format!("id {}\n", self.id);
        match self.owner {
            Some((pid, start)) => s.push_str(&format!("owner {pid} {start}\n")),
            None => s.push_str("owner none\n"),
        }
        for h in &inner.hosts {
            s.push_str(&format!("host {} {}\n", h.name, h.index));
        }
        for d in &inner.mount_dirs {
            s.push_str(&format!("mounts {}\n", d.display()));
        }
        drop(inner);
        let p = state_path(&self.name);
        let tmp = PathBuf::from(format!("{}.{}.tmp", p.display(), std::process::id()));
        std::fs::write(&tmp, s).with_context(|| format!("cannot write {}", tmp.display()))?;
        std::fs::rename(&tmp, &p).with_context(|| format!("cannot write {}", p.display()))
    }

    /// Stops everything and removes the test bed (also one made by hand or opened).
    pub fn destroy(mut self) -> Result<()> {
        let r = self.teardown();
        self.owned = false;
        r
    }

    fn teardown(&mut self) -> Result<()> {
        let (dirs, children) = {
            let mut inner = self.lock();
            (inner.mount_dirs.clone(), std::mem::take(&mut inner.children))
        };
        // Detach mounts first: a mount whose server is stopped first would hang its users.
        detach_mounts_under(&dirs);
        stop_children(children, Duration::from_secs(5));
        let r = remove_namespaces(self.id);
        let _ = std::fs::remove_file(state_path(&self.name));
        let _ = std::fs::remove_file(claim_path(self.id));
        r
    }
}

impl Drop for Testbed {
    fn drop(&mut self) {
        if self.owned {
            if let Err(e) = self.teardown() {
                eprintln!("hivefs-testbed: cleanup of test bed {} incomplete: {e:#}", self.name);
            }
        }
    }
}

/// Removes every test bed whose owner process is dead (its mounts, processes,
/// namespaces and state), and namespaces with the test bed prefix that no live test bed
/// claims. Returns the names removed.
pub fn sweep_stale() -> Result<Vec<String>> {
    let mut removed = Vec::new();
    for name in Testbed::names()? {
        let Ok(st) = read_state(&name) else { continue };
        let Some((pid, start)) = st.owner else { continue };
        if process_start_time(pid).ok() == Some(start) {
            continue;
        }
        // Claim the removal: only one sweeper gets to rename the state file.
        let p = state_path(&name);
        let mine = PathBuf::from(format!("{}.{}.sweep.tmp", p.display(), std::process::id()));
        if std::fs::rename(&p, &mine).is_err() {
            continue;
        }
        detach_mounts_under(&st.mount_dirs);
        remove_namespaces(st.id)?;
        let _ = std::fs::remove_file(&mine);
        let _ = std::fs::remove_file(claim_path(st.id));
        removed.push(name);
    }
    // Claims without a state file (a creation that crashed) and namespaces nobody claims.
    let live: Vec<(String, u8)> =
        Testbed::names()?.into_iter().filter_map(|n| read_state(&n).ok().map(|s| (n, s.id))).collect();
    if let Ok(rd) = std::fs::read_dir(STATE_DIR) {
        for e in rd.flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            let Some(id) = n.strip_prefix(".subnet-").and_then(|s| s.parse::<u8>().ok()) else { continue };
            let old = e
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| SystemTime::now().duration_since(t).ok())
                .is_some_and(|age| age > CLAIM_GRACE);
            if old && !live.iter().any(|(_, i)| *i == id) {
                remove_namespaces(id)?;
                let _ = std::fs::remove_file(e.path());
                removed.push(format!("(unfinished test bed {id})"));
            }
        }
    }
    for ns in namespaces()? {
        if let Some(id) = id_of_namespace(&ns) {
            if !claim_path(id).exists() {
                kill_namespace_processes(&ns);
                ip(&["netns", "del", &ns])?;
                removed.push(ns);
            }
        }
    }
    Ok(removed)
}

/// Parses a rate like `100mbit`, `1gbit`, `512kbit`, `10mbps` (bytes), `250000` (bit/s).
pub fn parse_rate(s: &str) -> Result<u64> {
    let t = s.trim().to_ascii_lowercase();
    let split = t.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num.parse().map_err(|_| anyhow!("invalid rate {s:?}: e.g. 100mbit, 1gbit, 10mbps"))?;
    let mult = match unit {
        "" | "bit" => 1.0,
        "kbit" => 1e3,
        "mbit" => 1e6,
        "gbit" => 1e9,
        "bps" => 8.0,
        "kbps" => 8e3,
        "mbps" => 8e6,
        "gbps" => 8e9,
        _ => bail!("invalid rate unit in {s:?}: use bit, kbit, mbit, gbit (or bps, kbps, mbps, gbps for bytes)"),
    };
    Ok((n * mult) as u64)
}

// ---- state ----

struct State {
    id: u8,
    owner: Option<(u32, u64)>,
    hosts: Vec<(String, u8)>,
    mount_dirs: Vec<PathBuf>,
}

fn state_path(name: &str) -> PathBuf {
    Path::new(STATE_DIR).join(name)
}

fn claim_path(id: u8) -> PathBuf {
    Path::new(STATE_DIR).join(format!(".subnet-{id}"))
}

fn read_state(name: &str) -> Result<State> {
    let p = state_path(name);
    let s =
        std::fs::read_to_string(&p).with_context(|| format!("no test bed {name:?} (cannot read {})", p.display()))?;
    let bad = |l: &str| anyhow!("{}: bad line {l:?}", p.display());
    let mut st = State { id: 0, owner: None, hosts: Vec::new(), mount_dirs: Vec::new() };
    let mut have_id = false;
    for l in s.lines() {
        let (k, v) = l.split_once(' ').ok_or_else(|| bad(l))?;
        match k {
            "id" => {
                st.id = v.parse().map_err(|_| bad(l))?;
                have_id = true;
            }
            "owner" if v == "none" => st.owner = None,
            "owner" => {
                let (a, b) = v.split_once(' ').ok_or_else(|| bad(l))?;
                st.owner = Some((a.parse().map_err(|_| bad(l))?, b.parse().map_err(|_| bad(l))?));
            }
            "host" => {
                let (a, b) = v.split_once(' ').ok_or_else(|| bad(l))?;
                st.hosts.push((a.to_string(), b.parse().map_err(|_| bad(l))?));
            }
            "mounts" => st.mount_dirs.push(PathBuf::from(v)),
            _ => return Err(bad(l)),
        }
    }
    if !have_id {
        bail!("{}: no id line", p.display());
    }
    Ok(st)
}

fn make_host(id: u8, name: &str, index: u8) -> Host {
    Host {
        name: name.to_string(),
        netns: format!("{PREFIX}{id}-{name}"),
        ip: Ipv4Addr::new(10, 231, id, index),
        index,
        switch_ns: format!("{PREFIX}{id}_sw"),
        anchor: None,
    }
}

/// Claims a free subnet id: hard-linking a file to `.subnet-<ID>` fails if it exists,
/// which makes the claim atomic across processes.
fn claim_subnet() -> Result<u8> {
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = Path::new(STATE_DIR).join(format!(".claim-{}-{seq}.tmp", std::process::id()));
    std::fs::write(&tmp, format!("{}\n", std::process::id()))
        .with_context(|| format!("cannot write {}", tmp.display()))?;
    // Spread the starting points (per process and per call) so that an id just freed is
    // not handed out again at once: a sweeper that saw the old test bed's namespaces
    // must not mistake the new one's for them.
    let start = (std::process::id() as usize).wrapping_mul(7).wrapping_add(seq as usize * 37) % 256;
    let mut r = Err(anyhow!("all 256 test bed subnets are in use (see `hivefs-testbed list`)"));
    for k in 0..256 {
        let id = ((start + k) % 256) as u8;
        match std::fs::hard_link(&tmp, claim_path(id)) {
            Ok(()) => {
                r = Ok(id);
                break;
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => {
                r = Err(anyhow!("cannot claim {}: {e}", claim_path(id).display()));
                break;
            }
        }
    }
    let _ = std::fs::remove_file(&tmp);
    r
}

// ---- namespaces, processes, mounts ----

fn namespaces() -> Result<Vec<String>> {
    match std::fs::read_dir(NETNS_DIR) {
        Ok(rd) => Ok(rd.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(anyhow!("cannot read {NETNS_DIR}: {e}")),
    }
}

/// `hfs<ID>-host` or `hfs<ID>_sw` → ID.
fn id_of_namespace(ns: &str) -> Option<u8> {
    let rest = ns.strip_prefix(PREFIX)?;
    let end = rest.find(['-', '_'])?;
    rest[..end].parse().ok()
}

fn remove_namespaces(id: u8) -> Result<()> {
    let mine: Vec<String> = namespaces()?.into_iter().filter(|n| id_of_namespace(n) == Some(id)).collect();
    for ns in &mine {
        kill_namespace_processes(ns);
    }
    let mut errors = Vec::new();
    for ns in &mine {
        if let Err(e) = ip(&["netns", "del", ns]) {
            errors.push(format!("{e:#}"));
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        bail!("cannot delete namespaces of test bed {id}: {}", errors.join("; "))
    }
}

/// Stops every process in a namespace: SIGTERM (so that they can clean up), SIGKILL
/// after 2 s, and waits (up to 5 s more) until they are gone.
fn kill_namespace_processes(ns: &str) {
    let Ok(out) = Command::new("ip").args(["netns", "pids", ns]).output() else { return };
    let pids: Vec<i32> =
        String::from_utf8_lossy(&out.stdout).split_whitespace().filter_map(|p| p.parse().ok()).collect();
    for (sig, wait) in [(Signal::TERM, Duration::from_secs(2)), (Signal::KILL, Duration::from_secs(5))] {
        for &p in pids.iter().filter(|&&p| p > 0 && pid_running(p)) {
            // A process inside this test bed's namespace.
            if let Some(p) = Pid::from_raw(p) {
                let _ = kill_process(p, sig);
            }
        }
        let start = Instant::now();
        while pids.iter().any(|&p| pid_running(p)) && start.elapsed() < wait {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn pid_running(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => !s.rsplit(')').next().is_some_and(|r| r.trim_start().starts_with(['Z', 'X'])),
        Err(_) => false,
    }
}

/// Start time (clock ticks since boot) of a running, non-zombie process.
fn process_start_time(pid: u32) -> Result<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).with_context(|| format!("no process {pid}"))?;
    let rest = s.rsplit_once(')').map(|(_, r)| r).ok_or_else(|| anyhow!("/proc/{pid}/stat: unexpected format"))?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    if fields.first().is_some_and(|st| *st == "Z" || *st == "X") {
        bail!("process {pid} has exited");
    }
    // Field 22 of stat; `fields` starts at field 3 (state).
    fields.get(19).and_then(|f| f.parse().ok()).ok_or_else(|| anyhow!("/proc/{pid}/stat: no start time"))
}

fn stop_children(mut children: Vec<(String, Child)>, grace: Duration) {
    for (_, c) in &mut children {
        if matches!(c.try_wait(), Ok(None)) {
            // Our own child, which has not been reaped.
            let _ = kill_process(Pid::from_child(c), Signal::TERM);
        }
    }
    let start = Instant::now();
    while children.iter_mut().any(|(_, c)| matches!(c.try_wait(), Ok(None))) && start.elapsed() < grace {
        std::thread::sleep(Duration::from_millis(20));
    }
    for (label, c) in &mut children {
        if matches!(c.try_wait(), Ok(None)) {
            eprintln!("hivefs-testbed: {label} (pid {}) did not stop within {grace:?}; killing it", c.id());
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Lazily detaches every mount at or below the given directories, deepest first.
fn detach_mounts_under(dirs: &[PathBuf]) {
    if dirs.is_empty() {
        return;
    }
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut points: Vec<PathBuf> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|m| PathBuf::from(unescape_mountinfo(m)))
        .filter(|m| dirs.iter().any(|d| m.starts_with(d)))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.as_os_str().len()));
    points.dedup();
    for p in points {
        // MNT_DETACH never waits for the file system.
        if let Err(e) = unmount(&p, UnmountFlags::DETACH) {
            eprintln!("hivefs-testbed: cannot detach {}: {}", p.display(), std::io::Error::from(e));
        }
    }
}

/// Mount points in mountinfo escape space, tab, newline and backslash as `\ooo`.
fn unescape_mountinfo(s: &str) -> std::ffi::OsString {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    std::os::unix::ffi::OsStringExt::from_vec(out)
}

// ---- helpers ----

fn check_label(what: &str, s: &str, max: usize) -> Result<()> {
    let ok = !s.is_empty()
        && s.len() <= max
        && s.bytes().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
        && !s.starts_with('-');
    if !ok {
        bail!("invalid {what} {s:?}: 1 to {max} of a-z 0-9 - (not starting with -)");
    }
    Ok(())
}

fn need_root() -> Result<()> {
    if !geteuid().is_root() {
        bail!("hivefs-testbed needs root (network namespaces, veths, tc, mounts); run it, and the multi-host tests, as root");
    }
    Ok(())
}

fn program_exists(p: &str) -> bool {
    std::env::var_os("PATH").map(|path| std::env::split_paths(&path).any(|d| d.join(p).is_file())).unwrap_or(false)
}

fn run(program: &str, args: &[&str]) -> Result<String> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot run {program} (is iproute2 installed?)"))?;
    if !out.status.success() {
        bail!("`{program} {}` failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn ip(args: &[&str]) -> Result<String> {
    run("ip", args)
}

fn tc(args: &[&str]) -> Result<String> {
    run("tc", args)
}

fn tc_qdisc_show(ns: &str, dev: &str) -> Result<String> {
    tc(&["-n", ns, "qdisc", "show", "dev", dev])
}

/// The root qdisc of each end of the host's link, for inspection: (namespace, device, qdisc line).
pub fn link_qdiscs(host: &Host) -> Result<Vec<(String, String, String)>> {
    let mut v = Vec::new();
    for (ns, dev) in [(host.netns.clone(), HOST_IF.to_string()), (host.switch_ns.clone(), host.switch_if())] {
        let q = tc_qdisc_show(&ns, &dev)?;
        v.push((ns, dev, q.trim().to_string()));
    }
    Ok(v)
}

/// Whether each end of the host's link is up: (namespace, device, up).
pub fn link_up(host: &Host) -> Result<Vec<(String, String, bool)>> {
    let mut v = Vec::new();
    for (ns, dev) in [(host.netns.clone(), HOST_IF.to_string()), (host.switch_ns.clone(), host.switch_if())] {
        let out = ip(&["-n", &ns, "-o", "link", "show", "dev", &dev])?;
        let flags = out.split('<').nth(1).and_then(|r| r.split('>').next()).unwrap_or("");
        v.push((ns, dev, flags.split(',').any(|f| f == "UP")));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_parse() {
        assert_eq!(parse_rate("100mbit").unwrap(), 100_000_000);
        assert_eq!(parse_rate("1gbit").unwrap(), 1_000_000_000);
        assert_eq!(parse_rate("10mbps").unwrap(), 80_000_000);
        assert_eq!(parse_rate("250000").unwrap(), 250_000);
        assert!(parse_rate("fast").is_err());
        assert!(parse_rate("10mb").is_err());
    }

    #[test]
    fn namespace_ids() {
        assert_eq!(id_of_namespace("hfs7-client1"), Some(7));
        assert_eq!(id_of_namespace("hfs255_sw"), Some(255));
        assert_eq!(id_of_namespace("hfsx-a"), None);
        assert_eq!(id_of_namespace("other"), None);
    }

    #[test]
    fn mountinfo_escapes() {
        assert_eq!(unescape_mountinfo("/tmp/a\\040b"), std::ffi::OsString::from("/tmp/a b"));
        assert_eq!(unescape_mountinfo("/x\\"), std::ffi::OsString::from("/x\\"));
    }

    #[test]
    fn labels() {
        assert!(check_label("host", "client-1", 32).is_ok());
        assert!(check_label("host", "Client", 32).is_err());
        assert!(check_label("host", "", 32).is_err());
        assert!(check_label("host", "a_b", 32).is_err());
    }
}
