//! The getters and what is done with each are listed in
//! `catalog::prctl` (docs/coverage.md's prctl table).
//!
//! prctl attributes recorded since format 4: each thread's parent-death
//! signal (PR_GET_PDEATHSIG, readable only from inside the thread) and
//! the securebits; and a check that every thread has the leader's
//! credentials (restore gives all threads the same ones).

use crate::error::{EngineError, Result};
use crate::inject::{check, Call};
use crate::procfs::{self, key_values};

const PR_GET_PDEATHSIG: u64 = 2;
const PR_GET_SECUREBITS: u64 = 27;

/// Bytes of the data area [`deathsig_calls`] write, from their `at`.
pub(super) const DEATHSIG_DATA_LEN: usize = 4;

/// The thread's parent-death signal (readable only from inside it) and,
/// for the leader, the securebits; results at `at`.
pub(super) fn deathsig_calls(at: u64, leader: bool) -> Vec<Call> {
    let mut calls = vec![Call::new(libc::SYS_prctl, &[PR_GET_PDEATHSIG, at])];
    if leader {
        calls.push(Call::new(libc::SYS_prctl, &[PR_GET_SECUREBITS]));
    }
    calls
}

/// (parent-death signal, the securebits for the leader) from the results
/// of [`deathsig_calls`] and the data they wrote.
pub(super) fn deathsig_parse(
    pid: i32,
    tid: i32,
    r: &[i64],
    out: &[u8],
) -> Result<(i32, Option<u32>)> {
    check(pid, tid, "prctl(PR_GET_PDEATHSIG)", r[0])?;
    let securebits = match r.get(1) {
        Some(&bits) => Some(check(pid, tid, "prctl(PR_GET_SECUREBITS)", bits)? as u32),
        None => None,
    };
    Ok((i32::from_le_bytes([out[0], out[1], out[2], out[3]]), securebits))
}

/// Per-thread attributes ferry does not restore, with the value every
/// thread must have: (name, getter calls, acceptable). A thread with
/// another value is refused by name. The speculation controls are
/// compared with ferry's own (their default depends on the kernel's
/// mitigation mode).
const PR_GET_TSC: u64 = 25;
const PR_TSC_ENABLE: u64 = 1;
const PR_MCE_KILL_GET: u64 = 34;
const PR_MCE_KILL_DEFAULT: u64 = 2;
const PR_GET_SPECULATION_CTRL: u64 = 52;
const PR_GET_IO_FLUSHER: u64 = 58;
const PR_GET_MDWE: u64 = 66;
const PR_GET_MEMORY_MERGE: u64 = 68;
const ARCH_GET_CPUID: u64 = 0x1011;
const ARCH_SHSTK_STATUS: u64 = 0x5005;
const PR_SCHED_CORE: u64 = 62;
const PR_SCHED_CORE_GET: u64 = 0;
const PR_TIMER_CREATE_RESTORE_IDS: u64 = 77;
const PR_TIMER_CREATE_RESTORE_IDS_GET: u64 = 2;

fn own_speculation(which: u64) -> i64 {
    ferry_sys::process::prctl_get(PR_GET_SPECULATION_CTRL as i32, which)
}

/// Refuses a thread with a prctl/arch_prctl attribute ferry does not
/// restore set away from its default: PR_SET_TSC, PR_MCE_KILL,
/// PR_SET_SPECULATION_CTRL, PR_SET_IO_FLUSHER, PR_SET_MDWE,
/// PR_SET_MEMORY_MERGE, ARCH_SET_CPUID, x86 shadow stacks, a NUMA memory
/// policy, a core-scheduling cookie, syscall user dispatch. (A thread
/// holding a registered io_uring ring is refused by [`check_rings`], while
/// the injected calls' scratch is mapped.)
pub(super) fn check_thread(ctx: &super::Ctx, tid: i32, r: Vec<i64>, out: &[u8]) -> Result<()> {
    let state = ThreadPrctls::from_results(ctx.pid, tid, r, out);
    if let Some((what, why)) = state.control_refusal().or_else(|| state.feature_refusal()) {
        return Err(EngineError::unsupported(ctx.pid, format!("thread {tid}: {what}"), why));
    }
    if let Ok(sud) = ferry_sys::ptrace::get_syscall_user_dispatch(tid) {
        if sud[0] != 0 {
            return Err(EngineError::unsupported(
                ctx.pid,
                format!("thread {tid}: PR_SET_SYSCALL_USER_DISPATCH"),
                format!("syscall user dispatch is on (selector {:#x}); not restored", sud[1]),
            ));
        }
    }
    Ok(())
}

/// Bytes of the data area [`check_calls`] write, from their `at`; they
/// must be zero before the calls (a getter that fails writes nothing).
pub(super) const CHECK_DATA_LEN: usize = 32;

/// The getters of [`check_thread`], results at `at`.
pub(super) fn check_calls(at: u64) -> Vec<Call> {
    vec![
        Call::new(libc::SYS_prctl, &[PR_GET_TSC, at]),
        Call::new(libc::SYS_prctl, &[PR_MCE_KILL_GET, 0, 0, 0, 0]),
        Call::new(libc::SYS_prctl, &[PR_GET_SPECULATION_CTRL, 0, 0, 0, 0]),
        Call::new(libc::SYS_prctl, &[PR_GET_SPECULATION_CTRL, 1, 0, 0, 0]),
        Call::new(libc::SYS_prctl, &[PR_GET_SPECULATION_CTRL, 2, 0, 0, 0]),
        Call::new(libc::SYS_prctl, &[PR_GET_IO_FLUSHER, 0, 0, 0, 0]),
        Call::new(libc::SYS_prctl, &[PR_GET_MDWE, 0, 0, 0, 0]),
        Call::new(libc::SYS_prctl, &[PR_GET_MEMORY_MERGE, 0, 0, 0, 0]),
        Call::new(libc::SYS_arch_prctl, &[ARCH_GET_CPUID, 0]),
        Call::new(libc::SYS_arch_prctl, &[ARCH_SHSTK_STATUS, at + 8]),
        Call::new(libc::SYS_get_mempolicy, &[at + 16, 0, 0, 0, 0]),
        Call::new(libc::SYS_prctl, &[PR_SCHED_CORE, PR_SCHED_CORE_GET, 0, 0, at + 24]),
        Call::new(
            libc::SYS_prctl,
            &[PR_TIMER_CREATE_RESTORE_IDS, PR_TIMER_CREATE_RESTORE_IDS_GET, 0, 0, 0],
        ),
        // Slot 0 of the registered io_uring rings: whether the thread
        // has an io_uring context at all, in the same round trip.
        super::registered_rings::probe(0),
    ]
}

/// The index in [`check_calls`] of PR_SCHED_CORE_GET.
pub(super) const CORE_SCHED_AT: usize = 11;

/// The index in `ThreadPrctls::r` of the registered-ring probe.
pub(super) const RING_SLOT0: usize = 13;

/// Whether the thread whose [`check_calls`] answered `r` has an io_uring
/// context (an unreadable answer counts as one).
pub(super) fn has_ring_context(r: &[i64]) -> bool {
    r.get(RING_SLOT0).is_none_or(|&slot0| super::registered_rings::has_context(slot0))
}

/// Refuses thread `tid` when it holds a registered io_uring ring: its
/// registered-ring table probed with injected calls, so `ctx`'s scratch
/// must be mapped. `r`: its [`check_calls`] answers.
pub(super) fn check_rings(ctx: &super::Ctx, tid: i32, r: &[i64]) -> Result<()> {
    if has_ring_context(r) {
        super::registered_rings::check(ctx, tid)?;
    }
    Ok(())
}

/// What one thread's getters report, for the settings restore does not
/// make again. `r` holds the calls' results in the order of `read`.
struct ThreadPrctls {
    r: Vec<i64>,
    tsc: u64,
    shstk: u64,
    mempolicy: i32,
    core_cookie: u64,
    /// The Seccomp line of the thread's status.
    seccomp_mode: String,
}

impl ThreadPrctls {
    fn from_results(pid: i32, tid: i32, r: Vec<i64>, b: &[u8]) -> ThreadPrctls {
        let seccomp_mode = procfs::read_string(&format!("/proc/{pid}/task/{tid}/status"))
            .map(|s| key_values(&s).get("Seccomp").map(|v| v.to_string()).unwrap_or_default())
            .unwrap_or_default();
        ThreadPrctls {
            r,
            mempolicy: i32::from_le_bytes([b[16], b[17], b[18], b[19]]),
            core_cookie: u64::from_le_bytes(b[24..32].try_into().unwrap_or([0; 8])),
            tsc: u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as u64,
            shstk: u64::from_le_bytes(b[8..16].try_into().unwrap_or([0; 8])),
            seccomp_mode,
        }
    }

    /// The first of the thread's process controls that restore would
    /// lose: what it is, and why it is refused.
    fn control_refusal(&self) -> Option<(&'static str, String)> {
        let (r, tsc) = (&self.r, self.tsc);
        // Seccomp strict mode turns the counter off itself (and gets it
        // back with the mode).
        let strict = self.seccomp_mode == "1";
        if r[0] >= 0 && tsc != PR_TSC_ENABLE && !strict {
            return Some(("PR_SET_TSC", format!("reading the time stamp counter is set to fault (PR_GET_TSC {tsc}); not restored")));
        }
        if r[1] >= 0 && r[1] as u64 != PR_MCE_KILL_DEFAULT {
            return Some((
                "PR_MCE_KILL",
                format!("its memory-error kill policy is {} (not the default); not restored", r[1]),
            ));
        }
        // With spec_store_bypass_disable=seccomp the kernel itself
        // force-disables speculation for seccomp'd threads; reinstalling
        // the filters does the same again.
        let under_seccomp = self.seccomp_mode == "1" || self.seccomp_mode == "2";
        for (k, which) in [(2usize, 0u64), (3, 1), (4, 2)] {
            if r[k] >= 0 && r[k] != own_speculation(which) && !under_seccomp {
                return Some((
                    "PR_SET_SPECULATION_CTRL",
                    format!(
                        "speculation control {which} is {:#x}, ferry's {:#x}; not restored",
                        r[k],
                        own_speculation(which)
                    ),
                ));
            }
        }
        if r[5] > 0 {
            return Some(("PR_SET_IO_FLUSHER", "it is an IO flusher; not restored".into()));
        }
        if r[12] > 0 {
            return Some((
                "PR_TIMER_CREATE_RESTORE_IDS",
                "timer_create takes the id it is given (a restorer's mode); not restored".into(),
            ));
        }
        None
    }

    /// The first of the thread's memory, CPU and scheduling features that
    /// restore would lose (checked after `control_refusal`).
    fn feature_refusal(&self) -> Option<(&'static str, String)> {
        let r = &self.r;
        if r[6] > 0 {
            return Some((
                "PR_SET_MDWE",
                format!("memory-deny-write-execute is on ({:#x}); not restored", r[6]),
            ));
        }
        if r[7] > 0 {
            return Some((
                "PR_SET_MEMORY_MERGE",
                "KSM merging is on for the whole process; not restored".into(),
            ));
        }
        if r[8] == 0 {
            return Some((
                "ARCH_SET_CPUID",
                "the cpuid instruction is set to fault; not restored".into(),
            ));
        }
        if r[9] >= 0 && self.shstk != 0 {
            return Some((
                "shadow stack",
                format!("x86 shadow stack features {:#x} are enabled; not restored", self.shstk),
            ));
        }
        if r[10] >= 0 && self.mempolicy != 0 {
            return Some((
                "NUMA memory policy",
                format!("set_mempolicy mode {} (not MPOL_DEFAULT); not restored", self.mempolicy),
            ));
        }
        if r[11] >= 0 && self.core_cookie != 0 {
            return Some((
                "PR_SCHED_CORE",
                format!("core scheduling cookie {:#x}; not restored", self.core_cookie),
            ));
        }
        None
    }
}

/// Credentials are per thread; restore gives every thread the leader's.
/// A thread whose ids, groups or capabilities differ is refused by name.
/// The same read checks every status line against the catalog
/// (`catalog::proc_status`): an unknown line, or one ferry does not
/// restore set away from a fresh process's value, is refused by name.
pub fn check_thread_creds(pid: i32, tids: &[i32]) -> Result<()> {
    const KEYS: [&str; 8] =
        ["Uid", "Gid", "Groups", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"];
    let read = |tid: i32| -> Result<Vec<String>> {
        let text = procfs::read_string(&format!("/proc/{pid}/task/{tid}/status"))?;
        if let Some((line, why)) = crate::catalog::proc_status::status_refusal(&text) {
            return Err(EngineError::unsupported(pid, format!("thread {tid}: {line}"), why));
        }
        let kv = key_values(&text);
        Ok(KEYS
            .iter()
            .map(|k| {
                kv.get(k)
                    .map(|v| v.split_whitespace().collect::<Vec<_>>().join(" "))
                    .unwrap_or_default()
            })
            .collect())
    };
    let leader = read(pid)?;
    for &tid in tids.iter().filter(|&&t| t != pid) {
        let mine = read(tid)?;
        if let Some(k) = (0..KEYS.len()).find(|&k| mine[k] != leader[k]) {
            return Err(EngineError::unsupported(
                pid,
                format!("thread {tid}"),
                format!("its {} ({}) differs from the thread group leader's ({}); per-thread credentials are not supported", KEYS[k], mine[k], leader[k]),
            ));
        }
    }
    Ok(())
}
