//! Pre-copy: the service's memory is copied while it keeps running, then
//! again only the pages written since the previous round, until what is
//! left is small enough for the short final round in the freeze, or stops
//! shrinking.

use crate::error::{MigrateError, Result};
use crate::protocol::{self, Msg};
use crate::ranges::RangeSet;
use crate::stream_sink::StreamSink;
use ferry_engine::dirty::DirtyTracker;
use ferry_transport::Channel;
use std::collections::HashMap;
use std::time::Instant;

/// When to stop copying rounds and freeze.
#[derive(Debug, Clone, Copy)]
pub struct RoundPolicy {
    pub max_rounds: u32,
    /// Freeze once the pages written since the last round are at most this.
    pub stop_below: u64,
    /// Freeze when a round's dirty set is not below this fraction of the
    /// previous one: the service writes as fast as the link carries.
    pub min_shrink: f64,
}

impl Default for RoundPolicy {
    fn default() -> Self {
        RoundPolicy { max_rounds: 10, stop_below: 4 << 20, min_shrink: 0.9 }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Continue,
    Converged,
    NotShrinking,
    RoundLimit,
}

impl RoundPolicy {
    /// `round` rounds have been sent; `dirty` bytes were written since the
    /// last one, `previous` since the one before.
    pub fn decide(&self, round: u32, dirty: u64, previous: Option<u64>) -> Decision {
        if dirty <= self.stop_below {
            return Decision::Converged;
        }
        if round >= self.max_rounds {
            return Decision::RoundLimit;
        }
        if let Some(p) = previous {
            if dirty as f64 > p as f64 * self.min_shrink {
                return Decision::NotShrinking;
            }
        }
        Decision::Continue
    }
}

#[derive(Debug, Clone)]
pub struct Round {
    pub bytes: u64,
    pub ms: f64,
    /// Bytes written by the service while the round was copied.
    pub dirty_after: u64,
}

/// The pre-copy state between rounds: what the destination holds, per
/// process, with the content it has now.
pub struct Precopy {
    tracker: DirtyTracker,
    held: HashMap<i32, RangeSet>,
    pub rounds: Vec<Round>,
    pub stopped_because: Option<Decision>,
}

impl Precopy {
    /// Starts tracking writes, then copies the whole memory once (round 0)
    /// and further rounds as the policy says.
    pub fn run(
        root: i32,
        ch: &mut Channel,
        policy: &RoundPolicy,
        mut progress: impl FnMut(&str),
    ) -> Result<Precopy> {
        let tracker = DirtyTracker::attach(root)?;
        let mut pc =
            Precopy { tracker, held: HashMap::new(), rounds: Vec::new(), stopped_because: None };
        let pids = pc.tracker.pids();
        let t = Instant::now();
        let bytes = pc.copy_round(ch, &pids, None)?;
        pc.finish_round(ch, bytes, t)?;
        progress(&format!(
            "pre-copy round 0: {:.1} MiB in {:.0} ms",
            bytes as f64 / 1048576.0,
            pc.rounds[0].ms
        ));
        let mut previous: Option<u64> = None;
        loop {
            let dirty = pc.tracker.collect()?;
            let dirty_bytes = DirtyTracker::bytes(&dirty);
            if let Some(last) = pc.rounds.last_mut() {
                last.dirty_after = dirty_bytes;
            }
            let dirty: HashMap<i32, RangeSet> =
                dirty.into_iter().map(|(pid, r)| (pid, RangeSet::from_ranges(r))).collect();
            for (pid, d) in &dirty {
                if let Some(h) = pc.held.get_mut(pid) {
                    *h = h.minus(d);
                }
            }
            let decision = policy.decide(pc.rounds.len() as u32, dirty_bytes, previous);
            if decision != Decision::Continue {
                pc.stopped_because = Some(decision);
                return Ok(pc);
            }
            previous = Some(dirty_bytes);
            let t = Instant::now();
            let mut bytes = 0;
            for (pid, d) in &dirty {
                bytes += pc.copy_round(ch, &[*pid], Some(d))?;
            }
            pc.finish_round(ch, bytes, t)?;
            let n = pc.rounds.len() - 1;
            progress(&format!(
                "pre-copy round {n}: {:.1} MiB in {:.0} ms",
                bytes as f64 / 1048576.0,
                pc.rounds[n].ms
            ));
        }
    }

    /// After a replication sync: the standby now holds exactly `pages`
    /// ((start, end) byte ranges) of each process, by the PIDs ferry sees:
    /// what it held unchanged and what the freeze sent. Processes whose
    /// writes are not tracked (started since tracking began) are left
    /// out: every sync sends all their pages.
    pub fn now_held(&mut self, pages: HashMap<i32, Vec<(u64, u64)>>) {
        let tracked = self.tracker.pids();
        self.held = pages
            .into_iter()
            .filter(|(pid, _)| tracked.contains(pid))
            .map(|(pid, r)| (pid, RangeSet::from_ranges(r)))
            .collect();
    }

    fn copy_round(
        &mut self,
        ch: &mut Channel,
        pids: &[i32],
        only: Option<&RangeSet>,
    ) -> Result<u64> {
        let keep_shared = self.tracker.pids().len() > 1;
        let mut sink = StreamSink::new(ch);
        for &pid in pids {
            let only_ranges = only.map(|o| o.ranges());
            match ferry_engine::capture::copy_present(
                pid,
                only_ranges,
                keep_shared,
                &mut sink,
                None,
            ) {
                Ok(sent) => {
                    let sent = RangeSet::from_ranges(sent);
                    let h = self.held.entry(pid).or_default();
                    *h = h.union(&sent);
                }
                // Memory that went away while being read (munmap) is not
                // an error of the migration: this process's pages all go
                // in the final round instead.
                Err(e) => {
                    tracing::info!("pre-copy of pid {pid}: {e}; its pages go in the final round");
                    self.held.insert(pid, RangeSet::new());
                }
            }
        }
        Ok(sink.page_bytes())
    }

    /// Ends a round once the destination has stored all of it: a round
    /// counts until its pages are at the destination, not until they are
    /// in the socket buffers (the next collect, and the freeze, come after).
    fn finish_round(&mut self, ch: &mut Channel, bytes: u64, t: Instant) -> Result<()> {
        let round = self.rounds.len() as u32;
        protocol::send(ch, &Msg::RoundDone { round, bytes })?;
        let stored = protocol::expect(ch, &["RoundStored"])?;
        match stored.msg {
            Msg::RoundStored { round: r } if r == round => {}
            Msg::RoundStored { round: r } => {
                return Err(MigrateError::Protocol(format!(
                    "the destination acknowledged round {r} after round {round}"
                )))
            }
            m => {
                return Err(MigrateError::Protocol(format!(
                    "expected RoundStored after round {round}, got {}",
                    m.name()
                )))
            }
        }
        self.rounds.push(Round { bytes, ms: t.elapsed().as_secs_f64() * 1e3, dirty_after: 0 });
        Ok(())
    }
}

/// Called by the capture once the tree is frozen: the last writes are
/// collected, and what the destination still holds unchanged is not sent
/// again.
impl ferry_engine::capture::CaptureHooks for Precopy {
    fn held_pages(
        &mut self,
        procs: &[(i32, &[ferry_image::Vma])],
    ) -> ferry_engine::Result<HashMap<i32, Vec<ferry_image::PageSpan>>> {
        let dirty = self.tracker.collect()?;
        let mut out = HashMap::new();
        for &(pid, _) in procs {
            let Some(held) = self.held.get(&pid) else {
                continue;
            };
            let written = dirty
                .iter()
                .find(|(p, _)| *p == pid)
                .map(|(_, r)| RangeSet::from_ranges(r.clone()))
                .unwrap_or_default();
            out.insert(pid, held.minus(&written).as_page_runs());
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_stop_when_small_not_shrinking_or_too_many() {
        let p = RoundPolicy { max_rounds: 5, stop_below: 100, min_shrink: 0.9 };
        assert_eq!(p.decide(1, 50, None), Decision::Converged);
        assert_eq!(p.decide(1, 1000, None), Decision::Continue);
        assert_eq!(p.decide(2, 800, Some(1000)), Decision::Continue);
        assert_eq!(p.decide(3, 950, Some(1000)), Decision::NotShrinking);
        assert_eq!(p.decide(5, 500, Some(1000)), Decision::RoundLimit);
        assert_eq!(p.decide(5, 100, Some(1000)), Decision::Converged);
    }
}
