//! The channel two ferry agents use to stream a process image (all of its
//! memory: a secret) from a source host to a destination host over one TCP
//! connection.
//!
//! Both agents hold the same 32-byte key file ([`Key`]); nothing else
//! (no certificates, no host keys) is needed. A connection is refused
//! during the handshake unless both ends prove they hold the key, before a
//! single payload byte is accepted.
//!
//! # Wire format (protocol version 1)
//!
//! ```text
//! initiator -> responder   [version: u8][mode: u8]  [len: u16 BE][Noise message 1]
//! responder -> initiator   [version: u8][answer: u8][len: u16 BE][Noise message 2]
//! initiator -> responder   [len: u16 BE][Noise transport frame, nonce 0: "ferry-confirm"]
//! then, each direction:    frames, [len: u16 BE][body: len bytes]
//! ```
//!
//! * **Version and mode** come first, in clear, so that a peer speaking
//!   another protocol version (or not ferry at all) is told apart from one
//!   with the wrong key, with a message that says which. They are also the
//!   Noise *prologue* (with a fixed label), which both sides hash into the
//!   handshake: a man in the middle who rewrites the mode byte (to downgrade
//!   `Encrypted` to `Insecure`) makes the handshake fail. The responder's
//!   `answer` is the mode it accepted, or a refusal code (wrong version,
//!   unknown mode, key not proven) sent before it closes so that the
//!   initiator can say why; the answer is not authenticated and only picks
//!   the error message.
//! * **Handshake**: `Noise_NNpsk0_25519_ChaChaPoly_BLAKE2s`. Fresh X25519
//!   ephemeral keys on both sides (forward secrecy: the key file alone does
//!   not decrypt a recorded stream), the pre-shared key (derived from the
//!   key file with BLAKE3 `derive_key`) mixed in before the first message.
//!   Message 1 carries an AEAD tag only the key holder can make, so the
//!   responder refuses a stranger on it; message 2 does the same for the
//!   initiator. Message 1 could be replayed by someone who recorded it, so
//!   the initiator also sends a key confirmation under the final session
//!   keys, which a replayer cannot make: the responder's `accept` returns
//!   only after it verified it.
//! * **Frames**: at most 65535 bytes (Noise's limit) including a 16-byte
//!   tag, so at most 65519 payload bytes. A frame's nonce is its number in
//!   its direction (the confirmation is 0, data frames count from 1), never
//!   sent: both sides count. A reordered, replayed, dropped or altered frame
//!   therefore fails its tag.
//! * **Messages**: a message of up to [`MAX_MESSAGE`] bytes is a run of
//!   frames whose payloads are concatenated; the first payload starts with
//!   the message length (u32 BE), every frame but the last is full. The
//!   length is read from the first (authenticated) frame, so a peer cannot
//!   make the receiver allocate more than it has actually sent.
//! * **Encrypted** mode: the frame body is the ChaCha20-Poly1305
//!   ciphertext and tag under the Noise session key of that direction.
//! * **Insecure** mode (trusted links, for speed): the body is the payload
//!   in clear followed by a 16-byte tag, the first 16 bytes of
//!   `BLAKE3-keyed(k, frame_number_u64_le || payload)`, where `k` is
//!   `BLAKE3-derive_key("ferry-transport v1 insecure MAC <direction>",
//!   handshake_hash)`. The handshake hash depends on the pre-shared key, so
//!   only the two key holders can compute `k`; the direction in the context
//!   keeps a frame from being reflected back to its sender; the frame number
//!   in the MAC detects reorder, replay and drop as in Encrypted mode. The
//!   handshake and the confirmation are the same in both modes.
//!
//! What the frames do not detect: a stream cut cleanly between two messages
//! looks like a peer that closed ([`TransportError::Closed`]). The protocol
//! carried over the channel must end with its own "done" message.

mod channel;
mod error;
mod key;

pub use channel::{Channel, RecvHalf, SendHalf};
pub use error::TransportError;
pub use key::Key;

/// Largest message `send` accepts and `recv` will receive: an image's
/// metadata travels as one message, and its process tree section may be
/// up to 1 GiB (it holds, for instance, the content of deleted files the
/// tree keeps open), so a little more than that. `recv` grows its buffer
/// with the bytes that arrive, not with the announced length.
pub const MAX_MESSAGE: usize = (1 << 30) + (64 << 20);

/// The protocol version sent before the handshake.
pub const PROTOCOL_VERSION: u8 = 1;

/// How long `connect` and `accept` wait for each handshake read or write
/// when the stream has no read timeout set, so that a silent peer cannot
/// hold an agent forever. A timeout set on the stream before the call is
/// used instead.
pub const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// What the channel protects. Both modes authenticate every frame; only
/// `Encrypted` hides the bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Encrypted,
    /// Integrity-checked but not encrypted, for a link where nobody else can
    /// read the traffic and encryption would cost throughput.
    Insecure,
}

impl Mode {
    fn to_byte(self) -> u8 {
        match self {
            Mode::Encrypted => 1,
            Mode::Insecure => 2,
        }
    }

    fn from_byte(b: u8) -> Option<Mode> {
        match b {
            1 => Some(Mode::Encrypted),
            2 => Some(Mode::Insecure),
            _ => None,
        }
    }
}
