//! Reading an image directory, alone or as the last of a chain of
//! incremental images: each incremental image names its parent with a
//! `parent` link and the parent's id (the checksum of its meta.img), and
//! holds only the pages written since that parent. Loading resolves every
//! page the chain leaves to a parent into one complete image.

use crate::container;
use crate::dir::{ImageDir, PAGES_DATA_OFFSET, PARENT_LINK};
use crate::error::ImageError;
use crate::model::{Incremental, Inventory, PageRun, PageSpan, TreeImage};
use crate::source::{ImageSource, LoadedImage, PageArea};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Longer chains are refused: a loop of links, or a chain nobody meant.
pub const MAX_CHAIN: usize = 64;
/// Resolved parent pages are stored in runs of at most this many pages,
/// the size capture cuts its runs to.
const RUN_PAGES: u64 = 1024;
const PAGE: u64 = 4096;

/// An image directory, the newest image of its chain.
pub struct DirSource {
    path: PathBuf,
}

impl DirSource {
    pub fn new(path: impl Into<PathBuf>) -> DirSource {
        DirSource { path: path.into() }
    }
}

/// One image of a chain, read and verified.
pub struct Layer {
    pub dir: PathBuf,
    pub inventory: Inventory,
    pub tree: TreeImage,
    pub incremental: Option<Incremental>,
    pub pages: Box<dyn PageArea>,
}

impl ImageSource for DirSource {
    fn load(&mut self, threads: usize) -> Result<LoadedImage, ImageError> {
        let mut layers = vec![read_layer(&self.path, threads)?];
        while let Some(inc) = layers.last().and_then(|l| l.incremental.as_ref()) {
            let parent_id = inc.parent_id;
            let child = layers.last().map_or_else(PathBuf::new, |l| l.dir.clone());
            if layers.len() >= MAX_CHAIN {
                return Err(ImageError::Invalid(format!(
                    "image {}: its chain of parents is longer than {MAX_CHAIN} images",
                    self.path.display()
                )));
            }
            let parent = parent_of(&child, parent_id)?;
            let found = ImageDir::new(&parent).image_id()?;
            if found != parent_id {
                return Err(ImageError::ParentChanged { image: child, parent });
            }
            layers.push(read_layer(&parent, threads)?);
        }
        let mut layers = layers.into_iter();
        let newest = layers.next().ok_or_else(|| ImageError::Invalid("empty chain".into()))?;
        let parents: Vec<Layer> = layers.collect();
        if parents.is_empty() {
            let Layer { inventory, tree, pages, .. } = newest;
            return Ok(LoadedImage { inventory, tree, pages });
        }
        let (inventory, tree, pages) = flatten(newest, &parents)?;
        crate::validate::validate(&inventory, &tree)?;
        crate::validate::validate_unix_in_flight_files(&tree)?;
        Ok(LoadedImage { inventory, tree, pages: Box::new(pages) })
    }

    fn describe(&self) -> String {
        format!("image directory {}", self.path.display())
    }
}

fn parent_of(child: &Path, parent_id: u64) -> Result<PathBuf, ImageError> {
    let link = child.join(PARENT_LINK);
    match std::fs::read_link(&link) {
        Ok(p) => Ok(child.join(p)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Err(ImageError::NeedsParent { parent_id })
        }
        Err(e) => Err(ImageError::io(link, e)),
    }
}

/// Reads one image directory as hostile input: ownership and modes,
/// metadata decoded and validated, pages.img's size, every run's checksum.
pub fn read_layer(dir: &Path, threads: usize) -> Result<Layer, ImageError> {
    let d = ImageDir::new(dir);
    d.check_private()?;
    let meta = bytes::Bytes::from_owner(d.map_meta()?);
    let (inventory, tree, incremental) = container::decode_meta_shared(&meta)?;
    let file = d.check_pages_file(&inventory)?;
    let len = usize::try_from(inventory.pages_bytes)
        .map_err(|_| ImageError::Invalid("page data larger than the address space".into()))?;
    let pages = ferry_sys::process::MappedFile::map(&file, PAGES_DATA_OFFSET, len)
        .map_err(|e| ImageError::io(d.pages_path(), std::io::Error::from_raw_os_error(e.errno)))?;
    let runs: Vec<PageRun> =
        tree.processes.iter().flat_map(|p| p.page_runs.iter().copied()).collect();
    ImageDir::verify_runs_parallel(&runs, pages.bytes(), threads)?;
    Ok(Layer { dir: dir.to_path_buf(), inventory, tree, incremental, pages: Box::new(pages) })
}

/// Where one process's pages are, in one layer: its runs, and the pages
/// it leaves to its own parent, each as sorted (start, end, offset).
#[derive(Default)]
struct LayerIndex {
    runs: HashMap<i32, Vec<(u64, u64, u64)>>,
    in_parent: HashMap<i32, Vec<(u64, u64)>>,
}

impl LayerIndex {
    fn of(layer: &Layer) -> LayerIndex {
        let mut ix = LayerIndex::default();
        for p in &layer.tree.processes {
            let mut runs: Vec<(u64, u64, u64)> =
                p.page_runs.iter().map(|r| (r.start, r.start + r.pages * PAGE, r.offset)).collect();
            runs.sort_unstable();
            ix.runs.insert(p.pid, runs);
        }
        for pp in layer.incremental.iter().flat_map(|i| i.parent_pages.iter()) {
            let mut ranges: Vec<(u64, u64)> =
                pp.ranges.iter().map(|r| (r.start, r.end())).collect();
            ranges.sort_unstable();
            ix.in_parent.insert(pp.pid, ranges);
        }
        ix
    }

    fn covering<T: Copy>(list: &[(u64, u64, T)], addr: u64) -> Option<(u64, u64, T)> {
        let i = list.partition_point(|&(start, ..)| start <= addr);
        list[..i].last().copied().filter(|&(_, end, _)| addr < end)
    }

    fn run_at(&self, pid: i32, addr: u64) -> Option<u64> {
        let runs = self.runs.get(&pid)?;
        Self::covering(runs, addr).map(|(start, _, offset)| offset + (addr - start))
    }

    fn leaves_to_parent(&self, pid: i32, addr: u64) -> bool {
        let Some(ranges) = self.in_parent.get(&pid) else { return false };
        let i = ranges.partition_point(|&(start, _)| start <= addr);
        ranges[..i].last().is_some_and(|&(_, end)| addr < end)
    }
}

/// The bytes of page `addr` of process `pid`, from the nearest parent
/// that holds it.
fn resolve<'a>(
    parents: &'a [Layer],
    index: &[LayerIndex],
    pid: i32,
    addr: u64,
) -> Result<&'a [u8], ImageError> {
    for (layer, ix) in parents.iter().zip(index) {
        if let Some(off) = ix.run_at(pid, addr) {
            let off = off as usize;
            return layer.pages.bytes().get(off..off + PAGE as usize).ok_or_else(|| {
                ImageError::Truncated(format!(
                    "image {}: page run past its data",
                    layer.dir.display()
                ))
            });
        }
        if !ix.leaves_to_parent(pid, addr) {
            return Err(ImageError::Invalid(format!(
                "image {}: pid {pid}'s page at {addr:#x} is left to this parent, which does not hold it",
                layer.dir.display()
            )));
        }
    }
    Err(ImageError::Invalid(format!(
        "pid {pid}'s page at {addr:#x} is left to a parent, and no image of the chain holds it"
    )))
}

/// The newest image made complete: its own pages, then every page it
/// leaves to a parent, copied from the nearest parent that holds it and
/// listed as runs of its own.
pub fn flatten(
    newest: Layer,
    parents: &[Layer],
) -> Result<(Inventory, TreeImage, Vec<u8>), ImageError> {
    let Layer { mut inventory, mut tree, incremental, pages, .. } = newest;
    let index: Vec<LayerIndex> = parents.iter().map(LayerIndex::of).collect();
    let mut data = pages.bytes().to_vec();
    for pp in incremental.iter().flat_map(|i| i.parent_pages.iter()) {
        let proc_ = tree.processes.iter_mut().find(|p| p.pid == pp.pid).ok_or_else(|| {
            ImageError::Invalid(format!("parent pages for pid {}, not in the tree", pp.pid))
        })?;
        for &PageSpan { start, pages: count } in &pp.ranges {
            let mut done = 0;
            while done < count {
                let n = (count - done).min(RUN_PAGES);
                let run_start = start + done * PAGE;
                let offset = data.len() as u64;
                for k in 0..n {
                    data.extend_from_slice(resolve(parents, &index, pp.pid, run_start + k * PAGE)?);
                }
                let checksum = container::checksum(&data[offset as usize..]);
                proc_.page_runs.push(PageRun { start: run_start, pages: n, offset, checksum });
                done += n;
            }
        }
        proc_.page_runs.sort_unstable_by_key(|r| r.start);
    }
    inventory.pages_bytes = data.len() as u64;
    Ok((inventory, tree, data))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ParentPages, ProcessImage};

    fn layer(pid: i32, runs: &[(u64, &[u8])], in_parent: &[(u64, u64)]) -> Layer {
        let mut data = Vec::new();
        let mut page_runs = Vec::new();
        for &(start, fill) in runs {
            let offset = data.len() as u64;
            for &b in fill {
                data.extend(std::iter::repeat_n(b, PAGE as usize));
            }
            let pages = fill.len() as u64;
            let checksum = container::checksum(&data[offset as usize..]);
            page_runs.push(PageRun { start, pages, offset, checksum });
        }
        let tree = TreeImage {
            processes: vec![ProcessImage { pid, page_runs, ..Default::default() }],
            ..Default::default()
        };
        let incremental = (!in_parent.is_empty()).then(|| Incremental {
            parent_id: 1,
            parent_pages: vec![ParentPages {
                pid,
                ranges: in_parent.iter().map(|&(s, n)| PageSpan::new(s, n)).collect(),
            }],
        });
        Layer {
            dir: PathBuf::from(format!("/img/{}", runs.len())),
            inventory: Inventory::default(),
            tree,
            incremental,
            pages: Box::new(data),
        }
    }

    fn page_of(tree: &TreeImage, data: &[u8], addr: u64) -> Option<u8> {
        let r = tree.processes[0]
            .page_runs
            .iter()
            .find(|r| r.start <= addr && addr < r.start + r.pages * PAGE)?;
        Some(data[(r.offset + addr - r.start) as usize])
    }

    #[test]
    fn pages_come_from_the_nearest_parent_that_holds_them() {
        // Grandparent holds pages A..A+3 as 1,2,3; parent rewrote A+1 (9)
        // and leaves A and A+2 to the grandparent; the newest rewrote A+2
        // (7) and leaves A and A+1 to the parent.
        let a = 0x10000;
        let grand = layer(5, &[(a, &[1, 2, 3])], &[]);
        let parent = layer(5, &[(a + PAGE, &[9])], &[(a, 1), (a + 2 * PAGE, 1)]);
        let newest = layer(5, &[(a + 2 * PAGE, &[7])], &[(a, 2)]);
        let (inv, tree, data) = flatten(newest, &[parent, grand]).expect("flatten");
        assert_eq!(inv.pages_bytes, data.len() as u64);
        assert_eq!(page_of(&tree, &data, a), Some(1));
        assert_eq!(page_of(&tree, &data, a + PAGE), Some(9));
        assert_eq!(page_of(&tree, &data, a + 2 * PAGE), Some(7));
        for r in &tree.processes[0].page_runs {
            let bytes = &data[r.offset as usize..(r.offset + r.pages * PAGE) as usize];
            assert_eq!(container::checksum(bytes), r.checksum);
        }
    }

    #[test]
    fn a_page_no_parent_holds_is_refused() {
        let a = 0x10000;
        let parent = layer(5, &[(a, &[1])], &[]);
        let newest = layer(5, &[], &[(a + PAGE, 1)]);
        let err = flatten(newest, &[parent]).expect_err("must refuse");
        assert!(err.to_string().contains("does not hold it"), "{err}");
    }

    #[test]
    fn a_page_left_past_the_oldest_image_is_refused() {
        let a = 0x10000;
        let parent = layer(5, &[], &[(a, 1)]);
        let newest = layer(5, &[], &[(a, 1)]);
        let err = flatten(newest, &[parent]).expect_err("must refuse");
        assert!(err.to_string().contains("no image of the chain"), "{err}");
    }
}
