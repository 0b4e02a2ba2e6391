//! Puts a restored process back into the cgroups it was in, right after
//! it is forked (before its memory is written, so the memory is charged
//! to its own memory cgroup). A cgroup is found by its hierarchy's
//! controllers, since hierarchy ids differ between hosts. The cgroups
//! must exist: they carry the service's limits, which are the host's
//! configuration, so restore refuses rather than make an unlimited one.

use crate::error::{EngineError, Result};
use ferry_image::{CgroupMembership, ProcessCgroups};
use std::path::PathBuf;

/// A mounted cgroup hierarchy: v2 (`controllers` empty) or v1.
#[derive(Debug, Clone, PartialEq)]
pub struct Hierarchy {
    /// The v1 hierarchy's mount options that name it: its controllers and
    /// any `name=`; empty for cgroup2.
    pub controllers: Vec<String>,
    /// Where its root is mounted.
    pub mount_point: PathBuf,
    /// Which cgroup the mount shows (its root, "/" unless a part of the
    /// hierarchy is bind-mounted).
    pub root: String,
}

/// The cgroup hierarchies mounted in this mount namespace, from
/// /proc/self/mountinfo.
pub fn mounted(mountinfo: &str) -> Vec<Hierarchy> {
    let mut out = Vec::new();
    for line in mountinfo.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let l: Vec<&str> = left.split(' ').collect();
        let r: Vec<&str> = right.split(' ').collect();
        let (Some(root), Some(mount_point), Some(fstype), Some(superopts)) =
            (l.get(3), l.get(4), r.first(), r.get(2))
        else {
            continue;
        };
        let controllers = match *fstype {
            "cgroup2" => Vec::new(),
            "cgroup" => superopts
                .split(',')
                .filter(|o| !matches!(*o, "rw" | "ro") && !o.contains('/'))
                .map(str::to_string)
                .collect(),
            _ => continue,
        };
        out.push(Hierarchy {
            controllers,
            mount_point: PathBuf::from(unescape(mount_point)),
            root: unescape(root),
        });
    }
    out
}

/// mountinfo escapes space, tab, newline and backslash as octal.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Whether `m` is a membership in hierarchy `h`: cgroup2 for an empty
/// controller list, else a v1 mount whose options hold every controller.
fn is_in(m: &CgroupMembership, h: &Hierarchy) -> bool {
    if m.controllers.is_empty() {
        return m.hierarchy == 0 && h.controllers.is_empty();
    }
    !h.controllers.is_empty()
        && m.controllers.split(',').all(|c| h.controllers.iter().any(|o| o == c))
}

fn describe(m: &CgroupMembership) -> String {
    if m.controllers.is_empty() {
        format!("cgroup2:{}", m.path)
    } else {
        format!("{}:{}", m.controllers, m.path)
    }
}

/// The directory of cgroup `m` under a mount of its hierarchy.
fn directory(m: &CgroupMembership, hierarchies: &[Hierarchy]) -> Option<PathBuf> {
    hierarchies.iter().filter(|h| is_in(m, h)).find_map(|h| {
        let below = if h.root == "/" {
            Some(m.path.as_str())
        } else {
            m.path.strip_prefix(h.root.as_str()).filter(|r| r.is_empty() || r.starts_with('/'))
        }?;
        Some(h.mount_point.join(below.trim_start_matches('/')))
    })
}

/// Moves `pid` (one thread yet) into every recorded cgroup it is not in.
pub fn join(pid: i32, recorded: &ProcessCgroups, hierarchies: &[Hierarchy]) -> Result<()> {
    let now_text = crate::procfs::read_string(&format!("/proc/{pid}/cgroup"))?;
    let now = crate::procfs::parse_cgroup(&now_text).unwrap_or_default();
    for m in &recorded.memberships {
        let current = now
            .iter()
            .find(|c| c.controllers == m.controllers && (c.hierarchy == 0) == (m.hierarchy == 0));
        if current.is_some_and(|c| c.path == m.path) {
            continue;
        }
        let Some(dir) = directory(m, hierarchies) else {
            if m.path == "/" {
                continue;
            }
            return Err(EngineError::restore(
                pid,
                format!("cgroup {}: its hierarchy is not mounted on this host", describe(m)),
            ));
        };
        if !dir.is_dir() {
            return Err(EngineError::restore(
                pid,
                format!("cgroup {} does not exist on this host ({}): create it, with the limits the service needs, before restoring", describe(m), dir.display()),
            ));
        }
        let procs = dir.join("cgroup.procs");
        std::fs::write(&procs, pid.to_string()).map_err(|e| {
            EngineError::io(
                format!("pid {pid}: joining cgroup {} ({})", describe(m), procs.display()),
                e,
            )
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
30 25 0:26 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
33 30 0:29 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
34 30 0:30 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
35 30 0:31 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd
36 30 0:32 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw,nsdelegate
37 30 0:29 /inner /mnt/my\\040cg rw,relatime - cgroup cgroup rw,memory
";

    fn m(h: u32, c: &str, p: &str) -> CgroupMembership {
        CgroupMembership { hierarchy: h, controllers: c.into(), path: p.into() }
    }

    #[test]
    fn finds_each_hierarchy_by_its_controllers() {
        let h = mounted(MOUNTINFO);
        assert_eq!(h.len(), 5);
        assert_eq!(
            directory(&m(7, "memory", "/a/b"), &h),
            Some(PathBuf::from("/sys/fs/cgroup/memory/a/b"))
        );
        assert_eq!(
            directory(&m(3, "cpu,cpuacct", "/x"), &h),
            Some(PathBuf::from("/sys/fs/cgroup/cpu,cpuacct/x"))
        );
        assert_eq!(
            directory(&m(1, "name=systemd", "/user.slice"), &h),
            Some(PathBuf::from("/sys/fs/cgroup/systemd/user.slice"))
        );
        assert_eq!(
            directory(&m(0, "", "/svc"), &h),
            Some(PathBuf::from("/sys/fs/cgroup/unified/svc"))
        );
        assert_eq!(directory(&m(9, "pids", "/svc"), &h), None);
    }

    #[test]
    fn a_bind_mounted_part_serves_only_its_subtree() {
        let h: Vec<Hierarchy> =
            mounted(MOUNTINFO).into_iter().filter(|h| h.root == "/inner").collect();
        assert_eq!(h[0].mount_point, PathBuf::from("/mnt/my cg"));
        assert_eq!(directory(&m(7, "memory", "/inner/x"), &h), Some(PathBuf::from("/mnt/my cg/x")));
        assert_eq!(directory(&m(7, "memory", "/innerx"), &h), None);
        assert_eq!(directory(&m(7, "memory", "/other"), &h), None);
    }
}
