//! Whether the running tree set a socket option between the reads made
//! before the freeze (phase "socket options checked") and the freeze:
//! the kernel counts every setsockopt system call of every thread of the
//! tree (a perf counter per thread on the raw_syscalls/sys_enter
//! tracepoint, filtered on the call's number, opened before anything is
//! read). When no thread of the frozen tree made one,
//! no thread the counters missed exists (a thread or process started
//! since has none: then the answer is no), and no BPF program that could
//! set an option from inside the kernel (`bpf_setsockopt`) is loaded, the
//! options read before the freeze are the options in the freeze: the
//! survey takes them instead of reading ~60 options of every socket
//! while the service is stopped. Otherwise it reads them all, as before.
//!
//! A second counter of each thread on the calls that change an fd or its open file
//! description without replacing it (fcntl, ioctl, flock, dup, dup2,
//! dup3, close_range, shutdown, connect) tell whether the connections described
//! before the freeze ([`super::files::pre_describe`]) still are as they
//! were: then the survey only checks that each fd still holds the same
//! socket. A call of any of them makes the survey read every fd again.
//!
//! The first counter counts the calls that start a thread or process
//! too (clone, clone3, fork, vfork): a thread started and gone between
//! two reads of the counters has none of its own, and the call that
//! started it is how its calls are not missed.
//!
//! A watch may be kept from one capture to the next ([`KeptWatch`],
//! `ferry replicate`'s syncs): its counters stay open, each capture takes
//! the counts when its reads begin as its base, and a socket the capture
//! before checked (the same SO_COOKIE) stands without being read or
//! compared again when, since that capture's base, no thread counted a
//! call, none started or exited, and no BPF program that may set an
//! option is loaded. A connection the capture before described stands
//! too ([`Watch::descriptions_stand`]) when, besides, no thread counted
//! a call of the second kind since that capture's base.
//!
//! What else changes a socket while the tree runs is read again in the
//! freeze: state, pending errors and queues (under the network lock).

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};

/// The calls after which the fds described before the freeze are read
/// again: what sets an fd's close-on-exec flag, its description's status
/// flags, owner, signal or locks, puts another description at an fd
/// number already listed, shuts a socket down, or gives a connection
/// other addresses (connect with AF_UNSPEC disconnects it, a second
/// connect connects it elsewhere).
const FD_CALLS: [libc::c_long; 9] = [
    libc::SYS_fcntl,
    libc::SYS_ioctl,
    libc::SYS_flock,
    libc::SYS_dup,
    libc::SYS_dup2,
    libc::SYS_dup3,
    libc::SYS_close_range,
    libc::SYS_shutdown,
    libc::SYS_connect,
];

/// The calls counted with setsockopt: those that start a thread or a
/// process. A thread started and gone between two reads of the counters
/// has no counter, and its setsockopt calls would not be seen; the call
/// that started it is.
#[cfg(target_arch = "x86_64")]
const START_CALLS: [libc::c_long; 4] =
    [libc::SYS_clone, libc::SYS_clone3, libc::SYS_fork, libc::SYS_vfork];
#[cfg(not(target_arch = "x86_64"))]
const START_CALLS: [libc::c_long; 2] = [libc::SYS_clone, libc::SYS_clone3];

/// The calls that change what the injected capture reads of a thread
/// or its process ([`super::injected`]: its alternate signal stack,
/// clear_child_tid, timer slack, process controls, memory policy,
/// parent-death signal, securebits, brk, dumpable, interval timers,
/// signal actions, io_uring rings), and those after which it may read
/// otherwise (credentials, exec, mlockall): counted by a third counter
/// of each thread, with [`START_CALLS`]. A kept watch lets the injected
/// reads of the capture before stand while none was counted
/// ([`KeptWatch::state_counts`]).
#[cfg(target_arch = "x86_64")]
const STATE_CALLS: [libc::c_long; 32] = [
    libc::SYS_sigaltstack,
    libc::SYS_prctl,
    libc::SYS_arch_prctl,
    libc::SYS_set_mempolicy,
    libc::SYS_set_mempolicy_home_node,
    libc::SYS_set_tid_address,
    libc::SYS_brk,
    libc::SYS_setitimer,
    libc::SYS_alarm,
    libc::SYS_rt_sigaction,
    libc::SYS_rt_sigreturn,
    libc::SYS_timer_create,
    libc::SYS_timer_settime,
    libc::SYS_timer_delete,
    libc::SYS_execve,
    libc::SYS_execveat,
    libc::SYS_setuid,
    libc::SYS_setgid,
    libc::SYS_setreuid,
    libc::SYS_setregid,
    libc::SYS_setresuid,
    libc::SYS_setresgid,
    libc::SYS_setfsuid,
    libc::SYS_setfsgid,
    libc::SYS_setgroups,
    libc::SYS_capset,
    libc::SYS_seccomp,
    libc::SYS_mlockall,
    libc::SYS_munlockall,
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_register,
    libc::SYS_personality,
];
#[cfg(not(target_arch = "x86_64"))]
const STATE_CALLS: [libc::c_long; 0] = [];

/// The counters of each thread, in order: on the raw_syscalls/sys_enter
/// tracepoint setsockopt with [`START_CALLS`], [`FD_CALLS`], and
/// [`STATE_CALLS`] with [`START_CALLS`]; then on signal/signal_deliver
/// every signal delivered (a handler run, which may reset its action
/// with SA_RESETHAND, disarm or enter the alternate stack without a
/// call). One tracepoint per kind, so closing the counters waits for
/// one RCU grace period per tracepoint (and in the process's exit if
/// it is still open). The last two only where there is an
/// architecture's list and the signal tracepoint.
fn filters() -> Vec<(u64, String)> {
    let any = |calls: &[libc::c_long]| {
        calls.iter().map(|c| format!("id == {c}")).collect::<Vec<_>>().join(" || ")
    };
    let Some(id) = sys_enter_id() else { return Vec::new() };
    let options: Vec<libc::c_long> =
        std::iter::once(libc::SYS_setsockopt).chain(START_CALLS).collect();
    let mut out = vec![(id, any(&options)), (id, any(&FD_CALLS))];
    if let (false, Some(signal)) = (STATE_CALLS.is_empty(), signal_deliver_id()) {
        let state: Vec<libc::c_long> = STATE_CALLS.iter().copied().chain(START_CALLS).collect();
        out.push((id, any(&state)));
        out.push((signal, "sig > 0".into()));
    }
    out
}

/// signal/signal_deliver's id, looked up once.
fn signal_deliver_id() -> Option<u64> {
    static ID: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    *ID.get_or_init(|| ferry_sys::perf::tracepoint_id("signal/signal_deliver").ok())
}

/// Counters per thread of the tree ([`filters`]): setsockopt calls (and
/// [`START_CALLS`]), [`FD_CALLS`], and where available [`STATE_CALLS`]
/// and signals delivered.
pub(super) struct Watch {
    counters: HashMap<i32, Counted>,
    /// Where this capture's watch goes back to once it answered: kept
    /// from capture to capture ([`KeptWatch`]), not closed.
    keep: Option<KeptWatch>,
    /// Whether what the capture before checked of the sockets still
    /// stands (set by [`Watch::rebase`]).
    checks_stand: bool,
    /// Whether the connections the capture before described still stand
    /// (set by [`Watch::rebase`]).
    descriptions_stand: bool,
}

/// What the counters tell in the freeze.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Quiet {
    /// No socket option can have changed since they were read.
    pub options: bool,
    /// Nor an fd, its flags, owner or locks, nor a socket's shutdown.
    pub fds: bool,
}

/// One thread's counters, with what they counted when the reads this
/// capture takes began ([`Watch::rebase`]; zeros for counters opened
/// for it), and, for a kept watch, the thread's own pidfd: a thread
/// that exited polls so, and its ID taken again by a new thread (whose
/// calls these counters miss) is not mistaken for it.
struct Counted {
    fds: Vec<OwnedFd>,
    base: Vec<u64>,
    thread: Option<OwnedFd>,
    /// Which opening of counters this is, unique in the process: a
    /// count compared across captures is one counter's only.
    serial: u64,
}

/// The serial of the next [`Counted`].
static SERIAL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// What one thread's state counters counted at a moment of a freeze
/// ([`KeptWatch::state_counts`]): equal at two freezes, with the same
/// serial, the thread made no call of [`STATE_CALLS`] nor started one,
/// and was delivered no signal, in between.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct StateCount {
    pub serial: u64,
    pub calls: u64,
    pub signals: u64,
}

/// A watch kept from one capture to the next (`ferry replicate`'s
/// syncs, [`super::CaptureOptions::kept_watch`]): the counters stay
/// open, so a capture neither opens them (a tracepoint's filter per
/// counter) nor waits for their end, and a capture takes the options
/// and fds read before its freeze whenever the counts did not move
/// since those reads began. Threads started since the last capture
/// get counters of their own; those gone are closed.
#[derive(Clone, Default)]
pub struct KeptWatch(std::sync::Arc<std::sync::Mutex<Option<HashMap<i32, Counted>>>>);

impl std::fmt::Debug for KeptWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeptWatch")
    }
}

impl KeptWatch {
    /// The kept counters, taken for one capture of the tree `pids` and
    /// counting from now ([`Watch::rebase`]); None when the kernel
    /// offers no counters.
    pub(super) fn take(&self, pids: &[i32]) -> Option<Watch> {
        let counters = self.0.lock().unwrap_or_else(|e| e.into_inner()).take().unwrap_or_default();
        let mut w = Watch {
            counters,
            keep: Some(self.clone()),
            checks_stand: false,
            descriptions_stand: false,
        };
        w.rebase(pids).then_some(w)
    }

    /// In a freeze, each of `tids`'s state count ([`StateCount`]); None
    /// when a thread has no state counters, or its counted thread
    /// exited, or the watch is with a capture.
    pub(super) fn state_counts(&self, tids: &[i32]) -> Option<HashMap<i32, StateCount>> {
        let kept = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let counters = kept.as_ref()?;
        let mut out = HashMap::with_capacity(tids.len());
        for &tid in tids {
            let c = counters.get(&tid)?;
            if c.fds.len() < 4 || c.thread.as_ref().is_none_or(exited) {
                return None;
            }
            let read = |i: usize| ferry_sys::perf::read_count(c.fds[i].as_fd()).ok();
            out.insert(tid, StateCount { serial: c.serial, calls: read(2)?, signals: read(3)? });
        }
        Some(out)
    }

    fn put_back(&self, counters: HashMap<i32, Counted>) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(counters);
    }
}

impl Drop for Watch {
    /// A kept watch goes back to its keeper, also when the capture
    /// failed before it answered.
    fn drop(&mut self) {
        if let Some(k) = self.keep.take() {
            let counters = std::mem::take(&mut self.counters);
            k.put_back(counters);
        }
    }
}

/// Every counter of thread `tid` ([`filters`]), counting from now.
fn open_counters(tid: i32, filters: &[(u64, String)]) -> ferry_sys::SysResult<Vec<OwnedFd>> {
    filters.iter().map(|(id, f)| ferry_sys::perf::count_tracepoint_filtered(tid, *id, f)).collect()
}

/// Every thread of the processes `pids`, as /proc lists them now.
fn threads_of(pids: &[i32]) -> Vec<i32> {
    let mut tids = Vec::new();
    for &pid in pids {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { continue };
        tids.extend(tasks.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok()));
    }
    tids
}

/// Whether the thread behind `pidfd` has exited.
fn exited(pidfd: &OwnedFd) -> bool {
    ferry_sys::pidfd::wait_exit(pidfd, 0).unwrap_or(true)
}

impl Watch {
    /// Counters on every thread of `pids` (the running tree), counting
    /// from now. None when the kernel offers none (no syscall
    /// tracepoints, no perf events): the freeze then reads every option.
    pub fn start(pids: &[i32]) -> Option<Watch> {
        let mut w = Watch {
            counters: HashMap::new(),
            keep: None,
            checks_stand: false,
            descriptions_stand: false,
        };
        w.rebase(pids).then_some(w)
    }

    /// Counts from now for every thread of `pids`: counters opened for
    /// threads without (a kept watch: each with its thread's pidfd,
    /// opened first, and checked alive after), those of threads gone
    /// closed, and each thread's present counts taken as its base.
    /// False when the kernel refuses counters.
    fn rebase(&mut self, pids: &[i32]) -> bool {
        let filters = filters();
        if filters.is_empty() {
            return false;
        }
        // Loaded now, not in the freeze where `answer` lists them.
        let own = own_programs();
        let tids = threads_of(pids);
        let gone: Vec<i32> = self
            .counters
            .iter()
            .filter(|(t, c)| !tids.contains(t) || c.thread.as_ref().is_some_and(exited))
            .map(|(&t, _)| t)
            .collect();
        let closed: Vec<Counted> = gone.iter().filter_map(|t| self.counters.remove(t)).collect();
        // Whether the sockets checked by the capture before stand: every
        // thread counted since then, none set an option, none exited
        // (its last calls are not looked at).
        let mut unchanged =
            closed.is_empty() && !self.counters.is_empty() && no_option_setter(&own);
        // And the connections described by the capture before: no call
        // of [`FD_CALLS`] either.
        let mut fds_unchanged = true;
        if !closed.is_empty() {
            crate::parallel::detach("ferry-watch-close", move || drop(closed));
        }
        for tid in tids {
            if let Some(c) = self.counters.get_mut(&tid) {
                let Ok(counts) = c
                    .fds
                    .iter()
                    .map(|fd| ferry_sys::perf::read_count(fd.as_fd()))
                    .collect::<ferry_sys::SysResult<Vec<u64>>>()
                else {
                    return false;
                };
                unchanged &= counts.first() == c.base.first();
                fds_unchanged &= counts.len() >= 2 && counts.get(1) == c.base.get(1);
                c.base = counts;
                continue;
            }
            // A thread started since: its calls before now were not counted.
            unchanged = false;
            match self.open_thread(tid, &filters) {
                Ok(Some(c)) => {
                    self.counters.insert(tid, c);
                }
                // Gone: a thread the freeze finds is then not counted.
                Ok(None) => {}
                Err(e) => {
                    tracing::debug!("system call counters not available: {e}");
                    return false;
                }
            }
        }
        self.checks_stand = unchanged;
        self.descriptions_stand = unchanged && fds_unchanged;
        tracing::debug!(
            "sockets checked by the capture before {}, connections it described {}",
            if unchanged { "stand" } else { "are checked again" },
            if self.descriptions_stand { "stand" } else { "are described again" }
        );
        true
    }

    /// A kept watch's answer: whether what the capture before checked
    /// of the sockets still stands ([`Watch::rebase`]); false for a
    /// watch of one capture.
    pub fn checks_stand(&self) -> bool {
        self.keep.is_some() && self.checks_stand
    }

    /// A kept watch's answer: whether the connections the capture before
    /// described still stand as it described them, as far as the
    /// tree's calls go: its checks stand ([`Watch::checks_stand`]) and
    /// no thread made a call of [`FD_CALLS`] since that capture's base
    /// ([`Watch::rebase`]). What the network changes (state, errors,
    /// queues, an urgent byte) is not covered: those are read again.
    pub fn descriptions_stand(&self) -> bool {
        self.checks_stand() && self.descriptions_stand
    }

    /// Thread `tid`'s counters (and pidfd, for a kept watch); None when
    /// it is gone.
    fn open_thread(
        &self,
        tid: i32,
        filters: &[(u64, String)],
    ) -> ferry_sys::SysResult<Option<Counted>> {
        let gone = |e: &ferry_sys::SysError| e.errno == libc::ESRCH;
        let thread = match self.keep.is_some().then(|| ferry_sys::pidfd::pidfd_open_thread(tid)) {
            Some(Err(e)) if gone(&e) => return Ok(None),
            Some(r) => Some(r?),
            None => None,
        };
        let fds = match open_counters(tid, filters) {
            Err(e) if gone(&e) => return Ok(None),
            r => r?,
        };
        // Alive after its counters opened: they count this thread.
        if thread.as_ref().is_some_and(exited) {
            return Ok(None);
        }
        let serial = SERIAL.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(Some(Counted { base: vec![0; fds.len()], fds, thread, serial }))
    }

    /// Whether the options (and fds) read before the freeze still hold
    /// for the frozen threads `tids` (see the module comment). The
    /// counters close then, on a thread of their own
    /// ([`Watch::close_aside`]), or go back to their keeper.
    pub fn quiet(mut self, tids: &[i32]) -> Quiet {
        let quiet = self.answer(tids);
        if self.keep.is_none() {
            self.close_aside();
        }
        quiet
    }

    /// While a counter is open every system call on the host takes the
    /// tracepoint's slower path, the repair reads of the freeze too; but
    /// closing the last one waits for an RCU grace period (tens of ms on
    /// a busy machine), which is not the service's to wait for.
    /// One thread per kind of counter.
    fn close_aside(&mut self) {
        let mut by_call: Vec<Vec<OwnedFd>> = Vec::new();
        for counted in std::mem::take(&mut self.counters).into_values() {
            for (i, c) in counted.fds.into_iter().enumerate() {
                if by_call.len() <= i {
                    by_call.push(Vec::new());
                }
                by_call[i].push(c);
            }
        }
        for counters in by_call {
            crate::parallel::detach("ferry-watch-close", move || drop(counters));
        }
    }

    /// Each thread's calls since its base; None for a thread without
    /// counters, or (a kept watch) whose counted thread exited.
    fn counts(&self, tid: i32) -> Option<Vec<u64>> {
        let c = self.counters.get(&tid)?;
        if c.thread.as_ref().is_some_and(exited) {
            return None;
        }
        c.fds
            .iter()
            .zip(&c.base)
            .map(|(fd, base)| ferry_sys::perf::read_count(fd.as_fd()).ok()?.checked_sub(*base))
            .collect()
    }

    fn answer(&self, tids: &[i32]) -> Quiet {
        let counts: Option<Vec<Vec<u64>>> = tids.iter().map(|&t| self.counts(t)).collect();
        let types = foreign_prog_types(&own_programs());
        let quiet = judge(counts.as_deref(), types.as_deref());
        tracing::debug!(
            "socket options read before the freeze {}, descriptors described before it {}: calls per thread {counts:?}",
            if quiet.options { "taken" } else { "read again" },
            if quiet.fds { "taken" } else { "read again" }
        );
        quiet
    }
}

/// The types of the BPF programs loaded on the host but ferry's own.
fn foreign_prog_types(own: &[ferry_sys::bpf::ProgInfo]) -> Option<Vec<u32>> {
    ferry_sys::bpf::loaded_progs()
        .ok()
        .map(|p| p.into_iter().filter(|p| !is_own(own, p)).map(|p| p.prog_type).collect())
}

/// No BPF program loaded that may set a socket option.
fn no_option_setter(own: &[ferry_sys::bpf::ProgInfo]) -> bool {
    foreign_prog_types(own).is_some_and(|t| !bpf_may_set_options(&t))
}

/// raw_syscalls/sys_enter's id, looked up once (a tracefs mounted for
/// it where none is).
fn sys_enter_id() -> Option<u64> {
    static ID: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    *ID.get_or_init(|| ferry_sys::perf::tracepoint_id("raw_syscalls/sys_enter").ok())
}

/// The answer from each thread's counts (setsockopt calls, then
/// [`FD_CALLS`], then any others, not looked at here; None when a
/// thread has no counters) and the types of the BPF programs loaded but
/// ferry's.
fn judge(counts: Option<&[Vec<u64>]>, types: Option<&[u32]>) -> Quiet {
    let no_bpf = types.is_some_and(|t| !bpf_may_set_options(t));
    let Some(counts) = counts else { return Quiet::default() };
    let options = no_bpf && no_calls(&counts.iter().map(|c| c[0]).collect::<Vec<_>>());
    let all_counted = counts.iter().all(|c| c.len() >= 2);
    let fds = options && all_counted && counts.iter().all(|c| no_calls(&c[..2.min(c.len())]));
    Quiet { options, fds }
}

/// Ferry's own iterators (tracing programs that only read), as this
/// process loads them: another ferry's (an agent's, a foreground
/// restore's) have the same type and tag.
fn own_programs() -> Vec<ferry_sys::bpf::ProgInfo> {
    [
        crate::vm_flags::own_program(),
        super::socket_refs::own_program(),
        super::files::time_wait::own_program(),
        super::host_fds::own_program(),
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

    /// Killed and reaped on drop.
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    /// A python3 program of the test's own, its stdin and its stdout's
    /// lines (it says "up" first).
    struct PyChild {
        child: Kill,
        stdin: std::process::ChildStdin,
        lines: std::io::Lines<std::io::BufReader<std::process::ChildStdout>>,
    }

    impl PyChild {
        /// None (the test skipped, and says so) without python3.
        fn start(prog: &str) -> Option<PyChild> {
            let spawned = std::process::Command::new("python3")
                .args(["-c", prog])
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .spawn();
            let mut child = match spawned {
                Ok(c) => Kill(c),
                Err(e) => {
                    eprintln!("no python3 ({e}): skipped");
                    return None;
                }
            };
            let (Some(stdin), Some(stdout)) = (child.0.stdin.take(), child.0.stdout.take()) else {
                panic!("child pipes")
            };
            let lines = std::io::BufRead::lines(std::io::BufReader::new(stdout));
            Some(PyChild { child, stdin, lines })
        }
    }

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
    fn the_fds_stand_only_when_no_call_of_any_kind_was_counted() {
        let quiet = |counts: &[Vec<u64>]| judge(Some(counts), Some(&[3]));
        let none = vec![0; 2];
        assert_eq!(quiet(&[none.clone(), none.clone()]), Quiet { options: true, fds: true });
        let mut fcntl = none.clone();
        fcntl[1] = 2;
        assert_eq!(quiet(&[none.clone(), fcntl]), Quiet { options: true, fds: false });
        let mut set = none.clone();
        set[0] = 1;
        assert_eq!(quiet(&[set]), Quiet { options: false, fds: false });
        // A thread with one counter only.
        assert_eq!(quiet(&[vec![0]]), Quiet { options: true, fds: false });
        // A BPF program that may set options; a thread not counted.
        assert_eq!(judge(Some(std::slice::from_ref(&none)), Some(&[13])), Quiet::default());
        assert_eq!(judge(None, Some(&[3])), Quiet::default());
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
        let counted = |w: &Watch| {
            ferry_sys::perf::read_count(w.counters[&tid].fds[0].as_fd()).expect("counter")
        };
        assert_eq!(counted(&watch), 0);
        let s = ferry_sys::socket::socket(libc::AF_INET, libc::SOCK_STREAM, 0).expect("socket");
        use std::os::fd::AsRawFd;
        ferry_sys::socket::setsockopt_int(s.as_raw_fd(), libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1)
            .expect("setsockopt");
        assert_eq!(counted(&watch), 1);
        assert_eq!(watch.quiet(&[tid]), Quiet { options: false, fds: false });
        // A thread with no counter (started after the watch) is never quiet.
        let watch = Watch::start(&[me]).expect("counters");
        assert_eq!(watch.quiet(&[tid, i32::MAX]), Quiet::default());
        // An fcntl leaves the options standing, not the fds.
        let watch = Watch::start(&[me]).expect("counters");
        ferry_sys::fd::fcntl_int(s.as_raw_fd(), libc::F_GETFD, 0, "fcntl").expect("fcntl");
        let quiet = watch.quiet(&[tid]);
        assert!(!quiet.fds);
    }

    #[test]
    fn a_kept_watch_lets_the_checks_stand_only_while_nothing_set_an_option() {
        use std::io::Write;
        // A process of its own (this one's test threads come and go):
        // it makes a socket, then sets an option on each line it reads.
        let prog = "import socket,sys\ns=socket.socket()\nprint('up',flush=True)\n\
                    for l in sys.stdin: s.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1); print('set',flush=True)";
        let Some(PyChild { mut child, mut stdin, mut lines }) = PyChild::start(prog) else {
            return;
        };
        let pid = child.0.id() as i32;
        let mut next = || lines.next().and_then(|l| l.ok()).unwrap_or_default();
        assert_eq!(next(), "up");
        let kept = KeptWatch::default();
        let Some(w) = kept.take(&[pid]) else {
            eprintln!("no setsockopt counters here: skipped");
            return;
        };
        let stands = |kept: &KeptWatch| kept.take(&[pid]).map(|w| w.checks_stand);
        assert!(!w.checks_stand, "the first capture has nothing before it");
        drop(w);
        assert_eq!(stands(&kept), Some(true), "nothing set since");
        writeln!(stdin, "set").expect("to the child");
        assert_eq!(next(), "set");
        assert_eq!(stands(&kept), Some(false), "a setsockopt since");
        assert_eq!(stands(&kept), Some(true), "nothing since the last");
        let _ = child.0.kill();
        let _ = child.0.wait();
        assert_eq!(stands(&kept), Some(false), "its thread exited");
    }

    #[test]
    fn a_kept_watch_lets_the_descriptions_stand_only_while_no_fd_call_was_counted() {
        use std::io::Write;
        // A process of its own with a socket: on "f" it sets the
        // socket's close-on-exec flag (fcntl), on "c" it connects it
        // (refused: nothing listens at port 9 of its loopback).
        let prog = "import socket,sys,fcntl\ns=socket.socket()\nprint('up',flush=True)\n\
                    for l in sys.stdin:\n\
                    \x20if l.startswith('f'): fcntl.fcntl(s.fileno(), fcntl.F_SETFD, fcntl.FD_CLOEXEC)\n\
                    \x20else: s.connect_ex(('127.0.0.1', 9))\n\
                    \x20print('done',flush=True)";
        let Some(PyChild { mut child, mut stdin, mut lines }) = PyChild::start(prog) else {
            return;
        };
        let pid = child.0.id() as i32;
        let mut next = || lines.next().and_then(|l| l.ok()).unwrap_or_default();
        assert_eq!(next(), "up");
        let kept = KeptWatch::default();
        let Some(w) = kept.take(&[pid]) else {
            eprintln!("no system call counters here: skipped");
            return;
        };
        assert!(!w.descriptions_stand(), "the first capture has nothing before it");
        drop(w);
        let stands = |kept: &KeptWatch| {
            kept.take(&[pid]).map(|w| (w.checks_stand(), w.descriptions_stand()))
        };
        assert_eq!(stands(&kept), Some((true, true)), "nothing called since");
        for (line, call) in [("f", "an fcntl"), ("c", "a connect")] {
            writeln!(stdin, "{line}").expect("to the child");
            assert_eq!(next(), "done");
            assert_eq!(stands(&kept), Some((true, false)), "{call} since: the options stand");
            assert_eq!(stands(&kept), Some((true, true)), "nothing since the last");
        }
        let _ = child.0.kill();
        let _ = child.0.wait();
        assert_eq!(stands(&kept), Some((false, false)), "its thread exited");
    }

    #[test]
    fn the_state_counts_move_with_a_signal_action_set_or_a_signal_delivered_only() {
        use std::io::Write;
        // One thread of its own: sets SIGUSR1's action on each line, and
        // has a handler for it.
        let prog = "import signal,sys\nsignal.signal(signal.SIGUSR1, lambda s,f: None)\n\
                    print('up',flush=True)\n\
                    for l in sys.stdin: signal.signal(signal.SIGUSR1, lambda s,f: None); print('set',flush=True)";
        let Some(PyChild { child, mut stdin, mut lines }) = PyChild::start(prog) else { return };
        let pid = child.0.id() as i32;
        let mut next = || lines.next().and_then(|l| l.ok()).unwrap_or_default();
        assert_eq!(next(), "up");
        let kept = KeptWatch::default();
        let Some(w) = kept.take(&[pid]) else {
            eprintln!("no system call counters here: skipped");
            return;
        };
        drop(w);
        let Some(first) = kept.state_counts(&[pid]) else {
            eprintln!("no state counters here (no signal tracepoint): skipped");
            return;
        };
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert_eq!(kept.state_counts(&[pid]), Some(first.clone()), "nothing called");
        writeln!(stdin, "set").expect("to the child");
        assert_eq!(next(), "set");
        let set = kept.state_counts(&[pid]).expect("counts");
        assert!(set[&pid].calls > first[&pid].calls, "rt_sigaction counted");
        assert_eq!(set[&pid].signals, first[&pid].signals);
        ferry_sys::process::kill(pid, libc::SIGUSR1).expect("kill");
        let t = std::time::Instant::now();
        let delivered =
            || kept.state_counts(&[pid]).is_some_and(|c| c[&pid].signals > set[&pid].signals);
        while !delivered() && t.elapsed() < std::time::Duration::from_secs(5) {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(delivered(), "the delivery of SIGUSR1 was not counted");
        assert_eq!(first[&pid].serial, set[&pid].serial, "the same counters");
        assert_eq!(kept.state_counts(&[pid, i32::MAX]), None, "a thread not counted");
    }
}
