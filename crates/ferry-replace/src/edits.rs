//! The options of `ferry replace` as edits of the captured image: the new
//! tree is restored from the edited image and the restore's check
//! compares it with that image, so it is verified to be exactly the old
//! tree plus these edits.
//!
//! Pure logic: parsing the option values and changing a `TreeImage`. What
//! needs the host (a cgroup directory, a filter the kernel loads) is in
//! `options.rs`.

use ferry_image::{
    CgroupImage, CgroupMembership, ProcessCgroups, Rlimit, SeccompFilter, TreeImage,
};

/// Every edit asked for, each checked already.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Edits {
    /// The cgroup v2 path (from the hierarchy's root) every process goes to.
    pub cgroup: Option<String>,
    /// Limits set in every process, replacing the captured ones.
    pub rlimits: Vec<Rlimit>,
    /// Capabilities (bit n: capability n) removed from every set.
    pub drop_caps: u64,
    /// A filter stacked on every thread's own, as the newest.
    pub seccomp: Option<SeccompFilter>,
    /// The nice value of every thread.
    pub nice: Option<i32>,
    /// The CPUs every thread may run on (sorted, each once).
    pub cpus: Option<Vec<u32>>,
    /// A new UTS namespace for the tree with this hostname.
    pub hostname: Option<String>,
    /// The domainname the new namespace gets when the tree was in ferry's
    /// (ferry's own); a tree in a namespace of its own keeps its own.
    pub domainname_here: String,
}

/// The resource names `--rlimit` takes, by RLIMIT_* number.
const RLIMITS: [&str; 16] = [
    "cpu",
    "fsize",
    "data",
    "stack",
    "core",
    "rss",
    "nproc",
    "nofile",
    "memlock",
    "as",
    "locks",
    "sigpending",
    "msgqueue",
    "nice",
    "rtprio",
    "rttime",
];

/// The capability names `--drop-caps` takes, by number (CAP_CHOWN = 0).
const CAPS: [&str; 41] = [
    "chown",
    "dac_override",
    "dac_read_search",
    "fowner",
    "fsetid",
    "kill",
    "setgid",
    "setuid",
    "setpcap",
    "linux_immutable",
    "net_bind_service",
    "net_broadcast",
    "net_admin",
    "net_raw",
    "ipc_lock",
    "ipc_owner",
    "sys_module",
    "sys_rawio",
    "sys_chroot",
    "sys_ptrace",
    "sys_pacct",
    "sys_admin",
    "sys_boot",
    "sys_nice",
    "sys_resource",
    "sys_time",
    "sys_tty_config",
    "mknod",
    "lease",
    "audit_write",
    "audit_control",
    "setfcap",
    "mac_override",
    "mac_admin",
    "syslog",
    "wake_alarm",
    "block_suspend",
    "audit_read",
    "perfmon",
    "bpf",
    "checkpoint_restore",
];

/// The most instructions a classic BPF program may have (BPF_MAXINSNS).
pub const MAX_FILTER_INSNS: usize = 4096;

const RLIM_INFINITY: u64 = u64::MAX;

/// `NAME=SOFT:HARD`, each limit a number or `unlimited`, soft ≤ hard.
pub fn parse_rlimit(arg: &str) -> Result<Rlimit, String> {
    let bad = |why: &str| format!("--rlimit {arg}: {why}");
    let (name, values) = arg.split_once('=').ok_or_else(|| bad("expected NAME=SOFT:HARD"))?;
    let lower = name.trim().to_ascii_lowercase();
    let lower = lower.strip_prefix("rlimit_").unwrap_or(&lower);
    let resource = RLIMITS.iter().position(|n| *n == lower).ok_or_else(|| {
        bad(&format!("unknown resource {name:?} (known: {})", RLIMITS.join(", ")))
    })?;
    let (soft, hard) = values.split_once(':').ok_or_else(|| bad("expected NAME=SOFT:HARD"))?;
    let limit = |v: &str| -> Result<u64, String> {
        match v.trim() {
            "unlimited" | "infinity" => Ok(RLIM_INFINITY),
            n => n.parse::<u64>().map_err(|_| bad(&format!("{v:?} is not a number or unlimited"))),
        }
    };
    let (soft, hard) = (limit(soft)?, limit(hard)?);
    if soft > hard {
        return Err(bad("the soft limit is above the hard limit"));
    }
    Ok(Rlimit { resource: resource as u32, soft, hard })
}

/// The name `--rlimit` uses for resource `n`.
pub fn rlimit_name(n: u32) -> &'static str {
    RLIMITS.get(n as usize).copied().unwrap_or("unknown")
}

/// `CAP[,CAP...]` (with or without `cap_`, any case) or `all`: the mask.
pub fn parse_caps(arg: &str) -> Result<u64, String> {
    let mut mask = 0u64;
    for name in arg.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let lower = name.to_ascii_lowercase();
        if lower == "all" {
            return Ok(u64::MAX);
        }
        let bare = lower.strip_prefix("cap_").unwrap_or(&lower);
        let n = CAPS
            .iter()
            .position(|c| *c == bare)
            .ok_or_else(|| format!("--drop-caps: unknown capability {name:?}"))?;
        mask |= 1 << n;
    }
    if mask == 0 {
        return Err("--drop-caps: no capability named".into());
    }
    Ok(mask)
}

/// A filter file's bytes: an array of `struct sock_filter` (8 bytes each:
/// code u16, jt u8, jf u8, k u32, in this machine's byte order), packed
/// as the image keeps filters.
pub fn parse_filter(path: &str, bytes: &[u8]) -> Result<Vec<u64>, String> {
    let bad = |why: String| format!("--seccomp {path}: {why}");
    if bytes.is_empty() {
        return Err(bad("the file is empty".into()));
    }
    if !bytes.len().is_multiple_of(8) {
        return Err(bad(format!(
            "{} bytes is not a whole number of 8-byte struct sock_filter",
            bytes.len()
        )));
    }
    let n = bytes.len() / 8;
    if n > MAX_FILTER_INSNS {
        return Err(bad(format!("{n} instructions, the kernel takes at most {MAX_FILTER_INSNS}")));
    }
    let insns: Vec<u64> = bytes
        .chunks_exact(8)
        .map(|c| u64::from_ne_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
        .collect();
    // A listener to hand syscalls to cannot be given with the filter, and
    // the next capture would refuse the filter for it.
    let (user_notif, full) =
        (ferry_sys::seccomp::SECCOMP_RET_USER_NOTIF, ferry_sys::seccomp::SECCOMP_RET_ACTION_FULL);
    if let Some(i) = insns.iter().position(|&i| {
        let (code, k) = ferry_sys::seccomp::insn_code_k(i);
        code == 0x06 && k & full == user_notif
    }) {
        return Err(bad(format!(
            "instruction {i} returns SECCOMP_RET_USER_NOTIF, which needs a listener ferry cannot give"
        )));
    }
    Ok(insns)
}

/// The nice values setpriority(2) takes.
pub const NICE_RANGE: std::ops::RangeInclusive<i32> = -20..=19;

/// A CPU number above any kernel's (CONFIG_NR_CPUS is at most 8192).
pub const MAX_CPU: u32 = 8191;

/// `N`, a nice value from -20 to 19.
pub fn parse_nice(arg: &str) -> Result<i32, String> {
    let n: i32 = arg
        .trim()
        .parse()
        .map_err(|_| format!("--nice {arg}: not a number (a nice value is -20 to 19)"))?;
    if !NICE_RANGE.contains(&n) {
        return Err(format!("--nice {arg}: a nice value is -20 to 19"));
    }
    Ok(n)
}

/// `NAME`, a hostname the kernel takes: 1 to 64 bytes, no NUL.
pub fn parse_hostname(arg: &str) -> Result<String, String> {
    if arg.is_empty() {
        return Err("--hostname: the name is empty".into());
    }
    if arg.len() > ferry_image::validate::MAX_UTS_NAME {
        return Err(format!(
            "--hostname {arg}: {} bytes, a hostname has at most {}",
            arg.len(),
            ferry_image::validate::MAX_UTS_NAME
        ));
    }
    if arg.contains('\0') {
        return Err("--hostname: the name holds a NUL byte".into());
    }
    Ok(arg.to_string())
}

/// A cpulist as the kernel writes them (`0`, `0-3`, `0,2-3`): the CPUs,
/// sorted, each once. Empty items, reversed ranges and CPUs above
/// [`MAX_CPU`] are refused.
pub fn parse_cpulist(arg: &str) -> Result<Vec<u32>, String> {
    let bad = |why: String| format!("--cpus {arg}: {why}");
    let cpu = |v: &str| -> Result<u32, String> {
        let n: u32 = v.trim().parse().map_err(|_| bad(format!("{v:?} is not a CPU number")))?;
        if n > MAX_CPU {
            return Err(bad(format!("CPU {n} is above any kernel's ({MAX_CPU} at most)")));
        }
        Ok(n)
    };
    let mut out = Vec::new();
    for item in arg.split(',') {
        if item.trim().is_empty() {
            return Err(bad("an empty item (expected a list such as 0,2-3)".into()));
        }
        match item.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (cpu(a)?, cpu(b)?);
                if a > b {
                    return Err(bad(format!("the range {a}-{b} runs backwards")));
                }
                out.extend(a..=b);
            }
            None => out.push(cpu(item)?),
        }
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// CPUs as a cpulist (`0-2,5`), the way the kernel writes them.
pub fn format_cpulist(cpus: &[u32]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        parts.push(match j > i {
            true => format!("{}-{}", cpus[i], cpus[j]),
            false => cpus[i].to_string(),
        });
        i = j + 1;
    }
    parts.join(",")
}

/// The CPUs set in an affinity mask (bit n of word w: CPU 64 * w + n).
pub fn mask_cpus(mask: &[u64]) -> Vec<u32> {
    let mut out = Vec::new();
    for (w, word) in mask.iter().enumerate() {
        for bit in 0..64 {
            if word & (1 << bit) != 0 {
                out.push(w as u32 * 64 + bit);
            }
        }
    }
    out
}

/// Refuses a `--cpus` list naming a CPU that is not `present` (does not
/// exist), not `online`, or outside `allowed` (ferry's own affinity, which
/// its cgroup's cpuset bounds): the restore's sched_setaffinity would fail
/// or narrow the mask, silently in the second case.
pub fn check_cpus(
    arg: &str,
    cpus: &[u32],
    present: &[u32],
    online: &[u32],
    allowed: &[u32],
) -> Result<(), String> {
    for c in cpus {
        let why = if !present.contains(c) {
            format!("CPU {c} does not exist (this machine has {})", format_cpulist(present))
        } else if !online.contains(c) {
            format!("CPU {c} is offline (online: {})", format_cpulist(online))
        } else if !allowed.contains(c) {
            format!(
                "CPU {c} is outside the CPUs ferry may use ({}: its affinity and cgroup cpuset)",
                format_cpulist(allowed)
            )
        } else {
            continue;
        };
        return Err(format!("--cpus {arg}: {why}"));
    }
    Ok(())
}

/// The policy bits of sched_getscheduler's answer (SCHED_RESET_ON_FORK
/// masked off).
fn policy_of(sched: &ferry_image::Sched) -> i32 {
    sched.policy & !libc::SCHED_RESET_ON_FORK
}

/// A policy's name, for a refusal.
fn policy_name(policy: i32) -> String {
    match policy {
        libc::SCHED_FIFO => "SCHED_FIFO".into(),
        libc::SCHED_RR => "SCHED_RR".into(),
        libc::SCHED_IDLE => "SCHED_IDLE".into(),
        6 => "SCHED_DEADLINE".into(),
        n => format!("policy {n}"),
    }
}

impl Edits {
    /// Whether nothing is changed: a plain replacement.
    pub fn is_empty(&self) -> bool {
        *self == Edits::default()
    }

    /// Applies every edit to `tree`. An error names the process and thread
    /// an edit cannot apply to; `tree` is then partly edited and must not
    /// be used.
    pub fn apply(&self, tree: &mut TreeImage) -> Result<(), String> {
        if let Some(path) = &self.cgroup {
            move_to_cgroup(tree, path);
        }
        if let Some(hostname) = &self.hostname {
            let domainname = match &tree.uts {
                Some(u) => u.domainname.clone(),
                None => self.domainname_here.clone(),
            };
            tree.uts = Some(ferry_image::UtsImage { hostname: hostname.clone(), domainname });
        }
        for p in &mut tree.processes {
            for want in &self.rlimits {
                match p.rlimits.iter_mut().find(|r| r.resource == want.resource) {
                    Some(r) => *r = *want,
                    None => p.rlimits.push(*want),
                }
            }
            let c = &mut p.creds.caps;
            for set in [
                &mut c.permitted,
                &mut c.effective,
                &mut c.inheritable,
                &mut c.ambient,
                &mut c.bounding,
            ] {
                *set &= !self.drop_caps;
            }
            if let Some(filter) = &self.seccomp {
                stack_filter(p, filter)?;
            }
            if let Some(n) = self.nice {
                set_nice(p, n)?;
            }
            if let Some(cpus) = &self.cpus {
                set_cpus(p, cpus)?;
            }
        }
        Ok(())
    }
}

/// Every thread's nice value becomes `n`. A thread under a policy that
/// ignores nice (SCHED_FIFO, SCHED_RR, SCHED_DEADLINE, SCHED_IDLE) is
/// refused: the kernel would keep the value but schedule the thread as
/// before, so the option would not do what it says.
fn set_nice(p: &mut ferry_image::ProcessImage, n: i32) -> Result<(), String> {
    for t in &mut p.threads {
        let policy = policy_of(&t.sched);
        if policy != libc::SCHED_OTHER && policy != libc::SCHED_BATCH {
            return Err(format!(
                "--nice {n}: pid {} thread {} runs under {}, which ignores nice",
                p.pid,
                t.tid,
                policy_name(policy)
            ));
        }
        t.sched.nice = n;
    }
    Ok(())
}

/// Every thread's CPU mask becomes `cpus`, in a mask as long as the one
/// the kernel gave at capture (the restore's check reads one as long).
fn set_cpus(p: &mut ferry_image::ProcessImage, cpus: &[u32]) -> Result<(), String> {
    for t in &mut p.threads {
        let words = t.sched.cpus.len();
        let mut mask = vec![0u64; words];
        for &c in cpus {
            let word = mask.get_mut(c as usize / 64).ok_or_else(|| {
                format!(
                    "--cpus: pid {} thread {}: CPU {c} is beyond the {} CPUs of its affinity mask",
                    p.pid,
                    t.tid,
                    words * 64
                )
            })?;
            *word |= 1 << (c % 64);
        }
        t.sched.cpus = mask;
    }
    Ok(())
}

/// Every process's cgroup v2 membership becomes `path`; v1 memberships
/// stay. An image without the section gets one.
fn move_to_cgroup(tree: &mut TreeImage, path: &str) {
    let section = tree.cgroups.get_or_insert_with(CgroupImage::default);
    for p in &tree.processes {
        if !section.processes.iter().any(|c| c.pid == p.pid) {
            section.processes.push(ProcessCgroups { pid: p.pid, memberships: Vec::new() });
        }
    }
    let v2 = CgroupMembership { hierarchy: 0, controllers: String::new(), path: path.to_string() };
    for c in &mut section.processes {
        match c.memberships.iter_mut().find(|m| m.hierarchy == 0 && m.controllers.is_empty()) {
            Some(m) => m.path = path.to_string(),
            None => c.memberships.push(v2.clone()),
        }
    }
}

/// `filter` added to the process's filters once and to every thread's
/// chain as its newest; every thread is in filter mode then.
fn stack_filter(p: &mut ferry_image::ProcessImage, filter: &SeccompFilter) -> Result<(), String> {
    let f = &mut p.fidelity;
    if f.threads.len() != p.threads.len() {
        return Err(format!(
            "pid {}: the image lists the seccomp state of {} of its {} threads",
            p.pid,
            f.threads.len(),
            p.threads.len()
        ));
    }
    if let Some(t) = f.threads.iter().find(|t| t.seccomp_mode == 1) {
        return Err(format!(
            "pid {} thread {}: it is in seccomp strict mode, which takes no filter",
            p.pid, t.tid
        ));
    }
    let idx = f.seccomp_filters.len() as u32;
    f.seccomp_filters.push(filter.clone());
    for t in &mut f.threads {
        t.seccomp_mode = 2;
        t.seccomp.push(idx);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_image::{Caps, Creds, ProcessImage, ThreadFidelity, ThreadImage};

    fn thread(tid: i32) -> ThreadImage {
        ThreadImage {
            tid,
            comm: "t".into(),
            regs: vec![],
            xstate: vec![],
            sigmask: 0,
            pending: vec![],
            altstack: Default::default(),
            rseq: None,
            robust_list: Default::default(),
            clear_child_tid: 0,
            timer_slack_ns: 0,
            sched: Default::default(),
            sleep_remaining_ns: None,
        }
    }

    fn process(pid: i32, tids: &[i32]) -> ProcessImage {
        let mut p = ProcessImage { pid, ..Default::default() };
        p.threads = tids.iter().map(|&t| thread(t)).collect();
        p.fidelity.threads =
            tids.iter().map(|&tid| ThreadFidelity { tid, ..Default::default() }).collect();
        p.rlimits = vec![Rlimit { resource: 7, soft: 1024, hard: 4096 }];
        p.creds = Creds {
            caps: Caps { permitted: !0, effective: !0, inheritable: 0, bounding: !0, ambient: 0 },
            ..Default::default()
        };
        p
    }

    #[test]
    fn rlimits_parse_with_unlimited_and_refuse_by_name() {
        assert_eq!(
            parse_rlimit("nofile=1024:4096"),
            Ok(Rlimit { resource: 7, soft: 1024, hard: 4096 })
        );
        assert_eq!(
            parse_rlimit("CORE=0:unlimited"),
            Ok(Rlimit { resource: 4, soft: 0, hard: u64::MAX })
        );
        assert_eq!(parse_rlimit("rlimit_as=1:2").map(|r| r.resource), Ok(9));
        let e = parse_rlimit("nofile=4096:1024").expect_err("soft above hard");
        assert!(e.contains("--rlimit nofile=4096:1024") && e.contains("above the hard"), "{e}");
        let e = parse_rlimit("files=1:2").expect_err("unknown");
        assert!(e.contains("unknown resource \"files\""), "{e}");
        assert!(parse_rlimit("nofile=12").is_err());
        assert!(parse_rlimit("nofile").is_err());
        assert!(parse_rlimit("nofile=x:1").expect_err("nan").contains("\"x\""));
        assert_eq!(rlimit_name(6), "nproc");
    }

    #[test]
    fn caps_parse_by_name_or_all() {
        assert_eq!(parse_caps("net_raw"), Ok(1 << 13));
        assert_eq!(parse_caps("CAP_SYS_ADMIN, net_raw"), Ok((1 << 21) | (1 << 13)));
        assert_eq!(parse_caps("checkpoint_restore"), Ok(1 << 40));
        assert_eq!(parse_caps("all"), Ok(u64::MAX));
        assert!(parse_caps("net_rw").expect_err("unknown").contains("\"net_rw\""));
        assert!(parse_caps(",").is_err());
    }

    #[test]
    fn filters_are_whole_instructions_within_the_kernel_limit() {
        let ret_allow: [u8; 8] = [6, 0, 0, 0, 0, 0, 0xff, 0x7f];
        assert_eq!(parse_filter("f", &ret_allow), Ok(vec![0x7fff_0000_0000_0006]));
        assert!(parse_filter("f", &[])
            .expect_err("empty")
            .contains("--seccomp f: the file is empty"));
        assert!(parse_filter("f", &ret_allow[..7]).expect_err("short").contains("7 bytes"));
        let big = ret_allow.repeat(MAX_FILTER_INSNS + 1);
        assert!(parse_filter("f", &big).expect_err("long").contains("at most 4096"));
        let notif: [u8; 8] = [6, 0, 0, 0, 0, 0, 0xc0, 0x7f];
        assert!(parse_filter("f", &notif).expect_err("notif").contains("USER_NOTIF"));
    }

    #[test]
    fn every_process_gets_the_limits_and_loses_the_caps() {
        let mut tree = TreeImage {
            processes: vec![process(10, &[10, 11]), process(12, &[12])],
            ..Default::default()
        };
        let edits = Edits {
            rlimits: vec![
                Rlimit { resource: 7, soft: 10, hard: 20 },
                Rlimit { resource: 4, soft: 0, hard: 0 },
            ],
            drop_caps: (1 << 13) | (1 << 21),
            ..Default::default()
        };
        edits.apply(&mut tree).expect("applies");
        for p in &tree.processes {
            assert_eq!(
                p.rlimits,
                vec![
                    Rlimit { resource: 7, soft: 10, hard: 20 },
                    Rlimit { resource: 4, soft: 0, hard: 0 }
                ]
            );
            let c = p.creds.caps;
            for set in [c.permitted, c.effective, c.bounding] {
                assert_eq!(set, !((1u64 << 13) | (1 << 21)));
            }
            assert_eq!((c.inheritable, c.ambient), (0, 0));
        }
    }

    #[test]
    fn a_filter_is_stacked_as_every_threads_newest() {
        let mut tree = TreeImage { processes: vec![process(10, &[10, 11])], ..Default::default() };
        let own = SeccompFilter { insns: vec![1], log: false };
        let f = &mut tree.processes[0].fidelity;
        f.seccomp_filters.push(own.clone());
        f.threads[0].seccomp_mode = 2;
        f.threads[0].seccomp = vec![0];
        let new = SeccompFilter { insns: vec![2, 3], log: false };
        let edits = Edits { seccomp: Some(new.clone()), ..Default::default() };
        edits.apply(&mut tree).expect("applies");
        let f = &tree.processes[0].fidelity;
        assert_eq!(f.seccomp_filters, vec![own, new]);
        assert_eq!((f.threads[0].seccomp_mode, f.threads[0].seccomp.clone()), (2, vec![0, 1]));
        assert_eq!((f.threads[1].seccomp_mode, f.threads[1].seccomp.clone()), (2, vec![1]));
    }

    #[test]
    fn strict_mode_takes_no_filter() {
        let mut tree = TreeImage { processes: vec![process(10, &[10, 11])], ..Default::default() };
        tree.processes[0].fidelity.threads[1].seccomp_mode = 1;
        let edits = Edits {
            seccomp: Some(SeccompFilter { insns: vec![2], log: false }),
            ..Default::default()
        };
        let e = edits.apply(&mut tree).expect_err("strict");
        assert!(e.contains("pid 10 thread 11") && e.contains("strict mode"), "{e}");
    }

    #[test]
    fn nice_values_are_minus_20_to_19() {
        assert_eq!(parse_nice("10"), Ok(10));
        assert_eq!(parse_nice("-20"), Ok(-20));
        assert_eq!(parse_nice(" 19"), Ok(19));
        assert!(parse_nice("20")
            .expect_err("high")
            .contains("--nice 20: a nice value is -20 to 19"));
        assert!(parse_nice("-21").is_err());
        assert!(parse_nice("ten").expect_err("nan").contains("not a number"));
        assert!(parse_nice("").is_err());
    }

    #[test]
    fn cpulists_parse_as_the_kernel_writes_them() {
        assert_eq!(parse_cpulist("0"), Ok(vec![0]));
        assert_eq!(parse_cpulist("0-1"), Ok(vec![0, 1]));
        assert_eq!(parse_cpulist("0,2-3"), Ok(vec![0, 2, 3]));
        assert_eq!(parse_cpulist("3,1,1-2"), Ok(vec![1, 2, 3]));
        assert_eq!(parse_cpulist("64-65"), Ok(vec![64, 65]));
        assert!(parse_cpulist("").expect_err("empty").contains("empty item"));
        assert!(parse_cpulist("0,").expect_err("trailing").contains("empty item"));
        assert!(parse_cpulist("3-1").expect_err("backwards").contains("3-1 runs backwards"));
        assert!(parse_cpulist("a").expect_err("nan").contains("\"a\" is not a CPU"));
        assert!(parse_cpulist("-1").is_err());
        assert!(parse_cpulist("0-").is_err());
        assert!(parse_cpulist("9000").expect_err("huge").contains("above any kernel's"));
        assert!(parse_cpulist("0-99999999").is_err());
        assert_eq!(format_cpulist(&[0, 1, 2, 5, 7, 8]), "0-2,5,7-8");
        assert_eq!(format_cpulist(&[]), "");
        assert_eq!(mask_cpus(&[0b101, 1]), vec![0, 2, 64]);
    }

    #[test]
    fn cpus_must_exist_be_online_and_allowed_to_ferry() {
        let all = [0, 1, 2, 3];
        assert_eq!(check_cpus("0-1", &[0, 1], &all, &all, &all), Ok(()));
        let e = check_cpus("4", &[4], &all, &all, &all).expect_err("absent");
        assert_eq!(e, "--cpus 4: CPU 4 does not exist (this machine has 0-3)");
        let e = check_cpus("2", &[2], &all, &[0, 1, 3], &all).expect_err("offline");
        assert!(e.contains("CPU 2 is offline (online: 0-1,3)"), "{e}");
        let e = check_cpus("0,3", &[0, 3], &all, &all, &[0, 1]).expect_err("cpuset");
        assert!(e.contains("CPU 3 is outside the CPUs ferry may use (0-1"), "{e}");
    }

    #[test]
    fn every_thread_gets_the_nice_value_and_the_cpus() {
        let mut tree = TreeImage {
            processes: vec![process(10, &[10, 11]), process(12, &[12])],
            ..Default::default()
        };
        for p in &mut tree.processes {
            for t in &mut p.threads {
                t.sched = ferry_image::Sched { policy: 0, rt_priority: 0, nice: 5, cpus: vec![3] };
            }
        }
        tree.processes[1].threads[0].sched.policy = libc::SCHED_BATCH | libc::SCHED_RESET_ON_FORK;
        let edits = Edits { nice: Some(-5), cpus: Some(vec![1]), ..Default::default() };
        edits.apply(&mut tree).expect("applies");
        for t in tree.processes.iter().flat_map(|p| &p.threads) {
            assert_eq!((t.sched.nice, t.sched.cpus.clone()), (-5, vec![2]), "thread {}", t.tid);
        }
        let wide = Edits { cpus: Some(vec![0, 64]), ..Default::default() };
        let e = wide.apply(&mut tree).expect_err("mask too short");
        assert!(e.contains("pid 10 thread 10: CPU 64 is beyond the 64 CPUs"), "{e}");
    }

    #[test]
    fn nice_is_refused_for_a_real_time_thread() {
        let mut tree = TreeImage { processes: vec![process(10, &[10, 11])], ..Default::default() };
        tree.processes[0].threads[1].sched.policy = libc::SCHED_FIFO;
        let edits = Edits { nice: Some(3), ..Default::default() };
        let e = edits.apply(&mut tree).expect_err("fifo");
        assert_eq!(e, "--nice 3: pid 10 thread 11 runs under SCHED_FIFO, which ignores nice");
        // Affinity applies whatever the policy.
        let edits = Edits { cpus: Some(vec![0]), ..Default::default() };
        tree.processes[0].threads.iter_mut().for_each(|t| t.sched.cpus = vec![3]);
        edits.apply(&mut tree).expect("cpus apply to a real-time thread");
    }

    #[test]
    fn hostnames_are_1_to_64_bytes_without_nul() {
        assert_eq!(parse_hostname("svc-a"), Ok("svc-a".into()));
        assert_eq!(parse_hostname(&"h".repeat(64)), Ok("h".repeat(64)));
        assert!(parse_hostname("").expect_err("empty").contains("empty"));
        let e = parse_hostname(&"h".repeat(65)).expect_err("long");
        assert!(e.contains("65 bytes, a hostname has at most 64"), "{e}");
        assert!(parse_hostname("a\0b").expect_err("nul").contains("NUL"));
    }

    #[test]
    fn a_new_hostname_keeps_the_domainname() {
        let edits = Edits {
            hostname: Some("new".into()),
            domainname_here: "host.example".into(),
            ..Default::default()
        };
        // In ferry's namespace: the new one gets ferry's domainname.
        let mut tree = TreeImage { processes: vec![process(10, &[10])], ..Default::default() };
        edits.apply(&mut tree).expect("applies");
        let want = |h: &str, d: &str| {
            Some(ferry_image::UtsImage { hostname: h.into(), domainname: d.into() })
        };
        assert_eq!(tree.uts, want("new", "host.example"));
        // In a namespace of its own: its own domainname stays.
        tree.uts = want("old", "svc.test");
        edits.apply(&mut tree).expect("applies");
        assert_eq!(tree.uts, want("new", "svc.test"));
    }

    #[test]
    fn the_cgroup_v2_membership_moves_and_v1_ones_stay() {
        let mut tree = TreeImage {
            processes: vec![process(10, &[10]), process(12, &[12])],
            ..Default::default()
        };
        let v1 = CgroupMembership { hierarchy: 4, controllers: "memory".into(), path: "/m".into() };
        let old = CgroupMembership { hierarchy: 0, controllers: String::new(), path: "/a".into() };
        tree.cgroups = Some(CgroupImage {
            processes: vec![ProcessCgroups { pid: 10, memberships: vec![v1.clone(), old] }],
        });
        let edits = Edits { cgroup: Some("/svc/new".into()), ..Default::default() };
        edits.apply(&mut tree).expect("applies");
        let new =
            CgroupMembership { hierarchy: 0, controllers: String::new(), path: "/svc/new".into() };
        let section = tree.cgroups.expect("section");
        assert_eq!(section.processes[0].memberships, vec![v1, new.clone()]);
        assert_eq!(section.processes[1], ProcessCgroups { pid: 12, memberships: vec![new] });
    }
}
