//! Files as part of the replicated state (`ferry replicate --data-dir`):
//! host a runs the service with its data directory on a btrfs of its own,
//! b's ferryd keeps the standby (its own btrfs at the same path), c runs
//! the clients, w the witness's etcd. Each host's btrfs is a loop-mounted
//! file (tests/common/btrfs.rs); the hosts are tests/common/repl.rs's.
//!
//! - `redis_aof_always_fails_over_with_its_files` and
//!   `redis_aof_everysec_fails_over_with_its_files`: redis with
//!   `appendonly yes` under 10 sequence-checking clients; host a dies; at
//!   b every counter is the last value its client was told, the AOF
//!   passes redis-check-aof, and a second redis started from a copy of
//!   b's files reads the same values.
//! - `postgres_fails_over_with_its_files_and_restarts_clean`: PostgreSQL
//!   under pgbench (one INSERT per transaction); host a dies; at b
//!   every transaction pgbench counted as committed is there, new ones commit,
//!   and `pg_ctl stop` then a start come up clean.
//! - `a_sync_cut_half_way_leaves_files_and_memory_of_the_sync_before`:
//!   host a dies while b receives a 200 MiB sync; b's service's memory
//!   and file agree (tests/replication/file_writer.py).
//! - `the_old_primary_with_stale_files_takes_the_service_back`: a comes
//!   back with its disk as it died, protects b's service, and takes it
//!   back with b's files in place of its stale ones.
//! - `a_data_dir_that_is_not_a_subvolume_or_cannot_be_snapshotted_is_refused_by_name`,
//!   `snapshots_left_by_a_dead_run_and_by_this_one_are_removed`.
//!
//! Needs root, btrfs-progs, etcd and the programs of each test; without
//! them each test says so and returns.

mod common;

use common::btrfs::HostBtrfs;
use common::hosts::*;
use common::repl::*;
use common::{path_str, read_lossy, wait_for};
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

/// The hosts (tests/common/repl.rs), a and b each with a btrfs of its own.
fn files(tag: &str) -> Repl {
    Repl::with_btrfs(tag, 1024)
}

/// redis-cli from c, killed after 60 s.
fn redis(f: &Repl, args: &[&str]) -> Out {
    f.redis_within(60, args)
}

/// redis-server in a with its append-only files in `dir` (`persist`:
/// more --appendonly settings), answering on the service address.
fn start_aof_redis(f: &Repl, dir: &Path, persist: &[&str]) -> Started {
    f.start_redis_in(dir, &[&["--appendonly", "yes"], persist].concat(), 60)
}

/// The --ignore-writes and --data-dir arguments of a service in `dir`
/// logging to `log`.
fn data_dir_args<'a>(log: &'a Path, dir: &'a Path) -> [&'a str; 4] {
    ["--ignore-writes", path_str(log), "--data-dir", path_str(dir)]
}

/// Host `dead` dies: its link first, then every process of it; `standby`
/// must take over.
fn kill_and_wait_for(f: &Repl, dead: &str, standby: &str, rep: &mut Replicating) {
    report_syncs(rep);
    f.kill_host(dead);
    let _ = wait_timeout(&mut rep.child, Duration::from_secs(10));
    let log = f.env.ferryd_log(standby);
    let took = wait_for(Duration::from_secs(30), || read_lossy(&log).contains("took over"));
    assert!(took, "{standby} did not take over:\n{}\n{}", read_lossy(&log), rep.show());
    for l in read_lossy(&log).lines() {
        if l.contains("took over") || l.contains("made from the copy") {
            eprintln!("{l}");
        }
    }
}

fn kill_a_and_wait_for_b(f: &Repl, rep: &mut Replicating) {
    kill_and_wait_for(f, "a", "b", rep);
}

/// The primary's last status line and, with FERRY_SYNC_TRACE set, the
/// median of each part of a sync (freeze, snapshots, send and store).
fn report_syncs(rep: &Replicating) {
    let out = read_lossy(&rep.out);
    eprintln!("{}", out.lines().rev().find(|l| l.contains("syncs")).unwrap_or(""));
    let err = read_lossy(&rep.err);
    let traces: Vec<&str> = err.lines().filter(|l| l.starts_with("sync ")).collect();
    let field = |l: &str, key: &str| -> Option<f64> {
        let rest = l.split(key).nth(1)?;
        rest.trim_start_matches([':', ' ', '"', ',']).split([',', ' ', ')']).next()?.parse().ok()
    };
    let median = |key: &str| {
        let mut v: Vec<f64> = traces.iter().skip(1).filter_map(|l| field(l, key)).collect();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
    };
    if !traces.is_empty() {
        eprintln!(
            "{} syncs traced; medians after the first: pause {:.1} ms, data-dir snapshots {:.1} ms, send and store {:.1} ms (btrfs send {:.1} ms, {:.0} bytes), total {:.1} ms, bytes {:.0}",
            traces.len(),
            median("pause_ms"),
            median("\"data-dir snapshots\""),
            median("send_and_store_ms"),
            median("data_dir_send_ms"),
            median("data_dir_bytes"),
            median("total_ms"),
            median(", bytes")
        );
    }
}

/// A copy of `dir` made inside `host` (cp -a), redis-copy on its btrfs.
fn copy_in(f: &Repl, host: &str, dir: &Path) -> PathBuf {
    let copy = f.mount().join("redis-copy");
    let cp = f.in_host(host, &["cp", "-a", path_str(dir), path_str(&copy)]);
    assert!(cp.status.success(), "cp at {host}: {}", cp.show());
    copy
}

/// redis-check-aof inside `host` of the AOF in `dir`.
fn check_aof(f: &Repl, host: &str, dir: &Path) -> Out {
    let manifest = dir.join("appendonlydir").join("appendonly.aof.manifest");
    f.in_host(host, &["redis-check-aof", path_str(&manifest)])
}

/// A second redis in `host` on 127.0.0.1:6380 with its files in `copy`;
/// (it, its log).
fn second_redis(f: &Repl, host: &str, copy: &Path) -> (Started, PathBuf) {
    let log = f.log("redis2.log");
    let mut argv = vec![REDIS, "--bind", "127.0.0.1", "--port", "6380", "--save", ""];
    argv.extend(["--appendonly", "yes", "--daemonize", "no", "--dir", path_str(copy)]);
    (start_in(f.env.host(host), &argv, &f.env.dir.0, &log, &[]), log)
}

fn redis_aof_fails_over(test: &str, tag: &str, fsync: &str) {
    if !have(test, &[REDIS, ETCD, "redis-cli", "redis-check-aof", "python3", "mkfs.btrfs"]) {
        return;
    }
    let t0 = Instant::now();
    let f = files(tag);
    let dir = f.data_dir("redis");
    let log = f.log("redis.log");
    let server = start_aof_redis(&f, &dir, &["--appendfsync", fsync]);
    let mut rep = f.replicate(server.inner, &data_dir_args(&log, &dir), &[]);

    let (clients, out) = seq_clients(&f, 10, 8.0);
    std::thread::sleep(Duration::from_secs(3));
    kill_a_and_wait_for_b(&f, &mut rep);
    let results = seq_results(clients, &out);
    let total: u64 = results.iter().map(|c| c.0).sum();
    eprintln!("[{test}] {total} acknowledged increments over {} connections", results.len());
    let mut values = Vec::new();
    for (i, (count, last, _)) in results.iter().enumerate() {
        assert!(*count > 0, "client {i} got no reply");
        let now = redis(&f, &["GET", &format!("seq{i}")]);
        assert_eq!(now.stdout.trim(), last.to_string(), "seq{i} at b: {}", now.show());
        values.push(last.to_string());
    }
    // b's files: a valid AOF, from which a second redis reads the same.
    let check = check_aof(&f, "b", &dir);
    assert!(
        check.status.success() && check.stdout.contains("is valid"),
        "redis-check-aof at b: {}",
        check.show()
    );
    let copy = copy_in(&f, "b", &dir);
    let (_second, log2) = second_redis(&f, "b", &copy);
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

/// `ferry replicate --data-dir dir` of `s` ends with an error that says
/// `why`, and `s` still runs.
fn assert_refused(f: &Repl, s: &Started, dir: &str, why: &str) {
    let mut rep = f.replicate_nowait(s.inner, &["--data-dir", dir], &[]);
    let st = wait_timeout(&mut rep.child, Duration::from_secs(30)).expect("ferry replicate ends");
    assert!(!st.success(), "ferry replicate accepted {dir}:\n{}", rep.show());
    assert!(read_lossy(&rep.err).contains(why), "{}", rep.show());
    assert!(ferry_testkit::kill(s.root, 0), "the service was killed");
}

#[test]
fn a_data_dir_that_is_not_a_subvolume_or_cannot_be_snapshotted_is_refused_by_name() {
    const TEST: &str = "repl-files-not-subvolume";
    if !have(TEST, &[REDIS, ETCD, "mkfs.btrfs"]) {
        return;
    }
    let f = files("fn");
    let plain = f.mount().join("plain");
    let mk = f.in_host("a", &["mkdir", "-p", path_str(&plain)]);
    assert!(mk.status.success(), "mkdir in a: {}", mk.show());
    let log = f.env.dir.0.join("sleep.log");
    let s = start_in(f.env.host("a"), &["sleep", "600"], &f.env.dir.0, &log, &[]);
    let why = format!("data directory {} is not a btrfs subvolume", plain.display());
    assert_refused(&f, &s, path_str(&plain), &why);
    // A subvolume whose parent directory is on another filesystem (bind
    // mounted onto the test's directory): no snapshot can go beside it.
    let sub = f.data_dir("sub");
    let elsewhere = f.env.dir.0.join("elsewhere").join("sub");
    let d = path_str(&elsewhere);
    for argv in [&["mkdir", "-p", d][..], &["mount", "--bind", path_str(&sub), d]] {
        let out = f.in_host("a", argv);
        assert!(out.status.success(), "{argv:?}: {}", out.show());
    }
    assert_refused(&f, &s, d, &format!("data directory {d}: a snapshot of it"));
    let left = f.env.dir.0.join("elsewhere").join(".ferry-primary-sub");
    assert!(!left.exists(), "{} left behind", left.display());
}

const PG_BIN: &str = "/usr/lib/postgresql/15/bin";
const PGBENCH: &str = "/usr/bin/pgbench";

/// `argv` in `host` as user postgres.
fn as_postgres(f: &Repl, host: &str, argv: &[&str]) -> Out {
    let mut full = vec!["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups", "--"];
    full.extend_from_slice(argv);
    f.in_host(host, &full)
}

/// One SQL statement from c over the service address; its rows.
fn psql(f: &Repl, sql: &str) -> String {
    let out = f.in_host(
        "c",
        &[
            "psql",
            "-X",
            "-A",
            "-t",
            "-q",
            "-v",
            "ON_ERROR_STOP=1",
            "-h",
            &f.svc,
            "-U",
            "postgres",
            "-d",
            "postgres",
            "-c",
            sql,
        ],
    );
    assert!(out.status.success(), "psql -c {sql:?}: {}", out.show());
    out.stdout.trim().to_string()
}

/// The postmaster's settings: the service address only (no unix
/// socket, whose file would be outside the data directory), dynamic
/// shared memory in SysV segments (a /dev/shm file mapped shared would
/// be a write outside it), a small buffer pool.
fn pg_options(svc: &str) -> Vec<String> {
    [
        format!("listen_addresses={svc}"),
        "unix_socket_directories=".into(),
        "dynamic_shared_memory_type=sysv".into(),
        "shared_buffers=16MB".into(),
        "max_connections=20".into(),
        "autovacuum=off".into(),
    ]
    .into_iter()
    .flat_map(|o| ["-c".to_string(), o])
    .collect()
}

/// pgbench's "number of transactions actually processed: N".
fn pgbench_processed(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.contains("number of transactions actually processed"))?;
    line.split(':').nth(1)?.split_whitespace().next()?.parse().ok()
}

/// initdb into the subvolume `dir` on a (owned by postgres, clients
/// from anywhere trusted) and a postmaster on the service address,
/// answering; (the postmaster, its log).
fn start_postgres(f: &Repl, dir: &Path) -> (Started, PathBuf) {
    let (postgres, initdb) = (format!("{PG_BIN}/postgres"), format!("{PG_BIN}/initdb"));
    let d = path_str(dir);
    for argv in [["chown", "postgres:postgres", d], ["chmod", "0700", d]] {
        let out = f.in_host("a", &argv);
        assert!(out.status.success(), "{argv:?}: {}", out.show());
    }
    let init = [&initdb, "-D", d, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C"];
    let out = as_postgres(f, "a", &init);
    assert!(out.status.success(), "initdb: {}", out.show());
    let add = format!("echo 'host all all 0.0.0.0/0 trust' >> {d}/pg_hba.conf");
    assert!(f.in_host("a", &["sh", "-c", &add]).status.success());
    let log = f.env.dir.0.join("postgres.log");
    let opts = pg_options(&f.svc);
    let mut argv = vec!["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups", "--"];
    argv.extend([postgres.as_str(), "-D", d]);
    argv.extend(opts.iter().map(String::as_str));
    let pg = start_in(f.env.host("a"), &argv, &f.env.dir.0, &log, &[]);
    let up = wait_for(Duration::from_secs(30), || {
        let argv = ["psql", "-X", "-Atq", "-h", &f.svc, "-U", "postgres", "-c", "select 1"];
        f.in_host("c", &argv).stdout.trim() == "1"
    });
    assert!(up, "postgres does not answer:\n{}", read_lossy(&log));
    (pg, log)
}

/// pgbench from c: one INSERT into `ledger` per transaction, 4
/// connections, 20 s, in the background; (pgbench, its output files).
fn start_pgbench(f: &Repl) -> (Child, [PathBuf; 2]) {
    let script = f.env.dir.0.join("ledger.sql");
    std::fs::write(&script, "insert into ledger(client) values (:client_id);\n").expect("script");
    let outs = [f.env.dir.0.join("pgbench.out"), f.env.dir.0.join("pgbench.err")];
    let argv = [
        PGBENCH,
        "-h",
        &f.svc,
        "-U",
        "postgres",
        "-n",
        "-c",
        "4",
        "-T",
        "20",
        "-f",
        path_str(&script),
        "postgres",
    ];
    let mut cmd = f.env.host("c").command(&argv);
    cmd.stdout(std::fs::File::create(&outs[0]).expect("pgbench out"))
        .stderr(std::fs::File::create(&outs[1]).expect("pgbench err"))
        .stdin(std::process::Stdio::null());
    let bench = ferry_testkit::only_stdio(&mut cmd).spawn().expect("pgbench");
    // The takeover comes once all four are connected and committing (a
    // connection still being set up at the takeover is another matter:
    // see docs/replication.md, what is not built yet).
    let busy = wait_for(Duration::from_secs(30), || {
        let sql = "select count(*) from pg_stat_activity where backend_type = 'client backend' and application_name = 'pgbench'";
        psql(f, sql) == "4" && psql(f, "select count(*) from ledger") != "0"
    });
    assert!(busy, "pgbench did not get going:\n{}", read_lossy(&outs[0]));
    (bench, outs)
}

/// `pg_ctl stop` at b leaves the cluster shut down, and `pg_ctl start`
/// from b's files comes up without recovery, `rows` rows in the ledger.
fn restart_clean_at_b(f: &Repl, d: &str, rows: u64) {
    let pg_ctl = format!("{PG_BIN}/pg_ctl");
    let stop = as_postgres(f, "b", &[&pg_ctl, "stop", "-D", d, "-m", "fast", "-w", "-t", "30"]);
    assert!(stop.status.success(), "pg_ctl stop at b: {}", stop.show());
    let control = as_postgres(f, "b", &[&format!("{PG_BIN}/pg_controldata"), d]);
    let state = control.stdout.lines().find(|l| l.starts_with("Database cluster state:"));
    assert!(state.is_some_and(|l| l.ends_with(" shut down")), "{}", control.show());
    let log2 = f.env.dir.0.join("postgres-b.log");
    std::fs::File::create(&log2).expect("log");
    assert!(f.in_host("b", &["chown", "postgres", path_str(&log2)]).status.success());
    let o = pg_options(&f.svc).join(" ");
    let argv = [&pg_ctl, "start", "-D", d, "-w", "-t", "30", "-l", path_str(&log2), "-o", &o];
    let start = as_postgres(f, "b", &argv);
    assert!(start.status.success(), "pg_ctl start at b: {}\n{}", start.show(), read_lossy(&log2));
    let startup = read_lossy(&log2);
    assert!(startup.contains("database system was shut down at"), "not a clean start:\n{startup}");
    assert!(!startup.contains("redo starts"), "recovery after a clean stop:\n{startup}");
    assert_eq!(psql(f, "select count(*) from ledger"), rows.to_string());
    let _ = as_postgres(f, "b", &[&pg_ctl, "stop", "-D", d, "-m", "immediate"]);
}

#[test]
fn postgres_fails_over_with_its_files_and_restarts_clean() {
    const TEST: &str = "repl-files-postgres";
    let programs = [&format!("{PG_BIN}/postgres"), &format!("{PG_BIN}/initdb"), PGBENCH, ETCD];
    if !have(TEST, &programs) || !have(TEST, &["psql", "setpriv", "mkfs.btrfs"]) {
        return;
    }
    let t0 = Instant::now();
    let f = files("fp");
    let dir = f.data_dir("pg");
    let d = path_str(&dir);
    let (pg, log) = start_postgres(&f, &dir);
    psql(&f, "create table ledger(id bigserial primary key, client int not null)");
    // A postgres sync pauses the tree for 100-250 ms on this loaded VM
    // (its shared memory), and the standby hears nothing meanwhile: a
    // takeover timeout well above that.
    let rep_args =
        ["--ignore-writes", path_str(&log), "--data-dir", d, "--heartbeat-timeout-ms", "1000"];
    let mut rep = f.replicate(pg.inner, &rep_args, &[]);
    let (mut bench, outs) = start_pgbench(&f);
    let before_kill: u64 = psql(&f, "select count(*) from ledger").parse().expect("count");
    std::thread::sleep(Duration::from_secs(2));
    kill_a_and_wait_for_b(&f, &mut rep);
    let st = wait_timeout(&mut bench, Duration::from_secs(60)).expect("pgbench did not end");
    let text = format!("{}{}", read_lossy(&outs[0]), read_lossy(&outs[1]));
    let pg_log = read_lossy(&log);
    let tail: Vec<&str> = pg_log.lines().rev().take(30).collect();
    assert!(
        st.success() && !text.contains("aborted"),
        "pgbench: {st}\n{text}\npostgres's log, last lines first:\n{}",
        tail.join("\n")
    );
    let processed = pgbench_processed(&text).unwrap_or_else(|| panic!("pgbench said:\n{text}"));

    // Every committed transaction is at b, once; new ones commit.
    let rows: u64 = psql(&f, "select count(*) from ledger").parse().expect("count");
    eprintln!("[{TEST}] pgbench committed {processed} transactions ({before_kill} before the kill); b has {rows} rows");
    assert!(processed > before_kill + 4, "no transactions after the takeover:\n{text}");
    assert_eq!(rows, processed, "committed transactions at b");
    psql(&f, "insert into ledger(client) values (99)");
    assert_eq!(psql(&f, "select count(*) from ledger"), (processed + 1).to_string());
    restart_clean_at_b(&f, d, processed + 1);
    eprintln!("[{TEST}] passed in {:.1} s", t0.elapsed().as_secs_f64());
}

/// Entries of `dir` inside `host` (`ls -A`).
fn ls(f: &Repl, host: &str, dir: &Path) -> Vec<String> {
    let out = f.in_host(host, &["ls", "-A", path_str(dir)]);
    out.stdout.lines().map(String::from).collect()
}

#[test]
fn snapshots_left_by_a_dead_run_and_by_this_one_are_removed() {
    const TEST: &str = "repl-files-cleanup";
    if !have(TEST, &[REDIS, ETCD, "redis-cli", "mkfs.btrfs"]) {
        return;
    }
    let f = files("fc");
    let dir = f.data_dir("redis");
    // What a `ferry replicate` killed mid-run leaves: a snapshot.
    let stale = f.mount().join(".ferry-primary-redis");
    let snap = stale.join("s7");
    let mk = f.in_host("a", &["mkdir", path_str(&stale)]);
    assert!(mk.status.success(), "{}", mk.show());
    let argv = ["btrfs", "subvolume", "snapshot", "-r", path_str(&dir), path_str(&snap)];
    let out = f.in_host("a", &argv);
    assert!(out.status.success(), "{}", out.show());
    let log = f.log("redis.log");
    let server = start_aof_redis(&f, &dir, &[]);
    let mut rep = f.replicate(server.inner, &data_dir_args(&log, &dir), &[]);
    for i in 1..=5 {
        assert_eq!(redis(&f, &["INCR", "k"]).stdout.trim(), i.to_string());
    }
    // While protected: a holds one snapshot per side of the sync on its
    // way at most, the stale one is gone; b holds its copy.
    let held = ls(&f, "a", &stale);
    assert!(!held.contains(&"s7".to_string()) && held.len() <= 2, "a's snapshots: {held:?}");
    let standby = f.mount().join(".ferry-standby-redis");
    assert!(!ls(&f, "b", &standby).is_empty(), "b holds no copy");
    let root = f.env.host("a").spawned_pid(&rep.child).map(|p| p.0);
    let root = root.unwrap_or_else(|| panic!("ferry replicate is gone:\n{}", rep.show()));
    let ferry = common::cluster::children_of(root as u32).into_iter().next().unwrap_or(root);
    ferry_testkit::kill(ferry, libc::SIGTERM);
    let st = wait_timeout(&mut rep.child, Duration::from_secs(20)).expect("ferry replicate ends");
    assert!(st.success(), "ferry replicate after SIGTERM: {st}\n{}", rep.show());
    let blog = f.env.ferryd_log("b");
    assert!(wait_for(Duration::from_secs(10), || read_lossy(&blog).contains("copy dropped")));
    for (h, d) in [("a", &stale), ("b", &standby)] {
        let gone = wait_for(Duration::from_secs(5), || {
            !f.in_host(h, &["test", "-e", path_str(d)]).status.success()
        });
        assert!(gone, "{} left in {h}: {:?}", d.display(), ls(&f, h, d));
    }
    assert_eq!(redis(&f, &["INCR", "k"]).stdout.trim(), "6", "redis at a after the end");
}

#[test]
fn the_old_primary_with_stale_files_takes_the_service_back() {
    const TEST: &str = "repl-files-failback";
    if !have(TEST, &[REDIS, ETCD, "redis-cli", "redis-check-aof", "mkfs.btrfs"]) {
        return;
    }
    let mut f = files("fb");
    let dir = f.data_dir("redis");
    let log = f.log("redis.log");
    let server = start_aof_redis(&f, &dir, &[]);
    let args = data_dir_args(&log, &dir);
    let mut rep = f.replicate(server.inner, &args, &[]);
    for i in 1..=3 {
        assert_eq!(redis(&f, &["INCR", "k"]).stdout.trim(), i.to_string());
    }
    kill_a_and_wait_for_b(&f, &mut rep);
    assert_eq!(redis(&f, &["INCR", "k"]).stdout.trim(), "4", "at b");
    // a comes back as after a reboot, its disk as it was when it died
    // (its redis directory at k = 3), and becomes b's standby.
    let a = f.env.host("a");
    ip(&["-n", &a.netns, "addr", "del", &f.svc_prefix(), "dev", "eth0"]);
    let ss = std::process::Command::new("ip")
        .args(["netns", "exec", &a.netns, "ss", "-K", "-tan"])
        .output()
        .expect("ss -K");
    assert!(ss.status.success(), "ss -K in a");
    ip(&["-n", &a.netns, "link", "set", "eth0", "up"]);
    f.restart_ferryd("a");
    let img = f.env.dir.0.join("a.btrfs");
    let mount = f.mount().to_path_buf();
    f.fs.push(HostBtrfs::mount_again(a, &img, &mount));
    let stale = f.in_host("a", &["ls", path_str(&dir.join("appendonlydir"))]);
    assert!(stale.status.success(), "a's old files are gone: {}", stale.show());
    let pid = taken_over_pid(&read_lossy(&f.env.ferryd_log("b")))
        .unwrap_or_else(|| panic!("{}", read_lossy(&f.env.ferryd_log("b"))));
    let mut again = f.in_sync(f.replicate_to("b", &f.env.agent("a").to_string(), pid, &args, &[]));
    assert_eq!(redis(&f, &["INCR", "k"]).stdout.trim(), "5", "at b, protected by a");
    kill_and_wait_for(&f, "b", "a", &mut again);
    assert_eq!(redis(&f, &["INCR", "k"]).stdout.trim(), "6", "back at a");
    let alog = read_lossy(&f.env.ferryd_log("a"));
    assert!(alog.contains(&format!("replaced subvolume {}", dir.display())), "{alog}");
    // a's files are b's now: valid, and a redis started from them reads 6.
    let check = check_aof(&f, "a", &dir);
    assert!(check.stdout.contains("is valid"), "redis-check-aof at a: {}", check.show());
    let copy = copy_in(&f, "a", &dir);
    let (_second, log2) = second_redis(&f, "a", &copy);
    let got = wait_for(Duration::from_secs(15), || {
        f.in_host("a", &["redis-cli", "-p", "6380", "GET", "k"]).stdout.trim() == "6"
    });
    assert!(got, "redis from a's files does not read k = 6:\n{}", read_lossy(&log2));
}

#[test]
fn a_sync_cut_half_way_leaves_files_and_memory_of_the_sync_before() {
    const TEST: &str = "repl-files-half-sync";
    if !have(TEST, &[ETCD, "python3", "mkfs.btrfs"]) {
        return;
    }
    let f = files("fh");
    let dir = f.data_dir("state");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/replication/file_writer.py");
    let log = f.env.dir.0.join("writer.log");
    let argv = ["python3", script, path_str(&dir), &f.svc];
    let w = start_in(f.env.host("a"), &argv, &f.env.dir.0, &log, &[]);
    assert!(wait_for(Duration::from_secs(10), || read_lossy(&log).contains("up")));
    // Silence long enough for a sync of 200 MiB of files: the standby
    // must be seen receiving it when a dies.
    let args = ["--ignore-writes", path_str(&log), "--data-dir", path_str(&dir)];
    let mut rep =
        f.replicate(w.inner, &[&args[..], &["--heartbeat-timeout-ms", "3000"]].concat(), &[]);
    // The client in c: three small writes, one of 200 MiB, then S.
    let client = format!(
        "import socket\ns=socket.create_connection(('{}',7000),timeout=120)\nr=s.makefile('rb')\nfor n in (1,1,1,200):\n    s.sendall(b'W %d\\n'%n); print(r.readline().decode().strip(),flush=True)\ns.sendall(b'S\\n'); print(r.readline().decode().strip(),flush=True)\n",
        f.svc
    );
    let out = f.env.dir.0.join("client.out");
    let mut cmd = f.env.host("c").command(&["python3", "-c", &client]);
    cmd.stdout(std::fs::File::create(&out).expect("client out"))
        .stderr(std::process::Stdio::inherit())
        .stdin(std::process::Stdio::null());
    let mut c = ferry_testkit::only_stdio(&mut cmd).spawn().expect("client");
    let three = wait_for(Duration::from_secs(30), || read_lossy(&out).lines().count() >= 3);
    assert!(three, "the small writes: {}", read_lossy(&out));
    // The 200 MiB sync on its way: b holds its copy and a second snapshot
    // being received.
    let standby = f.mount().join(".ferry-standby-state");
    let receiving = wait_for(Duration::from_secs(60), || ls(&f, "b", &standby).len() >= 2);
    assert!(receiving, "b never received a second snapshot: {:?}", ls(&f, "b", &standby));
    kill_a_and_wait_for_b(&f, &mut rep);
    let st = wait_timeout(&mut c, Duration::from_secs(120)).expect("the client did not end");
    let text = read_lossy(&out);
    assert!(st.success(), "client: {st}\n{text}");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 5, "{text}");
    let mib = 1u64 << 20;
    for (i, l) in lines[..4].iter().enumerate() {
        let expect = [mib, 2 * mib, 3 * mib, 203 * mib][i];
        assert_eq!(*l, format!("ok {expect}"), "reply {i}: {text}");
    }
    // b's memory and b's file agree: no write lost, none twice.
    assert_eq!(lines[4], format!("S {} {}", 203 * mib, 203 * mib), "{text}");
    let blog = read_lossy(&f.env.ferryd_log("b"));
    eprintln!("[{TEST}] {}", blog.lines().find(|l| l.contains("took over")).unwrap_or(""));
}
