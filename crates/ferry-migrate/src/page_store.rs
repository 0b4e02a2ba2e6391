//! The destination's copy of the service's memory while it arrives: every
//! page sent, in whichever round, kept once under (source PID, address),
//! the latest copy winning. When the final image arrives its page runs
//! are looked up here, and restore copies from the store as from an
//! image's page data area.
//!
//! The store is an unnamed tmpfs file (O_TMPFILE in /dev/shm), so nothing
//! of the process's memory is ever left behind on disk: it is gone when
//! the store is dropped.
//!
//! The root process's private anonymous pages are placed instead at
//! their own addresses in this process (ferry_sys::placed), where the
//! worker's own mappings leave room: the restored root then inherits them
//! over fork, like a child its parent's, and no page is copied during the
//! pause. Everything else (other processes, pages that collide with the
//! worker's mappings, mappings with special flags) comes from the file.

use crate::error::{MigrateError, Result};
use ferry_image::{InheritedVma, PageRun, Vma, VmaBacking};
use ferry_sys::placed::{InheritedRegions, PlacedRegion};
use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::os::unix::fs::{FileExt, OpenOptionsExt};

const PAGE: u64 = 4096;

/// (address, pages), sorted.
type Runs = Vec<(u64, u64)>;

pub struct PageStore {
    file: File,
    len: u64,
    /// (source PID, page address) to the page's offset in `file`.
    slots: HashMap<(i32, u64), u64>,
    /// The source PID whose pages are placed at their addresses.
    place_for: Option<i32>,
    /// Placed regions by start address; a page in one is newer than any
    /// copy of it in `slots`.
    placed: BTreeMap<u64, PlacedRegion>,
    placed_bytes: u64,
    /// Addresses kept free below our own stack, so that it can still grow.
    stack_reserve: (u64, u64),
}

/// The root's memory as the restore takes it: mappings inherited from
/// the placed regions, and the page runs still to be written.
pub struct RootPages {
    pub inherited: Vec<InheritedVma>,
    pub runs: Vec<PageRun>,
    pub placed_bytes: u64,
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
        Ok(PageStore {
            file,
            len: 0,
            slots: HashMap::new(),
            place_for: None,
            placed: BTreeMap::new(),
            placed_bytes: 0,
            stack_reserve: own_stack_reserve(),
        })
    }

    /// Bytes of distinct pages held in the file.
    pub fn bytes(&self) -> u64 {
        self.len
    }

    /// Bytes written into placed regions (a page written twice counts
    /// twice).
    pub fn placed_bytes(&self) -> u64 {
        self.placed_bytes
    }

    /// Places the pages of process `pid` (the root) at their addresses.
    pub fn place_pages_of(&mut self, pid: i32) {
        self.place_for = Some(pid);
    }

    /// Reserves one placed region per mapping of the root (see
    /// Msg::Layout), so that each becomes one mapping again; a mapping
    /// where something of ours is in the way is left to the file.
    pub fn reserve(&mut self, pid: i32, mappings: &[(u64, u64)]) {
        if self.place_for != Some(pid) {
            return;
        }
        for &(start, end) in mappings {
            let (rs, re) = self.stack_reserve;
            let free = start < end
                && start % PAGE == 0
                && end % PAGE == 0
                && !(start < re && end > rs)
                && self.placed.range(..end).next_back().is_none_or(|(_, r)| r.end() <= start);
            if !free {
                continue;
            }
            if let Ok(r) = PlacedRegion::map(start, (end - start) as usize) {
                self.placed.insert(start, r);
            }
        }
    }

    /// The placed region holding `addr`, if any.
    fn region_at(&self, addr: u64) -> Option<&PlacedRegion> {
        self.placed.range(..=addr).next_back().map(|(_, r)| r).filter(|r| r.end() > addr)
    }

    /// Copies `bytes` (at address `addr`) into the placed regions that
    /// hold it; returns the sub-ranges outside every region, as (offset in
    /// `bytes`, length), for the file.
    fn place(&mut self, addr: u64, bytes: &[u8]) -> Result<Vec<(usize, usize)>> {
        let end = addr + bytes.len() as u64;
        let mut unplaced = Vec::new();
        let mut a = addr;
        while a < end {
            if let Some((&start, region)) =
                self.placed.range_mut(..=a).next_back().filter(|(_, r)| r.end() > a)
            {
                let upto = region.end().min(end);
                let off = (a - addr) as usize;
                region
                    .write((a - start) as usize, &bytes[off..off + (upto - a) as usize])
                    .map_err(|e| MigrateError::sys(format!("placing pages at {a:#x}"), e))?;
                self.placed_bytes += upto - a;
                a = upto;
                continue;
            }
            let next = self.placed.range(a..).next().map_or(end, |(&s, _)| s.min(end));
            unplaced.push(((a - addr) as usize, (next - a) as usize));
            a = next;
        }
        Ok(unplaced)
    }

    /// Stores the pages of `ranges` ((address, bytes), page-aligned) of
    /// process `pid`, whose bytes are concatenated in `data`.
    pub fn insert(&mut self, pid: i32, ranges: &[(u64, u64)], data: &[u8]) -> Result<()> {
        let mut total = 0u64;
        for &(addr, len) in ranges {
            if addr % PAGE != 0 || len % PAGE != 0 || len == 0 || addr.checked_add(len).is_none() {
                return Err(MigrateError::Protocol(format!(
                    "page range {addr:#x}+{len:#x} of pid {pid} is not page-aligned"
                )));
            }
            total = total
                .checked_add(len)
                .ok_or_else(|| MigrateError::Protocol("page ranges overflow".into()))?;
        }
        if total != data.len() as u64 {
            return Err(MigrateError::Protocol(format!(
                "page ranges of pid {pid} hold {total} bytes, the message {}",
                data.len()
            )));
        }
        if self.place_for == Some(pid) {
            let mut off = 0usize;
            for &(addr, len) in ranges {
                let bytes = &data[off..off + len as usize];
                for (o, l) in self.place(addr, bytes)? {
                    self.insert_slots(pid, addr + o as u64, &bytes[o..o + l])?;
                }
                off += len as usize;
            }
            return Ok(());
        }
        let mut off = 0usize;
        for &(addr, len) in ranges {
            self.insert_slots(pid, addr, &data[off..off + len as usize])?;
            off += len as usize;
        }
        Ok(())
    }

    /// Stores one page-aligned range in the file.
    fn insert_slots(&mut self, pid: i32, addr: u64, data: &[u8]) -> Result<()> {
        let pages = data.len() as u64 / PAGE;
        {
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
                let bytes = &data[(i * PAGE) as usize..((i + n) * PAGE) as usize];
                self.file
                    .write_all_at(bytes, slot)
                    .map_err(|e| MigrateError::Invalid(format!("writing the page store: {e}")))?;
                i += n;
            }
        }
        Ok(())
    }

    /// The first page of `runs` ((address, pages)) of process `pid` that
    /// is neither held here nor among `staged` ((pid, page address)).
    pub fn first_missing(
        &self,
        pid: i32,
        runs: &[(u64, u64)],
        staged: &std::collections::HashSet<(i32, u64)>,
    ) -> Option<u64> {
        runs.iter()
            .flat_map(|&(addr, pages)| (0..pages).map(move |i| addr + i * PAGE))
            .find(|&a| !self.slots.contains_key(&(pid, a)) && !staged.contains(&(pid, a)))
    }

    /// Pages among `pages` ((pid, page address)) the store does not hold
    /// yet, made room for now: storing them afterwards cannot fail for
    /// lack of space, so a standby applies a sync whole or not at all.
    pub fn make_room_for<'a>(&mut self, pages: impl Iterator<Item = &'a (i32, u64)>) -> Result<()> {
        let new = pages.filter(|k| !self.slots.contains_key(k)).count() as u64;
        if new == 0 {
            return Ok(());
        }
        ferry_sys::fd::allocate(std::os::fd::AsFd::as_fd(&self.file), self.len, new * PAGE).map_err(
            |e| MigrateError::sys(format!("making room for {new} pages in the page store"), e),
        )
    }

    /// Settles the root's memory once its final image is known: `runs`
    /// ((address, pages), sorted) are every page it has. A private
    /// anonymous mapping without special flags whose pages are placed is
    /// filled up to its exact bounds with placed memory and inherited;
    /// every other page is read from the file (placed pages of other
    /// mappings are copied there first).
    pub fn settle_root(
        &mut self,
        pid: i32,
        vmas: &[Vma],
        runs: &[(u64, u64)],
        brk: (u64, u64),
    ) -> Result<RootPages> {
        let mut inherited = Vec::new();
        let mut from_file: Vec<(u64, u64)> = Vec::new();
        let mut page = vec![0u8; PAGE as usize];
        for v in vmas {
            let inside: Vec<(u64, u64)> = runs
                .iter()
                .filter_map(|&(a, n)| {
                    let (s, e) = (a.max(v.start), (a + n * PAGE).min(v.end));
                    (s < e).then_some((s, (e - s) / PAGE))
                })
                .collect();
            if inside.is_empty() {
                continue;
            }
            // One placed region must hold the whole mapping: two regions
            // would come back as two mappings (their anon_vmas differ, so
            // the kernel never merges them). The heap stays a brk area.
            let one_region = self.region_at(v.start).is_some_and(|r| r.end() >= v.end);
            let heap = v.start < brk.1.max(brk.0 + 1) && v.end > brk.0;
            let eligible = matches!(v.backing, VmaBacking::Anonymous)
                && !v.shared
                && v.flags & !ferry_image::vmflag::MAYWRITE == 0
                && one_region
                && !heap;
            let (placed_runs, file_runs) = self.by_place(&inside);
            if eligible && !placed_runs.is_empty() {
                inherited.push(InheritedVma {
                    start: v.start,
                    end: v.end,
                    shared_pages: placed_runs
                        .iter()
                        .map(|&(s, n)| ferry_image::PageSpan::new(s, n))
                        .collect(),
                });
                from_file.extend(file_runs);
                continue;
            }
            // Not inherited: its placed pages go to the file.
            self.copy_placed_to_file(pid, &placed_runs, &mut page)?;
            from_file.extend(placed_runs);
            from_file.extend(file_runs);
        }
        from_file.sort_unstable();
        let runs = self.runs_for(pid, &from_file)?;
        let placed_bytes =
            inherited.iter().flat_map(|v| v.shared_pages.iter()).map(|r| r.pages * PAGE).sum();
        Ok(RootPages { inherited, runs, placed_bytes })
    }

    /// `runs` split by where their pages are: (placed, in the file).
    fn by_place(&self, runs: &[(u64, u64)]) -> (Runs, Runs) {
        let mut placed_runs: Vec<(u64, u64)> = Vec::new();
        let mut file_runs: Vec<(u64, u64)> = Vec::new();
        for &(a, n) in runs {
            for i in 0..n {
                let p = a + i * PAGE;
                let list =
                    if self.region_at(p).is_some() { &mut placed_runs } else { &mut file_runs };
                match list.last_mut() {
                    Some((s, k)) if *s + *k * PAGE == p => *k += 1,
                    _ => list.push((p, 1)),
                }
            }
        }
        (placed_runs, file_runs)
    }

    /// Copies placed pages into the file, for a mapping that does not
    /// inherit them; `page` is a page-sized buffer.
    fn copy_placed_to_file(
        &mut self,
        pid: i32,
        placed_runs: &[(u64, u64)],
        page: &mut [u8],
    ) -> Result<()> {
        for &(a, n) in placed_runs {
            for i in 0..n {
                let p = a + i * PAGE;
                if let Some(r) = self.region_at(p) {
                    r.read((p - r.start()) as usize, page)
                        .map_err(|e| MigrateError::sys(format!("reading placed page {p:#x}"), e))?;
                }
                self.insert_slots(pid, p, page)?;
            }
        }
        Ok(())
    }

    /// The placed regions, for the restore's helper to drop its copies
    /// once the root has inherited them.
    pub fn placed_regions(&self) -> InheritedRegions {
        let regions: Vec<&PlacedRegion> = self.placed.values().collect();
        PlacedRegion::inherited(&regions)
    }

    /// Takes the placed regions out of the store (after the restore, whose
    /// root has its own copies now), for the caller to drop.
    pub fn take_placed(&mut self) -> Vec<PlacedRegion> {
        std::mem::take(&mut self.placed).into_values().collect()
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
                let slot = *self.slots.get(&(pid, a)).ok_or_else(|| {
                    MigrateError::Protocol(format!(
                        "the image needs page {a:#x} of pid {pid}, which was never sent"
                    ))
                })?;
                match out.last_mut() {
                    Some(r)
                        if r.start + r.pages * PAGE == a && r.offset + r.pages * PAGE == slot =>
                    {
                        r.pages += 1
                    }
                    _ => out.push(PageRun { start: a, pages: 1, offset: slot, checksum: 0 }),
                }
            }
        }
        Ok(out)
    }

    /// The store as one read-only page data area.
    pub fn map(&self) -> Result<ferry_sys::process::MappedFile> {
        ferry_sys::process::MappedFile::map(&self.file, 0, self.len as usize)
            .map_err(|e| MigrateError::sys("mapping the page store", e))
    }
}

/// Our stack and the 256 MiB below it: a placed region there would stop
/// the stack from growing.
fn own_stack_reserve() -> (u64, u64) {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    for line in maps.lines().filter(|l| l.ends_with("[stack]")) {
        let range = line.split_whitespace().next().unwrap_or("");
        if let Some((s, e)) = range.split_once('-') {
            if let (Ok(s), Ok(e)) = (u64::from_str_radix(s, 16), u64::from_str_radix(e, 16)) {
                return (s.saturating_sub(256 << 20), e);
            }
        }
    }
    (0, 0)
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

    fn anon_vma(start: u64, end: u64) -> Vma {
        Vma {
            start,
            end,
            prot: 3,
            shared: false,
            flags: ferry_image::vmflag::MAYWRITE,
            pgoff: 0,
            backing: VmaBacking::Anonymous,
        }
    }

    #[test]
    fn root_pages_are_placed_and_their_mapping_inherited() {
        let mut s = PageStore::new().unwrap();
        s.place_pages_of(5);
        let base = 0x3a00_0000_0000u64;
        let mut d = page(4);
        d.extend(page(5));
        s.reserve(5, &[(base, base + 8 * PAGE)]);
        s.insert(5, &[(base + PAGE, 2 * PAGE)], &d).unwrap();
        s.insert(5, &[(base + 2 * PAGE, PAGE)], &page(6)).unwrap();
        assert_eq!(s.bytes(), 0, "placed pages use no file");
        let root = s
            .settle_root(5, &[anon_vma(base, base + 8 * PAGE)], &[(base + PAGE, 2)], (0, 0))
            .unwrap();
        assert_eq!(root.inherited.len(), 1);
        assert_eq!((root.inherited[0].start, root.inherited[0].end), (base, base + 8 * PAGE));
        assert_eq!(
            root.inherited[0].shared_pages,
            vec![ferry_image::PageSpan::new(base + PAGE, 2)]
        );
        assert!(root.runs.is_empty());
        let mut back = vec![0u8; PAGE as usize];
        s.region_at(base + 2 * PAGE)
            .unwrap()
            .read(
                (2 * PAGE - (s.region_at(base + 2 * PAGE).unwrap().start() - base)) as usize,
                &mut back,
            )
            .unwrap();
        assert_eq!(back[0], 6, "the latest copy of a page is the placed one");
        assert!(!s.placed_regions().is_empty());
    }

    #[test]
    fn a_mapping_split_over_two_regions_is_read_from_the_file() {
        let mut s = PageStore::new().unwrap();
        s.place_pages_of(5);
        let base = 0x3c00_0000_0000u64;
        s.reserve(5, &[(base, base + 2 * PAGE), (base + 4 * PAGE, base + 5 * PAGE)]);
        s.insert(5, &[(base, PAGE)], &page(1)).unwrap();
        s.insert(5, &[(base + 4 * PAGE, PAGE)], &page(2)).unwrap();
        let root = s
            .settle_root(
                5,
                &[anon_vma(base, base + 8 * PAGE)],
                &[(base, 1), (base + 4 * PAGE, 1)],
                (0, 0),
            )
            .unwrap();
        assert!(root.inherited.is_empty());
        assert_eq!(root.runs.iter().map(|r| r.pages).sum::<u64>(), 2);
    }

    #[test]
    fn the_heap_is_never_inherited() {
        let mut s = PageStore::new().unwrap();
        s.place_pages_of(5);
        let base = 0x3d00_0000_0000u64;
        s.reserve(5, &[(base, base + 4 * PAGE)]);
        s.insert(5, &[(base, PAGE)], &page(1)).unwrap();
        let root = s
            .settle_root(
                5,
                &[anon_vma(base, base + 4 * PAGE)],
                &[(base, 1)],
                (base, base + 4 * PAGE),
            )
            .unwrap();
        assert!(root.inherited.is_empty());
    }

    #[test]
    fn pages_where_ferry_has_memory_go_to_the_file() {
        let mut s = PageStore::new().unwrap();
        s.place_pages_of(5);
        // A page of our own heap is certainly mapped here: no region can
        // be reserved over it.
        let own = vec![7u8; 3 * PAGE as usize];
        let addr = (own.as_ptr() as u64 + PAGE - 1) & !(PAGE - 1);
        s.reserve(5, &[(addr, addr + PAGE)]);
        s.insert(5, &[(addr, PAGE)], &page(9)).unwrap();
        assert_eq!(s.bytes(), PAGE);
        let root = s.settle_root(5, &[anon_vma(addr, addr + PAGE)], &[(addr, 1)], (0, 0)).unwrap();
        assert!(root.inherited.is_empty());
        assert_eq!(root.runs.len(), 1);
        assert!(own.iter().all(|&b| b == 7), "our own memory is untouched");
    }

    #[test]
    fn placed_pages_of_special_mappings_are_copied_to_the_file() {
        let mut s = PageStore::new().unwrap();
        s.place_pages_of(5);
        let base = 0x3b00_0000_0000u64;
        s.reserve(5, &[(base, base + PAGE)]);
        s.insert(5, &[(base, PAGE)], &page(3)).unwrap();
        let mut v = anon_vma(base, base + PAGE);
        v.flags |= ferry_image::vmflag::DONTDUMP;
        let root = s.settle_root(5, &[v], &[(base, 1)], (0, 0)).unwrap();
        assert!(root.inherited.is_empty());
        let m = s.map().unwrap();
        assert_eq!(m.bytes()[root.runs[0].offset as usize], 3);
    }
}
