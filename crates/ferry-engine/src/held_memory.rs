//! The old tree's memory held past its kill, so that the kill does not
//! wait for the teardown.
//!
//! A killed process tears its address space down in its own exit, before
//! it becomes a zombie, and its PID comes free only after that: about
//! 40-150 ms per GiB on this VM, which a replacement's restore waits for
//! (it takes the same PIDs) and which was most of the pause of a large
//! service. Right before the kill, ferry makes each process with a large
//! resident set clone a holder: a process of its own that shares the
//! address space (`CLONE_VM`), is stopped by ferry before it runs a single
//! instruction (`CLONE_PTRACE`: the new task inherits ferry's seize and
//! traps first), closes its copy of the descriptor table at once (so
//! that it keeps no socket, pipe or lock of the old tree alive) and leaves
//! the old process's session and process group (they would keep their
//! leaders' PID numbers allocated, which the new tree takes). The kill
//! then ends the old process without a teardown: the last user of the
//! address space is the holder. Ferry ends the holders once the new tree
//! runs, and the teardown happens then, outside the pause.
//!
//! What a holder can leave, and why that is safe:
//! - it exists only from the moment before the kill (the trial passed,
//!   nothing is left to refuse) to the end of the replacement; a holder
//!   that cannot be made is ended and the kill goes on without it;
//! - its exit signal is 0 while its parent is the old process (which the
//!   kill ends next), so nothing of the old tree is told about it; once
//!   orphaned its reaper gets SIGCHLD as for any orphan;
//! - its registers point at an `exit` system call: were ferry to die and
//!   the holder be let go, its first instruction ends it;
//! - it counts in the old tree's cgroup (pids, and the memory it holds)
//!   until ended: the trial ran a whole copy of the tree beside the old
//!   one, which is more than the holder and the new tree together;
//! - a tree with SysV shared memory gets no holder: a held attachment
//!   would keep a removed segment's id taken from the restore;
//! - nor does a process in a cgroup with a memory limit (memory.max, at
//!   its level or above): the held memory stays charged there while the
//!   new tree starts to allocate, and near the limit the cgroup's OOM
//!   killer could pick the new service.

use crate::error::{EngineError, Result};
use crate::freeze::Frozen;
use crate::inject::{self, Remote};
use crate::procfs;
use ferry_sys::ptrace::{self, WaitEvent};
use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

/// A holder's name: its zombie, left to a reaper that reaps only the
/// children it knows (a test harness), is not the tree's.
pub const HOLDER_COMM: &str = "ferry-holder";

/// From which resident size on a process's memory is held: below it the
/// teardown costs less than making the holder (about 0.3 ms).
pub const HOLD_FROM_BYTES: u64 = 32 << 20;

/// The holders of a killed tree's address spaces; ended when dropped.
#[derive(Default)]
pub struct HeldMemory {
    holders: Vec<Holder>,
    /// The capture's guard, told the capture is over: reaped with the
    /// holders, after the pause ([`HeldMemory::reap_guard`]).
    guard: Option<i32>,
}

struct Holder {
    /// The process whose address space it holds.
    of: i32,
    pid: i32,
    pidfd: OwnedFd,
    bytes: u64,
}

impl HeldMemory {
    /// A holder for each process of `procs` with `min_bytes` or more
    /// resident. Best effort: a process whose holder cannot be made is
    /// killed with its teardown, as before (logged at debug).
    pub fn hold<'a>(procs: impl Iterator<Item = &'a Frozen>, min_bytes: u64) -> HeldMemory {
        let mut held = HeldMemory::default();
        for f in procs {
            match hold_one(f, min_bytes) {
                Ok(Some(h)) => held.holders.push(h),
                Ok(None) => {}
                Err(e) => {
                    tracing::debug!("pid {}: address space not held past the kill: {e}", f.pid)
                }
            }
        }
        held
    }

    /// Bytes resident in the held address spaces when they were taken.
    pub fn bytes(&self) -> u64 {
        self.holders.iter().map(|h| h.bytes).sum()
    }

    /// The holders' PIDs.
    pub fn pids(&self) -> Vec<i32> {
        self.holders.iter().map(|h| h.pid).collect()
    }

    pub fn is_empty(&self) -> bool {
        self.holders.is_empty()
    }

    /// The capture's guard (its PID, from
    /// [`crate::guard::Guard::end_unreaped`]), reaped when the holders
    /// are ended: its exit is not waited for in the kill.
    pub fn reap_guard(&mut self, pid: Option<i32>) {
        self.guard = pid;
    }

    /// Ends every holder and waits for its teardown; how long that took.
    pub fn free(mut self) -> Duration {
        let t = Instant::now();
        end_all(&mut self.holders);
        t.elapsed()
    }
}

impl Drop for HeldMemory {
    fn drop(&mut self) {
        end_all(&mut self.holders);
        if let Some(pid) = self.guard.take() {
            ferry_sys::process::wait_child(pid);
        }
    }
}

fn end_all(holders: &mut Vec<Holder>) {
    for h in holders.iter() {
        if let Err(e) = ferry_sys::pidfd::pidfd_send_signal(&h.pidfd, libc::SIGKILL) {
            tracing::warn!("ending the holder {} of pid {}'s memory: {e}", h.pid, h.of);
            continue;
        }
        // The teardown split between the holder's exit and ferry.
        let _ = ferry_sys::pidfd::process_mrelease(&h.pidfd);
    }
    for h in holders.drain(..) {
        reap_traced(h.pid);
    }
}

/// Waits for the traced `pid` to exit; ferry's wait lets go of it, and its
/// real parent (or reaper) gets it.
fn reap_traced(pid: i32) {
    for _ in 0..10_000 {
        match ptrace::wait_tid(pid, 0) {
            Ok(Some((_, WaitEvent::Exited(_) | WaitEvent::Signaled(_)))) | Err(_) => return,
            Ok(_) => {}
        }
    }
}

/// The first cgroup of `pid`, or above it, that limits its memory
/// (cgroup v2 `memory.max`, or the v1 memory controller's
/// `memory.limit_in_bytes`): the held memory stays charged there while
/// the new tree starts to allocate, which near the limit could make the
/// cgroup's OOM killer pick the new service. Unreadable counts as
/// limited.
fn memory_limit_above(pid: i32) -> Option<String> {
    let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/cgroup")) else {
        return Some(format!("/proc/{pid}/cgroup (unreadable)"));
    };
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    for line in text.lines() {
        let mut f = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        let (mount, file) = if id == "0" && controllers.is_empty() {
            (cgroup_mount(&mountinfo, "cgroup2", None), "memory.max")
        } else if controllers.split(',').any(|c| c == "memory") {
            (cgroup_mount(&mountinfo, "cgroup", Some("memory")), "memory.limit_in_bytes")
        } else {
            continue;
        };
        let Some(mount) = mount else { continue };
        let mut dir = mount.join(path.trim_start_matches('/'));
        loop {
            let limit = std::fs::read_to_string(dir.join(file)).unwrap_or_default();
            if limits(limit.trim()) {
                return Some(format!("{} ({file} {})", dir.display(), limit.trim()));
            }
            if dir == mount || !dir.pop() {
                break;
            }
        }
    }
    None
}

/// Whether a memory.max or memory.limit_in_bytes value is a limit: not
/// `max`, not v1's "unlimited" (PAGE_COUNTER_MAX pages), not absent.
fn limits(value: &str) -> bool {
    match value {
        "" | "max" => false,
        v => v.parse::<u64>().is_ok_and(|b| b < 1 << 62),
    }
}

/// The mount point of the cgroup filesystem of type `fstype` (with the
/// super option `option`, a v1 controller) in ferry's mountinfo.
fn cgroup_mount(mountinfo: &str, fstype: &str, option: Option<&str>) -> Option<std::path::PathBuf> {
    mountinfo.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        let mut r = right.split(' ');
        let (ty, _source, options) = (r.next()?, r.next()?, r.next()?);
        let wanted = ty == fstype && option.is_none_or(|o| options.split(',').any(|x| x == o));
        wanted.then(|| left.split(' ').nth(4).map(std::path::PathBuf::from))?
    })
}

/// The resident bytes of `pid` (statm's second field, in pages).
fn resident_bytes(pid: i32) -> Result<u64> {
    let text = procfs::read_string(&format!("/proc/{pid}/statm"))?;
    let pages: u64 =
        text.split_whitespace().nth(1).and_then(|v| v.parse().ok()).ok_or_else(|| {
            EngineError::restore(pid, format!("unreadable /proc/{pid}/statm: {text:?}"))
        })?;
    Ok(pages * 4096)
}

fn hold_one(f: &Frozen, min_bytes: u64) -> Result<Option<Holder>> {
    let pid = f.pid;
    let bytes = resident_bytes(pid)?;
    if bytes < min_bytes {
        return Ok(None);
    }
    if let Some(limited) = memory_limit_above(pid) {
        tracing::debug!("pid {pid}: memory not held past the kill: {limited} limits it");
        return Ok(None);
    }
    let maps = procfs::maps(pid)?;
    let vdso = maps
        .iter()
        .find(|m| m.path == "[vdso]")
        .ok_or_else(|| EngineError::restore(pid, "no [vdso] mapping"))?;
    let syscall_ip = inject::find_syscall_insn(pid, vdso.start, vdso.end)?;
    let remote = Remote { pid, syscall_ip, settle: true };
    // Exit signal 0, no CLONE_FILES / CLONE_THREAD: a process of its own.
    let flags = (libc::CLONE_VM | libc::CLONE_PTRACE) as u64;
    let child = remote.raw(pid, libc::SYS_clone, &[flags, 0, 0, 0, 0])?;
    if child <= 0 {
        let e = ferry_sys::SysError { call: "clone", errno: (-child) as i32 };
        return Err(EngineError::kernel(pid, "cloning a holder of its memory", e));
    }
    let holder = child as i32;
    let pidfd = ferry_sys::pidfd::pidfd_open(holder)
        .map_err(|e| EngineError::kernel(pid, format!("pidfd of its memory's holder {holder}"), e));
    let pidfd = match pidfd {
        Ok(fd) => fd,
        Err(e) => {
            // Ours, traced and stopped: ended by PID.
            let _ = ferry_sys::process::kill(holder, libc::SIGKILL);
            reap_traced(holder);
            return Err(e);
        }
    };
    let h = Holder { of: pid, pid: holder, pidfd, bytes };
    // On an error from here, dropping `h` through HeldMemory ends it.
    let mut guard = HeldMemory { holders: vec![h], guard: None };
    settle_holder(pid, holder, syscall_ip)?;
    Ok(guard.holders.pop())
}

/// Waits for the new holder's first stop, closes its descriptor table and
/// points it at `exit`.
fn settle_holder(pid: i32, holder: i32, syscall_ip: u64) -> Result<()> {
    let kerr =
        |what: &str, e| EngineError::kernel(pid, format!("memory holder {holder}: {what}"), e);
    loop {
        match ptrace::wait_tid(holder, 0).map_err(|e| kerr("waiting for its first stop", e))? {
            Some((_, WaitEvent::Stopped { event: ptrace::PTRACE_EVENT_STOP, .. })) => break,
            Some((_, WaitEvent::Stopped { sig, .. })) => {
                return Err(EngineError::restore(
                    pid,
                    format!("memory holder {holder}: stopped by signal {sig} first"),
                ));
            }
            Some(_) => {
                return Err(EngineError::Gone {
                    pid,
                    what: format!("memory holder {holder} exited"),
                })
            }
            None => {}
        }
    }
    let remote = Remote { pid: holder, syscall_ip, settle: true };
    remote.call(holder, "close_range", libc::SYS_close_range, &[0, u64::from(u32::MAX), 0])?;
    // Out of the old process's session and group: a group or session
    // keeps its leader's PID number allocated, which the new tree takes.
    remote.call(holder, "setsid", libc::SYS_setsid, &[])?;
    name_holder(&remote, holder)?;
    let mut regs = ptrace::get_regs(holder).map_err(|e| kerr("reading registers", e))?;
    regs.rip = syscall_ip;
    regs.rax = libc::SYS_exit as u64;
    regs.orig_rax = u64::MAX;
    regs.rdi = 0;
    ptrace::set_regs(holder, &regs).map_err(|e| kerr("setting registers", e))?;
    Ok(())
}

/// Names the holder [`HOLDER_COMM`] (PR_SET_NAME reads the name from its
/// memory: a page mapped for it, unmapped again).
fn name_holder(remote: &Remote, holder: i32) -> Result<()> {
    let prot = (libc::PROT_READ | libc::PROT_WRITE) as u64;
    let flags = (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as u64;
    let page = remote.call(holder, "mmap", libc::SYS_mmap, &[0, 4096, prot, flags, u64::MAX, 0])?;
    let mut name = HOLDER_COMM.as_bytes().to_vec();
    name.push(0);
    let named = remote.write(page, &name).and_then(|_| {
        remote.call(
            holder,
            "prctl(PR_SET_NAME)",
            libc::SYS_prctl,
            &[libc::PR_SET_NAME as u64, page],
        )
    });
    remote.call(holder, "munmap", libc::SYS_munmap, &[page, 4096])?;
    named.map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_limit_is_a_number_below_the_unlimited_value() {
        assert!(limits("1073741824"));
        assert!(!limits("max"));
        assert!(!limits(""));
        assert!(!limits("9223372036854771712"));
    }

    #[test]
    fn the_cgroup_mounts_are_found_by_type_and_controller() {
        let mountinfo = "\
30 24 0:26 / /sys/fs/cgroup rw - tmpfs tmpfs rw,mode=755
35 30 0:31 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
36 30 0:32 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
40 30 0:35 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw";
        let at = |t, o| cgroup_mount(mountinfo, t, o).map(|p| p.display().to_string());
        assert_eq!(at("cgroup2", None).as_deref(), Some("/sys/fs/cgroup/unified"));
        assert_eq!(at("cgroup", Some("memory")).as_deref(), Some("/sys/fs/cgroup/memory"));
        assert_eq!(at("cgroup", Some("pids")), None);
    }
}
