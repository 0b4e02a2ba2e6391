//! PAGEMAP_SCAN (Linux 6.7+): find which pages of a range exist, in one
//! ioctl per 512 regions instead of 8 bytes of /proc/PID/pagemap per page.
//! The installed headers predate it, so the ABI is spelled out here.

use crate::{last_error, SysResult};
use std::os::fd::{AsRawFd, OwnedFd};

pub const PAGE_IS_WPALLOWED: u64 = 1 << 0;
pub const PAGE_IS_WRITTEN: u64 = 1 << 1;
pub const PAGE_IS_FILE: u64 = 1 << 2;
pub const PAGE_IS_PRESENT: u64 = 1 << 3;
pub const PAGE_IS_SWAPPED: u64 = 1 << 4;
pub const PAGE_IS_PFNZERO: u64 = 1 << 5;
/// A guard region page (MADV_GUARD_INSTALL), since 6.15.
pub const PAGE_IS_GUARD: u64 = 1 << 8;

/// _IOWR('f', 16, struct pm_scan_arg)
const PAGEMAP_SCAN: libc::c_ulong = 0xc060_6610;

#[repr(C)]
#[derive(Default)]
struct PmScanArg {
    size: u64,
    flags: u64,
    start: u64,
    end: u64,
    walk_end: u64,
    vec: u64,
    vec_len: u64,
    max_pages: u64,
    category_inverted: u64,
    category_mask: u64,
    category_anyof_mask: u64,
    return_mask: u64,
}

#[repr(C)]
#[derive(Default, Clone, Copy)]
struct PageRegion {
    start: u64,
    end: u64,
    categories: u64,
}

/// Which pages to report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScanFilter {
    /// Categories that must all be set (after applying `inverted`).
    pub required: u64,
    /// Categories that are required to be *clear* instead of set.
    pub inverted: u64,
    /// At least one of these must be set (0: no such condition).
    pub any_of: u64,
}

/// Returns `[start, end)` ranges of pages in `[start, end)` that match
/// `filter`. A PTE marker is never reported as a swapped page (see
/// [`without_markers`]).
pub fn scan(
    pagemap: &OwnedFd,
    start: u64,
    end: u64,
    filter: ScanFilter,
) -> SysResult<Vec<(u64, u64)>> {
    let swapped_wanted = (filter.any_of | filter.required) & !filter.inverted & PAGE_IS_SWAPPED;
    if swapped_wanted == 0 {
        return scan_categories(pagemap, start, end, filter, None);
    }
    let mut maybe = Vec::new();
    let found = scan_categories(pagemap, start, end, filter, Some(&mut maybe))?;
    without_markers(pagemap, found, &maybe)
}

/// PAGEMAP_SCAN's PAGE_IS_SWAPPED is set for every swap-format page
/// table entry, and a PTE marker is one: the write-protect marker that
/// userfaultfd (WP_UNPOPULATED) puts on every page never populated or
/// discarded (MADV_DONTNEED) in a range it protects, a guard page. A
/// marker holds no data; counted as a swapped page it is read (as zeros)
/// and stored, every page of every tracked mapping (a JVM's reserved
/// heap: gigabytes), and a page discarded after it was stored still
/// looks present. /proc/PID/pagemap tells them apart: a marker's entry
/// is a swap entry of type SWP_PTE_MARKER (the last of the 32 types,
/// above every swap file's); without CAP_SYS_ADMIN the type reads 0 and
/// every entry counts as data, as before.
/// `candidates` are the runs of `found` that are swapped and not present.
fn without_markers(
    pagemap: &OwnedFd,
    found: Vec<(u64, u64)>,
    candidates: &[(u64, u64)],
) -> SysResult<Vec<(u64, u64)>> {
    if candidates.is_empty() {
        return Ok(found);
    }
    let mut markers = Vec::new();
    for &(s, e) in candidates {
        marker_pages(pagemap, s, e, &mut markers)?;
    }
    Ok(subtract_ranges(found, &markers))
}

/// /proc/PID/pagemap entry bits (Documentation/admin-guide/mm/pagemap.rst).
const PM_SWAP: u64 = 1 << 62;
const PM_SWAP_TYPE: u64 = 0x1f;
const SWP_PTE_MARKER: u64 = 31;
const PAGE: u64 = 4096;

/// Appends the runs of PTE-marker pages in `[start, end)` to `out`.
fn marker_pages(
    pagemap: &OwnedFd,
    start: u64,
    end: u64,
    out: &mut Vec<(u64, u64)>,
) -> SysResult<()> {
    const CHUNK: u64 = 64 * 1024;
    // Sized to the range: most are a few pages, and a zeroed 512 KiB
    // buffer per range cost more than reading them.
    let mut entries = vec![0u64; CHUNK.min(end.saturating_sub(start) / PAGE) as usize];
    let mut page = start / PAGE;
    while page < end / PAGE {
        let n = CHUNK.min(end / PAGE - page) as usize;
        // SAFETY: `entries` has room for `n` u64s; pread writes at most
        // that many bytes into it.
        let got = unsafe {
            libc::pread(
                pagemap.as_raw_fd(),
                entries.as_mut_ptr().cast(),
                n * 8,
                (page * 8) as libc::off_t,
            )
        };
        if got < 0 {
            return Err(last_error("pread(/proc/PID/pagemap)"));
        }
        let got = got as usize / 8;
        if got == 0 {
            break;
        }
        for (k, &e) in entries[..got].iter().enumerate() {
            if e & PM_SWAP != 0 && e & PM_SWAP_TYPE == SWP_PTE_MARKER {
                let a = (page + k as u64) * PAGE;
                match out.last_mut() {
                    Some(last) if last.1 == a => last.1 = a + PAGE,
                    _ => out.push((a, a + PAGE)),
                }
            }
        }
        page += got as u64;
    }
    Ok(())
}

/// `ranges` without `cut` (both sorted, disjoint `[start, end)` runs).
fn subtract_ranges(ranges: Vec<(u64, u64)>, cut: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut out = Vec::with_capacity(ranges.len());
    let mut k = 0;
    for (mut s, e) in ranges {
        while k < cut.len() && cut[k].1 <= s {
            k += 1;
        }
        let mut j = k;
        while s < e {
            match cut.get(j) {
                Some(&(a, b)) if a < e => {
                    if a > s {
                        out.push((s, a));
                    }
                    s = s.max(b);
                    j += 1;
                }
                _ => {
                    out.push((s, e));
                    break;
                }
            }
        }
    }
    out
}

/// The runs that match `filter`; with `swapped_only`, also the runs of
/// them that are swapped and not present (their categories come back in
/// the same walk).
fn scan_categories(
    pagemap: &OwnedFd,
    start: u64,
    end: u64,
    filter: ScanFilter,
    mut swapped_only: Option<&mut Vec<(u64, u64)>>,
) -> SysResult<Vec<(u64, u64)>> {
    let extra = if swapped_only.is_some() { PAGE_IS_PRESENT | PAGE_IS_SWAPPED } else { 0 };
    const VEC_LEN: usize = 512;
    let mut regions = vec![PageRegion::default(); VEC_LEN];
    let mut out: Vec<(u64, u64)> = Vec::new();
    let mut cur = start;
    while cur < end {
        let mut arg = PmScanArg {
            size: std::mem::size_of::<PmScanArg>() as u64,
            start: cur,
            end,
            vec: regions.as_mut_ptr() as u64,
            vec_len: VEC_LEN as u64,
            category_inverted: filter.inverted,
            category_mask: filter.required | filter.inverted,
            category_anyof_mask: filter.any_of,
            return_mask: filter.required | filter.inverted | filter.any_of | extra,
            ..Default::default()
        };
        // SAFETY: arg is a correctly sized pm_scan_arg and `vec` points to
        // VEC_LEN writable page_region entries.
        let n = unsafe { libc::ioctl(pagemap.as_raw_fd(), PAGEMAP_SCAN as _, &mut arg) };
        if n < 0 {
            return Err(last_error("ioctl(PAGEMAP_SCAN)"));
        }
        let n = n as usize;
        for r in &regions[..n] {
            match out.last_mut() {
                Some(last) if last.1 == r.start => last.1 = r.end,
                _ => out.push((r.start, r.end)),
            }
            if r.categories & (PAGE_IS_PRESENT | PAGE_IS_SWAPPED) == PAGE_IS_SWAPPED {
                if let Some(v) = swapped_only.as_deref_mut() {
                    match v.last_mut() {
                        Some(last) if last.1 == r.start => last.1 = r.end,
                        _ => v.push((r.start, r.end)),
                    }
                }
            }
        }
        // walk_end is stale on 6.18 when the vector fills up; the walk is
        // complete whenever fewer regions than the vector length came back.
        if n < VEC_LEN {
            break;
        }
        cur = regions[VEC_LEN - 1].end;
    }
    Ok(out)
}

/// PAGEMAP_SCAN flag: write-protect every page reported (userfaultfd
/// WP_ASYNC ranges only), atomically with the scan.
pub const PM_SCAN_WP_MATCHING: u64 = 1 << 0;
/// PAGEMAP_SCAN flag: fail with EPERM instead of skipping a mapping that
/// is not registered for async write-protection.
pub const PM_SCAN_CHECK_WPASYNC: u64 = 1 << 1;

/// Regions per PAGEMAP_SCAN call of [`collect_written`]. Written pages
/// come in runs; 512 regions of 24 bytes cover most rounds in one call.
const WRITTEN_VEC_LEN: usize = 512;

/// Appends to `out` the `[start, end)` runs of pages in `[start, end)`
/// written since they were last protected, and protects them again in the
/// same walk (PM_SCAN_WP_MATCHING), so a write that lands after its page
/// was reported shows up in the next call. Every mapping of the range
/// must be registered with a WP_ASYNC userfaultfd: one that is not (a
/// mapping made there since) fails the call with EPERM, once the mappings
/// before it were scanned and protected again; their written pages are in
/// `out` all the same. Holes (unmapped parts) are skipped.
pub fn collect_written(
    pagemap: &OwnedFd,
    start: u64,
    end: u64,
    out: &mut Vec<(u64, u64)>,
) -> SysResult<()> {
    let mut regions = [PageRegion::default(); WRITTEN_VEC_LEN];
    let mut cur = start;
    while cur < end {
        regions.fill(PageRegion::default());
        let mut arg = PmScanArg {
            size: std::mem::size_of::<PmScanArg>() as u64,
            flags: PM_SCAN_WP_MATCHING | PM_SCAN_CHECK_WPASYNC,
            start: cur,
            end,
            vec: regions.as_mut_ptr() as u64,
            vec_len: WRITTEN_VEC_LEN as u64,
            category_mask: PAGE_IS_WRITTEN,
            return_mask: PAGE_IS_WRITTEN,
            ..Default::default()
        };
        // SAFETY: arg is a correctly sized pm_scan_arg and `vec` points to
        // WRITTEN_VEC_LEN writable page_region entries.
        let n = unsafe { libc::ioctl(pagemap.as_raw_fd(), PAGEMAP_SCAN as _, &mut arg) };
        if n < 0 {
            let err = last_error("ioctl(PAGEMAP_SCAN, WP_MATCHING)");
            // A failed call still copied out the regions it found (and
            // protected again) before the mapping that stopped it, but
            // does not say how many: the vector was zeroed, so they are
            // the leading non-empty entries.
            for r in regions.iter().take_while(|r| r.end > r.start) {
                match out.last_mut() {
                    Some(last) if last.1 == r.start => last.1 = r.end,
                    _ => out.push((r.start, r.end)),
                }
            }
            return Err(err);
        }
        let n = n as usize;
        for r in &regions[..n] {
            match out.last_mut() {
                Some(last) if last.1 == r.start => last.1 = r.end,
                _ => out.push((r.start, r.end)),
            }
        }
        // A vector that came back short means the walk reached `end`. On
        // 6.18 walk_end is stale once a scan has produced more than 512
        // regions, so it is trusted only when the vector is full (the walk
        // stopped for room, before the page it names, which was neither
        // reported nor protected); even then it must not fall behind the
        // last region reported, or lie beyond `end`.
        if n < WRITTEN_VEC_LEN {
            break;
        }
        let last_end = regions[WRITTEN_VEC_LEN - 1].end;
        cur = if arg.walk_end >= last_end && arg.walk_end <= end { arg.walk_end } else { last_end };
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::subtract_ranges;

    #[test]
    fn markers_are_cut_out_of_the_runs_they_fall_in() {
        let runs = vec![(0, 10), (20, 30), (40, 50)];
        assert_eq!(subtract_ranges(runs.clone(), &[]), runs);
        assert_eq!(
            subtract_ranges(runs.clone(), &[(2, 4), (8, 22), (29, 41)]),
            vec![(0, 2), (4, 8), (22, 29), (41, 50)]
        );
        assert_eq!(subtract_ranges(runs, &[(0, 50)]), vec![]);
        assert_eq!(subtract_ranges(vec![(0, 10)], &[(10, 20)]), vec![(0, 10)]);
    }
}
