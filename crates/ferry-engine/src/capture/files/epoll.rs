//! epoll: every watched fd with its events and user data.

use super::FdInfo;
use crate::error::{EngineError, Result};
use ferry_image::{EpollEntry, EpollTarget, FdSlot, FileKind, OpenFile};

pub fn capture(info: &FdInfo) -> Result<FileKind> {
    let mut entries = Vec::new();
    for line in info.fdinfo.lines().filter(|l| l.starts_with("tfd:")) {
        let mut words = line.split_whitespace();
        let mut get = |key: &str| {
            while let Some(w) = words.next() {
                if w == key {
                    return words.next().map(str::to_string);
                }
            }
            None
        };
        let fd = get("tfd:").and_then(|v| v.parse().ok());
        let events = get("events:").and_then(|v| u32::from_str_radix(&v, 16).ok());
        let data = get("data:").and_then(|v| u64::from_str_radix(&v, 16).ok());
        match (fd, events, data) {
            (Some(fd), Some(events), Some(data)) => entries.push(EpollEntry { fd, events, data }),
            _ => return Err(info.unsupported(format!("cannot parse epoll entry {line:?}"))),
        }
    }
    Ok(FileKind::Epoll { entries })
}

/// The kernel keys an epoll entry by file and fd number, and keeps it
/// when that fd number is closed (or reused for another file) as long as
/// the file lives on elsewhere. For every entry whose fd number does not
/// (or no longer) name the watched file in the epoll's holder, the file
/// is looked up among every fd of the tree with kcmp(KCMP_EPOLL_TFD) and
/// recorded as a target by open file description id; restore registers
/// it under the old number. A file no process of the tree holds is
/// refused. Returns the targets of each process, in `procs` order.
pub fn resolve_targets(procs: &[(i32, &[OpenFile], &[FdSlot])]) -> Result<Vec<Vec<EpollTarget>>> {
    let mut out = Vec::with_capacity(procs.len());
    for &(pid, files, slots) in procs {
        // By number: an epoll of a server can watch 10,000 fds.
        let open: std::collections::HashSet<i32> = slots.iter().map(|s| s.fd).collect();
        let mut targets = Vec::new();
        for (i, f) in files.iter().enumerate() {
            let FileKind::Epoll { entries } = &f.kind else {
                continue;
            };
            let Some(epfd) = slots.iter().find(|s| s.file as usize == i).map(|s| s.fd) else {
                continue;
            };
            for e in entries {
                let same = |q: i32, fd: i32| {
                    ferry_sys::fd::kcmp_epoll_target(q, fd, pid, epfd, e.fd).unwrap_or(false)
                };
                if open.contains(&e.fd) && same(pid, e.fd) {
                    continue;
                }
                let found = procs.iter().find_map(|&(q, qfiles, qslots)| {
                    qslots.iter().find(|s| same(q, s.fd)).map(|s| qfiles[s.file as usize].id)
                });
                match found {
                    Some(target) => targets.push(EpollTarget { epoll_file: i as u32, fd: e.fd, target }),
                    None => {
                        return Err(EngineError::unsupported(
                            pid,
                            format!("epoll fd {epfd}, entry for fd {}", e.fd),
                            "that fd number was closed and no process of the tree holds the watched file any more",
                        ))
                    }
                }
            }
        }
        out.push(targets);
    }
    Ok(out)
}
