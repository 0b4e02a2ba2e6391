//! Small fd-level calls the engine needs on descriptors it owns or took
//! from a target (open, fcntl, lseek, ioctl queries, tee, kcmp), and
//! memfds with their seals.

use crate::{check, last_error, SysResult};
use std::ffi::CStr;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

pub fn fcntl_getfl(fd: BorrowedFd<'_>) -> SysResult<i32> {
    // SAFETY: F_GETFL takes no pointer argument.
    let r = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
    if r < 0 {
        Err(last_error("fcntl(F_GETFL)"))
    } else {
        Ok(r)
    }
}

pub fn fcntl_int(fd: RawFd, cmd: i32, arg: libc::c_long, name: &'static str) -> SysResult<i32> {
    // SAFETY: the commands used with this helper take an integer argument.
    let r = unsafe { libc::fcntl(fd, cmd, arg) };
    if r < 0 {
        Err(last_error(name))
    } else {
        Ok(r)
    }
}

/// The id of the mount `fd`'s file is reached through (statx
/// STATX_MNT_ID): the `mnt_id` its fdinfo shows.
pub fn mount_id(fd: BorrowedFd<'_>) -> SysResult<u64> {
    let mut stx = std::mem::MaybeUninit::<libc::statx>::zeroed();
    // SAFETY: the path is a valid empty C string, AT_EMPTY_PATH makes the
    // call read `fd` itself, and `stx` is a writable statx buffer.
    let r = unsafe {
        libc::statx(
            fd.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            libc::STATX_MNT_ID,
            stx.as_mut_ptr(),
        )
    };
    if r < 0 {
        return Err(last_error("statx(STATX_MNT_ID)"));
    }
    // SAFETY: statx succeeded, so it filled the buffer.
    let stx = unsafe { stx.assume_init() };
    if stx.stx_mask & libc::STATX_MNT_ID == 0 {
        return Err(crate::SysError::new(
            "statx(STATX_MNT_ID): no mount id returned",
            libc::EOPNOTSUPP,
        ));
    }
    Ok(stx.stx_mnt_id)
}

/// Duplicates pipe content from `from` into `to` without consuming it.
pub fn tee(from: RawFd, to: RawFd, len: usize) -> SysResult<usize> {
    // SAFETY: tee takes two fds and plain integers.
    let r = unsafe { libc::tee(from, to, len, libc::SPLICE_F_NONBLOCK) };
    if r < 0 {
        Err(last_error("tee"))
    } else {
        Ok(r as usize)
    }
}

pub fn pipe2(flags: i32) -> SysResult<(OwnedFd, OwnedFd)> {
    let mut fds = [0i32; 2];
    // SAFETY: fds points to two writable ints.
    let r = unsafe { libc::pipe2(fds.as_mut_ptr(), flags) };
    if r < 0 {
        return Err(last_error("pipe2"));
    }
    // SAFETY: the kernel just returned these two new descriptors to us.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Bytes waiting in a pipe or socket receive queue (FIONREAD).
pub fn bytes_readable(fd: RawFd) -> SysResult<usize> {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int.
    let r = unsafe { libc::ioctl(fd, libc::FIONREAD, &mut n) };
    if r < 0 {
        Err(last_error("ioctl(FIONREAD)"))
    } else {
        Ok(n as usize)
    }
}

pub const KCMP_FILE: i32 = 0;

/// Whether two fds of two processes refer to the same open file description.
pub fn kcmp_same_file(pid1: i32, pid2: i32, fd1: RawFd, fd2: RawFd) -> SysResult<bool> {
    // SAFETY: kcmp with KCMP_FILE takes only integers.
    let r = unsafe {
        libc::syscall(
            libc::SYS_kcmp,
            pid1,
            pid2,
            KCMP_FILE,
            fd1 as libc::c_ulong,
            fd2 as libc::c_ulong,
        )
    };
    Ok(check("kcmp", r)? == 0)
}

/// How the kernel orders the open file descriptions behind two fds
/// (kcmp KCMP_FILE): Equal when they are one description. The order is
/// arbitrary but total, so sorting by it puts the fds of one description
/// next to each other.
pub fn kcmp_file_order(
    pid1: i32,
    pid2: i32,
    fd1: RawFd,
    fd2: RawFd,
) -> SysResult<std::cmp::Ordering> {
    // SAFETY: kcmp with KCMP_FILE takes only integers.
    let r = unsafe {
        libc::syscall(
            libc::SYS_kcmp,
            pid1,
            pid2,
            KCMP_FILE,
            fd1 as libc::c_ulong,
            fd2 as libc::c_ulong,
        )
    };
    match check("kcmp", r)? {
        0 => Ok(std::cmp::Ordering::Equal),
        1 => Ok(std::cmp::Ordering::Less),
        2 => Ok(std::cmp::Ordering::Greater),
        _ => Err(crate::SysError { call: "kcmp", errno: libc::EINVAL }),
    }
}

/// Wraps a raw descriptor returned by the kernel.
///
/// # Safety
/// `fd` must be an open descriptor that nothing else owns.
pub unsafe fn own(fd: RawFd) -> OwnedFd {
    // SAFETY: guaranteed by the caller.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// F_GETOWN_EX: (owner type, owner id) of an open file description
/// (F_OWNER_TID 0, F_OWNER_PID 1, F_OWNER_PGRP 2).
pub fn get_owner_ex(fd: RawFd) -> SysResult<(i32, i32)> {
    const F_GETOWN_EX: i32 = 16;
    // struct f_owner_ex { int type; pid_t pid; }
    let mut o = [0i32; 2];
    // SAFETY: F_GETOWN_EX fills one struct f_owner_ex (two ints).
    let r = unsafe { libc::fcntl(fd, F_GETOWN_EX, o.as_mut_ptr()) };
    if r < 0 {
        Err(last_error("fcntl(F_GETOWN_EX)"))
    } else {
        Ok((o[0], o[1]))
    }
}

/// fchmod + fchown of an open file (mode: the 07777 bits).
pub fn set_mode_owner(fd: RawFd, mode: u32, uid: u32, gid: u32) -> SysResult<()> {
    // SAFETY: integer arguments on a descriptor the caller holds.
    if unsafe { libc::fchown(fd, uid, gid) } < 0 {
        return Err(last_error("fchown"));
    }
    // After fchown, which clears set-user-ID and set-group-ID bits.
    // SAFETY: as above.
    if unsafe { libc::fchmod(fd, mode as libc::mode_t) } < 0 {
        return Err(last_error("fchmod"));
    }
    Ok(())
}

/// open_by_handle_at: opens (O_PATH) the file a file handle names, on the
/// filesystem of `mount_fd`. Needs CAP_DAC_READ_SEARCH.
pub fn open_by_handle(mount_fd: RawFd, handle_type: i32, handle: &[u8]) -> SysResult<OwnedFd> {
    // struct file_handle { unsigned int handle_bytes; int handle_type; unsigned char f_handle[]; }
    let mut buf = Vec::with_capacity(8 + handle.len());
    buf.extend_from_slice(&(handle.len() as u32).to_ne_bytes());
    buf.extend_from_slice(&handle_type.to_ne_bytes());
    buf.extend_from_slice(handle);
    // SAFETY: buf is a complete struct file_handle of the size it declares.
    let r = unsafe {
        libc::syscall(
            libc::SYS_open_by_handle_at,
            mount_fd,
            buf.as_mut_ptr(),
            libc::O_PATH | libc::O_CLOEXEC,
        )
    };
    let fd = check("open_by_handle_at", r)?;
    // SAFETY: a new descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// kcmp(KCMP_EPOLL_TFD): whether fd `fd1` of `pid1` is the file that the
/// epoll instance `epfd` of `pid2` watches under fd number `tfd`.
pub fn kcmp_epoll_target(
    pid1: i32,
    fd1: RawFd,
    pid2: i32,
    epfd: RawFd,
    tfd: RawFd,
) -> SysResult<bool> {
    const KCMP_EPOLL_TFD: i32 = 7;
    // struct kcmp_epoll_slot { __u32 efd; __u32 tfd; __u32 toff; }
    let slot: [u32; 3] = [epfd as u32, tfd as u32, 0];
    // SAFETY: the kernel reads one struct kcmp_epoll_slot from the pointer.
    let r = unsafe {
        libc::syscall(
            libc::SYS_kcmp,
            pid1,
            pid2,
            KCMP_EPOLL_TFD,
            fd1 as libc::c_ulong,
            slot.as_ptr() as libc::c_ulong,
        )
    };
    Ok(check("kcmp(KCMP_EPOLL_TFD)", r)? == 0)
}

/// open(2) with O_CLOEXEC added to `flags`; `mode` matters with O_CREAT.
pub fn open(path: &CStr, flags: i32, mode: u32) -> SysResult<OwnedFd> {
    // SAFETY: path is a valid NUL-terminated string that outlives the call.
    let fd = unsafe { libc::open(path.as_ptr(), flags | libc::O_CLOEXEC, mode) };
    if fd < 0 {
        return Err(last_error("open"));
    }
    // SAFETY: a new descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// fcntl(F_DUPFD_CLOEXEC): a duplicate of `fd` at the lowest free number
/// at or above `min`.
pub fn dup_above(fd: RawFd, min: RawFd) -> SysResult<OwnedFd> {
    let high = fcntl_int(fd, libc::F_DUPFD_CLOEXEC, min as libc::c_long, "fcntl(F_DUPFD)")?;
    // SAFETY: F_DUPFD_CLOEXEC just returned this new descriptor to us.
    Ok(unsafe { OwnedFd::from_raw_fd(high) })
}

/// lseek(2); returns the new offset.
pub fn lseek(fd: RawFd, offset: i64, whence: i32) -> SysResult<i64> {
    // SAFETY: integer arguments.
    let r = unsafe { libc::lseek(fd, offset, whence) };
    if r < 0 {
        Err(last_error("lseek"))
    } else {
        Ok(r)
    }
}

/// mknod(2) of a character device node at `path`: `mode` permission bits
/// (less the umask), device number `rdev`.
pub fn mknod_char(path: &CStr, mode: u32, rdev: u64) -> SysResult<()> {
    // SAFETY: path is a valid NUL-terminated string that outlives the call.
    let r = unsafe {
        libc::mknod(
            path.as_ptr(),
            libc::S_IFCHR | (mode & 0o7777) as libc::mode_t,
            rdev as libc::dev_t,
        )
    };
    if r < 0 {
        Err(last_error("mknod"))
    } else {
        Ok(())
    }
}

/// mkfifo(3): a FIFO at `path` with `mode` (less the umask).
pub fn mkfifo(path: &CStr, mode: u32) -> SysResult<()> {
    // SAFETY: path is a valid NUL-terminated string that outlives the call.
    let r = unsafe { libc::mkfifo(path.as_ptr(), mode as libc::mode_t) };
    if r < 0 {
        Err(last_error("mkfifo"))
    } else {
        Ok(())
    }
}

/// close_range(2) of every descriptor from `first` to `last` inclusive.
/// Closes descriptors without regard to who owns them: only for a
/// freshly forked process that is dropping what it inherited.
pub fn close_range(first: u32, last: u32) -> SysResult<()> {
    // SAFETY: integer arguments.
    check("close_range", unsafe { libc::syscall(libc::SYS_close_range, first, last, 0u32) })
        .map(drop)
}

/// memfd_create(2).
pub fn memfd_create(name: &CStr, flags: u32) -> SysResult<OwnedFd> {
    // SAFETY: name is NUL-terminated; flags are plain integers.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), flags) };
    if fd < 0 {
        return Err(last_error("memfd_create"));
    }
    // SAFETY: a new descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// fcntl(F_GET_SEALS): the F_SEAL_* bits of a memfd (EINVAL for a file
/// that does not support sealing).
pub fn get_seals(fd: RawFd) -> SysResult<i32> {
    // SAFETY: F_GET_SEALS takes no argument.
    let r = unsafe { libc::fcntl(fd, libc::F_GET_SEALS) };
    if r < 0 {
        Err(last_error("fcntl(F_GET_SEALS)"))
    } else {
        Ok(r)
    }
}

/// dup2(2): `new` becomes a copy of `old`.
pub fn dup2(old: RawFd, new: RawFd) -> SysResult<()> {
    // SAFETY: integer arguments; `new` is replaced, as the caller asks.
    if unsafe { libc::dup2(old, new) } < 0 {
        return Err(last_error("dup2"));
    }
    Ok(())
}

/// Marks every descriptor from `first` up close-on-exec
/// (close_range(CLOSE_RANGE_CLOEXEC)), falling back to F_SETFD on each
/// open descriptor when the kernel lacks the flag.
pub fn set_cloexec_from(first: RawFd) {
    const CLOSE_RANGE_CLOEXEC: u32 = 1 << 2;
    // SAFETY: with CLOSE_RANGE_CLOEXEC nothing is closed, only FD_CLOEXEC set.
    if unsafe { libc::syscall(libc::SYS_close_range, first as u32, u32::MAX, CLOSE_RANGE_CLOEXEC) }
        == 0
    {
        return;
    }
    let fds: Vec<RawFd> = std::fs::read_dir("/proc/self/fd")
        .map(|d| d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect())
        .unwrap_or_default();
    for fd in fds.into_iter().filter(|&fd| fd >= first) {
        // SAFETY: F_SETFD on a descriptor number; a closed one fails harmlessly.
        unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    }
}

/// poll(2) on `fds` for at most `timeout_ms` (-1: no limit); the number of
/// entries with events, 0 on timeout. Each entry's `revents` is filled in.
pub fn poll(fds: &mut [libc::pollfd], timeout_ms: i32) -> SysResult<usize> {
    // SAFETY: fds is a valid, writable array of fds.len() pollfds.
    let r = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
    if r < 0 {
        return Err(last_error("poll"));
    }
    Ok(r as usize)
}

/// Reads the small file `name` (at most `max` bytes) in the directory
/// `dir`: one openat, one read, one close, with no path walk from the
/// root (a /proc/PID/fdinfo/N read for each of 10,000 descriptors).
pub fn read_small_at(dir: BorrowedFd<'_>, name: &CStr, max: usize) -> SysResult<Vec<u8>> {
    // SAFETY: name is a NUL-terminated string that outlives the call.
    let fd =
        unsafe { libc::openat(dir.as_raw_fd(), name.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(last_error("openat"));
    }
    // SAFETY: openat returned a new descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut buf = vec![0u8; max];
    // SAFETY: buf is writable for `max` bytes.
    let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), max) };
    if n < 0 {
        return Err(last_error("read"));
    }
    buf.truncate(n as usize);
    Ok(buf)
}

/// The target of the symbolic link `name` in the directory `dir`.
pub fn readlink_at(dir: BorrowedFd<'_>, name: &CStr) -> SysResult<Vec<u8>> {
    let mut buf = vec![0u8; libc::PATH_MAX as usize];
    // SAFETY: name is NUL-terminated; buf is writable for its length.
    let n = unsafe {
        libc::readlinkat(dir.as_raw_fd(), name.as_ptr(), buf.as_mut_ptr().cast(), buf.len())
    };
    if n < 0 {
        return Err(last_error("readlinkat"));
    }
    buf.truncate(n as usize);
    Ok(buf)
}

/// Whether the file `fd` lives in memory only (tmpfs, ramfs): its page
/// cache is the file.
pub fn in_memory_fs(fd: BorrowedFd<'_>) -> SysResult<bool> {
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    const RAMFS_MAGIC: i64 = 0x8584_58f6;
    // SAFETY: fstatfs writes into the zeroed struct we own.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: see above; fd is a valid descriptor for the call.
    if unsafe { libc::fstatfs(fd.as_raw_fd(), &mut st) } < 0 {
        return Err(last_error("fstatfs"));
    }
    Ok(matches!(st.f_type as i64, TMPFS_MAGIC | RAMFS_MAGIC))
}

/// The filesystem type (statfs f_type) of what `path` names; through
/// /proc/PID/fd/N that is the file the fd refers to.
pub fn statfs_magic(path: &CStr) -> SysResult<i64> {
    // SAFETY: statfs writes into the zeroed struct we own.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: see above; path is NUL-terminated and outlives the call.
    if unsafe { libc::statfs(path.as_ptr(), &mut st) } < 0 {
        return Err(last_error("statfs"));
    }
    Ok(st.f_type as i64)
}

/// Allocates `len` bytes of `fd` from `offset` (fallocate mode 0), so
/// that writing them later cannot fail for lack of space.
pub fn allocate(fd: BorrowedFd<'_>, offset: u64, len: u64) -> SysResult<()> {
    // SAFETY: fallocate takes an fd and plain integers.
    let r = unsafe { libc::fallocate(fd.as_raw_fd(), 0, offset as i64, len as i64) };
    if r < 0 {
        Err(last_error("fallocate"))
    } else {
        Ok(())
    }
}

/// Swaps the files at `a` and `b` atomically (renameat2 RENAME_EXCHANGE):
/// a reader opening either path sees one file or the other, never none.
/// Both must exist (ENOENT otherwise). Unlike a rename over an existing
/// file, ext4 does not write the new file's data out first (its
/// auto_da_alloc), which costs ~150 us a call on this machine kind.
pub fn rename_exchange(a: &CStr, b: &CStr) -> SysResult<()> {
    rename2(a, b, libc::RENAME_EXCHANGE, "renameat2(RENAME_EXCHANGE)")
}

/// Renames `from` to `to` unless `to` exists (then EEXIST): renameat2
/// RENAME_NOREPLACE, for a directory too (a plain rename would replace an
/// empty directory at `to`).
pub fn rename_noreplace(from: &CStr, to: &CStr) -> SysResult<()> {
    rename2(from, to, libc::RENAME_NOREPLACE, "renameat2(RENAME_NOREPLACE)")
}

fn rename2(a: &CStr, b: &CStr, flags: libc::c_uint, call: &'static str) -> SysResult<()> {
    // SAFETY: two NUL-terminated paths that outlive the call; integer flags.
    let r =
        unsafe { libc::renameat2(libc::AT_FDCWD, a.as_ptr(), libc::AT_FDCWD, b.as_ptr(), flags) };
    if r < 0 {
        return Err(last_error(call));
    }
    Ok(())
}

#[cfg(test)]
mod in_memory_tests {
    use super::in_memory_fs;
    use std::os::fd::AsFd;

    #[test]
    fn tmpfs_is_memory_and_the_build_directory_is_not() {
        let shm = std::path::Path::new("/dev/shm");
        if shm.is_dir() {
            let f = std::fs::File::open(shm).unwrap();
            assert!(in_memory_fs(f.as_fd()).unwrap());
        }
        // Whatever the source tree is on, `stat -f` must agree.
        let f = std::fs::File::open(env!("CARGO_MANIFEST_DIR")).unwrap();
        let st = std::process::Command::new("stat")
            .args(["-f", "-c", "%T", env!("CARGO_MANIFEST_DIR")])
            .output()
            .unwrap();
        let kind = String::from_utf8_lossy(&st.stdout).trim().to_string();
        assert_eq!(in_memory_fs(f.as_fd()).unwrap(), kind == "tmpfs" || kind == "ramfs", "{kind}");
    }
}
