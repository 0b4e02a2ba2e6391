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
//! * [`procfs`] parses the /proc files both sides read.

pub mod capture;
pub mod error;
pub mod freeze;
pub mod inject;
pub mod phases;
pub mod procfs;
pub mod restore;
pub mod syscall_restart;

pub use error::{EngineError, Result};

/// Threads used for bulk page work (copying, hashing): the CPUs we may
/// run on, at most 4.
pub fn worker_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get()).min(4)
}
