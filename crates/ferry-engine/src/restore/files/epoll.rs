//! epoll: created empty by ferry; its entries are registered from inside
//! the owning process once its fds are in place under their final numbers
//! (the kernel keys an entry by file and fd number), see `epoll_calls`.

use crate::error::{EngineError, Result};
use std::os::fd::OwnedFd;

pub fn create(pid: i32) -> Result<OwnedFd> {
    ferry_sys::epoll::create(libc::EPOLL_CLOEXEC)
        .map_err(|e| EngineError::kernel(pid, "creating an epoll instance", e))
}
