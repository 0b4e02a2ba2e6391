//! The character devices that carry no state (null, zero, full, random,
//! urandom): checkpoint accepts them, and restore makes a node again only
//! for one of them, so that an image cannot make ferry create a node of
//! any other device. Both sides must agree on the list.

pub(crate) const PLAIN_DEVICES: &[&str] =
    &["/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom"];

/// Whether `rdev` is one of the devices of PLAIN_DEVICES (mem driver,
/// major 1: null 3, zero 5, full 7, random 8, urandom 9).
pub(crate) fn is_plain_device(rdev: u64) -> bool {
    libc::major(rdev as libc::dev_t) == 1
        && [3, 5, 7, 8, 9].contains(&libc::minor(rdev as libc::dev_t))
}
