//! IPv4/IPv6 sockets: listening TCP and bound UDP sockets, with their
//! address, backlog and options. Established connections, connected UDP
//! sockets and sockets with queued data are refused by name.

use super::FdInfo;
use crate::error::Result;
use ferry_image::{FileKind, InetSocket, SockOpt};
use std::os::fd::{AsRawFd, RawFd};

fn getsockopt_int(fd: RawFd, level: i32, name: i32) -> Option<i32> {
    let mut v: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: v/len are valid out buffers for an int option.
    let r = unsafe { libc::getsockopt(fd, level, name, &mut v as *mut _ as *mut libc::c_void, &mut len) };
    (r == 0).then_some(v)
}

fn sockaddr(fd: RawFd, peer: bool) -> Option<(Vec<u8>, u16)> {
    // SAFETY: sockaddr_storage is plain data.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    let p = &mut ss as *mut _ as *mut libc::sockaddr;
    // SAFETY: ss/len describe a buffer large enough for any address.
    let r = unsafe { if peer { libc::getpeername(fd, p, &mut len) } else { libc::getsockname(fd, p, &mut len) } };
    if r != 0 {
        return None;
    }
    match ss.ss_family as i32 {
        libc::AF_INET => {
            // SAFETY: the kernel filled a sockaddr_in.
            let sin = unsafe { &*(&ss as *const _ as *const libc::sockaddr_in) };
            Some((sin.sin_addr.s_addr.to_ne_bytes().to_vec(), u16::from_be(sin.sin_port)))
        }
        libc::AF_INET6 => {
            // SAFETY: the kernel filled a sockaddr_in6.
            let sin6 = unsafe { &*(&ss as *const _ as *const libc::sockaddr_in6) };
            Some((sin6.sin6_addr.s6_addr.to_vec(), u16::from_be(sin6.sin6_port)))
        }
        _ => None,
    }
}

fn tcp_info(fd: RawFd) -> Option<libc::tcp_info> {
    // SAFETY: tcp_info is plain data.
    let mut ti: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: ti/len are a valid out buffer.
    let r = unsafe { libc::getsockopt(fd, libc::IPPROTO_TCP, libc::TCP_INFO, &mut ti as *mut _ as *mut libc::c_void, &mut len) };
    (r == 0).then_some(ti)
}

/// Options restore re-applies (only non-zero values are stored, except
/// IPV6_V6ONLY whose default depends on a sysctl).
const OPTIONS: &[(i32, i32)] = &[
    (libc::SOL_SOCKET, libc::SO_REUSEADDR),
    (libc::SOL_SOCKET, libc::SO_REUSEPORT),
    (libc::SOL_SOCKET, libc::SO_KEEPALIVE),
    (libc::SOL_SOCKET, libc::SO_BROADCAST),
    (libc::SOL_SOCKET, libc::SO_PRIORITY),
    (libc::SOL_SOCKET, libc::SO_MARK),
    (libc::IPPROTO_IP, libc::IP_FREEBIND),
    (libc::IPPROTO_IP, libc::IP_TRANSPARENT),
];
const TCP_OPTIONS: &[(i32, i32)] = &[(libc::IPPROTO_TCP, libc::TCP_NODELAY), (libc::IPPROTO_TCP, libc::TCP_DEFER_ACCEPT)];

pub fn capture(info: &FdInfo) -> Result<FileKind> {
    let sock = info.dup()?;
    let fd = sock.as_raw_fd();
    let family = getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_DOMAIN).unwrap_or(-1);
    let sock_type = getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_TYPE).unwrap_or(-1);
    let protocol = getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_PROTOCOL).unwrap_or(-1);
    let family_name = match family {
        libc::AF_INET | libc::AF_INET6 => "",
        libc::AF_UNIX => "unix sockets are not supported yet",
        libc::AF_NETLINK => "netlink sockets are not supported yet",
        libc::AF_PACKET => "packet sockets are not supported yet",
        _ => "this socket family is not supported",
    };
    if !family_name.is_empty() {
        return Err(info.unsupported(family_name));
    }
    let (addr, port) = sockaddr(fd, false).ok_or_else(|| info.unsupported("cannot read the socket's address"))?;
    let tcp = sock_type == libc::SOCK_STREAM && protocol == libc::IPPROTO_TCP;
    let udp = sock_type == libc::SOCK_DGRAM && protocol == libc::IPPROTO_UDP;
    if !tcp && !udp {
        return Err(info.unsupported("only TCP and UDP sockets are supported"));
    }
    if let Some((paddr, pport)) = sockaddr(fd, true) {
        let what = if tcp { "established TCP connection" } else { "connected UDP socket" };
        let peer = if paddr.len() == 4 {
            format!("{}.{}.{}.{}:{pport}", paddr[0], paddr[1], paddr[2], paddr[3])
        } else {
            format!("[{}]:{pport}", std::net::Ipv6Addr::from(<[u8; 16]>::try_from(paddr.as_slice()).unwrap_or([0; 16])))
        };
        return Err(info.unsupported(format!("{what} to {peer} (connection migration comes with TCP repair support)")));
    }
    let mut listen_backlog = None;
    if tcp && getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_ACCEPTCONN) == Some(1) {
        let ti = tcp_info(fd).ok_or_else(|| info.unsupported("cannot read TCP_INFO"))?;
        // For a listener the kernel reports the accept queue in
        // tcpi_unacked and its limit (the listen backlog) in tcpi_sacked.
        if ti.tcpi_unacked > 0 {
            return Err(info.unsupported(format!("{} connections wait in its accept queue", ti.tcpi_unacked)));
        }
        listen_backlog = Some(ti.tcpi_sacked as i32);
    }
    if udp {
        let queued = ferry_sys::fd::bytes_readable(fd).unwrap_or(0);
        if queued > 0 {
            return Err(info.unsupported(format!("{queued} bytes of datagrams are queued")));
        }
    }
    let mut options = Vec::new();
    for &(level, name) in OPTIONS.iter().chain(if tcp { TCP_OPTIONS } else { &[] }) {
        if level == libc::IPPROTO_IP && family != libc::AF_INET {
            continue;
        }
        match getsockopt_int(fd, level, name) {
            Some(v) if v != 0 => options.push(SockOpt { level, name, value: v }),
            _ => {}
        }
    }
    if family == libc::AF_INET6 {
        let v = getsockopt_int(fd, libc::IPPROTO_IPV6, libc::IPV6_V6ONLY).unwrap_or(0);
        options.push(SockOpt { level: libc::IPPROTO_IPV6, name: libc::IPV6_V6ONLY, value: v });
    }
    Ok(FileKind::InetSocket(InetSocket { family, sock_type, protocol, addr, port, listen_backlog, options }))
}
