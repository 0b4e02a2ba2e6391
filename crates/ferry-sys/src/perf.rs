//! perf_event_open counters of one tracepoint in one thread: how many
//! times a thread entered a system call (e.g. setsockopt) since the
//! counter was opened, counted by the kernel without stopping it.

use crate::{last_error, SysError, SysResult};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// `PERF_TYPE_TRACEPOINT` from <linux/perf_event.h>.
const PERF_TYPE_TRACEPOINT: u32 = 2;
/// `PERF_FLAG_FD_CLOEXEC`.
const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 8;

/// `struct perf_event_attr` as of its first version (PERF_ATTR_SIZE_VER0,
/// 64 bytes): every later field left out reads as zero to the kernel.
#[repr(C)]
#[derive(Default)]
struct Attr {
    ty: u32,
    size: u32,
    config: u64,
    sample_period: u64,
    sample_type: u64,
    read_format: u64,
    /// disabled, inherit, pinned, ... (bit fields): all 0 but `disabled`
    /// for a counter enabled once its filter is set, so the counter counts
    /// from the moment it is opened (or enabled), in this thread only.
    flags: u64,
    wakeup_events: u32,
    bp_type: u32,
    config1: u64,
}

/// The id of tracepoint `event` ("syscalls/sys_enter_setsockopt"), from
/// tracefs: where it is mounted (/sys/kernel/tracing, or under
/// debugfs), else from an instance of it made for this read and mounted
/// nowhere (a mount namespace with a /sys of its own, as `ip netns exec`
/// makes, has none mounted).
pub fn tracepoint_id(event: &str) -> SysResult<u64> {
    let rel = format!("events/{event}/id");
    for root in ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"] {
        if let Ok(text) = std::fs::read_to_string(format!("{root}/{rel}")) {
            return parse_id(&text);
        }
    }
    let tracefs = detached_tracefs()?;
    let path =
        std::ffi::CString::new(rel).map_err(|_| SysError::new("tracefs path", libc::EINVAL))?;
    let text = crate::fd::read_small_at(tracefs.as_fd(), &path, 64)?;
    parse_id(&String::from_utf8_lossy(&text))
}

fn parse_id(text: &str) -> SysResult<u64> {
    text.trim().parse().map_err(|_| SysError::new("reading a tracepoint id", libc::EINVAL))
}

/// A tracefs instance mounted nowhere (fsopen, fsmount): its files are
/// read relative to the returned descriptor, and it goes with it.
fn detached_tracefs() -> SysResult<OwnedFd> {
    const FSOPEN_CLOEXEC: libc::c_uint = 1;
    const FSCONFIG_CMD_CREATE: libc::c_uint = 6;
    const FSMOUNT_CLOEXEC: libc::c_uint = 1;
    // SAFETY: a static NUL-terminated name; returns a new fd.
    let fs = unsafe { libc::syscall(libc::SYS_fsopen, c"tracefs".as_ptr(), FSOPEN_CLOEXEC) };
    if fs < 0 {
        return Err(last_error("fsopen(tracefs)"));
    }
    // SAFETY: fs is a new descriptor we own.
    let fs = unsafe { OwnedFd::from_raw_fd(fs as i32) };
    let null = std::ptr::null::<libc::c_char>();
    // SAFETY: FSCONFIG_CMD_CREATE takes no key, value or aux.
    if unsafe {
        libc::syscall(libc::SYS_fsconfig, fs.as_raw_fd(), FSCONFIG_CMD_CREATE, null, null, 0)
    } < 0
    {
        return Err(last_error("fsconfig(tracefs, FSCONFIG_CMD_CREATE)"));
    }
    // SAFETY: fs is a configured filesystem context; returns a new fd.
    let mnt = unsafe { libc::syscall(libc::SYS_fsmount, fs.as_raw_fd(), FSMOUNT_CLOEXEC, 0) };
    if mnt < 0 {
        return Err(last_error("fsmount(tracefs)"));
    }
    // SAFETY: mnt is a new descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(mnt as i32) })
}

/// A counter of tracepoint `id` in thread `tid` (not in the threads it
/// creates later), counting from now.
pub fn count_tracepoint(tid: i32, id: u64) -> SysResult<OwnedFd> {
    let attr = Attr {
        ty: PERF_TYPE_TRACEPOINT,
        size: std::mem::size_of::<Attr>() as u32,
        config: id,
        ..Default::default()
    };
    open(&attr, tid)
}

/// perf_event_open of `attr` on thread `tid`, any CPU, no group.
fn open(attr: &Attr, tid: i32) -> SysResult<OwnedFd> {
    // SAFETY: attr is a valid perf_event_attr of the size it states, read
    // by the kernel during the call; cpu -1 and no group are allowed with
    // a thread.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            attr as *const Attr,
            tid,
            -1 as libc::c_int,
            -1 as libc::c_int,
            PERF_FLAG_FD_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(last_error("perf_event_open"));
    }
    // SAFETY: fd is a new descriptor owned by us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// A counter of tracepoint `id` in thread `tid` that counts only the
/// events `filter` (the tracepoint's filter syntax, e.g. "id == 54" on
/// raw_syscalls/sys_enter) lets through, counting from once it is set.
pub fn count_tracepoint_filtered(tid: i32, id: u64, filter: &str) -> SysResult<OwnedFd> {
    const DISABLED: u64 = 1;
    const PERF_EVENT_IOC_ENABLE: libc::c_ulong = 0x2400;
    const PERF_EVENT_IOC_SET_FILTER: libc::c_ulong = 0x4008_2406;
    let attr = Attr {
        ty: PERF_TYPE_TRACEPOINT,
        size: std::mem::size_of::<Attr>() as u32,
        config: id,
        flags: DISABLED,
        ..Default::default()
    };
    let counter = open(&attr, tid)?;
    let filter =
        std::ffi::CString::new(filter).map_err(|_| SysError::new("perf filter", libc::EINVAL))?;
    // SAFETY: a NUL-terminated string the kernel copies during the call.
    if unsafe { libc::ioctl(counter.as_raw_fd(), PERF_EVENT_IOC_SET_FILTER, filter.as_ptr()) } < 0 {
        return Err(last_error("ioctl(PERF_EVENT_IOC_SET_FILTER)"));
    }
    // SAFETY: ENABLE takes no argument (0: this event alone).
    if unsafe { libc::ioctl(counter.as_raw_fd(), PERF_EVENT_IOC_ENABLE, 0) } < 0 {
        return Err(last_error("ioctl(PERF_EVENT_IOC_ENABLE)"));
    }
    Ok(counter)
}

/// The counter's value: how many times the event happened so far.
pub fn read_count(counter: BorrowedFd) -> SysResult<u64> {
    let mut value = 0u64;
    // SAFETY: value is 8 writable bytes, the size of a plain counter read.
    let n = unsafe { libc::read(counter.as_raw_fd(), (&mut value as *mut u64).cast(), 8) };
    if n < 0 {
        return Err(last_error("read(perf counter)"));
    }
    if n != 8 {
        return Err(SysError::new("read(perf counter)", libc::EIO));
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tracefs_mounted_nowhere_gives_the_same_ids() {
        let event = "syscalls/sys_enter_setsockopt";
        let Ok(mounted) = tracepoint_id(event) else {
            eprintln!("no syscall tracepoints here: skipped");
            return;
        };
        let tracefs = detached_tracefs().expect("fsopen/fsmount of tracefs (root)");
        let path = std::ffi::CString::new(format!("events/{event}/id")).expect("path");
        let text = crate::fd::read_small_at(tracefs.as_fd(), &path, 64).expect("id file");
        assert_eq!(parse_id(&String::from_utf8_lossy(&text)), Ok(mounted));
    }

    fn tid() -> i32 {
        // SAFETY: gettid has no arguments and cannot fail.
        unsafe { libc::syscall(libc::SYS_gettid) as i32 }
    }

    #[test]
    fn a_counter_counts_the_system_calls_of_its_thread_only() {
        let Ok(id) = tracepoint_id("syscalls/sys_enter_setsockopt") else {
            eprintln!("no syscall tracepoints here: skipped");
            return;
        };
        let counter = match count_tracepoint(tid(), id) {
            Ok(c) => c,
            Err(e) if e.errno == libc::EACCES || e.errno == libc::EPERM => {
                eprintln!("perf_event_open not allowed (not root): skipped");
                return;
            }
            Err(e) => panic!("perf_event_open: {e}"),
        };
        assert_eq!(read_count(counter.as_fd()), Ok(0));
        let s = crate::socket::socket(libc::AF_INET, libc::SOCK_STREAM, 0).expect("socket");
        for _ in 0..3 {
            crate::socket::setsockopt_int(s.as_raw_fd(), libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1)
                .expect("setsockopt");
        }
        // Another thread's calls are not this thread's.
        std::thread::spawn(move || {
            crate::socket::setsockopt_int(s.as_raw_fd(), libc::SOL_SOCKET, libc::SO_KEEPALIVE, 0)
                .expect("setsockopt");
        })
        .join()
        .expect("thread");
        assert_eq!(read_count(counter.as_fd()), Ok(3));
    }
}
