//! A peer's FIN given again to a rebuilt connection.
//!
//! TCP repair puts bytes into a receive queue but has no way to put the end
//! of the stream there. A connection whose peer had closed its side
//! (CLOSE_WAIT: the application still holds the socket and will read EOF
//! after the unread data) is rebuilt as established, its receive sequence
//! right before the peer's FIN, and is then handed that FIN as the peer
//! sent it: a segment from the peer's address, through a raw socket in the
//! connection's namespace, which the stack takes like any other. The socket
//! goes to CLOSE_WAIT, its reader gets EOF after the queued data, and the
//! ACK it answers with acknowledges a FIN the peer saw acknowledged before
//! the checkpoint, which the peer ignores.

use crate::held::HeldPacket;
use crate::{NetlockError, Netns};
use std::net::{IpAddr, SocketAddr};

/// The FIN of a connection's peer: from `peer` to `local`, with sequence
/// number `seq` (the receive sequence after the last byte of data),
/// acknowledging `ack` (the first byte the peer had not acknowledged) and
/// advertising `window` (the peer's last window, unscaled, as the header
/// carries it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerFin {
    pub peer: SocketAddr,
    pub local: SocketAddr,
    pub seq: u32,
    pub ack: u32,
    pub window: u16,
}

const TCP_FIN: u8 = 0x01;
const TCP_ACK: u8 = 0x10;
const IPPROTO_TCP: u8 = 6;
/// The TTL (hop limit) of the segment: any value gets it to a local socket.
const TTL: u8 = 64;

/// An address as the wire carries it: a v4-mapped IPv6 address is IPv4.
fn on_the_wire(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// The FIN as an IP packet. The TCP checksum is left zero (the sender
/// computes it, as for every packet it sends again); the IPv4 header
/// checksum is the kernel's. None when the two addresses are not of one
/// family.
pub(crate) fn segment(fin: &PeerFin) -> Option<Vec<u8>> {
    let mut tcp = [0u8; 20];
    tcp[0..2].copy_from_slice(&fin.peer.port().to_be_bytes());
    tcp[2..4].copy_from_slice(&fin.local.port().to_be_bytes());
    tcp[4..8].copy_from_slice(&fin.seq.to_be_bytes());
    tcp[8..12].copy_from_slice(&fin.ack.to_be_bytes());
    tcp[12] = 5 << 4;
    tcp[13] = TCP_FIN | TCP_ACK;
    tcp[14..16].copy_from_slice(&fin.window.to_be_bytes());
    let mut packet = match (on_the_wire(fin.peer.ip()), on_the_wire(fin.local.ip())) {
        (IpAddr::V4(from), IpAddr::V4(to)) => {
            let mut ip = vec![0u8; 20];
            ip[0] = 0x45;
            ip[2..4].copy_from_slice(&40u16.to_be_bytes());
            ip[6] = 0x40; // don't fragment
            ip[8] = TTL;
            ip[9] = IPPROTO_TCP;
            ip[12..16].copy_from_slice(&from.octets());
            ip[16..20].copy_from_slice(&to.octets());
            ip
        }
        (IpAddr::V6(from), IpAddr::V6(to)) => {
            let mut ip = vec![0u8; 40];
            ip[0] = 0x60;
            ip[4..6].copy_from_slice(&20u16.to_be_bytes());
            ip[6] = IPPROTO_TCP;
            ip[7] = TTL;
            ip[8..24].copy_from_slice(&from.octets());
            ip[24..40].copy_from_slice(&to.octets());
            ip
        }
        _ => return None,
    };
    packet.extend_from_slice(&tcp);
    Some(packet)
}

/// Sends every FIN from inside `netns`; returns how many were sent. A FIN
/// that cannot be built or sent is an error: without it the connection
/// would not read the EOF its peer sent.
pub fn send_peer_fins(netns: &Netns, fins: &[PeerFin]) -> Result<usize, NetlockError> {
    const WHO: &str = "(peer FIN)";
    let mut packets = Vec::with_capacity(fins.len());
    for fin in fins {
        let data = segment(fin).ok_or_else(|| NetlockError::Sys {
            lock: WHO.into(),
            what: format!("FIN {} -> {}: the addresses are of two families", fin.peer, fin.local),
            source: ferry_sys::SysError::new("building the segment", libc::EAFNOSUPPORT),
        })?;
        packets.push(HeldPacket { data });
    }
    let path = match netns {
        Netns::Current => None,
        Netns::Path(p) => Some(p.as_path()),
    };
    let sent = crate::held::deliver(WHO, path, &packets)?;
    if sent != packets.len() {
        return Err(NetlockError::Sys {
            lock: WHO.into(),
            what: format!("{} of {} FINs of closed peers were sent", sent, packets.len()),
            source: ferry_sys::SysError::new("sendto(raw IP)", libc::EIO),
        });
    }
    Ok(sent)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fin(peer: &str, local: &str) -> PeerFin {
        PeerFin {
            peer: peer.parse().expect("addr"),
            local: local.parse().expect("addr"),
            seq: 0x0102_0304,
            ack: 0x0a0b_0c0d,
            window: 512,
        }
    }

    #[test]
    fn an_ipv4_fin_is_laid_out_as_the_held_packets_are() {
        let p = segment(&fin("10.0.0.2:40000", "10.0.0.1:80")).expect("segment");
        let l = crate::packet::layout(&p).expect("a TCP packet");
        assert_eq!((l.v6, l.ip_len, l.tcp_len, p.len()), (false, 20, 20, 40));
        assert_eq!(l.source, "10.0.0.2".parse::<IpAddr>().expect("ip"));
        assert_eq!(&p[20..22], &40000u16.to_be_bytes());
        assert_eq!(&p[24..28], &[1, 2, 3, 4]);
        assert_eq!(&p[28..32], &[0x0a, 0x0b, 0x0c, 0x0d]);
        assert_eq!(p[33], TCP_FIN | TCP_ACK);
    }

    #[test]
    fn a_v4_mapped_connection_gets_an_ipv4_fin_and_v6_an_ipv6_one() {
        let mapped = segment(&fin("[::ffff:10.0.0.2]:1", "[::ffff:10.0.0.1]:2")).expect("v4");
        assert_eq!(mapped[0] >> 4, 4);
        let v6 = segment(&fin("[fd00::2]:1", "[fd00::1]:2")).expect("v6");
        let l = crate::packet::layout(&v6).expect("a TCP packet");
        assert!(l.v6);
        assert_eq!(v6.len(), 60);
        assert!(segment(&fin("10.0.0.2:1", "[fd00::1]:2")).is_none());
    }
}
