//! The source side of a migration, as a pipeline of named phases:
//! connect → pre-copy rounds → freeze and capture (final pages streamed)
//! → address off → image sent → destination restores and holds → commit
//! → destination runs → source's copy killed.
//!
//! Until the destination reports the tree running, every failure puts
//! the source back as it was: the address returns, the connections leave
//! repair mode, the lock thaws, the tree runs on. The service runs in one
//! place at every moment.
//!
//! [`migrate`] composes the phases and times them; each lives in the
//! file named after it: `hello.rs` (checks, the running tree listed for
//! the destination's checks, connect, Hello/Welcome),
//! `rounds.rs` (layout and pre-copy rounds), `freeze.rs` (freeze and
//! capture into the stream), `handover.rs` (address off, image, Ready,
//! Commit, Running), `rollback.rs` (every way back before and after the
//! commit), `finish.rs` (post-copy push, the source's copy killed).

mod finish;
mod freeze;
mod handover;
pub mod hello;
mod rollback;
mod rounds;

use crate::error::{MigrateError, Result};
use crate::precopy::{Decision, Round, RoundPolicy};
use crate::protocol::{self, Msg};
use crate::Progress;
use ferry_engine::phases::Phases;
use ferry_transport::{Channel, Key, Mode};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

pub struct MigrateOptions {
    pub pid: i32,
    pub to: SocketAddr,
    pub key: Key,
    pub mode: Mode,
    /// The service address that moves with the process, with its prefix.
    pub address: Option<(IpAddr, u8)>,
    pub lazy: bool,
    pub precopy: bool,
    pub policy: RoundPolicy,
    /// For every step that waits on the destination.
    pub timeout: Duration,
    pub network_lock: ferry_netlock::Method,
    /// The root's parent stays here and may see it exit (see
    /// `ferry_engine::capture::root_parent`).
    pub parent_sees_exit: bool,
    pub progress: Progress,
}

#[derive(Debug, Clone)]
pub struct MigrationReport {
    pub pid: i32,
    /// The root's PID at the destination, as its tree sees it, and as the
    /// destination's agent sees it.
    pub dest_pid: i32,
    pub dest_host_pid: i32,
    /// From the freeze at the source to the destination's report that
    /// the tree runs.
    pub pause_ms: f64,
    pub total_ms: f64,
    /// Bytes on the wire (after encryption and framing).
    pub bytes_sent: u64,
    /// Page bytes sent during the freeze.
    pub final_page_bytes: u64,
    pub rounds: Vec<Round>,
    pub precopy_stop: Option<Decision>,
    /// The source's phases and the destination's restore phases, in ms.
    pub source_phases: Vec<(String, f64)>,
    pub dest_phases: Vec<(String, f64)>,
    /// Post-copy: what was left behind in the freeze and sent afterwards.
    pub postcopy: Option<PostcopyReport>,
}

#[derive(Debug, Clone)]
pub struct PostcopyReport {
    /// Bytes of pages the freeze left at the source.
    pub lazy_bytes: u64,
    pub push: crate::postcopy::PushReport,
}

pub fn migrate(o: &MigrateOptions) -> Result<MigrationReport> {
    let mut ph = Phases::start("source");
    hello::check_source(o)?;
    let hello::Connected { mut ch, migration_id, .. } = hello::connect(o, false)?;
    ph.mark("connect and checks");
    let precopy = rounds::precopy(o, &mut ch)?;
    if precopy.is_some() {
        ph.mark("pre-copy");
    }
    let presurveyed = freeze::presurvey(o.pid);
    ph.mark("presurvey");
    let mut frozen = freeze::freeze_and_capture(o, &mut ch, presurveyed, precopy)?;
    let summary = frozen.summary();
    ph.mark("freeze+capture");

    // Everything from here to Running is undone by the rollback if it
    // fails; once Commit is sent, the source's copy is kept stopped.
    let mut taken = None;
    let mut commit_sent = false;
    let outcome = (|| -> Result<handover::Running> {
        taken = handover::address_off(o)?;
        if taken.is_some() {
            ph.mark("address off");
        }
        handover::send_image(&mut ch, &mut frozen.captured, migration_id)?;
        ph.mark("image sent");
        (o.progress)("restoring at the destination");
        let dest_phases = handover::await_ready(&mut ch)?;
        ph.mark("destination restore");
        handover::commit(&mut ch)?;
        commit_sent = true;
        let running = handover::await_running(&mut ch, dest_phases)?;
        ph.mark("destination release");
        Ok(running)
    })();
    let pause_ms = frozen.pause_ms();
    let running = match outcome {
        Ok(running) => running,
        Err(e) if commit_sent => return Err(frozen.keep_stopped(o, taken, e)),
        Err(e) => return Err(frozen.roll_back(&mut ch, taken, e)),
    };

    if let Some(t) = taken {
        t.keep_off();
    }
    let pushed = frozen.push_lazy_pages(o, &mut ch);
    if pushed.is_some() {
        ph.mark("post-copy");
    }
    let postcopy = match pushed.transpose() {
        Ok(p) => p,
        Err(e) => return Err(frozen.lost_in_postcopy(o, e)),
    };
    frozen.kill_source()?;
    ph.mark("source killed");
    Ok(report(o, &ph, summary, running, pause_ms, ch.bytes_sent(), postcopy))
}

/// What `ferry migrate --dry-run` found: the destination's checks passed.
#[derive(Debug, Clone)]
pub struct DryRun {
    /// Process and thread IDs, and TCP/UDP sockets, the destination checked.
    pub ids: usize,
    pub sockets: usize,
    pub notes: Vec<String>,
    pub ms: f64,
}

/// The checks of a migration without the migration: the source's own
/// ones, then the destination's (the Hello). The tree is never frozen;
/// problems come back as MigrateError::Unfit.
pub fn dry_run(o: &MigrateOptions) -> Result<DryRun> {
    let t = std::time::Instant::now();
    hello::check_source(o)?;
    let c = hello::connect(o, true)?;
    c.ch.shutdown();
    Ok(DryRun {
        ids: c.checked.0,
        sockets: c.checked.1,
        notes: c.notes,
        ms: t.elapsed().as_secs_f64() * 1e3,
    })
}

/// What the freeze left to report, taken before the source's copy goes.
struct FreezeSummary {
    rounds: Vec<Round>,
    precopy_stop: Option<Decision>,
    final_page_bytes: u64,
    capture_phases: Vec<(String, f64)>,
}

fn report(
    o: &MigrateOptions,
    ph: &Phases,
    summary: FreezeSummary,
    running: handover::Running,
    pause_ms: f64,
    bytes_sent: u64,
    postcopy: Option<PostcopyReport>,
) -> MigrationReport {
    // The capture's own phases, just before the freeze they make up.
    let mut source_phases = Vec::new();
    for (name, ms) in ph.done() {
        if name == "freeze+capture" {
            source_phases.extend(
                summary.capture_phases.iter().map(|(n, ms)| (format!("capture: {n}"), *ms)),
            );
        }
        source_phases.push((name.clone(), *ms));
    }
    MigrationReport {
        pid: o.pid,
        dest_pid: running.pid,
        dest_host_pid: running.host_pid,
        pause_ms,
        total_ms: ph.started().elapsed().as_secs_f64() * 1e3,
        bytes_sent,
        final_page_bytes: summary.final_page_bytes,
        rounds: summary.rounds,
        precopy_stop: summary.precopy_stop,
        source_phases,
        dest_phases: running.dest_phases,
        postcopy,
    }
}

/// When sending failed, the destination has usually said why before it
/// closed the connection (a corrupted message, a failed restore): that
/// reason is the error to report, not our broken pipe.
fn peer_reason(ch: &mut Channel, e: MigrateError) -> MigrateError {
    if !matches!(e, MigrateError::Transport(_) | MigrateError::Engine(_) | MigrateError::Image(_)) {
        return e;
    }
    if ch.set_timeout(Some(Duration::from_secs(1))).is_err() {
        return e;
    }
    for _ in 0..8 {
        match protocol::recv(ch) {
            Ok(r) => match r.msg {
                Msg::Failed { error } => {
                    return MigrateError::DestinationFailed(format!("{error} (here: {e})"))
                }
                Msg::Refused { reason } => return MigrateError::Refused(reason),
                _ => continue,
            },
            Err(_) => break,
        }
    }
    e
}
