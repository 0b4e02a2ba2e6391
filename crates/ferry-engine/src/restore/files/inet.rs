//! TCP and UDP sockets: options, bind, listen or connect. Established TCP
//! connections are rebuilt in repair mode by `tcp.rs`.

use crate::error::{EngineError, Result};
use ferry_image::{InetSocket, SockOpt};
use ferry_sys::socket;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

pub(crate) fn int_of(v: &[u8]) -> i32 {
    v.get(..4).map_or(0, |b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
}

pub(crate) fn is_opt(o: &SockOpt, level: i32, name: i32) -> bool {
    o.level == level && o.name == name
}

const SO_SNDBUFFORCE: i32 = 32;
const SO_RCVBUFFORCE: i32 = 33;

/// Sets one recorded option. The kernel doubles buffer sizes it is
/// given and reports the doubled value: hand back half, through the
/// FORCE variant, so that a size a privileged program forced above
/// net.core.wmem_max/rmem_max is not clamped to it.
pub(crate) fn apply_option(pid: i32, fd: RawFd, o: &SockOpt) -> Result<()> {
    if fault_skips(o) {
        return Ok(());
    }
    let forced = match (o.level, o.name) {
        (libc::SOL_SOCKET, libc::SO_SNDBUF) => Some(SO_SNDBUFFORCE),
        (libc::SOL_SOCKET, libc::SO_RCVBUF) => Some(SO_RCVBUFFORCE),
        _ => None,
    };
    let r = if let Some(force) = forced {
        socket::setsockopt_int(fd, o.level, force, int_of(&o.value) / 2)
    } else {
        socket::setsockopt_bytes(fd, o.level, o.name, &o.value)
    };
    r.map_err(|e| {
        EngineError::kernel(
            pid,
            format!("setting socket option {}/{} to {:?}", o.level, o.name, o.value),
            e,
        )
    })
}

/// Fault injection for tests: `FERRY_FAULT_SKIP_SOCKET_OPTION=LEVEL/NAME`
/// leaves that option unset, the very bug the restore's own check
/// (`restore/verify`) must catch before the tree runs.
/// The variable is read once: 10,000 connections' options would read
/// the environment (under its lock) and format a name for every option.
pub(crate) fn fault_skips(o: &SockOpt) -> bool {
    static SKIP: std::sync::OnceLock<Option<(i32, i32)>> = std::sync::OnceLock::new();
    let skip = SKIP.get_or_init(|| {
        let v = std::env::var("FERRY_FAULT_SKIP_SOCKET_OPTION").ok()?;
        let (level, name) = v.split_once('/')?;
        Some((level.parse().ok()?, name.parse().ok()?))
    });
    *skip == Some((o.level, o.name))
}

pub(crate) fn address(pid: i32, bytes: &[u8], port: u16) -> Result<SocketAddr> {
    let ip: std::net::IpAddr = match bytes.len() {
        4 => std::net::Ipv4Addr::new(bytes[0], bytes[1], bytes[2], bytes[3]).into(),
        16 => std::net::Ipv6Addr::from(<[u8; 16]>::try_from(bytes).unwrap_or([0; 16])).into(),
        n => return Err(EngineError::restore(pid, format!("socket address of {n} bytes"))),
    };
    Ok(SocketAddr::new(ip, port))
}

/// A UDP socket or a TCP one that is not connected (an established TCP
/// connection is `tcp::create`'s).
pub fn create(pid: i32, s: &InetSocket) -> Result<OwnedFd> {
    let sock = socket::socket(s.family, s.sock_type, s.protocol)
        .map_err(|e| EngineError::kernel(pid, "creating a socket", e))?;
    let fd = sock.as_raw_fd();
    for o in &s.options {
        apply_option(pid, fd, o)?;
    }
    let had_reuse = s
        .options
        .iter()
        .any(|o| is_opt(o, libc::SOL_SOCKET, libc::SO_REUSEADDR) && int_of(&o.value) != 0);
    // Connections the old process closed may linger in TIME_WAIT on this
    // port; bind through them, then put the option back as it was.
    let _ = socket::setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_REUSEADDR, 1);
    let local = address(pid, &s.addr, s.port)?;
    let unbound = s.port == 0 && local.ip().is_unspecified();
    if !unbound {
        socket::bind(fd, s.family, &local)
            .map_err(|e| EngineError::kernel(pid, format!("binding socket to {local}"), e))?;
    }
    if !had_reuse {
        let _ = socket::setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_REUSEADDR, 0);
    }
    if let Some((paddr, pport)) = &s.peer {
        let peer = address(pid, paddr, *pport)?;
        socket::connect(fd, s.family, &peer)
            .map_err(|e| EngineError::kernel(pid, format!("connecting UDP socket to {peer}"), e))?;
    }
    if let Some(backlog) = s.listen_backlog {
        socket::listen(fd, backlog)
            .map_err(|e| EngineError::kernel(pid, format!("listening on {local}"), e))?;
    }
    Ok(sock)
}
