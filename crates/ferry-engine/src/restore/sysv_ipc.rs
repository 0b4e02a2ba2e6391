//! SysV semaphore sets and message queues: recreated by ferry, before any
//! process of the tree exists, under their old ids (sem_next_id,
//! msg_next_id), with key, owner, permissions, semaphore values and
//! queued messages. A process refers to them by id only, so nothing else
//! is needed for the tree to find them.

use super::files::errno_err;
use crate::error::{EngineError, Result};
use ferry_image::{SysvMsgQueue, SysvSem, TreeImage};

/// Creates a SysV object with `create` while `next_id_file` (shm_, sem_
/// or msg_next_id) asks for `id`, and checks that the kernel gave that id.
pub(super) fn create_with_id(pid: i32, next_id_file: &str, id: i32, what: &str, create: impl FnOnce() -> i32, remove: impl Fn(i32)) -> Result<()> {
    std::fs::write(next_id_file, id.to_string()).map_err(|e| EngineError::io(next_id_file, e))?;
    let got = create();
    let _ = std::fs::write(next_id_file, "-1");
    if got < 0 {
        return Err(errno_err(pid, format!("recreating {what}; is one with that key or id still there?")));
    }
    if got != id {
        remove(got);
        return Err(EngineError::restore(pid, format!("{what} came back as id {got}: id {id} is taken")));
    }
    Ok(())
}

fn remove_sem(id: i32) {
    // SAFETY: IPC_RMID takes no buffer.
    unsafe { libc::semctl(id, 0, libc::IPC_RMID) };
}

fn remove_msg(id: i32) {
    // SAFETY: IPC_RMID takes no buffer.
    unsafe { libc::msgctl(id, libc::IPC_RMID, std::ptr::null_mut()) };
}

/// Pushes the id to `made` as soon as the set exists.
fn new_sem(pid: i32, s: &SysvSem, made: &mut Vec<i32>) -> Result<()> {
    let what = format!("SysV semaphore set {} (key {:#x})", s.id, s.key);
    // SAFETY: integer arguments.
    let create = || unsafe { libc::semget(s.key, s.values.len() as i32, libc::IPC_CREAT | libc::IPC_EXCL | (s.mode & 0o777) as i32) };
    create_with_id(pid, "/proc/sys/kernel/sem_next_id", s.id, &what, create, remove_sem)?;
    made.push(s.id);
    let mut values = s.values.clone();
    // SAFETY: SETALL reads one unsigned short per semaphore of the set.
    if unsafe { libc::semctl(s.id, 0, libc::SETALL, values.as_mut_ptr()) } < 0 {
        return Err(errno_err(pid, format!("setting the values of {what}")));
    }
    // SAFETY: semid_ds is plain data, filled by IPC_STAT.
    let mut ds: libc::semid_ds = unsafe { std::mem::zeroed() };
    // SAFETY: ds is a valid semid_ds for IPC_STAT and IPC_SET.
    let ok = unsafe {
        libc::semctl(s.id, 0, libc::IPC_STAT, &mut ds as *mut libc::semid_ds) == 0 && {
            ds.sem_perm.uid = s.uid;
            ds.sem_perm.gid = s.gid;
            ds.sem_perm.mode = (s.mode & 0o777) as _;
            libc::semctl(s.id, 0, libc::IPC_SET, &mut ds as *mut libc::semid_ds) == 0
        }
    };
    if !ok {
        return Err(errno_err(pid, format!("setting the owner of {what}")));
    }
    Ok(())
}

/// Pushes the id to `made` as soon as the queue exists.
fn new_msg(pid: i32, q: &SysvMsgQueue, made: &mut Vec<i32>) -> Result<()> {
    let what = format!("SysV message queue {} (key {:#x})", q.id, q.key);
    // SAFETY: integer arguments.
    let create = || unsafe { libc::msgget(q.key, libc::IPC_CREAT | libc::IPC_EXCL | (q.mode & 0o777) as i32) };
    create_with_id(pid, "/proc/sys/kernel/msg_next_id", q.id, &what, create, remove_msg)?;
    made.push(q.id);
    // SAFETY: msqid_ds is plain data, filled by IPC_STAT.
    let mut ds: libc::msqid_ds = unsafe { std::mem::zeroed() };
    // SAFETY: ds is a valid msqid_ds for IPC_STAT and IPC_SET.
    let ok = unsafe {
        libc::msgctl(q.id, libc::IPC_STAT, &mut ds) == 0 && {
            ds.msg_perm.uid = q.uid;
            ds.msg_perm.gid = q.gid;
            ds.msg_perm.mode = (q.mode & 0o777) as _;
            ds.msg_qbytes = q.max_bytes as _;
            libc::msgctl(q.id, libc::IPC_SET, &mut ds) == 0
        }
    };
    if !ok {
        return Err(errno_err(pid, format!("setting the owner and size of {what}")));
    }
    let mut buf = Vec::new();
    for (i, (mtype, text)) in q.messages.iter().enumerate() {
        buf.clear();
        buf.extend_from_slice(&mtype.to_ne_bytes());
        buf.extend_from_slice(text);
        // SAFETY: buf is a long (the type) followed by text.len() bytes.
        if unsafe { libc::msgsnd(q.id, buf.as_ptr().cast(), text.len(), libc::IPC_NOWAIT) } < 0 {
            return Err(errno_err(pid, format!("queueing message {i} ({} bytes) on {what}", text.len())));
        }
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
