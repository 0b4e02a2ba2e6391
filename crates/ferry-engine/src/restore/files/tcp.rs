//! Established TCP connections, rebuilt in repair mode: the socket is
//! bound and "connected" without a handshake, given the sequence numbers,
//! negotiated options, timestamp clock, window and unread data the image
//! recorded. It stays in repair mode (silent) until every process of the
//! tree exists; then [`leave_repair`], the network lock is thawed, and
//! [`resend`] writes the send queue again so the peer gets unacknowledged
//! data at once instead of after a retransmission timeout (it drops what
//! it already has).

use super::inet::{address, apply_option, is_opt};
use crate::error::{EngineError, Result};
use ferry_image::{FileKind, InetSocket, TcpConnection, TreeImage};
use ferry_sys::socket;
use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

const SO_SNDBUFFORCE: i32 = 32;
const SO_RCVBUFFORCE: i32 = 33;
/// How long refilling one queue may wait for room.
const QUEUE_TIMEOUT_MS: i32 = 5_000;
/// The largest MSS TCP_MAXSEG accepts (MAX_TCP_WINDOW).
const MAX_USER_MSS: u32 = 32767;

/// Options set after the connection is live rather than at creation:
/// cork and the not-sent low-water mark would hold back the resent queue,
/// buffer sizes are part of the connection's own state, and leaving
/// repair mode resets SO_REUSEADDR.
fn deferred(o: &ferry_image::SockOpt) -> bool {
    is_opt(o, libc::IPPROTO_TCP, libc::TCP_CORK)
        || is_opt(o, libc::SOL_SOCKET, libc::SO_SNDBUF)
        || is_opt(o, libc::SOL_SOCKET, libc::SO_RCVBUF)
        || is_opt(o, libc::SOL_SOCKET, libc::SO_REUSEADDR)
        || is_opt(o, libc::IPPROTO_TCP, libc::TCP_NOTSENT_LOWAT)
}

pub fn create(pid: i32, s: &InetSocket, c: &TcpConnection) -> Result<OwnedFd> {
    let local = address(pid, &s.addr, s.port)?;
    let (paddr, pport) = s.peer.as_ref().ok_or_else(|| EngineError::restore(pid, format!("TCP connection from {local} has no peer")))?;
    let remote = address(pid, paddr, *pport)?;
    let what = |step: &str| format!("TCP {local} -> {remote}: {step}");
    let k = |step: &'static str| move |e| EngineError::kernel(pid, what(step), e);
    let sock = socket::socket(s.family, s.sock_type, s.protocol).map_err(k("creating the socket"))?;
    let fd = sock.as_raw_fd();
    socket::set_repair(fd, 1).map_err(k("entering repair mode"))?;
    for o in s.options.iter().filter(|o| !deferred(o)) {
        apply_option(pid, fd, o)?;
    }
    // The buffer sizes the connection had, so that its queues fit; the
    // lock bits come back in `finish`, so auto-tuning goes on.
    // The resent queue is all "unsent" at first, and new buffers carry
    // their own overhead: leave it room.
    let sndbuf = (c.sndbuf / 2).max(c.send_queue.len() as i32 + (64 << 10));
    socket::setsockopt_int(fd, libc::SOL_SOCKET, SO_SNDBUFFORCE, sndbuf).map_err(k("setting the send buffer size"))?;
    socket::setsockopt_int(fd, libc::SOL_SOCKET, SO_RCVBUFFORCE, c.rcvbuf / 2).map_err(k("setting the receive buffer size"))?;
    socket::set_repair_queue(fd, socket::TCP_SEND_QUEUE).map_err(k("selecting the send queue"))?;
    socket::set_queue_seq(fd, c.send_seq).map_err(k("setting the send sequence"))?;
    socket::set_repair_queue(fd, socket::TCP_RECV_QUEUE).map_err(k("selecting the receive queue"))?;
    socket::set_queue_seq(fd, c.recv_seq).map_err(k("setting the receive sequence"))?;
    // Repair mode binds through the listener and TIME_WAIT sockets on the
    // same port (the kernel forces address reuse for repaired sockets).
    socket::bind(fd, s.family, &local).map_err(k("binding"))?;
    // Before connect, or the connection starts at the minimal MSS. The
    // option stops at 32767 (loopback's MSS is larger); the full clamp
    // comes with the repair options below.
    socket::setsockopt_int(fd, libc::IPPROTO_TCP, libc::TCP_MAXSEG, c.mss_clamp.min(MAX_USER_MSS) as i32).map_err(k("setting the MSS"))?;
    socket::connect(fd, s.family, &remote).map_err(k("connecting in repair mode"))?;
    let mut opts = vec![(socket::TCPOPT_MAXSEG, c.mss_clamp)];
    if let Some(snd) = c.snd_wscale {
        opts.push((socket::TCPOPT_WINDOW, snd as u32 | (c.rcv_wscale as u32) << 16));
    }
    if c.sack {
        opts.push((socket::TCPOPT_SACK_PERM, 0));
    }
    if c.timestamps {
        opts.push((socket::TCPOPT_TIMESTAMP, 0));
    }
    socket::set_repair_options(fd, &opts).map_err(k("setting the negotiated options"))?;
    if c.timestamps {
        socket::setsockopt_int(fd, libc::IPPROTO_TCP, socket::TCP_TIMESTAMP, c.timestamp as i32).map_err(k("setting the timestamp clock"))?;
    }
    if !c.recv_queue.is_empty() {
        socket::set_repair_queue(fd, socket::TCP_RECV_QUEUE).map_err(k("selecting the receive queue"))?;
        socket::send_all(fd, &c.recv_queue, QUEUE_TIMEOUT_MS).map_err(k("refilling the receive queue"))?;
    }
    socket::set_repair_queue(fd, socket::TCP_NO_QUEUE).map_err(k("leaving the queues"))?;
    set_window(fd, c).map_err(k("restoring the window"))?;
    Ok(sock)
}

/// The kernel refuses a window whose last update lies beyond what it has
/// received, or whose right edge moved back; clamp those two to what the
/// rebuilt connection knows rather than fail.
fn set_window(fd: RawFd, c: &TcpConnection) -> ferry_sys::SysResult<()> {
    let w = c.window;
    let win = socket::RepairWindow { snd_wl1: w.snd_wl1, snd_wnd: w.snd_wnd, max_window: w.max_window.max(w.snd_wnd), rcv_wnd: w.rcv_wnd, rcv_wup: w.rcv_wup };
    match socket::set_repair_window(fd, &win) {
        Err(e) if e.errno == libc::EINVAL => {
            let rcv_nxt = c.recv_seq.wrapping_add(c.recv_queue.len() as u32);
            let before = |a: u32, b: u32| (a.wrapping_sub(b) as i32) < 0;
            let rcv_wup = if before(rcv_nxt, win.rcv_wup) { rcv_nxt } else { win.rcv_wup };
            let snd_wl1 = if before(rcv_nxt.wrapping_add(win.rcv_wnd), win.snd_wl1) { rcv_nxt } else { win.snd_wl1 };
            socket::set_repair_window(fd, &socket::RepairWindow { rcv_wup, snd_wl1, ..win })
        }
        r => r,
    }
}

/// Every established connection of the image with ferry's descriptor of
/// its rebuilt socket, each once.
fn connections<'a>(tree: &'a TreeImage, staged: &HashMap<u64, OwnedFd>) -> Vec<(i32, &'a InetSocket, &'a TcpConnection, RawFd)> {
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    for p in &tree.processes {
        for f in &p.files {
            let FileKind::InetSocket(s) = &f.kind else { continue };
            let Some(c) = &s.connection else { continue };
            let Some(fd) = staged.get(&f.id) else { continue };
            if seen.insert(f.id) {
                out.push((p.pid, s, c, fd.as_raw_fd()));
            }
        }
    }
    out
}

/// The rebuilt connections of the tree, ready to come alive.
pub struct Rebuilt<'a> {
    conns: Vec<(i32, &'a InetSocket, &'a TcpConnection, RawFd)>,
}

/// Leaves repair mode on every rebuilt connection. Still silent: the
/// network lock holds their packets until it is thawed.
pub fn leave_repair<'a>(tree: &'a TreeImage, staged: &HashMap<u64, OwnedFd>) -> Result<Rebuilt<'a>> {
    let conns = connections(tree, staged);
    for (pid, s, _, fd) in &conns {
        // No window probe now: the lock would drop it; the queued data
        // written by `resend` makes the peer answer anyway.
        socket::set_repair(*fd, socket::TCP_REPAIR_OFF_NO_WP)
            .map_err(|e| EngineError::kernel(*pid, format!("TCP port {}: leaving repair mode", s.port), e))?;
    }
    Ok(Rebuilt { conns })
}

/// After the thaw: writes the send queues again (the peer drops what it
/// already had), then applies what had to wait (buffer lock bits, cork,
/// not-sent low-water mark, SO_REUSEADDR).
pub fn resend(rebuilt: &Rebuilt) -> Result<()> {
    for (pid, s, c, fd) in &rebuilt.conns {
        let k = |step: &'static str| move |e| EngineError::kernel(*pid, format!("TCP port {}: {step}", s.port), e);
        socket::send_all(*fd, &c.send_queue, QUEUE_TIMEOUT_MS).map_err(k("writing the send queue"))?;
        socket::setsockopt_int(*fd, libc::SOL_SOCKET, socket::SO_BUF_LOCK, c.buf_lock).map_err(k("restoring SO_BUF_LOCK"))?;
        for o in s.options.iter().filter(|o| deferred(o)) {
            if is_opt(o, libc::SOL_SOCKET, libc::SO_SNDBUF) || is_opt(o, libc::SOL_SOCKET, libc::SO_RCVBUF) {
                // The size itself came back with the connection; the
                // application's lock came back with SO_BUF_LOCK.
                continue;
            }
            apply_option(*pid, *fd, o)?;
        }
    }
    Ok(())
}
