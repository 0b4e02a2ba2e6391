//! pidfd: stable process handles, fd duplication out of another process.

use crate::{check, SysResult};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

pub fn pidfd_open(pid: i32) -> SysResult<OwnedFd> {
    // SAFETY: pidfd_open takes integers and returns a new fd.
    let r = check("pidfd_open", unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) })?;
    // SAFETY: r is a new descriptor owned by us.
    Ok(unsafe { OwnedFd::from_raw_fd(r as RawFd) })
}

/// A pidfd of thread `tid` alone (PIDFD_THREAD, Linux 6.9): it polls
/// readable once that thread has exited, whatever its process does, so
/// a thread ID taken again by a new thread is never mistaken for it.
pub fn pidfd_open_thread(tid: i32) -> SysResult<OwnedFd> {
    let flags = libc::O_EXCL as libc::c_uint;
    // SAFETY: pidfd_open takes integers and returns a new fd.
    let r = check("pidfd_open(PIDFD_THREAD)", unsafe {
        libc::syscall(libc::SYS_pidfd_open, tid, flags)
    })?;
    // SAFETY: r is a new descriptor owned by us.
    Ok(unsafe { OwnedFd::from_raw_fd(r as RawFd) })
}

/// Duplicates descriptor `target_fd` of the process behind `pidfd` into ours.
pub fn pidfd_getfd(pidfd: &OwnedFd, target_fd: RawFd) -> SysResult<OwnedFd> {
    // SAFETY: integers only; returns a new fd.
    let r = check("pidfd_getfd", unsafe {
        libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), target_fd, 0)
    })?;
    // SAFETY: r is a new descriptor owned by us.
    Ok(unsafe { OwnedFd::from_raw_fd(r as RawFd) })
}

pub fn pidfd_send_signal(pidfd: &OwnedFd, sig: i32) -> SysResult<()> {
    // SAFETY: a NULL siginfo is allowed.
    check("pidfd_send_signal", unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            sig,
            std::ptr::null::<u8>(),
            0,
        )
    })?;
    Ok(())
}

/// Frees the memory of a process that is being killed in the caller's
/// context (process_mrelease), so that its own exit has less address
/// space to tear down. EINVAL when it is not exiting yet.
pub fn process_mrelease(pidfd: &OwnedFd) -> SysResult<()> {
    // SAFETY: takes a descriptor and a flags word, touches no memory of ours.
    check("process_mrelease", unsafe {
        libc::syscall(libc::SYS_process_mrelease, pidfd.as_raw_fd(), 0)
    })?;
    Ok(())
}

/// Waits until the process behind `pidfd` has exited (the pidfd polls readable).
pub fn wait_exit(pidfd: &OwnedFd, timeout_ms: i32) -> SysResult<bool> {
    let mut p = libc::pollfd { fd: pidfd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd.
    let r = unsafe { libc::poll(&mut p, 1, timeout_ms) };
    Ok(check("poll(pidfd)", r as libc::c_long)? > 0)
}
