//! The last round, in the freeze: the pages the regions do not hold as
//! they are now (written since the last copy) are copied into the placed
//! regions, not into the image.
//!
//! In the image they were copied three times inside the pause: by the
//! capture, by the trial's root and by the new root (64 MiB of a hot
//! writer at 1 GiB: most of a 300 ms pause). In the regions they are
//! copied once, straight from the frozen root (process_vm_readv into
//! ferry's region at the same addresses), and the new root inherits
//! them with the rest; the trial, which leaves the regions out, maps
//! those mappings without them, as it does for every pre-copied page.
//! Only pages present in the root are copied (a page it discarded stays
//! absent in the new root, as the image would have it).

use super::rules::{intersect, Ranges};
use ferry_sys::pagemap::{self, ScanFilter, PAGE_IS_PFNZERO, PAGE_IS_PRESENT, PAGE_IS_SWAPPED};
use ferry_sys::placed::PlacedRegion;
use std::collections::BTreeMap;

/// Copies the present pages of `written` (the ranges the regions do
/// not hold) that lie in a region into it, on up to `threads` threads
/// (the tree is frozen: a copy of tens of MiB, 4 GB/s on one thread,
/// is most of such a freeze); returns the ranges copied. Best effort:
/// what is not copied goes into the image as before.
pub fn place_written(
    root: i32,
    regions: &BTreeMap<u64, PlacedRegion>,
    written: &Ranges,
    threads: usize,
) -> Ranges {
    let Ok(pagemap) = std::fs::File::open(format!("/proc/{root}/pagemap")) else {
        return Vec::new();
    };
    let pagemap: std::os::fd::OwnedFd = pagemap.into();
    let filter = ScanFilter {
        required: 0,
        inverted: PAGE_IS_PFNZERO,
        any_of: PAGE_IS_PRESENT | PAGE_IS_SWAPPED,
    };
    let t = std::time::Instant::now();
    let mut present = Vec::new();
    for r in regions.values() {
        for (s, e) in intersect(written, &[(r.start(), r.end())]) {
            match pagemap::scan(&pagemap, s, e, filter) {
                Ok(found) => present.extend(found),
                Err(e) => tracing::debug!("pre-copy, last round at {s:#x}: {e}"),
            }
        }
    }
    let scanned = t.elapsed().as_secs_f64() * 1e3;
    let parts = split_by_bytes(&present, threads_for(super::rules::bytes(&present), threads));
    let placed: Ranges = match &parts[..] {
        [one] => copy_part(root, regions, one),
        _ => std::thread::scope(|sc| {
            let handles: Vec<_> =
                parts.iter().map(|p| sc.spawn(|| copy_part(root, regions, p))).collect();
            handles.into_iter().flat_map(|h| h.join().unwrap_or_default()).collect()
        }),
    };
    tracing::debug!(
        "pre-copy, last round: {} bytes placed ({} bytes of ranges looked at, scanned in {scanned:.1} ms) on {} threads in {:.1} ms",
        super::rules::bytes(&placed),
        super::rules::bytes(written),
        parts.len(),
        t.elapsed().as_secs_f64() * 1e3
    );
    super::rules::merged(placed)
}

/// Below this a second thread costs more than it saves.
const PER_THREAD_FROM: u64 = 8 << 20;

/// How many threads copy `bytes`: one per [`PER_THREAD_FROM`], at most
/// `threads`, at least one.
fn threads_for(bytes: u64, threads: usize) -> usize {
    ((bytes / PER_THREAD_FROM) as usize).clamp(1, threads.max(1))
}

/// Copies `ranges` (sorted, each inside one region) into their regions;
/// the ranges copied.
fn copy_part(root: i32, regions: &BTreeMap<u64, PlacedRegion>, ranges: &[(u64, u64)]) -> Ranges {
    let mut placed = Vec::new();
    let mut at = 0;
    while at < ranges.len() {
        let start = ranges[at].0;
        let Some((_, r)) = regions.range(..=start).next_back().filter(|(_, r)| r.end() > start)
        else {
            at += 1;
            continue;
        };
        let n = ranges[at..].iter().take_while(|&&(_, e)| e <= r.end()).count().max(1);
        let run = &ranges[at..at + n];
        match r.read_from(root, run) {
            Ok(bytes) => placed.extend(prefix(run, bytes)),
            Err(e) => tracing::debug!("pre-copy, last round into {:#x}: {e}", r.start()),
        }
        at += n;
    }
    placed
}

/// `ranges` (sorted, page-aligned) cut into `parts` runs of about equal
/// bytes, in order, cut on page boundaries; never an empty part but for
/// empty `ranges` (one part then).
pub(super) fn split_by_bytes(ranges: &[(u64, u64)], parts: usize) -> Vec<Ranges> {
    let total = super::rules::bytes(ranges);
    let parts = parts.max(1) as u64;
    let share = (total / parts).div_ceil(4096) * 4096;
    let mut out: Vec<Ranges> = vec![Vec::new()];
    let mut room = share;
    for &(s, e) in ranges {
        let mut a = s;
        while a < e {
            if room == 0 && (out.len() as u64) < parts {
                out.push(Vec::new());
                room = share;
            }
            let take = if (out.len() as u64) < parts { (e - a).min(room) } else { e - a };
            if let Some(last) = out.last_mut() {
                last.push((a, a + take));
            }
            room = room.saturating_sub(take);
            a += take;
        }
    }
    out
}

/// The first `bytes` of `ranges`, page-aligned down (a partial copy ends
/// on the first page it could not read).
fn prefix(ranges: &[(u64, u64)], bytes: u64) -> Ranges {
    let mut left = bytes / 4096 * 4096;
    let mut out = Vec::new();
    for &(s, e) in ranges {
        if left == 0 {
            break;
        }
        let take = (e - s).min(left);
        out.push((s, s + take));
        left -= take;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_copy_places_only_the_pages_it_read() {
        let ranges = [(0x1000, 0x3000), (0x8000, 0x9000)];
        assert_eq!(prefix(&ranges, 0x3000), vec![(0x1000, 0x3000), (0x8000, 0x9000)]);
        assert_eq!(prefix(&ranges, 0x1800), vec![(0x1000, 0x2000)]);
        assert_eq!(prefix(&ranges, 0x2000), vec![(0x1000, 0x3000)]);
        assert!(prefix(&ranges, 0).is_empty());
    }

    #[test]
    fn the_copy_is_shared_out_in_equal_parts_cut_on_pages() {
        let ranges = [(0x1000, 0x5000), (0x8000, 0xa000)];
        assert_eq!(split_by_bytes(&ranges, 1), vec![ranges.to_vec()]);
        assert_eq!(
            split_by_bytes(&ranges, 2),
            vec![vec![(0x1000, 0x4000)], vec![(0x4000, 0x5000), (0x8000, 0xa000)]]
        );
        // 6 pages in 4 parts: 2, 2, 2 (a part of 1 page rounds up to 2).
        let parts = split_by_bytes(&ranges, 4);
        assert!(parts.len() <= 4 && parts.iter().all(|p| !p.is_empty()));
        assert_eq!(parts.concat().iter().map(|&(s, e)| e - s).sum::<u64>(), 0x6000);
        assert_eq!(split_by_bytes(&[], 2), vec![Vec::<(u64, u64)>::new()]);
        // One page cannot be cut.
        assert_eq!(split_by_bytes(&[(0, 0x1000)], 2), vec![vec![(0, 0x1000)]]);
    }

    #[test]
    fn a_small_copy_stays_on_one_thread() {
        assert_eq!(threads_for(0, 2), 1);
        assert_eq!(threads_for(PER_THREAD_FROM - 1, 2), 1);
        assert_eq!(threads_for(2 * PER_THREAD_FROM, 2), 2);
        assert_eq!(threads_for(64 * PER_THREAD_FROM, 2), 2);
        assert_eq!(threads_for(64 * PER_THREAD_FROM, 0), 1);
    }
}
