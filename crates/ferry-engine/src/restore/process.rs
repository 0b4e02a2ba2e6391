//! Resource limits and credentials, set last: lowering them earlier would
//! get in the way of the restore itself.

use super::Session;
use crate::inject::{check, Call};
use crate::error::{EngineError, Result};
use ferry_image::ProcessImage;

pub fn restore_limits(pid: i32, image: &ProcessImage) -> Result<()> {
    for r in &image.rlimits {
        ferry_sys::process::set_rlimit(pid, r.resource, r.soft, r.hard)
            .map_err(|e| EngineError::kernel(pid, format!("setting rlimit {}", r.resource), e))?;
    }
    Ok(())
}

/// Dumpable, THP-disable and child-subreaper, in one batch.
pub fn restore_misc(s: &mut Session) -> Result<()> {
    const PR_SET_DUMPABLE: u64 = 4;
    const PR_SET_CHILD_SUBREAPER: u64 = 36;
    const PR_SET_THP_DISABLE: u64 = 41;
    let m = s.image.misc;
    let calls = [
        Call::new(libc::SYS_prctl, &[PR_SET_DUMPABLE, m.dumpable as u64]),
        Call::new(libc::SYS_prctl, &[PR_SET_THP_DISABLE, m.thp_disable as u64, 0, 0, 0]),
        Call::new(libc::SYS_prctl, &[PR_SET_CHILD_SUBREAPER, m.child_subreaper as u64]),
    ];
    let r = s.remote.batch(s.pid, s.scratch, &calls)?;
    for (name, v) in ["prctl(PR_SET_DUMPABLE)", "prctl(PR_SET_THP_DISABLE)", "prctl(PR_SET_CHILD_SUBREAPER)"].iter().zip(r) {
        check(s.pid, s.pid, name, v)?;
    }
    let path = format!("/proc/{}/oom_score_adj", s.pid);
    std::fs::write(&path, m.oom_score_adj.to_string()).map_err(|e| EngineError::io(&path, e))?;
    Ok(())
}

pub fn restore_creds(s: &mut Session) -> Result<()> {
    let c = &s.image.creds;
    if c.uids == [0; 4] && c.gids == [0; 4] && c.groups.is_empty() {
        return Ok(());
    }
    let groups: Vec<u8> = c.groups.iter().flat_map(|g| g.to_le_bytes()).collect();
    s.remote.write(s.data, &groups)?;
    s.call("setgroups", libc::SYS_setgroups, &[c.groups.len() as u64, s.data])?;
    s.call("setresgid", libc::SYS_setresgid, &[c.gids[0] as u64, c.gids[1] as u64, c.gids[2] as u64])?;
    s.call("setresuid", libc::SYS_setresuid, &[c.uids[0] as u64, c.uids[1] as u64, c.uids[2] as u64])?;
    Ok(())
}
