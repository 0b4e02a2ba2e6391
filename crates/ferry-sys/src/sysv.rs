//! SysV IPC objects of the caller's IPC namespace: shared memory segments
//! (shmget, shmat, shmctl), semaphore sets (semget, semctl) and message
//! queues (msgget, msgrcv with MSG_COPY, msgsnd, msgctl). Objects are
//! named by id; the `*_stat`/`*_set` pairs read and write the kernel's
//! `*id_ds` structs (owner, permissions, queue size).

use crate::{last_error, SysError, SysResult};

/// MSG_COPY from <linux/msg.h>: read the message at an index, keep it.
pub const MSG_COPY: i32 = 0o40000;

/// Turns an int-returning call's -1 into the errno.
fn int(call: &'static str, r: i32) -> SysResult<i32> {
    if r < 0 {
        Err(last_error(call))
    } else {
        Ok(r)
    }
}

// ---- shared memory segments ----

/// shmget(2): returns the segment's id.
pub fn shm_get(key: i32, size: usize, flags: i32) -> SysResult<i32> {
    // SAFETY: integer arguments.
    int("shmget", unsafe { libc::shmget(key, size, flags) })
}

/// shmctl(IPC_RMID): removes the segment once nothing has it attached.
pub fn shm_remove(id: i32) -> SysResult<()> {
    // SAFETY: IPC_RMID takes no buffer.
    int("shmctl(IPC_RMID)", unsafe { libc::shmctl(id, libc::IPC_RMID, std::ptr::null_mut()) })
        .map(drop)
}

pub fn shm_stat(id: i32) -> SysResult<libc::shmid_ds> {
    // SAFETY: shmid_ds is plain data; all-zero is a valid value.
    let mut ds: libc::shmid_ds = unsafe { std::mem::zeroed() };
    // SAFETY: IPC_STAT fills the shmid_ds we own.
    int("shmctl(IPC_STAT)", unsafe { libc::shmctl(id, libc::IPC_STAT, &mut ds) })?;
    Ok(ds)
}

/// shmctl(IPC_SET): the kernel takes owner and mode from `ds`.
pub fn shm_set(id: i32, ds: &libc::shmid_ds) -> SysResult<()> {
    let mut ds = *ds;
    // SAFETY: IPC_SET only reads the shmid_ds.
    int("shmctl(IPC_SET)", unsafe { libc::shmctl(id, libc::IPC_SET, &mut ds) }).map(drop)
}

/// A segment attached read-write somewhere in our address space;
/// detached on drop.
pub struct ShmAttachment {
    addr: *mut u8,
    len: usize,
}

impl ShmAttachment {
    pub fn attach(id: i32) -> SysResult<ShmAttachment> {
        let len = shm_stat(id)?.shm_segsz;
        // SAFETY: the kernel picks a free address for the new attachment;
        // no existing memory is touched.
        let at = unsafe { libc::shmat(id, std::ptr::null(), 0) };
        if at as isize == -1 {
            return Err(last_error("shmat"));
        }
        Ok(ShmAttachment { addr: at.cast(), len })
    }

    /// The segment's bytes (its size as IPC_STAT reported it; a segment
    /// cannot change size).
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: addr is our live read-write attachment of the segment,
        // which is at least `len` bytes long; the &mut self borrow keeps
        // it attached and unaliased within this process for the slice's
        // lifetime. Other processes attaching the segment only see bytes
        // change, as with any shared memory.
        unsafe { std::slice::from_raw_parts_mut(self.addr, self.len) }
    }
}

impl Drop for ShmAttachment {
    fn drop(&mut self) {
        // SAFETY: detaching exactly the attachment made in `attach`.
        unsafe { libc::shmdt(self.addr.cast()) };
    }
}

// ---- semaphore sets ----

/// semget(2): returns the set's id.
pub fn sem_get(key: i32, nsems: i32, flags: i32) -> SysResult<i32> {
    // SAFETY: integer arguments.
    int("semget", unsafe { libc::semget(key, nsems, flags) })
}

pub fn sem_remove(id: i32) -> SysResult<()> {
    // SAFETY: IPC_RMID takes no buffer.
    int("semctl(IPC_RMID)", unsafe { libc::semctl(id, 0, libc::IPC_RMID) }).map(drop)
}

/// semctl(GETPID): the PID of the last process that operated on
/// semaphore `num` of the set.
pub fn sem_last_pid(id: i32, num: i32) -> SysResult<i32> {
    // SAFETY: GETPID takes no buffer argument.
    int("semctl(GETPID)", unsafe { libc::semctl(id, num, libc::GETPID) })
}

pub fn sem_stat(id: i32) -> SysResult<libc::semid_ds> {
    // SAFETY: semid_ds is plain data; all-zero is a valid value.
    let mut ds: libc::semid_ds = unsafe { std::mem::zeroed() };
    // SAFETY: IPC_STAT fills the semid_ds we own.
    int("semctl(IPC_STAT)", unsafe {
        libc::semctl(id, 0, libc::IPC_STAT, &mut ds as *mut libc::semid_ds)
    })?;
    Ok(ds)
}

/// semctl(IPC_SET): the kernel takes owner and mode from `ds`.
pub fn sem_set(id: i32, ds: &libc::semid_ds) -> SysResult<()> {
    let mut ds = *ds;
    // SAFETY: IPC_SET only reads the semid_ds.
    int("semctl(IPC_SET)", unsafe {
        libc::semctl(id, 0, libc::IPC_SET, &mut ds as *mut libc::semid_ds)
    })
    .map(drop)
}

/// semctl(GETALL): the value of every semaphore of the set.
pub fn sem_values(id: i32) -> SysResult<Vec<u16>> {
    let n = sem_stat(id)?.sem_nsems as usize;
    let mut values = vec![0u16; n];
    // SAFETY: GETALL writes one unsigned short per semaphore of the set,
    // and the set has `n` (a set never changes size; only removing it
    // and reusing its very id for a larger set between the two calls
    // could differ, which the id's sequence number prevents).
    int("semctl(GETALL)", unsafe { libc::semctl(id, 0, libc::GETALL, values.as_mut_ptr()) })?;
    Ok(values)
}

/// semctl(SETALL): `values` must have one entry per semaphore of the set.
pub fn sem_set_values(id: i32, values: &[u16]) -> SysResult<()> {
    if sem_stat(id)?.sem_nsems as usize != values.len() {
        return Err(SysError::new("semctl(SETALL)", libc::EINVAL));
    }
    // SAFETY: SETALL only reads one unsigned short per semaphore of the
    // set, which has values.len() of them (checked above; see `sem_values`).
    int("semctl(SETALL)", unsafe { libc::semctl(id, 0, libc::SETALL, values.as_ptr()) }).map(drop)
}

// ---- message queues ----

/// msgget(2): returns the queue's id.
pub fn msg_get(key: i32, flags: i32) -> SysResult<i32> {
    // SAFETY: integer arguments.
    int("msgget", unsafe { libc::msgget(key, flags) })
}

pub fn msg_remove(id: i32) -> SysResult<()> {
    // SAFETY: IPC_RMID takes no buffer.
    int("msgctl(IPC_RMID)", unsafe { libc::msgctl(id, libc::IPC_RMID, std::ptr::null_mut()) })
        .map(drop)
}

pub fn msg_stat(id: i32) -> SysResult<libc::msqid_ds> {
    // SAFETY: msqid_ds is plain data; all-zero is a valid value.
    let mut ds: libc::msqid_ds = unsafe { std::mem::zeroed() };
    // SAFETY: IPC_STAT fills the msqid_ds we own.
    int("msgctl(IPC_STAT)", unsafe { libc::msgctl(id, libc::IPC_STAT, &mut ds) })?;
    Ok(ds)
}

/// msgctl(IPC_SET): the kernel takes owner, mode and msg_qbytes from `ds`.
pub fn msg_set(id: i32, ds: &libc::msqid_ds) -> SysResult<()> {
    let mut ds = *ds;
    // SAFETY: IPC_SET only reads the msqid_ds.
    int("msgctl(IPC_SET)", unsafe { libc::msgctl(id, libc::IPC_SET, &mut ds) }).map(drop)
}

/// msgrcv(MSG_COPY | IPC_NOWAIT): a copy of the message at `index` of the
/// queue, which stays queued. `buf` is scratch space: its length, less
/// the 8 bytes of the type, is the largest text accepted. Returns the
/// message type and its text (inside `buf`).
pub fn msg_copy(id: i32, index: usize, buf: &mut [u8]) -> SysResult<(i64, &[u8])> {
    if buf.len() < 8 {
        return Err(SysError::new("msgrcv(MSG_COPY)", libc::EINVAL));
    }
    let max = buf.len() - 8;
    // SAFETY: buf holds a long (the type) and `max` bytes of text; the
    // kernel writes no more than that.
    let n = unsafe {
        libc::msgrcv(
            id,
            buf.as_mut_ptr().cast(),
            max,
            index as libc::c_long,
            libc::IPC_NOWAIT | MSG_COPY,
        )
    };
    if n < 0 {
        return Err(last_error("msgrcv(MSG_COPY)"));
    }
    let mtype = i64::from_ne_bytes(buf[..8].try_into().unwrap_or([0; 8]));
    Ok((mtype, &buf[8..8 + (n as usize).min(max)]))
}

/// msgsnd(2) of one message of type `mtype`.
pub fn msg_send(id: i32, mtype: i64, text: &[u8], flags: i32) -> SysResult<()> {
    let mut buf = Vec::with_capacity(8 + text.len());
    buf.extend_from_slice(&mtype.to_ne_bytes());
    buf.extend_from_slice(text);
    // SAFETY: buf is a long (the type) followed by text.len() bytes; the
    // kernel only reads it.
    int("msgsnd", unsafe { libc::msgsnd(id, buf.as_ptr().cast(), text.len(), flags) }).map(drop)
}
