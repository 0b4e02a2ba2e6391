//! Interval timers (setitimer) and POSIX timers (timer_create).

use super::Ctx;
use crate::error::Result;
use crate::procfs;
use ferry_image::{ITimer, PosixTimer};

fn words(b: &[u8]) -> Vec<u64> {
    b.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes"))).collect()
}

pub fn capture_itimers(ctx: &Ctx) -> Result<Vec<ITimer>> {
    let mut out = Vec::new();
    for which in 0..3u64 {
        ctx.remote.call(ctx.pid, "getitimer", libc::SYS_getitimer, &[which, ctx.scratch])?;
        let w = words(&ctx.remote.read(ctx.scratch, 32)?);
        let t = ITimer { which: which as i32, interval_us: w[0] * 1_000_000 + w[1], value_us: w[2] * 1_000_000 + w[3] };
        if t.value_us != 0 || t.interval_us != 0 {
            out.push(t);
        }
    }
    Ok(out)
}

pub fn capture_posix(ctx: &Ctx) -> Result<Vec<PosixTimer>> {
    let path = format!("/proc/{}/timers", ctx.pid);
    let text = procfs::read_string(&path)?;
    let mut out = Vec::new();
    for block in text.split("ID:").skip(1) {
        let kv = procfs::key_values(block);
        let id: i32 = block.lines().next().and_then(|l| l.trim().parse().ok()).unwrap_or(-1);
        let (signo, value) = kv.get("signal").and_then(|s| s.split_once('/')).unwrap_or(("0", "0"));
        let notify_s = kv.get("notify").copied().unwrap_or("signal/pid.0");
        let (how, who) = notify_s.split_once('/').unwrap_or(("signal", "pid.0"));
        let base = match how {
            "none" => libc::SIGEV_NONE,
            "thread" => libc::SIGEV_THREAD,
            _ => libc::SIGEV_SIGNAL,
        };
        let (kind, num) = who.split_once('.').unwrap_or(("pid", "0"));
        let notify = if kind == "tid" { base | libc::SIGEV_THREAD_ID } else { base };
        ctx.remote.call(ctx.pid, &format!("timer_gettime({id})"), libc::SYS_timer_gettime, &[id as u64, ctx.scratch])?;
        let w = words(&ctx.remote.read(ctx.scratch, 32)?);
        let overrun = ctx.remote.call(ctx.pid, "timer_getoverrun", libc::SYS_timer_getoverrun, &[id as u64])? as i32;
        out.push(PosixTimer {
            id,
            clockid: kv.get("ClockID").and_then(|v| v.parse().ok()).unwrap_or(0),
            notify,
            signo: signo.trim().parse().unwrap_or(0),
            notify_tid: num.parse().unwrap_or(0),
            sigev_value: procfs::parse_hex(value).unwrap_or(0),
            interval_ns: w[0] * 1_000_000_000 + w[1],
            value_ns: w[2] * 1_000_000_000 + w[3],
            overrun,
        });
    }
    Ok(out)
}
