//! Running `hivefs ond node` on the nodes of an instance over OpenSSH: in parallel,
//! never asking for a password (BatchMode), with a connect timeout and a limit on each
//! whole call, so that a dead or unreachable node costs a bounded time and is named.

use anyhow::{anyhow, bail, Context, Result};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The node list of an instance: `--nodes a,b,c` or a node file (one per line, blank
/// lines and `#` comments ignored; a line may carry more words after the name, as
/// MPI host files do, which are ignored).
pub fn parse_nodes(nodes: &[String], nodefile: Option<&Path>) -> Result<Vec<String>> {
    let mut out: Vec<String> = Vec::new();
    if let Some(f) = nodefile {
        let s = std::fs::read_to_string(f).with_context(|| format!("cannot read node file {}", f.display()))?;
        for line in s.lines() {
            let line = line.split('#').next().unwrap_or("").trim();
            if let Some(name) = line.split_whitespace().next() {
                out.push(name.to_string());
            }
        }
    }
    out.extend(nodes.iter().map(|n| n.trim().to_string()).filter(|n| !n.is_empty()));
    if out.is_empty() {
        bail!("no nodes: give --nodes a,b,c or --nodefile FILE");
    }
    for n in &out {
        // Names reach ssh and the nodes' resolvers: no option-like or shell-special names.
        let ok = !n.starts_with('-') && n.chars().all(|c| c.is_ascii_alphanumeric() || "-._:@[]".contains(c));
        if !ok {
            bail!("node name {n:?} is not a host name or address");
        }
    }
    let mut seen = std::collections::HashSet::new();
    if let Some(d) = out.iter().find(|n| !seen.insert(n.as_str())) {
        bail!("node {d} is listed twice");
    }
    Ok(out)
}

/// Quotes `s` for a POSIX shell (the remote side of ssh runs the command through one).
pub fn sh_quote(s: &str) -> String {
    if !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_./=:,@%+".contains(c)) {
        return s.to_string();
    }
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// How to reach the nodes.
#[derive(Clone, Debug)]
pub struct Ssh {
    /// `ssh -F FILE`.
    pub config: Option<PathBuf>,
    pub connect_timeout: Duration,
}

impl Ssh {
    fn command(&self, node: &str, remote: &str) -> Command {
        let mut c = Command::new("ssh");
        if let Some(f) = &self.config {
            c.arg("-F").arg(f);
        }
        c.args(["-o", "BatchMode=yes", "-o"])
            .arg(format!("ConnectTimeout={}", self.connect_timeout.as_secs().max(1)))
            .args(["-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=2", "-T", "--", node, remote]);
        c
    }

    /// Runs `remote` (a shell command line) on `node` with `input` on its standard input,
    /// for at most `limit`. Ok(stdout) when it succeeded; otherwise the reason: ssh's
    /// own error (unreachable, refused, no key), the command's error output, or the limit.
    pub fn run(&self, node: &str, remote: &str, input: &[u8], limit: Duration) -> Result<String, String> {
        let mut child = self
            .command(node, remote)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot run ssh (Debian package openssh-client): {e}"))?;
        let mut stdin = child.stdin.take().expect("piped");
        let input = input.to_vec();
        let writer = std::thread::spawn(move || {
            let _ = stdin.write_all(&input);
        });
        let mut out = child.stdout.take().expect("piped");
        let mut err = child.stderr.take().expect("piped");
        let out_t = std::thread::spawn(move || {
            let mut v = Vec::new();
            let _ = out.read_to_end(&mut v);
            v
        });
        let err_t = std::thread::spawn(move || {
            let mut v = Vec::new();
            let _ = err.read_to_end(&mut v);
            v
        });
        let start = Instant::now();
        let status = loop {
            match child.try_wait() {
                Ok(Some(s)) => break Some(s),
                Ok(None) if start.elapsed() < limit => std::thread::sleep(Duration::from_millis(20)),
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    break None;
                }
            }
        };
        let _ = writer.join();
        let stdout = String::from_utf8_lossy(&out_t.join().unwrap_or_default()).into_owned();
        let stderr = String::from_utf8_lossy(&err_t.join().unwrap_or_default()).trim().to_string();
        match status {
            None => Err(format!("no answer within {}s", limit.as_secs())),
            Some(s) if s.success() => Ok(stdout),
            // ssh's own failure: connection, authentication, host key.
            Some(s) if s.code() == Some(255) => {
                Err(format!("ssh: {}", last_lines(&stderr, 2).if_empty("connection failed (exit 255)")))
            }
            Some(s) => Err(last_lines(&stderr, 12).if_empty(&format!("failed ({s})"))),
        }
    }

    /// [`Ssh::run`] on every node at once; `job(i)` gives node i's command and input.
    pub fn run_all(
        &self,
        nodes: &[String],
        limit: Duration,
        job: impl Fn(usize) -> (String, Vec<u8>) + Sync,
    ) -> Vec<Result<String, String>> {
        std::thread::scope(|s| {
            let handles: Vec<_> = nodes
                .iter()
                .enumerate()
                .map(|(i, node)| {
                    let job = &job;
                    s.spawn(move || {
                        let (remote, input) = job(i);
                        self.run(node, &remote, &input, limit)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err("panicked".into()))).collect()
        })
    }
}

trait IfEmpty {
    fn if_empty(self, alt: &str) -> String;
}

impl IfEmpty for String {
    fn if_empty(self, alt: &str) -> String {
        if self.is_empty() {
            alt.to_string()
        } else {
            self
        }
    }
}

fn last_lines(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Fails with every node's reason when any call failed: "node X: reason".
pub fn all_ok(nodes: &[String], results: Vec<Result<String, String>>, what: &str) -> Result<Vec<String>> {
    let failed: Vec<String> = nodes
        .iter()
        .zip(&results)
        .filter_map(|(n, r)| r.as_ref().err().map(|e| format!("node {n}: {}", e.replace('\n', "\n    "))))
        .collect();
    if !failed.is_empty() {
        return Err(anyhow!("{what} failed on {} of {} nodes:\n  {}", failed.len(), nodes.len(), failed.join("\n  ")));
    }
    Ok(results.into_iter().map(|r| r.unwrap_or_default()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_lists_parse() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("nodes");
        std::fs::write(&f, "# job nodes\nn1 slots=4\n\n  n2\nn3 # spare\n").unwrap();
        assert_eq!(parse_nodes(&[], Some(&f)).unwrap(), ["n1", "n2", "n3"]);
        assert_eq!(parse_nodes(&["a".into(), "10.0.0.2".into()], None).unwrap(), ["a", "10.0.0.2"]);
        assert!(parse_nodes(&[], None).is_err());
        assert!(parse_nodes(&["a".into(), "a".into()], None).unwrap_err().to_string().contains("twice"));
        assert!(parse_nodes(&["-oProxyCommand=x".into()], None).is_err());
        assert!(parse_nodes(&["a;reboot".into()], None).is_err());
        assert!(parse_nodes(&[], Some(&dir.path().join("missing"))).unwrap_err().to_string().contains("missing"));
    }

    #[test]
    fn quoting_survives_a_shell() {
        for s in ["plain", "with space", "it's", "$HOME", "a\"b", "", "*"] {
            let out = Command::new("sh").arg("-c").arg(format!("printf %s {}", sh_quote(s))).output().unwrap();
            assert_eq!(String::from_utf8(out.stdout).unwrap(), s);
        }
    }
}
