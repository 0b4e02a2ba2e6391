//! The service address that follows the process: taken off the source
//! host's interface during the freeze, put on the destination's before the
//! tree is released, and announced there (gratuitous ARP, or an
//! unsolicited neighbour advertisement for IPv6) so that clients on the
//! link send to the new host at once. Each side undoes its step when the
//! migration fails.

use crate::error::{MigrateError, Result};
use std::net::IpAddr;

/// The address, taken off this (source) host. Dropping it without
/// [`Taken::keep_off`] puts it back and announces it again.
pub struct Taken {
    ifindex: u32,
    addr: IpAddr,
    prefix: u8,
    done: bool,
}

/// Checks, before anything is frozen, that the address is on this host.
pub fn locate(addr: IpAddr) -> Result<(u32, u8)> {
    ferry_sys::address::find_address(addr)
        .map_err(|e| MigrateError::sys(format!("looking up address {addr}"), e))?
        .ok_or_else(|| {
            MigrateError::Invalid(format!("address {addr} is not on any interface of this host"))
        })
}

pub fn take(addr: IpAddr, prefix: u8) -> Result<Taken> {
    let (ifindex, have_prefix) = locate(addr)?;
    if have_prefix != prefix {
        return Err(MigrateError::Invalid(format!(
            "address {addr} is on this host as /{have_prefix}, not /{prefix}"
        )));
    }
    ferry_sys::address::del_address(ifindex, addr, prefix)
        .map_err(|e| MigrateError::sys(format!("removing address {addr}/{prefix}"), e))?;
    Ok(Taken { ifindex, addr, prefix, done: false })
}

impl Taken {
    /// The migration committed: the address lives at the destination now.
    pub fn keep_off(mut self) {
        self.done = true;
    }
}

impl Drop for Taken {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        if let Err(e) = ferry_sys::address::add_address(self.ifindex, self.addr, self.prefix) {
            tracing::error!("putting address {}/{} back: {e}", self.addr, self.prefix);
            return;
        }
        if let Err(e) = ferry_sys::announce::announce(self.ifindex, self.addr) {
            tracing::warn!("announcing address {} again: {e}", self.addr);
        }
    }
}

/// The address, put on this (destination) host. Dropping it without
/// [`Placed::keep`] removes it again.
pub struct Placed {
    ifindex: u32,
    addr: IpAddr,
    prefix: u8,
    kept: bool,
}

pub fn place(ifindex: u32, addr: IpAddr, prefix: u8) -> Result<Placed> {
    ferry_sys::address::add_address(ifindex, addr, prefix)
        .map_err(|e| MigrateError::sys(format!("adding address {addr}/{prefix}"), e))?;
    Ok(Placed { ifindex, addr, prefix, kept: false })
}

impl Placed {
    /// The service runs here: tell the link. The returned socket is best
    /// closed once the pause is over (closing it is slow, see
    /// ferry_sys::announce).
    pub fn announce_and_keep(mut self) -> Result<Option<std::os::fd::OwnedFd>> {
        self.kept = true;
        ferry_sys::announce::announce_keep_socket(self.ifindex, self.addr)
            .map_err(|e| MigrateError::sys(format!("announcing address {}", self.addr), e))
    }
}

impl Drop for Placed {
    fn drop(&mut self) {
        if self.kept {
            return;
        }
        if let Err(e) = ferry_sys::address::del_address(self.ifindex, self.addr, self.prefix) {
            tracing::error!("removing address {}/{} again: {e}", self.addr, self.prefix);
        }
    }
}
