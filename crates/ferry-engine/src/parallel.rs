//! Spreading independent per-object work (one socket, one descriptor)
//! over the worker threads: a server can hold 10,000 connections, and
//! each costs tens of microseconds of syscalls while the service is
//! frozen.

use crate::error::Result;

/// Below this many items one thread does it all: spawning costs more.
const MIN_PER_THREAD: usize = 256;

/// `f` over every item, in order, on up to [`crate::worker_threads`]
/// threads (contiguous chunks). Returns the results in item order, or the
/// error of the first item that failed. Threads inherit the caller's
/// network namespace, so sockets made in `f` belong where the caller is.
pub fn map<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> Result<R> + Sync) -> Result<Vec<R>> {
    let threads = crate::worker_threads().min(items.len() / MIN_PER_THREAD).max(1);
    if threads == 1 {
        return items.iter().map(&f).collect();
    }
    let chunk = items.len().div_ceil(threads);
    let f = &f;
    let parts: Vec<Result<Vec<R>>> = std::thread::scope(|scope| {
        let handles: Vec<_> = items
            .chunks(chunk)
            .map(|c| scope.spawn(move || c.iter().map(f).collect::<Result<Vec<R>>>()))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(crate::EngineError::restore(0, "a worker thread panicked"))
                })
            })
            .collect()
    });
    let mut out = Vec::with_capacity(items.len());
    for part in parts {
        out.extend(part?);
    }
    Ok(out)
}

/// Drops `items` on up to [`crate::worker_threads`] threads: closing
/// the last descriptor of 10,000 sockets costs tens of milliseconds of
/// kernel work, done by the thread that closes it.
pub fn drop_all<T: Send>(mut items: Vec<T>) {
    let threads = crate::worker_threads().min(items.len() / MIN_PER_THREAD).max(1);
    if threads == 1 {
        return;
    }
    let chunk = items.len().div_ceil(threads);
    let mut parts = Vec::with_capacity(threads);
    while items.len() > chunk {
        parts.push(items.split_off(items.len() - chunk));
    }
    parts.push(items);
    std::thread::scope(|scope| {
        for part in parts {
            scope.spawn(move || drop(part));
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
