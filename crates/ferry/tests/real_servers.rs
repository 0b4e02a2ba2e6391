//! Real servers under load, checkpointed and restored with their
//! established TCP connections.
//!
//! Each test makes two test hosts (network namespaces A and B joined by a
//! veth pair, 192.0.2.1 and 192.0.2.2), starts an unmodified server in A
//! (new session, only fds 0-2), and runs a load driver on a thread that
//! joined B: N client connections, each looping over request rounds whose
//! replies are checked byte for byte. While the driver runs flat out, the
//! server is checkpointed (`ferry checkpoint --pid P`, which kills it),
//! reaped, and restored into A (`ferry restore --netns A`, ferry stays the
//! parent). The driver never reconnects: every connection must go on after
//! the restore with no reset, no EOF and no wrong byte, and make progress.
//!
//! - `redis_200_pipelining_clients_survive_checkpoint`: redis-server, 200
//!   connections, each sending pipelines of 16 commands (8 SET/GET pairs,
//!   values that depend on connection, round and position).
//! - `memcached_200_pipelining_clients_survive_checkpoint`: memcached -t 4,
//!   the same over the text protocol (set/get).
//! - `nginx_50_keepalive_clients_survive_checkpoint`: nginx master and 2
//!   workers (user nobody), 50 HTTP/1.1 keep-alive clients GETting a 100 kB
//!   static file over the same connections (status, Content-Length, body).
//!
//! redis and memcached also keep keys written before the checkpoint (1000
//! keys before the load starts, and the last value of every key each
//! connection wrote). Each test checks that the network lock is gone and,
//! from A's TCP table, that every client connection is still the same one.
//! Skipped (SKIPPED) without root or without the server binary. Everything
//! a test makes (processes, by PID and start time; namespaces; temp dirs)
//! is removed on drop, also when it fails.

mod common;

use common::{image_lock, network_locks, spawn_in_netns, NetNs, TestHosts, A_V4};
use ferry_testkit::is_root;
use ferry_testkit::TempDir;
use std::fs::{self, File};
use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{sleep, JoinHandle};
use std::time::{Duration, Instant};

const FERRY: &str = env!("CARGO_BIN_EXE_ferry");
const REDIS: &str = "/usr/bin/redis-server";
const MEMCACHED: &str = "/usr/bin/memcached";
const NGINX: &str = "/usr/sbin/nginx";
const POLL: Duration = Duration::from_millis(10);
/// The longest any driver runs, whatever happens.
const DRIVER_LIMIT: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------
// Basics

fn prerequisites(test: &str, program: &str) -> bool {
    if !is_root() {
        eprintln!("SKIPPED {test}: needs root");
        return false;
    }
    let ok = fs::metadata(program)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false);
    if !ok {
        eprintln!("SKIPPED {test}: {program} is not installed");
    }
    ok
}

fn read_lossy(p: &Path) -> String {
    fs::read(p).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default()
}

fn path_str(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

type Hosts = TestHosts;

// ---------------------------------------------------------------------------
// Processes, by PID and start time

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct ProcId {
    pid: i32,
    start: u64,
}

/// (state, ppid, start time, comm) from /proc/PID/stat.
fn read_stat(pid: i32) -> Option<(char, i32, u64, String)> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (open, close) = (text.find('(')?, text.rfind(')')?);
    let rest: Vec<&str> = text[close + 1..].split_whitespace().collect();
    Some((
        rest.first()?.chars().next()?,
        rest.get(1)?.parse().ok()?,
        rest.get(19)?.parse().ok()?,
        text[open + 1..close].to_string(),
    ))
}

fn proc_id(pid: i32) -> Option<ProcId> {
    read_stat(pid).map(|s| ProcId { pid, start: s.2 })
}

fn exists(id: &ProcId) -> bool {
    read_stat(id.pid).map(|s| s.2 == id.start).unwrap_or(false)
}

fn running(id: &ProcId) -> bool {
    read_stat(id.pid).map(|s| s.2 == id.start && s.0 != 'Z' && s.0 != 'X').unwrap_or(false)
}

fn kill_id(id: &ProcId, sig: libc::c_int) {
    if running(id) {
        // A process this test started or restored (PID and start time
        // checked just above).
        ferry_testkit::kill(id.pid, sig);
    }
}

/// The children of pid (over all its threads).
fn children(pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    if let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) {
        for t in tasks.flatten() {
            let text = fs::read_to_string(t.path().join("children")).unwrap_or_default();
            out.extend(text.split_whitespace().filter_map(|c| c.parse::<i32>().ok()));
        }
    }
    out.sort();
    out.dedup();
    out
}

/// root and its direct children (our servers are at most two levels deep).
fn tree(root: i32) -> Vec<ProcId> {
    proc_id(root).into_iter().chain(children(root).into_iter().filter_map(proc_id)).collect()
}

fn wait_child(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(Some(st)) = child.try_wait() {
            return Some(st);
        }
        if Instant::now() >= deadline {
            return None;
        }
        sleep(POLL);
    }
}

/// The server as started, then as restored; everything killed on drop.
struct Service {
    name: String,
    /// The server as started (our child), until reaped.
    original: Option<Child>,
    /// `ferry restore`, the parent of the restored server.
    restore: Option<Child>,
    /// Every process of the server's trees we have seen.
    known: Vec<ProcId>,
}

impl Service {
    fn note(&mut self, ids: &[ProcId]) {
        for id in ids {
            if !self.known.contains(id) {
                self.known.push(*id);
            }
        }
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        // Children of a root first (they are not ours to reap), then roots.
        for id in self.known.iter().rev() {
            kill_id(id, libc::SIGKILL);
        }
        for child in [self.original.as_mut(), self.restore.as_mut()].into_iter().flatten() {
            let _ = child.kill();
            let _ = wait_child(child, Duration::from_secs(10));
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.known.iter().any(running) && Instant::now() < deadline {
            sleep(POLL);
        }
        if let Some(left) = self.known.iter().find(|id| running(id)) {
            eprintln!("[{}] warning: {left:?} still runs after cleanup", self.name);
        }
    }
}

fn start_in(ns: &NetNs, cwd: &Path, log: &Path, program: &str, args: &[&str]) -> Child {
    spawn_in_netns(ns, cwd, log, Path::new(program), args)
}

/// `ferry ARGS`, bounded; returns status, stdout+stderr and wall time.
fn ferry(dir: &Path, tag: &str, args: &[&str]) -> (ExitStatus, String, Duration) {
    let out = dir.join(format!("ferry-{tag}.out"));
    let f = File::create(&out).expect("ferry out");
    let mut cmd = Command::new(FERRY);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::from(f.try_clone().expect("dup")))
        .stderr(Stdio::from(f));
    ferry_testkit::only_stdio(&mut cmd);
    let t = Instant::now();
    let mut child = cmd.spawn().expect("spawn ferry");
    let st = match wait_child(&mut child, Duration::from_secs(60)) {
        Some(st) => st,
        None => {
            let _ = child.kill();
            let _ = child.wait();
            panic!("`ferry {}` did not finish within 60 s:\n{}", args.join(" "), read_lossy(&out));
        }
    };
    (st, read_lossy(&out), t.elapsed())
}

fn locks() -> Vec<(String, String)> {
    network_locks(FERRY)
}

/// (connections, with unread bytes, with unacknowledged or unsent bytes)
/// of the established TCP connections in an image.
fn image_queues(images: &str) -> (usize, usize, usize) {
    let out =
        Command::new(FERRY).args(["inspect", "--json", images]).output().expect("ferry inspect");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("inspect json");
    fn walk(v: &serde_json::Value, r: &mut (usize, usize, usize)) {
        match v {
            serde_json::Value::Object(m) => {
                if let Some(c) = m.get("connection").filter(|c| c.is_object()) {
                    let len = |k: &str| c[k].as_array().map(Vec::len).unwrap_or(0);
                    r.0 += 1;
                    r.1 += (len("recv_queue") > 0) as usize;
                    r.2 += (len("send_queue") > 0) as usize;
                }
                m.values().for_each(|x| walk(x, r));
            }
            serde_json::Value::Array(a) => a.iter().for_each(|x| walk(x, r)),
            _ => {}
        }
    }
    let mut r = (0, 0, 0);
    walk(&v, &mut r);
    r
}

/// The server's side of the connection with client port `port` as the
/// image holds it, for a failure's report (see [`sequences`]).
fn image_connection(images: &str, port: u16) -> String {
    let out =
        Command::new(FERRY).args(["inspect", "--json", images]).output().expect("ferry inspect");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    fn find(v: &serde_json::Value, port: u16) -> Option<String> {
        match v {
            serde_json::Value::Object(m) => {
                let peer_port = m.get("peer").and_then(|p| p.get(1)).and_then(|p| p.as_u64());
                if let (Some(c), Some(p)) =
                    (m.get("connection").filter(|c| c.is_object()), peer_port)
                {
                    if p == u64::from(port) {
                        let len = |k: &str| c[k].as_array().map(Vec::len).unwrap_or(0);
                        return Some(format!(
                            "image: send_seq {} send_queue {} unsent {} recv_seq {} recv_queue {} window {} mss {}",
                            c["send_seq"], len("send_queue"), c["unsent"], c["recv_seq"],
                            len("recv_queue"), c["window"], c["mss_clamp"]
                        ));
                    }
                }
                m.values().find_map(|x| find(x, port))
            }
            serde_json::Value::Array(a) => a.iter().find_map(|x| find(x, port)),
            _ => None,
        }
    }
    find(&v, port).unwrap_or_else(|| format!("client port {port}: not in the image"))
}

/// Remote ends of the ESTABLISHED connections on local port `port` in the
/// TCP table of `pid`'s network namespace.
fn established_peers(pid: i32, port: u16) -> Vec<SocketAddr> {
    let text = fs::read_to_string(format!("/proc/{pid}/net/tcp")).unwrap_or_default();
    let addr = |s: &str| -> Option<SocketAddr> {
        let (a, p) = s.split_once(':')?;
        let a = u32::from_str_radix(a, 16).ok()?;
        Some(SocketAddr::from((Ipv4Addr::from(a.to_le_bytes()), u16::from_str_radix(p, 16).ok()?)))
    };
    text.lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let (local, remote) = (addr(f.get(1)?)?, addr(f.get(2)?)?);
            (local.port() == port && *f.get(3)? == "01").then_some(remote)
        })
        .collect()
}

// ---------------------------------------------------------------------------
// What the clients send and expect

/// The reply to one round of requests.
#[derive(Clone)]
enum Expect {
    /// Exactly these bytes.
    Exact(Arc<Vec<u8>>),
    /// One HTTP/1.1 200 keep-alive response with this body.
    Http(Arc<Vec<u8>>),
}

/// Checks a reply as it arrives.
struct Checker {
    expect: Expect,
    /// Bytes of the reply checked so far (for HTTP: of the body).
    pos: usize,
    /// HTTP: the header bytes until the blank line (None once parsed).
    head: Option<Vec<u8>>,
}

fn show(b: &[u8]) -> String {
    b.iter().take(80).flat_map(|&c| std::ascii::escape_default(c)).map(char::from).collect()
}

impl Checker {
    fn new(expect: Expect) -> Checker {
        let head = matches!(expect, Expect::Http(_)).then(Vec::new);
        Checker { expect, pos: 0, head }
    }

    /// Ok(true) once the whole reply arrived and matched.
    fn feed(&mut self, mut data: &[u8]) -> Result<bool, String> {
        if let Some(head) = self.head.as_mut() {
            let old = head.len();
            head.extend_from_slice(data);
            let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") else {
                if head.len() > 8192 {
                    return Err(format!("no end of HTTP headers in {}", show(head)));
                }
                return Ok(false);
            };
            let text = String::from_utf8_lossy(&head[..end]).into_owned();
            let Expect::Http(body) = &self.expect else { unreachable!() };
            if !text.starts_with("HTTP/1.1 200 ") {
                return Err(format!("status line {:?}", text.lines().next().unwrap_or("")));
            }
            let header = |name: &str| {
                text.lines().skip(1).find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.trim().eq_ignore_ascii_case(name).then(|| v.trim().to_string())
                })
            };
            if header("content-length").and_then(|v| v.parse::<usize>().ok()) != Some(body.len()) {
                return Err(format!(
                    "Content-Length {:?}, want {}",
                    header("content-length"),
                    body.len()
                ));
            }
            if header("connection").map(|v| v.eq_ignore_ascii_case("close")).unwrap_or(false) {
                return Err("the server closes the connection (Connection: close)".into());
            }
            data = &data[(end + 4).saturating_sub(old).min(data.len())..];
            self.head = None;
        }
        let want: &[u8] = match &self.expect {
            Expect::Exact(b) | Expect::Http(b) => b,
        };
        let rest = &want[self.pos..];
        if data.len() > rest.len() {
            return Err(format!(
                "{} bytes more than the reply ({} bytes)",
                data.len() - rest.len(),
                want.len()
            ));
        }
        if let Some(k) = (0..data.len()).find(|&k| data[k] != rest[k]) {
            let at = self.pos + k;
            return Err(format!(
                "reply byte {at} of {} differs: got \"{}\", want \"{}\"",
                want.len(),
                show(&data[k..]),
                show(&want[at..])
            ));
        }
        self.pos += data.len();
        Ok(self.pos == want.len())
    }
}

trait Proto: Send + Sync + 'static {
    /// Requests per round (for the report).
    fn per_round(&self) -> u64;
    /// The bytes of round `seq` of connection `conn`, and the reply.
    fn round(&self, conn: usize, seq: u64) -> (Vec<u8>, Expect);
}

fn mix(mut x: u64) -> u64 {
    x = x.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x ^= x >> 31;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^ (x >> 29)
}

/// The value connection `conn` writes at position `i` of round `seq`,
/// different for every (conn, seq, i): 24 to 423 bytes, and 4 to 32 kB on
/// every tenth connection (whose replies then fill the client's receive
/// window and wait in the server's send queue).
fn value(conn: usize, seq: u64, i: usize) -> Vec<u8> {
    let mut h = mix((conn as u64) << 40 ^ seq << 8 ^ i as u64);
    let len = if conn % 10 == 5 { 4096 + (h % 28672) as usize } else { 24 + (h % 400) as usize };
    let mut v = format!("c{conn}s{seq}i{i}-").into_bytes();
    while v.len() < len {
        h = mix(h);
        v.push(b'a' + (h % 26) as u8);
    }
    v.truncate(len);
    v
}

/// SET/GET pairs per round; keys per connection (a connection rewrites
/// each of its keys every KEYS / PAIRS rounds).
const PAIRS: usize = 8;
const KEYS: usize = 32;

fn key(conn: usize, slot: usize) -> String {
    format!("k:{conn}:{slot}")
}

fn slot(seq: u64, i: usize) -> usize {
    (seq as usize * PAIRS + i) % KEYS
}

/// The last (seq, i) before round `rounds` that wrote `slot`.
fn last_write(rounds: u64, slot_: usize) -> Option<(u64, usize)> {
    (rounds.saturating_sub((KEYS / PAIRS) as u64)..rounds)
        .rev()
        .find_map(|s| (0..PAIRS).find(|&i| slot(s, i) == slot_).map(|i| (s, i)))
}

/// A key/value server: how to write one key and how to read it back.
trait Kv: Proto {
    fn set(&self, out: &mut Vec<u8>, exp: &mut Vec<u8>, key: &str, flags: u32, val: &[u8]);
    fn get(&self, out: &mut Vec<u8>, exp: &mut Vec<u8>, key: &str, flags: u32, val: &[u8]);
}

fn kv_round(kv: &dyn Kv, conn: usize, seq: u64) -> (Vec<u8>, Expect) {
    let (mut out, mut exp) = (Vec::new(), Vec::new());
    for i in 0..PAIRS {
        let (k, v) = (key(conn, slot(seq, i)), value(conn, seq, i));
        kv.set(&mut out, &mut exp, &k, conn as u32, &v);
        kv.get(&mut out, &mut exp, &k, conn as u32, &v);
    }
    (out, Expect::Exact(Arc::new(exp)))
}

struct Redis;

fn resp(out: &mut Vec<u8>, args: &[&[u8]]) {
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
}

impl Kv for Redis {
    fn set(&self, out: &mut Vec<u8>, exp: &mut Vec<u8>, key: &str, _flags: u32, val: &[u8]) {
        resp(out, &[b"SET", key.as_bytes(), val]);
        exp.extend_from_slice(b"+OK\r\n");
    }
    fn get(&self, out: &mut Vec<u8>, exp: &mut Vec<u8>, key: &str, _flags: u32, val: &[u8]) {
        resp(out, &[b"GET", key.as_bytes()]);
        exp.extend_from_slice(format!("${}\r\n", val.len()).as_bytes());
        exp.extend_from_slice(val);
        exp.extend_from_slice(b"\r\n");
    }
}

impl Proto for Redis {
    fn per_round(&self) -> u64 {
        2 * PAIRS as u64
    }
    fn round(&self, conn: usize, seq: u64) -> (Vec<u8>, Expect) {
        kv_round(self, conn, seq)
    }
}

struct Memcached;

impl Kv for Memcached {
    fn set(&self, out: &mut Vec<u8>, exp: &mut Vec<u8>, key: &str, flags: u32, val: &[u8]) {
        out.extend_from_slice(format!("set {key} {flags} 0 {}\r\n", val.len()).as_bytes());
        out.extend_from_slice(val);
        out.extend_from_slice(b"\r\n");
        exp.extend_from_slice(b"STORED\r\n");
    }
    fn get(&self, out: &mut Vec<u8>, exp: &mut Vec<u8>, key: &str, flags: u32, val: &[u8]) {
        out.extend_from_slice(format!("get {key}\r\n").as_bytes());
        exp.extend_from_slice(format!("VALUE {key} {flags} {}\r\n", val.len()).as_bytes());
        exp.extend_from_slice(val);
        exp.extend_from_slice(b"\r\nEND\r\n");
    }
}

impl Proto for Memcached {
    fn per_round(&self) -> u64 {
        2 * PAIRS as u64
    }
    fn round(&self, conn: usize, seq: u64) -> (Vec<u8>, Expect) {
        kv_round(self, conn, seq)
    }
}

struct Http {
    body: Arc<Vec<u8>>,
}

impl Proto for Http {
    fn per_round(&self) -> u64 {
        1
    }
    fn round(&self, _conn: usize, _seq: u64) -> (Vec<u8>, Expect) {
        (
            b"GET /ferry.txt HTTP/1.1\r\nHost: ferry\r\nUser-Agent: ferry-test\r\n\r\n".to_vec(),
            Expect::Http(self.body.clone()),
        )
    }
}

/// One request/reply exchange on a fresh blocking connection (run inside
/// B), bounded by timeouts.
fn exchange(to: SocketAddr, rounds: &[(Vec<u8>, Expect)]) -> Result<(), String> {
    let mut s = TcpStream::connect_timeout(&to, Duration::from_secs(2))
        .map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(10))).map_err(|e| e.to_string())?;
    s.set_write_timeout(Some(Duration::from_secs(10))).map_err(|e| e.to_string())?;
    let mut buf = vec![0u8; 65536];
    for (req, exp) in rounds {
        s.write_all(req).map_err(|e| format!("write: {e}"))?;
        let mut c = Checker::new(exp.clone());
        loop {
            let n = s.read(&mut buf).map_err(|e| format!("read: {e}"))?;
            if n == 0 {
                return Err("EOF".into());
            }
            if c.feed(&buf[..n])? {
                break;
            }
        }
    }
    Ok(())
}

/// New clients arriving during the checkpoint and restore: each connects
/// (waiting for its SYN to be retried while the network lock holds the
/// listener), does one round and closes. None may fail.
struct Churn {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<(usize, Vec<String>)>,
}

impl Churn {
    fn start(ns: &NetNs, to: SocketAddr, proto: Arc<dyn Proto>) -> Churn {
        let stop = Arc::new(AtomicBool::new(false));
        let ns_path = ns.path();
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            ferry_testkit::enter_netns(&ns_path);
            let (mut done, mut errors) = (0, Vec::new());
            let until = Instant::now() + DRIVER_LIMIT;
            while !flag.load(Ordering::Relaxed) && Instant::now() < until {
                let round = proto.round(2_000_000 + done, 0);
                let r = (|| {
                    let mut s = TcpStream::connect_timeout(&to, Duration::from_secs(15))
                        .map_err(|e| format!("connect: {e}"))?;
                    s.set_read_timeout(Some(Duration::from_secs(15))).map_err(|e| e.to_string())?;
                    s.write_all(&round.0).map_err(|e| format!("write: {e}"))?;
                    let mut c = Checker::new(round.1.clone());
                    let mut buf = vec![0u8; 65536];
                    loop {
                        let n = s.read(&mut buf).map_err(|e| format!("read: {e}"))?;
                        if n == 0 {
                            return Err("EOF".to_string());
                        }
                        if c.feed(&buf[..n])? {
                            return Ok(());
                        }
                    }
                })();
                if let Err(e) = r {
                    errors.push(format!("new connection {done}: {e}"));
                }
                done += 1;
                sleep(Duration::from_millis(20));
            }
            (done, errors)
        });
        Churn { stop, thread }
    }

    fn finish(self) -> (usize, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("churn thread")
    }
}

/// Rounds that write (or read back) `keys` pre-checkpoint keys, 100 a round.
fn pre_keys(kv: &dyn Kv, read: bool, keys: usize) -> Vec<(Vec<u8>, Expect)> {
    (0..keys)
        .collect::<Vec<_>>()
        .chunks(100)
        .map(|chunk| {
            let (mut out, mut exp) = (Vec::new(), Vec::new());
            for &i in chunk {
                let (k, v) = (format!("pre:{i}"), value(1_000_000 + i, 0, 0));
                if read {
                    kv.get(&mut out, &mut exp, &k, 7, &v);
                } else {
                    kv.set(&mut out, &mut exp, &k, 7, &v);
                }
            }
            (out, Expect::Exact(Arc::new(exp)))
        })
        .collect()
}

/// Rounds that read back the last value of every key of every connection.
fn last_values(kv: &dyn Kv, rounds: &[u64]) -> Vec<(Vec<u8>, Expect)> {
    let mut all = Vec::new();
    for (conn, &r) in rounds.iter().enumerate() {
        let (mut out, mut exp) = (Vec::new(), Vec::new());
        for s in 0..KEYS {
            if let Some((seq, i)) = last_write(r, s) {
                kv.get(&mut out, &mut exp, &key(conn, s), conn as u32, &value(conn, seq, i));
            }
        }
        all.push((out, Expect::Exact(Arc::new(exp))));
    }
    all
}

// ---------------------------------------------------------------------------
// The load driver

struct Shared {
    /// Rounds completed, per connection.
    rounds: Vec<AtomicU64>,
    /// Finish the round in progress, then stop.
    stop: AtomicBool,
    /// Stop at once (the test is failing).
    abort: AtomicBool,
    /// Client addresses of the connections, once all are made.
    locals: Mutex<Vec<SocketAddr>>,
}

struct DriverResult {
    errors: Vec<String>,
    rounds: Vec<u64>,
}

struct Driver {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<DriverResult>>,
}

impl Driver {
    fn start(ns: &NetNs, to: SocketAddr, n: usize, proto: Arc<dyn Proto>) -> Driver {
        let shared = Arc::new(Shared {
            rounds: (0..n).map(|_| AtomicU64::new(0)).collect(),
            stop: AtomicBool::new(false),
            abort: AtomicBool::new(false),
            locals: Mutex::new(Vec::new()),
        });
        let path = ns.path();
        let sh = shared.clone();
        let thread = std::thread::spawn(move || {
            ferry_testkit::enter_netns(&path);
            drive(to, n, &*proto, &sh)
        });
        Driver { shared, thread: Some(thread) }
    }

    fn rounds(&self) -> Vec<u64> {
        self.shared.rounds.iter().map(|r| r.load(Ordering::Relaxed)).collect()
    }

    fn finish(mut self) -> DriverResult {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.thread.take().expect("driver thread").join().expect("driver thread panicked")
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        if let Some(t) = self.thread.take() {
            self.shared.abort.store(true, Ordering::SeqCst);
            let _ = t.join();
        }
    }
}

/// Every tenth connection is a slow reader: a small receive buffer, and
/// it starts reading a reply only 1 s after sending the request, so the
/// server's replies wait in its send queue, also while it is frozen and
/// when the network lock comes (ferry freezes the tree first and locks the
/// network some 100-500 ms later: by then a fast reader has taken every
/// byte the kernel could still send).
const SLOW_READ: Duration = Duration::from_millis(1000);

fn slow(conn: usize) -> bool {
    conn % 10 == 5
}

/// Rounds a connection must complete before the checkpoint and after the
/// restore.
fn rounds_needed(conn: usize, after_restore: bool) -> u64 {
    match (slow(conn), after_restore) {
        (true, false) => 1,
        (true, true) => 1,
        (false, false) => 3,
        (false, true) => 5,
    }
}

struct Conn {
    s: TcpStream,
    /// A slow reader: reads nothing before this.
    read_after: Option<Instant>,
    out: Vec<u8>,
    off: usize,
    check: Checker,
    seq: u64,
    error: Option<String>,
    finished: bool,
}

fn drive(to: SocketAddr, n: usize, proto: &dyn Proto, sh: &Shared) -> DriverResult {
    let hard = Instant::now() + DRIVER_LIMIT;
    let mut conns = Vec::with_capacity(n);
    let mut errors = Vec::new();
    for id in 0..n {
        match TcpStream::connect_timeout(&to, Duration::from_secs(5)) {
            Ok(s) => {
                s.set_nodelay(true).expect("nodelay");
                s.set_nonblocking(true).expect("nonblocking");
                if slow(id) {
                    ferry_testkit::set_socket_option(&s, libc::SOL_SOCKET, libc::SO_RCVBUF, 8192);
                }
                let (out, exp) = proto.round(id, 0);
                let read_after = slow(id).then(|| Instant::now() + SLOW_READ);
                conns.push(Conn {
                    s,
                    read_after,
                    out,
                    off: 0,
                    check: Checker::new(exp),
                    seq: 0,
                    error: None,
                    finished: false,
                });
            }
            Err(e) => {
                errors.push(format!("conn {id}: connect: {e}"));
                return DriverResult { errors, rounds: vec![0; n] };
            }
        }
    }
    *sh.locals.lock().unwrap() =
        conns.iter().map(|c| c.s.local_addr().expect("local addr")).collect();
    let mut buf = vec![0u8; 65536];
    let mut stop_deadline = None;
    loop {
        if sh.abort.load(Ordering::Relaxed) || Instant::now() > hard {
            break;
        }
        if sh.stop.load(Ordering::Relaxed) {
            let d = *stop_deadline.get_or_insert(Instant::now() + Duration::from_secs(10));
            if Instant::now() > d {
                break;
            }
        }
        let active: Vec<usize> =
            (0..n).filter(|&i| conns[i].error.is_none() && !conns[i].finished).collect();
        if active.is_empty() {
            break;
        }
        let mut fds: Vec<libc::pollfd> = active
            .iter()
            .map(|&i| {
                let c = &conns[i];
                let reading = c.read_after.map(|t| Instant::now() >= t).unwrap_or(true);
                let mut events = if reading { libc::POLLIN } else { 0 };
                if c.off < c.out.len() {
                    events |= libc::POLLOUT;
                }
                libc::pollfd { fd: c.s.as_raw_fd(), events, revents: 0 }
            })
            .collect();
        // An interrupted poll reports no events, like a timeout.
        ferry_testkit::poll(&mut fds, 5);
        for (k, &id) in active.iter().enumerate() {
            let rev = fds[k].revents;
            if rev == 0 {
                continue;
            }
            let c = &mut conns[id];
            let rounds = sh.rounds[id].load(Ordering::Relaxed);
            let ctx = |what: &str| format!("conn {id} (round {rounds}): {what}");
            // Write what the socket takes.
            while c.off < c.out.len() && c.error.is_none() {
                match c.s.write(&c.out[c.off..]) {
                    Ok(0) => c.error = Some(ctx("write returned 0")),
                    Ok(w) => c.off += w,
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(e) => c.error = Some(ctx(&format!("write: {e}"))),
                }
            }
            // Read and check what came (a slow reader: not yet).
            if c.read_after.map(|t| Instant::now() < t).unwrap_or(false) {
                continue;
            }
            while c.error.is_none() && !c.finished {
                match c.s.read(&mut buf) {
                    Ok(0) => {
                        c.error =
                            Some(ctx(&format!("EOF after {} bytes of the reply", c.check.pos)))
                    }
                    Ok(m) => match c.check.feed(&buf[..m]) {
                        Err(e) => c.error = Some(ctx(&e)),
                        Ok(false) => {}
                        Ok(true) => {
                            if c.off < c.out.len() {
                                c.error = Some(ctx(
                                    "the whole reply came before the whole request was sent",
                                ));
                                break;
                            }
                            sh.rounds[id].fetch_add(1, Ordering::Relaxed);
                            if sh.stop.load(Ordering::Relaxed) {
                                c.finished = true;
                                break;
                            }
                            c.seq += 1;
                            let (out, exp) = proto.round(id, c.seq);
                            c.out = out;
                            c.off = 0;
                            c.check = Checker::new(exp);
                            c.read_after = slow(id).then(|| Instant::now() + SLOW_READ);
                            while c.off < c.out.len() && c.error.is_none() {
                                match c.s.write(&c.out[c.off..]) {
                                    Ok(w) if w > 0 => c.off += w,
                                    Ok(_) => c.error = Some(ctx("write returned 0")),
                                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                                    Err(e) => c.error = Some(ctx(&format!("write: {e}"))),
                                }
                            }
                        }
                    },
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(e) => c.error = Some(ctx(&format!("read: {e}"))),
                }
            }
        }
    }
    errors.extend(conns.iter().filter_map(|c| c.error.clone()));
    let unfinished: Vec<String> = conns
        .iter()
        .filter(|c| c.error.is_none() && !c.finished)
        .filter_map(|c| Some(format!("{} ({})", c.s.local_addr().ok()?.port(), sequences(&c.s))))
        .collect();
    if !unfinished.is_empty() {
        errors.push(format!(
            "{} connections did not finish their last round (driver stopped or timed out); client ports {:?}",
            unfinished.len(),
            &unfinished[..unfinished.len().min(5)]
        ));
    }
    DriverResult { errors, rounds: sh.rounds.iter().map(|r| r.load(Ordering::Relaxed)).collect() }
}

/// A stuck client socket's sequence numbers (read in repair mode, which
/// the connection does not survive unchanged: only for a failure's
/// report), to set against the server's in the image
/// ([`image_connection`]): which side lost track of which bytes.
fn sequences(s: &TcpStream) -> String {
    use ferry_sys::socket;
    let fd = s.as_raw_fd();
    let read = || -> ferry_sys::SysResult<String> {
        socket::set_repair(fd, 1)?;
        socket::set_repair_queue(fd, socket::TCP_RECV_QUEUE)?;
        let rcv_nxt = socket::queue_seq(fd)?;
        socket::set_repair_queue(fd, socket::TCP_SEND_QUEUE)?;
        let write_seq = socket::queue_seq(fd)?;
        let (inq, outq) = (socket::inq(fd)?, socket::outq(fd)?);
        Ok(format!(
            "client rcv_nxt {rcv_nxt} with {inq} unread, write_seq {write_seq} with {outq} unacked"
        ))
    };
    read().unwrap_or_else(|e| format!("client sequences not read: {e}"))
}

// ---------------------------------------------------------------------------
// One server through a checkpoint under load

struct Case<'a> {
    name: &'a str,
    program: &'a str,
    args: Vec<String>,
    port: u16,
    conns: usize,
    proto: Arc<dyn Proto>,
    /// Child processes the server runs (nginx workers).
    workers: usize,
    /// For key/value servers: written before, read back after.
    kv: Option<Arc<dyn Kv>>,
}

/// ferry's own time from its summary line ("... in 12.3 ms ...").
fn engine_ms(text: &str) -> f64 {
    text.lines()
        .rev()
        .find_map(|l| {
            l.split_once(" in ")?.1.split_once(" ms").and_then(|(n, _)| n.trim().parse().ok())
        })
        .unwrap_or(f64::NAN)
}

fn sum(v: &[u64]) -> u64 {
    v.iter().sum()
}

fn run_case(case: Case, hosts: &Hosts, dir: &Path) {
    let name = case.name;
    let to: SocketAddr = format!("{A_V4}:{}", case.port).parse().expect("address");
    let log = dir.join("server.log");
    let args: Vec<&str> = case.args.iter().map(String::as_str).collect();
    let mut svc =
        Service { name: name.to_string(), original: None, restore: None, known: Vec::new() };
    let child = start_in(&hosts.a, dir, &log, case.program, &args);
    let root = child.id() as i32;
    svc.original = Some(child);
    svc.note(&tree(root));

    // Ready: a whole round answered from B, and the workers up.
    let deadline = Instant::now() + Duration::from_secs(15);
    let proto = case.proto.clone();
    loop {
        if let Some(st) = svc.original.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
            panic!("[{name}] server exited early ({st:?}):\n{}", read_lossy(&log));
        }
        let p = proto.clone();
        let answered = hosts.b.run(move || exchange(to, &[p.round(1_000_000, 0)]));
        let procs = tree(root);
        svc.note(&procs);
        if answered.is_ok() && procs.len() == 1 + case.workers {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "[{name}] not ready: {answered:?}, {} processes\n{}",
            procs.len(),
            read_lossy(&log)
        );
        sleep(Duration::from_millis(50));
    }
    let before_tree = tree(root);
    svc.note(&before_tree);
    if let Some(kv) = &case.kv {
        let rounds = pre_keys(&**kv, false, 1000);
        hosts
            .b
            .run(move || exchange(to, &rounds))
            .unwrap_or_else(|e| panic!("[{name}] writing 1000 keys: {e}"));
    }

    // Load, until every connection did a few rounds.
    let driver = Driver::start(&hosts.b, to, case.conns, case.proto.clone());
    let t_load = Instant::now();
    let deadline = Instant::now() + Duration::from_secs(15);
    let warm = |r: &[u64]| (0..r.len()).filter(|&i| r[i] < rounds_needed(i, false)).count();
    while warm(&driver.rounds()) > 0 {
        assert!(
            Instant::now() < deadline && !driver.thread.as_ref().unwrap().is_finished(),
            "[{name}] load did not start on {} connections",
            warm(&driver.rounds())
        );
        sleep(POLL);
    }
    sleep(Duration::from_millis(500));
    let locals = driver.shared.locals.lock().unwrap().clone();
    assert_eq!(locals.len(), case.conns);

    // Checkpoint (kills the server) while the load runs and new clients
    // keep arriving.
    let churn = Churn::start(&hosts.b, to, case.proto.clone());
    sleep(Duration::from_millis(100));
    let images = dir.join("images");
    let at_checkpoint = driver.rounds();
    let load_s = t_load.elapsed().as_secs_f64();
    // A connection that completes its handshake in the instant before the
    // lock holds the listener lands in the accept queue, or one a churn
    // client just closed waits for the server to close it: ferry tries
    // again itself a few times, then refuses (naming it, the service
    // untouched) and says to try again: do so.
    let mut attempt = 0;
    let (st, out, checkpoint_wall) = loop {
        let r = ferry(
            dir,
            "checkpoint",
            &["checkpoint", "--pid", &root.to_string(), "--images", path_str(&images)],
        );
        attempt += 1;
        if r.0.success() || !r.1.contains("try again") || attempt == 3 {
            break r;
        }
        eprintln!("[{name}] checkpoint refused, trying again: {}", r.1.trim());
    };
    let after_checkpoint = driver.rounds();
    assert!(st.success(), "[{name}] ferry checkpoint failed ({st:?}):\n{out}");
    eprintln!("[{name}] ferry checkpoint: {}", out.trim());
    let lock = image_lock(FERRY, path_str(&images));
    assert!(lock.is_some(), "[{name}] the image names no network lock");
    let (held, unread, unsent) = image_queues(path_str(&images));
    eprintln!("[{name}] image: {held} TCP connections, {unread} with unread request bytes, {unsent} with unacknowledged or unsent reply bytes");
    // A new client caught between accept and its reply is in the image
    // too (and must finish its round after restore, like the others).
    assert!(
        held >= case.conns,
        "[{name}] only {held} connections in the image, the load has {}",
        case.conns
    );
    // Requests in flight are certain under this load; replies in flight
    // depend on timing (the slow readers), so they are only reported.
    assert!(unread > 0, "[{name}] no request in flight at the checkpoint");
    if unsent == 0 {
        eprintln!("[{name}] note: no reply bytes were in flight at this checkpoint");
    }
    let mut child = svc.original.take().expect("server child");
    let st = wait_child(&mut child, Duration::from_secs(10)).unwrap_or_else(|| {
        svc.original = Some(child);
        panic!("[{name}] the server still runs after the checkpoint");
    });
    assert_eq!(st.signal(), Some(libc::SIGKILL), "[{name}] the server ended with {st:?}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while before_tree.iter().any(exists) {
        assert!(
            Instant::now() < deadline,
            "[{name}] processes of the tree are still there: {before_tree:?}"
        );
        sleep(POLL);
    }

    // Restore into A; ferry stays the parent.
    let pidfile = dir.join("restored.pid");
    let err = dir.join("ferry-restore.out");
    let mut cmd = Command::new(FERRY);
    cmd.args([
        "restore",
        "--images",
        path_str(&images),
        "--netns",
        &hosts.a.0,
        "--pidfile",
        path_str(&pidfile),
    ])
    .stdin(Stdio::null())
    .stdout(Stdio::from(File::create(&err).expect("restore out")))
    .stderr(Stdio::from(File::options().append(true).open(&err).expect("restore err")));
    ferry_testkit::only_stdio(&mut cmd);
    let t = Instant::now();
    svc.restore = Some(cmd.spawn().expect("spawn ferry restore"));
    let deadline = Instant::now() + Duration::from_secs(30);
    while !read_lossy(&pidfile).ends_with('\n') {
        if let Some(st) = svc.restore.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
            panic!("[{name}] ferry restore exited with {st:?}:\n{}", read_lossy(&err));
        }
        assert!(
            Instant::now() < deadline,
            "[{name}] no pidfile within 30 s:\n{}",
            read_lossy(&err)
        );
        sleep(Duration::from_millis(2));
    }
    let restore_wall = t.elapsed();
    let restore_engine = engine_ms(&read_lossy(&err));
    let checkpoint_engine = engine_ms(&out);
    let at_restore = driver.rounds();
    let restored: i32 = read_lossy(&pidfile).trim().parse().expect("pidfile");
    assert_eq!(restored, root, "[{name}] restored under another PID");
    let after_tree = tree(restored);
    svc.note(&after_tree);
    assert_eq!(
        after_tree.len(),
        before_tree.len(),
        "[{name}] restored tree {after_tree:?}, was {before_tree:?}"
    );
    assert!(
        after_tree.iter().zip(&before_tree).all(|(a, b)| a.pid == b.pid),
        "[{name}] restored tree {after_tree:?}, was {before_tree:?}"
    );

    // Every connection goes on: several more rounds each, at least 1.5 s.
    let t_after = Instant::now();
    let (mut fast_moved, mut all_moved) = (None, None);
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let now = driver.rounds();
        if fast_moved.is_none() && (0..now.len()).all(|i| slow(i) || now[i] > at_restore[i]) {
            fast_moved = Some(t_after.elapsed());
        }
        if all_moved.is_none() && now.iter().zip(&at_restore).all(|(n, r)| n > r) {
            all_moved = Some(t_after.elapsed());
        }
        if t_after.elapsed() >= Duration::from_millis(1500)
            && (0..now.len()).all(|i| now[i] >= at_restore[i] + rounds_needed(i, true))
        {
            break;
        }
        if Instant::now() > deadline || driver.thread.as_ref().unwrap().is_finished() {
            break;
        }
        sleep(Duration::from_millis(5));
    }
    // The same connections, seen from the server's side.
    let peers = established_peers(restored, case.port);
    let missing: Vec<&SocketAddr> = locals.iter().filter(|l| !peers.contains(l)).collect();
    let after_s = t_after.elapsed().as_secs_f64();
    let result = driver.finish();
    let (new_clients, churn_errors) = churn.finish();
    eprintln!(
        "[{name}] {new_clients} new connections during checkpoint and restore, {} failed",
        churn_errors.len()
    );
    assert!(churn_errors.is_empty(), "[{name}] new clients failed: {churn_errors:#?}");
    assert!(new_clients >= 3, "[{name}] only {new_clients} new connections were tried");
    let per = case.proto.per_round();
    let (r_ck, r_ck_end, r_rs, r_end) =
        (sum(&at_checkpoint), sum(&after_checkpoint), sum(&at_restore), sum(&result.rounds));
    eprintln!(
        "[{name}] {} connections: {} requests before the checkpoint ({} rounds in {load_s:.1} s), {} during checkpoint, {} between checkpoint and restore, {} after restore (in {after_s:.1} s); \
         checkpoint {:.1} ms wall ({:.1} ms in ferry), restore {:.1} ms wall to the pidfile ({:.1} ms in ferry, the server runs before the pidfile is written); first reply after restore on every fast connection within {:.1} ms, on every connection (slow readers included) within {:.1} ms; reconnects 0; errors {}",
        case.conns,
        r_ck * per,
        r_ck,
        (r_ck_end - r_ck) * per,
        (r_rs - r_ck_end) * per,
        (r_end - r_rs) * per,
        checkpoint_wall.as_secs_f64() * 1e3,
        checkpoint_engine,
        restore_wall.as_secs_f64() * 1e3,
        restore_engine,
        fast_moved.map(|d| d.as_secs_f64() * 1e3).unwrap_or(f64::NAN),
        all_moved.map(|d| d.as_secs_f64() * 1e3).unwrap_or(f64::NAN),
        result.errors.len(),
    );
    let stuck: Vec<usize> = (0..case.conns)
        .filter(|&i| result.rounds[i] < at_restore[i] + rounds_needed(i, true))
        .collect();
    let stuck_in_image = || -> Vec<String> {
        stuck
            .iter()
            .take(5)
            .map(|&i| image_connection(path_str(&images), locals[i].port()))
            .collect()
    };
    assert!(
        result.errors.is_empty(),
        "[{name}] {} client errors, first: {:#?}\nrestore:\n{}\n{}\n{:#?}",
        result.errors.len(),
        &result.errors[..result.errors.len().min(5)],
        read_lossy(&err),
        common::tcp_diagnostics(&[&hosts.a.0, &hosts.b.0]),
        stuck_in_image()
    );
    assert!(
        stuck.is_empty(),
        "[{name}] {} connections made too few rounds after the restore (first: conn {} with {} rounds, {} at restore)\n{:#?}",
        stuck.len(),
        stuck[0],
        result.rounds[stuck[0]],
        at_restore[stuck[0]],
        stuck_in_image()
    );
    assert!(
        missing.is_empty(),
        "[{name}] {} client connections are not established at the server after restore: {:?}",
        missing.len(),
        &missing[..missing.len().min(5)]
    );

    // The data written before the checkpoint (and since) is there.
    if let Some(kv) = &case.kv {
        let mut rounds = pre_keys(&**kv, true, 1000);
        rounds.extend(last_values(&**kv, &result.rounds));
        hosts
            .b
            .run(move || exchange(to, &rounds))
            .unwrap_or_else(|e| panic!("[{name}] reading back the keys: {e}"));
        eprintln!(
            "[{name}] 1000 keys written before the load and the last value of {} keys read back",
            case.conns * KEYS
        );
    }
    if let Some(l) = lock {
        let left = locks();
        assert!(
            !left.iter().any(|(n, _)| *n == l),
            "[{name}] network lock {l} was left behind: {left:?}"
        );
    }

    // Stop the restored server; ferry restore exits with it.
    kill_id(&after_tree[0], libc::SIGTERM);
    let mut restore = svc.restore.take().expect("ferry restore");
    match wait_child(&mut restore, Duration::from_secs(15)) {
        Some(st) => eprintln!("[{name}] stopped with SIGTERM; ferry restore exited with {st:?}"),
        None => {
            svc.restore = Some(restore);
            panic!("[{name}] ferry restore still runs 15 s after SIGTERM to the server");
        }
    }
}

#[test]
fn redis_200_pipelining_clients_survive_checkpoint() {
    const TEST: &str = "redis";
    if !prerequisites(TEST, REDIS) {
        return;
    }
    let hosts = Hosts::new("rd");
    let dir = TempDir::new("ferry-srv", TEST);
    let port = 6379;
    let args = [
        "--bind",
        A_V4,
        "--port",
        &port.to_string(),
        "--save",
        "",
        "--appendonly",
        "no",
        "--daemonize",
        "no",
        "--protected-mode",
        "no",
        "--dir",
        path_str(&dir.0),
    ];
    let kv = Arc::new(Redis);
    run_case(
        Case {
            name: TEST,
            program: REDIS,
            args: args.iter().map(|s| s.to_string()).collect(),
            port,
            conns: 200,
            proto: kv.clone(),
            workers: 0,
            kv: Some(kv),
        },
        &hosts,
        &dir.0,
    );
}

#[test]
fn memcached_200_pipelining_clients_survive_checkpoint() {
    const TEST: &str = "memcached";
    if !prerequisites(TEST, MEMCACHED) {
        return;
    }
    let hosts = Hosts::new("mc");
    let dir = TempDir::new("ferry-srv", TEST);
    let port = 11211;
    let args = ["-t", "4", "-p", &port.to_string(), "-U", "0", "-l", A_V4, "-u", "root"];
    let kv = Arc::new(Memcached);
    run_case(
        Case {
            name: TEST,
            program: MEMCACHED,
            args: args.iter().map(|s| s.to_string()).collect(),
            port,
            conns: 200,
            proto: kv.clone(),
            workers: 0,
            kv: Some(kv),
        },
        &hosts,
        &dir.0,
    );
}

/// 100 kB of text lines.
fn static_content() -> Vec<u8> {
    let mut v = Vec::with_capacity(100_000);
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut line = 0;
    while v.len() < 100_000 {
        v.extend_from_slice(format!("ferry nginx line {line:05} ").as_bytes());
        for _ in 0..40 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            v.push(b'a' + (x % 26) as u8);
        }
        v.push(b'\n');
        line += 1;
    }
    v.truncate(100_000);
    v
}

#[test]
fn nginx_50_keepalive_clients_survive_checkpoint() {
    const TEST: &str = "nginx";
    if !prerequisites(TEST, NGINX) {
        return;
    }
    let hosts = Hosts::new("ng");
    let dir = TempDir::new("ferry-srv", TEST);
    let port = 8080;
    let d = path_str(&dir.0);
    let www = dir.0.join("www");
    fs::create_dir_all(&www).expect("www");
    fs::set_permissions(&www, fs::Permissions::from_mode(0o755)).expect("chmod www");
    let body = static_content();
    fs::write(www.join("ferry.txt"), &body).expect("write the file");
    fs::set_permissions(www.join("ferry.txt"), fs::Permissions::from_mode(0o644))
        .expect("chmod file");
    let conf = format!(
        "daemon off;\n\
         master_process on;\n\
         worker_processes 2;\n\
         user nobody nogroup;\n\
         pid {d}/nginx.pid;\n\
         error_log {d}/error.log notice;\n\
         events {{ worker_connections 1024; }}\n\
         http {{\n\
           access_log off;\n\
           keepalive_timeout 60s;\n\
           keepalive_requests 100000;\n\
           client_body_temp_path {d}/client_body;\n\
           proxy_temp_path {d}/proxy;\n\
           fastcgi_temp_path {d}/fastcgi;\n\
           uwsgi_temp_path {d}/uwsgi;\n\
           scgi_temp_path {d}/scgi;\n\
           types {{ text/plain txt; }}\n\
           default_type application/octet-stream;\n\
           server {{\n\
             listen {A_V4}:{port};\n\
             root {d}/www;\n\
             location / {{ }}\n\
           }}\n\
         }}\n"
    );
    fs::write(dir.0.join("nginx.conf"), conf).expect("write nginx.conf");
    let args =
        ["-p", &format!("{d}/"), "-c", &format!("{d}/nginx.conf"), "-e", &format!("{d}/error.log")]
            .map(String::from)
            .to_vec();
    run_case(
        Case {
            name: TEST,
            program: NGINX,
            args,
            port,
            conns: 50,
            proto: Arc::new(Http { body: Arc::new(body) }),
            workers: 2,
            kv: None,
        },
        &hosts,
        &dir.0,
    );
}
