//! SOL_SOCKET options of a unix socket, read in the freeze: those that
//! differ from what a fresh unix socket has, in the order restore sets
//! them (`restore/files/unix_options.rs`). Buffer sizes and their lock
//! are always read: their defaults come from sysctls the restoring host
//! may have set otherwise. The options a unix socket may hold in the
//! image are `ferry_image::UNIX_SOCKET_OPTIONS`; the catalog's unix table
//! marks them restored, so the check before the freeze leaves them alone.

use super::FdInfo;
use crate::error::{EngineError, Result};
use ferry_image::{SockOpt, UnixSocketOptions};
use std::os::fd::RawFd;

const SO_PASSSEC: i32 = 34;
const SO_PEEK_OFF: i32 = 42;
const SO_PASSPIDFD: i32 = 76;

/// What an option of a fresh unix socket reads.
#[derive(Clone, Copy, Debug)]
enum Fresh {
    /// All zero bytes.
    Zero,
    Int(i32),
    /// Depends on the host (sysctls): always recorded.
    Host,
}

/// The options in restore's order: buffer sizes before their lock (the
/// FORCE calls set it), SO_PEEK_OFF last.
const OPTIONS: &[(i32, Fresh)] = &[
    (libc::SO_SNDBUF, Fresh::Host),
    (libc::SO_RCVBUF, Fresh::Host),
    (ferry_sys::socket::SO_BUF_LOCK, Fresh::Host),
    (libc::SO_DEBUG, Fresh::Zero),
    (libc::SO_REUSEADDR, Fresh::Zero),
    (libc::SO_DONTROUTE, Fresh::Zero),
    (libc::SO_BROADCAST, Fresh::Zero),
    (libc::SO_KEEPALIVE, Fresh::Zero),
    (libc::SO_OOBINLINE, Fresh::Zero),
    (libc::SO_NO_CHECK, Fresh::Zero),
    (libc::SO_PRIORITY, Fresh::Zero),
    (libc::SO_LINGER, Fresh::Zero),
    (libc::SO_RCVLOWAT, Fresh::Int(1)),
    (libc::SO_RCVTIMEO, Fresh::Zero),
    (libc::SO_SNDTIMEO, Fresh::Zero),
    (libc::SO_TIMESTAMP, Fresh::Zero),
    (libc::SO_TIMESTAMPNS, Fresh::Zero),
    (SO_PASSSEC, Fresh::Zero),
    (SO_PASSPIDFD, Fresh::Zero),
    (libc::SO_MARK, Fresh::Zero),
    (libc::SO_RXQ_OVFL, Fresh::Zero),
    (libc::SO_SELECT_ERR_QUEUE, Fresh::Zero),
    (75, Fresh::Zero), // SO_RCVMARK
    (libc::SO_BUSY_POLL, Fresh::Zero),
    (69, Fresh::Zero), // SO_PREFER_BUSY_POLL
    (82, Fresh::Zero), // SO_RCVPRIORITY
    // Off: descriptors sent to it are refused (those queued before are
    // sent again before it is set).
    (83, Fresh::Int(1)), // SO_PASSRIGHTS
    (SO_PEEK_OFF, Fresh::Int(-1)),
];

fn is_fresh(value: &[u8], fresh: Fresh) -> bool {
    match fresh {
        Fresh::Zero => value.iter().all(|b| *b == 0),
        Fresh::Int(v) => value == v.to_ne_bytes(),
        Fresh::Host => false,
    }
}

/// The options of the unix socket `fd` (inode `ino`) restore must set.
/// `queued`: messages wait in its receive queue. Asking for the sender's
/// pidfd or security label is refused then: restore sends the queue
/// again from ferry, and the messages would carry ferry's.
pub(super) fn read(info: &FdInfo, fd: RawFd, ino: u64, queued: bool) -> Result<UnixSocketOptions> {
    let mut options = Vec::new();
    for &(name, fresh) in OPTIONS {
        let value =
            ferry_sys::socket::getsockopt_bytes(fd, libc::SOL_SOCKET, name, 16).map_err(|e| {
                EngineError::kernel(
                    info.pid,
                    format!("fd {}: reading unix socket option {}", info.fd, option_name(name)),
                    e,
                )
            })?;
        if is_fresh(&value, fresh) {
            continue;
        }
        if queued && matches!(name, SO_PASSSEC | SO_PASSPIDFD) {
            return Err(info.unsupported(format!(
                "{} is on and messages are queued: restore sends them again from ferry, so they would carry ferry's {}",
                option_name(name),
                if name == SO_PASSSEC { "security label" } else { "pid" }
            )));
        }
        options.push(SockOpt { level: libc::SOL_SOCKET, name, value });
    }
    Ok(UnixSocketOptions { ino, options })
}

fn option_name(name: i32) -> String {
    crate::catalog::socket_options::describe(&crate::catalog::socket_options::UNIX, name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_option_is_one_the_image_takes_and_buffers_come_first() {
        for (name, _) in OPTIONS {
            assert!(
                ferry_image::UNIX_SOCKET_OPTIONS.iter().any(|(n, _)| n == name),
                "{name} is not in UNIX_SOCKET_OPTIONS"
            );
        }
        assert_eq!(OPTIONS.len(), ferry_image::UNIX_SOCKET_OPTIONS.len());
        assert_eq!(OPTIONS[2].0, ferry_sys::socket::SO_BUF_LOCK);
        assert_eq!(OPTIONS.last().map(|o| o.0), Some(SO_PEEK_OFF));
    }

    #[test]
    fn fresh_values_are_not_recorded() {
        assert!(is_fresh(&[0; 16], Fresh::Zero));
        assert!(!is_fresh(&[0, 0, 0, 1], Fresh::Zero));
        assert!(is_fresh(&(-1i32).to_ne_bytes(), Fresh::Int(-1)));
        assert!(!is_fresh(&2i32.to_ne_bytes(), Fresh::Int(-1)));
        assert!(!is_fresh(&212_992i32.to_ne_bytes(), Fresh::Host));
    }
}
