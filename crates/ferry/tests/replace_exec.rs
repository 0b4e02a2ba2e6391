//! `ferry replace --pid PID --exec PATH [ARGS...]`: a new binary takes
//! over a running server's listening socket while clients keep opening
//! connections, and the old server drains the connections it has.
//!
//! The servers (tests/replace/version_server.c, nginx) run on 127.0.0.1
//! at a free port as children of the test process, which is a child
//! subreaper: the new binary, ferry's child, comes back to the test when
//! ferry exits, and so does ferry's bind answerer (`ferry-binds`), which
//! ends once the new binary is gone. Everything a test starts is killed
//! by PID (checked by name) and reaped on drop, also when it fails.

use ferry_testkit::{require_root, TempDir};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{sleep, JoinHandle};
use std::time::{Duration, Instant};

const FERRY: &str = env!("CARGO_BIN_EXE_ferry");
const NGINX: &str = "/usr/sbin/nginx";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// (state, ppid) from /proc/PID/stat.
fn stat(pid: i32) -> Option<(char, i32)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest: Vec<&str> = text[text.rfind(')')? + 1..].split_whitespace().collect();
    Some((rest.first()?.chars().next()?, rest.get(1)?.parse().ok()?))
}

fn alive(pid: i32) -> bool {
    stat(pid).is_some_and(|(s, _)| s != 'Z' && s != 'X')
}

fn comm(pid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default().trim().to_string()
}

fn children_of(pid: i32) -> Vec<i32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|n| n.parse().ok())
        .collect()
}

/// A server tree started by the test or handed to it by ferry: every
/// process still named `comm` killed, and the root reaped, on drop.
struct Tree {
    root: i32,
    comm: String,
    stop: Arc<AtomicBool>,
    reaper: Option<JoinHandle<()>>,
}

impl Tree {
    /// A tree the test reaps; `comm` None: the name it has now.
    fn adopt(root: i32, comm: Option<&str>) -> Tree {
        let comm = comm.map_or_else(|| self::comm(root), str::to_string);
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let reaper = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let _ = ferry_testkit::try_reap(root);
                sleep(Duration::from_millis(2));
            }
        });
        Tree { root, comm, stop, reaper: Some(reaper) }
    }

    fn start(argv: &[&str], comm: &str, port: u16, dir: &Path) -> Tree {
        let tree = Tree::adopt(ferry_testkit::spawn_detached(argv, dir), Some(comm));
        let t = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(alive(tree.root), "{comm} exited before it listened on {port}");
            assert!(t.elapsed() < Duration::from_secs(10), "{comm} does not listen on {port}");
            sleep(Duration::from_millis(20));
        }
        tree
    }

    fn wait_gone(&self, within: Duration) -> bool {
        let t = Instant::now();
        while alive(self.root) {
            if t.elapsed() > within {
                return false;
            }
            sleep(Duration::from_millis(10));
        }
        true
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        // Stopped first, so that a master does not respawn the workers
        // killed below.
        if comm(self.root) == self.comm {
            ferry_testkit::kill(self.root, libc::SIGSTOP);
            let t = Instant::now();
            while stat(self.root).is_some_and(|(s, _)| s != 'T')
                && t.elapsed() < Duration::from_secs(2)
            {
                sleep(Duration::from_millis(2));
            }
        }
        let mut pids = vec![self.root];
        pids.extend(children_of(self.root));
        for &p in pids.iter().rev() {
            if comm(p) == self.comm {
                ferry_testkit::kill(p, libc::SIGKILL);
            }
        }
        self.wait_gone(Duration::from_secs(5));
        self.stop.store(true, Ordering::Relaxed);
        if let Some(r) = self.reaper.take() {
            let _ = r.join();
        }
        let _ = ferry_testkit::try_reap(self.root);
        // Its children, orphaned, come back to the test (a subreaper).
        let me = std::process::id() as i32;
        for &p in &pids[1..] {
            let t = Instant::now();
            while let Some((state, ppid)) = stat(p) {
                if ppid == me && state == 'Z' {
                    let _ = ferry_testkit::try_reap(p);
                }
                if ppid != me && ppid != self.root || t.elapsed() > Duration::from_secs(2) {
                    break;
                }
                sleep(Duration::from_millis(5));
            }
        }
        reap_answerers();
    }
}

/// Reaps the test's `ferry-binds` children that have ended (their new
/// binary is gone); waits a little for them to notice.
fn reap_answerers() {
    let me = std::process::id() as i32;
    let t = Instant::now();
    loop {
        let mine: Vec<i32> =
            children_of(me).into_iter().filter(|&p| comm(p) == "ferry-binds").collect();
        let mut running = false;
        for p in mine {
            match stat(p) {
                Some(('Z', _)) => {
                    let _ = ferry_testkit::try_reap(p);
                }
                Some(_) => running = true,
                None => {}
            }
        }
        if !running || t.elapsed() > Duration::from_secs(2) {
            return;
        }
        sleep(Duration::from_millis(10));
    }
}

/// `ferry replace --pid PID ARGS...`, running.
fn ferry_replace(pid: i32, args: &[&str]) -> Child {
    let mut cmd = Command::new(FERRY);
    cmd.args(["replace", "--pid", &pid.to_string()])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd.spawn().expect("starting ferry replace")
}

/// Waits for `child` at most `within`; kills it after that.
fn finish(mut child: Child, within: Duration) -> Output {
    let t = Instant::now();
    while child.try_wait().expect("try_wait").is_none() {
        if t.elapsed() > within {
            let _ = child.kill();
            break;
        }
        sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("ferry output")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The new PID in "replaced pid P by pid Q (...)".
fn new_pid(line: &str) -> i32 {
    line.split(" by pid ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no new pid in {line:?}"))
}

/// The seconds in "drained in X s".
fn drained_s(line: &str) -> f64 {
    line.split("drained in ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no drain time in {line:?}"))
}

/// The inode of the TCP socket listening on 127.0.0.1:`port`.
fn listener_inode(port: u16) -> Option<u64> {
    let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
    let local = format!("0100007F:{port:04X}");
    table.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.get(1) == Some(&local.as_str()) && f.get(3) == Some(&"0A"))
            .then(|| f.get(9)?.parse().ok())?
    })
}

/// The socket inodes `pid` holds.
fn socket_inodes(pid: i32) -> Vec<u64> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else { return Vec::new() };
    dir.flatten()
        .filter_map(|e| {
            let link = std::fs::read_link(e.path()).ok()?;
            let link = link.to_str()?.to_string();
            link.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
        })
        .collect()
}

/// One connection of the version server's line protocol.
struct Conn {
    r: BufReader<TcpStream>,
}

impl Conn {
    fn open(port: u16) -> Result<(Conn, Duration), String> {
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let t = Instant::now();
        let s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
            .map_err(|e| format!("connect: {e}"))?;
        let took = t.elapsed();
        s.set_read_timeout(Some(Duration::from_secs(5))).map_err(|e| e.to_string())?;
        Ok((Conn { r: BufReader::new(s) }, took))
    }

    /// One question, one answer: "VERSION PID".
    fn ask(&mut self) -> Result<String, String> {
        self.say("q")
    }

    /// One line, its answer.
    fn say(&mut self, line: &str) -> Result<String, String> {
        let line = format!("{line}\n");
        self.r.get_mut().write_all(line.as_bytes()).map_err(|e| format!("write: {e}"))?;
        let mut line = String::new();
        match self.r.read_line(&mut line) {
            Ok(0) => Err("the server closed the connection".into()),
            Ok(_) => Ok(line.trim().to_string()),
            Err(e) => Err(format!("read: {e}")),
        }
    }
}

/// What the clients that open a new connection for each question saw.
#[derive(Default)]
struct Seen {
    answers: Vec<String>,
    errors: Vec<String>,
    slowest_connect: Duration,
}

/// A client thread opening a connection per question, every 2 ms, until
/// stopped (at most 20,000 times).
fn new_connections(port: u16, stop: Arc<AtomicBool>) -> (JoinHandle<()>, Arc<Mutex<Seen>>) {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let s = seen.clone();
    let h = std::thread::spawn(move || {
        for _ in 0..20_000 {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            let got = Conn::open(port).and_then(|(mut c, took)| Ok((c.ask()?, took)));
            let mut seen = s.lock().expect("seen");
            match got {
                Ok((answer, took)) => {
                    seen.slowest_connect = seen.slowest_connect.max(took);
                    seen.answers.push(answer);
                }
                Err(e) => seen.errors.push(e),
            }
            drop(seen);
            sleep(Duration::from_millis(2));
        }
    });
    (h, seen)
}

fn version_server(tag: &str) -> (TempDir, PathBuf, u16) {
    let dir = TempDir::new("ferry-replace-exec", tag);
    let bin = dir.path().join("version_server");
    ferry_testkit::compile_c(&repo().join("tests/replace/version_server.c"), &bin);
    (dir, bin, ferry_testkit::free_port())
}

fn wait_for(what: &str, within: Duration, mut ok: impl FnMut() -> bool) {
    let t = Instant::now();
    while !ok() {
        assert!(t.elapsed() < within, "{what}: not within {within:?}");
        sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_new_binary_takes_over_the_listener_and_the_old_one_drains() {
    require_root!();
    let (dir, bin, port) = version_server("takeover");
    let (b, p) = (bin.to_str().expect("utf-8"), port.to_string());
    let old = Tree::start(&[b, &p, "v1"], "version_server", port, dir.path());
    let v1 = format!("v1 {}", old.root);
    let mut kept: Vec<Conn> = (0..4).map(|_| Conn::open(port).expect("keep-alive").0).collect();
    for c in &mut kept {
        assert_eq!(c.ask().expect("old answers"), v1);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let (load, seen) = new_connections(port, stop.clone());
    sleep(Duration::from_millis(200));
    let ferry = ferry_replace(old.root, &["--drain-timeout", "20", "--exec", b, &p, "v2"]);
    let t = Instant::now();
    wait_for("a new connection answered by v2", Duration::from_secs(10), || {
        seen.lock().expect("seen").answers.last().is_some_and(|a| a.starts_with("v2 "))
    });
    // The listening socket is the new binary's alone; the old server
    // holds a quiet unix listener at its fd number.
    let listener = listener_inode(port).expect("a listener on the port");
    wait_for("the old server giving up the listener", Duration::from_secs(5), || {
        !socket_inodes(old.root).contains(&listener)
    });
    assert!(socket_inodes(old.root).len() >= 5, "the old server's fd 3 and 4 connections");
    // The old tree still serves the connections it had.
    for c in &mut kept {
        assert_eq!(c.ask().expect("old keeps answering"), v1);
    }
    sleep(Duration::from_millis(300));
    for c in &mut kept {
        assert_eq!(c.ask().expect("old keeps answering"), v1);
    }
    drop(kept);
    let out = finish(ferry, Duration::from_secs(30));
    let took = t.elapsed();
    stop.store(true, Ordering::Relaxed);
    load.join().expect("client thread");
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "ferry replace --exec failed: {stdout}{stderr}");
    let new = Tree::adopt(new_pid(&stdout), None);
    eprintln!("{stderr}{stdout}(ferry ran {took:?})");
    assert!(drained_s(&stdout) < 20.0 && !stdout.contains("cut at"), "{stdout}");
    assert!(stdout.contains("listeners taken over 1 (127.0.0.1:"), "{stdout}");
    assert!(old.wait_gone(Duration::from_secs(5)), "the old server did not end");
    let seen = seen.lock().expect("seen");
    assert!(seen.errors.is_empty(), "failed connections: {:?}", seen.errors);
    assert!(
        seen.slowest_connect < Duration::from_secs(1),
        "a SYN waited {:?}",
        seen.slowest_connect
    );
    let v2 = format!("v2 {}", new.root);
    let first = seen.answers.iter().position(|a| *a == v2).expect("v2 answered");
    assert!(first > 0, "the old server answered before the replacement");
    assert!(seen.answers[..first].iter().all(|a| *a == v1), "{:?}", &seen.answers[..first]);
    assert!(seen.answers[first..].iter().all(|a| *a == v2), "v1 answered after v2");
    eprintln!("{} new connections, slowest connect {:?}", seen.answers.len(), seen.slowest_connect);
    assert_eq!(Conn::open(port).expect("after").0.ask().expect("answer"), v2);
}

/// Connections still open when `--drain-timeout` passes are cut by the
/// old server's stop, and the line says how many.
#[test]
fn the_old_server_is_stopped_at_the_drain_timeout() {
    require_root!();
    let (dir, bin, port) = version_server("timeout");
    let (b, p) = (bin.to_str().expect("utf-8"), port.to_string());
    let old = Tree::start(&[b, &p, "v1"], "version_server", port, dir.path());
    let mut kept: Vec<Conn> = (0..2).map(|_| Conn::open(port).expect("keep-alive").0).collect();
    for c in &mut kept {
        assert!(c.ask().expect("old answers").starts_with("v1 "));
    }
    let t = Instant::now();
    let ferry = ferry_replace(old.root, &["--drain-timeout", "1", "--exec", b, &p, "v2"]);
    let out = finish(ferry, Duration::from_secs(20));
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "ferry replace --exec failed: {stdout}{stderr}");
    let _new = Tree::adopt(new_pid(&stdout), None);
    assert!(
        stdout.contains("(0 connections closed by their peers, 2 cut at the drain timeout)"),
        "{stdout}"
    );
    assert!(t.elapsed() < Duration::from_secs(8), "ferry took {:?}", t.elapsed());
    assert!(old.wait_gone(Duration::from_secs(5)), "the old server did not end");
    for c in &mut kept {
        assert!(c.ask().is_err(), "a connection of the stopped server still answers");
    }
    assert!(Conn::open(port).expect("new conn").0.ask().expect("answer").starts_with("v2 "));
}

/// A replacement that does not happen: ferry says why, and the old
/// server answers on its old connection and on new ones.
fn refused_and_untouched(tag: &str, exec: &[&str], expect: &str) {
    refused_and_untouched_with(tag, exec, expect, |_| {});
}

/// `during(other port)` runs while ferry does.
fn refused_and_untouched_with(tag: &str, exec: &[&str], expect: &str, during: impl FnOnce(u16)) {
    let (dir, bin, port) = version_server(tag);
    let (b, p) = (bin.to_str().expect("utf-8"), port.to_string());
    let old = Tree::start(&[b, &p, "v1"], "version_server", port, dir.path());
    let v1 = format!("v1 {}", old.root);
    let (mut kept, _) = Conn::open(port).expect("keep-alive");
    assert_eq!(kept.ask().expect("old answers"), v1);
    let other_port = ferry_testkit::free_port();
    let other = other_port.to_string();
    let exec: Vec<&str> = exec
        .iter()
        .map(|a| match *a {
            "PORT" => p.as_str(),
            "OTHER_PORT" => other.as_str(),
            "BIN" => b,
            _ => a,
        })
        .collect();
    let ferry = ferry_replace(old.root, &exec);
    during(other_port);
    let out = finish(ferry, Duration::from_secs(30));
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "ferry replace --exec succeeded: {}", text(&out.stdout));
    assert!(stderr.contains(expect), "{stderr}");
    assert!(stderr.contains("the old tree runs on untouched"), "{stderr}");
    assert!(stderr.lines().count() == 1, "not one line: {stderr}");
    assert_eq!(kept.ask().expect("old still answers"), v1);
    assert_eq!(Conn::open(port).expect("new conn").0.ask().expect("answer"), v1);
}

#[test]
fn a_binary_that_does_not_exist_is_refused() {
    require_root!();
    refused_and_untouched(
        "missing",
        &["--exec", "/nonexistent/ferry-new-server", "PORT"],
        "--exec /nonexistent/ferry-new-server: no such executable file",
    );
}

#[test]
fn a_binary_that_exits_at_once_is_refused() {
    require_root!();
    refused_and_untouched("exits", &["--exec", "/bin/false"], "exited before it bound 127.0.0.1:");
}

#[test]
fn a_binary_that_never_binds_the_address_is_killed_at_the_timeout() {
    require_root!();
    let before = count_named("sleep");
    refused_and_untouched(
        "nobind",
        &["--bind-timeout", "1", "--exec", "/bin/sleep", "30"],
        "did not bind 127.0.0.1:",
    );
    // ferry killed and reaped it.
    assert!(count_named("sleep") <= before);
}

/// Its bind of another port runs as usual (answered CONTINUE): the new
/// server listens there, never on the old address, and is killed.
#[test]
fn a_binary_that_binds_another_port_is_killed_at_the_timeout() {
    require_root!();
    refused_and_untouched_with(
        "otherport",
        &["--bind-timeout", "2", "--exec", "BIN", "OTHER_PORT", "v2"],
        "did not bind 127.0.0.1:",
        |other| {
            let mut answer = None;
            wait_for("the new server on the other port", Duration::from_secs(2), || {
                answer = Conn::open(other).ok().and_then(|(mut c, _)| c.ask().ok());
                answer.is_some()
            });
            assert!(answer.is_some_and(|a| a.starts_with("v2 ")));
        },
    );
}

fn count_named(name: &str) -> usize {
    let me = std::process::id() as i32;
    let Ok(dir) = std::fs::read_dir("/proc") else { return 0 };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&p| p != me && comm(p) == name && stat(p).is_some_and(|(_, pp)| pp != 1))
        .count()
}

/// An HTTP/1.1 GET of /v.txt on `s`; the body.
fn http_get(r: &mut BufReader<TcpStream>, close: bool) -> Result<String, String> {
    let conn = if close { "close" } else { "keep-alive" };
    let req = format!("GET /v.txt HTTP/1.1\r\nHost: t\r\nConnection: {conn}\r\n\r\n");
    r.get_mut().write_all(req.as_bytes()).map_err(|e| format!("write: {e}"))?;
    let mut len = None;
    let mut status = String::new();
    r.read_line(&mut status).map_err(|e| format!("status: {e}"))?;
    if !(status.starts_with("HTTP/1.") && status.contains(" 200 ")) {
        return Err(format!("status {status:?}"));
    }
    loop {
        let mut h = String::new();
        r.read_line(&mut h).map_err(|e| format!("header: {e}"))?;
        if h.trim().is_empty() {
            break;
        }
        if let Some(v) = h.to_ascii_lowercase().strip_prefix("content-length:") {
            len = v.trim().parse::<usize>().ok();
        }
    }
    let mut body = vec![0u8; len.ok_or("no content-length")?];
    r.read_exact(&mut body).map_err(|e| format!("body: {e}"))?;
    Ok(text(&body).trim().to_string())
}

/// `listen` holds the listen directives, PORT standing for the port.
fn nginx_conf(dir: &Path, port: u16, version: &str, listen: &str) -> String {
    let listen = listen.replace("PORT", &port.to_string());
    let d = dir.to_str().expect("utf-8");
    let www = dir.join(format!("www-{version}"));
    std::fs::create_dir_all(&www).expect("www");
    std::fs::write(www.join("v.txt"), format!("{version}\n")).expect("v.txt");
    let conf = format!(
        "daemon off;\nmaster_process on;\nworker_processes 2;\nuser root root;\n\
         pid {d}/nginx-{version}.pid;\nerror_log {d}/error.log notice;\n\
         events {{ worker_connections 1024; }}\n\
         http {{\n access_log off;\n keepalive_timeout 600s;\n keepalive_requests 1000000;\n\
         client_body_temp_path {d}/client_body;\n proxy_temp_path {d}/proxy;\n\
         fastcgi_temp_path {d}/fastcgi;\n uwsgi_temp_path {d}/uwsgi;\n scgi_temp_path {d}/scgi;\n\
         types {{ text/plain txt; }}\n default_type application/octet-stream;\n\
         server {{ {listen} root {}; location / {{ }} }}\n}}\n",
        www.display()
    );
    let path = dir.join(format!("nginx-{version}.conf"));
    std::fs::write(&path, conf).expect("nginx conf");
    path.to_str().expect("utf-8").to_string()
}

/// Keep-alive HTTP clients asking every 20 ms until stopped; each
/// returns the bodies it got or its first error.
fn keepalive_clients(
    port: u16,
    n: usize,
    stop: Arc<AtomicBool>,
) -> Vec<JoinHandle<Result<Vec<String>, String>>> {
    (0..n)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let (c, _) = Conn::open(port)?;
                let mut r = c.r;
                let mut got = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    got.push(http_get(&mut r, false)?);
                    sleep(Duration::from_millis(20));
                }
                Ok(got)
            })
        })
        .collect()
}

#[test]
fn nginx_is_replaced_by_a_new_nginx_under_clients() {
    require_root!();
    nginx_under_clients("nginx", "listen 127.0.0.1:PORT;", 1);
}

/// nginx with `reuseport` makes a listener per worker, all bound in the
/// master to the same address: the new master's binds claim them one by
/// one. The IPv6 listener is a third one.
#[test]
fn nginx_with_a_listener_per_worker_and_an_ipv6_one_is_replaced() {
    require_root!();
    nginx_under_clients("nginx-rp", "listen 127.0.0.1:PORT reuseport; listen [::1]:PORT;", 3);
}

/// The old nginx (master and 2 workers, `listen` its listen directives)
/// replaced by a new one under keep-alive clients and a client opening a
/// connection per request; `listeners` the number handed over.
fn nginx_under_clients(tag: &str, listen: &str, listeners: usize) {
    if !Path::new(NGINX).exists() {
        eprintln!("SKIPPED: {NGINX} is not installed (scripts/install-deps.sh)");
        return;
    }
    let dir = TempDir::new("ferry-replace-exec", tag);
    let port = ferry_testkit::free_port();
    let c1 = nginx_conf(dir.path(), port, "v1", listen);
    let c2 = nginx_conf(dir.path(), port, "v2", listen);
    let (pre, el) =
        (format!("{}/", dir.path().display()), format!("{}/error.log", dir.path().display()));
    let old = Tree::start(&[NGINX, "-p", &pre, "-c", &c1, "-e", &el], "nginx", port, dir.path());
    wait_for("two nginx workers", Duration::from_secs(10), || children_of(old.root).len() >= 2);
    let stop_kept = Arc::new(AtomicBool::new(false));
    let kept = keepalive_clients(port, 3, stop_kept.clone());
    let stop = Arc::new(AtomicBool::new(false));
    let (load, fresh) = fresh_gets(port, stop.clone());
    sleep(Duration::from_millis(300));
    let ferry = ferry_replace(
        old.root,
        &["--drain-timeout", "20", "--exec", NGINX, "-p", &pre, "-c", &c2, "-e", &el],
    );
    wait_for("a new connection served by the new nginx", Duration::from_secs(15), || {
        fresh.lock().expect("fresh").0.last().is_some_and(|b| b == "v2")
    });
    sleep(Duration::from_millis(300));
    stop_kept.store(true, Ordering::Relaxed);
    let kept: Vec<_> = kept.into_iter().map(|h| h.join().expect("client")).collect();
    let out = finish(ferry, Duration::from_secs(40));
    stop.store(true, Ordering::Relaxed);
    load.join().expect("load");
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "ferry replace --exec failed: {stdout}{stderr}");
    let _new = Tree::adopt(new_pid(&stdout), None);
    eprintln!("{stderr}{stdout}");
    for k in kept {
        let got = k.expect("a keep-alive client failed");
        assert!(got.iter().all(|b| b == "v1"), "a keep-alive connection changed server");
    }
    assert!(drained_s(&stdout) < 20.0 && !stdout.contains("cut at"), "{stdout}");
    assert!(old.wait_gone(Duration::from_secs(10)), "the old nginx did not end");
    let fresh = fresh.lock().expect("fresh");
    assert!(fresh.1.is_empty(), "failed requests: {:?}", fresh.1);
    let first = fresh.0.iter().position(|b| b == "v2").expect("v2");
    assert!(fresh.0[first..].iter().all(|b| b == "v2"), "v1 served after v2");
    eprintln!("{} requests on new connections, 0 failed", fresh.0.len());
    assert!(stdout.contains(&format!("listeners taken over {listeners} (")), "{stdout}");
    if listen.contains("[::1]") {
        let s = TcpStream::connect(("::1", port)).expect("connect to [::1]");
        s.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
        assert_eq!(http_get(&mut BufReader::new(s), true).expect("GET over IPv6"), "v2");
    }
}

/// A client thread doing one GET per new connection every 2 ms until
/// stopped: (bodies, errors).
type Fresh = Arc<Mutex<(Vec<String>, Vec<String>)>>;

fn fresh_gets(port: u16, stop: Arc<AtomicBool>) -> (JoinHandle<()>, Fresh) {
    let fresh: Fresh = Arc::default();
    let f = fresh.clone();
    let h = std::thread::spawn(move || {
        for _ in 0..20_000 {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            let got = Conn::open(port).and_then(|(c, _)| http_get(&mut { c.r }, true));
            let mut f = f.lock().expect("fresh");
            match got {
                Ok(body) => f.0.push(body),
                Err(e) => f.1.push(e),
            }
            drop(f);
            sleep(Duration::from_millis(2));
        }
    });
    (h, fresh)
}

#[test]
fn python_http_server_is_replaced_by_a_new_one_under_clients() {
    require_root!();
    let Some(python) =
        ["/usr/bin/python3", "/usr/local/bin/python3"].into_iter().find(|p| Path::new(p).exists())
    else {
        eprintln!("SKIPPED: no python3");
        return;
    };
    let dir = TempDir::new("ferry-replace-exec", "python");
    for v in ["v1", "v2"] {
        std::fs::create_dir(dir.path().join(v)).expect("dir");
        std::fs::write(dir.path().join(v).join("v.txt"), format!("{v}\n")).expect("v.txt");
    }
    let port = ferry_testkit::free_port();
    let p = port.to_string();
    let (d1, d2) = (format!("{}/v1", dir.path().display()), format!("{}/v2", dir.path().display()));
    let argv = [python, "-m", "http.server", "--bind", "127.0.0.1", "-d", &d1, &p];
    let old = Tree::start(&argv, "python3", port, dir.path());
    let stop = Arc::new(AtomicBool::new(false));
    let (load, fresh) = fresh_gets(port, stop.clone());
    sleep(Duration::from_millis(300));
    let exec = [
        "--drain-timeout",
        "20",
        "--exec",
        python,
        "-m",
        "http.server",
        "--bind",
        "127.0.0.1",
        "-d",
        &d2,
        &p,
    ];
    let out = finish(ferry_replace(old.root, &exec), Duration::from_secs(40));
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "ferry replace --exec failed: {stdout}{stderr}");
    let _new = Tree::adopt(new_pid(&stdout), None);
    eprintln!("{stderr}{stdout}");
    wait_for("a new connection served by the new server", Duration::from_secs(10), || {
        fresh.lock().expect("fresh").0.last().is_some_and(|b| b == "v2")
    });
    sleep(Duration::from_millis(200));
    stop.store(true, Ordering::Relaxed);
    load.join().expect("load");
    assert!(old.wait_gone(Duration::from_secs(10)), "the old server did not end");
    let fresh = fresh.lock().expect("fresh");
    assert!(fresh.1.is_empty(), "failed requests: {:?}", fresh.1);
    let first = fresh.0.iter().position(|b| b == "v2").expect("v2");
    assert!(first > 0 && fresh.0[first..].iter().all(|b| b == "v2"), "{:?}", fresh.0);
    eprintln!("{} requests on new connections, 0 failed", fresh.0.len());
}

/// A ferry killed during the drain (Ctrl-C, SIGKILL, the OOM killer)
/// cannot stop the old tree itself: its warden (`ferry-drain`, forked at
/// the drain's start, in a session of its own) stops it a little after
/// the drain timeout, and not before; with it a process the old tree
/// forked during the drain.
#[test]
fn a_ferry_killed_during_the_drain_leaves_the_old_tree_to_its_warden() {
    require_root!();
    let (dir, bin, port) = version_server("warden");
    let (b, p) = (bin.to_str().expect("utf-8"), port.to_string());
    let old = Tree::start(&[b, &p, "v1"], "version_server", port, dir.path());
    let mut kept = Conn::open(port).expect("keep-alive").0;
    assert!(kept.ask().expect("old answers").starts_with("v1 "));
    let mut ferry = ferry_replace(old.root, &["--drain-timeout", "1", "--exec", b, &p, "v2"]);
    let stderr = ferry.stderr.take().expect("ferry's stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let took_over = loop {
        let line = rx.recv_timeout(Duration::from_secs(20)).expect("no takeover line from ferry");
        if line.contains(" took over ") {
            break line;
        }
    };
    let new_pid: i32 = took_over
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no pid in {took_over:?}"));
    let _new = Tree::adopt(new_pid, None);
    // A process the old tree forks during the drain, after the warden was
    // armed: ferry's drain steps (50 ms) hand it to the warden too.
    let forked = kept.say("FORK").expect("the old server forks");
    let child: i32 = forked
        .strip_prefix("forked ")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no pid in {forked:?}"));
    let child = Tree::adopt(child, Some("version_server"));
    sleep(Duration::from_millis(300));
    let killed_at = Instant::now();
    let _ = ferry.kill();
    let _ = ferry.wait();
    // Orphaned, it came back to the test (a subreaper), to any thread;
    // it may not have named itself yet.
    let me = std::process::id() as i32;
    let find = || {
        std::fs::read_dir("/proc")
            .ok()?
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
            .find(|&p| comm(p) == "ferry-drain" && stat(p).is_some_and(|(_, pp)| pp == me))
    };
    let mut warden = find();
    while warden.is_none() && killed_at.elapsed() < Duration::from_secs(2) {
        sleep(Duration::from_millis(10));
        warden = find();
    }
    let warden = warden.expect("no ferry-drain process after ferry was killed");
    // ferry would have stopped it at 1 s; the warden waits 1 + 5 + 2 s.
    sleep(Duration::from_secs(3));
    assert!(alive(old.root), "the old tree was stopped before the warden's deadline");
    assert!(old.wait_gone(Duration::from_secs(12)), "the warden did not stop the old tree");
    let gone_after = killed_at.elapsed();
    assert!(gone_after >= Duration::from_secs(7), "stopped after {gone_after:?}");
    assert!(kept.ask().is_err(), "a connection of the stopped server still answers");
    assert!(
        child.wait_gone(Duration::from_secs(3)),
        "the process the old tree forked during the drain was not stopped"
    );
    let t = Instant::now();
    while stat(warden).is_some_and(|(s, _)| s != 'Z') && t.elapsed() < Duration::from_secs(5) {
        sleep(Duration::from_millis(20));
    }
    let state = stat(warden);
    assert!(
        ferry_testkit::try_reap(warden).is_some(),
        "the warden {warden} did not end: {state:?} {}",
        comm(warden)
    );
    assert!(Conn::open(port).expect("new conn").0.ask().expect("answer").starts_with("v2 "));
}
