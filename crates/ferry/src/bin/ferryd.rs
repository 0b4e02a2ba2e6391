//! ferryd: the agent that receives migrated process trees on a host, and
//! keeps hot standby copies for `ferry replicate`.
//!
//! It listens for `ferry migrate` from other hosts, refuses every peer
//! that does not hold the shared key, and serves each migration in a
//! fresh worker process (restore forks the tree and must run
//! single-threaded). It is the child subreaper of what it restores, so
//! restored trees are reaped here when they end; as PID 1 of a test
//! host's PID namespace it is that namespace's init.

use anyhow::{bail, Context, Result};
use clap::Parser;
use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Parser)]
#[command(
    name = "ferryd",
    version,
    about = "Receive live-migrated process trees: `ferry migrate --to` on another host connects here. Runs in the foreground.",
    after_help = "Both hosts need the same key file (`ferry keygen FILE`, copied over a trusted channel, mode 0600). \
A migration's service address (`ferry migrate --address`) is put on --interface, by default the interface of the --listen address."
)]
struct Args {
    /// Address and port to listen on, e.g. 10.0.0.2:7070.
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// Shared key file written by `ferry keygen`.
    #[arg(long)]
    key: PathBuf,
    /// Interface that receives a migrated service's address.
    #[arg(long)]
    interface: Option<String>,
    /// Seconds to wait for the source between two messages.
    #[arg(long, default_value_t = 30)]
    timeout: u64,
    /// The fencing store (etcd client URLs, comma-separated): needed to
    /// serve as a standby for `ferry replicate`, whose service this agent
    /// takes over only after winning it there.
    #[arg(long, value_delimiter = ',')]
    etcd: Vec<String>,
    /// Serve one connection on standard input (the per-migration worker).
    #[arg(long, hide = true)]
    serve_stdin: bool,
    /// Interface index for the worker.
    #[arg(long, hide = true)]
    ifindex: Option<u32>,
}

fn main() {
    let args = Args::parse();
    let filter = std::env::var("FERRY_LOG").unwrap_or_else(|_| "warn".into());
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .without_time()
        .init();
    let r = if args.serve_stdin { worker(&args) } else { listen(&args) };
    if let Err(e) = r {
        eprintln!("ferryd: error: {e:#}");
        std::process::exit(1);
    }
}

fn listen(args: &Args) -> Result<()> {
    let Some(addr) = args.listen else { bail!("--listen IP:PORT is required") };
    // Refuse a bad key now, not at the first migration.
    ferry_transport::Key::load(&args.key)
        .with_context(|| format!("key file {}", args.key.display()))?;
    let ifindex = match &args.interface {
        Some(name) => Some(
            ferry_sys::address::interface_index(name)
                .map_err(|e| anyhow::anyhow!("interface {name}: {e}"))?,
        ),
        None if !addr.ip().is_unspecified() => ferry_sys::address::find_address(addr.ip())
            .map_err(|e| anyhow::anyhow!("looking up {}: {e}", addr.ip()))?
            .map(|(i, _)| i),
        None => None,
    };
    ferry_sys::process::set_child_subreaper()
        .map_err(|e| anyhow::anyhow!("becoming a child subreaper: {e}"))?;
    let listener = TcpListener::bind(addr).with_context(|| format!("listening on {addr}"))?;
    let local = listener.local_addr().unwrap_or(addr);
    std::thread::spawn(reap_forever);
    // Reads the kernel's type facts once (kept for the workers in
    // /run/ferry/btf-facts), not in the first migration's pause.
    std::thread::spawn(ferry_engine::vm_flags::load_ahead);
    println!("ferryd listening on {local}");
    let _ = std::io::stdout().flush();
    for conn in listener.incoming() {
        match conn {
            Ok(stream) => {
                if let Err(e) = spawn_worker(args, stream, ifindex) {
                    eprintln!("ferryd: {e:#}");
                }
            }
            Err(e) => eprintln!("ferryd: accepting a connection: {e}"),
        }
    }
    Ok(())
}

/// Each migration in its own process: the restore forks the tree from a
/// single-threaded process, and a failing migration cannot take the
/// agent down.
fn spawn_worker(args: &Args, stream: TcpStream, ifindex: Option<u32>) -> Result<()> {
    let peer = stream.peer_addr().map(|p| p.to_string()).unwrap_or_else(|_| "?".into());
    let fd = stream.as_fd().try_clone_to_owned().context("duplicating the connection")?;
    drop(stream);
    let exe = std::env::current_exe().context("finding ferryd's own executable")?;
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("--serve-stdin")
        .arg("--key")
        .arg(&args.key)
        .arg("--timeout")
        .arg(args.timeout.to_string());
    if let Some(i) = ifindex {
        cmd.arg("--ifindex").arg(i.to_string());
    }
    if !args.etcd.is_empty() {
        cmd.arg("--etcd").arg(args.etcd.join(","));
    }
    cmd.stdin(std::process::Stdio::from(fd));
    let child = cmd.spawn().with_context(|| format!("starting a worker for {peer}"))?;
    eprintln!("ferryd: connection from {peer}: worker pid {}", child.id());
    Ok(())
}

/// Reaps workers and every orphan handed to us (restored trees whose
/// worker has exited), so none stays a zombie holding its PID.
fn reap_forever() {
    loop {
        match ferry_sys::process::wait_any() {
            Ok(Some((pid, code))) => tracing::debug!("reaped pid {pid} ({code})"),
            Ok(None) => std::thread::sleep(Duration::from_millis(200)),
            Err(e) => {
                tracing::warn!("waiting for children: {e}");
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    }
}

fn worker(args: &Args) -> Result<()> {
    let key = ferry_transport::Key::load(&args.key)
        .with_context(|| format!("key file {}", args.key.display()))?;
    let fd = std::io::stdin()
        .as_fd()
        .try_clone_to_owned()
        .context("taking the connection from standard input")?;
    let stream = TcpStream::from(fd);
    let _ = stream.set_nodelay(true);
    ferry_migrate::link::watch(&stream).context("watching the link to the source")?;
    let peer = stream.peer_addr().map(|p| p.to_string()).unwrap_or_else(|_| "?".into());
    let ch = match ferry_transport::Channel::accept(stream, &key) {
        Ok(ch) => ch,
        Err(e) => bail!("refused {peer}: {e}"),
    };
    let cfg = ferry_migrate::destination::DestinationConfig {
        interface: args.ifindex,
        timeout: Duration::from_secs(args.timeout),
        network_lock: ferry_netlock::Method::Ebpf,
    };
    let mut ch = ch;
    let greeted = ferry_migrate::destination::greet(&mut ch, &cfg);
    let (hello, notes) = match greeted {
        Ok(g) => g,
        Err(e) => {
            let r: ferry_migrate::Result<()> = Err(e);
            let e = ferry_migrate::destination::report_failure(ch, r).err();
            bail!(
                "connection from {peer} refused: {}",
                e.map(|e| e.to_string()).unwrap_or_default()
            );
        }
    };
    if hello.replica.is_some() {
        return standby(args, ch, hello, notes, cfg, &peer);
    }
    match ferry_migrate::destination::serve_after_hello(ch, &cfg, hello, notes) {
        Ok(None) => {
            eprintln!("ferryd: dry run from {peer}: the checks found no problem");
            Ok(())
        }
        Ok(Some(s)) => {
            let restore: f64 = s.phases.iter().map(|p| p.1).sum();
            eprintln!(
                "ferryd: migration from {peer}: pid {} runs here as pid {} ({:.1} MiB of pages, {restore:.1} ms of phases)",
                s.pid,
                s.host_pid,
                s.page_bytes as f64 / 1048576.0
            );
            Ok(())
        }
        Err(e) => bail!("migration from {peer} failed: {e}"),
    }
}

/// Keeps a standby copy for a primary's `ferry replicate`, and takes the
/// service over when the primary falls silent.
fn standby(
    args: &Args,
    ch: ferry_transport::Channel,
    hello: ferry_migrate::protocol::Hello,
    notes: Vec<String>,
    dest: ferry_migrate::destination::DestinationConfig,
    peer: &str,
) -> Result<()> {
    use ferry_replicate::standby::{self, Outcome};
    let service = hello.replica.as_ref().map(|r| r.service.clone()).unwrap_or_default();
    if args.etcd.is_empty() {
        let r: ferry_migrate::Result<()> = Err(ferry_migrate::MigrateError::Refused(
            "this ferryd has no fencing store (start it with --etcd URL) and cannot be a standby"
                .into(),
        ));
        let _ = ferry_migrate::destination::report_failure(ch, r);
        bail!("standby of {service} for {peer} refused: no --etcd");
    }
    let cfg = standby::StandbyConfig {
        dest,
        etcd: args.etcd.clone(),
        fence_timeout: Duration::from_secs(2),
    };
    eprintln!("ferryd: standby of {service} for {peer}");
    match standby::serve(ch, hello, notes, &cfg) {
        Ok(Outcome::Dropped) => {
            eprintln!("ferryd: standby of {service}: the primary ended protection; copy dropped");
            Ok(())
        }
        Ok(Outcome::NothingToRun(why)) => {
            eprintln!("ferryd: standby of {service}: {why}; no complete sync to run, copy dropped");
            Ok(())
        }
        Ok(Outcome::Lost(owner)) => {
            eprintln!("ferryd: standby of {service}: the primary fell silent, but {owner} holds the service; copy dropped");
            Ok(())
        }
        Ok(Outcome::TookOver { served, seq, takeover_ms, why, warm }) => {
            eprintln!(
                "ferryd: standby of {service}: took over ({why}): pid {} runs here as pid {} from sync {seq}, {takeover_ms:.1} ms from silence to running",
                served.pid, served.host_pid
            );
            let phases: Vec<String> =
                served.phases.iter().map(|(n, ms)| format!("{n} {ms:.1}")).collect();
            eprintln!(
                "ferryd: standby of {service}: {warm}; takeover phases (ms): {}",
                phases.join(", ")
            );
            Ok(())
        }
        Err(e) => bail!("standby of {service} for {peer} failed: {e}"),
    }
}
