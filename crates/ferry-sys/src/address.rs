//! The service address that follows a migrated process: adding, removing
//! and finding an interface address over rtnetlink (RTM_NEWADDR,
//! RTM_DELADDR, RTM_GETADDR), in the calling thread's network namespace.
//!
//! Every change is acknowledged by the kernel before the call returns, so
//! when `del_address` returns Ok the source host no longer answers for the
//! address, and when `add_address` returns Ok the destination host does.
//! A refusal carries the kernel's errno (EADDRNOTAVAIL for an address that
//! is not there, ENODEV for an interface that does not exist, EEXIST for
//! an address that is already there).

use crate::rtnl::{self, Msg};
use crate::{last_error, SysError, SysResult};
use std::ffi::CString;
use std::net::IpAddr;

const IFA_ADDRESS: u16 = 1;
const IFA_LOCAL: u16 = 2;
const IFA_FLAGS: u16 = 8;
/// No duplicate address detection: an IPv6 address is usable (not
/// "tentative") at once, which a migration freeze cannot wait a second for.
const IFA_F_NODAD: u32 = 0x02;
/// `struct ifaddrmsg` is 8 bytes: family, prefixlen, flags, scope, index.
const IFADDRMSG_LEN: usize = 8;

fn family_and_bytes(addr: IpAddr) -> (u8, Vec<u8>) {
    match addr {
        IpAddr::V4(a) => (libc::AF_INET as u8, a.octets().to_vec()),
        IpAddr::V6(a) => (libc::AF_INET6 as u8, a.octets().to_vec()),
    }
}

fn ifaddrmsg(family: u8, prefix: u8, flags: u8, ifindex: u32) -> [u8; IFADDRMSG_LEN] {
    let mut h = [0u8; IFADDRMSG_LEN];
    h[0] = family;
    h[1] = prefix;
    h[2] = flags;
    h[3] = 0; // RT_SCOPE_UNIVERSE: a service address is reachable from other hosts
    h[4..8].copy_from_slice(&ifindex.to_ne_bytes());
    h
}

fn check_prefix(addr: IpAddr, prefix: u8, call: &'static str) -> SysResult<()> {
    let max = if addr.is_ipv4() { 32 } else { 128 };
    if prefix > max {
        return Err(SysError::new(call, libc::EINVAL));
    }
    Ok(())
}

fn address_msg(
    msg_type: u16,
    flags: u16,
    ifindex: u32,
    addr: IpAddr,
    prefix: u8,
    ifa_flags: u32,
) -> Msg {
    let (family, bytes) = family_and_bytes(addr);
    // The header's flags byte holds the low 8 bits; IFA_FLAGS the full set.
    let mut msg = Msg::new(msg_type, flags, &ifaddrmsg(family, prefix, ifa_flags as u8, ifindex));
    // IFA_LOCAL is the interface's own address; IFA_ADDRESS is the peer on
    // a point-to-point link and the same address otherwise. Giving both
    // the same value is what `ip addr add` does on a broadcast link.
    msg.attr(IFA_LOCAL, &bytes);
    msg.attr(IFA_ADDRESS, &bytes);
    if ifa_flags != 0 {
        msg.attr(IFA_FLAGS, &ifa_flags.to_ne_bytes());
    }
    msg
}

/// Adds `addr/prefix` to interface `ifindex` of the calling thread's
/// network namespace. An IPv6 address is added with IFA_F_NODAD so that it
/// can be bound and announced at once. Fails with EEXIST when the address
/// is already on the interface.
pub fn add_address(ifindex: u32, addr: IpAddr, prefix: u8) -> SysResult<()> {
    const CALL: &str = "rtnetlink RTM_NEWADDR";
    check_prefix(addr, prefix, CALL)?;
    let ifa_flags = if addr.is_ipv6() { IFA_F_NODAD } else { 0 };
    let flags = rtnl::NLM_F_REQUEST | rtnl::NLM_F_ACK | rtnl::NLM_F_CREATE | rtnl::NLM_F_EXCL;
    rtnl::request(address_msg(rtnl::RTM_NEWADDR, flags, ifindex, addr, prefix, ifa_flags), CALL)
}

/// Removes `addr/prefix` from interface `ifindex`. Fails with
/// EADDRNOTAVAIL when the address is not on that interface.
pub fn del_address(ifindex: u32, addr: IpAddr, prefix: u8) -> SysResult<()> {
    const CALL: &str = "rtnetlink RTM_DELADDR";
    check_prefix(addr, prefix, CALL)?;
    rtnl::request(
        address_msg(
            rtnl::RTM_DELADDR,
            rtnl::NLM_F_REQUEST | rtnl::NLM_F_ACK,
            ifindex,
            addr,
            prefix,
            0,
        ),
        CALL,
    )
}

/// The interface (index) and prefix length `addr` is configured with in
/// the calling thread's network namespace, None when it is not there.
pub fn find_address(addr: IpAddr) -> SysResult<Option<(u32, u8)>> {
    const CALL: &str = "rtnetlink RTM_GETADDR";
    let (family, want) = family_and_bytes(addr);
    let mut found = None;
    rtnl::dump(
        || {
            Msg::new(
                rtnl::RTM_GETADDR,
                rtnl::NLM_F_REQUEST | rtnl::NLM_F_DUMP,
                &ifaddrmsg(family, 0, 0, 0),
            )
        },
        rtnl::RTM_NEWADDR,
        CALL,
        |payload| {
            if found.is_some() || payload.len() < IFADDRMSG_LEN || payload[0] != family {
                return;
            }
            let attrs = rtnl::attrs(payload, IFADDRMSG_LEN);
            // IFA_LOCAL, when present, is the host's own address (IFA_ADDRESS
            // may then be a point-to-point peer); IPv6 usually has only IFA_ADDRESS.
            let local = attrs
                .iter()
                .find(|(t, _)| *t == IFA_LOCAL)
                .or_else(|| attrs.iter().find(|(t, _)| *t == IFA_ADDRESS));
            if let Some((_, v)) = local {
                if *v == want.as_slice() {
                    found = Some((rtnl::u32_at(payload, 4), payload[1]));
                }
            }
        },
    )?;
    Ok(found)
}

/// Sets interface `ifindex` up (RTM_NEWLINK with IFF_UP), in the calling
/// thread's network namespace: a new namespace's loopback starts down,
/// without 127.0.0.1 or ::1.
pub fn set_link_up(ifindex: u32) -> SysResult<()> {
    const CALL: &str = "rtnetlink RTM_NEWLINK";
    const IFINFOMSG_LEN: usize = 16;
    let index = i32::try_from(ifindex).map_err(|_| SysError::new(CALL, libc::ENODEV))?;
    let up = libc::IFF_UP as u32;
    // `struct ifinfomsg`: family, pad, type, index, flags, change (the
    // flags to change: IFF_UP only).
    let mut h = [0u8; IFINFOMSG_LEN];
    h[4..8].copy_from_slice(&index.to_ne_bytes());
    h[8..12].copy_from_slice(&up.to_ne_bytes());
    h[12..16].copy_from_slice(&up.to_ne_bytes());
    rtnl::request(Msg::new(rtnl::RTM_NEWLINK, rtnl::NLM_F_REQUEST | rtnl::NLM_F_ACK, &h), CALL)
}

/// The index of interface `name` in the calling thread's network namespace.
pub fn interface_index(name: &str) -> SysResult<u32> {
    const CALL: &str = "if_nametoindex";
    let c = CString::new(name).map_err(|_| SysError::new(CALL, libc::EINVAL))?;
    // SAFETY: c is a NUL-terminated string alive for the call; the function
    // returns 0 and sets errno on failure.
    let index = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if index == 0 {
        return Err(last_error(CALL));
    }
    Ok(index)
}

/// The hardware (MAC) address and ARPHRD link type of interface `ifindex`
/// (RTM_GETLINK), in the calling thread's network namespace.
pub fn interface_hwaddr(ifindex: u32) -> SysResult<(u16, Vec<u8>)> {
    const CALL: &str = "rtnetlink RTM_GETLINK";
    const IFLA_ADDRESS: u16 = 1;
    // `struct ifinfomsg` is 16 bytes: family, pad, type, index, flags, change.
    const IFINFOMSG_LEN: usize = 16;
    let index = i32::try_from(ifindex).map_err(|_| SysError::new(CALL, libc::ENODEV))?;
    let mut found = None;
    rtnl::dump(
        || {
            let mut h = [0u8; IFINFOMSG_LEN];
            h[4..8].copy_from_slice(&index.to_ne_bytes());
            Msg::new(rtnl::RTM_GETLINK, rtnl::NLM_F_REQUEST, &h)
        },
        rtnl::RTM_NEWLINK,
        CALL,
        |payload| {
            if payload.len() < IFINFOMSG_LEN || rtnl::u32_at(payload, 4) != ifindex {
                return;
            }
            let link_type = rtnl::u16_at(payload, 2);
            let mac = rtnl::attrs(payload, IFINFOMSG_LEN)
                .into_iter()
                .find(|(t, _)| *t == IFLA_ADDRESS)
                .map(|(_, v)| v.to_vec());
            found = Some((link_type, mac.unwrap_or_default()));
        },
    )?;
    found.ok_or(SysError::new(CALL, libc::ENODEV))
}
