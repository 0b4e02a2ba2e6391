//! File locks, taken again by the new process on its installed fds. The
//! old process must be gone: a lock it still holds makes restore fail.
//! flock and OFD locks belong to the open file description and are taken
//! here, in the child. POSIX record locks belong to the process and die
//! with the close of *any* fd of the file, so they are taken last, after
//! ferry's temporary descriptors are closed ([`posix_lock_calls`]).

use crate::error::{EngineError, Result};
use ferry_image::{FileLock, LockKind};

pub fn take(pid: i32, fd: i32, locks: &[FileLock]) -> Result<()> {
    for l in locks.iter().filter(|l| l.kind != LockKind::Posix) {
        let taken = match l.kind {
            LockKind::Flock => ferry_sys::lock::flock(fd, l.write),
            LockKind::Posix | LockKind::Ofd => {
                let len = l.end.map_or(0, |e| (e + 1 - l.start) as i64);
                ferry_sys::lock::set_record_lock(
                    fd,
                    l.kind == LockKind::Ofd,
                    l.write,
                    l.start as i64,
                    len,
                )
            }
        };
        taken.map_err(|e| {
            EngineError::kernel(
                pid,
                format!("taking a {:?} lock on fd {fd} (bytes {}..{:?})", l.kind, l.start, l.end),
                e,
            )
        })?;
    }
    Ok(())
}

/// struct flock as F_SETLK reads it (x86_64 layout).
fn flock_bytes(l: &FileLock) -> Vec<u8> {
    let mut b = Vec::with_capacity(32);
    let ty = if l.write { libc::F_WRLCK } else { libc::F_RDLCK } as i16;
    b.extend_from_slice(&ty.to_le_bytes());
    b.extend_from_slice(&(libc::SEEK_SET as i16).to_le_bytes());
    b.extend_from_slice(&[0u8; 4]);
    b.extend_from_slice(&(l.start as i64).to_le_bytes());
    b.extend_from_slice(&l.end.map_or(0i64, |e| (e + 1 - l.start) as i64).to_le_bytes());
    b.extend_from_slice(&[0u8; 8]);
    b
}

/// The injected fcntl(F_SETLK) calls for every POSIX lock of the image,
/// with their struct flock arguments laid out from `data`.
pub fn posix_lock_calls(
    image: &ferry_image::ProcessImage,
    data: u64,
) -> (Vec<(String, crate::inject::Call)>, Vec<u8>) {
    let mut calls = Vec::new();
    let mut args = Vec::new();
    let posix = |f: &ferry_image::OpenFile| f.locks.iter().any(|l| l.kind == LockKind::Posix);
    // Only the few files with a lock are looked up among the fds: a
    // search per file is quadratic in a table of 10,000 sockets.
    for (i, f) in image.files.iter().enumerate().filter(|(_, f)| posix(f)) {
        let Some(slot) = image.fds.iter().find(|s| s.file as usize == i) else {
            continue;
        };
        for l in f.locks.iter().filter(|l| l.kind == LockKind::Posix) {
            let at = data + args.len() as u64;
            args.extend(flock_bytes(l));
            calls.push((
                format!("fcntl(fd {}, F_SETLK, bytes {}..{:?})", slot.fd, l.start, l.end),
                crate::inject::Call::new(
                    libc::SYS_fcntl,
                    &[slot.fd as u64, libc::F_SETLK as u64, at],
                ),
            ));
        }
    }
    (calls, args)
}
