//! Where captured page data goes: the one interface the engine's page
//! copy writes through, so a checkpoint can fill an image directory's
//! pages.img or stream its pages straight to a peer with the same code.

use crate::error::ImageError;
use crate::model::{Incremental, Inventory, PageRun, TreeImage};

/// A destination for page data. Runs are placed at offsets of one data
/// area, handed out by the caller from [`PageSink::data_len`]; several
/// threads may write runs of different offsets at once.
pub trait PageSink: Sync {
    /// Bytes of page data placed so far: the offset the next run gets.
    fn data_len(&self) -> u64;
    /// Stores the runs `ranges` (address, length) of process `pid`, whose
    /// bytes are concatenated in `data`, at `data_offset`; returns them as
    /// page runs with their checksums.
    fn write_runs_at(
        &self,
        pid: i32,
        data_offset: u64,
        ranges: &[(u64, usize)],
        data: &[u8],
    ) -> Result<Vec<PageRun>, ImageError>;
    /// Checks what was stored against the runs' checksums, where stored
    /// bytes can be read back (a file); a stream has nothing to re-read.
    fn verify_written(&self, _runs: &[PageRun], _scratch: &mut [u8]) -> Result<(), ImageError> {
        Ok(())
    }
    /// The data area now ends at `len`.
    fn set_data_len(&mut self, len: u64) -> Result<(), ImageError>;
    /// A hint while the tree still runs: about `bytes` of page data will
    /// follow. A sink whose writes pay for new storage (a file on tmpfs)
    /// starts making room for them. Nothing by default.
    fn make_room_ahead(&mut self, _bytes: u64) {}
}

/// Where a whole image goes: its pages while the capture copies them
/// ([`PageSink`]), then its metadata, which completes it. A directory, an
/// in-memory store and a migration stream are sinks; capture does not
/// know which one it writes to.
pub trait ImageSink: PageSink {
    /// Stores the metadata (and, for an incremental image, which pages
    /// are its parent's). Once this returns the image is complete: its
    /// source can read it back. Returns the image's size in bytes.
    fn finish_image(
        &mut self,
        inventory: &Inventory,
        tree: &TreeImage,
        incremental: Option<&Incremental>,
    ) -> Result<u64, ImageError>;
}

/// The page runs of `ranges` ((address, length) pairs whose bytes follow
/// one another in `data`) stored from `data_offset` on; each with the
/// checksum of its bytes when `checksummed` (a channel that authenticates
/// every message needs none).
pub fn runs_at(
    data_offset: u64,
    ranges: &[(u64, usize)],
    data: &[u8],
    checksummed: bool,
) -> Result<Vec<PageRun>, ImageError> {
    let mut runs = Vec::with_capacity(ranges.len());
    let mut off = 0usize;
    for &(start, len) in ranges {
        let chunk = data
            .get(off..off + len)
            .ok_or_else(|| ImageError::Invalid("page ranges longer than their data".into()))?;
        runs.push(PageRun {
            start,
            pages: len as u64 / 4096,
            offset: data_offset + off as u64,
            checksum: if checksummed { crate::container::checksum(chunk) } else { 0 },
        });
        off += len;
    }
    Ok(runs)
}
