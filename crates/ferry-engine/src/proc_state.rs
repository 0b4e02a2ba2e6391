//! What /proc tells of a process as a whole: identity, credentials, cwd
//! and root, umask, limits, personality, no_new_privs. Read by the
//! checkpoint (`capture/process.rs`) and, the same way, by the restore's
//! check (`restore/verify/process.rs`), so both sides see one thing.

use crate::error::{EngineError, Result};
use crate::procfs::{self, key_values, Stat};
use ferry_image::{Caps, Creds, MmLayout, ProcessImage, ProcessMisc, Rlimit, SignalState};

fn ids(v: Option<&&str>) -> Vec<u32> {
    v.map(|s| s.split_whitespace().filter_map(|x| x.parse().ok()).collect()).unwrap_or_default()
}

fn cap(v: Option<&&str>) -> u64 {
    v.and_then(|s| procfs::parse_hex(s)).unwrap_or(0)
}

fn four(v: Vec<u32>) -> [u32; 4] {
    let mut a = [0u32; 4];
    for (d, s) in a.iter_mut().zip(v) {
        *d = s;
    }
    a
}

/// Resource limits from /proc/PID/limits, which lists them in resource
/// order. prlimit(2) on another process would need CAP_SYS_RESOURCE when
/// the process runs under another user.
fn rlimits(pid: i32) -> Result<Vec<Rlimit>> {
    let path = format!("/proc/{pid}/limits");
    let text = procfs::read_string(&path)?;
    let value = |v: &str| {
        if v == "unlimited" {
            Some(u64::MAX)
        } else {
            v.parse().ok()
        }
    };
    let mut out = Vec::new();
    for (resource, line) in text.lines().skip(1).enumerate() {
        // "Max open files            1024                 1048576              files"
        let cols: Vec<&str> = line.get(26..).unwrap_or("").split_whitespace().collect();
        match (cols.first().and_then(|v| value(v)), cols.get(1).and_then(|v| value(v))) {
            (Some(soft), Some(hard)) => out.push(Rlimit { resource: resource as u32, soft, hard }),
            _ => {
                return Err(EngineError::Parse {
                    path: path.clone(),
                    what: format!("limit line {line:?}"),
                })
            }
        }
    }
    Ok(out)
}

/// The ids, groups and capability sets of a status file's `key_values`.
pub(crate) fn creds(status: &std::collections::HashMap<&str, &str>) -> Creds {
    Creds {
        uids: four(ids(status.get("Uid"))),
        gids: four(ids(status.get("Gid"))),
        groups: ids(status.get("Groups")),
        caps: Caps {
            inheritable: cap(status.get("CapInh")),
            permitted: cap(status.get("CapPrm")),
            effective: cap(status.get("CapEff")),
            bounding: cap(status.get("CapBnd")),
            ambient: cap(status.get("CapAmb")),
        },
    }
}

/// Identity, credentials, directories, umask, limits, personality and
/// no_new_privs of `pid`, with everything else of the image left empty.
pub fn read(pid: i32) -> Result<ProcessImage> {
    let status_path = format!("/proc/{pid}/status");
    let status_text = procfs::read_string(&status_path)?;
    let status = key_values(&status_text);
    let stat = Stat::read(pid)?;
    let rlimits = rlimits(pid)?;
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
        creds: creds(&status),
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
        inherited: Vec::new(),
        root: Some(procfs::read_link(&format!("/proc/{pid}/root"))?).filter(|r| r != "/"),
        fidelity: Default::default(),
    })
}

/// /proc/PID/coredump_filter, which the kernel prints in hex.
pub fn coredump_filter(pid: i32) -> Result<u32> {
    let path = format!("/proc/{pid}/coredump_filter");
    let text = crate::procfs::read_string(&path)?;
    u32::from_str_radix(text.trim(), 16).map_err(|_| {
        crate::error::EngineError::unsupported(
            pid,
            "/proc/PID/coredump_filter",
            format!("an unreadable value {:?}", text.trim()),
        )
    })
}

/// The inode of the network namespace of `pid` ("thread-self": the
/// calling thread's own, which may have moved with setns).
pub fn netns_inode(pid: &str) -> Result<u64> {
    use std::os::unix::fs::MetadataExt;
    let path = format!("/proc/{pid}/ns/net");
    std::fs::metadata(&path).map(|m| m.ino()).map_err(|e| crate::error::EngineError::io(path, e))
}

/// (loginuid, audit session id) of `task` ("self", "PID" or
/// "PID/task/TID"); u32::MAX when unset.
pub fn audit_ids(task: &str) -> Result<(u32, u32)> {
    let read = |name: &str| -> Result<u32> {
        let path = format!("/proc/{task}/{name}");
        let text = crate::procfs::read_string(&path)?;
        text.trim().parse().map_err(|_| {
            crate::error::EngineError::unsupported(
                task.split('/').next().and_then(|p| p.parse().ok()).unwrap_or(0),
                format!("/proc/{task}/{name}"),
                format!("an unreadable value {:?}", text.trim()),
            )
        })
    };
    Ok((read("loginuid")?, read("sessionid")?))
}

/// The scheduling autogroup of `task` ("self" or "PID") as (id, nice),
/// from "/autogroup-ID nice N"; None without CONFIG_SCHED_AUTOGROUP, and
/// for a process in the root task group, whose file is empty: a process
/// whose line of ancestors never called setsid since boot (children of
/// an init that keeps session 0) has no autogroup and no nice to keep.
pub fn autogroup(task: &str) -> Result<Option<(u64, i32)>> {
    let Ok(text) = crate::procfs::read_string(&format!("/proc/{task}/autogroup")) else {
        return Ok(None);
    };
    parse_autogroup(&text).ok_or_else(|| {
        crate::error::EngineError::unsupported(
            task.parse().unwrap_or(0),
            format!("/proc/{task}/autogroup"),
            format!("an unreadable value {:?}", text.trim()),
        )
    })
}

/// The autogroup a /proc/PID/autogroup text names (None for the root
/// task group's empty text), or None when the text is not one.
fn parse_autogroup(text: &str) -> Option<Option<(u64, i32)>> {
    if text.trim().is_empty() {
        return Some(None);
    }
    let mut words = text.split_whitespace();
    let id = words.next()?.strip_prefix("/autogroup-")?.parse().ok()?;
    (words.next()? == "nice").then_some(())?;
    Some(Some((id, words.next()?.parse().ok()?)))
}

/// Whether two I/O priorities (ioprio_get values) are the same setting:
/// class NONE (the top 3 bits 0) is the default whatever the level,
/// which the kernel derives from the nice value.
pub fn same_ioprio(a: i32, b: i32) -> bool {
    a == b || (a >> 13 == 0 && b >> 13 == 0)
}

#[cfg(test)]
mod attr_tests {
    use super::*;

    #[test]
    fn autogroup_lines_parse() {
        assert_eq!(parse_autogroup("/autogroup-123 nice 5\n"), Some(Some((123, 5))));
        assert_eq!(parse_autogroup("/autogroup-7 nice -20\n"), Some(Some((7, -20))));
        assert_eq!(parse_autogroup(""), Some(None));
        assert_eq!(parse_autogroup("\n"), Some(None));
        assert_eq!(parse_autogroup("/autogroup-x nice 5"), None);
        assert_eq!(parse_autogroup("/autogroup-1 prio 5"), None);
    }

    #[test]
    fn class_none_is_one_setting_whatever_its_level() {
        assert!(same_ioprio(4, 0));
        assert!(same_ioprio((2 << 13) | 7, (2 << 13) | 7));
        assert!(!same_ioprio((2 << 13) | 7, (2 << 13) | 6));
        assert!(!same_ioprio(2 << 13, 0));
    }
}
