//! The old root's PID comes free for the new root only once its parent
//! reaps the killed process (the restore waits 5 s for it). A parent that
//! leaves its children unreaped (a PID 1 that is no init, a stuck
//! supervisor) would make the restore after the kill fail, so it is
//! refused before the freeze: a parent that holds zombie children which
//! are still there a moment later.

use crate::error::ReplaceError;
use std::time::Duration;

/// How long a zombie child may wait for its parent before the parent
/// counts as one that does not reap.
const PATIENCE: Duration = Duration::from_millis(200);

pub fn check(pid: i32) -> Result<(), ReplaceError> {
    let Some((_, ppid, _)) = stat(pid) else {
        return Err(ReplaceError::NoSuchProcess(pid));
    };
    let before = zombie_children(ppid);
    if before.is_empty() {
        return Ok(());
    }
    std::thread::sleep(PATIENCE);
    let after = zombie_children(ppid);
    match before.iter().find(|z| after.contains(z)) {
        Some(&(z, _)) => {
            let comm = std::fs::read_to_string(format!("/proc/{ppid}/comm")).unwrap_or_default();
            Err(ReplaceError::Refused(format!(
                "pid {pid}: its parent {ppid} ({}) leaves its ended children unreaped (zombie {z}), so the old root's PID would not come free for the new one",
                comm.trim()
            )))
        }
        None => Ok(()),
    }
}

/// (state, ppid, start time) from /proc/PID/stat.
fn stat(pid: i32) -> Option<(char, i32, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&text)
}

fn parse_stat(text: &str) -> Option<(char, i32, u64)> {
    let rest: Vec<&str> = text[text.rfind(')')? + 1..].split_whitespace().collect();
    Some((rest.first()?.chars().next()?, rest.get(1)?.parse().ok()?, rest.get(19)?.parse().ok()?))
}

/// (pid, start time) of every zombie whose parent is `ppid`.
fn zombie_children(ppid: i32) -> Vec<(i32, u64)> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|p| match stat(p) {
            Some(('Z', parent, start)) if parent == ppid => Some((p, start)),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_read_after_the_name() {
        let line = "14009 (a) b) Z 1 14008 14008 0 -1 4194564 0 0 0 0 0 0 0 0 20 0 1 0 77 0 0";
        assert_eq!(parse_stat(line), Some(('Z', 1, 77)));
        assert_eq!(parse_stat("1 (x) S"), None);
    }
}
