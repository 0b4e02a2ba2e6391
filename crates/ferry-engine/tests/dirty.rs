//! Dirty-page tracking (`ferry_engine::dirty::DirtyTracker`) on a real
//! program, `tests/dirty_target.c`: exactly the pages it writes (by
//! stores, by a read() into a buffer, in a new mapping) are reported, a
//! second collection right after reports nothing, the program runs on with
//! its memory intact, and nothing of the tracking is left after drop.
//!
//! Needs root (ptrace, userfaultfd in another process). When not root each
//! test prints a message and returns.

use ferry_engine::dirty::DirtyTracker;
use ferry_testkit::require_root;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Instant;

const PG: u64 = 4096;

fn compile() -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/dirty_target.c");
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(dir).expect("target tmpdir");
    // A unique name per test: tests run in parallel.
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let bin = dir.join(format!(
        "dirty_target.{}.{}",
        std::process::id(),
        N.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
    ));
    ferry_testkit::compile_c(&src, &bin);
    bin
}

/// The running test program and its command pipe.
struct Target {
    child: Child,
    input: ChildStdin,
    output: BufReader<ChildStdout>,
    pid: i32,
    a: u64,
    na: u64,
    c: u64,
    child_pid: i32,
    bin: PathBuf,
}

fn field(line: &str, key: &str) -> u64 {
    let v = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix(key))
        .unwrap_or_else(|| panic!("no {key} in {line:?}"));
    if key == "A=" || key == "C=" || key == "B=" {
        u64::from_str_radix(v, 16).expect("hex")
    } else {
        v.parse().expect("number")
    }
}

impl Target {
    fn start(mib: u64, tree: bool) -> Target {
        let bin = compile();
        let mut cmd = Command::new(&bin);
        cmd.arg(mib.to_string());
        if tree {
            cmd.arg("tree");
        }
        // Only stdin, stdout and stderr: a descriptor inherited from the
        // test harness (a pipe to cargo) would make a checkpoint refuse it.
        ferry_testkit::only_stdio(&mut cmd);
        let mut child =
            cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().expect("start dirty_target");
        let input = child.stdin.take().expect("stdin");
        let mut output = BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = String::new();
        output.read_line(&mut line).expect("READY line");
        assert!(line.starts_with("READY"), "unexpected {line:?}");
        let pid = child.id() as i32;
        let child_pid = field(&line, "CHILD=") as i32;
        wait_blocked_in_read(pid);
        if child_pid > 0 {
            wait_blocked_in_read(child_pid);
        }
        Target {
            child,
            input,
            output,
            pid,
            a: field(&line, "A="),
            na: field(&line, "NA="),
            c: field(&line, "C="),
            child_pid,
            bin,
        }
    }

    fn cmd(&mut self, c: &str) -> String {
        writeln!(self.input, "{c}").expect("send command");
        self.input.flush().expect("flush");
        let mut line = String::new();
        self.output.read_line(&mut line).expect("reply");
        assert!(!line.starts_with("bad") && !line.is_empty(), "{c}: {line:?}");
        wait_blocked_in_read(self.pid);
        if self.child_pid > 0 {
            wait_blocked_in_read(self.child_pid);
        }
        line.trim().to_string()
    }
}

/// Waits until `pid` sleeps in read(2), its idle state. A process that has
/// replied (or been forked) still runs a few instructions before that, and
/// their stack and libc writes would be reported as written pages: under
/// load that tail can come after the tracker's next collect.
///
/// Sleeping (state S), not only inside read: a thread released by ptrace
/// (the tracker's attach stops and injects) is runnable until it is
/// scheduled, and on its way back into read the kernel updates its rseq
/// area (the CPU it runs on), a write to one of its pages. That write
/// must come before the test's first collect, not after it.
fn wait_blocked_in_read(pid: i32) {
    let path = format!("/proc/{pid}/syscall");
    let stat = format!("/proc/{pid}/stat");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let now = std::fs::read_to_string(&path).unwrap_or_default();
        let state = std::fs::read_to_string(&stat).unwrap_or_default();
        let sleeping =
            state.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('S'));
        if now.starts_with("0 ") && sleeping {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "pid {pid} never blocked in read: {path} says {now:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

impl Target {
    /// Waits until the program (and its child) sleep in read again, e.g.
    /// after the tracker's attach stopped and released them.
    fn settle(&self) {
        wait_blocked_in_read(self.pid);
        if self.child_pid > 0 {
            wait_blocked_in_read(self.child_pid);
        }
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if self.child_pid > 0 {
            // A pid we started (already gone is fine).
            ferry_testkit::kill(self.child_pid, libc::SIGKILL);
        }
        let _ = std::fs::remove_file(&self.bin);
    }
}

/// The pages of `ranges` inside `[lo, hi)`, as page indices from `lo`.
fn pages_in(ranges: &[(u64, u64)], lo: u64, hi: u64) -> Vec<u64> {
    let mut out = Vec::new();
    for &(s, e) in ranges {
        let (s, e) = (s.max(lo), e.min(hi));
        let mut a = s;
        while a < e {
            out.push((a - lo) / PG);
            a += PG;
        }
    }
    out
}

fn of(res: &[(i32, Vec<(u64, u64)>)], pid: i32) -> &[(u64, u64)] {
    &res.iter().find(|(p, _)| *p == pid).unwrap_or_else(|| panic!("pid {pid} not in result")).1
}

fn check_sorted_merged(res: &[(i32, Vec<(u64, u64)>)]) {
    for (pid, r) in res {
        for w in r.windows(2) {
            assert!(w[0].1 < w[1].0, "pid {pid}: ranges not sorted and merged: {w:?}");
        }
        for &(s, e) in r {
            assert!(s < e && s % PG == 0 && e % PG == 0, "pid {pid}: bad range {s:#x}-{e:#x}");
        }
    }
}

/// Whether any mapping of `pid` shows VmFlags "uw" (userfaultfd write
/// protection registered); and whether the one starting at `at` does.
fn uw_flags(pid: i32, at: u64) -> (bool, bool) {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).expect("smaps");
    let (mut any, mut here, mut cur) = (false, false, 0u64);
    for line in smaps.lines() {
        if let Some(flags) = line.strip_prefix("VmFlags:") {
            let uw = flags.split_whitespace().any(|f| f == "uw");
            any |= uw;
            here |= uw && cur == at;
        } else if let Some((range, _)) = line.split_once(' ') {
            if let Some((s, _)) = range.split_once('-') {
                if let Ok(v) = u64::from_str_radix(s, 16) {
                    cur = v;
                }
            }
        }
    }
    (any, here)
}

fn nothing(res: &[(i32, Vec<(u64, u64)>)]) -> bool {
    res.iter().all(|(_, r)| r.is_empty())
}

fn exactly_the_written_pages_are_reported() {
    require_root!();
    let mut t = Target::start(64, false);
    let t0 = Instant::now();
    let mut tracker = DirtyTracker::attach(t.pid).expect("attach");
    eprintln!("attach (64 MiB populated): {:.2} ms", t0.elapsed().as_secs_f64() * 1e3);
    t.settle();
    assert_eq!(tracker.pids(), vec![t.pid]);
    assert!(uw_flags(t.pid, t.a).1, "region A is not registered for write protection");
    // The program is blocked reading its stdin: nothing is written.
    let r = tracker.collect().expect("collect");
    check_sorted_merged(&r);
    let r = tracker.collect().expect("collect");
    assert!(nothing(&r), "an idle process reported written pages: {r:x?}");

    t.cmd("w 7");
    let b = field(&t.cmd("mmap 8"), "B=");
    t.cmd("read 2 3");
    let r = tracker.collect().expect("collect");
    check_sorted_merged(&r);
    let mine = of(&r, t.pid);
    let expect_a: Vec<u64> = (0..t.na).filter(|p| p % 7 == 0).collect();
    assert_eq!(pages_in(mine, t.a, t.a + t.na * PG), expect_a, "pages of A reported");
    assert_eq!(pages_in(mine, t.c, t.c + 16 * PG), vec![2, 3, 4], "pages of C written by read()");
    // A new mapping is reported whole (its present pages): all 8 here.
    assert_eq!(pages_in(mine, b, b + 8 * PG), (0..8).collect::<Vec<_>>(), "new mapping B");
    let r = tracker.collect().expect("collect");
    assert!(nothing(&r), "second collect right after reported {r:x?}");

    // Written again after being reported: reported again, and only those.
    t.cmd("w 1000");
    let r = tracker.collect().expect("collect");
    assert_eq!(
        pages_in(of(&r, t.pid), t.a, t.a + t.na * PG),
        (0..t.na).filter(|p| p % 1000 == 0).collect::<Vec<_>>()
    );
    assert_eq!(pages_in(of(&r, t.pid), b, b + 8 * PG), Vec::<u64>::new(), "B is tracked now");
    assert_eq!(t.cmd("check"), "ok");

    // A mapping made over a tracked one at the very same place is not
    // registered: reported whole (all 16 pages present), then tracked.
    // A, right before C, is scanned in the same call, which stops at C:
    // its written pages are reported all the same, exactly.
    t.cmd("w 999");
    t.cmd("remap");
    let r = tracker.collect().expect("collect after remap");
    assert_eq!(
        pages_in(of(&r, t.pid), t.c, t.c + 16 * PG),
        (0..16).collect::<Vec<_>>(),
        "C mapped anew"
    );
    assert_eq!(
        pages_in(of(&r, t.pid), t.a, t.a + t.na * PG),
        (0..t.na).filter(|p| p % 999 == 0).collect::<Vec<_>>(),
        "A before C"
    );
    assert!(uw_flags(t.pid, t.c).1, "C mapped anew is not registered");
    t.cmd("cpage 5");
    let r = tracker.collect().expect("collect");
    assert_eq!(pages_in(of(&r, t.pid), t.c, t.c + 16 * PG), vec![5]);
    assert_eq!(t.cmd("check"), "ok");

    drop(tracker);
    assert!(!uw_flags(t.pid, t.a).0, "VmFlags still show uw after the tracker was dropped");
    t.cmd("w 5");
    assert_eq!(t.cmd("check"), "ok");
}

fn tree_parent_and_child_are_tracked_apart() {
    require_root!();
    let mut t = Target::start(64, true);
    let mut tracker = DirtyTracker::attach(t.pid).expect("attach");
    t.settle();
    let mut pids = tracker.pids();
    pids.sort_unstable();
    let mut want = vec![t.pid, t.child_pid];
    want.sort_unstable();
    assert_eq!(pids, want);
    tracker.collect().expect("collect");
    let r = tracker.collect().expect("collect");
    assert!(nothing(&r), "idle tree reported {r:x?}");

    // A is shared copy-on-write since the fork: each side's writes are its own.
    t.cmd("w 7");
    t.cmd("cw 5");
    let r = tracker.collect().expect("collect");
    let range = (t.a, t.a + t.na * PG);
    assert_eq!(
        pages_in(of(&r, t.pid), range.0, range.1),
        (0..t.na).filter(|p| p % 7 == 0).collect::<Vec<_>>(),
        "parent"
    );
    assert_eq!(
        pages_in(of(&r, t.child_pid), range.0, range.1),
        (0..t.na).filter(|p| p % 5 == 3).collect::<Vec<_>>(),
        "child"
    );
    let r = tracker.collect().expect("collect");
    assert!(nothing(&r), "second collect reported {r:x?}");
    assert_eq!(t.cmd("check"), "ok");
    assert_eq!(t.cmd("cc"), "ok");

    // A process that exits is dropped from the set, without an error.
    ferry_testkit::kill(t.child_pid, libc::SIGKILL);
    std::thread::sleep(std::time::Duration::from_millis(50));
    let r = tracker.collect().expect("collect after the child was killed");
    assert_eq!(r.iter().map(|(p, _)| *p).collect::<Vec<_>>(), vec![t.pid]);
    assert_eq!(tracker.pids(), vec![t.pid]);

    drop(tracker);
    assert!(!uw_flags(t.pid, t.a).0, "VmFlags still show uw after drop");
    t.child_pid = 0;
}

fn a_tracked_process_can_be_checkpointed_and_restores_untracked() {
    require_root!();
    let mut t = Target::start(16, false);
    let mut tracker = DirtyTracker::attach(t.pid).expect("attach");
    t.settle();
    t.cmd("w 3");
    tracker.collect().expect("collect");
    let dir = std::env::temp_dir().join(format!("ferry-dirty-ckpt-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("image dir");
    // stdin and stdout are pipes to this test: external.
    let opts = ferry_engine::capture::CaptureOptions {
        external_stdio: true,
        parent_sees_exit: true,
        leave_running: true,
        ..Default::default()
    };
    ferry_engine::capture::checkpoint(t.pid, &dir, &opts)
        .expect("checkpoint of a tracked process (leave running)");
    // Tracking goes on across the checkpoint (its scratch mapping is gone).
    t.cmd("w 11");
    let r = tracker.collect().expect("collect after checkpoint");
    assert_eq!(
        pages_in(of(&r, t.pid), t.a, t.a + t.na * PG),
        (0..t.na).filter(|p| p % 11 == 0).collect::<Vec<_>>()
    );

    // Now for real: checkpoint while tracked, kill, restore.
    let opts = ferry_engine::capture::CaptureOptions {
        external_stdio: true,
        parent_sees_exit: true,
        ..Default::default()
    };
    ferry_engine::capture::checkpoint(t.pid, &dir, &opts).expect("checkpoint of a tracked process");
    drop(tracker);
    let _ = t.child.wait();
    // stdin and stdout come back on a FIFO this test holds open both
    // ways: opening it never blocks, and the program waits on it forever.
    let fifo = dir.join("stdio");
    ferry_testkit::mkfifo(&fifo);
    let _hold = std::fs::OpenOptions::new().read(true).write(true).open(&fifo).expect("open fifo");
    let ropts = ferry_engine::restore::RestoreOptions {
        tty_to: fifo.to_string_lossy().into_owned(),
        ..Default::default()
    };
    let restored = ferry_engine::restore::restore(&dir, &ropts).expect("restore");
    let pid = restored.host_pid.0;
    assert!(!uw_flags(pid, t.a).0, "the restored process carries a userfaultfd registration");
    // Its memory is the last one written: pages p % 3 and p % 11 were
    // written once each (both: twice).
    let mem = std::fs::File::open(format!("/proc/{pid}/mem")).expect("mem");
    let mut page = vec![0u8; PG as usize];
    for p in 0..t.na {
        mem.read_exact_at(&mut page, t.a + p * PG).expect("read restored memory");
        let gen = u64::from(p % 3 == 0) + u64::from(p % 11 == 0);
        let v = ((p * 31 + gen * 7 + 1) & 0xff) as u8;
        assert!(page.iter().all(|&b| b == v), "restored page {p} differs");
    }
    // The restore made it our child.
    ferry_testkit::kill_and_reap(pid);
    let _ = std::fs::remove_dir_all(&dir);
}

fn collect_time_for_1_gib_with_1_percent_dirty() {
    require_root!();
    let mut t = Target::start(1024, false);
    let t0 = Instant::now();
    let mut tracker = DirtyTracker::attach(t.pid).expect("attach");
    let attach_ms = t0.elapsed().as_secs_f64() * 1e3;
    t.settle();
    tracker.collect().expect("collect");
    let t0 = Instant::now();
    let r = tracker.collect().expect("collect");
    let idle_ms = t0.elapsed().as_secs_f64() * 1e3;
    assert!(nothing(&r));
    let mut times = Vec::new();
    for round in 0..5 {
        t.cmd("w 100");
        let t0 = Instant::now();
        let r = tracker.collect().expect("collect");
        times.push(t0.elapsed().as_secs_f64() * 1e3);
        let pages = pages_in(of(&r, t.pid), t.a, t.a + t.na * PG);
        // 2,622 separate pages: more than 512 regions per scan, so the
        // scan resumes several times (the walk_end path).
        assert_eq!(pages, (0..t.na).filter(|p| p % 100 == 0).collect::<Vec<_>>(), "round {round}");
    }
    t.cmd("w 1");
    let t0 = Instant::now();
    let r = tracker.collect().expect("collect");
    let all_ms = t0.elapsed().as_secs_f64() * 1e3;
    assert_eq!(pages_in(of(&r, t.pid), t.a, t.a + t.na * PG).len() as u64, t.na);
    times.sort_by(f64::total_cmp);
    eprintln!(
        "1 GiB: attach {attach_ms:.2} ms; collect with 0 % dirty {idle_ms:.3} ms, 1 % dirty (2,622 pages) median {:.3} ms (min {:.3}, max {:.3}), 100 % dirty {all_ms:.2} ms; {} bytes reported",
        times[2],
        times[0],
        times[4],
        DirtyTracker::bytes(&r)
    );
    assert_eq!(t.cmd("check"), "ok");
}

/// No libtest harness (Cargo.toml): the checkpoint and the restore fork
/// in this process, which they refuse to do beside another thread, and
/// libtest runs every test on a thread of its own.
fn main() {
    ferry_testkit::run_on_main_thread(&[
        ("exactly_the_written_pages_are_reported", exactly_the_written_pages_are_reported),
        ("tree_parent_and_child_are_tracked_apart", tree_parent_and_child_are_tracked_apart),
        (
            "a_tracked_process_can_be_checkpointed_and_restores_untracked",
            a_tracked_process_can_be_checkpointed_and_restores_untracked,
        ),
        (
            "collect_time_for_1_gib_with_1_percent_dirty",
            collect_time_for_1_gib_with_1_percent_dirty,
        ),
    ]);
}
