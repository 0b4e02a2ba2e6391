//! Spreading independent per-object work (one socket, one descriptor)
//! over the worker threads: a server can hold 10,000 connections, and
//! each costs tens of microseconds of syscalls while the service is
//! frozen.

use crate::error::Result;

/// Below this many items one thread does it all: spawning costs more.
const MIN_PER_THREAD: usize = 256;

/// Blocks per thread that [`map`] hands out: a thread that gets less
/// of a CPU (the host's other work, the kernel's deferred frees) takes
/// fewer blocks instead of holding the others up at the end.
const BLOCKS_PER_THREAD: usize = 32;

/// One block of items and what `f` gave for them.
type Block<R> = (usize, Result<Vec<R>>);

/// `f` over every item, in order, on up to [`crate::worker_threads`]
/// threads, each taking the next block of items as it finishes one.
/// Returns the results in item order, or the error of the first item
/// that failed (no block after a failure is started; every block before
/// it was taken earlier and runs to its end). Threads inherit the
/// caller's network namespace, so sockets made in `f` belong where the
/// caller is.
pub fn map<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> Result<R> + Sync) -> Result<Vec<R>> {
    let threads = crate::worker_threads().min(items.len() / MIN_PER_THREAD).max(1);
    if threads == 1 {
        return items.iter().map(&f).collect();
    }
    let block = block_len(items.len(), threads);
    let next = std::sync::atomic::AtomicUsize::new(0);
    let failed = std::sync::atomic::AtomicBool::new(false);
    let work = || -> Vec<Block<R>> {
        use std::sync::atomic::Ordering::Relaxed;
        let mut done = Vec::new();
        while !failed.load(Relaxed) {
            let start = next.fetch_add(block, Relaxed);
            if start >= items.len() {
                break;
            }
            let end = (start + block).min(items.len());
            let r: Result<Vec<R>> = items[start..end].iter().map(&f).collect();
            if r.is_err() {
                failed.store(true, Relaxed);
            }
            done.push((start, r));
        }
        done
    };
    let work = &work;
    let joined: Vec<std::thread::Result<Vec<Block<R>>>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads).map(|_| scope.spawn(work)).collect();
        handles.into_iter().map(|h| h.join()).collect()
    });
    let mut blocks = Vec::new();
    for j in joined {
        // A panicked thread's block is lost: no result can be whole.
        let done = j.map_err(|_| crate::EngineError::restore(0, "a worker thread panicked"))?;
        blocks.extend(done);
    }
    blocks.sort_unstable_by_key(|b| b.0);
    let mut out = Vec::with_capacity(items.len());
    for (_, part) in blocks {
        out.extend(part?);
    }
    Ok(out)
}

/// How many items one block of [`map`] holds.
fn block_len(items: usize, threads: usize) -> usize {
    (items / (threads * BLOCKS_PER_THREAD)).max(1)
}

/// Drops `items` on up to [`crate::worker_threads`] threads: closing
/// the last descriptor of 10,000 sockets costs tens of milliseconds of
/// kernel work, done by the thread that closes it.
pub fn drop_all<T: Send>(mut items: Vec<T>) {
    let threads = crate::worker_threads().min(items.len() / MIN_PER_THREAD).max(1);
    if threads == 1 {
        return;
    }
    // In blocks taken one at a time, as in [`map`].
    let block = block_len(items.len(), threads);
    let mut parts = Vec::with_capacity(items.len().div_ceil(block));
    while items.len() > block {
        parts.push(items.split_off(items.len() - block));
    }
    parts.push(items);
    let parts = std::sync::Mutex::new(parts);
    let next = || parts.lock().unwrap_or_else(std::sync::PoisonError::into_inner).pop();
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                while let Some(part) = next() {
                    drop(part);
                }
            });
        }
    });
}

/// Threads left to finish work nobody waits for (closing counters: each
/// last close waits for an RCU grace period), joined by
/// [`join_detached`].
static DETACHED: std::sync::Mutex<Vec<std::thread::JoinHandle<()>>> =
    std::sync::Mutex::new(Vec::new());

/// Runs `f` on a thread of its own, named `name`; here when none can be
/// made.
pub fn detach(name: &str, f: impl FnOnce() + Send + 'static) {
    // The closure comes back when the thread cannot start.
    let f = std::sync::Arc::new(std::sync::Mutex::new(Some(f)));
    let g = f.clone();
    let spawned = std::thread::Builder::new().name(name.into()).spawn(move || {
        if let Some(f) = g.lock().unwrap_or_else(|e| e.into_inner()).take() {
            f()
        }
    });
    match spawned {
        Ok(handle) => DETACHED.lock().unwrap_or_else(|e| e.into_inner()).push(handle),
        Err(e) => {
            tracing::debug!("{name} here: {e}");
            if let Some(f) = f.lock().unwrap_or_else(|e| e.into_inner()).take() {
                f()
            }
        }
    }
}

/// Waits for every thread [`detach`] started: before ferry forks, which
/// it can only do as its process's one thread.
pub fn join_detached() {
    let handles = std::mem::take(&mut *DETACHED.lock().unwrap_or_else(|e| e.into_inner()));
    if handles.is_empty() {
        return;
    }
    let t = std::time::Instant::now();
    for h in handles {
        let _ = h.join();
    }
    tracing::debug!("detached threads joined in {:.1} ms", t.elapsed().as_secs_f64() * 1e3);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_order_and_reports_the_first_error() {
        let items: Vec<u32> = (0..5000).collect();
        let doubled = map(&items, |&x| Ok(x * 2)).expect("no error");
        assert_eq!(doubled, items.iter().map(|x| x * 2).collect::<Vec<_>>());
        let err = map(&items, |&x| {
            if x == 4000 || x == 100 {
                Err(crate::EngineError::restore(x as i32, "bad"))
            } else {
                Ok(x)
            }
        });
        assert!(matches!(err, Err(crate::EngineError::Restore { pid: 100, .. })));
        assert!(map(&[] as &[u32], |&x| Ok(x)).expect("empty").is_empty());
        // Uneven work: the results still come back in item order.
        let slow: Vec<u64> = (0..3000).collect();
        let got = map(&slow, |&x| {
            if x % 500 == 0 {
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            Ok(x + 1)
        })
        .expect("no error");
        assert_eq!(got, slow.iter().map(|x| x + 1).collect::<Vec<_>>());
        assert_eq!(block_len(10_000, 2), 156);
        assert_eq!(block_len(300, 4), 2);
        let dropped = std::sync::atomic::AtomicUsize::new(0);
        struct Counted<'a>(&'a std::sync::atomic::AtomicUsize);
        impl Drop for Counted<'_> {
            fn drop(&mut self) {
                self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
        drop_all((0..5000).map(|_| Counted(&dropped)).collect());
        drop_all((0..3).map(|_| Counted(&dropped)).collect());
        assert_eq!(dropped.load(std::sync::atomic::Ordering::Relaxed), 5003);
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let d = done.clone();
        detach("test-detached", move || d.store(true, std::sync::atomic::Ordering::Release));
        join_detached();
        assert!(done.load(std::sync::atomic::Ordering::Acquire));
    }
}
