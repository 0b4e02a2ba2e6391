//! Fault injection for tests, in the style of `ferry_engine::phases`:
//! `FERRY_FAULT_STALL_AFTER=OP:POINT` makes the process print a line and
//! sleep at that point (for `FERRY_FAULT_STALL_SECS`, 120 by default), so
//! that a test can kill a host or cut a link exactly there;
//! `FERRY_FAULT_KILL_AT=OP:POINT` makes the process SIGKILL itself there,
//! as a crash would. OP is `replicate` (the primary) or `standby`; each
//! point is named where it is passed (e.g. `sync 40 half sent`).
//! `FERRY_FAULT_REFUSE_CAPTURE=1` makes the primary refuse the first
//! capture of every sync once it is complete, as for a passing state
//! ([`refuse_capture`]). The variables are read once; unset, a point
//! costs one branch.

use std::sync::OnceLock;
use std::time::Duration;

struct Faults {
    stall: Option<String>,
    stall_secs: u64,
    kill: Option<String>,
    refuse_capture: bool,
}

impl Faults {
    /// A point matches its variable exactly: `sync 2` is not `sync 25`.
    fn kill_at(&self, here: &str) -> bool {
        self.kill.as_deref() == Some(here)
    }

    fn stall_at(&self, here: &str) -> bool {
        self.stall.as_deref() == Some(here)
    }
}

fn faults() -> &'static Faults {
    static FAULTS: OnceLock<Faults> = OnceLock::new();
    FAULTS.get_or_init(|| Faults {
        stall: std::env::var("FERRY_FAULT_STALL_AFTER").ok(),
        stall_secs: std::env::var("FERRY_FAULT_STALL_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(120),
        kill: std::env::var("FERRY_FAULT_KILL_AT").ok(),
        refuse_capture: std::env::var_os("FERRY_FAULT_REFUSE_CAPTURE").is_some_and(|v| v == "1"),
    })
}

/// With `FERRY_FAULT_REFUSE_CAPTURE=1`, one capture attempt in two, the
/// first of each sync, is refused after it completed, as a state that
/// passes by itself is: the frozen tree, its connections in repair mode
/// and the network lock engaged on them, is let go, and the sync tries
/// again. Standing for any capture that does not finish (the lock it
/// was lent goes back to the kept one).
pub(crate) fn refuse_capture(pid: i32) -> Result<(), ferry_engine::EngineError> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static ATTEMPTS: AtomicU64 = AtomicU64::new(0);
    if !faults().refuse_capture || ATTEMPTS.fetch_add(1, Ordering::Relaxed) % 2 == 1 {
        return Ok(());
    }
    Err(ferry_engine::EngineError::transient(
        pid,
        "the tree",
        "refused once it was complete (FERRY_FAULT_REFUSE_CAPTURE)",
    ))
}

/// Point `point` of `op` is reached (the name is only made when a fault
/// is asked for).
pub(crate) fn at(op: &str, point: impl FnOnce() -> String) {
    let f = faults();
    if f.stall.is_none() && f.kill.is_none() {
        return;
    }
    let here = format!("{op}:{}", point());
    if f.kill_at(&here) {
        eprintln!(
            "ferry: pid {} killing itself at {here} (FERRY_FAULT_KILL_AT)",
            std::process::id()
        );
        let _ = ferry_sys::process::kill(std::process::id() as i32, libc::SIGKILL);
    }
    if f.stall_at(&here) {
        eprintln!(
            "ferry: pid {} stalling at {here} for {} s (FERRY_FAULT_STALL_AFTER)",
            std::process::id(),
            f.stall_secs
        );
        std::thread::sleep(Duration::from_secs(f.stall_secs));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_point_matches_only_its_own_name() {
        let f = Faults {
            stall: Some("replicate:sync 25 half sent".into()),
            stall_secs: 1,
            kill: Some("standby:sync 5 half applied".into()),
            refuse_capture: false,
        };
        assert!(f.stall_at("replicate:sync 25 half sent"));
        assert!(!f.stall_at("replicate:sync 2 half sent"));
        assert!(!f.stall_at("standby:sync 25 half sent"));
        assert!(f.kill_at("standby:sync 5 half applied"));
        assert!(!f.kill_at("standby:sync 50 half applied"));
        let none = Faults { stall: None, stall_secs: 120, kill: None, refuse_capture: false };
        assert!(!none.stall_at("replicate:sync 25 half sent") && !none.kill_at(""));
    }
}
