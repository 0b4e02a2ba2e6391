//! The handshake and the framing; the wire format is described in the crate
//! documentation.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use snow::StatelessTransportState;
use zeroize::Zeroizing;

use crate::{Key, Mode, TransportError, HANDSHAKE_TIMEOUT, MAX_MESSAGE, PROTOCOL_VERSION};

const NOISE_PARAMS: &str = "Noise_NNpsk0_25519_ChaChaPoly_BLAKE2s";
const PROLOGUE_LABEL: &[u8] = b"ferry-transport\0";
const PSK_CONTEXT: &str = "ferry-transport v1 Noise pre-shared key";
const MAC_CONTEXT_I2R: &str = "ferry-transport v1 insecure MAC initiator to responder";
const MAC_CONTEXT_R2I: &str = "ferry-transport v1 insecure MAC responder to initiator";
const CONFIRM: &[u8] = b"ferry-confirm";

/// Responder answers that refuse the connection (any other answer is the
/// accepted mode).
const REFUSED_VERSION: u8 = 0xf0;
const REFUSED_MODE: u8 = 0xf1;
const REFUSED_KEY: u8 = 0xf2;

const TAG_LEN: usize = 16;
/// Noise's limit on one message, tag included.
const MAX_FRAME: usize = 65535;
const MAX_PAYLOAD: usize = MAX_FRAME - TAG_LEN;
const LEN_PREFIX: usize = 4;
/// Handshake messages of this pattern are 48 bytes; anything much larger is
/// not a ferry agent, and reading it would only waste memory.
const MAX_HANDSHAKE_MESSAGE: usize = 256;
/// Several frames per write()/read() so that a big message costs few
/// syscalls, small enough to stay in cache between sealing and sending.
const IO_BUF: usize = 4 * (2 + MAX_FRAME);
/// How long a refusing responder waits for the initiator to read its answer
/// and close: short, since a stranger may never close.
const REFUSAL_DRAIN: Duration = Duration::from_millis(200);

/// A connected, authenticated channel. Messages go both ways; a message is
/// received whole or not at all.
pub struct Channel {
    send: SendHalf,
    recv: RecvHalf,
    mode: Mode,
}

impl std::fmt::Debug for Channel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Channel")
            .field("peer", &self.send.peer)
            .field("mode", &self.mode)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for SendHalf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendHalf")
            .field("peer", &self.peer)
            .field("bytes", &self.bytes)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for RecvHalf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecvHalf")
            .field("peer", &self.peer)
            .field("bytes", &self.bytes)
            .finish_non_exhaustive()
    }
}

/// The sending half of a [`Channel::split`] channel.
pub struct SendHalf {
    stream: TcpStream,
    peer: Option<SocketAddr>,
    sealer: Sealer,
    /// Number of the next frame, its nonce.
    frame: u64,
    /// Number of messages sent so far (errors name the message by it).
    messages: u64,
    buf: Vec<u8>,
    used: usize,
    gather: Vec<u8>,
    bytes: u64,
    broken: Option<String>,
}

/// The receiving half of a [`Channel::split`] channel.
pub struct RecvHalf {
    stream: TcpStream,
    peer: Option<SocketAddr>,
    opener: Sealer,
    frame: u64,
    messages: u64,
    buf: Vec<u8>,
    start: usize,
    end: usize,
    /// The message being received when a read timed out, kept so that the
    /// next recv() continues it.
    partial: Option<Partial>,
    scratch: Vec<u8>,
    bytes: u64,
    broken: Option<Broken>,
}

struct Partial {
    msg: Vec<u8>,
    len: usize,
}

enum Broken {
    Closed,
    Failed(String),
}

/// Protection of one direction.
enum Sealer {
    Noise(Arc<StatelessTransportState>),
    Mac(Zeroizing<[u8; 32]>),
}

impl Sealer {
    fn seal(&self, frame: u64, payload: &[u8], out: &mut [u8]) -> Result<usize, snow::Error> {
        match self {
            Sealer::Noise(state) => state.write_message(frame, payload, out),
            Sealer::Mac(key) => {
                let n = payload.len();
                out[..n].copy_from_slice(payload);
                out[n..n + TAG_LEN].copy_from_slice(&mac(key, frame, payload));
                Ok(n + TAG_LEN)
            }
        }
    }

    /// Checks and decodes `body` into `out` (at least `body.len()` long);
    /// None when the frame is not authentic.
    fn open(&self, frame: u64, body: &[u8], out: &mut [u8]) -> Option<usize> {
        match self {
            Sealer::Noise(state) => state.read_message(frame, body, out).ok(),
            Sealer::Mac(key) => {
                let n = body.len().checked_sub(TAG_LEN)?;
                let (payload, tag) = body.split_at(n);
                let expected = mac(key, frame, payload);
                // No early exit: the time taken must not tell a forger how
                // many tag bytes it got right.
                let diff = expected.iter().zip(tag).fold(0u8, |acc, (a, b)| acc | (a ^ b));
                if diff != 0 {
                    return None;
                }
                out[..n].copy_from_slice(payload);
                Some(n)
            }
        }
    }
}

fn mac(key: &[u8; 32], frame: u64, payload: &[u8]) -> [u8; TAG_LEN] {
    let mut hasher = blake3::Hasher::new_keyed(key);
    hasher.update(&frame.to_le_bytes());
    hasher.update(payload);
    let mut tag = [0u8; TAG_LEN];
    tag.copy_from_slice(&hasher.finalize().as_bytes()[..TAG_LEN]);
    tag
}

fn peer_name(peer: Option<SocketAddr>) -> String {
    peer.map_or_else(|| "unknown peer".to_string(), |p| p.to_string())
}

fn prologue(mode: Mode) -> Vec<u8> {
    let mut p = PROLOGUE_LABEL.to_vec();
    p.push(PROTOCOL_VERSION);
    p.push(mode.to_byte());
    p
}

/// The handshake's view of the stream: every failure is a refusal naming the
/// peer, timeouts included, since a peer that stays silent is refused too.
struct Handshake<'a> {
    stream: &'a mut TcpStream,
    peer: Option<SocketAddr>,
    sent: u64,
    received: u64,
}

impl Handshake<'_> {
    fn refuse(&self, reason: impl Into<String>) -> TransportError {
        TransportError::Handshake { peer: peer_name(self.peer), reason: reason.into() }
    }

    fn io_refusal(&self, doing: &str, e: std::io::Error) -> TransportError {
        let reason = match e.kind() {
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
                format!("timed out {doing}: the peer is not a ferry agent, or is stuck")
            }
            std::io::ErrorKind::UnexpectedEof => format!(
                "the peer closed the connection while {doing}: it does not hold the same key, \
                 or is not a ferry agent"
            ),
            _ => format!("{doing}: {e}"),
        };
        self.refuse(reason)
    }

    fn write(&mut self, bytes: &[u8], doing: &str) -> Result<(), TransportError> {
        self.stream.write_all(bytes).map_err(|e| self.io_refusal(doing, e))?;
        self.sent += bytes.len() as u64;
        Ok(())
    }

    fn read_exact(&mut self, buf: &mut [u8], doing: &str) -> Result<(), TransportError> {
        self.stream.read_exact(buf).map_err(|e| self.io_refusal(doing, e))?;
        self.received += buf.len() as u64;
        Ok(())
    }

    /// Tells the initiator why it is refused. The rest of what it sent is
    /// read and dropped first: closing a socket with unread bytes sends a
    /// reset, which can destroy the answer before the initiator reads it.
    fn answer_refusal(&mut self, code: u8) {
        if self.stream.write_all(&[PROTOCOL_VERSION, code]).is_err() {
            return;
        }
        let _ = self.stream.shutdown(Shutdown::Write);
        if self.stream.set_read_timeout(Some(REFUSAL_DRAIN)).is_err() {
            return;
        }
        let mut sink = [0u8; 1024];
        for _ in 0..16 {
            match self.stream.read(&mut sink) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    }

    /// Reads one length-prefixed handshake message.
    fn read_message(&mut self, doing: &str) -> Result<Vec<u8>, TransportError> {
        let mut len = [0u8; 2];
        self.read_exact(&mut len, doing)?;
        let len = usize::from(u16::from_be_bytes(len));
        if len > MAX_HANDSHAKE_MESSAGE {
            return Err(self.refuse(format!(
                "{doing}: got a {len}-byte handshake message, a ferry agent sends at most \
                 {MAX_HANDSHAKE_MESSAGE}: not a ferry agent"
            )));
        }
        let mut msg = vec![0u8; len];
        self.read_exact(&mut msg, doing)?;
        Ok(msg)
    }
}

fn framed(prefix: &[u8], msg: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(prefix.len() + 2 + msg.len());
    out.extend_from_slice(prefix);
    // Handshake messages and frames are at most MAX_FRAME long by construction.
    out.extend_from_slice(&(msg.len() as u16).to_be_bytes());
    out.extend_from_slice(msg);
    out
}

fn noise_builder<'a>(
    psk: &'a [u8; 32],
    prologue: &'a [u8],
    hs: &Handshake<'_>,
) -> Result<snow::Builder<'a>, TransportError> {
    let params = NOISE_PARAMS
        .parse()
        .map_err(|e| hs.refuse(format!("Noise parameters {NOISE_PARAMS} not supported: {e}")))?;
    snow::Builder::new(params)
        .psk(0, psk)
        .and_then(|b| b.prologue(prologue))
        .map_err(|e| hs.refuse(format!("cannot set up the Noise handshake: {e}")))
}

/// Applies the handshake timeout unless the caller set one, and restores
/// the caller's setting afterwards.
struct TimeoutGuard {
    stream: TcpStream,
    restore: bool,
}

impl TimeoutGuard {
    fn new(stream: &TcpStream, peer: Option<SocketAddr>) -> Result<TimeoutGuard, TransportError> {
        let what =
            || format!("setting the handshake timeout on the connection with {}", peer_name(peer));
        let current = stream.read_timeout().map_err(|e| TransportError::io(what(), e))?;
        let restore = current.is_none();
        if restore {
            for set in [TcpStream::set_read_timeout, TcpStream::set_write_timeout] {
                set(stream, Some(HANDSHAKE_TIMEOUT)).map_err(|e| TransportError::io(what(), e))?;
            }
        }
        let stream = stream.try_clone().map_err(|e| TransportError::io(what(), e))?;
        Ok(TimeoutGuard { stream, restore })
    }

    fn finish(self) -> Result<(), TransportError> {
        if self.restore {
            let what = "removing the handshake timeout";
            self.stream.set_read_timeout(None).map_err(|e| TransportError::io(what, e))?;
            self.stream.set_write_timeout(None).map_err(|e| TransportError::io(what, e))?;
        }
        Ok(())
    }
}

/// The responder's answer to handshake message 1: our protocol version
/// and mode echoed, or the code of its refusal.
fn read_answer(hs: &mut Handshake<'_>, mode: Mode) -> Result<(), TransportError> {
    let mut answer = [0u8; 2];
    hs.read_exact(&mut answer, "waiting for the handshake answer")?;
    if answer[0] != PROTOCOL_VERSION {
        return Err(hs.refuse(format!(
            "the peer speaks ferry transport protocol version {}, this ferry speaks version \
             {PROTOCOL_VERSION}: run the same ferry version on both hosts (or it is not a ferry agent)",
            answer[0]
        )));
    }
    match answer[1] {
        REFUSED_KEY => {
            return Err(hs.refuse(
                "the peer refused our handshake: it does not hold the same key".to_string(),
            ))
        }
        REFUSED_MODE => return Err(hs.refuse(format!("the peer does not accept mode {mode:?}"))),
        REFUSED_VERSION => {
            return Err(hs.refuse("the peer refused our protocol version".to_string()))
        }
        b if b == mode.to_byte() => {}
        b => {
            return Err(hs.refuse(format!(
                "the peer answered with unknown code {b:#04x}: not a ferry agent"
            )))
        }
    }
    Ok(())
}

/// The initiator's protocol version and mode; a version or mode this
/// side does not know is answered with a refusal.
fn read_hello(hs: &mut Handshake<'_>) -> Result<Mode, TransportError> {
    let mut hello = [0u8; 2];
    hs.read_exact(&mut hello, "waiting for the peer's protocol version")?;
    if hello[0] != PROTOCOL_VERSION {
        // Best effort: the peer learns which version we speak; we refuse
        // whether or not it hears it.
        let _ = hs.write(&[PROTOCOL_VERSION, REFUSED_VERSION], "refusing the peer's version");
        return Err(hs.refuse(format!(
            "the peer sent protocol version {}, this ferry speaks version {PROTOCOL_VERSION}: \
             it runs another ferry version, or is not a ferry agent",
            hello[0]
        )));
    }
    let Some(mode) = Mode::from_byte(hello[1]) else {
        let _ = hs.write(&[PROTOCOL_VERSION, REFUSED_MODE], "refusing the peer's mode");
        return Err(hs.refuse(format!(
            "the peer asked for unknown mode {:#04x}: not a ferry agent",
            hello[1]
        )));
    };
    Ok(mode)
}

/// What a finished handshake hands to the channel: the transport state,
/// the handshake hash and the bytes it took each way.
struct Handshaken {
    state: StatelessTransportState,
    hash: Vec<u8>,
    sent: u64,
    received: u64,
}

/// The protection of each direction, seen from one side.
struct Sealers {
    sealer: Sealer,
    opener: Sealer,
}

impl Sealers {
    fn new(
        mode: Mode,
        initiator: bool,
        state: StatelessTransportState,
        handshake_hash: &[u8],
    ) -> Sealers {
        let (sealer, opener) = match mode {
            Mode::Encrypted => {
                let state = Arc::new(state);
                (Sealer::Noise(state.clone()), Sealer::Noise(state))
            }
            Mode::Insecure => {
                let i2r = Zeroizing::new(blake3::derive_key(MAC_CONTEXT_I2R, handshake_hash));
                let r2i = Zeroizing::new(blake3::derive_key(MAC_CONTEXT_R2I, handshake_hash));
                if initiator {
                    (Sealer::Mac(i2r), Sealer::Mac(r2i))
                } else {
                    (Sealer::Mac(r2i), Sealer::Mac(i2r))
                }
            }
        };
        Sealers { sealer, opener }
    }
}

impl Channel {
    /// Initiator side. The mode is bound into the handshake (prologue), so a
    /// man in the middle cannot downgrade it. Each handshake read and write
    /// waits at most [`HANDSHAKE_TIMEOUT`], or the stream's own read timeout
    /// if the caller set one; a timeout the caller set is kept afterwards,
    /// otherwise the channel starts with none (see [`Channel::set_timeout`]).
    /// Returns when the initiator has verified that the responder holds the
    /// key; a responder that refuses the key confirmation is seen at the
    /// first `recv`, as `Closed`.
    pub fn connect(
        mut stream: TcpStream,
        key: &Key,
        mode: Mode,
    ) -> Result<Channel, TransportError> {
        let peer = stream.peer_addr().ok();
        let guard = TimeoutGuard::new(&stream, peer)?;
        let psk = derive_psk(key);
        let prologue = prologue(mode);
        let mut hs = Handshake { stream: &mut stream, peer, sent: 0, received: 0 };
        let mut noise = noise_builder(&psk, &prologue, &hs)?
            .build_initiator()
            .map_err(|e| hs.refuse(format!("cannot start the Noise handshake: {e}")))?;

        let mut msg = [0u8; MAX_HANDSHAKE_MESSAGE];
        let n = noise
            .write_message(&[], &mut msg)
            .map_err(|e| hs.refuse(format!("cannot write handshake message 1: {e}")))?;
        hs.write(
            &framed(&[PROTOCOL_VERSION, mode.to_byte()], &msg[..n]),
            "sending handshake message 1",
        )?;

        read_answer(&mut hs, mode)?;
        let reply = hs.read_message("waiting for handshake message 2")?;
        let mut payload = [0u8; MAX_HANDSHAKE_MESSAGE];
        noise.read_message(&reply, &mut payload).map_err(|_| {
            hs.refuse("handshake message 2 failed authentication: the peer does not hold the same key, or is not a ferry agent")
        })?;
        let hash = noise.get_handshake_hash().to_vec();
        let state = noise
            .into_stateless_transport_mode()
            .map_err(|e| hs.refuse(format!("cannot finish the Noise handshake: {e}")))?;

        let mut confirm = [0u8; CONFIRM.len() + TAG_LEN];
        let n = state
            .write_message(0, CONFIRM, &mut confirm)
            .map_err(|e| hs.refuse(format!("cannot write the key confirmation: {e}")))?;
        hs.write(&framed(&[], &confirm[..n]), "sending the key confirmation")?;
        let done = Handshaken { state, hash, sent: hs.sent, received: hs.received };
        guard.finish()?;
        Channel::new(stream, peer, mode, true, done)
    }

    /// Responder side: accepts the mode the initiator asked for (a caller
    /// that requires encryption checks [`Channel::mode`] and drops the
    /// channel). Returns only after the initiator proved it holds the key,
    /// so nothing is ever received from a stranger. Timeouts as for
    /// [`Channel::connect`].
    pub fn accept(mut stream: TcpStream, key: &Key) -> Result<Channel, TransportError> {
        let peer = stream.peer_addr().ok();
        let guard = TimeoutGuard::new(&stream, peer)?;
        let psk = derive_psk(key);
        let mut hs = Handshake { stream: &mut stream, peer, sent: 0, received: 0 };

        let mode = read_hello(&mut hs)?;
        let prologue = prologue(mode);
        let mut noise = noise_builder(&psk, &prologue, &hs)?
            .build_responder()
            .map_err(|e| hs.refuse(format!("cannot start the Noise handshake: {e}")))?;
        let first = hs.read_message("waiting for handshake message 1")?;
        let mut payload = [0u8; MAX_HANDSHAKE_MESSAGE];
        if noise.read_message(&first, &mut payload).is_err() {
            hs.answer_refusal(REFUSED_KEY);
            return Err(hs.refuse(
                "handshake message 1 failed authentication: the peer does not hold the same key, or is not a ferry agent",
            ));
        }
        let mut msg = [0u8; MAX_HANDSHAKE_MESSAGE];
        let n = noise
            .write_message(&[], &mut msg)
            .map_err(|e| hs.refuse(format!("cannot write handshake message 2: {e}")))?;
        hs.write(
            &framed(&[PROTOCOL_VERSION, mode.to_byte()], &msg[..n]),
            "sending handshake message 2",
        )?;
        let hash = noise.get_handshake_hash().to_vec();
        let state = noise
            .into_stateless_transport_mode()
            .map_err(|e| hs.refuse(format!("cannot finish the Noise handshake: {e}")))?;

        let confirm = hs.read_message("waiting for the key confirmation")?;
        let mut plain = [0u8; MAX_HANDSHAKE_MESSAGE];
        match state.read_message(0, &confirm, &mut plain) {
            Ok(n) if &plain[..n] == CONFIRM => {}
            _ => return Err(hs.refuse(
                "the key confirmation failed authentication: the peer does not hold the same key \
                     (a replayed handshake?)",
            )),
        }
        let done = Handshaken { state, hash, sent: hs.sent, received: hs.received };
        guard.finish()?;
        Channel::new(stream, peer, mode, false, done)
    }

    fn new(
        stream: TcpStream,
        peer: Option<SocketAddr>,
        mode: Mode,
        initiator: bool,
        done: Handshaken,
    ) -> Result<Channel, TransportError> {
        let what = || format!("setting up the connection with {}", peer_name(peer));
        // Messages are written whole, so Nagle's algorithm could only delay
        // the last frame of each (a post-copy page request waits on it).
        stream.set_nodelay(true).map_err(|e| TransportError::io(what(), e))?;
        let recv_stream = stream.try_clone().map_err(|e| TransportError::io(what(), e))?;
        let Sealers { sealer, opener } = Sealers::new(mode, initiator, done.state, &done.hash);
        Ok(Channel {
            send: SendHalf {
                stream,
                peer,
                sealer,
                frame: 1,
                messages: 0,
                buf: vec![0u8; IO_BUF],
                used: 0,
                gather: Vec::with_capacity(MAX_PAYLOAD),
                bytes: done.sent,
                broken: None,
            },
            recv: RecvHalf {
                stream: recv_stream,
                peer,
                opener,
                frame: 1,
                messages: 0,
                buf: vec![0u8; IO_BUF],
                start: 0,
                end: 0,
                partial: None,
                scratch: vec![0u8; MAX_FRAME],
                bytes: done.received,
                broken: None,
            },
            mode,
        })
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    pub fn peer(&self) -> Option<SocketAddr> {
        self.send.peer
    }

    /// Sends one message of up to [`MAX_MESSAGE`] bytes made of `parts`
    /// concatenated, so that a header and a big page buffer need no copy
    /// into one buffer first.
    pub fn send_parts(&mut self, parts: &[&[u8]]) -> Result<(), TransportError> {
        self.send.send_parts(parts)
    }

    pub fn send(&mut self, msg: &[u8]) -> Result<(), TransportError> {
        self.send.send(msg)
    }

    /// Receives one whole message. See [`RecvHalf::recv`].
    pub fn recv(&mut self) -> Result<Vec<u8>, TransportError> {
        self.recv.recv()
    }

    /// Read and write timeouts on the socket; `None` waits forever.
    pub fn set_timeout(&self, t: Option<Duration>) -> Result<(), TransportError> {
        self.recv.set_timeout(t)?;
        self.send.set_timeout(t)
    }

    /// Bytes written to the socket, handshake and framing included.
    pub fn bytes_sent(&self) -> u64 {
        self.send.bytes
    }

    /// Bytes read from the socket, handshake and framing included.
    pub fn bytes_received(&self) -> u64 {
        self.recv.bytes
    }

    /// Splits into a sending half and a receiving half usable from two
    /// threads at once; each half has its own frame counter.
    pub fn split(self) -> Result<(SendHalf, RecvHalf), TransportError> {
        Ok((self.send, self.recv))
    }

    /// Both halves borrowed, for two scoped threads, when the channel
    /// is used whole again afterwards.
    pub fn halves(&mut self) -> (&mut SendHalf, &mut RecvHalf) {
        (&mut self.send, &mut self.recv)
    }

    /// Shuts the TCP connection down both ways, so that the peer and any
    /// thread blocked on this connection see it end (used to abort).
    pub fn shutdown(&self) {
        self.send.shutdown();
    }

    /// Ends the channel after a failure this side has just reported to
    /// the peer: stops sending, then reads and drops whatever the peer
    /// still sends, until it closes or `at_most` has passed. Closing a
    /// socket with unread bytes sends a reset, which would destroy the
    /// report before the peer reads it.
    pub fn close_after_report(self, at_most: Duration) {
        let mut stream = self.recv.stream;
        let _ = stream.shutdown(Shutdown::Write);
        let deadline = std::time::Instant::now() + at_most;
        let mut sink = vec![0u8; 64 * 1024];
        while let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) {
            if left.is_zero() || stream.set_read_timeout(Some(left)).is_err() {
                return;
            }
            match stream.read(&mut sink) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    }
}

fn derive_psk(key: &Key) -> Zeroizing<[u8; 32]> {
    Zeroizing::new(blake3::derive_key(PSK_CONTEXT, key.bytes()))
}

/// Walks the concatenation of `parts` without copying it.
struct Parts<'a> {
    parts: &'a [&'a [u8]],
    index: usize,
    offset: usize,
}

impl<'a> Parts<'a> {
    /// The next `n` bytes if they lie in one part.
    fn contiguous(&mut self, n: usize) -> Option<&'a [u8]> {
        self.skip_empty();
        let part: &'a [u8] = self.parts.get(self.index)?;
        let slice = part.get(self.offset..self.offset + n)?;
        self.offset += n;
        Some(slice)
    }

    fn copy_into(&mut self, out: &mut Vec<u8>, mut n: usize) {
        while n > 0 {
            self.skip_empty();
            let Some(part) = self.parts.get(self.index) else {
                return;
            };
            let take = n.min(part.len() - self.offset);
            out.extend_from_slice(&part[self.offset..self.offset + take]);
            self.offset += take;
            n -= take;
        }
    }

    fn skip_empty(&mut self) {
        while self.parts.get(self.index).is_some_and(|p| self.offset >= p.len()) {
            self.index += 1;
            self.offset = 0;
        }
    }
}

impl SendHalf {
    /// Sends one message made of `parts` concatenated. After an error the
    /// half is unusable (the peer may hold part of a message): every later
    /// send fails.
    pub fn send_parts(&mut self, parts: &[&[u8]]) -> Result<(), TransportError> {
        if let Some(reason) = &self.broken {
            return Err(TransportError::Io {
                what: format!("sending to {}", peer_name(self.peer)),
                error: std::io::Error::new(
                    std::io::ErrorKind::BrokenPipe,
                    format!("an earlier send failed ({reason})"),
                ),
            });
        }
        let total: u64 = parts.iter().map(|p| p.len() as u64).sum();
        if total > MAX_MESSAGE as u64 {
            return Err(TransportError::TooLarge { len: total });
        }
        let result = self.send_message(parts, total as usize);
        if let Err(e) = &result {
            self.broken = Some(e.to_string());
        }
        result
    }

    pub fn send(&mut self, msg: &[u8]) -> Result<(), TransportError> {
        self.send_parts(&[msg])
    }

    fn send_message(&mut self, parts: &[&[u8]], total: usize) -> Result<(), TransportError> {
        let mut parts = Parts { parts, index: 0, offset: 0 };
        let mut gather = std::mem::take(&mut self.gather);
        gather.clear();
        gather.extend_from_slice(&(total as u32).to_be_bytes());
        let first = total.min(MAX_PAYLOAD - LEN_PREFIX);
        parts.copy_into(&mut gather, first);
        let mut result = self.push_frame(&gather);
        let mut remaining = total - first;
        while result.is_ok() && remaining > 0 {
            let n = remaining.min(MAX_PAYLOAD);
            result = match parts.contiguous(n) {
                Some(slice) => self.push_frame(slice),
                None => {
                    gather.clear();
                    parts.copy_into(&mut gather, n);
                    self.push_frame(&gather)
                }
            };
            remaining -= n;
        }
        self.gather = gather;
        result?;
        self.flush()?;
        self.messages += 1;
        Ok(())
    }

    fn push_frame(&mut self, payload: &[u8]) -> Result<(), TransportError> {
        let need = 2 + payload.len() + TAG_LEN;
        if self.used + need > self.buf.len() {
            self.flush()?;
        }
        let body = &mut self.buf[self.used + 2..self.used + need];
        let n = self.sealer.seal(self.frame, payload, body).map_err(|e| TransportError::Io {
            what: format!(
                "sealing frame {} of message {} to {}",
                self.frame,
                self.messages + 1,
                peer_name(self.peer)
            ),
            error: std::io::Error::other(e.to_string()),
        })?;
        self.buf[self.used..self.used + 2].copy_from_slice(&(n as u16).to_be_bytes());
        self.used += 2 + n;
        self.frame += 1;
        Ok(())
    }

    fn flush(&mut self) -> Result<(), TransportError> {
        let data = &self.buf[..self.used];
        self.stream.write_all(data).map_err(|e| {
            TransportError::io(
                format!("sending message {} to {}", self.messages + 1, peer_name(self.peer)),
                e,
            )
        })?;
        self.bytes += self.used as u64;
        self.used = 0;
        Ok(())
    }

    /// Bytes written to the socket, handshake and framing included.
    pub fn bytes_sent(&self) -> u64 {
        self.bytes
    }

    /// Write timeout on the socket (shared with the other half's socket
    /// handle, but the other half only uses the read timeout).
    pub fn set_timeout(&self, t: Option<Duration>) -> Result<(), TransportError> {
        self.stream.set_write_timeout(t).map_err(|e| {
            TransportError::io(format!("setting the write timeout for {}", peer_name(self.peer)), e)
        })
    }

    pub fn peer(&self) -> Option<SocketAddr> {
        self.peer
    }

    /// Shuts the TCP connection down both ways (the receiving half too).
    pub fn shutdown(&self) {
        // Already shut down or reset: either way it is down, which is all
        // the caller asked for.
        let _ = self.stream.shutdown(Shutdown::Both);
    }
}

impl RecvHalf {
    /// Receives one whole message. A length above [`MAX_MESSAGE`] is refused
    /// before any of the message is read; the buffer grows only as
    /// authenticated bytes arrive. `Closed` means the peer closed the
    /// connection between two messages; a close inside a message is
    /// `Corrupt`. After a [`TransportError::Timeout`] the next call
    /// continues the same message; after any other error every later call
    /// fails.
    pub fn recv(&mut self) -> Result<Vec<u8>, TransportError> {
        match &self.broken {
            Some(Broken::Closed) => return Err(TransportError::Closed),
            Some(Broken::Failed(reason)) => {
                return Err(TransportError::Corrupt {
                    peer: peer_name(self.peer),
                    reason: format!("an earlier receive failed ({reason})"),
                })
            }
            None => {}
        }
        let result = self.recv_message();
        match &result {
            Ok(_) | Err(TransportError::Timeout { .. }) => {}
            Err(TransportError::Closed) => self.broken = Some(Broken::Closed),
            Err(e) => self.broken = Some(Broken::Failed(e.to_string())),
        }
        result
    }

    fn corrupt(&self, reason: String) -> TransportError {
        TransportError::Corrupt { peer: peer_name(self.peer), reason }
    }

    fn recv_message(&mut self) -> Result<Vec<u8>, TransportError> {
        let message = self.messages + 1;
        let mut partial = match self.partial.take() {
            Some(p) => p,
            None => self.first_frame(message)?,
        };
        while partial.msg.len() < partial.len {
            let body = match self.next_frame(false) {
                Ok(body) => body,
                Err(e) => {
                    if matches!(e, TransportError::Timeout { .. }) {
                        self.partial = Some(partial);
                    }
                    return Err(e);
                }
            };
            let got = partial.msg.len();
            let left = partial.len - got;
            if body.len() - TAG_LEN > left {
                return Err(self.corrupt(format!(
                    "message {message} frame {} carries {} bytes but only {left} remain",
                    self.frame,
                    body.len() - TAG_LEN
                )));
            }
            partial.msg.resize(got + body.len(), 0);
            let n = self
                .opener
                .open(self.frame, &self.buf[body], &mut partial.msg[got..])
                .ok_or_else(|| {
                    self.corrupt(format!(
                    "message {message} failed authentication: stream corrupted or tampered with"
                ))
                })?;
            partial.msg.truncate(got + n);
            self.frame += 1;
        }
        self.messages += 1;
        Ok(partial.msg)
    }

    /// Opens the first frame of message number `message`: its length and
    /// the start of its data.
    fn first_frame(&mut self, message: u64) -> Result<Partial, TransportError> {
        let body = self.next_frame(true)?;
        let n =
            self.opener.open(self.frame, &self.buf[body], &mut self.scratch).ok_or_else(|| {
                self.corrupt(format!(
                    "message {message} failed authentication: stream corrupted or tampered with"
                ))
            })?;
        self.frame += 1;
        let plain = &self.scratch[..n];
        let Some((len, data)) = plain.split_first_chunk::<LEN_PREFIX>() else {
            return Err(self.corrupt(format!("message {message} has no length")));
        };
        let len = u32::from_be_bytes(*len) as usize;
        if len > MAX_MESSAGE {
            return Err(TransportError::TooLarge { len: len as u64 });
        }
        if data.len() > len {
            return Err(self.corrupt(format!(
                "message {message} says it is {len} bytes long but its first frame holds {}",
                data.len()
            )));
        }
        // Capacity follows the bytes received, not the announced
        // length, beyond the first mebibyte.
        let mut msg = Vec::with_capacity(len.min(1 << 20));
        msg.extend_from_slice(data);
        Ok(Partial { msg, len })
    }

    /// The byte range in `buf` of the next frame's body, reading until it is
    /// all there. A frame is consumed only when it is whole, so a timeout
    /// loses nothing.
    fn next_frame(
        &mut self,
        at_message_start: bool,
    ) -> Result<std::ops::Range<usize>, TransportError> {
        loop {
            let avail = self.end - self.start;
            if avail >= 2 {
                let len = usize::from(u16::from_be_bytes([
                    self.buf[self.start],
                    self.buf[self.start + 1],
                ]));
                if len < TAG_LEN || (at_message_start && len < TAG_LEN + LEN_PREFIX) {
                    return Err(self.corrupt(format!(
                        "message {} frame {} is {len} bytes, too short to be a frame",
                        self.messages + 1,
                        self.frame
                    )));
                }
                if avail >= 2 + len {
                    let body = self.start + 2..self.start + 2 + len;
                    self.start += 2 + len;
                    return Ok(body);
                }
            }
            if self.buf.len() - self.end < 2 + MAX_FRAME {
                self.buf.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
            }
            let n = match self.stream.read(&mut self.buf[self.end..]) {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    return Err(TransportError::io(
                        format!(
                            "receiving message {} from {}",
                            self.messages + 1,
                            peer_name(self.peer)
                        ),
                        e,
                    ))
                }
            };
            if n == 0 {
                if at_message_start && avail == 0 {
                    return Err(TransportError::Closed);
                }
                return Err(self.corrupt(format!(
                    "the connection ended in the middle of message {}: stream truncated",
                    self.messages + 1
                )));
            }
            self.end += n;
            self.bytes += n as u64;
        }
    }

    /// Bytes read from the socket, handshake and framing included.
    pub fn bytes_received(&self) -> u64 {
        self.bytes
    }

    /// Read timeout on the socket; `None` waits forever.
    pub fn set_timeout(&self, t: Option<Duration>) -> Result<(), TransportError> {
        self.stream.set_read_timeout(t).map_err(|e| {
            TransportError::io(format!("setting the read timeout for {}", peer_name(self.peer)), e)
        })
    }

    pub fn peer(&self) -> Option<SocketAddr> {
        self.peer
    }

    /// Shuts the TCP connection down both ways (the sending half too).
    pub fn shutdown(&self) {
        let _ = self.stream.shutdown(Shutdown::Both);
    }
}
