//! Shared memory a process outside the tree maps too. A tree restored
//! (or migrated) without that process would get its own copy of the
//! memory: the two would silently stop seeing each other's writes, and
//! the one left behind would see its partner die. Refused by name.
//!
//! The scan of every other process's mappings runs before the freeze
//! (no process outside the tree can map an object of the tree's while
//! the tree runs unless it already could); the frozen survey scans again
//! only for objects that were not there before the freeze.

use super::tree::running_tree;
use crate::error::{EngineError, Result};
use crate::procfs::{self, MapsEntry};
use std::collections::{HashMap, HashSet};

/// A shared memory object: (device, inode) of its shmem file.
type ObjectId = (u64, u64);

/// Where the tree maps an object: (pid, address, what maps shows).
type Mapped = (i32, u64, String);

/// The shared memory objects the tree mapped when it was checked.
#[derive(Default)]
pub(super) struct Checked {
    objects: HashSet<ObjectId>,
}

/// Anonymous shared memory, memfds and SysV segments: shmem files that
/// exist only while mapped or held, so a restore makes new ones. POSIX
/// shared memory (/dev/shm) too: it outlives its users, but the tree and
/// the processes it shares it with form one application, and a restore
/// on another host (or after the object was removed) would split them.
fn is_shmem(m: &MapsEntry) -> bool {
    m.shared()
        && m.inode != 0
        && (m.path.starts_with("/dev/zero")
            || m.path.starts_with("/SYSV")
            || m.path.starts_with("/memfd:")
            || m.path.starts_with("/dev/shm/"))
}

fn objects_of(pid: i32, maps: &[MapsEntry], out: &mut HashMap<ObjectId, Mapped>) {
    for m in maps.iter().filter(|m| is_shmem(m)) {
        out.entry((m.dev, m.inode)).or_insert_with(|| (pid, m.start, m.path.clone()));
    }
}

/// Before the freeze: the tree's shared memory objects, none of which a
/// process outside the tree maps.
pub(super) fn check(root: i32) -> Result<Checked> {
    let tree = running_tree(root);
    let mut objects = HashMap::new();
    for &pid in &tree {
        // A process that exits meanwhile has nothing to share.
        if let Ok(maps) = procfs::maps(pid) {
            objects_of(pid, &maps, &mut objects);
        }
    }
    refuse_outside_users(&tree, &objects)?;
    Ok(Checked { objects: objects.into_keys().collect() })
}

impl Checked {
    /// In the freeze: objects the tree mapped since [`check`] are checked
    /// the same way.
    pub fn recheck(&self, procs: &[(i32, &[MapsEntry])]) -> Result<()> {
        let mut new = HashMap::new();
        for &(pid, maps) in procs {
            objects_of(pid, maps, &mut new);
        }
        new.retain(|id, _| !self.objects.contains(id));
        let tree: Vec<i32> = procs.iter().map(|p| p.0).collect();
        refuse_outside_users(&tree, &new)
    }
}

fn refuse_outside_users(tree: &[i32], objects: &HashMap<ObjectId, Mapped>) -> Result<()> {
    if objects.is_empty() {
        return Ok(());
    }
    let me = std::process::id() as i32;
    let Ok(dir) = std::fs::read_dir("/proc") else { return Ok(()) };
    for pid in dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok()) {
        if pid == me || tree.contains(&pid) {
            continue;
        }
        let Ok(maps) = procfs::maps(pid) else { continue };
        if let Some(m) =
            maps.iter().find(|m| is_shmem(m) && objects.contains_key(&(m.dev, m.inode)))
        {
            // A child forked by the tree since it was listed (a server's
            // new worker) is the tree's: the freeze takes it, and the
            // check in the freeze looks at the frozen tree.
            if super::tree::descends_from(pid, tree) {
                continue;
            }
            let (owner, addr, path) = &objects[&(m.dev, m.inode)];
            let comm = procfs::read_string(&format!("/proc/{pid}/comm")).unwrap_or_default();
            return Err(EngineError::unsupported(
                *owner,
                format!("the shared memory at {addr:#x} ({path})"),
                format!(
                    "process {pid} ({}), outside the tree, maps it too: a restored copy would no longer share it (take the tree from a process that holds every user of it)",
                    comm.trim()
                ),
            ));
        }
    }
    Ok(())
}
