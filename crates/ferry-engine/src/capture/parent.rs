//! Incremental checkpoints on disk (`ferry checkpoint --parent DIR`): a
//! page whose content the parent image already holds at the same address
//! is left to the parent instead of copied again.
//!
//! The parent's pages are compared by content with the frozen tree's, as
//! no dirty tracker survives from one `ferry checkpoint` run to the next;
//! a caller that kept one (pre-copy) answers the same hook from it.

use super::CaptureHooks;
use crate::error::{EngineError, Result};
use ferry_image::{ImageSource, LoadedImage, PageSpan, Vma};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

const PAGE: u64 = 4096;
/// Pages compared per read of the process's memory.
const BATCH_PAGES: u64 = 256;

/// A parent image, loaded (its own chain resolved) and verified.
pub struct ParentImage {
    dir: PathBuf,
    image: LoadedImage,
}

impl ParentImage {
    pub fn open(dir: &Path) -> Result<ParentImage> {
        let image = ferry_image::DirSource::new(dir).load(crate::worker_threads())?;
        if image.tree.own_pid_namespace {
            return Err(EngineError::unsupported(
                image.inventory.source_pid,
                format!("parent image {}", dir.display()),
                "an incremental checkpoint of a tree in its own PID namespace is not supported",
            ));
        }
        Ok(ParentImage { dir: dir.to_path_buf(), image })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The pages of process `pid` whose bytes in the parent are what the
    /// process holds now, as sorted runs.
    fn unchanged_pages(&self, pid: i32) -> Result<Vec<PageSpan>> {
        let Some(proc_) = self.image.tree.processes.iter().find(|p| p.pid == pid) else {
            return Ok(Vec::new());
        };
        let data = self.image.pages.bytes();
        // Read through /proc/PID/mem: process_vm_readv pins pages, and
        // pinning an anonymous page shared copy-on-write with another
        // process of the tree gives this one its own copy (the sharing
        // the capture must see, and the memory the service must not pay).
        let path = format!("/proc/{pid}/mem");
        let mem = std::fs::File::open(&path).map_err(|e| EngineError::io(&path, e))?;
        let mut same = Vec::new();
        let mut now = vec![0u8; (BATCH_PAGES * PAGE) as usize];
        for run in &proc_.page_runs {
            let mut done = 0;
            while done < run.pages {
                let n = (run.pages - done).min(BATCH_PAGES);
                let addr = run.start + done * PAGE;
                let off = (run.offset + done * PAGE) as usize;
                let then = &data[off..off + (n * PAGE) as usize];
                let buf = &mut now[..(n * PAGE) as usize];
                for k in equal_pages(&mem, addr, then, buf) {
                    push_page(&mut same, addr + k * PAGE);
                }
                done += n;
            }
        }
        Ok(same)
    }
}

/// Indices of the pages at `addr` whose current bytes (in `mem`, the
/// process's /proc/PID/mem) equal `then`'s. A range the process no
/// longer maps is read page by page; a page that cannot be read is not
/// equal.
fn equal_pages(mem: &std::fs::File, addr: u64, then: &[u8], buf: &mut [u8]) -> Vec<u64> {
    use std::os::unix::fs::FileExt;
    let pages = then.len() as u64 / PAGE;
    let readable: Vec<bool> = if mem.read_exact_at(buf, addr).is_ok() {
        vec![true; pages as usize]
    } else {
        (0..pages)
            .map(|k| {
                let page = &mut buf[(k * PAGE) as usize..((k + 1) * PAGE) as usize];
                mem.read_exact_at(page, addr + k * PAGE).is_ok()
            })
            .collect()
    };
    (0..pages)
        .filter(|&k| {
            let (s, e) = ((k * PAGE) as usize, ((k + 1) * PAGE) as usize);
            readable[k as usize] && then[s..e] == buf[s..e]
        })
        .collect()
}

fn push_page(runs: &mut Vec<PageSpan>, addr: u64) {
    match runs.last_mut() {
        Some(r) if r.end() == addr => r.pages += 1,
        _ => runs.push(PageSpan::new(addr, 1)),
    }
}

impl CaptureHooks for ParentImage {
    fn held_pages(&mut self, procs: &[(i32, &[Vma])]) -> Result<HashMap<i32, Vec<PageSpan>>> {
        let mut out = HashMap::new();
        for &(pid, _) in procs {
            out.insert(pid, self.unchanged_pages(pid)?);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adjacent_pages_join_one_run() {
        let mut runs = Vec::new();
        for a in [0x1000, 0x2000, 0x3000, 0x5000] {
            push_page(&mut runs, a);
        }
        assert_eq!(runs, vec![PageSpan::new(0x1000, 3), PageSpan::new(0x5000, 1)]);
    }
}
