//! epoll instances.

use crate::{last_error, SysResult};
use std::os::fd::{FromRawFd, OwnedFd};

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
