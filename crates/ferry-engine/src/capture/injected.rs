//! Phase "injected syscalls": the state only a process can read about
//! itself, read by syscalls run inside it from a scratch mapping that is
//! removed again before any page is copied.
//!
//! With a kept watch (`ferry replicate`'s syncs), what a process's
//! threads answered is kept ([`KeptInjected`]) with each thread's state
//! count taken in the freeze after the calls
//! ([`super::sockopt_watch::KeptWatch::state_counts`]), and the next
//! capture parses those answers again instead of asking, when it can
//! prove they are still true ([`stands`]): the same threads, counted
//! without a break by the same counters, none made a call that changes
//! an answer or was delivered a signal since, no interval or POSIX timer
//! runs (their values move with time), no thread was on its alternate
//! signal stack, no other process changed a thread's timer slack
//! (/proc/TID/timerslack_ns read again) and the kernel has no core
//! scheduling cookies (another process may set one). Otherwise it asks
//! again, as every capture without a kept watch does.

use super::sockopt_watch::{KeptWatch, StateCount};
use super::survey::Survey;
use super::{memory, prctl, process, signals, threads, timers, Ctx};
use crate::error::Result;
use crate::freeze::Frozen;
use crate::inject::{self, Scratch};
use std::collections::HashMap;

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

/// One thread's answers as they came: its batch's results and the data
/// area they wrote.
#[derive(Clone)]
struct Answers {
    r: Vec<i64>,
    out: Vec<u8>,
}

/// A process's answers, by TID, and what its threads' state counters
/// read once they were given ([`StateCount`]).
struct KeptProcess {
    answers: HashMap<i32, Answers>,
    counts: HashMap<i32, StateCount>,
}

/// The answers of the capture before, kept from capture to capture with
/// a kept watch (`ferry replicate`'s syncs,
/// [`super::CaptureOptions::kept_injected`]).
#[derive(Clone, Default)]
pub struct KeptInjected(std::sync::Arc<std::sync::Mutex<HashMap<i32, KeptProcess>>>);

impl std::fmt::Debug for KeptInjected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeptInjected")
    }
}

/// The phase over the frozen tree: each process asked, or its kept
/// answers parsed again when they stand; with `kept`, the answers and
/// the state counts after every call are kept for the next capture
/// (none kept when a count cannot be read).
pub(super) fn capture_tree(
    tree: &super::tree::FrozenTree,
    procs: &[Survey],
    kept: Option<(&KeptWatch, &KeptInjected)>,
    guard: &mut crate::guard::Guard,
) -> Result<Vec<Injected>> {
    let tids: Vec<i32> =
        tree.procs.iter().flat_map(|p| p.frozen.threads.iter().map(|t| t.tid)).collect();
    let Some((watch, store)) = kept else {
        return tree
            .procs
            .iter()
            .zip(procs)
            .map(|(p, s)| capture_process(&p.frozen, s, guard).map(|x| x.0))
            .collect();
    };
    let before = watch.state_counts(&tids);
    let mut store = store.0.lock().unwrap_or_else(|e| e.into_inner());
    let mut old = std::mem::take(&mut *store);
    let mut out = Vec::with_capacity(procs.len());
    let mut answered = Vec::with_capacity(procs.len());
    for (p, s) in tree.procs.iter().zip(procs) {
        let pid = p.frozen.pid;
        let standing = old.remove(&pid).filter(|k| stands(&p.frozen, k, before.as_ref()));
        let (injected, answers) = match standing {
            Some(k) => {
                tracing::debug!(
                    "pid {pid}: injected answers of the capture before stand, not asked again"
                );
                (parse_kept(&p.frozen, s, &k.answers)?, k.answers)
            }
            None => capture_process(&p.frozen, s, guard)?,
        };
        out.push(injected);
        answered.push((pid, answers));
    }
    // After every call of this capture: what the next one compares with.
    if let Some(after) = watch.state_counts(&tids) {
        for (pid, answers) in answered {
            let counts = answers.keys().filter_map(|t| Some((*t, *after.get(t)?))).collect();
            store.insert(pid, KeptProcess { answers, counts });
        }
    }
    Ok(out)
}

/// Whether a process's kept answers are still its threads' (see the
/// module comment).
fn stands(f: &Frozen, k: &KeptProcess, now: Option<&HashMap<i32, StateCount>>) -> bool {
    let Some(now) = now else { return false };
    let same_threads = f.threads.len() == k.answers.len()
        && f.threads.iter().all(|t| {
            k.answers.contains_key(&t.tid)
                && k.counts.get(&t.tid).is_some_and(|c| now.get(&t.tid) == Some(c))
        });
    same_threads
        && k.answers.iter().all(|(&tid, a)| answers_stand(f.pid, tid, a))
        && !timers::has_posix(f.pid).unwrap_or(true)
}

/// What of one thread's answers may change with no call of its own:
/// a running interval timer (the leader's answers), being on the
/// alternate stack, a timer slack written through /proc, a core
/// scheduling cookie.
fn answers_stand(pid: i32, tid: i32, a: &Answers) -> bool {
    let word = |off: usize| {
        a.out.get(off..off + 8).and_then(|b| b.try_into().ok()).map(u64::from_le_bytes)
    };
    let on_altstack = word(at::THREAD + 8).is_none_or(|flags| flags & libc::SS_ONSTACK as u64 != 0);
    let slack = a.r.get(2).copied();
    let slack_now = crate::procfs::read_string(&format!("/proc/{tid}/timerslack_ns"))
        .ok()
        .and_then(|s| s.trim().parse::<i64>().ok());
    let no_core_sched = a.r.get(threads::CALLS + prctl::CORE_SCHED_AT).is_some_and(|&r| r < 0);
    // Its registered rings are probed with calls of their own, asked
    // again each time.
    let no_ring_context = !prctl::has_ring_context(a.r.get(threads::CALLS..).unwrap_or(&[]));
    let leader_quiet = tid != pid || timers::no_itimer_runs(&a.out[at::ITIMERS.min(a.out.len())..]);
    !on_altstack
        && slack.is_some()
        && slack == slack_now
        && no_core_sched
        && no_ring_context
        && leader_quiet
}

/// A process's injected state from answers kept, parsed as if asked now
/// (the threads' own reads, registers and comm read afresh).
fn parse_kept(frozen: &Frozen, sv: &Survey, answers: &HashMap<i32, Answers>) -> Result<Injected> {
    let ctx = Ctx { pid: frozen.pid, frozen, remote: sv.remote, scratch: 0, data: 0 };
    let mut parsed = Vec::with_capacity(frozen.threads.len());
    for t in &frozen.threads {
        let a = answers.get(&t.tid).ok_or_else(|| {
            crate::error::EngineError::kernel(
                frozen.pid,
                format!("thread {}: its kept answers", t.tid),
                ferry_sys::SysError::new("kept answers", libc::ESRCH),
            )
        })?;
        parsed.push(parse_thread(&ctx, t, a)?);
    }
    assemble(&ctx, parsed, Vec::new())
}

/// Runs the injected capture inside one frozen process; its answers too.
/// Its threads are kept on ferry's CPU while they are asked
/// ([`Colocated`]), and given their own CPU masks back before anything
/// of them is read for the image.
fn capture_process(
    frozen: &Frozen,
    sv: &Survey,
    guard: &mut crate::guard::Guard,
) -> Result<(Injected, HashMap<i32, Answers>)> {
    let pid = frozen.pid;
    let locked_before = memory::locked_kb(pid)?;
    let colocated = Colocated::pin(frozen, guard);
    let asked = ask_process(frozen, sv, locked_before);
    colocated.put_back()?;
    let (ctx_scratch, answers, posix_timers) = asked?;
    let ctx = Ctx {
        pid,
        frozen,
        remote: sv.remote,
        scratch: ctx_scratch,
        data: ctx_scratch + inject::SCRATCH_DATA,
    };
    let mut parsed = Vec::with_capacity(frozen.threads.len());
    for t in &frozen.threads {
        let a = answers.get(&t.tid).ok_or_else(|| {
            crate::error::EngineError::kernel(
                pid,
                format!("thread {}: its answers", t.tid),
                ferry_sys::SysError::new("injected answers", libc::ESRCH),
            )
        })?;
        parsed.push(parse_thread(&ctx, t, a)?);
    }
    Ok((assemble(&ctx, parsed, posix_timers)?, answers))
}

/// Every injected call of one process, from its scratch mapping (the
/// mapping's address, where it was, comes back; it is gone): each
/// thread's batch and the POSIX timers.
fn ask_process(
    frozen: &Frozen,
    sv: &Survey,
    locked_before: u64,
) -> Result<(u64, HashMap<i32, Answers>, Vec<ferry_image::PosixTimer>)> {
    let pid = frozen.pid;
    let scratch = Scratch::map(&sv.remote, pid)?;
    let ctx = Ctx {
        pid,
        frozen,
        remote: sv.remote,
        scratch: scratch.addr,
        data: scratch.addr + inject::SCRATCH_DATA,
    };
    let asked = memory::check_mlock_future(pid, locked_before).and_then(|()| {
        let mut answers = HashMap::with_capacity(ctx.frozen.threads.len());
        for t in &ctx.frozen.threads {
            let a = ask_thread(&ctx, t)?;
            let (_, [ends_thread, ends_check, _]) = thread_calls(0, t.tid == pid);
            let checks = a.r.get(ends_thread..ends_check).unwrap_or(&[]);
            prctl::check_rings(&ctx, t.tid, checks)?;
            answers.insert(t.tid, a);
        }
        Ok((answers, timers::capture_posix(&ctx)?))
    });
    // Unmapped also when a batch failed: the process must not keep it.
    let addr = scratch.addr;
    let unmapped = scratch.unmap(&ctx.remote, pid);
    let (answers, posix) = asked?;
    unmapped?;
    Ok((addr, answers, posix))
}

/// A process's threads kept on the CPU of the ferry thread that asks
/// them ([`inject::colocate`]): an injected call is a round trip between
/// the two, 40-150 µs when its wakeups cross to another vCPU, about
/// 20 µs on one. Each thread's own CPU mask is read first and told to
/// the checkpoint guard (which sets it back should ferry die), and set
/// back by [`Colocated::put_back`] (or when dropped) before the thread
/// is read for the image or runs again. A thread whose mask cannot be
/// read is left where it is.
struct Colocated {
    masks: Vec<(i32, Vec<u64>)>,
}

impl Colocated {
    fn pin(frozen: &Frozen, guard: &mut crate::guard::Guard) -> Colocated {
        let mut masks = Vec::with_capacity(frozen.threads.len());
        for t in &frozen.threads {
            match ferry_sys::process::get_affinity(t.tid) {
                Ok(m) => {
                    guard.cpus(t.tid, &m);
                    masks.push((t.tid, m));
                    inject::colocate(t.tid);
                }
                Err(e) => tracing::debug!("thread {}: not kept on ferry's CPU: {e}", t.tid),
            }
        }
        Colocated { masks }
    }

    /// Every thread's own CPU mask set back; the first that fails is
    /// named (the others are set back all the same).
    fn put_back(mut self) -> Result<()> {
        let mut first = Ok(());
        for (tid, mask) in std::mem::take(&mut self.masks) {
            inject::forget_colocated(tid);
            if let Err(e) = ferry_sys::process::set_affinity(tid, &mask) {
                if first.is_ok() {
                    first = Err(crate::error::EngineError::kernel(
                        tid,
                        "setting back its CPU mask after the injected calls",
                        e,
                    ));
                }
            }
        }
        first
    }
}

impl Drop for Colocated {
    fn drop(&mut self) {
        for (tid, mask) in std::mem::take(&mut self.masks) {
            inject::forget_colocated(tid);
            let _ = ferry_sys::process::set_affinity(tid, &mask);
        }
    }
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

/// One thread's parsed answers: its image, its parent-death signal, and
/// for the leader the process-wide state.
type Parsed = (ferry_image::ThreadImage, i32, Option<ProcessWide>);

/// The process's state from its threads' parsed answers.
fn assemble(
    ctx: &Ctx,
    parsed: Vec<Parsed>,
    posix_timers: Vec<ferry_image::PosixTimer>,
) -> Result<Injected> {
    let mut threads = Vec::with_capacity(parsed.len());
    let mut deathsigs = Vec::with_capacity(parsed.len());
    let mut wide = None;
    for (image, deathsig, leader) in parsed {
        deathsigs.push((image.tid, deathsig));
        threads.push(image);
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

/// The calls of one thread's batch: its own state, the getters of
/// settings ferry does not restore (refused by name), its parent-death
/// signal, and for the leader the process-wide state.
fn thread_calls(base: u64, leader: bool) -> (Vec<inject::Call>, [usize; 3]) {
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
    (calls, [ends_thread, ends_check, ends_deathsig])
}

/// One thread's batch run in it: one round trip.
fn ask_thread(ctx: &Ctx, t: &crate::freeze::FrozenThread) -> Result<Answers> {
    let (calls, _) = thread_calls(ctx.data, t.tid == ctx.pid);
    // A getter that fails writes nothing: what it leaves reads as zero.
    ctx.remote.write(ctx.data, &[0u8; at::END])?;
    let r = ctx.remote.batch(t.tid, ctx.scratch, &calls)?;
    let out = ctx.remote.read(ctx.data, at::END)?;
    Ok(Answers { r, out })
}

/// One thread's answers parsed, with what the tracer reads of it now.
fn parse_thread(ctx: &Ctx, t: &crate::freeze::FrozenThread, a: &Answers) -> Result<Parsed> {
    let leader = t.tid == ctx.pid;
    let (_, [ends_thread, ends_check, ends_deathsig]) = thread_calls(0, leader);
    let (r, out) = (&a.r, &a.out);
    let traced = threads::traced(ctx.pid, t.tid)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_answers_stand_only_without_an_alternate_stack_in_use_a_new_slack_core_scheduling_or_io_uring(
    ) {
        let thread = std::fs::read_link("/proc/thread-self").expect("/proc/thread-self");
        let tid: i32 = thread.file_name().and_then(|n| n.to_str()?.parse().ok()).expect("tid");
        let slack: i64 = crate::procfs::read_string(&format!("/proc/{tid}/timerslack_ns"))
            .expect("timerslack_ns")
            .trim()
            .parse()
            .expect("a number");
        let (_, [ends_thread, ends_check, _]) = thread_calls(0, false);
        let mut r = vec![0i64; ends_check + 2];
        r[2] = slack;
        r[threads::CALLS + prctl::CORE_SCHED_AT] = -(libc::EINVAL as i64);
        r[threads::CALLS + prctl::RING_SLOT0] = -(libc::EINVAL as i64);
        assert_eq!(ends_thread, threads::CALLS);
        let answers = Answers { r, out: vec![0; at::END] };
        // Not the leader (pid 1 is not this thread's process).
        assert!(answers_stand(1, tid, &answers), "nothing moves these answers");
        let mut on_stack = answers.clone();
        on_stack.out[at::THREAD + 8] = libc::SS_ONSTACK as u8;
        assert!(!answers_stand(1, tid, &on_stack), "on its alternate stack");
        let mut other_slack = answers.clone();
        other_slack.r[2] = slack + 1;
        assert!(!answers_stand(1, tid, &other_slack), "a slack written since");
        let mut core = answers.clone();
        core.r[threads::CALLS + prctl::CORE_SCHED_AT] = 0;
        assert!(!answers_stand(1, tid, &core), "core scheduling on");
        let mut ring = answers.clone();
        ring.r[threads::CALLS + prctl::RING_SLOT0] = -(libc::EBADF as i64);
        assert!(!answers_stand(1, tid, &ring), "an io_uring context");
        // The leader's: an interval timer set moves with time.
        let mut timer = answers.clone();
        timer.out[at::ITIMERS + 16] = 1;
        assert!(answers_stand(tid, tid, &answers), "the leader's, no timer");
        assert!(!answers_stand(tid, tid, &timer), "a timer runs");
    }
}
