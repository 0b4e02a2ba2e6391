//! Established TCP connections, read in TCP repair mode: sequence numbers,
//! both queues, negotiated options, window, timestamp clock, buffer sizes.
//!
//! Runs after the survey, once the network lock holds the connections
//! still: repair mode is switched on through ferry's duplicate of each
//! socket and stays on until the process is killed, so that closing the
//! socket sends nothing to the peer. If the checkpoint fails or the tree
//! is left running, [`Repaired`] switches it off again on drop.

use crate::error::{EngineError, Result};
use crate::tcp_repair::leave_repair;
use ferry_image::{FileKind, OpenFile, QueueBytes, TcpConnection, TcpWindow};
use ferry_sys::socket;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

/// One established connection of the tree: where it is and its 4-tuple.
#[derive(Debug, Clone)]
pub struct Established {
    pub pid: i32,
    pub fd: i32,
    /// Index of the process (in the tree's order) and of the file in its table.
    pub proc_index: usize,
    pub file_index: usize,
    pub local: SocketAddr,
    pub remote: SocketAddr,
    /// SO_REUSEADDR as the survey read it (the tree has not run since):
    /// leaving repair mode resets it.
    pub reuse: bool,
    /// SO_BUF_LOCK as the survey read it: its options hold SO_SNDBUF
    /// (SO_RCVBUF) exactly when the application fixed that size
    /// ([`super::inet`]'s `changed_options`), and only a setsockopt
    /// changes the bits.
    pub buf_lock: i32,
}

/// SO_BUF_LOCK's bits from the options the survey kept: a buffer size
/// is among them exactly when its lock bit was set.
fn buf_lock_of(options: &[ferry_image::SockOpt]) -> i32 {
    const SOCK_SNDBUF_LOCK: i32 = 1;
    const SOCK_RCVBUF_LOCK: i32 = 2;
    let has = |name| options.iter().any(|o| o.level == libc::SOL_SOCKET && o.name == name);
    let mut bits = 0;
    if has(libc::SO_SNDBUF) {
        bits |= SOCK_SNDBUF_LOCK;
    }
    if has(libc::SO_RCVBUF) {
        bits |= SOCK_RCVBUF_LOCK;
    }
    bits
}

fn socket_addr(bytes: &[u8], port: u16) -> Option<SocketAddr> {
    let ip = match bytes.len() {
        4 => IpAddr::V4(Ipv4Addr::new(bytes[0], bytes[1], bytes[2], bytes[3])),
        16 => {
            let v6 = Ipv6Addr::from(<[u8; 16]>::try_from(bytes).ok()?);
            // A v4-mapped address is the IPv4 connection it carries.
            v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4)
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

/// The established TCP connections of the tree, each open file
/// description once (descriptions are already linked across the tree).
pub fn established(procs: &[(i32, &[OpenFile], &[ferry_image::FdSlot])]) -> Vec<Established> {
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    for (proc_index, (pid, files, fds)) in procs.iter().enumerate() {
        let first_fd = super::first_fd_of_each_file(fds);
        for (file_index, f) in files.iter().enumerate() {
            let FileKind::InetSocket(s) = &f.kind else {
                continue;
            };
            if s.sock_type != libc::SOCK_STREAM {
                continue;
            }
            let Some((paddr, pport)) = &s.peer else {
                continue;
            };
            if !seen.insert(f.id) {
                continue;
            }
            let Some(&fd) = first_fd.get(&(file_index as u32)) else {
                continue;
            };
            let (Some(local), Some(remote)) =
                (socket_addr(&s.addr, s.port), socket_addr(paddr, *pport))
            else {
                continue;
            };
            let reuse = s.options.iter().any(|o| {
                o.level == libc::SOL_SOCKET
                    && o.name == libc::SO_REUSEADDR
                    && o.value.iter().any(|&b| b != 0)
            });
            let buf_lock = buf_lock_of(&s.options);
            out.push(Established {
                pid: *pid,
                fd,
                proc_index,
                file_index,
                local,
                remote,
                reuse,
                buf_lock,
            });
        }
    }
    out
}

/// One socket ferry took from the tree, and whether it is in repair
/// mode now.
struct Held {
    pid: i32,
    fd: i32,
    sock: OwnedFd,
    /// SO_REUSEADDR as the application had it: leaving repair mode resets it.
    reuse: bool,
    in_repair: std::sync::atomic::AtomicBool,
}

/// Sockets ferry switched into repair mode. Dropping this switches them
/// back, unless [`Repaired::keep_in_repair`] said their process dies.
pub struct Repaired {
    socks: Vec<Held>,
    keep: bool,
}

impl Repaired {
    /// Ferry's descriptors of the repaired sockets (a trial restore's
    /// helper, a fork of ferry, closes its inherited copies).
    pub fn raw_fds(&self) -> Vec<std::os::fd::RawFd> {
        use std::os::fd::AsRawFd;
        self.socks.iter().map(|h| h.sock.as_raw_fd()).collect()
    }

    /// The processes are about to be killed: leave repair mode on, so that
    /// closing the sockets sends neither FIN nor RST. Ferry's descriptors
    /// stay open until [`KeptInRepair::close`]: the processes' exit then
    /// only drops their own references, and the sockets end on the worker
    /// threads instead of one by one in the exiting process.
    pub fn keep_in_repair(mut self) -> KeptInRepair {
        self.keep = true;
        KeptInRepair(std::mem::take(&mut self.socks))
    }
}

/// Sockets left in repair mode for good, held until their processes are
/// gone.
pub struct KeptInRepair(Vec<Held>);

impl KeptInRepair {
    /// Closes ferry's descriptors, the sockets' last ones once their
    /// processes exited: each connection ends there, silently.
    pub fn close(self) {
        crate::parallel::drop_all(self.0);
    }
}

impl Drop for Repaired {
    fn drop(&mut self) {
        if self.keep {
            return;
        }
        for h in &self.socks {
            if !h.in_repair.load(std::sync::atomic::Ordering::Acquire) {
                continue;
            }
            if let Err(e) = leave_repair(h.sock.as_raw_fd(), h.reuse) {
                tracing::error!("pid {} fd {}: could not leave TCP repair mode: {e}", h.pid, h.fd);
            }
        }
    }
}

fn kernel(c: &Established, what: &str, e: ferry_sys::SysError) -> EngineError {
    EngineError::kernel(c.pid, format!("fd {} (TCP {} -> {}): {what}", c.fd, c.local, c.remote), e)
}

/// Switches every connection into repair mode and reads its state, on
/// the worker threads. `pidfd_of(pid)` gives the pidfd of a process of
/// the tree; `repairing` hears of every socket (pid, fd, SO_REUSEADDR)
/// before any enters repair mode (the checkpoint guard undoes that if
/// ferry dies).
pub fn capture<'a>(
    conns: &[Established],
    kept: Vec<Option<OwnedFd>>,
    pidfd_of: impl Fn(i32) -> Option<&'a OwnedFd>,
    repairing: impl FnOnce(&[(i32, i32, bool)]),
) -> Result<(Repaired, Vec<TcpConnection>)> {
    let mut kept = kept.into_iter();
    let mut socks = Vec::with_capacity(conns.len());
    for c in conns {
        // The survey's duplicate (the tree has been frozen since), else a new one.
        let sock = match kept.next().flatten() {
            Some(sock) => sock,
            None => {
                let pidfd = pidfd_of(c.pid)
                    .ok_or_else(|| EngineError::restore(c.pid, "no pidfd for the process"))?;
                ferry_sys::pidfd::pidfd_getfd(pidfd, c.fd)
                    .map_err(|e| kernel(c, "duplicating the socket", e))?
            }
        };
        socks.push(Held { pid: c.pid, fd: c.fd, sock, reuse: c.reuse, in_repair: false.into() });
    }
    // The guard hears of every socket before any enters repair mode.
    repairing(&socks.iter().map(|h| (h.pid, h.fd, h.reuse)).collect::<Vec<_>>());
    let repaired = Repaired { socks, keep: false };
    let work: Vec<(&Established, &Held)> = conns.iter().zip(&repaired.socks).collect();
    let states = crate::parallel::map(&work, |(c, h)| {
        let fd = h.sock.as_raw_fd();
        socket::set_repair(fd, 1).map_err(|e| kernel(c, "entering repair mode", e))?;
        h.in_repair.store(true, std::sync::atomic::Ordering::Release);
        read_connection(c, fd)
    })?;
    Ok((repaired, states))
}

fn read_connection(c: &Established, fd: RawFd) -> Result<TcpConnection> {
    let k = |what: &'static str| move |e| kernel(c, what, e);
    let ti = socket::tcp_info(fd).map_err(k("reading TCP_INFO"))?;
    let peer_closed = ti.tcpi_state == super::inet::TCP_CLOSE_WAIT;
    if ti.tcpi_state != super::inet::TCP_ESTABLISHED && !peer_closed {
        return Err(EngineError::transient(
            c.pid,
            format!("fd {} (TCP {} -> {})", c.fd, c.local, c.remote),
            format!(
                "the connection went to state {} during the checkpoint",
                super::inet::tcp_state_name(ti.tcpi_state)
            ),
        ));
    }
    // What the network may have brought since the survey (a connection
    // described before the freeze was polled then): an error, an urgent
    // byte. Under the lock nothing more arrives.
    let polled = super::socket_preconditions::revents(fd);
    if let Some((why, passing)) =
        super::socket_preconditions::poll_refusal(polled, true, ti.tcpi_state)
    {
        let what = format!("fd {} (TCP {} -> {})", c.fd, c.local, c.remote);
        return Err(if passing {
            EngineError::transient(c.pid, what, why)
        } else {
            EngineError::unsupported(c.pid, what, why)
        });
    }
    socket::set_repair_queue(fd, socket::TCP_RECV_QUEUE)
        .map_err(k("selecting the receive queue"))?;
    let rcv_nxt = socket::queue_seq(fd).map_err(k("reading the receive sequence"))?;
    // Each queue with one peek: its length is what the peek returned
    // (SIOCINQ's rcv_nxt - copied_seq less a received FIN, SIOCOUTQ's
    // write_seq - snd_una; the tree is frozen and the lock holds the
    // connection's packets).
    let recv_queue = whole_queue(fd).map_err(k("reading the receive queue"))?;
    let inq = recv_queue.len() as u32;
    socket::set_repair_queue(fd, socket::TCP_SEND_QUEUE).map_err(k("selecting the send queue"))?;
    let write_seq = socket::queue_seq(fd).map_err(k("reading the send sequence"))?;
    // The bytes never sent, from the TCP_INFO read above instead of one
    // more call: tcpi_notsent_bytes is SIOCOUTQNSD's write_seq - snd_nxt
    // (the tree is frozen, the lock holds the connection's packets).
    let unsent = ti.tcpi_notsent_bytes;
    // The send queue stays selected: only repair mode reads the choice,
    // and every later step in it selects its own.
    let send_queue = whole_queue(fd).map_err(k("reading the send queue"))?;
    let outq = send_queue.len() as u32;
    let mss_clamp = socket::getsockopt_int(fd, libc::IPPROTO_TCP, libc::TCP_MAXSEG)
        .map_err(k("reading the MSS"))? as u32;
    let timestamp = socket::getsockopt_int(fd, libc::IPPROTO_TCP, socket::TCP_TIMESTAMP)
        .map_err(k("reading TCP_TIMESTAMP"))? as u32;
    let w = socket::repair_window(fd).map_err(k("reading the window"))?;
    // SO_SNDBUF and SO_RCVBUF in one call; SO_BUF_LOCK from the survey.
    let (sndbuf, rcvbuf) = socket::buffer_sizes(fd).map_err(k("reading the buffer sizes"))?;
    let buf_lock = c.buf_lock;
    const TCPI_OPT_TIMESTAMPS: u8 = 1;
    const TCPI_OPT_SACK: u8 = 2;
    const TCPI_OPT_WSCALE: u8 = 4;
    let wscale = ti.tcpi_snd_rcv_wscale;
    Ok(TcpConnection {
        state: ti.tcpi_state,
        send_seq: write_seq.wrapping_sub(outq),
        send_queue,
        unsent,
        // The peer's FIN takes a sequence number after its last byte.
        recv_seq: rcv_nxt.wrapping_sub(inq).wrapping_sub(u32::from(peer_closed)),
        recv_queue,
        mss_clamp,
        snd_wscale: (ti.tcpi_options & TCPI_OPT_WSCALE != 0).then_some(wscale & 0xf),
        rcv_wscale: wscale >> 4,
        sack: ti.tcpi_options & TCPI_OPT_SACK != 0,
        timestamps: ti.tcpi_options & TCPI_OPT_TIMESTAMPS != 0,
        timestamp,
        window: TcpWindow {
            snd_wl1: w.snd_wl1,
            snd_wnd: w.snd_wnd,
            max_window: w.max_window,
            rcv_wnd: w.rcv_wnd,
            rcv_wup: w.rcv_wup,
        },
        sndbuf,
        rcvbuf,
        buf_lock,
    })
}

/// Room a block keeps for one more queue: a queue up to this size is
/// peeked into the block in place; a longer one gets a block of its own.
const QUEUE_ROOM: usize = 256 << 10;
/// The blocks the queues are peeked into, one thread's at a time.
const QUEUE_BLOCK: usize = 4 << 20;

/// The selected queue of a repaired socket, whole, with one peek straight
/// into this thread's block of zeroed memory (grown when a queue fills
/// what is left): its length is what the peek returned, and the bytes
/// the image takes are that part of the block, not a copy of it. Copying
/// each queue out of a scratch buffer cost 10,000 connections 20,000
/// allocations and 80 MB of copies in the pause.
fn whole_queue(fd: RawFd) -> ferry_sys::SysResult<QueueBytes> {
    thread_local! {
        static BLOCK: std::cell::RefCell<bytes::BytesMut> =
            std::cell::RefCell::new(bytes::BytesMut::new());
    }
    BLOCK.with(|block| peek_into(&mut block.borrow_mut(), fd, QUEUE_ROOM))
}

/// [`whole_queue`] with `block` and the `room` it must have left.
fn peek_into(
    block: &mut bytes::BytesMut,
    fd: RawFd,
    mut room: usize,
) -> ferry_sys::SysResult<QueueBytes> {
    loop {
        if block.len() < room {
            *block = bytes::BytesMut::zeroed(room.max(QUEUE_BLOCK));
        }
        if let Some(n) = socket::peek_whole_queue(fd, &mut block[..])? {
            return Ok(QueueBytes::from(block.split_to(n).freeze()));
        }
        // The queue filled what was left: a block twice as large.
        room = block.len() * 2;
    }
}

/// Puts each captured state into its socket's open file description,
/// in every process that shares it.
pub fn store(
    conns: &[Established],
    states: Vec<TcpConnection>,
    files_of: &mut [&mut Vec<OpenFile>],
) {
    // Each state moves into the file it was read from (10,000 copies of
    // both queues would cost tens of milliseconds in the freeze); only a
    // description other processes share is copied to them.
    let mut owner = std::collections::HashMap::new();
    for (c, state) in conns.iter().zip(states) {
        let Some(f) = files_of.get_mut(c.proc_index).and_then(|f| f.get_mut(c.file_index)) else {
            continue;
        };
        if let FileKind::InetSocket(s) = &mut f.kind {
            s.connection = Some(state);
            owner.insert(f.id, (c.proc_index, c.file_index));
        }
    }
    let mut shared = Vec::new();
    for (p, files) in files_of.iter().enumerate() {
        for (i, f) in files.iter().enumerate() {
            match owner.get(&f.id) {
                Some(&(op, oi)) if (op, oi) != (p, i) => shared.push((p, i, op, oi)),
                _ => {}
            }
        }
    }
    for (p, i, op, oi) in shared {
        let state = match files_of.get(op).and_then(|f| f.get(oi)).map(|f| &f.kind) {
            Some(FileKind::InetSocket(s)) => s.connection.clone(),
            _ => None,
        };
        if let Some(FileKind::InetSocket(s)) =
            files_of.get_mut(p).and_then(|f| f.get_mut(i)).map(|f| &mut f.kind)
        {
            s.connection = state;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_image::SockOpt;

    fn opt(level: i32, name: i32) -> SockOpt {
        SockOpt { level, name, value: 4096i32.to_ne_bytes().to_vec() }
    }

    #[test]
    fn queues_are_peeked_whole_into_one_block_and_a_long_one_into_its_own() {
        use std::io::Write;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let mut peer =
            std::net::TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
        let (sock, _) = listener.accept().expect("accept");
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        peer.write_all(&data).expect("send");
        let fd = sock.as_raw_fd();
        // Until the receive queue holds every byte sent.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while ferry_sys::fd::bytes_readable(fd).expect("FIONREAD") < data.len() {
            assert!(std::time::Instant::now() < deadline, "the data did not arrive");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        socket::set_repair(fd, 1).expect("repair mode (needs CAP_NET_ADMIN)");
        socket::set_repair_queue(fd, socket::TCP_RECV_QUEUE).expect("receive queue");
        let mut block = bytes::BytesMut::zeroed(QUEUE_BLOCK);
        let first = peek_into(&mut block, fd, 64 << 10).expect("peek");
        let second = peek_into(&mut block, fd, 64 << 10).expect("peek");
        assert_eq!(first, data);
        assert_eq!(second, data);
        // Both in the one block, one after the other.
        assert_eq!(second.as_ptr() as usize, first.as_ptr() as usize + data.len());
        // Less room left than the queue takes: read whole all the same.
        let mut small = bytes::BytesMut::zeroed(1000);
        let third = peek_into(&mut small, fd, 64).expect("peek");
        assert_eq!(third, data);
        socket::set_repair(fd, 0).expect("repair off");
    }

    /// The bits a real socket shows after each fixed size, from the
    /// options the survey keeps for it.
    #[test]
    fn buffer_locks_come_from_the_sizes_the_survey_kept() {
        assert_eq!(buf_lock_of(&[]), 0);
        assert_eq!(buf_lock_of(&[opt(libc::IPPROTO_TCP, libc::TCP_NODELAY)]), 0);
        assert_eq!(buf_lock_of(&[opt(libc::SOL_SOCKET, libc::SO_SNDBUF)]), 1);
        assert_eq!(buf_lock_of(&[opt(libc::SOL_SOCKET, libc::SO_RCVBUF)]), 2);
        let both = [opt(libc::SOL_SOCKET, libc::SO_RCVBUF), opt(libc::SOL_SOCKET, libc::SO_SNDBUF)];
        assert_eq!(buf_lock_of(&both), 3);
        // The kernel's own answer for the same settings.
        for (set, want) in
            [(vec![], 0), (vec![libc::SO_SNDBUF], 1), (vec![libc::SO_SNDBUF, libc::SO_RCVBUF], 3)]
        {
            let s = std::net::TcpListener::bind("127.0.0.1:0").expect("socket");
            let fd = std::os::fd::AsRawFd::as_raw_fd(&s);
            for &n in &set {
                socket::setsockopt_int(fd, libc::SOL_SOCKET, n, 65536).expect("setsockopt");
            }
            let got = socket::getsockopt_int(fd, libc::SOL_SOCKET, socket::SO_BUF_LOCK)
                .expect("SO_BUF_LOCK");
            assert_eq!(got, want, "after setting {set:?}");
            let kept: Vec<SockOpt> = set.iter().map(|&n| opt(libc::SOL_SOCKET, n)).collect();
            assert_eq!(buf_lock_of(&kept), got);
        }
    }
}
