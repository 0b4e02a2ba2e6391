//! Phase "threads, signals, timers, creds": everything after memory, in
//! every process; the tree is complete and still stopped afterwards.

use super::held::{HeldProcess, TreeGuard};
use super::{files, lazy, memory, prctl, process, seccomp, signals, threads, timers, Session};
use crate::error::{EngineError, Result};
use crate::inject;
use ferry_image::TreeImage;
use std::collections::{HashMap, HashSet};
use std::os::fd::{OwnedFd, RawFd};

/// Each process's fd flags (F_GETFD) by fd, read by the process itself
/// after its last change to its fd table, for the restore's check: the
/// raw result, a negative errno when the fd is not there.
pub(super) type FdFlags = HashMap<i32, ProcessFdFlags>;

/// One process's F_GETFD results by fd.
pub(super) type ProcessFdFlags = HashMap<i32, i64>;

/// Finishes every process, parents before children. With `read_fd_flags`
/// (the restore checks itself), also returns each one's fd flags.
pub(super) fn finish_all(
    tree: &TreeImage,
    sessions: &mut [Session],
    exes: &HashMap<i32, RawFd>,
    temp_base: RawFd,
    guard: &mut TreeGuard,
    read_fd_flags: bool,
) -> Result<(Vec<HeldProcess>, FdFlags)> {
    // Processes that share one fd table (CLONE_FILES) leave the staged
    // descriptors to the last of them to finish, which closes them for all.
    let closes = last_of_each_table(tree);
    let mut held = Vec::with_capacity(sessions.len());
    let mut fd_flags = FdFlags::new();
    for s in sessions.iter_mut() {
        let exe_fd = exes.get(&s.pid).copied();
        let close_staging = closes.contains(&s.pid);
        let (tids, flags) = finish_process(s, exe_fd, temp_base, close_staging, read_fd_flags)?;
        process::restore_attrs(s, tree)?;
        for &t in &tids {
            guard.add(t);
        }
        held.push(HeldProcess { pid: s.pid, tids, stopped: s.image.fidelity.stopped });
        if let Some(flags) = flags {
            fd_flags.insert(s.pid, flags);
        }
    }
    Ok((held, fd_flags))
}

/// `first` (calls of the leader's that take no arguments in memory),
/// then F_GETFD of every fd of the image when `fd_flags` (the restore
/// checks itself), run by the process in batches: the close-on-exec
/// bits of a table of 10,000 sockets in a few round trips instead of one
/// /proc read per fd.
fn last_calls(
    s: &mut Session,
    first: Vec<(String, inject::Call)>,
    fd_flags: bool,
) -> Result<Option<ProcessFdFlags>> {
    if !fd_flags {
        s.run(s.pid, &first)?;
        return Ok(None);
    }
    let n = first.len();
    let mut calls: Vec<inject::Call> = first.iter().map(|c| c.1).collect();
    calls.extend(
        s.image.fds.iter().map(|slot| {
            inject::Call::new(libc::SYS_fcntl, &[slot.fd as u64, libc::F_GETFD as u64])
        }),
    );
    let results = s.remote.batch(s.pid, s.scratch, &calls)?;
    for ((name, _), &r) in first.iter().zip(&results) {
        inject::check(s.pid, s.pid, name, r)?;
    }
    Ok(Some(s.image.fds.iter().map(|slot| slot.fd).zip(results[n..].iter().copied()).collect()))
}

/// Whether no seccomp filter, credential change or parent-death signal is
/// still to come (each would have to precede the dumpable flag: a
/// credential change resets it). Credentials as [`process::restore_creds`]
/// decides: the process already has the image's.
fn nothing_resets_dumpable(s: &Session) -> Result<bool> {
    let f = &s.image.fidelity;
    if f.threads.iter().any(|t| t.seccomp_mode != 0 || t.pdeathsig != 0) {
        return Ok(false);
    }
    process::creds_already_set(s)
}

/// The last process (in the tree's order, which finishing follows) of
/// each group sharing one fd table; a process with its own table is the
/// last of its group.
fn last_of_each_table(tree: &TreeImage) -> HashSet<i32> {
    let mut top: HashMap<i32, i32> = HashMap::new();
    let mut last: HashMap<i32, i32> = HashMap::new();
    for p in &tree.processes {
        let t = match top.get(&p.ppid) {
            Some(&t) if p.fidelity.shares_files_with_parent => t,
            _ => p.pid,
        };
        top.insert(p.pid, t);
        last.insert(t, p.pid);
    }
    last.into_values().collect()
}

/// Seals go on once nothing writes the memfds any more.
pub(super) fn seal_memfds(pid: i32, memfds: &HashMap<u64, (RawFd, i32)>) -> Result<()> {
    for (id, (fd, seals)) in memfds {
        if *seals != 0 {
            ferry_sys::fd::fcntl_int(
                *fd,
                libc::F_ADD_SEALS,
                *seals as libc::c_long,
                "fcntl(F_ADD_SEALS)",
            )
            .map_err(|e| {
                EngineError::kernel(pid, format!("sealing memfd {id} with {seals:#x}"), e)
            })?;
        }
    }
    Ok(())
}

/// Post-copy: the lazy mappings registered with their userfaultfd.
pub(super) fn register_lazy(
    tree: &TreeImage,
    lazy_uffds: Vec<super::build::LazyUffd>,
) -> Result<Vec<(i32, OwnedFd)>> {
    let mut uffds = Vec::with_capacity(lazy_uffds.len());
    for super::build::LazyUffd { pid: p, uffd: fd, runs } in lazy_uffds {
        let vmas =
            tree.processes.iter().find(|i| i.pid == p).map_or(&[][..], |i| i.vmas.as_slice());
        lazy::register(p, &fd, vmas, runs)?;
        uffds.push((p, fd));
    }
    Ok(uffds)
}

/// Everything after memory: mm layout, signal handlers, threads and their
/// state, timers, pending signals, locks, limits, credentials, registers.
/// Returns the TIDs of the threads it created.
fn finish_process(
    s: &mut Session,
    exe_fd: Option<RawFd>,
    temp_base: RawFd,
    close_staging: bool,
    fd_flags: bool,
) -> Result<(Vec<i32>, Option<ProcessFdFlags>)> {
    let pid = s.pid;
    let image = s.image;
    // The leader's calls go in as few batches as their order allows.
    let mut leader = vec![memory::set_mm_call(s, exe_fd)?];
    if !image.fidelity.shares_files_with_parent && files::proc_file::any(image) {
        // The table's first process opens them for all that share it,
        // after PR_SET_MM_MAP, with arguments of its own.
        s.run(pid, &std::mem::take(&mut leader))?;
        files::proc_file::open_all(s)?;
    }
    leader.extend(signals::action_calls(s)?);
    // The leader first, so new threads inherit its name.
    threads::restore_thread_state(s, &image.threads[0], leader)?;
    let tids = threads::create_threads(s)?;
    for t in &image.threads[1..] {
        threads::restore_thread_state(s, t, Vec::new())?;
    }
    files::owner::restore(s)?;
    timers::restore_itimers(s)?;
    timers::restore_posix(s)?;
    signals::queue_pending(s)?;
    let mut leader = process::misc_calls(s)?;
    if close_staging {
        leader.push((
            "close_range(staging)".into(),
            inject::Call::new(libc::SYS_close_range, &[temp_base as u64, u32::MAX as u64, 0]),
        ));
    }
    let (lock_calls, lock_args) = files::locks::posix_lock_calls(image, s.data);
    if !lock_calls.is_empty() {
        s.remote.write(s.data, &lock_args)?;
        leader.extend(lock_calls);
    }
    let flags = if nothing_resets_dumpable(s)? {
        // Nothing after this batch changes the fd table or the dumpable
        // flag: the last calls go in it, one round trip fewer.
        leader.push(process::dumpable_call(s));
        let flags = last_calls(s, leader, fd_flags)?;
        process::restore_limits(pid, image)?;
        flags
    } else {
        s.run(pid, &leader)?;
        // Limits while the process still has ferry's user (a process of
        // another user would need CAP_SYS_RESOURCE), credentials last.
        process::restore_limits(pid, image)?;
        let all_tids: Vec<i32> = std::iter::once(pid).chain(tids.iter().copied()).collect();
        // seccomp while the process still has root's capabilities; suspended
        // for ferry's remaining injected calls until the threads are released.
        seccomp::install(s, &all_tids)?;
        process::restore_creds(s, &all_tids)?;
        prctl::restore_pdeathsig(s)?;
        // Nothing changes the fd table after this.
        last_calls(s, vec![process::dumpable_call(s)], fd_flags)?
    };
    s.call("munmap(scratch)", libc::SYS_munmap, &[s.scratch, inject::SCRATCH_LEN])?;
    for t in &image.threads {
        threads::set_final_registers(pid, t)?;
    }
    Ok((tids, flags))
}
