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
        }
        Ok(())
    }
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
