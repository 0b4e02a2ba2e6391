//! epoll: every watched fd with its events and user data.

use super::FdInfo;
use crate::error::{EngineError, Result};
use ferry_image::{EpollEntry, EpollTarget, FdSlot, FileKind, OpenFile};
use std::collections::HashMap;

/// The bits epoll keeps when a one-shot entry fires: the entry waits for
/// nothing until EPOLL_CTL_MOD. Every add or modify also sets EPOLLERR
/// and EPOLLHUP, so an entry whose mask has only these bits has fired.
const EP_PRIVATE_BITS: u32 =
    (libc::EPOLLWAKEUP | libc::EPOLLONESHOT | libc::EPOLLET | libc::EPOLLEXCLUSIVE) as u32;

fn disarmed(events: u32) -> bool {
    events & !EP_PRIVATE_BITS == 0
}

pub fn capture(info: &FdInfo) -> Result<FileKind> {
    let mut entries = Vec::new();
    for line in info.fdinfo.lines().filter(|l| l.starts_with("tfd:")) {
        let mut words = line.split_whitespace();
        let mut get = |key: &str| {
            while let Some(w) = words.next() {
                if w == key {
                    return words.next().map(str::to_string);
                }
            }
            None
        };
        let fd = get("tfd:").and_then(|v| v.parse().ok());
        let events = get("events:").and_then(|v| u32::from_str_radix(&v, 16).ok());
        let data = get("data:").and_then(|v| u64::from_str_radix(&v, 16).ok());
        match (fd, events, data) {
            (Some(_), Some(events), Some(_)) if disarmed(events) => {
                return Err(info.unsupported(format!(
                    "epoll entry {line:?}: an EPOLLONESHOT entry that fired and was not armed again; adding it again would arm EPOLLERR and EPOLLHUP"
                )))
            }
            (Some(fd), Some(events), Some(data)) => entries.push(EpollEntry { fd, events, data }),
            _ => return Err(info.unsupported(format!("cannot parse epoll entry {line:?}"))),
        }
    }
    Ok(FileKind::Epoll { entries })
}

/// What the entries of epoll `epfd` of `pid` watch, by fd number: the
/// file's (device in the kernel's encoding, inode) as fdinfo prints them
/// (`read`: its fdinfo as the survey read it, else read now).
fn watched_inodes(pid: i32, epfd: i32, read: Option<&str>) -> HashMap<i32, Vec<(u64, u64)>> {
    let text = match read {
        Some(t) => t.to_string(),
        None => {
            crate::procfs::read_string(&format!("/proc/{pid}/fdinfo/{epfd}")).unwrap_or_default()
        }
    };
    let mut out: HashMap<i32, Vec<(u64, u64)>> = HashMap::new();
    for line in text.lines().filter(|l| l.starts_with("tfd:")) {
        let mut words = line.split_whitespace();
        let fd = words.nth(1).and_then(|w| w.parse().ok());
        let hex = |key: &str| {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(key))
                .and_then(|v| u64::from_str_radix(v, 16).ok())
        };
        if let (Some(fd), Some(ino), Some(dev)) = (fd, hex("ino:"), hex("sdev:")) {
            out.entry(fd).or_default().push((dev, ino));
        }
    }
    out
}

/// Whether the socket at `slot` is what the only entry for its fd
/// number watches. A socket's inode has one open file description, so
/// the same device and inode prove it without kcmp(KCMP_EPOLL_TFD), which
/// walks the whole epoll (10,000 entries, 10,000 walks).
fn same_socket(
    watched: &HashMap<i32, Vec<(u64, u64)>>,
    fd: i32,
    file: &OpenFile,
    inode: Option<&(u64, u64)>,
) -> bool {
    if !matches!(file.kind, FileKind::InetSocket(_) | FileKind::UnixSocket(_)) {
        return false;
    }
    let (Some([(dev, ino)]), Some(&(st_dev, st_ino))) =
        (watched.get(&fd).map(Vec::as_slice), inode)
    else {
        return false;
    };
    let kernel_dev = (libc::major(st_dev) as u64) << 20 | libc::minor(st_dev) as u64;
    *ino == st_ino && *dev == kernel_dev
}

/// The kernel keys an epoll entry by file and fd number, and keeps it
/// when that fd number is closed (or reused for another file) as long as
/// the file lives on elsewhere. For every entry whose fd number does not
/// (or no longer) name the watched file in the epoll's holder, the file
/// is looked up among every fd of the tree with kcmp(KCMP_EPOLL_TFD) and
/// recorded as a target by open file description id; restore registers
/// it under the old number. A file no process of the tree holds is
/// refused. Returns the targets of each process, in `procs` order.
/// `inodes`: (dev, ino) of each process's files, by file index.
pub fn resolve_targets(
    procs: &[(i32, &[OpenFile], &[FdSlot])],
    inodes: &[&[(u64, u64)]],
    fdinfos: &[&HashMap<i32, String>],
) -> Result<Vec<Vec<EpollTarget>>> {
    let mut out = Vec::with_capacity(procs.len());
    for (p, &(pid, files, slots)) in procs.iter().enumerate() {
        // By number: an epoll of a server can watch 10,000 fds.
        let open: HashMap<i32, u32> = slots.iter().map(|s| (s.fd, s.file)).collect();
        let inodes_here = inodes.get(p).copied().unwrap_or_default();
        let mut targets = Vec::new();
        for (i, f) in files.iter().enumerate() {
            let FileKind::Epoll { entries } = &f.kind else {
                continue;
            };
            let Some(epfd) = slots.iter().find(|s| s.file as usize == i).map(|s| s.fd) else {
                continue;
            };
            let read = fdinfos.get(p).and_then(|f| f.get(&epfd)).map(String::as_str);
            let watched = watched_inodes(pid, epfd, read);
            for e in entries {
                let same = |q: i32, fd: i32| {
                    ferry_sys::fd::kcmp_epoll_target(q, fd, pid, epfd, e.fd).unwrap_or(false)
                };
                if let Some(&file) = open.get(&e.fd) {
                    let held = &files[file as usize];
                    if same_socket(&watched, e.fd, held, inodes_here.get(file as usize))
                        || same(pid, e.fd)
                    {
                        continue;
                    }
                }
                let found = procs.iter().find_map(|&(q, qfiles, qslots)| {
                    qslots.iter().find(|s| same(q, s.fd)).map(|s| qfiles[s.file as usize].id)
                });
                match found {
                    Some(target) => targets.push(EpollTarget { epoll_file: i as u32, fd: e.fd, target }),
                    None => {
                        return Err(EngineError::unsupported(
                            pid,
                            format!("epoll fd {epfd}, entry for fd {}", e.fd),
                            "that fd number was closed and no process of the tree holds the watched file any more",
                        ))
                    }
                }
            }
        }
        out.push(targets);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::MetadataExt;

    fn socket_file() -> OpenFile {
        OpenFile {
            id: 1,
            flags: 0,
            pos: 0,
            kind: FileKind::InetSocket(ferry_image::InetSocket {
                family: libc::AF_INET,
                sock_type: libc::SOCK_STREAM,
                protocol: libc::IPPROTO_TCP,
                addr: vec![127, 0, 0, 1],
                port: 1,
                listen_backlog: Some(1),
                peer: None,
                options: Vec::new(),
                connection: None,
            }),
            locks: Vec::new(),
        }
    }

    #[test]
    fn a_fired_oneshot_entry_is_told_from_armed_ones() {
        assert!(disarmed(libc::EPOLLONESHOT as u32));
        assert!(disarmed((libc::EPOLLONESHOT | libc::EPOLLET) as u32));
        assert!(!disarmed((libc::EPOLLONESHOT | libc::EPOLLERR | libc::EPOLLHUP) as u32));
        assert!(!disarmed((libc::EPOLLIN | libc::EPOLLERR | libc::EPOLLHUP) as u32));
    }

    #[test]
    fn only_the_one_socket_an_entry_names_by_device_and_inode_skips_kcmp() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let fd = l.as_raw_fd();
        let m = std::fs::metadata(format!("/proc/self/fd/{fd}")).expect("stat");
        let inode = (m.dev(), m.ino());
        let kernel_dev = (libc::major(m.dev()) as u64) << 20 | libc::minor(m.dev()) as u64;
        let file = socket_file();
        let watched: HashMap<i32, Vec<(u64, u64)>> = [(fd, vec![(kernel_dev, m.ino())])].into();
        assert!(same_socket(&watched, fd, &file, Some(&inode)));
        // Another inode, another device, two entries for the number, no
        // entry, or not a socket: kcmp decides.
        let other: HashMap<_, _> = [(fd, vec![(kernel_dev, m.ino() + 1)])].into();
        assert!(!same_socket(&other, fd, &file, Some(&inode)));
        let other: HashMap<_, _> = [(fd, vec![(kernel_dev + 1, m.ino())])].into();
        assert!(!same_socket(&other, fd, &file, Some(&inode)));
        let two: HashMap<_, _> = [(fd, vec![(kernel_dev, m.ino()), (kernel_dev, m.ino())])].into();
        assert!(!same_socket(&two, fd, &file, Some(&inode)));
        assert!(!same_socket(&HashMap::new(), fd, &file, Some(&inode)));
        let dir = OpenFile { kind: FileKind::Directory { path: "/".into() }, ..socket_file() };
        assert!(!same_socket(&watched, fd, &dir, Some(&inode)));
        assert!(!same_socket(&watched, fd, &file, None));
    }

    #[test]
    fn the_kernel_names_a_watched_socket_as_its_stat_does() {
        use std::os::fd::AsFd;
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let ep = ferry_sys::epoll::create(libc::EPOLL_CLOEXEC).expect("epoll");
        ferry_sys::epoll::add(ep.as_fd(), l.as_fd(), libc::EPOLLIN as u32, 7).expect("add");
        let watched = watched_inodes(std::process::id() as i32, ep.as_raw_fd(), None);
        let fd = l.as_raw_fd();
        let m = std::fs::metadata(format!("/proc/self/fd/{fd}")).expect("stat");
        assert!(
            same_socket(&watched, fd, &socket_file(), Some(&(m.dev(), m.ino()))),
            "entries {watched:?} do not name the socket's device {:#x} and inode {}",
            m.dev(),
            m.ino()
        );
    }
}
