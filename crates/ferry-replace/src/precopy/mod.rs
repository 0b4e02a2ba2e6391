//! Pre-copy into the new tree: while the old tree runs, its root's
//! private anonymous memory is copied into memory of ferry's own placed
//! at the same addresses (ferry_sys::placed), in rounds, with the dirty
//! tracker (ferry_engine::dirty) telling which pages were written since
//! the last round. The freeze then copies only what changed since the
//! last round; the rest reaches the new root without a copy: the restore
//! forks the root from ferry itself (Placement::Here), so the root
//! inherits the placed memory over fork, and the image lists those
//! mappings as the root's `inherited` ones (kept, not remade).
//!
//! Only the root inherits from ferry: every other process is forked from
//! its restored parent. So only the root is pre-copied; the other
//! processes' memory is copied in the pause as before (what a child
//! still shares with the root comes with the root's).
//!
//! Which mappings: the root's private anonymous read-write ones without
//! special flags (the restore must be able to keep them as they are),
//! each wholly in one placed region, not the heap (it stays a brk area).
//! A mapping where ferry has memory of its own (the region cannot be
//! placed: EEXIST) is copied in the pause.
//!
//! The trial restore leaves the pre-copied pages out: its helper is
//! forked from ferry with the regions marked MADV_DONTFORK, and its image
//! lists no inherited mapping, so the trial's root maps those mappings
//! afresh with only the pages written since the last round. The trial
//! guards the kill against what can fail in a restore: kernel objects,
//! PIDs, files, sockets, the mappings themselves (which its check
//! compares). The pages the real root keeps from the regions cannot fail
//! that way (they are ferry's own memory, inherited by a fork), and the
//! check compares mappings, not page contents; copying the page tables
//! of the whole memory twice more (helper and trial root) and tearing
//! them down again would make the trial grow with memory size inside the
//! pause.

mod huge;
mod last_round;
mod rules;

pub use rules::{RoundRule, Stop};

use crate::error::ReplaceError;
use ferry_engine::capture::CaptureHooks;
use ferry_engine::dirty::DirtyTracker;
use ferry_engine::phases::Phases;
use ferry_image::{ImageError, InheritedVma, PageRun, PageSink, PageSpan, TreeImage, Vma};
use ferry_sys::placed::PlacedRegion;
use rules::{bytes, intersect, merged, minus, union, Ranges};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

const PAGE: u64 = 4096;

/// Threads that copy the last round into the regions, in a freeze.
const THREADS: usize = 2;

/// One round: bytes copied into the placed memory, how long it took,
/// and the bytes the root wrote meanwhile.
#[derive(Debug, Clone, Copy)]
pub struct Round {
    pub bytes: u64,
    pub ms: f64,
    pub dirty_after: u64,
}

/// What the report says about the pre-copy.
#[derive(Debug, Clone)]
pub struct Summary {
    pub rounds: Vec<Round>,
    pub stop: Option<Stop>,
    /// Bytes of the root's pages the new root inherits (not copied in
    /// the pause).
    pub inherited_bytes: u64,
    /// Bytes of the root's private anonymous mappings where ferry has
    /// memory of its own: copied in the pause.
    pub collided_bytes: u64,
    /// Bytes of the placed memory in 2 MiB huge pages.
    pub huge_bytes: u64,
    /// Bytes the freeze copied into the placed memory (the last round).
    pub last_round_bytes: u64,
}

/// The pre-copy state from the first round to the end of the
/// replacement. Dropped, it unmaps the placed memory and closes the
/// userfaultfds (the old tree, if it still runs, runs on unharmed).
pub struct Precopy {
    root: i32,
    /// Kept until the old tree is gone or runs on: closing it walks every
    /// tracked page table, which must not count in the pause.
    tracker: DirtyTracker,
    regions: BTreeMap<u64, PlacedRegion>,
    /// The root's pages whose current content the regions hold.
    held: Ranges,
    /// The root's mappings the new root can keep from the regions, as
    /// found in the freeze.
    eligible: Ranges,
    inherited: Vec<InheritedVma>,
    collided: u64,
    /// Bytes of the regions in transparent huge pages ([`huge`]).
    huge_bytes: u64,
    /// Bytes copied into the regions in the freeze ([`last_round`]).
    last_round_bytes: u64,
    rounds: Vec<Round>,
    stop: Option<Stop>,
}

impl Precopy {
    /// Arms dirty tracking on the tree of `root`, places a region at each
    /// of the root's private anonymous mappings, copies its pages once,
    /// then the pages written since, until `rule` says freeze.
    pub fn run(root: i32, rule: &RoundRule, ph: &mut Phases) -> Result<Precopy, ReplaceError> {
        let tracker = DirtyTracker::attach(root).map_err(|e| exited_or(root, e))?;
        let mut pc = Precopy {
            root,
            tracker,
            regions: BTreeMap::new(),
            held: Vec::new(),
            eligible: Vec::new(),
            inherited: Vec::new(),
            collided: 0,
            huge_bytes: 0,
            last_round_bytes: 0,
            rounds: Vec::new(),
            stop: None,
        };
        pc.place()?;
        ph.mark("tracking armed, memory placed");
        pc.huge_bytes = huge::collapse_full_blocks(root, &mut pc.regions);
        ph.mark("huge pages made");
        let t = Instant::now();
        let all: Ranges = pc.regions.values().map(|r| (r.start(), r.end())).collect();
        let copied = pc.copy(&all)?;
        pc.rounds.push(Round { bytes: copied, ms: ms_since(t), dirty_after: 0 });
        ph.mark("round 0");
        let mut previous = None;
        loop {
            let dirty = intersect(&pc.root_written()?, &all);
            pc.held = minus(&pc.held, &dirty);
            let dirty_bytes = bytes(&dirty);
            if let Some(last) = pc.rounds.last_mut() {
                last.dirty_after = dirty_bytes;
            }
            if let Some(stop) = rule.decide(pc.rounds.len() as u32 - 1, dirty_bytes, previous) {
                pc.stop = Some(stop);
                return Ok(pc);
            }
            previous = Some(dirty_bytes);
            let t = Instant::now();
            let copied = pc.copy(&dirty)?;
            pc.rounds.push(Round { bytes: copied, ms: ms_since(t), dirty_after: 0 });
            ph.mark(&format!("round {}", pc.rounds.len() - 1));
        }
    }

    /// One region per private anonymous read-write mapping of the root,
    /// where ferry's own memory (and its stack's room to grow) leaves
    /// the addresses free.
    fn place(&mut self) -> Result<(), ReplaceError> {
        let maps = ferry_engine::procfs::maps(self.root).map_err(|e| exited_or(self.root, e))?;
        let (rs, re) = own_stack_reserve();
        for m in maps.iter().filter(|m| m.path.is_empty() && &m.perms == b"rw-p") {
            let len = m.end - m.start;
            if m.start < re && m.end > rs {
                self.collided += len;
                continue;
            }
            match PlacedRegion::map(m.start, len as usize) {
                Ok(r) => {
                    self.regions.insert(m.start, r);
                }
                Err(e) => {
                    tracing::debug!(
                        "pre-copy of pid {}: no room at {:#x}-{:#x} ({e}); copied in the pause",
                        self.root,
                        m.start,
                        m.end
                    );
                    self.collided += len;
                }
            }
        }
        Ok(())
    }

    /// The root's pages written since the last call (protected again).
    fn root_written(&mut self) -> Result<Ranges, ReplaceError> {
        let dirty = self.tracker.collect().map_err(|e| exited_or(self.root, e))?;
        match dirty.into_iter().find(|(p, _)| *p == self.root) {
            Some((_, r)) => Ok(merged(r)),
            None => Err(ReplaceError::Exited(self.root)),
        }
    }

    /// Copies the root's present pages inside `only` into the regions;
    /// returns the bytes placed. A copy cut short by memory that went
    /// away (munmap) only leaves those pages to the pause.
    fn copy(&mut self, only: &[(u64, u64)]) -> Result<u64, ReplaceError> {
        if only.is_empty() {
            return Ok(0);
        }
        let keep_shared = self.tracker.pids().len() > 1;
        let mut sink = PlaceSink {
            regions: Mutex::new(&mut self.regions),
            placed: Mutex::new(Vec::new()),
            len: AtomicU64::new(0),
        };
        let copied = ferry_engine::capture::copy_present(
            self.root,
            Some(only),
            keep_shared,
            &mut sink,
            None,
        );
        let placed = merged(sink.placed.into_inner().unwrap_or_default());
        if let Err(e) = copied {
            if root_exited(self.root) {
                return Err(ReplaceError::Exited(self.root));
            }
            tracing::info!("pre-copy of pid {}: {e}; the rest goes in the pause", self.root);
        }
        self.held = union(&self.held, &placed);
        Ok(bytes(&placed))
    }

    /// After the capture: the root's mappings the new root keeps from
    /// the regions, with the pages the capture left to them
    /// (`parent_pages`, by the image's PIDs, which are the host's here).
    /// Regions no mapping keeps are dropped now.
    pub fn settle(&mut self, parent_pages: &[(i32, Vec<PageSpan>)]) {
        let spans: &[PageSpan] =
            parent_pages.iter().find(|(p, _)| *p == self.root).map_or(&[], |(_, s)| s.as_slice());
        let spans: Ranges = merged(spans.iter().map(|s| (s.start, s.end())).collect());
        self.inherited = self
            .eligible
            .iter()
            .filter_map(|&(s, e)| {
                let inside = intersect(&spans, &[(s, e)]);
                (!inside.is_empty()).then(|| InheritedVma {
                    start: s,
                    end: e,
                    shared_pages: inside
                        .iter()
                        .map(|&(a, b)| PageSpan::new(a, (b - a) / PAGE))
                        .collect(),
                })
            })
            .collect();
        let kept: Vec<u64> = self.inherited.iter().map(|v| v.start).collect();
        self.regions.retain(|_, r| kept.iter().any(|&s| s >= r.start() && s < r.end()));
    }

    /// Gives the image's root the mappings it inherits from the regions;
    /// done on each loaded copy of the image (a root cannot inherit in an
    /// image as stored).
    pub fn complete(&self, tree: &mut TreeImage) {
        if let Some(root) = tree.processes.first_mut().filter(|p| p.pid == self.root) {
            root.inherited = self.inherited.clone();
        }
    }

    /// Runs `trial` with the regions kept out of every process forked
    /// meanwhile (MADV_DONTFORK): the trial's helper and root do not copy
    /// their page tables, nor tear them down, in the pause. Inheritance
    /// is put back after it whatever it returned; if that fails the
    /// replacement is refused (the real root must inherit them).
    pub fn without_regions<T>(
        &self,
        trial: impl FnOnce() -> Result<T, ReplaceError>,
    ) -> Result<T, ReplaceError> {
        let out = self.inherit(false).and_then(|()| trial());
        self.inherit(true)?;
        out
    }

    /// Whether a process forked from ferry gets the regions (see
    /// [`without_regions`](Self::without_regions)); the capture's guard
    /// is forked without them (its exit would tear their page tables
    /// down inside the kill).
    pub fn inherit(&self, on: bool) -> Result<(), ReplaceError> {
        for r in self.regions.values() {
            r.set_inherited(on).map_err(|e| {
                ReplaceError::Refused(format!(
                    "pre-copy: placed memory at {:#x}-{:#x}: {e}",
                    r.start(),
                    r.end()
                ))
            })?;
        }
        Ok(())
    }

    pub fn summary(&self) -> Summary {
        Summary {
            rounds: self.rounds.clone(),
            stop: self.stop,
            inherited_bytes: self
                .inherited
                .iter()
                .flat_map(|v| v.shared_pages.iter())
                .map(|s| s.pages * PAGE)
                .sum(),
            collided_bytes: self.collided,
            huge_bytes: self.huge_bytes,
            last_round_bytes: self.last_round_bytes,
        }
    }

    /// Whether the new root can keep mapping `v` from a region: private
    /// anonymous, no flag the restore would have to set, wholly in one
    /// region, not the heap.
    fn keepable(&self, v: &Vma, heap: Option<(u64, u64)>) -> bool {
        let one_region = self
            .regions
            .range(..=v.start)
            .next_back()
            .is_some_and(|(_, r)| r.end() >= v.end && r.start() <= v.start);
        matches!(v.backing, ferry_image::VmaBacking::Anonymous)
            && !v.shared
            && v.flags & !ferry_image::vmflag::MAYWRITE == 0
            && one_region
            && heap.is_none_or(|(s, e)| v.end <= s || v.start >= e)
    }
}

/// Called by the capture once the tree is frozen: the last writes are
/// collected, and the pages the regions still hold are not copied.
impl CaptureHooks for Precopy {
    fn held_pages(
        &mut self,
        procs: &[(i32, &[Vma])],
    ) -> ferry_engine::Result<HashMap<i32, Vec<PageSpan>>> {
        let dirty = self.tracker.collect()?;
        let written = dirty.into_iter().find(|(p, _)| *p == self.root).map(|(_, r)| merged(r));
        let (Some(written), Some((_, vmas))) =
            (written, procs.iter().find(|(p, _)| *p == self.root))
        else {
            self.held.clear();
            return Ok(HashMap::new());
        };
        let heap = heap_of(self.root);
        self.eligible =
            vmas.iter().filter(|v| self.keepable(v, heap)).map(|v| (v.start, v.end)).collect();
        // Written since the last round, or since the one before (the
        // rounds stop on a collect whose pages they do not copy).
        let all: Ranges = self.regions.values().map(|r| (r.start(), r.end())).collect();
        let held = minus(&self.held, &written);
        let placed =
            last_round::place_written(self.root, &self.regions, &minus(&all, &held), THREADS);
        self.last_round_bytes = bytes(&placed);
        self.held = intersect(&union(&held, &placed), &self.eligible);
        let spans = self.held.iter().map(|&(s, e)| PageSpan::new(s, (e - s) / PAGE)).collect();
        Ok(HashMap::from([(self.root, spans)]))
    }
}

/// Pages copied by the capture's reader go to the regions that hold
/// their addresses; the parts outside every region are not kept.
struct PlaceSink<'a> {
    regions: Mutex<&'a mut BTreeMap<u64, PlacedRegion>>,
    placed: Mutex<Ranges>,
    len: AtomicU64,
}

impl PageSink for PlaceSink<'_> {
    fn data_len(&self) -> u64 {
        self.len.load(Ordering::Relaxed)
    }

    fn write_runs_at(
        &self,
        _pid: i32,
        data_offset: u64,
        ranges: &[(u64, usize)],
        data: &[u8],
    ) -> Result<Vec<PageRun>, ImageError> {
        let mut regions = self.regions.lock().map_err(|_| poisoned())?;
        let mut placed = Vec::new();
        let mut runs = Vec::with_capacity(ranges.len());
        let mut off = 0usize;
        for &(addr, len) in ranges {
            let end = addr + len as u64;
            let mut a = addr;
            while a < end {
                let Some((_, r)) = regions.range_mut(..=a).next_back().filter(|(_, r)| r.end() > a)
                else {
                    a = regions.range(a..).next().map_or(end, |(&s, _)| s.min(end));
                    continue;
                };
                let upto = r.end().min(end);
                let from = off + (a - addr) as usize;
                r.write((a - r.start()) as usize, &data[from..from + (upto - a) as usize])
                    .map_err(|e| ImageError::Invalid(format!("placing pages at {a:#x}: {e}")))?;
                placed.push((a, upto));
                a = upto;
            }
            runs.push(PageRun {
                start: addr,
                pages: len as u64 / PAGE,
                offset: data_offset + off as u64,
                checksum: 0,
            });
            off += len;
        }
        self.placed.lock().map_err(|_| poisoned())?.extend(placed);
        Ok(runs)
    }

    fn set_data_len(&mut self, len: u64) -> Result<(), ImageError> {
        self.len.store(len, Ordering::Relaxed);
        Ok(())
    }
}

fn poisoned() -> ImageError {
    ImageError::Invalid("pre-copy: a page copy thread panicked".into())
}

fn ms_since(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

fn root_exited(root: i32) -> bool {
    ferry_engine::procfs::state(root).is_none_or(|s| s == 'Z' || s == 'X')
}

/// `e`, or [`ReplaceError::Exited`] when the root is gone.
fn exited_or(root: i32, e: ferry_engine::EngineError) -> ReplaceError {
    if root_exited(root) {
        ReplaceError::Exited(root)
    } else {
        ReplaceError::Engine(e)
    }
}

/// The root's [heap] mapping, read while it is frozen.
fn heap_of(pid: i32) -> Option<(u64, u64)> {
    let maps = ferry_engine::procfs::maps(pid).ok()?;
    maps.iter().find(|m| m.path == "[heap]").map(|m| (m.start, m.end))
}

/// ferry's stack and the 256 MiB below it: a region there would stop
/// the stack from growing.
fn own_stack_reserve() -> (u64, u64) {
    let Ok(maps) = ferry_engine::procfs::maps(std::process::id() as i32) else { return (0, 0) };
    maps.iter()
        .find(|m| m.path == "[stack]")
        .map_or((0, 0), |m| (m.start.saturating_sub(256 << 20), m.end))
}
