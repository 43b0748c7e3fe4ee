//! `hivefs fsck [--repair]`: the command line of the file-system check in
//! `hivefs_fsck` (which see for the walks, problems and repairs). Here: the
//! arguments, reaching the file system (starting the services of a stopped
//! `hivefs up` directory for an offline check), progress and text or JSON
//! output, and the exit status.

use crate::admin::{resolve, rt, Conn};
use crate::util::{absolute, pid_alive, read_pid};
use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use hivefs_fsck::{Nodes, Pending, Report};
use hivefs_net::{call_once, ClientConfig};
use hivefs_proto::{Reachability, Reply, Request};
use rustix::process::{kill_process, Pid, Signal};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Args, Debug)]
pub struct FsckArgs {
    #[command(flatten)]
    pub conn: Conn,
    /// Apply the repairs and report what was done.
    #[arg(long)]
    pub repair: bool,
    /// A file system directory of `hivefs up` whose services are stopped: its
    /// services are started (without a mount) for the check and stopped again.
    /// If they are running, the check runs online against them.
    #[arg(long, conflicts_with_all = ["mount", "mgmtd"])]
    pub dir: Option<PathBuf>,
    /// Only list the pending cross-node operations of the metadata nodes
    /// (no check); exits 0 when there are none, 1 otherwise.
    #[arg(long, conflicts_with = "repair")]
    pub pending: bool,
}

/// The count of records scanned, on a terminal's stderr, at most every 200 ms.
struct Progress {
    on: bool,
    last: Instant,
}

impl Progress {
    fn show(&mut self, scanned: u64) {
        if self.on && self.last.elapsed() > Duration::from_millis(200) {
            eprint!("\rfsck: {scanned} records scanned");
            self.last = Instant::now();
        }
    }
    fn done(&self) {
        if self.on {
            eprint!("\r\x1b[K");
        }
    }
}

// ------------------------------------------------------------- offline

/// The services of a stopped `hivefs up` directory, started for the check
/// (no mount) and stopped when this is dropped.
struct OfflineServices {
    children: Vec<(String, Child)>,
}

impl Drop for OfflineServices {
    fn drop(&mut self) {
        // Storage, then metadata, then mgmtd: the reverse of the start order.
        for (name, c) in self.children.iter_mut().rev() {
            // A child process started by this command, not yet reaped.
            let _ = kill_process(Pid::from_child(c), Signal::TERM);
            let start = Instant::now();
            while matches!(c.try_wait(), Ok(None)) {
                if start.elapsed() > Duration::from_secs(10) {
                    eprintln!("fsck: {name} did not stop within 10 s; killing it");
                    let _ = c.kill();
                    let _ = c.wait();
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

fn start_offline(dir: &Path, mgmtd: &str, cfg: &ClientConfig) -> Result<OfflineServices> {
    let layout = crate::up::load_layout(dir)?;
    let secret = dir.join("secret");
    let exe = std::env::current_exe().context("cannot find the hivefs executable")?;
    let mut svc = OfflineServices { children: Vec::new() };
    let rt = rt()?;
    for (name, role, port, sdir) in layout.services(dir) {
        if read_pid(&sdir.join(format!("{name}.pid"))).is_some_and(pid_alive) {
            bail!("{name} of {} runs although mgmtd does not answer; stop it with `hivefs down`", dir.display());
        }
        let listen = format!("{}:{port}", layout.host);
        let args = layout.service_args(role, port, &sdir, &secret);
        let log_path = sdir.join(format!("{name}.log"));
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .with_context(|| format!("cannot open {}", log_path.display()))?;
        let child = Command::new(&exe)
            .args(&args)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("cannot start {name}"))?;
        svc.children.push((name.clone(), child));
        let start = Instant::now();
        loop {
            if rt.block_on(call_once(&listen, cfg, &Request::Ping)).is_ok() {
                break;
            }
            let (_, c) = svc.children.last_mut().expect("just pushed");
            if !matches!(c.try_wait(), Ok(None)) || start.elapsed() > Duration::from_secs(60) {
                bail!("{name} did not come up for the check; see {}", log_path.display());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    // Every target registered and online.
    let want = (layout.storage * layout.targets_per_storage) as usize;
    let start = Instant::now();
    loop {
        let online = match rt.block_on(call_once(mgmtd, cfg, &Request::ListTargets)) {
            Ok(Reply::Targets(t)) => t.iter().filter(|t| t.reachability == Reachability::Online).count(),
            _ => 0,
        };
        if online >= want {
            return Ok(svc);
        }
        if start.elapsed() > Duration::from_secs(60) {
            bail!("only {online} of {want} storage targets of {} came online", dir.display());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

// ------------------------------------------------------------------ main

/// Runs the command; returns the exit status (0 clean, 1 problems left, 2 error).
pub fn fsck(a: FsckArgs) -> i32 {
    match run(a) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("hivefs fsck: {e:#}");
            2
        }
    }
}

fn run(a: FsckArgs) -> Result<i32> {
    let (mgmtd, secret, dir) = match &a.dir {
        Some(d) => {
            let dir = absolute(d)?;
            let layout = crate::up::load_layout(&dir)?;
            let secret = hivefs_net::load_secret(&dir.join("secret")).map_err(|e| anyhow!(e))?;
            (layout.mgmtd_addr(), Some(secret), Some(dir))
        }
        None => {
            let r = resolve(&a.conn)?;
            (r.mgmtd, r.secret, None)
        }
    };
    let cfg = ClientConfig::new(secret);
    let runtime = rt()?;
    let _offline = match &dir {
        Some(d) if runtime.block_on(call_once(&mgmtd, &cfg, &Request::Ping)).is_err() => {
            if !a.conn.json {
                eprintln!("fsck: starting the services of {} (no mount) for the check", d.display());
            }
            Some(start_offline(d, &mgmtd, &cfg)?)
        }
        _ => None,
    };
    if a.pending {
        let pending =
            runtime.block_on(async { hivefs_fsck::pending_ops(&Nodes::connect(&mgmtd, &cfg).await?).await })?;
        if a.conn.json {
            println!("{}", serde_json::to_string_pretty(&pending)?);
        } else {
            print_pending(&pending);
            if pending.is_empty() {
                println!("no pending cross-node operations");
            }
        }
        return Ok(if pending.is_empty() { 0 } else { 1 });
    }
    let mut prog = Progress { on: std::io::stderr().is_terminal(), last: Instant::now() };
    let rep = runtime.block_on(async {
        let nodes = Nodes::connect(&mgmtd, &cfg).await?;
        hivefs_fsck::run(&nodes, a.repair, &mut |n| prog.show(n)).await
    })?;
    prog.done();
    if a.conn.json {
        println!("{}", serde_json::to_string_pretty(&rep)?);
    } else {
        print_report(&rep, a.repair);
    }
    Ok(if rep.left() == 0 { 0 } else { 1 })
}

fn print_report(rep: &Report, repair: bool) {
    for p in &rep.problems {
        let place = match (p.meta_node, p.target) {
            (Some(n), _) => format!("meta node {n}"),
            (_, Some(t)) => format!("target {t}"),
            _ => "-".into(),
        };
        let path = p.path.as_deref().map(|s| format!(" {s}")).unwrap_or_default();
        println!("{:<16} {} {place}{path}: {}", p.kind.as_str(), p.entry, p.detail);
    }
    for r in &rep.repairs {
        println!("{} {}: {}", if r.done { "repaired" } else { "NOT repaired" }, r.entry, r.message);
    }
    print_pending(&rep.pending);
    let scanned = rep.scanned;
    if rep.problems.is_empty() {
        println!("clean: {scanned} records checked, no problems");
    } else {
        let s: Vec<String> = rep.summary.iter().map(|(k, v)| format!("{v} {k}")).collect();
        println!(
            "{} problems ({}); {scanned} records checked{}",
            rep.problems.len(),
            s.join(", "),
            if repair { format!("; {} repaired", rep.repaired()) } else { "; run with --repair to fix them".into() }
        );
    }
}

fn print_pending(pending: &[Pending]) {
    for p in pending {
        println!("pending cross-node operation {}, will be finished by metadata node {}", p.operation, p.meta_node);
    }
}
