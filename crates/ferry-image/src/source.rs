//! Where a restore reads a whole image from: the counterpart of
//! [`ImageSink`](crate::sink::ImageSink). A directory, a chain of
//! incremental directories and an in-memory store are sources; restore
//! does not know which one it reads.
//!
//! Every source hands out an image that was checked as hostile input
//! first: metadata decoded and validated, every page run checked against
//! its checksum, every page an incremental image leaves to its parent
//! resolved from that parent.

use crate::error::ImageError;
use crate::model::{Inventory, TreeImage};

/// A page data area: the bytes every [`PageRun`](crate::PageRun)'s offset
/// points into.
pub trait PageArea {
    fn bytes(&self) -> &[u8];
}

impl PageArea for Vec<u8> {
    fn bytes(&self) -> &[u8] {
        self
    }
}

impl PageArea for std::sync::Arc<Vec<u8>> {
    fn bytes(&self) -> &[u8] {
        self.as_slice()
    }
}

impl PageArea for ferry_sys::process::MappedFile {
    fn bytes(&self) -> &[u8] {
        ferry_sys::process::MappedFile::bytes(self)
    }
}

/// A complete, verified image: what a restore needs and nothing else.
pub struct LoadedImage {
    pub inventory: Inventory,
    pub tree: TreeImage,
    pub pages: Box<dyn PageArea>,
}

impl std::fmt::Debug for LoadedImage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedImage")
            .field("processes", &self.tree.processes.len())
            .field("page_bytes", &self.pages.bytes().len())
            .finish()
    }
}

/// A readable image.
pub trait ImageSource {
    /// Reads and verifies the whole image (`threads` may check page
    /// checksums in parallel). An incremental image comes back complete,
    /// its parent's pages resolved, or is refused.
    fn load(&mut self, threads: usize) -> Result<LoadedImage, ImageError>;
    /// What the image is, for messages ("image directory /x").
    fn describe(&self) -> String;
}
