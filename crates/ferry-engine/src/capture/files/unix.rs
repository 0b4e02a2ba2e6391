//! Unix sockets whose peer is in the same process (socketpair, or both
//! ends of a local connection), and bound or listening ones, with the
//! messages waiting in their receive queues. A peer in another process is
//! refused by name.

use super::FdInfo;
use crate::error::{EngineError, Result};
use ferry_image::{FileKind, PassedFd, UnixCreds, UnixInFlight, UnixSocket};
use ferry_sys::sockdiag::UnixDiag;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::MetadataExt;

const TCP_LISTEN: u8 = 10;
const TCP_ESTABLISHED: u8 = 1;

/// getpeername of a unix socket: the name of what it connected to.
fn peer_name_of(fd: RawFd) -> Vec<u8> {
    ferry_sys::socket::unix_name(fd, true).unwrap_or_default()
}

fn name_of(fd: RawFd) -> Vec<u8> {
    ferry_sys::socket::unix_name(fd, false).unwrap_or_default()
}

/// A name as sock_diag gives it, as getsockname does: sock_diag gives a
/// path name with its terminating NUL.
fn norm_name(n: &[u8]) -> Vec<u8> {
    let mut n = n.to_vec();
    if n.first() != Some(&0) {
        while n.last() == Some(&0) {
            n.pop();
        }
    }
    n
}

/// The fd of a process of the tree that holds the open file description
/// `mine` (an fd of ferry's), found with kcmp.
fn holder_of(tree: &[i32], mine: RawFd) -> Option<PassedFd> {
    let me = std::process::id() as i32;
    for &q in tree {
        let Ok(dir) = std::fs::read_dir(format!("/proc/{q}/fd")) else {
            continue;
        };
        let mut fds: Vec<i32> = dir
            .flatten()
            .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse().ok()))
            .collect();
        fds.sort_unstable();
        if let Some(fd) = fds
            .into_iter()
            .find(|&fd| ferry_sys::fd::kcmp_same_file(me, q, mine, fd).unwrap_or(false))
        {
            return Some(PassedFd { pid: q, fd });
        }
    }
    None
}

/// A socket's receive queue as the image keeps it: the messages and the
/// ancillary data some of them carry.
#[derive(Default)]
struct Queue {
    messages: Vec<Vec<u8>>,
    in_flight: Vec<UnixInFlight>,
}

impl Queue {
    /// Adds one peeked message. A stream socket's bytes are split only
    /// where ancillary data sits.
    fn push(&mut self, data: &[u8], stream: bool, fds: Vec<PassedFd>, creds: Option<UnixCreds>) {
        let plain = fds.is_empty() && creds.is_none();
        let last_plain =
            self.in_flight.last().is_none_or(|m| m.message as usize + 1 < self.messages.len());
        match (stream && plain && last_plain, self.messages.last_mut()) {
            (true, Some(last)) => last.extend_from_slice(data),
            _ => self.messages.push(data.to_vec()),
        }
        if !plain {
            let message = (self.messages.len() - 1) as u32;
            self.in_flight.push(UnixInFlight { message, fds, creds });
        }
    }
}

/// Reads every queued message without consuming it: SO_PEEK_OFF moves the
/// peek position past each one. Descriptors in flight (SCM_RIGHTS) are
/// installed into ferry by the peek; each is looked up among the tree's
/// fds and closed again. Credentials are read when the socket has
/// SO_PASSCRED on (its reader sees them).
/// How far to peek: a stream socket with an error pending stops at
/// `upto` bytes (all it holds), as one more peek would return the error
/// and clear it. A seqpacket socket shut down for reading reads empty
/// records forever past its queue: an empty one once `eof_at` bytes
/// (all it holds) were seen is its end.
#[derive(Clone, Copy, Default)]
struct PeekEnd {
    upto: Option<usize>,
    eof_at: Option<usize>,
}

fn peek_queue(
    info: &FdInfo,
    fd: RawFd,
    stream: bool,
    passcred: bool,
    end: PeekEnd,
) -> Result<Queue> {
    use ferry_sys::socket::{getsockopt_int, setsockopt_int};
    // Put back whatever peek offset the process itself had set.
    let saved = getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_PEEK_OFF).unwrap_or(-1);
    if setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_PEEK_OFF, 0).is_err() {
        return Err(info.unsupported("cannot peek at its queued data (SO_PEEK_OFF)"));
    }
    let result = peek_messages(info, fd, stream, passcred, end);
    let _ = setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_PEEK_OFF, saved);
    result
}

fn peek_messages(
    info: &FdInfo,
    fd: RawFd,
    stream: bool,
    passcred: bool,
    end: PeekEnd,
) -> Result<Queue> {
    let mut queue = Queue::default();
    let mut buf = vec![0u8; 1 << 20];
    let mut seen = 0;
    loop {
        if end.upto.is_some_and(|n| seen >= n) {
            return Ok(queue);
        }
        let msg = match ferry_sys::unix::recv(fd, &mut buf, libc::MSG_PEEK | libc::MSG_DONTWAIT) {
            Ok(Some(m)) => m,
            Ok(None) => return Ok(queue),
            Err(e) => {
                return Err(EngineError::kernel(
                    info.pid,
                    format!("fd {}: peeking at its queued messages", info.fd),
                    e,
                ))
            }
        };
        if msg.truncated {
            return Err(info.unsupported(
                "a queued message carries more ancillary data than one recvmsg returns",
            ));
        }
        let eof = stream || end.eof_at.is_some_and(|n| seen >= n);
        if msg.len == 0 && eof && msg.fds.is_empty() {
            return Ok(queue);
        }
        let creds = if passcred { sender_creds(info, msg.creds)? } else { None };
        let message = queue.messages.len() as u32;
        let fds = holders_of_passed(info, msg.fds, message)?;
        seen += msg.len;
        queue.push(&buf[..msg.len], stream, fds, creds);
        if queue.messages.len() > 100_000 {
            return Err(info.unsupported("too many queued messages"));
        }
    }
}

/// The sender's credentials a queued message carries (SCM_CREDENTIALS):
/// they must name a process of the tree.
fn sender_creds(info: &FdInfo, creds: Option<ferry_sys::unix::Creds>) -> Result<Option<UnixCreds>> {
    match creds {
        None => Ok(None),
        Some(c) if c.pid == 0 => {
            Err(info.unsupported("a queued message carries no sender credentials (or those of a process ferry cannot see) while SO_PASSCRED is on"))
        }
        Some(c) if !info.tree.contains(&c.pid) => {
            Err(info.unsupported(format!(
                "a queued message carries the credentials of pid {} (uid {}, gid {}), a process outside the tree",
                c.pid, c.uid, c.gid
            )))
        }
        Some(c) => Ok(Some(UnixCreds { pid: c.pid, uid: c.uid, gid: c.gid })),
    }
}

/// The fds of the tree that hold the descriptors a queued message (number
/// `message` of the queue) passes (SCM_RIGHTS), as peeked into ferry. A
/// descriptor no process holds (its sender closed it) is captured from
/// ferry's copy (`capture_orphan`) and kept in `UnixTables`.
fn holders_of_passed(info: &FdInfo, passed: Vec<OwnedFd>, message: u32) -> Result<Vec<PassedFd>> {
    let mut fds = Vec::with_capacity(passed.len());
    for (index, f) in passed.into_iter().enumerate() {
        if let Some(h) = holder_of(info.tree, f.as_raw_fd()) {
            super::socket_preconditions::check_passed(info, f.as_raw_fd(), &h)?;
            fds.push(h);
            continue;
        }
        let file = capture_orphan(info, &f)?;
        let socket = info.meta.ino();
        locked(&info.unix_tables.5).push(Orphan {
            socket,
            message,
            index: index as u32,
            file,
            fd: f,
        });
        fds.push(PassedFd::HELD_BY_NONE);
    }
    Ok(fds)
}

/// The tree's files in flight that no process holds, each entry once (a
/// socket two processes hold was peeked by both), with ids from
/// `next_id` on: one id per description, which kcmp tells between
/// ferry's copies.
pub fn link_orphans(
    mut orphans: Vec<Orphan>,
    next_id: u64,
) -> Result<Vec<ferry_image::InFlightFile>> {
    orphans.sort_by_key(|o| (o.socket, o.message, o.index));
    orphans.dedup_by_key(|o| (o.socket, o.message, o.index));
    let me = std::process::id() as i32;
    let mut ids: Vec<(RawFd, u64)> = Vec::with_capacity(orphans.len());
    let mut out = Vec::with_capacity(orphans.len());
    for o in &orphans {
        let fd = o.fd.as_raw_fd();
        let same = ids
            .iter()
            .find(|&&(other, _)| ferry_sys::fd::kcmp_same_file(me, me, fd, other).unwrap_or(false));
        let id = match same {
            Some(&(_, id)) => id,
            None => {
                let id = next_id + ids.len() as u64;
                ids.push((fd, id));
                id
            }
        };
        let file = ferry_image::OpenFile { id, ..o.file.clone() };
        out.push(ferry_image::InFlightFile {
            socket: o.socket,
            message: o.message,
            index: o.index,
            file,
        });
    }
    Ok(out)
}

/// A descriptor in flight that no process of the tree holds, read from
/// ferry's own copy like an fd of a process. Only files restore makes on
/// their own are taken: a regular file, a directory, a device, an eventfd.
fn capture_orphan(info: &FdInfo, f: &OwnedFd) -> Result<ferry_image::OpenFile> {
    let fd = f.as_raw_fd();
    let own = format!("/proc/self/fd/{fd}");
    let link = crate::procfs::read_link(&own)?;
    let refuse = |why: &str| {
        info.unsupported(format!(
            "a descriptor in flight ({link}, passed with SCM_RIGHTS and not received yet) is held by no process of the tree, and {why}"
        ))
    };
    let kind_ok = |k: &FileKind| {
        matches!(
            k,
            FileKind::Regular { .. }
                | FileKind::Directory { .. }
                | FileKind::CharDevice { .. }
                | FileKind::EventFd { .. }
        )
    };
    if link.starts_with("pipe:")
        || link.starts_with("socket:")
        || (link.starts_with("anon_inode:") && link != "anon_inode:[eventfd]")
    {
        return Err(refuse(
            "only a regular file, a directory, a device or an eventfd in flight is restored",
        ));
    }
    let me = std::process::id() as i32;
    let pidfd = ferry_sys::pidfd::pidfd_open(me)
        .map_err(|e| EngineError::kernel(info.pid, "pidfd_open of ferry itself", e))?;
    let mine = FdInfo {
        pid: me,
        fd,
        link: link.clone(),
        fdinfo: crate::procfs::read_string(&format!("/proc/self/fdinfo/{fd}"))?,
        meta: std::fs::metadata(&own).map_err(|e| EngineError::io(&own, e))?,
        pidfd: &pidfd,
        tree: info.tree,
        unix_tables: info.unix_tables,
        socket_tables: info.socket_tables,
        // Ferry's own fd numbers: nothing of them belongs to the process's.
        kept: &super::KeptDups::default(),
        mounts: &super::allow::Mounts::new(me),
        pre: None,
        options_quiet: false,
        early: None,
        carried: None,
    };
    let (flags, pos, kind, locks) = super::describe(&mine, false)
        .map_err(|e| refuse(&format!("it cannot be captured: {e}")))?;
    if !kind_ok(&kind) {
        return Err(refuse(
            "only a regular file, a directory, a device or an eventfd in flight is restored",
        ));
    }
    if !locks.is_empty() {
        return Err(refuse("it holds locks"));
    }
    Ok(ferry_image::OpenFile { id: 0, flags, pos, kind, locks })
}

/// The sock_diag unix tables read while capturing one process, by
/// network namespace: one dump serves all its sockets. A socket is looked
/// up in its own namespace, as the tree may live in another than ferry's.
/// Shared by the threads that capture one process's descriptors.
#[derive(Default)]
pub struct UnixTables(
    std::sync::Mutex<std::collections::HashMap<u64, std::sync::Arc<Vec<UnixDiag>>>>,
    std::sync::Mutex<Vec<(u64, u64, u32)>>,
    std::sync::Mutex<Vec<u64>>,
    std::sync::Mutex<Vec<ferry_image::UnixPeerCred>>,
    std::sync::Mutex<Vec<ferry_image::UnixDeadPeer>>,
    std::sync::Mutex<Vec<Orphan>>,
    std::sync::Mutex<Vec<ferry_image::UnixSocketOptions>>,
);

/// A file in flight in a unix queue that no process of the tree holds,
/// captured through the descriptor a peek gave ferry (kept open, so the
/// tree-wide pass can tell with kcmp which entries are one description).
pub struct Orphan {
    pub socket: u64,
    pub message: u32,
    pub index: u32,
    pub file: ferry_image::OpenFile,
    pub fd: OwnedFd,
}

fn locked<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl UnixTables {
    /// (client inode, listener inode, queue position) of every socket
    /// found waiting in a listener's accept queue.
    pub fn take_pending(&self) -> Vec<(u64, u64, u32)> {
        std::mem::take(&mut *locked(&self.1))
    }
    /// SO_PEERCRED of every connected socket found (pids as ferry sees
    /// them).
    pub fn take_peer_creds(&self) -> Vec<ferry_image::UnixPeerCred> {
        std::mem::take(&mut *locked(&self.3))
    }
    /// Every file found in flight that no process of the tree holds.
    pub fn take_orphans(&self) -> Vec<Orphan> {
        std::mem::take(&mut *locked(&self.5))
    }
    /// Every connected socket found whose peer was closed.
    pub fn take_dead_peers(&self) -> Vec<ferry_image::UnixDeadPeer> {
        std::mem::take(&mut *locked(&self.4))
    }
    /// The options of every socket found that has any restore sets.
    pub fn take_options(&self) -> Vec<ferry_image::UnixSocketOptions> {
        std::mem::take(&mut *locked(&self.6))
    }
    /// Inodes of the listeners found with one connection waiting.
    pub fn take_listeners_with_pending(&self) -> Vec<u64> {
        std::mem::take(&mut *locked(&self.2))
    }

    fn of(&self, pid: i32, sock: &OwnedFd) -> Result<std::sync::Arc<Vec<UnixDiag>>> {
        let err = |e| EngineError::kernel(pid, "listing unix sockets (sock_diag)", e);
        let ns = ferry_sys::sockdiag::socket_netns(sock.as_fd()).map_err(err)?;
        let ino = ferry_sys::sockdiag::inode_of(ns.as_fd()).map_err(err)?;
        // Held while dumping, so two threads never dump the same table.
        let mut tables = locked(&self.0);
        if let Some(t) = tables.get(&ino) {
            return Ok(t.clone());
        }
        let table =
            std::sync::Arc::new(ferry_sys::sockdiag::unix_sockets_in(ns.as_fd()).map_err(err)?);
        tables.insert(ino, table.clone());
        Ok(table)
    }
}

/// One unix socket being captured: its fd (ferry's duplicate), its row
/// of the sock_diag table and the rest of that table.
struct Probe<'a> {
    info: &'a FdInfo<'a>,
    table: &'a [UnixDiag],
    me: &'a UnixDiag,
    fd: RawFd,
    ino: u64,
    sock_type: i32,
}

pub fn capture(info: &FdInfo, sock_type: i32) -> Result<FileKind> {
    let ino = info.meta.ino();
    let sock = info.dup()?;
    let table = info.unix_tables.of(info.pid, &sock)?;
    let me: UnixDiag = table.iter().find(|d| d.ino as u64 == ino).cloned().ok_or_else(|| {
        info.unsupported("unix socket not found in its network namespace's socket table")
    })?;
    super::socket_preconditions::check_unix(info, sock.as_raw_fd(), sock_type)?;
    let s = Probe { info, table: &table, me: &me, fd: sock.as_raw_fd(), ino, sock_type };
    let name = name_of(s.fd);
    if !s.is_accepted_end(&name) {
        check_bound_path(info, &name, me.vfs)?;
    }
    let listen_backlog = s.listen_backlog(&name)?;
    let peer = (me.peer != 0).then_some(me.peer as u64);
    let dead = s.dead_peer(&name)?;
    if dead.is_none() {
        s.check_unaccepted()?;
    }
    if let Some(p) = peer {
        s.check_peer(p)?;
    }
    s.check_queue_and_options(peer.or(dead.as_ref().map(|_| 0)), listen_backlog.is_some())?;
    let passcred =
        ferry_sys::socket::getsockopt_int(s.fd, libc::SOL_SOCKET, libc::SO_PASSCRED).map_err(
            |e| EngineError::kernel(info.pid, format!("fd {}: reading SO_PASSCRED", info.fd), e),
        )? != 0;
    if peer.is_some() || listen_backlog.is_some() || dead.is_some() {
        s.record_peer_cred(listen_backlog.is_some())?;
    }
    let reset = dead.as_ref().is_some_and(|d| d.reset);
    if reset && me.rqueue > 0 && sock_type != libc::SOCK_STREAM {
        return Err(info.unsupported("its peer was closed, ECONNRESET is pending in SO_ERROR and records are queued: reading them, even with MSG_PEEK, would return the error and clear it"));
    }
    let queue = if me.rqueue > 0 && listen_backlog.is_none() {
        let end = PeekEnd {
            upto: reset.then_some(me.rqueue as usize),
            eof_at: (sock_type == libc::SOCK_SEQPACKET && me.shutdown & 1 != 0)
                .then_some(me.rqueue as usize),
        };
        peek_queue(info, s.fd, sock_type == libc::SOCK_STREAM, passcred, end)?
    } else {
        Queue::default()
    };
    let options = super::unix_options::read(info, s.fd, ino, !queue.messages.is_empty())?;
    if !options.options.is_empty() {
        locked(&info.unix_tables.6).push(options);
    }
    if let Some(d) = dead {
        if !queue.in_flight.is_empty() {
            return Err(info.unsupported("its peer was closed and its queue holds descriptors or credentials in flight (SCM_RIGHTS, SCM_CREDENTIALS) from that peer; such a queue is not restored"));
        }
        locked(&info.unix_tables.4).push(d);
    }
    Ok(FileKind::UnixSocket(UnixSocket {
        ino,
        sock_type,
        name,
        listen_backlog,
        peer,
        queued: queue.messages,
        passcred,
        shutdown: me.shutdown,
        in_flight: queue.in_flight,
    }))
}

impl Probe<'_> {
    /// A socket without a peer is bound again, and so is the client end of
    /// a connection (it binds before connecting to its peer's name, see
    /// `unix_remake::Remake`). The accepted end is not: it shares its
    /// listener's name and socket file, made again by the listener if it
    /// is still in the tree. The accepted end is the one named like a
    /// listener of the tree, or the only named one.
    fn is_accepted_end(&self, name: &[u8]) -> bool {
        self.me.peer != 0
            && self.sock_type != libc::SOCK_DGRAM
            && (peer_name_of(self.fd).is_empty()
                || self.table.iter().any(|l| {
                    l.state == TCP_LISTEN
                        && l.sock_type as i32 == self.sock_type
                        && norm_name(&l.name) == name
                        && super::holders_in_tree(self.info.tree, &format!("socket:[{}]", l.ino))
                            > 0
                }))
    }

    /// A listener's backlog; its waiting connections are noted for
    /// `check_tree`.
    fn listen_backlog(&self, name: &[u8]) -> Result<Option<i32>> {
        let (info, me) = (self.info, self.me);
        if me.state != TCP_LISTEN {
            return Ok(None);
        }
        if me.rqueue > 0 {
            if name.is_empty() {
                return Err(info.unsupported(
                    "a connection waits in the accept queue of this unnamed listener",
                ));
            }
            if me.icons.len() != me.rqueue as usize || me.icons.contains(&0) {
                return Err(info.unsupported(format!("{} connections wait in its accept queue and sock_diag does not name each client", me.rqueue)));
            }
            // Checked against the tree's pending clients in `check_tree`.
            locked(&info.unix_tables.2).push(self.ino);
        }
        Ok(Some(me.wqueue as i32))
    }

    /// A connected stream socket without a peer inode: either its peer was
    /// closed (refused) or it waits in a listener's accept queue (noted
    /// with its position there).
    fn check_unaccepted(&self) -> Result<()> {
        let (info, me) = (self.info, self.me);
        if me.state != TCP_ESTABLISHED || me.peer != 0 || self.sock_type == libc::SOCK_DGRAM {
            return Ok(());
        }
        // A socket whose peer was closed is found by `dead_peer`; one listed
        // in an accept queue and shut down both ways by itself is not.
        if me.shutdown == 3 {
            return Err(info.unsupported("it waits in a listener's accept queue and was shut down both ways; such a connection is not restored"));
        }
        // A connected stream socket whose peer has no inode and which is not
        // shut down (a dead peer shuts it down) waits in a listener's accept
        // queue: its peer is the embryo socket accept() will return.
        if me.shutdown != 0 {
            return Ok(());
        }
        let pname = peer_name_of(self.fd);
        let listener = self
            .table
            .iter()
            .find(|l| l.state == TCP_LISTEN && !pname.is_empty() && norm_name(&l.name) == pname);
        let lname = String::from_utf8_lossy(&pname).replace('\0', "@");
        let Some(listener) = listener else {
            return Err(
                info.unsupported(format!("connected to {lname}, whose socket cannot be found"))
            );
        };
        if super::holders_in_tree(info.tree, &format!("socket:[{}]", listener.ino)) == 0 {
            return Err(info.unsupported(format!(
                "waits in the accept queue of {lname}, a unix listener outside the process tree"
            )));
        }
        if me.wqueue > 0 || me.rqueue > 0 {
            return Err(info.unsupported(format!(
                "waits in the accept queue of {lname} and data was sent before accept ({} bytes of send buffer, {} queued to read); data in flight to a connection not yet accepted is not restored",
                me.wqueue, me.rqueue
            )));
        }
        // sock_diag lists a listener's waiting clients in accept order.
        let Some(position) = listener.icons.iter().position(|&c| c as u64 == self.ino) else {
            return Err(info.unsupported(format!(
                "waits in the accept queue of {lname}, which does not list it"
            )));
        };
        locked(&info.unix_tables.1).push((self.ino, listener.ino as u64, position as u32));
        Ok(())
    }

    /// A connected socket whose peer was closed: the kernel keeps the
    /// closed socket as its peer, orphaned, so sock_diag gives the peer
    /// no inode while getpeername still names it, and a stream or
    /// seqpacket survivor was shut down both ways by the close (one
    /// waiting in an accept queue, its listener lists it, is not this).
    /// Returns what restore needs to make it again, or refuses what it
    /// could not.
    fn dead_peer(&self, name: &[u8]) -> Result<Option<ferry_image::UnixDeadPeer>> {
        let me = self.me;
        let stream = self.sock_type != libc::SOCK_DGRAM;
        if me.peer != 0 || me.state == TCP_LISTEN {
            return Ok(None);
        }
        if stream
            && (me.state != TCP_ESTABLISHED
                || me.shutdown != 3
                || self.table.iter().any(|l| l.state == TCP_LISTEN && l.icons.contains(&me.ino)))
        {
            return Ok(None);
        }
        let Ok(peer_name) = ferry_sys::socket::unix_name(self.fd, true) else {
            return Ok(None);
        };
        let pending_error = self.pending_error()?;
        if pending_error && !stream {
            return Err(self.info.unsupported("its peer was closed and an error is pending in SO_ERROR; a datagram socket's pending error is not restored"));
        }
        // Both ends unnamed: a socketpair. Otherwise the survivor called
        // connect() unless it is the one named like a listener (its own).
        let client = stream
            && !peer_name.is_empty()
            && (name.is_empty()
                || !self.table.iter().any(|l| {
                    l.state == TCP_LISTEN
                        && l.sock_type as i32 == self.sock_type
                        && norm_name(&l.name) == name
                }));
        let dead =
            ferry_image::UnixDeadPeer { ino: self.ino, peer_name, client, reset: pending_error };
        self.check_dead_peer_name(&dead)?;
        Ok(Some(dead))
    }

    /// Whether an error waits in SO_ERROR, read without clearing it: poll
    /// reports POLLERR while it does.
    fn pending_error(&self) -> Result<bool> {
        let mut p = [libc::pollfd { fd: self.fd, events: 0, revents: 0 }];
        ferry_sys::fd::poll(&mut p, 0).map_err(|e| {
            EngineError::kernel(self.info.pid, format!("fd {}: polling it", self.info.fd), e)
        })?;
        Ok(p[0].revents & libc::POLLERR != 0)
    }

    /// Restore binds a stand-in for the closed peer to its name for a
    /// moment (a path through a temporary rename of what is there): that
    /// name must not belong to a live socket, except the tree's own
    /// listener the survivor connected to (made again after it). A closed
    /// client bound to a path is refused: its stand-in would leave a new
    /// socket file there. A datagram socket connected by name (no
    /// SO_PEERCRED) is made by connect(), and its closed peer could not
    /// send it datagrams then: a queue on it is refused.
    fn check_dead_peer_name(&self, d: &ferry_image::UnixDeadPeer) -> Result<()> {
        let info = self.info;
        let shown = crate::unix_remake::show(&d.peer_name);
        if d.peer_name.is_empty() {
            return Ok(());
        }
        let stream = self.sock_type != libc::SOCK_DGRAM;
        if stream && !d.client && d.peer_name[0] != 0 {
            return Err(info.unsupported(format!("its peer, a client bound to the path {shown}, was closed; restoring it would bind a new socket file there")));
        }
        // Connected stream sockets carry their listener's name without
        // holding it (accepted ends).
        let holders = self.table.iter().filter(|o| {
            norm_name(&o.name) == d.peer_name
                && !(o.sock_type as i32 != libc::SOCK_DGRAM && o.state == TCP_ESTABLISHED)
        });
        for other in holders {
            let ours = super::holders_in_tree(info.tree, &format!("socket:[{}]", other.ino)) > 0;
            let our_listener =
                ours && other.state == TCP_LISTEN && other.sock_type as i32 == self.sock_type;
            if !(d.client && our_listener) {
                return Err(info.unsupported(format!("its peer, named {shown}, was closed and socket:[{}] now holds that name; restoring the closed peer would take that name for a moment", other.ino)));
            }
        }
        if !stream && self.me.rqueue > 0 {
            let creds = ferry_sys::socket::getsockopt_bytes(
                self.fd,
                libc::SOL_SOCKET,
                libc::SO_PEERCRED,
                12,
            )
            .map_err(|e| {
                EngineError::kernel(info.pid, format!("fd {}: reading SO_PEERCRED", info.fd), e)
            })?;
            if creds.get(..4).is_some_and(|pid| pid == [0, 0, 0, 0]) {
                return Err(info.unsupported(format!("{} datagrams queued from its peer {shown}, which it connected to by name and which was closed; they are not restored", self.me.rqueue)));
            }
        }
        Ok(())
    }

    /// The peer `p` must be a socket of the tree, with a name to connect
    /// to again if it is not connected back.
    fn check_peer(&self, p: u64) -> Result<()> {
        let info = self.info;
        let in_tree = super::holders_in_tree(info.tree, &format!("socket:[{p}]")) > 0;
        let peer_d = self.table.iter().find(|d| d.ino as u64 == p);
        if !in_tree {
            let pname = peer_d
                .map(|d| String::from_utf8_lossy(&d.name).replace('\0', "@"))
                .unwrap_or_default();
            return Err(info.unsupported(format!("connected to a unix socket outside the process tree ({pname}); external unix peers are not supported yet")));
        }
        // Connected one way (its peer is not connected to it, only
        // possible for datagrams): restore connects it to the peer's name
        // again, so the peer needs one.
        if peer_d.map(|d| d.peer as u64) != Some(self.ino) {
            let pname = peer_d.map(|d| norm_name(&d.name)).unwrap_or_default();
            if self.sock_type != libc::SOCK_DGRAM || pname.is_empty() {
                return Err(info.unsupported(format!(
                    "connected one way to socket:[{p}], which has no name to connect to again"
                )));
            }
        }
        Ok(())
    }

    fn check_queue_and_options(&self, peer: Option<u64>, listener: bool) -> Result<()> {
        let (info, ino) = (self.info, self.ino);
        // Datagrams queued on a socket that is not one end of a pair came
        // from senders the image does not record (any socket that sent to its
        // name); restore refills a queue only from the peer of a pair, or
        // from the stand-in of a closed peer (`peer` 0: only that peer
        // could send to it).
        let pair = peer.is_some_and(|p| {
            p == 0 || self.table.iter().any(|d| d.ino as u64 == p && d.peer as u64 == ino)
        });
        if self.me.rqueue > 0 && !listener && !pair {
            return Err(info.unsupported(format!(
                "{} bytes of datagrams queued to read on a unix socket that is not one end of a connected pair: their senders are not recorded",
                self.me.rqueue
            )));
        }
        Ok(())
    }

    /// Who made the connection, as getsockopt(SO_PEERCRED) tells the
    /// program: restore makes it again in that process with those ids
    /// (checked against the tree in `check_peer_creds`). A socket that
    /// connect() never gave credentials (a datagram socket connected by
    /// name) reads pid 0 and ids -1, and so does the one restore makes.
    /// A listener's are those of its listen() call, which every client
    /// connecting later gets: kept when that process is in the tree (a
    /// daemon's listener made by a parent that has exited is listened on
    /// by ferry, see docs/coverage.md).
    fn record_peer_cred(&self, listener: bool) -> Result<()> {
        let (info, fd) = (self.info, self.fd);
        let b = ferry_sys::socket::getsockopt_bytes(fd, libc::SOL_SOCKET, libc::SO_PEERCRED, 12)
            .map_err(|e| {
                EngineError::kernel(info.pid, format!("fd {}: reading SO_PEERCRED", info.fd), e)
            })?;
        let word = |i: usize| b.get(i..i + 4).map(|w| u32::from_ne_bytes([w[0], w[1], w[2], w[3]]));
        let (Some(pid), Some(uid), Some(gid)) = (word(0), word(4), word(8)) else {
            return Err(info.unsupported(format!("SO_PEERCRED gave {} bytes", b.len())));
        };
        if listener && !info.tree.contains(&(pid as i32)) {
            // Not recorded: see above.
        } else if pid != 0 {
            let groups = peer_groups(info, fd)?;
            locked(&info.unix_tables.3).push(ferry_image::UnixPeerCred {
                ino: self.ino,
                pid: pid as i32,
                uid,
                gid,
                groups,
            });
        } else if uid != u32::MAX || gid != u32::MAX {
            return Err(info.unsupported(format!(
                "SO_PEERCRED names a process outside ferry's PID namespace (uid {uid}, gid {gid}); the connection cannot be made again by it"
            )));
        }
        Ok(())
    }
}

/// SO_PEERGROUPS: the supplementary groups of the process SO_PEERCRED
/// names, at the time it made the connection.
fn peer_groups(info: &FdInfo, fd: RawFd) -> Result<Vec<u32>> {
    let max = ferry_image::validate::MAX_PEER_GROUPS;
    let b = match ferry_sys::socket::getsockopt_bytes(fd, libc::SOL_SOCKET, libc::SO_PEERGROUPS, 4 * max) {
        Ok(b) => b,
        Err(e) if e.errno == libc::ERANGE => {
            return Err(info.unsupported(format!("SO_PEERGROUPS lists more than {max} supplementary groups, more than restore gives a process for one call")))
        }
        Err(e) => return Err(EngineError::kernel(info.pid, format!("fd {}: reading SO_PEERGROUPS", info.fd), e)),
    };
    Ok(b.chunks_exact(4).map(|w| u32::from_ne_bytes([w[0], w[1], w[2], w[3]])).collect())
}

/// A socket bound to a path is bound to it again at restore, which makes
/// a socket file there: refused when the path no longer names this
/// socket's file (unlinked, replaced by another socket's, or a relative
/// name bound in another working directory), since the restored tree
/// would then find a socket where it had none, or the wrong one.
fn check_bound_path(info: &FdInfo, name: &[u8], vfs: Option<(u32, u32)>) -> Result<()> {
    if name.is_empty() || name[0] == 0 {
        return Ok(());
    }
    let Some((ino, kdev)) = vfs else {
        return Ok(());
    };
    use std::os::unix::ffi::OsStrExt;
    let rel = std::path::Path::new(std::ffi::OsStr::from_bytes(name));
    // Resolved as the process sees it: its root, and its cwd for a relative name.
    let base = if rel.is_absolute() {
        format!("/proc/{}/root", info.pid)
    } else {
        format!("/proc/{}/cwd", info.pid)
    };
    let seen = std::path::Path::new(&base).join(rel.strip_prefix("/").unwrap_or(rel));
    let path = rel.display();
    let same = std::fs::symlink_metadata(&seen).is_ok_and(|m| {
        let (major, minor) = (kdev >> 20, kdev & 0xfffff);
        m.ino() == u64::from(ino) && libc::major(m.dev()) == major && libc::minor(m.dev()) == minor
    });
    if same {
        return Ok(());
    }
    Err(info.unsupported(format!(
        "bound to {path}, which no longer names this socket (its file was unlinked or replaced, or the name is relative to another directory); restoring it would bind a new socket file there"
    )))
}

/// Restore makes each connection again in the process SO_PEERCRED names,
/// with the uid and gid it gives (see restore's `unix::late`): that
/// process must be one of the tree (`tree`, host pids); both ends of a
/// socketpair (made by one call) must name the same one. `creds` holds
/// host pids; `all` is every (pid, file, lowest fd) of the tree.
pub fn check_peer_creds(
    all: &[(i32, &ferry_image::OpenFile, i32)],
    creds: &[ferry_image::UnixPeerCred],
    tree: &[i32],
) -> Result<()> {
    // By inode, once: this runs while the tree is frozen, and a server
    // may hold thousands of unix sockets.
    let known = KnownCreds {
        by_ino: creds.iter().map(|c| (c.ino, c)).collect(),
        sockets: all
            .iter()
            .filter_map(|(_, g, _)| match &g.kind {
                FileKind::UnixSocket(v) => Some((v.ino, v)),
                _ => None,
            })
            .collect(),
    };
    for &(pid, f, fd) in all {
        let FileKind::UnixSocket(u) = &f.kind else {
            continue;
        };
        let what = || format!("fd {fd} (socket:[{}])", u.ino);
        let Some(c) = known.cred_of(u.ino) else {
            known.check_credless(u).map_err(|why| EngineError::unsupported(pid, what(), why))?;
            continue;
        };
        if !tree.contains(&c.pid) {
            return Err(EngineError::unsupported(
                pid,
                what(),
                format!(
                    "SO_PEERCRED names pid {} (uid {}, gid {}), which is not a process of the tree (it made this connection and has exited, or is outside the tree); the connection cannot be made again by it",
                    c.pid, c.uid, c.gid
                ),
            ));
        }
        known.check_pair(u, c).map_err(|why| EngineError::unsupported(pid, what(), why))?;
    }
    Ok(())
}

/// The tree's unix sockets and their SO_PEERCRED, by inode.
struct KnownCreds<'a> {
    by_ino: std::collections::HashMap<u64, &'a ferry_image::UnixPeerCred>,
    sockets: std::collections::HashMap<u64, &'a UnixSocket>,
}

impl KnownCreds<'_> {
    fn cred_of(&self, ino: u64) -> Option<&ferry_image::UnixPeerCred> {
        self.by_ino.get(&ino).copied()
    }

    /// The socket `u` is connected to, when that one is connected back.
    fn connected_back(&self, u: &UnixSocket) -> Option<&UnixSocket> {
        u.peer.and_then(|p| self.sockets.get(&p).copied()).filter(|v| v.peer == Some(u.ino))
    }

    /// Two datagram sockets connected to each other by name have no
    /// credentials; restore makes a datagram pair with socketpair(),
    /// which would give them some.
    fn check_credless(&self, u: &UnixSocket) -> std::result::Result<(), String> {
        let mutual = u.peer.is_some_and(|p| p != u.ino) && self.connected_back(u).is_some();
        if mutual
            && u.sock_type == libc::SOCK_DGRAM
            && u.peer.and_then(|p| self.cred_of(p)).is_none()
        {
            return Err("a datagram socket connected by name to a socket connected back to it: restore remakes such a pair with socketpair(), and SO_PEERCRED would then name a process where it named none".to_string());
        }
        Ok(())
    }

    /// Both ends of a pair made by one socketpair() call (`c` is `u`'s
    /// SO_PEERCRED) must name the same process and ids.
    fn check_pair(
        &self,
        u: &UnixSocket,
        c: &ferry_image::UnixPeerCred,
    ) -> std::result::Result<(), String> {
        let (Some(peer), Some(v)) = (u.peer, self.connected_back(u)) else {
            return Ok(());
        };
        let pair = u.sock_type == libc::SOCK_DGRAM || (u.name.is_empty() && v.name.is_empty());
        if pair
            && peer != u.ino
            && self.cred_of(peer) != Some(&ferry_image::UnixPeerCred { ino: peer, ..c.clone() })
        {
            let other = self.cred_of(peer).map_or("none".to_string(), |o| {
                format!("pid {} uid {} gid {} groups {:?}", o.pid, o.uid, o.gid, o.groups)
            });
            return Err(format!(
                "SO_PEERCRED says pid {} uid {} gid {}, its peer socket:[{peer}] says {other}: a socket pair is remade by one socketpair() call, which gives both ends one process",
                c.pid, c.uid, c.gid
            ));
        }
        Ok(())
    }
}

/// Both ends of every connected pair must be restorable: the peer must be
/// one of the tree's sockets.
pub fn check_tree(all: &[(i32, &ferry_image::OpenFile, i32)]) -> Result<()> {
    for &(pid, f, fd) in all {
        let FileKind::UnixSocket(u) = &f.kind else {
            continue;
        };
        let Some(peer) = u.peer else { continue };
        let Some(v) = all.iter().find_map(|(_, g, _)| match &g.kind {
            FileKind::UnixSocket(v) if v.ino == peer => Some(v),
            _ => None,
        }) else {
            return Err(EngineError::unsupported(
                pid,
                format!("fd {fd} (socket:[{}])", u.ino),
                "its peer is not an fd of any process of the tree",
            ));
        };
        // Restore must know which end connected (the same rule it uses).
        if v.peer == Some(u.ino) {
            let listener_named = |n: &[u8]| {
                all.iter().any(|(_, g, _)| matches!(&g.kind, FileKind::UnixSocket(l) if l.listen_backlog.is_some() && l.sock_type == u.sock_type && l.name == n))
            };
            if let Err(why) = crate::unix_remake::remake_of(u, v, listener_named) {
                return Err(EngineError::unsupported(
                    pid,
                    format!("fd {fd} (socket:[{}])", u.ino),
                    why,
                ));
            }
        }
    }
    Ok(())
}
