//! The first part of a restore, run by the tree's root itself right after
//! it was forked from ferry with its old PID: network namespace, session,
//! umask, personality, root and working directory, and an fd table that
//! holds only ferry's staged descriptors. Then it stops itself and ferry
//! takes over with ptrace for its fd table, memory, children, threads and
//! the rest.
//!
//! ferry is single-threaded when it forks, so ordinary Rust code
//! (allocation included) is safe here.

use crate::error::{EngineError, Result};
use ferry_image::ProcessImage;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

pub struct ChildPlan<'a> {
    pub image: &'a ProcessImage,
    /// Descriptors that must survive into the stopped child (everything
    /// staged, the status pipe).
    pub keep: Vec<RawFd>,
    /// A network namespace to join before any socket is made.
    pub netns: Option<RawFd>,
    pub go: OwnedFd,
    pub status: OwnedFd,
}

fn close_all_but(keep: &[RawFd]) {
    let mut keep = keep.to_vec();
    keep.sort_unstable();
    let mut from: u32 = 0;
    for &k in &keep {
        if (k as u32) > from {
            // SAFETY: closing descriptors of this (forked) process only.
            unsafe { libc::syscall(libc::SYS_close_range, from, k as u32 - 1, 0) };
        }
        from = k as u32 + 1;
    }
    // SAFETY: as above.
    unsafe { libc::syscall(libc::SYS_close_range, from, u32::MAX, 0) };
}

fn setup(plan: &ChildPlan) -> Result<()> {
    let img = plan.image;
    let pid = img.pid;
    if let Some(ns) = plan.netns {
        // SAFETY: ns is an open namespace file; setns only reads it.
        if unsafe { libc::setns(ns, libc::CLONE_NEWNET) } < 0 {
            return Err(super::files::errno_err(pid, "joining the network namespace".into()));
        }
    }
    // SAFETY: plain process-attribute syscalls on ourselves.
    unsafe {
        if img.sid == pid {
            libc::setsid();
        } else if img.pgid == pid {
            libc::setpgid(0, 0);
        }
        libc::umask(img.umask as libc::mode_t);
        libc::personality(img.personality as libc::c_ulong);
    }
    // Drop what the fork inherited from ferry: its signal handlers and its
    // alternate signal stack. The image's own come back later.
    // The raw syscall with an all-zero action: glibc's signal() would add
    // its own flags and mask.
    let dfl = [0u64; 4];
    for sig in 1..=64 {
        if sig != libc::SIGKILL && sig != libc::SIGSTOP {
            // SAFETY: dfl is a valid 32-byte kernel sigaction (SIG_DFL).
            unsafe { libc::syscall(libc::SYS_rt_sigaction, sig, dfl.as_ptr(), std::ptr::null_mut::<u64>(), 8usize) };
        }
    }
    let off = libc::stack_t { ss_sp: std::ptr::null_mut(), ss_flags: libc::SS_DISABLE, ss_size: 0 };
    // SAFETY: disabling our alternate stack; no old value requested.
    unsafe { libc::sigaltstack(&off, std::ptr::null_mut()) };
    // The directory first: its path is as seen from ferry's root.
    std::env::set_current_dir(&img.cwd).map_err(|e| EngineError::io(format!("changing directory to {}", img.cwd), e))?;
    if let Some(root) = &img.root {
        std::os::unix::fs::chroot(root).map_err(|e| EngineError::io(format!("chroot to {root}"), e))?;
    }
    close_all_but(&plan.keep);
    if img.no_new_privs {
        // SAFETY: integer arguments.
        unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
    }
    Ok(())
}

/// Never returns: reports failure through the status pipe and exits, or
/// stops itself for ferry to continue.
pub fn run(plan: ChildPlan) -> ! {
    let mut byte = [0u8; 1];
    let _ = std::fs::File::from(plan.go.try_clone().unwrap_or_else(|_| exit(3))).read(&mut byte);
    let status_fd = plan.status.as_raw_fd();
    match setup(&plan) {
        Ok(()) => {
            // SAFETY: closing our copy of the status pipe signals success.
            unsafe { libc::close(status_fd) };
            // SAFETY: stop ourselves; the tracer sees the stop and takes over.
            unsafe { libc::kill(libc::getpid(), libc::SIGSTOP) };
            exit(4)
        }
        Err(e) => {
            let mut f = std::fs::File::from(plan.status);
            let _ = f.write_all(e.to_string().as_bytes());
            exit(1)
        }
    }
}

fn exit(code: i32) -> ! {
    // SAFETY: _exit is always safe to call; it skips atexit handlers that
    // belong to the parent ferry process.
    unsafe { libc::_exit(code) }
}
