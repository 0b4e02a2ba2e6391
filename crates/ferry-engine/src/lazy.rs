//! Post-copy (lazy) memory, the source's side: which pages of a frozen
//! process may stay behind when the process resumes elsewhere, to be
//! fetched on first touch through userfaultfd (see
//! [`crate::restore::RestoreOptions::lazy`] for the destination's side).
//!
//! Only private anonymous mappings qualify: userfaultfd's MISSING mode
//! handles no other private memory. Left out, and so sent in the freeze
//! as usual: locked mappings (the restore's mlock would fault every page
//! in before anything can serve it) and the pages holding a thread's
//! rseq area (the kernel writes it on the restored thread's first return
//! to user mode, still inside the restore), and the main stack
//! (GROWSDOWN; the restore touches it, and it is small).
//!
//! The freeze declares whole mappings lazy ([`lazy_ranges`]) without
//! looking at their pages: walking the page tables of 4 GiB takes tens
//! of milliseconds, and the pause would grow with memory. Which of those
//! pages exist is read after the resume, from the still frozen source
//! ([`present_runs`]); a page that never existed reads as zeros, which is
//! its content.

use crate::error::{EngineError, Result};
use crate::procfs;
use ferry_image::{vmflag, Vma, VmaBacking};
use ferry_sys::pagemap::{self, ScanFilter, PAGE_IS_PFNZERO, PAGE_IS_PRESENT, PAGE_IS_SWAPPED};

const PAGE: u64 = 4096;

/// The ranges of `pid` (frozen, traced by the calling thread) whose pages
/// may be fetched lazily, as sorted (address, pages) runs; `vmas` are its
/// mappings as the survey of the frozen process classified them.
pub fn lazy_ranges(pid: i32, vmas: &[Vma]) -> Result<Vec<(u64, u64)>> {
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
    Ok(declared(vmas, eager))
}

/// Whether mapping `v` may hold lazy pages.
fn eligible(v: &Vma) -> bool {
    matches!(v.backing, VmaBacking::Anonymous)
        && !v.shared
        && v.flags & (vmflag::LOCKED | vmflag::GROWSDOWN) == 0
}

/// The eligible mappings of `vmas` (sorted) as (address, pages) runs,
/// with the pages at `eager` (page addresses) cut out.
fn declared(vmas: &[Vma], mut eager: Vec<u64>) -> Vec<(u64, u64)> {
    eager.sort_unstable();
    eager.dedup();
    let mut out: Vec<(u64, u64)> = Vec::new();
    for v in vmas.iter().filter(|v| eligible(v)) {
        let mut a = v.start;
        for &p in eager.iter().filter(|&&p| p >= v.start && p < v.end) {
            if p > a {
                push_run(&mut out, a, (p - a) / PAGE);
            }
            a = p + PAGE;
        }
        if v.end > a {
            push_run(&mut out, a, (v.end - a) / PAGE);
        }
    }
    out
}

/// The pages of the lazy `runs` of `pid` that exist (present or swapped,
/// not the shared zero page), as sorted (address, pages) runs. The
/// process must not run meanwhile (post-copy keeps it frozen).
pub fn present_runs(pid: i32, runs: &[(u64, u64)]) -> Result<Vec<(u64, u64)>> {
    let pm_path = format!("/proc/{pid}/pagemap");
    let pm: std::os::fd::OwnedFd =
        std::fs::File::open(&pm_path).map_err(|e| EngineError::io(&pm_path, e))?.into();
    let filter = ScanFilter {
        required: 0,
        inverted: PAGE_IS_PFNZERO,
        any_of: PAGE_IS_PRESENT | PAGE_IS_SWAPPED,
    };
    let mut out: Vec<(u64, u64)> = Vec::new();
    for &(a, n) in runs {
        let found = pagemap::scan(&pm, a, a + n * PAGE, filter).map_err(|e| {
            EngineError::kernel(
                pid,
                format!("scanning lazy pages of {a:#x}-{:#x}", a + n * PAGE),
                e,
            )
        })?;
        for (s, e) in found {
            push_run(&mut out, s, (e - s) / PAGE);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn vma(start: u64, end: u64, backing: VmaBacking, shared: bool, flags: u32) -> Vma {
        Vma { start, end, prot: 3, shared, flags, pgoff: 0, backing }
    }

    #[test]
    fn private_anonymous_mappings_are_declared_whole_but_eager_pages() {
        let file = VmaBacking::File { path: "/x".into(), dev: 1, ino: 2 };
        let vmas = [
            vma(0x10000, 0x20000, VmaBacking::Anonymous, false, 0),
            vma(0x20000, 0x30000, VmaBacking::Anonymous, false, 0),
            vma(0x30000, 0x40000, file, false, 0),
            vma(0x40000, 0x50000, VmaBacking::Anonymous, true, 0),
            vma(0x50000, 0x60000, VmaBacking::Anonymous, false, vmflag::LOCKED),
            vma(0x60000, 0x70000, VmaBacking::Anonymous, false, vmflag::GROWSDOWN),
            vma(0x70000, 0x80000, VmaBacking::Anonymous, false, 0),
        ];
        let eager = vec![0x7f000, 0x10000, 0x12000, 0x12000, 0x55000];
        assert_eq!(declared(&vmas, eager), vec![(0x11000, 1), (0x13000, 0x1d), (0x70000, 15)]);
    }

    #[test]
    fn nothing_eligible_declares_nothing() {
        let vmas = [vma(0x10000, 0x20000, VmaBacking::Anonymous, true, 0)];
        assert!(declared(&vmas, Vec::new()).is_empty());
    }
}
