//! The old tree's end: it serves the connections it had until their
//! clients close them or `--drain-timeout` passes, then it is stopped
//! (SIGTERM to each of its processes, SIGKILL to what is left after a
//! grace period), by PID. A warden process stops it at the same
//! deadline should ferry itself die during the drain; it follows the
//! tree as the tree forks ([`Warden::follow`]).

use ferry_engine::running_sockets::{self, SocketRole};
use ferry_sys::stop_warden::StopWarden;
use std::time::{Duration, Instant};

/// How long the old tree has after SIGTERM before SIGKILL.
pub const GRACE: Duration = Duration::from_secs(5);

/// How the drain went.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Drained {
    pub seconds: f64,
    /// Connections the old tree had when the drain began.
    pub at_start: usize,
    /// Connections it still had when the time ran out (cut by the stop).
    pub left: usize,
    /// Processes that needed SIGKILL.
    pub killed: usize,
}

/// The connections the tree of `root` accepted and holds now: TCP
/// connections whose local port is one the tree listened on (its own
/// outgoing connections, to a database or an upstream, use other ports
/// and are not waited for).
pub fn connections(root: i32, ports: &[u16]) -> usize {
    let tree = running_sockets::running_tree_sockets(root);
    let accepted = |s: &&running_sockets::RunningSocket| {
        s.tcp && s.role == SocketRole::Connection && ports.contains(&s.local.port())
    };
    tree.sockets.iter().filter(accepted).count()
}

/// Waits until the tree of `root` holds no connection accepted on
/// `ports` or `timeout` passed, telling `progress` about once a second,
/// then stops it and ends `warden`.
pub fn drain_and_stop(
    root: i32,
    ports: &[u16],
    timeout: Duration,
    mut warden: Option<Warden>,
    progress: &mut dyn FnMut(String),
) -> Drained {
    let t0 = Instant::now();
    let at_start = connections(root, ports);
    let mut left = at_start;
    let mut told = Instant::now();
    while left > 0 && t0.elapsed() < timeout && alive(root) {
        std::thread::sleep(Duration::from_millis(50));
        warden = warden.map(|w| w.follow(root));
        left = connections(root, ports);
        if told.elapsed() >= Duration::from_secs(1) {
            told = Instant::now();
            let rest = timeout.saturating_sub(t0.elapsed()).as_secs_f64();
            progress(format!(
                "draining pid {root}: {left} of {at_start} connections open, {rest:.0} s left"
            ));
        }
    }
    let seconds = t0.elapsed().as_secs_f64();
    let killed = stop(root);
    if let Some(w) = warden {
        w.disarm();
    }
    Drained { seconds, at_start, left, killed }
}

/// The warden over the old tree's processes, and which processes those
/// are. It stops them a little after ferry would have (the drain timeout,
/// the grace period and 2 s), so it acts only when ferry did not live to.
pub struct Warden {
    armed: StopWarden,
    /// (PID, start time): a PID that the tree reused is a new process.
    covers: Vec<(i32, u64)>,
    deadline: Instant,
}

impl Warden {
    /// Re-arms over the tree as it is now when the tree has a process the
    /// warden does not know (forked during the drain): a new warden over
    /// all of them, with the same deadline, and only then the old one
    /// disarmed, so the tree is never without one. A process forked and
    /// left behind within one drain step (50 ms) of ferry's death is the
    /// only one it can miss.
    pub fn follow(self, root: i32) -> Warden {
        let now = identified(ferry_engine::capture::running_tree(root));
        if now.iter().all(|k| self.covers.contains(&k.id)) {
            return self;
        }
        let after = self.deadline.saturating_duration_since(Instant::now());
        match spawn_over(root, now, after) {
            Some(new) => {
                self.disarm();
                new
            }
            None => self,
        }
    }

    /// Ends the warden without touching the tree (ferry stopped it).
    pub fn disarm(self) {
        let pid = self.armed.pid();
        if let Err(e) = self.armed.disarm() {
            tracing::warn!("ending the drain's warden, pid {pid}: {e}");
        }
    }
}

/// Starts the drain's warden over the tree of `root`.
pub fn arm_warden(root: i32, timeout: Duration) -> Option<Warden> {
    let after = timeout.saturating_add(GRACE).saturating_add(Duration::from_secs(2));
    spawn_over(root, identified(ferry_engine::capture::running_tree(root)), after)
}

/// A live process of the tree: its pidfd, and its PID with its start
/// time (field 22 of its stat), which tell a reused PID's new owner apart.
struct Known {
    id: (i32, u64),
    pidfd: std::os::fd::OwnedFd,
}

/// The processes of `pids` alive now. The start time is read after the
/// pidfd was opened, and kept only if the pidfd's process is still alive
/// then: so it is that process's, not its PID's next owner's.
fn identified(pids: Vec<i32>) -> Vec<Known> {
    let known = |p: i32| {
        let pidfd = ferry_sys::pidfd::pidfd_open(p).ok()?;
        let start = ferry_engine::procfs::Stat::read(p).ok()?.field(22);
        match ferry_sys::pidfd::wait_exit(&pidfd, 0) {
            Ok(false) => Some(Known { id: (p, start), pidfd }),
            _ => None,
        }
    };
    pids.into_iter().filter_map(known).collect()
}

/// A warden over `procs`.
fn spawn_over(root: i32, procs: Vec<Known>, after: Duration) -> Option<Warden> {
    let covers = procs.iter().map(|k| k.id).collect();
    let pidfds: Vec<_> = procs.into_iter().map(|k| k.pidfd).collect();
    match ferry_sys::stop_warden::spawn_stop_warden(&pidfds, after, GRACE) {
        Ok(armed) => Some(Warden { armed, covers, deadline: Instant::now() + after }),
        Err(e) => {
            tracing::warn!(
                "starting the drain's warden for pid {root}: {e}; the old tree is stopped only if ferry lives through the drain"
            );
            None
        }
    }
}

fn alive(pid: i32) -> bool {
    ferry_engine::procfs::state(pid).is_some_and(|s| s != 'Z' && s != 'X')
}

/// SIGTERM to every process of the tree, SIGKILL to those alive after
/// [`GRACE`]; returns how many needed it.
pub fn stop(root: i32) -> usize {
    let pids = ferry_engine::capture::running_tree(root);
    for &p in &pids {
        let _ = ferry_sys::process::kill(p, libc::SIGTERM);
    }
    let t0 = Instant::now();
    while t0.elapsed() < GRACE && pids.iter().any(|&p| alive(p)) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let stubborn: Vec<i32> = pids.into_iter().filter(|&p| alive(p)).collect();
    for &p in &stubborn {
        let _ = ferry_sys::process::kill(p, libc::SIGKILL);
    }
    stubborn.len()
}
