//! prctl attributes recorded since format 4: each thread's parent-death
//! signal (PR_GET_PDEATHSIG, readable only from inside the thread) and
//! the securebits; and a check that every thread has the leader's
//! credentials (restore gives all threads the same ones).

use crate::error::{EngineError, Result};
use crate::inject::{check, Call};
use crate::procfs::{self, key_values};

const PR_GET_PDEATHSIG: u64 = 2;
const PR_GET_SECUREBITS: u64 = 27;

/// (tid, parent-death signal) of every thread, and the securebits.
pub fn capture_injected(ctx: &super::Ctx) -> Result<(Vec<(i32, i32)>, u32)> {
    let mut deathsigs = Vec::with_capacity(ctx.frozen.threads.len());
    let mut securebits = 0;
    for t in &ctx.frozen.threads {
        let mut calls = vec![Call::new(libc::SYS_prctl, &[PR_GET_PDEATHSIG, ctx.data])];
        if t.tid == ctx.pid {
            calls.push(Call::new(libc::SYS_prctl, &[PR_GET_SECUREBITS]));
        }
        let r = ctx.remote.batch(t.tid, ctx.scratch, &calls)?;
        check(ctx.pid, t.tid, "prctl(PR_GET_PDEATHSIG)", r[0])?;
        if t.tid == ctx.pid {
            securebits = check(ctx.pid, t.tid, "prctl(PR_GET_SECUREBITS)", r[1])? as u32;
        }
        let b = ctx.remote.read(ctx.data, 4)?;
        deathsigs.push((t.tid, i32::from_le_bytes([b[0], b[1], b[2], b[3]])));
    }
    Ok((deathsigs, securebits))
}

/// Credentials are per thread; restore gives every thread the leader's.
/// A thread whose ids, groups or capabilities differ is refused by name.
pub fn check_thread_creds(pid: i32, tids: &[i32]) -> Result<()> {
    const KEYS: [&str; 8] = ["Uid", "Gid", "Groups", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"];
    let read = |tid: i32| -> Result<Vec<String>> {
        let text = procfs::read_string(&format!("/proc/{pid}/task/{tid}/status"))?;
        let kv = key_values(&text);
        Ok(KEYS.iter().map(|k| kv.get(k).map(|v| v.split_whitespace().collect::<Vec<_>>().join(" ")).unwrap_or_default()).collect())
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
