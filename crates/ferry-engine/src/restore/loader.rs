//! The restore's check's mapping-flags iterator, loaded on a thread of its
//! own while the image is read and the files are staged, and joined
//! before ferry forks (a fork needs ferry single-threaded).
//!
//! Joined, not polled: the fork's own check of "one thread" sleeps a
//! millisecond at a time while another thread is still listed, and the
//! loader used to be left to end by itself, so the first fork of every
//! `ferry restore` waited for it in those steps (1-2 ms).

use std::sync::Mutex;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

static LOADING: Mutex<Option<JoinHandle<()>>> = Mutex::new(None);

/// How long [`join`] waits for a joined thread to leave /proc/self/task
/// (the kernel releases it a few microseconds after the join returns),
/// and the step it polls with.
const RELEASE_WAIT: Duration = Duration::from_millis(20);
const RELEASE_STEP: Duration = Duration::from_micros(20);

/// Starts loading the iterator on its own thread (at most one at a time;
/// nothing when the thread cannot be made: the check loads it itself).
pub(super) fn start() {
    let Ok(mut slot) = LOADING.lock() else { return };
    if slot.is_some() {
        return;
    }
    *slot = std::thread::Builder::new()
        .name("ferry-vma-iter".into())
        .spawn(crate::vm_flags::load_ahead)
        .ok();
}

/// Waits for the loader started by [`start`], if any, to end and leave
/// ferry's thread list. A thread still listed after that is left to the
/// fork's own check, which refuses by name.
pub(super) fn join() {
    let handle = match LOADING.lock() {
        Ok(mut slot) => slot.take(),
        Err(_) => None,
    };
    let Some(handle) = handle else { return };
    let _ = handle.join();
    let deadline = Instant::now() + RELEASE_WAIT;
    while matches!(ferry_sys::clone::thread_count(), Ok(n) if n > 1) && Instant::now() < deadline {
        std::thread::sleep(RELEASE_STEP);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_started_loader_is_joined_once() {
        start();
        join();
        assert!(LOADING.lock().map(|s| s.is_none()).unwrap_or(false));
        // Joining with nothing started returns at once.
        let t = Instant::now();
        join();
        assert!(t.elapsed() < Duration::from_millis(5));
    }
}
