//! A HiveFS spread over test bed hosts (network namespaces, see `hivefs-testbed`),
//! started by hand as an administrator would: one mgmtd host, one metadata host,
//! storage hosts and client hosts, each service bound to its host's own address.
//!
//! The FUSE mounts are made from the client hosts' network namespaces but land in this
//! process's mount namespace (`Host::command` enters only the network namespace), so
//! tests use them at their paths with ordinary system calls. Admin commands run inside a
//! host (only the test bed's bridge reaches the services). Everything stops, and the
//! mounts are detached, when the cluster is dropped, also when a test fails.
//!
//! I/O expected to block (a cut storage host) runs in child processes ([`bounded`]):
//! a process spawned while the test holds a HiveFS file open inherits the descriptor,
//! its exec closes the copy, and FUSE turns that close into a FLUSH to the mount, which
//! waits on the file's storage targets; a blocked file in a test thread would stall every
//! spawn of the test (measured: 3 s, the I/O timeout).
#![allow(dead_code)]

use crate::common::{hivefs_bin, is_mounted};
use hivefs_testbed::{Host, Testbed};
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

pub const MGMTD_PORT: u16 = 8008;
pub const META_PORT: u16 = 8005;
pub const STORAGE_PORT: u16 = 8003;
/// Targets are probably-offline after this many ms without a report, offline after twice it.
pub const PROBABLY_OFFLINE_MS: u64 = 1500;
pub const OFFLINE_MS: u64 = 3000;
/// Client operations on a server that does not answer fail after this long.
pub const IO_TIMEOUT_MS: u64 = 3000;

pub struct StorageHost {
    pub host: Host,
    pub targets: Vec<PathBuf>,
}

pub struct ClientHost {
    pub host: Host,
    pub mnt: PathBuf,
}

pub struct NetCluster {
    // Dropped first: detaches the mounts, stops every service, deletes the namespaces;
    // only then is the temporary directory removed.
    pub tb: Testbed,
    pub tmp: tempfile::TempDir,
    pub secret: PathBuf,
    /// mgmtd's address, `ip:port` on the mgmtd host.
    pub mgmtd: String,
    pub mgmtd_host: Host,
    pub meta_host: Host,
    pub storage: Vec<StorageHost>,
    pub clients: Vec<ClientHost>,
    /// (name, pid, log) of every service running.
    services: Vec<(String, u32, PathBuf)>,
    /// (name, host, arguments) of every service started, to start it again.
    launched: Vec<(String, Host, Vec<String>)>,
}

impl NetCluster {
    /// Starts mgmtd, one metadata node, `storage_hosts` storage nodes with
    /// `targets_per_host` targets each, and mounts on `clients` client hosts; returns once
    /// every target is online and every mount is up.
    pub fn start(tag: &str, storage_hosts: usize, targets_per_host: usize, clients: usize) -> NetCluster {
        let tb = Testbed::new(tag)
            .unwrap_or_else(|e| panic!("cannot create the test bed (multi-host tests need root): {e:#}"));
        let tmp = tempfile::Builder::new().prefix("hivefs-multihost-").tempdir().expect("tempdir");
        tb.watch_mounts(tmp.path()).expect("watch mounts");
        let secret = tmp.path().join("secret");
        write_secret(&secret);
        let mgmtd_host = tb.add_host("mgmtd").expect("add mgmtd host");
        let meta_host = tb.add_host("meta").expect("add meta host");
        let mut c = NetCluster {
            mgmtd: mgmtd_host.addr(MGMTD_PORT),
            tb,
            secret,
            mgmtd_host,
            meta_host,
            storage: Vec::new(),
            clients: Vec::new(),
            services: Vec::new(),
            launched: Vec::new(),
            tmp,
        };

        let cfg = c.write_file(
            "mgmtd.toml",
            &format!(
                "probably_offline_after_ms = {PROBABLY_OFFLINE_MS}\noffline_after_ms = {OFFLINE_MS}\n\
                 failover_after_ms = {OFFLINE_MS}\n"
            ),
        );
        let h = c.mgmtd_host.clone();
        let (dir, listen) = (c.dir("mgmtd"), h.addr(MGMTD_PORT));
        c.service(&h, "mgmtd", &["mgmtd", "--dir", &dir, "--listen", &listen, "--config", &cfg]);

        let h = c.meta_host.clone();
        let (dir, listen) = (c.dir("meta"), h.addr(META_PORT));
        let cfg = c.write_file("meta.toml", "heartbeat_interval_ms = 500\n");
        let mgmtd = c.mgmtd.clone();
        c.service(&h, "meta", &["meta", "--dir", &dir, "--listen", &listen, "--mgmtd", &mgmtd, "--config", &cfg]);

        let fs_uuid = hivefs_cluster::new_uuid();
        let cfg = c.write_file("storage.toml", "heartbeat_interval_ms = 500\nmirror_forward_timeout_ms = 2000\n");
        for i in 1..=storage_hosts {
            let name = format!("storage{i}");
            let h = c.tb.add_host(&name).expect("add storage host");
            let targets: Vec<PathBuf> =
                (1..=targets_per_host).map(|t| c.tmp.path().join(&name).join(format!("target{t}"))).collect();
            let mut init = vec!["storage".to_string(), "--init".into(), "--fs-uuid".into(), fs_uuid.clone()];
            for t in &targets {
                std::fs::create_dir_all(t).unwrap();
                init.extend(["--target".into(), t.display().to_string()]);
            }
            let o = Command::new(hivefs_bin()).args(&init).output().expect("run hivefs storage --init");
            assert!(o.status.success(), "hivefs storage --init: {}", String::from_utf8_lossy(&o.stderr));
            let (dir, listen) = (c.dir(&name), h.addr(STORAGE_PORT));
            let mut args: Vec<String> = [
                "storage",
                "--dir",
                &dir,
                "--listen",
                &listen,
                "--mgmtd",
                &mgmtd,
                "--config",
                &cfg,
                "--fs-uuid",
                &fs_uuid,
            ]
            .map(String::from)
            .to_vec();
            for t in &targets {
                args.extend(["--target".into(), t.display().to_string()]);
            }
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            c.service(&h, &name, &args);
            c.storage.push(StorageHost { host: h, targets });
        }

        let want = storage_hosts * targets_per_host;
        c.wait_for("every target online", Duration::from_secs(45), |c| {
            c.assert_services_running();
            let online =
                c.targets().iter().filter(|t| t["state"] == "online" && t["total_bytes"].as_u64() > Some(0)).count();
            let meta_up = c.nodes().iter().any(|n| n["type"] == "meta" && n["state"] == "online");
            online == want && meta_up
        });

        for i in 1..=clients {
            let name = format!("client{i}");
            let h = c.tb.add_host(&name).expect("add client host");
            let mnt = c.tmp.path().join(format!("mnt{i}"));
            std::fs::create_dir_all(&mnt).unwrap();
            let (mgmtd, timeout) = (c.mgmtd.clone(), IO_TIMEOUT_MS.to_string());
            let args = ["mount", "--mgmtd", &mgmtd, "--io-timeout-ms", &timeout, mnt.to_str().unwrap()];
            c.service(&h, &format!("mount{i}"), &args);
            let label = format!("the mount on {}", mnt.display());
            c.wait_for(&label, Duration::from_secs(30), |c| {
                c.assert_services_running();
                is_mounted(&mnt) && std::fs::metadata(&mnt).is_ok()
            });
            c.clients.push(ClientHost { host: h, mnt });
        }
        c
    }

    /// Starts one more metadata node on a host of its own named `name`
    /// (service `name` too); returns once mgmtd sees it online.
    pub fn add_meta(&mut self, name: &str) -> Host {
        let h = self.tb.add_host(name).expect("add meta host");
        let (dir, listen) = (self.dir(name), h.addr(META_PORT));
        let cfg = self.tmp.path().join("meta.toml").display().to_string();
        let mgmtd = self.mgmtd.clone();
        self.service(&h, name, &["meta", "--dir", &dir, "--listen", &listen, "--mgmtd", &mgmtd, "--config", &cfg]);
        let want = h.addr(META_PORT);
        self.wait_for(&format!("metadata node {name} online"), Duration::from_secs(30), |c| {
            c.assert_services_running();
            c.nodes().iter().any(|n| n["type"] == "meta" && n["address"] == want.as_str() && n["state"] == "online")
        });
        h
    }

    fn dir(&self, name: &str) -> String {
        self.tmp.path().join(name).display().to_string()
    }

    fn write_file(&self, name: &str, text: &str) -> String {
        let p = self.tmp.path().join(name);
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    }

    /// Starts `hivefs ARGS --secret-file S` on `host`, logging to `<tmp>/<name>.log`.
    fn service(&mut self, host: &Host, name: &str, args: &[&str]) -> u32 {
        self.launched.push((name.to_string(), host.clone(), args.iter().map(|a| a.to_string()).collect()));
        let log_path = self.tmp.path().join(format!("{name}.log"));
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&log_path).unwrap();
        let mut cmd = host.command(hivefs_bin());
        cmd.args(args)
            .args(["--secret-file", self.secret.to_str().unwrap()])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        let pid = self.tb.spawn(name, cmd).unwrap_or_else(|e| panic!("{e:#}"));
        self.services.push((name.to_string(), pid, log_path));
        pid
    }

    /// kill -9 of service `name` (e.g. "storage1"); it is no longer expected to run.
    pub fn kill9(&mut self, name: &str) {
        let i = self.services.iter().position(|s| s.0 == name).unwrap_or_else(|| panic!("no service {name}"));
        let (_, pid, _) = self.services.remove(i);
        let raw = rustix::process::Pid::from_raw(pid as i32).expect("positive pid");
        let _ = rustix::process::kill_process(raw, rustix::process::Signal::KILL);
        self.tb.stop(pid, Duration::ZERO).expect("reap the killed service");
    }

    /// Starts service `name` again with the arguments it was first started with (its log goes on).
    pub fn restart(&mut self, name: &str) {
        let (_, host, args) =
            self.launched.iter().find(|l| l.0 == name).cloned().unwrap_or_else(|| panic!("no service {name}"));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.service(&host, name, &args);
        self.launched.pop(); // recorded once
    }

    /// Panics (the logs follow) if a service has exited.
    pub fn assert_services_running(&self) {
        for (name, pid, log) in &self.services {
            assert!(self.tb.running(*pid), "{name} (pid {pid}) exited; see {}", log.display());
        }
    }

    /// Polls `ready` every 100 ms; panics with the services' logs after `limit`.
    pub fn wait_for(&self, what: &str, limit: Duration, mut ready: impl FnMut(&NetCluster) -> bool) {
        let start = Instant::now();
        while !ready(self) {
            assert!(start.elapsed() < limit, "timed out after {limit:?} waiting for {what}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Runs `hivefs ARGS` inside `host`.
    pub fn hivefs_on(&self, host: &Host, args: &[&str]) -> Output {
        host.command(hivefs_bin()).args(args).stdin(Stdio::null()).output().expect("run hivefs")
    }

    /// Runs `hivefs ARGS` inside `host`, asserts success and returns stdout.
    pub fn hivefs_ok_on(&self, host: &Host, args: &[&str]) -> String {
        let o = self.hivefs_on(host, args);
        assert!(
            o.status.success(),
            "hivefs {args:?} on host {} failed:\nstdout: {}\nstderr: {}",
            host.name,
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// Runs an admin command against mgmtd from the mgmtd host (`--mgmtd`, `--secret-file`, `--json`).
    fn admin_json(&self, cmd: &[&str]) -> Option<serde_json::Value> {
        let mut args = cmd.to_vec();
        args.extend(["--mgmtd", &self.mgmtd, "--secret-file", self.secret.to_str().unwrap(), "--json"]);
        let o = self.hivefs_on(&self.mgmtd_host, &args);
        if !o.status.success() {
            return None;
        }
        serde_json::from_slice(&o.stdout).ok()
    }

    /// `hivefs targets --json` (empty while mgmtd does not answer).
    pub fn targets(&self) -> Vec<serde_json::Value> {
        self.admin_json(&["targets"]).and_then(|v| v.as_array().cloned()).unwrap_or_default()
    }

    /// `hivefs nodes --json` (empty while mgmtd does not answer).
    pub fn nodes(&self) -> Vec<serde_json::Value> {
        self.admin_json(&["nodes"]).and_then(|v| v.as_array().cloned()).unwrap_or_default()
    }

    /// `hivefs pool create NAME`, returning the pool id.
    pub fn create_pool(&self, name: &str) -> u64 {
        let v =
            self.admin_json(&["pool", "create", name]).unwrap_or_else(|| panic!("hivefs pool create {name} failed"));
        v["id"].as_u64().unwrap()
    }

    /// Moves targets into a pool.
    pub fn move_targets(&self, pool: &str, targets: &[u64]) {
        let ids: Vec<String> = targets.iter().map(|t| t.to_string()).collect();
        let mut args = vec!["pool", "add-target", pool];
        args.extend(ids.iter().map(String::as_str));
        args.extend(["--mgmtd", &self.mgmtd, "--secret-file", self.secret.to_str().unwrap()]);
        self.hivefs_ok_on(&self.mgmtd_host, &args);
    }

    /// Storage node id of a storage host (by the address it registered with).
    pub fn node_id_of(&self, host: &Host) -> u64 {
        let want = host.addr(STORAGE_PORT);
        let nodes = self.nodes();
        nodes
            .iter()
            .find(|n| n["type"] == "storage" && n["address"] == want.as_str())
            .and_then(|n| n["id"].as_u64())
            .unwrap_or_else(|| panic!("no storage node registered at {want}: {nodes:?}"))
    }

    /// Target ids served by a storage host.
    pub fn target_ids_of(&self, host: &Host) -> Vec<u64> {
        let node = self.node_id_of(host);
        let mut v: Vec<u64> =
            self.targets().iter().filter(|t| t["node"] == node).filter_map(|t| t["id"].as_u64()).collect();
        v.sort();
        v
    }

    /// `hivefs entry info --json` of a path, run on the client host whose mount holds it.
    pub fn entry_info(&self, path: &Path) -> serde_json::Value {
        let c = self.clients.iter().find(|c| path.starts_with(&c.mnt)).expect("a path inside a mount");
        let out = self.hivefs_ok_on(&c.host, &["entry", "info", "--json", path.to_str().unwrap()]);
        serde_json::from_str(&out).unwrap()
    }

    /// The last lines of every service log, for failure messages.
    pub fn log_tails(&self) -> String {
        let mut s = String::new();
        for (_, _, p) in &self.services {
            let text = std::fs::read_to_string(p).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            s.push_str(&format!("--- {} ---\n{}\n", p.display(), lines[lines.len().saturating_sub(15)..].join("\n")));
        }
        s
    }
}

impl Drop for NetCluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("service logs of the failed multi-host test:\n{}", self.log_tails());
        }
    }
}

/// A shared secret as `hivefs up` makes one: 32 random bytes as hex, mode 0600.
fn write_secret(path: &Path) {
    let mut raw = [0u8; 32];
    std::fs::File::open("/dev/urandom").unwrap().read_exact(&mut raw).unwrap();
    let hex: String = raw.iter().map(|b| format!("{b:02x}")).collect();
    std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path).unwrap();
    std::fs::write(path, format!("{hex}\n")).unwrap();
}

/// A command started in the background whose end the test awaits with a bound.
pub struct Bounded {
    child: std::process::Child,
    start: Instant,
    what: String,
}

/// Starts `cmd` with its output captured. I/O that may block on an unreachable server
/// runs in such a child process, not in a thread of the test: every process the test
/// spawns gets a copy of the test's open descriptors, and closing a copy of a HiveFS file
/// (at exec) sends the mount a FLUSH, which waits for that file's servers.
pub fn bounded(what: &str, mut cmd: Command) -> Bounded {
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
    Bounded { child, start: Instant::now(), what: what.to_string() }
}

impl Bounded {
    /// Its output and how long it ran; panics (after killing it) if it runs past `limit`.
    pub fn wait(mut self, limit: Duration) -> (Output, Duration) {
        loop {
            if self.child.try_wait().expect("wait for child").is_some() {
                let took = self.start.elapsed();
                return (self.child.wait_with_output().expect("collect output"), took);
            }
            if self.start.elapsed() > limit {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!("{} did not return within {limit:?}", self.what);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
