//! Memory: clear the forked address space, put the kernel's vDSO where the
//! image had it, map every mapping at its address, copy the stored pages
//! in, then set final protections and the mm layout (brk, stack, args,
//! auxv, exe) with PR_SET_MM_MAP.

use super::Session;
use crate::error::{EngineError, Result};
use crate::inject::{self, Call};
use crate::procfs;
use ferry_image::{vmflag, PageRun, Vma, VmaBacking, PROT_WRITE};
use ferry_sys::uffd;
use ferry_sys::vm::{self, RemoteRange};
use std::os::fd::AsFd;

const MAP_FIXED_NOREPLACE: u64 = 0x100000;

/// Injected calls with their names, for one batch.
pub type Calls = Vec<(String, Call)>;

/// A range (start, length) and the protection to give it once its pages
/// are in.
pub type Reprotect = (u64, u64, u8);

fn is_special(path: &str) -> bool {
    matches!(path, "[vdso]" | "[vvar]" | "[vvar_vclock]" | "[vsyscall]")
}

/// Unmaps everything the fork brought along except the kernel's own
/// mappings (vDSO, vvar), which we keep and move, and the `keep` ranges
/// (sorted): mappings a child inherited from its parent and keeps.
/// Returns the calls, for the process to make first in the batch that
/// also places the vDSO and maps the image ([`vdso_calls`], [`map_calls`]),
/// and the kernel's mappings as they are now, for [`vdso_calls`].
pub fn clear_calls(
    s: &mut Session,
    keep: &[(u64, u64)],
) -> Result<(Calls, Vec<procfs::MapsEntry>)> {
    let (maps, first) = match s.forked.take() {
        Some(f) => (f.maps, f.rseq_drop),
        None => (procfs::maps(s.pid)?, None),
    };
    let mut ranges: Vec<(u64, u64)> = Vec::new();
    let scratch = s.scratch;
    let left = fault_kept_mapping(s, &maps);
    for m in maps.iter().filter(|m| !is_special(&m.path) && m.start != scratch && m.start != left) {
        // The parts of m outside every kept range.
        let mut a = m.start;
        for &(ks, ke) in keep.iter().filter(|&&(ks, ke)| ks < m.end && ke > m.start) {
            if ks > a {
                push_range(&mut ranges, a, ks);
            }
            a = a.max(ke);
        }
        if a < m.end {
            push_range(&mut ranges, a, m.end);
        }
    }
    let calls: Vec<(String, Call)> =
        first
            .into_iter()
            .chain(ranges.iter().map(|&(a, e)| {
                (format!("munmap({a:#x})"), Call::new(libc::SYS_munmap, &[a, e - a]))
            }))
            .collect();
    Ok((calls, maps.into_iter().filter(|m| is_special(&m.path)).collect()))
}

/// Fault injection for tests: `FERRY_FAULT_KEEP_FORKED_MAPPING=1` leaves
/// one of ferry's own anonymous mappings (one the image does not overlap) in the
/// cleared address space, the bug a clearing from a stale list of the
/// fork's mappings would make; the restore's own check must catch it.
/// Returns its start (0: none, no mapping starts there).
fn fault_kept_mapping(s: &Session, maps: &[procfs::MapsEntry]) -> u64 {
    if std::env::var_os("FERRY_FAULT_KEEP_FORKED_MAPPING").is_none_or(|v| v != "1") {
        return 0;
    }
    let image = &s.image.vmas;
    maps.iter()
        .filter(|m| m.inode == 0 && !is_special(&m.path) && m.start != s.scratch)
        .find(|m| !image.iter().any(|v| v.start < m.end && v.end > m.start))
        .map_or(0, |m| m.start)
}

fn push_range(ranges: &mut Vec<(u64, u64)>, a: u64, e: u64) {
    match ranges.last_mut() {
        Some(last) if last.1 == a => last.1 = e,
        _ => ranges.push((a, e)),
    }
}

/// Lowest gap of `len` bytes (plus a guard page each side) above 256 MiB
/// that neither the image nor the process's current mappings (`current`,
/// its maps) use.
pub fn free_gap<'v>(
    pid: i32,
    vmas: impl Iterator<Item = &'v Vma>,
    current: &[procfs::MapsEntry],
    len: u64,
) -> Result<u64> {
    let mut used: Vec<(u64, u64)> = vmas.map(|v| (v.start, v.end)).collect();
    used.extend(current.iter().map(|m| (m.start, m.end)));
    used.sort_unstable();
    let mut cand = 0x1000_0000u64;
    for (a, e) in used {
        if e + 4096 <= cand {
            continue;
        }
        if a >= cand + len + 4096 {
            break;
        }
        cand = (e + 4096).max(cand);
    }
    if cand + len >= ferry_image::validate::USER_ADDR_END {
        return Err(EngineError::restore(
            pid,
            "no free address range for the restore scratch area",
        ));
    }
    Ok(cand)
}

/// The calls that move this kernel's vDSO and vvar pages to where the
/// image had them, and the syscall instruction's address once they ran.
/// `kernel`: the process's kernel mappings now (from [`clear_calls`]).
pub fn vdso_calls(s: &Session, vmas: &[Vma], kernel: &[procfs::MapsEntry]) -> Result<(Calls, u64)> {
    let pid = s.pid;
    let cur: Vec<(String, u64, u64)> = kernel
        .iter()
        .filter(|m| is_special(&m.path) && m.path != "[vsyscall]")
        .map(|m| (m.path.clone(), m.start, m.end))
        .collect();
    let want: Vec<(String, u64, u64)> = vmas
        .iter()
        .filter_map(|v| match &v.backing {
            VmaBacking::Vdso => Some(("[vdso]".to_string(), v.start, v.end)),
            VmaBacking::Vvar { name } => Some((name.clone(), v.start, v.end)),
            _ => None,
        })
        .collect();
    let layout =
        |l: &[(String, u64, u64)]| l.iter().map(|(n, a, e)| (n.clone(), e - a)).collect::<Vec<_>>();
    if layout(&cur) != layout(&want) {
        return Err(EngineError::restore(
            pid,
            format!("the image's vDSO layout {:?} differs from this kernel's {:?}; restore on a machine with the same kernel", layout(&want), layout(&cur)),
        ));
    }
    if cur.iter().zip(&want).all(|(c, w)| c.1 == w.1) {
        return Ok((Vec::new(), s.remote.syscall_ip));
    }
    let cur_lo = cur.iter().map(|c| c.1).min().unwrap_or(0);
    let cur_hi = cur.iter().map(|c| c.2).max().unwrap_or(0);
    let want_lo = want.iter().map(|c| c.1).min().unwrap_or(0);
    let want_hi = want.iter().map(|c| c.2).max().unwrap_or(0);
    let vdso_old = cur.iter().find(|c| c.0 == "[vdso]").map(|c| c.1).unwrap_or(0);
    let vdso_new = want.iter().find(|c| c.0 == "[vdso]").map(|c| c.1).unwrap_or(0);
    let syscall_off = s.remote.syscall_ip - vdso_old;
    let mut calls: Vec<(String, Call)> = Vec::new();
    let mut mremap = |from: u64, len: u64, to: u64| {
        let flags = (libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED) as u64;
        calls.push((
            format!("mremap({from:#x} -> {to:#x})"),
            Call::new(libc::SYS_mremap, &[from, len, len, flags, to]),
        ));
    };
    // Go through a parking spot when old and new places overlap. All
    // moves run as one batch: the batch code is in the scratch area, not
    // in the vDSO being moved.
    let overlap = cur_lo < want_hi && want_lo < cur_hi;
    let mut now: Vec<u64> = cur.iter().map(|c| c.1).collect();
    if overlap {
        let park = 0x1000_0000_0000u64;
        for (i, c) in cur.iter().enumerate() {
            let to = park + (c.1 - cur_lo);
            mremap(now[i], c.2 - c.1, to);
            now[i] = to;
        }
    }
    for (i, c) in cur.iter().enumerate() {
        mremap(now[i], c.2 - c.1, want[i].1);
    }
    Ok((calls, vdso_new + syscall_off))
}

fn has_pages(v: &Vma, runs: &[PageRun]) -> bool {
    let i = runs.partition_point(|r| r.start < v.start);
    runs.get(i).is_some_and(|r| r.start < v.end)
}

/// The calls that map every mapping of the image but those in
/// `inherited` (sorted ranges a forked child already has), writable first
/// where pages must be copied in; and the protections to set once pages
/// are in.
pub fn map_calls(
    s: &Session,
    vmas: &[Vma],
    runs: &[PageRun],
    inherited: &[(u64, u64)],
) -> Result<(Calls, Vec<Reprotect>)> {
    let mut reprotect = Vec::new();
    let mut calls: Vec<(String, Call)> = Vec::new();
    for v in vmas {
        if inherited.binary_search(&(v.start, v.end)).is_ok() {
            continue;
        }
        let fd: i64 = match &v.backing {
            VmaBacking::Vdso | VmaBacking::Vvar { .. } | VmaBacking::Vsyscall => continue,
            VmaBacking::Anonymous => -1,
            VmaBacking::SharedAnon { id } => s.staging_fd(&shmem_key(*id), true)? as i64,
            VmaBacking::SysvShm { id } => {
                // shmat maps the whole segment at the address; the image's
                // protection of each part is set afterwards.
                if v.pgoff == 0 {
                    calls.push(shmat_call(v, *id));
                }
                reprotect.push((v.start, v.end - v.start, v.prot));
                continue;
            }
            VmaBacking::File { path, .. } => s.staging_fd(path, needs_rw(v))? as i64,
            VmaBacking::Memfd { id } => s.staging_fd(&memfd_key(*id), true)? as i64,
            VmaBacking::DeletedFile { id } => s.staging_fd(&deleted_key(*id), true)? as i64,
        };
        let mut prot = v.prot;
        if has_pages(v, runs) && prot & PROT_WRITE == 0 {
            prot |= PROT_WRITE | ferry_image::PROT_READ;
            reprotect.push((v.start, v.end - v.start, v.prot));
        }
        calls.push(mmap_call(v, fd, prot));
        calls.extend(madvise_calls(v));
    }
    // MAP_FIXED_NOREPLACE: a mapping that lands anywhere else fails with EEXIST.
    Ok((calls, reprotect))
}

/// shmat of System V segment `id` at the mapping's address.
fn shmat_call(v: &Vma, id: i32) -> (String, Call) {
    let mut flags = SHM_REMAP;
    if v.prot & PROT_WRITE == 0 {
        flags |= libc::SHM_RDONLY as u64;
    }
    if v.prot & ferry_image::PROT_EXEC != 0 {
        flags |= SHM_EXEC;
    }
    (
        format!("shmat(segment {id} at {:#x})", v.start),
        Call::new(libc::SYS_shmat, &[id as u64, v.start, flags]),
    )
}

/// mmap of the mapping at its address, from `fd` (-1: anonymous) with
/// protection `prot`.
fn mmap_call(v: &Vma, fd: i64, prot: u8) -> (String, Call) {
    let mut flags =
        MAP_FIXED_NOREPLACE | if v.shared { libc::MAP_SHARED } else { libc::MAP_PRIVATE } as u64;
    if fd < 0 {
        flags |= libc::MAP_ANONYMOUS as u64;
    }
    if v.flags & vmflag::GROWSDOWN != 0 {
        flags |= libc::MAP_GROWSDOWN as u64;
    }
    if v.flags & vmflag::NORESERVE != 0 {
        flags |= libc::MAP_NORESERVE as u64;
    }
    let pgoff = if fd < 0 { 0 } else { v.pgoff };
    (
        format!("mmap({:#x}-{:#x})", v.start, v.end),
        Call::new(
            libc::SYS_mmap,
            &[v.start, v.end - v.start, prot as u64, flags, fd as u64, pgoff],
        ),
    )
}

/// The madvise calls that give the mapping its recorded VM flags back.
fn madvise_calls(v: &Vma) -> impl Iterator<Item = (String, Call)> + '_ {
    [
        (vmflag::DONTFORK, libc::MADV_DONTFORK),
        (vmflag::DONTDUMP, libc::MADV_DONTDUMP),
        (vmflag::WIPEONFORK, libc::MADV_WIPEONFORK),
        (vmflag::HUGEPAGE, libc::MADV_HUGEPAGE),
        (vmflag::NOHUGEPAGE, libc::MADV_NOHUGEPAGE),
        (vmflag::MERGEABLE, libc::MADV_MERGEABLE),
        (vmflag::SEQ_READ, libc::MADV_SEQUENTIAL),
        (vmflag::RAND_READ, libc::MADV_RANDOM),
    ]
    .into_iter()
    .filter(|&(bit, advice)| v.flags & bit != 0 && !fault_skips_madvise(advice))
    .map(|(_, advice)| {
        (
            format!("madvise({:#x}, {advice})", v.start),
            Call::new(libc::SYS_madvise, &[v.start, v.end - v.start, advice as u64]),
        )
    })
}

/// Fault injection for tests: `FERRY_FAULT_SKIP_MADVISE=ADVICE` (its
/// number) leaves that advice out, the very bug the restore's own check
/// (`restore/verify`) must catch before the tree runs.
fn fault_skips_madvise(advice: i32) -> bool {
    std::env::var("FERRY_FAULT_SKIP_MADVISE").is_ok_and(|v| v == advice.to_string())
}

const SHM_REMAP: u64 = 0o40000;
const SHM_EXEC: u64 = 0o100000;

/// Staging key of a memfd: memfds are recreated by ferry before the fork.
/// Staging key of a recreated deleted file (by its old inode).
pub fn deleted_key(id: u64) -> String {
    format!("deleted file {id}")
}

pub fn memfd_key(id: u64) -> String {
    format!("memfd:{id}")
}

/// Staging key of an anonymous shared memory object.
pub fn shmem_key(id: u64) -> String {
    format!("shmem:{id}")
}

/// Prepares the private mappings a forked child inherited from its
/// parent: pages it does not share with the parent are dropped (zero or
/// file content again; its own copies come from the image next), and the
/// child's protection is set, writable first where pages go in. Returns
/// the protections to set once pages are in.
pub fn prepare_inherited(s: &mut Session, runs: &[PageRun]) -> Result<Vec<(u64, u64, u8)>> {
    let mut calls: Vec<(String, Call)> = Vec::new();
    let mut reprotect = Vec::new();
    for iv in &s.image.inherited {
        let Some(v) = s.image.vmas.iter().find(|v| v.start == iv.start && v.end == iv.end) else {
            continue;
        };
        let mut a = iv.start;
        let drop_range = |from: u64, to: u64, calls: &mut Vec<(String, Call)>| {
            if to > from {
                calls.push((
                    format!("madvise({from:#x}, MADV_DONTNEED)"),
                    Call::new(libc::SYS_madvise, &[from, to - from, libc::MADV_DONTNEED as u64]),
                ));
            }
        };
        for &ferry_image::PageSpan { start, pages } in &iv.shared_pages {
            drop_range(a, start, &mut calls);
            a = start + pages * 4096;
        }
        drop_range(a, iv.end, &mut calls);
        let mut prot = v.prot;
        if has_pages(v, runs) && prot & PROT_WRITE == 0 {
            prot |= PROT_WRITE | ferry_image::PROT_READ;
            reprotect.push((v.start, v.end - v.start, v.prot));
        }
        calls.push((
            format!("mprotect({:#x})", v.start),
            Call::new(libc::SYS_mprotect, &[v.start, v.end - v.start, prot as u64]),
        ));
    }
    s.run(s.pid, &calls)?;
    Ok(reprotect)
}

pub fn needs_rw(v: &Vma) -> bool {
    v.shared && (v.prot & PROT_WRITE != 0 || v.flags & vmflag::MAYWRITE != 0)
}

/// Copies every stored page into place, from several threads for large
/// images. Pages of private anonymous mappings (mapped just now, so still
/// empty) are placed with UFFDIO_COPY through a userfaultfd of the process:
/// the kernel allocates each page and copies into it, without zeroing it
/// first and without a page fault per page as process_vm_writev has
/// (zeroing and faults were about a third of the restore's CPU time).
/// Every other run (file-backed private copies, shared memory, mappings a
/// child inherited, or everything if the userfaultfd cannot be had) goes
/// out with process_vm_writev, up to 1024 runs stored back to back per
/// call. `kept`: the ranges a forked child inherited (sorted).
pub fn write_pages_in(
    s: &mut Session,
    runs: &[PageRun],
    data: &[u8],
    kept: &[(u64, u64)],
    progress: Option<&crate::ProgressFn>,
) -> Result<()> {
    let total: u64 = runs.iter().map(|r| r.pages * 4096).sum();
    let areas: Vec<(u64, u64)> = s
        .image
        .vmas
        .iter()
        .filter(|v| matches!(v.backing, VmaBacking::Anonymous) && !v.shared && has_pages(v, runs))
        .filter(|v| kept.binary_search(&(v.start, v.end)).is_err())
        .map(|v| (v.start, v.end))
        .collect();
    if total < (1 << 20) || areas.is_empty() || std::env::var_os("FERRY_NO_UFFD_COPY").is_some() {
        return write_pages(s.pid, runs, data, progress);
    }
    let Some(uffd) = uffd_for(s)? else {
        tracing::debug!("pid {}: no userfaultfd, pages go in with process_vm_writev", s.pid);
        return write_pages(s.pid, runs, data, progress);
    };
    let pid = s.pid;
    let Registered { areas: registered, all_copy: ok } = register_all(uffd.as_fd(), &areas);
    let result = if ok {
        let counter = crate::ProgressCounter::new(progress, total);
        let workers = if total < (16 << 20) { 1 } else { crate::worker_threads() };
        let to = UffdTarget { pid, fd: uffd.as_fd(), areas: &areas };
        copy_via_uffd(&to, runs, data, &counter, workers)
    } else {
        Ok(())
    };
    for &(a, e) in &registered {
        uffd::unregister(uffd.as_fd(), a, e - a).map_err(|err| {
            EngineError::kernel(
                pid,
                format!("unregistering {a:#x}-{e:#x} from the userfaultfd"),
                err,
            )
        })?;
    }
    drop(uffd);
    result?;
    if !ok {
        tracing::debug!("pid {pid}: a mapping could not be registered with the userfaultfd, pages go in with process_vm_writev");
        return write_pages(pid, runs, data, progress);
    }
    Ok(())
}

/// The mappings registered with a userfaultfd, and whether all were and
/// each allows UFFDIO_COPY.
struct Registered {
    areas: Vec<(u64, u64)>,
    all_copy: bool,
}

/// Registers `areas` for missing-page faults, stopping at the first that
/// cannot be or does not allow UFFDIO_COPY.
fn register_all(fd: std::os::fd::BorrowedFd<'_>, areas: &[(u64, u64)]) -> Registered {
    let mut registered = Vec::new();
    for &(a, e) in areas {
        match uffd::register(fd, a, e - a, uffd::UFFDIO_REGISTER_MODE_MISSING) {
            Ok(ioctls) if ioctls & (1 << 0x03) != 0 => registered.push((a, e)),
            Ok(_) => {
                registered.push((a, e));
                return Registered { areas: registered, all_copy: false };
            }
            Err(_) => return Registered { areas: registered, all_copy: false },
        }
    }
    Registered { areas: registered, all_copy: true }
}

/// A process's userfaultfd and the (sorted) mappings registered with it.
struct UffdTarget<'a> {
    pid: i32,
    fd: std::os::fd::BorrowedFd<'a>,
    areas: &'a [(u64, u64)],
}

/// Writes `runs`: those inside a registered mapping through the
/// userfaultfd on `workers` threads, the others with process_vm_writev.
fn copy_via_uffd(
    to: &UffdTarget,
    runs: &[PageRun],
    data: &[u8],
    counter: &crate::ProgressCounter,
    workers: usize,
) -> Result<()> {
    let (pid, fd, areas) = (to.pid, to.fd, to.areas);
    // Runs inside a registered mapping go through the userfaultfd.
    let (via_uffd, other): (Vec<PageRun>, Vec<PageRun>) = runs.iter().partition(|r| {
        let k = areas.partition_point(|&(_, e)| e <= r.start);
        areas.get(k).is_some_and(|&(a, e)| a <= r.start && r.start + r.pages * 4096 <= e)
    });
    let parts = split_runs(&via_uffd, workers);
    std::thread::scope(|sc| {
        let handles: Vec<_> = parts
            .into_iter()
            .map(|part| sc.spawn(move || copy_runs(pid, fd, part, data, counter)))
            .collect();
        let r = if other.is_empty() { Ok(()) } else { write_runs(pid, &other, data, counter) };
        handles.into_iter().fold(r, |acc, h| {
            acc.and(
                h.join().unwrap_or_else(|_| {
                    Err(EngineError::restore(pid, "page copy thread panicked"))
                }),
            )
        })
    })
}

/// A userfaultfd of the process's address space: `userfaultfd()` run
/// inside it, taken with pidfd_getfd, and its own copy closed again. None
/// when the kernel refuses one (the caller falls back to
/// process_vm_writev).
fn uffd_for(s: &mut Session) -> Result<Option<std::os::fd::OwnedFd>> {
    let pid = s.pid;
    let flags = (libc::O_CLOEXEC | libc::O_NONBLOCK) as u64;
    let fd = match s.run(pid, &[("userfaultfd".into(), Call::new(libc::SYS_userfaultfd, &[flags]))])
    {
        Ok(r) => r[0],
        Err(EngineError::Remote { .. }) => return Ok(None),
        Err(e) => return Err(e),
    };
    let taken = ferry_sys::pidfd::pidfd_open(pid)
        .and_then(|pidfd| ferry_sys::pidfd::pidfd_getfd(&pidfd, fd as i32))
        .map_err(|e| EngineError::kernel(pid, format!("taking its new userfaultfd (fd {fd})"), e));
    // Close the process's copy whether or not we got ours.
    s.run(pid, &[("close(userfaultfd)".into(), Call::new(libc::SYS_close, &[fd]))])?;
    let taken = taken?;
    if uffd::api(taken.as_fd(), 0).is_err() {
        return Ok(None);
    }
    Ok(Some(taken))
}

/// `runs` cut into `workers` parts of about the same number of bytes.
fn split_runs(runs: &[PageRun], workers: usize) -> Vec<&[PageRun]> {
    let total: u64 = runs.iter().map(|r| r.pages * 4096).sum();
    let per = total / workers as u64 + 1;
    let mut parts = Vec::new();
    let mut rest = runs;
    let mut done = 0u64;
    for w in 0..workers {
        let mut k = 0;
        let mut bytes = 0u64;
        while k < rest.len() && (w + 1 == workers || done + bytes < per * (w as u64 + 1)) {
            bytes += rest[k].pages * 4096;
            k += 1;
        }
        let (a, b) = rest.split_at(k);
        parts.push(a);
        rest = b;
        done += bytes;
    }
    parts
}

/// UFFDIO_COPY of each run into its (still empty) place.
fn copy_runs(
    pid: i32,
    fd: std::os::fd::BorrowedFd<'_>,
    runs: &[PageRun],
    data: &[u8],
    progress: &crate::ProgressCounter,
) -> Result<()> {
    for r in runs {
        let (off, len) = (r.offset as usize, (r.pages * 4096) as usize);
        let mut done = 0usize;
        while done < len {
            let n = uffd::copy(
                fd,
                r.start + done as u64,
                &data[off + done..off + len],
                uffd::UFFDIO_COPY_MODE_DONTWAKE,
            )
            .map_err(|e| {
                EngineError::kernel(
                    pid,
                    format!("placing pages at {:#x}", r.start + done as u64),
                    e,
                )
            })?;
            if n == 0 {
                return Err(EngineError::restore(
                    pid,
                    format!("page copy at {:#x} made no progress", r.start + done as u64),
                ));
            }
            done += n as usize;
        }
        progress.add(len as u64);
    }
    Ok(())
}

/// Copies every stored page into place: runs stored back to back go out
/// in one process_vm_writev of up to 1024 ranges. Faulting in the target's
/// pages dominates, so large images are written from several threads.
pub fn write_pages(
    pid: i32,
    runs: &[PageRun],
    data: &[u8],
    progress: Option<&crate::ProgressFn>,
) -> Result<()> {
    let total: u64 = runs.iter().map(|r| r.pages * 4096).sum();
    let workers = if total < (16 << 20) { 1 } else { crate::worker_threads() };
    let parts = split_runs(runs, workers);
    let counter = crate::ProgressCounter::new(progress, total);
    let counter = &counter;
    if let [only] = parts[..] {
        // One part: this thread (a thread's start and join cost more than
        // a small process's pages).
        return write_runs(pid, only, data, counter);
    }
    std::thread::scope(|sc| {
        let handles: Vec<_> = parts
            .into_iter()
            .map(|part| sc.spawn(move || write_runs(pid, part, data, counter)))
            .collect();
        handles.into_iter().try_for_each(|h| {
            h.join().unwrap_or_else(|_| Err(EngineError::restore(pid, "page copy thread panicked")))
        })
    })
}

fn write_runs(
    pid: i32,
    runs: &[PageRun],
    data: &[u8],
    progress: &crate::ProgressCounter,
) -> Result<()> {
    let mut i = 0;
    while i < runs.len() {
        let first = runs[i].offset as usize;
        let mut end = first;
        let mut remote = Vec::new();
        while i < runs.len() && remote.len() < vm::MAX_IOV && runs[i].offset as usize == end {
            let len = (runs[i].pages * 4096) as usize;
            remote.push(RemoteRange { addr: runs[i].start, len });
            end += len;
            i += 1;
        }
        let n = vm::write_remote(pid, &data[first..end], &remote).map_err(|e| {
            EngineError::kernel(pid, format!("writing pages at {:#x}", remote[0].addr), e)
        })?;
        if n != end - first {
            return Err(EngineError::restore(
                pid,
                format!("short page write at {:#x}", remote[0].addr),
            ));
        }
        progress.add(n as u64);
    }
    Ok(())
}

pub fn reprotect(s: &mut Session, list: &[(u64, u64, u8)]) -> Result<()> {
    let calls: Vec<(String, Call)> = list
        .iter()
        .map(|&(a, len, prot)| {
            (format!("mprotect({a:#x})"), Call::new(libc::SYS_mprotect, &[a, len, prot as u64]))
        })
        .collect();
    s.run(s.pid, &calls)?;
    Ok(())
}

/// Locks again the mappings that were locked (mlock, mlockall(MCL_CURRENT);
/// VmFlags "lo"), once their pages are in. Done while the process still
/// has root's CAP_IPC_LOCK; RLIMIT_MEMLOCK is set afterwards. A mapping
/// locked on fault (mlock2 MLOCK_ONFAULT, VmFlags "lf") is locked the
/// same way: only the pages written back are resident, the rest is
/// faulted in (and locked) when first touched, as before.
pub fn relock(s: &mut Session, vmas: &[ferry_image::Vma]) -> Result<()> {
    const MLOCK_ONFAULT: u64 = 1;
    let calls: Vec<(String, Call)> = vmas
        .iter()
        .filter(|v| v.flags & vmflag::LOCKED != 0)
        .map(|v| {
            let len = v.end - v.start;
            if v.flags & vmflag::LOCKONFAULT != 0 {
                (
                    format!("mlock2({:#x}-{:#x}, MLOCK_ONFAULT)", v.start, v.end),
                    Call::new(libc::SYS_mlock2, &[v.start, len, MLOCK_ONFAULT]),
                )
            } else {
                (
                    format!("mlock({:#x}-{:#x})", v.start, v.end),
                    Call::new(libc::SYS_mlock, &[v.start, len]),
                )
            }
        })
        .collect();
    if !calls.is_empty() {
        s.run(s.pid, &calls)?;
    }
    Ok(())
}

/// PR_SET_MM_MAP: code/data/brk/stack/arg/env boundaries, auxv, exe.
/// Writes its argument at `s.data + MM_ARGS` (clear of the other
/// arguments of the batch it joins) and returns the call.
pub fn set_mm_call(s: &mut Session, exe_fd: Option<i32>) -> Result<(String, Call)> {
    /// Where in the argument area: the struct, then the auxv 512 bytes on.
    const MM_ARGS: u64 = 0x8000;
    let mm = &s.image.mm;
    let at = s.data + MM_ARGS;
    let mut buf: Vec<u8> = Vec::with_capacity(104);
    for v in [
        mm.start_code,
        mm.end_code,
        mm.start_data,
        mm.end_data,
        mm.start_brk,
        mm.brk,
        mm.start_stack,
        mm.arg_start,
        mm.arg_end,
        mm.env_start,
        mm.env_end,
    ] {
        buf.extend_from_slice(&v.to_le_bytes());
    }
    let auxv_addr = at + 512;
    buf.extend_from_slice(&auxv_addr.to_le_bytes());
    buf.extend_from_slice(&((mm.auxv.len() * 8) as u32).to_le_bytes());
    buf.extend_from_slice(&(exe_fd.map_or(u32::MAX, |f| f as u32)).to_le_bytes());
    let auxv: Vec<u8> = mm.auxv.iter().flat_map(|w| w.to_le_bytes()).collect();
    if MM_ARGS + 512 + auxv.len() as u64 > inject::SCRATCH_LEN - inject::SCRATCH_DATA {
        return Err(EngineError::restore(
            s.pid,
            format!("its auxv ({} words) does not fit the restore's argument area", mm.auxv.len()),
        ));
    }
    s.remote.write(at, &buf)?;
    s.remote.write(auxv_addr, &auxv)?;
    const PR_SET_MM: u64 = 35;
    const PR_SET_MM_MAP: u64 = 14;
    let call = Call::new(libc::SYS_prctl, &[PR_SET_MM, PR_SET_MM_MAP, at, buf.len() as u64, 0]);
    Ok(("prctl(PR_SET_MM_MAP)".into(), call))
}
