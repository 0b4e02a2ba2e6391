//! Helpers shared by the integration tests: what a test makes, a guard
//! removes on drop.

// Each test binary uses a different part of this module.
#![allow(dead_code)]

pub mod btrfs;
pub mod cluster;
pub mod conformance;
pub mod hosts;
pub mod repl;

use std::fs::{self, File};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// A file's bytes as text; empty when it cannot be read (not written yet).
pub fn read_lossy(p: &Path) -> String {
    fs::read(p).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default()
}

pub fn path_str(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// Polls `f` every 10 ms until it is true (true) or `timeout` passed (false).
pub fn wait_for(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A network namespace made for one test, deleted on drop (shared with
/// other crates' tests).
pub use ferry_testkit::NetNs;

/// The inode of a file (a namespace's identity), 0 if it cannot be read.
pub fn inode(path: &str) -> u64 {
    use std::os::unix::fs::MetadataExt;
    fs::metadata(path).map(|m| m.ino()).unwrap_or(0)
}

/// The PID of `pid` in the innermost PID namespace it is in.
pub fn innermost_pid(pid: i32) -> Option<i32> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| l.strip_prefix("NSpid:"))?.split_whitespace().last()?.parse().ok()
}

/// Two test hosts, A and B, on one veth link, each a network namespace
/// made for one test: A has `a_v4`/`a_v6`, B `b_v4`/`b_v6`. Removed on drop.
pub struct TestHosts {
    pub a: NetNs,
    pub b: NetNs,
}

pub const A_V4: &str = "192.0.2.1";
pub const B_V4: &str = "192.0.2.2";
pub const A_V6: &str = "fd00:f3::1";
pub const B_V6: &str = "fd00:f3::2";

fn ip(args: &[&str]) {
    let st = Command::new("ip").args(args).status().expect("run ip");
    assert!(st.success(), "ip {args:?} failed");
}

impl TestHosts {
    pub fn new(tag: &str) -> TestHosts {
        let a = NetNs::new(&format!("{tag}a")).expect("ip netns add");
        let b = NetNs::new(&format!("{tag}b")).expect("ip netns add");
        ip(&["-n", &a.0, "link", "add", "va", "type", "veth", "peer", "name", "vb", "netns", &b.0]);
        for (ns, dev, v4, v6) in [(&a, "va", A_V4, A_V6), (&b, "vb", B_V4, B_V6)] {
            ip(&["-n", &ns.0, "addr", "add", &format!("{v4}/24"), "dev", dev]);
            ip(&["-n", &ns.0, "addr", "add", &format!("{v6}/64"), "dev", dev, "nodad"]);
            ip(&["-n", &ns.0, "link", "set", dev, "up"]);
        }
        TestHosts { a, b }
    }
}

/// Starts `program` in network namespace `ns`, in a new session, with only
/// fds 0-2 (stdin /dev/null, stdout and stderr to `log`).
pub fn spawn_in_netns(
    ns: &NetNs,
    cwd: &std::path::Path,
    log: &std::path::Path,
    program: &std::path::Path,
    args: &[&str],
) -> std::process::Child {
    use std::process::Stdio;
    let logf = File::create(log).expect("program log");
    let mut cmd = Command::new(program);
    cmd.args(args)
        .current_dir(cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::from(logf.try_clone().expect("dup log")))
        .stderr(Stdio::from(logf));
    ferry_testkit::own_session_in_netns(&mut cmd, std::path::Path::new(&ns.path()));
    cmd.spawn().unwrap_or_else(|e| panic!("start {}: {e}", program.display()))
}

/// (name, owner) of every network lock `ferry network-lock --status`
/// lists. Tests run in parallel, so a test looks at its own lock only.
pub fn network_locks(ferry: &str) -> Vec<(String, String)> {
    let out = Command::new(ferry)
        .args(["network-lock", "--status"])
        .output()
        .expect("ferry network-lock");
    assert!(out.status.success(), "ferry network-lock --status failed");
    parse_network_locks(&String::from_utf8_lossy(&out.stdout))
}

/// (name, owner) of every lock in the output of `ferry network-lock --status`.
pub fn parse_network_locks(text: &str) -> Vec<(String, String)> {
    let mut lines = text.lines();
    let Some(header) = lines.next() else {
        return Vec::new();
    };
    let Some(owner_col) = header.split_whitespace().position(|h| h == "OWNER") else {
        return Vec::new();
    };
    // The locks' table ends at the blank line before the bases' table.
    lines
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            // A stale lock's state carries a second word.
            let shift = usize::from(w.contains(&"STALE"));
            Some((w.first()?.to_string(), w.get(owner_col + shift).unwrap_or(&"-").to_string()))
        })
        .collect()
}

/// The network lock an image refers to.
pub fn image_lock(ferry: &str, images: &str) -> Option<String> {
    let out =
        Command::new(ferry).args(["inspect", "--json", images]).output().expect("ferry inspect");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("inspect json");
    v["tree"]["network_lock"]["name"].as_str().map(String::from)
}

/// For a failure report: each network namespace's TCP sockets in detail
/// (`ss -tinm`: timers, windows, and the socket's own drop count `d` in
/// skmem) and its nonzero TCP counters (why segments were refused: PAWS,
/// window, memory...), read from its /proc/net/netstat and /proc/net/snmp
/// (nstat keeps a history file shared by every namespace, which mixes
/// one namespace's counters into another's report).
pub fn tcp_diagnostics(namespaces: &[&str]) -> String {
    let run = |ns: &str, args: &[&str]| {
        Command::new("ip")
            .args(["netns", "exec", ns])
            .args(args)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    };
    namespaces
        .iter()
        .map(|ns| {
            let counters = nonzero_tcp_counters(&run(ns, &["cat", "/proc/net/netstat", "/proc/net/snmp"]));
            let sockets: String = run(ns, &["ss", "-tinm"]).lines().take(400).collect::<Vec<_>>().join("\n");
            format!("--- {ns}: nonzero TCP counters:\n{}\n--- {ns}: ss -tinm (first 400 lines):\n{sockets}\n", counters.join("\n"))
        })
        .collect()
}

/// The nonzero counters of the TcpExt and Tcp lines of /proc/net/netstat
/// and /proc/net/snmp text (each a header line of names, then a line of
/// values), as "TcpExtName value".
pub fn nonzero_tcp_counters(text: &str) -> Vec<String> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for pair in lines.windows(2) {
        let (Some((kind, names)), Some((kind2, values))) =
            (pair[0].split_once(':'), pair[1].split_once(':'))
        else {
            continue;
        };
        if kind != kind2
            || !(kind == "TcpExt" || kind == "Tcp")
            || names.trim_start().starts_with(|c: char| c.is_ascii_digit())
        {
            continue;
        }
        for (n, v) in names.split_whitespace().zip(values.split_whitespace()) {
            if v != "0" && !v.is_empty() {
                out.push(format!("{kind}{n} {v}"));
            }
        }
    }
    out
}
