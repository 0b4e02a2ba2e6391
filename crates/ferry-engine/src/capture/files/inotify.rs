//! inotify: every watch (descriptor, path, mask) from fdinfo. The watched
//! inode is named there by a file handle: ferry opens it with
//! open_by_handle_at on the filesystem (found by device in
//! /proc/self/mountinfo) and reads its path back. Events already queued
//! are refused by name, never dropped; so are watches on deleted files.

use super::FdInfo;
use crate::error::Result;
use ferry_image::{FileKind, InotifyWatch};
use std::os::fd::AsRawFd;

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
    if path.ends_with(" (deleted)") || !path.starts_with('/') {
        return Err(
            info.unsupported(format!("watch {wd} is on {path}, which has no path to watch again"))
        );
    }
    Ok(InotifyWatch { wd, path, mask })
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
