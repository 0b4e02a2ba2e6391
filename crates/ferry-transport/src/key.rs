//! The pre-shared key and its file.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

use zeroize::Zeroize;

use crate::TransportError;

/// The secret both agents hold. The Noise pre-shared key is derived from it
/// (not the bytes themselves) so that the same key file could key another
/// purpose later without the two uses ever sharing a key.
#[derive(Clone)]
pub struct Key([u8; 32]);

/// Longest key file accepted: 64 hex digits and a line ending, with room for
/// a trailing `\r\n`; reading stops there so a wrong path to a huge file
/// is refused without reading it all.
const MAX_KEY_FILE: u64 = 80;

impl Key {
    /// A new random key from the OS random number generator.
    pub fn generate() -> Result<Key, TransportError> {
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes)
            .map_err(|e| TransportError::Random { reason: e.to_string() })?;
        Ok(Key(bytes))
    }

    /// A key from bytes the caller already holds (tests, or a key handed
    /// over by another channel).
    pub fn from_bytes(bytes: [u8; 32]) -> Key {
        Key(bytes)
    }

    /// Writes a new random key to `path`: 64 hex digits and a newline, mode
    /// 0600. Refuses to overwrite an existing file, since that would lock
    /// out every agent still holding the old key.
    pub fn write_new(path: &Path) -> Result<Key, TransportError> {
        let err = |reason: String| TransportError::KeyFile { path: path.to_path_buf(), reason };
        let key = Key::generate()?;
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::AlreadyExists => err(
                    "already exists; refusing to overwrite it (remove it first to replace the key)"
                        .into(),
                ),
                _ => err(format!("cannot be created: {e}")),
            })?;
        let mut text = key.to_hex();
        text.push('\n');
        let written = file.write_all(text.as_bytes()).and_then(|()| file.sync_all());
        text.zeroize();
        if let Err(e) = written {
            // A half-written key file would be refused by load() anyway; remove
            // it so that the next write_new is not refused as "already exists".
            let _ = std::fs::remove_file(path);
            return Err(err(format!("could not be written: {e}")));
        }
        Ok(key)
    }

    /// Loads a key file written by [`Key::write_new`] (or by hand: 64 hex
    /// digits, an optional line ending). Refuses a file that group or others
    /// may read or write: the key is what keeps a process image secret.
    pub fn load(path: &Path) -> Result<Key, TransportError> {
        let err = |reason: String| TransportError::KeyFile { path: path.to_path_buf(), reason };
        let file = File::open(path).map_err(|e| err(format!("cannot be opened: {e}")))?;
        // The mode is read from the open file, not the path, so the file
        // checked is the one read.
        let meta = file.metadata().map_err(|e| err(format!("cannot be examined: {e}")))?;
        if !meta.is_file() {
            return Err(err("is not a regular file".into()));
        }
        let mode = meta.mode() & 0o7777;
        if mode & 0o077 != 0 {
            let who = if mode & 0o044 != 0 { "readable" } else { "writable" };
            return Err(err(format!(
                "is {who} by group or others (mode {mode:04o}): chmod 600 it"
            )));
        }
        let mut text = Vec::with_capacity(MAX_KEY_FILE as usize);
        file.take(MAX_KEY_FILE + 1)
            .read_to_end(&mut text)
            .map_err(|e| err(format!("cannot be read: {e}")))?;
        let parsed = parse_hex_key(&text);
        text.zeroize();
        parsed.map(Key).map_err(err)
    }

    pub(crate) fn bytes(&self) -> &[u8; 32] {
        &self.0
    }

    fn to_hex(&self) -> String {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut s = String::with_capacity(65);
        for b in self.0 {
            s.push(DIGITS[usize::from(b >> 4)] as char);
            s.push(DIGITS[usize::from(b & 15)] as char);
        }
        s
    }
}

fn parse_hex_key(text: &[u8]) -> Result<[u8; 32], String> {
    let body = text.strip_suffix(b"\n").unwrap_or(text);
    let body = body.strip_suffix(b"\r").unwrap_or(body);
    if body.len() != 64 {
        return Err(format!(
            "holds {} characters; a key is 64 hex digits and a newline (write one with Key::write_new)",
            text.len()
        ));
    }
    let mut key = [0u8; 32];
    for (i, pair) in body.chunks_exact(2).enumerate() {
        let hi = hex_digit(pair[0]).ok_or_else(|| not_hex(2 * i))?;
        let lo = hex_digit(pair[1]).ok_or_else(|| not_hex(2 * i + 1))?;
        key[i] = hi << 4 | lo;
    }
    Ok(key)
}

fn not_hex(offset: usize) -> String {
    format!("is not a key: character at offset {offset} is not a hex digit")
}

fn hex_digit(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Key(<secret>)")
    }
}

// Compared without an early exit so that the time taken says nothing about
// where two keys differ.
impl PartialEq for Key {
    fn eq(&self, other: &Key) -> bool {
        self.0.iter().zip(other.0.iter()).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
    }
}

impl Eq for Key {}

impl Drop for Key {
    fn drop(&mut self) {
        self.0.zeroize();
    }
}
