//! Process-wide attributes: identity, credentials, cwd, umask, limits,
//! personality, no_new_privs.

use crate::error::{EngineError, Result};
use crate::procfs::{self, key_values, Stat};
use crate::inject::{check, Call};
use ferry_image::{Creds, MmLayout, ProcessImage, ProcessMisc, Rlimit, SignalState};

/// A single process is captured; children would be left behind.
pub fn refuse_children(pid: i32) -> Result<()> {
    for tid in procfs::tids(pid)? {
        let path = format!("/proc/{pid}/task/{tid}/children");
        let kids = procfs::read_string(&path).unwrap_or_default();
        if let Some(child) = kids.split_whitespace().next() {
            return Err(EngineError::unsupported(pid, format!("child process {child}"), "process trees are not supported yet"));
        }
    }
    Ok(())
}

fn ids(v: Option<&&str>) -> Vec<u32> {
    v.map(|s| s.split_whitespace().filter_map(|x| x.parse().ok()).collect()).unwrap_or_default()
}

fn four(v: Vec<u32>) -> [u32; 4] {
    let mut a = [0u32; 4];
    for (d, s) in a.iter_mut().zip(v) {
        *d = s;
    }
    a
}

pub fn capture(pid: i32) -> Result<ProcessImage> {
    let status_path = format!("/proc/{pid}/status");
    let status_text = procfs::read_string(&status_path)?;
    let status = key_values(&status_text);
    let stat = Stat::read(pid)?;
    let mut rlimits = Vec::new();
    for resource in 0..16u32 {
        let (soft, hard) = ferry_sys::process::get_rlimit(pid, resource)
            .map_err(|e| EngineError::kernel(pid, format!("reading rlimit {resource}"), e))?;
        rlimits.push(Rlimit { resource, soft, hard });
    }
    let personality = procfs::read_string(&format!("/proc/{pid}/personality"))?;
    Ok(ProcessImage {
        pid,
        ppid: stat.field(4) as i32,
        pgid: stat.field(5) as i32,
        sid: stat.field(6) as i32,
        comm: procfs::read_string(&format!("/proc/{pid}/comm"))?.trim_end_matches('\n').to_string(),
        exe: procfs::read_link(&format!("/proc/{pid}/exe"))?,
        cwd: procfs::read_link(&format!("/proc/{pid}/cwd"))?,
        umask: status.get("Umask").and_then(|v| procfs::parse_octal(v)).unwrap_or(0o022) as u32,
        personality: procfs::parse_hex(&personality).unwrap_or(0) as u32,
        no_new_privs: status.get("NoNewPrivs").is_some_and(|v| *v == "1"),
        creds: Creds { uids: four(ids(status.get("Uid"))), gids: four(ids(status.get("Gid"))), groups: ids(status.get("Groups")) },
        rlimits,
        threads: Vec::new(),
        mm: MmLayout::default(),
        vmas: Vec::new(),
        page_runs: Vec::new(),
        files: Vec::new(),
        fds: Vec::new(),
        signals: SignalState::default(),
        itimers: Vec::new(),
        posix_timers: Vec::new(),
        misc: ProcessMisc::default(),
        memfds: Vec::new(),
    })
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
    let oom_score_adj = procfs::read_string(&format!("/proc/{}/oom_score_adj", ctx.pid))?.trim().parse().unwrap_or(0);
    Ok((brk, ProcessMisc { dumpable, thp_disable, child_subreaper, oom_score_adj }))
}
