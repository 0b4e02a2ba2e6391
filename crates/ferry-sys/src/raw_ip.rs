//! Raw IP sockets with the header given by the caller (`IPPROTO_RAW`): the
//! network lock hands the packets it kept back to the stack through them.

use crate::{last_error, SysResult};
use std::net::IpAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// A `SOCK_RAW`/`IPPROTO_RAW` socket of one family: every packet sent
/// carries its own IP header (`IP_HDRINCL` is implied, and for IPv6
/// `IPV6_HDRINCL` since Linux 4.5), and is routed by its destination in
/// the namespace the socket was made in.
#[derive(Debug)]
pub struct RawIpSocket {
    fd: OwnedFd,
    v6: bool,
}

impl RawIpSocket {
    /// Opens one for IPv6 (`v6`) or IPv4 in the calling thread's network
    /// namespace.
    pub fn new(v6: bool) -> SysResult<RawIpSocket> {
        let family = if v6 { libc::AF_INET6 } else { libc::AF_INET };
        // SAFETY: plain socket(2) call; the fd is owned below.
        let fd =
            unsafe { libc::socket(family, libc::SOCK_RAW | libc::SOCK_CLOEXEC, libc::IPPROTO_RAW) };
        if fd < 0 {
            return Err(last_error("socket(SOCK_RAW, IPPROTO_RAW)"));
        }
        // SAFETY: fd was just returned by socket(2) and is owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        if v6 {
            let on: libc::c_int = 1;
            // IPV6_HDRINCL (36) is implied for IPPROTO_RAW; set anyway so an
            // older kernel refuses here rather than prepending a header.
            // SAFETY: `on` is a live c_int of the size given.
            let ret = unsafe {
                libc::setsockopt(
                    fd.as_raw_fd(),
                    libc::IPPROTO_IPV6,
                    36,
                    (&on as *const libc::c_int).cast(),
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                )
            };
            if ret < 0 {
                return Err(last_error("setsockopt(IPV6_HDRINCL)"));
            }
        }
        Ok(RawIpSocket { fd, v6 })
    }

    /// Sends `packet` (IP header included) toward `destination`, which must
    /// be the header's destination address.
    pub fn send(&self, packet: &[u8], destination: IpAddr) -> SysResult<()> {
        let ret = match (destination, self.v6) {
            (IpAddr::V4(v4), false) => {
                // SAFETY: sockaddr_in is plain data; zeroed is a valid value.
                let mut sa: libc::sockaddr_in = unsafe { std::mem::zeroed() };
                sa.sin_family = libc::AF_INET as libc::sa_family_t;
                sa.sin_addr.s_addr = u32::from_ne_bytes(v4.octets());
                // SAFETY: packet and sa are live for the call, with the
                // lengths given; the kernel only reads them.
                unsafe {
                    libc::sendto(
                        self.fd.as_raw_fd(),
                        packet.as_ptr().cast(),
                        packet.len(),
                        0,
                        (&sa as *const libc::sockaddr_in).cast(),
                        std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
                    )
                }
            }
            (IpAddr::V6(v6), true) => {
                // SAFETY: sockaddr_in6 is plain data; zeroed is a valid value.
                let mut sa: libc::sockaddr_in6 = unsafe { std::mem::zeroed() };
                sa.sin6_family = libc::AF_INET6 as libc::sa_family_t;
                sa.sin6_addr.s6_addr = v6.octets();
                // SAFETY: as above.
                unsafe {
                    libc::sendto(
                        self.fd.as_raw_fd(),
                        packet.as_ptr().cast(),
                        packet.len(),
                        0,
                        (&sa as *const libc::sockaddr_in6).cast(),
                        std::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t,
                    )
                }
            }
            _ => {
                return Err(crate::SysError::new(
                    "sendto (address family mismatch)",
                    libc::EAFNOSUPPORT,
                ))
            }
        };
        if ret < 0 {
            return Err(last_error("sendto(raw IP)"));
        }
        Ok(())
    }
}
