//! IPv4/IPv6 sockets: TCP sockets (unconnected, listening, established)
//! and UDP sockets, with their address, backlog and every option the
//! application changed. An established connection's TCP state is read
//! later, under the network lock (`tcp.rs`), and so is that of a
//! connection whose peer closed its side (CLOSE_WAIT); the other closing
//! states, listeners with connections waiting to be accepted and UDP
//! sockets with queued datagrams are refused by name.

use super::FdInfo;
use crate::error::Result;
use ferry_image::{FileKind, InetSocket, SockOpt};
use ferry_sys::socket;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, RawFd};

fn getsockopt_int(fd: RawFd, level: i32, name: i32) -> Option<i32> {
    socket::getsockopt_int(fd, level, name).ok()
}

fn getsockopt_bytes(fd: RawFd, level: i32, name: i32) -> Option<Vec<u8>> {
    socket::getsockopt_bytes(fd, level, name, 64).ok()
}

fn addr_bytes(a: &SocketAddr) -> Vec<u8> {
    match a.ip() {
        IpAddr::V4(v4) => v4.octets().to_vec(),
        IpAddr::V6(v6) => v6.octets().to_vec(),
    }
}

fn sysctl_int(path: &str, field: usize) -> Option<i32> {
    std::fs::read_to_string(path).ok()?.split_whitespace().nth(field)?.parse().ok()
}

const SO_BUF_LOCK: i32 = ferry_sys::socket::SO_BUF_LOCK;
const SOCK_SNDBUF_LOCK: i32 = 1;
const SOCK_RCVBUF_LOCK: i32 = 2;

/// TCP states as TCP_INFO reports them.
pub(crate) const TCP_ESTABLISHED: u8 = 1;
/// The peer closed its side; the application has not closed its own.
pub(crate) const TCP_CLOSE_WAIT: u8 = 8;
const TCP_CLOSE: u8 = 7;
const TCP_LISTEN: u8 = 10;

pub(crate) fn tcp_state_name(state: u8) -> &'static str {
    match state {
        1 => "ESTABLISHED",
        2 => "SYN_SENT",
        3 => "SYN_RECV",
        4 => "FIN_WAIT1",
        5 => "FIN_WAIT2",
        6 => "TIME_WAIT",
        7 => "CLOSE",
        8 => "CLOSE_WAIT",
        9 => "LAST_ACK",
        10 => "LISTEN",
        11 => "CLOSING",
        _ => "unknown",
    }
}

/// The value an option has when nobody set it.
#[derive(Clone, Debug)]
enum Default_ {
    /// All zero bytes.
    Zero,
    /// This integer.
    Int(i32),
    /// This string (NUL padding ignored).
    Text(String),
    /// Unknown here: capture only what we can compare; never recorded.
    Unknown,
}

fn sysctl_text(path: &str) -> Option<String> {
    Some(std::fs::read_to_string(path).ok()?.trim().to_string())
}

/// Options restore re-applies when they differ from their default, in
/// the order restore sets them. Buffer sizes are only recorded when the
/// application fixed them (SO_BUF_LOCK), so auto-tuned buffers stay
/// auto-tuned after restore.
fn option_defaults(family: i32, tcp: bool, state: u8) -> Vec<(i32, i32, Default_)> {
    use Default_::*;
    let mut v = socket_defaults();
    if family == libc::AF_INET {
        v.extend(ipv4_defaults());
    } else {
        v.extend(ipv6_defaults());
    }
    if tcp {
        v.extend(tcp_defaults(state));
    }
    // After IP_TOS, which may change it.
    v.push((libc::SOL_SOCKET, libc::SO_PRIORITY, Zero));
    v
}

fn sysctl_default(path: &str) -> Default_ {
    sysctl_int(path, 0).map_or(Default_::Unknown, Default_::Int)
}

fn socket_defaults() -> Vec<(i32, i32, Default_)> {
    use Default_::*;
    vec![
        (libc::SOL_SOCKET, libc::SO_REUSEADDR, Zero),
        (libc::SOL_SOCKET, libc::SO_REUSEPORT, Zero),
        (libc::SOL_SOCKET, libc::SO_KEEPALIVE, Zero),
        (libc::SOL_SOCKET, libc::SO_BROADCAST, Zero),
        (libc::SOL_SOCKET, libc::SO_MARK, Zero),
        (libc::SOL_SOCKET, libc::SO_OOBINLINE, Zero),
        (libc::SOL_SOCKET, libc::SO_DONTROUTE, Zero),
        (libc::SOL_SOCKET, libc::SO_NO_CHECK, Zero),
        (libc::SOL_SOCKET, libc::SO_LINGER, Zero),
        (libc::SOL_SOCKET, libc::SO_RCVTIMEO, Zero),
        (libc::SOL_SOCKET, libc::SO_SNDTIMEO, Zero),
        (libc::SOL_SOCKET, libc::SO_RCVLOWAT, Int(1)),
        (libc::SOL_SOCKET, libc::SO_TIMESTAMP, Zero),
        (libc::SOL_SOCKET, libc::SO_TIMESTAMPNS, Zero),
        (libc::SOL_SOCKET, libc::SO_BINDTODEVICE, Zero),
    ]
}

fn ipv4_defaults() -> Vec<(i32, i32, Default_)> {
    use Default_::*;
    let pmtu = if sysctl_int("/proc/sys/net/ipv4/ip_no_pmtu_disc", 0) == Some(0) {
        Int(libc::IP_PMTUDISC_WANT)
    } else {
        Unknown
    };
    vec![
        (libc::IPPROTO_IP, libc::IP_TOS, Zero),
        (libc::IPPROTO_IP, libc::IP_TTL, sysctl_default("/proc/sys/net/ipv4/ip_default_ttl")),
        (libc::IPPROTO_IP, libc::IP_FREEBIND, Zero),
        (libc::IPPROTO_IP, libc::IP_TRANSPARENT, Zero),
        (libc::IPPROTO_IP, libc::IP_PKTINFO, Zero),
        (libc::IPPROTO_IP, libc::IP_RECVTOS, Zero),
        (libc::IPPROTO_IP, libc::IP_RECVERR, Zero),
        (libc::IPPROTO_IP, libc::IP_MTU_DISCOVER, pmtu),
    ]
}

fn ipv6_defaults() -> Vec<(i32, i32, Default_)> {
    use Default_::*;
    vec![
        (libc::IPPROTO_IPV6, libc::IPV6_V6ONLY, Int(-1)),
        (libc::IPPROTO_IPV6, libc::IPV6_TCLASS, Zero),
        (libc::IPPROTO_IPV6, libc::IPV6_RECVPKTINFO, Zero),
        (libc::IPPROTO_IPV6, libc::IPV6_RECVERR, Zero),
    ]
}

fn tcp_defaults(state: u8) -> Vec<(i32, i32, Default_)> {
    use Default_::*;
    let ka = |f: &str| sysctl_default(&format!("/proc/sys/net/ipv4/{f}"));
    let cc = sysctl_text("/proc/sys/net/ipv4/tcp_congestion_control").map_or(Unknown, Text);
    let mut v = vec![
        (libc::IPPROTO_TCP, libc::TCP_NODELAY, Zero),
        (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, ka("tcp_keepalive_time")),
        (libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, ka("tcp_keepalive_intvl")),
        (libc::IPPROTO_TCP, libc::TCP_KEEPCNT, ka("tcp_keepalive_probes")),
        (libc::IPPROTO_TCP, libc::TCP_SYNCNT, ka("tcp_syn_retries")),
        (libc::IPPROTO_TCP, libc::TCP_LINGER2, ka("tcp_fin_timeout")),
        (libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT, Zero),
        (libc::IPPROTO_TCP, libc::TCP_THIN_LINEAR_TIMEOUTS, Zero),
        // 0 means "the sysctl default" here.
        (libc::IPPROTO_TCP, libc::TCP_NOTSENT_LOWAT, Zero),
        (libc::IPPROTO_TCP, libc::TCP_DEFER_ACCEPT, Zero),
        (libc::IPPROTO_TCP, libc::TCP_FASTOPEN, Zero),
        (libc::IPPROTO_TCP, libc::TCP_CONGESTION, cc),
    ];
    if state == TCP_CLOSE || state == TCP_LISTEN {
        // The MSS the application asked for; a connection's own MSS
        // is part of its repair state instead.
        v.push((libc::IPPROTO_TCP, libc::TCP_MAXSEG, Int(536)));
    }
    // Cork last: restore sets it after the send queue is refilled.
    v.push((libc::IPPROTO_TCP, libc::TCP_CORK, Zero));
    v
}

fn is_default(value: &[u8], default: &Default_) -> bool {
    match default {
        Default_::Zero => value.iter().all(|&b| b == 0),
        Default_::Int(d) => {
            value.len() == 4 && i32::from_ne_bytes([value[0], value[1], value[2], value[3]]) == *d
        }
        Default_::Text(t) => {
            let end = value.iter().position(|&b| b == 0).unwrap_or(value.len());
            &value[..end] == t.as_bytes()
        }
        Default_::Unknown => true,
    }
}

/// The option tables, read from /proc/sys once per ferry run rather than
/// once per socket (a server may hold 10,000 of them).
fn defaults_for(family: i32, tcp: bool, state: u8) -> &'static [(i32, i32, Default_)] {
    use std::sync::OnceLock;
    static TABLES: [OnceLock<Vec<(i32, i32, Default_)>>; 6] = [const { OnceLock::new() }; 6];
    let closed_or_listening = state == TCP_CLOSE || state == TCP_LISTEN;
    let i = (family == libc::AF_INET) as usize * 3
        + if !tcp {
            0
        } else if closed_or_listening {
            1
        } else {
            2
        };
    TABLES[i].get_or_init(|| option_defaults(family, tcp, state))
}

/// Every option of the socket that differs from its default, plus the
/// buffer sizes the application fixed.
fn changed_options(fd: RawFd, family: i32, tcp: bool, state: u8) -> Vec<SockOpt> {
    let mut options = Vec::new();
    let buf_lock = getsockopt_int(fd, libc::SOL_SOCKET, SO_BUF_LOCK).unwrap_or(0);
    for (name, bit) in [(libc::SO_SNDBUF, SOCK_SNDBUF_LOCK), (libc::SO_RCVBUF, SOCK_RCVBUF_LOCK)] {
        if buf_lock & bit != 0 {
            if let Some(value) = getsockopt_bytes(fd, libc::SOL_SOCKET, name) {
                options.push(SockOpt { level: libc::SOL_SOCKET, name, value });
            }
        }
    }
    for (level, name, default) in defaults_for(family, tcp, state) {
        let Some(value) = getsockopt_bytes(fd, *level, *name) else {
            continue;
        };
        if !is_default(&value, default) {
            options.push(SockOpt { level: *level, name: *name, value });
        }
    }
    options
}

/// A TCP socket's state, and its backlog if it listens.
struct TcpState {
    state: u8,
    listen_backlog: Option<i32>,
}

/// Only listeners, established or closed sockets and connections whose
/// peer closed (CLOSE_WAIT, which stays so until the application closes)
/// are captured: the others are refused as busy.
fn tcp_state(info: &FdInfo, fd: RawFd, peer: Option<SocketAddr>) -> Result<TcpState> {
    let ti = socket::tcp_info(fd).map_err(|_| info.unsupported("cannot read TCP_INFO"))?;
    let state = ti.tcpi_state;
    match state {
        TCP_LISTEN => {
            // For a listener the kernel reports the accept queue in
            // tcpi_unacked and its limit (the listen backlog) in
            // tcpi_sacked.
            if ti.tcpi_unacked > 0 {
                return Err(
                    info.busy(format!("{} connections wait in its accept queue", ti.tcpi_unacked))
                );
            }
            Ok(TcpState { state, listen_backlog: Some(ti.tcpi_sacked as i32) })
        }
        TCP_ESTABLISHED | TCP_CLOSE_WAIT | TCP_CLOSE => {
            Ok(TcpState { state, listen_backlog: None })
        }
        other => {
            let to = peer.map(|p| format!(" to {p}")).unwrap_or_default();
            // Opening and closing states move on by themselves (the
            // service closes a connection its client closed).
            Err(info.busy(format!(
                "TCP connection{to} in state {} (only established connections and those whose peer closed can be restored)",
                tcp_state_name(other)
            )))
        }
    }
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
    let local = socket::address(fd, false)
        .ok()
        .flatten()
        .ok_or_else(|| info.unsupported("cannot read the socket's address"))?;
    let tcp = sock_type == libc::SOCK_STREAM && protocol == libc::IPPROTO_TCP;
    let udp = sock_type == libc::SOCK_DGRAM && protocol == libc::IPPROTO_UDP;
    if !tcp && !udp {
        return Err(info.unsupported("only TCP and UDP sockets are supported"));
    }
    let peer = socket::address(fd, true).ok().flatten();
    let TcpState { state, listen_backlog } = if tcp {
        tcp_state(info, fd, peer)?
    } else {
        TcpState { state: TCP_CLOSE, listen_backlog: None }
    };
    if udp {
        let queued = ferry_sys::fd::bytes_readable(fd).unwrap_or(0);
        if queued > 0 {
            return Err(info.unsupported(format!("{queued} bytes of datagrams are queued")));
        }
    }
    // A TCP socket that was reset or closed keeps no peer; one whose peer
    // only closed its side is still connected.
    let connected = state == TCP_ESTABLISHED || state == TCP_CLOSE_WAIT;
    let peer = if tcp && !connected { None } else { peer };
    let options = changed_options(fd, family, tcp, state);
    info.keep(sock);
    Ok(FileKind::InetSocket(InetSocket {
        family,
        sock_type,
        protocol,
        addr: addr_bytes(&local),
        port: local.port(),
        listen_backlog,
        peer: peer.map(|p| (addr_bytes(&p), p.port())),
        options,
        // Filled by the connection phase, under the network lock.
        connection: None,
    }))
}
