//! Pipes (both ends made by one pipe2, unread bytes written back) and
//! FIFOs (reopened by path, with a temporary O_RDWR open holding the
//! bytes until the real ends exist).

use super::Builder;
use crate::error::{EngineError, Result};
use ferry_image::PipeEnd;
use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};

fn refill(pid: i32, w: &OwnedFd, cap: u32, data: &[u8]) -> Result<()> {
    let raw = w.as_raw_fd();
    if cap > 0 {
        let _ = ferry_sys::fd::fcntl_int(raw, libc::F_SETPIPE_SZ, cap as libc::c_long, "fcntl(F_SETPIPE_SZ)");
    }
    if !data.is_empty() {
        let f = std::fs::File::from(w.try_clone().map_err(|e| EngineError::io("pipe", e))?);
        (&f).write_all(data).map_err(|e| EngineError::io(format!("refilling pipe (pid {pid})"), e))?;
    }
    Ok(())
}

pub fn open_pipe_end(b: &mut Builder, end: &PipeEnd) -> Result<OwnedFd> {
    let pid = b.pid;
    if !b.pipes.contains_key(&end.id) {
        let (r, w) = ferry_sys::fd::pipe2(libc::O_CLOEXEC).map_err(|e| EngineError::kernel(pid, "creating a pipe", e))?;
        let (r, w) = (b.keep(r)?, b.keep(w)?);
        b.pipes.insert(end.id, (Some(r), Some(w)));
    }
    if !b.pipe_writers.contains_key(&end.id) {
        let w = b.pipes.get(&end.id).and_then(|e| e.1.as_ref()).ok_or_else(|| EngineError::restore(pid, "pipe vanished"))?;
        let keeper = b.keep(w.try_clone().map_err(|e| EngineError::io("pipe", e))?)?;
        b.pipe_writers.insert(end.id, keeper);
    }
    if let Some(w) = b.pipe_writers.get(&end.id) {
        refill(pid, w, end.capacity, &end.data)?;
    }
    let ends = b.pipes.get_mut(&end.id).ok_or_else(|| EngineError::restore(pid, "pipe vanished"))?;
    let taken = if end.write_end { ends.1.take() } else { ends.0.take() };
    if end.peer_closed {
        let peer = if end.write_end { ends.0.take() } else { ends.1.take() };
        drop(peer);
    }
    match taken {
        Some(fd) => Ok(fd),
        None => reopen(b, end),
    }
}

/// A further open file description of a pipe whose end of this kind
/// already exists (the process opened /proc/self/fd/N again): opened the
/// same way, through the kept write end. A write-only open waits for a
/// reader, so a temporary one is held while it is made.
fn reopen(b: &Builder, end: &PipeEnd) -> Result<OwnedFd> {
    let pid = b.pid;
    let keeper = b.pipe_writers.get(&end.id).ok_or_else(|| EngineError::restore(pid, format!("pipe {} has no kept write end", end.id)))?;
    let path = std::ffi::CString::new(format!("/proc/self/fd/{}", keeper.as_raw_fd())).map_err(|_| EngineError::restore(pid, "pipe path"))?;
    let open = |flags: i32| {
        ferry_sys::fd::open(&path, flags | libc::O_CLOEXEC | libc::O_NONBLOCK, 0)
            .map_err(|e| EngineError::kernel(pid, format!("opening pipe {} again for {}", end.id, if end.write_end { "writing" } else { "reading" }), e))
    };
    if end.write_end {
        let _reader = open(libc::O_RDONLY)?;
        open(libc::O_WRONLY)
    } else {
        open(libc::O_RDONLY)
    }
}

pub fn open_fifo(b: &mut Builder, path: &str, end: &PipeEnd, flags: i32) -> Result<OwnedFd> {
    let pid = b.pid;
    let c = std::ffi::CString::new(path).map_err(|_| EngineError::restore(pid, "FIFO path has a NUL byte"))?;
    if !b.fifo_keepers.contains_key(&end.id) {
        // O_RDWR on a FIFO never blocks.
        let k = ferry_sys::fd::open(&c, libc::O_RDWR, 0).map_err(|e| EngineError::kernel(pid, format!("opening FIFO {path}"), e))?;
        let k = b.keep(k)?;
        b.fifo_keepers.insert(end.id, k);
    }
    if let Some(k) = b.fifo_keepers.get(&end.id) {
        refill(pid, k, end.capacity, &end.data)?;
    }
    let acc = flags & libc::O_ACCMODE;
    // The keeper is both reader and writer, so this open does not block.
    ferry_sys::fd::open(&c, acc | libc::O_NONBLOCK, 0).map_err(|e| EngineError::kernel(pid, format!("opening FIFO {path}"), e))
}
