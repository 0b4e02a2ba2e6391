//! Signal dispositions and pending signals. Pending signals are queued
//! last, while every thread still blocks everything, so they are delivered
//! only once the process runs under its own masks.

use super::Session;
use crate::error::Result;

pub fn restore_actions(s: &mut Session) -> Result<()> {
    for (i, a) in s.image.signals.actions.iter().enumerate() {
        let sig = i as u64 + 1;
        // The child reset every disposition to default before stopping.
        if sig == libc::SIGKILL as u64 || sig == libc::SIGSTOP as u64 || (a.handler == 0 && a.flags == 0 && a.mask == 0) {
            continue;
        }
        let bytes: Vec<u8> = [a.handler, a.flags, a.restorer, a.mask].iter().flat_map(|w| w.to_le_bytes()).collect();
        s.remote.write(s.scratch, &bytes)?;
        s.call(&format!("rt_sigaction({sig})"), libc::SYS_rt_sigaction, &[sig, s.scratch, 0, 8])?;
    }
    Ok(())
}

fn signo(info: &[u8]) -> u64 {
    i32::from_le_bytes([info[0], info[1], info[2], info[3]]) as u64
}

pub fn queue_pending(s: &mut Session) -> Result<()> {
    let pid = s.pid as u64;
    for info in &s.image.signals.shared_pending {
        s.remote.write(s.scratch, info)?;
        s.call("rt_sigqueueinfo", libc::SYS_rt_sigqueueinfo, &[pid, signo(info), s.scratch])?;
    }
    for t in &s.image.threads {
        for info in &t.pending {
            s.remote.write(s.scratch, info)?;
            s.remote.call(t.tid, "rt_tgsigqueueinfo", libc::SYS_rt_tgsigqueueinfo, &[pid, t.tid as u64, signo(info), s.scratch])?;
        }
    }
    Ok(())
}
