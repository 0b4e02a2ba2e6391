//! File descriptors: which numbers exist, which open file description each
//! points at (dup'ed fds share one), and what that description is. One
//! module per kind of file.

mod epoll;
mod eventfd;
mod inet;
mod locks;
mod pipe;
mod regular;
mod signalfd;
mod timerfd;
mod unix;

use crate::error::{EngineError, Result};
use crate::procfs;
use ferry_image::{FdSlot, FileKind, OpenFile};
use std::os::fd::OwnedFd;
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
}

impl FdInfo<'_> {
    pub fn unsupported(&self, reason: impl Into<String>) -> EngineError {
        EngineError::unsupported(self.pid, format!("fd {} ({})", self.fd, self.link), reason)
    }
    /// Our own duplicate of the fd (pidfd_getfd).
    pub fn dup(&self) -> Result<OwnedFd> {
        ferry_sys::pidfd::pidfd_getfd(self.pidfd, self.fd).map_err(|e| EngineError::kernel(self.pid, format!("duplicating fd {}", self.fd), e))
    }
    pub fn field(&self, key: &str) -> Option<&str> {
        self.fdinfo.lines().find_map(|l| l.strip_prefix(key).and_then(|r| r.strip_prefix(':')).map(str::trim))
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
        return match kind {
            "[eventfd]" => eventfd::capture(info),
            "[timerfd]" => timerfd::capture(info),
            "[signalfd]" => signalfd::capture(info),
            "[eventpoll]" => epoll::capture(info),
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
    Err(info.unsupported("this kind of file is not supported yet"))
}

/// Whether a pipe or socket leads to another process: no other fd of this
/// process refers to the same pipe (its other end) or to the socket's peer.
fn leads_out(pid: i32, info: &FdInfo) -> bool {
    if info.link.starts_with("pipe:") {
        let ends = std::fs::read_dir(format!("/proc/{pid}/fd"))
            .map(|rd| rd.flatten().filter(|e| std::fs::read_link(e.path()).is_ok_and(|l| l.as_os_str() == info.link.as_str())).count())
            .unwrap_or(0);
        // Both ends of one pipe show the same inode.
        return ends < 2;
    }
    true
}

/// Captures all fds of `pid`. Returns the open file descriptions and the
/// fd table pointing into them.
pub fn capture(pid: i32, pidfd: &OwnedFd, external_stdio: bool) -> Result<(Vec<OpenFile>, Vec<FdSlot>)> {
    let dir = format!("/proc/{pid}/fd");
    let mut fds: Vec<i32> = std::fs::read_dir(&dir)
        .map_err(|e| EngineError::io(&dir, e))?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    fds.sort_unstable();
    let mut files: Vec<OpenFile> = Vec::new();
    let mut slots: Vec<FdSlot> = Vec::new();
    // (dev, ino, file index, a representative fd) for sharing detection.
    let mut seen: Vec<(u64, u64, u32, i32)> = Vec::new();
    for fd in fds {
        let link = procfs::read_link(&format!("{dir}/{fd}"))?;
        let fdinfo = procfs::read_string(&format!("/proc/{pid}/fdinfo/{fd}"))?;
        let meta = std::fs::metadata(format!("{dir}/{fd}")).map_err(|e| EngineError::io(format!("{dir}/{fd} ({link})"), e))?;
        let info = FdInfo { pid, fd, link, fdinfo, meta, pidfd };
        let flags = info.field("flags").and_then(procfs::parse_octal).unwrap_or(0) as i32;
        let pos = info.field("pos").and_then(|p| p.parse().ok()).unwrap_or(0);
        let cloexec = flags & libc::O_CLOEXEC != 0;
        let (dev, ino) = (info.meta.dev(), info.meta.ino());
        let mut shared_with = None;
        for &(d, i, idx, other) in &seen {
            if d == dev && i == ino && ferry_sys::fd::kcmp_same_file(pid, pid, fd, other).unwrap_or(false) {
                shared_with = Some(idx);
                break;
            }
        }
        let file = match shared_with {
            Some(idx) => idx,
            None => {
                let stdio_link = fd <= 2 && (info.link.starts_with("pipe:") || info.link.starts_with("socket:"));
                let kind = if external_stdio && stdio_link && leads_out(pid, &info) {
                    FileKind::ExternalStdio { what: info.link.clone() }
                } else {
                    capture_kind(&info)?
                };
                let locks = locks::parse(&info)?;
                files.push(OpenFile { flags: flags & !libc::O_CLOEXEC, pos, kind, locks });
                let idx = (files.len() - 1) as u32;
                seen.push((dev, ino, idx, fd));
                idx
            }
        };
        slots.push(FdSlot { fd, file, cloexec });
    }
    pipe::check_both_ends_present(pid, &mut files, &slots)?;
    epoll::check_targets(pid, &files, &slots)?;
    Ok((files, slots))
}
