//! meta.img written straight to its file: each section's payload is
//! serialized into a 1 MiB buffer that is hashed and written whenever it
//! fills, and the section's header (length, checksum) is written in its
//! place once the payload is done. The bytes are exactly those of
//! [`container::encode_meta_with`]; only no 40 MB buffer is built first
//! (with 10,000 connections' queues, allocating and filling it cost
//! more than writing the file).

use crate::container::{self, SectionKind, SectionVisitor, SECTION_HEADER_LEN};
use crate::error::ImageError;
use crate::model::{Incremental, Inventory, TreeImage};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// How much is written at once.
const CHUNK: usize = 1 << 20;

/// The section headers written, in order: what the file must read back as.
pub(crate) struct Written {
    pub headers: Vec<[u8; SECTION_HEADER_LEN]>,
    pub len: u64,
}

/// Writes the metadata file (header and sections) to `file` from offset 0.
pub(crate) fn write(
    file: &File,
    path: &Path,
    inventory: &Inventory,
    tree: &TreeImage,
    incremental: Option<&Incremental>,
) -> Result<Written, ImageError> {
    let mut w = Streamed {
        file,
        path,
        buf: Vec::with_capacity(CHUNK + SECTION_HEADER_LEN),
        buf_at: 0,
        hash_from: 0,
        hasher: xxhash_rust::xxh3::Xxh3Default::new(),
        headers: Vec::new(),
        err: None,
    };
    w.buf.extend_from_slice(&container::file_header(0));
    container::each_section(&mut w, inventory, tree, incremental)?;
    w.flush()?;
    Ok(Written { headers: w.headers, len: w.buf_at })
}

/// Checks that `bytes` (meta.img read back) holds exactly the sections
/// `written` says, each whole and with its checksum right, and nothing
/// else.
pub(crate) fn check_reads_back(bytes: &[u8], written: &Written) -> Result<(), ImageError> {
    container::read_file_header(bytes, "meta.img")?;
    let mut rest = &bytes[container::HEADER_LEN..];
    for header in &written.headers {
        let same = rest.get(..SECTION_HEADER_LEN) == Some(&header[..]);
        let (_, _, r) = container::read_section_raw(rest)?;
        if !same {
            return Err(ImageError::Invalid("meta.img: a section header changed".into()));
        }
        rest = r;
    }
    if bytes.len() as u64 != written.len || !rest.is_empty() {
        return Err(ImageError::Invalid(format!(
            "meta.img holds {} bytes, {} were written",
            bytes.len(),
            written.len
        )));
    }
    Ok(())
}

struct Streamed<'a> {
    file: &'a File,
    path: &'a Path,
    /// Bytes not written yet; `buf[0]` goes at file offset `buf_at`.
    buf: Vec<u8>,
    buf_at: u64,
    /// `buf[hash_from..]` is payload not hashed yet.
    hash_from: usize,
    hasher: xxhash_rust::xxh3::Xxh3Default,
    headers: Vec<[u8; SECTION_HEADER_LEN]>,
    /// The write error that stopped the serializer.
    err: Option<std::io::Error>,
}

impl Streamed<'_> {
    /// Hashes what is pending and writes the buffer out.
    fn flush(&mut self) -> Result<(), ImageError> {
        self.hasher.update(&self.buf[self.hash_from..]);
        self.file.write_all_at(&self.buf, self.buf_at).map_err(|e| ImageError::io(self.path, e))?;
        self.buf_at += self.buf.len() as u64;
        self.buf.clear();
        self.hash_from = 0;
        Ok(())
    }

    fn put(&mut self, data: &[u8]) -> postcard::Result<()> {
        if self.buf.len() + data.len() > CHUNK {
            if let Err(ImageError::Io { err, .. }) = self.flush() {
                self.err = Some(err);
                return Err(postcard::Error::SerializeBufferFull);
            }
        }
        self.buf.extend_from_slice(data);
        Ok(())
    }
}

impl SectionVisitor for Streamed<'_> {
    fn section<T: serde::Serialize>(
        &mut self,
        kind: SectionKind,
        value: &T,
        name: &'static str,
    ) -> Result<(), ImageError> {
        let header_at = self.buf_at + self.buf.len() as u64;
        self.buf.extend_from_slice(&[0u8; SECTION_HEADER_LEN]);
        self.hash_from = self.buf.len();
        self.hasher.reset();
        let start = header_at + SECTION_HEADER_LEN as u64;
        if let Err(e) = postcard::serialize_with_flavor(value, Into(self)) {
            return Err(match self.err.take() {
                Some(io) => ImageError::io(self.path, io),
                None => ImageError::Decode { kind: name, reason: e.to_string() },
            });
        }
        self.hasher.update(&self.buf[self.hash_from..]);
        self.hash_from = self.buf.len();
        let len = self.buf_at + self.buf.len() as u64 - start;
        let header = container::section_header_raw(kind, len, self.hasher.digest());
        match header_at.checked_sub(self.buf_at) {
            // Still in the buffer: put it in place there.
            Some(i) => {
                let i = i as usize;
                self.buf[i..i + SECTION_HEADER_LEN].copy_from_slice(&header);
            }
            None => self
                .file
                .write_all_at(&header, header_at)
                .map_err(|e| ImageError::io(self.path, e))?,
        }
        self.headers.push(header);
        Ok(())
    }
}

/// The serializer's output: the buffer of [`Streamed`].
struct Into<'b, 'a>(&'b mut Streamed<'a>);

impl postcard::ser_flavors::Flavor for Into<'_, '_> {
    type Output = ();
    fn try_extend(&mut self, data: &[u8]) -> postcard::Result<()> {
        self.0.put(data)
    }
    fn try_push(&mut self, data: u8) -> postcard::Result<()> {
        self.0.put(&[data])
    }
    fn finalize(self) -> postcard::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{FileKind, InetSocket, OpenFile, ProcessImage, TcpConnection};

    /// A tree whose metadata runs over several chunks.
    fn big_tree() -> TreeImage {
        let conn = |i: u8| TcpConnection {
            state: 1,
            recv_queue: vec![i; 300_000].into(),
            send_queue: vec![i ^ 0xff; 70_000].into(),
            ..Default::default()
        };
        let files = (0..10u8)
            .map(|i| OpenFile {
                id: u64::from(i),
                flags: 2,
                pos: 0,
                locks: Vec::new(),
                kind: FileKind::InetSocket(InetSocket {
                    family: 2,
                    sock_type: 1,
                    protocol: 0,
                    addr: vec![127, 0, 0, 1],
                    port: 80,
                    listen_backlog: None,
                    peer: Some((vec![127, 0, 0, 2], 5000 + u16::from(i))),
                    options: Vec::new(),
                    connection: Some(conn(i)),
                }),
            })
            .collect();
        TreeImage {
            processes: vec![ProcessImage { pid: 7, files, ..Default::default() }],
            ..Default::default()
        }
    }

    #[test]
    fn the_file_holds_the_bytes_of_the_buffered_encoding_and_reads_back() {
        let tree = big_tree();
        let inv = Inventory { format_version: container::FORMAT_MAJOR, ..Default::default() };
        let dir = std::env::temp_dir().join(format!("ferry-meta-file-{}", std::process::id()));
        let _ = std::fs::remove_file(&dir);
        let file =
            std::fs::OpenOptions::new().read(true).write(true).create_new(true).open(&dir).unwrap();
        struct Rm<'a>(&'a Path);
        impl Drop for Rm<'_> {
            fn drop(&mut self) {
                let _ = std::fs::remove_file(self.0);
            }
        }
        let _rm = Rm(&dir);
        let written = write(&file, &dir, &inv, &tree, None).unwrap();
        let got = std::fs::read(&dir).unwrap();
        let want = container::encode_meta_with(&inv, &tree, None).unwrap();
        assert!(want.len() > 3 * CHUNK);
        assert_eq!(got.len(), want.len());
        assert!(got == want, "the streamed file differs from the buffered encoding");
        check_reads_back(&got, &written).unwrap();
        // One byte changed, or one missing, is caught.
        let mut bad = got.clone();
        bad[2 * CHUNK] ^= 1;
        assert!(check_reads_back(&bad, &written).is_err());
        assert!(check_reads_back(&got[..got.len() - 1], &written).is_err());
    }
}
