//! Private anonymous memory of ferry's own, placed at the address a
//! restored process will have it, so that the process can inherit it
//! over fork instead of having every page copied in during the pause.

use crate::{last_error, SysError, SysResult};

/// include/uapi/asm-generic/mman-common.h (Linux 6.1).
const MADV_COLLAPSE: i32 = 25;

/// Private anonymous read-write memory at a fixed address, unmapped on
/// drop. It hands out no references into itself: its bytes are only
/// ever copied in, so unmapping it never invalidates a Rust reference.
#[derive(Debug)]
pub struct PlacedRegion {
    addr: u64,
    len: usize,
}

impl PlacedRegion {
    /// Maps `len` bytes at exactly `addr`; EEXIST when any mapping of
    /// ours is in the way.
    pub fn map(addr: u64, len: usize) -> SysResult<PlacedRegion> {
        let page_offset = |v: u64| v & (crate::PAGE_SIZE - 1);
        if page_offset(addr) != 0 || len == 0 || page_offset(len as u64) != 0 {
            return Err(SysError::new("mmap(MAP_FIXED_NOREPLACE)", libc::EINVAL));
        }
        // No MAP_NORESERVE: a process inheriting the mapping must see the
        // flags an ordinary anonymous mapping has.
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE;
        // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping, so
        // no memory in use is touched; the new range belongs to us alone.
        let p = unsafe {
            libc::mmap(
                addr as *mut libc::c_void,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(last_error("mmap(MAP_FIXED_NOREPLACE)"));
        }
        if p as u64 != addr {
            // A kernel that ignores the flag places it elsewhere.
            // SAFETY: unmapping the mapping just made.
            unsafe { libc::munmap(p, len) };
            return Err(SysError::new("mmap(MAP_FIXED_NOREPLACE)", libc::EEXIST));
        }
        Ok(PlacedRegion { addr, len })
    }

    pub fn start(&self) -> u64 {
        self.addr
    }

    pub fn end(&self) -> u64 {
        self.addr + self.len as u64
    }

    /// Whether a process forked from this one gets a copy of the region
    /// (MADV_DOFORK, the default) or not (MADV_DONTFORK).
    pub fn set_inherited(&self, on: bool) -> SysResult<()> {
        let advice = if on { libc::MADV_DOFORK } else { libc::MADV_DONTFORK };
        // SAFETY: advice on exactly our own live mapping; neither advice
        // changes its content or its addresses, only what a fork copies.
        if unsafe { libc::madvise(self.addr as *mut libc::c_void, self.len, advice) } < 0 {
            return Err(last_error(if on {
                "madvise(MADV_DOFORK)"
            } else {
                "madvise(MADV_DONTFORK)"
            }));
        }
        Ok(())
    }

    /// Backs `len` bytes at byte `offset` of the region (2 MiB-aligned
    /// addresses, a present page in each 2 MiB) with transparent huge
    /// pages (MADV_COLLAPSE: whatever the THP setting, without marking
    /// the mapping VM_HUGEPAGE, which a process inheriting it would show).
    /// The content is unchanged; pages never written read as zeros.
    pub fn collapse(&self, offset: usize, len: usize) -> SysResult<()> {
        if offset.checked_add(len).is_none_or(|e| e > self.len) {
            return Err(SysError::new("madvise(MADV_COLLAPSE)", libc::EINVAL));
        }
        // SAFETY: advice on a part of our own live mapping; a collapse
        // copies the pages into huge pages at the same addresses and keeps
        // their content, and no Rust reference into the region exists.
        let r = unsafe {
            libc::madvise((self.addr as usize + offset) as *mut libc::c_void, len, MADV_COLLAPSE)
        };
        if r < 0 {
            return Err(last_error("madvise(MADV_COLLAPSE)"));
        }
        Ok(())
    }

    /// Copies process `pid`'s memory at `ranges` (page-aligned, each
    /// inside the region) into the region at the same addresses, with
    /// process_vm_readv straight into it. Returns the bytes copied: in
    /// order, the first range that could not be read whole ends the copy.
    /// Takes `&self`: the bytes are written by the kernel into memory no
    /// Rust reference points into, so threads may each copy into a part
    /// of one region at once.
    pub fn read_from(&self, pid: i32, ranges: &[(u64, u64)]) -> SysResult<u64> {
        if ranges.iter().any(|&(s, e)| s < self.addr || e > self.end() || s > e) {
            return Err(SysError::new("process_vm_readv", libc::EINVAL));
        }
        let iov = |&(s, e): &(u64, u64)| libc::iovec {
            iov_base: s as usize as *mut libc::c_void,
            iov_len: (e - s) as usize,
        };
        let mut done = 0u64;
        for chunk in ranges.chunks(crate::vm::MAX_IOV) {
            let iovs: Vec<libc::iovec> = chunk.iter().map(iov).collect();
            let total: u64 = chunk.iter().map(|&(s, e)| e - s).sum();
            // SAFETY: every local iovec lies inside our live read-write
            // mapping (checked above), which no Rust reference points
            // into; the remote ones are addresses the kernel checks.
            let r = unsafe {
                libc::process_vm_readv(
                    pid,
                    iovs.as_ptr(),
                    iovs.len() as u64,
                    iovs.as_ptr(),
                    iovs.len() as u64,
                    0,
                )
            };
            if r < 0 {
                return Err(last_error("process_vm_readv"));
            }
            done += r as u64;
            if (r as u64) < total {
                break;
            }
        }
        Ok(done)
    }

    /// Copies `data` in at byte `offset` of the region.
    pub fn write(&mut self, offset: usize, data: &[u8]) -> SysResult<()> {
        if offset.checked_add(data.len()).is_none_or(|e| e > self.len) {
            return Err(SysError::new("PlacedRegion::write", libc::EINVAL));
        }
        // SAFETY: the destination lies inside our live read-write mapping
        // (checked above) and cannot overlap `data`, which Rust owns
        // elsewhere; no reference into the region exists.
        unsafe {
            std::ptr::copy_nonoverlapping(
                data.as_ptr(),
                (self.addr as usize + offset) as *mut u8,
                data.len(),
            )
        };
        Ok(())
    }

    /// Copies bytes out of the region at byte `offset`.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> SysResult<()> {
        if offset.checked_add(out.len()).is_none_or(|e| e > self.len) {
            return Err(SysError::new("PlacedRegion::read", libc::EINVAL));
        }
        // SAFETY: the source lies inside our live mapping (checked above)
        // and `out` is Rust memory elsewhere.
        unsafe {
            std::ptr::copy_nonoverlapping(
                (self.addr as usize + offset) as *const u8,
                out.as_mut_ptr(),
                out.len(),
            )
        };
        Ok(())
    }

    /// The ranges of `regions`, for a process forked from this one to
    /// drop its inherited copies with [`InheritedRegions::unmap`].
    pub fn inherited(regions: &[&PlacedRegion]) -> InheritedRegions {
        InheritedRegions {
            ranges: regions.iter().map(|r| (r.addr, r.len)).collect(),
            owner: Some(Owner::this_process()),
        }
    }
}

impl Drop for PlacedRegion {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly our own mapping; nothing references it.
        unsafe { libc::munmap(self.addr as *mut libc::c_void, self.len) };
    }
}

/// The process that made the placed regions: its PID and, to tell it
/// from a forked child that has the same PID number in a new PID
/// namespace, the inode of its PID namespace (0 if /proc cannot say).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Owner {
    pid: u32,
    pid_ns: u64,
}

impl Owner {
    fn this_process() -> Owner {
        use std::os::unix::fs::MetadataExt;
        let pid_ns = std::fs::metadata("/proc/self/ns/pid").map_or(0, |m| m.ino());
        Owner { pid: std::process::id(), pid_ns }
    }

    /// Whether the caller may be the owner: same PID, and not provably
    /// in another PID namespace. A PID never changes, so the owner itself
    /// always answers yes.
    fn may_be_this_process(&self) -> bool {
        let here = Owner::this_process();
        here.pid == self.pid && (here.pid_ns == self.pid_ns || here.pid_ns == 0 || self.pid_ns == 0)
    }
}

/// The ranges of placed regions as a forked child of their owner sees
/// them: its own copies, which no Rust value of the child owns.
#[derive(Debug, Clone, Default)]
pub struct InheritedRegions {
    ranges: Vec<(u64, usize)>,
    /// None only for the empty value of `Default`.
    owner: Option<Owner>,
}

impl InheritedRegions {
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// Unmaps the inherited copies, in a process forked after the regions
    /// were made. In their owner the ranges are the live PlacedRegions,
    /// which unmapping would leave dangling: there it refuses (EPERM)
    /// and unmaps nothing.
    pub fn unmap(self) -> SysResult<()> {
        if self.ranges.is_empty() {
            return Ok(());
        }
        if self.owner.is_none_or(|o| o.may_be_this_process()) {
            return Err(SysError::new(
                "munmap(inherited placed region) in the process that owns it",
                libc::EPERM,
            ));
        }
        for (addr, len) in self.ranges {
            // SAFETY: the check above makes this a process other than the
            // regions' owner, so these are copies inherited over fork;
            // the owner hands out no references into its regions, so no
            // Rust reference in this process points there.
            if unsafe { libc::munmap(addr as *mut libc::c_void, len) } < 0 {
                return Err(last_error("munmap(inherited placed region)"));
            }
        }
        Ok(())
    }
}
