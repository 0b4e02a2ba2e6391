//! Per-thread state: registers, XSAVE area, signal mask, pending signals,
//! alternate signal stack, rseq, robust futex list, clear_child_tid, name,
//! and what is left of an interrupted sleep.

use super::Ctx;
use crate::error::{EngineError, Result};
use crate::freeze::FrozenThread;
use crate::inject::{check, Call};
use crate::procfs;
use crate::syscall_restart;
use ferry_image::{AltStack, RobustList, Rseq, Sched, ThreadImage};
use ferry_sys::ptrace;

const PR_GET_TID_ADDRESS: u64 = 40;
const PR_GET_TIMERSLACK: u64 = 30;

fn u64_at(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(b[off..off + 8].try_into().expect("8 bytes"))
}

/// What the tracer reads of a thread itself, before its injected calls.
pub(super) struct Traced {
    xstate: Vec<u8>,
    pending: Vec<Vec<u8>>,
    rseq: Option<Rseq>,
    robust_list: RobustList,
    sched: Sched,
}

pub(super) fn traced(pid: i32, tid: i32) -> Result<Traced> {
    let kerr = |what: &str, e| EngineError::kernel(pid, format!("thread {tid}: {what}"), e);
    let xstate = ptrace::get_xstate(tid).map_err(|e| kerr("reading XSAVE state", e))?;
    let pending =
        ptrace::peek_siginfo(tid, false).map_err(|e| kerr("reading pending signals", e))?;
    let rseq = ptrace::get_rseq_config(tid).map_err(|e| kerr("reading rseq configuration", e))?;
    let (head, len) = ferry_sys::process::get_robust_list(tid)
        .map_err(|e| kerr("reading robust futex list", e))?;
    let s =
        ferry_sys::process::get_sched(tid).map_err(|e| kerr("reading scheduling attributes", e))?;
    check_sched_extra(pid, tid)?;
    Ok(Traced {
        xstate,
        pending: pending.iter().map(|s| s.to_vec()).collect(),
        rseq: (rseq.rseq_abi_pointer != 0).then_some(Rseq {
            addr: rseq.rseq_abi_pointer,
            len: rseq.rseq_abi_size,
            signature: rseq.signature,
        }),
        robust_list: RobustList { head, len },
        sched: Sched { policy: s.policy, rt_priority: s.rt_priority, nice: s.nice, cpus: s.cpus },
    })
}

/// Bytes of the data area the thread's calls write, from their `at`.
pub(super) const DATA_LEN: usize = 40;

/// How many calls [`calls`] makes.
pub(super) const CALLS: usize = 3;

/// The calls only the thread can make about itself, their results at
/// `at` (see [`DATA_LEN`]); run in the thread's one batch.
pub(super) fn calls(at: u64) -> Vec<Call> {
    vec![
        Call::new(libc::SYS_sigaltstack, &[0, at]),
        Call::new(libc::SYS_prctl, &[PR_GET_TID_ADDRESS, at + 32]),
        Call::new(libc::SYS_prctl, &[PR_GET_TIMERSLACK]),
    ]
}

/// The thread's image from what the tracer read, the results of
/// [`calls`] and the data they wrote (`out`, from their `at`).
pub(super) fn finish(
    ctx: &Ctx,
    t: &FrozenThread,
    traced: Traced,
    r: &[i64],
    out: &[u8],
) -> Result<ThreadImage> {
    let (pid, tid) = (ctx.pid, t.tid);
    check(pid, tid, "sigaltstack", r[0])?;
    check(pid, tid, "prctl(PR_GET_TID_ADDRESS)", r[1])?;
    let timer_slack_ns = check(pid, tid, "prctl(PR_GET_TIMERSLACK)", r[2])?;
    let altstack =
        AltStack { sp: u64_at(out, 0), flags: u64_at(out, 8) as i32, size: u64_at(out, 16) };
    let clear_child_tid = u64_at(out, 32);

    let sleep_remaining_ns = match syscall_restart::sleep_request_ptr(&t.regs) {
        Some((req, rem)) => {
            let ts = ctx.remote.read(if rem != 0 { rem } else { req }, 16)?;
            Some(u64_at(&ts, 0).saturating_mul(1_000_000_000).saturating_add(u64_at(&ts, 8)))
        }
        None => None,
    };
    Ok(ThreadImage {
        tid,
        comm: procfs::read_string(&format!("/proc/{pid}/task/{tid}/comm"))?
            .trim_end_matches('\n')
            .to_string(),
        regs: ferry_sys::process::regs_to_words(&t.regs),
        xstate: traced.xstate,
        sigmask: t.sigmask,
        pending: traced.pending,
        altstack,
        rseq: traced.rseq,
        robust_list: traced.robust_list,
        clear_child_tid,
        timer_slack_ns,
        sched: traced.sched,
        sleep_remaining_ns,
    })
}

/// Scheduling state the image has no place for: a SCHED_DEADLINE thread
/// (runtime, deadline, period) and utilization clamps are refused by name
/// rather than lost.
fn check_sched_extra(pid: i32, tid: i32) -> Result<()> {
    let x = ferry_sys::process::get_sched_extra(tid).map_err(|e| {
        EngineError::kernel(pid, format!("thread {tid}: reading scheduling attributes"), e)
    })?;
    if x.policy == ferry_sys::process::SCHED_DEADLINE {
        return Err(EngineError::unsupported(
            pid,
            format!("thread {tid}'s scheduling"),
            format!(
                "SCHED_DEADLINE (runtime {} ns, deadline {} ns, period {} ns) is not restored",
                x.runtime, x.deadline, x.period
            ),
        ));
    }
    let clamped = x.util_min != 0 || (x.util_max != 0 && x.util_max != 1024);
    if clamped {
        return Err(EngineError::unsupported(
            pid,
            format!("thread {tid}'s scheduling"),
            format!(
                "utilization clamps (min {}, max {} of 1024) are not restored",
                x.util_min, x.util_max
            ),
        ));
    }
    Ok(())
}
