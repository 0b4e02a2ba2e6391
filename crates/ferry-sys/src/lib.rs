//! Thin, typed wrappers over the Linux interfaces ferry's engine uses.
//!
//! Every `unsafe` block of the project that talks to the kernel lives in this
//! crate, each with a SAFETY note. Callers get `Result<_, SysError>` values
//! that name the syscall and the errno, so the engine can add the object
//! (PID, fd, address) the call was about.

pub mod address;
pub mod announce;
pub mod anonfd;
pub mod bpf;
pub mod btrfs;
pub mod clone;
pub mod epoll;
pub mod error;
pub mod fd;
pub mod file_iter;
pub mod host_files;
pub mod inotify;
pub mod lock;
pub mod netns;
pub mod orphan;
pub mod pagemap;
pub mod perf;
pub mod pidfd;
pub mod placed;
pub mod process;
pub mod ptrace;
pub mod raw_ip;
mod rtnl;
pub mod seccomp;
pub mod seccomp_notify;
pub mod signal;
pub mod sockdiag;
pub mod socket;
pub mod stop_warden;
pub mod sysv;
pub mod tcp_iter;
pub mod tty;
pub mod uffd;
pub mod unix;
pub mod uts;
pub mod vm;
pub mod vma_iter;

pub use error::{SysError, SysResult};

/// x86_64 general-purpose registers as the kernel's ptrace interface
/// exposes them (`struct user_regs_struct`).
pub type Regs = libc::user_regs_struct;

pub const PAGE_SIZE: u64 = 4096;

/// Returns the calling thread's errno as a `SysError` for `call`.
pub(crate) fn last_error(call: &'static str) -> SysError {
    SysError::new(call, std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
}

/// Converts a raw `syscall(2)` style return value into a result.
pub(crate) fn check(call: &'static str, ret: libc::c_long) -> SysResult<libc::c_long> {
    if ret < 0 {
        Err(last_error(call))
    } else {
        Ok(ret)
    }
}
