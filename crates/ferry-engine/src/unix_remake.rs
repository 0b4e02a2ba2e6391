//! Which end of a connected pair of unix sockets connected, decided from
//! the image alone. Checkpoint refuses a pair restore could not remake, so
//! both apply this same rule.

use ferry_image::UnixSocket;

/// How the connection between two unix sockets of the image, each the
/// other's peer, is made again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Remake {
    /// socketpair(2): neither end has a name, as socketpair leaves them.
    Pair,
    /// One end (the client) connects to a temporary listener bound at the
    /// other end's name, which accepts the other end: the accepted end then
    /// has that name (getsockname) and the client has it as its peer's
    /// (getpeername), as after the original connect/accept. A client with
    /// a name of its own is bound to it first.
    Connect { client_is_a: bool },
}

/// How the connected pair `a`, `b` is made again. `listener_named(name)`
/// says whether a listener of the tree (of their type) is bound at `name`.
/// An accepted end always has a name (its listener's, a listener can only
/// be named); the client has one only if it was bound (or autobound, with
/// SO_PASSCRED): so the only named end is the accepted one, and when both
/// are named the accepted end is the one named like a listener of the
/// tree. Both named and neither (or both) named like a listener: which end
/// connected is unknown, and guessing would bind the wrong name to a
/// client (and possibly a path): an error, refused at checkpoint already.
/// Datagram sockets are not remade this way: their names are their own
/// bindings (`datagram_socket`).
pub(crate) fn remake_of(
    a: &UnixSocket,
    b: &UnixSocket,
    listener_named: impl Fn(&[u8]) -> bool,
) -> std::result::Result<Remake, String> {
    if a.sock_type == libc::SOCK_DGRAM {
        return Ok(Remake::Pair);
    }
    match (a.name.is_empty(), b.name.is_empty()) {
        (true, true) => Ok(Remake::Pair),
        (true, false) => Ok(Remake::Connect { client_is_a: true }),
        (false, true) => Ok(Remake::Connect { client_is_a: false }),
        (false, false) => match (listener_named(&a.name), listener_named(&b.name)) {
            (false, true) => Ok(Remake::Connect { client_is_a: true }),
            (true, false) => Ok(Remake::Connect { client_is_a: false }),
            _ => Err(format!(
                "both ends of this connection are bound ({} and {}) and not exactly one is named like a listener of the tree, so which end connected (and whose name is its own binding) is unknown",
                show(&a.name),
                show(&b.name)
            )),
        },
    }
}

/// A unix name for messages: an abstract name's leading NUL as '@'.
pub(crate) fn show(name: &[u8]) -> String {
    String::from_utf8_lossy(name).replace('\0', "@")
}
