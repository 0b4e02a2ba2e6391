//! What `ferry replace` is asked for, and its check on this host before
//! anything is frozen: each option refused here names itself, and the
//! tree has not been touched.

use crate::edits::{self, Edits};
use crate::error::ReplaceError;
use ferry_image::SeccompFilter;
use std::path::PathBuf;

/// The options of one replacement, as given.
#[derive(Debug, Clone, Default)]
pub struct ReplaceOptions {
    /// A cgroup v2 directory every process of the new tree is put in.
    pub cgroup: Option<PathBuf>,
    /// A classic BPF filter file stacked on every thread's filters.
    pub seccomp: Option<PathBuf>,
    /// `CAP[,CAP...]` or `all`.
    pub drop_caps: Option<String>,
    /// `NAME=SOFT:HARD` each.
    pub rlimits: Vec<String>,
    /// A nice value (-20..19) for every thread.
    pub nice: Option<String>,
    /// A cpulist (`0`, `0-1`, `0,2-3`): every thread's CPU affinity.
    pub cpus: Option<String>,
    /// A new UTS namespace for the new tree, with this hostname.
    pub hostname: Option<String>,
    /// Take a root that runs in its parent's process group although the
    /// parent stays outside the tree and sees it exit (as `ferry
    /// checkpoint --parent-sees-exit`).
    pub parent_sees_exit: bool,
    /// Make every kernel object again, as a restore does, instead of
    /// carrying the old tree's sockets, pipes, eventfds... over as the
    /// same objects (TCP connections then go through repair and the
    /// network lock).
    pub rebuild_files: bool,
    /// Copy the root's memory into the new tree while the old one runs
    /// (pre-copy), so the pause copies only what was written since the
    /// last round. Off: every page is copied in the pause.
    pub precopy: bool,
    /// Freeze the tree once, with the trial restore inside that pause;
    /// by default a first short freeze captures the tree for a trial
    /// made while it runs, and the pause that ends in the kill only
    /// compares the final image with the tried one (early_trial.rs).
    pub single_freeze: bool,
}

impl ReplaceOptions {
    /// Parses and checks every option on this host: the edits to make.
    pub fn prepare(&self) -> Result<Edits, ReplaceError> {
        let refused = ReplaceError::Option;
        let mut out = Edits::default();
        if let Some(dir) = &self.cgroup {
            out.cgroup = Some(crate::cgroup::resolve(dir).map_err(refused)?);
        }
        for r in &self.rlimits {
            let limit = edits::parse_rlimit(r).map_err(refused)?;
            check_nr_open(r, &limit).map_err(refused)?;
            // Given twice: the last one counts, as it would if set twice.
            out.rlimits.retain(|l| l.resource != limit.resource);
            out.rlimits.push(limit);
        }
        if let Some(caps) = &self.drop_caps {
            out.drop_caps = edits::parse_caps(caps).map_err(refused)?;
        }
        if let Some(path) = &self.seccomp {
            out.seccomp = Some(load_filter(path).map_err(refused)?);
        }
        if let Some(n) = &self.nice {
            out.nice = Some(edits::parse_nice(n).map_err(refused)?);
        }
        if let Some(list) = &self.cpus {
            out.cpus = Some(host_cpus(list).map_err(refused)?);
        }
        if let Some(name) = &self.hostname {
            out.hostname = Some(edits::parse_hostname(name).map_err(refused)?);
            let (_, domainname) = ferry_sys::uts::own_names().map_err(|e| {
                refused(format!("--hostname {name}: reading ferry's own names: {e}"))
            })?;
            out.domainname_here = domainname;
        }
        Ok(out)
    }
}

/// The kernel refuses a nofile limit above fs.nr_open (EPERM, even for
/// root): said here rather than by the trial restore.
fn check_nr_open(arg: &str, limit: &ferry_image::Rlimit) -> Result<(), String> {
    if limit.resource != libc::RLIMIT_NOFILE {
        return Ok(());
    }
    let nr_open = std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok());
    match nr_open {
        Some(max) if limit.hard > max => {
            Err(format!("--rlimit {arg}: the kernel allows at most {max} open files (fs.nr_open)"))
        }
        _ => Ok(()),
    }
}

/// A `--cpus` list checked against this host: each CPU present, online
/// and among ferry's own (its affinity, which its cgroup's cpuset bounds).
fn host_cpus(arg: &str) -> Result<Vec<u32>, String> {
    let cpus = edits::parse_cpulist(arg)?;
    let sysfs = |name: &str| -> Result<Vec<u32>, String> {
        let path = format!("/sys/devices/system/cpu/{name}");
        let text =
            std::fs::read_to_string(&path).map_err(|e| format!("--cpus {arg}: {path}: {e}"))?;
        edits::parse_cpulist(text.trim()).map_err(|e| format!("--cpus {arg}: {path}: {e}"))
    };
    let me = std::process::id() as i32;
    let own = ferry_sys::process::get_sched(me)
        .map_err(|e| format!("--cpus {arg}: reading ferry's own CPU affinity: {e}"))?;
    let allowed = edits::mask_cpus(&own.cpus);
    edits::check_cpus(arg, &cpus, &sysfs("present")?, &sysfs("online")?, &allowed)?;
    Ok(cpus)
}

/// Reads a filter file and has the kernel check that it loads.
fn load_filter(path: &std::path::Path) -> Result<SeccompFilter, String> {
    let shown = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|e| format!("--seccomp {shown}: {e}"))?;
    let insns = edits::parse_filter(&shown, &bytes)?;
    ferry_sys::seccomp::filter_loads(&insns)
        .map_err(|e| format!("--seccomp {shown}: the kernel refuses the filter ({e})"))?;
    Ok(SeccompFilter { insns, log: false })
}
