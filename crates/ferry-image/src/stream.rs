//! An image as one byte stream, for a pipe or a socket: no files in
//! between. The stream is meta.img's bytes (file header, inventory section,
//! process section, framed exactly as [`container::encode_meta`] frames
//! them) followed by one more section, `Pages`, whose payload is the page
//! data area of pages.img (without its 4096-byte header):
//!
//! ```text
//! header[16] | inventory section | process section | [incremental section] | pages section
//! ```
//!
//! The incremental section (format 4.1) is there only for an incremental
//! image, exactly as in meta.img.
//!
//! The pages section's checksum is the xxh3 of the whole page area; every
//! page run still carries its own checksum, and the reader checks both.
//!
//! The stream is self-delimiting: [`read_stream`] consumes exactly the
//! image's bytes and never reads past the end of the pages section, so the
//! same connection can carry other messages afterwards.
//!
//! The reader trusts nothing it has not checked: section order and kinds,
//! lengths (metadata at most [`MAX_SECTION_LEN`], page data exactly the
//! inventory's `pages_bytes`), every checksum, [`validate`], and every
//! page run. Its buffers grow only as bytes actually arrive, so a hostile
//! length costs the sender as many bytes as it makes the reader allocate.

use crate::container::{
    self, decode_optional, decode_payload, read_file_header, section_header_raw, FormatVersion,
    SectionKind, SectionOrder, HEADER_LEN, MAX_SECTION_LEN, SECTION_HEADER_LEN, STREAM_SECTIONS,
};
use crate::dir::{ImageDir, META_FILE, PAGES_DATA_OFFSET};
use crate::error::ImageError;
use crate::model::{Incremental, Inventory, TreeImage};
use crate::validate::{validate, validate_incremental};
use std::io::{ErrorKind, Read, Seek, SeekFrom, Write};
use std::path::Path;
use xxhash_rust::xxh3::Xxh3;

/// The "path" stream I/O errors are reported against.
pub const STREAM_NAME: &str = "<stream>";

/// Receive buffers start at this size and then double (capped at the
/// announced length), so memory follows the bytes that have arrived.
const MIN_GROW: usize = 64 * 1024;

/// Chunk size for streaming page data out of pages.img.
const COPY_CHUNK: usize = 4 << 20;

fn stream_err(e: std::io::Error) -> ImageError {
    ImageError::io(STREAM_NAME, e)
}

/// Writes an image as a stream: the metadata exactly as `encode_meta`
/// frames it, then a pages section holding `pages` (which must be
/// `inv.pages_bytes` long) written with one `write_all`. Flushes `w` and
/// returns the number of bytes written.
pub fn write_stream<W: Write>(
    w: &mut W,
    inv: &Inventory,
    process: &TreeImage,
    pages: &[u8],
) -> Result<u64, ImageError> {
    write_stream_with(w, inv, process, None, pages)
}

/// [`write_stream`] for an image that may be incremental: with `Some`,
/// the stream carries the `Incremental` section between the process
/// section and the pages.
pub fn write_stream_with<W: Write>(
    w: &mut W,
    inv: &Inventory,
    process: &TreeImage,
    incremental: Option<&Incremental>,
    pages: &[u8],
) -> Result<u64, ImageError> {
    if pages.len() as u64 != inv.pages_bytes {
        return Err(ImageError::Invalid(format!(
            "{} bytes of page data given, inventory says {}",
            pages.len(),
            inv.pages_bytes
        )));
    }
    let mut head = container::encode_meta_with(inv, process, incremental)?;
    head.extend_from_slice(&section_header_raw(
        SectionKind::Pages,
        inv.pages_bytes,
        container::checksum(pages),
    ));
    w.write_all(&head).map_err(stream_err)?;
    w.write_all(pages).map_err(stream_err)?;
    w.flush().map_err(stream_err)?;
    Ok(head.len() as u64 + inv.pages_bytes)
}

/// Reads an image directory and writes it as a stream. Page data is
/// streamed from pages.img in large chunks rather than loaded whole; its
/// checksum is computed in a first pass (the section header precedes the
/// data) and checked again while copying, so an image that changes
/// underneath is reported here as well as rejected by the reader. An
/// incremental image is sent with its `Incremental` section.
pub fn dir_to_stream<W: Write>(dir: &Path, w: &mut W) -> Result<u64, ImageError> {
    let image = ImageDir::new(dir);
    let (inv, process, incremental) = image.read_meta_full()?;
    let mut file = image.check_pages_file(&inv)?;
    let path = image.pages_path();
    let len = usize::try_from(inv.pages_bytes).map_err(|_| {
        ImageError::Invalid(format!("{} bytes of page data do not fit in memory", inv.pages_bytes))
    })?;
    let mut buf = vec![0u8; len.min(COPY_CHUNK)];

    // Pass 1: checksum of the page area, for the section header.
    let sum = hash_file_range(&mut file, &path, inv.pages_bytes, &mut buf)?;

    let mut head = container::encode_meta_with(&inv, &process, incremental.as_ref())?;
    head.extend_from_slice(&section_header_raw(SectionKind::Pages, inv.pages_bytes, sum));
    w.write_all(&head).map_err(stream_err)?;

    // Pass 2: copy, hashing again.
    file.seek(SeekFrom::Start(PAGES_DATA_OFFSET)).map_err(|e| ImageError::io(&path, e))?;
    let mut hasher = Xxh3::new();
    let mut left = inv.pages_bytes;
    while left > 0 {
        let n = (left.min(buf.len() as u64)) as usize;
        read_file_exact(&mut file, &path, &mut buf[..n])?;
        hasher.update(&buf[..n]);
        w.write_all(&buf[..n]).map_err(stream_err)?;
        left -= n as u64;
    }
    w.flush().map_err(stream_err)?;
    if hasher.digest() != sum {
        return Err(ImageError::Checksum {
            what: format!("{} (changed while being sent)", path.display()),
        });
    }
    Ok(head.len() as u64 + inv.pages_bytes)
}

fn hash_file_range(
    file: &mut std::fs::File,
    path: &Path,
    len: u64,
    buf: &mut [u8],
) -> Result<u64, ImageError> {
    file.seek(SeekFrom::Start(PAGES_DATA_OFFSET)).map_err(|e| ImageError::io(path, e))?;
    let mut hasher = Xxh3::new();
    let mut left = len;
    while left > 0 {
        let n = (left.min(buf.len() as u64)) as usize;
        read_file_exact(file, path, &mut buf[..n])?;
        hasher.update(&buf[..n]);
        left -= n as u64;
    }
    Ok(hasher.digest())
}

fn read_file_exact(
    file: &mut std::fs::File,
    path: &Path,
    buf: &mut [u8],
) -> Result<(), ImageError> {
    file.read_exact(buf).map_err(|e| {
        if e.kind() == ErrorKind::UnexpectedEof {
            ImageError::Truncated(format!("{} shrank while being read", path.display()))
        } else {
            ImageError::io(path, e)
        }
    })
}

/// Reads one image from `r`, checking everything (see the module docs),
/// and returns it with its page data area. Reads exactly the image's
/// bytes. With `dir`, the image is also written there as an image
/// directory (pages.img, then meta.img) once it has passed every check;
/// an incremental image keeps its `Incremental` section there.
///
/// An incremental image is returned without saying so: a caller that
/// restores from the returned values must use [`read_stream_full`].
pub fn read_stream<R: Read>(
    r: &mut R,
    dir: Option<&Path>,
) -> Result<(Inventory, TreeImage, Vec<u8>), ImageError> {
    read_stream_full(r, dir).map(|(inv, tree, _, pages)| (inv, tree, pages))
}

/// [`read_stream`], also returning the image's `Incremental` section
/// (`None`: the image holds every page itself).
#[allow(clippy::type_complexity)]
pub fn read_stream_full<R: Read>(
    r: &mut R,
    dir: Option<&Path>,
) -> Result<(Inventory, TreeImage, Option<Incremental>, Vec<u8>), ImageError> {
    let mut header = [0u8; HEADER_LEN];
    read_fixed(r, &mut header, "stream header")?;
    let version = read_file_header(&header, "stream")?.version;
    let mut order = SectionOrder::new(STREAM_SECTIONS, version, "stream");

    let (len, sum) = next_section(r, &mut order, SectionKind::Inventory)?;
    let payload = read_metadata(r, SectionKind::Inventory, len, sum)?;
    let inventory: Inventory = decode_payload(&payload, "inventory")?;

    let (len, sum) = next_section(r, &mut order, SectionKind::Tree)?;
    let payload = read_metadata(r, SectionKind::Tree, len, sum)?;
    let mut process: TreeImage = decode_payload(&payload, "process")?;
    drop(payload);
    // Reject bad metadata before receiving any page data.
    validate(&inventory, &process)?;

    let (incremental, len, sum) = read_optional_sections(r, &mut order, version, &mut process)?;
    if len != inventory.pages_bytes {
        return Err(ImageError::Invalid(format!(
            "pages section holds {len} bytes, inventory says {}",
            inventory.pages_bytes
        )));
    }
    let (pages, got) = read_growing(r, len, "pages section")?;
    if got != sum {
        return Err(ImageError::Checksum { what: "pages section".into() });
    }
    for p in &process.processes {
        ImageDir::verify_runs(&p.page_runs, &pages)?;
    }

    if let Some(dir) = dir {
        materialise(dir, &inventory, &process, incremental.as_ref(), &pages)?;
    }
    Ok((inventory, process, incremental, pages))
}

/// The optional sections that follow the tree, each into its field of
/// `process` (checked once all are in), up to the pages section's
/// header: the image's `Incremental` section, and the pages' length and
/// checksum.
fn read_optional_sections<R: Read>(
    r: &mut R,
    order: &mut SectionOrder,
    version: FormatVersion,
    process: &mut TreeImage,
) -> Result<(Option<Incremental>, u64, u64), ImageError> {
    let mut incremental: Option<Incremental> = None;
    loop {
        let (kind, len, sum) = section_header(r, order, "pages")?;
        match kind {
            SectionKind::Incremental => {
                let payload = read_metadata(r, kind, len, sum)?;
                let inc: Incremental = decode_payload(&payload, "incremental")?;
                validate_incremental(process, &inc)?;
                incremental = Some(inc);
            }
            SectionKind::Pages => {
                crate::validate::validate_unix_dead_peers(process)?;
                crate::validate::validate_unix_peers(process)?;
                crate::validate::validate_unix_in_flight_files(process)?;
                crate::validate::validate_ptys(process)?;
                crate::validate::validate_process_attrs(process)?;
                crate::validate::validate_unix_socket_options(process)?;
                crate::validate::validate_uts(process)?;
                return Ok((incremental, len, sum));
            }
            _ => {
                let payload = read_metadata(r, kind, len, sum)?;
                // `order` accepts nothing else after the process section.
                if !decode_optional(process, kind, &payload, version)? {
                    return Err(ImageError::Invalid(format!(
                        "{} section where the pages section was expected in stream",
                        kind.name()
                    )));
                }
                if kind == SectionKind::Cgroups {
                    crate::validate::validate_cgroups(process)?;
                }
            }
        }
    }
}

/// Reads a section header that must be of kind `expected`; returns its
/// length and checksum.
fn next_section<R: Read>(
    r: &mut R,
    order: &mut SectionOrder,
    expected: SectionKind,
) -> Result<(u64, u64), ImageError> {
    let (kind, len, sum) = section_header(r, order, expected.name())?;
    if kind != expected {
        // Only reachable if an optional section could precede `expected`.
        return Err(ImageError::Invalid(format!(
            "{} section where the {} section was expected in stream",
            kind.name(),
            expected.name()
        )));
    }
    Ok((len, sum))
}

/// Reads the next section header and checks its kind against `order`
/// (unknown kinds, repeats, reordering and kinds newer than the image's
/// minor version are refused). `expected` names it in truncation errors.
fn section_header<R: Read>(
    r: &mut R,
    order: &mut SectionOrder,
    expected: &str,
) -> Result<(SectionKind, u64, u64), ImageError> {
    let mut sh = [0u8; SECTION_HEADER_LEN];
    read_fixed(r, &mut sh, &format!("{expected} section header"))?;
    let [k0, k1, k2, k3, r0, r1, r2, r3, l0, l1, l2, l3, l4, l5, l6, l7, s0, s1, s2, s3, s4, s5, s6, s7] =
        sh;
    let kind_raw = u32::from_le_bytes([k0, k1, k2, k3]);
    let len = u64::from_le_bytes([l0, l1, l2, l3, l4, l5, l6, l7]);
    let sum = u64::from_le_bytes([s0, s1, s2, s3, s4, s5, s6, s7]);
    let kind = order.accept(kind_raw)?;
    container::check_reserved(kind.name(), u32::from_le_bytes([r0, r1, r2, r3]))?;
    Ok((kind, len, sum))
}

/// Writes a checked image as an image directory, in the layout ImageDir
/// gives it: pages.img first, then meta.img (atomically), so the
/// directory only looks like an image once it is complete.
fn materialise(
    dir: &Path,
    inv: &Inventory,
    process: &TreeImage,
    incremental: Option<&Incremental>,
    pages: &[u8],
) -> Result<(), ImageError> {
    let image = ImageDir::new(dir);
    // If `dir` already holds an image, stop it looking like one before its
    // pages.img is replaced: old metadata must never meet new page data.
    let old_meta = dir.join(META_FILE);
    match std::fs::remove_file(&old_meta) {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::NotFound => {}
        Err(e) => return Err(ImageError::io(&old_meta, e)),
    }
    let mut writer = image.create_pages()?;
    // No ranges: the data area is copied as is; the runs already point into it.
    writer.append_runs(&[], pages)?;
    let written = writer.finish()?;
    if written != inv.pages_bytes {
        return Err(ImageError::Invalid(format!(
            "wrote {written} bytes of page data, inventory says {}",
            inv.pages_bytes
        )));
    }
    image.write_meta_with(inv, process, incremental)
}

/// Reads a metadata section's payload and checks its length and checksum.
fn read_metadata<R: Read>(
    r: &mut R,
    kind: SectionKind,
    len: u64,
    sum: u64,
) -> Result<Vec<u8>, ImageError> {
    if len > MAX_SECTION_LEN {
        return Err(ImageError::Invalid(format!("{} section claims {len} bytes", kind.name())));
    }
    let (payload, got) = read_growing(r, len, &format!("{} section", kind.name()))?;
    if got != sum {
        return Err(ImageError::Checksum { what: format!("{} section", kind.name()) });
    }
    Ok(payload)
}

/// Reads exactly `buf.len()` bytes; running out is `Truncated`.
fn read_fixed<R: Read>(r: &mut R, buf: &mut [u8], what: &str) -> Result<(), ImageError> {
    let mut filled = 0;
    while filled < buf.len() {
        match r.read(&mut buf[filled..]) {
            Ok(0) => {
                return Err(ImageError::Truncated(format!(
                    "{what}: stream ended after {filled} of {} bytes",
                    buf.len()
                )))
            }
            Ok(n) => filled += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(stream_err(e)),
        }
    }
    Ok(())
}

/// Reads exactly `len` bytes into a buffer that grows as they arrive
/// (doubling from [`MIN_GROW`], never past `len`), and returns it with its
/// xxh3, computed chunk by chunk while the data is still in cache.
fn read_growing<R: Read>(r: &mut R, len: u64, what: &str) -> Result<(Vec<u8>, u64), ImageError> {
    let len = usize::try_from(len).map_err(|_| {
        ImageError::Invalid(format!("{what} of {len} bytes does not fit in memory"))
    })?;
    let mut buf: Vec<u8> = Vec::new();
    let mut filled = 0usize;
    let mut hasher = Xxh3::new();
    let mut hashed = 0usize;
    while filled < len {
        if filled == buf.len() {
            let grow = (len - filled).min(filled.max(MIN_GROW));
            buf.reserve_exact(grow);
            buf.resize(filled + grow, 0);
        }
        match r.read(&mut buf[filled..]) {
            Ok(0) => {
                return Err(ImageError::Truncated(format!(
                    "{what}: stream ended after {filled} of {len} bytes"
                )))
            }
            Ok(n) => filled += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(stream_err(e)),
        }
        if filled - hashed >= MIN_GROW {
            hasher.update(&buf[hashed..filled]);
            hashed = filled;
        }
    }
    hasher.update(&buf[hashed..filled]);
    Ok((buf, hasher.digest()))
}

/// Whether an error came from the stream itself (as opposed to the image
/// directory), e.g. a connection reset.
pub fn is_stream_error(e: &ImageError) -> bool {
    matches!(e, ImageError::Io { path, .. } if path.as_os_str() == STREAM_NAME)
}
