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
/// not hold) that lie in a region into it;
/// returns the ranges copied. Best effort: what is not copied goes into
/// the image as before.
pub fn place_written(
    root: i32,
    regions: &mut BTreeMap<u64, PlacedRegion>,
    written: &Ranges,
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
    let mut placed = Vec::new();
    for r in regions.values_mut() {
        let mut present = Vec::new();
        for (s, e) in intersect(written, &[(r.start(), r.end())]) {
            match pagemap::scan(&pagemap, s, e, filter) {
                Ok(found) => present.extend(found),
                Err(e) => tracing::debug!("pre-copy, last round at {s:#x}: {e}"),
            }
        }
        match r.read_from(root, &present) {
            Ok(bytes) => placed.extend(prefix(&present, bytes)),
            Err(e) => tracing::debug!("pre-copy, last round into {:#x}: {e}", r.start()),
        }
    }
    tracing::debug!(
        "pre-copy, last round: {} bytes placed ({} bytes of ranges looked at) in {:.1} ms",
        super::rules::bytes(&placed),
        super::rules::bytes(written),
        t.elapsed().as_secs_f64() * 1e3
    );
    placed
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
}
