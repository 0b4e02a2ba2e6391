//! Open files a process outside the tree holds too: the same pipe or
//! socket (an end inherited and kept by a parent that stays), the same
//! FIFO or memfd, or the same open file description (one offset and one
//! set of flags, e.g. a file the parent opened before the fork). A tree
//! restored (or migrated) without that process would get its own copy:
//! the two would silently stop sharing it. Refused by name.
//!
//! Not refused: character devices (no offset or content to share;
//! terminals are replaced at restore anyway), a regular file opened
//! write-only with O_APPEND (every write goes to the end, so the offset
//! is not shared state), distinct opens of one regular file (they share
//! only the file, which a restore opens again), and with
//! `--external-stdio` whatever fds 0-2 hold (the user declares them the
//! outside world's: pipes and sockets are replaced at restore, a log
//! file is opened again at its offset, which is no longer shared).
//!
//! Nor, when the capture carries files (`CaptureOptions::carry_files`),
//! sockets, pipes, FIFOs, eventfds, timerfds, signalfds and inotify
//! instances: the new tree gets the very same objects, still shared.
//!
//! Scanned before the freeze, like [`super::outside`]; the frozen survey
//! scans again only for files the tree opened since.

use super::survey::Presurvey;
use super::tree::running_tree;
use crate::error::{EngineError, Result};
use crate::procfs;
use std::collections::{HashMap, HashSet};
use std::os::unix::fs::{FileTypeExt, MetadataExt};

/// One fd of the tree that an outside process could share.
struct Held {
    pid: i32,
    fd: i32,
    dev: u64,
    ino: u64,
    /// A FIFO or memfd: any fd on the same inode shares its content.
    object: bool,
    /// Write-only with O_APPEND: its offset is not shared state.
    append_only: bool,
}

/// The tree's files, by the link /proc/PID/fd shows for them.
type ByLink = HashMap<String, Vec<Held>>;

/// A process's fds, each with the (dev, ino) of its file.
pub(super) type FdInodes = (i32, Vec<(i32, (u64, u64))>);

/// The files the tree held when it was checked, by (dev, ino).
#[derive(Default)]
pub(super) struct CheckedFiles {
    objects: HashSet<(u64, u64)>,
}

/// Whether an fd of the tree with this link and metadata can be shared
/// in a way that matters (see the module comment).
fn shareable(fd: i32, link: &str, meta: &std::fs::Metadata, scope: Scope) -> bool {
    let declared_outside = scope.external_stdio && fd <= 2;
    let carried = scope.carry && super::files::carried::plain_kind(link, meta);
    !declared_outside && !carried && !meta.file_type().is_char_device()
}

/// What the caller declared: fds 0-2 the outside world's
/// (`--external-stdio`), files carried over ([`super::CaptureOptions::carry_files`]).
#[derive(Clone, Copy)]
pub(super) struct Scope {
    pub external_stdio: bool,
    pub carry: bool,
}

fn held(pid: i32, fd: i32, link: &str, meta: &std::fs::Metadata) -> Held {
    // Only a regular file's flags matter: not read for 10,000 sockets.
    let flags = if meta.is_file() {
        procfs::read_string(&format!("/proc/{pid}/fdinfo/{fd}"))
            .ok()
            .and_then(|t| {
                t.lines().find_map(|l| l.strip_prefix("flags:").and_then(procfs::parse_octal))
            })
            .unwrap_or(0) as i32
    } else {
        0
    };
    Held {
        pid,
        fd,
        dev: meta.dev(),
        ino: meta.ino(),
        object: meta.file_type().is_fifo() || link.starts_with("/memfd:"),
        append_only: meta.is_file()
            && flags & libc::O_ACCMODE == libc::O_WRONLY
            && flags & libc::O_APPEND != 0,
    }
}

/// The tree's shareable fds of `pid` (all, or only `only`), with the
/// sockets' links and metadata taken from `pre` where it listed them.
fn tree_fds(pid: i32, pre: &Presurvey, only: Option<&[i32]>, scope: Scope, out: &mut ByLink) {
    let dir = format!("/proc/{pid}/fd");
    let fds: Vec<i32> = match only {
        Some(fds) => fds.to_vec(),
        // Listed without a dentry per fd under /proc/PID/fd.
        None => super::files::fd_numbers(pid, &dir).unwrap_or_default(),
    };
    let listed = pre.get(&pid);
    for fd in fds {
        let (link, meta) = match listed.and_then(|l| l.listed(fd)) {
            Some((l, m)) => (l.clone(), m.clone()),
            None => {
                // An fd closed meanwhile is shared with nobody.
                let Ok(link) = procfs::read_link(&format!("{dir}/{fd}")) else { continue };
                let Ok(meta) = std::fs::metadata(format!("{dir}/{fd}")) else { continue };
                (link, meta)
            }
        };
        if shareable(fd, &link, &meta, scope) {
            let h = held(pid, fd, &link, &meta);
            out.entry(link).or_default().push(h);
        }
    }
}

/// Before the freeze: no process outside the tree holds one of the
/// tree's files in a way restore cannot give it back.
pub(super) fn check(root: i32, pre: &Presurvey, scope: Scope) -> Result<CheckedFiles> {
    let tree = running_tree(root);
    let mut by_link = ByLink::new();
    for &pid in &tree {
        tree_fds(pid, pre, None, scope, &mut by_link);
    }
    refuse_outside_holders(&tree, &by_link)?;
    let objects = by_link.values().flatten().map(|h| (h.dev, h.ino)).collect();
    Ok(CheckedFiles { objects })
}

impl CheckedFiles {
    /// In the freeze: the fds whose files were not there at [`check`]
    /// (each process's fds with their (dev, ino)) are checked the same
    /// way; nothing is scanned when there are none.
    pub fn recheck(&self, procs: &[FdInodes], scope: Scope) -> Result<()> {
        let mut by_link = ByLink::new();
        let none = Presurvey::new();
        for (pid, fds) in procs {
            let new: Vec<i32> =
                fds.iter().filter(|(_, id)| !self.objects.contains(id)).map(|f| f.0).collect();
            if !new.is_empty() {
                tree_fds(*pid, &none, Some(&new), scope, &mut by_link);
            }
        }
        if by_link.is_empty() {
            return Ok(());
        }
        let tree: Vec<i32> = procs.iter().map(|p| p.0).collect();
        refuse_outside_holders(&tree, &by_link)
    }
}

/// What process `pid`'s fd `fd` (showing `link`) shares with the tree's
/// `holders` of that link, if anything.
fn shared_with<'h>(
    pid: i32,
    fd: i32,
    link: &str,
    holders: &'h [Held],
) -> Option<(&'h Held, &'static str)> {
    if link.starts_with("pipe:") {
        return holders.first().map(|h| (h, "the same pipe"));
    }
    if link.starts_with("socket:") {
        return holders.first().map(|h| (h, "the same socket"));
    }
    let same_description =
        |h: &Held| ferry_sys::fd::kcmp_same_file(pid, h.pid, fd, h.fd).unwrap_or(false);
    if link.starts_with("anon_inode:") {
        return holders
            .iter()
            .find(|h| same_description(h))
            .map(|h| (h, "the same open file description"));
    }
    let meta = std::fs::metadata(format!("/proc/{pid}/fd/{fd}")).ok()?;
    let same: Vec<&Held> =
        holders.iter().filter(|h| (h.dev, h.ino) == (meta.dev(), meta.ino())).collect();
    if let Some(h) = same.iter().find(|h| h.object) {
        return Some((h, "the same object, whose content lives only while it is held"));
    }
    same.into_iter()
        .find(|h| !h.append_only && same_description(h))
        .map(|h| (h, "the same open file description, with its offset and flags (a log both write to is shared safely when opened write-only with O_APPEND)"))
}

/// Whether process `pid` stops holding `link` at `fd` within 60 ms: a
/// process forked by another program holds all of that program's
/// descriptors until its exec closes them (a supervisor starting a
/// job, a test harness spawning beside the tree), which is no sharing.
fn lets_go(pid: i32, fd: i32, link: &str) -> bool {
    for _ in 0..3 {
        std::thread::sleep(std::time::Duration::from_millis(20));
        if procfs::read_link(&format!("/proc/{pid}/fd/{fd}")).ok().as_deref() != Some(link) {
            return true;
        }
    }
    false
}

fn refuse_outside_holders(tree: &[i32], by_link: &ByLink) -> Result<()> {
    if by_link.is_empty() {
        return Ok(());
    }
    let me = std::process::id() as i32;
    let Some(outside) = candidates(tree, me, by_link).or_else(|| every_outside_fd(tree, me)) else {
        return Ok(());
    };
    // Their links read on the worker threads.
    let links = crate::parallel::map(&outside, |&(pid, fd)| {
        let link = procfs::read_link(&format!("/proc/{pid}/fd/{fd}")).ok();
        Ok(link.filter(|l| by_link.contains_key(l)))
    })?;
    for (&(pid, fd), link) in outside.iter().zip(links) {
        let Some(link) = link else { continue };
        let Some(holders) = by_link.get(&link) else { continue };
        let Some((h, what)) = shared_with(pid, fd, &link, holders) else { continue };
        // A child forked by the tree since it was listed is the tree's.
        if super::tree::descends_from(pid, tree) || lets_go(pid, fd, &link) {
            continue;
        }
        let comm = procfs::read_string(&format!("/proc/{pid}/comm")).unwrap_or_default();
        return Err(EngineError::unsupported(
            h.pid,
            format!("fd {} ({link})", h.fd),
            format!(
                "process {pid} ({}), outside the tree, holds {what} (its fd {fd}): a restored copy would no longer share it (take the tree from a process that holds every user of it)",
                comm.trim()
            ),
        ));
    }
    Ok(())
}

/// Every fd of every process outside the tree (a local client can hold
/// 10,000), from /proc; None if /proc cannot be listed.
fn every_outside_fd(tree: &[i32], me: i32) -> Option<Vec<(i32, i32)>> {
    let dir = std::fs::read_dir("/proc").ok()?;
    let mut outside = Vec::new();
    for pid in dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok()) {
        if pid == me || tree.contains(&pid) {
            continue;
        }
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else { continue };
        let fds = fds.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok());
        outside.extend(fds.map(|fd| (pid, fd)));
    }
    Some(outside)
}

/// The fds outside the tree that can share one of the held files, from
/// every fd table of the host read in one pass by a BPF iterator
/// ([`ferry_sys::host_files`]): an fd of the same open file description
/// as a held fd, or of the same inode as a held pipe or socket (pipefs
/// and sockfs number their inodes as /proc shows them). Every fd that
/// [`shared_with`] finds sharing is one of them, and they are checked
/// the same way. None (every fd read from /proc) when the iterator
/// cannot run, when ferry is not in the initial PID namespace (the
/// iterator names processes by their PIDs there), when it did not
/// report every held fd (a held fd closed meanwhile, a thread group
/// whose leader exited), or when a held file
/// is an object other than a pipe (a FIFO or memfd: another open of it
/// shares it, found by the (dev, ino) stat shows).
fn candidates(tree: &[i32], me: i32, by_link: &ByLink) -> Option<Vec<(i32, i32)>> {
    let objects = by_link.iter().filter(|(link, _)| !link.starts_with("pipe:"));
    if objects.flat_map(|(_, holders)| holders).any(|h| h.object) || !in_initial_pid_ns() {
        return None;
    }
    let all = match crate::capture::host_fds::program()?.read() {
        Ok(all) => all,
        Err(e) => {
            tracing::debug!("the host's fds read from /proc: {e}");
            return None;
        }
    };
    let held: HashSet<(i32, i32)> = by_link.values().flatten().map(|h| (h.pid, h.fd)).collect();
    let of_held: Vec<_> = all.iter().filter(|f| held.contains(&(f.pid, f.fd))).collect();
    if of_held.len() < held.len() {
        tracing::debug!("the host's fds read from /proc: the iterator did not report a held fd");
        return None;
    }
    let descriptions: HashSet<u64> = of_held.iter().map(|f| f.file).collect();
    let inodes: HashSet<u64> = by_link
        .iter()
        .filter(|(link, _)| link.starts_with("pipe:") || link.starts_with("socket:"))
        .flat_map(|(_, holders)| holders.iter().map(|h| h.ino))
        .collect();
    let outside = all.iter().filter(|f| f.pid != me && !tree.contains(&f.pid));
    Some(
        outside
            .filter(|f| descriptions.contains(&f.file) || inodes.contains(&f.ino))
            .map(|f| (f.pid, f.fd))
            .collect(),
    )
}

/// Whether ferry runs in the initial PID namespace (its fixed inode
/// number, PROC_PID_INIT_INO).
fn in_initial_pid_ns() -> bool {
    std::fs::metadata("/proc/self/ns/pid").is_ok_and(|m| m.ino() == 0xEFFF_FFFC)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    fn holder_of(f: &std::fs::File) -> (String, Held) {
        let me = std::process::id() as i32;
        let fd = f.as_raw_fd();
        let link = procfs::read_link(&format!("/proc/self/fd/{fd}")).expect("link");
        let meta = f.metadata().expect("metadata");
        let h = held(me, fd, &link, &meta);
        (link, h)
    }

    /// The fds the BPF iterator picks as candidates, with a `sleep` as
    /// the tree: this process's fd of the same description as the
    /// sleep's file, and the other end of its pipe, are; another open
    /// of the same file is not.
    #[test]
    fn the_iterator_picks_the_same_description_and_the_same_pipe_and_not_another_open() {
        if crate::capture::host_fds::program().is_none() || !in_initial_pid_ns() {
            eprintln!("no BPF task_file iterator here: the host's fds are read from /proc");
            return;
        }
        let dir = std::env::temp_dir().join(format!("ferry-candidates-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let f = std::fs::File::create(dir.join("f")).expect("create");
        let other = std::fs::File::open(dir.join("f")).expect("open again");
        let (r, w) = ferry_sys::fd::pipe2(0).expect("pipe");
        let mut cmd = std::process::Command::new("sleep");
        cmd.arg("30").stdin(std::fs::File::from(r)).stdout(f.try_clone().expect("dup"));
        let mut child = cmd.spawn().expect("sleep");
        let pid = child.id() as i32;
        let mut by_link = ByLink::new();
        let scope = Scope { external_stdio: false, carry: false };
        tree_fds(pid, &Presurvey::new(), Some(&[0, 1]), scope, &mut by_link);
        let found = candidates(&[pid], 0, &by_link);
        let _ = child.kill();
        let _ = child.wait();
        let _ = std::fs::remove_dir_all(&dir);
        let me = std::process::id() as i32;
        let found = found.expect("candidates");
        assert!(found.contains(&(me, f.as_raw_fd())), "the same description: {found:?}");
        assert!(found.contains(&(me, w.as_raw_fd())), "the same pipe: {found:?}");
        assert!(!found.contains(&(me, other.as_raw_fd())), "another open: {found:?}");
    }

    /// One description (a dup, as a fork gives), another open of the
    /// same file, and a log opened write-only with O_APPEND: only the
    /// first is shared in a way restore cannot give back.
    #[test]
    fn the_same_description_is_shared_another_open_or_an_appended_log_is_not() {
        let dir = std::env::temp_dir().join(format!("ferry-outside-files-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("f");
        let me = std::process::id() as i32;
        let f = std::fs::File::create(&path).expect("create");
        let (link, h) = holder_of(&f);
        let dup = f.try_clone().expect("dup");
        let other = std::fs::File::open(&path).expect("open again");
        let holders = [h];
        let same = shared_with(me, dup.as_raw_fd(), &link, &holders);
        assert!(same.is_some_and(|(_, what)| what.contains("offset")));
        assert!(shared_with(me, other.as_raw_fd(), &link, &holders).is_none());

        let log = std::fs::OpenOptions::new().append(true).open(&path).expect("append");
        let (link, h) = holder_of(&log);
        assert!(h.append_only);
        let log_dup = log.try_clone().expect("dup");
        assert!(shared_with(me, log_dup.as_raw_fd(), &link, &[h]).is_none());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
