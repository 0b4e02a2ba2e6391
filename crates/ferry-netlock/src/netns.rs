//! Running code and commands inside the locked network namespace.

use crate::NetlockError;
use std::io::Write;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Which network namespace a lock applies to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Netns {
    /// The calling thread's network namespace.
    Current,
    /// An nsfs file: /proc/PID/ns/net, /run/netns/NAME, or a bind mount of one.
    Path(PathBuf),
}

impl Netns {
    /// The path that names this namespace from the calling thread.
    pub(crate) fn path(&self) -> PathBuf {
        match self {
            Netns::Current => PathBuf::from("/proc/thread-self/ns/net"),
            Netns::Path(p) => p.clone(),
        }
    }

    pub(crate) fn describe(&self) -> String {
        match self {
            Netns::Current => "current".to_string(),
            Netns::Path(p) => p.display().to_string(),
        }
    }
}

/// Inode of a namespace file (identifies the namespace).
pub(crate) fn inode(lock: &str, path: &Path) -> Result<u64, NetlockError> {
    std::fs::metadata(path).map(|m| m.ino()).map_err(|source| NetlockError::Io {
        lock: lock.to_string(),
        what: "reading network namespace",
        path: path.to_path_buf(),
        source,
    })
}

/// Why work could not start in another network namespace.
pub enum EnterError {
    /// Opening its nsfs file failed.
    Open(std::io::Error),
    /// setns failed.
    Enter(ferry_sys::SysError),
}

/// Runs `work` on a short-lived thread that has entered the namespace at
/// `path` (or on the calling thread when `path` is None: the current
/// namespace). setns moves only that thread, so the caller is unaffected;
/// a child it forks and a socket it makes start in that namespace.
/// `entering` turns a failure to enter into the caller's error.
pub fn run_in_namespace<T: Send, E: Send>(
    path: Option<&Path>,
    work: impl FnOnce() -> Result<T, E> + Send,
    entering: impl FnOnce(EnterError) -> E + Send,
) -> Result<T, E> {
    let Some(path) = path else {
        return work();
    };
    let ns = match std::fs::File::open(path) {
        Ok(ns) => ns,
        Err(e) => return Err(entering(EnterError::Open(e))),
    };
    if is_current(&ns) {
        // Already there: no thread to start.
        return work();
    }
    std::thread::scope(|scope| {
        let thread = scope.spawn(move || {
            if let Err(e) = ferry_sys::netns::enter_net_namespace(ns.as_fd()) {
                return Err(entering(EnterError::Enter(e)));
            }
            work()
        });
        match thread.join() {
            Ok(result) => result,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    })
}

/// True when `ns` is the calling thread's network namespace.
fn is_current(ns: &std::fs::File) -> bool {
    match (ns.metadata(), std::fs::metadata("/proc/thread-self/ns/net")) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// Runs `program args` with `input` on its stdin, in the calling thread's
/// namespace, and returns how it ended with its output.
pub fn output_with_input(
    program: &str,
    args: &[&str],
    input: &str,
) -> std::io::Result<std::process::Output> {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    if let Some(mut stdin) = child.stdin.take() {
        // A write error means the child exited early; its status and
        // stderr say why.
        let _ = stdin.write_all(input.as_bytes());
    }
    child.wait_with_output()
}

pub(crate) fn run_in<T: Send>(
    lock: &str,
    path: Option<&Path>,
    work: impl FnOnce() -> Result<T, NetlockError> + Send,
) -> Result<T, NetlockError> {
    run_in_namespace(path, work, |e| match e {
        EnterError::Open(source) => NetlockError::Io {
            lock: lock.to_string(),
            what: "opening network namespace",
            path: path.map(Path::to_path_buf).unwrap_or_default(),
            source,
        },
        EnterError::Enter(source) => NetlockError::Netns {
            lock: lock.to_string(),
            netns: path.map(|p| p.display().to_string()).unwrap_or_default(),
            source,
        },
    })
}

/// Runs `program args` in the namespace at `path` with `input` on its
/// stdin; an error carries the command line and its stderr.
pub(crate) fn run_command(
    lock: &str,
    path: Option<&Path>,
    program: &str,
    args: &[&str],
    input: &str,
) -> Result<(), NetlockError> {
    let command = format!("{program} {}", args.join(" "));
    run_in(lock, path, || {
        // The child is forked from this thread, so it starts in its namespace.
        let output = output_with_input(program, args, input).map_err(|source| {
            NetlockError::Spawn { lock: lock.to_string(), command: command.clone(), source }
        })?;
        if output.status.success() {
            Ok(())
        } else {
            Err(NetlockError::Command {
                lock: lock.to_string(),
                command: command.clone(),
                status: output.status.to_string(),
                stderr: String::from_utf8_lossy(&output.stderr).trim().to_string(),
            })
        }
    })
}
