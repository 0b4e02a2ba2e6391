//! Resource limits and credentials, set last: lowering them earlier would
//! get in the way of the restore itself.

use super::Session;
use crate::error::{EngineError, Result};
use crate::inject::Call;
use ferry_image::{ProcessAttrs, ProcessImage, TreeImage};

pub fn restore_limits(pid: i32, image: &ProcessImage) -> Result<()> {
    for r in &image.rlimits {
        ferry_sys::process::set_rlimit(pid, r.resource, r.soft, r.hard)
            .map_err(|e| EngineError::kernel(pid, format!("setting rlimit {}", r.resource), e))?;
    }
    Ok(())
}

/// THP-disable and child-subreaper: the calls, for a batch of the
/// leader's (they take no arguments in memory); oom_score_adj is written
/// from outside. Dumpable comes after the credentials: see dumpable_call.
pub fn misc_calls(s: &Session) -> Result<Vec<(String, Call)>> {
    const PR_SET_CHILD_SUBREAPER: u64 = 36;
    const PR_SET_THP_DISABLE: u64 = 41;
    let m = s.image.misc;
    let path = format!("/proc/{}/oom_score_adj", s.pid);
    std::fs::write(&path, m.oom_score_adj.to_string()).map_err(|e| EngineError::io(&path, e))?;
    Ok(vec![
        (
            "prctl(PR_SET_THP_DISABLE)".into(),
            Call::new(libc::SYS_prctl, &[PR_SET_THP_DISABLE, m.thp_disable as u64, 0, 0, 0]),
        ),
        (
            "prctl(PR_SET_CHILD_SUBREAPER)".into(),
            Call::new(libc::SYS_prctl, &[PR_SET_CHILD_SUBREAPER, m.child_subreaper as u64]),
        ),
    ])
}

/// The dumpable flag, to run after restore_creds: the kernel resets it
/// to /proc/sys/fs/suid_dumpable whenever an effective or filesystem id
/// changes, so a process of another user that had set it back to 1 came
/// back non-dumpable when it was set first.
pub fn dumpable_call(s: &Session) -> (String, Call) {
    const PR_SET_DUMPABLE: u64 = 4;
    (
        "prctl(PR_SET_DUMPABLE)".into(),
        Call::new(libc::SYS_prctl, &[PR_SET_DUMPABLE, s.image.misc.dumpable as u64]),
    )
}

/// User and group ids (real, effective, saved and filesystem),
/// supplementary groups, capability sets and securebits, set in every
/// thread (credentials are per thread; the raw syscalls change only the
/// caller). Skipped when the process has the image's already: it
/// inherited ferry's, which are often the same (root, or root with the
/// same capabilities dropped).
///
/// Order, in each thread, starting as root with every capability:
/// bounding-set drops; SECBIT_NO_SETUID_FIXUP, so the id changes keep the
/// capabilities the later steps need; groups, gids, uids; the filesystem
/// ids (setresuid resets them to the effective ones); a first capset
/// that sets the inheritable set with everything still permitted and
/// effective; ambient raises (they need the capability permitted and
/// inheritable); the image's securebits (needs CAP_SETPCAP); the final
/// capset, which only lowers.
pub fn restore_creds(s: &mut Session, tids: &[i32]) -> Result<()> {
    let c = s.image.creds.clone();
    let securebits = s.image.fidelity.securebits;
    let last_cap = last_cap();
    let now = creds_now(s)?;
    // Securebits are inherited too: the fork has ferry's.
    if securebits == inherited_securebits() && same_creds(&now, &c) {
        return Ok(());
    }
    write_cred_args(s, &c, now.caps.permitted)?;
    let calls = cred_calls(s.data, &c, last_cap, securebits);
    for &tid in tids {
        s.run(tid, &calls)?;
    }
    check_fs_ids(s.pid, &c)
}

/// What the restored process has now, inherited from ferry (the threads
/// were all made from it since).
fn creds_now(s: &Session) -> Result<ferry_image::Creds> {
    let path = format!("/proc/{}/status", s.pid);
    let status = crate::procfs::read_string(&path)?;
    Ok(crate::proc_state::creds(&crate::procfs::key_values(&status)))
}

/// Whether [`restore_creds`] has nothing to set: the process has the
/// image's credentials and securebits already.
pub fn creds_already_set(s: &Session) -> Result<bool> {
    Ok(s.image.fidelity.securebits == inherited_securebits()
        && same_creds(&creds_now(s)?, &s.image.creds))
}

/// The securebits every restored process inherits: ferry's own (a ferry
/// started with some, e.g. by a service manager, passes them on). Unknown
/// (the getter failed) matches no image, so they are always set.
fn inherited_securebits() -> u32 {
    const PR_GET_SECUREBITS: i32 = 27;
    static OWN: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *OWN.get_or_init(|| {
        u32::try_from(ferry_sys::process::prctl_get(PR_GET_SECUREBITS, 0)).unwrap_or(u32::MAX)
    })
}

/// The kernel's highest capability number (read once per ferry process).
fn last_cap() -> u32 {
    static LAST_CAP: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *LAST_CAP.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(40)
    })
}

/// Whether credentials `now` are those of the image (`want`): every id,
/// the groups in any order, every capability set.
fn same_creds(now: &ferry_image::Creds, want: &ferry_image::Creds) -> bool {
    now.uids == want.uids
        && now.gids == want.gids
        && same_groups(&Some(now.groups.clone()), &want.groups)
        && now.caps == want.caps
}

/// Whether `own` (unknown counts as different) holds the same groups as
/// the image's, in any order.
fn same_groups(own: &Option<Vec<u32>>, image: &[u32]) -> bool {
    let Some(own) = own else { return false };
    let (mut a, mut b) = (own.clone(), image.to_vec());
    a.sort_unstable();
    a.dedup();
    b.sort_unstable();
    b.dedup();
    a == b
}

/// struct __user_cap_header_struct + __user_cap_data_struct[2]:
/// {effective, permitted, inheritable} for bits 0-31, then 32-63.
fn capset_arg(e: u64, p: u64, i: u64) -> Vec<u8> {
    const CAPABILITY_V3: u32 = 0x2008_0522;
    let mut v = Vec::new();
    v.extend_from_slice(&CAPABILITY_V3.to_le_bytes());
    v.extend_from_slice(&0i32.to_le_bytes());
    for shift in [0u32, 32] {
        for set in [e, p, i] {
            v.extend_from_slice(&((set >> shift) as u32).to_le_bytes());
        }
    }
    v
}

/// Writes the arguments of `cred_calls` into the process's argument area:
/// groups at 0, first capset at 4096, final one at 4096 + 64.
/// `now_permitted`: the process's permitted set now (ferry's, which may
/// be less than every capability).
fn write_cred_args(s: &mut Session, c: &ferry_image::Creds, now_permitted: u64) -> Result<()> {
    let caps = c.caps;
    let groups: Vec<u8> = c.groups.iter().flat_map(|g| g.to_le_bytes()).collect();
    s.remote.write(s.data, &groups)?;
    s.remote.write(s.data + 4096, &capset_arg(now_permitted, now_permitted, caps.inheritable))?;
    s.remote
        .write(s.data + 4096 + 64, &capset_arg(caps.effective, caps.permitted, caps.inheritable))?;
    Ok(())
}

/// The calls each thread makes to take the recorded credentials, with
/// their arguments at `data` (see `write_cred_args`).
fn cred_calls(
    data: u64,
    c: &ferry_image::Creds,
    last_cap: u32,
    securebits: u32,
) -> Vec<(String, Call)> {
    const PR_CAPBSET_DROP: u64 = 24;
    const PR_SET_SECUREBITS: u64 = 28;
    const SECBIT_NO_SETUID_FIXUP: u64 = 1 << 2;
    const PR_CAP_AMBIENT: u64 = 47;
    const PR_CAP_AMBIENT_RAISE: u64 = 2;
    let caps = c.caps;
    let mut calls: Vec<(String, Call)> = Vec::new();
    for cap in 0..=u64::from(last_cap) {
        if caps.bounding & (1 << cap) == 0 {
            calls.push((
                format!("prctl(PR_CAPBSET_DROP, {cap})"),
                Call::new(libc::SYS_prctl, &[PR_CAPBSET_DROP, cap]),
            ));
        }
    }
    calls.push((
        "prctl(PR_SET_SECUREBITS, SECBIT_NO_SETUID_FIXUP)".into(),
        Call::new(libc::SYS_prctl, &[PR_SET_SECUREBITS, SECBIT_NO_SETUID_FIXUP]),
    ));
    calls
        .push(("setgroups".into(), Call::new(libc::SYS_setgroups, &[c.groups.len() as u64, data])));
    calls.push((
        "setresgid".into(),
        Call::new(libc::SYS_setresgid, &[c.gids[0] as u64, c.gids[1] as u64, c.gids[2] as u64]),
    ));
    calls.push((
        "setresuid".into(),
        Call::new(libc::SYS_setresuid, &[c.uids[0] as u64, c.uids[1] as u64, c.uids[2] as u64]),
    ));
    // setfs[ug]id return the previous id, never an error.
    calls.push(("setfsgid".into(), Call::new(libc::SYS_setfsgid, &[c.gids[3] as u64])));
    calls.push(("setfsuid".into(), Call::new(libc::SYS_setfsuid, &[c.uids[3] as u64])));
    calls.push((
        "capset(inheritable)".into(),
        Call::new(libc::SYS_capset, &[data + 4096, data + 4096 + 8]),
    ));
    for cap in 0..=u64::from(last_cap) {
        if caps.ambient & (1 << cap) != 0 {
            calls.push((
                format!("raising ambient capability {cap}"),
                Call::new(libc::SYS_prctl, &[PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, cap]),
            ));
        }
    }
    calls.push((
        format!("prctl(PR_SET_SECUREBITS, {securebits:#x})"),
        Call::new(libc::SYS_prctl, &[PR_SET_SECUREBITS, u64::from(securebits)]),
    ));
    calls.push((
        "capset".into(),
        Call::new(libc::SYS_capset, &[data + 4096 + 64, data + 4096 + 64 + 8]),
    ));
    calls
}

/// setfsuid cannot fail loudly: check what it did.
fn check_fs_ids(pid: i32, c: &ferry_image::Creds) -> Result<()> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let fs_of = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().nth(3))
            .and_then(|v| v.parse::<u32>().ok())
    };
    if fs_of("Uid:") != Some(c.uids[3]) || fs_of("Gid:") != Some(c.gids[3]) {
        return Err(EngineError::restore(
            pid,
            format!("filesystem uid/gid could not be set to {}/{}", c.uids[3], c.gids[3]),
        ));
    }
    Ok(())
}

/// The attributes the image's `ProcessAttrs` section holds for process
/// `p` of `tree` (None for an image older than the section).
pub(crate) fn attrs_of<'a>(tree: &'a TreeImage, p: &ProcessImage) -> Option<&'a ProcessAttrs> {
    let i = tree.processes.iter().position(|q| std::ptr::eq(q, p))?;
    tree.process_attrs.as_ref()?.processes.get(i)
}

/// coredump_filter, each thread's I/O priority and the autogroup nice
/// value, written from outside (the kernel takes them from a process
/// with CAP_SYS_NICE, or allowed to write the file).
pub fn restore_attrs(s: &Session, tree: &TreeImage) -> Result<()> {
    let Some(attrs) = attrs_of(tree, s.image) else {
        return Ok(());
    };
    let path = format!("/proc/{}/coredump_filter", s.pid);
    std::fs::write(&path, format!("{:#x}", attrs.coredump_filter))
        .map_err(|e| EngineError::io(&path, e))?;
    for (t, &prio) in s.image.threads.iter().zip(&attrs.ioprio) {
        let tid = t.tid;
        // Class NONE (whatever level ioprio_get derived from the nice
        // value) is set as such: a thread would otherwise keep ferry's.
        let prio = if prio >> 13 == 0 { 0 } else { i32::from(prio) };
        ferry_sys::process::ioprio_set(tid, prio).map_err(|e| {
            EngineError::kernel(s.pid, format!("thread {tid}: ioprio_set({prio:#x})"), e)
        })?;
    }
    if let Some(nice) = attrs.autogroup_nice {
        set_autogroup_nice(s.pid, nice)?;
    }
    Ok(())
}

/// Writes the nice value of the autogroup the restored process's session
/// made; never of ferry's own, which processes outside the tree share.
fn set_autogroup_nice(pid: i32, nice: i32) -> Result<()> {
    let theirs = crate::proc_state::autogroup(&pid.to_string())?;
    let ours = crate::proc_state::autogroup("self")?;
    match (theirs, ours) {
        (Some((id, _)), ours) if ours.map(|g| g.0) != Some(id) => {}
        _ => {
            return Err(EngineError::restore(
                pid,
                format!("it is not in an autogroup of its own session (autogroup {theirs:?}, ferry's {ours:?}): its nice value {nice} would not come back"),
            ))
        }
    }
    let path = format!("/proc/{pid}/autogroup");
    std::fs::write(&path, nice.to_string()).map_err(|e| EngineError::io(&path, e))
}

/// The loginuid the restored root must write itself: the image's when it
/// differs from this ferry's, which the root inherits.
pub fn root_loginuid(tree: &TreeImage, root: &ProcessImage) -> Result<Option<u32>> {
    let Some((loginuid, _)) = attrs_of(tree, root).and_then(|a| a.audit) else {
        return Ok(None);
    };
    let (own, _) = crate::proc_state::audit_ids("self")?;
    Ok((loginuid != own).then_some(loginuid))
}

#[cfg(test)]
mod group_tests {
    use super::same_groups;

    #[test]
    fn groups_compare_as_sets_and_unknown_differs() {
        assert!(same_groups(&Some(vec![]), &[]));
        assert!(same_groups(&Some(vec![4, 0]), &[0, 4]));
        assert!(!same_groups(&Some(vec![]), &[0]));
        assert!(!same_groups(&None, &[]));
    }
}
