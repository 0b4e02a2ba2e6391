//! TCP listeners and UDP sockets: options, bind, listen.

use super::{errno_err, owned};
use crate::error::Result;
use ferry_image::InetSocket;
use std::os::fd::{AsRawFd, OwnedFd};

fn setopt(fd: i32, level: i32, name: i32, value: i32) -> i32 {
    setopt_bytes(fd, level, name, &value.to_ne_bytes())
}

fn setopt_bytes(fd: i32, level: i32, name: i32, value: &[u8]) -> i32 {
    // SAFETY: value is a live buffer of the length passed.
    unsafe { libc::setsockopt(fd, level, name, value.as_ptr().cast(), value.len() as libc::socklen_t) }
}

fn int_of(v: &[u8]) -> i32 {
    v.get(..4).map_or(0, |b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
}

pub fn create(pid: i32, s: &InetSocket) -> Result<OwnedFd> {
    // SAFETY: integer arguments.
    let sock = owned(pid, unsafe { libc::socket(s.family, s.sock_type | libc::SOCK_CLOEXEC, s.protocol) }, || "creating a socket".into())?;
    let fd = sock.as_raw_fd();
    for o in &s.options {
        // The kernel doubles buffer sizes it is given and reports the
        // doubled value: hand back half.
        let r = if o.level == libc::SOL_SOCKET && (o.name == libc::SO_RCVBUF || o.name == libc::SO_SNDBUF) {
            setopt(fd, o.level, o.name, int_of(&o.value) / 2)
        } else {
            setopt_bytes(fd, o.level, o.name, &o.value)
        };
        if r < 0 {
            return Err(errno_err(pid, format!("setting socket option {}/{} to {:?}", o.level, o.name, o.value)));
        }
    }
    let had_reuse = s.options.iter().any(|o| o.level == libc::SOL_SOCKET && o.name == libc::SO_REUSEADDR && int_of(&o.value) != 0);
    // Connections the old process closed may linger in TIME_WAIT on this
    // port; bind through them, then put the option back as it was.
    setopt(fd, libc::SOL_SOCKET, libc::SO_REUSEADDR, 1);
    let (ss, len) = to_sockaddr(s.family, &s.addr, s.port);
    let unbound = s.port == 0 && s.addr.iter().all(|&b| b == 0);
    if !unbound {
        // SAFETY: ss holds a valid address of `len` bytes.
        if unsafe { libc::bind(fd, &ss as *const _ as *const libc::sockaddr, len as u32) } < 0 {
            return Err(errno_err(pid, format!("binding socket to port {}", s.port)));
        }
    }
    if !had_reuse {
        setopt(fd, libc::SOL_SOCKET, libc::SO_REUSEADDR, 0);
    }
    if let Some((paddr, pport)) = &s.peer {
        let (ps, plen) = to_sockaddr(s.family, paddr, *pport);
        // SAFETY: ps holds a valid address of `plen` bytes.
        if unsafe { libc::connect(fd, &ps as *const _ as *const libc::sockaddr, plen as u32) } < 0 {
            return Err(errno_err(pid, format!("connecting UDP socket to port {pport}")));
        }
    }
    if let Some(backlog) = s.listen_backlog {
        // SAFETY: integer arguments.
        if unsafe { libc::listen(fd, backlog) } < 0 {
            return Err(errno_err(pid, format!("listening on port {}", s.port)));
        }
    }
    Ok(sock)
}

fn to_sockaddr(family: i32, addr: &[u8], port: u16) -> (libc::sockaddr_storage, usize) {
    // SAFETY: sockaddr_storage is plain data.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = if family == libc::AF_INET {
        // SAFETY: sockaddr_storage is large enough for sockaddr_in.
        let sin = unsafe { &mut *(&mut ss as *mut _ as *mut libc::sockaddr_in) };
        sin.sin_family = libc::AF_INET as u16;
        sin.sin_port = port.to_be();
        sin.sin_addr.s_addr = u32::from_ne_bytes([addr[0], addr[1], addr[2], addr[3]]);
        std::mem::size_of::<libc::sockaddr_in>()
    } else {
        // SAFETY: sockaddr_storage is large enough for sockaddr_in6.
        let sin6 = unsafe { &mut *(&mut ss as *mut _ as *mut libc::sockaddr_in6) };
        sin6.sin6_family = libc::AF_INET6 as u16;
        sin6.sin6_port = port.to_be();
        sin6.sin6_addr.s6_addr.copy_from_slice(&addr[..16]);
        std::mem::size_of::<libc::sockaddr_in6>()
    };
    (ss, len)
}
