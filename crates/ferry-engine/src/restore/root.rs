//! Phase "fork root": the tree's root is forked from ferry under its old
//! PID (clone3 with set_tid), sets up its session and directory itself
//! ([`child`](super::child)) and stops under ptrace; then it is readied
//! to be driven by injected syscalls.

use super::held::TreeGuard;
use super::stage::{lift_fd, Staged};
use super::{child, memory, threads, Session};
use crate::error::{EngineError, Result};
use crate::inject::{self, Scratch};
use ferry_image::TreeImage;
use ferry_sys::ptrace::{self, WaitEvent};
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, RawFd};

/// Forks the root with its PID and waits until it stops; returns the
/// guard that kills what was made if a later phase fails.
pub(super) fn fork_root(tree: &TreeImage, staged: &Staged) -> Result<TreeGuard> {
    let root = tree.root().ok_or_else(|| EngineError::restore(0, "image holds no process"))?;
    let pid = root.pid;
    let pipe = || {
        ferry_sys::fd::pipe2(libc::O_CLOEXEC)
            .map_err(|e| EngineError::kernel(pid, "creating a pipe", e))
    };
    let (go_r, go_w) = pipe()?;
    let (st_r, st_w_low) = pipe()?;
    let st_w = lift_fd(pid, st_w_low.as_raw_fd(), staged.temp_base, "the status pipe")?;
    // Only the lifted copy may stay open: the status pipe reads EOF once
    // the child and ferry have closed every write end.
    drop(st_w_low);
    let mut keep: Vec<RawFd> = staged.staging.keep_fds();
    keep.extend(staged.raw.values().copied());
    keep.push(st_w.as_raw_fd());
    keep.extend(staged.netns_fd());

    let loginuid = super::process::root_loginuid(tree, root)?;
    super::loader::before_fork();
    // ferry-sys refuses the fork unless ferry is single-threaded here, so
    // the child may run ordinary Rust code.
    let forked = super::retry_while_released(pid, || ferry_sys::clone::fork_with_pid(pid));
    let child_pid = match forked {
        Ok(0) => child::run(child::ChildPlan {
            image: root,
            keep,
            netns: staged.netns_fd(),
            uts: tree.uts.as_ref(),
            loginuid,
            go: go_r,
            status: st_w,
        }),
        Ok(p) => p,
        Err(e) if e.errno == libc::EEXIST => {
            return Err(EngineError::PidTaken { pid, holder: super::pid_holder(pid) });
        }
        Err(e) => return Err(EngineError::kernel(pid, "creating the process with its PID", e)),
    };
    let guard = TreeGuard::new(child_pid);
    drop(st_w);
    drop(go_r);
    ptrace::seize(
        child_pid,
        ptrace::PTRACE_O_TRACECLONE | ptrace::PTRACE_O_TRACEFORK | ptrace::PTRACE_O_EXITKILL,
    )
    .map_err(|e| EngineError::kernel(pid, "seizing the new process", e))?;
    inject::colocate(child_pid);
    std::fs::File::from(go_w).write_all(b"g").map_err(|e| EngineError::io("restore go pipe", e))?;
    let mut msg = String::new();
    std::fs::File::from(st_r)
        .read_to_string(&mut msg)
        .map_err(|e| EngineError::io("restore status pipe", e))?;
    if !msg.is_empty() {
        return Err(EngineError::restore(pid, msg));
    }
    match ptrace::wait_tid(child_pid, 0)
        .map_err(|e| EngineError::kernel(pid, "waiting for the new process", e))?
    {
        Some((_, WaitEvent::Stopped { sig: libc::SIGSTOP, .. })) => Ok(guard),
        other => Err(EngineError::restore(
            pid,
            format!("new process did not stop as expected: {other:?}"),
        )),
    }
}

/// The root's session, before it is driven: it still runs ferry's forked
/// copy, so the CPU is checked, its rseq registration dropped and the
/// scratch area placed where no process of the tree has anything (every
/// forked child inherits it at a free address).
pub(super) fn root_session<'a>(
    tree: &'a TreeImage,
    staging: &'a super::staging::StagingMap,
) -> Result<Session<'a>> {
    let root = tree.root().ok_or_else(|| EngineError::restore(0, "image holds no process"))?;
    let pid = root.pid;
    // ferry's mappings as the fork copied them, read once.
    let maps = crate::procfs::maps(pid)?;
    let vdso = vdso_of(pid, &maps)?;
    let remote = inject::Remote {
        pid,
        syscall_ip: inject::find_syscall_insn(pid, vdso.0, vdso.1)?,
        settle: false,
    };
    let mut s = Session { pid, image: root, remote, scratch: 0, data: 0, staging, forked: None };
    threads::block_signals(pid, pid)?;
    let xs =
        ptrace::get_xstate(pid).map_err(|e| EngineError::kernel(pid, "reading XSAVE layout", e))?;
    let want = s.image.threads[0].xstate.len();
    if xs.len() != want {
        return Err(EngineError::restore(
            pid,
            format!(
                "image has a {want}-byte XSAVE area, this CPU {} bytes: restore on the same kind of CPU",
                xs.len()
            ),
        ));
    }
    let rseq_drop = threads::inherited_rseq_drop(pid)?;
    let at = memory::free_gap(
        pid,
        tree.processes.iter().flat_map(|p| p.vmas.iter()),
        &maps,
        inject::SCRATCH_LEN,
    )?;
    let scratch = Scratch::map_at(&s.remote, pid, at)?;
    s.scratch = scratch.addr;
    s.data = scratch.addr + inject::SCRATCH_DATA;
    s.forked = Some(Forked { maps, rseq_drop });
    Ok(s)
}

/// What the root brought from ferry by its fork.
pub(crate) struct Forked {
    /// Its mappings, read once in [`root_session`] and used by the
    /// clearing instead of reading /proc/PID/maps again: between the two
    /// only the scratch mapping is made, which the clearing leaves anyway.
    pub maps: Vec<crate::procfs::MapsEntry>,
    /// The call that drops ferry's rseq registration (its area is in
    /// ferry's memory, about to be unmapped), made first in the clearing's
    /// batch rather than single-stepped on its own.
    pub rseq_drop: Option<(String, inject::Call)>,
}

/// The [vdso] of the root, a fork of ferry (ferry's own, at the same place).
fn vdso_of(pid: i32, maps: &[crate::procfs::MapsEntry]) -> Result<(u64, u64)> {
    maps.iter()
        .find(|m| m.path == "[vdso]")
        .map(|m| (m.start, m.end))
        .ok_or_else(|| EngineError::restore(pid, "the forked root has no [vdso] mapping"))
}
