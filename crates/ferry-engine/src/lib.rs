//! ferry's checkpoint/restore engine.
//!
//! * [`freeze`] stops every thread of a process with ptrace (seize +
//!   interrupt) and lets it go again unharmed.
//! * [`inject`] runs system calls inside a stopped process, which is how
//!   state that only the process itself can read or set is reached.
//! * [`capture`] turns a frozen process into an image, one module per kind
//!   of kernel object.
//! * [`restore`] rebuilds a process from an image, with the same module
//!   split.
//! * [`dirty`] tracks which pages of a running tree are written (pre-copy).
//! * [`procfs`] parses the /proc files both sides read.
//! * [`running_sockets`] lists a running tree's TCP and UDP sockets, for
//!   a migration's checks before the freeze.

pub mod btf;
pub mod capture;
pub mod catalog;
pub mod dirty;
pub mod error;
pub mod freeze;
pub mod guard;
pub mod held_memory;
pub mod inject;
pub mod kernel_btf;
pub mod lazy;
pub(crate) mod parallel;
pub mod phases;
pub mod pids;
pub(crate) mod plain_devices;
pub mod priority;
pub(crate) mod proc_state;
pub mod procfs;
pub(crate) mod pty_queues;
pub mod restore;
pub mod running_files;
pub mod running_sockets;
pub mod syscall_restart;
pub(crate) mod tcp_repair;
pub(crate) mod unix_remake;
pub mod vm_flags;

pub use error::{EngineError, Result};
pub use pids::{HostPid, TreePid};

/// Reports (bytes done, bytes total) of page copying; called from the
/// copying threads, so it must be cheap and thread-safe.
pub type ProgressFn = std::sync::Arc<dyn Fn(u64, u64) + Send + Sync>;

/// Shared byte counter behind a [`ProgressFn`].
pub(crate) struct ProgressCounter<'a> {
    report: Option<&'a ProgressFn>,
    done: std::sync::atomic::AtomicU64,
    total: u64,
}

impl<'a> ProgressCounter<'a> {
    pub fn new(report: Option<&'a ProgressFn>, total: u64) -> Self {
        ProgressCounter { report, done: std::sync::atomic::AtomicU64::new(0), total }
    }
    pub fn add(&self, bytes: u64) {
        if let Some(r) = self.report {
            let done = self.done.fetch_add(bytes, std::sync::atomic::Ordering::Relaxed) + bytes;
            r(done, self.total);
        }
    }
}

/// Threads used for bulk page work (copying, hashing): the CPUs we may
/// run on, at most 4, or FERRY_COPY_THREADS if set (1 to 64).
/// Worked out once: the standard library reads the cgroup's CPU quota
/// files for it, and a replicated service captures many times a second.
pub fn worker_threads() -> usize {
    static THREADS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *THREADS.get_or_init(|| {
        let set = std::env::var("FERRY_COPY_THREADS").ok().and_then(|v| v.parse::<usize>().ok());
        match set {
            Some(n) => n.clamp(1, 64),
            None => std::thread::available_parallelism().map_or(1, |n| n.get()).min(4),
        }
    })
}
