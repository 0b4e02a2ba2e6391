//! One sync, the unit of replication: freeze, capture what changed into
//! memory (the pages written since the last sync, the whole metadata,
//! the connections' state under the network lock), note the newest held
//! packet, thaw; then send, wait for the standby's SyncStored, and only
//! then let the output the sync covers leave.
//!
//! Every packet the tree produced before the freeze was produced by the
//! state this sync captures; a packet produced after the thaw waits for
//! the next sync. So a client never sees output whose state the standby
//! lacks, whichever host it talks to next.

use super::buffer::SyncBuffer;
use crate::error::{ReplicateError, Result};
use ferry_engine::capture::{CaptureHooks, CaptureOptions, Captured};
use ferry_migrate::precopy::Precopy;
use ferry_migrate::protocol::{self, Msg};
use ferry_transport::Channel;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Where one sync's time went, and what it carried.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct SyncReport {
    pub seq: u64,
    /// Start of the sync to the freeze: the checks made while the tree
    /// runs (the survey of its sockets, the lock's preparation).
    pub before_freeze_ms: f64,
    /// The service's pause: freeze to thaw.
    pub pause_ms: f64,
    /// Thaw to the standby's SyncStored (sending included).
    pub send_and_store_ms: f64,
    /// Freeze to the release of the output the sync covers: what a held
    /// packet waited at most because of this sync.
    pub total_ms: f64,
    pub page_bytes: u64,
    /// Bytes of the data directories' send streams (in `bytes` too),
    /// and the time `btrfs send` took to produce and ship them.
    pub data_dir_bytes: u64,
    pub data_dir_send_ms: f64,
    pub bytes: u64,
    /// Packets released by this sync.
    pub released: usize,
    /// The capture's own phases, in ms.
    pub capture_phases: Vec<(String, f64)>,
}

/// What a sync needs from the primary's state.
pub(crate) struct SyncCtx<'a> {
    pub pid: i32,
    pub parent_sees_exit: bool,
    pub precopy: &'a mut Precopy,
    pub outbox: &'a ferry_outbox::Outbox,
    /// How often the standby must hear from this primary, also while a
    /// sync's freeze runs ([`with_heartbeats`]).
    pub heartbeat: Duration,
    /// The ID the standby's copy goes by: each sync's image is
    /// incremental over it.
    pub replica_id: u64,
    pub timeout: Duration,
    /// Files the tree may write (see `files.rs`).
    pub ignore_writes: &'a [std::path::PathBuf],
    /// Snapshot in the freeze, shipped after the thaw.
    pub data_dirs: &'a mut super::data_dir::DataDirs,
    /// What the presurveys of the tree's mappings proved, kept from sync
    /// to sync ([`ferry_engine::capture::vma_flags::presurvey_new`]).
    pub presurveyed: &'a mut HashMap<i32, ferry_engine::capture::vma_flags::Presurveyed>,
    /// The tree's setsockopt and fd calls, counted from sync to sync,
    /// and the sockets the sync before checked
    /// ([`ferry_engine::capture::KeptWatch`], [`ferry_engine::capture::KeptChecks`]).
    /// And the injected answers of the sync before
    /// ([`ferry_engine::capture::KeptInjected`]).
    pub watch: &'a (
        ferry_engine::capture::KeptWatch,
        ferry_engine::capture::KeptChecks,
        ferry_engine::capture::KeptInjected,
    ),
    /// The network lock, prepared by the first sync that needs one and
    /// kept, disengaged and empty, for every later sync
    /// ([`ferry_engine::capture::KeptLock`]).
    pub lock: &'a ferry_engine::capture::KeptLock,
}

pub(crate) fn sync(c: &mut SyncCtx<'_>, ch: &mut Channel, seq: u64) -> Result<SyncReport> {
    let t_start = Instant::now();
    let every = c.heartbeat;
    let captured = with_heartbeats(ch, every, seq.saturating_sub(1), || capture_and_thaw(c, seq));
    let (buffer, mark, held, t_frozen, capture_phases) = captured??;
    let before_freeze_ms = t_frozen.saturating_duration_since(t_start).as_secs_f64() * 1e3;
    let pause_ms = t_frozen.elapsed().as_secs_f64() * 1e3;
    let t_thawed = Instant::now();
    c.precopy.now_held(held);
    let page_bytes = buffer.page_bytes();
    let t_ship = Instant::now();
    let data_dir_bytes = c.data_dirs.ship(ch)?;
    let data_dir_send_ms = t_ship.elapsed().as_secs_f64() * 1e3;
    let bytes = buffer.send(ch, seq)? + data_dir_bytes;
    await_stored(ch, seq, c.timeout)?;
    c.data_dirs.stored()?;
    let send_and_store_ms = t_thawed.elapsed().as_secs_f64() * 1e3;
    let released = c.outbox.release_through(mark)?;
    Ok(SyncReport {
        seq,
        before_freeze_ms,
        pause_ms,
        send_and_store_ms,
        total_ms: t_frozen.elapsed().as_secs_f64() * 1e3,
        page_bytes,
        data_dir_bytes,
        data_dir_send_ms,
        bytes,
        released,
        capture_phases,
    })
}

/// Runs `f` (a sync's freeze and capture, which the standby does not
/// hear about) while another thread sends the standby a heartbeat every
/// `every`: a capture that outlasts the standby's timeout (a tree with
/// many sockets, a loaded machine) would otherwise look like a dead
/// primary and make it take over a service that runs on. The channel
/// is the other thread's alone meanwhile; the standby's answers wait in
/// it for [`await_stored`], which passes over them. A primary that dies,
/// or stops (SIGSTOP, a paused VM), stops its heartbeats too.
fn with_heartbeats<T>(
    ch: &mut Channel,
    every: Duration,
    last_seq: u64,
    f: impl FnOnce() -> T,
) -> Result<T> {
    use std::sync::atomic::{AtomicBool, Ordering};
    let done = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let beats = scope.spawn(|| -> Result<()> {
            // As ferry's threads in the freeze are (FERRY_PAUSE_PRIORITY):
            // left at a normal priority under real-time capture workers on
            // every core, the heartbeats would starve and the standby
            // would take over.
            let _raised = ferry_engine::priority::Raised::new();
            let mut next = Instant::now() + every;
            while !done.load(Ordering::Acquire) {
                let now = Instant::now();
                if now < next {
                    std::thread::park_timeout(next - now);
                    continue;
                }
                protocol::send(ch, &Msg::Heartbeat { seq: last_seq })?;
                next = now + every;
            }
            Ok(())
        });
        let out = f();
        done.store(true, Ordering::Release);
        beats.thread().unpark();
        let sent = beats.join().unwrap_or_else(|_| {
            Err(ReplicateError::Protocol("the heartbeat thread panicked".into()))
        });
        sent.map(|()| out)
    })
}

/// The freeze: the capture into memory, the output mark, the image, and
/// the thaw. An error anywhere lets the tree run on (Captured dropped).
/// What the freeze leaves for the rest of the sync.
type Thawed =
    (SyncBuffer, ferry_outbox::Mark, HashMap<i32, Vec<(u64, u64)>>, Instant, Vec<(String, f64)>);

fn capture_and_thaw(c: &mut SyncCtx<'_>, seq: u64) -> Result<Thawed> {
    // As a migration's: the tree may run at the standby one day, so a
    // root that is part of its parent's job is refused the same way.
    let copts = CaptureOptions {
        network_lock: ferry_netlock::Method::Ebpf,
        presurveyed: {
            ferry_engine::capture::vma_flags::presurvey_new(c.pid, c.presurveyed);
            c.presurveyed.clone()
        },
        parent_sees_exit: c.parent_sees_exit,
        output_held: true,
        restored_elsewhere: true,
        kept_watch: Some(c.watch.0.clone()),
        kept_checks: Some(c.watch.1.clone()),
        kept_injected: Some(c.watch.2.clone()),
        kept_lock: Some(c.lock.clone()),
        ..Default::default()
    };
    let precopy = &mut *c.precopy;
    let (mut captured, mut buffer) = ferry_engine::capture::retry_transient(
        || {
            let mut buffer = SyncBuffer::default();
            let hooks = Some(&mut *precopy as &mut dyn CaptureHooks);
            let captured = ferry_engine::capture::capture(c.pid, &mut buffer, &copts, hooks)?;
            crate::fault::refuse_capture(c.pid)?;
            Ok((captured, buffer))
        },
        |n, e| tracing::info!("sync freeze attempt {n} refused, trying again: {e}"),
    )?;
    let written =
        super::files::written_files(&captured.tree, c.ignore_writes, &c.data_dirs.paths());
    if !written.is_empty() {
        return Err(ReplicateError::Unreplicable(written));
    }
    // Frozen: every packet queued so far came from the state just read.
    let mark = c.outbox.mark()?;
    // Frozen too: the snapshots hold exactly what the memory just read
    // has written.
    let t_snap = std::time::Instant::now();
    c.data_dirs.snapshot(seq)?;
    let snap_ms = t_snap.elapsed().as_secs_f64() * 1e3;
    buffer.set_host_pids(captured.pids().into_iter().map(|p| p.0).collect());
    captured.write_image(&mut buffer, Some(c.replica_id))?;
    let held = pages_held_after(&captured);
    let t_frozen = captured.frozen_at();
    let mut phases = captured.phases.done().to_vec();
    if !c.data_dirs.is_empty() {
        phases.push(("data-dir snapshots".into(), snap_ms));
    }
    let t_thaw = Instant::now();
    captured.resume()?;
    // The connections out of repair, the lock's held packets sent again,
    // every thread let go: the last part of the pause.
    phases.push(("thaw".into(), t_thaw.elapsed().as_secs_f64() * 1e3));
    Ok((buffer, mark, held, t_frozen, phases))
}

/// Every page the standby holds once it stores this sync, by the PIDs
/// ferry sees: the pages it held unchanged and those the freeze sent.
fn pages_held_after(captured: &Captured) -> HashMap<i32, Vec<(u64, u64)>> {
    const PAGE: u64 = 4096;
    let host = captured.pids();
    let mut out: HashMap<i32, Vec<(u64, u64)>> = HashMap::new();
    for (p, h) in captured.tree.processes.iter().zip(host) {
        let ranges = out.entry(h.0).or_default();
        ranges.extend(p.page_runs.iter().map(|r| (r.start, r.start + r.pages * PAGE)));
        if let Some((_, spans)) = captured.parent_pages.iter().find(|(pid, _)| *pid == p.pid) {
            ranges.extend(spans.iter().map(|s| (s.start, s.end())));
        }
    }
    out
}

/// The standby's SyncStored for `seq`; its heartbeats may come first.
pub(crate) fn await_stored(ch: &mut Channel, seq: u64, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ReplicateError::StandbyLost(format!(
                "no SyncStored for sync {seq} within {} ms",
                timeout.as_millis()
            )));
        }
        ch.set_timeout(Some(left)).map_err(ferry_migrate::MigrateError::from)?;
        let r = protocol::expect(ch, &["SyncStored", "Heartbeat"]).map_err(|e| {
            ReplicateError::StandbyLost(format!("waiting for sync {seq} to be stored: {e}"))
        })?;
        match r.msg {
            Msg::SyncStored { seq: s } if s == seq => return Ok(()),
            Msg::SyncStored { seq: s } => {
                return Err(ReplicateError::Protocol(format!(
                    "the standby stored sync {s} while sync {seq} was awaited"
                )))
            }
            _ => continue,
        }
    }
}
