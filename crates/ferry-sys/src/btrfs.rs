//! btrfs subvolumes: whether a directory is one, and snapshots made and
//! deleted with the filesystem's own ioctls (no `btrfs` process: a
//! replication sync makes its snapshot while the service is frozen).

use crate::{last_error, SysError, SysResult};
use std::ffi::CStr;
use std::os::fd::{AsRawFd, BorrowedFd};

/// statfs f_type of btrfs.
pub const BTRFS_SUPER_MAGIC: i64 = 0x9123_683e;
/// The inode number of every subvolume's root directory.
const FIRST_FREE_OBJECTID: u64 = 256;
const SUBVOL_NAME_MAX: usize = 4039;
const PATH_NAME_MAX: usize = 4087;
/// `BTRFS_SUBVOL_RDONLY`.
const SUBVOL_RDONLY: u64 = 1 << 1;

/// `struct btrfs_ioctl_vol_args`.
#[repr(C)]
struct VolArgs {
    fd: i64,
    name: [u8; PATH_NAME_MAX + 1],
}

/// `struct btrfs_ioctl_vol_args_v2` (the qgroup and id unions unused).
#[repr(C)]
struct VolArgsV2 {
    fd: i64,
    transid: u64,
    flags: u64,
    unused: [u64; 4],
    name: [u8; SUBVOL_NAME_MAX + 1],
}

const BTRFS_IOCTL_MAGIC: u64 = 0x94;

/// `_IOW(BTRFS_IOCTL_MAGIC, nr, T)`.
const fn iow(nr: u64, size: usize) -> u64 {
    (1 << 30) | ((size as u64) << 16) | (BTRFS_IOCTL_MAGIC << 8) | nr
}

const IOC_SNAP_DESTROY: u64 = iow(15, std::mem::size_of::<VolArgs>());
const IOC_SNAP_CREATE_V2: u64 = iow(23, std::mem::size_of::<VolArgsV2>());

/// Whether `dir` (an open directory) is the root of a btrfs subvolume.
pub fn is_subvolume(dir: BorrowedFd<'_>) -> SysResult<bool> {
    // SAFETY: fstatfs and fstat write into zeroed structs we own; the fd
    // is valid for the calls.
    let mut sfs: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: see above.
    if unsafe { libc::fstatfs(dir.as_raw_fd(), &mut sfs) } < 0 {
        return Err(last_error("fstatfs"));
    }
    // SAFETY: see above.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: see above.
    if unsafe { libc::fstat(dir.as_raw_fd(), &mut st) } < 0 {
        return Err(last_error("fstat"));
    }
    Ok(sfs.f_type as i64 == BTRFS_SUPER_MAGIC && st.st_ino == FIRST_FREE_OBJECTID)
}

fn copy_name(dst: &mut [u8], name: &CStr, call: &'static str) -> SysResult<()> {
    let bytes = name.to_bytes();
    if bytes.len() >= dst.len() || bytes.contains(&b'/') || bytes.is_empty() {
        return Err(SysError::new(call, libc::EINVAL));
    }
    dst[..bytes.len()].copy_from_slice(bytes);
    Ok(())
}

/// Snapshots the subvolume `source` as `name` inside the directory
/// `parent` (same filesystem), read-only when `readonly`. The kernel
/// writes the subvolume's dirty data out first and commits a
/// transaction: the snapshot holds every write made before the call.
pub fn snapshot(
    source: BorrowedFd<'_>,
    parent: BorrowedFd<'_>,
    name: &CStr,
    readonly: bool,
) -> SysResult<()> {
    const CALL: &str = "ioctl(BTRFS_IOC_SNAP_CREATE_V2)";
    let mut args = Box::new(VolArgsV2 {
        fd: source.as_raw_fd() as i64,
        transid: 0,
        flags: if readonly { SUBVOL_RDONLY } else { 0 },
        unused: [0; 4],
        name: [0; SUBVOL_NAME_MAX + 1],
    });
    copy_name(&mut args.name, name, CALL)?;
    // SAFETY: `args` is a live, fully initialised vol_args_v2 the kernel
    // only reads; the fds are valid for the call.
    let r =
        unsafe { libc::ioctl(parent.as_raw_fd(), IOC_SNAP_CREATE_V2 as libc::Ioctl, &mut *args) };
    if r < 0 {
        return Err(last_error(CALL));
    }
    Ok(())
}

/// Deletes the subvolume `name` inside the directory `parent` (a
/// read-only snapshot included).
pub fn destroy(parent: BorrowedFd<'_>, name: &CStr) -> SysResult<()> {
    const CALL: &str = "ioctl(BTRFS_IOC_SNAP_DESTROY)";
    let mut args = Box::new(VolArgs { fd: 0, name: [0; PATH_NAME_MAX + 1] });
    copy_name(&mut args.name, name, CALL)?;
    // SAFETY: `args` is a live, fully initialised vol_args the kernel
    // only reads; the fd is valid for the call.
    let r = unsafe { libc::ioctl(parent.as_raw_fd(), IOC_SNAP_DESTROY as libc::Ioctl, &mut *args) };
    if r < 0 {
        return Err(last_error(CALL));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ioctl_numbers_are_the_kernels() {
        // From <linux/btrfs.h>: both argument structs are 4096 bytes.
        assert_eq!(std::mem::size_of::<VolArgs>(), 4096);
        assert_eq!(std::mem::size_of::<VolArgsV2>(), 4096);
        assert_eq!(IOC_SNAP_DESTROY, 0x5000_940f);
        assert_eq!(IOC_SNAP_CREATE_V2, 0x5000_9417);
    }

    #[test]
    fn names_with_a_slash_or_too_long_are_refused() {
        let mut buf = [0u8; 8];
        assert!(copy_name(&mut buf, c"a/b", "t").is_err());
        assert!(copy_name(&mut buf, c"", "t").is_err());
        assert!(copy_name(&mut buf, c"12345678", "t").is_err());
        assert!(copy_name(&mut buf, c"s12", "t").is_ok());
        assert_eq!(&buf[..4], b"s12\0");
    }
}
