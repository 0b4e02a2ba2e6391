//! eventfd with its counter and semaphore mode.

use crate::error::{EngineError, Result};
use ferry_sys::anonfd;
use std::os::fd::{AsRawFd, OwnedFd};

pub fn create(pid: i32, count: u64, semaphore: bool) -> Result<OwnedFd> {
    let flags = libc::EFD_CLOEXEC | if semaphore { libc::EFD_SEMAPHORE } else { 0 };
    let fd = anonfd::eventfd(0, flags)
        .map_err(|e| EngineError::kernel(pid, "creating an eventfd", e))?;
    if count > 0 {
        anonfd::eventfd_write(fd.as_raw_fd(), count).map_err(|e| {
            EngineError::kernel(pid, format!("setting eventfd counter to {count}"), e)
        })?;
    }
    Ok(fd)
}
