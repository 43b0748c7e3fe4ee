//! `hivefs-testbed`: multi-host test beds (network namespaces on a bridge) by hand.
//! State lives in /run/hivefs-testbed/NAME; see the library documentation.

use anyhow::{anyhow, bail, Context, Result};
use clap::{Parser, Subcommand};
use hivefs_testbed::{parse_rate, sweep_stale, Testbed};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::os::unix::process::CommandExt;
use std::time::Duration;

#[derive(Parser, Debug)]
#[command(
    name = "hivefs-testbed",
    version,
    about = "Multi-host test beds on one machine: each host is a network namespace on a shared bridge",
    long_about = "Multi-host test beds on one machine: each host is a Linux network namespace joined to \
                  a bridge by a veth pair, with its own address in the test bed's /24 (10.231.ID.0/24). \
                  Links can be shaped (tc tbf), cut and healed. Needs root. State: /run/hivefs-testbed/NAME."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Create a test bed with the given hosts; it lives until `destroy`.
    Create {
        /// Test bed name: 1-32 of a-z 0-9 -.
        name: String,
        /// Comma-separated host names (1-32 of a-z 0-9 - each), e.g. mgmtd,meta,s1,s2,c1.
        #[arg(long, value_delimiter = ',', required = true)]
        hosts: Vec<String>,
        /// Record process PID as the owner: the test bed is swept once it exits.
        #[arg(long, hide = true)]
        owner_pid: Option<u32>,
    },
    /// Run a command inside a host's network namespace (it shares this mount namespace, so
    /// FUSE mounts made there are visible everywhere). Exits with the command's status.
    Exec {
        /// Test bed name.
        name: String,
        /// Host name in the test bed.
        host: String,
        /// The command and its arguments (after `--`).
        #[arg(required = true, last = true)]
        cmd: Vec<String>,
    },
    /// Limit a host's link in both directions with tc tbf, e.g. `shape NAME HOST 100mbit`.
    Shape {
        /// Test bed name.
        name: String,
        /// Host name in the test bed.
        host: String,
        /// Rate: 100mbit, 1gbit, 512kbit; or bytes per second: 10mbps.
        rate: String,
    },
    /// Remove a host's link shaping.
    Unshape {
        /// Test bed name.
        name: String,
        /// Host name in the test bed.
        host: String,
    },
    /// Cut a host's link (both veth ends down): nothing passes either way.
    Cut {
        /// Test bed name.
        name: String,
        /// Host name in the test bed.
        host: String,
    },
    /// Restore a cut link.
    Heal {
        /// Test bed name.
        name: String,
        /// Host name in the test bed.
        host: String,
    },
    /// Drop PERCENT % of a host's packets at random, in and out (nftables; 0 removes it).
    Loss {
        /// Test bed name.
        name: String,
        /// Host name in the test bed.
        host: String,
        /// Share of packets to drop, 0 to 100.
        percent: u8,
    },
    /// List the test beds with their subnets, owners and hosts.
    List,
    /// Stop what runs in a test bed and delete its namespaces and state.
    Destroy {
        /// Test bed name.
        name: String,
    },
    /// Remove test beds whose owner process is gone, and unclaimed namespaces.
    Sweep,
    /// Echo every byte received on ADDR back (a TCP peer for reachability checks).
    #[command(hide = true)]
    EchoServer { addr: String },
    /// Connect to ADDR, send a line and expect it echoed back within the timeout.
    #[command(hide = true)]
    Probe {
        addr: String,
        #[arg(long, default_value_t = 2000)]
        timeout_ms: u64,
    },
}

fn main() {
    let cli = Cli::parse();
    if let Err(e) = run(cli.cmd) {
        eprintln!("hivefs-testbed: {e:#}");
        std::process::exit(1);
    }
}

fn run(cmd: Cmd) -> Result<()> {
    match cmd {
        Cmd::Create { name, hosts, owner_pid } => {
            let tb = match owner_pid {
                Some(pid) => Testbed::create_owned_by(&name, pid)?,
                None => Testbed::create(&name)?,
            };
            for h in &hosts {
                if let Err(e) = tb.add_host(h) {
                    let _ = tb.destroy();
                    return Err(e);
                }
            }
            println!("test bed {name}: subnet {}", tb.subnet());
            for h in tb.hosts() {
                println!("  {:<16} {:<15} netns {}", h.name, h.ip, h.netns);
            }
            // A test bed recorded with an owner is that owner's to remove.
            std::mem::forget(tb);
            Ok(())
        }
        Cmd::Exec { name, host, cmd } => {
            let h = Testbed::open(&name)?.host(&host)?;
            let err = h.command(&cmd[0]).args(&cmd[1..]).exec();
            Err(anyhow!("cannot run {:?} on host {host} of test bed {name}: {err}", cmd[0]))
        }
        Cmd::Shape { name, host, rate } => {
            let tb = Testbed::open(&name)?;
            tb.shape(&tb.host(&host)?, parse_rate(&rate)?)
        }
        Cmd::Unshape { name, host } => {
            let tb = Testbed::open(&name)?;
            tb.unshape(&tb.host(&host)?)
        }
        Cmd::Cut { name, host } => {
            let tb = Testbed::open(&name)?;
            tb.cut(&tb.host(&host)?)
        }
        Cmd::Heal { name, host } => {
            let tb = Testbed::open(&name)?;
            tb.heal(&tb.host(&host)?)
        }
        Cmd::Loss { name, host, percent } => {
            let tb = Testbed::open(&name)?;
            tb.loss(&tb.host(&host)?, percent)
        }
        Cmd::List => {
            for n in Testbed::names()? {
                let Ok(tb) = Testbed::open(&n) else { continue };
                let s = tb.summary();
                let owner = match s.owner_pid {
                    None => "made by hand".to_string(),
                    Some(p) if s.owner_alive => format!("owner pid {p}"),
                    Some(p) => format!("owner pid {p} (gone: stale)"),
                };
                println!("{} {} {owner}", s.name, s.subnet);
                for h in s.hosts {
                    println!("  {:<16} {:<15} netns {}", h.name, h.ip, h.netns);
                }
            }
            Ok(())
        }
        Cmd::Destroy { name } => {
            Testbed::open(&name)?.destroy()?;
            println!("test bed {name} destroyed");
            Ok(())
        }
        Cmd::Sweep => {
            for n in sweep_stale()? {
                println!("removed {n}");
            }
            Ok(())
        }
        Cmd::EchoServer { addr } => echo_server(&addr),
        Cmd::Probe { addr, timeout_ms } => probe(&addr, Duration::from_millis(timeout_ms)),
    }
}

fn echo_server(addr: &str) -> Result<()> {
    let l = TcpListener::bind(addr).with_context(|| format!("cannot listen on {addr}"))?;
    for conn in l.incoming() {
        let Ok(mut s) = conn else { continue };
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = s.read(&mut buf) {
                if n == 0 || s.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        });
    }
    Ok(())
}

fn probe(addr: &str, timeout: Duration) -> Result<()> {
    let sa = addr.to_socket_addrs()?.next().ok_or_else(|| anyhow!("{addr}: no address"))?;
    let mut s = TcpStream::connect_timeout(&sa, timeout).with_context(|| format!("cannot connect to {addr}"))?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    let msg = b"hivefs-testbed probe\n";
    s.write_all(msg).with_context(|| format!("cannot send to {addr}"))?;
    let mut back = vec![0u8; msg.len()];
    s.read_exact(&mut back).with_context(|| format!("no echo from {addr}"))?;
    if back != msg {
        bail!("{addr} echoed something else");
    }
    println!("reached {addr}");
    Ok(())
}
