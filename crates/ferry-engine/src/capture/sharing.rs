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
///
/// One fd table may be shared by a whole subtree (zdtm fdt_shared: two
/// children and a grandchild made with CLONE_FILES share the root's):
/// each of them is forked with CLONE_FILES from a parent that already
/// has the table. Processes that share a table but are not linked by
/// such parent-child steps (a process in between unshared it) are
/// refused: no order of forks gives them one table again.
pub fn check(pids: &[i32], ppids: &[i32]) -> Result<Vec<i32>> {
    let shared = |a: i32, b: i32, kind: i32, what: &str| {
        sp::kcmp_shared(a, b, kind).map_err(|e| {
            EngineError::kernel(a, format!("comparing its {what} with process {b} (kcmp)"), e)
        })
    };
    let mut with_parent = Vec::new();
    for (&b, &parent) in pids.iter().zip(ppids).skip(1) {
        if pids.contains(&parent) && shared(parent, b, sp::KCMP_FILES, "fd table")? {
            with_parent.push(b);
        }
    }
    let tops = table_tops(pids, ppids, &with_parent);
    for (i, &a) in pids.iter().enumerate() {
        for (j, &b) in pids.iter().enumerate().skip(i + 1) {
            for (kind, what, flag) in KINDS {
                if kind == sp::KCMP_FILES && tops[i] == tops[j] {
                    continue;
                }
                if shared(a, b, kind, what)? {
                    return Err(EngineError::unsupported(
                        b,
                        format!("its {what}"),
                        format!("it is shared with process {a} of the tree ({flag} without CLONE_THREAD), not through a line of parents that all share it; ferry would restore two separate copies"),
                    ));
                }
            }
        }
    }
    Ok(with_parent)
}

/// For each process, the one reached by going up from child to parent
/// while the child shares its parent's fd table: two processes with the
/// same one get one table from the forks with CLONE_FILES.
fn table_tops(pids: &[i32], ppids: &[i32], with_parent: &[i32]) -> Vec<i32> {
    let index: std::collections::HashMap<i32, usize> =
        pids.iter().enumerate().map(|(i, &p)| (p, i)).collect();
    let sharing: std::collections::HashSet<i32> = with_parent.iter().copied().collect();
    let mut tops: Vec<i32> = Vec::with_capacity(pids.len());
    for (i, &p) in pids.iter().enumerate() {
        // Parents come first, so a sharing child takes its parent's top.
        let top = match index.get(&ppids[i]) {
            Some(&k) if sharing.contains(&p) && k < i => tops[k],
            _ => p,
        };
        tops.push(top);
    }
    tops
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

#[cfg(test)]
mod tests {
    use super::table_tops;

    #[test]
    fn a_subtree_sharing_one_table_has_one_top() {
        // 1 -> 2 -> 4, 1 -> 3, 1 -> 5 -> 6; 2, 3 and 4 share 1's table
        // (zdtm fdt_shared), 6 shares 5's, 5 has its own.
        let tops = table_tops(&[1, 2, 3, 4, 5, 6], &[0, 1, 1, 2, 1, 5], &[2, 3, 4, 6]);
        assert_eq!(tops, [1, 1, 1, 1, 5, 5]);
    }

    #[test]
    fn a_process_between_with_its_own_table_splits_the_line() {
        // 1 -> 2 -> 3: 3 shares 2's table, 2 does not share 1's.
        assert_eq!(table_tops(&[1, 2, 3], &[0, 1, 2], &[3]), [1, 2, 2]);
        assert_eq!(table_tops(&[1, 2, 3], &[0, 1, 2], &[]), [1, 2, 3]);
    }
}
