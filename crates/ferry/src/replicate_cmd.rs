//! `ferry replicate`: protect a running service with a hot standby, and
//! `ferry status`: what replication is doing on this host.

use anyhow::{bail, Context, Result};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

#[derive(clap::Args)]
pub struct ReplicateArgs {
    /// Root of the process tree to protect.
    #[arg(long)]
    pid: i32,
    /// The standby host's ferryd, IP:PORT (started there with --etcd).
    #[arg(long)]
    to: SocketAddr,
    /// Shared key file (`ferry keygen`), the same as ferryd's.
    #[arg(long)]
    key: PathBuf,
    /// The service address, IP/PREFIX: every packet sent from it is held
    /// until the standby holds the state that produced it, and the
    /// standby puts it on its interface when it takes over.
    #[arg(long, value_parser = crate::migrate_cmd::parse_address)]
    address: (IpAddr, u8),
    /// The fencing store: etcd client URLs, comma-separated. The service
    /// is claimed there; whoever holds it runs it.
    #[arg(long, value_delimiter = ',', required = true)]
    etcd: Vec<String>,
    /// Sync at least this often (ms), even when the service sends nothing.
    #[arg(long, default_value_t = 1000)]
    max_interval_ms: u64,
    /// Ask the standby whether it is there this often (ms) between syncs.
    #[arg(long, default_value_t = 50)]
    heartbeat_ms: u64,
    /// The standby takes over after this long without a word from here
    /// (ms); this side counts the standby lost after the same silence.
    #[arg(long, default_value_t = 300)]
    heartbeat_timeout_ms: u64,
    /// Seconds for the first sync and for each call to the fencing store.
    #[arg(long, default_value_t = 30)]
    timeout: u64,
    /// The NFQUEUE number the output is held in (one per service).
    #[arg(long, default_value_t = 7117)]
    queue: u16,
    /// As for `ferry migrate`: protect a root that is part of its
    /// parent's job.
    #[arg(long)]
    parent_sees_exit: bool,
    /// A file the service may write although its content is not
    /// replicated (a log whose last lines may be missing after a
    /// takeover); repeat for each. Any other regular file open for
    /// writing, or mapped shared and writable, is refused by name (before
    /// the first sync) or ends protection (later): the standby's memory
    /// would know writes its files lack.
    #[arg(long, value_name = "PATH")]
    ignore_writes: Vec<PathBuf>,
    /// A directory whose files are part of the replicated state: the
    /// standby's copy of it is always the one the memory it holds wrote.
    /// It must be a btrfs subvolume (`btrfs subvolume create DIR`) with
    /// its parent directory on the same filesystem, at the same path on
    /// the standby (whose copy replaces it there at a takeover); repeat
    /// for each.
    #[arg(long, value_name = "DIR")]
    data_dir: Vec<PathBuf>,
}

#[derive(clap::Args)]
pub struct StatusArgs {
    /// Print JSON (one object per replicated service and role).
    #[arg(long)]
    json: bool,
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_stop(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

pub fn run(a: ReplicateArgs) -> Result<i32> {
    if a.heartbeat_timeout_ms <= a.heartbeat_ms {
        bail!(
            "--heartbeat-timeout-ms ({}) must be longer than --heartbeat-ms ({})",
            a.heartbeat_timeout_ms,
            a.heartbeat_ms
        );
    }
    let key = ferry_transport::Key::load(&a.key)
        .with_context(|| format!("key file {}", a.key.display()))?;
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // The handler only stores to an atomic.
        ferry_sys::signal::set_handler(sig, on_stop)
            .map_err(|e| anyhow::anyhow!("handling signal {sig}: {e}"))?;
    }
    let o = ferry_replicate::primary::ReplicateOptions {
        pid: a.pid,
        to: a.to,
        key,
        address: a.address,
        etcd: a.etcd.clone(),
        max_interval: Duration::from_millis(a.max_interval_ms),
        heartbeat_interval: Duration::from_millis(a.heartbeat_ms),
        heartbeat_timeout: Duration::from_millis(a.heartbeat_timeout_ms),
        timeout: Duration::from_secs(a.timeout),
        parent_sees_exit: a.parent_sees_exit,
        ignore_writes: a.ignore_writes.clone(),
        data_dirs: a.data_dir.clone(),
        queue: a.queue,
        stop: &STOP,
        progress: Arc::new(|s: &str| println!("{s}")),
    };
    match ferry_replicate::primary::replicate(&o) {
        Ok(ferry_replicate::primary::Ended::Stopped { syncs }) => {
            println!(
                "protection of pid {} ended after {syncs} syncs: it runs on here, unprotected",
                a.pid
            );
            Ok(0)
        }
        Ok(ferry_replicate::primary::Ended::Unprotected { syncs, why }) => {
            println!("pid {} runs on here, UNPROTECTED, after {syncs} syncs: {why}", a.pid);
            Ok(3)
        }
        Err(e) => {
            // Only a fenced-out primary kills its copy: after any other
            // error the service runs on here, and the message says so.
            let here = !matches!(e, ferry_replicate::ReplicateError::Fenced(_))
                && std::path::Path::new(&format!("/proc/{}", a.pid)).exists();
            let fate = if here { ", which runs on here UNPROTECTED," } else { "" };
            Err(e).with_context(|| format!("replication of pid {}{fate} to {}", a.pid, a.to))
        }
    }
}

pub fn status(a: StatusArgs) -> Result<i32> {
    let all = ferry_replicate::status::read_all();
    if a.json {
        println!("{}", serde_json::to_string_pretty(&all)?);
        return Ok(0);
    }
    if all.is_empty() {
        println!("no replication on this host");
    }
    for s in &all {
        let age = ferry_replicate::status::now_ms().saturating_sub(s.updated_unix_ms);
        println!("{} (updated {:.1} s ago)", s.line(), age as f64 / 1e3);
    }
    Ok(0)
}
