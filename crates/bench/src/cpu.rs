//! CPU time of this process (`getrusage`) and of the HiveFS services of a
//! file system started by `hivefs up --dir DIR` (their pid files, then
//! `/proc/<pid>/stat`), so that a benchmark can report CPU time per
//! operation; and the services' resident memory (`/proc/<pid>/status`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// User plus system CPU seconds of this process so far.
pub fn self_cpu_s() -> f64 {
    use nix::sys::resource::{getrusage, UsageWho};
    let Ok(r) = getrusage(UsageWho::RUSAGE_SELF) else { return 0.0 };
    let tv = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 + t.tv_usec() as f64 / 1e6;
    tv(r.user_time()) + tv(r.system_time())
}

/// User plus system CPU seconds of process `pid` from `/proc/<pid>/stat`.
pub fn pid_cpu_s(pid: i32) -> Option<f64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat_cpu_ticks(&s).map(|ticks| ticks as f64 / clock_ticks())
}

fn clock_ticks() -> f64 {
    let t = rustix::param::clock_ticks_per_second();
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// utime + stime (fields 14 and 15) of a `/proc/<pid>/stat` line. The
/// command name (field 2) may hold spaces and parentheses, so fields are
/// counted after its last `)`.
pub fn parse_stat_cpu_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After ")": field 3 (state) is f[0], so field n is f[n - 3].
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// Resident memory of process `pid` now and at its peak, in KiB
/// (`VmRSS` and `VmHWM` of `/proc/<pid>/status`).
pub fn pid_memory_kib(pid: i32) -> Option<(u64, u64)> {
    parse_status_memory(&std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?)
}

/// (`VmRSS`, `VmHWM`) in KiB of a `/proc/<pid>/status` text.
pub fn parse_status_memory(status: &str) -> Option<(u64, u64)> {
    let field = |name: &str| {
        status.lines().find_map(|l| l.strip_prefix(name)?.trim().strip_suffix("kB")?.trim().parse::<u64>().ok())
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

/// The services of a `hivefs up` directory: name → pid, from
/// `<dir>/<service>/<service>.pid` and `<dir>/client/mount.pid`.
pub fn up_service_pids(dir: &Path) -> BTreeMap<String, i32> {
    let mut out = BTreeMap::new();
    let Ok(rd) = std::fs::read_dir(dir) else { return out };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let pidfile: PathBuf =
            if name == "client" { e.path().join("mount.pid") } else { e.path().join(format!("{name}.pid")) };
        let pid = std::fs::read_to_string(&pidfile).ok().and_then(|s| s.trim().parse::<i32>().ok());
        if let Some(pid) = pid.filter(|&p| p > 0 && pid_cpu_s(p).is_some()) {
            out.insert(if name == "client" { "mount".to_string() } else { name }, pid);
        }
    }
    out
}

/// CPU seconds of a set of processes at one moment.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    pub this_process_s: f64,
    pub services_s: BTreeMap<String, f64>,
}

impl Snapshot {
    pub fn take(services: &BTreeMap<String, i32>) -> Snapshot {
        Snapshot {
            this_process_s: self_cpu_s(),
            services_s: services.iter().filter_map(|(n, &p)| pid_cpu_s(p).map(|s| (n.clone(), s))).collect(),
        }
    }

    /// CPU microseconds per operation between `self` and a later snapshot,
    /// for this process and per service.
    pub fn per_op_us(&self, later: &Snapshot, ops: u64) -> (f64, BTreeMap<String, f64>) {
        let per = |d: f64| if ops > 0 { d * 1e6 / ops as f64 } else { 0.0 };
        let svc = later
            .services_s
            .iter()
            .filter_map(|(n, &v)| self.services_s.get(n).map(|&b| (n.clone(), per(v - b))))
            .collect();
        (per(later.this_process_s - self.this_process_s), svc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_after_the_command_name() {
        let line = "1234 (hivefs (x) y) S 1 2 3 4 5 6 7 8 9 10 250 75 0 0 20 0 4 0";
        assert_eq!(parse_stat_cpu_ticks(line), Some(325));
        assert_eq!(parse_stat_cpu_ticks("garbage"), None);
    }

    #[test]
    fn memory_fields_of_a_status_file() {
        let status = "Name:\thivefs\nVmPeak:\t  900 kB\nVmHWM:\t   5120 kB\nVmRSS:\t   4096 kB\n";
        assert_eq!(parse_status_memory(status), Some((4096, 5120)));
        assert_eq!(parse_status_memory("Name:\tkthread\n"), None);
        let (rss, peak) = pid_memory_kib(std::process::id() as i32).unwrap();
        assert!(rss > 0 && peak >= rss, "rss {rss} peak {peak}");
    }

    #[test]
    fn own_cpu_time_is_readable_both_ways() {
        let mut x = 0u64;
        for i in 0..2_000_000u64 {
            x = x.wrapping_add(i * i);
        }
        assert!(x > 0);
        assert!(self_cpu_s() > 0.0);
        assert!(pid_cpu_s(std::process::id() as i32).is_some());
    }

    #[test]
    fn pid_files_of_an_up_dir() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("meta1")).unwrap();
        std::fs::write(d.path().join("meta1/meta1.pid"), format!("{}\n", std::process::id())).unwrap();
        std::fs::create_dir(d.path().join("client")).unwrap();
        std::fs::write(d.path().join("client/mount.pid"), "not a pid").unwrap();
        let pids = up_service_pids(d.path());
        assert_eq!(pids.len(), 1);
        assert_eq!(pids["meta1"], std::process::id() as i32);
    }
}
