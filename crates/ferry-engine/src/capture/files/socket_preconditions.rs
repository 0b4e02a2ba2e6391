//! Socket states a socket made again at restore cannot have, refused by
//! name at checkpoint (in the survey: the tree is frozen and thawed
//! again on refusal) instead of a restore that fails after the tree was
//! killed or one that silently loses them:
//!
//! - an error pending (SO_ERROR: a refused connect, a reset, an ICMP
//!   error; or MSG_ERRQUEUE entries), which nothing can set again;
//! - a TCP socket closed after a connection (reset, or closed both ways)
//!   while its fd stays open: its unread bytes and EOF;
//! - shutdown(SHUT_RD) on an established connection or a UDP socket,
//!   and shutdown(SHUT_WR) on a UDP socket or on a TCP socket before its
//!   connect (read with sock_diag);
//! - an unread urgent byte (TCP MSG_OOB, also with SO_OOBINLINE; unix
//!   stream MSG_OOB), and an urgent byte sent that the peer has not
//!   acknowledged yet (its send queue's urgent pointer, read by
//!   [`crate::capture::socket_refs`]: nothing else shows it);
//! - a TCP_MAXSEG value setsockopt does not accept (a closed socket
//!   reports the MSS of its last connection);
//! - UDP bytes corked in the send queue (UDP_CORK or MSG_MORE);
//! - a bound address no interface holds any more (restore's bind gets
//!   EADDRNOTAVAIL);
//! - a listening or bound TCP socket without SO_REUSEADDR whose port
//!   has a connection in TIME_WAIT (restore's bind gets EADDRINUSE until
//!   it ends), or with SO_REUSEADDR when that connection's socket had
//!   none (read by [`super::time_wait`]);
//! - an established TCP connection in flight in a unix queue while a
//!   process of the tree holds it too (connections are remade after the
//!   queues are refilled).
//!
//! Everything is read without changing the socket: poll reports errors,
//! urgent data and shutdown without consuming them; sock_diag the
//! shutdown bits poll does not show.

use super::FdInfo;
use crate::capture::tcp_tables::{ask_alone, Alone, TcpTables, TreeSocket};
use crate::error::{EngineError, Result};
use ferry_image::{PassedFd, SockOpt};
use ferry_sys::sockdiag::{TcpDump, TCP_TIME_WAIT};
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex, MutexGuard};

/// TCP states as TCP_INFO reports them.
const TCP_ESTABLISHED: u8 = 1;
const TCP_CLOSE: u8 = 7;
const TCP_LISTEN: u8 = 10;
/// What setsockopt(TCP_MAXSEG) accepts (TCP_MIN_MSS .. MAX_TCP_WINDOW).
const MSS_RANGE: std::ops::RangeInclusive<i32> = 88..=32767;

/// What the checks learn once per process about its network namespace,
/// where restore makes its sockets again: its TIME_WAIT connections and
/// which addresses can be bound. Read from the process's namespace, not
/// each socket's, so 10,000 connections cost one lookup each.
pub struct Tables {
    netns: Mutex<Option<Arc<OwnedFd>>>,
    /// Its TCP sockets and TIME_WAIT connections, from one dump, for
    /// the connections past [`EXACT_LOOKUPS`].
    tcp: TcpTables,
    /// Its TIME_WAIT connections alone, by the listeners' ports, for
    /// their check.
    time_wait: TcpTables,
    /// Its TIME_WAIT connections made without SO_REUSEADDR (the BPF tcp
    /// iterator's; none when the kernel refuses it).
    time_wait_no_reuse: Mutex<Option<Arc<Vec<SocketAddr>>>>,
    local: Mutex<HashMap<IpAddr, bool>>,
    /// inode -> sk_shutdown of the namespace's UDP sockets.
    udp_shutdown: Mutex<Option<Arc<HashMap<u32, u8>>>>,
    /// For the first [`EXACT_LOOKUPS`] connections: each looked up by its
    /// addresses, then the namespace's dump.
    diag: Mutex<Option<ferry_sys::sockdiag::DiagSocket>>,
    exact_lookups: std::sync::atomic::AtomicUsize,
    /// The image may be restored in this namespace, where its TIME_WAIT
    /// connections hold ports (see `CaptureOptions::restored_elsewhere`).
    restored_here: bool,
}

impl Tables {
    pub(super) fn new(restored_here: bool) -> Tables {
        Tables {
            netns: Mutex::default(),
            tcp: TcpTables::in_freeze(),
            time_wait: TcpTables::time_wait(),
            time_wait_no_reuse: Mutex::default(),
            local: Mutex::default(),
            udp_shutdown: Mutex::default(),
            diag: Mutex::default(),
            exact_lookups: Default::default(),
            restored_here,
        }
    }
}

fn locked<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One IPv4/IPv6 socket as the capture read it.
pub(super) struct InetFacts<'a> {
    /// Ferry's duplicate of the socket.
    pub sock: BorrowedFd<'a>,
    pub tcp: bool,
    pub state: u8,
    pub local: SocketAddr,
    /// A connected socket's peer.
    pub peer: Option<SocketAddr>,
    pub options: &'a [SockOpt],
    /// A TCP socket's sock_diag record, asked once for every check that
    /// needs it ([`tcp_diag`]).
    pub diag: std::cell::OnceCell<Option<ferry_sys::sockdiag::TcpDiag>>,
}

impl InetFacts<'_> {
    fn option(&self, level: i32, name: i32) -> Option<i32> {
        let o = self.options.iter().find(|o| o.level == level && o.name == name)?;
        let v = o.value.get(..4)?;
        Some(i32::from_ne_bytes([v[0], v[1], v[2], v[3]]))
    }
    fn flag(&self, level: i32, name: i32) -> bool {
        self.option(level, name).is_some_and(|v| v != 0)
    }
}

/// The events poll reports now, without waiting or consuming any.
pub(crate) fn revents(fd: RawFd) -> i16 {
    let mut p =
        [libc::pollfd { fd, events: libc::POLLIN | libc::POLLPRI | libc::POLLRDHUP, revents: 0 }];
    match ferry_sys::fd::poll(&mut p, 0) {
        Ok(_) => p[0].revents,
        Err(_) => 0,
    }
}

/// Why an IPv4/IPv6 socket with these poll events cannot be made again,
/// and whether that passes by itself: a service reads a pending error
/// and closes a connection reset or closed under it soon (clients do
/// that during a checkpoint), so those are tried again.
pub(crate) fn poll_refusal(revents: i16, tcp: bool, state: u8) -> Option<(&'static str, bool)> {
    if revents & libc::POLLERR != 0 {
        return Some(("an error is pending on it (what SO_ERROR or MSG_ERRQUEUE would report: a refused or reset connection, an ICMP error), which a socket made again cannot have", true));
    }
    let rdhup = revents & libc::POLLRDHUP != 0;
    if tcp && state != TCP_LISTEN && revents & libc::POLLPRI != 0 {
        let why =
            "an urgent byte (MSG_OOB) is unread, and a connection made again has no urgent mark";
        return Some((why, false));
    }
    if tcp && state == TCP_CLOSE && rdhup {
        return Some(("its TCP connection was closed both ways or reset while the fd stays open; a socket made again cannot end that way (its unread bytes and EOF would be lost)", true));
    }
    if rdhup && (!tcp || state == TCP_ESTABLISHED) {
        return Some(("it was shut down for reading (shutdown SHUT_RD), which a socket made again would not be", false));
    }
    None
}

/// Whether TIME_WAIT connection `tw` holds the port a socket bound to
/// `local` needs.
fn holds_port(local: SocketAddr, tw: SocketAddr) -> bool {
    let plain = |ip: IpAddr| match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    };
    tw.port() == local.port()
        && (local.ip().is_unspecified() || plain(local.ip()) == plain(tw.ip()))
}

/// The checks of one IPv4/IPv6 socket (see the module comment).
pub(super) fn check_inet(info: &FdInfo, s: &InetFacts) -> Result<()> {
    if let Some((why, passing)) = poll_refusal(revents(s.sock.as_raw_fd()), s.tcp, s.state) {
        return Err(if passing { info.busy(why) } else { info.unsupported(why) });
    }
    if let Some(mss) = s.option(libc::IPPROTO_TCP, libc::TCP_MAXSEG) {
        if !MSS_RANGE.contains(&mss) {
            return Err(info.unsupported(format!(
                "TCP_MAXSEG reads {mss}, outside what setsockopt accepts ({}-{}): restore could not set it",
                MSS_RANGE.start(),
                MSS_RANGE.end()
            )));
        }
    }
    if !s.tcp {
        check_corked(info, s)?;
    } else {
        check_urgent_gap(info, s)?;
    }
    check_shut_down_for_writing(info, s)?;
    check_address(info, s)?;
    check_time_wait(info, s)
}

/// The checks of a connection described by the capture before, whose
/// description stands ([`super::inet::recheck_kept`]): those of
/// [`check_inet`] that the network or the host can fail without a call
/// of the tree's that the kept watch counts. An urgent byte read
/// out of band leaves its place in the receive queue (recv is not
/// counted); an address can be taken off the namespace's interfaces.
/// The poll check is made again under the lock in the freeze; the MSS,
/// shutdown and TIME_WAIT checks follow from counted calls (or apply
/// to listeners and closed sockets only).
pub(super) fn recheck_kept(info: &FdInfo, s: &InetFacts) -> Result<()> {
    if s.tcp {
        check_urgent_gap(info, s)?;
    }
    check_address(info, s)
}

/// The process's network namespace, opened once.
fn netns(info: &FdInfo) -> Result<Arc<OwnedFd>> {
    let mut ns = locked(&info.socket_tables.netns);
    if let Some(ns) = ns.as_ref() {
        return Ok(ns.clone());
    }
    let path = format!("/proc/{}/ns/net", info.pid);
    let f = std::fs::File::open(&path).map_err(|e| EngineError::io(&path, e))?;
    let opened = Arc::new(OwnedFd::from(f));
    *ns = Some(opened.clone());
    Ok(opened)
}

fn check_corked(info: &FdInfo, s: &InetFacts) -> Result<()> {
    let fd = s.sock.as_raw_fd();
    let queued = ferry_sys::socket::outq(fd).unwrap_or(0);
    if queued == 0 {
        return Ok(());
    }
    let corked = ferry_sys::socket::getsockopt_int(fd, libc::IPPROTO_UDP, libc::UDP_CORK)
        .is_ok_and(|v| v != 0);
    let why = format!(
        "{queued} bytes wait in its send queue (corked with UDP_CORK or MSG_MORE), which a socket made again would not hold"
    );
    Err(if corked { info.unsupported(why) } else { info.busy(why) })
}

/// A socket shut down for writing that a socket made again would not
/// be: UDP (poll shows it only with both sides shut down; SHUT_RD is
/// refused by the poll check before), and TCP shut down before its
/// connect, which sends no FIN (an established connection's SHUT_WR
/// moves it to FIN_WAIT, refused by its state).
fn check_shut_down_for_writing(info: &FdInfo, s: &InetFacts) -> Result<()> {
    if s.tcp && s.state != TCP_ESTABLISHED && s.state != TCP_CLOSE {
        return Ok(());
    }
    if shutdown_bits(info, s)? & 2 == 0 {
        return Ok(());
    }
    let when = if s.tcp { " before its connect (no FIN was sent)" } else { "" };
    Err(info.unsupported(format!(
        "it was shut down for writing (shutdown SHUT_WR){when}, which a socket made again would not be"
    )))
}

/// The socket's sk_shutdown, from one sock_diag dump per protocol of the
/// process's namespace (another namespace's only for a socket made there).
fn shutdown_bits(info: &FdInfo, s: &InetFacts) -> Result<u8> {
    use std::os::unix::fs::MetadataExt;
    let inode = info.meta.ino() as u32;
    let protocol = if s.tcp { libc::IPPROTO_TCP } else { libc::IPPROTO_UDP };
    let list = |ns: BorrowedFd| {
        ferry_sys::sockdiag::inet_shutdowns_in(ns, protocol)
            .map_err(|e| EngineError::kernel(info.pid, "listing sockets (sock_diag)", e))
    };
    let found = if s.tcp {
        tcp_diag(info, s)?.map(|d| d.shutdown)
    } else {
        let cached = locked(&info.socket_tables.udp_shutdown).clone();
        let table = match cached {
            Some(t) => t,
            None => {
                let ns = netns(info)?;
                let t: Arc<HashMap<u32, u8>> = Arc::new(list(ns.as_fd())?.into_iter().collect());
                *locked(&info.socket_tables.udp_shutdown) = Some(t.clone());
                t
            }
        };
        table.get(&inode).copied()
    };
    if let Some(bits) = found {
        return Ok(bits);
    }
    if in_process_netns(info, s)? {
        return Ok(0);
    }
    let ns = ferry_sys::sockdiag::socket_netns(s.sock)
        .map_err(|e| EngineError::kernel(info.pid, format!("fd {}: SIOCGSKNS", info.fd), e))?;
    Ok(list(ns.as_fd())?.into_iter().find(|&(i, _)| i == inode).map_or(0, |(_, b)| b))
}

/// Up to this many TCP sockets per process are asked alone (a few
/// microseconds each) rather than in a dump of the namespace's TCP
/// sockets, which walks the kernel's whole connection table: every
/// namespace's, sized for the machine (262,144 buckets with 24 GiB).
const EXACT_LOOKUPS: usize = crate::capture::tcp_tables::ASKED_ALONE_UP_TO;

/// What sock_diag reports of a TCP socket of the process's namespace:
/// looked up by its addresses, or from the namespace's dump; None for
/// another namespace's socket.
fn tcp_diag(info: &FdInfo, s: &InetFacts) -> Result<Option<ferry_sys::sockdiag::TcpDiag>> {
    use std::os::unix::fs::MetadataExt;
    if let Some(d) = s.diag.get() {
        return Ok(*d);
    }
    let inode = info.meta.ino() as u32;
    let d = match looked_up(info, s, inode)? {
        Alone::Listed(d) => Some(d),
        Alone::Unlisted => None,
        Alone::Unknown => tcp_table(info, &info.socket_tables.tcp, None)?.by_inode(inode).copied(),
    };
    let _ = s.diag.set(d);
    Ok(d)
}

/// A connection whose receive queue holds the place of an urgent byte
/// already read with recv(MSG_OOB): reads stop at that place and then
/// skip it, so the queue read whole in repair mode stops there too, and
/// a connection made again would lose the bytes after it (or have no gap
/// to skip). sock_diag counts every byte not yet read (rcv_nxt -
/// copied_seq, and a FIN received); SIOCINQ counts only up to an urgent
/// place. The tree is frozen, so the count can only grow between the
/// two: SIOCINQ below sock_diag's count is such a place.
fn check_urgent_gap(info: &FdInfo, s: &InetFacts) -> Result<()> {
    const TCP_CLOSE_WAIT: u8 = 8;
    if s.peer.is_none() || (s.state != TCP_ESTABLISHED && s.state != TCP_CLOSE_WAIT) {
        return Ok(());
    }
    let Some(d) = tcp_diag(info, s)? else { return Ok(()) };
    let fin = u32::from(d.state == TCP_CLOSE_WAIT);
    let unread = d.rqueue.saturating_sub(fin);
    // Nothing unread: no urgent byte lies inside (the common case, and
    // one call fewer).
    if unread == 0 {
        return Ok(());
    }
    let inq = ferry_sys::socket::inq(s.sock.as_raw_fd())
        .map_err(|e| EngineError::kernel(info.pid, format!("fd {}: SIOCINQ", info.fd), e))?;
    if inq >= unread {
        return Ok(());
    }
    Err(info.unsupported(format!(
        "an urgent byte (MSG_OOB) already read lies inside its receive queue: reads stop at its place after {inq} of the {unread} unread bytes and then skip it, and a connection made again has no such gap"
    )))
}

/// A TCP socket of the process's namespace asked alone
/// ([`crate::capture::tcp_tables::ask_alone`]: a connection by its
/// addresses, a listener by its own); Unknown when it must come from the
/// dump (not certain, another namespace's, or past [`EXACT_LOOKUPS`]).
fn looked_up(info: &FdInfo, s: &InetFacts, inode: u32) -> Result<Alone> {
    use std::sync::atomic::Ordering;
    let tree =
        TreeSocket { inode, local: s.local, peer: s.peer, state: Some(s.state), cookie: None };
    // One that no dump lists (unbound and closed) needs no question.
    if s.peer.is_none() && s.state == TCP_CLOSE && s.local.port() == 0 {
        return Ok(Alone::Unlisted);
    }
    if info.socket_tables.exact_lookups.fetch_add(1, Ordering::Relaxed) >= EXACT_LOOKUPS
        || !in_process_netns(info, s)?
    {
        return Ok(Alone::Unknown);
    }
    let kerr = |e| EngineError::kernel(info.pid, format!("fd {}: sock_diag lookup", info.fd), e);
    // Held from the question to its answer: the worker threads share it.
    let mut diag = locked(&info.socket_tables.diag);
    if diag.is_none() {
        let ns = netns(info)?;
        *diag = Some(ferry_sys::sockdiag::DiagSocket::in_netns(ns.as_fd()).map_err(kerr)?);
    }
    let Some(diag) = diag.as_ref() else { return Ok(Alone::Unknown) };
    Ok(ask_alone(diag, &tree, TcpDump::Plain))
}

/// Whether the socket belongs to the process's network namespace.
fn in_process_netns(info: &FdInfo, s: &InetFacts) -> Result<bool> {
    let kerr = |what: &str, e| EngineError::kernel(info.pid, format!("fd {}: {what}", info.fd), e);
    let theirs = ferry_sys::sockdiag::socket_netns(s.sock).map_err(|e| kerr("SIOCGSKNS", e))?;
    let ours = netns(info)?;
    let a = ferry_sys::sockdiag::inode_of(theirs.as_fd()).map_err(|e| kerr("fstat", e))?;
    let b = ferry_sys::sockdiag::inode_of(ours.as_fd()).map_err(|e| kerr("fstat", e))?;
    Ok(a == b)
}

/// A bound address must still be one restore can bind.
fn check_address(info: &FdInfo, s: &InetFacts) -> Result<()> {
    let ip = match s.local.ip() {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    };
    let link_local = matches!(ip, IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80);
    let nonlocal_allowed = s.flag(libc::IPPROTO_IP, libc::IP_FREEBIND)
        || s.flag(libc::IPPROTO_IP, libc::IP_TRANSPARENT);
    if ip.is_unspecified() || link_local || nonlocal_allowed {
        return Ok(());
    }
    let cached = locked(&info.socket_tables.local).get(&ip).copied();
    let local = match cached {
        Some(l) => l,
        None => {
            let ns = netns(info)?;
            let l = ferry_sys::sockdiag::address_is_local_in(ns.as_fd(), ip).map_err(|e| {
                EngineError::kernel(info.pid, format!("fd {}: probing address {ip}", info.fd), e)
            })?;
            locked(&info.socket_tables.local).insert(ip, l);
            l
        }
    };
    if local {
        return Ok(());
    }
    Err(info.unsupported(format!(
        "it is bound to {}, an address no interface of its network namespace holds any more: restore could not bind it",
        s.local
    )))
}

/// A listening or bound TCP socket cannot bind its port again while a
/// TIME_WAIT connection holds it, unless both it and the connection's
/// socket had SO_REUSEADDR: one accepted while the listener lacked it
/// (set later) has none, which only the BPF tcp iterator shows.
fn check_time_wait(info: &FdInfo, s: &InetFacts) -> Result<()> {
    let rebinds = s.tcp && (s.state == TCP_LISTEN || s.state == TCP_CLOSE) && s.local.port() != 0;
    if !rebinds || !info.socket_tables.restored_here {
        return Ok(());
    }
    let table = tcp_table(info, &info.socket_tables.time_wait, Some(s.local.port()))?;
    let tws: Vec<SocketAddr> =
        table.sockets.iter().filter(|d| d.state == TCP_TIME_WAIT).map(|d| d.local).collect();
    if !tws.iter().any(|tw| holds_port(s.local, *tw)) {
        return Ok(());
    }
    let reuse = s.flag(libc::SOL_SOCKET, libc::SO_REUSEADDR);
    let holding = if reuse {
        time_wait_no_reuse(info, &info.socket_tables.time_wait_no_reuse)?
            .iter()
            .find(|tw| holds_port(s.local, **tw))
            .copied()
    } else {
        tws.iter().find(|tw| holds_port(s.local, **tw)).copied()
    };
    let Some(tw) = holding else { return Ok(()) };
    let whose = if reuse {
        "was made by a socket without SO_REUSEADDR (accepted before the listener set it)"
    } else {
        "the socket has no SO_REUSEADDR"
    };
    Err(info.busy(format!(
        "a connection in TIME_WAIT holds {tw} and {whose}: restore could not bind {} until it ends (at most a minute)",
        s.local
    )))
}

/// The TCP sockets of the process's network namespace that `tables`
/// dumps (all, or the TIME_WAIT connections at local port `port`),
/// dumped once.
fn tcp_table(
    info: &FdInfo,
    tables: &TcpTables,
    port: Option<u16>,
) -> Result<Arc<crate::capture::tcp_tables::NsTcp>> {
    let ns = netns(info)?;
    let inode = ferry_sys::sockdiag::inode_of(ns.as_fd())
        .map_err(|e| EngineError::kernel(info.pid, "fstat of its network namespace", e))?;
    match port {
        Some(port) => tables.time_wait_on(inode, ns.as_fd(), port),
        None => tables.of(inode, ns.as_fd()),
    }
    .map_err(|e| EngineError::kernel(info.pid, "listing TCP sockets (sock_diag)", e))
}

/// The local ends of the TIME_WAIT connections of the process's network
/// namespace made without SO_REUSEADDR (the BPF tcp iterator's, none
/// when the kernel refuses it), read once into `cache`.
fn time_wait_no_reuse(
    info: &FdInfo,
    cache: &Mutex<Option<Arc<Vec<SocketAddr>>>>,
) -> Result<Arc<Vec<SocketAddr>>> {
    if let Some(t) = locked(cache).clone() {
        return Ok(t);
    }
    let ns = netns(info)?;
    let all = super::time_wait::time_wait_in(info.pid, ns.as_fd())?.unwrap_or_default();
    let t: Arc<Vec<SocketAddr>> =
        Arc::new(all.iter().filter(|tw| !tw.reuse).map(|tw| tw.local).collect());
    *locked(cache) = Some(t.clone());
    Ok(t)
}

/// A TCP connection whose send side is in urgent mode (`snd_up` is not
/// `snd_una`: an urgent byte sent with MSG_OOB, not acknowledged yet).
/// Repair mode reads the send queue as plain bytes, so a connection made
/// again would send the urgent byte inline.
pub(crate) fn check_urgent_sent(pid: i32, fd: i32, ino: u64, una: u32, up: u32) -> Result<()> {
    if up == una {
        return Ok(());
    }
    Err(EngineError::unsupported(
        pid,
        format!("fd {fd} (socket:[{ino}])"),
        format!(
            "an urgent byte (MSG_OOB) sent and not acknowledged by the peer yet is in its send queue (urgent pointer {up}, unacknowledged from {una}), and a connection made again would send it inline"
        ),
    ))
}

/// A unix stream socket with an unread MSG_OOB byte: a socket made again
/// would hold the byte inline.
pub(super) fn check_unix(info: &FdInfo, fd: RawFd, sock_type: i32) -> Result<()> {
    if sock_type == libc::SOCK_STREAM && revents(fd) & libc::POLLPRI != 0 {
        return Err(info.unsupported(
            "an out-of-band byte (MSG_OOB) is unread, which a socket made again would hold inline",
        ));
    }
    Ok(())
}

/// A descriptor in flight that `holder` of the tree also holds: refused
/// when it is an established TCP connection.
pub(super) fn check_passed(info: &FdInfo, passed: RawFd, holder: &PassedFd) -> Result<()> {
    use ferry_sys::socket::{address, getsockopt_int};
    let family = getsockopt_int(passed, libc::SOL_SOCKET, libc::SO_DOMAIN).unwrap_or(-1);
    let inet = family == libc::AF_INET || family == libc::AF_INET6;
    let stream = getsockopt_int(passed, libc::SOL_SOCKET, libc::SO_TYPE) == Ok(libc::SOCK_STREAM);
    if !(inet && stream) {
        return Ok(());
    }
    let Ok(Some(peer)) = address(passed, true) else {
        return Ok(());
    };
    Err(info.unsupported(format!(
        "a queued message passes (SCM_RIGHTS) the TCP connection to {peer} that fd {} of pid {} also holds; restore remakes connections only after the queues are refilled",
        holder.fd, holder.pid
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poll_events_name_what_a_socket_made_again_would_lose() {
        let err = libc::POLLERR | libc::POLLHUP;
        let says = |r: Option<(&str, bool)>, what: &str, passing: bool| {
            r.is_some_and(|(w, p)| w.contains(what) && p == passing)
        };
        assert!(says(poll_refusal(err, true, TCP_CLOSE), "error", true));
        assert!(says(poll_refusal(err, false, TCP_CLOSE), "error", true));
        let closed = libc::POLLIN | libc::POLLRDHUP | libc::POLLHUP;
        assert!(says(poll_refusal(closed, true, TCP_CLOSE), "closed", true));
        // A peer's FIN (CLOSE_WAIT) is restored; SHUT_RD on an established one is not.
        assert!(poll_refusal(libc::POLLIN | libc::POLLRDHUP, true, 8).is_none());
        let shut = libc::POLLIN | libc::POLLRDHUP;
        assert!(says(poll_refusal(shut, true, TCP_ESTABLISHED), "SHUT_RD", false));
        assert!(says(poll_refusal(shut, false, TCP_CLOSE), "SHUT_RD", false));
        let urgent = libc::POLLIN | libc::POLLPRI;
        assert!(says(poll_refusal(urgent, true, TCP_ESTABLISHED), "urgent", false));
        // A fresh socket (POLLHUP alone) and a plain readable one pass.
        assert!(poll_refusal(libc::POLLHUP | libc::POLLOUT, true, TCP_CLOSE).is_none());
        assert!(poll_refusal(libc::POLLIN, true, TCP_ESTABLISHED).is_none());
        assert!(poll_refusal(0, true, TCP_LISTEN).is_none());
    }

    #[test]
    fn a_time_wait_connection_holds_the_port_of_its_address_and_of_the_wildcard() {
        let sa = |s: &str| s.parse::<SocketAddr>().expect("address");
        let tw = sa("127.0.0.1:8080");
        assert!(holds_port(sa("127.0.0.1:8080"), tw));
        assert!(holds_port(sa("0.0.0.0:8080"), tw));
        assert!(holds_port(sa("[::]:8080"), tw));
        assert!(holds_port(sa("[::ffff:127.0.0.1]:8080"), tw));
        assert!(!holds_port(sa("127.0.0.2:8080"), tw));
        assert!(!holds_port(sa("127.0.0.1:8081"), tw));
    }
}
