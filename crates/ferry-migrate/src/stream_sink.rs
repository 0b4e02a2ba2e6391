//! The page sink of a migration: every batch of pages the engine copies
//! goes out at once as one Pages message, so pages are sent as they are
//! read and no image file sits in between.

use crate::protocol::{self, Msg};
use ferry_image::{ImageError, ImageSink, Incremental, Inventory, PageRun, PageSink, TreeImage};
use ferry_transport::Channel;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

pub struct StreamSink<'a> {
    channel: Mutex<&'a mut Channel>,
    data_len: u64,
    sent: AtomicU64,
    /// The tree's PIDs as the source sees them, sent with the image.
    host_pids: Vec<i32>,
}

impl<'a> StreamSink<'a> {
    pub fn new(channel: &'a mut Channel) -> StreamSink<'a> {
        StreamSink {
            channel: Mutex::new(channel),
            data_len: 0,
            sent: AtomicU64::new(0),
            host_pids: Vec::new(),
        }
    }

    /// The tree's PIDs as ferry sees them, for the Image message.
    pub fn set_host_pids(&mut self, pids: Vec<i32>) {
        self.host_pids = pids;
    }

    /// Page bytes sent through this sink.
    pub fn page_bytes(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }
}

fn stream_error(e: impl std::fmt::Display) -> ImageError {
    ImageError::Invalid(format!("sending pages: {e}"))
}

impl PageSink for StreamSink<'_> {
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
        let msg = Msg::Pages { pid, ranges: ranges.iter().map(|&(a, n)| (a, n as u64)).collect() };
        let head = protocol::encode_header(&msg).map_err(stream_error)?;
        {
            let mut ch =
                self.channel.lock().map_err(|_| stream_error("a sending thread panicked"))?;
            ch.send_parts(&[&head, data]).map_err(stream_error)?;
        }
        self.sent.fetch_add(data.len() as u64, Ordering::Relaxed);
        // The channel authenticates every message; a second checksum over
        // the same bytes would only cost time.
        ferry_image::sink::runs_at(data_offset, ranges, data, false)
    }

    fn set_data_len(&mut self, len: u64) -> Result<(), ImageError> {
        self.data_len = len;
        Ok(())
    }
}

/// The metadata goes out as the Image message, which completes the
/// image at the destination.
impl ImageSink for StreamSink<'_> {
    fn finish_image(
        &mut self,
        inventory: &Inventory,
        tree: &TreeImage,
        incremental: Option<&Incremental>,
    ) -> Result<u64, ImageError> {
        let meta = ferry_image::encode_meta_with(inventory, tree, incremental)?;
        let len = meta.len() as u64;
        let msg = Msg::Image { meta, host_pids: std::mem::take(&mut self.host_pids) };
        let ch = self.channel.get_mut().map_err(|_| stream_error("a sending thread panicked"))?;
        protocol::send(ch, &msg).map_err(stream_error)?;
        Ok(len + self.page_bytes())
    }
}
