//! Restore into a fresh PID namespace, so the tree's PIDs never collide
//! with processes already running on this host.
//!
//! ferry forks a helper into a new PID namespace and a new mount
//! namespace. The helper is PID 1 there: it mounts a /proc of the new
//! namespace (so a restored process finds itself under /proc/<getpid()>),
//! runs the ordinary restore, in which every PID is the image's own, and
//! reports the result to ferry over a pipe. Then it stays as the
//! namespace's init: it reaps orphans, forwards SIGTERM/SIGINT/SIGHUP/
//! SIGQUIT/SIGUSR1/SIGUSR2 to the tree's root, and exits with the root's
//! status once nothing is left. The mount namespace is a copy of ferry's,
//! slave to it, so every other mount is seen as before.

use super::helper_protocol::{self as proto, Report};
use super::{Handover, RestoreOptions, Restored};
use crate::error::{EngineError, Result};
use ferry_image::TreeImage;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Instant;

/// The tree's root as the init sees it, for signal forwarding.
static ROOT: AtomicI32 = AtomicI32::new(0);

extern "C" fn forward(sig: libc::c_int) {
    let root = ROOT.load(Ordering::Relaxed);
    if root > 0 {
        // kill is async-signal-safe; root is our child.
        let _ = ferry_sys::process::kill(root, sig);
    }
}

/// A tree restored into a new PID namespace and held there, stopped:
/// the namespace's init (the helper) waits for one byte from ferry,
/// `c` to let the tree run, anything else (or ferry gone) to kill it.
pub struct HeldInNamespace {
    init: i32,
    root: i32,
    report: std::fs::File,
    commit: Option<std::fs::File>,
    /// The restore's phases in the helper, as (name, ms).
    pub phases: Vec<(String, f64)>,
    /// Post-copy: (image PID, our copy of its userfaultfd), taken from
    /// the helper; the helper closes its own copies when it releases.
    pub uffds: Vec<(i32, std::os::fd::OwnedFd)>,
}

impl HeldInNamespace {
    /// The namespace's init, as ferry sees it.
    pub fn init_pid(&self) -> i32 {
        self.init
    }

    /// Lets the tree run; returns once the helper has released every
    /// process, with the time that took (its phases in `phases`).
    pub fn release(mut self) -> Result<Restored> {
        let Some(mut commit) = self.commit.take() else {
            return Err(EngineError::InNewPidNs("released twice".into()));
        };
        commit.write_all(b"c").map_err(|e| {
            EngineError::io(format!("restore helper {} (commit pipe)", self.init), e)
        })?;
        drop(commit);
        let r = match self.next_report()? {
            Some(Report::Released { pid, processes, threads, total_ms }) => Restored {
                pid: crate::TreePid(pid),
                host_pid: crate::HostPid(root_seen_from_here(self.root, self.init)?),
                init_pid: Some(crate::HostPid(self.init)),
                processes,
                threads,
                total_ms,
            },
            Some(Report::Failed { error }) => return Err(EngineError::InNewPidNs(error)),
            other => {
                return Err(EngineError::InNewPidNs(format!(
                    "its helper (pid {}) ended while releasing the tree ({other:?})",
                    self.init
                )))
            }
        };
        // From now on the helper is the namespace's init and outlives us.
        self.init = 0;
        Ok(r)
    }

    /// Ends the held tree without letting it run: the helper kills it,
    /// drops what the restore staged and exits, which ends the namespaces.
    /// Waits up to `patience` for that, then kills the helper.
    pub fn abandon(self, patience: std::time::Duration) {
        self.begin_abandon().wait(patience);
    }

    /// Like [`HeldInNamespace::abandon`], without waiting: the helper is
    /// told to end the tree, and [`Abandoned::wait`] waits for it.
    pub fn begin_abandon(mut self) -> Abandoned {
        // Our child, which only we reap: its pidfd opens until then.
        let pidfd = ferry_sys::pidfd::pidfd_open(self.init).ok();
        if let Some(mut commit) = self.commit.take() {
            let _ = commit.write_all(b"k");
        }
        Abandoned { init: std::mem::replace(&mut self.init, 0), pidfd }
    }

    fn next_report(&mut self) -> Result<Option<Report>> {
        proto::recv(&mut self.report)
            .map_err(|e| EngineError::InNewPidNs(format!("restore helper {}: {e}", self.init)))
    }
}

/// A held tree whose helper was told to end it
/// ([`HeldInNamespace::begin_abandon`]). Dropped unwaited, the helper is
/// killed (which ends every process of the namespace) and reaped.
pub struct Abandoned {
    init: i32,
    pidfd: Option<std::os::fd::OwnedFd>,
}

impl Abandoned {
    /// Waits until the helper exits (its pidfd polls readable: as the
    /// namespace's init it exits only after every other process of the
    /// namespace is reaped) and reaps it; after `patience`, kills it.
    pub fn wait(mut self, patience: std::time::Duration) {
        let until = Instant::now() + patience;
        let Some(pidfd) = self.pidfd.take() else { return };
        loop {
            let left = until.saturating_duration_since(Instant::now());
            let ms = i32::try_from(left.as_millis() + 1).unwrap_or(i32::MAX);
            match ferry_sys::pidfd::wait_exit(&pidfd, ms) {
                Ok(true) => {
                    ferry_sys::process::wait_pid(self.init);
                    self.init = 0;
                    return;
                }
                // Interrupted by a signal: poll again while time is left.
                Err(e) if e.errno == libc::EINTR && !left.is_zero() => continue,
                // Timed out or failed: Drop kills what is left.
                _ => return,
            }
        }
    }
}

impl Drop for Abandoned {
    fn drop(&mut self) {
        if self.init > 0 {
            // Our child, the namespace's init: its end ends the tree.
            let _ = ferry_sys::process::kill(self.init, libc::SIGKILL);
            ferry_sys::process::wait_pid(self.init);
        }
    }
}

impl Drop for HeldInNamespace {
    fn drop(&mut self) {
        if self.init > 0 {
            // The helper is our child and the namespace's init: killing
            // it ends every process of the held tree.
            let _ = ferry_sys::process::kill(self.init, libc::SIGKILL);
            ferry_sys::process::wait_pid(self.init);
        }
    }
}

/// Restores a decoded image whose page data area is `pages` (verified by
/// the caller) into a new PID namespace, and holds it there stopped.
pub fn restore_held(
    tree: TreeImage,
    pages: &[u8],
    opts: &RestoreOptions,
    handover: &Handover,
    t0: Instant,
) -> Result<HeldInNamespace> {
    let flags = (libc::CLONE_NEWPID | libc::CLONE_NEWNS) as u64;
    restore_held_in(tree, pages, opts, handover, t0, flags, || Ok(()))
}

/// Like [`restore_held`], in namespaces `flags` (CLONE_NEWPID and
/// CLONE_NEWNS at least); `setup` runs in the helper first (a trial sets
/// up its scratch network namespace there).
pub(super) fn restore_held_in(
    tree: TreeImage,
    pages: &[u8],
    opts: &RestoreOptions,
    handover: &Handover,
    t0: Instant,
    flags: u64,
    setup: impl FnOnce() -> Result<()>,
) -> Result<HeldInNamespace> {
    let root = tree.root().map_or(0, |p| p.pid);
    let (rd, wr) = ferry_sys::fd::pipe2(libc::O_CLOEXEC)
        .map_err(|e| EngineError::kernel(root, "creating a pipe", e))?;
    let (crd, cwr) = ferry_sys::fd::pipe2(libc::O_CLOEXEC)
        .map_err(|e| EngineError::kernel(root, "creating a pipe", e))?;
    // ferry-sys refuses the fork unless ferry is single-threaded here; the
    // child runs ordinary Rust code, as the root child of a plain restore does.
    super::loader::before_fork();
    let init = match ferry_sys::clone::fork_into_namespaces(flags) {
        Ok(0) => {
            drop(rd);
            drop(cwr);
            hold_as_init(std::fs::File::from(wr), std::fs::File::from(crd), || {
                mount_own_proc(root)
                    .and_then(|()| setup())
                    .and_then(|()| super::restore_held(tree, pages, opts, handover, t0))
            })
        }
        Ok(p) => p,
        Err(e) => return Err(EngineError::kernel(root, "creating a PID namespace", e)),
    };
    drop(wr);
    drop(crd);
    let held = HeldInNamespace {
        init,
        root,
        report: std::fs::File::from(rd),
        commit: Some(std::fs::File::from(cwr)),
        phases: Vec::new(),
        uffds: Vec::new(),
    };
    held_reported(held)
}

/// `held` once its helper reported the tree restored and held.
fn held_reported(mut held: HeldInNamespace) -> Result<HeldInNamespace> {
    let init = held.init;
    match held.next_report()? {
        Some(Report::Held { phases, uffds }) => {
            held.phases = phases;
            held.uffds = take_uffds(init, &uffds)?;
            Ok(held)
        }
        Some(Report::Failed { error }) => Err(EngineError::InNewPidNs(error)),
        other => Err(EngineError::InNewPidNs(format!(
            "its helper (pid {init}) ended without a report ({other:?})"
        ))),
    }
}

/// A helper forked ahead ([`fork_ahead`]), in its namespaces, waiting
/// for what to restore. Dropped unused, it is killed and reaped.
pub struct HelperAhead {
    /// The helper, its tree not restored yet (root 0).
    held: HeldInNamespace,
    go: std::fs::File,
}

/// Forks the helper of [`restore_held_in`] before there is an image, into
/// namespaces `flags` (CLONE_NEWPID and CLONE_NEWNS at least), while ferry
/// is small: its fork copies fewer page tables, and the namespaces'
/// making, its /proc and `setup` run beside ferry's own work. It then
/// waits for one message ([`HelperAhead::restore`]) and hands it to
/// `restore`, whose held tree it holds and reports as the helper of
/// [`restore_held_in`] does; an error of `setup` is reported then. With
/// ferry gone before the message, it exits. ferry must be one thread here.
pub fn fork_ahead(
    flags: u64,
    setup: impl FnOnce() -> Result<()>,
    restore: impl FnOnce(Vec<u8>) -> Result<super::Held>,
) -> Result<HelperAhead> {
    let pipe = || {
        ferry_sys::fd::pipe2(libc::O_CLOEXEC)
            .map_err(|e| EngineError::kernel(0, "creating a pipe", e))
    };
    let ((rd, wr), (crd, cwr), (grd, gwr)) = (pipe()?, pipe()?, pipe()?);
    let init = match ferry_sys::clone::fork_into_namespaces(flags) {
        Ok(0) => {
            drop((rd, cwr, gwr));
            let ready = mount_own_proc(0).and_then(|()| setup());
            let Some(msg) = read_message(std::fs::File::from(grd)) else {
                ferry_sys::process::exit_now(0)
            };
            let (report, commit) = (std::fs::File::from(wr), std::fs::File::from(crd));
            hold_as_init(report, commit, || ready.and_then(|()| restore(msg)))
        }
        Ok(p) => p,
        Err(e) => return Err(EngineError::kernel(0, "creating a PID namespace", e)),
    };
    let held = HeldInNamespace {
        init,
        root: 0,
        report: std::fs::File::from(rd),
        commit: Some(std::fs::File::from(cwr)),
        phases: Vec::new(),
        uffds: Vec::new(),
    };
    Ok(HelperAhead { held, go: std::fs::File::from(gwr) })
}

impl HelperAhead {
    /// Hands the helper `msg` and waits until it holds the tree restored
    /// (root PID `root`, for errors), as [`restore_held_in`] returns it.
    pub fn restore(self, msg: &[u8], root: i32) -> Result<HeldInNamespace> {
        let HelperAhead { mut held, mut go } = self;
        held.root = root;
        let len = u32::try_from(msg.len()).map_err(|_| {
            EngineError::restore(root, "a message for the restore helper over 4 GiB")
        })?;
        let mut framed = len.to_ne_bytes().to_vec();
        framed.extend_from_slice(msg);
        go.write_all(&framed)
            .map_err(|e| EngineError::io(format!("restore helper {} (its pipe)", held.init), e))?;
        held_reported(held)
    }
}

/// In the helper: one length-prefixed message; None when ferry closed
/// the pipe first (every copy of its write end: a process forked later
/// holds one until it exits or closes it).
fn read_message(mut pipe: std::fs::File) -> Option<Vec<u8>> {
    let mut len = [0u8; 4];
    pipe.read_exact(&mut len).ok()?;
    let mut msg = vec![0u8; u32::from_ne_bytes(len) as usize];
    pipe.read_exact(&mut msg).ok()?;
    Some(msg)
}

/// ferry's own copies of the userfaultfds the helper made, for the pager.
fn take_uffds(init: i32, uffds: &[(i32, i32)]) -> Result<Vec<(i32, std::os::fd::OwnedFd)>> {
    let mut taken = Vec::with_capacity(uffds.len());
    for &(p, fd) in uffds {
        let mine = ferry_sys::pidfd::pidfd_open(init)
            .and_then(|pidfd| ferry_sys::pidfd::pidfd_getfd(&pidfd, fd))
            .map_err(|e| {
                EngineError::kernel(
                    p,
                    format!("taking its userfaultfd from the restore helper {init}"),
                    e,
                )
            })?;
        taken.push((p, mine));
    }
    Ok(taken)
}

/// Runs in the helper of [`restore_held`]: PID 1 of the new namespace.
/// Never returns.
fn hold_as_init(
    mut report: std::fs::File,
    mut commit: std::fs::File,
    restore: impl FnOnce() -> Result<super::Held>,
) -> ! {
    let held = match restore() {
        // The namespace's init from before anyone is told the tree exists:
        // from then on it is the root's parent and may be signalled.
        Ok(h) => {
            take_init_role(h.pid());
            h
        }
        Err(e) => {
            let _ = proto::send(&mut report, &Report::Failed { error: e.to_string() });
            // _exit: the parent's atexit handlers must not run here.
            ferry_sys::process::exit_now(1)
        }
    };
    let phases = held.phases().done().to_vec();
    let _ = proto::send(&mut report, &Report::Held { phases, uffds: held.lazy_uffds() });
    let mut go = [0u8; 1];
    if !matches!(commit.read(&mut go), Ok(1)) || go[0] != b'c' {
        // Dropping the held tree kills it: the service stays where it was.
        drop(held);
        ferry_sys::process::exit_now(1)
    }
    let root = held.pid();
    // Reported as soon as the tree runs; the lock comes down after.
    let released = |r: &Restored| Report::Released {
        pid: r.pid.0,
        processes: r.processes,
        threads: r.threads,
        total_ms: r.total_ms,
    };
    match held.release_then(|r| {
        let _ = proto::send(&mut report, &released(r));
    }) {
        Ok(_) => {}
        Err(e) => {
            let _ = proto::send(&mut report, &Report::Failed { error: e.to_string() });
            // The helper's exit ends the namespace.
            ferry_sys::process::exit_now(1)
        }
    }
    drop(report);
    be_init(root)
}

/// The helper's only child is the tree's root.
fn root_seen_from_here(root: i32, init: i32) -> Result<i32> {
    let path = format!("/proc/{init}/task/{init}/children");
    let text = std::fs::read_to_string(&path).map_err(|e| EngineError::io(path.clone(), e))?;
    text.split_whitespace().find_map(|c| c.parse::<i32>().ok()).ok_or_else(|| {
        EngineError::restore(root, format!("the PID namespace's init {init} has no child"))
    })
}

fn mount_own_proc(root: i32) -> Result<()> {
    // Slave, so nothing mounted here reaches ferry's namespace while mounts
    // made there still show up here.
    ferry_sys::netns::mount_own_proc()
        .map_err(|e| EngineError::kernel(root, "mounting /proc for the new PID namespace", e))
}

/// Named `ferry-init`, forwarding the signals a service's init passes on
/// to `root` (a signal sent to a namespace's init from outside is
/// dropped unless it has a handler).
fn take_init_role(root: i32) {
    ROOT.store(root, Ordering::Relaxed);
    let _ = ferry_sys::process::set_name(c"ferry-init");
    for sig in
        [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGQUIT, libc::SIGUSR1, libc::SIGUSR2]
    {
        let _ = ferry_sys::signal::set_handler(sig, forward);
    }
}

/// The namespace's init (see [`take_init_role`]): drop everything ferry
/// held, reap.
fn be_init(root: i32) -> ! {
    // ferry's standard streams may be a pipe someone reads to its end:
    // the init must not hold them open for the tree's lifetime.
    if let Ok(null) = std::fs::OpenOptions::new().read(true).write(true).open("/dev/null") {
        for fd in 0..3 {
            let _ = ferry_sys::fd::dup2(null.as_raw_fd(), fd);
        }
    }
    let _ = ferry_sys::fd::close_range(3, u32::MAX);
    let mut code = 0;
    // Reaping our own children (the root and adopted orphans).
    while let Ok(Some((pid, status))) = ferry_sys::process::wait_any() {
        if pid == root {
            code = status;
        }
    }
    ferry_sys::process::exit_now(code)
}
