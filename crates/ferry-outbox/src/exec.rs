//! Running code and commands inside the outbox's network namespace.

use crate::OutboxError;
use std::io::Write;
use std::os::fd::AsFd;
use std::path::Path;
use std::process::{Command, Stdio};

/// Runs `work` on a short-lived thread that entered the namespace at
/// `netns` (on the calling thread when None: the current namespace).
/// setns moves only that thread; sockets made there stay in the namespace.
pub(crate) fn run_in<T: Send>(
    context: &str,
    netns: Option<&Path>,
    work: impl FnOnce() -> Result<T, OutboxError> + Send,
) -> Result<T, OutboxError> {
    let Some(path) = netns else {
        return work();
    };
    let ns = std::fs::File::open(path).map_err(|source| OutboxError::Io {
        context: context.to_string(),
        what: "opening network namespace",
        path: path.to_path_buf(),
        source,
    })?;
    std::thread::scope(|scope| {
        let thread = scope.spawn(move || {
            ferry_sys::netns::enter_net_namespace(ns.as_fd())
                .map_err(|source| OutboxError::Sys { context: context.to_string(), source })?;
            work()
        });
        match thread.join() {
            Ok(result) => result,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    })
}

/// Runs `program args` in the namespace with `input` on its stdin; its
/// stdout on success, an error with the command line and stderr otherwise.
pub(crate) fn run_command(
    context: &str,
    netns: Option<&Path>,
    program: &str,
    args: &[&str],
    input: &str,
) -> Result<String, OutboxError> {
    let command = format!("{program} {}", args.join(" "));
    run_in(context, netns, || {
        let spawn_error = |source| OutboxError::Spawn {
            context: context.to_string(),
            command: command.clone(),
            source,
        };
        // Forked from this thread, the child starts in its namespace.
        let mut child = Command::new(program)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(spawn_error)?;
        if let Some(mut stdin) = child.stdin.take() {
            // A write error means the child exited early; its status and
            // stderr say why.
            let _ = stdin.write_all(input.as_bytes());
        }
        let output = child.wait_with_output().map_err(spawn_error)?;
        if output.status.success() {
            Ok(String::from_utf8_lossy(&output.stdout).into_owned())
        } else {
            Err(OutboxError::Command {
                context: context.to_string(),
                command: command.clone(),
                status: output.status.to_string(),
                stderr: String::from_utf8_lossy(&output.stderr).trim().to_string(),
            })
        }
    })
}
