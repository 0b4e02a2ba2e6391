//! What makes a captured tree unfit for replacement here, checked while
//! it is still frozen (a refusal lets it run on): anything that would make
//! the restore after the kill differ from the trial that guards it.

use crate::error::ReplaceError;
use ferry_image::TreeImage;
use std::os::unix::fs::MetadataExt;

/// The network namespace the new tree is restored into, held open from
/// before the kill: None for ferry's own.
pub struct TreeNetns(Option<std::fs::File>);

impl TreeNetns {
    /// The path `RestoreOptions::netns` takes for it.
    pub fn path(&self) -> Option<std::path::PathBuf> {
        use std::os::fd::AsRawFd;
        self.0.as_ref().map(|f| format!("/proc/self/fd/{}", f.as_raw_fd()).into())
    }
}

/// Refuses, naming the object, a tree whose restore in place could not
/// be tried first or would not land where the old tree was.
pub fn replaceable(tree: &TreeImage) -> Result<TreeNetns, ReplaceError> {
    let root =
        tree.root().ok_or_else(|| ReplaceError::Refused("the image holds no process".into()))?;
    if tree.own_pid_namespace {
        return Err(ReplaceError::Refused(format!(
            "pid {}: the tree runs in a PID namespace of its own; replacing such a tree is not built yet",
            root.pid
        )));
    }
    // The guard of the one step that cannot be undone.
    if let Some(why) = ferry_engine::restore::trial::untrialable(tree) {
        return Err(ReplaceError::Refused(format!(
            "{why}; a trial restore cannot run while the old tree holds it, and without one the replacement would be unguarded"
        )));
    }
    // The new root's parent is ferry, which exits right after.
    if let Some(t) = root.fidelity.threads.iter().find(|t| t.pdeathsig != 0) {
        return Err(ReplaceError::Refused(format!(
            "pid {} thread {}: it has a parent-death signal ({}), which would fire when ferry, the new root's parent, exits",
            root.pid, t.tid, t.pdeathsig
        )));
    }
    netns_of(tree, root.pid)
}

/// Every process must be in one network namespace: the root's, opened
/// now (the old tree still holds it).
fn netns_of(tree: &TreeImage, root: i32) -> Result<TreeNetns, ReplaceError> {
    let Some(attrs) = &tree.process_attrs else { return Ok(TreeNetns(None)) };
    let first = attrs.processes.first().and_then(|a| a.netns);
    if let Some((p, _)) =
        tree.processes.iter().zip(&attrs.processes).find(|(_, a)| a.netns != first)
    {
        return Err(ReplaceError::Refused(format!(
            "pid {}: it runs in another network namespace than the root {root}; a tree is restored into one",
            p.pid
        )));
    }
    let Some(inode) = first else { return Ok(TreeNetns(None)) };
    let path = format!("/proc/{root}/ns/net");
    let file = std::fs::File::open(&path)
        .map_err(|e| ReplaceError::Refused(format!("pid {root}: opening {path}: {e}")))?;
    let now = file.metadata().map(|m| m.ino()).unwrap_or(0);
    if now != inode {
        return Err(ReplaceError::Refused(format!(
            "pid {root}: its network namespace changed during the capture (net:[{inode}], now net:[{now}])"
        )));
    }
    Ok(TreeNetns(Some(file)))
}
