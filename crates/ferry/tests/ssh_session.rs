//! OpenSSH sessions moved with their sshd: Debian's `sshd -D` runs in test
//! host a (tests/common/cluster.rs, ferryd as PID 1 of a and b, each with
//! a devpts instance of its own, as two machines have), bound to a service
//! address; host c holds two sessions, one with a pty (`ssh -tt`, an
//! interactive bash running a counter in the background) and one without
//! (`ssh -T`, a counter loop). `ferry migrate` moves the sshd tree (the
//! daemon, each session's monitor and session process, the shells and
//! their loops) to host b with the address. Both counters must go on with
//! no gap and no reset, and the interactive shell must still run a typed
//! command.
//!
//! Needs root and `/usr/sbin/sshd`, `ssh`, `ssh-keygen` (Debian packages
//! openssh-server and openssh-client, scripts/install-deps.sh); without
//! them the test says so and passes. `FERRY_TEST_KEEP=1` keeps its
//! directory (logs, sshd config, the clients' output).

mod common;

use common::cluster::{Cluster, Host};
use common::{path_str, read_lossy, wait_for};
use ferry_testkit::TempDir;
use ferry_testkit::{is_root, kill};
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const FERRY: &str = env!("CARGO_BIN_EXE_ferry");
const FERRYD: &str = env!("CARGO_BIN_EXE_ferryd");
const SSHD: &str = "/usr/sbin/sshd";
const AGENT_PORT: u16 = 7070;
const SSH_PORT: &str = "2222";
const PLAIN_INIT: &[&str] = &["sh", "-c", "trap : TERM; while :; do wait; sleep 0.2; done"];

/// Runs `cmd` with only fds 0-2, stdin empty; (success, stdout + stderr).
fn run(mut cmd: Command) -> (bool, String) {
    let o = ferry_testkit::only_stdio(&mut cmd)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    let text =
        format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    (o.status.success(), text)
}

fn sh_in(host: &Host, script: &str) {
    let (ok, out) = run(host.command(&["sh", "-c", script]));
    assert!(ok, "in host {}: {script}: {out}", host.name);
}

/// A process started inside a host, killed by its root PID on drop (the
/// cluster's drop would end it too).
struct InHost {
    nsenter: Child,
    root: i32,
    inner: i32,
}

impl Drop for InHost {
    fn drop(&mut self) {
        kill(self.root, libc::SIGKILL);
        let _ = self.nsenter.kill();
        let _ = self.nsenter.wait();
    }
}

fn start_in(host: &Host, argv: &[&str], log: &Path, stdin: Stdio) -> InHost {
    let logf = File::create(log).expect("log");
    let mut cmd = host.command(argv);
    cmd.stdin(stdin).stdout(logf.try_clone().expect("dup log")).stderr(logf);
    let nsenter = ferry_testkit::only_stdio(&mut cmd).spawn().expect("spawn in host");
    let (root, inner) = host.wait_spawned_pid(&nsenter);
    InHost { nsenter, root, inner }
}

/// Dropped in field order: the directory first, so that it goes also
/// when the cluster's teardown panics.
struct Env {
    dir: TempDir,
    c: Cluster,
    key: PathBuf,
    svc: String,
}

impl Env {
    fn new() -> Env {
        let dir = TempDir::new("ferry-ssh", "session");
        let key = dir.0.join("key");
        let (ok, out) = run({
            let mut c = Command::new(FERRY);
            c.arg("keygen").arg(&key);
            c
        });
        assert!(ok, "ferry keygen: {out}");
        let env = Env { dir, c: Cluster::new(&["a", "b", "c"]), key, svc: String::new() };
        let svc = env.c.subnet_addr(100).to_string();
        for h in ["a", "b"] {
            env.start_ferryd(h);
            // sshd's privilege separation directory.
            sh_in(env.c.host(h), "mkdir -p /run/sshd && chmod 755 /run/sshd");
        }
        env.c.host("c").start_init(PLAIN_INIT);
        let a = env.c.host("a");
        let (ok, out) = run({
            let mut c = Command::new("ip");
            c.args(["-n", &a.netns, "addr", "add", &format!("{svc}/24"), "dev", "eth0"]);
            c
        });
        assert!(ok, "service address: {out}");
        Env { svc, ..env }
    }

    fn start_ferryd(&self, name: &str) {
        let h = self.c.host(name);
        let log = self.dir.0.join(format!("ferryd-{name}.log"));
        let listen = format!("{}:{AGENT_PORT}", h.ip);
        h.start_ferryd(FERRYD, &listen, &self.key, &log, &[], &[]);
    }

    /// Host keys, the client's key, authorized_keys and the config of an
    /// sshd bound to the service address.
    fn sshd_config(&self) -> PathBuf {
        let d = &self.dir.0;
        for k in ["host_key", "client_key"] {
            let (ok, out) = run({
                let mut c = Command::new("ssh-keygen");
                c.args(["-q", "-t", "ed25519", "-N", "", "-f"]).arg(d.join(k));
                c
            });
            assert!(ok, "ssh-keygen {k}: {out}");
        }
        fs::copy(d.join("client_key.pub"), d.join("authorized_keys")).expect("authorized_keys");
        let cfg = d.join("sshd_config");
        fs::write(
            &cfg,
            format!(
                "Port {SSH_PORT}\nListenAddress {}\nHostKey {}\nAuthorizedKeysFile {}\n\
                 PermitRootLogin yes\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n\
                 UsePAM no\nPidFile none\nStrictModes no\nPrintMotd no\nPrintLastLog no\nUseDNS no\n\
                 LogLevel VERBOSE\n",
                self.svc,
                path_str(&d.join("host_key")),
                path_str(&d.join("authorized_keys")),
            ),
        )
        .expect("sshd_config");
        cfg
    }

    fn ssh_argv<'a>(&'a self, key: &'a str, tty: &'a str) -> Vec<&'a str> {
        vec![
            "ssh",
            tty,
            "-i",
            key,
            "-p",
            SSH_PORT,
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "UserKnownHostsFile=/dev/null",
            "-o",
            "BatchMode=yes",
            "-o",
            "LogLevel=ERROR",
        ]
    }
}

/// The numbers of lines `<tag><n>` in `text` (the last word of a line, so
/// a prompt before it does not hide it), in order.
fn counts(text: &str, tag: char) -> Vec<u64> {
    text.lines()
        .filter_map(|l| l.trim_end_matches('\r').split_whitespace().last())
        .filter_map(|w| w.strip_prefix(tag)?.parse().ok())
        .collect()
}

/// The counter went 1, 2, 3... with no gap, repeat or reset.
fn assert_no_gap(what: &str, seen: &[u64]) {
    assert!(!seen.is_empty(), "{what}: no counter line");
    for (i, w) in seen.windows(2).enumerate() {
        assert_eq!(w[1], w[0] + 1, "{what}: counter went {} -> {} (line {})", w[0], w[1], i + 1);
    }
    assert_eq!(seen[0], 1, "{what}: the counter did not start at 1");
}

#[test]
fn ssh_sessions_with_and_without_a_pty_survive_a_migration() {
    const TEST: &str = "ssh-session";
    if !is_root() {
        eprintln!("[{TEST}] skipped: needs root");
        return;
    }
    for p in [SSHD, "/usr/bin/ssh", "/usr/bin/ssh-keygen"] {
        if !Path::new(p).exists() {
            eprintln!("[{TEST}] skipped: {p} is not installed");
            return;
        }
    }
    let env = Env::new();
    let cfg = env.sshd_config();
    let sshd_log = env.dir.0.join("sshd.log");
    let sshd = start_in(
        env.c.host("a"),
        &[SSHD, "-D", "-e", "-f", path_str(&cfg)],
        &sshd_log,
        Stdio::null(),
    );
    assert!(
        wait_for(Duration::from_secs(15), || read_lossy(&sshd_log).contains("Server listening")),
        "{TEST}: sshd does not listen:\n{}",
        read_lossy(&sshd_log)
    );
    let key = env.dir.0.join("client_key");
    let target = format!("root@{}", env.svc);

    // Without a pty: a loop as the remote command.
    let plain_out = env.dir.0.join("plain.out");
    let mut argv = env.ssh_argv(path_str(&key), "-T");
    let plain_loop = "i=0; while :; do i=$((i+1)); echo B$i; sleep 0.05; done";
    argv.extend([target.as_str(), plain_loop]);
    let plain = start_in(env.c.host("c"), &argv, &plain_out, Stdio::null());

    // With a pty: an interactive shell, the loop a background job of it.
    let tty_out = env.dir.0.join("tty.out");
    let mut argv = env.ssh_argv(path_str(&key), "-tt");
    argv.push(target.as_str());
    let mut tty = start_in(env.c.host("c"), &argv, &tty_out, Stdio::piped());
    let mut typed = tty.nsenter.stdin.take().expect("ssh stdin");
    let started = wait_for(Duration::from_secs(20), || {
        counts(&read_lossy(&plain_out), 'B').len() >= 5 && read_lossy(&tty_out).contains('#')
    });
    assert!(
        started,
        "{TEST}: sessions did not start:\n--- sshd ---\n{}\n--- plain ---\n{}\n--- tty ---\n{}",
        read_lossy(&sshd_log),
        read_lossy(&plain_out),
        read_lossy(&tty_out)
    );
    typed
        .write_all(b"(i=0; while :; do i=$((i+1)); echo A$i; sleep 0.05; done) &\n")
        .expect("type the loop");
    assert!(
        wait_for(Duration::from_secs(10), || counts(&read_lossy(&tty_out), 'A').len() >= 10),
        "{TEST}: the interactive loop does not count:\n{}",
        read_lossy(&tty_out)
    );

    let m = migrate(&env, sshd.inner);
    let (before_a, before_b) =
        (counts(&read_lossy(&tty_out), 'A').len(), counts(&read_lossy(&plain_out), 'B').len());
    assert!(
        wait_for(Duration::from_secs(10), || {
            counts(&read_lossy(&tty_out), 'A').len() >= before_a + 20
                && counts(&read_lossy(&plain_out), 'B').len() >= before_b + 20
        }),
        "{TEST}: counters stopped after the migration ({m}):\n--- plain ---\n{}\n--- tty ---\n{}",
        read_lossy(&plain_out),
        read_lossy(&tty_out)
    );
    assert_no_gap("session without a pty", &counts(&read_lossy(&plain_out), 'B'));
    assert_no_gap("session with a pty", &counts(&read_lossy(&tty_out), 'A'));

    // The interactive shell still takes commands (its echo may mix with
    // the counter's lines, so the counter is checked before).
    typed.write_all(b"echo hello-$((6*7)) $(tty)\n").expect("type a command");
    assert!(
        wait_for(Duration::from_secs(10), || read_lossy(&tty_out).contains("hello-42 /dev/pts/")),
        "{TEST}: the interactive shell does not answer after the migration:\n{}",
        read_lossy(&tty_out)
    );
    eprintln!("[{TEST}] {m}");
    drop(typed);
    drop(tty);
    drop(plain);
    drop(sshd);
}

/// `ferry migrate` of the sshd tree (pid `inner` in host a) to b with the
/// service address; returns a line about it (pause), panics on failure.
fn migrate(env: &Env, inner: i32) -> String {
    let report = env.dir.0.join("report.json");
    let to = format!("{}:{AGENT_PORT}", env.c.host("b").ip);
    let pid = inner.to_string();
    let addr = format!("{}/24", env.svc);
    let argv = [
        "timeout",
        "-s",
        "KILL",
        "60",
        FERRY,
        "migrate",
        "--pid",
        &pid,
        "--to",
        &to,
        "--key",
        path_str(&env.key),
        "--address",
        &addr,
        "--report",
        path_str(&report),
    ];
    let t = Instant::now();
    let (ok, out) = run(env.c.host("a").command(&argv));
    assert!(ok, "ferry migrate of sshd failed: {out}");
    let r: serde_json::Value =
        serde_json::from_slice(&fs::read(&report).expect("report")).expect("report json");
    let dest = r["dest_host_pid"].as_i64().expect("dest_host_pid") as i32;
    assert!(env.c.host("b").root_pid(dest).is_some(), "sshd does not run in b");
    format!(
        "migrated in {:.0} ms, pause {:.1} ms",
        t.elapsed().as_secs_f64() * 1e3,
        r["pause_ms"].as_f64().unwrap_or(f64::NAN)
    )
}
