//! What ferry promises around a checkpoint, tested on real processes:
//! refusal of what it cannot capture (naming the object, process unharmed),
//! --leave-running, a taken PID at restore, and damaged images rejected
//! before anything is restored. Programs live in tests/guarantees/ and
//! tests/conformance/ and follow the conformance protocol (READY, then
//! SIGUSR2, then PASS/FAIL).

mod common;

use common::{innermost_pid, inode, NetNs};
use ferry_testkit::{exists, kill, require_root};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread::sleep;
use std::time::{Duration, Instant};

const FERRY: &str = env!("CARGO_BIN_EXE_ferry");
static COUNTER: AtomicU32 = AtomicU32::new(0);

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A temp dir and the processes of one test; dropping it kills (by the
/// PIDs we started) and reaps them, and removes the dir.
struct Case {
    dir: PathBuf,
    /// Where the image goes: in `dir`, or on tmpfs ([`Case::images_in_memory`]).
    images: PathBuf,
    children: Vec<Child>,
    /// Other processes this test made (a PID namespace's init): killed.
    pids: Vec<i32>,
}

impl Case {
    fn new(name: &str) -> Case {
        let dir = std::env::temp_dir().join(format!(
            "ferry-guarantee-{name}-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).expect("temp dir");
        Case { images: dir.join("images"), dir, children: Vec::new(), pids: Vec::new() }
    }

    /// The image goes to a directory on tmpfs (/dev/shm), removed with the case.
    fn images_in_memory(mut self) -> Case {
        let name = self.dir.file_name().expect("a name").to_owned();
        self.images = Path::new("/dev/shm").join(name);
        self
    }

    fn compile(&self, src: &str) -> PathBuf {
        let out = self.dir.join("prog");
        let st = Command::new("gcc")
            .args(["-O1", "-g", "-pthread", "-o"])
            .arg(&out)
            .arg(repo().join(src))
            .status()
            .expect("gcc");
        assert!(st.success(), "compiling {src} failed");
        out
    }

    /// Starts `prog` in its own session with only stdio open; waits for READY.
    fn start(&mut self, prog: &Path) -> i32 {
        self.start_args(prog, &[])
    }

    fn start_args(&mut self, prog: &Path, args: &[&str]) -> i32 {
        let log = fs::File::create(self.dir.join("program.log")).expect("log");
        let mut cmd = Command::new(prog);
        cmd.args(args);
        cmd.current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log);
        ferry_testkit::own_session(&mut cmd);
        let child = cmd.spawn().expect("spawn");
        let pid = child.id() as i32;
        self.children.push(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.log().contains("READY") {
            assert!(Instant::now() < deadline, "program never printed READY: {}", self.log());
            sleep(Duration::from_millis(10));
        }
        pid
    }

    fn log(&self) -> String {
        fs::read_to_string(self.dir.join("program.log")).unwrap_or_default()
    }

    fn images(&self) -> PathBuf {
        self.images.clone()
    }

    fn ferry(&self, args: &[&str]) -> Output {
        Command::new(FERRY).args(args).output().expect("run ferry")
    }

    fn checkpoint(&self, pid: i32, extra: &[&str]) -> Output {
        let images = self.images();
        let mut args = vec!["checkpoint", "--pid"];
        let pid_s = pid.to_string();
        args.push(&pid_s);
        args.push("--images");
        args.push(images.to_str().expect("utf-8 path"));
        args.extend_from_slice(extra);
        self.ferry(&args)
    }

    /// Sends SIGUSR2 to our child `idx` and waits for it to exit; returns its exit code.
    fn finish_child(&mut self, idx: usize) -> i32 {
        let pid = self.children[idx].id() as i32;
        // A process we started.
        kill(pid, libc::SIGUSR2);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(st) = self.children[idx].try_wait().expect("wait") {
                return st.code().unwrap_or(-1);
            }
            assert!(Instant::now() < deadline, "program did not finish: {}", self.log());
            sleep(Duration::from_millis(10));
        }
    }

    /// Restores from `images` (plus `extra` args) as a child of the test,
    /// waits for the process to run, lets it check itself (SIGUSR2) and
    /// returns ferry restore's exit code, which is the program's.
    fn restore_and_finish(&mut self, pid: i32, images: &Path, extra: &[&str]) -> Option<i32> {
        let pidfile = self.dir.join("pid");
        let _ = fs::remove_file(&pidfile);
        let restore = Command::new(FERRY)
            .arg("restore")
            .arg("--images")
            .arg(images)
            .arg("--pidfile")
            .arg(&pidfile)
            .args(extra)
            .spawn()
            .expect("spawn restore");
        self.children.push(restore);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !pidfile.exists() {
            assert!(Instant::now() < deadline, "restore from {} did not finish", images.display());
            sleep(Duration::from_millis(5));
        }
        // The process we restored.
        kill(pid, libc::SIGUSR2);
        let last = self.children.len() - 1;
        self.children[last].wait().expect("wait restore").code()
    }
}

impl Drop for Case {
    fn drop(&mut self) {
        for &pid in &self.pids {
            // A namespace init this test's restore made (its tree goes
            // with it); a reaped one is a harmless ESRCH.
            if comm(pid) == "ferry-init" {
                kill(pid, libc::SIGKILL);
            }
        }
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = fs::remove_dir_all(&self.dir);
        let _ = fs::remove_dir_all(&self.images);
    }
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Checkpoint must fail naming `what`, leave no image behind, and the
/// program must go on and pass its own checks.
fn assert_refused(src: &str, what: &[&str]) {
    assert_refused_args(src, &[], what)
}

/// The lines of a refusal on stderr. A stale network lock of a test
/// running beside this one (any on the host), which ferry removes and
/// says so, is no part of it.
fn refusal_lines(err: &str) -> usize {
    err.trim().lines().filter(|l| !l.contains("released stale network lock")).count()
}

fn assert_refused_args(src: &str, args: &[&str], what: &[&str]) {
    require_root!();
    let mut c = Case::new(Path::new(src).file_stem().and_then(|s| s.to_str()).unwrap_or("prog"));
    let prog = c.compile(src);
    let pid = c.start_args(&prog, args);
    let out = c.checkpoint(pid, &[]);
    let err = stderr(&out);
    assert!(!out.status.success(), "checkpoint of {src} should have been refused");
    for w in what {
        assert!(err.contains(w), "refusal of {src} should mention {w:?}: {err}");
    }
    assert_eq!(refusal_lines(&err), 1, "error should be one line: {err}");
    assert!(!c.images().join("meta.img").exists(), "a refused checkpoint left an image");
    // The trial's helper, forked as the command started, ended with it.
    let images_s = c.images().to_str().expect("utf-8 path").to_string();
    assert_eq!(processes_naming(&images_s), Vec::<i32>::new(), "the trial's helper is left");
    assert_eq!(c.finish_child(0), 0, "program was harmed by the refused checkpoint: {}", c.log());
    assert!(c.log().contains("PASS"), "{}", c.log());
}

/// A child that shares anonymous shared memory with its parent is not
/// taken alone: restored without the parent it would count in a private
/// copy. Refused by name, both run on still sharing it.
#[test]
fn refuses_part_of_a_tree_that_shares_memory_with_the_rest() {
    refuses_a_child_alone(
        &[],
        &["shared memory", "(/dev/zero (deleted))", "outside the tree, maps it too"],
    );
}

/// The same for a child that shares its parent's fd table (CLONE_FILES).
#[test]
fn refuses_part_of_a_tree_that_shares_its_fd_table_with_the_rest() {
    refuses_a_child_alone(&["files"], &["its fd table", "shared with its parent", "CLONE_FILES"]);
}

/// The same for a counter in a SysV segment, a POSIX shared memory
/// object and a memfd the parent maps too.
#[test]
fn refuses_part_of_a_tree_that_shares_sysv_posix_or_memfd_memory_with_the_rest() {
    refuses_a_child_alone(&["sysv"], &["shared memory", "(/SYSV", "outside the tree, maps it too"]);
    refuses_a_child_alone(
        &["posix"],
        &["shared memory", "(/dev/shm/ferry-guarantee-", "outside the tree, maps it too"],
    );
    refuses_a_child_alone(
        &["memfd"],
        &["shared memory", "(/memfd:ferry-counter", "outside the tree, maps it too"],
    );
}

/// A child holding a pipe, a unix socket pair or an open file
/// description (one offset) that its parent holds too: restored alone it
/// would have its own. Refused by name, even with --parent-sees-exit
/// (which is about the parent seeing the exit, not about sharing).
#[test]
fn refuses_part_of_a_tree_that_shares_a_pipe_socket_or_file_offset_with_the_rest() {
    let outside = "outside the tree, holds";
    refuses_a_child_alone(&["pipe"], &["(pipe:[", outside, "the same pipe"]);
    refuses_a_child_alone(&["socketpair"], &["(socket:[", outside, "the same socket"]);
    refuses_a_child_alone_with(
        &["offset"],
        &["--parent-sees-exit"],
        &["shared-offset)", outside, "the same open file description, with its offset"],
    );
}

/// A child in its parent's process group, sharing nothing: its parent
/// stays behind and would see it exit. Refused by name (the parent's PID
/// and the option), the pair unharmed.
#[test]
fn refuses_a_child_whose_parent_stays_and_would_see_it_exit() {
    let log = refuses_a_child_alone(
        &["parent"],
        &[
            "without its parent",
            "process group",
            "would see the process exit",
            "--parent-sees-exit",
        ],
    );
    assert!(log.contains("child still running"), "{log}");
}

/// With --parent-sees-exit the same child is taken: its parent sees it
/// killed, and the image restores it (as a child of ferry restore).
#[test]
fn parent_sees_exit_takes_a_child_and_its_parent_sees_it_exit() {
    require_root!();
    let mut c = Case::new("parent_sees_exit");
    let prog = c.compile("tests/guarantees/shared_counter.c");
    c.start_args(&prog, &["parent"]);
    let child = child_of_log(&c.log());
    let out = c.checkpoint(child, &["--parent-sees-exit"]);
    assert!(out.status.success(), "checkpoint --parent-sees-exit failed: {}", stderr(&out));
    // The parent reaps its killed child; restore needs the PID free.
    let deadline = Instant::now() + Duration::from_secs(10);
    while exists(child) {
        assert!(Instant::now() < deadline, "the parent never reaped its killed child");
        sleep(Duration::from_millis(10));
    }
    let images = c.images();
    assert_eq!(c.restore_and_finish(child, &images, &[]), Some(0), "the restored child");
    assert_eq!(c.finish_child(0), 0, "{}", c.log());
    assert!(c.log().contains("child killed by signal 9"), "{}", c.log());
}

fn child_of_log(log: &str) -> i32 {
    log.lines()
        .find_map(|l| l.strip_prefix("# CHILD "))
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or_else(|| panic!("no child PID in {log}"))
}

/// Starts tests/guarantees/shared_counter.c with `args`, checkpoints its
/// child alone, expects a one-line refusal naming `what`, and the pair
/// unharmed; returns the program's log.
fn refuses_a_child_alone(args: &[&str], what: &[&str]) -> String {
    refuses_a_child_alone_with(args, &[], what)
}

fn refuses_a_child_alone_with(args: &[&str], extra: &[&str], what: &[&str]) -> String {
    refuses_a_child_of("tests/guarantees/shared_counter.c", args, extra, what)
}

/// Starts `src` with `args`, checkpoints the child it names (`# CHILD
/// PID`) alone with `extra`, expects a one-line refusal naming `what`
/// and both processes unharmed; returns the program's log.
fn refuses_a_child_of(src: &str, args: &[&str], extra: &[&str], what: &[&str]) -> String {
    if !ferry_testkit::is_root() {
        eprintln!("skipped: needs root");
        return String::new();
    }
    let mut c = Case::new(Path::new(src).file_stem().and_then(|s| s.to_str()).unwrap_or("prog"));
    let prog = c.compile(src);
    c.start_args(&prog, args);
    let child = child_of_log(&c.log());
    let out = c.checkpoint(child, extra);
    let err = stderr(&out);
    assert!(!out.status.success(), "a child sharing with its parent was checkpointed alone");
    for w in what {
        assert!(err.contains(w), "the refusal should mention {w:?}: {err}");
    }
    assert_eq!(refusal_lines(&err), 1, "error should be one line: {err}");
    assert_eq!(c.finish_child(0), 0, "the pair was harmed by the refused checkpoint: {}", c.log());
    assert!(c.log().contains("PASS"), "{}", c.log());
    c.log()
}

#[test]
fn refuses_a_tree_with_an_unsupported_child_and_leaves_it_running() {
    assert_refused(
        "tests/guarantees/child_unsupported.c",
        &["anon_inode kind [userfaultfd]", "not restored"],
    );
}

#[test]
fn refuses_inotify_and_leaves_it_running() {
    assert_refused("tests/guarantees/inotify_fd.c", &["fd 3", "inotify events are queued"]);
}

#[test]
fn refuses_one_deleted_file_in_two_descriptions_and_leaves_it_running() {
    assert_refused(
        "tests/guarantees/deleted_two_opens.c",
        &["twice", "(deleted)", "another open file description"],
    );
}

#[test]
fn refuses_a_deleted_file_held_by_an_fd_and_a_shared_mapping_and_leaves_it_running() {
    assert_refused(
        "tests/guarantees/deleted_fd_and_shared_map.c",
        &["fd 3", "mapped (deleted)", "mapped shared"],
    );
}

#[test]
fn refuses_a_half_closed_tcp_connection_and_leaves_it_running() {
    assert_refused(
        "tests/guarantees/tcp_half_closed.c",
        &["TCP connection to 127.0.0.1:", "in state", "only established connections"],
    );
}

/// A socket state that a socket made again at restore cannot have
/// (tests/guarantees/socket_states.c MODE): refused at checkpoint by
/// name, the program's socket unchanged afterwards. Each failed the
/// restore after the tree was killed, or came back without the state.
fn refused_socket_state(mode: &str, what: &[&str]) {
    assert_refused_args("tests/guarantees/socket_states.c", &[mode], what);
}

const PENDING_ERROR: &str = "an error is pending on it";

#[test]
fn refuses_a_reset_tcp_connection_whose_fd_is_open() {
    refused_socket_state("tcp_reset", &["fd 4 (socket:[", PENDING_ERROR]);
}

#[test]
fn refuses_a_tcp_connection_closed_both_ways_whose_fd_is_open() {
    refused_socket_state("tcp_closed", &["fd 4 (socket:[", "closed both ways or reset"]);
}

#[test]
fn refuses_a_tcp_socket_disconnected_with_af_unspec_and_its_reset_pending() {
    refused_socket_state("tcp_disconnected", &["fd 4 (socket:[", PENDING_ERROR]);
}

#[test]
fn refuses_a_listener_without_so_reuseaddr_whose_port_is_in_time_wait() {
    refused_socket_state(
        "time_wait",
        &["fd 3 (socket:[", "in TIME_WAIT holds 127.0.0.1:", "no SO_REUSEADDR", "try again"],
    );
}

/// The listener has SO_REUSEADDR, but set it only after accepting the
/// connection now in TIME_WAIT, which has none: bind(2) refuses a socket
/// with SO_REUSEADDR beside it (restore failed with EADDRINUSE after the
/// kill). sock_diag does not show the flag; the BPF tcp iterator does.
#[test]
fn refuses_a_listener_whose_port_is_in_time_wait_from_a_socket_without_so_reuseaddr() {
    refused_socket_state(
        "time_wait_reuse_later",
        &["fd 3 (socket:[", "in TIME_WAIT holds 127.0.0.1:", "without SO_REUSEADDR", "try again"],
    );
}

#[test]
fn refuses_a_tcp_connection_in_flight_that_the_sender_still_holds() {
    refused_socket_state(
        "tcp_in_flight",
        &["fd 7 (socket:[", "passes (SCM_RIGHTS) the TCP connection to 127.0.0.1:", "fd 5 of pid"],
    );
}

#[test]
fn refuses_a_socket_bound_to_an_address_deleted_since() {
    if !Path::new("/usr/sbin/ip").exists() && !Path::new("/sbin/ip").exists() {
        eprintln!("skipped: needs ip (iproute2)");
        return;
    }
    refused_socket_state(
        "addr_deleted",
        &["fd 3 (socket:[", "bound to 10.77.0.1:7070", "no interface of its network namespace"],
    );
}

#[test]
fn refuses_sockets_a_process_outside_the_tree_holds_too() {
    let outside = "outside the tree, holds the same socket";
    for mode in ["outside_listener", "outside_udp", "outside_tcp"] {
        refuses_a_child_of(
            "tests/guarantees/socket_states.c",
            &[mode],
            &[],
            &["(socket:[", outside],
        );
    }
}

#[test]
fn refuses_an_unread_tcp_urgent_byte() {
    refused_socket_state("tcp_oob", &["fd 5 (socket:[", "urgent byte (MSG_OOB) is unread"]);
    refused_socket_state("tcp_oob_inline", &["fd 5 (socket:[", "urgent byte (MSG_OOB) is unread"]);
}

/// An urgent byte already read with recv(MSG_OOB) while bytes before and
/// after its place are still queued: reads stop at its place and then
/// skip it, so a queue read whole stops there too, and a connection made
/// again from it would lose the bytes after it (or, made with them, have
/// no gap to skip).
#[test]
fn refuses_a_tcp_receive_queue_with_an_urgent_byte_read_inside_it() {
    refused_socket_state(
        "tcp_oob_read",
        &["fd 5 (socket:[", "urgent byte (MSG_OOB) already read lies inside its receive queue"],
    );
}

/// An urgent byte sent (MSG_OOB) that the peer has not acknowledged: no
/// socket option shows the send side's urgent pointer (the BPF file
/// iterator reads it); a connection made again sent it inline. Refused by
/// name, and the byte still arrives out of band afterwards.
#[test]
fn refuses_an_urgent_byte_in_a_tcp_send_queue() {
    assert_refused_args(
        "tests/guarantees/socket_refs.c",
        &["urgent"],
        &["fd 4 (socket:[", "urgent byte (MSG_OOB) sent and not acknowledged"],
    );
}

/// A listener the child sent (SCM_RIGHTS) to its parent, outside the
/// tree, which has not received it: no fd table shows that reference
/// (the BPF file iterator's reference count does). Restored, the copy
/// could not bind the address the original still holds. Refused by name;
/// the child runs on and the parent receives the listener and connects.
#[test]
fn refuses_a_socket_in_flight_to_a_process_outside_the_tree() {
    refuses_a_child_of(
        "tests/guarantees/socket_refs.c",
        &["in-flight"],
        &["--parent-sees-exit"],
        &[
            "fd 4 (socket:[",
            "also referenced outside the tree",
            "in flight in another process's unix socket",
        ],
    );
}

#[test]
fn refuses_an_unread_unix_out_of_band_byte() {
    refused_socket_state("unix_oob", &["fd 4 (socket:[", "out-of-band byte (MSG_OOB) is unread"]);
}

#[test]
fn refuses_a_refused_connect_not_read_yet() {
    refused_socket_state("connect_refused", &["fd 3 (socket:[", PENDING_ERROR]);
}

#[test]
fn refuses_tcp_and_udp_sockets_shut_down_for_reading() {
    refused_socket_state("shut_rd", &["fd 5 (socket:[", "shutdown SHUT_RD"]);
    refused_socket_state("udp_shut_rd", &["fd 4 (socket:[", "shutdown SHUT_RD"]);
}

/// SHUT_WR alone on a UDP socket shows in no poll event: read from
/// sock_diag (a restored socket sent again, silently).
#[test]
fn refuses_udp_sockets_shut_down_for_writing() {
    refused_socket_state("udp_shut_wr", &["(socket:[", "shutdown SHUT_WR"]);
}

/// shutdown(SHUT_WR) before connect sends no FIN: an unconnected socket
/// and a connection established since keep it (restored, they sent).
#[test]
fn refuses_tcp_sockets_shut_down_for_writing_before_their_connect() {
    refused_socket_state("tcp_shut_wr_early", &["(socket:[", "SHUT_WR) before its connect"]);
}

#[test]
fn refuses_udp_errors_pending_and_corked_bytes() {
    refused_socket_state("udp_icmp", &["fd 3 (socket:[", PENDING_ERROR]);
    refused_socket_state("udp_errqueue", &["fd 3 (socket:[", PENDING_ERROR]);
    refused_socket_state(
        "udp_cork",
        &["fd 4 (socket:[", "bytes wait in its send queue", "UDP_CORK"],
    );
}

/// `--leave-running` with established connections: repair mode is left
/// and the network lock thawed, so every connection goes on working in
/// the original, with its data and options (the program checks them).
#[test]
fn leave_running_keeps_tcp_connections_working() {
    require_root!();
    let mut c = Case::new("leave-running-tcp");
    let prog = c.compile("tests/conformance/sock_tcp_established_pair.c");
    let pid = c.start(&prog);
    let out = c.checkpoint(pid, &["--leave-running"]);
    assert!(out.status.success(), "checkpoint --leave-running failed: {}", stderr(&out));
    let images = c.images();
    let meta = c.ferry(&["inspect", "--json", images.to_str().expect("utf-8")]);
    let v: serde_json::Value = serde_json::from_slice(&meta.stdout).expect("inspect json");
    let lock = v["tree"]["network_lock"]["name"]
        .as_str()
        .expect("the image names its network lock")
        .to_string();
    let status = c.ferry(&["network-lock", "--status"]);
    assert!(
        !String::from_utf8_lossy(&status.stdout).contains(&lock),
        "lock {lock} not thawed after --leave-running"
    );
    assert_eq!(c.finish_child(0), 0, "connections broken after --leave-running: {}", c.log());
    assert!(c.log().contains("PASS"), "{}", c.log());
}

#[test]
fn leave_running_keeps_the_process_and_image_restores_later() {
    require_root!();
    let mut c = Case::new("leave-running");
    let prog = c.compile("tests/conformance/threads_8_writers.c");
    let pid = c.start(&prog);
    let out = c.checkpoint(pid, &["--leave-running"]);
    assert!(out.status.success(), "checkpoint --leave-running failed: {}", stderr(&out));
    // Probing a process we started.
    assert!(exists(pid), "process died despite --leave-running");

    // Its PID is still taken: restore must say so and create nothing.
    let images = c.images();
    let r = c.ferry(&["restore", "--images", images.to_str().expect("utf-8"), "--detach"]);
    assert!(!r.status.success());
    assert!(stderr(&r).contains(&format!("pid {pid} is taken")), "{}", stderr(&r));

    assert_eq!(c.finish_child(0), 0, "original failed after --leave-running: {}", c.log());
    // Now the image restores the process as it was at the checkpoint.
    fs::write(c.dir.join("program.log"), "").expect("truncate log");
    let code = c.restore_and_finish(pid, &images, &[]);
    assert_eq!(code, Some(0), "restored program failed: {}", c.log());
    assert!(c.log().contains("PASS"), "{}", c.log());
}

fn checkpointed_image(c: &mut Case) -> i32 {
    let prog = c.compile("tests/conformance/mem_anon_private.c");
    let pid = c.start(&prog);
    let out = c.checkpoint(pid, &[]);
    assert!(out.status.success(), "checkpoint failed: {}", stderr(&out));
    c.children[0].wait().expect("reap");
    pid
}

fn assert_restore_rejected(c: &Case, pid: i32, what: &str) {
    let images = c.images();
    let r = c.ferry(&["restore", "--images", images.to_str().expect("utf-8"), "--detach"]);
    assert!(!r.status.success(), "restore of a damaged image succeeded");
    assert!(stderr(&r).contains(what), "expected {what:?} in: {}", stderr(&r));
    assert!(!Path::new(&format!("/proc/{pid}")).exists(), "a damaged image left a process behind");
    let i = c.ferry(&["inspect", images.to_str().expect("utf-8")]);
    assert!(!i.status.success(), "inspect accepted a damaged image");
}

#[test]
fn corrupted_page_data_is_rejected_before_restore() {
    require_root!();
    let mut c = Case::new("corrupt-pages");
    let pid = checkpointed_image(&mut c);
    let pages = c.images().join("pages.img");
    let mut data = fs::read(&pages).expect("pages");
    let last = data.len() - 100;
    data[last] ^= 0xff;
    fs::write(&pages, data).expect("write");
    assert_restore_rejected(&c, pid, "checksum mismatch");
}

/// On tmpfs the checkpoint does not read pages.img back (the file is the
/// memory it copied into): the restore's own check must still refuse it.
#[test]
fn corrupted_page_data_on_tmpfs_is_rejected_before_restore() {
    require_root!();
    let mut c = Case::new("corrupt-pages-tmpfs").images_in_memory();
    let pid = checkpointed_image(&mut c);
    assert!(c.images().starts_with("/dev/shm"));
    let pages = c.images().join("pages.img");
    let mut data = fs::read(&pages).expect("pages");
    let middle = data.len() / 2;
    data[middle] ^= 0x01;
    fs::write(&pages, data).expect("write");
    assert_restore_rejected(&c, pid, "checksum mismatch");
}

#[test]
fn truncated_metadata_is_rejected_before_restore() {
    require_root!();
    let mut c = Case::new("truncated-meta");
    let pid = checkpointed_image(&mut c);
    let meta = c.images().join("meta.img");
    let data = fs::read(&meta).expect("meta");
    fs::write(&meta, &data[..data.len() / 2]).expect("write");
    assert_restore_rejected(&c, pid, "truncated");
}

#[test]
fn incremental_image_is_not_restored_without_its_parent() {
    require_root!();
    let mut c = Case::new("incremental");
    let pid = checkpointed_image(&mut c);
    // Make the image say that one page of the root process, which it does
    // not hold, is in a parent image.
    let image = ferry_image::ImageDir::new(c.images());
    let (inv, tree, none) = image.read_meta_full().expect("read the image");
    assert!(none.is_none(), "a checkpoint is not incremental");
    let root = &tree.processes[0];
    let in_a_run =
        |a: u64| root.page_runs.iter().any(|r| a >= r.start && a < r.start + r.pages * 4096);
    let page = root
        .vmas
        .iter()
        .flat_map(|v| (v.start..v.end).step_by(4096))
        .find(|&a| !in_a_run(a))
        .expect("a mapped page the image does not hold");
    let inc = ferry_image::Incremental {
        parent_id: 77,
        parent_pages: vec![ferry_image::ParentPages {
            pid: root.pid,
            ranges: vec![ferry_image::PageSpan::new(page, 1)],
        }],
    };
    image.write_meta_with(&inv, &tree, Some(&inc)).expect("write the incremental image");
    let images = c.images();
    let r = c.ferry(&["restore", "--images", images.to_str().expect("utf-8"), "--detach"]);
    if r.status.success() {
        // The process this test's restore made, detached.
        kill(pid, libc::SIGKILL);
    }
    assert!(!r.status.success(), "restore of an incremental image without its parent succeeded");
    assert!(
        stderr(&r).contains("image is incremental (parent id 77); restore needs its parent"),
        "{}",
        stderr(&r)
    );
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "an incremental image left a process behind"
    );
}

#[test]
fn bad_arguments_give_one_line_errors() {
    let c = Case::new("bad-args");
    let o = c.ferry(&[
        "checkpoint",
        "--pid",
        "999999999",
        "--images",
        c.dir.join("x").to_str().expect("utf-8"),
    ]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("no such process"), "{}", stderr(&o));
    let o = c.ferry(&["restore", "--images", "/nonexistent/ferry-image"]);
    assert!(!o.status.success());
    let e = stderr(&o);
    // Less a stale network lock of another test, which ferry reports.
    let e: String = e
        .lines()
        .filter(|l| !l.contains("released stale network lock"))
        .map(|l| format!("{l}\n"))
        .collect();
    assert!(
        e.starts_with("ferry: error:") && e.contains("meta.img") && e.trim().lines().count() == 1,
        "{e}"
    );
    let o = c.ferry(&["inspect", "/nonexistent/ferry-image"]);
    assert!(!o.status.success());
}

#[test]
fn image_travels_as_one_stream_and_restores() {
    require_root!();
    let mut c = Case::new("stream");
    let prog = c.compile("tests/conformance/threads_8_writers.c");
    let pid = c.start(&prog);
    let out = c.checkpoint(pid, &[]);
    assert!(out.status.success(), "checkpoint failed: {}", stderr(&out));
    c.children[0].wait().expect("reap");
    // ferry send DIR | ferry receive DIR2, through a real pipe.
    let received = c.dir.join("received");
    let mut send = Command::new(FERRY)
        .arg("send")
        .arg(c.images())
        .stdout(Stdio::piped())
        .spawn()
        .expect("send");
    let pipe = send.stdout.take().expect("pipe");
    let recv =
        Command::new(FERRY).arg("receive").arg(&received).stdin(pipe).output().expect("receive");
    assert!(send.wait().expect("send").success());
    assert!(recv.status.success(), "receive failed: {}", stderr(&recv));
    // A damaged stream is refused and leaves no image behind.
    let mut bytes = Command::new(FERRY).arg("send").arg(c.images()).output().expect("send").stdout;
    let last = bytes.len() - 10;
    bytes[last] ^= 0x55;
    let bad_dir = c.dir.join("bad");
    let mut bad = Command::new(FERRY)
        .arg("receive")
        .arg(&bad_dir)
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("receive");
    {
        use std::io::Write;
        let _ = bad.stdin.take().expect("stdin").write_all(&bytes);
    }
    let bad_out = bad.wait_with_output().expect("receive");
    assert!(!bad_out.status.success(), "a damaged stream was accepted");
    assert!(!bad_dir.join("meta.img").exists(), "a damaged stream left an image");

    fs::write(c.dir.join("program.log"), "").expect("truncate log");
    let code = c.restore_and_finish(pid, &received, &[]);
    assert_eq!(code, Some(0), "restored program failed: {}", c.log());
}

#[test]
fn stdout_piped_to_another_process_is_refused_or_replaced() {
    require_root!();
    let mut c = Case::new("external-stdio");
    let prog = c.compile("tests/conformance/mem_anon_private.c");
    let log = fs::File::create(c.dir.join("stderr.log")).expect("log");
    let mut cmd = Command::new(&prog);
    cmd.current_dir(&c.dir).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(log);
    ferry_testkit::own_session(&mut cmd);
    let mut child = cmd.spawn().expect("spawn");
    // The command holds the log's description until dropped: the test
    // must not share it with the program it checkpoints.
    drop(cmd);
    let pid = child.id() as i32;
    let mut pipe = child.stdout.take().expect("stdout pipe");
    c.children.push(child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::Read;
        let mut seen = Vec::new();
        let mut buf = [0u8; 256];
        while let Ok(n) = pipe.read(&mut buf) {
            if n == 0 {
                break;
            }
            seen.extend_from_slice(&buf[..n]);
            if seen.windows(5).any(|w| w == b"READY") {
                let _ = tx.send(());
            }
        }
        drop(pipe);
    });
    rx.recv_timeout(Duration::from_secs(10)).expect("program never printed READY on its pipe");

    let refused = c.checkpoint(pid, &[]);
    assert!(!refused.status.success(), "a stdout pipe to another process was captured silently");
    assert!(stderr(&refused).contains("fd 1 (pipe:"), "{}", stderr(&refused));

    let out = c.checkpoint(pid, &["--external-stdio"]);
    assert!(out.status.success(), "checkpoint --external-stdio failed: {}", stderr(&out));
    c.children[0].wait().expect("reap");
    let replacement = c.dir.join("stdout-after-restore");
    let images = c.images();
    let code =
        c.restore_and_finish(pid, &images, &["--tty-to", replacement.to_str().expect("utf-8")]);
    let written = fs::read_to_string(&replacement).unwrap_or_default();
    assert_eq!(code, Some(0), "restored program failed: {written}");
    assert!(written.contains("PASS"), "the restored stdout did not go to --tty-to: {written:?}");
}

#[test]
fn restore_into_a_named_network_namespace() {
    require_root!();
    let Some(ns) = NetNs::new("restore") else {
        eprintln!("skipped: `ip netns add` is not available");
        return;
    };
    let mut c = Case::new("netns");
    let prog = c.compile("tests/conformance/sock_tcp_listen.c");
    let pid = c.start(&prog);
    let out = c.checkpoint(pid, &[]);
    assert!(out.status.success(), "checkpoint failed: {}", stderr(&out));
    c.children[0].wait().expect("reap");
    fs::write(c.dir.join("program.log"), "").expect("truncate log");

    let images = c.images();
    let pidfile = c.dir.join("pid");
    let restore = Command::new(FERRY)
        .arg("restore")
        .arg("--images")
        .arg(&images)
        .arg("--pidfile")
        .arg(&pidfile)
        .args(["--netns", &ns.0])
        .spawn()
        .expect("spawn restore");
    c.children.push(restore);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !pidfile.exists() {
        assert!(Instant::now() < deadline, "restore into {} did not finish", ns.0);
        sleep(Duration::from_millis(5));
    }
    // The restored process lives in the namespace: its listener was bound
    // there (the program connects to it over the namespace's loopback).
    assert_eq!(
        inode(&format!("/proc/{pid}/ns/net")),
        inode(&format!("/run/netns/{}", ns.0)),
        "not in the namespace"
    );
    assert_ne!(inode(&format!("/proc/{pid}/ns/net")), inode("/proc/self/ns/net"));
    // Signalling the process we restored.
    kill(pid, libc::SIGUSR2);
    let code = c.children[1].wait().expect("wait restore").code();
    assert_eq!(code, Some(0), "restored program failed in the namespace: {}", c.log());
    assert!(c.log().contains("PASS"), "{}", c.log());

    // A namespace that does not exist is a clear error.
    let o = c.ferry(&[
        "restore",
        "--images",
        images.to_str().expect("utf-8"),
        "--netns",
        "ferry-no-such-netns",
        "--detach",
    ]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("network namespace /run/netns/ferry-no-such-netns"),
        "{}",
        stderr(&o)
    );
}

fn parent_of(pid: i32) -> Option<i32> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(") ")?.1.split_whitespace().nth(1)?.parse().ok()
}

/// `ferry restore` of `images` as a child of the test (index returned),
/// and the restored root's PID as the test sees it (from --pidfile).
fn spawn_restore(c: &mut Case, images: &Path, tag: &str, extra: &[&str]) -> (usize, i32) {
    let pidfile = c.dir.join(format!("pid-{tag}"));
    let restore = Command::new(FERRY)
        .arg("restore")
        .arg("--images")
        .arg(images)
        .arg("--pidfile")
        .arg(&pidfile)
        .args(extra)
        .stderr(fs::File::create(c.dir.join(format!("restore-{tag}.err"))).expect("stderr file"))
        .spawn()
        .expect("spawn restore");
    c.children.push(restore);
    let idx = c.children.len() - 1;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = fs::read_to_string(&pidfile).unwrap_or_default();
        if let Some(pid) = text.strip_suffix('\n').and_then(|t| t.parse::<i32>().ok()) {
            // The tree's init goes when the test ends, with the tree.
            if let Some(init) = parent_of(pid).filter(|&p| p != c.children[idx].id() as i32) {
                c.pids.push(init);
            }
            return (idx, pid);
        }
        if let Ok(Some(st)) = c.children[idx].try_wait() {
            panic!(
                "restore {tag} ended with {st}: {}",
                fs::read_to_string(c.dir.join(format!("restore-{tag}.err"))).unwrap_or_default()
            );
        }
        assert!(Instant::now() < deadline, "restore {tag} wrote no pidfile");
        sleep(Duration::from_millis(5));
    }
}

fn comm(pid: i32) -> String {
    fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default().trim().to_string()
}

#[test]
fn taken_pids_restore_into_a_new_pid_namespace() {
    require_root!();
    let mut c = Case::new("new-pid-ns");
    let prog = c.compile("tests/conformance/tree_basic.c");
    let pid = c.start(&prog);
    let out = c.checkpoint(pid, &["--leave-running"]);
    assert!(out.status.success(), "checkpoint failed: {}", stderr(&out));
    let images = c.images();
    let images_s = images.to_str().expect("utf-8");

    // The original still runs, so its PIDs are taken.
    let r = c.ferry(&["restore", "--images", images_s, "--detach"]);
    assert!(stderr(&r).contains(&format!("pid {pid} is taken")), "{}", stderr(&r));

    // Two copies at once, each in its own namespace under its old PIDs.
    let (a_idx, a) = spawn_restore(&mut c, &images, "a", &["--new-pid-ns"]);
    let (b_idx, b) = spawn_restore(&mut c, &images, "b", &["--new-pid-ns"]);
    for host in [a, b] {
        assert_ne!(host, pid);
        assert_eq!(
            innermost_pid(host),
            Some(pid),
            "root {host} does not have its old PID inside its namespace"
        );
        let init = parent_of(host).expect("root has a parent");
        assert_eq!(comm(init), "ferry-init");
        assert_eq!(innermost_pid(init), Some(1), "ferry-init is not PID 1 of the namespace");
    }

    // A tree in its own namespace is checkpointed with the PIDs it sees,
    // and comes back in a new namespace without being asked.
    let images2 = c.dir.join("images2");
    let out = c.ferry(&[
        "checkpoint",
        "--pid",
        &a.to_string(),
        "--images",
        images2.to_str().expect("utf-8"),
    ]);
    assert!(
        out.status.success(),
        "checkpoint of the tree in its namespace failed: {}",
        stderr(&out)
    );
    assert_eq!(
        c.children[a_idx].wait().expect("wait").code(),
        Some(128 + libc::SIGKILL),
        "init did not report the killed root"
    );
    let inspect = c.ferry(&["inspect", images2.to_str().expect("utf-8")]);
    assert!(
        String::from_utf8_lossy(&inspect.stdout).contains("own PID namespace"),
        "{}",
        String::from_utf8_lossy(&inspect.stdout)
    );
    let (c_idx, again) = spawn_restore(&mut c, &images2, "c", &[]);
    assert_eq!(innermost_pid(again), Some(pid));
    let init_c = parent_of(again).expect("parent");
    assert_eq!(comm(init_c), "ferry-init");

    // Each copy checks its ids (and /proc/self) and exits 0; ferry restore
    // exits with the root's status, through the namespace's init.
    for (idx, host) in [(b_idx, b), (c_idx, again)] {
        // Signalling a process this test restored.
        kill(host, libc::SIGUSR2);
        let code = c.children[idx].wait().expect("wait restore").code();
        assert_eq!(code, Some(0), "restored copy failed its checks: {}", c.log());
    }
    assert_eq!(c.finish_child(0), 0, "the original failed: {}", c.log());
    // Every namespace's init went with its tree (ferry restore reaped it).
    for &init in &c.pids {
        assert_ne!(comm(init), "ferry-init", "ferry-init {init} outlived its tree");
    }
}

#[test]
fn refuses_a_seccomp_user_notification_filter_and_leaves_it_confined() {
    assert_refused(
        "tests/guarantees/seccomp_user_notif.c",
        &["seccomp filters of thread", "SECCOMP_RET_USER_NOTIF"],
    );
}

#[test]
fn refuses_an_fd_owned_by_a_process_outside_the_tree() {
    assert_refused(
        "tests/guarantees/fd_owner_outside.c",
        &["fd 3", "F_SETOWN owner", "outside the checkpointed tree"],
    );
}

#[test]
fn refuses_a_unix_socket_with_passsec_and_leaves_it_running() {
    assert_refused("tests/guarantees/unix_passsec.c", &["fd 3", "SO_PASSSEC", "queued"]);
    assert_refused_args(
        "tests/guarantees/unix_passsec.c",
        &["pidfd"],
        &["fd 3", "SO_PASSPIDFD", "queued"],
    );
}

#[test]
fn refuses_threads_with_different_credentials() {
    assert_refused(
        "tests/guarantees/thread_creds_differ.c",
        &["thread", "Uid", "per-thread credentials"],
    );
}

/// Images are private (0700 directory, 0600 files) and restore refuses an
/// image a non-root user could have changed, naming the file and why.
#[test]
fn images_are_private_and_writable_images_are_refused() {
    require_root!();
    use std::os::unix::fs::PermissionsExt;
    let mut c = Case::new("image-perms");
    let pid = checkpointed_image(&mut c);
    let images = c.images();
    let mode = |p: &Path| fs::metadata(p).expect("stat").permissions().mode() & 0o7777;
    assert_eq!(mode(&images), 0o700, "image directory mode");
    assert_eq!(mode(&images.join("meta.img")), 0o600, "meta.img mode");
    assert_eq!(mode(&images.join("pages.img")), 0o600, "pages.img mode");
    let set =
        |p: &Path, m: u32| fs::set_permissions(p, fs::Permissions::from_mode(m)).expect("chmod");
    let refused = |what: &str| {
        let r = c.ferry(&["restore", "--images", images.to_str().expect("utf-8"), "--detach"]);
        let e = stderr(&r);
        assert!(!r.status.success(), "restore of an unsafe image succeeded");
        assert!(
            e.contains(what) && e.trim().lines().count() == 1,
            "expected {what:?} in one line: {e}"
        );
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists() || comm(pid) != "mem_anon_private",
            "an unsafe image was restored"
        );
    };
    set(&images, 0o777);
    refused("image directory");
    set(&images, 0o700);
    set(&images.join("pages.img"), 0o620);
    refused("pages.img");
    set(&images.join("pages.img"), 0o600);
    std::os::unix::fs::chown(images.join("meta.img"), Some(65534), None).expect("chown");
    refused("owned by uid 65534");
    std::os::unix::fs::chown(images.join("meta.img"), Some(0), None).expect("chown");
    // Private again: it restores.
    let code = c.restore_and_finish(pid, &images, &[]);
    assert_eq!(code, Some(0), "restored program failed: {}", c.log());
}

/// tests/guarantees/refusals.c in one of its modes.
fn refused_mode(mode: &str, what: &[&str]) {
    assert_refused_args("tests/guarantees/refusals.c", &[mode], what);
}

#[test]
fn refuses_mlockall_future() {
    refused_mode("mlockall", &["memory locking", "MCL_FUTURE"]);
}

#[test]
fn refuses_sched_deadline() {
    refused_mode("sched_deadline", &["scheduling", "SCHED_DEADLINE", "period 100000000 ns"]);
}

/// A tree whose processes are in two UTS namespaces: restore makes one.
#[test]
fn refuses_another_uts_namespace() {
    refused_mode("uts", &["the UTS namespace", "is in another UTS namespace than the root"]);
}

/// A child taken alone from a UTS namespace its parent (outside the
/// tree) is in too: a restore would give it a namespace of its own.
#[test]
fn refuses_a_uts_namespace_shared_with_a_process_outside_the_tree() {
    let log = refuses_a_child_of(
        "tests/guarantees/shared_counter.c",
        &["uts"],
        &["--parent-sees-exit"],
        &["the UTS namespace", "outside the tree, is in it too"],
    );
    assert!(log.contains("child still running"), "{log}");
}

#[test]
fn refuses_a_faulting_time_stamp_counter() {
    refused_mode("tsc", &["PR_SET_TSC"]);
}

/// A pty slave whose master was closed (hung up): nothing can make one.
#[test]
fn refuses_a_pty_slave_whose_master_was_closed() {
    refused_mode("pty_slave_alone", &["fd 4 (/dev/pts/", "pty slave whose master was closed"]);
}

#[test]
fn refuses_a_pty_master_whose_slave_the_tree_does_not_hold() {
    refused_mode(
        "pty_master_alone",
        &["fd 3 (/dev/ptmx)", "the master of pty", "no process of the tree holds"],
    );
}

#[test]
fn refuses_a_proc_file_of_a_process_outside_the_tree() {
    refused_mode("proc_outside", &["fd 3", "/proc file of process", "outside the tree"]);
}

#[test]
fn refuses_shared_fs_information_without_clone_thread() {
    refused_mode("clone_fs", &["working directory, root and umask", "CLONE_FS"]);
}

#[test]
fn refuses_a_unix_pair_made_by_a_process_that_exited() {
    refused_mode(
        "unix_peer_exited",
        &["fd 3", "SO_PEERCRED names pid", "not a process of the tree"],
    );
}

#[test]
fn refuses_a_pending_unix_connection_with_data_sent_before_accept() {
    refused_mode("unix_pending", &["fd 4", "accept queue", "data was sent before accept"]);
}

/// A grandchild that shares the root's fd table through a child that
/// unshared its own since: no order of forks with CLONE_FILES gives the
/// two one table again.
#[test]
fn refuses_an_fd_table_shared_past_a_process_that_unshared_it() {
    refused_mode(
        "clone_files_gap",
        &["its fd table", "CLONE_FILES without CLONE_THREAD", "not through a line of parents"],
    );
}

/// An inotify watch on a deleted file that only a mapping keeps: no fd
/// of the tree names the file the watch would go on at restore.
#[test]
fn refuses_an_inotify_watch_on_a_deleted_file_no_fd_holds() {
    refused_mode(
        "inotify_deleted_mapped",
        &["fd 3", "watch 1", "mapped (deleted)", "no fd of the tree holds"],
    );
}

/// A zombie whose wait status says it dumped core: the restored one
/// would die without dumping, so the parent would read another status.
/// Skipped when core_pattern hands cores to a program (whether it dumps
/// is up to that program).
#[test]
fn refuses_a_zombie_that_dumped_core() {
    let pattern = fs::read_to_string("/proc/sys/kernel/core_pattern").unwrap_or_default();
    if pattern.starts_with('|') {
        eprintln!("skipped: core_pattern is a pipe ({})", pattern.trim());
        return;
    }
    refused_mode("zombie_core", &["zombie child", "core dump", "WCOREDUMP"]);
}

/// A descriptor in flight that no process of the tree holds any more
/// (the sender closed it after sendmsg) is restored when it is a regular
/// file, a directory, a device or an eventfd (conformance
/// sock_unix_scm_orphan); a pipe end, as here, is refused by name.
#[test]
fn refuses_scm_rights_in_flight() {
    refused_mode("scm_rights", &["fd 4", "pipe:[", "held by no process of the tree"]);
}

/// An MFD_HUGETLB memfd is hugetlb memory, named as such (it was taken
/// for an ordinary memfd and failed later with an unrelated error).
#[test]
fn refuses_a_hugetlb_memfd_by_name() {
    refused_mode("memfd_hugetlb", &["/memfd:ferry-huge", "MFD_HUGETLB memfd", "VmFlags ht"]);
}

#[test]
fn refuses_a_hugetlb_sysv_segment_by_name() {
    refused_mode("shm_hugetlb", &["/SYSV", "SHM_HUGETLB SysV segment"]);
}

/// memfd_secret memory: no one else can read it (it used to fail in
/// /proc/PID/map_files with ENXIO).
#[test]
fn refuses_secret_memory_by_name() {
    refused_mode("memfd_secret", &["/secretmem (deleted)", "memfd_secret memory"]);
}

/// Guard pages show in no mapping flag; PAGEMAP_SCAN finds them.
#[test]
fn refuses_guard_pages_by_name() {
    refused_mode("guard", &["guard pages at", "MADV_GUARD_INSTALL"]);
}

/// The ring of an io_setup context (it used to be taken for a deleted
/// file and fail with "Illegal seek").
#[test]
fn refuses_an_aio_ring_by_name() {
    refused_mode("aio", &["/[aio] (deleted)", "AIO context (io_setup)"]);
}

/// An io_uring with no fd and no mapping of its own
/// (IORING_SETUP_NO_MMAP | IORING_SETUP_REGISTERED_FD_ONLY), set up by
/// the main thread or by another one (the registered-ring table is per
/// thread), with a read pending on it: named by its thread and slot.
#[test]
fn refuses_an_io_uring_registered_without_an_fd() {
    let src = "tests/guarantees/io_uring_no_fd.c";
    assert_refused_args(src, &["main"], &["a registered io_uring ring (slot 0)"]);
    assert_refused_args(src, &["thread"], &["thread ", "a registered io_uring ring (slot 0)"]);
}

/// An ordinary io_uring (an fd and its mappings) with a read pending.
#[test]
fn refuses_an_io_uring_with_an_fd() {
    let src = "tests/guarantees/io_uring_no_fd.c";
    assert_refused_args(src, &["fd"], &["anon_inode:[io_uring]"]);
}

/// A main thread that exited with pthread_exit while another thread
/// runs is named (it failed as "is it traced by someone else?").
#[test]
fn refuses_a_process_whose_main_thread_exited() {
    refused_mode("main_exited", &["its main thread", "pthread_exit", "1 other thread(s) run"]);
}

/// `restore --detach` of a root with a parent-death signal: ferry, its
/// parent, exits, and the signal would fire (the old code restored it,
/// and SIGUSR1 then killed it). Refused before anything is made; the
/// image restores without --detach.
#[test]
fn restore_detach_refuses_a_parent_death_signal() {
    require_root!();
    let mut c = Case::new("pdeathsig_detach");
    let prog = c.compile("tests/guarantees/refusals.c");
    let pid = c.start_args(&prog, &["pdeathsig"]);
    let out = c.checkpoint(pid, &[]);
    assert!(out.status.success(), "checkpoint: {}", stderr(&out));
    assert_eq!(c.finish_child(0), -1, "the checkpointed program was not killed");
    let images = c.images();
    let out = c.ferry(&["restore", "--images", &images.to_string_lossy(), "--detach"]);
    let err = stderr(&out);
    assert!(!out.status.success(), "restore --detach should have been refused");
    for w in ["parent-death signal (10)", "without --detach"] {
        assert!(err.contains(w), "refusal should mention {w:?}: {err}");
    }
    assert!(fs::read_dir("/proc").is_ok_and(|_| !Path::new(&format!("/proc/{pid}")).exists()));
    let code = c.restore_and_finish(pid, &images, &[]);
    assert_eq!(code, Some(0), "restored program failed: {}", c.log());
}

/// An I/O priority (ioprio_set) is refused by name, the main thread's
/// and another thread's: a restored thread would get ferry's.
/// An autogroup nice value comes back only with the session leader whose
/// setsid made the autogroup; a child taken without it is refused.
#[test]
fn refuses_an_autogroup_nice_value_without_its_session_leader() {
    refuses_a_child_of(
        "tests/guarantees/refusals.c",
        &["autogroup_child"],
        &["--parent-sees-exit"],
        &["its autogroup", "nice value", "is 5", "session's leader", "is not in the tree"],
    );
}

/// A loginuid that differs from ferry's can be written, but the kernel
/// gives a written loginuid an audit session of its own numbering.
#[test]
fn refuses_a_loginuid_whose_audit_session_cannot_come_back() {
    refused_mode(
        "loginuid",
        &["its loginuid and audit session", "loginuid 4242 in audit session", "ferry's loginuid"],
    );
}

/// Cgroups made for one test under the hierarchies mounted here; removed
/// on drop (their processes moved back to the hierarchy's root first).
struct TestCgroups {
    made: Vec<(PathBuf, PathBuf)>,
}

impl TestCgroups {
    /// The mounted hierarchies this test can use: (what, mount point) for
    /// the v1 memory and pids hierarchies and the v2 one.
    fn hierarchies() -> Vec<(&'static str, PathBuf)> {
        let info = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let mut out = Vec::new();
        for line in info.lines() {
            let Some((left, right)) = line.split_once(" - ") else {
                continue;
            };
            let l: Vec<&str> = left.split(' ').collect();
            let r: Vec<&str> = right.split(' ').collect();
            if l.len() < 5 || r.len() < 3 || l[3] != "/" {
                continue;
            }
            let what = match (
                r[0],
                r[2].split(',').any(|o| o == "memory"),
                r[2].split(',').any(|o| o == "pids"),
            ) {
                ("cgroup2", _, _) => "cgroup2",
                ("cgroup", true, _) => "memory",
                ("cgroup", _, true) => "pids",
                _ => continue,
            };
            if !out.iter().any(|(w, _)| *w == what) {
                out.push((what, PathBuf::from(l[4])));
            }
        }
        out
    }

    fn new() -> TestCgroups {
        TestCgroups { made: Vec::new() }
    }

    /// A new cgroup under the hierarchy mounted at `root`.
    fn make(&mut self, root: &Path) -> PathBuf {
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = root.join(format!(
            "ferry-guarantee-cg-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        fs::create_dir(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
        self.made.push((dir.clone(), root.to_path_buf()));
        dir
    }
}

impl Drop for TestCgroups {
    fn drop(&mut self) {
        for (dir, root) in self.made.iter().rev() {
            for pid in fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default().lines() {
                let _ = fs::write(root.join("cgroup.procs"), pid);
            }
            let _ = fs::remove_dir(dir);
        }
    }
}

/// A process in cgroups other than ferry's (v1 memory and pids, and v2,
/// as far as they are mounted) comes back in the same cgroups, with its
/// memory charged to its own memory cgroup.
#[test]
fn cgroup_membership_is_restored() {
    require_root!();
    let hierarchies = TestCgroups::hierarchies();
    if hierarchies.is_empty() {
        eprintln!("skipped: no cgroup hierarchy mounted");
        return;
    }
    let mut cgroups = TestCgroups::new();
    let dirs: Vec<(&str, PathBuf)> =
        hierarchies.iter().map(|(what, root)| (*what, cgroups.make(root))).collect();
    let memory = dirs
        .iter()
        .find(|(w, d)| *w == "memory" || (*w == "cgroup2" && d.join("memory.current").exists()))
        .map(|(_, d)| d.to_string_lossy().into_owned())
        .unwrap_or_else(|| "-".into());
    let mut args = vec![memory, "-".to_string()];
    args.extend(dirs.iter().map(|(_, d)| d.to_string_lossy().into_owned()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut c = Case::new("cgroup");
    let prog = c.compile("tests/guarantees/cgroup_member.c");
    let pid = c.start_args(&prog, &args);
    let out = c.checkpoint(pid, &[]);
    assert!(out.status.success(), "checkpoint: {}", stderr(&out));
    assert_eq!(c.finish_child(0), -1, "the checkpointed program was not killed");
    let images = c.images();
    assert_eq!(
        c.restore_and_finish(pid, &images, &[]),
        Some(0),
        "restored program failed: {}",
        c.log()
    );
    assert!(c.log().contains("PASS"), "{}", c.log());
}

/// Restore into a cgroup that no longer exists is refused, naming it; no
/// process is left.
#[test]
fn restore_refuses_a_cgroup_that_does_not_exist() {
    require_root!();
    let Some((_, root)) =
        TestCgroups::hierarchies().into_iter().find(|(w, _)| *w == "pids" || *w == "cgroup2")
    else {
        eprintln!("skipped: no pids or cgroup2 hierarchy mounted");
        return;
    };
    let mut cgroups = TestCgroups::new();
    let dir = cgroups.make(&root);
    let mut c = Case::new("cgroup-gone");
    let prog = c.compile("tests/guarantees/cgroup_member.c");
    let pid = c.start_args(&prog, &["-", "-", dir.to_str().expect("utf-8 path")]);
    let out = c.checkpoint(pid, &[]);
    assert!(out.status.success(), "checkpoint: {}", stderr(&out));
    c.finish_child(0);
    fs::remove_dir(&dir).expect("remove the emptied cgroup");
    let out = c.ferry(&["restore", "--images", c.images().to_str().expect("utf-8 path")]);
    let err = stderr(&out);
    assert!(!out.status.success(), "restore into a missing cgroup should fail");
    let name = dir.file_name().and_then(|n| n.to_str()).expect("name");
    assert!(err.contains(name) && err.contains("does not exist on this host"), "{err}");
    assert_eq!(refusal_lines(&err), 1, "{err}");
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "the failed restore left pid {pid} behind"
    );
}

/// A thread moved alone into a v1 cgroup is refused by name at
/// checkpoint; the process runs on unharmed.
#[test]
fn refuses_a_thread_in_a_cgroup_of_its_own() {
    require_root!();
    let Some((_, root)) =
        TestCgroups::hierarchies().into_iter().find(|(w, _)| *w == "pids" || *w == "memory")
    else {
        eprintln!("skipped: no cgroup v1 hierarchy mounted");
        return;
    };
    let mut cgroups = TestCgroups::new();
    let dir = cgroups.make(&root);
    let mut c = Case::new("cgroup-thread");
    let prog = c.compile("tests/guarantees/cgroup_member.c");
    let pid = c.start_args(&prog, &["-", dir.to_str().expect("utf-8 path")]);
    let out = c.checkpoint(pid, &[]);
    let err = stderr(&out);
    assert!(!out.status.success(), "checkpoint of a thread in its own cgroup should be refused");
    let name = dir.file_name().and_then(|n| n.to_str()).expect("name");
    assert!(
        err.contains("cgroup membership") && err.contains("thread") && err.contains(name),
        "{err}"
    );
    assert_eq!(refusal_lines(&err), 1, "{err}");
    assert!(!c.images().join("meta.img").exists(), "a refused checkpoint left an image");
    assert_eq!(c.finish_child(0), 0, "program was harmed by the refused checkpoint: {}", c.log());
}

/// A unix socket whose peer was closed is restored (conformance
/// sock_unix_peer_closed), except when the closed peer's name is held by
/// another socket now: restore would need it for the peer's stand-in.
#[test]
fn refuses_a_unix_socket_whose_closed_peers_name_is_taken() {
    refused_mode(
        "unix_dead_peer_name_taken",
        &["fd 4", "@ferry-deadname-", "was closed", "now holds that name"],
    );
}

/// Nor when the closed peer left descriptors in flight in its queue.
#[test]
fn refuses_a_unix_socket_whose_closed_peer_left_descriptors_in_flight() {
    refused_mode("unix_dead_peer_in_flight", &["fd 3", "peer was closed", "in flight"]);
}

/// zdtm deleted_unix_sock: binding it again at restore would make the
/// unlinked socket file reappear.
#[test]
fn refuses_a_unix_listener_whose_file_was_unlinked() {
    refused_mode("unix_unlinked", &["fd 3", "gone.sock", "no longer names this socket"]);
}

/// zdtm del_standalone_un: two listeners bound to one path, the path names
/// the first; binding both again would give it to whichever came last.
#[test]
fn refuses_a_unix_listener_whose_file_was_replaced() {
    refused_mode("unix_replaced", &["fd 4", "b.sock", "no longer names this socket"]);
}

/// The restore checks itself before the tree runs: a socket option that
/// restore failed to set (made so with the fault hook
/// `FERRY_FAULT_SKIP_SOCKET_OPTION`, standing for any restore bug that
/// loses state) fails the restore naming the option, the restored copy
/// is ended, the image is left as it was, and a restore without the
/// fault then gives the program every option back.
#[test]
fn the_restores_own_check_catches_a_lost_socket_option() {
    let option = format!("{}/{}", libc::SOL_SOCKET, libc::SO_PRIORITY);
    a_restore_with_a_fault_is_stopped_by_its_check(
        "restore-check",
        "tests/conformance/sock_opts_unbound.c",
        ("FERRY_FAULT_SKIP_SOCKET_OPTION", &option),
        &["SO_PRIORITY", "is 0 after restore, the image has 3"],
    );
}

/// The same for a mapping flag (`FERRY_FAULT_SKIP_MADVISE`): MADV_DONTDUMP
/// left out, VmFlags `dd` missing.
#[test]
fn the_restores_own_check_catches_a_lost_mapping_flag() {
    a_restore_with_a_fault_is_stopped_by_its_check(
        "restore-check-vmflags",
        "tests/conformance/mem_madvise_flags.c",
        ("FERRY_FAULT_SKIP_MADVISE", &libc::MADV_DONTDUMP.to_string()),
        &["VmFlags", "dd"],
    );
}

/// The same for the address space: the root's mappings copied from
/// ferry by the fork are listed once, before the scratch mapping is made,
/// and cleared from that list; one of them left in place
/// (`FERRY_FAULT_KEEP_FORKED_MAPPING`, standing for a stale list) fails the
/// restore naming the mappings.
#[test]
fn the_restores_own_check_catches_a_mapping_left_from_the_fork() {
    a_restore_with_a_fault_is_stopped_by_its_check(
        "restore-check-forked-mapping",
        "tests/conformance/mem_madvise_flags.c",
        ("FERRY_FAULT_KEEP_FORKED_MAPPING", "1"),
        &["mappings", "the first differing mapping"],
    );
}

/// Checkpoints `program`, restores it with the fault `env` (the restore
/// returns at once: `--detach`), and requires the check's failure naming
/// `wants`, the copy ended and the image unchanged; then a restore
/// without the fault must give the program all its state back.
fn a_restore_with_a_fault_is_stopped_by_its_check(
    name: &str,
    program: &str,
    env: (&str, &str),
    wants: &[&str],
) {
    require_root!();
    let mut c = Case::new(name);
    let prog = c.compile(program);
    let pid = c.start(&prog);
    let out = c.checkpoint(pid, &[]);
    assert!(out.status.success(), "checkpoint: {}", stderr(&out));
    let _ = c.children[0].wait();
    let images = c.images();
    let meta_before = fs::read(images.join("meta.img")).expect("meta.img");
    let restore = Command::new(FERRY)
        .args(["restore", "--detach", "--images"])
        .arg(&images)
        .env(env.0, env.1)
        .output()
        .expect("run ferry restore");
    let err = stderr(&restore);
    if restore.status.success() {
        ferry_testkit::kill_and_reap(pid);
        panic!("a restore with {}={} succeeded", env.0, env.1);
    }
    let common = ["the restore's check found a difference", "the image is unchanged"];
    for want in common.iter().chain(wants) {
        assert!(err.contains(want), "the failure should say {want:?}: {err}");
    }
    assert!(!exists(pid), "the restored copy of pid {pid} still runs after the failed check");
    assert_eq!(fs::read(images.join("meta.img")).expect("meta.img"), meta_before, "image changed");
    assert_eq!(
        c.restore_and_finish(pid, &images, &[]),
        Some(0),
        "restore without the fault: {}",
        c.log()
    );
    assert!(c.log().contains("PASS"), "{}", c.log());
}

/// The same for a unix socket's option (format 4.8): SO_MARK left unset
/// on the stream end of tests/conformance/sock_unix_opts.c (fd 3, mark
/// 0x100) fails the restore naming it; the image restores afterwards.
#[test]
fn the_restores_own_check_catches_a_lost_unix_socket_option() {
    require_root!();
    let mut c = Case::new("restore-check-unix");
    let prog = c.compile("tests/conformance/sock_unix_opts.c");
    let pid = c.start(&prog);
    let out = c.checkpoint(pid, &[]);
    assert!(out.status.success(), "checkpoint: {}", stderr(&out));
    let _ = c.children[0].wait();
    let images = c.images();
    let restore = Command::new(FERRY)
        .args(["restore", "--images"])
        .arg(&images)
        .env("FERRY_FAULT_SKIP_SOCKET_OPTION", format!("{}/{}", libc::SOL_SOCKET, libc::SO_MARK))
        .output()
        .expect("run ferry restore");
    let err = stderr(&restore);
    assert!(!restore.status.success(), "a restore that lost SO_MARK succeeded");
    for want in ["fd 3 (unix socket)", "SO_MARK", "is 0 after restore, the image has 256"] {
        assert!(err.contains(want), "the failure should say {want:?}: {err}");
    }
    assert!(!exists(pid), "the restored copy of pid {pid} still runs after the failed check");
    assert_eq!(c.restore_and_finish(pid, &images, &[]), Some(0), "{}", c.log());
    assert!(c.log().contains("PASS"), "{}", c.log());
}

/// PIDs of processes whose command line names `needle` (an image
/// directory or program path unique to one case): the trial's helper is a
/// fork of `ferry checkpoint` and carries its command line.
fn processes_naming(needle: &str) -> Vec<i32> {
    let Ok(dir) = fs::read_dir("/proc") else { return Vec::new() };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let cmdline = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            String::from_utf8_lossy(&cmdline).contains(needle)
        })
        .collect()
}

/// `checkpoint --verify` (the default) restores the image in a trial
/// before the tree is killed and says so; the trial leaves nothing behind
/// (no copy of the program, no helper), and the image then restores for
/// real, TCP connection and all (the trial did not take the network lock).
#[test]
fn a_checkpoint_verifies_its_image_by_a_trial_restore() {
    require_root!();
    let mut c = Case::new("trial-ok");
    let prog = c.compile("tests/conformance/sock_tcp_established_pair.c");
    let pid = c.start(&prog);
    let out = c.checkpoint(pid, &[]);
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "checkpoint: {}", stderr(&out));
    assert!(said.contains("tree killed; verified by a trial restore"), "{said}");
    let _ = c.children[0].wait();
    let images = c.images();
    let prog_s = prog.to_str().expect("utf-8 path");
    assert_eq!(processes_naming(prog_s), Vec::<i32>::new(), "a copy of the program is left");
    let images_s = images.to_str().expect("utf-8 path").to_string();
    assert_eq!(processes_naming(&images_s), Vec::<i32>::new(), "the trial's helper is left");
    assert_eq!(c.restore_and_finish(pid, &images, &[]), Some(0), "restore: {}", c.log());
    assert!(c.log().contains("PASS"), "{}", c.log());
}

/// A trial restore that fails (a lost socket option,
/// `FERRY_FAULT_SKIP_SOCKET_OPTION`, standing for any restore bug) fails
/// the checkpoint with the restore check's own message: the tree runs on
/// and checks out whole, the image stays, and no process of the trial is
/// left (its namespaces went with them).
#[test]
fn a_checkpoint_whose_trial_restore_fails_leaves_the_tree_running() {
    require_root!();
    let mut c = Case::new("trial-fails");
    let prog = c.compile("tests/conformance/sock_opts_unbound.c");
    let pid = c.start(&prog);
    let images = c.images();
    let images_s = images.to_str().expect("utf-8 path").to_string();
    let out = Command::new(FERRY)
        .args(["checkpoint", "--pid", &pid.to_string(), "--images", &images_s])
        .env(
            "FERRY_FAULT_SKIP_SOCKET_OPTION",
            format!("{}/{}", libc::SOL_SOCKET, libc::SO_PRIORITY),
        )
        .output()
        .expect("run ferry checkpoint");
    let all = stderr(&out);
    assert!(!out.status.success(), "a checkpoint whose trial lost SO_PRIORITY succeeded");
    let err = all.lines().find(|l| l.starts_with("ferry: error:")).unwrap_or_default();
    for want in [
        "the trial restore of the image failed, so the tree runs on and the image stays in",
        "SO_PRIORITY",
        "is 0 after restore, the image has 3",
    ] {
        assert!(err.contains(want), "the error line should say {want:?}: {all}");
    }
    assert!(images.join("meta.img").exists(), "the image was removed");
    // Running or waiting for its signal, not frozen or traced any more.
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let state = stat.rsplit(')').next().and_then(|s| s.split_whitespace().next());
    assert!(matches!(state, Some("R" | "S")), "pid {pid} is in state {state:?}");
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    assert!(status.lines().any(|l| l == "TracerPid:\t0"), "pid {pid} is still traced: {status}");
    let prog_s = prog.to_str().expect("utf-8 path");
    assert_eq!(processes_naming(prog_s), vec![pid], "a copy of the program is left");
    assert_eq!(processes_naming(&images_s), Vec::<i32>::new(), "the trial's helper is left");
    assert_eq!(c.finish_child(0), 0, "the tree after the failed trial: {}", c.log());
    assert!(c.log().contains("PASS"), "{}", c.log());
}

/// `ferry checkpoint` forks the trial's helper as it starts; killed
/// right after, ferry leaves no helper behind: the helper reads the end
/// of its pipe and exits.
#[test]
fn a_checkpoint_killed_as_it_starts_leaves_no_trial_helper() {
    require_root!();
    let mut c = Case::new("trial-ahead-killed");
    let prog = c.compile("tests/conformance/sock_tcp_established_pair.c");
    let pid = c.start(&prog);
    let images = c.images();
    let images_s = images.to_str().expect("utf-8 path").to_string();
    let mut ferry = Command::new(FERRY)
        .args(["checkpoint", "--pid", &pid.to_string(), "--images", &images_s])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("run ferry checkpoint");
    // Its helper forked (the first thing the command does), the capture
    // not yet far.
    let until = std::time::Instant::now() + std::time::Duration::from_secs(2);
    while processes_naming(&images_s).len() < 2 && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
    let _ = ferry.kill();
    let _ = ferry.wait();
    let until = std::time::Instant::now() + std::time::Duration::from_secs(3);
    while !processes_naming(&images_s).is_empty() && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(processes_naming(&images_s), Vec::<i32>::new(), "the trial's helper is left");
}

/// A unix socket bound to a file would be bound again by the trial (its
/// socket file removed first): the checkpoint goes on without a trial and
/// says why, naming the socket.
#[test]
fn a_tree_with_a_unix_socket_file_is_checkpointed_without_a_trial() {
    require_root!();
    let mut c = Case::new("trial-skipped");
    let prog = c.compile("tests/conformance/sock_unix_listen.c");
    let pid = c.start(&prog);
    let out = c.checkpoint(pid, &[]);
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "checkpoint: {}", stderr(&out));
    assert!(
        said.contains(&format!(
            "not verified: no trial restore for pid {pid}: unix socket bound to"
        )),
        "{said}"
    );
    let _ = c.children[0].wait();
    let images = c.images();
    // The trial's helper, forked as the command started, is not left.
    let images_s = images.to_str().expect("utf-8 path").to_string();
    assert_eq!(processes_naming(&images_s), Vec::<i32>::new(), "the trial's helper is left");
    assert_eq!(c.restore_and_finish(pid, &images, &[]), Some(0), "restore: {}", c.log());
}

/// A socket option, or state only sock_diag or /proc shows, that ferry
/// does not restore: refused by name before the freeze (the socket, its
/// address and the option), the program runs on with it.
fn assert_sockopt_refused(mode: &str, what: &[&str]) {
    let mut all = vec!["fd 3", "checked before the freeze"];
    all.extend_from_slice(what);
    assert_refused_args("tests/guarantees/sockopt_refused.c", &[mode], &all);
}

#[test]
fn refuses_a_socket_filter_and_leaves_it_running() {
    assert_sockopt_refused("filter", &["SO_ATTACH_FILTER", "0.0.0.0:0"]);
}

#[test]
fn refuses_tcp_md5_keys_and_save_syn_and_leaves_them_running() {
    assert_sockopt_refused("md5", &["TCP_MD5SIG", "127.0.0.1:"]);
    assert_sockopt_refused("savesyn", &["TCP_SAVE_SYN"]);
}

#[test]
fn refuses_a_multicast_membership_and_leaves_it_running() {
    assert_sockopt_refused("multicast", &["multicast group 239.7.7.7", "IP_ADD_MEMBERSHIP"]);
}

#[test]
fn refuses_unix_socket_options_and_leaves_them_running() {
    assert_sockopt_refused("unixnew", &["SO_TIMESTAMP_NEW"]);
}

/// Options of TCP and UDP sockets ferry does not restore, one program
/// mode each (tests/guarantees/sockopt_refused.c).
#[test]
fn refuses_ip_and_tcp_socket_options_and_leaves_them_running() {
    for (mode, option) in [
        ("ipopts", "IP_OPTIONS"),
        ("tfo_connect", "TCP_FASTOPEN_CONNECT"),
        ("tfo_nocookie", "TCP_FASTOPEN_NO_COOKIE"),
        ("tfo_key", "TCP_FASTOPEN_KEY"),
        ("txrehash", "SO_TXREHASH"),
        ("tcp_peekoff", "SO_PEEK_OFF"),
    ] {
        assert_sockopt_refused(mode, &[option]);
    }
}

/// tests/guarantees/fd_refusals.c in one of its modes: descriptor states
/// the fd tables of `ferry coverage` refuse.
fn refused_fd_mode(mode: &str, what: &[&str]) {
    assert_refused_args("tests/guarantees/fd_refusals.c", &[mode], what);
}

/// Restore reopened the queue's name, which is not a path: it failed
/// after the checkpoint (ENOENT).
#[test]
fn refuses_a_posix_message_queue() {
    refused_fd_mode("mqueue", &["fd 3", "a file on mqueue", "POSIX message queue"]);
}

/// Restore reopened it with O_TMPFILE's O_DIRECTORY: ENOTDIR after the
/// checkpoint.
#[test]
fn refuses_an_o_tmpfile_fd() {
    refused_fd_mode("tmpfile", &["fd 3", "open flag __O_TMPFILE"]);
}

/// Restore opened /proc/PID/status in the chrooted process: ENOENT after
/// the checkpoint.
#[test]
fn refuses_a_proc_fd_opened_before_chroot() {
    refused_fd_mode("proc_chroot", &["fd 3", "a file on proc outside the root", "before chroot"]);
}

/// Restore reopened `net:[...]`: ENOENT after the checkpoint.
#[test]
fn refuses_a_namespace_fd() {
    refused_fd_mode("nsfs", &["fd 3 (net:[", "a file on nsfs", "namespace fd"]);
}

#[test]
fn refuses_a_memfd_secret_fd() {
    refused_fd_mode(
        "memfd_secret",
        &["fd 3 (/secretmem (deleted))", "a file on secretmem", "memfd_secret"],
    );
}

#[test]
fn refuses_a_pidfd() {
    refused_fd_mode("pidfd", &["fd 3 (anon_inode:[pidfd])", "anon_inode kind [pidfd]"]);
}

#[test]
fn refuses_an_fd_on_a_symlink() {
    refused_fd_mode("symlink", &["fd 3", "file type S_IFLNK"]);
}

/// Restored, the two queued messages came back as one (their boundaries
/// were lost, silently).
#[test]
fn refuses_a_packet_mode_pipe_with_data() {
    refused_fd_mode("packet_pipe", &["fd 4 (pipe:[", "packet-mode pipe", "6 bytes queued"]);
}

/// Restored, the entry came back armed for EPOLLERR and EPOLLHUP,
/// silently.
#[test]
fn refuses_a_disarmed_epolloneshot_entry() {
    refused_fd_mode("oneshot", &["fd 3", "EPOLLONESHOT entry that fired"]);
}

/// Restored, the directory's dnotify watch was gone, silently.
#[test]
fn refuses_dnotify() {
    refused_fd_mode("dnotify", &["fd 3", "F_SETOWN owner", "dnotify"]);
}

/// A tree that ran in a network namespace of its own, checkpointed by a
/// ferry outside it: a restore without --netns would bring it back in
/// ferry's namespace, its sockets on another network, silently. It is
/// refused before anything is made, naming the namespace and the remedy;
/// with --netns it restores.
/// `pid` runs on its own: no tracer, not stopped.
fn running_untraced(pid: i32) -> bool {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status.lines().find_map(|l| l.strip_prefix(name)).map(str::trim).unwrap_or("").to_string()
    };
    field("TracerPid:") == "0"
        && !field("State:").starts_with('t')
        && !field("State:").starts_with('T')
}

#[test]
fn a_restore_refuses_to_move_a_tree_out_of_its_network_namespace() {
    require_root!();
    let Some(ns) = NetNs::new("own") else {
        eprintln!("skipped: `ip netns add` is not available");
        return;
    };
    let mut c = Case::new("own-netns");
    let prog = c.compile("tests/conformance/sock_tcp_listen.c");
    let netns_path = format!("/run/netns/{}", ns.0);
    let net_arg = format!("--net={netns_path}");
    let prog_s = prog.to_str().expect("utf-8 path");
    // nsenter execs the program: the PID is the program's.
    let pid = c.start_args(Path::new("nsenter"), &[&net_arg, prog_s]);
    let out = c.checkpoint(pid, &[]);
    assert!(out.status.success(), "checkpoint failed: {}", stderr(&out));
    c.children[0].wait().expect("reap");
    let images = c.images();
    let images_s = images.to_str().expect("utf-8");
    let o = c.ferry(&["restore", "--images", images_s, "--detach"]);
    let err = stderr(&o);
    assert!(!o.status.success(), "restored into ferry's namespace: {err}");
    let ino = inode(&netns_path);
    for want in [format!("net:[{ino}]"), "--netns".to_string()] {
        assert!(err.contains(&want), "the refusal should say {want:?}: {err}");
    }
    assert!(!Path::new(&format!("/proc/{pid}")).exists(), "a refused restore made pid {pid}");

    fs::write(c.dir.join("program.log"), "").expect("truncate log");
    let restore = Command::new(FERRY)
        .args(["restore", "--images", images_s, "--netns", &ns.0])
        .spawn()
        .expect("spawn restore");
    c.children.push(restore);
    // In the namespace is not yet restored: until ferry lets it go, the
    // process is traced and stopped, and a signal sent then would stop it
    // there while ferry waits on it.
    let deadline = Instant::now() + Duration::from_secs(10);
    while inode(&format!("/proc/{pid}/ns/net")) != ino || !running_untraced(pid) {
        assert!(Instant::now() < deadline, "restore into {} did not finish", ns.0);
        sleep(Duration::from_millis(5));
    }
    kill(pid, libc::SIGUSR2);
    let code = c.children[1].wait().expect("wait restore").code();
    assert_eq!(code, Some(0), "restored program failed in the namespace: {}", c.log());
    assert!(c.log().contains("PASS"), "{}", c.log());
}
