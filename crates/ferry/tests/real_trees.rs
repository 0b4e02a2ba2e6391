//! End-to-end tests of whole process trees of real, unmodified programs:
//! `ferry checkpoint --pid ROOT` captures ROOT and all its descendants, and
//! `ferry restore --detach --pidfile F` brings the whole tree back under the
//! same PIDs.
//!
//! What each test proves:
//!
//! - `nginx_master_and_workers_serve_after_restore`: Debian's nginx, a master
//!   (root) and 2 workers (switched to user nobody), sharing the listening
//!   socket, the log files, an anonymous shared mapping and the master's
//!   per-worker unix socketpairs. After checkpoint the tree is gone and the
//!   port closed; after restore the master and both workers are back with
//!   their old PIDs, parent and user, serve the same file 20 times, and keep
//!   appending to the same access log. A graceful SIGQUIT then stops them all.
//! - `postgres_rows_survive_restore`: Debian's PostgreSQL 15, a postmaster run
//!   as user postgres with its background processes (checkpointer, background
//!   writer, walwriter, autovacuum launcher, logical replication launcher),
//!   sharing the main shared memory, the small SysV segment and the POSIX
//!   dynamic shared memory. 10,000 rows and a marker written before the
//!   checkpoint read back identically (count, sum, md5 of all payloads) after
//!   restore, from the same server (same start time, same checkpointer PID),
//!   which accepts new connections (a fork after restore) and new INSERTs. A
//!   fast shutdown (SIGINT) then ends the tree with exit code 0.
//! - `shell_pipeline_output_matches_uninterrupted_run`: a `sh -c` pipeline of
//!   five processes (yes | head | python3 throttle | tr | sha256sum > OUT),
//!   checkpointed mid-way with data in flight in four pipes between different
//!   processes, a sleeping python3, and sha256sum holding its output file.
//!   After restore the pipeline finishes on its own and OUT is byte for byte
//!   the output of an uninterrupted run; the shell exits 0.
//!
//! The tests skip (with a message) when not run as root or when a program is
//! missing (`scripts/install-deps.sh` installs them). Programs are started
//! through `scripts/isolated.sh` (new session, only fds 0-2). This test binary
//! makes itself a child subreaper, so that processes of a checkpointed tree
//! and the root of a detached restore are reaped here, promptly, by PID.
//!
//! Every wait is bounded. A guard per test kills (SIGKILL, by PID, only
//! processes whose PID and start time it recorded from its own trees) and
//! reaps everything, removes SysV shared memory and /dev/shm files left by its
//! postgres, and removes its temporary directory, also when the test fails.

mod common;

use common::{innermost_pid, inode, NetNs};
use ferry_testkit::is_root;
use ferry_testkit::TempDir;
use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Once;
use std::thread::sleep;
use std::time::{Duration, Instant};

const FERRY: &str = env!("CARGO_BIN_EXE_ferry");

const START_TIMEOUT: Duration = Duration::from_secs(60);
const FERRY_TIMEOUT: Duration = Duration::from_secs(120);
const GONE_TIMEOUT: Duration = Duration::from_secs(30);
const EXIT_TIMEOUT: Duration = Duration::from_secs(60);
const IO_TIMEOUT: Duration = Duration::from_secs(20);
const CMD_TIMEOUT: Duration = Duration::from_secs(120);

const NGINX: &str = "/usr/sbin/nginx";
const PG_BIN: &str = "/usr/lib/postgresql/15/bin";
const PSQL: &str = "/usr/bin/psql";
const SETPRIV: &str = "/usr/bin/setpriv";
const PYTHON: &str = "/usr/bin/python3";

fn isolated_sh() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/isolated.sh")
}

// ---------------------------------------------------------------------------
// Skipping

fn is_executable(path: &str) -> bool {
    fs::metadata(path).map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0).unwrap_or(false)
}

/// True if the test can run; otherwise prints why it is skipped.
fn prerequisites(test: &str, programs: &[&str]) -> bool {
    if !is_root() {
        eprintln!("SKIPPED {test}: needs root (ptrace and same-PID restore)");
        return false;
    }
    for p in programs {
        if !is_executable(p) {
            eprintln!("SKIPPED {test}: {p} is not installed (run scripts/install-deps.sh)");
            return false;
        }
    }
    if !isolated_sh().is_file() {
        eprintln!("SKIPPED {test}: {} is missing", isolated_sh().display());
        return false;
    }
    become_subreaper();
    true
}

/// Orphans of our trees (workers of a killed master, the root of a detached
/// restore) become our children, so we can reap them by PID right away
/// instead of waiting for init.
fn become_subreaper() {
    static ONCE: Once = Once::new();
    ONCE.call_once(ferry_testkit::become_subreaper);
}

// ---------------------------------------------------------------------------
// Temporary directory

fn read_lossy(path: &Path) -> String {
    fs::read(path).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default()
}

fn path_str(p: &Path) -> &str {
    p.to_str().unwrap_or_else(|| panic!("non-UTF-8 path {}", p.display()))
}

// ---------------------------------------------------------------------------
// /proc

/// A process as identified by PID and start time (so a reused PID is never
/// mistaken for ours).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct ProcId {
    pid: i32,
    start: u64,
}

#[derive(Clone, Debug)]
struct ProcInfo {
    id: ProcId,
    ppid: i32,
    state: char,
    comm: String,
    cmdline: String,
    uid: u32,
}

struct Stat {
    state: char,
    ppid: i32,
    start: u64,
    comm: String,
}

fn read_stat(pid: i32) -> Option<Stat> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let comm = text[open + 1..close].to_string();
    let rest: Vec<&str> = text[close + 1..].split_whitespace().collect();
    // rest[0] is field 3 (state); field 22 (starttime) is rest[19].
    Some(Stat {
        state: rest.first()?.chars().next()?,
        ppid: rest.get(1)?.parse().ok()?,
        start: rest.get(19)?.parse().ok()?,
        comm,
    })
}

fn proc_info(pid: i32) -> Option<ProcInfo> {
    let st = read_stat(pid)?;
    let cmdline = fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " ").trim().to_string())
        .unwrap_or_default();
    let uid = fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|u| u.parse().ok()))
        })
        .unwrap_or(u32::MAX);
    Some(ProcInfo {
        id: ProcId { pid, start: st.start },
        ppid: st.ppid,
        state: st.state,
        comm: st.comm,
        cmdline,
        uid,
    })
}

/// The PIDs of pid's children (over all its threads).
fn children(pid: i32) -> Vec<i32> {
    let mut out = BTreeSet::new();
    if let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) {
        for t in tasks.flatten() {
            if let Ok(text) = fs::read_to_string(t.path().join("children")) {
                out.extend(text.split_whitespace().filter_map(|c| c.parse::<i32>().ok()));
            }
        }
    }
    out.into_iter().collect()
}

/// ROOT and all its descendants, ROOT first (empty if ROOT does not exist).
fn tree(root: i32) -> Vec<ProcInfo> {
    let mut out = Vec::new();
    let mut queue = vec![root];
    let mut seen = BTreeSet::new();
    while let Some(pid) = queue.pop() {
        if !seen.insert(pid) {
            continue;
        }
        if let Some(info) = proc_info(pid) {
            out.push(info);
            let mut kids = children(pid);
            kids.reverse();
            queue.extend(kids);
        }
    }
    out
}

fn describe_tree(procs: &[ProcInfo]) -> String {
    procs
        .iter()
        .map(|p| {
            format!(
                "  pid {} ppid {} {} uid {} [{}] {}",
                p.id.pid, p.ppid, p.state, p.uid, p.comm, p.cmdline
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Still there (running or zombie) with the same start time.
fn exists(id: &ProcId) -> bool {
    read_stat(id.pid).map(|s| s.start == id.start).unwrap_or(false)
}

fn running(id: &ProcId) -> bool {
    read_stat(id.pid)
        .map(|s| s.start == id.start && s.state != 'Z' && s.state != 'X')
        .unwrap_or(false)
}

fn signal(id: &ProcId, sig: libc::c_int) {
    if id.pid > 0 && running(id) {
        // A process this test started or restored (PID and start time
        // checked just above).
        ferry_testkit::kill(id.pid, sig);
    }
}

/// Reaps pid if it is a zombie child of ours; returns its status then.
fn try_reap(pid: i32) -> Option<ExitStatus> {
    ferry_testkit::try_reap(pid)
}

fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(c), _) => format!("exit code {c}"),
        (_, Some(s)) => format!("killed by signal {s}"),
        _ => format!("{status:?}"),
    }
}

/// Waits until none of `ids` exists any more, reaping those that are our
/// children. Returns the statuses of those reaped here, or the ones left.
fn wait_gone(ids: &[ProcId], timeout: Duration) -> Result<BTreeMap<i32, ExitStatus>, Vec<ProcId>> {
    let deadline = Instant::now() + timeout;
    let mut statuses = BTreeMap::new();
    loop {
        for id in ids {
            if exists(id) {
                if let Some(st) = try_reap(id.pid) {
                    statuses.insert(id.pid, st);
                }
            }
        }
        let left: Vec<ProcId> = ids.iter().copied().filter(exists).collect();
        if left.is_empty() {
            return Ok(statuses);
        }
        if Instant::now() >= deadline {
            return Err(left);
        }
        sleep(Duration::from_millis(10));
    }
}

fn wait_child(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
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
        sleep(Duration::from_millis(10));
    }
}

/// Runs a command to completion (bounded), killing it on timeout.
fn run_bounded(mut cmd: Command, what: &str, timeout: Duration) -> (ExitStatus, String) {
    let out = tempfile_path(what);
    let file = File::create(&out).unwrap_or_else(|e| panic!("create {}: {e}", out.display()));
    let file2 = file.try_clone().expect("dup output file");
    cmd.stdin(Stdio::null()).stdout(file).stderr(file2);
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {what}: {e}"));
    let status = match wait_child(&mut child, timeout) {
        Some(s) => s,
        None => {
            let _ = child.kill();
            let _ = child.wait();
            let text = read_lossy(&out);
            let _ = fs::remove_file(&out);
            panic!("{what} did not finish within {timeout:?}; output:\n{text}");
        }
    };
    let text = read_lossy(&out);
    let _ = fs::remove_file(&out);
    (status, text)
}

fn tempfile_path(what: &str) -> PathBuf {
    static SEQ: AtomicU32 = AtomicU32::new(0);
    let tag: String =
        what.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).take(24).collect();
    std::env::temp_dir().join(format!(
        "ferry-trees-out-{}-{}-{tag}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::SeqCst)
    ))
}

// ---------------------------------------------------------------------------
// The guard of one test's process trees

struct TreeGuard {
    name: String,
    /// The program as started (through isolated.sh: same PID), until reaped.
    root_child: Option<Child>,
    /// Every root we started or restored.
    roots: Vec<ProcId>,
    /// Every process of our trees we have seen.
    known: BTreeSet<ProcId>,
}

impl TreeGuard {
    fn new(name: &str) -> TreeGuard {
        TreeGuard {
            name: name.to_string(),
            root_child: None,
            roots: Vec::new(),
            known: BTreeSet::new(),
        }
    }

    /// Starts `program args` through scripts/isolated.sh (new session, only
    /// fds 0-2), stdin from /dev/null, stdout and stderr to `log`.
    fn start(&mut self, cwd: &Path, log: &Path, program: &str, args: &[&str]) -> ProcId {
        self.start_via(&[], cwd, log, program, args)
    }

    /// As `start`, run through `wrapper` (such as `ip netns exec NAME`),
    /// which must exec its command (the PID stays).
    fn start_via(
        &mut self,
        wrapper: &[&str],
        cwd: &Path,
        log: &Path,
        program: &str,
        args: &[&str],
    ) -> ProcId {
        assert!(self.root_child.is_none(), "[{}] a tree is already running", self.name);
        let out = File::create(log).unwrap_or_else(|e| panic!("create {}: {e}", log.display()));
        let err = out.try_clone().expect("dup log fd");
        let mut cmd = match wrapper.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg("/bin/bash");
                c
            }
            None => Command::new("/bin/bash"),
        };
        let child = cmd
            .arg(isolated_sh())
            .arg(program)
            .args(args)
            .current_dir(cwd)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("[{}] spawn {program} through isolated.sh: {e}", self.name));
        let pid = child.id() as i32;
        self.root_child = Some(child);
        // isolated.sh execs (setsid does not fork: bash is no group leader),
        // so the PID stays. Its start time is known at once.
        let start = read_stat(pid)
            .map(|s| s.start)
            .unwrap_or_else(|| panic!("[{}] no /proc/{pid}/stat right after spawn", self.name));
        let id = ProcId { pid, start };
        self.roots.push(id);
        self.known.insert(id);
        eprintln!("[{}] started {program} as PID {pid}", self.name);
        id
    }

    /// Records (and returns) the current tree of `root`.
    fn snapshot(&mut self, root: &ProcId) -> Vec<ProcInfo> {
        if !running(root) {
            return Vec::new();
        }
        let procs = tree(root.pid);
        self.known.extend(procs.iter().map(|p| p.id));
        procs
    }

    /// Panics with the log if the started root has exited.
    fn assert_root_alive(&mut self, log: &Path) {
        if let Some(child) = self.root_child.as_mut() {
            if let Ok(Some(status)) = child.try_wait() {
                self.root_child = None;
                panic!(
                    "[{}] program exited early ({}); log:\n{}",
                    self.name,
                    describe(status),
                    read_lossy(log)
                );
            }
        }
    }

    /// Reaps the started root (bounded) after ferry checkpoint killed it.
    fn reap_started_root(&mut self) -> ExitStatus {
        let mut child = self.root_child.take().expect("no started root to reap");
        match wait_child(&mut child, GONE_TIMEOUT) {
            Some(st) => st,
            None => {
                let pid = child.id();
                self.root_child = Some(child);
                panic!(
                    "[{}] PID {pid} still runs {GONE_TIMEOUT:?} after ferry checkpoint",
                    self.name
                );
            }
        }
    }

    /// Kills every process of our trees (SIGKILL, by PID + start time).
    fn kill_all(&mut self) {
        let roots = self.roots.clone();
        for r in &roots {
            self.snapshot(r);
        }
        for r in &roots {
            signal(r, libc::SIGKILL);
        }
        for id in self.known.clone() {
            signal(&id, libc::SIGKILL);
        }
    }
}

impl Drop for TreeGuard {
    fn drop(&mut self) {
        self.kill_all();
        if let Some(mut child) = self.root_child.take() {
            let _ = child.kill();
            let _ = wait_child(&mut child, Duration::from_secs(10));
        }
        let ids: Vec<ProcId> = self.known.iter().copied().collect();
        if let Err(left) = wait_gone(&ids, Duration::from_secs(15)) {
            eprintln!("[{}] warning: processes still present after cleanup: {left:?}", self.name);
        }
    }
}

// ---------------------------------------------------------------------------
// ferry

struct FerryRun {
    status: ExitStatus,
    out: String,
    wall: Duration,
}

fn ferry(name: &str, dir: &Path, tag: &str, args: &[&str]) -> FerryRun {
    let out_path = dir.join(format!("ferry-{tag}.out"));
    let file =
        File::create(&out_path).unwrap_or_else(|e| panic!("create {}: {e}", out_path.display()));
    let file2 = file.try_clone().expect("dup ferry output fd");
    let t0 = Instant::now();
    let mut child = Command::new(FERRY)
        .args(args)
        .stdin(Stdio::null())
        .stdout(file)
        .stderr(file2)
        .spawn()
        .unwrap_or_else(|e| panic!("[{name}] spawn {FERRY}: {e}"));
    let (status, timed_out) = match wait_child(&mut child, FERRY_TIMEOUT) {
        Some(s) => (s, false),
        None => {
            let _ = child.kill();
            let status = child.wait().unwrap_or_else(|e| {
                panic!("[{name}] wait for the killed `ferry {}`: {e}", args.join(" "))
            });
            (status, true)
        }
    };
    let mut out = read_lossy(&out_path);
    if timed_out {
        out.push_str(&format!("\n(the test killed ferry: no exit within {FERRY_TIMEOUT:?})"));
    }
    FerryRun { status, out, wall: t0.elapsed() }
}

/// The engine's own time from ferry's summary line ("... in 12.3 ms ...").
fn engine_ms(text: &str) -> Option<f64> {
    text.lines().rev().find_map(|line| {
        let mut rest = line;
        while let Some(i) = rest.find(" in ") {
            rest = &rest[i + 4..];
            let num: String =
                rest.chars().take_while(|c| c.is_ascii_digit() || *c == '.').collect();
            if !num.is_empty() && rest[num.len()..].starts_with(" ms") {
                return num.parse().ok();
            }
        }
        None
    })
}

fn timing(run: &FerryRun) -> String {
    match engine_ms(&run.out) {
        Some(ms) => format!("{ms:.1} ms (ferry), {:.1} ms wall", run.wall.as_secs_f64() * 1e3),
        None => format!("{:.1} ms wall", run.wall.as_secs_f64() * 1e3),
    }
}

/// `ferry checkpoint --pid ROOT --images DIR`, then checks that the whole tree
/// (`before`) is gone, reaping what is ours.
fn checkpoint_tree(
    guard: &mut TreeGuard,
    dir: &Path,
    images: &Path,
    root: &ProcId,
    before: &[ProcInfo],
) {
    let name = guard.name.clone();
    fs::create_dir_all(images).unwrap_or_else(|e| panic!("create {}: {e}", images.display()));
    let pid = root.pid.to_string();
    let run = ferry(
        &name,
        dir,
        "checkpoint",
        &["checkpoint", "--pid", &pid, "--images", path_str(images)],
    );
    assert!(
        run.status.success(),
        "[{name}] ferry checkpoint --pid {pid} ({} processes) failed ({}):\n{}\ntree was:\n{}",
        before.len(),
        describe(run.status),
        run.out.trim(),
        describe_tree(before)
    );
    eprintln!(
        "[{name}] checkpoint of {} processes: {}; ferry said: {}",
        before.len(),
        timing(&run),
        run.out.trim()
    );
    let st = guard.reap_started_root();
    eprintln!("[{name}] reaped the checkpointed root {pid} ({})", describe(st));
    let ids: Vec<ProcId> = before.iter().map(|p| p.id).collect();
    if let Err(left) = wait_gone(&ids, GONE_TIMEOUT) {
        let desc: Vec<String> = left
            .iter()
            .filter_map(|id| proc_info(id.pid))
            .map(|p| format!("pid {} state {} [{}]", p.id.pid, p.state, p.cmdline))
            .collect();
        panic!(
            "[{name}] after ferry checkpoint, processes of the tree are still there: {}",
            desc.join("; ")
        );
    }
}

/// `ferry restore --images DIR --detach --pidfile F`; checks the pidfile
/// names the old root and records the restored tree in the guard.
fn restore_tree(
    guard: &mut TreeGuard,
    dir: &Path,
    images: &Path,
    before: &[ProcInfo],
) -> (ProcId, Vec<ProcInfo>) {
    let name = guard.name.clone();
    let old_root = before[0].id;
    let pidfile = dir.join("restored.pid");
    let _ = fs::remove_file(&pidfile);
    let run = ferry(
        &name,
        dir,
        "restore",
        &["restore", "--images", path_str(images), "--detach", "--pidfile", path_str(&pidfile)],
    );
    // Whatever happened, processes that came back are ours to clean up: a
    // process now under an old PID of the tree, with the same name (or still
    // named ferry, half restored), started after the checkpoint (the old ones
    // were all gone), is a restored one.
    for (i, old) in before.iter().enumerate() {
        if let Some(info) = proc_info(old.id.pid) {
            let named = info.comm == old.comm || info.comm == "ferry";
            if named && info.id.start > old.id.start && !guard.known.contains(&info.id) {
                guard.known.insert(info.id);
                if i == 0 {
                    guard.roots.push(info.id);
                    guard.snapshot(&info.id);
                }
            }
        }
    }
    assert!(
        run.status.success(),
        "[{name}] ferry restore --detach failed ({}):\n{}",
        describe(run.status),
        run.out.trim()
    );
    eprintln!("[{name}] restore: {}; ferry said: {}", timing(&run), run.out.trim());
    let text = fs::read_to_string(&pidfile).unwrap_or_else(|e| {
        panic!("[{name}] no pidfile {} after ferry restore --detach: {e}", pidfile.display())
    });
    let pid: i32 =
        text.trim().parse().unwrap_or_else(|_| panic!("[{name}] bad pidfile content {text:?}"));
    assert_eq!(pid, old_root.pid, "[{name}] restored root PID differs from the original");
    let st =
        read_stat(pid).unwrap_or_else(|| panic!("[{name}] restored root {pid} does not exist"));
    let id = ProcId { pid, start: st.start };
    assert!(running(&id), "[{name}] restored root {pid} is not running (state {})", st.state);
    let procs = guard.snapshot(&id);
    (id, procs)
}

/// Sends `sig` to the root and waits until every process of the tree has
/// exited; returns the root's status if it was reaped here.
fn stop_tree(guard: &mut TreeGuard, root: &ProcId, sig: libc::c_int) -> Option<ExitStatus> {
    let name = guard.name.clone();
    let procs = guard.snapshot(root);
    let ids: Vec<ProcId> = procs.iter().map(|p| p.id).collect();
    signal(root, sig);
    match wait_gone(&ids, EXIT_TIMEOUT) {
        Ok(statuses) => statuses.get(&root.pid).copied(),
        Err(left) => panic!(
            "[{name}] tree did not exit within {EXIT_TIMEOUT:?} after signal {sig}; left: {left:?}"
        ),
    }
}

/// Checks that the restored tree has the same PIDs, parents and users.
fn assert_same_tree(name: &str, before: &[ProcInfo], after: &[ProcInfo]) {
    let shape = |procs: &[ProcInfo]| -> BTreeMap<i32, (i32, u32, String)> {
        procs.iter().skip(1).map(|p| (p.id.pid, (p.ppid, p.uid, p.comm.clone()))).collect()
    };
    assert_eq!(
        shape(before),
        shape(after),
        "[{name}] restored tree differs (pid -> ppid, uid, comm)\nbefore:\n{}\nafter:\n{}",
        describe_tree(before),
        describe_tree(after)
    );
    assert_eq!(before[0].id.pid, after[0].id.pid);
    assert_eq!(before[0].uid, after[0].uid, "[{name}] root's uid differs after restore");
}

// ---------------------------------------------------------------------------
// nginx

fn http_get(port: u16, path: &str) -> io::Result<(u16, Vec<u8>)> {
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let mut s = TcpStream::connect_timeout(&addr, IO_TIMEOUT)?;
    s.set_read_timeout(Some(IO_TIMEOUT))?;
    s.set_write_timeout(Some(IO_TIMEOUT))?;
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").as_bytes(),
    )?;
    let mut resp = Vec::new();
    s.read_to_end(&mut resp)?;
    drop(s);
    let bad = |m: &str| io::Error::new(io::ErrorKind::InvalidData, m.to_string());
    let end =
        resp.windows(4).position(|w| w == b"\r\n\r\n").ok_or_else(|| bad("no end of headers"))?;
    let head = String::from_utf8_lossy(&resp[..end]).into_owned();
    let body = resp[end + 4..].to_vec();
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| bad("bad status line"))?;
    if let Some(len) = head.lines().find_map(|l| {
        l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().to_string())
    }) {
        if len.parse::<usize>().ok() != Some(body.len()) {
            return Err(bad(&format!("content-length {len} but {} body bytes", body.len())));
        }
    }
    Ok((status, body))
}

/// Connections (not listening, not TIME_WAIT/CLOSE) on `port` in /proc/net/tcp.
fn open_connections(port: u16) -> Vec<String> {
    open_connections_in("/proc/net/tcp", port)
}

fn open_connections_in(table: &str, port: u16) -> Vec<String> {
    let text = fs::read_to_string(table).unwrap_or_default();
    let port_hex = format!("{port:04X}");
    text.lines()
        .skip(1)
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() < 4 {
                return false;
            }
            let local_port = f[1].rsplit(':').next().unwrap_or("");
            let remote_port = f[2].rsplit(':').next().unwrap_or("");
            (local_port == port_hex || remote_port == port_hex)
                && !matches!(f[3], "0A" | "06" | "07")
        })
        .map(|l| l.trim().to_string())
        .collect()
}

/// Nobody serves the port now: a connection is refused, or (while the
/// network lock holds new connection attempts until the restore) its SYN
/// gets no answer.
fn port_not_served(port: u16) -> bool {
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    match TcpStream::connect_timeout(&addr, Duration::from_millis(1500)) {
        Ok(_) => false,
        Err(e) => matches!(
            e.kind(),
            io::ErrorKind::ConnectionRefused | io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock
        ),
    }
}

fn port_closed(port: u16) -> bool {
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    matches!(TcpStream::connect_timeout(&addr, Duration::from_secs(2)), Err(e) if e.kind() == io::ErrorKind::ConnectionRefused)
}

fn count_lines(path: &Path) -> usize {
    read_lossy(path).lines().count()
}

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
    v
}

/// An nginx master with 2 workers serving `www/ferry.txt` on
/// 127.0.0.1:PORT, everything (config, logs, temp dirs) inside `dir`.
struct NginxSite {
    content: Vec<u8>,
    log: PathBuf,
    access: PathBuf,
    prefix: String,
    conf: String,
    err_log: String,
}

impl NginxSite {
    fn new(dir: &Path, port: u16) -> NginxSite {
        let www = dir.join("www");
        fs::create_dir_all(&www).expect("create www dir");
        fs::set_permissions(&www, fs::Permissions::from_mode(0o755)).expect("chmod www");
        let content = static_content();
        fs::write(www.join("ferry.txt"), &content).expect("write static file");
        fs::set_permissions(www.join("ferry.txt"), fs::Permissions::from_mode(0o644))
            .expect("chmod static file");
        let d = path_str(dir);
        let conf = format!(
            "# ferry real_trees test: everything inside {d}\n\
             daemon off;\n\
             master_process on;\n\
             worker_processes 2;\n\
             user nobody nogroup;\n\
             pid {d}/nginx.pid;\n\
             error_log {d}/error.log notice;\n\
             events {{ worker_connections 64; }}\n\
             http {{\n\
               access_log {d}/access.log;\n\
               client_body_temp_path {d}/client_body;\n\
               proxy_temp_path {d}/proxy;\n\
               fastcgi_temp_path {d}/fastcgi;\n\
               uwsgi_temp_path {d}/uwsgi;\n\
               scgi_temp_path {d}/scgi;\n\
               types {{ text/plain txt; }}\n\
               default_type application/octet-stream;\n\
               server {{\n\
                 listen 127.0.0.1:{port};\n\
                 root {d}/www;\n\
                 location / {{ }}\n\
               }}\n\
             }}\n"
        );
        let conf_path = dir.join("nginx.conf");
        fs::write(&conf_path, conf).expect("write nginx.conf");
        NginxSite {
            content,
            log: dir.join("nginx.stdio.log"),
            access: dir.join("access.log"),
            prefix: format!("{d}/"),
            conf: path_str(&conf_path).to_string(),
            err_log: format!("{d}/error.log"),
        }
    }

    fn args(&self) -> Vec<&str> {
        vec!["-p", &self.prefix, "-c", &self.conf, "-e", &self.err_log]
    }
}

#[test]
fn nginx_master_and_workers_serve_after_restore() {
    const TEST: &str = "nginx";
    if !prerequisites(TEST, &[NGINX]) {
        return;
    }
    // Locals drop in reverse order: the processes first, then the directory.
    let tmp = TempDir::new("ferry-trees", TEST);
    let mut guard = TreeGuard::new(TEST);
    let dir = tmp.path();
    let port = ferry_testkit::free_port();
    let site = NginxSite::new(dir, port);
    let master = guard.start(dir, &site.log, NGINX, &site.args());
    let (content, access, log) = (site.content.clone(), site.access.clone(), site.log.clone());

    // Ready: serves the file, and both workers are up.
    let deadline = Instant::now() + START_TIMEOUT;
    let before = loop {
        guard.assert_root_alive(&log);
        let procs = guard.snapshot(&master);
        let served =
            matches!(http_get(port, "/ferry.txt"), Ok((200, ref body)) if *body == content);
        if served
            && procs.len() == 3
            && procs[1..]
                .iter()
                .all(|p| p.ppid == master.pid && p.cmdline.contains("worker process"))
        {
            break procs;
        }
        assert!(
            Instant::now() < deadline,
            "[{TEST}] nginx not ready within {START_TIMEOUT:?}; tree:\n{}\nerror.log:\n{}\nstdio:\n{}",
            describe_tree(&procs),
            read_lossy(&dir.join("error.log")),
            read_lossy(&log)
        );
        sleep(Duration::from_millis(50));
    };
    eprintln!("[{TEST}] nginx on 127.0.0.1:{port}, tree:\n{}", describe_tree(&before));
    assert!(
        before[1..].iter().all(|p| p.uid == 65534),
        "[{TEST}] workers should run as nobody:\n{}",
        describe_tree(&before)
    );
    for i in 0..5 {
        let (st, body) = http_get(port, "/ferry.txt")
            .unwrap_or_else(|e| panic!("[{TEST}] GET {i} before checkpoint: {e}"));
        assert!(
            st == 200 && body == content,
            "[{TEST}] GET {i} before checkpoint: status {st}, {} bytes",
            body.len()
        );
    }
    // No connection may be left for the checkpoint (live TCP is refused).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let open = open_connections(port);
        if open.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "[{TEST}] connections stay open on port {port}: {open:?}"
        );
        sleep(Duration::from_millis(20));
    }
    sleep(Duration::from_millis(200));
    let access_before = count_lines(&access);
    assert!(access_before >= 6, "[{TEST}] access log has only {access_before} lines");
    // The tree must not have changed while we waited.
    let before2 = guard.snapshot(&master);
    assert_same_tree(TEST, &before, &before2);

    let images = dir.join("images");
    checkpoint_tree(&mut guard, dir, &images, &master, &before);
    assert!(
        port_not_served(port),
        "[{TEST}] port {port} still accepts connections after the checkpoint"
    );

    let (root, after) = restore_tree(&mut guard, dir, &images, &before);
    assert_same_tree(TEST, &before, &after);
    eprintln!("[{TEST}] restored tree:\n{}", describe_tree(&after));

    for i in 0..20 {
        let (st, body) = http_get(port, "/ferry.txt")
            .unwrap_or_else(|e| panic!("[{TEST}] GET {i} after restore: {e}"));
        assert_eq!(st, 200, "[{TEST}] GET {i} after restore: status {st}");
        assert!(
            body == content,
            "[{TEST}] GET {i} after restore: {} bytes differ from the file",
            body.len()
        );
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while count_lines(&access) < access_before + 20 {
        assert!(
            Instant::now() < deadline,
            "[{TEST}] access log has {} lines after 20 more requests (had {access_before})",
            count_lines(&access)
        );
        sleep(Duration::from_millis(20));
    }
    let access_text = read_lossy(&access);
    let new_lines: Vec<&str> = access_text.lines().skip(access_before).collect();
    assert_eq!(new_lines.len(), 20, "[{TEST}] new access log lines:\n{}", new_lines.join("\n"));
    assert!(
        new_lines.iter().all(|l| l.contains("\"GET /ferry.txt HTTP/1.1\" 200")),
        "[{TEST}] new access log lines:\n{}",
        new_lines.join("\n")
    );
    eprintln!("[{TEST}] 20 GETs served after restore and logged");

    // Graceful stop of the restored tree.
    let status = stop_tree(&mut guard, &root, libc::SIGQUIT);
    if let Some(st) = status {
        assert!(st.success(), "[{TEST}] nginx master exited with {} after SIGQUIT", describe(st));
    }
    assert!(port_closed(port), "[{TEST}] port {port} still open after nginx stopped");
}

/// Connections on `port` that `pid`'s network namespace holds (not
/// listening, not closing).
fn open_connections_of(pid: i32, port: u16) -> Vec<String> {
    open_connections_in(&format!("/proc/{pid}/net/tcp"), port)
}

#[test]
fn nginx_tree_moves_to_another_network_namespace_in_a_new_pid_namespace() {
    const TEST: &str = "nginx-netns";
    if !prerequisites(TEST, &[NGINX]) {
        return;
    }
    let (Some(from), Some(to)) = (NetNs::new("from"), NetNs::new("to")) else {
        eprintln!("[{TEST}] skipped: `ip netns add` is not available");
        return;
    };
    let tmp = TempDir::new("ferry-trees", TEST);
    let mut guard = TreeGuard::new(TEST);
    let dir = tmp.path();
    let port = ferry_testkit::free_port();
    let site = NginxSite::new(dir, port);
    let content = site.content.clone();
    let master =
        guard.start_via(&["ip", "netns", "exec", &from.0], dir, &site.log, NGINX, &site.args());

    let deadline = Instant::now() + START_TIMEOUT;
    let before = loop {
        guard.assert_root_alive(&site.log);
        let procs = guard.snapshot(&master);
        let want = content.clone();
        let served = from.run(
            move || matches!(http_get(port, "/ferry.txt"), Ok((200, ref body)) if *body == want),
        );
        if served && procs.len() == 3 {
            break procs;
        }
        assert!(
            Instant::now() < deadline,
            "[{TEST}] nginx not ready in {}:\n{}",
            from.0,
            describe_tree(&procs)
        );
        sleep(Duration::from_millis(50));
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while !open_connections_of(master.pid, port).is_empty() {
        assert!(Instant::now() < deadline, "[{TEST}] connections stay open in {}", from.0);
        sleep(Duration::from_millis(20));
    }
    let images = dir.join("images");
    checkpoint_tree(&mut guard, dir, &images, &master, &before);

    // Into the other namespace, and a PID namespace of its own.
    let pidfile = dir.join("restored.pid");
    let run = ferry(
        TEST,
        dir,
        "restore",
        &[
            "restore",
            "--images",
            path_str(&images),
            "--detach",
            "--pidfile",
            path_str(&pidfile),
            "--netns",
            &to.0,
            "--new-pid-ns",
        ],
    );
    let host_root: Option<i32> =
        fs::read_to_string(&pidfile).ok().and_then(|t| t.trim().parse().ok());
    let init = host_root.and_then(read_stat).map(|s| s.ppid);
    if let Some(init) = init.and_then(|p| read_stat(p).map(|s| ProcId { pid: p, start: s.start })) {
        // Killing the init ends its whole namespace.
        guard.roots.push(init);
        guard.snapshot(&init);
    }
    assert!(
        run.status.success(),
        "[{TEST}] restore failed ({}):\n{}",
        describe(run.status),
        run.out.trim()
    );
    eprintln!("[{TEST}] restore: {}; ferry said: {}", timing(&run), run.out.trim());
    let host_root = host_root.expect("pidfile names the root");
    let init_pid = init.expect("the root has a parent");
    assert_eq!(
        read_stat(init_pid).map(|s| s.comm),
        Some("ferry-init".to_string()),
        "[{TEST}] the root's parent is not ferry-init"
    );
    let after = tree(host_root);
    assert_eq!(after.len(), 3, "[{TEST}] restored tree:\n{}", describe_tree(&after));
    for (old, new) in before.iter().zip(&after) {
        assert_eq!(
            innermost_pid(new.id.pid),
            Some(old.id.pid),
            "[{TEST}] {} lost its PID inside the namespace",
            new.cmdline
        );
        assert_eq!(
            inode(&format!("/proc/{}/ns/net", new.id.pid)),
            inode(&to.path()),
            "[{TEST}] {} is not in {}",
            new.cmdline,
            to.0
        );
        assert_eq!(new.uid, old.uid, "[{TEST}] {} changed user", new.cmdline);
    }

    for i in 0..20 {
        let got = to.run(move || http_get(port, "/ferry.txt"));
        let (st, body) =
            got.unwrap_or_else(|e| panic!("[{TEST}] GET {i} in {} after restore: {e}", to.0));
        assert!(
            st == 200 && body == content,
            "[{TEST}] GET {i}: status {st}, {} bytes",
            body.len()
        );
    }
    // The old namespace no longer has the server.
    let old = from.run(move || http_get(port, "/ferry.txt"));
    assert!(old.is_err(), "[{TEST}] {} still serves after the move", from.0);

    // SIGQUIT to the init is forwarded to the master: a graceful stop of
    // the whole tree, and the init exits with the master's status.
    let init_id =
        ProcId { pid: init_pid, start: read_stat(init_pid).map(|s| s.start).unwrap_or(0) };
    let ids: Vec<ProcId> = std::iter::once(init_id).chain(after.iter().map(|p| p.id)).collect();
    signal(&init_id, libc::SIGQUIT);
    match wait_gone(&ids, EXIT_TIMEOUT) {
        Ok(statuses) => {
            if let Some(st) = statuses.get(&init_pid) {
                assert!(st.success(), "[{TEST}] ferry-init exited with {}", describe(*st));
            }
        }
        Err(left) => panic!("[{TEST}] still running after SIGQUIT to ferry-init: {left:?}"),
    }
}

// ---------------------------------------------------------------------------
// postgres

/// SysV shared memory and /dev/shm files of one postgres: removed (if
/// postgres did not) after its processes are gone.
struct IpcGuard {
    name: String,
    /// SysV keys of segments postgres created (from postmaster.pid).
    keys: BTreeSet<i64>,
    /// PIDs of the tree: a segment whose creator is one of them is ours.
    pids: BTreeSet<i32>,
    dev_shm: BTreeSet<PathBuf>,
}

struct ShmRow {
    key: i64,
    shmid: i32,
    cpid: i32,
    nattch: u64,
}

fn sysv_shm() -> Vec<ShmRow> {
    let text = fs::read_to_string("/proc/sysvipc/shm").unwrap_or_default();
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap_or("").split_whitespace().collect();
    let col = |n: &str| header.iter().position(|h| *h == n);
    let (Some(k), Some(id), Some(cp), Some(na)) =
        (col("key"), col("shmid"), col("cpid"), col("nattch"))
    else {
        return Vec::new();
    };
    lines
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Some(ShmRow {
                key: f.get(k)?.parse().ok()?,
                shmid: f.get(id)?.parse().ok()?,
                cpid: f.get(cp)?.parse().ok()?,
                nattch: f.get(na)?.parse().ok()?,
            })
        })
        .collect()
}

impl IpcGuard {
    fn new(name: &str) -> IpcGuard {
        IpcGuard {
            name: name.to_string(),
            keys: BTreeSet::new(),
            pids: BTreeSet::new(),
            dev_shm: BTreeSet::new(),
        }
    }

    /// Records what the running tree holds: the SysV key in postmaster.pid
    /// (line 7: "key shmid"), segments created by its processes, /dev/shm
    /// files it maps.
    fn note(&mut self, data: &Path, procs: &[ProcInfo]) {
        let pidfile = read_lossy(&data.join("postmaster.pid"));
        if let Some(line) = pidfile.lines().nth(6) {
            if let Some(key) = line.split_whitespace().next().and_then(|k| k.parse::<i64>().ok()) {
                if key != 0 {
                    self.keys.insert(key);
                }
            }
        }
        self.pids.extend(procs.iter().map(|p| p.id.pid));
        for row in sysv_shm() {
            if self.pids.contains(&row.cpid) && row.key != 0 {
                self.keys.insert(row.key);
            }
        }
        for p in procs {
            for line in read_lossy(Path::new(&format!("/proc/{}/maps", p.id.pid))).lines() {
                if let Some(i) = line.find("/dev/shm/PostgreSQL.") {
                    let path = line[i..].trim_end_matches(" (deleted)").trim();
                    self.dev_shm.insert(PathBuf::from(path));
                }
            }
        }
    }
}

impl Drop for IpcGuard {
    fn drop(&mut self) {
        for row in sysv_shm() {
            let ours = self.keys.contains(&row.key) || self.pids.contains(&row.cpid);
            if ours && row.nattch == 0 {
                eprintln!(
                    "[{}] removing SysV shm segment key {} id {} left by postgres",
                    self.name, row.key, row.shmid
                );
                ferry_testkit::remove_shm(row.shmid);
            }
        }
        for f in &self.dev_shm {
            if f.exists() {
                eprintln!("[{}] removing {} left by postgres", self.name, f.display());
                let _ = fs::remove_file(f);
            }
        }
    }
}

/// (uid, gid) of a user from /etc/passwd.
fn user_ids(user: &str) -> Option<(u32, u32)> {
    let text = fs::read_to_string("/etc/passwd").ok()?;
    let line = text.lines().find(|l| l.split(':').next() == Some(user))?;
    let f: Vec<&str> = line.split(':').collect();
    Some((f.get(2)?.parse().ok()?, f.get(3)?.parse().ok()?))
}

fn as_postgres(program: &str) -> Command {
    let mut cmd = Command::new(SETPRIV);
    cmd.args(["--reuid=postgres", "--regid=postgres", "--init-groups", "--"]).arg(program);
    cmd
}

fn psql(name: &str, sock: &Path, port: u16, sql: &str) -> Result<String, String> {
    let mut cmd = Command::new(PSQL);
    cmd.args(["-X", "-A", "-t", "-q", "-v", "ON_ERROR_STOP=1", "-h", path_str(sock), "-p"])
        .arg(port.to_string())
        .args(["-U", "postgres", "-d", "postgres", "-c", sql])
        .env("PGCONNECT_TIMEOUT", "10")
        .env_remove("PGPASSWORD")
        .env_remove("PGSERVICE");
    let (status, out) = run_bounded(cmd, &format!("{name} psql"), Duration::from_secs(60));
    if status.success() {
        Ok(out.trim().to_string())
    } else {
        Err(format!("psql -c {sql:?}: {}: {}", describe(status), out.trim()))
    }
}

const PG_ROWS: i64 = 10_000;
const PG_MORE: i64 = 500;
const PG_CHECK: &str =
    "select count(*) || ' ' || sum(id) || ' ' || md5(string_agg(payload, ',' order by id)) from ferry_rows";

/// Waits until the postmaster's children are only its background processes
/// (no client backend, no autovacuum worker) and stable for a second.
fn wait_pg_idle(guard: &mut TreeGuard, root: &ProcId) -> Vec<ProcInfo> {
    let name = guard.name.clone();
    let deadline = Instant::now() + START_TIMEOUT;
    let mut last: Option<(Vec<i32>, Instant)> = None;
    loop {
        let procs = guard.snapshot(root);
        let busy: Vec<&ProcInfo> = procs[1..]
            .iter()
            .filter(|p| {
                !p.cmdline.starts_with("postgres: ")
                    || p.cmdline.contains("[local]")
                    || p.cmdline.contains("worker")
            })
            .collect();
        let pids: Vec<i32> = procs.iter().map(|p| p.id.pid).collect();
        if busy.is_empty() {
            match &last {
                Some((prev, since)) if *prev == pids => {
                    if since.elapsed() >= Duration::from_secs(1) {
                        return procs;
                    }
                }
                _ => last = Some((pids, Instant::now())),
            }
        } else {
            last = None;
        }
        assert!(
            Instant::now() < deadline,
            "[{name}] postgres did not settle to its background processes:\n{}",
            describe_tree(&procs)
        );
        sleep(Duration::from_millis(50));
    }
}

#[test]
fn postgres_rows_survive_restore() {
    const TEST: &str = "postgres";
    let postgres = format!("{PG_BIN}/postgres");
    let initdb = format!("{PG_BIN}/initdb");
    if !prerequisites(TEST, &[&postgres, &initdb, PSQL, SETPRIV]) {
        return;
    }
    let Some((pg_uid, pg_gid)) = user_ids("postgres") else {
        eprintln!("SKIPPED {TEST}: no user postgres (run scripts/install-deps.sh)");
        return;
    };
    // Locals drop in reverse order: the processes first, then their IPC
    // leftovers, then the directory.
    let tmp = TempDir::new("ferry-trees", TEST);
    let mut ipc = IpcGuard::new(TEST);
    let mut guard = TreeGuard::new(TEST);
    let dir = tmp.path();
    let data = dir.join("data");
    let sock = dir.join("sock");
    for (p, mode) in [(&data, 0o700), (&sock, 0o755)] {
        fs::create_dir_all(p).unwrap_or_else(|e| panic!("create {}: {e}", p.display()));
        std::os::unix::fs::chown(p, Some(pg_uid), Some(pg_gid))
            .unwrap_or_else(|e| panic!("chown {}: {e}", p.display()));
        fs::set_permissions(p, fs::Permissions::from_mode(mode))
            .unwrap_or_else(|e| panic!("chmod {}: {e}", p.display()));
    }

    let t0 = Instant::now();
    let mut cmd = as_postgres(&initdb);
    cmd.args([
        "-D",
        path_str(&data),
        "-U",
        "postgres",
        "--auth=trust",
        "--no-sync",
        "-E",
        "UTF8",
        "--locale=C",
    ])
    .current_dir(dir)
    .env("LC_ALL", "C");
    let (status, out) = run_bounded(cmd, "initdb", CMD_TIMEOUT);
    assert!(status.success(), "[{TEST}] initdb failed ({}):\n{out}", describe(status));
    eprintln!("[{TEST}] initdb in {:?}", t0.elapsed());

    let port = ferry_testkit::free_port();
    let port_s = port.to_string();
    let log = dir.join("postgres.log");
    let master = guard.start(
        dir,
        &log,
        SETPRIV,
        &[
            "--reuid=postgres",
            "--regid=postgres",
            "--init-groups",
            "--",
            &postgres,
            "-D",
            path_str(&data),
            "-k",
            path_str(&sock),
            "-p",
            &port_s,
            "-c",
            "listen_addresses=",
            "-c",
            &format!("unix_socket_directories={}", path_str(&sock)),
        ],
    );
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        guard.assert_root_alive(&log);
        if psql(TEST, &sock, port, "select 1").as_deref() == Ok("1") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "[{TEST}] postgres not ready within {START_TIMEOUT:?}; log:\n{}",
            read_lossy(&log)
        );
        sleep(Duration::from_millis(100));
    }
    let procs = guard.snapshot(&master);
    ipc.note(&data, &procs);
    eprintln!(
        "[{TEST}] postgres on {}/.s.PGSQL.{port}; SysV keys {:?}, /dev/shm {:?}",
        sock.display(),
        ipc.keys,
        ipc.dev_shm
    );

    let setup = format!(
        "create table ferry_rows(id int primary key, payload text not null);
         insert into ferry_rows select i, md5(i::text) || repeat(chr(97 + i % 26), i % 50) from generate_series(1, {PG_ROWS}) i;
         create table ferry_marker(k text primary key, v text not null);
         insert into ferry_marker values ('marker', 'ferry-marker-{port}');"
    );
    psql(TEST, &sock, port, &setup).unwrap_or_else(|e| panic!("[{TEST}] setup: {e}"));
    let check_before =
        psql(TEST, &sock, port, PG_CHECK).unwrap_or_else(|e| panic!("[{TEST}] check: {e}"));
    assert!(
        check_before.starts_with(&format!("{PG_ROWS} {} ", PG_ROWS * (PG_ROWS + 1) / 2)),
        "[{TEST}] unexpected check before checkpoint: {check_before}"
    );
    let started_at = psql(TEST, &sock, port, "select pg_postmaster_start_time()")
        .unwrap_or_else(|e| panic!("[{TEST}] {e}"));
    let checkpointer_pid = psql(
        TEST,
        &sock,
        port,
        "select pid from pg_stat_activity where backend_type = 'checkpointer'",
    )
    .unwrap_or_else(|e| panic!("[{TEST}] {e}"));
    eprintln!("[{TEST}] wrote {PG_ROWS} rows: {check_before}; started {started_at}; checkpointer {checkpointer_pid}");

    // Every psql has exited (run_bounded waited); wait for the backends too.
    let before = wait_pg_idle(&mut guard, &master);
    ipc.note(&data, &before);
    eprintln!("[{TEST}] idle tree:\n{}", describe_tree(&before));

    let images = dir.join("images");
    checkpoint_tree(&mut guard, dir, &images, &master, &before);
    assert!(
        psql(TEST, &sock, port, "select 1").is_err(),
        "[{TEST}] postgres still answers after the checkpoint"
    );

    let (root, after) = restore_tree(&mut guard, dir, &images, &before);
    ipc.note(&data, &after);
    assert_same_tree(TEST, &before, &after);
    eprintln!("[{TEST}] restored tree:\n{}", describe_tree(&after));

    let check_after = psql(TEST, &sock, port, PG_CHECK)
        .unwrap_or_else(|e| panic!("[{TEST}] read after restore: {e}\nlog:\n{}", read_lossy(&log)));
    assert_eq!(check_after, check_before, "[{TEST}] rows differ after restore");
    let marker = psql(TEST, &sock, port, "select v from ferry_marker where k = 'marker'")
        .unwrap_or_else(|e| panic!("[{TEST}] {e}"));
    assert_eq!(marker, format!("ferry-marker-{port}"));
    let started_after = psql(TEST, &sock, port, "select pg_postmaster_start_time()")
        .unwrap_or_else(|e| panic!("[{TEST}] {e}"));
    assert_eq!(
        started_after, started_at,
        "[{TEST}] the server restarted instead of being restored"
    );
    let checkpointer_after = psql(
        TEST,
        &sock,
        port,
        "select pid from pg_stat_activity where backend_type = 'checkpointer'",
    )
    .unwrap_or_else(|e| panic!("[{TEST}] {e}"));
    assert_eq!(checkpointer_after, checkpointer_pid, "[{TEST}] checkpointer PID differs");

    let more = format!(
        "insert into ferry_rows select i, 'after-restore-' || i from generate_series({}, {}) i",
        PG_ROWS + 1,
        PG_ROWS + PG_MORE
    );
    psql(TEST, &sock, port, &more).unwrap_or_else(|e| panic!("[{TEST}] insert after restore: {e}"));
    let total = PG_ROWS + PG_MORE;
    let counted = psql(TEST, &sock, port, "select count(*) || ' ' || sum(id) from ferry_rows")
        .unwrap_or_else(|e| panic!("[{TEST}] {e}"));
    assert_eq!(
        counted,
        format!("{total} {}", total * (total + 1) / 2),
        "[{TEST}] rows after INSERT"
    );
    let last =
        psql(TEST, &sock, port, &format!("select payload from ferry_rows where id = {total}"))
            .unwrap_or_else(|e| panic!("[{TEST}] {e}"));
    assert_eq!(last, format!("after-restore-{total}"));
    eprintln!("[{TEST}] rows read back and {PG_MORE} more inserted after restore");

    // Fast shutdown of the restored tree.
    let after_idle = wait_pg_idle(&mut guard, &root);
    ipc.note(&data, &after_idle);
    let status = stop_tree(&mut guard, &root, libc::SIGINT);
    if let Some(st) = status {
        assert!(
            st.success(),
            "[{TEST}] postmaster exited with {} after SIGINT; log:\n{}",
            describe(st),
            read_lossy(&log)
        );
    }
    let leftover: Vec<i64> =
        sysv_shm().iter().filter(|r| ipc.keys.contains(&r.key)).map(|r| r.key).collect();
    if !leftover.is_empty() {
        eprintln!("[{TEST}] note: SysV segments {leftover:?} left after shutdown (the guard removes them)");
    }
}

// ---------------------------------------------------------------------------
// shell pipeline

/// Copies stdin to stdout in 64 KiB chunks, sleeping after each, and reports
/// its progress on stderr.
const THROTTLE_PY: &str = r#"
import os, sys, time
delay = float(sys.argv[1])
total = 0
chunks = 0
while True:
    b = os.read(0, 65536)
    if not b:
        break
    mv = memoryview(b)
    while mv:
        n = os.write(1, mv)
        mv = mv[n:]
    total += len(b)
    chunks += 1
    if chunks % 16 == 0:
        os.write(2, b"progress %d\n" % total)
    time.sleep(delay)
os.write(2, b"done %d\n" % total)
"#;

const PIPE_BYTES: u64 = 48_000_000;
const PIPE_DELAY: &str = "0.003";

fn pipeline_script(throttle: &Path, out: &Path) -> String {
    format!(
        "yes ferry-line | head -c {PIPE_BYTES} | {PYTHON} {} {PIPE_DELAY} | tr a-z A-Z | sha256sum > {}",
        path_str(throttle),
        path_str(out)
    )
}

fn last_progress(log: &Path) -> u64 {
    read_lossy(log)
        .lines()
        .filter_map(|l| l.strip_prefix("progress ").and_then(|n| n.trim().parse().ok()))
        .max()
        .unwrap_or(0)
}

#[test]
fn shell_pipeline_output_matches_uninterrupted_run() {
    const TEST: &str = "pipeline";
    if !prerequisites(
        TEST,
        &["/bin/sh", PYTHON, "/usr/bin/yes", "/usr/bin/head", "/usr/bin/tr", "/usr/bin/sha256sum"],
    ) {
        return;
    }
    let tmp = TempDir::new("ferry-trees", TEST);
    let mut guard = TreeGuard::new(TEST);
    let dir = tmp.path();
    let throttle = dir.join("throttle.py");
    fs::write(&throttle, THROTTLE_PY).expect("write throttle.py");

    // 1. Uninterrupted run: the expected output and how long it takes.
    let expected_out = dir.join("expected.out");
    let log0 = dir.join("uninterrupted.log");
    let t0 = Instant::now();
    let first =
        guard.start(dir, &log0, "/bin/sh", &["-c", &pipeline_script(&throttle, &expected_out)]);
    let mut child = guard.root_child.take().expect("started child");
    let status = wait_child(&mut child, CMD_TIMEOUT);
    let took = t0.elapsed();
    let Some(status) = status else {
        guard.root_child = Some(child);
        panic!("[{TEST}] uninterrupted pipeline did not finish within {CMD_TIMEOUT:?}");
    };
    guard.roots.retain(|r| *r != first);
    assert!(
        status.success(),
        "[{TEST}] uninterrupted pipeline: {}; log:\n{}",
        describe(status),
        read_lossy(&log0)
    );
    let expected = fs::read(&expected_out).expect("read expected output");
    assert!(expected.len() > 64, "[{TEST}] odd expected output {expected:?}");
    assert!(
        read_lossy(&log0).contains(&format!("done {PIPE_BYTES}")),
        "[{TEST}] log:\n{}",
        read_lossy(&log0)
    );
    eprintln!(
        "[{TEST}] uninterrupted run took {took:?}: {}",
        String::from_utf8_lossy(&expected).trim()
    );
    assert!(
        took >= Duration::from_millis(1000),
        "[{TEST}] the pipeline ran in {took:?}: too fast to be caught mid-way"
    );

    // 2. The same pipeline, checkpointed at about a quarter of the data.
    let out = dir.join("restored.out");
    let log = dir.join("pipeline.log");
    let root = guard.start(dir, &log, "/bin/sh", &["-c", &pipeline_script(&throttle, &out)]);
    let deadline = Instant::now() + START_TIMEOUT;
    while last_progress(&log) < PIPE_BYTES / 4 {
        guard.assert_root_alive(&log);
        assert!(Instant::now() < deadline, "[{TEST}] no progress; log:\n{}", read_lossy(&log));
        sleep(Duration::from_millis(5));
    }
    let before = guard.snapshot(&root);
    let comms: Vec<&str> = before.iter().map(|p| p.comm.as_str()).collect();
    assert_eq!(
        comms.len(),
        6,
        "[{TEST}] expected sh and 5 pipeline processes, got:\n{}",
        describe_tree(&before)
    );
    assert!(
        before[1..].iter().all(|p| p.ppid == root.pid),
        "[{TEST}] tree:\n{}",
        describe_tree(&before)
    );
    let images = dir.join("images");
    checkpoint_tree(&mut guard, dir, &images, &root, &before);
    let at = last_progress(&log);
    eprintln!("[{TEST}] checkpointed at {at} of {PIPE_BYTES} bytes through the throttle");
    assert!(
        at < PIPE_BYTES && !read_lossy(&log).contains("done "),
        "[{TEST}] the pipeline had finished before the checkpoint; log:\n{}",
        read_lossy(&log)
    );
    assert_eq!(
        fs::metadata(&out).map(|m| m.len()).unwrap_or(0),
        0,
        "[{TEST}] output written before the end"
    );

    let (root2, after) = restore_tree(&mut guard, dir, &images, &before);
    assert_same_tree(TEST, &before, &after);
    let ids: Vec<ProcId> = after.iter().map(|p| p.id).collect();
    let statuses = wait_gone(&ids, CMD_TIMEOUT).unwrap_or_else(|left| {
        panic!(
            "[{TEST}] restored pipeline did not finish within {CMD_TIMEOUT:?}; left: {left:?}; log:\n{}",
            read_lossy(&log)
        )
    });
    if let Some(st) = statuses.get(&root2.pid) {
        assert!(
            st.success(),
            "[{TEST}] restored sh exited with {}; log:\n{}",
            describe(*st),
            read_lossy(&log)
        );
    }
    let got = fs::read(&out).unwrap_or_default();
    assert!(
        got == expected,
        "[{TEST}] output after restore differs:\n got: {:?}\nwant: {:?}\nlog:\n{}",
        String::from_utf8_lossy(&got),
        String::from_utf8_lossy(&expected),
        read_lossy(&log)
    );
    assert!(
        read_lossy(&log).contains(&format!("done {PIPE_BYTES}")),
        "[{TEST}] log:\n{}",
        read_lossy(&log)
    );
    eprintln!("[{TEST}] restored pipeline finished with the expected output");
}
