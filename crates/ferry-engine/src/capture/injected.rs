//! Phase "injected syscalls": the state only a process can read about
//! itself, read by syscalls run inside it from a scratch mapping that is
//! removed again before any page is copied.

use super::survey::Survey;
use super::{memory, prctl, process, signals, threads, timers, Ctx};
use crate::error::Result;
use crate::freeze::Frozen;
use crate::inject::{self, Scratch};

/// What one process told about itself.
pub(super) struct Injected {
    pub threads: Vec<ferry_image::ThreadImage>,
    pub signals: ferry_image::SignalState,
    pub itimers: Vec<ferry_image::ITimer>,
    pub posix_timers: Vec<ferry_image::PosixTimer>,
    pub brk: u64,
    pub misc: ferry_image::ProcessMisc,
    /// (TID, parent-death signal) of each thread that has one.
    pub deathsigs: Vec<(i32, i32)>,
    pub securebits: u32,
}

/// Runs the injected capture inside one frozen process.
pub(super) fn capture_process(frozen: &Frozen, sv: &Survey) -> Result<Injected> {
    let pid = frozen.pid;
    let locked_before = memory::locked_kb(pid)?;
    let scratch = Scratch::map(&sv.remote, pid)?;
    let ctx = Ctx {
        pid,
        frozen,
        remote: sv.remote,
        scratch: scratch.addr,
        data: scratch.addr + inject::SCRATCH_DATA,
    };
    let injected =
        memory::check_mlock_future(pid, locked_before).and_then(|()| capture_inside(&ctx));
    // Unmapped also when a batch failed: the process must not keep it.
    let unmapped = scratch.unmap(&ctx.remote, pid);
    let injected = injected?;
    unmapped?;
    Ok(injected)
}

/// Where each part's results land in the scratch's data area: a thread's
/// calls all run in one batch (one round trip into the thread), the
/// leader's with the process-wide ones.
mod at {
    pub const THREAD: usize = 0;
    pub const PRCTL_CHECK: usize = 64;
    pub const DEATHSIG: usize = 128;
    pub const PROCESS: usize = 192;
    pub const ITIMERS: usize = 256;
    pub const SIGACTIONS: usize = 512;
    pub const END: usize = SIGACTIONS + super::signals::ACTIONS_DATA_LEN;
}
const _: () = {
    assert!(at::THREAD + threads::DATA_LEN <= at::PRCTL_CHECK);
    assert!(at::PRCTL_CHECK + prctl::CHECK_DATA_LEN <= at::DEATHSIG);
    assert!(at::DEATHSIG + prctl::DEATHSIG_DATA_LEN <= at::PROCESS);
    assert!(at::PROCESS + process::INJECTED_DATA_LEN <= at::ITIMERS);
    assert!(at::ITIMERS + timers::ITIMERS_DATA_LEN <= at::SIGACTIONS);
};

/// What the leader's batch adds: the process-wide state.
struct ProcessWide {
    signals: ferry_image::SignalState,
    itimers: Vec<ferry_image::ITimer>,
    brk: u64,
    misc: ferry_image::ProcessMisc,
    securebits: u32,
}

fn capture_inside(ctx: &Ctx) -> Result<Injected> {
    let mut threads = Vec::with_capacity(ctx.frozen.threads.len());
    let mut deathsigs = Vec::with_capacity(ctx.frozen.threads.len());
    let mut wide = None;
    for t in &ctx.frozen.threads {
        let (image, deathsig, leader) = capture_thread(ctx, t)?;
        threads.push(image);
        deathsigs.push((t.tid, deathsig));
        if leader.is_some() {
            wide = leader;
        }
    }
    let Some(w) = wide else {
        return Err(crate::error::EngineError::kernel(
            ctx.pid,
            "finding the thread group leader among the frozen threads",
            ferry_sys::SysError::new("the leader", libc::ESRCH),
        ));
    };
    let posix_timers = timers::capture_posix(ctx)?;
    Ok(Injected {
        threads,
        signals: w.signals,
        itimers: w.itimers,
        posix_timers,
        brk: w.brk,
        misc: w.misc,
        deathsigs,
        securebits: w.securebits,
    })
}

/// One thread's batch: its own state, the getters of settings ferry does
/// not restore (refused by name), its parent-death signal, and for the
/// leader the process-wide state.
fn capture_thread(
    ctx: &Ctx,
    t: &crate::freeze::FrozenThread,
) -> Result<(ferry_image::ThreadImage, i32, Option<ProcessWide>)> {
    let base = ctx.data;
    let leader = t.tid == ctx.pid;
    let traced = threads::traced(ctx.pid, t.tid)?;
    let mut calls = threads::calls(base + at::THREAD as u64);
    let ends_thread = calls.len();
    calls.extend(prctl::check_calls(base + at::PRCTL_CHECK as u64));
    let ends_check = calls.len();
    calls.extend(prctl::deathsig_calls(base + at::DEATHSIG as u64, leader));
    let ends_deathsig = calls.len();
    if leader {
        calls.extend(process::injected_calls(base + at::PROCESS as u64));
        calls.extend(timers::itimer_calls(base + at::ITIMERS as u64));
        calls.extend(signals::action_calls(base + at::SIGACTIONS as u64));
    }
    // A getter that fails writes nothing: what it leaves reads as zero.
    ctx.remote.write(base, &[0u8; at::END])?;
    let r = ctx.remote.batch(t.tid, ctx.scratch, &calls)?;
    let out = ctx.remote.read(base, at::END)?;
    let image = threads::finish(ctx, t, traced, &r[..ends_thread], &out[at::THREAD..])?;
    prctl::check_thread(ctx, t.tid, r[ends_thread..ends_check].to_vec(), &out[at::PRCTL_CHECK..])?;
    let (deathsig, securebits) =
        prctl::deathsig_parse(ctx.pid, t.tid, &r[ends_check..ends_deathsig], &out[at::DEATHSIG..])?;
    if !leader {
        return Ok((image, deathsig, None));
    }
    let rest = &r[ends_deathsig..];
    let (brk, misc) = process::injected_parse(ctx.pid, &rest[..4], &out[at::PROCESS..])?;
    let itimers = timers::itimers_parse(ctx.pid, &rest[4..7], &out[at::ITIMERS..])?;
    let signals = signals::actions_parse(ctx.pid, &rest[7..], &out[at::SIGACTIONS..])?;
    let securebits = securebits.unwrap_or(0);
    Ok((image, deathsig, Some(ProcessWide { signals, itimers, brk, misc, securebits })))
}
