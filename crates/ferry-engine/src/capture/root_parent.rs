//! The parent that stays behind. A checkpoint (without
//! `--leave-running`) or a migration ends the tree at the source, and the
//! root's parent, which is not part of the tree, sees its child exit
//! (SIGCHLD, `waitpid`); the restored copy has another parent. When the
//! root is part of its parent's own job (a worker of a master process, a
//! child of a program that waits for it), that parent would respawn it,
//! fail or wait forever: refused by name unless the user asks for it
//! with `--parent-sees-exit`.
//!
//! The rule: refused when the root is in its parent's process group and
//! the parent is neither init (PID 1 of the root's or ferry's PID
//! namespace) nor a ferry process (`ferry restore` or the agent that
//! restored the tree, which keep waiting for it by design). A root that
//! leads its own process group or session (a shell job, `setsid`, a
//! daemon, a service a supervisor started in its own group) was started
//! as a service of its own: its parent seeing it exit is what a
//! checkpoint of it means.

use crate::error::{EngineError, Result};
use crate::procfs;

/// What the rule looks at, read from /proc.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ParentView {
    pub ppid: i32,
    /// The parent's PID in its own innermost PID namespace (1 for init).
    pub parent_ns_pid: i32,
    pub parent_comm: String,
    pub root_pgid: i32,
    pub parent_pgid: i32,
}

/// Whether the parent would see the root exit as part of its own job:
/// the pure rule, on what [`ParentView::read`] found.
pub(crate) fn is_parent_behind(v: &ParentView) -> bool {
    let init = v.ppid <= 1 || v.parent_ns_pid == 1;
    let ferry = matches!(v.parent_comm.as_str(), "ferry" | "ferryd" | "ferry-init");
    !init && !ferry && v.root_pgid == v.parent_pgid
}

impl ParentView {
    /// None when the root or its parent is gone (nothing to see then).
    pub(crate) fn read(root: i32) -> Option<ParentView> {
        let st = procfs::Stat::read(root).ok()?;
        let ppid = st.field(4) as i32;
        let root_pgid = st.field(5) as i32;
        if ppid <= 0 {
            return Some(ParentView {
                ppid,
                parent_ns_pid: 0,
                parent_comm: String::new(),
                root_pgid,
                parent_pgid: 0,
            });
        }
        let parent_pgid = procfs::Stat::read(ppid).ok()?.field(5) as i32;
        let status = procfs::read_string(&format!("/proc/{ppid}/status")).ok()?;
        let parent_ns_pid = status
            .lines()
            .find_map(|l| l.strip_prefix("NSpid:"))
            .and_then(|l| l.split_whitespace().last()?.parse().ok())
            .unwrap_or(ppid);
        let parent_comm = procfs::read_string(&format!("/proc/{ppid}/comm"))
            .map(|c| c.trim().to_string())
            .unwrap_or_default();
        Some(ParentView { ppid, parent_ns_pid, parent_comm, root_pgid, parent_pgid })
    }
}

/// Refuses a root whose parent stays behind in its job (see the module
/// comment), unless `parent_sees_exit` (the user's choice) or the tree
/// keeps running (`--leave-running`: nobody sees it exit).
pub fn check(root: i32, parent_sees_exit: bool, leave_running: bool) -> Result<()> {
    if parent_sees_exit || leave_running {
        return Ok(());
    }
    let Some(v) = ParentView::read(root) else { return Ok(()) };
    if !is_parent_behind(&v) {
        return Ok(());
    }
    // A group whose leader is outside this PID namespace shows as 0.
    let group = match v.parent_pgid {
        0 => "(led from outside this PID namespace)".to_string(),
        g => g.to_string(),
    };
    Err(EngineError::unsupported(
        root,
        format!("the process without its parent {} ({})", v.ppid, v.parent_comm),
        format!(
            "it runs in its parent's process group {group}, as part of the parent's job, and the parent stays outside the tree: it would see the process exit (take the tree from the parent, or pass --parent-sees-exit to take it anyway: the parent sees it exit here and the restored copy gets another parent)"
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(ppid: i32, ns_pid: i32, comm: &str, root_pgid: i32, parent_pgid: i32) -> ParentView {
        ParentView { ppid, parent_ns_pid: ns_pid, parent_comm: comm.into(), root_pgid, parent_pgid }
    }

    #[test]
    fn a_child_in_its_parents_group_is_left_behind_by_its_parent() {
        assert!(is_parent_behind(&view(500, 500, "nginx", 500, 500)));
        assert!(is_parent_behind(&view(500, 500, "bash", 400, 400)));
    }

    #[test]
    fn a_job_or_session_of_its_own_init_and_ferry_are_not() {
        // Its own process group (shell job, setsid, daemon).
        assert!(!is_parent_behind(&view(500, 500, "bash", 600, 500)));
        // Init of ferry's namespace, or of a container's.
        assert!(!is_parent_behind(&view(1, 1, "systemd", 1, 1)));
        assert!(!is_parent_behind(&view(700, 1, "sh", 700, 700)));
        assert!(!is_parent_behind(&view(0, 0, "", 0, 0)));
        // ferry restore, ferryd or ferry's namespace init holds it.
        assert!(!is_parent_behind(&view(800, 800, "ferry", 800, 800)));
        assert!(!is_parent_behind(&view(800, 800, "ferryd", 800, 800)));
    }

    #[test]
    fn this_test_is_in_its_parents_group_or_not_and_the_check_agrees() {
        let me = std::process::id() as i32;
        let v = ParentView::read(me).expect("own view");
        let refused = check(me, false, false).is_err();
        assert_eq!(refused, is_parent_behind(&v));
        assert!(check(me, true, false).is_ok());
        assert!(check(me, false, true).is_ok());
    }
}
