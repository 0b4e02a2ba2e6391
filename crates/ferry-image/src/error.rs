use std::path::PathBuf;

/// Why an image could not be written or was rejected.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("{path}: {err}")]
    Io { path: PathBuf, err: std::io::Error },
    #[error("not a ferry image (bad magic in {0})")]
    BadMagic(String),
    /// Another major version (in the file header or the inventory).
    #[error("image format {found} is not readable by this build (reads {supported}.x)")]
    Version { found: u32, supported: u32 },
    /// The same major version, but a newer minor than this build knows:
    /// the image may hold sections this build cannot interpret.
    #[error("image format {major}.{found} is newer than this ferry build reads ({major}.{supported}): upgrade ferry on this host")]
    NewerMinor { major: u32, found: u16, supported: u16 },
    /// The image is incremental: some of its pages are in its parent, and
    /// restoring it alone would give the process wrong memory.
    #[error("image is incremental (parent id {parent_id}); restore needs its parent")]
    NeedsParent { parent_id: u64 },
    /// An incremental image's parent is not the image it was taken
    /// against any more (rewritten, or another image in its place).
    #[error("image {image}: its parent {parent} changed since the image was taken; restore needs the parent it was taken against")]
    ParentChanged { image: PathBuf, parent: PathBuf },
    #[error("image truncated: {0}")]
    Truncated(String),
    #[error("checksum mismatch in {what}: image is corrupted")]
    Checksum { what: String },
    #[error("section {kind} could not be decoded: {reason}")]
    Decode { kind: &'static str, reason: String },
    #[error("invalid image: {0}")]
    Invalid(String),
    #[error("refusing the image: {0}")]
    Unsafe(String),
}

impl ImageError {
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        ImageError::Io { path: path.into(), err: source }
    }
}
