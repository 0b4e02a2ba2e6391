//! `ferry replace`: a running server swapped in place for a fresh copy of
//! itself while a client keeps talking to it over the same connection.
//!
//! Each test starts its server (tests/replace/probe_server.c, or
//! redis-server) on 127.0.0.1 at a free port, in a session of its own with
//! only fds 0-2, as a child of the test process, which is a child
//! subreaper: ferry kills the old process and the test reaps it at once
//! (its PID must come free for the new one), and the new process, ferry's
//! child, comes back to the test when ferry exits. A thread per server
//! does that reaping. Every option is checked in the new process from
//! /proc and, for seccomp, by what the server itself sees over its old
//! connection. Faults check that the old process runs on untouched: same
//! PID and start time, same connection still answering. Everything a test
//! starts is killed by PID (checked by name) and its directories and
//! cgroups removed on drop, also when it fails.

use ferry_testkit::{require_root, LineClient as Client, TempDir};
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::{sleep, JoinHandle};
use std::time::{Duration, Instant};

const FERRY: &str = env!("CARGO_BIN_EXE_ferry");
const REDIS: &str = "/usr/bin/redis-server";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// (state, start time) from /proc/PID/stat.
fn stat(pid: i32) -> Option<(char, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest: Vec<&str> = text[text.rfind(')')? + 1..].split_whitespace().collect();
    Some((rest.first()?.chars().next()?, rest.get(19)?.parse().ok()?))
}

fn status_field(pid: i32, key: &str) -> String {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("/proc/{pid}/status: {e}"));
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}:")))
        .map(|v| v.trim().to_string())
        .unwrap_or_else(|| panic!("no {key} in /proc/{pid}/status"))
}

fn caps(pid: i32, key: &str) -> u64 {
    u64::from_str_radix(&status_field(pid, key), 16).expect("hex capability set")
}

/// A server started by a test: killed (if it still has its name) and its
/// PID reaped on drop.
struct Service {
    pid: i32,
    comm: String,
    stop: Arc<AtomicBool>,
    reaper: Option<JoinHandle<()>>,
    /// How many processes under this PID ended while the test's child.
    ended: Arc<AtomicU64>,
    _dir: TempDir,
}

impl Service {
    fn start(argv: &[&str], comm: &str, port: u16, dir: TempDir) -> Service {
        let svc = Service::spawn(argv, comm, dir);
        let t = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(t.elapsed() < Duration::from_secs(10), "{comm} does not listen on {port}");
            sleep(Duration::from_millis(20));
        }
        svc
    }

    fn spawn(argv: &[&str], comm: &str, dir: TempDir) -> Service {
        // Nothing shared with the test (a pipe to it would be refused);
        // reaped by the thread below.
        let pid = ferry_testkit::spawn_detached(argv, dir.path());
        let stop = Arc::new(AtomicBool::new(false));
        let ended = Arc::new(AtomicU64::new(0));
        let (s, n) = (stop.clone(), ended.clone());
        let reaper = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                if ferry_testkit::try_reap(pid).is_some() {
                    n.fetch_add(1, Ordering::SeqCst);
                }
                sleep(Duration::from_millis(1));
            }
        });
        Service { pid, comm: comm.into(), stop, reaper: Some(reaper), ended, _dir: dir }
    }

    fn probe(tag: &str, extra: &[&str]) -> (Service, u16) {
        let dir = TempDir::new("ferry-replace", tag);
        let bin = dir.path().join("probe_server");
        ferry_testkit::compile_c(&repo().join("tests/replace/probe_server.c"), &bin);
        let port = ferry_testkit::free_port();
        let port_s = port.to_string();
        let mut argv = vec![bin.to_str().expect("utf-8 path"), port_s.as_str()];
        argv.extend_from_slice(extra);
        let argv: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        (Service::start(&argv, "probe_server", port, dir), port)
    }

    fn start_time(&self) -> u64 {
        stat(self.pid).expect("server stat").1
    }

    fn running(&self) -> bool {
        stat(self.pid).is_some_and(|(s, _)| s != 'Z' && s != 'X')
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let comm = std::fs::read_to_string(format!("/proc/{}/comm", self.pid)).unwrap_or_default();
        if comm.trim() == self.comm {
            ferry_testkit::kill(self.pid, libc::SIGKILL);
        }
        let t = Instant::now();
        while stat(self.pid).is_some() && t.elapsed() < Duration::from_secs(5) {
            sleep(Duration::from_millis(5));
        }
        self.stop.store(true, Ordering::Relaxed);
        if let Some(r) = self.reaper.take() {
            let _ = r.join();
        }
    }
}

fn replace(pid: i32, args: &[&str]) -> Output {
    Command::new(FERRY)
        .args(["replace", "--pid", &pid.to_string()])
        .args(args)
        .output()
        .expect("running ferry replace")
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// Replaces `svc` and asserts it worked: the same PID, a new process.
fn replaced(svc: &Service, args: &[&str]) -> String {
    let before = svc.start_time();
    // The start time counts in clock ticks (10 ms): one tick between the
    // two processes makes them tell apart.
    sleep(Duration::from_millis(20));
    let out = replace(svc.pid, args);
    let said = text(&out);
    assert!(out.status.success(), "ferry replace failed: {said}");
    assert!(said.contains(&format!("replaced pid {}: pause ", svc.pid)), "{said}");
    assert!(svc.running(), "no process under pid {} after the replacement", svc.pid);
    assert_ne!(svc.start_time(), before, "pid {} is still the old process", svc.pid);
    said
}

/// Asserts that a refused replacement left the old process as it was.
fn refused(svc: &Service, client: &mut Client, args: &[&str], names: &str) {
    let before = svc.start_time();
    let out = replace(svc.pid, args);
    refused_as(svc, client, out, before, args, names);
}

/// Asserts that `out`, a refused `ferry replace`, said one error line
/// naming `names` and left the old process (started at `before`) running.
fn refused_as(
    svc: &Service,
    client: &mut Client,
    out: Output,
    before: u64,
    args: &[&str],
    names: &str,
) {
    let said = text(&out);
    assert!(!out.status.success(), "ferry replace {args:?} succeeded: {said}");
    assert!(said.contains(names), "the error does not name {names:?}: {said}");
    assert!(said.contains("the old tree runs on untouched"), "{said}");
    // Other lines (a stale lock of another run released) may come first.
    let errors: Vec<&str> = said.lines().filter(|l| l.starts_with("ferry: error")).collect();
    assert_eq!(errors.len(), 1, "not one error line: {said}");
    assert!(errors[0].contains(names), "the error line does not name {names:?}: {said}");
    assert!(svc.running(), "the old process is gone after {args:?}");
    assert_eq!(svc.start_time(), before, "the process changed after {args:?}");
    assert_eq!(svc.ended.load(Ordering::SeqCst), 0, "the old process ended after {args:?}");
    assert_eq!(client.ask("PING").expect("the old connection"), "PONG");
}

#[test]
fn a_counter_server_under_a_client_is_replaced_with_no_gap() {
    require_root!();
    let (svc, port) = Service::probe("counter", &[]);
    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let (s, c) = (stop.clone(), count.clone());
    let client = std::thread::spawn(move || -> Result<(), String> {
        let mut cl = Client::connect(port);
        let mut last = 0u64;
        while !s.load(Ordering::Relaxed) {
            let v: u64 = cl
                .ask("INCR")
                .map_err(|e| format!("after {last}: {e}"))?
                .parse()
                .map_err(|e| format!("after {last}: {e}"))?;
            if v != last + 1 {
                return Err(format!("the counter went from {last} to {v}"));
            }
            last = v;
            c.store(v, Ordering::Relaxed);
        }
        Ok(())
    });
    sleep(Duration::from_millis(300));
    let said = replaced(&svc, &[]);
    let at_replace = count.load(Ordering::Relaxed);
    sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    let result = client.join().expect("client thread");
    assert_eq!(result, Ok(()), "{said}");
    assert!(count.load(Ordering::Relaxed) > at_replace, "no request after the replacement");
    assert_eq!(svc.ended.load(Ordering::SeqCst), 1, "the old process was not ended once");
    let line = said.lines().find(|l| l.starts_with("replaced pid")).expect("the line");
    for part in ["freeze", "capture", "trial", "kill", "restore", "release"] {
        assert!(line.contains(part), "{part} missing from {line}");
    }
    // The client's requests change no shape: the trial stands.
    assert!(line.contains("tried before the freeze (first pause "), "{line}");
}

/// The tree accepts a connection between the first capture and the
/// final one (ferry stalled after its early trial): the final image has
/// another fd, so it is tried in the pause, and the new connection is
/// carried with the rest.
#[test]
fn a_tree_changed_after_the_early_trial_is_tried_again_in_the_pause() {
    require_root!();
    let (svc, port) = Service::probe("changed", &[]);
    let mut client = Client::connect(port);
    assert_eq!(client.ask("INCR").expect("first"), "1");
    let before = svc.start_time();
    sleep(Duration::from_millis(20));
    let mut ferry = Command::new(FERRY)
        .args(["replace", "--pid", &svc.pid.to_string()])
        .env("FERRY_FAULT_STALL_AFTER", "replace:early trial")
        .env("FERRY_FAULT_STALL_SECS", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running ferry replace");
    let mut err = BufReader::new(ferry.stderr.take().expect("stderr"));
    let mut line = String::new();
    err.read_line(&mut line).expect("ferry's stall line");
    assert!(line.contains("stalling after replace phase 'early trial'"), "{line}");
    let mut second = Client::connect(port);
    assert_eq!(second.ask("INCR").expect("the second client"), "2");
    let out = ferry.wait_with_output().expect("ferry replace");
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "ferry replace failed: {said}");
    assert!(
        said.contains("tried again in the pause after a first pause of "),
        "the final image was not tried again: {said}"
    );
    assert!(said.contains("the tree changed (pid "), "{said}");
    assert_ne!(svc.start_time(), before, "pid {} is still the old process", svc.pid);
    assert_eq!(client.ask("INCR").expect("the first client"), "3");
    assert_eq!(second.ask("INCR").expect("the second client"), "4");
    assert_eq!(svc.ended.load(Ordering::SeqCst), 1, "the old process was not ended once");
}

#[test]
fn a_single_freeze_tries_in_the_pause() {
    require_root!();
    let (svc, port) = Service::probe("single", &[]);
    let mut client = Client::connect(port);
    assert_eq!(client.ask("INCR").expect("first"), "1");
    let said = replaced(&svc, &["--single-freeze"]);
    assert!(!said.contains("tried "), "a trial before the freeze: {said}");
    assert_eq!(client.ask("INCR").expect("after"), "2");
}

#[test]
fn the_new_tree_is_in_the_new_cgroup() {
    require_root!();
    let Some(cg) = TestCgroup::new("replace") else {
        eprintln!("SKIPPED the_new_tree_is_in_the_new_cgroup: no cgroup2 mount");
        return;
    };
    let (svc, port) = Service::probe("cgroup", &[]);
    let mut client = Client::connect(port);
    replaced(&svc, &["--cgroup", cg.dir.to_str().expect("utf-8")]);
    let cgroup = std::fs::read_to_string(format!("/proc/{}/cgroup", svc.pid)).expect("cgroup");
    let want = format!("0::/{}", cg.name);
    assert!(cgroup.lines().any(|l| l == want), "not in {want}: {cgroup}");
    let procs = std::fs::read_to_string(cg.dir.join("cgroup.procs")).expect("cgroup.procs");
    assert_eq!(procs.trim(), svc.pid.to_string());
    assert_eq!(client.ask("INCR").expect("the old connection"), "1");
}

#[test]
fn the_new_tree_has_the_new_limits() {
    require_root!();
    let (svc, port) = Service::probe("rlimit", &[]);
    let mut client = Client::connect(port);
    replaced(&svc, &["--rlimit", "nofile=512:2048", "--rlimit", "core=0:unlimited"]);
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", svc.pid)).expect("limits");
    let row = |name: &str| -> Vec<String> {
        let l = limits.lines().find(|l| l.starts_with(name)).expect("row");
        l[name.len()..].split_whitespace().map(str::to_string).collect()
    };
    assert_eq!(row("Max open files")[..2], ["512".to_string(), "2048".to_string()]);
    assert_eq!(row("Max core file size")[..2], ["0".to_string(), "unlimited".to_string()]);
    assert_eq!(client.ask("INCR").expect("the old connection"), "1");
}

#[test]
fn the_new_tree_lost_the_dropped_capabilities() {
    require_root!();
    let (svc, port) = Service::probe("caps", &[]);
    let mut client = Client::connect(port);
    let dropped = (1u64 << 13) | (1 << 21); // CAP_NET_RAW, CAP_SYS_ADMIN
    let before: Vec<u64> =
        ["CapPrm", "CapEff", "CapBnd"].iter().map(|k| caps(svc.pid, k)).collect();
    assert!(before.iter().all(|c| c & dropped == dropped), "{before:x?}");
    replaced(&svc, &["--drop-caps", "net_raw,CAP_SYS_ADMIN"]);
    for (k, was) in ["CapPrm", "CapEff", "CapBnd"].iter().zip(before) {
        assert_eq!(caps(svc.pid, k), was & !dropped, "{k}");
    }
    assert_eq!(caps(svc.pid, "CapAmb") & dropped, 0);
    assert_eq!(client.ask("INCR").expect("the old connection"), "1");
}

/// A classic BPF filter: getppid fails with EPERM, everything else is
/// allowed (x86_64 only: other architectures are allowed through).
fn getppid_eperm_filter(dir: &Path) -> PathBuf {
    fn insn(code: u16, jt: u8, jf: u8, k: u32) -> [u8; 8] {
        let mut b = [0u8; 8];
        b[..2].copy_from_slice(&code.to_ne_bytes());
        b[2] = jt;
        b[3] = jf;
        b[4..].copy_from_slice(&k.to_ne_bytes());
        b
    }
    const LD_W_ABS: u16 = 0x20;
    const JEQ_K: u16 = 0x15;
    const RET_K: u16 = 0x06;
    const ALLOW: u32 = 0x7fff_0000;
    let prog = [
        insn(LD_W_ABS, 0, 0, 4),        // arch
        insn(JEQ_K, 1, 0, 0xc000_003e), // AUDIT_ARCH_X86_64
        insn(RET_K, 0, 0, ALLOW),
        insn(LD_W_ABS, 0, 0, 0), // syscall number
        insn(JEQ_K, 0, 1, libc::SYS_getppid as u32),
        insn(RET_K, 0, 0, 0x0005_0000 | libc::EPERM as u32), // SECCOMP_RET_ERRNO
        insn(RET_K, 0, 0, ALLOW),
    ];
    let path = dir.join("getppid.bpf");
    std::fs::write(&path, prog.concat()).expect("writing the filter");
    path
}

fn seccomp_case(tag: &str, extra: &[&str], filters_before: u32) {
    let (svc, port) = Service::probe(tag, extra);
    let mut client = Client::connect(port);
    let work = TempDir::new("ferry-replace", &format!("{tag}-filter"));
    let filter = getppid_eperm_filter(work.path());
    assert_eq!(status_field(svc.pid, "Seccomp_filters"), filters_before.to_string());
    assert!(client.ask("PPID").expect("ppid").parse::<i32>().is_ok());
    replaced(&svc, &["--seccomp", filter.to_str().expect("utf-8")]);
    assert_eq!(status_field(svc.pid, "Seccomp"), "2");
    assert_eq!(status_field(svc.pid, "Seccomp_filters"), (filters_before + 1).to_string());
    assert_eq!(client.ask("PPID").expect("the old connection"), format!("E{}", libc::EPERM));
    assert_eq!(client.ask("INCR").expect("the old connection"), "1");
}

#[test]
fn the_new_tree_runs_under_the_seccomp_filter() {
    require_root!();
    seccomp_case("seccomp", &[], 0);
}

#[test]
fn a_service_with_a_filter_keeps_it_and_gets_the_new_one_stacked() {
    require_root!();
    seccomp_case("stacked", &["own-filter"], 1);
}

#[test]
fn a_bad_option_leaves_the_old_tree_running_untouched() {
    require_root!();
    let (svc, port) = Service::probe("faults", &[]);
    let mut client = Client::connect(port);
    assert_eq!(client.ask("INCR").expect("first"), "1");
    let work = TempDir::new("ferry-replace", "faults-files");
    let short = work.path().join("short.bpf");
    std::fs::write(&short, [0u8; 7]).expect("write");
    let empty = work.path().join("empty.bpf");
    std::fs::write(&empty, []).expect("write");
    let jump_out = work.path().join("jump.bpf");
    // BPF_JMP|BPF_JA past the end, then a return.
    let mut bad = vec![0x05, 0, 0, 0, 100, 0, 0, 0];
    bad.extend_from_slice(&[0x06, 0, 0, 0, 0, 0, 0xff, 0x7f]);
    std::fs::write(&jump_out, bad).expect("write");
    let missing = format!("/sys/fs/cgroup/unified/ferry-test-missing-{}", std::process::id());
    let cases: Vec<(Vec<String>, String)> = vec![
        (vec!["--cgroup".into(), missing.clone()], format!("--cgroup {missing}: no such cgroup")),
        (vec!["--cgroup".into(), "/tmp".into()], "--cgroup /tmp: not a cgroup".into()),
        (vec!["--seccomp".into(), path(&short)], "7 bytes is not a whole number".into()),
        (vec!["--seccomp".into(), path(&empty)], "the file is empty".into()),
        (vec!["--seccomp".into(), path(&jump_out)], "the kernel refuses the filter".into()),
        (vec!["--rlimit".into(), "nofile=4096:1024".into()], "above the hard limit".into()),
        (vec!["--rlimit".into(), "files=1:2".into()], "unknown resource \"files\"".into()),
        (vec!["--drop-caps".into(), "net_rw".into()], "unknown capability \"net_rw\"".into()),
        (vec!["--nice".into(), "20".into()], "--nice 20: a nice value is -20 to 19".into()),
        (vec!["--nice".into(), "-21".into()], "--nice -21: a nice value is -20 to 19".into()),
        (vec!["--nice".into(), "low".into()], "--nice low: not a number".into()),
        (vec!["--cpus".into(), "4095".into()], "--cpus 4095: CPU 4095 does not exist".into()),
        (vec!["--cpus".into(), "1-0".into()], "the range 1-0 runs backwards".into()),
        (vec!["--cpus".into(), "0,,1".into()], "--cpus 0,,1: an empty item".into()),
        (vec!["--hostname".into(), "".into()], "--hostname: the name is empty".into()),
        (vec!["--hostname".into(), "h".repeat(65)], "65 bytes, a hostname has at most 64".into()),
    ];
    for (args, names) in &cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        refused(&svc, &mut client, &args, names);
    }
    assert_eq!(client.ask("INCR").expect("after the faults"), "2");
}

fn path(p: &Path) -> String {
    p.to_str().expect("utf-8 path").to_string()
}

#[test]
fn a_tree_the_trial_cannot_try_is_refused_in_the_freeze_and_runs_on() {
    require_root!();
    let sock = TempDir::new("ferry-replace", "unix");
    let path = sock.path().join("probe.sock");
    let (svc, port) = Service::probe("untrialable", &["bind-unix", path.to_str().expect("utf-8")]);
    let mut client = Client::connect(port);
    assert_eq!(client.ask("INCR").expect("first"), "1");
    // Rebuilt, the socket would be bound again while the old tree holds
    // the path. Found once the tree is captured: it is frozen then, and
    // resumed.
    let names = format!("unix socket bound to {}", path.display());
    refused(&svc, &mut client, &["--rebuild-files"], &names);
    assert!(path.exists(), "the socket file is gone");
    assert_eq!(client.ask("INCR").expect("after"), "2");
    // Carried (the default), it is the same socket: nothing is bound, the
    // trial runs and the tree is replaced.
    replaced(&svc, &[]);
    assert!(path.exists(), "the socket file is gone after the replacement");
    assert_eq!(client.ask("INCR").expect("after the replacement"), "3");
}

/// A restore that would fail (the restore's check made to fail with
/// `FERRY_FAULT_FAIL_CHECK`, standing for any restore bug, in the trial
/// and after the kill alike) is found by the trial, before the kill: the
/// old process runs on, the same one, answering on its connection.
/// Without the trial (or with a trial whose result the kill did not wait
/// for) the restore after the kill would fail and the service be gone,
/// and this test with it. Then, without the fault, the tree is replaced
/// and no copy of the trial is left: the restore waited for its end.
#[test]
fn a_restore_that_would_fail_is_found_by_the_trial_before_the_kill() {
    require_root!();
    let (svc, port) = Service::probe("trial-finds", &[]);
    let mut client = Client::connect(port);
    assert_eq!(client.ask("INCR").expect("first"), "1");
    let before = svc.start_time();
    let out = Command::new(FERRY)
        .args(["replace", "--pid", &svc.pid.to_string()])
        .env("FERRY_FAULT_FAIL_CHECK", "1")
        .output()
        .expect("running ferry replace");
    let said = text(&out);
    assert!(said.contains("FERRY_FAULT_FAIL_CHECK"), "not the check's failure: {said}");
    refused_as(&svc, &mut client, out, before, &[], "the trial restore of the new tree failed");
    assert_eq!(client.ask("INCR").expect("after the refusal"), "2");
    replaced(&svc, &[]);
    assert_eq!(client.ask("INCR").expect("after the replacement"), "3");
    let bin = svc._dir.path().join("probe_server");
    let running = processes_of(bin.to_str().expect("utf-8 path"));
    assert_eq!(running, vec![svc.pid], "a copy of the server is left beside it");
}

/// Every process whose command line names `needle`.
fn processes_of(needle: &str) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            String::from_utf8_lossy(&cmdline).contains(needle)
        })
        .collect()
}

/// The line's fields `name=value` as pairs.
fn fields(line: &str) -> Vec<(String, String)> {
    line.split_whitespace()
        .filter_map(|w| w.split_once('=').map(|(k, v)| (k.to_string(), v.to_string())))
        .collect()
}

/// One connection to `port`, tried until the server listens.
fn connect_when_listening(port: u16) -> Client {
    let t = Instant::now();
    loop {
        match Client::try_connect(port) {
            Ok(client) => return client,
            Err(e) => assert!(t.elapsed() < Duration::from_secs(10), "no listener on {port}: {e}"),
        }
        sleep(Duration::from_millis(20));
    }
}

/// Reads exactly `want.len()` bytes from `s` and compares them.
fn read_exactly(s: &mut TcpStream, want: &str) {
    use std::io::Read;
    let mut buf = vec![0u8; want.len()];
    s.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    s.read_exact(&mut buf).unwrap_or_else(|e| panic!("reading {want:?}: {e}"));
    assert_eq!(String::from_utf8_lossy(&buf), want);
}

/// The conformance test of carried descriptors
/// (tests/replace/carried_kinds.c): one object of each carried kind, each
/// with state in it, is the very same object after `ferry replace`
/// (the server's own dev:ino and SO_COOKIE of each fd, and kcmp of each
/// fd against the test's own reference to the file taken before), with
/// its state intact; the TCP peer sees its bytes and no reset, and a
/// connection that waited in a listener's accept queue through the
/// replacement is accepted by the new process. No connection is
/// repaired and no network lock is taken.
#[test]
fn every_carried_kind_is_the_same_object_with_its_state_after_replace() {
    require_root!();
    let dir = TempDir::new("ferry-replace", "carried");
    let bin = dir.path().join("carried_kinds");
    ferry_testkit::compile_c(&repo().join("tests/replace/carried_kinds.c"), &bin);
    let watched = dir.path().join("watched");
    std::fs::create_dir(&watched).expect("watched directory");
    let port = ferry_testkit::free_port();
    let argv = [path(&bin), port.to_string(), path(&watched)];
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let svc = Service::spawn(&argv, "carried_kinds", dir);
    let mut control = connect_when_listening(port);
    let ready = control.ask("READY").expect("READY");
    let backlog: u16 = ready.strip_prefix("READY ").and_then(|p| p.parse().ok()).expect(&ready);
    // The data connection: bytes queued both ways, read by neither side.
    let mut data = TcpStream::connect(("127.0.0.1", port)).expect("data connection");
    data.write_all(b"C2S").expect("C2S");
    assert_eq!(control.ask("ACCEPT").expect("ACCEPT"), "OK");
    // A connection that waits in the backlog listener's accept queue.
    let mut waiting = TcpStream::connect(("127.0.0.1", backlog)).expect("backlog connection");
    waiting.write_all(b"waiting").expect("waiting");
    let ids_before = control.ask("IDS").expect("IDS");
    let fds = fields(&control.ask("FDS").expect("FDS"));
    // 13 objects and the control connection carried, the epoll over the
    // signalfd rebuilt. The test's own reference
    // to each file, for kcmp afterwards. Not
    // to the memfd and the epoll: a capture refuses those when a process
    // outside the tree holds them (the memfd's own inode tells it apart;
    // the epoll's entries are checked by the server, and ferry's own
    // check compares it by kcmp).
    let pidfd = ferry_sys::pidfd::pidfd_open(svc.pid).expect("pidfd_open");
    let ours: Vec<(String, i32, std::os::fd::OwnedFd)> = fds
        .iter()
        .filter(|(name, _)| !["memfd", "epoll", "epoll_sig"].contains(&name.as_str()))
        .map(|(name, fd)| {
            let fd: i32 = fd.parse().expect("fd number");
            let dup = ferry_sys::pidfd::pidfd_getfd(&pidfd, fd).expect("pidfd_getfd");
            (name.clone(), fd, dup)
        })
        .collect();
    drop(pidfd);
    let said = replaced(&svc, &[]);
    assert!(
        said.contains("14 files carried, 0 TCP connections repaired, no network lock"),
        "{said}"
    );
    let ids_after = control.ask("IDS").expect("IDS after");
    for ((name, before), (_, after)) in fields(&ids_before).iter().zip(fields(&ids_after).iter()) {
        assert_eq!(before, after, "{name}: dev:ino:cookie changed over the replacement");
    }
    let me = std::process::id() as i32;
    for (name, fd, dup) in &ours {
        use std::os::fd::AsRawFd;
        let same = ferry_sys::fd::kcmp_same_file(svc.pid, me, *fd, dup.as_raw_fd());
        assert_eq!(same, Ok(true), "{name} (fd {fd}) is not the same open file description");
    }
    assert_eq!(control.ask("CHECK").expect("CHECK"), "CHECKED", "{said}");
    // The peer got what was queued for it, then more: no reset.
    read_exactly(&mut data, "S2C");
    read_exactly(&mut data, "D-OK\n");
    read_exactly(&mut waiting, "B-OK\n");
    assert_eq!(svc.ended.load(Ordering::SeqCst), 1, "the old process was not ended once");
}

/// Rebuilt (`--rebuild-files`), a connection goes through TCP repair
/// behind the network lock, and the line says so: the carried count of
/// the test above is no default of the report.
#[test]
fn rebuilt_files_repair_the_connection_behind_a_lock() {
    require_root!();
    let (svc, port) = Service::probe("rebuilt", &[]);
    let mut client = Client::connect(port);
    assert_eq!(client.ask("INCR").expect("first"), "1");
    let said = replaced(&svc, &["--rebuild-files"]);
    assert!(
        said.contains("0 files carried, 1 TCP connections repaired, network lock held"),
        "{said}"
    );
    assert_eq!(client.ask("INCR").expect("after"), "2");
    // The default carries the listener and the connection.
    let said = replaced(&svc, &[]);
    assert!(
        said.contains("2 files carried, 0 TCP connections repaired, no network lock"),
        "{said}"
    );
    assert_eq!(client.ask("INCR").expect("after carrying"), "3");
}

#[test]
fn a_pid_that_does_not_exist_is_refused() {
    require_root!();
    // pid_max is 32768 here; a PID above it cannot exist.
    let out = replace(4_000_000, &[]);
    let said = text(&out);
    assert!(!out.status.success(), "{said}");
    assert!(said.contains("pid 4000000") && said.contains("no such process"), "{said}");
}

#[test]
fn redis_is_replaced_20_times_under_a_client_with_every_reply_right() {
    require_root!();
    if !Path::new(REDIS).exists() {
        eprintln!("SKIPPED redis_is_replaced_20_times: {REDIS} is not installed");
        return;
    }
    let dir = TempDir::new("ferry-replace", "redis");
    let port = ferry_testkit::free_port();
    let d = path(dir.path());
    let port_s = port.to_string();
    let argv = [
        REDIS,
        "--port",
        &port_s,
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--daemonize",
        "no",
        "--dir",
        &d,
    ];
    let svc = Service::start(&argv, "redis-server", port, dir);
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    let client = std::thread::spawn(move || -> Result<u64, String> {
        let mut cl = Client::connect(port);
        let mut last = 0u64;
        while !s.load(Ordering::Relaxed) {
            let reply = cl.ask("INCR ferry").map_err(|e| format!("after {last}: {e}"))?;
            let v: u64 = reply
                .strip_prefix(':')
                .and_then(|n| n.parse().ok())
                .ok_or_else(|| format!("after {last}: reply {reply:?}"))?;
            if v != last + 1 {
                return Err(format!("the counter went from {last} to {v}"));
            }
            last = v;
        }
        Ok(last)
    });
    sleep(Duration::from_millis(200));
    // 20 as the issue asks: about 0.1 s each here.
    for i in 0..20 {
        let said = replaced(&svc, &[]);
        assert!(!client.is_finished(), "the client stopped at replacement {i}: {said}");
    }
    sleep(Duration::from_millis(200));
    stop.store(true, Ordering::Relaxed);
    let last = client.join().expect("client thread").expect("every reply right");
    // The counter is exact: every INCR counted once, none lost.
    let mut check = Client::connect(port);
    let header = check.ask("GET ferry").expect("GET");
    let value = check.read_line().expect("GET's value");
    assert_eq!(
        (header.as_str(), value.trim()),
        (format!("${}", last.to_string().len()).as_str(), last.to_string().as_str())
    );
    assert_eq!(svc.ended.load(Ordering::SeqCst), 20);
    assert!(last > 0);
}

/// A cgroup v2 directory made for one test, removed on drop (after the
/// service in it is gone: declare it before the service).
struct TestCgroup {
    dir: PathBuf,
    name: String,
}

impl TestCgroup {
    fn new(tag: &str) -> Option<TestCgroup> {
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
        let mount = mountinfo.lines().find_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            (right.split(' ').next()? == "cgroup2" && left.split(' ').nth(3)? == "/")
                .then(|| left.split(' ').nth(4).map(PathBuf::from))?
        })?;
        static N: AtomicU64 = AtomicU64::new(0);
        let name =
            format!("ferry-test-{tag}-{}-{}", std::process::id(), N.fetch_add(1, Ordering::SeqCst));
        let dir = mount.join(&name);
        std::fs::create_dir(&dir).ok()?;
        Some(TestCgroup { dir, name })
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        // Its processes were killed first; their exit takes a moment.
        let t = Instant::now();
        while std::fs::remove_dir(&self.dir).is_err() && t.elapsed() < Duration::from_secs(5) {
            sleep(Duration::from_millis(10));
        }
    }
}

/// The children of `pid` (from every thread's children list).
fn children_of(pid: i32) -> Vec<i32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return Vec::new() };
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("children")).ok())
        .flat_map(|s| s.split_whitespace().filter_map(|n| n.parse().ok()).collect::<Vec<i32>>())
        .collect()
}

#[test]
fn ferry_killed_before_the_kill_leaves_the_old_tree_running() {
    require_root!();
    let (svc, port) = Service::probe("ferry-killed", &[]);
    let mut client = Client::connect(port);
    let before = svc.start_time();
    for (n, phase) in ["early trial", "capture", "edit", "trial"].iter().enumerate() {
        let mut ferry = Command::new(FERRY)
            .args(["replace", "--pid", &svc.pid.to_string()])
            .env("FERRY_FAULT_STALL_AFTER", format!("replace:{phase}"))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("running ferry replace");
        let mut err = BufReader::new(ferry.stderr.take().expect("stderr"));
        let mut line = String::new();
        err.read_line(&mut line).expect("ferry's stall line");
        assert!(line.contains(&format!("stalling after replace phase '{phase}'")), "{line}");
        // Its checkpoint guard comes to this test (a subreaper) once ferry
        // is gone, and is reaped here when it has put the tree back.
        let guards = children_of(ferry.id() as i32);
        ferry_testkit::kill(ferry.id() as i32, libc::SIGKILL);
        let _ = ferry.wait();
        for g in guards {
            ferry_testkit::reap(g);
        }
        assert!(svc.running(), "the old process is gone after ferry died after {phase}");
        assert_eq!(svc.start_time(), before, "the process changed after {phase}");
        assert_eq!(svc.ended.load(Ordering::SeqCst), 0, "the old process ended after {phase}");
        assert_eq!(client.ask("INCR").expect("the old connection"), (n + 1).to_string());
    }
    // And it can still be replaced, and no trial copy is left.
    replaced(&svc, &[]);
    assert_eq!(client.ask("INCR").expect("the old connection"), "5");
    let bin = svc._dir.path().join("probe_server");
    let running = processes_of(bin.to_str().expect("utf-8 path"));
    assert_eq!(running, vec![svc.pid], "a copy of the server is left beside it");
}

#[test]
fn all_options_at_once_with_every_capability_dropped() {
    require_root!();
    let cg = TestCgroup::new("replace-all");
    let (svc, port) = Service::probe("all", &[]);
    let mut client = Client::connect(port);
    let work = TempDir::new("ferry-replace", "all-filter");
    let filter = getppid_eperm_filter(work.path());
    let mut args = vec!["--seccomp", filter.to_str().expect("utf-8"), "--drop-caps", "all"];
    args.extend(["--rlimit", "nproc=100:200"]);
    let dir = cg.as_ref().map(|c| path(&c.dir));
    if let Some(d) = &dir {
        args.extend(["--cgroup", d.as_str()]);
    }
    // The filter is installed while the new process still has root's
    // capabilities: no_new_privs is not needed, and stays unset.
    replaced(&svc, &args);
    for k in ["CapPrm", "CapEff", "CapBnd", "CapInh", "CapAmb"] {
        assert_eq!(caps(svc.pid, k), 0, "{k}");
    }
    assert_eq!(status_field(svc.pid, "NoNewPrivs"), "0");
    assert_eq!(status_field(svc.pid, "Seccomp_filters"), "1");
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", svc.pid)).expect("limits");
    let nproc = limits.lines().find(|l| l.starts_with("Max processes")).expect("nproc row");
    assert_eq!(nproc.split_whitespace().skip(2).take(2).collect::<Vec<_>>(), ["100", "200"]);
    if let Some(c) = &cg {
        let cgroup = std::fs::read_to_string(format!("/proc/{}/cgroup", svc.pid)).expect("cgroup");
        assert!(cgroup.lines().any(|l| l == format!("0::/{}", c.name)), "{cgroup}");
    }
    assert_eq!(client.ask("PPID").expect("the old connection"), format!("E{}", libc::EPERM));
    assert_eq!(client.ask("INCR").expect("the old connection"), "1");
}

#[test]
fn a_tree_with_children_is_replaced_whole_or_refused_for_its_reaper() {
    require_root!();
    let dir = TempDir::new("ferry-replace", "tree");
    let svc = Service::spawn(&["/bin/sh", "-c", "sleep 1000 & sleep 1000 & wait"], "sh", dir);
    let t = Instant::now();
    let kids = loop {
        let kids = children_of(svc.pid);
        if kids.len() == 2 {
            break kids;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "the children did not start: {kids:?}");
        sleep(Duration::from_millis(10));
    };
    // The children are orphaned by the kill and come to this test (a
    // subreaper), which reaps them as an init would.
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    let reaped = kids.clone();
    let reaper = std::thread::spawn(move || {
        while !s.load(Ordering::Relaxed) {
            for &k in &reaped {
                let _ = ferry_testkit::try_reap(k);
            }
            sleep(Duration::from_millis(1));
        }
    });
    let starts: Vec<u64> = kids.iter().map(|&k| stat(k).expect("child").1).collect();
    let before = svc.start_time();
    sleep(Duration::from_millis(20));
    let out = replace(svc.pid, &[]);
    let said = text(&out);
    eprintln!("{said}");
    if out.status.success() {
        assert_ne!(svc.start_time(), before, "{said}");
        for (&k, was) in kids.iter().zip(&starts) {
            assert!(stat(k).is_some_and(|(st, t)| st != 'Z' && t != *was), "child {k}: {said}");
        }
        let mut now = children_of(svc.pid);
        now.sort_unstable();
        let mut want = kids.clone();
        want.sort_unstable();
        assert_eq!(now, want, "{said}");
    } else {
        // A machine whose init (or another ancestor) leaves its children
        // unreaped: refused before the freeze, the tree untouched.
        assert!(said.contains("leaves its ended children unreaped"), "{said}");
        assert!(said.contains("the old tree runs on untouched"), "{said}");
        assert_eq!(svc.start_time(), before);
        for (&k, was) in kids.iter().zip(&starts) {
            assert_eq!(stat(k).map(|s| s.1), Some(*was), "child {k} changed: {said}");
        }
    }
    // Killed by PID, checked by name.
    for &k in &kids {
        if std::fs::read_to_string(format!("/proc/{k}/comm")).is_ok_and(|c| c.trim() == "sleep") {
            ferry_testkit::kill(k, libc::SIGKILL);
        }
    }
    drop(svc);
    let t = Instant::now();
    while kids.iter().any(|&k| stat(k).is_some()) && t.elapsed() < Duration::from_secs(5) {
        sleep(Duration::from_millis(5));
    }
    stop.store(true, Ordering::Relaxed);
    let _ = reaper.join();
}

/// The TIDs of `pid`'s threads, sorted.
fn tids(pid: i32) -> Vec<i32> {
    let mut out: Vec<i32> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .expect("task dir")
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    out.sort_unstable();
    out
}

/// Field 19 of /proc/PID/task/TID/stat: the thread's nice value.
fn thread_nice(pid: i32, tid: i32) -> i32 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")).expect("stat");
    let rest: Vec<&str> = text[text.rfind(')').expect("comm") + 1..].split_whitespace().collect();
    rest[16].parse().expect("nice field")
}

fn thread_cpus(pid: i32, tid: i32) -> String {
    let text = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")).expect("status");
    text.lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .map(|v| v.trim().to_string())
        .expect("Cpus_allowed_list")
}

#[test]
fn every_thread_of_the_new_tree_has_the_nice_value() {
    require_root!();
    let (svc, port) = Service::probe("nice", &["threads"]);
    let mut client = Client::connect(port);
    assert_eq!(client.ask("INCR").expect("first"), "1");
    let before = tids(svc.pid);
    assert_eq!(before.len(), 3, "the server has not started its threads");
    assert!(before.iter().all(|&t| thread_nice(svc.pid, t) == 0));
    // A negative value (only root may lower it) given as its own argument.
    let said = replaced(&svc, &["--nice", "-5"]);
    assert!(said.contains("nice -5"), "{said}");
    assert_eq!(tids(svc.pid), before, "the threads are not the same TIDs");
    for &t in &before {
        assert_eq!(thread_nice(svc.pid, t), -5, "thread {t}");
    }
    assert_eq!(client.ask("INCR").expect("the old connection"), "2");
    replaced(&svc, &["--nice", "12"]);
    for &t in &before {
        assert_eq!(thread_nice(svc.pid, t), 12, "thread {t}");
    }
    assert_eq!(client.ask("INCR").expect("the old connection"), "3");
}

#[test]
fn every_thread_of_the_new_tree_runs_on_the_cpus() {
    require_root!();
    let (svc, port) = Service::probe("cpus", &["threads"]);
    let mut client = Client::connect(port);
    assert_eq!(client.ask("INCR").expect("first"), "1");
    let before = tids(svc.pid);
    assert_eq!(before.len(), 3, "the server has not started its threads");
    // The last CPU this test may use: ferry (its child) may use it too.
    let own = std::fs::read_to_string("/proc/self/status").expect("own status");
    let own = own.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:")).expect("own cpus");
    let last = own.trim().rsplit([',', '-']).next().expect("a cpu").to_string();
    if own.trim() != last {
        assert_ne!(thread_cpus(svc.pid, before[0]), last, "the server is on {last} already");
    }
    let said = replaced(&svc, &["--cpus", &last]);
    assert!(said.contains(&format!("cpus {last}")), "{said}");
    assert_eq!(tids(svc.pid), before, "the threads are not the same TIDs");
    for &t in &before {
        assert_eq!(thread_cpus(svc.pid, t), last, "thread {t}");
    }
    assert_eq!(client.ask("INCR").expect("the old connection"), "2");
    // Both options at once, and back to every CPU ferry may use.
    replaced(&svc, &["--cpus", own.trim(), "--nice", "3"]);
    for &t in &before {
        assert_eq!((thread_cpus(svc.pid, t), thread_nice(svc.pid, t)), (own.trim().into(), 3));
    }
    assert_eq!(client.ask("INCR").expect("the old connection"), "3");
}

#[test]
fn cpus_ferry_may_not_use_and_nice_for_a_real_time_thread_are_refused() {
    require_root!();
    let (svc, port) = Service::probe("cpus-refused", &["threads"]);
    let mut client = Client::connect(port);
    assert_eq!(client.ask("INCR").expect("first"), "1");
    let online = std::fs::read_to_string("/sys/devices/system/cpu/online").expect("online");
    let cpus: Vec<u32> = online
        .trim()
        .split(',')
        .flat_map(|r| match r.split_once('-') {
            Some((a, b)) => (a.parse().expect("cpu")..=b.parse().expect("cpu")).collect(),
            None => vec![r.parse().expect("cpu")],
        })
        .collect();
    if cpus.len() >= 2 {
        // ferry run on one CPU (taskset) may not give the tree another.
        let (mine, other) = (cpus[0].to_string(), cpus[1].to_string());
        let before = svc.start_time();
        let out = Command::new("taskset")
            .args(["-c", &mine, FERRY, "replace", "--pid", &svc.pid.to_string(), "--cpus", &other])
            .output()
            .expect("running taskset ferry replace");
        let names =
            format!("--cpus {other}: CPU {other} is outside the CPUs ferry may use ({mine}");
        refused_as(&svc, &mut client, out, before, &["--cpus", &other], &names);
    } else {
        eprintln!("one CPU online: the refusal of a CPU ferry may not use is not tried");
    }
    // A real-time thread ignores nice: refused in the freeze, by name.
    let rt = tids(svc.pid)[2];
    let out = Command::new("chrt").args(["-f", "-p", "1", &rt.to_string()]).output().expect("chrt");
    assert!(out.status.success(), "chrt: {}", text(&out));
    let names =
        format!("--nice 5: pid {} thread {rt} runs under SCHED_FIFO, which ignores nice", svc.pid);
    let masks = |pid: i32| tids(pid).iter().map(|&t| thread_cpus(pid, t)).collect::<Vec<_>>();
    let masks_before = masks(svc.pid);
    refused(&svc, &mut client, &["--nice", "5"], &names);
    assert_eq!(thread_nice(svc.pid, rt), 0);
    // Refused after the injected calls, which kept each thread on
    // ferry's CPU: every mask is the thread's own again.
    assert_eq!(masks(svc.pid), masks_before, "each thread's CPU mask after the refusal");
    // Its affinity can still be set, and its policy is kept.
    let last = cpus.last().expect("a cpu").to_string();
    replaced(&svc, &["--cpus", &last]);
    assert_eq!(thread_cpus(svc.pid, rt), last);
    let policy = Command::new("chrt").args(["-p", &rt.to_string()]).output().expect("chrt -p");
    assert!(text(&policy).contains("SCHED_FIFO"), "{}", text(&policy));
    assert_eq!(client.ask("INCR").expect("the old connection"), "2");
}

fn uts_link(pid: &str) -> String {
    std::fs::read_link(format!("/proc/{pid}/ns/uts"))
        .unwrap_or_else(|e| panic!("/proc/{pid}/ns/uts: {e}"))
        .to_string_lossy()
        .into_owned()
}

/// What `nsenter -u -t PID hostname` prints: the hostname of the
/// process's UTS namespace, read from outside.
fn hostname_of(pid: i32) -> String {
    let out = Command::new("nsenter")
        .args(["-u", "-t", &pid.to_string(), "hostname"])
        .output()
        .expect("running nsenter");
    assert!(out.status.success(), "nsenter: {}", text(&out));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
fn the_new_tree_gets_a_uts_namespace_with_the_hostname_and_keeps_it() {
    require_root!();
    let (svc, port) = Service::probe("hostname", &[]);
    let mut client = Client::connect(port);
    assert_eq!(client.ask("INCR").expect("first"), "1");
    let ours = uts_link("self");
    assert_eq!(uts_link(&svc.pid.to_string()), ours);
    let domain = std::fs::read_to_string("/proc/sys/kernel/domainname").expect("domainname");
    let domain = domain.trim();
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").expect("hostname");
    let name = format!("ferry-svc-{}", std::process::id());
    let said = replaced(&svc, &["--hostname", &name]);
    assert!(said.contains(&format!("hostname {name}")), "{said}");
    let first = uts_link(&svc.pid.to_string());
    assert_ne!(first, ours, "the new tree is in ferry's UTS namespace");
    assert_eq!(hostname_of(svc.pid), name);
    // The process itself sees it, with the domainname it had.
    assert_eq!(client.ask("UNAME").expect("the old connection"), format!("{name} {domain}"));
    assert_eq!(client.ask("INCR").expect("the old connection"), "2");
    // The tree in a namespace of its own is replaced again as it is: a new
    // namespace (the old one died with the old tree) with the same names.
    replaced(&svc, &[]);
    let second = uts_link(&svc.pid.to_string());
    assert_ne!(second, ours);
    assert_eq!(client.ask("UNAME").expect("the old connection"), format!("{name} {domain}"));
    // And given another name, it keeps its domainname.
    replaced(&svc, &["--hostname", "ferry-svc-b", "--nice", "1"]);
    assert_ne!(uts_link(&svc.pid.to_string()), ours);
    assert_eq!(client.ask("UNAME").expect("the old connection"), format!("ferry-svc-b {domain}"));
    assert_eq!(client.ask("INCR").expect("the old connection"), "3");
    // The host's own names are untouched.
    let after = std::fs::read_to_string("/proc/sys/kernel/hostname").expect("hostname");
    assert_eq!(after, host, "the host's hostname changed");
}

#[test]
fn a_service_in_its_own_uts_namespace_keeps_its_names_when_replaced() {
    require_root!();
    let name = format!("ferry-own-{}", std::process::id());
    let (svc, port) = Service::probe("own-uts", &["own-uts", &name]);
    let mut client = Client::connect(port);
    let want = format!("{name} {name}.test");
    assert_eq!(client.ask("UNAME").expect("first"), want);
    let ours = uts_link("self");
    assert_ne!(uts_link(&svc.pid.to_string()), ours);
    assert_eq!(client.ask("INCR").expect("first"), "1");
    replaced(&svc, &[]);
    assert_ne!(uts_link(&svc.pid.to_string()), ours, "the new tree is in ferry's namespace");
    assert_eq!(hostname_of(svc.pid), name);
    assert_eq!(client.ask("UNAME").expect("the old connection"), want);
    assert_eq!(client.ask("INCR").expect("the old connection"), "2");
    // A new hostname: the domainname stays the service's own.
    replaced(&svc, &["--hostname", "renamed"]);
    assert_eq!(client.ask("UNAME").expect("the old connection"), format!("renamed {name}.test"));
}
