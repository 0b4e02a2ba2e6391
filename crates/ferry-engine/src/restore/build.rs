//! Phases "root: files+memory" and "children: fork+files+memory": each
//! process's address space is rebuilt, parents before children; each
//! child is forked from its restored parent (keeping the pages they
//! shared), then zombies are made and process groups joined.

use super::handover::Handover;
use super::held::TreeGuard;
use super::{cgroups, fork, lazy, memory, RestoreOptions, Session};
use crate::error::{EngineError, Result};
use crate::inject::Remote;
use ferry_image::{ProcessImage, TreeImage};
use std::collections::HashSet;
use std::os::fd::OwnedFd;

/// The cgroups each process joins right after it is forked.
pub(super) struct CgroupPlan<'a> {
    tree: &'a TreeImage,
    hierarchies: Vec<cgroups::Hierarchy>,
}

impl<'a> CgroupPlan<'a> {
    pub fn new(tree: &'a TreeImage) -> Result<CgroupPlan<'a>> {
        let hierarchies = match &tree.cgroups {
            Some(_) => cgroups::mounted(&crate::procfs::read_string("/proc/self/mountinfo")?),
            None => Vec::new(),
        };
        Ok(CgroupPlan { tree, hierarchies })
    }

    pub fn join(&self, pid: i32) -> Result<()> {
        match self.tree.cgroups.as_ref().and_then(|c| c.processes.iter().find(|p| p.pid == pid)) {
            Some(recorded) => cgroups::join(pid, recorded, &self.hierarchies),
            None => Ok(()),
        }
    }
}

/// A process's mappings and pages. Mappings it inherited (a child's from
/// its parent, the root's from ferry in a migration) are kept.
fn restore_memory(
    s: &mut Session,
    img: &ProcessImage,
    pages: &[u8],
    opts: &RestoreOptions,
    always_prepare_inherited: bool,
) -> Result<()> {
    let mut kept: Vec<(u64, u64)> = img.inherited.iter().map(|v| (v.start, v.end)).collect();
    kept.sort_unstable();
    // Cleared, the vDSO moved and the image's mappings made in one batch,
    // in that order (the batch code is in the scratch area, which stays).
    let (mut calls, kernel) = memory::clear_calls(s, &kept)?;
    let (vdso, syscall_ip) = memory::vdso_calls(s, &img.vmas, &kernel)?;
    let (maps, mut reprotect) = memory::map_calls(s, &img.vmas, &img.page_runs, &kept)?;
    calls.extend(vdso);
    calls.extend(maps);
    s.run(s.pid, &calls)?;
    s.remote.syscall_ip = syscall_ip;
    if always_prepare_inherited || !kept.is_empty() {
        reprotect.extend(memory::prepare_inherited(s, &img.page_runs)?);
    }
    memory::write_pages_in(s, &img.page_runs, pages, &kept, opts.progress.as_ref())?;
    memory::reprotect(s, &reprotect)?;
    memory::relock(s, &img.vmas)
}

/// Post-copy: a process's userfaultfd and the pages that come through it.
pub(super) struct LazyUffd<'t> {
    pub pid: i32,
    pub uffd: OwnedFd,
    pub runs: &'t [ferry_image::PageSpan],
}

/// The root's memory; with post-copy, the userfaultfd its lazy pages
/// will come through.
pub(super) fn restore_root<'t>(
    s: &mut Session,
    tree: &TreeImage,
    pages: &[u8],
    opts: &RestoreOptions,
    handover: &'t Handover,
) -> Result<Vec<LazyUffd<'t>>> {
    let image = s.image;
    restore_memory(s, image, pages, opts, false)?;
    let mut lazy_uffds = Vec::new();
    if let Some((_, runs)) = handover.lazy.iter().find(|(p, r)| *p == s.pid && !r.is_empty()) {
        if tree.processes.len() > 1 {
            return Err(EngineError::restore(
                s.pid,
                "post-copy (lazy) restore of a tree of several processes is not supported",
            ));
        }
        lazy_uffds.push(LazyUffd { pid: s.pid, uffd: lazy::take_uffd(s)?, runs: runs.as_slice() });
    }
    Ok(lazy_uffds)
}

/// Every child, forked from its restored parent, then its memory.
pub(super) fn fork_children<'a>(
    tree: &'a TreeImage,
    sessions: &mut Vec<Session<'a>>,
    pages: &[u8],
    opts: &RestoreOptions,
    cgroups: &CgroupPlan,
    guard: &mut TreeGuard,
) -> Result<()> {
    for img in &tree.processes[1..] {
        let k = sessions.iter().position(|p| p.pid == img.ppid).ok_or_else(|| {
            EngineError::restore(img.pid, format!("parent {} not restored", img.ppid))
        })?;
        // A child that shared its parent's fd table gets it again: forked
        // with CLONE_FILES from the parent, whose table is complete.
        let flags =
            if img.fidelity.shares_files_with_parent { libc::CLONE_FILES as u64 } else { 0 };
        let child = fork::fork_from(&mut sessions[k], img.pid, img.fidelity.exit_signal, flags)?;
        guard.add(child);
        cgroups.join(img.pid)?;
        let parent = &sessions[k];
        let mut s = Session {
            pid: img.pid,
            image: img,
            remote: Remote { pid: img.pid, ..parent.remote },
            scratch: parent.scratch,
            data: parent.data,
            staging: parent.staging,
            forked: None,
        };
        fork::setup_identity(&mut s, parent.image)?;
        restore_memory(&mut s, img, pages, opts, true)?;
        sessions.push(s);
    }
    Ok(())
}

/// Zombies, forked by their parents and exited; then every process that
/// joins a group another leads. Group leaders come first: those that
/// lead a group, then the zombies and processes that join one.
pub(super) fn zombies_and_groups(tree: &TreeImage, sessions: &mut [Session]) -> Result<()> {
    let leaders: HashSet<i32> = tree
        .processes
        .iter()
        .map(|p| (p.pid, p.pgid))
        .chain(tree.zombies.iter().map(|z| (z.pid, z.pgid)))
        .filter(|(pid, pgid)| pid == pgid)
        .map(|(pid, _)| pid)
        .collect();
    let mut zombies: Vec<&ferry_image::Zombie> = tree.zombies.iter().collect();
    zombies.sort_by_key(|z| z.pgid != z.pid);
    for z in zombies {
        let k = sessions
            .iter()
            .position(|p| p.pid == z.ppid)
            .ok_or_else(|| EngineError::restore(z.pid, "zombie's parent not restored"))?;
        fork::make_zombie(&mut sessions[k], z, &leaders)?;
    }
    for s in
        sessions.iter_mut().filter(|s| s.image.pgid != s.pid && leaders.contains(&s.image.pgid))
    {
        fork::join_group(s)?;
    }
    Ok(())
}
