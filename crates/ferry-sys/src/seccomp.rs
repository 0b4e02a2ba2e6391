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

/// Whether the kernel accepts `insns` (packed as [`get_filter`] returns
/// them) as a seccomp filter: a forked child loads it into itself with
/// seccomp(SECCOMP_SET_MODE_FILTER) and ends. The kernel's own check
/// (instruction set, jumps in range, a return at the end) is the answer;
/// the filter never runs in this process. An error carries the errno of
/// seccomp(2) (EINVAL: not a valid program; EFAULT, ENOMEM...).
pub fn filter_loads(insns: &[u64]) -> SysResult<()> {
    const SECCOMP_SET_MODE_FILTER: libc::c_long = 1;
    let len = u16::try_from(insns.len())
        .map_err(|_| crate::SysError::new("seccomp(SECCOMP_SET_MODE_FILTER)", libc::EINVAL))?;
    let prog = libc::sock_fprog { len, filter: insns.as_ptr() as *mut libc::sock_filter };
    let no_core = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: fork has no preconditions; the child below makes raw
    // syscalls only (async-signal-safe: this process may have threads)
    // on memory prepared before the fork, and ends with _exit.
    let child = unsafe { libc::fork() };
    if child < 0 {
        return Err(crate::last_error("fork"));
    }
    if child == 0 {
        // SAFETY: plain arguments and `prog`, which outlives the calls;
        // the child ends without returning into Rust code. A filter that
        // denies exit_group ends it by a signal (counted as loaded); no
        // core is written for it.
        unsafe {
            libc::setrlimit(libc::RLIMIT_CORE, &no_core);
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0 {
                libc::_exit(*libc::__errno_location());
            }
            let r = libc::syscall(
                libc::SYS_seccomp,
                SECCOMP_SET_MODE_FILTER,
                0 as libc::c_long,
                &prog as *const libc::sock_fprog,
            );
            libc::_exit(if r < 0 { *libc::__errno_location() } else { 0 })
        }
    }
    match crate::process::wait_pid(child) {
        Some(0) => Ok(()),
        // Died by a signal: only a loaded filter can have caused it.
        Some(code) if code > 128 => Ok(()),
        Some(errno) => Err(crate::SysError::new("seccomp(SECCOMP_SET_MODE_FILTER)", errno)),
        None => Err(crate::SysError::new("waitpid", libc::ECHILD)),
    }
}

#[cfg(test)]
mod load_tests {
    use super::*;

    /// BPF_RET|BPF_K with value `k`, packed.
    fn ret(k: u32) -> u64 {
        0x06 | (u64::from(k) << 32)
    }

    #[test]
    fn a_valid_filter_loads_and_a_broken_one_is_refused() {
        if !crate::process::is_root() {
            return;
        }
        // SECCOMP_RET_ALLOW
        assert_eq!(filter_loads(&[ret(0x7fff_0000)]), Ok(()));
        // A jump past the end of the program.
        let jump_out = 0x05 | (100u64 << 32);
        let e = filter_loads(&[jump_out, ret(0x7fff_0000)]).expect_err("refused");
        assert_eq!(e.errno, libc::EINVAL);
        // Empty.
        assert_eq!(filter_loads(&[]).expect_err("refused").errno, libc::EINVAL);
        // SECCOMP_RET_KILL_PROCESS for everything: the child dies, the
        // filter loaded.
        assert_eq!(filter_loads(&[ret(0x8000_0000)]), Ok(()));
    }
}
