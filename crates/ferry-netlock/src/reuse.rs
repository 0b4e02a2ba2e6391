//! Mappings a process keeps from one lock to the next, when it asks to
//! ([`keep_mappings`]). A command that locks once gains nothing from
//! them, but `ferry replicate` locks the same base for every sync, and
//! each lock mapped the base's table (2.5 MiB, populated), touched the
//! engage scratch (1.6 MiB), and mapped the held-packet ring (8 MiB, its
//! data twice): several milliseconds per sync, before and inside the
//! pause, for memory that is the same every time.
//!
//! A kept mapping is named by its base and by the id of the BPF map
//! behind it: a base released and installed again has new maps with new
//! ids (the kernel hands ids out cyclically), so a mapping of an old map
//! is never used for a new one. A kept mapping holds its map alive, so a
//! base released by this process forgets its mappings at once
//! ([`forget_base`]); one released by another process is noticed by the
//! id and dropped at the next lookup.

use ferry_sys::bpf::{MappedArray, RingConsumer};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

static ENABLED: AtomicBool = AtomicBool::new(false);
static TABLES: Mutex<Vec<Kept<MappedArray>>> = Mutex::new(Vec::new());
static RINGS: Mutex<Vec<Kept<RingConsumer>>> = Mutex::new(Vec::new());
static SCRATCH: Mutex<Option<Scratch>> = Mutex::new(None);

/// Bases a process keeps mappings of (a replicated service has one).
const KEEP_BASES: usize = 4;

struct Kept<T> {
    base: String,
    map_id: u32,
    value: T,
}

/// The length of a table key (`base::KEY_LEN`; ebpf.rs checks they agree:
/// this module depends on no other of the crate).
pub(crate) const KEY_BYTES: usize = 40;

/// The engage scratch (see `ebpf::Handles`), touched once.
pub(crate) struct Scratch {
    pub homes: Vec<u32>,
    pub order: Vec<u32>,
    pub keys: Vec<[u8; KEY_BYTES]>,
}

/// From now on this process keeps the mappings of the bases it locks for
/// its next locks (see the module comment). For a process that locks the
/// same namespace again and again.
pub fn keep_mappings() {
    ENABLED.store(true, Ordering::Relaxed);
}

fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

fn take<T>(pool: &Mutex<Vec<Kept<T>>>, base: &str, map_id: u32) -> Option<T> {
    let mut kept = pool.lock().ok()?;
    // A mapping of this base's earlier map is of no use to anyone now.
    kept.retain(|k| k.base != base || k.map_id == map_id);
    let at = kept.iter().position(|k| k.base == base)?;
    Some(kept.swap_remove(at).value)
}

fn put<T>(pool: &Mutex<Vec<Kept<T>>>, base: &str, map_id: u32, value: T) {
    if !enabled() {
        return;
    }
    let Ok(mut kept) = pool.lock() else { return };
    kept.retain(|k| k.base != base);
    if kept.len() >= KEEP_BASES {
        kept.remove(0);
    }
    kept.push(Kept { base: base.to_string(), map_id, value });
}

pub(crate) fn take_table(base: &str, map_id: u32) -> Option<MappedArray> {
    take(&TABLES, base, map_id)
}

pub(crate) fn put_table(base: &str, map_id: u32, table: MappedArray) {
    put(&TABLES, base, map_id, table)
}

pub(crate) fn take_ring(base: &str, map_id: u32) -> Option<RingConsumer> {
    take(&RINGS, base, map_id)
}

pub(crate) fn put_ring(base: &str, map_id: u32, ring: RingConsumer) {
    put(&RINGS, base, map_id, ring)
}

pub(crate) fn take_scratch() -> Option<Scratch> {
    SCRATCH.lock().ok()?.take()
}

pub(crate) fn put_scratch(scratch: Scratch) {
    if !enabled() {
        return;
    }
    if let Ok(mut kept) = SCRATCH.lock() {
        *kept = Some(scratch);
    }
}

/// Drops this process's mappings of `base`: it is being released, and a
/// mapping would keep its maps alive.
pub(crate) fn forget_base(base: &str) {
    if let Ok(mut kept) = TABLES.lock() {
        kept.retain(|k| k.base != base);
    }
    if let Ok(mut kept) = RINGS.lock() {
        kept.retain(|k| k.base != base);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static POOL: Mutex<Vec<Kept<u32>>> = Mutex::new(Vec::new());

    #[test]
    fn a_kept_value_is_found_by_its_base_and_map_only() {
        keep_mappings();
        put(&POOL, "b1", 7, 70);
        put(&POOL, "b2", 8, 80);
        // b1's map was replaced (new id): the old mapping is dropped.
        assert_eq!(take(&POOL, "b1", 9), None);
        assert_eq!(take(&POOL, "b1", 7), None);
        assert_eq!(take(&POOL, "b2", 8), Some(80));
        assert_eq!(take(&POOL, "b2", 8), None);
        for i in 0..(KEEP_BASES as u32 + 2) {
            put(&POOL, &format!("n{i}"), i, i);
        }
        assert_eq!(POOL.lock().map(|k| k.len()).unwrap_or(0), KEEP_BASES);
        assert_eq!(take(&POOL, "n0", 0), None, "the oldest is let go first");
    }
}
