//! Socket options: every option the image recorded for an IPv4/IPv6
//! socket, or for a unix socket (format 4.8), reads back with the same
//! bytes. A rebuilt TCP connection is
//! read through ferry's own descriptor, and the options it gets only once
//! its send queue is written again (after this check) are left out.

use super::Findings;
use crate::error::{EngineError, Result};
use crate::restore::files::tcp::deferred;
use ferry_image::{FileKind, ProcessImage, SockOpt};
use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd};

/// IPV6_V6ONLY of a rebuilt IPv6 connection: binding to its (specific)
/// local address sets it, and the kernel refuses to change it once bound.
/// It has no effect on a connected socket; docs/coverage.md lists the
/// difference (getsockopt reads 1).
fn bind_sets(o: &SockOpt) -> bool {
    o.level == libc::IPPROTO_IPV6 && o.name == libc::IPV6_V6ONLY
}

/// An option's value as a reader takes it: an integer, or the bytes.
fn shown(v: &[u8]) -> String {
    match <[u8; 4]>::try_from(v) {
        Ok(b) => i32::from_ne_bytes(b).to_string(),
        Err(_) => format!("{v:02x?}"),
    }
}

/// The option's name as the catalog knows it, and its level/number.
fn option_name(level: i32, name: i32) -> String {
    match crate::catalog::socket_options::inet_option_name(level, name) {
        Some(known) => format!("{known} (socket option {level}/{name})"),
        None => format!("socket option {level}/{name}"),
    }
}

/// The options of the unix sockets of the tree (format 4.8), by inode.
pub(super) fn unix_options(tree: &ferry_image::TreeImage) -> HashMap<u64, &[SockOpt]> {
    tree.unix_socket_options
        .iter()
        .flat_map(|o| &o.sockets)
        .map(|s| (s.ino, s.options.as_slice()))
        .collect()
}

/// The options of one socket the check reads back.
fn checked_options<'a>(
    file: &'a ferry_image::OpenFile,
    unix: &HashMap<u64, &'a [SockOpt]>,
) -> Option<Vec<&'a SockOpt>> {
    let options: Vec<&SockOpt> = match &file.kind {
        FileKind::InetSocket(s) => {
            let rebuilt = s.connection.is_some();
            s.options.iter().filter(|o| !(rebuilt && (deferred(o) || bind_sets(o)))).collect()
        }
        FileKind::UnixSocket(u) => unix.get(&u.ino)?.iter().collect(),
        _ => return None,
    };
    (!options.is_empty()).then_some(options)
}

pub(super) fn compare(
    p: &ProcessImage,
    unix: &HashMap<u64, &[SockOpt]>,
    connections: &HashMap<u64, OwnedFd>,
    found: &mut Findings,
) -> Result<()> {
    let first_fd = ferry_image::first_fd_of_each_file(&p.fds);
    let sockets: Vec<(i32, &ferry_image::OpenFile, Vec<&SockOpt>)> = p
        .files
        .iter()
        .enumerate()
        .filter_map(|(index, file)| {
            Some((*first_fd.get(&(index as u32))?, file, checked_options(file, unix)?))
        })
        .collect();
    if sockets.is_empty() {
        return Ok(());
    }
    let pidfd = ferry_sys::pidfd::pidfd_open(p.pid)
        .map_err(|e| EngineError::kernel(p.pid, "pidfd_open for the restore's check", e))?;
    // One getsockopt per recorded option, on the worker threads.
    let per_socket = crate::parallel::map(&sockets, |(fd, file, options)| {
        let taken;
        let sock = match connections.get(&file.id) {
            Some(own) => own.as_raw_fd(),
            None => {
                taken = ferry_sys::pidfd::pidfd_getfd(&pidfd, *fd).map_err(|e| {
                    EngineError::kernel(p.pid, format!("fd {fd}: taking the socket to check it"), e)
                })?;
                taken.as_raw_fd()
            }
        };
        let mut mine = Findings::default();
        let unix = matches!(file.kind, FileKind::UnixSocket(_));
        compare_options(p.pid, *fd, sock, options, unix, &mut mine)?;
        Ok(mine.list)
    })?;
    found.list.extend(per_socket.into_iter().flatten());
    Ok(())
}

fn compare_options(
    pid: i32,
    fd: i32,
    sock: std::os::fd::RawFd,
    options: &[&SockOpt],
    unix: bool,
    found: &mut Findings,
) -> Result<()> {
    let object = format!("fd {fd} ({}socket)", if unix { "unix " } else { "" });
    for o in options {
        // As the capture read it: at most 64 bytes (SO_BINDTODEVICE
        // refuses a buffer shorter than a device name).
        let now = ferry_sys::socket::getsockopt_bytes(sock, o.level, o.name, o.value.len().max(64))
            .map_err(|e| {
                EngineError::kernel(
                    pid,
                    format!("fd {fd}: reading socket option {}/{}", o.level, o.name),
                    e,
                )
            })?;
        found.compare(pid, &object, &option_name(o.level, o.name), shown(&o.value), shown(&now));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_read_as_integers_when_they_are_one() {
        assert_eq!(shown(&16_777_216i32.to_ne_bytes()), "16777216");
        assert_eq!(shown(b"lo\0"), "[6c, 6f, 00]");
        assert_eq!(option_name(1, 7), "SO_SNDBUF (socket option 1/7)");
        assert_eq!(option_name(6, 99), "socket option 6/99");
    }
}
