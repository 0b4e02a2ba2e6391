//! Phase "stage files": every object the tree's processes share is made
//! once, in ferry, before the first fork (open file descriptions, memfds,
//! shared memory, SysV objects, files to map), numbered above every fd
//! the image uses so the forked processes inherit them out of the way.

use super::handover::Handover;
use super::{files, staging, sysv_ipc, RestoreOptions};
use crate::error::{EngineError, Result};
use ferry_image::TreeImage;
use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

/// What the staging phase made; every later phase borrows from it.
pub(super) struct Staged {
    /// The first fd number above every number of the image.
    pub temp_base: RawFd,
    /// The network namespace to restore into, when not ferry's.
    pub netns: Option<OwnedFd>,
    pub lock: Option<ferry_netlock::NetworkLock>,
    /// The lock is the image's own, engaged by its checkpoint: it held the
    /// connections' packets for the whole pause (a migration's destination
    /// adopts a lock of its own, which did not see the source's drops).
    pub lock_from_image: bool,
    pub sysv: staging::SysvSegments,
    pub sysv_ipc: sysv_ipc::SysvIpc,
    pub staging: staging::Staging,
    /// Open file descriptions by image file id.
    pub files: HashMap<u64, OwnedFd>,
    /// The same, as raw numbers the forked processes inherit.
    pub raw: HashMap<u64, RawFd>,
}

impl Staged {
    pub fn netns_fd(&self) -> Option<RawFd> {
        self.netns.as_ref().map(|f| f.as_raw_fd())
    }
}

/// Refuses a tree whose PIDs are taken here (waiting a moment for a
/// zombie of the checkpointed tree that init has not reaped yet).
pub(super) fn check_pids_free(tree: &TreeImage) -> Result<()> {
    super::wait_zombies_reaped(tree);
    for id in super::tree_ids(tree) {
        if super::pid_owner(id).is_some() {
            return Err(EngineError::PidTaken { pid: id, holder: super::pid_holder(id) });
        }
    }
    Ok(())
}

pub(super) fn stage(
    tree: &TreeImage,
    opts: &RestoreOptions,
    handover: &Handover,
) -> Result<Staged> {
    let pid = tree.root().map_or(0, |p| p.pid);
    // A tree's staged files all live in ferry at once.
    ferry_sys::process::raise_nofile_limit();
    let temp_base = first_free_fd(tree);
    let netns = match &opts.netns {
        Some(path) => {
            let f = std::fs::File::open(path)
                .map_err(|e| EngineError::io(format!("network namespace {}", path.display()), e))?;
            Some(lift_fd(pid, f.as_raw_fd(), temp_base, "the network namespace")?)
        }
        None => None,
    };
    // Owned by this restore from now on: a failure thaws it (the
    // connections are gone then), success thaws it once they exist again.
    let lock = match &handover.adopt_lock {
        Some(name) => Some(
            ferry_netlock::NetworkLock::adopt(name)
                .map_err(|e| EngineError::restore(pid, format!("network lock {name}: {e}")))?,
        ),
        None if opts.trial => None,
        None => adopt_network_lock(tree),
    };
    let lock_from_image = handover.adopt_lock.is_none() && lock.is_some();
    let sysv = staging::SysvSegments::create(tree)?;
    let sysv_ipc = sysv_ipc::SysvIpc::create(tree)?;
    let staging = staging::stage(tree, temp_base)?;
    let memfd_fds: HashMap<u64, RawFd> =
        staging.memfds.iter().map(|(id, (fd, _))| (*id, *fd)).collect();
    let netns_fd = netns.as_ref().map(|f| f.as_raw_fd());
    let mut files = in_netns(pid, netns_fd, || {
        files::stage_open_files(tree, &opts.tty_to, temp_base, &memfd_fds)
    })?;
    files::carried::stage(tree, &handover.carried, temp_base, &mut files)?;
    let raw = files.iter().map(|(id, fd)| (*id, fd.as_raw_fd())).collect();
    Ok(Staged { temp_base, netns, lock, lock_from_image, sysv, sysv_ipc, staging, files, raw })
}

/// Above every fd number of the image, also those only epoll entries
/// still name (they are reused briefly to register those entries).
fn first_free_fd(tree: &TreeImage) -> RawFd {
    let max_fd = tree
        .processes
        .iter()
        .flat_map(|p| {
            p.fds.iter().map(|s| s.fd).chain(p.fidelity.epoll_targets.iter().map(|t| t.fd))
        })
        .max()
        .unwrap_or(2)
        .max(2);
    max_fd + 1
}

/// Takes over the network lock the checkpoint left for this image. A
/// lock that is gone (released by hand, or the machine restarted) is no
/// reason to fail: the connections are rebuilt all the same.
fn adopt_network_lock(tree: &TreeImage) -> Option<ferry_netlock::NetworkLock> {
    let r = tree.network_lock.as_ref()?;
    match ferry_netlock::NetworkLock::adopt(&r.name) {
        Ok(l) => Some(l),
        Err(e) => {
            tracing::warn!(
                "network lock {} ({}) of the image: {e}; restoring without it",
                r.name,
                r.method
            );
            None
        }
    }
}

pub(super) fn lift_fd(pid: i32, fd: RawFd, temp_base: RawFd, what: &str) -> Result<OwnedFd> {
    ferry_sys::fd::dup_above(fd, temp_base)
        .map_err(|e| EngineError::kernel(pid, format!("staging {what}"), e))
}

/// Runs `f` with ferry in network namespace `ns` (if any), then returns
/// to its own: sockets made meanwhile belong to `ns`.
pub(super) fn in_netns<T>(pid: i32, ns: Option<RawFd>, f: impl FnOnce() -> Result<T>) -> Result<T> {
    let Some(ns) = ns else { return f() };
    let own = std::fs::File::open("/proc/thread-self/ns/net")
        .map_err(|e| EngineError::io("/proc/thread-self/ns/net", e))?;
    ferry_sys::netns::enter_net_namespace_fd(ns)
        .map_err(|e| EngineError::kernel(pid, "joining the network namespace", e))?;
    let r = f();
    ferry_sys::netns::enter_net_namespace_fd(own.as_raw_fd())
        .map_err(|e| EngineError::kernel(pid, "returning to ferry's network namespace", e))?;
    r
}
