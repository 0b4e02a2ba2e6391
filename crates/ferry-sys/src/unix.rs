//! Unix socket messages with their ancillary data: SCM_RIGHTS
//! descriptors and SCM_CREDENTIALS, read (or peeked) and sent with
//! recvmsg/sendmsg.

use crate::{last_error, SysResult};
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

/// The most descriptors one message carries (SCM_MAX_FD).
pub const MAX_FDS: usize = 253;
const CTRL_LEN: usize = 4096;

/// Sender credentials as `struct ucred` carries them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Creds {
    pub pid: i32,
    pub uid: u32,
    pub gid: u32,
}

/// One message received with recvmsg.
#[derive(Debug)]
pub struct Message {
    /// Bytes written into the buffer.
    pub len: usize,
    /// SCM_RIGHTS descriptors, now installed in this process (close-on-exec).
    pub fds: Vec<OwnedFd>,
    pub creds: Option<Creds>,
    /// MSG_CTRUNC: some ancillary data did not fit (and was lost).
    pub truncated: bool,
}

/// recvmsg(2) with room for every descriptor one message can carry and
/// credentials; MSG_CMSG_CLOEXEC is added to `flags`. Ok(None) when
/// nothing is queued (EAGAIN).
pub fn recv(fd: RawFd, buf: &mut [u8], flags: i32) -> SysResult<Option<Message>> {
    let mut ctrl = vec![0u64; CTRL_LEN / 8];
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    // SAFETY: msghdr is plain data.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = ctrl.as_mut_ptr().cast();
    msg.msg_controllen = CTRL_LEN;
    // SAFETY: msg points at live buffers of the sizes it gives.
    let n = unsafe { libc::recvmsg(fd, &mut msg, flags | libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        let e = last_error("recvmsg");
        if e.errno == libc::EAGAIN {
            return Ok(None);
        }
        return Err(e);
    }
    let mut out = Message {
        len: n as usize,
        fds: Vec::new(),
        creds: None,
        truncated: msg.msg_flags & libc::MSG_CTRUNC != 0,
    };
    // SAFETY: walking the control buffer the kernel filled; every header
    // and its data lie inside msg_controllen bytes (CMSG_NXTHDR checks).
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            let data = libc::CMSG_DATA(c);
            let len = ((*c).cmsg_len as usize).saturating_sub(libc::CMSG_LEN(0) as usize);
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                for i in 0..len / 4 {
                    let raw = std::ptr::read_unaligned((data as *const i32).add(i));
                    // The kernel just installed it for us.
                    out.fds.push(OwnedFd::from_raw_fd(raw));
                }
            } else if (*c).cmsg_level == libc::SOL_SOCKET
                && (*c).cmsg_type == libc::SCM_CREDENTIALS
                && len >= std::mem::size_of::<libc::ucred>()
            {
                let u = std::ptr::read_unaligned(data as *const libc::ucred);
                out.creds = Some(Creds { pid: u.pid, uid: u.uid, gid: u.gid });
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    Ok(Some(out))
}

/// sendmsg(2) of `data` with `fds` (SCM_RIGHTS, at most [`MAX_FDS`]) and
/// explicit credentials (SCM_CREDENTIALS; another pid, uid or gid than
/// the caller's needs CAP_SYS_ADMIN, CAP_SETUID, CAP_SETGID). Returns the
/// bytes sent.
pub fn send(
    fd: RawFd,
    data: &[u8],
    fds: &[RawFd],
    creds: Option<Creds>,
    flags: i32,
) -> SysResult<usize> {
    if fds.len() > MAX_FDS {
        return Err(crate::SysError::new("sendmsg(SCM_RIGHTS)", libc::EINVAL));
    }
    let mut ctrl = vec![0u64; CTRL_LEN / 8];
    let mut iov = libc::iovec { iov_base: data.as_ptr() as *mut libc::c_void, iov_len: data.len() };
    // SAFETY: msghdr is plain data.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    // SAFETY: CMSG_SPACE is arithmetic; the headers are written inside
    // `ctrl` (4096 bytes, more than 253 descriptors and one ucred need),
    // at offsets CMSG_FIRSTHDR/CMSG_NXTHDR compute from msg_controllen.
    unsafe {
        let rights =
            if fds.is_empty() { 0 } else { libc::CMSG_SPACE((fds.len() * 4) as u32) as usize };
        let cred = if creds.is_some() {
            libc::CMSG_SPACE(std::mem::size_of::<libc::ucred>() as u32) as usize
        } else {
            0
        };
        let used = rights + cred;
        if used > 0 {
            msg.msg_control = ctrl.as_mut_ptr().cast();
            msg.msg_controllen = used;
            let mut c = libc::CMSG_FIRSTHDR(&msg);
            if !fds.is_empty() {
                (*c).cmsg_level = libc::SOL_SOCKET;
                (*c).cmsg_type = libc::SCM_RIGHTS;
                (*c).cmsg_len = libc::CMSG_LEN((fds.len() * 4) as u32) as usize;
                let d = libc::CMSG_DATA(c) as *mut i32;
                for (i, f) in fds.iter().enumerate() {
                    std::ptr::write_unaligned(d.add(i), *f);
                }
                c = libc::CMSG_NXTHDR(&msg, c);
            }
            if let Some(k) = creds {
                (*c).cmsg_level = libc::SOL_SOCKET;
                (*c).cmsg_type = libc::SCM_CREDENTIALS;
                (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<libc::ucred>() as u32) as usize;
                std::ptr::write_unaligned(
                    libc::CMSG_DATA(c) as *mut libc::ucred,
                    libc::ucred { pid: k.pid, uid: k.uid, gid: k.gid },
                );
            }
        }
    }
    // SAFETY: msg points at live buffers.
    let n = unsafe { libc::sendmsg(fd, &msg, flags) };
    if n < 0 {
        return Err(last_error("sendmsg"));
    }
    Ok(n as usize)
}
