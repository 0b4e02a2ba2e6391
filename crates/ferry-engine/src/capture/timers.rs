//! Interval timers (setitimer) and POSIX timers (timer_create), read in
//! injected batches.

use super::Ctx;
use crate::error::Result;
use crate::inject::{check, Call};
use crate::procfs;
use ferry_image::{ITimer, PosixTimer};

fn words(b: &[u8]) -> Vec<u64> {
    b.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes"))).collect()
}

/// Bytes of the data area [`itimer_calls`] write, from their `at`.
pub(super) const ITIMERS_DATA_LEN: usize = 96;

/// getitimer of the three interval timers, each at `at` + 32 per timer.
pub(super) fn itimer_calls(at: u64) -> Vec<Call> {
    (0..3u64).map(|w| Call::new(libc::SYS_getitimer, &[w, at + w * 32])).collect()
}

/// The armed interval timers from the results of [`itimer_calls`] and
/// the data they wrote.
pub(super) fn itimers_parse(pid: i32, results: &[i64], b: &[u8]) -> Result<Vec<ITimer>> {
    for &r in results {
        check(pid, pid, "getitimer", r)?;
    }
    let w = words(&b[..ITIMERS_DATA_LEN]);
    Ok((0..3)
        .map(|i| ITimer {
            which: i as i32,
            interval_us: w[i * 4] * 1_000_000 + w[i * 4 + 1],
            value_us: w[i * 4 + 2] * 1_000_000 + w[i * 4 + 3],
        })
        .filter(|t| t.value_us != 0 || t.interval_us != 0)
        .collect())
}

/// Whether the interval timers' answers (the data [`itimer_calls`]
/// wrote) show none set: then none moves until a call sets one.
pub(super) fn no_itimer_runs(b: &[u8]) -> bool {
    b.len() >= ITIMERS_DATA_LEN && b[..ITIMERS_DATA_LEN].iter().all(|&x| x == 0)
}

/// Whether /proc lists a POSIX timer of `pid`.
pub(super) fn has_posix(pid: i32) -> Result<bool> {
    let path = format!("/proc/{pid}/timers");
    Ok(!parse_timers(&procfs::read_string(&path)?).is_empty())
}

pub fn capture_posix(ctx: &Ctx) -> Result<Vec<PosixTimer>> {
    let path = format!("/proc/{}/timers", ctx.pid);
    let timers = parse_timers(&procfs::read_string(&path)?);
    let calls: Vec<Call> = timers
        .iter()
        .enumerate()
        .flat_map(|(i, t)| {
            [
                Call::new(libc::SYS_timer_gettime, &[t.id as u64, ctx.data + i as u64 * 32]),
                Call::new(libc::SYS_timer_getoverrun, &[t.id as u64]),
            ]
        })
        .collect();
    let results = ctx.remote.batch(ctx.pid, ctx.scratch, &calls)?;
    let raw = ctx.remote.read(ctx.data, timers.len() * 32)?;
    let mut out = Vec::new();
    for (i, mut t) in timers.into_iter().enumerate() {
        // A timer deleted just before the freeze can linger in /proc.
        if results[i * 2] == -(libc::EINVAL as i64) {
            continue;
        }
        check(ctx.pid, ctx.pid, &format!("timer_gettime({})", t.id), results[i * 2])?;
        let w = words(&raw[i * 32..i * 32 + 32]);
        t.interval_ns = w[0] * 1_000_000_000 + w[1];
        t.value_ns = w[2] * 1_000_000_000 + w[3];
        t.overrun = results[i * 2 + 1].max(0) as i32;
        out.push(t);
    }
    Ok(out)
}

/// The timers /proc/PID/timers lists, without their times (read by
/// timer_gettime in the process).
fn parse_timers(text: &str) -> Vec<PosixTimer> {
    let mut timers = Vec::new();
    // Blocks start with an "ID:" line ("ClockID:" also contains "ID:").
    let mut blocks: Vec<String> = Vec::new();
    for line in text.lines() {
        if line.starts_with("ID:") {
            blocks.push(String::new());
        }
        if let Some(b) = blocks.last_mut() {
            b.push_str(line);
            b.push('\n');
        }
    }
    for block in &blocks {
        let kv = procfs::key_values(block);
        let id: i32 = kv.get("ID").and_then(|v| v.parse().ok()).unwrap_or(-1);
        let (signo, value) = kv.get("signal").and_then(|s| s.split_once('/')).unwrap_or(("0", "0"));
        let notify_s = kv.get("notify").copied().unwrap_or("signal/pid.0");
        let (how, who) = notify_s.split_once('/').unwrap_or(("signal", "pid.0"));
        let base = match how {
            "none" => libc::SIGEV_NONE,
            "thread" => libc::SIGEV_THREAD,
            _ => libc::SIGEV_SIGNAL,
        };
        let (kind, num) = who.split_once('.').unwrap_or(("pid", "0"));
        timers.push(PosixTimer {
            id,
            clockid: kv.get("ClockID").and_then(|v| v.parse().ok()).unwrap_or(0),
            notify: if kind == "tid" { base | libc::SIGEV_THREAD_ID } else { base },
            signo: signo.trim().parse().unwrap_or(0),
            notify_tid: num.parse().unwrap_or(0),
            sigev_value: procfs::parse_hex(value).unwrap_or(0),
            interval_ns: 0,
            value_ns: 0,
            overrun: 0,
        });
    }
    timers
}
