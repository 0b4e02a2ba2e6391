//! The first part of a restore, run by the tree's root itself right after
//! it was forked from ferry with its old PID: network namespace, UTS
//! namespace (a new one, for a tree that had its own), session,
//! loginuid, umask, personality, root and working directory, and an fd table that
//! holds only ferry's staged descriptors. Then it stops itself and ferry
//! takes over with ptrace for its fd table, memory, children, threads and
//! the rest.
//!
//! ferry is single-threaded when it forks, so ordinary Rust code
//! (allocation included) is safe here.

use crate::error::{EngineError, Result};
use ferry_image::ProcessImage;
use ferry_sys::process;
use std::io::{Read, Write};
use std::os::fd::{OwnedFd, RawFd};

pub struct ChildPlan<'a> {
    pub image: &'a ProcessImage,
    /// Descriptors that must survive into the stopped child (everything
    /// staged, the status pipe).
    pub keep: Vec<RawFd>,
    /// A network namespace to join before any socket is made.
    pub netns: Option<RawFd>,
    /// The tree's own UTS namespace: the root makes a new one with these
    /// names before any of its children is forked (they inherit it).
    pub uts: Option<&'a ferry_image::UtsImage>,
    /// A loginuid to write: the kernel takes it only from the process
    /// itself, so here, before a chroot could hide /proc.
    pub loginuid: Option<u32>,
    pub go: OwnedFd,
    pub status: OwnedFd,
}

fn close_all_but(keep: &[RawFd]) {
    let mut keep = keep.to_vec();
    keep.sort_unstable();
    let mut from: u32 = 0;
    // Closing descriptors of this (forked) process only.
    for &k in &keep {
        if (k as u32) > from {
            let _ = ferry_sys::fd::close_range(from, k as u32 - 1);
        }
        from = k as u32 + 1;
    }
    let _ = ferry_sys::fd::close_range(from, u32::MAX);
}

fn setup(plan: &ChildPlan) -> Result<()> {
    let img = plan.image;
    let pid = img.pid;
    if let Some(ns) = plan.netns {
        ferry_sys::netns::enter_net_namespace_fd(ns)
            .map_err(|e| EngineError::kernel(pid, "joining the network namespace", e))?;
    }
    if let Some(u) = plan.uts {
        ferry_sys::uts::enter_new(&u.hostname, &u.domainname)
            .map_err(|e| EngineError::kernel(pid, "making its UTS namespace", e))?;
    }
    if img.sid == pid {
        let _ = process::setsid();
    } else if img.pgid == pid {
        let _ = process::setpgid(0, 0);
    }
    if let Some(uid) = plan.loginuid {
        std::fs::write("/proc/self/loginuid", uid.to_string())
            .map_err(|e| EngineError::io(format!("writing loginuid {uid}"), e))?;
    }
    process::umask(img.umask);
    let _ = process::set_personality(img.personality as u64);
    // Drop what the fork inherited from ferry: its signal handlers and its
    // alternate signal stack. The image's own come back later.
    for sig in 1..=64 {
        if sig != libc::SIGKILL && sig != libc::SIGSTOP {
            let _ = ferry_sys::signal::reset_to_default(sig);
        }
    }
    let _ = ferry_sys::signal::disable_altstack();
    // The directory first: its path is as seen from ferry's root.
    // A removed one is made again to enter it, and removed again.
    match img.cwd.strip_suffix(" (deleted)") {
        Some(old) => {
            let dir = super::files::regular::make_deleted_dir(pid, old)?;
            let name = dir.name.clone();
            let entered = std::env::set_current_dir(&name).map_err(|e| {
                EngineError::io(format!("changing directory to {name} (the removed cwd)"), e)
            });
            dir.remove()
                .map_err(|e| EngineError::io(format!("removing the remade cwd {name} again"), e))?;
            entered?;
        }
        None => std::env::set_current_dir(&img.cwd)
            .map_err(|e| EngineError::io(format!("changing directory to {}", img.cwd), e))?,
    }
    if let Some(root) = &img.root {
        std::os::unix::fs::chroot(root)
            .map_err(|e| EngineError::io(format!("chroot to {root}"), e))?;
    }
    close_all_but(&plan.keep);
    if img.no_new_privs {
        let _ = process::set_no_new_privs();
    }
    Ok(())
}

/// Never returns: reports failure through the status pipe and exits, or
/// stops itself for ferry to continue.
pub fn run(plan: ChildPlan) -> ! {
    let mut byte = [0u8; 1];
    let _ = std::fs::File::from(plan.go.try_clone().unwrap_or_else(|_| exit(3))).read(&mut byte);
    match setup(&plan) {
        Ok(()) => {
            // Closing our copy of the status pipe signals success.
            drop(plan.status);
            // Stop ourselves; the tracer sees the stop and takes over.
            let _ = process::kill(std::process::id() as i32, libc::SIGSTOP);
            exit(4)
        }
        Err(e) => {
            let mut f = std::fs::File::from(plan.status);
            let _ = f.write_all(e.to_string().as_bytes());
            exit(1)
        }
    }
}

/// _exit: skips the atexit handlers that belong to the parent ferry process.
fn exit(code: i32) -> ! {
    process::exit_now(code)
}
