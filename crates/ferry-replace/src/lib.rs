//! In-place replacement (`ferry replace`): a running process tree is
//! swapped for a fresh tree that carries its complete state (a new mm,
//! new kernel objects, the same PIDs), optionally in a new confinement.
//!
//! A composition of the engine's phases over one in-memory image:
//!
//! ```text
//! options checked      options.rs   before the freeze: a bad option refuses by name
//! reaper checked       reaper.rs    the old root's parent reaps (its PIDs come free)
//! pre-copy             precopy/     the root's memory copied into placed memory of
//!                                   ferry's own while the tree runs, in rounds
//! early trial          early_trial.rs  a first short freeze captures the tree, which
//!                                   runs on while that image, edited, is restored in
//!                                   scratch namespaces and checked (the trial), then
//!                                   ended (with pre-copy only; not with --single-freeze,
//!                                   nor for repaired TCP connections)
//! capture              engine       the tree frozen, captured into a MemoryImage
//! edit                 edits.rs     the options applied to the image; checks.rs
//! trial                early_trial.rs / engine  the final image compared with the
//!                                   tried one, masking only values a restore sets
//!                                   whatever they are; if it changed (or no early
//!                                   trial), the image restored in scratch namespaces
//!                                   (the network one made before the freeze) and
//!                                   checked while the old tree is still frozen
//! kill                 engine       the one step that cannot be undone (a trial
//!                                   copy ends meanwhile)
//! restore              engine       once the old root is reaped and the trial copy
//!                                   gone: the edited image restored in place, same
//!                                   PIDs, the restore's own check against the image
//! release              engine       the new tree runs
//! ```
//!
//! Until the kill, every failure drops the capture, which lets the old
//! tree run on untouched. The kill comes only after a restore of an image
//! of the very same shape passed (the same image, or one that differs only
//! in values the restore sets whatever they are), so the restore after it
//! meets nothing the trial did not. The old tree's sockets, pipes, eventfds... are carried over as the
//! same kernel objects (the capture's `carry_files`, the restore's
//! `Handover::carried`) unless `rebuild_files` asks for new ones, and the
//! root's memory is pre-copied into placed memory the new root inherits
//! (precopy/). A new binary (`--exec`) is a composition of its own (exec/).

mod cgroup;
mod checks;
mod early_trial;
pub mod edits;
mod error;
mod exec;
mod options;
pub mod precopy;
mod reaper;
mod report;

pub use error::ReplaceError;
pub use exec::{replace_exec, ExecOptions, ExecReplaced};
pub use options::ReplaceOptions;
pub use report::Replaced;

use ferry_engine::capture::{self, CaptureOptions, Captured, LockAfterKill};
use ferry_engine::held_memory::HeldMemory;
use ferry_engine::phases::Phases;
use ferry_engine::restore::{
    self,
    trial::{EndingTrial, TrialRun},
    Handover, HeldTree, Placement, RestoreOptions,
};
use ferry_engine::EngineError;
use ferry_image::{ImageSource, MemoryImage};
use std::os::fd::AsRawFd;
use std::time::Instant;

/// Replaces the tree rooted at `pid` with a fresh copy of itself, edited
/// by `opts`. On an error other than [`ReplaceError::AfterKill`] the old
/// tree runs on untouched.
pub fn replace(pid: i32, opts: &ReplaceOptions) -> Result<Replaced, ReplaceError> {
    let edits = opts.prepare()?;
    reaper::check(pid)?;
    // The trial's network namespace, made while the tree runs; dropped
    // (and torn down by the kernel) after the new tree runs.
    let sandbox = restore::trial::Sandbox::prepare().map_err(|e| {
        ReplaceError::Refused(format!("no network namespace for the trial restore: {e}"))
    })?;
    let mut pre_ph = Phases::start("pre-copy");
    // Pages are charged to the cgroup of the process that first writes
    // them: ferry's for the placed ones, which the new root would keep
    // outside the cgroup it is put in. With --cgroup every page is
    // copied in the pause, by the new root itself.
    let mut pre = match opts.precopy && edits.cgroup.is_none() {
        true => Some(precopy::Precopy::run(pid, &precopy::RoundRule::default(), &mut pre_ph)?),
        false => None,
    };
    // The captures' guards, forked with the regions, would copy their
    // page tables, and the last one's exit (waited for in the kill) tear
    // them down; the early trial's helper would copy them too.
    if let Some(p) = pre.as_ref() {
        p.inherit(false)?;
    }
    let mut phases = prefixed("pre-copy", pre_ph.done());
    // Without pre-copy a capture copies every page: a first one would
    // cost as much as the trial it takes out of the pause.
    let early = match opts.single_freeze || pre.is_none() {
        true => None,
        false => early_trial::run(pid, opts, &edits, pre.as_mut(), &sandbox)?,
    };
    let first_pause = early.as_ref().map(|e| e.first_pause_ms);
    phases.extend(early.as_ref().map_or(Vec::new(), |e| e.phases.clone()));
    let (mut captured, mut image) = capture_into_memory(pid, opts, pre.as_mut())?;
    // Kept open until the new tree runs: through the kill they hold the
    // old tree's sockets, pipes... alive for the new one.
    let carried = captured.take_carried();
    let files =
        report::files_moved(carried.len(), captured.socket_fds().len(), captured.network_locked());
    let handover = Handover {
        carried: carried.iter().map(|(id, fd)| (*id, fd.as_raw_fd())).collect(),
        ..Default::default()
    };
    let mut ph = Phases::start_at("replace", captured.frozen_at());
    phases.extend(prefixed("capture", captured.phases.done()));
    ph.mark("capture");
    let netns = ph.step("edit", || -> Result<_, ReplaceError> {
        let netns = checks::replaceable(&captured.tree)?;
        edits.apply(&mut captured.tree).map_err(ReplaceError::Refused)?;
        captured.write_image(&mut image, None)?;
        if let Some(p) = pre.as_mut() {
            p.settle(&captured.parent_pages);
        }
        Ok(netns)
    })?;
    let pause_pages = captured.inventory.pages_bytes;
    let tried = ph.step("trial", || {
        let last = FinalImage { captured: &mut captured, image: &mut image, handover: &handover };
        last.tried(early, pre.as_ref(), &sandbox)
    })?;
    phases.extend(tried.phases.iter().cloned());
    let (_, freeze_ms, _) = report::split_capture(captured.phases.done());
    let held_memory = ph.step("kill", || kill(captured)).map_err(ReplaceError::AfterKill)?;
    let opts = RestoreOptions { netns: netns.path(), ..Default::default() };
    let new = NewTree { image: &mut image, opts: &opts, handover: &handover, pre: pre.as_ref() };
    let held = ph.step("restore", || new.restore(tried.ending));
    let (held, waited) = held.map_err(ReplaceError::AfterKill)?;
    phases.extend(prefixed("restore", &waited));
    phases.extend(prefixed("restore", &held.phases()));
    let restored = held.release_then(|_| ph.mark("release")).map_err(ReplaceError::AfterKill)?;
    let old_memory = report::OldMemory::free(held_memory);
    let parts = report::pause_parts(ph.done(), freeze_ms);
    let pause_ms = parts.iter().map(|p| p.1).sum();
    phases.extend(prefixed("replace", ph.done()));
    Ok(Replaced {
        pid,
        processes: restored.processes,
        threads: restored.threads,
        pause_ms,
        parts,
        phases,
        edits: describe(&edits),
        files,
        precopy: pre.map(|p| report::PrecopyLine { summary: p.summary(), pause_pages }),
        old_memory,
        trial: report::TrialLine { first_pause, changed: tried.changed },
    })
}

/// The final capture, its image and the files carried with it.
struct FinalImage<'a> {
    captured: &'a mut Captured,
    image: &'a mut MemoryImage,
    handover: &'a Handover,
}

/// The trial that guards the kill, and the copy it left ending.
struct Tried {
    /// None when the copy ended before the freeze.
    ending: Option<EndingTrial>,
    phases: Vec<(String, f64)>,
    /// The early trial did not stand for the final image: why.
    changed: Option<String>,
}

impl FinalImage<'_> {
    /// The early trial when the final image has its shape; otherwise
    /// (changed, or none made) a trial of the final image here, in the
    /// pause, once the early copy has ended.
    fn tried(
        self,
        early: Option<early_trial::EarlyTrial>,
        pre: Option<&precopy::Precopy>,
        sandbox: &restore::trial::Sandbox,
    ) -> Result<Tried, ReplaceError> {
        let changed = match early.map(|e| e.compare(&mut self.captured.tree)) {
            Some(early_trial::Compared::Same) => {
                if let Some(p) = pre {
                    p.inherit(true)?;
                }
                return Ok(Tried { ending: None, phases: Vec::new(), changed: None });
            }
            Some(early_trial::Compared::Changed(what)) => Some(what),
            None => None,
        };
        let sockets = self.captured.socket_fds();
        let carried = &self.handover.carried;
        let copy = match pre {
            Some(p) => p.without_regions(|| trial(&sockets, self.image, carried, sandbox)),
            None => trial(&sockets, self.image, carried, sandbox),
        }?;
        let phases = prefixed("trial", copy.phases());
        // The copy passed: its helper ends it while the old tree is
        // killed; the restore waits for that end before it makes anything.
        Ok(Tried { ending: Some(copy.end()), phases, changed })
    }
}

/// The capture into a fresh in-memory image, tried again while the tree
/// is refused for a passing state.
fn capture_into_memory(
    pid: i32,
    asked: &ReplaceOptions,
    mut pre: Option<&mut precopy::Precopy>,
) -> Result<(Captured, MemoryImage), ReplaceError> {
    // The mappings' flags read once while the tree runs, so that the
    // freeze does not walk every page table again (as a migration does).
    let opts = CaptureOptions {
        parent_sees_exit: asked.parent_sees_exit,
        carry_files: !asked.rebuild_files,
        presurveyed: capture::vma_flags::presurvey_tree(pid),
        ..CaptureOptions::default()
    };
    let out = capture::retry_transient(
        || {
            let mut image = MemoryImage::new();
            let hooks = pre.as_deref_mut().map(|p| p as &mut dyn capture::CaptureHooks);
            Ok((capture::capture(pid, &mut image, &opts, hooks)?, image))
        },
        |n, e| tracing::info!("replace: capture attempt {n} refused, trying again: {e}"),
    )?;
    Ok(out)
}

/// The edited image restored in scratch namespaces and checked; the copy
/// is handed back held, never run, for the caller to end. A tree that
/// cannot be tried is refused: the kill would be unguarded.
fn trial(
    socket_fds: &[std::os::fd::RawFd],
    image: &mut MemoryImage,
    carried: &std::collections::HashMap<u64, std::os::fd::RawFd>,
    sandbox: &restore::trial::Sandbox,
) -> Result<restore::trial::TrialCopy, ReplaceError> {
    let outcome = restore::trial::trial_carrying(image, socket_fds, carried, Some(sandbox));
    let outcome = outcome.map_err(|e| {
        let error = match e {
            ferry_engine::EngineError::InNewPidNs(inner) => inner,
            other => other.to_string(),
        };
        ReplaceError::Refused(format!("the trial restore of the new tree failed: {error}"))
    })?;
    match outcome {
        TrialRun::Passed(copy) => Ok(copy),
        TrialRun::Skipped(why) => Err(ReplaceError::Refused(format!(
            "no trial restore is possible for {why}; without one the replacement would be unguarded"
        ))),
    }
}

/// Ends the old tree. Its carried files live on in ferry's duplicates;
/// rebuilt connections stay in repair mode and behind the network lock,
/// which the restore takes over from the image; the lock waits for this
/// ferry (stale once it is gone).
/// Large address spaces are held past the kill (`HeldMemory`): their
/// teardown comes after the new tree runs, not before its PIDs are free.
fn kill(captured: Captured) -> Result<HeldMemory, EngineError> {
    let waits_for = std::path::PathBuf::from(format!("/proc/{}/stat", std::process::id()));
    let hold_from = ferry_engine::held_memory::HOLD_FROM_BYTES;
    captured.kill_holding(LockAfterKill::HandOverTo(waits_for), hold_from).map(|(_, held)| held)
}

/// What the restore after the kill restores, and how.
struct NewTree<'a> {
    image: &'a mut MemoryImage,
    opts: &'a RestoreOptions,
    handover: &'a Handover,
    pre: Option<&'a precopy::Precopy>,
}

impl NewTree<'_> {
    /// The edited image restored under the old PIDs and checked, held
    /// stopped (`checks::replaceable` made sure the PIDs are ferry's
    /// namespace's: the placement is here). Before it makes anything it
    /// waits for the old root to be reaped and for the trial copy's end,
    /// so that it meets the host as the trial left it: the copy's
    /// processes gone from every cgroup and limit they counted in, its
    /// references to the carried files dropped. Also returns those waits.
    fn restore(
        self,
        ending: Option<EndingTrial>,
    ) -> Result<(HeldTree, Vec<(String, f64)>), EngineError> {
        let t0 = Instant::now();
        let mut loaded = self.image.load(ferry_engine::worker_threads())?;
        // The root is forked from ferry and inherits the pre-copied memory;
        // ferry's own copy goes with `pre`, after the release.
        if let Some(p) = self.pre {
            p.complete(&mut loaded.tree);
        }
        let t = Instant::now();
        restore::wait_zombies_reaped(&loaded.tree);
        let reaped = t.elapsed().as_secs_f64() * 1e3;
        let ended = ending.map_or(0.0, |e| e.wait(restore::trial::END_PATIENCE));
        let waited = vec![
            ("old root reaped (waited)".to_string(), reaped),
            ("trial copy ended (waited)".to_string(), ended),
        ];
        let pages = loaded.pages.bytes();
        let held =
            Placement::Here.restore_held(loaded.tree, pages, self.opts, self.handover, t0)?;
        Ok((held, waited))
    }
}

fn prefixed(step: &str, done: &[(String, f64)]) -> Vec<(String, f64)> {
    done.iter().map(|(name, ms)| (format!("{step}: {name}"), *ms)).collect()
}

/// One item per edit, for the report line.
fn describe(e: &edits::Edits) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(path) = &e.cgroup {
        out.push(format!("cgroup {path}"));
    }
    for r in &e.rlimits {
        let shown = |v: u64| if v == u64::MAX { "unlimited".to_string() } else { v.to_string() };
        out.push(format!(
            "rlimit {}={}:{}",
            edits::rlimit_name(r.resource),
            shown(r.soft),
            shown(r.hard)
        ));
    }
    if e.drop_caps != 0 {
        out.push(format!("capabilities dropped (mask {:#x})", e.drop_caps));
    }
    if let Some(f) = &e.seccomp {
        out.push(format!("seccomp filter of {} instructions stacked", f.insns.len()));
    }
    if let Some(n) = e.nice {
        out.push(format!("nice {n}"));
    }
    if let Some(cpus) = &e.cpus {
        out.push(format!("cpus {}", edits::format_cpulist(cpus)));
    }
    if let Some(h) = &e.hostname {
        out.push(format!("hostname {h}"));
    }
    out
}
