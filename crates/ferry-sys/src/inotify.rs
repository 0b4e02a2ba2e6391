//! inotify instances and watches (inotify(7)).

use crate::{last_error, SysResult};
use std::ffi::CStr;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// A new inotify instance, close-on-exec and non-blocking.
pub fn init() -> SysResult<OwnedFd> {
    // SAFETY: integer arguments.
    let fd = unsafe { libc::inotify_init1(libc::IN_CLOEXEC | libc::IN_NONBLOCK) };
    if fd < 0 {
        return Err(last_error("inotify_init1"));
    }
    // SAFETY: a new descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Adds a watch; returns its descriptor.
pub fn add_watch(fd: BorrowedFd<'_>, path: &CStr, mask: u32) -> SysResult<i32> {
    // SAFETY: path is a valid NUL-terminated string.
    let wd = unsafe { libc::inotify_add_watch(fd.as_raw_fd(), path.as_ptr(), mask) };
    if wd < 0 {
        Err(last_error("inotify_add_watch"))
    } else {
        Ok(wd)
    }
}

pub fn rm_watch(fd: BorrowedFd<'_>, wd: i32) -> SysResult<()> {
    // SAFETY: integer arguments.
    if unsafe { libc::inotify_rm_watch(fd.as_raw_fd(), wd) } < 0 {
        Err(last_error("inotify_rm_watch"))
    } else {
        Ok(())
    }
}

/// Reads and drops every queued event of a non-blocking instance.
pub fn drain(fd: BorrowedFd<'_>) {
    let mut buf = [0u8; 4096];
    // SAFETY: reading into our own buffer.
    while unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) } > 0 {}
}
