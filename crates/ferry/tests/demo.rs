//! `ferry demo`: it runs to the end with no failed client request, and it
//! leaves no namespace, process or directory of its own behind, also when
//! interrupted with SIGINT in the middle of a migration.

use ferry_testkit::is_root;
use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn have(program: &str) -> bool {
    ["/usr/bin", "/usr/sbin", "/bin", "/usr/local/bin"]
        .iter()
        .any(|d| std::path::Path::new(d).join(program).exists())
}

fn skip() -> bool {
    if !is_root() {
        eprintln!("skipped: needs root");
        return true;
    }
    if !have("redis-server") {
        eprintln!("skipped: redis-server is not installed");
        return true;
    }
    false
}

/// The demo's namespaces (`ferry-demo-PID-*`) and temp dirs that still exist.
fn leftovers(pid: u32) -> Vec<String> {
    let prefix = format!("ferry-demo-{pid}-");
    let mut left: Vec<String> = std::fs::read_dir("/run/netns")
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter(|n| n.starts_with(&prefix))
                .collect()
        })
        .unwrap_or_default();
    left.extend(
        std::fs::read_dir(std::env::temp_dir())
            .map(|d| {
                d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                    .filter(|n| n.starts_with(&prefix))
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default(),
    );
    left
}

fn run_demo(args: &[&str]) -> (u32, Output) {
    let child = Command::new(env!("CARGO_BIN_EXE_ferry"))
        .arg("demo")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start ferry demo");
    let pid = child.id();
    (pid, child.wait_with_output().expect("wait for ferry demo"))
}

fn check_success(args: &[&str]) {
    let (pid, out) = run_demo(args);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "ferry demo {args:?} failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    assert!(stdout.contains(" 0 failed,"), "no '0 failed' in the report:\n{stdout}");
    assert!(
        stdout.contains("migrating 2/2: host2 → host1"),
        "second migration not shown:\n{stdout}"
    );
    assert!(stdout.contains("8/8 counters match"), "counters:\n{stdout}");
    assert!(stdout.contains("DEMO OK"), "{stdout}");
    assert_eq!(leftovers(pid), Vec::<String>::new(), "ferry demo left these behind:\n{stdout}");
}

/// The demo as `make demo` runs it (pre-copy, as `ferry migrate` does by
/// default), with two migrations: host1 → host2 → host1.
#[test]
fn demo_two_migrations() {
    if skip() {
        return;
    }
    check_success(&["--migrations", "2"]);
}

/// The same with stop-and-copy migrations.
#[test]
fn demo_two_migrations_stop_and_copy() {
    if skip() {
        return;
    }
    check_success(&["--migrations", "2", "--no-precopy"]);
}

/// SIGINT during the first migration: the demo ends everything it made and
/// exits with 130.
#[test]
fn demo_interrupted_cleans_up() {
    if skip() {
        return;
    }
    let mut child = Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(["demo", "--migrations", "4"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start ferry demo");
    let pid = child.id();
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut all = String::new();
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line.contains("migrating 1/4") {
                let _ = tx.send(());
            }
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    let started = rx.recv_timeout(Duration::from_secs(120)).is_ok();
    // SIGINT to the child we started.
    ferry_testkit::kill(pid as i32, libc::SIGINT);
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = child.try_wait().expect("try_wait") {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("ferry demo did not end within 60 s of SIGINT");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let text = reader.join().expect("reader");
    assert!(started, "the first migration never started:\n{text}");
    assert_eq!(status.code(), Some(130), "exit status after SIGINT:\n{text}");
    assert!(text.contains("==> cleaning up"), "{text}");
    assert_eq!(
        leftovers(pid),
        Vec::<String>::new(),
        "ferry demo left these behind after SIGINT:\n{text}"
    );
}
