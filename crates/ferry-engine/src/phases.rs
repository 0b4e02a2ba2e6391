//! Phase timing for `--verbose` runs: where a checkpoint or restore spends
//! its time, logged at debug level.

use std::time::Instant;

pub struct Phases {
    op: &'static str,
    start: Instant,
    last: Instant,
    done: Vec<(String, f64)>,
}

impl Phases {
    pub fn start(op: &'static str) -> Phases {
        Phases::start_at(op, Instant::now())
    }

    /// Phases counted from `start`, an instant taken earlier.
    pub fn start_at(op: &'static str, start: Instant) -> Phases {
        Phases { op, start, last: start, done: Vec::new() }
    }

    pub fn mark(&mut self, phase: &str) {
        let now = Instant::now();
        // The wall clock lets a benchmark line up the phases of a
        // checkpoint and a restore run by two processes.
        let unix_us = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros());
        tracing::debug!(
            "{} {:<22} {:>8.3} ms (total {:>8.3} ms) at {unix_us}",
            self.op,
            phase,
            (now - self.last).as_secs_f64() * 1e3,
            (now - self.start).as_secs_f64() * 1e3
        );
        self.done.push((phase.to_string(), (now - self.last).as_secs_f64() * 1e3));
        self.last = now;
        stall_if_asked(self.op, phase);
    }

    /// Runs one named phase and marks its end: a composition of phases
    /// reads as a list of these.
    pub fn step<T>(&mut self, phase: &str, run: impl FnOnce() -> T) -> T {
        let out = run();
        self.mark(phase);
        out
    }

    /// Every phase marked so far with its duration in ms, in order.
    pub fn done(&self) -> &[(String, f64)] {
        &self.done
    }

    pub fn started(&self) -> Instant {
        self.start
    }
}

/// Fault injection for tests: `FERRY_FAULT_STALL_AFTER=OP:PHASE` (e.g.
/// `checkpoint:tcp connections`) makes ferry print a line and sleep right
/// after that phase, so a test can kill it or cut its link there: for two
/// minutes, or `FERRY_FAULT_STALL_SECS` seconds (a test that wants the
/// stalled side to carry on and handle the fault itself).
fn stall_if_asked(op: &str, phase: &str) {
    let Some(want) = std::env::var_os("FERRY_FAULT_STALL_AFTER") else {
        return;
    };
    if want.to_string_lossy() == format!("{op}:{phase}") {
        let secs = std::env::var("FERRY_FAULT_STALL_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(120);
        eprintln!(
            "ferry: pid {} stalling after {op} phase '{phase}' for {secs} s (FERRY_FAULT_STALL_AFTER)",
            std::process::id()
        );
        std::thread::sleep(std::time::Duration::from_secs(secs));
    }
}

/// The parts of one phase, timed and logged together as one debug line
/// when it ends: where a phase that grows with the tree spends its time
/// (`ferry -v`).
pub struct Splits {
    what: String,
    last: Instant,
    parts: Vec<(&'static str, f64)>,
}

impl Splits {
    pub fn start(what: impl Into<String>) -> Splits {
        Splits { what: what.into(), last: Instant::now(), parts: Vec::new() }
    }

    /// Ends the part running since the last mark, adding to a part of
    /// the same name marked before.
    pub fn mark(&mut self, part: &'static str) {
        let now = Instant::now();
        let ms = (now - self.last).as_secs_f64() * 1e3;
        self.last = now;
        match self.parts.iter_mut().find(|(p, _)| *p == part) {
            Some((_, total)) => *total += ms,
            None => self.parts.push((part, ms)),
        }
    }

    /// The parts as "name 1.234 ms, ..." in the order first marked.
    pub fn summary(&self) -> String {
        self.parts.iter().map(|(p, ms)| format!("{p} {ms:.3} ms")).collect::<Vec<_>>().join(", ")
    }
}

impl Drop for Splits {
    fn drop(&mut self) {
        if !self.parts.is_empty() {
            tracing::debug!("{}: {}", self.what, self.summary());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Splits;

    #[test]
    fn splits_add_parts_of_one_name_in_first_order() {
        let mut s = Splits::start("test");
        s.mark("a");
        std::thread::sleep(std::time::Duration::from_millis(2));
        s.mark("b");
        s.mark("a");
        let text = s.summary();
        let names: Vec<&str> =
            text.split(", ").map(|p| p.split(' ').next().unwrap_or("")).collect();
        assert_eq!(names, ["a", "b"]);
        let b: f64 = text
            .split(", ")
            .nth(1)
            .and_then(|p| p.split(' ').nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        assert!(b >= 2.0, "{text}");
    }
}
