//! Process-wide attributes: identity, credentials, cwd, umask, limits,
//! personality, no_new_privs; and the ones refused when set
//! (loginuid, autogroup nice, I/O priority).

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
    let attrs = processes.iter().map(|p| {
        let netns = crate::proc_state::netns_inode(&p.pid.to_string())?;
        Ok(ProcessAttrs {
            coredump_filter: crate::proc_state::coredump_filter(p.pid)?,
            netns: (netns != own_netns).then_some(netns),
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

/// Per-process attributes ferry does not restore, refused when they
/// differ from what a restored process gets (a child of ferry inherits
/// ferry's loginuid and I/O priority; a new session
/// gets an autogroup of nice 0), and a /proc/PID/stat longer than the
/// catalog knows.
pub fn check_unrestored(pid: i32, tids: &[i32]) -> Result<()> {
    if let Some(why) = catalog::stat_refusal(procfs::Stat::read(pid)?.count()) {
        return Err(EngineError::unsupported(pid, "/proc/PID/stat", why));
    }
    let own = |name: &str| procfs::read_string(&format!("/proc/self/{name}")).unwrap_or_default();
    let (theirs, mine) = (procfs::read_string(&format!("/proc/{pid}/loginuid"))?, own("loginuid"));
    if theirs.trim() != mine.trim() {
        return Err(EngineError::unsupported(
            pid,
            "its loginuid",
            format!(
                "loginuid is {} (a restored process gets {}); not restored",
                theirs.trim(),
                mine.trim()
            ),
        ));
    }
    // "/autogroup-123 nice 5"; absent without CONFIG_SCHED_AUTOGROUP.
    if let Ok(text) = procfs::read_string(&format!("/proc/{pid}/autogroup")) {
        let nice = text.split_whitespace().nth(2).unwrap_or("0");
        if nice != "0" {
            return Err(EngineError::unsupported(
                pid,
                "its autogroup",
                format!("the nice value of its scheduling autogroup is {nice} (set through /proc/PID/autogroup); not restored"),
            ));
        }
    }
    check_ioprio(pid, tids)
}

/// The I/O priority of each thread against ferry's own, which a restored
/// thread inherits. Class NONE (the top 3 bits 0) is the default
/// whatever its level, which follows the nice value.
fn check_ioprio(pid: i32, tids: &[i32]) -> Result<()> {
    let class = |v: i32| v >> 13;
    let mine = ferry_sys::process::ioprio_get(0).unwrap_or(0);
    for &tid in tids {
        let theirs = ferry_sys::process::ioprio_get(tid)
            .map_err(|e| EngineError::kernel(pid, format!("thread {tid}: ioprio_get"), e))?;
        let default = class(theirs) == 0 && class(mine) == 0;
        if theirs != mine && !default {
            return Err(EngineError::unsupported(
                pid,
                format!("thread {tid}: its I/O priority"),
                format!(
                    "ioprio_set class {} level {} (a restored thread gets class {} level {}); not restored",
                    class(theirs),
                    theirs & 0x1fff,
                    class(mine),
                    mine & 0x1fff
                ),
            ));
        }
    }
    Ok(())
}
