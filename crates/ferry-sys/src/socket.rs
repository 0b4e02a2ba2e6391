//! Socket calls on descriptors ferry owns or duplicated from a target:
//! options, addresses, and the TCP repair interface (TCP_REPAIR and
//! friends) that reads and rebuilds an established connection without
//! the peer noticing.

use crate::{last_error, SysResult};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

// <linux/tcp.h> values the libc crate does not carry.
pub const TCP_REPAIR: i32 = 19;
pub const TCP_REPAIR_QUEUE: i32 = 20;
pub const TCP_QUEUE_SEQ: i32 = 21;
pub const TCP_REPAIR_OPTIONS: i32 = 22;
pub const TCP_TIMESTAMP: i32 = 24;
pub const TCP_REPAIR_WINDOW: i32 = 29;
pub const TCP_NO_QUEUE: i32 = 0;
pub const TCP_RECV_QUEUE: i32 = 1;
pub const TCP_SEND_QUEUE: i32 = 2;
/// TCP_REPAIR value that leaves repair mode without sending a window probe.
pub const TCP_REPAIR_OFF_NO_WP: i32 = -1;
/// SO_BUF_LOCK (5.14): which of SO_SNDBUF/SO_RCVBUF the application fixed.
pub const SO_BUF_LOCK: i32 = 72;
/// SIOCOUTQNSD: bytes of the send queue not sent yet.
const SIOCOUTQNSD: libc::c_ulong = 0x894B;
const SIOCOUTQ: libc::c_ulong = libc::TIOCOUTQ as libc::c_ulong;
const SIOCINQ: libc::c_ulong = libc::FIONREAD as libc::c_ulong;

// TCP option codes for TCP_REPAIR_OPTIONS.
pub const TCPOPT_MAXSEG: u32 = 2;
pub const TCPOPT_WINDOW: u32 = 3;
pub const TCPOPT_SACK_PERM: u32 = 4;
pub const TCPOPT_TIMESTAMP: u32 = 8;

/// `struct tcp_repair_window`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RepairWindow {
    pub snd_wl1: u32,
    pub snd_wnd: u32,
    pub max_window: u32,
    pub rcv_wnd: u32,
    pub rcv_wup: u32,
}

pub fn socket(family: i32, sock_type: i32, protocol: i32) -> SysResult<OwnedFd> {
    // SAFETY: plain integers.
    let fd = unsafe { libc::socket(family, sock_type | libc::SOCK_CLOEXEC, protocol) };
    if fd < 0 {
        return Err(last_error("socket"));
    }
    // SAFETY: a new descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

pub fn getsockopt_bytes(fd: RawFd, level: i32, name: i32, max: usize) -> SysResult<Vec<u8>> {
    let mut buf = vec![0u8; max];
    let mut len = max as libc::socklen_t;
    // SAFETY: buf/len describe a writable buffer of `max` bytes.
    let r = unsafe { libc::getsockopt(fd, level, name, buf.as_mut_ptr().cast(), &mut len) };
    if r < 0 {
        return Err(last_error("getsockopt"));
    }
    buf.truncate(len as usize);
    Ok(buf)
}

/// The length an option reports when given no room: SO_GET_FILTER
/// answers with its number of instructions this way (a buffer would be
/// taken as room for that many instructions, not bytes).
pub fn getsockopt_len(fd: RawFd, level: i32, name: i32) -> SysResult<u32> {
    let mut len: libc::socklen_t = 0;
    let mut dummy = [0u8; 8];
    // SAFETY: with len 0 the kernel writes nothing to the buffer.
    let r = unsafe { libc::getsockopt(fd, level, name, dummy.as_mut_ptr().cast(), &mut len) };
    if r < 0 {
        return Err(last_error("getsockopt"));
    }
    Ok(len)
}

/// Whether socket `fd` joined multicast `group` on interface `ifindex`:
/// MCAST_MSFILTER answers for the socket's own memberships only
/// (EADDRNOTAVAIL otherwise).
pub fn is_multicast_member(fd: RawFd, ifindex: u32, group: &std::net::IpAddr) -> bool {
    // struct group_filter: interface, padding, group (sockaddr_storage
    // at 8), mode and source count at 136, one source at 144.
    let mut gf = [0u8; 272];
    gf[..4].copy_from_slice(&ifindex.to_ne_bytes());
    let level = match group {
        std::net::IpAddr::V4(a) => {
            gf[8..10].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
            gf[12..16].copy_from_slice(&a.octets());
            libc::IPPROTO_IP
        }
        std::net::IpAddr::V6(a) => {
            gf[8..10].copy_from_slice(&(libc::AF_INET6 as u16).to_ne_bytes());
            gf[16..32].copy_from_slice(&a.octets());
            libc::IPPROTO_IPV6
        }
    };
    let mut len = gf.len() as libc::socklen_t;
    // SAFETY: gf is a live buffer of len bytes, read and written by the kernel.
    let r = unsafe {
        libc::getsockopt(fd, level, libc::MCAST_MSFILTER, gf.as_mut_ptr().cast(), &mut len)
    };
    r == 0
}

pub fn getsockopt_int(fd: RawFd, level: i32, name: i32) -> SysResult<i32> {
    let b = getsockopt_bytes(fd, level, name, 4)?;
    Ok(b.get(..4).map_or(0, |b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]])))
}

/// SO_MEMINFO (4.12): the socket's memory counters, in the order of
/// the kernel's SK_MEMINFO_* indices.
pub const SO_MEMINFO: i32 = 55;

/// The socket's send and receive buffer sizes (sk_sndbuf, sk_rcvbuf) in
/// one call: SO_MEMINFO reports the very fields SO_SNDBUF and SO_RCVBUF
/// read (two calls), at indices SK_MEMINFO_SNDBUF and SK_MEMINFO_RCVBUF.
pub fn buffer_sizes(fd: RawFd) -> SysResult<(i32, i32)> {
    let b = getsockopt_bytes(fd, libc::SOL_SOCKET, SO_MEMINFO, 4 * 4)
        .map_err(|e| crate::SysError::new("getsockopt(SO_MEMINFO)", e.errno))?;
    let at = |i: libc::c_int| -> Option<i32> {
        let o = i as usize * 4;
        Some(i32::from_ne_bytes(b.get(o..o + 4)?.try_into().ok()?))
    };
    match (at(libc::SK_MEMINFO_SNDBUF), at(libc::SK_MEMINFO_RCVBUF)) {
        (Some(snd), Some(rcv)) => Ok((snd, rcv)),
        _ => Err(crate::SysError::new("getsockopt(SO_MEMINFO): short answer", libc::EINVAL)),
    }
}

pub fn setsockopt_bytes(fd: RawFd, level: i32, name: i32, value: &[u8]) -> SysResult<()> {
    // SAFETY: value is a live buffer of the length passed.
    let r = unsafe {
        libc::setsockopt(fd, level, name, value.as_ptr().cast(), value.len() as libc::socklen_t)
    };
    if r < 0 {
        Err(last_error("setsockopt"))
    } else {
        Ok(())
    }
}

pub fn setsockopt_int(fd: RawFd, level: i32, name: i32, value: i32) -> SysResult<()> {
    setsockopt_bytes(fd, level, name, &value.to_ne_bytes())
}

fn from_storage(ss: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match ss.ss_family as i32 {
        libc::AF_INET => {
            // SAFETY: the kernel filled a sockaddr_in.
            let sin = unsafe { &*(ss as *const _ as *const libc::sockaddr_in) };
            let ip = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
            Some(SocketAddr::new(IpAddr::V4(ip), u16::from_be(sin.sin_port)))
        }
        libc::AF_INET6 => {
            // SAFETY: the kernel filled a sockaddr_in6.
            let sin6 = unsafe { &*(ss as *const _ as *const libc::sockaddr_in6) };
            let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            Some(SocketAddr::new(IpAddr::V6(ip), u16::from_be(sin6.sin6_port)))
        }
        _ => None,
    }
}

/// The address in the form bind/connect take, for `family` (an IPv4
/// address given to an AF_INET6 socket becomes v4-mapped).
fn to_storage(family: i32, addr: &SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain data.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    if family == libc::AF_INET {
        // SAFETY: sockaddr_storage is large enough for sockaddr_in.
        let sin = unsafe { &mut *(&mut ss as *mut _ as *mut libc::sockaddr_in) };
        sin.sin_family = libc::AF_INET as u16;
        sin.sin_port = addr.port().to_be();
        let ip = match addr.ip() {
            IpAddr::V4(v4) => v4,
            IpAddr::V6(v6) => v6.to_ipv4_mapped().unwrap_or(Ipv4Addr::UNSPECIFIED),
        };
        sin.sin_addr.s_addr = u32::from(ip).to_be();
        (ss, std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t)
    } else {
        // SAFETY: sockaddr_storage is large enough for sockaddr_in6.
        let sin6 = unsafe { &mut *(&mut ss as *mut _ as *mut libc::sockaddr_in6) };
        sin6.sin6_family = libc::AF_INET6 as u16;
        sin6.sin6_port = addr.port().to_be();
        let ip = match addr.ip() {
            IpAddr::V4(v4) => v4.to_ipv6_mapped(),
            IpAddr::V6(v6) => v6,
        };
        sin6.sin6_addr.s6_addr = ip.octets();
        (ss, std::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t)
    }
}

/// The socket's own address (getsockname) or its peer's (getpeername).
pub fn address(fd: RawFd, peer: bool) -> SysResult<Option<SocketAddr>> {
    // SAFETY: sockaddr_storage is plain data.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    let p = &mut ss as *mut _ as *mut libc::sockaddr;
    // SAFETY: ss/len describe a buffer large enough for any address.
    let r = unsafe {
        if peer {
            libc::getpeername(fd, p, &mut len)
        } else {
            libc::getsockname(fd, p, &mut len)
        }
    };
    if r < 0 {
        let e = last_error(if peer { "getpeername" } else { "getsockname" });
        return if peer && e.errno == libc::ENOTCONN { Ok(None) } else { Err(e) };
    }
    Ok(from_storage(&ss))
}

pub fn bind(fd: RawFd, family: i32, addr: &SocketAddr) -> SysResult<()> {
    let (ss, len) = to_storage(family, addr);
    // SAFETY: ss holds a valid address of `len` bytes.
    let r = unsafe { libc::bind(fd, &ss as *const _ as *const libc::sockaddr, len) };
    if r < 0 {
        Err(last_error("bind"))
    } else {
        Ok(())
    }
}

pub fn connect(fd: RawFd, family: i32, addr: &SocketAddr) -> SysResult<()> {
    let (ss, len) = to_storage(family, addr);
    // SAFETY: ss holds a valid address of `len` bytes.
    let r = unsafe { libc::connect(fd, &ss as *const _ as *const libc::sockaddr, len) };
    if r < 0 {
        Err(last_error("connect"))
    } else {
        Ok(())
    }
}

pub fn listen(fd: RawFd, backlog: i32) -> SysResult<()> {
    // SAFETY: integer arguments.
    let r = unsafe { libc::listen(fd, backlog) };
    if r < 0 {
        Err(last_error("listen"))
    } else {
        Ok(())
    }
}

pub fn tcp_info(fd: RawFd) -> SysResult<libc::tcp_info> {
    // SAFETY: tcp_info is plain data.
    let mut ti: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: ti/len are a valid out buffer.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            &mut ti as *mut _ as *mut libc::c_void,
            &mut len,
        )
    };
    if r < 0 {
        Err(last_error("getsockopt(TCP_INFO)"))
    } else {
        Ok(ti)
    }
}

fn ioctl_int(fd: RawFd, req: libc::c_ulong, name: &'static str) -> SysResult<u32> {
    let mut n: libc::c_int = 0;
    // SAFETY: the requests used here write one int.
    let r = unsafe { libc::ioctl(fd, req as _, &mut n) };
    if r < 0 {
        Err(last_error(name))
    } else {
        Ok(n as u32)
    }
}

/// Bytes in the receive queue not read yet.
pub fn inq(fd: RawFd) -> SysResult<u32> {
    ioctl_int(fd, SIOCINQ, "ioctl(SIOCINQ)")
}
/// Bytes in the send queue: sent but not acknowledged, plus not sent.
pub fn outq(fd: RawFd) -> SysResult<u32> {
    ioctl_int(fd, SIOCOUTQ, "ioctl(SIOCOUTQ)")
}
/// Bytes in the send queue that were never sent.
pub fn outq_unsent(fd: RawFd) -> SysResult<u32> {
    ioctl_int(fd, SIOCOUTQNSD, "ioctl(SIOCOUTQNSD)")
}

/// Turns TCP repair mode on (1), off (0) or off without a window probe
/// (TCP_REPAIR_OFF_NO_WP).
pub fn set_repair(fd: RawFd, mode: i32) -> SysResult<()> {
    setsockopt_int(fd, libc::IPPROTO_TCP, TCP_REPAIR, mode)
        .map_err(|e| crate::SysError::new("setsockopt(TCP_REPAIR)", e.errno))
}

pub fn set_repair_queue(fd: RawFd, queue: i32) -> SysResult<()> {
    setsockopt_int(fd, libc::IPPROTO_TCP, TCP_REPAIR_QUEUE, queue)
        .map_err(|e| crate::SysError::new("setsockopt(TCP_REPAIR_QUEUE)", e.errno))
}

/// The sequence number at the end of the selected queue (repair mode).
pub fn queue_seq(fd: RawFd) -> SysResult<u32> {
    getsockopt_int(fd, libc::IPPROTO_TCP, TCP_QUEUE_SEQ)
        .map(|v| v as u32)
        .map_err(|e| crate::SysError::new("getsockopt(TCP_QUEUE_SEQ)", e.errno))
}

pub fn set_queue_seq(fd: RawFd, seq: u32) -> SysResult<()> {
    setsockopt_int(fd, libc::IPPROTO_TCP, TCP_QUEUE_SEQ, seq as i32)
        .map_err(|e| crate::SysError::new("setsockopt(TCP_QUEUE_SEQ)", e.errno))
}

/// Copies up to `len` bytes of the selected queue without consuming them
/// (in repair mode the send queue too). One call: a second peek would
/// start at the head of the queue again.
pub fn peek_queue(fd: RawFd, len: usize) -> SysResult<Vec<u8>> {
    let mut buf = vec![0u8; len];
    if len == 0 {
        return Ok(buf);
    }
    // SAFETY: the buffer has len writable bytes.
    let r = unsafe {
        libc::recv(fd, buf.as_mut_ptr().cast(), len, libc::MSG_PEEK | libc::MSG_DONTWAIT)
    };
    if r < 0 {
        return Err(last_error("recv(MSG_PEEK)"));
    }
    buf.truncate(r as usize);
    Ok(buf)
}

/// Copies the selected queue (repair mode) into `buf` without consuming
/// it and returns how many bytes it holds, when they fit: `None` when
/// `buf` filled up (the queue may hold more: peek again with a larger
/// one). One call instead of a length (SIOCINQ, SIOCOUTQ) and a peek.
/// An empty queue gives 0.
pub fn peek_whole_queue(fd: RawFd, buf: &mut [u8]) -> SysResult<Option<usize>> {
    // SAFETY: the buffer has buf.len() writable bytes.
    let r = unsafe {
        libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_PEEK | libc::MSG_DONTWAIT)
    };
    if r < 0 {
        let e = last_error("recv(MSG_PEEK)");
        return if e.errno == libc::EAGAIN { Ok(Some(0)) } else { Err(e) };
    }
    let n = r as usize;
    Ok((n < buf.len()).then_some(n))
}

/// Sends all of `data`, waiting up to `timeout_ms` in total for room.
/// In repair mode this fills the selected queue instead of sending.
pub fn send_all(fd: RawFd, data: &[u8], timeout_ms: i32) -> SysResult<()> {
    let mut off = 0;
    let deadline =
        std::time::Instant::now() + std::time::Duration::from_millis(timeout_ms.max(0) as u64);
    while off < data.len() {
        // SAFETY: data[off..] is a live buffer.
        let r = unsafe {
            libc::send(
                fd,
                data[off..].as_ptr().cast(),
                data.len() - off,
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        if r > 0 {
            off += r as usize;
            continue;
        }
        let e = last_error("send");
        if r < 0 && e.errno != libc::EAGAIN && e.errno != libc::ENOMEM && e.errno != libc::EINTR {
            return Err(e);
        }
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Err(crate::SysError::new("send (no room in the queue)", libc::ETIMEDOUT));
        }
        let mut pfd = libc::pollfd { fd, events: libc::POLLOUT, revents: 0 };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut pfd, 1, (left.as_millis() as i32).clamp(1, 50)) };
    }
    Ok(())
}

/// Sets the TCP options negotiated at connection time (repair mode,
/// after connect): `opts` holds (TCPOPT_* code, value) pairs.
pub fn set_repair_options(fd: RawFd, opts: &[(u32, u32)]) -> SysResult<()> {
    let mut bytes = Vec::with_capacity(opts.len() * 8);
    for (code, val) in opts {
        bytes.extend_from_slice(&code.to_ne_bytes());
        bytes.extend_from_slice(&val.to_ne_bytes());
    }
    setsockopt_bytes(fd, libc::IPPROTO_TCP, TCP_REPAIR_OPTIONS, &bytes)
        .map_err(|e| crate::SysError::new("setsockopt(TCP_REPAIR_OPTIONS)", e.errno))
}

pub fn repair_window(fd: RawFd) -> SysResult<RepairWindow> {
    let b = getsockopt_bytes(
        fd,
        libc::IPPROTO_TCP,
        TCP_REPAIR_WINDOW,
        std::mem::size_of::<RepairWindow>(),
    )
    .map_err(|e| crate::SysError::new("getsockopt(TCP_REPAIR_WINDOW)", e.errno))?;
    let w = |i: usize| {
        b.get(i * 4..i * 4 + 4).map_or(0, |s| u32::from_ne_bytes([s[0], s[1], s[2], s[3]]))
    };
    Ok(RepairWindow {
        snd_wl1: w(0),
        snd_wnd: w(1),
        max_window: w(2),
        rcv_wnd: w(3),
        rcv_wup: w(4),
    })
}

pub fn set_repair_window(fd: RawFd, win: &RepairWindow) -> SysResult<()> {
    let mut b = Vec::with_capacity(20);
    for v in [win.snd_wl1, win.snd_wnd, win.max_window, win.rcv_wnd, win.rcv_wup] {
        b.extend_from_slice(&v.to_ne_bytes());
    }
    setsockopt_bytes(fd, libc::IPPROTO_TCP, TCP_REPAIR_WINDOW, &b)
        .map_err(|e| crate::SysError::new("setsockopt(TCP_REPAIR_WINDOW)", e.errno))
}

pub fn shutdown(fd: RawFd, how: i32) -> SysResult<()> {
    // SAFETY: integer arguments.
    let r = unsafe { libc::shutdown(fd, how) };
    if r < 0 {
        Err(last_error("shutdown"))
    } else {
        Ok(())
    }
}

pub fn accept(fd: RawFd) -> SysResult<Option<OwnedFd>> {
    // SAFETY: no address wanted: null pointers are allowed.
    let r = unsafe {
        libc::accept4(
            fd,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
        )
    };
    if r < 0 {
        let e = last_error("accept4");
        return if e.errno == libc::EAGAIN { Ok(None) } else { Err(e) };
    }
    // SAFETY: a new descriptor nobody else owns.
    Ok(Some(unsafe { OwnedFd::from_raw_fd(r) }))
}

/// The `sun_path` bytes of a unix socket's own name (getsockname) or of
/// what it is connected to (getpeername): empty for an unnamed socket, a
/// leading NUL for an abstract name, no trailing NULs for a path.
pub fn unix_name(fd: RawFd, peer: bool) -> SysResult<Vec<u8>> {
    // SAFETY: sockaddr_un is plain data.
    let mut sun: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
    let p = &mut sun as *mut _ as *mut libc::sockaddr;
    // SAFETY: sun/len describe a writable sockaddr_un.
    let r = unsafe {
        if peer {
            libc::getpeername(fd, p, &mut len)
        } else {
            libc::getsockname(fd, p, &mut len)
        }
    };
    if r != 0 {
        return Err(last_error(if peer { "getpeername" } else { "getsockname" }));
    }
    let n = (len as usize).saturating_sub(2).min(sun.sun_path.len());
    let mut name: Vec<u8> = sun.sun_path[..n].iter().map(|&c| c as u8).collect();
    if name.first() != Some(&0) {
        while name.last() == Some(&0) {
            name.pop();
        }
    }
    Ok(name)
}

/// Longest `sun_path` of a unix socket name (its NUL terminator included).
pub const UNIX_PATH_MAX: usize = 108;

/// The sockaddr_un for `sun_path` bytes `name` (a path, or a leading NUL
/// for an abstract name) and its length.
fn unix_addr(name: &[u8], call: &'static str) -> SysResult<(libc::sockaddr_un, libc::socklen_t)> {
    // SAFETY: sockaddr_un is plain data.
    let mut sun: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    sun.sun_family = libc::AF_UNIX as u16;
    if name.is_empty() || name.len() >= sun.sun_path.len() {
        return Err(crate::SysError::new(call, libc::EINVAL));
    }
    for (d, s) in sun.sun_path.iter_mut().zip(name) {
        *d = *s as libc::c_char;
    }
    let len = 2 + name.len() + usize::from(name[0] != 0);
    Ok((sun, len as libc::socklen_t))
}

/// connect(2) of a unix socket to `name` (`sun_path` bytes: a path,
/// relative to the current directory, or a leading NUL for an abstract
/// name).
pub fn unix_connect(fd: RawFd, name: &[u8]) -> SysResult<()> {
    let (sun, len) = unix_addr(name, "connect (unix name too long or empty)")?;
    // SAFETY: sun holds a valid address of `len` bytes.
    let r = unsafe { libc::connect(fd, &sun as *const _ as *const libc::sockaddr, len) };
    if r < 0 {
        Err(last_error("connect"))
    } else {
        Ok(())
    }
}

/// bind(2) of a unix socket to `name` (as for [`unix_connect`]).
pub fn unix_bind(fd: RawFd, name: &[u8]) -> SysResult<()> {
    let (sun, len) = unix_addr(name, "bind (unix name too long or empty)")?;
    // SAFETY: sun holds a valid address of `len` bytes.
    let r = unsafe { libc::bind(fd, &sun as *const _ as *const libc::sockaddr, len) };
    if r < 0 {
        Err(last_error("bind"))
    } else {
        Ok(())
    }
}

/// socketpair(2) of two connected sockets (close-on-exec).
pub fn socketpair(family: i32, sock_type: i32) -> SysResult<(OwnedFd, OwnedFd)> {
    let mut sv = [0i32; 2];
    // SAFETY: sv has room for the two descriptors the kernel writes.
    if unsafe { libc::socketpair(family, sock_type | libc::SOCK_CLOEXEC, 0, sv.as_mut_ptr()) } < 0 {
        return Err(last_error("socketpair"));
    }
    // SAFETY: the kernel just returned these two new descriptors to us.
    Ok(unsafe { (OwnedFd::from_raw_fd(sv[0]), OwnedFd::from_raw_fd(sv[1])) })
}
