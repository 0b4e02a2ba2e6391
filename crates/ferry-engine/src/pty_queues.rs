//! The bytes queued in a pseudo-terminal pair, read out and put back.
//! Capture reads them (a terminal has no peek, so reading takes them) and
//! puts them back when the tree runs on; restore puts them into the new
//! pair. Both sides use this module, which imports neither.
//!
//! Putting back goes through TIOCSTI, which hands each byte to the line
//! discipline at once (a write to the other end would reach it later,
//! from a work queue, maybe after the termios was set back): on the
//! slave it becomes input to read, on the master slave output to read.

use crate::error::{EngineError, Result};
use ferry_sys::tty::{self, Termios2};
use std::os::fd::RawFd;

/// What a pair holds that nobody has read yet.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Queued {
    /// Complete lines of input (canonical mode), each as one read gave it.
    pub lines: Vec<Vec<u8>>,
    /// Input after the last line end (or all of it, non-canonical).
    pub rest: Vec<u8>,
    /// Slave output the master has not read.
    pub output: Vec<u8>,
}

impl Queued {
    pub fn is_empty(&self) -> bool {
        self.lines.is_empty() && self.rest.is_empty() && self.output.is_empty()
    }
}

const TIOCPKT_DATA: u8 = 0;

fn kerr(index: u32, what: &str, e: ferry_sys::SysError) -> EngineError {
    EngineError::kernel(0, format!("pty {index}: {what}"), e)
}

/// Reads what both directions of pair `index` hold, through a master and
/// a slave descriptor (ferry's own copies). The termios is the same
/// afterwards; the queues are empty.
pub fn drain(index: u32, master: RawFd, slave: RawFd) -> Result<Queued> {
    let saved = tty::get_termios(master).map_err(|e| kerr(index, "reading termios", e))?;
    let output = drain_output(index, master)?;
    let result = drain_input(index, slave, &saved);
    // Set back whatever happened: the tree's termios must not change.
    tty::set_termios(master, &saved).map_err(|e| kerr(index, "setting termios back", e))?;
    let (lines, rest) = result?;
    Ok(Queued { lines, rest, output })
}

/// The master's unread bytes (FIONREAD says how many; a read of a
/// non-canonical master never blocks while they are there).
fn drain_output(index: u32, master: RawFd) -> Result<Vec<u8>> {
    let packet = tty::packet_mode(master).map_err(|e| kerr(index, "TIOCGPKT", e))?;
    let mut want = tty::readable(master).map_err(|e| kerr(index, "FIONREAD on the master", e))?;
    let mut out = Vec::with_capacity(want);
    let mut buf = vec![0u8; want + 1];
    while want > 0 {
        let n = tty::read(master, &mut buf).map_err(|e| kerr(index, "reading the master", e))?;
        if n == 0 {
            break;
        }
        // In packet mode every read starts with a status byte.
        let data = if packet && buf[0] == TIOCPKT_DATA { &buf[1..n] } else { &buf[..n] };
        want = want.saturating_sub(data.len());
        out.extend_from_slice(data);
    }
    Ok(out)
}

/// The slave's unread input: complete lines one read each while
/// canonical, then the rest with reads that never wait (VMIN = VTIME =
/// 0, non-canonical).
fn drain_input(index: u32, slave: RawFd, saved: &Termios2) -> Result<(Vec<Vec<u8>>, Vec<u8>)> {
    let mut lines = Vec::new();
    let mut buf = vec![0u8; 4096];
    if saved.c_lflag & libc::ICANON != 0 {
        loop {
            let n = tty::readable(slave).map_err(|e| kerr(index, "FIONREAD on the slave", e))?;
            if n == 0 {
                break;
            }
            if buf.len() < n {
                buf.resize(n, 0);
            }
            let got = tty::read(slave, &mut buf[..n])
                .map_err(|e| kerr(index, "reading a line from the slave", e))?;
            lines.push(buf[..got].to_vec());
        }
    }
    let mut now = *saved;
    now.c_lflag &= !libc::ICANON;
    now.c_cc[libc::VMIN] = 0;
    now.c_cc[libc::VTIME] = 0;
    tty::set_termios(slave, &now).map_err(|e| kerr(index, "non-blocking termios", e))?;
    let mut rest = Vec::new();
    loop {
        let n = tty::read(slave, &mut buf).map_err(|e| kerr(index, "reading the slave", e))?;
        if n == 0 {
            break;
        }
        rest.extend_from_slice(&buf[..n]);
    }
    Ok((lines, rest))
}

/// Puts `q` into pair `index`, whose termios is to be `want`: input with
/// echo, signals and input translation off (the bytes were processed
/// when they first arrived), lines ended as they were, then `want` set.
pub fn fill(index: u32, master: RawFd, slave: RawFd, want: &Termios2, q: &Queued) -> Result<()> {
    let quiet = quiet_termios(want);
    tty::set_termios(slave, &quiet).map_err(|e| kerr(index, "termios for the queues", e))?;
    let pushed = push_all(slave, master, want, q);
    tty::set_termios(slave, want).map_err(|e| kerr(index, "setting termios", e))?;
    pushed.map_err(|e| kerr(index, "putting the queued bytes back (TIOCSTI)", e))
}

fn push_all(slave: RawFd, master: RawFd, want: &Termios2, q: &Queued) -> ferry_sys::SysResult<()> {
    for line in &q.lines {
        tty::push_input(slave, &canonical_line(want, line))?;
    }
    tty::push_input(slave, &q.rest)?;
    tty::push_input(master, &q.output)
}

/// `want` with every processing of arriving bytes off but ICANON kept
/// (so line ends are marked again as they were).
pub fn quiet_termios(want: &Termios2) -> Termios2 {
    let mut t = *want;
    t.c_lflag &= !(libc::ECHO | libc::ECHONL | libc::ISIG | libc::IEXTEN);
    t.c_iflag &= !(libc::ICRNL
        | libc::INLCR
        | libc::IGNCR
        | libc::ISTRIP
        | libc::IUCLC
        | libc::IXON
        | libc::IXOFF
        | libc::BRKINT
        | libc::PARMRK
        | libc::INPCK);
    t
}

/// A line as a canonical read returned it, as bytes to push: a line that
/// does not end with a line end character was ended by VEOF (an empty one
/// is an end of file), which marks it so again.
pub fn canonical_line(t: &Termios2, line: &[u8]) -> Vec<u8> {
    let ends = [b'\n', t.c_cc[libc::VEOL], t.c_cc[libc::VEOL2]];
    match line.last() {
        Some(&c) if c != 0 && ends.contains(&c) => line.to_vec(),
        Some(b'\n') => line.to_vec(),
        _ => {
            let mut v = line.to_vec();
            v.push(t.c_cc[libc::VEOF]);
            v
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cooked() -> Termios2 {
        // SAFETY-free: plain data, zeroed then set like a default tty.
        let mut t: Termios2 = Termios2 {
            c_iflag: libc::ICRNL | libc::IXON,
            c_oflag: libc::OPOST | libc::ONLCR,
            c_cflag: libc::CS8 | libc::CREAD,
            c_lflag: libc::ICANON | libc::ECHO | libc::ISIG | libc::IEXTEN | libc::ECHONL,
            c_line: 0,
            c_cc: [0; 19],
            c_ispeed: 38400,
            c_ospeed: 38400,
        };
        t.c_cc[libc::VEOF] = 4;
        t
    }

    #[test]
    fn lines_keep_their_end_and_others_get_veof() {
        let t = cooked();
        assert_eq!(canonical_line(&t, b"ls\n"), b"ls\n");
        assert_eq!(canonical_line(&t, b"abc"), b"abc\x04");
        assert_eq!(canonical_line(&t, b""), b"\x04");
        // VEOL unset (0): a NUL at the end is data, ended by VEOF.
        assert_eq!(canonical_line(&t, b"a\0"), b"a\0\x04");
    }

    #[test]
    fn quiet_termios_keeps_canonical_mode_and_drops_echo_and_signals() {
        let q = quiet_termios(&cooked());
        assert_ne!(q.c_lflag & libc::ICANON, 0);
        assert_eq!(q.c_lflag & (libc::ECHO | libc::ISIG | libc::ECHONL | libc::IEXTEN), 0);
        assert_eq!(q.c_iflag & (libc::ICRNL | libc::IXON), 0);
        assert_eq!(q.c_oflag, cooked().c_oflag);
    }
}
