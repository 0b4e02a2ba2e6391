//! Where a restored tree lands, decided once for every kind of restore:
//! in ferry's own PID namespace, or in a new one under a helper that
//! becomes its init. A restore from an image and a migration both ask
//! here, with their own preference.

use super::handover::Handover;
use super::{pidns, Held, HeldInNamespace, RestoreOptions, Restored};
use crate::error::Result;
use ferry_image::TreeImage;
use std::time::Instant;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// ferry's own PID namespace: every PID must be free here.
    Here,
    /// A new PID namespace (and mount namespace for its /proc).
    NewPidNamespace,
}

impl Placement {
    /// A restore from an image: a new namespace when asked for, or when
    /// the tree had one of its own; else here, where a taken PID is
    /// refused by name.
    pub fn for_image(tree: &TreeImage, new_pid_ns: bool) -> Placement {
        if new_pid_ns || tree.own_pid_namespace {
            Placement::NewPidNamespace
        } else {
            Placement::Here
        }
    }

    /// A migration: here when every PID of the tree is free here and
    /// nothing ties the tree to a parent that would be this agent's
    /// worker: no PID namespace of its own, no parent-death signal on
    /// the root's threads, the root exits with SIGCHLD (the worker exits
    /// after the migration and the root then belongs to ferryd, the child
    /// subreaper; adoption resets the exit signal to SIGCHLD), and not
    /// post-copy (whose pager needs the tree in a namespace it can wait
    /// on). Else a new namespace, where no PID can be taken.
    pub fn for_migration(tree: &TreeImage, lazy: bool) -> Placement {
        let Some(root) = tree.root() else {
            return Placement::NewPidNamespace;
        };
        let here = !lazy
            && !tree.own_pid_namespace
            && root.fidelity.threads.iter().all(|t| t.pdeathsig == 0)
            && root.fidelity.exit_signal == libc::SIGCHLD
            && super::pids_free_here(tree);
        if here {
            Placement::Here
        } else {
            Placement::NewPidNamespace
        }
    }

    /// Restores the tree where this placement says, and holds it stopped.
    pub fn restore_held(
        self,
        tree: TreeImage,
        pages: &[u8],
        opts: &RestoreOptions,
        handover: &Handover,
        t0: Instant,
    ) -> Result<HeldTree> {
        // Both forks need ferry's one thread: a capture in this process
        // may have left one freeing its image.
        crate::parallel::join_detached();
        match self {
            Placement::Here => super::restore_held(tree, pages, opts, handover, t0)
                .map(|h| HeldTree::Here(Box::new(h))),
            Placement::NewPidNamespace => {
                pidns::restore_held(tree, pages, opts, handover, t0).map(HeldTree::InNamespace)
            }
        }
    }
}

/// A restored tree held stopped, wherever it was placed. Held is boxed:
/// it is a thousand bytes, moved through every phase to the release.
pub enum HeldTree {
    Here(Box<Held>),
    InNamespace(HeldInNamespace),
}

impl HeldTree {
    /// The restore's phases, as (name, ms).
    pub fn phases(&self) -> Vec<(String, f64)> {
        match self {
            HeldTree::Here(h) => h.phases().done().to_vec(),
            HeldTree::InNamespace(h) => h.phases.clone(),
        }
    }

    /// Post-copy: (image PID, userfaultfd) of each process with lazy
    /// pages, for the caller's pager.
    pub fn take_uffds(&mut self) -> Vec<(i32, std::os::fd::OwnedFd)> {
        match self {
            HeldTree::Here(h) => h.take_uffds(),
            HeldTree::InNamespace(h) => std::mem::take(&mut h.uffds),
        }
    }

    /// Lets the tree run and calls `running` as soon as it does (before
    /// the network lock is taken down, which the helper of a new
    /// namespace does on its own after reporting).
    pub fn release_then(self, running: impl FnOnce(&Restored)) -> Result<Restored> {
        match self {
            HeldTree::Here(h) => h.release_then(running),
            HeldTree::InNamespace(h) => {
                let r = h.release()?;
                running(&r);
                Ok(r)
            }
        }
    }

    pub fn release(self) -> Result<Restored> {
        self.release_then(|_| ())
    }
}
