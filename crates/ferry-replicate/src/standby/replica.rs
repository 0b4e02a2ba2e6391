//! The standby's copy of the service: the last complete sync (its image
//! and every page it needs, in the page store), and the sync on its way.
//!
//! A sync's pages and image are staged in memory as they arrive and
//! applied only once its SyncDone came and the whole of it checked out:
//! the image decodes and validates, every page it needs is held or
//! staged, and the store has room for the new ones. A sync that stops
//! half way (the primary died, the link broke) leaves the copy at the
//! previous sync, whole.

use crate::error::{ReplicateError, Result};
use ferry_migrate::destination::ImageReceived;
use ferry_migrate::page_store::PageStore;
use std::collections::HashSet;

const PAGE: u64 = 4096;

/// Pages as they arrived: (pid, ranges (address, bytes), data).
type Staged = (i32, Vec<(u64, u64)>, Vec<u8>);

pub(crate) struct Replica {
    pub store: PageStore,
    /// The last complete sync, and its number (0: none yet).
    pub image: Option<ImageReceived>,
    pub seq: u64,
    staged_pages: Vec<Staged>,
    staged_image: Option<ImageReceived>,
    /// Bytes of the last sync applied.
    pub last_sync_bytes: u64,
}

impl Replica {
    pub(crate) fn new() -> Result<Replica> {
        Ok(Replica {
            store: PageStore::new()?,
            image: None,
            seq: 0,
            staged_pages: Vec::new(),
            staged_image: None,
            last_sync_bytes: 0,
        })
    }

    pub(crate) fn stage_pages(
        &mut self,
        pid: i32,
        ranges: Vec<(u64, u64)>,
        data: &[u8],
    ) -> Result<()> {
        let total: u64 = ranges.iter().map(|r| r.1).sum();
        if ranges.iter().any(|&(a, n)| a % PAGE != 0 || n % PAGE != 0 || a.checked_add(n).is_none())
            || total != data.len() as u64
        {
            return Err(ReplicateError::Protocol(format!(
                "pages of pid {pid}: ranges of {total} bytes that are not page-aligned or do not match the {} bytes sent",
                data.len()
            )));
        }
        self.staged_pages.push((pid, ranges, data.to_vec()));
        Ok(())
    }

    pub(crate) fn stage_image(&mut self, meta: Vec<u8>, host_pids: Vec<i32>) {
        self.staged_image = Some(ImageReceived { meta, host_pids });
    }

    /// A pre-copy round before the first sync: there is no consistent
    /// copy yet to protect, so its pages go straight to the store.
    pub(crate) fn store_round(&mut self) -> Result<()> {
        self.apply_staged_pages(None)
    }

    /// Sync `seq` is complete: checked whole, then applied.
    pub(crate) fn commit(&mut self, seq: u64) -> Result<()> {
        if seq != self.seq + 1 {
            return Err(ReplicateError::Protocol(format!(
                "sync {seq} arrived after sync {}",
                self.seq
            )));
        }
        let image = self.staged_image.take().ok_or_else(|| {
            ReplicateError::Protocol(format!("sync {seq} ended without its image"))
        })?;
        self.check_whole(&image)?;
        let bytes = image.meta.len() as u64
            + self.staged_pages.iter().map(|(_, _, d)| d.len() as u64).sum::<u64>();
        self.apply_staged_pages(Some(seq))?;
        self.image = Some(image);
        self.seq = seq;
        self.last_sync_bytes = bytes;
        Ok(())
    }

    /// The image decodes and validates like any image, and names only
    /// pages held or staged.
    fn check_whole(&self, image: &ImageReceived) -> Result<()> {
        let (_inv, tree, incremental) = ferry_image::decode_meta_full(&image.meta)?;
        if image.host_pids.len() != tree.processes.len() {
            return Err(ReplicateError::Protocol(format!(
                "{} PIDs for the {} processes of the image",
                image.host_pids.len(),
                tree.processes.len()
            )));
        }
        let staged: HashSet<(i32, u64)> = self.staged_page_keys().collect();
        let parents = incremental.map(|i| i.parent_pages).unwrap_or_default();
        for (p, &host) in tree.processes.iter().zip(&image.host_pids) {
            let mut runs: Vec<(u64, u64)> =
                p.page_runs.iter().map(|r| (r.start, r.pages)).collect();
            if let Some(pp) = parents.iter().find(|pp| pp.pid == p.pid) {
                runs.extend(pp.ranges.iter().map(|r| (r.start, r.pages)));
            }
            if let Some(a) = self.store.first_missing(host, &runs, &staged) {
                return Err(ReplicateError::Protocol(format!(
                    "the image needs page {a:#x} of pid {host}, which no sync sent"
                )));
            }
        }
        Ok(())
    }

    fn staged_page_keys(&self) -> impl Iterator<Item = (i32, u64)> + '_ {
        self.staged_pages.iter().flat_map(|(pid, ranges, _)| {
            ranges.iter().flat_map(move |&(a, n)| (0..n / PAGE).map(move |i| (*pid, a + i * PAGE)))
        })
    }

    /// Room first, so that the writes themselves cannot fail for space.
    /// `seq`: the sync applied (None for a pre-copy round).
    fn apply_staged_pages(&mut self, seq: Option<u64>) -> Result<()> {
        let keys: Vec<(i32, u64)> = self.staged_page_keys().collect();
        self.store.make_room_for(keys.iter())?;
        let staged = std::mem::take(&mut self.staged_pages);
        let half = staged.len().div_ceil(2);
        for (i, (pid, ranges, data)) in staged.into_iter().enumerate() {
            self.store.insert(pid, &ranges, &data)?;
            if let (Some(seq), true) = (seq, i + 1 == half) {
                crate::fault::at("standby", || format!("sync {seq} half applied"));
            }
        }
        Ok(())
    }

    /// What was staged of a sync that will not complete.
    pub(crate) fn discard_staged(&mut self) {
        self.staged_pages.clear();
        self.staged_image = None;
    }
}
