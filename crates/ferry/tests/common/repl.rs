//! A replicated service between test hosts (tests/common/cluster.rs), for
//! the replication tests: hosts a and b run ferryd with --etcd (and, for
//! the data-directory tests, each its own btrfs at the same path), c the
//! clients, w the witness's etcd (started by the test, never a system
//! service). The service address is on a's eth0.
//!
//! Everything a test makes here goes with the cluster's drop (each host's
//! PID 1 killed, its namespaces deleted; etcd is a process of host w and
//! its data under the test's TempDir), also when the test fails.

use super::btrfs::HostBtrfs;
use super::hosts::*;
use super::{path_str, read_lossy, wait_for};
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus, Stdio};
use std::time::Duration;

pub const REDIS: &str = "/usr/bin/redis-server";
pub const ETCD: &str = "/usr/bin/etcd";
pub const REDIS_PORT: &str = "6379";

pub struct Repl {
    /// a's and b's btrfs (`with_btrfs`), dropped first: unmounted while
    /// their hosts still run.
    pub fs: Vec<HostBtrfs>,
    pub env: Env,
    pub svc: String,
    pub etcd_url: String,
    pub etcd: Started,
}

impl Repl {
    /// The hosts, etcd in w, ferryd in a and b (b's with `b_env` in its
    /// environment: a fault to inject there), the service address on a.
    pub fn new(tag: &str, b_env: &[(&str, &str)]) -> Repl {
        let env = Env::new(tag, &["a", "b", "c", "w"]);
        env.start_plain("w");
        env.start_plain("c");
        let etcd_url = format!("http://{}:2379", env.host("w").ip);
        let etcd = start_etcd(&env, &etcd_url);
        env.start_ferryd("a", &[], &["--etcd", &etcd_url]);
        env.start_ferryd("b", b_env, &["--etcd", &etcd_url]);
        let svc = env.c.subnet_addr(100).to_string();
        ip(&["-n", &env.host("a").netns, "addr", "add", &format!("{svc}/24"), "dev", "eth0"]);
        Repl { fs: Vec::new(), env, svc, etcd_url, etcd }
    }

    /// `new` with a `size_mb` btrfs of its own in a and in b, mounted at
    /// the same path in both (`mount`).
    pub fn with_btrfs(tag: &str, size_mb: u64) -> Repl {
        let mut r = Repl::new(tag, &[]);
        let mount = r.env.dir.0.join("fs");
        for h in ["a", "b"] {
            let img = r.env.dir.0.join(format!("{h}.btrfs"));
            r.fs.push(HostBtrfs::new(r.env.host(h), &img, &mount, size_mb));
        }
        r
    }

    /// Where a's and b's btrfs are mounted.
    pub fn mount(&self) -> &Path {
        &self.fs[0].mount
    }

    /// A subvolume `name` on a's btrfs: a data directory.
    pub fn data_dir(&self, name: &str) -> PathBuf {
        self.fs[0].subvolume(self.env.host("a"), name)
    }

    /// `argv` in `host`, killed after 60 s.
    pub fn in_host(&self, host: &str, argv: &[&str]) -> Out {
        run_in(self.env.host(host), 60, argv)
    }

    /// ferryd in `host` again (after `kill_host`), with --etcd.
    pub fn restart_ferryd(&self, host: &str) {
        self.env.start_ferryd(host, &[], &["--etcd", &self.etcd_url]);
    }

    pub fn svc_prefix(&self) -> String {
        format!("{}/24", self.svc)
    }

    pub fn log(&self, name: &str) -> PathBuf {
        self.env.dir.0.join(name)
    }

    /// redis-server in a, answering on the service address.
    pub fn start_redis(&self) -> Started {
        let dir = self.log("redis");
        std::fs::create_dir_all(&dir).expect("redis dir");
        self.start_redis_in(&dir, &["--appendonly", "no"], 20)
    }

    /// redis-server in a with its files in `dir` and `persist` (its
    /// --appendonly settings), answering on the service address; its
    /// log is redis.log. Each redis-cli PING is killed after `cli_secs`.
    pub fn start_redis_in(&self, dir: &Path, persist: &[&str], cli_secs: u32) -> Started {
        let log = self.log("redis.log");
        let mut argv = vec![REDIS, "--bind", &self.svc, "--port", REDIS_PORT, "--save", ""];
        argv.extend_from_slice(persist);
        argv.extend(["--daemonize", "no", "--protected-mode", "no", "--dir", path_str(dir)]);
        let r = start_in(self.env.host("a"), &argv, &self.env.dir.0, &log, &[]);
        let up = wait_for(Duration::from_secs(15), || {
            self.redis_within(cli_secs, &["PING"]).stdout.trim() == "PONG"
        });
        assert!(up, "redis does not answer on {}:\n{}", self.svc, read_lossy(&log));
        r
    }

    /// redis-cli from c.
    pub fn redis(&self, args: &[&str]) -> Out {
        self.redis_within(20, args)
    }

    /// redis-cli from c, killed after `secs`.
    pub fn redis_within(&self, secs: u32, args: &[&str]) -> Out {
        let mut argv = vec!["redis-cli", "-h", &self.svc, "-p", REDIS_PORT];
        argv.extend_from_slice(args);
        run_in(self.env.host("c"), secs, &argv)
    }

    /// `ferry replicate` of `pid` (inside a) to b's agent with `extra`
    /// arguments and `env`, in the background; returns once it printed
    /// "in sync".
    pub fn replicate(&self, pid: i32, extra: &[&str], env: &[(&str, &str)]) -> Replicating {
        self.in_sync(self.replicate_nowait(pid, extra, env))
    }

    /// `r` once it printed "in sync" (within 60 s).
    pub fn in_sync(&self, r: Replicating) -> Replicating {
        let synced = wait_for(Duration::from_secs(60), || read_lossy(&r.out).contains("in sync"));
        assert!(synced, "ferry replicate never got in sync:\n{}", r.show());
        r
    }

    pub fn replicate_nowait(&self, pid: i32, extra: &[&str], env: &[(&str, &str)]) -> Replicating {
        self.replicate_to("a", &self.env.agent("b").to_string(), pid, extra, env)
    }

    /// `ferry replicate` of `pid` (as host `from` sees it) toward `to`
    /// (IP:PORT), not waiting.
    pub fn replicate_to(
        &self,
        from: &str,
        to: &str,
        pid: i32,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Replicating {
        let out = self.log(&format!("replicate-{from}.out"));
        let err = self.log(&format!("replicate-{from}.err"));
        let pid_s = pid.to_string();
        let svc = self.svc_prefix();
        let mut argv = vec![
            "timeout",
            "-s",
            "KILL",
            "300",
            FERRY,
            "replicate",
            "--pid",
            &pid_s,
            "--to",
            to,
            "--key",
            path_str(&self.env.key),
            "--address",
            &svc,
            "--etcd",
            &self.etcd_url,
        ];
        argv.extend_from_slice(extra);
        let mut cmd = self.env.host(from).command(&argv);
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.stdout(std::fs::File::create(&out).expect("out"))
            .stderr(std::fs::File::create(&err).expect("err"))
            .stdin(Stdio::null());
        let child = ferry_testkit::only_stdio(&mut cmd).spawn().expect("ferry replicate");
        Replicating { child, out, err }
    }

    /// The witness's etcd killed (its data stays) or started again.
    pub fn etcd_down(&mut self) {
        ferry_testkit::kill(self.etcd.root, libc::SIGKILL);
        let _ = wait_timeout(&mut self.etcd.nsenter, Duration::from_secs(10));
    }

    pub fn etcd_up(&mut self) {
        self.etcd = start_etcd(&self.env, &self.etcd_url);
    }

    /// The syncs `host`'s status reports once it counts more than
    /// `before` (the file is rewritten once a second), or after 10 s.
    pub fn syncs_after(&self, host: &str, before: u64) -> u64 {
        let syncs = || self.status(host)[0]["syncs"].as_u64().unwrap_or(0);
        wait_for(Duration::from_secs(10), || syncs() > before);
        syncs()
    }

    /// Host `name` dies: its link first (nothing it says reaches anyone,
    /// not even the closing of its connections), then every process of it.
    pub fn kill_host(&self, name: &str) {
        ip(&["-n", &self.env.host(name).netns, "link", "set", "eth0", "down"]);
        self.env.host(name).stop_init();
    }

    /// Whether a process named `name` runs in `host` (a zombie, killed
    /// and not reaped yet, does not; one stopped by a sync's freeze does).
    pub fn runs_in(&self, host: &str, name: &str) -> bool {
        run_in(self.env.host(host), 20, &["pgrep", "-r", "R,S,D,T,t", "-x", name]).status.success()
    }

    pub fn has_address(&self, host: &str) -> bool {
        addresses(self.env.host(host)).contains(&self.svc_prefix())
    }

    /// The service (`program`) and its address are in `host` and not in
    /// `other` (whose host may be dead: then only `host` is looked at).
    pub fn assert_only_in(&self, host: &str, other: &str, program: &str, why: &str) {
        assert!(self.runs_in(host, program), "{why}: {program} does not run in {host}");
        assert!(self.has_address(host), "{why}: the service address is not on {host}");
        if other_alive(&self.env, other) {
            assert!(!self.runs_in(other, program), "{why}: {program} runs in {other} too");
            assert!(!self.has_address(other), "{why}: the service address is on {other} too");
        }
    }

    /// `ferry status --json` in `host`.
    pub fn status(&self, host: &str) -> serde_json::Value {
        let out = run_in(self.env.host(host), 20, &[FERRY, "status", "--json"]);
        assert!(out.status.success(), "ferry status in {host}: {}", out.show());
        serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", out.stdout))
    }

    /// The NFQUEUE rules in `host`'s mangle table (the output commit's hold).
    pub fn holds_in(&self, host: &str) -> Vec<String> {
        let out = run_in(self.env.host(host), 20, &["iptables", "-w", "10", "-t", "mangle", "-S"]);
        assert!(out.status.success(), "iptables -S in {host}: {}", out.show());
        out.stdout.lines().filter(|l| l.contains("NFQUEUE")).map(String::from).collect()
    }

    /// Waits for `what` in b's ferryd log; panics with the log after `secs`.
    pub fn wait_b_log(&self, what: &str, secs: u64) -> String {
        let log = self.env.ferryd_log("b");
        let seen = wait_for(Duration::from_secs(secs), || read_lossy(&log).contains(what));
        assert!(seen, "b's ferryd never said {what:?}:\n{}", read_lossy(&log));
        read_lossy(&log)
    }
}

/// Whether `host` still has its init (a host killed by `kill_host` has not).
fn other_alive(env: &Env, host: &str) -> bool {
    env.host(host).has_init()
}

fn start_etcd(env: &Env, url: &str) -> Started {
    let w = env.host("w");
    let peer = format!("http://{}:2380", w.ip);
    let data = env.dir.0.join("etcd");
    let log = env.dir.0.join("etcd.log");
    let cluster = format!("w={peer}");
    let argv = [
        ETCD,
        "--name",
        "w",
        "--data-dir",
        path_str(&data),
        "--listen-client-urls",
        url,
        "--advertise-client-urls",
        url,
        "--listen-peer-urls",
        &peer,
        "--initial-advertise-peer-urls",
        &peer,
        "--initial-cluster",
        &cluster,
    ];
    let e = start_in(w, &argv, &env.dir.0, &log, &[]);
    let ready = wait_for(Duration::from_secs(20), || {
        read_lossy(&log).contains("ready to serve client requests")
    });
    assert!(ready, "etcd did not start in w:\n{}", read_lossy(&log));
    e
}

/// The PID (inside its host) a ferryd reports in its log `log` for the
/// tree it took over.
pub fn taken_over_pid(log: &str) -> Option<i32> {
    let line = log.lines().find(|l| l.contains("took over"))?;
    line.split(" runs here as pid ").nth(1)?.split_whitespace().next()?.parse().ok()
}

/// A `ferry replicate` running in a host.
pub struct Replicating {
    pub child: Child,
    pub out: PathBuf,
    pub err: PathBuf,
}

impl Replicating {
    pub fn show(&self) -> String {
        format!(
            "--- stdout ---\n{}--- stderr ---\n{}",
            read_lossy(&self.out),
            read_lossy(&self.err)
        )
    }

    pub fn wait(&mut self, limit: Duration) -> ExitStatus {
        wait_timeout(&mut self.child, limit)
            .unwrap_or_else(|| panic!("ferry replicate did not end:\n{}", self.show()))
    }

    /// Waits for `what` in its stderr (a fault's stall line).
    pub fn wait_err(&self, what: &str, secs: u64) {
        let seen = wait_for(Duration::from_secs(secs), || read_lossy(&self.err).contains(what));
        assert!(seen, "ferry replicate never said {what:?}:\n{}", self.show());
    }
}

/// A client script of tests/replication/ run in c with `args`; returns
/// once it printed "started".
pub fn clients(r: &Repl, script: &str, args: &[&str]) -> (Child, PathBuf) {
    let path = format!("{}/../../tests/replication/{script}", env!("CARGO_MANIFEST_DIR"));
    let out = r.log(&format!("{script}.out"));
    let mut argv = vec!["python3", path.as_str()];
    argv.extend_from_slice(args);
    let mut cmd = r.env.host("c").command(&argv);
    cmd.stdout(std::fs::File::create(&out).expect("clients out"))
        .stderr(Stdio::inherit())
        .stdin(Stdio::null());
    let child = ferry_testkit::only_stdio(&mut cmd).spawn().expect("clients");
    let started = wait_for(Duration::from_secs(10), || read_lossy(&out).contains("started"));
    assert!(started, "the clients did not start:\n{}", read_lossy(&out));
    (child, out)
}

/// The clients' last line (a JSON list, one object per connection) once
/// they ended; panics if they failed, or on any connection's error.
pub fn client_results(mut child: Child, out: &Path) -> Vec<serde_json::Value> {
    let st = wait_timeout(&mut child, Duration::from_secs(90));
    let text = read_lossy(out);
    let st = st.unwrap_or_else(|| {
        let _ = child.kill();
        panic!("the clients did not end:\n{text}")
    });
    assert!(st.success(), "clients failed: {text}");
    let json = text.lines().last().unwrap_or_default();
    let v: serde_json::Value = serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {text}"));
    let all = v.as_array().unwrap_or_else(|| panic!("not a list: {text}")).clone();
    for c in &all {
        assert!(c["error"].is_null(), "a client failed: {c}\nall: {text}");
    }
    all
}

/// tests/replication/seq_clients.py from c: `n` connections for `secs`.
pub fn seq_clients(r: &Repl, n: u32, secs: f64) -> (Child, PathBuf) {
    let (n, secs) = (n.to_string(), secs.to_string());
    clients(r, "seq_clients.py", &[&r.svc, REDIS_PORT, &n, &secs])
}

/// The sequence clients' results: (count, last value, longest wait ms)
/// each; panics on any client's error.
pub fn seq_results(child: Child, out: &Path) -> Vec<(u64, i64, f64)> {
    client_results(child, out)
        .iter()
        .map(|c| {
            (
                c["count"].as_u64().unwrap_or(0),
                c["last"].as_i64().unwrap_or(-1),
                c["gap_ms"].as_f64().unwrap_or(f64::NAN),
            )
        })
        .collect()
}
