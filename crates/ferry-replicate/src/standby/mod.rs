//! The standby's side of replication, served by ferryd for a primary's
//! `ferry replicate`: welcome → pre-copy rounds → syncs, each applied
//! whole or not at all (`replica.rs`) and acknowledged with SyncStored →
//! until the primary says Unprotect (the copy is dropped) or falls
//! silent (`takeover.rs`: the service is won in the fencing store, then
//! restored from the last complete sync and run here). Meanwhile
//! `warm.rs` readies what the takeover would otherwise start with.

mod data_dir;
mod replica;
mod takeover;
mod warm;

use crate::error::{ReplicateError, Result};
use crate::status::Status;
use ferry_migrate::destination::{DestinationConfig, Served};
use ferry_migrate::protocol::{self, Hello, Msg, ReplicaHello};
use ferry_transport::{Channel, TransportError};
use replica::Replica;
use std::time::Duration;

pub struct StandbyConfig {
    pub dest: DestinationConfig,
    pub etcd: Vec<String>,
    /// For each call to the fencing store.
    pub fence_timeout: Duration,
}

/// How a standby's service ended.
#[derive(Debug)]
pub enum Outcome {
    /// The primary ended protection: the copy is dropped.
    Dropped,
    /// The primary fell silent before the first sync was complete: there
    /// was nothing to take over with.
    NothingToRun(String),
    /// The primary fell silent and another agent holds the service.
    Lost(String),
    /// The service runs here now.
    TookOver {
        served: Served,
        seq: u64,
        takeover_ms: f64,
        why: String,
        /// What the standby had readied before the silence (`warm.rs`).
        warm: String,
    },
}

/// Serves one primary on `ch`, whose Hello [`ferry_migrate::destination::greet`]
/// accepted and asked for a standby.
pub fn serve(
    mut ch: Channel,
    hello: Hello,
    notes: Vec<String>,
    cfg: &StandbyConfig,
) -> Result<Outcome> {
    let Some(replica_hello) = hello.replica.clone() else {
        return Err(ReplicateError::Invalid("the Hello asks for no standby".into()));
    };
    let r = (|| {
        // Without the fencing store this side could never take over:
        // refused now, while the primary can still go on unprotected.
        let fence = ferry_fence::Fence::connect(&cfg.etcd, cfg.fence_timeout)?;
        let warm = warm::start(cfg.dest.network_lock);
        ferry_migrate::destination::welcome(&mut ch, &cfg.dest, notes)?;
        let s = Standby::new(&replica_hello, fence, warm)?;
        s.receive(&mut ch, cfg)
    })();
    match r {
        Err(e) => {
            // The copy is gone with this worker: no status may say "in sync".
            Status {
                service: replica_hello.service.clone(),
                role: "standby".into(),
                ..Default::default()
            }
            .remove();
            let _ = protocol::send(&mut ch, &Msg::Failed { error: e.to_string() });
            ch.close_after_report(Duration::from_secs(1));
            Err(e)
        }
        Ok(Silence::Unprotect) => Ok(Outcome::Dropped),
        Ok(Silence::Lost { mut standby, why }) => {
            ch.shutdown();
            standby.take_over(&hello, cfg, why)
        }
    }
}

/// Why the receiving ended.
enum Silence<'a> {
    Unprotect,
    /// The primary fell silent: what was heard last, and the copy.
    Lost {
        standby: Box<Standby<'a>>,
        why: String,
    },
}

pub(crate) struct Standby<'a> {
    replica_hello: &'a ReplicaHello,
    replica: Replica,
    /// `--data-dir` copies (none without it).
    dirs: data_dir::Copies,
    fence: ferry_fence::Fence,
    status: Status,
    warm: warm::Warm,
    store_ms: StoreTimes,
}

/// How long the last syncs took to check and apply here, for the status.
#[derive(Default)]
struct StoreTimes(std::collections::VecDeque<f64>);

impl StoreTimes {
    const KEEP: usize = 1000;

    fn add(&mut self, ms: f64) {
        if self.0.len() == Self::KEEP {
            self.0.pop_front();
        }
        self.0.push_back(ms);
    }

    fn fill(&self, s: &mut Status) {
        let mut v: Vec<f64> = self.0.iter().copied().collect();
        s.store_p50_ms = crate::status::percentile(&mut v, 50.0);
        s.store_max_ms = v.last().copied().unwrap_or(0.0);
    }
}

impl<'a> Standby<'a> {
    fn new(
        replica_hello: &'a ReplicaHello,
        fence: ferry_fence::Fence,
        warm: warm::Warm,
    ) -> Result<Self> {
        let status = Status {
            service: replica_hello.service.clone(),
            role: "standby".into(),
            state: "syncing".into(),
            peer: replica_hello.holder.clone(),
            epoch: replica_hello.epoch,
            ..Default::default()
        };
        let dirs = data_dir::Copies::default();
        Ok(Standby {
            replica_hello,
            replica: Replica::new()?,
            dirs,
            fence,
            status,
            warm,
            store_ms: StoreTimes::default(),
        })
    }

    /// Messages until the primary ends protection or falls silent. The
    /// first sync may take as long as a migration's rounds; after it,
    /// silence longer than the heartbeat timeout is the primary's loss.
    fn receive(mut self, ch: &mut Channel, cfg: &StandbyConfig) -> Result<Silence<'a>> {
        let heartbeat = Duration::from_millis(self.replica_hello.heartbeat_timeout_ms.max(1));
        ch.set_timeout(Some(cfg.dest.timeout)).map_err(ferry_migrate::MigrateError::from)?;
        loop {
            let r = match protocol::recv(ch) {
                Ok(r) => r,
                Err(e) => return self.silence(e),
            };
            match r.msg {
                Msg::Pages { pid, ref ranges } => {
                    self.replica.stage_pages(pid, ranges.clone(), r.data())?
                }
                Msg::Layout { .. } => {}
                Msg::RoundDone { round, .. } => {
                    self.replica.store_round()?;
                    protocol::send(ch, &Msg::RoundStored { round })?;
                }
                Msg::Image { meta, host_pids } => self.replica.stage_image(meta, host_pids),
                Msg::DataDirs { dirs } => self.dirs.configure(dirs, self.replica.seq)?,
                Msg::DirStream { dir } => self.dirs.stream(dir, r.data())?,
                Msg::SyncDone { seq } => {
                    let t = std::time::Instant::now();
                    // Files and memory of one sync become the copy together.
                    self.dirs.finish(seq)?;
                    self.replica.commit(seq)?;
                    self.dirs.commit();
                    protocol::send(ch, &Msg::SyncStored { seq })?;
                    self.store_ms.add(t.elapsed().as_secs_f64() * 1e3);
                    self.status.syncs = seq;
                    self.status.bytes_per_sync = self.replica.last_sync_bytes as f64;
                    if seq == 1 {
                        ch.set_timeout(Some(heartbeat))
                            .map_err(ferry_migrate::MigrateError::from)?;
                        self.status.state = "in sync".into();
                        self.status.publish();
                    } else if self.status.stale() {
                        self.store_ms.fill(&mut self.status);
                        self.status.publish();
                    }
                }
                Msg::Heartbeat { .. } => {
                    protocol::send(ch, &Msg::Heartbeat { seq: self.replica.seq })?;
                }
                Msg::Unprotect => {
                    self.status.state = "dropped".into();
                    self.status.remove();
                    return Ok(Silence::Unprotect);
                }
                m => {
                    return Err(ReplicateError::Protocol(format!(
                        "unexpected {} from the primary",
                        m.name()
                    )))
                }
            }
        }
    }

    /// A receive failed: silence (a timeout, a closed or reset link) is
    /// the primary's loss; anything else (a corrupt stream, a message
    /// that does not decode) is an error, and the copy is dropped.
    fn silence(mut self, e: ferry_migrate::MigrateError) -> Result<Silence<'a>> {
        let silent = matches!(
            &e,
            ferry_migrate::MigrateError::Transport(
                TransportError::Timeout { .. } | TransportError::Closed | TransportError::Io { .. }
            )
        );
        if !silent {
            return Err(e.into());
        }
        self.replica.discard_staged();
        self.dirs.discard();
        let why = format!("the primary fell silent after sync {}: {e}", self.replica.seq);
        Ok(Silence::Lost { standby: Box::new(self), why })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_times_fill_median_and_longest() {
        let mut t = StoreTimes::default();
        let mut s = Status::default();
        t.fill(&mut s);
        assert_eq!((s.store_p50_ms, s.store_max_ms), (0.0, 0.0));
        for ms in [3.0, 1.0, 9.0, 2.0] {
            t.add(ms);
        }
        t.fill(&mut s);
        assert_eq!((s.store_p50_ms, s.store_max_ms), (2.0, 9.0));
        for _ in 0..StoreTimes::KEEP {
            t.add(0.5);
        }
        t.fill(&mut s);
        assert_eq!(s.store_max_ms, 0.5, "only the last {} count", StoreTimes::KEEP);
    }
}
