//! Rebuilding the fd tables of a tree. ferry creates every open file
//! description once ([`stage_open_files`]), in its own process, above
//! every fd number the image uses; processes forked later inherit them,
//! and each process's table is then installed with injected dup3 calls
//! ([`install_calls`]). Descriptions shared between processes stay shared
//! that way. Established TCP connections, and the unix sockets of an image
//! that records SO_PEERCRED ([`make_unix_late`]), are made after the fork
//! and taken by each process with pidfd_getfd (`tcp::install`). One module
//! per kind of file.

pub(crate) mod carried;
mod epoll;
mod eventfd;
mod inet;
mod inotify;
pub(crate) mod locks;
pub(crate) mod owner;
mod pipe;
pub(crate) mod proc_file;
pub(crate) mod pty;
pub(crate) mod regular;
mod signalfd;
pub(crate) mod tcp;
mod timerfd;
pub(crate) mod unix;
mod unix_dead;
pub(crate) mod unix_late;
mod unix_options;

use crate::error::{EngineError, Result};
use crate::inject::Call;
use ferry_image::{FileKind, OpenFile, ProcessImage, TreeImage};
use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

/// What building one file may need from the others.
pub(crate) struct Builder<'a> {
    pub pid: i32,
    pub tty_to: &'a str,
    /// Both ends of pipes created so far, by pipe id.
    pub pipes: HashMap<u64, (Option<OwnedFd>, Option<OwnedFd>)>,
    /// A write end of every pipe, to refill it whichever end comes first.
    pub pipe_writers: HashMap<u64, OwnedFd>,
    /// O_RDWR opens that keep FIFO contents alive until every end exists.
    pub fifo_keepers: HashMap<u64, OwnedFd>,
    /// Ends of unix socket pairs made but not yet placed, by inode.
    pub unix_pending: HashMap<u64, OwnedFd>,
    /// A descriptor of every unix pair end, by inode, to refill queues.
    pub unix_peers: HashMap<u64, OwnedFd>,
    /// memfds recreated by ferry before the fork, by id.
    pub memfds: &'a HashMap<u64, RawFd>,
    /// Deleted files made again so far, by their path as /proc showed it
    /// ("PATH (deleted)"): inotify watches on them go on these.
    pub deleted: HashMap<String, RawFd>,
    /// Lowest fd number above every fd of the image.
    pub temp_base: RawFd,
    /// Runs the calls that give unix sockets their SO_PEERCRED in the
    /// recorded processes (`unix_late`); None: ferry makes them.
    pub inject: Option<&'a mut dyn unix_late::Inject>,
    /// The image's pty pairs (format 4.6) and their ends made so far.
    pub pty_image: Option<&'a ferry_image::PtysImage>,
    pub ptys: pty::Made,
}

impl<'a> Builder<'a> {
    /// A builder for `tree` with nothing made yet.
    fn new(
        tree: &'a TreeImage,
        tty_to: &'a str,
        memfds: &'a HashMap<u64, RawFd>,
        temp_base: RawFd,
        inject: Option<&'a mut dyn unix_late::Inject>,
    ) -> Self {
        Builder {
            pid: tree.processes.first().map_or(0, |p| p.pid),
            tty_to,
            pipes: HashMap::new(),
            pipe_writers: HashMap::new(),
            fifo_keepers: HashMap::new(),
            unix_pending: HashMap::new(),
            unix_peers: HashMap::new(),
            memfds,
            deleted: HashMap::new(),
            temp_base,
            inject,
            pty_image: tree.ptys.as_ref(),
            ptys: pty::Made::default(),
        }
    }

    /// Moves a descriptor the builder keeps across placements above every
    /// image fd number, so installing the fd table cannot clobber it (and
    /// closing it later cannot close an installed fd).
    pub fn keep(&self, fd: OwnedFd) -> Result<OwnedFd> {
        ferry_sys::fd::dup_above(fd.as_raw_fd(), self.temp_base)
            .map_err(|e| EngineError::kernel(self.pid, "moving a kept fd out of the way", e))
    }
}

const SETFL_MASK: i32 =
    libc::O_APPEND | libc::O_NONBLOCK | libc::O_ASYNC | libc::O_DIRECT | libc::O_NOATIME;

fn build_one(b: &mut Builder, f: &OpenFile) -> Result<OwnedFd> {
    let pty_end = pty::end_of(b.pty_image, f.id);
    let fd = match &f.kind {
        FileKind::Terminal { .. } if pty_end.is_some() => {
            let (Some(ptys), Some(end)) = (b.pty_image, pty_end) else {
                return Err(EngineError::restore(b.pid, "pty end without its section"));
            };
            pty::open(b, ptys, end)?
        }
        FileKind::Regular { .. }
        | FileKind::Deleted { .. }
        | FileKind::Directory { .. }
        | FileKind::CharDevice { .. }
        | FileKind::Terminal { .. }
        | FileKind::ExternalStdio { .. } => regular::open(b, f)?,
        FileKind::Memfd { id } => {
            let fd =
                b.memfds.get(id).copied().ok_or_else(|| {
                    EngineError::restore(b.pid, format!("memfd {id} was not staged"))
                })?;
            regular::reopen(b.pid, fd, f)?
        }
        FileKind::Pipe(end) => pipe::open_pipe_end(b, end)?,
        FileKind::Fifo { path, pipe } => pipe::open_fifo(b, path, pipe, f.flags)?,
        FileKind::EventFd { count, semaphore } => eventfd::create(b.pid, *count, *semaphore)?,
        FileKind::TimerFd(t) => timerfd::create(b.pid, t)?,
        FileKind::SignalFd { mask } => signalfd::create(b.pid, *mask)?,
        FileKind::Epoll { .. } => epoll::create(b.pid)?,
        FileKind::InetSocket(s) => match &s.connection {
            Some(conn) => tcp::create(b.pid, s, conn)?,
            None => inet::create(b.pid, s)?,
        },
        FileKind::UnixSocket(s) => unix::create(b, s)?,
        FileKind::Inotify { watches } => inotify::create(b.pid, watches, &b.deleted)?,
        FileKind::ProcFile { .. } => {
            return Err(EngineError::restore(
                b.pid,
                "a /proc file is opened by its process, not staged",
            ))
        }
        FileKind::Carried(c) => {
            return Err(EngineError::restore(
                b.pid,
                format!("{}: a carried file is placed as handed over, not made", c.link),
            ))
        }
    };
    set_status_flags(b.pid, &fd, f.flags)?;
    Ok(fd)
}

/// Gives a new description the file status flags (O_NONBLOCK, O_APPEND...)
/// the image recorded.
pub(crate) fn set_status_flags(pid: i32, fd: &OwnedFd, flags: i32) -> Result<()> {
    let cur =
        ferry_sys::fd::fcntl_int(fd.as_raw_fd(), libc::F_GETFL, 0, "fcntl(F_GETFL)").unwrap_or(0);
    let want = (cur & !SETFL_MASK) | (flags & SETFL_MASK);
    if want != cur {
        ferry_sys::fd::fcntl_int(
            fd.as_raw_fd(),
            libc::F_SETFL,
            want as libc::c_long,
            "fcntl(F_SETFL)",
        )
        .map_err(|e| EngineError::kernel(pid, "setting file status flags", e))?;
    }
    Ok(())
}

/// The F_SETFL argument that gives a socket just made by socket(2)
/// (status flags O_RDWR alone) the status flags `flags`; None when it
/// has them already. Saves reading them back first (F_GETFL): 10,000
/// rebuilt connections, 10,000 calls in the pause.
pub(crate) fn setfl_of_fresh_socket(flags: i32) -> Option<i32> {
    let want = flags & SETFL_MASK;
    (want != 0).then_some(want)
}

/// What of the status flags `flags` a socket can get from socket(2)
/// itself (SOCK_NONBLOCK, when O_NONBLOCK is the only one), and the
/// flags left for [`set_fresh_socket_flags`] (0 when none are).
pub(crate) fn socket_type_flags(flags: i32) -> (i32, i32) {
    if flags & SETFL_MASK == libc::O_NONBLOCK {
        (libc::SOCK_NONBLOCK, 0)
    } else {
        (0, flags)
    }
}

/// [`set_status_flags`] for a socket just made by socket(2).
pub(crate) fn set_fresh_socket_flags(pid: i32, fd: &OwnedFd, flags: i32) -> Result<()> {
    let Some(want) = setfl_of_fresh_socket(flags) else { return Ok(()) };
    ferry_sys::fd::fcntl_int(fd.as_raw_fd(), libc::F_SETFL, want as libc::c_long, "fcntl(F_SETFL)")
        .map_err(|e| EngineError::kernel(pid, "setting file status flags", e))?;
    Ok(())
}

/// Creates every open file description of the tree once, in ferry, at
/// or above `temp_base`; returns them by description id. Each process's
/// descriptions are made in its working directory (relative unix socket
/// names), in the network namespace ferry is in at the time.
pub fn stage_open_files(
    tree: &TreeImage,
    tty_to: &str,
    temp_base: RawFd,
    memfds: &HashMap<u64, RawFd>,
) -> Result<HashMap<u64, OwnedFd>> {
    let mut b = Builder::new(tree, tty_to, memfds, temp_base, None);
    let late = unix_made_late(tree);
    // Unix sockets of an image that records SO_PEERCRED are made later,
    // by `make_unix_late`; established TCP connections after the fork.
    let staged = build_all(&mut b, tree, !late, |f| {
        !(tcp::is_connection(f)
            || carried::is_carried(f)
            || matches!(f.kind, FileKind::ProcFile { .. })
            || (late && matches!(f.kind, FileKind::UnixSocket(_))))
    })?;
    drop(b);
    Ok(staged)
}

/// Builds every open file description of the tree that `wanted` accepts,
/// once, above `b.temp_base`: each process's in its working directory
/// (relative unix socket names), with the mode, owner and locks its
/// inode had. With `unix_sockets` (this call makes them), accepted unix
/// connections are remade first, before any listener takes its name, and
/// afterwards the sockets the tree had waiting or connected one way are
/// connected and what was shut down is shut down (the deferred ones
/// after `send_in_flight`).
fn build_all(
    b: &mut Builder,
    tree: &TreeImage,
    unix_sockets: bool,
    wanted: impl Fn(&OpenFile) -> bool,
) -> Result<HashMap<u64, OwnedFd>> {
    let back = std::env::current_dir().ok();
    let mut made: HashMap<u64, OwnedFd> = HashMap::new();
    let result: Result<()> = (|| {
        if unix_sockets {
            unix_dead::remake_all(b, tree)?;
            unix::connect_named(b, tree)?;
        }
        // inotify instances last: a watch on a deleted file goes on the
        // file made again here, and ferry's own file making (recreating
        // deleted files, mode and owner) does not reach watches made later.
        for inotify_pass in [false, true] {
            for p in &tree.processes {
                b.pid = p.pid;
                if !inotify_pass && p.files.iter().any(|f| matches!(&f.kind, FileKind::UnixSocket(u) if !u.name.is_empty() && u.name[0] != 0)) {
                    std::env::set_current_dir(&p.cwd).map_err(|e| EngineError::io(format!("pid {}: changing directory to {}", p.pid, p.cwd), e))?;
                }
                for (i, f) in p.files.iter().enumerate() {
                    let is_inotify = matches!(f.kind, FileKind::Inotify { .. });
                    if made.contains_key(&f.id) || !wanted(f) || is_inotify != inotify_pass {
                        continue;
                    }
                    let high = build_kept(b, p, i, f)?;
                    if let FileKind::Deleted { path, .. } = &f.kind {
                        b.deleted.insert(format!("{path} (deleted)"), high.as_raw_fd());
                    }
                    made.insert(f.id, high);
                }
            }
        }
        // Files only a message in flight holds (format 4.4), made like the
        // processes' own; `unix::send_in_flight` passes them.
        b.pid = tree.processes.first().map_or(0, |p| p.pid);
        for e in tree.unix_in_flight_files.iter().flat_map(|f| &f.files) {
            if made.contains_key(&e.file.id) || !wanted(&e.file) {
                continue;
            }
            let fd = build_one(b, &e.file)?;
            made.insert(e.file.id, b.keep(fd)?);
        }
        if !unix_sockets {
            return Ok(());
        }
        unix::connect_pending(tree, &made)?;
        unix::connect_one_way(tree, &made)?;
        unix::shut_down(tree, &made, false)
    })();
    if let Some(dir) = back {
        let _ = std::env::set_current_dir(dir);
    }
    result?;
    Ok(made)
}

/// One description, kept above every image fd number, with the mode,
/// owner and locks its inode had.
fn build_kept(b: &mut Builder, p: &ProcessImage, i: usize, f: &OpenFile) -> Result<OwnedFd> {
    let fd = build_one(b, f)?;
    let high = b.keep(fd)?;
    let attrs =
        p.fidelity.inode_attrs.iter().find(|a| a.of == ferry_image::InodeOf::File(i as u32));
    if let Some(a) = attrs {
        ferry_sys::fd::set_mode_owner(high.as_raw_fd(), a.mode, a.uid, a.gid).map_err(|e| {
            EngineError::kernel(
                p.pid,
                format!(
                    "giving recreated file {} mode {:o} and owner {}:{}",
                    f.id, a.mode, a.uid, a.gid
                ),
                e,
            )
        })?;
    }
    locks::take(p.pid, high.as_raw_fd(), &f.locks)?;
    Ok(high)
}

/// Whether the tree's unix sockets are made once every process exists
/// ([`make_unix_late`]) rather than staged before the fork: when the
/// image records their SO_PEERCRED (format 4.3), which only the
/// recorded processes can give them.
pub fn unix_made_late(tree: &TreeImage) -> bool {
    tree.unix_peers.is_some()
}

/// Makes every unix socket of the tree, as [`stage_open_files`] would,
/// now that every process exists: socketpair(), listen() and connect()
/// run in the processes SO_PEERCRED names (see `unix_late`). Returns
/// ferry's descriptors (above `temp_base`) by description id; processes
/// take theirs with pidfd_getfd (`tcp::install`).
pub(crate) fn make_unix_late(
    tree: &TreeImage,
    sessions: &mut [crate::restore::Session],
    tty_to: &str,
    temp_base: RawFd,
) -> Result<HashMap<u64, OwnedFd>> {
    let creds: HashMap<u64, ferry_image::UnixPeerCred> =
        tree.unix_peers.iter().flat_map(|u| u.sockets.iter()).map(|c| (c.ino, c.clone())).collect();
    let mut inj = unix_late::Late { sessions, creds };
    let memfds = HashMap::new();
    let mut b = Builder::new(tree, tty_to, &memfds, temp_base, Some(&mut inj));
    let made = build_all(&mut b, tree, true, |f| matches!(f.kind, FileKind::UnixSocket(_)))?;
    drop(b);
    Ok(made)
}

/// Sends the unix queues that hold descriptors or credentials in flight,
/// once every process of the tree exists; then, every unix queue being
/// written, sets the unix sockets' options.
pub fn send_unix_in_flight(tree: &TreeImage, staged: &HashMap<u64, OwnedFd>) -> Result<()> {
    unix::send_in_flight(tree, staged)?;
    unix_options::apply_all(tree, staged)
}

/// The injected calls that give a process its fd table: everything below
/// `temp_base` closed (a forked child starts with its parent's table),
/// then each fd dup3'ed from its staged description.
pub fn install_calls(
    image: &ProcessImage,
    staged: &HashMap<u64, RawFd>,
    temp_base: RawFd,
    unix_late: bool,
) -> Result<Vec<(String, Call)>> {
    let mut calls = vec![(
        "close_range(inherited fds)".to_string(),
        Call::new(libc::SYS_close_range, &[0, temp_base as u64 - 1, 0]),
    )];
    for slot in &image.fds {
        let f = &image.files[slot.file as usize];
        if tcp::is_connection(f) || (unix_late && matches!(f.kind, FileKind::UnixSocket(_))) {
            // Pulled in afterwards (tcp::install), as are unix sockets
            // made once every process exists (`make_unix_late`).
            continue;
        }
        if matches!(f.kind, FileKind::ProcFile { .. }) {
            continue; // opened later by `proc_file::open_all`
        }
        let src = *staged.get(&f.id).ok_or_else(|| {
            EngineError::restore(image.pid, format!("fd {}: its file was not staged", slot.fd))
        })?;
        let flags = if slot.cloexec { libc::O_CLOEXEC as u64 } else { 0 };
        calls.push((
            format!("dup3(fd {})", slot.fd),
            Call::new(libc::SYS_dup3, &[src as u64, slot.fd as u64, flags]),
        ));
    }
    // A removed cwd was made again on its own at fork time; when the
    // process also holds that directory open, the two were one inode
    // (zdtm cwd02): enter the open one instead.
    if image.cwd.ends_with(" (deleted)") {
        let same = image.fds.iter().find(|s| matches!(&image.files[s.file as usize].kind, FileKind::Directory { path } if *path == image.cwd));
        if let Some(slot) = same {
            calls.push((
                format!("fchdir(fd {}, the removed cwd)", slot.fd),
                Call::new(libc::SYS_fchdir, &[slot.fd as u64]),
            ));
        }
    }
    Ok(calls)
}

/// epoll_ctl calls that fill the epoll instances this process holds and
/// no earlier process registered (`done` collects description ids); the
/// event structs go at `data`.
pub fn epoll_calls(
    image: &ProcessImage,
    data: u64,
    done: &mut std::collections::HashSet<u64>,
) -> (Vec<(String, Call)>, Vec<u8>) {
    let mut calls = Vec::new();
    let mut bytes = Vec::new();
    for (i, f) in image.files.iter().enumerate() {
        let FileKind::Epoll { entries } = &f.kind else {
            continue;
        };
        if !done.insert(f.id) {
            continue;
        }
        let Some(slot) = image.fds.iter().find(|s| s.file as usize == i) else {
            continue;
        };
        for e in entries.iter().filter(|e| {
            !image.fidelity.epoll_targets.iter().any(|t| t.epoll_file as usize == i && t.fd == e.fd)
        }) {
            let at = data + bytes.len() as u64;
            // struct epoll_event is packed on x86_64: u32 events, u64 data.
            bytes.extend_from_slice(&e.events.to_le_bytes());
            bytes.extend_from_slice(&e.data.to_le_bytes());
            calls.push((
                format!("epoll_ctl(epoll fd {}, add fd {})", slot.fd, e.fd),
                Call::new(
                    libc::SYS_epoll_ctl,
                    &[slot.fd as u64, libc::EPOLL_CTL_ADD as u64, e.fd as u64, at],
                ),
            ));
        }
    }
    (calls, bytes)
}

/// Injected calls with the argument bytes they point into.
pub type CallsAndData = (Vec<(String, Call)>, Vec<u8>);

/// epoll entries whose fd number no longer names the watched file (see
/// `Fidelity::epoll_targets`): the file is put on that number just long
/// enough to register it, through the staged epoll description, before
/// the process's own fd table is installed over it. Returns the calls
/// and their event structs (at `data`). Marks nothing in `done`: the
/// regular entries are registered later by `epoll_calls`.
pub fn epoll_target_calls(
    image: &ProcessImage,
    staged: &HashMap<u64, RawFd>,
    data: u64,
    done: &std::collections::HashSet<u64>,
) -> Result<CallsAndData> {
    let mut calls = Vec::new();
    let mut bytes = Vec::new();
    for t in &image.fidelity.epoll_targets {
        let ep = &image.files[t.epoll_file as usize];
        if done.contains(&ep.id) {
            continue;
        }
        let FileKind::Epoll { entries } = &ep.kind else {
            continue;
        };
        let Some(e) = entries.iter().find(|e| e.fd == t.fd) else {
            continue;
        };
        let miss = |what: &str| {
            EngineError::restore(
                image.pid,
                format!("epoll entry for fd {}: {what} was not staged", t.fd),
            )
        };
        let src = *staged.get(&t.target).ok_or_else(|| miss("the watched file"))?;
        let epfd = *staged.get(&ep.id).ok_or_else(|| miss("the epoll instance"))?;
        let at = data + bytes.len() as u64;
        bytes.extend_from_slice(&e.events.to_le_bytes());
        bytes.extend_from_slice(&e.data.to_le_bytes());
        calls.push((
            format!("dup3(watched file -> fd {})", t.fd),
            Call::new(libc::SYS_dup3, &[src as u64, t.fd as u64, 0]),
        ));
        calls.push((
            format!("epoll_ctl(add fd {} whose number was closed)", t.fd),
            Call::new(
                libc::SYS_epoll_ctl,
                &[epfd as u64, libc::EPOLL_CTL_ADD as u64, t.fd as u64, at],
            ),
        ));
        calls.push((format!("close(fd {})", t.fd), Call::new(libc::SYS_close, &[t.fd as u64])));
    }
    Ok((calls, bytes))
}

#[cfg(test)]
mod tests {
    use super::{setfl_of_fresh_socket, socket_type_flags};

    #[test]
    fn only_a_lone_o_nonblock_is_given_by_socket_itself() {
        let nb = libc::O_RDWR | libc::O_NONBLOCK;
        assert_eq!(socket_type_flags(nb), (libc::SOCK_NONBLOCK, 0));
        // Nothing left for F_SETFL then.
        assert_eq!(setfl_of_fresh_socket(socket_type_flags(nb).1), None);
        assert_eq!(socket_type_flags(libc::O_RDWR), (0, libc::O_RDWR));
        let async_too = nb | libc::O_ASYNC;
        assert_eq!(socket_type_flags(async_too), (0, async_too));
    }

    #[test]
    fn a_fresh_socket_is_given_only_the_settable_flags_it_lacks() {
        // A blocking socket as socket(2) makes it: nothing to set.
        assert_eq!(setfl_of_fresh_socket(libc::O_RDWR), None);
        // O_NONBLOCK (and O_ASYNC) are set; the access mode is not F_SETFL's.
        assert_eq!(setfl_of_fresh_socket(libc::O_RDWR | libc::O_NONBLOCK), Some(libc::O_NONBLOCK));
        assert_eq!(
            setfl_of_fresh_socket(libc::O_RDWR | libc::O_NONBLOCK | libc::O_ASYNC),
            Some(libc::O_NONBLOCK | libc::O_ASYNC)
        );
        // A flag F_SETFL cannot change is left alone.
        assert_eq!(setfl_of_fresh_socket(libc::O_RDWR | libc::O_LARGEFILE), None);
    }
}
