//! The old tree's end: it serves the connections it had until their
//! clients close them or `--drain-timeout` passes, then it is stopped
//! (SIGTERM to each of its processes, SIGKILL to what is left after a
//! grace period), by PID. A warden process stops it at the same
//! deadline should ferry itself die during the drain.

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
    warden: Option<StopWarden>,
    progress: &mut dyn FnMut(String),
) -> Drained {
    let t0 = Instant::now();
    let at_start = connections(root, ports);
    let mut left = at_start;
    let mut told = Instant::now();
    while left > 0 && t0.elapsed() < timeout && alive(root) {
        std::thread::sleep(Duration::from_millis(50));
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
        let pid = w.pid();
        if let Err(e) = w.disarm() {
            tracing::warn!("ending the drain's warden, pid {pid}: {e}");
        }
    }
    Drained { seconds, at_start, left, killed }
}

/// The warden over the old tree's processes: it stops them a little after
/// ferry would have (the drain timeout, the grace period and 2 s), so it
/// acts only when ferry did not live to. Processes the tree forks during
/// the drain are not among them: ferry's own stop lists the tree again.
pub fn arm_warden(root: i32, timeout: Duration) -> Option<StopWarden> {
    let pidfds: Vec<_> = ferry_engine::capture::running_tree(root)
        .into_iter()
        .filter_map(|p| ferry_sys::pidfd::pidfd_open(p).ok())
        .collect();
    let after = timeout.saturating_add(GRACE).saturating_add(Duration::from_secs(2));
    match ferry_sys::stop_warden::spawn_stop_warden(&pidfds, after, GRACE) {
        Ok(w) => Some(w),
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
