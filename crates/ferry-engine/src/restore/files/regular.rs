//! Regular files (reopened by path at their offset), files deleted while
//! open (recreated from the image, then unlinked again), directories,
//! plain character devices, and terminals (replaced by `--tty-to`).

use super::Builder;
use crate::error::{EngineError, Result};
use ferry_image::{FileKind, OpenFile};
use std::ffi::CString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::DirBuilderExt;

const OPEN_MASK: i32 =
    !(libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC | libc::O_NOCTTY | libc::O_CLOEXEC);

fn cpath(pid: i32, p: &str) -> Result<CString> {
    CString::new(p)
        .map_err(|_| EngineError::restore(pid, format!("path {p:?} contains a NUL byte")))
}

fn open_path(pid: i32, path: &str, flags: i32, mode: u32) -> Result<OwnedFd> {
    let c = cpath(pid, path)?;
    ferry_sys::fd::open(&c, flags, mode)
        .map_err(|e| EngineError::kernel(pid, format!("opening {path}"), e))
}

fn seek(pid: i32, fd: &OwnedFd, pos: i64, path: &str) -> Result<()> {
    if pos != 0 {
        ferry_sys::fd::lseek(fd.as_raw_fd(), pos, libc::SEEK_SET)
            .map_err(|e| EngineError::kernel(pid, format!("seeking {path} to {pos}"), e))?;
    }
    Ok(())
}

/// Directories above a deleted file's old path that are gone too (a
/// temporary directory cleaned up under the service): made (mode 0700)
/// while the file is made again under its old name, so that /proc names
/// it as before, and removed again on drop, deepest first.
pub(crate) struct MadeParents(Vec<std::path::PathBuf>);

impl MadeParents {
    pub fn for_path(pid: i32, path: &str) -> Result<MadeParents> {
        let mut missing = Vec::new();
        let mut up = std::path::Path::new(path).parent();
        while let Some(dir) = up {
            if dir.as_os_str().is_empty() || std::fs::symlink_metadata(dir).is_ok() {
                break;
            }
            missing.push(dir.to_path_buf());
            up = dir.parent();
        }
        let mut made = MadeParents(Vec::with_capacity(missing.len()));
        for dir in missing.into_iter().rev() {
            std::fs::DirBuilder::new().mode(0o700).create(&dir).map_err(|e| {
                EngineError::io(
                    format!("pid {pid}: making removed directory {} again", dir.display()),
                    e,
                )
            })?;
            made.0.push(dir);
        }
        Ok(made)
    }
}

impl Drop for MadeParents {
    fn drop(&mut self) {
        for dir in self.0.iter().rev() {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

fn recreate_deleted(
    pid: i32,
    path: &str,
    mode: u32,
    content: &[u8],
    flags: i32,
) -> Result<OwnedFd> {
    let _parents = MadeParents::for_path(pid, path)?;
    let mut name = path.to_string();
    let mut n = 0;
    let rw = loop {
        match open_path(pid, &name, libc::O_RDWR | libc::O_CREAT | libc::O_EXCL, mode) {
            Ok(fd) => break fd,
            // The path is taken again (a new file was created there since):
            // recreate the deleted file under a neighbouring name.
            Err(_) if n < 100 => {
                n += 1;
                name = format!("{path}.ferry-{pid}-{n}");
            }
            Err(e) => return Err(e),
        }
    };
    let file = std::fs::File::from(rw);
    // Only blocks with data are written, then the size set: all-zero
    // blocks stay holes, so a sparse file does not come back dense (the
    // content reads the same either way).
    use std::os::unix::fs::FileExt;
    const BLOCK: usize = 4096;
    for (i, block) in content.chunks(BLOCK).enumerate() {
        if block.iter().any(|&b| b != 0) {
            file.write_all_at(block, (i * BLOCK) as u64)
                .map_err(|e| EngineError::io(format!("recreating deleted file {name}"), e))?;
        }
    }
    file.set_len(content.len() as u64).map_err(|e| {
        EngineError::io(format!("setting the size of recreated deleted file {name}"), e)
    })?;
    let fd = open_path(pid, &format!("/proc/self/fd/{}", file.as_raw_fd()), flags & OPEN_MASK, 0);
    let _ = std::fs::remove_file(&name);
    fd
}

/// A removed directory made again by [`make_deleted_dir`], with the
/// directories above it that were gone too.
pub(crate) struct RemadeDir {
    pub name: String,
    _parents: MadeParents,
}

impl RemadeDir {
    /// Removes it again (and then the directories made above it).
    pub fn remove(self) -> std::io::Result<()> {
        std::fs::remove_dir(&self.name)
    }
}

/// Makes an empty directory (mode 0700) for a directory that was removed
/// while open or while a process's cwd, at its old path (or a neighbouring
/// name if that is taken again), with any directory above it that is gone
/// too. The caller opens or enters it, then removes it, so it shows
/// "PATH (deleted)" as before. A removed directory is always empty, so
/// nothing else is lost.
pub(crate) fn make_deleted_dir(pid: i32, path: &str) -> Result<RemadeDir> {
    let parents = MadeParents::for_path(pid, path)?;
    let mut name = path.to_string();
    let mut n = 0;
    loop {
        match std::fs::DirBuilder::new().mode(0o700).create(&name) {
            Ok(()) => return Ok(RemadeDir { name, _parents: parents }),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 100 => {
                n += 1;
                name = format!("{path}.ferry-{pid}-{n}");
            }
            Err(e) => {
                return Err(EngineError::io(
                    format!("pid {pid}: making removed directory {name} again"),
                    e,
                ))
            }
        }
    }
}

/// A device node unlinked while open: made again with mknod under its old
/// name (or a neighbouring one if that is taken), opened, unlinked. Only
/// the devices checkpoint accepts (null, zero, full, random, urandom): an
/// image cannot make ferry create a node of any other device. Mode and
/// owner are set afterwards from the image's inode attributes.
fn recreate_deleted_node(pid: i32, path: &str, rdev: u64, flags: i32) -> Result<OwnedFd> {
    if !crate::plain_devices::is_plain_device(rdev) {
        return Err(EngineError::restore(
            pid,
            format!(
                "deleted device node {path}: device {}:{} is not one ferry recreates",
                libc::major(rdev as libc::dev_t),
                libc::minor(rdev as libc::dev_t)
            ),
        ));
    }
    let _parents = MadeParents::for_path(pid, path)?;
    let mut name = path.to_string();
    let mut n = 0;
    loop {
        match ferry_sys::fd::mknod_char(&cpath(pid, &name)?, 0o600, rdev) {
            Ok(()) => break,
            Err(e) if e.errno == libc::EEXIST && n < 100 => {
                n += 1;
                name = format!("{path}.ferry-{pid}-{n}");
            }
            Err(e) => {
                return Err(EngineError::kernel(pid, format!("making device node {name} again"), e))
            }
        }
    }
    let fd = open_path(pid, &name, flags, 0);
    let _ = std::fs::remove_file(&name);
    fd
}

/// A new open file description of what `fd` refers to, with `f`'s flags
/// and offset (opening /proc/self/fd/N reopens the file itself).
pub fn reopen(pid: i32, fd: i32, f: &OpenFile) -> Result<OwnedFd> {
    let path = format!("/proc/self/fd/{fd}");
    let new = open_path(pid, &path, f.flags & OPEN_MASK, 0)?;
    seek(pid, &new, f.pos, &path)?;
    Ok(new)
}

pub fn open(b: &mut Builder, f: &OpenFile) -> Result<OwnedFd> {
    let pid = b.pid;
    let flags = f.flags & OPEN_MASK;
    let (fd, path) = match &f.kind {
        FileKind::Regular { path, .. } => (open_path(pid, path, flags, 0)?, path.as_str()),
        FileKind::Deleted { path, mode, content } => {
            (recreate_deleted(pid, path, *mode, content, flags)?, path.as_str())
        }
        FileKind::Directory { path } => match path.strip_suffix(" (deleted)") {
            // A directory removed while open (zdtm cwd02): made again,
            // opened, removed; mode and owner come from inode attributes.
            Some(old) => {
                let dir = make_deleted_dir(pid, old)?;
                let fd = open_path(pid, &dir.name, flags | libc::O_DIRECTORY, 0);
                let _ = dir.remove();
                (fd?, path.as_str())
            }
            None => (open_path(pid, path, flags | libc::O_DIRECTORY, 0)?, path.as_str()),
        },
        FileKind::CharDevice { path, rdev } => match path.strip_suffix(" (deleted)") {
            Some(old) => (recreate_deleted_node(pid, old, *rdev, flags)?, path.as_str()),
            None => (open_path(pid, path, flags, 0)?, path.as_str()),
        },
        FileKind::Terminal { .. } | FileKind::ExternalStdio { .. } => {
            let acc = f.flags & libc::O_ACCMODE;
            let extra = if acc == libc::O_RDONLY { 0 } else { libc::O_CREAT | libc::O_APPEND };
            return open_path(pid, b.tty_to, acc | extra, 0o644);
        }
        _ => return Err(EngineError::restore(pid, "not a path-based file")),
    };
    seek(pid, &fd, f.pos, path)?;
    Ok(fd)
}
