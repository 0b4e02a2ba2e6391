//! Language runtimes: a JVM and a Node HTTP server (tests/runtimes/),
//! each listening on its runtime's default socket, an IPv6 one on [::]
//! that takes IPv4 too, and reached over IPv4: every connection they
//! accept is an IPv6 socket with IPv4-mapped addresses. Each server keeps
//! a counter in memory that every GET /count adds one to.
//!
//! - `java_checkpoint_restore`, `node_checkpoint_restore`: the server in
//!   test host A (a network namespace), clients in B: keep-alive
//!   connections counting as fast as the server answers, and new
//!   connections arriving one after another; `ferry checkpoint` (which
//!   kills the server) and `ferry restore --netns A` in the middle.
//! - `java_migrates_there_and_back`, `node_migrates_there_and_back`: the
//!   same clients from host c, the server in host a with a service
//!   address on a (Node on [::], the JVM bound to the service address,
//!   which makes its listener an IPv6 socket on ::ffff:SERVICE);
//!   `ferry migrate` a→b and b→a with the address
//!   (test hosts of tests/common/cluster.rs, ferryd as PID 1 of a and b).
//!
//! Checked: no request fails and no keep-alive connection is made again;
//! the values the clients got are exactly 1..N, each once (the memory
//! came back: a server that lost it counts from 1 again, and a request
//! lost or answered twice shows as well); every keep-alive connection
//! goes on after each restore; a new connection is answered; the image
//! holds the IPv4-mapped connections; no network lock is left.
//!
//! The JVM runs with its defaults (hsperfdata file in /tmp, its own
//! threads and signals). Needs root, /usr/bin/java (with jdk.compiler and
//! jdk.httpserver: `java File.java`) and /usr/bin/node; without them each
//! test says so and passes. `FERRY_TEST_KEEP=1` keeps each test's
//! directory (server log, ferry output, images).

mod common;

use common::cluster::{Cluster, Host};
use common::{network_locks, path_str, read_lossy, spawn_in_netns, wait_for, TestHosts, A_V4};
use ferry_testkit::is_root;
use ferry_testkit::TempDir;
use std::fs::{self, File};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::{sleep, JoinHandle};
use std::time::{Duration, Instant};

const FERRY: &str = env!("CARGO_BIN_EXE_ferry");
const FERRYD: &str = env!("CARGO_BIN_EXE_ferryd");
const JAVA: &str = "/usr/bin/java";
const NODE: &str = "/usr/bin/node";
const PORT: u16 = 8080;
const AGENT_PORT: u16 = 7070;
/// Keep-alive connections, each open from before the first checkpoint to
/// the end.
const KEPT: usize = 4;
/// A request waits at most this long for its answer (a pause is far
/// shorter; a SYN the lock dropped is sent again after 1 s, 3 s...).
const IO_LIMIT: Duration = Duration::from_secs(20);
/// The longest any client runs, whatever happens.
const CLIENT_LIMIT: Duration = Duration::from_secs(100);
/// A host init that is not ferryd (host c): reaps orphans.
const PLAIN_INIT: &[&str] = &["sh", "-c", "trap : TERM; while :; do wait; sleep 0.2; done"];

// ---------------------------------------------------------------------------
// The runtimes

struct Runtime {
    name: &'static str,
    program: &'static str,
    /// The source file under tests/runtimes/.
    source: &'static str,
}

const JVM: Runtime = Runtime { name: "java", program: JAVA, source: "CounterServer.java" };
const NODEJS: Runtime = Runtime { name: "node", program: NODE, source: "counter_server.js" };

impl Runtime {
    /// argv of the server on PORT, with its source copied into `dir`;
    /// the JVM bound to `bind` when given.
    fn argv(&self, dir: &Path, bind: Option<&str>) -> Vec<String> {
        let src =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/runtimes").join(self.source);
        let to = dir.join(self.source);
        fs::copy(&src, &to).unwrap_or_else(|e| panic!("copy {}: {e}", src.display()));
        let mut argv = vec![self.program.into(), path_str(&to).into(), PORT.to_string()];
        argv.extend(bind.map(String::from));
        argv
    }

    fn available(&self, test: &str) -> bool {
        if !is_root() {
            eprintln!("SKIPPED {test}: needs root");
            return false;
        }
        let ok = fs::metadata(self.program)
            .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            .unwrap_or(false);
        if !ok {
            eprintln!("SKIPPED {test}: {} is not installed", self.program);
        }
        ok
    }
}

// ---------------------------------------------------------------------------
// Basics

fn wait_child(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(Some(st)) = child.try_wait() {
            return Some(st);
        }
        if Instant::now() >= deadline {
            return None;
        }
        sleep(Duration::from_millis(10));
    }
}

/// The start time of `pid` (/proc/PID/stat field 22), None when gone or a zombie.
fn start_time(pid: i32) -> Option<u64> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest: Vec<&str> = text.rsplit_once(')')?.1.split_whitespace().collect();
    if matches!(rest.first(), Some(&"Z") | Some(&"X")) {
        return None;
    }
    rest.get(19)?.parse().ok()
}

/// VmRSS of `pid` in KiB (0 when gone).
fn rss_kib(pid: i32) -> u64 {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// The restored server holds about the memory it had: pages it never
/// touched must not come back populated (a JVM reserves gigabytes).
fn check_rss(name: &str, before: u64, after: u64) {
    eprintln!("[{name}] VmRSS {} MiB before, {} MiB after", before >> 10, after >> 10);
    assert!(
        after <= before + before / 2 + (32 << 10),
        "[{name}] VmRSS grew from {before} kB to {after} kB"
    );
}

/// `ferry ARGS` (a Command prepared by the caller), bounded; the retry
/// rule of a capture: a connection passing through a short state (a new
/// client closing, one in the accept queue) makes ferry refuse with "try
/// again" after its own tries; the test then tries again, twice at most.
fn run_ferry(mut make: impl FnMut() -> Command, what: &str) -> (ExitStatus, String, String) {
    let mut attempt = 0;
    loop {
        let mut cmd = make();
        cmd.stdin(Stdio::null());
        ferry_testkit::only_stdio(&mut cmd);
        let o = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
        let (out, err) = (
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        );
        attempt += 1;
        if o.status.success() || !err.contains("try again") || attempt == 3 {
            return (o.status, out, err);
        }
        eprintln!("{what} refused, trying again: {}", err.trim());
    }
}

/// The JVM's performance data files (/tmp/hsperfdata_root/PID, one per
/// PID it ran under, which a killed JVM leaves behind), removed on drop.
struct PerfData(Vec<i32>);

impl Drop for PerfData {
    fn drop(&mut self) {
        for pid in &self.0 {
            let _ = fs::remove_file(format!("/tmp/hsperfdata_root/{pid}"));
        }
    }
}

// ---------------------------------------------------------------------------
// HTTP clients

/// One HTTP/1.1 connection, kept alive.
struct Http {
    s: TcpStream,
    buf: Vec<u8>,
}

impl Http {
    fn connect(to: SocketAddr, wait: Duration) -> Result<Http, String> {
        let s = TcpStream::connect_timeout(&to, wait).map_err(|e| format!("connect: {e}"))?;
        s.set_read_timeout(Some(IO_LIMIT)).map_err(|e| e.to_string())?;
        s.set_write_timeout(Some(IO_LIMIT)).map_err(|e| e.to_string())?;
        s.set_nodelay(true).map_err(|e| e.to_string())?;
        Ok(Http { s, buf: Vec::new() })
    }

    /// GET `path`: the body of a 200 answer that keeps the connection.
    fn get(&mut self, path: &str) -> Result<String, String> {
        let req = format!("GET {path} HTTP/1.1\r\nHost: ferry\r\nUser-Agent: ferry-test\r\n\r\n");
        self.s.write_all(req.as_bytes()).map_err(|e| format!("write: {e}"))?;
        let end = loop {
            if let Some(end) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break end;
            }
            self.fill()?;
        };
        let head = String::from_utf8_lossy(&self.buf[..end]).into_owned();
        let (status, len, close) = parse_head(&head)?;
        if status != 200 {
            return Err(format!("status {status}: {head:?}"));
        }
        if close {
            return Err("the server closes the connection (Connection: close)".into());
        }
        while self.buf.len() < end + 4 + len {
            self.fill()?;
        }
        let body = String::from_utf8_lossy(&self.buf[end + 4..end + 4 + len]).into_owned();
        self.buf.drain(..end + 4 + len);
        if !self.buf.is_empty() {
            return Err(format!("{} bytes after the answer", self.buf.len()));
        }
        Ok(body)
    }

    fn fill(&mut self) -> Result<(), String> {
        let mut chunk = [0u8; 4096];
        match self.s.read(&mut chunk) {
            Ok(0) => Err(format!("EOF after {} bytes of the answer", self.buf.len())),
            Ok(n) => {
                self.buf.extend_from_slice(&chunk[..n]);
                Ok(())
            }
            Err(e) => Err(format!("read: {e}")),
        }
    }
}

/// (status, Content-Length, Connection: close) of an answer's head.
fn parse_head(head: &str) -> Result<(u16, usize, bool), String> {
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or("");
    let status = status_line
        .strip_prefix("HTTP/1.1 ")
        .and_then(|r| r.get(..3))
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("status line {status_line:?}"))?;
    let (mut len, mut close) = (None, false);
    for l in lines {
        let Some((k, v)) = l.split_once(':') else { continue };
        let (k, v) = (k.trim().to_ascii_lowercase(), v.trim());
        if k == "content-length" {
            len = v.parse().ok();
        } else if k == "connection" {
            close = v.eq_ignore_ascii_case("close");
        }
    }
    let len = len.ok_or_else(|| format!("no Content-Length in {head:?}"))?;
    Ok((status, len, close))
}

/// One GET /count on `c`: the value, which must be above `last`.
fn count_on(c: &mut Http, last: u64) -> Result<u64, String> {
    let body = c.get("/count")?;
    let v: u64 = body.trim().parse().map_err(|_| format!("counter answer {body:?}"))?;
    if v <= last {
        return Err(format!("counter went from {last} to {v}"));
    }
    Ok(v)
}

/// Whether `values` (every counter value the clients got) and `next` (the
/// value a last request got) say every request was counted once, in
/// memory that survived: exactly 1..next-1, each once.
fn counter_gaps(mut values: Vec<u64>, next: u64) -> Result<(), String> {
    values.sort_unstable();
    if let Some(w) = values.windows(2).find(|w| w[0] == w[1]) {
        return Err(format!("value {} answered twice (the counter started again?)", w[0]));
    }
    if let Some((i, v)) = values.iter().enumerate().find(|(i, v)| **v != *i as u64 + 1) {
        return Err(format!("value {} missing (next got is {v})", i + 1));
    }
    if values.len() as u64 + 1 != next {
        return Err(format!("{} requests counted, the next one got {next}", values.len()));
    }
    Ok(())
}

/// What one client thread did.
struct ClientEnd {
    values: Vec<u64>,
    errors: Vec<String>,
}

/// KEPT keep-alive clients counting without a pause, and one client that
/// opens a new connection for each request (every 25 ms).
struct Load {
    stop: Arc<AtomicBool>,
    /// Requests answered, per client (the new-connection one last).
    done: Arc<Vec<AtomicU64>>,
    threads: Vec<JoinHandle<ClientEnd>>,
}

impl Load {
    /// Clients in the network namespace at `netns` (a path).
    fn start(netns: &str, to: SocketAddr) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let done: Arc<Vec<AtomicU64>> = Arc::new((0..=KEPT).map(|_| AtomicU64::new(0)).collect());
        let threads = (0..=KEPT)
            .map(|i| {
                let (stop, done, netns) = (stop.clone(), done.clone(), netns.to_string());
                std::thread::spawn(move || {
                    ferry_testkit::enter_netns(&netns);
                    if i == KEPT {
                        new_connections(to, &stop, &done[i])
                    } else {
                        kept_connection(i, to, &stop, &done[i])
                    }
                })
            })
            .collect();
        Load { stop, done, threads }
    }

    fn progress(&self) -> Vec<u64> {
        self.done.iter().map(|d| d.load(Ordering::Relaxed)).collect()
    }

    /// Waits until every client answered `n` more requests than `from`.
    fn advance(&self, from: &[u64], n: u64, limit: Duration) -> Result<(), String> {
        let ok = wait_for(limit, || self.progress().iter().zip(from).all(|(p, f)| *p >= f + n));
        if ok {
            return Ok(());
        }
        Err(format!("clients did not go on: {:?} requests, {from:?} before", self.progress()))
    }

    fn finish(mut self) -> (Vec<u64>, Vec<String>) {
        self.stop.store(true, Ordering::SeqCst);
        let (mut values, mut errors) = (Vec::new(), Vec::new());
        for t in self.threads.drain(..) {
            let end = t.join().expect("client thread panicked");
            values.extend(end.values);
            errors.extend(end.errors);
        }
        (values, errors)
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn kept_connection(i: usize, to: SocketAddr, stop: &AtomicBool, done: &AtomicU64) -> ClientEnd {
    let mut end = ClientEnd { values: Vec::new(), errors: Vec::new() };
    let mut c = match Http::connect(to, Duration::from_secs(5)) {
        Ok(c) => c,
        Err(e) => {
            end.errors.push(format!("kept connection {i}: {e}"));
            return end;
        }
    };
    let until = Instant::now() + CLIENT_LIMIT;
    while !stop.load(Ordering::Relaxed) && Instant::now() < until {
        let last = end.values.last().copied().unwrap_or(0);
        match count_on(&mut c, last) {
            Ok(v) => end.values.push(v),
            Err(e) => {
                let n = end.values.len();
                end.errors.push(format!("kept connection {i}, request {n}: {e}"));
                break;
            }
        }
        done.fetch_add(1, Ordering::Relaxed);
        sleep(Duration::from_millis(1));
    }
    end
}

fn new_connections(to: SocketAddr, stop: &AtomicBool, done: &AtomicU64) -> ClientEnd {
    let mut end = ClientEnd { values: Vec::new(), errors: Vec::new() };
    let until = Instant::now() + CLIENT_LIMIT;
    while !stop.load(Ordering::Relaxed) && Instant::now() < until {
        let n = end.values.len();
        match Http::connect(to, IO_LIMIT).and_then(|mut c| count_on(&mut c, 0)) {
            Ok(v) => end.values.push(v),
            Err(e) => end.errors.push(format!("new connection {n}: {e}")),
        }
        done.fetch_add(1, Ordering::Relaxed);
        sleep(Duration::from_millis(25));
    }
    end
}

/// Until the server answers GET /hello at `to` from `netns` (60 s at
/// most: a JVM compiles its source first); `alive` says whether it still
/// runs.
fn wait_ready(netns: &str, to: SocketAddr, mut alive: impl FnMut() -> bool, log: &Path) {
    let ok = wait_for(Duration::from_secs(60), || {
        assert!(alive(), "the server ended:\n{}", read_lossy(log));
        ferry_testkit::run_in_netns(netns, || {
            Http::connect(to, Duration::from_secs(1)).and_then(|mut c| c.get("/hello"))
        })
        .is_ok_and(|b| b == "hello\n")
    });
    assert!(ok, "the server does not answer at {to}:\n{}", read_lossy(log));
}

/// The last check of a run: the clients' errors, a new connection's
/// count, and every value counted once.
fn check_end(name: &str, netns: &str, to: SocketAddr, load: Load) {
    let (values, errors) = load.finish();
    assert!(errors.is_empty(), "[{name}] client requests failed: {errors:#?}");
    let next = ferry_testkit::run_in_netns(netns, || {
        Http::connect(to, Duration::from_secs(5)).and_then(|mut c| count_on(&mut c, 0))
    })
    .unwrap_or_else(|e| panic!("[{name}] a new connection after the restore: {e}"));
    counter_gaps(values, next).unwrap_or_else(|e| panic!("[{name}] the counter: {e}"));
    eprintln!("[{name}] {} requests counted, each once, none failed", next - 1);
}

/// Established TCP connections in an image whose socket is IPv6 with an
/// IPv4-mapped local address.
fn mapped_connections(images: &Path) -> usize {
    let out = Command::new(FERRY)
        .args(["inspect", "--json", path_str(images)])
        .output()
        .expect("ferry inspect");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("inspect json");
    fn mapped(addr: &serde_json::Value) -> bool {
        let bytes: Vec<u64> = addr
            .as_array()
            .map(|a| a.iter().filter_map(|b| b.as_u64()).collect())
            .unwrap_or_default();
        bytes.len() == 16 && bytes[..10].iter().all(|b| *b == 0) && bytes[10..12] == [255, 255]
    }
    fn walk(v: &serde_json::Value) -> usize {
        match v {
            serde_json::Value::Object(m) => {
                let here = m.get("family").and_then(|f| f.as_i64()) == Some(libc::AF_INET6 as i64)
                    && m.get("connection").is_some_and(|c| c.is_object())
                    && m.get("addr").is_some_and(mapped);
                usize::from(here) + m.values().map(walk).sum::<usize>()
            }
            serde_json::Value::Array(a) => a.iter().map(walk).sum(),
            _ => 0,
        }
    }
    walk(&v)
}

// ---------------------------------------------------------------------------
// Checkpoint and restore in one test host

/// The server as started, then as restored; killed on drop.
struct Server {
    pid: i32,
    start: Option<u64>,
    original: Option<Child>,
    restore: Option<Child>,
}

impl Drop for Server {
    fn drop(&mut self) {
        // The process this test started or restored (PID and start time).
        if self.start.is_some() && start_time(self.pid) == self.start {
            ferry_testkit::kill(self.pid, libc::SIGKILL);
        }
        for c in [self.original.as_mut(), self.restore.as_mut()].into_iter().flatten() {
            let _ = c.kill();
            let _ = wait_child(c, Duration::from_secs(10));
        }
    }
}

fn checkpoint_restore(rt: &Runtime, test: &str) {
    if !rt.available(test) {
        return;
    }
    let name = rt.name;
    let hosts = TestHosts::new(&format!("rt{}", &name[..1]));
    let dir = TempDir::new("ferry-rt", name);
    let b = hosts.b.path();
    let to: SocketAddr = format!("{A_V4}:{PORT}").parse().expect("address");
    let log = dir.0.join("server.log");
    let argv = rt.argv(&dir.0, None);
    let args: Vec<&str> = argv[1..].iter().map(String::as_str).collect();
    let child = spawn_in_netns(&hosts.a, &dir.0, &log, Path::new(rt.program), &args);
    let pid = child.id() as i32;
    let _perf = PerfData(vec![pid]);
    let mut srv = Server { pid, start: start_time(pid), original: Some(child), restore: None };
    let t = Instant::now();
    wait_ready(&b, to, || start_time(pid).is_some(), &log);
    eprintln!("[{name}] ready in {:.1} s", t.elapsed().as_secs_f64());

    let load = Load::start(&b, to);
    load.advance(&[0; KEPT + 1], 10, Duration::from_secs(20))
        .unwrap_or_else(|e| panic!("[{name}] {e}"));
    let images = dir.0.join("images");
    let rss_before = rss_kib(pid);
    let (st, out, err) = run_ferry(
        || {
            let mut c = Command::new(FERRY);
            c.args(["checkpoint", "--pid", &pid.to_string(), "--images", path_str(&images)]);
            c
        },
        "ferry checkpoint",
    );
    assert!(st.success(), "[{name}] ferry checkpoint failed ({st}):\n{out}{err}");
    eprintln!("[{name}] {}", out.trim());
    let mut original = srv.original.take().expect("server child");
    let st = wait_child(&mut original, Duration::from_secs(10)).expect("the server still runs");
    assert_eq!(st.signal(), Some(libc::SIGKILL), "[{name}] the server ended with {st}");
    let mapped = mapped_connections(&images);
    assert!(mapped >= KEPT, "[{name}] {mapped} IPv4-mapped connections in the image, want {KEPT}");
    let lock = common::image_lock(FERRY, path_str(&images));

    let restored = restore_in(&mut srv, &images, &hosts.a.0, &dir.0);
    assert_eq!(restored, pid, "[{name}] restored under another PID");
    srv.start = start_time(pid);
    let at_restore = load.progress();
    load.advance(&at_restore, 20, Duration::from_secs(20))
        .unwrap_or_else(|e| panic!("[{name}] after the restore: {e}"));
    check_rss(name, rss_before, rss_kib(pid));
    check_end(name, &b, to, load);
    let lock = lock.expect("the image names its network lock");
    assert!(
        !network_locks(FERRY).iter().any(|(l, _)| *l == lock),
        "[{name}] network lock {lock} left after the restore"
    );
}

/// `ferry restore --netns NETNS` of `images` (ferry stays the parent):
/// the restored root's PID once it runs.
fn restore_in(srv: &mut Server, images: &Path, netns: &str, dir: &Path) -> i32 {
    let pidfile = dir.join("restored.pid");
    let out = dir.join("ferry-restore.out");
    let mut cmd = Command::new(FERRY);
    cmd.args(["restore", "--images", path_str(images), "--netns", netns, "--pidfile"])
        .arg(&pidfile)
        .stdin(Stdio::null())
        .stdout(Stdio::from(File::create(&out).expect("restore out")))
        .stderr(Stdio::from(File::options().append(true).open(&out).expect("restore err")));
    ferry_testkit::only_stdio(&mut cmd);
    srv.restore = Some(cmd.spawn().expect("spawn ferry restore"));
    let ok = wait_for(Duration::from_secs(30), || {
        if let Some(st) = srv.restore.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
            panic!("ferry restore exited with {st}:\n{}", read_lossy(&out));
        }
        read_lossy(&pidfile).ends_with('\n')
    });
    assert!(ok, "no pidfile within 30 s:\n{}", read_lossy(&out));
    eprintln!("{}", read_lossy(&out).trim());
    read_lossy(&pidfile).trim().parse().expect("pidfile")
}

#[test]
fn java_checkpoint_restore() {
    checkpoint_restore(&JVM, "java_checkpoint_restore");
}

#[test]
fn node_checkpoint_restore() {
    checkpoint_restore(&NODEJS, "node_checkpoint_restore");
}

// ---------------------------------------------------------------------------
// Live migration between test hosts

struct Hosts {
    c: Cluster,
    dir: TempDir,
    key: PathBuf,
    /// The service address with its prefix, on a at first.
    svc: String,
}

impl Hosts {
    /// a and b with ferryd, c with a plain init, the service address
    /// (x.x.x.100/24) on a's eth0.
    fn new(tag: &str) -> Hosts {
        let dir = TempDir::new("ferry-rt", tag);
        let key = dir.0.join("key");
        let st = Command::new(FERRY).arg("keygen").arg(&key).output().expect("ferry keygen");
        assert!(st.status.success(), "ferry keygen: {}", String::from_utf8_lossy(&st.stderr));
        let c = Cluster::new(&["a", "b", "c"]);
        let svc = format!("{}/{}", c.subnet_addr(100), c.prefix());
        let h = Hosts { c, dir, key, svc };
        h.start_ferryd("a");
        h.start_ferryd("b");
        h.c.host("c").start_init(PLAIN_INIT);
        let a = h.c.host("a");
        let st = Command::new("ip")
            .args(["-n", &a.netns, "addr", "add", &h.svc, "dev", &a.ifname])
            .status()
            .expect("ip addr add");
        assert!(st.success(), "adding {} to a", h.svc);
        h
    }

    /// ferryd as the init of `name`, with its own /run/ferry and bpffs
    /// (docs/migration.md); waits until it listens.
    fn start_ferryd(&self, name: &str) {
        let h = self.c.host(name);
        let log = self.dir.0.join(format!("ferryd-{name}.log"));
        let listen = SocketAddr::new(h.ip.into(), AGENT_PORT).to_string();
        h.start_ferryd(FERRYD, &listen, &self.key, &log, &[], &[]);
    }

    fn netns_path(&self, name: &str) -> String {
        format!("/run/netns/{}", self.c.host(name).netns)
    }

    /// `ferry migrate` of `pid` (as host `from` sees it) to host `to`,
    /// with the service address: the PID at `to`.
    fn migrate(&self, from: &str, pid: i32, to: &str) -> (i32, f64) {
        let agent = SocketAddr::new(self.c.host(to).ip.into(), AGENT_PORT).to_string();
        let report = self.dir.0.join(format!("report-{from}-{to}.json"));
        let pid_s = pid.to_string();
        let argv = [
            "timeout",
            "-s",
            "KILL",
            "60",
            FERRY,
            "migrate",
            "--pid",
            &pid_s,
            "--to",
            &agent,
            "--key",
            path_str(&self.key),
            "--report",
            path_str(&report),
            "--address",
            &self.svc,
        ];
        let host: &Host = self.c.host(from);
        let (st, out, err) = run_ferry(|| host.command(&argv), "ferry migrate");
        assert!(st.success(), "ferry migrate {from}→{to} failed ({st}):\n{out}{err}");
        let r: serde_json::Value =
            serde_json::from_slice(&fs::read(&report).expect("report")).expect("report json");
        let pid = r["dest_host_pid"].as_i64().expect("dest_host_pid") as i32;
        (pid, r["pause_ms"].as_f64().unwrap_or(f64::NAN))
    }

    /// The network locks `ferry network-lock --status` lists in `name`.
    fn locks(&self, name: &str) -> Vec<(String, String)> {
        let o = self
            .c
            .host(name)
            .command(&[FERRY, "network-lock", "--status"])
            .stdin(Stdio::null())
            .output()
            .expect("ferry network-lock");
        assert!(o.status.success(), "ferry network-lock --status in {name}");
        common::parse_network_locks(&String::from_utf8_lossy(&o.stdout))
    }
}

fn migrate_there_and_back(rt: &Runtime, test: &str) {
    if !rt.available(test) {
        return;
    }
    let name = rt.name;
    let hosts = Hosts::new(&format!("m{name}"));
    let c = hosts.netns_path("c");
    let ip = hosts.svc.split('/').next().expect("service address");
    let to: SocketAddr = format!("{ip}:{PORT}").parse().expect("address");
    let log = hosts.dir.0.join("server.log");
    // The JVM bound to the service address: its listener is an IPv6
    // socket on ::ffff:SERVICE (Node stays on [::]).
    let bind = (rt.program == JAVA).then_some(ip);
    let argv = rt.argv(&hosts.dir.0, bind);
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let mut cmd = hosts.c.host("a").command(&argv);
    cmd.current_dir(&hosts.dir.0)
        .stdin(Stdio::null())
        .stdout(File::create(&log).expect("log"))
        .stderr(File::options().append(true).open(&log).expect("log"));
    let mut nsenter = ferry_testkit::only_stdio(&mut cmd).spawn().expect("start the server in a");
    let (root, inner) = hosts.c.host("a").wait_spawned_pid(&nsenter);
    let _perf = PerfData(vec![inner]);
    let t = Instant::now();
    wait_ready(&c, to, || start_time(root).is_some(), &log);
    eprintln!("[{name}] ready in {:.1} s", t.elapsed().as_secs_f64());

    let load = Load::start(&c, to);
    load.advance(&[0; KEPT + 1], 10, Duration::from_secs(20))
        .unwrap_or_else(|e| panic!("[{name}] {e}"));
    let rss_before = rss_kib(root);
    let (pid_b, pause_ab) = hosts.migrate("a", inner, "b");
    load.advance(&load.progress(), 20, Duration::from_secs(20))
        .unwrap_or_else(|e| panic!("[{name}] at b: {e}"));
    let (pid_a, pause_ba) = hosts.migrate("b", pid_b, "a");
    load.advance(&load.progress(), 20, Duration::from_secs(20))
        .unwrap_or_else(|e| panic!("[{name}] back at a: {e}"));
    eprintln!("[{name}] a→b pause {pause_ab:.1} ms, b→a pause {pause_ba:.1} ms");
    let back = hosts.c.host("a").root_pid(pid_a);
    assert!(back.and_then(start_time).is_some(), "[{name}] the server does not run at a again");
    check_rss(name, rss_before, back.map_or(0, rss_kib));
    check_end(name, &c, to, load);
    for h in ["a", "b"] {
        assert_eq!(hosts.locks(h), Vec::new(), "[{name}] network lock left in {h}");
    }
    // The source's copy ended with the first migration; nsenter with it.
    let _ = wait_child(&mut nsenter, Duration::from_secs(5));
}

#[test]
fn java_migrates_there_and_back() {
    migrate_there_and_back(&JVM, "java_migrates_there_and_back");
}

#[test]
fn node_migrates_there_and_back() {
    migrate_there_and_back(&NODEJS, "node_migrates_there_and_back");
}

#[test]
fn the_counter_check_finds_a_restart_a_loss_and_a_double() {
    assert_eq!(counter_gaps(vec![3, 1, 2], 4), Ok(()));
    assert!(counter_gaps(vec![1, 2, 3, 1, 2], 3).unwrap_err().contains("answered twice"));
    assert!(counter_gaps(vec![1, 3], 4).unwrap_err().contains("value 2 missing"));
    assert!(counter_gaps(vec![1, 2], 5).unwrap_err().contains("next one got 5"));
    assert_eq!(
        parse_head("HTTP/1.1 200 OK\r\nContent-length: 3\r\nConnection: keep-alive"),
        Ok((200, 3, false))
    );
    assert_eq!(
        parse_head("HTTP/1.1 200 OK\r\ncontent-length: 0\r\nConnection: close"),
        Ok((200, 0, true))
    );
    assert!(parse_head("HTTP/1.1 200 OK").is_err());
}
