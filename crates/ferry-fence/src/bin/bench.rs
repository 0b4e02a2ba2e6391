//! Latency of the fence's operations against a real etcd:
//!
//!     ferry-fence-bench [--claims N] [--endpoint URL] [--out FILE]
//!
//! Without --endpoint it starts a one-member etcd of its own on 127.0.0.1
//! (data in a fresh directory under the temp dir, removed at the end, with
//! the process killed by PID). Prints a Markdown table of p50/p99/max per
//! operation and writes it to --out.

use clap::Parser;
use ferry_fence::{Claim, Fence};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Parser)]
#[command(about = "Latency of ferry-fence's etcd operations (claim, take-over, read, release)")]
struct Args {
    /// Operations of each kind to time.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    claims: u32,
    /// An etcd client URL to use instead of a private etcd on loopback.
    #[arg(long)]
    endpoint: Option<String>,
    /// Where to write the table (Markdown).
    #[arg(long, default_value = "fence-bench.md")]
    out: PathBuf,
    /// Bound of each operation, in milliseconds.
    #[arg(long, default_value_t = 2000)]
    timeout_ms: u64,
}

/// A private etcd: killed by PID and its directory removed on drop.
struct PrivateEtcd {
    child: Child,
    dir: PathBuf,
    endpoint: String,
}

impl PrivateEtcd {
    fn start() -> Result<PrivateEtcd, String> {
        let dir = std::env::temp_dir().join(format!("ferry-fence-bench-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let port = || -> Result<u16, String> {
            let l = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("bind: {e}"))?;
            l.local_addr().map(|a| a.port()).map_err(|e| e.to_string())
        };
        let (client, peer) = (port()?, port()?);
        let endpoint = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let log = std::fs::File::create(dir.join("etcd.log")).map_err(|e| e.to_string())?;
        let child = Command::new("etcd")
            .args(["--name", "bench", "--data-dir"])
            .arg(dir.join("data"))
            .args(["--listen-client-urls", &endpoint, "--advertise-client-urls", &endpoint])
            .args(["--listen-peer-urls", &peer_url, "--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("bench={peer_url}"), "--logger", "zap"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("spawning etcd (Debian's etcd-server): {e}"))?;
        let etcd = PrivateEtcd { child, dir, endpoint };
        etcd.wait_healthy(client)?;
        Ok(etcd)
    }

    fn wait_healthy(&self, port: u16) -> Result<(), String> {
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(20) {
            let answer = TcpStream::connect(("127.0.0.1", port)).ok().and_then(|mut s| {
                s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
                s.write_all(b"GET /health HTTP/1.0\r\n\r\n").ok()?;
                let mut a = String::new();
                s.read_to_string(&mut a).ok().map(|_| a)
            });
            if answer.is_some_and(|a| a.contains("\"health\":\"true\"")) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(format!("etcd not healthy within 20 s (log: {})", self.dir.join("etcd.log").display()))
    }
}

impl Drop for PrivateEtcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// p50, p99 and max of `samples` (ms), which it sorts.
fn percentiles(samples: &mut [f64]) -> (f64, f64, f64) {
    samples.sort_by(f64::total_cmp);
    let at =
        |q: f64| samples[((samples.len() as f64 * q).ceil() as usize).clamp(1, samples.len()) - 1];
    (at(0.50), at(0.99), samples[samples.len() - 1])
}

/// Times `n` runs of `op(i)`, in milliseconds.
fn time(n: u32, mut op: impl FnMut(u32) -> Result<(), String>) -> Result<Vec<f64>, String> {
    let mut out = Vec::with_capacity(n as usize);
    for i in 0..n {
        let start = Instant::now();
        op(i)?;
        out.push(start.elapsed().as_secs_f64() * 1e3);
    }
    Ok(out)
}

fn expect_won(claim: Claim, what: &str) -> Result<(), String> {
    match claim {
        Claim::Won { .. } => Ok(()),
        Claim::Lost { owner } => Err(format!("{what}: lost to {owner:?}")),
    }
}

fn run(args: &Args, endpoint: &str) -> Result<String, String> {
    let timeout = Duration::from_millis(args.timeout_ms);
    let f = Fence::connect(&[endpoint.to_string()], timeout).map_err(|e| e.to_string())?;
    let n = args.claims;
    let run_id = std::process::id();
    let svc = |i: u32| format!("bench-{run_id}-{i}");
    let e = |e: ferry_fence::FenceError| e.to_string();
    let claim = time(n, |i| expect_won(f.claim_initial(&svc(i), "bench-a").map_err(e)?, "claim"))?;
    let owner = time(n, |i| f.owner(&svc(i)).map(|_| ()).map_err(e))?;
    // One service handed back and forth: epoch i + 1 -> i + 2.
    let take = time(n, |i| {
        let holder = if i % 2 == 0 { "bench-b" } else { "bench-a" };
        expect_won(f.take_over(&svc(0), holder, u64::from(i) + 1).map_err(e)?, "take_over")
    })?;
    let release = time(n, |i| {
        let (holder, epoch) = if i == 0 {
            (if n % 2 == 1 { "bench-b" } else { "bench-a" }, u64::from(n) + 1)
        } else {
            ("bench-a", 1)
        };
        match f.release(&svc(i), holder, epoch).map_err(e)? {
            true => Ok(()),
            false => Err(format!("release of {} not done", svc(i))),
        }
    })?;
    let mut table = format!(
        "etcd {endpoint}, {n} operations of each kind, one client, sequential\n\n\
         | operation | etcd requests | p50 ms | p99 ms | max ms |\n|---|---|---|---|---|\n"
    );
    for (name, requests, mut samples) in [
        ("claim_initial (create)", "1 txn", claim),
        ("owner (read)", "1 get", owner),
        ("take_over (CAS)", "1 get + 1 txn", take),
        ("release", "1 get + 1 txn", release),
    ] {
        let (p50, p99, max) = percentiles(&mut samples);
        table.push_str(&format!("| {name} | {requests} | {p50:.2} | {p99:.2} | {max:.2} |\n"));
    }
    Ok(table)
}

fn main() {
    let args = Args::parse();
    let private = match &args.endpoint {
        Some(_) => None,
        None => match PrivateEtcd::start() {
            Ok(etcd) => Some(etcd),
            Err(e) => {
                eprintln!("ferry-fence-bench: {e}");
                std::process::exit(1);
            }
        },
    };
    let endpoint = args.endpoint.clone().or(private.as_ref().map(|p| p.endpoint.clone()));
    let result = run(&args, endpoint.as_deref().unwrap_or_default());
    drop(private);
    match result.and_then(|table| {
        std::fs::write(&args.out, &table).map_err(|e| format!("{}: {e}", args.out.display()))?;
        Ok(table)
    }) {
        Ok(table) => print!("{table}\n(written to {})\n", args.out.display()),
        Err(e) => {
            eprintln!("ferry-fence-bench: {e}");
            std::process::exit(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::percentiles;

    #[test]
    fn percentiles_of_a_hundred_samples() {
        let mut s: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        assert_eq!(percentiles(&mut s), (50.0, 99.0, 100.0));
        assert_eq!(percentiles(&mut [3.0]), (3.0, 3.0, 3.0));
    }
}
