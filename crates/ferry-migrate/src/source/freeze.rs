//! The freeze: the tree is stopped and captured, its last pages streamed
//! to the destination as they are read ([`StreamSink`]), its metadata
//! kept here for the image.

use super::{peer_reason, FreezeSummary, MigrateOptions};
use crate::error::Result;
use crate::postcopy::LazyHooks;
use crate::precopy::Precopy;
use crate::stream_sink::StreamSink;
use ferry_engine::capture::vma_flags::Presurveyed;
use ferry_engine::capture::{CaptureHooks, CaptureOptions, Captured};
use ferry_transport::Channel;
use std::collections::HashMap;

/// The frozen tree and what goes with it until the outcome is known.
pub(super) struct Frozen {
    /// The tracker stays registered until the outcome is known: closing
    /// its userfaultfd makes the kernel walk every tracked page table
    /// (tens of ms per GiB), which must not count in the pause. It goes
    /// before the tree runs here again, or once it is killed.
    pub precopy: Option<Precopy>,
    /// Post-copy: the pages the freeze left behind.
    pub lazy: Option<LazyHooks>,
    pub captured: Captured,
    /// Page bytes sent during the freeze.
    pub final_page_bytes: u64,
}

/// Read the mappings' flags once now, while the tree runs, so that the
/// freeze can read them without walking every page table again (see
/// ferry_engine::capture::vma_flags).
pub(super) fn presurvey(pid: i32) -> HashMap<i32, Presurveyed> {
    ferry_engine::capture::vma_flags::presurvey_tree(pid)
}

pub(super) fn freeze_and_capture(
    o: &MigrateOptions,
    ch: &mut Channel,
    presurveyed: HashMap<i32, Presurveyed>,
    mut precopy: Option<Precopy>,
) -> Result<Frozen> {
    (o.progress)("freezing");
    let copts = CaptureOptions {
        network_lock: o.network_lock,
        presurveyed,
        parent_sees_exit: o.parent_sees_exit,
        ..Default::default()
    };
    let mut lazy = o.lazy.then(LazyHooks::default);
    // A refusal for a passing state (a connection closing, a client
    // between handshake and accept) comes before any page is sent: the
    // tree runs on, and the capture is tried again.
    let captured = ferry_engine::capture::retry_transient(
        || {
            let hooks = match (precopy.as_mut(), lazy.as_mut()) {
                (Some(p), _) => Some(p as &mut dyn CaptureHooks),
                (None, Some(l)) => Some(l as &mut dyn CaptureHooks),
                (None, None) => None,
            };
            capture_into_stream(o.pid, ch, &copts, hooks)
        },
        |n, e| (o.progress)(&format!("freeze attempt {n} refused, trying again: {e}")),
    );
    let (captured, final_page_bytes) = captured.map_err(|e| peer_reason(ch, e.into()))?;
    Ok(Frozen { precopy, lazy, captured, final_page_bytes })
}

/// One attempt: the capture, and the page bytes it streamed.
fn capture_into_stream(
    pid: i32,
    ch: &mut Channel,
    copts: &CaptureOptions,
    hooks: Option<&mut dyn CaptureHooks>,
) -> ferry_engine::Result<(Captured, u64)> {
    let mut sink = StreamSink::new(ch);
    match ferry_engine::capture::capture(pid, &mut sink, copts, hooks) {
        Ok(c) => Ok((c, sink.page_bytes())),
        // Pages already on their way: not a clean retry.
        Err(e) if e.is_transient() && sink.page_bytes() > 0 => {
            Err(ferry_engine::EngineError::restore(pid, e.to_string()))
        }
        Err(e) => Err(e),
    }
}

impl Frozen {
    /// From the freeze to now.
    pub(super) fn pause_ms(&self) -> f64 {
        self.captured.frozen_at().elapsed().as_secs_f64() * 1e3
    }

    pub(super) fn summary(&self) -> FreezeSummary {
        let (rounds, precopy_stop) = match self.precopy.as_ref() {
            Some(p) => (p.rounds.clone(), p.stopped_because),
            None => (Vec::new(), None),
        };
        FreezeSummary {
            rounds,
            precopy_stop,
            final_page_bytes: self.final_page_bytes,
            capture_phases: self.captured.phases.done().to_vec(),
        }
    }
}
