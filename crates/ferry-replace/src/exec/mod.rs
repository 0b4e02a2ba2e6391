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
//!    out: then it is killed and the old tree was never touched).
//! 4. A forked answerer lets every later trapped bind run, for as long
//!    as the new binary lives (a filter cannot be removed, and without a
//!    listener its trapped calls would fail with ENOSYS).
//! 5. [`takeover`]: the old tree frozen, its listener fds unregistered
//!    from its epoll sets and replaced by quiet listeners (unix sockets
//!    nothing connects to), let go: from here only the new
//!    binary accepts; the accept queues are the same sockets, so no SYN
//!    is lost.
//! 6. [`drain`]: the old tree serves its connections until their clients
//!    close them or the drain timeout passes, then it is stopped.

mod drain;
mod listeners;
mod notify;
mod spawn;
mod takeover;

use crate::error::ReplaceError;
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
    if let Err(e) = notify::claim_all(&new, &old, opts.bind_timeout) {
        new.kill();
        return Err(e);
    }
    let claim_ms = t0.elapsed().as_secs_f64() * 1e3;
    let spawn::NewService { child, pid: new_pid, notify: listener, .. } = new;
    // Reaped by init once ferry exits; not waited for here.
    drop(child);
    ferry_sys::seccomp_notify::spawn_continue_answerer(listener).map_err(|e| {
        ReplaceError::Takeover(format!(
            "starting the process that answers pid {new_pid}'s later binds: {e}; the new binary runs beside the old tree"
        ))
    })?;
    let t1 = std::time::Instant::now();
    let taken = takeover::take_away(pid, &old)?;
    let takeover_ms = t1.elapsed().as_secs_f64() * 1e3;
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
    let drained = drain::drain_and_stop(pid, &ports, opts.drain_timeout, progress);
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
