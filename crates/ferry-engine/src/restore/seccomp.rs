//! seccomp: every thread gets its own mode and filters back, the filters
//! in the order they were installed (oldest first).
//!
//! Sharing matters: the kernel lets a later SECCOMP_FILTER_FLAG_TSYNC
//! through only if every other thread's filter is (by identity, not by
//! content) an ancestor of the caller's. So when every thread is in filter
//! mode, the filters at the start of all chains (the ones the threads
//! shared at checkpoint time: inherited over clone or installed with
//! TSYNC) are installed once, from the leader with TSYNC, and each thread
//! then adds the rest of its own chain from inside itself without TSYNC.
//! Sharing that does not span all threads (a filter two of three threads
//! inherited) cannot be rebuilt once the threads exist: those filters
//! become one copy per thread, which filter exactly the same syscalls.
//!
//! The threads are switched to PTRACE_O_SUSPEND_SECCOMP first, so that
//! the filters do not act on what ferry still injects afterwards
//! (credentials, parent-death signals, the scratch unmap); detaching ends
//! the suspension and the process runs confined from its first
//! instruction. Installed while the process still has root's
//! capabilities (a filter needs CAP_SYS_ADMIN or no_new_privs).

use super::Session;
use crate::error::{EngineError, Result};
use crate::inject::Call;
use ferry_sys::ptrace;

const SECCOMP_SET_MODE_FILTER: u64 = 1;
const SECCOMP_FILTER_FLAG_TSYNC: u64 = 1;
const PR_SET_SECCOMP: u64 = 22;
const SECCOMP_MODE_STRICT: u64 = 1;

/// The options restore seizes every process with, plus the suspension.
const OPTIONS: u64 = ptrace::PTRACE_O_TRACECLONE
    | ptrace::PTRACE_O_TRACEFORK
    | ptrace::PTRACE_O_EXITKILL
    | ferry_sys::seccomp::PTRACE_O_SUSPEND_SECCOMP;

pub fn install(s: &mut Session, tids: &[i32]) -> Result<()> {
    let f = &s.image.fidelity;
    if f.threads.iter().all(|t| t.seccomp_mode == 0) {
        return Ok(());
    }
    for &tid in tids {
        ferry_sys::seccomp::set_options(tid, OPTIONS)
            .map_err(|e| EngineError::kernel(s.pid, format!("thread {tid}: suspending seccomp for the rest of the restore (PTRACE_O_SUSPEND_SECCOMP)"), e))?;
    }
    let shared = shared_prefix(&f.threads);
    if let Some(first) = f.threads.first() {
        for (k, &idx) in first.seccomp[..shared].iter().enumerate() {
            let what = format!(
                "shared filter {} of {} (all {} threads, TSYNC)",
                k + 1,
                shared,
                f.threads.len()
            );
            let r = install_filter(s, first.tid, idx, SECCOMP_FILTER_FLAG_TSYNC, &what)?;
            // TSYNC reports a thread it could not synchronise by its TID
            // (a positive return): that thread would miss the filter.
            if r != 0 {
                return Err(EngineError::restore(
                    s.pid,
                    format!("seccomp TSYNC of {what} refused by thread {r}"),
                ));
            }
        }
    }
    for t in &f.threads {
        match t.seccomp_mode {
            0 => continue,
            1 => {
                s.run(
                    t.tid,
                    &[(
                        "prctl(PR_SET_SECCOMP, SECCOMP_MODE_STRICT)".into(),
                        Call::new(libc::SYS_prctl, &[PR_SET_SECCOMP, SECCOMP_MODE_STRICT]),
                    )],
                )?;
            }
            _ => {
                for (k, &idx) in t.seccomp.iter().enumerate().skip(shared) {
                    install_filter(
                        s,
                        t.tid,
                        idx,
                        0,
                        &format!("filter {} of {}", k + 1, t.seccomp.len()),
                    )?;
                }
            }
        }
    }
    Ok(())
}

/// How many filters, from the oldest, every thread has in common, when
/// there is more than one thread and all are in filter mode (a thread
/// without filters or in strict mode would be changed or refused by TSYNC).
fn shared_prefix(threads: &[ferry_image::ThreadFidelity]) -> usize {
    if threads.len() < 2 || threads.iter().any(|t| t.seccomp_mode != 2) {
        return 0;
    }
    let first = &threads[0].seccomp;
    (0..first.len())
        .take_while(|&i| threads.iter().all(|t| t.seccomp.get(i) == Some(&first[i])))
        .count()
}

/// Installs filter `idx` of the image in thread `tid`. One filter per call
/// (a program may take 32 KiB): struct sock_fprog (u16 len, padding,
/// pointer) then the program. Returns what seccomp(2) returned.
fn install_filter(s: &mut Session, tid: i32, idx: u32, flags: u64, what: &str) -> Result<u64> {
    let filter = s.image.fidelity.seccomp_filters.get(idx as usize).ok_or_else(|| {
        EngineError::restore(s.pid, format!("thread {tid}: seccomp filter {idx} missing"))
    })?;
    let mut data = Vec::with_capacity(16 + 8 * filter.insns.len());
    data.extend_from_slice(&(filter.insns.len() as u64).to_le_bytes());
    data.extend_from_slice(&(s.data + 16).to_le_bytes());
    for insn in &filter.insns {
        data.extend_from_slice(&insn.to_le_bytes());
    }
    if data.len() as u64 > crate::inject::SCRATCH_LEN - crate::inject::SCRATCH_DATA {
        return Err(EngineError::restore(
            s.pid,
            format!(
                "thread {tid}: seccomp filter of {} instructions does not fit the scratch area",
                filter.insns.len()
            ),
        ));
    }
    let flags = flags | if filter.log { ferry_sys::seccomp::SECCOMP_FILTER_FLAG_LOG } else { 0 };
    let name = format!(
        "seccomp(SECCOMP_SET_MODE_FILTER) for {what} ({} instructions)",
        filter.insns.len()
    );
    s.remote.write(s.data, &data)?;
    let r = s.run(
        tid,
        &[(name, Call::new(libc::SYS_seccomp, &[SECCOMP_SET_MODE_FILTER, flags, s.data]))],
    )?;
    r.first().copied().ok_or_else(|| {
        EngineError::restore(s.pid, format!("thread {tid}: no result from seccomp(2) for {what}"))
    })
}
