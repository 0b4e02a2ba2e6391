//! `--data-dir`: directories whose files are part of the replicated
//! state. Each is a btrfs subvolume; every sync takes a read-only
//! snapshot of it while the tree is frozen and ships the difference from
//! the last one the standby stored (`btrfs send -p`), so the standby's
//! copy of the directory is always the one the memory it holds wrote.
//! What both sides share: the paths, and a directory of snapshots next
//! to each data directory (on the same filesystem, as snapshots must be).
//! See docs/replication.md, "Files".

use crate::error::{ReplicateError, Result};
use std::ffi::CString;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

/// A data directory's path, checked: absolute, plain (no `.` or `..`),
/// not `/`. Returns it with its parent and last component.
pub(crate) fn check_path(p: &str) -> Result<(PathBuf, PathBuf, String)> {
    let path = Path::new(p);
    // Component parsing would drop a `.` and doubled slashes silently.
    let plain = p.split('/').skip(1).all(|c| !c.is_empty() && c != "." && c != "..");
    let (Some(parent), Some(base)) = (path.parent(), path.file_name()) else {
        return Err(bad(p, "not a directory below /"));
    };
    if !path.is_absolute() || !plain {
        return Err(bad(p, "not an absolute path without . or .."));
    }
    let base = base.to_str().ok_or_else(|| bad(p, "not UTF-8"))?.to_string();
    Ok((path.to_path_buf(), parent.to_path_buf(), base))
}

fn bad(p: &str, why: &str) -> ReplicateError {
    ReplicateError::Invalid(format!("data directory {p:?}: {why}"))
}

/// Where `role`'s snapshots of `dir` live: a hidden directory beside it.
pub(crate) fn snapshots_dir(parent: &Path, base: &str, role: &str) -> PathBuf {
    parent.join(format!(".ferry-{role}-{base}"))
}

/// Whether `path` is `dir` or below it.
pub(crate) fn is_under(dir: &Path, path: &str) -> bool {
    let d = dir.as_os_str().as_encoded_bytes();
    let p = path.as_bytes();
    p.starts_with(d) && (p.len() == d.len() || p[d.len()] == b'/')
}

/// Two data directories one inside the other: named, refused (a
/// snapshot does not descend into a nested subvolume).
pub(crate) fn nested(dirs: &[PathBuf]) -> Option<(&Path, &Path)> {
    for a in dirs {
        for b in dirs {
            if a != b && is_under(a, &b.to_string_lossy()) {
                return Some((a, b));
            }
        }
    }
    None
}

pub(crate) fn cstring(s: &str) -> Result<CString> {
    CString::new(s).map_err(|_| ReplicateError::Invalid(format!("{s:?} contains a NUL byte")))
}

pub(crate) fn open_dir(path: &Path) -> Result<OwnedFd> {
    let c = cstring(&path.to_string_lossy())?;
    ferry_sys::fd::open(&c, libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC, 0)
        .map_err(|e| ReplicateError::Invalid(format!("opening {}: {e}", path.display())))
}

/// A directory of snapshots, emptied of any a dead `ferry replicate` or
/// agent left when opened, and of all of them when removed.
pub(crate) struct SnapDir {
    pub path: PathBuf,
    pub fd: OwnedFd,
}

impl SnapDir {
    pub(crate) fn open_clean(path: PathBuf) -> Result<SnapDir> {
        match std::fs::create_dir(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => {
                return Err(ReplicateError::Invalid(format!("making {}: {e}", path.display())))
            }
        }
        let fd = open_dir(&path)?;
        let d = SnapDir { path, fd };
        d.destroy_all_but(None)?;
        Ok(d)
    }

    pub(crate) fn destroy(&self, name: &str) -> Result<()> {
        ferry_sys::btrfs::destroy(self.fd.as_fd(), &cstring(name)?).map_err(|e| {
            ReplicateError::Invalid(format!(
                "deleting snapshot {}/{name}: {e}",
                self.path.display()
            ))
        })
    }

    /// Deletes every snapshot here but `keep`.
    pub(crate) fn destroy_all_but(&self, keep: Option<&str>) -> Result<()> {
        let entries = std::fs::read_dir(&self.path).map_err(|e| {
            ReplicateError::Invalid(format!("listing {}: {e}", self.path.display()))
        })?;
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if Some(name.as_str()) != keep {
                self.destroy(&name)?;
            }
        }
        Ok(())
    }

    /// Every snapshot deleted, then the directory itself; failures are
    /// only logged (this runs on the way out, the next run cleans up).
    pub(crate) fn remove(&self) {
        if let Err(e) = self.destroy_all_but(None) {
            tracing::warn!("{e}");
        }
        if let Err(e) = std::fs::remove_dir(&self.path) {
            tracing::warn!("removing {}: {e}", self.path.display());
        }
    }

    pub(crate) fn join(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }
}

/// The snapshot of sync `seq`.
pub(crate) fn snapshot_name(seq: u64) -> String {
    format!("s{seq}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_absolute_paths_below_root_are_data_directories() {
        let (p, parent, base) = check_path("/srv/db").unwrap();
        assert_eq!(
            (p.as_path(), parent.as_path(), base.as_str()),
            (Path::new("/srv/db"), Path::new("/srv"), "db")
        );
        for bad in ["/", "srv/db", "/srv/../etc", "/srv/./db", "/srv//db", "/srv/db/", ""] {
            assert!(check_path(bad).is_err(), "{bad:?} accepted");
        }
        assert_eq!(snapshots_dir(&parent, &base, "primary"), Path::new("/srv/.ferry-primary-db"));
    }

    #[test]
    fn paths_below_a_directory_are_under_it_and_its_siblings_are_not() {
        let d = Path::new("/srv/db");
        assert!(is_under(d, "/srv/db"));
        assert!(is_under(d, "/srv/db/base/1/1234"));
        assert!(!is_under(d, "/srv/db2/x"));
        assert!(!is_under(d, "/srv"));
        let dirs = [PathBuf::from("/srv/db"), PathBuf::from("/srv/db/wal"), PathBuf::from("/x")];
        assert_eq!(nested(&dirs), Some((Path::new("/srv/db"), Path::new("/srv/db/wal"))));
        assert_eq!(nested(&dirs[1..]), None);
    }
}
