//! eBPF method: one hash map of frozen 4-tuples, a one-element array `active`
//! (the switch) and a tcx program on ingress and egress of every interface of
//! the namespace, all pinned under /sys/fs/bpf/ferry/<name>/ so they outlive
//! the process that prepared them. Prepare does the slow part (load, attach,
//! pin); engage is one batch update plus one switch update; disengage one
//! switch update.

use crate::{netns, NetlockError, Tuple};
use aya::maps::Map;
use aya::programs::links::{FdLink, LinkOrder, PinnedLink};
use aya::programs::tc::TcAttachOptions;
use aya::programs::{SchedClassifier, TcAttachType};
use std::net::IpAddr;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

/// The BPF object compiled by build.rs from bpf/netlock.bpf.c.
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/netlock.bpf.o"));

const BPFFS: &str = "/sys/fs/bpf";
const PIN_ROOT: &str = "/sys/fs/bpf/ferry";
const MAP_PIN: &str = "map";

/// `struct tuple_key` of netlock.bpf.c: 40 bytes, no padding.
#[repr(C)]
#[derive(Clone, Copy)]
struct TupleKey {
    family: u8,
    pad: [u8; 3],
    local_addr: [u8; 16],
    remote_addr: [u8; 16],
    /// Network byte order, as in the packet.
    local_port: [u8; 2],
    remote_port: [u8; 2],
}

// Keys reach the kernel as their 40 bytes (`to_bytes`), a plain byte
// array, so this crate needs no unsafe code of its own.

fn addr_bytes(ip: IpAddr) -> (u8, [u8; 16]) {
    let mut out = [0u8; 16];
    match ip {
        IpAddr::V4(v4) => {
            out[..4].copy_from_slice(&v4.octets());
            (libc::AF_INET as u8, out)
        }
        IpAddr::V6(v6) => (libc::AF_INET6 as u8, v6.octets()),
    }
}

fn key(tuple: &Tuple) -> TupleKey {
    let (family, local_addr) = addr_bytes(tuple.local.ip());
    let (_, remote_addr) = addr_bytes(tuple.remote.ip());
    TupleKey {
        family,
        pad: [0; 3],
        local_addr,
        remote_addr,
        local_port: tuple.local.port().to_be_bytes(),
        remote_port: tuple.remote.port().to_be_bytes(),
    }
}

pub(crate) fn pin_dir(name: &str) -> PathBuf {
    Path::new(PIN_ROOT).join(name)
}

fn ensure_bpffs(lock: &str) -> Result<(), NetlockError> {
    let bpffs = Path::new(BPFFS);
    let sys = |what: &str, source| NetlockError::Sys {
        lock: lock.to_string(),
        what: format!("{what} {BPFFS}"),
        source,
    };
    if !ferry_sys::netns::is_bpffs(bpffs).map_err(|e| sys("checking", e))? {
        ferry_sys::netns::mount_bpffs(bpffs).map_err(|e| sys("mounting bpffs on", e))?;
    }
    Ok(())
}

/// Slots of the open-addressing table (`table` in netlock.bpf.c: 40 bytes
/// each, 2.5 MiB, allocated at prepare). Tuples are written straight into
/// the map's memory, so engage costs no syscall per tuple.
const TABLE_SLOTS: u32 = 1 << 16;
/// A key sits in one of this many slots from its home slot, or in the
/// overflow hash map.
const TABLE_PROBES: u32 = 8;
const KEY_LEN: usize = std::mem::size_of::<TupleKey>();

/// Capacity of the overflow hash map (`frozen`), which takes the tuples the
/// table has no room for (none at 10,000 tuples in practice). Elements are
/// allocated on insert (`BPF_F_NO_PREALLOC`): a large max_entries costs only
/// the hash buckets (16 MiB at prepare), and prepare need not know N.
pub const MAX_TUPLES: u32 = 1 << 20;

const ACTIVE_PIN: &str = "active";
const TABLE_PIN: &str = "table";

/// A lock's maps, open: what engage and disengage need, so that each is a
/// fixed number of bpf syscalls with no path lookup.
#[derive(Debug)]
pub(crate) struct Handles {
    frozen: OwnedFd,
    active: OwnedFd,
    table: ferry_sys::bpf::MappedArray,
    /// Scratch for fill (home slots, insertion order), allocated and touched
    /// at prepare so engage takes no page fault for up to SCRATCH tuples.
    homes: Vec<u32>,
    order: Vec<u32>,
    keys: Vec<[u8; KEY_LEN]>,
}

/// Tuples engage handles without allocating (more are fine, just slower).
const SCRATCH: usize = 1 << 15;
/// Bucket count of fill's counting sort (by the top bits of the home slot).
const SORT_BUCKETS: usize = 1 << 10;

fn scratch<T: Clone>(fill: T) -> Vec<T> {
    // vec![0; n] may come from calloc's untouched pages: write it.
    let mut v = Vec::with_capacity(SCRATCH);
    v.resize(SCRATCH, fill);
    v.clear();
    v
}

impl TupleKey {
    fn to_bytes(self) -> [u8; KEY_LEN] {
        let mut b = [0u8; KEY_LEN];
        b[0] = self.family;
        b[1..4].copy_from_slice(&self.pad);
        b[4..20].copy_from_slice(&self.local_addr);
        b[20..36].copy_from_slice(&self.remote_addr);
        b[36..38].copy_from_slice(&self.local_port);
        b[38..40].copy_from_slice(&self.remote_port);
        b
    }
}

/// table_hash() of netlock.bpf.c: the key's ten 32-bit words in host order
/// (BPF runs in the host's byte order), mixed murmur3-style.
fn table_hash(key: &[u8; KEY_LEN]) -> u32 {
    let mut h: u32 = 0x9e37_79b9;
    for word in key.chunks_exact(4) {
        h ^= u32::from_ne_bytes([word[0], word[1], word[2], word[3]]);
        h = h.wrapping_mul(0x85eb_ca6b);
        h ^= h >> 13;
    }
    h ^= h >> 16;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^= h >> 16;
    h
}

/// Loads the program, creates the empty tuple map and the `active` switch
/// (0: nothing is dropped), attaches to both directions of every interface
/// and pins everything. On error the caller releases the pins.
pub(crate) fn prepare(
    lock: &str,
    netns_path: Option<&Path>,
    netns_desc: &str,
) -> Result<Handles, NetlockError> {
    let pins = create_pin_dir(lock)?;
    let mut bpf = load_object(lock)?;

    // aya closes a taken map's fd when the Map is dropped: keep both until
    // the programs (which reference them) are loaded.
    let mut taken = Vec::with_capacity(2);
    let at = PinTarget { lock, pins: &pins, netns_path, netns_desc };
    let frozen = take_and_pin(&mut bpf, &at, &mut taken, "frozen", MAP_PIN)?;
    let active = take_and_pin(&mut bpf, &at, &mut taken, "active", ACTIVE_PIN)?;
    let table = take_and_pin(&mut bpf, &at, &mut taken, "table", TABLE_PIN)?;
    let table = map_table(lock, &table)?;
    let handles = Handles {
        frozen,
        active,
        table,
        homes: scratch(1),
        order: scratch(1),
        keys: scratch([1; KEY_LEN]),
    };
    // An array map starts zeroed; written anyway so the state never
    // depends on that.
    set_active(lock, &handles, false)?;

    for (program, direction) in
        [("ferry_ingress", TcAttachType::Ingress), ("ferry_egress", TcAttachType::Egress)]
    {
        attach(&mut bpf, &at, program, direction)?;
    }
    drop(taken);
    // Dropping `bpf` closes aya's program and map fds; the pins keep the
    // links (hence the programs) and the maps alive, `handles` the maps' fds.
    Ok(handles)
}

/// Where prepare pins a lock's objects, and the namespace it attaches in.
struct PinTarget<'a> {
    lock: &'a str,
    pins: &'a Path,
    netns_path: Option<&'a Path>,
    netns_desc: &'a str,
}

fn create_pin_dir(lock: &str) -> Result<PathBuf, NetlockError> {
    ensure_bpffs(lock)?;
    let pins = pin_dir(lock);
    std::fs::create_dir_all(&pins).map_err(|source| NetlockError::Io {
        lock: lock.to_string(),
        what: "creating pin directory",
        path: pins.clone(),
        source,
    })?;
    Ok(pins)
}

fn load_object(lock: &str) -> Result<aya::Ebpf, NetlockError> {
    // The program needs no CO-RE relocation: btf(None) skips it. (aya
    // 0.13's EbpfLoader::new() still reads and parses the kernel's BTF,
    // /sys/kernel/btf/vmlinux, about 19 ms of prepare's cost.)
    aya::EbpfLoader::new().btf(None).set_max_entries("frozen", MAX_TUPLES).load(OBJECT).map_err(
        |source| NetlockError::BpfLoad { lock: lock.to_string(), source: Box::new(source) },
    )
}

/// Takes map `map_name` out of the object, pins it as `pin_name` and
/// returns a duplicate of its fd; the map itself goes to `taken`.
fn take_and_pin(
    bpf: &mut aya::Ebpf,
    at: &PinTarget,
    taken: &mut Vec<Map>,
    map_name: &str,
    pin_name: &str,
) -> Result<OwnedFd, NetlockError> {
    let lock = at.lock;
    let wrong = |what| NetlockError::BpfMap {
        lock: lock.to_string(),
        what,
        source: Box::new(aya::maps::MapError::InvalidName { name: map_name.into() }),
    };
    let map = bpf.take_map(map_name).ok_or_else(|| wrong("missing from the BPF object"))?;
    let data = match &map {
        Map::HashMap(data) | Map::Array(data) => data,
        _ => return Err(wrong("has the wrong type")),
    };
    let path = at.pins.join(pin_name);
    data.pin(&path).map_err(|source| NetlockError::BpfPin {
        lock: lock.to_string(),
        path: path.clone(),
        source: Box::new(source),
    })?;
    let fd = data.fd().as_fd().try_clone_to_owned().map_err(|source| NetlockError::Io {
        lock: lock.to_string(),
        what: "duplicating the fd of pinned map",
        path,
        source,
    })?;
    taken.push(map);
    Ok(fd)
}

/// Loads `program` and attaches it in `direction` to every interface of
/// the namespace, pinning each link.
fn attach(
    bpf: &mut aya::Ebpf,
    at: &PinTarget,
    program: &str,
    direction: TcAttachType,
) -> Result<(), NetlockError> {
    let lock = at.lock;
    let prog_error = |what: &str, source| NetlockError::BpfProgram {
        lock: lock.to_string(),
        what: format!("{what} {program}"),
        source: Box::new(source),
    };
    let classifier: &mut SchedClassifier = bpf
        .program_mut(program)
        .ok_or_else(|| prog_error("finding", aya::programs::ProgramError::UnexpectedProgramType))?
        .try_into()
        .map_err(|e| prog_error("finding", e))?;
    classifier.load().map_err(|e| prog_error("loading", e))?;
    // The link is created from a thread inside the target namespace:
    // the kernel resolves the ifindex in the caller's namespace.
    netns::run_in(lock, at.netns_path, || {
        let interfaces = ferry_sys::netns::interfaces().map_err(|source| NetlockError::Sys {
            lock: lock.to_string(),
            what: format!("listing interfaces of {}", at.netns_desc),
            source,
        })?;
        for (index, interface) in interfaces {
            attach_interface(classifier, at, direction, index, interface)?;
        }
        Ok(())
    })
}

fn attach_interface(
    classifier: &mut SchedClassifier,
    at: &PinTarget,
    direction: TcAttachType,
    index: u32,
    interface: String,
) -> Result<(), NetlockError> {
    let lock = at.lock;
    let direction_name = if direction == TcAttachType::Ingress { "ingress" } else { "egress" };
    let attach_error = |source| NetlockError::BpfAttach {
        lock: lock.to_string(),
        interface: interface.clone(),
        direction: direction_name,
        netns: at.netns_desc.to_string(),
        source: Box::new(source),
    };
    // First in the tcx chain: no other program sees a frozen packet.
    let link_id = classifier
        .attach_with_options(&interface, direction, TcAttachOptions::TcxOrder(LinkOrder::first()))
        .map_err(attach_error)?;
    let link = classifier.take_link(link_id).map_err(attach_error)?;
    let path = at.pins.join(format!("link-{index}-{direction_name}"));
    let link = FdLink::try_from(link).map_err(|source| NetlockError::BpfLink {
        lock: lock.to_string(),
        path: path.clone(),
        source: Box::new(source),
    })?;
    link.pin(&path).map_err(|source| NetlockError::BpfPin {
        lock: lock.to_string(),
        path: path.clone(),
        source: Box::new(source),
    })?;
    Ok(())
}

/// Opens the maps of a prepared lock from their pins (a process that adopts
/// a lock it did not create).
pub(crate) fn open(lock: &str) -> Result<Handles, NetlockError> {
    let pins = pin_dir(lock);
    let get = |pin: &str| {
        let path = pins.join(pin);
        ferry_sys::bpf::obj_get(&path).map_err(|source| NetlockError::Sys {
            lock: lock.to_string(),
            what: format!("opening pinned map {}", path.display()),
            source,
        })
    };
    let table = get(TABLE_PIN)?;
    Ok(Handles {
        frozen: get(MAP_PIN)?,
        active: get(ACTIVE_PIN)?,
        table: map_table(lock, &table)?,
        homes: scratch(1),
        order: scratch(1),
        keys: scratch([1; KEY_LEN]),
    })
}

fn map_table(lock: &str, fd: &OwnedFd) -> Result<ferry_sys::bpf::MappedArray, NetlockError> {
    ferry_sys::bpf::MappedArray::map(fd.as_fd(), TABLE_SLOTS as usize * KEY_LEN).map_err(|source| {
        NetlockError::Sys {
            lock: lock.to_string(),
            what: format!("mapping BPF map {}/{TABLE_PIN}", pin_dir(lock).display()),
            source,
        }
    })
}

/// Writes every tuple into the table (memory writes, while the switch is
/// off); the few whose probe window is full go to the overflow map with one
/// `BPF_MAP_UPDATE_BATCH` (no call when there are none). Tuples are
/// validated already, not yet canonical. Returns how many overflowed.
///
/// The table is cold (fresh from prepare): written in random order, every
/// tuple would cost a cache and TLB miss. Keys are computed into scratch
/// first, then inserted in order of home slot (a counting sort on its top
/// bits), so the writes sweep the table once: 10,000 tuples in ~0.5 ms here
/// instead of ~2 ms.
pub(crate) fn fill(
    lock: &str,
    handles: &mut Handles,
    tuples: &[Tuple],
) -> Result<usize, NetlockError> {
    let Handles { table, homes, order, keys, frozen, .. } = handles;
    sort_by_home(tuples, keys, homes, order);
    let overflow = insert_in_order(table.as_mut_slice(), keys, homes, order);
    if overflow.len() > MAX_TUPLES as usize {
        return Err(NetlockError::TooManyTuples {
            lock: lock.to_string(),
            count: tuples.len(),
            max: MAX_TUPLES as usize,
        });
    }
    let values = vec![1u8; overflow.len()];
    ferry_sys::bpf::map_update_batch(frozen.as_fd(), &overflow, &values).map_err(|source| {
        NetlockError::Sys {
            lock: lock.to_string(),
            what: format!(
                "filling BPF map {}/{MAP_PIN} with {} tuples",
                pin_dir(lock).display(),
                overflow.len()
            ),
            source,
        }
    })?;
    Ok(overflow.len())
}

/// Computes each tuple's key and home slot into `keys` and `homes`, and
/// into `order` the tuples' indexes sorted by home slot (a counting sort
/// on its top bits).
fn sort_by_home(
    tuples: &[Tuple],
    keys: &mut Vec<[u8; KEY_LEN]>,
    homes: &mut Vec<u32>,
    order: &mut Vec<u32>,
) {
    let canonical_key = |t: &Tuple| {
        key(&Tuple { local: crate::canonical(t.local), remote: crate::canonical(t.remote) })
    };
    keys.clear();
    keys.extend(tuples.iter().map(|t| canonical_key(t).to_bytes()));
    homes.clear();
    homes.extend(keys.iter().map(|k| table_hash(k) & (TABLE_SLOTS - 1)));
    let shift = TABLE_SLOTS.trailing_zeros() - SORT_BUCKETS.trailing_zeros();
    let mut starts = [0u32; SORT_BUCKETS + 1];
    for &home in homes.iter() {
        starts[(home >> shift) as usize + 1] += 1;
    }
    for i in 1..starts.len() {
        starts[i] += starts[i - 1];
    }
    order.clear();
    order.resize(tuples.len(), 0);
    for (i, &home) in homes.iter().enumerate() {
        let bucket = &mut starts[(home >> shift) as usize];
        if let Some(slot) = order.get_mut(*bucket as usize) {
            *slot = i as u32;
        }
        *bucket += 1;
    }
}

/// Writes the keys into the table in `order`; returns those whose probe
/// window is full.
fn insert_in_order(
    table: &mut [u8],
    keys: &[[u8; KEY_LEN]],
    homes: &[u32],
    order: &[u32],
) -> Vec<[u8; KEY_LEN]> {
    let mut overflow: Vec<[u8; KEY_LEN]> = Vec::new();
    for &i in order.iter() {
        let (Some(bytes), Some(&home)) = (keys.get(i as usize), homes.get(i as usize)) else {
            continue;
        };
        let mut placed = false;
        for probe in 0..TABLE_PROBES {
            let at = (home.wrapping_add(probe) & (TABLE_SLOTS - 1)) as usize * KEY_LEN;
            let Some(slot) = table.get_mut(at..at + KEY_LEN) else {
                break;
            };
            if slot[0] == 0 {
                slot.copy_from_slice(bytes);
                placed = true;
                break;
            }
            if *slot == *bytes {
                placed = true; // a duplicate
                break;
            }
        }
        if !placed {
            overflow.push(*bytes);
        }
    }
    overflow
}

/// Turns dropping on or off: one `BPF_MAP_UPDATE_ELEM` of `active[0]`.
pub(crate) fn set_active(lock: &str, handles: &Handles, on: bool) -> Result<(), NetlockError> {
    ferry_sys::bpf::map_update_elem(handles.active.as_fd(), &0u32, &u32::from(on)).map_err(
        |source| NetlockError::Sys {
            lock: lock.to_string(),
            what: format!(
                "setting BPF map {}/{ACTIVE_PIN} to {}",
                pin_dir(lock).display(),
                u32::from(on)
            ),
            source,
        },
    )
}

/// Removes the pins: links first, each closed through its own fd so the
/// kernel detaches it before this returns, then the map and the directory.
/// Missing pins are not an error (a prepare killed half-way).
pub(crate) fn release(lock: &str) -> Result<(), NetlockError> {
    let pins = pin_dir(lock);
    // Switch off first so every interface stops dropping at the same instant
    // (detaching goes link by link). Missing pins: nothing to switch.
    if let Ok(handles) = open(lock) {
        if let Err(e) = set_active(lock, &handles, false) {
            tracing::warn!(lock, "switching off before detach: {e}");
        }
    }
    let entries = match std::fs::read_dir(&pins) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(NetlockError::Io {
                lock: lock.to_string(),
                what: "reading pin directory",
                path: pins,
                source,
            })
        }
    };
    let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok()).map(|e| e.path()).collect();
    // Links first (they hold the programs), then the maps.
    paths.sort_by_key(|p| {
        (!p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("link-")), p.clone())
    });
    for path in paths {
        let io = |what, source| NetlockError::Io {
            lock: lock.to_string(),
            what,
            path: path.clone(),
            source,
        };
        let is_link = path.file_name().is_some_and(|n| n.to_string_lossy().starts_with("link-"));
        if is_link {
            if let Ok(pinned) = PinnedLink::from_pin(&path) {
                // unpin removes the file; dropping the FdLink then closes the
                // last reference, which detaches synchronously (a bare
                // unlink would defer the detach to a kernel work item).
                let link = pinned.unpin().map_err(|e| io("unpinning", e))?;
                drop(link);
                continue;
            }
        }
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io("removing pin", e)),
        }
    }
    match std::fs::remove_dir(&pins) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(NetlockError::Io {
            lock: lock.to_string(),
            what: "removing pin directory",
            path: pins,
            source,
        }),
    }
}

/// Home slot of a tuple in the table (tests force the overflow path with it).
pub(crate) fn table_home(tuple: &Tuple) -> u32 {
    let t = Tuple { local: crate::canonical(tuple.local), remote: crate::canonical(tuple.remote) };
    table_hash(&key(&t).to_bytes()) & (TABLE_SLOTS - 1)
}

/// Slots a key may occupy from its home before it overflows.
pub(crate) const PROBES: u32 = TABLE_PROBES;
