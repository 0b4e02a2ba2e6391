//! userfaultfd: write-protect tracking (pre-copy dirty pages) and, for
//! post-copy, missing-page handling served from another process.
//!
//! The installed headers are 6.1; WP_ASYNC and WP_UNPOPULATED (6.7) are
//! spelled out here. Every ioctl acts on the address space of the process
//! that created the userfaultfd, not on the caller's: ferry creates it
//! inside the target (an injected `userfaultfd()`), takes it with
//! `pidfd_getfd`, and issues the ioctls from its own side.

use crate::{check, last_error, SysResult};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// The only API version there is (UFFD_API).
pub const UFFD_API: u64 = 0xAA;

/// `userfaultfd()` flag: only faults raised in user mode are handled, which
/// unprivileged callers may ask for when vm.unprivileged_userfaultfd is 0.
pub const UFFD_USER_MODE_ONLY: u64 = 1;

pub const UFFD_FEATURE_PAGEFAULT_FLAG_WP: u64 = 1 << 0;
pub const UFFD_FEATURE_EVENT_FORK: u64 = 1 << 1;
pub const UFFD_FEATURE_EVENT_REMAP: u64 = 1 << 2;
pub const UFFD_FEATURE_EVENT_REMOVE: u64 = 1 << 3;
pub const UFFD_FEATURE_MISSING_HUGETLBFS: u64 = 1 << 4;
pub const UFFD_FEATURE_MISSING_SHMEM: u64 = 1 << 5;
pub const UFFD_FEATURE_EVENT_UNMAP: u64 = 1 << 6;
pub const UFFD_FEATURE_SIGBUS: u64 = 1 << 7;
pub const UFFD_FEATURE_THREAD_ID: u64 = 1 << 8;
/// Pages never touched still get a write-protect marker (6.4+), so a
/// first write to them is seen too.
pub const UFFD_FEATURE_WP_UNPOPULATED: u64 = 1 << 13;
/// A write to a protected page is resolved by the kernel itself (the page
/// is unprotected, nothing is queued, the writer never blocks); (6.7+).
pub const UFFD_FEATURE_WP_ASYNC: u64 = 1 << 15;

pub const UFFDIO_REGISTER_MODE_MISSING: u64 = 1 << 0;
pub const UFFDIO_REGISTER_MODE_WP: u64 = 1 << 1;
pub const UFFDIO_REGISTER_MODE_MINOR: u64 = 1 << 2;

pub const UFFDIO_WRITEPROTECT_MODE_WP: u64 = 1 << 0;
pub const UFFDIO_WRITEPROTECT_MODE_DONTWAKE: u64 = 1 << 1;
pub const UFFDIO_COPY_MODE_DONTWAKE: u64 = 1 << 0;
pub const UFFDIO_COPY_MODE_WP: u64 = 1 << 1;
pub const UFFDIO_ZEROPAGE_MODE_DONTWAKE: u64 = 1 << 0;

/// Bits of the `ioctls` masks UFFDIO_API and UFFDIO_REGISTER return: the
/// ioctl numbers (`_UFFDIO_*`) usable on the fd or on the range.
pub const IOCTL_REGISTER: u64 = 1 << 0x00;
pub const IOCTL_UNREGISTER: u64 = 1 << 0x01;
pub const IOCTL_WAKE: u64 = 1 << 0x02;
pub const IOCTL_COPY: u64 = 1 << 0x03;
pub const IOCTL_ZEROPAGE: u64 = 1 << 0x04;
pub const IOCTL_WRITEPROTECT: u64 = 1 << 0x06;

pub const UFFD_EVENT_PAGEFAULT: u8 = 0x12;
pub const UFFD_EVENT_FORK: u8 = 0x13;
pub const UFFD_EVENT_REMAP: u8 = 0x14;
pub const UFFD_EVENT_REMOVE: u8 = 0x15;
pub const UFFD_EVENT_UNMAP: u8 = 0x16;
pub const UFFD_PAGEFAULT_FLAG_WRITE: u64 = 1 << 0;
pub const UFFD_PAGEFAULT_FLAG_WP: u64 = 1 << 1;
pub const UFFD_PAGEFAULT_FLAG_MINOR: u64 = 1 << 2;

/// _IOWR(0xAA, nr, size)
const fn iowr(nr: u64, size: usize) -> libc::c_ulong {
    ((3u64 << 30) | ((size as u64) << 16) | (0xAA << 8) | nr) as libc::c_ulong
}
/// _IOR(0xAA, nr, size)
const fn ior(nr: u64, size: usize) -> libc::c_ulong {
    ((2u64 << 30) | ((size as u64) << 16) | (0xAA << 8) | nr) as libc::c_ulong
}

#[repr(C)]
#[derive(Default)]
struct UffdioApi {
    api: u64,
    features: u64,
    ioctls: u64,
}

#[repr(C)]
#[derive(Default, Clone, Copy)]
struct UffdioRange {
    start: u64,
    len: u64,
}

#[repr(C)]
#[derive(Default)]
struct UffdioRegister {
    range: UffdioRange,
    mode: u64,
    ioctls: u64,
}

#[repr(C)]
#[derive(Default)]
struct UffdioWriteprotect {
    range: UffdioRange,
    mode: u64,
}

#[repr(C)]
#[derive(Default)]
struct UffdioCopy {
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
    copy: i64,
}

#[repr(C)]
#[derive(Default)]
struct UffdioZeropage {
    range: UffdioRange,
    mode: u64,
    zeropage: i64,
}

const UFFDIO_API: libc::c_ulong = iowr(0x3F, std::mem::size_of::<UffdioApi>());
const UFFDIO_REGISTER: libc::c_ulong = iowr(0x00, std::mem::size_of::<UffdioRegister>());
const UFFDIO_UNREGISTER: libc::c_ulong = ior(0x01, std::mem::size_of::<UffdioRange>());
const UFFDIO_COPY: libc::c_ulong = iowr(0x03, std::mem::size_of::<UffdioCopy>());
const UFFDIO_ZEROPAGE: libc::c_ulong = iowr(0x04, std::mem::size_of::<UffdioZeropage>());
const UFFDIO_WRITEPROTECT: libc::c_ulong = iowr(0x06, std::mem::size_of::<UffdioWriteprotect>());

// The numbers as <linux/userfaultfd.h> computes them.
const _: () = assert!(UFFDIO_API == 0xc018_aa3f);
const _: () = assert!(UFFDIO_REGISTER == 0xc020_aa00);
const _: () = assert!(UFFDIO_UNREGISTER == 0x8010_aa01);
const _: () = assert!(UFFDIO_COPY == 0xc028_aa03);
const _: () = assert!(UFFDIO_ZEROPAGE == 0xc020_aa04);
const _: () = assert!(UFFDIO_WRITEPROTECT == 0xc018_aa06);

/// Creates a userfaultfd for the caller's own address space (the engine
/// makes the target's by injecting the same syscall into it).
pub fn userfaultfd(flags: u64) -> SysResult<OwnedFd> {
    // SAFETY: integer argument only; returns a new descriptor.
    let r = check("userfaultfd", unsafe { libc::syscall(libc::SYS_userfaultfd, flags) })?;
    // SAFETY: r is a new descriptor owned by us.
    Ok(unsafe { OwnedFd::from_raw_fd(r as RawFd) })
}

fn ioctl<T>(
    fd: BorrowedFd<'_>,
    req: libc::c_ulong,
    arg: &mut T,
    call: &'static str,
) -> SysResult<()> {
    // SAFETY: every caller passes the struct that `req` encodes (size
    // checked by the const assertions above); the kernel reads and writes
    // only that struct.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), req as _, arg as *mut T) };
    if r < 0 {
        return Err(last_error(call));
    }
    Ok(())
}

/// What UFFDIO_API granted.
#[derive(Debug, Clone, Copy)]
pub struct Api {
    pub features: u64,
    /// IOCTL_* bits usable on the fd.
    pub ioctls: u64,
}

/// UFFDIO_API: must be the first ioctl on a new fd, exactly once. Fails
/// (EINVAL) when a requested feature is not supported.
pub fn api(fd: BorrowedFd<'_>, features: u64) -> SysResult<Api> {
    let mut a = UffdioApi { api: UFFD_API, features, ioctls: 0 };
    ioctl(fd, UFFDIO_API, &mut a, "ioctl(UFFDIO_API)")?;
    Ok(Api { features: a.features, ioctls: a.ioctls })
}

/// UFFDIO_REGISTER of `[start, start + len)` with `mode`
/// (UFFDIO_REGISTER_MODE_*). Returns the IOCTL_* bits usable on the range.
pub fn register(fd: BorrowedFd<'_>, start: u64, len: u64, mode: u64) -> SysResult<u64> {
    let mut r = UffdioRegister { range: UffdioRange { start, len }, mode, ioctls: 0 };
    ioctl(fd, UFFDIO_REGISTER, &mut r, "ioctl(UFFDIO_REGISTER)")?;
    Ok(r.ioctls)
}

pub fn unregister(fd: BorrowedFd<'_>, start: u64, len: u64) -> SysResult<()> {
    let mut r = UffdioRange { start, len };
    ioctl(fd, UFFDIO_UNREGISTER, &mut r, "ioctl(UFFDIO_UNREGISTER)")
}

/// UFFDIO_WRITEPROTECT: protect (`protect`) or unprotect the range; with
/// WP_ASYNC a later write unprotects a page by itself.
pub fn writeprotect(fd: BorrowedFd<'_>, start: u64, len: u64, protect: bool) -> SysResult<()> {
    let mode = if protect { UFFDIO_WRITEPROTECT_MODE_WP } else { 0 };
    let mut w = UffdioWriteprotect { range: UffdioRange { start, len }, mode };
    ioctl(fd, UFFDIO_WRITEPROTECT, &mut w, "ioctl(UFFDIO_WRITEPROTECT)")
}

/// UFFDIO_COPY: fills the missing pages at `dst` (in the fd's address
/// space) with `src` (in ours) and wakes the faulting threads unless
/// DONTWAKE. Returns the bytes copied; a partial copy (EAGAIN after some
/// progress, the layout changed meanwhile) returns the count so far.
pub fn copy(fd: BorrowedFd<'_>, dst: u64, src: &[u8], mode: u64) -> SysResult<u64> {
    let mut c = UffdioCopy { dst, src: src.as_ptr() as u64, len: src.len() as u64, mode, copy: 0 };
    match ioctl(fd, UFFDIO_COPY, &mut c, "ioctl(UFFDIO_COPY)") {
        Ok(()) => Ok(c.copy as u64),
        Err(e) if e.errno == libc::EAGAIN && c.copy > 0 => Ok(c.copy as u64),
        Err(e) => Err(e),
    }
}

/// UFFDIO_ZEROPAGE: maps zero pages over the missing range.
pub fn zeropage(fd: BorrowedFd<'_>, start: u64, len: u64, mode: u64) -> SysResult<u64> {
    let mut z = UffdioZeropage { range: UffdioRange { start, len }, mode, zeropage: 0 };
    match ioctl(fd, UFFDIO_ZEROPAGE, &mut z, "ioctl(UFFDIO_ZEROPAGE)") {
        Ok(()) => Ok(z.zeropage as u64),
        Err(e) if e.errno == libc::EAGAIN && z.zeropage > 0 => Ok(z.zeropage as u64),
        Err(e) => Err(e),
    }
}

/// One message read from a userfaultfd (`struct uffd_msg`, 32 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Msg {
    /// A fault: UFFD_PAGEFAULT_FLAG_* flags, the address, the faulting
    /// thread (with UFFD_FEATURE_THREAD_ID, else 0).
    PageFault { flags: u64, address: u64, tid: u32 },
    /// Any other event: its number and the 24 bytes of its argument as
    /// three words (fork: the new uffd; remap: from, to, len; remove and
    /// unmap: start, end).
    Other { event: u8, args: [u64; 3] },
}

/// Reads one message; None when none is queued (the fd is O_NONBLOCK).
pub fn read_msg(fd: BorrowedFd<'_>) -> SysResult<Option<Msg>> {
    let mut buf = [0u8; 32];
    // SAFETY: reads at most 32 bytes into a 32-byte buffer.
    let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        let e = last_error("read(userfaultfd)");
        return if e.errno == libc::EAGAIN { Ok(None) } else { Err(e) };
    }
    if n as usize != buf.len() {
        return Err(crate::SysError::new("read(userfaultfd)", libc::EIO));
    }
    let word =
        |i: usize| u64::from_le_bytes(buf[8 + i * 8..16 + i * 8].try_into().unwrap_or([0; 8]));
    Ok(Some(match buf[0] {
        UFFD_EVENT_PAGEFAULT => {
            Msg::PageFault { flags: word(0), address: word(1), tid: word(2) as u32 }
        }
        event => Msg::Other { event, args: [word(0), word(1), word(2)] },
    }))
}

/// Takes ownership of the userfaultfd a UFFD_EVENT_FORK message names
/// (`args[0]`): the kernel installed it in the reader's fd table.
pub fn own_event_fd(raw: u64) -> SysResult<OwnedFd> {
    let fd =
        RawFd::try_from(raw).map_err(|_| crate::SysError::new("UFFD_EVENT_FORK", libc::EBADF))?;
    // SAFETY: F_GETFD only checks that the descriptor is open.
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        return Err(last_error("fcntl(userfaultfd of a fork)"));
    }
    // SAFETY: the kernel made this descriptor for us with the event; nothing
    // else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Waits up to `timeout_ms` (-1: forever) until one of `fds` is readable
/// (or hung up); returns, per fd, whether it is.
pub fn poll_readable(fds: &[BorrowedFd<'_>], timeout_ms: i32) -> SysResult<Vec<bool>> {
    let mut p: Vec<libc::pollfd> = fds
        .iter()
        .map(|f| libc::pollfd { fd: f.as_raw_fd(), events: libc::POLLIN, revents: 0 })
        .collect();
    // SAFETY: p is a valid array of p.len() pollfd structs.
    let r = unsafe { libc::poll(p.as_mut_ptr(), p.len() as libc::nfds_t, timeout_ms) };
    if r < 0 {
        let e = last_error("poll(userfaultfd)");
        if e.errno == libc::EINTR {
            return Ok(vec![false; fds.len()]);
        }
        return Err(e);
    }
    Ok(p.iter().map(|x| x.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0).collect())
}
