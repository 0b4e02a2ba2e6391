//! The ways replication ends at the primary. Whatever the way, the
//! service's held output leaves only once this side holds the service
//! at a newer epoch in the fencing store: from then on a standby's
//! takeover, which compares the epoch it was given, cannot succeed.

use super::{Ended, Primary};
use crate::error::{ReplicateError, Result};
use ferry_migrate::protocol::{self, Msg};
use std::time::Duration;

/// How often the fencing store is tried again while it cannot be reached.
const FENCE_RETRY: Duration = Duration::from_millis(500);

/// What the fencing store said when this side asked for the service.
enum Outcome {
    Won(u64),
    Lost(String),
}

impl Primary<'_> {
    /// Stopped on purpose, or `because` the tree holds state a sync
    /// cannot carry: the service is claimed at a newer epoch, the standby
    /// is told to drop its copy, and the output flows again.
    pub(super) fn stop(&mut self, because: Option<String>) -> Result<Ended> {
        (self.o.progress)(&match &because {
            Some(why) => format!("ending protection: {why}"),
            None => "ending protection".to_string(),
        });
        match self.win_service()? {
            Outcome::Won(epoch) => self.epoch = epoch,
            Outcome::Lost(owner) => return Err(self.fenced_out(owner)),
        }
        let _ = protocol::send(&mut self.ch, &Msg::Unprotect);
        let released = self.open_output()?;
        self.status.state = "ended".into();
        self.status.note = format!("{released} held packets released; unprotected");
        self.publish(true);
        self.status.remove();
        Ok(match because {
            Some(why) => Ended::Unprotected { syncs: self.seq, why },
            None => Ended::Stopped { syncs: self.seq },
        })
    }

    /// The standby stopped answering (or failed): the output stays held
    /// until the fencing store says who runs the service.
    pub(super) fn standby_lost(&mut self, e: ReplicateError) -> Result<Ended> {
        let why = e.to_string();
        (self.o.progress)(&format!("{why}; output held until the service is won"));
        self.status.state = "fenced".into();
        self.status.note = why.clone();
        self.publish(true);
        match self.win_service()? {
            Outcome::Won(epoch) => {
                self.epoch = epoch;
                self.ch.shutdown();
                let released = self.open_output()?;
                self.status.state = "unprotected".into();
                self.status.epoch = epoch;
                self.status.note = format!("{why}; {released} held packets released");
                self.publish(true);
                Ok(Ended::Unprotected { syncs: self.seq, why })
            }
            Outcome::Lost(owner) => Err(self.fenced_out(owner)),
        }
    }

    /// A compare-and-swap from the epoch this side holds to the next,
    /// tried until the store answers: without an answer, nobody may let
    /// the output go.
    fn win_service(&mut self) -> Result<Outcome> {
        let mut said = false;
        loop {
            match self.fence.take_over(&self.service, &self.holder, self.epoch) {
                Ok(ferry_fence::Claim::Won { epoch }) => return Ok(Outcome::Won(epoch)),
                Ok(ferry_fence::Claim::Lost { owner }) => {
                    return Ok(Outcome::Lost(format!("{} at epoch {}", owner.holder, owner.epoch)))
                }
                Err(e) => {
                    if !said {
                        (self.o.progress)(&format!(
                            "the fencing store does not answer ({e}): the output stays held, trying again"
                        ));
                        self.status.note = format!("waiting for the fencing store: {e}");
                        self.publish(false);
                        said = true;
                    }
                    std::thread::sleep(FENCE_RETRY);
                }
            }
        }
    }

    /// Every held packet released; the hold itself goes when the
    /// primary is dropped, right after (a packet queued in between is
    /// dropped there, and TCP sends it again).
    fn open_output(&mut self) -> Result<usize> {
        let mark = self.outbox.mark()?;
        Ok(self.outbox.release_through(mark)?)
    }

    /// The standby runs the service now: this copy, whose output never
    /// left, is killed.
    fn fenced_out(&mut self, owner: String) -> ReplicateError {
        self.ch.shutdown();
        kill_tree(self.o.pid);
        // The address is the standby's now: answering for it here would
        // split the clients between two hosts.
        let (addr, prefix) = self.o.address;
        match ferry_migrate::address::take(addr, prefix) {
            Ok(t) => t.keep_off(),
            Err(e) => tracing::warn!("taking {addr} off this host: {e}"),
        }
        self.status.state = "fenced".into();
        self.status.note = format!("the service is held by {owner}; this copy was killed");
        self.publish(true);
        self.status.remove();
        ReplicateError::Fenced(format!(
            "the service {} is held by {owner}: it runs there now; this copy (pid {}) was killed, none of its unsynced output left this host",
            self.service, self.o.pid
        ))
    }
}

/// Kills `root` and every descendant. No SIGSTOP first: a parent that
/// passes its child's stops on to itself (nsenter, unshare, a shell) would
/// stop for good when the child it waits for is stopped, then killed.
/// A process with SIGKILL pending can no longer complete a fork; one
/// forked between the listing and its parent's kill is missed, as it was
/// with the stop first.
fn kill_tree(root: i32) {
    for p in tree_pids(root) {
        let _ = ferry_sys::process::kill(p, libc::SIGKILL);
    }
}

/// `root` and its descendants, from /proc's children lists.
fn tree_pids(root: i32) -> Vec<i32> {
    let mut out = vec![root];
    let mut i = 0;
    while i < out.len() {
        let pid = out[i];
        if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
            for t in tasks.flatten() {
                let path = t.path().join("children");
                let text = std::fs::read_to_string(path).unwrap_or_default();
                out.extend(text.split_whitespace().filter_map(|c| c.parse::<i32>().ok()));
            }
        }
        i += 1;
    }
    out.sort_unstable();
    out.dedup();
    out
}
