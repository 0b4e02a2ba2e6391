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

fn getsockopt_bytes(fd: RawFd, level: i32, name: i32) -> Option<Vec<u8>> {
    let mut buf = [0u8; 64];
    let mut len = buf.len() as libc::socklen_t;
    // SAFETY: buf/len describe a writable buffer.
    let r = unsafe { libc::getsockopt(fd, level, name, buf.as_mut_ptr().cast(), &mut len) };
    (r == 0).then(|| buf[..len as usize].to_vec())
}

fn sysctl_int(path: &str, field: usize) -> Option<i32> {
    std::fs::read_to_string(path).ok()?.split_whitespace().nth(field)?.parse().ok()
}

/// Options restore re-applies, with the value they have when nobody set
/// them (None: all zero bytes). Buffer sizes are compared with the sysctl
/// defaults, so autotuned buffers stay autotuned.
fn option_defaults(family: i32, tcp: bool) -> Vec<(i32, i32, Option<i32>)> {
    let (rmem, wmem) = if tcp {
        (sysctl_int("/proc/sys/net/ipv4/tcp_rmem", 1), sysctl_int("/proc/sys/net/ipv4/tcp_wmem", 1))
    } else {
        (sysctl_int("/proc/sys/net/core/rmem_default", 0), sysctl_int("/proc/sys/net/core/wmem_default", 0))
    };
    let mut v = vec![
        (libc::SOL_SOCKET, libc::SO_REUSEADDR, None),
        (libc::SOL_SOCKET, libc::SO_REUSEPORT, None),
        (libc::SOL_SOCKET, libc::SO_KEEPALIVE, None),
        (libc::SOL_SOCKET, libc::SO_BROADCAST, None),
        (libc::SOL_SOCKET, libc::SO_PRIORITY, None),
        (libc::SOL_SOCKET, libc::SO_MARK, None),
        (libc::SOL_SOCKET, libc::SO_OOBINLINE, None),
        (libc::SOL_SOCKET, libc::SO_LINGER, None),
        (libc::SOL_SOCKET, libc::SO_RCVTIMEO, None),
        (libc::SOL_SOCKET, libc::SO_SNDTIMEO, None),
        (libc::SOL_SOCKET, libc::SO_RCVLOWAT, Some(1)),
        (libc::SOL_SOCKET, libc::SO_RCVBUF, rmem.map(|m| m.max(2304))),
        (libc::SOL_SOCKET, libc::SO_SNDBUF, wmem.map(|m| m.max(4608))),
    ];
    if family == libc::AF_INET {
        v.push((libc::IPPROTO_IP, libc::IP_TOS, None));
        v.push((libc::IPPROTO_IP, libc::IP_TTL, sysctl_int("/proc/sys/net/ipv4/ip_default_ttl", 0)));
        v.push((libc::IPPROTO_IP, libc::IP_FREEBIND, None));
        v.push((libc::IPPROTO_IP, libc::IP_TRANSPARENT, None));
    } else {
        v.push((libc::IPPROTO_IPV6, libc::IPV6_V6ONLY, Some(-1)));
    }
    if tcp {
        v.push((libc::IPPROTO_TCP, libc::TCP_NODELAY, None));
        v.push((libc::IPPROTO_TCP, libc::TCP_DEFER_ACCEPT, None));
    }
    v
}

pub fn capture(info: &FdInfo) -> Result<FileKind> {
    let sock = info.dup()?;
    let fd = sock.as_raw_fd();
    let family = getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_DOMAIN).unwrap_or(-1);
    let sock_type = getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_TYPE).unwrap_or(-1);
    let protocol = getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_PROTOCOL).unwrap_or(-1);
    let family_name = match family {
        libc::AF_INET | libc::AF_INET6 => "",
        libc::AF_UNIX => return super::unix::capture(info, sock_type),
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
    let peer = sockaddr(fd, true);
    if let (true, Some((paddr, pport))) = (tcp, &peer) {
        let peer = if paddr.len() == 4 {
            format!("{}.{}.{}.{}:{pport}", paddr[0], paddr[1], paddr[2], paddr[3])
        } else {
            format!("[{}]:{pport}", std::net::Ipv6Addr::from(<[u8; 16]>::try_from(paddr.as_slice()).unwrap_or([0; 16])))
        };
        return Err(info.unsupported(format!("established TCP connection to {peer} (live TCP connections are not supported yet)")));
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
    for (level, name, default) in option_defaults(family, tcp) {
        let Some(value) = getsockopt_bytes(fd, level, name) else { continue };
        let is_default = match default {
            None => value.iter().all(|&b| b == 0),
            Some(d) => value.len() == 4 && i32::from_ne_bytes([value[0], value[1], value[2], value[3]]) == d,
        };
        if !is_default {
            options.push(SockOpt { level, name, value });
        }
    }
    Ok(FileKind::InetSocket(InetSocket { family, sock_type, protocol, addr, port, listen_backlog, peer, options }))
}
