//! `ferry replace --pid PID --exec PATH [ARGS...]`: a new binary of a
//! stateless service takes over the old tree's listening sockets, without
//! the application's cooperation.
//!
//! 1. [`listeners`]: the old tree's TCP listeners, each duplicated
//!    (pidfd_getfd); what cannot be handed over is refused by name.
//! 2. [`spawn`]: the new binary started as the old root was, under a
//!    seccomp filter that hands each bind(2) to ferry.
//! 3. [`notify`]: a bind of an old listener's address gets that listener
//!    at its fd number and returns 0; other binds run. Until every
//!    listener is claimed (or the new binary exits, or the time runs
//!    out: then it is killed and the old tree was never touched). The
//!    last claiming bind waits for its answer until step 4 is done.
//! 4. [`takeover`]: the old tree frozen, its listener fds unregistered
//!    from its epoll sets and replaced by quiet listeners (unix sockets
//!    nothing connects to), let go: from here only the new binary
//!    accepts; the accept queues are the same sockets, so no SYN is
//!    lost. A freeze that fails fails the last bind and kills the new
//!    binary: the old tree was not changed.
//! 5. A forked answerer lets every later trapped bind run, for as long
//!    as the new binary lives (a filter cannot be removed, and without a
//!    listener its trapped calls would fail with ENOSYS).
//! 6. [`drain`]: the old tree serves its connections until their clients
//!    close them or the drain timeout passes, then it is stopped; a
//!    warden process stops it in ferry's place if ferry dies meanwhile.

mod drain;
mod listeners;
mod notify;
mod spawn;
mod takeover;

use crate::error::ReplaceError;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::time::Duration;

/// What `--exec` is asked for.
#[derive(Debug, Clone)]
pub struct ExecOptions {
    /// The new binary and its arguments (argv[1..]).
    pub path: String,
    pub args: Vec<String>,
    /// How long the new binary has to bind every address the old tree
    /// listens on.
    pub bind_timeout: Duration,
    /// How long the old tree serves its connections after the takeover.
    pub drain_timeout: Duration,
}

/// A replacement by a new binary, done.
#[derive(Debug, Clone)]
pub struct ExecReplaced {
    pub old_pid: i32,
    pub new_pid: i32,
    pub path: PathBuf,
    /// The addresses handed over.
    pub listeners: Vec<String>,
    /// ms from the new binary's start to its last claimed listener.
    pub claim_ms: f64,
    /// ms the old tree was frozen for the takeover.
    pub takeover_ms: f64,
    pub drained: drain::Drained,
}

impl ExecReplaced {
    /// The one line `ferry replace --exec` prints.
    pub fn line(&self) -> String {
        let d = &self.drained;
        let closed = d.at_start.saturating_sub(d.left);
        let mut line = format!(
            "replaced pid {} by pid {} ({}): listeners taken over {} ({}), drained in {:.1} s ({} connections closed by their peers",
            self.old_pid,
            self.new_pid,
            self.path.display(),
            self.listeners.len(),
            self.listeners.join(", "),
            d.seconds,
            closed
        );
        if d.left > 0 {
            line.push_str(&format!(", {} cut at the drain timeout", d.left));
        }
        line.push(')');
        line
    }
}

/// Hands the new binary's later binds to a process of their own and
/// lets it go: it runs on once ferry exits. Returns its PID.
fn keep_answering(new: spawn::NewService) -> Result<i32, ReplaceError> {
    let spawn::NewService { child, pid, notify, .. } = new;
    // Reaped by init (or a subreaper) once ferry exits; not waited for.
    drop(child);
    ferry_sys::seccomp_notify::spawn_continue_answerer(notify).map_err(|e| {
        ReplaceError::Takeover(format!(
            "starting the process that answers pid {pid}'s later binds: {e}; its binds will fail with ENOSYS"
        ))
    })?;
    Ok(pid)
}

/// Replaces the tree of `pid` by a new binary that takes over its
/// listeners. `progress` hears about the drain. Every error before the
/// takeover leaves the old tree untouched and the new binary killed.
pub fn replace_exec(
    pid: i32,
    opts: &ExecOptions,
    progress: &mut dyn FnMut(String),
) -> Result<ExecReplaced, ReplaceError> {
    let path = spawn::resolve(&opts.path)?;
    let old = listeners::take(pid)?;
    let t0 = std::time::Instant::now();
    let new = spawn::start(pid, &path, &opts.path, &opts.args)?;
    let last = match notify::claim_all(&new, &old, opts.bind_timeout) {
        Ok(last) => last,
        Err(e) => {
            new.kill();
            return Err(e);
        }
    };
    let claim_ms = t0.elapsed().as_secs_f64() * 1e3;
    let t1 = std::time::Instant::now();
    let taken = match takeover::take_away(pid, &old) {
        Ok(taken) => taken,
        // Nothing changed in the old tree: the new binary goes.
        Err(e @ ReplaceError::Refused(_)) => {
            last.fail(new.notify.as_fd());
            new.kill();
            return Err(e);
        }
        Err(e) => {
            let _ = last.succeed(new.notify.as_fd());
            keep_answering(new)?;
            return Err(e);
        }
    };
    let takeover_ms = t1.elapsed().as_secs_f64() * 1e3;
    let tid = last.tid();
    if !last.succeed(new.notify.as_fd()) {
        return Err(ReplaceError::Takeover(format!(
            "the new binary's thread {tid} went away in its last bind, after the old tree gave up its listeners"
        )));
    }
    // Before anything is told: a ferry killed from here on leaves the
    // old tree's end to the warden.
    let warden = drain::arm_warden(pid, opts.drain_timeout);
    let new_pid = keep_answering(new)?;
    tracing::info!(
        "replace --exec: {} listener fds of the old tree quieted, {} epoll registrations removed",
        taken.closed,
        taken.unregistered
    );
    progress(format!(
        "pid {new_pid} took over {} listener(s) in {claim_ms:.1} ms; the old tree was frozen {takeover_ms:.1} ms to give them up",
        old.len()
    ));
    let ports: Vec<u16> = old.iter().map(|l| l.local.port()).collect();
    let drained = drain::drain_and_stop(pid, &ports, opts.drain_timeout, warden, progress);
    Ok(ExecReplaced {
        old_pid: pid,
        new_pid,
        path,
        listeners: old.iter().map(|l| l.shown()).collect(),
        claim_ms,
        takeover_ms,
        drained,
    })
}
