//! `ferry replace` of a server whose parent is init: the old root's PID
//! comes free for the new root only once init reaps it, inside the
//! pause. An init that reaps only now and then (or never) is found
//! before the freeze with an orphan of ferry's own, and the tree is
//! refused and runs on; an init that reaps at once lets it through.
//!
//! Each test runs in a PID namespace of its own (`unshare --pid --fork
//! --mount-proc --kill-child`) whose init is a small Python program:
//! it starts tests/replace's counter server as its child, asks it once,
//! runs `ferry replace`, and asks again on the same connection. The
//! namespace, and everything in it, ends with that init.

use ferry_testkit::{require_root, TempDir};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const FERRY: &str = env!("CARGO_BIN_EXE_ferry");

/// The namespace's init. argv: reaping (`never` or `at-once`), server
/// binary, port, ferry.
const INIT: &str = r#"
import os, socket, subprocess, sys, threading, time
reaping, server, port, ferry = sys.argv[1:5]
srv = subprocess.Popen([server, port], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, start_new_session=True)
waited = set()
def reap_every_child():
    while True:
        for p in os.listdir("/proc"):
            if not p.isdigit() or int(p) in waited:
                continue
            try:
                st = open(f"/proc/{p}/stat").read()
            except OSError:
                continue
            f = st[st.rfind(")") + 2:].split()
            if f[0] == "Z" and f[1] == "1":
                try:
                    os.waitpid(int(p), os.WNOHANG)
                except ChildProcessError:
                    pass
        time.sleep(0.001)
if reaping == "at-once":
    threading.Thread(target=reap_every_child, daemon=True).start()
for _ in range(1000):
    try:
        conn = socket.create_connection(("127.0.0.1", int(port)))
        break
    except OSError:
        time.sleep(0.01)
io = conn.makefile("rw")
def ask(line):
    io.write(line + "\n"); io.flush()
    return io.readline().strip()
print("before", ask("INCR"), srv.pid, flush=True)
f = subprocess.Popen([ferry, "replace", "--pid", str(srv.pid)], stdout=subprocess.PIPE,
                     stderr=subprocess.PIPE, text=True)
waited.add(f.pid)
out, err = f.communicate()
print("ferry", f.returncode, (out + err).replace("\n", " "), flush=True)
print("after", ask("INCR"), flush=True)
"#;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Runs the namespace's init with `reaping`; its output.
fn replace_under_init(reaping: &str) -> String {
    let dir = TempDir::new("ferry-replace-reaper", reaping);
    let bin = dir.path().join("counter_server");
    ferry_testkit::compile_c(&repo().join("examples/counter_server.c"), &bin);
    let init = dir.path().join("init.py");
    std::fs::write(&init, INIT).expect("writing the init");
    let port = ferry_testkit::free_port().to_string();
    let mut child = Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc", "--kill-child", "/usr/bin/python3"])
        .arg(&init)
        .args([reaping, bin.to_str().expect("utf-8 path"), &port, FERRY])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting unshare");
    let t = Instant::now();
    while child.try_wait().expect("try_wait").is_none() {
        if t.elapsed() > Duration::from_secs(60) {
            // --kill-child: the namespace's init, and with it the namespace, ends too.
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().expect("unshare's output");
    let said =
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    eprintln!("{said}");
    said
}

fn line<'a>(said: &'a str, first: &str) -> &'a str {
    said.lines()
        .find(|l| l.split_whitespace().next() == Some(first))
        .unwrap_or_else(|| panic!("no {first:?} line in {said}"))
}

#[test]
fn a_server_whose_init_does_not_reap_is_refused_and_runs_on() {
    require_root!();
    let said = replace_under_init("never");
    assert!(line(&said, "before").starts_with("before 1 "), "{said}");
    let ferry = line(&said, "ferry");
    assert!(ferry.starts_with("ferry 1 "), "{said}");
    assert!(ferry.contains("left an ended orphan of ferry's"), "{said}");
    assert!(ferry.contains("the old tree runs on untouched"), "{said}");
    // The same process, on the same connection, with its counter.
    assert_eq!(line(&said, "after"), "after 2", "{said}");
}

#[test]
fn a_server_whose_init_reaps_at_once_is_replaced() {
    require_root!();
    let said = replace_under_init("at-once");
    let ferry = line(&said, "ferry");
    assert!(ferry.starts_with("ferry 0 replaced pid "), "{said}");
    assert_eq!(line(&said, "after"), "after 2", "{said}");
}
