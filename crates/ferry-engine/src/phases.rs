//! Phase timing for `--verbose` runs: where a checkpoint or restore spends
//! its time, logged at debug level.

use std::time::Instant;

pub struct Phases {
    op: &'static str,
    start: Instant,
    last: Instant,
}

impl Phases {
    pub fn start(op: &'static str) -> Phases {
        let now = Instant::now();
        Phases { op, start: now, last: now }
    }

    pub fn mark(&mut self, phase: &str) {
        let now = Instant::now();
        tracing::debug!(
            "{} {:<22} {:>8.3} ms (total {:>8.3} ms)",
            self.op,
            phase,
            (now - self.last).as_secs_f64() * 1e3,
            (now - self.start).as_secs_f64() * 1e3
        );
        self.last = now;
    }
}
