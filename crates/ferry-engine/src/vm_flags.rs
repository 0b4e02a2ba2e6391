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

fn program() -> Option<&'static VmaIterProgram> {
    static PROGRAM: OnceLock<Option<VmaIterProgram>> = OnceLock::new();
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
    if let Some(layout) = cached_layout() {
        match VmaIterProgram::load(&layout) {
            Ok(p) => return Ok(p),
            Err(e) => tracing::info!("the cached layout {LAYOUT_CACHE} does not load ({e})"),
        }
    }
    let layout = layout_from_btf()?;
    let program = VmaIterProgram::load(&layout).map_err(|e| e.to_string())?;
    store_layout(&layout);
    Ok(program)
}

/// Where the iterator's layout is kept once read from the kernel's BTF:
/// parsing the 5 MiB of /sys/kernel/btf/vmlinux takes tens of
/// milliseconds, which a restore's own check would otherwise pay inside
/// the pause. The BTF cannot change without a reboot, so the entry is
/// keyed by the boot id; a stale or damaged entry is ignored (and a wrong
/// layout could only fail to load or make the flags disagree with smaps,
/// which both paths treat as "read smaps").
const LAYOUT_CACHE: &str = "/run/ferry/vma-iter-layout";

fn boot_id() -> Option<String> {
    let id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    Some(id.trim().to_string())
}

/// The cache's one line: boot id, then the layout's numbers.
fn layout_line(boot: &str, l: &IterLayout) -> String {
    format!(
        "{boot} {} {} {} {} {} {} {}\n",
        l.attach_btf_id, l.ctx_meta, l.ctx_vma, l.meta_seq, l.vm_start, l.vm_end, l.vm_flags
    )
}

fn parse_layout_line(line: &str, boot: &str) -> Option<IterLayout> {
    let mut words = line.split_whitespace();
    if words.next()? != boot {
        return None;
    }
    let attach_btf_id = words.next()?.parse().ok()?;
    let mut offset = || words.next()?.parse::<i16>().ok().filter(|o| *o >= 0);
    let layout = IterLayout {
        attach_btf_id,
        ctx_meta: offset()?,
        ctx_vma: offset()?,
        meta_seq: offset()?,
        vm_start: offset()?,
        vm_end: offset()?,
        vm_flags: offset()?,
    };
    words.next().is_none().then_some(layout)
}

fn cached_layout() -> Option<IterLayout> {
    parse_layout_line(&std::fs::read_to_string(LAYOUT_CACHE).ok()?, &boot_id()?)
}

/// Best effort: without the cache the next run parses the BTF again.
fn store_layout(layout: &IterLayout) {
    use std::io::Write as _;
    use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
    let Some(boot) = boot_id() else { return };
    let dir = std::path::Path::new(LAYOUT_CACHE).parent().unwrap_or(std::path::Path::new("/"));
    let _ = std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir);
    let tmp = format!("{LAYOUT_CACHE}.{}", std::process::id());
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .and_then(|mut f| f.write_all(layout_line(&boot, layout).as_bytes()))
        .and_then(|()| std::fs::rename(&tmp, LAYOUT_CACHE));
    if let Err(e) = written {
        tracing::debug!("keeping the iterator's layout in {LAYOUT_CACHE}: {e}");
        let _ = std::fs::remove_file(&tmp);
    }
}

/// The iterator's layout from the running kernel's BTF.
fn layout_from_btf() -> std::result::Result<IterLayout, String> {
    let path = "/sys/kernel/btf/vmlinux";
    let bytes = std::fs::read(path).map_err(|e| format!("{path}: {e}"))?;
    let btf = crate::btf::Btf::parse(&bytes).map_err(|e| format!("{path}: {e}"))?;
    let strukt = |name: &str| {
        btf.find(crate::btf::KIND_STRUCT, name)
            .ok_or_else(|| format!("the kernel's BTF has no struct {name}"))
    };
    let member = |id: u32, s: &str, m: &str| -> std::result::Result<i16, String> {
        let off =
            btf.member_offset(id, m).ok_or_else(|| format!("the kernel's BTF has no {s}.{m}"))?;
        i16::try_from(off).map_err(|_| format!("{s}.{m} lies at byte {off}"))
    };
    let ctx = strukt("bpf_iter__task_vma")?;
    let meta = strukt("bpf_iter_meta")?;
    let vma = strukt("vm_area_struct")?;
    let layout = IterLayout {
        attach_btf_id: btf
            .find(crate::btf::KIND_FUNC, "bpf_iter_task_vma")
            .ok_or("the kernel's BTF has no bpf_iter_task_vma")?,
        ctx_meta: member(ctx, "bpf_iter__task_vma", "meta")?,
        ctx_vma: member(ctx, "bpf_iter__task_vma", "vma")?,
        meta_seq: member(meta, "bpf_iter_meta", "seq")?,
        vm_start: member(vma, "vm_area_struct", "vm_start")?,
        vm_end: member(vma, "vm_area_struct", "vm_end")?,
        vm_flags: member(vma, "vm_area_struct", "vm_flags")?,
    };
    Ok(layout)
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
    fn the_layout_cache_line_reads_back_only_for_its_boot() {
        let l = IterLayout {
            attach_btf_id: 123456,
            ctx_meta: 0,
            ctx_vma: 16,
            meta_seq: 0,
            vm_start: 0,
            vm_end: 8,
            vm_flags: 32,
        };
        let line = layout_line("boot-a", &l);
        assert_eq!(parse_layout_line(&line, "boot-a"), Some(l));
        assert_eq!(parse_layout_line(&line, "boot-b"), None, "another boot's kernel");
        assert_eq!(parse_layout_line("boot-a 1 2 3", "boot-a"), None, "cut short");
        assert_eq!(parse_layout_line(&line.replace(" 32", " -32"), "boot-a"), None);
        assert_eq!(parse_layout_line(&format!("{} 9", line.trim()), "boot-a"), None, "too long");
    }

    #[test]
    fn image_bits_and_mnemonics_translate_both_ways() {
        let bits = image_flags(["dd", "lo", "rd", "zz"]);
        assert_eq!(bits, vmflag::DONTDUMP | vmflag::LOCKED);
        assert_eq!(flag_names(bits), vec!["dd", "lo"]);
    }
}
