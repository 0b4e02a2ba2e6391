//! The restore at the destination: the service address put on this
//! host, then the tree restored from the image and the page store and
//! held stopped (in this agent's PID namespace or in a new one), ready
//! to run on Commit.

use super::image::LazyPages;
use super::DestinationConfig;
use crate::address;
use crate::error::{MigrateError, Result};
use crate::page_store::PageStore;
use crate::protocol::Hello;
use ferry_engine::phases::Phases;
use ferry_engine::restore::RestoreOptions;
use ferry_image::TreeImage;
use ferry_sys::process::MappedFile;
use std::os::fd::OwnedFd;
use std::time::Instant;

pub(super) fn address_on(
    hello: &Hello,
    cfg: &DestinationConfig,
) -> Result<Option<address::Placed>> {
    let Some((addr, prefix)) = hello.address else {
        return Ok(None);
    };
    let ifindex = cfg.interface.ok_or_else(|| {
        MigrateError::Invalid("this ferryd has no interface for service addresses".into())
    })?;
    Ok(Some(address::place(ifindex, addr, prefix)?))
}

/// The restored tree, held stopped. Dropped, it goes in this order: the
/// userfaultfds closed, the tree killed, the unmapping of the placed
/// pages joined.
pub(super) struct Held {
    /// Post-copy: (image PID, userfaultfd) for the pager.
    pub uffds: Vec<(i32, OwnedFd)>,
    pub tree: HeldTree,
    pub unmapper: JoinOnDrop,
    t_restore: Instant,
    restore_ms: f64,
}

pub(super) fn restore_held(
    tree: TreeImage,
    lazy: &LazyPages,
    post_copy: bool,
    pages: &MappedFile,
    store: &mut PageStore,
    adopt_lock: Option<String>,
) -> Result<Held> {
    let here = restore_here(&tree, post_copy);
    let opts = RestoreOptions {
        adopt_lock,
        lazy: lazy.iter().map(|(p, _, r)| (*p, r.clone())).collect(),
        // Only a helper forked from us has copies of its own to drop.
        placed_for_root: if here { Default::default() } else { store.placed_regions() },
        ..Default::default()
    };
    let t_restore = Instant::now();
    let held = if here {
        tracing::info!(
            "restoring in this agent's PID namespace: every PID of the tree is free here"
        );
        ferry_engine::restore::restore_held(tree, pages.bytes(), &opts, t_restore)
            .map(|h| HeldTree::Here(Box::new(h)))
    } else {
        ferry_engine::restore::restore_held_in_new_pid_ns(tree, pages.bytes(), &opts, t_restore)
            .map(HeldTree::InNamespace)
    };
    let restore_ms = t_restore.elapsed().as_secs_f64() * 1e3;
    let unmapper = unmap_placed_beside(store);
    let mut tree = held?;
    let uffds = tree.take_uffds();
    let with_lazy = lazy.iter().filter(|(_, _, r)| !r.is_empty()).count();
    if with_lazy > 0 && uffds.len() != with_lazy {
        return Err(MigrateError::Invalid(format!("post-copy: the restore registered {} userfaultfd(s) for {} process(es) with lazy pages", uffds.len(), lazy.len())));
    }
    Ok(Held { uffds, tree, unmapper, t_restore, restore_ms })
}

/// The root has its own copies of the placed pages now (or failed).
/// Unmapping them walks every page table entry (~15 ms per GiB): done
/// beside the rest of the migration, not in its pause.
/// Joined before anything could fork again (a thread holding the
/// allocator's lock across a fork would deadlock the child); when no
/// thread can be started, the closure and the regions are dropped here.
fn unmap_placed_beside(store: &mut PageStore) -> JoinOnDrop {
    let placed_pages = store.take_placed();
    JoinOnDrop(
        std::thread::Builder::new()
            .name("unmap-placed".into())
            .spawn(move || drop(placed_pages))
            .ok(),
    )
}

impl Held {
    /// The phases reported in Ready: this side's so far, the restore's
    /// own, and what the restore's own phases leave out (a helper's
    /// report reaching us).
    pub(super) fn ready_phases(&self, ph: &Phases) -> Vec<(String, f64)> {
        let mut phases: Vec<(String, f64)> = ph.done().to_vec();
        let restore_phases = self.tree.phases();
        let in_phases: f64 = restore_phases.iter().map(|(_, ms)| ms).sum();
        phases.extend(restore_phases);
        phases.push((
            "restore, outside its phases".to_string(),
            (self.restore_ms - in_phases).max(0.0),
        ));
        phases.push((
            "ready".to_string(),
            self.t_restore.elapsed().as_secs_f64() * 1e3 - self.restore_ms,
        ));
        phases
    }
}

/// Whether the tree is restored in this agent's own PID namespace rather
/// than in a new one under a helper: one fork fewer, and with it one copy
/// of the page tables of every placed page (~20 ms per GiB in the pause).
/// Only when every PID of the tree is free here, the tree did not have a
/// PID namespace of its own, the root's threads have no parent-death
/// signal and the root exits with SIGCHLD (their parent, this worker,
/// exits after the migration, and the root then belongs to ferryd, the
/// child subreaper), and not post-copy
/// (whose pager needs the tree in a namespace it can wait on).
fn restore_here(tree: &TreeImage, lazy: bool) -> bool {
    let Some(root) = tree.root() else {
        return false;
    };
    !lazy
        && !tree.own_pid_namespace
        && root.fidelity.threads.iter().all(|t| t.pdeathsig == 0)
        // Adoption resets the exit signal to SIGCHLD.
        && root.fidelity.exit_signal == libc::SIGCHLD
        && ferry_engine::restore::pids_free_here(tree)
}

/// A restored tree held stopped, in this agent's PID namespace or in a
/// new one under a helper. Held is boxed: it is a thousand bytes, moved
/// through every phase from the restore to the release.
pub(super) enum HeldTree {
    Here(Box<ferry_engine::restore::Held>),
    InNamespace(ferry_engine::restore::HeldInNamespace),
}

impl HeldTree {
    fn phases(&self) -> Vec<(String, f64)> {
        match self {
            HeldTree::Here(h) => h.phases().done().to_vec(),
            HeldTree::InNamespace(h) => h.phases.clone(),
        }
    }

    fn take_uffds(&mut self) -> Vec<(i32, OwnedFd)> {
        match self {
            // Never post-copy (see restore_here).
            HeldTree::Here(_) => Vec::new(),
            HeldTree::InNamespace(h) => std::mem::take(&mut h.uffds),
        }
    }

    /// Lets the tree run and calls `running` as soon as it does (before
    /// the network lock is taken down, which the helper of a new
    /// namespace does on its own after reporting).
    pub(super) fn release_then(
        self,
        running: impl FnOnce(&ferry_engine::restore::Restored),
    ) -> Result<ferry_engine::restore::Restored> {
        Ok(match self {
            HeldTree::Here(h) => h.release_then(running)?,
            HeldTree::InNamespace(h) => {
                let r = h.release()?;
                running(&r);
                r
            }
        })
    }
}

/// A thread joined when this is dropped, on every path out.
pub(super) struct JoinOnDrop(Option<std::thread::JoinHandle<()>>);

impl Drop for JoinOnDrop {
    fn drop(&mut self) {
        if let Some(t) = self.0.take() {
            let _ = t.join();
        }
    }
}
