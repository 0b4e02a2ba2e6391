//! Kernel resources two processes of the tree share because one was made
//! with clone() flags meant for threads but without CLONE_THREAD
//! (CLONE_FILES, CLONE_FS, CLONE_VM, CLONE_SIGHAND). ferry
//! restores every process with its own copy, so after a restore a close
//! in one would no longer show in the other: such a tree is refused,
//! naming the two processes and the resource (compared with kcmp).

use crate::error::{EngineError, Result};
use ferry_sys::process as sp;

// Not KCMP_SYSVSEM: two processes without an undo list compare equal.
const KINDS: [(i32, &str, &str); 4] = [
    (sp::KCMP_FILES, "fd table", "CLONE_FILES"),
    (sp::KCMP_FS, "working directory, root and umask", "CLONE_FS"),
    (sp::KCMP_VM, "address space", "CLONE_VM, e.g. vfork"),
    (sp::KCMP_SIGHAND, "signal handlers", "CLONE_SIGHAND"),
];

pub fn check(pids: &[i32]) -> Result<()> {
    for (i, &a) in pids.iter().enumerate() {
        for &b in &pids[i + 1..] {
            for (kind, what, flag) in KINDS {
                if sp::kcmp_shared(a, b, kind).map_err(|e| EngineError::kernel(a, format!("comparing its {what} with process {b} (kcmp)"), e))? {
                    return Err(EngineError::unsupported(
                        b,
                        format!("its {what}"),
                        format!("it is shared with process {a} of the tree ({flag} without CLONE_THREAD); ferry would restore two separate copies"),
                    ));
                }
            }
        }
    }
    Ok(())
}
