//! seccomp: every thread gets its own mode and filters back, the filters
//! in the order they were installed (oldest first), each thread from
//! inside itself (seccomp(SECCOMP_SET_MODE_FILTER) without TSYNC: a
//! filter shared by threads at checkpoint time becomes one copy per
//! thread, which filters exactly the same syscalls).
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
const PR_SET_SECCOMP: u64 = 22;
const SECCOMP_MODE_STRICT: u64 = 1;

/// The options restore seizes every process with, plus the suspension.
const OPTIONS: u64 = ptrace::PTRACE_O_TRACECLONE | ptrace::PTRACE_O_TRACEFORK | ptrace::PTRACE_O_EXITKILL | ferry_sys::seccomp::PTRACE_O_SUSPEND_SECCOMP;

pub fn install(s: &mut Session, tids: &[i32]) -> Result<()> {
    let f = &s.image.fidelity;
    if f.threads.iter().all(|t| t.seccomp_mode == 0) {
        return Ok(());
    }
    for &tid in tids {
        ferry_sys::seccomp::set_options(tid, OPTIONS)
            .map_err(|e| EngineError::kernel(s.pid, format!("thread {tid}: suspending seccomp for the rest of the restore (PTRACE_O_SUSPEND_SECCOMP)"), e))?;
    }
    for t in &f.threads {
        match t.seccomp_mode {
            0 => continue,
            1 => {
                s.run(t.tid, &[("prctl(PR_SET_SECCOMP, SECCOMP_MODE_STRICT)".into(), Call::new(libc::SYS_prctl, &[PR_SET_SECCOMP, SECCOMP_MODE_STRICT]))])?;
            }
            _ => {
                // One filter per call (a program may take 32 KiB): struct
                // sock_fprog (u16 len, padding, pointer) then the program.
                for (k, &idx) in t.seccomp.iter().enumerate() {
                    let filter = f.seccomp_filters.get(idx as usize).ok_or_else(|| EngineError::restore(s.pid, format!("thread {}: seccomp filter {idx} missing", t.tid)))?;
                    let mut data = Vec::with_capacity(16 + 8 * filter.insns.len());
                    data.extend_from_slice(&(filter.insns.len() as u64).to_le_bytes());
                    data.extend_from_slice(&(s.data + 16).to_le_bytes());
                    for insn in &filter.insns {
                        data.extend_from_slice(&insn.to_le_bytes());
                    }
                    if data.len() as u64 > crate::inject::SCRATCH_LEN - crate::inject::SCRATCH_DATA {
                        return Err(EngineError::restore(s.pid, format!("thread {}: seccomp filter of {} instructions does not fit the scratch area", t.tid, filter.insns.len())));
                    }
                    s.remote.write(s.data, &data)?;
                    let flags = if filter.log { ferry_sys::seccomp::SECCOMP_FILTER_FLAG_LOG } else { 0 };
                    let name = format!("seccomp(SECCOMP_SET_MODE_FILTER) for filter {} of {} ({} instructions)", k + 1, t.seccomp.len(), filter.insns.len());
                    s.run(t.tid, &[(name, Call::new(libc::SYS_seccomp, &[SECCOMP_SET_MODE_FILTER, flags, s.data]))])?;
                }
            }
        }
    }
    Ok(())
}
