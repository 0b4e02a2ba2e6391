//! The network lock at the destination: prepared before Welcome, engaged
//! with the image's connections before the restore, handed to the
//! restored tree, which takes it down once it runs.

use crate::error::Result;
use ferry_image::{FileKind, TreeImage};
use ferry_netlock::{NetworkLock, Tuple};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The engaged lock until the tree is released.
pub(super) struct Engaged {
    /// Released by name on every path out, unless the tree took it.
    guard: LockByName,
    /// No connection to hold: taken down after the release, where its
    /// tens of ms do not count in the pause.
    unneeded: Option<NetworkLock>,
}

pub(super) fn engage(lock: NetworkLock, tree: &TreeImage) -> Result<Engaged> {
    let tuples = held_tuples(tree);
    if tuples.is_empty() {
        return Ok(Engaged { guard: LockByName(None), unneeded: Some(lock) });
    }
    let mut lock = lock;
    lock.engage(&tuples)?;
    Ok(Engaged { guard: LockByName(Some(lock.hand_over())), unneeded: None })
}

impl Engaged {
    /// The name the restored tree adopts the lock by.
    pub(super) fn adopt_name(&self) -> Option<String> {
        self.guard.0.clone()
    }

    /// The lock went with the released tree.
    pub(super) fn taken_by_tree(&mut self) {
        self.guard.0 = None;
    }

    pub(super) fn thaw_unneeded(&mut self) -> Result<()> {
        if let Some(l) = self.unneeded.take() {
            l.thaw()?;
        }
        Ok(())
    }
}

/// Releases a handed-over lock by name unless the restored tree took it.
struct LockByName(Option<String>);

impl Drop for LockByName {
    fn drop(&mut self) {
        if let Some(name) = self.0.take() {
            if let Err(e) = ferry_netlock::release(&name) {
                tracing::warn!("releasing network lock {name}: {e}");
            }
        }
    }
}

fn ip_of(bytes: &[u8]) -> Option<IpAddr> {
    match bytes.len() {
        4 => Some(IpAddr::V4(Ipv4Addr::new(bytes[0], bytes[1], bytes[2], bytes[3]))),
        16 => {
            let v6 = Ipv6Addr::from(<[u8; 16]>::try_from(bytes).ok()?);
            Some(v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4))
        }
        _ => None,
    }
}

/// What the lock holds here until the tree is released: the tree's
/// established connections, and new connection attempts to its listeners
/// (a SYN answered by no listener would be refused).
fn held_tuples(tree: &TreeImage) -> Vec<Tuple> {
    let mut out = Vec::new();
    for p in &tree.processes {
        for f in &p.files {
            let FileKind::InetSocket(s) = &f.kind else {
                continue;
            };
            if s.sock_type != libc::SOCK_STREAM {
                continue;
            }
            let Some(local_ip) = ip_of(&s.addr) else {
                continue;
            };
            let local = SocketAddr::new(local_ip, s.port);
            if s.listen_backlog.is_some() {
                if !local_ip.is_unspecified() && !local_ip.is_loopback() {
                    out.push(Tuple::new_connections_to(local));
                }
                continue;
            }
            if let (Some(_), Some((peer, port))) = (&s.connection, &s.peer) {
                if let Some(remote) = ip_of(peer) {
                    out.push(Tuple { local, remote: SocketAddr::new(remote, *port) });
                }
            }
        }
    }
    out.sort_by_key(|t| (t.local, t.remote));
    out.dedup_by_key(|t| (t.local, t.remote));
    out
}
