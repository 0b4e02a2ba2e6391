//! epoll: every watched fd with its events and user data.

use super::FdInfo;
use crate::error::{EngineError, Result};
use ferry_image::{EpollEntry, FdSlot, FileKind, OpenFile};

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

/// An epoll entry whose fd number was closed (the file lives on through a
/// dup) cannot be re-registered under that number.
pub fn check_targets(pid: i32, files: &[OpenFile], slots: &[FdSlot]) -> Result<()> {
    for f in files {
        let FileKind::Epoll { entries } = &f.kind else { continue };
        for e in entries {
            if !slots.iter().any(|s| s.fd == e.fd) {
                return Err(EngineError::unsupported(pid, format!("epoll entry for fd {}", e.fd), "that fd was closed while still registered"));
            }
        }
    }
    Ok(())
}
