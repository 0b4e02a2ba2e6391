//! ferry's checkpoint image: what is stored ([`model`]), how it is framed
//! into checksummed sections ([`container`]), how the sections sit in an
//! image directory ([`dir`]), and what a well-formed image must satisfy
//! before anything is restored from it ([`validate`]).
//!
//! The layout is documented in docs/image-format.md.

pub mod chain;
pub mod container;
pub mod dir;
pub mod error;
pub mod memory;
mod meta_file;
pub mod model;
pub mod queue;
pub mod sink;
pub mod source;
pub mod stream;
pub mod validate;

pub use chain::DirSource;
pub use container::{
    decode_meta, decode_meta_full, encode_meta, encode_meta_with, require_complete, FormatVersion,
    FORMAT_MAJOR, FORMAT_MINOR, FORMAT_VERSION,
};
pub use dir::{DirSink, ImageDir, PagesWriter};
pub use error::ImageError;
pub use memory::MemoryImage;
pub use model::*;
pub use queue::QueueBytes;
pub use sink::{ImageSink, PageSink};
pub use source::{ImageSource, LoadedImage, PageArea};
pub use stream::{dir_to_stream, read_stream, read_stream_full, write_stream, write_stream_with};
