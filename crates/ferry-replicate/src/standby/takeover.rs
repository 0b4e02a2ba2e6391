//! The takeover: the primary fell silent. The service is won in the
//! fencing store first (a compare-and-swap from the epoch the primary
//! held it at), so that a primary that is only cut off, and wins the
//! same race, runs on alone; then the last complete sync is restored and
//! run here, the service address put on this host and announced.
//! Without an answer from the store the standby waits: it never runs the
//! service on a guess.

use super::{Outcome, Standby, StandbyConfig};
use crate::error::Result;
use ferry_migrate::protocol::Hello;
use std::time::{Duration, Instant};

const FENCE_RETRY: Duration = Duration::from_millis(200);

impl Standby<'_> {
    pub(super) fn take_over(
        &mut self,
        hello: &Hello,
        cfg: &StandbyConfig,
        why: String,
    ) -> Result<Outcome> {
        let t = Instant::now();
        let Some(image) = self.replica.image.take() else {
            self.status.remove();
            return Ok(Outcome::NothingToRun(why));
        };
        let service = self.replica_hello.service.clone();
        let me = crate::identity::holder();
        let mut ph = ferry_engine::phases::Phases::start_at("takeover", t);
        let warm = self.warm.join();
        ph.mark("warm-up joined");
        let warm_note = warm.as_ref().map_or("no warm-up".into(), |w| w.describe());
        let epoch = match self.win(&service, &me)? {
            Ok(epoch) => epoch,
            Err(owner) => {
                self.status.remove();
                return Ok(Outcome::Lost(owner));
            }
        };
        ph.mark("fenced");
        // An output hold left in this namespace by a primary that ran here
        // once and died would drop the service's every packet (warm.rs says
        // when the warm-up's look suffices).
        if !warm.as_ref().is_some_and(|w| w.no_holds_left()) {
            match ferry_outbox::Outbox::remove_stale(None) {
                Ok(0) => {}
                Ok(n) => eprintln!("ferryd: standby of {service}: removed {n} output hold(s) of a dead ferry replicate"),
                Err(e) => tracing::warn!("removing stale output holds: {e}"),
            }
            ph.mark("stale output holds removed");
        }
        // The files first: the restored descriptors open them by path.
        for note in self.dirs.install()? {
            eprintln!("ferryd: standby of {service}: {note}");
        }
        ph.mark("data directories installed");
        let mut served = ferry_migrate::destination::restore_and_run(
            image,
            hello,
            &mut self.replica.store,
            &cfg.dest,
        )?;
        let mut phases = ph.done().to_vec();
        phases.append(&mut served.phases);
        served.phases = phases;
        let takeover_ms = t.elapsed().as_secs_f64() * 1e3;
        self.store_ms.fill(&mut self.status);
        self.status.state = "took over".into();
        self.status.epoch = epoch;
        self.status.note = format!(
            "{why}; runs here as pid {} since sync {} ({takeover_ms:.1} ms from silence to running; {warm_note})",
            served.host_pid, self.replica.seq
        );
        self.status.publish();
        Ok(Outcome::TookOver { served, seq: self.replica.seq, takeover_ms, why, warm: warm_note })
    }

    /// Ok(epoch) when this side won the service, Err(owner) when another
    /// holds it; tried until the store answers.
    fn win(&mut self, service: &str, me: &str) -> Result<std::result::Result<u64, String>> {
        let mut said = false;
        loop {
            match self.fence.take_over(service, me, self.replica_hello.epoch) {
                Ok(ferry_fence::Claim::Won { epoch }) => return Ok(Ok(epoch)),
                Ok(ferry_fence::Claim::Lost { owner }) => {
                    return Ok(Err(format!("{} at epoch {}", owner.holder, owner.epoch)))
                }
                Err(e) => {
                    if !said {
                        eprintln!("ferryd: standby of {service}: the fencing store does not answer ({e}); the takeover waits for it");
                        self.status.state = "waiting for the fencing store".into();
                        self.status.publish();
                        said = true;
                    }
                    std::thread::sleep(FENCE_RETRY);
                }
            }
        }
    }
}
