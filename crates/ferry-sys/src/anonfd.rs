//! eventfd, timerfd and signalfd: descriptors with a small kernel object
//! behind them (a counter, a timer, a signal set), created and set here.

use crate::{check, last_error, SysResult};
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

fn owned(call: &'static str, fd: i32) -> SysResult<OwnedFd> {
    if fd < 0 {
        return Err(last_error(call));
    }
    // SAFETY: the kernel just returned this new descriptor to us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// eventfd(2) with counter `initval`.
pub fn eventfd(initval: u32, flags: i32) -> SysResult<OwnedFd> {
    // SAFETY: integer arguments.
    owned("eventfd", unsafe { libc::eventfd(initval, flags) })
}

/// Adds `value` to an eventfd's counter (one 8-byte write).
pub fn eventfd_write(fd: RawFd, value: u64) -> SysResult<()> {
    // SAFETY: writes 8 bytes from a live u64.
    let r = unsafe { libc::write(fd, &value as *const u64 as *const libc::c_void, 8) };
    if r != 8 {
        Err(last_error("write(eventfd)"))
    } else {
        Ok(())
    }
}

/// signalfd(2) of a new descriptor for the signals in `mask` (bit N-1
/// for signal N).
pub fn signalfd(mask: u64, flags: i32) -> SysResult<OwnedFd> {
    // SAFETY: the raw syscall reads 8 bytes of mask from a live u64.
    let fd = unsafe { libc::syscall(libc::SYS_signalfd4, -1, &mask as *const u64, 8usize, flags) };
    owned("signalfd4", fd as i32)
}

/// timerfd_create(2).
pub fn timerfd_create(clockid: i32, flags: i32) -> SysResult<OwnedFd> {
    // SAFETY: integer arguments.
    owned("timerfd_create", unsafe { libc::timerfd_create(clockid, flags) })
}

fn ts(ns: u64) -> libc::timespec {
    libc::timespec { tv_sec: (ns / 1_000_000_000) as i64, tv_nsec: (ns % 1_000_000_000) as i64 }
}

fn ns(ts: libc::timespec) -> u64 {
    (ts.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(ts.tv_nsec as u64)
}

/// timerfd_settime(2): arms (or, with value 0, disarms) the timer; `flags`
/// may hold TFD_TIMER_ABSTIME. Times in ns.
pub fn timerfd_settime(fd: RawFd, flags: i32, value_ns: u64, interval_ns: u64) -> SysResult<()> {
    let spec = libc::itimerspec { it_interval: ts(interval_ns), it_value: ts(value_ns) };
    // SAFETY: spec is valid; old value not requested.
    if unsafe { libc::timerfd_settime(fd, flags, &spec, std::ptr::null_mut()) } < 0 {
        return Err(last_error("timerfd_settime"));
    }
    Ok(())
}

/// timerfd_gettime: (value, interval) in ns. On a periodic timer that
/// expired unread, the kernel also counts the missed expirations into the
/// ticks a read (or fdinfo) reports and re-arms it: nothing is consumed.
pub fn timerfd_gettime(fd: RawFd) -> SysResult<(u64, u64)> {
    let mut t = libc::itimerspec { it_interval: ts(0), it_value: ts(0) };
    // SAFETY: t is a valid itimerspec to fill.
    let r = unsafe { libc::timerfd_gettime(fd, &mut t) };
    if r < 0 {
        return Err(last_error("timerfd_gettime"));
    }
    Ok((ns(t.it_value), ns(t.it_interval)))
}

/// Sets the count of unread expirations of a timerfd.
pub fn set_timerfd_ticks(fd: RawFd, ticks: u64) -> SysResult<()> {
    // TFD_IOC_SET_TICKS = _IOW('T', 0, u64)
    const TFD_IOC_SET_TICKS: libc::c_ulong = 0x4008_5400;
    // SAFETY: the ioctl reads one u64 from the pointer.
    let r = unsafe { libc::ioctl(fd, TFD_IOC_SET_TICKS as _, &ticks) };
    if r < 0 {
        Err(last_error("ioctl(TFD_IOC_SET_TICKS)"))
    } else {
        Ok(())
    }
}

/// clock_gettime(2) of `clockid`, in ns.
pub fn clock_gettime(clockid: i32) -> SysResult<u64> {
    let mut now = ts(0);
    // SAFETY: now is a valid out pointer.
    check("clock_gettime", unsafe { libc::clock_gettime(clockid, &mut now) } as libc::c_long)?;
    Ok(ns(now))
}
