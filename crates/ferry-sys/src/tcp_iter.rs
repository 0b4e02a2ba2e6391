//! The TIME_WAIT connections of the calling thread's network namespace
//! with the SO_REUSEADDR and SO_REUSEPORT their socket had, read by a BPF
//! tcp iterator. sock_diag reports a TIME_WAIT connection's addresses but
//! not those flags, and bind(2) decides by them: a socket with
//! SO_REUSEADDR cannot bind a port that a TIME_WAIT connection made
//! without it holds.
//!
//! Assembled like [`crate::vma_iter`]: for each socket in TIME_WAIT the
//! program copies the start of its `struct sock_common` (up to
//! [`TcpIterLayout::copy`] bytes) with bpf_probe_read_kernel and emits
//! it; the fields are picked out here at the offsets the caller read from
//! the kernel's BTF.

use crate::vma_iter::{insn, load_iter, open_iter, Insn, LoadRefused, BPF_FUNC_SEQ_WRITE};
use crate::{SysError, SysResult};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::OwnedFd;

const BPF_FUNC_PROBE_READ_KERNEL: i32 = 113;
const TCP_TIME_WAIT: i32 = 6;

/// Offsets, in bytes unless named in bits, and the attach point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpIterLayout {
    /// BTF id of the FUNC `bpf_iter_tcp`.
    pub attach_btf_id: u32,
    /// `struct bpf_iter__tcp`: `meta`, `sk_common`.
    pub ctx_meta: i16,
    pub ctx_sk_common: i16,
    /// `struct bpf_iter_meta`: `seq`.
    pub meta_seq: i16,
    /// `struct sock_common`: `skc_state` (a byte).
    pub skc_state: i16,
    /// How many bytes of `struct sock_common` to copy (a multiple of 8,
    /// past every field below).
    pub copy: i16,
    pub skc_family: usize,
    /// Local port, host order.
    pub skc_num: usize,
    pub skc_rcv_saddr: usize,
    pub skc_v6_rcv_saddr: usize,
    /// Bit offsets of the bitfields `skc_reuse` (4 bits) and
    /// `skc_reuseport` (1 bit).
    pub skc_reuse_bit: usize,
    pub skc_reuseport_bit: usize,
}

/// One TIME_WAIT connection's local end and its socket's flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeWait {
    pub local: SocketAddr,
    /// SO_REUSEADDR was on.
    pub reuse: bool,
    /// SO_REUSEPORT was on.
    pub reuseport: bool,
}

const MOV64_REG: u8 = 0xbf;
const MOV64_IMM: u8 = 0xb7;
const ADD64_IMM: u8 = 0x07;
const LDX_DW: u8 = 0x79;
const LDX_B: u8 = 0x71;
const JEQ_IMM: u8 = 0x15;
const JNE_IMM: u8 = 0x55;
const CALL: u8 = 0x85;
const EXIT: u8 = 0x95;

fn program(l: &TcpIterLayout) -> Vec<Insn> {
    let copy = l.copy as i32;
    vec![
        insn(MOV64_REG, 6, 1, 0, 0),            // r6 = ctx
        insn(LDX_DW, 7, 6, l.ctx_sk_common, 0), // r7 = ctx->sk_common
        insn(JEQ_IMM, 7, 0, 13, 0),             // none (the end): done
        insn(LDX_B, 2, 7, l.skc_state, 0),
        insn(JNE_IMM, 2, 0, 11, TCP_TIME_WAIT), // not TIME_WAIT: nothing
        insn(MOV64_REG, 1, 10, 0, 0),           // probe_read(fp - copy, copy, sk)
        insn(ADD64_IMM, 1, 0, 0, -copy),
        insn(MOV64_IMM, 2, 0, 0, copy),
        insn(MOV64_REG, 3, 7, 0, 0),
        insn(CALL, 0, 0, 0, BPF_FUNC_PROBE_READ_KERNEL),
        insn(LDX_DW, 1, 6, l.ctx_meta, 0), // seq_write(seq, fp - copy, copy)
        insn(LDX_DW, 1, 1, l.meta_seq, 0),
        insn(MOV64_REG, 2, 10, 0, 0),
        insn(ADD64_IMM, 2, 0, 0, -copy),
        insn(MOV64_IMM, 3, 0, 0, copy),
        insn(CALL, 0, 0, 0, BPF_FUNC_SEQ_WRITE),
        insn(MOV64_IMM, 0, 0, 0, 0),
        insn(EXIT, 0, 0, 0, 0),
    ]
}

/// The fields of one copied `sock_common`.
fn decode(l: &TcpIterLayout, r: &[u8]) -> Option<TimeWait> {
    let u16_at = |at: usize| Some(u16::from_ne_bytes(r.get(at..at + 2)?.try_into().ok()?));
    let bit = |at: usize| Some(r.get(at / 8)? >> (at % 8));
    let port = u16_at(l.skc_num)?;
    let ip = match i32::from(u16_at(l.skc_family)?) {
        libc::AF_INET => {
            let b: [u8; 4] = r.get(l.skc_rcv_saddr..l.skc_rcv_saddr + 4)?.try_into().ok()?;
            IpAddr::V4(Ipv4Addr::from(b))
        }
        libc::AF_INET6 => {
            let b: [u8; 16] =
                r.get(l.skc_v6_rcv_saddr..l.skc_v6_rcv_saddr + 16)?.try_into().ok()?;
            IpAddr::V6(Ipv6Addr::from(b))
        }
        _ => return None,
    };
    Some(TimeWait {
        local: SocketAddr::new(ip, port),
        reuse: bit(l.skc_reuse_bit)? & 0xf != 0,
        reuseport: bit(l.skc_reuseport_bit)? & 1 != 0,
    })
}

/// The loaded iterator program.
pub struct TcpIterProgram {
    prog: OwnedFd,
    layout: TcpIterLayout,
}

impl TcpIterProgram {
    /// The program as the host's list of programs shows it.
    pub fn info(&self) -> crate::SysResult<crate::bpf::ProgInfo> {
        crate::bpf::prog_info(std::os::fd::AsFd::as_fd(&self.prog))
    }

    pub fn load(layout: &TcpIterLayout) -> Result<TcpIterProgram, LoadRefused> {
        let insns = program(layout);
        load_iter(&insns, b"ferry_tcp_tw", layout.attach_btf_id, "bpf(BPF_PROG_LOAD, tcp)")
            .map(|prog| TcpIterProgram { prog, layout: *layout })
    }

    /// The TIME_WAIT connections of the calling thread's network
    /// namespace (the iterator takes the namespace it is created in).
    pub fn time_wait(&self) -> SysResult<Vec<TimeWait>> {
        let mut file = open_iter(&self.prog)?;
        let size = self.layout.copy as usize;
        let mut out = Vec::new();
        let mut bytes = vec![0u8; 64 * 1024];
        let mut pending: Vec<u8> = Vec::new();
        loop {
            let n = std::io::Read::read(&mut file, &mut bytes).map_err(|e| {
                SysError::new("read(tcp iterator)", e.raw_os_error().unwrap_or(libc::EIO))
            })?;
            if n == 0 {
                break;
            }
            pending.extend_from_slice(&bytes[..n]);
            let whole = pending.len() / size * size;
            out.extend(pending[..whole].chunks_exact(size).filter_map(|r| decode(&self.layout, r)));
            pending.drain(..whole);
        }
        if !pending.is_empty() {
            return Err(SysError::new("read(tcp iterator): a partial record", libc::EIO));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> TcpIterLayout {
        TcpIterLayout {
            attach_btf_id: 1,
            ctx_meta: 0,
            ctx_sk_common: 8,
            meta_seq: 0,
            skc_state: 18,
            copy: 88,
            skc_family: 16,
            skc_num: 14,
            skc_rcv_saddr: 4,
            skc_v6_rcv_saddr: 72,
            skc_reuse_bit: 152,
            skc_reuseport_bit: 156,
        }
    }

    #[test]
    fn a_copied_sock_common_gives_address_port_and_flags() {
        let l = layout();
        let mut r = vec![0u8; 88];
        r[4..8].copy_from_slice(&[127, 0, 0, 1]);
        r[14..16].copy_from_slice(&8080u16.to_ne_bytes());
        r[16..18].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
        r[19] = 0b0001_0000; // reuseport only
        let tw = decode(&l, &r).expect("decoded");
        assert_eq!(tw.local, "127.0.0.1:8080".parse().expect("addr"));
        assert!(!tw.reuse && tw.reuseport);
        r[19] = 0b0000_0001;
        r[16..18].copy_from_slice(&(libc::AF_INET6 as u16).to_ne_bytes());
        r[72..88].copy_from_slice(&Ipv6Addr::LOCALHOST.octets());
        let tw = decode(&l, &r).expect("decoded");
        assert_eq!(tw.local, "[::1]:8080".parse().expect("addr"));
        assert!(tw.reuse && !tw.reuseport);
        r[16] = 99;
        assert_eq!(decode(&l, &r), None, "another family");
        assert_eq!(decode(&l, &r[..40]), None, "cut short");
    }

    #[test]
    fn the_jumps_land_on_the_exit() {
        let p = program(&layout());
        let exit = p.len() - 2;
        assert_eq!(2 + 1 + p[2].off as usize, exit);
        assert_eq!(4 + 1 + p[4].off as usize, exit);
    }
}
