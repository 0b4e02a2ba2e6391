//! The restore checks itself: once the tree is complete and still stopped
//! (nothing of it has run, its connections are silent in repair mode),
//! the state the kernel now shows for each restored object is read back
//! and compared with the image. A difference fails the restore naming the
//! object and the attribute, so the caller kills the restored copy (no
//! packet leaves it: its connections are still in repair mode); the image
//! is not changed, and a migration's source runs on.
//!
//! What is compared, one file per kind: the process's identity, creds,
//! limits, directories and cgroup v2 (`process.rs`), each thread's name, signal mask
//! and scheduling (`threads.rs`), the mappings (`memory.rs`), the fd table
//! with each description's kind, flags and offset (`fds.rs`), and every
//! socket option the image recorded (`sockets.rs`), and the tree's UTS
//! namespace with its names (`uts.rs`).

mod fds;
mod memory;
mod process;
mod sockets;
mod threads;
mod uts;

use crate::error::{EngineError, Result};
use ferry_image::TreeImage;
use std::collections::HashMap;
use std::os::fd::OwnedFd;

/// One attribute that differs between the image and the restored tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Mismatch {
    pub pid: i32,
    /// What it belongs to ("fd 5 (TCP 10.0.0.1:80)", "thread 12", "the process").
    pub object: String,
    pub attribute: String,
    pub image: String,
    pub restored: String,
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: {} is {} after restore, the image has {}",
            self.object, self.attribute, self.restored, self.image
        )
    }
}

/// Collects the mismatches of one restored tree.
#[derive(Default)]
pub(super) struct Findings {
    pub list: Vec<Mismatch>,
}

impl Findings {
    /// Records a difference when `image != restored`.
    pub fn compare<T: PartialEq + std::fmt::Debug>(
        &mut self,
        pid: i32,
        object: &str,
        attribute: &str,
        image: T,
        restored: T,
    ) {
        if image != restored {
            self.list.push(Mismatch {
                pid,
                object: object.to_string(),
                attribute: attribute.to_string(),
                image: shown(&image),
                restored: shown(&restored),
            });
        }
    }
}

/// A value as the message shows it: text without quotes.
fn shown<T: std::fmt::Debug>(v: &T) -> String {
    let s = format!("{v:?}");
    match s.strip_prefix('"').and_then(|x| x.strip_suffix('"')) {
        Some(text) if !text.is_empty() => text.to_string(),
        _ => s,
    }
}

/// Reads the restored tree back and compares it with `tree`. `connections`
/// are ferry's descriptors of the rebuilt TCP connections, by file id;
/// `carried` ferry's descriptors of the carried files, by file id;
/// `fd_flags` each process's F_GETFD results, read by the process itself
/// once its fd table was complete.
pub(super) fn restored_tree(
    tree: &TreeImage,
    connections: &HashMap<u64, OwnedFd>,
    carried: &HashMap<u64, std::os::fd::RawFd>,
    fd_flags: &super::finish::FdFlags,
) -> Result<()> {
    let mut found = Findings::default();
    let mut splits = crate::phases::Splits::start("restore check");
    let tree_pids: std::collections::HashSet<i32> = tree.processes.iter().map(|p| p.pid).collect();
    let unix = sockets::unix_options(tree);
    uts::compare(tree, &mut found)?;
    for (i, p) in tree.processes.iter().enumerate() {
        process::compare(p, i == 0, &tree_pids, &mut found)?;
        let attrs = crate::restore::process::attrs_of(tree, p);
        process::compare_attrs(p, attrs, &mut found)?;
        process::compare_cgroup(p, tree.cgroups.as_ref(), &mut found)?;
        splits.mark("process");
        threads::compare(p, &mut found)?;
        splits.mark("threads");
        memory::compare(p, &mut found)?;
        splits.mark("mappings");
        let flags = fd_flags.get(&p.pid);
        fds::compare(p, connections, flags, &mut found)?;
        fds::compare_carried(p, carried, &mut found)?;
        splits.mark("fds");
        sockets::compare(p, &unix, connections, &mut found)?;
        splits.mark("socket options");
    }
    verdict(found.list)
}

/// The first difference, with how many more there are, as one error.
fn verdict(list: Vec<Mismatch>) -> Result<()> {
    let Some(first) = list.first() else {
        return Ok(());
    };
    // The first is the error; the others are logged, one line each.
    for m in &list[1..] {
        tracing::warn!("restore check: pid {}: {m}", m.pid);
    }
    let more = match list.len() - 1 {
        0 => String::new(),
        n => format!(" (and {n} more differences, logged)"),
    };
    Err(EngineError::restore(
        first.pid,
        format!(
            "the restore's check found a difference: {first}{more}; the restored processes are ended, the image is unchanged"
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_values_are_no_finding_and_a_difference_names_both() {
        let mut f = Findings::default();
        f.compare(7, "fd 3", "O_NONBLOCK", true, true);
        assert!(f.list.is_empty());
        f.compare(7, "fd 3", "offset", 10, 12);
        assert_eq!(f.list[0].to_string(), "fd 3: offset is 12 after restore, the image has 10");
        let e = verdict(f.list).expect_err("a difference fails");
        assert!(e.to_string().contains("pid 7: the restore's check found a difference: fd 3"));
    }

    #[test]
    fn no_difference_passes_and_more_are_counted() {
        assert!(verdict(Vec::new()).is_ok());
        let m = Mismatch {
            pid: 1,
            object: "the process".into(),
            attribute: "umask".into(),
            image: "18".into(),
            restored: "63".into(),
        };
        let e = verdict(vec![m.clone(), m.clone(), m]).expect_err("fails");
        assert!(e.to_string().contains("(and 2 more differences, logged)"), "{e}");
    }
}
