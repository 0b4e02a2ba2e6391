//! Pseudo-terminal pairs of the image's `Ptys` section (format 4.6): a
//! new pair with the same index in the devpts that /dev/ptmx leads to
//! here, its termios, window size and modes, the slave node's owner and
//! mode, its queued bytes; its ends staged like any file. Once every
//! process exists, the session leader takes it as its controlling
//! terminal again and gives it its foreground group
//! ([`take_terminals`]).

use super::Builder;
use crate::error::{EngineError, Result};
use crate::pty_queues::{self, Queued};
use ferry_image::{PtyEnd, PtyPair, PtysImage, TreeImage};
use ferry_sys::tty::{self, Termios2};
use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;

/// The ends made so far of each pair, by index: the master (until its
/// description is placed) and the slave descriptions still to place.
#[derive(Default)]
pub(crate) struct Made {
    pairs: HashMap<u32, (Option<OwnedFd>, Vec<OwnedFd>)>,
}

/// The pty end file `id` is, if the image says it is one.
pub(crate) fn end_of(tree_ptys: Option<&PtysImage>, id: u64) -> Option<PtyEnd> {
    tree_ptys?.ends.iter().find(|e| e.file == id).copied()
}

/// The description of `end`, making its pair first when needed.
pub(crate) fn open(b: &mut Builder, ptys: &PtysImage, end: PtyEnd) -> Result<OwnedFd> {
    if !b.ptys.pairs.contains_key(&end.index) {
        let pair = ptys.pairs.iter().find(|p| p.index == end.index).ok_or_else(|| {
            EngineError::restore(b.pid, format!("pty {}: not in the image", end.index))
        })?;
        let slaves = ptys.ends.iter().filter(|e| e.index == end.index && !e.master).count();
        let made = make_pair(b.pid, pair, slaves)?;
        b.ptys.pairs.insert(end.index, made);
    }
    let (master, slaves) = b
        .ptys
        .pairs
        .get_mut(&end.index)
        .ok_or_else(|| EngineError::restore(b.pid, format!("pty {}: not made", end.index)))?;
    let fd = if end.master { master.take() } else { slaves.pop() };
    fd.ok_or_else(|| {
        EngineError::restore(b.pid, format!("pty {}: one end placed twice", end.index))
    })
}

fn termios(pair: &PtyPair) -> Termios2 {
    let t = &pair.termios;
    let mut cc = [0u8; 19];
    for (d, s) in cc.iter_mut().zip(&t.cc) {
        *d = *s;
    }
    Termios2 {
        c_iflag: t.iflag,
        c_oflag: t.oflag,
        c_cflag: t.cflag,
        c_lflag: t.lflag,
        c_line: t.line,
        c_cc: cc,
        c_ispeed: t.ispeed,
        c_ospeed: t.ospeed,
    }
}

/// A pair with `pair.index`, its `slaves` slave descriptions, every
/// recorded state set and the queues put back.
fn make_pair(pid: i32, pair: &PtyPair, slaves: usize) -> Result<(Option<OwnedFd>, Vec<OwnedFd>)> {
    let index = pair.index;
    let kerr = |what: &str, e| EngineError::kernel(pid, format!("pty {index}: {what}"), e);
    let master = master_with_index(pid, index)?;
    let m = master.as_raw_fd();
    tty::set_pty_locked(m, false).map_err(|e| kerr("unlocking", e))?;
    let path = format!("/dev/pts/{index}");
    let mut opened = Vec::with_capacity(slaves.max(1));
    for _ in 0..slaves.max(1) {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOCTTY | libc::O_CLOEXEC)
            .open(&path)
            .map_err(|e| EngineError::io(format!("pid {pid}: opening {path}"), e))?;
        opened.push(OwnedFd::from(f));
    }
    let s = opened[0].as_raw_fd();
    let q = Queued {
        lines: pair.input_lines.clone(),
        rest: pair.input_rest.clone(),
        output: pair.output.clone(),
    };
    pty_queues::fill(index, m, s, &termios(pair), &q)?;
    let [ws_row, ws_col, ws_xpixel, ws_ypixel] = pair.winsize;
    tty::set_winsize(m, &libc::winsize { ws_row, ws_col, ws_xpixel, ws_ypixel })
        .map_err(|e| kerr("TIOCSWINSZ", e))?;
    tty::set_packet_mode(m, pair.packet).map_err(|e| kerr("TIOCPKT", e))?;
    tty::set_exclusive(s, pair.exclusive).map_err(|e| kerr("TIOCEXCL", e))?;
    ferry_sys::fd::set_mode_owner(s, pair.slave_mode, pair.slave_uid, pair.slave_gid)
        .map_err(|e| kerr("mode and owner of the slave node", e))?;
    if pair.locked {
        tty::set_pty_locked(m, true).map_err(|e| kerr("locking", e))?;
    }
    opened.truncate(slaves);
    Ok((Some(master), opened))
}

/// Opens /dev/ptmx until the kernel hands out `index` (it gives the
/// lowest free one), holding the lower ones meanwhile.
fn master_with_index(pid: i32, index: u32) -> Result<OwnedFd> {
    let taken = format!("/dev/pts/{index}");
    if std::path::Path::new(&taken).exists() {
        return Err(EngineError::restore(
            pid,
            format!("pty {index}: {taken} exists here already (another pseudo-terminal has that number)"),
        ));
    }
    let mut lower = Vec::new();
    loop {
        let fd = tty::open_master(c"/dev/ptmx")
            .map_err(|e| EngineError::kernel(pid, format!("pty {index}: opening /dev/ptmx"), e))?;
        let got = tty::pty_index(fd.as_raw_fd())
            .map_err(|e| EngineError::kernel(pid, format!("pty {index}: TIOCGPTN"), e))?;
        if got == index {
            return Ok(fd);
        }
        if got > index || lower.len() > index as usize {
            return Err(EngineError::restore(
                pid,
                format!("pty {index}: /dev/ptmx gave {got}: that number is taken here"),
            ));
        }
        lower.push(fd);
    }
}

/// Each session leader takes its pair as controlling terminal again
/// (TIOCSCTTY, through a staged descriptor of the pair, which every
/// process still holds above temp_base) and sets the foreground group
/// (TIOCSPGRP, allowed since its own group is the foreground one now).
pub(crate) fn take_terminals(
    tree: &TreeImage,
    sessions: &mut [crate::restore::Session],
    staged: &HashMap<u64, RawFd>,
) -> Result<()> {
    let Some(ptys) = &tree.ptys else {
        return Ok(());
    };
    for pair in ptys.pairs.iter().filter(|p| p.session != 0) {
        let fd = ptys
            .ends
            .iter()
            .filter(|e| e.index == pair.index)
            .find_map(|e| staged.get(&e.file).copied())
            .ok_or_else(|| {
                EngineError::restore(pair.session, format!("pty {}: no end staged", pair.index))
            })?;
        let s = sessions.iter_mut().find(|s| s.pid == pair.session).ok_or_else(|| {
            EngineError::restore(
                pair.session,
                format!("pty {}: its session leader was not restored", pair.index),
            )
        })?;
        s.call("ioctl(TIOCSCTTY)", libc::SYS_ioctl, &[fd as u64, libc::TIOCSCTTY, 0])?;
        if pair.foreground != s.image.pgid {
            s.remote.write(s.data, &pair.foreground.to_ne_bytes())?;
            s.call("ioctl(TIOCSPGRP)", libc::SYS_ioctl, &[fd as u64, libc::TIOCSPGRP, s.data])?;
        }
    }
    Ok(())
}
