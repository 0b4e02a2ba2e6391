//! Signal dispositions and the alternate signal stack of the calling
//! process. Both calls allocate nothing and are async-signal-safe, so a
//! freshly forked child can use them.

use crate::{check, last_error, SysResult};

/// Resets the disposition of `sig` to SIG_DFL with no flags and an empty
/// mask, through the raw rt_sigaction syscall (glibc's wrappers would add
/// their own flags and mask).
pub fn reset_to_default(sig: i32) -> SysResult<()> {
    // struct kernel_sigaction { handler, flags, restorer, mask }: all zero
    // is SIG_DFL.
    let dfl = [0u64; 4];
    // SAFETY: dfl is a valid 32-byte kernel sigaction; no old value requested.
    check("rt_sigaction", unsafe {
        libc::syscall(
            libc::SYS_rt_sigaction,
            sig,
            dfl.as_ptr(),
            std::ptr::null_mut::<u64>(),
            8usize,
        )
    })
    .map(drop)
}

/// Turns the calling thread's alternate signal stack off (SS_DISABLE).
pub fn disable_altstack() -> SysResult<()> {
    let off = libc::stack_t { ss_sp: std::ptr::null_mut(), ss_flags: libc::SS_DISABLE, ss_size: 0 };
    // SAFETY: off is a valid stack_t; no old value requested.
    if unsafe { libc::sigaltstack(&off, std::ptr::null_mut()) } < 0 {
        return Err(last_error("sigaltstack"));
    }
    Ok(())
}

/// Installs `handler` for `sig` (plain signal(2) semantics). The handler
/// must be async-signal-safe; only `kill`-style forwarding is used here.
pub fn set_handler(sig: i32, handler: extern "C" fn(libc::c_int)) -> SysResult<()> {
    // SAFETY: installing a function pointer as the handler; what it does
    // when it runs is the caller's promise (documented above).
    if unsafe { libc::signal(sig, handler as *const () as libc::sighandler_t) } == libc::SIG_ERR {
        return Err(last_error("signal"));
    }
    Ok(())
}
