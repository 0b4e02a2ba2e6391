//! Sockets a copy of the service that died on this host left behind (a
//! host back without a reboot, a primary whose processes were killed):
//! closing connections in FIN_WAIT or LAST_ACK, TIME_WAIT entries. One
//! with the 4-tuple of a connection the tree holds keeps the restore from
//! connecting that connection's socket again (EADDRNOTAVAIL), after the
//! standby already won the service. A takeover ends them first. A socket
//! that a process still holds is not ended: it is somebody's, and the
//! takeover stops naming it.

use crate::error::{MigrateError, Result};
use ferry_image::{FileKind, TreeImage};
use ferry_sys::sockdiag::DiagSocket;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// Ends every socket of this namespace that no process holds and that has
/// the addresses of one of `tree`'s established connections. Returns how
/// many were ended.
pub(super) fn remove(tree: &TreeImage) -> Result<usize> {
    let tuples = connection_tuples(tree);
    if tuples.is_empty() {
        return Ok(0);
    }
    let ns = std::fs::File::open("/proc/thread-self/ns/net")
        .map_err(|e| MigrateError::Invalid(format!("opening this network namespace: {e}")))?;
    let diag = DiagSocket::in_netns(std::os::fd::AsFd::as_fd(&ns))
        .map_err(|e| MigrateError::sys("a sock_diag socket for stale connections", e))?;
    let mut ended = 0;
    for (local, remote) in tuples {
        let what = || format!("TCP {local} -> {remote}");
        let Some(found) =
            diag.tcp_connection(local, remote).map_err(|e| MigrateError::sys(what(), e))?
        else {
            continue;
        };
        if found.inode != 0 {
            return Err(MigrateError::Invalid(format!(
                "{}: a socket of this host already has this connection's addresses \
                 (state {}, socket inode {}): it belongs to a running process",
                what(),
                found.state,
                found.inode
            )));
        }
        if diag.destroy_tcp(local, remote).map_err(|e| MigrateError::sys(what(), e))? {
            ended += 1;
        }
    }
    Ok(ended)
}

/// Each established connection of the tree as (local, remote), in its
/// socket's own family (a dual-stack socket's IPv4-mapped addresses stay
/// IPv6: that is the table the kernel looks it up in).
fn connection_tuples(tree: &TreeImage) -> Vec<(SocketAddr, SocketAddr)> {
    let mut out = Vec::new();
    for f in tree.processes.iter().flat_map(|p| &p.files) {
        let FileKind::InetSocket(s) = &f.kind else { continue };
        let (Some(_), Some((peer, peer_port))) = (&s.connection, &s.peer) else { continue };
        if let (Some(l), Some(r)) = (ip(&s.addr), ip(peer)) {
            out.push((SocketAddr::new(l, s.port), SocketAddr::new(r, *peer_port)));
        }
    }
    out.sort();
    out.dedup();
    out
}

fn ip(bytes: &[u8]) -> Option<IpAddr> {
    match bytes.len() {
        4 => Some(IpAddr::V4(Ipv4Addr::new(bytes[0], bytes[1], bytes[2], bytes[3]))),
        16 => Some(IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(bytes).ok()?))),
        _ => None,
    }
}
