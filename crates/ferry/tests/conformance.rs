//! Conformance suite: every C program in `tests/conformance/` is run,
//! checkpointed with `ferry checkpoint` while it waits for SIGUSR2, restored
//! with `ferry restore`, woken with SIGUSR2, and must then print `PASS`.
//!
//! Protocol of a program (see tests/conformance/README.md): it prints
//! `READY` once its state is set up, blocks in `sigwaitinfo(SIGUSR2)`, and
//! after the signal checks its state, printing `FAIL: ...` for every
//! mismatch and `PASS` at the end (exit 0).
//!
//! Needs root (ptrace, same-PID restore). When not root every test prints a
//! message and returns. Set `FERRY_CONFORMANCE_KEEP=1` to keep each test's
//! directory (images, log, ferry's output) for debugging.

mod common;

use common::conformance::compile;
use ferry_testkit::{is_root, kill};
use std::fs::{self, File, OpenOptions};
use std::io::Read;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::sleep;
use std::time::{Duration, Instant};

const FERRY: &str = env!("CARGO_BIN_EXE_ferry");

const READY_TIMEOUT: Duration = Duration::from_secs(10);
const CHECKPOINT_TIMEOUT: Duration = Duration::from_secs(20);
const REAP_TIMEOUT: Duration = Duration::from_secs(10);
const PIDFILE_TIMEOUT: Duration = Duration::from_secs(10);
const RESTORE_EXIT_TIMEOUT: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(10);

static COUNTER: AtomicUsize = AtomicUsize::new(0);

fn read_lossy(path: &Path) -> String {
    let mut s = Vec::new();
    if let Ok(mut f) = File::open(path) {
        let _ = f.read_to_end(&mut s);
    }
    String::from_utf8_lossy(&s).into_owned()
}

fn has_line(text: &str, line: &str) -> bool {
    text.lines().any(|l| l == line)
}

/// Waits for `child` to exit, at most `timeout`.
fn wait_timeout(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(st)) => return Some(st),
            Ok(None) => {}
            Err(_) => return None,
        }
        if Instant::now() >= deadline {
            return None;
        }
        sleep(POLL);
    }
}

/// Makes the child start with only fds 0-2: cargo hands its jobserver pipe
/// (without O_CLOEXEC) to test binaries, and a stray pipe end would both
/// leak into the program and confuse the checkpoint.
fn only_stdio(cmd: &mut Command) -> &mut Command {
    ferry_testkit::only_stdio(cmd)
}

/// Parent PID of `pid` from /proc/<pid>/stat.
fn parent_of(pid: i32) -> Option<i32> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split(' ').nth(1)?.parse().ok()
}

fn describe(st: &ExitStatus) -> String {
    match (st.code(), st.signal()) {
        (Some(c), _) => format!("exit code {c}"),
        (None, Some(s)) => format!("killed by signal {s}"),
        _ => format!("{st}"),
    }
}

/// One test run: its directories and every process it started. Dropping it
/// kills (SIGKILL, by PID) and reaps whatever is still running and removes
/// the directory.
struct Run {
    name: &'static str,
    base: PathBuf,
    work: PathBuf,
    images: PathBuf,
    log: PathBuf,
    pidfile: PathBuf,
    program: Option<Child>,
    program_reaped: bool,
    restore: Option<Child>,
    original_pid: Option<i32>,
    restored_pid: Option<i32>,
    /// Checkpoint as a chain: a full image and a first incremental child
    /// taken with --leave-running, then the last child (which kills the
    /// program); the restore reads all three.
    chain: bool,
    /// A loginuid ferry runs with (see [`FERRY_LOGINUID`]).
    ferry_loginuid: Option<u32>,
    /// Send SIGUSR1 while ferry stalls after reading the socket options
    /// and describing the connections (before the freeze), and wait for
    /// the program's "SET": the program changes an option then
    /// (`sock_opt_set_late`) or its fds (`fd_change_late`), always run
    /// so. What ferry's log must then say it read again.
    late_change: Option<&'static str>,
}

/// Programs that change something while ferry stalls before the freeze
/// ([`Run::late_change`]), with what ferry's log must then say.
const LATE_CHANGES: &[(&str, &str)] = &[
    ("sock_opt_set_late", "socket options read before the freeze read again"),
    ("fd_change_late", "descriptors described before it read again"),
];

/// Programs whose checkpoint and restore run in a ferry with this
/// loginuid (set by a shell before it execs ferry), unlike the program's.
const FERRY_LOGINUID: &[(&str, u32)] = &[("proc_loginuid", 4242)];

/// Programs whose checkpoint and restore run in a ferry started with
/// securebits the program does not have (`setpriv --securebits`): the
/// restore's fork inherits ferry's, the restored process must not.
const FERRY_SECUREBITS: &[(&str, &str)] = &[("proc_securebits_none", "+no_setuid_fixup")];

/// Programs holding a pseudo-terminal of this machine's devpts from their
/// checkpoint to their restore. The restore needs the pair's number again
/// (and refuses when it is taken), while the kernel hands the lowest free
/// number to whoever opens /dev/ptmx next: two of them running at once
/// would take each other's number between kill and restore. They run one
/// at a time ([`DEVPTS`]).
const HOLD_A_PTY: &[&str] = &["fd_tty_stdin", "tty_pty_pair", "tty_ctty"];
static DEVPTS: std::sync::Mutex<()> = std::sync::Mutex::new(());

impl Run {
    fn new(name: &'static str) -> Run {
        let base = std::env::temp_dir().join(format!(
            "ferry-conformance-{name}-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = fs::remove_dir_all(&base);
        let work = base.join("work");
        let images = base.join("images");
        fs::create_dir_all(&work).expect("create work dir");
        fs::create_dir_all(&images).expect("create images dir");
        Run {
            name,
            log: base.join("program.log"),
            pidfile: base.join("restored.pid"),
            base,
            work,
            images,
            program: None,
            program_reaped: false,
            restore: None,
            original_pid: None,
            restored_pid: None,
            chain: false,
            ferry_loginuid: FERRY_LOGINUID.iter().find(|(n, _)| *n == name).map(|&(_, u)| u),
            late_change: None,
        }
    }

    /// A command that runs ferry, with [`Run::ferry_loginuid`] when set.
    fn ferry(&self) -> Command {
        if let Some(&(_, bits)) = FERRY_SECUREBITS.iter().find(|(n, _)| *n == self.name) {
            let mut cmd = Command::new("setpriv");
            cmd.arg("--securebits").arg(bits).arg(FERRY);
            return cmd;
        }
        let Some(uid) = self.ferry_loginuid else {
            return Command::new(FERRY);
        };
        let mut cmd = Command::new("sh");
        let script = format!("echo {uid} > /proc/self/loginuid && exec \"$0\" \"$@\"");
        cmd.arg("-c").arg(script).arg(FERRY);
        cmd
    }

    /// Runs `ferry checkpoint` of `pid` into `images`, over `parent` if
    /// given; fails the run unless it succeeds in time.
    fn checkpoint(&self, pid: i32, images: &Path, parent: Option<&Path>, leave_running: bool) {
        let mut cmd = self.ferry();
        cmd.arg("checkpoint").arg("--pid").arg(pid.to_string()).arg("--images").arg(images);
        // The program is this harness's child, in its process group, and
        // the harness reaps it after the checkpoint.
        cmd.arg("--parent-sees-exit");
        if let Some(p) = parent {
            cmd.arg("--parent").arg(p);
        }
        if leave_running {
            cmd.arg("--leave-running");
        }
        if self.late_change.is_some() {
            cmd.env("FERRY_LOG", "debug")
                // Its two sockets are watched (ferry watches from 500 on).
                .env("FERRY_SOCKOPT_WATCH_FROM", "1")
                .env("FERRY_FAULT_STALL_AFTER", "checkpoint:socket options checked")
                .env("FERRY_FAULT_STALL_SECS", "3");
        }
        let mut ckpt = only_stdio(&mut cmd)
            .stdin(Stdio::null())
            .stdout(File::create(self.base.join("checkpoint.out")).expect("ckpt out"))
            .stderr(File::create(self.base.join("checkpoint.err")).expect("ckpt err"))
            .spawn()
            .unwrap_or_else(|e| self.fail("checkpoint", &format!("cannot spawn ferry: {e}")));
        if self.late_change.is_some() {
            self.change_while_stalled(pid);
        }
        let st = match wait_timeout(&mut ckpt, CHECKPOINT_TIMEOUT) {
            Some(st) => st,
            None => {
                let _ = ckpt.kill();
                let _ = ckpt.wait();
                self.fail("checkpoint", "ferry checkpoint did not finish within 20 s");
            }
        };
        if !st.success() {
            self.fail("checkpoint", &format!("ferry checkpoint failed ({})", describe(&st)));
        }
        // Where the kernel offers setsockopt counters, the survey says it
        // read the options again.
        let counted = Path::new("/sys/kernel/tracing/events/syscalls").exists();
        let err = read_lossy(&self.base.join("checkpoint.err"));
        if let Some(said) = self.late_change.filter(|said| counted && !err.contains(said)) {
            self.fail("checkpoint", &format!("the survey's log lacks \"{said}\""));
        }
    }

    /// Once ferry stalls after its early read of the socket options, has
    /// the program change one (SIGUSR1) and waits until it did.
    fn change_while_stalled(&self, pid: i32) {
        let err = self.base.join("checkpoint.err");
        let deadline = Instant::now() + CHECKPOINT_TIMEOUT;
        while !read_lossy(&err).contains("stalling after") {
            if Instant::now() >= deadline {
                self.fail("checkpoint", "ferry never stalled after the socket options");
            }
            sleep(POLL);
        }
        if !kill(pid, libc::SIGUSR1) {
            self.fail("checkpoint", "kill(SIGUSR1) of the program failed");
        }
        let deadline = Instant::now() + Duration::from_secs(2);
        while !has_line(&read_lossy(&self.log), "SET") {
            if Instant::now() >= deadline {
                self.fail("checkpoint", "the program did not change its options in time");
            }
            sleep(POLL);
        }
    }

    /// The checkpoint that kills the program: alone, or the last of a
    /// chain of three images.
    fn checkpoint_to_kill(&self, pid: i32) {
        if !self.chain {
            return self.checkpoint(pid, &self.images, None, false);
        }
        let (full, first) = (self.base.join("full"), self.base.join("first"));
        self.checkpoint(pid, &full, None, true);
        // The program runs on between the images, as a service would.
        sleep(Duration::from_millis(100));
        self.checkpoint(pid, &first, Some(&full), true);
        sleep(Duration::from_millis(100));
        self.checkpoint(pid, &self.images, Some(&first), false);
    }

    fn open_log(&self) -> File {
        OpenOptions::new().append(true).create(true).open(&self.log).expect("open log")
    }

    /// Panics with everything useful to understand a failure.
    fn fail(&self, stage: &str, msg: &str) -> ! {
        panic!(
            "conformance program `{}` failed at {stage}: {msg}\n\
             --- program log ({}) ---\n{}\n\
             --- ferry checkpoint stderr ---\n{}\n\
             --- ferry restore stderr ---\n{}\n\
             --- end ---",
            self.name,
            self.log.display(),
            read_lossy(&self.log),
            read_lossy(&self.base.join("checkpoint.err")),
            read_lossy(&self.base.join("restore.err")),
        )
    }

    fn execute(&mut self, bin: &Path) {
        // 1. start the program
        let log = self.open_log();
        let child = only_stdio(&mut Command::new(bin))
            .current_dir(&self.work)
            .env("FERRY_TEST_DIR", &self.work)
            .env("FERRY_EXPECT_RESTORE", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::from(log.try_clone().expect("dup log")))
            .stderr(Stdio::from(log))
            .spawn()
            .unwrap_or_else(|e| self.fail("start", &format!("cannot spawn: {e}")));
        let pid = child.id() as i32;
        self.program = Some(child);
        self.original_pid = Some(pid);

        // 2. wait for READY
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if has_line(&read_lossy(&self.log), "READY") {
                break;
            }
            if let Ok(Some(st)) = self.program.as_mut().unwrap().try_wait() {
                self.program_reaped = true;
                self.fail("startup", &format!("exited before READY ({})", describe(&st)));
            }
            if Instant::now() >= deadline {
                self.fail("startup", "no READY within 10 s");
            }
            sleep(POLL);
        }

        // 3. checkpoint (kills the program)
        self.checkpoint_to_kill(pid);

        // 4. reap the original process so that its PID is free again
        match wait_timeout(self.program.as_mut().unwrap(), REAP_TIMEOUT) {
            Some(st) => {
                self.program_reaped = true;
                if st.signal() != Some(libc::SIGKILL) {
                    self.fail(
                        "checkpoint",
                        &format!(
                            "original process ended with {} instead of SIGKILL",
                            describe(&st)
                        ),
                    );
                }
            }
            None => {
                self.fail("checkpoint", "ferry checkpoint succeeded but the process is still alive")
            }
        }

        // 5. restore
        let restore = only_stdio(&mut self.ferry())
            .arg("restore")
            .arg("--images")
            .arg(&self.images)
            .arg("--pidfile")
            .arg(&self.pidfile)
            .stdin(Stdio::null())
            .stdout(File::create(self.base.join("restore.out")).expect("restore out"))
            .stderr(File::create(self.base.join("restore.err")).expect("restore err"))
            .spawn()
            .unwrap_or_else(|e| self.fail("restore", &format!("cannot spawn ferry: {e}")));
        self.restore = Some(restore);

        // 6. wait for the pidfile
        let deadline = Instant::now() + PIDFILE_TIMEOUT;
        let restored_pid = loop {
            let text = read_lossy(&self.pidfile);
            if text.ends_with('\n') {
                match text.trim().parse::<i32>() {
                    Ok(p) if p > 0 => break p,
                    _ => self.fail("restore", &format!("bad pidfile content {text:?}")),
                }
            }
            if let Ok(Some(st)) = self.restore.as_mut().unwrap().try_wait() {
                self.fail(
                    "restore",
                    &format!("ferry restore exited ({}) before writing the pidfile", describe(&st)),
                );
            }
            if Instant::now() >= deadline {
                self.fail("restore", "no pidfile within 10 s");
            }
            sleep(POLL);
        };
        self.restored_pid = Some(restored_pid);
        if restored_pid != pid {
            self.fail(
                "restore",
                &format!("restored with pid {restored_pid}, expected the same pid {pid}"),
            );
        }

        // 7. wake the program up
        if !kill(restored_pid, libc::SIGUSR2) {
            self.fail(
                "wakeup",
                &format!("kill({restored_pid}, SIGUSR2): {}", std::io::Error::last_os_error()),
            );
        }

        // 8. wait for it to finish its checks
        let st = match wait_timeout(self.restore.as_mut().unwrap(), RESTORE_EXIT_TIMEOUT) {
            Some(st) => st,
            None => self.fail("check", "ferry restore did not exit within 30 s after SIGUSR2"),
        };
        self.restore = None; // reaped
        let log = read_lossy(&self.log);
        if !st.success() {
            self.fail("check", &format!("ferry restore ended with {}", describe(&st)));
        }
        if log.contains("FAIL") {
            self.fail("check", "the program reported FAIL");
        }
        if !has_line(&log, "PASS") {
            self.fail("check", "the program did not print PASS");
        }
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        // The restored process is a child of `ferry restore`: kill it only
        // while ferry restore is still running (so the PID cannot have been
        // reused yet), then ferry restore itself.
        if let Some(mut r) = self.restore.take() {
            if let Ok(None) = r.try_wait() {
                // Before the pidfile exists, the (half-)restored process can
                // only be recognised as a child of ferry restore carrying the
                // original PID.
                let candidate = self.restored_pid.or(self.original_pid);
                if let Some(pid) = candidate {
                    if self.restored_pid.is_some() || parent_of(pid) == Some(r.id() as i32) {
                        kill(pid, libc::SIGKILL);
                    }
                }
                if wait_timeout(&mut r, Duration::from_secs(5)).is_none() {
                    let _ = r.kill();
                    let _ = r.wait();
                }
            }
        }
        if let Some(mut c) = self.program.take() {
            if !self.program_reaped {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        if std::env::var_os("FERRY_CONFORMANCE_KEEP").is_some() {
            eprintln!("{}: kept {}", self.name, self.base.display());
        } else {
            let _ = fs::remove_dir_all(&self.base);
        }
    }
}

fn run_program(name: &'static str) {
    run_program_as(name, false);
}

fn run_program_as(name: &'static str, chain: bool) {
    if !is_root() {
        eprintln!("skipping conformance test {name}: needs root (euid != 0)");
        return;
    }
    let unset = fs::read_to_string("/proc/self/loginuid").is_ok_and(|l| l.trim() == "4294967295");
    if FERRY_LOGINUID.iter().any(|(n, _)| *n == name) && !unset {
        eprintln!("skipping conformance test {name}: needs a harness whose loginuid is unset");
        return;
    }
    let bin = compile(name);
    // A test that failed while holding it leaves it poisoned; the next
    // one still runs.
    let _devpts = HOLD_A_PTY
        .contains(&name)
        .then(|| DEVPTS.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
    let attempt = || {
        let mut run = Run::new(name);
        run.chain = chain;
        run.late_change = LATE_CHANGES.iter().find(|(n, _)| *n == name).map(|&(_, said)| said);
        run.execute(&bin);
    };
    // One more attempt, from a fresh start, when the restore found one of
    // the tree's PIDs taken: a process of another test or of the machine
    // got it between checkpoint and restore, which says nothing of ferry.
    if let Err(panic) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(attempt)) {
        let text = panic
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| panic.downcast_ref::<&str>().copied())
            .unwrap_or("");
        if !text.contains(" is taken by ") {
            std::panic::resume_unwind(panic);
        }
        eprintln!("{name}: a PID of the tree was taken by another process before restore; again");
        attempt();
    }
}

/// Programs restored from a chain of incremental images (a full image
/// and two children, taken with `--parent` while the program ran on):
/// memory written between the images, shared copy-on-write in a tree,
/// threads writing all along, registers.
macro_rules! conformance_chain {
    ($($test:ident => $name:ident),* $(,)?) => {
        $(
            #[test]
            fn $test() {
                run_program_as(stringify!($name), true);
            }
        )*
    };
}

conformance_chain! {
    chain_mem_anon_private => mem_anon_private,
    chain_mem_heap_brk => mem_heap_brk,
    chain_mem_memfd => mem_memfd,
    chain_mem_shared_alias => mem_shared_alias,
    chain_mem_file_private => mem_file_private,
    chain_threads_8_writers => threads_8_writers,
    chain_tree_cow_memory => tree_cow_memory,
    chain_tree_shared_anon => tree_shared_anon,
    chain_regs_gp_spin => regs_gp_spin,
}

macro_rules! conformance {
    ($($name:ident),* $(,)?) => {
        const PROGRAMS: &[&str] = &[$(stringify!($name)),*];
        $(
            #[test]
            fn $name() {
                run_program(stringify!($name));
            }
        )*
    };
}

conformance! {
    // threads
    threads_8_writers,
    regs_gp_spin,
    regs_gp_syscall,
    fpu_sse_x87,
    fpu_avx_regs,
    fpu_avx512_regs,
    fsbase_tls,
    thread_sigmask,
    tids_kept,
    thread_nanosleep,
    main_nanosleep,
    thread_read_pipe,
    thread_write_pipe_full,
    thread_epoll_wait,
    thread_accept,
    thread_futex_condwait,
    thread_futex_raw,
    thread_ppoll_sigmask,
    thread_exit_join,
    // memory
    mem_anon_private,
    mem_1g_sparse,
    mem_file_private,
    mem_file_shared,
    mem_anon_shared,
    mem_shared_alias,
    mem_heap_brk,
    mem_stack_deep,
    mem_vdso,
    mem_mprotect,
    mem_prot_none_toggle,
    mem_memfd,
    // file descriptors
    fd_regular_append,
    fd_dir,
    fd_deleted_file,
    fd_dev_nodes,
    fd_flags,
    fd_open_flags,
    fd_other_mount,
    fd_locks,
    fd_dup_shared_offset,
    fd_pipe_unread,
    fd_pipe_half_closed,
    fd_fifo_unread,
    fd_eventfd,
    fd_timerfd,
    fd_signalfd,
    fd_epoll,
    fd_tty_stdin,
    tty_pty_pair,
    tty_ctty,
    sock_tcp_listen,
    sock_tcp_v4mapped,
    sock_tcp_close_wait,
    sock_buf_force,
    sock_tcp_v6only,
    sock_tcp_established_pair,
    sock_opt_set_late,
    fd_change_late,
    sock_udp_bound,
    sock_udp_connected,
    sock_unix_pair,
    sock_unix_listen,
    // signals
    sig_sigaction_flags,
    sig_pending,
    sig_altstack,
    sig_itimer_alarm,
    // process
    proc_creds_caps,
    proc_cwd,
    proc_umask,
    proc_oom_score_adj,
    proc_coredump_filter,
    proc_ioprio,
    proc_autogroup_nice,
    proc_loginuid,
    proc_rlimits,
    proc_sched_affinity,
    proc_itimers_virt_prof,
    proc_posix_timers,
    proc_names,
    proc_robust_list,
    proc_rseq,
    proc_personality,
    proc_no_new_privs,
    proc_prctl_misc,
    proc_cmdline_auxv,
    // process trees
    tree_basic,
    tree_pipe_between,
    tree_shared_fd_offset,
    tree_unix_pair,
    tree_unix_peercred,
    tree_shared_anon,
    tree_sysv_shm,
    tree_posix_shm,
    tree_memfd_shared,
    tree_file_shared_mapping,
    tree_cow_memory,
    tree_scm_rights,
    tree_zombie,
    tree_sysv_sem,
    tree_sysv_msg,
    tree_pgrp_signal,
    tree_uts_namespace,
    // fidelity (issue 9)
    proc_seccomp_filter,
    tree_seccomp_strict,
    proc_fsuid,
    proc_securebits_none,
    tree_pdeathsig,
    fd_async_owner,
    tree_zombie_signaled,
    fd_timerfd_state,
    fd_memfd_mode,
    fd_deleted_owner,
    fd_pipe_full,
    fd_pipe_reopened,
    tree_stopped,
    mem_mlock,
    mem_mlock_onfault,
    tree_exit_signal,
    fd_inotify,
    mem_deleted_file,
    tree_clone_files,
    tree_proc_file,
    fd_epoll_closed,
    fd_epoll_dup_closed,
    sock_unix_pending,
    tree_scm_in_flight,
    sock_unix_pending_order,
    // zdtm gaps
    fd_fifo_deleted,
    sock_unix_unconnected,
    proc_seccomp_tsync,
    tree_seccomp_kill,
    sock_opts_unbound,
    sock_opts_more,
    fd_deleted_sparse,
    proc_dumpable_setuid,
    tree_caps_ambient,
    tree_zombie_pgid,
    tree_pgid_later_sibling,
    proc_cwd_deleted,
    fd_deleted_dev,
    sock_unix_accepted_names,
    sock_unix_dgram_names,
    sock_unix_file_mode,
    tree_zombie_mixed,
    tree_fdt_shared,
    fd_inotify_deleted,
    fd_deleted_dir_gone,
    mem_memfd_sealed_write,
    proc_exe_deleted,
    sock_unix_peer_closed,
    sock_unix_opts,
    sock_unix_scm_orphan,
    mem_madvise_flags,
    proc_chroot,
}

/// Every `tests/conformance/*.c` must be listed above (and vice versa).
#[test]
fn all_programs_registered() {
    let on_disk = common::conformance::programs();
    let mut listed: Vec<String> = PROGRAMS.iter().map(|s| s.to_string()).collect();
    listed.sort();
    assert_eq!(on_disk, listed, "tests/conformance/*.c and the conformance! list differ");
}
