//! Work a takeover would otherwise begin with, done while the standby
//! only receives syncs: the network lock's base in this host's namespace.
//!
//! The takeover engages a network lock for the service's connections
//! before it restores them. The first lock of a network namespace loads
//! and attaches the lock's eBPF programs (its base: 75-160 ms here, most
//! of a takeover that restores in about 30 ms); every later one only
//! claims a slot of that base. So the standby prepares one lock and
//! releases it at once, on a thread of its own, while the first sync
//! comes: the base stays, and the takeover's own lock costs a few
//! syscalls. Nothing is held by it (a lock is never engaged here).

use ferry_netlock::{Method, Netns, NetworkLock};
use std::thread::JoinHandle;
use std::time::Instant;

/// The warm-up on its way; joined before the takeover forks anything
/// (a thread inside the allocator during a fork would leave the child's
/// allocator locked), and when dropped.
pub(super) struct Warm(Option<JoinHandle<Result<f64, String>>>);

pub(super) fn start(method: Method) -> Warm {
    let thread = std::thread::Builder::new().name("standby-warm".into()).spawn(move || {
        let t = Instant::now();
        let lock =
            NetworkLock::prepare(method, &Netns::Current, "standby").map_err(|e| e.to_string())?;
        lock.thaw().map_err(|e| e.to_string())?;
        Ok(t.elapsed().as_secs_f64() * 1e3)
    });
    match thread {
        Ok(t) => Warm(Some(t)),
        Err(e) => {
            // The takeover prepares its lock from nothing, as before.
            tracing::warn!("starting the standby's warm-up: {e}");
            Warm(None)
        }
    }
}

impl Warm {
    /// Waits for the warm-up; what it did, for the log. A failed warm-up
    /// costs the takeover time, never correctness: the takeover prepares
    /// its own lock and fails there if it cannot.
    pub(super) fn join(&mut self) -> String {
        match self.0.take().map(|t| t.join()) {
            None => "no warm-up".into(),
            Some(Ok(Ok(ms))) => format!("network lock base ready ({ms:.1} ms, before the silence)"),
            Some(Ok(Err(e))) => format!("warm-up failed: {e}"),
            Some(Err(_)) => "warm-up thread panicked".into(),
        }
    }
}

impl Drop for Warm {
    fn drop(&mut self) {
        let _ = self.join();
    }
}
