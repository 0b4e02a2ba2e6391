//! A trial restore (`ferry checkpoint --verify`): the image just written
//! is restored while the checkpointed tree still exists, in namespaces of
//! its own, checked like any restore (`verify/`), and ended before it ran
//! one instruction. The original is killed only once this passed.
//!
//! What keeps the trial off the original:
//! - PIDs: a new PID namespace (the helper of [`pidns`](super::pidns)).
//! - Ports and connections: a new network namespace (the helper's own, or
//!   a [`Sandbox`] made ahead, before a replacement's freeze), its
//!   loopback up and every address the tree's inet sockets name (local
//!   and peer) added to it, so binds and repair-mode connects succeed. TCP connections stay
//!   in repair mode (closing them sends nothing) and the network lock the
//!   image names is not adopted ([`RestoreOptions::trial`]).
//! - SysV IPC ids: a new IPC namespace.
//! - Mounts (the helper's /proc, and a devpts of its own when the tree has
//!   pty pairs, whose numbers the original holds): a new mount namespace,
//!   a slave of ferry's.
//!
//! Everything it made lives in those namespaces or in the processes the
//! helper kills; the helper's exit ends them all. A replacement has the
//! copy ended while it kills the old tree and waits for that end before
//! its restore makes anything ([`TrialCopy::end`], [`EndingTrial::wait`]). States whose restore
//! would reach the original's objects through the shared filesystem are
//! not tried ([`untrialable`]): the checkpoint goes on without the trial
//! and says why.

use super::{pidns, Handover, RestoreOptions};
use crate::error::{EngineError, Result};
use ferry_image::{FileKind, ImageSource, TreeImage};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsRawFd, RawFd};
use std::path::Path;
use std::time::{Duration, Instant};

/// What came of a trial.
#[derive(Debug, Clone, PartialEq)]
pub enum TrialOutcome {
    /// The image restored and passed the restore's check; the copy is gone.
    Passed { ms: f64 },
    /// Not tried: the reason, naming the object.
    Skipped(String),
}

/// How long the helper gets to end the trial copy before it is killed.
pub const END_PATIENCE: Duration = Duration::from_secs(10);

/// Restores the image in `dir` in scratch namespaces, checks it, and ends
/// the copy. An error is the restore's (or its check's) own, naming the
/// object. `inherited`: descriptors of ferry's that the helper (a fork of
/// ferry) closes first, so that they leave room for the copy's own.
pub fn trial(dir: &Path, inherited: &[std::os::fd::RawFd]) -> Result<TrialOutcome> {
    trial_source(&mut ferry_image::DirSource::new(dir), inherited)
}

/// Like [`trial`], for an image from any source (`ferry replace` tries
/// the edited image it holds in memory).
pub fn trial_source(
    source: &mut dyn ImageSource,
    inherited: &[std::os::fd::RawFd],
) -> Result<TrialOutcome> {
    let t0 = Instant::now();
    match trial_carrying(source, inherited, &std::collections::HashMap::new(), None)? {
        TrialRun::Passed(copy) => {
            copy.end().wait(END_PATIENCE);
            Ok(TrialOutcome::Passed { ms: t0.elapsed().as_secs_f64() * 1e3 })
        }
        TrialRun::Skipped(why) => Ok(TrialOutcome::Skipped(why)),
    }
}

/// Like [`trial_source`], for an image whose carried files
/// ([`Handover::carried`]) are the old tree's own, which still runs on
/// them: the trial places ferry's duplicates as the restore after the
/// kill will (its processes only add references, and end), and sets
/// nothing on them that the old tree would see (their F_SETOWN owners are
/// left out, [`super::files::carried::leave_owners_of_carried`]).
///
/// The copy that passed is handed back held ([`TrialCopy`]): the caller
/// ends it and may do other work while it ends (`ferry replace` kills the
/// old tree meanwhile), waiting for its end before its next restore
/// makes anything ([`EndingTrial::wait`]).
pub fn trial_carrying(
    source: &mut dyn ImageSource,
    inherited: &[std::os::fd::RawFd],
    carried: &std::collections::HashMap<u64, std::os::fd::RawFd>,
    sandbox: Option<&Sandbox>,
) -> Result<TrialRun> {
    let t0 = Instant::now();
    let mut image = source.load(crate::worker_threads())?;
    super::files::carried::leave_owners_of_carried(&mut image.tree);
    if let Some(why) = untrialable(&image.tree) {
        return Ok(TrialRun::Skipped(why));
    }
    let addrs = scratch_addresses(&image.tree);
    let image_ptys = image.tree.ptys.as_ref().is_some_and(|p| !p.pairs.is_empty());
    let root = image.tree.root().map_or(0, |p| p.pid);
    let opts = RestoreOptions { new_pid_ns: true, check: true, trial: true, ..Default::default() };
    let new_net = if sandbox.is_some() { 0 } else { libc::CLONE_NEWNET };
    let flags = (libc::CLONE_NEWPID | libc::CLONE_NEWNS | libc::CLONE_NEWIPC | new_net) as u64;
    let pages = image.pages;
    // The helper is a fork of ferry, which must be one thread again.
    crate::parallel::join_detached();
    let handover = Handover { carried: carried.clone(), ..Default::default() };
    let net = sandbox.map(|s| s.net.as_raw_fd());
    let held =
        pidns::restore_held_in(image.tree, pages.bytes(), &opts, &handover, t0, flags, || {
            close_inherited(inherited);
            scratch_network(root, net, &addrs).and_then(|()| scratch_devpts(root, image_ptys))
        })?;
    Ok(TrialRun::Passed(TrialCopy { held, ms: t0.elapsed().as_secs_f64() * 1e3 }))
}

/// A trial's helper forked ahead, at the start of `ferry checkpoint`,
/// before the capture: in its new PID, mount, IPC and network namespaces,
/// its /proc mounted and loopback up while ferry captures (on the other
/// CPU), so the trial in the pause only hands it the image's directory.
/// Forked in the pause, from a ferry grown by the capture, the helper
/// took 1.6-4.7 ms to reach its namespaces (the tiny listener). The
/// helper loads the image itself; it has none of ferry's copies of the
/// tree's sockets. Dropped unused, the helper is killed and reaped.
pub struct TrialAhead(pidns::HelperAhead);

impl TrialAhead {
    /// Forks the helper; ferry must be one thread.
    pub fn fork() -> Result<TrialAhead> {
        // The network namespace is made by the helper (unshare), not by
        // the clone: in the clone it costs ferry 0.5 ms before it goes on.
        let flags = libc::CLONE_NEWPID | libc::CLONE_NEWNS | libc::CLONE_NEWIPC;
        let setup = || {
            ferry_sys::netns::enter_new_net_namespace()
                .map_err(|e| EngineError::kernel(0, "making the trial's network namespace", e))?;
            loopback_up(0).map(drop)
        };
        pidns::fork_ahead(flags as u64, setup, restore_ahead).map(TrialAhead)
    }

    /// [`trial`] of the image in `dir`, by the helper forked ahead. The
    /// copy that passed is being ended when this returns: the caller
    /// waits for that end ([`EndingTrial::wait`]) after the original's
    /// kill, out of the pause. The copy holds nothing of the original's
    /// (PIDs, ports, SysV ids and mounts are its namespaces'), so the two
    /// ends may overlap; dropped, [`EndingTrial`] kills and reaps it.
    pub fn trial(self, dir: &Path) -> Result<(TrialOutcome, Option<EndingTrial>)> {
        use std::os::unix::ffi::OsStrExt;
        let t0 = Instant::now();
        // Read here too, for what is not tried and for the root's PID
        // (0.1 ms for the tiny listener): dropping `self` ends the helper.
        let image = ferry_image::DirSource::new(dir).load(crate::worker_threads())?;
        if let Some(why) = untrialable(&image.tree) {
            return Ok((TrialOutcome::Skipped(why), None));
        }
        let root = image.tree.root().map_or(0, |p| p.pid);
        drop(image);
        let held = self.0.restore(dir.as_os_str().as_bytes(), root)?;
        let ms = t0.elapsed().as_secs_f64() * 1e3;
        Ok((TrialOutcome::Passed { ms }, Some(TrialCopy { held, ms }.end())))
    }
}

/// In the helper forked ahead: the image in directory `dir` (its path's
/// bytes) restored and held, as [`trial_carrying`] does it in its helper.
fn restore_ahead(dir: Vec<u8>) -> Result<super::Held> {
    use std::os::unix::ffi::OsStringExt;
    let t0 = Instant::now();
    // As the helper forked in the pause would have it.
    let _raised = crate::priority::Raised::new();
    let dir = std::path::PathBuf::from(std::ffi::OsString::from_vec(dir));
    let mut image = ferry_image::DirSource::new(&dir).load(crate::worker_threads())?;
    super::files::carried::leave_owners_of_carried(&mut image.tree);
    let root = image.tree.root().map_or(0, |p| p.pid);
    let lo = ferry_sys::address::interface_index("lo")
        .map_err(|e| EngineError::kernel(root, "the trial's loopback interface", e))?;
    add_addresses(lo, &scratch_addresses(&image.tree))?;
    scratch_devpts(root, image.tree.ptys.as_ref().is_some_and(|p| !p.pairs.is_empty()))?;
    let opts = RestoreOptions { new_pid_ns: true, check: true, trial: true, ..Default::default() };
    let pages = image.pages;
    super::restore_held(image.tree, pages.bytes(), &opts, &Handover::default(), t0)
}

/// What came of [`trial_carrying`].
pub enum TrialRun {
    /// Restored and checked; held, never run, until it is ended.
    Passed(TrialCopy),
    /// Not tried: the reason, naming the object.
    Skipped(String),
}

/// A trial copy that passed the restore's check, held stopped in its
/// namespaces: none of its processes has run an instruction. Dropped, it
/// is killed and waited for.
pub struct TrialCopy {
    held: pidns::HeldInNamespace,
    /// From the image's load to the copy held.
    pub ms: f64,
}

impl TrialCopy {
    /// The restore's phases in the trial's helper, as (name, ms).
    pub fn phases(&self) -> &[(String, f64)] {
        &self.held.phases
    }

    /// Tells the helper to end the copy (it kills and reaps every process
    /// of it, then exits, which ends its namespaces) without waiting.
    pub fn end(self) -> EndingTrial {
        EndingTrial { ending: self.held.begin_abandon() }
    }
}

/// A trial copy being ended by its helper ([`TrialCopy::end`]).
pub struct EndingTrial {
    ending: pidns::Abandoned,
}

impl EndingTrial {
    /// Waits until the helper has exited, which it does only once every
    /// process of the copy is reaped (the namespace's init exits last): a
    /// poll on its pidfd, no sleep in steps. After `patience` the helper
    /// is killed, and that end waited for. The time waited, in ms.
    pub fn wait(self, patience: Duration) -> f64 {
        let t = Instant::now();
        self.ending.wait(patience);
        t.elapsed().as_secs_f64() * 1e3
    }
}

/// A network namespace for a trial, made ahead (before a replacement's
/// freeze): empty, its loopback up. A namespace is the costliest part of
/// the helper's clone (about 0.5 ms of it here, against 0.1 ms for the new
/// PID, mount and IPC namespaces together), and its teardown, a kernel
/// worker's, follows the last reference: with the namespace held here it
/// comes after the replacement, not beside the restore after the kill.
/// The mount and IPC namespaces are still made by the helper's clone, so
/// the trial sees the filesystem as it is at the trial.
pub struct Sandbox {
    net: std::os::fd::OwnedFd,
}

impl Sandbox {
    /// Makes the namespace on a thread of its own (only that thread
    /// enters it), which ends before this returns.
    pub fn prepare() -> Result<Sandbox> {
        let made = std::thread::Builder::new()
            .name("ferry-sandbox".into())
            .spawn(|| -> Result<std::os::fd::OwnedFd> {
                ferry_sys::netns::enter_new_net_namespace().map_err(|e| {
                    EngineError::kernel(0, "making the trial's network namespace", e)
                })?;
                loopback_up(0)?;
                let ns = std::fs::File::open("/proc/thread-self/ns/net")
                    .map_err(|e| EngineError::io("/proc/thread-self/ns/net", e))?;
                Ok(ns.into())
            })
            .map_err(|e| EngineError::io("starting a thread for the trial's namespace", e))?;
        let net = made.join().map_err(|_| {
            EngineError::restore(0, "the thread making the trial's namespace panicked")
        })??;
        Ok(Sandbox { net })
    }
}

/// In the helper: ferry's copies of the checkpointed tree's sockets,
/// which the parent keeps. Contiguous numbers are closed in one call.
fn close_inherited(fds: &[std::os::fd::RawFd]) {
    let mut sorted: Vec<u32> = fds.iter().filter_map(|&fd| u32::try_from(fd).ok()).collect();
    sorted.sort_unstable();
    let mut i = 0;
    while i < sorted.len() {
        let mut j = i;
        while j + 1 < sorted.len() && sorted[j + 1] <= sorted[j] + 1 {
            j += 1;
        }
        // A number already closed is no harm: the range call skips it.
        let _ = ferry_sys::fd::close_range(sorted[i], sorted[j]);
        i = j + 1;
    }
}

/// Why a trial of `tree` would touch the original's objects, if it would:
/// what restore re-creates by path in the filesystem the trial shares
/// with the original.
pub fn untrialable(tree: &TreeImage) -> Option<String> {
    for p in &tree.processes {
        for f in &p.files {
            if let Some(why) = untrialable_file(&f.kind) {
                return Some(format!("pid {}: {why}", p.pid));
            }
            if !f.locks.is_empty() {
                return Some(format!(
                    "pid {}: a file lock on {}: the original holds it",
                    p.pid,
                    describe(&f.kind)
                ));
            }
        }
    }
    let dead = tree.unix_dead_peers.as_ref().map_or(&[][..], |d| &d.sockets[..]);
    dead.iter().find(|d| is_path_name(&d.peer_name)).map(|d| {
        format!(
            "unix socket {} whose closed peer was bound to {}: the stand-in would bind that path",
            d.ino,
            String::from_utf8_lossy(&d.peer_name)
        )
    })
}

fn untrialable_file(kind: &FileKind) -> Option<String> {
    match kind {
        FileKind::UnixSocket(u) if is_path_name(&u.name) => Some(format!(
            "unix socket bound to {}: restore would remove the original's socket file and bind the path again",
            String::from_utf8_lossy(&u.name)
        )),
        FileKind::Fifo { path, .. } => {
            Some(format!("FIFO {path}: restore would fill the queue the original shares"))
        }
        _ => None,
    }
}

fn describe(kind: &FileKind) -> String {
    match kind {
        FileKind::Regular { path, .. }
        | FileKind::Deleted { path, .. }
        | FileKind::Directory { path }
        | FileKind::CharDevice { path, .. } => path.clone(),
        other => format!("{other:?}").chars().take(40).collect(),
    }
}

/// A name in the filesystem (not empty: unnamed; not a leading NUL:
/// abstract, which belongs to the network namespace).
fn is_path_name(name: &[u8]) -> bool {
    name.first().is_some_and(|&b| b != 0)
}

/// Every address the tree's inet sockets are bound or connected to that a
/// new network namespace lacks: not wildcard, loopback, multicast or
/// link-local (which needs an interface the scratch namespace has not).
/// IPv4-mapped IPv6 addresses come back as IPv4. Sorted, no repeats.
pub fn scratch_addresses(tree: &TreeImage) -> Vec<IpAddr> {
    let mut out: Vec<IpAddr> = tree
        .processes
        .iter()
        .flat_map(|p| &p.files)
        .filter_map(|f| match &f.kind {
            FileKind::InetSocket(s) => Some(s),
            _ => None,
        })
        .flat_map(|s| std::iter::once(&s.addr).chain(s.peer.as_ref().map(|(a, _)| a)))
        .filter_map(|b| ip_of(b))
        .filter(|a| needs_adding(*a))
        .collect();
    out.sort();
    out.dedup();
    out
}

fn ip_of(bytes: &[u8]) -> Option<IpAddr> {
    if let Ok(b) = <[u8; 4]>::try_from(bytes) {
        return Some(IpAddr::V4(Ipv4Addr::from(b)));
    }
    let v6 = Ipv6Addr::from(<[u8; 16]>::try_from(bytes).ok()?);
    Some(v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4))
}

fn needs_adding(a: IpAddr) -> bool {
    match a {
        IpAddr::V4(v) => !(v.is_unspecified() || v.is_loopback() || v.is_multicast()),
        IpAddr::V6(v) => {
            let link_local = (v.segments()[0] & 0xffc0) == 0xfe80;
            !(v.is_unspecified() || v.is_loopback() || v.is_multicast() || link_local)
        }
    }
}

/// Runs in the trial's helper, in its new mount namespace: a devpts of
/// its own, so the tree's pty pairs get their numbers again while the
/// original holds them in the host's.
fn scratch_devpts(root: i32, needed: bool) -> Result<()> {
    if !needed {
        return Ok(());
    }
    ferry_sys::netns::mount_own_devpts()
        .map_err(|e| EngineError::kernel(root, "mounting a devpts of the trial's own", e))
}

/// Runs in the trial's helper: into the sandbox's network namespace
/// `net` when there is one (its loopback is up), else in the new one of
/// its clone, loopback up (which gives it 127.0.0.1 and ::1); then `addrs`
/// added to it, as host addresses (/32, /128) so nothing else is routed.
fn scratch_network(root: i32, net: Option<RawFd>, addrs: &[IpAddr]) -> Result<()> {
    let lo = match net {
        Some(ns) => {
            ferry_sys::netns::enter_net_namespace_fd(ns)
                .map_err(|e| EngineError::kernel(root, "entering the trial's namespace", e))?;
            ferry_sys::address::interface_index("lo")
                .map_err(|e| EngineError::kernel(root, "the trial's loopback interface", e))?
        }
        None => loopback_up(root)?,
    };
    add_addresses(lo, addrs)
}

/// `addrs` added to loopback `lo` of the calling thread's namespace.
fn add_addresses(lo: u32, addrs: &[IpAddr]) -> Result<()> {
    for &a in addrs {
        let prefix = if a.is_ipv4() { 32 } else { 128 };
        match ferry_sys::address::add_address(lo, a, prefix) {
            Ok(()) => {}
            Err(e) if e.errno == libc::EEXIST => {}
            Err(e) => {
                return Err(EngineError::kernel(
                    0,
                    format!("adding {a} to the trial's loopback"),
                    e,
                ))
            }
        }
    }
    Ok(())
}

/// Sets the calling thread's network namespace's loopback up; its index.
fn loopback_up(root: i32) -> Result<u32> {
    let lo = ferry_sys::address::interface_index("lo")
        .map_err(|e| EngineError::kernel(root, "the trial's loopback interface", e))?;
    ferry_sys::address::set_link_up(lo)
        .map_err(|e| EngineError::kernel(root, "setting the trial's loopback up", e))?;
    Ok(lo)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_image::{InetSocket, OpenFile, PipeEnd, ProcessImage, UnixSocket};

    fn inet(addr: &[u8], peer: Option<&[u8]>) -> FileKind {
        FileKind::InetSocket(InetSocket {
            family: if addr.len() == 4 { libc::AF_INET } else { libc::AF_INET6 },
            sock_type: libc::SOCK_STREAM,
            protocol: 0,
            addr: addr.to_vec(),
            port: 80,
            listen_backlog: None,
            peer: peer.map(|p| (p.to_vec(), 4000)),
            options: vec![],
            connection: None,
        })
    }

    fn tree_of(kinds: Vec<FileKind>) -> TreeImage {
        let files = kinds
            .into_iter()
            .enumerate()
            .map(|(i, kind)| OpenFile { id: i as u64, flags: 0, pos: 0, kind, locks: vec![] })
            .collect();
        TreeImage {
            processes: vec![ProcessImage { pid: 7, files, ..Default::default() }],
            ..Default::default()
        }
    }

    #[test]
    fn scratch_addresses_are_the_routable_ones_once_each() {
        let mapped = {
            let mut b = [0u8; 16];
            b[10] = 0xff;
            b[11] = 0xff;
            b[12..].copy_from_slice(&[10, 0, 0, 9]);
            b
        };
        let v6: [u8; 16] = "fd00::5".parse::<Ipv6Addr>().unwrap().octets();
        let tree = tree_of(vec![
            inet(&[0, 0, 0, 0], None),
            inet(&[127, 0, 0, 1], Some(&[127, 0, 0, 1])),
            inet(&[10, 0, 0, 9], Some(&[10, 0, 0, 2])),
            inet(&mapped, None),
            inet(&v6, Some(&Ipv6Addr::LOCALHOST.octets())),
            inet(&"fe80::1".parse::<Ipv6Addr>().unwrap().octets(), None),
        ]);
        let want: Vec<IpAddr> = vec![
            "10.0.0.2".parse().unwrap(),
            "10.0.0.9".parse().unwrap(),
            "fd00::5".parse().unwrap(),
        ];
        assert_eq!(scratch_addresses(&tree), want);
    }

    fn unix(name: &[u8]) -> FileKind {
        FileKind::UnixSocket(UnixSocket {
            ino: 1,
            sock_type: libc::SOCK_STREAM,
            name: name.to_vec(),
            listen_backlog: None,
            peer: None,
            queued: vec![],
            passcred: false,
            shutdown: 0,
            in_flight: vec![],
        })
    }

    #[test]
    fn only_filesystem_objects_of_the_original_stop_a_trial() {
        assert_eq!(untrialable(&tree_of(vec![unix(b""), unix(b"\0abstract")])), None);
        let why = untrialable(&tree_of(vec![unix(b"/run/x.sock")])).expect("refused");
        assert!(why.contains("pid 7: unix socket bound to /run/x.sock"), "{why}");
        let fifo = FileKind::Fifo {
            path: "/tmp/f".into(),
            pipe: PipeEnd {
                id: 1,
                write_end: false,
                capacity: 4096,
                data: vec![],
                peer_closed: false,
            },
        };
        assert!(untrialable(&tree_of(vec![fifo])).expect("refused").contains("FIFO /tmp/f"));
        let mut locked = tree_of(vec![FileKind::Regular { path: "/tmp/l".into(), size: 0 }]);
        locked.processes[0].files[0].locks.push(ferry_image::FileLock {
            kind: ferry_image::LockKind::Flock,
            write: true,
            start: 0,
            end: None,
        });
        assert!(untrialable(&locked).expect("refused").contains("file lock on /tmp/l"));
    }
}
