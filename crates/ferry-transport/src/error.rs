use std::path::PathBuf;

/// Why a key file, a handshake or a message failed. Every variant names the
/// file or the peer it is about.
#[derive(thiserror::Error, Debug)]
pub enum TransportError {
    #[error("key file {path} {reason}", path = path.display())]
    KeyFile { path: PathBuf, reason: String },
    #[error("cannot generate a key: the OS random number generator failed: {reason}")]
    Random { reason: String },
    #[error("handshake with {peer} refused: {reason}")]
    Handshake { peer: String, reason: String },
    // Not a `source`: the message already carries it, and an error chain
    // printer would repeat it.
    #[error("{what}: {error}")]
    Io { what: String, error: std::io::Error },
    #[error("peer closed the connection")]
    Closed,
    #[error("stream from {peer} is corrupt: {reason}")]
    Corrupt { peer: String, reason: String },
    #[error("message of {len} bytes is larger than the limit of {max} bytes", max = crate::MAX_MESSAGE)]
    TooLarge { len: u64 },
    #[error("timed out {what}")]
    Timeout { what: String },
}

impl TransportError {
    /// Maps a socket error, telling a timeout apart because callers retry or
    /// abort on it differently from a broken connection.
    pub(crate) fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        let what = what.into();
        match source.kind() {
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
                TransportError::Timeout { what }
            }
            _ => TransportError::Io { what, error: source },
        }
    }
}
