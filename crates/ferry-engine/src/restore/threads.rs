//! Threads: created with their old TIDs (clone3 + set_tid injected into
//! the leader), then each gets its robust list, rseq area, alternate
//! signal stack, clear_child_tid, name, and finally registers, XSAVE state
//! and signal mask.

use super::Session;
use crate::error::{EngineError, Result};
use crate::inject::Call;
use crate::syscall_restart;
use ferry_image::ThreadImage;
use ferry_sys::ptrace::{self, WaitEvent};

const THREAD_FLAGS: u64 = (libc::CLONE_VM
    | libc::CLONE_FS
    | libc::CLONE_FILES
    | libc::CLONE_SIGHAND
    | libc::CLONE_THREAD
    | libc::CLONE_SYSVSEM) as u64;
const RSEQ_FLAG_UNREGISTER: u64 = 1;
const PR_SET_NAME: u64 = 15;
const PR_SET_TIMERSLACK: u64 = 29;

pub fn block_signals(pid: i32, tid: i32) -> Result<()> {
    ptrace::set_sigmask(tid, !0)
        .map_err(|e| EngineError::kernel(pid, format!("blocking signals of thread {tid}"), e))
}

/// The fork inherited ferry's own rseq registration; it points into
/// memory that is about to disappear. The call that drops it, for the
/// root to make before that memory goes (none: nothing registered).
pub fn inherited_rseq_drop(pid: i32) -> Result<Option<(String, Call)>> {
    let conf = ptrace::get_rseq_config(pid)
        .map_err(|e| EngineError::kernel(pid, "reading rseq configuration", e))?;
    if conf.rseq_abi_pointer == 0 {
        return Ok(None);
    }
    let args = [
        conf.rseq_abi_pointer,
        conf.rseq_abi_size as u64,
        RSEQ_FLAG_UNREGISTER,
        conf.signature as u64,
    ];
    Ok(Some(("rseq(unregister)".into(), Call::new(libc::SYS_rseq, &args))))
}

/// Creates every thread but the leader; returns their TIDs.
pub fn create_threads(s: &mut Session) -> Result<Vec<i32>> {
    let pid = s.pid;
    let mut tids = Vec::new();
    for t in &s.image.threads[1..] {
        let tid_at = s.data + 256;
        let mut args = ferry_sys::clone::CloneArgs {
            flags: THREAD_FLAGS,
            set_tid: tid_at,
            set_tid_size: 1,
            ..Default::default()
        };
        args.exit_signal = 0;
        let bytes = args.to_bytes();
        s.remote.write(s.data, &bytes)?;
        s.remote.write(tid_at, &t.tid.to_le_bytes())?;
        let r = s.remote.raw(pid, libc::SYS_clone3, &[s.data, bytes.len() as u64])?;
        if r == -(libc::EEXIST as i64) {
            return Err(EngineError::PidTaken { pid: t.tid, holder: super::pid_holder(t.tid) });
        }
        if r < 0 {
            return Err(EngineError::Remote {
                pid,
                tid: pid,
                call: format!("clone3(thread {})", t.tid),
                errno: (-r) as i32,
            });
        }
        let new = r as i32;
        loop {
            match ptrace::wait_tid(new, 0)
                .map_err(|e| EngineError::kernel(pid, format!("waiting for new thread {new}"), e))?
            {
                Some((_, WaitEvent::Stopped { .. })) => break,
                Some(other) => {
                    return Err(EngineError::restore(pid, format!("new thread {new}: {other:?}")))
                }
                None => {}
            }
        }
        block_signals(pid, new)?;
        crate::inject::colocate(new);
        tids.push(new);
    }
    Ok(tids)
}

/// Per-thread kernel state, set from inside the thread in one batch,
/// after `before` (calls of the process the leader runs in the same
/// batch, their arguments clear of the thread's at `s.data`).
pub fn restore_thread_state(
    s: &mut Session,
    t: &ThreadImage,
    before: Vec<(String, Call)>,
) -> Result<()> {
    let tid = t.tid;
    let mut calls: Vec<(String, Call)> = before;
    let mut data = Vec::new();
    if t.robust_list.head != 0 {
        calls.push((
            "set_robust_list".into(),
            Call::new(libc::SYS_set_robust_list, &[t.robust_list.head, t.robust_list.len]),
        ));
    }
    if let Some(rs) = &t.rseq {
        calls.push((
            "rseq".into(),
            Call::new(libc::SYS_rseq, &[rs.addr, rs.len as u64, 0, rs.signature as u64]),
        ));
    }
    // A new thread (and the child, which reset it) starts with no
    // alternate stack, no clear_child_tid and the leader's name.
    if t.altstack.flags & libc::SS_DISABLE == 0 {
        let at = s.data + data.len() as u64;
        data.extend_from_slice(&t.altstack.sp.to_le_bytes());
        data.extend_from_slice(&((t.altstack.flags & !libc::SS_ONSTACK) as u64).to_le_bytes());
        data.extend_from_slice(&t.altstack.size.to_le_bytes());
        calls.push(("sigaltstack".into(), Call::new(libc::SYS_sigaltstack, &[at, 0])));
    }
    if t.clear_child_tid != 0 {
        calls.push((
            "set_tid_address".into(),
            Call::new(libc::SYS_set_tid_address, &[t.clear_child_tid]),
        ));
    }
    if t.timer_slack_ns != 0 {
        calls.push((
            "prctl(PR_SET_TIMERSLACK)".into(),
            Call::new(libc::SYS_prctl, &[PR_SET_TIMERSLACK, t.timer_slack_ns]),
        ));
    }
    // Set whatever the thread is called now: one call more in a batch
    // that runs anyway costs less than reading its name from /proc.
    let at = s.data + data.len() as u64;
    let mut name = t.comm.as_bytes().to_vec();
    name.truncate(15);
    name.resize(16, 0);
    data.extend_from_slice(&name);
    calls.push(("prctl(PR_SET_NAME)".into(), Call::new(libc::SYS_prctl, &[PR_SET_NAME, at])));
    s.remote.write(s.data, &data)?;
    s.run(tid, &calls)?;
    // An interrupted relative sleep resumes with the time it had left.
    if let (Some(ns), Some(regs)) =
        (t.sleep_remaining_ns, ferry_sys::process::words_to_regs(&t.regs))
    {
        if let Some((req, _)) = syscall_restart::sleep_request_ptr(&regs) {
            let mut ts = Vec::with_capacity(16);
            ts.extend_from_slice(&(ns / 1_000_000_000).to_le_bytes());
            ts.extend_from_slice(&(ns % 1_000_000_000).to_le_bytes());
            s.remote.write(req, &ts)?;
        }
    }
    Ok(())
}

pub fn set_final_registers(pid: i32, t: &ThreadImage) -> Result<()> {
    let tid = t.tid;
    let mut regs = ferry_sys::process::words_to_regs(&t.regs)
        .ok_or_else(|| EngineError::restore(pid, format!("thread {tid}: bad register set")))?;
    syscall_restart::restart_after_restore(&mut regs);
    // No injected call follows: the thread's own CPU mask stays.
    crate::inject::forget_colocated(tid);
    let kerr = |what: &str, e| EngineError::kernel(pid, format!("thread {tid}: {what}"), e);
    ptrace::set_regs(tid, &regs).map_err(|e| kerr("setting registers", e))?;
    ptrace::set_xstate(tid, &t.xstate).map_err(|e| kerr("setting XSAVE state", e))?;
    ptrace::set_sigmask(tid, t.sigmask).map_err(|e| kerr("setting signal mask", e))?;
    let s = &t.sched;
    let sched = ferry_sys::process::Sched {
        policy: s.policy,
        rt_priority: s.rt_priority,
        nice: s.nice,
        cpus: s.cpus.clone(),
    };
    ferry_sys::process::set_sched(tid, &sched)
        .map_err(|e| kerr("setting scheduling attributes", e))?;
    Ok(())
}
