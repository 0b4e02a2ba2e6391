//! `ferry replace` of real servers under load: redis, memcached, nginx
//! (master and workers) and PostgreSQL (postmaster and its background
//! processes), each replaced 20 times in a row while several clients keep
//! sending over TCP and check every reply.
//!
//! Each server runs in a session of its own with only fds 0-2, as a child
//! of the test process, which is a child subreaper: a thread per server
//! reaps every process of its tree it has seen (the root, killed by ferry,
//! and the other processes, orphaned by the kill and so this test's), so
//! their PIDs come free for the new tree. After each replacement every
//! process of the tree has the same PID and a new start time. The clients
//! count their requests; one failed request (an error, a wrong reply, a
//! closed connection) fails the test. Everything a test starts is killed
//! by PID (checked by name) on drop, also when it fails.

use ferry_testkit::{require_root, TempDir};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{sleep, JoinHandle};
use std::time::{Duration, Instant};

const FERRY: &str = env!("CARGO_BIN_EXE_ferry");
const REDIS: &str = "/usr/bin/redis-server";
const MEMCACHED: &str = "/usr/bin/memcached";
const NGINX: &str = "/usr/sbin/nginx";
const PG_BIN: &str = "/usr/lib/postgresql/15/bin";
const SETPRIV: &str = "/usr/bin/setpriv";
const ROUNDS: usize = 20;

fn missing(test: &str, programs: &[&str]) -> bool {
    for p in programs {
        if !Path::new(p).exists() {
            eprintln!("SKIPPED {test}: {p} is not installed (scripts/install-deps.sh)");
            return true;
        }
    }
    false
}

/// (state, start time) from /proc/PID/stat.
fn stat(pid: i32) -> Option<(char, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest: Vec<&str> = text[text.rfind(')')? + 1..].split_whitespace().collect();
    Some((rest.first()?.chars().next()?, rest.get(19)?.parse().ok()?))
}

fn alive(pid: i32) -> bool {
    stat(pid).is_some_and(|(s, _)| s != 'Z' && s != 'X')
}

fn children_of(pid: i32) -> Vec<i32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return Vec::new() };
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("children")).ok())
        .flat_map(|s| s.split_whitespace().filter_map(|n| n.parse().ok()).collect::<Vec<i32>>())
        .collect()
}

/// PID -> start time of `root` and all its descendants that run.
fn tree(root: i32) -> BTreeMap<i32, u64> {
    let mut out = BTreeMap::new();
    let mut todo = vec![root];
    while let Some(p) = todo.pop() {
        if let Some((s, t)) = stat(p) {
            if s != 'Z' && s != 'X' {
                out.insert(p, t);
                todo.extend(children_of(p));
            }
        }
    }
    out
}

fn comm(pid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default().trim().to_string()
}

/// A server tree started by a test. Its processes (every one seen) are
/// reaped by a thread, and killed by PID on drop if they still have the
/// name they had.
struct Server {
    root: i32,
    seen: Arc<Mutex<BTreeMap<i32, String>>>,
    stop: Arc<AtomicBool>,
    reaper: Option<JoinHandle<()>>,
    _dir: Arc<TempDir>,
}

impl Server {
    fn spawn(argv: &[&str], dir: Arc<TempDir>) -> Server {
        let root = ferry_testkit::spawn_detached(argv, dir.path());
        let seen = Arc::new(Mutex::new(BTreeMap::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (s, k) = (stop.clone(), seen.clone());
        let reaper = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let now = tree(root);
                let mut seen = k.lock().expect("seen");
                // The name as it is now: the root's changes at its exec.
                for &p in now.keys() {
                    seen.insert(p, comm(p));
                }
                for &p in seen.keys() {
                    let _ = ferry_testkit::try_reap(p);
                }
                drop(seen);
                sleep(Duration::from_millis(1));
            }
        });
        Server { root, seen, stop, reaper: Some(reaper), _dir: dir }
    }

    /// Waits until `ready` holds and the tree has `procs` processes.
    fn settle(&self, procs: usize, ready: impl Fn() -> bool) {
        let t = Instant::now();
        loop {
            assert!(alive(self.root), "the server {} exited", self.root);
            if tree(self.root).len() >= procs && ready() {
                return;
            }
            assert!(t.elapsed() < Duration::from_secs(30), "the server is not ready");
            sleep(Duration::from_millis(50));
        }
    }

    /// Replaces the tree `ROUNDS` times; after each, the same PIDs, every
    /// process new. Returns ferry's lines.
    fn replace_rounds(&self, load: &Load) -> Vec<String> {
        let mut lines = Vec::new();
        for i in 0..ROUNDS {
            let before = tree(self.root);
            // Start times count in clock ticks (10 ms).
            sleep(Duration::from_millis(20));
            let out = Command::new(FERRY)
                .args(["replace", "--pid", &self.root.to_string()])
                .output()
                .expect("running ferry replace");
            let said = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(out.status.success(), "replacement {i} failed: {said}");
            let after = tree(self.root);
            assert_eq!(
                before.keys().collect::<Vec<_>>(),
                after.keys().collect::<Vec<_>>(),
                "replacement {i}: not the same PIDs: {said}"
            );
            for (p, t) in &before {
                assert_ne!(after[p], *t, "replacement {i}: pid {p} is the old process: {said}");
            }
            load.check(i, &said);
            lines.push(said.trim().to_string());
        }
        lines
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let seen = self.seen.lock().map(|s| s.clone()).unwrap_or_default();
        for (p, name) in &seen {
            if alive(*p) && comm(*p) == *name {
                ferry_testkit::kill(*p, libc::SIGKILL);
            }
        }
        let t = Instant::now();
        while seen.keys().any(|&p| stat(p).is_some()) && t.elapsed() < Duration::from_secs(5) {
            sleep(Duration::from_millis(5));
        }
        self.stop.store(true, Ordering::Relaxed);
        if let Some(r) = self.reaper.take() {
            let _ = r.join();
        }
    }
}

type Step = Box<dyn FnMut() -> Result<(), String> + Send>;

/// Client threads, each running its step until stopped; the first failed
/// request stops that client with its error.
struct Load {
    stop: Arc<AtomicBool>,
    /// Requests answered, per client.
    done: Vec<Arc<AtomicU64>>,
    threads: Vec<JoinHandle<Result<u64, String>>>,
}

impl Load {
    fn start(steps: Vec<Step>) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let done: Vec<Arc<AtomicU64>> = steps.iter().map(|_| Arc::new(AtomicU64::new(0))).collect();
        let threads = steps
            .into_iter()
            .zip(&done)
            .map(|(mut step, d)| {
                let (s, d) = (stop.clone(), d.clone());
                std::thread::spawn(move || {
                    let mut n = 0u64;
                    while !s.load(Ordering::Relaxed) {
                        step().map_err(|e| format!("after {n} requests: {e}"))?;
                        n += 1;
                        d.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(n)
                })
            })
            .collect();
        Load { stop, done, threads }
    }

    /// Every client still running and answered again after the
    /// replacement.
    fn check(&self, round: usize, said: &str) {
        let was: Vec<u64> = self.done.iter().map(|d| d.load(Ordering::Relaxed)).collect();
        let t = Instant::now();
        while self.done.iter().zip(&was).any(|(d, w)| d.load(Ordering::Relaxed) <= *w) {
            assert!(
                !self.threads.iter().any(|t| t.is_finished()),
                "a client stopped at replacement {round}: {said}"
            );
            assert!(t.elapsed() < Duration::from_secs(10), "no request after {round}: {said}");
            sleep(Duration::from_millis(1));
        }
    }

    /// Stops the clients; every request of every one was right.
    fn finish(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        let mut total = 0;
        for (i, t) in self.threads.into_iter().enumerate() {
            let n = t.join().expect("client thread").unwrap_or_else(|e| panic!("client {i}: {e}"));
            assert!(n > 0, "client {i} sent nothing");
            total += n;
        }
        total
    }
}

fn connect(port: u16) -> TcpStream {
    let s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    s.set_nodelay(true).expect("nodelay");
    s
}

/// A connection whose replies are read line by line.
struct Lines {
    w: TcpStream,
    r: BufReader<TcpStream>,
}

impl Lines {
    fn new(port: u16) -> Lines {
        let w = connect(port);
        let r = BufReader::new(w.try_clone().expect("clone"));
        Lines { w, r }
    }

    fn send(&mut self, req: &str) -> Result<(), String> {
        self.w.write_all(req.as_bytes()).map_err(|e| format!("send: {e}"))
    }

    fn line(&mut self) -> Result<String, String> {
        let mut l = String::new();
        match self.r.read_line(&mut l) {
            Ok(0) => Err("connection closed".into()),
            Ok(_) => Ok(l.trim_end().to_string()),
            Err(e) => Err(format!("read: {e}")),
        }
    }
}

fn report(test: &str, lines: &[String], total: u64, t: Instant) {
    let pauses: Vec<f64> = lines
        .iter()
        .filter_map(|l| l.split("pause ").nth(1)?.split(' ').next()?.parse().ok())
        .collect();
    let max = pauses.iter().cloned().fold(0.0, f64::max);
    eprintln!(
        "[{test}] {ROUNDS} replacements, {total} requests right, pause max {max} ms, {:?}",
        t.elapsed()
    );
}

#[test]
fn redis_under_8_clients_is_replaced_20_times() {
    require_root!();
    if missing("redis", &[REDIS]) {
        return;
    }
    let t = Instant::now();
    let dir = Arc::new(TempDir::new("ferry-replace-srv", "redis"));
    let port = ferry_testkit::free_port();
    let (p, d) = (port.to_string(), dir.path().to_str().expect("utf-8").to_string());
    let argv = [
        REDIS,
        "--port",
        &p,
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--dir",
        &d,
    ];
    let srv = Server::spawn(&argv, dir.clone());
    srv.settle(1, || TcpStream::connect(("127.0.0.1", port)).is_ok());
    let counts: Vec<Arc<AtomicU64>> = (0..8).map(|_| Arc::new(AtomicU64::new(0))).collect();
    let steps = counts
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let (mut conn, c) = (Lines::new(port), c.clone());
            Box::new(move || {
                conn.send(&format!("INCR ferry{i}\r\n"))?;
                let r = conn.line()?;
                let want = c.load(Ordering::Relaxed) + 1;
                if r != format!(":{want}") {
                    return Err(format!("INCR ferry{i}: {r:?}, not :{want}"));
                }
                c.store(want, Ordering::Relaxed);
                Ok(())
            }) as Step
        })
        .collect();
    let load = Load::start(steps);
    sleep(Duration::from_millis(200));
    let lines = srv.replace_rounds(&load);
    let total = load.finish();
    // Every INCR counted once: the keys hold what each client counted.
    let mut check = Lines::new(port);
    for (i, c) in counts.iter().enumerate() {
        check.send(&format!("GET ferry{i}\r\n")).expect("GET");
        let _len = check.line().expect("GET's length");
        assert_eq!(check.line().expect("GET's value"), c.load(Ordering::Relaxed).to_string());
    }
    report("redis", &lines, total, t);
}

#[test]
fn memcached_under_6_clients_is_replaced_20_times() {
    require_root!();
    if missing("memcached", &[MEMCACHED]) {
        return;
    }
    let t = Instant::now();
    let dir = Arc::new(TempDir::new("ferry-replace-srv", "memcached"));
    let port = ferry_testkit::free_port();
    let p = port.to_string();
    let argv = [MEMCACHED, "-u", "nobody", "-t", "4", "-l", "127.0.0.1", "-p", &p, "-U", "0"];
    let srv = Server::spawn(&argv, dir.clone());
    srv.settle(1, || TcpStream::connect(("127.0.0.1", port)).is_ok());
    let steps = (0..6)
        .map(|i| {
            let mut conn = Lines::new(port);
            let mut n = 0u64;
            Box::new(move || {
                // set a value, read it back, count it with incr.
                let val = format!("v{i}-{n}");
                conn.send(&format!("set key{i} 0 0 {}\r\n{val}\r\n", val.len()))?;
                expect(&conn.line()?, "STORED")?;
                conn.send(&format!("get key{i}\r\n"))?;
                expect(&conn.line()?, &format!("VALUE key{i} 0 {}", val.len()))?;
                expect(&conn.line()?, &val)?;
                expect(&conn.line()?, "END")?;
                if n == 0 {
                    conn.send(&format!("set count{i} 0 0 1\r\n0\r\n"))?;
                    expect(&conn.line()?, "STORED")?;
                }
                n += 1;
                conn.send(&format!("incr count{i} 1\r\n"))?;
                expect(&conn.line()?, &n.to_string())
            }) as Step
        })
        .collect();
    let load = Load::start(steps);
    sleep(Duration::from_millis(200));
    let lines = srv.replace_rounds(&load);
    let total = load.finish();
    report("memcached", &lines, total, t);
}

fn expect(got: &str, want: &str) -> Result<(), String> {
    if got == want {
        Ok(())
    } else {
        Err(format!("reply {got:?}, not {want:?}"))
    }
}

/// Reads one HTTP/1.1 response with a Content-Length; returns its body.
fn http_get(conn: &mut Lines, path: &str) -> Result<Vec<u8>, String> {
    conn.send(&format!("GET {path} HTTP/1.1\r\nHost: ferry\r\n\r\n"))?;
    let status = conn.line()?;
    if !status.starts_with("HTTP/1.1 200") {
        return Err(format!("status {status:?}"));
    }
    let mut len = None;
    loop {
        let h = conn.line()?;
        if h.is_empty() {
            break;
        }
        if let Some(v) = h.to_ascii_lowercase().strip_prefix("content-length:") {
            len = v.trim().parse::<usize>().ok();
        }
    }
    let mut body = vec![0u8; len.ok_or("no Content-Length")?];
    conn.r.read_exact(&mut body).map_err(|e| format!("body: {e}"))?;
    Ok(body)
}

#[test]
fn nginx_master_and_workers_under_6_keepalive_clients_are_replaced_20_times() {
    require_root!();
    if missing("nginx", &[NGINX]) {
        return;
    }
    let t = Instant::now();
    let dir = Arc::new(TempDir::new("ferry-replace-srv", "nginx"));
    let d = dir.path().to_str().expect("utf-8").to_string();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let www = dir.path().join("www");
    std::fs::create_dir(&www).expect("www");
    std::fs::set_permissions(&www, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let body: Vec<u8> =
        (0..2000).flat_map(|i| format!("ferry replace line {i:05}\n").into_bytes()).collect();
    std::fs::write(www.join("ferry.txt"), &body).expect("write");
    std::fs::set_permissions(www.join("ferry.txt"), std::fs::Permissions::from_mode(0o644))
        .expect("chmod");
    let port = ferry_testkit::free_port();
    let conf = format!(
        "daemon off;\nmaster_process on;\nworker_processes 2;\nuser nobody nogroup;\n\
         pid {d}/nginx.pid;\nerror_log {d}/error.log notice;\n\
         events {{ worker_connections 1024; }}\n\
         http {{\n access_log off;\n keepalive_timeout 600s;\n keepalive_requests 1000000;\n\
         client_body_temp_path {d}/client_body;\n proxy_temp_path {d}/proxy;\n\
         fastcgi_temp_path {d}/fastcgi;\n uwsgi_temp_path {d}/uwsgi;\n scgi_temp_path {d}/scgi;\n\
         types {{ text/plain txt; }}\n default_type application/octet-stream;\n\
         server {{ listen 127.0.0.1:{port}; root {d}/www; location / {{ }} }}\n}}\n"
    );
    std::fs::write(dir.path().join("nginx.conf"), conf).expect("nginx.conf");
    let (pre, cf, el) = (format!("{d}/"), format!("{d}/nginx.conf"), format!("{d}/error.log"));
    let srv = Server::spawn(&[NGINX, "-p", &pre, "-c", &cf, "-e", &el], dir.clone());
    srv.settle(3, || TcpStream::connect(("127.0.0.1", port)).is_ok());
    let body = Arc::new(body);
    let steps = (0..6)
        .map(|_| {
            let (mut conn, body) = (Lines::new(port), body.clone());
            Box::new(move || {
                let got = http_get(&mut conn, "/ferry.txt")?;
                if got != *body {
                    return Err(format!("a body of {} bytes, not the file", got.len()));
                }
                Ok(())
            }) as Step
        })
        .collect();
    let load = Load::start(steps);
    sleep(Duration::from_millis(200));
    let lines = srv.replace_rounds(&load);
    // The listener of the new tree takes new connections too.
    let mut fresh = Lines::new(port);
    assert_eq!(http_get(&mut fresh, "/ferry.txt").expect("a new connection"), *body);
    let total = load.finish();
    report("nginx", &lines, total, t);
}

/// A PostgreSQL connection speaking the frontend protocol's simple query
/// (trust authentication, no TLS).
struct Pg {
    s: TcpStream,
}

impl Pg {
    fn connect(port: u16) -> Result<Pg, String> {
        let s = TcpStream::connect(("127.0.0.1", port)).map_err(|e| format!("connect: {e}"))?;
        s.set_read_timeout(Some(Duration::from_secs(10))).map_err(|e| e.to_string())?;
        s.set_nodelay(true).map_err(|e| e.to_string())?;
        let mut pg = Pg { s };
        let params = b"user\0postgres\0database\0postgres\0\0";
        let mut msg = ((8 + params.len()) as u32).to_be_bytes().to_vec();
        msg.extend_from_slice(&196608u32.to_be_bytes());
        msg.extend_from_slice(params);
        pg.s.write_all(&msg).map_err(|e| format!("startup: {e}"))?;
        pg.until_ready()?;
        Ok(pg)
    }

    fn message(&mut self) -> Result<(u8, Vec<u8>), String> {
        let mut head = [0u8; 5];
        self.s.read_exact(&mut head).map_err(|e| format!("read: {e}"))?;
        let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
        let mut body = vec![0u8; len.saturating_sub(4)];
        self.s.read_exact(&mut body).map_err(|e| format!("read: {e}"))?;
        Ok((head[0], body))
    }

    /// The first column of every row, up to ReadyForQuery; an error
    /// response is an error.
    fn until_ready(&mut self) -> Result<Vec<String>, String> {
        let mut rows = Vec::new();
        let mut error = None;
        loop {
            let (kind, body) = self.message()?;
            match kind {
                b'Z' => break,
                b'E' => error = Some(String::from_utf8_lossy(&body).replace('\0', " ")),
                b'R' if body.get(..4) != Some(&[0, 0, 0, 0]) => {
                    return Err(format!("authentication asked: {body:?}"))
                }
                b'D' if body.len() >= 6 => {
                    let len = i32::from_be_bytes([body[2], body[3], body[4], body[5]]);
                    let end = 6 + len.max(0) as usize;
                    rows.push(String::from_utf8_lossy(body.get(6..end).unwrap_or(&[])).into());
                }
                _ => {}
            }
        }
        error.map_or(Ok(rows), Err)
    }

    fn query(&mut self, sql: &str) -> Result<Vec<String>, String> {
        let mut msg = vec![b'Q'];
        msg.extend_from_slice(&((4 + sql.len() + 1) as u32).to_be_bytes());
        msg.extend_from_slice(sql.as_bytes());
        msg.push(0);
        self.s.write_all(&msg).map_err(|e| format!("query: {e}"))?;
        self.until_ready()
    }
}

#[test]
fn postgres_over_tcp_under_4_clients_in_transactions_is_replaced_20_times() {
    require_root!();
    let (postgres, initdb) = (format!("{PG_BIN}/postgres"), format!("{PG_BIN}/initdb"));
    if missing("postgres", &[&postgres, &initdb, SETPRIV]) {
        return;
    }
    let Some((uid, gid)) = postgres_ids() else {
        eprintln!("SKIPPED postgres: no user postgres (scripts/install-deps.sh)");
        return;
    };
    let t = Instant::now();
    let dir = Arc::new(TempDir::new("ferry-replace-srv", "postgres"));
    let data = dir.path().join("data");
    std::fs::create_dir(&data).expect("data");
    std::os::unix::fs::chown(&data, Some(uid), Some(gid)).expect("chown");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    let data_s = data.to_str().expect("utf-8").to_string();
    let out = Command::new(SETPRIV)
        .args(["--reuid=postgres", "--regid=postgres", "--init-groups", "--", &initdb, "-D"])
        .args([&data_s, "-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8", "--locale=C"])
        .current_dir(dir.path())
        .env("LC_ALL", "C")
        .stdin(Stdio::null())
        .output()
        .expect("initdb");
    assert!(out.status.success(), "initdb: {}", String::from_utf8_lossy(&out.stderr));
    let port = ferry_testkit::free_port();
    let p = port.to_string();
    default_socket_is_carried_or_refused_rebuilt(&postgres, &data_s, dir.clone(), port);
    // No unix socket: one bound to a path has no trial restore and is
    // refused (above); over TCP only, nothing is.
    let argv = [
        SETPRIV,
        "--reuid=postgres",
        "--regid=postgres",
        "--init-groups",
        "--",
        &postgres,
        "-D",
        &data_s,
        "-p",
        &p,
        "-c",
        "listen_addresses=127.0.0.1",
        "-c",
        "unix_socket_directories=",
    ];
    // Dropped after `srv`: what a postgres killed on a failure leaves.
    let mut ipc = PgIpc::default();
    let srv = Server::spawn(&argv, dir.clone());
    // The postmaster and its 5 background processes.
    srv.settle(6, || Pg::connect(port).is_ok());
    ipc.note(&data, srv.root);
    let mut setup = Pg::connect(port).expect("connect");
    setup
        .query("create table ferry(id int primary key, v bigint not null, n bigint not null);")
        .expect("create");
    setup.query("insert into ferry select i, 0, 0 from generate_series(0, 3) i;").expect("insert");
    let steps = (0..4)
        .map(|i| {
            let mut pg = Pg::connect(port).expect("connect");
            let mut last = 0u64;
            Box::new(move || {
                let rows = pg.query(&format!(
                    "begin; update ferry set v = v + 1 where id = {i}; \
                     update ferry set n = n + 1 where id = {i} returning v, n; commit;"
                ))?;
                // returning gives v as the first column: the count so far.
                let v: u64 = rows.first().and_then(|v| v.parse().ok()).ok_or("no row")?;
                if v != last + 1 {
                    return Err(format!("row {i} went from {last} to {v}"));
                }
                last = v;
                Ok(())
            }) as Step
        })
        .collect();
    let load = Load::start(steps);
    sleep(Duration::from_millis(300));
    let lines = srv.replace_rounds(&load);
    let total = load.finish();
    // Both updates of each transaction, or neither.
    let both = setup.query("select bool_and(v = n) from ferry");
    assert_eq!(both.expect("the old connection"), ["t"]);
    let v = setup.query("select sum(v) from ferry").expect("sum");
    assert_eq!(v, [total.to_string()], "not every transaction counted once");
    drop(setup);
    fast_shutdown(srv.root);
    report("postgres", &lines, total, t);
}

/// A fast shutdown (SIGINT), which removes postgres's shared memory.
fn fast_shutdown(root: i32) {
    ferry_testkit::kill(root, libc::SIGINT);
    let t = Instant::now();
    while alive(root) {
        assert!(t.elapsed() < Duration::from_secs(30), "postgres does not stop");
        sleep(Duration::from_millis(20));
    }
}

/// The SysV segment (its key in postmaster.pid) and the /dev/shm files
/// of one postgres, removed when dropped if postgres left them (killed
/// on a failure) and nothing is attached any more.
#[derive(Default)]
struct PgIpc {
    key: Option<i64>,
    dev_shm: Vec<std::path::PathBuf>,
}

impl PgIpc {
    /// Records the key in postmaster.pid (line 7) and the /dev/shm files
    /// the postmaster maps.
    fn note(&mut self, data: &Path, postmaster: i32) {
        let pidfile = std::fs::read_to_string(data.join("postmaster.pid")).unwrap_or_default();
        self.key = pidfile.lines().nth(6).and_then(|l| l.split_whitespace().next()?.parse().ok());
        let maps = std::fs::read_to_string(format!("/proc/{postmaster}/maps")).unwrap_or_default();
        self.dev_shm = maps
            .lines()
            .filter_map(|l| Some(l[l.find("/dev/shm/PostgreSQL.")?..].trim().into()))
            .collect();
        self.dev_shm.sort();
        self.dev_shm.dedup();
    }
}

impl Drop for PgIpc {
    fn drop(&mut self) {
        for f in &self.dev_shm {
            let _ = std::fs::remove_file(f);
        }
        let Some(key) = self.key.filter(|k| *k != 0) else { return };
        let text = std::fs::read_to_string("/proc/sysvipc/shm").unwrap_or_default();
        for f in text.lines().skip(1).map(|l| l.split_whitespace().collect::<Vec<_>>()) {
            let (Some(k), Some(id), Some(nattch)) = (f.first(), f.get(1), f.get(6)) else {
                continue;
            };
            if k.parse::<i64>().ok() == Some(key) && *nattch == "0" {
                let _ = Command::new("ipcrm").args(["-m", id]).status();
            }
        }
    }
}

/// PostgreSQL with its unix socket as well (its default): with
/// `--rebuild-files` refused in the freeze, naming the socket (a trial
/// would bind its path again), and serves on; by default the socket is
/// carried over, the same socket, and the tree is replaced, its old
/// connection served by the new postmaster's backend; then it is shut
/// down.
fn default_socket_is_carried_or_refused_rebuilt(
    postgres: &str,
    data: &str,
    dir: Arc<TempDir>,
    port: u16,
) {
    let sock = dir.path().join("sock");
    std::fs::create_dir(&sock).expect("sock");
    let (uid, gid) = postgres_ids().expect("user postgres");
    std::os::unix::fs::chown(&sock, Some(uid), Some(gid)).expect("chown");
    let (p, sd) = (port.to_string(), format!("unix_socket_directories={}", sock.display()));
    let argv = [SETPRIV, "--reuid=postgres", "--regid=postgres", "--init-groups", "--", postgres];
    let mut argv = argv.to_vec();
    argv.extend(["-D", data, "-p", &p, "-c", "listen_addresses=127.0.0.1", "-c", &sd]);
    let mut ipc = PgIpc::default();
    let srv = Server::spawn(&argv, dir);
    srv.settle(6, || Pg::connect(port).is_ok());
    ipc.note(Path::new(data), srv.root);
    let mut pg = Pg::connect(port).expect("connect");
    let before = tree(srv.root);
    let out = Command::new(FERRY)
        .args(["replace", "--rebuild-files", "--pid", &srv.root.to_string()])
        .output()
        .expect("running ferry replace");
    let said = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success(), "replaced with its unix socket rebuilt: {said}");
    let name = format!("unix socket bound to {}/.s.PGSQL.{port}", sock.display());
    assert!(said.contains(&name), "the refusal does not name {name}: {said}");
    assert!(said.contains("the old tree runs on untouched"), "{said}");
    // Backends come and go; the postmaster and its 5 background processes
    // run on, the same processes.
    let after = tree(srv.root);
    let kept = before.iter().filter(|(p, t)| after.get(p) == Some(t)).count();
    assert!(kept >= 6, "{kept} of {before:?} run on in {after:?}: {said}");
    assert_eq!(after.get(&srv.root), before.get(&srv.root), "the postmaster changed: {said}");
    assert_eq!(pg.query("select 41 + 1").expect("the old connection"), ["42"]);
    let out = Command::new(FERRY)
        .args(["replace", "--pid", &srv.root.to_string()])
        .output()
        .expect("running ferry replace");
    let said =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "not replaced with its unix socket carried: {said}");
    assert!(said.contains("files carried, 0 TCP connections repaired"), "{said}");
    let socket = sock.join(format!(".s.PGSQL.{port}"));
    assert!(socket.exists(), "{} is gone: {said}", socket.display());
    assert_eq!(pg.query("select 40 + 2").expect("the old connection, replaced"), ["42"]);
    drop(pg);
    // The data directory is used again next.
    fast_shutdown(srv.root);
}

fn postgres_ids() -> Option<(u32, u32)> {
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    let f: Vec<&str> = passwd.lines().find(|l| l.starts_with("postgres:"))?.split(':').collect();
    Some((f.get(2)?.parse().ok()?, f.get(3)?.parse().ok()?))
}
