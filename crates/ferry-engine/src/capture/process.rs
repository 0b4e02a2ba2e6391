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

const PR_GET_DUMPABLE: u64 = 3;
const PR_GET_CHILD_SUBREAPER: u64 = 37;
const PR_GET_THP_DISABLE: u64 = 42;

/// Bytes of the data area [`injected_calls`] write, from their `at`.
pub(super) const INJECTED_DATA_LEN: usize = 4;

/// brk and the prctl attributes only the process itself can read,
/// results at `at`.
pub(super) fn injected_calls(at: u64) -> Vec<Call> {
    vec![
        Call::new(libc::SYS_brk, &[0]),
        Call::new(libc::SYS_prctl, &[PR_GET_DUMPABLE]),
        Call::new(libc::SYS_prctl, &[PR_GET_THP_DISABLE]),
        Call::new(libc::SYS_prctl, &[PR_GET_CHILD_SUBREAPER, at]),
    ]
}

/// (brk, the rest) from the results of [`injected_calls`] and the data
/// they wrote.
pub(super) fn injected_parse(pid: i32, r: &[i64], out: &[u8]) -> Result<(u64, ProcessMisc)> {
    let brk = check(pid, pid, "brk", r[0])?;
    let dumpable = check(pid, pid, "prctl(PR_GET_DUMPABLE)", r[1])? as u32;
    let thp_disable = check(pid, pid, "prctl(PR_GET_THP_DISABLE)", r[2])? != 0;
    check(pid, pid, "prctl(PR_GET_CHILD_SUBREAPER)", r[3])?;
    let child_subreaper = out[..4].iter().any(|&b| b != 0);
    let oom_score_adj =
        procfs::read_string(&format!("/proc/{pid}/oom_score_adj"))?.trim().parse().unwrap_or(0);
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
