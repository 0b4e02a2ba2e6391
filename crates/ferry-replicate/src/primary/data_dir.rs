//! The primary's data directories: a read-only snapshot of each in every
//! sync's freeze (the kernel writes the directory's dirty data first, so
//! the snapshot holds every write the frozen memory made), shipped after
//! the thaw as the difference from the snapshot the standby stored last
//! (`btrfs send -p`). The snapshot the standby holds is kept as the next
//! sync's parent; older ones are deleted once the standby has a newer.

use crate::data_dir::{check_path, nested, open_dir, snapshot_name, snapshots_dir, SnapDir};
use crate::error::{ReplicateError, Result};
use ferry_migrate::protocol::{self, Msg};
use ferry_transport::Channel;
use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::process::{Command, Stdio};

/// How much of a send stream goes in one message.
const CHUNK: usize = 1 << 20;

struct Dir {
    path: PathBuf,
    fd: OwnedFd,
    snaps: SnapDir,
    /// The snapshot the standby holds: the parent of the next send.
    stored: Option<String>,
    /// The snapshot of the sync on its way.
    taken: Option<String>,
}

#[derive(Default)]
pub(crate) struct DataDirs {
    dirs: Vec<Dir>,
}

impl DataDirs {
    /// Each path must be a btrfs subvolume whose parent directory is on
    /// the same filesystem; refused by name otherwise, before anything
    /// runs. Snapshots a dead run left are deleted.
    pub(crate) fn open(paths: &[PathBuf]) -> Result<DataDirs> {
        let mut checked = Vec::new();
        for p in paths {
            let (path, parent, base) = check_path(&p.to_string_lossy())?;
            checked.push((path, parent, base));
        }
        let all: Vec<PathBuf> = checked.iter().map(|c| c.0.clone()).collect();
        if let Some((a, b)) = nested(&all) {
            return Err(ReplicateError::Invalid(format!(
                "data directory {} is inside data directory {}: give the outer one only",
                b.display(),
                a.display()
            )));
        }
        let mut dirs = DataDirs::default();
        for (path, parent, base) in checked {
            let fd = open_dir(&path)?;
            let sub = ferry_sys::btrfs::is_subvolume(fd.as_fd()).map_err(|e| {
                ReplicateError::Invalid(format!("data directory {}: {e}", path.display()))
            })?;
            if !sub {
                return Err(ReplicateError::Invalid(format!(
                    "data directory {} is not a btrfs subvolume (make it one with `btrfs subvolume create`, on a btrfs filesystem)",
                    path.display()
                )));
            }
            let snaps = SnapDir::open_clean(snapshots_dir(&parent, &base, "primary"))?;
            if let Err(e) = probe(&path, &fd, &snaps) {
                snaps.remove();
                return Err(e);
            }
            dirs.dirs.push(Dir { path, fd, snaps, stored: None, taken: None });
        }
        Ok(dirs)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.dirs.is_empty()
    }

    pub(crate) fn paths(&self) -> Vec<PathBuf> {
        self.dirs.iter().map(|d| d.path.clone()).collect()
    }

    /// Tells the standby which directories follow the memory.
    pub(crate) fn announce(&self, ch: &mut Channel) -> Result<()> {
        let dirs = self.dirs.iter().map(|d| d.path.to_string_lossy().into_owned()).collect();
        protocol::send(ch, &Msg::DataDirs { dirs })?;
        Ok(())
    }

    /// In the freeze: a read-only snapshot of each directory.
    pub(crate) fn snapshot(&mut self, seq: u64) -> Result<()> {
        let name = snapshot_name(seq);
        let cname = crate::data_dir::cstring(&name)?;
        for d in &mut self.dirs {
            if let Some(old) = d.taken.take() {
                // A sync that failed before it was stored.
                d.snaps.destroy(&old)?;
            }
            ferry_sys::btrfs::snapshot(d.fd.as_fd(), d.snaps.fd.as_fd(), &cname, true).map_err(
                |e| {
                    ReplicateError::Unreplicable(vec![format!(
                        "snapshot of data directory {} as {}: {e}",
                        d.path.display(),
                        d.snaps.join(&name).display()
                    )])
                },
            )?;
            d.taken = Some(name.clone());
        }
        Ok(())
    }

    /// After the thaw: each directory's change since the standby's copy,
    /// as DirStream messages. Returns the bytes sent.
    pub(crate) fn ship(&self, ch: &mut Channel) -> Result<u64> {
        let mut bytes = 0;
        for (i, d) in self.dirs.iter().enumerate() {
            let Some(taken) = &d.taken else { continue };
            bytes += send_stream(ch, i as u32, d, taken)?;
        }
        Ok(bytes)
    }

    /// The standby stored the sync: its snapshots are the next parents,
    /// the ones before them go.
    pub(crate) fn stored(&mut self) -> Result<()> {
        for d in &mut self.dirs {
            if let Some(taken) = d.taken.take() {
                if let Some(old) = d.stored.replace(taken) {
                    d.snaps.destroy(&old)?;
                }
            }
        }
        Ok(())
    }
}

impl Drop for DataDirs {
    fn drop(&mut self) {
        for d in &self.dirs {
            d.snaps.remove();
        }
    }
}

/// One snapshot made and deleted: whatever would make every sync's
/// fail (the parent directory on another filesystem, a read-only mount,
/// no space) is refused now, by name, before the service is touched.
fn probe(path: &std::path::Path, fd: &OwnedFd, snaps: &SnapDir) -> Result<()> {
    let name = crate::data_dir::cstring("probe")?;
    ferry_sys::btrfs::snapshot(fd.as_fd(), snaps.fd.as_fd(), &name, true).map_err(|e| {
        ReplicateError::Invalid(format!(
            "data directory {}: a snapshot of it in {} fails ({e}): the directory above it must be on the same btrfs filesystem, writable",
            path.display(),
            snaps.path.display()
        ))
    })?;
    snaps.destroy("probe")
}

/// `btrfs send [-p STORED] TAKEN`, read as it comes and sent on.
fn send_stream(ch: &mut Channel, dir: u32, d: &Dir, taken: &str) -> Result<u64> {
    let mut cmd = Command::new("btrfs");
    cmd.arg("send").arg("-q");
    if let Some(parent) = &d.stored {
        cmd.arg("-p").arg(d.snaps.join(parent));
    }
    cmd.arg(d.snaps.join(taken)).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let what = format!("btrfs send of data directory {}", d.path.display());
    let failed = |why: String| ReplicateError::Unreplicable(vec![format!("{what}: {why}")]);
    let mut child = cmd.spawn().map_err(|e| failed(e.to_string()))?;
    let mut out = child.stdout.take().ok_or_else(|| failed("no pipe".into()))?;
    let mut buf = vec![0u8; CHUNK];
    let mut total = 0u64;
    let sent = (|| -> Result<()> {
        loop {
            let n = read_full(&mut out, &mut buf).map_err(|e| failed(format!("reading: {e}")))?;
            if n == 0 {
                return Ok(());
            }
            total += n as u64;
            protocol::send_with_data(ch, &Msg::DirStream { dir }, &buf[..n])?;
        }
    })();
    if sent.is_err() {
        let _ = child.kill();
    }
    let output = child.wait_with_output();
    sent?;
    let output = output.map_err(|e| failed(e.to_string()))?;
    if !output.status.success() {
        let err = String::from_utf8_lossy(&output.stderr);
        return Err(failed(format!("{}: {}", output.status, err.trim())));
    }
    Ok(total)
}

/// Fills `buf` unless the stream ends first; the bytes read.
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}
