//! Carried descriptors ([`CaptureOptions::carry_files`](crate::capture::CaptureOptions::carry_files)):
//! for a restore on the same host while ferry holds on to the captured
//! files (`ferry replace`), the kinds below are not read and rebuilt but
//! duplicated (pidfd_getfd) and handed to the restore as the same kernel
//! objects. Nothing of them is read that reading changes (no queue
//! drained, no TCP repair, no network lock): the image records only
//! which file it is ([`ferry_image::CarriedFile`]), its status flags and
//! offset as fdinfo shows them, and the process's locks on it.
//!
//! Carried: sockets of every family (listeners with their accept queues,
//! connections with their queues), pipes and FIFOs, eventfd, timerfd,
//! signalfd, inotify, memfds no mapping of the tree maps (a mapping is
//! rebuilt from a new memfd, which the carried fd would not share), and
//! epoll instances whose every entry watches a carried file this process
//! holds under that very number (the kernel keys entries by file and
//! number; both stay) and none a signalfd: a signalfd's wakeups come
//! from the sighand of the process that registered it, which dies with
//! the old tree. Such an epoll is rebuilt as without carrying, and
//! registers the carried files in the new process.
//! Everything else (regular files, directories, devices, ptys, /proc
//! files) is captured and rebuilt as without carrying.

use super::{FdInfo, KeptDups};
use crate::error::Result;
use ferry_image::{CarriedFile, FileKind};
use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt};

/// The anon_inode kinds that carry as themselves.
const ANON: [&str; 4] = ["[eventfd]", "[timerfd]", "[signalfd]", "inotify"];

/// Whether a file of this link and type moves as itself, whatever its
/// neighbours (epoll and memfd need more: [`carriable`]).
pub(crate) fn plain_kind(link: &str, meta: &std::fs::Metadata) -> bool {
    link.starts_with("socket:")
        || link.starts_with("pipe:")
        || meta.file_type().is_fifo()
        || link.strip_prefix("anon_inode:").is_some_and(|k| ANON.contains(&k))
}

/// Whether fd `info.fd` is carried (see the module text).
fn carriable(info: &FdInfo) -> bool {
    let l = info.link.as_str();
    if plain_kind(l, &info.meta) {
        return true;
    }
    if l == "anon_inode:[eventpoll]" {
        return epoll_carriable(info);
    }
    l.starts_with("/memfd:") && !mapped_in_tree(info.tree, info.meta.ino())
}

/// Every entry of the epoll at `info.fd` watches a carried, non-signalfd
/// file that this process holds under the entry's number.
fn epoll_carriable(info: &FdInfo) -> bool {
    info.fdinfo.lines().filter(|l| l.starts_with("tfd:")).all(|line| {
        let Some(tfd) = line.split_whitespace().nth(1).and_then(|w| w.parse::<i32>().ok()) else {
            return false;
        };
        let path = format!("/proc/{}/fd/{tfd}", info.pid);
        let (Ok(link), Ok(meta)) = (crate::procfs::read_link(&path), std::fs::metadata(&path))
        else {
            return false;
        };
        link != "anon_inode:[signalfd]"
            && plain_kind(&link, &meta)
            && ferry_sys::fd::kcmp_epoll_target(info.pid, tfd, info.pid, info.fd, tfd)
                .unwrap_or(false)
    })
}

/// Whether a process of the tree maps the memfd of inode `ino`.
fn mapped_in_tree(tree: &[i32], ino: u64) -> bool {
    let ino = ino.to_string();
    tree.iter().any(|pid| {
        crate::procfs::read_string(&format!("/proc/{pid}/maps")).map_or(true, |maps| {
            maps.lines().any(|l| {
                let mut w = l.split_whitespace();
                w.nth(4) == Some(ino.as_str()) && w.next().is_some_and(|p| p.starts_with("/memfd:"))
            })
        })
    })
}

/// The duplicates in `kept` (by fd) of the fds whose file is carried,
/// moved out.
pub(crate) fn take_from(
    kept: &mut HashMap<i32, OwnedFd>,
    files: &[ferry_image::OpenFile],
    fds: &[ferry_image::FdSlot],
) -> HashMap<i32, OwnedFd> {
    fds.iter()
        .filter(|s| {
            files.get(s.file as usize).is_some_and(|f| matches!(f.kind, FileKind::Carried(_)))
        })
        .filter_map(|s| Some((s.fd, kept.remove(&s.fd)?)))
        .collect()
}

/// The carried kind of fd `info.fd`, with ferry's duplicate kept in
/// `dups`; None when it is not carried.
pub(super) fn capture(info: &FdInfo, dups: &KeptDups) -> Result<Option<FileKind>> {
    if !carriable(info) {
        return Ok(None);
    }
    let dup = info.dup()?;
    dups.push(info.fd, dup);
    Ok(Some(FileKind::Carried(CarriedFile {
        link: info.link.clone(),
        dev: info.meta.dev(),
        ino: info.meta.ino(),
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_kinds_are_sockets_pipes_fifos_and_the_stateful_anon_inodes() {
        let meta = std::fs::metadata("/etc/hostname").expect("a regular file");
        for l in ["socket:[12]", "pipe:[3]", "anon_inode:[eventfd]", "anon_inode:inotify"] {
            assert!(plain_kind(l, &meta), "{l}");
        }
        for l in ["/etc/hostname", "anon_inode:[eventpoll]", "anon_inode:[pidfd]", "/dev/pts/1"] {
            assert!(!plain_kind(l, &meta), "{l}");
        }
    }

    #[test]
    fn an_unmapped_memfd_is_not_mapped_and_a_mapped_one_is() {
        let me = std::process::id() as i32;
        let name = std::ffi::CString::new("carried-test").expect("name");
        let fd = ferry_sys::fd::memfd_create(&name, libc::MFD_CLOEXEC).expect("memfd");
        let file = std::fs::File::from(fd);
        file.set_len(4096).expect("size");
        let ino = file.metadata().expect("stat").ino();
        assert!(!mapped_in_tree(&[me], ino));
        let map = ferry_sys::process::MappedFile::map(&file, 0, 4096).expect("mmap");
        assert!(mapped_in_tree(&[me], ino));
        drop(map);
    }
}
