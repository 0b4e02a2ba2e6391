//! seccomp user notification: a program started with a filter that hands
//! its bind(2) calls to ferry, and the listener's ioctls (receive a
//! notification, check it is still pending, install a descriptor in the
//! caller, answer).
//!
//! The filter is installed in the child between fork and exec with
//! SECCOMP_FILTER_FLAG_NEW_LISTENER; the listener fd goes to the parent
//! over a socketpair (SCM_RIGHTS) before the exec, which closes the
//! child's copy (the kernel makes it close-on-exec).

use crate::{last_error, SysResult};
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};

const SECCOMP_SET_MODE_FILTER: libc::c_long = 1;
const SECCOMP_FILTER_FLAG_NEW_LISTENER: libc::c_long = 1 << 3;
/// _IOWR('!', 0, struct seccomp_notif)
const SECCOMP_IOCTL_NOTIF_RECV: libc::c_ulong = 0xc050_2100;
/// _IOWR('!', 1, struct seccomp_notif_resp)
const SECCOMP_IOCTL_NOTIF_SEND: libc::c_ulong = 0xc018_2101;
/// _IOW('!', 2, __u64)
const SECCOMP_IOCTL_NOTIF_ID_VALID: libc::c_ulong = 0x4008_2102;
/// _IOW('!', 3, struct seccomp_notif_addfd)
const SECCOMP_IOCTL_NOTIF_ADDFD: libc::c_ulong = 0x4018_2103;
/// The answer lets the syscall run in the kernel as if no filter had
/// trapped it.
pub const SECCOMP_USER_NOTIF_FLAG_CONTINUE: u32 = 1;
const SECCOMP_ADDFD_FLAG_SETFD: u32 = 1;
pub const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;

/// struct seccomp_data
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct SeccompData {
    nr: i32,
    arch: u32,
    instruction_pointer: u64,
    args: [u64; 6],
}

/// struct seccomp_notif (80 bytes)
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct RawNotif {
    id: u64,
    pid: u32,
    flags: u32,
    data: SeccompData,
}

/// struct seccomp_notif_resp
#[repr(C)]
struct RawResp {
    id: u64,
    val: i64,
    error: i32,
    flags: u32,
}

/// struct seccomp_notif_addfd
#[repr(C)]
struct RawAddFd {
    id: u64,
    flags: u32,
    srcfd: u32,
    newfd: u32,
    newfd_flags: u32,
}

/// One trapped syscall, waiting for an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Notif {
    /// The cookie every answer and check names.
    pub id: u64,
    /// The calling thread, in the listener's PID namespace.
    pub tid: i32,
    pub nr: i32,
    pub arch: u32,
    pub args: [u64; 6],
}

/// The classic BPF program that traps bind(2) of x86_64 and allows every
/// other syscall (other architectures' calls, such as int 0x80's
/// socketcall, and x32's bind are not trapped), packed as
/// [`crate::seccomp::get_filter`] returns filters.
pub fn bind_trap_program() -> Vec<u64> {
    let insn = |code: u16, jt: u8, jf: u8, k: u32| {
        u64::from(code) | (u64::from(jt) << 16) | (u64::from(jf) << 24) | (u64::from(k) << 32)
    };
    const LD_W_ABS: u16 = 0x20;
    const JEQ_K: u16 = 0x15;
    const RET_K: u16 = 0x06;
    const RET_ALLOW: u32 = 0x7fff_0000;
    vec![
        insn(LD_W_ABS, 0, 0, 4), // arch
        insn(JEQ_K, 0, 3, AUDIT_ARCH_X86_64),
        insn(LD_W_ABS, 0, 0, 0), // nr
        insn(JEQ_K, 0, 1, libc::SYS_bind as u32),
        insn(RET_K, 0, 0, crate::seccomp::SECCOMP_RET_USER_NOTIF),
        insn(RET_K, 0, 0, RET_ALLOW),
    ]
}

/// Credentials the program takes after the filter is installed (as root,
/// which needs no no_new_privs for it) and before its exec.
#[derive(Debug, Clone, Default)]
pub struct ExecCreds {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
}

/// Makes `cmd`'s child install `program` (a filter whose traps go to a
/// listener, e.g. [`bind_trap_program`]) right before its exec, in a
/// session of its own, with every fd but 0-2 closed across the exec and
/// the credentials `creds`, if given. Returns the socket on which the
/// listener arrives once the child has run its setup: call
/// [`take_listener`] on it after `spawn()`. A failed step fails the spawn
/// with that step's errno.
pub fn set_bind_trap(
    cmd: &mut std::process::Command,
    program: Vec<u64>,
    creds: Option<ExecCreds>,
) -> SysResult<OwnedFd> {
    use std::os::unix::process::CommandExt;
    let (ours, theirs) = socketpair()?;
    let hook = move || -> std::io::Result<()> {
        let err = std::io::Error::last_os_error;
        // SAFETY: no arguments.
        if unsafe { libc::setsid() } < 0 {
            return Err(err());
        }
        let len = program.len() as u16;
        let prog = libc::sock_fprog { len, filter: program.as_ptr() as *mut libc::sock_filter };
        // SAFETY: `prog` points at `program`, alive in this closure.
        let listener = unsafe {
            libc::syscall(
                libc::SYS_seccomp,
                SECCOMP_SET_MODE_FILTER,
                SECCOMP_FILTER_FLAG_NEW_LISTENER,
                &prog as *const libc::sock_fprog,
            )
        };
        if listener < 0 {
            return Err(err());
        }
        send_fd_raw(theirs.as_raw_fd(), listener as RawFd)?;
        // SAFETY: integer arguments. The listener is close-on-exec
        // already; the flag keeps std's own exec-error pipe working,
        // which a plain close_range would close.
        unsafe {
            libc::close(listener as RawFd);
            libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, libc::CLOSE_RANGE_CLOEXEC);
        }
        if let Some(c) = &creds {
            // SAFETY: `groups` is a live slice of c.groups.len() gids; the
            // rest are integers.
            let r = unsafe {
                if libc::setgroups(c.groups.len(), c.groups.as_ptr()) < 0
                    || libc::setgid(c.gid) < 0
                    || libc::setuid(c.uid) < 0
                {
                    -1
                } else {
                    0
                }
            };
            if r < 0 {
                return Err(err());
            }
        }
        Ok(())
    };
    // SAFETY: the hook runs in the forked child before exec and makes raw
    // syscalls only (setsid, seccomp, sendmsg, close, close_range,
    // setgroups, setgid, setuid), all async-signal-safe, on memory the
    // closure owns; it does not allocate.
    unsafe { cmd.pre_exec(hook) };
    Ok(ours)
}

fn socketpair() -> SysResult<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: fds is an array of two ints for the kernel to fill.
    let r = unsafe {
        libc::socketpair(libc::AF_UNIX, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0, fds.as_mut_ptr())
    };
    if r < 0 {
        return Err(last_error("socketpair"));
    }
    use std::os::fd::FromRawFd;
    // SAFETY: two new descriptors owned by us.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// sendmsg of one byte and one descriptor, without allocating (it runs
/// between fork and exec).
fn send_fd_raw(sock: RawFd, fd: RawFd) -> std::io::Result<()> {
    // Room for one cmsghdr and one int, 8-byte aligned.
    let mut ctrl = [0u64; 4];
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec { iov_base: byte.as_mut_ptr().cast(), iov_len: 1 };
    // SAFETY: msghdr is plain data; CMSG_* compute offsets inside `ctrl`
    // (CMSG_SPACE(4) = 24 bytes of its 32), which outlives the sendmsg.
    let r = unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = ctrl.as_mut_ptr().cast();
        msg.msg_controllen = libc::CMSG_SPACE(4) as usize;
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(4) as usize;
        std::ptr::write_unaligned(libc::CMSG_DATA(c) as *mut i32, fd);
        libc::sendmsg(sock, &msg, 0)
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The listener the child of [`set_bind_trap`] sent, once `spawn()`
/// returned (the child has exec'd, so the message is there).
pub fn take_listener(sock: &OwnedFd) -> SysResult<OwnedFd> {
    let mut buf = [0u8; 1];
    let msg = crate::unix::recv(sock.as_raw_fd(), &mut buf, libc::MSG_DONTWAIT)?;
    msg.and_then(|m| m.fds.into_iter().next())
        .ok_or_else(|| crate::SysError::new("recvmsg(seccomp listener)", libc::ENOMSG))
}

/// Waits for the next trapped syscall. ENOENT: its caller was gone
/// before it could be read (a signal, an exit): wait again.
pub fn recv(listener: BorrowedFd<'_>) -> SysResult<Notif> {
    // Must be zeroed: the kernel refuses a buffer with anything in it.
    let mut n = RawNotif::default();
    // SAFETY: `n` is a writable struct seccomp_notif.
    let r = unsafe {
        libc::ioctl(listener.as_raw_fd(), SECCOMP_IOCTL_NOTIF_RECV, &mut n as *mut RawNotif)
    };
    if r < 0 {
        return Err(last_error("ioctl(SECCOMP_IOCTL_NOTIF_RECV)"));
    }
    Ok(Notif { id: n.id, tid: n.pid as i32, nr: n.data.nr, arch: n.data.arch, args: n.data.args })
}

/// Whether notification `id` still waits for its answer (its caller has
/// not been interrupted, exited, or answered): read what it points at
/// first, then check, so the read is known to be the caller's.
pub fn id_valid(listener: BorrowedFd<'_>, id: u64) -> bool {
    // SAFETY: the argument points at a u64.
    let r = unsafe {
        libc::ioctl(listener.as_raw_fd(), SECCOMP_IOCTL_NOTIF_ID_VALID, &id as *const u64)
    };
    r == 0
}

/// Answers notification `id`: `flags` SECCOMP_USER_NOTIF_FLAG_CONTINUE
/// runs the syscall; otherwise it returns `val`, or fails with `error`
/// when that is non-zero (a positive errno).
pub fn respond(
    listener: BorrowedFd<'_>,
    id: u64,
    val: i64,
    error: i32,
    flags: u32,
) -> SysResult<()> {
    let resp = RawResp { id, val, error: -error, flags };
    // SAFETY: `resp` is a struct seccomp_notif_resp.
    let r = unsafe {
        libc::ioctl(listener.as_raw_fd(), SECCOMP_IOCTL_NOTIF_SEND, &resp as *const RawResp)
    };
    if r < 0 {
        return Err(last_error("ioctl(SECCOMP_IOCTL_NOTIF_SEND)"));
    }
    Ok(())
}

/// Installs a copy of our `src` in the caller of notification `id` as
/// exactly fd `newfd` (SECCOMP_ADDFD_FLAG_SETFD: whatever it held there
/// is closed, as by dup2), close-on-exec if `cloexec`.
pub fn add_fd_at(
    listener: BorrowedFd<'_>,
    id: u64,
    src: BorrowedFd<'_>,
    newfd: RawFd,
    cloexec: bool,
) -> SysResult<()> {
    let a = RawAddFd {
        id,
        flags: SECCOMP_ADDFD_FLAG_SETFD,
        srcfd: src.as_raw_fd() as u32,
        newfd: newfd as u32,
        newfd_flags: if cloexec { libc::O_CLOEXEC as u32 } else { 0 },
    };
    // SAFETY: `a` is a struct seccomp_notif_addfd.
    let r = unsafe {
        libc::ioctl(listener.as_raw_fd(), SECCOMP_IOCTL_NOTIF_ADDFD, &a as *const RawAddFd)
    };
    if r < 0 {
        return Err(last_error("ioctl(SECCOMP_IOCTL_NOTIF_ADDFD)"));
    }
    Ok(())
}

/// Forks a process that answers every notification of `listener` with
/// SECCOMP_USER_NOTIF_FLAG_CONTINUE until no process uses the filter any
/// more (the listener polls POLLHUP), in a session of its own, holding
/// no other descriptor. A filter cannot be removed, and one whose
/// listener is closed fails every trapped call with ENOSYS: this keeps
/// the trapped calls working for the program's whole life. It is named
/// `ferry-binds` (its comm). Returns its PID; once ferry exits, init (or
/// the nearest subreaper) reaps it.
pub fn spawn_continue_answerer(listener: OwnedFd) -> SysResult<i32> {
    let fd = listener.as_raw_fd();
    // SAFETY: fork has no preconditions; the child below makes raw
    // syscalls only (async-signal-safe: this process may have threads),
    // on its stack, and ends with _exit.
    let child = unsafe { libc::fork() };
    if child < 0 {
        return Err(last_error("fork"));
    }
    if child > 0 {
        return Ok(child);
    }
    // SAFETY: integer arguments and stack structs; no return to Rust
    // code that would run destructors of the parent's values.
    unsafe {
        libc::setsid();
        libc::prctl(libc::PR_SET_NAME, c"ferry-binds".as_ptr(), 0, 0, 0);
        if fd > 0 {
            libc::syscall(libc::SYS_close_range, 0u32, (fd - 1) as u32, 0u32);
        }
        libc::syscall(libc::SYS_close_range, (fd + 1) as u32, u32::MAX, 0u32);
        loop {
            let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
            if libc::poll(&mut p, 1, -1) < 0 {
                continue;
            }
            if p.revents & libc::POLLIN == 0 && p.revents & (libc::POLLHUP | libc::POLLNVAL) != 0 {
                libc::_exit(0);
            }
            let mut n = RawNotif::default();
            if libc::ioctl(fd, SECCOMP_IOCTL_NOTIF_RECV, &mut n as *mut RawNotif) < 0 {
                continue;
            }
            let resp =
                RawResp { id: n.id, val: 0, error: 0, flags: SECCOMP_USER_NOTIF_FLAG_CONTINUE };
            libc::ioctl(fd, SECCOMP_IOCTL_NOTIF_SEND, &resp as *const RawResp);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_structs_have_the_kernels_sizes() {
        assert_eq!(std::mem::size_of::<RawNotif>(), 80);
        assert_eq!(std::mem::size_of::<RawResp>(), 24);
        assert_eq!(std::mem::size_of::<RawAddFd>(), 24);
    }

    #[test]
    fn the_bind_trap_program_loads() {
        if !crate::process::is_root() {
            return;
        }
        assert_eq!(crate::seccomp::filter_loads(&bind_trap_program()), Ok(()));
    }
}
