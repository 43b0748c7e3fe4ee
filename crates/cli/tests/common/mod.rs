//! Test harness: real `hivefs` processes and real FUSE mounts in temporary
//! directories. Every file system is torn down on drop, also when a test fails.
#![allow(dead_code)]

use rustix::process::{kill_process, Pid, Signal};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// mgmtd timeouts short enough that a buddy group fails over within seconds.
pub const FAST_FAILOVER: &str = "probably_offline_after_ms = 2500\noffline_after_ms = 4000\nfailover_after_ms = 4000\n";

/// Polls `ok` every 200 ms until it holds; fails the test after `limit`.
pub fn wait_for(what: &str, limit: Duration, mut ok: impl FnMut() -> bool) {
    let start = Instant::now();
    while !ok() {
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A finished command's status and output, for assertion messages.
pub fn out(o: &Output) -> String {
    format!(
        "status {}\nstdout: {}\nstderr: {}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

pub fn hivefs_bin() -> &'static str {
    env!("CARGO_BIN_EXE_hivefs")
}

pub fn hivefs(args: &[&str]) -> Output {
    Command::new(hivefs_bin()).args(args).output().expect("run hivefs")
}

/// Runs hivefs and asserts success, returning stdout.
pub fn hivefs_ok(args: &[&str]) -> String {
    let o = hivefs(args);
    assert!(
        o.status.success(),
        "hivefs {args:?} failed:\nstdout: {}\nstderr: {}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Runs hivefs with `--json` among `args`, asserts success, and parses what it printed.
pub fn json(args: &[&str]) -> serde_json::Value {
    let out = hivefs_ok(args);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("hivefs {args:?} printed no JSON object ({e}):\n{out}"))
}

/// The storage targets of a file, from `hivefs entry info --json`.
pub fn targets_of(info: &serde_json::Value) -> Vec<u64> {
    info["targets"].as_array().expect("a file's targets").iter().map(|t| t.as_u64().unwrap()).collect()
}

pub struct TestFs {
    pub tmp: tempfile::TempDir,
    pub dir: PathBuf,
    pub mnt: PathBuf,
    /// tmpfs mounts made for this file system (unmounted after `down`).
    pub tmpfs: Vec<PathBuf>,
}

impl TestFs {
    /// `hivefs up` with extra arguments (e.g. `--storage 1`).
    pub fn up(extra: &[&str]) -> TestFs {
        Self::up_with(extra, |_| {})
    }

    /// `hivefs up` after `prepare` ran on the (empty) file system directory.
    pub fn up_with(extra: &[&str], prepare: impl FnOnce(&mut TestFs)) -> TestFs {
        Self::up_env(extra, &[], prepare)
    }

    /// [`TestFs::up_with`] with environment variables for `hivefs up`; returns
    /// its stderr too.
    pub fn up_env(extra: &[&str], env: &[(&str, &str)], prepare: impl FnOnce(&mut TestFs)) -> TestFs {
        let tmp = tempfile::Builder::new().prefix("hivefs-test-").tempdir().expect("tempdir");
        let dir = tmp.path().join("fs");
        let mnt = tmp.path().join("mnt");
        std::fs::create_dir_all(&dir).unwrap();
        let mut fs = TestFs { tmp, dir, mnt, tmpfs: Vec::new() };
        prepare(&mut fs);
        let mut args = vec!["up", "--dir", fs.dir_s(), "--mount", fs.mnt_s()];
        args.extend_from_slice(extra);
        let o = Command::new(hivefs_bin()).args(&args).envs(env.iter().copied()).output().expect("run hivefs");
        assert!(
            o.status.success(),
            "hivefs {args:?} failed:\nstdout: {}\nstderr: {}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        fs
    }

    pub fn dir_s(&self) -> &str {
        self.dir.to_str().unwrap()
    }

    pub fn mnt_s(&self) -> &str {
        self.mnt.to_str().unwrap()
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.mnt.join(rel)
    }

    pub fn reup(&self) {
        hivefs_ok(&["up", "--dir", self.dir_s()]);
    }

    pub fn down(&self) {
        hivefs_ok(&["down", "--dir", self.dir_s()]);
    }

    pub fn mgmtd_addr(&self) -> String {
        let s = std::fs::read_to_string(self.dir.join("fs.toml")).unwrap();
        let v: toml::Value = toml::from_str(&s).unwrap();
        format!("{}:{}", v["host"].as_str().unwrap(), v["mgmtd_port"].as_integer().unwrap())
    }

    pub fn secret(&self) -> PathBuf {
        self.dir.join("secret")
    }

    pub fn pid(&self, service: &str) -> i32 {
        let sdir = if service == "mount" { self.dir.join("client") } else { self.dir.join(service) };
        std::fs::read_to_string(sdir.join(format!("{service}.pid"))).unwrap().trim().parse().unwrap()
    }

    /// Whether the service's process runs (exists and is not a zombie).
    pub fn alive(&self, service: &str) -> bool {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid(service))).unwrap_or_default();
        !stat.is_empty() && !stat.rsplit(')').next().is_some_and(|r| r.trim_start().starts_with('Z'))
    }

    pub fn kill9(&self, service: &str) {
        let pid = self.pid(service);
        // A service this test started.
        let _ = kill_process(Pid::from_raw(pid).expect("positive pid"), Signal::KILL);
        let start = Instant::now();
        while std::fs::metadata(format!("/proc/{pid}")).is_ok() && start.elapsed() < Duration::from_secs(10) {
            // The process is reaped by init; wait until it is gone or a zombie
            // without other threads: the leader turns zombie while its other
            // threads may still be exiting, holding the shared descriptors
            // (sockets) open, and the leader's own fd directory is empty then.
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let zombie = stat.rsplit(')').next().is_some_and(|r| r.trim_start().starts_with('Z'));
            let threads = std::fs::read_dir(format!("/proc/{pid}/task")).map_or(0, |d| d.count());
            if zombie && threads <= 1 {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Restarts the file system with every metadata service armed to abort
    /// at `hook` (`HIVEFS_CRASH_AT`, as `kill -9`); `reup` restarts a dead
    /// one unarmed.
    pub fn arm(&self, hook: &str) {
        self.down();
        let o = Command::new(hivefs_bin())
            .args(["up", "--dir", self.dir_s()])
            .env("HIVEFS_CRASH_AT", hook)
            .output()
            .expect("run hivefs up");
        assert!(o.status.success(), "up with {hook}: {}", String::from_utf8_lossy(&o.stderr));
    }

    /// `hivefs fsck --mount` must find nothing (exit status 0).
    pub fn assert_fsck_clean(&self) {
        let o = hivefs(&["fsck", "--mount", self.mnt_s()]);
        assert_eq!(
            o.status.code(),
            Some(0),
            "fsck not clean:\n{}\n{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }

    /// `hivefs entry info --json` of a path in the mount.
    pub fn entry_info(&self, rel: &str) -> serde_json::Value {
        let p = self.path(rel);
        let out = hivefs_ok(&["entry", "info", "--json", p.to_str().unwrap()]);
        serde_json::from_str(&out).unwrap()
    }

    /// Map of target id → target directory.
    pub fn target_dirs(&self) -> std::collections::HashMap<u64, PathBuf> {
        let mut m = std::collections::HashMap::new();
        for e in std::fs::read_dir(&self.dir).unwrap() {
            let sdir = e.unwrap().path();
            if !sdir.file_name().unwrap().to_string_lossy().starts_with("storage") {
                continue;
            }
            for t in std::fs::read_dir(&sdir).unwrap() {
                let t = t.unwrap().path();
                let tt = t.join("target.toml");
                if let Ok(s) = std::fs::read_to_string(&tt) {
                    let v: toml::Value = toml::from_str(&s).unwrap();
                    if let Some(id) = v.get("target_id").and_then(|x| x.as_integer()) {
                        m.insert(id as u64, t);
                    }
                }
            }
        }
        m
    }

    /// Length of the chunk file of `entry_id` on target `t` (0 if absent).
    pub fn chunk_len(&self, t: u64, entry_id: &str) -> u64 {
        let dirs = self.target_dirs();
        let chunks = dirs[&t].join("chunks");
        for sub in std::fs::read_dir(&chunks).unwrap() {
            let p = sub.unwrap().path().join(entry_id);
            if let Ok(m) = std::fs::metadata(&p) {
                return m.len();
            }
        }
        0
    }

    /// Allocated bytes of all chunk files of `rel` (st_blocks on the targets).
    pub fn chunk_blocks(&self, rel: &str) -> u64 {
        use std::os::unix::fs::MetadataExt;
        let info = self.entry_info(rel);
        let id = info["entry_id"].as_str().unwrap().to_string();
        let mut total = 0;
        for dir in self.target_dirs().values() {
            for sub in std::fs::read_dir(dir.join("chunks")).unwrap() {
                if let Ok(m) = std::fs::metadata(sub.unwrap().path().join(&id)) {
                    total += m.blocks() * 512;
                }
            }
        }
        total
    }

    /// A second mount of the same file system.
    pub fn second_mount(&self) -> SecondMount {
        self.extra_mount("mnt2", &[])
    }

    /// Another mount of the same file system on `<tmp>/<name>`, with extra `hivefs mount` flags.
    pub fn extra_mount(&self, name: &str, flags: &[&str]) -> SecondMount {
        let mnt = self.tmp.path().join(name);
        std::fs::create_dir_all(&mnt).unwrap();
        let log = std::fs::File::create(self.tmp.path().join(format!("{name}.log"))).unwrap();
        let child = Command::new(hivefs_bin())
            .args(["mount", "--mgmtd", &self.mgmtd_addr(), "--secret-file", self.secret().to_str().unwrap()])
            .args(flags)
            .arg(&mnt)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let log = self.tmp.path().join(format!("{name}.log"));
        let m = SecondMount { child: Some(child), mnt, log };
        wait_mounted(&m.mnt);
        m
    }
}

impl TestFs {
    /// Mounts a tmpfs of `size` (e.g. "64m") on `rel` under the file system directory.
    pub fn mount_tmpfs(&mut self, rel: &str, size: &str) {
        let p = self.dir.join(rel);
        std::fs::create_dir_all(&p).unwrap();
        let st = Command::new("mount").args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"]).arg(&p).status();
        assert!(st.unwrap().success(), "mount tmpfs on {}", p.display());
        self.tmpfs.push(p);
    }
}

impl Drop for TestFs {
    fn drop(&mut self) {
        let _ = Command::new(hivefs_bin()).args(["down", "--force", "--dir", self.dir_s()]).output();
        for p in self.tmpfs.drain(..) {
            let _ = Command::new("umount").arg("-l").arg(&p).status();
        }
        // Anything else the test mounted under its directory (a second mount whose
        // owner leaked, a mount left by a command under test) goes too.
        let root = self.tmp.path().to_str().unwrap().to_string();
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let mut under: Vec<PathBuf> = info
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .filter(|m| m.starts_with(&format!("{root}/")))
            .map(PathBuf::from)
            .collect();
        under.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        for m in under {
            detach(&m);
        }
    }
}

pub fn is_mounted(mnt: &Path) -> bool {
    let s = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let m = mnt.to_str().unwrap();
    s.lines().any(|l| l.split(' ').nth(4) == Some(m))
}

pub fn wait_mounted(mnt: &Path) {
    let start = Instant::now();
    while !is_mounted(mnt) {
        assert!(start.elapsed() < Duration::from_secs(30), "{} did not get mounted", mnt.display());
        std::thread::sleep(Duration::from_millis(50));
    }
}

pub struct SecondMount {
    child: Option<Child>,
    pub mnt: PathBuf,
    pub log: PathBuf,
}

impl SecondMount {
    /// Process id of its `hivefs mount`.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// Unmounts it and waits (at most 30 s) for its `hivefs mount` to exit;
    /// returns the exit status and the process's log.
    pub fn unmount(mut self) -> (std::process::ExitStatus, String) {
        let st = Command::new("fusermount3").arg("-u").arg(&self.mnt).status().expect("fusermount3");
        assert!(st.success(), "fusermount3 -u {}", self.mnt.display());
        let mut child = self.child.take().expect("running");
        let start = Instant::now();
        let status = loop {
            if let Some(s) = child.try_wait().expect("wait for hivefs mount") {
                break s;
            }
            if start.elapsed() > Duration::from_secs(30) {
                let _ = child.kill();
                panic!("hivefs mount did not exit within 30 s of its unmount");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        (status, std::fs::read_to_string(&self.log).unwrap_or_default())
    }
}

impl Drop for SecondMount {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("fusermount3").arg("-u").arg(&self.mnt).status();
            let _ = child.kill();
            let _ = child.wait();
        }
        detach(&self.mnt);
    }
}

/// A process stopped with SIGSTOP, continued (SIGCONT) when dropped, also
/// when the test fails.
pub struct Stopped(i32);

impl Stopped {
    /// Stops `pid` and returns once every thread of it is stopped: the
    /// kernel stops the other threads only when the first one runs, so on a
    /// loaded machine some keep running after `kill` returned.
    pub fn new(pid: i32) -> Stopped {
        kill_process(Pid::from_raw(pid).expect("positive pid"), Signal::STOP).expect("SIGSTOP");
        let stopped = Stopped(pid);
        let tasks = format!("/proc/{pid}/task");
        let all_stopped = || {
            std::fs::read_dir(&tasks).expect("the process's threads").all(|t| {
                let stat = t.map(|t| std::fs::read_to_string(t.path().join("stat")).unwrap_or_default());
                // The state follows the command name in parentheses.
                stat.is_ok_and(|s| s.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with(['T', 't'])))
            })
        };
        let start = Instant::now();
        while !all_stopped() {
            assert!(start.elapsed() < Duration::from_secs(10), "process {pid} did not stop");
            std::thread::sleep(Duration::from_millis(1));
        }
        stopped
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        let _ = kill_process(Pid::from_raw(self.0).expect("positive pid"), Signal::CONT);
    }
}

/// Detaches whatever is still mounted on `mnt` (lazily), saying so if it cannot.
fn detach(mnt: &Path) {
    for tool in [["fusermount3", "-uz"], ["umount", "-l"]] {
        if !is_mounted(mnt) {
            return;
        }
        let _ = Command::new(tool[0]).arg(tool[1]).arg(mnt).status();
    }
    if is_mounted(mnt) {
        eprintln!("test cleanup: {} is still mounted", mnt.display());
    }
}

/// Deterministic pseudo-random bytes (xorshift), seeded per test and printed on failure.
pub fn random_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut v = Vec::with_capacity(len);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    v
}

pub fn errno_of<T>(r: std::io::Result<T>) -> i32 {
    match r {
        Ok(_) => 0,
        Err(e) => e.raw_os_error().unwrap_or(-1),
    }
}

/// Waits for `child` to exit, killing it and failing the test with
/// "`what` still blocks after `limit`" if it has not by then.
pub fn wait_child(child: &mut Child, limit: Duration, what: &str) -> std::process::ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            panic!("{what} still blocks after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A TCP port free at the time of asking (for a `--metrics-listen`).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Requests of type `op` that the process serving metrics on `port` has
/// sent to other services so far (`hivefs_calls_total`).
pub fn calls_sent(port: u16, op: &str) -> u64 {
    counter(port, "hivefs_calls_total", &format!("op=\"{op}\""))
}

/// The sum of counter `name`'s series with `label` (`key="value"`) of the
/// process serving metrics on `port` (0 when there is none yet).
pub fn counter(port: u16, name: &str, label: &str) -> u64 {
    let o = Command::new("curl")
        .args(["-sf", "--max-time", "5", &format!("http://127.0.0.1:{port}/metrics")])
        .output()
        .expect("run curl (Debian package curl)");
    assert!(o.status.success(), "metrics on port {port}");
    let text = String::from_utf8_lossy(&o.stdout);
    let series = format!("{name}{{");
    text.lines()
        .filter(|l| l.starts_with(&series) && l.contains(label))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap() as u64)
        .sum()
}
