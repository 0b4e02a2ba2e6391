//! Every mapping of a process with its raw `vm_flags`, read by a BPF
//! task_vma iterator: no page table is walked, so it costs microseconds
//! where /proc/PID/smaps (the only other place the flags are shown)
//! walks every present page (~15 ms per GiB).
//!
//! The program is seventeen instructions assembled here rather than a C
//! object: it needs the offsets of four kernel structure members, which
//! the caller reads from the running kernel's BTF (aya, the BPF loader
//! ferry uses for the network lock, has no iterator programs, and a
//! compiled object would need CO-RE relocation for the same offsets).
//!
//! Per read: a link restricted to the process's main thread
//! (`bpf_iter_link_info.task.tid`), an iterator of that link, and one read
//! of (start, end, vm_flags) records (see [`VmaIterProgram::read`] for
//! why only one).

use crate::{last_error, SysError, SysResult};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_ITER_CREATE: libc::c_long = 33;
const BPF_PROG_TYPE_TRACING: u32 = 26;
const BPF_TRACE_ITER: u32 = 28;
pub(crate) const BPF_FUNC_SEQ_WRITE: i32 = 127;

/// Where the program finds what it reads, in bytes, and which kernel
/// function it attaches to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IterLayout {
    /// BTF id of the FUNC `bpf_iter_task_vma` in the kernel's BTF.
    pub attach_btf_id: u32,
    /// `struct bpf_iter__task_vma`: `meta` and `vma`.
    pub ctx_meta: i16,
    pub ctx_vma: i16,
    /// `struct bpf_iter_meta`: `seq`.
    pub meta_seq: i16,
    /// `struct vm_area_struct`: `vm_start`, `vm_end`, `vm_flags`.
    pub vm_start: i16,
    pub vm_end: i16,
    pub vm_flags: i16,
}

/// One mapping as the iterator reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawVma {
    pub start: u64,
    pub end: u64,
    pub flags: u64,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct Insn {
    pub(crate) code: u8,
    regs: u8,
    pub(crate) off: i16,
    imm: i32,
}

pub(crate) const fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn { code, regs: (src << 4) | dst, off, imm }
}

/// The iterator program: for each mapping, bpf_seq_write of
/// {vm_start, vm_end, vm_flags} from the stack.
fn program(l: &IterLayout) -> Vec<Insn> {
    const MOV64_REG: u8 = 0xbf;
    const LDX_DW: u8 = 0x79;
    const STX_DW: u8 = 0x7b;
    const JEQ_IMM: u8 = 0x15;
    const ADD64_IMM: u8 = 0x07;
    const MOV64_IMM: u8 = 0xb7;
    const CALL: u8 = 0x85;
    const EXIT: u8 = 0x95;
    vec![
        insn(MOV64_REG, 6, 1, 0, 0),       // r6 = ctx
        insn(LDX_DW, 7, 6, l.ctx_vma, 0),  // r7 = ctx->vma
        insn(JEQ_IMM, 7, 0, 12, 0),        // no mapping (the end): done
        insn(LDX_DW, 1, 6, l.ctx_meta, 0), // r1 = ctx->meta
        insn(LDX_DW, 1, 1, l.meta_seq, 0), // r1 = meta->seq
        insn(LDX_DW, 2, 7, l.vm_start, 0), // the record, on the stack
        insn(STX_DW, 10, 2, -24, 0),
        insn(LDX_DW, 2, 7, l.vm_end, 0),
        insn(STX_DW, 10, 2, -16, 0),
        insn(LDX_DW, 2, 7, l.vm_flags, 0),
        insn(STX_DW, 10, 2, -8, 0),
        insn(MOV64_REG, 2, 10, 0, 0), // r2 = &record
        insn(ADD64_IMM, 2, 0, 0, -24),
        insn(MOV64_IMM, 3, 0, 0, 24), // r3 = its size
        insn(CALL, 0, 0, 0, BPF_FUNC_SEQ_WRITE),
        insn(MOV64_IMM, 0, 0, 0, 0),
        insn(EXIT, 0, 0, 0, 0),
    ]
}

/// `union bpf_attr` as BPF_PROG_LOAD reads it (Linux 5.5+ layout).
#[repr(C)]
#[derive(Default, Clone)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
    prog_btf_fd: u32,
    func_info_rec_size: u32,
    func_info: u64,
    func_info_cnt: u32,
    line_info_rec_size: u32,
    line_info: u64,
    line_info_cnt: u32,
    attach_btf_id: u32,
    attach_btf_obj_fd: u32,
    pad: u32,
}

/// `union bpf_attr` as BPF_LINK_CREATE reads it for an iterator.
#[repr(C)]
#[derive(Default)]
struct LinkCreateAttr {
    prog_fd: u32,
    target_fd: u32,
    attach_type: u32,
    flags: u32,
    iter_info: u64,
    iter_info_len: u32,
    pad: u32,
}

/// `union bpf_iter_link_info`, its `task` member.
#[repr(C)]
#[derive(Default)]
struct IterTaskInfo {
    tid: u32,
    pid: u32,
    pid_fd: u32,
    pad: u32,
}

/// `union bpf_attr` as BPF_ITER_CREATE reads it.
#[repr(C)]
#[derive(Default)]
struct IterCreateAttr {
    link_fd: u32,
    flags: u32,
}

fn bpf<T>(cmd: libc::c_long, attr: &mut T, what: &'static str) -> SysResult<OwnedFd> {
    // SAFETY: attr is a live, initialised bpf_attr variant of its own size,
    // which the kernel reads (and may write within) for this command.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut T as *mut libc::c_void,
            std::mem::size_of::<T>(),
        )
    };
    if fd < 0 {
        return Err(last_error(what));
    }
    // SAFETY: the kernel returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// The kernel refused the program: the call's error and the last line of
/// the verifier's log (empty when it wrote none).
#[derive(Debug, Clone)]
pub struct LoadRefused {
    pub error: SysError,
    pub verifier: String,
}

impl std::fmt::Display for LoadRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.verifier.is_empty() {
            write!(f, "{}", self.error)
        } else {
            write!(f, "{} (verifier: {})", self.error, self.verifier)
        }
    }
}

/// Loads an iterator program attached to the kernel function
/// `attach_btf_id`; a refusal carries the last line of the verifier's log.
pub(crate) fn load_iter(
    insns: &[Insn],
    name: &[u8],
    attach_btf_id: u32,
    what: &'static str,
) -> Result<OwnedFd, LoadRefused> {
    let license = c"GPL";
    let mut log = vec![0u8; 16 * 1024];
    let mut prog_name = [0u8; 16];
    let n = name.len().min(15);
    prog_name[..n].copy_from_slice(&name[..n]);
    let mut attr = ProgLoadAttr {
        prog_type: BPF_PROG_TYPE_TRACING,
        insn_cnt: insns.len() as u32,
        insns: insns.as_ptr() as u64,
        license: license.as_ptr() as u64,
        prog_name,
        expected_attach_type: BPF_TRACE_ITER,
        attach_btf_id,
        ..Default::default()
    };
    // Without the verifier's log first: writing it made a load of 20
    // instructions take ~0.8 ms. Only a refusal is loaded again with it,
    // for its reason.
    if let Ok(prog) = bpf(BPF_PROG_LOAD, &mut attr.clone(), "bpf(BPF_PROG_LOAD)") {
        return Ok(prog);
    }
    attr.log_level = 1;
    attr.log_size = log.len() as u32;
    attr.log_buf = log.as_mut_ptr() as u64;
    bpf(BPF_PROG_LOAD, &mut attr, "bpf(BPF_PROG_LOAD)").map_err(|error| {
        let text = String::from_utf8_lossy(&log[..log.iter().position(|&b| b == 0).unwrap_or(0)])
            .into_owned();
        let verifier = text
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty() && !l.starts_with("processed "))
            .unwrap_or("")
            .to_string();
        LoadRefused { error: SysError::new(what, error.errno), verifier }
    })
}

/// An iterator of `prog` over the one task `tid` (its fd table or its
/// address space, whichever the program iterates), as a readable file.
pub(crate) fn open_task_iter(prog: &OwnedFd, tid: i32) -> SysResult<std::fs::File> {
    let mut info = IterTaskInfo { tid: tid as u32, ..Default::default() };
    let mut link_attr = LinkCreateAttr {
        prog_fd: prog.as_raw_fd() as u32,
        attach_type: BPF_TRACE_ITER,
        iter_info: &mut info as *mut IterTaskInfo as u64,
        iter_info_len: std::mem::size_of::<IterTaskInfo>() as u32,
        ..Default::default()
    };
    let link = bpf(BPF_LINK_CREATE, &mut link_attr, "bpf(BPF_LINK_CREATE, task iterator)")?;
    let mut iter_attr = IterCreateAttr { link_fd: link.as_raw_fd() as u32, flags: 0 };
    let iter = bpf(BPF_ITER_CREATE, &mut iter_attr, "bpf(BPF_ITER_CREATE)")?;
    Ok(std::fs::File::from(iter))
}

/// An iterator of `prog` over what its target walks without parameters
/// (the TCP sockets of the calling thread's network namespace).
/// Reads a task_file iterator's output to its end, each read's bytes
/// given to `parse`: 64 KiB a read, at most
/// 100,000 reads (a table of a million fds is 40 MB).
pub(crate) fn read_task_files<T>(
    mut file: std::fs::File,
    mut parse: impl FnMut(&[u8], &mut Vec<T>) -> SysResult<()>,
) -> SysResult<Vec<T>> {
    let mut out = Vec::new();
    let mut bytes = vec![0u8; 64 * 1024];
    for _ in 0..100_000 {
        let n = std::io::Read::read(&mut file, &mut bytes).map_err(|e| {
            SysError::new("read(task_file iterator)", e.raw_os_error().unwrap_or(libc::EIO))
        })?;
        if n == 0 {
            return Ok(out);
        }
        parse(&bytes[..n], &mut out)?;
    }
    Err(SysError::new("read(task_file iterator): it never ended", libc::E2BIG))
}

pub(crate) fn open_iter(prog: &OwnedFd) -> SysResult<std::fs::File> {
    let mut link_attr = LinkCreateAttr {
        prog_fd: prog.as_raw_fd() as u32,
        attach_type: BPF_TRACE_ITER,
        ..Default::default()
    };
    let link = bpf(BPF_LINK_CREATE, &mut link_attr, "bpf(BPF_LINK_CREATE, iterator)")?;
    let mut iter_attr = IterCreateAttr { link_fd: link.as_raw_fd() as u32, flags: 0 };
    let iter = bpf(BPF_ITER_CREATE, &mut iter_attr, "bpf(BPF_ITER_CREATE)")?;
    Ok(std::fs::File::from(iter))
}

/// The loaded iterator program.
pub struct VmaIterProgram {
    prog: OwnedFd,
}

impl VmaIterProgram {
    /// The program as the host's list of programs shows it.
    pub fn info(&self) -> crate::SysResult<crate::bpf::ProgInfo> {
        crate::bpf::prog_info(std::os::fd::AsFd::as_fd(&self.prog))
    }

    /// Loads the program for `layout`; a refusal carries the last line
    /// of the verifier's log.
    pub fn load(layout: &IterLayout) -> Result<VmaIterProgram, LoadRefused> {
        let insns = program(layout);
        load_iter(
            &insns,
            b"ferry_vmas",
            layout.attach_btf_id,
            "bpf(BPF_PROG_LOAD, task_vma iterator)",
        )
        .map(|prog| VmaIterProgram { prog })
    }

    /// Every mapping of process `pid` (its main thread's address space),
    /// in address order.
    pub fn read(&self, pid: i32) -> SysResult<Vec<RawVma>> {
        let mut file = open_task_iter(&self.prog, pid)?;
        // One read returns at most the kernel's iterator buffer (32 KiB,
        // ~1,365 mappings), and on 6.18 a read that resumes where the last
        // one stopped may return the same mappings again and again (seen
        // with 4,000 mappings, and with reads smaller than the output): so
        // everything must come in the first read, and the second must
        // find the end.
        let mut bytes = vec![0u8; 64 * 1024];
        let read = |file: &mut std::fs::File, buf: &mut [u8]| {
            std::io::Read::read(file, buf).map_err(|e| {
                SysError::new("read(task_vma iterator)", e.raw_os_error().unwrap_or(libc::EIO))
            })
        };
        let n = read(&mut file, &mut bytes)?;
        let mut more = [0u8; 24];
        if read(&mut file, &mut more)? != 0 {
            return Err(SysError::new(
                "read(task_vma iterator): more mappings than one read holds",
                libc::E2BIG,
            ));
        }
        if n % 24 != 0 {
            return Err(SysError::new("read(task_vma iterator): a partial record", libc::EIO));
        }
        let vmas: Vec<RawVma> = bytes[..n]
            .chunks_exact(24)
            .map(|r| {
                let word =
                    |i: usize| u64::from_ne_bytes(r[i * 8..i * 8 + 8].try_into().unwrap_or([0; 8]));
                RawVma { start: word(0), end: word(1), flags: word(2) }
            })
            .collect();
        if vmas.windows(2).any(|w| w[1].start < w[0].end) || vmas.iter().any(|v| v.end <= v.start) {
            return Err(SysError::new("read(task_vma iterator): mappings out of order", libc::EIO));
        }
        Ok(vmas)
    }
}
