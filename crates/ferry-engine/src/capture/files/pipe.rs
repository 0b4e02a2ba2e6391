//! Pipes and FIFOs, with the bytes still waiting in them. The data is
//! copied with tee(2), which leaves it in the pipe.

use super::FdInfo;
use crate::error::{EngineError, Result};
use ferry_image::{FileKind, OpenFile, PipeEnd};
use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;

fn unread_data(info: &FdInfo) -> Result<(u32, Vec<u8>)> {
    let fd = info.dup()?;
    let kerr = |what: &str, e| {
        EngineError::kernel(info.pid, format!("fd {} ({}): {what}", info.fd, info.link), e)
    };
    let cap =
        ferry_sys::fd::fcntl_int(fd.as_raw_fd(), libc::F_GETPIPE_SZ, 0, "fcntl(F_GETPIPE_SZ)")
            .map_err(|e| kerr("pipe size", e))?;
    let readable = info.field("flags").and_then(crate::procfs::parse_octal).unwrap_or(0) as i32
        & libc::O_ACCMODE
        != libc::O_WRONLY;
    if !readable {
        return Ok((cap as u32, Vec::new()));
    }
    let queued =
        ferry_sys::fd::bytes_readable(fd.as_raw_fd()).map_err(|e| kerr("queued bytes", e))?;
    if queued == 0 {
        return Ok((cap as u32, Vec::new()));
    }
    let (r, w) = ferry_sys::fd::pipe2(libc::O_CLOEXEC | libc::O_NONBLOCK)
        .map_err(|e| kerr("temporary pipe", e))?;
    ferry_sys::fd::fcntl_int(
        w.as_raw_fd(),
        libc::F_SETPIPE_SZ,
        cap as libc::c_long,
        "fcntl(F_SETPIPE_SZ)",
    )
    .map_err(|e| kerr("sizing temporary pipe", e))?;
    let n =
        ferry_sys::fd::tee(fd.as_raw_fd(), w.as_raw_fd(), queued).map_err(|e| kerr("tee", e))?;
    if n != queued {
        return Err(info.unsupported(format!("copied {n} of {queued} queued bytes")));
    }
    drop(w);
    let mut data = Vec::with_capacity(n);
    std::fs::File::from(r)
        .read_to_end(&mut data)
        .map_err(|e| EngineError::io(format!("fd {} copy", info.fd), e))?;
    Ok((cap as u32, data))
}

fn end(info: &FdInfo) -> Result<PipeEnd> {
    let flags = info.field("flags").and_then(crate::procfs::parse_octal).unwrap_or(0) as i32;
    let (capacity, data) = unread_data(info)?;
    Ok(PipeEnd {
        id: info.meta.ino(),
        write_end: flags & libc::O_ACCMODE == libc::O_WRONLY,
        capacity,
        data,
        peer_closed: false,
    })
}

pub fn capture_pipe(info: &FdInfo) -> Result<FileKind> {
    Ok(FileKind::Pipe(end(info)?))
}

pub fn capture_fifo(info: &FdInfo) -> Result<FileKind> {
    Ok(FileKind::Fifo { path: info.link.clone(), pipe: end(info)? })
}

/// Every pipe end in the tree needs its other end in the tree too, or
/// nowhere (closed by everyone): returns the ends whose peer was closed,
/// as (pipe id, is write end). A peer held by a process outside the tree
/// is refused by name.
pub fn check_tree(all: &[(i32, &OpenFile, i32)], tree: &[i32]) -> Result<Vec<(u64, bool)>> {
    let mut closed = Vec::new();
    for &(pid, f, fd) in all {
        let FileKind::Pipe(p) = &f.kind else { continue };
        let other = all.iter().any(|(_, g, _)| matches!(&g.kind, FileKind::Pipe(q) if q.id == p.id && q.write_end != p.write_end));
        if other {
            continue;
        }
        if let Some(holder) = other_holder(tree, p.id) {
            return Err(EngineError::unsupported(
                pid,
                format!("fd {fd} (pipe:[{}])", p.id),
                format!(
                    "its {} end is held by process {holder}, outside the tree",
                    if p.write_end { "read" } else { "write" }
                ),
            ));
        }
        closed.push((p.id, p.write_end));
    }
    Ok(closed)
}

/// A process outside `tree` with an fd on pipe `id`, if any.
fn other_holder(tree: &[i32], id: u64) -> Option<i32> {
    let want = format!("pipe:[{id}]");
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(other) = entry.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        if tree.contains(&other) || other == std::process::id() as i32 {
            continue;
        }
        let Ok(fds) = std::fs::read_dir(format!("/proc/{other}/fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if std::fs::read_link(fd.path()).is_ok_and(|l| l.as_os_str() == want.as_str()) {
                return Some(other);
            }
        }
    }
    None
}

/// A pipe whose write end is in packet mode (O_DIRECT, pipe2(O_DIRECT))
/// keeps each write as one message; the bytes queued are copied without
/// their boundaries, so a packet-mode pipe with bytes queued is refused.
/// An empty one is restored: F_SETFL gives the new write end O_DIRECT.
pub fn check_packets(all: &[(i32, &OpenFile, i32)]) -> Result<()> {
    let pipe_of = |f: &OpenFile| match &f.kind {
        FileKind::Pipe(end) | FileKind::Fifo { pipe: end, .. } => Some(end.id),
        _ => None,
    };
    for &(pid, f, fd) in all {
        let Some(id) = pipe_of(f) else { continue };
        if f.flags & libc::O_DIRECT == 0 || f.flags & libc::O_ACCMODE == libc::O_RDONLY {
            continue;
        }
        let queued: usize = all
            .iter()
            .filter(|(_, g, _)| pipe_of(g) == Some(id))
            .filter_map(|(_, g, _)| match &g.kind {
                FileKind::Pipe(end) | FileKind::Fifo { pipe: end, .. } => Some(end.data.len()),
                _ => None,
            })
            .max()
            .unwrap_or(0);
        if queued > 0 {
            return Err(EngineError::unsupported(
                pid,
                format!("fd {fd} (pipe:[{id}])"),
                format!("a packet-mode pipe (O_DIRECT) with {queued} bytes queued; their message boundaries are not restored"),
            ));
        }
    }
    Ok(())
}
