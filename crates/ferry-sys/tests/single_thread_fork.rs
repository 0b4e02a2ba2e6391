//! The forks of ferry_sys::clone run only when the caller is its
//! process's only thread, and InheritedRegions::unmap only in a process
//! other than the regions' owner.
//!
//! No libtest harness: it runs every test on a thread of its own, so the
//! process would never be single-threaded. `main` runs the checks in turn
//! on the main thread; a failed check panics (exit code 101).

use ferry_sys::clone::{fork_into_namespaces, fork_with_pid, SEVERAL_THREADS};
use ferry_sys::placed::PlacedRegion;
use ferry_sys::process::{exit_now, wait_pid};
use std::sync::mpsc;

fn main() {
    ferry_testkit::run_on_main_thread(&[
        ("fork_runs_when_alone", fork_runs_when_alone),
        ("fork_refuses_while_a_second_thread_runs", fork_refuses_while_a_second_thread_runs),
        ("fork_runs_again_once_the_thread_is_joined", fork_runs_again_once_the_thread_is_joined),
        ("inherited_regions_unmap_only_outside_their_owner", inherited_regions_unmap),
    ]);
}

/// Forks a child that exits with `code()` and returns what it exited with.
fn fork_and_wait(code: impl FnOnce() -> i32) -> i32 {
    match fork_into_namespaces(0) {
        Ok(0) => exit_now(code()),
        Ok(pid) => wait_pid(pid).expect("waiting for the forked child"),
        Err(e) => panic!("fork refused: {e}"),
    }
}

fn fork_runs_when_alone() {
    assert_eq!(fork_and_wait(|| 7), 7);
}

fn fork_refuses_while_a_second_thread_runs() {
    let (tx, rx) = mpsc::channel::<()>();
    let t = std::thread::spawn(move || rx.recv());
    for r in [fork_into_namespaces(0), fork_with_pid(1 << 22)] {
        let e = r.expect_err("a fork beside a running thread was not refused");
        assert_eq!((e.call, e.errno), (SEVERAL_THREADS, libc::EBUSY), "{e}");
    }
    drop(tx);
    let _ = t.join();
}

fn fork_runs_again_once_the_thread_is_joined() {
    let t = std::thread::spawn(|| 1 + 1);
    assert_eq!(t.join().expect("thread"), 2);
    assert_eq!(fork_and_wait(|| 0), 0);
}

/// Whether /proc/self/maps lists a mapping that starts at `addr`.
fn mapped_at(addr: u64) -> bool {
    let maps = std::fs::read_to_string("/proc/self/maps").expect("read /proc/self/maps");
    let start = format!("{addr:x}-");
    maps.lines().any(|l| l.starts_with(&start))
}

fn inherited_regions_unmap() {
    // An address far from where the kernel places mappings by itself.
    let addr = 0x3a5e_0000_0000u64;
    let mut region = PlacedRegion::map(addr, 2 * 4096).expect("map the placed region");
    region.write(4096, b"ours").expect("write");
    let inherited = PlacedRegion::inherited(&[&region]);

    // In the owner, unmap refuses and the region stays.
    let e = inherited.clone().unmap().expect_err("unmap in the owner was not refused");
    assert_eq!(e.errno, libc::EPERM, "{e}");
    assert!(mapped_at(addr), "the owner's region was unmapped");

    // In a forked child, it drops the child's copy.
    let code = fork_and_wait(move || match inherited.unmap() {
        Ok(()) if !mapped_at(addr) => 0,
        Ok(()) => 2,
        Err(_) => 3,
    });
    assert_eq!(code, 0, "the child could not drop its copy (2: still mapped, 3: refused)");
    let mut buf = [0u8; 4];
    region.read(4096, &mut buf).expect("read");
    assert_eq!(&buf, b"ours", "the owner's region changed");
}
