//! The `hivefs` binary: one executable for every role (services, mount,
//! on-demand file systems, admin). It parses arguments and calls the
//! libraries; it holds no file-system logic of its own.

mod admin;
mod bench;
mod bench_args;
mod bench_procs;
mod bench_sweep;
mod cp;
mod events;
mod fsck;
mod mirror;
mod notify;
mod ond;
mod pools;
mod quota;
mod services;
mod stats;
mod up;
mod util;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(name = "hivefs", version, about = "HiveFS: a parallel file system for HPC and AI clusters")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Start a whole file system on this machine (mgmtd, metadata, storage, mount) and return once it is mounted.
    Up(up::UpArgs),
    /// Unmount and stop everything `hivefs up` started in --dir (data is kept).
    Down(up::DownArgs),
    /// Show what runs where for a file system started by `hivefs up`.
    Status(up::StatusArgs),
    /// Run the management service (registry of nodes and targets, heartbeats).
    Mgmtd(services::MgmtdArgs),
    /// Run a metadata service (one metadata target: part of the namespace).
    Meta(services::MetaArgs),
    /// Run a storage service (one or more storage targets holding chunk files), or format targets with --init.
    Storage(services::StorageArgs),
    /// Mount a HiveFS with FUSE (in the foreground, until unmounted or signalled).
    Mount(services::MountArgs),
    /// List the metadata and storage nodes with their state.
    Nodes(admin::Conn),
    /// List the storage targets with node, space and state.
    Targets(admin::Conn),
    /// Entry commands.
    #[command(subcommand)]
    Entry(admin::EntryCmd),
    /// Stripe pattern of directories.
    #[command(subcommand)]
    Pattern(admin::PatternCmd),
    /// Storage pools: named sets of targets that directories stripe over.
    #[command(subcommand)]
    Pool(pools::PoolCmd),
    /// User and group quotas on space and inodes: set limits, list usage.
    #[command(subcommand)]
    Quota(quota::QuotaCmd),
    /// Buddy groups: pairs of storage targets or metadata nodes that mirror each other.
    #[command(subcommand)]
    Mirror(mirror::MirrorCmd),
    /// Space and inodes of every metadata node and storage target, with capacity pools and totals per storage pool.
    Df(admin::Conn),
    /// Check the whole file system (every metadata node and storage target) for inconsistencies; --repair fixes them.
    /// Exit status: 0 clean (or all repaired), 1 problems left, 2 error.
    Fsck(fsck::FsckArgs),
    /// File-system modification events of every metadata node (create, mkdir, unlink,
    /// rename, setattr, close after write, ...), in commit order per node; --follow for
    /// new ones as they happen.
    Events(events::EventsArgs),
    /// A live view of operations/s and bytes/s per node and per storage target, or per
    /// user (--per-user) or client (--per-client), from the servers' counters.
    Stats(stats::StatsArgs),
    /// On-demand file systems across the nodes of a job (over ssh): start, stop, status.
    #[command(subcommand)]
    Ond(ond::OndCmd),
    /// Built-in benchmarks: StorageBench, NetBench, IOR-like I/O and mdtest-like metadata runs.
    #[command(subcommand)]
    Bench(bench::BenchCmd),
    // Its help is the doc comment of `cp::CpArgs` (a short line and a long one).
    Cp(cp::CpArgs),
}

/// One malloc arena for the whole process. By default glibc gives threads
/// up to 8 arenas per core, and memory freed into one thread's arena is not
/// reused by another: the metadata node, whose store cache churns 4 KiB pages
/// across its threads, grew from 89 MiB to 168 MiB listing a directory of
/// 1,000,000 entries three times (two arenas: 87 to 141 MiB); with one it
/// stays at 89 MiB (tests/bigdir.rs). Small allocations still go through
/// glibc's per-thread caches without the arena lock. An explicit
/// `MALLOC_ARENA_MAX` in the environment is left to glibc.
#[allow(unsafe_code)] // mallopt: neither rustix nor nix wraps it
fn limit_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        // SAFETY: called first thing in main, before any other thread exists.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, 1);
        }
    }
}

/// Commands that only report let a closed stdout end them quietly, as other
/// Unix tools do (`hivefs targets | head -1`), instead of panicking in
/// `println!`. Services, `up`, `down` and `fsck` keep ignoring SIGPIPE: they
/// must not die half-way through their work because a reader went away.
#[allow(unsafe_code)] // rustix has no signal dispositions; nix's `signal` is unsafe too
fn quiet_broken_pipe(cmd: &Cmd) {
    let reports_only = !matches!(
        cmd,
        Cmd::Up(_)
            | Cmd::Down(_)
            | Cmd::Mgmtd(_)
            | Cmd::Meta(_)
            | Cmd::Storage(_)
            | Cmd::Mount(_)
            | Cmd::Fsck(_)
            | Cmd::Ond(_)
    );
    if reports_only {
        // SAFETY: restores the default disposition before any other thread exists.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
}

extern "C" fn on_interrupt(_: libc::c_int) {
    hivefs_bench::interrupt();
}

/// Benchmarks stop at the first SIGINT or SIGTERM and remove their files (and a
/// sweep its extra mounts) before exiting; a second signal ends them at once.
#[allow(unsafe_code)] // rustix has no signal handlers; nix's `sigaction` is unsafe too
fn graceful_interrupt() {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: a zeroed sigaction with a handler that only stores to an atomic
        // (async-signal-safe); SA_RESETHAND restores the default after one signal.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_interrupt as *const () as usize;
            sa.sa_flags = libc::SA_RESETHAND;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

fn main() {
    limit_malloc_arenas();
    let cli = Cli::parse();
    quiet_broken_pipe(&cli.cmd);
    if matches!(cli.cmd, Cmd::Bench(_)) {
        graceful_interrupt();
    }
    let r = match cli.cmd {
        Cmd::Up(a) => up::up(a),
        Cmd::Down(a) => up::down(a),
        Cmd::Status(a) => up::status(a),
        Cmd::Mgmtd(a) => services::run_mgmtd(a),
        Cmd::Meta(a) => services::run_meta(a),
        Cmd::Storage(a) => services::run_storage(a),
        Cmd::Mount(a) => services::run_mount(a),
        Cmd::Nodes(c) => admin::nodes(c),
        Cmd::Targets(c) => admin::targets(c),
        Cmd::Entry(c) => admin::entry(c),
        Cmd::Pattern(c) => admin::pattern(c),
        Cmd::Pool(c) => pools::pool(c),
        Cmd::Quota(c) => quota::quota(c),
        Cmd::Mirror(c) => mirror::mirror(c),
        Cmd::Df(c) => pools::df(c),
        Cmd::Fsck(a) => std::process::exit(fsck::fsck(a)),
        Cmd::Bench(c) => bench::bench(c),
        Cmd::Ond(c) => ond::ond(c),
        Cmd::Stats(a) => stats::stats(a),
        Cmd::Events(a) => events::events(a),
        Cmd::Cp(a) => cp::cp(a),
    };
    if let Err(e) = r {
        eprintln!("hivefs: {e:#}");
        // As a shell reports a command ended by SIGINT.
        std::process::exit(if hivefs_bench::interrupted() { 130 } else { 1 });
    }
}
