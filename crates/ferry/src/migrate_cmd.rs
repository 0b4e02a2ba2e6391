//! `ferry migrate`: the source side of a live migration.

use anyhow::{Context, Result};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

#[derive(clap::Args)]
pub struct MigrateArgs {
    /// Root of the process tree to move.
    #[arg(long)]
    pid: i32,
    /// The destination's ferryd, IP:PORT.
    #[arg(long)]
    to: SocketAddr,
    /// Shared key file (`ferry keygen`), the same as ferryd's.
    #[arg(long)]
    key: PathBuf,
    /// Service address that moves with the process, IP/PREFIX: taken off
    /// this host during the freeze, put on the destination's interface and
    /// announced there (gratuitous ARP / unsolicited neighbour advertisement).
    #[arg(long, value_parser = parse_address)]
    address: Option<(IpAddr, u8)>,
    /// Post-copy: resume at the destination at once, without the memory
    /// of the process (private anonymous pages), which follows on demand
    /// (each page fetched on its first touch) and in the background. The
    /// pause does not depend on memory size: for services that write
    /// memory faster than the link carries it. Trade-off: from the resume
    /// until the last page arrives the service lives in two places, and
    /// if either host or the link fails then, the service is LOST (the
    /// destination kills its incomplete copy; nothing can roll back).
    /// Single-process trees only.
    #[arg(long)]
    lazy: bool,
    /// Stop-and-copy: no pre-copy rounds, all memory sent in the freeze.
    #[arg(long)]
    no_precopy: bool,
    /// Integrity-checked but unencrypted stream, for a trusted link.
    #[arg(long)]
    insecure: bool,
    /// Seconds to wait for the destination at each step.
    #[arg(long, default_value_t = 30)]
    timeout: u64,
    /// Freeze once the memory written since the last pre-copy round is at
    /// most this many MiB.
    #[arg(long, default_value_t = 4)]
    converge_mib: u64,
    /// Write the migration's report (pause, phases, rounds, bytes) as JSON.
    #[arg(long)]
    report: Option<PathBuf>,
    /// Only the checks, nothing frozen or moved: this host's own, then
    /// the destination's on the running tree (local addresses it lacks,
    /// ports taken there, PIDs above its kernel.pid_max, IPv6 it lacks).
    /// Prints "would migrate", or every problem with its remedy and exits
    /// with status 2. A real migration makes the same checks before its
    /// freeze and refuses the same way.
    #[arg(long)]
    dry_run: bool,
    /// Move the tree although its root runs in its parent's process
    /// group (part of the parent's job: a worker of a master process, a
    /// child its parent waits for) and that parent stays on this host.
    /// The parent sees the process exit here when the migration ends the
    /// source's copy (SIGCHLD, waitpid); at the destination the process
    /// becomes a child of ferryd's restore. Without it such a root is
    /// refused by name before anything is frozen. A root that leads its
    /// own process group or session, or whose parent is init or ferry,
    /// needs no option. Sharing with the parent (memory, files, fd
    /// table) is refused either way.
    #[arg(long)]
    parent_sees_exit: bool,
}

pub(crate) fn parse_address(s: &str) -> Result<(IpAddr, u8), String> {
    let (ip, prefix) =
        s.split_once('/').ok_or_else(|| format!("{s}: expected IP/PREFIX, e.g. 10.0.0.100/24"))?;
    let ip: IpAddr = ip.parse().map_err(|e| format!("{ip}: {e}"))?;
    let prefix: u8 = prefix.parse().map_err(|e| format!("prefix {prefix}: {e}"))?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    if prefix > max {
        return Err(format!("prefix /{prefix} is longer than {max}"));
    }
    Ok((ip, prefix))
}

pub fn run(a: MigrateArgs) -> Result<i32> {
    let opts = options(&a)?;
    if a.dry_run {
        return dry_run(&a, &opts);
    }
    let r = ferry_migrate::migrate(&opts).with_context(|| {
        format!("migration of pid {} to {} failed; it still runs here", a.pid, a.to)
    })?;
    print_summary(&r, a.to);
    if let Some(path) = &a.report {
        std::fs::write(path, serde_json::to_vec_pretty(&report_json(&r))?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(0)
}

/// Exit status of a dry run that found problems.
const WOULD_NOT_MIGRATE: i32 = 2;

fn dry_run(a: &MigrateArgs, opts: &ferry_migrate::MigrateOptions) -> Result<i32> {
    match ferry_migrate::dry_run(opts) {
        Ok(d) => {
            println!(
                "would migrate pid {} to {}: the destination's checks passed ({} process and thread IDs, {} TCP/UDP sockets, {:.1} ms)",
                a.pid, a.to, d.ids, d.sockets, d.ms
            );
            for note in &d.notes {
                println!("  note: {note}");
            }
            Ok(0)
        }
        Err(ferry_migrate::MigrateError::Unfit(problems)) => {
            println!(
                "would not migrate pid {} to {}: the destination would fail to restore it (nothing was frozen):",
                a.pid, a.to
            );
            for p in &problems {
                println!("  - {p}");
            }
            Ok(WOULD_NOT_MIGRATE)
        }
        Err(e) => Err(e).with_context(|| format!("dry run of pid {} to {}", a.pid, a.to)),
    }
}

fn options(a: &MigrateArgs) -> Result<ferry_migrate::MigrateOptions> {
    let key = ferry_transport::Key::load(&a.key)
        .with_context(|| format!("key file {}", a.key.display()))?;
    Ok(ferry_migrate::MigrateOptions {
        pid: a.pid,
        to: a.to,
        key,
        mode: if a.insecure {
            ferry_transport::Mode::Insecure
        } else {
            ferry_transport::Mode::Encrypted
        },
        address: a.address,
        lazy: a.lazy,
        precopy: !a.no_precopy,
        policy: ferry_migrate::precopy::RoundPolicy {
            stop_below: a.converge_mib << 20,
            ..Default::default()
        },
        timeout: Duration::from_secs(a.timeout),
        network_lock: ferry_netlock::Method::Ebpf,
        parent_sees_exit: a.parent_sees_exit,
        progress: Box::new(|s: &str| eprintln!("ferry: {s}")),
    })
}

fn print_summary(r: &ferry_migrate::MigrationReport, to: SocketAddr) {
    let parts: Vec<String> = r.source_phases.iter().map(|(n, ms)| format!("{n} {ms:.1}")).collect();
    println!(
        "migrated pid {} to {} (pid {} there, {} from its agent): pause {:.1} ms, {:.1} MiB sent, total {:.1} ms, {} pre-copy rounds; phases (ms): {}",
        r.pid,
        to,
        r.dest_pid,
        r.dest_host_pid,
        r.pause_ms,
        r.bytes_sent as f64 / 1048576.0,
        r.total_ms,
        r.rounds.len(),
        parts.join(", ")
    );
    if let Some(p) = &r.postcopy {
        println!(
            "post-copy: {:.1} MiB left behind in the freeze, sent in {:.0} ms after the resume ({} page requests served, {} pages)",
            p.lazy_bytes as f64 / 1048576.0,
            p.push.ms,
            p.push.requests,
            p.push.requested_pages
        );
    }
}

/// The report `--report` writes.
fn report_json(r: &ferry_migrate::MigrationReport) -> serde_json::Value {
    serde_json::json!({
        "pid": r.pid,
        "dest_pid": r.dest_pid,
        "dest_host_pid": r.dest_host_pid,
        "pause_ms": r.pause_ms,
        "total_ms": r.total_ms,
        "bytes_sent": r.bytes_sent,
        "final_page_bytes": r.final_page_bytes,
        "rounds": r.rounds.iter().map(|x| serde_json::json!({"bytes": x.bytes, "ms": x.ms, "dirty_after": x.dirty_after})).collect::<Vec<_>>(),
        "precopy_stop": r.precopy_stop.map(|d| format!("{d:?}")),
        "source_phases": r.source_phases,
        "dest_phases": r.dest_phases,
        "postcopy": r.postcopy.as_ref().map(|p| serde_json::json!({
            "lazy_bytes": p.lazy_bytes,
            "ms": p.push.ms,
            "bytes": p.push.bytes,
            "requests": p.push.requests,
            "requested_pages": p.push.requested_pages,
        })),
    })
}
