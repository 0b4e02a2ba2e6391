//! What replication reports: a status line on every change and at least
//! every 10 s, and the same as JSON in /run/ferry/replication/, where
//! `ferry status` reads it on either host.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

pub const STATUS_DIR: &str = "/run/ferry/replication";

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Status {
    pub service: String,
    /// "primary" or "standby".
    pub role: String,
    /// "syncing", "in sync", "unprotected", "fenced", "took over",
    /// "ended"; "lost" when read back with its writer gone.
    pub state: String,
    pub peer: String,
    pub epoch: u64,
    pub syncs: u64,
    pub syncs_per_s: f64,
    /// Freeze to release of a sync: how long held output waited for it.
    pub added_latency_p50_ms: f64,
    pub added_latency_p99_ms: f64,
    pub pause_p50_ms: f64,
    pub bytes_per_sync: f64,
    /// The standby's: SyncDone to SyncStored, the sync checked whole and
    /// applied to its copy (median and longest of the last 1000).
    #[serde(default)]
    pub store_p50_ms: f64,
    #[serde(default)]
    pub store_max_ms: f64,
    pub updated_unix_ms: u64,
    /// The last thing worth saying (an error, a takeover's figures).
    pub note: String,
    /// The process that wrote the file (0 in a file of an older ferry).
    #[serde(default)]
    pub pid: u32,
}

/// States that hold only while their writer runs: a standby worker or a
/// `ferry replicate` that was killed leaves them behind.
const LIVE_STATES: &[&str] = &["syncing", "in sync", "fenced", "waiting for the fencing store"];

impl Status {
    pub fn line(&self) -> String {
        format!(
            "{} {} {}: {} syncs ({:.1}/s), added latency p50 {:.2} ms p99 {:.2} ms, pause p50 {:.2} ms, {:.1} KiB/sync, epoch {}{}",
            self.role,
            self.service,
            self.state,
            self.syncs,
            self.syncs_per_s,
            self.added_latency_p50_ms,
            self.added_latency_p99_ms,
            self.pause_p50_ms,
            self.bytes_per_sync / 1024.0,
            self.epoch,
            if self.note.is_empty() { String::new() } else { format!(" ({})", self.note) }
        )
    }

    fn path(&self) -> PathBuf {
        PathBuf::from(STATUS_DIR).join(format!("{}.{}.json", self.service, self.role))
    }

    /// Written whole, then renamed over the last one: a reader never sees
    /// half a file.
    pub fn publish(&mut self) {
        self.updated_unix_ms = now_ms();
        self.pid = std::process::id();
        let path = self.path();
        let tmp = path.with_extension("json.tmp");
        let write = || -> std::io::Result<()> {
            std::fs::create_dir_all(STATUS_DIR)?;
            std::fs::write(&tmp, serde_json::to_vec_pretty(self).unwrap_or_default())?;
            std::fs::rename(&tmp, &path)
        };
        if let Err(e) = write() {
            tracing::warn!("writing {}: {e}", path.display());
        }
    }

    /// Whether the file was written more than a second ago: between
    /// changes of state it is rewritten at most once a second, not on
    /// every sync.
    pub fn stale(&self) -> bool {
        now_ms().saturating_sub(self.updated_unix_ms) >= 1000
    }

    /// A live state whose writer is gone is "lost": whatever it said
    /// (a standby in sync, a primary syncing) ended with that process.
    fn mark_gone_writer(mut self, writer_alive: bool) -> Status {
        if !writer_alive && LIVE_STATES.contains(&self.state.as_str()) {
            self.note = format!("was {}; its process (pid {}) is gone", self.state, self.pid);
            self.state = "lost".into();
        }
        self
    }

    /// The status file goes with the replication it describes.
    pub fn remove(&self) {
        let _ = std::fs::remove_file(self.path());
    }
}

/// Every status file on this host.
pub fn read_all() -> Vec<Status> {
    let Ok(dir) = std::fs::read_dir(STATUS_DIR) else {
        return Vec::new();
    };
    let mut out: Vec<Status> = dir
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
        .filter_map(|e| std::fs::read(e.path()).ok())
        .filter_map(|b| serde_json::from_slice(&b).ok())
        .map(|s: Status| {
            let alive = s.pid == 0 || std::path::Path::new(&format!("/proc/{}", s.pid)).exists();
            s.mark_gone_writer(alive)
        })
        .collect();
    out.sort_by(|a, b| (&a.service, &a.role).cmp(&(&b.service, &b.role)));
    out
}

pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// The last syncs' figures, for the status line.
#[derive(Debug, Default)]
pub struct Window {
    /// (when, total ms, pause ms, bytes), newest last.
    syncs: std::collections::VecDeque<(std::time::Instant, f64, f64, u64)>,
}

impl Window {
    const KEEP: usize = 1000;

    pub fn add(&mut self, total_ms: f64, pause_ms: f64, bytes: u64) {
        if self.syncs.len() == Self::KEEP {
            self.syncs.pop_front();
        }
        self.syncs.push_back((std::time::Instant::now(), total_ms, pause_ms, bytes));
    }

    /// Fills the rate, latency and size fields of `s`.
    pub fn fill(&self, s: &mut Status) {
        let n = self.syncs.len();
        if n == 0 {
            return;
        }
        let mut totals: Vec<f64> = self.syncs.iter().map(|x| x.1).collect();
        let mut pauses: Vec<f64> = self.syncs.iter().map(|x| x.2).collect();
        s.added_latency_p50_ms = percentile(&mut totals, 50.0);
        s.added_latency_p99_ms = percentile(&mut totals, 99.0);
        s.pause_p50_ms = percentile(&mut pauses, 50.0);
        s.bytes_per_sync = self.syncs.iter().map(|x| x.3 as f64).sum::<f64>() / n as f64;
        let span = self.syncs[n - 1].0.duration_since(self.syncs[0].0).as_secs_f64();
        s.syncs_per_s = if n > 1 && span > 0.0 { (n - 1) as f64 / span } else { 0.0 };
    }
}

/// The `p`th percentile (nearest rank) of `v`, 0 for none.
pub fn percentile(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_by_nearest_rank() {
        let mut v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&mut v, 50.0), 50.0);
        assert_eq!(percentile(&mut v, 99.0), 99.0);
        assert_eq!(percentile(&mut [3.0, 1.0, 2.0], 100.0), 3.0);
        assert_eq!(percentile(&mut [], 50.0), 0.0);
    }

    #[test]
    fn window_fills_the_status() {
        let mut w = Window::default();
        for i in 0..10 {
            w.add(f64::from(i), 1.0, 4096);
        }
        let mut s = Status::default();
        w.fill(&mut s);
        assert_eq!(s.added_latency_p50_ms, 4.0);
        assert_eq!(s.pause_p50_ms, 1.0);
        assert_eq!(s.bytes_per_sync, 4096.0);
        assert!(s.line().contains("10") || s.line().contains("syncs"));
    }

    #[test]
    fn a_live_state_of_a_gone_writer_is_lost() {
        let s = |state: &str| Status { state: state.into(), pid: 42, ..Default::default() };
        let gone = s("in sync").mark_gone_writer(false);
        assert_eq!(gone.state, "lost");
        assert!(gone.note.contains("was in sync") && gone.note.contains("pid 42"), "{}", gone.note);
        assert_eq!(s("in sync").mark_gone_writer(true).state, "in sync");
        // A final state outlives its writer (a standby's worker ends after
        // the takeover).
        assert_eq!(s("took over").mark_gone_writer(false).state, "took over");
        assert_eq!(s("unprotected").mark_gone_writer(false).state, "unprotected");
    }

    #[test]
    fn a_file_without_a_pid_still_reads() {
        let old = r#"{"service":"s","role":"standby","state":"in sync","peer":"p","epoch":1,
            "syncs":3,"syncs_per_s":1.0,"added_latency_p50_ms":1.0,"added_latency_p99_ms":1.0,
            "pause_p50_ms":1.0,"bytes_per_sync":1.0,"updated_unix_ms":1,"note":""}"#;
        let s: Status = serde_json::from_str(old).expect("an older status file");
        assert_eq!(s.pid, 0);
    }
}
