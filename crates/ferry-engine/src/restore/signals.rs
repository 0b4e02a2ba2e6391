//! Signal dispositions and pending signals. Pending signals are queued
//! last, while every thread still blocks everything, so they are delivered
//! only once the process runs under its own masks.

use super::Session;
use crate::error::Result;
use crate::inject::{check, Call};

/// Sets every disposition that differs from the default (the child reset
/// all of them to SIG_DFL before stopping), in one injected batch.
pub fn restore_actions(s: &mut Session) -> Result<()> {
    let mut calls = Vec::new();
    let mut args = Vec::new();
    for (i, a) in s.image.signals.actions.iter().enumerate() {
        let sig = i as u64 + 1;
        if sig == libc::SIGKILL as u64
            || sig == libc::SIGSTOP as u64
            || (a.handler == 0 && a.flags == 0 && a.mask == 0)
        {
            continue;
        }
        let at = s.data + args.len() as u64;
        args.extend([a.handler, a.flags, a.restorer, a.mask].iter().flat_map(|w| w.to_le_bytes()));
        calls.push((sig, Call::new(libc::SYS_rt_sigaction, &[sig, at, 0, 8])));
    }
    s.remote.write(s.data, &args)?;
    let only: Vec<Call> = calls.iter().map(|c| c.1).collect();
    let results = s.remote.batch(s.pid, s.scratch, &only)?;
    for ((sig, _), r) in calls.iter().zip(results) {
        check(s.pid, s.pid, &format!("rt_sigaction({sig})"), r)?;
    }
    Ok(())
}

fn signo(info: &[u8]) -> u64 {
    i32::from_le_bytes([info[0], info[1], info[2], info[3]]) as u64
}

/// The kernel only accepts a forged siginfo from the target itself: the
/// process-wide queue is filled from the leader, each thread's queue from
/// that thread.
pub fn queue_pending(s: &mut Session) -> Result<()> {
    let pid = s.pid as u64;
    let shared = &s.image.signals.shared_pending;
    let mut queues: Vec<(i32, Vec<Call>, Vec<u8>)> = Vec::new();
    let mut lead = (s.pid, Vec::new(), Vec::new());
    for info in shared {
        lead.1.push(Call::new(
            libc::SYS_rt_sigqueueinfo,
            &[pid, signo(info), s.data + lead.2.len() as u64],
        ));
        lead.2.extend_from_slice(info);
    }
    queues.push(lead);
    for t in &s.image.threads {
        let mut q = (t.tid, Vec::new(), Vec::new());
        for info in &t.pending {
            q.1.push(Call::new(
                libc::SYS_rt_tgsigqueueinfo,
                &[pid, t.tid as u64, signo(info), s.data + q.2.len() as u64],
            ));
            q.2.extend_from_slice(info);
        }
        queues.push(q);
    }
    for (tid, calls, buf) in queues {
        if calls.is_empty() {
            continue;
        }
        s.remote.write(s.data, &buf)?;
        for r in s.remote.batch(tid, s.scratch, &calls)? {
            check(s.pid, tid, "queueing a pending signal", r)?;
        }
    }
    Ok(())
}
