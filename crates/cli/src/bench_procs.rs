//! `hivefs bench io --processes N`: the ranks spread over N processes of this
//! program, each running its share as threads (`hivefs_bench::io::run_part`).
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
use hivefs_bench::backend::Backend;
use hivefs_bench::io::{self, IoParams, IoReport, Part, PartResult, PhaseSync};
use hivefs_bench::Span;
use std::io::{BufRead, BufReader, Lines, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

/// Parses `--part I/N`.
pub(crate) fn parse_part(s: &str, ranks: u32) -> Result<Part> {
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

/// Runs one part as a child of [`run`]: phases on the parent's word, the result on stdout.
pub(crate) fn run_child(b: &dyn Backend, p: &IoParams, dir: &str, part: Part) -> Result<()> {
    let mut sync = StdioSync { input: std::io::stdin().lock().lines() };
    let r = io::run_part(b, p, dir, part, Some(&mut sync), false)?;
    sync.say(&format!("result {}", serde_json::to_string(&r)?))?;
    Ok(())
}

struct Kid {
    child: Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
}

/// The children; any still running when this is dropped (after a failure) are killed.
struct Kids(Vec<Kid>);

impl Drop for Kids {
    fn drop(&mut self) {
        for k in &mut self.0 {
            if matches!(k.child.try_wait(), Ok(None)) {
                let _ = k.child.kill();
            }
            let _ = k.child.wait();
        }
    }
}

impl Kids {
    /// The next line of child `i`, which must start with `want`; returns the rest.
    fn expect(&mut self, i: usize, want: &str) -> Result<String> {
        let n = self.0.len();
        let k = &mut self.0[i];
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
}

/// The whole run over `n` processes, as a report of all ranks.
pub(crate) fn run(b: &dyn Backend, p: &IoParams, n: u32, progress: bool) -> Result<IoReport> {
    if n > p.ranks {
        bail!("--processes {n} is more than --ranks {}: every process runs at least one rank", p.ranks);
    }
    let dir = io::run_dir();
    let cleanup = io::prepare(b, p, &dir)?;
    let exe = std::env::current_exe().context("cannot find the hivefs executable")?;
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    let mut kids = Kids(Vec::new());
    for i in 0..n {
        let mut child = Command::new(&exe)
            .args(&args)
            .args(["--part", &format!("{i}/{n}"), "--run-dir", &dir])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("cannot start process {} of {n}", i + 1))?;
        let stdin = child.stdin.take().expect("piped");
        let lines = BufReader::new(child.stdout.take().expect("piped")).lines();
        kids.0.push(Kid { child, stdin, lines });
    }
    for (ph, name) in ["write", "read"].into_iter().enumerate() {
        for i in 0..kids.0.len() {
            kids.expect(i, &format!("ready {ph}"))?;
        }
        if ph == 1 && p.drop_caches {
            io::drop_caches()?;
        }
        if progress {
            eprintln!("io {} {name}: {} ranks in {n} processes", p.mode(), p.ranks);
        }
        for k in &mut kids.0 {
            writeln!(k.stdin, "go").and_then(|()| k.stdin.flush()).context("starting a phase")?;
        }
        for i in 0..kids.0.len() {
            kids.expect(i, &format!("done {ph}"))?;
        }
    }
    let mut parts: Vec<PartResult> = Vec::new();
    for i in 0..kids.0.len() {
        let json = kids.expect(i, "result")?;
        parts.push(serde_json::from_str(&json).with_context(|| format!("process {} of {n}: its result", i + 1))?);
    }
    for (i, k) in kids.0.iter_mut().enumerate() {
        let st = k.child.wait()?;
        if !st.success() {
            bail!("process {} of {n} failed ({st})", i + 1);
        }
    }
    parts.sort_by_key(|r| r.part_first);
    let mut spans: [Vec<Span>; 2] = [Vec::new(), Vec::new()];
    let mut pids = Vec::new();
    for r in &parts {
        for (ph, s) in spans.iter_mut().enumerate() {
            s.extend(&r.spans[ph]);
        }
        pids.extend(std::iter::repeat_n(r.pid, r.spans[0].len()));
    }
    io::check_verified(b, &dir, parts.iter().map(|r| r.verify_errors).sum())?;
    drop(cleanup);
    Ok(IoReport { processes: n, ..io::report(b, p, &dir, &spans, &pids) })
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
