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

/// How long a fork waits for threads that are exiting: a joined thread
/// has returned, but the kernel lists it in /proc/self/task until it has
/// released it, a few microseconds later.
const EXITING_THREADS_WAIT: Duration = Duration::from_millis(100);

/// Number of threads of the calling process (entries of /proc/self/task).
pub fn thread_count() -> SysResult<usize> {
    let dir = std::fs::read_dir("/proc/self/task").map_err(|e| {
        SysError::new("reading /proc/self/task", e.raw_os_error().unwrap_or(libc::EIO))
    })?;
    Ok(dir.filter(|e| e.is_ok()).count())
}

/// Ok when the caller is its process's only thread; waits a little for
/// threads that are on their way out, then refuses with EBUSY.
pub fn check_single_threaded() -> SysResult<()> {
    let deadline = Instant::now() + EXITING_THREADS_WAIT;
    loop {
        if thread_count()? <= 1 {
            return Ok(());
        }
        if Instant::now() >= deadline {
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
