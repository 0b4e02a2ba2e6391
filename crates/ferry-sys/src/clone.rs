//! clone3 with a chosen PID (set_tid), used to recreate a process under
//! the PID it had when it was captured, or into new namespaces.
//!
//! Both forks are safe to call: they refuse (EBUSY) unless the caller is
//! its process's only thread. A child forked from a multi-threaded
//! process would inherit whatever locks the other threads held at that
//! moment (the allocator's, stdio's...) and could deadlock or corrupt
//! memory running ordinary Rust code; with one thread there are none.

use crate::{last_error, SysError, SysResult};
use std::time::{Duration, Instant};

/// The call name a refused fork reports (errno EBUSY).
pub const SEVERAL_THREADS: &str = "fork while several threads run";

/// How long a fork waits for a thread that is not exiting before it
/// refuses.
const LIVE_THREADS_WAIT: Duration = Duration::from_millis(100);

/// How long a fork waits for threads that are exiting: a joined thread
/// has returned, but the kernel lists it in /proc/self/task until it has
/// released it, a few microseconds later, or much later on a loaded
/// machine where the exiting thread waits for a CPU. A refusal there
/// would fail a restore after the tree was killed.
const EXITING_THREADS_WAIT: Duration = Duration::from_secs(5);

/// The kernel's PF_EXITING task flag (set as a thread starts to exit).
const PF_EXITING: u64 = 0x4;

/// Number of threads of the calling process (entries of /proc/self/task).
pub fn thread_count() -> SysResult<usize> {
    let dir = std::fs::read_dir("/proc/self/task").map_err(|e| {
        SysError::new("reading /proc/self/task", e.raw_os_error().unwrap_or(libc::EIO))
    })?;
    Ok(dir.filter(|e| e.is_ok()).count())
}

/// Whether every thread of the caller but itself is exiting (or already
/// gone); threads that cannot be read count as gone.
fn others_exiting() -> bool {
    let me = crate::process::gettid().to_string();
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else { return false };
    dir.filter_map(|e| e.ok()).filter(|e| e.file_name().to_str() != Some(me.as_str())).all(|e| {
        match std::fs::read_to_string(e.path().join("stat")) {
            Ok(stat) => stat_flags(&stat).is_some_and(|f| f & PF_EXITING != 0),
            Err(_) => true,
        }
    })
}

/// The flags field of a /proc/PID/stat line (the sixth after the
/// command's closing parenthesis).
fn stat_flags(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(6)?.parse().ok()
}

/// Ok when the caller is its process's only thread; waits a little for
/// other threads to go, and as long as [`EXITING_THREADS_WAIT`] while
/// they are all exiting, then refuses with EBUSY.
pub fn check_single_threaded() -> SysResult<()> {
    let start = Instant::now();
    loop {
        if thread_count()? <= 1 {
            return Ok(());
        }
        let waited = start.elapsed();
        if waited >= EXITING_THREADS_WAIT || (waited >= LIVE_THREADS_WAIT && !others_exiting()) {
            return Err(SysError::new(SEVERAL_THREADS, libc::EBUSY));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[repr(C)]
#[derive(Default)]
pub struct CloneArgs {
    pub flags: u64,
    pub pidfd: u64,
    pub child_tid: u64,
    pub parent_tid: u64,
    pub exit_signal: u64,
    pub stack: u64,
    pub stack_size: u64,
    pub tls: u64,
    pub set_tid: u64,
    pub set_tid_size: u64,
    pub cgroup: u64,
}

impl CloneArgs {
    /// The struct as the kernel reads it (eleven little-endian words), to
    /// be written into another process for a clone3 it runs itself.
    pub fn to_bytes(&self) -> Vec<u8> {
        [
            self.flags,
            self.pidfd,
            self.child_tid,
            self.parent_tid,
            self.exit_signal,
            self.stack,
            self.stack_size,
            self.tls,
            self.set_tid,
            self.set_tid_size,
            self.cgroup,
        ]
        .iter()
        .flat_map(|w| w.to_le_bytes())
        .collect()
    }
}

/// Forks the calling process into a child whose PID is `pid`.
/// Returns `Ok(0)` in the child and the child's PID in the parent; an
/// error [`SEVERAL_THREADS`] (EBUSY) when another thread runs.
pub fn fork_with_pid(pid: i32) -> SysResult<i32> {
    check_single_threaded()?;
    let tids = [pid];
    let args = CloneArgs {
        exit_signal: libc::SIGCHLD as u64,
        set_tid: tids.as_ptr() as u64,
        set_tid_size: 1,
        ..Default::default()
    };
    // SAFETY: args is a valid clone_args of the size passed; no CLONE_VM,
    // so the child gets its own copy of the address space like fork().
    // check_single_threaded above found this thread alone (and only it
    // could have started another since), so the child inherits no lock
    // held by a thread that does not exist in it.
    let r = unsafe {
        libc::syscall(libc::SYS_clone3, &args as *const CloneArgs, std::mem::size_of::<CloneArgs>())
    };
    if r < 0 {
        return Err(last_error("clone3(set_tid)"));
    }
    Ok(r as i32)
}

/// Forks the calling process into new namespaces (`flags` is a set of
/// CLONE_NEW* bits). With CLONE_NEWPID the child is PID 1 of a fresh PID
/// namespace. Returns `Ok(0)` in the child and the child's PID (as the
/// caller sees it) in the parent; an error [`SEVERAL_THREADS`] (EBUSY)
/// when another thread runs.
pub fn fork_into_namespaces(flags: u64) -> SysResult<i32> {
    check_single_threaded()?;
    let args = CloneArgs { flags, exit_signal: libc::SIGCHLD as u64, ..Default::default() };
    // SAFETY: args is a valid clone_args of the size passed; no CLONE_VM.
    // check_single_threaded above found this thread alone, so the child
    // inherits no lock held by a thread that does not exist in it.
    let r = unsafe {
        libc::syscall(libc::SYS_clone3, &args as *const CloneArgs, std::mem::size_of::<CloneArgs>())
    };
    if r < 0 {
        return Err(last_error("clone3(new namespaces)"));
    }
    Ok(r as i32)
}

#[cfg(test)]
mod stat_tests {
    use super::*;

    #[test]
    fn the_flags_field_is_read_after_the_command_even_with_spaces_and_parentheses() {
        let live = "1234 (a (b) c) R 1 1234 1234 0 -1 4194368 100 0 0 0";
        let exiting = "1234 (a (b) c) R 1 1234 1234 0 -1 4194372 100 0 0 0";
        assert_eq!(stat_flags(live), Some(0x40_0040));
        assert!(stat_flags(live).is_some_and(|f| f & PF_EXITING == 0));
        assert!(stat_flags(exiting).is_some_and(|f| f & PF_EXITING != 0));
        assert_eq!(stat_flags("1 (x) S 0"), None);
    }

    #[test]
    fn a_running_thread_is_not_exiting() {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || rx.recv());
        let exiting = others_exiting();
        drop(tx);
        let _ = t.join();
        assert!(!exiting);
    }
}
