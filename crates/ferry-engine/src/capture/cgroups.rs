//! Cgroup membership: which cgroup of every hierarchy each process is in
//! (/proc/PID/cgroup). Restore puts each process back into the same
//! cgroups right after it is forked, before it gets its memory, so the
//! memory is charged where it was. The cgroups themselves, with their
//! limits, are the host's: restore does not create them.

use crate::error::{EngineError, Result};
use crate::procfs;
use ferry_image::{CgroupMembership, ProcessCgroups};

/// Parses /proc/PID/cgroup: `hierarchy-id:controllers:path` per line.
pub fn parse(text: &str) -> Option<Vec<CgroupMembership>> {
    text.lines()
        .filter(|l| !l.is_empty())
        .map(|l| {
            let mut it = l.splitn(3, ':');
            let hierarchy = it.next()?.parse().ok()?;
            let controllers = it.next()?.to_string();
            let path = it.next()?.to_string();
            Some(CgroupMembership { hierarchy, controllers, path })
        })
        .collect()
}

/// The memberships of every process of the tree. A thread in cgroups of
/// its own (cgroup v1 `tasks`, v2 threaded cgroups) is refused, naming
/// the thread: restore moves whole processes.
pub fn capture(procs: &[(i32, Vec<i32>)]) -> Result<Vec<ProcessCgroups>> {
    let mut out = Vec::with_capacity(procs.len());
    for (pid, tids) in procs {
        let text = procfs::read_string(&format!("/proc/{pid}/cgroup"))?;
        let memberships = parse(&text).ok_or_else(|| {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_v1_and_v2_lines() {
        let m = parse("12:memory:/a/b\n1:name=systemd:/user.slice\n0::/x:y\n").expect("parses");
        assert_eq!(m.len(), 3);
        assert_eq!(
            (m[0].hierarchy, m[0].controllers.as_str(), m[0].path.as_str()),
            (12, "memory", "/a/b")
        );
        assert_eq!(m[1].controllers, "name=systemd");
        // A colon in the path stays in the path.
        assert_eq!(
            (m[2].hierarchy, m[2].controllers.as_str(), m[2].path.as_str()),
            (0, "", "/x:y")
        );
    }

    #[test]
    fn refuses_garbage() {
        assert!(parse("memory:/a\n").is_none());
        assert!(parse("x:memory:/a\n").is_none());
    }
}
