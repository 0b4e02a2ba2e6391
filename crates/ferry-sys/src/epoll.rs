//! epoll instances.

use crate::{last_error, SysResult};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// epoll_create1(2).
pub fn create(flags: i32) -> SysResult<OwnedFd> {
    // SAFETY: integer argument.
    let fd = unsafe { libc::epoll_create1(flags) };
    if fd < 0 {
        return Err(last_error("epoll_create1"));
    }
    // SAFETY: a new descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// epoll_ctl(EPOLL_CTL_ADD): watches `fd` for `events`, reported with `data`.
pub fn add(epoll: BorrowedFd, fd: BorrowedFd, events: u32, data: u64) -> SysResult<()> {
    let mut ev = libc::epoll_event { events, u64: data };
    // SAFETY: both descriptors are open; ev is a live epoll_event.
    let r =
        unsafe { libc::epoll_ctl(epoll.as_raw_fd(), libc::EPOLL_CTL_ADD, fd.as_raw_fd(), &mut ev) };
    if r < 0 {
        return Err(last_error("epoll_ctl(EPOLL_CTL_ADD)"));
    }
    Ok(())
}
