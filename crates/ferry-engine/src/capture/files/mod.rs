//! File descriptors: which numbers exist, which open file description each
//! points at (dup'ed fds share one), and what that description is. One
//! module per kind of file.

mod allow;
pub(crate) mod carried;
pub(crate) mod epoll;
mod eventfd;
pub(crate) mod inet;
mod inotify;
mod locks;
pub(crate) mod owner;
mod pipe;
pub(crate) mod pty;
mod regular;
pub(crate) mod socket_preconditions;
pub(crate) use regular::check_deleted_mapped;
mod signalfd;
pub(crate) mod tcp;
pub(crate) mod time_wait;
mod timerfd;
pub(crate) mod unix;
mod unix_options;

use crate::error::{EngineError, Result};
use crate::procfs;
use ferry_image::{FdSlot, FileKind, OpenFile};
use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;

/// What every kind-specific capture gets to look at.
pub(crate) struct FdInfo<'a> {
    pub pid: i32,
    pub fd: i32,
    /// readlink of /proc/PID/fd/N.
    pub link: String,
    /// /proc/PID/fdinfo/N as text.
    pub fdinfo: String,
    pub meta: std::fs::Metadata,
    pub pidfd: &'a OwnedFd,
    /// Every process of the tree being captured.
    pub tree: &'a [i32],
    pub unix_tables: &'a unix::UnixTables,
    /// What the socket checks learned of the tree's network namespaces.
    pub socket_tables: &'a socket_preconditions::Tables,
    /// Duplicates kept for the later steps (see [`FdInfo::keep`]).
    pub kept: &'a KeptDups,
    /// The process's mounts, read when the first file opened by path needs them.
    pub mounts: &'a allow::Mounts,
    /// The socket as listed before the freeze, when fd still is that socket.
    pub pre: Option<&'a PreSocket>,
    /// Whether the options read before the freeze still hold
    /// ([`super::sockopt_watch`]).
    pub options_quiet: bool,
    /// The description made before the freeze ([`pre_describe`]), when
    /// it still holds: fd is that socket and nothing changed it since.
    pub early: Option<&'a Early>,
    /// Where carried fds' duplicates go, when the capture carries
    /// ([`carried`]); None: every file is read to be rebuilt.
    pub carried: Option<&'a KeptDups>,
}

/// Ferry's duplicates of a process's sockets, made by the survey and kept
/// for the owner check and the repair capture, which would otherwise take
/// each again (pidfd_getfd and close, twice per socket in the freeze).
/// The tree is frozen from the survey to the repair capture, so fd N
/// still is the file the duplicate shares.
#[derive(Default)]
pub struct KeptDups(std::sync::Mutex<Vec<(i32, OwnedFd)>>);

impl KeptDups {
    pub(crate) fn push(&self, fd: i32, dup: OwnedFd) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push((fd, dup));
    }

    pub(crate) fn into_map(self) -> std::collections::HashMap<i32, OwnedFd> {
        self.0.into_inner().unwrap_or_else(|e| e.into_inner()).into_iter().collect()
    }
}

impl FdInfo<'_> {
    pub fn unsupported(&self, reason: impl Into<String>) -> EngineError {
        EngineError::unsupported(self.pid, format!("fd {} ({})", self.fd, self.link), reason)
    }
    /// A refusal for a state that passes by itself (see
    /// [`EngineError::Transient`]).
    pub fn busy(&self, reason: impl Into<String>) -> EngineError {
        EngineError::transient(self.pid, format!("fd {} ({})", self.fd, self.link), reason)
    }
    /// Our own duplicate of the fd (pidfd_getfd).
    pub fn dup(&self) -> Result<OwnedFd> {
        ferry_sys::pidfd::pidfd_getfd(self.pidfd, self.fd)
            .map_err(|e| EngineError::kernel(self.pid, format!("duplicating fd {}", self.fd), e))
    }
    /// Keeps `dup`, ferry's duplicate of this fd, for the later steps.
    pub fn keep(&self, dup: OwnedFd) {
        self.kept.push(self.fd, dup);
    }
    pub fn field(&self, key: &str) -> Option<&str> {
        self.fdinfo
            .lines()
            .find_map(|l| l.strip_prefix(key).and_then(|r| r.strip_prefix(':')).map(str::trim))
    }
}

fn capture_kind(info: &FdInfo) -> Result<FileKind> {
    let ft = info.meta.file_type();
    use std::os::unix::fs::FileTypeExt;
    let l = info.link.as_str();
    if l.starts_with("pipe:") {
        return pipe::capture_pipe(info);
    }
    if l.starts_with("socket:") {
        return inet::capture(info);
    }
    if let Some(kind) = l.strip_prefix("anon_inode:") {
        allow::check_anon_kind(info, kind)?;
        return match kind {
            "[eventfd]" => eventfd::capture(info),
            "[timerfd]" => timerfd::capture(info),
            "[signalfd]" => signalfd::capture(info),
            "[eventpoll]" => epoll::capture(info),
            "inotify" => inotify::capture(info),
            _ => Err(info.unsupported(format!("{kind} descriptors are not supported yet"))),
        };
    }
    if ft.is_fifo() {
        return pipe::capture_fifo(info);
    }
    if ft.is_file() {
        return regular::capture_file(info);
    }
    if ft.is_dir() {
        return Ok(FileKind::Directory { path: l.to_string() });
    }
    if ft.is_char_device() {
        return regular::capture_char_device(info);
    }
    Err(allow::refuse_file_type(info))
}

/// Whether restore opens the fd's file again by path (then open() gives
/// it every flag), rather than making a new object.
fn opened_by_path(link: &str) -> bool {
    !(link.starts_with("pipe:") || link.starts_with("socket:") || link.starts_with("anon_inode:"))
}

/// How many fds of the tree's processes point at `link` (e.g. "pipe:[123]").
pub(crate) fn holders_in_tree(tree: &[i32], link: &str) -> usize {
    tree.iter()
        .map(|pid| {
            std::fs::read_dir(format!("/proc/{pid}/fd"))
                .map(|rd| {
                    rd.flatten()
                        .filter(|e| {
                            std::fs::read_link(e.path()).is_ok_and(|l| l.as_os_str() == link)
                        })
                        .count()
                })
                .unwrap_or(0)
        })
        .sum()
}

/// Whether a pipe or socket on a standard fd leads out of the tree: no
/// other fd of the tree refers to the same pipe (its other end).
fn leads_out(info: &FdInfo) -> bool {
    if info.link.starts_with("pipe:") {
        // Both ends of one pipe show the same inode.
        return holders_in_tree(info.tree, &info.link) < 2;
    }
    true
}

/// One process's fds as captured: the open file descriptions and the fd
/// table pointing into them, with the pending unix connections (clients
/// waiting in an accept queue), the files of listeners with one waiting
/// and SO_PEERCRED of the connected unix sockets.
pub struct CapturedFds {
    pub files: Vec<OpenFile>,
    pub fds: Vec<FdSlot>,
    /// (dev, ino) of each file, by file index: the tree-wide pass that
    /// links descriptions needs them and would otherwise stat each again.
    pub inodes: Vec<(u64, u64)>,
    pub unix_connects: Vec<ferry_image::UnixConnect>,
    pub pending_listeners: Vec<u32>,
    pub unix_creds: Vec<ferry_image::UnixPeerCred>,
    /// Connected unix sockets whose peer was closed.
    pub unix_dead: Vec<ferry_image::UnixDeadPeer>,
    /// Files in flight in its unix queues that no process of the tree holds.
    pub unix_orphans: Vec<unix::Orphan>,
    /// Options of its unix sockets that restore sets.
    pub unix_options: Vec<ferry_image::UnixSocketOptions>,
    /// Ferry's duplicates of its inet sockets, by fd ([`KeptDups`]).
    pub kept: std::collections::HashMap<i32, OwnedFd>,
    /// Owners and signals read before the freeze, by file index, of the
    /// connections taken as described then.
    pub early_owners: std::collections::HashMap<u32, owner::Raw>,
    /// The fdinfo of each epoll fd as read here, which lists what its
    /// entries watch (10,000 lines for a server's 10,000 connections).
    pub epoll_fdinfo: std::collections::HashMap<i32, String>,
    /// Ferry's duplicates of its carried fds, by fd ([`carried`]).
    pub carried: std::collections::HashMap<i32, OwnedFd>,
}

/// A running process's sockets as listed before the freeze: per fd
/// number, the socket's (mnt_id, ino) from fdinfo, its link, its
/// metadata and what was read of it ([`PreSocket`]). In the freeze, an
/// fd whose fdinfo still shows the same mount and inode is that same
/// socket (a socket's inode is never reused while it exists, and a
/// socket cannot be reopened into a second description), so its path
/// walks (readlink, stat) are not repeated and what was read of it
/// before may stand; any other fd is read in full.
#[derive(Default)]
pub struct FdPresurvey {
    by_fd: std::collections::HashMap<i32, Listed>,
}

/// One socket fd as the presurvey listed it.
struct Listed {
    id: (u64, u64),
    /// The open file description's address, as the task_file iterator
    /// listed it (None when listed from /proc): while ferry's duplicate
    /// holds it, no other description can have it.
    file: Option<u64>,
    link: String,
    meta: std::fs::Metadata,
    socket: PreSocket,
}

/// Ferry's duplicate of a socket taken before the freeze (checked to be
/// the socket fdinfo showed) for the socket-option check, which lets go
/// of it ([`FdPresurvey::release_dups`]), and what that check read of it
/// while the tree ran.
#[derive(Default)]
pub struct PreSocket {
    dup: std::sync::Mutex<Option<OwnedFd>>,
    read: std::sync::OnceLock<PreRead>,
    described: std::sync::OnceLock<Early>,
    /// Its SO_COOKIE, read by the option check of a capture with kept
    /// checks.
    cookie: std::sync::OnceLock<u64>,
}

/// A connection described before the freeze ([`pre_describe`]): its
/// fdinfo then, its description as the freeze would make it, and its
/// owner and signal ([`owner::read_raw`]).
#[derive(Clone)]
pub(crate) struct Early {
    fdinfo: String,
    described: Described,
    owner: owner::Raw,
}

/// An IPv4/IPv6 socket as read before the freeze: what never changes
/// (family, type, protocol), its TCP state then and the options it had
/// changed then ([`inet::changed_options`]), which the freeze takes when
/// no option can have changed since ([`super::sockopt_watch`]).
#[derive(Clone, Debug)]
pub struct PreRead {
    pub family: i32,
    pub sock_type: i32,
    pub protocol: i32,
    pub state: u8,
    pub options: Vec<ferry_image::SockOpt>,
}

impl FdPresurvey {
    /// Whether the option check read a TCP socket among these.
    pub fn has_tcp_read(&self) -> bool {
        self.by_fd.values().any(|l| {
            l.socket.read().is_some_and(|r| {
                r.protocol == libc::IPPROTO_TCP && r.sock_type == libc::SOCK_STREAM
            })
        })
    }
}

impl PreSocket {
    /// Runs `f` on the duplicate, if there is one.
    pub fn with_dup<T>(&self, f: impl FnOnce(&OwnedFd) -> T) -> Option<T> {
        self.dup.lock().unwrap_or_else(|e| e.into_inner()).as_ref().map(f)
    }

    /// The duplicate, taken over.
    fn take_dup(&self) -> Option<OwnedFd> {
        self.dup.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    /// Records what the option check read (once).
    pub fn set_read(&self, read: PreRead) {
        let _ = self.read.set(read);
    }

    pub fn read(&self) -> Option<&PreRead> {
        self.read.get()
    }

    /// Records the socket's SO_COOKIE (once).
    pub fn set_cookie(&self, cookie: u64) {
        let _ = self.cookie.set(cookie);
    }
}

/// The key of a kept description: process, fd, and the socket's
/// SO_COOKIE (an id the kernel never gives another socket).
type DescribedKey = (i32, i32, u64);

/// The connections one capture described before its freeze
/// ([`pre_describe`]), kept for the next (`ferry replicate`'s syncs,
/// with [`super::KeptChecks`]). A connection found there again (the
/// same process, fd and socket) when the kept watch says the
/// descriptions stand ([`super::sockopt_watch::Watch::descriptions_stand`]:
/// no call of the tree's that changes a socket's options, an fd or its
/// description since that capture began reading) is not described
/// again: only what the network or the host can change without such a
/// call is checked again ([`inet::recheck_kept`]).
#[derive(Clone, Default)]
pub struct KeptDescriptions(std::sync::Arc<std::sync::Mutex<HashMap<DescribedKey, Early>>>);

impl KeptDescriptions {
    /// What this capture starts from: the kept descriptions when they
    /// `stand`, none otherwise; this capture's are kept by
    /// [`KeptDescriptions::keep`].
    pub(crate) fn begin(&self, stand: bool) -> Describing {
        let before = std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()));
        Describing { before: if stand { before } else { HashMap::new() }, now: Default::default() }
    }

    /// This capture's descriptions, for the next.
    pub(crate) fn keep(&self, d: Describing) {
        let now = d.now.into_inner().unwrap_or_else(|e| e.into_inner());
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = now;
    }
}

/// The descriptions of the capture before that stand, and this
/// capture's.
pub(crate) struct Describing {
    before: HashMap<DescribedKey, Early>,
    now: std::sync::Mutex<HashMap<DescribedKey, Early>>,
}

impl Describing {
    fn record(&self, key: DescribedKey, early: Early) {
        self.now.lock().unwrap_or_else(|e| e.into_inner()).insert(key, early);
    }

    /// How many of the capture before's stood and were taken.
    pub(crate) fn counts(&self) -> (usize, usize) {
        let now = self.now.lock().unwrap_or_else(|e| e.into_inner());
        (self.before.keys().filter(|k| now.contains_key(k)).count(), now.len())
    }
}

impl FdPresurvey {
    /// What was listed for `fd`, if `fdinfo` (read in the freeze) shows
    /// the same socket.
    fn same_socket(&self, fd: i32, fdinfo: &str) -> Option<&Listed> {
        let listed = self.by_fd.get(&fd)?;
        (fdinfo_identity(fdinfo)? == listed.id).then_some(listed)
    }

    pub fn len(&self) -> usize {
        self.by_fd.len()
    }

    /// What was listed for `fd` and described before the freeze.
    fn early(&self, fd: i32) -> Option<(&Listed, &Early)> {
        let listed = self.by_fd.get(&fd)?;
        Some((listed, listed.socket.described.get()?))
    }

    /// The link and metadata listed for `fd` while the process ran.
    pub fn listed(&self, fd: i32) -> Option<(&String, &std::fs::Metadata)> {
        self.by_fd.get(&fd).map(|l| (&l.link, &l.meta))
    }

    /// The duplicate and early reads of the socket at `fd`.
    pub fn socket(&self, fd: i32) -> Option<&PreSocket> {
        self.by_fd.get(&fd).map(|l| &l.socket)
    }

    /// Every fd listed.
    pub fn fds(&self) -> impl Iterator<Item = i32> + '_ {
        self.by_fd.keys().copied()
    }

    /// The inode of every socket listed.
    pub fn socket_inodes(&self) -> impl Iterator<Item = u64> + '_ {
        self.by_fd.values().map(|l| l.id.1)
    }

    /// Lets go of every duplicate, once the option check read what it
    /// needed: while ferry holds a socket it lives on, so a connection
    /// the service closes meanwhile would stay in its epoll sets (the
    /// freeze would find an entry for a closed fd), a listener it closes
    /// could not be bound again, a unix socket's peer would not see it
    /// closed. The freeze takes its own duplicates.
    pub fn release_dups(&self) {
        for l in self.by_fd.values() {
            drop(l.socket.take_dup());
        }
    }
}

/// (mnt_id, ino) as fdinfo shows them.
fn fdinfo_identity(fdinfo: &str) -> Option<(u64, u64)> {
    let field = |key: &str| {
        fdinfo.lines().find_map(|l| l.strip_prefix(key)?.strip_prefix(':')?.trim().parse().ok())
    };
    Some((field("mnt_id")?, field("ino")?))
}

/// Lists the sockets of `pid` while it runs (see [`FdPresurvey`]), from
/// `sockets` ((fd, inode, description's address) as the task_file
/// iterator read them,
/// [`super::socket_refs::socket_fds`]) when given, else from
/// /proc/PID/fd. Fds that change meanwhile are simply not listed: the
/// freeze reads them.
pub fn presurvey(pid: i32, sockets: Option<&[(i32, u64, u64)]>) -> FdPresurvey {
    match sockets {
        Some(sockets) => presurvey_listed(pid, sockets),
        None => presurvey_proc(pid),
    }
}

/// The presurvey from the iterator's listing: each socket duplicated
/// (pidfd_getfd) and kept only when the duplicate is a socket of the
/// inode listed, so an fd closed and reused since the listing is not
/// taken for the socket listed there. Its link is the one sockfs gives
/// every socket, its metadata the duplicate's (what stat through
/// /proc/PID/fd/N reads: the same inode), its mount id the one its
/// fdinfo would show (statx STATX_MNT_ID, once per device). Nothing
/// under /proc/PID is looked up.
fn presurvey_listed(pid: i32, sockets: &[(i32, u64, u64)]) -> FdPresurvey {
    use std::os::unix::fs::FileTypeExt;
    let Ok(pidfd) = ferry_sys::pidfd::pidfd_open(pid) else {
        return FdPresurvey::default();
    };
    let mounts: std::sync::Mutex<HashMap<u64, u64>> = Default::default();
    let mount_of = |dev: u64, fd: &OwnedFd| -> Option<u64> {
        let mut known = mounts.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(&m) = known.get(&dev) {
            return Some(m);
        }
        let m = ferry_sys::fd::mount_id(fd.as_fd()).ok()?;
        known.insert(dev, m);
        Some(m)
    };
    let listed = crate::parallel::map(sockets, |&(fd, ino, address)| {
        let Ok(dup) = ferry_sys::pidfd::pidfd_getfd(&pidfd, fd) else { return Ok(None) };
        let file = std::fs::File::from(dup);
        let Ok(meta) = file.metadata() else { return Ok(None) };
        // The fd may have been closed and reused since the listing.
        if meta.ino() != ino || !meta.file_type().is_socket() {
            return Ok(None);
        }
        let dup = OwnedFd::from(file);
        let Some(mnt) = mount_of(meta.dev(), &dup) else { return Ok(None) };
        let socket = PreSocket { dup: std::sync::Mutex::new(Some(dup)), ..Default::default() };
        let link = format!("socket:[{ino}]");
        let file = Some(address);
        Ok(Some((fd, Listed { id: (mnt, ino), file, link, meta, socket })))
    })
    .unwrap_or_default();
    FdPresurvey { by_fd: listed.into_iter().flatten().collect() }
}

/// The presurvey from /proc/PID/fd and /proc/PID/fdinfo.
fn presurvey_proc(pid: i32) -> FdPresurvey {
    let dir = format!("/proc/{pid}/fd");
    let Ok(rd) = std::fs::read_dir(&dir) else {
        return FdPresurvey::default();
    };
    let pidfd = ferry_sys::pidfd::pidfd_open(pid).ok();
    let fds: Vec<i32> = rd.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect();
    let listed = crate::parallel::map(&fds, |&fd| {
        let Ok(link) = procfs::read_link(&format!("{dir}/{fd}")) else { return Ok(None) };
        if !link.starts_with("socket:") {
            return Ok(None);
        }
        let Ok(fdinfo) = procfs::read_string(&format!("/proc/{pid}/fdinfo/{fd}")) else {
            return Ok(None);
        };
        let Ok(meta) = std::fs::metadata(format!("{dir}/{fd}")) else { return Ok(None) };
        let Some(id) = fdinfo_identity(&fdinfo) else { return Ok(None) };
        // The link, stat and fdinfo must all be of one socket.
        if id.1 != meta.ino() || link != format!("socket:[{}]", meta.ino()) {
            return Ok(None);
        }
        // And the duplicate too: the fd may have been closed and reused.
        let dup = pidfd.as_ref().and_then(|p| ferry_sys::pidfd::pidfd_getfd(p, fd).ok());
        let dup = dup.filter(|d| ferry_sys::sockdiag::inode_of(d.as_fd()) == Ok(id.1));
        let socket = PreSocket { dup: std::sync::Mutex::new(dup), ..Default::default() };
        Ok(Some((fd, Listed { id, file: None, link, meta, socket })))
    })
    .unwrap_or_default();
    FdPresurvey { by_fd: listed.into_iter().flatten().collect() }
}

/// The fd numbers of `pid`'s table (the tree is frozen): from the
/// task_file iterator when it loads, which makes no dentry under
/// /proc/PID/fd as listing that directory does (one per fd, kept until
/// the process is reaped), else from /proc/PID/fd (`dir`).
pub(crate) fn fd_numbers(pid: i32, dir: &str) -> Result<Vec<i32>> {
    if let Some(prog) = crate::capture::host_fds::program() {
        match prog.read_task(pid) {
            Ok(files) => return Ok(files.iter().map(|f| f.fd).collect()),
            Err(e) => tracing::debug!("pid {pid}: fds listed from {dir}: {e}"),
        }
    }
    let mut fds: Vec<i32> = std::fs::read_dir(dir)
        .map_err(|e| EngineError::io(dir, e))?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    fds.sort_unstable();
    Ok(fds)
}

/// The link and metadata of fd `fd` (in /proc/PID/fd, `dir`).
fn read_link_and_meta(dir: &str, fd: i32) -> Result<(String, std::fs::Metadata)> {
    let link = procfs::read_link(&format!("{dir}/{fd}"))?;
    let meta = std::fs::metadata(format!("{dir}/{fd}"))
        .map_err(|e| EngineError::io(format!("{dir}/{fd} ({link})"), e))?;
    Ok((link, meta))
}

/// The status flags fcntl(F_SETFL) changes.
const SETFL_FLAGS: i32 =
    libc::O_APPEND | libc::O_NONBLOCK | libc::O_ASYNC | libc::O_DIRECT | libc::O_NOATIME;

/// Ferry's duplicate of fd `fd` of the frozen process, when it still is
/// the socket `listed` described before the freeze (same device and
/// inode: a socket's inode is not reused while it exists, and a socket
/// has one open file description) with the same status flags. Its
/// close-on-exec flag, owner and locks are known unchanged from the
/// counters ([`super::sockopt_watch`]).
fn same_socket_now(pidfd: &OwnedFd, fd: i32, listed: &Listed, early: &Early) -> Option<OwnedFd> {
    let dup = ferry_sys::pidfd::pidfd_getfd(pidfd, fd).ok()?;
    let file = std::fs::File::from(dup);
    let meta = file.metadata().ok()?;
    if (meta.dev(), meta.ino()) != (listed.meta.dev(), listed.meta.ino()) {
        return None;
    }
    let dup = OwnedFd::from(file);
    let now = ferry_sys::fd::fcntl_int(dup.as_raw_fd(), libc::F_GETFL, 0, "fcntl(F_GETFL)").ok()?;
    let then = early.described.0;
    (now & SETFL_FLAGS == then & SETFL_FLAGS).then_some(dup)
}

/// Phase "connections described", while the tree runs: each established
/// TCP connection of `pid` (from fd 3 on) described as the survey in the
/// freeze would, from the early read of its options ([`PreRead`]). The
/// survey takes a description when the counters say nothing could
/// change it since and the fd still holds that socket
/// ([`same_socket_now`]); a connection closed or reset since is found
/// under the network lock (its state and poll events are read again
/// there). One that cannot be described is simply not: the freeze reads
/// it in full and decides. With `kept` (a capture with kept checks), a
/// connection the capture before described, standing, is taken as it
/// was once [`inet::recheck_kept`] passes ([`KeptDescriptions`]).
pub fn pre_describe(pid: i32, listed: &FdPresurvey, tree: &[i32], kept: Option<&Describing>) {
    let Ok(pidfd) = ferry_sys::pidfd::pidfd_open(pid) else { return };
    let Ok(fdinfo_dir) = FdinfoDir::open(pid) else { return };
    let connected = |s: &PreSocket| {
        s.read().is_some_and(|r| {
            r.protocol == libc::IPPROTO_TCP
                && r.sock_type == libc::SOCK_STREAM
                && (r.state == inet::TCP_ESTABLISHED || r.state == inet::TCP_CLOSE_WAIT)
        })
    };
    let todo: Vec<(&i32, &Listed)> = listed
        .by_fd
        .iter()
        .filter(|(fd, l)| **fd > 2 && connected(&l.socket) && l.socket.with_dup(|_| ()).is_some())
        .collect();
    let table = FdTableRead::now(pid)
        .filter(|t| todo.first().is_none_or(|&(&fd, l)| t.shows_as_fdinfo(fd, l, &fdinfo_dir)));
    let (unix_tables, socket_tables) =
        (unix::UnixTables::default(), socket_preconditions::Tables::new(true));
    let mounts = allow::Mounts::new(pid);
    let described = crate::parallel::map(&todo, |&(&fd, l)| {
        let key = l.socket.cookie.get().map(|&c| (pid, fd, c));
        // The capture before's description of this very socket at this
        // fd, standing.
        let before = kept
            .zip(key)
            .and_then(|(k, key)| k.before.get(&key))
            .filter(|e| fdinfo_identity(&e.fdinfo) == Some(l.id));
        let fdinfo = match before {
            Some(e) => e.fdinfo.clone(),
            None => match table.as_ref().and_then(|t| t.fdinfo(fd, l)) {
                Some(f) => f,
                None => match fdinfo_dir.read(fd) {
                    Ok(f) if fdinfo_identity(&f) == Some(l.id) => f,
                    _ => return Ok(false),
                },
            },
        };
        let info = FdInfo {
            pid,
            fd,
            link: l.link.clone(),
            fdinfo,
            meta: l.meta.clone(),
            pidfd: &pidfd,
            tree,
            unix_tables: &unix_tables,
            socket_tables: &socket_tables,
            kept: &KeptDups::default(),
            mounts: &mounts,
            pre: Some(&l.socket),
            options_quiet: true,
            early: None,
            carried: None,
        };
        let early = match before {
            Some(e) => match inet::recheck_kept(&info, &e.described.2) {
                Ok(()) => e.clone(),
                Err(_) => return Ok(false),
            },
            None => match describe_early(&info, l) {
                Some(e) => e,
                None => return Ok(false),
            },
        };
        if let (Some(k), Some(key)) = (kept, key) {
            k.record(key, early.clone());
        }
        let _ = l.socket.described.set(early);
        Ok(true)
    });
    let n = described.map_or(0, |d| d.into_iter().filter(|&d| d).count());
    tracing::debug!("pid {pid}: {n} connections described before the freeze");
}

/// A running process's fd table as the task_file iterator read it at
/// one moment (each fd's description, status flags and close-on-exec
/// flag), with the inodes any file lock is on (/proc/locks): what a
/// socket's fdinfo shows, without opening /proc/PID/fdinfo/N (each
/// open makes a dentry there that stays until the process is reaped).
struct FdTableRead {
    by_fd: HashMap<i32, ferry_sys::host_files::HostFile>,
    locked: std::collections::HashSet<u64>,
}

impl FdTableRead {
    /// None when the iterator or /proc/locks cannot be read: fdinfo is.
    fn now(pid: i32) -> Option<FdTableRead> {
        let prog = crate::capture::host_fds::program()?;
        let locked = locked_inodes(&procfs::read_string("/proc/locks").ok()?)?;
        let files = prog.read_task(pid).ok()?;
        Some(FdTableRead { by_fd: files.into_iter().map(|f| (f.fd, f)).collect(), locked })
    }

    /// The fdinfo of `fd`, when it holds the very description the
    /// presurvey listed (the same address, which ferry's duplicate keeps
    /// from being reused) and it is a socket no lock is on: for a TCP
    /// socket the kernel prints its position (always 0: a socket has no
    /// offset), its flags with O_CLOEXEC when the fd has it, its mount
    /// and inode, its locks (none here) and nothing of its own.
    fn fdinfo(&self, fd: i32, l: &Listed) -> Option<String> {
        let f = self.by_fd.get(&fd)?;
        if Some(f.file) != l.file || f.ino != l.id.1 || self.locked.contains(&f.ino) {
            return None;
        }
        l.socket.with_dup(|_| ())?;
        Some(socket_fdinfo(f.flags, f.cloexec?, l.id))
    }
}

impl FdTableRead {
    /// Whether the text made for `fd` is the kernel's own, read once
    /// (one connection of the process): a kernel that prints more for a
    /// socket, or otherwise, has every connection's fdinfo read.
    fn shows_as_fdinfo(&self, fd: i32, l: &Listed, dir: &FdinfoDir) -> bool {
        let same = self.fdinfo(fd, l).is_some_and(|made| dir.read(fd).is_ok_and(|f| f == made));
        if !same {
            tracing::debug!("pid {}: fd {fd}'s fdinfo is not the iterator's: read", dir.pid);
        }
        same
    }
}

/// The fdinfo text the kernel prints for a socket without locks.
fn socket_fdinfo(flags: u32, cloexec: bool, (mnt_id, ino): (u64, u64)) -> String {
    let flags = flags | if cloexec { libc::O_CLOEXEC as u32 } else { 0 };
    format!("pos:\t0\nflags:\t0{flags:o}\nmnt_id:\t{mnt_id}\nino:\t{ino}\n")
}

/// The inodes /proc/locks lists a lock on (its "MAJ:MIN:INODE" field);
/// None when a line cannot be read.
fn locked_inodes(text: &str) -> Option<std::collections::HashSet<u64>> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let field = l.split_whitespace().find(|w| w.matches(':').count() == 2)?;
            field.rsplit(':').next()?.parse().ok()
        })
        .collect()
}

/// One connection described while the tree runs, with its owner and
/// signal; None when it cannot be (the freeze reads it in full).
fn describe_early(info: &FdInfo, l: &Listed) -> Option<Early> {
    let described = describe(info, false).ok()?;
    let owner = l.socket.with_dup(|d| owner::read_raw(d.as_raw_fd()))?.ok()?;
    Some(Early { fdinfo: info.fdinfo.clone(), described, owner })
}

/// /proc/PID/fdinfo, open: each fd's fdinfo is read relative to it,
/// without a path walk through /proc and the process's directory.
struct FdinfoDir {
    pid: i32,
    dir: std::fs::File,
}

impl FdinfoDir {
    fn open(pid: i32) -> Result<FdinfoDir> {
        let path = format!("/proc/{pid}/fdinfo");
        let dir = std::fs::File::open(&path).map_err(|e| EngineError::io(&path, e))?;
        Ok(FdinfoDir { pid, dir })
    }

    /// The fdinfo of `fd` as text: one read when it fits a page, the
    /// whole file otherwise (an epoll's or inotify's lists its entries).
    fn read(&self, fd: i32) -> Result<String> {
        use std::os::fd::AsFd;
        const PAGE: usize = 4096;
        let name = std::ffi::CString::new(fd.to_string()).unwrap_or_default();
        let path = || format!("/proc/{}/fdinfo/{fd}", self.pid);
        match ferry_sys::fd::read_small_at(self.dir.as_fd(), &name, PAGE) {
            Ok(b) if b.len() < PAGE => Ok(String::from_utf8_lossy(&b).into_owned()),
            Ok(_) => procfs::read_string(&path()),
            Err(e) => Err(EngineError::kernel(self.pid, format!("reading {}", path()), e)),
        }
    }
}

/// Captures all fds of `pid`. Descriptions get ids unique in this
/// process; [`link_tree`] makes them unique in the tree. `pre` is what
/// [`presurvey`] listed (and [`pre_describe`] described) while the
/// process ran; `quiet` whether the options and fds read then still hold.
///
/// Three passes, so that a process with 10,000 sockets is read on every
/// worker thread: what each fd is (parallel), which fds share a
/// description (kcmp, in order), and the capture of each description
/// (parallel; errors are reported for the lowest fd).
pub(super) fn capture(
    pid: i32,
    pidfd: &OwnedFd,
    tree: &[i32],
    opts: &super::CaptureOptions,
    pre: Option<&FdPresurvey>,
    quiet: super::sockopt_watch::Quiet,
) -> Result<CapturedFds> {
    let external_stdio = opts.external_stdio;
    let dir = format!("/proc/{pid}/fd");
    let mut splits = crate::phases::Splits::start(format!("pid {pid}: fds"));
    let fds = fd_numbers(pid, &dir)?;
    splits.mark("listed");
    let unix_tables = unix::UnixTables::default();
    let socket_tables = socket_preconditions::Tables::new(!opts.restored_elsewhere);
    let kept = KeptDups::default();
    let carried_dups = KeptDups::default();
    let carrying = opts.carry_files.then_some(&carried_dups);
    let fdinfo_dir = FdinfoDir::open(pid)?;
    let mounts = allow::Mounts::new(pid);
    let infos: Vec<FdInfo> = crate::parallel::map(&fds, |&fd| {
        // Described before the freeze, unchanged since: no path walk,
        // no fdinfo, nothing read of the socket but its identity.
        let early = pre
            .filter(|_| quiet.fds && !opts.carry_files)
            .and_then(|p| p.early(fd))
            .and_then(|(l, e)| Some((l, e, same_socket_now(pidfd, fd, l, e)?)));
        let (fdinfo, link, meta, same, early) = match early {
            Some((l, e, dup)) => {
                kept.0.lock().unwrap_or_else(|e| e.into_inner()).push((fd, dup));
                (e.fdinfo.clone(), l.link.clone(), l.meta.clone(), Some(l), Some(e))
            }
            None => {
                let fdinfo = fdinfo_dir.read(fd)?;
                let same = pre.and_then(|p| p.same_socket(fd, &fdinfo));
                let (link, meta) = match same {
                    Some(l) => (l.link.clone(), l.meta.clone()),
                    None => read_link_and_meta(&dir, fd)?,
                };
                (fdinfo, link, meta, same, None)
            }
        };
        Ok(FdInfo {
            pid,
            fd,
            link,
            fdinfo,
            meta,
            pidfd,
            tree,
            unix_tables: &unix_tables,
            socket_tables: &socket_tables,
            kept: &kept,
            mounts: &mounts,
            pre: same.map(|l| &l.socket),
            options_quiet: quiet.options,
            early,
            carried: carrying,
        })
    })?;
    splits.mark("read");
    let FdTable { slots, unique } = share_descriptions(pid, &infos);
    splits.mark("shared descriptions");
    let files = capture_descriptions(&unique, external_stdio)?;
    splits.mark("described");
    let early_owners =
        unique.iter().enumerate().filter_map(|(i, u)| Some((i as u32, u.early?.owner))).collect();
    let inodes = unique.iter().map(|i| (i.meta.dev(), i.meta.ino())).collect();
    let (pending_listeners, unix_connects) = unix_links(&unix_tables, &files);
    let unix_creds = unix_tables.take_peer_creds();
    let unix_dead = unix_tables.take_dead_peers();
    let unix_orphans = unix_tables.take_orphans();
    let unix_options = unix_tables.take_options();
    let epoll_fdinfo = infos
        .iter()
        .filter(|i| i.link == "anon_inode:[eventpoll]")
        .map(|i| (i.fd, i.fdinfo.clone()))
        .collect();
    // The infos borrow the kept duplicates' table.
    drop(unique);
    drop(infos);
    Ok(CapturedFds {
        kept: kept.into_map(),
        carried: carried_dups.into_map(),
        early_owners,
        epoll_fdinfo,
        files,
        fds: slots,
        inodes,
        unix_connects,
        pending_listeners,
        unix_creds,
        unix_dead,
        unix_orphans,
        unix_options,
    })
}

/// The process's unix listeners with connections pending, and those
/// pending connections, by their files' indexes in `files`.
fn unix_links(
    tables: &unix::UnixTables,
    files: &[ferry_image::OpenFile],
) -> (Vec<u32>, Vec<ferry_image::UnixConnect>) {
    let index_of = |ino: u64| {
        files.iter().position(|f| matches!(&f.kind, FileKind::UnixSocket(u) if u.ino == ino))
    };
    let pending_listeners = tables
        .take_listeners_with_pending()
        .into_iter()
        .filter_map(index_of)
        .map(|i| i as u32)
        .collect();
    let unix_connects = tables
        .take_pending()
        .into_iter()
        .filter_map(|(client, listener, position)| {
            let file = index_of(client)?;
            Some(ferry_image::UnixConnect { file: file as u32, listener, position })
        })
        .collect();
    (pending_listeners, unix_connects)
}

/// A process's fd table, and the fds whose descriptions it captures (one
/// per description, the lowest fd; `slots` index into it).
struct FdTable<'i, 'a> {
    slots: Vec<FdSlot>,
    unique: Vec<&'i FdInfo<'a>>,
}

/// Which fds share a description: same (dev, ino) and kcmp says so.
fn share_descriptions<'i, 'a>(pid: i32, infos: &'i [FdInfo<'a>]) -> FdTable<'i, 'a> {
    let mut groups: std::collections::HashMap<(u64, u64), Vec<usize>> =
        std::collections::HashMap::new();
    for (i, info) in infos.iter().enumerate() {
        groups.entry((info.meta.dev(), info.meta.ino())).or_default().push(i);
    }
    // The lowest fd of each fd's description, by index into `infos`.
    let mut first: Vec<usize> = (0..infos.len()).collect();
    for members in groups.values().filter(|m| m.len() > 1) {
        let fd = |i: usize| infos[i].fd;
        for run in
            descriptions(members, |a, b| ferry_sys::fd::kcmp_file_order(pid, pid, fd(a), fd(b)))
        {
            let lowest = run.iter().copied().min().unwrap_or(run[0]);
            for i in run {
                first[i] = lowest;
            }
        }
    }
    let mut slots: Vec<FdSlot> = Vec::with_capacity(infos.len());
    let mut unique: Vec<&FdInfo> = Vec::new();
    let mut file_of: Vec<u32> = vec![0; infos.len()];
    for (i, info) in infos.iter().enumerate() {
        let flags = info.field("flags").and_then(procfs::parse_octal).unwrap_or(0) as i32;
        let file = if first[i] == i {
            unique.push(info);
            (unique.len() - 1) as u32
        } else {
            file_of[first[i]]
        };
        file_of[i] = file;
        slots.push(FdSlot { fd: info.fd, file, cloexec: flags & libc::O_CLOEXEC != 0 });
    }
    FdTable { slots, unique }
}

/// `members` split into runs of one description each. All anonymous
/// inodes of a kind (every eventfd, every epoll...) share one inode, so a
/// group can hold thousands of fds: sorted by the kernel's order of their
/// descriptions, O(n log n) kcmp calls instead of one per pair. Should
/// kcmp fail, each pair is asked whether it is the same description, as
/// before.
fn descriptions(
    members: &[usize],
    mut order: impl FnMut(usize, usize) -> ferry_sys::SysResult<std::cmp::Ordering>,
) -> Vec<Vec<usize>> {
    use std::cmp::Ordering;
    let sorted = merge_sort(members.to_vec(), &mut order);
    let mut runs: Vec<Vec<usize>> = Vec::new();
    match sorted {
        Some(sorted) => {
            for i in sorted {
                match runs.last_mut() {
                    Some(run) if matches!(order(run[0], i), Ok(Ordering::Equal)) => run.push(i),
                    _ => runs.push(vec![i]),
                }
            }
        }
        None => {
            for &i in members {
                let same = runs.iter_mut().find(|r| matches!(order(r[0], i), Ok(Ordering::Equal)));
                match same {
                    Some(run) => run.push(i),
                    None => runs.push(vec![i]),
                }
            }
        }
    }
    runs
}

/// Merge sort with a comparison that can fail (None then).
fn merge_sort(
    v: Vec<usize>,
    order: &mut impl FnMut(usize, usize) -> ferry_sys::SysResult<std::cmp::Ordering>,
) -> Option<Vec<usize>> {
    if v.len() <= 1 {
        return Some(v);
    }
    let mut left = v;
    let right = left.split_off(left.len() / 2);
    let (left, right) = (merge_sort(left, order)?, merge_sort(right, order)?);
    let mut out = Vec::with_capacity(left.len() + right.len());
    let (mut l, mut r) = (0, 0);
    while l < left.len() && r < right.len() {
        if order(left[l], right[r]).ok()? == std::cmp::Ordering::Greater {
            out.push(right[r]);
            r += 1;
        } else {
            out.push(left[l]);
            l += 1;
        }
    }
    out.extend_from_slice(&left[l..]);
    out.extend_from_slice(&right[r..]);
    Some(out)
}

/// One description as the image keeps it: status flags (without
/// O_CLOEXEC, an fd's), offset, kind, locks.
type Described = (i32, i64, FileKind, Vec<ferry_image::FileLock>);

fn describe(info: &FdInfo, external_stdio: bool) -> Result<Described> {
    let flags = info.field("flags").and_then(procfs::parse_octal).unwrap_or(0) as i32;
    let pos = info.field("pos").and_then(|p| p.parse().ok()).unwrap_or(0);
    if let Some(kind) = info.carried.map(|dups| carried::capture(info, dups)).transpose()?.flatten()
    {
        return Ok((flags & !libc::O_CLOEXEC, pos, kind, locks::parse(info)?));
    }
    if let Some(early) = info.early {
        return Ok(early.described.clone());
    }
    let stdio_link =
        info.fd <= 2 && (info.link.starts_with("pipe:") || info.link.starts_with("socket:"));
    let by_path = opened_by_path(&info.link);
    allow::check_open_flags(info, flags, by_path)?;
    let kind = if external_stdio && stdio_link && leads_out(info) {
        FileKind::ExternalStdio { what: info.link.clone() }
    } else {
        if by_path && !info.link.starts_with("/memfd:") {
            allow::check_mount(info)?;
        }
        capture_kind(info)?
    };
    allow::check_fdinfo_lines(info)?;
    let locks = locks::parse(info)?;
    Ok((flags & !libc::O_CLOEXEC, pos, kind, locks))
}

/// The capture of each description (in parallel), ids by position.
fn capture_descriptions(unique: &[&FdInfo], external_stdio: bool) -> Result<Vec<OpenFile>> {
    let files = crate::parallel::map(unique, |info| describe(info, external_stdio))?;
    Ok(files
        .into_iter()
        .enumerate()
        .map(|(i, (flags, pos, kind, locks))| OpenFile { id: i as u64, flags, pos, kind, locks })
        .collect())
}

pub(crate) use ferry_image::first_fd_of_each_file;

/// One process's captured fd table, for the tree-wide passes.
pub struct ProcessFiles<'a> {
    pub pid: i32,
    pub files: &'a mut Vec<OpenFile>,
    pub fds: &'a [FdSlot],
    /// (dev, ino) of each file, by file index ([`CapturedFds::inodes`]).
    pub inodes: &'a [(u64, u64)],
}

/// Gives every open file description an id unique in the tree, the same
/// id where processes share one description (kcmp says so), then checks
/// what only the whole tree can tell: pipes and unix sockets whose other
/// end must be inside the tree.
pub fn link_tree(
    procs: &mut [ProcessFiles],
    tree: &[i32],
    unix_creds: &[ferry_image::UnixPeerCred],
) -> Result<()> {
    assign_tree_ids(procs)?;
    let all: Vec<(i32, &OpenFile, i32)> = procs
        .iter()
        .flat_map(|p| {
            let first_fd = first_fd_of_each_file(p.fds);
            p.files
                .iter()
                .enumerate()
                .map(move |(i, f)| (p.pid, f, first_fd.get(&(i as u32)).copied().unwrap_or(-1)))
        })
        .collect();
    for (i, &(pid, f, fd)) in all.iter().enumerate() {
        if matches!(f.kind, FileKind::ProcFile { .. })
            && all[i + 1..].iter().any(|&(q, g, _)| q != pid && g.id == f.id)
        {
            return Err(EngineError::unsupported(pid, format!("fd {fd}"), "a /proc file description shared with another process of the tree; it would be opened once per process"));
        }
    }
    let closed = pipe::check_tree(&all, tree)?;
    pipe::check_packets(&all)?;
    unix::check_tree(&all)?;
    unix::check_peer_creds(&all, unix_creds, tree)?;
    for p in procs.iter_mut() {
        for f in p.files.iter_mut() {
            if let FileKind::Pipe(end) = &mut f.kind {
                end.peer_closed = closed.contains(&(end.id, end.write_end));
            }
        }
    }
    keep_pipe_data_once(procs);
    Ok(())
}

/// The ids unique in the tree (`link_tree`).
fn assign_tree_ids(procs: &mut [ProcessFiles]) -> Result<()> {
    // (dev, ino) -> (pid, a representative fd, id) of descriptions seen so far.
    type Holders = std::collections::HashMap<(u64, u64), Vec<(i32, i32, u64)>>;
    let mut seen: Holders = std::collections::HashMap::new();
    // Deleted files by (dev, ino): the description id and fd first seen.
    // Restore recreates each description's file on its own, so two
    // descriptions of one deleted file (two open() calls, or two hard
    // links both unlinked) would come back as two files: refused.
    let mut deleted: std::collections::HashMap<(u64, u64), (i32, i32, u64)> =
        std::collections::HashMap::new();
    let mut next_id = 0u64;
    for p in procs.iter_mut() {
        let first_fd = first_fd_of_each_file(p.fds);
        for (i, f) in p.files.iter_mut().enumerate() {
            let Some(&fd) = first_fd.get(&(i as u32)) else {
                continue;
            };
            let key = p.inodes.get(i).copied().ok_or_else(|| {
                EngineError::restore(p.pid, format!("fd {fd}: no inode recorded for its file"))
            })?;
            let same = seen.get(&key).and_then(|c| {
                c.iter()
                    .find(|&&(op, ofd, _)| {
                        op != p.pid
                            && ferry_sys::fd::kcmp_same_file(p.pid, op, fd, ofd).unwrap_or(false)
                    })
                    .map(|c| c.2)
            });
            f.id = match same {
                Some(id) => id,
                None => {
                    next_id += 1;
                    seen.entry(key).or_default().push((p.pid, fd, next_id));
                    next_id
                }
            };
            if let FileKind::Deleted { path: name, .. } = &f.kind {
                let &mut (op, ofd, oid) = deleted.entry(key).or_insert((p.pid, fd, f.id));
                if oid != f.id {
                    return Err(EngineError::unsupported(
                        p.pid,
                        format!("fd {fd} ({name} (deleted))"),
                        format!("a deleted file also open in another open file description (pid {op} fd {ofd}); restore would make two separate files of it"),
                    ));
                }
            }
        }
    }
    Ok(())
}

/// A pipe opened again through /proc/PID/fd has several read
/// descriptions, and each one's capture copied the same unread bytes:
/// only the first description keeps them, so restore writes them once.
fn keep_pipe_data_once(procs: &mut [ProcessFiles]) {
    let mut holder: std::collections::HashMap<u64, u64> = std::collections::HashMap::new();
    for p in procs.iter_mut() {
        for f in p.files.iter_mut() {
            let (FileKind::Pipe(end) | FileKind::Fifo { pipe: end, .. }) = &mut f.kind else {
                continue;
            };
            if end.data.is_empty() {
                continue;
            }
            if *holder.entry(end.id).or_insert(f.id) != f.id {
                end.data = Vec::new();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    fn fdinfo_of(fd: i32) -> String {
        procfs::read_string(&format!("/proc/self/fdinfo/{fd}")).expect("own fdinfo")
    }

    #[test]
    fn a_socket_listed_before_the_freeze_is_known_again_only_while_it_is_the_same() {
        let first = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let fd = first.as_raw_fd();
        let pre = presurvey(std::process::id() as i32, None);
        let listed = pre.same_socket(fd, &fdinfo_of(fd)).expect("listed and unchanged");
        assert!(listed.link.starts_with("socket:["), "{}", listed.link);
        // Its duplicate, checked to be the same socket.
        let dup_ino = listed.socket.with_dup(|d| ferry_sys::sockdiag::inode_of(d.as_fd()));
        assert_eq!(dup_ino, Some(Ok(listed.id.1)));
        assert!(pre.socket_inodes().count() >= 1);
        // What fdinfo shows once another socket sits at that number
        // (closed and reopened meanwhile): another inode, so the fd is
        // read in full.
        let second = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        assert!(pre.same_socket(fd, &fdinfo_of(second.as_raw_fd())).is_none());
        // An fd not listed is read in full too.
        assert!(pre.same_socket(second.as_raw_fd(), &fdinfo_of(second.as_raw_fd())).is_none());
        assert!(pre.same_socket(fd, "pos:\t0\nflags:\t02\n").is_none());
    }

    /// A child whose fd table nothing else changes, killed by PID on drop.
    struct Child(std::process::Child);

    impl Drop for Child {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    #[test]
    fn the_iterator_lists_the_fds_proc_lists_without_proc() {
        if crate::capture::host_fds::program().is_none() {
            eprintln!("skipped: the task_file iterator does not load here");
            return;
        }
        let child = std::process::Command::new("sleep")
            .arg("30")
            .stdin(std::process::Stdio::null())
            .spawn()
            .expect("sleep");
        let child = Child(child);
        let pid = child.0.id() as i32;
        let dir = format!("/proc/{pid}/fd");
        let listed = fd_numbers(pid, &dir).expect("listed");
        let mut from_proc: Vec<i32> = std::fs::read_dir(&dir)
            .expect("/proc/PID/fd")
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .collect();
        from_proc.sort_unstable();
        assert_eq!(listed, from_proc);
        assert!(listed.starts_with(&[0, 1, 2]), "{listed:?}");
    }

    #[test]
    fn a_socket_the_iterator_listed_is_taken_only_while_its_fd_still_holds_it() {
        let me = std::process::id() as i32;
        let sockets_now = |pid| crate::capture::socket_refs::socket_fds(pid).unwrap_or_default();
        let Some(sockets) = crate::capture::socket_refs::socket_fds(me) else {
            eprintln!("skipped: the task_file iterator does not load here");
            return;
        };
        let first = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let second = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let (fd, fd2) = (first.as_raw_fd(), second.as_raw_fd());
        let ino = |fd: i32| fdinfo_identity(&fdinfo_of(fd)).expect("identity").1;
        assert!(sockets.len() < 100_000);
        // Listed as the iterator lists it: the same identity fdinfo shows,
        // the link sockfs gives it, a duplicate of that very socket.
        let address =
            |fd: i32| sockets_now(me).into_iter().find(|s| s.0 == fd).map(|s| s.2).expect("listed");
        let pre = presurvey(me, Some(&[(fd, ino(fd), address(fd))]));
        let listed = pre.same_socket(fd, &fdinfo_of(fd)).expect("listed and unchanged");
        assert_eq!(Some(listed.id), fdinfo_identity(&fdinfo_of(fd)));
        assert_eq!(listed.link, format!("socket:[{}]", ino(fd)));
        assert_eq!(listed.meta.ino(), ino(fd));
        let dup_ino = listed.socket.with_dup(|d| ferry_sys::sockdiag::inode_of(d.as_fd()));
        assert_eq!(dup_ino, Some(Ok(ino(fd))));
        // The fd changed between the listing and the duplicate: it holds
        // another socket than the one listed there, and is not taken.
        let stale = presurvey(me, Some(&[(fd, ino(fd2), address(fd2))]));
        assert_eq!(stale.len(), 0);
        // Nor is a listed number that holds no socket now.
        let pipe = ferry_sys::fd::pipe2(libc::O_CLOEXEC).expect("pipe");
        let pipe_fd = pipe.0.as_raw_fd();
        let not_socket = presurvey(me, Some(&[(pipe_fd, ino(pipe_fd), 0)]));
        assert_eq!(not_socket.len(), 0);
        // A change after the listing (another socket at that number) is
        // caught in the freeze: fdinfo then shows another identity.
        assert!(pre.same_socket(fd, &fdinfo_of(fd2)).is_none());
    }

    #[test]
    fn locked_inodes_are_read_from_proc_locks_lines() {
        let text = "1: FLOCK  ADVISORY  WRITE 5110 00:08:123456 0 EOF\n\
                    1: -> FLOCK  ADVISORY  WRITE 5120 00:08:123456 0 EOF\n\
                    2: POSIX  ADVISORY  READ 900 fd:01:77 0 EOF\n";
        let set = locked_inodes(text).expect("read");
        assert_eq!(set, [123456, 77].into_iter().collect());
        assert_eq!(locked_inodes(""), Some(Default::default()));
        assert_eq!(locked_inodes("1: FLOCK ADVISORY WRITE 5 garbled 0 EOF\n"), None);
    }

    #[test]
    fn the_iterator_reads_the_fdinfo_the_kernel_prints_for_a_connection() {
        let me = std::process::id() as i32;
        let Some(prog) = crate::capture::host_fds::program() else {
            eprintln!("skipped: the task_file iterator does not load here");
            return;
        };
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let client =
            std::net::TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
        let (server, _) = listener.accept().expect("accept");
        server.set_nonblocking(true).expect("O_NONBLOCK");
        // One socket without close-on-exec (Rust opens every fd with it).
        let plain = ferry_sys::socket::socket(libc::AF_INET, libc::SOCK_STREAM, 0).expect("socket");
        ferry_sys::fd::fcntl_int(plain.as_raw_fd(), libc::F_SETFD, 0, "fcntl(F_SETFD)")
            .expect("close-on-exec off");
        let table = prog.read_task(me).expect("iterator");
        for fd in [client.as_raw_fd(), server.as_raw_fd(), plain.as_raw_fd()] {
            let f = table.iter().find(|f| f.fd == fd).expect("listed");
            let real = fdinfo_of(fd);
            let id = fdinfo_identity(&real).expect("identity");
            assert_eq!(f.ino, id.1);
            assert_eq!(socket_fdinfo(f.flags, f.cloexec.expect("read"), id), real, "fd {fd}");
        }
        let cloexec = |fd: i32| table.iter().find(|f| f.fd == fd).and_then(|f| f.cloexec);
        assert_eq!(
            (cloexec(server.as_raw_fd()), cloexec(plain.as_raw_fd())),
            (Some(true), Some(false))
        );
    }

    #[test]
    fn fdinfo_is_read_whole_also_when_longer_than_a_page() {
        use std::os::fd::AsFd;
        let epoll = ferry_sys::epoll::create(libc::EPOLL_CLOEXEC).expect("epoll");
        // 200 entries: one fdinfo line each, over 4096 bytes in all.
        let targets: Vec<OwnedFd> = (0..200)
            .map(|_| ferry_sys::anonfd::eventfd(0, libc::EFD_CLOEXEC).expect("eventfd"))
            .collect();
        for (i, t) in targets.iter().enumerate() {
            ferry_sys::epoll::add(epoll.as_fd(), t.as_fd(), libc::EPOLLIN as u32, i as u64)
                .expect("epoll_ctl");
        }
        let dir = FdinfoDir::open(std::process::id() as i32).expect("fdinfo dir");
        for fd in [epoll.as_raw_fd(), targets[0].as_raw_fd()] {
            let read = dir.read(fd).expect("fdinfo");
            assert_eq!(read, fdinfo_of(fd));
        }
        let long = dir.read(epoll.as_raw_fd()).expect("fdinfo");
        assert!(long.len() > 4096 && long.matches("tfd:").count() == 200, "{}", long.len());
    }

    #[test]
    fn descriptions_group_equal_fds_whatever_their_order() {
        // Descriptions of eight fds: 0,3,5 one, 1,6 another, the rest alone.
        let desc = [10, 20, 30, 10, 40, 10, 20, 50];
        let runs = |fail: bool| {
            let mut r = descriptions(&(0..8).collect::<Vec<_>>(), |a, b| {
                if fail {
                    return if desc[a] == desc[b] {
                        Ok(std::cmp::Ordering::Equal)
                    } else {
                        Err(ferry_sys::SysError { call: "kcmp", errno: libc::EPERM })
                    };
                }
                Ok(desc[a].cmp(&desc[b]))
            });
            r.iter_mut().for_each(|run| run.sort_unstable());
            r.sort();
            r
        };
        let want = vec![vec![0, 3, 5], vec![1, 6], vec![2], vec![4], vec![7]];
        assert_eq!(runs(false), want);
        // kcmp failing for unequal pairs: the pairwise way gives the same.
        assert_eq!(runs(true), want);
    }

    #[test]
    fn the_kernel_orders_descriptions_and_dups_compare_equal() {
        use std::cmp::Ordering;
        let me = std::process::id() as i32;
        let a = ferry_sys::anonfd::eventfd(0, libc::EFD_CLOEXEC).expect("eventfd");
        let b = a.try_clone().expect("dup");
        let c = ferry_sys::anonfd::eventfd(0, libc::EFD_CLOEXEC).expect("eventfd");
        let order = |x: &OwnedFd, y: &OwnedFd| {
            ferry_sys::fd::kcmp_file_order(me, me, x.as_raw_fd(), y.as_raw_fd()).expect("kcmp")
        };
        assert_eq!(order(&a, &b), Ordering::Equal);
        assert_ne!(order(&a, &c), Ordering::Equal);
        assert_eq!(order(&a, &c), order(&c, &a).reverse());
    }

    #[test]
    fn fdinfo_identity_needs_both_mount_and_inode() {
        assert_eq!(
            fdinfo_identity("pos:\t0\nflags:\t02\nmnt_id:\t10\nino:\t6863676\n"),
            Some((10, 6863676))
        );
        assert_eq!(fdinfo_identity("pos:\t0\nmnt_id:\t10\n"), None);
    }
}
