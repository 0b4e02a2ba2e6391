//! The old tree's listeners taken away at once: the tree frozen, in each
//! process every epoll registration of a listener fd removed
//! (epoll_ctl(EPOLL_CTL_DEL), run inside the process) and every listener
//! fd replaced by a quiet listener, then the tree let go. The sockets
//! stay open in the new binary, so connections that arrive meanwhile
//! wait in their accept queues; only the new binary accepts from then on.
//!
//! The quiet listener is a unix stream socket made inside the process,
//! bound to an autobound abstract name (five hex digits, nothing
//! connects to it) and listening, put at the listener's fd number with
//! dup3 (its close-on-exec kept, O_NONBLOCK as the old listener had it):
//! to the old tree its listener just stops getting connections. A
//! closed fd would instead be ready for poll(2) and select(2) (POLLNVAL)
//! and fail accept with EBADF, which makes a poll-based server spin and
//! may make another exit, cutting the connections it still serves.
//! A thread blocked in accept(2) or epoll_wait(2) is interrupted by the
//! freeze and restarts on the quiet listener or an epoll set without the
//! old one.

use super::listeners::{socket_fds, OldListener};
use crate::error::ReplaceError;
use ferry_engine::capture::FrozenTree;
use ferry_engine::inject::{self, Remote, Scratch, SCRATCH_DATA};
use ferry_engine::EngineError;
use std::collections::BTreeSet;

/// What was done in the old tree.
#[derive(Debug, Default, Clone, Copy)]
pub struct TakenAway {
    /// Listener fds replaced by a quiet listener.
    pub closed: usize,
    pub unregistered: usize,
}

/// Removes the listeners `old` from every process of the tree of `root`.
pub fn take_away(root: i32, old: &[OldListener]) -> Result<TakenAway, ReplaceError> {
    let inodes: BTreeSet<u64> = old.iter().map(|l| l.inode).collect();
    let tree = freeze(root).map_err(|e| {
        ReplaceError::Refused(format!("freezing the old tree to take its listeners: {e}"))
    })?;
    let mut done = TakenAway::default();
    let mut failed = None;
    for p in &tree.procs {
        match in_process(p.frozen.pid, &inodes, old) {
            Ok(d) => {
                done.closed += d.closed;
                done.unregistered += d.unregistered;
            }
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
    }
    let released = tree.release();
    if let Some(e) = failed {
        return Err(ReplaceError::Takeover(format!(
            "{e} (listener fds of the old tree replaced so far: {}); both trees serve",
            done.closed
        )));
    }
    released.map_err(|e| ReplaceError::Takeover(format!("letting the old tree run on: {e}")))?;
    Ok(done)
}

/// The tree frozen, tried again (up to 10 times) while a thread or
/// process of it exits in the middle of the freeze (a server's handler
/// threads come and go).
fn freeze(root: i32) -> Result<FrozenTree, EngineError> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        match FrozenTree::freeze(root) {
            Err(EngineError::Gone { pid, what })
                if attempt < 10 && ferry_engine::procfs::state(root).is_some_and(|s| s != 'Z') =>
            {
                tracing::info!("replace --exec: freeze attempt {attempt}: pid {pid}: {what}");
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            other => return other,
        }
    }
}

/// The registrations and fds of the listeners in one stopped process.
fn in_process(
    pid: i32,
    inodes: &BTreeSet<u64>,
    old: &[OldListener],
) -> Result<TakenAway, EngineError> {
    let fds = socket_fds(pid);
    let listeners: Vec<(i32, u64)> =
        fds.into_iter().filter(|(_, ino)| inodes.contains(ino)).collect();
    if listeners.is_empty() {
        return Ok(TakenAway::default());
    }
    let remote = remote_of(pid)?;
    let mut done = TakenAway::default();
    for epfd in epoll_fds(pid) {
        let text =
            std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{epfd}")).unwrap_or_default();
        for tfd in registered_fds(&text) {
            if !listeners.iter().any(|(fd, _)| *fd == tfd) {
                continue;
            }
            let args = [epfd as u64, libc::EPOLL_CTL_DEL as u64, tfd as u64, 0];
            match remote.call(pid, "epoll_ctl(EPOLL_CTL_DEL)", libc::SYS_epoll_ctl, &args) {
                Ok(_) => done.unregistered += 1,
                // Registered through another process's fd of that number.
                Err(EngineError::Remote { errno: libc::ENOENT, .. }) => {}
                Err(e) => return Err(e),
            }
        }
    }
    let scratch = Scratch::map(&remote, pid)?;
    let addr = scratch.addr + SCRATCH_DATA;
    let quieted = remote.write(addr, &(libc::AF_UNIX as u16).to_ne_bytes()).and_then(|_| {
        for &(fd, ino) in &listeners {
            let nonblock = old.iter().find(|l| l.inode == ino).is_some_and(|l| l.nonblock);
            quiet(&remote, pid, fd, addr, nonblock)?;
            done.closed += 1;
        }
        Ok(())
    });
    let unmapped = scratch.unmap(&remote, pid);
    quieted.and(unmapped)?;
    Ok(done)
}

/// Puts a quiet listener (a unix stream socket on an autobound abstract
/// name) at `fd` of `pid`; `sockaddr` holds a bare AF_UNIX family in the
/// process.
fn quiet(
    remote: &Remote,
    pid: i32,
    fd: i32,
    sockaddr: u64,
    nonblock: bool,
) -> Result<(), EngineError> {
    let cloexec = std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{fd}"))
        .ok()
        .and_then(|t| {
            let f = t.lines().find_map(|l| l.strip_prefix("flags:"))?;
            i64::from_str_radix(f.trim(), 8).ok()
        })
        .is_some_and(|f| f & i64::from(libc::O_CLOEXEC) != 0);
    let mut ty = libc::SOCK_STREAM;
    if nonblock {
        ty |= libc::SOCK_NONBLOCK;
    }
    let s = remote.call(
        pid,
        "socket(AF_UNIX)",
        libc::SYS_socket,
        &[libc::AF_UNIX as u64, ty as u64, 0],
    )?;
    let family_only = std::mem::size_of::<libc::sa_family_t>() as u64;
    let made = remote
        .call(pid, "bind(autobind)", libc::SYS_bind, &[s, sockaddr, family_only])
        .and_then(|_| remote.call(pid, "listen", libc::SYS_listen, &[s, 1]))
        .and_then(|_| {
            let flags = if cloexec { libc::O_CLOEXEC as u64 } else { 0 };
            remote.call(pid, "dup3", libc::SYS_dup3, &[s, fd as u64, flags])
        });
    let closed = remote.call(pid, "close", libc::SYS_close, &[s]);
    made.and(closed).map(drop)
}

fn remote_of(pid: i32) -> Result<Remote, EngineError> {
    let maps = ferry_engine::procfs::maps(pid)?;
    let vdso = maps.into_iter().find(|m| m.path == "[vdso]").ok_or_else(|| {
        EngineError::unsupported(pid, "the vDSO", "no [vdso] mapping to run close() inside it")
    })?;
    let syscall_ip = inject::find_syscall_insn(pid, vdso.start, vdso.end)?;
    Ok(Remote { pid, syscall_ip, settle: true })
}

/// The epoll fds of `pid`.
fn epoll_fds(pid: i32) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else { return Vec::new() };
    dir.flatten()
        .filter(|e| {
            std::fs::read_link(e.path()).is_ok_and(|l| l.as_os_str() == "anon_inode:[eventpoll]")
        })
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect()
}

/// The target fd numbers of an epoll fd's fdinfo ("tfd: N events: ...").
pub fn registered_fds(fdinfo: &str) -> Vec<i32> {
    fdinfo
        .lines()
        .filter_map(|l| l.strip_prefix("tfd:"))
        .filter_map(|rest| rest.split_whitespace().next()?.parse().ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epoll_registrations_are_read_from_fdinfo() {
        let text = "pos:\t0\nflags:\t02\nmnt_id:\t15\nino:\t1057\n\
                    tfd:        5 events:       19 data:                5  pos:0 ino:7d8 sdev:8\n\
                    tfd:       12 events: 10000019 data:        c00000000  pos:0 ino:7da sdev:8\n";
        assert_eq!(registered_fds(text), vec![5, 12]);
        assert_eq!(registered_fds("pos:\t0\n"), Vec::<i32>::new());
    }
}
