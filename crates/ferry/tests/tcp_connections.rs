//! Established TCP connections across checkpoint and restore, checked byte
//! for byte in both directions.
//!
//! A server (`tests/tcp/tcp_hold_server.c`) runs in test host A (a network
//! namespace made by the test); N clients run in this test process, in test
//! host B (another namespace, joined by a veth pair) or on A's loopback.
//! Each connection has data in flight both ways at the checkpoint: the
//! client's bytes wait unread in the server's receive queue, the server's
//! wait unacknowledged and unsent in its send queue, and the client keeps
//! pushing more while the network lock holds its packets. The server is
//! checkpointed (which kills it), restored into A, and then every byte of
//! both streams is checked; no client may see a reset, a lost, duplicated
//! or reordered byte.
//!
//! Each test makes its own namespaces (unique names), removes them on drop,
//! kills only the processes it started, and checks that no network lock is
//! left behind.

mod common;

use common::{image_lock, network_locks, spawn_in_netns, TestHosts, A_V4, A_V6};
use ferry_testkit::require_root;
use ferry_testkit::TempDir;
use std::fs::{self, File};
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread::sleep;
use std::time::{Duration, Instant};

const FERRY: &str = env!("CARGO_BIN_EXE_ferry");
const POLL: Duration = Duration::from_millis(10);

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Compiles tests/tcp/tcp_hold_server.c once per test process.
fn server_binary() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            let dir =
                Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("tcp-{}", std::process::id()));
            fs::create_dir_all(&dir).expect("build dir");
            let bin = dir.join("tcp_hold_server");
            let out = Command::new("gcc")
                .args(["-O1", "-g", "-Wall", "-o"])
                .arg(&bin)
                .arg(repo().join("tests/tcp/tcp_hold_server.c"))
                .output()
                .expect("run gcc");
            assert!(out.status.success(), "gcc failed: {}", String::from_utf8_lossy(&out.stderr));
            bin
        })
        .clone()
}

type Hosts = TestHosts;

/// The server process; killed (by PID) and reaped on drop.
struct Server {
    child: Option<Child>,
    log: PathBuf,
    pid: i32,
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(c) = &mut self.child {
            // A restored server is the child of `ferry restore`, which does
            // not pass SIGKILL on: end it first, by PID, if it is still that
            // child (so a reused PID is never signalled).
            if self.pid > 0 && parent_of(self.pid) == Some(c.id() as i32) {
                ferry_testkit::kill(self.pid, libc::SIGKILL);
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The parent PID of `pid` (field 4 of /proc/PID/stat).
fn parent_of(pid: i32) -> Option<i32> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat[stat.rfind(')')? + 1..].split_whitespace().nth(1)?.parse().ok()
}

fn read_lossy(p: &Path) -> String {
    fs::read(p).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default()
}

fn wait_line(log: &Path, line: &str, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    while !read_lossy(log).lines().any(|l| l == line) {
        assert!(
            Instant::now() < deadline,
            "no {line} within {timeout:?}; log:\n{}",
            read_lossy(log)
        );
        sleep(POLL);
    }
}

fn start_server(
    netns: &common::NetNs,
    dir: &Path,
    addr: &str,
    port: u16,
    n: usize,
    client_bytes: usize,
    server_bytes: usize,
) -> Server {
    let log = dir.join("server.log");
    let args = [
        addr.to_string(),
        port.to_string(),
        n.to_string(),
        client_bytes.to_string(),
        server_bytes.to_string(),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let child = spawn_in_netns(netns, dir, &log, &server_binary(), &args);
    let pid = child.id() as i32;
    let server = Server { child: Some(child), log, pid };
    wait_line(&server.log, "LISTENING", Duration::from_secs(10));
    server
}

/// The C program `source` (relative to the repository) compiled into
/// `dir` and started in `netns`, its output in `dir`/server.log.
fn compiled_server(netns: &common::NetNs, dir: &Path, source: &str, args: &[&str]) -> Server {
    let name = Path::new(source).file_stem().and_then(|s| s.to_str()).unwrap_or("server");
    let bin = dir.join(name);
    ferry_testkit::compile_c(&repo().join(source), &bin);
    let log = dir.join("server.log");
    let child = spawn_in_netns(netns, dir, &log, &bin, args);
    Server { pid: child.id() as i32, child: Some(child), log }
}

/// examples/counter_server.c started in `netns` (built into `dir`), and
/// a connection to it from this process on the namespace's loopback.
fn counter_server_and_client(netns: &common::NetNs, dir: &Path) -> (Server, TcpStream) {
    let server = compiled_server(netns, dir, "examples/counter_server.c", &["0"]);
    let deadline = Instant::now() + Duration::from_secs(10);
    let port: u16 = loop {
        let line = read_lossy(&server.log);
        if let Some(p) = line.split_whitespace().nth(3).and_then(|a| a.rsplit(':').next()) {
            if let Ok(p) = p.parse() {
                break p;
            }
        }
        assert!(Instant::now() < deadline, "server did not start: {line}");
        sleep(POLL);
    };
    let stream = netns.run(|| TcpStream::connect(("127.0.0.1", port)).expect("connect"));
    (server, stream)
}

/// The byte at `i` of stream `seed` (the same pattern as ferry_test.h).
fn pat(seed: u64, i: usize) -> u8 {
    let w = i as u64 / 8;
    let mut x = seed
        .wrapping_mul(0x9E3779B97F4A7C15)
        .wrapping_add(w.wrapping_mul(0xBF58476D1CE4E5B9))
        .wrapping_add(0x1234567);
    x ^= x >> 31;
    x = x.wrapping_mul(0x94D049BB133111EB);
    x ^= x >> 29;
    (x >> (8 * (i % 8))) as u8
}

struct ClientConn {
    id: u32,
    s: TcpStream,
    sent: usize,
    got: usize,
    eof: bool,
    shut: bool,
    error: Option<String>,
}

impl ClientConn {
    fn push(&mut self, limit: usize) {
        let mut buf = vec![0u8; 16384];
        while self.sent < limit && self.error.is_none() {
            let n = buf.len().min(limit - self.sent);
            for (k, b) in buf[..n].iter_mut().enumerate() {
                *b = pat(2 * self.id as u64, self.sent + k);
            }
            match self.s.write(&buf[..n]) {
                Ok(0) => break,
                Ok(w) => self.sent += w,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) => {
                    self.error =
                        Some(format!("conn {}: write after {} bytes: {e}", self.id, self.sent))
                }
            }
        }
    }
    fn pull(&mut self, server_bytes: usize) {
        let mut buf = vec![0u8; 65536];
        while !self.eof && self.error.is_none() {
            match self.s.read(&mut buf) {
                Ok(0) => {
                    if self.got != server_bytes {
                        self.error = Some(format!(
                            "conn {}: EOF after {} of {server_bytes} bytes",
                            self.id, self.got
                        ));
                    }
                    self.eof = true;
                }
                Ok(r) => {
                    if let Some(k) =
                        (0..r).find(|&k| buf[k] != pat(2 * self.id as u64 + 1, self.got + k))
                    {
                        self.error =
                            Some(format!("conn {}: byte {} differs", self.id, self.got + k));
                    }
                    self.got += r;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) => {
                    self.error =
                        Some(format!("conn {}: read after {} bytes: {e}", self.id, self.got))
                }
            }
        }
    }
}

/// The clients' side, run on a thread that joined the clients' network
/// namespace (None: stay in the test's own).
struct Load {
    n: usize,
    to: SocketAddr,
    client_bytes: usize,
    server_bytes: usize,
}

/// Result of the clients' run: errors, one line each.
type Outcome = Vec<String>;

/// How much of each client stream the server leaves unread before the
/// checkpoint, and how much more at most comes while it is frozen:
/// together well inside the default 128 KiB receive buffer.
const UNREAD_CLIENT_BYTES: usize = 32 << 10;

fn run_clients(
    netns: Option<String>,
    load: Load,
    ready: mpsc::Sender<()>,
    go: mpsc::Receiver<()>,
    diagnose: Vec<String>,
) -> std::thread::JoinHandle<Outcome> {
    std::thread::spawn(move || {
        if let Some(ns) = netns {
            ferry_testkit::enter_netns(format!("/run/netns/{ns}"));
        }
        let mut conns = Vec::with_capacity(load.n);
        for id in 0..load.n as u32 {
            let mut s = match TcpStream::connect_timeout(&load.to, Duration::from_secs(10)) {
                Ok(s) => s,
                Err(e) => return vec![format!("connect {id}: {e}")],
            };
            if let Err(e) = s.write_all(&id.to_ne_bytes()) {
                return vec![format!("conn {id}: sending the id: {e}")];
            }
            s.set_nonblocking(true).expect("nonblocking");
            conns.push(ClientConn { id, s, sent: 0, got: 0, eof: false, shut: false, error: None });
        }
        // The start of every client stream waits unread in the server's
        // receive queue. No more than the queue holds: a segment the
        // server's kernel drops for want of buffer space is retransmitted
        // with an exponential backoff that grows as long as the server
        // does not read (up to 120 s), which would stall the connection
        // after restore for a time that depends on how long the setup took.
        let half = (load.client_bytes / 2).min(UNREAD_CLIENT_BYTES);
        let until = Instant::now() + Duration::from_secs(20);
        loop {
            let before: usize = conns.iter().map(|c| c.sent).sum();
            conns.iter_mut().for_each(|c| c.push(half));
            let after: usize = conns.iter().map(|c| c.sent).sum();
            if after == before || Instant::now() > until {
                break;
            }
        }
        let _ = ready.send(());
        // Keep pushing, a little at a time, while the server is frozen,
        // checkpointed and restored: these packets meet the network lock.
        // At most another UNREAD_CLIENT_BYTES, so the server's receive
        // queue still holds all of it.
        // A quarter of the stream stays for after the restore.
        let frozen_limit =
            (half + UNREAD_CLIENT_BYTES).min(load.client_bytes - load.client_bytes / 4).max(half);
        let mut target = half;
        loop {
            match go.try_recv() {
                Ok(()) | Err(mpsc::TryRecvError::Disconnected) => break,
                Err(mpsc::TryRecvError::Empty) => {}
            }
            target = (target + 256).min(frozen_limit);
            conns.iter_mut().for_each(|c| c.push(target));
            sleep(Duration::from_millis(2));
        }
        let deadline = Instant::now() + Duration::from_secs(90);
        let mut last_progress = Instant::now();
        let mut stall_report = None;
        while Instant::now() < deadline
            && conns.iter().any(|c| c.error.is_none() && !(c.eof && c.shut))
        {
            if stall_report.is_none() && last_progress.elapsed() > Duration::from_secs(10) {
                let stuck: Vec<String> = conns
                    .iter()
                    .filter(|c| c.error.is_none() && !(c.eof && c.shut))
                    .take(5)
                    .map(|c| {
                        format!(
                            "conn {} got {} sent {} eof {} shut {}",
                            c.id, c.got, c.sent, c.eof, c.shut
                        )
                    })
                    .collect();
                stall_report = Some(format!(
                    "no progress for 10 s: {stuck:?}\n{}",
                    common::tcp_diagnostics(
                        &diagnose.iter().map(String::as_str).collect::<Vec<_>>()
                    )
                ));
            }
            let mut progress = false;
            for c in conns.iter_mut() {
                let (got, sent) = (c.got, c.sent);
                c.pull(load.server_bytes);
                c.push(load.client_bytes);
                if c.sent == load.client_bytes && !c.shut && c.error.is_none() {
                    if let Err(e) = c.s.shutdown(Shutdown::Write) {
                        c.error = Some(format!("conn {}: shutdown: {e}", c.id));
                    }
                    c.shut = true;
                }
                progress |= c.got != got || c.sent != sent;
            }
            if progress {
                last_progress = Instant::now();
            } else {
                sleep(Duration::from_millis(1));
            }
        }
        let mut errors: Vec<String> = conns.iter().filter_map(|c| c.error.clone()).collect();
        if let Some(r) = stall_report {
            errors.insert(0, r);
        }
        let unfinished = conns.iter().filter(|c| c.error.is_none() && !(c.eof && c.shut)).count();
        if unfinished > 0 {
            errors.push(format!("{unfinished} connections did not finish within 90 s"));
        }
        errors
    })
}

fn ferry(args: &[&str], out: &Path) -> ExitStatus {
    ferry_with_nofile(None, args, out)
}

/// `ferry ARGS`, with its descriptor limit (soft and hard) lowered to
/// `nofile` when given.
fn ferry_with_nofile(nofile: Option<u32>, args: &[&str], out: &Path) -> ExitStatus {
    let mut cmd = match nofile {
        Some(n) => {
            let mut c = Command::new("prlimit");
            c.arg(format!("--nofile={n}:{n}")).arg("--").arg(FERRY);
            c
        }
        None => Command::new(FERRY),
    };
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(File::create(out.with_extension("out")).expect("out"))
        .stderr(File::create(out).expect("err"));
    ferry_testkit::only_stdio(&mut cmd);
    cmd.status().expect("run ferry")
}

/// Checkpoints the server holding `n` connections from clients in B (or
/// on A's loopback) and restores it into A; asserts every byte arrived.
fn connections_survive(tag: &str, n: usize, v6: bool, loopback: bool, lock: &str) {
    connections_survive_with(tag, n, v6, loopback, lock, None);
}

/// The same, with `ferry checkpoint`'s descriptor limit lowered to
/// `nofile` when given.
fn connections_survive_with(
    tag: &str,
    n: usize,
    v6: bool,
    loopback: bool,
    lock: &str,
    nofile: Option<u32>,
) {
    require_root!();
    let hosts = Hosts::new(tag);
    let dir = TempDir::new("ferry-tcp", tag);
    let (client_bytes, server_bytes) =
        if n > 500 { (48 << 10, 48 << 10) } else { (1 << 20, 1 << 20) };
    let (listen, target) = match (v6, loopback) {
        (false, false) => (A_V4, A_V4),
        (true, false) => (A_V6, A_V6),
        (false, true) => ("127.0.0.1", "127.0.0.1"),
        (true, true) => ("::1", "::1"),
    };
    let port = 7000 + (std::process::id() % 1000) as u16;
    let mut server = start_server(&hosts.a, &dir.0, listen, port, n, client_bytes, server_bytes);
    if let Some(limit) = nofile {
        // The server's limit no higher than ferry's: restore sets it.
        let st = Command::new("prlimit")
            .args(["--pid", &server.pid.to_string(), &format!("--nofile={limit}:{limit}")])
            .status()
            .expect("run prlimit");
        assert!(st.success(), "prlimit of the server: {st:?}");
    }
    let to: SocketAddr =
        format!("{}:{port}", if v6 { format!("[{target}]") } else { target.to_string() })
            .parse()
            .expect("address");
    let (ready_tx, ready_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel();
    let client_ns = if loopback { hosts.a.0.clone() } else { hosts.b.0.clone() };
    let diagnose = vec![hosts.a.0.clone(), hosts.b.0.clone()];
    let clients = run_clients(
        Some(client_ns),
        Load { n, to, client_bytes, server_bytes },
        ready_tx,
        go_rx,
        diagnose,
    );
    ready_rx.recv_timeout(Duration::from_secs(120)).expect("clients ready");
    wait_line(&server.log, "READY", Duration::from_secs(60));

    let images = dir.0.join("images");
    let pid = server.pid.to_string();
    let images_s = images.to_string_lossy().to_string();
    let t = Instant::now();
    let st = ferry_with_nofile(
        nofile,
        &["checkpoint", "--pid", &pid, "--images", &images_s, "--network-lock", lock],
        &dir.0.join("checkpoint.err"),
    );
    assert!(st.success(), "checkpoint failed: {}", read_lossy(&dir.0.join("checkpoint.err")));
    let checkpoint_ms = t.elapsed().as_secs_f64() * 1e3;
    let method = lock;
    let lock = image_lock(FERRY, &images_s);
    assert!(lock.is_some(), "the image names no network lock");
    let mut child = server.child.take().expect("server child");
    let st = child.wait().expect("reap server");
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&st),
        Some(libc::SIGKILL),
        "server ended with {st:?}"
    );

    let pidfile = dir.0.join("pid");
    let t = Instant::now();
    let mut restore = Command::new(FERRY);
    restore
        .args(["restore", "--images", &images_s, "--netns", &hosts.a.0, "--pidfile"])
        .arg(&pidfile)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(File::create(dir.0.join("restore.err")).expect("restore err"));
    ferry_testkit::only_stdio(&mut restore);
    // The restore's decision on window probes, in its log.
    restore.env("FERRY_LOG", "ferry_engine::restore::held=debug");
    let restore = restore.spawn().expect("spawn restore");
    server.child = Some(restore);
    let deadline = Instant::now() + Duration::from_secs(60);
    while !read_lossy(&pidfile).ends_with('\n') {
        if let Some(st) = server.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
            panic!("restore exited with {st:?}: {}", read_lossy(&dir.0.join("restore.err")));
        }
        assert!(Instant::now() < deadline, "no pidfile within 60 s");
        sleep(POLL);
    }
    let restore_ms = t.elapsed().as_secs_f64() * 1e3;
    // Signalling the restored server, our grandchild, by PID.
    ferry_testkit::kill(server.pid, libc::SIGUSR2);
    let _ = go_tx.send(());
    let errors = clients.join().expect("client thread");
    let st = server.child.as_mut().expect("restore").wait().expect("wait restore");
    server.child = None;
    let log = read_lossy(&server.log);
    eprintln!("{tag}: {n} connections, checkpoint {checkpoint_ms:.1} ms, restore {restore_ms:.1} ms (commands, debug timing)");
    assert!(
        errors.is_empty(),
        "{} client errors, first: {:#?}\nserver log:\n{log}",
        errors.len(),
        &errors[..errors.len().min(5)]
    );
    assert!(
        st.success() && log.lines().any(|l| l == "PASS"),
        "server: {st:?}\n{log}\n{}",
        read_lossy(&dir.0.join("restore.err"))
    );
    if let Some(name) = lock {
        assert_lock_gone(&name);
    }
    assert_window_probes(method, n, loopback, &read_lossy(&dir.0.join("restore.err")));
}

/// Over the veth link the eBPF lock keeps what it drops (a few segments
/// of at most 1,500 bytes per connection, far from filling its ring), so
/// the restore sends no window probe; nftables and iptables keep nothing,
/// so it probes every connection. On loopback the segments are up to 64
/// KiB, each kept in a 64 KiB record, and about 120 fill the 8 MiB ring:
/// the lock may lose some there, and either answer is right.
fn assert_window_probes(method: &str, n: usize, loopback: bool, log: &str) {
    let want = match method {
        "ebpf" if n <= 100 && !loopback => "window probes: none",
        "ebpf" => return,
        _ => "window probes: one per rebuilt connection",
    };
    assert!(
        log.contains(want),
        "{method} lock, {n} connections: no \"{want}\" in the restore's log:\n{log}"
    );
}

fn locks() -> Vec<(String, String)> {
    network_locks(FERRY)
}

fn assert_lock_gone(name: &str) {
    let left = locks();
    assert!(!left.iter().any(|(n, _)| n == name), "network lock {name} was left behind: {left:?}");
}

#[test]
fn one_connection_from_another_host() {
    connections_survive("t1", 1, false, false, "ebpf");
}

#[test]
fn hundred_connections_from_another_host() {
    connections_survive("t100", 100, false, false, "ebpf");
}

/// With ferry's (and the server's) descriptor limit at 3,000: the checkpoint holds a copy
/// of each of the 2,000 connections, and its trial restore (a fork of
/// it) makes 2,000 sockets of its own, which fit only if the fork does
/// not keep the copies it inherited.
#[test]
fn two_thousand_connections_from_another_host() {
    connections_survive_with("t2k", 2000, false, false, "ebpf", Some(3000));
}

#[test]
fn ipv6_connections_from_another_host() {
    connections_survive("t6", 50, true, false, "ebpf");
}

#[test]
fn loopback_connections_outside_the_tree() {
    connections_survive("tlo", 100, false, true, "ebpf");
}

#[test]
fn connections_survive_with_the_nftables_lock() {
    connections_survive("tnft", 100, false, false, "nftables");
}

#[test]
fn connections_survive_with_the_iptables_lock() {
    connections_survive("tipt", 100, false, false, "iptables");
}

/// Waits until `pid`'s main thread sleeps in rt_sigtimedwait (the
/// syscall /proc/PID/syscall names first while it blocks there).
fn wait_in_sigwait(pid: i32) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let in_sigwait = || {
        let syscall = read_lossy(Path::new(&format!("/proc/{pid}/syscall")));
        syscall.split_whitespace().next() == Some(&libc::SYS_rt_sigtimedwait.to_string())
    };
    while !in_sigwait() {
        assert!(Instant::now() < deadline, "server {pid} never reached its sigwaitinfo");
        sleep(POLL);
    }
}

fn sig_blocked(pid: i32) -> Vec<String> {
    let mut masks = Vec::new();
    if let Ok(rd) = fs::read_dir(format!("/proc/{pid}/task")) {
        for t in rd.flatten() {
            let status = read_lossy(&t.path().join("status"));
            masks.extend(status.lines().filter(|l| l.starts_with("SigBlk:")).map(String::from));
        }
    }
    masks.sort();
    masks
}

/// ferry is SIGKILLed in the middle of a checkpoint, after the network
/// lock froze the connections and repair mode took them: the checkpoint
/// guard puts everything back, the server goes on with every connection
/// and no lock is left.
#[test]
fn killed_ferry_mid_checkpoint_leaves_the_service_running() {
    killed_ferry_at("checkpoint:tcp connections", "tkill");
}

/// The same, with ferry killed after the syscalls it injected and the
/// pages: a thread left in the stop that ended injected work was resumed
/// by the kernel with that stop's SIGTRAP, which killed the server the
/// guard was to put back.
#[test]
fn killed_ferry_after_the_pages_leaves_the_service_running() {
    killed_ferry_at("checkpoint:pages", "tkpg");
}

fn killed_ferry_at(stall: &str, tag: &str) {
    require_root!();
    let n = 20;
    let hosts = Hosts::new(tag);
    let dir = TempDir::new("ferry-tcp", tag);
    let (client_bytes, server_bytes) = (256 << 10, 256 << 10);
    let port = 7000 + (std::process::id() % 1000) as u16;
    let mut server = start_server(&hosts.a, &dir.0, A_V4, port, n, client_bytes, server_bytes);
    let to: SocketAddr = format!("{A_V4}:{port}").parse().expect("address");
    let (ready_tx, ready_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel();
    let diagnose = vec![hosts.a.0.clone(), hosts.b.0.clone()];
    let clients = run_clients(
        Some(hosts.b.0.clone()),
        Load { n, to, client_bytes, server_bytes },
        ready_tx,
        go_rx,
        diagnose,
    );
    ready_rx.recv_timeout(Duration::from_secs(60)).expect("clients ready");
    wait_line(&server.log, "READY", Duration::from_secs(30));
    // Read in its sigwaitinfo, which unblocks SIGUSR2 while it waits: read
    // just before (after READY), the mask would hold SIGUSR2 and never
    // match the waiting server's again.
    wait_in_sigwait(server.pid);
    let masks_before = sig_blocked(server.pid);

    let err = dir.0.join("checkpoint.err");
    let mut ckpt = Command::new(FERRY);
    ckpt.args(["checkpoint", "--pid", &server.pid.to_string(), "--images"])
        .arg(dir.0.join("images"))
        .env("FERRY_FAULT_STALL_AFTER", stall)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(File::create(&err).expect("err"));
    ferry_testkit::only_stdio(&mut ckpt);
    // Killed and reaped on drop too, so a failed assertion leaves no
    // stalled ferry behind.
    let mut ckpt =
        Server { child: Some(ckpt.spawn().expect("spawn ferry")), log: err.clone(), pid: 0 };
    let deadline = Instant::now() + Duration::from_secs(60);
    while !read_lossy(&err).contains("stalling after") {
        assert!(
            ckpt.child.as_mut().and_then(|c| c.try_wait().ok().flatten()).is_none(),
            "ferry ended early: {}",
            read_lossy(&err)
        );
        assert!(Instant::now() < deadline, "ferry never reached the stall point");
        sleep(POLL);
    }
    // Frozen now: signals blocked, connections in repair mode, lock set.
    assert_ne!(sig_blocked(server.pid), masks_before, "the server should be frozen now");
    let ferry_pid = ckpt.child.as_ref().map(|c| c.id()).unwrap_or(0).to_string();
    let lock = locks().into_iter().find(|(_, owner)| *owner == ferry_pid).map(|(n, _)| n);
    let lock =
        lock.unwrap_or_else(|| panic!("no network lock owned by ferry {ferry_pid}: {:?}", locks()));
    drop(ckpt); // SIGKILL, by PID

    // The guard puts the masks back and releases the lock.
    let deadline = Instant::now() + Duration::from_secs(10);
    while sig_blocked(server.pid) != masks_before {
        assert!(
            Instant::now() < deadline,
            "signal masks not restored: {:?} vs {:?}",
            sig_blocked(server.pid),
            masks_before
        );
        sleep(POLL);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while locks().iter().any(|(n, _)| *n == lock) {
        assert!(Instant::now() < deadline, "lock {lock} left behind: {:?}", locks());
        sleep(POLL);
    }
    // The original server, never killed, finishes every connection.
    // Signalling our own child by PID.
    ferry_testkit::kill(server.pid, libc::SIGUSR2);
    let _ = go_tx.send(());
    let errors = clients.join().expect("client thread");
    let st = server.child.as_mut().expect("server").wait().expect("wait server");
    server.child = None;
    let log = read_lossy(&server.log);
    assert!(
        errors.is_empty(),
        "{} client errors, first: {:#?}\nserver log:\n{log}",
        errors.len(),
        &errors[..errors.len().min(5)]
    );
    assert!(st.success() && log.lines().any(|l| l == "PASS"), "server: {st:?}\n{log}");
}

/// A client's request that meets the network lock is answered in pause
/// time, not retransmission time: the lock keeps the packets it drops and
/// the restore delivers them once the connection exists again (the
/// client's retransmission timeout is 200 ms at least). The example
/// server, one client on A's loopback sending a PING every 2 ms and timing
/// each answer, eight checkpoint + restore rounds (a PING meets the lock
/// in about a third of the rounds).
#[test]
fn a_request_held_by_the_lock_is_answered_in_pause_time() {
    require_root!();
    let hosts = Hosts::new("held");
    let dir = TempDir::new("ferry-tcp", "held");
    let (mut server, stream) = counter_server_and_client(&hosts.a, &dir.0);
    let (stop_tx, stop_rx) = mpsc::channel::<()>();
    let client = std::thread::spawn(move || {
        let mut stream = stream;
        stream.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
        let mut longest = Duration::ZERO;
        let mut buf = [0u8; 64];
        while stop_rx.try_recv().is_err() {
            let t = Instant::now();
            stream.write_all(b"PING\n").expect("write PING");
            let n = stream.read(&mut buf).expect("read PONG");
            assert_eq!(&buf[..n], b"PONG\n");
            longest = longest.max(t.elapsed());
            sleep(Duration::from_millis(2));
        }
        longest
    });
    sleep(Duration::from_millis(100));
    // The longest a round kept the service away, from the checkpoint's
    // start to the restored server's pidfile: a request may wait that
    // long, but not a retransmission timeout (200 ms, then doubling) more.
    let mut longest_round = Duration::ZERO;
    for round in 0..8 {
        let round_start = Instant::now();
        let images = dir.0.join(format!("images-{round}"));
        let images_s = images.to_str().expect("utf-8");
        let st = ferry(
            &["checkpoint", "--pid", &server.pid.to_string(), "--images", images_s],
            &dir.0.join(format!("checkpoint-{round}.err")),
        );
        assert!(
            st.success(),
            "checkpoint {round}: {}",
            read_lossy(&dir.0.join(format!("checkpoint-{round}.err")))
        );
        if let Some(mut old) = server.child.take() {
            let _ = old.wait();
        }
        let pidfile = dir.0.join(format!("pid-{round}"));
        let mut restore = Command::new(FERRY);
        restore
            .args(["restore", "--images", images_s, "--netns", &hosts.a.0, "--pidfile"])
            .arg(&pidfile)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(File::create(dir.0.join(format!("restore-{round}.err"))).expect("err"));
        ferry_testkit::only_stdio(&mut restore);
        server.child = Some(restore.spawn().expect("spawn restore"));
        let deadline = Instant::now() + Duration::from_secs(30);
        while !read_lossy(&pidfile).ends_with('\n') {
            assert!(Instant::now() < deadline, "restore {round}: no pidfile");
            sleep(POLL);
        }
        longest_round = longest_round.max(round_start.elapsed());
        sleep(Duration::from_millis(60));
    }
    let _ = stop_tx.send(());
    let longest = client.join().expect("client");
    eprintln!(
        "longest wait of a PING across 8 checkpoint + restore rounds: {longest:?} (longest round {longest_round:?})"
    );
    assert!(
        longest < longest_round + Duration::from_millis(150),
        "a request waited {longest:?}, the longest round took {longest_round:?}: a retransmission timeout, not the pause"
    );
}

/// A client on another host sends its request and shuts down its sending
/// side; the server has read none of it, so its connection is in
/// CLOSE_WAIT with the request unread. After checkpoint and restore the
/// server reads the whole request, then EOF (the peer's FIN, given again),
/// and its answer reaches the client, which is still waiting for it.
#[test]
fn a_connection_whose_client_shut_down_sending_is_answered_after_restore() {
    require_root!();
    let hosts = Hosts::new("closewait");
    let dir = TempDir::new("ferry-tcp", "closewait");
    let port = 7000 + (std::process::id() % 1000) as u16;
    let port_s = port.to_string();
    let mut server =
        compiled_server(&hosts.a, &dir.0, "tests/tcp/tcp_close_wait_server.c", &[A_V4, &port_s]);
    wait_line(&server.log, "LISTENING", Duration::from_secs(10));
    const REQUEST: usize = 20_000;
    let mut stream = hosts.b.run(|| {
        let to: SocketAddr = format!("{A_V4}:{port}").parse().expect("address");
        TcpStream::connect_timeout(&to, Duration::from_secs(5)).expect("connect")
    });
    let request: Vec<u8> = (0..REQUEST).map(|i| pat(7, i)).collect();
    stream.write_all(&request).expect("send the request");
    stream.shutdown(Shutdown::Write).expect("shut down sending");
    wait_line(&server.log, "READY", Duration::from_secs(30));

    let images = dir.0.join("images");
    let images_s = images.to_str().expect("utf-8");
    let st = ferry(
        &["checkpoint", "--pid", &server.pid.to_string(), "--images", images_s],
        &dir.0.join("checkpoint.err"),
    );
    assert!(st.success(), "checkpoint: {}", read_lossy(&dir.0.join("checkpoint.err")));
    if let Some(mut old) = server.child.take() {
        let _ = old.wait();
    }
    let pidfile = dir.0.join("pid");
    let mut restore = Command::new(FERRY);
    restore
        .args(["restore", "--images", images_s, "--netns", &hosts.a.0, "--pidfile"])
        .arg(&pidfile)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(File::create(dir.0.join("restore.err")).expect("err"));
    ferry_testkit::only_stdio(&mut restore);
    server.child = Some(restore.spawn().expect("spawn restore"));
    let deadline = Instant::now() + Duration::from_secs(30);
    while !read_lossy(&pidfile).ends_with('\n') {
        if let Some(st) = server.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
            panic!("restore exited with {st:?}: {}", read_lossy(&dir.0.join("restore.err")));
        }
        assert!(Instant::now() < deadline, "no pidfile within 30 s");
        sleep(POLL);
    }
    ferry_testkit::kill(server.pid, libc::SIGUSR2);
    stream.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    let mut answer = String::new();
    stream.read_to_string(&mut answer).expect("read the answer to EOF");
    let st = server.child.as_mut().expect("restore").wait().expect("wait restore");
    server.child = None;
    let log = read_lossy(&server.log);
    assert_eq!(answer, format!("GOT {REQUEST}\n"), "server log:\n{log}");
    assert!(st.success() && log.lines().any(|l| l == "PASS"), "server: {st:?}\n{log}");
}

/// `ferry network-lock --install-base --netns PATH` installs the eBPF
/// base of a test host's namespace once (attached to its interfaces,
/// listed by `--status`), a second call finds it installed, and
/// `--release NAME` removes it.
#[test]
fn a_base_installed_ahead_is_listed_kept_and_released() {
    require_root!();
    let hosts = TestHosts::new("tib");
    let ns = hosts.a.path();
    let run = |args: &[&str]| {
        let out = Command::new(FERRY).args(args).output().expect("run ferry");
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            out.status.success(),
            "ferry {args:?}: {text} {}",
            String::from_utf8_lossy(&out.stderr)
        );
        text
    };
    let first = run(&["network-lock", "--install-base", "--netns", &ns]);
    assert!(first.starts_with("installed eBPF lock base "), "{first}");
    let name = first.split_whitespace().nth(4).expect("the base's name").to_string();
    // Whatever happens below, the base goes with the test.
    struct Release(String);
    impl Drop for Release {
        fn drop(&mut self) {
            let _ = Command::new(FERRY).args(["network-lock", "--release", &self.0]).output();
        }
    }
    let _release = Release(name.clone());
    let again = run(&["network-lock", "--install-base", "--netns", &ns]);
    assert!(again.contains(&format!("{name} is already installed")), "{again}");
    let status = run(&["network-lock", "--status"]);
    let line = status.lines().find(|l| l.starts_with(&name)).unwrap_or_else(|| panic!("{status}"));
    let links: usize = line.split_whitespace().nth(1).and_then(|n| n.parse().ok()).expect("links");
    assert!(links >= 2 && !line.contains("DEAD"), "base not attached: {line}");
    let released = run(&["network-lock", "--release", &name]);
    assert!(released.contains(&format!("released eBPF lock base {name}")), "{released}");
    let status = run(&["network-lock", "--status"]);
    assert!(!status.lines().any(|l| l.starts_with(&name)), "{status}");
}

/// `ip netns exec A ferry checkpoint`: the command runs in a mount
/// namespace of its own with a fresh /sys (no bpffs), which ends with
/// it. The lock it hands over must stay pinned where the next ferry run
/// finds it (the bpffs of the namespace ferry was started from): its
/// links stay attached while no ferry runs, so the client's requests
/// wait in the lock and are answered after `ip netns exec A ferry
/// restore`. With the pins in a bpffs mounted in that namespace, the
/// links detached at the checkpoint's exit, the client was reset and
/// the restore failed on the reset connection.
#[test]
fn a_checkpoint_under_ip_netns_exec_keeps_its_lock_until_the_restore() {
    require_root!();
    let hosts = Hosts::new("ipx");
    let dir = TempDir::new("ferry-tcp", "ipx");
    let (mut server, stream) = counter_server_and_client(&hosts.a, &dir.0);
    let (stop_tx, stop_rx) = mpsc::channel::<()>();
    let client = std::thread::spawn(move || {
        let mut stream = stream;
        stream.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
        let mut buf = [0u8; 64];
        let mut answered = 0;
        while stop_rx.try_recv().is_err() {
            stream.write_all(b"PING\n").map_err(|e| format!("write: {e}"))?;
            let n = stream.read(&mut buf).map_err(|e| format!("read: {e}"))?;
            if &buf[..n] != b"PONG\n" {
                return Err(format!("answer {:?}", &buf[..n]));
            }
            answered += 1;
            sleep(Duration::from_millis(5));
        }
        Ok::<_, String>(answered)
    });
    sleep(Duration::from_millis(100));
    let images = dir.0.join("images");
    let images_s = images.to_str().expect("utf-8");
    let in_a = |args: &[&str], err: &str| {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &hosts.a.0, FERRY])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(File::create(dir.0.join(err)).expect("err"));
        ferry_testkit::only_stdio(&mut cmd);
        cmd
    };
    let pid = server.pid.to_string();
    let st = in_a(&["checkpoint", "--pid", &pid, "--images", images_s], "checkpoint.err")
        .status()
        .expect("ip netns exec ferry checkpoint");
    assert!(st.success(), "checkpoint: {}", read_lossy(&dir.0.join("checkpoint.err")));
    if let Some(mut old) = server.child.take() {
        let _ = old.wait();
    }
    // No ferry runs now: the lock alone holds the client's requests.
    let lock = image_lock(FERRY, images_s).expect("the image's lock");
    assert!(locks().iter().any(|(n, _)| *n == lock), "lock {lock} gone before the restore");
    sleep(Duration::from_millis(300));
    let pidfile = dir.0.join("pid");
    let mut restore = in_a(&["restore", "--images", images_s, "--pidfile"], "restore.err");
    server.child = Some(restore.arg(&pidfile).spawn().expect("spawn restore"));
    let deadline = Instant::now() + Duration::from_secs(30);
    while !read_lossy(&pidfile).ends_with('\n') {
        assert!(
            Instant::now() < deadline,
            "restore: no pidfile: {}",
            read_lossy(&dir.0.join("restore.err"))
        );
        sleep(POLL);
    }
    server.pid = read_lossy(&pidfile).trim().parse().expect("restored pid");
    sleep(Duration::from_millis(100));
    let _ = stop_tx.send(());
    let answered = client.join().expect("client");
    assert!(answered.is_ok(), "the client across the checkpoint and restore: {answered:?}");
    assert_lock_gone(&lock);
}
