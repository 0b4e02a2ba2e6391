//! Capture: freeze a process, read every piece of its state, write the
//! image, and only then (optionally) kill it.
//!
//! Each kind of kernel object has its own module; this file only orders
//! them. Everything that may refuse a process (an unsupported fd or
//! mapping) runs before anything is changed inside it.

mod assemble;
mod cgroups;
mod connections;
pub(crate) mod files;
mod injected;
pub use injected::KeptInjected;
mod kept_lock;
mod memfd;
pub(crate) mod memory;
mod namespaces;
pub use kept_lock::KeptLock;
mod host_fds;
mod network;
mod outside;
mod outside_files;
pub mod parent;
mod prctl;
mod process;
mod registered_rings;
pub mod root_parent;
mod sched_audit;
mod seccomp;
mod sharing;
mod shm;
mod signals;
mod socket_refs;
mod sockopt_check;
mod sockopt_watch;
pub use sockopt_check::KeptChecks;
pub use sockopt_watch::KeptWatch;
mod survey;
mod sysv_ipc;
pub(crate) mod tcp_tables;
mod threads;
mod timers;
pub(crate) mod tree;
pub mod vma_flags;

pub use memory::copy_present;
pub use tree::{running_tree, FrozenProcess, FrozenTree};

use crate::error::{EngineError, Result};
use crate::freeze::Frozen;
use crate::inject::Remote;
use ferry_image::{DirSink, ImageSink, Incremental, Inventory, PageSpan, ParentPages, TreeImage};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(Clone, Default)]
pub struct CaptureOptions {
    /// Let the process run on after the capture instead of killing it.
    pub leave_running: bool,
    /// Record pipes and sockets on fds 0-2 that lead to another process as
    /// external (replaced at restore) instead of refusing them.
    pub external_stdio: bool,
    /// Called as page data is copied (bytes done, bytes total).
    pub progress: Option<crate::ProgressFn>,
    /// How established TCP connections are held still on the network.
    pub network_lock: ferry_netlock::Method,
    /// Processes presurveyed while they ran ([`vma_flags::presurvey`]):
    /// their mappings' flags may be read in the freeze without smaps.
    pub presurveyed: HashMap<i32, vma_flags::Presurveyed>,
    /// `checkpoint` only: write an incremental image over the image in
    /// this directory (pages it holds unchanged are left to it).
    pub parent: Option<PathBuf>,
    /// Take the tree even though the root's parent stays behind in its
    /// job and sees it exit ([`root_parent`]).
    pub parent_sees_exit: bool,
    /// The tree's output is held until this capture is safe elsewhere
    /// (replication's output commit): a handshake under way cannot
    /// complete before, so it is not waited for. It stays out of the
    /// image; its client sends its SYN again to whichever host runs the
    /// service then.
    pub output_held: bool,
    /// The image is restored in another network namespace only (each
    /// sync of `ferry replicate`, restored by the standby): the TIME_WAIT
    /// connections of this one cannot keep a listener from binding its
    /// port there, so they are not looked for.
    pub restored_elsewhere: bool,
    /// The restore runs on this host while ferry holds the captured
    /// files (`ferry replace`): sockets, pipes, FIFOs, eventfd, timerfd,
    /// signalfd, inotify, unmapped memfds and epolls over them are not
    /// read but duplicated ([`files::carried`]) and handed to the restore
    /// as the same kernel objects ([`Captured::take_carried`]). No TCP
    /// repair, no network lock, no queue drained.
    pub carry_files: bool,
    /// The tree's setsockopt and fd calls counted from capture to
    /// capture by counters kept open between them (`ferry replicate`'s
    /// syncs, [`KeptWatch`]), whatever its number of sockets: the survey
    /// in the freeze takes the options and fds read before it when no
    /// call was counted since. None: a capture of 500 sockets or more
    /// opens counters of its own (FERRY_SOCKOPT_WATCH_FROM sets the
    /// bound), and a smaller one reads them in the freeze.
    pub kept_watch: Option<KeptWatch>,
    /// The sockets the capture before checked, kept with `kept_watch`:
    /// a socket (the same SO_COOKIE) stands as checked then when that
    /// watch counted no call since ([`sockopt_check`]).
    pub kept_checks: Option<KeptChecks>,
    /// What the processes answered the injected calls of the capture
    /// before, kept with `kept_watch`: parsed again instead of asked
    /// when its state counters prove nothing changed them
    /// ([`injected`]).
    pub kept_injected: Option<KeptInjected>,
    /// The network lock kept from capture to capture ([`KeptLock`]):
    /// taken instead of prepared, given back disengaged and empty by
    /// [`Captured::resume`]. Such a lock is never handed over: the image
    /// names no lock.
    pub kept_lock: Option<KeptLock>,
}

#[derive(Debug, Clone)]
pub struct CaptureSummary {
    pub pid: i32,
    pub processes: usize,
    pub threads: usize,
    pub mappings: usize,
    pub fds: usize,
    pub pages: u64,
    pub image_bytes: u64,
    pub frozen_ms: f64,
    pub total_ms: f64,
}

/// What capture needs while the process is frozen.
pub(crate) struct Ctx<'a> {
    pub pid: i32,
    pub frozen: &'a Frozen,
    pub remote: Remote,
    /// The scratch mapping (batch code and call table)...
    pub scratch: u64,
    /// ...and its part free for syscall arguments and results.
    pub data: u64,
}

/// How many times a capture refused for a passing state (see
/// [`EngineError::Transient`]) is tried in all, and how long the service
/// runs between two tries.
pub const TRANSIENT_ATTEMPTS: u32 = 5;
pub const TRANSIENT_PAUSE: std::time::Duration = std::time::Duration::from_millis(100);

/// Runs `attempt` until it succeeds, fails for good, or has been refused
/// for a passing state [`TRANSIENT_ATTEMPTS`] times (then that refusal is
/// the error). `retrying` hears of each refusal that is tried again.
pub fn retry_transient<T>(
    mut attempt: impl FnMut() -> Result<T>,
    mut retrying: impl FnMut(u32, &EngineError),
) -> Result<T> {
    let mut tries = 1;
    loop {
        match attempt() {
            Err(e) if e.is_transient() && tries < TRANSIENT_ATTEMPTS => {
                retrying(tries, &e);
                std::thread::sleep(TRANSIENT_PAUSE);
                tries += 1;
            }
            other => return other,
        }
    }
}

/// Checkpoints `pid` and all its descendants as one image directory:
/// capture into a directory sink, write the image, then resume or kill.
/// With `opts.parent`, the image is incremental over that parent.
pub fn checkpoint(pid: i32, dir: &Path, opts: &CaptureOptions) -> Result<CaptureSummary> {
    checkpoint_then(pid, dir, opts, |_, _| Ok(()))
}

/// Like [`checkpoint`], with `trial` run on the complete image directory
/// before the tree is ended: while it is still frozen, or, with
/// `leave_running`, once it runs on (its pause does not grow then). A
/// trial that fails lets the tree run on, keeps the image, and fails the
/// checkpoint with the trial's error ([`EngineError::TrialFailed`]).
/// `trial` also gets ferry's descriptors of the frozen tree's sockets:
/// a process it forks inherits them and has no use for them (10,000
/// connections would take half of a 20,000 descriptor limit).
pub fn checkpoint_then(
    pid: i32,
    dir: &Path,
    opts: &CaptureOptions,
    trial: impl FnOnce(&Path, &[std::os::fd::RawFd]) -> Result<()>,
) -> Result<CaptureSummary> {
    check_capturable(pid)?;
    let mut parent = opts.parent.as_deref().map(parent::ParentImage::open).transpose()?;
    let (mut captured, mut sink) = retry_transient(
        || {
            let mut sink = DirSink::create(dir)?;
            let hooks = parent.as_mut().map(|p| p as &mut dyn CaptureHooks);
            Ok((capture(pid, &mut sink, opts, hooks)?, sink))
        },
        |n, e| tracing::info!("checkpoint attempt {n} refused, trying again: {e}"),
    )?;
    // Still the pause (the tree frozen) to the kill; the trial's helper,
    // forked meanwhile, inherits the priority and ends with the trial.
    let raised = crate::priority::Raised::new();
    let parent_id = parent.as_ref().map(|p| sink.link_parent(p.dir())).transpose()?;
    captured.write_image(&mut sink, parent_id)?;
    let image = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let failed = |e: EngineError| {
        let error = match e {
            EngineError::InNewPidNs(inner) => inner,
            other => other.to_string(),
        };
        EngineError::TrialFailed { image: image.display().to_string(), error }
    };
    if opts.leave_running {
        let summary = captured.resume()?;
        drop(raised);
        trial(&image, &[]).map_err(failed)?;
        return Ok(summary);
    }
    // Dropping `captured` on an error lets the tree run on.
    trial(&image, &captured.repaired.raw_fds()).map_err(failed)?;
    captured.phases.mark("trial restore");
    captured.kill(LockAfterKill::HandOverTo(image.join(ferry_image::dir::META_FILE)))
}

/// The refusals that need nothing frozen: a PID that is not there, or
/// ferry itself.
fn check_capturable(pid: i32) -> Result<()> {
    if pid <= 0 {
        return Err(EngineError::Gone { pid, what: "not a valid PID".into() });
    }
    if !Path::new(&format!("/proc/{pid}")).exists() {
        return Err(EngineError::Gone { pid, what: "no such process".into() });
    }
    let me = std::process::id() as i32;
    if pid == me || tree::descends_from(me, &[pid]) {
        return Err(EngineError::unsupported(
            pid,
            "the process",
            "ferry cannot checkpoint itself or a tree it runs in",
        ));
    }
    Ok(())
}

/// What a caller that captures in rounds (pre-copy) adds to a capture.
pub trait CaptureHooks {
    /// Called once the tree is frozen, before any page is copied: for
    /// each process, the pages (sorted (address, pages) runs) whose
    /// current content the receiver already holds. Those pages are not
    /// copied again; the capture lists them as the parent's. `procs` gives
    /// each process's PID and the mappings the survey of the frozen tree
    /// found (reading them again would walk every page table once more).
    fn held_pages(
        &mut self,
        procs: &[(i32, &[ferry_image::Vma])],
    ) -> Result<HashMap<i32, Vec<PageSpan>>>;

    /// Whether every page of the runs `held_pages` returns is the
    /// receiver's whether it exists or not (post-copy: the runs are whole
    /// mappings, whose pages are listed only after the resume). The
    /// capture then does not scan them: the pause does not grow with them.
    fn held_whole(&self) -> bool {
        false
    }
}

/// What the network lock becomes once the captured tree is killed.
pub enum LockAfterKill {
    /// Kept for a restore from the image at this path (meta.img); the
    /// next ferry run removes it if the image is deleted first.
    HandOverTo(std::path::PathBuf),
    /// Taken down: the connections live on elsewhere already.
    Release,
}

/// A frozen tree whose state has been captured: its metadata here, its
/// pages in the sink. Nothing has been changed that resuming does not
/// undo: dropping it (or [`Captured::resume`]) lets the tree run on as if
/// nothing happened; [`Captured::kill`] ends it, once the image is safe.
pub struct Captured {
    pub inventory: Inventory,
    pub tree: TreeImage,
    /// Per process, the pages present at capture that were not copied
    /// because the receiver holds them (see [`CaptureHooks`]), under the
    /// PIDs the image gives the processes.
    pub parent_pages: Vec<(i32, Vec<PageSpan>)>,
    pub phases: crate::phases::Phases,
    summary: CaptureSummary,
    t_frozen: Instant,
    repaired: files::tcp::Repaired,
    /// Ferry's duplicates of the carried files, by description id
    /// ([`CaptureOptions::carry_files`]).
    carried: HashMap<u64, std::os::fd::OwnedFd>,
    lock: Option<ferry_netlock::NetworkLock>,
    /// Where `lock` goes back at [`Captured::resume`].
    kept_lock: Option<KeptLock>,
    /// The ptys' queues, put back when dropped: before `frozen` thaws.
    pty_drained: files::pty::Drained,
    frozen: tree::FrozenTree,
    /// What was listed and read of the sockets before the freeze: 10,000
    /// connections' options and descriptions, whose freeing cost ~9 ms
    /// of the pause when it ended the capture. Freed once the tree runs
    /// again, or beside the end of a checkpoint ([`Captured::kill`]).
    presurvey: survey::Presurvey,
    // Last, so it is dropped after every other cleanup ran.
    guard: crate::guard::Guard,
}

/// Stops the lock dropping, sends again what it dropped (in the namespace
/// it was prepared in: the tree's connections, or after a migration their
/// new home, which the packets are routed to), then removes it. Sending is
/// not fatal: TCP retransmits anyway.
/// With `keep`, the lock is emptied and kept for the next capture
/// instead of removed (released should that fail; should the disengage
/// fail, the lock, dropped, goes back to `keep`, which releases it).
fn thaw_delivering_held(
    mut lock: ferry_netlock::NetworkLock,
    keep: Option<&KeptLock>,
) -> Result<()> {
    lock.disengage()?;
    match lock.deliver_held(None) {
        Ok(n) => tracing::debug!(packets = n, "held packets sent again"),
        Err(e) => tracing::warn!("sending the packets the network lock held: {e}"),
    }
    match keep {
        Some(kept) => kept.keep(lock),
        None => lock.thaw()?,
    }
    Ok(())
}

impl Captured {
    fn new(
        assembled: assemble::Assembled,
        phases: crate::phases::Phases,
        t_frozen: Instant,
        conns: connections::FrozenConnections,
        pty_drained: files::pty::Drained,
        frozen: tree::FrozenTree,
        guard: crate::guard::Guard,
    ) -> Captured {
        let assemble::Assembled { inventory, tree, parent_pages, summary } = assembled;
        let connections::FrozenConnections { lock, repaired } = conns;
        Captured {
            inventory,
            tree,
            parent_pages,
            phases,
            summary,
            t_frozen,
            repaired,
            carried: HashMap::new(),
            lock,
            kept_lock: None,
            pty_drained,
            frozen,
            presurvey: survey::Presurvey::new(),
            guard,
        }
    }

    /// Ferry's duplicates of the carried files, by description id, taken
    /// over: they keep the files alive through the kill, and the restore
    /// places them ([`crate::restore::Handover::carried`]).
    pub fn take_carried(&mut self) -> HashMap<u64, std::os::fd::OwnedFd> {
        std::mem::take(&mut self.carried)
    }

    /// Phase "write image": the metadata into `sink`, which completes the
    /// image there. With `parent_id`, the image is incremental: the pages
    /// the capture left to the parent are listed as its parent's.
    pub fn write_image(&mut self, sink: &mut dyn ImageSink, parent_id: Option<u64>) -> Result<u64> {
        let incremental = parent_id.map(|parent_id| Incremental {
            parent_id,
            parent_pages: self
                .parent_pages
                .iter()
                .map(|(pid, ranges)| ParentPages { pid: *pid, ranges: ranges.clone() })
                .collect(),
        });
        let bytes = sink.finish_image(&self.inventory, &self.tree, incremental.as_ref())?;
        self.summary.image_bytes = bytes;
        self.phases.mark("write image");
        Ok(bytes)
    }

    /// Whether a network lock holds the tree's connections (none when
    /// every connection is carried).
    pub fn network_locked(&self) -> bool {
        self.lock.is_some()
    }

    /// When the freeze began: the start of the service's pause.
    pub fn frozen_at(&self) -> Instant {
        self.t_frozen
    }

    /// ferry's descriptors of the frozen tree's sockets: a process forked
    /// for a trial restore closes them first ([`checkpoint_then`]).
    pub fn socket_fds(&self) -> Vec<std::os::fd::RawFd> {
        self.repaired.raw_fds()
    }

    /// The tree's PIDs as ferry sees them, root first.
    pub fn pids(&self) -> Vec<crate::HostPid> {
        self.frozen.pids().into_iter().map(crate::HostPid).collect()
    }

    /// Lets the tree run on: connections leave repair mode, then their
    /// packets flow again, then every thread continues.
    pub fn resume(self) -> Result<CaptureSummary> {
        let Captured {
            mut phases,
            summary,
            t_frozen,
            repaired,
            lock,
            kept_lock,
            pty_drained,
            frozen,
            presurvey,
            guard,
            ..
        } = self;
        drop(pty_drained);
        drop(repaired);
        if let Some(lock) = lock {
            thaw_delivering_held(lock, kept_lock.as_ref())?;
        }
        frozen.release()?;
        phases.mark("release");
        drop(presurvey);
        drop(guard);
        Ok(CaptureSummary {
            frozen_ms: t_frozen.elapsed().as_secs_f64() * 1e3,
            total_ms: phases.started().elapsed().as_secs_f64() * 1e3,
            ..summary
        })
    }

    /// Ends the tree: its connections stay in repair mode (closing them
    /// sends nothing), SysV objects it owned are removed.
    pub fn kill(self, after: LockAfterKill) -> Result<CaptureSummary> {
        self.kill_holding(after, u64::MAX).map(|(summary, _)| summary)
    }

    /// [`kill`](Self::kill), with the address space of every process with
    /// `hold_from` bytes or more resident held past the kill
    /// ([`HeldMemory`](crate::held_memory::HeldMemory)): its teardown
    /// happens when the caller frees it, not before the PIDs come free.
    pub fn kill_holding(
        self,
        after: LockAfterKill,
        hold_from: u64,
    ) -> Result<(CaptureSummary, crate::held_memory::HeldMemory)> {
        let Captured {
            tree: tree_image,
            mut phases,
            summary,
            t_frozen,
            repaired,
            lock,
            mut pty_drained,
            frozen,
            presurvey,
            mut guard,
            ..
        } = self;
        guard.killed();
        pty_drained.forget();
        let kept = repaired.keep_in_repair();
        let t = Instant::now();
        // A held segment would keep its id from the restore.
        let mut held = match tree_image.sysv_shm.is_empty() && hold_from < u64::MAX {
            true => crate::held_memory::HeldMemory::hold(
                frozen.procs.iter().map(|p| &p.frozen),
                hold_from,
            ),
            false => crate::held_memory::HeldMemory::default(),
        };
        let holding = t.elapsed();
        frozen.kill()?;
        let killed = t.elapsed() - holding;
        kept.close();
        tracing::debug!(
            "kill: {} MiB held by {:?} in {:.1} ms, tree gone in {:.1} ms, its repaired sockets closed in {:.1} ms",
            held.bytes() >> 20,
            held.pids(),
            holding.as_secs_f64() * 1e3,
            killed.as_secs_f64() * 1e3,
            (t.elapsed() - killed - holding).as_secs_f64() * 1e3
        );
        if let Some(lock) = lock {
            match after {
                // Restore thaws it, once the connections exist again.
                LockAfterKill::HandOverTo(meta) => {
                    lock.hand_over_to(Some(&meta));
                }
                LockAfterKill::Release => thaw_delivering_held(lock, None)?,
            }
        }
        shm::remove_sysv(&tree_image.sysv_shm);
        sysv_ipc::remove(&tree_image.sysv_sem, &tree_image.sysv_msg);
        phases.mark("kill");
        // Freeing the metadata of 10,000 connections (their queues) takes
        // milliseconds the restore waits for when ferry exits right after;
        // a command that exits leaves it to the kernel.
        crate::parallel::detach("image freed", move || drop((tree_image, presurvey)));
        // Its exit is waited for with the held memory's, after the pause.
        held.reap_guard(guard.end_unreaped());
        // Killed processes stay zombies until their parent (or, for
        // orphans, init or a subreaper) reaps them; restore waits for
        // their PIDs.
        let summary = CaptureSummary {
            frozen_ms: t_frozen.elapsed().as_secs_f64() * 1e3,
            total_ms: phases.started().elapsed().as_secs_f64() * 1e3,
            ..summary
        };
        Ok((summary, held))
    }
}

/// Freezes `pid` and all its descendants and captures them: metadata
/// returned, pages written to `sink`. The tree stays frozen in the
/// returned [`Captured`] until the caller kills or resumes it; on error
/// it runs on untouched.
pub fn capture(
    pid: i32,
    sink: &mut dyn ImageSink,
    opts: &CaptureOptions,
    hooks: Option<&mut dyn CaptureHooks>,
) -> Result<Captured> {
    check_capturable(pid)?;
    let mut ph = crate::phases::Phases::start("checkpoint");
    // Declared first so it is dropped last, after every cleanup below ran.
    let mut guard = crate::guard::Guard::start()?;
    start_ahead(pid, sink, hooks.is_none());
    // Every socket listed while the tree runs; the survey checks them.
    let (pre, mut watch) = ph.step("presurvey", || {
        Ok::<_, EngineError>(survey::presurvey(pid, opts.kept_watch.as_ref()))
    })?;
    // Every option of every socket, while the tree runs: none in the freeze.
    // And, with the counters on, every connection described: the
    // survey in the freeze checks only that each is still the same.
    // One dump of the namespace's TCP sockets for the checks before the
    // freeze.
    let tcp = tcp_tables::TcpTables::before_freeze();
    let checked =
        ph.step("socket options checked", || check_options(&pre, watch.as_ref(), &tcp, opts));
    if checked.is_ok() {
        ph.step("connections described", || describe_connections(&pre, watch.as_ref(), opts));
    }
    // The freeze takes its own duplicates ([`files::FdPresurvey::release_dups`]).
    pre.values().for_each(files::FdPresurvey::release_dups);
    checked?;
    // The slow part of the network lock, while the tree still runs.
    let prepared =
        ph.step("network lock prepared", || prepare_lock(pid, &pre, opts, &tcp, &mut guard))?;
    // After the lock is prepared, as the memory check was: with no gap
    // between the lock's preparation and the freeze, a request the lock
    // held waited for a retransmission timeout
    // (tcp_connections::a_request_held_by_the_lock_is_answered_in_pause_time).
    let shared = ph.step("sharing checked", || check_sharing(pid, &pre, opts))?;
    // Loaded before the freeze, where the survey uses it: a load still
    // under way is waited for here, not in the pause.
    if pre.values().any(|p| p.socket_inodes().next().is_some()) {
        socket_refs::load_ahead();
    }
    // The pause starts with the first thread seized: ferry's threads go
    // first to the end of the capture ([`crate::priority`]).
    let _raised = crate::priority::Raised::new();
    let t_frozen = Instant::now();
    let tree = ph.step("freeze", || freeze(pid, &mut guard))?;
    let mut surveyed = ph.step("survey", || {
        let surveyed = survey::survey_tree(&tree, opts, &pre, watch.take())?;
        let maps: Vec<_> = surveyed.procs.iter().map(|s| (s.pid, s.smaps.as_slice())).collect();
        shared.0.recheck(&maps)?;
        let fds: Vec<_> = surveyed.procs.iter().map(|s| (s.pid, s.fd_inodes())).collect();
        shared.1.recheck(&fds, outside_scope(opts))?;
        Ok::<_, EngineError>(surveyed)
    })?;
    // Declared after the tree, so an error below puts the ptys' queues
    // back before the tree is thawed.
    let pty_drained = std::mem::take(&mut surveyed.pty_drained);
    let carried = std::mem::take(&mut surveyed.carried);
    let engaged = ph.step("network freeze", || {
        connections::engage_lock(prepared, &tree, &surveyed, opts, &mut guard)
    })?;
    let conns = ph.step("tcp connections", || {
        connections::read_connections(engaged, &tree, &mut surveyed, &mut guard)
    })?;
    let injected = ph.step("injected syscalls", || {
        let kept = opts.kept_watch.as_ref().zip(opts.kept_injected.as_ref());
        injected::capture_tree(&tree, &surveyed.procs, kept, &mut guard)
    })?;
    let held = match hooks {
        Some(h) => ph.step("held pages", || {
            let procs: Vec<_> = surveyed.procs.iter().map(|s| (s.pid, s.vmas.as_slice())).collect();
            Ok::<_, EngineError>(assemble::HeldPages {
                spans: h.held_pages(&procs)?,
                whole: h.held_whole(),
            })
        })?,
        None => assemble::HeldPages::default(),
    };
    // A kept lock stays with ferry: no restore takes it over.
    let handed = conns.lock.as_ref().filter(|_| opts.kept_lock.is_none());
    let lock_ref = handed.map(|l| ferry_image::NetworkLockRef {
        method: opts.network_lock.to_string(),
        name: l.name().to_string(),
    });
    let assembled = ph.step("pages", || {
        assemble::pages_and_metadata(pid, surveyed, injected, &held, sink, opts, lock_ref)
    })?;
    let mut captured = Captured::new(assembled, ph, t_frozen, conns, pty_drained, tree, guard);
    captured.carried = carried;
    // Freed after the pause, not as this function returns ([`Captured::presurvey`]).
    captured.presurvey = pre;
    captured.kept_lock = opts.kept_lock.clone();
    Ok(captured)
}

/// What runs on threads beside the phases before the freeze: the host's
/// fd iterator (phase "sharing checked" reads it) and the socket
/// iterator (the survey's) loaded, and, for a `full` capture, its pages
/// file made room for (an incremental one stores a fraction: its hooks
/// know which).
fn start_ahead(pid: i32, sink: &mut dyn ImageSink, full: bool) {
    host_fds::load_ahead();
    socket_refs::load_in_background();
    if full {
        sink.make_room_ahead(memory::stored_bytes_estimate(&tree::running_tree(pid)));
    }
}

/// Phase "socket options checked": every option of every listed socket
/// read and checked while the tree runs.
fn check_options(
    pre: &HashMap<i32, files::FdPresurvey>,
    watch: Option<&sockopt_watch::Watch>,
    tcp: &tcp_tables::TcpTables,
    opts: &CaptureOptions,
) -> Result<()> {
    // Carried sockets keep their options: nothing to check or describe.
    if opts.carry_files {
        return Ok(());
    }
    sockopt_check::check(pre, watch.is_some(), tcp, kept_checks(opts, watch))
}

/// Phase "connections described": with the counters on, every
/// connection described while the tree runs, so that the survey in the
/// freeze only checks that each is still the same; with kept checks, a
/// connection the capture before described is taken as it was while
/// the counters say its description stands
/// ([`sockopt_watch::Watch::descriptions_stand`]).
fn describe_connections(
    pre: &HashMap<i32, files::FdPresurvey>,
    watch: Option<&sockopt_watch::Watch>,
    opts: &CaptureOptions,
) {
    let Some(watch) = watch.filter(|_| !opts.carry_files) else { return };
    let kept = opts.kept_checks.as_ref().map(KeptChecks::descriptions);
    let describing = kept.map(|k| k.begin(watch.descriptions_stand()));
    let tree: Vec<i32> = pre.keys().copied().collect();
    for (&p, listed) in pre {
        files::pre_describe(p, listed, &tree, describing.as_ref());
    }
    if let (Some(k), Some(d)) = (kept, describing) {
        let (stood, described) = d.counts();
        tracing::debug!(
            "{described} connections described, {stood} of them kept from the capture before"
        );
        k.keep(d);
    }
}

/// The kept checks, and whether they stand: with a kept watch only.
fn kept_checks<'a>(
    opts: &'a CaptureOptions,
    watch: Option<&sockopt_watch::Watch>,
) -> Option<(&'a KeptChecks, bool)> {
    let watch = watch?;
    opts.kept_checks.as_ref().map(|k| (k, watch.checks_stand()))
}

/// The checks of phase "sharing checked" on their own, for a caller that
/// refuses early (a migration, before its pre-copy rounds); the capture
/// makes them again.
pub fn check_part_of_tree(pid: i32, opts: &CaptureOptions) -> Result<()> {
    check_sharing(pid, &survey::Presurvey::new(), opts).map(|_| ())
}

/// Phase "sharing checked", before the freeze: the root shares nothing
/// with the processes that stay (its parent's fd table or address space,
/// shared memory, open files), and its parent does not stay behind in
/// its job ([`root_parent`]). Sharing comes first: it is refused whatever
/// the user chose for the parent.
fn check_sharing(
    pid: i32,
    pre: &survey::Presurvey,
    opts: &CaptureOptions,
) -> Result<(outside::Checked, outside_files::CheckedFiles)> {
    if let Ok(st) = crate::procfs::Stat::read(pid) {
        sharing::check_outside(pid, st.field(4) as i32)?;
    }
    let memory = outside::check(pid)?;
    let files = outside_files::check(pid, pre, outside_scope(opts))?;
    root_parent::check(pid, opts.parent_sees_exit, opts.leave_running)?;
    Ok((memory, files))
}

fn outside_scope(opts: &CaptureOptions) -> outside_files::Scope {
    outside_files::Scope { external_stdio: opts.external_stdio, carry: opts.carry_files }
}

/// Phase "network lock prepared": its program loaded (and new connection
/// attempts held) while the tree still runs.
fn prepare_lock(
    pid: i32,
    pre: &survey::Presurvey,
    opts: &CaptureOptions,
    tcp: &tcp_tables::TcpTables,
    guard: &mut crate::guard::Guard,
) -> Result<Option<ferry_netlock::NetworkLock>> {
    if opts.carry_files {
        // Carried connections need no lock: they stay the same sockets.
        return Ok(None);
    }
    // Without the wait for handshakes only whether to prepare matters:
    // a TCP socket read by the option check says so without a dump of
    // the host's TCP table (a lock with nothing to hold is let go at
    // the engage, one needed and not prepared is prepared there).
    let scan = if opts.output_held && pre.values().any(files::FdPresurvey::has_tcp_read) {
        network::Scan::with_tcp()
    } else {
        let inodes = pre.values().flat_map(|p| p.socket_inodes()).collect();
        network::scan(pid, &inodes, tcp)
    };
    let kept = opts.kept_lock.as_ref().and_then(KeptLock::take);
    let mut prepared = network::prepare(pid, &scan, opts.network_lock, !opts.output_held, kept)?;
    if let Some(l) = &mut prepared {
        // Whichever way this capture ends, the lock goes back to the kept one.
        if let Some(kept) = &opts.kept_lock {
            kept.lend(l);
        }
        guard.lock(l.name());
    }
    Ok(prepared)
}

/// Phase "freeze": every thread of the tree stopped, its signal masks
/// told to the guard before they are blocked.
fn freeze(pid: i32, guard: &mut crate::guard::Guard) -> Result<tree::FrozenTree> {
    let tree = tree::FrozenTree::freeze(pid)?;
    for t in tree.procs.iter().flat_map(|p| p.frozen.threads.iter()) {
        guard.mask(t.tid, t.sigmask);
    }
    Ok(tree)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passing_states_are_tried_again_and_other_errors_are_not() {
        let mut calls = 0;
        let r: Result<u32> = retry_transient(
            || {
                calls += 1;
                if calls < 3 {
                    Err(EngineError::transient(1, "fd 3", "closing"))
                } else {
                    Ok(7)
                }
            },
            |_, _| {},
        );
        assert_eq!(r.ok(), Some(7));
        assert_eq!(calls, 3);

        let mut calls = 0;
        let r: Result<u32> = retry_transient(
            || {
                calls += 1;
                Err(EngineError::transient(1, "fd 3", "closing"))
            },
            |_, _| {},
        );
        assert!(r.is_err_and(|e| e.is_transient()));
        assert_eq!(calls, TRANSIENT_ATTEMPTS);

        let mut calls = 0;
        let r: Result<u32> = retry_transient(
            || {
                calls += 1;
                Err(EngineError::unsupported(1, "fd 3", "never"))
            },
            |_, _| {},
        );
        assert!(r.is_err_and(|e| !e.is_transient()));
        assert_eq!(calls, 1);
    }
}
