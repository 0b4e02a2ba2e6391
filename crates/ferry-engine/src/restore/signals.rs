//! Signal dispositions and pending signals. Pending signals are queued
//! last, while every thread still blocks everything, so they are delivered
//! only once the process runs under its own masks.

use super::Session;
use crate::error::Result;
use crate::inject::{check, Call};

/// Where in the argument area the dispositions' arguments go: clear of
/// the other arguments of the batch they join (the leader's state).
const ACTION_ARGS: u64 = 0x6000;

/// The calls that set every disposition that differs from the default
/// (the child reset all of them to SIG_DFL before stopping), their
/// arguments written at `s.data + ACTION_ARGS`; run in the leader's batch.
pub fn action_calls(s: &mut Session) -> Result<Vec<(String, Call)>> {
    let mut calls = Vec::new();
    let mut args = Vec::new();
    let base = s.data + ACTION_ARGS;
    for (i, a) in s.image.signals.actions.iter().enumerate() {
        let sig = i as u64 + 1;
        if sig == libc::SIGKILL as u64
            || sig == libc::SIGSTOP as u64
            || (a.handler == 0 && a.flags == 0 && a.mask == 0)
        {
            continue;
        }
        let at = base + args.len() as u64;
        args.extend([a.handler, a.flags, a.restorer, a.mask].iter().flat_map(|w| w.to_le_bytes()));
        calls.push((
            format!("rt_sigaction({sig})"),
            Call::new(libc::SYS_rt_sigaction, &[sig, at, 0, 8]),
        ));
    }
    s.remote.write(base, &args)?;
    Ok(calls)
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
