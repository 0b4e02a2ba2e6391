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
use std::collections::HashSet;

/// MSG_COPY from <linux/msg.h>: read the message at an index, keep it.
const MSG_COPY: i32 = 0o40000;

/// The rows of a /proc/sysvipc table, split into columns (header skipped).
pub(super) fn table(path: &str) -> Result<Vec<Vec<String>>> {
    let text = procfs::read_string(path)?;
    Ok(text.lines().skip(1).map(|l| l.split_whitespace().map(str::to_string).collect()).collect())
}

pub(super) fn column<T: std::str::FromStr>(path: &str, row: &[String], i: usize) -> Result<T> {
    row.get(i)
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| EngineError::Parse { path: path.into(), what: format!("column {i} of {row:?}") })
}

/// The mode (column 2, octal) of a /proc/sysvipc row: permission bits
/// and, for a segment, SHM_DEST (0o1000) once it is marked for removal.
pub(super) fn mode(path: &str, row: &[String]) -> Result<u32> {
    let v = row.get(2).ok_or_else(|| EngineError::Parse { path: path.into(), what: format!("no mode in {row:?}") })?;
    u32::from_str_radix(v, 8).map(|m| m & 0o1777).map_err(|_| EngineError::Parse { path: path.into(), what: format!("mode {v:?}") })
}

fn ipc_err(pid: i32, call: &'static str, what: String) -> EngineError {
    let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
    EngineError::kernel(pid, what, ferry_sys::SysError::new(call, errno))
}

/// Every semaphore set whose last operation came from the tree.
pub fn capture_sem(tree: &[i32]) -> Result<Vec<SysvSem>> {
    let path = "/proc/sysvipc/sem";
    let ours: HashSet<i32> = tree.iter().copied().collect();
    let root = tree.first().copied().unwrap_or(0);
    let mut out = Vec::new();
    // key semid perms nsems uid gid cuid cgid otime ctime
    for row in table(path)? {
        let (key, id, nsems): (i32, i32, usize) = (column::<i64>(path, &row, 0)? as i32, column(path, &row, 1)?, column(path, &row, 3)?);
        let used = (0..nsems).any(|i| {
            // SAFETY: GETPID takes no buffer argument.
            let last = unsafe { libc::semctl(id, i as i32, libc::GETPID) };
            ours.contains(&last)
        });
        if !used {
            continue;
        }
        let mut values = vec![0u16; nsems];
        // SAFETY: GETALL writes nsems unsigned shorts into values.
        if unsafe { libc::semctl(id, 0, libc::GETALL, values.as_mut_ptr()) } < 0 {
            return Err(ipc_err(root, "semctl(GETALL)", format!("reading the values of semaphore set {id}")));
        }
        out.push(SysvSem { id, key, mode: mode(path, &row)? & 0o777, uid: column(path, &row, 4)?, gid: column(path, &row, 5)?, values });
    }
    Ok(out)
}

/// Every message queue the tree last sent to or received from, with its
/// messages in order.
pub fn capture_msg(tree: &[i32]) -> Result<Vec<SysvMsgQueue>> {
    let path = "/proc/sysvipc/msg";
    let ours: HashSet<i32> = tree.iter().copied().collect();
    let root = tree.first().copied().unwrap_or(0);
    let max_msg: usize = procfs::read_string("/proc/sys/kernel/msgmax")?.trim().parse().unwrap_or(8192);
    let mut out = Vec::new();
    // key msqid perms cbytes qnum lspid lrpid uid gid cuid cgid ...
    for row in table(path)? {
        let (lspid, lrpid): (i32, i32) = (column(path, &row, 5)?, column(path, &row, 6)?);
        if !ours.contains(&lspid) && !ours.contains(&lrpid) {
            continue;
        }
        let (key, id, count): (i32, i32, usize) = (column::<i64>(path, &row, 0)? as i32, column(path, &row, 1)?, column(path, &row, 4)?);
        // SAFETY: msqid_ds is plain data, filled by IPC_STAT.
        let mut ds: libc::msqid_ds = unsafe { std::mem::zeroed() };
        // SAFETY: ds is a valid msqid_ds.
        if unsafe { libc::msgctl(id, libc::IPC_STAT, &mut ds) } < 0 {
            return Err(ipc_err(root, "msgctl(IPC_STAT)", format!("reading message queue {id}")));
        }
        let mut buf = vec![0u8; 8 + max_msg];
        let mut messages = Vec::with_capacity(count);
        for i in 0..count {
            // SAFETY: buf holds a long (the type) and max_msg bytes of text.
            let n = unsafe { libc::msgrcv(id, buf.as_mut_ptr().cast(), max_msg, i as libc::c_long, libc::IPC_NOWAIT | MSG_COPY) };
            if n < 0 {
                return Err(ipc_err(root, "msgrcv(MSG_COPY)", format!("copying message {i} of queue {id} (msgrcv MSG_COPY)")));
            }
            let mtype = i64::from_ne_bytes(buf[..8].try_into().unwrap_or([0; 8]));
            messages.push((mtype, buf[8..8 + n as usize].to_vec()));
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
        // SAFETY: IPC_RMID takes no buffer.
        unsafe { libc::semctl(s.id, 0, libc::IPC_RMID) };
    }
    for q in queues {
        // SAFETY: IPC_RMID takes no buffer.
        unsafe { libc::msgctl(q.id, libc::IPC_RMID, std::ptr::null_mut()) };
    }
}
