//! The mappings: the same ranges with the same protection, sharing and
//! (for file mappings) file, as /proc/PID/maps lists them. Neighbouring
//! mappings the kernel may keep apart on one side and merge on the other
//! are merged on both before the comparison; the kernel's own mappings
//! (vDSO, vvar, vsyscall) are moved by restore and left out.
//!
//! Then the flags restore sets again (the VmFlags of the image: dc, dd,
//! wf, hg, nh, mg, lo, lf, sr, rr, gd, nr, mw): every restored mapping
//! within an image mapping must have that mapping's flags. They are read
//! by the BPF iterator when it can (no page walk of the restored memory),
//! and from smaps when it cannot or when it sees a difference, so only
//! smaps can fail the check.

use super::Findings;
use crate::error::Result;
use ferry_image::{ProcessImage, VmaBacking};

/// A mapping as both sides describe it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Range {
    start: u64,
    end: u64,
    /// "rwxp" / "r--s"...
    perms: String,
    /// The file's path for a file mapping; empty otherwise.
    file: String,
}

fn perms(prot: u8, shared: bool) -> String {
    let bit = |b: u8, c: char| if prot & b != 0 { c } else { '-' };
    let mut s: String = [bit(1, 'r'), bit(2, 'w'), bit(4, 'x')].iter().collect();
    s.push(if shared { 's' } else { 'p' });
    s
}

/// The kernel's own mappings, which restore moves rather than makes.
fn is_kernel_mapping(name: &str) -> bool {
    name.starts_with("[v") || name == "[uprobes]"
}

fn image_ranges(p: &ProcessImage) -> Vec<Range> {
    let ranges = p.vmas.iter().filter_map(|v| {
        let file = match &v.backing {
            VmaBacking::Vdso | VmaBacking::Vvar { .. } | VmaBacking::Vsyscall => return None,
            VmaBacking::File { path, .. } => path.clone(),
            // Made again at its path and deleted, as it was.
            VmaBacking::DeletedFile { id } => p
                .fidelity
                .deleted_files
                .iter()
                .find(|f| f.id == *id)
                .map_or_else(String::new, |f| format!("{} (deleted)", f.name)),
            _ => String::new(),
        };
        Some(Range { start: v.start, end: v.end, perms: perms(v.prot, v.shared), file })
    });
    merged(ranges)
}

fn restored_ranges(pid: i32) -> Result<Vec<Range>> {
    let maps = crate::procfs::maps(pid)?;
    let ranges = maps.into_iter().filter(|m| !is_kernel_mapping(&m.path)).map(|m| {
        // A file mapping names its file by path and has an inode;
        // anonymous ones ([heap], [stack], shared memory) compare by range.
        let file = if m.inode != 0 && m.path.starts_with('/') && !is_shared_memory(&m.path) {
            m.path.clone()
        } else {
            String::new()
        };
        Range { start: m.start, end: m.end, perms: String::from_utf8_lossy(&m.perms).into(), file }
    });
    Ok(merged(ranges))
}

/// Shared memory the image keeps apart from files (anonymous shared,
/// memfd, SysV): its path in maps is the kernel's name for it.
fn is_shared_memory(path: &str) -> bool {
    path.starts_with("/dev/zero") || path.starts_with("/memfd:") || path.starts_with("/SYSV")
}

/// Adjacent ranges of one kind as one.
fn merged(ranges: impl Iterator<Item = Range>) -> Vec<Range> {
    let mut out: Vec<Range> = Vec::new();
    for r in ranges {
        match out.last_mut() {
            Some(last) if last.end == r.start && last.perms == r.perms && last.file == r.file => {
                last.end = r.end;
            }
            _ => out.push(r),
        }
    }
    out
}

fn describe(r: Option<&Range>) -> String {
    match r {
        None => "nothing".into(),
        Some(r) => format!("{:#x}-{:#x} {} {}", r.start, r.end, r.perms, r.file).trim_end().into(),
    }
}

/// (start, end, image flag bits) of each mapping.
type Flagged = Vec<(u64, u64, u32)>;

fn image_flags(p: &ProcessImage) -> Flagged {
    p.vmas
        .iter()
        .filter(|v| {
            !matches!(v.backing, VmaBacking::Vdso | VmaBacking::Vvar { .. } | VmaBacking::Vsyscall)
        })
        .map(|v| (v.start, v.end, v.flags))
        .collect()
}

fn flagged<'a>(maps: impl Iterator<Item = (u64, u64, &'a [String])>) -> Flagged {
    maps.map(|(s, e, names)| (s, e, capture_flags(names))).collect()
}

fn capture_flags(names: &[String]) -> u32 {
    crate::vm_flags::image_flags(names.iter().map(String::as_str))
}

/// The first image mapping (start, end, wanted, found) that a restored
/// mapping overlapping it shows with other flags. Both lists are sorted.
fn first_flag_difference(want: &Flagged, have: &Flagged) -> Option<(u64, u64, u32, u32)> {
    let mut from = 0;
    for &(start, end, flags) in want {
        while have.get(from).is_some_and(|h| h.1 <= start) {
            from += 1;
        }
        let overlapping = have[from..].iter().take_while(|h| h.0 < end);
        if let Some(h) = overlapping.into_iter().find(|h| h.2 != flags) {
            return Some((start, end, flags, h.2));
        }
    }
    None
}

fn restored_flags(pid: i32, want: &Flagged) -> Result<Option<(u64, u64, u32, u32)>> {
    // A small tree's `ferry restore` reads smaps alone (restore/loader.rs).
    let by_bpf = !crate::restore::loader::by_smaps();
    let quick = by_bpf.then(|| crate::vm_flags::unproven_flags(pid)).flatten();
    let quick = quick.map(|m| flagged(m.iter().map(|(s, e, n)| (*s, *e, n.as_slice()))));
    match quick.map(|have| first_flag_difference(want, &have)) {
        Some(None) => return Ok(None),
        Some(Some(d)) => {
            tracing::debug!("pid {pid}: mapping flags differ by BPF ({d:x?}), reading smaps")
        }
        None if by_bpf => {
            tracing::debug!("pid {pid}: mapping flags not readable by BPF, reading smaps")
        }
        None => {}
    }
    let smaps = crate::procfs::smaps(pid)?;
    let have = flagged(smaps.iter().map(|m| (m.start, m.end, m.vm_flags.as_slice())));
    Ok(first_flag_difference(want, &have))
}

fn compare_flags(p: &ProcessImage, found: &mut Findings) -> Result<()> {
    if let Some((start, end, want, have)) = restored_flags(p.pid, &image_flags(p))? {
        let names = |f: u32| crate::vm_flags::flag_names(f).join(" ");
        found.compare(
            p.pid,
            &format!("mapping {start:#x}-{end:#x}"),
            "VmFlags",
            names(want),
            names(have),
        );
    }
    Ok(())
}

pub(super) fn compare(p: &ProcessImage, found: &mut Findings) -> Result<()> {
    compare_flags(p, found)?;
    let want = image_ranges(p);
    let have = restored_ranges(p.pid)?;
    if want == have {
        return Ok(());
    }
    let at = want.iter().zip(&have).position(|(a, b)| a != b).unwrap_or(want.len().min(have.len()));
    found.compare(
        p.pid,
        "mappings",
        "the first differing mapping",
        describe(want.get(at)),
        describe(have.get(at)),
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(start: u64, end: u64, perms: &str, file: &str) -> Range {
        Range { start, end, perms: perms.into(), file: file.into() }
    }

    #[test]
    fn neighbours_of_one_kind_merge_and_others_do_not() {
        let m = merged(
            [
                r(0x1000, 0x2000, "rw-p", ""),
                r(0x2000, 0x3000, "rw-p", ""),
                r(0x3000, 0x4000, "r--p", ""),
                r(0x5000, 0x6000, "r--p", ""),
                r(0x6000, 0x7000, "r--p", "/lib/x.so"),
            ]
            .into_iter(),
        );
        assert_eq!(
            m,
            vec![
                r(0x1000, 0x3000, "rw-p", ""),
                r(0x3000, 0x4000, "r--p", ""),
                r(0x5000, 0x6000, "r--p", ""),
                r(0x6000, 0x7000, "r--p", "/lib/x.so"),
            ]
        );
    }

    #[test]
    fn a_flag_difference_is_found_in_any_restored_piece_of_a_mapping() {
        let want = vec![(0x1000, 0x4000, 1), (0x4000, 0x5000, 2), (0x8000, 0x9000, 0)];
        // Split in two on the restored side, the second piece differs.
        let have = vec![(0x1000, 0x2000, 1), (0x2000, 0x4000, 3), (0x4000, 0x5000, 2)];
        assert_eq!(first_flag_difference(&want, &have), Some((0x1000, 0x4000, 1, 3)));
        // Merged on the restored side with the same flags: no difference.
        let want = vec![(0x1000, 0x2000, 1), (0x2000, 0x3000, 1)];
        assert_eq!(first_flag_difference(&want, &vec![(0x1000, 0x3000, 1)]), None);
        // A mapping missing on the restored side is the ranges' finding.
        assert_eq!(first_flag_difference(&want, &vec![]), None);
    }

    #[test]
    fn protection_bits_read_as_maps_prints_them() {
        assert_eq!(perms(1 | 4, false), "r-xp");
        assert_eq!(perms(1 | 2, true), "rw-s");
        assert_eq!(perms(0, false), "---p");
        assert!(is_kernel_mapping("[vvar_vclock]") && !is_kernel_mapping("[heap]"));
    }
}
