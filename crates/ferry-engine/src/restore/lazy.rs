//! Post-copy restore: the pages a migration left at the source are not
//! written; their mappings are made as usual and left unpopulated, then
//! registered with a userfaultfd in MISSING mode, so that the first touch
//! of each such page waits until the migration's pager (ferry-migrate)
//! copies it in with UFFDIO_COPY.
//!
//! The userfaultfd must belong to the restored address space: it is
//! created inside the process by an injected `userfaultfd()` (while the
//! process still has root's credentials, so faults raised by the kernel,
//! such as a read(2) into a lazy buffer, are handled too), taken with
//! `pidfd_getfd`, and the process's copy is closed. Registration comes
//! last, once nothing of the restore touches the process's memory again;
//! a lazy page found populated by then would have lost its content, and
//! is an error.

use super::Session;
use crate::error::{EngineError, Result};
use ferry_image::PageSpan;
use ferry_image::{Vma, VmaBacking};
use ferry_sys::{pagemap, uffd};
use std::os::fd::{AsFd, OwnedFd};

const PAGE: u64 = 4096;

/// The events the pager follows: a fork (the child needs the same pages),
/// mremap (pages move), munmap and MADV_DONTNEED/REMOVE (pages the process
/// dropped must not be filled again).
pub const FEATURES: u64 = uffd::UFFD_FEATURE_EVENT_FORK
    | uffd::UFFD_FEATURE_EVENT_REMAP
    | uffd::UFFD_FEATURE_EVENT_REMOVE
    | uffd::UFFD_FEATURE_EVENT_UNMAP;

/// Runs `userfaultfd()` in the stopped process and takes the fd.
pub(super) fn take_uffd(s: &mut Session) -> Result<OwnedFd> {
    let pid = s.pid;
    let flags = (libc::O_CLOEXEC | libc::O_NONBLOCK) as u64;
    let fd = s.call("userfaultfd", libc::SYS_userfaultfd, &[flags])?;
    let taken = ferry_sys::pidfd::pidfd_open(pid)
        .and_then(|pidfd| ferry_sys::pidfd::pidfd_getfd(&pidfd, fd as i32))
        .map_err(|e| EngineError::kernel(pid, format!("taking its new userfaultfd (fd {fd})"), e));
    let closed = s.call("close(userfaultfd)", libc::SYS_close, &[fd]);
    let taken = taken?;
    closed?;
    Ok(taken)
}

/// Enables the pager's events on `fd` and registers every private
/// anonymous mapping of `vmas` holding a page of `lazy` ((address, pages)
/// runs, sorted) in MISSING mode.
pub(super) fn register(pid: i32, fd: &OwnedFd, vmas: &[Vma], lazy: &[PageSpan]) -> Result<()> {
    let api = uffd::api(fd.as_fd(), FEATURES).map_err(|e| {
        EngineError::kernel(pid, "enabling fork/remap/remove/unmap events on its userfaultfd", e)
    })?;
    if api.features & FEATURES != FEATURES {
        return Err(EngineError::restore(
            pid,
            format!(
                "its userfaultfd lacks the events post-copy needs (features {:#x})",
                api.features
            ),
        ));
    }
    check_not_populated(pid, lazy)?;
    for v in vmas {
        let i = lazy.partition_point(|r| r.end() <= v.start);
        let holds = lazy.get(i).is_some_and(|r| r.start < v.end);
        if !holds {
            continue;
        }
        if !matches!(v.backing, VmaBacking::Anonymous) || v.shared {
            return Err(EngineError::restore(
                pid,
                format!(
                    "lazy pages in mapping {:#x}-{:#x}, which is not private anonymous memory",
                    v.start, v.end
                ),
            ));
        }
        let ioctls = uffd::register(
            fd.as_fd(),
            v.start,
            v.end - v.start,
            uffd::UFFDIO_REGISTER_MODE_MISSING,
        )
        .map_err(|e| {
            EngineError::kernel(
                pid,
                format!("registering mapping {:#x}-{:#x} for missing pages", v.start, v.end),
                e,
            )
        })?;
        if ioctls & uffd::IOCTL_COPY == 0 {
            return Err(EngineError::restore(
                pid,
                format!("mapping {:#x}-{:#x}: UFFDIO_COPY is not available", v.start, v.end),
            ));
        }
    }
    Ok(())
}

/// No lazy page may have been populated yet: its content would then be
/// whatever the restore left there, not the checkpointed one.
fn check_not_populated(pid: i32, lazy: &[PageSpan]) -> Result<()> {
    let pm_path = format!("/proc/{pid}/pagemap");
    let pm: OwnedFd =
        std::fs::File::open(&pm_path).map_err(|e| EngineError::io(&pm_path, e))?.into();
    let filter = pagemap::ScanFilter {
        required: 0,
        inverted: 0,
        any_of: pagemap::PAGE_IS_PRESENT | pagemap::PAGE_IS_SWAPPED,
    };
    for &PageSpan { start: a, pages: n } in lazy {
        let present = pagemap::scan(&pm, a, a + n * PAGE, filter)
            .map_err(|e| EngineError::kernel(pid, format!("scanning lazy pages at {a:#x}"), e))?;
        if let Some(&(p, _)) = present.first() {
            return Err(EngineError::restore(
                pid,
                format!(
                    "lazy page {p:#x} was populated during the restore, before its content arrived"
                ),
            ));
        }
    }
    Ok(())
}
