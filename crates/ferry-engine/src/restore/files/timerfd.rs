//! timerfd: re-armed with the remaining time, unread expirations put back.

use crate::error::{EngineError, Result};
use ferry_image::TimerFd;
use ferry_sys::anonfd;
use std::os::fd::{AsRawFd, OwnedFd};

pub fn create(pid: i32, t: &TimerFd) -> Result<OwnedFd> {
    let fd = anonfd::timerfd_create(t.clockid, libc::TFD_CLOEXEC).map_err(|e| {
        EngineError::kernel(pid, format!("creating a timerfd on clock {}", t.clockid), e)
    })?;
    // A disarmed timer keeps the flags of its last settime too.
    if t.value_ns > 0 || t.settime_flags != 0 {
        // fdinfo reports the time left; an absolute timer is re-armed at
        // now + that, on its own clock, keeping its TFD_TIMER_ABSTIME flag.
        let mut value = t.value_ns;
        if value > 0 && t.settime_flags & libc::TFD_TIMER_ABSTIME != 0 {
            value += anonfd::clock_gettime(t.clockid).unwrap_or(0);
        }
        anonfd::timerfd_settime(fd.as_raw_fd(), t.settime_flags, value, t.interval_ns)
            .map_err(|e| EngineError::kernel(pid, "arming a timerfd", e))?;
    }
    if t.ticks > 0 {
        anonfd::set_timerfd_ticks(fd.as_raw_fd(), t.ticks)
            .map_err(|e| EngineError::kernel(pid, "restoring timerfd expirations", e))?;
    }
    Ok(fd)
}
