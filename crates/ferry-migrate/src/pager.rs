//! Post-copy, the destination's side: the pager. It runs in the ferryd
//! worker once the tree runs here, with the userfaultfds the restore
//! registered (taken from the PID-namespace helper), and serves every
//! first touch of a page that is still at the source.
//!
//! Two threads share the channel's halves:
//! - the fault thread polls the userfaultfds; a fault on a lazy page
//!   sends one PageRequest for it and its neighbours (once per page); a
//!   fault on a page the source never had (or one the process dropped
//!   since) gets a zero page at once. It also follows the events the
//!   restore enabled: fork (the child gets its own userfaultfd, served
//!   with the same pages), mremap (pages move), munmap and MADV_DONTNEED
//!   (those pages must not be filled again).
//! - the receiving thread (the caller's) installs every page that
//!   arrives, requested or pushed, with UFFDIO_COPY, which also wakes the
//!   threads waiting on it; EEXIST means the page is there already.
//!
//! Reading an event and installing pages happen under one lock, so a
//! page never lands in a range the process dropped after the event was
//! read. When PagesDone arrives every page is installed: the
//! userfaultfds are closed (which unregisters the mappings) and the
//! destination answers PagesDone. If the source goes away first, the
//! threads waiting for pages would wait forever: the tree is killed.

use crate::error::{MigrateError, Result};
use crate::protocol::{self, Msg};
use ferry_sys::uffd;
use ferry_transport::{Channel, RecvHalf, SendHalf};
use std::collections::HashSet;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::ScopedJoinHandle;
use std::time::{Duration, Instant};

const PAGE: u64 = 4096;
/// Pages asked for per fault: the faulting one and the ones after it,
/// which a sequential reader touches next.
const FAULT_AROUND: u64 = 16;

/// One address space being filled: the restored process, or a child it
/// forked since.
struct Target {
    uffd: Arc<OwnedFd>,
    /// The source PID whose pages this address space receives.
    src_pid: i32,
    /// Lazy pages, at their source addresses, sorted (address, pages).
    lazy: Arc<Vec<(u64, u64)>>,
    /// mremap moves since the restore, in order: (from, to, len).
    remaps: Vec<(u64, u64, u64)>,
    /// Ranges (current addresses) unmapped or discarded since.
    dropped: Vec<(u64, u64)>,
    gone: bool,
}

impl Target {
    fn to_current(&self, mut a: u64) -> u64 {
        for &(from, to, len) in &self.remaps {
            if a >= from && a < from + len {
                a = to + (a - from);
            }
        }
        a
    }

    fn to_source(&self, mut a: u64) -> u64 {
        for &(from, to, len) in self.remaps.iter().rev() {
            if a >= to && a < to + len {
                a = from + (a - to);
            }
        }
        a
    }

    fn is_dropped(&self, a: u64, len: u64) -> bool {
        self.dropped.iter().any(|&(s, e)| a < e && a + len > s)
    }

    fn is_lazy(&self, src: u64) -> Option<(u64, u64)> {
        let k = self.lazy.partition_point(|&(a, n)| a + n * PAGE <= src);
        self.lazy.get(k).copied().filter(|&(a, _)| a <= src)
    }
}

#[derive(Debug, Clone, Default)]
pub struct PagerReport {
    pub ms: f64,
    pub bytes: u64,
    pub faults: u64,
    pub requests: u64,
    pub zero_pages: u64,
}

enum Install {
    Done,
    /// An event is pending on the userfaultfd (mmap_changing): retry from
    /// this offset once the fault thread has read it.
    Retry(usize),
    Gone,
}

/// UFFDIO_COPY of `data` to `dst`, skipping pages already there or no
/// longer registered.
fn install(
    fd: BorrowedFd<'_>,
    dst: u64,
    data: &[u8],
    from: usize,
) -> std::result::Result<Install, ferry_sys::SysError> {
    let mut off = from;
    while off < data.len() {
        match uffd::copy(fd, dst + off as u64, &data[off..], 0) {
            Ok(0) => return Ok(Install::Retry(off)),
            Ok(n) => off += n as usize,
            Err(e)
                if e.errno == libc::EEXIST
                    || e.errno == libc::ENOENT
                    || e.errno == libc::EFAULT =>
            {
                off += PAGE as usize
            }
            Err(e) if e.errno == libc::EAGAIN => return Ok(Install::Retry(off)),
            Err(e) if e.errno == libc::ESRCH => return Ok(Install::Gone),
            Err(e) => return Err(e),
        }
    }
    Ok(Install::Done)
}

/// A process whose pages are (partly) still at the source: its image PID,
/// its source PID, and its lazy runs, sorted (address, pages).
pub type LazyProcess = (i32, i32, Vec<(u64, u64)>);

/// Serves the tree's faults until every page is in. `uffds` are (image
/// PID, userfaultfd), `lazy` (image PID, source PID, lazy runs); `init`
/// is the PID namespace's init (killed, with the tree, if the source goes
/// away before all pages arrived).
pub fn run(
    ch: &mut Channel,
    uffds: Vec<(i32, OwnedFd)>,
    lazy: &[LazyProcess],
    init: Option<i32>,
    root: i32,
) -> Result<PagerReport> {
    let t0 = Instant::now();
    let pager = Pager::new(targets(uffds, lazy), root);
    let mut report = PagerReport::default();
    let (tx, rx) = ch.halves();
    let outcome = std::thread::scope(|sc| {
        let fault_thread = sc.spawn(|| pager.serve_faults(tx));
        let received = pager.receive_pages(rx, &fault_thread, &mut report);
        pager.stop.store(true, Ordering::Relaxed);
        let faulted = fault_thread.join().unwrap_or_else(|_| {
            Err(MigrateError::Invalid("post-copy fault thread panicked".into()))
        });
        received.and(faulted)
    });
    report.faults = pager.faults.load(Ordering::Relaxed);
    report.requests = pager.requests.load(Ordering::Relaxed);
    report.zero_pages = pager.zero.load(Ordering::Relaxed);
    if let Err(e) = outcome {
        return Err(pager.kill_tree(init, e));
    }
    // Closing the last copies unregisters every mapping.
    drop(pager);
    protocol::send(ch, &Msg::PagesDone)?;
    report.ms = t0.elapsed().as_secs_f64() * 1e3;
    Ok(report)
}

/// One target per userfaultfd of a process with lazy pages.
fn targets(uffds: Vec<(i32, OwnedFd)>, lazy: &[LazyProcess]) -> Vec<Target> {
    let mut targets = Vec::new();
    for (pid, fd) in uffds {
        let Some((_, src, runs)) = lazy.iter().find(|(p, _, _)| *p == pid) else {
            continue;
        };
        targets.push(Target {
            uffd: Arc::new(fd),
            src_pid: *src,
            lazy: Arc::new(runs.clone()),
            remaps: Vec::new(),
            dropped: Vec::new(),
            gone: false,
        });
    }
    targets
}

/// What the fault thread and the receiving thread share.
struct Pager {
    targets: Mutex<Vec<Target>>,
    stop: AtomicBool,
    faults: AtomicU64,
    requests: AtomicU64,
    zero: AtomicU64,
    /// The tree's root, for messages.
    root: i32,
}

/// The fault thread's own state.
#[derive(Default)]
struct Faulting {
    /// (source PID, page) already requested.
    asked: HashSet<(i32, u64)>,
    /// Zero pages refused while an event was pending (EAGAIN).
    zero_later: Vec<(Arc<OwnedFd>, u64)>,
    /// Requests to send once this poll's events are read: (source PID,
    /// address, pages).
    want: Vec<(i32, u64, u32)>,
}

impl Pager {
    fn new(targets: Vec<Target>, root: i32) -> Pager {
        Pager {
            targets: Mutex::new(targets),
            stop: AtomicBool::new(false),
            faults: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            zero: AtomicU64::new(0),
            root,
        }
    }

    fn targets(&self) -> Result<MutexGuard<'_, Vec<Target>>> {
        self.targets
            .lock()
            .map_err(|_| MigrateError::Invalid("post-copy: pager state poisoned".into()))
    }

    /// The fault thread: polls the userfaultfds until told to stop.
    fn serve_faults(&self, tx: &mut SendHalf) -> Result<()> {
        let root = self.root;
        let mut f = Faulting::default();
        while !self.stop.load(Ordering::Relaxed) {
            if !f.zero_later.is_empty() {
                let _t = self.targets()?;
                f.zero_later.retain(|(fd, page)| zero_page_still_pending(fd, *page));
            }
            let fds: Vec<Arc<OwnedFd>> =
                self.targets()?.iter().filter(|t| !t.gone).map(|t| t.uffd.clone()).collect();
            if fds.is_empty() {
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
            let borrowed: Vec<BorrowedFd> = fds.iter().map(|f| f.as_fd()).collect();
            let ready = uffd::poll_readable(&borrowed, 50).map_err(|e| {
                MigrateError::sys(format!("pid {root}: waiting for page faults"), e)
            })?;
            for (fd, _) in fds.iter().zip(ready).filter(|(_, r)| *r) {
                self.read_events(fd, &mut f)?;
            }
            for (pid, addr, pages) in f.want.drain(..) {
                self.requests.fetch_add(1, Ordering::Relaxed);
                protocol::send_half(tx, &Msg::PageRequest { pid, addr, pages }, &[])?;
            }
        }
        Ok(())
    }

    /// Every message queued on `fd`, read under the lock (see the module
    /// comment).
    fn read_events(&self, fd: &Arc<OwnedFd>, f: &mut Faulting) -> Result<()> {
        let root = self.root;
        let mut t = self.targets()?;
        let Some(i) = t.iter().position(|x| Arc::ptr_eq(&x.uffd, fd)) else {
            return Ok(());
        };
        loop {
            let msg = match uffd::read_msg(t[i].uffd.as_fd()) {
                Ok(Some(m)) => m,
                Ok(None) => return Ok(()),
                Err(e) => {
                    return Err(MigrateError::sys(
                        format!("pid {root}: reading its userfaultfd"),
                        e,
                    ))
                }
            };
            match msg {
                uffd::Msg::PageFault { address, .. } => self.on_fault(&t[i], address, f)?,
                uffd::Msg::Other { event, args } => self.on_event(&mut t, i, event, args)?,
            }
        }
    }

    /// A first touch: a lazy page is requested (with its neighbours, once
    /// per page), any other gets a zero page at once.
    fn on_fault(&self, tg: &Target, address: u64, f: &mut Faulting) -> Result<()> {
        let root = self.root;
        self.faults.fetch_add(1, Ordering::Relaxed);
        let page = address & !(PAGE - 1);
        let src = tg.to_source(page);
        match tg.is_lazy(src).filter(|_| !tg.is_dropped(page, PAGE)) {
            Some((a, n)) => {
                if f.asked.insert((tg.src_pid, src)) {
                    let end = (a + n * PAGE).min(src + FAULT_AROUND * PAGE);
                    for p in (src..end).step_by(PAGE as usize) {
                        f.asked.insert((tg.src_pid, p));
                    }
                    f.want.push((tg.src_pid, src, ((end - src) / PAGE) as u32));
                }
            }
            None => {
                // Never present at the source, or dropped here since.
                match uffd::zeropage(tg.uffd.as_fd(), page, PAGE, 0) {
                    Ok(_) => {}
                    Err(e) if e.errno == libc::EAGAIN => f.zero_later.push((tg.uffd.clone(), page)),
                    Err(e)
                        if e.errno == libc::EEXIST
                            || e.errno == libc::ENOENT
                            || e.errno == libc::ESRCH => {}
                    Err(e) => {
                        return Err(MigrateError::sys(
                            format!("pid {root}: zero page at {page:#x}"),
                            e,
                        ))
                    }
                }
                self.zero.fetch_add(1, Ordering::Relaxed);
            }
        }
        Ok(())
    }

    /// The events the restore enabled: fork, mremap, munmap and
    /// MADV_DONTNEED.
    fn on_event(&self, t: &mut Vec<Target>, i: usize, event: u8, args: [u64; 3]) -> Result<()> {
        let root = self.root;
        match event {
            uffd::UFFD_EVENT_FORK => {
                let child = uffd::own_event_fd(args[0]).map_err(|e| {
                    MigrateError::sys(format!("pid {root}: a forked child's userfaultfd"), e)
                })?;
                let p = &t[i];
                let nt = Target {
                    uffd: Arc::new(child),
                    src_pid: p.src_pid,
                    lazy: p.lazy.clone(),
                    remaps: p.remaps.clone(),
                    dropped: p.dropped.clone(),
                    gone: false,
                };
                tracing::info!(
                    "post-copy: a process of pid {root}'s tree forked; its child is served too"
                );
                t.push(nt);
            }
            uffd::UFFD_EVENT_REMAP => {
                let (from, to, len) = (args[0], args[1], args[2]);
                t[i].remaps.push((from, to, len));
                // What was at `to` before is gone; `from` is now empty.
                t[i].dropped.retain(|&(s, e)| !(s < to + len && e > to));
                t[i].dropped.push((from, from + len));
            }
            uffd::UFFD_EVENT_REMOVE | uffd::UFFD_EVENT_UNMAP => {
                t[i].dropped.push((args[0], args[1]))
            }
            _ => {}
        }
        Ok(())
    }

    /// The receiving thread: installs every page that arrives until
    /// PagesDone.
    fn receive_pages(
        &self,
        rx: &mut RecvHalf,
        fault_thread: &ScopedJoinHandle<'_, Result<()>>,
        report: &mut PagerReport,
    ) -> Result<()> {
        loop {
            if fault_thread.is_finished() {
                return Err(MigrateError::Invalid(
                    "post-copy: the fault thread ended early".into(),
                ));
            }
            let r = protocol::recv_half(rx)?;
            match &r.msg {
                Msg::Pages { pid, ranges } => {
                    report.bytes += self.install_pages(*pid, ranges, r.data())?
                }
                Msg::PagesDone => return Ok(()),
                Msg::Abort { reason } => return Err(MigrateError::Aborted(reason.clone())),
                m => {
                    return Err(MigrateError::Protocol(format!(
                        "unexpected {} during post-copy",
                        m.name()
                    )))
                }
            }
        }
    }

    /// One Pages message of source pid `pid`, checked and installed; its
    /// bytes.
    fn install_pages(&self, pid: i32, ranges: &[(u64, u64)], data: &[u8]) -> Result<u64> {
        let total: u64 = ranges.iter().map(|r| r.1).sum();
        if total != data.len() as u64 {
            return Err(MigrateError::Protocol(format!(
                "post-copy pages of pid {pid}: ranges of {total} bytes, {} sent",
                data.len()
            )));
        }
        let mut off = 0usize;
        for &(src, len) in ranges {
            if src % PAGE != 0 || len % PAGE != 0 {
                return Err(MigrateError::Protocol(format!(
                    "post-copy page range {src:#x}+{len:#x} of pid {pid} is not page-aligned"
                )));
            }
            let bytes = &data[off..off + len as usize];
            off += len as usize;
            self.install_everywhere(pid, src, bytes)?;
        }
        Ok(total)
    }

    /// The source went away (or a thread failed) before every page
    /// arrived.
    fn kill_tree(self, init: Option<i32>, e: MigrateError) -> MigrateError {
        let root = self.root;
        // Threads of the tree may be waiting for pages that will never come.
        if let Some(init) = init {
            let _ = ferry_sys::process::kill(init, libc::SIGKILL);
        }
        tracing::error!("post-copy of pid {root} failed before every page arrived ({e}); killing the tree: its memory is incomplete and the service is lost");
        eprintln!("ferryd: post-copy of pid {root} failed before every page arrived ({e}); killing the tree: its memory is incomplete and the service is lost");
        drop(self);
        MigrateError::Aborted(format!(
            "post-copy of pid {root}: {e}; the tree was killed at the destination"
        ))
    }

    /// Installs one source range in every address space that receives pid
    /// `src_pid`'s pages, at its current address there.
    fn install_everywhere(&self, src_pid: i32, src: u64, bytes: &[u8]) -> Result<()> {
        let root = self.root;
        let mut k = 0usize;
        let mut resume = 0usize;
        loop {
            let mut t = self.targets()?;
            let Some(tg) = t.get_mut(k) else {
                return Ok(());
            };
            if tg.gone || tg.src_pid != src_pid {
                k += 1;
                resume = 0;
                continue;
            }
            let len = bytes.len() as u64;
            let r = if tg.remaps.is_empty() && !tg.is_dropped(src, len) {
                install(tg.uffd.as_fd(), src, bytes, resume)
            } else {
                install_moved(tg, src, bytes, resume)
            };
            match r.map_err(|e| {
                MigrateError::sys(format!("pid {root}: installing pages at {src:#x}"), e)
            })? {
                Install::Done => {
                    k += 1;
                    resume = 0;
                }
                Install::Gone => {
                    tg.gone = true;
                    k += 1;
                    resume = 0;
                }
                Install::Retry(off) => {
                    resume = off;
                    drop(t);
                    // The fault thread reads the pending event meanwhile.
                    std::thread::sleep(Duration::from_micros(50));
                }
            }
        }
    }
}

/// A zero page refused earlier tried again: whether an event is still
/// pending on its userfaultfd (EAGAIN), so that it waits another poll.
fn zero_page_still_pending(fd: &OwnedFd, page: u64) -> bool {
    matches!(uffd::zeropage(fd.as_fd(), page, PAGE, 0), Err(e) if e.errno == libc::EAGAIN)
}

/// Page by page: parts of the range moved or dropped since the restore.
fn install_moved(
    tg: &Target,
    src: u64,
    bytes: &[u8],
    resume: usize,
) -> std::result::Result<Install, ferry_sys::SysError> {
    let mut off = resume;
    while off < bytes.len() {
        let cur = tg.to_current(src + off as u64);
        if !tg.is_dropped(cur, PAGE) {
            match install(tg.uffd.as_fd(), cur, &bytes[off..off + PAGE as usize], 0) {
                Ok(Install::Done) => {}
                Ok(Install::Retry(_)) => return Ok(Install::Retry(off)),
                other => return other,
            }
        }
        off += PAGE as usize;
    }
    Ok(Install::Done)
}
