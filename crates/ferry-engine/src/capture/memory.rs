//! Memory: every mapping with its protection and flags, and the pages
//! that must travel in the image.
//!
//! Which pages are stored depends on the mapping: anonymous memory keeps
//! the pages that exist (present or swapped, not the shared zero page);
//! private file mappings keep only pages that were written (they became
//! anonymous copies); shared file mappings keep nothing, their data is in
//! the file. PAGEMAP_SCAN finds those pages in one call per 512 regions.

use crate::catalog::vmflags;
use crate::error::{EngineError, Result};
use crate::procfs::{MapsEntry, Stat};
use ferry_image::PageSpan;
use ferry_image::{
    vmflag, MmLayout, PageRun, PageSink, Vma, VmaBacking, PROT_EXEC, PROT_READ, PROT_WRITE,
};
use ferry_sys::pagemap::{
    self, ScanFilter, PAGE_IS_FILE, PAGE_IS_GUARD, PAGE_IS_PFNZERO, PAGE_IS_PRESENT,
    PAGE_IS_SWAPPED,
};
use ferry_sys::vm::{self, RemoteRange};
use std::os::unix::fs::FileExt;

fn describe(m: &MapsEntry) -> String {
    format!(
        "mapping {:#x}-{:#x} ({})",
        m.start,
        m.end,
        if m.path.is_empty() { "anonymous" } else { &m.path }
    )
}

/// Kinds of memory whose file name alone says ferry cannot make them
/// again; named before anything tries to read them (their pages or
/// /proc/PID/map_files fail with unrelated errors).
fn special_kind(m: &MapsEntry) -> Option<&'static str> {
    let p = m.path.as_str();
    let hugetlb = m.has_flag("ht") || p.starts_with("/anon_hugepage");
    Some(match p {
        _ if hugetlb && p.starts_with("/memfd:") => {
            "an MFD_HUGETLB memfd (hugetlb memory, VmFlags ht); hugetlb memory is not restored"
        }
        _ if hugetlb && p.starts_with("/SYSV") => {
            "a SHM_HUGETLB SysV segment (hugetlb memory, VmFlags ht); hugetlb memory is not restored"
        }
        _ if hugetlb => "hugetlb memory (VmFlags ht); hugetlb memory is not restored",
        "/[aio] (deleted)" => "the ring of an AIO context (io_setup); AIO contexts are not restored",
        "/secretmem (deleted)" => {
            "memfd_secret memory: no one but the process can read it, so it is not restored"
        }
        _ => return None,
    })
}

fn backing(pid: i32, m: &MapsEntry) -> Result<VmaBacking> {
    if let Some(why) = special_kind(m) {
        return Err(EngineError::unsupported(pid, describe(m), why));
    }
    let p = m.path.as_str();
    Ok(match p {
        "" | "[heap]" | "[stack]" => VmaBacking::Anonymous,
        "[vdso]" => VmaBacking::Vdso,
        "[vvar]" | "[vvar_vclock]" => VmaBacking::Vvar { name: p.to_string() },
        "[vsyscall]" => VmaBacking::Vsyscall,
        _ if p.starts_with("[anon:") => {
            return Err(EngineError::unsupported(
                pid,
                describe(m),
                "a named anonymous mapping (PR_SET_VMA_ANON_NAME); the name is not restored",
            ))
        }
        "/dev/zero (deleted)" if m.shared() => VmaBacking::SharedAnon { id: m.inode },
        _ if p.starts_with("[anon_shmem:") => VmaBacking::SharedAnon { id: m.inode },
        _ if p.starts_with("/SYSV") && m.shared() => VmaBacking::SysvShm { id: m.inode as i32 },
        _ if p.starts_with("/memfd:") => VmaBacking::Memfd { id: m.inode },
        _ if p.ends_with(" (deleted)") && p.starts_with('/') => {
            VmaBacking::DeletedFile { id: m.inode }
        }
        _ if p.starts_with('/') => {
            VmaBacking::File { path: p.to_string(), dev: m.dev, ino: m.inode }
        }
        _ => return Err(EngineError::unsupported(pid, describe(m), "unknown kind of mapping")),
    })
}

/// Refuses a mapping whose VmFlags show a flag ferry does not restore or
/// does not know (catalog table `vmflags`). The kernel's own mappings
/// are the running kernel's at restore.
fn check_flags(pid: i32, m: &MapsEntry) -> Result<()> {
    if vmflags::is_kernel_mapping(&m.path) {
        return Ok(());
    }
    match vmflags::refusal(&m.vm_flags) {
        Some((name, why)) => {
            Err(EngineError::unsupported(pid, describe(m), format!("VmFlags {name}: {why}")))
        }
        None => Ok(()),
    }
}

/// Turns smaps entries into image mappings, refusing kinds we cannot restore.
pub fn classify(pid: i32, smaps: &[MapsEntry]) -> Result<Vec<Vma>> {
    smaps
        .iter()
        .map(|m| {
            let mut prot = 0u8;
            if m.perms[0] == b'r' {
                prot |= PROT_READ;
            }
            if m.perms[1] == b'w' {
                prot |= PROT_WRITE;
            }
            if m.perms[2] == b'x' {
                prot |= PROT_EXEC;
            }
            let backing = backing(pid, m)?;
            check_flags(pid, m)?;
            let flags = crate::vm_flags::image_flags(m.vm_flags.iter().map(String::as_str));
            Ok(Vma {
                start: m.start,
                end: m.end,
                prot,
                shared: m.shared(),
                flags,
                pgoff: m.offset,
                backing,
            })
        })
        .collect()
}

/// Refuses guard pages (MADV_GUARD_INSTALL): markers in the page tables,
/// found by PAGEMAP_SCAN in the mappings whose VmFlags show `gu` (the
/// kernel sets it on a mapping that may hold some, and never clears it),
/// so a process that never made one costs nothing. A restore without
/// them would let the process touch memory it fenced off.
pub fn check_guard_regions(pid: i32, smaps: &[MapsEntry]) -> Result<()> {
    let mut marked = smaps.iter().filter(|m| m.has_flag("gu")).peekable();
    if marked.peek().is_none() {
        return Ok(());
    }
    let path = format!("/proc/{pid}/pagemap");
    let pagemap: std::os::fd::OwnedFd =
        std::fs::File::open(&path).map_err(|e| EngineError::io(&path, e))?.into();
    let guard = ScanFilter { required: PAGE_IS_GUARD, inverted: 0, any_of: 0 };
    for m in marked {
        let found = pagemap::scan(&pagemap, m.start, m.end, guard).map_err(|e| {
            EngineError::kernel(pid, format!("scanning {} for guard pages", describe(m)), e)
        })?;
        if let Some((s, e)) = found.first() {
            return Err(EngineError::unsupported(
                pid,
                describe(m),
                format!(
                    "guard pages at {s:#x}-{e:#x} (MADV_GUARD_INSTALL, VmFlags gu); guard regions are not restored"
                ),
            ));
        }
    }
    Ok(())
}

/// Which pages of mapping `v` a checkpoint stores (None: none, its data
/// is elsewhere). Dirty tracking (`crate::dirty`) follows the same rule.
pub(crate) fn page_filter(v: &Vma) -> Option<ScanFilter> {
    match (&v.backing, v.shared) {
        (VmaBacking::Anonymous, false) => Some(ScanFilter {
            required: 0,
            inverted: PAGE_IS_PFNZERO,
            any_of: PAGE_IS_PRESENT | PAGE_IS_SWAPPED,
        }),
        (VmaBacking::Anonymous, true) => {
            Some(ScanFilter { required: 0, inverted: 0, any_of: PAGE_IS_PRESENT | PAGE_IS_SWAPPED })
        }
        (
            VmaBacking::File { .. } | VmaBacking::Memfd { .. } | VmaBacking::DeletedFile { .. },
            false,
        ) => Some(ScanFilter {
            required: 0,
            inverted: PAGE_IS_FILE | PAGE_IS_PFNZERO,
            any_of: PAGE_IS_PRESENT | PAGE_IS_SWAPPED,
        }),
        _ => None,
    }
}

/// Largest run stored under one checksum; also the copy batch size.
const MAX_RUN: u64 = 256 << 10;

/// A piece of memory to store: at most MAX_RUN bytes inside one mapping.
#[derive(Clone, Copy)]
struct Piece {
    addr: u64,
    len: usize,
    /// Offset in pages.img's data area.
    offset: u64,
    /// Read with process_vm_readv; otherwise through /proc/PID/mem (for
    /// PROT_NONE memory, which needs FOLL_FORCE, and to keep pages shared).
    readable: bool,
}

/// Appends the range (start, end) as pieces of at most MAX_RUN bytes at
/// consecutive offsets after `base + *total`.
fn cut_into_pieces(
    pieces: &mut Vec<Piece>,
    total: &mut u64,
    base: u64,
    (s, e): (u64, u64),
    readable: bool,
) {
    let mut a = s;
    while a < e {
        let len = (e - a).min(MAX_RUN);
        pieces.push(Piece { addr: a, len: len as usize, offset: base + *total, readable });
        *total += len;
        a += len;
    }
}

/// Removes the page runs `skip` (sorted) from `ranges` ((start, end)).
fn subtract(ranges: Vec<(u64, u64)>, skip: &[PageSpan]) -> Vec<(u64, u64)> {
    if skip.is_empty() {
        return ranges;
    }
    let mut out = Vec::with_capacity(ranges.len());
    for (mut s, e) in ranges {
        let mut k = skip.partition_point(|r| r.end() <= s);
        while s < e {
            match skip.get(k) {
                Some(&PageSpan { start: a, pages: n }) if a < e => {
                    if a > s {
                        out.push((s, a));
                    }
                    s = s.max(a + n * 4096);
                    k += 1;
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

/// Copies the pages each mapping needs into pages.img, after what is
/// already there, leaving out `skip` (pages shared with the parent, which
/// the restored child inherits). Page copying is bound by page allocation
/// in the kernel, so it is split over threads.
///
/// With `keep_shared`, memory is read through /proc/PID/mem only:
/// process_vm_readv pins pages, and pinning an anonymous page that is
/// shared copy-on-write with another process makes the kernel give the
/// target its own copy (FAULT_FLAG_UNSHARE), which would both use memory
/// and hide the sharing from the parent/child comparison.
/// What [`dump_pages`] copied, and which present pages it left to the
/// receiver (sorted (address, pages) runs).
pub struct Dumped {
    pub runs: Vec<PageRun>,
    pub in_parent: Vec<PageSpan>,
}

// Each argument is a different input of the one copy (what to skip, what
// the receiver holds, where to write, whom to tell); a struct would only
// rename them at the single call site.
#[allow(clippy::too_many_arguments)]
pub fn dump_pages(
    pid: i32,
    vmas: &[Vma],
    smaps: &[MapsEntry],
    skip: &[PageSpan],
    held: Held<'_>,
    keep_shared: bool,
    out: &mut dyn PageSink,
    progress: Option<&crate::ProgressFn>,
) -> Result<Dumped> {
    let base = out.data_len();
    let pm_path = format!("/proc/{pid}/pagemap");
    let pagemap: std::os::fd::OwnedFd =
        std::fs::File::open(&pm_path).map_err(|e| EngineError::io(&pm_path, e))?.into();
    let mut pieces = Vec::new();
    let mut in_parent = Vec::new();
    let mut total = 0u64;
    let mut scanned = ScannedGroups::default();
    for (i, (v, m)) in vmas.iter().zip(smaps).enumerate() {
        let Some(filter) = page_filter(v) else {
            continue;
        };
        let (ranges, declared) = if held.whole {
            scan_mapping_held_whole(pid, &pagemap, v, filter, held)?
        } else {
            (scanned.of(pid, &pagemap, vmas, i, filter)?, Vec::new())
        };
        let wanted = subtract(ranges, skip);
        in_parent.extend(declared);
        in_parent.extend(intersect(&wanted, held.spans));
        for (s, e) in subtract(wanted, held.spans) {
            cut_into_pieces(&mut pieces, &mut total, base, (s, e), m.readable() && !keep_shared);
        }
    }
    let runs = copy_all(pid, &pieces, base, total, out, progress)?;
    out.set_data_len(base + total)?;
    Ok(Dumped { runs, in_parent })
}

/// The pages the receiver holds already (see
/// [`crate::capture::CaptureHooks::held_pages`]).
#[derive(Clone, Copy)]
pub struct Held<'a> {
    /// Sorted (address, pages) runs.
    pub spans: &'a [PageSpan],
    /// Every page of `spans` is the receiver's, present or not: they are
    /// not scanned (post-copy), and the whole runs are listed as the
    /// parent's.
    pub whole: bool,
}

/// (start, end) byte ranges.
type Ranges = Vec<(u64, u64)>;

/// The present pages of mapping `v` that `filter` selects, as (start,
/// end) ranges, when every held page is the receiver's (`held.whole`):
/// the held runs inside `v` are left unscanned and returned apart,
/// whole. (Otherwise [`ScannedGroups`] scans runs of mappings at once.)
fn scan_mapping_held_whole(
    pid: i32,
    pagemap: &std::os::fd::OwnedFd,
    v: &Vma,
    filter: ScanFilter,
    held: Held<'_>,
) -> Result<(Ranges, Vec<PageSpan>)> {
    let whole = [(v.start, v.end)];
    let (parts, declared) = (subtract(whole.to_vec(), held.spans), intersect(&whole, held.spans));
    let mut ranges = Vec::new();
    for (s, e) in parts {
        ranges.extend(pagemap::scan(pagemap, s, e, filter).map_err(|e2| {
            EngineError::kernel(pid, format!("scanning pages of {s:#x}-{e:#x}"), e2)
        })?);
    }
    Ok((ranges, declared))
}

/// One PAGEMAP_SCAN over a run of consecutive mappings that store
/// their pages by the same rule, instead of one per mapping: a process
/// has a hundred mappings (four per shared library), and a replication
/// sync scans them all in its pause.
#[derive(Default)]
struct ScannedGroups {
    /// The mappings `vmas[first..end]` the last scan covered, and what it
    /// found there (sorted (start, end) byte ranges).
    first: usize,
    end: usize,
    found: Vec<(u64, u64)>,
}

impl ScannedGroups {
    /// The pages of `vmas[i]` that `filter` selects. The scan covers
    /// `vmas[i]` and the mappings after it with the same filter; a gap
    /// between two of them (no mapping there) reports nothing, and what
    /// is reported is cut at each mapping's bounds, so no page outside
    /// them is ever taken.
    fn of(
        &mut self,
        pid: i32,
        pagemap: &std::os::fd::OwnedFd,
        vmas: &[Vma],
        i: usize,
        filter: ScanFilter,
    ) -> Result<Ranges> {
        if !(self.first..self.end).contains(&i) {
            let mut end = i + 1;
            while end < vmas.len()
                && vmas[end].start >= vmas[end - 1].end
                && page_filter(&vmas[end]) == Some(filter)
            {
                end += 1;
            }
            let (s, e) = (vmas[i].start, vmas[end - 1].end);
            self.found = pagemap::scan(pagemap, s, e, filter).map_err(|e2| {
                EngineError::kernel(pid, format!("scanning pages of {s:#x}-{e:#x}"), e2)
            })?;
            (self.first, self.end) = (i, end);
        }
        Ok(clip(&self.found, vmas[i].start, vmas[i].end))
    }
}

/// The parts of sorted `ranges` inside `[start, end)`.
fn clip(ranges: &[(u64, u64)], start: u64, end: u64) -> Ranges {
    let from = ranges.partition_point(|r| r.1 <= start);
    ranges[from..]
        .iter()
        .take_while(|r| r.0 < end)
        .map(|&(s, e)| (s.max(start), e.min(end)))
        .collect()
}

/// The parts of `ranges` ((start, end) byte ranges) inside the runs
/// `keep` (sorted), as page runs.
fn intersect(ranges: &[(u64, u64)], keep: &[PageSpan]) -> Vec<PageSpan> {
    let mut out = Vec::new();
    if keep.is_empty() {
        return out;
    }
    for &(s, e) in ranges {
        let mut k = keep.partition_point(|r| r.end() <= s);
        while let Some(r) = keep.get(k) {
            if r.start >= e {
                break;
            }
            let (lo, hi) = (s.max(r.start), e.min(r.end()));
            if lo < hi {
                out.push(PageSpan::new(lo, (hi - lo) / 4096));
            }
            k += 1;
        }
    }
    out
}

/// Copies `pieces` (consecutive offsets from `base`, `total` bytes) into
/// the sink, split over threads.
fn copy_all(
    pid: i32,
    pieces: &[Piece],
    base: u64,
    total: u64,
    out: &mut dyn PageSink,
    progress: Option<&crate::ProgressFn>,
) -> Result<Vec<PageRun>> {
    let workers = if total < (16 << 20) { 1 } else { crate::worker_threads() };
    let per = total / workers as u64 + 1;
    let mut parts: Vec<&[Piece]> = Vec::new();
    let mut rest: &[Piece] = pieces;
    for w in 0..workers {
        let limit = base + per * (w as u64 + 1);
        let k =
            if w + 1 == workers { rest.len() } else { rest.partition_point(|p| p.offset < limit) };
        let (a, b) = rest.split_at(k);
        parts.push(a);
        rest = b;
    }
    let writer: &dyn PageSink = out;
    let counter = crate::ProgressCounter::new(progress, total);
    let counter = &counter;
    // One part: copied here. A thread started for it waits for a core
    // (on a loaded machine, milliseconds of every replication sync).
    if let [part] = parts[..] {
        return copy_pieces(pid, part, writer, counter);
    }
    let results: Vec<Result<Vec<PageRun>>> = std::thread::scope(|sc| {
        let handles: Vec<_> = parts
            .into_iter()
            .map(|part| sc.spawn(move || copy_pieces(pid, part, writer, counter)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(EngineError::restore(pid, "page copy thread panicked")))
            })
            .collect()
    });
    let mut runs = Vec::with_capacity(pieces.len());
    for r in results {
        runs.extend(r?);
    }
    Ok(runs)
}

/// Copies the present pages of a process, which may be running, that lie
/// inside `only` (sorted (start, end) byte ranges; None: all the memory a
/// checkpoint stores) into the sink, shared mappings left out. Returns
/// the (start, end) ranges copied. Pre-copy uses this for its rounds; pages written meanwhile are
/// caught by dirty tracking and copied again.
///
/// With `keep_shared` (a tree of several processes), memory is read
/// through /proc/PID/mem only, as in [`dump_pages`]: process_vm_readv
/// would break the copy-on-write sharing between parent and child.
pub fn copy_present(
    pid: i32,
    only: Option<&[(u64, u64)]>,
    keep_shared: bool,
    out: &mut dyn PageSink,
    progress: Option<&crate::ProgressFn>,
) -> Result<Vec<(u64, u64)>> {
    let smaps = crate::procfs::smaps(pid)?;
    let vmas = classify(pid, &smaps)?;
    let base = out.data_len();
    let pm_path = format!("/proc/{pid}/pagemap");
    let pagemap: std::os::fd::OwnedFd =
        std::fs::File::open(&pm_path).map_err(|e| EngineError::io(&pm_path, e))?.into();
    let mut pieces = Vec::new();
    let mut copied = Vec::new();
    let mut total = 0u64;
    for (v, m) in vmas.iter().zip(&smaps) {
        // Shared memory is not write-tracked (dirty.rs): it is copied in
        // the freeze only; so is a PROT_NONE mapping, which the tracker
        // registers only once it can be accessed.
        if v.shared || &m.perms[..3] == b"---" {
            continue;
        }
        let Some(filter) = page_filter(v) else {
            continue;
        };
        if let Some(only) = only {
            let k = only.partition_point(|&(_, e)| e <= v.start);
            if only.get(k).is_none_or(|&(s, _)| s >= v.end) {
                continue;
            }
        }
        let ranges = pagemap::scan(&pagemap, v.start, v.end, filter).map_err(|e| {
            EngineError::kernel(pid, format!("scanning pages of {:#x}-{:#x}", v.start, v.end), e)
        })?;
        let ranges = match only {
            Some(only) => {
                let keep: Vec<PageSpan> =
                    only.iter().map(|&(s, e)| PageSpan::new(s, (e - s) / 4096)).collect();
                intersect(&ranges, &keep).into_iter().map(|r| (r.start, r.end())).collect()
            }
            None => ranges,
        };
        for (s, e) in ranges {
            copied.push((s, e));
            cut_into_pieces(&mut pieces, &mut total, base, (s, e), m.readable() && !keep_shared);
        }
    }
    copy_all(pid, &pieces, base, total, out, progress)?;
    out.set_data_len(base + total)?;
    Ok(copied)
}

fn copy_pieces(
    pid: i32,
    pieces: &[Piece],
    out: &dyn PageSink,
    progress: &crate::ProgressCounter,
) -> Result<Vec<PageRun>> {
    let mut runs = Vec::with_capacity(pieces.len());
    let mut buf = vec![0u8; MAX_RUN as usize * 2];
    let mut readback = vec![0u8; MAX_RUN as usize * 2];
    let mem_path = format!("/proc/{pid}/mem");
    let mut mem: Option<std::fs::File> = None;
    let mut i = 0;
    while i < pieces.len() {
        let first = pieces[i];
        if !first.readable {
            let f = match &mem {
                Some(f) => f,
                None => mem.insert(
                    std::fs::File::open(&mem_path).map_err(|e| EngineError::io(&mem_path, e))?,
                ),
            };
            let chunk = &mut buf[..first.len];
            f.read_exact_at(chunk, first.addr)
                .map_err(|e| EngineError::io(format!("{mem_path} at {:#x}", first.addr), e))?;
            let new = out.write_runs_at(pid, first.offset, &[(first.addr, first.len)], chunk)?;
            out.verify_written(&new, &mut readback)?;
            runs.extend(new);
            progress.add(first.len as u64);
            i += 1;
            continue;
        }
        let mut batch: Vec<RemoteRange> = Vec::new();
        let mut bytes = 0usize;
        while i < pieces.len()
            && pieces[i].readable
            && batch.len() < vm::MAX_IOV
            && bytes + pieces[i].len <= buf.len()
        {
            batch.push(RemoteRange { addr: pieces[i].addr, len: pieces[i].len });
            bytes += pieces[i].len;
            i += 1;
        }
        let t0 = std::time::Instant::now();
        let n = vm::read_remote(pid, &mut buf[..bytes], &batch).map_err(|e| {
            EngineError::kernel(pid, format!("reading memory at {:#x}", batch[0].addr), e)
        })?;
        if n != bytes {
            return Err(EngineError::kernel(
                pid,
                format!("short memory read near {:#x}", batch[0].addr),
                ferry_sys::SysError::new("process_vm_readv", libc::EFAULT),
            ));
        }
        let ranges: Vec<(u64, usize)> = batch.iter().map(|r| (r.addr, r.len)).collect();
        // Read each batch back while it is still in cache: the image is
        // verified on disk before the process may be killed.
        let t1 = std::time::Instant::now();
        let new = out.write_runs_at(pid, first.offset, &ranges, &buf[..bytes])?;
        let t2 = std::time::Instant::now();
        out.verify_written(&new, &mut readback)?;
        let t3 = std::time::Instant::now();
        tracing::trace!(
            "batch {bytes} B: read {:?} write+hash {:?} read back+check {:?}",
            t1 - t0,
            t2 - t1,
            t3 - t2
        );
        runs.extend(new);
        progress.add(bytes as u64);
    }
    Ok(runs)
}

/// The mm fields restore hands to PR_SET_MM_MAP.
pub fn mm_layout(pid: i32, brk: u64) -> Result<MmLayout> {
    let st = Stat::read(pid)?;
    let auxv_path = format!("/proc/{pid}/auxv");
    let auxv_bytes = std::fs::read(&auxv_path).map_err(|e| EngineError::io(&auxv_path, e))?;
    let mut auxv: Vec<u64> = auxv_bytes
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect();
    // Keep up to and including AT_NULL.
    if let Some(end) = auxv.chunks_exact(2).position(|p| p[0] == 0) {
        auxv.truncate(end * 2 + 2);
    }
    Ok(MmLayout {
        start_code: st.field(26),
        end_code: st.field(27),
        start_stack: st.field(28),
        start_data: st.field(45),
        end_data: st.field(46),
        start_brk: st.field(47),
        brk,
        arg_start: st.field(48),
        arg_end: st.field(49),
        env_start: st.field(50),
        env_end: st.field(51),
        auxv,
    })
}

/// Whether the child's mapping `c` came from the parent's `p` over fork:
/// same place, same kind of memory, and not dropped from children.
fn same_origin(c: &Vma, p: &Vma) -> bool {
    let same_backing = match (&c.backing, &p.backing) {
        (VmaBacking::Anonymous, VmaBacking::Anonymous) => true,
        (VmaBacking::File { dev: d1, ino: i1, .. }, VmaBacking::File { dev: d2, ino: i2, .. }) => {
            d1 == d2 && i1 == i2 && c.pgoff == p.pgoff
        }
        (VmaBacking::Memfd { id: a }, VmaBacking::Memfd { id: b }) => a == b && c.pgoff == p.pgoff,
        (VmaBacking::DeletedFile { id: a }, VmaBacking::DeletedFile { id: b }) => {
            a == b && c.pgoff == p.pgoff
        }
        _ => false,
    };
    same_backing
        && c.start == p.start
        && c.end == p.end
        && !c.shared
        && !p.shared
        && p.flags & (vmflag::DONTFORK | vmflag::WIPEONFORK) == 0
}

fn pagemap_entries(pid: i32, file: &std::fs::File, start: u64, end: u64) -> Result<Vec<u64>> {
    let n = ((end - start) / 4096) as usize;
    let mut buf = vec![0u8; n * 8];
    file.read_exact_at(&mut buf, start / 4096 * 8)
        .map_err(|e| EngineError::io(format!("/proc/{pid}/pagemap at {start:#x}"), e))?;
    Ok(buf.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes"))).collect())
}

/// The child's private mappings that still share pages with the parent
/// (copy-on-write since fork): same physical page at the same address in
/// both, as /proc/PID/pagemap shows to root.
pub fn inherited_from_parent(
    child: i32,
    cvmas: &[Vma],
    parent: i32,
    pvmas: &[Vma],
) -> Result<Vec<ferry_image::InheritedVma>> {
    const PRESENT: u64 = 1 << 63;
    const PFN: u64 = (1 << 55) - 1;
    let open = |pid: i32| {
        let path = format!("/proc/{pid}/pagemap");
        std::fs::File::open(&path).map_err(|e| EngineError::io(&path, e))
    };
    let (cpm, ppm) = (open(child)?, open(parent)?);
    let mut out = Vec::new();
    for c in cvmas {
        if !pvmas.iter().any(|p| same_origin(c, p)) {
            continue;
        }
        let ce = pagemap_entries(child, &cpm, c.start, c.end)?;
        let pe = pagemap_entries(parent, &ppm, c.start, c.end)?;
        let mut runs: Vec<PageSpan> = Vec::new();
        for (i, (a, b)) in ce.iter().zip(&pe).enumerate() {
            let shared = a & PRESENT != 0 && b & PRESENT != 0 && a & PFN != 0 && a & PFN == b & PFN;
            if !shared {
                continue;
            }
            let addr = c.start + i as u64 * 4096;
            match runs.last_mut() {
                Some(r) if r.end() == addr => r.pages += 1,
                _ => runs.push(PageSpan::new(addr, 1)),
            }
        }
        out.push(ferry_image::InheritedVma { start: c.start, end: c.end, shared_pages: runs });
    }
    Ok(out)
}

/// Locked memory of a process (VmLck in /proc/PID/status), in kB.
pub fn locked_kb(pid: i32) -> Result<u64> {
    let path = format!("/proc/{pid}/status");
    let text = crate::procfs::read_string(&path)?;
    Ok(crate::procfs::key_values(&text)
        .get("VmLck")
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0))
}

/// mlockall(MCL_FUTURE) shows nowhere in /proc but in the mappings made
/// after it: ferry's scratch mapping, just made, comes out locked, and the
/// process's locked memory grows by it (`locked_before` was read before
/// the scratch mapping; the process is frozen, nothing else locks).
/// Future locking is not restored, so such a process is refused. (Locked
/// mappings themselves are recorded, VmFlags "lo", and locked again.)
/// Reading VmLck costs nothing; smaps would walk every page again.
pub fn check_mlock_future(pid: i32, locked_before: u64) -> Result<()> {
    if locked_kb(pid)? > locked_before {
        return Err(EngineError::unsupported(
            pid,
            "its memory locking",
            "mlockall(MCL_FUTURE) is in effect; locking of future mappings is not restored",
        ));
    }
    Ok(())
}

/// About how many bytes of pages a full capture of `pids` stores, for
/// the sink to make room for while the tree runs: their anonymous pages
/// (statm's resident less its file-backed and shared part). An estimate
/// the sink trims: pages a parent and its child share copy-on-write count
/// twice, swapped ones not at all, a process that cannot be read nothing.
pub(super) fn stored_bytes_estimate(pids: &[i32]) -> u64 {
    let pages: u64 = pids
        .iter()
        .filter_map(|pid| crate::procfs::read_string(&format!("/proc/{pid}/statm")).ok())
        .filter_map(|text| anonymous_pages_of_statm(&text))
        .sum();
    pages.saturating_mul(4096)
}

/// Resident less shared pages of a /proc/PID/statm line.
fn anonymous_pages_of_statm(text: &str) -> Option<u64> {
    let mut fields = text.split_whitespace().skip(1).map(str::parse::<u64>);
    let resident = fields.next()?.ok()?;
    let shared = fields.next()?.ok()?;
    Some(resident.saturating_sub(shared))
}

#[cfg(test)]
mod tests {
    use super::{anonymous_pages_of_statm, clip, intersect, subtract};
    use ferry_image::PageSpan;

    /// A group's scan is cut at each mapping's bounds: a run across two
    /// mappings splits, one in a gap or outside is dropped.
    #[test]
    fn a_group_scan_is_clipped_to_each_mapping() {
        let found = [(0x1000, 0x3000), (0x5000, 0x9000), (0xa000, 0xb000)];
        assert_eq!(clip(&found, 0x2000, 0x6000), vec![(0x2000, 0x3000), (0x5000, 0x6000)]);
        assert_eq!(clip(&found, 0x6000, 0xa000), vec![(0x6000, 0x9000)]);
        assert_eq!(clip(&found, 0x3000, 0x5000), vec![]);
        assert_eq!(clip(&found, 0xb000, 0xc000), vec![]);
        assert_eq!(clip(&[], 0, 0x1000), vec![]);
    }
    const P: u64 = 4096;
    const fn sp(start: u64, pages: u64) -> PageSpan {
        PageSpan::new(start, pages)
    }

    #[test]
    fn held_pages_split_into_parent_and_sent() {
        let ranges = vec![(0, 10 * P), (20 * P, 30 * P)];
        let held = [sp(2 * P, 3), sp(8 * P, 14), sp(25 * P, 100)];
        assert_eq!(
            intersect(&ranges, &held),
            vec![sp(2 * P, 3), sp(8 * P, 2), sp(20 * P, 2), sp(25 * P, 5)]
        );
        assert_eq!(subtract(ranges, &held), vec![(0, 2 * P), (5 * P, 8 * P), (22 * P, 25 * P)]);
    }

    #[test]
    fn nothing_held_sends_everything() {
        assert!(intersect(&[(0, 4 * P)], &[]).is_empty());
        assert_eq!(subtract(vec![(0, 4 * P)], &[]), vec![(0, 4 * P)]);
    }

    #[test]
    fn the_estimate_counts_resident_pages_that_are_not_shared() {
        assert_eq!(anonymous_pages_of_statm("6181 4098 1028 433 0 4336 0\n"), Some(3070));
        assert_eq!(anonymous_pages_of_statm("10 5 9 1 0 2 0"), Some(0));
        assert_eq!(anonymous_pages_of_statm("10 5"), None);
        assert_eq!(anonymous_pages_of_statm("10 x 1"), None);
    }
}
