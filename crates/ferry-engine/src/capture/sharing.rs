//! Kernel resources two processes of the tree share because one was made
//! with clone() flags meant for threads but without CLONE_THREAD
//! (CLONE_FILES, CLONE_FS, CLONE_VM, CLONE_SIGHAND), compared with kcmp.
//! A child sharing its parent's fd table is recorded and forked with
//! CLONE_FILES at restore. Every other sharing is refused, naming the two
//! processes and the resource: ferry would restore separate copies, and a
//! close in one would no longer show in the other.

use crate::error::{EngineError, Result};
use ferry_sys::process as sp;

// Not KCMP_SYSVSEM: two processes without an undo list compare equal.
const KINDS: [(i32, &str, &str); 4] = [
    (sp::KCMP_FILES, "fd table", "CLONE_FILES"),
    (sp::KCMP_FS, "working directory, root and umask", "CLONE_FS"),
    (sp::KCMP_VM, "address space", "CLONE_VM, e.g. vfork"),
    (sp::KCMP_SIGHAND, "signal handlers", "CLONE_SIGHAND"),
];

/// Returns the processes that share their parent's fd table (restored
/// with CLONE_FILES); every other sharing is refused. `ppids[i]` is the
/// parent of `pids[i]`.
pub fn check(pids: &[i32], ppids: &[i32]) -> Result<Vec<i32>> {
    let mut with_parent = Vec::new();
    for (i, &a) in pids.iter().enumerate() {
        for (j, &b) in pids.iter().enumerate().skip(i + 1) {
            for (kind, what, flag) in KINDS {
                if kind == sp::KCMP_FILES && ppids[j] == a {
                    if sp::kcmp_shared(a, b, kind).map_err(|e| {
                        EngineError::kernel(
                            a,
                            format!("comparing its fd table with process {b} (kcmp)"),
                            e,
                        )
                    })? {
                        with_parent.push(b);
                    }
                    continue;
                }
                if sp::kcmp_shared(a, b, kind).map_err(|e| {
                    EngineError::kernel(
                        a,
                        format!("comparing its {what} with process {b} (kcmp)"),
                        e,
                    )
                })? {
                    return Err(EngineError::unsupported(
                        b,
                        format!("its {what}"),
                        format!("it is shared with process {a} of the tree ({flag} without CLONE_THREAD); ferry would restore two separate copies"),
                    ));
                }
            }
        }
    }
    // Only parent and child may share: a process sharing with one that
    // shares with its own parent shares with the grandparent too, which
    // the pairwise check above refused already.
    Ok(with_parent)
}

/// The tree's root shares none of these with its parent, which stays
/// outside the tree: restored alone, the root would get its own copy
/// while the parent kept the old one (a child made with CLONE_FILES or
/// CLONE_VM and taken without its parent).
pub fn check_outside(root: i32, parent: i32) -> Result<()> {
    if parent <= 1 {
        return Ok(());
    }
    for (kind, what, flag) in KINDS {
        // A parent gone meanwhile shares nothing any more.
        if sp::kcmp_shared(root, parent, kind).unwrap_or(false) {
            let comm =
                crate::procfs::read_string(&format!("/proc/{parent}/comm")).unwrap_or_default();
            return Err(EngineError::unsupported(
                root,
                format!("its {what}"),
                format!(
                    "it is shared with its parent {parent} ({}), outside the tree ({flag} without CLONE_THREAD); restored alone it would be a separate copy (take the tree from that parent)",
                    comm.trim()
                ),
            ));
        }
    }
    Ok(())
}
