//! UTS namespaces: the host and domain names of another process's
//! namespace, and a new namespace with given names for the calling
//! process.

use crate::{last_error, SysError, SysResult};
use std::os::fd::AsRawFd;

/// The longest host or domain name the kernel keeps (__NEW_UTS_LEN).
pub const MAX_NAME_LEN: usize = 64;

fn field(raw: &[libc::c_char]) -> String {
    let bytes: Vec<u8> = raw.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// (nodename, domainname) of the calling thread's UTS namespace.
pub fn own_names() -> SysResult<(String, String)> {
    // SAFETY: utsname is plain data; uname fills it.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: u is a valid, writable utsname.
    if unsafe { libc::uname(&mut u) } < 0 {
        return Err(last_error("uname"));
    }
    Ok((field(&u.nodename), field(&u.domainname)))
}

/// (nodename, domainname) of the UTS namespace process `pid` is in, read
/// by a short-lived thread of ferry that joins it (setns with
/// CLONE_NEWUTS changes the calling thread only).
pub fn names_of(pid: i32) -> SysResult<(String, String)> {
    let ns = std::fs::File::open(format!("/proc/{pid}/ns/uts"))
        .map_err(|e| SysError::new("open(/proc/PID/ns/uts)", e.raw_os_error().unwrap_or(0)))?;
    std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: setns only reads the descriptor; CLONE_NEWUTS moves
            // this thread alone, which ends right after.
            if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWUTS) } < 0 {
                return Err(last_error("setns(CLONE_NEWUTS)"));
            }
            own_names()
        })
        .join()
        .unwrap_or_else(|_| Err(SysError::new("reading a UTS namespace", libc::EIO)))
    })
}

/// Moves the calling process (single-threaded: a freshly forked child)
/// into a new UTS namespace with these names; its later children inherit
/// it.
pub fn enter_new(hostname: &str, domainname: &str) -> SysResult<()> {
    // SAFETY: a constant flag.
    if unsafe { libc::unshare(libc::CLONE_NEWUTS) } < 0 {
        return Err(last_error("unshare(CLONE_NEWUTS)"));
    }
    // SAFETY: the pointer and length describe the bytes of a live &str.
    if unsafe { libc::sethostname(hostname.as_ptr().cast(), hostname.len()) } < 0 {
        return Err(last_error("sethostname"));
    }
    // SAFETY: as above.
    if unsafe { libc::setdomainname(domainname.as_ptr().cast(), domainname.len()) } < 0 {
        return Err(last_error("setdomainname"));
    }
    Ok(())
}
