//! SysV semaphore sets and message queues: recreated by ferry, before any
//! process of the tree exists, under their old ids (sem_next_id,
//! msg_next_id), with key, owner, permissions, semaphore values and
//! queued messages. A process refers to them by id only, so nothing else
//! is needed for the tree to find them.

use crate::error::{EngineError, Result};
use ferry_image::{SysvMsgQueue, SysvSem, TreeImage};
use ferry_sys::{sysv, SysResult};

/// Creates a SysV object with `create` while `next_id_file` (shm_, sem_
/// or msg_next_id) asks for `id`, and checks that the kernel gave that id.
pub(super) fn create_with_id(
    pid: i32,
    next_id_file: &str,
    id: i32,
    what: &str,
    create: impl FnOnce() -> SysResult<i32>,
    remove: impl Fn(i32),
) -> Result<()> {
    std::fs::write(next_id_file, id.to_string()).map_err(|e| EngineError::io(next_id_file, e))?;
    let got = create();
    let _ = std::fs::write(next_id_file, "-1");
    let got = got.map_err(|e| {
        EngineError::kernel(
            pid,
            format!("recreating {what}; is one with that key or id still there?"),
            e,
        )
    })?;
    if got != id {
        remove(got);
        return Err(EngineError::restore(
            pid,
            format!("{what} came back as id {got}: id {id} is taken"),
        ));
    }
    Ok(())
}

fn remove_sem(id: i32) {
    let _ = sysv::sem_remove(id);
}

fn remove_msg(id: i32) {
    let _ = sysv::msg_remove(id);
}

/// Pushes the id to `made` as soon as the set exists.
fn new_sem(pid: i32, s: &SysvSem, made: &mut Vec<i32>) -> Result<()> {
    let what = format!("SysV semaphore set {} (key {:#x})", s.id, s.key);
    let create = || {
        sysv::sem_get(
            s.key,
            s.values.len() as i32,
            libc::IPC_CREAT | libc::IPC_EXCL | (s.mode & 0o777) as i32,
        )
    };
    create_with_id(pid, "/proc/sys/kernel/sem_next_id", s.id, &what, create, remove_sem)?;
    made.push(s.id);
    sysv::sem_set_values(s.id, &s.values)
        .map_err(|e| EngineError::kernel(pid, format!("setting the values of {what}"), e))?;
    let owner = sysv::sem_stat(s.id).and_then(|mut ds| {
        ds.sem_perm.uid = s.uid;
        ds.sem_perm.gid = s.gid;
        ds.sem_perm.mode = (s.mode & 0o777) as _;
        sysv::sem_set(s.id, &ds)
    });
    owner.map_err(|e| EngineError::kernel(pid, format!("setting the owner of {what}"), e))
}

/// Pushes the id to `made` as soon as the queue exists.
fn new_msg(pid: i32, q: &SysvMsgQueue, made: &mut Vec<i32>) -> Result<()> {
    let what = format!("SysV message queue {} (key {:#x})", q.id, q.key);
    let create =
        || sysv::msg_get(q.key, libc::IPC_CREAT | libc::IPC_EXCL | (q.mode & 0o777) as i32);
    create_with_id(pid, "/proc/sys/kernel/msg_next_id", q.id, &what, create, remove_msg)?;
    made.push(q.id);
    let owner = sysv::msg_stat(q.id).and_then(|mut ds| {
        ds.msg_perm.uid = q.uid;
        ds.msg_perm.gid = q.gid;
        ds.msg_perm.mode = (q.mode & 0o777) as _;
        ds.msg_qbytes = q.max_bytes as _;
        sysv::msg_set(q.id, &ds)
    });
    owner.map_err(|e| {
        EngineError::kernel(pid, format!("setting the owner and size of {what}"), e)
    })?;
    for (i, (mtype, text)) in q.messages.iter().enumerate() {
        sysv::msg_send(q.id, *mtype, text, libc::IPC_NOWAIT).map_err(|e| {
            EngineError::kernel(
                pid,
                format!("queueing message {i} ({} bytes) on {what}", text.len()),
                e,
            )
        })?;
    }
    Ok(())
}

/// The sets and queues this restore made; removed again on drop unless
/// the restore succeeded.
pub struct SysvIpc {
    sems: Vec<i32>,
    queues: Vec<i32>,
    pub keep: bool,
}

impl SysvIpc {
    pub fn create(tree: &TreeImage) -> Result<SysvIpc> {
        let root = tree.processes.first().map_or(0, |p| p.pid);
        let mut made = SysvIpc { sems: Vec::new(), queues: Vec::new(), keep: false };
        for s in &tree.sysv_sem {
            new_sem(root, s, &mut made.sems)?;
        }
        for q in &tree.sysv_msg {
            new_msg(root, q, &mut made.queues)?;
        }
        Ok(made)
    }
}

impl Drop for SysvIpc {
    fn drop(&mut self) {
        if !self.keep {
            self.sems.iter().for_each(|&id| remove_sem(id));
            self.queues.iter().for_each(|&id| remove_msg(id));
        }
    }
}
