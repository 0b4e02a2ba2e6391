//! The old tree's PIDs come free for the new tree only once the killed
//! processes are reaped (the restore waits 5 s for them): the root by its
//! parent, every other process, orphaned when its parent in the tree dies,
//! by the nearest child subreaper above it or init. A reaper that leaves
//! its children unreaped (a PID 1 that is no init, a stuck supervisor)
//! would make the restore after the kill fail, so it is refused before
//! the freeze: one that holds zombie children still there a moment later.
//! Which ancestor adopts orphans cannot be read from outside (the
//! subreaper flag is not in /proc), so for a tree of several processes
//! every ancestor of the root counts.
//!
//! A reaper with no zombie at that moment shows nothing, and one that
//! reaps only now and then (a PID 1 that polls: 1.5-1.9 s on the test
//! VM) would stretch the pause by that much, or fail the restore after
//! the kill once it takes more than the restore's 5 s. So ferry also
//! makes an orphan of its own: when the process that adopts it is one of
//! the tree's reapers, how long that orphan stays a zombie is how long
//! the old tree's would.

use crate::error::ReplaceError;
use std::collections::HashMap;
use std::time::Duration;

/// How long a zombie child may wait for its parent before the parent
/// counts as one that does not reap.
const PATIENCE: Duration = Duration::from_millis(200);

/// (state, ppid, start time) of a process.
type Stat = (char, i32, u64);

pub fn check(pid: i32) -> Result<(), ReplaceError> {
    let Some((_, ppid, _)) = stat(pid) else {
        return Err(ReplaceError::NoSuchProcess(pid));
    };
    let table = all_stats();
    let reapers = if has_children(pid) { ancestors(ppid, &table) } else { vec![ppid] };
    let mut before = zombies_of(&reapers, &table);
    // Ferry's own orphans from earlier checks, left to a reaper that
    // reaps only the children it knows (a test harness): not the tree's.
    // So are the holders of earlier replacements' old memory.
    before.retain(|&(z, _)| {
        let c = comm(z);
        c != ferry_sys::orphan::ORPHAN_COMM && c != ferry_engine::held_memory::HOLDER_COMM
    });
    if before.is_empty() {
        return probe(pid, &reapers);
    }
    std::thread::sleep(PATIENCE);
    let after = zombies_of(&reapers, &all_stats());
    match before.iter().find(|z| after.contains(z)) {
        Some(&(z, reaper)) => {
            let comm = comm(reaper);
            let whose = if reaper == ppid {
                "the old root's PID"
            } else {
                "the PIDs of the old tree's other processes, orphaned by the kill,"
            };
            Err(ReplaceError::Refused(format!(
                "pid {pid}: {reaper} ({}), which would reap the killed tree, leaves its ended children unreaped (zombie {z}, {}), so {whose} would not come free for the new tree",
                comm,
                self::comm(z)
            )))
        }
        None => Ok(()),
    }
}

/// When init is one of `reapers`: makes an orphan
/// ([`ferry_sys::orphan::spawn_orphan`]) and, if init adopts it, refuses the
/// tree when its zombie is still there [`PATIENCE`] after it ended. Only
/// init is probed: an init reaps every child alike, while a supervisor
/// or a test harness (a child subreaper) may reap only the children it
/// knows, the tree's among them, and never this stranger. An orphan
/// adopted by another process (ferry runs under a subreaper of its own)
/// tells nothing about init: no refusal.
fn probe(pid: i32, reapers: &[i32]) -> Result<(), ReplaceError> {
    const INIT: i32 = 1;
    if !reapers.contains(&INIT) {
        return Ok(());
    }
    let Ok(orphan) = ferry_sys::orphan::spawn_orphan() else { return Ok(()) };
    let Some(reaper) = stat(orphan).map(|(_, parent, _)| parent).filter(|&r| r == INIT) else {
        return Ok(());
    };
    let gone = |o| stat(o).is_none_or(|(state, parent, _)| parent != reaper && state != 'Z');
    let t = std::time::Instant::now();
    // The orphan ends once adopted; then the reaper has PATIENCE.
    while !gone(orphan) && t.elapsed() < PATIENCE + Duration::from_millis(50) {
        std::thread::sleep(Duration::from_millis(1));
    }
    if gone(orphan) {
        return Ok(());
    }
    Err(ReplaceError::Refused(format!(
        "pid {pid}: {reaper} ({}), which would reap the killed tree, left an ended orphan of ferry's (pid {orphan}) unreaped for {} ms, so the old tree's PIDs would come free that late or not at all, inside the pause",
        comm(reaper),
        t.elapsed().as_millis()
    )))
}

fn comm(pid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default().trim().to_string()
}

fn stat(pid: i32) -> Option<Stat> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

fn parse_stat(text: &str) -> Option<Stat> {
    let rest: Vec<&str> = text[text.rfind(')')? + 1..].split_whitespace().collect();
    Some((rest.first()?.chars().next()?, rest.get(1)?.parse().ok()?, rest.get(19)?.parse().ok()?))
}

/// Every process of the PID namespace, by PID.
fn all_stats() -> HashMap<i32, Stat> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return HashMap::new() };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|p| Some((p, stat(p)?)))
        .collect()
}

fn has_children(pid: i32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return false };
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("children")).ok())
        .any(|c| !c.trim().is_empty())
}

/// `from` and each of its ancestors, up to init.
fn ancestors(from: i32, table: &HashMap<i32, Stat>) -> Vec<i32> {
    let mut out = vec![from];
    let mut at = from;
    while let Some(&(_, parent, _)) = table.get(&at) {
        if parent <= 0 || out.contains(&parent) {
            break;
        }
        out.push(parent);
        at = parent;
    }
    out
}

/// ((pid, start time), parent) of every zombie whose parent is one of
/// `reapers`.
fn zombies_of(reapers: &[i32], table: &HashMap<i32, Stat>) -> Vec<(i32, i32)> {
    let mut out: Vec<(i32, i32)> = table
        .iter()
        .filter(|(_, (state, parent, _))| *state == 'Z' && reapers.contains(parent))
        .map(|(&p, &(_, parent, _))| (p, parent))
        .collect();
    out.sort_unstable();
    out
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

    #[test]
    fn ancestors_go_up_to_init_and_zombies_are_those_of_the_reapers() {
        let table: HashMap<i32, Stat> = [
            (1, ('S', 0, 1)),
            (50, ('S', 1, 2)),
            (60, ('S', 50, 3)),
            (61, ('Z', 60, 4)),
            (62, ('Z', 1, 5)),
            (63, ('Z', 99, 6)),
        ]
        .into_iter()
        .collect();
        assert_eq!(ancestors(60, &table), vec![60, 50, 1]);
        assert_eq!(zombies_of(&[60], &table), vec![(61, 60)]);
        assert_eq!(zombies_of(&ancestors(60, &table), &table), vec![(61, 60), (62, 1)]);
    }
}
