//! Framing: a fixed header, then sections. Each section is
//! `kind: u32 | reserved: u32 | len: u64 | xxh3: u64 | payload[len]`, so a
//! reader can check every byte before it trusts any of it, and the same
//! bytes can be written to a file or to a socket.

use crate::error::ImageError;
use crate::model::{Incremental, Inventory, ProcessAttrsImage, TreeImage};

pub const MAGIC: &[u8; 8] = b"FERRYIMG";
/// The major format version this build reads and writes. An image of
/// another major version is refused.
pub const FORMAT_MAJOR: u32 = 4;
/// The newest minor format version this build reads, and the one it
/// writes. Images of the same major and this or an older minor are read;
/// a newer minor is refused. See "Versions and compatibility" in
/// docs/image-format.md for what a minor version may change.
///
/// 4.0: the format as it was before minor versions existed.
/// 4.1: the optional `Incremental` section.
/// 4.2: the optional `Cgroups` section.
/// 4.3: the optional `UnixPeers` section.
/// 4.4: an inotify watch's path may be "PATH (deleted)": the watch is on
/// the deleted file of the tree /proc named so (`FileKind::Deleted`),
/// and restore watches the file it makes again. An older build would
/// look that path up and fail after the checkpoint, so it must refuse
/// the image first.
/// 4.4: the optional `UnixDeadPeers` and `UnixInFlightFiles` sections.
/// 4.5: a TCP connection's state may be CLOSE_WAIT (8): its peer closed,
/// and restore hands the rebuilt socket the peer's FIN. An older build
/// would rebuild it as established, its reader never seeing the EOF.
/// 4.6: the optional `Ptys` section: a `FileKind::Terminal` it lists is
/// a pty end restored with its pair (an older build would replace it by
/// `--tty-to`, silently, so it must refuse the image).
/// 4.7: the mapping flags LOCKONFAULT, SEQ_READ and RAND_READ (an older
/// build would ignore them, silently), and the optional `ProcessAttrs`
/// section (coredump_filter).
/// 4.8: the `ProcessAttrs` section also holds each thread's I/O priority,
/// the autogroup nice value and the loginuid and audit session (a 4.7
/// build would restore none of them, silently; its entries are decoded
/// with the 4.7 layout), and the optional `UnixSocketOptions` section (an
/// older build would make the tree's unix sockets with default options,
/// silently).
/// 4.9: the optional `Uts` section: the tree's own UTS namespace (an
/// older build would restore the tree into its own, with its host's
/// names, silently).
pub const FORMAT_MINOR: u16 = 9;
/// The major version, under its old name: the file header's version word
/// and `Inventory::format_version` hold it.
pub const FORMAT_VERSION: u32 = FORMAT_MAJOR;
/// The minor version sits in the upper 16 bits of the header's flags word
/// (which format 4.0 always wrote as 0, so 4.0 headers read as minor 0).
pub const MINOR_SHIFT: u32 = 16;
/// Header flag bits (the low 16 bits of the flags word) this build knows.
/// None are defined; any other bit set in an image of a minor this build
/// knows is an error.
pub const KNOWN_HEADER_FLAGS: u16 = 0;
pub const HEADER_LEN: usize = 16;
pub const SECTION_HEADER_LEN: usize = 24;
/// Metadata larger than this is refused: a hostile length cannot make the
/// reader allocate without bound.
pub const MAX_SECTION_LEN: u64 = 1 << 30;

/// An image format version, `major.minor`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FormatVersion {
    pub major: u32,
    pub minor: u16,
}

impl FormatVersion {
    /// What this build writes (and the newest it reads).
    pub const CURRENT: FormatVersion = FormatVersion { major: FORMAT_MAJOR, minor: FORMAT_MINOR };
}

impl std::fmt::Display for FormatVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// A checked file header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileHeader {
    pub version: FormatVersion,
    /// The low 16 bits of the flags word (none defined yet).
    pub flags: u16,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum SectionKind {
    Inventory = 1,
    Tree = 2,
    /// Page data; only in the stream form.
    Pages = 3,
    /// Format 4.1: which pages of the image are in its parent image.
    Incremental = 4,
    /// Format 4.2: the cgroups of the tree's processes.
    Cgroups = 5,
    /// Format 4.3: SO_PEERCRED of the tree's connected unix sockets.
    UnixPeers = 6,
    /// Format 4.4: connected unix sockets of the tree whose peer was closed.
    UnixDeadPeers = 7,
    /// Format 4.4: files in flight in unix queues that no process holds.
    UnixInFlightFiles = 8,
    /// Format 4.5: the tree's pseudo-terminal pairs.
    Ptys = 9,
    ProcessAttrs = 10,
    /// Format 4.8: SOL_SOCKET options of the tree's unix sockets.
    UnixSocketOptions = 11,
    /// Format 4.9: the tree's own UTS namespace (host and domain name).
    Uts = 12,
}

impl SectionKind {
    pub fn name(self) -> &'static str {
        match self {
            SectionKind::Inventory => "inventory",
            SectionKind::Tree => "process tree",
            SectionKind::Pages => "pages",
            SectionKind::Incremental => "incremental",
            SectionKind::Cgroups => "cgroups",
            SectionKind::UnixPeers => "unix peers",
            SectionKind::UnixDeadPeers => "unix dead peers",
            SectionKind::UnixInFlightFiles => "unix in-flight files",
            SectionKind::Ptys => "ptys",
            SectionKind::ProcessAttrs => "process attributes",
            SectionKind::UnixSocketOptions => "unix socket options",
            SectionKind::Uts => "uts",
        }
    }
    /// The first minor version (of [`FORMAT_MAJOR`]) that has this kind.
    pub fn since_minor(self) -> u16 {
        match self {
            SectionKind::Inventory | SectionKind::Tree | SectionKind::Pages => 0,
            SectionKind::Incremental => 1,
            SectionKind::Cgroups => 2,
            SectionKind::UnixPeers => 3,
            SectionKind::UnixDeadPeers | SectionKind::UnixInFlightFiles => 4,
            SectionKind::Ptys => 6,
            SectionKind::ProcessAttrs => 7,
            SectionKind::UnixSocketOptions => 8,
            SectionKind::Uts => 9,
        }
    }
    pub fn from_u32(v: u32) -> Option<Self> {
        match v {
            1 => Some(SectionKind::Inventory),
            2 => Some(SectionKind::Tree),
            3 => Some(SectionKind::Pages),
            4 => Some(SectionKind::Incremental),
            5 => Some(SectionKind::Cgroups),
            6 => Some(SectionKind::UnixPeers),
            7 => Some(SectionKind::UnixDeadPeers),
            8 => Some(SectionKind::UnixInFlightFiles),
            9 => Some(SectionKind::Ptys),
            10 => Some(SectionKind::ProcessAttrs),
            11 => Some(SectionKind::UnixSocketOptions),
            12 => Some(SectionKind::Uts),
            _ => None,
        }
    }
}

/// The sections of meta.img, in order; `true` marks an optional one.
/// Optional sections come after the process tree section, each at most
/// once, in this order.
pub const META_SECTIONS: &[(SectionKind, bool)] = &[
    (SectionKind::Inventory, false),
    (SectionKind::Tree, false),
    (SectionKind::Incremental, true),
    (SectionKind::Cgroups, true),
    (SectionKind::UnixPeers, true),
    (SectionKind::UnixDeadPeers, true),
    (SectionKind::UnixInFlightFiles, true),
    (SectionKind::Ptys, true),
    (SectionKind::ProcessAttrs, true),
    (SectionKind::UnixSocketOptions, true),
    (SectionKind::Uts, true),
];

/// The sections of a stream: meta.img's, then the page data.
pub const STREAM_SECTIONS: &[(SectionKind, bool)] = &[
    (SectionKind::Inventory, false),
    (SectionKind::Tree, false),
    (SectionKind::Incremental, true),
    (SectionKind::Cgroups, true),
    (SectionKind::UnixPeers, true),
    (SectionKind::UnixDeadPeers, true),
    (SectionKind::UnixInFlightFiles, true),
    (SectionKind::Ptys, true),
    (SectionKind::ProcessAttrs, true),
    (SectionKind::UnixSocketOptions, true),
    (SectionKind::Uts, true),
    (SectionKind::Pages, false),
];

/// Enforces a section order (one of [`META_SECTIONS`], [`STREAM_SECTIONS`])
/// on sections as they are read: a known kind, at most once, in order,
/// none skipped unless optional, and none newer than the image's minor
/// version.
#[derive(Debug)]
pub struct SectionOrder {
    order: &'static [(SectionKind, bool)],
    next: usize,
    version: FormatVersion,
    what: &'static str,
}

impl SectionOrder {
    /// `what` names the container in messages ("meta.img", "stream").
    pub fn new(
        order: &'static [(SectionKind, bool)],
        version: FormatVersion,
        what: &'static str,
    ) -> Self {
        SectionOrder { order, next: 0, version, what }
    }

    /// Accepts the next section's raw kind, or says why it cannot come here.
    pub fn accept(&mut self, kind_raw: u32) -> Result<SectionKind, ImageError> {
        let what = self.what;
        let kind = SectionKind::from_u32(kind_raw).ok_or_else(|| {
            ImageError::Invalid(format!("unknown section kind {kind_raw} in {what}"))
        })?;
        if kind.since_minor() > self.version.minor {
            return Err(ImageError::Invalid(format!(
                "{} section in {what} of image format {}, which has no such section (it came with {}.{})",
                kind.name(),
                self.version,
                self.version.major,
                kind.since_minor()
            )));
        }
        let Some(pos) = self.order.iter().position(|(k, _)| *k == kind) else {
            return Err(ImageError::Invalid(format!(
                "{} section does not belong in {what}",
                kind.name()
            )));
        };
        if pos < self.next {
            return Err(ImageError::Invalid(format!(
                "duplicate {} section in {what}",
                kind.name()
            )));
        }
        if let Some((missing, _)) =
            self.order[self.next..pos].iter().find(|(_, optional)| !optional)
        {
            return Err(ImageError::Invalid(format!(
                "{} section where the {} section was expected in {what}",
                kind.name(),
                missing.name()
            )));
        }
        self.next = pos + 1;
        Ok(kind)
    }

    /// Whether every section that must come has come.
    pub fn complete(&self) -> bool {
        self.order[self.next..].iter().all(|(_, optional)| *optional)
    }
}

pub fn checksum(data: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(data)
}

/// The 16-byte file header of this build's format ([`FormatVersion::CURRENT`]).
pub fn file_header(flags: u16) -> [u8; HEADER_LEN] {
    file_header_for(FormatVersion::CURRENT, flags)
}

/// A file header claiming `version` (for tests and tools that must write
/// another version's header): magic, major as u32, then the flags word
/// `minor << 16 | flags`, all little-endian.
pub fn file_header_for(version: FormatVersion, flags: u16) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[..8].copy_from_slice(MAGIC);
    h[8..12].copy_from_slice(&version.major.to_le_bytes());
    let word = (u32::from(version.minor) << MINOR_SHIFT) | u32::from(flags);
    h[12..16].copy_from_slice(&word.to_le_bytes());
    h
}

/// Checks a file header: magic, the major version (must be
/// [`FORMAT_MAJOR`]), the minor (at most [`FORMAT_MINOR`]) and the flags
/// (only [`KNOWN_HEADER_FLAGS`]). `what` names the file in messages.
pub fn read_file_header(bytes: &[u8], what: &str) -> Result<FileHeader, ImageError> {
    let Some(h) = bytes.get(..HEADER_LEN) else {
        return Err(ImageError::Truncated(format!(
            "{what}: header is {} bytes, need {HEADER_LEN}",
            bytes.len()
        )));
    };
    if &h[..8] != MAGIC {
        return Err(ImageError::BadMagic(what.to_string()));
    }
    let major = u32::from_le_bytes([h[8], h[9], h[10], h[11]]);
    if major != FORMAT_MAJOR {
        // Another major may keep its minor elsewhere: report the major only.
        return Err(ImageError::Version { found: major, supported: FORMAT_MAJOR });
    }
    let word = u32::from_le_bytes([h[12], h[13], h[14], h[15]]);
    let minor = (word >> MINOR_SHIFT) as u16;
    let flags = (word & 0xffff) as u16;
    if minor > FORMAT_MINOR {
        return Err(ImageError::NewerMinor { major, found: minor, supported: FORMAT_MINOR });
    }
    if flags & !KNOWN_HEADER_FLAGS != 0 {
        return Err(ImageError::Invalid(format!(
            "{what}: header flags {flags:#06x} unknown in image format {major}.{minor}"
        )));
    }
    Ok(FileHeader { version: FormatVersion { major, minor }, flags })
}

/// [`read_file_header`], returning only the flags (the low 16 bits of
/// the flags word).
pub fn check_file_header(bytes: &[u8], what: &str) -> Result<u32, ImageError> {
    read_file_header(bytes, what).map(|h| u32::from(h.flags))
}

pub fn section_header(kind: SectionKind, payload: &[u8]) -> [u8; SECTION_HEADER_LEN] {
    section_header_raw(kind, payload.len() as u64, checksum(payload))
}

pub fn section_header_raw(kind: SectionKind, len: u64, sum: u64) -> [u8; SECTION_HEADER_LEN] {
    let mut h = [0u8; SECTION_HEADER_LEN];
    h[..4].copy_from_slice(&(kind as u32).to_le_bytes());
    h[8..16].copy_from_slice(&len.to_le_bytes());
    h[16..24].copy_from_slice(&sum.to_le_bytes());
    h
}

/// Reads one section from `bytes`, checking its checksum. Returns the kind,
/// the payload and the rest of the input.
pub fn read_section(bytes: &[u8]) -> Result<(SectionKind, &[u8], &[u8]), ImageError> {
    let (kind_raw, payload, rest) = read_section_raw(bytes)?;
    let kind = SectionKind::from_u32(kind_raw)
        .ok_or_else(|| ImageError::Invalid(format!("unknown section kind {kind_raw}")))?;
    Ok((kind, payload, rest))
}

/// [`read_section`] for a kind this build may not know: the kind is
/// returned as is, and the length and checksum are still checked.
pub(crate) fn read_section_raw(bytes: &[u8]) -> Result<(u32, &[u8], &[u8]), ImageError> {
    let (section, rest) = split_section(bytes)?;
    section.check()?;
    Ok((section.kind_raw, section.payload, rest))
}

/// One section as framed, its checksum not checked yet ([`Self::check`]).
pub(crate) struct RawSection<'a> {
    pub kind_raw: u32,
    pub payload: &'a [u8],
    sum: u64,
}

impl RawSection<'_> {
    fn name(&self) -> String {
        SectionKind::from_u32(self.kind_raw)
            .map_or_else(|| format!("kind-{}", self.kind_raw), |k| k.name().to_string())
    }

    /// The payload's checksum against the header's.
    pub fn check(&self) -> Result<(), ImageError> {
        if checksum(self.payload) != self.sum {
            return Err(ImageError::Checksum { what: format!("{} section", self.name()) });
        }
        Ok(())
    }

    /// Decodes the payload with `decode` while another thread checks its
    /// checksum (a 40 MB process tree with 10,000 connections' queues:
    /// the hash is most of the read). Nothing decoded is returned unless
    /// the checksum holds, and a wrong checksum is the error even when
    /// the decode failed too: decoding any bytes is safe (it never
    /// panics and allocates within the payload's length), trusting them
    /// is not.
    pub fn decode_checked<T: Send>(
        &self,
        decode: impl FnOnce(&[u8]) -> Result<T, ImageError>,
    ) -> Result<T, ImageError> {
        const ALONE_BELOW: usize = 1 << 20;
        if self.payload.len() < ALONE_BELOW {
            self.check()?;
            return decode(self.payload);
        }
        std::thread::scope(|scope| {
            let hashing = std::thread::Builder::new()
                .name("ferry-image-sum".into())
                .spawn_scoped(scope, || self.check());
            let decoded = decode(self.payload);
            match hashing {
                Ok(h) => h.join().unwrap_or_else(|_| {
                    Err(ImageError::Invalid("checksum thread panicked".into()))
                })?,
                // No thread to be had: checked here, after the decode.
                Err(_) => self.check()?,
            }
            decoded
        })
    }
}

/// Splits one section off `bytes`: its header checked (reserved word,
/// length within [`MAX_SECTION_LEN`] and the input), not its checksum.
pub(crate) fn split_section(bytes: &[u8]) -> Result<(RawSection<'_>, &[u8]), ImageError> {
    let Some((h, rest)) = bytes.split_first_chunk::<SECTION_HEADER_LEN>() else {
        return Err(ImageError::Truncated(format!(
            "section header needs {SECTION_HEADER_LEN} bytes, {} left",
            bytes.len()
        )));
    };
    let kind_raw = u32::from_le_bytes([h[0], h[1], h[2], h[3]]);
    let reserved = u32::from_le_bytes([h[4], h[5], h[6], h[7]]);
    let len = u64::from_le_bytes([h[8], h[9], h[10], h[11], h[12], h[13], h[14], h[15]]);
    let sum = u64::from_le_bytes([h[16], h[17], h[18], h[19], h[20], h[21], h[22], h[23]]);
    let name = SectionKind::from_u32(kind_raw)
        .map_or_else(|| format!("kind-{kind_raw}"), |k| k.name().to_string());
    check_reserved(&name, reserved)?;
    if len > MAX_SECTION_LEN {
        return Err(ImageError::Invalid(format!("{name} section claims {len} bytes")));
    }
    if (rest.len() as u64) < len {
        return Err(ImageError::Truncated(format!(
            "{name} section claims {len} bytes, {} present",
            rest.len()
        )));
    }
    let (payload, rest) = rest.split_at(len as usize);
    Ok((RawSection { kind_raw, payload, sum }, rest))
}

/// The section header's `reserved` word: 0 in every format this build
/// knows (a later minor may give it a meaning).
pub fn check_reserved(section: &str, reserved: u32) -> Result<(), ImageError> {
    if reserved != 0 {
        return Err(ImageError::Invalid(format!(
            "{section} section header: reserved word is {reserved:#x}, not 0"
        )));
    }
    Ok(())
}

/// Encodes the metadata file: header, inventory section, process section.
pub fn encode_meta(inventory: &Inventory, process: &TreeImage) -> Result<Vec<u8>, ImageError> {
    encode_meta_with(inventory, process, None)
}

/// What takes the sections of a metadata file one by one, in order
/// ([`each_section`]): a size count, a buffer, a file.
pub(crate) trait SectionVisitor {
    fn section<T: serde::Serialize>(
        &mut self,
        kind: SectionKind,
        value: &T,
        name: &'static str,
    ) -> Result<(), ImageError>;
}

/// Hands `v` every section of the metadata file in order: inventory,
/// process tree, then (with `Some`) the `Incremental` section and the
/// tree's optional sections.
pub(crate) fn each_section(
    v: &mut impl SectionVisitor,
    inventory: &Inventory,
    process: &TreeImage,
    incremental: Option<&Incremental>,
) -> Result<(), ImageError> {
    v.section(SectionKind::Inventory, inventory, "inventory")?;
    v.section(SectionKind::Tree, process, "process")?;
    if let Some(inc) = incremental {
        v.section(SectionKind::Incremental, inc, "incremental")?;
    }
    if let Some(cg) = &process.cgroups {
        v.section(SectionKind::Cgroups, cg, "cgroups")?;
    }
    if let Some(up) = &process.unix_peers {
        v.section(SectionKind::UnixPeers, up, "unix peers")?;
    }
    if let Some(dp) = &process.unix_dead_peers {
        v.section(SectionKind::UnixDeadPeers, dp, "unix dead peers")?;
    }
    if let Some(f) = &process.unix_in_flight_files {
        v.section(SectionKind::UnixInFlightFiles, f, "unix in-flight files")?;
    }
    if let Some(p) = &process.ptys {
        v.section(SectionKind::Ptys, p, "ptys")?;
    }
    if let Some(a) = &process.process_attrs {
        v.section(SectionKind::ProcessAttrs, a, "process attributes")?;
    }
    if let Some(o) = &process.unix_socket_options {
        v.section(SectionKind::UnixSocketOptions, o, "unix socket options")?;
    }
    if let Some(u) = &process.uts {
        v.section(SectionKind::Uts, u, "uts")?;
    }
    Ok(())
}

/// Encodes the metadata file of an image that may be incremental: header,
/// inventory section, process section, then (with `Some`) the
/// `Incremental` section. The header says [`FormatVersion::CURRENT`].
pub fn encode_meta_with(
    inventory: &Inventory,
    process: &TreeImage,
    incremental: Option<&Incremental>,
) -> Result<Vec<u8>, ImageError> {
    // One buffer of the exact size, each payload serialized in place: a
    // tree with 10,000 connections makes a 40 MB file, and growing and
    // copying buffers for it cost more than encoding it.
    let mut size = Sized_(HEADER_LEN);
    each_section(&mut size, inventory, process, incremental)?;
    let mut out = Pushed(Vec::with_capacity(size.0));
    out.0.extend_from_slice(&file_header(0));
    each_section(&mut out, inventory, process, incremental)?;
    Ok(out.0)
}

/// Counts the bytes of the sections.
struct Sized_(usize);

impl SectionVisitor for Sized_ {
    fn section<T: serde::Serialize>(
        &mut self,
        _: SectionKind,
        value: &T,
        name: &'static str,
    ) -> Result<(), ImageError> {
        let len = postcard::serialize_with_flavor(value, postcard::ser_flavors::Size::default())
            .map_err(|e| ImageError::Decode { kind: name, reason: e.to_string() })?;
        self.0 += SECTION_HEADER_LEN + len;
        Ok(())
    }
}

/// Appends each section to a buffer: its header, then its payload
/// serialized straight into it.
struct Pushed(Vec<u8>);

impl SectionVisitor for Pushed {
    fn section<T: serde::Serialize>(
        &mut self,
        kind: SectionKind,
        value: &T,
        name: &'static str,
    ) -> Result<(), ImageError> {
        let out = &mut self.0;
        let at = out.len();
        out.extend_from_slice(&[0u8; SECTION_HEADER_LEN]);
        postcard::serialize_with_flavor(value, VecFlavor(out))
            .map_err(|e| ImageError::Decode { kind: name, reason: e.to_string() })?;
        let payload = &out[at + SECTION_HEADER_LEN..];
        let header = section_header_raw(kind, payload.len() as u64, checksum(payload));
        out[at..at + SECTION_HEADER_LEN].copy_from_slice(&header);
        Ok(())
    }
}

/// A postcard output that appends to a vector, slices with one copy
/// (postcard's own `to_extend` pushes them byte by byte: 40 MB of TCP
/// queues took longer than the rest of the image).
pub(crate) struct VecFlavor<'a>(pub(crate) &'a mut Vec<u8>);

impl postcard::ser_flavors::Flavor for VecFlavor<'_> {
    type Output = ();
    fn try_extend(&mut self, data: &[u8]) -> postcard::Result<()> {
        self.0.extend_from_slice(data);
        Ok(())
    }
    fn try_push(&mut self, data: u8) -> postcard::Result<()> {
        self.0.push(data);
        Ok(())
    }
    fn finalize(self) -> postcard::Result<()> {
        Ok(())
    }
}

/// Decodes the `ProcessAttrs` section in the layout of the image's minor.
pub fn decode_process_attrs(
    payload: &[u8],
    version: FormatVersion,
) -> Result<ProcessAttrsImage, ImageError> {
    if version.minor < 8 {
        let old: crate::model::ProcessAttrsImage47 = decode_payload(payload, "process attributes")?;
        return Ok(old.into());
    }
    decode_payload(payload, "process attributes")
}

/// Decodes one section payload; leftover bytes inside it are an error.
pub fn decode_payload<T: serde::de::DeserializeOwned>(
    payload: &[u8],
    kind: &'static str,
) -> Result<T, ImageError> {
    let (value, left) = postcard::take_from_bytes::<T>(payload)
        .map_err(|e| ImageError::Decode { kind, reason: e.to_string() })?;
    if !left.is_empty() {
        return Err(ImageError::Decode { kind, reason: format!("{} trailing bytes", left.len()) });
    }
    Ok(value)
}

/// Decodes and checks the metadata file. Never panics on any input.
///
/// An incremental image is accepted (its `Incremental` section is checked,
/// then dropped): callers that restore must use [`decode_meta_full`] or
/// `ImageDir::read_meta_complete` and refuse an incremental image they
/// cannot pair with its parent.
pub fn decode_meta(bytes: &[u8]) -> Result<(Inventory, TreeImage), ImageError> {
    decode_meta_full(bytes).map(|(inv, tree, _)| (inv, tree))
}

/// Decodes and checks the metadata file, with its `Incremental` section
/// (`None`: the image holds every page itself). Never panics on any input.
pub fn decode_meta_full(
    bytes: &[u8],
) -> Result<(Inventory, TreeImage, Option<Incremental>), ImageError> {
    decode_meta_versioned(bytes).map(|(_, inv, tree, inc)| (inv, tree, inc))
}

/// [`decode_meta_full`] of a shared buffer (meta.img's mapping): the
/// TCP queues of the tree are ranges of `meta` rather than copies, and
/// keep it alive. Checked exactly as [`decode_meta_full`] checks.
pub fn decode_meta_shared(
    meta: &bytes::Bytes,
) -> Result<(Inventory, TreeImage, Option<Incremental>), ImageError> {
    crate::queue::decoding_from(meta, || decode_meta_full(meta))
}

/// Decodes the optional tree section `kind` (format 4.2 on) into its
/// field of `tree`; false for a kind that is no such section (the
/// inventory, the tree, Incremental, the pages). meta.img and the stream
/// read them alike.
pub(crate) fn decode_optional(
    tree: &mut TreeImage,
    kind: SectionKind,
    payload: &[u8],
    version: FormatVersion,
) -> Result<bool, ImageError> {
    match kind {
        SectionKind::Cgroups => tree.cgroups = Some(decode_payload(payload, "cgroups")?),
        SectionKind::UnixPeers => tree.unix_peers = Some(decode_payload(payload, "unix peers")?),
        SectionKind::UnixDeadPeers => {
            tree.unix_dead_peers = Some(decode_payload(payload, "unix dead peers")?)
        }
        SectionKind::UnixInFlightFiles => {
            tree.unix_in_flight_files = Some(decode_payload(payload, "unix in-flight files")?)
        }
        SectionKind::Ptys => tree.ptys = Some(decode_payload(payload, "ptys")?),
        SectionKind::ProcessAttrs => {
            tree.process_attrs = Some(decode_process_attrs(payload, version)?)
        }
        SectionKind::UnixSocketOptions => {
            tree.unix_socket_options = Some(decode_payload(payload, "unix socket options")?)
        }
        SectionKind::Uts => tree.uts = Some(decode_payload(payload, "uts")?),
        SectionKind::Inventory
        | SectionKind::Tree
        | SectionKind::Incremental
        | SectionKind::Pages => return Ok(false),
    }
    Ok(true)
}

/// [`decode_meta_full`], also returning the format version the image's
/// header claims.
pub fn decode_meta_versioned(
    bytes: &[u8],
) -> Result<(FormatVersion, Inventory, TreeImage, Option<Incremental>), ImageError> {
    let header = read_file_header(bytes, "meta.img")?;
    let mut order = SectionOrder::new(META_SECTIONS, header.version, "meta.img");
    let mut rest = &bytes[HEADER_LEN..];
    let mut inventory: Option<Inventory> = None;
    let mut process: Option<TreeImage> = None;
    let mut incremental: Option<Incremental> = None;
    // The inventory and the process tree, then optional sections, each at
    // most once and in order, and nothing after them.
    while !rest.is_empty() || inventory.is_none() || process.is_none() {
        let (section, r) = match split_section(rest) {
            // What follows the required sections is not a whole section.
            Err(ImageError::Truncated(why)) if order.complete() => {
                return Err(ImageError::Invalid(format!(
                    "{} unexpected bytes after the last section ({why})",
                    rest.len()
                )))
            }
            other => other?,
        };
        rest = r;
        let kind = order.accept(section.kind_raw)?;
        if kind == SectionKind::Tree {
            process = Some(section.decode_checked(|p| decode_payload(p, "process"))?);
            continue;
        }
        section.check()?;
        let payload = section.payload;
        match kind {
            SectionKind::Inventory => inventory = Some(decode_payload(payload, "inventory")?),
            SectionKind::Tree => process = Some(decode_payload(payload, "process")?),
            SectionKind::Incremental => incremental = Some(decode_payload(payload, "incremental")?),
            // META_SECTIONS does not hold it: `accept` refused it.
            SectionKind::Pages => {
                return Err(ImageError::Invalid("pages section does not belong in meta.img".into()))
            }
            // `order` takes optional sections only after the tree.
            optional => {
                let tree = process.as_mut().ok_or_else(|| {
                    ImageError::Invalid(format!("{} section before the tree", optional.name()))
                })?;
                decode_optional(tree, optional, payload, header.version)?;
            }
        }
    }
    let (Some(inventory), Some(process)) = (inventory, process) else {
        return Err(ImageError::Truncated(
            "meta.img lacks the inventory or the process tree section".into(),
        ));
    };
    crate::validate::validate(&inventory, &process)?;
    crate::validate::validate_ptys(&process)?;
    crate::validate::validate_process_attrs(&process)?;
    crate::validate::validate_unix_socket_options(&process)?;
    crate::validate::validate_uts(&process)?;
    crate::validate::validate_unix_in_flight_files(&process)?;
    if let Some(inc) = &incremental {
        crate::validate::validate_incremental(&process, inc)?;
    }
    Ok((header.version, inventory, process, incremental))
}

/// The error a restore without the image's parent must give for an
/// incremental image; `Ok` for an image that holds all its pages.
pub fn require_complete(incremental: Option<&Incremental>) -> Result<(), ImageError> {
    match incremental {
        None => Ok(()),
        Some(i) => Err(ImageError::NeedsParent { parent_id: i.parent_id }),
    }
}
