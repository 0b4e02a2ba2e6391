//! File locks (flock, POSIX record locks, OFD locks) the process holds,
//! from the "lock:" lines of /proc/PID/fdinfo/N, which list exactly the
//! locks held through that open file (POSIX ones: held by this process).

use super::FdInfo;
use crate::error::Result;
use ferry_image::{FileLock, LockKind};

pub fn parse(info: &FdInfo) -> Result<Vec<FileLock>> {
    let mut out = Vec::new();
    for line in info.fdinfo.lines().filter_map(|l| l.strip_prefix("lock:")) {
        // "1: POSIX  ADVISORY  WRITE 14463 fe:00:9980038 5 14"
        let w: Vec<&str> = line.split_whitespace().collect();
        if w.len() < 8 {
            return Err(info.unsupported(format!("cannot parse lock {line:?}")));
        }
        let kind = match w[1] {
            "FLOCK" => LockKind::Flock,
            "POSIX" => LockKind::Posix,
            "OFDLCK" => LockKind::Ofd,
            other => return Err(info.unsupported(format!("{other} locks are not supported"))),
        };
        if w[2] != "ADVISORY" {
            return Err(info.unsupported(format!("{} locks are not supported", w[2])));
        }
        let write = match w[3] {
            "WRITE" => true,
            "READ" => false,
            other => return Err(info.unsupported(format!("lock of type {other} is not supported"))),
        };
        let start =
            w[6].parse().map_err(|_| info.unsupported(format!("cannot parse lock {line:?}")))?;
        let end = if w[7] == "EOF" {
            None
        } else {
            Some(
                w[7].parse()
                    .map_err(|_| info.unsupported(format!("cannot parse lock {line:?}")))?,
            )
        };
        out.push(FileLock { kind, write, start, end });
    }
    Ok(out)
}
