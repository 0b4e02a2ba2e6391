//! Unix sockets whose peer was closed (`UnixDeadPeer`, format 4.4): each
//! is connected again to a stand-in for the closed peer, made as the
//! peer was (the other end of a socketpair, the accepted end of a
//! connection, the client that connected, a datagram socket bound to the
//! peer's name); the stand-in sends the socket's queue and is closed.
//! The kernel then does to the socket what the first close did: shuts a
//! stream or seqpacket socket down both ways, and keeps the closed
//! stand-in as its peer, so getpeername names it. ECONNRESET pending in
//! SO_ERROR comes back the way it came: the socket sends the stand-in a
//! byte it never reads.

use super::unix::{bind_name, chdir_for, connect_through_name, pair, send_all, TempPath};
use super::Builder;
use crate::error::{EngineError, Result};
use crate::unix_remake::show;
use ferry_image::{FileKind, ProcessImage, TreeImage, UnixDeadPeer, UnixSocket};
use std::os::fd::{AsRawFd, OwnedFd};

/// Makes every socket of the tree whose peer was closed, before any other
/// file (the tree's own listener must not hold its name yet); each waits
/// in `unix_pending` for `unix::create`. A path is resolved in the
/// directory of the process holding the socket.
pub(super) fn remake_all(b: &mut Builder, tree: &TreeImage) -> Result<()> {
    let Some(dead) = &tree.unix_dead_peers else {
        return Ok(());
    };
    let back = std::env::current_dir().ok();
    let result = (|| {
        for d in &dead.sockets {
            let found = tree.processes.iter().find_map(|p| {
                p.files.iter().find_map(|f| match &f.kind {
                    FileKind::UnixSocket(u) if u.ino == d.ino => Some((p, u)),
                    _ => None,
                })
            });
            let Some((p, s)) = found else {
                return Err(EngineError::restore(
                    b.pid,
                    format!("unix socket {} of the dead peers section is not in the tree", d.ino),
                ));
            };
            remake(b, p, s, d)?;
        }
        Ok(())
    })();
    if let Some(dir) = back {
        let _ = std::env::set_current_dir(dir);
    }
    result
}

/// Makes the socket `s` of process `p` with its closed peer `d`.
fn remake(b: &mut Builder, p: &ProcessImage, s: &UnixSocket, d: &UnixDeadPeer) -> Result<()> {
    let standin = UnixSocket {
        ino: 0,
        sock_type: s.sock_type,
        name: d.peer_name.clone(),
        listen_backlog: None,
        peer: Some(s.ino),
        queued: vec![],
        passcred: false,
        shutdown: 0,
        in_flight: vec![],
    };
    let (mine, other, temp) = if s.sock_type == libc::SOCK_DGRAM {
        datagram(b, p, s, &d.peer_name)?
    } else if s.name.is_empty() && d.peer_name.is_empty() {
        let (mine, other) = pair(b, p.pid, s.ino, s.sock_type)?;
        (mine, other, None)
    } else if d.client {
        let (mine, other) = connect_through_name(b.inject.as_deref_mut(), p, s, p, &standin)?;
        (mine, other, None)
    } else {
        let (other, mine) = connect_through_name(b.inject.as_deref_mut(), p, &standin, p, s)?;
        (mine, other, None)
    };
    send_all(p.pid, &other, &s.queued, s.sock_type == libc::SOCK_STREAM)?;
    if d.reset {
        ferry_sys::unix::send(
            mine.as_raw_fd(),
            b"r",
            &[],
            None,
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        )
        .map_err(|e| {
            EngineError::kernel(
                p.pid,
                format!("unix socket {}: leaving a byte unread in its closed peer", s.ino),
                e,
            )
        })?;
    }
    drop(other);
    if let Some(t) = temp {
        t.finish()?;
    }
    let mine = b.keep(mine)?;
    b.unix_pending.insert(s.ino, mine);
    Ok(())
}

/// A datagram socket and its stand-in: a socketpair (the process its
/// SO_PEERCRED names makes it) when the closed peer was unnamed or the
/// image records SO_PEERCRED, else two sockets, the first connected to
/// the second by name. Each is bound to its name; the stand-in's path,
/// if it has one, through a temporary rename of what is there, put back
/// once the stand-in is closed.
fn datagram(
    b: &mut Builder,
    p: &ProcessImage,
    s: &UnixSocket,
    peer_name: &[u8],
) -> Result<(OwnedFd, OwnedFd, Option<TempPath>)> {
    let paired =
        peer_name.is_empty() || b.inject.as_deref().is_some_and(|i| i.cred(s.ino).is_some());
    let (mine, other) = if paired {
        pair(b, p.pid, s.ino, s.sock_type)?
    } else {
        let new = || {
            ferry_sys::socket::socket(libc::AF_UNIX, s.sock_type, 0).map_err(|e| {
                EngineError::kernel(p.pid, format!("creating unix socket {}", s.ino), e)
            })
        };
        (new()?, new()?)
    };
    if !s.name.is_empty() {
        chdir_for(p, &s.name)?;
        bind_name(p.pid, &mine, &s.name)?;
    }
    if peer_name.is_empty() {
        return Ok((mine, other, None));
    }
    chdir_for(p, peer_name)?;
    let mut temp = if peer_name[0] != 0 { Some(TempPath::take(p.pid, peer_name)?) } else { None };
    let what =
        || format!("unix socket {}: its closed peer's stand-in at {}", s.ino, show(peer_name));
    ferry_sys::socket::unix_bind(other.as_raw_fd(), peer_name)
        .map_err(|e| EngineError::kernel(p.pid, format!("{}: binding", what()), e))?;
    if let Some(t) = temp.as_mut() {
        t.bound = true;
    }
    if !paired {
        ferry_sys::socket::unix_connect(mine.as_raw_fd(), peer_name)
            .map_err(|e| EngineError::kernel(p.pid, format!("{}: connecting", what()), e))?;
    }
    Ok((mine, other, temp))
}
