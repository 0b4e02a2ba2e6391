//! The TCP sockets of a network namespace, from one sock_diag dump per
//! namespace and stage of a capture, shared by every check that asks:
//! before the freeze, the MD5 keys (phase "socket options checked") and
//! the tree's listeners (phase "network lock prepared"); in the freeze,
//! the sockets' shutdown bits and, in a dump of their own, the
//! connections in TIME_WAIT (the survey). Each dump walks the kernel's whole connection table, shared
//! by every namespace of the machine: a sync of `ferry replicate` made
//! four to eight of them, a sixth of its CPU time.

use ferry_sys::sockdiag::{TcpDiag, TcpDump};
use ferry_sys::SysResult;
use std::collections::HashMap;
use std::os::fd::BorrowedFd;
use std::sync::{Arc, Mutex};

/// One dump: the sockets, and where each socket's inode is.
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

/// One stage's dumps, by network namespace inode.
pub(crate) struct TcpTables {
    what: TcpDump,
    by_ns: Mutex<HashMap<u64, Arc<NsTcp>>>,
}

impl TcpTables {
    /// Before the freeze: with INET_DIAG_INFO, for the MD5 keys.
    pub fn before_freeze() -> TcpTables {
        TcpTables { what: TcpDump::WithInfo, by_ns: Mutex::default() }
    }

    /// In the freeze: the table entries and shutdown bits.
    pub fn in_freeze() -> TcpTables {
        TcpTables { what: TcpDump::Plain, by_ns: Mutex::default() }
    }

    /// In the freeze: the connections in TIME_WAIT alone, for the
    /// listeners' check (not every connection of a 10,000-connection
    /// server formatted by the kernel and parsed here, in the pause).
    pub fn time_wait() -> TcpTables {
        TcpTables { what: TcpDump::TimeWait, by_ns: Mutex::default() }
    }

    /// The sockets of namespace `ns` (inode `netns`), dumped at its first
    /// question.
    pub fn of(&self, netns: u64, ns: BorrowedFd) -> SysResult<Arc<NsTcp>> {
        let mut by_ns = self.by_ns.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(t) = by_ns.get(&netns) {
            return Ok(t.clone());
        }
        let t = Arc::new(NsTcp::new(ferry_sys::sockdiag::tcp_sockets_in(ns, self.what)?));
        by_ns.insert(netns, t.clone());
        Ok(t)
    }
}
