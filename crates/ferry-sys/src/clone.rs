//! clone3 with a chosen PID (set_tid), used to recreate a process under
//! the PID it had when it was captured.

use crate::{last_error, SysResult};

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

/// Forks the calling process into a child whose PID is `pid`.
/// Returns `Ok(0)` in the child and the child's PID in the parent.
///
/// # Safety
/// Same rules as `fork()`: the caller must be single-threaded or the child
/// must only call async-signal-safe functions.
pub unsafe fn fork_with_pid(pid: i32) -> SysResult<i32> {
    let tids = [pid];
    let args = CloneArgs {
        exit_signal: libc::SIGCHLD as u64,
        set_tid: tids.as_ptr() as u64,
        set_tid_size: 1,
        ..Default::default()
    };
    // SAFETY: args is a valid clone_args of the size passed; no CLONE_VM,
    // so the child gets its own copy of the address space like fork().
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
/// caller sees it) in the parent.
///
/// # Safety
/// Same rules as `fork()`: the caller must be single-threaded or the child
/// must only call async-signal-safe functions.
pub unsafe fn fork_into_namespaces(flags: u64) -> SysResult<i32> {
    let args = CloneArgs { flags, exit_signal: libc::SIGCHLD as u64, ..Default::default() };
    // SAFETY: args is a valid clone_args of the size passed; no CLONE_VM.
    let r = unsafe {
        libc::syscall(libc::SYS_clone3, &args as *const CloneArgs, std::mem::size_of::<CloneArgs>())
    };
    if r < 0 {
        return Err(last_error("clone3(new namespaces)"));
    }
    Ok(r as i32)
}
