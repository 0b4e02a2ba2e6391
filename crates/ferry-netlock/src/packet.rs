//! A packet the lock kept, made fit to be sent again through a raw socket:
//! the TCP checksum recomputed (a packet taken at tc may carry only the
//! pseudo-header sum that checksum offload completes later) and a packet
//! larger than the path (a GSO packet taken before segmentation) cut into
//! segments. Pure byte work, no system calls.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

const IPPROTO_TCP: u8 = 6;
const TCP_FIN: u8 = 0x01;
const TCP_PSH: u8 = 0x08;

/// Where the IP and TCP headers of a packet are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Layout {
    pub v6: bool,
    pub ip_len: usize,
    pub tcp_len: usize,
    pub source: IpAddr,
    pub destination: IpAddr,
}

/// The headers of an IPv4 or IPv6 TCP packet (no IPv6 extension header),
/// or None for anything else or a truncated packet.
pub(crate) fn layout(packet: &[u8]) -> Option<Layout> {
    let version = packet.first()? >> 4;
    let (v6, ip_len, total, source, destination) = match version {
        4 => {
            let ip_len = usize::from(packet[0] & 0x0f) * 4;
            let total = usize::from(u16::from_be_bytes([*packet.get(2)?, *packet.get(3)?]));
            if ip_len < 20 || *packet.get(9)? != IPPROTO_TCP {
                return None;
            }
            let addr = |at: usize| -> Option<IpAddr> {
                let b: [u8; 4] = packet.get(at..at + 4)?.try_into().ok()?;
                Some(IpAddr::V4(Ipv4Addr::from(b)))
            };
            (false, ip_len, total, addr(12)?, addr(16)?)
        }
        6 => {
            let payload = usize::from(u16::from_be_bytes([*packet.get(4)?, *packet.get(5)?]));
            if *packet.get(6)? != IPPROTO_TCP {
                return None;
            }
            let addr = |at: usize| -> Option<IpAddr> {
                let b: [u8; 16] = packet.get(at..at + 16)?.try_into().ok()?;
                Some(IpAddr::V6(Ipv6Addr::from(b)))
            };
            (true, 40, 40 + payload, addr(8)?, addr(24)?)
        }
        _ => return None,
    };
    let tcp_len = usize::from(packet.get(ip_len + 12)? >> 4) * 4;
    if total != packet.len() || tcp_len < 20 || ip_len + tcp_len > total {
        return None;
    }
    Some(Layout { v6, ip_len, tcp_len, source, destination })
}

/// One's-complement sum of `bytes` as 16-bit big-endian words, added to `sum`.
fn add_words(mut sum: u32, bytes: &[u8]) -> u32 {
    let mut chunks = bytes.chunks_exact(2);
    for w in &mut chunks {
        sum = sum.wrapping_add(u32::from(u16::from_be_bytes([w[0], w[1]])));
        sum = (sum & 0xffff) + (sum >> 16);
    }
    if let [last] = chunks.remainder() {
        sum = sum.wrapping_add(u32::from(*last) << 8);
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum
}

fn fold(mut sum: u32) -> u16 {
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

fn ip_bytes(addr: IpAddr) -> Vec<u8> {
    match addr {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

/// Rewrites the TCP checksum of `packet` (laid out as `l`) in place.
fn fix_tcp_checksum(packet: &mut [u8], l: &Layout) {
    let segment_len = packet.len() - l.ip_len;
    let mut sum = add_words(0, &ip_bytes(l.source));
    sum = add_words(sum, &ip_bytes(l.destination));
    sum = if l.v6 {
        add_words(sum, &(segment_len as u32).to_be_bytes())
    } else {
        add_words(sum, &(segment_len as u16).to_be_bytes())
    };
    sum = add_words(sum, &[0, IPPROTO_TCP]);
    let checksum_at = l.ip_len + 16;
    packet[checksum_at] = 0;
    packet[checksum_at + 1] = 0;
    sum = add_words(sum, &packet[l.ip_len..]);
    packet[checksum_at..checksum_at + 2].copy_from_slice(&fold(sum).to_be_bytes());
}

/// Rewrites the IPv4 header checksum in place.
fn fix_ipv4_checksum(packet: &mut [u8], ip_len: usize) {
    packet[10] = 0;
    packet[11] = 0;
    let sum = fold(add_words(0, &packet[..ip_len]));
    packet[10..12].copy_from_slice(&sum.to_be_bytes());
}

/// The packet as one or more packets of at most `max_len` bytes, each with
/// correct lengths and checksums; empty when `packet` is not a TCP packet
/// this can read. Segments carry the original's IP and TCP headers (TCP
/// options included) with the sequence number advanced; FIN and PSH stay on
/// the last only.
pub(crate) fn sendable(packet: &[u8], max_len: usize) -> Vec<Vec<u8>> {
    let Some(l) = layout(packet) else {
        return Vec::new();
    };
    let mut owned = packet.to_vec();
    strip_timestamps(&mut owned, &l);
    let headers = l.ip_len + l.tcp_len;
    let room = max_len.saturating_sub(headers);
    if owned.len() <= max_len || room == 0 || owned.len() == headers {
        fix_tcp_checksum(&mut owned, &l);
        return vec![owned];
    }
    let packet = owned.as_slice();
    let payload = &packet[headers..];
    let seq = u32::from_be_bytes([
        packet[l.ip_len + 4],
        packet[l.ip_len + 5],
        packet[l.ip_len + 6],
        packet[l.ip_len + 7],
    ]);
    let chunks: Vec<&[u8]> = payload.chunks(room).collect();
    let last = chunks.len() - 1;
    chunks
        .iter()
        .enumerate()
        .map(|(i, chunk)| {
            let mut seg = Vec::with_capacity(headers + chunk.len());
            seg.extend_from_slice(&packet[..headers]);
            seg.extend_from_slice(chunk);
            let offset = (i * room) as u32;
            seg[l.ip_len + 4..l.ip_len + 8]
                .copy_from_slice(&seq.wrapping_add(offset).to_be_bytes());
            if i != last {
                seg[l.ip_len + 13] &= !(TCP_FIN | TCP_PSH);
            }
            set_ip_length(&mut seg, &l, i as u16);
            fix_tcp_checksum(&mut seg, &l);
            seg
        })
        .collect()
}

/// Turns a timestamp option into NOPs. A held segment is older than the
/// peer's segments that may reach the socket before it: with its
/// timestamp, the socket's PAWS check would drop it as a stale duplicate.
fn strip_timestamps(packet: &mut [u8], l: &Layout) {
    const NOP: u8 = 1;
    const END: u8 = 0;
    const TIMESTAMP: u8 = 8;
    let mut at = l.ip_len + 20;
    let end = l.ip_len + l.tcp_len;
    while at < end {
        match packet[at] {
            END => break,
            NOP => at += 1,
            kind => {
                let Some(&len) = packet.get(at + 1) else { break };
                let len = usize::from(len);
                if len < 2 || at + len > end {
                    break;
                }
                if kind == TIMESTAMP {
                    packet[at..at + len].fill(NOP);
                }
                at += len;
            }
        }
    }
}

/// Sets the IP length fields of a segment (and for IPv4 a fresh id, the
/// original's plus `index`, and the header checksum).
fn set_ip_length(seg: &mut [u8], l: &Layout, index: u16) {
    if l.v6 {
        let payload = (seg.len() - 40) as u16;
        seg[4..6].copy_from_slice(&payload.to_be_bytes());
    } else {
        let total = seg.len() as u16;
        seg[2..4].copy_from_slice(&total.to_be_bytes());
        let id = u16::from_be_bytes([seg[4], seg[5]]).wrapping_add(index);
        seg[4..6].copy_from_slice(&id.to_be_bytes());
        fix_ipv4_checksum(seg, l.ip_len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An IPv4 TCP packet 10.0.0.1:1000 -> 10.0.0.2:80 with `payload`,
    /// sequence 1000, flags PSH|ACK|FIN, checksum field garbage.
    fn v4_packet(payload: &[u8]) -> Vec<u8> {
        let total = 20 + 20 + payload.len();
        let mut p = vec![0u8; total];
        p[0] = 0x45;
        p[2..4].copy_from_slice(&(total as u16).to_be_bytes());
        p[4..6].copy_from_slice(&7u16.to_be_bytes());
        p[8] = 64;
        p[9] = IPPROTO_TCP;
        p[12..16].copy_from_slice(&[10, 0, 0, 1]);
        p[16..20].copy_from_slice(&[10, 0, 0, 2]);
        fix_ipv4_checksum(&mut p, 20);
        p[20..22].copy_from_slice(&1000u16.to_be_bytes());
        p[22..24].copy_from_slice(&80u16.to_be_bytes());
        p[24..28].copy_from_slice(&1000u32.to_be_bytes());
        p[32] = 5 << 4;
        p[33] = 0x10 | TCP_PSH | TCP_FIN;
        p[36] = 0xde;
        p[37] = 0xad;
        p[40..].copy_from_slice(payload);
        p
    }

    /// Verifying a checksum: the sum over the covered bytes folds to 0.
    fn tcp_checksum_ok(p: &[u8]) -> bool {
        let l = layout(p).expect("layout");
        let mut sum = add_words(0, &ip_bytes(l.source));
        sum = add_words(sum, &ip_bytes(l.destination));
        sum = add_words(sum, &((p.len() - l.ip_len) as u16).to_be_bytes());
        sum = add_words(sum, &[0, IPPROTO_TCP]);
        fold(add_words(sum, &p[l.ip_len..])) == 0
    }

    #[test]
    fn a_small_packet_gets_a_correct_checksum() {
        let p = v4_packet(b"hello");
        assert!(!tcp_checksum_ok(&p));
        let out = sendable(&p, 1500);
        assert_eq!(out.len(), 1);
        assert!(tcp_checksum_ok(&out[0]));
        assert_eq!(&out[0][40..], b"hello");
    }

    #[test]
    fn a_large_packet_is_cut_into_segments_in_sequence() {
        let payload: Vec<u8> = (0..3000u32).map(|i| (i % 251) as u8).collect();
        let p = v4_packet(&payload);
        let out = sendable(&p, 1040);
        assert_eq!(out.len(), 3);
        let mut joined = Vec::new();
        for (i, seg) in out.iter().enumerate() {
            assert!(seg.len() <= 1040);
            assert!(tcp_checksum_ok(seg), "segment {i}");
            assert_eq!(fold(add_words(0, &seg[..20])), 0, "ip checksum of segment {i}");
            let l = layout(seg).expect("segment layout");
            assert_eq!(l.ip_len + l.tcp_len, 40);
            let seq = u32::from_be_bytes([seg[24], seg[25], seg[26], seg[27]]);
            assert_eq!(seq, 1000 + joined.len() as u32);
            let fin = seg[33] & TCP_FIN != 0;
            assert_eq!(fin, i == 2, "FIN only on the last segment");
            joined.extend_from_slice(&seg[40..]);
        }
        assert_eq!(joined, payload);
    }

    #[test]
    fn a_timestamp_option_becomes_nops() {
        // 20 bytes of IP, 32 of TCP: NOP, NOP, timestamp (10 bytes).
        let mut p = v4_packet(b"");
        p.splice(40..40, [1, 1, 8, 10, 0, 0, 0, 7, 0, 0, 0, 9]);
        p[32] = 8 << 4;
        let total = p.len() as u16;
        p[2..4].copy_from_slice(&total.to_be_bytes());
        let out = sendable(&p, 1500);
        assert_eq!(out.len(), 1);
        assert_eq!(&out[0][40..52], &[1; 12]);
        assert!(tcp_checksum_ok(&out[0]));
    }

    #[test]
    fn what_is_not_tcp_over_ip_is_left_out() {
        let mut p = v4_packet(b"x");
        p[9] = 17; // UDP
        assert!(sendable(&p, 1500).is_empty());
        assert!(sendable(&[0x45, 0, 0], 1500).is_empty());
        let mut short = v4_packet(b"xyz");
        short.truncate(41);
        assert!(sendable(&short, 1500).is_empty());
    }
}
