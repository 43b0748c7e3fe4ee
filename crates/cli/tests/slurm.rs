//! HiveFS per-job file systems under a real Slurm cluster (Debian's slurm-wlm 22.05):
//! munged, slurmctld on a host `ctl` and slurmd on `n1`..`n3`, all test bed hosts of
//! common/sshbed.rs (own network, mount and UTS namespaces, sshd). The SPANK plugin,
//! prolog and epilog of dist/slurm are built and installed with their Makefile into a
//! temporary directory; the prolog runs the real `hivefs ond start` over ssh and the
//! epilog the real `hivefs ond stop --local`.
//!
//! A job with `--hivefs=chunk-size=1m,stripe=2` checks what it got (HIVEFS_MOUNT, a
//! FUSE mount, `hivefs entry info` of a file) and writes and reads data from every node;
//! afterwards no process, mount, data or state is left on any node. A job without
//! `--hivefs` gets nothing. Needs root and the Debian packages slurmctld slurmd
//! slurm-client libslurm-dev munge gcc make openssh-server.
//!
//! Nothing is written outside temporary directories: Slurm's files (configuration,
//! spool, state, logs, pid files) are at test paths given in slurm.conf, per host under
//! the bed's per-host directory; munged has its own key and socket (`AuthInfo=socket=`),
//! so a munged or Slurm of the machine is not touched. munged runs on `ctl`, so dropping
//! the bed stops it with everything else.

mod common;
#[path = "common/sshbed.rs"]
mod sshbed;

use common::out;
use sshbed::SshBed;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The compute nodes; `ctl` (host 0) runs slurmctld and munged and is where jobs are
/// submitted.
const NODES: [&str; 3] = ["n1", "n2", "n3"];
const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

fn s(p: &Path) -> String {
    p.display().to_string()
}

fn write_exec(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// The last `n` lines of a file, or why there are none.
fn tail(path: &Path, n: usize) -> String {
    match std::fs::read_to_string(path) {
        Ok(t) => {
            let lines: Vec<&str> = t.lines().collect();
            lines[lines.len().saturating_sub(n)..].join("\n")
        }
        Err(e) => format!("({e})"),
    }
}

struct Cluster {
    // Dropped first: stops every process of every host (munged, slurmctld, slurmd,
    // slurmstepd, jobs, HiveFS services) and with them their mounts.
    bed: SshBed,
    /// Shared by all hosts (mode 755, so munged reaches its files): munge key and socket,
    /// the installed plugin and scripts, Slurm's configuration, job scripts and results.
    work: tempfile::TempDir,
    t0: Instant,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.dump_logs();
        }
    }
}

impl Cluster {
    fn start() -> Cluster {
        for c in ["slurmctld", "slurmd", "sbatch", "munged", "munge", "setpriv", "make", "cc"] {
            let found = std::env::split_paths(PATH).any(|d| d.join(c).exists());
            assert!(
                found,
                "missing {c}: needs the Debian packages slurmctld slurmd slurm-client libslurm-dev munge gcc make"
            );
        }
        let t0 = Instant::now();
        let bed = SshBed::start_named("slurm", &["ctl", "n1", "n2", "n3"]);
        let work = tempfile::Builder::new().prefix("hivefs-slurm-").tempdir().unwrap();
        std::fs::set_permissions(work.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let c = Cluster { bed, work, t0 };
        c.say("test bed with sshd on ctl, n1, n2, n3");
        for d in ["etc", "jobs", "results", "src"] {
            std::fs::create_dir_all(c.w(d)).unwrap();
        }
        for h in &c.bed.hosts {
            for d in ["spool", "ctld"] {
                std::fs::create_dir_all(c.bed.own(&h.name, "slurm").join(d)).unwrap();
            }
        }
        c.install_plugin();
        c.write_configs();
        c.start_munged();
        c.start_slurm();
        c
    }

    fn say(&self, what: &str) {
        eprintln!("[{:6.2}s] {what}", self.t0.elapsed().as_secs_f64());
    }

    /// A path in the shared work directory.
    fn w(&self, rel: &str) -> PathBuf {
        self.work.path().join(rel)
    }

    /// Host index of a compute node.
    fn idx(node: &str) -> usize {
        1 + NODES.iter().position(|n| *n == node).expect("a compute node")
    }

    /// Each host's own Slurm directory (spool, state, logs), the same path on every host.
    fn slurm_dir(&self) -> PathBuf {
        self.bed.path("slurm")
    }

    /// `make install` of dist/slurm (plugin, prolog, epilog, settings) into the work
    /// directory, built from a copy of the sources (the source tree stays untouched).
    fn install_plugin(&self) {
        let dist = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../dist/slurm");
        for f in ["Makefile", "hivefs_spank.c", "prolog", "epilog", "hivefs-slurm-common.sh", "hivefs-slurm.conf"] {
            std::fs::copy(dist.join(f), self.w("src").join(f)).unwrap_or_else(|e| panic!("copy dist/slurm/{f}: {e}"));
        }
        let o = Command::new("make")
            .arg("-C")
            .arg(self.w("src"))
            .arg("install")
            .arg(format!("DESTDIR={}", s(&self.w("inst"))))
            .args(["PLUGINDIR=/lib", "LIBEXECDIR=/libexec", "SYSCONFDIR=/etc"])
            .output()
            .expect("run make");
        assert!(o.status.success(), "make install of dist/slurm (needs libslurm-dev gcc make): {}", out(&o));
        self.say("plugin built and installed (make install DESTDIR=...)");
    }

    fn write_configs(&self) {
        let etc = self.w("etc");
        let inst = self.w("inst");
        let hivefs = common::hivefs_bin();
        let state = s(&self.bed.state());
        // The settings file as installed, with this test's values added at its end.
        let settings = inst.join("etc/slurm.conf");
        let mut text = std::fs::read_to_string(&settings).unwrap();
        text.push_str(&format!(
            "\n# test settings\nHIVEFS_BIN={hivefs}\nHIVEFS_REMOTE_BIN={hivefs}\nHIVEFS_DATA_DIR={data}\n\
             HIVEFS_MOUNT_BASE={mnt}\nHIVEFS_SSH_CONFIG={ssh}\n\
             HIVEFS_OND_START_OPTS=\"--state-dir {state} --connect-timeout 2\"\n\
             HIVEFS_OND_STOP_OPTS=\"--state-dir {state} --connect-timeout 2\"\n\
             HIVEFS_START_TIMEOUT=60\nHIVEFS_STOP_TIMEOUT=20\nHIVEFS_KILL_GRACE=5\nHIVEFS_LOG={log}\n",
            data = s(&self.bed.data()),
            mnt = s(&self.bed.mnt()),
            ssh = s(&self.bed.ssh_config),
            log = s(&self.slurm_dir().join("hivefs.log")),
        ));
        std::fs::write(&settings, text).unwrap();
        // slurmd gives its scripts a fresh environment: the wrappers name the settings
        // file, and record that they ran and how they ended.
        for (kind, script) in [("prolog", "slurm-prolog"), ("epilog", "slurm-epilog")] {
            write_exec(
                &etc.join(kind),
                &format!(
                    "#!/bin/sh\n\
                     HIVEFS_SLURM_CONF={settings} {script}\nrc=$?\n\
                     echo \"{kind} $SLURMD_NODENAME $SLURM_JOB_ID ${{SPANK_HIVEFS-<unset>}} $SLURM_NODELIST $(hostname) exit $rc\" \
                     >>{events}\nexit $rc\n",
                    settings = s(&settings),
                    script = s(&inst.join("libexec").join(script)),
                    events = s(&self.w("events")),
                ),
            );
        }
        std::fs::write(
            etc.join("plugstack.conf"),
            format!("required {} mount={}\n", s(&inst.join("lib/hivefs_spank.so")), s(&self.bed.mnt())),
        )
        .unwrap();
        let d = s(&self.slurm_dir());
        let ctl = &self.bed.hosts[0];
        let mut conf = format!(
            "ClusterName=hivetest\nSlurmctldHost=ctl({ip})\nSlurmUser=root\nSlurmdUser=root\n\
             AuthType=auth/munge\nCredType=cred/munge\nAuthInfo=socket={sock}\n\
             StateSaveLocation={d}/ctld\nSlurmdSpoolDir={d}/spool\n\
             SlurmctldPidFile={d}/slurmctld.pid\nSlurmdPidFile={d}/slurmd.pid\n\
             SlurmctldLogFile={d}/slurmctld.log\nSlurmdLogFile={d}/slurmd.log\n\
             SlurmctldDebug=debug\nSlurmdDebug=debug\nPlugStackConfig={etc}/plugstack.conf\n\
             ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\nJobAcctGatherType=jobacct_gather/none\n\
             AccountingStorageType=accounting_storage/none\nJobCompType=jobcomp/none\nSwitchType=switch/none\n\
             MpiDefault=none\nSelectType=select/cons_tres\nSelectTypeParameters=CR_Core\nReturnToService=2\n\
             SlurmdParameters=config_overrides\nPrologFlags=Alloc\nProlog={etc}/prolog\nEpilog={etc}/epilog\n\
             PrologEpilogTimeout=120\n",
            ip = ctl.ip,
            sock = s(&self.w("munge/munge.socket.2")),
            etc = s(&etc),
        );
        for n in NODES {
            conf.push_str(&format!("NodeName={n} NodeAddr={} CPUs=2 State=UNKNOWN\n", self.bed.hosts[Self::idx(n)].ip));
        }
        conf.push_str(&format!(
            "PartitionName=debug Nodes={} Default=YES MaxTime=INFINITE State=UP\n",
            NODES.join(",")
        ));
        std::fs::write(etc.join("slurm.conf"), conf).unwrap();
    }

    /// A shell command on host `i` with Slurm's client environment.
    fn sh(&self, i: usize, script: &str) -> Output {
        self.bed.hosts[i]
            .command("sh")
            .args(["-c", script])
            .env_clear()
            .env("PATH", PATH)
            .env("HOME", "/root")
            .env("LANG", "C")
            .env("SLURM_CONF", self.w("etc/slurm.conf"))
            .stdin(Stdio::null())
            .output()
            .expect("run sh")
    }

    fn sh_ok(&self, i: usize, script: &str) -> String {
        let o = self.sh(i, script);
        assert!(o.status.success(), "on {}: {script}\n{}", self.bed.hosts[i].name, out(&o));
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// Starts `args` on host `i` as a daemon of the bed (stopped when it is dropped);
    /// its pid.
    fn daemon(&self, i: usize, label: &str, args: &[&str], log: &Path) -> u32 {
        let mut cmd = self.bed.hosts[i].command(args[0]);
        cmd.args(&args[1..])
            .env_clear()
            .env("PATH", PATH)
            .env("HOME", "/root")
            .env("SLURM_CONF", self.w("etc/slurm.conf"))
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(log).unwrap())
            .stderr(std::fs::File::create(log.with_extension("err")).unwrap());
        self.bed.tb.spawn(label, cmd).unwrap_or_else(|e| panic!("start {label}: {e:#}"))
    }

    /// Fails at once when a daemon started by [`Cluster::daemon`] has exited.
    fn alive(&self, pid: u32, label: &str) {
        assert!(self.bed.tb.running(pid), "{label} exited (its log is below)");
    }

    /// Polls `ok` every 100 ms; fails after `limit`.
    fn wait(&self, what: &str, limit: Duration, mut ok: impl FnMut() -> bool) {
        let start = Instant::now();
        while !ok() {
            assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
        self.say(&format!("{what} ({:.2} s)", start.elapsed().as_secs_f64()));
    }

    /// One munged for all hosts, on ctl, with a key and socket of this test: the hosts
    /// reach its unix socket at the same path (`AuthInfo=socket=` in slurm.conf).
    fn start_munged(&self) {
        let (dir, keydir) = (self.w("munge"), self.w("munge-key"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::create_dir_all(&keydir).unwrap();
        let o = Command::new("sh")
            .arg("-ec")
            .arg(format!(
                "dd if=/dev/urandom of={k}/munge.key bs=1024 count=1 status=none\n\
                 chown -R munge:munge {d} {k}\nchmod 755 {d}\nchmod 700 {k}\nchmod 400 {k}/munge.key",
                d = s(&dir),
                k = s(&keydir)
            ))
            .output()
            .unwrap();
        assert!(o.status.success(), "munge key: {}", out(&o));
        let sock = s(&dir.join("munge.socket.2"));
        // setpriv execs munged: the pid started is munged's (runuser would stay its parent).
        let pid = self.daemon(
            0,
            "munged",
            &[
                "setpriv",
                "--reuid=munge",
                "--regid=munge",
                "--clear-groups",
                "--",
                "munged",
                "--foreground",
                &format!("--socket={sock}"),
                &format!("--key-file={}", s(&keydir.join("munge.key"))),
                &format!("--pid-file={}", s(&dir.join("munged.pid"))),
                &format!("--seed-file={}", s(&dir.join("munged.seed"))),
                &format!("--log-file={}", s(&dir.join("munged.log"))),
            ],
            &self.w("munged.out"),
        );
        self.wait("munged answers", Duration::from_secs(10), || {
            self.alive(pid, "munged");
            self.sh(0, &format!("munge -n -S {sock} | unmunge -S {sock}")).status.success()
        });
        for n in NODES {
            self.sh_ok(Self::idx(n), &format!("munge -n -S {sock} | unmunge -S {sock} >/dev/null"));
        }
    }

    fn start_slurm(&self) {
        let conf = s(&self.w("etc/slurm.conf"));
        let ctld =
            self.daemon(0, "slurmctld", &["slurmctld", "-D", "-f", &conf], &self.bed.own("ctl", "slurm").join("out"));
        self.wait("slurmctld answers", Duration::from_secs(30), || {
            self.alive(ctld, "slurmctld");
            String::from_utf8_lossy(&self.sh(0, "scontrol ping").stdout).contains("is UP")
        });
        let slurmds: Vec<(u32, String)> = NODES
            .iter()
            .map(|n| {
                let label = format!("slurmd on {n}");
                let args = ["slurmd", "-D", "-N", n, "-f", &conf];
                (self.daemon(Self::idx(n), &label, &args, &self.bed.own(n, "slurm").join("out")), label)
            })
            .collect();
        self.wait("all 3 nodes idle", Duration::from_secs(60), || {
            slurmds.iter().for_each(|(pid, label)| self.alive(*pid, label));
            self.all_idle()
        });
    }

    fn all_idle(&self) -> bool {
        let o = self.sh(0, "sinfo -h -N -o '%N %T'");
        let text = String::from_utf8_lossy(&o.stdout);
        o.status.success() && text.lines().count() == NODES.len() && text.lines().all(|l| l.ends_with(" idle"))
    }

    /// A batch script in the work directory: `body` run by `sh -eu` with `$R` a
    /// directory for the job's findings ([`Cluster::result`]).
    fn job_script(&self, name: &str, body: &str) -> PathBuf {
        let path = self.w("jobs").join(name);
        let results = s(&self.w("results"));
        write_exec(&path, &format!("#!/bin/sh\nset -eu\nR={results}/$SLURM_JOB_ID\nmkdir -p \"$R\"\n{body}"));
        path
    }

    /// `sbatch ARGS` on ctl; the job id.
    fn submit(&self, args: &str) -> u32 {
        let jobs = s(&self.w("jobs"));
        let id = self.sh_ok(0, &format!("sbatch --parsable -D {jobs} -o {jobs}/%j.out {args}"));
        id.trim().parse().unwrap_or_else(|_| panic!("sbatch printed {id:?}"))
    }

    /// `scontrol show job -o ID`.
    fn job(&self, id: u32) -> String {
        self.sh_ok(0, &format!("scontrol show job -o {id}"))
    }

    /// Waits until job `id` has ended, with its epilogs (COMPLETED only after every
    /// node's epilog); fails at once when Slurm holds it (a failed prolog) or it ended
    /// otherwise than COMPLETED with exit code 0.
    fn wait_completed(&self, id: u32, limit: Duration) {
        let start = Instant::now();
        loop {
            let j = self.job(id);
            let field =
                |k: &str| j.split_whitespace().find_map(|w| w.strip_prefix(k).map(str::to_string)).unwrap_or_default();
            let state = field("JobState=");
            match state.as_str() {
                "PENDING" | "CONFIGURING" | "RUNNING" | "COMPLETING" => {
                    let reason = field("Reason=");
                    assert!(!reason.contains("held") && !reason.contains("Held"), "job {id} is held: {j}");
                }
                "COMPLETED" => {
                    assert_eq!(field("ExitCode="), "0:0", "job {id}: {j}");
                    break;
                }
                _ => panic!("job {id} ended {state}: {j}"),
            }
            assert!(start.elapsed() < limit, "job {id} not done within {limit:?}: {j}");
            std::thread::sleep(Duration::from_millis(100));
        }
        self.say(&format!("job {id} COMPLETED, exit code 0:0 ({:.2} s)", start.elapsed().as_secs_f64()));
        self.wait("all nodes idle again", Duration::from_secs(30), || self.all_idle());
    }

    /// The prolog and the epilog of job `id` ran on every node, with SPANK_HIVEFS
    /// `spank`, and exited 0 (the wrappers' records).
    fn assert_scripts_ran(&self, id: u32, spank: &str) {
        let text = std::fs::read_to_string(self.w("events")).unwrap_or_default();
        let mut got: Vec<&str> = text.lines().filter(|l| l.split(' ').nth(2) == Some(&id.to_string())).collect();
        got.sort();
        let mut want: Vec<String> = ["epilog", "prolog"]
            .iter()
            .flat_map(|k| NODES.map(|n| format!("{k} {n} {id} {spank} n[1-3] {n} exit 0")))
            .collect();
        want.sort();
        assert_eq!(got, want, "prolog and epilog runs of job {id}");
    }

    /// What job `id` wrote to `$R/file`.
    fn result(&self, id: u32, file: &str) -> String {
        let p = self.w("results").join(id.to_string()).join(file);
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    }

    /// [`Cluster::result`] as sorted lines (one per task of an srun).
    fn result_lines(&self, id: u32, file: &str) -> Vec<String> {
        let mut v: Vec<String> = self.result(id, file).lines().map(str::to_string).collect();
        v.sort();
        v
    }

    /// The prolog/epilog log of `node` (commands run, their output and exit codes).
    fn hivefs_log(&self, node: &str) -> String {
        std::fs::read_to_string(self.bed.own(node, "slurm").join("hivefs.log")).unwrap_or_default()
    }

    /// Nothing of a job's file system is left on host `i`: no hivefs process, no FUSE
    /// mount, no data, no mount point, no ond state.
    fn assert_clean(&self, i: usize) {
        let node = &self.bed.hosts[i].name;
        assert_eq!(self.bed.hivefs_pids(i), Vec::<String>::new(), "hivefs processes left on {node}");
        assert_eq!(self.bed.fuse_mounts(i), Vec::<String>::new(), "FUSE mounts left on {node}");
        for dir in ["data", "mnt", "state"] {
            let left: Vec<_> = std::fs::read_dir(self.bed.own(node, dir))
                .map(|rd| rd.flatten().map(|e| e.file_name()).collect())
                .unwrap_or_default();
            assert!(left.is_empty(), "{dir} left on {node}: {left:?}");
        }
    }

    /// On failure: what every daemon, script and job said.
    fn dump_logs(&self) {
        let mut files: Vec<(String, PathBuf, usize)> = vec![
            ("munged".into(), self.w("munged.err"), 20),
            ("events (prolog/epilog runs)".into(), self.w("events"), 100),
        ];
        for h in &self.bed.hosts {
            let d = self.bed.own(&h.name, "slurm");
            for f in ["slurmctld.log", "slurmd.log", "out.err", "hivefs.log"] {
                if d.join(f).exists() {
                    files.push((format!("{} {f}", h.name), d.join(f), 80));
                }
            }
            // Logs of the ond services still there (a stop that did not finish).
            for e in walk(&self.bed.own(&h.name, "state")) {
                if e.extension().is_some_and(|x| x == "log") {
                    files.push((format!("{} {}", h.name, e.display()), e, 30));
                }
            }
        }
        for e in walk(&self.w("jobs")).into_iter().chain(walk(&self.w("results"))) {
            if e.extension().is_none_or(|x| x != "sh") {
                files.push((e.display().to_string(), e, 40));
            }
        }
        for (label, path, n) in files {
            eprintln!("----- {label} (last {n} lines) -----\n{}", tail(&path, n));
        }
    }
}

/// Files under `dir`, recursively.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut v = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                v.extend(walk(&p));
            } else {
                v.push(p);
            }
        }
    }
    v.sort();
    v
}

#[test]
fn a_job_with_hivefs_gets_its_own_file_system_on_every_node_and_leaves_nothing_behind() {
    let c = Cluster::start();
    let hivefs = common::hivefs_bin();
    let mnt = s(&c.bed.mnt());

    // The job's script (on its first node) checks what it got, and every node writes a
    // file that every node then reads back.
    let script = c.job_script(
        "hivefs.sh",
        &format!(
            r#"echo "batch $(hostname) HIVEFS_MOUNT=${{HIVEFS_MOUNT-<unset>}} HIVEFS_NAME=${{HIVEFS_NAME-<unset>}}" >"$R/batch"
m=${{HIVEFS_MOUNT:?no HIVEFS_MOUNT}}
[ "$m" = "{mnt}/job$SLURM_JOB_ID" ] || {{ echo "HIVEFS_MOUNT=$m, not {mnt}/job$SLURM_JOB_ID" >&2; exit 1; }}
grep -q " $m .* - fuse" /proc/self/mountinfo || {{ echo "$m is no FUSE mount here" >&2; exit 1; }}
echo hello >"$m/probe"
{hivefs} entry info --json "$m/probe" >"$R/info.json"
if ! grep -Eq '"chunk_size": 1048576,?$' "$R/info.json" || ! grep -Eq '"stripe_count": 2,?$' "$R/info.json"; then
    echo "probe: not chunk size 1 MiB and stripe 2" >&2
    exit 1
fi
echo "pattern ok" >"$R/pattern"
srun -N 3 -n 3 sh -ec 'f=$HIVEFS_MOUNT/from-$(hostname); head -c 3000000 /dev/urandom >$f.tmp
    sha256sum <$f.tmp >$f.sum; mv $f.tmp $f; echo "wrote $(hostname) $HIVEFS_MOUNT $HIVEFS_NAME"' >"$R/writes"
srun -N 3 -n 3 sh -ec 'for n in n1 n2 n3; do sha256sum <$HIVEFS_MOUNT/from-$n | cmp -s - $HIVEFS_MOUNT/from-$n.sum; done
    echo "read $(hostname) n1 n2 n3"' >"$R/reads"
echo done >"$R/done"
"#
        ),
    );
    let t = Instant::now();
    let a = c.submit(&format!("-N 3 --hivefs=chunk-size=1m,stripe=2 {}", s(&script)));
    c.say(&format!("job {a}: sbatch -N 3 --hivefs=chunk-size=1m,stripe=2"));
    c.wait_completed(a, Duration::from_secs(120));
    c.say(&format!("job {a} done in {:.2} s from submission", t.elapsed().as_secs_f64()));

    // What the job saw.
    assert_eq!(c.result(a, "batch"), format!("batch n1 HIVEFS_MOUNT={mnt}/job{a} HIVEFS_NAME=job{a}\n"));
    let info: serde_json::Value = serde_json::from_str(&c.result(a, "info.json")).unwrap();
    assert_eq!(info["chunk_size"], 1024 * 1024, "{info:#}");
    assert_eq!(info["stripe_count"], 2, "{info:#}");
    assert_eq!(info["targets"].as_array().map(Vec::len), Some(2), "{info:#}");
    let want: Vec<String> = NODES.iter().map(|n| format!("wrote {n} {mnt}/job{a} job{a}")).collect();
    assert_eq!(c.result_lines(a, "writes"), want);
    let want: Vec<String> = NODES.iter().map(|n| format!("read {n} n1 n2 n3")).collect();
    assert_eq!(c.result_lines(a, "reads"), want);
    assert_eq!(c.result(a, "done"), "done\n");

    // The prolog and epilog ran on every node with the job's options; the first node
    // started the instance, and each node's epilog stopped its part through `ond stop
    // --local` (not the epilog's last-resort cleanup).
    c.assert_scripts_ran(a, "chunk-size=1m,stripe=2");
    let log1 = c.hivefs_log("n1");
    let starts: Vec<&str> = log1.lines().filter(|l| l.contains(" ond start ")).collect();
    assert_eq!(starts.len(), 1, "{log1}");
    for f in ["--nodes n1,n2,n3", &format!("--name job{a}"), "--chunk-size=1m", "--stripe=2", "--remote-bin"] {
        assert!(starts[0].contains(f), "{f} not in {}", starts[0]);
    }
    assert!(log1.contains(&format!("started job{a} on n1,n2,n3")), "{log1}");
    for n in NODES {
        let log = c.hivefs_log(n);
        let mine: Vec<&str> = log.lines().filter(|l| l.contains(&format!("job {a} on {n}:"))).collect();
        assert!(mine.iter().any(|l| l.contains("run: ") && l.contains(" ond stop --local ")), "{n}: {log}");
        assert!(mine.iter().any(|l| l.contains("exit 0: ") && l.contains("ond stop")), "{n}: {log}");
        for bad in ["cleaning up by hand", "killing leftover", "lazy unmount", "not clean"] {
            assert!(!log.contains(bad), "{n}: the epilog had to fall back ({bad}):\n{log}");
        }
        if n != "n1" {
            assert!(!log.contains(" ond start "), "{n} ran ond start:\n{log}");
        }
    }
    for i in 0..c.bed.hosts.len() {
        c.assert_clean(i);
    }
    c.say("job with --hivefs: every check passed, every node clean");

    // A job without --hivefs: no file system, no HIVEFS_MOUNT, nothing started.
    let plain = c.job_script(
        "plain.sh",
        &format!(
            r#"srun -N 3 -n 3 sh -c 'echo "$(hostname) HIVEFS_MOUNT=${{HIVEFS_MOUNT-<unset>}} HIVEFS_NAME=${{HIVEFS_NAME-<unset>}} \
mounts=$(grep -c " {mnt}" /proc/self/mountinfo) entries=$(ls -A {mnt} | wc -l)"' >"$R/tasks"
"#
        ),
    );
    let t = Instant::now();
    let b = c.submit(&format!("-N 3 {}", s(&plain)));
    c.wait_completed(b, Duration::from_secs(60));
    c.say(&format!("job {b} (no --hivefs) done in {:.2} s from submission", t.elapsed().as_secs_f64()));
    let want: Vec<String> =
        NODES.iter().map(|n| format!("{n} HIVEFS_MOUNT=<unset> HIVEFS_NAME=<unset> mounts=0 entries=0")).collect();
    assert_eq!(c.result_lines(b, "tasks"), want);
    c.assert_scripts_ran(b, "<unset>");
    for n in NODES {
        let log = c.hivefs_log(n);
        assert!(!log.contains(&format!("job {b} ")), "{n}: the scripts acted for a job without --hivefs:\n{log}");
    }
    for i in 0..c.bed.hosts.len() {
        c.assert_clean(i);
    }
    c.say("job without --hivefs: nothing started");
}
