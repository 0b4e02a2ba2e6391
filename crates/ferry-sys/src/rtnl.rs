//! A minimal rtnetlink (NETLINK_ROUTE) client shared by the address and
//! announce wrappers: one request and its acknowledgement, or one dump.
//!
//! Messages are built and parsed as byte vectors (native endian, as netlink
//! is) so that no kernel struct layout has to be trusted beyond the few
//! fixed header offsets written out here.

use crate::{last_error, SysError, SysResult};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};

pub(crate) const RTM_NEWLINK: u16 = 16;
pub(crate) const RTM_GETLINK: u16 = 18;
pub(crate) const RTM_NEWADDR: u16 = 20;
pub(crate) const RTM_DELADDR: u16 = 21;
pub(crate) const RTM_GETADDR: u16 = 22;

pub(crate) const NLM_F_REQUEST: u16 = 0x1;
pub(crate) const NLM_F_ACK: u16 = 0x4;
pub(crate) const NLM_F_EXCL: u16 = 0x200;
pub(crate) const NLM_F_CREATE: u16 = 0x400;
pub(crate) const NLM_F_DUMP: u16 = 0x300;
/// Set on a dump's messages when the table changed while it was read.
const NLM_F_DUMP_INTR: u16 = 0x10;

const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLMSG_HDRLEN: usize = 16;

pub(crate) fn u16_at(b: &[u8], o: usize) -> u16 {
    u16::from_ne_bytes([b[o], b[o + 1]])
}
pub(crate) fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_ne_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}

fn align4(n: usize) -> usize {
    (n + 3) & !3
}

/// A netlink message under construction: header, fixed family header,
/// then attributes.
pub(crate) struct Msg {
    buf: Vec<u8>,
}

impl Msg {
    pub(crate) fn new(msg_type: u16, flags: u16, family_header: &[u8]) -> Msg {
        let mut buf = Vec::with_capacity(128);
        buf.extend_from_slice(&0u32.to_ne_bytes()); // length, set in finish
        buf.extend_from_slice(&msg_type.to_ne_bytes());
        buf.extend_from_slice(&flags.to_ne_bytes());
        buf.extend_from_slice(&0u32.to_ne_bytes()); // sequence, set in finish
        buf.extend_from_slice(&0u32.to_ne_bytes()); // port id 0: the kernel
        buf.extend_from_slice(family_header);
        buf.resize(align4(buf.len()), 0);
        Msg { buf }
    }

    pub(crate) fn attr(&mut self, attr_type: u16, value: &[u8]) {
        let len = 4 + value.len();
        self.buf.extend_from_slice(&(len as u16).to_ne_bytes());
        self.buf.extend_from_slice(&attr_type.to_ne_bytes());
        self.buf.extend_from_slice(value);
        self.buf.resize(align4(self.buf.len()), 0);
    }

    fn finish(mut self, seq: u32) -> Vec<u8> {
        let len = self.buf.len() as u32;
        self.buf[0..4].copy_from_slice(&len.to_ne_bytes());
        self.buf[8..12].copy_from_slice(&seq.to_ne_bytes());
        self.buf
    }
}

/// Sequence numbers only need to tell our own request's answer apart from
/// a stale one; a process-wide counter does that.
fn next_seq() -> u32 {
    static SEQ: AtomicU32 = AtomicU32::new(1);
    SEQ.fetch_add(1, Ordering::Relaxed)
}

/// A NETLINK_ROUTE socket of the calling thread's network namespace (a
/// socket stays in the namespace it was made in).
fn route_socket(call: &'static str) -> SysResult<OwnedFd> {
    // SAFETY: plain socket(2) with integer arguments.
    let raw = unsafe {
        libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, libc::NETLINK_ROUTE)
    };
    if raw < 0 {
        return Err(last_error(call));
    }
    // SAFETY: raw is a new descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

fn send(sock: &OwnedFd, msg: &[u8], call: &'static str) -> SysResult<()> {
    // SAFETY: msg is a live buffer of msg.len() bytes; the kernel only reads it.
    let n = unsafe { libc::send(sock.as_raw_fd(), msg.as_ptr().cast(), msg.len(), 0) };
    if n < 0 {
        return Err(last_error(call));
    }
    Ok(())
}

fn recv(sock: &OwnedFd, buf: &mut [u8], call: &'static str) -> SysResult<usize> {
    loop {
        // SAFETY: buf is a live writable buffer of buf.len() bytes.
        let n = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let err = last_error(call);
        if err.errno != libc::EINTR {
            return Err(err);
        }
    }
}

/// The errno carried by an NLMSG_ERROR payload (0 for an acknowledgement).
fn error_of(payload: &[u8]) -> i32 {
    if payload.len() < 4 {
        return libc::EBADMSG;
    }
    // The kernel stores -errno.
    -(u32_at(payload, 0) as i32)
}

/// Sends one request with NLM_F_ACK and waits for its acknowledgement; a
/// failure carries the kernel's errno under the name `call`.
pub(crate) fn request(msg: Msg, call: &'static str) -> SysResult<()> {
    let sock = route_socket(call)?;
    let seq = next_seq();
    send(&sock, &msg.finish(seq), call)?;
    let mut buf = vec![0u8; 32 * 1024];
    loop {
        let n = recv(&sock, &mut buf, call)?;
        for m in messages(&buf[..n], call) {
            let m = m?;
            if m.ty == NLMSG_ERROR && m.seq == seq {
                return match error_of(m.payload) {
                    0 => Ok(()),
                    errno => Err(SysError::new(call, errno)),
                };
            }
        }
    }
}

/// One netlink message of a received buffer.
struct Message<'a> {
    ty: u16,
    flags: u16,
    seq: u32,
    payload: &'a [u8],
}

/// The messages of a received buffer, in order; a length that does not
/// fit is EBADMSG (and ends the walk).
fn messages<'a>(
    buf: &'a [u8],
    call: &'static str,
) -> impl Iterator<Item = SysResult<Message<'a>>> + 'a {
    let mut off = 0usize;
    let mut broken = false;
    std::iter::from_fn(move || {
        if broken || off + NLMSG_HDRLEN > buf.len() {
            return None;
        }
        let len = u32_at(buf, off) as usize;
        if len < NLMSG_HDRLEN || off + len > buf.len() {
            broken = true;
            return Some(Err(SysError::new(call, libc::EBADMSG)));
        }
        let m = Message {
            ty: u16_at(buf, off + 4),
            flags: u16_at(buf, off + 6),
            seq: u32_at(buf, off + 8),
            payload: &buf[off + NLMSG_HDRLEN..off + len],
        };
        off += align4(len);
        Some(Ok(m))
    })
}

/// Sends a dump request (or a plain get) and hands the family payload of
/// every answer message of type `want` to `each`. A dump the kernel marks
/// as interrupted (the table changed under it) is read again, a few times.
pub(crate) fn dump(
    make: impl Fn() -> Msg,
    want: u16,
    call: &'static str,
    mut each: impl FnMut(&[u8]),
) -> SysResult<()> {
    for _ in 0..5 {
        let mut payloads: Vec<Vec<u8>> = Vec::new();
        let interrupted = dump_once(make(), want, call, &mut payloads)?;
        if !interrupted {
            for p in &payloads {
                each(p);
            }
            return Ok(());
        }
    }
    Err(SysError::new(call, libc::EINTR))
}

fn dump_once(msg: Msg, want: u16, call: &'static str, out: &mut Vec<Vec<u8>>) -> SysResult<bool> {
    let sock = route_socket(call)?;
    let seq = next_seq();
    let is_dump = u16_at(&msg.buf, 6) & NLM_F_DUMP == NLM_F_DUMP;
    send(&sock, &msg.finish(seq), call)?;
    let mut interrupted = false;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = recv(&sock, &mut buf, call)?;
        for m in messages(&buf[..n], call) {
            let Message { ty, flags, seq: mseq, payload } = m?;
            if mseq != seq {
                continue;
            }
            if flags & NLM_F_DUMP_INTR != 0 {
                interrupted = true;
            }
            match ty {
                NLMSG_ERROR => {
                    return match error_of(payload) {
                        0 => Ok(interrupted),
                        errno => Err(SysError::new(call, errno)),
                    }
                }
                NLMSG_DONE => {
                    // A dump may end with an error code in its DONE message.
                    if payload.len() >= 4 && (u32_at(payload, 0) as i32) < 0 {
                        return Err(SysError::new(call, -(u32_at(payload, 0) as i32)));
                    }
                    return Ok(interrupted);
                }
                t if t == want => {
                    out.push(payload.to_vec());
                    // A plain get answers with one message and no DONE.
                    if !is_dump {
                        return Ok(interrupted);
                    }
                }
                _ => {}
            }
        }
    }
}

/// The attributes following a family header of `header_len` bytes, as
/// (type, value) pairs; the nested and byte-order flag bits are dropped.
pub(crate) fn attrs(payload: &[u8], header_len: usize) -> Vec<(u16, &[u8])> {
    let mut out = Vec::new();
    let mut a = align4(header_len);
    while a + 4 <= payload.len() {
        let alen = u16_at(payload, a) as usize;
        let aty = u16_at(payload, a + 2) & 0x3fff;
        if alen < 4 || a + alen > payload.len() {
            break;
        }
        out.push((aty, &payload[a + 4..a + alen]));
        a += align4(alen);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_are_padded_and_read_back() {
        let mut m = Msg::new(RTM_NEWADDR, NLM_F_REQUEST, &[1, 2, 3, 4, 5, 6, 7, 8]);
        m.attr(2, &[10, 0, 0, 1]);
        m.attr(3, b"eth0\0"); // 5 bytes: padded to 8
        m.attr(8, &2u32.to_ne_bytes());
        let bytes = m.finish(7);
        assert_eq!(u32_at(&bytes, 0) as usize, bytes.len());
        assert_eq!(bytes.len() % 4, 0);
        assert_eq!(u32_at(&bytes, 8), 7);
        let got = attrs(&bytes[NLMSG_HDRLEN..], 8);
        assert_eq!(
            got,
            vec![(2, &[10u8, 0, 0, 1][..]), (3, &b"eth0\0"[..]), (8, &2u32.to_ne_bytes()[..])]
        );
    }
}
