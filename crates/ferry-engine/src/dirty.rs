//! Dirty-page tracking for pre-copy live migration.
//!
//! This kernel has no soft-dirty bits, so tracking uses userfaultfd in
//! write-protect ASYNC mode: every mapping whose pages a checkpoint stores
//! is registered (UFFDIO_REGISTER_MODE_WP) and write-protected; a write
//! simply clears the protection of its page (the kernel resolves it, the
//! writer never waits), and PAGEMAP_SCAN with PM_SCAN_WP_MATCHING reports
//! the unprotected ("written") pages and protects them again in the same
//! walk. Kernel writes into the process (read(2) into a buffer,
//! process_vm_writev) are caught the same way.
//!
//! The userfaultfd must belong to the tracked address space, so it is
//! created inside each process by an injected `userfaultfd()`, taken out
//! with `pidfd_getfd`, and the process's own copy is closed again: its fd
//! table ends up as it was. ferry then holds the only copy; closing it
//! (dropping the tracker) unregisters the mappings and clears the
//! protection, and the process runs on as if nothing had happened.
//!
//! Between two collections a process may map, unmap, grow or move memory.
//! Each collection compares /proc/PID/maps with the ranges registered the
//! last time: a mapping not wholly inside them is new (mmap, brk growth,
//! stack growth, mremap), so it is registered and protected now and its
//! present pages are reported whole; ranges no longer mapped are
//! forgotten. A new mapping that replaced a tracked one at the very same
//! place (mmap MAP_FIXED, munmap + mmap) is not registered either; the
//! scan stops there with EPERM (PM_SCAN_CHECK_WPASYNC), having returned
//! what it found before it, and the rest of the run is scanned mapping by
//! mapping, the unregistered ones being new. Pages only discarded (MADV_DONTNEED, MADV_FREE, a hole punched
//! in a file) are not writes and are not reported.

use crate::capture::memory::{classify, page_filter};
use crate::capture::tree::FrozenTree;
use crate::error::{EngineError, Result};
use crate::freeze::Frozen;
use crate::inject::{self, Remote};
use crate::procfs::{self, MapsEntry};
use ferry_sys::pagemap::{self, ScanFilter};
use ferry_sys::uffd;
use std::fs::File;
use std::io::Seek;
use std::os::fd::{AsFd, OwnedFd};

/// One mapping whose pages a checkpoint stores, as /proc/PID/maps shows it.
#[derive(Clone, Copy)]
struct Area {
    start: u64,
    end: u64,
    /// Which of its pages a checkpoint stores (reported when it is new).
    filter: ScanFilter,
    /// PROT_NONE: nothing writes it while it stays so.
    no_access: bool,
}

struct Tracked {
    pid: i32,
    /// Tells when the process has exited; never mistaken for a later
    /// process that reuses the PID.
    pidfd: OwnedFd,
    /// ferry's only copy of the process's userfaultfd.
    uffd: OwnedFd,
    /// /proc/PID/maps and /proc/PID/pagemap, opened while the process was
    /// frozen: both stay bound to its address space (after an exit or an
    /// execve they show nothing), so a reused PID is never read.
    maps: File,
    pagemap: OwnedFd,
    /// Sorted, disjoint, merged ranges registered and protected by the
    /// previous call.
    ranges: Vec<(u64, u64)>,
}

/// A collect() result: per tracked pid, sorted merged `[start, end)` byte
/// ranges.
pub type DirtyRanges = Vec<(i32, Vec<(u64, u64)>)>;

/// Tracks which pages of a process tree are written; see the module
/// documentation.
pub struct DirtyTracker {
    procs: Vec<Tracked>,
}

/// Runs `userfaultfd()` inside the frozen process, takes the new fd and
/// closes the process's copy, so its fd table is what it was.
fn take_uffd(f: &Frozen) -> Result<OwnedFd> {
    let pid = f.pid;
    let vdso = procfs::maps(pid)?.into_iter().find(|m| m.path == "[vdso]").ok_or_else(|| {
        EngineError::unsupported(
            pid,
            "the vDSO",
            "process has no [vdso] mapping (needed to run userfaultfd() inside it)",
        )
    })?;
    let syscall_ip = inject::find_syscall_insn(pid, vdso.start, vdso.end)?;
    let remote = Remote { pid, syscall_ip, settle: true };
    let flags = (libc::O_CLOEXEC | libc::O_NONBLOCK) as u64;
    let fd = match remote.call(pid, "userfaultfd", libc::SYS_userfaultfd, &[flags]) {
        // A process without CAP_SYS_PTRACE may only have a user-mode-only
        // userfaultfd when vm.unprivileged_userfaultfd is 0; async
        // write-protection works the same with it (kernel writes never
        // reach the fault handler in that mode).
        Err(EngineError::Remote { errno: libc::EPERM, .. }) => remote.call(
            pid,
            "userfaultfd(UFFD_USER_MODE_ONLY)",
            libc::SYS_userfaultfd,
            &[flags | uffd::UFFD_USER_MODE_ONLY],
        )?,
        r => r?,
    };
    let taken = ferry_sys::pidfd::pidfd_getfd(&f.pidfd, fd as i32)
        .map_err(|e| EngineError::kernel(pid, format!("taking its new userfaultfd (fd {fd})"), e));
    // Close the process's copy whether or not we got ours.
    let closed = remote.call(pid, "close(userfaultfd)", libc::SYS_close, &[fd]);
    let taken = taken?;
    closed?;
    Ok(taken)
}

/// The mappings of `entries` whose pages a checkpoint stores. A mapping a
/// checkpoint would refuse is refused here too: its pages could never be
/// sent.
fn areas(pid: i32, entries: &[MapsEntry]) -> Result<Vec<Area>> {
    let mut out = Vec::with_capacity(entries.len());
    for m in entries {
        let vma = classify(pid, std::slice::from_ref(m))?;
        if let Some(filter) = vma.first().and_then(page_filter) {
            let no_access = &m.perms[..3] == b"---";
            out.push(Area { start: m.start, end: m.end, filter, no_access });
        }
    }
    Ok(out)
}

/// The rest of an open /proc file in reads of 8 KiB and more (the
/// standard reader asks the size, 0 here, then probes with 32, 32,
/// 64... bytes: a dozen calls for a small process's maps, at each
/// collection, the last one in the freeze).
fn read_all(f: &mut File) -> std::io::Result<String> {
    crate::procfs::read_rest(f, 8192)
}

fn merge(ranges: &mut Vec<(u64, u64)>) {
    ranges.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
    for &(s, e) in ranges.iter() {
        match out.last_mut() {
            Some(last) if last.1 >= s => last.1 = last.1.max(e),
            _ => out.push((s, e)),
        }
    }
    *ranges = out;
}

/// What stopped the collection of one process.
enum Stop {
    /// It exited (or is exiting): drop it from the set.
    Gone,
    Err(EngineError),
}

impl From<EngineError> for Stop {
    fn from(e: EngineError) -> Stop {
        Stop::Err(e)
    }
}

impl Tracked {
    /// Sets up tracking on `pid`'s address space with its userfaultfd
    /// `uffd`. Called while the process is frozen (so `pidfd` and the
    /// /proc files are surely this process's), before any registration.
    fn open(pid: i32, uffd_fd: OwnedFd) -> Result<Tracked> {
        let pidfd = ferry_sys::pidfd::pidfd_open(pid)
            .map_err(|e| EngineError::kernel(pid, "opening a pidfd", e))?;
        let maps_path = format!("/proc/{pid}/maps");
        let maps = File::open(&maps_path).map_err(|e| EngineError::io(&maps_path, e))?;
        let pm_path = format!("/proc/{pid}/pagemap");
        let pagemap: OwnedFd =
            File::open(&pm_path).map_err(|e| EngineError::io(&pm_path, e))?.into();
        let want = uffd::UFFD_FEATURE_WP_ASYNC | uffd::UFFD_FEATURE_WP_UNPOPULATED;
        let api = uffd::api(uffd_fd.as_fd(), want).map_err(|e| {
            EngineError::kernel(pid, "enabling asynchronous write-protection on its userfaultfd (needs Linux 6.7 or later)", e)
        })?;
        if api.features & want != want || api.ioctls & uffd::IOCTL_REGISTER == 0 {
            return Err(EngineError::kernel(
                pid,
                format!(
                    "its userfaultfd lacks async write-protection (features {:#x}, ioctls {:#x})",
                    api.features, api.ioctls
                ),
                ferry_sys::SysError::new("ioctl(UFFDIO_API)", libc::EINVAL),
            ));
        }
        Ok(Tracked { pid, pidfd, uffd: uffd_fd, maps, pagemap, ranges: Vec::new() })
    }

    /// Whether the process has exited, waiting up to `ms` for an exit
    /// under way (its memory is released before the pidfd tells).
    fn exited(&self, ms: i32) -> bool {
        ferry_sys::pidfd::wait_exit(&self.pidfd, ms).unwrap_or(false)
            || procfs::state(self.pid).is_none_or(|s| s == 'Z' || s == 'X')
    }

    /// `err`, unless the process has exited meanwhile.
    fn gone_or(&self, err: EngineError) -> Stop {
        if self.exited(100) {
            Stop::Gone
        } else {
            Stop::Err(err)
        }
    }

    fn read_maps(&mut self) -> std::result::Result<Vec<MapsEntry>, Stop> {
        let path = format!("/proc/{}/maps", self.pid);
        let text = match self.maps.rewind().and_then(|_| read_all(&mut self.maps)) {
            Ok(t) => t,
            Err(e) => return Err(self.gone_or(EngineError::io(&path, e))),
        };
        let entries = procfs::parse_maps(&path, &text)?;
        if entries.is_empty() {
            // The address space the file is bound to is gone: the process
            // exited, or it called execve and has a new one, which nothing
            // tracks.
            if self.exited(100) {
                return Err(Stop::Gone);
            }
            return Err(Stop::Err(EngineError::Gone {
                pid: self.pid,
                what: "its address space was replaced (execve) since dirty tracking started; all its memory is new".into(),
            }));
        }
        Ok(entries)
    }

    fn covered(&self, a: &Area) -> bool {
        let k = self.ranges.partition_point(|&(s, _)| s <= a.start);
        k > 0 && self.ranges[k - 1].1 >= a.end
    }

    fn register_protect(&self, start: u64, end: u64) -> ferry_sys::SysResult<()> {
        uffd::register(self.uffd.as_fd(), start, end - start, uffd::UFFDIO_REGISTER_MODE_WP)?;
        uffd::writeprotect(self.uffd.as_fd(), start, end - start, true)
    }

    fn still_mapped(&mut self, a: &Area) -> std::result::Result<bool, Stop> {
        Ok(self.read_maps()?.iter().any(|m| m.start == a.start && m.end == a.end))
    }

    /// [`add_new`](Self::add_new) for the new mappings of `run` that can
    /// be accessed. A PROT_NONE one (a JVM's or V8's reserved heap:
    /// gigabytes) cannot be written while it stays so, and protecting it
    /// would put a marker on each of its pages: it is left untracked, so
    /// it is new again at every call, until an mprotect or an mmap over it
    /// makes it accessible; then it is registered and its present pages
    /// are reported whole. Meanwhile its present pages (rare) are
    /// reported at every call, so that no earlier copy of what was at
    /// those addresses counts as held; the rounds leave PROT_NONE
    /// mappings to the capture in the freeze. A tracked mapping that
    /// became PROT_NONE stays registered and is scanned as before.
    fn add_accessible(
        &mut self,
        run: &[Area],
        report: bool,
        out: &mut Vec<(u64, u64)>,
        tracked: &mut Vec<(u64, u64)>,
    ) -> std::result::Result<(), Stop> {
        for part in run.split(|a| a.no_access).filter(|p| !p.is_empty()) {
            self.add_new(part, report, out, tracked)?;
        }
        for a in run.iter().filter(|a| a.no_access && report) {
            let pages = pagemap::scan(&self.pagemap, a.start, a.end, a.filter).map_err(|e| {
                self.gone_or(EngineError::kernel(
                    self.pid,
                    format!("scanning pages of PROT_NONE mapping {:#x}-{:#x}", a.start, a.end),
                    e,
                ))
            })?;
            out.extend(pages);
        }
        Ok(())
    }

    /// Registers and protects the contiguous new mappings `run`, then
    /// (with `report`) adds their present pages to `out`. Protection comes
    /// first, so a write made meanwhile is either in those pages or seen
    /// by the next call. Adds the mappings it took to `tracked`.
    fn add_new(
        &mut self,
        run: &[Area],
        report: bool,
        out: &mut Vec<(u64, u64)>,
        tracked: &mut Vec<(u64, u64)>,
    ) -> std::result::Result<(), Stop> {
        let (start, end) = (run[0].start, run[run.len() - 1].end);
        let taken: Vec<Area> = if self.register_protect(start, end).is_ok() {
            run.to_vec()
        } else {
            // One call per mapping, to name the one refused, or to skip
            // one unmapped since /proc/PID/maps was read (it is forgotten:
            // whatever is there next time is new then).
            let mut ok = Vec::with_capacity(run.len());
            for a in run {
                match self.register_protect(a.start, a.end) {
                    Ok(()) => ok.push(*a),
                    Err(e) => {
                        if self.exited(100) {
                            return Err(Stop::Gone);
                        }
                        if self.still_mapped(a)? {
                            let why = if e.errno == libc::EBUSY {
                                " (already registered with another userfaultfd)"
                            } else {
                                ""
                            };
                            return Err(Stop::Err(EngineError::kernel(
                                self.pid,
                                format!(
                                    "registering mapping {:#x}-{:#x} for write tracking{why}",
                                    a.start, a.end
                                ),
                                e,
                            )));
                        }
                    }
                }
            }
            ok
        };
        for a in &taken {
            if report {
                let pages =
                    pagemap::scan(&self.pagemap, a.start, a.end, a.filter).map_err(|e| {
                        self.gone_or(EngineError::kernel(
                            self.pid,
                            format!("scanning pages of new mapping {:#x}-{:#x}", a.start, a.end),
                            e,
                        ))
                    })?;
                out.extend(pages);
            }
            tracked.push((a.start, a.end));
        }
        Ok(())
    }

    /// One round for this process: written pages of tracked mappings
    /// (protected again) and present pages of new ones (registered and
    /// protected now), sorted and merged. With `report` false (attach),
    /// only registers and protects.
    fn collect(&mut self, report: bool) -> std::result::Result<Vec<(u64, u64)>, Stop> {
        if self.exited(0) {
            return Err(Stop::Gone);
        }
        let entries = self.read_maps()?;
        let areas = areas(self.pid, &entries)?;
        let mut out = Vec::new();
        let mut tracked = Vec::with_capacity(areas.len());
        let mut i = 0;
        while i < areas.len() {
            let covered = self.covered(&areas[i]);
            let mut j = i + 1;
            while j < areas.len()
                && areas[j].start == areas[j - 1].end
                && self.covered(&areas[j]) == covered
            {
                j += 1;
            }
            let run = &areas[i..j];
            let (start, end) = (run[0].start, run[run.len() - 1].end);
            if covered {
                match pagemap::collect_written(&self.pagemap, start, end, &mut out) {
                    Ok(()) => tracked.extend(run.iter().map(|a| (a.start, a.end))),
                    // A mapping made where a tracked one was (not
                    // registered) stopped the scan; what came before it is
                    // in `out`. Go on mapping by mapping: those already
                    // scanned report nothing more, the unregistered ones
                    // fail again and are new.
                    Err(e) if e.errno == libc::EPERM => {
                        for a in run {
                            match pagemap::collect_written(&self.pagemap, a.start, a.end, &mut out)
                            {
                                Ok(()) => tracked.push((a.start, a.end)),
                                Err(e) if e.errno == libc::EPERM => self.add_accessible(
                                    std::slice::from_ref(a),
                                    report,
                                    &mut out,
                                    &mut tracked,
                                )?,
                                Err(e) => {
                                    return Err(self.gone_or(EngineError::kernel(
                                        self.pid,
                                        format!(
                                            "collecting written pages of {:#x}-{:#x}",
                                            a.start, a.end
                                        ),
                                        e,
                                    )))
                                }
                            }
                        }
                    }
                    Err(e) => {
                        return Err(self.gone_or(EngineError::kernel(
                            self.pid,
                            format!("collecting written pages of {start:#x}-{end:#x}"),
                            e,
                        )))
                    }
                }
            } else {
                self.add_accessible(run, report, &mut out, &mut tracked)?;
            }
            i = j;
        }
        merge(&mut tracked);
        self.ranges = tracked;
        merge(&mut out);
        Ok(out)
    }
}

impl DirtyTracker {
    /// Attaches to every process of the tree rooted at `root`: freezes the
    /// tree for as long as it takes to run `userfaultfd()` and `close()` in
    /// each process (a few injected syscalls), lets it run on, then
    /// registers and write-protects, from ferry, every mapping whose pages
    /// a checkpoint stores. Pages written from here on are reported by
    /// [`collect`](Self::collect); copy the whole memory once after this
    /// returns.
    pub fn attach(root: i32) -> Result<DirtyTracker> {
        let t0 = std::time::Instant::now();
        let tree = FrozenTree::freeze(root)?;
        let mut procs = Vec::with_capacity(tree.procs.len());
        let mut failed = None;
        for p in &tree.procs {
            match take_uffd(&p.frozen).and_then(|fd| Tracked::open(p.frozen.pid, fd)) {
                Ok(t) => procs.push(t),
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        // The tree runs on in any case; the fds taken so far close with
        // `procs` on an error.
        let released = tree.release();
        tracing::debug!(
            "dirty tracking: tree of {root} frozen for {:.3} ms",
            t0.elapsed().as_secs_f64() * 1e3
        );
        if let Some(e) = failed {
            return Err(e);
        }
        released?;
        let mut tracker = DirtyTracker { procs };
        let mut gone = Vec::new();
        for (i, t) in tracker.procs.iter_mut().enumerate() {
            match t.collect(false) {
                Ok(_) => {}
                Err(Stop::Gone) => gone.push(i),
                Err(Stop::Err(e)) => return Err(e),
            }
        }
        for i in gone.into_iter().rev() {
            tracker.procs.remove(i);
        }
        Ok(tracker)
    }

    /// The PIDs being tracked, root first (a process forked later is not
    /// tracked: the caller treats it as wholly dirty; one that exited is
    /// no longer listed).
    pub fn pids(&self) -> Vec<i32> {
        self.procs.iter().map(|t| t.pid).collect()
    }

    /// Pages written since attach or the previous collect, per tracked
    /// pid, as sorted merged `[start, end)` byte ranges; they are
    /// protected again in the same scan, so copy them after this returns
    /// (a write during the copy shows up in the next call). Mappings that
    /// appeared since the last call are reported whole (their present
    /// pages) and tracked from now on; mappings gone are forgotten. A
    /// process that exited is dropped from the set (and from the result).
    /// Needs no injection, so it works while someone else holds the tree
    /// ptrace-frozen. After an error the tracker's view is incomplete
    /// (some processes were already re-protected): drop it and start over
    /// with a full copy.
    pub fn collect(&mut self) -> Result<DirtyRanges> {
        let mut out = Vec::with_capacity(self.procs.len());
        let mut gone = Vec::new();
        for (i, t) in self.procs.iter_mut().enumerate() {
            match t.collect(true) {
                Ok(r) => out.push((t.pid, r)),
                Err(Stop::Gone) => gone.push(i),
                Err(Stop::Err(e)) => return Err(e),
            }
        }
        for i in gone.into_iter().rev() {
            let t = self.procs.remove(i);
            tracing::debug!("pid {}: exited; no longer tracked", t.pid);
        }
        Ok(out)
    }

    /// Total bytes in the ranges of a collect() result.
    pub fn bytes(ranges: &[(i32, Vec<(u64, u64)>)]) -> u64 {
        ranges.iter().flat_map(|(_, r)| r.iter()).map(|&(s, e)| e - s).sum()
    }
}

impl Drop for DirtyTracker {
    /// Closing the last copy of each userfaultfd makes the kernel
    /// unregister every mapping and clear the write protection; the
    /// processes never waited on it (async mode), so they run on unharmed.
    fn drop(&mut self) {
        self.procs.clear();
    }
}
