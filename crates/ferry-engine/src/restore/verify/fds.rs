//! The fd table: the same fd numbers and no other, each with its
//! close-on-exec bit, its description's status flags and offset, and a
//! file of the kind the image recorded (the link /proc/PID/fd shows). A
//! terminal or outside stdio is the file the user chose at restore, and
//! only its number is compared.

use super::Findings;
use crate::error::{EngineError, Result};
use ferry_image::{FileKind, ProcessImage};
use std::os::fd::AsFd;

/// What /proc/PID/fd/N must show for a kind: the whole link, or its
/// start; None where the link says nothing more than the number does.
enum Link<'a> {
    Exactly(&'a str),
    StartsWith(&'static str),
    Any,
}

fn expected_link(kind: &FileKind) -> Link<'_> {
    match kind {
        FileKind::Regular { path, .. } | FileKind::Directory { path } => Link::Exactly(path),
        FileKind::Pipe(_) => Link::StartsWith("pipe:["),
        FileKind::InetSocket(_) | FileKind::UnixSocket(_) => Link::StartsWith("socket:["),
        FileKind::EventFd { .. } => Link::Exactly("anon_inode:[eventfd]"),
        FileKind::TimerFd(_) => Link::Exactly("anon_inode:[timerfd]"),
        FileKind::SignalFd { .. } => Link::Exactly("anon_inode:[signalfd]"),
        FileKind::Epoll { .. } => Link::Exactly("anon_inode:[eventpoll]"),
        FileKind::Inotify { .. } => Link::Exactly("anon_inode:inotify"),
        FileKind::Memfd { .. } => Link::StartsWith("/memfd:"),
        _ => Link::Any,
    }
}

fn link_matches(want: &Link, link: &str) -> bool {
    match want {
        Link::Exactly(w) => link == *w,
        Link::StartsWith(p) => link.starts_with(p),
        Link::Any => true,
    }
}

/// Replaced by the user's choice at restore: only the number is the image's.
fn replaced(kind: &FileKind) -> bool {
    matches!(kind, FileKind::Terminal { .. } | FileKind::ExternalStdio { .. })
}

fn restored_fds(pid: i32) -> Result<Vec<i32>> {
    let dir = format!("/proc/{pid}/fd");
    let mut fds: Vec<i32> = std::fs::read_dir(&dir)
        .map_err(|e| EngineError::io(&dir, e))?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    fds.sort_unstable();
    Ok(fds)
}

pub(super) fn compare(p: &ProcessImage, found: &mut Findings) -> Result<()> {
    let pid = p.pid;
    let mut want: Vec<i32> = p.fds.iter().map(|s| s.fd).collect();
    want.sort_unstable();
    let have = restored_fds(pid)?;
    if want != have {
        let extra: Vec<i32> = have.iter().filter(|f| !want.contains(f)).copied().collect();
        let missing: Vec<i32> = want.iter().filter(|f| !have.contains(f)).copied().collect();
        found.compare(
            pid,
            "the fd table",
            "fds not in the image / missing",
            (Vec::<i32>::new(), Vec::<i32>::new()),
            (extra, missing),
        );
        return Ok(());
    }
    // Two /proc reads per fd, relative to open directories, spread over
    // the worker threads: a server may hold 10,000 descriptors.
    let dirs = ProcDirs::open(pid)?;
    let per_fd = crate::parallel::map(&p.fds, |slot| {
        let mut mine = Findings::default();
        if let Some(file) = p.files.get(slot.file as usize) {
            compare_fd(&dirs, slot.fd, slot.cloexec, file, &mut mine)?;
        }
        Ok(mine.list)
    })?;
    found.list.extend(per_fd.into_iter().flatten());
    Ok(())
}

/// /proc/PID/fd and /proc/PID/fdinfo, open.
struct ProcDirs {
    pid: i32,
    fd: std::fs::File,
    fdinfo: std::fs::File,
}

impl ProcDirs {
    fn open(pid: i32) -> Result<ProcDirs> {
        let dir = |name: &str| {
            let path = format!("/proc/{pid}/{name}");
            std::fs::File::open(&path).map_err(|e| EngineError::io(path, e))
        };
        Ok(ProcDirs { pid, fd: dir("fd")?, fdinfo: dir("fdinfo")? })
    }

    fn fdinfo(&self, fd: i32) -> Result<String> {
        let name = std::ffi::CString::new(fd.to_string()).unwrap_or_default();
        ferry_sys::fd::read_small_at(self.fdinfo.as_fd(), &name, 4096)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .map_err(|e| EngineError::kernel(self.pid, format!("reading fdinfo of fd {fd}"), e))
    }

    fn link(&self, fd: i32) -> Result<String> {
        let name = std::ffi::CString::new(fd.to_string()).unwrap_or_default();
        ferry_sys::fd::readlink_at(self.fd.as_fd(), &name)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .map_err(|e| EngineError::kernel(self.pid, format!("reading the link of fd {fd}"), e))
    }
}

fn compare_fd(
    dirs: &ProcDirs,
    fd: i32,
    cloexec: bool,
    file: &ferry_image::OpenFile,
    found: &mut Findings,
) -> Result<()> {
    let pid = dirs.pid;
    let object = format!("fd {fd}");
    let fdinfo = dirs.fdinfo(fd)?;
    let fields = crate::procfs::key_values(&fdinfo);
    let flags = fields.get("flags").and_then(|v| crate::procfs::parse_octal(v)).unwrap_or(0) as i32;
    found.compare(pid, &object, "close-on-exec", cloexec, flags & libc::O_CLOEXEC != 0);
    if replaced(&file.kind) {
        return Ok(());
    }
    let link = dirs.link(fd)?;
    let want = expected_link(&file.kind);
    if !link_matches(&want, &link) {
        let wanted = match want {
            Link::Exactly(w) => w.to_string(),
            Link::StartsWith(p) => format!("{p}..."),
            Link::Any => String::new(),
        };
        found.compare(pid, &object, "file", wanted, link);
        return Ok(());
    }
    found.compare(pid, &object, "status flags", file.flags, flags & !libc::O_CLOEXEC);
    let pos: i64 = fields.get("pos").and_then(|v| v.parse().ok()).unwrap_or(0);
    found.compare(pid, &object, "offset", file.pos, pos);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_are_matched_by_kind() {
        let epoll = FileKind::Epoll { entries: Vec::new() };
        assert!(link_matches(&expected_link(&epoll), "anon_inode:[eventpoll]"));
        assert!(!link_matches(&expected_link(&epoll), "socket:[1234]"));
        let file = FileKind::Regular { path: "/etc/hosts".into(), size: 1 };
        assert!(link_matches(&expected_link(&file), "/etc/hosts"));
        assert!(!link_matches(&expected_link(&file), "/etc/hosts (deleted)"));
        let ev = FileKind::EventFd { count: 0, semaphore: false };
        assert!(link_matches(&expected_link(&ev), "anon_inode:[eventfd]"));
    }
}
