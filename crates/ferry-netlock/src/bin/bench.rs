//! Cost of each phase of a network lock (prepare, engage, disengage, thaw)
//! per method as a function of the number of tuples. Run by bench/netlock.sh (as root):
//!
//!     ferry-netlock-bench [--reps R] [--methods ebpf,nftables,iptables] [--sizes 0,100,...]
//!
//! Works in a scratch network namespace it creates (`ip netns add
//! ferry-nl-bench-<pid>`) and deletes; tuples are synthetic (192.0.2.0/24 ->
//! 198.51.100.0/24, documentation ranges). Prints a Markdown table of the
//! median over R runs.

use ferry_netlock::{Method, Netns, NetworkLock, Tuple};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::Command;
use std::time::Instant;

struct ScratchNetns(String);

impl ScratchNetns {
    fn create() -> Result<ScratchNetns, String> {
        let name = format!("ferry-nl-bench-{}", std::process::id());
        let ok = Command::new("ip")
            .args(["netns", "add", &name])
            .status()
            .map_err(|e| format!("ip netns add: {e}"))?;
        if !ok.success() {
            return Err(format!("ip netns add {name} failed"));
        }
        let ns = ScratchNetns(name);
        let _ = Command::new("ip")
            .args(["netns", "exec", &ns.0, "ip", "link", "set", "lo", "up"])
            .status();
        Ok(ns)
    }
}

impl Drop for ScratchNetns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

fn synthetic(n: usize) -> Vec<Tuple> {
    (0..n)
        .map(|i| Tuple {
            local: SocketAddr::new(
                IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1 + (i % 250) as u8)),
                10_000 + (i / 250) as u16,
            ),
            remote: SocketAddr::new(
                IpAddr::V4(Ipv4Addr::new(198, 51, 100, 1 + (i % 200) as u8)),
                40_000 + (i % 20_000) as u16,
            ),
        })
        .collect()
}

fn ms(start: Instant) -> f64 {
    start.elapsed().as_secs_f64() * 1e3
}

/// One lock's life; returns prepare, engage, disengage, thaw and
/// engage + disengage in milliseconds.
fn one_run(
    method: Method,
    netns: &Netns,
    tuples: &[Tuple],
) -> Result<[f64; 5], ferry_netlock::NetlockError> {
    let start = Instant::now();
    let mut lock = NetworkLock::prepare(method, netns, "bench")?;
    let prepare = ms(start);
    let start = Instant::now();
    lock.engage(tuples)?;
    let engage = ms(start);
    let start = Instant::now();
    lock.disengage()?;
    let disengage = ms(start);
    let start = Instant::now();
    lock.thaw()?;
    let thaw = ms(start);
    Ok([prepare, engage, disengage, thaw, engage + disengage])
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Cost of each phase of a network lock per method and number of tuples,
/// in a scratch network namespace (needs root); prints a Markdown table.
#[derive(clap::Parser)]
#[command(name = "ferry-netlock-bench")]
struct Args {
    /// Runs per method and size (the median is printed), 1-100.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u16).range(1..=100))]
    reps: u16,
    /// Lock methods, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "ebpf,nftables,iptables")]
    methods: Vec<Method>,
    /// Numbers of tuples, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "0,100,500,1000,2000,5000,10000")]
    sizes: Vec<usize>,
}

fn main() {
    let args = <Args as clap::Parser>::parse();
    let (reps, methods, sizes) = (usize::from(args.reps), args.methods, args.sizes);
    let ns = match ScratchNetns::create() {
        Ok(ns) => ns,
        Err(e) => {
            eprintln!("ferry-netlock-bench: {e} (needs root and iproute2)");
            std::process::exit(1);
        }
    };
    let netns = Netns::Path(format!("/run/netns/{}", ns.0).into());
    ferry_netlock::release_stale();
    println!("| method | N | prepare (ms) | engage (ms) | disengage (ms) | thaw (ms) | engage + disengage (ms) |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    let mut failed = false;
    for method in &methods {
        for &n in &sizes {
            let tuples = synthetic(n);
            // prepare, engage, disengage, thaw, engage + disengage
            let mut cols: [Vec<f64>; 5] = Default::default();
            for _ in 0..reps {
                match one_run(*method, &netns, &tuples) {
                    Ok(times) => {
                        for (col, t) in cols.iter_mut().zip(times) {
                            col.push(t);
                        }
                    }
                    Err(e) => {
                        eprintln!("{method} N={n}: {e}");
                        failed = true;
                        break;
                    }
                }
            }
            if !cols[0].is_empty() {
                let [p, e, d, t, ed] = cols.map(median);
                println!("| {method} | {n} | {p:.2} | {e:.3} | {d:.3} | {t:.2} | {ed:.3} |");
            }
        }
    }
    drop(ns);
    if failed {
        std::process::exit(1);
    }
}
