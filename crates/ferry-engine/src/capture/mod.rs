//! Capture: freeze a process, read every piece of its state, write the
//! image, and only then (optionally) kill it.
//!
//! Each kind of kernel object has its own module; this file only orders
//! them. Everything that may refuse a process (an unsupported fd or
//! mapping) runs before anything is changed inside it.

mod cgroups;
pub(crate) mod files;
mod memfd;
pub(crate) mod memory;
mod namespaces;
mod network;
mod prctl;
mod process;
mod seccomp;
mod sharing;
mod shm;
mod signals;
mod sysv_ipc;
mod threads;
mod timers;
pub(crate) mod tree;
pub mod vma_flags;

pub use memory::copy_present;

use crate::error::{EngineError, Result};
use crate::freeze::Frozen;
use crate::inject::{self, Remote, Scratch};
use crate::procfs;
use ferry_image::PageSink;
use ferry_image::{ImageDir, Inventory, ProcessImage, TreeImage, FORMAT_VERSION};
use std::collections::HashMap;
use std::path::Path;
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

/// What the survey of one frozen process found, before anything in it
/// was changed.
struct Survey {
    smaps: Vec<procfs::MapsEntry>,
    vmas: Vec<ferry_image::Vma>,
    files: Vec<ferry_image::OpenFile>,
    fds: Vec<ferry_image::FdSlot>,
    memfds: Vec<ferry_image::MemfdObject>,
    remote: Remote,
    /// Format-4 state found from outside (seccomp, fd owners, inode
    /// attributes, stop state); the per-thread prctl part is added by the
    /// injected capture.
    fidelity: ferry_image::Fidelity,
    seccomp_threads: Vec<seccomp::ThreadSeccomp>,
    /// Files (indices) of unix listeners with one connection waiting.
    pending_listeners: Vec<u32>,
    /// SO_PEERCRED of its connected unix sockets (host pids).
    unix_creds: Vec<ferry_image::UnixPeerCred>,
}

fn survey(pid: i32, frozen: &Frozen, tree: &[i32], opts: &CaptureOptions) -> Result<Survey> {
    let (smaps, without_page_walk) = vma_flags::frozen_smaps(pid, opts.presurveyed.get(&pid))?;
    tracing::debug!(
        "pid {pid}: mappings read {}",
        if without_page_walk { "by BPF and maps (presurvey proven)" } else { "from smaps" }
    );
    let vmas = memory::classify(pid, &smaps)?;
    let files::CapturedFds { files, fds, unix_connects, pending_listeners, unix_creds } =
        files::capture(pid, &frozen.pidfd, tree, opts.external_stdio)?;
    files::check_deleted_mapped(pid, &files, &fds, &vmas)?;
    let (memfds, mut inode_attrs) = memfd::capture(pid, &files, &fds, &vmas, &smaps)?;
    inode_attrs.extend(files::owner::deleted_attrs(pid, &files, &fds)?);
    let file_owners = files::owner::capture(pid, &frozen.pidfd, &files, &fds, tree)?;
    let tids: Vec<i32> = frozen.threads.iter().map(|t| t.tid).collect();
    prctl::check_thread_creds(pid, &tids)?;
    let (seccomp_filters, seccomp_threads) = seccomp::capture(pid, &tids)?;
    let deleted_files = memfd::capture_deleted_files(pid, &vmas, &smaps)?;
    let fidelity = ferry_image::Fidelity {
        seccomp_filters,
        file_owners,
        inode_attrs,
        stopped: frozen.stopped,
        deleted_files,
        unix_connects,
        ..Default::default()
    };
    let vdso = smaps.iter().find(|m| m.path == "[vdso]").ok_or_else(|| {
        EngineError::unsupported(pid, "the vDSO", "process has no [vdso] mapping")
    })?;
    let remote = Remote { pid, syscall_ip: inject::find_syscall_insn(pid, vdso.start, vdso.end)? };
    Ok(Survey {
        smaps,
        vmas,
        files,
        fds,
        memfds,
        remote,
        fidelity,
        seccomp_threads,
        pending_listeners,
        unix_creds,
    })
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

/// Checkpoints `pid` and all its descendants as one image directory.
pub fn checkpoint(pid: i32, dir: &Path, opts: &CaptureOptions) -> Result<CaptureSummary> {
    let dirh = ImageDir::new(dir);
    check_capturable(pid)?;
    let (mut captured, pages_bytes) = retry_transient(
        || {
            let mut pages = dirh.create_pages()?;
            let captured = capture(pid, &mut pages, opts, None)?;
            Ok((captured, pages.finish()?))
        },
        |n, e| tracing::info!("checkpoint attempt {n} refused, trying again: {e}"),
    )?;
    dirh.write_meta(&captured.inventory, &captured.tree)?;
    captured.phases.mark("metadata");
    verify_written(&dirh)?;
    captured.phases.mark("verify");
    let image_bytes =
        pages_bytes + std::fs::metadata(dir.join("meta.img")).map(|m| m.len()).unwrap_or(0);
    let summary = if opts.leave_running {
        captured.resume()?
    } else {
        let image = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
        captured.kill(LockAfterKill::HandOverTo(image.join(ferry_image::dir::META_FILE)))?
    };
    Ok(CaptureSummary { image_bytes, ..summary })
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
    if pid == me || is_ancestor(pid, me) {
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
    ) -> Result<HashMap<i32, Vec<(u64, u64)>>>;
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
    pub parent_pages: Vec<(i32, Vec<(u64, u64)>)>,
    pub phases: crate::phases::Phases,
    summary: CaptureSummary,
    t_frozen: Instant,
    repaired: files::tcp::Repaired,
    lock: Option<ferry_netlock::NetworkLock>,
    frozen: tree::FrozenTree,
    // Last, so it is dropped after every other cleanup ran.
    guard: crate::guard::Guard,
}

impl Captured {
    /// When the freeze began: the start of the service's pause.
    pub fn frozen_at(&self) -> Instant {
        self.t_frozen
    }

    /// The tree's PIDs as ferry sees them, root first.
    pub fn pids(&self) -> Vec<i32> {
        self.frozen.pids()
    }

    /// Lets the tree run on: connections leave repair mode, then their
    /// packets flow again, then every thread continues.
    pub fn resume(self) -> Result<CaptureSummary> {
        let Captured { mut phases, summary, t_frozen, repaired, lock, frozen, guard, .. } = self;
        drop(repaired);
        if let Some(lock) = lock {
            lock.thaw()?;
        }
        frozen.release()?;
        phases.mark("release");
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
        let Captured {
            tree: tree_image,
            mut phases,
            summary,
            t_frozen,
            repaired,
            lock,
            frozen,
            mut guard,
            ..
        } = self;
        guard.killed();
        repaired.keep_in_repair();
        frozen.kill()?;
        if let Some(lock) = lock {
            match after {
                // Restore thaws it, once the connections exist again.
                LockAfterKill::HandOverTo(meta) => {
                    lock.hand_over_to(Some(&meta));
                }
                LockAfterKill::Release => lock.thaw()?,
            }
        }
        shm::remove_sysv(&tree_image.sysv_shm);
        sysv_ipc::remove(&tree_image.sysv_sem, &tree_image.sysv_msg);
        phases.mark("kill");
        drop(guard);
        // Killed processes stay zombies until their parent (or, for
        // orphans, init or a subreaper) reaps them; restore waits for
        // their PIDs.
        Ok(CaptureSummary {
            frozen_ms: t_frozen.elapsed().as_secs_f64() * 1e3,
            total_ms: phases.started().elapsed().as_secs_f64() * 1e3,
            ..summary
        })
    }
}

/// Freezes `pid` and all its descendants and captures them: metadata
/// returned, pages written to `sink`. The tree stays frozen in the
/// returned [`Captured`] until the caller kills or resumes it; on error
/// it runs on untouched.
pub fn capture(
    pid: i32,
    sink: &mut dyn PageSink,
    opts: &CaptureOptions,
    mut hooks: Option<&mut dyn CaptureHooks>,
) -> Result<Captured> {
    check_capturable(pid)?;
    let mut ph = crate::phases::Phases::start("checkpoint");
    // Declared first so it is dropped last, after every cleanup below ran.
    let mut guard = crate::guard::Guard::start()?;
    // The slow part of the network lock, while the tree still runs.
    let scan = network::scan(pid);
    let prepared = network::prepare(pid, &scan, opts.network_lock)?;
    if let Some(l) = &prepared {
        guard.lock(l.name());
    }
    ph.mark("network lock prepared");
    // The pause starts with the first thread seized.
    let t_frozen = Instant::now();
    let tree = tree::FrozenTree::freeze(pid)?;
    for t in tree.procs.iter().flat_map(|p| p.frozen.threads.iter()) {
        guard.mask(t.tid, t.sigmask);
    }
    let pids = tree.pids();
    ph.mark("freeze");
    tree.check_groups()?;
    namespaces::check_mounts(&pids)?;
    namespaces::check_ipc(&pids)?;
    namespaces::check_others(&pids)?;
    let ppids: Vec<i32> = tree.procs.iter().map(|p| p.ppid).collect();
    let share_files = sharing::check(&pids, &ppids)?;
    let tasks: Vec<(i32, Vec<i32>)> = tree
        .procs
        .iter()
        .map(|p| (p.frozen.pid, p.frozen.threads.iter().map(|t| t.tid).collect()))
        .collect();
    let zombie_pids: Vec<i32> = tree.zombies.iter().map(|z| z.pid).collect();
    let pid_view = namespaces::pid_view(&tasks, &zombie_pids)?;
    let cgroups = cgroups::capture(&tasks)?;

    // Survey first: refuse what we cannot capture before touching anything.
    let mut surveys = Vec::with_capacity(tree.procs.len());
    for p in &tree.procs {
        surveys.push(survey(p.frozen.pid, &p.frozen, &pids, opts)?);
    }
    // A socket shared by several processes was read once by each.
    let mut unix_creds: Vec<ferry_image::UnixPeerCred> =
        surveys.iter_mut().flat_map(|s| std::mem::take(&mut s.unix_creds)).collect();
    unix_creds.sort_unstable_by_key(|c| c.ino);
    unix_creds.dedup_by_key(|c| c.ino);
    {
        let mut pf: Vec<files::ProcessFiles> = surveys
            .iter_mut()
            .zip(&pids)
            .map(|(s, &pid)| files::ProcessFiles { pid, files: &mut s.files, fds: &s.fds })
            .collect();
        files::link_tree(&mut pf, &pids, &unix_creds)?;
    }
    // A listener's waiting connection must be one of the tree's sockets.
    for (s, &pid) in surveys.iter().zip(&pids) {
        for &l in &s.pending_listeners {
            let ferry_image::FileKind::UnixSocket(u) = &s.files[l as usize].kind else {
                continue;
            };
            let mut positions: Vec<u32> = surveys
                .iter()
                .flat_map(|t| t.fidelity.unix_connects.iter())
                .filter(|c| c.listener == u.ino)
                .map(|c| c.position)
                .collect();
            positions.sort_unstable();
            // Every waiting client, each at its own place (0, 1, 2...).
            if positions.is_empty() || positions.iter().enumerate().any(|(i, &p)| p != i as u32) {
                let fd = s.fds.iter().find(|x| x.file == l).map_or(-1, |x| x.fd);
                return Err(EngineError::unsupported(pid, format!("fd {fd} (socket:[{}])", u.ino), "the connection waiting in its accept queue comes from outside the process tree"));
            }
        }
    }
    {
        let views: Vec<(i32, &[ferry_image::OpenFile], &[ferry_image::FdSlot])> = surveys
            .iter()
            .zip(&pids)
            .map(|(s, &pid)| (pid, s.files.as_slice(), s.fds.as_slice()))
            .collect();
        let targets = files::epoll::resolve_targets(&views)?;
        for (s, t) in surveys.iter_mut().zip(targets) {
            s.fidelity.epoll_targets = t;
        }
    }
    let views: Vec<(i32, &[ferry_image::Vma], &[procfs::MapsEntry])> = surveys
        .iter()
        .zip(&pids)
        .map(|(s, &pid)| (pid, s.vmas.as_slice(), s.smaps.as_slice()))
        .collect();
    let shared_anon = shm::capture_shared_anon(&views)?;
    let sysv_shm = shm::capture_sysv(&views)?;
    let sysv_sem = sysv_ipc::capture_sem(&pids)?;
    let sysv_msg = sysv_ipc::capture_msg(&pids)?;
    ph.mark("survey");

    // Established TCP connections: frozen on the network, then read in
    // repair mode, which stays on until the tree is killed.
    let established = {
        let views: Vec<(i32, &[ferry_image::OpenFile], &[ferry_image::FdSlot])> = surveys
            .iter()
            .zip(&pids)
            .map(|(s, &pid)| (pid, s.files.as_slice(), s.fds.as_slice()))
            .collect();
        files::tcp::established(&views)
    };
    let lock = {
        let procs: Vec<(i32, &[ferry_image::OpenFile])> =
            surveys.iter().zip(&pids).map(|(s, &pid)| (pid, s.files.as_slice())).collect();
        network::engage(prepared, &established, &procs, opts.network_lock)?
    };
    if let Some(l) = &lock {
        guard.lock(l.name());
    }
    ph.mark("network freeze");
    {
        let procs: Vec<(i32, &[ferry_image::OpenFile], &[ferry_image::FdSlot])> = surveys
            .iter()
            .zip(&pids)
            .map(|(s, &pid)| (pid, s.files.as_slice(), s.fds.as_slice()))
            .collect();
        network::check_accept_queues(&procs, |pid| {
            tree.procs.iter().find(|p| p.frozen.pid == pid).map(|p| &p.frozen.pidfd)
        })?;
    }
    let (repaired, states) = files::tcp::capture(
        &established,
        |pid| tree.procs.iter().find(|p| p.frozen.pid == pid).map(|p| &p.frozen.pidfd),
        |socks| guard.repair(socks),
    )?;
    {
        let mut files_of: Vec<&mut Vec<ferry_image::OpenFile>> =
            surveys.iter_mut().map(|s| &mut s.files).collect();
        files::tcp::store(&established, states, &mut files_of);
    }
    ph.mark("tcp connections");

    let mut images = Vec::with_capacity(surveys.len());
    for (p, sv) in tree.procs.iter().zip(&surveys) {
        images.push(capture_process_injected(&p.frozen, sv)?);
    }
    ph.mark("injected syscalls");

    let held: HashMap<i32, Vec<(u64, u64)>> = match hooks.as_mut() {
        Some(h) => {
            let procs: Vec<(i32, &[ferry_image::Vma])> =
                pids.iter().zip(&surveys).map(|(&pid, s)| (pid, s.vmas.as_slice())).collect();
            h.held_pages(&procs)?
        }
        None => HashMap::new(),
    };
    let mut parent_pages = Vec::new();
    let mut processes: Vec<ProcessImage> = Vec::with_capacity(surveys.len());
    for (i, ((p, sv), injected)) in tree.procs.iter().zip(surveys).zip(images).enumerate() {
        let pid = p.frozen.pid;
        let parent = (i > 0).then(|| pids.iter().position(|&q| q == p.ppid)).flatten();
        let inherited = match parent {
            Some(k) => memory::inherited_from_parent(pid, &sv.vmas, pids[k], &processes[k].vmas)?,
            None => Vec::new(),
        };
        let mut skip: Vec<(u64, u64)> =
            inherited.iter().flat_map(|v| v.shared_pages.iter().copied()).collect();
        skip.sort_unstable();
        let held_here = held.get(&pid).map_or(&[][..], |h| h.as_slice());
        let (page_runs, in_parent) = memory::dump_pages(
            pid,
            &sv.vmas,
            &sv.smaps,
            &skip,
            held_here,
            pids.len() > 1,
            sink,
            opts.progress.as_ref(),
        )?;
        if !in_parent.is_empty() {
            parent_pages.push((pid, in_parent));
        }
        let (threads, signals, itimers, posix_timers, (brk, misc), (deathsigs, securebits)) =
            injected;
        let mut fidelity = sv.fidelity;
        fidelity.securebits = securebits;
        fidelity.exit_signal = crate::procfs::Stat::read(pid)?.field(38) as i32;
        fidelity.shares_files_with_parent = share_files.contains(&pid);
        fidelity.threads = sv
            .seccomp_threads
            .iter()
            .map(|(tid, mode, chain)| ferry_image::ThreadFidelity {
                tid: *tid,
                seccomp_mode: *mode,
                seccomp: chain.clone(),
                pdeathsig: deathsigs.iter().find(|d| d.0 == *tid).map_or(0, |d| d.1),
            })
            .collect();
        let mut image = ProcessImage {
            threads,
            vmas: sv.vmas,
            page_runs,
            files: sv.files,
            fds: sv.fds,
            signals,
            itimers,
            posix_timers,
            misc,
            memfds: sv.memfds,
            inherited,
            fidelity,
            ..process::capture(pid)?
        };
        image.ppid = p.ppid;
        image.mm = memory::mm_layout(pid, brk)?;
        image.signals.shared_pending = signals::shared_pending(pid)?;
        processes.push(image);
    }
    let pages_bytes = sink.data_len();
    ph.mark("pages");
    let network_lock = lock.as_ref().map(|l| ferry_image::NetworkLockRef {
        method: opts.network_lock.to_string(),
        name: l.name().to_string(),
    });
    let mut tree_image = TreeImage {
        processes,
        zombies: tree.zombies.clone(),
        shared_anon,
        sysv_shm,
        sysv_sem,
        sysv_msg,
        network_lock,
        cgroups: Some(ferry_image::CgroupImage { processes: cgroups }),
        unix_peers: Some(ferry_image::UnixPeersImage { sockets: unix_creds }),
        ..Default::default()
    };
    if let Some(view) = &pid_view {
        for c in tree_image.unix_peers.iter_mut().flat_map(|u| u.sockets.iter_mut()) {
            c.pid = view.inner(c.pid);
        }
        for c in tree_image.cgroups.iter_mut().flat_map(|g| g.processes.iter_mut()) {
            c.pid = view.inner(c.pid);
        }
        namespaces::translate(&mut tree_image, view);
        for (pid, _) in parent_pages.iter_mut() {
            *pid = view.inner(*pid);
        }
    }

    let root = &tree_image.processes[0];
    let inventory = Inventory {
        format_version: FORMAT_VERSION,
        ferry_version: env!("CARGO_PKG_VERSION").to_string(),
        kernel_release: procfs::read_string("/proc/sys/kernel/osrelease")?.trim().to_string(),
        arch: std::env::consts::ARCH.to_string(),
        xsave_size: root.threads[0].xstate.len() as u32,
        created_unix_ms: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0),
        source_pid: pid,
        pages_bytes,
    };
    let summary = CaptureSummary {
        pid,
        processes: tree_image.processes.len(),
        threads: tree_image.processes.iter().map(|p| p.threads.len()).sum(),
        mappings: tree_image.processes.iter().map(|p| p.vmas.len()).sum(),
        fds: tree_image.processes.iter().map(|p| p.fds.len()).sum(),
        pages: pages_bytes / 4096,
        image_bytes: pages_bytes,
        frozen_ms: 0.0,
        total_ms: 0.0,
    };
    Ok(Captured {
        inventory,
        tree: tree_image,
        parent_pages,
        phases: ph,
        summary,
        t_frozen,
        repaired,
        lock,
        frozen: tree,
        guard,
    })
}

/// Whether `pid` is an ancestor of `of`.
fn is_ancestor(pid: i32, of: i32) -> bool {
    let mut cur = of;
    for _ in 0..4096 {
        let Ok(st) = crate::procfs::Stat::read(cur) else {
            return false;
        };
        let ppid = st.field(4) as i32;
        if ppid == pid {
            return true;
        }
        if ppid <= 1 {
            return false;
        }
        cur = ppid;
    }
    false
}

/// Runs the injected part of the capture inside one frozen process, from
/// a scratch mapping that is removed again afterwards.
fn capture_process_injected(frozen: &Frozen, sv: &Survey) -> Result<Injected> {
    let pid = frozen.pid;
    let locked_before = memory::locked_kb(pid)?;
    let scratch = Scratch::map(&sv.remote, pid)?;
    let ctx = Ctx {
        pid,
        frozen,
        remote: sv.remote,
        scratch: scratch.addr,
        data: scratch.addr + inject::SCRATCH_DATA,
    };
    let injected =
        memory::check_mlock_future(pid, locked_before).and_then(|()| capture_injected(&ctx));
    let unmapped = scratch.unmap(&ctx.remote, pid);
    let injected = injected?;
    unmapped?;
    Ok(injected)
}

type Injected = (
    Vec<ferry_image::ThreadImage>,
    ferry_image::SignalState,
    Vec<ferry_image::ITimer>,
    Vec<ferry_image::PosixTimer>,
    (u64, ferry_image::ProcessMisc),
    (Vec<(i32, i32)>, u32),
);

/// Everything that needs syscalls run inside the process.
fn capture_injected(ctx: &Ctx) -> Result<Injected> {
    let threads =
        ctx.frozen.threads.iter().map(|t| threads::capture(ctx, t)).collect::<Result<Vec<_>>>()?;
    let signal_state = signals::capture_actions(ctx)?;
    let itimers = timers::capture_itimers(ctx)?;
    let posix = timers::capture_posix(ctx)?;
    let brk_misc = process::capture_injected(ctx)?;
    prctl::check_unrestored(ctx)?;
    let prctl = prctl::capture_injected(ctx)?;
    Ok((threads, signal_state, itimers, posix, brk_misc, prctl))
}

/// Reads the metadata back and checks the page file against it. Page data
/// was already read back and checked batch by batch as it was written.
fn verify_written(dir: &ImageDir) -> Result<()> {
    let (inv, _tree) = dir.read_meta()?;
    dir.check_pages_file(&inv)?;
    Ok(())
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
