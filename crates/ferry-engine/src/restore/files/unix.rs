//! Unix sockets: a connected pair is remade with socketpair(2) and each
//! end's queued messages are sent again from the other end; a bound
//! socket is bound to its name again (a stale socket file left by the old
//! process is removed first) and listens if it did.

use super::Builder;
use crate::error::{EngineError, Result};
use ferry_image::{FileKind, TreeImage, UnixSocket};
use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::FileTypeExt;

fn dup(pid: i32, fd: &OwnedFd) -> Result<OwnedFd> {
    fd.try_clone().map_err(|e| EngineError::io(format!("duplicating a unix socket (pid {pid})"), e))
}

fn send_all(pid: i32, from: &OwnedFd, msgs: &[Vec<u8>], stream: bool) -> Result<()> {
    for m in msgs {
        let mut off = 0;
        loop {
            let n = ferry_sys::unix::send(from.as_raw_fd(), &m[off..], &[], None, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL)
                .map_err(|e| EngineError::kernel(pid, format!("refilling a unix socket queue ({} bytes)", m.len()), e))?;
            off += n;
            if !stream || off >= m.len() {
                break;
            }
        }
    }
    Ok(())
}

fn bind_name(pid: i32, fd: &OwnedFd, name: &[u8]) -> Result<()> {
    if name.len() >= ferry_sys::socket::UNIX_PATH_MAX {
        return Err(EngineError::restore(pid, "unix socket name too long"));
    }
    if name.first() != Some(&0) {
        let path = String::from_utf8_lossy(name).into_owned();
        if std::fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_socket()) {
            let _ = std::fs::remove_file(&path);
        }
    }
    ferry_sys::socket::unix_bind(fd.as_raw_fd(), name).map_err(|e| EngineError::kernel(pid, format!("binding unix socket to {:?}", String::from_utf8_lossy(name)), e))
}

pub fn create(b: &mut Builder, s: &UnixSocket) -> Result<OwnedFd> {
    let pid = b.pid;
    let stream = s.sock_type == libc::SOCK_STREAM;
    let sock = if let Some(peer) = s.peer {
        if let Some(mine) = b.unix_pending.remove(&s.ino) {
            mine
        } else {
            let (mine, theirs) =
                ferry_sys::socket::socketpair(libc::AF_UNIX, s.sock_type).map_err(|e| EngineError::kernel(pid, "creating a unix socket pair", e))?;
            let mine = b.keep(mine)?;
            let theirs = b.keep(theirs)?;
            b.unix_peers.insert(peer, b.keep(dup(pid, &theirs)?)?);
            b.unix_peers.insert(s.ino, b.keep(dup(pid, &mine)?)?);
            b.unix_pending.insert(peer, theirs);
            mine
        }
    } else {
        let sock = ferry_sys::socket::socket(libc::AF_UNIX, s.sock_type, 0).map_err(|e| EngineError::kernel(pid, "creating a unix socket", e))?;
        if !s.name.is_empty() {
            bind_name(pid, &sock, &s.name)?;
        }
        if let Some(backlog) = s.listen_backlog {
            ferry_sys::socket::listen(sock.as_raw_fd(), backlog).map_err(|e| EngineError::kernel(pid, "listening on a unix socket", e))?;
        }
        sock
    };
    if s.passcred {
        let _ = ferry_sys::socket::setsockopt_int(sock.as_raw_fd(), libc::SOL_SOCKET, libc::SO_PASSCRED, 1);
    }
    // A queue with descriptors or credentials in flight is sent once
    // every process exists (`send_in_flight`).
    if !s.queued.is_empty() && s.in_flight.is_empty() {
        let peer = s.peer.and_then(|p| b.unix_peers.get(&p)).ok_or_else(|| EngineError::restore(pid, "queued data on an unconnected unix socket"))?;
        send_all(pid, peer, &s.queued, stream)?;
    }
    Ok(sock)
}

/// Sockets that waited in a listener's accept queue connect to it again,
/// queue position by queue position, once every socket of the tree is
/// made (`Fidelity::unix_connects`). A path name is resolved in the
/// listener's process's directory.
pub fn connect_pending(tree: &ferry_image::TreeImage, staged: &std::collections::HashMap<u64, OwnedFd>) -> Result<()> {
    use ferry_image::FileKind;
    let mut all: Vec<(u64, u32, i32, u64)> = Vec::new();
    for p in &tree.processes {
        for c in &p.fidelity.unix_connects {
            let f = p.files.get(c.file as usize).ok_or_else(|| EngineError::restore(p.pid, "pending unix connection of a missing file"))?;
            all.push((c.listener, c.position, p.pid, f.id));
        }
    }
    all.sort_unstable();
    for (listener, _, pid, id) in all {
        let (lp, name) = tree
            .processes
            .iter()
            .find_map(|p| p.files.iter().find_map(|f| match &f.kind {
                FileKind::UnixSocket(u) if u.ino == listener => Some((p, u.name.clone())),
                _ => None,
            }))
            .ok_or_else(|| EngineError::restore(pid, format!("the listener socket:[{listener}] a pending connection waits on is not in the image")))?;
        let sock = staged.get(&id).ok_or_else(|| EngineError::restore(pid, "pending unix connection was not staged"))?;
        if name.is_empty() {
            return Err(EngineError::restore(pid, "pending unix connection to a listener without a usable name"));
        }
        let back = std::env::current_dir().ok();
        if name[0] != 0 {
            std::env::set_current_dir(&lp.cwd).map_err(|e| EngineError::io(format!("pid {}: changing directory to {}", lp.pid, lp.cwd), e))?;
        }
        let err = ferry_sys::socket::unix_connect(sock.as_raw_fd(), &name).err().map(|e| {
            EngineError::kernel(pid, format!("connecting again to unix listener {:?} (pending connection)", String::from_utf8_lossy(&name).replace('\0', "@")), e)
        });
        if let Some(dir) = back {
            let _ = std::env::set_current_dir(dir);
        }
        if let Some(e) = err {
            return Err(e);
        }
    }
    Ok(())
}

/// Whether the unix socket `u` or its peer has a queue that
/// `send_in_flight` sends (its shutdown waits until then).
pub fn deferred(tree: &ferry_image::TreeImage, u: &UnixSocket) -> bool {
    use ferry_image::FileKind;
    !u.in_flight.is_empty()
        || u.peer.is_some_and(|peer| {
            tree.processes.iter().flat_map(|p| &p.files).any(|f| matches!(&f.kind, FileKind::UnixSocket(v) if v.ino == peer && !v.in_flight.is_empty()))
        })
}

/// Queues holding descriptors (SCM_RIGHTS) or credentials
/// (SCM_CREDENTIALS) in flight are sent again now that every process of
/// the tree exists (credentials name a live process) and every file is
/// staged (descriptors are ferry's staged ones): message by message from
/// the peer, in order, with their ancillary data; then the shutdowns of
/// those sockets.
pub fn send_in_flight(tree: &ferry_image::TreeImage, staged: &std::collections::HashMap<u64, OwnedFd>) -> Result<()> {
    use ferry_image::FileKind;
    let mut done = std::collections::HashSet::new();
    let file_of = |pid: i32, fd: i32| -> Option<u64> {
        let p = tree.processes.iter().find(|p| p.pid == pid)?;
        let slot = p.fds.iter().find(|s| s.fd == fd)?;
        p.files.get(slot.file as usize).map(|f| f.id)
    };
    let id_of_ino = |ino: u64| tree.processes.iter().flat_map(|p| &p.files).find(|f| matches!(&f.kind, FileKind::UnixSocket(v) if v.ino == ino)).map(|f| f.id);
    for p in &tree.processes {
        for f in &p.files {
            let FileKind::UnixSocket(u) = &f.kind else { continue };
            if u.in_flight.is_empty() || !done.insert(f.id) {
                continue;
            }
            let pid = p.pid;
            let from = u
                .peer
                .and_then(id_of_ino)
                .and_then(|id| staged.get(&id))
                .ok_or_else(|| EngineError::restore(pid, format!("unix socket {}: its peer was not staged to send its queue", u.ino)))?;
            for (i, m) in u.queued.iter().enumerate() {
                let anc = u.in_flight.iter().find(|a| a.message as usize == i);
                let mut fds = Vec::new();
                for d in anc.map(|a| a.fds.as_slice()).unwrap_or_default() {
                    let fd = file_of(d.pid, d.fd).and_then(|id| staged.get(&id)).ok_or_else(|| {
                        EngineError::restore(pid, format!("unix socket {}: the descriptor in flight (fd {} of pid {}) was not staged", u.ino, d.fd, d.pid))
                    })?;
                    fds.push(fd.as_raw_fd());
                }
                let creds = anc.and_then(|a| a.creds).map(|c| ferry_sys::unix::Creds { pid: c.pid, uid: c.uid, gid: c.gid });
                let what = || format!("unix socket {}: sending queued message {i} ({} bytes, {} fds, credentials {:?})", u.ino, m.len(), fds.len(), creds);
                let mut off = ferry_sys::unix::send(from.as_raw_fd(), m, &fds, creds, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL)
                    .map_err(|e| EngineError::kernel(pid, what(), e))?;
                // The rest of a long stream message goes without descriptors, as the kernel sent it.
                while off < m.len() && u.sock_type == libc::SOCK_STREAM {
                    off += ferry_sys::unix::send(from.as_raw_fd(), &m[off..], &[], creds, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL)
                        .map_err(|e| EngineError::kernel(pid, what(), e))?;
                }
            }
        }
    }
    shut_down(tree, staged, true)
}

/// Shuts down the unix sockets whose image says so: those whose queues
/// are sent after the fork (`deferred`), or all the others. Shutdowns come
/// last because queued data has to go through both ends first.
pub fn shut_down(tree: &TreeImage, staged: &HashMap<u64, OwnedFd>, deferred_ones: bool) -> Result<()> {
    for p in &tree.processes {
        for f in &p.files {
            let FileKind::UnixSocket(u) = &f.kind else { continue };
            if deferred(tree, u) != deferred_ones {
                continue;
            }
            let how = match u.shutdown & 3 {
                1 => libc::SHUT_RD,
                2 => libc::SHUT_WR,
                3 => libc::SHUT_RDWR,
                _ => continue,
            };
            let Some(fd) = staged.get(&f.id) else { continue };
            ferry_sys::socket::shutdown(fd.as_raw_fd(), how).map_err(|e| EngineError::kernel(p.pid, format!("shutting down unix socket {}", u.ino), e))?;
        }
    }
    Ok(())
}
