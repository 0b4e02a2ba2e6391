//! `ferry network-lock`: show and release the network locks that keep
//! packets of checkpointed TCP connections from reaching the stack, and the
//! eBPF bases (one program per network namespace) they use.

use anyhow::{bail, Context, Result};
use clap::Args;

#[derive(Args)]
#[command(group(clap::ArgGroup::new("action").required(true).args(["status", "release", "all", "release_stale", "install_base"])))]
pub struct NetworkLockArgs {
    /// List every network lock: name, method, state (owned by a running
    /// ferry, or handed-over to an image waiting for restore), phase
    /// (prepared: nothing dropped yet; engaged: dropping; disengaged:
    /// dropping stopped, not yet released), owner PID,
    /// number of frozen connections, age. Stale locks (owner died while
    /// owning them) are marked. Then every eBPF base: the lock program that
    /// the first eBPF lock of a network namespace loads and attaches to its
    /// interfaces and that later locks reuse (links attached, locks using
    /// it, namespace); a base whose namespace is gone is marked DEAD.
    #[arg(long)]
    status: bool,
    /// Release this lock now, whoever holds it: its connections' packets
    /// flow again. A handed-over lock released so cannot be restored
    /// without resets. Given a base's name (ns<cookie>-<hash>), detach and
    /// remove that base; refused while a lock uses it.
    #[arg(long, value_name = "NAME")]
    release: Option<String>,
    /// Release every network lock, then every eBPF base.
    #[arg(long)]
    all: bool,
    /// Release only the stale locks, those whose owner died while owning
    /// them, and the bases of namespaces that are gone (ferry does this at
    /// the start of every run).
    #[arg(long)]
    release_stale: bool,
    /// Install the eBPF base of this network namespace now: the lock
    /// program loaded and attached to every interface, as the first eBPF
    /// lock here would (tens to hundreds of milliseconds). Every
    /// checkpoint, migration or sync after it only claims a slot of the
    /// base. Run it once per host (or network namespace), for example at
    /// boot; the base stays until `--release NAME` or `--all`. Prints the
    /// base's name and what the installation took.
    #[arg(long)]
    install_base: bool,
    /// With --install-base: the network namespace to install it in (a
    /// path such as /run/netns/NAME or /proc/PID/ns/net) instead of
    /// ferry's own.
    #[arg(long, value_name = "PATH")]
    netns: Option<std::path::PathBuf>,
}

fn human_age(age: std::time::Duration) -> String {
    let s = age.as_secs();
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        3600..=86_399 => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d{:02}h", s / 86_400, (s % 86_400) / 3600),
    }
}

fn print_status() {
    print_locks();
    print_bases();
}

fn print_bases() {
    let bases = ferry_netlock::base_status();
    if bases.is_empty() {
        println!("no eBPF lock bases");
        return;
    }
    println!();
    println!("{:<28} {:>5} {:>7} {:>7}  NETNS", "BASE", "LINKS", "LOCKS", "AGE");
    for base in bases {
        let mut netns = base.netns.clone();
        if base.dead {
            netns.push_str(" DEAD");
        }
        println!(
            "{:<28} {:>5} {:>7} {:>7}  {}",
            base.name,
            base.links,
            base.locks.len(),
            human_age(base.age),
            netns
        );
    }
}

fn print_locks() {
    let locks = ferry_netlock::status();
    if locks.is_empty() {
        println!("no network locks");
        return;
    }
    println!(
        "{:<24} {:<9} {:<12} {:<10} {:<8} {:>7} {:>7}  NETNS",
        "NAME", "METHOD", "STATE", "PHASE", "OWNER", "TUPLES", "AGE"
    );
    for lock in locks {
        let method = lock.method.map_or("?".to_string(), |m| m.to_string());
        let mut state = lock.state.map_or("incomplete".to_string(), |s| s.to_string());
        if lock.stale {
            state.push_str(" STALE");
        }
        let phase = lock.phase.map_or("?".to_string(), |p| p.to_string());
        let owner = lock.owner.map_or("-".to_string(), |o| o.pid.to_string());
        println!(
            "{:<24} {:<9} {:<12} {:<10} {:<8} {:>7} {:>7}  {}",
            lock.name,
            method,
            state,
            phase,
            owner,
            lock.tuples,
            human_age(lock.age),
            lock.netns
        );
    }
}

/// The live eBPF base of the network namespace at `ns`: its name.
fn base_of(ns: &std::path::Path) -> Result<Option<String>> {
    use std::os::unix::fs::MetadataExt;
    let inode = std::fs::metadata(ns)
        .with_context(|| format!("reading network namespace {}", ns.display()))?
        .ino();
    Ok(ferry_netlock::base_of(inode).map(|b| b.name))
}

fn install_base(netns: Option<std::path::PathBuf>) -> Result<i32> {
    use ferry_netlock::Netns;
    let (ns, path, here) = match netns {
        Some(p) => {
            (Netns::Path(p.clone()), p.clone(), format!("network namespace {}", p.display()))
        }
        None => (Netns::Current, "/proc/self/ns/net".into(), "this network namespace".into()),
    };
    if let Some(name) = base_of(&path)? {
        println!("eBPF lock base {name} is already installed in {here}");
        return Ok(0);
    }
    let t = std::time::Instant::now();
    ferry_netlock::install_base(&ns)
        .with_context(|| format!("installing the eBPF lock base in {here}"))?;
    let ms = t.elapsed().as_secs_f64() * 1e3;
    match base_of(&path)? {
        Some(name) => println!("installed eBPF lock base {name} in {here} in {ms:.1} ms"),
        None => bail!("the eBPF lock base of {here} was installed but is not listed as live (ferry network-lock --status)"),
    }
    Ok(0)
}

pub fn run(args: NetworkLockArgs) -> Result<i32> {
    if args.install_base {
        return install_base(args.netns);
    }
    if args.netns.is_some() {
        bail!("--netns goes with --install-base");
    }
    if args.status {
        print_status();
        return Ok(0);
    }
    if args.release_stale {
        let released = ferry_netlock::release_stale();
        if released.is_empty() {
            println!("no stale network locks");
        }
        for name in released {
            if name.contains('-') {
                println!("released eBPF lock base {name} (its namespace is gone)");
            } else {
                println!("released stale network lock {name}");
            }
        }
        return Ok(0);
    }
    let names: Vec<String> = match (&args.release, args.all) {
        (Some(name), false) => vec![name.clone()],
        (None, true) => ferry_netlock::status()
            .into_iter()
            .map(|s| s.name)
            .chain(ferry_netlock::base_status().into_iter().map(|b| b.name))
            .collect(),
        _ => bail!("use --release NAME or --all"),
    };
    let mut failed = 0;
    for name in &names {
        match ferry_netlock::release(name).with_context(|| format!("releasing network lock {name}"))
        {
            Ok(()) if name.contains('-') => println!("released eBPF lock base {name}"),
            Ok(()) => println!("released network lock {name}"),
            Err(e) => {
                eprintln!("ferry: error: {e:#}");
                failed += 1;
            }
        }
    }
    if names.is_empty() {
        println!("no network locks");
    }
    Ok(if failed > 0 { 1 } else { 0 })
}
