//! Starting the new binary as the old root was started: its working
//! directory, its environment (as it was at its exec, /proc/PID/environ),
//! its real uid, gid and supplementary groups, stdout and stderr
//! reopened from the old root's (a file, pipe or terminal; /dev/null for
//! anything else), stdin on /dev/null, in a session of its own. A filter
//! installed right before its exec hands every bind(2) to ferry.

use crate::error::ReplaceError;
use ferry_sys::seccomp_notify::{self, ExecCreds};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// The new binary, running, and the listener of its bind trap.
pub struct NewService {
    pub child: Child,
    pub pid: i32,
    pub pidfd: OwnedFd,
    pub notify: OwnedFd,
    pub path: PathBuf,
}

/// `path` as exec would find it, made absolute (symlinks kept: a
/// multi-call binary tells its name from them): a path with a slash
/// taken from ferry's working directory, a bare name searched in ferry's
/// PATH.
pub fn resolve(path: &str) -> Result<PathBuf, ReplaceError> {
    let missing = || ReplaceError::Option(format!("--exec {path}: no such executable file"));
    let found = if path.contains('/') {
        let cwd = std::env::current_dir()
            .map_err(|e| ReplaceError::Option(format!("--exec {path}: ferry's directory: {e}")))?;
        Some(cwd.join(path))
    } else {
        std::env::var_os("PATH").and_then(|p| {
            std::env::split_paths(&p).map(|d| d.join(path)).find(|c| is_executable(c))
        })
    };
    let found = found.ok_or_else(missing)?;
    if !is_executable(&found) {
        return Err(missing());
    }
    Ok(found)
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Uid, gid and groups of `pid` (its real ids) from /proc/PID/status.
fn creds_of(pid: i32) -> Result<ExecCreds, ReplaceError> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .map_err(|e| ReplaceError::Refused(format!("pid {pid}: reading its status: {e}")))?;
    let field = |name: &str| -> Vec<u32> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.split_whitespace().filter_map(|n| n.parse().ok()).collect())
            .unwrap_or_default()
    };
    let (uid, gid) = (field("Uid:"), field("Gid:"));
    match (uid.first(), gid.first()) {
        (Some(&uid), Some(&gid)) => Ok(ExecCreds { uid, gid, groups: field("Groups:") }),
        _ => Err(ReplaceError::Refused(format!("pid {pid}: no Uid/Gid in its status"))),
    }
}

/// NAME=VALUE pairs of a /proc/PID/environ.
pub fn parse_environ(raw: &[u8]) -> Vec<(String, String)> {
    raw.split(|&b| b == 0)
        .filter_map(|kv| {
            let kv = String::from_utf8_lossy(kv);
            let (k, v) = kv.split_once('=')?;
            (!k.is_empty()).then(|| (k.to_string(), v.to_string()))
        })
        .collect()
}

/// The old root's fd `fd` opened again for writing, or /dev/null.
fn reopened(pid: i32, fd: i32) -> Stdio {
    std::fs::OpenOptions::new()
        .append(true)
        .open(format!("/proc/{pid}/fd/{fd}"))
        .map_or_else(|_| Stdio::null(), Stdio::from)
}

/// Starts `path args` as the old root `old` was started, with the bind
/// trap. Its first syscalls run while this returns; its binds wait for
/// ferry's answer.
/// `path` is run with `arg0` as its argv[0] (the name the user gave).
pub fn start(
    old: i32,
    path: &Path,
    arg0: &str,
    args: &[String],
) -> Result<NewService, ReplaceError> {
    let refused = |what: &str, e: String| ReplaceError::Refused(format!("pid {old}: {what}: {e}"));
    let cwd = std::fs::read_link(format!("/proc/{old}/cwd"))
        .map_err(|e| refused("reading its working directory", e.to_string()))?;
    let environ = std::fs::read(format!("/proc/{old}/environ"))
        .map_err(|e| refused("reading its environment", e.to_string()))?;
    let creds = creds_of(old)?;
    let mut cmd = Command::new(path);
    std::os::unix::process::CommandExt::arg0(&mut cmd, arg0);
    cmd.args(args)
        .current_dir(&cwd)
        .env_clear()
        .envs(parse_environ(&environ))
        .stdin(Stdio::null())
        .stdout(reopened(old, 1))
        .stderr(reopened(old, 2));
    let shown = path.display();
    let sock =
        seccomp_notify::set_bind_trap(&mut cmd, seccomp_notify::bind_trap_program(), Some(creds))
            .map_err(|e| ReplaceError::Refused(format!("--exec {shown}: {e}")))?;
    let child = cmd
        .spawn()
        .map_err(|e| ReplaceError::Refused(format!("--exec {shown}: starting it failed: {e}")))?;
    let pid = child.id() as i32;
    let mut service = StartedChild(Some(child));
    let notify = seccomp_notify::take_listener(&sock)
        .map_err(|e| ReplaceError::Refused(format!("--exec {shown} (pid {pid}): {e}")))?;
    let pidfd = ferry_sys::pidfd::pidfd_open(pid)
        .map_err(|e| ReplaceError::Refused(format!("--exec {shown} (pid {pid}): {e}")))?;
    let child = service.0.take().ok_or_else(|| refused("starting", "no child".into()))?;
    Ok(NewService { child, pid, pidfd, notify, path: path.to_path_buf() })
}

/// Kills a child started here unless it is taken out.
struct StartedChild(Option<Child>);

impl Drop for StartedChild {
    fn drop(&mut self) {
        if let Some(c) = self.0.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl NewService {
    /// Ends the new binary and every process it started (by PID), for a
    /// replacement that does not go ahead. All are stopped first,
    /// parents before children, so that none forks meanwhile (a master
    /// that respawns its workers would outlive their kill).
    pub fn kill(mut self) {
        for _ in 0..2 {
            for p in ferry_engine::capture::running_tree(self.pid) {
                let _ = ferry_sys::process::kill(p, libc::SIGSTOP);
            }
        }
        for p in ferry_engine::capture::running_tree(self.pid) {
            let _ = ferry_sys::process::kill(p, libc::SIGKILL);
        }
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn environ_pairs_split_on_nul_and_the_first_equals_sign() {
        let raw = b"PATH=/bin:/usr/bin\0A=b=c\0EMPTY=\0junk\0=x\0";
        assert_eq!(
            parse_environ(raw),
            vec![
                ("PATH".to_string(), "/bin:/usr/bin".to_string()),
                ("A".to_string(), "b=c".to_string()),
                ("EMPTY".to_string(), String::new()),
            ]
        );
    }

    #[test]
    fn a_missing_executable_is_refused_by_name() {
        let e = resolve("/nonexistent/ferry-new-binary").expect_err("refused");
        assert!(e.to_string().contains("/nonexistent/ferry-new-binary"), "{e}");
        assert!(resolve("sh").is_ok_and(|p| p.is_absolute()));
        assert!(resolve("./ferry-no-such-file").is_err());
    }
}
