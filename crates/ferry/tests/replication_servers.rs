//! Real servers failing over under hot-standby replication (test hosts of
//! tests/common/repl.rs: the server and `ferry replicate` in a, the
//! standby in b's ferryd, clients in c, etcd in w); host a dies in the
//! middle of the clients' work:
//!
//! - `memcached_fails_over_under_50_clients`: 50 connections each store
//!   a new value and increment a counter in every round trip
//!   (tests/replication/mc_clients.py), checking each reply; none fails,
//!   and afterwards b holds, for each, the last value and counter its
//!   client was told were stored.
//! - `nginx_download_goes_on_across_a_failover`: nginx (master and 2
//!   workers, the replicated tree) serves a 4 MiB file; the download
//!   started at a completes from b, byte for byte (sha256).
//!
//! Needs root, etcd and the servers; without them each test says so and
//! returns.

mod common;

use common::hosts::*;
use common::repl::*;
use common::{path_str, read_lossy, wait_for};
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

const MEMCACHED: &str = "/usr/bin/memcached";
const NGINX: &str = "/usr/sbin/nginx";

/// See replication_faults.rs: no failover the test does not ask for on a
/// loaded machine.
const PATIENT: [&str; 2] = ["--heartbeat-timeout-ms", "1000"];

/// Waits until something listens on the service address at `port`.
fn wait_listening(r: &Repl, port: &str, log: &std::path::Path) {
    let probe = format!(
        "import socket; socket.create_connection(('{}', {port}), timeout=2).close()",
        r.svc
    );
    let up = wait_for(Duration::from_secs(15), || {
        run_in(r.env.host("c"), 5, &["python3", "-c", &probe]).status.success()
    });
    assert!(up, "nothing listens on {}:{port}:\n{}", r.svc, read_lossy(log));
}

/// b took over; the service runs there only. Returns b's takeover line.
fn took_over(r: &Repl, program: &str) -> String {
    let blog = r.wait_b_log("took over", 20);
    r.assert_only_in("b", "a", program, "after the takeover");
    blog.lines().find(|l| l.contains("took over")).unwrap_or_default().to_string()
}

#[test]
fn memcached_fails_over_under_50_clients() {
    const TEST: &str = "repl-memcached";
    if !have(TEST, &[MEMCACHED, ETCD, "python3", "iptables"]) {
        return;
    }
    let t0 = Instant::now();
    let r = Repl::new("sm", &[]);
    let log = r.log("memcached.log");
    let argv = [MEMCACHED, "-t", "4", "-p", "11211", "-U", "0", "-l", &r.svc, "-u", "root"];
    let mc = start_in(r.env.host("a"), &argv, &r.env.dir.0, &log, &[]);
    wait_listening(&r, "11211", &log);
    let extra = [PATIENT[0], PATIENT[1], "--ignore-writes", path_str(&log)];
    let mut rep = r.replicate(mc.inner, &extra, &[]);
    let (clients, out) = clients(&r, "mc_clients.py", &[&r.svc, "11211", "50", "10"]);
    std::thread::sleep(Duration::from_secs(3));
    r.kill_host("a");
    let _ = rep.wait(Duration::from_secs(10));
    let results = client_results(clients, &out);
    let line = took_over(&r, "memcached");
    for (i, c) in results.iter().enumerate() {
        assert!(c["count"].as_u64().unwrap_or(0) > 0, "connection {i} got no reply: {c}");
    }
    let script = format!("{}/../../tests/replication/mc_clients.py", env!("CARGO_MANIFEST_DIR"));
    let check = run_in(
        r.env.host("c"),
        60,
        &["python3", &script, &r.svc, "11211", "50", "check", path_str(&out)],
    );
    assert!(check.status.success() && check.stdout.trim() == "ok", "values at b: {}", check.show());
    let rounds: u64 = results.iter().map(|c| c["count"].as_u64().unwrap_or(0)).sum();
    let longest = results.iter().map(|c| c["gap_ms"].as_f64().unwrap_or(0.0)).fold(0.0, f64::max);
    eprintln!("[{TEST}] {line}");
    eprintln!(
        "[{TEST}] {rounds} round trips over 50 connections, 0 failed; the longest wait {longest:.0} ms; {:.1} s",
        t0.elapsed().as_secs_f64()
    );
}

/// `len` bytes that do not compress or repeat (xorshift).
fn noise(len: usize) -> Vec<u8> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

fn sha256(path: &std::path::Path) -> String {
    let out = std::process::Command::new("sha256sum").arg(path).output().expect("sha256sum");
    String::from_utf8_lossy(&out.stdout).split_whitespace().next().unwrap_or("").to_string()
}

/// nginx (master + 2 workers as nobody) in a serving `www` on port 8080.
fn start_nginx_in_a(r: &Repl) -> Started {
    let n = start_nginx(r.env.host("a"), &r.env.dir.0, &r.svc, "application/octet-stream bin");
    wait_listening(r, "8080", &r.log("error.log"));
    n
}

#[test]
fn nginx_download_goes_on_across_a_failover() {
    const TEST: &str = "repl-nginx";
    if !have(TEST, &[NGINX, ETCD, "curl", "python3", "iptables", "sha256sum"]) {
        return;
    }
    const SIZE: usize = 4 << 20;
    let t0 = Instant::now();
    let r = Repl::new("sn", &[]);
    // The test's directory is nobody's to read, as nginx's workers are.
    fs::set_permissions(&r.env.dir.0, fs::Permissions::from_mode(0o755)).expect("chmod dir");
    let www = r.log("www");
    fs::create_dir_all(&www).expect("www");
    fs::set_permissions(&www, fs::Permissions::from_mode(0o755)).expect("chmod www");
    let file = www.join("big.bin");
    fs::write(&file, noise(SIZE)).expect("write the file");
    fs::set_permissions(&file, fs::Permissions::from_mode(0o644)).expect("chmod file");
    let nginx = start_nginx_in_a(&r);
    let (err_log, stdio) = (r.log("error.log"), r.log("nginx.stdio"));
    let extra = [
        PATIENT[0],
        PATIENT[1],
        "--ignore-writes",
        path_str(&err_log),
        "--ignore-writes",
        path_str(&stdio),
    ];
    let mut rep = r.replicate(nginx.inner, &extra, &[]);
    // The download, slowed so that the failover falls in its middle.
    let got = r.log("got.bin");
    let url = format!("http://{}:8080/big.bin", r.svc);
    let (curl_out, curl_err) = (r.log("curl.out"), r.log("curl.err"));
    let mut cmd = r.env.host("c").command(&[
        "curl",
        "-sS",
        "--limit-rate",
        "1M",
        "--max-time",
        "90",
        "-o",
        path_str(&got),
        &url,
    ]);
    cmd.stdout(fs::File::create(&curl_out).expect("curl out"))
        .stderr(fs::File::create(&curl_err).expect("curl err"))
        .stdin(std::process::Stdio::null());
    let mut curl = ferry_testkit::only_stdio(&mut cmd).spawn().expect("curl");
    let size = || fs::metadata(&got).map(|m| m.len()).unwrap_or(0);
    let started = wait_for(Duration::from_secs(40), || size() >= 1 << 20);
    assert!(started, "1 MiB never arrived ({} bytes):\n{}", size(), read_lossy(&curl_err));
    let at_kill = size();
    r.kill_host("a");
    let _ = rep.wait(Duration::from_secs(10));
    let st = wait_timeout(&mut curl, Duration::from_secs(100));
    let st = st.unwrap_or_else(|| panic!("curl did not end ({} bytes)", size()));
    assert!(st.success(), "curl: {}\n{}", describe(&st), read_lossy(&curl_err));
    let line = took_over(&r, "nginx");
    assert!(at_kill < SIZE as u64, "the download ended before the failover");
    assert_eq!(size(), SIZE as u64, "bytes downloaded");
    assert_eq!(sha256(&got), sha256(&file), "the download's content");
    eprintln!("[{TEST}] {line}");
    eprintln!(
        "[{TEST}] {at_kill} of {SIZE} bytes had arrived at the failover; {:.1} s",
        t0.elapsed().as_secs_f64()
    );
}
