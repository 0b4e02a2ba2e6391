//! signalfd with its signal set.

use super::owned;
use crate::error::Result;
use std::os::fd::OwnedFd;

pub fn create(pid: i32, mask: u64) -> Result<OwnedFd> {
    // SAFETY: the raw syscall reads 8 bytes of mask from a live u64.
    let fd = unsafe { libc::syscall(libc::SYS_signalfd4, -1, &mask as *const u64, 8usize, libc::SFD_CLOEXEC) };
    owned(pid, fd as i32, || format!("creating a signalfd for mask {mask:#x}"))
}
