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

/// User and group ids, supplementary groups and capability sets, set in
/// every thread (credentials are per thread; the raw syscalls change only
/// the caller). Skipped when the process had all of root's powers, which
/// the restored process has already.
pub fn restore_creds(s: &mut Session, tids: &[i32]) -> Result<()> {
    const PR_SET_KEEPCAPS: u64 = 8;
    const PR_CAPBSET_DROP: u64 = 24;
    const PR_CAP_AMBIENT: u64 = 47;
    const PR_CAP_AMBIENT_RAISE: u64 = 2;
    const CAPABILITY_V3: u32 = 0x2008_0522;
    let c = s.image.creds.clone();
    let last_cap: u32 = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap").ok().and_then(|v| v.trim().parse().ok()).unwrap_or(40);
    let all: u64 = if last_cap >= 63 { !0 } else { (1u64 << (last_cap + 1)) - 1 };
    let full = |m: u64| m & all == all;
    let caps = c.caps;
    if c.uids == [0; 4] && c.gids == [0; 4] && full(caps.permitted) && full(caps.effective) && full(caps.bounding) && caps.ambient == 0 {
        return Ok(());
    }
    // Argument area: groups at 0, capset header at 4096, capset data after it.
    let groups: Vec<u8> = c.groups.iter().flat_map(|g| g.to_le_bytes()).collect();
    let mut capset = Vec::new();
    capset.extend_from_slice(&CAPABILITY_V3.to_le_bytes());
    capset.extend_from_slice(&0i32.to_le_bytes());
    // struct __user_cap_data_struct[2]: {effective, permitted, inheritable} for bits 0-31, then 32-63.
    for shift in [0u32, 32] {
        for set in [caps.effective, caps.permitted, caps.inheritable] {
            capset.extend_from_slice(&((set >> shift) as u32).to_le_bytes());
        }
    }
    s.remote.write(s.data, &groups)?;
    s.remote.write(s.data + 4096, &capset)?;
    let mut calls: Vec<(String, Call)> = Vec::new();
    for cap in 0..=u64::from(last_cap) {
        if caps.bounding & (1 << cap) == 0 {
            calls.push((format!("prctl(PR_CAPBSET_DROP, {cap})"), Call::new(libc::SYS_prctl, &[PR_CAPBSET_DROP, cap])));
        }
    }
    calls.push(("prctl(PR_SET_KEEPCAPS)".into(), Call::new(libc::SYS_prctl, &[PR_SET_KEEPCAPS, 1])));
    calls.push(("setgroups".into(), Call::new(libc::SYS_setgroups, &[c.groups.len() as u64, s.data])));
    calls.push(("setresgid".into(), Call::new(libc::SYS_setresgid, &[c.gids[0] as u64, c.gids[1] as u64, c.gids[2] as u64])));
    calls.push(("setresuid".into(), Call::new(libc::SYS_setresuid, &[c.uids[0] as u64, c.uids[1] as u64, c.uids[2] as u64])));
    calls.push(("capset".into(), Call::new(libc::SYS_capset, &[s.data + 4096, s.data + 4096 + 8])));
    calls.push(("prctl(PR_SET_KEEPCAPS, 0)".into(), Call::new(libc::SYS_prctl, &[PR_SET_KEEPCAPS, 0])));
    for cap in 0..=u64::from(last_cap) {
        if caps.ambient & (1 << cap) != 0 {
            calls.push((format!("raising ambient capability {cap}"), Call::new(libc::SYS_prctl, &[PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, cap])));
        }
    }
    for &tid in tids {
        s.run(tid, &calls)?;
    }
    Ok(())
}
