//! ferry: checkpoint and restore live Linux processes.

mod demo;
mod inspect;
mod migrate_cmd;
mod netlock_cmd;
mod progress;

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
    Checkpoint {
        /// Root of the tree to capture: this process, its threads and all
        /// its descendants.
        #[arg(long)]
        pid: i32,
        /// Directory to write the image to (created if missing).
        #[arg(long)]
        images: PathBuf,
        /// Keep the process running after the image is written.
        #[arg(long)]
        leave_running: bool,
        /// Write an incremental image over the image in this directory
        /// (taken earlier of the same tree with --leave-running): pages
        /// whose content the parent holds at the same address are left to
        /// it. `ferry restore` of the new image reads the whole chain and
        /// refuses it if a parent changed since.
        #[arg(long, value_name = "DIR")]
        parent: Option<PathBuf>,
        /// A pipe or socket on stdin/stdout/stderr that leads to another
        /// process (a supervisor, a log collector) is recorded as external
        /// and replaced at restore by the --tty-to file, instead of
        /// refusing the checkpoint.
        #[arg(long)]
        external_stdio: bool,
        /// How established TCP connections are held still while they are
        /// captured and until `ferry restore` re-creates them: one eBPF
        /// program with a map of the connections (ebpf), one nftables set
        /// (nftables), or an iptables chain (iptables). The lock stays in
        /// place after the checkpoint; restore releases it.
        #[arg(long, default_value = "ebpf", value_parser = ["ebpf", "nftables", "iptables"])]
        network_lock: String,
    },
    /// Recreate a process tree from an image, with its old PIDs and TIDs,
    /// parent links, sessions and process groups. Without --detach, ferry
    /// stays the root's parent, forwards SIGINT/SIGTERM/SIGHUP to it and
    /// exits with its exit status (128+N if killed by signal N).
    Restore {
        /// Image directory written by `ferry checkpoint` (an incremental
        /// image is restored with its chain of parents).
        #[arg(long)]
        images: PathBuf,
        /// Exit once the process runs; it is re-parented to init (or the
        /// nearest child subreaper).
        #[arg(long)]
        detach: bool,
        /// Write the restored root's PID (as seen from here, also with
        /// --new-pid-ns) to this file once the process runs.
        #[arg(long)]
        pidfile: Option<PathBuf>,
        /// File that replaces descriptors which were terminals (a process
        /// cannot get its old terminal back), and stdio recorded with
        /// `checkpoint --external-stdio`. Created if missing.
        #[arg(long, default_value = "/dev/null")]
        tty_to: String,
        /// Restore into this network namespace: a name from `ip netns`
        /// (/run/netns/NAME) or a path such as /proc/PID/ns/net. Its
        /// sockets are bound there.
        #[arg(long)]
        netns: Option<String>,
        /// Restore into a new PID namespace, so the tree's PIDs can never
        /// be taken: inside it every process has its old PID, a small
        /// `ferry-init` is PID 1 and the tree's root is its child, and
        /// /proc shows the namespace. Without --detach, ferry waits for
        /// that init, which exits with the root's status. An image of a
        /// tree that ran in its own PID namespace is always restored so.
        #[arg(long)]
        new_pid_ns: bool,
    },
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
    /// Live migration on this machine: two test hosts and a client host
    /// (network + PID + mount namespaces on one bridge) with ferryd in
    /// each host, redis-server moved back and forth between them while
    /// clients keep their connections open and count every request; then
    /// a report, and everything it made is removed. Needs root and
    /// redis-server.
    Demo(demo::DemoArgs),
}

static CHILD: AtomicI32 = AtomicI32::new(0);

extern "C" fn forward(sig: libc::c_int) {
    let pid = CHILD.load(Ordering::Relaxed);
    if pid > 0 {
        // kill is async-signal-safe.
        let _ = ferry_sys::process::kill(pid, sig);
    }
}

fn wait_for(pid: i32) -> Result<i32> {
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
        for name in ferry_netlock::release_stale() {
            eprintln!("ferry: released stale network lock {name}");
        }
    }
    match cli.cmd {
        Cmd::Checkpoint { pid, images, leave_running, parent, external_stdio, network_lock } => {
            let network_lock =
                network_lock.parse().map_err(|e| anyhow::anyhow!("--network-lock: {e}"))?;
            let opts = ferry_engine::capture::CaptureOptions {
                leave_running,
                external_stdio,
                progress: progress::bar("copying memory"),
                network_lock,
                parent,
                ..Default::default()
            };
            let s = ferry_engine::capture::checkpoint(pid, &images, &opts)
                .with_context(|| format!("checkpoint of pid {pid} failed"))?;
            println!(
                "checkpointed pid {} ({} processes, {} threads, {} mappings, {} fds, {} pages, {:.1} MiB image) in {:.1} ms; {}",
                s.pid,
                s.processes,
                s.threads,
                s.mappings,
                s.fds,
                s.pages,
                s.image_bytes as f64 / (1 << 20) as f64,
                s.total_ms,
                if leave_running { "left running" } else { "tree killed" }
            );
            Ok(0)
        }
        Cmd::Restore { images, detach, pidfile, tty_to, netns, new_pid_ns } => {
            let netns = netns.map(|n| {
                if n.contains('/') {
                    PathBuf::from(n)
                } else {
                    PathBuf::from("/run/netns").join(n)
                }
            });
            let opts = ferry_engine::restore::RestoreOptions {
                tty_to,
                netns,
                progress: progress::bar("restoring memory"),
                new_pid_ns,
            };
            let r = ferry_engine::restore::restore(&images, &opts)
                .with_context(|| format!("restore from {} failed", images.display()))?;
            match r.init_pid {
                Some(init) => eprintln!(
                    "restored pid {} ({} processes, {} threads) in {:.1} ms, in a new PID namespace: pid {} from here, its init is pid {init}",
                    r.pid, r.processes, r.threads, r.total_ms, r.host_pid
                ),
                None => eprintln!("restored pid {} ({} processes, {} threads) in {:.1} ms", r.pid, r.processes, r.threads, r.total_ms),
            }
            if let Some(p) = &pidfile {
                std::fs::write(p, format!("{}\n", r.host_pid))
                    .with_context(|| format!("writing pidfile {}", p.display()))?;
            }
            if detach {
                return Ok(0);
            }
            wait_for(r.init_pid.unwrap_or(r.pid))
        }
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
        Cmd::Demo(args) => demo::run(args),
    }
}

fn main() {
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
