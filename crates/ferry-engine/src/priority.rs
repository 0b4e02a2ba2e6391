//! The service's pause ahead of the host's other work: while the tree is
//! frozen (checkpoint) or not yet running (restore), every millisecond
//! ferry waits for a CPU is a millisecond more of the service's outage.
//! On a host busy with other work (2 cores shared with builds: ferry got
//! a quarter of the CPU time during a 10,000-connection pause) the pause
//! grows with that work unless ferry's threads go first.
//!
//! [`Raised`] puts the calling thread under the pause's scheduling
//! ([`Pause`], from `FERRY_PAUSE_PRIORITY`) and puts its own back when
//! dropped; threads started meanwhile (the worker threads) inherit it.
//! A nice value counts only within the thread's autogroup or cgroup
//! (each session or service has its own), so the one that works is
//! real-time round-robin at the lowest real-time priority (`rr`), which
//! goes before every normal thread of the host; the kernel keeps 5 % of
//! each second for those (sched_rt_runtime_us). It is not the default:
//! for the length of a pause it stops every other service on the cores
//! ferry's threads use (ferry's own tests saw the clients of one server
//! starved through another server's checkpoint), which a host's owner
//! must choose. It is taken only around work of ferry's own that forks
//! nothing long-lived: a process forked meanwhile would keep it.
//! Without the privilege (CAP_SYS_NICE) nothing changes.

/// How the pause is scheduled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pause {
    /// As ferry was started (the default; `FERRY_PAUSE_PRIORITY=off`).
    Unchanged,
    /// SCHED_RR at this real-time priority (`rr`: 1; `rr:N`).
    RoundRobin(i32),
    /// This nice value (`nice:N`), within ferry's autogroup or cgroup.
    Nice(i32),
}

/// What `FERRY_PAUSE_PRIORITY` asks for: `off`, `rr[:1-99]` or
/// `nice:-20..19`; unset or unreadable: unchanged.
pub fn pause_from(setting: Option<&str>) -> Pause {
    const DEFAULT: Pause = Pause::Unchanged;
    let Some(v) = setting.map(str::trim) else { return DEFAULT };
    let (kind, n) = v.split_once(':').unwrap_or((v, ""));
    let n = n.parse::<i32>().ok();
    match kind {
        "off" => Pause::Unchanged,
        "rr" => Pause::RoundRobin(n.unwrap_or(1).clamp(1, 99)),
        "nice" => n.map_or(DEFAULT, |n| Pause::Nice(n.clamp(-20, 19))),
        _ => DEFAULT,
    }
}

fn pause() -> Pause {
    static PAUSE: std::sync::OnceLock<Pause> = std::sync::OnceLock::new();
    *PAUSE.get_or_init(|| {
        let setting = std::env::var("FERRY_PAUSE_PRIORITY").ok();
        let pause = pause_from(setting.as_deref());
        if let Some(v) = setting.filter(|v| !understood(v)) {
            tracing::warn!(
                "FERRY_PAUSE_PRIORITY={v:?} is none of off, rr[:1-99], nice:-20..19: the pause runs as {pause:?}"
            );
        }
        pause
    })
}

/// Whether `FERRY_PAUSE_PRIORITY`'s value is one [`pause_from`] reads as
/// written (not a fallback to the default).
fn understood(v: &str) -> bool {
    let (kind, n) = v.trim().split_once(':').unwrap_or((v.trim(), ""));
    match kind {
        "off" => n.is_empty(),
        "rr" => n.is_empty() || n.parse::<i32>().is_ok_and(|n| (1..=99).contains(&n)),
        "nice" => n.parse::<i32>().is_ok_and(|n| (-20..=19).contains(&n)),
        _ => false,
    }
}

/// A thread under the pause's scheduling until dropped (on whichever
/// thread: the raised one is named by its id).
pub struct Raised {
    /// The raised thread and its scheduling before, when changed.
    before: Option<(i32, ferry_sys::process::Sched)>,
}

impl Raised {
    /// Raises the calling thread to the pause's scheduling, unless it is
    /// real-time already or the pause's is [`Pause::Unchanged`].
    pub fn new() -> Raised {
        Raised::to(pause())
    }

    /// Raises the calling thread to `pause`, as [`Raised::new`].
    pub fn to(pause: Pause) -> Raised {
        let tid = ferry_sys::process::gettid();
        let Ok(before) = ferry_sys::process::get_sched(tid) else { return Raised { before: None } };
        let raised = match pause {
            _ if before.policy != libc::SCHED_OTHER => return Raised { before: None },
            Pause::Unchanged => return Raised { before: None },
            Pause::RoundRobin(p) => ferry_sys::process::set_round_robin(tid, p),
            Pause::Nice(n) if n < before.nice => ferry_sys::process::set_thread_nice(tid, n),
            Pause::Nice(_) => return Raised { before: None },
        };
        match raised {
            Ok(()) => Raised { before: Some((tid, before)) },
            Err(e) => {
                tracing::debug!("the pause runs at the thread's own priority: {e}");
                Raised { before: None }
            }
        }
    }
}

impl Default for Raised {
    fn default() -> Self {
        Raised::new()
    }
}

impl Drop for Raised {
    fn drop(&mut self) {
        if let Some((tid, before)) = &self.before {
            if let Err(e) = ferry_sys::process::set_sched(*tid, before) {
                tracing::warn!("putting back ferry's scheduling ({before:?}): {e}");
            }
        }
    }
}

/// Runs `f` with the calling thread (and the threads `f` starts) under
/// the pause's scheduling.
pub fn raised<T>(f: impl FnOnce() -> T) -> T {
    let _raised = Raised::new();
    f()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_setting_names_a_scheduling() {
        assert_eq!(pause_from(None), Pause::Unchanged);
        assert_eq!(pause_from(Some("off")), Pause::Unchanged);
        assert_eq!(pause_from(Some("rr")), Pause::RoundRobin(1));
        assert_eq!(pause_from(Some("rr:5")), Pause::RoundRobin(5));
        assert_eq!(pause_from(Some("rr:500")), Pause::RoundRobin(99));
        assert_eq!(pause_from(Some("nice:-5")), Pause::Nice(-5));
        assert_eq!(pause_from(Some("nice:-40")), Pause::Nice(-20));
        assert_eq!(pause_from(Some("nice")), Pause::Unchanged);
        assert_eq!(pause_from(Some("junk")), Pause::Unchanged);
        for ok in ["off", "rr", "rr:5", "nice:-5"] {
            assert!(understood(ok), "{ok}");
        }
        for bad in ["junk", "nice", "rr:500", "nice:-40", "off:3"] {
            assert!(!understood(bad), "{bad}");
        }
    }

    #[test]
    fn the_thread_is_raised_and_put_back_and_others_are_not() {
        let sched = || ferry_sys::process::get_sched(0).expect("sched");
        let before = sched();
        let other = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(50));
            sched()
        });
        {
            let _r = Raised::to(Pause::RoundRobin(1));
            let now = sched();
            // Root raises it (tests run as root); without CAP_SYS_NICE it stays.
            let raised = now.policy == libc::SCHED_RR && now.rt_priority == 1;
            assert!(raised || now == before, "{now:?}");
            // A thread started meanwhile inherits it.
            let child = std::thread::spawn(sched);
            assert_eq!(child.join().expect("join"), now);
        }
        assert_eq!(sched(), before);
        assert_eq!(other.join().expect("join"), before);
    }
}
