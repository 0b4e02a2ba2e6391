//! Helpers shared by the integration tests: what a test makes, a guard
//! removes on drop.

// Each test binary uses a different part of this module.
#![allow(dead_code)]

use std::fs::{self, File};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

/// A network namespace made for one test (`ip netns add`, loopback up),
/// deleted on drop.
pub struct NetNs(pub String);

impl NetNs {
    /// None when `ip netns add` does not work here.
    pub fn new(tag: &str) -> Option<NetNs> {
        static N: AtomicU32 = AtomicU32::new(0);
        let name = format!("ferry-{tag}-{}-{}", std::process::id(), N.fetch_add(1, Ordering::SeqCst));
        let ok = Command::new("ip").args(["netns", "add", &name]).status().map(|s| s.success()).unwrap_or(false);
        if !ok {
            return None;
        }
        let ns = NetNs(name);
        let up = Command::new("ip").args(["netns", "exec", &ns.0, "ip", "link", "set", "lo", "up"]).status();
        assert!(up.map(|s| s.success()).unwrap_or(false), "cannot bring up lo in {}", ns.0);
        Some(ns)
    }

    pub fn path(&self) -> String {
        format!("/run/netns/{}", self.0)
    }

    /// Runs `f` on a thread that has joined this namespace: its sockets
    /// live there.
    pub fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        let path = self.path();
        std::thread::spawn(move || {
            let ns = File::open(&path).unwrap_or_else(|e| panic!("open {path}: {e}"));
            // SAFETY: setns on this thread only, with an open nsfs file.
            let r = unsafe { libc::setns(std::os::fd::AsRawFd::as_raw_fd(&ns), libc::CLONE_NEWNET) };
            assert_eq!(r, 0, "setns({path}): {}", std::io::Error::last_os_error());
            f()
        })
        .join()
        .expect("namespace thread panicked")
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "delete", &self.0]).status();
    }
}

/// The inode of a file (a namespace's identity), 0 if it cannot be read.
pub fn inode(path: &str) -> u64 {
    use std::os::unix::fs::MetadataExt;
    fs::metadata(path).map(|m| m.ino()).unwrap_or(0)
}

/// The PID of `pid` in the innermost PID namespace it is in.
pub fn innermost_pid(pid: i32) -> Option<i32> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| l.strip_prefix("NSpid:"))?.split_whitespace().last()?.parse().ok()
}
