//! signalfd with its signal set.

use crate::error::{EngineError, Result};
use std::os::fd::OwnedFd;

pub fn create(pid: i32, mask: u64) -> Result<OwnedFd> {
    ferry_sys::anonfd::signalfd(mask, libc::SFD_CLOEXEC)
        .map_err(|e| EngineError::kernel(pid, format!("creating a signalfd for mask {mask:#x}"), e))
}
