//! Forking the tree: every process but the root is forked from its
//! restored parent with an injected clone3 (set_tid picks its PID), after
//! the parent's memory is in place, so private pages the two still shared
//! at checkpoint time are shared again (copy-on-write) instead of copied.
//! The child then gets its session, process group, directory and fd table
//! from injected calls, and zombies are forked and made to exit.

use super::Session;
use crate::error::{EngineError, Result};
use crate::inject::Call;
use ferry_image::{ProcessImage, Zombie};
use ferry_sys::ptrace::{self, WaitEvent};

/// Forks `pid` from the process of `parent` (which must be stopped and
/// single-threaded). Returns once the child is in its first ptrace stop.
pub fn fork_from(parent: &mut Session, pid: i32, exit_signal: i32, flags: u64) -> Result<i32> {
    let tid_at = parent.data + 256;
    let args = ferry_sys::clone::CloneArgs {
        flags,
        exit_signal: exit_signal as u64,
        set_tid: tid_at,
        set_tid_size: 1,
        ..Default::default()
    };
    let bytes = args.to_bytes();
    parent.remote.write(parent.data, &bytes)?;
    parent.remote.write(tid_at, &pid.to_le_bytes())?;
    let clone3 = || {
        let r = parent.remote.raw(parent.pid, libc::SYS_clone3, &[parent.data, bytes.len() as u64]);
        match r {
            Ok(r) if r == -(libc::EEXIST as i64) => {
                Err(ferry_sys::SysError { call: "clone3", errno: libc::EEXIST })
            }
            other => Ok(other),
        }
    };
    let r = match super::retry_while_released(pid, clone3) {
        Ok(r) => r?,
        Err(_) => -(libc::EEXIST as i64),
    };
    if r == -(libc::EEXIST as i64) {
        return Err(EngineError::PidTaken { pid, holder: super::pid_holder(pid) });
    }
    if r < 0 {
        return Err(EngineError::Remote {
            pid: parent.pid,
            tid: parent.pid,
            call: format!("clone3(child {pid})"),
            errno: (-r) as i32,
        });
    }
    let child = r as i32;
    loop {
        match ptrace::wait_tid(child, 0)
            .map_err(|e| EngineError::kernel(pid, "waiting for the forked process", e))?
        {
            Some((_, WaitEvent::Stopped { .. })) => break,
            Some(other) => {
                return Err(EngineError::restore(pid, format!("forked process: {other:?}")))
            }
            None => {}
        }
    }
    ptrace::set_sigmask(child, !0).map_err(|e| EngineError::kernel(pid, "blocking signals", e))?;
    crate::inject::colocate(child);
    Ok(child)
}

/// Session, process group, umask, personality, root and working
/// directory of a forked child, from inside it.
pub fn setup_identity(s: &mut Session, parent: &ProcessImage) -> Result<()> {
    let img = s.image;
    let pid = img.pid;
    let mut calls: Vec<(String, Call)> = Vec::new();
    if img.sid == pid {
        calls.push(("setsid".into(), Call::new(libc::SYS_setsid, &[])));
    } else if img.sid != parent.sid {
        return Err(EngineError::restore(
            pid,
            format!("its session {} is neither its own nor its parent's ({})", img.sid, parent.sid),
        ));
    } else if img.pgid == pid {
        calls.push(("setpgid(0, 0)".into(), Call::new(libc::SYS_setpgid, &[0, 0])));
    }
    // Joining another process's group waits for join_group: its leader
    // may be forked later (a sibling, a zombie).
    calls.push(("umask".into(), Call::new(libc::SYS_umask, &[img.umask as u64])));
    if img.personality != parent.personality {
        calls.push((
            "personality".into(),
            Call::new(libc::SYS_personality, &[img.personality as u64]),
        ));
    }
    let mut data = Vec::new();
    let path_arg = |p: &str, data: &mut Vec<u8>| {
        let at = s.data + data.len() as u64;
        data.extend_from_slice(p.as_bytes());
        data.push(0);
        at
    };
    // The directory first: its path is as seen from ferry's root. A
    // removed one is made again for the chdir and removed right after.
    let removed_cwd = match img.cwd.strip_suffix(" (deleted)") {
        Some(old) => Some(super::files::regular::make_deleted_dir(pid, old)?),
        None => None,
    };
    let cwd = removed_cwd.as_ref().map_or(img.cwd.as_str(), |d| d.name.as_str());
    let at = path_arg(cwd, &mut data);
    calls.push((format!("chdir({cwd})"), Call::new(libc::SYS_chdir, &[at])));
    if img.root != parent.root {
        let root = img.root.clone().unwrap_or_else(|| "/".into());
        let at = path_arg(&root, &mut data);
        calls.push((format!("chroot({root})"), Call::new(libc::SYS_chroot, &[at])));
    }
    if img.no_new_privs && !parent.no_new_privs {
        calls.push((
            "prctl(PR_SET_NO_NEW_PRIVS)".into(),
            Call::new(libc::SYS_prctl, &[libc::PR_SET_NO_NEW_PRIVS as u64, 1, 0, 0, 0]),
        ));
    }
    let ran = s.remote.write(s.data, &data).and_then(|()| s.run(pid, &calls));
    if let Some(dir) = removed_cwd {
        let name = dir.name.clone();
        dir.remove().map_err(|e| {
            EngineError::io(format!("pid {pid}: removing the remade cwd {name} again"), e)
        })?;
    }
    ran?;
    Ok(())
}

/// Moves a process into the group of another process of the tree, once
/// every process and zombie exists (see setup_identity). Also for a
/// group its parent was moved into: the fork gave it the parent's group
/// of before the move.
pub fn join_group(s: &mut Session) -> Result<()> {
    let pgid = s.image.pgid;
    s.call(&format!("setpgid(0, {pgid})"), libc::SYS_setpgid, &[0, pgid as u64])?;
    Ok(())
}

/// Forks zombie `z` from its parent and lets it exit with its old status,
/// so the parent can reap it as it would have. The SIGCHLD this sends the
/// parent is taken back: the parent's pending signals come from the image.
/// `leaders`: the processes and zombies of the tree that lead their own
/// group; zombies that lead one must be made before those that join it.
pub fn make_zombie(
    parent: &mut Session,
    z: &Zombie,
    leaders: &std::collections::HashSet<i32>,
) -> Result<()> {
    let child = fork_from(parent, z.pid, libc::SIGCHLD, 0)?;
    join_zombie_group(parent, z, child, leaders)?;
    if z.wait_status & 0x7f != 0 {
        // No core dump for a zombie that dies of a signal: not dumpable
        // stops a dump through a core_pattern pipe too, which RLIMIT_CORE
        // 0 does not (the checkpoint refused a zombie that had dumped).
        let own = crate::inject::Remote { pid: z.pid, ..parent.remote };
        let dumpable = [libc::PR_SET_DUMPABLE as u64, 0, 0, 0, 0];
        own.call(child, "prctl(PR_SET_DUMPABLE, 0)", libc::SYS_prctl, &dumpable)?;
    }
    let_zombie_exit(parent, z, child)?;
    // The zombie is the parent's to reap; wait until it is one.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        if crate::procfs::state(z.pid) == Some('Z') {
            break;
        }
        if std::time::Instant::now() > deadline {
            return Err(EngineError::restore(z.pid, "zombie did not exit"));
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    take_sigchld_back(parent)
}

/// Its own session or process group, or the group of another process
/// of the tree, before it exits: waitpid(-pgid) and kill(-pgid) find
/// zombies by group (the checkpoint refused any other case).
fn join_zombie_group(
    parent: &Session,
    z: &Zombie,
    child: i32,
    leaders: &std::collections::HashSet<i32>,
) -> Result<()> {
    let own = crate::inject::Remote { pid: z.pid, ..parent.remote };
    if z.sid == z.pid {
        own.call(child, "setsid", libc::SYS_setsid, &[])?;
    } else if z.sid != parent.image.sid {
        return Err(EngineError::restore(
            z.pid,
            format!(
                "zombie: its session {} is neither its own nor its parent's ({})",
                z.sid, parent.image.sid
            ),
        ));
    } else if z.pgid == z.pid || leaders.contains(&z.pgid) {
        let to = if z.pgid == z.pid { 0 } else { z.pgid as u64 };
        own.call(child, &format!("setpgid(0, {})", z.pgid), libc::SYS_setpgid, &[0, to])?;
    }
    Ok(())
}

/// Lets the stopped child exit as the zombie did: exit_group with its
/// status, or the signal that killed it.
fn let_zombie_exit(parent: &Session, z: &Zombie, child: i32) -> Result<()> {
    let kerr = |what: &str, e| EngineError::kernel(z.pid, format!("zombie: {what}"), e);
    let sig = z.wait_status & 0x7f;
    if sig == 0 {
        let mut regs = ptrace::get_regs(child).map_err(|e| kerr("reading registers", e))?;
        regs.rax = libc::SYS_exit_group as u64;
        regs.orig_rax = u64::MAX;
        regs.rdi = ((z.wait_status >> 8) & 0xff) as u64;
        regs.rip = parent.remote.syscall_ip;
        ptrace::set_regs(child, &regs).map_err(|e| kerr("setting registers", e))?;
        ptrace::set_sigmask(child, !0).map_err(|e| kerr("blocking signals", e))?;
        ptrace::detach(child, 0).map_err(|e| kerr("releasing", e))?;
    } else if sig == libc::SIGKILL {
        // SIGKILL ends a traced child at once, in its ptrace stop: there
        // is nothing left to detach (zdtm zombie00 failed here with
        // ESRCH). Its exit is reported to ferry, the tracer, first; the
        // parent sees the zombie only once ferry has waited for it.
        ferry_sys::process::kill(child, sig).map_err(|e| kerr("sending SIGKILL", e))?;
        reap_as_tracer(z.pid, child)?;
    } else {
        // PTRACE_DETACH's signal only counts from a signal-delivery stop,
        // which this is not: queue the signal, then let the child go. It
        // takes the signal before running anything (its handlers are all
        // SIG_DFL since the fork reset them).
        ptrace::set_sigmask(child, 0).map_err(|e| kerr("unblocking signals", e))?;
        ferry_sys::process::kill(child, sig).map_err(|e| kerr("sending its signal", e))?;
        ptrace::detach(child, 0).map_err(|e| kerr("releasing", e))?;
    }
    Ok(())
}

/// Waits, as its tracer, for a traced child that is dying: the wait hands
/// the zombie over to its real parent (which gets its SIGCHLD then). A
/// stop on the way out is let go.
fn reap_as_tracer(pid: i32, child: i32) -> Result<()> {
    loop {
        match ptrace::wait_tid(child, 0)
            .map_err(|e| EngineError::kernel(pid, "zombie: waiting for its death", e))?
        {
            Some((_, WaitEvent::Exited(_) | WaitEvent::Signaled(_))) => return Ok(()),
            Some((_, WaitEvent::Stopped { .. })) => {
                let _ = ptrace::cont(child, 0);
            }
            None => {}
        }
    }
}

/// rt_sigtimedwait({SIGCHLD}, NULL, {0, 0}) in the parent: take the
/// SIGCHLD of the zombie's exit back.
fn take_sigchld_back(parent: &mut Session) -> Result<()> {
    let mask = 1u64 << (libc::SIGCHLD - 1);
    let mut data = mask.to_le_bytes().to_vec();
    data.extend_from_slice(&[0u8; 16]);
    parent.remote.write(parent.data, &data)?;
    let r = parent.remote.raw(
        parent.pid,
        libc::SYS_rt_sigtimedwait,
        &[parent.data, 0, parent.data + 8, 8],
    )?;
    if r < 0 && r != -(libc::EAGAIN as i64) {
        return Err(EngineError::Remote {
            pid: parent.pid,
            tid: parent.pid,
            call: "rt_sigtimedwait(SIGCHLD)".into(),
            errno: (-r) as i32,
        });
    }
    Ok(())
}
