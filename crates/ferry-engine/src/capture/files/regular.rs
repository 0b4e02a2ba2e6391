//! Regular files (also deleted-while-open ones, whose content is kept),
//! and character devices: the harmless ones by path, terminals flagged so
//! restore can replace them.

use super::FdInfo;
use crate::error::{EngineError, Result};
use crate::plain_devices::{is_plain_device, PLAIN_DEVICES};
use ferry_image::FileKind;
use std::os::unix::fs::{FileExt, MetadataExt};

/// Deleted files larger than this are refused rather than copied.
const MAX_DELETED_CONTENT: u64 = 1 << 30;

pub fn capture_file(info: &FdInfo) -> Result<FileKind> {
    let link = info.link.as_str();
    if link.starts_with("/memfd:") {
        return Ok(FileKind::Memfd { id: info.meta.ino() });
    }
    if let Some(path) = link.strip_suffix(" (deleted)") {
        let size = info.meta.len();
        if size > MAX_DELETED_CONTENT {
            return Err(info.unsupported(format!(
                "deleted file of {size} bytes is too large to copy into the image"
            )));
        }
        // A write-only descriptor cannot be read: open the file again for
        // reading through /proc (that works for a deleted file too).
        let write_only = info
            .field("flags")
            .and_then(|f| u32::from_str_radix(f, 8).ok())
            .is_some_and(|f| f & libc::O_ACCMODE as u32 == libc::O_WRONLY as u32);
        let file = if write_only {
            let proc_path = format!("/proc/{}/fd/{}", info.pid, info.fd);
            std::fs::File::open(&proc_path).map_err(|e| {
                EngineError::io(
                    format!(
                        "fd {} ({link}): opening {proc_path} to read the deleted file",
                        info.fd
                    ),
                    e,
                )
            })?
        } else {
            std::fs::File::from(info.dup()?)
        };
        let mut content = vec![0u8; size as usize];
        file.read_exact_at(&mut content, 0)
            .map_err(|e| EngineError::io(format!("fd {} ({link})", info.fd), e))?;
        return Ok(FileKind::Deleted {
            path: path.to_string(),
            mode: info.meta.mode() & 0o7777,
            content,
        });
    }
    if let Some(pid) = proc_pid_of(link) {
        if info.tree.contains(&pid) {
            return Ok(FileKind::ProcFile { path: link.to_string() });
        }
        return Err(info.unsupported(format!(
            "a /proc file of process {pid}, outside the tree; after restore that PID could be anyone"
        )));
    }
    Ok(FileKind::Regular { path: link.to_string(), size: info.meta.len() })
}

/// "/proc/123/stat" -> 123 (also /proc/123/task/...).
fn proc_pid_of(link: &str) -> Option<i32> {
    let rest = link.strip_prefix("/proc/")?;
    rest.split('/').next()?.parse().ok()
}

/// Whether the fd is a terminal (ioctl(TCGETS) succeeds, as isatty asks).
fn is_terminal(info: &FdInfo) -> Result<bool> {
    use std::io::IsTerminal;
    Ok(info.dup()?.is_terminal())
}

pub fn capture_char_device(info: &FdInfo) -> Result<FileKind> {
    if is_terminal(info)? {
        return Ok(FileKind::Terminal { path: info.link.clone() });
    }
    if PLAIN_DEVICES.contains(&info.link.as_str()) {
        return Ok(FileKind::CharDevice { path: info.link.clone(), rdev: info.meta.rdev() });
    }
    // A node of one of those devices made elsewhere with mknod and unlinked
    // while open (zdtm deleted_dev): restore makes a node again under the
    // old name, opens it and unlinks it; its mode and owner go with the
    // deleted files' (owner::deleted_attrs).
    if info.link.ends_with(" (deleted)") && is_plain_device(info.meta.rdev()) {
        return Ok(FileKind::CharDevice { path: info.link.clone(), rdev: info.meta.rdev() });
    }
    if info.link.starts_with("/dev/pts/") {
        // TCGETS fails on a slave whose master was closed: hung up.
        return Err(info.unsupported(
            "a pty slave whose master was closed (hung up); restore has no way to make one",
        ));
    }
    Err(info.unsupported("this character device is not supported"))
}

/// A deleted file held both by an fd and by a shared mapping of the
/// process: restore recreates the fd's file and the mapping's file each on
/// its own, so writes through one would no longer reach the other (they
/// did, silently, before). Refused by fd until they are recreated as one.
pub fn check_deleted_mapped(
    pid: i32,
    files: &[ferry_image::OpenFile],
    fds: &[ferry_image::FdSlot],
    vmas: &[ferry_image::Vma],
) -> Result<()> {
    use ferry_image::VmaBacking;
    for slot in fds {
        let Some(FileKind::Deleted { path, .. }) = files.get(slot.file as usize).map(|f| &f.kind)
        else {
            continue;
        };
        let proc_path = format!("/proc/{pid}/fd/{}", slot.fd);
        let ino = std::fs::metadata(&proc_path).map_err(|e| EngineError::io(&proc_path, e))?.ino();
        if let Some(v) = vmas
            .iter()
            .find(|v| v.shared && matches!(v.backing, VmaBacking::DeletedFile { id } if id == ino))
        {
            return Err(EngineError::unsupported(
                pid,
                format!("fd {} ({path} (deleted))", slot.fd),
                format!("a deleted file also mapped shared at {:#x}; restore would make the fd and the mapping two separate files", v.start),
            ));
        }
    }
    Ok(())
}
