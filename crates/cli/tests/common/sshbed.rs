//! Machines reached over ssh, for `hivefs ond` (and batch systems): test bed hosts
//! (network namespaces) that are each also isolated ([`Testbed::isolate`]): their own
//! hostname, their own `/etc/hosts` naming every host, and their own directories at the
//! same paths ([`SshBed::data`], [`SshBed::mnt`], [`SshBed::state`], [`SshBed::bin`]),
//! as on separate machines. Each runs OpenSSH's sshd (Debian openssh-server) with a host
//! key and a client key made for the test; [`SshBed::ssh_config`] is the client config
//! that reaches them as `n1`, `n2`, ... from inside any of them.
//!
//! What a host does lives in its namespaces: its FUSE mounts are invisible outside, and
//! a test looks at them by running commands on the host ([`SshBed::sh`]). Dropping the
//! bed kills every process of every host (sshd, services, mounts), which releases their
//! namespaces and mounts; then the temporary directory goes.
#![allow(dead_code)]

use hivefs_testbed::{Host, Testbed};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

pub struct SshBed {
    // Dropped first: stops every host's processes and deletes the namespaces.
    pub tb: Testbed,
    pub tmp: tempfile::TempDir,
    pub hosts: Vec<Host>,
    pub ssh_config: PathBuf,
}

impl SshBed {
    /// `n` hosts called n1..nN, each running sshd; returns once each reaches every other
    /// over ssh.
    pub fn start(tag: &str, n: usize) -> SshBed {
        let names: Vec<String> = (1..=n).map(|i| format!("n{i}")).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        Self::start_named(tag, &names)
    }

    /// [`SshBed::start`] with the hosts' names given (lowercase letters, digits, `-`),
    /// e.g. a `ctl` beside `n1`..`n3`; `hosts` follows their order.
    pub fn start_named(tag: &str, names: &[&str]) -> SshBed {
        let tb = Testbed::new(tag).unwrap_or_else(|e| panic!("cannot create the test bed (needs root): {e:#}"));
        let tmp = tempfile::Builder::new().prefix("hivefs-sshbed-").tempdir().expect("tempdir");
        let t = tmp.path();
        for d in ["node/data", "node/mnt", "node/state", "node/bin"] {
            std::fs::create_dir_all(t.join(d)).unwrap();
        }
        // Keys of this test only.
        for key in ["client_key", "host_key"] {
            let o = Command::new("ssh-keygen")
                .args(["-q", "-t", "ed25519", "-N", "", "-C", "hivefs-test", "-f"])
                .arg(t.join(key))
                .output()
                .expect("run ssh-keygen (Debian package openssh-client)");
            assert!(o.status.success(), "ssh-keygen: {}", String::from_utf8_lossy(&o.stderr));
        }
        std::fs::copy(t.join("client_key.pub"), t.join("authorized_keys")).unwrap();
        // sshd's privilege separation directory (shared by all hosts).
        std::fs::create_dir_all("/run/sshd").unwrap();
        let sshd_config = t.join("sshd_config");
        std::fs::write(
            &sshd_config,
            format!(
                "Port 22\nHostKey {k}\nPidFile none\nUsePAM no\nPermitRootLogin prohibit-password\n\
                 PubkeyAuthentication yes\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n\
                 AuthorizedKeysFile {a}\nStrictModes no\nMaxStartups 64\nLogLevel ERROR\n",
                k = t.join("host_key").display(),
                a = t.join("authorized_keys").display()
            ),
        )
        .unwrap();
        let ssh_config = t.join("ssh_config");
        std::fs::write(
            &ssh_config,
            format!(
                "Host *\n  User root\n  IdentityFile {}\n  IdentitiesOnly yes\n  StrictHostKeyChecking no\n  \
                 UserKnownHostsFile /dev/null\n  LogLevel ERROR\n",
                t.join("client_key").display()
            ),
        )
        .unwrap();

        let mut hosts = Vec::new();
        for name in names {
            hosts.push(tb.add_host(name).expect("add host"));
        }
        let mut etc_hosts = String::from("127.0.0.1 localhost\n");
        for h in &hosts {
            etc_hosts.push_str(&format!("{} {}\n", h.ip, h.name));
        }
        std::fs::write(t.join("etc_hosts"), etc_hosts).unwrap();
        let mut isolated = Vec::new();
        for h in &hosts {
            let own = t.join("hosts").join(&h.name);
            for d in ["data", "mnt", "state", "bin"] {
                std::fs::create_dir_all(own.join(d)).unwrap();
            }
            // The parent is bound, so that the mount point is a plain directory.
            let binds = [(t.join("etc_hosts"), PathBuf::from("/etc/hosts")), (own.clone(), t.join("node"))];
            let h = tb.isolate(h, &binds).expect("isolate host");
            let log = std::fs::File::create(own.join("sshd.log")).unwrap();
            let mut cmd = h.command("/usr/sbin/sshd");
            cmd.args(["-D", "-e", "-f"]).arg(&sshd_config).stdin(Stdio::null()).stdout(Stdio::null()).stderr(log);
            tb.spawn(&format!("sshd on {}", h.name), cmd).expect("start sshd");
            isolated.push(h);
        }
        let bed = SshBed { tb, tmp, hosts: isolated, ssh_config };
        for h in &bed.hosts {
            let start = Instant::now();
            loop {
                let o = bed.sh(0, &format!("ssh -F {} -o BatchMode=yes {} true", bed.ssh_config.display(), h.name));
                if o.status.success() {
                    break;
                }
                assert!(
                    start.elapsed() < Duration::from_secs(20),
                    "{} cannot ssh to {}: {}\nsshd log: {}",
                    bed.hosts[0].name,
                    h.name,
                    String::from_utf8_lossy(&o.stderr),
                    std::fs::read_to_string(bed.own(&h.name, "sshd.log")).unwrap_or_default()
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        bed
    }

    /// A path every host has, its own directory `name` (data, mnt, state, bin).
    pub fn path(&self, name: &str) -> PathBuf {
        self.tmp.path().join("node").join(name)
    }

    pub fn data(&self) -> PathBuf {
        self.path("data")
    }
    pub fn mnt(&self) -> PathBuf {
        self.path("mnt")
    }
    pub fn state(&self) -> PathBuf {
        self.path("state")
    }

    /// What host `node` (n1, ...) sees at `path(name)`, from outside.
    pub fn own(&self, node: &str, name: &str) -> PathBuf {
        self.tmp.path().join("hosts").join(node).join(name)
    }

    /// Runs a shell command on host `i` (0-based) in its namespaces.
    pub fn sh(&self, i: usize, script: &str) -> Output {
        self.hosts[i].command("sh").args(["-c", script]).stdin(Stdio::null()).output().expect("run sh")
    }

    /// [`SshBed::sh`] that must succeed; its stdout.
    pub fn sh_ok(&self, i: usize, script: &str) -> String {
        let o = self.sh(i, script);
        assert!(
            o.status.success(),
            "on {}: {script}\nstdout: {}\nstderr: {}",
            self.hosts[i].name,
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// Runs `hivefs ARGS` on host `i`.
    pub fn hivefs(&self, i: usize, args: &[&str]) -> Output {
        self.hosts[i].command(crate::common::hivefs_bin()).args(args).stdin(Stdio::null()).output().expect("run hivefs")
    }

    /// Node names, comma-separated.
    pub fn node_list(&self) -> String {
        self.hosts.iter().map(|h| h.name.as_str()).collect::<Vec<_>>().join(",")
    }

    /// Pids of processes in host `i`'s network namespace other than its sshd and anchor.
    pub fn hivefs_pids(&self, i: usize) -> Vec<String> {
        let o = Command::new("ip").args(["netns", "pids", &self.hosts[i].netns]).output().unwrap();
        String::from_utf8_lossy(&o.stdout)
            .split_whitespace()
            .filter(|p| {
                let cmd = std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
                let first = cmd.split(|b| *b == 0).next().unwrap_or_default();
                Path::new(&*String::from_utf8_lossy(first)).file_name().is_some_and(|f| f == "hivefs")
            })
            .map(str::to_string)
            .collect()
    }

    /// FUSE mounts of host `i` under this bed's directories (a host also sees the mounts
    /// it inherited from the machine, which are not the test's).
    pub fn fuse_mounts(&self, i: usize) -> Vec<String> {
        let ours = self.tmp.path().display().to_string();
        self.sh_ok(i, "cat /proc/self/mountinfo")
            .lines()
            .filter(|l| l.contains(" - fuse"))
            .filter_map(|l| l.split(' ').nth(4).map(str::to_string))
            .filter(|m| m.starts_with(&ours))
            .collect()
    }
}
