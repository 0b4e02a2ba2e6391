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

/// Runs `work` on a short-lived thread that has entered the namespace at
/// `path` (or on the calling thread when `path` is None: the current
/// namespace). setns moves only that thread, so the caller is unaffected.
pub(crate) fn run_in<T: Send>(
    lock: &str,
    path: Option<&Path>,
    work: impl FnOnce() -> Result<T, NetlockError> + Send,
) -> Result<T, NetlockError> {
    let Some(path) = path else {
        return work();
    };
    let ns = std::fs::File::open(path).map_err(|source| NetlockError::Io {
        lock: lock.to_string(),
        what: "opening network namespace",
        path: path.to_path_buf(),
        source,
    })?;
    std::thread::scope(|scope| {
        let thread = scope.spawn(move || {
            ferry_sys::netns::enter_net_namespace(ns.as_fd()).map_err(|source| {
                NetlockError::Netns {
                    lock: lock.to_string(),
                    netns: path.display().to_string(),
                    source,
                }
            })?;
            work()
        });
        match thread.join() {
            Ok(result) => result,
            Err(panic) => std::panic::resume_unwind(panic),
        }
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
        let spawn_error = |source| NetlockError::Spawn {
            lock: lock.to_string(),
            command: command.clone(),
            source,
        };
        // The child is forked from this thread, so it starts in its namespace.
        let mut child = Command::new(program)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(spawn_error)?;
        if let Some(mut stdin) = child.stdin.take() {
            // A write error means the child exited early; its status and
            // stderr below say why.
            let _ = stdin.write_all(input.as_bytes());
        }
        let output = child.wait_with_output().map_err(spawn_error)?;
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
