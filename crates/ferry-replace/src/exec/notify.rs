//! The new binary's binds, answered until it has bound every address the
//! old tree listens on: a bind of such an address gets the old listener
//! in place of its own socket (SECCOMP_IOCTL_NOTIF_ADDFD at the same fd
//! number, its close-on-exec kept) and succeeds; every other bind runs
//! as if nothing had trapped it.

use super::listeners::{self, OldListener};
use super::spawn::NewService;
use crate::error::ReplaceError;
use ferry_sys::seccomp_notify::{self, Notif, AUDIT_ARCH_X86_64, SECCOMP_USER_NOTIF_FLAG_CONTINUE};
use ferry_sys::vm::{self, RemoteRange};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::time::{Duration, Instant};

/// What to do with one bind.
#[derive(Debug, PartialEq, Eq)]
enum Answer {
    /// Hand over the listener of this index.
    Claim(usize),
    /// Let the kernel run it.
    Continue,
    /// The caller is gone: nothing to answer.
    Gone,
}

/// The bind that claimed the last listener: its caller holds the
/// listener already and waits for the answer, which comes once the old
/// tree gave its listeners up, so that the two never accept at once.
#[derive(Debug)]
pub struct LastBind {
    id: u64,
    tid: i32,
}

impl LastBind {
    /// Lets the bind return 0. False when its caller went away meanwhile.
    pub fn succeed(self, listener: BorrowedFd<'_>) -> bool {
        seccomp_notify::respond(listener, self.id, 0, 0, 0).is_ok()
    }

    /// Makes the bind fail with EADDRINUSE (the caller is killed next).
    pub fn fail(self, listener: BorrowedFd<'_>) {
        let _ = seccomp_notify::respond(listener, self.id, 0, libc::EADDRINUSE, 0);
    }

    pub fn tid(&self) -> i32 {
        self.tid
    }
}

/// Answers the new binary's binds until every listener of `old` is its,
/// within `timeout`; the last such bind is left waiting ([`LastBind`]).
/// Fails (the caller kills the new binary) when it exits first or the
/// time runs out.
pub fn claim_all(
    new: &NewService,
    old: &[OldListener],
    timeout: Duration,
) -> Result<LastBind, ReplaceError> {
    let deadline = Instant::now() + timeout;
    let mut claimed = vec![false; old.len()];
    let listener = new.notify.as_fd();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(unclaimed(new, old, &claimed, timeout));
        }
        let mut fds = [
            libc::pollfd { fd: listener.as_raw_fd(), events: libc::POLLIN, revents: 0 },
            libc::pollfd { fd: new.pidfd.as_raw_fd(), events: libc::POLLIN, revents: 0 },
        ];
        let ms = left.as_millis().clamp(1, 1000) as i32;
        match ferry_sys::fd::poll(&mut fds, ms) {
            Ok(_) => {}
            Err(e) if e.errno == libc::EINTR => continue,
            Err(e) => return Err(refused(new, format!("waiting for its binds: {e}"))),
        }
        if fds[1].revents != 0 {
            return Err(refused(new, exited(new, old, &claimed)));
        }
        if fds[0].revents & libc::POLLIN == 0 {
            continue;
        }
        let n = match seccomp_notify::recv(listener) {
            Ok(n) => n,
            Err(e) if e.errno == libc::ENOENT || e.errno == libc::EINTR => continue,
            Err(e) => return Err(refused(new, format!("reading a bind: {e}"))),
        };
        match decide(listener, &n, old, &claimed) {
            Answer::Claim(i) => {
                if !install(listener, &n, &old[i])? {
                    continue;
                }
                claimed[i] = true;
                tracing::info!("replace --exec: pid {} took over {}", n.tid, old[i].shown());
                if claimed.iter().all(|c| *c) {
                    return Ok(LastBind { id: n.id, tid: n.tid });
                }
                if let Err(e) = seccomp_notify::respond(listener, n.id, 0, 0, 0) {
                    // Its caller went away: the listener is to be claimed again.
                    tracing::debug!("replace --exec: answering a bind: {e}");
                    claimed[i] = false;
                }
            }
            Answer::Continue => continue_call(listener, n.id),
            Answer::Gone => {}
        }
    }
}

fn refused(new: &NewService, why: String) -> ReplaceError {
    ReplaceError::Refused(format!("the new binary {} (pid {}): {why}", new.path.display(), new.pid))
}

fn missing(old: &[OldListener], claimed: &[bool]) -> String {
    let names: Vec<String> =
        old.iter().zip(claimed).filter(|(_, c)| !**c).map(|(l, _)| l.shown()).collect();
    names.join(", ")
}

fn unclaimed(new: &NewService, old: &[OldListener], claimed: &[bool], t: Duration) -> ReplaceError {
    refused(
        new,
        format!(
            "did not bind {} within {} s (--bind-timeout); it was killed",
            missing(old, claimed),
            t.as_secs_f64()
        ),
    )
}

fn exited(new: &NewService, old: &[OldListener], claimed: &[bool]) -> String {
    let status = std::fs::read_to_string(format!("/proc/{}/stat", new.pid)).unwrap_or_default();
    let zombie = status.rsplit(')').next().is_some_and(|r| r.trim_start().starts_with('Z'));
    let how = if zombie { "exited" } else { "ended" };
    format!("{how} before it bound {}", missing(old, claimed))
}

fn continue_call(listener: BorrowedFd<'_>, id: u64) {
    // ENOENT: the caller was interrupted or exited meanwhile.
    if let Err(e) = seccomp_notify::respond(listener, id, 0, 0, SECCOMP_USER_NOTIF_FLAG_CONTINUE) {
        tracing::debug!("replace --exec: letting a bind run: {e}");
    }
}

/// The socket of a bind that names an unclaimed listener, checked to be
/// a TCP socket of the listener's family (and IPV6_V6ONLY setting).
fn decide(listener: BorrowedFd<'_>, n: &Notif, old: &[OldListener], claimed: &[bool]) -> Answer {
    if n.arch != AUDIT_ARCH_X86_64 || i64::from(n.nr) != libc::SYS_bind {
        return Answer::Continue;
    }
    let len = (n.args[2] as usize).min(128);
    let mut raw = vec![0u8; len];
    let read = vm::read_remote(n.tid, &mut raw, &[RemoteRange { addr: n.args[1], len }]);
    // What was read is the caller's only while its call still waits.
    if !seccomp_notify::id_valid(listener, n.id) {
        return Answer::Gone;
    }
    let Some(addr) = read.ok().and_then(|got| listeners::parse_sockaddr(&raw[..got.min(len)]))
    else {
        return Answer::Continue;
    };
    // parse_sockaddr gives an IPv6 address for AF_INET6 only.
    let found = old.iter().enumerate().position(|(i, l)| {
        !claimed[i] && listeners::names_listener(l.local, l.ipv6, addr, addr.is_ipv6())
    });
    let Some(i) = found else { return Answer::Continue };
    match socket_fits(n, &old[i]) {
        true => Answer::Claim(i),
        false => Answer::Continue,
    }
}

/// The caller's process (its thread group leader) of thread `tid`.
fn tgid(tid: i32) -> Option<i32> {
    let status = std::fs::read_to_string(format!("/proc/{tid}/status")).ok()?;
    status.lines().find_map(|l| l.strip_prefix("Tgid:")).and_then(|v| v.trim().parse().ok())
}

/// Whether the socket being bound is a TCP socket of the listener's kind.
fn socket_fits(n: &Notif, l: &OldListener) -> bool {
    let fd = n.args[0] as i32;
    let Some(pid) = tgid(n.tid) else { return false };
    let Ok(sock) = listeners::duplicate(pid, fd) else { return false };
    let int = |level, name| ferry_sys::socket::getsockopt_int(sock.as_raw_fd(), level, name).ok();
    let family = if l.ipv6 { libc::AF_INET6 } else { libc::AF_INET };
    let fits = int(libc::SOL_SOCKET, libc::SO_DOMAIN) == Some(family)
        && int(libc::SOL_SOCKET, libc::SO_TYPE) == Some(libc::SOCK_STREAM)
        && int(libc::SOL_SOCKET, libc::SO_PROTOCOL) == Some(libc::IPPROTO_TCP);
    let v6only_same =
        !l.ipv6 || int(libc::IPPROTO_IPV6, libc::IPV6_V6ONLY).map(|v| v != 0) == Some(l.v6only);
    fits && v6only_same
}

/// The fd flags of the caller's fd (/proc/TID/fdinfo/FD "flags:", octal):
/// (close-on-exec, O_NONBLOCK).
fn fd_flags(tid: i32, fd: i32) -> Option<(bool, bool)> {
    let text = std::fs::read_to_string(format!("/proc/{tid}/fdinfo/{fd}")).ok()?;
    let flags = text.lines().find_map(|l| l.strip_prefix("flags:"))?;
    let flags = i64::from_str_radix(flags.trim(), 8).ok()?;
    Some((flags & i64::from(libc::O_CLOEXEC) != 0, flags & i64::from(libc::O_NONBLOCK) != 0))
}

/// Puts the old listener at the bound fd number of the caller (the bind
/// is answered by the caller of this). The listener's file status flags
/// are shared by every holder: it takes the caller's O_NONBLOCK. False
/// when the caller went away meanwhile.
fn install(listener: BorrowedFd<'_>, n: &Notif, l: &OldListener) -> Result<bool, ReplaceError> {
    let fd = n.args[0] as i32;
    let Some((cloexec, nonblock)) = fd_flags(n.tid, fd) else { return Ok(false) };
    let err = |what: &str, e: ferry_sys::SysError| {
        ReplaceError::Refused(format!(
            "handing {} to pid {} as fd {fd}: {what}: {e}",
            l.shown(),
            n.tid
        ))
    };
    let ours = l.dup.as_fd();
    let fl = ferry_sys::fd::fcntl_getfl(ours).map_err(|e| err("F_GETFL", e))?;
    if (fl & libc::O_NONBLOCK != 0) != nonblock {
        let fl = if nonblock { fl | libc::O_NONBLOCK } else { fl & !libc::O_NONBLOCK };
        ferry_sys::fd::fcntl_int(ours.as_raw_fd(), libc::F_SETFL, fl.into(), "fcntl(F_SETFL)")
            .map_err(|e| err("F_SETFL", e))?;
    }
    match seccomp_notify::add_fd_at(listener, n.id, ours, fd, cloexec) {
        Ok(()) => Ok(true),
        Err(e) if e.errno == libc::ENOENT => Ok(false),
        Err(e) => Err(err("SECCOMP_IOCTL_NOTIF_ADDFD", e)),
    }
}
