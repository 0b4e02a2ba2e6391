//! Carried files ([`Handover::carried`](crate::restore::Handover::carried)):
//! the restore is handed ferry's duplicates of the captured tree's files
//! (`ferry replace`, [`crate::capture::CaptureOptions::carry_files`]) and
//! stages each at its description id, as it stages the files it makes:
//! the processes get them at their fd numbers with the same injected
//! dup3 calls, with their own close-on-exec bits. The file's own state
//! (queues, status flags, options, an epoll's entries, flock and OFD
//! locks) is the file's and stays; what belongs to the process is set
//! as for any file: POSIX locks, the F_SETOWN owner (the old owner was
//! the old process).

use crate::error::{EngineError, Result};
use ferry_image::{FileKind, TreeImage};
use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::MetadataExt;

/// Whether the restore places this file rather than making it.
pub fn is_carried(f: &ferry_image::OpenFile) -> bool {
    matches!(f.kind, FileKind::Carried(_))
}

/// Stages every carried file of `tree` from `carried` (ferry's
/// duplicates, by description id) above `temp_base`, into `staged`. A
/// carried file the restore was not handed, or a handed fd that is not
/// that file (another device or inode), is refused by name.
pub fn stage(
    tree: &TreeImage,
    carried: &HashMap<u64, RawFd>,
    temp_base: RawFd,
    staged: &mut HashMap<u64, OwnedFd>,
) -> Result<()> {
    for p in &tree.processes {
        for (i, f) in p.files.iter().enumerate() {
            let FileKind::Carried(c) = &f.kind else { continue };
            if staged.contains_key(&f.id) {
                continue;
            }
            let fd = p.fds.iter().find(|s| s.file as usize == i).map_or(-1, |s| s.fd);
            let what = || format!("fd {fd} ({})", c.link);
            let raw = *carried.get(&f.id).ok_or_else(|| {
                EngineError::restore(
                    p.pid,
                    format!("{}: a file carried over from the old tree, not handed to this restore (only `ferry replace` carries files)", what()),
                )
            })?;
            let high = ferry_sys::fd::dup_above(raw, temp_base).map_err(|e| {
                EngineError::kernel(p.pid, format!("staging carried {}", what()), e)
            })?;
            let meta = std::fs::File::from(high.try_clone().map_err(|e| {
                EngineError::io(format!("pid {}: duplicating carried {}", p.pid, what()), e)
            })?)
            .metadata()
            .map_err(|e| {
                EngineError::io(format!("pid {}: stat of carried {}", p.pid, what()), e)
            })?;
            if (meta.dev(), meta.ino()) != (c.dev, c.ino) {
                return Err(EngineError::restore(
                    p.pid,
                    format!(
                        "{}: the fd handed over is another file (device {} inode {}, the capture saw {} {})",
                        what(),
                        meta.dev(),
                        meta.ino(),
                        c.dev,
                        c.ino
                    ),
                ));
            }
            tracing::trace!("pid {}: carried {} staged at {}", p.pid, what(), high.as_raw_fd());
            staged.insert(f.id, high);
        }
    }
    Ok(())
}

/// The trial restore sets nothing on a carried file, which the old tree
/// still uses: its F_SETOWN owner (it would become a trial process) is
/// left out of the trial's image. Its POSIX locks make the tree
/// untrialable as any file lock does.
pub fn leave_owners_of_carried(tree: &mut TreeImage) {
    for p in &mut tree.processes {
        let files = &p.files;
        p.fidelity.file_owners.retain(|o| !files.get(o.file as usize).is_some_and(is_carried));
    }
}
