//! File locks taken on a descriptor: flock(2) locks and fcntl(2) record
//! locks (process-owned POSIX locks and open-file-description OFD locks).

use crate::{last_error, SysResult};
use std::os::fd::RawFd;

/// flock(2), never waiting: shared or exclusive.
pub fn flock(fd: RawFd, exclusive: bool) -> SysResult<()> {
    let op = if exclusive { libc::LOCK_EX } else { libc::LOCK_SH };
    // SAFETY: integer arguments.
    if unsafe { libc::flock(fd, op | libc::LOCK_NB) } < 0 {
        return Err(last_error("flock"));
    }
    Ok(())
}

/// A byte range lock without waiting (F_SETLK, or F_OFD_SETLK when `ofd`):
/// `len` bytes from `start`, 0 for "to the end of the file".
pub fn set_record_lock(fd: RawFd, ofd: bool, write: bool, start: i64, len: i64) -> SysResult<()> {
    // SAFETY: struct flock is plain data; all-zero is a valid value.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = if write { libc::F_WRLCK } else { libc::F_RDLCK } as i16;
    fl.l_whence = libc::SEEK_SET as i16;
    fl.l_start = start;
    fl.l_len = len;
    let (cmd, call) = if ofd {
        (libc::F_OFD_SETLK, "fcntl(F_OFD_SETLK)")
    } else {
        (libc::F_SETLK, "fcntl(F_SETLK)")
    };
    // SAFETY: fl is a valid struct flock; the kernel only reads it.
    if unsafe { libc::fcntl(fd, cmd, &fl) } < 0 {
        return Err(last_error(call));
    }
    Ok(())
}
