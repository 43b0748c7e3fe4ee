//! `hivefs bench io|md --processes N`: the ranks spread over N processes of
//! this program, each running its share as threads (`io::run_part`,
//! `md::run_part`).
//!
//! The parent prepares the run directory, starts the children with the same
//! arguments plus `--part I/N --run-dir DIR`, and drives the phases over their
//! stdin and stdout, one line each way per step: a child prints `ready P`
//! before phase P and starts it when it reads `go`; prints `done P` after it;
//! and at the end `result <json>` (its ranks' spans in Unix seconds). So every
//! phase starts in all processes together, caches are dropped by the parent
//! between the phases while no rank works, and the aggregate is Equation 1
//! over all ranks of all processes. A child that fails ends the run; the
//! others are killed.

use anyhow::{anyhow, bail, Context, Result};
use hivefs_bench::ranks::{self, Driver, Merged, Part, PartResult, PhaseSync};
use hivefs_bench::BenchError;
use std::io::{BufRead, BufReader, Lines, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

/// Where the ranks run: `--processes`, and the internal arguments of a child.
#[derive(clap::Args, Debug, Default)]
pub struct ProcArgs {
    /// Spread the ranks over this many processes, each running its share as threads
    /// (--ranks 8 --processes 4: 4 processes of 2 threads); every phase starts in all of them
    /// together.
    #[arg(long, default_value_t = 1)]
    pub processes: u32,
    /// Internal: run part I/N of the ranks for a parent `--processes` run.
    #[arg(long, hide = true, requires = "run_dir")]
    pub part: Option<String>,
    /// Internal: the prepared run directory of a `--part` run.
    #[arg(long, hide = true)]
    pub run_dir: Option<String>,
    /// Internal: the part runs in the `--compare-dir` run.
    #[arg(long, hide = true)]
    pub part_in_compare_dir: bool,
}

impl ProcArgs {
    /// The part this process runs when it is a child: (part, run directory).
    pub fn child(&self, ranks: u32) -> Result<Option<(Part, &str)>> {
        match (&self.part, &self.run_dir) {
            (Some(part), Some(dir)) => Ok(Some((parse_part(part, ranks)?, dir.as_str()))),
            _ => Ok(None),
        }
    }
}

/// Parses `--part I/N`.
fn parse_part(s: &str, ranks: u32) -> Result<Part> {
    let (i, n) = s.split_once('/').ok_or_else(|| anyhow!("--part {s}: expected I/N"))?;
    let (i, n): (u32, u32) = (i.parse()?, n.parse()?);
    if n == 0 || i >= n || n > ranks {
        bail!("--part {s}: needs 0 <= I < N <= ranks ({ranks})");
    }
    Ok(Part::of(ranks, i, n))
}

/// A child's side of the phase steps: its stdout and stdin.
struct StdioSync {
    input: Lines<std::io::StdinLock<'static>>,
}

impl StdioSync {
    fn say(&self, line: &str) -> hivefs_bench::Result<()> {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{line}")
            .and_then(|()| out.flush())
            .map_err(|e| hivefs_bench::BenchError::io("telling the parent", e))
    }
}

impl PhaseSync for StdioSync {
    fn ready(&mut self, phase: usize) -> hivefs_bench::Result<()> {
        self.say(&format!("ready {phase}"))?;
        match self.input.next() {
            Some(Ok(l)) if l == "go" => Ok(()),
            other => Err(hivefs_bench::BenchError::Invalid(format!("expected `go` from the parent, got {other:?}"))),
        }
    }

    fn done(&mut self, phase: usize) -> hivefs_bench::Result<()> {
        self.say(&format!("done {phase}"))
    }
}

/// Runs one part as a child of a [`Procs`] parent: `work` runs the phases on the
/// parent's word; its result goes to stdout.
pub(crate) fn run_child(work: impl FnOnce(&mut dyn PhaseSync) -> hivefs_bench::Result<PartResult>) -> Result<()> {
    let mut sync = StdioSync { input: std::io::stdin().lock().lines() };
    let r = work(&mut sync)?;
    sync.say(&format!("result {}", serde_json::to_string(&r)?))?;
    Ok(())
}

struct Kid {
    child: Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
}

/// The children of a `--processes` run, driven phase by phase. Any child still
/// running when this is dropped (after a failure) is killed.
pub(crate) struct Procs {
    kids: Vec<Kid>,
    progress: bool,
    what: String,
}

impl Drop for Procs {
    fn drop(&mut self) {
        for k in &mut self.kids {
            if matches!(k.child.try_wait(), Ok(None)) {
                let _ = k.child.kill();
            }
            let _ = k.child.wait();
        }
    }
}

impl Procs {
    /// Starts `n` children of this program with this process's arguments plus
    /// `--part I/N --run-dir DIR` (and `extra`).
    pub fn start(n: u32, ranks: u32, dir: &str, extra: &[&str], what: &str, progress: bool) -> Result<Procs> {
        if n > ranks {
            bail!("--processes {n} is more than --ranks {ranks}: every process runs at least one rank");
        }
        let exe = std::env::current_exe().context("cannot find the hivefs executable")?;
        let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
        let mut procs = Procs { kids: Vec::new(), progress, what: what.to_string() };
        for i in 0..n {
            let mut child = Command::new(&exe)
                .args(&args)
                .args(["--part", &format!("{i}/{n}"), "--run-dir", dir])
                .args(extra)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .with_context(|| format!("cannot start process {} of {n}", i + 1))?;
            let stdin = child.stdin.take().expect("piped");
            let lines = BufReader::new(child.stdout.take().expect("piped")).lines();
            procs.kids.push(Kid { child, stdin, lines });
        }
        Ok(procs)
    }

    /// The next line of child `i`, which must start with `want`; returns the rest.
    fn expect(&mut self, i: usize, want: &str) -> Result<String> {
        let n = self.kids.len();
        let k = &mut self.kids[i];
        match k.lines.next() {
            Some(Ok(l)) if l.starts_with(want) => Ok(l[want.len()..].trim_start().to_string()),
            Some(Ok(l)) => bail!("process {} of {n}: expected `{want}`, got `{l}`", i + 1),
            Some(Err(e)) => bail!("process {} of {n}: {e}", i + 1),
            None => {
                let st = k.child.wait().map(|s| s.to_string()).unwrap_or_else(|e| e.to_string());
                bail!("process {} of {n} (pid {}) ended before `{want}` ({st})", i + 1, k.child.id())
            }
        }
    }

    /// CPU seconds the children have used so far.
    pub fn cpu_s(&self) -> f64 {
        self.kids.iter().filter_map(|k| hivefs_bench::cpu::pid_cpu_s(k.child.id() as i32)).sum()
    }

    /// Phase `ph`: waits until every child is ready, runs `before`, starts the
    /// phase in all, waits until all are done, runs `after`.
    pub fn phase(
        &mut self,
        ph: usize,
        name: &str,
        before: impl FnOnce(f64) -> Result<()>,
        after: impl FnOnce(f64) -> Result<()>,
    ) -> Result<()> {
        for i in 0..self.kids.len() {
            self.expect(i, &format!("ready {ph}"))?;
        }
        hivefs_bench::check_interrupted()?;
        before(self.cpu_s())?;
        if self.progress {
            eprintln!("{} {name}: {} processes", self.what, self.kids.len());
        }
        for k in &mut self.kids {
            writeln!(k.stdin, "go").and_then(|()| k.stdin.flush()).context("starting a phase")?;
        }
        for i in 0..self.kids.len() {
            self.expect(i, &format!("done {ph}"))?;
        }
        after(self.cpu_s())
    }

    /// The children's results, after the last phase, merged.
    pub fn finish(&mut self, phases: usize) -> Result<Merged> {
        let n = self.kids.len();
        let mut parts: Vec<PartResult> = Vec::new();
        for i in 0..n {
            let json = self.expect(i, "result")?;
            parts.push(serde_json::from_str(&json).with_context(|| format!("process {} of {n}: its result", i + 1))?);
        }
        for (i, k) in self.kids.iter_mut().enumerate() {
            let st = k.child.wait()?;
            if !st.success() {
                bail!("process {} of {n} failed ({st})", i + 1);
            }
        }
        Ok(ranks::merge(parts, phases))
    }
}

impl Driver for Procs {
    fn run(
        &mut self,
        phases: &[&str],
        before: &mut dyn FnMut(usize, f64) -> hivefs_bench::Result<()>,
        after: &mut dyn FnMut(usize, f64) -> hivefs_bench::Result<()>,
    ) -> hivefs_bench::Result<Merged> {
        let mut run = |p: &mut Procs| -> Result<Merged> {
            for (ph, name) in phases.iter().enumerate() {
                p.phase(ph, name, |cpu| Ok(before(ph, cpu)?), |cpu| Ok(after(ph, cpu)?))?;
            }
            p.finish(phases.len())
        };
        // The library's own errors (an interruption, a hook's failure) as they were.
        run(self).map_err(|e| e.downcast::<BenchError>().unwrap_or_else(|e| BenchError::Driver(format!("{e:#}"))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_are_checked() {
        assert_eq!(parse_part("1/3", 7).unwrap(), Part { first: 3, count: 2 });
        for bad in ["3/3", "0/0", "1", "a/2", "0/8"] {
            assert!(parse_part(bad, 7).is_err(), "{bad}");
        }
    }
}
