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
use std::os::fd::{AsFd, AsRawFd, RawFd};

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
    /// These bytes (SO_MAX_PACING_RATE's 64-bit "unlimited").
    Bytes(&'static [u8]),
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
    // An AF_INET6 socket carries the IPv4 options too: they apply to its
    // v4-mapped traffic.
    v.extend(ipv4_defaults());
    if family == libc::AF_INET6 {
        v.extend(ipv6_defaults());
    }
    if tcp {
        v.extend(tcp_defaults(state));
    } else {
        v.extend(udp_defaults(family));
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
        (libc::SOL_SOCKET, libc::SO_RXQ_OVFL, Zero),
        (libc::SOL_SOCKET, libc::SO_SELECT_ERR_QUEUE, Zero),
        (libc::SOL_SOCKET, libc::SO_BUSY_POLL, Zero),
        (libc::SOL_SOCKET, SO_MAX_PACING_RATE, Bytes(&[0xff; 8])),
        (libc::SOL_SOCKET, SO_ZEROCOPY, Zero),
        (libc::SOL_SOCKET, SO_PREFER_BUSY_POLL, Zero),
        (libc::SOL_SOCKET, SO_RCVMARK, Zero),
    ]
}

const SO_MAX_PACING_RATE: i32 = 47;
const SO_ZEROCOPY: i32 = 60;
const SO_PREFER_BUSY_POLL: i32 = 69;
const SO_RCVMARK: i32 = 75;

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
        (libc::IPPROTO_IP, libc::IP_RECVOPTS, Zero),
        (libc::IPPROTO_IP, libc::IP_RETOPTS, Zero),
        (libc::IPPROTO_IP, libc::IP_RECVTTL, Zero),
        (libc::IPPROTO_IP, libc::IP_PASSSEC, Zero),
        (libc::IPPROTO_IP, libc::IP_RECVORIGDSTADDR, Zero),
        (libc::IPPROTO_IP, libc::IP_MINTTL, Zero),
        (libc::IPPROTO_IP, libc::IP_CHECKSUM, Zero),
        (libc::IPPROTO_IP, libc::IP_BIND_ADDRESS_NO_PORT, Zero),
        (libc::IPPROTO_IP, IP_RECVFRAGSIZE, Zero),
        (libc::IPPROTO_IP, IP_RECVERR_RFC4884, Zero),
        (libc::IPPROTO_IP, libc::IP_UNICAST_IF, Zero),
        (libc::IPPROTO_IP, IP_LOCAL_PORT_RANGE, Zero),
    ]
}

const IP_RECVFRAGSIZE: i32 = 25;
const IP_RECVERR_RFC4884: i32 = 26;
const IP_LOCAL_PORT_RANGE: i32 = 51;

fn ipv6_defaults() -> Vec<(i32, i32, Default_)> {
    use Default_::*;
    // Reads the route's (or the namespace's) hop limit while unset.
    let hops = sysctl_default("/proc/sys/net/ipv6/conf/all/hop_limit");
    vec![
        (libc::IPPROTO_IPV6, libc::IPV6_V6ONLY, Int(-1)),
        (libc::IPPROTO_IPV6, libc::IPV6_TCLASS, Zero),
        (libc::IPPROTO_IPV6, libc::IPV6_RECVPKTINFO, Zero),
        (libc::IPPROTO_IPV6, libc::IPV6_RECVERR, Zero),
        (libc::IPPROTO_IPV6, libc::IPV6_2292PKTINFO, Zero),
        (libc::IPPROTO_IPV6, libc::IPV6_2292HOPOPTS, Zero),
        (libc::IPPROTO_IPV6, libc::IPV6_2292DSTOPTS, Zero),
        (libc::IPPROTO_IPV6, libc::IPV6_2292RTHDR, Zero),
        (libc::IPPROTO_IPV6, libc::IPV6_2292HOPLIMIT, Zero),
        (libc::IPPROTO_IPV6, libc::IPV6_FLOWINFO, Zero),
        (libc::IPPROTO_IPV6, libc::IPV6_UNICAST_HOPS, hops),
        (libc::IPPROTO_IPV6, libc::IPV6_MTU_DISCOVER, Int(libc::IPV6_PMTUDISC_WANT)),
        (libc::IPPROTO_IPV6, IPV6_RECVERR_RFC4884, Zero),
        (libc::IPPROTO_IPV6, libc::IPV6_FLOWINFO_SEND, Zero),
        (libc::IPPROTO_IPV6, libc::IPV6_RECVHOPLIMIT, Zero),
        (libc::IPPROTO_IPV6, libc::IPV6_RECVHOPOPTS, Zero),
        (libc::IPPROTO_IPV6, libc::IPV6_RECVRTHDR, Zero),
        (libc::IPPROTO_IPV6, libc::IPV6_RECVDSTOPTS, Zero),
        (libc::IPPROTO_IPV6, libc::IPV6_RECVPATHMTU, Zero),
        (libc::IPPROTO_IPV6, libc::IPV6_DONTFRAG, Zero),
        (libc::IPPROTO_IPV6, libc::IPV6_RECVTCLASS, Zero),
        (libc::IPPROTO_IPV6, IPV6_MINHOPCOUNT, Zero),
        (libc::IPPROTO_IPV6, libc::IPV6_RECVORIGDSTADDR, Zero),
        (libc::IPPROTO_IPV6, IPV6_UNICAST_IF, Zero),
        (libc::IPPROTO_IPV6, IPV6_RECVFRAGSIZE, Zero),
    ]
}

const IPV6_RECVERR_RFC4884: i32 = 31;
const IPV6_MINHOPCOUNT: i32 = 73;
const IPV6_UNICAST_IF: i32 = 76;
const IPV6_RECVFRAGSIZE: i32 = 77;

/// UDP's own options and the multicast ones, which a stream socket
/// refuses to set (an accepted connection reads the TTL of its SYN).
fn udp_defaults(family: i32) -> Vec<(i32, i32, Default_)> {
    use Default_::*;
    let mut v = vec![
        (libc::IPPROTO_IP, libc::IP_MULTICAST_TTL, Int(1)),
        (libc::IPPROTO_IP, libc::IP_MULTICAST_LOOP, Int(1)),
        // On by default for AF_INET only.
        (libc::IPPROTO_IP, libc::IP_MULTICAST_ALL, Int((family == libc::AF_INET) as i32)),
    ];
    if family == libc::AF_INET6 {
        v.extend([
            (libc::IPPROTO_IPV6, libc::IPV6_MULTICAST_IF, Zero),
            (libc::IPPROTO_IPV6, libc::IPV6_MULTICAST_HOPS, Int(1)),
            (libc::IPPROTO_IPV6, libc::IPV6_MULTICAST_LOOP, Int(1)),
            (libc::IPPROTO_IPV6, libc::IPV6_MULTICAST_ALL, Int(1)),
        ]);
    }
    v.extend([
        (libc::IPPROTO_UDP, libc::UDP_CORK, Zero),
        (libc::IPPROTO_UDP, UDP_NO_CHECK6_TX, Zero),
        (libc::IPPROTO_UDP, UDP_NO_CHECK6_RX, Zero),
        (libc::IPPROTO_UDP, libc::UDP_SEGMENT, Zero),
        (libc::IPPROTO_UDP, libc::UDP_GRO, Zero),
    ]);
    v
}

const UDP_NO_CHECK6_TX: i32 = 101;
const UDP_NO_CHECK6_RX: i32 = 102;

const TCP_INQ: i32 = 36;
const TCP_TX_DELAY: i32 = 37;
const TCP_RTO_MAX_MS: i32 = 44;
const TCP_RTO_MIN_US: i32 = 45;
const TCP_DELACK_MAX_US: i32 = 46;

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
        (libc::IPPROTO_TCP, TCP_INQ, Zero),
        (libc::IPPROTO_TCP, TCP_TX_DELAY, Zero),
        (libc::IPPROTO_TCP, TCP_RTO_MAX_MS, ka("tcp_rto_max_ms")),
        (libc::IPPROTO_TCP, TCP_RTO_MIN_US, ka("tcp_rto_min_us")),
        // TCP_DELACK_MAX: 200 ms, no sysctl.
        (libc::IPPROTO_TCP, TCP_DELACK_MAX_US, Int(200_000)),
    ];
    if state == TCP_CLOSE || state == TCP_LISTEN {
        // The MSS and window clamp the application asked for; a
        // connection's own are the stack's (repair state).
        v.push((libc::IPPROTO_TCP, libc::TCP_MAXSEG, Int(536)));
        v.push((libc::IPPROTO_TCP, libc::TCP_WINDOW_CLAMP, Zero));
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
        Default_::Bytes(b) => value == *b,
        Default_::Unknown => true,
    }
}

/// Which option table a socket's options are read with: by family, and
/// for TCP by whether it is closed or listening (then the MSS and
/// window clamp are the application's) or connected.
fn table_index(family: i32, tcp: bool, state: u8) -> usize {
    let closed_or_listening = state == TCP_CLOSE || state == TCP_LISTEN;
    (family == libc::AF_INET) as usize * 3
        + if !tcp {
            0
        } else if closed_or_listening {
            1
        } else {
            2
        }
}

/// Reads the option table of an IPv4/IPv6 TCP or UDP socket's kind now
/// ([`defaults_for`], ~10 sysctl files the first time for a kind), while
/// the tree runs, rather than in the freeze, where a small tree's
/// sockets have their options read again. A TCP socket that does not
/// listen is taken for a connection (a closed one's table is read when
/// the freeze meets it).
pub(crate) fn load_option_defaults(family: i32, sock_type: i32, protocol: i32, listening: bool) {
    if family != libc::AF_INET && family != libc::AF_INET6 {
        return;
    }
    let tcp = sock_type == libc::SOCK_STREAM && protocol == libc::IPPROTO_TCP;
    let udp = sock_type == libc::SOCK_DGRAM && protocol == libc::IPPROTO_UDP;
    let state = match (tcp, listening) {
        (true, true) => TCP_LISTEN,
        (true, false) => TCP_ESTABLISHED,
        (false, _) if udp => TCP_CLOSE,
        _ => return,
    };
    defaults_for(family, tcp, state);
}

/// The option tables, read from /proc/sys once per ferry run rather than
/// once per socket (a server may hold 10,000 of them).
fn defaults_for(family: i32, tcp: bool, state: u8) -> &'static [(i32, i32, Default_)] {
    use std::sync::OnceLock;
    static TABLES: [OnceLock<Vec<(i32, i32, Default_)>>; 6] = [const { OnceLock::new() }; 6];
    TABLES[table_index(family, tcp, state)].get_or_init(|| option_defaults(family, tcp, state))
}

/// What the socket-option check reads of an IPv4/IPv6 TCP or UDP socket
/// of this family, type and protocol before the freeze
/// ([`super::PreRead`]): None for other sockets.
pub(crate) fn pre_read(
    fd: RawFd,
    (family, sock_type, protocol): (i32, i32, i32),
) -> Option<super::PreRead> {
    if family != libc::AF_INET && family != libc::AF_INET6 {
        return None;
    }
    let tcp = sock_type == libc::SOCK_STREAM && protocol == libc::IPPROTO_TCP;
    let udp = sock_type == libc::SOCK_DGRAM && protocol == libc::IPPROTO_UDP;
    let state = match (tcp, udp) {
        (true, _) => socket::tcp_info(fd).ok()?.tcpi_state,
        (false, true) => TCP_CLOSE,
        _ => return None,
    };
    let options = changed_options(fd, family, tcp, state);
    Some(super::PreRead { family, sock_type, protocol, state, options })
}

/// The options read before the freeze, when they still hold: nothing
/// can have set one since (`quiet`) and the socket is in the same state
/// (a connection whose peer closed since counts as the same: no option
/// moves with a FIN), so the stack moved none by itself either.
fn early_options(pre: &super::PreRead, quiet: bool, state: u8) -> Option<Vec<SockOpt>> {
    let connected = |s| s == TCP_ESTABLISHED || s == TCP_CLOSE_WAIT;
    let same = pre.state == state || (connected(pre.state) && connected(state));
    (quiet && same).then(|| pre.options.clone())
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

/// A connection the capture before described, whose description stands
/// as far as the tree's calls go ([`super::KeptDescriptions`]): what
/// the network or the host can change without such a call is checked
/// again, as its description checked it ([`super::socket_preconditions::recheck_kept`]).
/// Its state, pending errors and urgent byte are polled again under the
/// network lock in the freeze.
pub(crate) fn recheck_kept(info: &FdInfo, kind: &FileKind) -> Result<()> {
    let FileKind::InetSocket(s) = kind else {
        return Err(info.unsupported("not an IPv4/IPv6 socket"));
    };
    let addr = |bytes: &[u8], port| -> Option<SocketAddr> {
        let ip = match bytes.len() {
            4 => IpAddr::from(<[u8; 4]>::try_from(bytes).ok()?),
            16 => IpAddr::from(<[u8; 16]>::try_from(bytes).ok()?),
            _ => return None,
        };
        Some(SocketAddr::new(ip, port))
    };
    let local = addr(&s.addr, s.port).ok_or_else(|| info.unsupported("its address"))?;
    let peer = s.peer.as_ref().and_then(|(a, p)| addr(a, *p));
    let state = info.pre.and_then(super::PreSocket::read).map_or(TCP_ESTABLISHED, |r| r.state);
    let checked = info.pre.and_then(|p| {
        p.with_dup(|sock| {
            let facts = super::socket_preconditions::InetFacts {
                sock: sock.as_fd(),
                tcp: s.sock_type == libc::SOCK_STREAM && s.protocol == libc::IPPROTO_TCP,
                state,
                local,
                peer,
                options: &s.options,
                diag: Default::default(),
            };
            super::socket_preconditions::recheck_kept(info, &facts)
        })
    });
    checked.unwrap_or_else(|| Err(info.unsupported("no duplicate of it")))
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
    // What never changes in a socket, as read before the freeze.
    let early = info.pre.and_then(super::PreSocket::read);
    let (family, sock_type, protocol) = match early {
        Some(e) => (e.family, e.sock_type, e.protocol),
        None => {
            let int = |n| getsockopt_int(fd, libc::SOL_SOCKET, n).unwrap_or(-1);
            (int(libc::SO_DOMAIN), int(libc::SO_TYPE), int(libc::SO_PROTOCOL))
        }
    };
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
    let options = early
        .and_then(|e| early_options(e, info.options_quiet, state))
        .unwrap_or_else(|| changed_options(fd, family, tcp, state));
    let facts = super::socket_preconditions::InetFacts {
        sock: sock.as_fd(),
        tcp,
        state,
        local,
        peer,
        options: &options,
        diag: Default::default(),
    };
    super::socket_preconditions::check_inet(info, &facts)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_read_before_the_freeze_stand_only_when_quiet_and_in_the_same_state() {
        let opt =
            SockOpt { level: libc::IPPROTO_TCP, name: libc::TCP_NODELAY, value: vec![1, 0, 0, 0] };
        let pre = |family, state| super::super::PreRead {
            family,
            sock_type: libc::SOCK_STREAM,
            protocol: libc::IPPROTO_TCP,
            state,
            options: vec![opt.clone()],
        };
        let est = pre(libc::AF_INET, TCP_ESTABLISHED);
        assert_eq!(early_options(&est, true, TCP_ESTABLISHED).map(|o| o.len()), Some(1));
        // The peer closed since: same table (a connection's).
        assert!(early_options(&est, true, TCP_CLOSE_WAIT).is_some());
        // A setsockopt may have happened: read again.
        assert!(early_options(&est, false, TCP_ESTABLISHED).is_none());
        // Closed since: the MSS and window clamp are read then too.
        assert!(early_options(&est, true, TCP_CLOSE).is_none());
        let closed = pre(libc::AF_INET6, TCP_CLOSE);
        assert!(early_options(&closed, true, TCP_LISTEN).is_none());
        assert!(early_options(&closed, true, TCP_ESTABLISHED).is_none());
        // A handshake completed since: read again.
        assert!(early_options(&pre(libc::AF_INET, 2), true, TCP_ESTABLISHED).is_none());
    }
    use crate::catalog::{socket_options as cat, Handling};

    /// Every option the catalog calls restored is one the freeze reads:
    /// the pre-check leaves restored options to it.
    #[test]
    fn every_option_the_catalog_restores_is_read_in_the_freeze() {
        let mut read = std::collections::HashSet::new();
        for family in [libc::AF_INET, libc::AF_INET6] {
            for (tcp, state) in [(true, TCP_ESTABLISHED), (true, TCP_LISTEN), (false, TCP_CLOSE)] {
                read.extend(option_defaults(family, tcp, state).iter().map(|(l, n, _)| (*l, *n)));
            }
        }
        // Read with SO_BUF_LOCK, which tells whether the application fixed them.
        for n in [libc::SO_SNDBUF, libc::SO_RCVBUF, SO_BUF_LOCK] {
            read.insert((libc::SOL_SOCKET, n));
        }
        for l in [&cat::SOCKET, &cat::IP, &cat::IPV6, &cat::TCP, &cat::UDP] {
            for (n, e) in l.options {
                if e.handling == Handling::Restored {
                    assert!(read.contains(&(l.level, *n)), "{} is listed restored", e.name);
                }
            }
        }
    }
}
