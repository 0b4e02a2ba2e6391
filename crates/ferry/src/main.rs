//! ferry: checkpoint and restore live Linux processes.

mod checkpoint_cmd;
mod coverage_cmd;
mod demo;
mod inspect;
mod migrate_cmd;
mod netlock_cmd;
mod progress;
mod replace_cmd;
mod replicate_cmd;
mod restore_cmd;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::sync::atomic::{AtomicI32, Ordering};

#[derive(Parser)]
#[command(
    name = "ferry",
    version,
    about = "Checkpoint a running process tree to an image and restore it, with the same PIDs, memory, threads, files, sockets and shared memory."
)]
struct Cli {
    /// Log what the engine does (also FERRY_LOG=debug).
    #[arg(short, long, global = true)]
    verbose: bool,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Freeze a process and all its descendants, write their complete
    /// state to an image directory, then kill them (or let them run on
    /// with --leave-running). If anything cannot be captured, every
    /// process keeps running untouched.
    Checkpoint(checkpoint_cmd::CheckpointArgs),
    /// Recreate a process tree from an image, with its old PIDs and TIDs,
    /// parent links, sessions and process groups. Without --detach, ferry
    /// stays the root's parent, forwards SIGINT/SIGTERM/SIGHUP to it and
    /// exits with its exit status (128+N if killed by signal N).
    Restore(restore_cmd::RestoreArgs),
    /// Write an image directory to standard output as one byte stream
    /// (the form used to move an image over a socket or pipe).
    Send {
        /// Image directory.
        dir: PathBuf,
    },
    /// Read an image stream from standard input, check every checksum, and
    /// write it as an image directory.
    Receive {
        /// Image directory to create.
        dir: PathBuf,
    },
    /// Show what an image holds; checks every checksum first.
    Inspect {
        /// Image directory.
        dir: PathBuf,
        /// Print the full image metadata as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show or release network locks: the packet filters that hold the TCP
    /// connections of a checkpoint frozen until they are restored.
    NetworkLock(netlock_cmd::NetworkLockArgs),
    /// Write a new shared key for ferryd and `ferry migrate` (mode 0600;
    /// copy it to every host over a trusted channel).
    Keygen {
        /// Key file to create; an existing file is never overwritten.
        file: PathBuf,
    },
    /// Move a running process tree to the host where `ferryd` listens:
    /// its memory is copied while it runs (pre-copy), then it is frozen,
    /// the rest is sent, and it runs on at the destination with its
    /// connections. The source is killed only once the destination reports
    /// the tree running; on any failure it runs on here.
    Migrate(migrate_cmd::MigrateArgs),
    /// Replace a running process tree in place with a fresh copy of
    /// itself: the same PIDs, memory, threads, files and connections in
    /// new kernel objects (a new mm), optionally in a new cgroup, with a
    /// seccomp filter stacked, capabilities dropped or new resource
    /// limits. A trial restore of the new tree runs before the old one is
    /// killed: on any failure before that, the old tree runs on untouched.
    Replace(replace_cmd::ReplaceArgs),
    /// Protect a running process tree with a hot standby on the host
    /// where `ferryd --etcd` listens: its state is synced there whenever
    /// it sends (and at least every --max-interval-ms), and every packet
    /// it sends is held until the standby holds the state that produced
    /// it. When this host dies the standby wins the service in etcd and
    /// runs it from the last sync, with its connections and address.
    /// Runs in the foreground; Ctrl-C or SIGTERM ends the protection
    /// (the service runs on here). Prints "in sync" once the standby
    /// holds a complete copy, then a status line on every change and at
    /// least every 10 s.
    Replicate(replicate_cmd::ReplicateArgs),
    /// What replication does on this host (either side): syncs per
    /// second, added latency, bytes per sync, the standby's state.
    Status(replicate_cmd::StatusArgs),
    /// Live migration on this machine: two test hosts and a client host
    /// (network + PID + mount namespaces on one bridge) with ferryd in
    /// each host, redis-server moved back and forth between them while
    /// clients keep their connections open and count every request; then
    /// a report, and everything it made is removed. Needs root and
    /// redis-server.
    Demo(demo::DemoArgs),
    /// Print what ferry restores, refuses or leaves alone for each kind of
    /// kernel object, from the tables capture consults; --write puts them
    /// into docs/coverage.md, --check says whether that file is current.
    Coverage(coverage_cmd::CoverageArgs),
}

static CHILD: AtomicI32 = AtomicI32::new(0);

extern "C" fn forward(sig: libc::c_int) {
    let pid = CHILD.load(Ordering::Relaxed);
    if pid > 0 {
        // kill is async-signal-safe.
        let _ = ferry_sys::process::kill(pid, sig);
    }
}

pub(crate) fn wait_for(pid: i32) -> Result<i32> {
    CHILD.store(pid, Ordering::Relaxed);
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        ferry_sys::signal::set_handler(sig, forward)
            .map_err(|e| anyhow::anyhow!("forwarding signal {sig}: {e}"))?;
    }
    ferry_sys::process::wait_pid(pid)
        .ok_or_else(|| anyhow::anyhow!("waiting for restored process {pid}: not our child"))
}

fn run(cli: Cli) -> Result<i32> {
    // A network lock whose ferry died while holding it would drop those
    // connections' packets forever; one read_dir when there is none.
    // `network-lock` itself leaves them, so --status can show them.
    if !matches!(cli.cmd, Cmd::NetworkLock(_)) {
        for name in ferry_netlock::release_stale_locks() {
            eprintln!("ferry: released stale network lock {name}");
        }
        // A base whose namespace is gone holds no packet: removing it is
        // housekeeping, not news for the user of this command.
        for name in ferry_netlock::release_dead_bases() {
            tracing::info!(base = %name, "removed the lock base of a namespace that is gone");
        }
    }
    let verbose = cli.verbose;
    match cli.cmd {
        Cmd::Checkpoint(args) => checkpoint_cmd::run(args),
        Cmd::Restore(args) => restore_cmd::run(args),
        Cmd::Send { dir } => {
            let stdout = std::io::stdout();
            let mut out = std::io::BufWriter::with_capacity(1 << 20, stdout.lock());
            let n = ferry_image::dir_to_stream(&dir, &mut out)
                .with_context(|| format!("sending {}", dir.display()))?;
            std::io::Write::flush(&mut out).context("writing to standard output")?;
            eprintln!("sent {} ({n} bytes)", dir.display());
            Ok(0)
        }
        Cmd::Receive { dir } => {
            let stdin = std::io::stdin();
            let mut input = std::io::BufReader::with_capacity(1 << 20, stdin.lock());
            let (_, tree, pages) = ferry_image::read_stream(&mut input, Some(&dir))
                .with_context(|| format!("receiving into {}", dir.display()))?;
            let root = tree.root().map_or(0, |p| p.pid);
            eprintln!(
                "received pid {root} ({} processes, {} bytes of pages) into {}",
                tree.processes.len(),
                pages.len(),
                dir.display()
            );
            Ok(0)
        }
        Cmd::Inspect { dir, json } => {
            inspect::show(&dir, json)?;
            Ok(0)
        }
        Cmd::NetworkLock(args) => netlock_cmd::run(args),
        Cmd::Keygen { file } => {
            ferry_transport::Key::write_new(&file)
                .with_context(|| format!("writing key file {}", file.display()))?;
            eprintln!("wrote a new key to {} (mode 0600): copy it to every host that migrates with this one", file.display());
            Ok(0)
        }
        Cmd::Migrate(args) => migrate_cmd::run(args),
        Cmd::Replace(args) => replace_cmd::run(args, verbose),
        Cmd::Replicate(args) => replicate_cmd::run(args),
        Cmd::Status(args) => replicate_cmd::status(args),
        Cmd::Demo(args) => demo::run(args),
        Cmd::Coverage(args) => coverage_cmd::run(args),
    }
}

/// Descriptor numbers ferry's table has room for from the start.
const FD_TABLE_ROOM: i32 = 1024;

/// Grows this process's descriptor table to [`FD_TABLE_ROOM`] entries
/// while it is still single-threaded. The kernel grows a table shared by
/// several threads only after an RCU grace period (expand_fdtable), and
/// a restore or checkpoint opens its 65th descriptor with threads
/// running: that wait was 1-20 ms of the tiny listener's restore. A
/// table grown here costs nothing more later. Best effort.
fn grow_fd_table() {
    use std::os::fd::AsRawFd;
    let Ok(null) = std::fs::File::open("/dev/null") else {
        return;
    };
    // Dropped at once: the table keeps its size.
    let _ = ferry_sys::fd::dup_above(null.as_raw_fd(), FD_TABLE_ROOM - 1);
}

fn main() {
    grow_fd_table();
    let cli = Cli::parse();
    let filter = if cli.verbose {
        "debug".to_string()
    } else {
        std::env::var("FERRY_LOG").unwrap_or_else(|_| "warn".into())
    };
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .without_time()
        .init();
    match run(cli) {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("ferry: error: {e:#}");
            std::process::exit(1);
        }
    }
}
