//! The end of a restore: the tree complete and held stopped, and its
//! release (the commit point), or its end when dropped.

use super::stage::Staged;
use super::{files, Restored};
use crate::error::{EngineError, Result};
use ferry_image::TreeImage;
use ferry_sys::ptrace;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

/// A restored process held stopped: its PID, its other threads, and
/// whether it was in a job-control stop.
pub(super) struct HeldProcess {
    pub pid: i32,
    pub tids: Vec<i32>,
    pub stopped: bool,
}

/// A restored tree, complete and still stopped under ptrace, its
/// connections in repair mode behind the network lock: nothing of it has
/// run yet. [`Held::release`] lets it run; dropping it kills every process
/// of it, so the service runs in one place only. Built by
/// [`restore_held`](super::restore_held), the last phase's output.
pub struct Held {
    pub(super) pid: i32,
    pub(super) tree: TreeImage,
    pub(super) connections: files::tcp::Made,
    /// Parents before children.
    pub(super) procs: Vec<HeldProcess>,
    /// The staged objects and the network lock, kept until the tree runs.
    pub(super) staged: Staged,
    pub(super) phases: crate::phases::Phases,
    /// Post-copy: (image PID, its userfaultfd) of processes with lazy pages.
    pub(super) uffds: Vec<(i32, OwnedFd)>,
    /// ferry's copies of the pages the root inherited: dropped once the
    /// tree runs, so that its pages are its own (no copy per page on
    /// write) without the unmapping counting in the pause.
    pub(super) placed: ferry_sys::placed::InheritedRegions,
    pub(super) guard: TreeGuard,
}

impl Held {
    /// The root's PID (the image's).
    pub fn pid(&self) -> i32 {
        self.pid
    }

    pub fn phases(&self) -> &crate::phases::Phases {
        &self.phases
    }

    /// Post-copy: (image PID, descriptor in this process) of each
    /// userfaultfd whose registered mappings wait for their pages.
    pub fn lazy_uffds(&self) -> Vec<(i32, RawFd)> {
        self.uffds.iter().map(|(p, f)| (*p, f.as_raw_fd())).collect()
    }

    /// Post-copy: takes the userfaultfds (the caller's pager serves them).
    pub fn take_uffds(&mut self) -> Vec<(i32, OwnedFd)> {
        std::mem::take(&mut self.uffds)
    }

    /// Brings the connections alive and lets every process run.
    pub fn release(self) -> Result<Restored> {
        self.release_then(|_| ())
    }

    /// Like [`Held::release`], calling `running` as soon as every process
    /// runs, before the network lock and the staging are taken down (a
    /// migration reports the service running at that moment).
    pub fn release_then(self, running: impl FnOnce(&Restored)) -> Result<Restored> {
        let Held {
            pid,
            tree,
            connections,
            procs,
            mut staged,
            mut phases,
            uffds,
            placed,
            mut guard,
        } = self;
        let mut lock = staged.lock.take();
        let ph = &mut phases;
        // Ferry's work until every process runs (no fork in it).
        let raised = crate::priority::Raised::new();
        // The connections come alive only now, with every process that
        // owns one in place and still stopped.
        let rebuilt = files::tcp::leave_repair(&tree, &connections)?;
        ph.mark("tcp repair off");
        // The end of the network pause: one map update for the eBPF lock.
        // The lock itself is taken down after the tree runs.
        if let Some(l) = lock.as_mut() {
            l.disengage()?;
        }
        ph.mark("network thaw");
        let probe = window_probes_wanted(&staged, lock.as_ref(), &rebuilt);
        files::tcp::resend(&rebuilt, probe)?;
        files::tcp::give_peer_fins(&rebuilt, pid)?;
        // Before the tree runs, whose writes would count as not sent yet
        // too: a held segment from the peer acknowledges what the old
        // socket had sent, and the rebuilt one counts as sent only once
        // the resend wrote it again; delivered before, the kernel would
        // drop the segment, data and all, as an ACK of data never sent.
        if lock.is_some() && !files::tcp::wait_sent(&rebuilt, std::time::Duration::from_millis(20))
        {
            tracing::debug!("a rebuilt connection had not sent its resent data within 20 ms");
        }
        ph.mark("tcp resend");
        // Every send queue is whole again and every deferred option set:
        // what the processes write now follows it. The packets the lock
        // held are the peers' and reach the sockets below, as packets
        // delayed in the network would: the tree need not wait for them.
        release_processes(&procs)?;
        guard.disarmed = true;
        let threads = tree.processes.iter().map(|p| p.threads.len()).sum();
        // Restored in ferry's own PID namespace: both see the same number.
        let restored = Restored {
            pid: crate::TreePid(pid),
            host_pid: crate::HostPid(pid),
            init_pid: None,
            processes: tree.processes.len(),
            threads,
            total_ms: ph.started().elapsed().as_secs_f64() * 1e3,
        };
        ph.mark("tree released");
        running(&restored);
        if let Some(l) = lock.as_mut() {
            deliver_held(l, pid);
        }
        ph.mark("held packets");
        drop(raised);
        if !placed.is_empty() {
            if let Err(e) = placed.unmap() {
                tracing::warn!("dropping ferry's copy of the placed pages: {e}");
            }
        }
        if let Some(l) = lock.take() {
            if let Err(e) = l.thaw() {
                tracing::warn!("taking the network lock down: {e}");
            }
        }
        ph.mark("network lock removed");
        staged.sysv.keep = true;
        staged.sysv_ipc.keep = true;
        drop(staged);
        drop(connections);
        // The caller took its own copies (the migration's pager).
        drop(uffds);
        Ok(restored)
    }
}

/// Whether the rebuilt connections get a window probe each after the
/// thaw. Each peer learns our window from what the lock kept of the pause
/// (its zero-window probes answered, our window updates sent) when the
/// lock is the image's own and kept everything; otherwise from a probe.
fn window_probes_wanted(
    staged: &Staged,
    lock: Option<&ferry_netlock::NetworkLock>,
    rebuilt: &files::tcp::Rebuilt,
) -> bool {
    let probe = !(staged.lock_from_image
        && lock.is_some_and(ferry_netlock::NetworkLock::kept_every_dropped_packet));
    if !rebuilt.is_empty() {
        tracing::debug!(
            "window probes: {}",
            match probe {
                true => "one per rebuilt connection (the lock may have lost a packet)",
                false => "none (the image's network lock kept every packet it dropped)",
            }
        );
    }
    probe
}

/// Lets every process of the tree run, children first so that a parent
/// never runs while its child is still held.
fn release_processes(procs: &[HeldProcess]) -> Result<()> {
    for HeldProcess { pid: p, tids, stopped } in procs.iter().rev() {
        if *stopped {
            // Queued while every thread is still held: the process takes
            // it on its way out of the ptrace stop, before running any
            // instruction of its own, and enters the job-control stop.
            ferry_sys::process::kill(*p, libc::SIGSTOP)
                .map_err(|e| EngineError::kernel(*p, "stopping it again (SIGSTOP)", e))?;
        }
        for &tid in std::iter::once(p).chain(tids) {
            ptrace::detach(tid, 0)
                .map_err(|e| EngineError::kernel(*p, format!("releasing thread {tid}"), e))?;
        }
    }
    Ok(())
}

/// Sends again what the network lock dropped while the connections were
/// away, in the restored tree's namespace: the peers' data reaches the
/// sockets now and the data the sockets had sent leaves now, instead of
/// after a retransmission timeout. Not fatal: TCP retransmits anyway.
fn deliver_held(lock: &mut ferry_netlock::NetworkLock, root: i32) {
    let netns = ferry_netlock::Netns::Path(format!("/proc/{root}/ns/net").into());
    match lock.deliver_held(Some(&netns)) {
        Ok(n) => tracing::debug!(packets = n, "held packets sent again"),
        Err(e) => tracing::warn!("sending the packets the network lock held: {e}"),
    }
}

/// Kills every process made so far unless disarmed, and reaps what ferry
/// must reap (its child, the root, and every traced process).
pub(super) struct TreeGuard {
    pids: Vec<i32>,
    disarmed: bool,
}

impl Drop for TreeGuard {
    fn drop(&mut self) {
        if self.disarmed || self.pids.is_empty() {
            return;
        }
        // Killing processes this restore created, by PID, then reaping
        // them (traced threads must go before their leader).
        for &pid in self.pids.iter().rev() {
            let _ = ferry_sys::process::kill(pid, libc::SIGKILL);
        }
        for _ in 0..100_000 {
            if !ferry_sys::process::reap_any_thread() {
                break;
            }
        }
    }
}

impl TreeGuard {
    pub fn new(first: i32) -> TreeGuard {
        TreeGuard { pids: vec![first], disarmed: false }
    }

    /// One more process or thread to kill if the restore fails.
    pub fn add(&mut self, pid: i32) {
        self.pids.push(pid);
    }
}
