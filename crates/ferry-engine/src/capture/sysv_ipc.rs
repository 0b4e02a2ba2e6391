//! SysV semaphore sets and message queues the tree uses.
//!
//! Unlike a shared memory segment (which shows up in a process's
//! mappings) neither is tied to a process: both live in the IPC
//! namespace. The kernel remembers which process last operated on each
//! semaphore (GETPID) and which last sent to and received from each queue
//! (msg_lspid, msg_lrpid); a set or queue whose last user is in the tree
//! belongs to the tree. One the tree created but never used is not
//! recorded. Messages are read with MSG_COPY, which leaves them queued.

use crate::error::{EngineError, Result};
use crate::procfs;
use ferry_image::{SysvMsgQueue, SysvSem};
use ferry_sys::sysv;
use std::collections::HashSet;

/// The rows of a /proc/sysvipc table, split into columns (header skipped).
pub(super) fn table(path: &str) -> Result<Vec<Vec<String>>> {
    let text = procfs::read_string(path)?;
    Ok(text.lines().skip(1).map(|l| l.split_whitespace().map(str::to_string).collect()).collect())
}

pub(super) fn column<T: std::str::FromStr>(path: &str, row: &[String], i: usize) -> Result<T> {
    row.get(i).and_then(|v| v.parse().ok()).ok_or_else(|| EngineError::Parse {
        path: path.into(),
        what: format!("column {i} of {row:?}"),
    })
}

/// The mode (column 2, octal) of a /proc/sysvipc row: permission bits
/// and, for a segment, SHM_DEST (0o1000) once it is marked for removal.
pub(super) fn mode(path: &str, row: &[String]) -> Result<u32> {
    let v = row.get(2).ok_or_else(|| EngineError::Parse {
        path: path.into(),
        what: format!("no mode in {row:?}"),
    })?;
    u32::from_str_radix(v, 8)
        .map(|m| m & 0o1777)
        .map_err(|_| EngineError::Parse { path: path.into(), what: format!("mode {v:?}") })
}

/// Every semaphore set whose last operation came from the tree.
pub fn capture_sem(tree: &[i32]) -> Result<Vec<SysvSem>> {
    let path = "/proc/sysvipc/sem";
    let ours: HashSet<i32> = tree.iter().copied().collect();
    let root = tree.first().copied().unwrap_or(0);
    let mut out = Vec::new();
    // key semid perms nsems uid gid cuid cgid otime ctime
    for row in table(path)? {
        let (key, id, nsems): (i32, i32, usize) =
            (column::<i64>(path, &row, 0)? as i32, column(path, &row, 1)?, column(path, &row, 3)?);
        let used = (0..nsems)
            .any(|i| sysv::sem_last_pid(id, i as i32).is_ok_and(|last| ours.contains(&last)));
        if !used {
            continue;
        }
        let values = sysv::sem_values(id).map_err(|e| {
            EngineError::kernel(root, format!("reading the values of semaphore set {id}"), e)
        })?;
        out.push(SysvSem {
            id,
            key,
            mode: mode(path, &row)? & 0o777,
            uid: column(path, &row, 4)?,
            gid: column(path, &row, 5)?,
            values,
        });
    }
    Ok(out)
}

/// Every message queue the tree last sent to or received from, with its
/// messages in order.
pub fn capture_msg(tree: &[i32]) -> Result<Vec<SysvMsgQueue>> {
    let path = "/proc/sysvipc/msg";
    let ours: HashSet<i32> = tree.iter().copied().collect();
    let root = tree.first().copied().unwrap_or(0);
    let max_msg: usize =
        procfs::read_string("/proc/sys/kernel/msgmax")?.trim().parse().unwrap_or(8192);
    let mut out = Vec::new();
    // key msqid perms cbytes qnum lspid lrpid uid gid cuid cgid ...
    for row in table(path)? {
        let (lspid, lrpid): (i32, i32) = (column(path, &row, 5)?, column(path, &row, 6)?);
        if !ours.contains(&lspid) && !ours.contains(&lrpid) {
            continue;
        }
        let (key, id, count): (i32, i32, usize) =
            (column::<i64>(path, &row, 0)? as i32, column(path, &row, 1)?, column(path, &row, 4)?);
        let ds = sysv::msg_stat(id)
            .map_err(|e| EngineError::kernel(root, format!("reading message queue {id}"), e))?;
        let mut buf = vec![0u8; 8 + max_msg];
        let mut messages = Vec::with_capacity(count);
        for i in 0..count {
            let (mtype, text) = sysv::msg_copy(id, i, &mut buf).map_err(|e| {
                EngineError::kernel(
                    root,
                    format!("copying message {i} of queue {id} (msgrcv MSG_COPY)"),
                    e,
                )
            })?;
            messages.push((mtype, text.to_vec()));
        }
        out.push(SysvMsgQueue {
            id,
            key,
            mode: mode(path, &row)? & 0o777,
            uid: column(path, &row, 7)?,
            gid: column(path, &row, 8)?,
            max_bytes: ds.msg_qbytes as u64,
            messages,
        });
    }
    Ok(out)
}

/// Removes what was captured once the tree is gone: the image holds it
/// now, and restore recreates it under the same ids.
pub fn remove(sems: &[SysvSem], queues: &[SysvMsgQueue]) {
    for s in sems {
        let _ = sysv::sem_remove(s.id);
    }
    for q in queues {
        let _ = sysv::msg_remove(q.id);
    }
}
