//! Cgroup membership: which cgroup of every hierarchy each process is in
//! (/proc/PID/cgroup). Restore puts each process back into the same
//! cgroups right after it is forked, before it gets its memory, so the
//! memory is charged where it was. The cgroups themselves, with their
//! limits, are the host's: restore does not create them.

use crate::error::{EngineError, Result};
use crate::procfs;
use ferry_image::ProcessCgroups;

/// The memberships of every process of the tree. A thread in cgroups of
/// its own (cgroup v1 `tasks`, v2 threaded cgroups) is refused, naming
/// the thread: restore moves whole processes.
pub fn capture(procs: &[(i32, Vec<i32>)]) -> Result<Vec<ProcessCgroups>> {
    let mut out = Vec::with_capacity(procs.len());
    for (pid, tids) in procs {
        let text = procfs::read_string(&format!("/proc/{pid}/cgroup"))?;
        let memberships = procfs::parse_cgroup(&text).ok_or_else(|| {
            EngineError::restore(*pid, format!("unreadable /proc/{pid}/cgroup: {text:?}"))
        })?;
        for tid in tids.iter().filter(|t| *t != pid) {
            let theirs = procfs::read_string(&format!("/proc/{pid}/task/{tid}/cgroup"))?;
            if theirs != text {
                let line = theirs.lines().find(|l| !text.lines().any(|o| o == *l)).unwrap_or("?");
                return Err(EngineError::unsupported(
                    *pid,
                    format!("thread {tid}'s cgroup membership"),
                    format!("the thread is in {line:?}, not in its process's cgroup; ferry restores cgroup membership per process"),
                ));
            }
        }
        out.push(ProcessCgroups { pid: *pid, memberships });
    }
    Ok(out)
}
