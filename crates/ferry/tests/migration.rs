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
//!   network lock on either host; `fault_link_cut_during_precopy_...`:
//!   a link cut in round 0 is seen within 6 s.
//! - `hello_*`, `dry_run_...`, `haproxy_...`: what only the destination
//!   can refuse (an address it lacks, a port taken there, PIDs above its
//!   pid_max, IPv6 disabled there) is refused in the hello, before any
//!   freeze: a watcher polls the service every millisecond for a stop,
//!   and it keeps counting.
//!
//! Needs root; without it every test says so and returns. Set
//! `FERRY_TEST_KEEP=1` to keep each test's directory (logs, reports);
//! `FERRY_MIGRATION_ONLY=a,b` runs only those conformance programs and
//! `FERRY_MIGRATION_ARGS` adds arguments to their `ferry migrate`.

mod common;

use common::hosts::*;
use common::{path_str, read_lossy, wait_for};
use ferry_testkit::kill;
use std::fs::{self, File};
use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const REDIS: &str = "/usr/bin/redis-server";
const NGINX: &str = "/usr/sbin/nginx";
const HAPROXY: &str = "/usr/sbin/haproxy";
/// Upper bound for one `ferry migrate` (it is SIGKILLed after it).
const MIGRATE_LIMIT_S: u32 = 60;

impl Env {
    /// `ferry migrate` of `pid` (as host `from` sees it) to host `to`'s
    /// agent, run inside `from`.
    fn migrate(&self, from: &str, pid: i32, to: SocketAddr, extra: &[&str]) -> Migration {
        let cmd = self.migrate_cmd(from, pid, to, extra);
        let report = cmd.1.clone();
        let t = Instant::now();
        let out = output(cmd.0);
        Migration::new(out, &report, t.elapsed())
    }

    fn migrate_cmd(
        &self,
        from: &str,
        pid: i32,
        to: SocketAddr,
        extra: &[&str],
    ) -> (Command, PathBuf) {
        static N: AtomicU32 = AtomicU32::new(0);
        let report = self.dir.0.join(format!("report-{}.json", N.fetch_add(1, Ordering::SeqCst)));
        let limit = MIGRATE_LIMIT_S.to_string();
        let (pid, to) = (pid.to_string(), to.to_string());
        let mut argv = vec![
            "timeout",
            "-s",
            "KILL",
            &limit,
            FERRY,
            "migrate",
            "--pid",
            &pid,
            "--to",
            &to,
            "--key",
            path_str(&self.key),
            "--report",
            path_str(&report),
        ];
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

// ---------------------------------------------------------------------------
// 1. The conformance programs, a → b

/// Programs that cannot move between two test hosts, and why: test hosts
/// share one kernel, where two machines would not.
const NOT_MIGRATABLE: &[(&str, &str)] = &[
    (
        "sock_tcp_close_wait",
        "its connections' other ends are closed sockets on the source host's loopback: the hello refuses a loopback connection whose \
         other end stays behind (the_hello_refuses_a_loopback_connection_to_a_process_that_stays)",
    ),
    (
        "fd_locks",
        "its flock and POSIX locks stay held by the source's frozen copy until Commit, and test hosts share one kernel (one lock table), so \
         the destination cannot take them while the source holds them; two machines have a lock table each",
    ),
    (
        "fd_fifo_unread",
        "a named FIFO is one pipe for every opener on one kernel: the source's frozen copy still holds it open with the unread bytes, so the \
         destination refilling it doubles them; on two machines each host's FIFO is its own pipe",
    ),
    (
        "fd_inotify_deleted",
        "test hosts share one filesystem: the source's frozen copy, killed once the destination runs, closes its deleted file in the          watched directory, which queues IN_CLOSE_WRITE on the destination's watch of that same directory; on two machines the          directories are not one",
    ),
];

/// Programs with large mappings they never touched, and the most their
/// migration may send: a page never populated holds no data (1 GiB
/// mapped, 10 MiB touched, sent whole before the pre-copy left out the
/// userfaultfd markers on untouched pages).
const SENT_AT_MOST: &[(&str, u64)] = &[("mem_1g_sparse", 48 << 20)];

/// Programs migrated with `--no-precopy` because of open bugs of the
/// pre-copy (remove an entry when its bug is fixed):
const PRECOPY_BUGS: &[(&str, &str)] = &[];

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
        .filter(|n| only.as_deref().is_none_or(|o| o.split(',').any(|x| x == n)))
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
                        let Some(n) = names.lock().unwrap().next() else {
                            break;
                        };
                        let bin = std::panic::catch_unwind(|| common::conformance::compile(&n))
                            .map_err(|e| {
                                e.downcast_ref::<String>()
                                    .cloned()
                                    .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                                    .unwrap_or_default()
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
    // The programs' PIDs are then free in b, as between two real hosts:
    // each is restored in b's own PID namespace (without this, a fresh
    // a's PIDs are those of b's workers, and each restore takes a new
    // namespace under a helper; a_pid_taken_at_the_destination... tests
    // that path).
    env.host("a").set_next_pid(5000);
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
                failures.push(Failure {
                    name: name.clone(),
                    stage: "compile".into(),
                    msg: e.clone(),
                    ferry: String::new(),
                    log: String::new(),
                });
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
                env.host("a").set_next_pid(5000);
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
        text += &format!(
            "--- ferryd a ---\n{}\n--- ferryd b ---\n{}\n",
            read_lossy(&env.ferryd_log("a")),
            read_lossy(&env.ferryd_log("b"))
        );
        let names: Vec<&str> = failures.iter().map(|f| f.name.as_str()).collect();
        panic!(
            "{} of {} conformance programs failed to migrate: {names:?}\n{text}",
            failures.len(),
            names.len() + pauses.len()
        );
    }
}

/// One program: start in a, READY, migrate to b, SIGUSR2 there, PASS.
/// Returns the pause in ms.
fn migrate_program(env: &Env, name: &str, bin: &Path) -> Result<f64, Failure> {
    let work = env.dir.0.join(name);
    fs::create_dir_all(&work).expect("work dir");
    let log = env.dir.0.join(format!("{name}.log"));
    let (a, b) = (env.host("a"), env.host("b"));
    let fail = |stage: &str, msg: String, ferry: String| Failure {
        name: name.into(),
        stage: stage.into(),
        msg,
        ferry,
        log: read_lossy(&log),
    };
    let w = path_str(&work);
    let mut p = start_in(
        a,
        &[path_str(bin)],
        &work,
        &log,
        &[("FERRY_TEST_DIR", w), ("FERRY_EXPECT_RESTORE", "1")],
    );
    let has_line = |l: &str| read_lossy(&log).lines().any(|x| x == l);
    if !wait_for(Duration::from_secs(15), || has_line("READY") || !alive(p.root))
        || !has_line("READY")
    {
        kill(p.root, libc::SIGKILL);
        let _ = p.nsenter.wait();
        return Err(fail("startup", "no READY within 15 s".into(), String::new()));
    }
    let mut extra = std::env::var("FERRY_MIGRATION_ARGS").unwrap_or_default();
    if PRECOPY_BUGS.iter().any(|(n, _)| *n == name) {
        extra += " --no-precopy";
    }
    let extra: Vec<&str> = extra.split_whitespace().collect();
    let m = env.migrate("a", p.inner, env.agent("b"), &extra);
    let ferry = m.out.show();
    if !m.ok() {
        kill(p.root, libc::SIGKILL);
        let _ = wait_timeout(&mut p.nsenter, Duration::from_secs(10));
        return Err(fail("migrate", "ferry migrate failed".into(), ferry));
    }
    // The source's copy is gone (SIGKILL after Running).
    match wait_timeout(&mut p.nsenter, Duration::from_secs(10)) {
        Some(st)
            if st.signal() == Some(libc::SIGKILL) || st.code() == Some(128 + libc::SIGKILL) => {}
        Some(st) => {
            return Err(fail(
                "source",
                format!("the source's copy ended with {}", describe(&st)),
                ferry,
            ))
        }
        None => {
            kill(p.root, libc::SIGKILL);
            return Err(fail(
                "source",
                "the source's copy still runs after the migration".into(),
                ferry,
            ));
        }
    }
    let inner = m.dest_host_pid();
    let Some(root) = b.root_pid(inner) else {
        return Err(fail("destination", format!("no process {inner} in b"), ferry));
    };
    if !kill(root, libc::SIGUSR2) {
        return Err(fail(
            "wakeup",
            format!("kill({root}, SIGUSR2): {}", std::io::Error::last_os_error()),
            ferry,
        ));
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
    let sent = m.report.as_ref().and_then(|r| r["bytes_sent"].as_u64()).unwrap_or(0);
    if let Some(&(_, most)) = SENT_AT_MOST.iter().find(|(n, _)| *n == name) {
        if sent > most {
            return Err(fail(
                "migrate",
                format!(
                    "{sent} bytes sent, at most {most} expected: pages it never touched went too"
                ),
                ferry,
            ));
        }
    }
    Ok(m.pause_ms())
}

/// Memory discarded (MADV_DONTNEED) after the pre-copy sent it reads as
/// zeros at the destination: the freeze must not take the discarded
/// pages for ones the destination holds unchanged
/// (tests/migration/discard_during_precopy.c; ferry migrate stalls
/// after its pre-copy while the program discards).
#[test]
fn memory_discarded_after_the_precopy_reads_as_zeros_at_the_destination() {
    const TEST: &str = "discard";
    if !have(TEST, &["gcc"]) {
        return;
    }
    let env = Env::new(TEST, &["a", "b"]);
    env.start_ferryd("a", &[], &[]);
    env.start_ferryd("b", &[], &[]);
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/migration/discard_during_precopy.c");
    let bin = env.dir.0.join("discard_during_precopy");
    ferry_testkit::compile_c(&src, &bin);
    let log = env.dir.0.join("program.log");
    let p = start_in(env.host("a"), &[path_str(&bin)], &env.dir.0, &log, &[]);
    let has = |l: &str| read_lossy(&log).lines().any(|x| x == l);
    assert!(wait_for(Duration::from_secs(10), || has("READY")), "no READY: {}", read_lossy(&log));
    let (mut cmd, report) = env.migrate_cmd("a", p.inner, env.agent("b"), &[]);
    cmd.env("FERRY_FAULT_STALL_AFTER", "source:pre-copy").env("FERRY_FAULT_STALL_SECS", "2");
    let (out, err) = (env.dir.0.join("migrate.out"), env.dir.0.join("migrate.err"));
    let child = spawn_logged(cmd, &out, &err);
    assert!(
        wait_for(Duration::from_secs(30), || read_lossy(&err).contains("stalling after")),
        "ferry migrate did not stall after its pre-copy:\n{}",
        read_lossy(&err)
    );
    assert!(kill(p.root, libc::SIGUSR1), "SIGUSR1 to the program");
    assert!(wait_for(Duration::from_secs(5), || has("DISCARDED")), "{}", read_lossy(&log));
    let m = finish_migration(child, &report, &out, &err, Duration::from_secs(60));
    let inner = m.expect_ok("discard after the pre-copy");
    let root = env.host("b").root_pid(inner).expect("the program in b");
    assert!(kill(root, libc::SIGUSR2), "SIGUSR2 to the program in b");
    let done = |l: &str| l == "PASS" || l.starts_with("FAIL");
    assert!(
        wait_for(Duration::from_secs(10), || read_lossy(&log).lines().any(done)),
        "no PASS or FAIL: {}",
        read_lossy(&log)
    );
    let text = read_lossy(&log);
    assert!(!text.contains("FAIL") && has("PASS"), "at the destination:\n{text}");
}

// ---------------------------------------------------------------------------
// Services: redis in a, bound to the service address; clients in c

const REDIS_PORT: &str = "6379";

/// Hosts a and b with ferryd (b's started with `b_env` and `b_args`), c
/// with a plain init, and the service address (x.x.x.100/24) on a's eth0.
fn service_env(tag: &str, b_env: &[(&str, &str)], b_args: &[&str]) -> (Env, String) {
    let env = Env::new(tag, &["a", "b", "c"]);
    env.start_ferryd("a", &[], &[]);
    env.start_ferryd("b", b_env, b_args);
    env.start_plain("c");
    let svc = env.c.subnet_addr(100).to_string();
    ip(&["-n", &env.host("a").netns, "addr", "add", &format!("{svc}/24"), "dev", "eth0"]);
    (env, svc)
}

fn svc_prefix(svc: &str) -> String {
    format!("{svc}/24")
}

/// redis-server in host `on`, bound to `svc`, working in `dir`; waits until
/// it answers from c.
fn start_redis(env: &Env, on: &str, svc: &str, dir: &Path) -> Started {
    let log = env.dir.0.join("redis.log");
    let r = start_in(
        env.host(on),
        &[
            REDIS,
            "--bind",
            svc,
            "--port",
            REDIS_PORT,
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--protected-mode",
            "no",
            "--dir",
            path_str(dir),
        ],
        &env.dir.0,
        &log,
        &[],
    );
    let ok = wait_for(Duration::from_secs(15), || {
        redis_cli(env, svc, &["PING"]).stdout.trim() == "PONG"
    });
    assert!(ok, "redis does not answer on {svc}:\n{}", read_lossy(&log));
    r
}

fn redis_cli(env: &Env, svc: &str, args: &[&str]) -> Out {
    let mut argv = vec!["redis-cli", "-h", svc, "-p", REDIS_PORT];
    argv.extend_from_slice(args);
    run_in(env.host("c"), 20, &argv)
}

/// A connection from host c to the service, opened once and kept: each
/// `ask` sends one inline redis command over it and returns the reply line.
struct KeptClient {
    nsenter: Child,
    root: i32,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
}

const KEPT_CLIENT: &str = r#"import socket,sys
s=socket.create_connection((sys.argv[1],int(sys.argv[2])),timeout=30)
f=s.makefile('rb')
print('connected',flush=True)
for line in sys.stdin:
    s.sendall(line.strip().encode()+b'\r\n')
    print(f.readline().decode().strip(),flush=True)
"#;

impl KeptClient {
    fn open(env: &Env, svc: &str) -> KeptClient {
        KeptClient::open_to(env, svc, REDIS_PORT)
    }

    fn open_to(env: &Env, svc: &str, port: &str) -> KeptClient {
        let c = env.host("c");
        let mut cmd = c.command(&["python3", "-c", KEPT_CLIENT, svc, port]);
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::inherit());
        let mut nsenter = only_stdio(&mut cmd).spawn().expect("kept client");
        let (root, _) = c.wait_spawned_pid(&nsenter);
        let stdin = nsenter.stdin.take().expect("stdin");
        let stdout = nsenter.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(stdout).lines() {
                let Ok(l) = l else { break };
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        let mut k = KeptClient { nsenter, root, stdin, lines };
        assert_eq!(k.line().as_deref(), Some("connected"), "the kept client did not connect");
        k
    }

    fn line(&mut self) -> Option<String> {
        self.lines.recv_timeout(Duration::from_secs(30)).ok()
    }

    fn ask(&mut self, cmd: &str) -> String {
        writeln!(self.stdin, "{cmd}").expect("write to the kept client");
        self.stdin.flush().expect("flush");
        self.line().unwrap_or_else(|| panic!("no reply to {cmd:?} on the kept connection"))
    }
}

impl Drop for KeptClient {
    fn drop(&mut self) {
        kill(self.root, libc::SIGKILL);
        let _ = wait_timeout(&mut self.nsenter, Duration::from_secs(5));
    }
}

/// After a failed migration: redis runs on at a (not stopped), the kept
/// connection works, new connections work, the address is on a's eth0 and
/// not on b's, and neither host has a network lock.
fn assert_service_at_source(
    env: &Env,
    svc: &str,
    redis: &Started,
    client: &mut KeptClient,
    counter: &mut u64,
    what: &str,
) {
    assert!(alive(redis.root), "{what}: redis is gone from a");
    assert_ne!(state(redis.root), Some('T'), "{what}: redis is stopped at a");
    let (a, b) = (env.host("a"), env.host("b"));
    assert!(
        addresses(a).contains(&svc_prefix(svc)),
        "{what}: {svc} is not back on a: {:?}",
        addresses(a)
    );
    assert!(!addresses(b).contains(&svc_prefix(svc)), "{what}: {svc} is on b: {:?}", addresses(b));
    *counter += 1;
    assert_eq!(
        client.ask("INCR kept"),
        format!(":{counter}"),
        "{what}: the connection opened before"
    );
    assert_eq!(redis_cli(env, svc, &["PING"]).stdout.trim(), "PONG", "{what}: a new connection");
    for h in [a, b] {
        assert_eq!(host_locks(h), Vec::new(), "{what}: network lock left in {}", h.name);
    }
}

fn spawn_logged(mut cmd: Command, out: &Path, err: &Path) -> Child {
    cmd.stdin(Stdio::null())
        .stdout(File::create(out).expect("out"))
        .stderr(File::create(err).expect("err"));
    only_stdio(&mut cmd).spawn().expect("spawn")
}

/// Starts `ferry migrate` in host `from` in the background.
fn migrate_in_background(
    env: &Env,
    from: &str,
    pid: i32,
    to: SocketAddr,
    extra: &[&str],
) -> (Child, PathBuf, PathBuf, PathBuf) {
    let (cmd, report) = env.migrate_cmd(from, pid, to, extra);
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::SeqCst);
    let (out, err) =
        (env.dir.0.join(format!("migrate-{n}.out")), env.dir.0.join(format!("migrate-{n}.err")));
    (spawn_logged(cmd, &out, &err), report, out, err)
}

fn finish_migration(
    mut child: Child,
    report: &Path,
    out: &Path,
    err: &Path,
    limit: Duration,
) -> Migration {
    let t = Instant::now();
    let status = wait_timeout(&mut child, limit).unwrap_or_else(|| {
        // timeout(1) inside ends it within MIGRATE_LIMIT_S in any case.
        child.wait().expect("wait ferry migrate")
    });
    Migration::new(
        Out { status, stdout: read_lossy(out), stderr: read_lossy(err) },
        report,
        t.elapsed(),
    )
}

fn assert_failed_with(m: &Migration, what: &str, needles: &[&str]) {
    assert!(!m.out.status.success(), "{what}: ferry migrate succeeded: {}", m.out.show());
    assert!(
        m.out.stderr.contains("still runs here"),
        "{what}: no word that the service still runs at the source: {}",
        m.out.show()
    );
    let lower = m.out.stderr.to_lowercase();
    assert!(
        needles.iter().any(|n| lower.contains(n)),
        "{what}: none of {needles:?} in the error: {}",
        m.out.show()
    );
    eprintln!(
        "[{what}] ferry migrate failed as it should in {:.1} s: {}",
        m.took.as_secs_f64(),
        m.out.stderr.lines().last().unwrap_or("")
    );
}

// ---------------------------------------------------------------------------
// 2. Under load

#[test]
fn redis_under_load_migrates_there_and_back() {
    const TEST: &str = "redis-load";
    if !have(TEST, &[REDIS, "redis-benchmark", "redis-cli", "python3"]) {
        return;
    }
    let (env, svc) = service_env("rl", &[], &[]);
    let data = env.dir.0.join("redis");
    fs::create_dir_all(&data).expect("redis dir");
    let redis = start_redis(&env, "a", &svc, &data);
    let mut mset = vec!["MSET".to_string()];
    for i in 0..200 {
        mset.push(format!("before:{i}"));
        mset.push(format!("value-{i}-{}", "x".repeat(i % 50)));
    }
    let mset: Vec<&str> = mset.iter().map(String::as_str).collect();
    assert_eq!(redis_cli(&env, &svc, &mset).stdout.trim(), "OK");

    let (bout, berr) = (env.dir.0.join("bench.out"), env.dir.0.join("bench.err"));
    let mut bench = spawn_logged(
        // Looping (-l) for a fixed time, so that the load spans both
        // migrations however fast this machine is; SIGINT ends it cleanly.
        env.host("c").command(&[
            "timeout",
            "-s",
            "INT",
            "14",
            "redis-benchmark",
            "-h",
            &svc,
            "-p",
            REDIS_PORT,
            "-c",
            "20",
            "-n",
            "100000",
            "-P",
            "4",
            "-t",
            "set,get",
            "-r",
            "10000",
            "-l",
            "-q",
        ]),
        &bout,
        &berr,
    );
    let running = |bench: &mut Child| matches!(bench.try_wait(), Ok(None));
    std::thread::sleep(Duration::from_millis(1000));
    assert!(
        running(&mut bench),
        "redis-benchmark ended before the migrations:\n{}\n{}",
        read_lossy(&bout),
        read_lossy(&berr)
    );
    let there = env.migrate("a", redis.inner, env.agent("b"), &["--address", &svc_prefix(&svc)]);
    let pid_b = there.expect_ok("a→b under load");
    assert!(
        addresses(env.host("b")).contains(&svc_prefix(&svc))
            && !addresses(env.host("a")).contains(&svc_prefix(&svc)),
        "address did not move to b"
    );
    std::thread::sleep(Duration::from_millis(500));
    let back = env.migrate("b", pid_b, env.agent("a"), &["--address", &svc_prefix(&svc)]);
    let pid_a = back.expect_ok("b→a under load");
    let still = running(&mut bench);
    eprintln!(
        "[{TEST}] a→b pause {:.1} ms ({:.0} ms in all), b→a pause {:.1} ms ({:.0} ms); redis is pid {pid_a} in a",
        there.pause_ms(),
        there.took.as_secs_f64() * 1e3,
        back.pause_ms(),
        back.took.as_secs_f64() * 1e3
    );
    let st =
        wait_timeout(&mut bench, Duration::from_secs(60)).expect("redis-benchmark did not end");
    let (o, e) = (read_lossy(&bout), read_lossy(&berr));
    // timeout(1) exits 124 when it had to stop the loop, as intended.
    assert!(
        st.success() || st.code() == Some(124),
        "redis-benchmark failed ({}):\n{o}\n{e}",
        describe(&st)
    );
    assert!(!o.contains("Error") && !e.contains("Error"), "redis-benchmark saw errors:\n{o}\n{e}");
    for t in ["SET: ", "GET: "] {
        assert!(
            o.lines()
                .flat_map(|l| l.split('\r'))
                .any(|l| l.trim_start().starts_with(t) && l.contains("requests per second")),
            "no {t} result:\n{o}"
        );
    }
    assert!(
        still,
        "redis-benchmark ended before the second migration: raise -n so that the load spans both"
    );
    // Keys written before the migrations, through a new connection.
    let mut get = vec!["MGET".to_string()];
    get.extend((0..200).map(|i| format!("before:{i}")));
    let get: Vec<&str> = get.iter().map(String::as_str).collect();
    let values = redis_cli(&env, &svc, &get).stdout;
    let want: Vec<String> = (0..200).map(|i| format!("value-{i}-{}", "x".repeat(i % 50))).collect();
    assert_eq!(values.lines().collect::<Vec<_>>(), want, "keys written before the migrations");
    assert_eq!(env.host("a").root_pid(pid_a).map(alive), Some(true), "redis runs in a again");
    for h in ["a", "b"] {
        assert_eq!(host_locks(env.host(h)), Vec::new(), "network lock left in {h}");
    }
}

#[test]
fn nginx_under_load_migrates_there_and_back() {
    const TEST: &str = "nginx-load";
    if !have(TEST, &[NGINX, "ab"]) {
        return;
    }
    let (env, svc) = service_env("nl", &[], &[]);
    let www = env.dir.0.join("www");
    fs::create_dir_all(&www).expect("www");
    fs::set_permissions(&www, fs::Permissions::from_mode(0o755)).expect("chmod www");
    let body: String = (0..200).map(|i| format!("ferry nginx line {i:05}\n")).collect();
    fs::write(www.join("ferry.txt"), &body).expect("write the file");
    fs::set_permissions(www.join("ferry.txt"), fs::Permissions::from_mode(0o644))
        .expect("chmod file");
    let nginx = start_nginx(env.host("a"), &env.dir.0, &svc, "text/plain txt");
    let url = format!("http://{svc}:8080/ferry.txt");
    let ready = wait_for(Duration::from_secs(15), || {
        run_in(env.host("c"), 10, &["ab", "-n", "1", &url])
            .stdout
            .contains("Complete requests:      1")
    });
    assert!(
        ready,
        "nginx does not serve:\n{}\n{}",
        read_lossy(&env.dir.0.join("nginx.stdio")),
        read_lossy(&env.dir.0.join("error.log"))
    );

    // A fixed time (-t) rather than a count, so that the load spans both
    // migrations however fast this machine is (-n after -t lifts ab's
    // default cap of 50,000 requests).
    let (bout, berr) = (env.dir.0.join("ab.out"), env.dir.0.join("ab.err"));
    let mut ab = spawn_logged(
        env.host("c").command(&[
            "timeout", "-s", "KILL", "150", "ab", "-t", "12", "-n", "10000000", "-c", "10", "-s",
            "20", &url,
        ]),
        &bout,
        &berr,
    );
    std::thread::sleep(Duration::from_millis(1000));
    assert!(
        matches!(ab.try_wait(), Ok(None)),
        "ab ended before the migrations:\n{}\n{}",
        read_lossy(&bout),
        read_lossy(&berr)
    );
    let there = env.migrate("a", nginx.inner, env.agent("b"), &["--address", &svc_prefix(&svc)]);
    let pid_b = there.expect_ok("a→b under load");
    std::thread::sleep(Duration::from_millis(500));
    let back = env.migrate("b", pid_b, env.agent("a"), &["--address", &svc_prefix(&svc)]);
    back.expect_ok("b→a under load");
    let still = matches!(ab.try_wait(), Ok(None));
    eprintln!("[{TEST}] a→b pause {:.1} ms, b→a pause {:.1} ms", there.pause_ms(), back.pause_ms());
    let st = wait_timeout(&mut ab, Duration::from_secs(160)).expect("ab did not end");
    let (o, e) = (read_lossy(&bout), read_lossy(&berr));
    assert!(st.success(), "ab failed ({}):\n{o}\n{e}", describe(&st));
    let complete: u64 = o
        .lines()
        .find_map(|l| l.strip_prefix("Complete requests:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    assert!(complete > 1000, "ab completed only {complete} requests:\n{o}\n{e}");
    assert!(o.contains("Failed requests:        0"), "failed requests:\n{o}");
    assert!(!o.contains("Non-2xx responses"), "non-2xx responses:\n{o}");
    assert!(o.contains(&format!("Document Length:        {} bytes", body.len())), "{o}");
    assert!(still, "ab ended before the second migration: raise -n so that the load spans both");
    for h in ["a", "b"] {
        assert_eq!(host_locks(env.host(h)), Vec::new(), "network lock left in {h}");
    }
}

// ---------------------------------------------------------------------------
// 3. Faults: the service stays at the source

const STALL_HELD: (&str, &str) = ("FERRY_FAULT_STALL_AFTER", "destination:restored (held)");

fn wait_stall(env: &Env, what: &str) {
    let log = env.ferryd_log("b");
    assert!(
        wait_for(Duration::from_secs(30), || read_lossy(&log)
            .contains("stalling after destination phase 'restored (held)'")),
        "{what}: the destination did not reach the stall:\n{}",
        read_lossy(&log)
    );
}

/// Redis at a with a connection from c kept open (counter "kept" at 1).
fn fault_setup(
    tag: &str,
    b_env: &[(&str, &str)],
    b_args: &[&str],
) -> (Env, String, Started, KeptClient) {
    let (env, svc) = service_env(tag, b_env, b_args);
    let data = env.dir.0.join("redis");
    fs::create_dir_all(&data).expect("redis dir");
    let redis = start_redis(&env, "a", &svc, &data);
    let mut client = KeptClient::open(&env, &svc);
    assert_eq!(client.ask("INCR kept"), ":1");
    (env, svc, redis, client)
}

#[test]
fn fault_destination_killed_mid_migration() {
    const TEST: &str = "fault-dest-killed";
    if !have(TEST, &[REDIS, "redis-cli", "python3"]) {
        return;
    }
    let (env, svc, redis, mut client) = fault_setup("fk", &[STALL_HELD], &[]);
    let (child, report, out, err) = migrate_in_background(
        &env,
        "a",
        redis.inner,
        env.agent("b"),
        &["--address", &svc_prefix(&svc), "--timeout", "20"],
    );
    wait_stall(&env, TEST);
    // The whole destination host goes: ferryd, its worker, the held tree.
    env.host("b").stop_init();
    let m = finish_migration(child, &report, &out, &err, Duration::from_secs(40));
    assert_failed_with(&m, TEST, &["connection", "closed", "reset", "eof"]);
    // b comes back as after a reboot: a new ferryd, and without the
    // address its killed agent had put on eth0 (a machine that goes down
    // takes its addresses with it; a test host's network namespace stays).
    env.start_ferryd("b", &[], &[]);
    let b = env.host("b");
    if addresses(b).contains(&svc_prefix(&svc)) {
        ip(&["-n", &b.netns, "addr", "del", &svc_prefix(&svc), "dev", "eth0"]);
    }
    let mut counter = 1;
    assert_service_at_source(&env, &svc, &redis, &mut client, &mut counter, TEST);
}

#[test]
fn fault_link_cut_mid_migration() {
    const TEST: &str = "fault-link-cut";
    if !have(TEST, &[REDIS, "redis-cli", "python3"]) {
        return;
    }
    // The destination stalls 4 s after restoring (held), then waits 3 s
    // for Commit, gives up and undoes its steps.
    let (env, svc, redis, mut client) =
        fault_setup("fl", &[STALL_HELD, ("FERRY_FAULT_STALL_SECS", "4")], &["--timeout", "3"]);
    let (child, report, out, err) = migrate_in_background(
        &env,
        "a",
        redis.inner,
        env.agent("b"),
        &["--address", &svc_prefix(&svc), "--timeout", "2"],
    );
    wait_stall(&env, TEST);
    let b = env.host("b");
    ip(&["-n", &b.netns, "link", "set", "eth0", "down"]);
    let m = finish_migration(child, &report, &out, &err, Duration::from_secs(40));
    assert_failed_with(&m, TEST, &["timed out", "timeout", "resource temporarily unavailable"]);
    assert!(
        m.took < Duration::from_secs(15),
        "{TEST}: the source took {:?} to give up with --timeout 2",
        m.took
    );
    // The destination gives up on its own.
    let log = env.ferryd_log("b");
    assert!(
        wait_for(Duration::from_secs(30), || read_lossy(&log)
            .contains("failed: the source gave up")
            || read_lossy(&log).contains("migration from")),
        "{TEST}: the destination did not end the migration:\n{}",
        read_lossy(&log)
    );
    ip(&["-n", &b.netns, "link", "set", "eth0", "up"]);
    let mut counter = 1;
    assert_service_at_source(&env, &svc, &redis, &mut client, &mut counter, TEST);
    assert!(
        !read_lossy(&log).contains("runs here as pid"),
        "{TEST}: the destination released the tree:\n{}",
        read_lossy(&log)
    );
}

/// Forwards one connection c:port → b's agent, flipping one byte of the
/// source's stream at offset 100000.

#[test]
fn fault_corrupted_stream() {
    const TEST: &str = "fault-corrupted";
    if !have(TEST, &[REDIS, "redis-cli", "python3"]) {
        return;
    }
    let (env, svc, redis, mut client) = fault_setup("fc", &[], &[]);
    let c = env.host("c");
    let mut cmd = c.command(&[
        "python3",
        "-c",
        CORRUPTING_PROXY,
        &c.ip.to_string(),
        "7171",
        &env.host("b").ip.to_string(),
        &AGENT_PORT.to_string(),
        "100000",
    ]);
    cmd.stdin(Stdio::null()).stdout(Stdio::piped());
    let mut proxy = only_stdio(&mut cmd).spawn().expect("proxy");
    let (proxy_root, _) = c.wait_spawned_pid(&proxy);
    let mut lines = BufReader::new(proxy.stdout.take().expect("proxy stdout")).lines();
    assert_eq!(lines.next().and_then(|l| l.ok()).as_deref(), Some("listening"));
    let m = env.migrate(
        "a",
        redis.inner,
        SocketAddr::new(c.ip.into(), 7171),
        &["--address", &svc_prefix(&svc), "--timeout", "10"],
    );
    assert_eq!(
        lines.next().and_then(|l| l.ok()).as_deref(),
        Some("flipped"),
        "the proxy did not flip a byte"
    );
    assert_failed_with(&m, TEST, &["authenticat"]);
    kill(proxy_root, libc::SIGKILL);
    let _ = wait_timeout(&mut proxy, Duration::from_secs(5));
    let mut counter = 1;
    assert_service_at_source(&env, &svc, &redis, &mut client, &mut counter, TEST);
    let log = read_lossy(&env.ferryd_log("b"));
    assert!(!log.contains("runs here as pid"), "{TEST}: the destination released a tree:\n{log}");
}

#[test]
fn fault_restore_fails_at_destination() {
    const TEST: &str = "fault-restore";
    if !have(TEST, &[REDIS, "redis-cli", "python3"]) {
        return;
    }
    let (env, svc) = service_env("fr", &[], &[]);
    // redis works in a directory that exists only in a's mount namespace
    // (on a tmpfs mounted there): the destination cannot restore its cwd.
    let private = env.dir.0.join("private");
    fs::create_dir_all(&private).expect("private dir");
    let only_a = private.join("only-a");
    let out = run_in(
        env.host("a"),
        10,
        &[
            "sh",
            "-c",
            "mount -t tmpfs tmpfs \"$1\" && mkdir \"$2\"",
            "sh",
            path_str(&private),
            path_str(&only_a),
        ],
    );
    assert!(out.status.success(), "tmpfs in a: {}", out.show());
    let redis = start_redis(&env, "a", &svc, &only_a);
    let mut client = KeptClient::open(&env, &svc);
    assert_eq!(client.ask("INCR kept"), ":1");
    let m = env.migrate("a", redis.inner, env.agent("b"), &["--address", &svc_prefix(&svc)]);
    assert_failed_with(&m, TEST, &["the destination failed"]);
    assert!(
        m.out.stderr.contains("only-a"),
        "{TEST}: the error does not name the missing directory: {}",
        m.out.show()
    );
    let mut counter = 1;
    assert_service_at_source(&env, &svc, &redis, &mut client, &mut counter, TEST);
}

const GARBAGE_CLIENT: &str = r#"import socket,sys,os
s=socket.create_connection((sys.argv[1],int(sys.argv[2])),timeout=20)
s.sendall(os.urandom(4096)+b'GET / HTTP/1.0\r\n\r\n'+bytes(range(256))*64)
try:
    while s.recv(65536): pass
    print('closed')
except ConnectionResetError: print('closed')
except socket.timeout: print('still open')
"#;

#[test]
fn fault_unauthenticated_peers_are_refused() {
    const TEST: &str = "fault-unauthenticated";
    if !have(TEST, &[REDIS, "redis-cli", "python3"]) {
        return;
    }
    let (env, svc, redis, mut client) = fault_setup("fu", &[], &[]);
    // A source with another key.
    let other = env.dir.0.join("other.key");
    let out = output({
        let mut c = Command::new(FERRY);
        c.arg("keygen").arg(&other);
        c
    });
    assert!(out.status.success(), "ferry keygen: {}", out.show());
    let limit = MIGRATE_LIMIT_S.to_string();
    let (pid, to) = (redis.inner.to_string(), env.agent("b").to_string());
    let addr = svc_prefix(&svc);
    let out = output(env.host("a").command(&[
        "timeout",
        "-s",
        "KILL",
        &limit,
        FERRY,
        "migrate",
        "--pid",
        &pid,
        "--to",
        &to,
        "--key",
        path_str(&other),
        "--address",
        &addr,
    ]));
    let m = Migration { out, report: None, took: Duration::ZERO };
    assert_failed_with(&m, TEST, &["key"]);
    let none = run_in(env.host("b"), 10, &["pgrep", "-x", "redis-server"]);
    assert!(!none.status.success(), "{TEST}: a redis-server runs in b: {}", none.show());
    let mut counter = 1;
    assert_service_at_source(&env, &svc, &redis, &mut client, &mut counter, "wrong key");

    // Garbage instead of a handshake: disconnected, ferryd lives on.
    let b = env.host("b");
    let ferryd = b.init_pid();
    let out = run_in(
        env.host("c"),
        30,
        &["python3", "-c", GARBAGE_CLIENT, &b.ip.to_string(), &AGENT_PORT.to_string()],
    );
    assert_eq!(
        out.stdout.trim(),
        "closed",
        "{TEST}: ferryd did not disconnect a peer sending garbage: {}",
        out.show()
    );
    assert!(alive(ferryd) && b.init_pid() == ferryd, "{TEST}: ferryd died");
    assert!(
        read_lossy(&env.ferryd_log("b")).contains("refused"),
        "{TEST}: ferryd does not log the refusal:\n{}",
        read_lossy(&env.ferryd_log("b"))
    );
    assert_service_at_source(&env, &svc, &redis, &mut client, &mut counter, "garbage");

    // ferryd still serves a real migration; the kept connection moves too.
    let m = env.migrate("a", redis.inner, env.agent("b"), &["--address", &addr]);
    let pid_b = m.expect_ok("after the garbage");
    assert!(b.root_pid(pid_b).is_some_and(alive), "{TEST}: redis does not run in b");
    counter += 1;
    assert_eq!(
        client.ask("INCR kept"),
        format!(":{counter}"),
        "{TEST}: the kept connection after the migration"
    );
    assert!(addresses(b).contains(&addr) && !addresses(env.host("a")).contains(&addr));
}

// ---------------------------------------------------------------------------
// Where the destination restores: its own PID namespace, or a new one

/// The parent of `pid` (root namespace) and that parent's name.
fn parent_of(pid: i32) -> Option<(i32, String)> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let ppid: i32 = status.lines().find_map(|l| l.strip_prefix("PPid:"))?.trim().parse().ok()?;
    let comm = fs::read_to_string(format!("/proc/{ppid}/comm")).ok()?;
    Some((ppid, comm.trim().to_string()))
}

#[test]
fn restored_in_the_agents_pid_namespace_unless_a_pid_is_taken_there() {
    const TEST: &str = "pid-namespaces";
    if !have(TEST, &["sleep"]) {
        return;
    }
    let env = Env::new("pidns", &["a", "b"]);
    env.start_ferryd("a", &[], &[]);
    env.start_ferryd("b", &[], &[]);
    let (a, b) = (env.host("a"), env.host("b"));
    let b_ns = common::cluster::pid_ns_of(b.init_pid()).expect("b's PID namespace");
    for taken in [false, true] {
        let base = if taken { 7000 } else { 6000 };
        let want = base + 1;
        let mut occupant = None;
        if taken {
            b.set_next_pid(base);
            let log = env.dir.0.join("occupant.log");
            let o = start_in(b, &["sleep", "600"], &env.dir.0, &log, &[]);
            assert_eq!(o.inner, want, "{TEST}: the occupant in b did not get PID {want}");
            occupant = Some(o);
        }
        a.set_next_pid(base);
        let log = env.dir.0.join(format!("sleep-{taken}.log"));
        let mut p = start_in(a, &["sleep", "600"], &env.dir.0, &log, &[]);
        assert_eq!(p.inner, want, "{TEST}: the service in a did not get PID {want}");
        let m = env.migrate("a", p.inner, env.agent("b"), &[]);
        assert!(m.ok(), "{TEST} (PID taken in b: {taken}): {}", m.out.show());
        assert!(
            wait_timeout(&mut p.nsenter, Duration::from_secs(10)).is_some(),
            "{TEST}: the source's copy still runs"
        );
        let host_pid = m.dest_host_pid();
        let root =
            b.root_pid(host_pid).unwrap_or_else(|| panic!("{TEST}: no process {host_pid} in b"));
        assert_eq!(
            common::cluster::innermost(root),
            Some(want),
            "{TEST}: the restored process does not have its PID {want}"
        );
        let ns = common::cluster::pid_ns_of(root).expect("the restored process's PID namespace");
        if taken {
            // In a new namespace, under the helper that is its init there.
            assert_ne!(
                host_pid, want,
                "{TEST}: b reports the restored process as {want}, the occupant's PID"
            );
            assert_ne!(
                ns, b_ns,
                "{TEST}: restored in b's own PID namespace although {want} is taken there"
            );
            let parent = parent_of(root).map(|p| p.1);
            assert_eq!(
                parent.as_deref(),
                Some("ferry-init"),
                "{TEST}: the restored process's parent"
            );
        } else {
            assert_eq!(host_pid, want, "{TEST}: b reports the restored process as {host_pid}");
            assert_eq!(
                ns, b_ns,
                "{TEST}: restored in a new PID namespace although every PID was free in b"
            );
            // Its parent, the worker that restored it, exits; ferryd
            // (b's init, the child subreaper) adopts it.
            let adopted = wait_for(Duration::from_secs(10), || {
                parent_of(root).is_some_and(|(ppid, _)| ppid == b.init_pid())
            });
            assert!(
                adopted,
                "{TEST}: the restored process's parent is {:?}, not b's ferryd",
                parent_of(root)
            );
        }
        assert!(
            alive(root) && state(root) != Some('t'),
            "{TEST}: the restored process is not running ({:?})",
            state(root)
        );
        kill(root, libc::SIGKILL);
        if let Some(mut o) = occupant {
            kill(o.root, libc::SIGKILL);
            let _ = wait_timeout(&mut o.nsenter, Duration::from_secs(5));
        }
    }
}

// ---------------------------------------------------------------------------
// 4. What only the destination can refuse, refused before the freeze

/// A service for the hello's checks: opens the sockets its arguments
/// after the first ask for (`listen,HOST,PORT`, `udp,HOST,PORT`,
/// `connect,SRC,DST,PORT`), says `ready`, then counts in the file its
/// first argument names, one step every 10 ms.
const CHECKED_SERVICE: &str = r#"import os,socket,sys,time
socks=[]
def family(h): return socket.AF_INET6 if ':' in h else socket.AF_INET
for spec in sys.argv[2:]:
    kind,*a=spec.split(',')
    if kind in ('listen','udp'):
        s=socket.socket(family(a[0]),socket.SOCK_STREAM if kind=='listen' else socket.SOCK_DGRAM)
        s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)
        s.bind((a[0],int(a[1])))
        if kind=='listen': s.listen(8)
    elif kind=='map':
        import mmap
        f=open(a[0],'w+b'); f.write(b'x'*4096); f.flush()
        s=(f,mmap.mmap(f.fileno(),4096))
    else:
        for i in range(100):
            try: s=socket.create_connection((a[1],int(a[2])),timeout=5,source_address=(a[0],0)); break
            except OSError: time.sleep(0.1)
    socks.append(s)
print('ready',flush=True)
n=0
while True:
    n+=1
    with open(sys.argv[1]+'.tmp','w') as f: f.write(str(n))
    os.replace(sys.argv[1]+'.tmp',sys.argv[1])
    time.sleep(0.01)
"#;

/// Listens on HOST:PORT and keeps what connects (in the accept queue).
const HOLDING_LISTENER: &str = r#"import socket,sys,time
s=socket.socket(); s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)
s.bind((sys.argv[1],int(sys.argv[2]))); s.listen(64)
print('ready',flush=True)
while True: time.sleep(60)
"#;

/// A program started in a host that prints `ready` once set up.
fn start_ready(env: &Env, on: &str, argv: &[&str], dir: &Path, log: &Path) -> Started {
    let p = start_in(env.host(on), argv, dir, log, &[]);
    assert!(
        wait_for(Duration::from_secs(20), || read_lossy(log).contains("ready")),
        "{argv:?} in {on} is not ready:\n{}",
        read_lossy(log)
    );
    p
}

/// The checked service in host a, counting in its own directory.
fn start_checked_service(env: &Env, tag: &str, specs: &[&str]) -> (Started, PathBuf) {
    let dir = env.dir.0.join(tag);
    fs::create_dir_all(&dir).expect("service dir");
    let count = dir.join("counter");
    let mut argv = vec!["python3", "-c", CHECKED_SERVICE, path_str(&count)];
    argv.extend_from_slice(specs);
    let p = start_ready(env, "a", &argv, &dir, &dir.join("log"));
    (p, dir)
}

fn counter(dir: &Path) -> u64 {
    read_lossy(&dir.join("counter")).trim().parse().unwrap_or(0)
}

/// Watches a process from a thread of the test, every millisecond, for
/// a stop of any of its threads (a freeze stops them all for the whole
/// capture, tens of milliseconds at least).
struct StopWatch {
    done: std::sync::Arc<std::sync::atomic::AtomicBool>,
    seen: std::thread::JoinHandle<Option<String>>,
}

impl StopWatch {
    fn start(pid: i32) -> StopWatch {
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let d = done.clone();
        let seen = std::thread::spawn(move || {
            while !d.load(Ordering::SeqCst) {
                for t in fs::read_dir(format!("/proc/{pid}/task")).into_iter().flatten().flatten() {
                    let stat = read_lossy(&t.path().join("stat"));
                    let st = stat.rsplit(')').next().and_then(|r| r.trim_start().chars().next());
                    if matches!(st, Some('t' | 'T')) {
                        return Some(format!("thread {:?} in state {st:?}", t.file_name()));
                    }
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            None
        });
        StopWatch { done, seen }
    }

    /// What stopped the process, if anything did.
    fn finish(self) -> Option<String> {
        self.done.store(true, Ordering::SeqCst);
        self.seen.join().expect("stop watcher")
    }
}

/// A migration refused in the hello: it failed naming every `needle`,
/// the service was never stopped (`watch`), never reached the freeze,
/// and still runs and counts at a.
fn assert_refused_before_freeze(
    what: &str,
    m: &Migration,
    watch: StopWatch,
    service: &Started,
    dir: &Path,
    needles: &[&str],
) {
    let stopped = watch.finish();
    assert!(!m.out.status.success(), "{what}: ferry migrate succeeded: {}", m.out.show());
    for n in needles {
        assert!(m.out.stderr.contains(n), "{what}: {n:?} not in the error: {}", m.out.show());
    }
    assert!(
        m.out.stderr.contains("nothing was frozen") && !m.out.stderr.contains("ferry: freezing"),
        "{what}: not refused before the freeze: {}",
        m.out.show()
    );
    assert_eq!(stopped, None, "{what}: the service was stopped during the migration");
    let before = counter(dir);
    assert!(
        wait_for(Duration::from_secs(5), || counter(dir) > before + 5),
        "{what}: the service does not count on at a (at {before})"
    );
    assert!(alive(service.root), "{what}: the service is gone from a");
    eprintln!("[{what}] refused in {:.0} ms:\n{}", m.took.as_secs_f64() * 1e3, m.out.stderr);
}

#[test]
fn hello_refuses_a_local_address_the_destination_lacks() {
    const TEST: &str = "hello-address";
    if !have(TEST, &["python3"]) {
        return;
    }
    let (env, svc) = service_env("ad", &[], &[]);
    let (a_ip, c_ip) = (env.host("a").ip.to_string(), env.host("c").ip.to_string());
    let upstream = env.dir.0.join("upstream.log");
    start_ready(
        &env,
        "c",
        &["python3", "-c", HOLDING_LISTENER, &c_ip, "7000"],
        &env.dir.0,
        &upstream,
    );
    // A listener on the service address (moved by the migration, not
    // checked) and a connection from a's own address to c, as a proxy's
    // backend connection leaves from its host's address.
    let (service, dir) = start_checked_service(
        &env,
        "svc",
        &[&format!("listen,{svc},7300"), &format!("connect,{a_ip},{c_ip},7000")],
    );
    let watch = StopWatch::start(service.root);
    let m = env.migrate("a", service.inner, env.agent("b"), &["--address", &svc_prefix(&svc)]);
    let connection = format!("TCP {a_ip}:");
    let remedy = format!("source outbound connections from the service address {svc}");
    assert_refused_before_freeze(
        TEST,
        &m,
        watch,
        &service,
        &dir,
        &[
            &connection,
            &format!("-> {c_ip}:7000"),
            &format!("local address {a_ip} is not on the destination"),
            &remedy,
        ],
    );
    assert!(
        !m.out.stderr.contains(&format!("{svc}:7300")),
        "{TEST}: the service address was checked"
    );
    assert!(addresses(env.host("a")).contains(&svc_prefix(&svc)), "{TEST}: {svc} left a");
}

/// A connection over a's loopback to a process that is not migrated:
/// at b nothing would answer it. The hello refuses it by name, before the
/// freeze, and the service runs on.
#[test]
fn the_hello_refuses_a_loopback_connection_to_a_process_that_stays() {
    const TEST: &str = "hello-loopback";
    if !have(TEST, &["python3"]) {
        return;
    }
    let (env, svc) = service_env("lb", &[], &[]);
    let upstream = env.dir.0.join("upstream.log");
    start_ready(
        &env,
        "a",
        &["python3", "-c", HOLDING_LISTENER, "127.0.0.1", "7310"],
        &env.dir.0,
        &upstream,
    );
    let (service, dir) = start_checked_service(
        &env,
        "svc",
        &[&format!("listen,{svc},7311"), "connect,127.0.0.1,127.0.0.1,7310"],
    );
    let watch = StopWatch::start(service.root);
    let m = env.migrate("a", service.inner, env.agent("b"), &["--address", &svc_prefix(&svc)]);
    assert_refused_before_freeze(
        TEST,
        &m,
        watch,
        &service,
        &dir,
        &[
            "-> 127.0.0.1:7310",
            "a loopback connection whose other end is outside the tree stays on this host",
            "migrate the process at the other end with it",
        ],
    );
}

#[test]
fn hello_refuses_a_port_taken_at_the_destination() {
    const TEST: &str = "hello-port";
    if !have(TEST, &["python3"]) {
        return;
    }
    let (env, svc) = service_env("pt", &[], &[]);
    let occupant_log = env.dir.0.join("occupant.log");
    let occupant = start_ready(
        &env,
        "b",
        &["python3", "-c", HOLDING_LISTENER, "0.0.0.0", "7301"],
        &env.dir.0,
        &occupant_log,
    );
    let (service, dir) =
        start_checked_service(&env, "svc", &[&format!("listen,{svc},7301"), "udp,0.0.0.0,7302"]);
    let watch = StopWatch::start(service.root);
    let m = env.migrate("a", service.inner, env.agent("b"), &["--address", &svc_prefix(&svc)]);
    assert_refused_before_freeze(
        TEST,
        &m,
        watch,
        &service,
        &dir,
        &[
            &format!("TCP listener {svc}:7301"),
            &format!(
                "TCP port 7301 is taken at the destination by pid {} (python3)",
                occupant.inner
            ),
            "stop what holds TCP port 7301 at the destination",
        ],
    );
    assert!(!m.out.stderr.contains("7302"), "{TEST}: the free UDP port was refused");
}

/// A file the tree maps that the destination lacks (on a tmpfs mounted
/// only in host a's mount namespace) is refused in the hello, naming it.
#[test]
fn hello_refuses_a_file_the_destination_lacks() {
    const TEST: &str = "hello-file";
    if !have(TEST, &["python3"]) {
        return;
    }
    let (env, svc) = service_env("fl", &[], &[]);
    let private = env.dir.0.join("only-at-a");
    fs::create_dir_all(&private).expect("mount point");
    let mounted =
        run_in(env.host("a"), 10, &["mount", "-t", "tmpfs", "ferry-test", path_str(&private)]);
    assert!(mounted.status.success(), "{TEST}: mount in host a: {}", mounted.stderr);
    let data = private.join("data");
    let (service, dir) = start_checked_service(
        &env,
        "svc",
        &[&format!("listen,{svc},7303"), &format!("map,{}", path_str(&data))],
    );
    let watch = StopWatch::start(service.root);
    let m = env.migrate("a", service.inner, env.agent("b"), &["--address", &svc_prefix(&svc)]);
    assert_refused_before_freeze(
        TEST,
        &m,
        watch,
        &service,
        &dir,
        &[
            &format!("{} (pid", data.display()),
            "no such regular file at the destination",
            "copy it to the destination",
        ],
    );
}

#[test]
fn dry_run_says_would_migrate_or_every_problem() {
    const TEST: &str = "dry-run";
    if !have(TEST, &["python3"]) {
        return;
    }
    let (env, svc) = service_env("dr", &[], &[]);
    let (a, b) = (env.host("a"), env.host("b"));
    a.set_next_pid(6000);
    let (service, dir) =
        start_checked_service(&env, "svc", &[&format!("listen,{svc},7303"), "listen,::1,7304"]);
    assert_eq!(service.inner, 6001, "{TEST}: the service did not get PID 6001 in a");
    let dry = |what: &str| {
        let watch = StopWatch::start(service.root);
        let m = env.migrate(
            "a",
            service.inner,
            env.agent("b"),
            &["--address", &svc_prefix(&svc), "--dry-run"],
        );
        assert_eq!(watch.finish(), None, "{TEST} ({what}): the service was stopped");
        eprintln!("[{TEST}] {what} in {:.0} ms:\n{}", m.took.as_secs_f64() * 1e3, m.out.stdout);
        m
    };
    let m = dry("nothing in the way");
    assert!(m.out.status.success(), "{TEST}: {}", m.out.show());
    assert!(
        m.out.stdout.contains(&format!("would migrate pid {}", service.inner)),
        "{TEST}: {}",
        m.out.show()
    );
    // b: IPv6 disabled (so no ::1), and PIDs from 5000 on unavailable.
    for conf in ["all", "lo"] {
        let key = format!("net.ipv6.conf.{conf}.disable_ipv6=1");
        let out = output({
            let mut c = Command::new("ip");
            c.args(["netns", "exec", &b.netns, "sysctl", "-w", &key]);
            c
        });
        assert!(out.status.success(), "{TEST}: {key} in b: {}", out.show());
    }
    let out = run_in(b, 10, &["sh", "-c", "echo 5000 > /proc/sys/kernel/pid_max"]);
    assert!(out.status.success(), "{TEST}: pid_max in b: {}", out.show());
    let m = dry("two problems");
    assert_eq!(m.out.status.code(), Some(2), "{TEST}: {}", m.out.show());
    for needle in [
        "would not migrate",
        "TCP listener [::1]:7304",
        "IPv6 is disabled there (net.ipv6.conf.lo.disable_ipv6=1)",
        "sysctl -w net.ipv6.conf.lo.disable_ipv6=0",
        "PID 6001",
        "kernel.pid_max of the destination (5000)",
        "sysctl -w kernel.pid_max=6002",
    ] {
        assert!(m.out.stdout.contains(needle), "{TEST}: {needle:?} not said: {}", m.out.show());
    }
    let c = counter(&dir);
    assert!(wait_for(Duration::from_secs(5), || counter(&dir) > c + 5), "{TEST}: not counting");
    let none = run_in(b, 10, &["pgrep", "-x", "python3"]);
    assert!(!none.status.success(), "{TEST}: the service runs in b: {}", none.show());
}

#[test]
fn fault_link_cut_during_precopy_noticed_within_seconds() {
    const TEST: &str = "fault-link-cut-precopy";
    if !have(TEST, &[REDIS, "redis-cli", "python3", "tc"]) {
        return;
    }
    let (env, svc, redis, mut client) = fault_setup("lp", &[], &[]);
    // 200 MB of memory, sent at 200 Mbit/s: round 0 takes about 8 s.
    let out = redis_cli(&env, &svc, &["SETRANGE", "big", "200000000", "x"]);
    assert!(out.stdout.trim().starts_with("200000001"), "{TEST}: SETRANGE: {}", out.show());
    let a = env.host("a");
    let out = output({
        let mut c = Command::new("tc");
        c.args(["-n", &a.netns, "qdisc", "add", "dev", "eth0", "root", "tbf"]);
        c.args(["rate", "200mbit", "burst", "256kb", "latency", "100ms"]);
        c
    });
    assert!(out.status.success(), "{TEST}: tc in a: {}", out.show());
    let (child, report, out, err) = migrate_in_background(
        &env,
        "a",
        redis.inner,
        env.agent("b"),
        &["--address", &svc_prefix(&svc)],
    );
    assert!(
        wait_for(Duration::from_secs(20), || read_lossy(&err).contains("connecting to")),
        "{TEST}: ferry migrate does not connect:\n{}",
        read_lossy(&err)
    );
    std::thread::sleep(Duration::from_millis(1500));
    assert!(!read_lossy(&err).contains("round 0"), "{TEST}: round 0 ended before the cut");
    let b = env.host("b");
    ip(&["-n", &b.netns, "link", "set", "eth0", "down"]);
    let cut = Instant::now();
    let m = finish_migration(child, &report, &out, &err, Duration::from_secs(40));
    let noticed = cut.elapsed();
    assert_failed_with(&m, TEST, &["timed out", "connection"]);
    assert!(
        noticed < Duration::from_secs(6),
        "{TEST}: the source took {noticed:?} after the cut to give up"
    );
    eprintln!("[{TEST}] the source gave up {:.1} s after the cut", noticed.as_secs_f64());
    let log = env.ferryd_log("b");
    assert!(
        wait_for(Duration::from_secs(10), || read_lossy(&log).contains("failed")),
        "{TEST}: the destination did not end the migration:\n{}",
        read_lossy(&log)
    );
    eprintln!(
        "[{TEST}] the destination gave up {:.1} s after the cut",
        cut.elapsed().as_secs_f64()
    );
    ip(&["-n", &b.netns, "link", "set", "eth0", "up"]);
    let mut counter = 1;
    assert_service_at_source(&env, &svc, &redis, &mut client, &mut counter, TEST);
    let none = run_in(b, 10, &["pgrep", "-x", "redis-server"]);
    assert!(!none.status.success(), "{TEST}: a redis-server runs in b: {}", none.show());
}

/// Echoes every line back, one thread per connection.
const ECHO_SERVER: &str = r#"import socket,sys,threading
s=socket.socket(); s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)
s.bind((sys.argv[1],int(sys.argv[2]))); s.listen(64)
print('ready',flush=True)
def echo(c):
    while True:
        d=c.recv(65536)
        if not d: break
        c.sendall(d)
while True:
    c,_=s.accept(); threading.Thread(target=echo,args=(c,),daemon=True).start()
"#;

/// haproxy in TCP mode on the service address, one backend server in c;
/// `source` is the server line's source clause, if any.
fn haproxy_config(svc: &str, backend: &str, source: &str) -> String {
    format!(
        "global\n  maxconn 100\n  nbthread 2\ndefaults\n  mode tcp\n  timeout connect 5s\n  timeout client 120s\n  timeout server 120s\n\
         frontend fe\n  bind {svc}:8080\n  default_backend be\nbackend be\n  server s1 {backend}:7000 {source}\n"
    )
}

#[test]
fn haproxy_backend_connections_from_the_host_address_are_refused_before_the_freeze() {
    const TEST: &str = "haproxy";
    if !have(TEST, &[HAPROXY, "python3"]) {
        return;
    }
    let (env, svc) = service_env("hp", &[], &[]);
    let (a_ip, c_ip) = (env.host("a").ip.to_string(), env.host("c").ip.to_string());
    let echo_log = env.dir.0.join("echo.log");
    start_ready(&env, "c", &["python3", "-c", ECHO_SERVER, &c_ip, "7000"], &env.dir.0, &echo_log);
    let start_haproxy = |source: &str, tag: &str| {
        let cfg = env.dir.0.join(format!("haproxy-{tag}.cfg"));
        fs::write(&cfg, haproxy_config(&svc, &c_ip, source)).expect("haproxy config");
        let log = env.dir.0.join(format!("haproxy-{tag}.log"));
        let p =
            start_in(env.host("a"), &[HAPROXY, "-db", "-f", path_str(&cfg)], &env.dir.0, &log, &[]);
        let up = wait_for(Duration::from_secs(15), || {
            run_in(
                env.host("c"),
                5,
                &[
                    "python3",
                    "-c",
                    "import socket,sys; socket.create_connection((sys.argv[1],8080),timeout=2)",
                    &svc,
                ],
            )
            .status
            .success()
        });
        assert!(up, "{TEST}: haproxy does not accept on {svc}:8080:\n{}", read_lossy(&log));
        p
    };

    // Its backend connection leaves from a's own address.
    let haproxy = start_haproxy("", "host-source");
    let mut client = KeptClient::open_to(&env, &svc, "8080");
    assert_eq!(client.ask("one"), "one", "{TEST}: through haproxy");
    let watch = StopWatch::start(haproxy.root);
    let m = env.migrate("a", haproxy.inner, env.agent("b"), &["--address", &svc_prefix(&svc)]);
    let stopped = watch.finish();
    assert!(!m.out.status.success(), "{TEST}: migrated: {}", m.out.show());
    for needle in [
        format!("TCP {a_ip}:"),
        format!("-> {c_ip}:7000"),
        "nothing was frozen".to_string(),
        format!("haproxy `source {svc}`"),
    ] {
        assert!(m.out.stderr.contains(&needle), "{TEST}: {needle:?} not said: {}", m.out.show());
    }
    assert_eq!(stopped, None, "{TEST}: haproxy was stopped");
    assert_eq!(client.ask("two"), "two", "{TEST}: through haproxy after the refusal");
    eprintln!("[{TEST}] refused in {:.0} ms:\n{}", m.took.as_secs_f64() * 1e3, m.out.stderr);
    drop(client);
    kill(haproxy.root, libc::SIGKILL);

    // `source <service address>`: the connection moves with the address.
    let haproxy = start_haproxy(&format!("source {svc}"), "service-source");
    let mut client = KeptClient::open_to(&env, &svc, "8080");
    assert_eq!(client.ask("three"), "three", "{TEST}: through haproxy sourcing from {svc}");
    let m = env.migrate("a", haproxy.inner, env.agent("b"), &["--address", &svc_prefix(&svc)]);
    let pid_b = m.expect_ok(TEST);
    assert!(env.host("b").root_pid(pid_b).is_some_and(alive), "{TEST}: haproxy does not run in b");
    assert_eq!(client.ask("four"), "four", "{TEST}: the kept connection after the migration");
    eprintln!("[{TEST}] with `source {svc}`: migrated, pause {:.1} ms", m.pause_ms());
}

// ---------------------------------------------------------------------------
// Part of a tree

/// `ferry migrate` of the child of tests/guarantees/shared_counter.c in
/// `mode`, inside host a: refused with `needles` in the error, before
/// anything moved, and the pair runs on and passes its own check.
fn migrating_a_child_alone_is_refused(env: &Env, bin: &Path, mode: &str, needles: &[&str]) {
    let work = env.dir.0.join(mode);
    fs::create_dir_all(&work).expect("work dir");
    let log = work.join("program.log");
    let mut p = start_in(env.host("a"), &[path_str(bin), mode], &work, &log, &[]);
    assert!(
        wait_for(Duration::from_secs(15), || read_lossy(&log).contains("READY")),
        "[{mode}] no READY: {}",
        read_lossy(&log)
    );
    let child: i32 = read_lossy(&log)
        .lines()
        .find_map(|l| l.strip_prefix("# CHILD "))
        .and_then(|c| c.trim().parse().ok())
        .unwrap_or_else(|| panic!("[{mode}] no child PID: {}", read_lossy(&log)));
    let m = env.migrate("a", child, env.agent("b"), &[]);
    assert_failed_with(&m, mode, needles);
    // The parent checks that it still shares with its child, or that the
    // child still runs.
    kill(p.root, libc::SIGUSR2);
    let st = wait_timeout(&mut p.nsenter, Duration::from_secs(20));
    let log = read_lossy(&log);
    assert!(st.is_some_and(|s| s.success()) && log.contains("PASS"), "[{mode}] {log}");
}

/// The shared-counter pair (and the pair whose parent waits for its
/// child): migrating the child alone is refused by name, and both run on.
#[test]
fn migrating_part_of_a_tree_is_refused_and_the_pair_runs_on() {
    const TEST: &str = "part-of-a-tree";
    if !have(TEST, &["gcc"]) {
        return;
    }
    let env = Env::new(TEST, &["a", "b"]);
    env.start_ferryd("a", &[], &[]);
    env.start_ferryd("b", &[], &[]);
    let bin = env.dir.0.join("shared_counter");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/guarantees/shared_counter.c");
    let st = Command::new("gcc")
        .args(["-O1", "-g", "-pthread", "-o", path_str(&bin), path_str(&src)])
        .status()
        .expect("gcc");
    assert!(st.success(), "compiling shared_counter.c failed");
    migrating_a_child_alone_is_refused(&env, &bin, "anon", &["shared memory", "maps it too"]);
    migrating_a_child_alone_is_refused(&env, &bin, "pipe", &["the same pipe"]);
    migrating_a_child_alone_is_refused(&env, &bin, "parent", &["--parent-sees-exit"]);
}
