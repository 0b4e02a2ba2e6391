//! A forked process that stops a set of processes at a deadline unless
//! the ferry that started it says in time that it has done so itself.
//!
//! `ferry replace --exec` lets the old tree drain its connections for up
//! to `--drain-timeout` and then stops it. A ferry killed during that
//! wait (Ctrl-C, SIGKILL, an OOM kill) would leave the old tree serving
//! forever next to the new binary; the warden outlives ferry (its own
//! session, reaped by init once ferry is gone) and stops the tree at the
//! deadline in ferry's place. It holds pidfds, so a PID reused since can
//! never be signalled.

use crate::{check, last_error, SysResult};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// The running warden, armed. [`StopWarden::disarm`] ends it without
/// touching its targets; dropping it without disarming leaves it armed.
#[derive(Debug)]
pub struct StopWarden {
    pid: i32,
    done: Option<OwnedFd>,
}

impl StopWarden {
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Tells the warden its targets were dealt with, and reaps it.
    pub fn disarm(mut self) -> SysResult<()> {
        if let Some(done) = self.done.take() {
            // SAFETY: one byte from our stack to a pipe we own.
            let r = unsafe { libc::write(done.as_raw_fd(), b"d".as_ptr().cast(), 1) };
            check("write(warden pipe)", r as libc::c_long)?;
        }
        let mut status = 0;
        // SAFETY: our own child; status is a valid out pointer.
        check("waitpid(warden)", unsafe { libc::waitpid(self.pid, &mut status, 0) }
            as libc::c_long)?;
        Ok(())
    }
}

fn monotonic_ns() -> i64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: ts is a valid out pointer; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec * 1_000_000_000 + ts.tv_nsec
}

/// Milliseconds from now to `deadline_ns`, for poll (0 when past).
fn ms_until(deadline_ns: i64) -> i32 {
    let left = (deadline_ns - monotonic_ns()).max(0) / 1_000_000;
    left.min(i32::MAX as i64) as i32
}

/// Starts a warden over `targets` (pidfds): once `after` has passed
/// without [`StopWarden::disarm`], it sends each SIGTERM, and SIGKILL to
/// those still alive `grace` later. Named `ferry-drain` (its comm).
pub fn spawn_stop_warden(
    targets: &[OwnedFd],
    after: Duration,
    grace: Duration,
) -> SysResult<StopWarden> {
    let mut pipe_fds = [0 as RawFd; 2];
    // SAFETY: pipe2 fills the two-element array.
    check("pipe2", unsafe { libc::pipe2(pipe_fds.as_mut_ptr(), libc::O_CLOEXEC) } as libc::c_long)?;
    // SAFETY: both are new descriptors owned by us from here.
    let (read_end, write_end) =
        unsafe { (OwnedFd::from_raw_fd(pipe_fds[0]), OwnedFd::from_raw_fd(pipe_fds[1])) };
    // Everything the child needs is made here: after the fork it must
    // not allocate (this process may have threads holding malloc's lock).
    let mut keep: Vec<RawFd> = targets.iter().map(|t| t.as_raw_fd()).collect();
    keep.push(read_end.as_raw_fd());
    keep.sort_unstable();
    let mut polls: Vec<libc::pollfd> = targets
        .iter()
        .map(|t| libc::pollfd { fd: t.as_raw_fd(), events: libc::POLLIN, revents: 0 })
        .collect();
    let deadline = monotonic_ns() + after.as_nanos().min(i64::MAX as u128 / 2) as i64;
    let grace_ns = grace.as_nanos().min(i64::MAX as u128 / 2) as i64;
    // SAFETY: fork has no preconditions; the child runs `warden_child`,
    // which makes raw syscalls only on memory prepared above and ends
    // with _exit.
    let child = unsafe { libc::fork() };
    if child < 0 {
        return Err(last_error("fork"));
    }
    if child == 0 {
        warden_child(&keep, read_end.as_raw_fd(), &mut polls, deadline, grace_ns);
    }
    drop(read_end);
    Ok(StopWarden { pid: child, done: Some(write_end) })
}

/// The warden itself, in the forked child: never returns.
fn warden_child(
    keep: &[RawFd],
    pipe: RawFd,
    polls: &mut [libc::pollfd],
    deadline: i64,
    grace_ns: i64,
) -> ! {
    // SAFETY: integer arguments and pointers into this process's own
    // copy of the parent's memory; no allocation, no return to Rust
    // code that would run the parent's destructors.
    unsafe {
        libc::setsid();
        libc::prctl(libc::PR_SET_NAME, c"ferry-drain".as_ptr(), 0, 0, 0);
        // Keep only the pipe and the pidfds: ferry's duplicates of the
        // service's sockets must not live on in here.
        let mut from: u32 = 0;
        for &fd in keep {
            if (fd as u32) > from {
                libc::syscall(libc::SYS_close_range, from, fd as u32 - 1, 0u32);
            }
            from = fd as u32 + 1;
        }
        libc::syscall(libc::SYS_close_range, from, u32::MAX, 0u32);
        // Wait for the word, or for ferry's end (EOF) and then the deadline.
        let mut orphaned = false;
        while !orphaned && ms_until(deadline) > 0 {
            let mut p = libc::pollfd { fd: pipe, events: libc::POLLIN, revents: 0 };
            if libc::poll(&mut p, 1, ms_until(deadline)) <= 0 {
                continue;
            }
            let mut byte = 0u8;
            match libc::read(pipe, (&mut byte as *mut u8).cast(), 1) {
                1 => libc::_exit(0),
                0 => orphaned = true,
                _ => {}
            }
        }
        while ms_until(deadline) > 0 {
            libc::poll(std::ptr::null_mut(), 0, ms_until(deadline));
        }
        for p in polls.iter() {
            libc::syscall(libc::SYS_pidfd_send_signal, p.fd, libc::SIGTERM, 0usize, 0u32);
        }
        let until = monotonic_ns() + grace_ns;
        while ms_until(until) > 0 {
            for p in polls.iter_mut() {
                p.revents = 0;
            }
            libc::poll(polls.as_mut_ptr(), polls.len() as libc::nfds_t, ms_until(until));
            // Each exited target stays readable: wait on the others only
            // (poll skips a negative fd), and end once none is left (not
            // only when all exit within one poll: the warden outlived
            // targets that exited one after the other by the whole grace).
            for p in polls.iter_mut() {
                if p.revents != 0 {
                    p.fd = -1;
                }
            }
            if polls.iter().all(|p| p.fd < 0) {
                libc::_exit(0);
            }
        }
        for p in polls.iter() {
            if p.fd >= 0 {
                libc::syscall(libc::SYS_pidfd_send_signal, p.fd, libc::SIGKILL, 0usize, 0u32);
            }
        }
        libc::_exit(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;
    use std::time::Instant;

    fn sleeper() -> (std::process::Child, OwnedFd) {
        let child = Command::new("sleep").arg("30").spawn().expect("sleep");
        let fd = crate::pidfd::pidfd_open(child.id() as i32).expect("pidfd_open");
        (child, fd)
    }

    #[test]
    fn a_disarmed_warden_leaves_its_targets_alone() {
        let (mut child, fd) = sleeper();
        let w = spawn_stop_warden(&[fd], Duration::from_millis(200), Duration::from_secs(1))
            .expect("warden");
        w.disarm().expect("disarm");
        std::thread::sleep(Duration::from_millis(400));
        assert!(child.try_wait().expect("try_wait").is_none(), "the target was stopped");
        let _ = child.kill();
        let _ = child.wait();
    }

    #[test]
    fn an_orphaned_warden_stops_its_targets_at_the_deadline() {
        let (mut child, fd) = sleeper();
        let t = Instant::now();
        let mut w = spawn_stop_warden(&[fd], Duration::from_millis(300), Duration::from_secs(1))
            .expect("warden");
        // As if ferry died: the pipe's write end goes away undisarmed.
        drop(w.done.take());
        let status = child.wait().expect("wait");
        assert!(t.elapsed() >= Duration::from_millis(250), "stopped before the deadline");
        assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(libc::SIGTERM));
        w.disarm().expect("reap");
    }

    #[test]
    fn an_orphaned_warden_ends_once_its_last_target_exited() {
        let (mut quick, quick_fd) = sleeper();
        // Exits 300 ms after its SIGTERM: in a later poll than `quick`.
        let mut slow = Command::new("sh")
            .args(["-c", "trap 'sleep 0.3; exit 0' TERM; while :; do sleep 0.05; done"])
            .spawn()
            .expect("sh");
        let slow_fd = crate::pidfd::pidfd_open(slow.id() as i32).expect("pidfd_open");
        let t = Instant::now();
        let mut w = spawn_stop_warden(
            &[quick_fd, slow_fd],
            Duration::from_millis(300),
            Duration::from_secs(5),
        )
        .expect("warden");
        drop(w.done.take());
        let _ = quick.wait();
        let _ = slow.wait();
        w.disarm().expect("reap");
        let took = t.elapsed();
        assert!(took < Duration::from_secs(3), "the warden stayed {took:?} (grace 5 s)");
    }
}
