//! timerfd: clock, remaining time, interval and unread expirations.

use super::FdInfo;
use crate::error::Result;
use ferry_image::{FileKind, TimerFd};

fn pair_ns(v: Option<&str>) -> u64 {
    let v = v.unwrap_or("(0, 0)").trim_matches(|c| c == '(' || c == ')');
    let mut it = v.split(',').map(|x| x.trim().parse::<u64>().unwrap_or(0));
    let s = it.next().unwrap_or(0);
    let ns = it.next().unwrap_or(0);
    s.saturating_mul(1_000_000_000).saturating_add(ns)
}

/// fdinfo read after a gettime on `dup`, again while it shows a periodic
/// timer with it_value 0: the timer keeps running in the freeze, and an
/// expiry between the gettime and the read (a loaded machine, a short
/// period) would otherwise be captured as a disarmed timer.
fn settled_fdinfo(info: &FdInfo, dup: &std::os::fd::OwnedFd) -> Result<String> {
    let path = format!("/proc/{}/fdinfo/{}", info.pid, info.fd);
    let mut attempt = 0;
    loop {
        ferry_sys::anonfd::timerfd_gettime(std::os::fd::AsRawFd::as_raw_fd(dup)).map_err(|e| {
            crate::error::EngineError::kernel(
                info.pid,
                format!("fd {}: reading timerfd", info.fd),
                e,
            )
        })?;
        let text = crate::procfs::read_string(&path)?;
        let field = |key: &str| {
            text.lines().find_map(|l| l.strip_prefix(key).and_then(|r| r.strip_prefix(':')))
        };
        let expired_unread = pair_ns(field("it_value")) == 0 && pair_ns(field("it_interval")) != 0;
        if !expired_unread {
            return Ok(text);
        }
        attempt += 1;
        if attempt == 100 {
            return Err(info.busy("its periodic timer expired again at each of 100 reads"));
        }
    }
}

/// A periodic timer that expired while nobody read it shows it_value 0
/// and one tick in fdinfo until someone looks: timerfd_gettime on ferry's
/// duplicate (same file) counts the missed expirations into the ticks and
/// re-arms it, as the process's next read or gettime would. Nothing is
/// consumed. fdinfo is read again afterwards.
pub fn capture(info: &FdInfo) -> Result<FileKind> {
    let dup = info.dup()?;
    let text = settled_fdinfo(info, &dup)?;
    let fresh = FdInfo { fdinfo: text, meta: info.meta.clone(), link: info.link.clone(), ..*info };
    let info = &fresh;
    let clockid = info
        .field("clockid")
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| info.unsupported("fdinfo has no clockid"))?;
    Ok(FileKind::TimerFd(TimerFd {
        clockid,
        ticks: info.field("ticks").and_then(|v| v.parse().ok()).unwrap_or(0),
        settime_flags: info.field("settime flags").and_then(crate::procfs::parse_octal).unwrap_or(0)
            as i32,
        value_ns: pair_ns(info.field("it_value")),
        interval_ns: pair_ns(info.field("it_interval")),
    }))
}
