//! Each thread's I/O priority, the scheduling autogroup's nice value and
//! the audit loginuid and session (image format 4.8), with the cases
//! restore cannot give back refused by name.

use crate::error::{EngineError, Result};
use crate::proc_state::{audit_ids, autogroup};
use ferry_image::ProcessImage;
use std::collections::HashMap;

/// A loginuid or audit session id that was never set.
const UNSET: u32 = u32::MAX;

/// ioprio_get of every thread, in thread order.
pub fn ioprio(p: &ProcessImage) -> Result<Vec<u16>> {
    p.threads
        .iter()
        .map(|t| {
            let v = ferry_sys::process::ioprio_get(t.tid).map_err(|e| {
                EngineError::kernel(p.pid, format!("thread {}: ioprio_get", t.tid), e)
            })?;
            Ok(v as u16)
        })
        .collect()
}

/// Every process's autogroup (id, nice), read once.
pub fn autogroups(processes: &[ProcessImage]) -> Result<HashMap<i32, (u64, i32)>> {
    let mut out = HashMap::with_capacity(processes.len());
    for p in processes {
        if let Some(g) = autogroup(&p.pid.to_string())? {
            out.insert(p.pid, g);
        }
    }
    Ok(out)
}

/// The autogroup nice value restore sets for `p`: a session leader's
/// setsid makes a new autogroup (nice 0) that its session inherits, so
/// a nice value comes back when `p` is in the autogroup of its session's
/// leader, a process of the tree. Any other autogroup with a nice value
/// is refused.
pub fn autogroup_nice(
    p: &ProcessImage,
    processes: &[ProcessImage],
    groups: &HashMap<i32, (u64, i32)>,
) -> Result<Option<i32>> {
    let Some(&(id, nice)) = groups.get(&p.pid) else {
        return Ok(None);
    };
    if nice == 0 {
        return Ok(None);
    }
    let leader = processes.iter().find(|q| q.pid == p.sid && q.sid == q.pid);
    let leader_group = leader.and_then(|q| groups.get(&q.pid)).map(|g| g.0);
    if leader_group == Some(id) {
        return Ok(Some(nice));
    }
    let why = if leader.is_none() {
        format!("its session's leader (pid {}) is not in the tree", p.sid)
    } else {
        "it is not in the autogroup of its session".to_string()
    };
    Err(EngineError::unsupported(
        p.pid,
        "its autogroup",
        format!("the nice value of its scheduling autogroup is {nice} (set through /proc/PID/autogroup) and {why}: a restored process could not be in an autogroup of that nice value alone; not restored"),
    ))
}

/// The (loginuid, session id) of `p`, refused unless restore gives them
/// back: every thread has the leader's; a process of the tree inherits
/// its parent's; the root inherits the restoring ferry's (`own`), or
/// writes its loginuid, which gives it a session the kernel picks (none,
/// for an unset loginuid): no interface sets a session id.
pub fn audit(p: &ProcessImage, processes: &[ProcessImage], own: (u32, u32)) -> Result<(u32, u32)> {
    let ids = audit_ids(&p.pid.to_string())?;
    for t in p.threads.iter().filter(|t| t.tid != p.pid) {
        let theirs = audit_ids(&format!("{}/task/{}", p.pid, t.tid))?;
        if theirs != ids {
            return Err(refusal(p.pid, &format!("thread {}", t.tid), theirs, "its leader's", ids));
        }
    }
    if let Some(parent) = processes.iter().find(|q| q.pid == p.ppid) {
        let theirs = audit_ids(&parent.pid.to_string())?;
        return match ids == theirs {
            true => Ok(ids),
            false => Err(refusal(p.pid, "the process", ids, "its parent's", theirs)),
        };
    }
    if ids == own || ids == (UNSET, UNSET) {
        return Ok(ids);
    }
    Err(refusal(p.pid, "the process", ids, "ferry's", own))
}

fn refusal(pid: i32, who: &str, ids: (u32, u32), whose: &str, other: (u32, u32)) -> EngineError {
    let show = |v: u32| if v == UNSET { "unset".to_string() } else { v.to_string() };
    EngineError::unsupported(
        pid,
        format!("{who}: its loginuid and audit session"),
        format!(
            "loginuid {} in audit session {}, {whose} loginuid {} in session {}: a restored process inherits those, and writing a loginuid starts a session the kernel numbers itself; not restored",
            show(ids.0),
            show(ids.1),
            show(other.0),
            show(other.1)
        ),
    )
}
