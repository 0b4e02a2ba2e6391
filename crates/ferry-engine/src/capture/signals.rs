//! Signal dispositions (sigaction of all 64 signals) and signals pending
//! for the whole process.

use super::Ctx;
use crate::error::{EngineError, Result};
use crate::procfs;
use ferry_image::{SigAction, SignalState};
use ferry_sys::ptrace;

/// Reads every signal's disposition. Only signals the process catches
/// (and SIGCHLD, whose flags matter even when not caught) need the
/// injected rt_sigaction; /proc tells which are ignored or default.
pub fn capture_actions(ctx: &Ctx) -> Result<SignalState> {
    let status = procfs::read_string(&format!("/proc/{}/status", ctx.pid))?;
    let kv = procfs::key_values(&status);
    let mask = |k: &str| kv.get(k).and_then(|v| procfs::parse_hex(v)).unwrap_or(!0);
    let (caught, ignored) = (mask("SigCgt"), mask("SigIgn"));
    let mut actions = Vec::with_capacity(64);
    for sig in 1..=64u64 {
        let bit = 1u64 << (sig - 1);
        if caught & bit == 0 && sig != libc::SIGCHLD as u64 {
            let handler = if ignored & bit != 0 { 1 } else { 0 };
            actions.push(SigAction { handler, ..Default::default() });
            continue;
        }
        ctx.remote.call(ctx.pid, &format!("rt_sigaction({sig})"), libc::SYS_rt_sigaction, &[sig, 0, ctx.scratch, 8])?;
        let b = ctx.remote.read(ctx.scratch, 32)?;
        let w = |i: usize| u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
        actions.push(SigAction { handler: w(0), flags: w(1), restorer: w(2), mask: w(3) });
    }
    Ok(SignalState { actions, shared_pending: Vec::new() })
}

pub fn shared_pending(pid: i32) -> Result<Vec<Vec<u8>>> {
    let infos = ptrace::peek_siginfo(pid, true).map_err(|e| EngineError::kernel(pid, "reading process-wide pending signals", e))?;
    Ok(infos.iter().map(|s| s.to_vec()).collect())
}
