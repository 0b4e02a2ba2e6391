//! `ferry restore`: restore a tree from an image directory (or a chain).

use anyhow::{Context, Result};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct RestoreArgs {
    /// Image directory written by `ferry checkpoint` (an incremental
    /// image is restored with its chain of parents).
    #[arg(long)]
    pub images: PathBuf,
    /// Exit once the process runs; it is re-parented to init (or the
    /// nearest child subreaper).
    #[arg(long)]
    pub detach: bool,
    /// Write the restored root's PID (as seen from here, also with
    /// --new-pid-ns) to this file once the process runs.
    #[arg(long)]
    pub pidfile: Option<PathBuf>,
    /// File that replaces descriptors which were terminals (a process
    /// cannot get its old terminal back), and stdio recorded with
    /// `checkpoint --external-stdio`. Created if missing.
    #[arg(long, default_value = "/dev/null")]
    pub tty_to: String,
    /// Restore into this network namespace: a name from `ip netns`
    /// (/run/netns/NAME) or a path such as /proc/PID/ns/net. Its
    /// sockets are bound there.
    #[arg(long)]
    pub netns: Option<String>,
    /// Restore into a new PID namespace, so the tree's PIDs can never
    /// be taken: inside it every process has its old PID, a small
    /// `ferry-init` is PID 1 and the tree's root is its child, and
    /// /proc shows the namespace. Without --detach, ferry waits for
    /// that init, which exits with the root's status. An image of a
    /// tree that ran in its own PID namespace is always restored so.
    #[arg(long)]
    pub new_pid_ns: bool,
    /// Skip the restore's own check. By default, before the restored
    /// processes run, ferry reads their state back (credentials, limits,
    /// threads, mappings, fd table, socket options) and compares it with
    /// the image; a difference ends the restored copy, leaves the image
    /// as it is and fails with the difference named. Only for measuring
    /// what the check costs.
    #[arg(long)]
    pub no_check: bool,
}

pub fn run(args: RestoreArgs) -> Result<i32> {
    let RestoreArgs { images, detach, pidfile, tty_to, netns, new_pid_ns, no_check } = args;
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
        progress: crate::progress::bar("restoring memory"),
        new_pid_ns,
        check: !no_check,
        trial: false,
        detach,
    };
    let r = ferry_engine::restore::restore(&images, &opts)
        .with_context(|| format!("restore from {} failed", images.display()))?;
    let line = match r.init_pid {
        Some(init) => format!(
            "restored pid {} ({} processes, {} threads) in {:.1} ms, in a new PID namespace: pid {} from here, its init is pid {init}\n",
            r.pid, r.processes, r.threads, r.total_ms, r.host_pid
        ),
        None => format!(
            "restored pid {} ({} processes, {} threads) in {:.1} ms\n",
            r.pid, r.processes, r.threads, r.total_ms
        ),
    };
    // One write (eprintln! writes each formatted piece on its own: a
    // dozen system calls before the command can exit).
    let _ = std::io::Write::write_all(&mut std::io::stderr().lock(), line.as_bytes());
    if let Some(p) = &pidfile {
        std::fs::write(p, format!("{}\n", r.host_pid))
            .with_context(|| format!("writing pidfile {}", p.display()))?;
    }
    if detach {
        return Ok(0);
    }
    crate::wait_for(r.init_pid.unwrap_or(r.host_pid).0)
}
