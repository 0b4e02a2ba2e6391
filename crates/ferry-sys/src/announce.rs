//! Telling the hosts of an L2 segment that an address moved: a gratuitous
//! ARP for IPv4 and an unsolicited neighbour advertisement for IPv6, sent
//! from the host that now holds the address, so that neighbours replace
//! the old host's MAC in their caches without first timing out.
//!
//! Receivers only update an entry they already hold (Linux's default
//! arp_accept=0 and accept_untracked_na=0): that is exactly the case of a
//! client that was talking to the service. Each call sends one round; a
//! caller on a lossy segment may repeat it (RFC 4861 suggests up to 3).

use crate::address::interface_hwaddr;
use crate::{last_error, SysError, SysResult};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

const ARPHRD_ETHER: u16 = 1;
const ETH_P_ARP: u16 = 0x0806;
const ETH_P_IP: u16 = 0x0800;
const ARPOP_REQUEST: u16 = 1;
const ARPOP_REPLY: u16 = 2;
const ND_NEIGHBOR_ADVERT: u8 = 136;
/// The Override flag (first byte of the NA's flags word): the receiver
/// replaces the link-layer address it has cached.
const NA_FLAG_OVERRIDE: u8 = 0x20;
const ND_OPT_TARGET_LINKADDR: u8 = 2;

/// The Ethernet MAC of `ifindex`; announcing only makes sense on an
/// Ethernet-like link (veth, bridge, physical NIC).
fn ethernet_mac(ifindex: u32, call: &'static str) -> SysResult<[u8; 6]> {
    let (link_type, mac) = interface_hwaddr(ifindex)?;
    if link_type != ARPHRD_ETHER || mac.len() != 6 {
        return Err(SysError::new(call, libc::EOPNOTSUPP));
    }
    let mut out = [0u8; 6];
    out.copy_from_slice(&mac);
    Ok(out)
}

fn new_socket(family: i32, kind: i32, protocol: i32, call: &'static str) -> SysResult<OwnedFd> {
    // SAFETY: plain socket(2) with integer arguments.
    let raw = unsafe { libc::socket(family, kind | libc::SOCK_CLOEXEC, protocol) };
    if raw < 0 {
        return Err(last_error(call));
    }
    // SAFETY: raw is a new descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// An ARP packet with its Ethernet header, broadcast, announcing that
/// `addr` is at `mac` (sender = target = addr, which receivers treat as
/// gratuitous).
fn arp_frame(op: u16, mac: [u8; 6], addr: Ipv4Addr) -> Vec<u8> {
    let mut f = Vec::with_capacity(42);
    f.extend_from_slice(&[0xff; 6]); // destination: broadcast
    f.extend_from_slice(&mac);
    f.extend_from_slice(&ETH_P_ARP.to_be_bytes());
    f.extend_from_slice(&ARPHRD_ETHER.to_be_bytes());
    f.extend_from_slice(&ETH_P_IP.to_be_bytes());
    f.push(6);
    f.push(4);
    f.extend_from_slice(&op.to_be_bytes());
    f.extend_from_slice(&mac);
    f.extend_from_slice(&addr.octets());
    // Linux accepts a gratuitous reply only when target MAC == sender MAC;
    // a request's target MAC is ignored and conventionally zero.
    f.extend_from_slice(&if op == ARPOP_REPLY { mac } else { [0; 6] });
    f.extend_from_slice(&addr.octets());
    f
}

/// Broadcasts a gratuitous ARP for `addr` out of interface `ifindex`, in
/// both forms (a request, then a reply), since some hosts and switches
/// heed only one of them.
pub fn gratuitous_arp(ifindex: u32, addr: Ipv4Addr) -> SysResult<()> {
    gratuitous_arp_keep_socket(ifindex, addr).map(drop)
}

/// [`gratuitous_arp`], returning the packet socket instead of closing
/// it: closing a packet socket waits for an RCU grace period (tens of ms
/// on a busy machine), which a caller timing a pause can do afterwards.
pub fn gratuitous_arp_keep_socket(ifindex: u32, addr: Ipv4Addr) -> SysResult<OwnedFd> {
    const CALL: &str = "sendto(AF_PACKET, gratuitous ARP)";
    let mac = ethernet_mac(ifindex, CALL)?;
    // Protocol 0: the socket only sends, so it receives no copy of traffic.
    let sock = new_socket(libc::AF_PACKET, libc::SOCK_RAW, 0, "socket(AF_PACKET)")?;
    // SAFETY: sockaddr_ll is plain data; zero is a valid value for every field.
    let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sll.sll_family = libc::AF_PACKET as u16;
    sll.sll_protocol = ETH_P_ARP.to_be();
    sll.sll_ifindex = i32::try_from(ifindex).map_err(|_| SysError::new(CALL, libc::ENODEV))?;
    sll.sll_halen = 6;
    sll.sll_addr[..6].copy_from_slice(&[0xff; 6]);
    for op in [ARPOP_REQUEST, ARPOP_REPLY] {
        let frame = arp_frame(op, mac, addr);
        // SAFETY: frame and sll are live for the call and their lengths are
        // passed with them; the kernel only reads both.
        let n = unsafe {
            libc::sendto(
                sock.as_raw_fd(),
                frame.as_ptr().cast(),
                frame.len(),
                0,
                (&sll as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if n < 0 {
            return Err(last_error(CALL));
        }
    }
    Ok(sock)
}

fn set_int_opt(
    sock: &OwnedFd,
    level: i32,
    name: i32,
    value: i32,
    call: &'static str,
) -> SysResult<()> {
    // SAFETY: value is a live int and its size is passed with it.
    let r = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            level,
            name,
            (&value as *const i32).cast(),
            std::mem::size_of::<i32>() as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(last_error(call));
    }
    Ok(())
}

fn sockaddr_in6(addr: Ipv6Addr, scope: u32) -> libc::sockaddr_in6 {
    // SAFETY: sockaddr_in6 is plain data; zero is a valid value for every field.
    let mut sa: libc::sockaddr_in6 = unsafe { std::mem::zeroed() };
    sa.sin6_family = libc::AF_INET6 as u16;
    sa.sin6_addr.s6_addr = addr.octets();
    sa.sin6_scope_id = scope;
    sa
}

/// Sends an unsolicited neighbour advertisement for `addr` (type 136,
/// Override set, Solicited clear, with the target link-layer address
/// option) to all nodes (ff02::1) on interface `ifindex`, hop limit 255 as
/// receivers require. The source is `addr` itself, so it must already be
/// on the interface and not tentative (`add_address` uses NODAD).
pub fn unsolicited_na(ifindex: u32, addr: Ipv6Addr) -> SysResult<()> {
    const CALL: &str = "sendto(ICMPv6 neighbour advertisement)";
    let mac = ethernet_mac(ifindex, CALL)?;
    let sock = new_socket(
        libc::AF_INET6,
        libc::SOCK_RAW,
        libc::IPPROTO_ICMPV6,
        "socket(AF_INET6, IPPROTO_ICMPV6)",
    )?;
    let index = i32::try_from(ifindex).map_err(|_| SysError::new(CALL, libc::ENODEV))?;
    set_int_opt(
        &sock,
        libc::IPPROTO_IPV6,
        libc::IPV6_MULTICAST_HOPS,
        255,
        "setsockopt(IPV6_MULTICAST_HOPS)",
    )?;
    set_int_opt(
        &sock,
        libc::IPPROTO_IPV6,
        libc::IPV6_MULTICAST_IF,
        index,
        "setsockopt(IPV6_MULTICAST_IF)",
    )?;
    // The advertisement's source is the announced address: an address of
    // the sending interface, valid as an NA source (RFC 4861 7.1.2), and
    // usable before the interface's link-local address has finished DAD.
    let src = sockaddr_in6(addr, 0);
    // SAFETY: src is a live sockaddr_in6 and its size is passed with it.
    if unsafe {
        libc::bind(
            sock.as_raw_fd(),
            (&src as *const libc::sockaddr_in6).cast(),
            std::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t,
        )
    } < 0
    {
        return Err(last_error("bind(ICMPv6 socket to the announced address)"));
    }
    let mut na = Vec::with_capacity(32);
    na.push(ND_NEIGHBOR_ADVERT);
    na.push(0); // code
    na.extend_from_slice(&[0, 0]); // checksum: the kernel fills it in for raw ICMPv6
    na.extend_from_slice(&[NA_FLAG_OVERRIDE, 0, 0, 0]);
    na.extend_from_slice(&addr.octets());
    na.push(ND_OPT_TARGET_LINKADDR);
    na.push(1); // option length in units of 8 bytes
    na.extend_from_slice(&mac);
    let dst = sockaddr_in6(Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1), ifindex);
    // SAFETY: na and dst are live for the call and their lengths are passed
    // with them; the kernel only reads both.
    let n = unsafe {
        libc::sendto(
            sock.as_raw_fd(),
            na.as_ptr().cast(),
            na.len(),
            0,
            (&dst as *const libc::sockaddr_in6).cast(),
            std::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t,
        )
    };
    if n < 0 {
        return Err(last_error(CALL));
    }
    Ok(())
}

/// Announces `addr` on interface `ifindex`: a gratuitous ARP for IPv4, an
/// unsolicited neighbour advertisement for IPv6.
/// [`announce`], handing back the socket it used (if closing it may be
/// slow) for the caller to close later.
pub fn announce_keep_socket(ifindex: u32, addr: IpAddr) -> SysResult<Option<OwnedFd>> {
    match addr {
        IpAddr::V4(a) => gratuitous_arp_keep_socket(ifindex, a).map(Some),
        IpAddr::V6(a) => unsolicited_na(ifindex, a).map(|()| None),
    }
}

pub fn announce(ifindex: u32, addr: IpAddr) -> SysResult<()> {
    match addr {
        IpAddr::V4(a) => gratuitous_arp(ifindex, a),
        IpAddr::V6(a) => unsolicited_na(ifindex, a),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arp_frames_are_gratuitous_in_both_forms() {
        let mac = [2, 0, 0, 0, 0, 9];
        let addr = Ipv4Addr::new(10, 1, 2, 100);
        for op in [ARPOP_REQUEST, ARPOP_REPLY] {
            let f = arp_frame(op, mac, addr);
            assert_eq!(f.len(), 42, "Ethernet header + ARP for IPv4");
            assert_eq!(&f[0..6], &[0xff; 6], "broadcast");
            assert_eq!(&f[6..12], &mac);
            assert_eq!(&f[12..14], &[0x08, 0x06]);
            assert_eq!(&f[20..22], &op.to_be_bytes());
            assert_eq!(&f[22..28], &mac, "sender MAC");
            assert_eq!(&f[28..32], &addr.octets(), "sender IP");
            assert_eq!(&f[38..42], &addr.octets(), "target IP = sender IP");
        }
        // Linux takes a gratuitous reply only with target MAC = sender MAC.
        assert_eq!(&arp_frame(ARPOP_REPLY, mac, addr)[32..38], &mac);
    }
}
