//! Phase "fd tables": once every process exists, each gets its file
//! descriptors: unix sockets that must be made by the process they name
//! (SO_PEERCRED), the staged files, the rebuilt connections, and epoll
//! registrations. Until then every process has only the descriptors it
//! inherited (staged ones, above temp_base).

use super::stage::in_netns;
use super::{files, Session};
use crate::error::{EngineError, Result};
use crate::inject;
use ferry_image::TreeImage;
use std::collections::{HashMap, HashSet};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

/// Where the staged descriptors are, as every process inherited them.
pub(super) struct StagedFds<'a> {
    pub raw: &'a HashMap<u64, RawFd>,
    pub temp_base: RawFd,
    pub netns: Option<RawFd>,
}

/// The tree's fd tables, every process's, and the unix messages in flight
/// that carry credentials (which name processes that exist only now).
pub(super) fn install_all(
    tree: &TreeImage,
    sessions: &mut [Session],
    staged_files: &mut HashMap<u64, OwnedFd>,
    fds: StagedFds,
    connections: &mut HashMap<u64, OwnedFd>,
    tty_to: &str,
) -> Result<()> {
    let StagedFds { raw, temp_base, netns } = fds;
    let root = sessions.first().map_or(0, |s| s.pid);
    let unix_late = files::unix_made_late(tree);
    if unix_late {
        let late =
            in_netns(root, netns, || files::make_unix_late(tree, sessions, tty_to, temp_base))?;
        for (id, fd) in late {
            let lent =
                fd.try_clone().map_err(|e| EngineError::io("duplicating a unix socket", e))?;
            connections.insert(id, lent);
            staged_files.insert(id, fd);
        }
    }
    let mut epolls = HashSet::new();
    for s in sessions.iter_mut() {
        // A child that shares its parent's table (CLONE_FILES) has it
        // from the parent's install.
        if !s.image.fidelity.shares_files_with_parent || s.pid == root {
            install_files(s, raw, connections, temp_base, &mut epolls, unix_late)?;
        }
    }
    // Every session and group exists now, and every process still holds
    // the staged descriptors.
    files::pty::take_terminals(tree, sessions, raw)?;
    files::send_unix_in_flight(tree, staged_files)
}

fn install_files(
    s: &mut Session,
    staged: &HashMap<u64, RawFd>,
    connections: &HashMap<u64, OwnedFd>,
    temp_base: RawFd,
    epolls: &mut HashSet<u64>,
    unix_late: bool,
) -> Result<()> {
    // An epoll entry whose fd number no longer names its file is
    // registered through a descriptor of that file in the process: a
    // file the process did not inherit (a connection, a unix socket of
    // `make_unix_late`) is lent to it above temp_base for that.
    let lent: Vec<(u64, RawFd)> = s
        .image
        .fidelity
        .epoll_targets
        .iter()
        .filter(|t| !staged.contains_key(&t.target))
        .filter_map(|t| connections.get(&t.target).map(|fd| (t.target, fd.as_raw_fd())))
        .collect();
    let mut with_lent;
    let mut targets = staged;
    if !lent.is_empty() {
        with_lent = staged.clone();
        for (id, fd) in lent {
            if let std::collections::hash_map::Entry::Vacant(e) = with_lent.entry(id) {
                e.insert(lend_above(s, fd, temp_base)?);
            }
        }
        targets = &with_lent;
    }
    let (calls, data) = files::epoll_target_calls(s.image, targets, s.data, epolls)?;
    if !calls.is_empty() {
        s.remote.write(s.data, &data)?;
        s.run(s.pid, &calls)?;
    }
    // The lent descriptors above temp_base go with the staging ones
    // (`finish_process`).
    let calls = files::install_calls(s.image, staged, temp_base, unix_late)?;
    s.run(s.pid, &calls)?;
    files::tcp::install(s, connections, temp_base)?;
    let (calls, data) = files::epoll_calls(s.image, s.data, epolls);
    for (chunk_calls, chunk_data) in calls.chunks(512).zip(data.chunks(512 * 12)) {
        s.remote.write(s.data, chunk_data)?;
        // Each chunk's structs start at s.data again.
        let first = chunk_calls[0].1.args[3];
        let rebased: Vec<(String, inject::Call)> = chunk_calls
            .iter()
            .map(|(n, c)| {
                let mut c = *c;
                c.args[3] = s.data + (c.args[3] - first);
                (n.clone(), c)
            })
            .collect();
        s.run(s.pid, &rebased)?;
    }
    Ok(())
}

/// Gives the process its own descriptor of ferry's `fd`, at or above
/// `temp_base` (close-on-exec); returns its number there.
fn lend_above(s: &mut Session, fd: RawFd, temp_base: RawFd) -> Result<RawFd> {
    let me = std::process::id() as u64;
    let pidfd = s.call("pidfd_open(ferry)", libc::SYS_pidfd_open, &[me, 0])?;
    let got = s.call(
        "pidfd_getfd(a file an epoll entry watches)",
        libc::SYS_pidfd_getfd,
        &[pidfd, fd as u64, 0],
    );
    s.call("close(pidfd of ferry)", libc::SYS_close, &[pidfd])?;
    let got = got?;
    let high = s.call(
        "fcntl(F_DUPFD_CLOEXEC, above temp_base)",
        libc::SYS_fcntl,
        &[got, libc::F_DUPFD_CLOEXEC as u64, temp_base as u64],
    );
    s.call("close(lent file)", libc::SYS_close, &[got])?;
    Ok(high? as RawFd)
}
