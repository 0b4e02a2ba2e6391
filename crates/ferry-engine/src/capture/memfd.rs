//! memfd files: anonymous files that a process maps or holds open. They
//! exist nowhere else, so their content travels in the image (only the
//! extents that hold data: holes are found with SEEK_DATA/SEEK_HOLE).

use crate::error::{EngineError, Result};
use crate::procfs::MapsEntry;
use ferry_image::{FdSlot, FileKind, InodeAttrs, InodeOf, MemfdObject, OpenFile, Vma, VmaBacking};
use ferry_sys::fd;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::os::unix::fs::MetadataExt;

/// memfd content larger than this is refused rather than copied.
const MAX_MEMFD: u64 = 4 << 30;

/// "/memfd:NAME (deleted)" -> NAME.
pub fn name_of(path: &str) -> Option<&str> {
    path.strip_prefix("/memfd:").map(|n| n.strip_suffix(" (deleted)").unwrap_or(n))
}

pub(crate) fn read_object(
    pid: i32,
    id: u64,
    name: &str,
    file: std::fs::File,
) -> Result<MemfdObject> {
    let what = || format!("memfd {name} (pid {pid})");
    let size = file.metadata().map_err(|e| EngineError::io(what(), e))?.len();
    if size > MAX_MEMFD {
        return Err(EngineError::unsupported(
            pid,
            what(),
            format!("{size} bytes is too large to copy into the image"),
        ));
    }
    let seals = fd::get_seals(file.as_raw_fd()).unwrap_or(0);
    let mut extents = Vec::new();
    let mut off = 0u64;
    while off < size {
        let Ok(data) = fd::lseek(file.as_raw_fd(), off as i64, libc::SEEK_DATA) else {
            break; // ENXIO: only a hole is left
        };
        let hole =
            fd::lseek(file.as_raw_fd(), data, libc::SEEK_HOLE).unwrap_or(-1).max(data) as u64;
        let end = hole.min(size);
        let mut buf = vec![0u8; (end - data as u64) as usize];
        file.read_exact_at(&mut buf, data as u64).map_err(|e| EngineError::io(what(), e))?;
        extents.push((data as u64, buf));
        off = end;
    }
    Ok(MemfdObject { id, name: name.to_string(), size, seals, extents })
}

/// The memfd's mode and owner (fchmod/fchown may have changed them).
fn attrs_of(pid: i32, id: u64, file: &std::fs::File) -> Result<InodeAttrs> {
    let m = file.metadata().map_err(|e| EngineError::io(format!("memfd {id} (pid {pid})"), e))?;
    Ok(InodeAttrs { of: InodeOf::Memfd(id), mode: m.mode() & 0o7777, uid: m.uid(), gid: m.gid() })
}

/// Reads every memfd the fds or mappings refer to: through one of the
/// process's fds when it has one, else through /proc/PID/map_files.
/// Returns them with their modes and owners.
pub fn capture(
    pid: i32,
    files: &[OpenFile],
    slots: &[FdSlot],
    vmas: &[Vma],
    smaps: &[MapsEntry],
) -> Result<(Vec<MemfdObject>, Vec<InodeAttrs>)> {
    let mut out: Vec<MemfdObject> = Vec::new();
    let mut attrs = Vec::new();
    for (i, f) in files.iter().enumerate() {
        let FileKind::Memfd { id } = f.kind else {
            continue;
        };
        if out.iter().any(|m| m.id == id) {
            continue;
        }
        let Some(slot) = slots.iter().find(|s| s.file as usize == i) else {
            continue;
        };
        let path = format!("/proc/{pid}/fd/{}", slot.fd);
        let link = crate::procfs::read_link(&path)?;
        // A fresh open file description: seeking through it to find data
        // extents leaves the process's own file offset alone.
        let file = std::fs::File::open(&path).map_err(|e| EngineError::io(&path, e))?;
        attrs.push(attrs_of(pid, id, &file)?);
        out.push(read_object(pid, id, name_of(&link).unwrap_or(""), file)?);
    }
    for (v, m) in vmas.iter().zip(smaps) {
        let VmaBacking::Memfd { id } = v.backing else {
            continue;
        };
        if out.iter().any(|o| o.id == id) {
            continue;
        }
        let path = format!("/proc/{pid}/map_files/{:x}-{:x}", m.start, m.end);
        let file = std::fs::File::open(&path).map_err(|e| EngineError::io(&path, e))?;
        attrs.push(attrs_of(pid, id, &file)?);
        out.push(read_object(pid, id, name_of(&m.path).unwrap_or(""), file)?);
    }
    Ok((out, attrs))
}

/// Mapped files deleted since they were mapped (a replaced library, a
/// temp file): their content, read through /proc/PID/map_files, goes into
/// the image like a memfd's, with the path they had and their mode.
pub fn capture_deleted_files(
    pid: i32,
    vmas: &[Vma],
    smaps: &[MapsEntry],
) -> Result<Vec<MemfdObject>> {
    let mut out: Vec<MemfdObject> = Vec::new();
    for (v, m) in vmas.iter().zip(smaps) {
        let VmaBacking::DeletedFile { id } = v.backing else {
            continue;
        };
        if out.iter().any(|o| o.id == id) {
            continue;
        }
        let path = format!("/proc/{pid}/map_files/{:x}-{:x}", m.start, m.end);
        let file = std::fs::File::open(&path).map_err(|e| EngineError::io(&path, e))?;
        let mode = file.metadata().map_err(|e| EngineError::io(&path, e))?.mode() & 0o7777;
        let name = m.path.strip_suffix(" (deleted)").unwrap_or(&m.path);
        let mut obj = read_object(pid, id, name, file)?;
        obj.seals = mode as i32;
        out.push(obj);
    }
    Ok(out)
}
