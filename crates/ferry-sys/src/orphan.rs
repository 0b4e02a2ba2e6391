//! An orphan of ferry's own, to see who adopts orphans and how soon that
//! process reaps them (`ferry replace` checks init this way before it
//! kills a tree whose PIDs init must free).

use crate::{check, last_error, SysResult};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// The comm of the orphan: a zombie so named is ferry's, not a sign of
/// a reaper that neglects the tree's.
pub const ORPHAN_COMM: &str = "ferry-orphan";

/// Forks a child that forks the orphan and exits at once. The orphan
/// names itself [`ORPHAN_COMM`], waits (at most 1 s) until it has been
/// adopted, and exits. Returns the orphan's PID once the child is
/// reaped: its parent in /proc is then the adopter, until it is reaped.
pub fn spawn_orphan() -> SysResult<i32> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: pipe2 fills the two-element array.
    check("pipe2", unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } as libc::c_long)?;
    // SAFETY: both are new descriptors owned by us from here.
    let (read_end, write_end) =
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    let w = write_end.as_raw_fd();
    // SAFETY: fork has no preconditions; the child and grandchild below
    // make raw syscalls only (this process may have threads) on their
    // stacks and end with _exit.
    let child = unsafe { libc::fork() };
    if child < 0 {
        return Err(last_error("fork"));
    }
    if child == 0 {
        orphan_maker(w);
    }
    drop(write_end);
    crate::process::wait_child(child);
    let mut pid = [0u8; 4];
    // SAFETY: reads 4 bytes into our stack array.
    let n = unsafe { libc::read(read_end.as_raw_fd(), pid.as_mut_ptr().cast(), 4) };
    match check("read(orphan pipe)", n as libc::c_long)? {
        4 => Ok(i32::from_ne_bytes(pid)),
        _ => Err(crate::SysError::new("fork(orphan)", libc::ECHILD)),
    }
}

/// In the forked child: forks the orphan, tells its PID and exits.
fn orphan_maker(w: RawFd) -> ! {
    // SAFETY: runs only in a freshly forked child: raw syscalls on its
    // own stack, no allocation, and it ends with _exit, never returning
    // into the parent's Rust code.
    unsafe {
        let maker = libc::getpid();
        let orphan = libc::fork();
        if orphan == 0 {
            libc::prctl(libc::PR_SET_NAME, c"ferry-orphan".as_ptr(), 0, 0, 0);
            libc::close(w);
            let pause = libc::timespec { tv_sec: 0, tv_nsec: 1_000_000 };
            for _ in 0..1000 {
                if libc::getppid() != maker {
                    break;
                }
                libc::nanosleep(&pause, std::ptr::null_mut());
            }
            libc::_exit(0);
        }
        if orphan > 0 {
            let bytes = orphan.to_ne_bytes();
            libc::write(w, bytes.as_ptr().cast(), 4);
        }
        libc::_exit(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_orphan_is_adopted_and_named() {
        let orphan = spawn_orphan().expect("orphan");
        assert!(orphan > 0);
        // Adopted by init or a subreaper above the test, then reaped or
        // a zombie; never a child of this test's process any more.
        let stat = std::fs::read_to_string(format!("/proc/{orphan}/stat")).unwrap_or_default();
        if let Some(rest) = stat.rfind(')').map(|i| &stat[i + 2..]) {
            let ppid: i32 =
                rest.split_whitespace().nth(1).and_then(|p| p.parse().ok()).unwrap_or(0);
            assert_ne!(ppid, std::process::id() as i32, "{stat}");
        }
    }
}
