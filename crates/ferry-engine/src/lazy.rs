//! Post-copy (lazy) memory, the source's side: which pages of a frozen
//! process may stay behind when the process resumes elsewhere, to be
//! fetched on first touch through userfaultfd (see
//! [`crate::restore::RestoreOptions::lazy`] for the destination's side).
//!
//! Only present pages of private anonymous mappings qualify: userfaultfd's
//! MISSING mode handles no other private memory. Left out, and so sent in
//! the freeze as usual: locked mappings (the restore's mlock would fault
//! every page in before anything can serve it) and the pages holding a
//! thread's rseq area (the kernel writes it on the restored thread's
//! first return to user mode, still inside the restore), and the main
//! stack (GROWSDOWN; the restore touches it, and it is small).

use crate::capture::memory::page_filter;
use crate::error::{EngineError, Result};
use crate::procfs;
use ferry_image::{vmflag, Vma, VmaBacking};
use ferry_sys::pagemap;

const PAGE: u64 = 4096;

/// The pages of `pid` (frozen, traced by the calling thread) that may be
/// fetched lazily, as sorted (address, pages) runs; `vmas` are its
/// mappings as the survey of the frozen process classified them.
pub fn lazy_pages(pid: i32, vmas: &[Vma]) -> Result<Vec<(u64, u64)>> {
    let mut eager: Vec<u64> = Vec::new();
    for tid in procfs::tids(pid)? {
        let conf = ferry_sys::ptrace::get_rseq_config(tid).map_err(|e| {
            EngineError::kernel(pid, format!("reading rseq configuration of thread {tid}"), e)
        })?;
        if conf.rseq_abi_pointer != 0 {
            let first = conf.rseq_abi_pointer & !(PAGE - 1);
            let last = (conf.rseq_abi_pointer + conf.rseq_abi_size.max(1) as u64 - 1) & !(PAGE - 1);
            eager.push(first);
            if last != first {
                eager.push(last);
            }
        }
    }
    eager.sort_unstable();
    let pm_path = format!("/proc/{pid}/pagemap");
    let pm: std::os::fd::OwnedFd =
        std::fs::File::open(&pm_path).map_err(|e| EngineError::io(&pm_path, e))?.into();
    let mut out: Vec<(u64, u64)> = Vec::new();
    for v in vmas {
        if !matches!(v.backing, VmaBacking::Anonymous)
            || v.shared
            || v.flags & (vmflag::LOCKED | vmflag::GROWSDOWN) != 0
        {
            continue;
        }
        let Some(filter) = page_filter(v) else {
            continue;
        };
        let ranges = pagemap::scan(&pm, v.start, v.end, filter).map_err(|e| {
            EngineError::kernel(pid, format!("scanning pages of {:#x}-{:#x}", v.start, v.end), e)
        })?;
        for (s, e) in ranges {
            let mut a = s;
            while a < e {
                let cut = eager.iter().copied().find(|&p| p >= a && p < e);
                let until = cut.unwrap_or(e);
                if until > a {
                    push_run(&mut out, a, (until - a) / PAGE);
                }
                a = until + if cut.is_some() { PAGE } else { 0 };
            }
        }
    }
    Ok(out)
}

fn push_run(out: &mut Vec<(u64, u64)>, a: u64, pages: u64) {
    match out.last_mut() {
        Some(r) if r.0 + r.1 * PAGE == a => r.1 += pages,
        _ => out.push((a, pages)),
    }
}
