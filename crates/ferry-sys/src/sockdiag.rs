//! sock_diag netlink queries: what only the kernel's socket tables know
//! about a socket, such as the inode of a unix socket's peer.

use crate::{last_error, SysResult};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

const SOCK_DIAG_BY_FAMILY: u16 = 20;
const SOCK_DESTROY: u16 = 21;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_ACK: u16 = 4;
const NLM_F_DUMP: u16 = 0x300;
const NLMSG_DONE: u16 = 3;
const NLMSG_ERROR: u16 = 2;
const UDIAG_SHOW_NAME: u32 = 1;
const UDIAG_SHOW_VFS: u32 = 2;
const UNIX_DIAG_VFS: u16 = 1;
const UDIAG_SHOW_PEER: u32 = 4;
const UDIAG_SHOW_ICONS: u32 = 8;
const UNIX_DIAG_ICONS: u16 = 3;
const UDIAG_SHOW_RQLEN: u32 = 0x10;
const UNIX_DIAG_NAME: u16 = 0;
const UNIX_DIAG_PEER: u16 = 2;
const UNIX_DIAG_RQLEN: u16 = 4;
const UNIX_DIAG_SHUTDOWN: u16 = 6;

/// One unix socket as sock_diag reports it.
#[derive(Debug, Clone, Default)]
pub struct UnixDiag {
    pub ino: u32,
    pub sock_type: u8,
    pub state: u8,
    pub name: Vec<u8>,
    pub peer: u32,
    /// For a listener: connections waiting to be accepted; otherwise bytes queued to read.
    pub rqueue: u32,
    /// For a listener: its backlog; otherwise bytes queued to send.
    pub wqueue: u32,
    /// sk_shutdown bits: 1 = receive side shut down, 2 = send side.
    pub shutdown: u8,
    /// For a listener: the inodes of the connections waiting in its
    /// accept queue, oldest first.
    pub icons: Vec<u32>,
    /// For a socket bound to a path: the inode and device (the kernel's
    /// encoding, major << 20 | minor) of the socket file bind created.
    pub vfs: Option<(u32, u32)>,
}

fn u16_at(b: &[u8], o: usize) -> u16 {
    u16::from_ne_bytes([b[o], b[o + 1]])
}
fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_ne_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}

/// SIOCGSKNS from <linux/sockios.h>: an fd for a socket's network namespace.
const SIOCGSKNS: libc::c_ulong = 0x894C;

fn diag_socket() -> SysResult<OwnedFd> {
    // SAFETY: plain socket(2).
    let raw = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
            libc::NETLINK_SOCK_DIAG,
        )
    };
    if raw < 0 {
        return Err(last_error("socket(NETLINK_SOCK_DIAG)"));
    }
    // SAFETY: raw is a new descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// The network namespace a socket belongs to, as an nsfs descriptor.
pub fn socket_netns(sock: BorrowedFd) -> SysResult<OwnedFd> {
    // SAFETY: SIOCGSKNS takes no argument and returns a new fd.
    let ns = unsafe { libc::ioctl(sock.as_raw_fd(), SIOCGSKNS as _) };
    if ns < 0 {
        return Err(last_error("ioctl(SIOCGSKNS)"));
    }
    // SAFETY: ns is a new descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(ns) })
}

/// The inode of a namespace (or any) descriptor: its identity.
pub fn inode_of(fd: BorrowedFd) -> SysResult<u64> {
    // SAFETY: st is plain data filled by fstat.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fd is open; st is a valid stat buffer.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } < 0 {
        return Err(last_error("fstat"));
    }
    Ok(st.st_ino)
}

/// Runs `f` with the calling thread in network namespace `ns` (when it
/// is not there already) and moves the thread back: a socket `f` makes
/// stays in `ns` and answers for it.
pub fn in_netns<T>(ns: BorrowedFd, f: impl FnOnce() -> SysResult<T>) -> SysResult<T> {
    let own = std::fs::File::open("/proc/thread-self/ns/net").map_err(|e| {
        crate::SysError::new("open(/proc/thread-self/ns/net)", e.raw_os_error().unwrap_or(0))
    })?;
    if inode_of(std::os::fd::AsFd::as_fd(&own))? == inode_of(ns)? {
        return f();
    }
    // SAFETY: ns is a network namespace fd; only this thread moves.
    if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } < 0 {
        return Err(last_error("setns(socket's network namespace)"));
    }
    let made = f();
    // SAFETY: own is the thread's original namespace.
    if unsafe { libc::setns(own.as_raw_fd(), libc::CLONE_NEWNET) } < 0 {
        return Err(last_error("setns(back to ferry's network namespace)"));
    }
    made
}

/// A sock_diag socket of network namespace `ns`.
fn diag_socket_in(ns: BorrowedFd) -> SysResult<OwnedFd> {
    in_netns(ns, diag_socket)
}

/// Whether a socket of network namespace `ns` can bind address `ip`
/// (port 0) now: false when the kernel answers EADDRNOTAVAIL (no
/// interface holds the address and non-local binds are off).
pub fn address_is_local_in(ns: BorrowedFd, ip: std::net::IpAddr) -> SysResult<bool> {
    let family = if ip.is_ipv4() { libc::AF_INET } else { libc::AF_INET6 };
    in_netns(ns, || {
        let probe = crate::socket::socket(family, libc::SOCK_DGRAM, 0)?;
        match crate::socket::bind(probe.as_raw_fd(), family, &std::net::SocketAddr::new(ip, 0)) {
            Ok(()) => Ok(true),
            Err(e) if e.errno == libc::EADDRNOTAVAIL => Ok(false),
            Err(e) => Err(e),
        }
    })
}

/// A new socket made in network namespace `ns`, so that it takes that
/// namespace's defaults (sysctl values are per namespace).
pub fn socket_in(ns: BorrowedFd, family: i32, ty: i32, protocol: i32) -> SysResult<OwnedFd> {
    in_netns(ns, || crate::socket::socket(family, ty, protocol))
}

/// Calls `f` with each inet_diag message (attributes included) of a batch.
fn for_each_inet_msg(buf: &[u8], mut f: impl FnMut(&[u8])) -> SysResult<Batch> {
    let mut off = 0usize;
    while off + 16 <= buf.len() {
        let len = u32_at(buf, off) as usize;
        let ty = u16_at(buf, off + 4);
        if len < 16 || off + len > buf.len() || ty == NLMSG_DONE {
            return Ok(Batch::Last);
        }
        if ty == NLMSG_ERROR {
            return Err(crate::SysError::new("inet_diag", -(u32_at(buf, off + 16) as i32)));
        }
        f(&buf[off + 16..off + len]);
        off += (len + 3) & !3;
    }
    Ok(Batch::More)
}

/// Whether the attributes after the first `skip` bytes hold one of `ty`.
fn has_attr(msg: &[u8], skip: usize, ty: u16) -> bool {
    attr(msg, skip, ty).is_some()
}

/// The payload of the first attribute `ty` after the first `skip` bytes.
fn attr(msg: &[u8], skip: usize, ty: u16) -> Option<&[u8]> {
    let mut off = skip;
    while off + 4 <= msg.len() {
        let len = u16_at(msg, off) as usize;
        if len < 4 || off + len > msg.len() {
            return None;
        }
        if u16_at(msg, off + 2) & 0x3fff == ty {
            return Some(&msg[off + 4..off + len]);
        }
        off += (len + 3) & !3;
    }
    None
}

/// (inode, sk_shutdown) of every socket of `protocol` (IPv4 and IPv6) in
/// network namespace `ns`, from INET_DIAG_SHUTDOWN (1: receive side shut
/// down, 2: send side), which the kernel adds to every inet_diag message.
/// A UDP socket shows its shutdown nowhere else (poll only when both
/// sides are).
pub fn inet_shutdowns_in(ns: BorrowedFd, protocol: i32) -> SysResult<Vec<(u32, u8)>> {
    let sock = diag_socket_in(ns)?;
    let mut out = Vec::new();
    for family in [libc::AF_INET as u8, libc::AF_INET6 as u8] {
        let req = inet_dump_request(family, protocol as u8);
        dump(&sock, &req, |batch| {
            for_each_inet_msg(batch, |msg| {
                if let Some(s) = shutdown_of(msg) {
                    out.push(s);
                }
            })
        })?;
    }
    Ok(out)
}

/// (inode, shutdown bits) of one inet_diag message.
fn shutdown_of(msg: &[u8]) -> Option<(u32, u8)> {
    const INET_DIAG_SHUTDOWN: u16 = 8;
    if msg.len() < 72 {
        return None;
    }
    let bits = attr(msg, 72, INET_DIAG_SHUTDOWN)?.first().copied()?;
    Some((u32_at(msg, 68), bits))
}

/// Every unix socket of network namespace `ns` (an nsfs descriptor).
pub fn unix_sockets_in(ns: BorrowedFd) -> SysResult<Vec<UnixDiag>> {
    unix_sockets_from(diag_socket_in(ns)?)
}

fn unix_sockets_from(sock: OwnedFd) -> SysResult<Vec<UnixDiag>> {
    let mut out = Vec::new();
    dump(&sock, &unix_dump_request(), |batch| parse_batch(batch, &mut out))?;
    Ok(out)
}

/// A dump request for every unix socket, with all the attributes
/// UnixDiag holds.
fn unix_dump_request() -> Vec<u8> {
    let mut req = Vec::with_capacity(40);
    req.extend_from_slice(&40u32.to_ne_bytes());
    req.extend_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    req.extend_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
    req.extend_from_slice(&1u32.to_ne_bytes());
    req.extend_from_slice(&0u32.to_ne_bytes());
    req.extend_from_slice(&[libc::AF_UNIX as u8, 0, 0, 0]);
    req.extend_from_slice(&u32::MAX.to_ne_bytes());
    req.extend_from_slice(&0u32.to_ne_bytes());
    req.extend_from_slice(
        &(UDIAG_SHOW_NAME | UDIAG_SHOW_VFS | UDIAG_SHOW_PEER | UDIAG_SHOW_RQLEN | UDIAG_SHOW_ICONS)
            .to_ne_bytes(),
    );
    req.extend_from_slice(&[0u8; 8]);
    req
}

/// Whether the dump goes on after a batch of messages.
#[derive(PartialEq, Eq)]
enum Batch {
    More,
    Last,
}

/// Appends the sockets of one received batch of netlink messages to `out`.
fn parse_batch(buf: &[u8], out: &mut Vec<UnixDiag>) -> SysResult<Batch> {
    let n = buf.len();
    let mut off = 0usize;
    while off + 16 <= n {
        let len = u32_at(buf, off) as usize;
        let ty = u16_at(buf, off + 4);
        if len < 16 || off + len > n {
            return Ok(Batch::Last);
        }
        if ty == NLMSG_DONE {
            return Ok(Batch::Last);
        }
        if ty == NLMSG_ERROR {
            return Err(crate::SysError::new("sock_diag", -(u32_at(buf, off + 16) as i32)));
        }
        let msg = &buf[off + 16..off + len];
        if msg.len() >= 16 {
            out.push(parse_unix_diag(msg));
        }
        off += (len + 3) & !3;
    }
    Ok(Batch::More)
}

/// One `unix_diag_msg` (at least 16 bytes) and its attributes.
fn parse_unix_diag(msg: &[u8]) -> UnixDiag {
    let mut d =
        UnixDiag { sock_type: msg[1], state: msg[2], ino: u32_at(msg, 4), ..Default::default() };
    let mut a = 16usize;
    while a + 4 <= msg.len() {
        let alen = u16_at(msg, a) as usize;
        let aty = u16_at(msg, a + 2);
        if alen < 4 || a + alen > msg.len() {
            break;
        }
        let val = &msg[a + 4..a + alen];
        match aty {
            UNIX_DIAG_NAME => d.name = val.to_vec(),
            UNIX_DIAG_VFS if val.len() >= 8 => d.vfs = Some((u32_at(val, 0), u32_at(val, 4))),
            UNIX_DIAG_PEER if val.len() >= 4 => d.peer = u32_at(val, 0),
            UNIX_DIAG_RQLEN if val.len() >= 8 => {
                d.rqueue = u32_at(val, 0);
                d.wqueue = u32_at(val, 4);
            }
            UNIX_DIAG_SHUTDOWN if !val.is_empty() => d.shutdown = val[0],
            UNIX_DIAG_ICONS => d.icons = val.chunks_exact(4).map(|c| u32_at(c, 0)).collect(),
            _ => {}
        }
        a += (alen + 3) & !3;
    }
    d
}

/// One TCP socket as inet_diag reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpDiag {
    pub family: u8,
    /// TCP state (1 = ESTABLISHED ... 10 = LISTEN).
    pub state: u8,
    pub local: std::net::SocketAddr,
    pub remote: std::net::SocketAddr,
    /// For a listener: connections waiting to be accepted; otherwise
    /// bytes queued to read.
    pub rqueue: u32,
    /// 0 for a connection in TIME_WAIT (no socket of its own).
    pub inode: u32,
    /// sk_shutdown bits (INET_DIAG_SHUTDOWN): 1 = receive side shut
    /// down, 2 = send side.
    pub shutdown: u8,
    /// It has TCP MD5 signature keys (INET_DIAG_MD5SIG, only in a dump
    /// [`TcpDump::WithInfo`]).
    pub md5: bool,
}

/// TCP state TIME_WAIT, as [`TcpDiag::state`] shows it.
pub const TCP_TIME_WAIT: u8 = 6;

/// What a dump of [`tcp_sockets_in`] asks each socket for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TcpDump {
    /// The socket's table entry and its shutdown bits.
    Plain,
    /// Also INET_DIAG_INFO, with which the kernel adds a socket's MD5
    /// keys (it reads tcp_info under each socket's lock: slower).
    WithInfo,
    /// The connections in TIME_WAIT alone: the kernel skips every other
    /// socket before it formats it (a listener's check in the freeze
    /// needs only these, and a server's 10,000 connections cost it 15 ms
    /// of formatting and parsing).
    TimeWait,
    /// The connections in TIME_WAIT at this local port alone: the kernel
    /// compares the port (idiag_sport) before it formats an entry, so
    /// the TIME_WAIT entries of the host's other ports cost the walk
    /// alone (10,000 of them took 5.9 ms to format and parse).
    TimeWaitOn(u16),
}

/// Every TCP socket (IPv4 and IPv6) of network namespace `ns`, the
/// connections in TIME_WAIT included, in one dump of both families
/// ([`both_families`]): 10,000
/// sockets cost milliseconds, where /proc/PID/net/tcp formats every
/// socket as text. Each dump walks the kernel's whole connection table,
/// which every namespace shares (262,144 buckets on a 24 GiB machine):
/// a capture asks once per namespace and stage, not once per question.
pub fn tcp_sockets_in(ns: BorrowedFd, what: TcpDump) -> SysResult<Vec<TcpDiag>> {
    const INET_DIAG_INFO: u8 = 2;
    let (ext, states, port) = match what {
        TcpDump::Plain => (0, u32::MAX, 0),
        TcpDump::WithInfo => (1 << (INET_DIAG_INFO - 1), u32::MAX, 0),
        // idiag_states: the kernel compares a TIME_WAIT entry's
        // substate, which TcpDiag::state reports too.
        TcpDump::TimeWait => (0, 1u32 << TCP_TIME_WAIT, 0),
        TcpDump::TimeWaitOn(port) => (0, 1u32 << TCP_TIME_WAIT, port),
    };
    let sock = diag_socket_in(ns)?;
    both_families(&sock, ext, states, port)
}

/// The TCP sockets of both families with extensions `ext`, in the states
/// of `states`, at local port `port` (0: any), in one walk of the
/// connection table: the legacy TCPDIAG_GETSOCK dump asks for every
/// family at once (the kernel makes it a request of family AF_UNSPEC),
/// where SOCK_DIAG_BY_FAMILY takes one walk per family (0.38-0.56 ms for
/// one against 0.77-1.0 for two here, a quiet host). A kernel that
/// refuses the legacy request is asked per family.
fn both_families(sock: &OwnedFd, ext: u8, states: u32, port: u16) -> SysResult<Vec<TcpDiag>> {
    match in_one_walk(sock, ext, states, port) {
        // Refused (before any answer): asked the other way.
        Err(e) if matches!(e.errno, libc::EINVAL | libc::ENOENT | libc::EOPNOTSUPP) => {
            per_family(sock, ext, states, port)
        }
        other => other,
    }
}

/// [`both_families`] by the legacy dump alone.
fn in_one_walk(sock: &OwnedFd, ext: u8, states: u32, port: u16) -> SysResult<Vec<TcpDiag>> {
    let mut out = Vec::new();
    let req = legacy_dump_request(ext, states, port);
    dump(sock, &req, |batch| parse_inet_batch(batch, &mut out))?;
    Ok(out)
}

/// [`both_families`] by one SOCK_DIAG_BY_FAMILY dump per family.
fn per_family(sock: &OwnedFd, ext: u8, states: u32, port: u16) -> SysResult<Vec<TcpDiag>> {
    let mut out = Vec::new();
    for family in [libc::AF_INET as u8, libc::AF_INET6 as u8] {
        family_dump(sock, family, (ext, states, port), &mut out)?;
    }
    Ok(out)
}

/// Appends to `out` the TCP sockets of `family` with extensions, states
/// and local port (0: any) `asked`, from one SOCK_DIAG_BY_FAMILY dump.
fn family_dump(
    sock: &OwnedFd,
    family: u8,
    (ext, states, port): (u8, u32, u16),
    out: &mut Vec<TcpDiag>,
) -> SysResult<()> {
    let mut req = inet_dump_request(family, libc::IPPROTO_TCP as u8);
    req[18] = ext;
    req[20..24].copy_from_slice(&states.to_ne_bytes());
    req[24..26].copy_from_slice(&port.to_be_bytes());
    dump(sock, &req, |batch| parse_inet_batch(batch, out))
}

/// The legacy `inet_diag_req` dump of TCP sockets (message type
/// TCPDIAG_GETSOCK): family, address lengths, extensions; the socket id
/// (local port `port`, the rest any); the states; no "dbs".
fn legacy_dump_request(ext: u8, states: u32, port: u16) -> Vec<u8> {
    const TCPDIAG_GETSOCK: u16 = 18;
    const LEN: u32 = 16 + 4 + 48 + 8;
    let mut req = Vec::with_capacity(LEN as usize);
    req.extend_from_slice(&LEN.to_ne_bytes());
    req.extend_from_slice(&TCPDIAG_GETSOCK.to_ne_bytes());
    req.extend_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
    req.extend_from_slice(&1u32.to_ne_bytes());
    req.extend_from_slice(&0u32.to_ne_bytes());
    req.extend_from_slice(&[libc::AF_UNSPEC as u8, 0, 0, ext]);
    req.extend_from_slice(&port.to_be_bytes());
    req.extend_from_slice(&[0u8; 46]);
    req.extend_from_slice(&states.to_ne_bytes());
    req.extend_from_slice(&0u32.to_ne_bytes());
    req
}

/// TCP states as `idiag_states` bits: the listeners, and the handshakes
/// under way (a request socket, TCP_NEW_SYN_RECV, reported as SYN_RECV).
pub const TCPF_LISTEN_OR_SYN_RECV: u32 = (1 << 10) | (1 << 3) | (1 << 12);

/// The TCP sockets of network namespace `ns` of the families in
/// `families` (AF_INET, AF_INET6) in the states of `states` (bit N for
/// state N), in one dump per family (one for both: [`both_families`]).
/// The kernel skips a socket in any
/// other state before it formats it: asking for the listeners and the
/// handshakes under way costs a walk of the connection table (0.25 ms
/// per family here, every bucket of every namespace's table), not the
/// formatting and parsing of every connection of the machine's
/// namespaces (10 ms for 20,000 here).
pub fn tcp_sockets_in_states(
    ns: BorrowedFd,
    families: &[i32],
    states: u32,
) -> SysResult<Vec<TcpDiag>> {
    let sock = diag_socket_in(ns)?;
    if families.contains(&libc::AF_INET) && families.contains(&libc::AF_INET6) {
        return both_families(&sock, 0, states, 0);
    }
    let mut out = Vec::new();
    for &family in families {
        let family = u8::try_from(family)
            .map_err(|_| crate::SysError::new("inet_diag (family)", libc::EINVAL))?;
        family_dump(&sock, family, (0, states, 0), &mut out)?;
    }
    Ok(out)
}

/// A sock_diag socket made in a network namespace, for exact lookups.
pub struct DiagSocket(OwnedFd);

impl DiagSocket {
    pub fn in_netns(ns: BorrowedFd) -> SysResult<DiagSocket> {
        diag_socket_in(ns).map(DiagSocket)
    }

    /// The TCP socket of the namespace with this local and remote
    /// address, looked up by its 4-tuple in the kernel's hash (no walk
    /// of the table), with its shutdown bits; None when there is none.
    pub fn tcp_connection(
        &self,
        local: std::net::SocketAddr,
        remote: std::net::SocketAddr,
    ) -> SysResult<Option<TcpDiag>> {
        self.tcp_socket(&TcpId { local, remote: Some(remote), cookie: None }, TcpDump::Plain)
    }

    /// The TCP socket `id` names, asked alone (SOCK_DIAG_BY_FAMILY
    /// without NLM_F_DUMP): the kernel finds it with one lookup in its
    /// hash (`inet_diag_find_one_icsk`: a connection by its 4-tuple, a
    /// listener by its local address as a SYN to it would be) instead of
    /// a walk of the whole connection table, and answers with the
    /// message and attributes a dump gives it (INET_DIAG_INFO and the
    /// MD5 keys with [`TcpDump::WithInfo`]). None when no socket has that
    /// id, or the one found has another cookie (ENOENT). The socket
    /// found for a listener's address may be another of the namespace
    /// (one of a SO_REUSEPORT group, a dual-stack listener for an IPv4
    /// address): the caller compares the inode or gives the cookie.
    pub fn tcp_socket(&self, id: &TcpId, what: TcpDump) -> SysResult<Option<TcpDiag>> {
        let buf = self.ask(&exact_request(SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, id, what))?;
        exact_answer(&buf)
    }

    /// Ends the TCP socket of the namespace with this local and remote
    /// address (SOCK_DESTROY: the kernel aborts it without a packet, a
    /// TIME_WAIT entry included); false when there was none.
    pub fn destroy_tcp(
        &self,
        local: std::net::SocketAddr,
        remote: std::net::SocketAddr,
    ) -> SysResult<bool> {
        let id = TcpId { local, remote: Some(remote), cookie: None };
        let req = exact_request(SOCK_DESTROY, NLM_F_REQUEST | NLM_F_ACK, &id, TcpDump::Plain);
        let buf = self.ask(&req)?;
        if buf.len() < 20 || u16_at(&buf, 4) != NLMSG_ERROR {
            return Err(crate::SysError::new("SOCK_DESTROY (no acknowledgement)", libc::EIO));
        }
        match -(u32_at(&buf, 16) as i32) {
            0 => Ok(true),
            libc::ENOENT => Ok(false),
            e => Err(crate::SysError::new("SOCK_DESTROY", e)),
        }
    }

    /// Sends one request and returns the kernel's one-message answer.
    fn ask(&self, req: &[u8]) -> SysResult<Vec<u8>> {
        // SAFETY: req is a live buffer of the given length.
        if unsafe { libc::send(self.0.as_raw_fd(), req.as_ptr().cast(), req.len(), 0) } < 0 {
            return Err(last_error("send(sock_diag)"));
        }
        let mut buf = vec![0u8; 8192];
        // SAFETY: buf is a live writable buffer.
        let n = unsafe { libc::recv(self.0.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            return Err(last_error("recv(sock_diag)"));
        }
        buf.truncate(n as usize);
        Ok(buf)
    }
}

/// Which TCP socket an exact inet_diag request names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpId {
    /// Its own address (getsockname). Its family is the request's: a
    /// v6 socket's IPv4-mapped address (::ffff:a.b.c.d) is asked as
    /// AF_INET6, in whose table the socket is.
    pub local: std::net::SocketAddr,
    /// Its peer (getpeername); None for a listener (remote address and
    /// port zero).
    pub remote: Option<std::net::SocketAddr>,
    /// Its SO_COOKIE, when known: the kernel then answers for that
    /// socket only (INET_DIAG_NOCOOKIE, any socket with the addresses,
    /// otherwise).
    pub cookie: Option<u64>,
}

/// The 16 bytes of `ip` in a request of family AF_INET (`v6` false: the
/// address in the first four) or AF_INET6 (an IPv4 address mapped).
fn request_octets(ip: std::net::IpAddr, v6: bool) -> [u8; 16] {
    let mut out = [0u8; 16];
    match (ip, v6) {
        (std::net::IpAddr::V4(a), false) => out[..4].copy_from_slice(&a.octets()),
        (std::net::IpAddr::V4(a), true) => out = a.to_ipv6_mapped().octets(),
        (std::net::IpAddr::V6(a), true) => out = a.octets(),
        (std::net::IpAddr::V6(a), false) => {
            if let Some(v4) = a.to_ipv4_mapped() {
                out[..4].copy_from_slice(&v4.octets());
            }
        }
    }
    out
}

/// `inet_diag_req_v2` naming the TCP socket `id` (no NLM_F_DUMP: the
/// kernel looks it up in its hash), for message `kind` with `flags`.
fn exact_request(kind: u16, flags: u16, id: &TcpId, what: TcpDump) -> Vec<u8> {
    const INET_DIAG_INFO: u8 = 2;
    let v6 = id.local.is_ipv6();
    let family = if v6 { libc::AF_INET6 } else { libc::AF_INET } as u8;
    let mut req = inet_dump_request(family, libc::IPPROTO_TCP as u8);
    req[4..6].copy_from_slice(&kind.to_ne_bytes());
    req[6..8].copy_from_slice(&flags.to_ne_bytes());
    if what == TcpDump::WithInfo {
        req[18] = 1 << (INET_DIAG_INFO - 1);
    }
    let unspecified = if v6 {
        std::net::IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED)
    } else {
        std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED)
    };
    let (remote_ip, remote_port) = id.remote.map_or((unspecified, 0), |r| (r.ip(), r.port()));
    req[24..26].copy_from_slice(&id.local.port().to_be_bytes());
    req[26..28].copy_from_slice(&remote_port.to_be_bytes());
    req[28..44].copy_from_slice(&request_octets(id.local.ip(), v6));
    req[44..60].copy_from_slice(&request_octets(remote_ip, v6));
    // idiag_cookie: two u32, the low half first (sock_diag_check_cookie);
    // all ones is INET_DIAG_NOCOOKIE, any socket with the tuple.
    let cookie = id.cookie.unwrap_or(u64::MAX);
    req[64..68].copy_from_slice(&(cookie as u32).to_ne_bytes());
    req[68..72].copy_from_slice(&((cookie >> 32) as u32).to_ne_bytes());
    req
}

/// The answer to an exact inet_diag request: one socket, or ENOENT.
fn exact_answer(buf: &[u8]) -> SysResult<Option<TcpDiag>> {
    if buf.len() < 16 {
        return Err(crate::SysError::new("inet_diag (short answer)", libc::EIO));
    }
    let len = (u32_at(buf, 0) as usize).min(buf.len());
    if u16_at(buf, 4) == NLMSG_ERROR {
        let errno = if buf.len() >= 20 { -(u32_at(buf, 16) as i32) } else { libc::EIO };
        return match errno {
            // ESTALE: a cookie that is not the socket's (older kernels).
            libc::ENOENT | libc::ESTALE => Ok(None),
            e => Err(crate::SysError::new("inet_diag", e)),
        };
    }
    match parse_inet_diag(&buf[16..len.max(16)]) {
        Some(d) => Ok(Some(d)),
        None => Err(crate::SysError::new("inet_diag (unreadable answer)", libc::EIO)),
    }
}

/// Sends dump request `req` on `sock` and hands each batch of the answer
/// to `on_batch` until it says the batch was the last.
fn dump(
    sock: &OwnedFd,
    req: &[u8],
    mut on_batch: impl FnMut(&[u8]) -> SysResult<Batch>,
) -> SysResult<()> {
    // SAFETY: req is a live buffer of the given length.
    if unsafe { libc::send(sock.as_raw_fd(), req.as_ptr().cast(), req.len(), 0) } < 0 {
        return Err(last_error("send(sock_diag)"));
    }
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        // SAFETY: buf is a live writable buffer.
        let n = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            return Err(last_error("recv(sock_diag)"));
        }
        if on_batch(&buf[..n as usize])? == Batch::Last {
            return Ok(());
        }
    }
}

/// `inet_diag_req_v2` for every socket of one family and protocol.
fn inet_dump_request(family: u8, protocol: u8) -> Vec<u8> {
    let mut req = Vec::with_capacity(72);
    req.extend_from_slice(&72u32.to_ne_bytes());
    req.extend_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    req.extend_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
    req.extend_from_slice(&1u32.to_ne_bytes());
    req.extend_from_slice(&0u32.to_ne_bytes());
    // family, protocol, no extensions, padding; every state.
    req.extend_from_slice(&[family, protocol, 0, 0]);
    req.extend_from_slice(&u32::MAX.to_ne_bytes());
    // inet_diag_sockid: ports, addresses, interface, cookie: any.
    req.extend_from_slice(&[0u8; 48]);
    req
}

/// Appends the sockets of one received batch of inet_diag messages.
fn parse_inet_batch(buf: &[u8], out: &mut Vec<TcpDiag>) -> SysResult<Batch> {
    let mut off = 0usize;
    while off + 16 <= buf.len() {
        let len = u32_at(buf, off) as usize;
        let ty = u16_at(buf, off + 4);
        if len < 16 || off + len > buf.len() || ty == NLMSG_DONE {
            return Ok(Batch::Last);
        }
        if ty == NLMSG_ERROR {
            return Err(crate::SysError::new("inet_diag", -(u32_at(buf, off + 16) as i32)));
        }
        if let Some(d) = parse_inet_diag(&buf[off + 16..off + len]) {
            out.push(d);
        }
        off += (len + 3) & !3;
    }
    Ok(Batch::More)
}

/// One `inet_diag_msg` (72 bytes; ports and addresses in network order).
fn parse_inet_diag(msg: &[u8]) -> Option<TcpDiag> {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
    if msg.len() < 72 {
        return None;
    }
    let family = msg[0];
    let port = |o: usize| u16::from_be_bytes([msg[o], msg[o + 1]]);
    let ip = |o: usize| -> Option<IpAddr> {
        if family == libc::AF_INET as u8 {
            Some(IpAddr::V4(Ipv4Addr::new(msg[o], msg[o + 1], msg[o + 2], msg[o + 3])))
        } else if family == libc::AF_INET6 as u8 {
            Some(IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(&msg[o..o + 16]).ok()?)))
        } else {
            None
        }
    };
    const INET_DIAG_MD5SIG: u16 = 18;
    Some(TcpDiag {
        family,
        state: msg[1],
        local: SocketAddr::new(ip(8)?, port(4)),
        remote: SocketAddr::new(ip(24)?, port(6)),
        rqueue: u32_at(msg, 56),
        inode: u32_at(msg, 68),
        shutdown: shutdown_of(msg).map_or(0, |(_, bits)| bits),
        md5: has_attr(msg, 72, INET_DIAG_MD5SIG),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_inet_diag_message_gives_its_shutdown_bits() {
        let mut m = vec![0u8; 72];
        m[68..72].copy_from_slice(&77u32.to_ne_bytes());
        assert_eq!(shutdown_of(&m), None);
        // INET_DIAG_MARK (15, 4 bytes), then INET_DIAG_SHUTDOWN (8, 1 byte).
        m.extend_from_slice(&[8, 0, 15, 0, 1, 0, 0, 0]);
        m.extend_from_slice(&[5, 0, 8, 0, 2, 0, 0, 0]);
        assert_eq!(shutdown_of(&m), Some((77, 2)));
        // A length running past the message is not read.
        m.truncate(72 + 8 + 4);
        assert_eq!(shutdown_of(&m), None);
    }

    #[test]
    fn an_inet_diag_message_gives_its_addresses_state_and_inode() {
        let mut m = vec![0u8; 72];
        m[0] = libc::AF_INET as u8;
        m[1] = 10;
        m[4..6].copy_from_slice(&7100u16.to_be_bytes());
        m[6..8].copy_from_slice(&0u16.to_be_bytes());
        m[8..12].copy_from_slice(&[192, 0, 2, 1]);
        m[56..60].copy_from_slice(&3u32.to_ne_bytes());
        m[68..72].copy_from_slice(&4242u32.to_ne_bytes());
        let d = parse_inet_diag(&m).expect("parsed");
        assert_eq!(d.local, "192.0.2.1:7100".parse().expect("address"));
        assert_eq!(d.remote, "0.0.0.0:0".parse().expect("address"));
        assert_eq!((d.state, d.rqueue, d.inode), (10, 3, 4242));
        assert!(parse_inet_diag(&m[..71]).is_none());
        m[0] = 99;
        assert!(parse_inet_diag(&m).is_none());
    }

    #[test]
    fn an_exact_request_names_one_socket_without_a_dump() {
        let id = TcpId {
            local: "192.0.2.1:7100".parse().expect("address"),
            remote: Some("198.51.100.2:40000".parse().expect("address")),
            cookie: Some(0x1122_3344_5566_7788),
        };
        let req = exact_request(SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, &id, TcpDump::WithInfo);
        assert_eq!(req.len(), 72);
        assert_eq!(u32_at(&req, 0), 72);
        assert_eq!(u16_at(&req, 4), SOCK_DIAG_BY_FAMILY);
        // NLM_F_REQUEST alone: no NLM_F_DUMP bit.
        assert_eq!(u16_at(&req, 6), NLM_F_REQUEST);
        assert_eq!(&req[16..20], &[libc::AF_INET as u8, libc::IPPROTO_TCP as u8, 2, 0]);
        assert_eq!(u32_at(&req, 20), u32::MAX, "every state");
        assert_eq!(&req[24..28], &[0x1b, 0xbc, 0x9c, 0x40], "ports in network order");
        assert_eq!(&req[28..32], &[192, 0, 2, 1]);
        assert_eq!(&req[32..44], &[0u8; 12]);
        assert_eq!(&req[44..48], &[198, 51, 100, 2]);
        assert_eq!(u32_at(&req, 60), 0, "any interface");
        assert_eq!((u32_at(&req, 64), u32_at(&req, 68)), (0x5566_7788, 0x1122_3344));
        // A listener of a v6 socket at a v4-mapped address: AF_INET6, the
        // remote end zero, no cookie, no extension.
        let id = TcpId {
            local: "[::ffff:127.0.0.1]:80".parse().expect("address"),
            remote: None,
            cookie: None,
        };
        let req = exact_request(SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, &id, TcpDump::Plain);
        assert_eq!(&req[16..19], &[libc::AF_INET6 as u8, libc::IPPROTO_TCP as u8, 0]);
        assert_eq!(&req[24..28], &[0, 80, 0, 0]);
        let mapped = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1];
        assert_eq!(&req[28..44], &mapped);
        assert_eq!(&req[44..60], &[0u8; 16]);
        assert_eq!(&req[64..72], &[0xff; 8], "INET_DIAG_NOCOOKIE");
    }

    #[test]
    fn an_exact_answer_is_the_socket_not_found_or_an_error() {
        let mut msg = vec![0u8; 16 + 72];
        msg[0..4].copy_from_slice(&88u32.to_ne_bytes());
        msg[4..6].copy_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
        msg[16] = libc::AF_INET as u8;
        msg[17] = 10;
        msg[16 + 68..16 + 72].copy_from_slice(&99u32.to_ne_bytes());
        let d = exact_answer(&msg).expect("answer").expect("found");
        assert_eq!((d.state, d.inode), (10, 99));
        let error = |errno: i32| {
            let mut e = vec![0u8; 36];
            e[0..4].copy_from_slice(&36u32.to_ne_bytes());
            e[4..6].copy_from_slice(&NLMSG_ERROR.to_ne_bytes());
            e[16..20].copy_from_slice(&(-errno).to_ne_bytes());
            exact_answer(&e)
        };
        assert_eq!(error(libc::ENOENT), Ok(None));
        assert_eq!(error(libc::ESTALE), Ok(None));
        assert_eq!(error(libc::EPERM).map_err(|e| e.errno), Err(libc::EPERM));
        // A message too short to read is not taken for "not found".
        msg[0..4].copy_from_slice(&40u32.to_ne_bytes());
        assert!(exact_answer(&msg[..40]).is_err());
    }

    #[test]
    fn loopback_is_local_and_a_documentation_address_is_not() {
        let ns = std::fs::File::open("/proc/self/ns/net").expect("own namespace");
        let ns = std::os::fd::AsFd::as_fd(&ns);
        let lo = address_is_local_in(ns, "127.0.0.1".parse().expect("address"));
        assert_eq!(lo, Ok(true));
        // Unless this host binds any address (net.ipv4.ip_nonlocal_bind).
        let nonlocal = std::fs::read_to_string("/proc/sys/net/ipv4/ip_nonlocal_bind")
            .is_ok_and(|v| v.trim() != "0");
        let doc = address_is_local_in(ns, "192.0.2.77".parse().expect("address"));
        assert_eq!(doc, Ok(nonlocal));
    }

    #[test]
    fn the_tcp_dump_of_this_namespace_lists_a_listener_of_ours() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = l.local_addr().expect("address").port();
        let ns = std::fs::File::open("/proc/self/ns/net").expect("own namespace");
        for what in [TcpDump::Plain, TcpDump::WithInfo] {
            let all = tcp_sockets_in(std::os::fd::AsFd::as_fd(&ns), what).expect("dump");
            assert!(
                all.iter().any(|d| d.state == 10 && d.local.port() == port && !d.md5),
                "listener on port {port} missing from {} sockets",
                all.len()
            );
        }
    }

    #[test]
    fn a_dump_by_state_lists_listeners_and_leaves_connections_out() {
        use std::net::{TcpListener, TcpStream};
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = l.local_addr().expect("address");
        let c = TcpStream::connect(addr).expect("connect");
        let (a, _) = l.accept().expect("accept");
        let ns = std::fs::File::open("/proc/self/ns/net").expect("own namespace");
        let fd = std::os::fd::AsFd::as_fd(&ns);
        let both = [libc::AF_INET, libc::AF_INET6];
        let some = tcp_sockets_in_states(fd, &both, TCPF_LISTEN_OR_SYN_RECV).expect("dump");
        assert!(some.iter().any(|d| d.local == addr && d.state == 10), "the listener");
        assert!(some.iter().all(|d| d.state == 10 || d.state == 3), "{some:?}");
        let (cl, al) = (c.local_addr().expect("c"), a.local_addr().expect("a"));
        assert!(!some.iter().any(|d| d.local == cl || d.local == al && d.remote == cl));
        let est = tcp_sockets_in_states(fd, &both, 1 << 1).expect("dump");
        assert!(est.iter().any(|d| d.local == cl && d.remote == al), "the connection");
        assert!(est.iter().all(|d| d.state == 1), "{est:?}");
        // An IPv4 listener is not in the IPv6 dump.
        let v6 =
            tcp_sockets_in_states(fd, &[libc::AF_INET6], TCPF_LISTEN_OR_SYN_RECV).expect("dump");
        assert!(!v6.iter().any(|d| d.local == addr), "{v6:?}");
    }

    #[test]
    fn an_exact_lookup_finds_a_connection_and_its_shutdown_bits() {
        use std::net::{Shutdown, TcpListener, TcpStream};
        for host in ["127.0.0.1:0", "[::1]:0"] {
            let l = TcpListener::bind(host).expect("bind");
            let c = TcpStream::connect(l.local_addr().expect("address")).expect("connect");
            let (a, _) = l.accept().expect("accept");
            c.shutdown(Shutdown::Read).expect("shutdown");
            let ns = std::fs::File::open("/proc/self/ns/net").expect("own namespace");
            let diag = DiagSocket::in_netns(std::os::fd::AsFd::as_fd(&ns)).expect("diag socket");
            let (cl, al) = (c.local_addr().expect("c"), a.local_addr().expect("a"));
            let ours = diag.tcp_connection(cl, al).expect("lookup").expect("found");
            assert_eq!((ours.local, ours.remote, ours.state), (cl, al, 1));
            assert_eq!(ours.shutdown & 1, 1, "{ours:?}");
            let theirs = diag.tcp_connection(al, cl).expect("lookup").expect("found");
            assert_eq!(theirs.shutdown, 0, "{theirs:?}");
            assert_ne!(ours.inode, theirs.inode);
            let mut nobody = cl;
            nobody.set_port(1);
            assert_eq!(diag.tcp_connection(nobody, al).expect("lookup"), None);
        }
    }

    /// A TCP_MD5SIG key for peer `peer` (struct tcp_md5sig: the
    /// address in a sockaddr_storage, flags, prefix length, key length,
    /// interface, 80 bytes of key).
    fn md5_key_for(peer: std::net::IpAddr) -> Vec<u8> {
        let mut sig = vec![0u8; 216];
        match peer {
            std::net::IpAddr::V4(a) => {
                sig[0..2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
                sig[4..8].copy_from_slice(&a.octets());
            }
            std::net::IpAddr::V6(a) => {
                sig[0..2].copy_from_slice(&(libc::AF_INET6 as u16).to_ne_bytes());
                sig[8..24].copy_from_slice(&a.octets());
            }
        }
        sig[130..132].copy_from_slice(&6u16.to_ne_bytes());
        sig[136..142].copy_from_slice(b"secret");
        sig
    }

    /// The id of a socket as a capture reads it: its addresses, its peer
    /// when connected.
    fn id_of(fd: &impl AsRawFd, cookie: Option<u64>) -> TcpId {
        let fd = fd.as_raw_fd();
        let local = crate::socket::address(fd, false).expect("getsockname").expect("address");
        let remote = crate::socket::address(fd, true).expect("getpeername");
        TcpId { local, remote, cookie }
    }

    fn inode_of_socket(fd: &impl std::os::fd::AsFd) -> u32 {
        inode_of(fd.as_fd()).expect("fstat") as u32
    }

    #[test]
    fn a_socket_asked_alone_answers_as_the_dump_lists_it() {
        use std::net::{Shutdown, TcpListener, TcpStream};
        let ns = std::fs::File::open("/proc/self/ns/net").expect("own namespace");
        let ns = std::os::fd::AsFd::as_fd(&ns);
        let diag = DiagSocket::in_netns(ns).expect("diag socket");
        // (listener's address, the address the client connects to):
        // IPv4, IPv6, a v6 listener at a v4-mapped address (its
        // connections v4-mapped at both ends), a dual-stack v6 listener
        // reached by an IPv4 client (the accepted socket v4-mapped).
        let cases = [
            ("127.0.0.1:0", None),
            ("[::1]:0", None),
            ("[::ffff:127.0.0.1]:0", None),
            ("[::]:0", Some("127.0.0.1")),
        ];
        for (bind, reach) in cases {
            let l = TcpListener::bind(bind).expect("bind");
            let mut to = l.local_addr().expect("address");
            if let Some(ip) = reach {
                to.set_ip(ip.parse().expect("address"));
            }
            let c = TcpStream::connect(to).expect("connect");
            let (a, _) = l.accept().expect("accept");
            let key_peer = if l.local_addr().expect("a").is_ipv4() {
                "192.0.2.1".parse().expect("address")
            } else {
                "2001:db8::1".parse().expect("address")
            };
            let sig = md5_key_for(key_peer);
            crate::socket::setsockopt_bytes(
                l.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_MD5SIG,
                &sig,
            )
            .expect("TCP_MD5SIG");
            let mut rounds = 0;
            loop {
                let dump = tcp_sockets_in(ns, TcpDump::WithInfo).expect("dump");
                for what in [TcpDump::WithInfo, TcpDump::Plain] {
                    for (name, ino, id) in [
                        ("listener", inode_of_socket(&l), id_of(&l, None)),
                        ("client", inode_of_socket(&c), id_of(&c, None)),
                        ("accepted", inode_of_socket(&a), id_of(&a, None)),
                    ] {
                        let listed = dump.iter().find(|d| d.inode == ino).copied();
                        let listed = listed.unwrap_or_else(|| panic!("{bind} {name} not dumped"));
                        let alone = diag.tcp_socket(&id, what).expect("lookup");
                        let alone =
                            alone.unwrap_or_else(|| panic!("{bind} {name} {id:?} not found"));
                        // Without INET_DIAG_INFO, no MD5 attribute (as in a plain dump).
                        let want =
                            TcpDiag { md5: listed.md5 && what == TcpDump::WithInfo, ..listed };
                        assert_eq!(alone, want, "{bind} {name} asked alone ({what:?})");
                    }
                }
                let listener = dump.iter().find(|d| d.inode == inode_of_socket(&l));
                assert_eq!(listener.map(|d| d.md5), Some(true), "{bind}: the MD5 key");
                if rounds == 1 {
                    let client = dump.iter().find(|d| d.inode == inode_of_socket(&c));
                    assert_eq!(client.map(|d| d.shutdown), Some(2), "{bind}: SHUT_WR");
                    break;
                }
                c.shutdown(Shutdown::Write).expect("shutdown");
                std::thread::sleep(std::time::Duration::from_millis(20));
                rounds += 1;
            }
            // The cookie names the socket: another's is not answered.
            let cookie = crate::socket::getsockopt_bytes(
                a.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_COOKIE,
                8,
            )
            .expect("SO_COOKIE");
            let cookie = u64::from_ne_bytes(cookie.as_slice().try_into().expect("8 bytes"));
            let found = diag.tcp_socket(&id_of(&a, Some(cookie)), TcpDump::Plain).expect("lookup");
            assert_eq!(found.map(|d| d.inode), Some(inode_of_socket(&a)));
            let other = diag.tcp_socket(&id_of(&a, Some(cookie ^ 1)), TcpDump::Plain);
            assert_eq!(other, Ok(None), "{bind}: another cookie");
            // A closed listener is not found.
            let gone = id_of(&l, None);
            drop(l);
            assert_eq!(diag.tcp_socket(&gone, TcpDump::WithInfo), Ok(None), "{bind}: closed");
        }
    }

    /// One walk of the legacy dump lists each socket of either family as
    /// the dumps per family do, with the same fields (MD5 key with
    /// INET_DIAG_INFO, shutdown bits), and the port filter holds.
    #[test]
    fn one_walk_lists_both_families_as_the_dumps_per_family() {
        use std::net::{Shutdown, TcpListener, TcpStream};
        let ns = std::fs::File::open("/proc/self/ns/net").expect("own namespace");
        let sock = diag_socket_in(std::os::fd::AsFd::as_fd(&ns)).expect("sock_diag");
        let mut ours = Vec::new();
        let mut keep = Vec::new();
        for bind in ["127.0.0.1:0", "[::1]:0"] {
            let l = TcpListener::bind(bind).expect("bind");
            let c = TcpStream::connect(l.local_addr().expect("address")).expect("connect");
            let (a, _) = l.accept().expect("accept");
            c.shutdown(Shutdown::Write).expect("shutdown");
            for s in [inode_of_socket(&l), inode_of_socket(&c), inode_of_socket(&a)] {
                ours.push(s);
            }
            keep.push((l, c, a));
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
        let mine = |v: Vec<TcpDiag>| {
            let mut v: Vec<TcpDiag> = v.into_iter().filter(|d| ours.contains(&d.inode)).collect();
            v.sort_by_key(|d| d.inode);
            v
        };
        for ext in [0, 1 << 1] {
            let one = mine(in_one_walk(&sock, ext, u32::MAX, 0).expect("legacy dump"));
            let two = mine(per_family(&sock, ext, u32::MAX, 0).expect("dumps per family"));
            assert_eq!(one.len(), 6, "{one:?}");
            assert_eq!(one, two, "extensions {ext:#x}");
        }
        let port = keep[1].0.local_addr().expect("v6 listener").port();
        let on_port = in_one_walk(&sock, 0, u32::MAX, port).expect("legacy dump");
        assert!(on_port.iter().all(|d| d.local.port() == port), "{on_port:?}");
        assert_eq!(mine(on_port).len(), 2, "the v6 listener and its accepted socket");
    }

    #[test]
    fn the_tcp_dump_shows_shutdown_bits_and_time_wait() {
        use std::net::{Shutdown, TcpListener, TcpStream};
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = l.local_addr().expect("address");
        let c = TcpStream::connect(addr).expect("connect");
        let (a, _) = l.accept().expect("accept");
        c.shutdown(Shutdown::Read).expect("shutdown");
        let (c_local, a_local) = (c.local_addr().expect("c"), a.local_addr().expect("a"));
        let ns = std::fs::File::open("/proc/self/ns/net").expect("own namespace");
        let dump = || tcp_sockets_in(std::os::fd::AsFd::as_fd(&ns), TcpDump::Plain).expect("dump");
        let all = dump();
        let find = |all: &[TcpDiag], local, remote| {
            all.iter().find(|d| d.local == local && d.remote == remote).copied()
        };
        let ours = find(&all, c_local, a_local).expect("the client's socket");
        assert_eq!((ours.state, ours.shutdown & 1), (1, 1), "{ours:?}");
        let theirs = find(&all, a_local, c_local).expect("the accepted socket");
        assert_eq!(theirs.shutdown, 0, "{theirs:?}");
        // The side that closes first holds the connection in TIME_WAIT.
        drop(c);
        drop(a);
        // The FINs cross in softirq context, which a loaded machine
        // defers to ksoftirqd: up to 2 s for the TIME_WAIT entry.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        let tw = loop {
            let tw = find(&dump(), c_local, a_local).filter(|d| d.state == TCP_TIME_WAIT);
            if tw.is_some() || std::time::Instant::now() >= deadline {
                break tw;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        };
        let tw = tw.expect("the closed connection in TIME_WAIT");
        assert_eq!((tw.state, tw.inode), (TCP_TIME_WAIT, 0), "{tw:?}");
        // The TIME_WAIT dump has it, and nothing in another state.
        let only = tcp_sockets_in(std::os::fd::AsFd::as_fd(&ns), TcpDump::TimeWait).expect("dump");
        assert_eq!(find(&only, c_local, a_local), Some(tw));
        assert!(only.iter().all(|d| d.state == TCP_TIME_WAIT), "{only:?}");
        // By its port: it alone, and not in another port's.
        let port = c_local.port();
        let on = tcp_sockets_in(std::os::fd::AsFd::as_fd(&ns), TcpDump::TimeWaitOn(port));
        let on = on.expect("dump");
        assert_eq!(find(&on, c_local, a_local), Some(tw));
        assert!(on.iter().all(|d| d.state == TCP_TIME_WAIT && d.local.port() == port), "{on:?}");
        let other = TcpDump::TimeWaitOn(port.wrapping_add(1).max(1));
        let off = tcp_sockets_in(std::os::fd::AsFd::as_fd(&ns), other).expect("dump");
        assert_eq!(find(&off, c_local, a_local), None);
        let listening =
            tcp_sockets_in(std::os::fd::AsFd::as_fd(&ns), TcpDump::Plain).expect("dump");
        assert!(listening.iter().any(|d| d.local == addr && d.state == 10), "the listener");
        assert!(!only.iter().any(|d| d.local == addr && d.remote.port() == 0), "no listener");
    }

    #[test]
    fn destroy_ends_a_time_wait_entry_and_nothing_else() {
        use std::net::{TcpListener, TcpStream};
        let ns = std::fs::File::open("/proc/self/ns/net").expect("own namespace");
        let diag = DiagSocket::in_netns(std::os::fd::AsFd::as_fd(&ns)).expect("diag socket");
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let c = TcpStream::connect(l.local_addr().expect("address")).expect("connect");
        let (a, _) = l.accept().expect("accept");
        let (c_local, a_local) = (c.local_addr().expect("c"), a.local_addr().expect("a"));
        // The side that closes first ends in TIME_WAIT.
        drop(c);
        std::thread::sleep(std::time::Duration::from_millis(20));
        let other = TcpStream::connect(l.local_addr().expect("address")).expect("connect");
        drop(a);
        std::thread::sleep(std::time::Duration::from_millis(50));
        let tw = diag.tcp_connection(c_local, a_local).expect("lookup").expect("in TIME_WAIT");
        assert_eq!(tw.state, TCP_TIME_WAIT, "{tw:?}");
        assert!(diag.destroy_tcp(c_local, a_local).expect("destroy"));
        assert_eq!(diag.tcp_connection(c_local, a_local).expect("lookup"), None);
        assert!(!diag.destroy_tcp(c_local, a_local).expect("destroy again"));
        // A live connection of someone else's is not this test's to end:
        // only the tuple asked for goes.
        let live = other.local_addr().expect("other");
        let found = diag.tcp_connection(live, l.local_addr().expect("l")).expect("lookup");
        assert_eq!(found.map(|d| d.state), Some(1), "the other connection");
    }
}
