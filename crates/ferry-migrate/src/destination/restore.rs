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
use ferry_engine::restore::{Handover, HeldTree, Placement, RestoreOptions};
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
    let placement = Placement::for_migration(&tree, post_copy);
    let handover = Handover {
        adopt_lock,
        lazy: lazy
            .iter()
            .map(|(p, _, r)| {
                (*p, r.iter().map(|&(s, n)| ferry_image::PageSpan::new(s, n)).collect())
            })
            .collect(),
        // Only a helper forked from us has copies of its own to drop.
        placed_for_root: match placement {
            Placement::Here => Default::default(),
            Placement::NewPidNamespace => store.placed_regions(),
        },
        // A migration crosses hosts: nothing can be carried.
        carried: Default::default(),
    };
    if placement == Placement::Here {
        tracing::info!(
            "restoring in this agent's PID namespace: every PID of the tree is free here"
        );
    }
    let t_restore = Instant::now();
    let held = placement.restore_held(
        tree,
        pages.bytes(),
        &RestoreOptions::default(),
        &handover,
        t_restore,
    );
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

/// A thread joined when this is dropped, on every path out.
pub(super) struct JoinOnDrop(Option<std::thread::JoinHandle<()>>);

impl Drop for JoinOnDrop {
    fn drop(&mut self) {
        if let Some(t) = self.0.take() {
            let _ = t.join();
        }
    }
}
