//! The owner and signal of an open file description, for signal-driven
//! I/O (F_SETOWN / F_SETOWN_EX / F_SETSIG with O_ASYNC): read with
//! F_GETOWN_EX and F_GETSIG on ferry's own duplicate, which shares the
//! description. An owner outside the checkpointed tree is refused: after
//! restore its PID could be anyone.

use crate::error::{EngineError, Result};
use ferry_image::{FdSlot, FileOwner, OpenFile};
use std::os::fd::{AsRawFd, OwnedFd};

const F_OWNER_TID: i32 = 0;
const F_GETSIG: i32 = 11;
const F_OWNER_PGRP: i32 = 2;

fn in_tree(tree: &[i32], owner_type: i32, id: i32) -> bool {
    match owner_type {
        F_OWNER_TID => {
            tree.iter().any(|p| std::path::Path::new(&format!("/proc/{p}/task/{id}")).exists())
        }
        F_OWNER_PGRP => tree
            .iter()
            .any(|&p| crate::procfs::Stat::read(p).is_ok_and(|s| s.field(5) as i32 == id)),
        _ => tree.contains(&id),
    }
}

/// (owner type, owner, signal) as F_GETOWN_EX and F_GETSIG read them.
pub type Raw = (i32, i32, i32);

/// The owner and signal of the description `dup` shares.
pub fn read_raw(dup: std::os::fd::RawFd) -> ferry_sys::SysResult<Raw> {
    let (owner_type, owner) = ferry_sys::fd::get_owner_ex(dup)?;
    let signal = ferry_sys::fd::fcntl_int(dup, F_GETSIG, 0, "fcntl(F_GETSIG)")?;
    Ok((owner_type, owner, signal))
}

/// The owner and signal of fd `fd` (file `f`) of the frozen process,
/// through the survey's duplicate where it kept one; None for an O_PATH
/// descriptor, which has none (fcntl says EBADF).
fn read_now(
    pid: i32,
    pidfd: &OwnedFd,
    kept: &std::collections::HashMap<i32, OwnedFd>,
    f: &OpenFile,
    fd: i32,
) -> Result<Option<Raw>> {
    let taken;
    let dup = match kept.get(&fd) {
        Some(d) => d.as_raw_fd(),
        None => {
            taken = ferry_sys::pidfd::pidfd_getfd(pidfd, fd)
                .map_err(|e| EngineError::kernel(pid, format!("duplicating fd {fd}"), e))?;
            taken.as_raw_fd()
        }
    };
    match read_raw(dup) {
        Ok(read) => Ok(Some(read)),
        Err(e) if e.errno == libc::EBADF && f.flags & libc::O_PATH != 0 => Ok(None),
        Err(e) => {
            Err(EngineError::kernel(pid, format!("fd {fd}: reading its owner and signal"), e))
        }
    }
}

/// Every file's owner and signal, refused when outside the tree. `early`
/// holds, by file index, those read before the freeze of connections the
/// survey took as described then ([`super::pre_describe`]).
pub fn capture(
    pid: i32,
    pidfd: &OwnedFd,
    files: &[OpenFile],
    slots: &[FdSlot],
    tree: &[i32],
    kept: &std::collections::HashMap<i32, OwnedFd>,
    early: &std::collections::HashMap<u32, Raw>,
) -> Result<Vec<FileOwner>> {
    // One lookup table and the worker threads: a server may hold 10,000
    // descriptors, and this runs while it is frozen.
    let first_fd = super::first_fd_of_each_file(slots);
    let todo: Vec<(usize, &OpenFile, i32)> = files
        .iter()
        .enumerate()
        .filter(|(_, f)| {
            !matches!(
                f.kind,
                ferry_image::FileKind::ExternalStdio { .. }
                    | ferry_image::FileKind::Terminal { .. }
            )
        })
        .filter_map(|(i, f)| Some((i, f, *first_fd.get(&(i as u32))?)))
        .collect();
    let found = crate::parallel::map(&todo, |&(i, f, fd)| {
        let read = match early.get(&(i as u32)) {
            Some(&read) => read,
            None => match read_now(pid, pidfd, kept, f, fd)? {
                Some(read) => read,
                None => return Ok(None),
            },
        };
        let (owner_type, owner, signal) = read;
        if owner == 0 && signal == 0 {
            return Ok(None);
        }
        if owner != 0 && matches!(f.kind, ferry_image::FileKind::Directory { .. }) {
            return Err(EngineError::unsupported(
                pid,
                format!("fd {fd}"),
                "a directory with an F_SETOWN owner, which fcntl(F_NOTIFY) sets: dnotify, whose watch the kernel does not show, is not restored",
            ));
        }
        if owner != 0 && !in_tree(tree, owner_type, owner) {
            let kind = ["thread", "process", "process group"]
                .get(owner_type as usize)
                .copied()
                .unwrap_or("owner");
            return Err(EngineError::unsupported(
                pid,
                format!("fd {fd}"),
                format!("its F_SETOWN owner ({kind} {owner}) is outside the checkpointed tree; after restore that id could belong to anyone"),
            ));
        }
        Ok(Some(FileOwner { file: i as u32, owner_type, owner, signal }))
    })?;
    Ok(found.into_iter().flatten().collect())
}

/// Mode and owner of every deleted file (or FIFO, or device node) restore
/// recreates.
pub fn deleted_attrs(
    pid: i32,
    files: &[OpenFile],
    slots: &[FdSlot],
) -> Result<Vec<ferry_image::InodeAttrs>> {
    use ferry_image::FileKind;
    use std::os::unix::fs::MetadataExt;
    let mut out = Vec::new();
    for (i, f) in files.iter().enumerate() {
        let deleted = match &f.kind {
            FileKind::Deleted { .. } => true,
            FileKind::Fifo { path, .. }
            | FileKind::CharDevice { path, .. }
            | FileKind::Directory { path } => path.ends_with(" (deleted)"),
            _ => false,
        };
        if !deleted {
            continue;
        }
        let Some(slot) = slots.iter().find(|s| s.file as usize == i) else {
            continue;
        };
        let path = format!("/proc/{pid}/fd/{}", slot.fd);
        let m = std::fs::metadata(&path).map_err(|e| EngineError::io(&path, e))?;
        out.push(ferry_image::InodeAttrs {
            of: ferry_image::InodeOf::File(i as u32),
            mode: m.mode() & 0o7777,
            uid: m.uid(),
            gid: m.gid(),
        });
    }
    Ok(out)
}
