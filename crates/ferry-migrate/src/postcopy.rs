//! Post-copy (`ferry migrate --lazy`), the source's side.
//!
//! The freeze sends no private anonymous page ([`LazyHooks`] declares
//! those mappings whole as held by the destination, without reading
//! their page tables): the pause does not depend on memory size. Once
//! the destination reports the tree running, [`push`] lists which of
//! those pages exist (the source stays frozen, so the list is the one of
//! the freeze), serves the destination's PageRequests first (a thread of
//! the restored tree is waiting on each; a page that never existed goes
//! as the zeros it reads as) and streams every existing page in the
//! background, then sends PagesDone and waits for the destination's
//! PagesDone (every page installed). Only then is the source's frozen
//! copy, which held the only copy of those pages, killed. It never runs
//! again here.

use crate::error::{MigrateError, Result};
use crate::protocol::{self, Msg};
use ferry_transport::{Channel, RecvHalf, SendHalf};
use std::collections::{HashMap, HashSet, VecDeque};
use std::os::unix::fs::FileExt;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

const PAGE: u64 = 4096;
/// Pages per background message: small enough that a request waits for
/// at most one such message on the wire.
const CHUNK_PAGES: u64 = 32;

/// The capture hook of a lazy migration: every page of each process's
/// private anonymous mappings stays behind (see [`ferry_engine::lazy`]).
#[derive(Default)]
pub struct LazyHooks {
    /// Per source PID, the ranges left behind (whole mappings, whether
    /// their pages exist or not), as sorted (address, pages).
    pub lazy: HashMap<i32, Vec<(u64, u64)>>,
}

impl ferry_engine::capture::CaptureHooks for LazyHooks {
    fn held_pages(
        &mut self,
        procs: &[(i32, &[ferry_image::Vma])],
    ) -> ferry_engine::Result<HashMap<i32, Vec<ferry_image::PageSpan>>> {
        if procs.len() > 1 {
            return Err(ferry_engine::EngineError::unsupported(
                procs[0].0,
                "the process tree",
                format!(
                    "post-copy (--lazy) moves a single process; this tree has {} (use pre-copy)",
                    procs.len()
                ),
            ));
        }
        for &(pid, vmas) in procs {
            self.lazy.insert(pid, ferry_engine::lazy::lazy_ranges(pid, vmas)?);
        }
        Ok(self
            .lazy
            .iter()
            .map(|(&pid, runs)| {
                (pid, runs.iter().map(|&(s, n)| ferry_image::PageSpan::new(s, n)).collect())
            })
            .collect())
    }

    fn held_whole(&self) -> bool {
        true
    }
}

/// Refuses a lazy migration of a tree of several processes before
/// anything is frozen (the capture hook checks again, frozen).
pub fn check_single_process(pid: i32) -> Result<()> {
    let mut children = 0;
    for tid in std::fs::read_dir(format!("/proc/{pid}/task"))
        .map_err(|e| MigrateError::Invalid(format!("pid {pid}: reading its threads: {e}")))?
    {
        let Ok(tid) = tid else { continue };
        let path = tid.path().join("children");
        children += std::fs::read_to_string(&path).unwrap_or_default().split_whitespace().count();
    }
    if children > 0 {
        return Err(MigrateError::Invalid(format!(
            "pid {pid} has {children} child process(es): post-copy (--lazy) moves a single process for now; migrate this tree without --lazy"
        )));
    }
    Ok(())
}

#[derive(Debug, Clone, Default)]
pub struct PushReport {
    pub ms: f64,
    /// Bytes of the lazy pages that exist at the source.
    pub lazy_bytes: u64,
    pub bytes: u64,
    /// Requests served (pages a thread at the destination waited for).
    pub requests: u64,
    pub requested_pages: u64,
}

struct Proc {
    pid: i32,
    mem: std::fs::File,
    /// The lazy ranges the freeze declared: what a request may ask for.
    declared: Vec<(u64, u64)>,
    /// The pages of `declared` that exist: what is pushed.
    runs: Vec<(u64, u64)>,
    sent: HashSet<u64>,
}

impl Proc {
    /// The unsent pages of [addr, addr + pages) inside `runs` (of this
    /// process, sorted (address, pages)), as (address, bytes) ranges,
    /// marked sent.
    fn take_from(&mut self, declared: bool, addr: u64, pages: u64) -> Vec<(u64, u64)> {
        let runs = if declared { &self.declared } else { &self.runs };
        let end = addr.saturating_add(pages * PAGE);
        let mut out: Vec<(u64, u64)> = Vec::new();
        let mut k = runs.partition_point(|&(a, n)| a + n * PAGE <= addr);
        while let Some(&(a, n)) = runs.get(k) {
            if a >= end {
                break;
            }
            let (lo, hi) = (a.max(addr), (a + n * PAGE).min(end));
            let mut p = lo;
            while p < hi {
                if self.sent.insert(p) {
                    match out.last_mut() {
                        Some(r) if r.0 + r.1 == p => r.1 += PAGE,
                        _ => out.push((p, PAGE)),
                    }
                }
                p += PAGE;
            }
            k += 1;
        }
        out
    }

    fn read(&self, ranges: &[(u64, u64)]) -> Result<Vec<u8>> {
        let total: u64 = ranges.iter().map(|r| r.1).sum();
        let mut buf = vec![0u8; total as usize];
        let mut off = 0usize;
        for &(a, len) in ranges {
            self.mem.read_exact_at(&mut buf[off..off + len as usize], a).map_err(|e| {
                MigrateError::Invalid(format!("pid {}: reading its pages at {a:#x}: {e}", self.pid))
            })?;
            off += len as usize;
        }
        Ok(buf)
    }
}

/// What the receiving thread hands the sender: the destination's
/// requests, and how the receiving ended.
#[derive(Default)]
struct Shared {
    requests: VecDeque<(i32, u64, u32)>,
    /// The receiver ended: Ok on the destination's PagesDone.
    ended: Option<std::result::Result<(), String>>,
}

#[derive(Default)]
struct Requests {
    shared: Mutex<Shared>,
    cv: Condvar,
}

/// Sends every lazy page of the frozen processes `lazy` (source PID to
/// runs), requested ones first; returns once the destination confirmed
/// that all are installed.
pub fn push(
    ch: &mut Channel,
    lazy: &HashMap<i32, Vec<(u64, u64)>>,
    timeout: Duration,
    progress: &(dyn Fn(&str) + Send + Sync),
) -> Result<PushReport> {
    let t0 = Instant::now();
    let mut pusher = Pusher::open(lazy)?;
    progress(&format!(
        "running at the destination; post-copy of {:.1} MiB",
        pusher.total as f64 / 1048576.0
    ));
    let requests = Requests::default();
    let (tx, rx) = ch.halves();
    std::thread::scope(|sc| {
        let receiver = sc.spawn(|| requests.receive(rx));
        let sent = pusher
            .send_all(tx, &requests, progress)
            .and_then(|()| requests.await_installed(timeout));
        if sent.is_err() {
            // Unblocks the receiver.
            tx.shutdown();
        }
        let _ = receiver.join();
        sent
    })?;
    let mut report = pusher.report;
    report.ms = t0.elapsed().as_secs_f64() * 1e3;
    Ok(report)
}

impl Requests {
    fn lock(&self) -> Result<std::sync::MutexGuard<'_, Shared>> {
        self.shared.lock().map_err(|_| MigrateError::Invalid("post-copy receiver panicked".into()))
    }

    /// The receiving thread: queues the destination's requests until its
    /// PagesDone, a failure, or the channel's end.
    fn receive(&self, rx: &mut RecvHalf) {
        let end = loop {
            match protocol::recv_half(rx).map(|r| r.msg) {
                Ok(Msg::PageRequest { pid, addr, pages }) => {
                    if let Ok(mut s) = self.shared.lock() {
                        s.requests.push_back((pid, addr, pages));
                    }
                    self.cv.notify_one();
                }
                Ok(Msg::PagesDone) => break Ok(()),
                Ok(Msg::Failed { error }) => break Err(format!("the destination failed: {error}")),
                Ok(m) => break Err(format!("unexpected {} during post-copy", m.name())),
                Err(e) => break Err(e.to_string()),
            }
        };
        if let Ok(mut s) = self.shared.lock() {
            s.ended = Some(end);
        }
        self.cv.notify_one();
    }

    /// The next request, if any; an error once the receiver failed.
    fn next(&self) -> Result<Option<(i32, u64, u32)>> {
        let (req, ended) = {
            let mut s = self.lock()?;
            (s.requests.pop_front(), s.ended.clone())
        };
        if let Some(Err(e)) = ended {
            return Err(MigrateError::Aborted(format!("post-copy: {e}")));
        }
        Ok(req)
    }

    /// Waits for the destination to install the last pages.
    fn await_installed(&self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let mut s = self.lock()?;
        while s.ended.is_none() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(MigrateError::Aborted(
                    "post-copy: the destination did not confirm the last pages".into(),
                ));
            }
            s = self
                .cv
                .wait_timeout(s, left)
                .map_err(|_| MigrateError::Invalid("post-copy receiver panicked".into()))?
                .0;
        }
        match s.ended.clone() {
            Some(Err(e)) => Err(MigrateError::Aborted(format!("post-copy: {e}"))),
            _ => Ok(()),
        }
    }
}

/// The sending side: the processes' memory, what is sent, what is next.
struct Pusher {
    procs: Vec<Proc>,
    /// The next background pages: (process, run, pages into the run).
    cursor: (usize, usize, u64),
    /// Bytes of all lazy pages.
    total: u64,
    report: PushReport,
}

impl Pusher {
    fn open(lazy: &HashMap<i32, Vec<(u64, u64)>>) -> Result<Pusher> {
        let mut procs = Vec::new();
        for (&pid, declared) in lazy {
            let path = format!("/proc/{pid}/mem");
            let mem = std::fs::File::open(&path)
                .map_err(|e| MigrateError::Invalid(format!("pid {pid}: opening {path}: {e}")))?;
            let runs = ferry_engine::lazy::present_runs(pid, declared)?;
            procs.push(Proc { pid, mem, declared: declared.clone(), runs, sent: HashSet::new() });
        }
        let total: u64 = procs.iter().flat_map(|p| p.runs.iter()).map(|&(_, n)| n * PAGE).sum();
        let report = PushReport { lazy_bytes: total, ..Default::default() };
        Ok(Pusher { procs, cursor: (0, 0, 0), total, report })
    }

    /// Requested pages first, the rest in address order, then PagesDone.
    fn send_all(
        &mut self,
        tx: &mut SendHalf,
        requests: &Requests,
        progress: &(dyn Fn(&str) + Send + Sync),
    ) -> Result<()> {
        let mut last_note = Instant::now();
        loop {
            if let Some(req) = requests.next()? {
                self.serve_request(tx, req)?;
                continue;
            }
            // Background: the next unsent pages in address order.
            let Some((k, ranges)) = self.next_chunk() else {
                break;
            };
            if ranges.is_empty() {
                continue;
            }
            let p = &self.procs[k];
            let data = p.read(&ranges)?;
            self.report.bytes += data.len() as u64;
            protocol::send_half(tx, &Msg::Pages { pid: p.pid, ranges }, &data)?;
            if last_note.elapsed() > Duration::from_secs(1) {
                last_note = Instant::now();
                progress(&format!(
                    "post-copy: {:.0} of {:.0} MiB sent",
                    self.report.bytes as f64 / 1048576.0,
                    self.total as f64 / 1048576.0
                ));
            }
        }
        protocol::send_half(tx, &Msg::PagesDone, &[])
    }

    /// A thread at the destination waits on this one.
    fn serve_request(
        &mut self,
        tx: &mut SendHalf,
        (pid, addr, pages): (i32, u64, u32),
    ) -> Result<()> {
        let Some(p) = self.procs.iter_mut().find(|p| p.pid == pid) else {
            return Ok(());
        };
        // A page that never existed at the source reads as zeros.
        let ranges = p.take_from(true, addr & !(PAGE - 1), u64::from(pages.min(1024)));
        self.report.requests += 1;
        if !ranges.is_empty() {
            let data = p.read(&ranges)?;
            self.report.requested_pages += data.len() as u64 / PAGE;
            self.report.bytes += data.len() as u64;
            protocol::send_half(tx, &Msg::Pages { pid, ranges }, &data)?;
        }
        Ok(())
    }

    /// The process and the unsent pages of the next background chunk
    /// (empty when requests sent them all); None once every run is done.
    fn next_chunk(&mut self) -> Option<(usize, Vec<(u64, u64)>)> {
        let procs = &mut self.procs;
        let cursor = &mut self.cursor;
        while cursor.0 < procs.len() && cursor.1 >= procs[cursor.0].runs.len() {
            *cursor = (cursor.0 + 1, 0, 0);
        }
        let k = cursor.0;
        let p = procs.get_mut(k)?;
        let (a, n) = p.runs[cursor.1];
        let take = CHUNK_PAGES.min(n - cursor.2);
        let ranges = p.take_from(false, a + cursor.2 * PAGE, take);
        cursor.2 += take;
        if cursor.2 >= n {
            *cursor = (k, cursor.1 + 1, 0);
        }
        Some((k, ranges))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proc(declared: Vec<(u64, u64)>, runs: Vec<(u64, u64)>) -> Proc {
        let mem = std::fs::File::open("/dev/null").unwrap();
        Proc { pid: 1, mem, declared, runs, sent: HashSet::new() }
    }

    #[test]
    fn take_returns_each_lazy_page_once() {
        let mut p = proc(vec![(0x10000, 4), (0x20000, 2)], vec![(0x10000, 4), (0x20000, 2)]);
        assert_eq!(p.take_from(false, 0x11000, 2), vec![(0x11000, 2 * PAGE)]);
        assert_eq!(p.take_from(false, 0x10000, 16), vec![(0x10000, PAGE), (0x13000, PAGE)]);
        assert_eq!(p.take_from(false, 0x0, 64), vec![(0x20000, 2 * PAGE)]);
        assert!(p.take_from(false, 0x10000, 0x100).is_empty());
    }

    #[test]
    fn requests_reach_declared_pages_that_are_not_pushed() {
        // A mapping of 8 pages of which 2 exist.
        let mut p = proc(vec![(0x10000, 8)], vec![(0x12000, 2)]);
        assert_eq!(p.take_from(true, 0x11000, 2), vec![(0x11000, 2 * PAGE)]);
        assert_eq!(p.take_from(false, 0x10000, 8), vec![(0x13000, PAGE)]);
        assert_eq!(p.take_from(true, 0x10000, 8), vec![(0x10000, PAGE), (0x14000, 4 * PAGE)]);
        assert!(p.take_from(true, 0x18000, 8).is_empty());
    }
}
