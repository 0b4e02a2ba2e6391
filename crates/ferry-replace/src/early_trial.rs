//! The trial before the freeze: a first, short freeze captures the tree,
//! which then runs on while that image is restored in scratch namespaces
//! and checked (the trial); the freeze that ends in the kill captures the
//! tree again and keeps only a comparison of the two images inside the
//! pause, where the trial used to run.
//!
//! Why a trial of the first image guards the kill of the second: the two
//! are compared with only the values masked that the restore sets by a
//! call whose success does not depend on the value, for any value the
//! kernel itself reported ([`Volatile`]): registers and the extended FPU
//! state (PTRACE_SETREGS / SETREGSET of what GETREGS gave), page contents
//! (written into mappings that are compared), file positions other than
//! a directory's (lseek of a regular file or a socket's 0), a regular
//! file's size (checked against the file as it is at the restore, which
//! both images meet the same way), the time left of a sleep, of an
//! interval timer, a POSIX timer or a timerfd and its overrun or tick
//! count. Everything else must be equal, field by field (the image
//! model's own equality): the processes and threads, their IDs,
//! credentials, limits, mappings, fd tables and every file's kind, the
//! carried files' identity, signal actions, seccomp filters, cgroups...
//! A tree that changed in any of these between the two freezes (a new
//! connection accepted, a mapping made, a thread started) has its second
//! image tried in the pause, as without this step. So the kill still
//! comes only after a restore of an image of the very same shape passed.
//!
//! Not used when the capture repaired TCP connections (`--rebuild-files`
//! or files that cannot be carried): their state is read under the
//! network lock and the trial restores it; the whole trial stays in the
//! pause there.

use crate::edits::Edits;
use crate::error::ReplaceError;
use crate::precopy::Precopy;
use crate::ReplaceOptions;
use ferry_engine::capture::Captured;
use ferry_engine::restore::trial::Sandbox;
use ferry_image::{FileKind, ProcessImage, TreeImage};
use std::os::fd::AsRawFd;

/// The first freeze, its capture edited and written, the tree let run,
/// then the trial of that image. `Ok(None)`: not suited (said at debug
/// level), the whole trial is made in the pause. An error refuses the
/// replacement with the old tree running, as a trial in the pause would.
pub fn run(
    pid: i32,
    opts: &ReplaceOptions,
    edits: &Edits,
    pre: Option<&mut Precopy>,
    sandbox: &Sandbox,
) -> Result<Option<EarlyTrial>, ReplaceError> {
    let mut ph = ferry_engine::phases::Phases::start("replace");
    let (mut captured, mut image) = crate::capture_into_memory(pid, opts, pre)?;
    if let Some(why) = unsuited(&captured) {
        tracing::debug!("replace of pid {pid}: no trial before the freeze: {why}");
        captured.resume()?;
        return Ok(None);
    }
    crate::checks::replaceable(&captured.tree)?;
    edits.apply(&mut captured.tree).map_err(ReplaceError::Refused)?;
    captured.write_image(&mut image, None)?;
    let mut phases = crate::prefixed("first capture", captured.phases.done());
    // Kept until the copy is told to end: the trial places these.
    let carried = captured.take_carried();
    let raw = carried.iter().map(|(id, fd)| (*id, fd.as_raw_fd())).collect();
    let tree = std::mem::take(&mut captured.tree);
    let first_pause_ms = captured.resume()?.frozen_ms;
    ph.mark("first capture");
    let copy = crate::trial(&[], &mut image, &raw, sandbox)?;
    phases.extend(crate::prefixed("early trial", copy.phases()));
    // Ended before the final capture, which would find the copy's
    // processes holding what the tree holds (a POSIX shm file mapped by
    // path, say) and refuse them as outside users.
    copy.end().wait(ferry_engine::restore::trial::END_PATIENCE);
    drop(carried);
    ph.mark("early trial");
    phases.extend(crate::prefixed("replace", ph.done()));
    Ok(Some(EarlyTrial::new(tree, first_pause_ms, phases)))
}

/// A trial that passed on a capture made before the freeze.
pub struct EarlyTrial {
    /// The trial's image as edited, its volatile values masked.
    shape: Shape,
    /// How long the first freeze held the tree (its own pause).
    pub first_pause_ms: f64,
    /// The first capture's and the trial's phases, for `--verbose`.
    pub phases: Vec<(String, f64)>,
}

/// What the comparison with the final capture found.
pub enum Compared {
    /// Same shape: the trial stands for the final image.
    Same,
    /// Changed (said where): the final image is tried in the pause.
    Changed(String),
}

impl EarlyTrial {
    /// Made from the first capture's tree, after its image was written
    /// (the tree is not needed for anything else then).
    pub fn new(tree: TreeImage, first_pause_ms: f64, phases: Vec<(String, f64)>) -> EarlyTrial {
        EarlyTrial { shape: Shape::of(tree), first_pause_ms, phases }
    }

    /// Compares the final capture's edited tree with the trial's; `tree`
    /// is left as it was.
    pub fn compare(self, tree: &mut TreeImage) -> Compared {
        match self.shape.difference(tree) {
            None => Compared::Same,
            Some(what) => Compared::Changed(what),
        }
    }
}

/// A tree with its [`Volatile`] values masked.
struct Shape(TreeImage);

impl Shape {
    fn of(mut tree: TreeImage) -> Shape {
        drop(Volatile::take(&mut tree));
        Shape(tree)
    }

    /// Where `tree`, its volatile values masked, differs from this shape;
    /// `tree` is left as it was.
    fn difference(&self, tree: &mut TreeImage) -> Option<String> {
        let volatile = Volatile::take(tree);
        let what = difference(&self.0, tree);
        volatile.put_back(tree);
        what
    }
}

/// Whether a first capture can be tried before the freeze: not when it
/// repaired TCP connections (their queues and sequence numbers are read
/// behind the network lock, which only the final freeze may hold for the
/// trial). Said why not, for `--verbose`.
pub fn unsuited(captured: &Captured) -> Option<&'static str> {
    if !captured.socket_fds().is_empty() || captured.network_locked() {
        return Some("TCP connections were repaired, not carried");
    }
    None
}

/// The values masked in a comparison, taken out of a tree and put back.
#[derive(Default)]
struct Volatile {
    per_process: Vec<ProcessValues>,
}

#[derive(Default)]
struct ProcessValues {
    page_runs: Vec<ferry_image::PageRun>,
    /// Per thread: registers, XSAVE area, time left of a sleep.
    threads: Vec<(Vec<u64>, Vec<u8>, Option<u64>)>,
    /// Per file: position, regular size, timerfd value and ticks.
    files: Vec<(i64, u64, u64, u64)>,
    itimers: Vec<u64>,
    /// Per POSIX timer: time left, overrun.
    posix_timers: Vec<(u64, i32)>,
}

impl Volatile {
    fn take(tree: &mut TreeImage) -> Volatile {
        Volatile { per_process: tree.processes.iter_mut().map(ProcessValues::take).collect() }
    }

    fn put_back(self, tree: &mut TreeImage) {
        for (p, v) in tree.processes.iter_mut().zip(self.per_process) {
            v.put_back(p);
        }
    }
}

impl ProcessValues {
    fn take(p: &mut ProcessImage) -> ProcessValues {
        let threads = p
            .threads
            .iter_mut()
            .map(|t| {
                let sleep = t.sleep_remaining_ns.as_mut().map(std::mem::take);
                (std::mem::take(&mut t.regs), std::mem::take(&mut t.xstate), sleep)
            })
            .collect();
        let files = p.files.iter_mut().map(take_file_values).collect();
        ProcessValues {
            page_runs: std::mem::take(&mut p.page_runs),
            threads,
            files,
            itimers: p.itimers.iter_mut().map(|t| std::mem::take(&mut t.value_us)).collect(),
            posix_timers: p
                .posix_timers
                .iter_mut()
                .map(|t| (std::mem::take(&mut t.value_ns), std::mem::take(&mut t.overrun)))
                .collect(),
        }
    }

    fn put_back(self, p: &mut ProcessImage) {
        p.page_runs = self.page_runs;
        for (t, (regs, xstate, sleep)) in p.threads.iter_mut().zip(self.threads) {
            t.regs = regs;
            t.xstate = xstate;
            if let (Some(ns), Some(v)) = (t.sleep_remaining_ns.as_mut(), sleep) {
                *ns = v;
            }
        }
        for (f, v) in p.files.iter_mut().zip(self.files) {
            put_back_file_values(f, v);
        }
        for (t, v) in p.itimers.iter_mut().zip(self.itimers) {
            t.value_us = v;
        }
        for (t, (value, overrun)) in p.posix_timers.iter_mut().zip(self.posix_timers) {
            t.value_ns = value;
            t.overrun = overrun;
        }
    }
}

fn take_file_values(f: &mut ferry_image::OpenFile) -> (i64, u64, u64, u64) {
    // A directory's position is a filesystem cookie, not a byte offset:
    // compared, not masked.
    let pos = match f.kind {
        FileKind::Directory { .. } => 0,
        _ => std::mem::take(&mut f.pos),
    };
    match &mut f.kind {
        FileKind::Regular { size, .. } => (pos, std::mem::take(size), 0, 0),
        FileKind::TimerFd(t) => {
            (pos, 0, std::mem::take(&mut t.value_ns), std::mem::take(&mut t.ticks))
        }
        _ => (pos, 0, 0, 0),
    }
}

fn put_back_file_values(
    f: &mut ferry_image::OpenFile,
    (pos, size, value, ticks): (i64, u64, u64, u64),
) {
    if !matches!(f.kind, FileKind::Directory { .. }) {
        f.pos = pos;
    }
    match &mut f.kind {
        FileKind::Regular { size: s, .. } => *s = size,
        FileKind::TimerFd(t) => {
            t.value_ns = value;
            t.ticks = ticks;
        }
        _ => {}
    }
}

/// Where two masked trees differ, named for the report; `None` when
/// they are equal.
fn difference(a: &TreeImage, b: &TreeImage) -> Option<String> {
    if a == b {
        return None;
    }
    let pids = |t: &TreeImage| t.processes.iter().map(|p| p.pid).collect::<Vec<_>>();
    if pids(a) != pids(b) {
        return Some("its processes".into());
    }
    for (p, q) in a.processes.iter().zip(&b.processes) {
        if p != q {
            return Some(format!("pid {}: {}", p.pid, process_difference(p, q)));
        }
    }
    Some("state outside its processes (zombies, shared memory, sockets' peers, cgroups...)".into())
}

fn process_difference(p: &ProcessImage, q: &ProcessImage) -> &'static str {
    let tids = |p: &ProcessImage| p.threads.iter().map(|t| t.tid).collect::<Vec<_>>();
    if tids(p) != tids(q) {
        "its threads"
    } else if p.vmas != q.vmas || p.mm != q.mm {
        "its mappings"
    } else if p.fds != q.fds || p.files.len() != q.files.len() {
        "its fd table"
    } else if p.files != q.files {
        "an open file's state"
    } else if p.threads != q.threads {
        "a thread's state"
    } else if p.signals != q.signals {
        "its signals"
    } else {
        "its other attributes"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_image::{ITimer, OpenFile, ThreadImage, TimerFd};

    fn thread(tid: i32, rip: u64) -> ThreadImage {
        ThreadImage {
            tid,
            comm: "t".into(),
            regs: vec![rip; 27],
            xstate: vec![1, 2, 3],
            sigmask: 0,
            pending: vec![],
            altstack: Default::default(),
            rseq: None,
            robust_list: Default::default(),
            clear_child_tid: 0,
            timer_slack_ns: 50_000,
            sched: Default::default(),
            sleep_remaining_ns: Some(rip),
        }
    }

    fn tree(rip: u64, pos: i64, size: u64) -> TreeImage {
        let files = vec![
            OpenFile {
                id: 1,
                flags: 0,
                pos,
                kind: FileKind::Regular { path: "/var/log/x".into(), size },
                locks: vec![],
            },
            OpenFile {
                id: 2,
                flags: 0,
                pos: 0,
                kind: FileKind::TimerFd(TimerFd {
                    clockid: 1,
                    value_ns: rip,
                    interval_ns: 1000,
                    ticks: rip,
                    settime_flags: 0,
                }),
                locks: vec![],
            },
        ];
        let p = ProcessImage {
            pid: 10,
            threads: vec![thread(10, rip)],
            files,
            itimers: vec![ITimer { which: 0, interval_us: 5, value_us: rip }],
            ..Default::default()
        };
        TreeImage { processes: vec![p], ..Default::default() }
    }

    #[test]
    fn values_the_restore_sets_whatever_they_are_do_not_count() {
        let mut later = tree(0x4000, 4096, 9000);
        let shape = Shape::of(tree(0x1000, 10, 20));
        assert_eq!(shape.0.processes[0].threads[0].regs, Vec::<u64>::new());
        assert_eq!(shape.difference(&mut later), None);
        // Put back as it was.
        assert_eq!(later, tree(0x4000, 4096, 9000));
    }

    #[test]
    fn a_change_of_shape_is_named() {
        let shape = Shape::of(tree(1, 1, 1));
        let mut more_threads = tree(1, 1, 1);
        more_threads.processes[0].threads.push(thread(11, 1));
        assert_eq!(shape.difference(&mut more_threads).as_deref(), Some("pid 10: its threads"));
        let mut new_fd = tree(1, 1, 1);
        new_fd.processes[0].fds.push(ferry_image::FdSlot { fd: 7, file: 0, cloexec: false });
        assert_eq!(shape.difference(&mut new_fd).as_deref(), Some("pid 10: its fd table"));
        let mut interval = tree(1, 1, 1);
        interval.processes[0].itimers[0].interval_us = 6;
        assert_eq!(
            shape.difference(&mut interval).as_deref(),
            Some("pid 10: its other attributes")
        );
        let mut moved_dir = tree(1, 1, 1);
        moved_dir.processes[0].files[0].kind = FileKind::Directory { path: "/".into() };
        let dir_shape = Shape::of(moved_dir.clone());
        moved_dir.processes[0].files[0].pos = 99;
        assert_eq!(
            dir_shape.difference(&mut moved_dir).as_deref(),
            Some("pid 10: an open file's state")
        );
        let mut other_pid = tree(1, 1, 1);
        other_pid.processes[0].pid = 11;
        assert_eq!(shape.difference(&mut other_pid).as_deref(), Some("its processes"));
    }
}
