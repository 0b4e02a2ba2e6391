//! Framing: a fixed header, then sections. Each section is
//! `kind: u32 | reserved: u32 | len: u64 | xxh3: u64 | payload[len]`, so a
//! reader can check every byte before it trusts any of it, and the same
//! bytes can be written to a file or to a socket.

use crate::error::ImageError;
use crate::model::{Inventory, TreeImage};

pub const MAGIC: &[u8; 8] = b"FERRYIMG";
pub const FORMAT_VERSION: u32 = 4;
pub const HEADER_LEN: usize = 16;
pub const SECTION_HEADER_LEN: usize = 24;
/// Metadata larger than this is refused: a hostile length cannot make the
/// reader allocate without bound.
pub const MAX_SECTION_LEN: u64 = 1 << 30;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum SectionKind {
    Inventory = 1,
    Tree = 2,
    Pages = 3,
}

impl SectionKind {
    pub fn name(self) -> &'static str {
        match self {
            SectionKind::Inventory => "inventory",
            SectionKind::Tree => "process tree",
            SectionKind::Pages => "pages",
        }
    }
    fn from_u32(v: u32) -> Option<Self> {
        match v {
            1 => Some(SectionKind::Inventory),
            2 => Some(SectionKind::Tree),
            3 => Some(SectionKind::Pages),
            _ => None,
        }
    }
}

pub fn checksum(data: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(data)
}

pub fn file_header(flags: u32) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[..8].copy_from_slice(MAGIC);
    h[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    h[12..16].copy_from_slice(&flags.to_le_bytes());
    h
}

pub fn check_file_header(bytes: &[u8], what: &str) -> Result<u32, ImageError> {
    if bytes.len() < HEADER_LEN {
        return Err(ImageError::Truncated(format!("{what}: header is {} bytes, need {HEADER_LEN}", bytes.len())));
    }
    if &bytes[..8] != MAGIC {
        return Err(ImageError::BadMagic(what.to_string()));
    }
    let version = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
    if version != FORMAT_VERSION {
        return Err(ImageError::Version { found: version, supported: FORMAT_VERSION });
    }
    Ok(u32::from_le_bytes([bytes[12], bytes[13], bytes[14], bytes[15]]))
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
    if bytes.len() < SECTION_HEADER_LEN {
        return Err(ImageError::Truncated(format!("section header needs {SECTION_HEADER_LEN} bytes, {} left", bytes.len())));
    }
    let kind_raw = u32::from_le_bytes(bytes[0..4].try_into().expect("4 bytes"));
    let len = u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes"));
    let sum = u64::from_le_bytes(bytes[16..24].try_into().expect("8 bytes"));
    let kind = SectionKind::from_u32(kind_raw).ok_or_else(|| ImageError::Invalid(format!("unknown section kind {kind_raw}")))?;
    if len > MAX_SECTION_LEN {
        return Err(ImageError::Invalid(format!("{} section claims {len} bytes", kind.name())));
    }
    let rest = &bytes[SECTION_HEADER_LEN..];
    if (rest.len() as u64) < len {
        return Err(ImageError::Truncated(format!("{} section claims {len} bytes, {} present", kind.name(), rest.len())));
    }
    let (payload, rest) = rest.split_at(len as usize);
    if checksum(payload) != sum {
        return Err(ImageError::Checksum { what: format!("{} section", kind.name()) });
    }
    Ok((kind, payload, rest))
}

/// Encodes the metadata file: header, inventory section, process section.
pub fn encode_meta(inventory: &Inventory, process: &TreeImage) -> Result<Vec<u8>, ImageError> {
    let inv = postcard::to_stdvec(inventory).map_err(|e| ImageError::Decode { kind: "inventory", reason: e.to_string() })?;
    let proc_ = postcard::to_stdvec(process).map_err(|e| ImageError::Decode { kind: "process", reason: e.to_string() })?;
    let mut out = Vec::with_capacity(HEADER_LEN + 2 * SECTION_HEADER_LEN + inv.len() + proc_.len());
    out.extend_from_slice(&file_header(0));
    out.extend_from_slice(&section_header(SectionKind::Inventory, &inv));
    out.extend_from_slice(&inv);
    out.extend_from_slice(&section_header(SectionKind::Tree, &proc_));
    out.extend_from_slice(&proc_);
    Ok(out)
}

/// Decodes one section payload; leftover bytes inside it are an error.
pub fn decode_payload<T: serde::de::DeserializeOwned>(payload: &[u8], kind: &'static str) -> Result<T, ImageError> {
    let (value, left) = postcard::take_from_bytes::<T>(payload).map_err(|e| ImageError::Decode { kind, reason: e.to_string() })?;
    if !left.is_empty() {
        return Err(ImageError::Decode { kind, reason: format!("{} trailing bytes", left.len()) });
    }
    Ok(value)
}

/// Decodes and checks the metadata file. Never panics on any input.
pub fn decode_meta(bytes: &[u8]) -> Result<(Inventory, TreeImage), ImageError> {
    check_file_header(bytes, "meta.img")?;
    let rest = &bytes[HEADER_LEN..];
    // Exactly two sections, in this order, and nothing after them.
    let (kind, payload, rest) = read_section(rest)?;
    if kind != SectionKind::Inventory {
        return Err(ImageError::Invalid(format!("{} section where the inventory was expected", kind.name())));
    }
    let inventory: Inventory = decode_payload(payload, "inventory")?;
    let (kind, payload, rest) = read_section(rest)?;
    if kind != SectionKind::Tree {
        return Err(ImageError::Invalid(format!("{} section where the process tree section was expected", kind.name())));
    }
    let process: TreeImage = decode_payload(payload, "process")?;
    if !rest.is_empty() {
        return Err(ImageError::Invalid(format!("{} unexpected bytes after the process tree section", rest.len())));
    }
    crate::validate::validate(&inventory, &process)?;
    Ok((inventory, process))
}
