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
    /// The metadata whose page runs were verified against `loaded`: a
    /// later load of the same metadata (a replacement loads its image for
    /// the trial, then for the restore) does not read every page again.
    verified: Option<Vec<u8>>,
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
        if self.verified.as_ref() != Some(meta) {
            let runs: Vec<PageRun> =
                tree.processes.iter().flat_map(|p| p.page_runs.iter().copied()).collect();
            crate::dir::ImageDir::verify_runs_parallel(&runs, &pages, threads)?;
            self.verified = Some(meta.clone());
        }
        Ok(LoadedImage { inventory, tree, pages: Box::new(pages) })
    }

    fn describe(&self) -> String {
        "in-memory image".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{
        MmLayout, ProcessImage, SigAction, SignalState, ThreadImage, Vma, VmaBacking, PROT_READ,
        PROT_WRITE,
    };

    /// One process, one thread, one page mapped and captured in `run`.
    fn image_with(run: PageRun) -> (Inventory, TreeImage) {
        let thread = ThreadImage {
            tid: 7,
            comm: "t".into(),
            regs: vec![0; 27],
            xstate: vec![0; 576],
            sigmask: 0,
            pending: vec![],
            altstack: Default::default(),
            rseq: None,
            robust_list: Default::default(),
            clear_child_tid: 0,
            timer_slack_ns: 50_000,
            sched: Default::default(),
            sleep_remaining_ns: None,
        };
        let vma = Vma {
            start: 0x1000,
            end: 0x2000,
            prot: PROT_READ | PROT_WRITE,
            shared: false,
            flags: 0,
            pgoff: 0,
            backing: VmaBacking::Anonymous,
        };
        let p = ProcessImage {
            pid: 7,
            ppid: 1,
            threads: vec![thread],
            vmas: vec![vma],
            page_runs: vec![run],
            signals: SignalState {
                actions: vec![SigAction::default(); 64],
                shared_pending: vec![],
            },
            mm: MmLayout { auxv: vec![6, 4096, 0, 0], ..Default::default() },
            ..Default::default()
        };
        let inv = Inventory {
            format_version: crate::container::FORMAT_VERSION,
            xsave_size: 576,
            pages_bytes: 4096,
            ..Default::default()
        };
        (inv, TreeImage { processes: vec![p], ..Default::default() })
    }

    #[test]
    fn pages_are_verified_once_per_metadata() {
        let mut img = MemoryImage::new();
        img.set_data_len(4096).expect("data area");
        let runs = img.write_runs_at(7, 0, &[(0x1000, 4096)], &[5u8; 4096]).expect("page");
        let (inv, tree) = image_with(runs[0]);
        img.finish_image(&inv, &tree, None).expect("meta");
        assert_eq!(img.load(1).expect("first load").tree.processes[0].pid, 7);
        assert_eq!(img.load(1).expect("second load, verified before").tree.processes.len(), 1);
        // Other metadata over the same pages is verified again: a wrong
        // checksum is found.
        let (inv, tree) = image_with(PageRun { checksum: runs[0].checksum ^ 1, ..runs[0] });
        img.finish_image(&inv, &tree, None).expect("meta");
        assert!(img.load(1).is_err(), "a page run with a wrong checksum loaded");
    }
}
