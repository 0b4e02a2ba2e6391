//! perf_event_open counters of one tracepoint in one thread: how many
//! times a thread entered a system call (e.g. setsockopt) since the
//! counter was opened, counted by the kernel without stopping it.

use crate::{last_error, SysError, SysResult};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

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
    /// disabled, inherit, pinned, ... (bit fields): all 0, so the counter
    /// counts from the moment it is opened, in this thread only.
    flags: u64,
    wakeup_events: u32,
    bp_type: u32,
    config1: u64,
}

/// The id of tracepoint `event` ("syscalls/sys_enter_setsockopt"), from
/// tracefs (mounted at /sys/kernel/tracing, or under debugfs).
pub fn tracepoint_id(event: &str) -> SysResult<u64> {
    for root in ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"] {
        if let Ok(text) = std::fs::read_to_string(format!("{root}/events/{event}/id")) {
            return text
                .trim()
                .parse()
                .map_err(|_| SysError::new("reading a tracepoint id", libc::EINVAL));
        }
    }
    Err(SysError::new("reading a tracepoint id (tracefs)", libc::ENOENT))
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
    // SAFETY: attr is a valid perf_event_attr of the size it states, read
    // by the kernel during the call; cpu -1 and no group are allowed with
    // a thread.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            &attr as *const Attr,
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
    use std::os::fd::AsFd;

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
