//! The TCP and UDP sockets of a tree while it runs, for the checks a
//! migration's destination makes before anything is frozen: each
//! socket's address, peer and state from the kernel's tables
//! (/proc/PID/net/{tcp,tcp6,udp,udp6}), matched to the tree's fds by
//! inode (/proc/PID/fd). No process is stopped: a socket opened or
//! closed meanwhile is simply seen or not, the capture still decides.
//!
//! Also who holds a port on this host ([`port_holders`]), for a
//! destination that finds the port taken.

use crate::capture::tree::running_tree;
use crate::procfs;
use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::AsRawFd;

/// TCP states as /proc/net/tcp prints them.
const ESTABLISHED: u8 = 0x01;
/// A connection whose peer closed its side: restored as a connection.
const CLOSE_WAIT: u8 = 0x08;
const CLOSE: u8 = 0x07;
const LISTEN: u8 = 0x0a;

const IPV6_TRANSPARENT: i32 = 75;
const IPV6_FREEBIND: i32 = 78;

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum SocketRole {
    /// A TCP socket that listens.
    Listener,
    /// An established TCP connection.
    Connection,
    /// A TCP socket bound but neither listening nor connected, or a UDP
    /// socket bound to a port.
    Bound,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RunningSocket {
    pub pid: i32,
    pub fd: i32,
    pub tcp: bool,
    /// AF_INET6 (its addresses may be IPv4-mapped).
    pub ipv6: bool,
    pub role: SocketRole,
    pub local: SocketAddr,
    pub peer: Option<SocketAddr>,
    /// IP_FREEBIND or IP_TRANSPARENT: it may bind an address its host
    /// does not have.
    pub nonlocal: bool,
    /// IPV6_V6ONLY.
    pub v6only: bool,
}

/// What a running tree needs of the host it moves to.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RunningTree {
    /// Every process and thread ID of the tree, as the tree sees them
    /// (the IDs a restore gives back).
    pub ids: Vec<i32>,
    /// The tree is in a PID namespace below ours (a restore always gives
    /// it a new one).
    pub own_pid_namespace: bool,
    pub sockets: Vec<RunningSocket>,
    /// The regular files it maps or holds open by path.
    pub files: Vec<crate::running_files::RunningFile>,
}

/// One line of a /proc/net/{tcp,udp}[6] table.
#[derive(Debug, Clone, PartialEq, Eq)]
struct TableEntry {
    local: SocketAddr,
    peer: SocketAddr,
    state: u8,
    inode: u64,
}

/// The tree of `root` as it runs now: its IDs, its TCP and UDP sockets
/// (unbound ones left out: they need nothing of a host) and the files a
/// restore opens again by path.
pub fn running_tree_sockets(root: i32) -> RunningTree {
    let pids = running_tree(root);
    let mut tree = RunningTree::default();
    // inode -> (pid, fd); the first holder names a shared socket.
    let mut holders: HashMap<u64, (i32, i32)> = HashMap::new();
    let depth = |pid: &str| nspids(pid).len();
    tree.own_pid_namespace = depth(&root.to_string()) > depth("self");
    for &pid in &pids {
        for tid in procfs::tids(pid).unwrap_or_default() {
            let inner = nspids(&format!("{pid}/task/{tid}")).last().copied();
            tree.ids.push(inner.unwrap_or(tid));
        }
        for (fd, inode) in socket_fds(pid) {
            holders.entry(inode).or_insert((pid, fd));
        }
    }
    for (tcp, ipv6, file) in TABLES {
        let text = std::fs::read_to_string(format!("/proc/{root}/net/{file}")).unwrap_or_default();
        for e in parse_table(&text, ipv6) {
            let Some(&(pid, fd)) = holders.get(&e.inode) else { continue };
            let Some(role) = role_of(tcp, &e) else { continue };
            let peer = (role == SocketRole::Connection || (!tcp && e.state == ESTABLISHED))
                .then_some(e.peer);
            let mut s = RunningSocket {
                pid,
                fd,
                tcp,
                ipv6,
                role,
                local: e.local,
                peer,
                nonlocal: false,
                v6only: false,
            };
            read_flags(&mut s);
            tree.sockets.push(s);
        }
    }
    tree.files = crate::running_files::running_files(&pids);
    tree
}

/// The IDs of a process or thread (a path under /proc) in every PID
/// namespace it is in, ours first.
fn nspids(path: &str) -> Vec<i32> {
    let status = std::fs::read_to_string(format!("/proc/{path}/status")).unwrap_or_default();
    let Some(line) = status.lines().find_map(|l| l.strip_prefix("NSpid:")) else {
        return Vec::new();
    };
    line.split_whitespace().filter_map(|p| p.parse().ok()).collect()
}

const TABLES: [(bool, bool, &str); 4] =
    [(true, false, "tcp"), (true, true, "tcp6"), (false, false, "udp"), (false, true, "udp6")];

/// What a table entry is to a restore; None for what needs no address
/// (unbound) and for the passing TCP states the capture refuses anyway.
fn role_of(tcp: bool, e: &TableEntry) -> Option<SocketRole> {
    if !tcp {
        return (e.local.port() != 0).then_some(SocketRole::Bound);
    }
    match e.state {
        LISTEN => Some(SocketRole::Listener),
        ESTABLISHED | CLOSE_WAIT => Some(SocketRole::Connection),
        CLOSE if e.local.port() != 0 => Some(SocketRole::Bound),
        _ => None,
    }
}

/// (fd, socket inode) of every socket in `pid`'s fd table.
fn socket_fds(pid: i32) -> Vec<(i32, u64)> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else { return Vec::new() };
    let mut out = Vec::new();
    for entry in dir.flatten() {
        let Some(fd) = entry.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(target) = std::fs::read_link(entry.path()) else { continue };
        if let Some(inode) = socket_inode(&target.to_string_lossy()) {
            out.push((fd, inode));
        }
    }
    out
}

fn socket_inode(link: &str) -> Option<u64> {
    link.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
}

/// The options the kernel tables do not show, read on a copy of the fd
/// (pidfd_getfd) only where they matter: whether a socket with a
/// specific address may bind it without the host having it, and whether
/// an IPv6 socket takes IPv4 too. A process gone meanwhile leaves them
/// unset.
fn read_flags(s: &mut RunningSocket) {
    let specific = !s.local.ip().is_unspecified();
    if !specific && !s.ipv6 {
        return;
    }
    let Ok(pidfd) = ferry_sys::pidfd::pidfd_open(s.pid) else { return };
    let Ok(sock) = ferry_sys::pidfd::pidfd_getfd(&pidfd, s.fd) else { return };
    let fd = sock.as_raw_fd();
    let on = |level, name| ferry_sys::socket::getsockopt_int(fd, level, name).is_ok_and(|v| v != 0);
    if s.ipv6 {
        s.v6only = on(libc::IPPROTO_IPV6, libc::IPV6_V6ONLY);
        s.nonlocal =
            on(libc::IPPROTO_IPV6, IPV6_FREEBIND) || on(libc::IPPROTO_IPV6, IPV6_TRANSPARENT);
    } else {
        s.nonlocal =
            on(libc::IPPROTO_IP, libc::IP_FREEBIND) || on(libc::IPPROTO_IP, libc::IP_TRANSPARENT);
    }
}

/// Parses one /proc/net/{tcp,udp}[6] table; malformed lines are skipped.
fn parse_table(text: &str, ipv6: bool) -> Vec<TableEntry> {
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 10 {
                return None;
            }
            Some(TableEntry {
                local: parse_endpoint(f[1], ipv6)?,
                peer: parse_endpoint(f[2], ipv6)?,
                state: u8::from_str_radix(f[3], 16).ok()?,
                inode: f[9].parse().ok()?,
            })
        })
        .collect()
}

/// "0100007F:0050" (IPv4) or 32 hex digits and a port (IPv6): the
/// address as the kernel holds it in memory, printed one 32-bit word at
/// a time in this host's byte order, and the port in host order.
fn parse_endpoint(s: &str, ipv6: bool) -> Option<SocketAddr> {
    let (addr, port) = s.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let words: Vec<u32> = (0..addr.len() / 8)
        .map(|i| u32::from_str_radix(addr.get(i * 8..i * 8 + 8)?, 16).ok())
        .collect::<Option<_>>()?;
    let ip: IpAddr = match (ipv6, words.as_slice()) {
        (false, [w]) => Ipv4Addr::from(w.to_ne_bytes()).into(),
        (true, [a, b, c, d]) => {
            let mut bytes = [0u8; 16];
            for (i, w) in [a, b, c, d].into_iter().enumerate() {
                bytes[i * 4..i * 4 + 4].copy_from_slice(&w.to_ne_bytes());
            }
            Ipv6Addr::from(bytes).into()
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

/// The processes of this host (pid, command name) holding a socket bound
/// to `port`: TCP listeners, or UDP sockets. For naming who takes a port
/// a restore needs; empty when none is found (a socket of another
/// network namespace, or one closed meanwhile).
pub fn port_holders(tcp: bool, port: u16) -> Vec<(i32, String)> {
    let mut inodes = Vec::new();
    for (t, ipv6, file) in TABLES {
        if t != tcp {
            continue;
        }
        let text = std::fs::read_to_string(format!("/proc/self/net/{file}")).unwrap_or_default();
        inodes.extend(
            parse_table(&text, ipv6)
                .into_iter()
                .filter(|e| e.local.port() == port && (!tcp || e.state == LISTEN))
                .map(|e| e.inode),
        );
    }
    if inodes.is_empty() {
        return Vec::new();
    }
    let Ok(proc_dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    let mut out = Vec::new();
    for entry in proc_dir.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        if socket_fds(pid).iter().any(|(_, inode)| inodes.contains(inode)) {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            out.push((pid, comm.trim().to_string()));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_in_the_kernels_notation() {
        let v4 = format!("{:08X}:1F90", u32::from_ne_bytes([10, 0, 0, 7]));
        assert_eq!(parse_endpoint(&v4, false), Some("10.0.0.7:8080".parse().unwrap()));
        let ip: Ipv6Addr = "fd00::1".parse().unwrap();
        let hex: String = ip
            .octets()
            .chunks(4)
            .map(|c| format!("{:08X}", u32::from_ne_bytes([c[0], c[1], c[2], c[3]])))
            .collect();
        assert_eq!(
            parse_endpoint(&format!("{hex}:0050"), true),
            Some(SocketAddr::new(ip.into(), 80))
        );
        assert_eq!(parse_endpoint("zz:1", false), None);
        assert_eq!(parse_endpoint("0100007F:0050", true), None);
    }

    #[test]
    fn this_process_sockets_are_listed_with_their_roles() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let at = listener.local_addr().unwrap();
        let client = std::net::TcpStream::connect(at).unwrap();
        let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let tree = running_tree_sockets(std::process::id() as i32);
        let find = |fd: i32| tree.sockets.iter().find(|s| s.fd == fd);
        let l = find(listener.as_raw_fd()).expect("the listener");
        assert_eq!((l.role, l.local, l.tcp), (SocketRole::Listener, at, true));
        let c = find(client.as_raw_fd()).expect("the connection");
        assert_eq!((c.role, c.peer), (SocketRole::Connection, Some(at)));
        let u = find(udp.as_raw_fd()).expect("the UDP socket");
        assert_eq!((u.role, u.tcp, u.local), (SocketRole::Bound, false, udp.local_addr().unwrap()));
        assert!(tree.ids.contains(&(std::process::id() as i32)));
        assert!(!tree.own_pid_namespace);
    }

    #[test]
    fn table_lines_and_roles() {
        let local = format!("{:08X}:1F90", u32::from_ne_bytes([127, 0, 0, 1]));
        let text = format!(
            "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
             0: {local} 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4242 1 0 100 0 0 10 0\n\
             1: 00000000:0000 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 7 1\n\
             garbage\n"
        );
        let t = parse_table(&text, false);
        assert_eq!(t.len(), 2);
        assert_eq!(t[0].inode, 4242);
        assert_eq!(role_of(true, &t[0]), Some(SocketRole::Listener));
        assert_eq!(role_of(true, &t[1]), None, "unbound");
        assert_eq!(role_of(false, &t[0]), Some(SocketRole::Bound));
        assert_eq!(socket_inode("socket:[4242]"), Some(4242));
        assert_eq!(socket_inode("pipe:[1]"), None);
    }
}
