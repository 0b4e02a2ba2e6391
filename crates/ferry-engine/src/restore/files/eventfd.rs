//! eventfd with its counter and semaphore mode.

use super::{errno_err, owned};
use crate::error::Result;
use std::os::fd::{AsRawFd, OwnedFd};

pub fn create(pid: i32, count: u64, semaphore: bool) -> Result<OwnedFd> {
    let flags = libc::EFD_CLOEXEC | if semaphore { libc::EFD_SEMAPHORE } else { 0 };
    // SAFETY: integer arguments.
    let fd = owned(pid, unsafe { libc::eventfd(0, flags) }, || "creating an eventfd".into())?;
    if count > 0 {
        // SAFETY: writes 8 bytes from a live u64.
        let r = unsafe { libc::write(fd.as_raw_fd(), &count as *const u64 as *const libc::c_void, 8) };
        if r != 8 {
            return Err(errno_err(pid, format!("setting eventfd counter to {count}")));
        }
    }
    Ok(fd)
}
