//! Process-wide attributes: identity, credentials, cwd, umask, limits,
//! personality, no_new_privs; coredump_filter and (in `sched_audit`)
//! I/O priorities, the autogroup nice value and the audit ids.

use super::sched_audit;
use crate::catalog::proc_status as catalog;
use crate::error::{EngineError, Result};
use crate::inject::{check, Call};
use crate::procfs;
use ferry_image::{ProcessAttrs, ProcessAttrsImage, ProcessImage, ProcessMisc};

/// The process as /proc shows it (shared with the restore's check).
pub fn capture(pid: i32) -> Result<ProcessImage> {
    crate::proc_state::read(pid)
}

/// The attributes of each process (host PIDs, in tree order) that the
/// image's `ProcessAttrs` section holds.
pub fn capture_attrs(processes: &[ProcessImage]) -> Result<ProcessAttrsImage> {
    let own_netns = crate::proc_state::netns_inode("thread-self")?;
    let own_audit = crate::proc_state::audit_ids("self")?;
    let groups = sched_audit::autogroups(processes)?;
    let attrs = processes.iter().map(|p| {
        let netns = crate::proc_state::netns_inode(&p.pid.to_string())?;
        Ok(ProcessAttrs {
            coredump_filter: crate::proc_state::coredump_filter(p.pid)?,
            netns: (netns != own_netns).then_some(netns),
            ioprio: sched_audit::ioprio(p)?,
            autogroup_nice: sched_audit::autogroup_nice(p, processes, &groups)?,
            audit: Some(sched_audit::audit(p, processes, own_audit)?),
        })
    });
    Ok(ProcessAttrsImage { processes: attrs.collect::<Result<_>>()? })
}

/// brk and the prctl attributes only the process itself can read.
pub fn capture_injected(ctx: &super::Ctx) -> Result<(u64, ProcessMisc)> {
    const PR_GET_DUMPABLE: u64 = 3;
    const PR_GET_CHILD_SUBREAPER: u64 = 37;
    const PR_GET_THP_DISABLE: u64 = 42;
    let calls = [
        Call::new(libc::SYS_brk, &[0]),
        Call::new(libc::SYS_prctl, &[PR_GET_DUMPABLE]),
        Call::new(libc::SYS_prctl, &[PR_GET_THP_DISABLE]),
        Call::new(libc::SYS_prctl, &[PR_GET_CHILD_SUBREAPER, ctx.data]),
    ];
    let r = ctx.remote.batch(ctx.pid, ctx.scratch, &calls)?;
    let brk = check(ctx.pid, ctx.pid, "brk", r[0])?;
    let dumpable = check(ctx.pid, ctx.pid, "prctl(PR_GET_DUMPABLE)", r[1])? as u32;
    let thp_disable = check(ctx.pid, ctx.pid, "prctl(PR_GET_THP_DISABLE)", r[2])? != 0;
    check(ctx.pid, ctx.pid, "prctl(PR_GET_CHILD_SUBREAPER)", r[3])?;
    let child_subreaper = ctx.remote.read(ctx.data, 4)?.iter().any(|&b| b != 0);
    let oom_score_adj = procfs::read_string(&format!("/proc/{}/oom_score_adj", ctx.pid))?
        .trim()
        .parse()
        .unwrap_or(0);
    Ok((brk, ProcessMisc { dumpable, thp_disable, child_subreaper, oom_score_adj }))
}

/// A /proc/PID/stat longer than the catalog knows. (The loginuid, the
/// autogroup nice value and the I/O priorities are captured with the
/// other process attributes, [`capture_attrs`].)
pub fn check_unrestored(pid: i32) -> Result<()> {
    if let Some(why) = catalog::stat_refusal(procfs::Stat::read(pid)?.count()) {
        return Err(EngineError::unsupported(pid, "/proc/PID/stat", why));
    }
    Ok(())
}
