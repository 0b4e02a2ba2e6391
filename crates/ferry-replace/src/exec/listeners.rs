//! The old tree's TCP listeners: where they listen, which (pid, fd) of the
//! tree hold each, and a duplicate of each taken with pidfd_getfd (the
//! same socket, which the new binary gets in place of its own). What the
//! new binary could not be handed is refused by name here, before
//! anything starts.

use crate::error::ReplaceError;
use ferry_engine::running_sockets::{self, SocketRole};
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsFd, OwnedFd};

/// One listening socket of the old tree.
#[derive(Debug)]
pub struct OldListener {
    pub local: SocketAddr,
    /// AF_INET6 (its address may be IPv4-mapped).
    pub ipv6: bool,
    pub v6only: bool,
    /// O_NONBLOCK as the old tree had it (the new binary may change it:
    /// the file status flags are shared).
    pub nonblock: bool,
    pub inode: u64,
    /// Ferry's own reference to the socket.
    pub dup: OwnedFd,
}

/// Every process of the tree of `root` as it runs now, parents first.
pub fn tree_pids(root: i32) -> Vec<i32> {
    ferry_engine::capture::running_tree(root)
}

/// (fd, socket inode) of each socket `pid` holds.
pub fn socket_fds(pid: i32) -> Vec<(i32, u64)> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else { return Vec::new() };
    let mut out = Vec::new();
    for entry in dir.flatten() {
        let Some(fd) = entry.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(link) = std::fs::read_link(entry.path()) else { continue };
        let link = link.to_string_lossy().into_owned();
        if let Some(ino) = link.strip_prefix("socket:[").and_then(|s| s.strip_suffix(']')) {
            if let Ok(ino) = ino.parse() {
                out.push((fd, ino));
            }
        }
    }
    out.sort_unstable();
    out
}

fn netns_inode(pid: &str) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(format!("/proc/{pid}/ns/net")).ok().map(|m| m.ino())
}

/// The TCP listeners of the tree of `root`, each with a duplicate. Refused by name: a tree in another network namespace than
/// ferry's, a UDP socket bound without a peer, a unix socket that
/// listens, a tree without any TCP listener.
pub fn take(root: i32) -> Result<Vec<OldListener>, ReplaceError> {
    if !std::path::Path::new(&format!("/proc/{root}")).exists() {
        return Err(ReplaceError::NoSuchProcess(root));
    }
    let pids = tree_pids(root);
    let ours = netns_inode("self");
    for &pid in &pids {
        if netns_inode(&pid.to_string()) != ours {
            return Err(ReplaceError::Refused(format!(
                "pid {pid} runs in another network namespace than ferry: its listeners cannot be handed to a binary started here"
            )));
        }
    }
    let mut holders: BTreeMap<u64, Vec<(i32, i32)>> = BTreeMap::new();
    for &pid in &pids {
        for (fd, ino) in socket_fds(pid) {
            holders.entry(ino).or_default().push((pid, fd));
        }
    }
    refuse_unix_listeners(root, &holders)?;
    let running = running_sockets::running_tree_sockets(root);
    let mut out = Vec::new();
    for s in &running.sockets {
        if !s.tcp && s.peer.is_none() {
            return Err(ReplaceError::Refused(format!(
                "pid {} fd {}: a UDP socket bound to {}: only TCP listeners are handed to the new binary",
                s.pid, s.fd, s.local
            )));
        }
        if !s.tcp || s.role != SocketRole::Listener {
            continue;
        }
        let inode = inode_of(s.pid, s.fd)?;
        let dup = duplicate(s.pid, s.fd)?;
        let nonblock = ferry_sys::fd::fcntl_getfl(dup.as_fd())
            .map_err(|e| ReplaceError::Refused(format!("pid {} fd {}: {e}", s.pid, s.fd)))?
            & libc::O_NONBLOCK
            != 0;
        out.push(OldListener {
            local: s.local,
            ipv6: s.ipv6,
            v6only: s.v6only,
            nonblock,
            inode,
            dup,
        });
    }
    if out.is_empty() {
        return Err(ReplaceError::Refused(format!(
            "the tree of pid {root} has no TCP listener to hand over"
        )));
    }
    Ok(out)
}

fn inode_of(pid: i32, fd: i32) -> Result<u64, ReplaceError> {
    let link = std::fs::read_link(format!("/proc/{pid}/fd/{fd}")).map_err(|e| {
        ReplaceError::Refused(format!("pid {pid} fd {fd}: reading the listener's inode: {e}"))
    })?;
    let link = link.to_string_lossy().into_owned();
    link.strip_prefix("socket:[")
        .and_then(|s| s.strip_suffix(']'))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| {
            ReplaceError::Refused(format!("pid {pid} fd {fd}: no longer a socket ({link})"))
        })
}

/// A duplicate of `pid`'s fd `fd` (pidfd_getfd).
pub fn duplicate(pid: i32, fd: i32) -> Result<OwnedFd, ReplaceError> {
    let kernel = |what: &str, e: ferry_sys::SysError| {
        ReplaceError::Refused(format!("pid {pid} fd {fd}: {what}: {e}"))
    };
    let pidfd = ferry_sys::pidfd::pidfd_open(pid).map_err(|e| kernel("pidfd_open", e))?;
    ferry_sys::pidfd::pidfd_getfd(&pidfd, fd).map_err(|e| kernel("pidfd_getfd", e))
}

/// A unix socket that listens (by path or abstract name) would not be
/// handed over: the new binary's bind of it would fail or take another.
fn refuse_unix_listeners(
    root: i32,
    holders: &BTreeMap<u64, Vec<(i32, i32)>>,
) -> Result<(), ReplaceError> {
    const TCP_LISTEN: u8 = 10;
    let ns = std::fs::File::open(format!("/proc/{root}/ns/net")).map_err(|e| {
        ReplaceError::Refused(format!("pid {root}: opening its network namespace: {e}"))
    })?;
    let socks = ferry_sys::sockdiag::unix_sockets_in(ns.as_fd()).map_err(|e| {
        ReplaceError::Refused(format!("listing the unix sockets of pid {root}'s namespace: {e}"))
    })?;
    for u in socks.iter().filter(|u| u.state == TCP_LISTEN) {
        if let Some(&(pid, fd)) = holders.get(&u64::from(u.ino)).and_then(|h| h.first()) {
            return Err(ReplaceError::Refused(format!(
                "pid {pid} fd {fd}: a unix socket listening on {:?}: only TCP listeners are handed to the new binary",
                String::from_utf8_lossy(&u.name)
            )));
        }
    }
    Ok(())
}

/// An IPv4-mapped IPv6 address as the IPv4 address it stands for.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    }
}

/// Whether a bind of `bind` on a socket of family AF_INET6 (`bind_v6`)
/// or AF_INET names the listener at `local` (of family `listener_v6`):
/// the same family and port, and the same address once IPv4-mapped
/// addresses are read as IPv4 (0.0.0.0 and ::ffff:0.0.0.0 are the same
/// wildcard). Port 0 (any free port) names none.
pub fn names_listener(
    local: SocketAddr,
    listener_v6: bool,
    bind: SocketAddr,
    bind_v6: bool,
) -> bool {
    bind.port() != 0
        && listener_v6 == bind_v6
        && local.port() == bind.port()
        && canonical(local.ip()) == canonical(bind.ip())
}

/// The address a bind(2) names: a `struct sockaddr_in` or
/// `sockaddr_in6` as the caller passed it (family in host order, port and
/// address in network order). None for another family or a short one.
pub fn parse_sockaddr(raw: &[u8]) -> Option<SocketAddr> {
    let family = i32::from(u16::from_ne_bytes([*raw.first()?, *raw.get(1)?]));
    let port = u16::from_be_bytes([*raw.get(2)?, *raw.get(3)?]);
    match family {
        libc::AF_INET if raw.len() >= 16 => {
            let ip: [u8; 4] = raw.get(4..8)?.try_into().ok()?;
            Some(SocketAddr::new(IpAddr::from(ip), port))
        }
        libc::AF_INET6 if raw.len() >= 28 => {
            let ip: [u8; 16] = raw.get(8..24)?.try_into().ok()?;
            Some(SocketAddr::new(IpAddr::from(ip), port))
        }
        _ => None,
    }
}

impl OldListener {
    /// "127.0.0.1:8080" or "[::]:80".
    pub fn shown(&self) -> String {
        self.local.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sa(s: &str) -> SocketAddr {
        s.parse().expect("address")
    }

    #[test]
    fn a_bind_names_a_listener_of_its_family_port_and_address() {
        assert!(names_listener(sa("127.0.0.1:80"), false, sa("127.0.0.1:80"), false));
        assert!(names_listener(sa("0.0.0.0:80"), false, sa("0.0.0.0:80"), false));
        assert!(names_listener(sa("[::]:80"), true, sa("[::]:80"), true));
        assert!(!names_listener(sa("127.0.0.1:80"), false, sa("127.0.0.1:81"), false));
        assert!(!names_listener(sa("127.0.0.1:80"), false, sa("127.0.0.2:80"), false));
        // A specific address is not the wildcard.
        assert!(!names_listener(sa("0.0.0.0:80"), false, sa("127.0.0.1:80"), false));
        // Another family is another socket, even for the same address.
        assert!(!names_listener(sa("[::ffff:127.0.0.1]:80"), true, sa("127.0.0.1:80"), false));
        assert!(!names_listener(sa("[::]:80"), true, sa("0.0.0.0:80"), false));
        assert!(!names_listener(sa("0.0.0.0:0"), false, sa("0.0.0.0:0"), false));
    }

    #[test]
    fn ipv4_mapped_addresses_are_their_ipv4_address() {
        // An AF_INET6 socket bound to ::ffff:127.0.0.1, as /proc/net/tcp6
        // or the caller may write it either way.
        assert!(names_listener(sa("[::ffff:127.0.0.1]:80"), true, sa("127.0.0.1:80"), true));
        assert!(names_listener(sa("127.0.0.1:80"), true, sa("[::ffff:127.0.0.1]:80"), true));
        assert!(names_listener(sa("[::ffff:0.0.0.0]:80"), true, sa("0.0.0.0:80"), true));
    }

    #[test]
    fn sockaddrs_parse_as_the_kernel_reads_them() {
        let mut v4 = vec![0u8; 16];
        v4[..2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
        v4[2..4].copy_from_slice(&8080u16.to_be_bytes());
        v4[4..8].copy_from_slice(&[127, 0, 0, 1]);
        assert_eq!(parse_sockaddr(&v4), Some(sa("127.0.0.1:8080")));
        assert_eq!(parse_sockaddr(&v4[..8]), None);
        let mut v6 = vec![0u8; 28];
        v6[..2].copy_from_slice(&(libc::AF_INET6 as u16).to_ne_bytes());
        v6[2..4].copy_from_slice(&443u16.to_be_bytes());
        v6[23] = 1;
        assert_eq!(parse_sockaddr(&v6), Some(sa("[::1]:443")));
        let mut unix = vec![0u8; 110];
        unix[..2].copy_from_slice(&(libc::AF_UNIX as u16).to_ne_bytes());
        assert_eq!(parse_sockaddr(&unix), None);
        assert_eq!(parse_sockaddr(&[]), None);
    }
}
