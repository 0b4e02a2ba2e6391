//! inotify: every watch (descriptor, path, mask) from fdinfo. The watched
//! inode is named there by a file handle: ferry opens it with
//! open_by_handle_at on the filesystem (found by device in
//! /proc/self/mountinfo) and reads its path back. Events already queued
//! are refused by name, never dropped. A watch on a deleted file is kept
//! when an fd of the tree holds that file (restore watches the file it
//! makes again), refused otherwise.

use super::FdInfo;
use crate::error::Result;
use ferry_image::{FileKind, InotifyWatch};
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;

fn hex(s: &str) -> Option<u64> {
    u64::from_str_radix(s, 16).ok()
}

/// A mount point of the filesystem with kernel device number `sdev`
/// (major << 20 | minor), from ferry's mountinfo.
fn mount_of(sdev: u64) -> Option<String> {
    let (major, minor) = (sdev >> 20, sdev & 0xfffff);
    let want = format!("{major}:{minor}");
    let text = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    text.lines()
        .map(|l| l.split(' ').collect::<Vec<_>>())
        .find(|f| f.len() > 4 && f[2] == want)
        .map(|f| f[4].to_string())
}

fn watch(info: &FdInfo, line: &str) -> Result<InotifyWatch> {
    let field = |k: &str| line.split_whitespace().find_map(|w| w.strip_prefix(k));
    let bad = |what: &str| info.unsupported(format!("inotify fdinfo line without {what}: {line}"));
    let wd: i32 = field("wd:").and_then(|v| v.parse().ok()).ok_or_else(|| bad("wd"))?;
    let mask = field("mask:").and_then(hex).ok_or_else(|| bad("mask"))? as u32;
    let sdev = field("sdev:").and_then(hex).ok_or_else(|| bad("sdev"))?;
    let htype: i32 =
        field("fhandle-type:").and_then(|v| v.parse().ok()).ok_or_else(|| bad("fhandle-type"))?;
    let hbytes = field("f_handle:").ok_or_else(|| bad("f_handle"))?;
    let handle: Vec<u8> = (0..hbytes.len() / 2)
        .filter_map(|i| u8::from_str_radix(&hbytes[2 * i..2 * i + 2], 16).ok())
        .collect();
    let mnt = mount_of(sdev).ok_or_else(|| {
        info.unsupported(format!(
            "watch {wd}: no mount of device {:#x} in ferry's mount namespace",
            sdev
        ))
    })?;
    let mfd = std::fs::File::open(&mnt).map_err(|e| crate::error::EngineError::io(&mnt, e))?;
    let fd = ferry_sys::fd::open_by_handle(mfd.as_raw_fd(), htype, &handle).map_err(|e| {
        info.unsupported(format!(
            "watch {wd}: the watched file cannot be found from its handle ({e})"
        ))
    })?;
    let path = crate::procfs::read_link(&format!("/proc/self/fd/{}", fd.as_raw_fd()))?;
    if path.ends_with(" (deleted)") {
        let m = fd_meta(&fd, info)?;
        let path = deleted_holder(info, wd, &path, (m.dev(), m.ino()))?;
        return Ok(InotifyWatch { wd, path, mask });
    }
    if !path.starts_with('/') {
        return Err(
            info.unsupported(format!("watch {wd} is on {path}, which has no path to watch again"))
        );
    }
    Ok(InotifyWatch { wd, path, mask })
}

fn fd_meta(fd: &std::os::fd::OwnedFd, info: &FdInfo) -> Result<std::fs::Metadata> {
    let f = std::fs::File::from(fd.try_clone().map_err(|e| {
        crate::error::EngineError::io(format!("pid {}: fd {}: dup", info.pid, info.fd), e)
    })?);
    f.metadata()
        .map_err(|e| crate::error::EngineError::io(format!("fd {} ({})", info.fd, info.link), e))
}

/// A watch on a file deleted since (zdtm inotify00): kept when a process
/// of the tree holds the file open, as a regular file the restore makes
/// again (`FileKind::Deleted`); the watch then goes on that restored
/// file, named by its path as /proc shows it ("PATH (deleted)"), which
/// must name only that inode among the tree's fds. Otherwise nothing of
/// the tree keeps the inode, and the watch is refused.
fn deleted_holder(info: &FdInfo, wd: i32, path: &str, inode: (u64, u64)) -> Result<String> {
    let mut held = false;
    for &pid in info.tree {
        let dir = format!("/proc/{pid}/fd");
        let Ok(rd) = std::fs::read_dir(&dir) else { continue };
        for e in rd.flatten() {
            if std::fs::read_link(e.path()).ok().is_none_or(|l| l.as_os_str() != path) {
                continue;
            }
            let Ok(m) = std::fs::metadata(e.path()) else { continue };
            if (m.dev(), m.ino()) != inode {
                return Err(info.unsupported(format!(
                    "watch {wd} is on {path}, and another deleted file of the tree has that name too"
                )));
            }
            if !m.is_file() {
                return Err(info
                    .unsupported(format!("watch {wd} is on {path}, which is not a regular file")));
            }
            held = true;
        }
    }
    if !held {
        return Err(info.unsupported(format!(
            "watch {wd} is on {path}, which no fd of the tree holds, so nothing restores that file"
        )));
    }
    Ok(path.to_string())
}

pub fn capture(info: &FdInfo) -> Result<FileKind> {
    let dup = info.dup()?;
    let queued = ferry_sys::fd::bytes_readable(dup.as_raw_fd()).map_err(|e| {
        crate::error::EngineError::kernel(info.pid, format!("fd {}: FIONREAD", info.fd), e)
    })?;
    if queued > 0 {
        return Err(info.unsupported(format!(
            "{queued} bytes of inotify events are queued; queued events are not restored"
        )));
    }
    let mut watches = info
        .fdinfo
        .lines()
        .filter_map(|l| l.strip_prefix("inotify "))
        .map(|l| watch(info, l))
        .collect::<Result<Vec<_>>>()?;
    watches.sort_by_key(|w| w.wd);
    Ok(FileKind::Inotify { watches })
}
