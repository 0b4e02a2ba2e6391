//! The fd tables of `catalog::fds` applied to one descriptor: every line
//! of its fdinfo, its open flags, its anon_inode kind and the mount it is
//! on must be ones ferry restores; anything else is refused by name,
//! also what the tables do not know yet.

use super::FdInfo;
use crate::catalog::{fds, Handling, Table};
use crate::error::{EngineError, Result};
use std::collections::HashSet;
use std::sync::OnceLock;

/// The refusal for `name` of `table`, None when it is restored or n/a.
fn refusal(info: &FdInfo, table: &Table, what: &str, name: &str) -> Option<EngineError> {
    match table.get(name) {
        None => Some(info.unsupported(format!(
            "{what} {name} is unknown to ferry; refused until ferry learns what it means"
        ))),
        Some(e) if e.handling == Handling::Refused => {
            Some(info.unsupported(format!("{what} {name}: {}", e.how)))
        }
        Some(_) => None,
    }
}

/// Every line of the fd's fdinfo is one ferry knows and does not refuse.
pub fn check_fdinfo_lines(info: &FdInfo) -> Result<()> {
    for key in info.fdinfo.lines().filter_map(fds::fdinfo_key) {
        if let Some(e) = refusal(info, &fds::FDINFO_LINES, "fdinfo line", key) {
            return Err(e);
        }
    }
    Ok(())
}

/// An anon_inode kind ferry restores (Ok), or its refusal.
pub fn check_anon_kind(info: &FdInfo, kind: &str) -> Result<()> {
    match refusal(info, &fds::ANON_INODES, "anon_inode kind", fds::anon_kind_name(kind)) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// The refusal for an fd whose file type capture does not take.
pub fn refuse_file_type(info: &FdInfo) -> EngineError {
    use std::os::unix::fs::MetadataExt;
    let name = match info.meta.mode() & libc::S_IFMT {
        libc::S_IFBLK => "S_IFBLK".to_string(),
        libc::S_IFLNK => "S_IFLNK".to_string(),
        other => format!("{other:#o}"),
    };
    refusal(info, &fds::FILE_TYPES, "file type", &name)
        .unwrap_or_else(|| info.unsupported(format!("file type {name} is not supported here")))
}

/// Every bit of the description's status flags (fdinfo's, O_CLOEXEC
/// left out: it is the fd's) is one ferry restores; `by_path`: restore
/// opens the file again (open() sets every bit), otherwise only what
/// F_SETFL sets can be given back.
pub fn check_open_flags(info: &FdInfo, flags: i32, by_path: bool) -> Result<()> {
    let mut left = flags & !libc::O_CLOEXEC & !libc::O_ACCMODE;
    for &(name, bit) in fds::OPEN_FLAG_BITS {
        if bit == libc::O_ACCMODE || left & bit == 0 {
            continue;
        }
        left &= !bit;
        if let Some(e) = refusal(info, &fds::OPEN_FLAGS, "open flag", name) {
            return Err(e);
        }
        let setfl_only = bit == libc::O_DSYNC || bit == 0o4000000;
        if setfl_only && !by_path {
            return Err(info.unsupported(format!(
                "open flag {name}: only open() sets it, and restore makes this kind of file without open()"
            )));
        }
    }
    if left != 0 {
        return Err(info.unsupported(format!(
            "open flag bits {left:#o} are unknown to ferry; refused until ferry learns what they mean"
        )));
    }
    Ok(())
}

/// The mounts of one process (their ids, from /proc/PID/mountinfo), read
/// once, when its first file opened by path is met.
pub struct Mounts {
    pid: i32,
    ids: OnceLock<std::result::Result<HashSet<u64>, String>>,
}

impl Mounts {
    pub fn new(pid: i32) -> Mounts {
        Mounts { pid, ids: OnceLock::new() }
    }

    fn contains(&self, id: u64) -> Result<bool> {
        let ids = self.ids.get_or_init(|| {
            let path = format!("/proc/{}/mountinfo", self.pid);
            std::fs::read_to_string(&path)
                .map(|t| t.lines().filter_map(|l| l.split(' ').next()?.parse().ok()).collect())
                .map_err(|e| format!("{path}: {e}"))
        });
        match ids {
            Ok(ids) => Ok(ids.contains(&id)),
            Err(e) => Err(EngineError::restore(self.pid, format!("reading {e}"))),
        }
    }
}

/// statfs magic numbers of the filesystems `fds::FD_MOUNTS` names.
const MQUEUE_MAGIC: i64 = 0x1980_0202;
const SECRETMEM_MAGIC: i64 = 0x5345_434d;
const NSFS_MAGIC: i64 = 0x6e73_6673;

/// A file opened by path must be on a mount of the process (its path
/// then reaches it), or its path from ferry must reach the same inode;
/// the special filesystems no path reaches are refused by name.
pub fn check_mount(info: &FdInfo) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let Some(mnt) = info.field("mnt_id").and_then(|v| v.parse::<u64>().ok()) else {
        return Err(info.unsupported("fdinfo has no mnt_id"));
    };
    if info.mounts.contains(mnt)? {
        return Ok(());
    }
    let proc_path =
        std::ffi::CString::new(format!("/proc/{}/fd/{}", info.pid, info.fd)).unwrap_or_default();
    let magic = ferry_sys::fd::statfs_magic(&proc_path)
        .map_err(|e| EngineError::kernel(info.pid, format!("fd {}: statfs", info.fd), e))?;
    let table_name = match magic {
        MQUEUE_MAGIC => Some("mqueue"),
        SECRETMEM_MAGIC => Some("secretmem"),
        NSFS_MAGIC => Some("nsfs"),
        // Opened again by its process (restore/files/proc_file.rs), in
        // its root, which does not reach this mount.
        _ if info.link.starts_with("/proc/") => Some("proc outside the root"),
        _ => None,
    };
    if let Some(name) = table_name {
        return Err(refusal(info, &fds::FD_MOUNTS, "a file on", name)
            .unwrap_or_else(|| info.unsupported(name.to_string())));
    }
    // Deleted files are made again from their content, not reopened.
    if info.link.ends_with(" (deleted)") {
        return Ok(());
    }
    let same = std::fs::metadata(&info.link)
        .is_ok_and(|m| (m.dev(), m.ino()) == (info.meta.dev(), info.meta.ino()));
    if same {
        return Ok(());
    }
    Err(refusal(info, &fds::FD_MOUNTS, "a file on", "a detached or unreachable mount")
        .unwrap_or_else(|| info.unsupported("a file no path reaches")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_magic_numbers_are_the_kernels() {
        // include/uapi/linux/magic.h
        assert_eq!(MQUEUE_MAGIC, 0x19800202);
        assert_eq!(SECRETMEM_MAGIC, i64::from_be_bytes(*b"\0\0\0\0SECM"));
        assert_eq!(NSFS_MAGIC, i64::from_be_bytes(*b"\0\0\0\0nsfs"));
    }
}
