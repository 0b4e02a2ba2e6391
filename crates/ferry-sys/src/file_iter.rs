//! Every socket in one fd table with the reference count of its open
//! file description and, for a TCP socket, its send side's urgent
//! pointer, read by a BPF task_file iterator. Nothing else shows either:
//! /proc shows fds, not who else holds the file (a message in flight in
//! some unix queue, an io_uring's fixed files), and no getsockopt or
//! sock_diag field shows `snd_up`.
//!
//! Assembled here like [`crate::vma_iter`], with the structure offsets
//! read by the caller from the running kernel's BTF. For each file the
//! program emits one record only when the inode is a socket (S_IFSOCK):
//! {fd, file address, f_ref, inode number, snd_una, snd_up}. The last two
//! are read through `file->private_data` (the `struct socket`) and its
//! `sk` with bpf_probe_read_kernel, which faults softly: they mean
//! something only for a TCP socket, which the caller knows by its fd.

use crate::vma_iter::{
    insn, load_iter, open_task_iter, read_task_files, Insn, LoadRefused, BPF_FUNC_SEQ_WRITE,
};
use crate::{SysError, SysResult};
use std::os::fd::OwnedFd;

const BPF_FUNC_PROBE_READ_KERNEL: i32 = 113;
const RECORD: usize = 40;

/// Where the program finds what it reads, in bytes, and which kernel
/// function it attaches to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileIterLayout {
    /// BTF id of the FUNC `bpf_iter_task_file`.
    pub attach_btf_id: u32,
    /// `struct bpf_iter__task_file`: `meta`, `fd`, `file`.
    pub ctx_meta: i16,
    pub ctx_fd: i16,
    pub ctx_file: i16,
    /// `struct bpf_iter_meta`: `seq`.
    pub meta_seq: i16,
    /// `struct file`: `f_ref`, `f_inode`, `private_data`.
    pub f_ref: i16,
    pub f_inode: i16,
    pub private_data: i16,
    /// `struct inode`: `i_mode`, `i_ino`.
    pub i_mode: i16,
    pub i_ino: i16,
    /// `struct socket`: `sk`.
    pub socket_sk: i32,
    /// `struct tcp_sock`: `snd_una`, `snd_up`.
    pub snd_una: i32,
    pub snd_up: i32,
}

/// One socket of the table as the iterator reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SocketFile {
    pub fd: i32,
    /// The open file description's address: the same in every table
    /// (and every fd) that holds it.
    pub file: u64,
    /// References to the description besides the iterator's own while it
    /// looked (see [`references`]).
    pub references: u64,
    pub ino: u64,
    /// Meaningful for a TCP socket only.
    pub snd_una: u32,
    pub snd_up: u32,
}

/// The references a raw `f_ref` counts, less the one the iterator holds
/// while its program runs (file_ref_t: 0 is one reference; at and above
/// FILE_REF_RELEASED, 0xC000..., the file is going away).
pub fn references(raw: u64) -> u64 {
    if raw >= 0xC000_0000_0000_0000 {
        0
    } else {
        raw
    }
}

const MOV64_REG: u8 = 0xbf;
const MOV64_IMM: u8 = 0xb7;
const ADD64_IMM: u8 = 0x07;
const AND64_IMM: u8 = 0x57;
const LDX_DW: u8 = 0x79;
const LDX_W: u8 = 0x61;
const LDX_H: u8 = 0x69;
const STX_DW: u8 = 0x7b;
const ST_DW: u8 = 0x7a;
const JEQ_IMM: u8 = 0x15;
const JNE_IMM: u8 = 0x55;
const CALL: u8 = 0x85;
const EXIT: u8 = 0x95;

/// bpf_probe_read_kernel(fp + `to`, `size`, r`src` + `off`).
fn probe_read(p: &mut Vec<Insn>, to: i32, size: i32, src: u8, off: i32) {
    p.push(insn(MOV64_REG, 1, 10, 0, 0));
    p.push(insn(ADD64_IMM, 1, 0, 0, to));
    p.push(insn(MOV64_IMM, 2, 0, 0, size));
    p.push(insn(MOV64_REG, 3, src, 0, 0));
    p.push(insn(ADD64_IMM, 3, 0, 0, off));
    p.push(insn(CALL, 0, 0, 0, BPF_FUNC_PROBE_READ_KERNEL));
}

/// The program. The record sits at fp-40..fp: fd, file, f_ref, i_ino,
/// (snd_una, snd_up); fp-48 holds the `sk` pointer on its way.
fn program(l: &FileIterLayout) -> Vec<Insn> {
    let mut p = vec![
        insn(MOV64_REG, 6, 1, 0, 0),       // r6 = ctx
        insn(LDX_DW, 7, 6, l.ctx_file, 0), // r7 = ctx->file
    ];
    let to_exit_1 = p.len();
    p.push(insn(JEQ_IMM, 7, 0, 0, 0)); // no file (the end): done
    p.push(insn(LDX_DW, 8, 7, l.f_inode, 0)); // r8 = file->f_inode
    p.push(insn(LDX_H, 2, 8, l.i_mode, 0));
    p.push(insn(AND64_IMM, 2, 0, 0, 0o170000));
    let to_exit_2 = p.len();
    p.push(insn(JNE_IMM, 2, 0, 0, 0o140000)); // not a socket: nothing
    p.extend([
        insn(LDX_W, 2, 6, l.ctx_fd, 0),
        insn(STX_DW, 10, 2, -40, 0),
        insn(STX_DW, 10, 7, -32, 0),
        insn(LDX_DW, 2, 7, l.f_ref, 0),
        insn(STX_DW, 10, 2, -24, 0),
        insn(LDX_DW, 2, 8, l.i_ino, 0),
        insn(STX_DW, 10, 2, -16, 0),
        insn(ST_DW, 10, 0, -8, 0),
        insn(ST_DW, 10, 0, -48, 0),
        insn(LDX_DW, 9, 7, l.private_data, 0), // r9 = the struct socket
    ]);
    probe_read(&mut p, -48, 8, 9, l.socket_sk);
    p.push(insn(LDX_DW, 9, 10, -48, 0)); // r9 = sock->sk
    let to_write = p.len();
    p.push(insn(JEQ_IMM, 9, 0, 0, 0));
    probe_read(&mut p, -8, 4, 9, l.snd_una);
    probe_read(&mut p, -4, 4, 9, l.snd_up);
    let write = p.len();
    p.extend([
        insn(LDX_DW, 1, 6, l.ctx_meta, 0),
        insn(LDX_DW, 1, 1, l.meta_seq, 0),
        insn(MOV64_REG, 2, 10, 0, 0),
        insn(ADD64_IMM, 2, 0, 0, -(RECORD as i32)),
        insn(MOV64_IMM, 3, 0, 0, RECORD as i32),
        insn(CALL, 0, 0, 0, BPF_FUNC_SEQ_WRITE),
    ]);
    let exit = p.len();
    p.extend([insn(MOV64_IMM, 0, 0, 0, 0), insn(EXIT, 0, 0, 0, 0)]);
    for (at, to) in [(to_exit_1, exit), (to_exit_2, exit), (to_write, write)] {
        p[at].off = (to - at - 1) as i16;
    }
    p
}

/// Records in iterator output, in fd order. A read resumes at the fd
/// where the last one stopped; a record at or below the last fd seen is
/// one that read returned again and is skipped.
fn parse(bytes: &[u8], out: &mut Vec<SocketFile>) -> SysResult<()> {
    if !bytes.len().is_multiple_of(RECORD) {
        return Err(SysError::new("read(task_file iterator): a partial record", libc::EIO));
    }
    for r in bytes.chunks_exact(RECORD) {
        let word = |i: usize| u64::from_ne_bytes(r[i * 8..i * 8 + 8].try_into().unwrap_or([0; 8]));
        let tail = word(4);
        let s = SocketFile {
            fd: word(0) as i32,
            file: word(1),
            references: references(word(2)),
            ino: word(3),
            snd_una: tail as u32,
            snd_up: (tail >> 32) as u32,
        };
        if out.last().is_none_or(|l| s.fd > l.fd) {
            out.push(s);
        }
    }
    Ok(())
}

/// The loaded iterator program.
pub struct FileIterProgram {
    prog: OwnedFd,
}

impl FileIterProgram {
    /// The program as the host's list of programs shows it.
    pub fn info(&self) -> crate::SysResult<crate::bpf::ProgInfo> {
        crate::bpf::prog_info(std::os::fd::AsFd::as_fd(&self.prog))
    }

    /// Loads the program for `layout`; a refusal carries the last line
    /// of the verifier's log.
    pub fn load(layout: &FileIterLayout) -> Result<FileIterProgram, LoadRefused> {
        let insns = program(layout);
        load_iter(&insns, b"ferry_files", layout.attach_btf_id, "bpf(BPF_PROG_LOAD, task_file)")
            .map(|prog| FileIterProgram { prog })
    }

    /// Every socket in the fd table of thread `tid`, in fd order.
    pub fn sockets(&self, tid: i32) -> SysResult<Vec<SocketFile>> {
        read_task_files(open_task_iter(&self.prog, tid)?, parse)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(fd: u64, file: u64, raw: u64, ino: u64, una: u32, up: u32) -> Vec<u8> {
        let tail = una as u64 | (up as u64) << 32;
        [fd, file, raw, ino, tail].iter().flat_map(|w| w.to_ne_bytes()).collect()
    }

    #[test]
    fn records_are_read_in_fd_order_and_repeats_skipped() {
        let mut bytes = record(3, 0xffff_1000, 0, 77, 5, 9);
        bytes.extend(record(7, 0xffff_2000, 2, 78, 0, 0));
        let mut out = Vec::new();
        parse(&bytes, &mut out).expect("parse");
        parse(&record(7, 0xffff_2000, 2, 78, 0, 0), &mut out).expect("a repeat");
        parse(&record(9, 0xffff_3000, 0xC000_0000_0000_0000, 79, 0, 0), &mut out).expect("last");
        let fds: Vec<i32> = out.iter().map(|s| s.fd).collect();
        assert_eq!(fds, [3, 7, 9]);
        assert_eq!((out[0].snd_una, out[0].snd_up, out[0].ino), (5, 9, 77));
        assert_eq!(out[1].references, 2);
        assert_eq!(out[2].references, 0, "a released file holds nothing");
        assert!(parse(&bytes[..39], &mut out).is_err());
    }

    #[test]
    fn every_jump_lands_inside_the_program() {
        let l = FileIterLayout {
            attach_btf_id: 1,
            ctx_meta: 0,
            ctx_fd: 16,
            ctx_file: 24,
            meta_seq: 0,
            f_ref: 176,
            f_inode: 32,
            private_data: 24,
            i_mode: 0,
            i_ino: 64,
            socket_sk: 24,
            snd_una: 1672,
            snd_up: 1688,
        };
        let p = program(&l);
        for (i, ins) in p.iter().enumerate() {
            if matches!(ins.code, JEQ_IMM | JNE_IMM) {
                let to = i as i64 + 1 + ins.off as i64;
                assert!(to > i as i64 && (to as usize) < p.len(), "jump at {i} to {to}");
            }
        }
        assert_eq!(p.last().map(|i| i.code), Some(EXIT));
    }
}
