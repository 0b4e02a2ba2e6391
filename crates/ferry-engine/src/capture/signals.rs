//! Signal dispositions (sigaction of all 64 signals, read in one injected
//! batch) and signals pending for the whole process.

use crate::error::{EngineError, Result};
use crate::inject::{check, Call};
use ferry_image::{SigAction, SignalState};
use ferry_sys::ptrace;

/// Bytes of the data area [`action_calls`] write, from their `at`.
pub(super) const ACTIONS_DATA_LEN: usize = 64 * 32;

/// rt_sigaction of every signal, each action at `at` + 32 per signal.
pub(super) fn action_calls(at: u64) -> Vec<Call> {
    (1..=64u64)
        .map(|sig| Call::new(libc::SYS_rt_sigaction, &[sig, 0, at + (sig - 1) * 32, 8]))
        .collect()
}

/// The actions from the results of [`action_calls`] and the data they
/// wrote.
pub(super) fn actions_parse(pid: i32, results: &[i64], b: &[u8]) -> Result<SignalState> {
    for (i, r) in results.iter().enumerate() {
        check(pid, pid, &format!("rt_sigaction({})", i + 1), *r)?;
    }
    let w = |i: usize| u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
    let actions = (0..64)
        .map(|s| SigAction {
            handler: w(s * 4),
            flags: w(s * 4 + 1),
            restorer: w(s * 4 + 2),
            mask: w(s * 4 + 3),
        })
        .collect();
    Ok(SignalState { actions, shared_pending: Vec::new() })
}

pub fn shared_pending(pid: i32) -> Result<Vec<Vec<u8>>> {
    let infos = ptrace::peek_siginfo(pid, true)
        .map_err(|e| EngineError::kernel(pid, "reading process-wide pending signals", e))?;
    Ok(infos.iter().map(|s| s.to_vec()).collect())
}
