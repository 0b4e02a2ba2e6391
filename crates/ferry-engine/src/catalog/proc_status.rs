//! Every line of /proc/PID/status and every field of /proc/PID/stat
//! (kernel 6.18, fs/proc/array.c and the task_mem, cpuset, seccomp and
//! speculation parts it calls). A status line whose name is not in the
//! table, or a stat line with more fields than the table, is refused by
//! name until ferry learns it.

use super::{not_applicable, refused, restored, Handling, Table};

pub static STATUS: Table = Table {
    id: "proc_status",
    column: "field",
    intro: "Every line of /proc/PID/status (kernel 6.18), read for every thread at checkpoint. \
        A line whose name is not in this table is refused by name; \"refused when set\" lines \
        are refused when they differ from a fresh process's value.",
    entries: &[
        restored("Name", "per thread, `PR_SET_NAME`", "proc_names"),
        restored("Umask", "`umask`", "proc_umask"),
        restored(
            "State",
            "threads resume where they were (R/S/D), stopped (T) and zombie (Z) processes are \
             made again; traced by another tracer (t) fails the freeze; a main thread that \
             exited (pthread_exit) while others run is refused by name",
            "thread_nanosleep, tree_stopped, tree_zombie",
        ),
        restored("Tgid", "`clone3` with `set_tid`", "tids_kept"),
        not_applicable("Ngid", "NUMA balancing's preferred node, the scheduler's"),
        restored("Pid", "`clone3` with `set_tid`", "tids_kept"),
        restored("PPid", "forked from the same parent", "tree_basic"),
        refused("TracerPid", "another tracer: the freeze's PTRACE_SEIZE fails", "-"),
        restored("Uid", "`setresuid`, `setfsuid`", "proc_creds_caps, proc_fsuid"),
        restored("Gid", "`setresgid`, `setfsgid`", "proc_creds_caps, proc_fsuid"),
        not_applicable("FDSize", "the fd table grows on demand"),
        restored("Groups", "`setgroups`", "proc_creds_caps"),
        restored("NStgid", "PIDs as the tree's namespace saw them", "tids_kept"),
        restored("NSpid", "as NStgid", "tids_kept"),
        restored("NSpgid", "`setpgid`", "tree_pgrp_signal"),
        restored("NSsid", "`setsid`", "tree_pgrp_signal"),
        not_applicable("Kthread", "kernel threads are not checkpointed"),
        not_applicable("VmPeak", "statistics; the mappings are restored"),
        not_applicable("VmSize", "statistics; the mappings are restored"),
        restored("VmLck", "locked mappings locked again (VmFlags lo, lf)", "mem_mlock"),
        not_applicable("VmPin", "pinned by kernel users (io_uring, RDMA), whose fds are refused"),
        not_applicable("VmHWM", "statistics"),
        not_applicable("VmRSS", "statistics; the pages are restored"),
        not_applicable("RssAnon", "statistics"),
        not_applicable("RssFile", "statistics"),
        not_applicable("RssShmem", "statistics"),
        not_applicable("VmData", "statistics"),
        not_applicable("VmStk", "statistics"),
        not_applicable("VmExe", "statistics"),
        not_applicable("VmLib", "statistics"),
        not_applicable("VmPTE", "statistics"),
        not_applicable("VmSwap", "statistics; swapped pages are read and restored"),
        refused(
            "HugetlbPages",
            "hugetlb mappings are refused by name (VmFlags ht)",
            "refuses_a_hugetlb_memfd_by_name",
        ),
        not_applicable("CoreDumping", "transient: a dumping process is exiting"),
        restored("THP_enabled", "`PR_SET_THP_DISABLE`", "proc_prctl_misc"),
        refused("untag_mask", "refused when set: x86 LAM (ARCH_ENABLE_TAGGED_ADDR)", "-"),
        restored("Threads", "every thread under its TID", "threads_8_writers"),
        not_applicable("SigQ", "a count of the user's queued signals and its limit"),
        restored("SigPnd", "siginfo queued again", "sig_pending"),
        restored("ShdPnd", "siginfo queued again", "sig_pending"),
        restored("SigBlk", "per thread", "thread_sigmask"),
        restored("SigIgn", "`rt_sigaction` for all 64 signals", "sig_sigaction_flags"),
        restored("SigCgt", "`rt_sigaction` for all 64 signals", "sig_sigaction_flags"),
        restored("CapInh", "`capset` in every thread", "proc_creds_caps"),
        restored("CapPrm", "`capset` in every thread", "proc_creds_caps"),
        restored("CapEff", "`capset` in every thread", "proc_creds_caps"),
        restored("CapBnd", "bounding drops", "proc_creds_caps"),
        restored("CapAmb", "ambient raises", "tree_caps_ambient"),
        restored("NoNewPrivs", "`PR_SET_NO_NEW_PRIVS`", "proc_no_new_privs"),
        restored("Seccomp", "strict mode or every filter, per thread", "proc_seccomp_filter"),
        restored("Seccomp_filters", "every filter in order", "proc_seccomp_tsync"),
        refused(
            "Speculation_Store_Bypass",
            "refused when not ferry's own value (`PR_GET_SPECULATION_CTRL` per thread)",
            "-",
        ),
        refused(
            "SpeculationIndirectBranch",
            "refused when not ferry's own value (`PR_GET_SPECULATION_CTRL` per thread)",
            "-",
        ),
        restored("Cpus_allowed", "`sched_setaffinity` per thread", "proc_sched_affinity"),
        restored("Cpus_allowed_list", "as Cpus_allowed", "proc_sched_affinity"),
        restored(
            "Mems_allowed",
            "the cpuset cgroup's, whose membership is restored",
            "cgroup_membership_is_restored",
        ),
        restored("Mems_allowed_list", "as Mems_allowed", "cgroup_membership_is_restored"),
        not_applicable("voluntary_ctxt_switches", "statistics"),
        not_applicable("nonvoluntary_ctxt_switches", "statistics"),
        refused("x86_Thread_features", "refused when set: x86 shadow stack (ARCH_SHSTK_*)", "-"),
        refused(
            "x86_Thread_features_locked",
            "refused when set: locked x86 shadow stack features",
            "-",
        ),
    ],
};

/// A fresh process's value of the status lines refused when set.
const DEFAULTS: [(&str, &str); 3] = [
    ("untag_mask", "0xffffffffffffffff"),
    ("x86_Thread_features", ""),
    ("x86_Thread_features_locked", ""),
];

/// The first line of a status file that capture must refuse: (line,
/// why). Lines refused in other code (speculation, hugetlb, tracer) are
/// checked there.
pub fn status_refusal(text: &str) -> Option<(String, String)> {
    for line in text.lines() {
        let (key, value) = line.split_once(':').unwrap_or((line, ""));
        let value = value.trim();
        match STATUS.get(key) {
            None => {
                return Some((
                    key.to_string(),
                    format!("status line {key:?} ({value}) is not known to ferry; refused until ferry learns it"),
                ))
            }
            Some(e) if e.handling == Handling::Refused => {
                if let Some((_, default)) = DEFAULTS.iter().find(|(k, _)| *k == key) {
                    if value != *default {
                        return Some((key.to_string(), format!("{value}: {}", e.how)));
                    }
                }
            }
            Some(_) => {}
        }
    }
    None
}

/// /proc/PID/stat, by field number (proc(5)).
pub static STAT: Table = Table {
    id: "proc_stat",
    column: "field",
    intro: "Every field of /proc/PID/stat (kernel 6.18: 52). A stat line with more fields is \
        refused, naming the first field ferry does not know.",
    entries: &[
        restored("1 pid", "`clone3` with `set_tid`", "tids_kept"),
        restored("2 comm", "`PR_SET_NAME`", "proc_names"),
        restored("3 state", "see State in /proc/PID/status", "tree_stopped"),
        restored("4 ppid", "forked from the same parent", "tree_basic"),
        restored("5 pgrp", "`setpgid`", "tree_pgrp_signal, tree_pgid_later_sibling"),
        restored("6 session", "`setsid`", "tree_pgrp_signal"),
        restored("7 tty_nr", "a pty pair of the tree; other terminals refused", "tty_ctty"),
        restored("8 tpgid", "TIOCSPGRP", "tty_ctty"),
        not_applicable("9 flags", "kernel-internal"),
        not_applicable("10 minflt", "accounting"),
        not_applicable("11 cminflt", "accounting"),
        not_applicable("12 majflt", "accounting"),
        not_applicable("13 cmajflt", "accounting"),
        not_applicable("14 utime", "accounting"),
        not_applicable("15 stime", "accounting"),
        not_applicable("16 cutime", "accounting"),
        not_applicable("17 cstime", "accounting"),
        restored("18 priority", "per thread", "proc_sched_affinity"),
        restored("19 nice", "per thread", "proc_sched_affinity"),
        restored("20 num_threads", "every thread", "threads_8_writers"),
        not_applicable("21 itrealvalue", "always 0"),
        not_applicable("22 starttime", "a restored process is a new process"),
        not_applicable("23 vsize", "statistics"),
        not_applicable("24 rss", "statistics"),
        restored("25 rsslim", "RLIMIT_RSS with every limit", "proc_rlimits"),
        restored("26 startcode", "`PR_SET_MM_MAP`", "proc_cmdline_auxv"),
        restored("27 endcode", "`PR_SET_MM_MAP`", "proc_cmdline_auxv"),
        restored("28 startstack", "`PR_SET_MM_MAP`", "proc_cmdline_auxv"),
        restored("29 kstkesp", "registers", "regs_gp_spin"),
        restored("30 kstkeip", "registers", "regs_gp_spin"),
        restored("31 signal", "as SigPnd", "sig_pending"),
        restored("32 blocked", "as SigBlk", "thread_sigmask"),
        restored("33 sigignore", "as SigIgn", "sig_sigaction_flags"),
        restored("34 sigcatch", "as SigCgt", "sig_sigaction_flags"),
        restored("35 wchan", "the thread is back in the same syscall", "thread_epoll_wait"),
        not_applicable("36 nswap", "unused"),
        not_applicable("37 cnswap", "unused"),
        restored("38 exit_signal", "`clone3` `exit_signal`", "tree_exit_signal"),
        not_applicable("39 processor", "the scheduler's choice"),
        restored("40 rt_priority", "per thread", "proc_sched_affinity"),
        restored("41 policy", "per thread", "proc_sched_affinity"),
        not_applicable("42 delayacct_blkio_ticks", "accounting"),
        not_applicable("43 guest_time", "accounting"),
        not_applicable("44 cguest_time", "accounting"),
        restored("45 start_data", "`PR_SET_MM_MAP`", "mem_heap_brk"),
        restored("46 end_data", "`PR_SET_MM_MAP`", "mem_heap_brk"),
        restored("47 start_brk", "`PR_SET_MM_MAP`", "mem_heap_brk"),
        restored("48 arg_start", "`PR_SET_MM_MAP`", "proc_cmdline_auxv"),
        restored("49 arg_end", "`PR_SET_MM_MAP`", "proc_cmdline_auxv"),
        restored("50 env_start", "`PR_SET_MM_MAP`", "proc_cmdline_auxv"),
        restored("51 env_end", "`PR_SET_MM_MAP`", "proc_cmdline_auxv"),
        restored("52 exit_code", "for zombies; refused with the core-dump bit", "tree_zombie"),
    ],
};

/// The first /proc/PID/stat field ferry does not know, for a stat line
/// of `count` fields.
pub fn stat_refusal(count: usize) -> Option<String> {
    (count > STAT.entries.len()).then(|| {
        format!(
            "/proc/PID/stat has {count} fields; field {} is not known to ferry, refused until ferry learns it",
            STAT.entries.len() + 1
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_usual_status_passes_and_unknown_or_set_lines_are_named() {
        let usual = "Name:\tcat\nUmask:\t0022\nState:\tR (running)\nuntag_mask:\t0xffffffffffffffff\nSigQ:\t0/31503\n";
        assert!(status_refusal(usual).is_none());
        let (k, why) = status_refusal("Name:\tx\nNewThing:\t7\n").expect("unknown");
        assert_eq!(k, "NewThing");
        assert!(why.contains("not known"), "{why}");
        let (k, _) = status_refusal("untag_mask:\t0xff00ffffffffffff\n").expect("set");
        assert_eq!(k, "untag_mask");
        assert_eq!(
            status_refusal("x86_Thread_features:\tshstk\n").map(|r| r.0).as_deref(),
            Some("x86_Thread_features")
        );
    }

    #[test]
    fn this_kernels_status_and_stat_are_known() {
        let text = std::fs::read_to_string("/proc/self/status").expect("status");
        assert_eq!(status_refusal(&text), None);
        let stat = std::fs::read_to_string("/proc/self/stat").expect("stat");
        let count = stat.rsplit_once(')').map_or(0, |(_, r)| r.split_whitespace().count() + 2);
        assert_eq!(count, STAT.entries.len());
        assert!(stat_refusal(count).is_none() && stat_refusal(count + 1).is_some());
    }
}
