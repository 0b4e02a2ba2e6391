//! eBPF method, one lock's part: an owner slot in its namespace's base
//! (src/base.rs), its tuples in the base's `table` (written straight into
//! the map's memory) tagged with that slot, and its bit of `active`.
//! Prepare claims the slot (installing the base only the first time in a
//! namespace); engage is the table writes plus one update of `active`;
//! disengage one update; thaw clears the bit and the lock's entries: no
//! program is loaded, attached or detached per lock.

use crate::base::{self, Base};
use crate::{NetlockError, Tuple};
use std::net::IpAddr;
use std::os::fd::AsFd;
use std::path::Path;

/// `struct tuple_key` of netlock.bpf.c: 40 bytes, no padding.
#[repr(C)]
#[derive(Clone, Copy)]
struct TupleKey {
    family: u8,
    /// The owning lock's slot in the table; 0 in `frozen`'s keys.
    owner: u8,
    /// The owning lock's generation (host order), 0 in `frozen`'s keys.
    generation: [u8; 2],
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
        owner: 0,
        generation: [0; 2],
        local_addr,
        remote_addr,
        local_port: tuple.local.port().to_be_bytes(),
        remote_port: tuple.remote.port().to_be_bytes(),
    }
}

use base::{KEY_LEN, TABLE_SLOTS};
/// A key sits in one of this many slots from its home slot, or in the
/// overflow hash map.
const TABLE_PROBES: u32 = 8;
const _: () = assert!(std::mem::size_of::<TupleKey>() == KEY_LEN);
const _: () = assert!(crate::reuse::KEY_BYTES == KEY_LEN);

/// A lock's part of its base, open: what engage and disengage need, so
/// that each is a fixed number of syscalls with no path lookup.
#[derive(Debug)]
pub(crate) struct Handles {
    base: Base,
    slot: u8,
    /// Tells this lock's held packets from those of an earlier lock in the
    /// same slot.
    generation: u16,
    /// Scratch for fill (home slots, insertion order): allocated and
    /// touched at prepare for up to SCRATCH tuples (engage takes no page
    /// fault for those), grown by fill beyond; empty in a lock opened by
    /// another process (which seldom fills).
    homes: Vec<u32>,
    order: Vec<u32>,
    keys: Vec<[u8; KEY_LEN]>,
    /// What this lock wrote, when it claimed its slot itself
    /// ([`prepare`]: a claimed slot has no entries): its release clears
    /// only there. None for a lock opened on a slot it did not claim
    /// ([`open`]): its release looks through the whole table.
    written: Option<Written>,
}

/// Where a lock's entries can be: the home slots of every key it wrote
/// into the table (each within [`TABLE_PROBES`] of its home), and
/// whether any went to the overflow map.
#[derive(Debug, Default)]
pub(crate) struct Written {
    homes: Vec<u32>,
    overflowed: bool,
    /// The lock whose record directory still has these homes in a file
    /// (an adopted lock): removed before more is written.
    file_of: Option<String>,
}

/// Tuples engage handles without allocating (more are fine: the scratch
/// grows, ~50 bytes a tuple). Small: touching scratch for 2^15 tuples at
/// every prepare (1.6 MiB) cost a checkpoint of one listener ~0.5 ms.
const SCRATCH: usize = 1 << 10;
/// Up to this many tuples, fill and release read and write the table
/// with single-entry bpf calls (at most 9 a tuple) rather than map it:
/// mapping it maps all of its 2.5 MiB at once.
const BY_SYSCALL: usize = 32;
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
        b[1] = self.owner;
        b[2..4].copy_from_slice(&self.generation);
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

/// The base of the namespace at `netns_path` (installed if it has none)
/// and a free owner slot in it.
pub(crate) fn prepare(
    lock: &str,
    netns_path: Option<&Path>,
    netns_desc: &str,
    netns_inode: u64,
) -> Result<Handles, NetlockError> {
    let (base, slot) = base::ensure(lock, netns_path, netns_desc, netns_inode)?;
    let mut handles = with_scratch(base, slot, new_generation(), true);
    handles.written = Some(Written::default());
    Ok(handles)
}

/// A generation that differs from the slot's previous ones in practice
/// (never 0, the packets' own value).
fn new_generation() -> u16 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let mixed = nanos ^ std::process::id().rotate_left(16);
    ((mixed ^ (mixed >> 16)) as u16).max(1)
}

/// Handles of `slot`, with the scratch this process kept (reuse.rs), or
/// else a fresh one, touched when `touch` (a lock about to be filled).
fn with_scratch(base: Base, slot: u8, generation: u16, touch: bool) -> Handles {
    let kept = crate::reuse::take_scratch().unwrap_or_else(|| {
        if touch {
            crate::reuse::Scratch {
                homes: scratch(1),
                order: scratch(1),
                keys: scratch([1; KEY_LEN]),
            }
        } else {
            crate::reuse::Scratch { homes: Vec::new(), order: Vec::new(), keys: Vec::new() }
        }
    });
    Handles {
        base,
        slot,
        generation,
        homes: kept.homes,
        order: kept.order,
        keys: kept.keys,
        written: None,
    }
}

impl Drop for Handles {
    fn drop(&mut self) {
        crate::reuse::put_scratch(crate::reuse::Scratch {
            homes: std::mem::take(&mut self.homes),
            order: std::mem::take(&mut self.order),
            keys: std::mem::take(&mut self.keys),
        });
    }
}

/// The lock's base, slot and generation, for `record.json`.
pub(crate) fn slot_of(handles: &Handles) -> (String, u8, u16) {
    (handles.base.name.clone(), handles.slot, handles.generation)
}

/// Opens the base and slot of a prepared lock (a process that adopts a
/// lock it did not create).
pub(crate) fn open(
    lock: &str,
    base_name: &str,
    slot: u8,
    generation: u16,
) -> Result<Handles, NetlockError> {
    Ok(with_scratch(base::open(lock, base_name)?, slot, generation, false))
}

/// Where the lock wrote (overflowed, home slots), when it knows: for the
/// record of a lock handed over.
pub(crate) fn written(handles: &Handles) -> Option<(bool, &[u32])> {
    handles.written.as_ref().map(|w| (w.overflowed, w.homes.as_slice()))
}

/// Tells an opened lock where it wrote (from its record directory), so
/// that its release clears only there. `file_of`: the lock whose
/// `written` file this came from, removed before the lock writes more.
pub(crate) fn set_written(
    handles: &mut Handles,
    overflowed: bool,
    homes: Vec<u32>,
    file_of: Option<&str>,
) {
    handles.written = Some(Written { homes, overflowed, file_of: file_of.map(str::to_string) });
}

/// Takes the packets this lock dropped out of the base's ring and sends
/// them again in the namespace at `netns_path`; returns how many.
pub(crate) fn deliver_held(
    lock: &str,
    handles: &Handles,
    netns_path: Option<&Path>,
) -> Result<usize, NetlockError> {
    let packets = {
        let _held = handles.base.exclusive(lock)?;
        crate::held::take(lock, &handles.base, handles.slot, handles.generation)?
    };
    crate::held::deliver(lock, netns_path, &packets)
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
    let Handles { base, slot, generation, homes, order, keys, written } = handles;
    sort_by_home(tuples, keys, homes, order);
    let _held = base.exclusive(lock)?;
    // Noted before the writes: a release after a failure half way
    // clears every place this fill may have written.
    if let Some(w) = written.as_mut() {
        if let Some(name) = w.file_of.take() {
            crate::record::write_written(&name, None);
        }
        w.homes.extend_from_slice(homes);
    }
    let owner = (*slot, *generation);
    let overflow = if !base.table_is_mapped() && tuples.len() <= BY_SYSCALL {
        insert_by_syscall(lock, base, owner, keys, homes, order)?
    } else {
        insert_in_order(base.table(lock)?, owner, keys, homes, order)
    };
    if let Some(w) = written.as_mut() {
        w.overflowed |= !overflow.is_empty();
    }
    if overflow.len() > base::MAX_TUPLES as usize {
        return Err(NetlockError::TooManyTuples {
            lock: lock.to_string(),
            count: tuples.len(),
            max: base::MAX_TUPLES as usize,
        });
    }
    for key in &overflow {
        add_overflow_owner(lock, base, key, *slot)?;
    }
    Ok(overflow.len())
}

fn map_error(
    lock: &str,
    base: &Base,
    map: &str,
) -> impl FnOnce(ferry_sys::SysError) -> NetlockError {
    let what = format!("updating BPF map {}/{map}", base::pin_dir(&base.name).display());
    let lock = lock.to_string();
    move |source| NetlockError::Sys { lock, what, source }
}

/// Sets bit `slot` in the owner mask of an overflow key (the key's owner
/// byte is 0 there: one entry per tuple, whoever holds it).
fn add_overflow_owner(
    lock: &str,
    base: &Base,
    key: &[u8; KEY_LEN],
    slot: u8,
) -> Result<(), NetlockError> {
    let frozen = base.frozen.as_fd();
    let owners: u64 = ferry_sys::bpf::map_lookup_elem(frozen, key)
        .map_err(map_error(lock, base, "frozen"))?
        .unwrap_or(0);
    ferry_sys::bpf::map_update_elem(frozen, key, &(owners | 1u64 << slot))
        .map_err(map_error(lock, base, "frozen"))
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
    owner: (u8, u16),
    keys: &[[u8; KEY_LEN]],
    homes: &[u32],
    order: &[u32],
) -> Vec<[u8; KEY_LEN]> {
    let mut overflow: Vec<[u8; KEY_LEN]> = Vec::new();
    for (bytes, home, owned) in owned_in_order(keys, homes, order, owner) {
        if !insert_one(table, home, &owned) {
            overflow.push(*bytes);
        }
    }
    overflow
}

/// Each key of `order` with its home slot and its entry as this lock
/// writes it (owner slot and generation set).
fn owned_in_order<'a>(
    keys: &'a [[u8; KEY_LEN]],
    homes: &'a [u32],
    order: &'a [u32],
    (owner, generation): (u8, u16),
) -> impl Iterator<Item = (&'a [u8; KEY_LEN], u32, [u8; KEY_LEN])> + 'a {
    order.iter().filter_map(move |&i| {
        let (bytes, &home) = (keys.get(i as usize)?, homes.get(i as usize)?);
        let mut owned = *bytes;
        owned[1] = owner;
        owned[2..4].copy_from_slice(&generation.to_ne_bytes());
        Some((bytes, home, owned))
    })
}

/// [`insert_in_order`] through the bpf syscall: each probe slot read with
/// one lookup, the entry written with two updates (the family 0 first,
/// then the whole entry: a BPF program never sees a half-written key
/// with a family).
fn insert_by_syscall(
    lock: &str,
    base: &Base,
    owner: (u8, u16),
    keys: &[[u8; KEY_LEN]],
    homes: &[u32],
    order: &[u32],
) -> Result<Vec<[u8; KEY_LEN]>, NetlockError> {
    let table = base.table_fd();
    let mut overflow: Vec<[u8; KEY_LEN]> = Vec::new();
    for (bytes, home, entry) in owned_in_order(keys, homes, order, owner) {
        let mut placed = false;
        for probe in 0..TABLE_PROBES {
            let at = home.wrapping_add(probe) & (TABLE_SLOTS - 1);
            let slot: [u8; KEY_LEN] = ferry_sys::bpf::map_lookup_elem(table, &at)
                .map_err(map_error(lock, base, "table"))?
                .unwrap_or([0; KEY_LEN]);
            if slot == entry {
                placed = true; // a duplicate
                break;
            }
            if slot[0] == 0 {
                let mut first = entry;
                first[0] = 0;
                for value in [&first, &entry] {
                    ferry_sys::bpf::map_update_elem(table, &at, value)
                        .map_err(map_error(lock, base, "table"))?;
                }
                placed = true;
                break;
            }
        }
        if !placed {
            overflow.push(*bytes);
        }
    }
    Ok(overflow)
}

/// Writes `entry` into the first free slot of its probe window (false when
/// there is none). The family byte goes last: BPF programs read the table
/// meanwhile, and an entry without a family is skipped.
fn insert_one(table: &mut [u8], home: u32, entry: &[u8; KEY_LEN]) -> bool {
    for probe in 0..TABLE_PROBES {
        let at = (home.wrapping_add(probe) & (TABLE_SLOTS - 1)) as usize * KEY_LEN;
        let Some(slot) = table.get_mut(at..at + KEY_LEN) else {
            return false;
        };
        if *slot == *entry {
            return true; // a duplicate
        }
        if slot[0] == 0 {
            slot[1..].copy_from_slice(&entry[1..]);
            slot[0] = entry[0];
            return true;
        }
    }
    false
}

/// Removes every entry of owner `slot`: its table slots are zeroed (family
/// first, so BPF never matches a half-cleared entry) and its bit leaves the
/// overflow map's masks. The caller holds the base's flock.
/// With `written` (the lock claimed its slot and noted every write),
/// only the probe windows of its keys' homes are looked at, and the
/// overflow map only when a key went there.
pub(crate) fn remove_entries(
    lock: &str,
    base: &mut Base,
    slot: u8,
    written: Option<&Written>,
) -> Result<(), NetlockError> {
    match written {
        Some(w) if !base.table_is_mapped() && w.homes.len() <= BY_SYSCALL => {
            clear_by_syscall(lock, base, slot, &w.homes)?
        }
        _ => clear_table(base.table(lock)?, slot, written.map(|w| w.homes.as_slice())),
    }
    if written.is_some_and(|w| !w.overflowed) {
        return Ok(());
    }
    let frozen = base.frozen.as_fd();
    let keys: Vec<[u8; KEY_LEN]> =
        ferry_sys::bpf::map_keys(frozen).map_err(map_error(lock, base, "frozen"))?;
    for key in keys {
        let Some(owners) = ferry_sys::bpf::map_lookup_elem::<_, u64>(frozen, &key)
            .map_err(map_error(lock, base, "frozen"))?
        else {
            continue;
        };
        let rest = owners & !(1u64 << slot);
        if rest == owners {
            continue;
        }
        if rest == 0 {
            ferry_sys::bpf::map_delete_elem(frozen, &key)
                .map_err(map_error(lock, base, "frozen"))?;
        } else {
            ferry_sys::bpf::map_update_elem(frozen, &key, &rest)
                .map_err(map_error(lock, base, "frozen"))?;
        }
    }
    Ok(())
}

/// [`clear_table`] of the probe windows of `homes` through the bpf
/// syscall: a lookup per slot, two updates per entry of `slot` (family 0
/// first, then all zeros).
fn clear_by_syscall(lock: &str, base: &Base, slot: u8, homes: &[u32]) -> Result<(), NetlockError> {
    let table = base.table_fd();
    for &home in homes {
        for probe in 0..TABLE_PROBES {
            let at = home.wrapping_add(probe) & (TABLE_SLOTS - 1);
            let Some(entry) = ferry_sys::bpf::map_lookup_elem::<_, [u8; KEY_LEN]>(table, &at)
                .map_err(map_error(lock, base, "table"))?
            else {
                continue;
            };
            if entry[0] == 0 || entry[1] != slot {
                continue;
            }
            let mut first = entry;
            first[0] = 0;
            for value in [&first, &[0u8; KEY_LEN]] {
                ferry_sys::bpf::map_update_elem(table, &at, value)
                    .map_err(map_error(lock, base, "table"))?;
            }
        }
    }
    Ok(())
}

/// Zeroes owner `slot`'s entries in `table` (family first): those in the
/// probe windows of `homes` when given, else anywhere in the table.
fn clear_table(table: &mut [u8], slot: u8, homes: Option<&[u32]>) {
    let clear = |entry: &mut [u8]| {
        if entry[0] != 0 && entry[1] == slot {
            entry[0] = 0;
            entry[1..].fill(0);
        }
    };
    let Some(homes) = homes else {
        table.chunks_exact_mut(KEY_LEN).for_each(clear);
        return;
    };
    for &home in homes {
        for probe in 0..TABLE_PROBES {
            let at = (home.wrapping_add(probe) & (TABLE_SLOTS - 1)) as usize * KEY_LEN;
            if let Some(entry) = table.get_mut(at..at + KEY_LEN) {
                clear(entry);
            }
        }
    }
}

/// Turns this lock's dropping on or off: its bit of `active[0]`, under
/// the base's flock (one lookup and one update).
pub(crate) fn set_active(lock: &str, handles: &Handles, on: bool) -> Result<(), NetlockError> {
    let _held = handles.base.exclusive(lock)?;
    set_engaged(lock, &handles.base, handles.slot, on)
}

/// Sets or clears bit `slot` of `active[0]`; the caller holds the flock.
pub(crate) fn set_engaged(lock: &str, base: &Base, slot: u8, on: bool) -> Result<(), NetlockError> {
    let active = base.active.as_fd();
    let mask: u64 = ferry_sys::bpf::map_lookup_elem(active, &0u32)
        .map_err(map_error(lock, base, "active"))?
        .unwrap_or(0);
    let bit = 1u64 << slot;
    let new = if on { mask | bit } else { mask & !bit };
    if new == mask {
        return Ok(());
    }
    if let (true, Some(lost)) = (on, &base.lost) {
        // Nothing of this slot is dropped while its bit is off: the count
        // starts with the engage.
        ferry_sys::bpf::map_update_elem(lost.as_fd(), &u32::from(slot), &0u64)
            .map_err(map_error(lock, base, "lost"))?;
    }
    ferry_sys::bpf::map_update_elem(active, &0u32, &new).map_err(map_error(lock, base, "active"))
}

/// How many packets this lock dropped without keeping them since it was
/// last engaged (the ring full, a packet too large, a tuple of the
/// overflow map); None when its base counts nothing (installed by an
/// earlier ferry).
pub(crate) fn lost(lock: &str, handles: &Handles) -> Result<Option<u64>, NetlockError> {
    let base = &handles.base;
    let Some(lost) = &base.lost else { return Ok(None) };
    let n: Option<u64> = ferry_sys::bpf::map_lookup_elem(lost.as_fd(), &u32::from(handles.slot))
        .map_err(map_error(lock, base, "lost"))?;
    Ok(Some(n.unwrap_or(0)))
}

/// Empties a disengaged lock for its next engage (a lock kept from one
/// capture to the next, `ferry replicate`): its bit off, its entries
/// removed, a new generation (packets an earlier engage held are never
/// taken for this one's). Its slot stays claimed.
pub(crate) fn rearm(lock: &str, handles: &mut Handles) -> Result<u16, NetlockError> {
    {
        let _held = handles.base.exclusive(lock)?;
        set_engaged(lock, &handles.base, handles.slot, false)?;
        remove_entries(lock, &mut handles.base, handles.slot, handles.written.as_ref())?;
    }
    // Nothing of this slot is left in the table: from here every write is
    // noted, so the next release clears only there.
    handles.written = Some(Written::default());
    let old = handles.generation;
    let mut generation = new_generation();
    if generation == old {
        generation = generation.wrapping_add(1).max(1);
    }
    handles.generation = generation;
    Ok(generation)
}

/// Frees the lock's slot: bit off, entries removed, slot file removed.
pub(crate) fn release(lock: &str, handles: &mut Handles) -> Result<(), NetlockError> {
    free_slot(&mut handles.base, lock, handles.slot, handles.written.as_ref())
}

/// Frees slot `slot` of `base`: bit off, entries removed, slot file removed
/// (in that order, so a crash in between leaves a slot file that names the
/// lock and the next `release_stale` finishes the job).
pub(crate) fn free_slot(
    base: &mut Base,
    lock: &str,
    slot: u8,
    written: Option<&Written>,
) -> Result<(), NetlockError> {
    {
        let _held = base.exclusive(lock)?;
        set_engaged(lock, base, slot, false)?;
        remove_entries(lock, base, slot, written)?;
        crate::held::forget(&base.name, slot);
    }
    let path = base::slot_path(&base.name, slot);
    match std::fs::remove_file(&path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => {
            Err(NetlockError::Io { lock: lock.to_string(), what: "removing", path, source })
        }
    }
}

/// Frees the slots of `base` whose lock no longer exists.
pub(crate) fn free_orphan_slots(name: &str) {
    let orphans: Vec<(u8, String)> = base::slots(name)
        .into_iter()
        .filter(|(_, lock)| !crate::record::lock_dir(lock).exists())
        .collect();
    if orphans.is_empty() {
        return;
    }
    let mut base = match base::open(name, name) {
        Ok(base) => base,
        Err(e) => {
            tracing::warn!(base = %name, "opening to free slots of locks that are gone: {e}");
            return;
        }
    };
    for (slot, lock) in orphans {
        if let Err(e) = free_slot(&mut base, &lock, slot, None) {
            tracing::warn!(base = %name, slot, "freeing the slot of a lock that is gone: {e}");
        }
    }
}

/// Releases the eBPF part of a lock from its record: its slot in its base
/// (nothing when the base is gone with its namespace), and the per-lock
/// pins of an older ferry that pinned a program per lock.
pub(crate) fn release_named(
    lock: &str,
    slot: Option<(&str, u8, u16)>,
    open_handles: Option<&mut Handles>,
) -> Result<(), NetlockError> {
    // The slot is known: it is the lock's only one (claimed once, at
    // prepare, and recorded right after).
    let known = open_handles.is_some() || slot.is_some();
    match (open_handles, slot) {
        (Some(handles), _) => release(lock, handles)?,
        (None, Some((base_name, slot, generation))) => {
            match open(lock, base_name, slot, generation) {
                Ok(mut handles) => {
                    if let Some((overflowed, homes)) = crate::record::read_written(lock) {
                        set_written(&mut handles, overflowed, homes, None);
                    }
                    release(lock, &mut handles)?
                }
                Err(NetlockError::BaseGone { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        (None, None) => {}
    }
    // A slot file may name the lock without its record knowing the slot
    // (killed between claim and record): free those too.
    for base_name in base::list().into_iter().filter(|_| !known) {
        for (slot, owner) in base::slots(&base_name) {
            if owner == lock {
                if let Ok(mut handles) = open(lock, &base_name, slot, 0) {
                    release(lock, &mut handles)?;
                }
            }
        }
    }
    base::remove_pins(lock, &base::pin_root().join(lock))
}

/// Home slot of a tuple in the table (tests force the overflow path with it).
pub(crate) fn table_home(tuple: &Tuple) -> u32 {
    let t = Tuple { local: crate::canonical(tuple.local), remote: crate::canonical(tuple.remote) };
    table_hash(&key(&t).to_bytes()) & (TABLE_SLOTS - 1)
}

/// Slots a key may occupy from its home before it overflows.
pub(crate) const PROBES: u32 = TABLE_PROBES;

#[cfg(test)]
mod tests {
    use super::*;

    /// A key of family 2 told apart by `n`.
    fn key_of(n: u32) -> [u8; KEY_LEN] {
        let mut k = [0u8; KEY_LEN];
        k[0] = 2;
        k[4..8].copy_from_slice(&n.to_ne_bytes());
        k
    }

    fn owners(table: &[u8]) -> Vec<(usize, u8)> {
        table
            .chunks_exact(KEY_LEN)
            .enumerate()
            .filter(|(_, e)| e[0] != 0)
            .map(|(i, e)| (i, e[1]))
            .collect()
    }

    /// A release that clears only where its lock wrote leaves the table
    /// as one that looks through all of it: the same entries gone
    /// (those in a shared probe window and across the table's end
    /// included), another owner's kept.
    #[test]
    fn clearing_where_a_lock_wrote_equals_clearing_the_whole_table() {
        let mut table = vec![0u8; TABLE_SLOTS as usize * KEY_LEN];
        let last = TABLE_SLOTS - 1;
        // Owner 3: spread keys, and five sharing a home at the end (their
        // probes wrap to the start).
        let homes3: Vec<u32> = vec![10, 20_000, 40_000, last, last, last, last, last];
        let keys3: Vec<[u8; KEY_LEN]> = (0..homes3.len() as u32).map(key_of).collect();
        let order3: Vec<u32> = (0..homes3.len() as u32).collect();
        let over = insert_in_order(&mut table, (3, 7), &keys3, &homes3, &order3);
        assert!(over.is_empty());
        // Owner 5 in the same windows, before and after.
        let homes5: Vec<u32> = vec![10, last, 30_000];
        let keys5: Vec<[u8; KEY_LEN]> = (100..103).map(key_of).collect();
        let order5: Vec<u32> = (0..3).collect();
        assert!(insert_in_order(&mut table, (5, 9), &keys5, &homes5, &order5).is_empty());
        let mut whole = table.clone();
        clear_table(&mut whole, 3, None);
        clear_table(&mut table, 3, Some(&homes3));
        assert_eq!(owners(&table), owners(&whole));
        assert!(owners(&table).iter().all(|&(_, o)| o == 5));
        assert_eq!(owners(&table).len(), 3, "owner 5's entries kept");
        assert!(table == whole, "the same bytes");
    }
}
