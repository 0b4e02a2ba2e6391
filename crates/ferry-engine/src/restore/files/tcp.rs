//! Established TCP connections, rebuilt in repair mode: the socket is
//! bound and "connected" without a handshake, given the sequence numbers,
//! negotiated options, timestamp clock, window and unread data the image
//! recorded. It stays in repair mode (silent) until every process of the
//! tree exists; then [`leave_repair`], the network lock is thawed, and
//! [`resend`] writes the rest of the send queue again so the peer gets
//! the most recently sent data at once instead of after a retransmission
//! timeout (it drops what it already has).
//!
//! Only the tail of what had been sent is sent again as new data: the
//! peer may have received (and acknowledged, to a lock that dropped the
//! ACK) everything up to what the old socket sent, and the kernel drops
//! an ACK beyond what the rebuilt socket has sent together with any data
//! it carries. So the older part of the sent data goes back in repair
//! mode as already sent (the rebuilt socket's send sequence then covers
//! every ACK the peer can send), and only as much as the socket's first
//! flight carries is sent again.

use super::inet::{address, apply_option, is_opt};
use crate::error::{EngineError, Result};
use crate::inject::Call;
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
pub(crate) fn deferred(o: &ferry_image::SockOpt) -> bool {
    is_opt(o, libc::IPPROTO_TCP, libc::TCP_CORK)
        || is_opt(o, libc::SOL_SOCKET, libc::SO_SNDBUF)
        || is_opt(o, libc::SOL_SOCKET, libc::SO_RCVBUF)
        || is_opt(o, libc::SOL_SOCKET, libc::SO_REUSEADDR)
        || is_opt(o, libc::IPPROTO_TCP, libc::TCP_NOTSENT_LOWAT)
}

pub fn create(pid: i32, s: &InetSocket, c: &TcpConnection) -> Result<OwnedFd> {
    create_counting_sent(pid, s, c, 0).map(|(fd, _)| fd)
}

/// [`create`], also returning how many bytes of the send queue went back
/// as already sent: [`resend`] writes the rest. `type_flags` go to
/// socket(2) with the type (SOCK_NONBLOCK: the file's status flag made
/// with the socket, not by one more call per connection). Nothing of the
/// rebuild blocks on the socket: connect in repair mode completes at
/// once, and the queues are written with MSG_DONTWAIT.
fn create_counting_sent(
    pid: i32,
    s: &InetSocket,
    c: &TcpConnection,
    type_flags: i32,
) -> Result<(OwnedFd, usize)> {
    let local = address(pid, &s.addr, s.port)?;
    let (paddr, pport) = s.peer.as_ref().ok_or_else(|| {
        EngineError::restore(pid, format!("TCP connection from {local} has no peer"))
    })?;
    let remote = address(pid, paddr, *pport)?;
    let sock = socket::socket(s.family, s.sock_type | type_flags, s.protocol).map_err(|e| {
        EngineError::kernel(pid, format!("TCP {local} -> {remote}: creating the socket"), e)
    })?;
    let r = Rebuilding { pid, fd: sock.as_raw_fd(), local, remote };
    let fd = r.fd;
    socket::set_repair(fd, 1).map_err(r.k("entering repair mode"))?;
    for o in s.options.iter().filter(|o| !deferred(o)) {
        apply_option(pid, fd, o)?;
    }
    r.set_buffers_and_sequences(c)?;
    // Repair mode binds through the listener and TIME_WAIT sockets on the
    // same port (the kernel forces address reuse for repaired sockets).
    socket::bind(fd, s.family, &local).map_err(r.k("binding"))?;
    // Before connect, or the connection starts at the minimal MSS. The
    // option stops at 32767 (loopback's MSS is larger); the full clamp
    // comes with the repair options below.
    socket::setsockopt_int(
        fd,
        libc::IPPROTO_TCP,
        libc::TCP_MAXSEG,
        c.mss_clamp.min(MAX_USER_MSS) as i32,
    )
    .map_err(r.k("setting the MSS"))?;
    socket::connect(fd, s.family, &remote).map_err(r.k("connecting in repair mode"))?;
    r.set_negotiated(c)?;
    let sent_back = r.refill_queues(c)?;
    set_window(fd, c).map_err(r.k("restoring the window"))?;
    Ok((sock, sent_back))
}

/// A connection's socket being rebuilt in repair mode, for its errors.
struct Rebuilding {
    pid: i32,
    fd: RawFd,
    local: std::net::SocketAddr,
    remote: std::net::SocketAddr,
}

impl Rebuilding {
    /// The error of the kernel refusing `step`, naming the connection.
    fn k(&self, step: &'static str) -> impl FnOnce(ferry_sys::SysError) -> EngineError + '_ {
        move |e| {
            EngineError::kernel(
                self.pid,
                format!("TCP {} -> {}: {step}", self.local, self.remote),
                e,
            )
        }
    }

    /// The buffer sizes the connection had, so that its queues fit; the
    /// lock bits come back in `finish`, so auto-tuning goes on. Then the
    /// sequence numbers of both queues.
    fn set_buffers_and_sequences(&self, c: &TcpConnection) -> Result<()> {
        let fd = self.fd;
        // The resent queue is all "unsent" at first, and new buffers carry
        // their own overhead: leave it room.
        let sndbuf = (c.sndbuf / 2).max(c.send_queue.len() as i32 + (64 << 10));
        socket::setsockopt_int(fd, libc::SOL_SOCKET, SO_SNDBUFFORCE, sndbuf)
            .map_err(self.k("setting the send buffer size"))?;
        socket::setsockopt_int(fd, libc::SOL_SOCKET, SO_RCVBUFFORCE, c.rcvbuf / 2)
            .map_err(self.k("setting the receive buffer size"))?;
        socket::set_repair_queue(fd, socket::TCP_SEND_QUEUE)
            .map_err(self.k("selecting the send queue"))?;
        socket::set_queue_seq(fd, c.send_seq).map_err(self.k("setting the send sequence"))?;
        socket::set_repair_queue(fd, socket::TCP_RECV_QUEUE)
            .map_err(self.k("selecting the receive queue"))?;
        socket::set_queue_seq(fd, c.recv_seq).map_err(self.k("setting the receive sequence"))?;
        Ok(())
    }

    /// The options negotiated at the handshake, and the timestamp clock.
    fn set_negotiated(&self, c: &TcpConnection) -> Result<()> {
        let fd = self.fd;
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
        socket::set_repair_options(fd, &opts).map_err(self.k("setting the negotiated options"))?;
        if c.timestamps {
            socket::setsockopt_int(
                fd,
                libc::IPPROTO_TCP,
                socket::TCP_TIMESTAMP,
                c.timestamp as i32,
            )
            .map_err(self.k("setting the timestamp clock"))?;
        }
        Ok(())
    }

    /// The unread data, and the part of the sent data that goes back as
    /// already sent (`already_sent_head`). The receive queue is still the
    /// one selected (`set_buffers_and_sequences`); the queue left selected
    /// at the end matters to nothing: only repair mode reads it, and
    /// `resend_one` selects its own.
    fn refill_queues(&self, c: &TcpConnection) -> Result<usize> {
        let fd = self.fd;
        if !c.recv_queue.is_empty() {
            socket::send_all(fd, &c.recv_queue, QUEUE_TIMEOUT_MS)
                .map_err(self.k("refilling the receive queue"))?;
        }
        let head = already_sent_head(fd, c).map_err(self.k("reading the congestion window"))?;
        if head > 0 {
            socket::set_repair_queue(fd, socket::TCP_SEND_QUEUE)
                .map_err(self.k("selecting the send queue"))?;
            socket::send_all(fd, &c.send_queue[..head], QUEUE_TIMEOUT_MS)
                .map_err(self.k("putting back data already sent"))?;
        }
        Ok(head)
    }
}

/// How much of the send queue goes back in repair mode as already sent.
///
/// The rebuilt socket must never count less as sent than the peer may
/// acknowledge: an ACK beyond its send sequence is dropped (with the
/// data it carries), and when nothing moves that sequence on, the
/// connection stalls for good. So what the old socket had sent is sent
/// again as new data after the thaw only if the kernel sends all of it at
/// once: within one congestion window of full segments and within the
/// peer's window as last seen. Otherwise all of it goes back as already
/// sent, and what the peer lacks is retransmitted by the kernel's timers
/// (seen with a slow reader's 8 KiB window: the second half of a flight
/// could not be sent, the peer acknowledged it, and both sides dropped
/// each other's segments from then on).
fn already_sent_head(fd: RawFd, c: &TcpConnection) -> ferry_sys::SysResult<usize> {
    let sent = c.send_queue.len().saturating_sub(c.unsent as usize);
    if sent == 0 {
        return Ok(0);
    }
    let ti = socket::tcp_info(fd)?;
    let flight = Flight {
        cwnd: (ti.tcpi_snd_cwnd as usize).max(1),
        mss: (ti.tcpi_snd_mss as usize).max(536),
        peer_window: c.window.snd_wnd as usize,
    };
    Ok(head_to_put_back(sent, c.send_queue.len(), flight))
}

/// What the rebuilt socket may send at once.
#[derive(Clone, Copy)]
struct Flight {
    cwnd: usize,
    mss: usize,
    peer_window: usize,
}

/// [`already_sent_head`]'s rule for `sent` bytes of a `queued` byte send
/// queue. The kernel sends whole segments, each only if it fits the
/// peer's window: the sent bytes go out again at once only if the
/// segments that cover them (the last one full when more data follows)
/// fit the congestion window and the peer's window. A window whose edge
/// falls inside a segment (8,192 bytes with a 1,448-byte MSS, all of it
/// sent) held that segment back for good: the peer acknowledged bytes
/// the rebuilt socket never sent again, and the connection stalled.
fn head_to_put_back(sent: usize, queued: usize, f: Flight) -> usize {
    let segments = sent.div_ceil(f.mss);
    let covered = (segments * f.mss).min(queued);
    if segments <= f.cwnd && covered <= f.peer_window {
        0
    } else {
        sent
    }
}

/// The kernel refuses a window whose last update lies beyond what it has
/// received, or whose right edge moved back; clamp those two to what the
/// rebuilt connection knows rather than fail.
fn set_window(fd: RawFd, c: &TcpConnection) -> ferry_sys::SysResult<()> {
    let w = c.window;
    let win = socket::RepairWindow {
        snd_wl1: w.snd_wl1,
        snd_wnd: w.snd_wnd,
        max_window: w.max_window.max(w.snd_wnd),
        rcv_wnd: w.rcv_wnd,
        rcv_wup: w.rcv_wup,
    };
    match socket::set_repair_window(fd, &win) {
        Err(e) if e.errno == libc::EINVAL => {
            let rcv_nxt = c.recv_seq.wrapping_add(c.recv_queue.len() as u32);
            let before = |a: u32, b: u32| (a.wrapping_sub(b) as i32) < 0;
            let rcv_wup = if before(rcv_nxt, win.rcv_wup) { rcv_nxt } else { win.rcv_wup };
            let snd_wl1 = if before(rcv_nxt.wrapping_add(win.rcv_wnd), win.snd_wl1) {
                rcv_nxt
            } else {
                win.snd_wl1
            };
            socket::set_repair_window(fd, &socket::RepairWindow { rcv_wup, snd_wl1, ..win })
        }
        r => r,
    }
}

/// Whether an open file is an established connection: those are made
/// after the fork, in ferry only, and pulled into their processes by
/// [`install`] instead of being inherited.
pub fn is_connection(f: &ferry_image::OpenFile) -> bool {
    matches!(&f.kind, FileKind::InetSocket(s) if s.connection.is_some())
}

/// The tree's connections as rebuilt in repair mode: ferry's socket and
/// how many bytes of its send queue went back as already sent, by open
/// file description id.
pub struct Made {
    pub fds: HashMap<u64, OwnedFd>,
    pub sent_back: HashMap<u64, usize>,
}

/// Rebuilds every established connection of the tree once, in ferry, in
/// the network namespace ferry is in.
pub fn create_all(tree: &TreeImage) -> Result<Made> {
    let mut seen = std::collections::HashSet::new();
    let mut todo: Vec<(i32, &ferry_image::OpenFile, &InetSocket, &TcpConnection)> = Vec::new();
    for p in &tree.processes {
        for f in &p.files {
            let FileKind::InetSocket(s) = &f.kind else {
                continue;
            };
            let Some(c) = &s.connection else { continue };
            if seen.insert(f.id) {
                todo.push((p.pid, f, s, c));
            }
        }
    }
    // Worker threads inherit the network namespace ferry is in now.
    let made = crate::parallel::map(&todo, |(pid, f, s, c)| {
        let (type_flags, setfl) = super::socket_type_flags(f.flags);
        let (fd, sent_back) = create_counting_sent(*pid, s, c, type_flags)?;
        super::set_fresh_socket_flags(*pid, &fd, setfl)?;
        Ok((f.id, fd, sent_back))
    })?;
    let sent_back = made.iter().map(|(id, _, n)| (*id, *n)).collect();
    Ok(Made { fds: made.into_iter().map(|(id, fd, _)| (id, fd)).collect(), sent_back })
}

/// Puts this process's connections (and unix sockets made after the
/// fork, `make_unix_late`: `conns` holds both) at their fd numbers: the process
/// takes each socket from ferry with an injected pidfd_getfd, in batches.
/// pidfd_getfd returns the lowest free number, so the slots are filled in
/// ascending order with every lower free number held by a placeholder;
/// each result is checked against the slot it must land on.
pub fn install(
    s: &mut crate::restore::Session,
    conns: &HashMap<u64, OwnedFd>,
    temp_base: RawFd,
) -> Result<()> {
    let image = s.image;
    let mut slots: Vec<(i32, RawFd, bool)> = image
        .fds
        .iter()
        .filter_map(|slot| {
            let f = &image.files[slot.file as usize];
            let src = conns.get(&f.id)?;
            Some((slot.fd, src.as_raw_fd(), slot.cloexec))
        })
        .collect();
    if slots.is_empty() {
        return Ok(());
    }
    slots.sort_unstable();
    let pidfd = ferry_pidfd_in(s, temp_base)?;
    let used: std::collections::HashSet<i32> = image.fds.iter().map(|f| f.fd).collect();
    let highest = slots.last().map_or(0, |x| x.0);
    let gaps: Vec<i32> = (0..highest).filter(|n| !used.contains(n)).collect();
    let batch = install_calls(pidfd, &slots, &gaps);
    let pid = s.pid;
    for (chunk, steps) in batch
        .calls
        .chunks(crate::inject::MAX_BATCH)
        .zip(batch.steps.chunks(crate::inject::MAX_BATCH))
    {
        let got = s.remote.batch(pid, s.scratch, chunk)?;
        for (&r, step) in got.iter().zip(steps) {
            // Named only when something went wrong: 20,000 names for
            // 10,000 connections cost more than the calls' round trips.
            if r < 0 {
                crate::inject::check(pid, pid, &step.to_string(), r)?;
            }
            if let Step::GetFd(fd) = step {
                if r != i64::from(*fd) {
                    return Err(EngineError::restore(pid, format!("{step} landed on fd {r}")));
                }
            }
        }
    }
    Ok(())
}

/// A pidfd of ferry in the process, at `temp_base` or above (out of the
/// way of the fd numbers the image uses).
fn ferry_pidfd_in(s: &mut crate::restore::Session, temp_base: RawFd) -> Result<u64> {
    let me = std::process::id() as u64;
    let p0 = s.call("pidfd_open(ferry)", libc::SYS_pidfd_open, &[me, 0])?;
    let pidfd = s.call(
        "fcntl(F_DUPFD_CLOEXEC, pidfd of ferry)",
        libc::SYS_fcntl,
        &[p0, libc::F_DUPFD_CLOEXEC as u64, temp_base as u64],
    )?;
    s.call("close(pidfd of ferry)", libc::SYS_close, &[p0])?;
    Ok(pidfd)
}

/// What one injected call of [`install_calls`] does, for its error.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Step {
    Placeholder(i32),
    /// Must return this fd.
    GetFd(i32),
    ClearCloexec(i32),
    ClosePlaceholder(i32),
    ClosePidfd,
}

impl std::fmt::Display for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Step::Placeholder(g) => write!(f, "dup3(placeholder at fd {g})"),
            Step::GetFd(fd) => write!(f, "pidfd_getfd(socket for fd {fd})"),
            Step::ClearCloexec(fd) => write!(f, "fcntl(fd {fd}, F_SETFD, 0)"),
            Step::ClosePlaceholder(g) => write!(f, "close(placeholder at fd {g})"),
            Step::ClosePidfd => write!(f, "close(pidfd of ferry)"),
        }
    }
}

/// Injected calls, each with what it does.
struct Steps {
    calls: Vec<Call>,
    steps: Vec<Step>,
}

impl Steps {
    fn push(&mut self, step: Step, nr: i64, args: &[u64]) {
        self.calls.push(Call::new(nr, args));
        self.steps.push(step);
    }
}

/// Placeholders in the `gaps`, then each socket of `slots` (fd, ferry's
/// fd, cloexec) taken with pidfd_getfd, then the placeholders and the
/// pidfd closed again.
fn install_calls(pidfd: u64, slots: &[(i32, RawFd, bool)], gaps: &[i32]) -> Steps {
    let mut out = Steps { calls: Vec::new(), steps: Vec::new() };
    for &g in gaps {
        out.push(Step::Placeholder(g), libc::SYS_dup3, &[pidfd, g as u64, libc::O_CLOEXEC as u64]);
    }
    for &(fd, src, cloexec) in slots {
        out.push(Step::GetFd(fd), libc::SYS_pidfd_getfd, &[pidfd, src as u64, 0]);
        if !cloexec {
            out.push(
                Step::ClearCloexec(fd),
                libc::SYS_fcntl,
                &[fd as u64, libc::F_SETFD as u64, 0],
            );
        }
    }
    for &g in gaps {
        out.push(Step::ClosePlaceholder(g), libc::SYS_close, &[g as u64]);
    }
    out.push(Step::ClosePidfd, libc::SYS_close, &[pidfd]);
    out
}

/// One rebuilt connection: its process, socket, state, ferry's
/// descriptor, and how much of its send queue went back as already sent.
type RebuiltConn<'a> = (i32, &'a InetSocket, &'a TcpConnection, RawFd, usize);

/// Every established connection of the image with ferry's descriptor of
/// its rebuilt socket, each once.
fn connections<'a>(
    tree: &'a TreeImage,
    staged: &HashMap<u64, OwnedFd>,
    sent_back: &HashMap<u64, usize>,
) -> Vec<RebuiltConn<'a>> {
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    for p in &tree.processes {
        for f in &p.files {
            let FileKind::InetSocket(s) = &f.kind else {
                continue;
            };
            let Some(c) = &s.connection else { continue };
            let Some(fd) = staged.get(&f.id) else {
                continue;
            };
            if seen.insert(f.id) {
                let sent = sent_back.get(&f.id).copied().unwrap_or(0);
                out.push((p.pid, s, c, fd.as_raw_fd(), sent));
            }
        }
    }
    out
}

/// The rebuilt connections of the tree, ready to come alive.
pub struct Rebuilt<'a> {
    conns: Vec<RebuiltConn<'a>>,
}

impl Rebuilt<'_> {
    pub fn is_empty(&self) -> bool {
        self.conns.is_empty()
    }
}

/// Leaves repair mode on every rebuilt connection (on the worker
/// threads). Still silent: the network lock holds their packets until it
/// is thawed.
pub fn leave_repair<'a>(tree: &'a TreeImage, made: &Made) -> Result<Rebuilt<'a>> {
    let conns = connections(tree, &made.fds, &made.sent_back);
    crate::parallel::map(&conns, |(pid, s, _, fd, _)| {
        // No window probe now: the lock would drop it; the queued data
        // written by `resend` makes the peer answer anyway.
        socket::set_repair(*fd, socket::TCP_REPAIR_OFF_NO_WP).map_err(|e| {
            EngineError::kernel(*pid, format!("TCP port {}: leaving repair mode", s.port), e)
        })
    })?;
    Ok(Rebuilt { conns })
}

/// After the thaw: writes the send queues again (the peer drops what it
/// already had), then applies what had to wait (buffer lock bits, cork,
/// not-sent low-water mark, SO_REUSEADDR). Each connection is on its own,
/// so they are spread over the worker threads: with 10,000 connections
/// this is the longest step between the thaw and the release. With
/// `probe`, each connection first sends a window probe (with 10,000
/// connections most of this step's time: each probe is a packet the peer
/// answers): for when the lock may have dropped a packet it did not keep.
pub fn resend(rebuilt: &Rebuilt, probe: bool) -> Result<()> {
    crate::parallel::map(&rebuilt.conns, |&conn| resend_one(conn, probe))?;
    Ok(())
}

fn resend_one((pid, s, c, fd, sent_back): RebuiltConn, probe: bool) -> Result<()> {
    let k = |step: &'static str| {
        move |e| EngineError::kernel(pid, format!("TCP port {}: {step}", s.port), e)
    };
    // A window probe now that the lock lets it through (leaving repair
    // mode sends one): the peer answers with its current window. A peer
    // whose own zero-window probes met the lock, and were not kept for
    // delivery, has backed off for seconds and would otherwise wait that
    // long to learn our window.
    if probe {
        socket::set_repair(fd, 1).map_err(k("re-entering repair mode for a window probe"))?;
        socket::set_repair(fd, 0).map_err(k("sending a window probe"))?;
    }
    socket::send_all(fd, written_again(c, sent_back), QUEUE_TIMEOUT_MS)
        .map_err(k("writing the send queue"))?;
    socket::setsockopt_int(fd, libc::SOL_SOCKET, socket::SO_BUF_LOCK, c.buf_lock)
        .map_err(k("restoring SO_BUF_LOCK"))?;
    for o in s.options.iter().filter(|o| deferred(o)) {
        if is_opt(o, libc::SOL_SOCKET, libc::SO_SNDBUF)
            || is_opt(o, libc::SOL_SOCKET, libc::SO_RCVBUF)
        {
            // The size itself came back with the connection; the
            // application's lock came back with SO_BUF_LOCK.
            continue;
        }
        apply_option(pid, fd, o)?;
    }
    Ok(())
}

/// What the resend writes of a connection's send queue: the part that
/// did not go back into it as already sent (`sent_back` bytes).
fn written_again(c: &TcpConnection, sent_back: usize) -> &[u8] {
    &c.send_queue[sent_back.min(c.send_queue.len())..]
}

/// The TCP state of a connection whose peer closed its side.
const CLOSE_WAIT: u8 = 8;
/// How long a peer's FIN may take to reach its socket through loopback.
const FIN_TAKEN_WITHIN: std::time::Duration = std::time::Duration::from_millis(200);

/// After the thaw, before the tree runs: every rebuilt connection whose
/// peer had closed its side gets that peer's FIN again (repair mode can
/// queue data but not the end of the stream), sent in the namespace of
/// the process `root`. Each socket must then be in CLOSE_WAIT, as it was:
/// otherwise its reader would wait for data where it read EOF, so the
/// restore fails naming the connection.
pub fn give_peer_fins(rebuilt: &Rebuilt, root: i32) -> Result<()> {
    let mut fins = Vec::new();
    let mut sockets = Vec::new();
    for &(pid, s, c, fd, _) in rebuilt.conns.iter().filter(|(_, _, c, _, _)| c.state == CLOSE_WAIT)
    {
        let Some((peer_addr, peer_port)) = &s.peer else { continue };
        let local = address(pid, &s.addr, s.port)?;
        let peer = address(pid, peer_addr, *peer_port)?;
        let window = c.window.snd_wnd >> c.snd_wscale.unwrap_or(0);
        fins.push(ferry_netlock::PeerFin {
            peer,
            local,
            seq: c.recv_seq.wrapping_add(c.recv_queue.len() as u32),
            ack: c.send_seq,
            window: window.min(u32::from(u16::MAX)) as u16,
        });
        sockets.push((pid, fd, local, peer));
    }
    if fins.is_empty() {
        return Ok(());
    }
    let netns = ferry_netlock::Netns::Path(format!("/proc/{root}/ns/net").into());
    ferry_netlock::send_peer_fins(&netns, &fins)
        .map_err(|e| EngineError::restore(root, format!("giving closed peers' FINs: {e}")))?;
    let deadline = std::time::Instant::now() + FIN_TAKEN_WITHIN;
    for (pid, fd, local, peer) in sockets {
        loop {
            let state = socket::tcp_info(fd).map(|ti| ti.tcpi_state).map_err(|e| {
                EngineError::kernel(pid, format!("TCP {local} -> {peer}: reading TCP_INFO"), e)
            })?;
            if state == CLOSE_WAIT {
                break;
            }
            if std::time::Instant::now() >= deadline {
                return Err(EngineError::restore(
                    pid,
                    format!(
                        "TCP {local} -> {peer}: the peer's FIN was not taken (state {state}, \
                         not CLOSE_WAIT): its reader would never see the EOF"
                    ),
                ));
            }
            std::thread::sleep(std::time::Duration::from_micros(100));
        }
    }
    Ok(())
}

/// Waits (at most `limit`) until every rebuilt connection has sent again
/// as much as the old socket had sent: until then an ACK from the peer
/// for that data counts as one for data never sent and the kernel drops
/// it with the data it carries. The write usually goes out at once;
/// pacing can defer it. What the old socket had not sent yet does not
/// count: a connection whose peer's window holds back the rest of its
/// queue would otherwise keep every connection's held packets waiting
/// for the whole limit. Returns whether everything was sent.
pub fn wait_sent(rebuilt: &Rebuilt, limit: std::time::Duration) -> bool {
    let deadline = std::time::Instant::now() + limit;
    // Only a connection the resend wrote to has anything to send again.
    let written: Vec<&RebuiltConn> = rebuilt
        .conns
        .iter()
        .filter(|(_, _, c, _, sent_back)| !written_again(c, *sent_back).is_empty())
        .collect();
    loop {
        let pending = written
            .iter()
            .any(|(_, _, c, fd, _)| socket::outq_unsent(*fd).is_ok_and(|n| n > c.unsent));
        if !pending {
            return true;
        }
        if std::time::Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
}

#[cfg(test)]
mod tests {
    use super::{head_to_put_back, install_calls, Step};

    #[test]
    fn sockets_are_taken_in_order_with_the_gaps_held_and_freed_again() {
        // fds 3 and 5 are connections (ferry's 100 and 101), 4 is not in
        // the image; fd 5 keeps close-on-exec.
        let s = install_calls(9, &[(3, 100, false), (5, 101, true)], &[4]);
        assert_eq!(
            s.steps,
            vec![
                Step::Placeholder(4),
                Step::GetFd(3),
                Step::ClearCloexec(3),
                Step::GetFd(5),
                Step::ClosePlaceholder(4),
                Step::ClosePidfd,
            ]
        );
        assert_eq!(s.calls.len(), s.steps.len());
        assert_eq!(s.calls[1].nr, libc::SYS_pidfd_getfd);
        assert_eq!(&s.calls[1].args[..3], &[9, 100, 0]);
        assert_eq!(Step::GetFd(5).to_string(), "pidfd_getfd(socket for fd 5)");
    }

    #[test]
    fn sent_data_is_sent_again_only_when_it_all_goes_at_once() {
        let f = |cwnd, peer_window| super::Flight { cwnd, mss: 1448, peer_window };
        // Fits the congestion window and the peer's window: all sent anew.
        assert_eq!(head_to_put_back(7_240, 100_000, f(10, 65_536)), 0);
        // More than one flight, or more than the peer's window: all of it
        // counts as sent, so no acknowledgement of it is ever dropped.
        assert_eq!(head_to_put_back(20_000, 100_000, f(10, 65_536)), 20_000);
        assert_eq!(head_to_put_back(14_480, 100_000, f(10, 8_192)), 14_480);
        // The window's edge inside the last segment, more data behind: the
        // kernel would not send that segment.
        assert_eq!(head_to_put_back(8_192, 107_209, f(10, 8_192)), 8_192);
        // The same bytes as the whole queue: the short last segment goes.
        assert_eq!(head_to_put_back(8_192, 8_192, f(10, 8_192)), 0);
        assert_eq!(head_to_put_back(0, 100, f(10, 0)), 0);
    }
}
