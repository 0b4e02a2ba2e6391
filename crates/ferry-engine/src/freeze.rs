//! Stopping every thread of a process and letting it go again.
//!
//! Threads are seized with PTRACE_SEIZE and stopped with PTRACE_INTERRUPT,
//! which leaves their signal state untouched. Until `release` or drop, the
//! process stays stopped; dropping a `Frozen` puts every register set back
//! and detaches, so a capture that fails halfway leaves the process running
//! as before.

use crate::error::{EngineError, Result};
use crate::procfs;
use crate::syscall_restart;
use ferry_sys::ptrace::{self, WaitEvent};
use ferry_sys::Regs;
use std::collections::BTreeMap;
use std::os::fd::OwnedFd;

pub struct FrozenThread {
    pub tid: i32,
    /// Registers as they were when the thread stopped.
    pub regs: Regs,
    pub sigmask: u64,
}

pub struct Frozen {
    pub pid: i32,
    pub pidfd: OwnedFd,
    /// Leader first.
    pub threads: Vec<FrozenThread>,
    /// The process was in a job-control stop (SIGSTOP, SIGTSTP...) when
    /// ferry seized it; detaching leaves it stopped.
    pub stopped: bool,
    released: bool,
}

const ALL_SIGNALS: u64 = !0;

/// Waits until `tid` reports the stop caused by PTRACE_INTERRUPT. Signals
/// that arrive first are delivered to the thread, not lost.
fn wait_interrupt_stop(pid: i32, tid: i32) -> Result<()> {
    loop {
        match ptrace::wait_tid(tid, 0)
            .map_err(|e| EngineError::kernel(pid, format!("waiting for thread {tid} to stop"), e))?
        {
            Some((_, WaitEvent::Stopped { event: ptrace::PTRACE_EVENT_STOP, .. })) => return Ok(()),
            Some((_, WaitEvent::Stopped { sig, .. })) => {
                ptrace::cont(tid, sig).map_err(|e| {
                    EngineError::kernel(pid, format!("passing signal {sig} to thread {tid}"), e)
                })?;
            }
            Some((_, WaitEvent::Exited(_) | WaitEvent::Signaled(_))) => {
                return Err(EngineError::Gone {
                    pid,
                    what: format!("thread {tid} exited while being frozen"),
                })
            }
            None => {}
        }
    }
}

/// PTRACE_SEIZE of thread `tid` of `pid`; false if it is gone already.
fn seize(pid: i32, tid: i32) -> Result<bool> {
    // Seccomp must not act on the syscalls ferry injects (a
    // strict-mode thread would be killed by the first mmap).
    // Not allowed when ferry itself runs under seccomp:
    // filters are then found and refused by capture.
    let attached = match ptrace::seize(tid, ferry_sys::seccomp::PTRACE_O_SUSPEND_SECCOMP) {
        Err(e) if e.errno == libc::EPERM || e.errno == libc::EINVAL => ptrace::seize(tid, 0),
        r => r,
    };
    match attached {
        Ok(()) => Ok(true),
        Err(e) if e.errno == libc::ESRCH => Ok(false),
        // A task that is exiting refuses a tracer with EPERM (a short-lived
        // child such as a shell loop's `sleep`): gone, like ESRCH.
        Err(e) if e.errno == libc::EPERM && exiting(tid) => Ok(false),
        Err(e) if e.errno == libc::EPERM && tid == pid => {
            Err(EngineError::kernel(pid, "seizing the process (is it traced by someone else?)", e))
        }
        Err(e) => Err(EngineError::kernel(pid, format!("seizing thread {tid}"), e)),
    }
}

/// A thread group whose leader exited (pthread_exit from main) while
/// other threads run: the leader cannot be seized (it would fail as
/// EPERM, "traced by someone else?"), and a restore has no way to make
/// a group without its leader. Refused by name before anything stops.
fn check_leader_alive(pid: i32) -> Result<()> {
    if procfs::state(pid) != Some('Z') {
        return Ok(());
    }
    let others = std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| d.flatten().filter(|e| e.file_name() != pid.to_string().as_str()).count())
        .unwrap_or(0);
    if others == 0 {
        return Ok(());
    }
    Err(EngineError::unsupported(
        pid,
        "its main thread",
        format!(
            "the main thread has exited (pthread_exit) while {others} other thread(s) run; a thread group without its leader is not restored"
        ),
    ))
}

/// Whether task `tid` is a zombie, dead, or gone from /proc.
fn exiting(tid: i32) -> bool {
    crate::procfs::state(tid).is_none_or(|s| s == 'Z' || s == 'X')
}

impl Frozen {
    /// Seizes and stops every thread of `pid`, including threads created
    /// while this runs.
    pub fn freeze(pid: i32) -> Result<Frozen> {
        check_leader_alive(pid)?;
        let pidfd = ferry_sys::pidfd::pidfd_open(pid)
            .map_err(|e| EngineError::kernel(pid, "opening a pidfd", e))?;
        let stopped = procfs::state(pid) == Some('T');
        let mut frozen = Frozen { pid, pidfd, threads: Vec::new(), stopped, released: false };
        let mut seized: BTreeMap<i32, ()> = BTreeMap::new();
        loop {
            let mut new = false;
            for tid in procfs::tids(pid)? {
                if seized.contains_key(&tid) {
                    continue;
                }
                if !seize(pid, tid)? {
                    continue;
                }
                seized.insert(tid, ());
                new = true;
                frozen.stop_thread(tid)?;
            }
            if !new {
                break;
            }
        }
        if frozen.threads.first().map(|t| t.tid) != Some(pid) {
            return Err(EngineError::Gone { pid, what: "thread group leader not found".into() });
        }
        // Injected syscalls must not be cut short by signal delivery:
        // block everything while we work; signals stay queued.
        for t in &frozen.threads {
            ptrace::set_sigmask(t.tid, ALL_SIGNALS).map_err(|e| {
                EngineError::kernel(pid, format!("blocking signals of thread {}", t.tid), e)
            })?;
        }
        Ok(frozen)
    }

    /// Interrupts the seized thread `tid`, waits until it stops and records
    /// its registers and signal mask.
    fn stop_thread(&mut self, tid: i32) -> Result<()> {
        let pid = self.pid;
        ptrace::interrupt(tid)
            .map_err(|e| EngineError::kernel(pid, format!("interrupting thread {tid}"), e))?;
        if let Err(e) = wait_interrupt_stop(pid, tid) {
            // Detach the ones already stopped via Drop.
            self.threads.retain(|t| t.tid != tid);
            return Err(e);
        }
        let regs = ptrace::get_regs(tid).map_err(|e| {
            EngineError::kernel(pid, format!("reading registers of thread {tid}"), e)
        })?;
        let sigmask = ptrace::get_sigmask(tid).map_err(|e| {
            EngineError::kernel(pid, format!("reading signal mask of thread {tid}"), e)
        })?;
        self.threads.push(FrozenThread { tid, regs, sigmask });
        Ok(())
    }

    /// Lets the process run on from where it stopped.
    pub fn release(mut self) -> Result<()> {
        self.released = true;
        self.detach_all()
    }

    /// Kills the process (after a successful capture) and waits for it to
    /// be gone, so its resources (ports, files) are free for a restore.
    pub fn kill(mut self) -> Result<()> {
        self.released = true;
        ferry_sys::pidfd::pidfd_send_signal(&self.pidfd, libc::SIGKILL)
            .map_err(|e| EngineError::kernel(self.pid, "killing", e))?;
        // The PID comes free only after the address space is torn down,
        // which the dying threads would do one after the other; ferry
        // unmaps it meanwhile (a large tree's kill was most of a
        // replacement's pause). Best effort: the exit frees the rest.
        if let Err(e) = ferry_sys::pidfd::process_mrelease(&self.pidfd) {
            tracing::debug!("kill of {}: {e}", self.pid);
        }
        // Traced threads stay zombies until their tracer (us) reaps them,
        // and the process does not finish exiting before they are gone.
        // Other threads first: the leader's exit is reported only after
        // every other thread of the group is reaped.
        for t in self.threads.iter().rev() {
            loop {
                match ptrace::wait_tid(t.tid, 0) {
                    Ok(Some((_, WaitEvent::Exited(_) | WaitEvent::Signaled(_)))) | Err(_) => break,
                    Ok(_) => {}
                }
            }
        }
        self.threads.clear();
        for _ in 0..500 {
            if ferry_sys::pidfd::wait_exit(&self.pidfd, 20).unwrap_or(true) {
                break;
            }
        }
        Ok(())
    }

    fn detach_all(&mut self) -> Result<()> {
        let mut first_err = None;
        for t in &self.threads {
            let mut regs = t.regs;
            syscall_restart::retry_interrupted_wait(&mut regs);
            let r = ptrace::set_regs(t.tid, &regs)
                .and_then(|_| ptrace::set_sigmask(t.tid, t.sigmask))
                .and_then(|_| ptrace::detach(t.tid, 0));
            if let Err(e) = r {
                first_err.get_or_insert(EngineError::kernel(
                    self.pid,
                    format!("releasing thread {}", t.tid),
                    e,
                ));
            }
        }
        self.threads.clear();
        first_err.map_or(Ok(()), Err)
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        if !self.released {
            if let Err(e) = self.detach_all() {
                tracing::warn!("{e}");
            }
        }
    }
}
