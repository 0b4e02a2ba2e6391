//! Every prctl getter of kernel 6.18 (include/uapi/linux/prctl.h) and the
//! arch_prctl getters of x86_64, with what a checkpoint does with the
//! value it reads. The reads are in `capture/prctl.rs`,
//! `capture/process.rs` and `capture/threads.rs`; a value other than a
//! fresh process's (or ferry's own, which a restored process inherits)
//! is refused, naming the getter as listed here.

use super::{not_applicable, refused, restored, Table};

pub static PRCTL: Table = Table {
    id: "prctl",
    column: "getter",
    intro: "Every prctl getter of kernel 6.18 and the arch_prctl getters of x86_64, read for \
        every thread in the freeze. \"refused when set\" getters are refused, naming the getter, \
        when their value differs from a fresh process's (or ferry's own, which a restored \
        process inherits). Not detected, so not in this table: PR_FUTEX_HASH (a size the \
        process set cannot be told from the one the kernel chose) and ARCH_GET_XCOMP_PERM \
        (this CPU kind has no AMX).",
    entries: &[
        restored("PR_GET_PDEATHSIG", "per thread, after the credentials", "tree_pdeathsig"),
        restored(
            "PR_GET_DUMPABLE",
            "after the credentials (an id change resets it)",
            "proc_prctl_misc, proc_dumpable_setuid",
        ),
        not_applicable("PR_GET_UNALIGN", "ia64, parisc, powerpc, alpha, sh only"),
        restored("PR_GET_KEEPCAPS", "`PR_SET_SECUREBITS` in the credential sequence", "proc_fsuid"),
        not_applicable("PR_GET_FPEMU", "ia64 only"),
        not_applicable("PR_GET_FPEXC", "powerpc only"),
        not_applicable("PR_GET_TIMING", "always statistical"),
        restored("PR_GET_NAME", "`PR_SET_NAME` per thread", "proc_names"),
        not_applicable("PR_GET_ENDIAN", "powerpc only"),
        restored("PR_GET_SECCOMP", "strict mode or every filter", "proc_seccomp_filter"),
        restored("PR_CAPBSET_READ", "bounding set drops", "proc_creds_caps"),
        refused(
            "PR_GET_TSC",
            "refused unless PR_TSC_ENABLE (seccomp strict mode sets it and is restored)",
            "refuses_a_faulting_time_stamp_counter",
        ),
        restored(
            "PR_GET_SECUREBITS",
            "`PR_SET_SECUREBITS` (also to none when ferry runs with some)",
            "proc_fsuid, proc_securebits_none",
        ),
        restored("PR_GET_TIMERSLACK", "per thread", "proc_prctl_misc"),
        not_applicable(
            "PR_TASK_PERF_EVENTS_DISABLE",
            "no state of the task itself; perf fds are refused",
        ),
        refused("PR_MCE_KILL_GET", "refused unless PR_MCE_KILL_DEFAULT", "-"),
        restored("PR_GET_CHILD_SUBREAPER", "`PR_SET_CHILD_SUBREAPER`", "proc_prctl_misc"),
        restored("PR_GET_NO_NEW_PRIVS", "`PR_SET_NO_NEW_PRIVS`", "proc_no_new_privs"),
        restored("PR_GET_TID_ADDRESS", "`set_tid_address` per thread", "thread_exit_join"),
        restored("PR_GET_THP_DISABLE", "`PR_SET_THP_DISABLE`", "proc_prctl_misc"),
        not_applicable("PR_GET_FP_MODE", "mips only"),
        restored("PR_CAP_AMBIENT_IS_SET", "ambient raises", "tree_caps_ambient"),
        not_applicable("PR_SVE_GET_VL", "arm64 only"),
        refused(
            "PR_GET_SPECULATION_CTRL",
            "refused unless ferry's own value (not for threads under seccomp, where the kernel \
             sets it and sets it again when the filters are reinstalled)",
            "-",
        ),
        not_applicable("PR_GET_TAGGED_ADDR_CTRL", "arm64 and riscv only"),
        refused("PR_GET_IO_FLUSHER", "refused when set", "-"),
        refused(
            "PR_SET_SYSCALL_USER_DISPATCH",
            "refused when on (`PTRACE_GET_SYSCALL_USER_DISPATCH_CONFIG`)",
            "-",
        ),
        not_applicable("PR_PAC_GET_ENABLED_KEYS", "arm64 only"),
        refused("PR_SCHED_CORE_GET", "refused when the thread has a core-scheduling cookie", "-"),
        not_applicable("PR_SME_GET_VL", "arm64 only"),
        refused("PR_GET_MDWE", "refused when set", "-"),
        refused("PR_GET_MEMORY_MERGE", "refused when set", "-"),
        not_applicable("PR_RISCV_V_GET_CONTROL", "riscv only"),
        not_applicable("PR_PPC_GET_DEXCR", "powerpc only"),
        not_applicable("PR_GET_SHADOW_STACK_STATUS", "arm64 (GCS) only; see ARCH_SHSTK_STATUS"),
        refused(
            "PR_TIMER_CREATE_RESTORE_IDS_GET",
            "refused when on (timer_create takes the id it is given, a restorer's mode)",
            "-",
        ),
        restored("PR_GET_AUXV", "`PR_SET_MM_MAP`", "proc_cmdline_auxv"),
        restored("ARCH_GET_FS", "registers", "fsbase_tls"),
        restored("ARCH_GET_GS", "registers", "fsbase_tls"),
        refused("ARCH_GET_CPUID", "refused when cpuid faults", "-"),
        not_applicable("ARCH_GET_UNTAG_MASK", "see untag_mask in /proc/PID/status"),
        not_applicable("ARCH_GET_MAX_TAG_BITS", "a property of the CPU"),
        refused("ARCH_SHSTK_STATUS", "refused when enabled", "-"),
        refused("get_mempolicy", "NUMA memory policy per thread: refused unless MPOL_DEFAULT", "-"),
    ],
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_getters_capture_reads_are_listed() {
        for name in [
            "PR_GET_PDEATHSIG",
            "PR_GET_SECUREBITS",
            "PR_GET_TSC",
            "PR_MCE_KILL_GET",
            "PR_GET_SPECULATION_CTRL",
            "PR_GET_IO_FLUSHER",
            "PR_GET_MDWE",
            "PR_GET_MEMORY_MERGE",
            "PR_TIMER_CREATE_RESTORE_IDS_GET",
            "ARCH_GET_CPUID",
            "ARCH_SHSTK_STATUS",
            "PR_SCHED_CORE_GET",
        ] {
            assert!(PRCTL.get(name).is_some(), "{name}");
        }
    }
}
