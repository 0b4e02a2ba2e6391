//! One sync's capture, held in memory: the freeze copies the dirty pages
//! and the metadata here, the tree runs on, and only then does the sync
//! go over the link. The service's output stays held either way, so
//! sending outside the pause loses nothing and shortens the pause by the
//! time the link takes.

use ferry_image::{ImageError, ImageSink, Incremental, Inventory, PageRun, PageSink, TreeImage};
use ferry_migrate::protocol::{self, Msg};
use ferry_transport::Channel;
use std::sync::Mutex;

/// Pages as the capture wrote them: (pid, ranges (address, bytes), data).
type PageBatch = (i32, Vec<(u64, u64)>, Vec<u8>);

#[derive(Default)]
pub(crate) struct SyncBuffer {
    pages: Mutex<Vec<PageBatch>>,
    data_len: u64,
    meta: Option<Vec<u8>>,
    host_pids: Vec<i32>,
}

fn poisoned() -> ImageError {
    ImageError::Invalid("sync buffer: a copying thread panicked".into())
}

impl SyncBuffer {
    pub(crate) fn set_host_pids(&mut self, pids: Vec<i32>) {
        self.host_pids = pids;
    }

    /// Page bytes held.
    pub(crate) fn page_bytes(&self) -> u64 {
        self.pages.lock().map(|p| p.iter().map(|(_, _, d)| d.len() as u64).sum()).unwrap_or(0)
    }

    /// Sends the sync: its pages, its image, then SyncDone. Returns the
    /// bytes of pages and metadata sent.
    pub(crate) fn send(self, ch: &mut Channel, seq: u64) -> ferry_migrate::Result<u64> {
        let SyncBuffer { pages, meta, host_pids, .. } = self;
        let pages = pages.into_inner().map_err(|_| {
            ferry_migrate::MigrateError::Invalid("sync buffer: a copying thread panicked".into())
        })?;
        let meta = meta.ok_or_else(|| {
            ferry_migrate::MigrateError::Invalid(format!("sync {seq} has no image"))
        })?;
        let mut bytes = meta.len() as u64;
        // Half the page batches, and at least one when there are any.
        let half = pages.len().div_ceil(2);
        if half == 0 {
            crate::fault::at("replicate", || format!("sync {seq} half sent"));
        }
        for (i, (pid, ranges, data)) in pages.into_iter().enumerate() {
            bytes += data.len() as u64;
            protocol::send_with_data(ch, &Msg::Pages { pid, ranges }, &data)?;
            if i + 1 == half {
                crate::fault::at("replicate", || format!("sync {seq} half sent"));
            }
        }
        protocol::send(ch, &Msg::Image { meta, host_pids })?;
        protocol::send(ch, &Msg::SyncDone { seq })?;
        crate::fault::at("replicate", || format!("sync {seq} done sent"));
        Ok(bytes)
    }
}

impl PageSink for SyncBuffer {
    fn data_len(&self) -> u64 {
        self.data_len
    }

    fn write_runs_at(
        &self,
        pid: i32,
        data_offset: u64,
        ranges: &[(u64, usize)],
        data: &[u8],
    ) -> Result<Vec<PageRun>, ImageError> {
        let batch = (pid, ranges.iter().map(|&(a, n)| (a, n as u64)).collect(), data.to_vec());
        self.pages.lock().map_err(|_| poisoned())?.push(batch);
        // The link authenticates every message: no checksum of our own.
        ferry_image::sink::runs_at(data_offset, ranges, data, false)
    }

    fn set_data_len(&mut self, len: u64) -> Result<(), ImageError> {
        self.data_len = len;
        Ok(())
    }
}

impl ImageSink for SyncBuffer {
    fn finish_image(
        &mut self,
        inventory: &Inventory,
        tree: &TreeImage,
        incremental: Option<&Incremental>,
    ) -> Result<u64, ImageError> {
        let meta = ferry_image::encode_meta_with(inventory, tree, incremental)?;
        let len = meta.len() as u64;
        self.meta = Some(meta);
        Ok(len + self.page_bytes())
    }
}
