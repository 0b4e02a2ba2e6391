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

mod build;
mod cgroups;
mod child;
mod fd_tables;
pub(crate) mod files;
mod finish;
mod fork;
mod handover;
mod held;
mod helper_protocol;
mod lazy;
mod loader;
mod memory;
mod pidns;
mod placement;
mod root;
mod stage;
pub use handover::Handover;
pub use held::Held;
pub use pidns::HeldInNamespace;
pub use placement::{HeldTree, Placement};
mod prctl;
mod process;
mod seccomp;
mod signals;
mod staging;
mod sysv_ipc;
mod threads;
mod timers;
pub mod trial;
mod verify;

use crate::error::{EngineError, Result};
use crate::inject::{self, Remote};
use ferry_image::{ImageSource, ProcessImage, TreeImage};
use staging::StagingMap;
use std::os::fd::{AsRawFd, RawFd};
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
    /// Before the tree runs, read its state back and compare it with the
    /// image (`verify/`); a difference fails the restore.
    pub check: bool,
    /// A trial restore ([`trial`]) while the checkpointed tree still
    /// exists: the network lock the image names is the original's and is
    /// left alone (adopting it would let the original's connections go).
    pub trial: bool,
    /// The caller exits once the tree runs (`restore --detach`): a
    /// parent-death signal of the root, whose parent the caller is, would
    /// fire then, so such an image is refused before anything is made.
    pub detach: bool,
}

impl Default for RestoreOptions {
    fn default() -> Self {
        RestoreOptions {
            tty_to: "/dev/null".into(),
            netns: None,
            progress: None,
            new_pid_ns: false,
            check: true,
            trial: false,
            detach: false,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Restored {
    /// The root's PID as the tree sees it (the image's).
    pub pid: crate::TreePid,
    /// The root's PID as ferry sees it: differs from `pid` in a new PID
    /// namespace.
    pub host_pid: crate::HostPid,
    /// The PID namespace's init, ferry's child, which exits with the
    /// root's status; None when restored into ferry's namespace.
    pub init_pid: Option<crate::HostPid>,
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
    /// What the root brought from ferry by its fork, for the clearing of
    /// its address space ([`memory::clear_calls`]): none in a
    /// child (forked from its restored parent).
    pub forked: Option<root::Forked>,
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

/// Waits (5 s at most) until each PID the tree takes that a zombie holds
/// here is reaped (a replacement's old tree, killed, whose root its parent
/// reaps): on the zombies' pidfds, [`crate::procfs::wait_reaped`]. The
/// restore's staging calls it; `ferry replace` calls it first, before it
/// waits for the end of its trial copy, which ends meanwhile.
pub fn wait_zombies_reaped(tree: &TreeImage) {
    let zombies: Vec<i32> =
        tree_ids(tree).filter(|&id| crate::procfs::state(id) == Some('Z')).collect();
    if !zombies.is_empty() {
        crate::procfs::wait_reaped(&zombies, std::time::Duration::from_secs(5));
    }
}

/// Every thread ID and zombie PID the tree takes.
fn tree_ids(tree: &TreeImage) -> impl Iterator<Item = i32> + '_ {
    tree.processes
        .iter()
        .flat_map(|p| p.threads.iter().map(|t| t.tid))
        .chain(tree.zombies.iter().map(|z| z.pid))
}

/// Runs `make` (a clone3 with `pid` as the new PID) again for up to 50 ms
/// while it fails with EEXIST and no process shows under `pid` in /proc:
/// the exit of the PID's old holder is still being finished (a process
/// leaves /proc a moment before its number is released), as when a
/// replacement's restore follows the old tree's kill and reap at once.
pub(super) fn retry_while_released<T>(
    pid: i32,
    mut make: impl FnMut() -> ferry_sys::SysResult<T>,
) -> ferry_sys::SysResult<T> {
    let deadline = Instant::now() + std::time::Duration::from_millis(50);
    loop {
        match make() {
            Err(e)
                if e.errno == libc::EEXIST
                    && pid_owner(pid).is_none()
                    && Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_micros(100));
            }
            other => return other,
        }
    }
}

fn pid_owner(pid: i32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/comm")).ok().map(|s| s.trim().to_string())
}

/// Who holds `pid`, for a refusal: a running process, or one that ended
/// and that its parent has not reaped yet (the one that can free it).
pub(crate) fn pid_holder(pid: i32) -> String {
    let Some(comm) = pid_owner(pid) else {
        return "a process that is gone (unknown)".into();
    };
    match crate::procfs::state(pid) {
        Some('Z') | Some('X') => match crate::procfs::ppid(pid) {
            Some(parent) => format!("{comm}, a process that ended, not yet reaped by pid {parent}"),
            None => format!("{comm}, a process that ended, not yet reaped"),
        },
        _ => format!("a running process ({comm})"),
    }
}

/// Fault injection for tests: `FERRY_FAULT_FAIL_CHECK=1` makes the
/// restore's check fail, as a difference it found would (standing for any
/// restore bug): in a replacement, the trial must find it before the kill.
fn fault_fails_check(pid: i32) -> Result<()> {
    match std::env::var_os("FERRY_FAULT_FAIL_CHECK") {
        Some(v) if v == "1" => Err(EngineError::restore(
            pid,
            "the restore's check failed (FERRY_FAULT_FAIL_CHECK)".to_string(),
        )),
        _ => Ok(()),
    }
}

/// Restores the image in directory `dir` (the newest of its chain of
/// incremental images, if any) and lets it run.
pub fn restore(dir: &Path, opts: &RestoreOptions) -> Result<Restored> {
    if opts.check {
        loader::start_early(dir);
    }
    restore_from(&mut ferry_image::DirSource::new(dir), opts)
}

/// Restores an image from any source: load and verify it whole, place
/// the tree, restore it held, release it.
pub fn restore_from(source: &mut dyn ImageSource, opts: &RestoreOptions) -> Result<Restored> {
    let t0 = Instant::now();
    // From here to the release, the restore is the service's pause
    // (its own work, no process forked: [`crate::priority`]).
    let image = crate::priority::raised(|| source.load(crate::worker_threads()))?;
    // The check's mapping-flags iterator: loaded once the root is forked,
    // or not at all for a small tree (smaps then); forgotten at the end.
    let _loader = loader::Joined;
    if opts.check {
        loader::choose(&image.tree);
    }
    if opts.detach {
        check_detachable(&image.tree)?;
    }
    if opts.netns.is_none() {
        check_same_netns(&image.tree)?;
    }
    let placement = Placement::for_image(&image.tree, opts.new_pid_ns);
    let pages = image.pages;
    placement.restore_held(image.tree, pages.bytes(), opts, &Handover::default(), t0)?.release()
}

/// A process that ran in a network namespace other than the
/// checkpointing ferry's would be made in this ferry's namespace: its
/// sockets would bind, connect and listen on another network, silently.
/// Unless this ferry runs in that very namespace, refused before
/// anything is made.
fn check_same_netns(tree: &TreeImage) -> Result<()> {
    let Some(attrs) = &tree.process_attrs else { return Ok(()) };
    let here = crate::proc_state::netns_inode("thread-self")?;
    for (p, a) in tree.processes.iter().zip(&attrs.processes) {
        if let Some(theirs) = a.netns.filter(|&ns| ns != here) {
            return Err(EngineError::restore(
                p.pid,
                format!(
                    "it ran in network namespace net:[{theirs}], not the checkpointing ferry's; restore with --netns NAME (or run ferry restore in that namespace), or it would come back in this one"
                ),
            ));
        }
    }
    Ok(())
}

/// A root thread with a parent-death signal: its parent is ferry, and
/// the signal would fire when ferry exits, although the original parent
/// may well be alive. Refused before anything is made.
fn check_detachable(tree: &TreeImage) -> Result<()> {
    let Some(root) = tree.root() else { return Ok(()) };
    match root.fidelity.threads.iter().find(|t| t.pdeathsig != 0) {
        Some(t) => Err(EngineError::restore(
            root.pid,
            format!(
                "thread {} has a parent-death signal ({}), which would fire when ferry exits; restore without --detach (ferry stays its parent)",
                t.tid, t.pdeathsig
            ),
        )),
        None => Ok(()),
    }
}

/// Rebuilds the tree of a decoded image, whose page data area is `pages`
/// (already verified by the caller), in the PID namespace ferry is in,
/// and holds it stopped: a composition of the restore's phases, each
/// marked as it ends.
pub fn restore_held(
    tree: TreeImage,
    pages: &[u8],
    opts: &RestoreOptions,
    handover: &Handover,
    t0: Instant,
) -> Result<Held> {
    // From the start of the restore: reading and decoding the image counts.
    let mut ph = crate::phases::Phases::start_at("restore", t0);
    // The threads kept on ferry's CPU while it drives them are forgotten
    // when the restore ends, however it ends.
    let _colocated = Colocated;
    let pid = tree.root().ok_or_else(|| EngineError::restore(0, "image holds no process"))?.pid;
    ph.mark("read+verify image");
    stage::check_pids_free(&tree)?;
    let mut staged = ph.step("stage files", || stage::stage(&tree, opts, handover))?;
    let cgroups = build::CgroupPlan::new(&tree)?;
    let mut guard = ph.step("fork root", || {
        let guard = root::fork_root(&tree, &staged)?;
        cgroups.join(pid)?;
        Ok::<_, EngineError>(guard)
    })?;
    // ferry forks nothing more in this restore: the check's iterator is
    // loaded beside the rest (joined when the restore ends).
    let _loading = loader::start_if_wanted();
    // Made after the fork, so that they need no fd numbers in the range
    // the tree inherits: 10,000 connections would not fit twice.
    let mut connections = ph.step("tcp connections rebuilt", || {
        crate::priority::raised(|| {
            stage::in_netns(pid, staged.netns_fd(), || files::tcp::create_all(&tree))
        })
    })?;
    let mut sessions = vec![root::root_session(&tree, &staged.staging.map)?];
    let lazy_uffds = ph.step("root: files+memory", || {
        build::restore_root(&mut sessions[0], &tree, pages, opts, handover)
    })?;
    ph.step("children: fork+files+memory", || {
        build::fork_children(&tree, &mut sessions, pages, opts, &cgroups, &mut guard)?;
        build::zombies_and_groups(&tree, &mut sessions)?;
        staged.sysv.remove_destroyed();
        let fds = fd_tables::StagedFds {
            raw: &staged.raw,
            temp_base: staged.temp_base,
            netns: staged.netns.as_ref().map(|f| f.as_raw_fd()),
        };
        fd_tables::install_all(
            &tree,
            &mut sessions,
            &mut staged.files,
            fds,
            &mut connections.fds,
            &opts.tty_to,
        )
    })?;
    let (procs, fd_flags) = ph.step("threads, signals, timers, creds", || {
        let exes = &staged.staging.exes;
        finish::finish_all(&tree, &mut sessions, exes, staged.temp_base, &mut guard, opts.check)
    })?;
    finish::seal_memfds(pid, &staged.staging.memfds)?;
    drop(sessions);
    let uffds = finish::register_lazy(&tree, lazy_uffds)?;
    if !uffds.is_empty() {
        ph.mark("lazy memory registered");
    }
    if opts.check {
        let carried = &handover.carried;
        ph.step("check", || {
            crate::priority::raised(|| {
                verify::restored_tree(&tree, &connections.fds, carried, &fd_flags)
            })?;
            fault_fails_check(pid)
        })?;
    }
    let placed = handover.placed_for_root.clone();
    Ok(Held { pid, tree, connections, procs, staged, phases: ph, uffds, placed, guard })
}

/// Forgets, when dropped, the threads [`inject::colocate`] keeps.
struct Colocated;

impl Drop for Colocated {
    fn drop(&mut self) {
        inject::forget_all_colocated();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EEXIST: ferry_sys::SysError = ferry_sys::SysError { call: "clone3", errno: libc::EEXIST };

    #[test]
    fn a_pid_being_released_is_tried_again_and_a_shown_one_is_not() {
        // No process under this PID (above pid_max): EEXIST is tried again.
        let mut calls = 0;
        let r = retry_while_released(4_000_000, || {
            calls += 1;
            if calls < 3 {
                Err(EEXIST)
            } else {
                Ok(calls)
            }
        });
        assert_eq!(r, Ok(3));
        // A process shows under it (ferry's own test process): at once.
        let mut calls = 0;
        let r: ferry_sys::SysResult<()> = retry_while_released(std::process::id() as i32, || {
            calls += 1;
            Err(EEXIST)
        });
        assert_eq!((r.map_err(|e| e.errno), calls), (Err(libc::EEXIST), 1));
        // Never released: it gives up after its 50 ms.
        let t = Instant::now();
        assert!(retry_while_released(4_000_000, || Err::<(), _>(EEXIST)).is_err());
        assert!(t.elapsed() >= std::time::Duration::from_millis(50));
    }
}
