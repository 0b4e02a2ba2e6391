//! Cross-process memory copies (process_vm_readv / process_vm_writev).

use crate::{last_error, SysResult};

/// Largest number of iovecs one call accepts (UIO_MAXIOV).
pub const MAX_IOV: usize = 1024;

/// One remote range: address in the other process and length.
#[derive(Debug, Clone, Copy)]
pub struct RemoteRange {
    pub addr: u64,
    pub len: usize,
}

fn remote_iovs(ranges: &[RemoteRange]) -> Vec<libc::iovec> {
    ranges
        .iter()
        .map(|r| libc::iovec { iov_base: r.addr as *mut libc::c_void, iov_len: r.len })
        .collect()
}

/// Reads `ranges` of process `pid` into `buf` (concatenated). Returns bytes read.
pub fn read_remote(pid: i32, buf: &mut [u8], ranges: &[RemoteRange]) -> SysResult<usize> {
    let mut done = 0usize;
    for chunk in ranges.chunks(MAX_IOV) {
        let total: usize = chunk.iter().map(|r| r.len).sum();
        let local = libc::iovec { iov_base: buf[done..].as_mut_ptr().cast(), iov_len: total };
        let remote = remote_iovs(chunk);
        // SAFETY: `local` covers `total` writable bytes of `buf` (the slice
        // index panics first if buf is too short); remote iovecs are only
        // addresses in the other process, checked by the kernel.
        let r = unsafe {
            libc::process_vm_readv(pid, &local, 1, remote.as_ptr(), remote.len() as u64, 0)
        };
        if r < 0 {
            return Err(last_error("process_vm_readv"));
        }
        done += r as usize;
        if (r as usize) < total {
            break;
        }
    }
    Ok(done)
}

/// Writes `buf` (concatenated) into `ranges` of process `pid`. Returns bytes written.
pub fn write_remote(pid: i32, buf: &[u8], ranges: &[RemoteRange]) -> SysResult<usize> {
    let mut done = 0usize;
    for chunk in ranges.chunks(MAX_IOV) {
        let total: usize = chunk.iter().map(|r| r.len).sum();
        let local =
            libc::iovec { iov_base: buf[done..done + total].as_ptr() as *mut _, iov_len: total };
        let remote = remote_iovs(chunk);
        // SAFETY: `local` covers `total` readable bytes of `buf`; the kernel
        // only reads through it.
        let r = unsafe {
            libc::process_vm_writev(pid, &local, 1, remote.as_ptr(), remote.len() as u64, 0)
        };
        if r < 0 {
            return Err(last_error("process_vm_writev"));
        }
        done += r as usize;
        if (r as usize) < total {
            break;
        }
    }
    Ok(done)
}
