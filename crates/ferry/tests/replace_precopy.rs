//! `ferry replace` with pre-copy: the root's memory copied into the new
//! tree while the old one runs, and the faults of that phase.
//!
//! The server is tests/replace/memory_server.c: N MiB filled with a
//! pattern, optionally rewriting a 16th of it all the time (a hot
//! writer), and checking every page on request. Each server runs in a
//! session of its own as a child of the test process, a child subreaper;
//! a thread reaps the PIDs the test lists (the root, and a child it
//! forks), so that the killed old processes' PIDs come free. Everything
//! is killed by PID (checked by name) on drop, also when a test fails.

use ferry_testkit::{require_root, LineClient as Client, TempDir};
use std::io::{BufRead, BufReader};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{sleep, JoinHandle};
use std::time::{Duration, Instant};

const FERRY: &str = env!("CARGO_BIN_EXE_ferry");
const COMM: &str = "memory_server";

fn start_time(pid: i32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest: Vec<&str> = text[text.rfind(')')? + 1..].split_whitespace().collect();
    if matches!(rest.first(), Some(&"Z") | Some(&"X")) {
        return None;
    }
    rest.get(19)?.parse().ok()
}

/// A memory_server and the PIDs the test reaps for it.
struct Server {
    pid: i32,
    port: u16,
    pids: Arc<Mutex<Vec<i32>>>,
    /// Processes of the listed PIDs that ended.
    ended: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    reaper: Option<JoinHandle<()>>,
    _dir: TempDir,
}

impl Server {
    fn start(tag: &str, mib: u32, hot: bool) -> Server {
        let dir = TempDir::new("ferry-replace-precopy", tag);
        let bin = dir.path().join(COMM);
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/replace/memory_server.c");
        ferry_testkit::compile_c(&src, &bin);
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let (port_s, mib_s) = (port.to_string(), mib.to_string());
        let mut argv = vec![bin.to_str().expect("utf-8 path"), &port_s, &mib_s];
        if hot {
            argv.push("hot");
        }
        let pid = ferry_testkit::spawn_detached(&argv, dir.path());
        let pids = Arc::new(Mutex::new(vec![pid]));
        let stop = Arc::new(AtomicBool::new(false));
        let ended = Arc::new(AtomicU64::new(0));
        let (p, s, n) = (pids.clone(), stop.clone(), ended.clone());
        let reaper = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let list = p.lock().map(|l| l.clone()).unwrap_or_default();
                for pid in list {
                    if ferry_testkit::try_reap(pid).is_some() {
                        n.fetch_add(1, Ordering::SeqCst);
                    }
                }
                sleep(Duration::from_millis(1));
            }
        });
        let server = Server { pid, port, pids, ended, stop, reaper: Some(reaper), _dir: dir };
        let t = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(t.elapsed() < Duration::from_secs(20), "{COMM} does not listen on {port}");
            sleep(Duration::from_millis(20));
        }
        server
    }

    fn reap_also(&self, pid: i32) {
        self.pids.lock().expect("pid list").push(pid);
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let list = self.pids.lock().map(|l| l.clone()).unwrap_or_default();
        for &pid in list.iter().rev() {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            if comm.trim() == COMM {
                ferry_testkit::kill(pid, libc::SIGKILL);
            }
        }
        let t = Instant::now();
        while list.iter().any(|&p| Path::new(&format!("/proc/{p}")).exists())
            && t.elapsed() < Duration::from_secs(5)
        {
            sleep(Duration::from_millis(5));
        }
        reap_stray_holders();
        self.stop.store(true, Ordering::Relaxed);
        if let Some(r) = self.reaper.take() {
            let _ = r.join();
        }
    }
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// ferry replace stalled after pre-copy phase `phase` for `secs` (120:
/// until killed); returns it once it says so.
fn stalled_ferry(pid: i32, phase: &str, secs: u32) -> std::process::Child {
    let mut ferry = Command::new(FERRY)
        .args(["replace", "--pid", &pid.to_string()])
        .env("FERRY_FAULT_STALL_AFTER", format!("pre-copy:{phase}"))
        .env("FERRY_FAULT_STALL_SECS", secs.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running ferry replace");
    let mut line = String::new();
    let mut err = BufReader::new(ferry.stderr.take().expect("stderr"));
    err.read_line(&mut line).expect("ferry's stall line");
    assert!(line.contains(&format!("stalling after pre-copy phase '{phase}'")), "{line}");
    // The rest of stderr, read when the test waits for ferry.
    ferry.stderr = Some(err.into_inner());
    ferry
}

#[test]
fn memory_is_precopied_and_whole_after_the_replacement_under_a_hot_writer() {
    require_root!();
    let srv = Server::start("hot", 64, true);
    let mut client = Client::connect(srv.port);
    assert_eq!(client.ask("CHECK").expect("reply"), "OK 16384");
    let before = start_time(srv.pid);
    let said = replaced_verbosely(srv.pid);
    assert_ne!(start_time(srv.pid), before, "still the old process: {said}");
    let line = said.lines().find(|l| l.starts_with("replaced pid")).expect("the line");
    // The 64 MiB once, and what the writer rewrote between rounds.
    let precopied = number_before(line, " MiB in ");
    assert!(precopied >= 64.0, "{line}");
    assert!(said.contains("pre-copy: round 0"), "{said}");
    // The hot writer rewrites 4 MiB: the pause copies about that, not 64.
    let pause_mib = number_before(line, " MiB copied in the pause");
    assert!(pause_mib < 16.0, "{pause_mib} MiB copied in the pause: {line}");
    assert_eq!(client.ask("CHECK").expect("reply"), "OK 16384", "{said}");
    assert_eq!(client.ask("INCR").expect("reply"), "1");
    assert_eq!(srv.ended.load(Ordering::SeqCst), 1);
    reap_holders(&said);
}

/// Ended holders of old memory (of replacements run without `-v`),
/// orphaned to the test process: reaped, by PID.
fn reap_stray_holders() {
    let me = std::process::id().to_string();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else { continue };
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let fields: Vec<&str> =
            stat.rsplit_once(')').map(|(_, r)| r.split_whitespace().collect()).unwrap_or_default();
        if stat.contains("(ferry-holder)")
            && fields.first() == Some(&"Z")
            && fields.get(1) == Some(&me.as_str())
        {
            ferry_testkit::try_reap(pid);
        }
    }
}

/// The holders of the old memory that `ferry -v replace` names (`held by
/// [..]`): each must have ended by the time ferry exits. Orphaned by the
/// kill, they are the test's (a child subreaper) to reap.
fn reap_holders(said: &str) -> Vec<i32> {
    let holders: Vec<i32> = said
        .split_once("held by [")
        .and_then(|(_, rest)| rest.split_once(']'))
        .map(|(list, _)| list.split(", ").filter_map(|p| p.parse().ok()).collect())
        .unwrap_or_default();
    for &h in &holders {
        let t = Instant::now();
        // Reaped here, or by another test's server's drop (stray_holders).
        while ferry_testkit::try_reap(h).is_none() && Path::new(&format!("/proc/{h}")).exists() {
            assert!(t.elapsed() < Duration::from_secs(5), "holder {h} did not end: {said}");
            sleep(Duration::from_millis(5));
        }
    }
    holders
}

/// `ferry -v replace --pid PID`, which must succeed: all it said.
fn replaced_verbosely(pid: i32) -> String {
    let out = Command::new(FERRY)
        .args(["-v", "replace", "--pid", &pid.to_string()])
        .output()
        .expect("ferry replace");
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    said
}

/// The number `line` has right before `suffix` (after a space or '(').
fn number_before(line: &str, suffix: &str) -> f64 {
    line.split_once(suffix)
        .and_then(|(head, _)| head.rsplit([' ', '(']).next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no number before {suffix:?} in {line}"))
}

/// A kB figure of /proc/PID/smaps_rollup.
fn rollup_kb(pid: i32, key: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// A large old process's address space is held past the kill (the kill
/// does not wait for its teardown) and freed after the new tree runs;
/// the new root inherits the placed memory in huge pages where the host
/// allows them, with every page as it was.
#[test]
fn large_memory_is_freed_after_the_release_and_inherited_in_huge_pages() {
    require_root!();
    let srv = Server::start("held", 64, false);
    let mut client = Client::connect(srv.port);
    assert_eq!(client.ask("CHECK").expect("reply"), "OK 16384");
    let said = replaced_verbosely(srv.pid);
    let line = said.lines().find(|l| l.starts_with("replaced pid")).expect("the line");
    assert!(line.contains("old memory (6") && line.contains("freed after the release"), "{line}");
    assert_eq!(reap_holders(&said).len(), 1, "{said}");
    let thp =
        std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
    if thp.contains('[') && !thp.contains("[never]") {
        let huge_mib = number_before(line, " MiB in huge pages");
        assert!(huge_mib >= 2.0, "{line}");
        let huge_kb = rollup_kb(srv.pid, "AnonHugePages:");
        assert!(huge_kb >= 2048, "the new root has {huge_kb} kB in huge pages: {line}");
    }
    assert_eq!(client.ask("CHECK").expect("reply"), "OK 16384", "{said}");
    assert_eq!(client.ask("INCR").expect("reply"), "1");
}

#[test]
fn the_old_tree_exiting_during_precopy_is_a_clean_error() {
    require_root!();
    let srv = Server::start("exits", 32, false);
    let ferry = stalled_ferry(srv.pid, "round 0", 3);
    ferry_testkit::kill(srv.pid, libc::SIGKILL);
    let out = ferry.wait_with_output().expect("ferry");
    let said = text(&out);
    assert!(!out.status.success(), "{said}");
    assert!(said.contains("the tree exited during pre-copy"), "{said}");
    assert!(!said.contains("runs on untouched"), "{said}");
    // ferry is gone, and with it its placed memory and userfaultfds.
    assert!(start_time(srv.pid).is_none(), "pid {} still runs", srv.pid);
}

#[test]
fn a_process_forked_during_precopy_is_replaced_with_the_tree() {
    require_root!();
    let srv = Server::start("fork", 32, true);
    let mut client = Client::connect(srv.port);
    let ferry = stalled_ferry(srv.pid, "round 0", 2);
    let child: i32 = client.ask("FORK").expect("reply").parse().expect("the child's pid");
    srv.reap_also(child);
    let (root_before, child_before) = (start_time(srv.pid), start_time(child));
    let out = ferry.wait_with_output().expect("ferry");
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    assert!(said.contains("pre-copied"), "{said}");
    assert_ne!(start_time(srv.pid), root_before, "the root is still the old process");
    assert!(start_time(child).is_some(), "the forked child is not in the new tree: {said}");
    assert_ne!(start_time(child), child_before, "the child is still the old process");
    assert_eq!(client.ask("CHECK").expect("reply"), "OK 8192");
    assert_eq!(client.ask("INCR").expect("reply"), "1");
}

#[test]
fn ferry_killed_during_precopy_leaves_the_service_running_once() {
    require_root!();
    let srv = Server::start("killed", 32, true);
    let mut client = Client::connect(srv.port);
    let before = start_time(srv.pid);
    for (n, phase) in ["tracking armed, memory placed", "round 0"].iter().enumerate() {
        let mut ferry = stalled_ferry(srv.pid, phase, 120);
        ferry_testkit::kill(ferry.id() as i32, libc::SIGKILL);
        let _ = ferry.wait();
        assert_eq!(start_time(srv.pid), before, "the service changed after {phase}");
        assert_eq!(srv.ended.load(Ordering::SeqCst), 0, "the service ended after {phase}");
        assert_eq!(client.ask("INCR").expect("reply"), (n + 1).to_string(), "after {phase}");
        assert_eq!(client.ask("CHECK").expect("reply"), "OK 8192", "after {phase}");
    }
    // No userfaultfd of ferry's left in it, and one process of that name.
    let fds = std::fs::read_dir(format!("/proc/{}/fd", srv.pid)).expect("fds");
    for fd in fds.flatten() {
        let target = std::fs::read_link(fd.path()).unwrap_or_default();
        assert!(!target.to_string_lossy().contains("userfaultfd"), "{target:?} left");
    }
    let same_port = Command::new("ss").args(["-Htln", &format!("sport = :{}", srv.port)]).output();
    if let Ok(o) = same_port {
        assert_eq!(String::from_utf8_lossy(&o.stdout).lines().count(), 1, "listeners");
    }
    // And it can be replaced afterwards.
    let out = Command::new(FERRY)
        .args(["replace", "--pid", &srv.pid.to_string()])
        .output()
        .expect("ferry replace");
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(client.ask("INCR").expect("reply"), "3");
    assert_eq!(client.ask("CHECK").expect("reply"), "OK 8192");
}

#[test]
fn no_precopy_copies_every_page_in_the_pause() {
    require_root!();
    let srv = Server::start("off", 16, false);
    let mut client = Client::connect(srv.port);
    let out = Command::new(FERRY)
        .args(["-v", "replace", "--no-precopy", "--pid", &srv.pid.to_string()])
        .output()
        .expect("ferry replace");
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    let line = said.lines().find(|l| l.starts_with("replaced pid")).expect("the line");
    assert!(!line.contains("pre-copied"), "{line}");
    assert!(!said.contains("pre-copy: round"), "{said}");
    assert_eq!(client.ask("CHECK").expect("reply"), "OK 4096");
    assert_eq!(client.ask("INCR").expect("reply"), "1");
}

/// A memory cgroup of the test's (v1's memory controller, or v2 where
/// it is enabled), removed on drop once its processes are gone.
struct MemoryCgroup {
    dir: std::path::PathBuf,
    limit_file: &'static str,
}

impl MemoryCgroup {
    fn new(tag: &str) -> Option<MemoryCgroup> {
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
        let mount = |fstype: &str, option: Option<&str>| {
            mountinfo.lines().find_map(|l| {
                let (left, right) = l.split_once(" - ")?;
                let r: Vec<&str> = right.split(' ').collect();
                let wanted = r.first() == Some(&fstype)
                    && option
                        .is_none_or(|o| r.get(2).is_some_and(|x| x.split(',').any(|c| c == o)));
                wanted.then(|| left.split(' ').nth(4).map(std::path::PathBuf::from))?
            })
        };
        let (base, limit_file) = match mount("cgroup", Some("memory")) {
            Some(m) => (m, "memory.limit_in_bytes"),
            None => {
                let m = mount("cgroup2", None)?;
                let enabled = std::fs::read_to_string(m.join("cgroup.subtree_control")).ok()?;
                enabled.split_whitespace().any(|c| c == "memory").then_some((m, "memory.max"))?
            }
        };
        let dir = base.join(format!("ferry-test-{tag}-{}", std::process::id()));
        std::fs::create_dir(&dir).ok()?;
        Some(MemoryCgroup { dir, limit_file })
    }

    fn limit(&self, bytes: u64) {
        std::fs::write(self.dir.join(self.limit_file), bytes.to_string()).expect("memory limit");
    }

    fn add(&self, pid: i32) {
        std::fs::write(self.dir.join("cgroup.procs"), pid.to_string()).expect("cgroup.procs");
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        let t = Instant::now();
        while std::fs::remove_dir(&self.dir).is_err() && t.elapsed() < Duration::from_secs(5) {
            sleep(Duration::from_millis(20));
        }
    }
}

/// A process in a cgroup that limits its memory is killed with its
/// teardown, as before: held past the kill, its memory would stay
/// charged there while the new tree starts to allocate.
#[test]
fn memory_under_a_cgroup_limit_is_not_held_past_the_kill() {
    require_root!();
    let Some(cg) = MemoryCgroup::new("held-limit") else {
        eprintln!(
            "SKIPPED memory_under_a_cgroup_limit_is_not_held_past_the_kill: no memory cgroup"
        );
        return;
    };
    let srv = Server::start("limited", 64, false);
    cg.limit(1 << 30);
    cg.add(srv.pid);
    let mut client = Client::connect(srv.port);
    assert_eq!(client.ask("CHECK").expect("reply"), "OK 16384");
    let said = replaced_verbosely(srv.pid);
    let line = said.lines().find(|l| l.starts_with("replaced pid")).expect("the line");
    assert!(!line.contains("old memory"), "{line}");
    assert!(said.contains("memory not held past the kill"), "{said}");
    assert!(said.contains("held by [] "), "{said}");
    assert_eq!(client.ask("CHECK").expect("reply"), "OK 16384", "{said}");
    assert_eq!(client.ask("INCR").expect("reply"), "1");
}
