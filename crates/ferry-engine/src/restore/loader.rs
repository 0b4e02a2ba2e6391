//! The restore's check's mapping-flags iterator, loaded on a thread of its
//! own while ferry drives the restored process, and joined before ferry
//! forks again (a fork needs ferry single-threaded) and when the restore
//! ends.
//!
//! Started after the root's fork, not before: `ferry restore` used to
//! start it while the image was read and left it to end by itself, and
//! the root's fork, which waits for ferry to be its only thread in
//! millisecond steps, waited for it (1-4 ms on a quiet machine). After
//! the fork ferry itself forks nothing more (children are forked by their
//! restored parents), and the check, the iterator's first user, waits
//! for the load only if it has not ended by then.

use std::sync::Mutex;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

enum State {
    Idle,
    Wanted,
    Running(JoinHandle<()>),
    /// This restore's check reads the flags from smaps: the tree is too
    /// small for the load to pay ([`choose`]).
    BySmaps,
}

/// Up to this many stored pages and mappings in the whole tree, the
/// check reads each process's smaps (about 0.1 ms for a small server)
/// rather than load the iterator (a BPF program loaded and verified,
/// 0.5-1 ms of CPU beside the restore, on a machine of 2 vCPUs taken
/// from the restore itself when it is busy). smaps walks every page, so
/// a large tree is read by the iterator, as before.
const SMAPS_MAX_PAGES: u64 = 2_048;
const SMAPS_MAX_MAPPINGS: usize = 512;

static LOADING: Mutex<State> = Mutex::new(State::Idle);

/// How long [`join`] waits for a joined thread to leave /proc/self/task
/// (the kernel releases it a few microseconds after the join returns),
/// and the step it polls with.
const RELEASE_WAIT: Duration = Duration::from_millis(20);
const RELEASE_STEP: Duration = Duration::from_micros(20);

/// For a `ferry restore` that checks itself: asks for the iterator to be
/// loaded once the root is forked, or, for a small tree, for the check to
/// read smaps instead.
pub(super) fn choose(tree: &ferry_image::TreeImage) {
    let small = reads_smaps(tree);
    if let Ok(mut state) = LOADING.lock() {
        if matches!(*state, State::Idle | State::BySmaps) {
            *state = if small { State::BySmaps } else { State::Wanted };
        }
    }
}

fn reads_smaps(tree: &ferry_image::TreeImage) -> bool {
    let pages: u64 = tree.processes.iter().flat_map(|p| &p.page_runs).map(|r| r.pages).sum();
    let mappings: usize = tree.processes.iter().map(|p| p.vmas.len()).sum();
    pages <= SMAPS_MAX_PAGES && mappings <= SMAPS_MAX_MAPPINGS
}

/// Whether this restore's check reads mapping flags from smaps alone.
pub(super) fn by_smaps() -> bool {
    LOADING.lock().map(|s| matches!(*s, State::BySmaps)).unwrap_or(false)
}

/// Starts the load asked for by [`choose`], on its own thread (nothing
/// when the thread cannot be made: the check loads it itself). Returns
/// a guard that joins it, however the restore ends.
pub(super) fn start_if_wanted() -> Joined {
    spawn_if_wanted();
    Joined
}

/// For a `ferry restore` of the image in `dir` that checks itself: when
/// its pages file alone says the tree is past smaps' size, the load
/// starts now, beside the reading of the image, which takes longer than
/// the load, so the root's fork finds it done. (Started after the fork,
/// the check of a 15 MiB server waited 1-1.5 ms for it.)
pub(super) fn start_early(dir: &std::path::Path) {
    let pages = dir.join(ferry_image::dir::PAGES_FILE);
    if !std::fs::metadata(pages).is_ok_and(|m| m.len() > SMAPS_MAX_PAGES * 4096) {
        return;
    }
    if let Ok(mut state) = LOADING.lock() {
        if matches!(*state, State::Idle) {
            *state = State::Wanted;
        }
    }
    spawn_if_wanted();
}

fn spawn_if_wanted() {
    if let Ok(mut state) = LOADING.lock() {
        if matches!(*state, State::Wanted) {
            *state = match std::thread::Builder::new()
                .name("ferry-vma-iter".into())
                .spawn(crate::vm_flags::load_ahead)
            {
                Ok(handle) => State::Running(handle),
                Err(_) => State::Idle,
            };
        }
    }
}

/// Joins the loader when dropped, and forgets the choice of smaps: the
/// next restore of this ferry process chooses again.
pub(super) struct Joined;

impl Drop for Joined {
    fn drop(&mut self) {
        join();
        if let Ok(mut state) = LOADING.lock() {
            if matches!(*state, State::BySmaps) {
                *state = State::Idle;
            }
        }
    }
}

/// Waits for a running loader, if any, to end and leave ferry's thread
/// list.
pub(super) fn join() {
    if join_loader() {
        settle();
    }
}

/// Before a fork of ferry's: joins the loader, and waits in fine steps
/// for threads that were joined (the loader, the image's verification
/// threads) to leave ferry's thread list, which the fork's own check
/// would wait for in 1 ms steps. A thread still listed after that is
/// left to that check, which refuses by name.
pub(super) fn before_fork() {
    join_loader();
    settle();
}

/// Joins the loader thread if one runs; whether one did.
fn join_loader() -> bool {
    let handle = match LOADING.lock() {
        Ok(mut state) => match std::mem::replace(&mut *state, State::Idle) {
            State::Running(handle) => Some(handle),
            other => {
                *state = other;
                None
            }
        },
        Err(_) => None,
    };
    let Some(handle) = handle else { return false };
    let _ = handle.join();
    true
}

fn settle() {
    let deadline = Instant::now() + RELEASE_WAIT;
    while matches!(ferry_sys::clone::thread_count(), Ok(n) if n > 1) && Instant::now() < deadline {
        std::thread::sleep(RELEASE_STEP);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn idle() -> bool {
        LOADING.lock().map(|s| matches!(*s, State::Idle)).unwrap_or(false)
    }

    #[test]
    fn a_wanted_load_starts_after_the_fork_and_is_joined_with_its_guard() {
        // Nothing wanted: nothing started, the guard joins nothing.
        drop(start_if_wanted());
        assert!(idle());
        // Wanted: a join before the start (the root's fork) finds nothing
        // running and leaves the wish; the guard of the start joins it.
        *LOADING.lock().unwrap_or_else(|e| e.into_inner()) = State::Wanted;
        join();
        assert!(LOADING.lock().map(|s| matches!(*s, State::Wanted)).unwrap_or(false));
        let guard = start_if_wanted();
        assert!(LOADING.lock().map(|s| matches!(*s, State::Running(_))).unwrap_or(false));
        drop(guard);
        assert!(idle());
    }

    #[test]
    fn a_small_tree_is_checked_from_smaps_and_a_large_one_by_the_iterator() {
        let mut tree = ferry_image::TreeImage::default();
        let mut p = ferry_image::ProcessImage::default();
        p.page_runs.push(ferry_image::PageRun { start: 0, pages: 25, offset: 0, checksum: 0 });
        tree.processes.push(p.clone());
        assert!(reads_smaps(&tree));
        p.page_runs[0].pages = SMAPS_MAX_PAGES;
        tree.processes.push(p);
        assert!(!reads_smaps(&tree));
    }
}
