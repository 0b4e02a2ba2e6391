//! Freezing the tree's TCP connections on the network before they are
//! read: one network lock (see ferry-netlock) over every established
//! connection's 4-tuple, in the network namespace the tree lives in. From
//! here until restore thaws it, no packet of those connections reaches
//! the stack (which would answer with a reset once the socket is gone)
//! and none leaves.

use super::files::tcp::Established;
use crate::error::{EngineError, Result};
use ferry_netlock::{Method, Netns, NetworkLock, Tuple};
use std::os::unix::fs::MetadataExt;

fn netns_inode(pid: i32) -> Result<u64> {
    let path = format!("/proc/{pid}/ns/net");
    std::fs::metadata(&path).map(|m| m.ino()).map_err(|e| EngineError::io(path, e))
}

/// Locks every connection of `conns`; None when there are none.
pub fn freeze(conns: &[Established], method: Method) -> Result<Option<NetworkLock>> {
    let Some(first) = conns.first() else { return Ok(None) };
    let ns = netns_inode(first.pid)?;
    for c in conns {
        if c.pid != first.pid && netns_inode(c.pid)? != ns {
            return Err(EngineError::unsupported(
                c.pid,
                format!("fd {} (TCP {} -> {})", c.fd, c.local, c.remote),
                format!("its process is in another network namespace than pid {} (one network namespace per tree)", first.pid),
            ));
        }
    }
    let tuples: Vec<Tuple> = conns.iter().map(|c| Tuple { local: c.local, remote: c.remote }).collect();
    let netns = Netns::Path(format!("/proc/{}/ns/net", first.pid).into());
    Ok(Some(NetworkLock::freeze(method, &netns, &tuples, "ckpt")?))
}
