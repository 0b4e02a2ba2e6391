//! Holding the tree's TCP traffic still while it is captured: one network
//! lock (see ferry-netlock) in the network namespace the tree lives in.
//!
//! The lock is *prepared* before the tree is frozen (for the eBPF method
//! that is the slow part: loading and attaching the program) and at once
//! starts dropping new connection attempts (SYN) to the tree's listeners,
//! while the service still runs: it accepts what its accept queues hold,
//! handshakes under way complete, and no new one starts (a client retries
//! its SYN later and reaches the restored listener). Once the tree is
//! frozen and surveyed, the lock is *extended* with the 4-tuple of every
//! established connection: from then until restore disengages it, no
//! packet of those connections reaches the stack (which would answer with
//! a reset once the socket is gone), and none leaves.

use super::files::tcp::Established;
use super::tcp_tables::TcpTables;
use crate::error::{EngineError, Result};
use ferry_image::{FileKind, OpenFile};
use ferry_netlock::{Method, Netns, NetworkLock, Tuple};
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;

fn netns_inode(pid: i32) -> Result<u64> {
    let path = format!("/proc/{pid}/ns/net");
    std::fs::metadata(&path).map(|m| m.ino()).map_err(|e| EngineError::io(path, e))
}

fn netns_of(pid: i32) -> Netns {
    Netns::Path(format!("/proc/{pid}/ns/net").into())
}

/// One TCP socket of the tree as sock_diag or /proc/PID/net/tcp{,6} shows it.
struct ProcTcp {
    local: SocketAddr,
    state: u8,
    /// For a listener: connections waiting in its accept queue.
    rx_queue: u64,
    inode: u64,
}

impl ProcTcp {
    fn from_diag(d: &ferry_sys::sockdiag::TcpDiag) -> ProcTcp {
        ProcTcp { local: d.local, state: d.state, rx_queue: d.rqueue as u64, inode: d.inode as u64 }
    }
}

/// "0100007F:1F90" (IPv4) or the 32-digit IPv6 form: each 32-bit word in
/// the kernel's byte order.
fn proc_addr(field: &str) -> Option<SocketAddr> {
    let (addr, port) = field.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let mut bytes = Vec::with_capacity(16);
    for i in (0..addr.len()).step_by(8) {
        let word = u32::from_str_radix(addr.get(i..i + 8)?, 16).ok()?;
        bytes.extend_from_slice(&word.to_ne_bytes());
    }
    let ip = match bytes.len() {
        4 => IpAddr::from(<[u8; 4]>::try_from(bytes.as_slice()).ok()?),
        16 => IpAddr::from(<[u8; 16]>::try_from(bytes.as_slice()).ok()?),
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

/// Every TCP socket of the network namespace of `pid`: the sock_diag
/// dump `tables` holds for that namespace (milliseconds for 10,000
/// sockets), or the /proc text tables when sock_diag cannot answer.
fn proc_tcp(pid: i32, tables: &TcpTables) -> Vec<ProcTcp> {
    let listed = |all: &[ferry_sys::sockdiag::TcpDiag]| -> Vec<ProcTcp> {
        all.iter()
            .filter(|d| d.state != ferry_sys::sockdiag::TCP_TIME_WAIT)
            .map(ProcTcp::from_diag)
            .collect()
    };
    let dumped = std::fs::File::open(format!("/proc/{pid}/ns/net")).ok().and_then(|ns| {
        let t = tables.of(ns.metadata().ok()?.ino(), ns.as_fd()).ok()?;
        Some(listed(&t.sockets))
    });
    dumped.unwrap_or_else(|| proc_tcp_text(pid))
}

/// The listeners and the handshakes under way in the network namespace
/// of `pid`, of the families of `listeners`: a dump that asks for these
/// states alone, so the kernel formats no connection of the host's
/// (20,000 of another process's cost the tiny listener's checkpoint 10
/// ms in a full dump), or the /proc text tables when sock_diag cannot
/// answer. A handshake under way (a request socket) has its listener's
/// family (an IPv6 listener's IPv4-mapped ones too): a tree of IPv4
/// listeners needs no IPv6 dump, a walk of the whole connection table.
fn waiting_handshakes(pid: i32, listeners: &[SocketAddr]) -> Vec<ProcTcp> {
    let families = handshake_families(listeners);
    let dumped = std::fs::File::open(format!("/proc/{pid}/ns/net")).ok().and_then(|ns| {
        let states = ferry_sys::sockdiag::TCPF_LISTEN_OR_SYN_RECV;
        ferry_sys::sockdiag::tcp_sockets_in_states(ns.as_fd(), &families, states).ok()
    });
    match dumped {
        Some(all) => all.iter().map(ProcTcp::from_diag).collect(),
        None => proc_tcp_text(pid),
    }
}

/// The address families of `listeners`' sockets, each once.
fn handshake_families(listeners: &[SocketAddr]) -> Vec<i32> {
    let mut families = Vec::with_capacity(2);
    for f in [libc::AF_INET, libc::AF_INET6] {
        if listeners.iter().any(|l| l.is_ipv4() == (f == libc::AF_INET)) {
            families.push(f);
        }
    }
    families
}

fn proc_tcp_text(pid: i32) -> Vec<ProcTcp> {
    let mut out = Vec::new();
    for f in ["tcp", "tcp6"] {
        let text = crate::procfs::read_string(&format!("/proc/{pid}/net/{f}")).unwrap_or_default();
        for l in text.lines().skip(1) {
            let w: Vec<&str> = l.split_whitespace().collect();
            let (Some(local), Some(state), Some(queues), Some(inode)) =
                (w.get(1).and_then(|a| proc_addr(a)), w.get(3), w.get(4), w.get(9))
            else {
                continue;
            };
            let rx_queue = queues
                .split_once(':')
                .and_then(|(_, rx)| u64::from_str_radix(rx, 16).ok())
                .unwrap_or(0);
            let (Ok(state), Ok(inode)) = (u8::from_str_radix(state, 16), inode.parse()) else {
                continue;
            };
            out.push(ProcTcp { local, state, rx_queue, inode });
        }
    }
    out
}

const TCP_ESTABLISHED: u8 = 1;
const TCP_SYN_RECV: u8 = 3;
const TCP_CLOSE_WAIT: u8 = 8;
const TCP_LISTEN: u8 = 10;

/// What the tree holds before it is frozen: whether it has TCP sockets a
/// lock would cover, and the local addresses of its listeners.
pub struct Scan {
    has_tcp: bool,
    listeners: Vec<SocketAddr>,
}

impl Scan {
    /// A tree known to have TCP sockets, its listeners not looked for
    /// (no handshakes are waited for).
    pub(super) fn with_tcp() -> Scan {
        Scan { has_tcp: true, listeners: Vec::new() }
    }
}

/// `inodes`: the socket inodes of the tree, as the presurvey listed them.
pub(super) fn scan(root: i32, inodes: &std::collections::HashSet<u64>, tables: &TcpTables) -> Scan {
    if inodes.is_empty() {
        return Scan { has_tcp: false, listeners: Vec::new() };
    }
    let mine: Vec<ProcTcp> =
        proc_tcp(root, tables).into_iter().filter(|t| inodes.contains(&t.inode)).collect();
    Scan {
        has_tcp: mine
            .iter()
            .any(|t| matches!(t.state, TCP_ESTABLISHED | TCP_CLOSE_WAIT | TCP_LISTEN)),
        listeners: mine.iter().filter(|t| t.state == TCP_LISTEN).map(|t| t.local).collect(),
    }
}

/// Prepares a lock before the tree is frozen, when the tree has TCP
/// sockets it could apply to, and starts holding new connection attempts
/// to its listeners right away; then, with `wait_handshakes`, waits (at
/// most a second) while the still running service accepts what its
/// accept queues hold and the handshakes under way complete. None when
/// the tree has no TCP socket. `kept`: a lock kept from the capture
/// before ([`super::KeptLock`], prepared), used instead of a new one
/// (returned as it is when the tree has no TCP socket: the engage gives
/// it back).
pub fn prepare(
    root: i32,
    scan: &Scan,
    method: Method,
    wait_handshakes: bool,
    kept: Option<NetworkLock>,
) -> Result<Option<NetworkLock>> {
    if !scan.has_tcp {
        return Ok(kept);
    }
    let mut lock = match kept {
        Some(lock) => lock,
        None => NetworkLock::prepare(method, &netns_of(root), "ckpt")?,
    };
    if scan.listeners.is_empty() || !wait_handshakes {
        return Ok(Some(lock));
    }
    let mut tuples = Vec::new();
    for &l in &scan.listeners {
        tuples.extend(listener_addresses(root, l)?.into_iter().map(Tuple::new_connections_to));
    }
    tuples.sort_unstable_by_key(|t| t.local);
    tuples.dedup();
    lock.engage(&tuples)?;
    let ports: std::collections::HashSet<u16> = scan.listeners.iter().map(|l| l.port()).collect();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
    loop {
        let pending = waiting_handshakes(root, &scan.listeners)
            .iter()
            .filter(|t| ports.contains(&t.local.port()))
            .any(|t| (t.state == TCP_LISTEN && t.rx_queue > 0) || t.state == TCP_SYN_RECV);
        if !pending || std::time::Instant::now() > deadline {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    Ok(Some(lock))
}

/// The local addresses a listener bound to `local` accepts connections
/// on: itself, or every address of the namespace for a wildcard bind.
fn listener_addresses(pid: i32, local: SocketAddr) -> Result<Vec<SocketAddr>> {
    if !local.ip().is_unspecified() {
        return Ok(vec![local]);
    }
    let ns_path = format!("/proc/{pid}/ns/net");
    let ns = std::fs::File::open(&ns_path).map_err(|e| EngineError::io(&ns_path, e))?;
    let addrs = std::thread::scope(|s| {
        s.spawn(|| {
            ferry_sys::netns::enter_net_namespace(ns.as_fd())?;
            ferry_sys::netns::addresses()
        })
        .join()
        .unwrap_or_else(|_| Err(ferry_sys::SysError::new("getifaddrs", libc::EIO)))
    })
    .map_err(|e| EngineError::kernel(pid, "listing the addresses of the network namespace", e))?;
    let v6 = local.is_ipv6();
    Ok(addrs
        .into_iter()
        // An IPv6 wildcard listener also takes IPv4 unless V6ONLY; locking
        // both families is harmless.
        .filter(|a| v6 || a.is_ipv4())
        .filter(|a| !matches!(a, IpAddr::V6(v6a) if v6a.segments()[0] & 0xffc0 == 0xfe80))
        .map(|a| SocketAddr::new(a, local.port()))
        .collect())
}

/// New connection attempts to every listening TCP socket of the tree.
fn listener_tuples(procs: &[(i32, &[OpenFile])]) -> Result<Vec<Tuple>> {
    let mut out = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for (pid, files) in procs {
        for f in files.iter() {
            let FileKind::InetSocket(s) = &f.kind else {
                continue;
            };
            if s.listen_backlog.is_none() || !seen.insert(f.id) {
                continue;
            }
            let ip: IpAddr = match s.addr.len() {
                4 => IpAddr::from(<[u8; 4]>::try_from(s.addr.as_slice()).unwrap_or([0; 4])),
                _ => IpAddr::from(<[u8; 16]>::try_from(s.addr.as_slice()).unwrap_or([0; 16])),
            };
            for local in listener_addresses(*pid, SocketAddr::new(ip, s.port))? {
                out.push(Tuple::new_connections_to(local));
            }
        }
    }
    out.sort_unstable_by_key(|t| t.local);
    out.dedup();
    Ok(out)
}

/// Starts holding every established connection and every listener of the
/// tree still. `prepared` is the lock made before the freeze; without one
/// (no TCP socket was seen then), one is made now. None when the tree has
/// neither connections nor listeners (`prepared` then goes back to
/// `kept` when given, else is released).
pub fn engage(
    prepared: Option<NetworkLock>,
    conns: &[Established],
    procs: &[(i32, &[OpenFile])],
    method: Method,
    kept: Option<&super::KeptLock>,
) -> Result<Option<NetworkLock>> {
    let Some(first_pid) = conns.first().map(|c| c.pid).or_else(|| procs.first().map(|p| p.0))
    else {
        return Ok(prepared);
    };
    let ns = netns_inode(first_pid)?;
    for c in conns {
        if c.pid != first_pid && netns_inode(c.pid)? != ns {
            return Err(EngineError::unsupported(
                c.pid,
                format!("fd {} (TCP {} -> {})", c.fd, c.local, c.remote),
                format!("its process is in another network namespace than pid {first_pid} (one network namespace per tree)"),
            ));
        }
    }
    let mut tuples: Vec<Tuple> =
        conns.iter().map(|c| Tuple { local: c.local, remote: c.remote }).collect();
    tuples.extend(listener_tuples(procs)?);
    if tuples.is_empty() {
        match (prepared, kept) {
            (Some(lock), Some(kept)) => kept.put(lock),
            (Some(lock), None) => lock.thaw()?,
            (None, _) => {}
        }
        return Ok(None);
    }
    // (Listener wildcards again: one may have appeared since the scan.)
    match prepared {
        Some(mut lock) => {
            if lock.phase() == Some(ferry_netlock::Phase::Engaged) {
                // Listeners are held already; a wildcard added twice is
                // harmless.
                lock.extend(&tuples)?;
            } else {
                lock.engage(&tuples)?;
            }
            Ok(Some(lock))
        }
        None => Ok(Some(NetworkLock::freeze(method, &netns_of(first_pid), &tuples, "ckpt")?)),
    }
}

/// Listeners must have had an empty accept queue since the survey: a
/// connection that completed its handshake before the lock engaged would
/// be lost with the listener. Refuses by name (the checkpoint is undone
/// and can simply be tried again).
pub fn check_accept_queues<'a>(
    procs: &[(i32, &[OpenFile], &[ferry_image::FdSlot])],
    pidfd_of: impl Fn(i32) -> Option<&'a std::os::fd::OwnedFd>,
) -> Result<()> {
    use std::os::fd::AsRawFd;
    for (pid, files, fds) in procs {
        let first_fd = super::files::first_fd_of_each_file(fds);
        for (i, f) in files.iter().enumerate() {
            let FileKind::InetSocket(s) = &f.kind else {
                continue;
            };
            if s.listen_backlog.is_none() {
                continue;
            }
            let (Some(&fd), Some(pidfd)) = (first_fd.get(&(i as u32)), pidfd_of(*pid)) else {
                continue;
            };
            let sock = ferry_sys::pidfd::pidfd_getfd(pidfd, fd)
                .map_err(|e| EngineError::kernel(*pid, format!("duplicating fd {fd}"), e))?;
            let ti = ferry_sys::socket::tcp_info(sock.as_raw_fd())
                .map_err(|e| EngineError::kernel(*pid, format!("fd {fd}: reading TCP_INFO"), e))?;
            // A listener's accept queue length is in tcpi_unacked.
            if ti.tcpi_unacked > 0 {
                return Err(EngineError::transient(
                    *pid,
                    format!("fd {fd} (TCP listener on port {})", s.port),
                    format!(
                        "{} connections arrived in its accept queue during the checkpoint",
                        ti.tcpi_unacked
                    ),
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handshakes_are_looked_for_in_the_families_of_the_listeners() {
        let v4: SocketAddr = "0.0.0.0:80".parse().expect("v4");
        let v6: SocketAddr = "[::]:80".parse().expect("v6");
        let mapped: SocketAddr = "[::ffff:127.0.0.1]:80".parse().expect("mapped");
        assert_eq!(handshake_families(&[v4]), vec![libc::AF_INET]);
        assert_eq!(handshake_families(&[v6, mapped]), vec![libc::AF_INET6]);
        assert_eq!(handshake_families(&[v6, v4, v4]), vec![libc::AF_INET, libc::AF_INET6]);
    }

    #[test]
    fn reads_proc_net_tcp_addresses() {
        assert_eq!(proc_addr("0100007F:1F90"), Some("127.0.0.1:8080".parse().expect("addr")));
        assert_eq!(proc_addr("0102000C:0050"), Some("12.0.2.1:80".parse().expect("addr")));
        assert_eq!(
            proc_addr("00000000000000000000000001000000:1F90"),
            Some("[::1]:8080".parse().expect("addr"))
        );
        assert_eq!(
            proc_addr("0000000000000000FFFF00000100007F:0016"),
            Some("[::ffff:127.0.0.1]:22".parse().expect("addr"))
        );
        assert_eq!(proc_addr("zz:1"), None);
        assert_eq!(proc_addr("0100007F"), None);
        assert_eq!(proc_addr("0100007F:99999"), None);
    }
}
