//! The mappings of a frozen process with their VmFlags, without walking
//! its page tables when that can be proven exact.
//!
//! /proc/PID/smaps is the only file that shows a mapping's flags (dd, wf,
//! lo, hg...), and reading it walks every present page (~15 ms per GiB),
//! inside the freeze. A BPF task_vma iterator (`ferry_sys::vma_iter`)
//! reads each mapping's raw `vm_flags` in microseconds; /proc/PID/maps
//! gives the rest of each line without a page walk. What is left is
//! turning raw bits into the mnemonics smaps prints, and that table is
//! the kernel's, so it is *checked* before it is trusted:
//!
//! - [`presurvey`], while the process still runs (a migration does it
//!   before the freeze): raw flags, smaps, raw flags again. If the two raw
//!   reads agree, every mapping's smaps flags must equal the table applied
//!   to its raw flags; a mismatch (a flag changed during the read, or a
//!   table that is wrong for this kernel) makes the presurvey void. The
//!   bits seen set in a mapping that matched are *validated*.
//! - [`frozen_smaps`], in the freeze: raw flags and /proc/PID/maps. Used
//!   only if every mapping matches one of the raw reads one to one and
//!   every bit set is validated; anything else (a bit never seen, an
//!   unknown bit, a mapping the iterator does not see) reads smaps.
//!
//! So a wrong table can only cost speed, never a flag. A bit outside the
//! table (a flag newer than it, a protection key) is never turned into a
//! mnemonic here: the mapping is read from smaps, where the kernel prints
//! its name or `??`, and the protection key, and capture refuses what the
//! catalog (`catalog::vmflags`) does not restore or does not know. So an
//! unknown bit is refused the same way whichever path read it.

use crate::error::Result;
use crate::procfs::{self, MapsEntry};
use crate::vm_flags::{mnemonics, read_raw};
use ferry_sys::vma_iter::RawVma;

/// What a presurvey of one process proved.
#[derive(Debug, Clone, Default)]
pub struct Presurveyed {
    /// Bits whose mnemonics were seen to match smaps.
    validated: u64,
    /// Mappings outside the process's address space tree ([vsyscall]),
    /// which the iterator does not see: their smaps flags as read.
    gate: Vec<(u64, u64, Vec<String>)>,
}

/// Addresses at and above this are the gate area, not the mm's mappings.
const GATE_START: u64 = 0xffff_8000_0000_0000;

/// Reads smaps of `pid` (running) between two raw reads and returns what
/// that proves, or None when nothing can be relied on.
pub fn presurvey(pid: i32) -> Option<Presurveyed> {
    let before = read_raw(pid)?;
    let smaps = procfs::smaps(pid).ok()?;
    let after = read_raw(pid)?;
    if before != after {
        return None;
    }
    check_presurvey(&smaps, &after)
}

/// The proof of a presurvey (see the module comment), pure logic.
fn check_presurvey(smaps: &[MapsEntry], raw: &[RawVma]) -> Option<Presurveyed> {
    let (gate, mapped): (Vec<&MapsEntry>, Vec<&MapsEntry>) =
        smaps.iter().partition(|m| m.start >= GATE_START);
    if mapped.len() != raw.len() {
        return None;
    }
    let mut validated = 0;
    for (m, r) in mapped.iter().zip(raw) {
        if m.start != r.start || m.end != r.end {
            return None;
        }
        match mnemonics(r.flags) {
            Some(names) if names == m.vm_flags => validated |= r.flags,
            Some(_) => return None,
            // A bit outside the table: this mapping proves nothing, and
            // the freeze will read smaps if the bit is still set.
            None => {}
        }
    }
    Some(Presurveyed {
        validated,
        gate: gate.iter().map(|m| (m.start, m.end, m.vm_flags.clone())).collect(),
    })
}

/// The mappings of frozen `pid` as smaps would show them, and whether they
/// were read without smaps.
pub fn frozen_smaps(pid: i32, pre: Option<&Presurveyed>) -> Result<(Vec<MapsEntry>, bool)> {
    if let Some(pre) = pre {
        if let Some(raw) = read_raw(pid) {
            let maps = procfs::maps(pid)?;
            if let Some(entries) = combine(maps, &raw, pre) {
                return Ok((entries, true));
            }
        }
    }
    Ok((procfs::smaps(pid)?, false))
}

/// /proc/PID/maps lines with flags from `raw`, if all of it is proven.
fn combine(mut maps: Vec<MapsEntry>, raw: &[RawVma], pre: &Presurveyed) -> Option<Vec<MapsEntry>> {
    let mut raw_iter = raw.iter();
    for m in &mut maps {
        if m.start >= GATE_START {
            let (_, _, flags) = pre.gate.iter().find(|(s, e, _)| *s == m.start && *e == m.end)?;
            m.vm_flags = flags.clone();
            continue;
        }
        let r = raw_iter.next()?;
        if r.start != m.start || r.end != m.end || r.flags & !pre.validated != 0 {
            return None;
        }
        m.vm_flags = mnemonics(r.flags)?;
    }
    raw_iter.next().is_none().then_some(maps)
}

/// Presurveys `root` and its descendants as they are now; those that
/// prove nothing (or are gone) are left out.
pub fn presurvey_tree(root: i32) -> std::collections::HashMap<i32, Presurveyed> {
    let mut known = std::collections::HashMap::new();
    presurvey_new(root, &mut known);
    known
}

/// [`presurvey_tree`] for a tree presurveyed before (every sync of
/// `ferry replicate`): only the processes `known` lacks are read, those
/// gone are dropped. What a presurvey proved stays true: it is a fact of
/// this kernel's flag table, not of the moment (the freeze still checks
/// every mapping against it, and reads smaps for any bit it lacks).
pub fn presurvey_new(root: i32, known: &mut std::collections::HashMap<i32, Presurveyed>) {
    let pids = super::tree::running_tree(root);
    known.retain(|p, _| pids.contains(p));
    for p in pids {
        if let std::collections::hash_map::Entry::Vacant(e) = known.entry(p) {
            if let Some(s) = presurvey(p) {
                e.insert(s);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(start: u64, end: u64, flags: &[&str]) -> MapsEntry {
        MapsEntry {
            start,
            end,
            perms: *b"rw-p",
            offset: 0,
            dev: 0,
            inode: 0,
            path: String::new(),
            vm_flags: flags.iter().map(|s| s.to_string()).collect(),
        }
    }

    const RW: u64 = 0x73; // rd wr mr mw me
    const DD: u64 = 1 << 26;

    #[test]
    fn every_mnemonic_of_the_bit_table_is_in_the_catalog() {
        for (bit, m) in crate::vm_flags::MNEMONICS {
            assert!(crate::catalog::vmflags::VMFLAGS.get(m).is_some(), "bit {bit} {m}");
        }
    }

    #[test]
    fn an_unknown_bit_is_left_to_smaps_where_the_catalog_refuses_it() {
        let smaps = [entry(0x1000, 0x2000, &["rd", "wr", "mr", "mw", "me"])];
        let raw = [RawVma { start: 0x1000, end: 0x2000, flags: RW }];
        let pre = check_presurvey(&smaps, &raw).expect("proved");
        let unknown = [RawVma { start: 0x1000, end: 0x2000, flags: RW | 1 << 39 }];
        assert!(mnemonics(RW | 1 << 39).is_none());
        assert!(combine(vec![entry(0x1000, 0x2000, &[])], &unknown, &pre).is_none());
        // What smaps prints for it is refused by name.
        let printed = ["rd".to_string(), "??".to_string()];
        assert_eq!(crate::catalog::vmflags::refusal(&printed).map(|r| r.0), Some("??"));
    }

    #[test]
    fn a_matching_presurvey_validates_the_bits_it_saw() {
        let smaps = [
            entry(0x1000, 0x2000, &["rd", "wr", "mr", "mw", "me"]),
            entry(0x3000, 0x5000, &["rd", "wr", "mr", "mw", "me", "dd"]),
        ];
        let raw = [
            RawVma { start: 0x1000, end: 0x2000, flags: RW },
            RawVma { start: 0x3000, end: 0x5000, flags: RW | DD },
        ];
        let pre = check_presurvey(&smaps, &raw).expect("proved");
        assert_eq!(pre.validated, RW | DD);
        // The same mappings in the freeze: flags from the raw bits.
        let maps = vec![entry(0x1000, 0x2000, &[]), entry(0x3000, 0x5000, &[])];
        let got = combine(maps, &raw, &pre).expect("combined");
        assert_eq!(got[1].vm_flags, ["rd", "wr", "mr", "mw", "me", "dd"]);
    }

    #[test]
    fn a_flag_changed_during_the_read_voids_the_presurvey() {
        // smaps showed dd, the raw reads (before and after) do not.
        let smaps = [entry(0x1000, 0x2000, &["rd", "wr", "mr", "mw", "me", "dd"])];
        let raw = [RawVma { start: 0x1000, end: 0x2000, flags: RW }];
        assert!(check_presurvey(&smaps, &raw).is_none());
        // Or the mappings differ.
        let smaps = [entry(0x1000, 0x3000, &["rd", "wr", "mr", "mw", "me"])];
        assert!(check_presurvey(&smaps, &raw).is_none());
    }

    #[test]
    fn a_bit_never_validated_or_unknown_falls_back_to_smaps() {
        let smaps = [entry(0x1000, 0x2000, &["rd", "wr", "mr", "mw", "me"])];
        let raw = [RawVma { start: 0x1000, end: 0x2000, flags: RW }];
        let pre = check_presurvey(&smaps, &raw).expect("proved");
        let maps = || vec![entry(0x1000, 0x2000, &[])];
        // MADV_DONTDUMP since: dd was never seen, so not trusted.
        assert!(combine(maps(), &[RawVma { start: 0x1000, end: 0x2000, flags: RW | DD }], &pre)
            .is_none());
        // A bit above the table.
        assert!(combine(
            maps(),
            &[RawVma { start: 0x1000, end: 0x2000, flags: RW | 1 << 40 }],
            &pre
        )
        .is_none());
        // A mapping more or less.
        assert!(combine(maps(), &[], &pre).is_none());
        let two = [
            RawVma { start: 0x1000, end: 0x2000, flags: RW },
            RawVma { start: 0x3000, end: 0x4000, flags: RW },
        ];
        assert!(combine(maps(), &two, &pre).is_none());
        // Moved.
        assert!(
            combine(maps(), &[RawVma { start: 0x1000, end: 0x3000, flags: RW }], &pre).is_none()
        );
        assert!(combine(maps(), &raw, &pre).is_some());
    }

    #[test]
    fn the_gate_mapping_keeps_its_presurveyed_flags() {
        let gate = entry(0xffff_ffff_ff60_0000, 0xffff_ffff_ff60_1000, &["ex"]);
        let smaps = [entry(0x1000, 0x2000, &["rd", "wr", "mr", "mw", "me"]), gate.clone()];
        let raw = [RawVma { start: 0x1000, end: 0x2000, flags: RW }];
        let pre = check_presurvey(&smaps, &raw).expect("proved");
        let got =
            combine(vec![entry(0x1000, 0x2000, &[]), entry(gate.start, gate.end, &[])], &raw, &pre)
                .expect("combined");
        assert_eq!(got[1].vm_flags, ["ex"]);
    }

    #[test]
    fn a_kept_presurvey_drops_processes_gone_and_keeps_the_others() {
        // A quiet process: this test binary's other threads map memory.
        let mut child = std::process::Command::new("sleep").arg("30").spawn().expect("sleep");
        let pid = child.id() as i32;
        let mut known = std::collections::HashMap::new();
        known.insert(i32::MAX, Presurveyed { validated: 1, gate: Vec::new() });
        presurvey_new(pid, &mut known);
        let gone = known.contains_key(&i32::MAX);
        // Until its exec is over, its mappings change between the reads
        // and the presurvey proves nothing: it is tried at the next call.
        for _ in 0..100 {
            if known.contains_key(&pid) || !ferry_sys::process::is_root() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
            presurvey_new(pid, &mut known);
        }
        // The BPF iterator needs root; without it nothing is proved.
        let proved = known.get(&pid).map(|p| p.validated);
        known.insert(pid, Presurveyed { validated: 7, gate: Vec::new() });
        presurvey_new(pid, &mut known);
        let kept = known[&pid].validated;
        let _ = child.kill();
        let _ = child.wait();
        assert!(!gone);
        if ferry_sys::process::is_root() {
            assert!(proved.is_some_and(|v| v != 0), "{proved:?}");
        }
        assert_eq!(kept, 7, "read again");
    }
}
