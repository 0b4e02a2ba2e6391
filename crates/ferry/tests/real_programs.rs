//! End-to-end tests against real, unmodified programs: Debian's python3,
//! redis-server (multi-threaded) and memcached (multi-threaded).
//!
//! Each test starts the program as its own child (in a new session), gives it
//! state, runs `ferry checkpoint` (which kills it), reaps it so its PID is free
//! again, runs `ferry restore` with a pidfile, and checks that every bit of
//! state came back. Tests skip (with a message) when not run as root or when
//! the program is not installed (`scripts/install-deps.sh` installs them).
//!
//! Every wait is bounded, and guards kill (by PID: only what the test started
//! or restored) and reap everything and remove the temporary directory, also
//! when a test fails.

use ferry_testkit::is_root;
use ferry_testkit::TempDir;
use std::fs::{self, File};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

const FERRY: &str = env!("CARGO_BIN_EXE_ferry");

const START_TIMEOUT: Duration = Duration::from_secs(30);
const FERRY_TIMEOUT: Duration = Duration::from_secs(60);
const REAP_TIMEOUT: Duration = Duration::from_secs(30);
const PIDFILE_TIMEOUT: Duration = Duration::from_secs(60);
const EXIT_TIMEOUT: Duration = Duration::from_secs(30);
const IO_TIMEOUT: Duration = Duration::from_secs(20);

// ---------------------------------------------------------------------------
// Skipping

/// Returns the program's path, or None (after printing why) if the test must
/// be skipped.
fn prerequisites(test: &str, program: &str) -> Option<PathBuf> {
    if !is_root() {
        eprintln!("SKIPPED {test}: needs root (ptrace and same-PID restore)");
        return None;
    }
    let path = PathBuf::from(program);
    let executable = fs::metadata(&path)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false);
    if !executable {
        eprintln!("SKIPPED {test}: {program} is not installed (run scripts/install-deps.sh)");
        return None;
    }
    Some(path)
}

// ---------------------------------------------------------------------------
// Temporary directory

// ---------------------------------------------------------------------------
// Process helpers

fn wait_timeout(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) => {}
            Err(_) => return None,
        }
        if Instant::now() >= deadline {
            return None;
        }
        sleep(Duration::from_millis(20));
    }
}

fn kill_pid(pid: i32, sig: libc::c_int) {
    if pid > 0 {
        // A pid this test started or restored.
        ferry_testkit::kill(pid, sig);
    }
}

fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(c), _) => format!("exit code {c}"),
        (_, Some(s)) => format!("killed by signal {s}"),
        _ => format!("{status:?}"),
    }
}

fn read_lossy(path: &Path) -> String {
    fs::read(path).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default()
}

/// One test's processes: the original program (our child), the `ferry
/// restore` process (our child) and the restored program (its child).
/// Dropping it kills and reaps all of them and removes the temp dir.
struct Run {
    name: String,
    dir: TempDir,
    original: Option<Child>,
    original_pid: i32,
    restore: Option<Child>,
    restored_pid: Option<i32>,
}

impl Run {
    fn new(test: &str) -> Run {
        Run {
            name: test.to_string(),
            dir: TempDir::new("ferry-real", test),
            original: None,
            original_pid: 0,
            restore: None,
            restored_pid: None,
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn images(&self) -> PathBuf {
        self.path("images")
    }

    /// Starts the program in a new session with stdout+stderr going to
    /// `<dir>/program.log`.
    fn start(&mut self, program: &Path, args: &[&str]) -> i32 {
        let log = File::create(self.path("program.log")).expect("create program log");
        let log2 = log.try_clone().expect("clone log fd");
        let mut cmd = Command::new(program);
        cmd.args(args).current_dir(self.dir.path()).stdin(Stdio::null()).stdout(log).stderr(log2);
        // The program gets its own session and process group, so its
        // image refers to none of ours, and only stdin/stdout/stderr: a
        // descriptor inherited from whatever runs the tests would become
        // part of the image.
        ferry_testkit::own_session(&mut cmd);
        let child =
            cmd.spawn().unwrap_or_else(|e| panic!("[{}] spawn {program:?}: {e}", self.name));
        self.original_pid = child.id() as i32;
        self.original = Some(child);
        eprintln!("[{}] started {program:?} as PID {}", self.name, self.original_pid);
        self.original_pid
    }

    fn program_log(&self) -> String {
        read_lossy(&self.path("program.log"))
    }

    /// Panics (with the program's log) if the original program has exited.
    fn assert_original_alive(&mut self) {
        if let Some(child) = self.original.as_mut() {
            if let Ok(Some(status)) = child.try_wait() {
                let log = self.program_log();
                self.original = None;
                panic!("[{}] program exited early ({}); log:\n{log}", self.name, describe(status));
            }
        }
    }

    /// Runs `ferry ARGS` to completion (bounded), returning status and output.
    fn ferry(&self, tag: &str, args: &[&str]) -> (ExitStatus, String, String) {
        let out_path = self.path(&format!("ferry-{tag}.stdout"));
        let err_path = self.path(&format!("ferry-{tag}.stderr"));
        let mut child = Command::new(FERRY)
            .args(args)
            .stdin(Stdio::null())
            .stdout(File::create(&out_path).expect("create stdout file"))
            .stderr(File::create(&err_path).expect("create stderr file"))
            .spawn()
            .unwrap_or_else(|e| panic!("[{}] spawn {FERRY}: {e}", self.name));
        let status = match wait_timeout(&mut child, FERRY_TIMEOUT) {
            Some(s) => s,
            None => {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "[{}] `ferry {}` did not finish within {:?}; stderr:\n{}",
                    self.name,
                    args.join(" "),
                    FERRY_TIMEOUT,
                    read_lossy(&err_path)
                );
            }
        };
        (status, read_lossy(&out_path), read_lossy(&err_path))
    }

    /// `ferry checkpoint`, then reap the original program (which ferry killed).
    fn checkpoint(&mut self) {
        let images = self.images();
        fs::create_dir_all(&images).expect("create images dir");
        let pid = self.original_pid.to_string();
        let t0 = Instant::now();
        let (status, _out, err) = self.ferry(
            "checkpoint",
            &["checkpoint", "--pid", &pid, "--images", images.to_str().unwrap()],
        );
        assert!(
            status.success(),
            "[{}] ferry checkpoint --pid {pid} failed ({}): {}",
            self.name,
            describe(status),
            err.trim()
        );
        eprintln!("[{}] checkpoint took {:?}", self.name, t0.elapsed());

        let mut child = self.original.take().expect("original child");
        match wait_timeout(&mut child, REAP_TIMEOUT) {
            Some(status) => {
                eprintln!(
                    "[{}] reaped the checkpointed PID {pid} ({})",
                    self.name,
                    describe(status)
                )
            }
            None => {
                self.original = Some(child);
                panic!(
                    "[{}] ferry checkpoint succeeded but PID {pid} still runs after {:?}",
                    self.name, REAP_TIMEOUT
                );
            }
        }
    }

    /// `ferry restore --pidfile` in the background; returns the restored PID
    /// once the pidfile appears.
    fn restore(&mut self) -> i32 {
        let images = self.images();
        let pidfile = self.path("restored.pid");
        let out_path = self.path("ferry-restore.stdout");
        let err_path = self.path("ferry-restore.stderr");
        let t0 = Instant::now();
        let child = Command::new(FERRY)
            .args([
                "restore",
                "--images",
                images.to_str().unwrap(),
                "--pidfile",
                pidfile.to_str().unwrap(),
            ])
            .stdin(Stdio::null())
            .stdout(File::create(&out_path).expect("create stdout file"))
            .stderr(File::create(&err_path).expect("create stderr file"))
            .spawn()
            .unwrap_or_else(|e| panic!("[{}] spawn ferry restore: {e}", self.name));
        self.restore = Some(child);

        let deadline = Instant::now() + PIDFILE_TIMEOUT;
        let pid = loop {
            if let Some(pid) = read_pidfile(&pidfile) {
                break pid;
            }
            let restore = self.restore.as_mut().unwrap();
            if let Ok(Some(status)) = restore.try_wait() {
                self.restore = None;
                panic!(
                    "[{}] ferry restore exited ({}) before writing the pidfile: {}",
                    self.name,
                    describe(status),
                    read_lossy(&err_path).trim()
                );
            }
            if Instant::now() >= deadline {
                panic!(
                    "[{}] no pidfile from ferry restore within {:?}; stderr: {}",
                    self.name,
                    PIDFILE_TIMEOUT,
                    read_lossy(&err_path).trim()
                );
            }
            sleep(Duration::from_millis(20));
        };
        self.restored_pid = Some(pid);
        eprintln!("[{}] restored as PID {pid} in {:?}", self.name, t0.elapsed());
        assert_eq!(
            pid, self.original_pid,
            "[{}] restored PID differs from the original",
            self.name
        );
        pid
    }

    /// Waits (bounded) for `ferry restore` to exit after the restored program
    /// stopped, and returns its exit status.
    fn wait_restore_exit(&mut self) -> ExitStatus {
        let mut child = self.restore.take().expect("ferry restore child");
        match wait_timeout(&mut child, EXIT_TIMEOUT) {
            Some(status) => {
                self.restored_pid = None;
                eprintln!("[{}] ferry restore exited: {}", self.name, describe(status));
                status
            }
            None => {
                self.restore = Some(child);
                panic!("[{}] ferry restore did not exit within {:?}", self.name, EXIT_TIMEOUT);
            }
        }
    }

    fn ferry_restore_stderr(&self) -> String {
        read_lossy(&self.path("ferry-restore.stderr"))
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        // The restored program is ferry restore's child: only signal it while
        // ferry restore has not exited (so the PID is still the one we restored).
        if let (Some(pid), Some(restore)) = (self.restored_pid, self.restore.as_mut()) {
            if let Ok(None) = restore.try_wait() {
                kill_pid(pid, libc::SIGKILL);
            }
        }
        if let Some(mut child) = self.original.take() {
            let _ = child.kill();
            let _ = wait_timeout(&mut child, Duration::from_secs(10));
        }
        if let Some(mut child) = self.restore.take() {
            if wait_timeout(&mut child, Duration::from_secs(10)).is_none() {
                let _ = child.kill();
                let _ = wait_timeout(&mut child, Duration::from_secs(10));
            }
        }
        if std::thread::panicking() {
            eprintln!("[{}] --- program log ---\n{}", self.name, self.program_log());
            eprintln!(
                "[{}] --- ferry restore stderr ---\n{}",
                self.name,
                self.ferry_restore_stderr()
            );
        }
    }
}

fn read_pidfile(path: &Path) -> Option<i32> {
    let first = fs::read_to_string(path).ok()?;
    let pid: i32 = first.trim().parse().ok()?;
    if pid <= 0 {
        return None;
    }
    // Guard against reading a half-written file.
    sleep(Duration::from_millis(20));
    let second = fs::read_to_string(path).ok()?;
    (second.trim() == first.trim()).then_some(pid)
}

fn connect_retry(port: u16, timeout: Duration) -> io::Result<TcpStream> {
    let deadline = Instant::now() + timeout;
    loop {
        match TcpStream::connect(("127.0.0.1", port)) {
            Ok(s) => {
                s.set_read_timeout(Some(IO_TIMEOUT))?;
                s.set_write_timeout(Some(IO_TIMEOUT))?;
                s.set_nodelay(true)?;
                return Ok(s);
            }
            Err(e) if Instant::now() >= deadline => return Err(e),
            Err(_) => sleep(Duration::from_millis(50)),
        }
    }
}

/// Waits until `needle` appears in the file (bounded).
fn wait_for_text(path: &Path, needle: &str, timeout: Duration) -> Option<String> {
    let deadline = Instant::now() + timeout;
    loop {
        let text = read_lossy(path);
        if text.contains(needle) {
            return Some(text);
        }
        if Instant::now() >= deadline {
            return None;
        }
        sleep(Duration::from_millis(20));
    }
}

/// Deterministic pseudo-random printable value of varying length for item i.
fn value_for(tag: &str, i: usize, min: usize, spread: usize) -> Vec<u8> {
    let len = min + (i.wrapping_mul(7919)) % spread;
    let mut v = format!("{tag}-{i}-").into_bytes();
    let mut x = (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.push(b'a' + (x % 26) as u8);
    }
    v
}

// ---------------------------------------------------------------------------
// python3

const PYTHON_SCRIPT: &str = r#"
import os, signal, sys, time

deadline = time.monotonic() + 600   # never outlive a crashed test for long
data = {}
squares = []
counter = 0

def expected(i):
    return "item-%d-" % i + "x" * (i % 64)

def grow(n):
    global counter
    for _ in range(n):
        data[counter] = expected(counter)
        squares.append(counter * counter)
        counter += 1

def verify():
    assert len(data) == counter, ("dict", len(data), counter)
    assert len(squares) == counter, ("list", len(squares), counter)
    for i in range(counter):
        assert data[i] == expected(i), ("dict item", i)
        assert squares[i] == i * i, ("list item", i)

pending = []
signal.signal(signal.SIGUSR2, lambda signum, frame: pending.append(signum))
grow(100000)
print("READY", os.getpid(), flush=True)
checks = 0
while time.monotonic() < deadline:
    if pending:
        pending.clear()
        try:
            verify()
        except AssertionError as e:
            print("FAIL", repr(e), flush=True)
            sys.exit(1)
        checks += 1
        print("PASS %d items=%d pid=%d" % (checks, counter, os.getpid()), flush=True)
    if counter < 300000:
        grow(200)
    time.sleep(0.01)
print("TIMEOUT", flush=True)
sys.exit(3)
"#;

#[test]
fn python3_state_survives() {
    const TEST: &str = "python3";
    let Some(python) = prerequisites(TEST, "/usr/bin/python3") else {
        return;
    };
    let mut run = Run::new(TEST);
    let script = run.path("state.py");
    fs::write(&script, PYTHON_SCRIPT).expect("write script");
    let pid = run.start(&python, &["-u", script.to_str().unwrap()]);
    let log = run.path("program.log");

    wait_for_text(&log, "READY", START_TIMEOUT)
        .unwrap_or_else(|| panic!("python3 did not print READY; log:\n{}", read_lossy(&log)));
    // Prove the check itself works before the checkpoint.
    kill_pid(pid, libc::SIGUSR2);
    wait_for_text(&log, "PASS 1 ", START_TIMEOUT)
        .unwrap_or_else(|| panic!("no PASS 1 before checkpoint; log:\n{}", read_lossy(&log)));
    sleep(Duration::from_millis(200)); // let it grow some more
    run.assert_original_alive();

    run.checkpoint();
    let restored = run.restore();

    kill_pid(restored, libc::SIGUSR2);
    let text = wait_for_text(&log, "PASS 2 ", START_TIMEOUT).unwrap_or_else(|| {
        panic!("restored python3 did not print PASS 2 after SIGUSR2; log:\n{}", read_lossy(&log))
    });
    assert!(!text.contains("FAIL"), "state check failed after restore:\n{text}");
    assert!(text.contains(&format!("pid={pid}")), "unexpected PID in output:\n{text}");
    // Still alive and still working: a third round.
    kill_pid(restored, libc::SIGUSR2);
    wait_for_text(&log, "PASS 3 ", START_TIMEOUT)
        .unwrap_or_else(|| panic!("no PASS 3; log:\n{}", read_lossy(&log)));

    kill_pid(restored, libc::SIGTERM);
    let status = run.wait_restore_exit();
    assert_eq!(status.code(), Some(128 + libc::SIGTERM), "ferry restore should report 128+SIGTERM");
}

// ---------------------------------------------------------------------------
// redis-server

#[derive(Debug, PartialEq)]
enum Reply {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Array(Option<Vec<Reply>>),
}

struct Redis {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl Redis {
    fn connect(port: u16, timeout: Duration) -> io::Result<Redis> {
        let stream = connect_retry(port, timeout)?;
        Ok(Redis { reader: BufReader::new(stream.try_clone()?), writer: stream })
    }

    fn encode(out: &mut Vec<u8>, args: &[&[u8]]) {
        out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
        for a in args {
            out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            out.extend_from_slice(a);
            out.extend_from_slice(b"\r\n");
        }
    }

    fn line(&mut self) -> io::Result<String> {
        let mut line = String::new();
        if self.reader.read_line(&mut line)? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "redis closed the connection",
            ));
        }
        Ok(line.trim_end_matches(['\r', '\n']).to_string())
    }

    fn reply(&mut self) -> io::Result<Reply> {
        let line = self.line()?;
        let bad = || io::Error::new(io::ErrorKind::InvalidData, format!("bad RESP line {line:?}"));
        let (kind, rest) = line.split_at(1.min(line.len()));
        Ok(match kind {
            "+" => Reply::Simple(rest.to_string()),
            "-" => Reply::Error(rest.to_string()),
            ":" => Reply::Int(rest.parse().map_err(|_| bad())?),
            "$" => {
                let n: i64 = rest.parse().map_err(|_| bad())?;
                if n < 0 {
                    Reply::Bulk(None)
                } else {
                    let mut buf = vec![0u8; n as usize + 2];
                    self.reader.read_exact(&mut buf)?;
                    buf.truncate(n as usize);
                    Reply::Bulk(Some(buf))
                }
            }
            "*" => {
                let n: i64 = rest.parse().map_err(|_| bad())?;
                if n < 0 {
                    Reply::Array(None)
                } else {
                    let mut items = Vec::with_capacity(n as usize);
                    for _ in 0..n {
                        items.push(self.reply()?);
                    }
                    Reply::Array(Some(items))
                }
            }
            _ => return Err(bad()),
        })
    }

    fn cmd(&mut self, args: &[&[u8]]) -> io::Result<Reply> {
        let mut buf = Vec::new();
        Self::encode(&mut buf, args);
        self.writer.write_all(&buf)?;
        self.reply()
    }

    /// Sends many commands in one write, then reads all the replies.
    fn pipeline(&mut self, cmds: &[Vec<Vec<u8>>]) -> io::Result<Vec<Reply>> {
        let mut buf = Vec::new();
        for c in cmds {
            let args: Vec<&[u8]> = c.iter().map(|a| a.as_slice()).collect();
            Self::encode(&mut buf, &args);
        }
        self.writer.write_all(&buf)?;
        cmds.iter().map(|_| self.reply()).collect()
    }

    fn close(self) {
        let _ = self.writer.shutdown(Shutdown::Both);
    }
}

const REDIS_KEYS: usize = 100_000;
const REDIS_BATCH: usize = 1_000;

fn redis_key(i: usize) -> Vec<u8> {
    format!("key:{i:06}").into_bytes()
}

/// Writes REDIS_KEYS keys with known values (pipelined SETs).
fn redis_populate(r: &mut Redis) -> io::Result<()> {
    for start in (0..REDIS_KEYS).step_by(REDIS_BATCH) {
        let cmds: Vec<Vec<Vec<u8>>> = (start..(start + REDIS_BATCH).min(REDIS_KEYS))
            .map(|i| vec![b"SET".to_vec(), redis_key(i), value_for("redis", i, 16, 200)])
            .collect();
        for (k, reply) in r.pipeline(&cmds)?.into_iter().enumerate() {
            if reply != Reply::Simple("OK".into()) {
                return Err(io::Error::other(format!("SET {} -> {reply:?}", start + k)));
            }
        }
    }
    Ok(())
}

/// Reads every key back with batched MGETs and compares values. Returns a
/// description of the first mismatches, if any.
fn redis_verify(r: &mut Redis) -> io::Result<Result<(), String>> {
    let mut bad = Vec::new();
    for start in (0..REDIS_KEYS).step_by(REDIS_BATCH) {
        let end = (start + REDIS_BATCH).min(REDIS_KEYS);
        let keys: Vec<Vec<u8>> = (start..end).map(redis_key).collect();
        let mut args: Vec<&[u8]> = vec![b"MGET"];
        args.extend(keys.iter().map(|k| k.as_slice()));
        match r.cmd(&args)? {
            Reply::Array(Some(items)) if items.len() == end - start => {
                for (k, item) in items.into_iter().enumerate() {
                    let i = start + k;
                    let want = value_for("redis", i, 16, 200);
                    if item != Reply::Bulk(Some(want)) && bad.len() < 5 {
                        bad.push(format!("key:{i:06} -> {item:?}"));
                    }
                }
            }
            other => return Ok(Err(format!("MGET batch at {start} -> {other:?}"))),
        }
    }
    Ok(if bad.is_empty() { Ok(()) } else { Err(bad.join("; ")) })
}

fn redis_dbsize(r: &mut Redis) -> io::Result<i64> {
    match r.cmd(&[b"DBSIZE"])? {
        Reply::Int(n) => Ok(n),
        other => Err(io::Error::other(format!("DBSIZE -> {other:?}"))),
    }
}

#[test]
fn redis_server_multithreaded_100k_keys() {
    const TEST: &str = "redis";
    let Some(redis) = prerequisites(TEST, "/usr/bin/redis-server") else {
        return;
    };
    let mut run = Run::new(TEST);
    let port = ferry_testkit::free_port();
    let port_s = port.to_string();
    let dir = run.dir.path().to_str().unwrap().to_string();
    let pid = run.start(
        &redis,
        &[
            "--port",
            &port_s,
            "--bind",
            "127.0.0.1",
            "--io-threads",
            "2",
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--dir",
            &dir,
        ],
    );

    let mut r = Redis::connect(port, START_TIMEOUT).unwrap_or_else(|e| {
        panic!("cannot connect to redis on {port}: {e}\n{}", run.program_log())
    });
    // The connection may be accepted before redis is fully up: wait for PONG.
    let deadline = Instant::now() + START_TIMEOUT;
    while r.cmd(&[b"PING"]).ok() != Some(Reply::Simple("PONG".into())) {
        assert!(Instant::now() < deadline, "redis did not answer PING\n{}", run.program_log());
        sleep(Duration::from_millis(100));
        r = Redis::connect(port, START_TIMEOUT).expect("reconnect to redis");
    }
    let threads = fs::read_dir(format!("/proc/{pid}/task")).map(|d| d.count()).unwrap_or(0);
    eprintln!("[{TEST}] redis-server PID {pid} on port {port} with {threads} threads");

    let t0 = Instant::now();
    redis_populate(&mut r).expect("populate redis");
    assert_eq!(redis_dbsize(&mut r).unwrap(), REDIS_KEYS as i64);
    redis_verify(&mut r).unwrap().expect("read-back before checkpoint");
    eprintln!("[{TEST}] wrote and verified {REDIS_KEYS} keys in {:?}", t0.elapsed());
    r.close();
    sleep(Duration::from_millis(300)); // let redis notice that the client left
    run.assert_original_alive();

    run.checkpoint();
    let restored = run.restore();

    let mut r = Redis::connect(port, START_TIMEOUT).expect("connect to the restored redis");
    assert_eq!(redis_dbsize(&mut r).expect("DBSIZE after restore"), REDIS_KEYS as i64);
    if let Err(e) = redis_verify(&mut r).expect("MGET after restore") {
        panic!("values differ after restore: {e}");
    }
    // It still works: write, read, and it reports the same process id.
    assert_eq!(r.cmd(&[b"SET", b"after-restore", b"yes"]).unwrap(), Reply::Simple("OK".into()));
    assert_eq!(r.cmd(&[b"GET", b"after-restore"]).unwrap(), Reply::Bulk(Some(b"yes".to_vec())));
    match r.cmd(&[b"INFO", b"server"]).unwrap() {
        Reply::Bulk(Some(info)) => {
            let info = String::from_utf8_lossy(&info);
            assert!(info.contains(&format!("process_id:{restored}\r\n")), "INFO server: {info}");
        }
        other => panic!("INFO server -> {other:?}"),
    }
    eprintln!("[{TEST}] all {REDIS_KEYS} keys read back after restore");

    // SHUTDOWN closes the connection instead of replying on success.
    match r.cmd(&[b"SHUTDOWN", b"NOSAVE"]) {
        Err(_) => {}
        Ok(Reply::Error(e)) => panic!("SHUTDOWN NOSAVE -> {e}"),
        Ok(_) => {}
    }
    r.close();
    let status = run.wait_restore_exit();
    assert_eq!(status.code(), Some(0), "redis SHUTDOWN NOSAVE exits 0, ferry restore should too");
}

// ---------------------------------------------------------------------------
// memcached

const MC_ITEMS: usize = 1_000;
const MC_BATCH: usize = 100;

struct Memcached {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl Memcached {
    fn connect(port: u16, timeout: Duration) -> io::Result<Memcached> {
        let stream = connect_retry(port, timeout)?;
        Ok(Memcached { reader: BufReader::new(stream.try_clone()?), writer: stream })
    }

    fn line(&mut self) -> io::Result<String> {
        let mut line = String::new();
        if self.reader.read_line(&mut line)? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "memcached closed the connection",
            ));
        }
        Ok(line.trim_end_matches(['\r', '\n']).to_string())
    }

    fn flags(i: usize) -> u32 {
        (i as u32).wrapping_mul(2654435761) % 65536
    }

    fn store_all(&mut self) -> io::Result<()> {
        for start in (0..MC_ITEMS).step_by(MC_BATCH) {
            let end = (start + MC_BATCH).min(MC_ITEMS);
            let mut buf = Vec::new();
            for i in start..end {
                let v = value_for("mc", i, 8, 1500);
                buf.extend_from_slice(
                    format!("set mc:{i:04} {} 0 {}\r\n", Self::flags(i), v.len()).as_bytes(),
                );
                buf.extend_from_slice(&v);
                buf.extend_from_slice(b"\r\n");
            }
            self.writer.write_all(&buf)?;
            for i in start..end {
                let l = self.line()?;
                if l != "STORED" {
                    return Err(io::Error::other(format!("set mc:{i:04} -> {l}")));
                }
            }
        }
        Ok(())
    }

    /// Reads all items back with multi-key gets; returns mismatches.
    fn verify_all(&mut self) -> io::Result<Result<(), String>> {
        let mut bad = Vec::new();
        let mut seen = 0;
        for start in (0..MC_ITEMS).step_by(MC_BATCH) {
            let end = (start + MC_BATCH).min(MC_ITEMS);
            let keys: Vec<String> = (start..end).map(|i| format!("mc:{i:04}")).collect();
            self.writer.write_all(format!("get {}\r\n", keys.join(" ")).as_bytes())?;
            let mut next = start;
            loop {
                let l = self.line()?;
                if l == "END" {
                    break;
                }
                // VALUE <key> <flags> <bytes>
                let parts: Vec<&str> = l.split(' ').collect();
                if parts.len() != 4 || parts[0] != "VALUE" {
                    return Ok(Err(format!("unexpected line {l:?}")));
                }
                let n: usize = parts[3].parse().map_err(|_| io::Error::other(l.clone()))?;
                let mut data = vec![0u8; n + 2];
                self.reader.read_exact(&mut data)?;
                data.truncate(n);
                let i: usize = parts[1].trim_start_matches("mc:").parse().unwrap_or(usize::MAX);
                if i < next || i >= end {
                    bad.push(format!("unexpected key {}", parts[1]));
                    continue;
                }
                for missing in next..i {
                    bad.push(format!("mc:{missing:04} missing"));
                }
                next = i + 1;
                seen += 1;
                if parts[2] != Self::flags(i).to_string() {
                    bad.push(format!("mc:{i:04} flags {} != {}", parts[2], Self::flags(i)));
                }
                if data != value_for("mc", i, 8, 1500) {
                    bad.push(format!("mc:{i:04} value differs ({} bytes)", data.len()));
                }
            }
            for missing in next..end {
                bad.push(format!("mc:{missing:04} missing"));
            }
        }
        if bad.is_empty() && seen == MC_ITEMS {
            Ok(Ok(()))
        } else {
            bad.truncate(10);
            Ok(Err(format!("{seen}/{MC_ITEMS} items read back; {}", bad.join("; "))))
        }
    }

    fn close(self) {
        let _ = self.writer.shutdown(Shutdown::Both);
    }
}

#[test]
fn memcached_multithreaded_1000_items() {
    const TEST: &str = "memcached";
    let Some(memcached) = prerequisites(TEST, "/usr/bin/memcached") else {
        return;
    };
    let mut run = Run::new(TEST);
    let port = ferry_testkit::free_port();
    let port_s = port.to_string();
    // memcached refuses to run as root unless told which user to be.
    let pid = run
        .start(&memcached, &["-t", "4", "-p", &port_s, "-U", "0", "-l", "127.0.0.1", "-u", "root"]);

    let mut mc = Memcached::connect(port, START_TIMEOUT).unwrap_or_else(|e| {
        panic!("cannot connect to memcached on {port}: {e}\n{}", run.program_log())
    });
    let threads = fs::read_dir(format!("/proc/{pid}/task")).map(|d| d.count()).unwrap_or(0);
    eprintln!("[{TEST}] memcached PID {pid} on port {port} with {threads} threads");
    mc.store_all().expect("store items");
    mc.verify_all().unwrap().expect("read-back before checkpoint");
    mc.close();
    sleep(Duration::from_millis(300)); // let memcached notice that the client left
    run.assert_original_alive();

    run.checkpoint();
    let restored = run.restore();

    let mut mc =
        Memcached::connect(port, START_TIMEOUT).expect("connect to the restored memcached");
    if let Err(e) = mc.verify_all().expect("get after restore") {
        panic!("items differ after restore: {e}");
    }
    // Still works after restore.
    mc.writer.write_all(b"set after-restore 0 0 3\r\nyes\r\nget after-restore\r\n").unwrap();
    assert_eq!(mc.line().unwrap(), "STORED");
    assert_eq!(mc.line().unwrap(), "VALUE after-restore 0 3");
    assert_eq!(mc.line().unwrap(), "yes");
    assert_eq!(mc.line().unwrap(), "END");
    mc.close();
    eprintln!("[{TEST}] all {MC_ITEMS} items read back after restore");

    kill_pid(restored, libc::SIGTERM);
    let status = run.wait_restore_exit();
    assert_eq!(status.code(), Some(0), "memcached exits 0 on SIGTERM, ferry restore should too");
}
