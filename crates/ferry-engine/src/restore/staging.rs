//! Objects ferry creates in its own process before the tree is forked, so
//! every restored process inherits them under known fd numbers (all at or
//! above `temp_base`, above every fd an image uses): files to map,
//! executables, memfds, anonymous shared memory, and SysV segments (which
//! need no fd: they are recreated under their old ids).

use super::memory;
use crate::error::{EngineError, Result};
use ferry_image::{MemfdObject, SysvShm, TreeImage, VmaBacking};
use ferry_sys::sysv;
use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::FileExt;

/// Staged descriptors by (path or object key, opened read-write).
pub type StagingMap = HashMap<(String, bool), RawFd>;

pub struct Staging {
    pub map: StagingMap,
    /// Executable of each process, by pid.
    pub exes: HashMap<i32, RawFd>,
    /// memfds by id, with the seals to apply once every mapping exists.
    pub memfds: HashMap<u64, (RawFd, i32)>,
    owned: Vec<OwnedFd>,
    temp_base: RawFd,
}

impl Staging {
    fn lift(&mut self, pid: i32, fd: OwnedFd, what: &str) -> Result<RawFd> {
        let high = ferry_sys::fd::dup_above(fd.as_raw_fd(), self.temp_base)
            .map_err(|e| EngineError::kernel(pid, format!("staging {what}"), e))?;
        let raw = high.as_raw_fd();
        self.owned.push(high);
        Ok(raw)
    }

    fn open(&mut self, pid: i32, path: &str, rw: bool, what: String) -> Result<RawFd> {
        if let Some(fd) = self.map.get(&(path.to_string(), rw)) {
            return Ok(*fd);
        }
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(rw)
            .open(path)
            .map_err(|e| EngineError::io(format!("pid {pid}: {what} {path}"), e))?;
        let fd = self.lift(pid, f.into(), "a file")?;
        self.map.insert((path.to_string(), rw), fd);
        Ok(fd)
    }

    /// Keeps the staged descriptors of the parent ferry process open until
    /// the restore ends (memfd seals are applied then).
    pub fn keep_fds(&self) -> Vec<RawFd> {
        self.owned.iter().map(|f| f.as_raw_fd()).collect()
    }
}

fn fill(pid: i32, file: &std::fs::File, what: &str, extents: &[(u64, Vec<u8>)]) -> Result<()> {
    for (off, data) in extents {
        file.write_all_at(data, *off)
            .map_err(|e| EngineError::io(format!("pid {pid}: {what}"), e))?;
    }
    Ok(())
}

/// A mapped file that had been deleted: created again at its old path
/// (or next to it when that is taken) with its content and mode, opened,
/// and deleted again, so the mapping shows "PATH (deleted)" as before.
/// A mapped file deleted since, made again with its content and unlinked.
/// Read-only unless a shared mapping needs it writable: a descriptor open
/// for writing would keep PR_SET_MM_MAP from making the file a process's
/// executable (EACCES), as it keeps exec from running it.
fn recreate_deleted(pid: i32, d: &MemfdObject, writable: bool) -> Result<OwnedFd> {
    use std::os::unix::fs::OpenOptionsExt;
    let _parents = super::files::regular::MadeParents::for_path(pid, &d.name)?;
    let mut name = d.name.clone();
    let mut n = 0;
    let f = loop {
        match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&name)
        {
            Ok(f) => break f,
            Err(_) if n < 100 => {
                n += 1;
                name = format!("{}.ferry-{pid}-{n}", d.name);
            }
            Err(e) => {
                return Err(EngineError::io(
                    format!("pid {pid}: recreating deleted mapped file {}", d.name),
                    e,
                ))
            }
        }
    };
    let done = (|| {
        f.set_len(d.size).map_err(|e| EngineError::io(format!("deleted mapped file {name}"), e))?;
        fill(pid, &f, &format!("deleted mapped file {name}"), &d.extents)?;
        ferry_sys::fd::set_mode_owner(f.as_raw_fd(), d.seals as u32 & 0o7777, 0, 0)
            .map_err(|e| EngineError::kernel(pid, format!("mode of {name}"), e))
    })();
    let _ = std::fs::remove_file(&name);
    done?;
    if writable {
        return Ok(f.into());
    }
    let ro = std::fs::File::open(format!("/proc/self/fd/{}", f.as_raw_fd()))
        .map_err(|e| EngineError::io(format!("pid {pid}: reopening deleted file {name}"), e))?;
    Ok(ro.into())
}

/// F_SEAL_WRITE goes on before any mapping of the memfd exists: the
/// kernel refuses it (EBUSY) once a shared mapping may write, and a
/// read-only shared mapping made before the seal may (VM_MAYWRITE), one
/// made after it may not, as in the sealed original. The other seals
/// wait for the end of the restore (`finish::seal_memfds`): a mapping
/// made writable before F_SEAL_FUTURE_WRITE keeps writing.
fn seal_writes_now(pid: i32, fd: RawFd, m: &MemfdObject) -> Result<()> {
    let seals = m.seals & libc::F_SEAL_WRITE;
    if seals == 0 {
        return Ok(());
    }
    ferry_sys::fd::fcntl_int(fd, libc::F_ADD_SEALS, seals as libc::c_long, "fcntl(F_ADD_SEALS)")
        .map_err(|e| {
            EngineError::kernel(pid, format!("sealing memfd {} against writes", m.name), e)
        })?;
    Ok(())
}

/// The executable of a process whose binary was deleted while it ran (a
/// package upgrade): the deleted file its text is mapped from, made again
/// above (the checkpoint refused an executable not mapped so), opened
/// read-only for PR_SET_MM_MAP.
fn deleted_exe(st: &mut Staging, p: &ferry_image::ProcessImage, path: &str) -> Result<RawFd> {
    let d = p.fidelity.deleted_files.iter().find(|d| d.name == path).ok_or_else(|| {
        EngineError::restore(p.pid, format!("its deleted executable {path} is not in the image"))
    })?;
    let rw = st.map.get(&(memory::deleted_key(d.id), true)).copied().ok_or_else(|| {
        EngineError::restore(p.pid, format!("its deleted executable {path} was not made again"))
    })?;
    let proc_path = format!("/proc/self/fd/{rw}");
    let f = std::fs::File::open(&proc_path).map_err(|e| {
        EngineError::io(format!("pid {}: opening its deleted executable {path} again", p.pid), e)
    })?;
    st.lift(p.pid, f.into(), "the deleted executable")
}

fn new_memfd(pid: i32, m: &MemfdObject) -> Result<OwnedFd> {
    let name = std::ffi::CString::new(m.name.replace('\0', "")).unwrap_or_default();
    let fd = ferry_sys::fd::memfd_create(&name, libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
        .map_err(|e| EngineError::kernel(pid, format!("recreating memfd {}", m.name), e))?;
    let f = std::fs::File::from(fd);
    f.set_len(m.size).map_err(|e| EngineError::io(format!("memfd {}", m.name), e))?;
    fill(pid, &f, &format!("memfd {}", m.name), &m.extents)?;
    Ok(f.into())
}

/// A real anonymous shared memory object (the kernel's "/dev/zero"
/// shmem file, as MAP_SHARED | MAP_ANONYMOUS makes), reached through
/// /proc/self/map_files so it can be mapped by fd in every process.
fn new_shared_anon(pid: i32, m: &MemfdObject) -> Result<OwnedFd> {
    let len = m.size.max(4096).div_ceil(4096) * 4096;
    let mapping = ferry_sys::process::SharedAnon::map(len as usize).map_err(|e| {
        EngineError::kernel(pid, format!("creating shared memory of {len} bytes"), e)
    })?;
    let path = format!("/proc/self/map_files/{:x}-{:x}", mapping.start(), mapping.start() + len);
    let opened = std::fs::OpenOptions::new().read(true).write(true).open(&path);
    // Unmapped; the object lives on in the fd.
    drop(mapping);
    let f = opened.map_err(|e| EngineError::io(&path, e))?;
    fill(pid, &f, "shared memory", &m.extents)?;
    Ok(f.into())
}

const SHM_DEST: u32 = 0o1000;

/// Recreates a SysV segment under its old id (via shm_next_id), with its
/// key, owner, permissions and content.
fn new_sysv(pid: i32, s: &SysvShm) -> Result<()> {
    let what = format!("SysV segment {} (key {:#x})", s.id, s.key);
    let create = || {
        sysv::shm_get(
            s.key,
            s.size as usize,
            libc::IPC_CREAT | libc::IPC_EXCL | (s.mode & 0o777) as i32,
        )
    };
    let remove = |id| {
        let _ = sysv::shm_remove(id);
    };
    super::sysv_ipc::create_with_id(
        pid,
        "/proc/sys/kernel/shm_next_id",
        s.id,
        &what,
        create,
        remove,
    )?;
    let got = s.id;
    let result = (|| {
        let mut at = sysv::ShmAttachment::attach(got)
            .map_err(|e| EngineError::kernel(pid, format!("attaching SysV segment {got}"), e))?;
        let seg = at.bytes_mut();
        let size = seg.len();
        for (off, data) in &s.extents {
            // Extents were validated to lie within the segment's size.
            let dst = usize::try_from(*off).ok().and_then(|o| seg.get_mut(o..o.checked_add(data.len())?)).ok_or_else(|| {
                EngineError::restore(pid, format!("SysV segment {got}: {} bytes at offset {off} do not fit in {size} bytes", data.len()))
            })?;
            dst.copy_from_slice(data);
        }
        drop(at);
        if let Ok(mut ds) = sysv::shm_stat(got) {
            ds.shm_perm.uid = s.uid;
            ds.shm_perm.gid = s.gid;
            ds.shm_perm.mode = (s.mode & 0o777) as _;
            sysv::shm_set(got, &ds).map_err(|e| {
                EngineError::kernel(pid, format!("setting owner of SysV segment {got}"), e)
            })?;
        }
        Ok(())
    })();
    if result.is_err() {
        // Removing the half-made segment.
        let _ = sysv::shm_remove(got);
    }
    result
}

/// The SysV segments this restore made; removed again on drop unless
/// the restore succeeded.
pub struct SysvSegments {
    ids: Vec<i32>,
    destroyed: Vec<i32>,
    pub keep: bool,
}

impl SysvSegments {
    /// Recreates every segment of the tree.
    pub fn create(tree: &TreeImage) -> Result<SysvSegments> {
        let root = tree.processes.first().map_or(0, |p| p.pid);
        let mut made = SysvSegments { ids: Vec::new(), destroyed: Vec::new(), keep: false };
        for s in &tree.sysv_shm {
            new_sysv(root, s)?;
            made.ids.push(s.id);
            if s.mode & SHM_DEST != 0 {
                made.destroyed.push(s.id);
            }
        }
        Ok(made)
    }

    /// Segments that were marked for removal are removed again once every
    /// process has attached them.
    pub fn remove_destroyed(&self) {
        for &id in &self.destroyed {
            let _ = sysv::shm_remove(id);
        }
    }
}

impl Drop for SysvSegments {
    fn drop(&mut self) {
        if !self.keep {
            for &id in &self.ids {
                // Removing a segment this restore created.
                let _ = sysv::shm_remove(id);
            }
        }
    }
}

pub fn stage(tree: &TreeImage, temp_base: RawFd) -> Result<Staging> {
    let mut st = Staging {
        map: HashMap::new(),
        exes: HashMap::new(),
        memfds: HashMap::new(),
        owned: Vec::new(),
        temp_base,
    };
    let root = tree.processes.first().map_or(0, |p| p.pid);
    for p in &tree.processes {
        for m in &p.memfds {
            if st.memfds.contains_key(&m.id) {
                continue;
            }
            let fd = new_memfd(p.pid, m)?;
            let fd = st.lift(p.pid, fd, "a memfd")?;
            // Mode and owner as fchmod/fchown left them (memfd_create
            // makes it 0777, owned by ferry).
            if let Some(a) =
                p.fidelity.inode_attrs.iter().find(|a| a.of == ferry_image::InodeOf::Memfd(m.id))
            {
                ferry_sys::fd::set_mode_owner(fd, a.mode, a.uid, a.gid).map_err(|e| {
                    EngineError::kernel(
                        p.pid,
                        format!(
                            "giving memfd {} mode {:o} and owner {}:{}",
                            m.name, a.mode, a.uid, a.gid
                        ),
                        e,
                    )
                })?;
            }
            seal_writes_now(p.pid, fd, m)?;
            st.memfds.insert(m.id, (fd, m.seals));
            st.map.insert((memory::memfd_key(m.id), true), fd);
        }
    }
    for p in &tree.processes {
        for d in &p.fidelity.deleted_files {
            let key = (memory::deleted_key(d.id), true);
            if st.map.contains_key(&key) {
                continue;
            }
            let shared = tree.processes.iter().flat_map(|p| &p.vmas).any(|v| {
                v.shared && matches!(v.backing, VmaBacking::DeletedFile { id } if id == d.id)
            });
            let fd = recreate_deleted(p.pid, d, shared)?;
            let fd = st.lift(p.pid, fd, "a deleted file")?;
            st.map.insert(key, fd);
        }
    }
    for m in &tree.shared_anon {
        let fd = new_shared_anon(root, m)?;
        let fd = st.lift(root, fd, "shared memory")?;
        st.map.insert((memory::shmem_key(m.id), true), fd);
    }
    for p in &tree.processes {
        for v in &p.vmas {
            if let VmaBacking::File { path, .. } = &v.backing {
                st.open(
                    p.pid,
                    path,
                    memory::needs_rw(v),
                    format!("file mapped at {:#x}:", v.start),
                )?;
            }
        }
        let exe = match p.exe.strip_suffix(" (deleted)") {
            Some(old) => Some(deleted_exe(&mut st, p, old)?),
            None => st.open(p.pid, &p.exe, false, "executable".into()).ok(),
        };
        if let Some(fd) = exe {
            st.exes.insert(p.pid, fd);
        }
    }
    Ok(st)
}
