//! What a thread stopped inside a system call must do when it runs again.
//!
//! A stop interrupts blocking calls. Most return -ERESTART* and the kernel
//! repeats them on its own, but only in the process where they were
//! interrupted: a restored thread must be pointed back at its `syscall`
//! instruction by us. A few calls (epoll_wait, sigtimedwait, ...) return
//! EINTR on any stop, even without a signal handler (signal(7)); for them
//! we repeat the call too, so the process never sees our stop.

use ferry_sys::Regs;

const ERESTARTSYS: i64 = -512;
const ERESTARTNOINTR: i64 = -513;
const ERESTARTNOHAND: i64 = -514;
pub const ERESTART_RESTARTBLOCK: i64 = -516;
const EINTR: i64 = -(libc::EINTR as i64);

pub const SYS_NANOSLEEP: i64 = libc::SYS_nanosleep;
pub const SYS_CLOCK_NANOSLEEP: i64 = libc::SYS_clock_nanosleep;

/// Calls that fail with EINTR when the caller is merely stopped.
const EINTR_ON_STOP: &[i64] = &[
    libc::SYS_epoll_wait,
    libc::SYS_epoll_pwait,
    libc::SYS_epoll_pwait2,
    libc::SYS_rt_sigtimedwait,
    libc::SYS_semop,
    libc::SYS_semtimedop,
    libc::SYS_io_getevents,
];

fn in_syscall(regs: &Regs) -> Option<i64> {
    let nr = regs.orig_rax as i64;
    (nr >= 0).then_some(nr)
}

fn point_back_at_syscall(regs: &mut Regs, nr: i64) {
    regs.rax = nr as u64;
    regs.rip -= 2;
}

/// For a process that goes on running where it was stopped: undo the
/// EINTR our stop caused. The kernel restarts most -ERESTART* cases
/// itself; -ERESTART_RESTARTBLOCK it would resume through
/// restart_syscall, whose saved state (the sleep's end) no later
/// checkpoint can see: a thread checkpointed in restart_syscall could
/// only get EINTR on restore. So the call is issued again instead, a
/// sleep with the remaining time the kernel wrote to its `rem`.
pub fn retry_interrupted_wait(regs: &mut Regs) {
    let Some(nr) = in_syscall(regs) else { return };
    let ret = regs.rax as i64;
    if ret == EINTR && EINTR_ON_STOP.contains(&nr) {
        point_back_at_syscall(regs, nr);
    } else if ret == ERESTART_RESTARTBLOCK {
        if let Some((_, rem)) = sleep_request_ptr(regs) {
            if rem != 0 {
                if nr == SYS_NANOSLEEP {
                    regs.rdi = rem;
                } else {
                    regs.rdx = rem;
                }
            }
        }
        point_back_at_syscall(regs, nr);
    }
}

/// For a restored thread: every interrupted call that the kernel would
/// have restarted (or that failed only because of our stop) is issued
/// again. Sleeps get their remaining time via [`sleep_request_ptr`].
pub fn restart_after_restore(regs: &mut Regs) {
    if let Some(nr) = in_syscall(regs) {
        let ret = regs.rax as i64;
        let restart =
            matches!(ret, ERESTARTSYS | ERESTARTNOINTR | ERESTARTNOHAND | ERESTART_RESTARTBLOCK)
                || (ret == EINTR && EINTR_ON_STOP.contains(&nr));
        if restart {
            point_back_at_syscall(regs, nr);
        }
    }
    regs.orig_rax = u64::MAX;
}

/// For a thread stopped in a relative nanosleep/clock_nanosleep: the
/// addresses of its request and remainder timespecs.
pub fn sleep_request_ptr(regs: &Regs) -> Option<(u64, u64)> {
    let nr = in_syscall(regs)?;
    if regs.rax as i64 != ERESTART_RESTARTBLOCK {
        return None;
    }
    if nr == SYS_NANOSLEEP {
        Some((regs.rdi, regs.rsi))
    } else if nr == SYS_CLOCK_NANOSLEEP && (regs.rsi as i32 & libc::TIMER_ABSTIME) == 0 {
        Some((regs.rdx, regs.r10))
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn regs(nr: i64, ret: i64) -> Regs {
        let mut r: Regs = zeroed();
        r.orig_rax = nr as u64;
        r.rax = ret as u64;
        r.rip = 0x1002;
        r
    }

    fn zeroed() -> Regs {
        ferry_sys::process::words_to_regs(&[0u64; 27]).expect("27 words make a register set")
    }

    #[test]
    fn an_interrupted_sleep_is_issued_again_with_its_remaining_time() {
        let mut r = regs(SYS_NANOSLEEP, ERESTART_RESTARTBLOCK);
        r.rdi = 0x7000;
        r.rsi = 0x7010;
        retry_interrupted_wait(&mut r);
        assert_eq!((r.rax as i64, r.rip, r.rdi), (SYS_NANOSLEEP, 0x1000, 0x7010));
        let mut r = regs(SYS_CLOCK_NANOSLEEP, ERESTART_RESTARTBLOCK);
        r.rdx = 0x8000;
        r.r10 = 0;
        retry_interrupted_wait(&mut r);
        assert_eq!((r.rax as i64, r.rip, r.rdx), (SYS_CLOCK_NANOSLEEP, 0x1000, 0x8000));
    }

    #[test]
    fn other_restarts_are_left_to_the_kernel() {
        let mut r = regs(libc::SYS_read, ERESTARTSYS);
        retry_interrupted_wait(&mut r);
        assert_eq!((r.rax as i64, r.rip), (ERESTARTSYS, 0x1002));
        let mut r = regs(libc::SYS_futex, ERESTART_RESTARTBLOCK);
        retry_interrupted_wait(&mut r);
        assert_eq!((r.rax as i64, r.rip), (libc::SYS_futex, 0x1000));
    }
}
