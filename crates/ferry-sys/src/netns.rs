//! Network namespace and mount helpers for the network lock: entering a
//! namespace on the calling thread, listing its interfaces, keeping an nsfs
//! file reachable with a bind mount, and mounting bpffs.

use crate::{last_error, SysResult};
use std::ffi::{CStr, CString};
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// `BPF_FS_MAGIC` from include/uapi/linux/magic.h.
const BPF_FS_MAGIC: i64 = 0xcafe4a11;

fn c_path(path: &Path, call: &'static str) -> SysResult<CString> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| crate::SysError::new(call, libc::EINVAL))
}

/// Moves the calling thread (only it) into the network namespace `ns` (an
/// open nsfs file such as /proc/PID/ns/net or /run/netns/NAME).
pub fn enter_net_namespace(ns: BorrowedFd<'_>) -> SysResult<()> {
    enter_net_namespace_fd(ns.as_raw_fd())
}

/// [`enter_net_namespace`] for a descriptor number the caller holds open
/// (e.g. one inherited across fork).
pub fn enter_net_namespace_fd(ns: RawFd) -> SysResult<()> {
    // SAFETY: setns only reads the descriptor; CLONE_NEWNET affects the
    // calling thread alone and is allowed in a multi-threaded process.
    if unsafe { libc::setns(ns, libc::CLONE_NEWNET) } < 0 {
        return Err(last_error("setns(CLONE_NEWNET)"));
    }
    Ok(())
}

/// Moves the calling thread (only it) into a new, empty network namespace
/// (unshare(CLONE_NEWNET)); the other threads stay where they are.
pub fn enter_new_net_namespace() -> SysResult<()> {
    // SAFETY: unshare takes a flags word; CLONE_NEWNET changes the calling
    // thread's own namespace and is allowed in a multi-threaded process.
    if unsafe { libc::unshare(libc::CLONE_NEWNET) } < 0 {
        return Err(last_error("unshare(CLONE_NEWNET)"));
    }
    Ok(())
}

/// Every network interface (index, name) of the calling thread's network
/// namespace, as `if_nameindex(3)` reports it (over netlink, so it follows
/// the thread's namespace, unlike /sys/class/net).
pub fn interfaces() -> SysResult<Vec<(u32, String)>> {
    // SAFETY: if_nameindex has no preconditions; it returns NULL on error.
    let list = unsafe { libc::if_nameindex() };
    if list.is_null() {
        return Err(last_error("if_nameindex"));
    }
    let mut out = Vec::new();
    let mut entry = list;
    // SAFETY: the array is terminated by an entry with index 0 and a NULL
    // name; every name before it is a valid NUL-terminated string. The loop
    // stops at the terminator, and the array is freed once, after the loop.
    unsafe {
        while (*entry).if_index != 0 && !(*entry).if_name.is_null() {
            out.push((
                (*entry).if_index,
                CStr::from_ptr((*entry).if_name).to_string_lossy().into_owned(),
            ));
            entry = entry.add(1);
        }
        libc::if_freenameindex(list);
    }
    Ok(out)
}

/// Bind-mounts `source` (e.g. /proc/PID/ns/net) onto the existing file
/// `target`, which then keeps the namespace alive and enterable after the
/// process it belongs to is gone.
pub fn bind_mount(source: &Path, target: &Path) -> SysResult<()> {
    let src = c_path(source, "mount(MS_BIND)")?;
    let dst = c_path(target, "mount(MS_BIND)")?;
    // SAFETY: both paths are NUL-terminated strings that outlive the call;
    // fstype and data are NULL, which MS_BIND allows.
    if unsafe {
        libc::mount(src.as_ptr(), dst.as_ptr(), std::ptr::null(), libc::MS_BIND, std::ptr::null())
    } < 0
    {
        return Err(last_error("mount(MS_BIND)"));
    }
    Ok(())
}

/// Lazily unmounts whatever is mounted on `target` (MNT_DETACH).
pub fn unmount(target: &Path) -> SysResult<()> {
    let dst = c_path(target, "umount2")?;
    // SAFETY: dst is a NUL-terminated path that outlives the call.
    if unsafe { libc::umount2(dst.as_ptr(), libc::MNT_DETACH) } < 0 {
        return Err(last_error("umount2"));
    }
    Ok(())
}

/// True when `path` is on a bpf filesystem.
pub fn is_bpffs(path: &Path) -> SysResult<bool> {
    let p = c_path(path, "statfs")?;
    // SAFETY: statfs writes into the zeroed struct we own; p outlives the call.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: see above.
    if unsafe { libc::statfs(p.as_ptr(), &mut st) } < 0 {
        return Err(last_error("statfs"));
    }
    Ok(st.f_type as i64 == BPF_FS_MAGIC)
}

/// Mounts a bpf filesystem (mode 0700) on the existing directory `path`.
pub fn mount_bpffs(path: &Path) -> SysResult<()> {
    let dst = c_path(path, "mount(bpf)")?;
    // SAFETY: all strings are NUL-terminated literals or dst, alive for the call.
    let r = unsafe {
        libc::mount(
            c"bpf".as_ptr(),
            dst.as_ptr(),
            c"bpf".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            c"mode=0700".as_ptr().cast(),
        )
    };
    if r < 0 {
        return Err(last_error("mount(bpf)"));
    }
    Ok(())
}

/// Every IPv4 and IPv6 address configured in the calling thread's network
/// namespace (getifaddrs(3), which asks over netlink).
pub fn addresses() -> SysResult<Vec<std::net::IpAddr>> {
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: list is a valid out pointer; freed with freeifaddrs below.
    if unsafe { libc::getifaddrs(&mut list) } < 0 {
        return Err(last_error("getifaddrs"));
    }
    let mut out = Vec::new();
    let mut entry = list;
    // SAFETY: a NULL-terminated linked list from getifaddrs; each ifa_addr
    // is NULL or points to a sockaddr of the family it names.
    unsafe {
        while !entry.is_null() {
            let a = (*entry).ifa_addr;
            if !a.is_null() {
                match (*a).sa_family as i32 {
                    libc::AF_INET => {
                        let sin = &*(a as *const libc::sockaddr_in);
                        out.push(std::net::IpAddr::V4(std::net::Ipv4Addr::from(u32::from_be(
                            sin.sin_addr.s_addr,
                        ))));
                    }
                    libc::AF_INET6 => {
                        let sin6 = &*(a as *const libc::sockaddr_in6);
                        out.push(std::net::IpAddr::V6(std::net::Ipv6Addr::from(
                            sin6.sin6_addr.s6_addr,
                        )));
                    }
                    _ => {}
                }
            }
            entry = (*entry).ifa_next;
        }
        libc::freeifaddrs(list);
    }
    Ok(out)
}

/// In a fresh mount namespace: makes every mount a slave of the parent
/// namespace (mounts made here stay here, the parent's still show up),
/// then mounts a /proc of the caller's PID namespace over /proc.
pub fn mount_own_proc() -> SysResult<()> {
    // SAFETY: mount(2) with static NUL-terminated strings.
    if unsafe {
        libc::mount(
            c"none".as_ptr(),
            c"/".as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_SLAVE,
            std::ptr::null(),
        )
    } < 0
    {
        return Err(last_error("mount(/, MS_REC | MS_SLAVE)"));
    }
    let flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
    // SAFETY: as above.
    if unsafe {
        libc::mount(c"proc".as_ptr(), c"/proc".as_ptr(), c"proc".as_ptr(), flags, std::ptr::null())
    } < 0
    {
        return Err(last_error("mount(proc, /proc)"));
    }
    Ok(())
}

/// In a mount namespace made a slave by [`mount_own_proc`]: mounts a new
/// devpts instance over /dev/pts and binds its ptmx over /dev/ptmx, so
/// pseudo-terminals made here take numbers of their own (the parent
/// namespace's ptys keep theirs and are not seen).
pub fn mount_own_devpts() -> SysResult<()> {
    let flags = libc::MS_NOSUID | libc::MS_NOEXEC;
    // SAFETY: mount(2) with static NUL-terminated strings.
    if unsafe {
        libc::mount(
            c"devpts".as_ptr(),
            c"/dev/pts".as_ptr(),
            c"devpts".as_ptr(),
            flags,
            c"newinstance,ptmxmode=0666,mode=0620".as_ptr().cast(),
        )
    } < 0
    {
        return Err(last_error("mount(devpts, /dev/pts, newinstance)"));
    }
    bind_mount(Path::new("/dev/pts/ptmx"), Path::new("/dev/ptmx"))
}

/// `SO_NETNS_COOKIE` from include/uapi/asm-generic/socket.h (Linux 5.14+).
const SO_NETNS_COOKIE: libc::c_int = 71;

/// The cookie of the calling thread's network namespace: a 64-bit number
/// the kernel never gives to another namespace while it runs (an inode
/// number is reused once a namespace is gone).
pub fn netns_cookie() -> SysResult<u64> {
    // SAFETY: plain socket(2) call; the fd is owned below.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(last_error("socket(AF_UNIX) for SO_NETNS_COOKIE"));
    }
    use std::os::fd::FromRawFd;
    // SAFETY: fd was just returned by socket(2) and is owned by nobody else.
    let socket = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
    let mut cookie: u64 = 0;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: cookie and len are live stack values of the sizes given.
    let ret = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_NETNS_COOKIE,
            (&mut cookie as *mut u64).cast(),
            &mut len,
        )
    };
    if ret < 0 {
        return Err(last_error("getsockopt(SO_NETNS_COOKIE)"));
    }
    Ok(cookie)
}
