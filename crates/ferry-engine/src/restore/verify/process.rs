//! The process as /proc shows it: identity, credentials, limits,
//! directories, umask, personality, no_new_privs, cgroup v2 membership. Read with the code the
//! checkpoint uses (`proc_state.rs`), so both sides see the same fields
//! the same way.

use super::Findings;
use crate::error::{EngineError, Result};
use ferry_image::ProcessImage;

/// `tree_pids`: every PID of the tree. A process group or session led
/// outside the tree cannot be made again: the restored process is in the
/// restoring ferry's (the checkpoint accepted that: `--parent-sees-exit`,
/// or a parent that is init or ferry), so only one led in the tree is
/// compared.
pub(super) fn compare(
    p: &ProcessImage,
    is_root: bool,
    tree_pids: &std::collections::HashSet<i32>,
    found: &mut Findings,
) -> Result<()> {
    let now = crate::proc_state::read(p.pid)?;
    let pid = p.pid;
    let what = "the process";
    found.compare(pid, what, "name", &p.comm, &now.comm);
    found.compare(pid, what, "executable", &p.exe, &now.exe);
    found.compare(pid, what, "working directory", &p.cwd, &now.cwd);
    found.compare(pid, what, "root directory", &p.root, &now.root);
    found.compare(pid, what, "umask", p.umask, now.umask);
    found.compare(pid, what, "personality", p.personality, now.personality);
    found.compare(pid, what, "no_new_privs", p.no_new_privs, now.no_new_privs);
    found.compare(pid, what, "credentials", &p.creds, &now.creds);
    found.compare(pid, what, "resource limits", &p.rlimits, &now.rlimits);
    if tree_pids.contains(&p.pgid) {
        found.compare(pid, what, "process group", p.pgid, now.pgid);
    }
    if tree_pids.contains(&p.sid) {
        found.compare(pid, what, "session", p.sid, now.sid);
    }
    if !is_root {
        // The root's parent is whoever restored it.
        found.compare(pid, what, "parent", p.ppid, now.ppid);
    }
    Ok(())
}

/// The attributes of the image's `ProcessAttrs` section.
pub(super) fn compare_attrs(
    p: &ProcessImage,
    attrs: Option<&ferry_image::ProcessAttrs>,
    found: &mut Findings,
) -> Result<()> {
    let Some(attrs) = attrs else {
        return Ok(());
    };
    let now = crate::proc_state::coredump_filter(p.pid)?;
    found.compare(p.pid, "the process", "coredump_filter", attrs.coredump_filter, now);
    for (t, &prio) in p.threads.iter().zip(&attrs.ioprio) {
        let tid = t.tid;
        let now = ferry_sys::process::ioprio_get(tid)
            .map_err(|e| EngineError::kernel(p.pid, format!("thread {tid}: ioprio_get"), e))?;
        if !crate::proc_state::same_ioprio(i32::from(prio), now) {
            found.compare(p.pid, &format!("thread {tid}"), "I/O priority", prio as i32, now);
        }
    }
    if let Some(nice) = attrs.autogroup_nice {
        let now = crate::proc_state::autogroup(&p.pid.to_string())?.map(|g| g.1);
        found.compare(p.pid, "the process", "autogroup nice", Some(nice), now);
    }
    if let Some(ids) = attrs.audit {
        let now = crate::proc_state::audit_ids(&p.pid.to_string())?;
        found.compare(p.pid, "the process", "loginuid and audit session", ids, now);
    }
    Ok(())
}

/// The cgroup v2 membership the image records for `p` (`ferry replace
/// --cgroup` edits it), against /proc/PID/cgroup. v1 hierarchies are
/// left out: their ids differ between hosts and one the restoring host
/// has not mounted is skipped by the restore, as is the v2 root.
pub(super) fn compare_cgroup(
    p: &ProcessImage,
    cgroups: Option<&ferry_image::CgroupImage>,
    found: &mut Findings,
) -> Result<()> {
    let v2 = |m: &&ferry_image::CgroupMembership| m.hierarchy == 0 && m.controllers.is_empty();
    let recorded = cgroups
        .and_then(|c| c.processes.iter().find(|c| c.pid == p.pid))
        .and_then(|c| c.memberships.iter().find(v2));
    // The root cgroup is skipped by the restore when the hierarchy is not
    // mounted where it runs; the process then stays where it was made.
    let Some(recorded) = recorded.filter(|m| m.path != "/") else {
        return Ok(());
    };
    let text = crate::procfs::read_string(&format!("/proc/{}/cgroup", p.pid))?;
    let now = crate::procfs::parse_cgroup(&text).unwrap_or_default();
    let now = now.iter().find(v2).map(|m| m.path.as_str());
    found.compare(p.pid, "the process", "cgroup v2", Some(recorded.path.as_str()), now);
    Ok(())
}
