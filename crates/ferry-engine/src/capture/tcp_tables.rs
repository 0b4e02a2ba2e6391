//! The TCP sockets of a network namespace as sock_diag reports them,
//! asked once per namespace and stage of a capture and shared by every
//! check that asks: before the freeze, the MD5 keys (phase "socket
//! options checked") and the tree's listeners (phase "network lock
//! prepared"); in the freeze, the sockets' shutdown bits and, in a dump
//! of their own, the connections in TIME_WAIT (the survey).
//!
//! A dump walks the kernel's whole connection table, shared by every
//! namespace of the machine (262,144 buckets here; both families in one
//! walk, `ferry_sys::sockdiag::tcp_sockets_in`): 0.4-0.6 ms on a quiet
//! host, about 20 ms when the host carries 10,000
//! connections of another service, which a small service's checkpoint
//! then paid for. So when the tree has few TCP sockets in a namespace
//! (up to [`ASKED_ALONE_UP_TO`]), each is asked alone
//! ([`ferry_sys::sockdiag::DiagSocket::tcp_socket`]: a connection by its
//! 4-tuple, a listener by its address with the remote end zero), which
//! the kernel answers from one hash lookup with the same message and
//! attributes a dump gives it; a socket whose answer is not certain (not
//! found, another socket found, a state no lookup reaches) sends the
//! namespace to the dump, as before. What each check decides does not
//! change: it reads the same entries.
//!
//! What stays a dump: more sockets than that; the connections in
//! TIME_WAIT on a listener's port ([`TcpTables::time_wait_on`]: their
//! peers are not known, so none can be asked alone; the kernel walks the
//! table but formats only the TIME_WAIT entries of that port, for the
//! first two ports of a namespace); the handshakes under way before the
//! freeze (`network.rs`: request sockets have no fd).
//!
//! Measured on the tiny listener (docs/benchmarks.md, branch diag1):
//! phase "socket options checked" 1.9 ms to 0.4 on a quiet host, 37-39
//! ms to 0.4 while the host holds 10,000 connections of another process.

use ferry_sys::sockdiag::{DiagSocket, TcpDiag, TcpDump, TcpId};
use ferry_sys::SysResult;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::{Arc, Mutex};

/// Up to this many TCP sockets of the tree in one namespace are asked
/// alone rather than in a dump. One costs 4-5 system calls (its
/// addresses, the question and its answer: about 10 µs here), a dump of
/// both families 0.6-1.7 ms on a quiet host: 64 asked alone cost about
/// what the dump costs then, and far less than it on a busy host.
pub(crate) const ASKED_ALONE_UP_TO: usize = 64;

const TCP_CLOSE: u8 = 7;
const TCP_LISTEN: u8 = 10;

/// Sockets as sock_diag listed them, and where each socket's inode is:
/// a dump's (every socket of the namespace), or the tree's sockets
/// asked alone.
pub(crate) struct NsTcp {
    pub sockets: Vec<TcpDiag>,
    by_inode: HashMap<u32, usize>,
}

impl NsTcp {
    fn new(sockets: Vec<TcpDiag>) -> NsTcp {
        // Connections in TIME_WAIT have no inode (0).
        let by_inode =
            sockets.iter().enumerate().filter(|(_, d)| d.inode != 0).map(|(i, d)| (d.inode, i));
        NsTcp { by_inode: by_inode.collect(), sockets }
    }

    pub fn by_inode(&self, inode: u32) -> Option<&TcpDiag> {
        self.by_inode.get(&inode).and_then(|&i| self.sockets.get(i))
    }
}

/// One TCP socket of the tree as the capture knows it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TreeSocket {
    pub inode: u32,
    pub local: SocketAddr,
    /// A connected socket's peer (getpeername).
    pub peer: Option<SocketAddr>,
    /// Its TCP state, when known (needed only without a peer).
    pub state: Option<u8>,
    /// Its SO_COOKIE, when known.
    pub cookie: Option<u64>,
}

impl TreeSocket {
    /// Read from ferry's duplicate `fd` of the socket of inode `inode`:
    /// its addresses, and its state when it has no peer. None when one
    /// of them cannot be read.
    pub fn read(fd: BorrowedFd, inode: u32, cookie: Option<u64>) -> Option<TreeSocket> {
        use ferry_sys::socket;
        let raw = fd.as_raw_fd();
        let local = socket::address(raw, false).ok()??;
        let peer = socket::address(raw, true).ok()?;
        let state = match peer {
            Some(_) => None,
            None => Some(socket::tcp_info(raw).ok()?.tcpi_state),
        };
        Some(TreeSocket { inode, local, peer, state, cookie })
    }

    /// How the socket is asked alone: its id; or Err(true) when no dump
    /// lists it either (unbound and closed: in none of the tables a dump
    /// walks), Err(false) when only a dump can tell (connecting, closed
    /// at a bound port: listed as bound-inactive).
    fn id(&self) -> Result<TcpId, bool> {
        let remote = match (self.peer, self.state) {
            (Some(peer), _) => Some(peer),
            (None, Some(TCP_LISTEN)) => None,
            (None, Some(TCP_CLOSE)) if self.local.port() == 0 => return Err(true),
            _ => return Err(false),
        };
        Ok(TcpId { local: self.local, remote, cookie: self.cookie })
    }
}

/// What asking one socket alone told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Alone {
    /// The kernel's entry for it, as a dump lists it.
    Listed(TcpDiag),
    /// No dump lists it.
    Unlisted,
    /// Not certain (not found, another socket found, an error): the
    /// dump is asked instead.
    Unknown,
}

/// Asks sock_diag (`diag`, of the socket's namespace) about socket `s`
/// alone, with `what` ([`TcpDump::WithInfo`] for the MD5 keys).
pub(crate) fn ask_alone(diag: &DiagSocket, s: &TreeSocket, what: TcpDump) -> Alone {
    let id = match s.id() {
        Ok(id) => id,
        Err(true) => return Alone::Unlisted,
        Err(false) => return Alone::Unknown,
    };
    match diag.tcp_socket(&id, what) {
        // The entry found must be this socket: a listener's address may
        // find another (a SO_REUSEPORT sibling, a dual-stack listener),
        // a closed connection's 4-tuple its TIME_WAIT entry (inode 0).
        Ok(Some(d)) if d.inode == s.inode => Alone::Listed(d),
        _ => Alone::Unknown,
    }
}

/// One stage's tables, by network namespace inode: each a dump, or the
/// tree's every TCP socket there asked alone.
pub(crate) struct TcpTables {
    what: TcpDump,
    by_ns: Mutex<HashMap<u64, Arc<NsTcp>>>,
    /// For [`TcpTables::time_wait_on`]: the TIME_WAIT entries of one
    /// local port, by namespace inode and port.
    by_port: Mutex<HashMap<(u64, u16), Arc<NsTcp>>>,
}

/// The TIME_WAIT entries of up to this many ports of a namespace are
/// dumped port by port, then those of every port: each dump walks the
/// whole connection table (0.3-1 ms), a dump of every port formats the
/// host's every TIME_WAIT entry (10,000 cost 5.9 ms per family).
const TIME_WAIT_PORTS_ALONE: usize = 2;

impl TcpTables {
    /// Before the freeze: with INET_DIAG_INFO, for the MD5 keys.
    pub fn before_freeze() -> TcpTables {
        TcpTables { what: TcpDump::WithInfo, by_ns: Mutex::default(), by_port: Mutex::default() }
    }

    /// In the freeze: the table entries and shutdown bits.
    pub fn in_freeze() -> TcpTables {
        TcpTables { what: TcpDump::Plain, by_ns: Mutex::default(), by_port: Mutex::default() }
    }

    /// In the freeze: the connections in TIME_WAIT alone, for the
    /// listeners' check (not every connection of a 10,000-connection
    /// server formatted by the kernel and parsed here, in the pause).
    pub fn time_wait() -> TcpTables {
        TcpTables { what: TcpDump::TimeWait, by_ns: Mutex::default(), by_port: Mutex::default() }
    }

    fn locked(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<NsTcp>>> {
        self.by_ns.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The TCP sockets of namespace `ns` (inode `netns`) for a question
    /// about the tree's sockets there: those [`TcpTables::of_tree`] kept,
    /// else a dump, made at the first question.
    pub fn of(&self, netns: u64, ns: BorrowedFd) -> SysResult<Arc<NsTcp>> {
        let mut by_ns = self.locked();
        if let Some(t) = by_ns.get(&netns) {
            return Ok(t.clone());
        }
        let t = Arc::new(NsTcp::new(ferry_sys::sockdiag::tcp_sockets_in(ns, self.what)?));
        by_ns.insert(netns, t.clone());
        Ok(t)
    }

    /// The entries of `tree`, TCP sockets of the tree in namespace `ns`
    /// (inode `netns`): each asked alone when they are up to
    /// [`ASKED_ALONE_UP_TO`] and every answer is certain, else from the
    /// namespace's dump ([`TcpTables::of`]). With `whole` (`tree` is
    /// every TCP socket of the tree in the namespace) the answers are
    /// kept for the questions after.
    pub fn of_tree(
        &self,
        netns: u64,
        ns: BorrowedFd,
        tree: &[TreeSocket],
        whole: bool,
    ) -> SysResult<Arc<NsTcp>> {
        if let Some(t) = self.locked().get(&netns) {
            return Ok(t.clone());
        }
        if tree.len() <= ASKED_ALONE_UP_TO {
            if let Some(listed) = self.asked_alone(ns, tree) {
                let t = Arc::new(NsTcp::new(listed));
                if whole {
                    self.locked().insert(netns, t.clone());
                }
                return Ok(t);
            }
        }
        self.of(netns, ns)
    }

    /// The connections in TIME_WAIT of namespace `ns` (inode `netns`) at
    /// local port `port` (in a [`TcpTables::time_wait`] table): a dump of
    /// that port's alone for the first [`TIME_WAIT_PORTS_ALONE`] ports
    /// of the namespace, then the namespace's dump of every port
    /// ([`TcpTables::of`]), each made at its first question.
    pub fn time_wait_on(&self, netns: u64, ns: BorrowedFd, port: u16) -> SysResult<Arc<NsTcp>> {
        if self.what != TcpDump::TimeWait {
            return self.of(netns, ns);
        }
        if let Some(t) = self.locked().get(&netns) {
            return Ok(t.clone());
        }
        let mut by_port = self.by_port.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(t) = by_port.get(&(netns, port)) {
            return Ok(t.clone());
        }
        if by_port.keys().filter(|(n, _)| *n == netns).count() >= TIME_WAIT_PORTS_ALONE {
            drop(by_port);
            return self.of(netns, ns);
        }
        let what = TcpDump::TimeWaitOn(port);
        let t = Arc::new(NsTcp::new(ferry_sys::sockdiag::tcp_sockets_in(ns, what)?));
        by_port.insert((netns, port), t.clone());
        Ok(t)
    }

    /// Every socket of `tree` asked alone: the entries of those a dump
    /// lists; None when one answer is not certain.
    fn asked_alone(&self, ns: BorrowedFd, tree: &[TreeSocket]) -> Option<Vec<TcpDiag>> {
        let diag = DiagSocket::in_netns(ns).ok()?;
        let mut listed = Vec::with_capacity(tree.len());
        for s in tree {
            match ask_alone(&diag, s, self.what) {
                Alone::Listed(d) => listed.push(d),
                Alone::Unlisted => {}
                Alone::Unknown => return None,
            }
        }
        Some(listed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    fn inode(fd: &impl AsFd) -> u32 {
        ferry_sys::sockdiag::inode_of(fd.as_fd()).expect("fstat") as u32
    }

    fn tree_socket(fd: &impl AsFd) -> TreeSocket {
        TreeSocket::read(fd.as_fd(), inode(fd), None).expect("read")
    }

    /// A TCP socket of family AF_INET, bound to 127.0.0.1 (port chosen by
    /// the kernel) when `bound`, never connected.
    fn unconnected(bound: bool) -> std::os::fd::OwnedFd {
        let s = ferry_sys::socket::socket(libc::AF_INET, libc::SOCK_STREAM, 0).expect("socket");
        if bound {
            let at: SocketAddr = "127.0.0.1:0".parse().expect("address");
            ferry_sys::socket::bind(s.as_raw_fd(), libc::AF_INET, &at).expect("bind");
        }
        s
    }

    #[test]
    fn the_tree_asked_alone_reads_as_the_dump_lists_it() {
        use std::net::{TcpListener, TcpStream};
        let l = TcpListener::bind("[::]:0").expect("bind");
        let port = l.local_addr().expect("address").port();
        let c = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        let (a, _) = l.accept().expect("accept");
        let unbound = unconnected(false);
        let ns_file = std::fs::File::open("/proc/self/ns/net").expect("own namespace");
        let ns = ns_file.as_fd();
        let netns = ferry_sys::sockdiag::inode_of(ns).expect("fstat");
        let tree: Vec<TreeSocket> =
            [tree_socket(&l), tree_socket(&c), tree_socket(&a), tree_socket(&unbound)].into();
        let dumped = TcpTables::before_freeze();
        let dump = dumped.of(netns, ns).expect("dump");
        let tables = TcpTables::before_freeze();
        let alone = tables.of_tree(netns, ns, &tree, true).expect("asked alone");
        assert_eq!(
            alone.sockets.len(),
            3,
            "the unbound socket is in no table: {:?}",
            alone.sockets
        );
        for s in &tree {
            assert_eq!(alone.by_inode(s.inode), dump.by_inode(s.inode), "{s:?}");
        }
        // The namespace's dump is made once, and kept.
        assert!(Arc::ptr_eq(&dump, &dumped.of(netns, ns).expect("kept")));
        // Kept whole: the question after is answered without a dump.
        let again = tables.of(netns, ns).expect("kept");
        assert!(Arc::ptr_eq(&alone, &again));
    }

    #[test]
    fn time_wait_entries_are_dumped_port_by_port_for_the_first_ports() {
        use std::net::{TcpListener, TcpStream};
        // Three connections in TIME_WAIT, each at a port of its own: the
        // side that closes first holds it.
        let mut ports = Vec::new();
        let mut keep = Vec::new();
        for _ in 0..3 {
            let l = TcpListener::bind("127.0.0.1:0").expect("bind");
            let c = TcpStream::connect(l.local_addr().expect("address")).expect("connect");
            let (a, _) = l.accept().expect("accept");
            ports.push(c.local_addr().expect("address").port());
            drop(c);
            drop(a);
            keep.push(l);
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
        let ns_file = std::fs::File::open("/proc/self/ns/net").expect("own namespace");
        let ns = ns_file.as_fd();
        let netns = ferry_sys::sockdiag::inode_of(ns).expect("fstat");
        let tables = TcpTables::time_wait();
        let ports_in = |t: &NsTcp| -> Vec<u16> {
            let mut p: Vec<u16> = t.sockets.iter().map(|d| d.local.port()).collect();
            p.dedup();
            p
        };
        for &port in &ports[..TIME_WAIT_PORTS_ALONE] {
            let t = tables.time_wait_on(netns, ns, port).expect("dump");
            assert_eq!(ports_in(&t), vec![port], "{:?}", t.sockets);
            assert!(t.sockets.iter().all(|d| d.state == ferry_sys::sockdiag::TCP_TIME_WAIT));
        }
        // Past those ports: the dump of every port, with all three.
        let t = tables.time_wait_on(netns, ns, ports[2]).expect("dump");
        assert!(ports.iter().all(|p| t.sockets.iter().any(|d| d.local.port() == *p)));
        // Once made, the dump of every port answers for every port.
        let first = tables.time_wait_on(netns, ns, ports[0]).expect("kept");
        assert!(Arc::ptr_eq(&t, &first));
    }

    #[test]
    fn a_socket_no_lookup_finds_sends_the_namespace_to_the_dump() {
        let bound = unconnected(true);
        let ns_file = std::fs::File::open("/proc/self/ns/net").expect("own namespace");
        let ns = ns_file.as_fd();
        let netns = ferry_sys::sockdiag::inode_of(ns).expect("fstat");
        let s = tree_socket(&bound);
        assert_eq!(s.state, Some(TCP_CLOSE));
        let diag = DiagSocket::in_netns(ns).expect("diag");
        assert_eq!(ask_alone(&diag, &s, TcpDump::Plain), Alone::Unknown, "bound, not listening");
        // A listener closed since it was read: not found, so not certain.
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let gone = tree_socket(&l);
        drop(l);
        assert_eq!(ask_alone(&diag, &gone, TcpDump::WithInfo), Alone::Unknown, "closed");
        // A socket asked for another's inode is not taken for it.
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let other = TreeSocket { inode: inode(&bound), ..tree_socket(&l) };
        assert_eq!(ask_alone(&diag, &other, TcpDump::Plain), Alone::Unknown, "another inode");
        // The namespace's table is then the dump, with every socket.
        let tables = TcpTables::in_freeze();
        let t = tables.of_tree(netns, ns, &[tree_socket(&l), s], true).expect("dump");
        assert!(t.by_inode(inode(&l)).is_some_and(|d| d.state == TCP_LISTEN));
        // Too many to ask alone: the dump too, with sockets not asked for.
        let not_asked = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let many = vec![tree_socket(&l); ASKED_ALONE_UP_TO + 1];
        let t = TcpTables::in_freeze().of_tree(netns, ns, &many, false).expect("dump");
        assert!(t.by_inode(inode(&not_asked)).is_some(), "a dump");
        let few = &many[..ASKED_ALONE_UP_TO];
        let t = TcpTables::in_freeze().of_tree(netns, ns, few, false).expect("asked alone");
        assert!(t.by_inode(inode(&not_asked)).is_none(), "asked alone");
    }
}
