//! Whether the running tree set a socket option between the reads made
//! before the freeze (phase "socket options checked") and the freeze:
//! the kernel counts every setsockopt system call of every thread of the
//! tree (a perf counter on the syscall's tracepoint per thread, opened
//! before anything is read). When no thread of the frozen tree made one,
//! no thread the counters missed exists (a thread or process started
//! since has none: then the answer is no), and no BPF program that could
//! set an option from inside the kernel (`bpf_setsockopt`) is loaded, the
//! options read before the freeze are the options in the freeze: the
//! survey takes them instead of reading ~60 options of every socket
//! while the service is stopped. Otherwise it reads them all, as before.
//!
//! What else changes a socket while the tree runs is read again in the
//! freeze: state, addresses, pending errors and queues, the fd's flags.

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};

/// Counters of setsockopt calls, one per thread of the tree.
pub(super) struct Watch {
    counters: HashMap<i32, OwnedFd>,
}

impl Watch {
    /// Counters on every thread of `pids` (the running tree), counting
    /// from now. None when the kernel offers none (no syscall
    /// tracepoints, no perf events): the freeze then reads every option.
    pub fn start(pids: &[i32]) -> Option<Watch> {
        let id = ferry_sys::perf::tracepoint_id("syscalls/sys_enter_setsockopt").ok()?;
        // Loaded now, not in the freeze where `answer` lists them.
        own_programs();
        let mut counters = HashMap::new();
        for &pid in pids {
            let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { continue };
            for tid in tasks.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok()) {
                match ferry_sys::perf::count_tracepoint(tid, id) {
                    Ok(c) => {
                        counters.insert(tid, c);
                    }
                    // Gone: a thread the freeze finds is then not counted.
                    Err(e) if e.errno == libc::ESRCH => {}
                    Err(e) => {
                        tracing::debug!("setsockopt counters not available: {e}");
                        return None;
                    }
                }
            }
        }
        Some(Watch { counters })
    }

    /// Whether the options read before the freeze still hold for the
    /// frozen threads `tids` (see the module comment). The counters close
    /// then, on a thread of their own ([`Watch::close_aside`]).
    pub fn quiet(self, tids: &[i32]) -> bool {
        let quiet = self.answer(tids);
        self.close_aside();
        quiet
    }

    /// While a counter is open every system call on the host takes the
    /// tracepoint's slower path, the repair reads of the freeze too; but
    /// closing the last one waits for an RCU grace period (tens of ms on
    /// a busy machine), which is not the service's to wait for.
    fn close_aside(self) {
        let spawned =
            std::thread::Builder::new().name("ferry-watch-close".into()).spawn(move || drop(self));
        if let Err(e) = spawned {
            tracing::debug!("closing the setsockopt counters here: {e}");
        }
    }

    fn answer(&self, tids: &[i32]) -> bool {
        let counts: Option<Vec<u64>> = tids
            .iter()
            .map(|t| ferry_sys::perf::read_count(self.counters.get(t)?.as_fd()).ok())
            .collect();
        let own = own_programs();
        let types: Option<Vec<u32>> = ferry_sys::bpf::loaded_progs()
            .ok()
            .map(|p| p.into_iter().filter(|p| !is_own(&own, p)).map(|p| p.prog_type).collect());
        let quiet = counts.as_deref().is_some_and(no_calls)
            && types.as_deref().is_some_and(|t| !bpf_may_set_options(t));
        tracing::debug!(
            "socket options read before the freeze {}: setsockopt calls per thread {counts:?}",
            if quiet { "taken" } else { "read again" }
        );
        quiet
    }
}

/// Ferry's own iterators (tracing programs that only read), as this
/// process loads them: another ferry's (an agent's, a foreground
/// restore's) have the same type and tag.
fn own_programs() -> Vec<ferry_sys::bpf::ProgInfo> {
    [
        crate::vm_flags::own_program(),
        super::socket_refs::own_program(),
        super::files::time_wait::own_program(),
    ]
    .into_iter()
    .flatten()
    .collect()
}

fn is_own(own: &[ferry_sys::bpf::ProgInfo], p: &ferry_sys::bpf::ProgInfo) -> bool {
    own.iter().any(|o| o.prog_type == p.prog_type && o.tag == p.tag)
}

/// Every thread counted, none called setsockopt.
fn no_calls(counts: &[u64]) -> bool {
    counts.iter().all(|&c| c == 0)
}

/// BPF program types that cannot set a socket option (no
/// `bpf_setsockopt`, no kfunc that does): socket filters, kprobes, tc
/// classifiers and actions (the network lock's), tracepoints, XDP, perf
/// events, cgroup skb and device programs, raw tracepoints. Any other
/// type loaded on the host (but ferry's own iterators) makes the
/// freeze read every option again.
const CANNOT_SET_OPTIONS: [u32; 10] = [1, 2, 3, 4, 5, 6, 7, 8, 15, 17];

fn bpf_may_set_options(types: &[u32]) -> bool {
    types.iter().any(|t| !CANNOT_SET_OPTIONS.contains(t))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_program_is_ferrys_own_by_its_type_and_tag_not_its_id() {
        use ferry_sys::bpf::ProgInfo;
        let own = [ProgInfo { id: 7, prog_type: 26, tag: [1; 8] }];
        assert!(is_own(&own, &ProgInfo { id: 99, prog_type: 26, tag: [1; 8] }), "another copy");
        assert!(!is_own(&own, &ProgInfo { id: 7, prog_type: 26, tag: [2; 8] }), "other code");
        assert!(!is_own(&own, &ProgInfo { id: 7, prog_type: 27, tag: [1; 8] }), "other type");
    }

    #[test]
    fn only_programs_without_setsockopt_let_the_options_read_before_stand() {
        assert!(!bpf_may_set_options(&[]));
        // tc (the network lock), XDP, cgroup skb and device programs.
        assert!(!bpf_may_set_options(&[3, 6, 8, 15]));
        // sock_ops, cgroup sockopt, struct_ops, tracing (iterators), LSM.
        for t in [13, 25, 27, 26, 29] {
            assert!(bpf_may_set_options(&[3, t]), "type {t}");
        }
        assert!(no_calls(&[0, 0]));
        assert!(!no_calls(&[0, 1]));
    }

    #[test]
    fn a_setsockopt_of_a_watched_thread_is_seen_and_a_thread_not_watched_is_not_quiet() {
        let me = std::process::id() as i32;
        let Some(watch) = Watch::start(&[me]) else {
            eprintln!("no setsockopt counters here: skipped");
            return;
        };
        let thread = std::fs::read_link("/proc/thread-self").expect("/proc/thread-self");
        let tid: i32 = thread.file_name().and_then(|n| n.to_str()?.parse().ok()).expect("tid");
        let counted =
            |w: &Watch| ferry_sys::perf::read_count(w.counters[&tid].as_fd()).expect("counter");
        assert_eq!(counted(&watch), 0);
        let s = ferry_sys::socket::socket(libc::AF_INET, libc::SOCK_STREAM, 0).expect("socket");
        use std::os::fd::AsRawFd;
        ferry_sys::socket::setsockopt_int(s.as_raw_fd(), libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1)
            .expect("setsockopt");
        assert_eq!(counted(&watch), 1);
        assert!(!watch.quiet(&[tid]));
        // A thread with no counter (started after the watch) is never quiet.
        let watch = Watch::start(&[me]).expect("counters");
        assert!(!watch.quiet(&[tid, i32::MAX]));
    }
}
