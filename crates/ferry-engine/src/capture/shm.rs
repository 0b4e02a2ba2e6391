//! Shared memory between processes: anonymous shared mappings (the
//! kernel's shmem files behind MAP_SHARED | MAP_ANONYMOUS) and SysV
//! segments. Each object is stored once for the whole tree, with the
//! extents that hold data, read through /proc/PID/map_files.

use crate::error::{EngineError, Result};
use crate::procfs::MapsEntry;
use ferry_image::{MemfdObject, SysvShm, Vma, VmaBacking};

fn open_mapping(pid: i32, m: &MapsEntry) -> Result<std::fs::File> {
    let path = format!("/proc/{pid}/map_files/{:x}-{:x}", m.start, m.end);
    std::fs::File::open(&path).map_err(|e| EngineError::io(&path, e))
}

/// Every anonymous shared memory object any process maps, once.
pub fn capture_shared_anon(procs: &[(i32, &[Vma], &[MapsEntry])]) -> Result<Vec<MemfdObject>> {
    let mut out: Vec<MemfdObject> = Vec::new();
    for &(pid, vmas, smaps) in procs {
        for (v, m) in vmas.iter().zip(smaps) {
            let VmaBacking::SharedAnon { id } = v.backing else {
                continue;
            };
            if out.iter().any(|o| o.id == id) {
                continue;
            }
            out.push(super::memfd::read_object(pid, id, "", open_mapping(pid, m)?)?);
        }
    }
    Ok(out)
}

/// One line of /proc/sysvipc/shm for segment `id`.
struct SegmentInfo {
    key: i32,
    mode: u32,
    size: u64,
    uid: u32,
    gid: u32,
}

fn segment_info(id: i32) -> Result<SegmentInfo> {
    use super::sysv_ipc::{column, mode, table};
    let path = "/proc/sysvipc/shm";
    // key shmid perms size cpid lpid nattch uid gid cuid cgid ...
    let row = table(path)?
        .into_iter()
        .find(|row| row.get(1).and_then(|v| v.parse::<i32>().ok()) == Some(id))
        .ok_or_else(|| EngineError::Parse {
            path: path.into(),
            what: format!("no SysV segment {id}"),
        })?;
    Ok(SegmentInfo {
        key: column::<i64>(path, &row, 0)? as i32,
        mode: mode(path, &row)?,
        size: column(path, &row, 3)?,
        uid: column(path, &row, 7)?,
        gid: column(path, &row, 8)?,
    })
}

/// Every SysV segment any process has attached, once, with its key,
/// permissions and content.
pub fn capture_sysv(procs: &[(i32, &[Vma], &[MapsEntry])]) -> Result<Vec<SysvShm>> {
    let mut out: Vec<SysvShm> = Vec::new();
    for &(pid, vmas, smaps) in procs {
        for (v, m) in vmas.iter().zip(smaps) {
            let VmaBacking::SysvShm { id } = v.backing else {
                continue;
            };
            if out.iter().any(|o| o.id == id) {
                continue;
            }
            let info = segment_info(id)?;
            if v.pgoff != 0 || v.end - v.start < info.size.div_ceil(4096) * 4096 {
                return Err(EngineError::unsupported(
                    pid,
                    format!("SysV segment {id} at {:#x}", v.start),
                    "only partly attached",
                ));
            }
            let obj = super::memfd::read_object(pid, id as u64, "", open_mapping(pid, m)?)?;
            out.push(SysvShm {
                id,
                key: info.key,
                size: info.size,
                mode: info.mode,
                uid: info.uid,
                gid: info.gid,
                extents: obj.extents,
            });
        }
    }
    Ok(out)
}

/// Removes captured segments once the tree that used them is gone: the
/// image holds them now, and restore recreates them under the same ids.
pub fn remove_sysv(segments: &[SysvShm]) {
    for s in segments {
        let _ = ferry_sys::sysv::shm_remove(s.id);
    }
}
