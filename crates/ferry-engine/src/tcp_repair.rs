//! Leaving TCP repair mode after a checkpoint: both the capture's own
//! `Repaired` and the guard (which ends repair if the checkpointing
//! process dies mid-capture) take the sockets out the same way, so the
//! step lives below both and the guard does not import the capture.

use ferry_sys::socket;
use std::os::fd::RawFd;

/// Takes a socket out of repair mode and gives it back SO_REUSEADDR, which
/// leaving repair mode clears. Leaving sends a window probe, which makes
/// the peer tell us its window again.
pub fn leave_repair(fd: RawFd, reuse: bool) -> ferry_sys::SysResult<()> {
    socket::set_repair(fd, 0)?;
    if reuse {
        socket::setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_REUSEADDR, 1)?;
    }
    Ok(())
}
