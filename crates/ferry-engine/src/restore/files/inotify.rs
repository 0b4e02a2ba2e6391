//! inotify: a new instance gets every watch back under its old
//! descriptor. The kernel hands out watch descriptors one after the other
//! (after the last one given, never reusing a lower one at once), so a
//! gap is filled with a throw-away watch on "/" that is removed again
//! before the next real one; the IN_IGNORED events those removals queue
//! are read away before the instance is handed over. A watch on a file
//! deleted while open goes on the file restore made again for the tree's
//! fd, through /proc/self/fd.

use crate::error::{EngineError, Result};
use ferry_image::InotifyWatch;
use std::collections::HashMap;
use std::ffi::CString;
use std::os::fd::{AsFd, OwnedFd, RawFd};

/// `deleted`: ferry's descriptors of the deleted files it made again, by
/// "PATH (deleted)"; a watch on such a path goes on that file.
pub fn create(
    pid: i32,
    watches: &[InotifyWatch],
    deleted: &HashMap<String, RawFd>,
) -> Result<OwnedFd> {
    use ferry_sys::inotify;
    let fd =
        inotify::init().map_err(|e| EngineError::kernel(pid, "creating an inotify instance", e))?;
    let root = CString::new("/").map_err(|_| EngineError::restore(pid, "NUL"))?;
    let mut next = 1;
    let mut filled = false;
    for w in watches {
        while next < w.wd {
            // A throw-away watch takes the descriptor and is removed at once.
            let d = inotify::add_watch(fd.as_fd(), &root, libc::IN_ATTRIB).map_err(|e| {
                EngineError::kernel(pid, format!("filling inotify watch descriptor {next}"), e)
            })?;
            let _ = inotify::rm_watch(fd.as_fd(), d);
            next = d + 1;
            filled = true;
        }
        let path = match deleted.get(&w.path) {
            // The magic link reaches the file that has no name any more.
            Some(fd) => format!("/proc/self/fd/{fd}"),
            None if w.path.ends_with(" (deleted)") => {
                return Err(EngineError::restore(
                    pid,
                    format!("inotify watch {} is on {}, which was not made again", w.wd, w.path),
                ))
            }
            None => w.path.clone(),
        };
        let c = CString::new(path).map_err(|_| {
            EngineError::restore(pid, format!("inotify path {:?} has a NUL byte", w.path))
        })?;
        let d = inotify::add_watch(fd.as_fd(), &c, w.mask).map_err(|e| {
            EngineError::kernel(pid, format!("watching {} (inotify watch {})", w.path, w.wd), e)
        })?;
        if d != w.wd {
            return Err(EngineError::restore(
                pid,
                format!("inotify watch on {} came back as descriptor {d}, not {}", w.path, w.wd),
            ));
        }
        next = d + 1;
    }
    if filled {
        inotify::drain(fd.as_fd());
    }
    Ok(fd)
}
