//! Small helpers of the command line: sizes, tables, logging, signals.

use anyhow::{Context, Result};
use rustix::process::{kill_process, test_kill_process, Pid, Signal};
use std::path::{Path, PathBuf};

/// Parses "512k", "1m", "4KiB", "1g", "4096" into bytes (binary units).
pub fn parse_size(s: &str) -> Result<u64> {
    let t = s.trim().to_ascii_lowercase();
    let t = t.trim_end_matches("ib").trim_end_matches('b');
    let (num, mul) = match t.chars().last() {
        Some('k') => (&t[..t.len() - 1], 1u64 << 10),
        Some('m') => (&t[..t.len() - 1], 1 << 20),
        Some('g') => (&t[..t.len() - 1], 1 << 30),
        Some('t') => (&t[..t.len() - 1], 1 << 40),
        _ => (t, 1),
    };
    let n: u64 = num.trim().parse().with_context(|| format!("invalid size {s:?} (examples: 4096, 512k, 1m)"))?;
    n.checked_mul(mul).with_context(|| format!("size {s:?} is too large"))
}

pub fn human(bytes: u64) -> String {
    const U: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = bytes as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < U.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", U[i])
    }
}

/// Prints rows as an aligned text table.
pub fn print_table(header: &[&str], rows: &[Vec<String>]) {
    let mut w: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.len());
        }
    }
    let line = |cells: Vec<&str>| {
        let s: Vec<String> = cells.iter().enumerate().map(|(i, c)| format!("{c:<width$}", width = w[i])).collect();
        println!("{}", s.join("  ").trim_end());
    };
    line(header.to_vec());
    for r in rows {
        line(r.iter().map(|s| s.as_str()).collect());
    }
}

pub fn init_logging(level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("HIVEFS_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_ansi(ansi).with_writer(std::io::stderr).try_init();
}

/// Loads a TOML config file into `T`; unknown keys are an error naming the file.
pub fn load_config<T: serde::de::DeserializeOwned + Default>(path: Option<&Path>) -> Result<T> {
    let Some(p) = path else { return Ok(T::default()) };
    let s = std::fs::read_to_string(p).with_context(|| format!("cannot read config file {}", p.display()))?;
    toml::from_str(&s).map_err(|e| anyhow::anyhow!("config file {}: {e}", p.display()))
}

/// Waits for SIGTERM or SIGINT.
pub async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
    tokio::select! {
        _ = term.recv() => {},
        _ = int.recv() => {},
    }
}

/// The process of a pid file's id; none for ids that are not positive
/// (kill(2) would take them for process groups).
fn process(pid: i32) -> Option<Pid> {
    if pid > 0 {
        Pid::from_raw(pid)
    } else {
        None
    }
}

pub fn pid_alive(pid: i32) -> bool {
    // kill with signal 0 only checks that the process exists.
    process(pid).is_some_and(|p| test_kill_process(p).is_ok()) && !is_zombie(pid)
}

/// Sends `sig` to process `pid` (from a pid file). Whether it arrived is
/// seen by watching the process ([`pid_alive`]).
pub fn send_signal(pid: i32, sig: Signal) {
    if let Some(p) = process(pid) {
        let _ = kill_process(p, sig);
    }
}

fn is_zombie(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| s.rsplit(')').next().map(|r| r.trim_start().starts_with('Z')).unwrap_or(false))
        .unwrap_or(false)
}

pub fn read_pid(path: &Path) -> Option<i32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

pub fn absolute(p: &Path) -> Result<PathBuf> {
    if p.is_absolute() {
        Ok(p.to_path_buf())
    } else {
        Ok(std::env::current_dir()?.join(p))
    }
}

/// Mount points of HiveFS file systems (FUSE mounts whose source is "hivefs"), with their sources.
pub fn hivefs_mounts() -> Vec<(PathBuf, String)> {
    let s = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut out = Vec::new();
    for line in s.lines() {
        let Some((pre, post)) = line.split_once(" - ") else { continue };
        let mut post = post.split(' ');
        let fstype = post.next().unwrap_or("");
        let source = post.next().unwrap_or("");
        if (fstype == "fuse.hivefs" || fstype == "fuse") && source == "hivefs" {
            if let Some(mp) = pre.split(' ').nth(4) {
                out.push((PathBuf::from(mp.replace("\\040", " ")), source.to_string()));
            }
        }
    }
    out
}

pub fn is_mounted(mnt: &Path) -> bool {
    let Ok(c) = std::fs::canonicalize(mnt) else { return false };
    hivefs_mounts().iter().any(|(p, _)| *p == c)
}

/// A size argument that must fit in 32 bits (`what` names it in the error).
pub fn size_u32(s: &str, what: &str) -> Result<u32> {
    let v = parse_size(s)?;
    u32::try_from(v).map_err(|_| anyhow::anyhow!("{what} {s} is too large (at most 4 GiB - 1)"))
}

/// The HiveFS mount holding `path`, if any.
pub fn mount_of(path: &Path) -> Option<PathBuf> {
    let canon = std::fs::canonicalize(path).ok()?;
    hivefs_mounts().into_iter().map(|(m, _)| m).filter(|m| canon.starts_with(m)).max_by_key(|m| m.as_os_str().len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("512k").unwrap(), 512 << 10);
        assert_eq!(parse_size("1M").unwrap(), 1 << 20);
        assert_eq!(parse_size("4KiB").unwrap(), 4096);
        assert_eq!(parse_size("2g").unwrap(), 2 << 30);
        assert!(parse_size("12x").is_err());
        assert!(parse_size("").is_err());
    }
}
