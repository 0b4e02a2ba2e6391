//! The fd table: the same fd numbers and no other, each with its
//! close-on-exec bit, its description's status flags and offset, and a
//! file of the kind the image recorded (the link /proc/PID/fd shows; for
//! a rebuilt TCP connection, the very description ferry made, by kcmp).
//! A terminal or outside stdio is the file the user chose at restore,
//! and only its number is compared.

use super::Findings;
use crate::error::{EngineError, Result};
use ferry_image::{FileKind, ProcessImage};
use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

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
        FileKind::Carried(c) => Link::Exactly(&c.link),
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

/// Lists the table and records what differs from `want` (sorted).
fn compare_numbers(pid: i32, want: &[i32], found: &mut Findings) -> Result<()> {
    let have = restored_fds(pid)?;
    if want != have.as_slice() {
        let extra: Vec<i32> = have.iter().filter(|f| !want.contains(f)).copied().collect();
        let missing: Vec<i32> = want.iter().filter(|f| !have.contains(f)).copied().collect();
        found.compare(
            pid,
            "the fd table",
            "fds not in the image / missing",
            (Vec::<i32>::new(), Vec::<i32>::new()),
            (extra, missing),
        );
    }
    Ok(())
}

/// `connections` are ferry's descriptors of the rebuilt TCP connections,
/// by file id; `fd_flags` the process's own F_GETFD of each fd (see
/// [`compare_rebuilt`]): with both, a rebuilt connection's fd needs no
/// /proc read.
pub(super) fn compare(
    p: &ProcessImage,
    connections: &HashMap<u64, OwnedFd>,
    fd_flags: Option<&HashMap<i32, i64>>,
    found: &mut Findings,
) -> Result<()> {
    let pid = p.pid;
    let mut want: Vec<i32> = p.fds.iter().map(|s| s.fd).collect();
    want.sort_unstable();
    let dirs = ProcDirs::open(pid)?;
    // The size of /proc/PID/fd is the number of open fds: when it is the
    // image's count and each of the image's fds is there, the table holds
    // exactly those, without listing 10,000 entries. Anything else is
    // listed and named.
    if want.is_empty() || dirs.open_count() != Some(want.len()) {
        return compare_numbers(pid, &want, found);
    }
    let me = std::process::id() as i32;
    // Spread over the worker threads: a server may hold 10,000 descriptors.
    let per_fd = crate::parallel::map(&p.fds, |slot| {
        let mut mine = Findings::default();
        let Some(file) = p.files.get(slot.file as usize) else {
            return Ok(Some(mine.list));
        };
        let ours = connections.get(&file.id);
        if let (Some(ours), Some(&flags)) = (ours, fd_flags.and_then(|f| f.get(&slot.fd))) {
            match compare_rebuilt((pid, me), slot, file, ours, flags, &mut mine)? {
                Rebuilt::Same => return Ok(Some(mine.list)),
                Rebuilt::NoFd => return Ok(None),
                // Named by what /proc shows, below.
                Rebuilt::OtherFile => {}
            }
        }
        let Some(fdinfo) = dirs.fdinfo(slot.fd)? else {
            return Ok(None);
        };
        compare_fd(&dirs, slot, &fdinfo, file, &mut mine)?;
        Ok(Some(mine.list))
    })?;
    let Some(per_fd) = per_fd.into_iter().collect::<Option<Vec<_>>>() else {
        return compare_numbers(pid, &want, found);
    };
    found.list.extend(per_fd.into_iter().flatten());
    Ok(())
}

/// Each fd of a carried file is the very description ferry was handed
/// (kcmp KCMP_FILE against ferry's descriptor, `carried` by file id):
/// the same socket, pipe or eventfd, not merely one of its kind.
pub(super) fn compare_carried(
    p: &ProcessImage,
    carried: &HashMap<u64, std::os::fd::RawFd>,
    found: &mut Findings,
) -> Result<()> {
    let me = std::process::id() as i32;
    for slot in &p.fds {
        let Some(file) = p.files.get(slot.file as usize) else { continue };
        let FileKind::Carried(c) = &file.kind else { continue };
        let Some(&ours) = carried.get(&file.id) else { continue };
        let same = match ferry_sys::fd::kcmp_same_file(p.pid, me, slot.fd, ours) {
            Ok(same) => same,
            // No fd there: the fd table's comparison names it.
            Err(e) if e.errno == libc::EBADF => continue,
            Err(e) => return Err(EngineError::kernel(p.pid, format!("kcmp of fd {}", slot.fd), e)),
        };
        let object = format!("fd {} ({})", slot.fd, c.link);
        let shown = |same: bool| if same { "the carried file" } else { "another file" };
        found.compare(p.pid, &object, "open file description", shown(true), shown(same));
    }
    Ok(())
}

/// What an fd that should hold a rebuilt connection holds.
#[derive(Debug, PartialEq)]
enum Rebuilt {
    /// The very description ferry made (its attributes compared).
    Same,
    /// Something else.
    OtherFile,
    /// No fd at that number.
    NoFd,
}

/// An fd that should be the rebuilt connection `ours` (ferry's
/// descriptor of it): kcmp shows whether it is that very open file
/// description; then its status flags and offset are the description's,
/// read on ferry's descriptor, and its close-on-exec bit is `fd_flags`,
/// the process's own F_GETFD of the fd (a negative errno: not there).
/// `me` is ferry's PID.
/// One syscall of ferry per fd and a share of a batch in the process,
/// against an fdinfo open, read and close.
fn compare_rebuilt(
    (pid, me): (i32, i32),
    slot: &ferry_image::FdSlot,
    file: &ferry_image::OpenFile,
    ours: &OwnedFd,
    fd_flags: i64,
    found: &mut Findings,
) -> Result<Rebuilt> {
    let fd = slot.fd;
    if fd_flags == -(libc::EBADF as i64) {
        return Ok(Rebuilt::NoFd);
    }
    if fd_flags < 0 {
        let call = format!("fcntl(fd {fd}, F_GETFD)");
        return crate::inject::check(pid, pid, &call, fd_flags).map(|_| Rebuilt::NoFd);
    }
    match ferry_sys::fd::kcmp_same_file(pid, me, fd, ours.as_raw_fd()) {
        Ok(true) => {}
        Ok(false) => return Ok(Rebuilt::OtherFile),
        Err(e) if e.errno == libc::EBADF => return Ok(Rebuilt::NoFd),
        Err(e) => return Err(EngineError::kernel(pid, format!("kcmp of fd {fd}"), e)),
    }
    let object = format!("fd {fd}");
    let cloexec = fd_flags & i64::from(libc::FD_CLOEXEC) != 0;
    found.compare(pid, &object, "close-on-exec", slot.cloexec, cloexec);
    let flags = ferry_sys::fd::fcntl_getfl(ours.as_fd())
        .map_err(|e| EngineError::kernel(pid, format!("status flags of fd {fd}"), e))?;
    found.compare(pid, &object, "status flags", file.flags, flags & !libc::O_CLOEXEC);
    // A rebuilt connection is a socket, which keeps no file position
    // (lseek: ESPIPE, always): fdinfo shows it as 0. Not asked, 10,000
    // calls in the pause at 10,000 connections.
    found.compare(pid, &object, "offset", file.pos, 0);
    Ok(Rebuilt::Same)
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

    /// The fdinfo of `fd`, None when there is no such fd.
    fn fdinfo(&self, fd: i32) -> Result<Option<String>> {
        let name = std::ffi::CString::new(fd.to_string()).unwrap_or_default();
        match ferry_sys::fd::read_small_at(self.fdinfo.as_fd(), &name, 4096) {
            Ok(b) => Ok(Some(String::from_utf8_lossy(&b).into_owned())),
            Err(e) if e.errno == libc::ENOENT => Ok(None),
            Err(e) => Err(EngineError::kernel(self.pid, format!("reading fdinfo of fd {fd}"), e)),
        }
    }

    /// How many fds are open: the size the kernel gives /proc/PID/fd
    /// (none before Linux 6.2, where it is 0).
    fn open_count(&self) -> Option<usize> {
        let size = self.fd.metadata().ok()?.len();
        (size > 0).then_some(size as usize)
    }

    fn link(&self, fd: i32) -> Result<String> {
        let name = std::ffi::CString::new(fd.to_string()).unwrap_or_default();
        ferry_sys::fd::readlink_at(self.fd.as_fd(), &name)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .map_err(|e| EngineError::kernel(self.pid, format!("reading the link of fd {fd}"), e))
    }
}

/// One fd against its slot and file, from its fdinfo and link.
fn compare_fd(
    dirs: &ProcDirs,
    slot: &ferry_image::FdSlot,
    fdinfo: &str,
    file: &ferry_image::OpenFile,
    found: &mut Findings,
) -> Result<()> {
    let (pid, fd) = (dirs.pid, slot.fd);
    let object = format!("fd {fd}");
    let fields = crate::procfs::key_values(fdinfo);
    let flags = fields.get("flags").and_then(|v| crate::procfs::parse_octal(v)).unwrap_or(0) as i32;
    found.compare(pid, &object, "close-on-exec", slot.cloexec, flags & libc::O_CLOEXEC != 0);
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
    use ferry_image::{FdSlot, InetSocket, OpenFile};
    use std::os::unix::net::UnixStream;

    /// `sleep` with stdin `fd0` and /dev/null out, killed and reaped on drop.
    struct Child(std::process::Child);

    impl Child {
        fn with_stdin(fd0: OwnedFd) -> Child {
            use std::process::{Command, Stdio};
            let mut cmd = Command::new("sleep");
            // Only fds 0-2: the test process may hold others without O_CLOEXEC.
            let c = ferry_testkit::only_stdio(&mut cmd)
                .arg("30")
                .stdin(Stdio::from(fd0))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn sleep");
            let child = Child(c);
            // sleep's start-up opens and closes files (locale), and
            // before its exec the child is a fork of this process: wait
            // until it sleeps (state S, past its exec and start-up) with
            // only the three fds it was given.
            let pid = child.0.id() as i32;
            let end = std::time::Instant::now() + std::time::Duration::from_secs(5);
            let settled = || {
                let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
                comm.trim() == "sleep"
                    && crate::procfs::state(pid) == Some('S')
                    && restored_fds(pid).expect("fd listing") == [0, 1, 2]
            };
            while !settled() {
                assert!(std::time::Instant::now() < end, "sleep keeps other fds open");
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            child
        }
    }

    impl Drop for Child {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    fn socket_file(id: u64) -> OpenFile {
        let kind = FileKind::InetSocket(InetSocket {
            family: libc::AF_INET,
            sock_type: libc::SOCK_STREAM,
            protocol: libc::IPPROTO_TCP,
            addr: vec![127, 0, 0, 1],
            port: 1,
            listen_backlog: None,
            peer: Some((vec![127, 0, 0, 1], 2)),
            options: Vec::new(),
            connection: None,
        });
        OpenFile { id, flags: libc::O_RDWR, pos: 0, kind, locks: Vec::new() }
    }

    /// An image of `sleep`: fd 0 a socket (file id 7), fds 1 and 2 /dev/null.
    fn image(pid: i32, fds: &[i32]) -> ProcessImage {
        let null = FileKind::CharDevice { path: "/dev/null".into(), rdev: 0 };
        let files = vec![
            socket_file(7),
            OpenFile { id: 8, flags: 0, pos: 0, kind: null, locks: Vec::new() },
        ];
        let fds = fds.iter().map(|&fd| FdSlot { fd, file: u32::from(fd != 0), cloexec: false });
        ProcessImage { pid, files, fds: fds.collect(), ..Default::default() }
    }

    fn findings_with(
        p: &ProcessImage,
        connections: &HashMap<u64, OwnedFd>,
        fd_flags: Option<&HashMap<i32, i64>>,
    ) -> Vec<Mismatch> {
        let mut found = Findings::default();
        compare(p, connections, fd_flags, &mut found).expect("compare");
        found.list.into_iter().filter(|m| m.attribute != "status flags").collect()
    }

    fn findings(p: &ProcessImage, connections: &HashMap<u64, OwnedFd>) -> Vec<Mismatch> {
        findings_with(p, connections, None)
    }

    /// F_GETFD as `sleep` would report it: no fd close-on-exec.
    fn plain_flags() -> HashMap<i32, i64> {
        HashMap::from([(0, 0), (1, 0), (2, 0)])
    }

    use super::super::Mismatch;

    #[test]
    fn a_rebuilt_connection_is_known_by_kcmp_and_anything_else_by_its_link() {
        let (a, _b) = UnixStream::pair().expect("socketpair");
        let ours = OwnedFd::from(a.try_clone().expect("dup"));
        let child = Child::with_stdin(OwnedFd::from(a));
        let pid = child.0.id() as i32;
        let connections = HashMap::from([(7u64, ours)]);
        let flags = plain_flags();
        assert_eq!(findings_with(&image(pid, &[0, 1, 2]), &connections, Some(&flags)), Vec::new());
        assert_eq!(findings(&image(pid, &[0, 1, 2]), &connections), Vec::new());
        // The close-on-exec bit is the one the process reported.
        let cloexec = HashMap::from([(0, libc::FD_CLOEXEC as i64), (1, 0), (2, 0)]);
        let found = findings_with(&image(pid, &[0, 1, 2]), &connections, Some(&cloexec));
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(
            (found[0].object.as_str(), found[0].attribute.as_str()),
            ("fd 0", "close-on-exec")
        );
        // The same kind of socket through a descriptor that is not the
        // connection's: its link is read, and it is a socket.
        let (other, _o) = UnixStream::pair().expect("socketpair");
        let elsewhere = HashMap::from([(7u64, OwnedFd::from(other))]);
        assert_eq!(findings_with(&image(pid, &[0, 1, 2]), &elsewhere, Some(&flags)), Vec::new());
    }

    #[test]
    fn a_pipe_where_the_connection_should_be_is_found() {
        let (r, _w) = std::io::pipe().expect("pipe");
        let child = Child::with_stdin(OwnedFd::from(r));
        let (a, _b) = UnixStream::pair().expect("socketpair");
        let connections = HashMap::from([(7u64, OwnedFd::from(a))]);
        let flags = plain_flags();
        for fd_flags in [None, Some(&flags)] {
            let found =
                findings_with(&image(child.0.id() as i32, &[0, 1, 2]), &connections, fd_flags);
            assert_eq!(found.len(), 1, "{found:?}");
            assert_eq!((found[0].object.as_str(), found[0].attribute.as_str()), ("fd 0", "file"));
            assert!(found[0].restored.starts_with("pipe:["), "{found:?}");
        }
    }

    #[test]
    fn a_connection_missing_from_the_table_is_named() {
        let (a, _b) = UnixStream::pair().expect("socketpair");
        let ours = OwnedFd::from(a.try_clone().expect("dup"));
        let child = Child::with_stdin(OwnedFd::from(a));
        let pid = child.0.id() as i32;
        let connections = HashMap::from([(7u64, ours)]);
        // The image has the connection at fd 5, where the process has none.
        let mut p = image(pid, &[5, 1, 2]);
        p.fds[0].file = 0;
        let flags = HashMap::from([(5, -(libc::EBADF as i64)), (1, 0), (2, 0)]);
        let found = findings_with(&p, &connections, Some(&flags));
        let table: Vec<_> = found.iter().filter(|m| m.object == "the fd table").collect();
        assert_eq!(table.len(), 1, "{found:?}");
        assert_eq!(table[0].restored, "([0], [5])");
    }

    #[test]
    fn an_extra_or_another_fd_is_named_whatever_the_count() {
        let (a, _b) = UnixStream::pair().expect("socketpair");
        let child = Child::with_stdin(OwnedFd::from(a));
        let pid = child.0.id() as i32;
        let table = |found: Vec<Mismatch>| {
            let t: Vec<_> = found.into_iter().filter(|m| m.object == "the fd table").collect();
            t.first().map(|m| m.restored.clone())
        };
        let none = HashMap::new();
        // One fd fewer in the image: the count differs.
        assert_eq!(table(findings(&image(pid, &[0, 1]), &none)), Some("([2], [])".into()));
        // As many fds, one of them another number: its fdinfo is missing.
        assert_eq!(table(findings(&image(pid, &[0, 1, 5]), &none)), Some("([2], [5])".into()));
        assert_eq!(table(findings(&image(pid, &[0, 1, 2]), &none)), None);
    }

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
