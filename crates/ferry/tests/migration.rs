//! Live migration between test hosts (tests/common/cluster.rs): ferryd is
//! PID 1 of each host (with its own /run/ferry tmpfs and bpffs, as
//! docs/migration.md describes), `ferry migrate` runs inside the source
//! host, clients run in a third host, c.
//!
//! - `conformance_programs_migrate_between_hosts`: every C program of
//!   tests/conformance/ moves from a to b and, woken there, prints PASS.
//! - `redis_under_load_migrates_there_and_back`, `nginx_under_load_...`:
//!   a benchmark from c runs through a migration a→b and one b→a of the
//!   server with its service address, without a single failed request.
//! - `fault_*`: a migration that fails (destination killed, link cut,
//!   stream corrupted, restore failing, wrong key) leaves the service
//!   running at the source with its connections and address, and no
//!   network lock on either host.
//!
//! Needs root; without it every test says so and returns. Set
//! `FERRY_MIGRATION_KEEP=1` to keep each test's directory (logs, reports).

mod common;

use common::cluster::{Cluster, Host};
use std::fs::{self, File};
use std::io::{BufRead, BufReader, Write};
use std::net::{Ipv4Addr, SocketAddr};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const FERRY: &str = env!("CARGO_BIN_EXE_ferry");
const FERRYD: &str = env!("CARGO_BIN_EXE_ferryd");
const REDIS: &str = "/usr/bin/redis-server";
const NGINX: &str = "/usr/sbin/nginx";
const AGENT_PORT: u16 = 7070;
/// A host init that is not ferryd (host c): reaps orphans.
const PLAIN_INIT: &[&str] = &["sh", "-c", "trap : TERM; while :; do wait; sleep 0.2; done"];
/// Upper bound for one `ferry migrate` (it is SIGKILLed after it).
const MIGRATE_LIMIT_S: u32 = 60;

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn have(test: &str, programs: &[&str]) -> bool {
    if !is_root() {
        eprintln!("[{test}] skipped: needs root");
        return false;
    }
    for p in programs {
        let found = if p.starts_with('/') {
            Path::new(p).exists()
        } else {
            Command::new("sh").args(["-c", &format!("command -v {p}")]).stdout(Stdio::null()).status().map(|s| s.success()).unwrap_or(false)
        };
        if !found {
            eprintln!("[{test}] skipped: {p} is not installed");
            return false;
        }
    }
    true
}

fn read_lossy(p: &Path) -> String {
    String::from_utf8_lossy(&fs::read(p).unwrap_or_default()).into_owned()
}

fn path_str(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

fn alive(pid: i32) -> bool {
    // A zombie is not alive: its init reaps it soon.
    fs::read_to_string(format!("/proc/{pid}/stat")).map(|s| s.rsplit(')').next().map_or(false, |r| !r.trim_start().starts_with('Z'))).unwrap_or(false)
}

/// The state letter of `pid` (R, S, T, ...), None when gone.
fn state(pid: i32) -> Option<char> {
    let s = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    s.rsplit(')').next()?.trim_start().chars().next()
}

fn kill(pid: i32, sig: i32) -> bool {
    // SAFETY: kill(2) on a process this test started (or migrated).
    unsafe { libc::kill(pid, sig) == 0 }
}

fn wait_timeout(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(Some(st)) = child.try_wait() {
            return Some(st);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Polls `f` every 10 ms until it is true or `timeout` passed.
fn wait_for(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
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

/// The child starts with only fds 0-2 (cargo's jobserver pipe and the
/// test harness's fds stay out of the programs, and so out of the images).
fn only_stdio(cmd: &mut Command) -> &mut Command {
    // SAFETY: only close_range(2), async-signal-safe, between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32);
            Ok(())
        })
    }
}

fn describe(st: &ExitStatus) -> String {
    match (st.code(), st.signal()) {
        (Some(c), _) => format!("exit code {c}"),
        (None, Some(s)) => format!("signal {s}"),
        _ => format!("{st}"),
    }
}

struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        static N: AtomicU32 = AtomicU32::new(0);
        let d = std::env::temp_dir().join(format!("ferry-mig-{tag}-{}-{}", std::process::id(), N.fetch_add(1, Ordering::SeqCst)));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).expect("temp dir");
        // nginx workers (user nobody) read below it.
        fs::set_permissions(&d, fs::Permissions::from_mode(0o755)).expect("chmod temp dir");
        TempDir(d)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if std::env::var_os("FERRY_MIGRATION_KEEP").is_some() {
            eprintln!("kept {}", self.0.display());
        } else {
            let _ = fs::remove_dir_all(&self.0);
        }
    }
}

/// How a command run inside a host ended.
struct Out {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

impl Out {
    fn show(&self) -> String {
        format!("{}\n--- stdout ---\n{}--- stderr ---\n{}", describe(&self.status), self.stdout, self.stderr)
    }
}

fn output(mut cmd: Command) -> Out {
    let o = only_stdio(&mut cmd).stdin(Stdio::null()).output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    Out { status: o.status, stdout: String::from_utf8_lossy(&o.stdout).into_owned(), stderr: String::from_utf8_lossy(&o.stderr).into_owned() }
}

/// `argv` in `host`, killed after `limit_s` seconds.
fn run_in(host: &Host, limit_s: u32, argv: &[&str]) -> Out {
    let limit = limit_s.to_string();
    let mut full = vec!["timeout", "-s", "KILL", limit.as_str()];
    full.extend_from_slice(argv);
    output(host.command(&full))
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("run ip");
    assert!(out.status.success(), "ip {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// The IPv4 addresses (with prefix) on `host`'s eth0.
fn addresses(host: &Host) -> Vec<String> {
    let out = Command::new("ip").args(["-n", &host.netns, "-o", "-4", "addr", "show", "dev", &host.ifname]).output().expect("ip addr");
    String::from_utf8_lossy(&out.stdout).split_whitespace().skip_while(|w| *w != "inet").filter(|w| w.contains('/')).map(String::from).collect()
}

/// (name, owner) of every network lock `ferry network-lock --status` lists
/// inside `host` (its own /run/ferry).
fn host_locks(host: &Host) -> Vec<(String, String)> {
    let out = run_in(host, 20, &[FERRY, "network-lock", "--status"]);
    assert!(out.status.success(), "ferry network-lock --status in {}: {}", host.name, out.show());
    common::parse_network_locks(&out.stdout)
}

// ---------------------------------------------------------------------------
// A cluster with ferryd on some hosts

struct Env {
    c: Cluster,
    dir: TempDir,
    key: PathBuf,
}

impl Env {
    /// Hosts `names`; ferryd is started on none yet.
    fn new(tag: &str, names: &[&str]) -> Env {
        let dir = TempDir::new(tag);
        let key = dir.0.join("key");
        let out = output({
            let mut c = Command::new(FERRY);
            c.arg("keygen").arg(&key);
            c
        });
        assert!(out.status.success(), "ferry keygen: {}", out.show());
        Env { c: Cluster::new(names), dir, key }
    }

    fn host(&self, name: &str) -> &Host {
        self.c.host(name)
    }

    fn agent(&self, name: &str) -> SocketAddr {
        SocketAddr::new(self.host(name).ip.into(), AGENT_PORT)
    }

    fn ferryd_log(&self, name: &str) -> PathBuf {
        self.dir.0.join(format!("ferryd-{name}.log"))
    }

    /// (Re)starts ferryd as the init of host `name`, with `env` in its
    /// environment and `args` after the usual ones; waits until it listens.
    fn start_ferryd(&self, name: &str, env: &[(&str, &str)], args: &[&str]) {
        let h = self.host(name);
        let log = self.ferryd_log(name);
        let listen = self.agent(name).to_string();
        let script = "mkdir -p /run/ferry && mount -t tmpfs tmpfs /run/ferry && mount -t bpf bpf /sys/fs/bpf && log=$1 && shift && exec \"$@\" >>\"$log\" 2>&1";
        let mut argv: Vec<String> = vec!["sh".into(), "-c".into(), script.into(), "ferryd-init".into(), path_str(&log).into(), "env".into()];
        argv.extend(env.iter().map(|(k, v)| format!("{k}={v}")));
        argv.extend([FERRYD, "--listen", &listen, "--key", path_str(&self.key)].map(String::from));
        argv.extend(args.iter().map(|s| s.to_string()));
        let before = read_lossy(&log).matches("ferryd listening").count();
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        h.stop_init();
        h.start_init(&argv);
        assert!(
            wait_for(Duration::from_secs(15), || read_lossy(&log).matches("ferryd listening").count() > before),
            "ferryd on {name} does not listen:\n{}",
            read_lossy(&log)
        );
    }

    fn start_plain(&self, name: &str) {
        self.host(name).start_init(PLAIN_INIT);
    }

    /// `ferry migrate` of `pid` (as host `from` sees it) to host `to`'s
    /// agent, run inside `from`.
    fn migrate(&self, from: &str, pid: i32, to: SocketAddr, extra: &[&str]) -> Migration {
        let cmd = self.migrate_cmd(from, pid, to, extra);
        let report = cmd.1.clone();
        let t = Instant::now();
        let out = output(cmd.0);
        Migration::new(out, &report, t.elapsed())
    }

    fn migrate_cmd(&self, from: &str, pid: i32, to: SocketAddr, extra: &[&str]) -> (Command, PathBuf) {
        static N: AtomicU32 = AtomicU32::new(0);
        let report = self.dir.0.join(format!("report-{}.json", N.fetch_add(1, Ordering::SeqCst)));
        let limit = MIGRATE_LIMIT_S.to_string();
        let (pid, to) = (pid.to_string(), to.to_string());
        let mut argv = vec!["timeout", "-s", "KILL", &limit, FERRY, "migrate", "--pid", &pid, "--to", &to, "--key", path_str(&self.key), "--report", path_str(&report)];
        argv.extend_from_slice(extra);
        (self.host(from).command(&argv), report)
    }
}

struct Migration {
    out: Out,
    report: Option<serde_json::Value>,
    took: Duration,
}

impl Migration {
    fn new(out: Out, report: &Path, took: Duration) -> Migration {
        let report = fs::read(report).ok().and_then(|b| serde_json::from_slice(&b).ok());
        Migration { out, report, took }
    }

    fn ok(&self) -> bool {
        self.out.status.success() && self.report.is_some()
    }

    /// The moved root's PID as the destination host sees it.
    fn dest_host_pid(&self) -> i32 {
        let r = self.report.as_ref().unwrap_or_else(|| panic!("no report: {}", self.out.show()));
        r["dest_host_pid"].as_i64().unwrap_or_else(|| panic!("no dest_host_pid in {r}")) as i32
    }

    fn pause_ms(&self) -> f64 {
        self.report.as_ref().and_then(|r| r["pause_ms"].as_f64()).unwrap_or(f64::NAN)
    }

    /// Asserts success and returns the root's PID in the destination host.
    fn expect_ok(&self, what: &str) -> i32 {
        assert!(self.ok(), "{what}: ferry migrate failed: {}", self.out.show());
        assert!(self.out.stdout.contains("migrated pid"), "{what}: {}", self.out.show());
        self.dest_host_pid()
    }
}

/// A process started inside a host: the nsenter `Child` and its PIDs.
struct Started {
    nsenter: Child,
    root: i32,
    inner: i32,
}

fn start_in(host: &Host, argv: &[&str], cwd: &Path, log: &Path, env: &[(&str, &str)]) -> Started {
    let logf = File::create(log).expect("program log");
    let mut cmd = host.command(argv);
    cmd.current_dir(cwd).stdin(Stdio::null()).stdout(logf.try_clone().expect("dup log")).stderr(logf);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let nsenter = only_stdio(&mut cmd).spawn().unwrap_or_else(|e| panic!("start {argv:?} in {}: {e}", host.name));
    let (root, inner) = host.wait_spawned_pid(&nsenter);
    Started { nsenter, root, inner }
}

// ---------------------------------------------------------------------------
// 1. The conformance programs, a → b

/// Programs that cannot move between two test hosts, and why.
const NOT_MIGRATABLE: &[(&str, &str)] = &[(
    "fd_locks",
    "its flock and POSIX locks stay held by the source's frozen copy until Commit, and test hosts share one kernel (one lock table), so the \
     destination cannot take them while the source holds them; two machines have a lock table each",
)];

struct Failure {
    name: String,
    stage: String,
    msg: String,
    ferry: String,
    log: String,
}

#[test]
fn conformance_programs_migrate_between_hosts() {
    const TEST: &str = "conformance";
    if !have(TEST, &["gcc"]) {
        return;
    }
    let only = std::env::var("FERRY_MIGRATION_ONLY").ok();
    let names: Vec<String> = common::conformance::programs()
        .into_iter()
        .filter(|n| only.as_deref().map_or(true, |o| o.split(',').any(|x| x == n)))
        .collect();
    // Compile on two threads while the hosts come up.
    let (tx, rx) = mpsc::channel();
    let compiler = {
        let names = names.clone();
        std::thread::spawn(move || {
            let names = std::sync::Arc::new(std::sync::Mutex::new(names.into_iter()));
            let workers: Vec<_> = (0..2)
                .map(|_| {
                    let (names, tx) = (names.clone(), tx.clone());
                    std::thread::spawn(move || loop {
                        let Some(n) = names.lock().unwrap().next() else { break };
                        let bin = std::panic::catch_unwind(|| common::conformance::compile(&n)).map_err(|e| {
                            e.downcast_ref::<String>().cloned().or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_default()
                        });
                        let _ = tx.send((n, bin));
                    })
                })
                .collect();
            for w in workers {
                let _ = w.join();
            }
        })
    };
    let env = Env::new("conf", &["a", "b"]);
    env.start_ferryd("a", &[], &[]);
    env.start_ferryd("b", &[], &[]);
    let mut bins = std::collections::HashMap::new();
    for (n, bin) in rx.iter() {
        bins.insert(n, bin);
    }
    compiler.join().expect("compiler thread");

    let t0 = Instant::now();
    let mut failures: Vec<Failure> = Vec::new();
    let mut skipped = Vec::new();
    let mut pauses = Vec::new();
    for name in &names {
        if let Some((_, why)) = NOT_MIGRATABLE.iter().find(|(n, _)| n == name) {
            skipped.push(format!("{name}: {why}"));
            continue;
        }
        let bin = match &bins[name] {
            Ok(b) => b.clone(),
            Err(e) => {
                failures.push(Failure { name: name.clone(), stage: "compile".into(), msg: e.clone(), ferry: String::new(), log: String::new() });
                continue;
            }
        };
        match migrate_program(&env, name, &bin) {
            Ok(ms) => pauses.push((name.clone(), ms)),
            Err(f) => {
                eprintln!("[{TEST}] {name}: FAILED at {}: {}", f.stage, f.msg);
                failures.push(f);
                // Whatever the program left (in a, in b) goes with fresh hosts.
                env.start_ferryd("a", &[], &[]);
                env.start_ferryd("b", &[], &[]);
            }
        }
    }
    pauses.sort_by(|x, y| y.1.total_cmp(&x.1));
    eprintln!(
        "[{TEST}] {} programs migrated in {:.1} s, {} failed, {} skipped; longest pauses: {:?}",
        pauses.len(),
        t0.elapsed().as_secs_f64(),
        failures.len(),
        skipped.len(),
        &pauses[..pauses.len().min(5)]
    );
    for s in &skipped {
        eprintln!("[{TEST}] skipped {s}");
    }
    if !failures.is_empty() {
        let mut text = String::new();
        for f in &failures {
            text += &format!(
                "=== {} failed at {}: {}\n--- ferry migrate ---\n{}\n--- program log ---\n{}\n",
                f.name, f.stage, f.msg, f.ferry, f.log
            );
        }
        text += &format!("--- ferryd a ---\n{}\n--- ferryd b ---\n{}\n", read_lossy(&env.ferryd_log("a")), read_lossy(&env.ferryd_log("b")));
        let names: Vec<&str> = failures.iter().map(|f| f.name.as_str()).collect();
        panic!("{} of {} conformance programs failed to migrate: {names:?}\n{text}", failures.len(), names.len() + pauses.len());
    }
}

/// One program: start in a, READY, migrate to b, SIGUSR2 there, PASS.
/// Returns the pause in ms.
fn migrate_program(env: &Env, name: &str, bin: &Path) -> Result<f64, Failure> {
    let work = env.dir.0.join(name);
    fs::create_dir_all(&work).expect("work dir");
    let log = env.dir.0.join(format!("{name}.log"));
    let (a, b) = (env.host("a"), env.host("b"));
    let fail = |stage: &str, msg: String, ferry: String| Failure { name: name.into(), stage: stage.into(), msg, ferry, log: read_lossy(&log) };
    let w = path_str(&work);
    let mut p = start_in(a, &[path_str(bin)], &work, &log, &[("FERRY_TEST_DIR", w), ("FERRY_EXPECT_RESTORE", "1")]);
    let has_line = |l: &str| read_lossy(&log).lines().any(|x| x == l);
    if !wait_for(Duration::from_secs(15), || has_line("READY") || !alive(p.root)) || !has_line("READY") {
        kill(p.root, libc::SIGKILL);
        let _ = p.nsenter.wait();
        return Err(fail("startup", "no READY within 15 s".into(), String::new()));
    }
    let m = env.migrate("a", p.inner, env.agent("b"), &[]);
    let ferry = m.out.show();
    if !m.ok() {
        kill(p.root, libc::SIGKILL);
        let _ = wait_timeout(&mut p.nsenter, Duration::from_secs(10));
        return Err(fail("migrate", "ferry migrate failed".into(), ferry));
    }
    // The source's copy is gone (SIGKILL after Running).
    match wait_timeout(&mut p.nsenter, Duration::from_secs(10)) {
        Some(st) if st.signal() == Some(libc::SIGKILL) || st.code() == Some(128 + libc::SIGKILL) => {}
        Some(st) => return Err(fail("source", format!("the source's copy ended with {}", describe(&st)), ferry)),
        None => {
            kill(p.root, libc::SIGKILL);
            return Err(fail("source", "the source's copy still runs after the migration".into(), ferry));
        }
    }
    let inner = m.dest_host_pid();
    let Some(root) = b.root_pid(inner) else {
        return Err(fail("destination", format!("no process {inner} in b"), ferry));
    };
    if !kill(root, libc::SIGUSR2) {
        return Err(fail("wakeup", format!("kill({root}, SIGUSR2): {}", std::io::Error::last_os_error()), ferry));
    }
    let done = |l: &str| l == "PASS" || l.starts_with("FAIL");
    if !wait_for(Duration::from_secs(30), || read_lossy(&log).lines().any(done) || !alive(root)) {
        kill(root, libc::SIGKILL);
        return Err(fail("check", "neither PASS nor FAIL within 30 s of SIGUSR2".into(), ferry));
    }
    // Let it finish (and its children); then the log is complete.
    if !wait_for(Duration::from_secs(15), || !alive(root)) {
        kill(root, libc::SIGKILL);
        return Err(fail("check", "still running 15 s after its checks".into(), ferry));
    }
    let text = read_lossy(&log);
    if text.contains("FAIL") || !text.lines().any(|l| l == "PASS") {
        return Err(fail("check", "the program did not PASS at the destination".into(), ferry));
    }
    Ok(m.pause_ms())
}
