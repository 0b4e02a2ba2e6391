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
fn children_of(pid: i32) -> Result<Vec<i32>> {
    let mut out = Vec::new();
    for tid in procfs::tids(pid)? {
        let path = format!("/proc/{pid}/task/{tid}/children");
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        out.extend(text.split_whitespace().filter_map(|c| c.parse::<i32>().ok()));
    }
    Ok(out)
}

fn zombie(pid: i32, ppid: i32) -> Result<Zombie> {
    let st = Stat::read(pid)?;
    // Field 52 is the exit status in wait(2) form.
    Ok(Zombie { pid, ppid, pgid: st.field(5) as i32, sid: st.field(6) as i32, wait_status: st.field(52) as i32 })
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
                    if tree.procs.iter().any(|p| p.frozen.pid == child) || tree.zombies.iter().any(|z| z.pid == child) {
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
                        Err(EngineError::Gone { .. }) if procfs::state(child).is_none_or(|s| s == 'Z') => {
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

    /// Refuses a zombie whose session or process group a restore cannot
    /// give it: it is forked from its parent and calls setsid() or
    /// setpgid() before it exits, so its session must be its own or its
    /// parent's, and its group its own or one a live process of the tree
    /// is in (setpgid joins only an existing group; the group of a leader
    /// that was reaped has nobody left to join).
    pub fn check_zombie_groups(&self) -> Result<()> {
        let mut ids = Vec::with_capacity(self.procs.len());
        for p in &self.procs {
            let st = Stat::read(p.frozen.pid)?;
            ids.push((p.frozen.pid, st.field(5) as i32, st.field(6) as i32));
        }
        for z in &self.zombies {
            let parent_sid = ids.iter().find(|(pid, _, _)| *pid == z.ppid).map(|&(_, _, sid)| sid);
            if z.sid != z.pid && Some(z.sid) != parent_sid {
                return Err(EngineError::unsupported(
                    z.ppid,
                    format!("zombie child {}", z.pid),
                    format!("its session {} is neither its own nor its parent's, and a restored process can only start its own", z.sid),
                ));
            }
            if z.pgid != z.pid && !ids.iter().any(|&(_, pgid, _)| pgid == z.pgid) {
                return Err(EngineError::unsupported(
                    z.ppid,
                    format!("zombie child {}", z.pid),
                    format!("its process group {} has no live process of the tree in it, so a restored process could not join it", z.pgid),
                ));
            }
        }
        Ok(())
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
    /// all but the root's, which its own parent reaps (see [`wait_reaped`]).
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

/// Waits (at most `limit`) until none of `pids` exists any more, not even
/// as a zombie. Returns whether they are all gone.
pub fn wait_reaped(pids: &[i32], limit: std::time::Duration) -> bool {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if pids.iter().all(|p| !std::path::Path::new(&format!("/proc/{p}")).exists()) {
            return true;
        }
        if std::time::Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}
