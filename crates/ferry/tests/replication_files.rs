//! Files as part of the replicated state (`ferry replicate --data-dir`):
//! host a runs the service with its data directory on a btrfs of its own,
//! b's ferryd keeps the standby (its own btrfs at the same path), c runs
//! the clients, w the witness's etcd. Each host's btrfs is a loop-mounted
//! file (tests/common/btrfs.rs).
//!
//! - `redis_aof_always_fails_over_with_its_files` and
//!   `redis_aof_everysec_fails_over_with_its_files`: redis with
//!   `appendonly yes` under 10 sequence-checking clients; host a dies; at
//!   b every counter is the last value its client was told, the AOF
//!   passes redis-check-aof, and a second redis started from a copy of
//!   b's files reads the same values.
//! - `postgres_fails_over_with_its_files_and_restarts_clean`: PostgreSQL
//!   under pgbench-like clients counting committed transactions; host a
//!   dies; at b every committed transaction is there, new ones commit,
//!   and `pg_ctl stop` then a start come up clean.
//! - `a_data_dir_that_is_not_a_subvolume_is_refused_by_name`.
//!
//! Needs root, btrfs-progs, etcd and the programs of each test; without
//! them each test says so and returns.

mod common;

use common::btrfs::HostBtrfs;
use common::hosts::*;
use common::{path_str, read_lossy, wait_for};
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

const REDIS: &str = "/usr/bin/redis-server";
const ETCD: &str = "/usr/bin/etcd";
const REDIS_PORT: &str = "6379";

/// Hosts a, b (ferryd with --etcd, each its own btrfs at `mount`), c
/// (clients), w (etcd), the service address on a's eth0.
struct Files {
    // Dropped first: the filesystems while their hosts still run.
    fs: Vec<HostBtrfs>,
    env: Env,
    svc: String,
    etcd_url: String,
    _etcd: Started,
}

impl Files {
    fn new(tag: &str) -> Files {
        let env = Env::new(tag, &["a", "b", "c", "w"]);
        env.start_plain("w");
        env.start_plain("c");
        let (etcd, etcd_url) = start_etcd(&env);
        for h in ["a", "b"] {
            env.start_ferryd(h, &[], &["--etcd", &etcd_url]);
        }
        let mount = env.dir.0.join("fs");
        let fs = ["a", "b"]
            .iter()
            .map(|h| {
                let img = env.dir.0.join(format!("{h}.btrfs"));
                HostBtrfs::new(env.host(h), &img, &mount, 1024)
            })
            .collect();
        let svc = env.c.subnet_addr(100).to_string();
        ip(&["-n", &env.host("a").netns, "addr", "add", &format!("{svc}/24"), "dev", "eth0"]);
        Files { fs, env, svc, etcd_url, _etcd: etcd }
    }

    fn mount(&self) -> &Path {
        &self.fs[0].mount
    }

    /// A subvolume `name` on a's btrfs: the data directory.
    fn data_dir(&self, name: &str) -> PathBuf {
        self.fs[0].subvolume(self.env.host("a"), name)
    }

    fn in_host(&self, host: &str, argv: &[&str]) -> Out {
        run_in(self.env.host(host), 60, argv)
    }

    fn redis(&self, args: &[&str]) -> Out {
        let mut argv = vec!["redis-cli", "-h", &self.svc, "-p", REDIS_PORT];
        argv.extend_from_slice(args);
        self.in_host("c", &argv)
    }

    /// `ferry replicate` of `pid` (inside a) to b with `extra`, in the
    /// background.
    fn replicate(&self, pid: i32, extra: &[&str]) -> Replicating {
        let (out, err) =
            (self.env.dir.0.join("replicate.out"), self.env.dir.0.join("replicate.err"));
        let pid_s = pid.to_string();
        let to = self.env.agent("b").to_string();
        let svc = format!("{}/24", self.svc);
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
            &to,
            "--key",
        ];
        argv.extend([path_str(&self.env.key), "--address", &svc, "--etcd", &self.etcd_url]);
        argv.extend_from_slice(extra);
        let mut cmd = self.env.host("a").command(&argv);
        cmd.stdout(std::fs::File::create(&out).expect("out"))
            .stderr(std::fs::File::create(&err).expect("err"))
            .stdin(std::process::Stdio::null());
        let child = ferry_testkit::only_stdio(&mut cmd).spawn().expect("ferry replicate");
        Replicating { child, out, err }
    }

    fn replicate_in_sync(&self, pid: i32, extra: &[&str]) -> Replicating {
        let r = self.replicate(pid, extra);
        let synced = wait_for(Duration::from_secs(60), || read_lossy(&r.out).contains("in sync"));
        assert!(synced, "ferry replicate never got in sync:\n{}", r.show());
        r
    }

    /// Host a dies: its link first, then every process of it; b must
    /// take over.
    fn kill_a_and_wait_for_b(&self, rep: &mut Replicating) {
        ip(&["-n", &self.env.host("a").netns, "link", "set", "eth0", "down"]);
        self.env.host("a").stop_init();
        let _ = wait_timeout(&mut rep.child, Duration::from_secs(10));
        let log = self.env.ferryd_log("b");
        let took = wait_for(Duration::from_secs(30), || read_lossy(&log).contains("took over"));
        assert!(took, "b did not take over:\n{}\n{}", read_lossy(&log), rep.show());
        eprintln!("{}", read_lossy(&log).lines().find(|l| l.contains("took over")).unwrap_or(""));
    }
}

fn start_etcd(env: &Env) -> (Started, String) {
    let w = env.host("w");
    let url = format!("http://{}:2379", w.ip);
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
        &url,
        "--advertise-client-urls",
        &url,
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
    (e, url)
}

struct Replicating {
    child: Child,
    out: PathBuf,
    err: PathBuf,
}

impl Replicating {
    fn show(&self) -> String {
        format!(
            "--- stdout ---\n{}--- stderr ---\n{}",
            read_lossy(&self.out),
            read_lossy(&self.err)
        )
    }
}

/// tests/replication/seq_clients.py in c: `n` connections for `secs`.
fn seq_clients(f: &Files, n: u32, secs: f64) -> (Child, PathBuf) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/replication/seq_clients.py");
    let out = f.env.dir.0.join("clients.out");
    let (n, secs) = (n.to_string(), secs.to_string());
    let mut cmd = f.env.host("c").command(&["python3", script, &f.svc, REDIS_PORT, &n, &secs]);
    cmd.stdout(std::fs::File::create(&out).expect("clients out"))
        .stderr(std::process::Stdio::inherit())
        .stdin(std::process::Stdio::null());
    let child = ferry_testkit::only_stdio(&mut cmd).spawn().expect("clients");
    let started = wait_for(Duration::from_secs(10), || read_lossy(&out).contains("started"));
    assert!(started, "the clients did not start:\n{}", read_lossy(&out));
    (child, out)
}

/// Each client's (replies, last value); panics on any client's error.
fn client_results(mut child: Child, out: &Path) -> Vec<(u64, i64)> {
    let st = wait_timeout(&mut child, Duration::from_secs(90)).expect("the clients did not end");
    let text = read_lossy(out);
    assert!(st.success(), "clients failed: {text}");
    let json = text.lines().last().unwrap_or_default();
    let v: serde_json::Value = serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {text}"));
    let all = v.as_array().unwrap_or_else(|| panic!("not a list: {text}"));
    all.iter()
        .map(|c| {
            assert!(c["error"].is_null(), "a client failed: {c}\nall: {text}");
            (c["count"].as_u64().unwrap_or(0), c["last"].as_i64().unwrap_or(-1))
        })
        .collect()
}

fn redis_aof_fails_over(test: &str, tag: &str, fsync: &str) {
    if !have(test, &[REDIS, ETCD, "redis-cli", "redis-check-aof", "python3", "mkfs.btrfs"]) {
        return;
    }
    let t0 = Instant::now();
    let f = Files::new(tag);
    let dir = f.data_dir("redis");
    let log = f.env.dir.0.join("redis.log");
    let argv = [
        REDIS,
        "--bind",
        &f.svc,
        "--port",
        REDIS_PORT,
        "--save",
        "",
        "--appendonly",
        "yes",
        "--appendfsync",
        fsync,
        "--daemonize",
        "no",
        "--protected-mode",
        "no",
        "--dir",
        path_str(&dir),
    ];
    let redis = start_in(f.env.host("a"), &argv, &f.env.dir.0, &log, &[]);
    let up = wait_for(Duration::from_secs(15), || f.redis(&["PING"]).stdout.trim() == "PONG");
    assert!(up, "redis does not answer:\n{}", read_lossy(&log));
    let mut rep = f.replicate_in_sync(
        redis.inner,
        &["--ignore-writes", path_str(&log), "--data-dir", path_str(&dir)],
    );

    let (clients, out) = seq_clients(&f, 10, 8.0);
    std::thread::sleep(Duration::from_secs(3));
    f.kill_a_and_wait_for_b(&mut rep);
    let results = client_results(clients, &out);
    let total: u64 = results.iter().map(|c| c.0).sum();
    eprintln!("[{test}] {total} acknowledged increments over {} connections", results.len());
    let mut values = Vec::new();
    for (i, (count, last)) in results.iter().enumerate() {
        assert!(*count > 0, "client {i} got no reply");
        let now = f.redis(&["GET", &format!("seq{i}")]);
        assert_eq!(now.stdout.trim(), last.to_string(), "seq{i} at b: {}", now.show());
        values.push(last.to_string());
    }
    // b's files: a valid AOF, from which a second redis reads the same.
    let aof = dir.join("appendonlydir");
    let manifest = aof.join("appendonly.aof.manifest");
    let check = f.in_host("b", &["redis-check-aof", path_str(&manifest)]);
    assert!(
        check.status.success() && check.stdout.contains("is valid"),
        "redis-check-aof at b: {}",
        check.show()
    );
    let copy = f.mount().join("redis-copy");
    let cp = f.in_host("b", &["cp", "-a", path_str(&dir), path_str(&copy)]);
    assert!(cp.status.success(), "cp at b: {}", cp.show());
    let log2 = f.env.dir.0.join("redis2.log");
    let argv2 = [
        REDIS,
        "--bind",
        "127.0.0.1",
        "--port",
        "6380",
        "--save",
        "",
        "--appendonly",
        "yes",
        "--daemonize",
        "no",
        "--dir",
        path_str(&copy),
    ];
    let _second = start_in(f.env.host("b"), &argv2, &f.env.dir.0, &log2, &[]);
    let get = |k: &str| f.in_host("b", &["redis-cli", "-p", "6380", "GET", k]).stdout;
    let up = wait_for(Duration::from_secs(15), || {
        f.in_host("b", &["redis-cli", "-p", "6380", "PING"]).stdout.trim() == "PONG"
    });
    assert!(up, "redis from b's copy does not start:\n{}", read_lossy(&log2));
    for (i, v) in values.iter().enumerate() {
        assert_eq!(get(&format!("seq{i}")).trim(), v, "seq{i} in redis restarted from b's AOF");
    }
    eprintln!("[{test}] passed in {:.1} s", t0.elapsed().as_secs_f64());
}

#[test]
fn redis_aof_always_fails_over_with_its_files() {
    redis_aof_fails_over("repl-files-aof-always", "fa", "always");
}

#[test]
fn redis_aof_everysec_fails_over_with_its_files() {
    redis_aof_fails_over("repl-files-aof-everysec", "fe", "everysec");
}

#[test]
fn a_data_dir_that_is_not_a_subvolume_is_refused_by_name() {
    const TEST: &str = "repl-files-not-subvolume";
    if !have(TEST, &[REDIS, ETCD, "mkfs.btrfs"]) {
        return;
    }
    let f = Files::new("fn");
    let plain = f.mount().join("plain");
    std::fs::create_dir_all(&plain).expect("plain dir");
    let log = f.env.dir.0.join("sleep.log");
    let s = start_in(f.env.host("a"), &["sleep", "600"], &f.env.dir.0, &log, &[]);
    let mut rep = f.replicate(s.inner, &["--data-dir", path_str(&plain)]);
    let st = wait_timeout(&mut rep.child, Duration::from_secs(30)).expect("ferry replicate ends");
    assert!(!st.success(), "ferry replicate accepted a plain directory:\n{}", rep.show());
    let err = read_lossy(&rep.err);
    assert!(
        err.contains(&format!("data directory {} is not a btrfs subvolume", plain.display())),
        "{}",
        rep.show()
    );
    assert!(ferry_testkit::kill(s.root, 0), "the service was killed");
}
