//! Restore: rebuild a process tree from an image under its old PIDs.
//!
//! 1. The image is read and every checksum verified before anything else.
//! 2. ferry creates every shared object once in its own process
//!    ([`staging`], [`files`]): open file descriptions, memfds, shared
//!    memory, SysV segments, files to map.
//! 3. ferry forks the root with its old PID (clone3 + set_tid); the root
//!    sets up its session and directory itself ([`child`]) and stops.
//! 4. ferry drives the stopped process with ptrace and injected syscalls:
//!    fd table, then its address space ([`memory`]); then each child is
//!    forked from its restored parent ([`fork`]), keeping the pages they
//!    shared, and set up the same way; zombies are forked and exit.
//! 5. In every process: threads with their TIDs ([`threads`]), signals,
//!    timers, limits, credentials ([`signals`], [`timers`], [`process`]),
//!    and finally registers, FPU state and signal masks; then all are
//!    released. Any failure before that kills every process made: a tree
//!    is either fully restored or not there at all.

mod cgroups;
mod child;
pub(crate) mod files;
mod fork;
mod lazy;
mod memory;
mod pidns;
pub use pidns::{restore_held as restore_held_in_new_pid_ns, HeldInNamespace};
mod prctl;
mod process;
mod seccomp;
mod signals;
mod staging;
mod sysv_ipc;
mod threads;
mod timers;

use crate::error::{EngineError, Result};
use crate::inject::{self, Remote, Scratch};
use ferry_image::{ImageDir, ProcessImage, TreeImage};
use ferry_sys::ptrace::{self, WaitEvent};
use staging::StagingMap;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::time::Instant;

#[derive(Clone)]
pub struct RestoreOptions {
    /// Where fds that were terminals point after restore.
    pub tty_to: String,
    /// Network namespace to restore into (a file such as /run/netns/NAME
    /// or /proc/PID/ns/net); None: ferry's own.
    pub netns: Option<std::path::PathBuf>,
    /// Called as page data is copied in (bytes done, bytes total).
    pub progress: Option<crate::ProgressFn>,
    /// Restore into a fresh PID namespace (see [`pidns`]), so the tree's
    /// PIDs cannot be taken. Implied by an image of a tree that ran in its
    /// own PID namespace.
    pub new_pid_ns: bool,
    /// A network lock prepared on this host for the image's connections
    /// (by name), taken over instead of the one the image names: a
    /// migrated tree's lock was set up by the destination.
    pub adopt_lock: Option<String>,
    /// Memory of ferry's own placed where the root has its pages (see
    /// ferry_sys::placed): the root inherits it over fork for the
    /// mappings its image lists as `inherited`, and ferry drops its copy
    /// right after. Only for a restore in a process forked from the
    /// regions' owner (restore_held_in_new_pid_ns's helper).
    pub placed_for_root: ferry_sys::placed::InheritedRegions,
    /// Post-copy: per image PID, the pages ((address, pages) runs, sorted)
    /// that are not in the page data but fetched on first touch; their
    /// mappings are registered with a userfaultfd ([`Held::lazy_uffds`]).
    /// Single-process trees only.
    pub lazy: Vec<(i32, Vec<(u64, u64)>)>,
}

impl Default for RestoreOptions {
    fn default() -> Self {
        RestoreOptions {
            tty_to: "/dev/null".into(),
            netns: None,
            progress: None,
            new_pid_ns: false,
            adopt_lock: None,
            placed_for_root: Default::default(),
            lazy: Vec::new(),
        }
    }
}

#[derive(Debug, Clone)]
pub struct Restored {
    /// The root's PID as the tree sees it (the image's).
    pub pid: i32,
    /// The root's PID as ferry sees it: differs from `pid` in a new PID
    /// namespace.
    pub host_pid: i32,
    /// The PID namespace's init, ferry's child, which exits with the
    /// root's status; None when restored into ferry's namespace.
    pub init_pid: Option<i32>,
    pub processes: usize,
    pub threads: usize,
    pub total_ms: f64,
}

/// The restore of one process in progress, driven from ferry.
pub(crate) struct Session<'a> {
    pub pid: i32,
    pub image: &'a ProcessImage,
    pub remote: Remote,
    /// The scratch mapping (batch code and call table) and its part free
    /// for syscall arguments.
    pub scratch: u64,
    pub data: u64,
    /// Descriptors opened by ferry before the fork, present in every
    /// process under the same numbers: files to map, memfds, shared memory.
    staging: &'a StagingMap,
}

impl Session<'_> {
    /// Runs a syscall in the thread group leader.
    pub fn call(&mut self, name: &str, nr: i64, args: &[u64]) -> Result<u64> {
        self.remote.call(self.pid, name, nr, args)
    }

    /// Runs named calls in thread `tid` as one batch; the first failure
    /// becomes an error naming its call.
    pub fn run(&mut self, tid: i32, calls: &[(String, inject::Call)]) -> Result<Vec<u64>> {
        let only: Vec<inject::Call> = calls.iter().map(|c| c.1).collect();
        let results = self.remote.batch(tid, self.scratch, &only)?;
        calls
            .iter()
            .zip(results)
            .map(|((name, _), r)| inject::check(self.pid, tid, name, r))
            .collect()
    }

    pub fn staging_fd(&self, path: &str, rw: bool) -> Result<RawFd> {
        self.staging.get(&(path.to_string(), rw)).copied().ok_or_else(|| {
            EngineError::restore(self.pid, format!("no staged descriptor for {path}"))
        })
    }
}

/// Whether every PID and thread ID the tree needs is free in ferry's PID
/// namespace right now (a restore there would not meet a taken one).
pub fn pids_free_here(tree: &TreeImage) -> bool {
    tree_ids(tree).all(|id| pid_owner(id).is_none())
}

/// Every thread ID and zombie PID the tree takes.
fn tree_ids(tree: &TreeImage) -> impl Iterator<Item = i32> + '_ {
    tree.processes
        .iter()
        .flat_map(|p| p.threads.iter().map(|t| t.tid))
        .chain(tree.zombies.iter().map(|z| z.pid))
}

fn pid_owner(pid: i32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/comm")).ok().map(|s| s.trim().to_string())
}

/// Kills every process made so far unless disarmed, and reaps what ferry
/// must reap (its child, the root, and every traced process).
struct TreeGuard {
    pids: Vec<i32>,
    disarmed: bool,
}

impl Drop for TreeGuard {
    fn drop(&mut self) {
        if self.disarmed || self.pids.is_empty() {
            return;
        }
        // Killing processes this restore created, by PID, then reaping
        // them (traced threads must go before their leader).
        for &pid in self.pids.iter().rev() {
            let _ = ferry_sys::process::kill(pid, libc::SIGKILL);
        }
        for _ in 0..100_000 {
            if !ferry_sys::process::reap_any_thread() {
                break;
            }
        }
    }
}

/// Lets ferry hold as many descriptors as its hard limit allows: a tree's
/// staged files all live in ferry at once.
fn raise_fd_limit() {
    ferry_sys::process::raise_nofile_limit();
}

fn lift_fd(pid: i32, fd: RawFd, temp_base: RawFd, what: &str) -> Result<OwnedFd> {
    ferry_sys::fd::dup_above(fd, temp_base)
        .map_err(|e| EngineError::kernel(pid, format!("staging {what}"), e))
}

/// Runs `f` with ferry in network namespace `ns` (if any), then returns
/// to its own: sockets made meanwhile belong to `ns`.
fn in_netns<T>(pid: i32, ns: Option<RawFd>, f: impl FnOnce() -> Result<T>) -> Result<T> {
    let Some(ns) = ns else { return f() };
    let own = std::fs::File::open("/proc/thread-self/ns/net")
        .map_err(|e| EngineError::io("/proc/thread-self/ns/net", e))?;
    ferry_sys::netns::enter_net_namespace_fd(ns)
        .map_err(|e| EngineError::kernel(pid, "joining the network namespace", e))?;
    let r = f();
    ferry_sys::netns::enter_net_namespace_fd(own.as_raw_fd())
        .map_err(|e| EngineError::kernel(pid, "returning to ferry's network namespace", e))?;
    r
}

pub fn restore(dir: &Path, opts: &RestoreOptions) -> Result<Restored> {
    let t0 = Instant::now();
    ImageDir::new(dir).check_private()?;
    // An incremental image (pre-copy migration) is refused: its other
    // pages are in its parent.
    let (inv, tree) = ImageDir::new(dir).read_meta_complete()?;
    let dirh = ImageDir::new(dir);
    let pages_file = dirh.check_pages_file(&inv)?;
    let pid = tree.root().map_or(inv.source_pid, |p| p.pid);
    let pages = ferry_sys::process::MappedFile::map(
        &pages_file,
        ferry_image::dir::PAGES_DATA_OFFSET,
        inv.pages_bytes as usize,
    )
    .map_err(|e| EngineError::kernel(pid, "mapping pages.img", e))?;
    let all_runs: Vec<ferry_image::PageRun> =
        tree.processes.iter().flat_map(|p| p.page_runs.iter().copied()).collect();
    ImageDir::verify_runs_parallel(&all_runs, pages.bytes(), crate::worker_threads())?;
    drop(all_runs);
    if opts.new_pid_ns || tree.own_pid_namespace {
        return pidns::restore_held(tree, pages.bytes(), opts, t0)?.release();
    }
    restore_held(tree, pages.bytes(), opts, t0)?.release()
}

/// A restored tree, complete and still stopped under ptrace, its
/// connections in repair mode behind the network lock: nothing of it has
/// run yet. [`Held::release`] lets it run; dropping it kills every process
/// of it, so the service runs in one place only.
pub struct Held {
    pid: i32,
    tree: TreeImage,
    connections: HashMap<u64, OwnedFd>,
    lock: Option<ferry_netlock::NetworkLock>,
    /// (pid, its other threads, whether it was in a job-control stop),
    /// parents before children.
    procs: Vec<(i32, Vec<i32>, bool)>,
    sysv: staging::SysvSegments,
    sysv_ipc: sysv_ipc::SysvIpc,
    staged_files: HashMap<u64, OwnedFd>,
    staging: staging::Staging,
    phases: crate::phases::Phases,
    /// Post-copy: (image PID, its userfaultfd) of processes with lazy pages.
    uffds: Vec<(i32, OwnedFd)>,
    /// ferry's copies of the pages the root inherited: dropped once the
    /// tree runs, so that its pages are its own (no copy per page on
    /// write) without the unmapping counting in the pause.
    placed: ferry_sys::placed::InheritedRegions,
    guard: TreeGuard,
}

impl Held {
    /// The root's PID (the image's).
    pub fn pid(&self) -> i32 {
        self.pid
    }

    pub fn phases(&self) -> &crate::phases::Phases {
        &self.phases
    }

    /// Post-copy: (image PID, descriptor in this process) of each
    /// userfaultfd whose registered mappings wait for their pages.
    pub fn lazy_uffds(&self) -> Vec<(i32, RawFd)> {
        self.uffds.iter().map(|(p, f)| (*p, f.as_raw_fd())).collect()
    }

    /// Brings the connections alive and lets every process run.
    pub fn release(self) -> Result<Restored> {
        self.release_then(|_| ())
    }

    /// Like [`Held::release`], calling `running` as soon as every process
    /// runs, before the network lock and the staging are taken down (a
    /// migration reports the service running at that moment).
    pub fn release_then(self, running: impl FnOnce(&Restored)) -> Result<Restored> {
        let Held {
            pid,
            tree,
            connections,
            mut lock,
            procs,
            mut sysv,
            mut sysv_ipc,
            staged_files,
            staging,
            mut phases,
            uffds,
            placed,
            mut guard,
        } = self;
        let ph = &mut phases;
        // The connections come alive only now, with every process that
        // owns one in place and still stopped.
        let rebuilt = files::tcp::leave_repair(&tree, &connections)?;
        ph.mark("tcp repair off");
        // The end of the network pause: one map update for the eBPF lock.
        // The lock itself is taken down after the tree runs.
        if let Some(l) = lock.as_mut() {
            l.disengage()?;
        }
        ph.mark("network thaw");
        files::tcp::resend(&rebuilt)?;
        ph.mark("tcp resend");
        // Children first, so a parent never runs while its child is still held.
        for (p, tids, stopped) in procs.iter().rev() {
            if *stopped {
                // Queued while every thread is still held: the process takes
                // it on its way out of the ptrace stop, before running any
                // instruction of its own, and enters the job-control stop.
                ferry_sys::process::kill(*p, libc::SIGSTOP)
                    .map_err(|e| EngineError::kernel(*p, "stopping it again (SIGSTOP)", e))?;
            }
            for &tid in std::iter::once(p).chain(tids) {
                ptrace::detach(tid, 0)
                    .map_err(|e| EngineError::kernel(*p, format!("releasing thread {tid}"), e))?;
            }
        }
        guard.disarmed = true;
        let threads = tree.processes.iter().map(|p| p.threads.len()).sum();
        let restored = Restored {
            pid,
            host_pid: pid,
            init_pid: None,
            processes: tree.processes.len(),
            threads,
            total_ms: ph.started().elapsed().as_secs_f64() * 1e3,
        };
        running(&restored);
        if !placed.is_empty() {
            if let Err(e) = placed.unmap() {
                tracing::warn!("dropping ferry's copy of the placed pages: {e}");
            }
        }
        if let Some(l) = lock.take() {
            if let Err(e) = l.thaw() {
                tracing::warn!("taking the network lock down: {e}");
            }
        }
        ph.mark("network lock removed");
        sysv.keep = true;
        sysv_ipc.keep = true;
        drop(staged_files);
        drop(staging);
        drop(connections);
        // The caller took its own copies (the migration's pager).
        drop(uffds);
        Ok(restored)
    }
}

/// Rebuilds the tree of a decoded image, whose page data area is `pages`
/// (already verified by the caller), in the PID namespace ferry is in,
/// and holds it stopped.
pub fn restore_held(
    tree: TreeImage,
    pages: &[u8],
    opts: &RestoreOptions,
    t0: Instant,
) -> Result<Held> {
    // From the start of the restore: reading and decoding the image counts.
    let mut ph = crate::phases::Phases::start_at("restore", t0);
    let root = tree.root().ok_or_else(|| EngineError::restore(0, "image holds no process"))?;
    let pid = root.pid;
    ph.mark("read+verify image");
    for id in tree_ids(&tree) {
        // A zombie of the checkpointed tree that init has not reaped yet
        // frees its PID in a moment.
        if crate::procfs::state(id) == Some('Z') {
            crate::capture::tree::wait_reaped(&[id], std::time::Duration::from_secs(5));
        }
        if let Some(comm) = pid_owner(id) {
            return Err(EngineError::PidTaken { pid: id, comm });
        }
    }
    raise_fd_limit();

    // Above every fd number of the image, also those only epoll entries
    // still name (they are reused briefly to register those entries).
    let max_fd = tree
        .processes
        .iter()
        .flat_map(|p| {
            p.fds.iter().map(|s| s.fd).chain(p.fidelity.epoll_targets.iter().map(|t| t.fd))
        })
        .max()
        .unwrap_or(2)
        .max(2);
    let temp_base = max_fd + 1;
    let netns = match &opts.netns {
        Some(path) => {
            let f = std::fs::File::open(path)
                .map_err(|e| EngineError::io(format!("network namespace {}", path.display()), e))?;
            Some(lift_fd(pid, f.as_raw_fd(), temp_base, "the network namespace")?)
        }
        None => None,
    };
    let netns_fd = netns.as_ref().map(|f| f.as_raw_fd());
    // Owned by this restore from now on: a failure thaws it (the
    // connections are gone then), success thaws it once they exist again.
    let lock = match &opts.adopt_lock {
        Some(name) => Some(
            ferry_netlock::NetworkLock::adopt(name)
                .map_err(|e| EngineError::restore(pid, format!("network lock {name}: {e}")))?,
        ),
        None => adopt_network_lock(&tree),
    };
    let sysv = staging::SysvSegments::create(&tree)?;
    let sysv_ipc = sysv_ipc::SysvIpc::create(&tree)?;
    let staging = staging::stage(&tree, temp_base)?;
    let memfd_fds: HashMap<u64, RawFd> =
        staging.memfds.iter().map(|(id, (fd, _))| (*id, *fd)).collect();
    let mut staged_files = in_netns(pid, netns_fd, || {
        files::stage_open_files(&tree, &opts.tty_to, temp_base, &memfd_fds)
    })?;
    let staged_raw: HashMap<u64, RawFd> =
        staged_files.iter().map(|(id, fd)| (*id, fd.as_raw_fd())).collect();
    ph.mark("stage files");

    let (go_r, go_w) = ferry_sys::fd::pipe2(libc::O_CLOEXEC)
        .map_err(|e| EngineError::kernel(pid, "creating a pipe", e))?;
    let (st_r, st_w) = ferry_sys::fd::pipe2(libc::O_CLOEXEC)
        .map_err(|e| EngineError::kernel(pid, "creating a pipe", e))?;
    let st_w = {
        let low = st_w;
        lift_fd(pid, low.as_raw_fd(), temp_base, "the status pipe")?
    };
    let mut keep: Vec<RawFd> = staging.keep_fds();
    keep.extend(staged_raw.values().copied());
    keep.push(st_w.as_raw_fd());
    keep.extend(netns_fd);

    // SAFETY: ferry is single-threaded here (no thread pools, no
    // background logging), so the child may run ordinary Rust code.
    let forked = ferry_sys::clone::fork_with_pid(pid);
    let child_pid = match forked {
        Ok(0) => child::run(child::ChildPlan {
            image: root,
            keep,
            netns: netns_fd,
            go: go_r,
            status: st_w,
        }),
        Ok(p) => p,
        Err(e) if e.errno == libc::EEXIST => {
            return Err(EngineError::PidTaken {
                pid,
                comm: pid_owner(pid).unwrap_or_else(|| "unknown".into()),
            })
        }
        Err(e) => return Err(EngineError::kernel(pid, "creating the process with its PID", e)),
    };
    let mut guard = TreeGuard { pids: vec![child_pid], disarmed: false };
    drop(st_w);
    drop(go_r);
    ptrace::seize(
        child_pid,
        ptrace::PTRACE_O_TRACECLONE | ptrace::PTRACE_O_TRACEFORK | ptrace::PTRACE_O_EXITKILL,
    )
    .map_err(|e| EngineError::kernel(pid, "seizing the new process", e))?;
    std::fs::File::from(go_w).write_all(b"g").map_err(|e| EngineError::io("restore go pipe", e))?;
    let mut msg = String::new();
    std::fs::File::from(st_r)
        .read_to_string(&mut msg)
        .map_err(|e| EngineError::io("restore status pipe", e))?;
    if !msg.is_empty() {
        return Err(EngineError::restore(pid, msg));
    }
    match ptrace::wait_tid(child_pid, 0)
        .map_err(|e| EngineError::kernel(pid, "waiting for the new process", e))?
    {
        Some((_, WaitEvent::Stopped { sig: libc::SIGSTOP, .. })) => {}
        other => {
            return Err(EngineError::restore(
                pid,
                format!("new process did not stop as expected: {other:?}"),
            ))
        }
    }
    let hierarchies = match &tree.cgroups {
        Some(_) => cgroups::mounted(&crate::procfs::read_string("/proc/self/mountinfo")?),
        None => Vec::new(),
    };
    let join_cgroups = |pid: i32| -> Result<()> {
        match tree.cgroups.as_ref().and_then(|c| c.processes.iter().find(|p| p.pid == pid)) {
            Some(recorded) => cgroups::join(pid, recorded, &hierarchies),
            None => Ok(()),
        }
    };
    join_cgroups(pid)?;
    ph.mark("fork root");
    // Established connections are made now, after the fork, so that they
    // need no fd numbers in the range the tree inherits: a tree with
    // 10,000 connections would not fit under the fd limit twice.
    let mut connections = in_netns(pid, netns_fd, || files::tcp::create_all(&tree))?;
    ph.mark("tcp connections rebuilt");

    // Phase 1, parents before children: memory, then fork; the fd tables
    // once every process exists (below).
    let vdso = ferry_sys_self_vdso()?;
    let remote = Remote { pid, syscall_ip: inject::find_syscall_insn(pid, vdso.0, vdso.1)? };
    let mut sessions: Vec<Session> = Vec::with_capacity(tree.processes.len());
    let mut epolls = std::collections::HashSet::new();
    let mut s = Session { pid, image: root, remote, scratch: 0, data: 0, staging: &staging.map };
    prepare_root(&mut s, &tree)?;
    // Mappings whose pages the root inherited from ferry (a migration
    // placed them at their addresses) are kept like a child's.
    let mut kept: Vec<(u64, u64)> = root.inherited.iter().map(|v| (v.start, v.end)).collect();
    kept.sort_unstable();
    memory::clear_address_space(&mut s, &kept)?;
    memory::place_vdso(&mut s, &root.vmas)?;
    let mut reprotect = memory::map_all(&mut s, &root.vmas, &root.page_runs, &kept)?;
    if !kept.is_empty() {
        reprotect.extend(memory::prepare_inherited(&mut s, &root.page_runs)?);
    }
    memory::write_pages_in(&mut s, &root.page_runs, pages, &kept, opts.progress.as_ref())?;
    memory::reprotect(&mut s, &reprotect)?;
    memory::relock(&mut s, &root.vmas)?;
    let mut lazy_uffds: Vec<(i32, OwnedFd, &[(u64, u64)])> = Vec::new();
    if let Some((_, runs)) = opts.lazy.iter().find(|(p, r)| *p == pid && !r.is_empty()) {
        if tree.processes.len() > 1 {
            return Err(EngineError::restore(
                pid,
                "post-copy (lazy) restore of a tree of several processes is not supported",
            ));
        }
        lazy_uffds.push((pid, lazy::take_uffd(&mut s)?, runs.as_slice()));
    }
    sessions.push(s);
    ph.mark("root: files+memory");
    for img in &tree.processes[1..] {
        let k = sessions.iter().position(|p| p.pid == img.ppid).ok_or_else(|| {
            EngineError::restore(img.pid, format!("parent {} not restored", img.ppid))
        })?;
        // A child that shared its parent's fd table gets it again: forked
        // with CLONE_FILES from the parent, whose table is complete.
        let share = img.fidelity.shares_files_with_parent;
        let child = fork::fork_from(
            &mut sessions[k],
            img.pid,
            img.fidelity.exit_signal,
            if share { libc::CLONE_FILES as u64 } else { 0 },
        )?;
        guard.pids.push(child);
        join_cgroups(img.pid)?;
        let parent = &sessions[k];
        let mut s = Session {
            pid: img.pid,
            image: img,
            remote: Remote { pid: img.pid, ..parent.remote },
            scratch: parent.scratch,
            data: parent.data,
            staging: &staging.map,
        };
        let parent_image = parent.image;
        fork::setup_identity(&mut s, parent_image)?;
        let mut kept: Vec<(u64, u64)> = img.inherited.iter().map(|v| (v.start, v.end)).collect();
        kept.sort_unstable();
        memory::clear_address_space(&mut s, &kept)?;
        memory::place_vdso(&mut s, &img.vmas)?;
        let mut reprotect = memory::map_all(&mut s, &img.vmas, &img.page_runs, &kept)?;
        reprotect.extend(memory::prepare_inherited(&mut s, &img.page_runs)?);
        memory::write_pages_in(&mut s, &img.page_runs, pages, &kept, opts.progress.as_ref())?;
        memory::reprotect(&mut s, &reprotect)?;
        memory::relock(&mut s, &img.vmas)?;
        sessions.push(s);
    }
    // Group leaders exist now, but for zombies: those that lead a group
    // first, then the zombies and processes that join one.
    let leaders: std::collections::HashSet<i32> = tree
        .processes
        .iter()
        .map(|p| (p.pid, p.pgid))
        .chain(tree.zombies.iter().map(|z| (z.pid, z.pgid)))
        .filter(|(pid, pgid)| pid == pgid)
        .map(|(pid, _)| pid)
        .collect();
    let mut zombies: Vec<&ferry_image::Zombie> = tree.zombies.iter().collect();
    zombies.sort_by_key(|z| z.pgid != z.pid);
    for z in zombies {
        let k = sessions
            .iter()
            .position(|p| p.pid == z.ppid)
            .ok_or_else(|| EngineError::restore(z.pid, "zombie's parent not restored"))?;
        fork::make_zombie(&mut sessions[k], z, &leaders)?;
    }
    for s in
        sessions.iter_mut().filter(|s| s.image.pgid != s.pid && leaders.contains(&s.image.pgid))
    {
        fork::join_group(s)?;
    }
    sysv.remove_destroyed();
    // fd tables come once every process exists: unix sockets of an image
    // that records SO_PEERCRED are made now, by the processes it names,
    // and any process may hold them. Until then every process has only
    // the descriptors it inherited (staged ones, above temp_base).
    if files::unix_made_late(&tree) {
        let late = in_netns(pid, netns_fd, || {
            files::make_unix_late(&tree, &mut sessions, &opts.tty_to, temp_base)
        })?;
        for (id, fd) in late {
            let lent =
                fd.try_clone().map_err(|e| EngineError::io("duplicating a unix socket", e))?;
            connections.insert(id, lent);
            staged_files.insert(id, fd);
        }
    }
    let unix_late = files::unix_made_late(&tree);
    for s in sessions.iter_mut() {
        // A child that shares its parent's table (CLONE_FILES) has it
        // from the parent's install.
        if !s.image.fidelity.shares_files_with_parent || s.pid == pid {
            install_files(s, &staged_raw, &connections, temp_base, &mut epolls, unix_late)?;
        }
    }
    // Credentials in flight name processes of the tree: they exist now.
    files::send_unix_in_flight(&tree, &staged_files)?;
    ph.mark("children: fork+files+memory");

    // Phase 2, every process: the rest of its state, then release.
    let mut all_tids: Vec<Vec<i32>> = Vec::with_capacity(sessions.len());
    // A process whose fd table a child shares (CLONE_FILES) leaves the
    // staged descriptors to that child, which finishes later and closes
    // them for both.
    let table_shared_by_child: std::collections::HashSet<i32> = tree
        .processes
        .iter()
        .filter(|p| p.fidelity.shares_files_with_parent)
        .map(|p| p.ppid)
        .collect();
    for s in sessions.iter_mut() {
        let exe_fd = staging.exes.get(&s.pid).copied();
        let close_staging = !table_shared_by_child.contains(&s.pid);
        let tids = finish_process(s, exe_fd, temp_base, close_staging)?;
        guard.pids.extend(tids.iter().copied());
        all_tids.push(tids);
    }
    ph.mark("threads, signals, timers, creds");
    for (id, (fd, seals)) in &staging.memfds {
        if *seals != 0 {
            ferry_sys::fd::fcntl_int(
                *fd,
                libc::F_ADD_SEALS,
                *seals as libc::c_long,
                "fcntl(F_ADD_SEALS)",
            )
            .map_err(|e| {
                EngineError::kernel(pid, format!("sealing memfd {id} with {seals:#x}"), e)
            })?;
        }
    }
    let procs: Vec<(i32, Vec<i32>, bool)> = sessions
        .iter()
        .zip(all_tids)
        .map(|(s, tids)| (s.pid, tids, s.image.fidelity.stopped))
        .collect();
    drop(sessions);
    let mut uffds = Vec::with_capacity(lazy_uffds.len());
    for (p, fd, runs) in lazy_uffds {
        let vmas =
            tree.processes.iter().find(|i| i.pid == p).map_or(&[][..], |i| i.vmas.as_slice());
        lazy::register(p, &fd, vmas, runs)?;
        uffds.push((p, fd));
    }
    if !uffds.is_empty() {
        ph.mark("lazy memory registered");
    }
    Ok(Held {
        pid,
        tree,
        connections,
        lock,
        procs,
        sysv,
        sysv_ipc,
        staged_files,
        staging,
        phases: ph,
        uffds,
        placed: opts.placed_for_root.clone(),
        guard,
    })
}

/// Takes over the network lock the checkpoint left for this image. A
/// lock that is gone (released by hand, or the machine restarted) is no
/// reason to fail: the connections are rebuilt all the same.
fn adopt_network_lock(tree: &TreeImage) -> Option<ferry_netlock::NetworkLock> {
    let r = tree.network_lock.as_ref()?;
    match ferry_netlock::NetworkLock::adopt(&r.name) {
        Ok(l) => Some(l),
        Err(e) => {
            tracing::warn!(
                "network lock {} ({}) of the image: {e}; restoring without it",
                r.name,
                r.method
            );
            None
        }
    }
}

fn ferry_sys_self_vdso() -> Result<(u64, u64)> {
    let me = std::process::id() as i32;
    crate::procfs::maps(me)?
        .into_iter()
        .find(|m| m.path == "[vdso]")
        .map(|m| (m.start, m.end))
        .ok_or_else(|| EngineError::restore(me, "ferry has no [vdso] mapping"))
}

/// The root still runs ferry's forked copy: check the CPU, drop its rseq
/// registration and place the scratch area where no process of the tree
/// has anything, so every forked child inherits it at a free address.
fn prepare_root(s: &mut Session, tree: &TreeImage) -> Result<()> {
    let pid = s.pid;
    threads::block_signals(pid, pid)?;
    let xs =
        ptrace::get_xstate(pid).map_err(|e| EngineError::kernel(pid, "reading XSAVE layout", e))?;
    let want = s.image.threads[0].xstate.len();
    if xs.len() != want {
        return Err(EngineError::restore(pid, format!("image has a {want}-byte XSAVE area, this CPU {} bytes: restore on the same kind of CPU", xs.len())));
    }
    threads::drop_inherited_rseq(s)?;
    let at = memory::free_gap(
        pid,
        tree.processes.iter().flat_map(|p| p.vmas.iter()),
        inject::SCRATCH_LEN,
    )?;
    let scratch = Scratch::map_at(&s.remote, pid, at)?;
    s.scratch = scratch.addr;
    s.data = scratch.addr + inject::SCRATCH_DATA;
    Ok(())
}

fn install_files(
    s: &mut Session,
    staged: &HashMap<u64, RawFd>,
    connections: &HashMap<u64, OwnedFd>,
    temp_base: RawFd,
    epolls: &mut std::collections::HashSet<u64>,
    unix_late: bool,
) -> Result<()> {
    // An epoll entry whose fd number no longer names its file is
    // registered through a descriptor of that file in the process: a
    // file the process did not inherit (a connection, a unix socket of
    // `make_unix_late`) is lent to it above temp_base for that.
    let lent: Vec<(u64, RawFd)> = s
        .image
        .fidelity
        .epoll_targets
        .iter()
        .filter(|t| !staged.contains_key(&t.target))
        .filter_map(|t| connections.get(&t.target).map(|fd| (t.target, fd.as_raw_fd())))
        .collect();
    let mut with_lent;
    let mut targets = staged;
    if !lent.is_empty() {
        with_lent = staged.clone();
        for (id, fd) in lent {
            if let std::collections::hash_map::Entry::Vacant(e) = with_lent.entry(id) {
                e.insert(lend_above(s, fd, temp_base)?);
            }
        }
        targets = &with_lent;
    }
    let (calls, data) = files::epoll_target_calls(s.image, targets, s.data, epolls)?;
    if !calls.is_empty() {
        s.remote.write(s.data, &data)?;
        s.run(s.pid, &calls)?;
    }
    // The lent descriptors above temp_base go with the staging ones
    // (`finish_process`).
    let calls = files::install_calls(s.image, staged, temp_base, unix_late)?;
    s.run(s.pid, &calls)?;
    files::tcp::install(s, connections, temp_base)?;
    let (calls, data) = files::epoll_calls(s.image, s.data, epolls);
    for (chunk_calls, chunk_data) in calls.chunks(512).zip(data.chunks(512 * 12)) {
        s.remote.write(s.data, chunk_data)?;
        // Each chunk's structs start at s.data again.
        let first = chunk_calls[0].1.args[3];
        let rebased: Vec<(String, inject::Call)> = chunk_calls
            .iter()
            .map(|(n, c)| {
                let mut c = *c;
                c.args[3] = s.data + (c.args[3] - first);
                (n.clone(), c)
            })
            .collect();
        s.run(s.pid, &rebased)?;
    }
    Ok(())
}

/// Gives the process its own descriptor of ferry's `fd`, at or above
/// `temp_base` (close-on-exec); returns its number there.
fn lend_above(s: &mut Session, fd: RawFd, temp_base: RawFd) -> Result<RawFd> {
    let me = std::process::id() as u64;
    let pidfd = s.call("pidfd_open(ferry)", libc::SYS_pidfd_open, &[me, 0])?;
    let got = s.call(
        "pidfd_getfd(a file an epoll entry watches)",
        libc::SYS_pidfd_getfd,
        &[pidfd, fd as u64, 0],
    );
    s.call("close(pidfd of ferry)", libc::SYS_close, &[pidfd])?;
    let got = got?;
    let high = s.call(
        "fcntl(F_DUPFD_CLOEXEC, above temp_base)",
        libc::SYS_fcntl,
        &[got, libc::F_DUPFD_CLOEXEC as u64, temp_base as u64],
    );
    s.call("close(lent file)", libc::SYS_close, &[got])?;
    Ok(high? as RawFd)
}

/// Everything after memory: mm layout, signal handlers, threads and their
/// state, timers, pending signals, locks, limits, credentials, registers.
/// Returns the TIDs of the threads it created.
fn finish_process(
    s: &mut Session,
    exe_fd: Option<RawFd>,
    temp_base: RawFd,
    close_staging: bool,
) -> Result<Vec<i32>> {
    let pid = s.pid;
    let image = s.image;
    memory::set_mm(s, exe_fd)?;
    files::proc_file::open_all(s)?;
    signals::restore_actions(s)?;
    // The leader first, so new threads inherit its name.
    threads::restore_thread_state(s, &image.threads[0])?;
    let tids = threads::create_threads(s)?;
    for t in &image.threads[1..] {
        threads::restore_thread_state(s, t)?;
    }
    files::owner::restore(s)?;
    timers::restore_itimers(s)?;
    timers::restore_posix(s)?;
    process::restore_misc(s)?;
    signals::queue_pending(s)?;
    if close_staging {
        s.run(
            pid,
            &[(
                "close_range(staging)".into(),
                inject::Call::new(libc::SYS_close_range, &[temp_base as u64, u32::MAX as u64, 0]),
            )],
        )?;
    }
    let (lock_calls, lock_args) = files::locks::posix_lock_calls(image, s.data);
    if !lock_calls.is_empty() {
        s.remote.write(s.data, &lock_args)?;
        s.run(pid, &lock_calls)?;
    }
    // Limits while the process still has ferry's user (a process of
    // another user would need CAP_SYS_RESOURCE), credentials last.
    process::restore_limits(pid, image)?;
    let all_tids: Vec<i32> = std::iter::once(pid).chain(tids.iter().copied()).collect();
    // seccomp while the process still has root's capabilities; suspended
    // for ferry's remaining injected calls until the threads are released.
    seccomp::install(s, &all_tids)?;
    process::restore_creds(s, &all_tids)?;
    process::restore_dumpable(s)?;
    prctl::restore_pdeathsig(s)?;
    s.call("munmap(scratch)", libc::SYS_munmap, &[s.scratch, inject::SCRATCH_LEN])?;
    for t in &image.threads {
        threads::set_final_registers(pid, t)?;
    }
    Ok(tids)
}
