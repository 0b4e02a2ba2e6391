//! Unix sockets whose peer is in the same process (socketpair, or both
//! ends of a local connection), and bound or listening ones, with the
//! messages waiting in their receive queues. A peer in another process is
//! refused by name.

use super::FdInfo;
use crate::error::{EngineError, Result};
use ferry_image::{FileKind, UnixSocket};
use ferry_sys::sockdiag::UnixDiag;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::MetadataExt;

const TCP_LISTEN: u8 = 10;
const TCP_ESTABLISHED: u8 = 1;

/// getpeername of a unix socket: the name of what it connected to.
fn peer_name_of(fd: RawFd) -> Vec<u8> {
    // SAFETY: sockaddr_un is plain data.
    let mut sun: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
    // SAFETY: sun/len describe a writable sockaddr_un.
    if unsafe { libc::getpeername(fd, &mut sun as *mut _ as *mut libc::sockaddr, &mut len) } != 0 {
        return Vec::new();
    }
    let n = (len as usize).saturating_sub(2).min(sun.sun_path.len());
    let mut name: Vec<u8> = sun.sun_path[..n].iter().map(|&c| c as u8).collect();
    if name.first() != Some(&0) {
        while name.last() == Some(&0) {
            name.pop();
        }
    }
    name
}

fn name_of(fd: RawFd) -> Vec<u8> {
    // SAFETY: sockaddr_un is plain data.
    let mut sun: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
    // SAFETY: sun/len describe a writable sockaddr_un.
    if unsafe { libc::getsockname(fd, &mut sun as *mut _ as *mut libc::sockaddr, &mut len) } != 0 {
        return Vec::new();
    }
    let n = (len as usize).saturating_sub(2).min(sun.sun_path.len());
    let mut name: Vec<u8> = sun.sun_path[..n].iter().map(|&c| c as u8).collect();
    if name.first() != Some(&0) {
        while name.last() == Some(&0) {
            name.pop();
        }
    }
    name
}

/// Reads every queued message without consuming it: SO_PEEK_OFF moves the
/// peek position past each one.
fn peek_queue(info: &FdInfo, fd: RawFd, stream: bool) -> Result<Vec<Vec<u8>>> {
    let set_peek = |v: i32| {
        // SAFETY: an int option.
        unsafe { libc::setsockopt(fd, libc::SOL_SOCKET, libc::SO_PEEK_OFF, &v as *const i32 as *const libc::c_void, 4) }
    };
    // Put back whatever peek offset the process itself had set.
    let mut saved: i32 = -1;
    let mut slen = 4 as libc::socklen_t;
    // SAFETY: an int option into a live int.
    unsafe { libc::getsockopt(fd, libc::SOL_SOCKET, libc::SO_PEEK_OFF, &mut saved as *mut i32 as *mut libc::c_void, &mut slen) };
    if set_peek(0) != 0 {
        return Err(info.unsupported("cannot peek at its queued data (SO_PEEK_OFF)"));
    }
    let mut out: Vec<Vec<u8>> = Vec::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut ctrl = [0u8; 256];
    let result = loop {
        let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
        // SAFETY: msghdr is plain data; pointers below stay valid for the call.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = ctrl.as_mut_ptr().cast();
        msg.msg_controllen = ctrl.len();
        // SAFETY: msg points at live buffers.
        let n = unsafe { libc::recvmsg(fd, &mut msg, libc::MSG_PEEK | libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC) };
        if n < 0 {
            break Ok(());
        }
        if msg.msg_controllen > 0 {
            // Descriptors in flight were just installed into ferry; close them.
            // SAFETY: walking the control buffer the kernel filled.
            unsafe {
                let mut c = libc::CMSG_FIRSTHDR(&msg);
                while !c.is_null() {
                    if (*c).cmsg_type == libc::SCM_RIGHTS {
                        let data = libc::CMSG_DATA(c) as *const i32;
                        let count = ((*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize) / 4;
                        for i in 0..count {
                            libc::close(*data.add(i));
                        }
                    }
                    c = libc::CMSG_NXTHDR(&msg, c);
                }
            }
            break Err(info.unsupported("its queue holds file descriptors or credentials in flight"));
        }
        if n == 0 && stream {
            break Ok(());
        }
        let data = buf[..n as usize].to_vec();
        match (stream, out.last_mut()) {
            (true, Some(last)) => last.extend_from_slice(&data),
            _ => out.push(data),
        }
        if out.len() > 100_000 {
            break Err(info.unsupported("too many queued messages"));
        }
    };
    set_peek(saved);
    result.map(|_| out)
}

/// The sock_diag unix tables read while capturing one process, by
/// network namespace: one dump serves all its sockets. A socket is looked
/// up in its own namespace, as the tree may live in another than ferry's.
/// Shared by the threads that capture one process's descriptors.
#[derive(Default)]
pub struct UnixTables(
    std::sync::Mutex<std::collections::HashMap<u64, std::sync::Arc<Vec<UnixDiag>>>>,
    std::sync::Mutex<Vec<(u64, u64, u32)>>,
    std::sync::Mutex<Vec<u64>>,
);

fn locked<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl UnixTables {
    /// (client inode, listener inode, queue position) of every socket
    /// found waiting in a listener's accept queue.
    pub fn take_pending(&self) -> Vec<(u64, u64, u32)> {
        std::mem::take(&mut *locked(&self.1))
    }
    /// Inodes of the listeners found with one connection waiting.
    pub fn take_listeners_with_pending(&self) -> Vec<u64> {
        std::mem::take(&mut *locked(&self.2))
    }

    fn of(&self, pid: i32, sock: &OwnedFd) -> Result<std::sync::Arc<Vec<UnixDiag>>> {
        let err = |e| EngineError::kernel(pid, "listing unix sockets (sock_diag)", e);
        let ns = ferry_sys::sockdiag::socket_netns(sock.as_fd()).map_err(err)?;
        let ino = ferry_sys::sockdiag::inode_of(ns.as_fd()).map_err(err)?;
        // Held while dumping, so two threads never dump the same table.
        let mut tables = locked(&self.0);
        if let Some(t) = tables.get(&ino) {
            return Ok(t.clone());
        }
        let table = std::sync::Arc::new(ferry_sys::sockdiag::unix_sockets_in(ns.as_fd()).map_err(err)?);
        tables.insert(ino, table.clone());
        Ok(table)
    }
}

pub fn capture(info: &FdInfo, sock_type: i32) -> Result<FileKind> {
    let ino = info.meta.ino();
    let sock = info.dup()?;
    let table = info.unix_tables.of(info.pid, &sock)?;
    let me: UnixDiag = table
        .iter()
        .find(|d| d.ino as u64 == ino)
        .cloned()
        .ok_or_else(|| info.unsupported("unix socket not found in its network namespace's socket table"))?;
    let fd = sock.as_raw_fd();
    let name = name_of(fd);
    let mut listen_backlog = None;
    if me.state == TCP_LISTEN {
        if me.rqueue > 1 {
            // The kernel shows no order for them (their sockets have no
            // inode before accept), and accept order is state.
            return Err(info.unsupported(format!("{} connections wait in its accept queue; their order cannot be read (one is restored)", me.rqueue)));
        }
        if me.rqueue == 1 {
            if name.is_empty() {
                return Err(info.unsupported("a connection waits in the accept queue of this unnamed listener"));
            }
            // Checked against the tree's pending clients in `check_tree`.
            locked(&info.unix_tables.2).push(ino);
        }
        listen_backlog = Some(me.wqueue as i32);
    }
    let peer = (me.peer != 0).then_some(me.peer as u64);
    // A connected stream socket whose peer was closed: the kernel shuts it
    // down and its peer has no inode any more. Restoring it unconnected
    // would turn EOF and EPIPE into ENOTCONN.
    if me.state == TCP_ESTABLISHED && me.peer == 0 && me.shutdown == 3 && sock_type != libc::SOCK_DGRAM {
        return Err(info.unsupported("its peer was closed (reads give EOF, writes EPIPE); such a connection is not restored yet"));
    }
    // A connected stream socket whose peer has no inode and which is not
    // shut down (a dead peer shuts it down) waits in a listener's accept
    // queue: its peer is the embryo socket accept() will return.
    if me.state == TCP_ESTABLISHED && me.peer == 0 && me.shutdown == 0 && sock_type != libc::SOCK_DGRAM {
        let pname = peer_name_of(fd);
        // sock_diag gives a path name with its terminating NUL.
        let norm = |n: &[u8]| -> Vec<u8> {
            let mut n = n.to_vec();
            if n.first() != Some(&0) {
                while n.last() == Some(&0) {
                    n.pop();
                }
            }
            n
        };
        let listener = table.iter().find(|l| l.state == TCP_LISTEN && !pname.is_empty() && norm(&l.name) == pname);
        let lname = String::from_utf8_lossy(&pname).replace('\0', "@");
        let Some(listener) = listener else {
            return Err(info.unsupported(format!("connected to {lname}, whose socket cannot be found")));
        };
        if super::holders_in_tree(info.tree, &format!("socket:[{}]", listener.ino)) == 0 {
            return Err(info.unsupported(format!("waits in the accept queue of {lname}, a unix listener outside the process tree")));
        }
        if me.wqueue > 0 || me.rqueue > 0 {
            return Err(info.unsupported(format!(
                "waits in the accept queue of {lname} and data was sent before accept ({} bytes of send buffer, {} queued to read); data in flight to a connection not yet accepted is not restored",
                me.wqueue, me.rqueue
            )));
        }
        locked(&info.unix_tables.1).push((ino, listener.ino as u64, 0));
    }
    if let Some(p) = peer {
        let in_tree = super::holders_in_tree(info.tree, &format!("socket:[{p}]")) > 0;
        let peer_d = table.iter().find(|d| d.ino as u64 == p);
        if !in_tree {
            let pname = peer_d.map(|d| String::from_utf8_lossy(&d.name).replace('\0', "@")).unwrap_or_default();
            return Err(info.unsupported(format!("connected to a unix socket outside the process tree ({pname}); external unix peers are not supported yet")));
        }
        if peer_d.map(|d| d.peer as u64) != Some(ino) {
            return Err(info.unsupported("one-way connected unix datagram socket"));
        }
    }
    let queued = if me.rqueue > 0 && listen_backlog.is_none() { peek_queue(info, fd, sock_type == libc::SOCK_STREAM)? } else { Vec::new() };
    let mut passcred: i32 = 0;
    let mut len = 4 as libc::socklen_t;
    // SAFETY: an int option into a live int.
    unsafe { libc::getsockopt(fd, libc::SOL_SOCKET, libc::SO_PASSCRED, &mut passcred as *mut i32 as *mut libc::c_void, &mut len) };
    Ok(FileKind::UnixSocket(UnixSocket { ino, sock_type, name, listen_backlog, peer, queued, passcred: passcred != 0, shutdown: me.shutdown }))
}

/// Both ends of every connected pair must be restorable: the peer must be
/// one of the tree's sockets.
pub fn check_tree(all: &[(i32, &ferry_image::OpenFile, i32)]) -> Result<()> {
    for &(pid, f, fd) in all {
        let FileKind::UnixSocket(u) = &f.kind else { continue };
        let Some(peer) = u.peer else { continue };
        if !all.iter().any(|(_, g, _)| matches!(&g.kind, FileKind::UnixSocket(v) if v.ino == peer)) {
            return Err(EngineError::unsupported(pid, format!("fd {fd} (socket:[{}])", u.ino), "its peer is not an fd of any process of the tree"));
        }
    }
    Ok(())
}
