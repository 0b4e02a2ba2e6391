use std::path::PathBuf;

/// Why an image could not be written or was rejected.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("{path}: {err}")]
    Io { path: PathBuf, err: std::io::Error },
    #[error("not a ferry image (bad magic in {0})")]
    BadMagic(String),
    #[error("image format version {found} is not supported (this ferry reads version {supported})")]
    Version { found: u32, supported: u32 },
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
