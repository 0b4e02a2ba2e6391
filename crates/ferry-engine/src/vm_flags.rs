//! Mapping flags (VmFlags) three ways: the raw `vm_flags` bits a BPF
//! task_vma iterator reads without a page walk, the mnemonics smaps
//! prints for them, and the bits an image records. Shared by capture
//! (`capture/vma_flags.rs`, which proves the table against smaps before
//! trusting it) and by the restore's own check (`restore/verify/memory.rs`,
//! which reads smaps before it reports any difference).

use ferry_image::vmflag;
use ferry_sys::vma_iter::{IterLayout, RawVma, VmaIterProgram};
use std::sync::OnceLock;

/// Bit number of `vm_flags` and the mnemonic smaps prints for it
/// (fs/proc/task_mmu.c, show_smap_vma_flags), in the order smaps prints
/// them. Only bits below 32, whose meaning has not moved in years; a
/// mapping with a higher bit set is read from smaps.
pub(crate) const MNEMONICS: [(u32, &str); 32] = [
    (0, "rd"),
    (1, "wr"),
    (2, "ex"),
    (3, "sh"),
    (4, "mr"),
    (5, "mw"),
    (6, "me"),
    (7, "ms"),
    (8, "gd"),
    (9, "um"),
    (10, "pf"),
    (11, "gu"),
    (12, "uw"),
    (13, "lo"),
    (14, "io"),
    (15, "sr"),
    (16, "rr"),
    (17, "dc"),
    (18, "de"),
    (19, "lf"),
    (20, "ac"),
    (21, "nr"),
    (22, "ht"),
    (23, "sf"),
    (24, "ar"),
    (25, "wf"),
    (26, "dd"),
    (27, "sd"),
    (28, "mm"),
    (29, "hg"),
    (30, "nh"),
    (31, "mg"),
];

/// The bits [`MNEMONICS`] names.
fn known_bits() -> u64 {
    MNEMONICS.iter().fold(0, |m, (b, _)| m | 1 << b)
}

/// The smaps mnemonics of raw `flags`; None if a bit is not in the table.
pub(crate) fn mnemonics(flags: u64) -> Option<Vec<String>> {
    if flags & !known_bits() != 0 {
        return None;
    }
    Some(
        MNEMONICS.iter().filter(|(b, _)| flags & 1 << b != 0).map(|(_, m)| m.to_string()).collect(),
    )
}

static PROGRAM: OnceLock<Option<VmaIterProgram>> = OnceLock::new();

/// Loads the iterator (once per process) now: on another thread while a
/// restore reads its image, at an agent's start, so its first use (the
/// restore's check) does not load it in a pause.
pub fn load_ahead() {
    let _ = program();
}

/// This iterator as loaded here (loading it first), for the setsockopt
/// watch (`capture/sockopt_watch.rs`): any program of the same tag, which
/// runs the same instructions, only reads and sets no socket option.
pub(crate) fn own_program() -> Option<ferry_sys::bpf::ProgInfo> {
    program()?.info().ok()
}

fn program() -> Option<&'static VmaIterProgram> {
    PROGRAM
        .get_or_init(|| match load_program() {
            Ok(p) => Some(p),
            Err(e) => {
                tracing::info!("mapping flags come from smaps only: {e}");
                None
            }
        })
        .as_ref()
}

fn load_program() -> std::result::Result<VmaIterProgram, String> {
    let mut btf = crate::kernel_btf::KernelBtf::open();
    let (ctx, vma) = ("bpf_iter__task_vma", "vm_area_struct");
    let layout = IterLayout {
        attach_btf_id: btf.func("bpf_iter_task_vma")?,
        ctx_meta: btf.byte(ctx, "meta")?,
        ctx_vma: btf.byte(ctx, "vma")?,
        meta_seq: btf.byte("bpf_iter_meta", "seq")?,
        vm_start: btf.byte(vma, "vm_start")?,
        vm_end: btf.byte(vma, "vm_end")?,
        vm_flags: btf.byte(vma, "vm_flags")?,
    };
    let program = VmaIterProgram::load(&layout).map_err(|e| e.to_string())?;
    btf.save();
    Ok(program)
}

pub(crate) fn read_raw(pid: i32) -> Option<Vec<RawVma>> {
    let prog = program()?;
    match prog.read(pid) {
        Ok(v) if !v.is_empty() => Some(v),
        Ok(_) => None,
        Err(e) => {
            tracing::debug!("pid {pid}: reading mapping flags by BPF: {e}");
            None
        }
    }
}

/// Each mapping of `pid` (start, end, mnemonics) from the BPF iterator
/// alone, with the table unproven: for the restore's own check, which
/// reads smaps again before it reports any difference (so a table wrong
/// for this kernel costs a page walk, never a false failure). None when
/// the iterator is unavailable or a bit is outside the table.
pub(crate) fn unproven_flags(pid: i32) -> Option<Vec<(u64, u64, Vec<String>)>> {
    read_raw(pid)?.into_iter().map(|r| Some((r.start, r.end, mnemonics(r.flags)?))).collect()
}

/// The VmFlags mnemonics an image records, with its bit for each.
pub(crate) const FLAG_NAMES: &[(&str, u32)] = &[
    ("gd", vmflag::GROWSDOWN),
    ("dc", vmflag::DONTFORK),
    ("dd", vmflag::DONTDUMP),
    ("wf", vmflag::WIPEONFORK),
    ("hg", vmflag::HUGEPAGE),
    ("nh", vmflag::NOHUGEPAGE),
    ("mg", vmflag::MERGEABLE),
    ("mw", vmflag::MAYWRITE),
    ("lo", vmflag::LOCKED),
    ("nr", vmflag::NORESERVE),
    ("lf", vmflag::LOCKONFAULT),
    ("sr", vmflag::SEQ_READ),
    ("rr", vmflag::RAND_READ),
];

/// The image's flag bits ([`vmflag`]) of the VmFlags mnemonics `names`;
/// mnemonics the image does not record are left out.
pub(crate) fn image_flags<'a>(names: impl IntoIterator<Item = &'a str>) -> u32 {
    names
        .into_iter()
        .filter_map(|n| FLAG_NAMES.iter().find(|(name, _)| *name == n).map(|(_, f)| f))
        .fold(0, |a, f| a | f)
}

/// The VmFlags mnemonics of the image's flag bits `flags`.
pub(crate) fn flag_names(flags: u32) -> Vec<&'static str> {
    FLAG_NAMES.iter().filter(|(_, f)| flags & f != 0).map(|(n, _)| *n).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_bits_and_mnemonics_translate_both_ways() {
        let bits = image_flags(["dd", "lo", "rd", "zz"]);
        assert_eq!(bits, vmflag::DONTDUMP | vmflag::LOCKED);
        assert_eq!(flag_names(bits), vec!["dd", "lo"]);
    }
}
