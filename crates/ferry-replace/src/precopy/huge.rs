//! Huge pages for the placed memory.
//!
//! The new root is forked from ferry and inherits the placed memory; a
//! fork copies one page-table entry per 4 KiB page (about 15-30 ms per
//! GiB on this VM, inside the pause, and as much again to tear ferry's
//! copy down), but one entry per 2 MiB transparent huge page. So before
//! round 0, every 2 MiB block of a region that the root has wholly
//! present is made a huge page in ferry's region (MADV_COLLAPSE after one
//! byte is written in it), and round 0 copies into it.
//!
//! What the new root sees is the same: every byte (round 0 overwrites
//! the whole block, and a page the copy missed is dropped by the restore
//! as any page not placed is), the same resident size (only blocks whose
//! every page is present), the same mapping flags (MADV_COLLAPSE does not
//! mark the mapping VM_HUGEPAGE). Only smaps' AnonHugePages tells, as it
//! would after khugepaged. Not done when the root has huge pages disabled
//! (PR_SET_THP_DISABLE, `THP_enabled: 0` in its status: redis does so to
//! keep its fork's copy-on-write small) or the host's setting is `never`.

use super::rules::Ranges;
use ferry_sys::pagemap::{self, ScanFilter, PAGE_IS_PFNZERO, PAGE_IS_PRESENT};
use ferry_sys::placed::PlacedRegion;
use std::collections::BTreeMap;

const HUGE: u64 = 2 << 20;

/// The 2 MiB-aligned blocks inside `region` that `present` (sorted,
/// disjoint ranges) covers wholly, merged where contiguous.
pub fn full_blocks(present: &[(u64, u64)], region: (u64, u64)) -> Ranges {
    let first = region.0.div_ceil(HUGE) * HUGE;
    let mut out: Ranges = Vec::new();
    for &(s, e) in present {
        let (s, e) = (s.max(first), e.min(region.1));
        let (from, to) = (s.div_ceil(HUGE) * HUGE, e / HUGE * HUGE);
        if from >= to {
            continue;
        }
        match out.last_mut() {
            Some(last) if last.1 == from => last.1 = to,
            _ => out.push((from, to)),
        }
    }
    out
}

/// Whether the root may have huge pages: the host allows them and the
/// root did not disable them for itself.
fn allowed(root: i32) -> bool {
    let host = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
        .is_ok_and(|s| !s.contains("[never]"));
    let own = std::fs::read_to_string(format!("/proc/{root}/status"))
        .is_ok_and(|s| s.lines().any(|l| l.split_whitespace().eq(["THP_enabled:", "1"])));
    host && own
}

/// Makes huge pages of the blocks the root has wholly present in each
/// region; returns the bytes made huge. Best effort: a block the kernel
/// cannot collapse (no huge page free) stays in small pages.
pub fn collapse_full_blocks(root: i32, regions: &mut BTreeMap<u64, PlacedRegion>) -> u64 {
    if !allowed(root) {
        return 0;
    }
    let Ok(pagemap) = std::fs::File::open(format!("/proc/{root}/pagemap")) else {
        return 0;
    };
    let pagemap: std::os::fd::OwnedFd = pagemap.into();
    let filter = ScanFilter { required: PAGE_IS_PRESENT, inverted: PAGE_IS_PFNZERO, any_of: 0 };
    let mut made = 0;
    for r in regions.values_mut() {
        let Ok(present) = pagemap::scan(&pagemap, r.start(), r.end(), filter) else {
            continue;
        };
        for (s, e) in full_blocks(&present, (r.start(), r.end())) {
            made += collapse(r, s, e);
        }
    }
    made
}

/// One byte written in each block (an empty block is not collapsed),
/// then the span collapsed.
fn collapse(r: &mut PlacedRegion, s: u64, e: u64) -> u64 {
    let start = r.start();
    let offset = |a: u64| (a - start) as usize;
    let touched = (s..e).step_by(HUGE as usize).all(|block| r.write(offset(block), &[0]).is_ok());
    match touched && r.collapse(offset(s), (e - s) as usize).is_ok() {
        true => e - s,
        false => {
            tracing::debug!("pre-copy: {s:#x}-{e:#x} left in small pages");
            0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: u64 = 1 << 20;

    #[test]
    fn only_wholly_present_aligned_blocks_inside_the_region_count() {
        // Region 1 MiB .. 9 MiB; present 1-5 MiB and 6-9 MiB.
        let present = [(M, 5 * M), (6 * M, 9 * M)];
        assert_eq!(full_blocks(&present, (M, 9 * M)), vec![(2 * M, 4 * M), (6 * M, 8 * M)]);
    }

    #[test]
    fn contiguous_blocks_merge_and_a_hole_splits_them() {
        let present = [(0, 4 * M), (4 * M, 8 * M)];
        assert_eq!(full_blocks(&present, (0, 8 * M)), vec![(0, 8 * M)]);
        let holed = [(0, 3 * M), (3 * M + 4096, 8 * M)];
        assert_eq!(full_blocks(&holed, (0, 8 * M)), vec![(0, 2 * M), (4 * M, 8 * M)]);
    }

    #[test]
    fn a_region_smaller_than_a_block_has_none() {
        assert!(full_blocks(&[(0, 16 * M)], (M, 2 * M + 4096)).is_empty());
        assert!(full_blocks(&[], (0, 4 * M)).is_empty());
    }
}
