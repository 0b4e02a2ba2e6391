//! inotify: a new instance gets every watch back under its old
//! descriptor. The kernel hands out watch descriptors one after the other
//! (after the last one given, never reusing a lower one at once), so a
//! gap is filled with a throw-away watch on "/" that is removed again
//! before the next real one; the IN_IGNORED events those removals queue
//! are read away before the instance is handed over.

use super::{errno_err, owned};
use crate::error::{EngineError, Result};
use ferry_image::InotifyWatch;
use std::ffi::CString;
use std::os::fd::{AsRawFd, OwnedFd};

pub fn create(pid: i32, watches: &[InotifyWatch]) -> Result<OwnedFd> {
    // SAFETY: integer arguments.
    let fd = owned(pid, unsafe { libc::inotify_init1(libc::IN_CLOEXEC | libc::IN_NONBLOCK) }, || "creating an inotify instance".into())?;
    let raw = fd.as_raw_fd();
    let root = CString::new("/").map_err(|_| EngineError::restore(pid, "NUL"))?;
    let mut next = 1;
    let mut filled = false;
    for w in watches {
        while next < w.wd {
            // SAFETY: valid path; the watch is removed at once.
            let d = unsafe { libc::inotify_add_watch(raw, root.as_ptr(), libc::IN_ATTRIB) };
            if d < 0 {
                return Err(errno_err(pid, format!("filling inotify watch descriptor {next}")));
            }
            // SAFETY: integer arguments.
            unsafe { libc::inotify_rm_watch(raw, d) };
            next = d + 1;
            filled = true;
        }
        let c = CString::new(w.path.as_str()).map_err(|_| EngineError::restore(pid, format!("inotify path {:?} has a NUL byte", w.path)))?;
        // SAFETY: valid path and mask.
        let d = unsafe { libc::inotify_add_watch(raw, c.as_ptr(), w.mask) };
        if d < 0 {
            return Err(errno_err(pid, format!("watching {} (inotify watch {})", w.path, w.wd)));
        }
        if d != w.wd {
            return Err(EngineError::restore(pid, format!("inotify watch on {} came back as descriptor {d}, not {}", w.path, w.wd)));
        }
        next = d + 1;
    }
    if filled {
        let mut buf = [0u8; 4096];
        // SAFETY: reading into our buffer from our non-blocking descriptor.
        while unsafe { libc::read(raw, buf.as_mut_ptr().cast(), buf.len()) } > 0 {}
    }
    Ok(fd)
}
