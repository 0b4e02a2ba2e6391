//! The destination's copy of the service's memory while it arrives: every
//! page sent, in whichever round, kept once under (source PID, address),
//! the latest copy winning. When the final image arrives its page runs
//! are looked up here, and restore copies from the store as from an
//! image's page data area.
//!
//! The store is an unnamed tmpfs file (O_TMPFILE in /dev/shm), so nothing
//! of the process's memory is ever left behind on disk: it is gone when
//! the store is dropped.

use crate::error::{MigrateError, Result};
use ferry_image::PageRun;
use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::{FileExt, OpenOptionsExt};

const PAGE: u64 = 4096;

pub struct PageStore {
    file: File,
    len: u64,
    /// (source PID, page address) to the page's offset in `file`.
    slots: HashMap<(i32, u64), u64>,
}

impl PageStore {
    pub fn new() -> Result<PageStore> {
        let dir = "/dev/shm";
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .mode(0o600)
            .custom_flags(libc::O_TMPFILE)
            .open(dir)
            .map_err(|e| MigrateError::Invalid(format!("creating the page store in {dir}: {e}")))?;
        Ok(PageStore { file, len: 0, slots: HashMap::new() })
    }

    /// Bytes of distinct pages held.
    pub fn bytes(&self) -> u64 {
        self.len
    }

    /// Stores the pages of `ranges` ((address, bytes), page-aligned) of
    /// process `pid`, whose bytes are concatenated in `data`.
    pub fn insert(&mut self, pid: i32, ranges: &[(u64, u64)], data: &[u8]) -> Result<()> {
        let mut total = 0u64;
        for &(addr, len) in ranges {
            if addr % PAGE != 0 || len % PAGE != 0 || len == 0 || addr.checked_add(len).is_none() {
                return Err(MigrateError::Protocol(format!("page range {addr:#x}+{len:#x} of pid {pid} is not page-aligned")));
            }
            total = total.checked_add(len).ok_or_else(|| MigrateError::Protocol("page ranges overflow".into()))?;
        }
        if total != data.len() as u64 {
            return Err(MigrateError::Protocol(format!("page ranges of pid {pid} hold {total} bytes, the message {}", data.len())));
        }
        let mut off = 0usize;
        for &(addr, len) in ranges {
            let pages = len / PAGE;
            // Consecutive pages with consecutive slots go in one write.
            let mut i = 0;
            while i < pages {
                let first = addr + i * PAGE;
                let slot = self.slot_for(pid, first);
                let mut n = 1;
                while i + n < pages {
                    let next = addr + (i + n) * PAGE;
                    let want = slot + n * PAGE;
                    match self.slots.get(&(pid, next)) {
                        Some(&s) if s == want => {}
                        None if want == self.len => {
                            self.slots.insert((pid, next), want);
                            self.len += PAGE;
                        }
                        _ => break,
                    }
                    n += 1;
                }
                let bytes = &data[off + (i * PAGE) as usize..off + ((i + n) * PAGE) as usize];
                self.file.write_all_at(bytes, slot).map_err(|e| MigrateError::Invalid(format!("writing the page store: {e}")))?;
                i += n;
            }
            off += len as usize;
        }
        Ok(())
    }

    fn slot_for(&mut self, pid: i32, addr: u64) -> u64 {
        if let Some(&s) = self.slots.get(&(pid, addr)) {
            return s;
        }
        let s = self.len;
        self.slots.insert((pid, addr), s);
        self.len += PAGE;
        s
    }

    /// The page runs of process `pid` covering `runs` ((address, pages)),
    /// pointing into the store. Checksums are not set: the stream that
    /// brought the pages is authenticated message by message.
    pub fn runs_for(&self, pid: i32, runs: &[(u64, u64)]) -> Result<Vec<PageRun>> {
        let mut out: Vec<PageRun> = Vec::new();
        for &(addr, pages) in runs {
            for i in 0..pages {
                let a = addr + i * PAGE;
                let slot = *self
                    .slots
                    .get(&(pid, a))
                    .ok_or_else(|| MigrateError::Protocol(format!("the image needs page {a:#x} of pid {pid}, which was never sent")))?;
                match out.last_mut() {
                    Some(r) if r.start + r.pages * PAGE == a && r.offset + r.pages * PAGE == slot => r.pages += 1,
                    _ => out.push(PageRun { start: a, pages: 1, offset: slot, checksum: 0 }),
                }
            }
        }
        Ok(out)
    }

    /// The store as one read-only page data area.
    pub fn map(&self) -> Result<ferry_sys::process::MappedFile> {
        ferry_sys::process::MappedFile::map(&self.file, 0, self.len as usize).map_err(|e| MigrateError::sys("mapping the page store", e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(b: u8) -> Vec<u8> {
        vec![b; PAGE as usize]
    }

    #[test]
    fn latest_round_wins_and_runs_coalesce() {
        let mut s = PageStore::new().unwrap();
        let mut d = page(1);
        d.extend(page(2));
        d.extend(page(3));
        s.insert(10, &[(0x10000, 3 * PAGE)], &d).unwrap();
        s.insert(10, &[(0x11000, PAGE)], &page(9)).unwrap();
        s.insert(11, &[(0x10000, PAGE)], &page(7)).unwrap();
        assert_eq!(s.bytes(), 4 * PAGE);
        let runs = s.runs_for(10, &[(0x10000, 3)]).unwrap();
        assert_eq!(runs.len(), 1);
        let m = s.map().unwrap();
        let area = m.bytes();
        let r = runs[0];
        let got = &area[r.offset as usize..(r.offset + 3 * PAGE) as usize];
        assert_eq!(got[0], 1);
        assert_eq!(got[PAGE as usize], 9);
        assert_eq!(got[2 * PAGE as usize], 3);
        let other = s.runs_for(11, &[(0x10000, 1)]).unwrap();
        assert_eq!(area[other[0].offset as usize], 7);
    }

    #[test]
    fn missing_and_malformed_pages_are_errors() {
        let mut s = PageStore::new().unwrap();
        s.insert(1, &[(0x1000, PAGE)], &page(1)).unwrap();
        assert!(s.runs_for(1, &[(0x1000, 2)]).is_err());
        assert!(s.runs_for(2, &[(0x1000, 1)]).is_err());
        assert!(s.insert(1, &[(0x1001, PAGE)], &page(1)).is_err());
        assert!(s.insert(1, &[(0x1000, 2 * PAGE)], &page(1)).is_err());
        assert!(s.insert(1, &[(u64::MAX - 4095, PAGE)], &page(1)).is_err());
    }
}
