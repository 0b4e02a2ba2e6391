//! `--cgroup PATH`: a directory of a mounted cgroup v2 hierarchy, turned
//! into the path /proc/PID/cgroup shows for a member (the one the image
//! records), and checked to take processes, before anything is frozen.

use std::path::{Path, PathBuf};

/// A cgroup2 mount: where it is and which cgroup it shows.
#[derive(Debug, Clone, PartialEq)]
struct Mount {
    point: PathBuf,
    root: String,
    v2: bool,
}

/// Every cgroup mount of a mountinfo text (v1 ones too, to name them).
fn mounts(mountinfo: &str) -> Vec<Mount> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let l: Vec<&str> = left.split(' ').collect();
            let fstype = right.split(' ').next()?;
            let v2 = match fstype {
                "cgroup2" => true,
                "cgroup" => false,
                _ => return None,
            };
            Some(Mount { point: PathBuf::from(unescape(l.get(4)?)), root: unescape(l.get(3)?), v2 })
        })
        .collect()
}

/// mountinfo writes space, tab, newline and backslash as \ooo.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b.get(i + 1..i + 4).filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match (b[i], octal) {
            (b'\\', Some(d)) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The cgroup `dir` (absolute, no `..`) is as /proc/PID/cgroup names it:
/// the path below the deepest cgroup mount holding it, under that
/// mount's root. A directory outside every cgroup2 mount is refused by
/// name.
pub fn membership_path(dir: &Path, mountinfo: &str) -> Result<String, String> {
    let mount = mounts(mountinfo)
        .into_iter()
        .filter(|m| dir.starts_with(&m.point))
        .max_by_key(|m| m.point.components().count())
        .ok_or_else(|| format!("--cgroup {}: not in a mounted cgroup hierarchy", dir.display()))?;
    if !mount.v2 {
        return Err(format!(
            "--cgroup {}: {} is a cgroup v1 hierarchy; --cgroup takes a cgroup v2 directory",
            dir.display(),
            mount.point.display()
        ));
    }
    let below = dir
        .strip_prefix(&mount.point)
        .map_err(|_| format!("--cgroup {}: not below {}", dir.display(), mount.point.display()))?;
    let mut path = PathBuf::from(&mount.root);
    path.push(below);
    let text = path.to_string_lossy().into_owned();
    Ok(if text.is_empty() { "/".into() } else { text })
}

/// Resolves `--cgroup` on this host: the directory must exist and be a
/// cgroup that takes processes (cgroup v2 puts none in a cgroup that
/// hands controllers to its children).
pub fn resolve(arg: &Path) -> Result<String, String> {
    let dir = std::fs::canonicalize(arg)
        .map_err(|e| format!("--cgroup {}: no such cgroup ({e})", arg.display()))?;
    if !dir.join("cgroup.procs").is_file() {
        return Err(format!("--cgroup {}: not a cgroup (no cgroup.procs)", arg.display()));
    }
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| format!("--cgroup {}: reading /proc/self/mountinfo: {e}", arg.display()))?;
    let path = membership_path(&dir, &mountinfo)?;
    let subtree = std::fs::read_to_string(dir.join("cgroup.subtree_control")).unwrap_or_default();
    if path != "/" && !subtree.trim().is_empty() {
        return Err(format!(
            "--cgroup {}: it enables controllers for its children ({}), so it takes no process",
            arg.display(),
            subtree.trim()
        ));
    }
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
50 23 0:38 /svc /mnt/my\\040cg rw,relatime - cgroup2 cgroup2 rw
";

    #[test]
    fn a_v2_directory_is_named_from_its_hierarchys_root() {
        let p = |d: &str| membership_path(Path::new(d), MOUNTINFO);
        assert_eq!(p("/sys/fs/cgroup/unified/a/b"), Ok("/a/b".into()));
        assert_eq!(p("/sys/fs/cgroup/unified"), Ok("/".into()));
        assert_eq!(p("/mnt/my cg/x"), Ok("/svc/x".into()));
    }

    #[test]
    fn v1_and_other_directories_are_refused_by_name() {
        let e = membership_path(Path::new("/sys/fs/cgroup/memory/a"), MOUNTINFO).expect_err("v1");
        assert!(e.contains("/sys/fs/cgroup/memory is a cgroup v1 hierarchy"), "{e}");
        let e = membership_path(Path::new("/tmp/x"), MOUNTINFO).expect_err("outside");
        assert!(e.contains("--cgroup /tmp/x: not in a mounted cgroup hierarchy"), "{e}");
        // The tmpfs holding the mounts is not a cgroup mount.
        assert!(membership_path(Path::new("/sys/fs/cgroup/x"), MOUNTINFO).is_err());
    }
}
