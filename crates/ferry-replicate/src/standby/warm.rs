//! Work a takeover would otherwise begin with, done while the standby
//! only receives syncs, on a thread of its own started before the
//! Welcome:
//!
//! - **The network lock's base.** The takeover engages a network lock
//!   for the service's connections before it restores them. The first
//!   lock of a network namespace loads and attaches the lock's eBPF
//!   programs (its base: 75-200 ms here, most of a takeover that restores
//!   in 30-60 ms); every later one only claims a slot of that base. So a
//!   lock is prepared and released at once: the base stays, and the
//!   takeover's own lock costs a few syscalls. It is never engaged here:
//!   nothing of the host's traffic is held by it.
//! - **Output holds of a dead `ferry replicate`** in this namespace (a
//!   host that was the primary once), which would drop the service's
//!   every packet after the takeover, are removed (two iptables runs,
//!   4-25 ms). When no hold is left afterwards, the takeover need not look
//!   again: a new hold on the service's address needs a `ferry replicate`
//!   that won the service in the fencing store, which the primary holds
//!   until this standby takes it over. A hold whose owner still ran is
//!   looked at again at the takeover (its owner may have died since).

use ferry_netlock::{Method, Netns, NetworkLock};
use std::thread::JoinHandle;
use std::time::Instant;

/// What the warm-up did.
pub(super) struct Done {
    /// The base's preparation (ms), or why it failed.
    lock: Result<f64, String>,
    /// Output holds (removed, left), or why they could not be read.
    holds: Result<(usize, usize), String>,
}

impl Done {
    /// No output hold is left in this namespace: the takeover may skip
    /// its own look.
    pub(super) fn no_holds_left(&self) -> bool {
        matches!(self.holds, Ok((_, 0)))
    }

    /// For the log.
    pub(super) fn describe(&self) -> String {
        let lock = match &self.lock {
            Ok(ms) => format!("network lock base ready ({ms:.1} ms, before the silence)"),
            Err(e) => format!("network lock base not ready ({e})"),
        };
        let holds = match &self.holds {
            Ok((removed, left)) => {
                format!("{removed} stale output hold(s) removed, {left} left")
            }
            Err(e) => format!("output holds not looked at ({e})"),
        };
        format!("{lock}, {holds}")
    }
}

/// The warm-up on its way; joined before the takeover forks anything (a
/// thread inside the allocator during a fork would leave the child's
/// allocator locked), and when dropped.
pub(super) struct Warm(Option<JoinHandle<Done>>);

pub(super) fn start(method: Method) -> Warm {
    let thread = std::thread::Builder::new().name("standby-warm".into()).spawn(move || {
        let t = Instant::now();
        let lock = NetworkLock::prepare(method, &Netns::Current, "standby")
            .and_then(|l| l.thaw())
            .map(|()| t.elapsed().as_secs_f64() * 1e3)
            .map_err(|e| e.to_string());
        let holds = ferry_outbox::Outbox::remove_stale_counting(None).map_err(|e| e.to_string());
        Done { lock, holds }
    });
    match thread {
        Ok(t) => Warm(Some(t)),
        Err(e) => {
            // The takeover does all of it itself, as without a warm-up.
            tracing::warn!("starting the standby's warm-up: {e}");
            Warm(None)
        }
    }
}

impl Warm {
    /// Waits for the warm-up. None when there was none or it panicked:
    /// a warm-up that did not happen costs the takeover time, never
    /// correctness (the takeover prepares its own lock, and fails there
    /// if it cannot, and removes stale holds itself).
    pub(super) fn join(&mut self) -> Option<Done> {
        self.0.take().and_then(|t| t.join().ok())
    }
}

impl Drop for Warm {
    fn drop(&mut self) {
        let _ = self.join();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_takeover_skips_its_look_only_when_no_hold_was_left() {
        let done = |holds| Done { lock: Ok(80.0), holds };
        assert!(done(Ok((0, 0))).no_holds_left());
        assert!(done(Ok((2, 0))).no_holds_left());
        assert!(!done(Ok((0, 1))).no_holds_left(), "a live owner may die before the takeover");
        assert!(!done(Err("iptables failed".into())).no_holds_left());
        let d = Done { lock: Err("no bpffs".into()), holds: Ok((1, 0)) }.describe();
        assert_eq!(
            d,
            "network lock base not ready (no bpffs), 1 stale output hold(s) removed, 0 left"
        );
    }
}
