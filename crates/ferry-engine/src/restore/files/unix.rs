//! Unix sockets: a connected pair is remade with socketpair(2), or, when
//! an end has a name (a connection accept()ed from a named listener, or a
//! bound client), by connecting to a temporary listener at that name
//! ([`connect_named`]); each end's queued messages are sent again from the
//! other end; a bound socket is bound to its name again (a stale socket
//! file left by the old process is removed first) and listens if it did.

use super::unix_late::Inject;
use super::Builder;
use crate::error::{EngineError, Result};
use crate::unix_remake::{remake_of, show, Remake};
use ferry_image::{FileKind, TreeImage, UnixSocket};
use std::collections::{HashMap, HashSet};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

fn dup(pid: i32, fd: &OwnedFd) -> Result<OwnedFd> {
    fd.try_clone().map_err(|e| EngineError::io(format!("duplicating a unix socket (pid {pid})"), e))
}

/// A connected pair, made by the process its SO_PEERCRED names when the
/// image records one (`unix_late`), else by ferry.
pub(super) fn pair(
    b: &mut Builder,
    pid: i32,
    ino: u64,
    sock_type: i32,
) -> Result<(OwnedFd, OwnedFd)> {
    if let Some(inj) = b.inject.as_deref_mut() {
        if let Some(c) = inj.cred(ino) {
            return inj.socketpair(c, sock_type);
        }
    }
    ferry_sys::socket::socketpair(libc::AF_UNIX, sock_type)
        .map_err(|e| EngineError::kernel(pid, "creating a unix socket pair", e))
}

/// listen(2) by the process the listener's SO_PEERCRED names, if the
/// image records it (connections made to it later name that process).
fn listen(
    inj: Option<&mut (dyn Inject + '_)>,
    pid: i32,
    ino: u64,
    fd: &OwnedFd,
    backlog: i32,
) -> Result<()> {
    if let Some(inj) = inj {
        if let Some(c) = inj.cred(ino) {
            return inj.listen(c, fd, backlog);
        }
    }
    ferry_sys::socket::listen(fd.as_raw_fd(), backlog)
        .map_err(|e| EngineError::kernel(pid, "listening on a unix socket", e))
}

pub(super) fn send_all(pid: i32, from: &OwnedFd, msgs: &[Vec<u8>], stream: bool) -> Result<()> {
    let mut left: usize = msgs.iter().map(Vec::len).sum();
    for m in msgs {
        let mut off = 0;
        loop {
            let n = send_growing(from, &m[off..], &[], None, left).map_err(|e| {
                EngineError::kernel(
                    pid,
                    format!("refilling a unix socket queue ({} bytes)", m.len()),
                    e,
                )
            })?;
            off += n;
            left -= n;
            if !stream || off >= m.len() {
                left -= m.len() - off;
                break;
            }
        }
    }
    Ok(())
}

const SO_SNDBUFFORCE: i32 = 32;

/// One send of a queue being written again, `left` bytes of it still to
/// go. The kernel charges queued data to its sender: the tree's sender
/// may have had a larger send buffer than a new socket's default, so a
/// full buffer is grown (by twice what is left, and 64 KiB for the
/// buffer heads) and the send tried again. `unix_options` sets the
/// recorded size back once every queue is written.
pub(super) fn send_growing(
    from: &OwnedFd,
    data: &[u8],
    fds: &[RawFd],
    creds: Option<ferry_sys::unix::Creds>,
    left: usize,
) -> ferry_sys::SysResult<usize> {
    let fd = from.as_raw_fd();
    let flags = libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL;
    match ferry_sys::unix::send(fd, data, fds, creds, flags) {
        Err(e) if e.errno == libc::EAGAIN => {
            let now = ferry_sys::socket::getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_SNDBUF)?;
            let want =
                (now as usize).saturating_add(left.saturating_mul(2)).saturating_add(1 << 16);
            let half = i32::try_from(want / 2).unwrap_or(i32::MAX / 2);
            ferry_sys::socket::setsockopt_int(fd, libc::SOL_SOCKET, SO_SNDBUFFORCE, half)?;
            ferry_sys::unix::send(fd, data, fds, creds, flags)
        }
        r => r,
    }
}

pub(super) fn bind_name(pid: i32, fd: &OwnedFd, name: &[u8]) -> Result<()> {
    if name.len() >= ferry_sys::socket::UNIX_PATH_MAX {
        return Err(EngineError::restore(pid, "unix socket name too long"));
    }
    // The old process's socket file still there (a restore on the same
    // host) gives the new one its mode and owner: bind makes it with
    // ferry's umask and owner. The image does not record them, so a
    // restore elsewhere gets those defaults.
    let mut stale = None;
    if name.first() != Some(&0) {
        let path = Path::new(std::ffi::OsStr::from_bytes(name));
        if let Ok(m) = std::fs::symlink_metadata(path) {
            if m.file_type().is_socket() {
                let _ = std::fs::remove_file(path);
                stale = Some(m);
            }
        }
    }
    ferry_sys::socket::unix_bind(fd.as_raw_fd(), name).map_err(|e| {
        EngineError::kernel(
            pid,
            format!("binding unix socket to {:?}", String::from_utf8_lossy(name)),
            e,
        )
    })?;
    if let Some(m) = stale {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let path = Path::new(std::ffi::OsStr::from_bytes(name));
        std::os::unix::fs::lchown(path, Some(m.uid()), Some(m.gid())).map_err(|e| {
            EngineError::io(
                format!(
                    "pid {pid}: giving socket file {} owner {}:{}",
                    path.display(),
                    m.uid(),
                    m.gid()
                ),
                e,
            )
        })?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(m.mode() & 0o7777))
            .map_err(|e| {
                EngineError::io(
                    format!(
                        "pid {pid}: giving socket file {} mode {:o}",
                        path.display(),
                        m.mode() & 0o7777
                    ),
                    e,
                )
            })?;
    }
    Ok(())
}

/// Whatever the path `name` (relative to the current directory) names
/// is renamed aside while a temporary listener is bound there, and put
/// back afterwards; the temporary socket file is removed. The kernel only
/// binds a free name, and a stale socket file (or anything else the path
/// names now) must come back as it was.
pub(super) struct TempPath {
    path: PathBuf,
    aside: Option<PathBuf>,
    pub(super) bound: bool,
}

impl TempPath {
    pub(super) fn take(pid: i32, name: &[u8]) -> Result<TempPath> {
        let path = PathBuf::from(std::ffi::OsStr::from_bytes(name));
        let mut t = TempPath { path, aside: None, bound: false };
        if std::fs::symlink_metadata(&t.path).is_ok() {
            let file =
                t.path.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
            let aside =
                t.path.with_file_name(format!(".{file}.ferry-aside-{}", std::process::id()));
            std::fs::rename(&t.path, &aside).map_err(|e| {
                EngineError::io(
                    format!(
                        "pid {pid}: moving {} aside to bind a temporary listener there",
                        t.path.display()
                    ),
                    e,
                )
            })?;
            t.aside = Some(aside);
        }
        Ok(t)
    }

    pub(super) fn finish(mut self) -> Result<()> {
        self.put_back()
    }

    fn put_back(&mut self) -> Result<()> {
        if std::mem::take(&mut self.bound) {
            std::fs::remove_file(&self.path).map_err(|e| {
                EngineError::io(
                    format!(
                        "removing the temporary listener's socket file {}",
                        self.path.display()
                    ),
                    e,
                )
            })?;
        }
        if let Some(aside) = self.aside.take() {
            std::fs::rename(&aside, &self.path).map_err(|e| {
                EngineError::io(
                    format!(
                        "putting {} back (it was moved to {})",
                        self.path.display(),
                        aside.display()
                    ),
                    e,
                )
            })?;
        }
        Ok(())
    }
}

impl Drop for TempPath {
    fn drop(&mut self) {
        // On an error path: the error being returned says more.
        let _ = self.put_back();
    }
}

/// Connections of the tree made with connect() to a named listener and
/// accept() are made the same way again (see [`Remake`]), before any
/// other file of the tree: the real listener (if it is still in the tree)
/// does not hold the name yet. Both ends wait in `unix_pending` for
/// [`create`]. A path is resolved in the directory of the process holding
/// the end named by it.
pub fn connect_named(b: &mut Builder, tree: &TreeImage) -> Result<()> {
    let mut socks: Vec<(&ferry_image::ProcessImage, &UnixSocket)> = Vec::new();
    let mut seen = HashSet::new();
    for p in &tree.processes {
        for f in &p.files {
            if let FileKind::UnixSocket(u) = &f.kind {
                if seen.insert(u.ino) {
                    socks.push((p, u));
                }
            }
        }
    }
    // Looked up by inode and by listener name rather than by scanning:
    // a tree may hold thousands of unix sockets.
    let by_ino: HashMap<u64, (&ferry_image::ProcessImage, &UnixSocket)> =
        socks.iter().map(|&(p, u)| (u.ino, (p, u))).collect();
    let listeners: std::collections::HashSet<(i32, &[u8])> = socks
        .iter()
        .filter(|(_, u)| u.listen_backlog.is_some())
        .map(|(_, u)| (u.sock_type, u.name.as_slice()))
        .collect();
    let back = std::env::current_dir().ok();
    let result = (|| {
        for &(pa, a) in &socks {
            let Some(peer) = a.peer else { continue };
            if b.unix_pending.contains_key(&a.ino) {
                continue;
            }
            if a.sock_type == libc::SOCK_DGRAM {
                datagram_socket(b, &socks, pa, a, peer)?;
                continue;
            }
            let Some(&(pb, bs)) = by_ino.get(&peer).filter(|(_, u)| u.peer == Some(a.ino)) else {
                continue;
            };
            let listener_named = |n: &[u8]| listeners.contains(&(a.sock_type, n));
            let how = remake_of(a, bs, listener_named).map_err(|why| {
                EngineError::restore(pa.pid, format!("unix socket {}: {why}", a.ino))
            })?;
            let Remake::Connect { client_is_a } = how else {
                continue;
            };
            let ((pc, c), (ps, s)) =
                if client_is_a { ((pa, a), (pb, bs)) } else { ((pb, bs), (pa, a)) };
            let (cfd, sfd) = connect_through_name(b.inject.as_deref_mut(), pc, c, ps, s)?;
            let (cfd, sfd) = (b.keep(cfd)?, b.keep(sfd)?);
            b.unix_peers.insert(c.ino, b.keep(dup(pc.pid, &cfd)?)?);
            b.unix_peers.insert(s.ino, b.keep(dup(ps.pid, &sfd)?)?);
            b.unix_pending.insert(c.ino, cfd);
            b.unix_pending.insert(s.ino, sfd);
        }
        Ok(())
    })();
    if let Some(dir) = back {
        let _ = std::env::set_current_dir(dir);
    }
    result
}

/// A connected datagram socket `a` (and its peer, if they are a pair).
/// Its name is its own binding, so it is bound again: a pair is made
/// with socketpair and each named end bound (before any queued message
/// is sent again, so that the receiver sees the sender's name); a socket
/// connected to itself is bound and connects to its own name; one
/// connected one way (its peer is not connected to it) is bound here and
/// connects to its peer's name once every socket is bound
/// ([`connect_one_way`]).
fn datagram_socket(
    b: &mut Builder,
    socks: &[(&ferry_image::ProcessImage, &UnixSocket)],
    pa: &ferry_image::ProcessImage,
    a: &UnixSocket,
    peer: u64,
) -> Result<()> {
    let new_socket = |pid: i32| {
        ferry_sys::socket::socket(libc::AF_UNIX, a.sock_type, 0)
            .map_err(|e| EngineError::kernel(pid, format!("creating unix socket {}", a.ino), e))
    };
    let bind = |p: &ferry_image::ProcessImage, fd: &OwnedFd, u: &UnixSocket| -> Result<()> {
        if u.name.is_empty() {
            return Ok(());
        }
        chdir_for(p, &u.name)?;
        bind_name(p.pid, fd, &u.name)
    };
    if peer == a.ino {
        let fd = new_socket(pa.pid)?;
        bind(pa, &fd, a)?;
        ferry_sys::socket::unix_connect(fd.as_raw_fd(), &a.name).map_err(|e| {
            EngineError::kernel(
                pa.pid,
                format!("connecting unix socket {} to its own name {}", a.ino, show(&a.name)),
                e,
            )
        })?;
        let fd = b.keep(fd)?;
        b.unix_peers.insert(a.ino, b.keep(dup(pa.pid, &fd)?)?);
        b.unix_pending.insert(a.ino, fd);
        return Ok(());
    }
    match socks.iter().find(|(_, u)| u.ino == peer) {
        Some(&(pb, bs)) if bs.peer == Some(a.ino) => {
            if a.name.is_empty() && bs.name.is_empty() {
                return Ok(()); // a plain socketpair, made by `create`
            }
            let (fa, fb) = pair(b, pa.pid, a.ino, a.sock_type)?;
            bind(pa, &fa, a)?;
            bind(pb, &fb, bs)?;
            let (fa, fb) = (b.keep(fa)?, b.keep(fb)?);
            b.unix_peers.insert(a.ino, b.keep(dup(pa.pid, &fa)?)?);
            b.unix_peers.insert(bs.ino, b.keep(dup(pb.pid, &fb)?)?);
            b.unix_pending.insert(a.ino, fa);
            b.unix_pending.insert(bs.ino, fb);
        }
        _ => {
            let fd = new_socket(pa.pid)?;
            bind(pa, &fd, a)?;
            b.unix_pending.insert(a.ino, b.keep(fd)?);
        }
    }
    Ok(())
}

/// Datagram sockets connected one way (to a peer that is not connected
/// to them) connect to their peer's name, now that every socket is bound.
/// A path is resolved in the directory of the peer's process.
pub fn connect_one_way(tree: &TreeImage, staged: &HashMap<u64, OwnedFd>) -> Result<()> {
    let all: Vec<(&ferry_image::ProcessImage, &ferry_image::OpenFile, &UnixSocket)> = tree
        .processes
        .iter()
        .flat_map(|p| {
            p.files.iter().filter_map(move |f| {
                if let FileKind::UnixSocket(u) = &f.kind {
                    Some((p, f, u))
                } else {
                    None
                }
            })
        })
        .collect();
    // The first process that holds each socket, as a scan would find it.
    let mut by_ino: HashMap<u64, (&ferry_image::ProcessImage, &UnixSocket)> =
        HashMap::with_capacity(all.len());
    for &(p, _, u) in &all {
        by_ino.entry(u.ino).or_insert((p, u));
    }
    let back = std::env::current_dir().ok();
    let result = (|| {
        for &(p, f, a) in &all {
            let Some(peer) = a.peer.filter(|&q| q != a.ino && a.sock_type == libc::SOCK_DGRAM)
            else {
                continue;
            };
            let Some(&(pb, bs)) = by_ino.get(&peer) else {
                continue;
            };
            if bs.peer == Some(a.ino) {
                continue;
            }
            let fd = staged.get(&f.id).ok_or_else(|| {
                EngineError::restore(p.pid, format!("unix socket {} was not staged", a.ino))
            })?;
            if bs.name.is_empty() {
                return Err(EngineError::restore(
                    p.pid,
                    format!(
                        "unix socket {} is connected one way to socket {}, which has no name",
                        a.ino, bs.ino
                    ),
                ));
            }
            chdir_for(pb, &bs.name)?;
            ferry_sys::socket::unix_connect(fd.as_raw_fd(), &bs.name).map_err(|e| {
                EngineError::kernel(
                    p.pid,
                    format!(
                        "connecting unix datagram socket {} again to {} (socket {})",
                        a.ino,
                        show(&bs.name),
                        bs.ino
                    ),
                    e,
                )
            })?;
        }
        Ok(())
    })();
    if let Some(dir) = back {
        let _ = std::env::set_current_dir(dir);
    }
    result
}

pub(super) fn chdir_for(p: &ferry_image::ProcessImage, name: &[u8]) -> Result<()> {
    if name.first().is_some_and(|&c| c != 0)
        && !Path::new(std::ffi::OsStr::from_bytes(name)).is_absolute()
    {
        std::env::set_current_dir(&p.cwd).map_err(|e| {
            EngineError::io(format!("pid {}: changing directory to {}", p.pid, p.cwd), e)
        })?;
    }
    Ok(())
}

/// The client `c` (bound to its own name if it had one) connected to a
/// temporary listener at `s`'s name, and the end that listener accepted.
///
/// With `inj` and credentials recorded, the listener listens in the
/// process the client's SO_PEERCRED names (the kernel copies the
/// listener's credentials to the client) and the client connects from
/// the one the accepted end's names (the kernel gives the accepted end
/// the connecting task's).
pub(super) fn connect_through_name(
    mut inj: Option<&mut (dyn Inject + '_)>,
    pc: &ferry_image::ProcessImage,
    c: &UnixSocket,
    ps: &ferry_image::ProcessImage,
    s: &UnixSocket,
) -> Result<(OwnedFd, OwnedFd)> {
    let what = || {
        format!(
            "remaking the unix connection between socket {} and socket {} named {}",
            c.ino,
            s.ino,
            show(&s.name)
        )
    };
    let client = ferry_sys::socket::socket(libc::AF_UNIX, c.sock_type, 0)
        .map_err(|e| EngineError::kernel(pc.pid, what(), e))?;
    if !c.name.is_empty() {
        chdir_for(pc, &c.name)?;
        bind_name(pc.pid, &client, &c.name)?;
    }
    chdir_for(ps, &s.name)?;
    let mut temp_path =
        if s.name.first() == Some(&0) { None } else { Some(TempPath::take(ps.pid, &s.name)?) };
    let listener = ferry_sys::socket::socket(libc::AF_UNIX, s.sock_type, 0)
        .map_err(|e| EngineError::kernel(ps.pid, what(), e))?;
    ferry_sys::socket::unix_bind(listener.as_raw_fd(), &s.name).map_err(|e| {
        EngineError::kernel(
            ps.pid,
            format!("{}: binding a temporary listener at that name", what()),
            e,
        )
    })?;
    if let Some(t) = temp_path.as_mut() {
        t.bound = true;
    }
    listen(inj.as_deref_mut(), ps.pid, c.ino, &listener, 1)?;
    match inj.and_then(|i| i.cred(s.ino).map(|k| (i, k))) {
        Some((inj, k)) => {
            // Resolved in the connecting process's directory: the path
            // is made absolute from the directory ferry bound it in.
            let mut name = s.name.clone();
            if name.first().is_some_and(|&x| x != 0 && x != 47) {
                let mut abs = ps.cwd.as_bytes().to_vec();
                abs.push(47);
                abs.extend_from_slice(&s.name);
                name = abs;
            }
            inj.connect(k, &client, &name)?;
        }
        None => ferry_sys::socket::unix_connect(client.as_raw_fd(), &s.name)
            .map_err(|e| EngineError::kernel(pc.pid, format!("{}: connecting", what()), e))?,
    }
    let accepted = ferry_sys::socket::accept(listener.as_raw_fd())
        .map_err(|e| EngineError::kernel(ps.pid, format!("{}: accepting", what()), e))?
        .ok_or_else(|| {
            EngineError::restore(
                ps.pid,
                format!("{}: the connection did not reach the temporary listener", what()),
            )
        })?;
    drop(listener);
    if let Some(t) = temp_path {
        t.finish()?;
    }
    Ok((client, accepted))
}

pub fn create(b: &mut Builder, s: &UnixSocket) -> Result<OwnedFd> {
    let pid = b.pid;
    let stream = s.sock_type == libc::SOCK_STREAM;
    // One whose peer was closed, remade with its queue by `unix_dead`.
    let remade_dead = if s.peer.is_none() { b.unix_pending.remove(&s.ino) } else { None };
    let refill = remade_dead.is_none();
    let sock = if let Some(sock) = remade_dead {
        sock
    } else if let Some(peer) = s.peer {
        if let Some(mine) = b.unix_pending.remove(&s.ino) {
            mine
        } else {
            let (mine, theirs) = pair(b, pid, s.ino, s.sock_type)?;
            let mine = b.keep(mine)?;
            let theirs = b.keep(theirs)?;
            b.unix_peers.insert(peer, b.keep(dup(pid, &theirs)?)?);
            b.unix_peers.insert(s.ino, b.keep(dup(pid, &mine)?)?);
            b.unix_pending.insert(peer, theirs);
            mine
        }
    } else {
        let sock = ferry_sys::socket::socket(libc::AF_UNIX, s.sock_type, 0)
            .map_err(|e| EngineError::kernel(pid, "creating a unix socket", e))?;
        if !s.name.is_empty() {
            bind_name(pid, &sock, &s.name)?;
        }
        if let Some(backlog) = s.listen_backlog {
            listen(b.inject.as_deref_mut(), pid, s.ino, &sock, backlog)?;
        }
        sock
    };
    if s.passcred {
        let _ = ferry_sys::socket::setsockopt_int(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PASSCRED,
            1,
        );
    }
    // A queue with descriptors or credentials in flight is sent once
    // every process exists (`send_in_flight`).
    if refill && !s.queued.is_empty() && s.in_flight.is_empty() {
        let peer = s.peer.and_then(|p| b.unix_peers.get(&p)).ok_or_else(|| {
            EngineError::restore(pid, "queued data on an unconnected unix socket")
        })?;
        send_all(pid, peer, &s.queued, stream)?;
    }
    Ok(sock)
}

/// Sockets that waited in a listener's accept queue connect to it again,
/// queue position by queue position, once every socket of the tree is
/// made (`Fidelity::unix_connects`). A path name is resolved in the
/// listener's process's directory.
pub fn connect_pending(
    tree: &ferry_image::TreeImage,
    staged: &std::collections::HashMap<u64, OwnedFd>,
) -> Result<()> {
    use ferry_image::FileKind;
    let mut all: Vec<(u64, u32, i32, u64)> = Vec::new();
    for p in &tree.processes {
        for c in &p.fidelity.unix_connects {
            let f = p.files.get(c.file as usize).ok_or_else(|| {
                EngineError::restore(p.pid, "pending unix connection of a missing file")
            })?;
            all.push((c.listener, c.position, p.pid, f.id));
        }
    }
    all.sort_unstable();
    for (listener, _, pid, id) in all {
        let (lp, name) = tree
            .processes
            .iter()
            .find_map(|p| p.files.iter().find_map(|f| match &f.kind {
                FileKind::UnixSocket(u) if u.ino == listener => Some((p, u.name.clone())),
                _ => None,
            }))
            .ok_or_else(|| EngineError::restore(pid, format!("the listener socket:[{listener}] a pending connection waits on is not in the image")))?;
        let sock = staged
            .get(&id)
            .ok_or_else(|| EngineError::restore(pid, "pending unix connection was not staged"))?;
        if name.is_empty() {
            return Err(EngineError::restore(
                pid,
                "pending unix connection to a listener without a usable name",
            ));
        }
        let back = std::env::current_dir().ok();
        if name[0] != 0 {
            std::env::set_current_dir(&lp.cwd).map_err(|e| {
                EngineError::io(format!("pid {}: changing directory to {}", lp.pid, lp.cwd), e)
            })?;
        }
        let err = ferry_sys::socket::unix_connect(sock.as_raw_fd(), &name).err().map(|e| {
            EngineError::kernel(
                pid,
                format!(
                    "connecting again to unix listener {:?} (pending connection)",
                    String::from_utf8_lossy(&name).replace('\0', "@")
                ),
                e,
            )
        });
        if let Some(dir) = back {
            let _ = std::env::set_current_dir(dir);
        }
        if let Some(e) = err {
            return Err(e);
        }
    }
    Ok(())
}

/// Whether the unix socket `u` or its peer has a queue that
/// `send_in_flight` sends (its shutdown waits until then).
pub fn deferred(tree: &ferry_image::TreeImage, u: &UnixSocket) -> bool {
    use ferry_image::FileKind;
    !u.in_flight.is_empty()
        || u.peer.is_some_and(|peer| {
            tree.processes.iter().flat_map(|p| &p.files).any(|f| matches!(&f.kind, FileKind::UnixSocket(v) if v.ino == peer && !v.in_flight.is_empty()))
        })
}

/// Queues holding descriptors (SCM_RIGHTS) or credentials
/// (SCM_CREDENTIALS) in flight are sent again now that every process of
/// the tree exists (credentials name a live process) and every file is
/// staged (descriptors are ferry's staged ones): message by message from
/// the peer, in order, with their ancillary data; then the shutdowns of
/// those sockets.
pub fn send_in_flight(
    tree: &ferry_image::TreeImage,
    staged: &std::collections::HashMap<u64, OwnedFd>,
) -> Result<()> {
    let mut done = std::collections::HashSet::new();
    for p in &tree.processes {
        for f in &p.files {
            let FileKind::UnixSocket(u) = &f.kind else {
                continue;
            };
            if u.in_flight.is_empty() || !done.insert(f.id) {
                continue;
            }
            let pid = p.pid;
            let from = u
                .peer
                .and_then(|ino| id_of_ino(tree, ino))
                .and_then(|id| staged.get(&id))
                .ok_or_else(|| {
                EngineError::restore(
                    pid,
                    format!("unix socket {}: its peer was not staged to send its queue", u.ino),
                )
            })?;
            send_queue(tree, staged, pid, u, from)?;
        }
    }
    shut_down(tree, staged, true)
}

/// The id of the file that process `pid`'s `fd` points at.
fn file_of(tree: &TreeImage, pid: i32, fd: i32) -> Option<u64> {
    let p = tree.processes.iter().find(|p| p.pid == pid)?;
    let slot = p.fds.iter().find(|s| s.fd == fd)?;
    p.files.get(slot.file as usize).map(|f| f.id)
}

/// The id of the file that only message `message` of socket `ino` holds,
/// as its descriptor `index` (format 4.4).
fn held_by_none(tree: &TreeImage, ino: u64, message: u32, index: u32) -> Option<u64> {
    let files = &tree.unix_in_flight_files.as_ref()?.files;
    let e = files.iter().find(|e| (e.socket, e.message, e.index) == (ino, message, index))?;
    Some(e.file.id)
}

/// The id of the file of the unix socket `ino`.
fn id_of_ino(tree: &TreeImage, ino: u64) -> Option<u64> {
    tree.processes
        .iter()
        .flat_map(|p| &p.files)
        .find(|f| matches!(&f.kind, FileKind::UnixSocket(v) if v.ino == ino))
        .map(|f| f.id)
}

/// Sends `u`'s queued messages (of process `pid`) from its peer's staged
/// socket `from`, each with the descriptors and credentials it carried.
fn send_queue(
    tree: &TreeImage,
    staged: &std::collections::HashMap<u64, OwnedFd>,
    pid: i32,
    u: &UnixSocket,
    from: &OwnedFd,
) -> Result<()> {
    for (i, m) in u.queued.iter().enumerate() {
        let anc = u.in_flight.iter().find(|a| a.message as usize == i);
        let mut fds = Vec::new();
        for (j, d) in anc.map(|a| a.fds.as_slice()).unwrap_or_default().iter().enumerate() {
            let id = if *d == ferry_image::PassedFd::HELD_BY_NONE {
                held_by_none(tree, u.ino, i as u32, j as u32)
            } else {
                file_of(tree, d.pid, d.fd)
            };
            let fd = id.and_then(|id| staged.get(&id)).ok_or_else(|| {
                EngineError::restore(
                    pid,
                    format!(
                        "unix socket {}: the descriptor in flight (fd {} of pid {}) was not staged",
                        u.ino, d.fd, d.pid
                    ),
                )
            })?;
            fds.push(fd.as_raw_fd());
        }
        let creds = anc.and_then(|a| a.creds).map(|c| ferry_sys::unix::Creds {
            pid: c.pid,
            uid: c.uid,
            gid: c.gid,
        });
        let what = || {
            format!(
                "unix socket {}: sending queued message {i} ({} bytes, {} fds, credentials {:?})",
                u.ino,
                m.len(),
                fds.len(),
                creds
            )
        };
        let left: usize = u.queued[i..].iter().map(Vec::len).sum();
        let mut off = send_growing(from, m, &fds, creds, left)
            .map_err(|e| EngineError::kernel(pid, what(), e))?;
        // The rest of a long stream message goes without descriptors, as the kernel sent it.
        while off < m.len() && u.sock_type == libc::SOCK_STREAM {
            off += send_growing(from, &m[off..], &[], creds, left - off)
                .map_err(|e| EngineError::kernel(pid, what(), e))?;
        }
    }
    Ok(())
}

/// Shuts down the unix sockets whose image says so: those whose queues
/// are sent after the fork (`deferred`), or all the others. Shutdowns come
/// last because queued data has to go through both ends first.
pub fn shut_down(
    tree: &TreeImage,
    staged: &HashMap<u64, OwnedFd>,
    deferred_ones: bool,
) -> Result<()> {
    // Shut down by the close of their peer, which `unix_dead` made again.
    let dead: HashSet<u64> =
        tree.unix_dead_peers.iter().flat_map(|d| &d.sockets).map(|d| d.ino).collect();
    for p in &tree.processes {
        for f in &p.files {
            let FileKind::UnixSocket(u) = &f.kind else {
                continue;
            };
            if deferred(tree, u) != deferred_ones || dead.contains(&u.ino) {
                continue;
            }
            let how = match u.shutdown & 3 {
                1 => libc::SHUT_RD,
                2 => libc::SHUT_WR,
                3 => libc::SHUT_RDWR,
                _ => continue,
            };
            let Some(fd) = staged.get(&f.id) else {
                continue;
            };
            ferry_sys::socket::shutdown(fd.as_raw_fd(), how).map_err(|e| {
                EngineError::kernel(p.pid, format!("shutting down unix socket {}", u.ino), e)
            })?;
        }
    }
    Ok(())
}
