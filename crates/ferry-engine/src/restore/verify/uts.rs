//! The UTS namespace: a tree recorded in ferry's is in the restoring
//! ferry's; a tree recorded in one of its own is in one namespace, not
//! ferry's, with the recorded host and domain names.

use super::Findings;
use crate::error::{EngineError, Result};
use ferry_image::TreeImage;
use std::os::unix::fs::MetadataExt;

fn uts_inode(path: &str, pid: i32) -> Result<u64> {
    std::fs::metadata(path)
        .map(|m| m.ino())
        .map_err(|e| EngineError::io(format!("{path} (pid {pid})"), e))
}

pub(super) fn compare(tree: &TreeImage, found: &mut Findings) -> Result<()> {
    let Some(root) = tree.processes.first() else {
        return Ok(());
    };
    let me = std::process::id() as i32;
    let ours = uts_inode("/proc/self/ns/uts", me)?;
    let theirs = uts_inode(&format!("/proc/{}/ns/uts", root.pid), root.pid)?;
    let name = |ino: u64| match ino == ours {
        true => "ferry's".to_string(),
        false => format!("uts:[{ino}]"),
    };
    let Some(want) = &tree.uts else {
        for p in &tree.processes {
            let ino = uts_inode(&format!("/proc/{}/ns/uts", p.pid), p.pid)?;
            found.compare(p.pid, "the process", "UTS namespace", name(ours), name(ino));
        }
        return Ok(());
    };
    found.compare(
        root.pid,
        "the process",
        "UTS namespace",
        "one of its own",
        match theirs == ours {
            true => "ferry's",
            false => "one of its own",
        },
    );
    for p in &tree.processes[1..] {
        let ino = uts_inode(&format!("/proc/{}/ns/uts", p.pid), p.pid)?;
        found.compare(p.pid, "the process", "UTS namespace", name(theirs), name(ino));
    }
    let (hostname, domainname) = ferry_sys::uts::names_of(root.pid)
        .map_err(|e| EngineError::kernel(root.pid, "reading the names of its UTS namespace", e))?;
    found.compare(root.pid, "the UTS namespace", "hostname", want.hostname.as_str(), &hostname);
    found.compare(
        root.pid,
        "the UTS namespace",
        "domainname",
        want.domainname.as_str(),
        &domainname,
    );
    Ok(())
}
