//! What the helper of a restore into a new PID namespace (see
//! [`pidns`](super::pidns)) tells ferry over its report pipe: typed
//! messages, each a postcard frame behind its length, as the rest of
//! ferry's protocols are framed.

use serde::{Deserialize, Serialize};
use std::io::{Read, Write};

/// A frame larger than this is not a report: the pipe is refused.
const MAX_FRAME: u32 = 1 << 20;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) enum Report {
    /// The tree is restored and held stopped: the restore's phases as
    /// (name, ms), and (image PID, fd number in the helper) of each
    /// userfaultfd post-copy serves.
    Held { phases: Vec<(String, f64)>, uffds: Vec<(i32, i32)> },
    /// Every process runs (reported before the lock comes down).
    Released { pid: i32, processes: usize, threads: usize, total_ms: f64 },
    /// The restore or the release failed; the helper exits.
    Failed { error: String },
}

/// Why a report could not be read.
#[derive(Debug, thiserror::Error)]
pub(super) enum ReportError {
    #[error("reading the report pipe: {0}")]
    Io(#[from] std::io::Error),
    #[error("a report frame of {0} bytes (at most {MAX_FRAME})")]
    TooLarge(u32),
    #[error("a report that does not decode: {0}")]
    Decode(String),
}

pub(super) fn send(w: &mut impl Write, report: &Report) -> std::io::Result<()> {
    let body = postcard::to_stdvec(report)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()))?;
    let mut frame = Vec::with_capacity(4 + body.len());
    frame.extend_from_slice(&(body.len() as u32).to_le_bytes());
    frame.extend_from_slice(&body);
    // One write per frame; the helper is the pipe's only writer.
    w.write_all(&frame)
}

/// The next report, or None when the helper closed the pipe first.
pub(super) fn recv(r: &mut impl Read) -> Result<Option<Report>, ReportError> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let len = u32::from_le_bytes(len);
    if len > MAX_FRAME {
        return Err(ReportError::TooLarge(len));
    }
    let mut body = vec![0u8; len as usize];
    match r.read_exact(&mut body) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    postcard::from_bytes(&body).map(Some).map_err(|e| ReportError::Decode(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_round_trip_in_order() {
        let sent = [
            Report::Held { phases: vec![("fork root".into(), 1.5)], uffds: vec![(7, 12)] },
            Report::Released { pid: 7, processes: 1, threads: 2, total_ms: 3.25 },
            Report::Failed { error: "pid 7: no".into() },
        ];
        let mut pipe = Vec::new();
        for r in &sent {
            send(&mut pipe, r).expect("send");
        }
        let mut rd = pipe.as_slice();
        for r in &sent {
            assert_eq!(recv(&mut rd).expect("recv").as_ref(), Some(r));
        }
        assert_eq!(recv(&mut rd).expect("end"), None);
    }

    #[test]
    fn a_cut_frame_is_the_end_and_a_huge_one_is_refused() {
        let mut pipe = Vec::new();
        send(&mut pipe, &Report::Failed { error: "x".repeat(100) }).expect("send");
        pipe.truncate(pipe.len() - 10);
        assert_eq!(recv(&mut pipe.as_slice()).expect("cut"), None);
        let huge = (MAX_FRAME + 1).to_le_bytes();
        assert!(matches!(recv(&mut &huge[..]), Err(ReportError::TooLarge(_))));
        let junk = [3u8, 0, 0, 0, 0xff, 0xff, 0xff];
        assert!(matches!(recv(&mut &junk[..]), Err(ReportError::Decode(_))));
    }
}
