//! timerfd: re-armed with the remaining time, unread expirations put back.

use super::{errno_err, owned};
use crate::error::{EngineError, Result};
use ferry_image::TimerFd;
use std::os::fd::{AsRawFd, OwnedFd};

fn ts(ns: u64) -> libc::timespec {
    libc::timespec { tv_sec: (ns / 1_000_000_000) as i64, tv_nsec: (ns % 1_000_000_000) as i64 }
}

pub fn create(pid: i32, t: &TimerFd) -> Result<OwnedFd> {
    // SAFETY: integer arguments.
    let fd = owned(pid, unsafe { libc::timerfd_create(t.clockid, libc::TFD_CLOEXEC) }, || format!("creating a timerfd on clock {}", t.clockid))?;
    // A disarmed timer keeps the flags of its last settime too.
    if t.value_ns > 0 || t.settime_flags != 0 {
        // fdinfo reports the time left; an absolute timer is re-armed at
        // now + that, on its own clock, keeping its TFD_TIMER_ABSTIME flag.
        let mut value = t.value_ns;
        if value > 0 && t.settime_flags & libc::TFD_TIMER_ABSTIME != 0 {
            let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
            // SAFETY: now is a valid out pointer.
            unsafe { libc::clock_gettime(t.clockid, &mut now) };
            value += now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64;
        }
        let spec = libc::itimerspec { it_interval: ts(t.interval_ns), it_value: ts(value) };
        // SAFETY: spec is valid; old value not requested.
        if unsafe { libc::timerfd_settime(fd.as_raw_fd(), t.settime_flags, &spec, std::ptr::null_mut()) } < 0 {
            return Err(errno_err(pid, "arming a timerfd".into()));
        }
    }
    if t.ticks > 0 {
        ferry_sys::fd::set_timerfd_ticks(fd.as_raw_fd(), t.ticks).map_err(|e| EngineError::kernel(pid, "restoring timerfd expirations", e))?;
    }
    Ok(fd)
}
