//! epoll: created empty by ferry; its entries are registered from inside
//! the owning process once its fds are in place under their final numbers
//! (the kernel keys an entry by file and fd number), see `epoll_calls`.

use super::owned;
use crate::error::Result;
use std::os::fd::OwnedFd;

pub fn create(pid: i32) -> Result<OwnedFd> {
    // SAFETY: integer argument.
    owned(pid, unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) }, || "creating an epoll instance".into())
}

