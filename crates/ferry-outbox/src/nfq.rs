//! The nfnetlink_queue messages the outbox sends and reads, built and
//! parsed as bytes (netlink is native endian; the nfqueue payloads are big
//! endian).
//!
//! Written by hand rather than through a crate: `nfq` 0.2.5 answers each
//! packet with a verdict of its own (NFQNL_MSG_VERDICT) and has no batch
//! verdict, and a release must be one NFQNL_MSG_VERDICT_BATCH for every id
//! up to the mark, whatever the number of packets. The handful of messages
//! needed here (bind with its parameters, batch verdict, unbind) do not
//! justify a general netlink library either.

/// `NETLINK_NETFILTER` from include/uapi/linux/netlink.h.
pub(crate) const NETLINK_NETFILTER: i32 = 12;

const NFNL_SUBSYS_QUEUE: u16 = 3;
const NFQNL_MSG_PACKET: u16 = 0;
const NFQNL_MSG_CONFIG: u16 = 2;
const NFQNL_MSG_VERDICT_BATCH: u16 = 3;

const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLMSG_ERROR: u16 = 2;
const NLMSG_HDRLEN: usize = 16;
/// `struct nfgenmsg`: family, version, resource id (the queue number).
const NFGENMSG_LEN: usize = 4;
/// Attribute types carry two flag bits (nested, byte order) above these.
const NLA_TYPE_MASK: u16 = 0x3fff;

const NFQA_PACKET_HDR: u16 = 1;
const NFQA_VERDICT_HDR: u16 = 2;

const NFQA_CFG_CMD: u16 = 1;
const NFQA_CFG_PARAMS: u16 = 2;
const NFQA_CFG_QUEUE_MAXLEN: u16 = 3;
const NFQA_CFG_MASK: u16 = 4;
const NFQA_CFG_FLAGS: u16 = 5;

const NFQNL_CFG_CMD_BIND: u8 = 1;
const NFQNL_CFG_CMD_UNBIND: u8 = 2;
/// Only the packet's metadata (its id above all) reaches user space.
const NFQNL_COPY_META: u8 = 1;

/// The kernel may hand over a GSO packet whole instead of segmenting it
/// first (and then queueing every segment).
pub(crate) const NFQA_CFG_F_GSO: u32 = 4;
/// Without this bit (it is never set) a full queue drops packets instead of
/// letting them through: the outbox fails closed.
const NFQA_CFG_F_FAIL_OPEN: u32 = 1;

const NF_ACCEPT: u32 = 1;

fn align4(n: usize) -> usize {
    (n + 3) & !3
}

fn u16_at(b: &[u8], o: usize) -> u16 {
    u16::from_ne_bytes([b[o], b[o + 1]])
}

fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_ne_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}

/// One nfqueue request: netlink header, nfgenmsg, attributes.
struct Request {
    buf: Vec<u8>,
}

impl Request {
    fn new(msg: u16, queue: u16, seq: u32) -> Request {
        let mut buf = Vec::with_capacity(64);
        buf.extend_from_slice(&0u32.to_ne_bytes()); // length, set in finish
        buf.extend_from_slice(&((NFNL_SUBSYS_QUEUE << 8) | msg).to_ne_bytes());
        buf.extend_from_slice(&(NLM_F_REQUEST | NLM_F_ACK).to_ne_bytes());
        buf.extend_from_slice(&seq.to_ne_bytes());
        buf.extend_from_slice(&0u32.to_ne_bytes()); // port id 0: the kernel
        buf.push(libc::AF_UNSPEC as u8);
        buf.push(0); // NFNETLINK_V0
        buf.extend_from_slice(&queue.to_be_bytes());
        Request { buf }
    }

    fn attr(mut self, attr_type: u16, value: &[u8]) -> Request {
        self.buf.extend_from_slice(&((4 + value.len()) as u16).to_ne_bytes());
        self.buf.extend_from_slice(&attr_type.to_ne_bytes());
        self.buf.extend_from_slice(value);
        self.buf.resize(align4(self.buf.len()), 0);
        self
    }

    fn finish(mut self) -> Vec<u8> {
        let len = self.buf.len() as u32;
        self.buf[0..4].copy_from_slice(&len.to_ne_bytes());
        self.buf
    }
}

fn command(cmd: u8) -> [u8; 4] {
    // struct nfqnl_msg_config_cmd: command, pad, protocol family (unused
    // since Linux 3.8).
    [cmd, 0, 0, 0]
}

/// Binds `queue` to the sending socket with metadata-only copies, at most
/// `maxlen` packets held, and GSO packets kept whole when `gso`. Fail-open
/// is masked in and cleared, so a full queue drops.
pub(crate) fn bind(queue: u16, seq: u32, maxlen: u32, gso: bool) -> Vec<u8> {
    // struct nfqnl_msg_config_params (packed): copy_range, copy_mode.
    let mut params = [0u8; 5];
    params[4] = NFQNL_COPY_META;
    let flags = if gso { NFQA_CFG_F_GSO } else { 0 };
    Request::new(NFQNL_MSG_CONFIG, queue, seq)
        .attr(NFQA_CFG_CMD, &command(NFQNL_CFG_CMD_BIND))
        .attr(NFQA_CFG_PARAMS, &params)
        .attr(NFQA_CFG_QUEUE_MAXLEN, &maxlen.to_be_bytes())
        .attr(NFQA_CFG_MASK, &(NFQA_CFG_F_GSO | NFQA_CFG_F_FAIL_OPEN).to_be_bytes())
        .attr(NFQA_CFG_FLAGS, &flags.to_be_bytes())
        .finish()
}

pub(crate) fn unbind(queue: u16, seq: u32) -> Vec<u8> {
    Request::new(NFQNL_MSG_CONFIG, queue, seq)
        .attr(NFQA_CFG_CMD, &command(NFQNL_CFG_CMD_UNBIND))
        .finish()
}

/// Accepts every packet of `queue` whose id is not after `id` (the kernel
/// compares ids modulo 2^32).
pub(crate) fn accept_through(queue: u16, seq: u32, id: u32) -> Vec<u8> {
    let mut hdr = [0u8; 8];
    hdr[0..4].copy_from_slice(&NF_ACCEPT.to_be_bytes());
    hdr[4..8].copy_from_slice(&id.to_be_bytes());
    Request::new(NFQNL_MSG_VERDICT_BATCH, queue, seq).attr(NFQA_VERDICT_HDR, &hdr).finish()
}

/// What one netlink message from the kernel said.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Event {
    /// A packet was queued with this id.
    Packet(u32),
    /// The answer to request `seq`: 0 or a positive errno.
    Ack { seq: u32, errno: i32 },
}

/// The events in one datagram read from the queue socket; anything else
/// (and a truncated message) is skipped.
pub(crate) fn parse(datagram: &[u8], out: &mut Vec<Event>) {
    let mut off = 0;
    while off + NLMSG_HDRLEN <= datagram.len() {
        let len = u32_at(datagram, off) as usize;
        if len < NLMSG_HDRLEN || off + len > datagram.len() {
            return;
        }
        let msg = &datagram[off..off + len];
        match u16_at(msg, 4) {
            NLMSG_ERROR if msg.len() >= NLMSG_HDRLEN + 4 + NLMSG_HDRLEN => {
                let err = i32::from_ne_bytes([msg[16], msg[17], msg[18], msg[19]]);
                // The request's header follows the error; its seq at +8.
                out.push(Event::Ack { seq: u32_at(msg, 20 + 8), errno: -err });
            }
            t if t == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET => {
                if let Some(id) = packet_id(&msg[NLMSG_HDRLEN.min(msg.len())..]) {
                    out.push(Event::Packet(id));
                }
            }
            _ => {}
        }
        off += align4(len);
    }
}

/// The id in the NFQA_PACKET_HDR attribute of a packet message's payload.
fn packet_id(payload: &[u8]) -> Option<u32> {
    let mut off = NFGENMSG_LEN;
    while off + 4 <= payload.len() {
        let len = u16_at(payload, off) as usize;
        if len < 4 || off + len > payload.len() {
            return None;
        }
        if u16_at(payload, off + 2) & NLA_TYPE_MASK == NFQA_PACKET_HDR && len >= 8 {
            let b = &payload[off + 4..off + 8];
            return Some(u32::from_be_bytes([b[0], b[1], b[2], b[3]]));
        }
        off += align4(len);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn packet_msg(id: u32) -> Vec<u8> {
        let mut hdr = id.to_be_bytes().to_vec();
        hdr.extend_from_slice(&0x0800u16.to_be_bytes());
        hdr.push(3); // NF_INET_LOCAL_OUT
        let mut r = Request::new(NFQNL_MSG_PACKET, 7, 0);
        r = r.attr(9, &[0, 0, 0, 5]); // an outdev attribute first
        r.attr(NFQA_PACKET_HDR, &hdr).finish()
    }

    #[test]
    fn packets_and_acks_are_read_from_one_datagram() {
        let mut d = packet_msg(41);
        d.extend(packet_msg(42));
        let mut ack = vec![0u8; 36];
        ack[0..4].copy_from_slice(&36u32.to_ne_bytes());
        ack[4..6].copy_from_slice(&NLMSG_ERROR.to_ne_bytes());
        ack[16..20].copy_from_slice(&(-libc::ENOENT).to_ne_bytes());
        ack[28..32].copy_from_slice(&99u32.to_ne_bytes());
        d.extend(ack);
        let mut ev = Vec::new();
        parse(&d, &mut ev);
        assert_eq!(
            ev,
            [Event::Packet(41), Event::Packet(42), Event::Ack { seq: 99, errno: libc::ENOENT }]
        );
    }

    #[test]
    fn a_truncated_message_is_skipped() {
        let d = packet_msg(5);
        let mut ev = Vec::new();
        parse(&d[..d.len() - 3], &mut ev);
        assert!(ev.is_empty());
        let mut short = d.clone();
        short[0..4].copy_from_slice(&8u32.to_ne_bytes());
        parse(&short, &mut ev);
        assert!(ev.is_empty());
    }

    #[test]
    fn the_batch_verdict_names_the_queue_and_the_last_id() {
        let m = accept_through(0x0102, 7, 0xdead_beef);
        assert_eq!(m.len(), 16 + 4 + 12);
        assert_eq!(u32_at(&m, 0) as usize, m.len());
        assert_eq!(u16_at(&m, 4), (3 << 8) | 3);
        assert_eq!(u32_at(&m, 8), 7);
        assert_eq!(&m[18..20], &[1, 2]);
        assert_eq!(&m[24..28], &NF_ACCEPT.to_be_bytes());
        assert_eq!(&m[28..32], &0xdead_beefu32.to_be_bytes());
    }

    #[test]
    fn bind_asks_for_metadata_only_and_clears_fail_open() {
        let m = bind(3, 1, 65536, true);
        assert_eq!(u32_at(&m, 0) as usize, m.len());
        // cmd (8) + params (12, padded) + maxlen (8) + mask (8) + flags (8)
        assert_eq!(m.len(), 20 + 8 + 12 + 8 + 8 + 8);
        assert_eq!(m[20 + 8 + 4 + 4], NFQNL_COPY_META);
        assert_eq!(&m[52..56], &(NFQA_CFG_F_GSO | NFQA_CFG_F_FAIL_OPEN).to_be_bytes());
        assert_eq!(&m[60..64], &NFQA_CFG_F_GSO.to_be_bytes());
    }
}
