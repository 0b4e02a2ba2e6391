//! The standby's copies of the primary's data directories: each sync's
//! send stream goes into `btrfs receive` as it arrives, into a directory
//! of snapshots beside the data directory's path; at SyncDone the
//! receive must have ended well with the sync's snapshot, and only when
//! the rest of the sync checks out too does that snapshot become the copy
//! (the one before it is deleted then, not earlier). A sync that stops
//! half way leaves the previous copy. At a takeover the data directory
//! becomes a writable snapshot of the last copy, before the tree is
//! restored, so the restored descriptors open the files that memory
//! wrote.

use crate::data_dir::{check_path, snapshot_name, snapshots_dir, SnapDir};
use crate::error::{ReplicateError, Result};
use std::io::Write;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

struct Copy {
    path: PathBuf,
    parent: PathBuf,
    base: String,
    snaps: SnapDir,
    /// The snapshot of the last complete sync.
    current: Option<String>,
    /// The receive of the sync on its way.
    receiving: Option<Child>,
    /// Received whole, waiting for the rest of the sync to check out.
    staged: Option<String>,
}

#[derive(Default)]
pub(crate) struct Copies {
    dirs: Vec<Copy>,
}

fn failed(what: String) -> ReplicateError {
    ReplicateError::Invalid(what)
}

impl Copies {
    /// The primary's DataDirs: the same paths must be usable here (their
    /// parents on btrfs), refused by name before the first sync.
    pub(crate) fn configure(&mut self, dirs: Vec<String>, seq: u64) -> Result<()> {
        if !self.dirs.is_empty() || seq != 0 {
            return Err(ReplicateError::Protocol(format!("DataDirs after sync {seq}")));
        }
        for d in dirs {
            let (path, parent, base) = check_path(&d)?;
            let c = crate::data_dir::cstring(&parent.to_string_lossy())?;
            let magic = ferry_sys::fd::statfs_magic(&c)
                .map_err(|e| failed(format!("data directory {d}: {}: {e}", parent.display())))?;
            if magic != ferry_sys::btrfs::BTRFS_SUPER_MAGIC {
                return Err(failed(format!(
                    "data directory {d}: {} is not on btrfs on this host (the standby keeps its copy as btrfs snapshots beside it)",
                    parent.display()
                )));
            }
            let snaps = SnapDir::open_clean(snapshots_dir(&parent, &base, "standby"))?;
            self.dirs.push(Copy {
                path,
                parent,
                base,
                snaps,
                current: None,
                receiving: None,
                staged: None,
            });
        }
        Ok(())
    }

    /// Bytes of data directory `dir`'s send stream for the sync on its
    /// way, into its `btrfs receive` (started at the first bytes).
    pub(crate) fn stream(&mut self, dir: u32, data: &[u8]) -> Result<()> {
        let n = self.dirs.len();
        let c = self.dirs.get_mut(dir as usize).ok_or_else(|| {
            ReplicateError::Protocol(format!("DirStream for data directory {dir} of {n}"))
        })?;
        if c.receiving.is_none() {
            let child = Command::new("btrfs")
                .arg("receive")
                .arg("-q")
                .arg(&c.snaps.path)
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .map_err(|e| {
                    failed(format!("btrfs receive into {}: {e}", c.snaps.path.display()))
                })?;
            c.receiving = Some(child);
        }
        let stdin = c.receiving.as_mut().and_then(|child| child.stdin.as_mut());
        let written = match stdin {
            Some(stdin) => stdin.write_all(data),
            None => Err(std::io::Error::from(std::io::ErrorKind::BrokenPipe)),
        };
        written.map_err(|e| {
            failed(format!("btrfs receive of {} (it ended early?): {e}", c.path.display()))
        })
    }

    /// SyncDone: every directory's receive ended well with the sync's
    /// snapshot. Staged, not yet the copy.
    pub(crate) fn finish(&mut self, seq: u64) -> Result<()> {
        let name = snapshot_name(seq);
        for c in &mut self.dirs {
            let Some(mut child) = c.receiving.take() else {
                return Err(ReplicateError::Protocol(format!(
                    "sync {seq} carried no copy of data directory {}",
                    c.path.display()
                )));
            };
            drop(child.stdin.take());
            let out = child
                .wait_with_output()
                .map_err(|e| failed(format!("btrfs receive of {}: {e}", c.path.display())))?;
            if !out.status.success() {
                return Err(failed(format!(
                    "btrfs receive of {} for sync {seq}: {}: {}",
                    c.path.display(),
                    out.status,
                    String::from_utf8_lossy(&out.stderr).trim()
                )));
            }
            let fd = crate::data_dir::open_dir(&c.snaps.join(&name))?;
            if !ferry_sys::btrfs::is_subvolume(fd.as_fd()).unwrap_or(false) {
                return Err(ReplicateError::Protocol(format!(
                    "sync {seq}'s stream of {} did not make snapshot {name}",
                    c.path.display()
                )));
            }
            c.staged = Some(name.clone());
        }
        Ok(())
    }

    /// The sync is applied: its snapshots are the copies now.
    pub(crate) fn commit(&mut self) {
        for c in &mut self.dirs {
            if let Some(new) = c.staged.take() {
                if let Some(old) = c.current.replace(new) {
                    if let Err(e) = c.snaps.destroy(&old) {
                        tracing::warn!("{e}");
                    }
                }
            }
        }
    }

    /// What arrived of a sync that will not complete.
    pub(crate) fn discard(&mut self) {
        for c in &mut self.dirs {
            if let Some(mut child) = c.receiving.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
            c.staged = None;
            if let Err(e) = c.snaps.destroy_all_but(c.current.as_deref()) {
                tracing::warn!("{e}");
            }
        }
    }

    /// The takeover: each data directory becomes a writable snapshot of
    /// its last copy. What was at the path (a copy of the service from an
    /// earlier run) is deleted if it is a subvolume, else moved aside.
    pub(crate) fn install(&mut self) -> Result<Vec<String>> {
        let mut notes = Vec::new();
        for c in &self.dirs {
            let Some(current) = &c.current else {
                return Err(failed(format!(
                    "no complete copy of data directory {}",
                    c.path.display()
                )));
            };
            let parent = crate::data_dir::open_dir(&c.parent)?;
            if let Some(note) = clear_path(c, &parent)? {
                notes.push(note);
            }
            let t = std::time::Instant::now();
            let src = crate::data_dir::open_dir(&c.snaps.join(current))?;
            let name = crate::data_dir::cstring(&c.base)?;
            ferry_sys::btrfs::snapshot(src.as_fd(), parent.as_fd(), &name, false).map_err(|e| {
                failed(format!("making {} from snapshot {current}: {e}", c.path.display()))
            })?;
            notes.push(format!(
                "{} made from the copy of {current} in {:.1} ms",
                c.path.display(),
                t.elapsed().as_secs_f64() * 1e3
            ));
        }
        Ok(notes)
    }
}

/// Makes room at a data directory's path for the copy.
fn clear_path(c: &Copy, parent: &std::os::fd::OwnedFd) -> Result<Option<String>> {
    let fd = match crate::data_dir::open_dir(&c.path) {
        Ok(fd) => fd,
        Err(_) if std::fs::symlink_metadata(&c.path).is_err() => return Ok(None),
        Err(e) => return Err(e),
    };
    if ferry_sys::btrfs::is_subvolume(fd.as_fd()).unwrap_or(false) {
        drop(fd);
        let name = crate::data_dir::cstring(&c.base)?;
        ferry_sys::btrfs::destroy(parent.as_fd(), &name).map_err(|e| {
            failed(format!("deleting the old {} before the takeover: {e}", c.path.display()))
        })?;
        return Ok(Some(format!("replaced subvolume {}", c.path.display())));
    }
    let aside = c.parent.join(format!(".ferry-replaced-{}-{}", c.base, std::process::id()));
    std::fs::rename(&c.path, &aside).map_err(|e| {
        failed(format!("moving the old {} aside to {}: {e}", c.path.display(), aside.display()))
    })?;
    Ok(Some(format!("moved the old {} to {}", c.path.display(), aside.display())))
}

impl Drop for Copies {
    fn drop(&mut self) {
        self.discard();
        for c in &self.dirs {
            c.snaps.remove();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_directories_are_named_once_before_the_first_sync() {
        let mut c = Copies::default();
        assert!(c.configure(vec!["/srv/db".into()], 3).is_err(), "after sync 3");
        assert!(c.configure(vec!["srv/db".into()], 0).is_err(), "a relative path");
        assert!(c.stream(0, b"x").is_err(), "a stream for a directory never named");
    }

    #[test]
    fn a_sync_without_streams_checks_out_when_there_are_no_data_directories() {
        let mut c = Copies::default();
        assert!(c.finish(1).is_ok());
        c.commit();
        assert!(c.install().is_ok_and(|notes| notes.is_empty()));
    }
}
