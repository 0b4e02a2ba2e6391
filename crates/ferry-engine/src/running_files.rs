//! The regular files a running tree maps or holds open by path, listed
//! while it runs for a migration's hello: a restore opens and maps each
//! again by its path, so the destination must have it, and a mapped file
//! must be the same file there (its code or data would silently be
//! another's). Deleted files, memfds and shared memory travel in the
//! image and are left out; so is everything that is not a regular file.

use crate::procfs;
use serde::{Deserialize, Serialize};
use std::os::unix::fs::MetadataExt;

/// One file as the source sees it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct RunningFile {
    pub path: String,
    pub size: u64,
    /// Modification time, seconds and nanoseconds.
    pub mtime: (i64, i64),
    /// Mapped by some process (not only open).
    pub mapped: bool,
    /// Who holds it first, for messages ("pid 12 fd 3", "pid 12 mapping 0x...").
    pub holder: String,
}

/// Every such file of `pids`, each path once (mapped wins over open).
pub fn running_files(pids: &[i32]) -> Vec<RunningFile> {
    let mut files: Vec<RunningFile> = Vec::new();
    for &pid in pids {
        for (path, through, holder) in mapped_files(pid) {
            add(&mut files, path, &through, true, holder);
        }
        for (path, through, holder) in open_files(pid) {
            add(&mut files, path, &through, false, holder);
        }
    }
    files.sort_by(|a, b| a.path.cmp(&b.path));
    files
}

/// Records `path` (stat through `through`, a /proc link to the very file)
/// unless it is not a regular file or is known already.
fn add(files: &mut Vec<RunningFile>, path: String, through: &str, mapped: bool, holder: String) {
    if let Some(known) = files.iter_mut().find(|f| f.path == path) {
        known.mapped |= mapped;
        return;
    }
    let Ok(meta) = std::fs::metadata(through) else { return };
    if !meta.is_file() || on_kernel_fs(through) {
        return;
    }
    files.push(RunningFile {
        path,
        size: meta.size(),
        mtime: (meta.mtime(), meta.mtime_nsec()),
        mapped,
        holder,
    });
}

/// procfs and sysfs files are the kernel's view of this host (a /proc
/// path is made again for the restored PIDs): no file to carry.
fn on_kernel_fs(through: &str) -> bool {
    const PROC_SUPER_MAGIC: i64 = 0x9fa0;
    const SYSFS_MAGIC: i64 = 0x6265_6572;
    let Ok(path) = std::ffi::CString::new(through) else { return false };
    ferry_sys::fd::statfs_magic(&path).is_ok_and(|m| m == PROC_SUPER_MAGIC || m == SYSFS_MAGIC)
}

/// A path a restore opens again by name: absolute, not deleted, not a
/// memfd or shared memory (the kernel's names for those look like paths).
pub(crate) fn reopened_by_path(path: &str) -> bool {
    path.starts_with('/')
        && !path.ends_with(" (deleted)")
        && !path.starts_with("/memfd:")
        && !path.starts_with("/dev/zero")
        && !path.starts_with("/SYSV")
}

fn mapped_files(pid: i32) -> Vec<(String, String, String)> {
    let maps = procfs::maps(pid).unwrap_or_default();
    maps.into_iter()
        .filter(|m| m.inode != 0 && reopened_by_path(&m.path))
        .map(|m| {
            let through = format!("/proc/{pid}/map_files/{:x}-{:x}", m.start, m.end);
            (m.path, through, format!("pid {pid} mapping {:#x}", m.start))
        })
        .collect()
}

fn open_files(pid: i32) -> Vec<(String, String, String)> {
    let Ok(entries) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let fd = e.file_name().to_str()?.parse::<i32>().ok()?;
            let through = format!("/proc/{pid}/fd/{fd}");
            let path = std::fs::read_link(&through).ok()?.into_os_string().into_string().ok()?;
            reopened_by_path(&path).then(|| (path, through, format!("pid {pid} fd {fd}")))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_paths_a_restore_opens_again_count() {
        assert!(reopened_by_path("/usr/lib/x86_64-linux-gnu/libc.so.6"));
        assert!(!reopened_by_path("/tmp/x (deleted)"));
        assert!(!reopened_by_path("/memfd:jit (deleted)"));
        assert!(!reopened_by_path("/dev/zero"));
        assert!(!reopened_by_path("/SYSV00000000"));
        assert!(!reopened_by_path("socket:[123]"));
        assert!(!reopened_by_path("anon_inode:[eventfd]"));
    }

    #[test]
    fn proc_files_are_the_kernels_not_carried() {
        let stat = std::fs::File::open("/proc/self/stat").expect("open");
        let files = running_files(&[std::process::id() as i32]);
        assert!(files.iter().all(|f| !f.path.starts_with("/proc/")), "{files:?}");
        drop(stat);
    }

    #[test]
    fn this_process_maps_its_own_executable() {
        let files = running_files(&[std::process::id() as i32]);
        let exe = std::fs::read_link("/proc/self/exe").expect("exe");
        let me = files.iter().find(|f| std::path::Path::new(&f.path) == exe).expect("listed");
        assert!(me.mapped && me.size > 0, "{me:?}");
        assert!(files.windows(2).all(|w| w[0].path < w[1].path), "sorted, each once");
    }
}
