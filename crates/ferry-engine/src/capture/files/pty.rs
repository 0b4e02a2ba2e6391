//! Pseudo-terminal pairs whose master and slave the tree both holds (a
//! terminal server and its shell, sshd and a session): index, termios,
//! window size, packet/lock/exclusive modes, the slave node's owner and
//! mode, the session it controls and its foreground group, and the bytes
//! queued both ways (read out, put back if the tree runs on:
//! [`Drained`]). Terminals with an end outside the tree are refused by
//! name, or with `--external-stdio` left to `--tty-to` on fds 0-2.

use super::first_fd_of_each_file;
use crate::error::{EngineError, Result};
use crate::pty_queues::{self, Queued};
use ferry_image::{FdSlot, FileKind, OpenFile, PtyEnd, PtyPair, PtyTermios, PtysImage};
use ferry_sys::tty::{self, Termios2};
use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;

/// Major number of Unix98 pty slaves (/dev/pts/N).
const PTS_MAJOR: u32 = 136;

/// One process's files as the pty pass sees them (host PIDs).
pub(crate) struct PtyView<'a> {
    pub pid: i32,
    pub pidfd: &'a OwnedFd,
    pub files: &'a [OpenFile],
    pub fds: &'a [FdSlot],
}

/// The pairs of the tree, and their queues read out.
pub(crate) struct TreePtys {
    pub image: Option<PtysImage>,
    pub drained: Drained,
}

/// Queues read out of the running tree's pairs. Dropping it puts them
/// back (the tree runs on); [`Drained::forget`] once the tree is killed.
#[derive(Default)]
pub struct Drained {
    pairs: Vec<(u32, OwnedFd, OwnedFd, Termios2, Queued)>,
}

impl Drained {
    /// The tree was killed: nothing to put back.
    pub fn forget(&mut self) {
        self.pairs.clear();
    }
}

impl Drop for Drained {
    fn drop(&mut self) {
        for (index, m, s, t, q) in self.pairs.drain(..) {
            if q.is_empty() {
                continue;
            }
            if let Err(e) = pty_queues::fill(index, m.as_raw_fd(), s.as_raw_fd(), &t, &q) {
                tracing::warn!("putting back the queued bytes of pty {index}: {e}");
            }
        }
    }
}

/// A terminal file of the tree and where one fd of it is.
struct Seen {
    pid: i32,
    fd: i32,
    path: String,
    id: u64,
    /// (index, master) for a pty end.
    pty: Option<(u32, bool)>,
    /// Every fd of the file is 0, 1 or 2 in every process holding it.
    stdio_only: bool,
}

/// Every terminal description of the tree, once.
fn terminals(procs: &[PtyView]) -> Result<Vec<Seen>> {
    let mut seen: BTreeMap<u64, Seen> = BTreeMap::new();
    for p in procs {
        let first = first_fd_of_each_file(p.fds);
        for (i, f) in p.files.iter().enumerate() {
            let FileKind::Terminal { path } = &f.kind else { continue };
            let stdio_only = p.fds.iter().filter(|s| s.file == i as u32).all(|s| s.fd <= 2);
            if let Some(s) = seen.get_mut(&f.id) {
                s.stdio_only &= stdio_only;
                continue;
            }
            let Some(&fd) = first.get(&(i as u32)) else { continue };
            let pty = pty_end(p.pid, fd, path)?;
            seen.insert(
                f.id,
                Seen { pid: p.pid, fd, path: path.clone(), id: f.id, pty, stdio_only },
            );
        }
    }
    Ok(seen.into_values().collect())
}

/// (index, master) of a pty end, None for another terminal.
fn pty_end(pid: i32, fd: i32, path: &str) -> Result<Option<(u32, bool)>> {
    if path == "/dev/ptmx" || path.ends_with("/pts/ptmx") {
        let p = format!("/proc/{pid}/fdinfo/{fd}");
        let info = crate::procfs::read_string(&p)?;
        let index = crate::procfs::key_values(&info).get("tty-index").and_then(|v| v.parse().ok());
        return Ok(index.map(|i| (i, true)));
    }
    let p = format!("/proc/{pid}/fd/{fd}");
    let rdev = std::fs::metadata(&p).map_err(|e| EngineError::io(&p, e))?.rdev();
    if path.starts_with("/dev/pts/") && libc::major(rdev) == PTS_MAJOR {
        return Ok(Some((libc::minor(rdev), false)));
    }
    Ok(None)
}

/// The pty pass over the frozen tree: checks every terminal, captures
/// each pair, reads its queues last. `leaders` are (pid, session, pgrp)
/// of the tree's processes.
pub(crate) fn capture_tree(
    procs: &[PtyView],
    leaders: &[(i32, i32, i32)],
    external_stdio: bool,
) -> Result<TreePtys> {
    let seen = terminals(procs)?;
    let mut by_index: BTreeMap<u32, (Option<&Seen>, Vec<&Seen>)> = BTreeMap::new();
    for s in &seen {
        if let Some((index, master)) = s.pty {
            let e = by_index.entry(index).or_default();
            if master {
                e.0 = Some(s);
            } else {
                e.1.push(s);
            }
        }
    }
    for s in &seen {
        let paired = s.pty.is_some_and(|(i, _)| {
            by_index.get(&i).is_some_and(|(m, sl)| m.is_some() && !sl.is_empty())
        });
        if !(paired || (external_stdio && s.stdio_only)) {
            return Err(refusal(s));
        }
    }
    check_ctty_outside(procs, leaders, &by_index, external_stdio)?;
    let mut image = PtysImage::default();
    let mut drained = Drained::default();
    let mut opened = Vec::new();
    for (&index, (master, slaves)) in &by_index {
        let (Some(m), Some(s0)) = (master, slaves.first()) else { continue };
        let (pair, mfd, sfd) = capture_pair(procs, index, m, s0, leaders)?;
        image.ends.push(PtyEnd { file: m.id, index, master: true });
        image.ends.extend(slaves.iter().map(|s| PtyEnd { file: s.id, index, master: false }));
        image.pairs.push(pair);
        opened.push((index, mfd, sfd));
    }
    // Last: reading takes the bytes, and every refusal above left them.
    for ((index, m, s), pair) in opened.into_iter().zip(image.pairs.iter_mut()) {
        let t = tty::get_termios(m.as_raw_fd())
            .map_err(|e| EngineError::kernel(0, format!("pty {index}: TCGETS2"), e))?;
        let q = pty_queues::drain(index, m.as_raw_fd(), s.as_raw_fd());
        let q = q?;
        pair.input_lines = q.lines.clone();
        pair.input_rest = q.rest.clone();
        pair.output = q.output.clone();
        drained.pairs.push((index, m, s, t, q));
    }
    let image = (!image.pairs.is_empty()).then_some(image);
    Ok(TreePtys { image, drained })
}

fn refusal(s: &Seen) -> EngineError {
    let why = match s.pty {
        Some((i, true)) => format!("the master of pty {i}, whose slave /dev/pts/{i} no process of the tree holds"),
        Some((i, false)) => format!("pty slave {i}, whose master no process of the tree holds (a terminal outside the tree)"),
        None => "a terminal that is not a pseudo-terminal of the tree".to_string(),
    };
    EngineError::unsupported(
        s.pid,
        format!("fd {} ({})", s.fd, s.path),
        format!("{why}; `checkpoint --external-stdio` replaces such a terminal on fds 0-2 by the --tty-to file at restore"),
    )
}

/// A session leader of the tree whose controlling terminal is not a pair
/// of the tree would come back without it.
fn check_ctty_outside(
    procs: &[PtyView],
    leaders: &[(i32, i32, i32)],
    pairs: &BTreeMap<u32, (Option<&Seen>, Vec<&Seen>)>,
    external_stdio: bool,
) -> Result<()> {
    for p in procs {
        if !leaders.iter().any(|&(pid, sid, _)| pid == p.pid && sid == p.pid) {
            continue;
        }
        let tty_nr = crate::procfs::Stat::read(p.pid)?.field(7) as u32;
        if tty_nr == 0 {
            continue;
        }
        let (major, minor) = ((tty_nr >> 8) & 0xfff, (tty_nr & 0xff) | ((tty_nr >> 12) & 0xfff00));
        let ours = major == PTS_MAJOR
            && pairs.get(&minor).is_some_and(|(m, s)| m.is_some() && !s.is_empty());
        if !ours && !external_stdio {
            return Err(EngineError::unsupported(
                p.pid,
                format!("its controlling terminal (device {major}:{minor})"),
                "the session it leads has a terminal that is not a pseudo-terminal pair of the tree; `checkpoint --external-stdio` lets it come back without one",
            ));
        }
    }
    Ok(())
}

/// One pair's state (queues apart), with ferry's own copies of both ends.
fn capture_pair(
    procs: &[PtyView],
    index: u32,
    m: &Seen,
    s: &Seen,
    leaders: &[(i32, i32, i32)],
) -> Result<(PtyPair, OwnedFd, OwnedFd)> {
    let dup = |e: &Seen| -> Result<OwnedFd> {
        let pidfd = procs.iter().find(|p| p.pid == e.pid).map(|p| p.pidfd).ok_or_else(|| {
            EngineError::restore(e.pid, format!("fd {}: its process was not surveyed", e.fd))
        })?;
        ferry_sys::pidfd::pidfd_getfd(pidfd, e.fd)
            .map_err(|err| EngineError::kernel(e.pid, format!("duplicating fd {}", e.fd), err))
    };
    let (mfd, sfd) = (dup(m)?, dup(s)?);
    let kerr =
        |what: &str, e| EngineError::kernel(m.pid, format!("fd {} (pty {index}): {what}", m.fd), e);
    let raw = mfd.as_raw_fd();
    let t = tty::get_termios(raw).map_err(|e| kerr("TCGETS2", e))?;
    let w = tty::get_winsize(raw).map_err(|e| kerr("TIOCGWINSZ", e))?;
    let path = format!("/proc/{}/fd/{}", s.pid, s.fd);
    let node = std::fs::metadata(&path).map_err(|e| EngineError::io(&path, e))?;
    let session = match tty::session_of(raw) {
        Ok(sid) => sid,
        Err(e) if e.errno == libc::ENOTTY => 0,
        Err(e) => return Err(kerr("TIOCGSID", e)),
    };
    let foreground = if session == 0 {
        0
    } else {
        tty::foreground_group(raw).map_err(|e| kerr("TIOCGPGRP", e))?
    };
    check_session(m, index, session, foreground, leaders)?;
    let pair = PtyPair {
        index,
        termios: PtyTermios {
            iflag: t.c_iflag,
            oflag: t.c_oflag,
            cflag: t.c_cflag,
            lflag: t.c_lflag,
            line: t.c_line,
            cc: t.c_cc.to_vec(),
            ispeed: t.c_ispeed,
            ospeed: t.c_ospeed,
        },
        winsize: [w.ws_row, w.ws_col, w.ws_xpixel, w.ws_ypixel],
        packet: tty::packet_mode(raw).map_err(|e| kerr("TIOCGPKT", e))?,
        locked: tty::pty_locked(raw).map_err(|e| kerr("TIOCGPTLCK", e))?,
        exclusive: tty::exclusive(sfd.as_raw_fd()).map_err(|e| kerr("TIOCGEXCL", e))?,
        slave_mode: node.mode() & 0o7777,
        slave_uid: node.uid(),
        slave_gid: node.gid(),
        session,
        foreground,
        ..Default::default()
    };
    Ok((pair, mfd, sfd))
}

/// The session a pair controls must be led by a process of the tree (only
/// its leader can take the terminal again), and its foreground group must
/// be a group of the tree.
fn check_session(
    m: &Seen,
    index: u32,
    session: i32,
    fg: i32,
    leaders: &[(i32, i32, i32)],
) -> Result<()> {
    if session == 0 {
        return Ok(());
    }
    let obj = || format!("fd {} (pty {index})", m.fd);
    if !leaders.iter().any(|&(pid, sid, _)| pid == session && sid == session) {
        return Err(EngineError::unsupported(m.pid, obj(), format!("the controlling terminal of session {session}, whose leader is not in the tree (only a session's leader can take its terminal again)")));
    }
    if !leaders.iter().any(|&(_, sid, pgrp)| pgrp == fg && sid == session) {
        return Err(EngineError::unsupported(m.pid, obj(), format!("its foreground process group {fg} has no live process of the tree in session {session}")));
    }
    Ok(())
}
