//! The packets an eBPF lock dropped, given back: the program copies each
//! packet it drops into the base's ring buffer `held` (owner slot and
//! generation of the lock that dropped it, direction, the packet from its
//! IP header on). Once the connections exist again and the lock is
//! disengaged, its owner takes them out and sends them again through raw IP
//! sockets in the connections' namespace, in the order they were dropped:
//! the peer's data reaches the restored socket at once (no wait for the
//! peer's retransmission timer, 200 ms at least) and what the service had
//! sent before the freeze leaves at once (no wait for the restored socket's
//! first retransmission timeout, 1 s). Every packet was made by a TCP stack
//! and is delivered as it was; TCP drops what it already has.
//!
//! One ring serves every lock of the base: records of other locks read
//! while taking one's own go to `held-<slot>-<generation>` in the base's
//! state directory, where their owner finds them.

use crate::base::{self, Base};
use crate::{netns, NetlockError};
use std::io::Write;
use std::os::fd::AsFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// `struct held_header` of netlock.bpf.c.
const HEADER_LEN: usize = 8;
/// max_entries of `held` in netlock.bpf.c.
const RING_BYTES: usize = 8 << 20;

/// A packet kept by the lock.
#[derive(Debug, Clone)]
pub(crate) struct HeldPacket {
    pub data: Vec<u8>,
}

fn side_file(base: &str, slot: u8, generation: u16) -> PathBuf {
    base::state_dir(base).join(format!("held-{slot}-{generation}"))
}

/// Record header fields: (len, owner, generation), for the packets that
/// are sent again: every packet dropped on its way in, and of those
/// dropped on their way out only the ones that carry no data (ACKs and
/// window updates: they acknowledge only what the socket had received,
/// which the image holds). Data the socket had sent is not sent again from
/// here: the rebuilt socket may count it as not sent yet (it writes it
/// again after the thaw), and a peer acknowledging it first would have its
/// ACK dropped as one for data never sent, stalling the connection (seen
/// with 100 loopback connections).
fn header(record: &[u8]) -> Option<(usize, u8, u16)> {
    let len = u32::from_ne_bytes(record.get(0..4)?.try_into().ok()?) as usize;
    let owner = *record.get(4)?;
    let ingress = *record.get(5)? != 0;
    if !ingress && !carries_no_data(record.get(HEADER_LEN..HEADER_LEN + len)?) {
        return None;
    }
    let generation = u16::from_ne_bytes(record.get(6..8)?.try_into().ok()?);
    Some((len, owner, generation))
}

/// A TCP packet without payload, SYN or FIN.
fn carries_no_data(packet: &[u8]) -> bool {
    let Some(l) = crate::packet::layout(packet) else {
        return false;
    };
    let flags = packet.get(l.ip_len + 13).copied().unwrap_or(0xff);
    packet.len() == l.ip_len + l.tcp_len && flags & 0x03 == 0
}

/// Takes every packet kept for (slot, generation) out of the ring and out
/// of the side file; other locks' packets go to their side files. The
/// caller holds the base's flock.
pub(crate) fn take(
    lock: &str,
    base: &Base,
    slot: u8,
    generation: u16,
) -> Result<Vec<HeldPacket>, NetlockError> {
    let mut mine = read_side_file(&side_file(&base.name, slot, generation));
    let path = base::pin_dir(&base.name).join("held");
    let sys = |what: &str| {
        let what = format!("{what} {}", path.display());
        move |source| NetlockError::Sys { lock: lock.to_string(), what, source }
    };
    let fd = ferry_sys::bpf::obj_get(&path).map_err(sys("opening"))?;
    let ring_id = ferry_sys::bpf::map_id(fd.as_fd()).map_err(sys("identifying"))?;
    let mut ring = match crate::reuse::take_ring(&base.name, ring_id) {
        Some(kept) => kept,
        // Nothing in the ring (the usual case: no packet came while the
        // lock was engaged): its 16 MiB mapping is not needed.
        None if !ferry_sys::bpf::ring_has_records(fd.as_fd()).map_err(sys("reading"))? => {
            return Ok(mine)
        }
        None => {
            ferry_sys::bpf::RingConsumer::map(fd.as_fd(), RING_BYTES).map_err(sys("mapping"))?
        }
    };
    let mut others: std::collections::BTreeMap<(u8, u16), Vec<u8>> = Default::default();
    ring.drain(|record| {
        let Some((len, owner, record_generation)) = header(record) else {
            return;
        };
        let Some(packet) = record.get(HEADER_LEN..HEADER_LEN + len) else {
            return;
        };
        if (owner, record_generation) == (slot, generation) {
            mine.push(HeldPacket { data: packet.to_vec() });
        } else {
            let out = others.entry((owner, record_generation)).or_default();
            out.extend_from_slice(&(len as u32).to_ne_bytes());
            out.extend_from_slice(packet);
        }
    });
    crate::reuse::put_ring(&base.name, ring_id, ring);
    let in_use = if others.is_empty() { Vec::new() } else { base::slots(&base.name) };
    for ((owner, owner_generation), bytes) in others {
        // Only for a lock that still holds the slot; others' are stale.
        if in_use.iter().any(|(s, _)| *s == owner) {
            append(lock, &side_file(&base.name, owner, owner_generation), &bytes)?;
        }
    }
    Ok(mine)
}

fn read_side_file(path: &Path) -> Vec<HeldPacket> {
    let Ok(bytes) = std::fs::read(path) else {
        return Vec::new();
    };
    let _ = std::fs::remove_file(path);
    let mut out = Vec::new();
    let mut rest = bytes.as_slice();
    while let Some(len) = rest.get(0..4).and_then(|b| b.try_into().ok()).map(u32::from_ne_bytes) {
        let Some(packet) = rest.get(4..4 + len as usize) else {
            break;
        };
        out.push(HeldPacket { data: packet.to_vec() });
        rest = &rest[4 + len as usize..];
    }
    out
}

fn append(lock: &str, path: &Path, bytes: &[u8]) -> Result<(), NetlockError> {
    let io = |what| {
        let path = path.to_path_buf();
        move |source| NetlockError::Io { lock: lock.to_string(), what, path, source }
    };
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .open(path)
        .map_err(io("opening"))?;
    file.write_all(bytes).map_err(io("appending to"))
}

/// Removes what is left for `slot` (a lock released without taking its
/// packets: nobody will deliver them).
pub(crate) fn forget(base: &str, slot: u8) {
    let prefix = format!("held-{slot}-");
    let Ok(entries) = std::fs::read_dir(base::state_dir(base)) else {
        return;
    };
    for entry in entries.filter_map(|e| e.ok()) {
        if entry.file_name().to_string_lossy().starts_with(&prefix) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Largest packet sent as is to a local address (loopback's MTU) and to any
/// other (an Ethernet MTU: the path's own is not known here).
const LOCAL_MAX: usize = 65_535;
const REMOTE_MAX: usize = 1_500;

/// Sends `packets` again, in order, from a thread inside the namespace at
/// `netns_path` (None: the caller's). Returns how many were sent; a packet
/// the stack refuses is logged and skipped (TCP's retransmission still
/// covers it).
pub(crate) fn deliver(
    lock: &str,
    netns_path: Option<&Path>,
    packets: &[HeldPacket],
) -> Result<usize, NetlockError> {
    if packets.is_empty() {
        return Ok(0);
    }
    netns::run_in(lock, netns_path, || {
        let sys = |what: &str| {
            let what = what.to_string();
            move |source| NetlockError::Sys { lock: lock.to_string(), what, source }
        };
        let local =
            ferry_sys::netns::addresses().map_err(sys("listing the namespace's addresses"))?;
        let mut sockets: [Option<ferry_sys::raw_ip::RawIpSocket>; 2] = [None, None];
        let mut sent = 0;
        for packet in packets {
            let Some(layout) = crate::packet::layout(&packet.data) else {
                continue;
            };
            let max = if local.contains(&layout.destination) { LOCAL_MAX } else { REMOTE_MAX };
            let socket = match &mut sockets[usize::from(layout.v6)] {
                Some(s) => s,
                empty => empty.insert(
                    ferry_sys::raw_ip::RawIpSocket::new(layout.v6)
                        .map_err(sys("opening a raw IP socket"))?,
                ),
            };
            for segment in crate::packet::sendable(&packet.data, max) {
                match socket.send(&segment, layout.destination) {
                    Ok(()) => sent += 1,
                    Err(e) => tracing::warn!(
                        lock,
                        "sending a held packet {} -> {} again: {e}",
                        layout.source,
                        layout.destination
                    ),
                }
            }
        }
        Ok(sent)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn side_files_round_trip() {
        let dir = std::env::temp_dir().join(format!("ferry-held-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("held-3-7");
        let mut bytes = Vec::new();
        for p in [&b"one"[..], b"second"] {
            bytes.extend_from_slice(&(p.len() as u32).to_ne_bytes());
            bytes.extend_from_slice(p);
        }
        append("t", &path, &bytes[..11]).expect("append");
        append("t", &path, &bytes[11..]).expect("append");
        let back: Vec<Vec<u8>> = read_side_file(&path).into_iter().map(|p| p.data).collect();
        assert_eq!(back, vec![b"one".to_vec(), b"second".to_vec()]);
        assert!(!path.exists(), "a side file is removed once read");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
