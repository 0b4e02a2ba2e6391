//! Rebuilding the fd table. Runs inside the new process (before it is
//! stopped for the rest of the restore), so every descriptor is created
//! directly in its final owner. One module per kind of file.

mod epoll;
mod eventfd;
mod inet;
pub(crate) mod locks;
mod pipe;
mod regular;
mod signalfd;
mod timerfd;
mod unix;

use crate::error::{EngineError, Result};
use ferry_image::{FileKind, OpenFile, ProcessImage};
use std::collections::HashMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// What building one file may need from the others.
pub(crate) struct Builder<'a> {
    pub pid: i32,
    pub tty_to: &'a str,
    /// Both ends of pipes created so far, by pipe id.
    pub pipes: HashMap<u64, (Option<OwnedFd>, Option<OwnedFd>)>,
    /// O_RDWR opens that keep FIFO contents alive until every end exists.
    pub fifo_keepers: HashMap<u64, OwnedFd>,
    /// Ends of unix socket pairs made but not yet placed, by inode.
    pub unix_pending: HashMap<u64, OwnedFd>,
    /// A descriptor of every unix pair end, by inode, to refill queues.
    pub unix_peers: HashMap<u64, OwnedFd>,
    /// memfds recreated by ferry before the fork, by id.
    pub memfds: &'a HashMap<u64, RawFd>,
    /// Lowest fd number above every fd of the image.
    pub temp_base: RawFd,
}

impl Builder<'_> {
    /// Moves a descriptor the builder keeps across placements above every
    /// image fd number, so installing the fd table cannot clobber it (and
    /// closing it later cannot close an installed fd).
    pub fn keep(&self, fd: OwnedFd) -> Result<OwnedFd> {
        let high = ferry_sys::fd::fcntl_int(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, self.temp_base as libc::c_long, "fcntl(F_DUPFD)")
            .map_err(|e| EngineError::kernel(self.pid, "moving a kept fd out of the way", e))?;
        owned(self.pid, high, String::new)
    }
}

pub(crate) fn errno_err(pid: i32, what: String) -> EngineError {
    let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
    EngineError::kernel(pid, what, ferry_sys::SysError::new("restore", errno))
}

/// Takes ownership of a raw fd returned by libc, or reports `what`.
pub(crate) fn owned(pid: i32, fd: RawFd, what: impl FnOnce() -> String) -> Result<OwnedFd> {
    if fd < 0 {
        return Err(errno_err(pid, what()));
    }
    // SAFETY: fd was just returned by the kernel and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

const SETFL_MASK: i32 = libc::O_APPEND | libc::O_NONBLOCK | libc::O_ASYNC | libc::O_DIRECT | libc::O_NOATIME;

fn build_one(b: &mut Builder, f: &OpenFile) -> Result<OwnedFd> {
    let fd = match &f.kind {
        FileKind::Regular { .. } | FileKind::Deleted { .. } | FileKind::Directory { .. } | FileKind::CharDevice { .. } | FileKind::Terminal { .. }
        | FileKind::ExternalStdio { .. } => {
            regular::open(b, f)?
        }
        FileKind::Memfd { id } => {
            let fd = b.memfds.get(id).copied().ok_or_else(|| EngineError::restore(b.pid, format!("memfd {id} was not staged")))?;
            regular::reopen(b.pid, fd, f)?
        }
        FileKind::Pipe(end) => pipe::open_pipe_end(b, end)?,
        FileKind::Fifo { path, pipe } => pipe::open_fifo(b, path, pipe, f.flags)?,
        FileKind::EventFd { count, semaphore } => eventfd::create(b.pid, *count, *semaphore)?,
        FileKind::TimerFd(t) => timerfd::create(b.pid, t)?,
        FileKind::SignalFd { mask } => signalfd::create(b.pid, *mask)?,
        FileKind::Epoll { .. } => epoll::create(b.pid)?,
        FileKind::InetSocket(s) => inet::create(b.pid, s)?,
        FileKind::UnixSocket(s) => unix::create(b, s)?,
    };
    let cur = ferry_sys::fd::fcntl_int(fd.as_raw_fd(), libc::F_GETFL, 0, "fcntl(F_GETFL)").unwrap_or(0);
    let want = (cur & !SETFL_MASK) | (f.flags & SETFL_MASK);
    if want != cur {
        ferry_sys::fd::fcntl_int(fd.as_raw_fd(), libc::F_SETFL, want as libc::c_long, "fcntl(F_SETFL)")
            .map_err(|e| EngineError::kernel(b.pid, "setting file status flags", e))?;
    }
    Ok(fd)
}

/// Creates every open file description and installs it under each fd
/// number it had. Temporary descriptors are kept at or above `temp_base`
/// (above every fd the image uses) so they cannot collide with them.
pub fn build_fd_table(image: &ProcessImage, tty_to: &str, temp_base: RawFd, memfds: &HashMap<u64, RawFd>) -> Result<()> {
    let pid = image.pid;
    let mut b = Builder { pid, tty_to, pipes: HashMap::new(), fifo_keepers: HashMap::new(), unix_pending: HashMap::new(), unix_peers: HashMap::new(), memfds, temp_base };
    let mut temps: Vec<OwnedFd> = Vec::with_capacity(image.files.len());
    for f in &image.files {
        let fd = build_one(&mut b, f)?;
        let high = ferry_sys::fd::fcntl_int(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, temp_base as libc::c_long, "fcntl(F_DUPFD)")
            .map_err(|e| EngineError::kernel(pid, "moving a new fd out of the way", e))?;
        temps.push(owned(pid, high, String::new)?);
    }
    for slot in &image.fds {
        let src = temps[slot.file as usize].as_raw_fd();
        let flags = if slot.cloexec { libc::O_CLOEXEC } else { 0 };
        // SAFETY: dup3 onto the slot's number; nothing of ours lives there
        // (our own descriptors are all >= temp_base).
        if unsafe { libc::dup3(src, slot.fd, flags) } < 0 {
            return Err(errno_err(pid, format!("installing fd {}", slot.fd)));
        }
    }
    for (i, f) in image.files.iter().enumerate() {
        if let FileKind::Epoll { entries } = &f.kind {
            let Some(slot) = image.fds.iter().find(|s| s.file as usize == i) else { continue };
            epoll::register(pid, slot.fd, entries)?;
        }
    }
    for (i, f) in image.files.iter().enumerate() {
        if f.locks.is_empty() {
            continue;
        }
        if let Some(slot) = image.fds.iter().find(|s| s.file as usize == i) {
            locks::take(pid, slot.fd, &f.locks)?;
        }
    }
    // Shutdowns last: queued data had to be sent through both ends first.
    for (i, f) in image.files.iter().enumerate() {
        if let FileKind::UnixSocket(u) = &f.kind {
            let Some(slot) = image.fds.iter().find(|s| s.file as usize == i) else { continue };
            let how = match u.shutdown & 3 {
                1 => libc::SHUT_RD,
                2 => libc::SHUT_WR,
                3 => libc::SHUT_RDWR,
                _ => continue,
            };
            // SAFETY: integer arguments on an fd we just installed.
            if unsafe { libc::shutdown(slot.fd, how) } < 0 {
                return Err(errno_err(pid, format!("shutting down unix socket fd {}", slot.fd)));
            }
        }
    }
    drop(b);
    drop(temps);
    Ok(())
}
