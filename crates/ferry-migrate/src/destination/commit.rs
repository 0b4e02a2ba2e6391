//! Commit at the destination: the source's go, the held tree released,
//! the address announced, Running reported; then, post-copy, the pager
//! until every page is here.

use super::image::LazyPages;
use crate::address;
use crate::error::{MigrateError, Result};
use crate::protocol::{self, Msg};
use ferry_engine::restore::HeldTree;
use ferry_engine::restore::Restored;
use ferry_transport::Channel;
use std::os::fd::OwnedFd;
use std::time::Instant;

/// Anything but Commit, the source gone included, ends the migration
/// here: the service stays at the source.
pub(super) fn await_commit(ch: &mut Channel) -> Result<()> {
    match protocol::recv(ch).map(|r| r.msg) {
        Ok(Msg::Commit) => Ok(()),
        Ok(m) => {
            Err(MigrateError::Aborted(format!("the source sent {} instead of Commit", m.name())))
        }
        Err(e) => Err(MigrateError::Aborted(format!("no commit from the source: {e}"))),
    }
}

/// What the release leaves to do once the tree runs.
pub(super) struct Released {
    pub phases: Vec<(String, f64)>,
    /// Best closed once the pause is over (see address::Placed).
    pub announce_socket: Option<OwnedFd>,
    /// Whether Running reached the source.
    pub reported: Result<()>,
}

/// Announced and reported as soon as the tree runs: taking this host's
/// lock down after that takes tens of ms, outside the pause.
pub(super) fn release(
    ch: &mut Channel,
    held: HeldTree,
    placed: Option<address::Placed>,
) -> Result<(Restored, Released)> {
    release_reporting(held, placed, |restored, phases| {
        protocol::send(
            ch,
            &Msg::Running {
                pid: restored.pid.0,
                host_pid: restored.host_pid.0,
                phases: phases.to_vec(),
            },
        )
    })
}

/// The release, with `report` told as soon as the tree runs (the source,
/// or for a standby's takeover, nobody).
pub(super) fn release_reporting(
    held: HeldTree,
    placed: Option<address::Placed>,
    report: impl FnOnce(&Restored, &[(String, f64)]) -> Result<()>,
) -> Result<(Restored, Released)> {
    let t_release = Instant::now();
    let mut release_phases = Vec::new();
    let mut announce_socket = None;
    let mut reported = Ok(());
    let restored = held.release_then(|restored| {
        release_phases.push(("release".to_string(), t_release.elapsed().as_secs_f64() * 1e3));
        if let Some(p) = placed {
            let t = Instant::now();
            match p.announce_and_keep() {
                Ok(sock) => announce_socket = sock,
                Err(e) => tracing::warn!("{e}"),
            }
            release_phases.push(("announce".to_string(), t.elapsed().as_secs_f64() * 1e3));
        }
        reported = report(restored, &release_phases);
    })?;
    Ok((restored, Released { phases: release_phases, announce_socket, reported }))
}

/// Post-copy: pages served until every one is here; its phase.
pub(super) fn serve_lazy_pages(
    ch: &mut Channel,
    uffds: Vec<(i32, OwnedFd)>,
    lazy: &LazyPages,
    restored: &Restored,
) -> Result<(String, f64)> {
    let r = crate::pager::run(ch, uffds, lazy, restored.init_pid.map(|p| p.0), restored.pid.0)?;
    eprintln!(
        "ferryd: post-copy of pid {}: {:.1} MiB in {:.0} ms, {} faults, {} page requests, {} zero pages",
        restored.pid,
        r.bytes as f64 / 1048576.0,
        r.ms,
        r.faults,
        r.requests,
        r.zero_pages
    );
    Ok(("post-copy".to_string(), r.ms))
}
