//! The checkpoint guard: a small process, forked by ferry before it
//! touches the tree, that puts the service back if ferry dies in the
//! middle (SIGKILL, a crash, the OOM killer).
//!
//! While ferry works it tells the guard, one line at a time over a pipe,
//! what it changed: each thread's signal mask before it was blocked
//! (`mask TID HEX`), each thread's CPU mask before it was kept on
//! ferry's CPU for the injected calls (`cpus TID HEX,HEX...`), each
//! socket put into TCP repair mode (`repair PID
//! FD`), the network lock (`lock NAME`), and when the tree is about to be
//! killed (`killed`). ferry ends every normal run, success or error, with
//! `done` (its own cleanup ran); the guard then just exits. If the pipe
//! closes without `done`, ferry died, and the guard:
//! - takes every repaired socket out of repair mode (through a duplicate
//!   taken with pidfd_getfd), so the connections run again;
//! - releases the network lock, or, when the tree was already being
//!   killed, hands it over to the image as a finished checkpoint would;
//! - seizes each thread again and gives it back its signal mask;
//! - gives each thread told of by `cpus` its CPU mask back.
//!
//! The guard lives in a session of its own, so a signal meant for ferry's
//! terminal or process group does not reach it.
//!
//! A command that captures many times (`ferry replicate`, a sync every few
//! milliseconds) keeps one guard for all of them ([`keep`]): `done` ends
//! one capture's plan and the guard waits for the next. A fork per capture
//! cost a sync about a fifth of its CPU time (the fork, the child's exit,
//! and the copy-on-write faults ferry then takes on its own memory).

use crate::error::{EngineError, Result};
use std::io::{BufRead, Write};
use std::os::fd::{AsRawFd, OwnedFd};

/// A pipe's capacity as the kernel makes it (16 pages).
const PIPE_DEFAULT: usize = 64 << 10;

/// ferry's end of the guard: dropping it ends the guard's watch of this
/// capture.
pub struct Guard {
    pid: i32,
    pipe: Option<std::fs::File>,
    /// The guard stays for the next capture ([`keep`]).
    kept: bool,
}

/// The guard [`keep`] forked, between captures.
static KEPT: std::sync::Mutex<Option<(i32, std::fs::File)>> = std::sync::Mutex::new(None);

fn kept() -> std::sync::MutexGuard<'static, Option<(i32, std::fs::File)>> {
    KEPT.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Forks one guard now for every later capture of this process, until
/// the returned value is dropped. Call it early, while the process is
/// small and single-threaded: the guard holds a copy of its memory as it
/// is now. Should this process die, the guard ends with it (its pipe
/// closes), putting back what a capture under way had changed.
pub fn keep() -> Result<KeptGuard> {
    let mut k = kept();
    if k.is_none() {
        let (pid, mut pipe) = fork_guard()?;
        pipe.write_all(b"keep\n").map_err(|e| EngineError::io("the checkpoint guard's pipe", e))?;
        *k = Some((pid, pipe));
    }
    Ok(KeptGuard(()))
}

/// Ends the kept guard when dropped (between captures).
pub struct KeptGuard(());

impl Drop for KeptGuard {
    fn drop(&mut self) {
        if let Some((pid, pipe)) = kept().take() {
            drop(pipe);
            ferry_sys::process::wait_child(pid);
        }
    }
}

/// Forks a guard. ferry must be single-threaded here: the fork refuses
/// (EBUSY) otherwise.
fn fork_guard() -> Result<(i32, std::fs::File)> {
    let (r, w) = ferry_sys::fd::pipe2(libc::O_CLOEXEC)
        .map_err(|e| EngineError::kernel(0, "creating the guard's pipe", e))?;
    // The capture has not started any thread yet; the child only runs
    // `watch`, which makes its own file descriptors.
    let pid = ferry_sys::clone::fork_into_namespaces(0)
        .map_err(|e| EngineError::kernel(0, "forking the checkpoint guard", e))?;
    if pid == 0 {
        drop(w);
        watch(r);
    }
    drop(r);
    Ok((pid, std::fs::File::from(w)))
}

impl Guard {
    /// The kept guard when there is one, else a guard forked for this
    /// capture alone.
    pub fn start() -> Result<Guard> {
        if let Some((pid, pipe)) = kept().take() {
            return Ok(Guard { pid, pipe: Some(pipe), kept: true });
        }
        let (pid, pipe) = fork_guard()?;
        Ok(Guard { pid, pipe: Some(pipe), kept: false })
    }

    fn say(&mut self, line: &str) {
        // A guard that is gone cannot help; the checkpoint goes on.
        if let Some(p) = &mut self.pipe {
            if p.write_all(line.as_bytes()).is_err() {
                self.pipe = None;
            }
        }
    }

    pub fn mask(&mut self, tid: i32, mask: u64) {
        self.say(&format!("mask {tid} {mask:x}\n"));
    }
    /// Thread `tid`'s CPU mask, about to be narrowed for a while.
    pub fn cpus(&mut self, tid: i32, cpus: &[u64]) {
        let words: Vec<String> = cpus.iter().map(|w| format!("{w:x}")).collect();
        self.say(&format!("cpus {tid} {}\n", words.join(",")));
    }
    /// Sockets about to enter repair mode, as (pid, fd, SO_REUSEADDR):
    /// leaving repair mode clears SO_REUSEADDR. One write for all of them,
    /// into a pipe grown to hold it: 10,000 connections are 200 KB, and
    /// with the pipe's 64 KiB ferry waited, in the pause, for the guard
    /// to read and parse them (77 ms on a loaded host). What is in the
    /// pipe reaches the guard even if ferry dies right after the write.
    pub fn repair(&mut self, socks: &[(i32, i32, bool)]) {
        let mut lines = String::with_capacity(socks.len() * 24);
        for (pid, fd, reuse) in socks {
            lines.push_str(&format!("repair {pid} {fd} {}\n", *reuse as u8));
        }
        // Room for the message and what the guard has not read yet;
        // refused (over fs.pipe-max-size), the write waits as before.
        let size = (lines.len() + PIPE_DEFAULT).next_power_of_two();
        if let Some(p) = self.pipe.as_ref().filter(|_| size > PIPE_DEFAULT) {
            let size = libc::c_long::try_from(size).unwrap_or(libc::c_long::MAX);
            let grown = ferry_sys::fd::fcntl_int(p.as_raw_fd(), libc::F_SETPIPE_SZ, size, "fcntl");
            if let Err(e) = grown {
                tracing::debug!("the guard's pipe keeps its size: F_SETPIPE_SZ: {e:?}");
            }
        }
        self.say(&lines);
    }
    pub fn lock(&mut self, name: &str) {
        self.say(&format!("lock {name}\n"));
    }
    /// The tree is being killed: from here a lost ferry means a finished
    /// checkpoint whose lock must wait for the restore.
    pub fn killed(&mut self) {
        self.say("killed\n");
    }
}

impl Guard {
    /// Ends this capture's watch as dropping the guard does, without
    /// waiting for a guard forked for this capture alone to exit (the
    /// teardown of its copy of ferry's memory, most of a millisecond):
    /// its PID is returned for the caller to reap once the pause is over
    /// ([`crate::held_memory::HeldMemory::reap_guard`]).
    pub fn end_unreaped(mut self) -> Option<i32> {
        self.say("done\n");
        let pid = std::mem::replace(&mut self.pid, 0);
        match self.pipe.take() {
            Some(pipe) if self.kept => {
                *kept() = Some((pid, pipe));
                None
            }
            _ => Some(pid),
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        // Ended by [`Guard::end_unreaped`].
        if self.pid == 0 {
            return;
        }
        self.say("done\n");
        match self.pipe.take() {
            Some(pipe) if self.kept => *kept() = Some((self.pid, pipe)),
            _ => ferry_sys::process::wait_child(self.pid),
        }
    }
}

#[derive(Default)]
struct Plan {
    masks: Vec<(i32, u64)>,
    cpus: Vec<(i32, Vec<u64>)>,
    repaired: Vec<(i32, i32, bool)>,
    lock: Option<String>,
    killed: bool,
    done: bool,
    /// Kept for later captures ([`keep`]): `done` ends one capture's plan.
    kept: bool,
}

fn parse(plan: &mut Plan, line: &str) {
    let mut w = line.split_whitespace();
    match (w.next(), w.next(), w.next()) {
        (Some("mask"), Some(tid), Some(mask)) => {
            if let (Ok(t), Ok(m)) = (tid.parse(), u64::from_str_radix(mask, 16)) {
                plan.masks.push((t, m));
            }
        }
        (Some("cpus"), Some(tid), Some(words)) => {
            let words: std::result::Result<Vec<u64>, _> =
                words.split(',').map(|w| u64::from_str_radix(w, 16)).collect();
            if let (Ok(t), Ok(w)) = (tid.parse(), words) {
                plan.cpus.push((t, w));
            }
        }
        (Some("repair"), Some(pid), Some(fd)) => {
            if let (Ok(p), Ok(f)) = (pid.parse(), fd.parse()) {
                plan.repaired.push((p, f, w.next() == Some("1")));
            }
        }
        (Some("lock"), Some(name), None) => plan.lock = Some(name.to_string()),
        (Some("killed"), None, None) => plan.killed = true,
        (Some("done"), None, None) => plan.done = true,
        (Some("keep"), None, None) => plan.kept = true,
        _ => {}
    }
}

/// The guard process: read until ferry disappears; put back what the
/// capture under way (since the last `done`) changed, if any.
fn watch(pipe: OwnedFd) -> ! {
    ferry_sys::process::detach_from_caller(pipe.as_raw_fd());
    let mut plan = Plan::default();
    let reader = std::io::BufReader::new(std::fs::File::from(pipe));
    for line in reader.lines() {
        let Ok(line) = line else { break };
        parse(&mut plan, &line);
        if plan.done && !plan.kept {
            // Without waiting for the pipe's end: a child ferry forks
            // later may hold it open.
            std::process::exit(0)
        }
        if plan.done {
            plan = Plan { kept: true, ..Plan::default() };
        }
    }
    recover(&plan);
    std::process::exit(0)
}

fn recover(plan: &Plan) {
    for &(pid, fd, reuse) in &plan.repaired {
        let Ok(pidfd) = ferry_sys::pidfd::pidfd_open(pid) else {
            continue;
        };
        if let Ok(sock) = ferry_sys::pidfd::pidfd_getfd(&pidfd, fd) {
            let _ = crate::tcp_repair::leave_repair(sock.as_raw_fd(), reuse);
        }
    }
    if let Some(name) = &plan.lock {
        if plan.killed {
            if let Ok(lock) = ferry_netlock::NetworkLock::adopt(name) {
                lock.hand_over();
            }
        } else {
            let _ = ferry_netlock::release(name);
        }
    }
    for (tid, cpus) in &plan.cpus {
        let _ = ferry_sys::process::set_affinity(*tid, cpus);
    }
    for &(tid, mask) in &plan.masks {
        ferry_sys::ptrace::put_back_sigmask(tid, mask);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 10,000 sockets told to a guard that reads nothing meanwhile: the
    /// write does not wait for it (the write end does not block, so a
    /// pipe too small fails the write), and every line arrives.
    #[test]
    fn ten_thousand_repaired_sockets_are_told_without_waiting_for_the_guard() {
        let (r, w) = ferry_sys::fd::pipe2(libc::O_CLOEXEC | libc::O_NONBLOCK).expect("pipe");
        // Never dropped: there is no guard process to end.
        let mut g = std::mem::ManuallyDrop::new(Guard {
            pid: 0,
            pipe: Some(std::fs::File::from(w)),
            kept: false,
        });
        let socks: Vec<(i32, i32, bool)> =
            (0..10_000).map(|fd| (12345, fd + 3, fd % 2 == 0)).collect();
        g.repair(&socks);
        let pipe = g.pipe.take();
        assert!(pipe.is_some(), "the write did not fit the pipe");
        drop(pipe);
        let mut plan = Plan::default();
        for line in std::io::BufReader::new(std::fs::File::from(r)).lines() {
            parse(&mut plan, &line.expect("read"));
        }
        assert_eq!(plan.repaired.len(), 10_000);
        assert_eq!(plan.repaired[9_999], (12345, 10_002, false));
    }

    #[test]
    fn parses_the_protocol_and_ignores_garbage() {
        let mut p = Plan::default();
        for l in [
            "mask 12 fffe",
            "repair 12 7 1",
            "repair 12 8 0",
            "lock ckpt_1_2",
            "bogus",
            "mask x y",
            "cpus 12 3,0",
            "cpus 13 zz",
            "killed",
        ] {
            parse(&mut p, l);
        }
        assert_eq!(p.masks, vec![(12, 0xfffe)]);
        assert_eq!(p.cpus, vec![(12, vec![3, 0])]);
        assert_eq!(p.repaired, vec![(12, 7, true), (12, 8, false)]);
        assert_eq!(p.lock.as_deref(), Some("ckpt_1_2"));
        assert!(p.killed && !p.done);
        parse(&mut p, "done");
        assert!(p.done && !p.kept);
        parse(&mut p, "keep");
        assert!(p.kept);
    }
}
