use ferry_sys::SysError;
use std::path::PathBuf;

/// Why an outbox could not be made, used or removed. `context` names the
/// outbox (address, queue number, network namespace) or, for the removal
/// of stale rules, the namespace.
#[derive(Debug, thiserror::Error)]
pub enum OutboxError {
    #[error("{context}: {source}")]
    Sys { context: String, source: SysError },
    #[error("{context}: {request} on nfqueue {queue}: {}", errno_text(*errno))]
    Netlink { context: String, request: &'static str, queue: u16, errno: i32 },
    #[error("{context}: no answer from the kernel to {request} on nfqueue {queue} within 2 s")]
    NoAnswer { context: String, request: &'static str, queue: u16 },
    #[error("{context}: {what} {}: {source}", path.display())]
    Io { context: String, what: &'static str, path: PathBuf, source: std::io::Error },
    #[error("{context}: running `{command}`: {source}")]
    Spawn { context: String, command: String, source: std::io::Error },
    #[error("{context}: `{command}` failed ({status}): {stderr}")]
    Command { context: String, command: String, status: String, stderr: String },
}

fn errno_text(errno: i32) -> String {
    let hint = match errno {
        libc::EPERM => " (another socket has bound this queue number)",
        libc::EBUSY => " (this queue number is bound already)",
        _ => "",
    };
    format!("{} (errno {errno}){hint}", std::io::Error::from_raw_os_error(errno))
}
