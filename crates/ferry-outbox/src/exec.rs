//! Running code and commands inside the outbox's network namespace, with
//! the network lock's helpers (ferry_netlock::netns) and the outbox's
//! errors.

use crate::OutboxError;
use ferry_netlock::netns::{output_with_input, run_in_namespace, EnterError};
use std::path::Path;

/// Runs `work` on a short-lived thread that entered the namespace at
/// `netns` (on the calling thread when None: the current namespace).
pub(crate) fn run_in<T: Send>(
    context: &str,
    netns: Option<&Path>,
    work: impl FnOnce() -> Result<T, OutboxError> + Send,
) -> Result<T, OutboxError> {
    run_in_namespace(netns, work, |e| match e {
        EnterError::Open(source) => OutboxError::Io {
            context: context.to_string(),
            what: "opening network namespace",
            path: netns.map(Path::to_path_buf).unwrap_or_default(),
            source,
        },
        EnterError::Enter(source) => OutboxError::Sys { context: context.to_string(), source },
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
        // Forked from this thread, the child starts in its namespace.
        let output = output_with_input(program, args, input).map_err(|source| {
            OutboxError::Spawn { context: context.to_string(), command: command.clone(), source }
        })?;
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
