//! Every mnemonic /proc/PID/smaps can print in a mapping's VmFlags line
//! (kernel 6.18, fs/proc/task_mmu.c, show_smap_vma_flags), in the order
//! it prints them. The kernel prints `??` for a bit it has no name for;
//! that, like any name missing here, is refused by name.

use super::{not_applicable, refused, restored, Table};

pub static VMFLAGS: Table = Table {
    id: "vmflags",
    column: "VmFlags",
    intro: "Every mnemonic of a mapping's VmFlags line in /proc/PID/smaps (kernel 6.18). \
        Capture refuses a mapping that shows a refused mnemonic, or one not in this table \
        (a flag added by a newer kernel, or `??`, the kernel's name for a bit it cannot name), \
        naming the mapping's address and the mnemonic. The kernel's own mappings ([vdso], \
        [vvar], [vsyscall]) are exempt: restore maps the running kernel's. A mapping with a \
        protection key other than 0 (smaps `ProtectionKey`, on CPUs with PKU) is refused as \
        `ProtectionKey`.",
    entries: &[
        restored("rd", "PROT_READ, mmap and mprotect", "mem_mprotect"),
        restored("wr", "PROT_WRITE, mmap and mprotect", "mem_mprotect"),
        restored("ex", "PROT_EXEC, mmap and mprotect", "mem_mprotect"),
        restored("sh", "MAP_SHARED", "mem_anon_shared, mem_file_shared"),
        not_applicable("mr", "may-read: follows from the file's open mode, the same at restore"),
        restored(
            "mw",
            "may-write of a shared file mapping: its file is opened for writing at restore",
            "mem_memfd_sealed_write",
        ),
        not_applicable("me", "may-exec: follows from the file's mount, the same at restore"),
        restored("ms", "MAP_SHARED (also of a file opened read-only)", "mem_file_shared"),
        restored("gd", "MAP_GROWSDOWN", "mem_stack_deep"),
        refused("pf", "a raw page-frame mapping of a device (VM_PFNMAP)", "-"),
        refused(
            "gu",
            "may hold guard pages (MADV_GUARD_INSTALL): refused when PAGEMAP_SCAN finds one \
             (the kernel never clears gu, so gu alone is not refused)",
            "refuses_guard_pages_by_name",
        ),
        restored("lo", "mlock again once the pages are in", "mem_mlock"),
        refused("io", "memory-mapped I/O of a device (VM_IO)", "-"),
        restored("sr", "MADV_SEQUENTIAL", "mem_madvise_flags"),
        restored("rr", "MADV_RANDOM", "mem_madvise_flags"),
        restored("dc", "MADV_DONTFORK", "mem_madvise_flags"),
        refused(
            "de",
            "VM_DONTEXPAND: a mapping of a driver or special object (AIO ring, perf buffer, \
             io_uring ring) that ferry does not make again",
            "refuses_an_aio_ring_by_name",
        ),
        restored(
            "lf",
            "mlock2(MLOCK_ONFAULT): only the pages that were resident are locked, the rest \
             stays unfaulted (it used to come back locked and fully faulted in)",
            "mem_mlock_onfault",
        ),
        not_applicable("ac", "charged to overcommit accounting; follows from the mapping kind"),
        restored("nr", "MAP_NORESERVE", "mem_1g_sparse"),
        refused(
            "ht",
            "hugetlb memory (MAP_HUGETLB, an MFD_HUGETLB memfd, a SHM_HUGETLB segment, \
             hugetlbfs): named before its kind of backing",
            "refuses_a_hugetlb_memfd_by_name",
        ),
        refused("sf", "MAP_SYNC of a file on a DAX device", "-"),
        refused("ar", "VM_ARCH_1 (x86: a PAT-reserved device range)", "-"),
        restored("wf", "MADV_WIPEONFORK", "mem_madvise_flags"),
        restored("dd", "MADV_DONTDUMP", "mem_madvise_flags"),
        refused("bt", "arm64 branch target pages (PROT_BTI); ferry runs on x86_64", "-"),
        not_applicable("sd", "soft-dirty tracking mark; a restored mapping is new"),
        refused("mm", "a mixed page/page-frame mapping of a driver (VM_MIXEDMAP)", "-"),
        restored("hg", "MADV_HUGEPAGE", "mem_madvise_flags"),
        restored("nh", "MADV_NOHUGEPAGE", "mem_madvise_flags"),
        restored("mg", "MADV_MERGEABLE", "mem_madvise_flags"),
        refused("um", "registered with a userfaultfd for missing pages", "-"),
        not_applicable(
            "uw",
            "userfaultfd write protection: ferry's own pre-copy tracker registers it while it \
             copies; a userfaultfd the process holds is refused in its fd table",
        ),
        refused("mt", "arm64 memory tagging (PROT_MTE); ferry runs on x86_64", "-"),
        refused("ui", "registered with a userfaultfd for minor faults", "-"),
        refused("ss", "an x86 shadow stack", "-"),
        refused("dp", "MAP_DROPPABLE memory (vgetrandom state), not made again", "-"),
        refused("sl", "sealed with mseal(), not sealed again", "-"),
        refused("ProtectionKey", "a protection key other than 0 (pkey_mprotect)", "-"),
    ],
};

/// The mappings whose VmFlags are the kernel's business, not the
/// process's: restore maps the running kernel's.
pub fn is_kernel_mapping(path: &str) -> bool {
    matches!(path, "[vdso]" | "[vvar]" | "[vvar_vclock]" | "[vsyscall]" | "[uprobes]")
}

/// Refused flags whose refusal depends on more than the flag, checked by
/// their own code: `gu` by `capture::memory::check_guard_regions`.
const CHECKED_APART: [&str; 1] = ["gu"];

/// The first mnemonic of `flags` that capture must refuse: (mnemonic,
/// why). Pure, so the rule is tested without a process.
pub fn refusal(flags: &[String]) -> Option<(&str, &'static str)> {
    flags.iter().filter(|f| !CHECKED_APART.contains(&f.as_str())).find_map(|f| {
        match VMFLAGS.get(f) {
            None => Some((f.as_str(), "not known to ferry; refused until ferry learns it")),
            Some(e) if e.handling == super::Handling::Refused => Some((f.as_str(), e.how)),
            Some(_) => None,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &[&str]) -> Vec<String> {
        s.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn known_restored_flags_pass_and_others_are_named() {
        assert!(refusal(&v(&["rd", "wr", "mr", "mw", "me", "ac", "lo", "lf", "sd"])).is_none());
        assert_eq!(refusal(&v(&["rd", "ht"])).map(|r| r.0), Some("ht"));
        let zz = v(&["rd", "zz"]);
        let (name, why) = refusal(&zz).expect("unknown refused");
        assert_eq!(name, "zz");
        assert!(why.contains("not known"));
        assert_eq!(refusal(&v(&["??"])).map(|r| r.0), Some("??"));
        assert!(refusal(&v(&["rd", "gu"])).is_none(), "gu is checked apart");
    }

    #[test]
    fn every_mnemonic_is_listed_once() {
        let mut seen = std::collections::HashSet::new();
        for e in VMFLAGS.entries {
            assert!(seen.insert(e.name), "{} listed twice", e.name);
        }
    }
}
