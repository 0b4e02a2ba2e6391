//! ferry-outbox-bench: what output commit costs a TCP stream between two
//! network namespaces (joined by a veth pair), with the sender's address
//! held by an outbox that a loop releases every few milliseconds the way
//! a replication loop would: mark, wait (the sync), release. Needs root.

use clap::Parser;
use ferry_outbox::{Config, Hook, Outbox};
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{IpAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const SERVER: &str = "10.78.0.1";
const CLIENT: &str = "10.78.0.2";

#[derive(Parser)]
#[command(about = "Throughput, batch sizes and release latency of ferry's output commit")]
struct Args {
    /// MiB sent per throughput run.
    #[arg(long, default_value_t = 64)]
    mib: usize,
    /// Release intervals to measure, in ms (0: release each packet as
    /// soon as it is queued, the queue's own cost).
    #[arg(long, value_delimiter = ',', default_value = "0,1,5,20")]
    intervals: Vec<u64>,
    /// Runs of each configuration; the median is shown (the machine is
    /// shared, single runs vary).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Release-latency samples (one small write each).
    #[arg(long, default_value_t = 200)]
    samples: usize,
    /// The sender's congestion control (TCP_CONGESTION); the namespace's
    /// default (net.ipv4.tcp_congestion_control) when not given.
    #[arg(long)]
    cc: Option<String>,
    /// Where the table is written (also printed).
    #[arg(long, default_value = "ferry-outbox-bench.txt")]
    out: PathBuf,
}

/// Two namespaces joined by a veth pair, deleted on drop.
struct Net {
    a: String,
    b: String,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let st = Command::new("ip").args(args).status().map_err(|e| format!("ip: {e}"))?;
    st.success().then_some(()).ok_or_else(|| format!("ip {} failed", args.join(" ")))
}

impl Net {
    fn new() -> Result<Net, String> {
        let pid = std::process::id();
        let net = Net { a: format!("ferry-obench-{pid}-a"), b: format!("ferry-obench-{pid}-b") };
        ip(&["netns", "add", &net.a])?;
        ip(&["netns", "add", &net.b])?;
        ip(&[
            "-n", &net.a, "link", "add", "va", "type", "veth", "peer", "name", "vb", "netns",
            &net.b,
        ])?;
        for (ns, dev, addr) in [(&net.a, "va", SERVER), (&net.b, "vb", CLIENT)] {
            ip(&["-n", ns, "addr", "add", &format!("{addr}/24"), "dev", dev])?;
            ip(&["-n", ns, "link", "set", dev, "up"])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        Ok(net)
    }

    fn path(&self, ns: &str) -> PathBuf {
        Path::new("/run/netns").join(ns)
    }

    /// Runs `f` on a thread inside namespace `ns`.
    fn run<T: Send>(&self, ns: &str, f: impl FnOnce() -> T + Send) -> Result<T, String> {
        let file = std::fs::File::open(self.path(ns)).map_err(|e| format!("{ns}: {e}"))?;
        std::thread::scope(|s| {
            s.spawn(|| {
                ferry_sys::netns::enter_net_namespace(file.as_fd()).map_err(|e| e.to_string())?;
                Ok(f())
            })
            .join()
            .map_err(|_| "thread panicked".to_string())?
        })
    }

    fn connect(&self, port: u16) -> Result<(TcpStream, TcpStream), String> {
        let l =
            self.run(&self.a, || TcpListener::bind((SERVER, port)))?.map_err(|e| e.to_string())?;
        let c =
            self.run(&self.b, || TcpStream::connect((SERVER, port)))?.map_err(|e| e.to_string())?;
        let (s, _) = l.accept().map_err(|e| e.to_string())?;
        Ok((s, c))
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        let _ = ip(&["netns", "delete", &self.a]);
        let _ = ip(&["netns", "delete", &self.b]);
    }
}

struct Run {
    label: String,
    mbps: f64,
    batches: u64,
    packets: u64,
    max_batch: usize,
}

/// Sends `bytes` from A to B; with `hold`, through an outbox released by
/// a loop every `every`.
/// Until `done`: a mark, `every` later the release through it; the size
/// of each release that let packets go goes into `sizes`.
fn release_every(o: &Outbox, every: Duration, done: &AtomicBool, sizes: &Mutex<Vec<usize>>) {
    while !done.load(Ordering::Relaxed) {
        // Interval 0: release whatever was queued as soon as it is, which
        // leaves the queue's own cost per packet.
        if every.is_zero() && !o.wait_output(Duration::from_millis(10)) {
            continue;
        }
        let Ok(m) = o.mark() else { return };
        std::thread::sleep(every);
        match o.release_through(m) {
            Ok(n) if n > 0 => sizes.lock().unwrap_or_else(|p| p.into_inner()).push(n),
            Ok(_) => {}
            Err(e) => {
                eprintln!("release: {e}");
                return;
            }
        }
    }
}

fn throughput(
    net: &Net,
    port: u16,
    bytes: usize,
    hold: Option<(Duration, bool, Hook)>,
    cc: Option<&str>,
) -> Result<Run, String> {
    let (mut server, mut client) = net.connect(port)?;
    if let Some(cc) = cc {
        use std::os::fd::AsRawFd;
        ferry_sys::socket::setsockopt_bytes(
            server.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_CONGESTION,
            cc.as_bytes(),
        )
        .map_err(|e| format!("TCP_CONGESTION {cc}: {e}"))?;
    }
    let outbox = match hold {
        Some((_, gso, hook)) => {
            let cfg = Config { gso, hook, ..Config::default() };
            // PREROUTING holds at the far end of the veth: the client's side.
            let ns = if hook == Hook::Prerouting { &net.b } else { &net.a };
            let addr: IpAddr = SERVER.parse().map_err(|e| format!("{e}"))?;
            Some(Arc::new(
                Outbox::hold_with(Some(&net.path(ns)), addr, 1, cfg).map_err(|e| e.to_string())?,
            ))
        }
        None => None,
    };
    let done = Arc::new(AtomicBool::new(false));
    let batch_sizes = Arc::new(Mutex::new(Vec::new()));
    let releaser = outbox.as_ref().zip(hold).map(|(o, (every, _, _))| {
        let (o, done, sizes) = (Arc::clone(o), Arc::clone(&done), Arc::clone(&batch_sizes));
        std::thread::spawn(move || release_every(&o, every, &done, &sizes))
    });
    let start = Instant::now();
    let sender = std::thread::spawn(move || {
        let chunk = vec![7u8; 1 << 16];
        let mut left = bytes;
        while left > 0 {
            let n = left.min(chunk.len());
            if server.write_all(&chunk[..n]).is_err() {
                break;
            }
            left -= n;
        }
        server
    });
    let mut buf = vec![0u8; 1 << 16];
    let mut got = 0;
    while got < bytes {
        match client.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got += n,
        }
    }
    let secs = start.elapsed().as_secs_f64();
    done.store(true, Ordering::Relaxed);
    let _server = sender.join().map_err(|_| "sender panicked".to_string())?;
    if let Some(r) = releaser {
        r.join().map_err(|_| "releaser panicked".to_string())?;
    }
    let stats = outbox.as_ref().map(|o| o.stats()).unwrap_or_default();
    let sizes = batch_sizes.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let label = match hold {
        None => "plain".to_string(),
        Some((every, gso, hook)) => {
            let gso = if gso { "" } else { " no-GSO" };
            let pre = if hook == Hook::Prerouting { " PRE" } else { "" };
            format!("outbox {} ms{gso}{pre}", every.as_millis())
        }
    };
    if got < bytes {
        return Err(format!("{label}: the stream ended after {got} of {bytes} bytes"));
    }
    Ok(Run {
        label,
        mbps: got as f64 / secs / 1e6,
        batches: stats.releases,
        packets: stats.released,
        max_batch: sizes.iter().copied().max().unwrap_or(0),
    })
}

/// Time from the start of release_through to the client's read returning,
/// for `samples` one-byte messages; sorted, in µs.
fn release_latency(net: &Net, port: u16, samples: usize) -> Result<(Vec<f64>, Vec<f64>), String> {
    let (mut server, mut client) = net.connect(port)?;
    server.set_nodelay(true).map_err(|e| e.to_string())?;
    let addr: IpAddr = SERVER.parse().map_err(|e| format!("{e}"))?;
    let outbox = Outbox::hold(Some(&net.path(&net.a)), addr, 2).map_err(|e| e.to_string())?;
    let (mut to_client, mut calls) = (Vec::new(), Vec::new());
    let mut byte = [0u8; 1];
    for _ in 0..samples {
        server.write_all(b"x").map_err(|e| e.to_string())?;
        if !outbox.wait_output(Duration::from_secs(2)) {
            return Err("no output queued after a write".into());
        }
        let mark = outbox.mark().map_err(|e| e.to_string())?;
        let t = Instant::now();
        outbox.release_through(mark).map_err(|e| e.to_string())?;
        calls.push(t.elapsed().as_secs_f64() * 1e6);
        client.read_exact(&mut byte).map_err(|e| e.to_string())?;
        to_client.push(t.elapsed().as_secs_f64() * 1e6);
        // The client's ACK comes back unheld; let it arrive first.
        std::thread::sleep(Duration::from_millis(1));
    }
    to_client.sort_by(f64::total_cmp);
    calls.sort_by(f64::total_cmp);
    Ok((to_client, calls))
}

fn pct(v: &[f64], p: f64) -> f64 {
    v.get(((v.len() as f64 - 1.0) * p).round() as usize).copied().unwrap_or(f64::NAN)
}

fn main() {
    let args = Args::parse();
    if let Err(e) = run(&args) {
        eprintln!("ferry-outbox-bench: {e}");
        std::process::exit(1);
    }
}

fn run(args: &Args) -> Result<(), String> {
    let net = Net::new()?;
    let bytes = args.mib << 20;
    let mut configs = vec![None];
    for hook in [Hook::Output, Hook::Prerouting] {
        configs
            .extend(args.intervals.iter().map(|&ms| Some((Duration::from_millis(ms), true, hook))));
    }
    // Without GSO the kernel cuts each packet into segments before
    // queueing them: the first interval shows the cost per segment.
    let mut no_gso: Vec<u64> = args.intervals.iter().copied().take(1).collect();
    if no_gso.first() != Some(&5) && args.intervals.contains(&5) {
        no_gso.push(5);
    }
    for ms in no_gso {
        configs.push(Some((Duration::from_millis(ms), false, Hook::Output)));
    }
    let mut port = 7100;
    let mut runs = Vec::new();
    for config in configs {
        let mut tries = Vec::new();
        for _ in 0..args.runs.max(1) {
            port += 1;
            tries.push(throughput(&net, port, bytes, config, args.cc.as_deref())?);
        }
        tries.sort_by(|a, b| a.mbps.total_cmp(&b.mbps));
        runs.push(tries.swap_remove(tries.len() / 2));
    }
    let (lat, calls) = release_latency(&net, port + 1, args.samples)?;

    let mut t = String::new();
    let _ = writeln!(
        t,
        "TCP stream of {} MiB, namespace to namespace over veth, median of {} runs, congestion control {}",
        args.mib,
        args.runs.max(1),
        args.cc.as_deref().unwrap_or("default")
    );
    let _ = writeln!(
        t,
        "{:<22} {:>9} {:>9} {:>10} {:>11} {:>10} {:>10}",
        "run", "MB/s", "vs plain", "batches", "packets", "pkts/batch", "max batch"
    );
    let plain = runs[0].mbps;
    for r in &runs {
        let per = if r.batches > 0 { r.packets as f64 / r.batches as f64 } else { 0.0 };
        let _ = writeln!(
            t,
            "{:<22} {:>9.1} {:>8.0}% {:>10} {:>11} {:>10.1} {:>10}",
            r.label,
            r.mbps,
            100.0 * r.mbps / plain,
            r.batches,
            r.packets,
            per,
            r.max_batch
        );
    }
    let _ =
        writeln!(t, "\nrelease latency, {} one-byte writes (µs): p50 / p90 / p99 / max", lat.len());
    for (name, v) in [("release_through call", &calls), ("mark -> client read", &lat)] {
        let _ = writeln!(
            t,
            "{:<22} {:>8.1} {:>8.1} {:>8.1} {:>8.1}",
            name,
            pct(v, 0.5),
            pct(v, 0.9),
            pct(v, 0.99),
            pct(v, 1.0)
        );
    }
    print!("{t}");
    std::fs::write(&args.out, &t).map_err(|e| format!("{}: {e}", args.out.display()))
}
