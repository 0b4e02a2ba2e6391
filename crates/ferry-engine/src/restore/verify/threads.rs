//! Each thread: it exists under its TID, with its name, signal mask,
//! seccomp mode and number of filters, and scheduling attributes (policy,
//! priority, nice, CPU affinity).

use super::Findings;
use crate::error::{EngineError, Result};
use ferry_image::{ProcessImage, Sched};

pub(super) fn compare(p: &ProcessImage, found: &mut Findings) -> Result<()> {
    let pid = p.pid;
    for t in &p.threads {
        let object = format!("thread {}", t.tid);
        let dir = format!("/proc/{pid}/task/{}", t.tid);
        // In 4 KiB reads: the standard reader's size probe and 32, 32,
        // 64... byte reads were nine system calls for this one file.
        let Ok(status) = crate::procfs::read_string(&format!("{dir}/status")) else {
            found.compare(pid, &object, "existence", "a thread", "no such thread");
            continue;
        };
        let fields = crate::procfs::key_values(&status);
        let mask = fields.get("SigBlk").and_then(|v| crate::procfs::parse_hex(v));
        found.compare(pid, &object, "signal mask", Some(t.sigmask), mask);
        if let Some(f) = p.fidelity.threads.iter().find(|f| f.tid == t.tid) {
            let mode = fields.get("Seccomp").and_then(|v| v.parse::<u8>().ok());
            found.compare(pid, &object, "seccomp mode", Some(f.seccomp_mode), mode);
            // A filter the kernel refused, or one installed twice, changes
            // the count even where the mode is right.
            let count = fields.get("Seccomp_filters").and_then(|v| v.parse::<usize>().ok());
            found.compare(pid, &object, "seccomp filters", Some(f.seccomp.len()), count);
        }
        let comm = crate::procfs::read_string(&format!("{dir}/comm"))?;
        found.compare(pid, &object, "name", t.comm.as_str(), comm.trim_end_matches('\n'));
        let s = ferry_sys::process::get_sched(t.tid).map_err(|e| {
            EngineError::kernel(pid, format!("thread {}: reading scheduling attributes", t.tid), e)
        })?;
        let now =
            Sched { policy: s.policy, rt_priority: s.rt_priority, nice: s.nice, cpus: s.cpus };
        found.compare(pid, &object, "scheduling", &t.sched, &now);
    }
    Ok(())
}
