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

fn capture_inside(ctx: &Ctx) -> Result<Injected> {
    let threads =
        ctx.frozen.threads.iter().map(|t| threads::capture(ctx, t)).collect::<Result<Vec<_>>>()?;
    let signals = signals::capture_actions(ctx)?;
    let itimers = timers::capture_itimers(ctx)?;
    let posix_timers = timers::capture_posix(ctx)?;
    let (brk, misc) = process::capture_injected(ctx)?;
    prctl::check_unrestored(ctx)?;
    let (deathsigs, securebits) = prctl::capture_injected(ctx)?;
    Ok(Injected { threads, signals, itimers, posix_timers, brk, misc, deathsigs, securebits })
}
