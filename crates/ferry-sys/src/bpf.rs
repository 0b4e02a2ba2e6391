//! The one bpf(2) command ferry needs that aya does not wrap:
//! `BPF_MAP_UPDATE_BATCH`, which inserts many elements into a map with a
//! single system call (the network lock fills its map of frozen 4-tuples with
//! it, so that freezing 10,000 connections costs one syscall, not 10,000).

use crate::{last_error, SysResult};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd};

/// `BPF_MAP_UPDATE_BATCH` from include/uapi/linux/bpf.h (Linux 5.6+).
const BPF_MAP_UPDATE_BATCH: libc::c_long = 26;
/// `BPF_ANY`: create the element or overwrite it.
const BPF_ANY: u64 = 0;

/// The `batch` member of `union bpf_attr`.
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// A type whose values can be handed to the kernel as a map key or value:
/// plain bytes with no padding, whose size is the map's key or value size.
///
/// # Safety
/// Implementors must be `#[repr(C)]` (or a primitive/array of primitives)
/// without padding bytes, valid for any bit pattern the kernel may copy back.
pub unsafe trait MapPod: Copy {}

// SAFETY: primitive integers and arrays of them have no padding.
unsafe impl MapPod for u8 {}
// SAFETY: as above.
unsafe impl MapPod for u32 {}
// SAFETY: as above.
unsafe impl MapPod for u64 {}
// SAFETY: arrays of padding-free types are padding-free.
unsafe impl<T: MapPod, const N: usize> MapPod for [T; N] {}

/// Inserts `keys[i] -> values[i]` for every i into the map behind `map` with
/// one `BPF_MAP_UPDATE_BATCH` call (flag `BPF_ANY`). `K` and `V` must have
/// exactly the map's key and value sizes. Returns how many elements the
/// kernel inserted; on failure the error names the call, and elements before
/// the failing one may already be in the map.
pub fn map_update_batch<K: MapPod, V: MapPod>(
    map: BorrowedFd<'_>,
    keys: &[K],
    values: &[V],
) -> SysResult<u32> {
    if keys.len() != values.len() || u32::try_from(keys.len()).is_err() {
        return Err(crate::SysError::new(
            "BPF_MAP_UPDATE_BATCH (keys and values differ in number)",
            libc::EINVAL,
        ));
    }
    if keys.is_empty() {
        return Ok(0);
    }
    let mut attr = BatchAttr {
        keys: keys.as_ptr() as u64,
        values: values.as_ptr() as u64,
        count: keys.len() as u32,
        map_fd: map.as_raw_fd() as u32,
        elem_flags: BPF_ANY,
        ..Default::default()
    };
    // SAFETY: attr is a properly initialised `bpf_attr.batch`; keys and values
    // point to `count` elements each that stay borrowed for the whole call; the
    // kernel only reads them (MapPod guarantees no padding), and writes back
    // nothing but attr.count, which lives on our stack.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_MAP_UPDATE_BATCH,
            &mut attr as *mut BatchAttr,
            std::mem::size_of::<BatchAttr>(),
        )
    };
    if ret < 0 {
        return Err(last_error("bpf(BPF_MAP_UPDATE_BATCH)"));
    }
    Ok(attr.count)
}

/// `BPF_MAP_UPDATE_ELEM` and `BPF_OBJ_GET` from include/uapi/linux/bpf.h.
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_OBJ_GET: libc::c_long = 7;

/// The `map_*_elem` member of `union bpf_attr`.
#[repr(C)]
#[derive(Default)]
struct ElemAttr {
    map_fd: u32,
    pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

/// The `obj_pin`/`obj_get` member of `union bpf_attr`.
#[repr(C)]
#[derive(Default)]
struct ObjAttr {
    pathname: u64,
    bpf_fd: u32,
    file_flags: u32,
    path_fd: i32,
    pad: u32,
}

/// Sets `key -> value` in the map behind `map` with one
/// `BPF_MAP_UPDATE_ELEM` call (flag `BPF_ANY`). `K` and `V` must have exactly
/// the map's key and value sizes.
pub fn map_update_elem<K: MapPod, V: MapPod>(
    map: BorrowedFd<'_>,
    key: &K,
    value: &V,
) -> SysResult<()> {
    let mut attr = ElemAttr {
        map_fd: map.as_raw_fd() as u32,
        key: key as *const K as u64,
        value: value as *const V as u64,
        flags: BPF_ANY,
        ..Default::default()
    };
    // SAFETY: attr is a properly initialised `bpf_attr` for map element
    // commands; key and value point to live, padding-free (MapPod) values
    // borrowed for the whole call, which the kernel only reads.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_MAP_UPDATE_ELEM,
            &mut attr as *mut ElemAttr,
            std::mem::size_of::<ElemAttr>(),
        )
    };
    if ret < 0 {
        return Err(last_error("bpf(BPF_MAP_UPDATE_ELEM)"));
    }
    Ok(())
}

/// Opens a pinned BPF object (map, program, link) from its bpffs path with
/// `BPF_OBJ_GET`; the fd is close-on-exec.
pub fn obj_get(path: &std::path::Path) -> SysResult<std::os::fd::OwnedFd> {
    use std::os::unix::ffi::OsStrExt;
    let Ok(cpath) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return Err(crate::SysError::new("BPF_OBJ_GET (path contains a NUL byte)", libc::EINVAL));
    };
    let mut attr = ObjAttr { pathname: cpath.as_ptr() as u64, ..Default::default() };
    // SAFETY: attr is a properly initialised `bpf_attr.obj_get` (bpf_fd and
    // file_flags 0, path_fd 0 and unused without BPF_F_PATH_FD); pathname
    // points to a NUL-terminated string that outlives the call.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_OBJ_GET,
            &mut attr as *mut ObjAttr,
            std::mem::size_of::<ObjAttr>(),
        )
    };
    if ret < 0 {
        return Err(last_error("bpf(BPF_OBJ_GET)"));
    }
    let Ok(fd) = i32::try_from(ret) else {
        return Err(crate::SysError::new("BPF_OBJ_GET (fd out of range)", libc::EBADF));
    };
    use std::os::fd::FromRawFd;
    // SAFETY: the kernel just returned this fd to us; nothing else owns it.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}

/// The values of a `BPF_F_MMAPABLE` array map, mapped shared and writable
/// into this process: writes are seen by BPF programs at once, with no
/// syscall. Unmapped on drop (the map lives on while pinned or open).
#[derive(Debug)]
pub struct MappedArray {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain shared memory owned by this value; moving the
// owner to another thread is fine (no thread-local state), and `&mut self`
// is required for writes, so Rust's aliasing rules hold within the process.
unsafe impl Send for MappedArray {}

impl MappedArray {
    /// Maps the first `len` bytes (rounded up to pages by the kernel) of the
    /// array map behind `map`, which must have been created with
    /// `BPF_F_MMAPABLE` and hold at least `len` bytes of values.
    pub fn map(map: BorrowedFd<'_>, len: usize) -> SysResult<MappedArray> {
        if len == 0 {
            return Err(crate::SysError::new("mmap of a BPF array (empty)", libc::EINVAL));
        }
        // SAFETY: a fresh shared mapping at an address the kernel picks, of a
        // BPF map fd; it aliases no Rust object. MAP_POPULATE pre-faults it.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                map.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(last_error("mmap of a BPF array"));
        }
        Ok(MappedArray { ptr: ptr.cast(), len })
    }

    /// Moves the mapping out, leaving an empty one (no memory, nothing to
    /// unmap) in its place: an owner with a destructor can hand it on.
    pub fn take(&mut self) -> MappedArray {
        std::mem::replace(self, MappedArray { ptr: std::ptr::NonNull::dangling().as_ptr(), len: 0 })
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: ptr..ptr+len is mapped readable and writable for the life
        // of self (or len is 0 and ptr is dangling but non-null, after
        // `take`); &mut self gives exclusive access within this process
        // (BPF programs only read it).
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: as above, shared access.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl Drop for MappedArray {
    fn drop(&mut self) {
        if self.len == 0 {
            return;
        }
        // SAFETY: unmaps exactly the mapping made in `map`; no slice borrowed
        // from it can outlive self.
        unsafe {
            libc::munmap(self.ptr.cast(), self.len);
        }
    }
}

/// `BPF_MAP_LOOKUP_ELEM`, `BPF_MAP_DELETE_ELEM`, `BPF_MAP_GET_NEXT_KEY` and
/// `BPF_OBJ_GET_INFO_BY_FD` from include/uapi/linux/bpf.h.
const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
const BPF_MAP_DELETE_ELEM: libc::c_long = 3;
const BPF_MAP_GET_NEXT_KEY: libc::c_long = 4;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;

/// Runs one map element command; `key` and `value` are addresses (0 when
/// the command takes none). ENOENT is returned as `Ok(false)`.
fn elem_command(
    command: libc::c_long,
    call: &'static str,
    map: BorrowedFd<'_>,
    key: u64,
    value: u64,
) -> SysResult<bool> {
    let mut attr = ElemAttr { map_fd: map.as_raw_fd() as u32, key, value, ..Default::default() };
    // SAFETY: attr is a properly initialised `bpf_attr` for map element
    // commands; the callers pass addresses of live MapPod values borrowed for
    // the whole call, of the sizes the map was created with, and only
    // `value`/`next_key` (given as `value`) is written by the kernel.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            command,
            &mut attr as *mut ElemAttr,
            std::mem::size_of::<ElemAttr>(),
        )
    };
    if ret < 0 {
        let error = last_error(call);
        if error.errno == libc::ENOENT {
            return Ok(false);
        }
        return Err(error);
    }
    Ok(true)
}

fn zeroed<T: MapPod>() -> T {
    // SAFETY: MapPod types are valid for any bit pattern, all zeros included.
    unsafe { std::mem::zeroed() }
}

/// Reads `key`'s value; `None` when the map has no such key.
pub fn map_lookup_elem<K: MapPod, V: MapPod>(map: BorrowedFd<'_>, key: &K) -> SysResult<Option<V>> {
    let mut value = zeroed::<V>();
    let found = elem_command(
        BPF_MAP_LOOKUP_ELEM,
        "bpf(BPF_MAP_LOOKUP_ELEM)",
        map,
        key as *const K as u64,
        &mut value as *mut V as u64,
    )?;
    Ok(found.then_some(value))
}

/// Deletes `key`; false when it was not there.
pub fn map_delete_elem<K: MapPod>(map: BorrowedFd<'_>, key: &K) -> SysResult<bool> {
    elem_command(BPF_MAP_DELETE_ELEM, "bpf(BPF_MAP_DELETE_ELEM)", map, key as *const K as u64, 0)
}

/// Every key of a hash map, in the kernel's order (`BPF_MAP_GET_NEXT_KEY`
/// from no key on). Keys deleted or added meanwhile may be missed or seen.
pub fn map_keys<K: MapPod>(map: BorrowedFd<'_>) -> SysResult<Vec<K>> {
    let mut keys: Vec<K> = Vec::new();
    loop {
        let mut next = zeroed::<K>();
        let previous = keys.last().map_or(0, |k| k as *const K as u64);
        let more = elem_command(
            BPF_MAP_GET_NEXT_KEY,
            "bpf(BPF_MAP_GET_NEXT_KEY)",
            map,
            previous,
            &mut next as *mut K as u64,
        )?;
        if !more {
            return Ok(keys);
        }
        keys.push(next);
    }
}

/// The `info` member of `union bpf_attr`.
#[repr(C)]
#[derive(Default)]
struct InfoAttr {
    bpf_fd: u32,
    info_len: u32,
    info: u64,
}

/// What the kernel reports of a tcx link (`struct bpf_link_info` with its
/// `tcx` member).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcxLinkInfo {
    /// The link's program.
    pub prog_id: u32,
    /// 0 once the interface is gone (the link is then detached for good).
    pub ifindex: u32,
    /// `BPF_TCX_INGRESS` (46) or `BPF_TCX_EGRESS` (47).
    pub attach_type: u32,
}

/// `BPF_LINK_TYPE_TCX` from include/uapi/linux/bpf.h.
const BPF_LINK_TYPE_TCX: u32 = 11;

/// `BPF_OBJ_GET_INFO_BY_FD` into `info` (the kernel copies at most its
/// size); for the info structs' leading 32-bit words.
fn obj_info(fd: BorrowedFd<'_>, info: &mut [u32]) -> SysResult<()> {
    let mut attr = InfoAttr {
        bpf_fd: fd.as_raw_fd() as u32,
        info_len: std::mem::size_of_val(info) as u32,
        info: info.as_mut_ptr() as u64,
    };
    // SAFETY: attr is a properly initialised `bpf_attr.info`; info points to
    // info_len writable bytes borrowed for the whole call.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_OBJ_GET_INFO_BY_FD,
            &mut attr as *mut InfoAttr,
            std::mem::size_of::<InfoAttr>(),
        )
    };
    if ret < 0 {
        return Err(last_error("bpf(BPF_OBJ_GET_INFO_BY_FD)"));
    }
    Ok(())
}

/// Reads a link's info with `BPF_OBJ_GET_INFO_BY_FD`; `None` when the link
/// is not a tcx link.
pub fn tcx_link_info(link: BorrowedFd<'_>) -> SysResult<Option<TcxLinkInfo>> {
    // struct bpf_link_info: type, id, prog_id, then (8-aligned, at byte 16)
    // the per-type union whose tcx member is {ifindex, attach_type}.
    let mut info = [0u32; 16];
    obj_info(link, &mut info)?;
    if info[0] != BPF_LINK_TYPE_TCX {
        return Ok(None);
    }
    Ok(Some(TcxLinkInfo { prog_id: info[2], ifindex: info[4], attach_type: info[5] }))
}

/// The id of the BPF program behind `prog` (`struct bpf_prog_info.id`, the
/// second word).
pub fn prog_id(prog: BorrowedFd<'_>) -> SysResult<u32> {
    let mut info = [0u32; 8];
    obj_info(prog, &mut info)?;
    Ok(info[1])
}

/// The id of the BPF map behind `map` (`struct bpf_map_info.id`, the
/// second word): a map pinned again under the same path has another id.
pub fn map_id(map: BorrowedFd<'_>) -> SysResult<u32> {
    let mut info = [0u32; 8];
    obj_info(map, &mut info)?;
    Ok(info[1])
}

/// A loaded program as `bpf_prog_info` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProgInfo {
    pub id: u32,
    /// `enum bpf_prog_type`.
    pub prog_type: u32,
    /// The kernel's hash of the program's instructions: two programs with
    /// the same tag run the same code.
    pub tag: [u8; 8],
}

/// What `bpf_prog_info` says of `prog`.
pub fn prog_info(prog: BorrowedFd<'_>) -> SysResult<ProgInfo> {
    // type, id, then the 8-byte tag.
    let mut info = [0u32; 8];
    obj_info(prog, &mut info)?;
    let mut tag = [0u8; 8];
    tag[..4].copy_from_slice(&info[2].to_ne_bytes());
    tag[4..].copy_from_slice(&info[3].to_ne_bytes());
    Ok(ProgInfo { id: info[1], prog_type: info[0], tag })
}

const BPF_PROG_GET_NEXT_ID: libc::c_long = 11;
const BPF_PROG_GET_FD_BY_ID: libc::c_long = 13;

/// The id or next id member of `union bpf_attr` (`start_id`/`prog_id`,
/// `next_id`, `open_flags`).
#[repr(C)]
#[derive(Default)]
struct IdAttr {
    id: u32,
    next_id: u32,
    open_flags: u32,
}

/// One id command (`BPF_PROG_GET_NEXT_ID`, `BPF_PROG_GET_FD_BY_ID`).
fn id_command(command: libc::c_long, attr: &mut IdAttr) -> libc::c_long {
    // SAFETY: attr is a properly initialised `bpf_attr` prefix of the
    // size given, borrowed for the whole call.
    unsafe {
        libc::syscall(libc::SYS_bpf, command, attr as *mut IdAttr, std::mem::size_of::<IdAttr>())
    }
}

/// Every BPF program loaded on the host now. Programs unloaded while
/// they are listed are left out.
pub fn loaded_progs() -> SysResult<Vec<ProgInfo>> {
    let mut types = Vec::new();
    let mut id = 0u32;
    loop {
        let mut attr = IdAttr { id, ..Default::default() };
        if id_command(BPF_PROG_GET_NEXT_ID, &mut attr) < 0 {
            let e = last_error("bpf(BPF_PROG_GET_NEXT_ID)");
            return if e.errno == libc::ENOENT { Ok(types) } else { Err(e) };
        }
        id = attr.next_id;
        let mut get = IdAttr { id, ..Default::default() };
        let fd = id_command(BPF_PROG_GET_FD_BY_ID, &mut get);
        if fd < 0 {
            let e = last_error("bpf(BPF_PROG_GET_FD_BY_ID)");
            if e.errno == libc::ENOENT {
                continue;
            }
            return Err(e);
        }
        // SAFETY: fd is a new descriptor owned by us.
        let prog = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) };
        types.push(prog_info(std::os::fd::AsFd::as_fd(&prog))?);
    }
}

/// A consumer of a `BPF_MAP_TYPE_RINGBUF` map, any number of whose records
/// may have been consumed by earlier consumers (other processes). aya
/// 0.13's `RingBuf` cannot serve here: it starts from a cached producer
/// position of 0, so a ring whose consumer position is not 0 looks full of
/// records past the producer's end and is read as garbage.
#[derive(Debug)]
pub struct RingConsumer {
    /// The consumer page (read-write).
    consumer: *mut u8,
    /// The producer page followed by the data pages mapped twice
    /// (read-only).
    producer: *mut u8,
    page: usize,
    size: usize,
}

// SAFETY: the mappings are owned by this value and hold no thread-local
// state; reads and writes of the positions are atomic.
unsafe impl Send for RingConsumer {}

const RINGBUF_BUSY: u32 = 1 << 31;
const RINGBUF_DISCARD: u32 = 1 << 30;
const RINGBUF_HEADER: usize = 8;

impl RingConsumer {
    /// Maps the ring behind `map`, whose data area is `size` bytes (its
    /// max_entries: a power of two, a multiple of the page size).
    pub fn map(map: BorrowedFd<'_>, size: usize) -> SysResult<RingConsumer> {
        // SAFETY: sysconf has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
        if !size.is_power_of_two() || size < page {
            return Err(crate::SysError::new("mmap of a BPF ring (bad size)", libc::EINVAL));
        }
        // SAFETY: fresh shared mappings of a ring buffer map fd at offsets
        // the kernel defines (consumer page at 0, producer page and data
        // from one page on); they alias no Rust object.
        let consumer = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                map.as_raw_fd(),
                0,
            )
        };
        if consumer == libc::MAP_FAILED {
            return Err(last_error("mmap of a BPF ring's consumer page"));
        }
        // SAFETY: as above.
        let producer = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                page + 2 * size,
                libc::PROT_READ,
                libc::MAP_SHARED,
                map.as_raw_fd(),
                page as libc::off_t,
            )
        };
        if producer == libc::MAP_FAILED {
            let error = last_error("mmap of a BPF ring's data");
            // SAFETY: unmaps the consumer page mapped just above.
            unsafe { libc::munmap(consumer, page) };
            return Err(error);
        }
        Ok(RingConsumer { consumer: consumer.cast(), producer: producer.cast(), page, size })
    }

    fn consumer_pos(&self) -> &std::sync::atomic::AtomicU64 {
        // SAFETY: the consumer page starts with the 8-byte, 8-aligned
        // consumer position, which the kernel reads and we alone write.
        unsafe { &*(self.consumer as *const std::sync::atomic::AtomicU64) }
    }

    fn producer_pos(&self) -> u64 {
        // SAFETY: the producer page starts with the 8-byte producer
        // position, written by the kernel with release semantics.
        let pos = unsafe { &*(self.producer as *const std::sync::atomic::AtomicU64) };
        pos.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Calls `each` with every submitted record from the consumer position
    /// to the producer's, consuming them; stops early at a record still
    /// being written. Returns how many records were passed.
    pub fn drain(&mut self, mut each: impl FnMut(&[u8])) -> usize {
        let mask = (self.size - 1) as u64;
        let consumer = self.consumer_pos();
        let mut pos = consumer.load(std::sync::atomic::Ordering::Acquire);
        let end = self.producer_pos();
        let mut count = 0;
        while pos < end {
            let offset = self.page + (pos & mask) as usize;
            // SAFETY: offset + 8 lies within the producer mapping (page +
            // 2 * size bytes): (pos & mask) < size.
            let header =
                unsafe { &*(self.producer.add(offset) as *const std::sync::atomic::AtomicU32) }
                    .load(std::sync::atomic::Ordering::Acquire);
            if header & RINGBUF_BUSY != 0 {
                break;
            }
            let len = (header & !(RINGBUF_BUSY | RINGBUF_DISCARD)) as usize;
            if len > self.size {
                break; // not a record: never read past the ring
            }
            if header & RINGBUF_DISCARD == 0 {
                // SAFETY: the record (len <= size bytes after its 8-byte
                // header) lies within the data mapped twice, so it is
                // contiguous even when it wraps; it is complete (not busy)
                // and nothing overwrites it before the consumer position
                // moves past it.
                let record = unsafe {
                    std::slice::from_raw_parts(self.producer.add(offset + RINGBUF_HEADER), len)
                };
                each(record);
                count += 1;
            }
            pos += ((RINGBUF_HEADER + len + 7) & !7) as u64;
            consumer.store(pos, std::sync::atomic::Ordering::Release);
        }
        count
    }
}

/// True when the ring behind `map` holds records not yet consumed (its
/// producer position is past its consumer position). Maps only the two
/// position pages, read-only, for the call: a reader with nothing to take
/// does not pay for mapping the data area (twice its size, every page
/// mapped at once).
pub fn ring_has_records(map: BorrowedFd<'_>) -> SysResult<bool> {
    // SAFETY: sysconf has no preconditions.
    let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
    // SAFETY: a fresh read-only shared mapping of the ring's first two
    // pages (consumer and producer positions, at offsets the kernel
    // defines); it aliases no Rust object and is unmapped below.
    let at = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            2 * page,
            libc::PROT_READ,
            libc::MAP_SHARED,
            map.as_raw_fd(),
            0,
        )
    };
    if at == libc::MAP_FAILED {
        return Err(last_error("mmap of a BPF ring's position pages"));
    }
    let position = |offset: usize| {
        // SAFETY: offset is 0 or one page: each page starts with an 8-byte,
        // 8-aligned position the kernel updates atomically.
        let pos = unsafe { &*(at.cast::<u8>().add(offset) as *const std::sync::atomic::AtomicU64) };
        pos.load(std::sync::atomic::Ordering::Acquire)
    };
    let (consumer, producer) = (position(0), position(page));
    // SAFETY: unmaps exactly the mapping made above; nothing borrows it.
    unsafe { libc::munmap(at, 2 * page) };
    Ok(producer != consumer)
}

impl Drop for RingConsumer {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the two mappings made in `map`; no slice
        // borrowed from them outlives `drain`.
        unsafe {
            libc::munmap(self.producer.cast(), self.page + 2 * self.size);
            libc::munmap(self.consumer.cast(), self.page);
        }
    }
}
