//! Interval timers and POSIX timers, re-armed with their remaining time.
//! POSIX timers get their old IDs back through PR_TIMER_CREATE_RESTORE_IDS.

use super::Session;
use crate::error::{EngineError, Result};

const PR_TIMER_CREATE_RESTORE_IDS: u64 = 77;

fn le(words: &[u64]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

pub fn restore_itimers(s: &mut Session) -> Result<()> {
    for t in &s.image.itimers {
        if t.value_us == 0 {
            continue;
        }
        let b = le(&[
            t.interval_us / 1_000_000,
            t.interval_us % 1_000_000,
            t.value_us / 1_000_000,
            t.value_us % 1_000_000,
        ]);
        s.remote.write(s.data, &b)?;
        s.call("setitimer", libc::SYS_setitimer, &[t.which as u64, s.data, 0])?;
    }
    Ok(())
}

pub fn restore_posix(s: &mut Session) -> Result<()> {
    if s.image.posix_timers.is_empty() {
        return Ok(());
    }
    let by_id = s
        .call(
            "prctl(PR_TIMER_CREATE_RESTORE_IDS)",
            libc::SYS_prctl,
            &[PR_TIMER_CREATE_RESTORE_IDS, 1, 0, 0, 0],
        )
        .is_ok();
    for t in &s.image.posix_timers {
        let mut ev = vec![0u8; 64];
        ev[0..8].copy_from_slice(&t.sigev_value.to_le_bytes());
        ev[8..12].copy_from_slice(&t.signo.to_le_bytes());
        ev[12..16].copy_from_slice(&t.notify.to_le_bytes());
        ev[16..20].copy_from_slice(&t.notify_tid.to_le_bytes());
        s.remote.write(s.data, &ev)?;
        s.remote.write(s.data + 64, &t.id.to_le_bytes())?;
        s.call("timer_create", libc::SYS_timer_create, &[t.clockid as u64, s.data, s.data + 64])?;
        let got = i32::from_le_bytes(s.remote.read(s.data + 64, 4)?.try_into().unwrap_or([0; 4]));
        if got != t.id {
            return Err(EngineError::restore(
                s.pid,
                format!(
                    "POSIX timer {} came back as {got}{}",
                    t.id,
                    if by_id { "" } else { " (kernel lacks PR_TIMER_CREATE_RESTORE_IDS)" }
                ),
            ));
        }
        if t.value_ns > 0 {
            let spec = le(&[
                t.interval_ns / 1_000_000_000,
                t.interval_ns % 1_000_000_000,
                t.value_ns / 1_000_000_000,
                t.value_ns % 1_000_000_000,
            ]);
            s.remote.write(s.data + 128, &spec)?;
            s.call("timer_settime", libc::SYS_timer_settime, &[t.id as u64, 0, s.data + 128, 0])?;
        }
    }
    if by_id {
        s.call(
            "prctl(PR_TIMER_CREATE_RESTORE_IDS, off)",
            libc::SYS_prctl,
            &[PR_TIMER_CREATE_RESTORE_IDS, 0, 0, 0, 0],
        )?;
    }
    Ok(())
}
