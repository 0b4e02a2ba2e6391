//! Pipes (both ends made by one pipe2, unread bytes written back) and
//! FIFOs (reopened by path, with a temporary O_RDWR open holding the
//! bytes until the real ends exist; one unlinked while open is made again
//! and unlinked).

use super::Builder;
use crate::error::{EngineError, Result};
use ferry_image::PipeEnd;
use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};

fn refill(pid: i32, w: &OwnedFd, cap: u32, data: &[u8]) -> Result<()> {
    let raw = w.as_raw_fd();
    if cap > 0 {
        let _ = ferry_sys::fd::fcntl_int(
            raw,
            libc::F_SETPIPE_SZ,
            cap as libc::c_long,
            "fcntl(F_SETPIPE_SZ)",
        );
    }
    if !data.is_empty() {
        let f = std::fs::File::from(w.try_clone().map_err(|e| EngineError::io("pipe", e))?);
        (&f).write_all(data)
            .map_err(|e| EngineError::io(format!("refilling pipe (pid {pid})"), e))?;
    }
    Ok(())
}

pub fn open_pipe_end(b: &mut Builder, end: &PipeEnd) -> Result<OwnedFd> {
    let pid = b.pid;
    if !b.pipes.contains_key(&end.id) {
        let (r, w) = ferry_sys::fd::pipe2(libc::O_CLOEXEC)
            .map_err(|e| EngineError::kernel(pid, "creating a pipe", e))?;
        let (r, w) = (b.keep(r)?, b.keep(w)?);
        b.pipes.insert(end.id, (Some(r), Some(w)));
    }
    if !b.pipe_writers.contains_key(&end.id) {
        let w = b
            .pipes
            .get(&end.id)
            .and_then(|e| e.1.as_ref())
            .ok_or_else(|| EngineError::restore(pid, "pipe vanished"))?;
        let keeper = b.keep(w.try_clone().map_err(|e| EngineError::io("pipe", e))?)?;
        b.pipe_writers.insert(end.id, keeper);
    }
    if let Some(w) = b.pipe_writers.get(&end.id) {
        refill(pid, w, end.capacity, &end.data)?;
    }
    let ends =
        b.pipes.get_mut(&end.id).ok_or_else(|| EngineError::restore(pid, "pipe vanished"))?;
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
    let keeper = b.pipe_writers.get(&end.id).ok_or_else(|| {
        EngineError::restore(pid, format!("pipe {} has no kept write end", end.id))
    })?;
    let path = std::ffi::CString::new(format!("/proc/self/fd/{}", keeper.as_raw_fd()))
        .map_err(|_| EngineError::restore(pid, "pipe path"))?;
    let open = |flags: i32| {
        ferry_sys::fd::open(&path, flags | libc::O_CLOEXEC | libc::O_NONBLOCK, 0).map_err(|e| {
            EngineError::kernel(
                pid,
                format!(
                    "opening pipe {} again for {}",
                    end.id,
                    if end.write_end { "writing" } else { "reading" }
                ),
                e,
            )
        })
    };
    if end.write_end {
        let _reader = open(libc::O_RDONLY)?;
        open(libc::O_WRONLY)
    } else {
        open(libc::O_RDONLY)
    }
}

/// A FIFO that was unlinked while open ("PATH (deleted)"): made again
/// under its old name (or a neighbouring one if that is taken), opened
/// O_RDWR, and unlinked at once. The mode is put back later from the
/// image's inode attributes.
fn recreate_deleted_fifo(pid: i32, path: &str) -> Result<OwnedFd> {
    let cpath = |p: &str| {
        std::ffi::CString::new(p).map_err(|_| EngineError::restore(pid, "FIFO path has a NUL byte"))
    };
    let _parents = super::regular::MadeParents::for_path(pid, path)?;
    let mut name = path.to_string();
    for n in 1..=100 {
        match ferry_sys::fd::mkfifo(&cpath(&name)?, 0o600) {
            Ok(()) => break,
            // Something lives under the old name now: use a neighbour.
            Err(e) if e.errno == libc::EEXIST && n < 100 => {
                name = format!("{path}.ferry-{pid}-{n}")
            }
            Err(e) => {
                return Err(EngineError::kernel(pid, format!("recreating deleted FIFO {name}"), e))
            }
        }
    }
    let c = cpath(&name)?;
    let fd = ferry_sys::fd::open(&c, libc::O_RDWR, 0)
        .map_err(|e| EngineError::kernel(pid, format!("opening recreated FIFO {name}"), e));
    std::fs::remove_file(&name)
        .map_err(|e| EngineError::io(format!("pid {pid}: unlinking recreated FIFO {name}"), e))?;
    fd
}

pub fn open_fifo(b: &mut Builder, path: &str, end: &PipeEnd, flags: i32) -> Result<OwnedFd> {
    let pid = b.pid;
    let deleted = path.strip_suffix(" (deleted)");
    if !b.fifo_keepers.contains_key(&end.id) {
        let k = match deleted {
            Some(p) => recreate_deleted_fifo(pid, p)?,
            None => {
                let c = std::ffi::CString::new(path)
                    .map_err(|_| EngineError::restore(pid, "FIFO path has a NUL byte"))?;
                // O_RDWR on a FIFO never blocks.
                ferry_sys::fd::open(&c, libc::O_RDWR, 0)
                    .map_err(|e| EngineError::kernel(pid, format!("opening FIFO {path}"), e))?
            }
        };
        let k = b.keep(k)?;
        b.fifo_keepers.insert(end.id, k);
    }
    let k = b
        .fifo_keepers
        .get(&end.id)
        .ok_or_else(|| EngineError::restore(pid, "FIFO keeper vanished"))?;
    refill(pid, k, end.capacity, &end.data)?;
    // A deleted FIFO has no name left: every end is opened through the keeper.
    let open_path = if deleted.is_some() {
        format!("/proc/self/fd/{}", k.as_raw_fd())
    } else {
        path.to_string()
    };
    let c = std::ffi::CString::new(open_path)
        .map_err(|_| EngineError::restore(pid, "FIFO path has a NUL byte"))?;
    let acc = flags & libc::O_ACCMODE;
    // The keeper is both reader and writer, so this open does not block.
    ferry_sys::fd::open(&c, acc | libc::O_NONBLOCK, 0)
        .map_err(|e| EngineError::kernel(pid, format!("opening FIFO {path}"), e))
}
