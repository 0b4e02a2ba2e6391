//! Pipes and FIFOs, with the bytes still waiting in them. The data is
//! copied with tee(2), which leaves it in the pipe.

use super::FdInfo;
use crate::error::{EngineError, Result};
use ferry_image::{FdSlot, FileKind, OpenFile, PipeEnd};
use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;

fn unread_data(info: &FdInfo) -> Result<(u32, Vec<u8>)> {
    let fd = info.dup()?;
    let kerr = |what: &str, e| EngineError::kernel(info.pid, format!("fd {} ({}): {what}", info.fd, info.link), e);
    let cap = ferry_sys::fd::fcntl_int(fd.as_raw_fd(), libc::F_GETPIPE_SZ, 0, "fcntl(F_GETPIPE_SZ)").map_err(|e| kerr("pipe size", e))?;
    let readable = info.field("flags").and_then(crate::procfs::parse_octal).unwrap_or(0) as i32 & libc::O_ACCMODE != libc::O_WRONLY;
    if !readable {
        return Ok((cap as u32, Vec::new()));
    }
    let queued = ferry_sys::fd::bytes_readable(fd.as_raw_fd()).map_err(|e| kerr("queued bytes", e))?;
    if queued == 0 {
        return Ok((cap as u32, Vec::new()));
    }
    let (r, w) = ferry_sys::fd::pipe2(libc::O_CLOEXEC | libc::O_NONBLOCK).map_err(|e| kerr("temporary pipe", e))?;
    ferry_sys::fd::fcntl_int(w.as_raw_fd(), libc::F_SETPIPE_SZ, cap as libc::c_long, "fcntl(F_SETPIPE_SZ)").map_err(|e| kerr("sizing temporary pipe", e))?;
    let n = ferry_sys::fd::tee(fd.as_raw_fd(), w.as_raw_fd(), queued).map_err(|e| kerr("tee", e))?;
    if n != queued {
        return Err(info.unsupported(format!("copied {n} of {queued} queued bytes")));
    }
    drop(w);
    let mut data = Vec::with_capacity(n);
    std::fs::File::from(r).read_to_end(&mut data).map_err(|e| EngineError::io(format!("fd {} copy", info.fd), e))?;
    Ok((cap as u32, data))
}

fn end(info: &FdInfo) -> Result<PipeEnd> {
    let flags = info.field("flags").and_then(crate::procfs::parse_octal).unwrap_or(0) as i32;
    let (capacity, data) = unread_data(info)?;
    Ok(PipeEnd { id: info.meta.ino(), write_end: flags & libc::O_ACCMODE == libc::O_WRONLY, capacity, data, peer_closed: false })
}

pub fn capture_pipe(info: &FdInfo) -> Result<FileKind> {
    Ok(FileKind::Pipe(end(info)?))
}

pub fn capture_fifo(info: &FdInfo) -> Result<FileKind> {
    Ok(FileKind::Fifo { path: info.link.clone(), pipe: end(info)? })
}

/// A pipe whose other end lives in another process cannot be restored
/// alone: refuse it by name.
/// alone: refuse it by name. If no process holds the other end, it was
/// closed, and restore closes it too.
pub fn check_both_ends_present(pid: i32, files: &mut [OpenFile], slots: &[FdSlot]) -> Result<()> {
    for i in 0..files.len() {
        let FileKind::Pipe(p) = &files[i].kind else { continue };
        let (id, write_end) = (p.id, p.write_end);
        let other = files.iter().any(|g| matches!(&g.kind, FileKind::Pipe(q) if q.id == id && q.write_end != write_end));
        if other {
            continue;
        }
        if let Some(holder) = other_holder(pid, id) {
            let fd = slots.iter().find(|s| s.file as usize == i).map_or(-1, |s| s.fd);
            return Err(EngineError::unsupported(
                pid,
                format!("fd {fd} (pipe:[{id}])"),
                format!("its {} end is held by process {holder}", if write_end { "read" } else { "write" }),
            ));
        }
        if let FileKind::Pipe(p) = &mut files[i].kind {
            p.peer_closed = true;
        }
    }
    Ok(())
}

/// Another process with an fd on pipe `id`, if any.
fn other_holder(pid: i32, id: u64) -> Option<i32> {
    let want = format!("pipe:[{id}]");
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(other) = entry.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else { continue };
        if other == pid || other == std::process::id() as i32 {
            continue;
        }
        let Ok(fds) = std::fs::read_dir(format!("/proc/{other}/fd")) else { continue };
        for fd in fds.flatten() {
            if std::fs::read_link(fd.path()).is_ok_and(|l| l.as_os_str() == want.as_str()) {
                return Some(other);
            }
        }
    }
    None
}
