//! The old tree's listeners taken away at once: the tree frozen, in each
//! process every epoll registration of a listener fd removed
//! (epoll_ctl(EPOLL_CTL_DEL), run inside the process) and every listener
//! fd closed, then the tree let go. The sockets stay open in the new
//! binary, so connections that arrive meanwhile wait in their accept
//! queues; only the new binary accepts from then on.
//!
//! A thread blocked in accept(2) or epoll_wait(2) is interrupted by the
//! freeze and restarts on a closed fd (EBADF) or an epoll set without the
//! listener.

use super::listeners::{socket_fds, OldListener};
use crate::error::ReplaceError;
use ferry_engine::capture::FrozenTree;
use ferry_engine::inject::{self, Remote};
use ferry_engine::EngineError;
use std::collections::BTreeSet;

/// What was done in the old tree.
#[derive(Debug, Default, Clone, Copy)]
pub struct TakenAway {
    pub closed: usize,
    pub unregistered: usize,
}

/// Removes the listeners `old` from every process of the tree of `root`.
pub fn take_away(root: i32, old: &[OldListener]) -> Result<TakenAway, ReplaceError> {
    let inodes: BTreeSet<u64> = old.iter().map(|l| l.inode).collect();
    let tree = FrozenTree::freeze(root).map_err(|e| {
        ReplaceError::Refused(format!("freezing the old tree to take its listeners: {e}"))
    })?;
    let mut done = TakenAway::default();
    let mut failed = None;
    for p in &tree.procs {
        match in_process(p.frozen.pid, &inodes) {
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
            "{e} (listeners closed in the old tree so far: {}); both trees serve",
            done.closed
        )));
    }
    released.map_err(|e| ReplaceError::Takeover(format!("letting the old tree run on: {e}")))?;
    Ok(done)
}

/// The registrations and fds of the listeners in one stopped process.
fn in_process(pid: i32, inodes: &BTreeSet<u64>) -> Result<TakenAway, EngineError> {
    let fds = socket_fds(pid);
    let listeners: Vec<i32> =
        fds.iter().filter(|(_, ino)| inodes.contains(ino)).map(|(fd, _)| *fd).collect();
    if listeners.is_empty() {
        return Ok(TakenAway::default());
    }
    let remote = remote_of(pid)?;
    let mut done = TakenAway::default();
    for epfd in epoll_fds(pid) {
        let text =
            std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{epfd}")).unwrap_or_default();
        for tfd in registered_fds(&text).into_iter().filter(|t| listeners.contains(t)) {
            let args = [epfd as u64, libc::EPOLL_CTL_DEL as u64, tfd as u64, 0];
            match remote.call(pid, "epoll_ctl(EPOLL_CTL_DEL)", libc::SYS_epoll_ctl, &args) {
                Ok(_) => done.unregistered += 1,
                // Registered through another process's fd of that number.
                Err(EngineError::Remote { errno: libc::ENOENT, .. }) => {}
                Err(e) => return Err(e),
            }
        }
    }
    for fd in listeners {
        remote.call(pid, "close", libc::SYS_close, &[fd as u64])?;
        done.closed += 1;
    }
    Ok(done)
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
