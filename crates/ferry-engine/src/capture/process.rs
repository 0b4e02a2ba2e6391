//! Process-wide attributes: identity, credentials, cwd, umask, limits,
//! personality, no_new_privs.

use crate::error::Result;
use crate::inject::{check, Call};
use crate::procfs;
use ferry_image::{ProcessImage, ProcessMisc};

/// The process as /proc shows it (shared with the restore's check).
pub fn capture(pid: i32) -> Result<ProcessImage> {
    crate::proc_state::read(pid)
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
