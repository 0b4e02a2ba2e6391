//! Pseudo-terminals: the ioctls that read and set a pty pair's state
//! (termios, window size, packet mode, lock, exclusive mode, queued
//! bytes, session and foreground group), and opening one.

use crate::{last_error, SysResult};
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

/// The kernel's `struct termios2` (flags, line discipline, control
/// characters and both speeds, which `struct termios` leaves out).
pub type Termios2 = libc::termios2;

/// An ioctl whose argument is a pointer to one `T` the kernel reads or
/// writes.
fn ioctl_ptr<T>(fd: RawFd, req: libc::Ioctl, arg: *mut T, call: &'static str) -> SysResult<()> {
    // SAFETY: `arg` points at a live, properly sized `T` for the duration
    // of the call (each caller passes a reference), which is what `req`
    // reads or writes.
    if unsafe { libc::ioctl(fd, req, arg) } < 0 {
        return Err(last_error(call));
    }
    Ok(())
}

/// An ioctl with an integer argument (or none).
fn ioctl_int(fd: RawFd, req: libc::Ioctl, arg: libc::c_ulong, call: &'static str) -> SysResult<()> {
    // SAFETY: `req` takes an integer argument, passed by value; no memory
    // is read or written.
    if unsafe { libc::ioctl(fd, req, arg) } < 0 {
        return Err(last_error(call));
    }
    Ok(())
}

fn get_int(fd: RawFd, req: libc::Ioctl, call: &'static str) -> SysResult<i32> {
    let mut v: libc::c_int = 0;
    ioctl_ptr(fd, req, &mut v, call)?;
    Ok(v)
}

/// TCGETS2 (on a master it reads the pair's termios, which is the slave's).
pub fn get_termios(fd: RawFd) -> SysResult<Termios2> {
    // SAFETY: termios2 is plain data; all-zero is a valid value.
    let mut t: Termios2 = unsafe { std::mem::zeroed() };
    ioctl_ptr(fd, libc::TCGETS2, &mut t, "ioctl(TCGETS2)")?;
    Ok(t)
}

/// TCSETS2: applied at once (not after the output drained, which a
/// frozen reader would never let happen).
pub fn set_termios(fd: RawFd, t: &Termios2) -> SysResult<()> {
    let mut copy = *t;
    ioctl_ptr(fd, libc::TCSETS2, &mut copy, "ioctl(TCSETS2)")
}

pub fn get_winsize(fd: RawFd) -> SysResult<libc::winsize> {
    let mut w = libc::winsize { ws_row: 0, ws_col: 0, ws_xpixel: 0, ws_ypixel: 0 };
    ioctl_ptr(fd, libc::TIOCGWINSZ, &mut w, "ioctl(TIOCGWINSZ)")?;
    Ok(w)
}

pub fn set_winsize(fd: RawFd, w: &libc::winsize) -> SysResult<()> {
    let mut copy = *w;
    ioctl_ptr(fd, libc::TIOCSWINSZ, &mut copy, "ioctl(TIOCSWINSZ)")
}

/// TIOCGPTN: the index N of a master's slave, /dev/pts/N.
pub fn pty_index(master: RawFd) -> SysResult<u32> {
    let mut n: libc::c_uint = 0;
    ioctl_ptr(master, libc::TIOCGPTN, &mut n, "ioctl(TIOCGPTN)")?;
    Ok(n)
}

/// TIOCGPTLCK: whether the slave is locked (unlockpt not called yet).
pub fn pty_locked(master: RawFd) -> SysResult<bool> {
    Ok(get_int(master, libc::TIOCGPTLCK, "ioctl(TIOCGPTLCK)")? != 0)
}

/// TIOCSPTLCK: locks or unlocks the slave.
pub fn set_pty_locked(master: RawFd, locked: bool) -> SysResult<()> {
    let mut v: libc::c_int = locked as libc::c_int;
    ioctl_ptr(master, libc::TIOCSPTLCK, &mut v, "ioctl(TIOCSPTLCK)")
}

/// TIOCGPKT: whether packet mode is on (master).
pub fn packet_mode(master: RawFd) -> SysResult<bool> {
    Ok(get_int(master, libc::TIOCGPKT, "ioctl(TIOCGPKT)")? != 0)
}

/// TIOCPKT: packet mode on or off (master).
pub fn set_packet_mode(master: RawFd, on: bool) -> SysResult<()> {
    let mut v: libc::c_int = on as libc::c_int;
    ioctl_ptr(master, libc::TIOCPKT, &mut v, "ioctl(TIOCPKT)")
}

/// TIOCGEXCL: whether the terminal is in exclusive mode.
pub fn exclusive(fd: RawFd) -> SysResult<bool> {
    Ok(get_int(fd, libc::TIOCGEXCL, "ioctl(TIOCGEXCL)")? != 0)
}

/// TIOCEXCL / TIOCNXCL.
pub fn set_exclusive(fd: RawFd, on: bool) -> SysResult<()> {
    let req = if on { libc::TIOCEXCL } else { libc::TIOCNXCL };
    ioctl_int(fd, req, 0, if on { "ioctl(TIOCEXCL)" } else { "ioctl(TIOCNXCL)" })
}

/// FIONREAD: bytes a read on this end would get (on a slave in canonical
/// mode, only those of complete lines).
pub fn readable(fd: RawFd) -> SysResult<usize> {
    Ok(get_int(fd, libc::FIONREAD, "ioctl(FIONREAD)")? as usize)
}

/// TIOCGSID through a master: the session whose controlling terminal the
/// pair is (ENOTTY: none).
pub fn session_of(master: RawFd) -> SysResult<i32> {
    get_int(master, libc::TIOCGSID, "ioctl(TIOCGSID)")
}

/// TIOCGPGRP through a master: the pair's foreground process group.
pub fn foreground_group(master: RawFd) -> SysResult<i32> {
    get_int(master, libc::TIOCGPGRP, "ioctl(TIOCGPGRP)")
}

/// Opens a new pty master through the `ptmx` node at `path`, without
/// making it anyone's controlling terminal.
pub fn open_master(path: &std::ffi::CStr) -> SysResult<OwnedFd> {
    // SAFETY: a NUL-terminated path and integer flags.
    let fd = unsafe {
        libc::open(
            path.as_ptr(),
            libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC | libc::O_NONBLOCK,
        )
    };
    if fd < 0 {
        return Err(last_error("open(ptmx)"));
    }
    // SAFETY: the kernel just returned this new descriptor to us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// read(2) into `buf`; Ok(0) at end of file.
pub fn read(fd: RawFd, buf: &mut [u8]) -> SysResult<usize> {
    // SAFETY: `buf` is a live, writable buffer of the length given.
    let r = unsafe { libc::read(fd, buf.as_mut_ptr() as *mut libc::c_void, buf.len()) };
    if r < 0 {
        return Err(last_error("read(tty)"));
    }
    Ok(r as usize)
}

/// write(2) of `buf`; returns how much the terminal took.
pub fn write(fd: RawFd, buf: &[u8]) -> SysResult<usize> {
    // SAFETY: `buf` is a live buffer of the length given.
    let r = unsafe { libc::write(fd, buf.as_ptr() as *const libc::c_void, buf.len()) };
    if r < 0 {
        return Err(last_error("write(tty)"));
    }
    Ok(r as usize)
}

/// TIOCSTI, byte by byte: each byte goes through the line discipline of
/// the terminal `fd` is on at once, as if it had arrived (on a slave:
/// input to read; on a master: slave output to read). Needs
/// CAP_SYS_ADMIN for a terminal that is not the caller's.
pub fn push_input(fd: RawFd, bytes: &[u8]) -> SysResult<()> {
    for b in bytes {
        let mut c: libc::c_char = *b as libc::c_char;
        ioctl_ptr(fd, libc::TIOCSTI, &mut c, "ioctl(TIOCSTI)")?;
    }
    Ok(())
}
