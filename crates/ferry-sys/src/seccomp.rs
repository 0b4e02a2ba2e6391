//! seccomp state of a traced thread: read its filters
//! (PTRACE_SECCOMP_GET_FILTER / GET_METADATA) and keep seccomp from
//! acting on it while ferry runs injected code (PTRACE_O_SUSPEND_SECCOMP).

use crate::error::SysResult;

pub const PTRACE_SETOPTIONS: u32 = 0x4200;
pub const PTRACE_SECCOMP_GET_FILTER: u32 = 0x420c;
pub const PTRACE_SECCOMP_GET_METADATA: u32 = 0x420d;
pub const PTRACE_O_SUSPEND_SECCOMP: u64 = 1 << 21;
pub const SECCOMP_FILTER_FLAG_LOG: u64 = 1 << 1;
/// The return action that hands a syscall to a user-space listener.
pub const SECCOMP_RET_USER_NOTIF: u32 = 0x7fc0_0000;
pub const SECCOMP_RET_ACTION_FULL: u32 = 0xffff_0000;

/// Replaces the ptrace options of traced thread `tid` (the kernel has no
/// "add one option": pass every option wanted).
pub fn set_options(tid: i32, options: u64) -> SysResult<()> {
    // SAFETY: PTRACE_SETOPTIONS takes the options as an integer.
    let r = unsafe {
        libc::ptrace(
            PTRACE_SETOPTIONS as _,
            tid,
            std::ptr::null_mut::<libc::c_void>(),
            options as usize as *mut libc::c_void,
        )
    };
    crate::check("ptrace(PTRACE_SETOPTIONS)", r).map(drop)
}

/// Filter `index` of stopped traced thread `tid` (0: the oldest, the
/// first installed) as
/// classic BPF instructions, each `struct sock_filter` packed in a u64
/// exactly as in memory (code u16, jt u8, jf u8, k u32).
pub fn get_filter(tid: i32, index: u64) -> SysResult<Vec<u64>> {
    // SAFETY: a NULL buffer asks for the instruction count only.
    let n = unsafe {
        libc::ptrace(
            PTRACE_SECCOMP_GET_FILTER as _,
            tid,
            index as usize as *mut libc::c_void,
            std::ptr::null_mut::<libc::c_void>(),
        )
    };
    let n = crate::check("ptrace(PTRACE_SECCOMP_GET_FILTER)", n)? as usize;
    let mut insns = vec![0u64; n];
    // SAFETY: the buffer holds n struct sock_filter (8 bytes each).
    let m = unsafe {
        libc::ptrace(
            PTRACE_SECCOMP_GET_FILTER as _,
            tid,
            index as usize as *mut libc::c_void,
            insns.as_mut_ptr() as *mut libc::c_void,
        )
    };
    let m = crate::check("ptrace(PTRACE_SECCOMP_GET_FILTER)", m)? as usize;
    insns.truncate(m);
    Ok(insns)
}

/// The flags a filter was installed with (only SECCOMP_FILTER_FLAG_LOG is
/// reported by the kernel).
pub fn get_filter_flags(tid: i32, index: u64) -> SysResult<u64> {
    // struct seccomp_metadata { __u64 filter_off; __u64 flags; }
    let mut md = [index, 0u64];
    // SAFETY: addr is the size of the struct, data points at it.
    let r = unsafe {
        libc::ptrace(
            PTRACE_SECCOMP_GET_METADATA as _,
            tid,
            16usize as *mut libc::c_void,
            md.as_mut_ptr() as *mut libc::c_void,
        )
    };
    crate::check("ptrace(PTRACE_SECCOMP_GET_METADATA)", r)?;
    Ok(md[1])
}

/// (code, k) of a packed instruction.
pub fn insn_code_k(insn: u64) -> (u16, u32) {
    ((insn & 0xffff) as u16, (insn >> 32) as u32)
}
