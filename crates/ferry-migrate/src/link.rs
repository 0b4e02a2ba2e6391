//! How fast either side notices that the link between the agents is
//! gone. Without this, a cut link is only seen when a blocked write or
//! read reaches its timeout (tens of seconds, and retransmissions back
//! off long past that): the source's pre-copy sends into a full socket
//! buffer and the service waits for a verdict. With it, data left
//! unacknowledged for [`USER_TIMEOUT_MS`] ends the connection
//! (TCP_USER_TIMEOUT), and a silent connection is probed every second
//! (keepalive), so a waiting side notices as fast as a sending one.
//!
//! The price: a peer whose kernel does not acknowledge for that long (a
//! host frozen for seconds) is taken for gone. Before the commit that
//! only costs a migration the source rolls back.

use crate::error::{MigrateError, Result};
use std::net::TcpStream;
use std::os::fd::AsRawFd;

/// Unacknowledged data older than this ends the connection.
pub const USER_TIMEOUT_MS: i32 = 4000;
const KEEPALIVE_IDLE_S: i32 = 1;
const KEEPALIVE_INTERVAL_S: i32 = 1;
const KEEPALIVE_PROBES: i32 = 3;

/// Sets the connection's liveness options (see the module documentation).
pub fn watch(stream: &TcpStream) -> Result<()> {
    let fd = stream.as_raw_fd();
    for (level, name, value, what) in [
        (libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1, "SO_KEEPALIVE"),
        (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, KEEPALIVE_IDLE_S, "TCP_KEEPIDLE"),
        (libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, KEEPALIVE_INTERVAL_S, "TCP_KEEPINTVL"),
        (libc::IPPROTO_TCP, libc::TCP_KEEPCNT, KEEPALIVE_PROBES, "TCP_KEEPCNT"),
        (libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT, USER_TIMEOUT_MS, "TCP_USER_TIMEOUT"),
    ] {
        ferry_sys::socket::setsockopt_int(fd, level, name, value).map_err(|e| {
            MigrateError::sys(format!("setting {what} on the agents' connection"), e)
        })?;
    }
    Ok(())
}
