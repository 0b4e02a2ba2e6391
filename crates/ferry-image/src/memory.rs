//! An image held in memory: sink and source in one. Its metadata is kept
//! encoded, exactly as meta.img would hold it, so loading it decodes and
//! validates it like any other image: a restore from memory takes the
//! same checks as one from disk.

use crate::container;
use crate::error::ImageError;
use crate::model::{Incremental, Inventory, PageRun, TreeImage};
use crate::sink::{ImageSink, PageSink};
use crate::source::{ImageSource, LoadedImage};
use std::sync::{Arc, Mutex};

#[derive(Default)]
pub struct MemoryImage {
    pages: Mutex<Vec<u8>>,
    data_len: u64,
    meta: Option<Vec<u8>>,
    /// The page data once loaded: shared by every later load.
    loaded: Option<Arc<Vec<u8>>>,
}

impl MemoryImage {
    pub fn new() -> MemoryImage {
        MemoryImage::default()
    }

    /// Whether the metadata was stored: the image is complete.
    pub fn is_complete(&self) -> bool {
        self.meta.is_some()
    }

    fn poisoned() -> ImageError {
        ImageError::Invalid("in-memory image: a writing thread panicked".into())
    }
}

impl PageSink for MemoryImage {
    fn data_len(&self) -> u64 {
        self.data_len
    }

    // Pages written after a load would not be seen by it: a sink is
    // written once, then read.
    fn write_runs_at(
        &self,
        _pid: i32,
        data_offset: u64,
        ranges: &[(u64, usize)],
        data: &[u8],
    ) -> Result<Vec<PageRun>, ImageError> {
        let start = usize::try_from(data_offset)
            .map_err(|_| ImageError::Invalid("in-memory image: offset too large".into()))?;
        {
            let mut pages = self.pages.lock().map_err(|_| Self::poisoned())?;
            if pages.len() < start + data.len() {
                pages.resize(start + data.len(), 0);
            }
            pages[start..start + data.len()].copy_from_slice(data);
        }
        crate::sink::runs_at(data_offset, ranges, data, true)
    }

    fn set_data_len(&mut self, len: u64) -> Result<(), ImageError> {
        let len_usize = usize::try_from(len)
            .map_err(|_| ImageError::Invalid("in-memory image: data area too large".into()))?;
        self.pages.get_mut().map_err(|_| Self::poisoned())?.resize(len_usize, 0);
        self.data_len = len;
        Ok(())
    }
}

impl ImageSink for MemoryImage {
    fn finish_image(
        &mut self,
        inventory: &Inventory,
        tree: &TreeImage,
        incremental: Option<&Incremental>,
    ) -> Result<u64, ImageError> {
        let meta = container::encode_meta_with(inventory, tree, incremental)?;
        let total = meta.len() as u64 + self.data_len;
        self.meta = Some(meta);
        Ok(total)
    }
}

impl ImageSource for MemoryImage {
    fn load(&mut self, threads: usize) -> Result<LoadedImage, ImageError> {
        let meta = self.meta.as_ref().ok_or_else(|| {
            ImageError::Truncated("in-memory image: its metadata was never stored".into())
        })?;
        let (inventory, tree, incremental) = container::decode_meta_full(meta)?;
        container::require_complete(incremental.as_ref())?;
        let pages = match &self.loaded {
            Some(p) => p.clone(),
            None => Arc::new(std::mem::take(self.pages.get_mut().map_err(|_| Self::poisoned())?)),
        };
        self.loaded = Some(pages.clone());
        if pages.len() as u64 != inventory.pages_bytes {
            return Err(ImageError::Truncated(format!(
                "in-memory image holds {} bytes of page data, inventory says {}",
                pages.len(),
                inventory.pages_bytes
            )));
        }
        let runs: Vec<PageRun> =
            tree.processes.iter().flat_map(|p| p.page_runs.iter().copied()).collect();
        crate::dir::ImageDir::verify_runs_parallel(&runs, &pages, threads)?;
        Ok(LoadedImage { inventory, tree, pages: Box::new(pages) })
    }

    fn describe(&self) -> String {
        "in-memory image".into()
    }
}
