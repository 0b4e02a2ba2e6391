//! The process tree: a root and every descendant, frozen together.
//!
//! The root is frozen first, then its children, then theirs: a frozen
//! process cannot fork, so once a level is frozen the next level is
//! complete. A last pass re-reads every children list and freezes any
//! late arrival, so nothing of the tree runs while any part is captured.

use crate::error::{EngineError, Result};
use crate::freeze::Frozen;
use crate::procfs::{self, Stat};
use ferry_image::Zombie;

pub struct FrozenProcess {
    pub frozen: Frozen,
    pub ppid: i32,
}

pub struct FrozenTree {
    /// Parents before children; the root first.
    pub procs: Vec<FrozenProcess>,
    pub zombies: Vec<Zombie>,
}

/// Children of every thread of `pid`, in the kernel's order.
pub(crate) fn children_of(pid: i32) -> Result<Vec<i32>> {
    let mut out = Vec::new();
    for tid in procfs::tids(pid)? {
        let path = format!("/proc/{pid}/task/{tid}/children");
        let text = procfs::read_string(&path).unwrap_or_default();
        out.extend(text.split_whitespace().filter_map(|c| c.parse::<i32>().ok()));
    }
    Ok(out)
}

/// Whether `pid`'s parent, or its parent's, and so on, is in `tree`: a
/// process forked by the tree after [`running_tree`] listed it.
pub(crate) fn descends_from(pid: i32, tree: &[i32]) -> bool {
    let mut cur = pid;
    // Bounded: a chain of parents is short, and a PID reused meanwhile
    // cannot make it loop for ever.
    for _ in 0..4096 {
        let Ok(st) = Stat::read(cur) else { return false };
        let ppid = st.field(4) as i32;
        if tree.contains(&ppid) {
            return true;
        }
        if ppid <= 1 {
            return false;
        }
        cur = ppid;
    }
    false
}

/// `root` and its descendants as they are now, the tree still running
/// (a process that exits meanwhile just has no children): for the checks
/// made before the freeze. Parents before children.
pub fn running_tree(root: i32) -> Vec<i32> {
    let mut pids = vec![root];
    let mut i = 0;
    while i < pids.len() && pids.len() < 100_000 {
        pids.extend(children_of(pids[i]).unwrap_or_default());
        i += 1;
    }
    pids
}

fn zombie(pid: i32, ppid: i32) -> Result<Zombie> {
    let st = Stat::read(pid)?;
    // Field 52 is the exit status in wait(2) form.
    Ok(Zombie {
        pid,
        ppid,
        pgid: st.field(5) as i32,
        sid: st.field(6) as i32,
        wait_status: st.field(52) as i32,
    })
}

impl FrozenTree {
    pub fn freeze(root: i32) -> Result<FrozenTree> {
        let mut tree = FrozenTree { procs: Vec::new(), zombies: Vec::new() };
        let root_ppid = Stat::read(root)?.field(4) as i32;
        tree.procs.push(FrozenProcess { frozen: Frozen::freeze(root)?, ppid: root_ppid });
        loop {
            let mut added = false;
            let mut i = 0;
            while i < tree.procs.len() {
                let parent = tree.procs[i].frozen.pid;
                for child in children_of(parent)? {
                    if tree.procs.iter().any(|p| p.frozen.pid == child)
                        || tree.zombies.iter().any(|z| z.pid == child)
                    {
                        continue;
                    }
                    if procfs::state(child) == Some('Z') {
                        tree.zombies.push(zombie(child, parent)?);
                        continue;
                    }
                    let frozen = match Frozen::freeze(child) {
                        Ok(f) => f,
                        // Exited between listing and freezing: it is a
                        // zombie now, or already reaped.
                        Err(EngineError::Gone { .. })
                            if procfs::state(child).is_none_or(|s| s == 'Z') =>
                        {
                            if procfs::state(child) == Some('Z') {
                                tree.zombies.push(zombie(child, parent)?);
                            }
                            continue;
                        }
                        Err(e) => return Err(e),
                    };
                    tree.procs.push(FrozenProcess { frozen, ppid: parent });
                    added = true;
                }
                i += 1;
            }
            if !added {
                break;
            }
        }
        Ok(tree)
    }

    pub fn pids(&self) -> Vec<i32> {
        self.procs.iter().map(|p| p.frozen.pid).collect()
    }

    /// Refuses a process or zombie whose session or process group a
    /// restore cannot give it. Each is forked from its restored parent,
    /// so its session must be its own (setsid) or its parent's; its group
    /// its own, its parent's (inherited), or one whose leader is in the
    /// tree (setpgid joins only an existing group, and the group of a
    /// leader that was reaped has nobody left to create it). The root
    /// keeps the session and group it is restored in.
    pub fn check_groups(&self) -> Result<()> {
        // (pid, ppid, pgid, sid) of every live process, then every zombie.
        let mut ids = Vec::with_capacity(self.procs.len() + self.zombies.len());
        for p in &self.procs {
            let st = Stat::read(p.frozen.pid)?;
            ids.push((p.frozen.pid, p.ppid, st.field(5) as i32, st.field(6) as i32));
        }
        ids.extend(self.zombies.iter().map(|z| (z.pid, z.ppid, z.pgid, z.sid)));
        for (i, &(pid, ppid, pgid, sid)) in ids.iter().enumerate().skip(1) {
            let object = if i < self.procs.len() {
                format!("process {pid}")
            } else {
                format!("zombie child {pid}")
            };
            let refuse =
                |reason: String| Err(EngineError::unsupported(ppid, object.clone(), reason));
            let Some(&(_, _, parent_pgid, parent_sid)) = ids.iter().find(|p| p.0 == ppid) else {
                continue;
            };
            if sid != pid && sid != parent_sid {
                return refuse(format!("its session {sid} is neither its own nor its parent's ({parent_sid}), and a restored process can only start its own"));
            }
            if pgid != pid && pgid != parent_pgid && !ids.iter().any(|p| p.0 == pgid) {
                return refuse(format!("its process group {pgid} is not its parent's and its leader is not in the tree, so a restored process could not join it"));
            }
        }
        Ok(())
    }

    /// Refuses a zombie that dumped core: its wait status says so
    /// (WCOREDUMP), and the restored zombie dies of the same signal
    /// without dumping again, so the parent would read a different status.
    pub fn check_zombies(&self) -> Result<()> {
        match self.zombies.iter().find(|z| z.wait_status & 0x80 != 0) {
            Some(z) => Err(EngineError::unsupported(
                z.ppid,
                format!("zombie child {}", z.pid),
                format!(
                    "it died of signal {} with a core dump (WCOREDUMP); ferry does not dump core again, so its wait status would lose the flag",
                    z.wait_status & 0x7f
                ),
            )),
            None => Ok(()),
        }
    }

    /// Lets every process run on.
    pub fn release(self) -> Result<()> {
        let mut first = None;
        for p in self.procs {
            if let Err(e) = p.frozen.release() {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// Kills every process of the tree (children first) and waits until
    /// each has exited. Returns the PIDs that init (or a subreaper) reaps:
    /// all but the root's, which its own parent reaps (see [`crate::procfs::wait_reaped`]).
    pub fn kill(self) -> Result<Vec<i32>> {
        let mut first = None;
        let pids: Vec<i32> = self.pids().into_iter().skip(1).collect();
        for p in self.procs.into_iter().rev() {
            if let Err(e) = p.frozen.kill() {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(pids), Err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_descends_from_its_parent_and_not_the_other_way() {
        let me = std::process::id() as i32;
        let mut child = std::process::Command::new("sleep").arg("30").spawn().expect("sleep");
        let pid = child.id() as i32;
        let (down, up, unrelated) =
            (descends_from(pid, &[me]), descends_from(me, &[pid]), descends_from(pid, &[i32::MAX]));
        let _ = child.kill();
        let _ = child.wait();
        assert!(down, "pid {pid} is a child of {me}");
        assert!(!up && !unrelated);
    }
}
