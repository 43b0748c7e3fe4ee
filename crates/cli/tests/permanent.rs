//! A permanent cluster set up as README.md's "A permanent cluster" says, on five test bed
//! hosts: mgmtd, meta, storage1, storage2 and client. Each host is a machine of its own
//! for the paths the section uses: /usr/local/bin (where the test's binary is installed),
//! /srv (targets) and /mnt (mount points) are per-host directories bind-mounted there,
//! and /etc, /var/lib and /run are overlays with a per-host upper directory, so
//! /etc/hivefs, /var/lib/hivefs and a mount's record in /run/hivefs belong to the host,
//! and nothing is written to the machine's own.
//!
//! The configs are the examples of dist/config/ with the addresses and the file system's
//! uuid replaced, as the section tells the administrator to, and every service runs the
//! command line of its dist/systemd/ unit. No systemd runs in the hosts: the test does
//! what systemd does with these units (ExecStartPre; ExecStart with %i/%I and the
//! EnvironmentFile's variables expanded, in a clean environment; `Type=notify`: start
//! returns once the service sent READY=1 to its NOTIFY_SOCKET; on stop SIGTERM, at most
//! TimeoutStopSec, then ExecStopPost) and refuses unit keys it does not emulate, so a
//! changed unit or example changes what the test runs. The test bed keeps every process;
//! dropping it stops them and removes the hosts, their namespaces and mounts. Needs root.

mod common;

use common::out;
use hivefs_testbed::{Host, Testbed};
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// PATH of a systemd service, and of the administrator's shell: finds /usr/local/bin/hivefs.
const SYSTEM_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// The examples' placeholders that README.md tells the administrator to replace.
const MGMTD_PLACEHOLDER: &str = "192.0.2.10";
const META_PLACEHOLDER: &str = "192.0.2.11";
const STORAGE_PLACEHOLDER: &str = "192.0.2.21";
const FS_UUID_PLACEHOLDER: &str = "00000000-0000-0000-0000-000000000000";
const MGMTD_PORT: u16 = 8008;
const SECRET: &str = "/etc/hivefs/secret";
const MNT: &str = "/mnt/hivefs";
/// The mount unit's instance for MNT (`systemd-escape -p /mnt/hivefs`).
const MOUNT_INSTANCE: &str = "mnt-hivefs";
/// The target README.md adds to a running storage server.
const NEW_TARGET: &str = "/srv/hivefs/target-2";
const HOSTS: [&str; 5] = ["mgmtd", "meta", "storage1", "storage2", "client"];
/// [Service] keys whose effect this test reproduces, or that do not change what runs.
/// Any other key fails the test: systemd would run the service differently.
const EMULATED_KEYS: [&str; 9] = [
    "Type",
    "EnvironmentFile",
    "ExecStartPre",
    "ExecStart",
    "ExecStopPost",
    "TimeoutStopSec",
    "Restart",
    "RestartSec",
    "LimitNOFILE",
];

fn repo_path(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(rel)
}

fn now_ns() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).expect("clock after 1970").as_nanos()
}

// ---- systemd units, as systemd reads them ----

/// The [Service] section of a unit of dist/systemd/, specifiers expanded.
struct Unit {
    /// e.g. `hivefs-storage@1.service`.
    name: String,
    service: Vec<(String, String)>,
}

impl Unit {
    /// `file` from dist/systemd/; `instance` for a template (`name@.service`).
    fn load(file: &str, instance: Option<&str>) -> Unit {
        assert_eq!(file.contains("@."), instance.is_some(), "{file}: an instance is for templates only");
        let path = repo_path("dist/systemd").join(file);
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let name = match instance {
            Some(i) => file.replacen("@.", &format!("@{i}."), 1),
            None => file.to_string(),
        };
        let mut section = "";
        let mut service = Vec::new();
        for (n, line) in text.lines().enumerate().map(|(n, l)| (n + 1, l.trim())) {
            if line.is_empty() || line.starts_with(['#', ';']) {
                continue;
            }
            assert!(!line.ends_with('\\'), "{file}:{n}: continued lines are not emulated");
            if line.starts_with('[') {
                section = line;
                continue;
            }
            let (k, v) = line.split_once('=').unwrap_or_else(|| panic!("{file}:{n}: not an assignment: {line}"));
            let k = k.trim();
            if section == "[Service]" {
                assert!(EMULATED_KEYS.contains(&k), "{file}:{n}: {k}= is not emulated by this test; teach it");
                service.push((k.to_string(), specifiers(v.trim(), instance, file)));
            }
        }
        let unit = Unit { name, service };
        assert!(
            matches!(unit.one("Type"), Some("simple" | "notify")),
            "{file}: only Type=simple and notify are emulated"
        );
        unit
    }

    fn all(&self, key: &str) -> Vec<&str> {
        self.service.iter().filter(|(k, _)| k == key).map(|(_, v)| v.as_str()).collect()
    }

    /// The value of a key given once (the last one wins, as in systemd).
    fn one(&self, key: &str) -> Option<&str> {
        self.all(key).last().copied()
    }

    /// TimeoutStopSec in whole seconds (systemd's default 90 s when absent).
    fn stop_timeout(&self) -> Duration {
        let s = self.one("TimeoutStopSec").unwrap_or("90");
        Duration::from_secs(s.parse().unwrap_or_else(|_| panic!("{}: TimeoutStopSec={s}: seconds only", self.name)))
    }
}

/// Expands `%i` (the instance), `%I` (the instance unescaped) and `%%`; any other
/// specifier fails the test.
fn specifiers(v: &str, instance: Option<&str>, file: &str) -> String {
    let inst = || instance.unwrap_or_else(|| panic!("{file}: %i or %I in a unit that is not a template"));
    let mut s = String::new();
    let mut chars = v.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            s.push(c);
            continue;
        }
        match chars.next() {
            Some('%') => s.push('%'),
            Some('i') => s.push_str(inst()),
            Some('I') => s.push_str(&unescape_instance(inst())),
            other => panic!("{file}: specifier %{} is not emulated", other.map(String::from).unwrap_or_default()),
        }
    }
    s
}

/// systemd's unescaping of an instance name: `-` is `/`, `\xNN` a byte.
fn unescape_instance(s: &str) -> String {
    let b = s.as_bytes();
    let mut v = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'-' {
            v.push(b'/');
            i += 1;
        } else if b[i] == b'\\' && b.get(i + 1) == Some(&b'x') && i + 4 <= b.len() {
            v.push(u8::from_str_radix(&s[i + 2..i + 4], 16).unwrap_or_else(|_| panic!("bad escape in {s:?}")));
            i += 4;
        } else {
            v.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(v).expect("instance unescapes to UTF-8")
}

/// An EnvironmentFile: `KEY=VALUE` lines, `#` and `;` comments, values optionally in quotes.
fn parse_env_file(text: &str, what: &str) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with(['#', ';'])) {
        let (k, v) = line.split_once('=').unwrap_or_else(|| panic!("{what}: not KEY=VALUE: {line}"));
        let v = v.trim();
        let v = ['"', '\''].iter().find_map(|q| v.strip_prefix(*q).and_then(|r| r.strip_suffix(*q))).unwrap_or(v);
        env.insert(k.trim().to_string(), v.to_string());
    }
    env
}

/// A command line as systemd runs it: words split at whitespace outside quotes, a word
/// `$VAR` replaced by the words of the variable's value (none when empty), `${VAR}`
/// inside a word by its value. A variable the environment does not define fails the
/// test. Returns whether a failure is ignored (the `-` prefix) and the words.
fn command_line(line: &str, env: &BTreeMap<String, String>, what: &str) -> (bool, Vec<String>) {
    let (ignore_failure, line) = match line.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, line),
    };
    assert!(!line.starts_with(['@', '+', '!', ':']), "{what}: command prefix not emulated: {line}");
    let var = |name: &str| -> &str {
        env.get(name).unwrap_or_else(|| panic!("{what}: ${name} is not set by the EnvironmentFile")).as_str()
    };
    let is_name = |n: &str| !n.is_empty() && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    let mut words = Vec::new();
    for (word, quoted) in split_words(line, what) {
        match word.strip_prefix('$').filter(|n| !quoted && is_name(n)) {
            Some(name) => words.extend(var(name).split_whitespace().map(String::from)),
            None => {
                let mut w = String::new();
                let mut rest = word.as_str();
                while let Some(at) = rest.find("${") {
                    let end = rest[at..].find('}').unwrap_or_else(|| panic!("{what}: unclosed ${{ in {word}"));
                    w.push_str(&rest[..at]);
                    w.push_str(var(&rest[at + 2..at + end]));
                    rest = &rest[at + end + 1..];
                }
                w.push_str(rest);
                words.push(w);
            }
        }
    }
    assert!(words.first().is_some_and(|p| p.starts_with('/')), "{what}: the program must be an absolute path");
    (ignore_failure, words)
}

/// Words of a command line, and whether each had quotes.
fn split_words(line: &str, what: &str) -> Vec<(String, bool)> {
    let mut words = Vec::new();
    let (mut word, mut quoted, mut open) = (String::new(), false, None::<char>);
    let mut in_word = false;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match (c, open) {
            ('\\', _) => {
                word.push(chars.next().unwrap_or_else(|| panic!("{what}: trailing backslash")));
                in_word = true;
            }
            (q, None) if q == '"' || q == '\'' => {
                (open, quoted, in_word) = (Some(q), true, true);
            }
            (q, Some(o)) if q == o => open = None,
            (c, None) if c.is_whitespace() => {
                if in_word {
                    words.push((std::mem::take(&mut word), quoted));
                }
                (quoted, in_word) = (false, false);
            }
            (c, _) => {
                word.push(c);
                in_word = true;
            }
        }
    }
    assert!(open.is_none(), "{what}: unclosed quote");
    if in_word {
        words.push((word, quoted));
    }
    words
}

// ---- the hosts ----

struct Service {
    unit: Unit,
    host: String,
    pid: u32,
}

struct Cluster {
    // Dropped first: stops every process of every host, which releases their
    // namespaces, overlays and mounts; then the temporary directory goes.
    tb: Testbed,
    tmp: tempfile::TempDir,
    services: Vec<Service>,
    /// `ip:port` of mgmtd.
    mgmtd: String,
}

impl Cluster {
    /// The five hosts, each isolated, with the test's binary installed as /usr/local/bin/hivefs.
    fn new() -> Cluster {
        // Made first, so that it is removed last also when this function fails.
        let tmp = tempfile::Builder::new().prefix("hivefs-permanent-").tempdir().expect("tempdir");
        let tb = Testbed::new("permanent")
            .unwrap_or_else(|e| panic!("cannot create the test bed (needs root and iproute2): {e:#}"));
        for name in HOSTS {
            let h = tb.add_host(name).expect("add host");
            let own = tmp.path().join("hosts").join(name);
            for d in ["bin", "srv", "mnt", "log", "etc", "var-lib", "run", ".work/etc", ".work/var-lib", ".work/run"] {
                std::fs::create_dir_all(own.join(d)).unwrap();
            }
            std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_hivefs"), own.join("bin/hivefs")).unwrap();
            let binds: Vec<(PathBuf, PathBuf)> = [("bin", "/usr/local/bin"), ("srv", "/srv"), ("mnt", "/mnt")]
                .iter()
                .map(|(from, to)| (own.join(from), PathBuf::from(to)))
                .collect();
            let h = tb.isolate(&h, &binds).unwrap_or_else(|e| panic!("isolate {name}: {e:#}"));
            for (dir, upper) in [("/etc", "etc"), ("/var/lib", "var-lib"), ("/run", "run")] {
                let opts = format!(
                    "lowerdir={dir},upperdir={},workdir={}",
                    own.join(upper).display(),
                    own.join(".work").join(upper).display()
                );
                let o = h.command("mount").args(["-t", "overlay", "overlay", "-o", &opts, dir]).output().unwrap();
                assert!(o.status.success(), "overlay on {dir} of host {name} (needs overlayfs): {}", out(&o));
            }
        }
        let mgmtd = tb.host("mgmtd").unwrap().addr(MGMTD_PORT);
        Cluster { tb, tmp, services: Vec::new(), mgmtd }
    }

    fn host(&self, name: &str) -> Host {
        self.tb.host(name).expect("a host of the cluster")
    }

    /// What host `name` has at `/<path>` of its own directories (/srv, /mnt; its logs at
    /// `log`), from outside.
    fn own(&self, name: &str, path: &str) -> PathBuf {
        self.tmp.path().join("hosts").join(name).join(path.trim_start_matches('/'))
    }

    /// A command on host `name`, with a service's clean environment.
    fn command(&self, name: &str, program: &str) -> Command {
        let mut cmd = self.host(name).command(program);
        cmd.env_clear().env("PATH", SYSTEM_PATH).stdin(Stdio::null());
        cmd
    }

    /// `sh -c SCRIPT sh ARGS...` on host `name`, as the administrator would type it there.
    fn sh(&self, name: &str, script: &str, args: &[&str]) -> Output {
        self.command(name, "sh").args(["-c", script, "sh"]).args(args).output().expect("run sh")
    }

    fn sh_ok(&self, name: &str, script: &str, args: &[&str]) -> String {
        let o = self.sh(name, script, args);
        assert!(o.status.success(), "on {name}: {script} {args:?}\n{}", out(&o));
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// Writes a file on host `name` (its directory made if needed) with `mode`.
    fn put(&self, name: &str, path: &str, text: &str, mode: &str) {
        let script = r#"mkdir -p "$(dirname "$1")" && (umask 077 && cat > "$1") && chmod "$2" "$1""#;
        let mut child = self
            .command(name, "sh")
            .args(["-c", script, "sh", path, mode])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run sh");
        child.stdin.take().expect("piped").write_all(text.as_bytes()).expect("write to sh");
        let o = child.wait_with_output().expect("wait for sh");
        assert!(o.status.success(), "writing {path} on {name}: {}", out(&o));
    }

    fn read(&self, name: &str, path: &str) -> String {
        self.sh_ok(name, r#"cat "$1""#, &[path])
    }

    /// `hivefs ARGS --mgmtd ... --secret-file /etc/hivefs/secret --json` on host `name`,
    /// as README.md checks the cluster; `None` while mgmtd does not answer.
    fn admin(&self, name: &str, args: &[&str]) -> Option<Value> {
        let o = self
            .command(name, "hivefs")
            .args(args)
            .args(["--mgmtd", &self.mgmtd, "--secret-file", SECRET, "--json"])
            .output()
            .expect("run hivefs");
        if !o.status.success() {
            return None;
        }
        Some(serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("hivefs {args:?}: {e}: {}", out(&o))))
    }

    fn nodes(&self) -> Vec<Value> {
        self.admin("mgmtd", &["nodes"]).and_then(|v| v.as_array().cloned()).unwrap_or_default()
    }

    fn targets(&self) -> Vec<Value> {
        self.admin("mgmtd", &["targets"]).and_then(|v| v.as_array().cloned()).unwrap_or_default()
    }

    /// The node of `kind` whose host name is `host` (the services run in the hosts' own UTS
    /// namespaces), with its state `online`.
    fn online_node(&self, kind: &str, host: &str) -> Option<Value> {
        self.nodes().into_iter().find(|n| n["type"] == kind && n["hostname"] == host && n["state"] == "online")
    }

    /// (id, node) of every target that is online with a reported capacity, sorted.
    fn online_targets(&self) -> Vec<(u64, u64)> {
        let mut v: Vec<(u64, u64)> = self
            .targets()
            .iter()
            .filter(|t| t["state"] == "online" && t["total_bytes"].as_u64() > Some(0))
            .map(|t| (t["id"].as_u64().unwrap(), t["node"].as_u64().unwrap()))
            .collect();
        v.sort();
        v
    }

    /// Polls `ready` every 100 ms; after `limit`, fails with the services' logs. Every
    /// service must keep running meanwhile.
    fn wait_for(&self, what: &str, limit: Duration, mut ready: impl FnMut(&Cluster) -> bool) {
        let start = Instant::now();
        loop {
            for s in &self.services {
                assert!(self.tb.running(s.pid), "{} on {} exited", s.unit.name, s.host);
            }
            if ready(self) {
                return;
            }
            assert!(start.elapsed() < limit, "timed out after {limit:?} waiting for {what}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `systemctl start UNIT` on host `name`: ExecStartPre, then ExecStart kept running.
    fn start(&mut self, name: &str, file: &str, instance: Option<&str>) -> u32 {
        let unit = Unit::load(file, instance);
        let env = match unit.one("EnvironmentFile") {
            Some(p) => {
                let p = p.strip_prefix('-').unwrap_or(p);
                parse_env_file(&self.read(name, p), p)
            }
            None => BTreeMap::new(),
        };
        for pre in unit.all("ExecStartPre") {
            let (ignore, argv) = command_line(pre, &env, &unit.name);
            let o = self.command(name, &argv[0]).args(&argv[1..]).envs(&env).output().expect("run ExecStartPre");
            assert!(ignore || o.status.success(), "{} ExecStartPre {argv:?} on {name}: {}", unit.name, out(&o));
        }
        let exec = unit.all("ExecStart");
        assert_eq!(exec.len(), 1, "{}: Type=simple and notify have one ExecStart", unit.name);
        let (_, argv) = command_line(exec[0], &env, &unit.name);
        let log = self.own(name, "log").join(format!("{}.log", unit.name));
        let file = std::fs::OpenOptions::new().create(true).append(true).open(&log).unwrap();
        let mut cmd = self.command(name, &argv[0]);
        cmd.args(&argv[1..]).envs(&env).stdout(file.try_clone().unwrap()).stderr(file);
        // Type=notify: systemd's socket for this start (the test's directory is shared
        // with the hosts).
        let notify = (unit.one("Type") == Some("notify")).then(|| {
            let path = self.tmp.path().join(format!("notify-{name}-{}.sock", now_ns()));
            let sock = std::os::unix::net::UnixDatagram::bind(&path).expect("bind the notify socket");
            sock.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
            cmd.env("NOTIFY_SOCKET", &path);
            sock
        });
        let pid = self.tb.spawn(&format!("{} on {name}", unit.name), cmd).unwrap_or_else(|e| panic!("{e:#}"));
        if let Some(sock) = notify {
            // `systemctl start` returns when the service says it is ready
            // (TimeoutStartSec, 90 s by default, fails it).
            let start = Instant::now();
            let mut buf = [0u8; 4096];
            loop {
                if let Ok(n) = sock.recv(&mut buf) {
                    if String::from_utf8_lossy(&buf[..n]).lines().any(|l| l == "READY=1") {
                        break;
                    }
                }
                assert!(self.tb.running(pid), "{} on {name} exited before READY=1:\n{}", unit.name, self.log_tails());
                assert!(start.elapsed() < Duration::from_secs(90), "{} on {name}: no READY=1 within 90 s", unit.name);
            }
        }
        self.services.push(Service { unit, host: name.to_string(), pid });
        pid
    }

    /// `systemctl stop UNIT` on host `name`: SIGTERM, the process must end within
    /// TimeoutStopSec (systemd would kill it: a failure here), then ExecStopPost.
    fn stop(&mut self, name: &str, unit_name: &str) {
        let i = self
            .services
            .iter()
            .position(|s| s.host == name && s.unit.name == unit_name)
            .unwrap_or_else(|| panic!("{unit_name} does not run on {name}"));
        let pid = self.services[i].pid;
        assert!(self.tb.running(pid), "{unit_name} on {name} exited before it was stopped");
        let raw = rustix::process::Pid::from_raw(pid as i32).expect("positive pid");
        // Our own child, not reaped: the pid cannot be another process's.
        rustix::process::kill_process(raw, rustix::process::Signal::TERM).expect("SIGTERM");
        let limit = self.services[i].unit.stop_timeout();
        let start = Instant::now();
        while self.tb.running(pid) {
            assert!(start.elapsed() < limit, "{unit_name} on {name} ignored SIGTERM for {limit:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
        let s = self.services.remove(i);
        self.tb.stop(pid, Duration::ZERO).expect("forget the stopped service");
        let env = match s.unit.one("EnvironmentFile") {
            Some(p) => parse_env_file(&self.read(name, p.strip_prefix('-').unwrap_or(p)), p),
            None => BTreeMap::new(),
        };
        for post in s.unit.all("ExecStopPost") {
            let (ignore, argv) = command_line(post, &env, &s.unit.name);
            let o = self.command(name, &argv[0]).args(&argv[1..]).envs(&env).output().expect("run ExecStopPost");
            assert!(ignore || o.status.success(), "{} ExecStopPost {argv:?} on {name}: {}", s.unit.name, out(&o));
        }
    }

    /// How often the log of `unit_name` on `name` holds `text` (all its runs).
    fn log_count(&self, name: &str, unit_name: &str, text: &str) -> usize {
        let log = self.own(name, "log").join(format!("{unit_name}.log"));
        std::fs::read_to_string(log).unwrap_or_default().matches(text).count()
    }

    /// The last lines of every service's log, for failure messages.
    fn log_tails(&self) -> String {
        let mut s = String::new();
        for name in HOSTS {
            for e in std::fs::read_dir(self.own(name, "log")).into_iter().flatten().flatten() {
                let text = std::fs::read_to_string(e.path()).unwrap_or_default();
                let lines: Vec<&str> = text.lines().collect();
                let tail = lines[lines.len().saturating_sub(15)..].join("\n");
                s.push_str(&format!("--- {name}: {} ---\n{tail}\n", e.file_name().to_string_lossy()));
            }
        }
        s
    }

    /// The mount points of FUSE file systems on host `name`.
    fn fuse_mounts(&self, name: &str) -> Vec<String> {
        self.read(name, "/proc/self/mountinfo")
            .lines()
            .filter(|l| l.contains(" - fuse"))
            .filter_map(|l| l.split(' ').nth(4).map(str::to_string))
            .collect()
    }

    /// `hivefs entry info --json PATH` on the client.
    fn entry_info(&self, path: &str) -> Value {
        let o = self.command("client", "hivefs").args(["entry", "info", "--json", path]).output().unwrap();
        assert!(o.status.success(), "hivefs entry info {path}: {}", out(&o));
        serde_json::from_slice(&o.stdout).unwrap()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("service logs of the failed test:\n{}", self.log_tails());
        }
    }
}

/// A config example of dist/config/ with the placeholders replaced as README.md says; the
/// test fails if an example has a placeholder it does not know.
fn config(file: &str, replace: &[(&str, &str)]) -> String {
    let path = repo_path("dist/config").join(file);
    let mut text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    for (from, to) in replace {
        assert!(text.contains(from), "{file} has no {from} to replace");
        text = text.replace(from, to);
    }
    assert!(
        !text.contains("192.0.2.") && !text.contains(FS_UUID_PLACEHOLDER),
        "{file}: a placeholder is left:\n{text}"
    );
    text
}

#[test]
fn a_permanent_cluster_set_up_as_the_readme_says_serves_grows_and_upgrades_one_server_at_a_time() {
    let mut c = Cluster::new();
    let ip = |name: &str| c.host(name).ip.to_string();
    let (mgmtd_ip, meta_ip) = (ip("mgmtd"), ip("meta"));

    // The shared secret, made once and copied to every host (mode 600).
    c.sh_ok(
        "mgmtd",
        "mkdir -p /etc/hivefs && (umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n' > /etc/hivefs/secret)",
        &[],
    );
    assert_eq!(c.sh_ok("mgmtd", "stat -c %a /etc/hivefs/secret", &[]).trim(), "600");
    let secret = c.read("mgmtd", SECRET);
    assert_eq!(secret.len(), 64, "32 bytes in hex: {secret:?}");
    for name in &HOSTS[1..] {
        c.put(name, SECRET, &secret, "600");
    }
    let fs_uuid = c.read("storage1", "/proc/sys/kernel/random/uuid").trim().to_string();

    // Configs from the examples.
    let mgmtd_at = [(MGMTD_PLACEHOLDER, mgmtd_ip.as_str())];
    c.put("mgmtd", "/etc/hivefs/mgmtd.toml", &config("mgmtd.toml", &mgmtd_at), "644");
    c.put(
        "meta",
        "/etc/hivefs/meta-1.toml",
        &config("meta-1.toml", &[mgmtd_at[0], (META_PLACEHOLDER, &meta_ip)]),
        "644",
    );
    for name in ["storage1", "storage2"] {
        let own_ip = ip(name);
        let text =
            config("storage-1.toml", &[mgmtd_at[0], (STORAGE_PLACEHOLDER, &own_ip), (FS_UUID_PLACEHOLDER, &fs_uuid)]);
        c.put(name, "/etc/hivefs/storage-1.toml", &text, "644");
        // Format the targets the config lists.
        c.sh_ok(name, "hivefs storage --config /etc/hivefs/storage-1.toml --init", &[]);
    }
    c.put("client", "/etc/hivefs/mount.env", &config("mount.env", &mgmtd_at), "644");

    // Start in order, each checked as README.md does.
    let t0 = Instant::now();
    c.start("mgmtd", "hivefs-mgmtd.service", None);
    c.wait_for("mgmtd to answer `hivefs nodes`", Duration::from_secs(20), |c| c.admin("mgmtd", &["nodes"]).is_some());
    c.start("meta", "hivefs-meta@.service", Some("1"));
    c.wait_for("the metadata node online", Duration::from_secs(30), |c| c.online_node("meta", "meta").is_some());
    c.start("storage1", "hivefs-storage@.service", Some("1"));
    c.start("storage2", "hivefs-storage@.service", Some("1"));
    c.wait_for("both storage nodes and their targets online", Duration::from_secs(30), |c| {
        c.online_node("storage", "storage1").is_some()
            && c.online_node("storage", "storage2").is_some()
            && c.online_targets().len() == 2
    });
    let node_of = |c: &Cluster, host: &str| c.online_node("storage", host).unwrap()["id"].as_u64().unwrap();
    let (s1, s2) = (node_of(&c, "storage1"), node_of(&c, "storage2"));
    let targets_before = c.online_targets();
    assert!(targets_before.iter().any(|t| t.1 == s1) && targets_before.iter().any(|t| t.1 == s2), "{targets_before:?}");
    let df = c.admin("mgmtd", &["df"]).expect("hivefs df");
    assert_eq!(df["metadata"].as_array().map(Vec::len), Some(1), "hivefs df: {df:#}");
    let pool = &df["pools"][0];
    let counts = (pool["name"].as_str(), pool["targets"].as_u64(), pool["normal"].as_u64());
    assert_eq!(counts, (Some("default"), Some(2), Some(2)), "both targets take new files: {df:#}");

    c.start("client", "hivefs-mount@.service", Some(MOUNT_INSTANCE));
    // Type=notify: started means mounted.
    assert!(c.fuse_mounts("client").iter().any(|m| m == MNT), "READY=1 came before the mount");
    let o = c.sh("client", "stat /mnt/hivefs", &[]);
    assert!(o.status.success(), "stat /mnt/hivefs: {}", out(&o));
    eprintln!("cluster up and mounted in {:?}", t0.elapsed());

    // I/O through the mount, on the client: written and read back, over both targets.
    let want = c.sh_ok("client", "head -c 8000000 /dev/urandom | tee /mnt/hivefs/before | sha256sum", &[]);
    assert_eq!(c.sh_ok("client", "sha256sum < /mnt/hivefs/before", &[]), want);
    let info = c.entry_info("/mnt/hivefs/before");
    let ids_before: Vec<u64> = targets_before.iter().map(|t| t.0).collect();
    let mut used: Vec<u64> = info["targets"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap()).collect();
    used.sort();
    assert_eq!(used, ids_before, "a new file stripes over all targets: {info:#}");

    // A target added to the running storage server on storage2: listed in its config,
    // formatted (the formatted one is left alone), the service restarted.
    let conf = c.read("storage2", "/etc/hivefs/storage-1.toml");
    let mut table: toml::Table = toml::from_str(&conf).unwrap();
    let targets = table.get_mut("targets").and_then(|t| t.as_array_mut()).expect("a list of targets");
    let old_target = targets[0].as_str().unwrap().to_string();
    targets.push(NEW_TARGET.into());
    let target_file = |c: &Cluster| std::fs::read(c.own("storage2", &format!("{old_target}/target.toml"))).unwrap();
    let before = target_file(&c);
    c.put("storage2", "/etc/hivefs/storage-1.toml", &toml::to_string(&table).unwrap(), "644");
    c.sh_ok("storage2", "hivefs storage --config /etc/hivefs/storage-1.toml --init", &[]);
    assert_eq!(target_file(&c), before, "formatting again leaves a formatted target alone");
    c.stop("storage2", "hivefs-storage@1.service");
    c.start("storage2", "hivefs-storage@.service", Some("1"));
    c.wait_for("the new target online", Duration::from_secs(30), |c| c.online_targets().len() == 3);
    let targets_after = c.online_targets();
    for t in &targets_before {
        assert!(targets_after.contains(t), "target {t:?} kept its id and node: {targets_after:?}");
    }
    let new: Vec<&(u64, u64)> = targets_after.iter().filter(|t| !targets_before.contains(t)).collect();
    assert_eq!(new.len(), 1);
    assert_eq!(new[0].1, s2, "the new target belongs to storage2's node: {targets_after:?}");
    assert_eq!(node_of(&c, "storage2"), s2, "the restarted node keeps its id");
    // New files use it; the old one reads as before.
    let want_after = c.sh_ok("client", "head -c 3000000 /dev/urandom | tee /mnt/hivefs/after | sha256sum", &[]);
    assert_eq!(c.sh_ok("client", "sha256sum < /mnt/hivefs/after", &[]), want_after);
    let info = c.entry_info("/mnt/hivefs/after");
    let mut used: Vec<u64> = info["targets"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap()).collect();
    used.sort();
    assert_eq!(used, targets_after.iter().map(|t| t.0).collect::<Vec<_>>(), "stripe over all 3 targets: {info:#}");
    assert_eq!(c.sh_ok("client", "sha256sum < /mnt/hivefs/before", &[]), want);

    // Upgrade storage1 (a new binary installed, the service restarted) while the client
    // reads a file in a loop: no read fails, and a read spans the restart.
    let script = r#"n=0
        while [ ! -e /mnt/reader.stop ]; do
            t0=$(date +%s%N)
            got=$(sha256sum < /mnt/hivefs/before) || { echo "read error after $n reads"; exit 1; }
            t1=$(date +%s%N)
            [ "$got" = "$1" ] || { echo "wrong checksum $got after $n reads"; exit 1; }
            n=$((n + 1)); echo "read $n $t0 $t1"
        done
        echo "done $n""#;
    let reader_log = c.own("client", "mnt/reader.log");
    let mut reader = c.command("client", "sh");
    reader.args(["-c", script, "sh", want.trim()]).stdout(std::fs::File::create(&reader_log).unwrap());
    let reader_pid = c.tb.spawn("reader on client", reader).unwrap();
    let reads = || -> Vec<(u64, u128, u128)> {
        let text = std::fs::read_to_string(&reader_log).unwrap_or_default();
        let bad = text.lines().find(|l| !l.starts_with("read ") && !l.starts_with("done "));
        assert!(bad.is_none(), "the reader failed: {}", bad.unwrap());
        text.lines()
            .filter_map(|l| l.strip_prefix("read "))
            .map(|l| {
                let f: Vec<&str> = l.split(' ').collect();
                (f[0].parse().unwrap(), f[1].parse().unwrap(), f[2].parse().unwrap())
            })
            .collect()
    };
    c.wait_for("the reader's first reads", Duration::from_secs(30), |_| reads().len() >= 2);
    c.sh_ok("storage1", r#"install -m 755 "$1" /usr/local/bin/hivefs"#, &[env!("CARGO_BIN_EXE_hivefs")]);
    let started = c.log_count("storage1", "hivefs-storage@1.service", "storage service started");
    c.stop("storage1", "hivefs-storage@1.service");
    let down_from = now_ns();
    let pid = c.start("storage1", "hivefs-storage@.service", Some("1"));
    // Type=notify: started means serving.
    assert!(c.log_count("storage1", "hivefs-storage@1.service", "storage service started") > started);
    let restart_to = now_ns();
    let exe = c.sh_ok("storage1", r#"readlink "/proc/$1/exe""#, &[&pid.to_string()]);
    assert_eq!(exe.trim(), "/usr/local/bin/hivefs", "the restarted service runs the installed binary");
    let n = reads().len();
    c.wait_for("reads after the restart", Duration::from_secs(60), |_| reads().len() >= n + 3);
    std::fs::write(c.own("client", "mnt/reader.stop"), b"").unwrap();
    c.wait_for("the reader to finish", Duration::from_secs(60), |c| !c.tb.running(reader_pid));
    let all = reads();
    let log = std::fs::read_to_string(&reader_log).unwrap();
    assert_eq!(log.lines().last(), Some(format!("done {}", all.len()).as_str()), "reader: {log}");
    // A read in flight while no storage service ran on storage1.
    let spanning = all.iter().filter(|&&(_, t0, t1)| t0 < restart_to && t1 > down_from).count();
    assert!(spanning > 0, "no read was in flight while storage1 was down ({down_from}..{restart_to} ns): {log}");
    let longest_ms = all.iter().map(|&(_, t0, t1)| (t1 - t0) / 1_000_000).max().unwrap_or(0);
    assert_eq!(node_of(&c, "storage1"), s1, "the upgraded node keeps its id");
    assert_eq!(c.online_targets(), targets_after, "every target online with its id after the upgrade");
    eprintln!("{} reads of 8 MB through the restart of storage1, none failed (longest {longest_ms} ms)", all.len());

    // Stop as `systemctl stop` would, clients first: everything ends on SIGTERM.
    c.stop("client", &format!("hivefs-mount@{MOUNT_INSTANCE}.service"));
    assert!(!c.fuse_mounts("client").iter().any(|m| m == MNT), "{MNT} still mounted after the mount unit stopped");
    for (name, unit) in [
        ("storage1", "hivefs-storage@1.service"),
        ("storage2", "hivefs-storage@1.service"),
        ("meta", "hivefs-meta@1.service"),
        ("mgmtd", "hivefs-mgmtd.service"),
    ] {
        c.stop(name, unit);
    }
    eprintln!("whole test in {:?}", t0.elapsed());
}

#[test]
fn unit_command_lines_expand_as_systemd_does() {
    let env = parse_env_file("# c\nA=x:1\nB=\"--p q  --r\"\n; c\nE=\n", "env");
    assert_eq!(env["B"], "--p q  --r");
    let (ignore, argv) = command_line("/bin/p --a ${A} $B $E \"two words\" /x", &env, "t");
    assert!(!ignore);
    assert_eq!(argv, ["/bin/p", "--a", "x:1", "--p", "q", "--r", "two words", "/x"]);
    assert_eq!(command_line("-/bin/f -uz /m", &env, "t"), (true, vec!["/bin/f".into(), "-uz".into(), "/m".into()]));
    assert_eq!(unescape_instance("mnt-hivefs"), "mnt/hivefs");
    assert_eq!(unescape_instance("a\\x2db"), "a-b");
    let unit = Unit::load("hivefs-mount@.service", Some(MOUNT_INSTANCE));
    assert_eq!(unit.name, "hivefs-mount@mnt-hivefs.service");
    assert_eq!(unit.all("ExecStartPre"), ["/bin/mkdir -p /mnt/hivefs"]);
}
