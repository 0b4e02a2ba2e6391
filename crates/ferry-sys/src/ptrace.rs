//! ptrace: seizing threads, reading and writing their state.

use crate::{check, last_error, Regs, SysResult};

pub const PTRACE_SEIZE: u32 = 0x4206;
pub const PTRACE_INTERRUPT: u32 = 0x4207;
pub const PTRACE_PEEKSIGINFO: u32 = 0x4209;
pub const PTRACE_GETSIGMASK: u32 = 0x420a;
pub const PTRACE_SETSIGMASK: u32 = 0x420b;
pub const PTRACE_GET_RSEQ_CONFIGURATION: u32 = 0x420f;
pub const PTRACE_PEEKSIGINFO_SHARED: u32 = 1;
pub const NT_X86_XSTATE: usize = 0x202;

pub const PTRACE_O_TRACEFORK: u64 = 1 << 1;
pub const PTRACE_O_TRACECLONE: u64 = 1 << 3;
pub const PTRACE_O_EXITKILL: u64 = 1 << 20;
pub const PTRACE_EVENT_FORK: i32 = 1;
pub const PTRACE_EVENT_CLONE: i32 = 3;
pub const PTRACE_EVENT_STOP: i32 = 128;

fn req(
    request: u32,
    tid: i32,
    addr: usize,
    data: usize,
    name: &'static str,
) -> SysResult<libc::c_long> {
    // SAFETY: every caller passes `addr`/`data` that are either integers or
    // pointers to live buffers of the size the request expects.
    let r = unsafe {
        libc::ptrace(request as _, tid, addr as *mut libc::c_void, data as *mut libc::c_void)
    };
    if r < 0 {
        return Err(last_error(name));
    }
    Ok(r)
}

pub fn seize(tid: i32, options: u64) -> SysResult<()> {
    req(PTRACE_SEIZE, tid, 0, options as usize, "ptrace(PTRACE_SEIZE)").map(drop)
}

pub fn interrupt(tid: i32) -> SysResult<()> {
    req(PTRACE_INTERRUPT, tid, 0, 0, "ptrace(PTRACE_INTERRUPT)").map(drop)
}

pub fn detach(tid: i32, sig: i32) -> SysResult<()> {
    req(libc::PTRACE_DETACH, tid, 0, sig as usize, "ptrace(PTRACE_DETACH)").map(drop)
}

pub fn cont(tid: i32, sig: i32) -> SysResult<()> {
    req(libc::PTRACE_CONT, tid, 0, sig as usize, "ptrace(PTRACE_CONT)").map(drop)
}

pub fn single_step(tid: i32, sig: i32) -> SysResult<()> {
    req(libc::PTRACE_SINGLESTEP, tid, 0, sig as usize, "ptrace(PTRACE_SINGLESTEP)").map(drop)
}

pub fn event_msg(tid: i32) -> SysResult<u64> {
    let mut msg: libc::c_ulong = 0;
    req(
        libc::PTRACE_GETEVENTMSG,
        tid,
        0,
        &mut msg as *mut _ as usize,
        "ptrace(PTRACE_GETEVENTMSG)",
    )?;
    Ok(msg)
}

pub fn get_regs(tid: i32) -> SysResult<Regs> {
    // SAFETY: user_regs_struct is plain integers; all-zero is valid.
    let mut regs: Regs = unsafe { std::mem::zeroed() };
    req(libc::PTRACE_GETREGS, tid, 0, &mut regs as *mut _ as usize, "ptrace(PTRACE_GETREGS)")?;
    Ok(regs)
}

pub fn set_regs(tid: i32, regs: &Regs) -> SysResult<()> {
    req(libc::PTRACE_SETREGS, tid, 0, regs as *const _ as usize, "ptrace(PTRACE_SETREGS)").map(drop)
}

/// The full XSAVE area (x87, SSE, AVX, AVX-512, PKRU...) of a thread.
pub fn get_xstate(tid: i32) -> SysResult<Vec<u8>> {
    let mut buf = vec![0u8; 16384];
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    req(
        libc::PTRACE_GETREGSET,
        tid,
        NT_X86_XSTATE,
        &mut iov as *mut _ as usize,
        "ptrace(PTRACE_GETREGSET, NT_X86_XSTATE)",
    )?;
    buf.truncate(iov.iov_len);
    Ok(buf)
}

pub fn set_xstate(tid: i32, xstate: &[u8]) -> SysResult<()> {
    let mut iov = libc::iovec { iov_base: xstate.as_ptr() as *mut _, iov_len: xstate.len() };
    req(
        libc::PTRACE_SETREGSET,
        tid,
        NT_X86_XSTATE,
        &mut iov as *mut _ as usize,
        "ptrace(PTRACE_SETREGSET, NT_X86_XSTATE)",
    )
    .map(drop)
}

pub fn get_sigmask(tid: i32) -> SysResult<u64> {
    let mut mask: u64 = 0;
    req(PTRACE_GETSIGMASK, tid, 8, &mut mask as *mut _ as usize, "ptrace(PTRACE_GETSIGMASK)")?;
    Ok(mask)
}

pub fn set_sigmask(tid: i32, mask: u64) -> SysResult<()> {
    req(PTRACE_SETSIGMASK, tid, 8, &mask as *const _ as usize, "ptrace(PTRACE_SETSIGMASK)")
        .map(drop)
}

/// A raw 128-byte siginfo as the kernel stores it.
pub type RawSiginfo = [u8; 128];

#[repr(C)]
struct PeekSiginfoArgs {
    off: u64,
    flags: u32,
    nr: i32,
}

/// Reads pending signals without dequeuing them: the thread's private
/// queue, or the process-wide one when `shared`.
pub fn peek_siginfo(tid: i32, shared: bool) -> SysResult<Vec<RawSiginfo>> {
    let mut out = Vec::new();
    let mut buf = vec![[0u8; 128]; 32];
    loop {
        let args = PeekSiginfoArgs {
            off: out.len() as u64,
            flags: if shared { PTRACE_PEEKSIGINFO_SHARED } else { 0 },
            nr: buf.len() as i32,
        };
        let n = req(
            PTRACE_PEEKSIGINFO,
            tid,
            &args as *const _ as usize,
            buf.as_mut_ptr() as usize,
            "ptrace(PTRACE_PEEKSIGINFO)",
        )?;
        if n <= 0 {
            break;
        }
        out.extend_from_slice(&buf[..n as usize]);
        if (n as usize) < buf.len() {
            break;
        }
    }
    Ok(out)
}

/// A thread's registered restartable-sequence area.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct RseqConfig {
    pub rseq_abi_pointer: u64,
    pub rseq_abi_size: u32,
    pub signature: u32,
    pub flags: u32,
    pub pad: u32,
}

pub fn get_rseq_config(tid: i32) -> SysResult<RseqConfig> {
    let mut conf = RseqConfig::default();
    req(
        PTRACE_GET_RSEQ_CONFIGURATION,
        tid,
        std::mem::size_of::<RseqConfig>(),
        &mut conf as *mut _ as usize,
        "ptrace(PTRACE_GET_RSEQ_CONFIGURATION)",
    )?;
    Ok(conf)
}

/// How a waited-for thread changed state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitEvent {
    Exited(i32),
    Signaled(i32),
    /// Stopped; `sig` is the stop signal, `event` the PTRACE_EVENT_* (0 if none).
    Stopped {
        sig: i32,
        event: i32,
    },
}

pub fn wait_tid(tid: i32, flags: i32) -> SysResult<Option<(i32, WaitEvent)>> {
    let mut status = 0;
    // SAFETY: status is a valid out pointer.
    let r = unsafe { libc::waitpid(tid, &mut status, flags | libc::__WALL) };
    let r = check("waitpid", r as libc::c_long)? as i32;
    if r == 0 {
        return Ok(None);
    }
    let ev = if libc::WIFEXITED(status) {
        WaitEvent::Exited(libc::WEXITSTATUS(status))
    } else if libc::WIFSIGNALED(status) {
        WaitEvent::Signaled(libc::WTERMSIG(status))
    } else {
        WaitEvent::Stopped { sig: libc::WSTOPSIG(status), event: (status >> 16) & 0xff }
    };
    Ok(Some((r, ev)))
}

/// Gives a running thread that ferry no longer traces its signal mask
/// back: seize it, stop it, set the mask, let it go. Retries the seize
/// for up to a second, since a dying tracer's threads are detached only
/// after its files are closed. Best effort: failures are ignored.
pub fn put_back_sigmask(tid: i32, mask: u64) {
    for _ in 0..200 {
        match seize(tid, 0) {
            Ok(()) => break,
            Err(e) if e.errno == libc::EPERM => {
                std::thread::sleep(std::time::Duration::from_millis(5))
            }
            Err(_) => return,
        }
    }
    if interrupt(tid).is_err() {
        let _ = detach(tid, 0);
        return;
    }
    loop {
        match wait_tid(tid, 0) {
            Ok(Some((_, WaitEvent::Stopped { event: PTRACE_EVENT_STOP, .. }))) => break,
            // A signal stop: let the signal through and wait on.
            Ok(Some((_, WaitEvent::Stopped { sig, .. }))) => {
                if cont(tid, sig).is_err() {
                    return;
                }
            }
            _ => return,
        }
    }
    let _ = set_sigmask(tid, mask);
    let _ = detach(tid, 0);
}

/// PTRACE_GET_SYSCALL_USER_DISPATCH_CONFIG: the thread's syscall user
/// dispatch mode (0: off), selector, offset and length.
pub fn get_syscall_user_dispatch(tid: i32) -> SysResult<[u64; 4]> {
    const PTRACE_GET_SYSCALL_USER_DISPATCH_CONFIG: u32 = 0x4211;
    let mut cfg = [0u64; 4];
    req(
        PTRACE_GET_SYSCALL_USER_DISPATCH_CONFIG,
        tid,
        std::mem::size_of_val(&cfg),
        cfg.as_mut_ptr() as usize,
        "ptrace(PTRACE_GET_SYSCALL_USER_DISPATCH_CONFIG)",
    )?;
    Ok(cfg)
}
