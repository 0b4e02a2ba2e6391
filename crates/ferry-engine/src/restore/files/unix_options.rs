//! SOL_SOCKET options of the tree's unix sockets (format 4.8,
//! `UnixSocketOptions`), set once every unix socket is made and its queue
//! written again: a small send buffer would stop the refill, SO_RCVLOWAT
//! and SO_PEEK_OFF count in the queue. An option the new socket already
//! has is left alone, so setting a buffer size does not also lock it.

use crate::error::{EngineError, Result};
use ferry_image::{FileKind, SockOpt, TreeImage};
use ferry_sys::socket;
use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

const SO_SNDBUFFORCE: i32 = 32;
const SO_RCVBUFFORCE: i32 = 33;

/// Sets the recorded options of every unix socket of the tree through
/// ferry's descriptor of it (`staged`, by file id).
pub fn apply_all(tree: &TreeImage, staged: &HashMap<u64, OwnedFd>) -> Result<()> {
    let Some(image) = &tree.unix_socket_options else {
        return Ok(());
    };
    let by_ino: HashMap<u64, &[SockOpt]> =
        image.sockets.iter().map(|s| (s.ino, s.options.as_slice())).collect();
    let mut done = std::collections::HashSet::new();
    for p in &tree.processes {
        for f in &p.files {
            let FileKind::UnixSocket(u) = &f.kind else { continue };
            let Some(options) = by_ino.get(&u.ino) else { continue };
            if !done.insert(u.ino) {
                continue;
            }
            let fd = staged.get(&f.id).ok_or_else(|| {
                EngineError::restore(
                    p.pid,
                    format!("unix socket {}: not made to set its options", u.ino),
                )
            })?;
            for o in *options {
                apply(fd.as_raw_fd(), o).map_err(|e| {
                    EngineError::kernel(
                        p.pid,
                        format!(
                            "unix socket {}: setting socket option {} to {:?}",
                            u.ino,
                            name_of(o.name),
                            o.value
                        ),
                        e,
                    )
                })?;
            }
        }
    }
    Ok(())
}

fn name_of(name: i32) -> String {
    crate::catalog::socket_options::describe(&crate::catalog::socket_options::UNIX, name)
}

/// One option, unless the socket has it already. The kernel doubles a
/// buffer size it is given and reports the doubled value: half goes
/// through the FORCE variant, so that a size above net.core.wmem_max or
/// rmem_max is not clamped. A linger time kept with lingering off is set
/// with lingering on first (turning it off keeps the time).
fn apply(fd: RawFd, o: &SockOpt) -> std::result::Result<(), ferry_sys::SysError> {
    let now = socket::getsockopt_bytes(fd, o.level, o.name, o.value.len().max(4))?;
    if now == o.value || super::inet::fault_skips(o) {
        return Ok(());
    }
    let int = super::inet::int_of(&o.value);
    match o.name {
        libc::SO_SNDBUF => socket::setsockopt_int(fd, o.level, SO_SNDBUFFORCE, int / 2),
        libc::SO_RCVBUF => socket::setsockopt_int(fd, o.level, SO_RCVBUFFORCE, int / 2),
        libc::SO_LINGER if int == 0 => {
            let mut on = o.value.clone();
            on[..4].copy_from_slice(&1i32.to_ne_bytes());
            socket::setsockopt_bytes(fd, o.level, o.name, &on)?;
            socket::setsockopt_bytes(fd, o.level, o.name, &o.value)
        }
        _ => socket::setsockopt_bytes(fd, o.level, o.name, &o.value),
    }
}
