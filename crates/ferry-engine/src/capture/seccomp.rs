//! seccomp: each thread's mode (from the Seccomp: line of its status)
//! and, in filter mode, its chain of filters read from outside with
//! PTRACE_SECCOMP_GET_FILTER (index 0 is the oldest, the first installed;
//! the image keeps that order, the one restore installs them in). A filter shared
//! by several threads (TSYNC, or inherited over clone) is stored once.
//! The threads were seized with PTRACE_O_SUSPEND_SECCOMP, so the filters
//! do not act on the syscalls capture injects.

use crate::error::{EngineError, Result};
use crate::procfs::{self, key_values};
use ferry_image::SeccompFilter;
use ferry_sys::seccomp as sc;

/// One thread's seccomp state: (tid, mode, filter indices oldest first).
pub type ThreadSeccomp = (i32, u8, Vec<u32>);

/// BPF_RET | BPF_K
const BPF_RET_K: u16 = 0x06;

pub fn capture(pid: i32, tids: &[i32]) -> Result<(Vec<SeccompFilter>, Vec<ThreadSeccomp>)> {
    let mut filters: Vec<SeccompFilter> = Vec::new();
    let mut threads = Vec::with_capacity(tids.len());
    for &tid in tids {
        let path = format!("/proc/{pid}/task/{tid}/status");
        let text = procfs::read_string(&path)?;
        let kv = key_values(&text);
        let mode: u8 = kv.get("Seccomp").and_then(|v| v.parse().ok()).ok_or_else(|| {
            EngineError::Parse { path: path.clone(), what: "no Seccomp: line".into() }
        })?;
        let count: u64 = kv.get("Seccomp_filters").and_then(|v| v.parse().ok()).unwrap_or(0);
        let mut chain = Vec::new();
        if mode == 2 {
            let what = format!("seccomp filters of thread {tid}");
            for index in 0..count {
                let insns = sc::get_filter(tid, index).map_err(|e| {
                    EngineError::unsupported(pid, what.clone(), format!("cannot read filter {index} ({e}; ferry must run as root and not under seccomp itself)"))
                })?;
                let flags = sc::get_filter_flags(tid, index).map_err(|e| {
                    EngineError::unsupported(
                        pid,
                        what.clone(),
                        format!("cannot read the flags of filter {index} ({e})"),
                    )
                })?;
                if insns.iter().map(|&i| sc::insn_code_k(i)).any(|(code, k)| {
                    code == BPF_RET_K
                        && k & sc::SECCOMP_RET_ACTION_FULL == sc::SECCOMP_RET_USER_NOTIF
                }) {
                    return Err(EngineError::unsupported(
                        pid,
                        what,
                        format!("filter {index} hands syscalls to a user-space listener (SECCOMP_RET_USER_NOTIF); the listener cannot be restored"),
                    ));
                }
                let f = SeccompFilter { insns, log: flags & sc::SECCOMP_FILTER_FLAG_LOG != 0 };
                let at = match filters.iter().position(|g| *g == f) {
                    Some(i) => i,
                    None => {
                        filters.push(f);
                        filters.len() - 1
                    }
                };
                chain.push(at as u32);
            }
        } else if mode > 2 {
            return Err(EngineError::unsupported(
                pid,
                format!("thread {tid}"),
                format!("unknown seccomp mode {mode}"),
            ));
        }
        threads.push((tid, mode, chain));
    }
    Ok((filters, threads))
}
