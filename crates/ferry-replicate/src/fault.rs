//! Fault injection for tests, in the style of `ferry_engine::phases`:
//! `FERRY_FAULT_STALL_AFTER=OP:POINT` makes the process print a line and
//! sleep at that point (for `FERRY_FAULT_STALL_SECS`, 120 by default), so
//! that a test can kill a host or cut a link exactly there;
//! `FERRY_FAULT_KILL_AT=OP:POINT` makes the process SIGKILL itself there,
//! as a crash would. OP is `replicate` (the primary) or `standby`; each
//! point is named where it is passed (e.g. `sync 40 half sent`). Both
//! variables are read once; unset, a point costs one branch.

use std::sync::OnceLock;
use std::time::Duration;

struct Faults {
    stall: Option<String>,
    stall_secs: u64,
    kill: Option<String>,
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
    })
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
        };
        assert!(f.stall_at("replicate:sync 25 half sent"));
        assert!(!f.stall_at("replicate:sync 2 half sent"));
        assert!(!f.stall_at("standby:sync 25 half sent"));
        assert!(f.kill_at("standby:sync 5 half applied"));
        assert!(!f.kill_at("standby:sync 50 half applied"));
        let none = Faults { stall: None, stall_secs: 120, kill: None };
        assert!(!none.stall_at("replicate:sync 25 half sent") && !none.kill_at(""));
    }
}
