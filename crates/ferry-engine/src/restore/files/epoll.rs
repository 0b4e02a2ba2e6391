//! epoll: created empty, then every entry registered once all fds are in
//! place under their final numbers.

use super::{errno_err, owned};
use crate::error::Result;
use ferry_image::EpollEntry;
use std::os::fd::OwnedFd;

pub fn create(pid: i32) -> Result<OwnedFd> {
    // SAFETY: integer argument.
    owned(pid, unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) }, || "creating an epoll instance".into())
}

pub fn register(pid: i32, epfd: i32, entries: &[EpollEntry]) -> Result<()> {
    for e in entries {
        let mut ev = libc::epoll_event { events: e.events, u64: e.data };
        // SAFETY: ev is a valid epoll_event.
        if unsafe { libc::epoll_ctl(epfd, libc::EPOLL_CTL_ADD, e.fd, &mut ev) } < 0 {
            return Err(errno_err(pid, format!("registering fd {} with epoll fd {epfd}", e.fd)));
        }
    }
    Ok(())
}
