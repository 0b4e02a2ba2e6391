//! Unix connections made again by the processes that made them, so that
//! SO_PEERCRED (which the kernel fills from the calling task's thread
//! group and effective ids at socketpair(), listen() and connect() time)
//! names the same process, uid and gid as before the checkpoint.
//!
//! With an image that records SO_PEERCRED (format 4.3, `UnixPeers`),
//! every unix socket is made once every process of the tree exists
//! (before any fd table is installed), by the same code as the staged
//! ones ([`super::unix`]), except that those three calls run injected in
//! the recorded process, its effective uid and gid switched to the
//! recorded ones for that call (setresuid/setresgid leave the real and
//! saved ids at 0, so it switches back), and its supplementary groups
//! (SO_PEERGROUPS) too. ferry keeps a descriptor of
//! every socket; the processes take theirs with pidfd_getfd like TCP
//! connections (`tcp::install`).

use crate::error::{EngineError, Result};
use crate::inject::{self, Call};
use crate::restore::Session;
use ferry_image::UnixPeerCred;
use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

/// Makes the credential-bearing calls of unix sockets in the processes of
/// the tree.
pub(crate) trait Inject {
    /// SO_PEERCRED recorded for the socket `ino`.
    fn cred(&self, ino: u64) -> Option<UnixPeerCred>;
    /// socketpair(AF_UNIX, `sock_type`) called by `c.pid` as `c.uid`/`c.gid`;
    /// ferry's descriptors of both ends.
    fn socketpair(&mut self, c: UnixPeerCred, sock_type: i32) -> Result<(OwnedFd, OwnedFd)>;
    /// listen(`fd`, `backlog`) on ferry's socket `fd`, called by `c.pid`.
    fn listen(&mut self, c: UnixPeerCred, fd: &OwnedFd, backlog: i32) -> Result<()>;
    /// connect(`fd`, `name`) of ferry's socket `fd`, called by `c.pid`. A
    /// path is resolved in that process's directory: pass it absolute.
    fn connect(&mut self, c: UnixPeerCred, fd: &OwnedFd, name: &[u8]) -> Result<()>;
}

/// [`Inject`] over the sessions of the tree being restored.
pub(crate) struct Late<'s, 'a> {
    pub sessions: &'s mut [Session<'a>],
    pub creds: HashMap<u64, UnixPeerCred>,
}

const NO_CHANGE: u64 = u32::MAX as u64;
/// Where the supplementary groups go in the data area, after the call's
/// own argument (a sockaddr_un at most).
const GROUPS_AT: u64 = 256;

/// The supplementary groups `pid` has now (the "Groups:" line of its
/// status file).
fn groups_of(pid: i32) -> Result<Vec<u32>> {
    let status = crate::procfs::read_string(&format!("/proc/{pid}/status"))?;
    let line = status.lines().find_map(|l| l.strip_prefix("Groups:")).unwrap_or("");
    line.split_whitespace()
        .map(|g| {
            g.parse::<u32>().map_err(|_| {
                EngineError::restore(
                    pid,
                    format!("unreadable Groups: line in its status: {line:?}"),
                )
            })
        })
        .collect()
}

fn group_bytes(groups: &[u32]) -> Vec<u8> {
    groups.iter().flat_map(|g| g.to_ne_bytes()).collect()
}

impl<'a> Late<'_, 'a> {
    fn session(&mut self, pid: i32) -> Result<&mut Session<'a>> {
        let s = self.sessions.iter_mut().find(|s| s.pid == pid);
        // Not checked at capture only: the image is input.
        s.ok_or_else(|| EngineError::restore(pid, "a unix connection's SO_PEERCRED names this pid, which is not a process of the tree"))
    }

    /// Runs `call` (its arguments pointing at `data`, written at the
    /// session's data area) in `c.pid` with its effective ids switched to
    /// `c.uid`/`c.gid` around it; returns the call's result.
    fn run_as(
        &mut self,
        c: &UnixPeerCred,
        what: &str,
        data: &[u8],
        call: impl FnOnce(u64) -> Call,
    ) -> Result<u64> {
        let now = groups_of(c.pid)?;
        let s = self.session(c.pid)?;
        let pid = s.pid;
        if data.len() as u64 > GROUPS_AT {
            return Err(EngineError::restore(
                pid,
                format!("{what}: {} bytes of arguments", data.len()),
            ));
        }
        if !data.is_empty() {
            s.remote.write(s.data, data)?;
        }
        let call = call(s.data);
        // The process still has ferry's ids (0) and groups here: its own
        // come last (`process::restore_creds`). Groups and gid first,
        // while the uid is 0 (CAP_SETGID); back in the opposite order.
        let mut calls = Vec::new();
        let switch_groups = c.groups != now;
        if switch_groups {
            let room = (inject::SCRATCH_LEN - inject::SCRATCH_DATA - GROUPS_AT) as usize / 4;
            if c.groups.len() + now.len() > room {
                return Err(EngineError::restore(
                    pid,
                    format!(
                        "{what}: {} + {} supplementary groups do not fit the scratch area",
                        c.groups.len(),
                        now.len()
                    ),
                ));
            }
            let mine = s.data + GROUPS_AT;
            let back = mine + 4 * c.groups.len() as u64;
            let mut bytes = group_bytes(&c.groups);
            bytes.extend(group_bytes(&now));
            s.remote.write(mine, &bytes)?;
            calls.push((
                format!("setgroups({:?})", c.groups),
                Call::new(libc::SYS_setgroups, &[c.groups.len() as u64, mine]),
            ));
            // Pushed last, below.
            let restore = (
                format!("setgroups({now:?})"),
                Call::new(libc::SYS_setgroups, &[now.len() as u64, back]),
            );
            return self.run_switched(c, pid, what, call, calls, Some(restore));
        }
        self.run_switched(c, pid, what, call, calls, None)
    }

    fn run_switched(
        &mut self,
        c: &UnixPeerCred,
        pid: i32,
        what: &str,
        call: Call,
        mut calls: Vec<(String, Call)>,
        groups_back: Option<(String, Call)>,
    ) -> Result<u64> {
        if c.gid != 0 {
            calls.push((
                format!("setresgid(-1, {}, -1)", c.gid),
                Call::new(libc::SYS_setresgid, &[NO_CHANGE, c.gid as u64, NO_CHANGE]),
            ));
        }
        if c.uid != 0 {
            calls.push((
                format!("setresuid(-1, {}, -1)", c.uid),
                Call::new(libc::SYS_setresuid, &[NO_CHANGE, c.uid as u64, NO_CHANGE]),
            ));
        }
        let at = calls.len();
        calls.push((what.to_string(), call));
        if c.uid != 0 {
            calls.push((
                "setresuid(-1, 0, -1)".into(),
                Call::new(libc::SYS_setresuid, &[NO_CHANGE, 0, NO_CHANGE]),
            ));
        }
        if c.gid != 0 {
            calls.push((
                "setresgid(-1, 0, -1)".into(),
                Call::new(libc::SYS_setresgid, &[NO_CHANGE, 0, NO_CHANGE]),
            ));
        }
        calls.extend(groups_back);
        let s = self.session(pid)?;
        let r = s.run(pid, &calls)?;
        r.get(at).copied().ok_or_else(|| EngineError::restore(pid, format!("{what}: no result")))
    }

    /// Gives process `pid` its own descriptor of ferry's `fd` (pidfd_getfd
    /// through a pidfd of ferry); returns its number there.
    fn lend(&mut self, pid: i32, fd: RawFd) -> Result<u64> {
        let s = self.session(pid)?;
        let me = std::process::id() as u64;
        let pidfd = s.call("pidfd_open(ferry)", libc::SYS_pidfd_open, &[me, 0])?;
        let got = s.call(
            "pidfd_getfd(a unix socket of ferry)",
            libc::SYS_pidfd_getfd,
            &[pidfd, fd as u64, 0],
        );
        s.call("close(pidfd of ferry)", libc::SYS_close, &[pidfd])?;
        got
    }

    fn close_in(&mut self, pid: i32, fd: u64) -> Result<()> {
        let s = self.session(pid)?;
        s.call(&format!("close(fd {fd})"), libc::SYS_close, &[fd]).map(|_| ())
    }
}

/// A `struct sockaddr_un` for `name` and its length, as bind(2) and
/// connect(2) take it: a path with its terminating NUL, an abstract name
/// exactly as long as it is.
fn sockaddr(pid: i32, name: &[u8]) -> Result<(Vec<u8>, u64)> {
    if name.is_empty() || name.len() >= ferry_sys::socket::UNIX_PATH_MAX {
        return Err(EngineError::restore(
            pid,
            format!("unix name {} is empty or too long", crate::unix_remake::show(name)),
        ));
    }
    let mut b = (libc::AF_UNIX as u16).to_ne_bytes().to_vec();
    b.extend_from_slice(name);
    let len = b.len() as u64 + u64::from(name[0] != 0);
    b.resize(2 + ferry_sys::socket::UNIX_PATH_MAX, 0);
    Ok((b, len))
}

impl Inject for Late<'_, '_> {
    fn cred(&self, ino: u64) -> Option<UnixPeerCred> {
        self.creds.get(&ino).cloned()
    }

    fn socketpair(&mut self, c: UnixPeerCred, sock_type: i32) -> Result<(OwnedFd, OwnedFd)> {
        let what = format!("socketpair(AF_UNIX, {sock_type}) as uid {} gid {}", c.uid, c.gid);
        let ty = (sock_type | libc::SOCK_CLOEXEC) as u64;
        self.run_as(&c, &what, &[0u8; 8], |at| {
            Call::new(libc::SYS_socketpair, &[libc::AF_UNIX as u64, ty, 0, at])
        })?;
        let s = self.session(c.pid)?;
        let sv = s.remote.read(s.data, 8)?;
        let fds = [
            i32::from_ne_bytes([sv[0], sv[1], sv[2], sv[3]]),
            i32::from_ne_bytes([sv[4], sv[5], sv[6], sv[7]]),
        ];
        let pidfd = ferry_sys::pidfd::pidfd_open(c.pid)
            .map_err(|e| EngineError::kernel(c.pid, "pidfd_open", e))?;
        let take = |fd: i32| {
            ferry_sys::pidfd::pidfd_getfd(&pidfd, fd).map_err(|e| {
                EngineError::kernel(c.pid, format!("taking the unix socket pair end at fd {fd}"), e)
            })
        };
        let (a, b) = (take(fds[0]), take(fds[1]));
        for fd in fds {
            self.close_in(c.pid, fd as u64)?;
        }
        Ok((a?, b?))
    }

    fn listen(&mut self, c: UnixPeerCred, fd: &OwnedFd, backlog: i32) -> Result<()> {
        let there = self.lend(c.pid, fd.as_raw_fd())?;
        let what = format!("listen(unix socket, {backlog}) as uid {} gid {}", c.uid, c.gid);
        let r = self.run_as(&c, &what, &[], |_| {
            Call::new(libc::SYS_listen, &[there, backlog as u32 as u64])
        });
        self.close_in(c.pid, there)?;
        r.map(|_| ())
    }

    fn connect(&mut self, c: UnixPeerCred, fd: &OwnedFd, name: &[u8]) -> Result<()> {
        let (addr, len) = sockaddr(c.pid, name)?;
        let there = self.lend(c.pid, fd.as_raw_fd())?;
        let what = format!(
            "connect(unix socket, {}) as uid {} gid {}",
            crate::unix_remake::show(name),
            c.uid,
            c.gid
        );
        let r = self.run_as(&c, &what, &addr, |at| Call::new(libc::SYS_connect, &[there, at, len]));
        self.close_in(c.pid, there)?;
        r.map(|_| ())
    }
}
