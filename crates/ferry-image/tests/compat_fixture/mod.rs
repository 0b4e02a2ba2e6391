//! The image the compatibility tests use: a tree of two processes with
//! page data, built the same way every time (the format-4.0 fixture in
//! tests/fixtures/format-4.0/ was written from exactly this model).

#![allow(dead_code)]

use ferry_image::container::checksum;
use ferry_image::model::*;

pub const ROOT: i32 = 777;
pub const CHILD: i32 = 780;
pub const PAGE: u64 = 4096;

/// Root: heap 0x60_0000 (8 pages, runs on its first 2), stack
/// 0x7ffd_0000_0000.. (32 pages, run on the top one).
pub const ROOT_HEAP: u64 = 0x60_0000;
pub const ROOT_HEAP_PAGES: u64 = 8;
pub const ROOT_STACK_TOP: u64 = 0x7ffd_0002_0000;
/// Child: one anonymous mapping 0x90_0000 (4 pages, run on page 1).
pub const CHILD_MAP: u64 = 0x90_0000;

fn thread(tid: i32) -> ThreadImage {
    ThreadImage {
        tid,
        comm: "compat".into(),
        regs: (0..27).collect(),
        xstate: vec![0x5a; 576],
        sigmask: 0,
        pending: vec![],
        altstack: AltStack::default(),
        rseq: None,
        robust_list: RobustList::default(),
        clear_child_tid: 0,
        timer_slack_ns: 50_000,
        sched: Default::default(),
        sleep_remaining_ns: None,
    }
}

fn anon(start: u64, end: u64) -> Vma {
    Vma {
        start,
        end,
        prot: PROT_READ | PROT_WRITE,
        shared: false,
        flags: 0,
        pgoff: 0,
        backing: VmaBacking::Anonymous,
    }
}

fn process(pid: i32, ppid: i32, vmas: Vec<Vma>, page_runs: Vec<PageRun>) -> ProcessImage {
    ProcessImage {
        pid,
        ppid,
        pgid: ROOT,
        sid: ROOT,
        comm: "compat".into(),
        exe: "/usr/bin/compat".into(),
        cwd: "/".into(),
        umask: 0o022,
        personality: 0,
        no_new_privs: false,
        creds: Creds {
            uids: [1000; 4],
            gids: [1000; 4],
            groups: vec![1000],
            caps: Default::default(),
        },
        rlimits: vec![Rlimit { resource: 7, soft: 1024, hard: 4096 }],
        threads: vec![thread(pid)],
        mm: MmLayout { auxv: vec![6, 4096, 0, 0], ..Default::default() },
        vmas,
        page_runs,
        files: vec![OpenFile {
            id: 1,
            flags: 0,
            pos: 0,
            locks: vec![],
            kind: FileKind::EventFd { count: 3, semaphore: false },
        }],
        fds: vec![FdSlot { fd: 3, file: 0, cloexec: true }],
        signals: SignalState { actions: vec![SigAction::default(); 64], shared_pending: vec![] },
        itimers: vec![],
        posix_timers: vec![],
        misc: ProcessMisc::default(),
        memfds: vec![],
        inherited: vec![],
        root: None,
        fidelity: Default::default(),
    }
}

/// Page data different on every page.
pub fn fill_pages(npages: usize) -> Vec<u8> {
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    (0..npages * PAGE as usize)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// The image: inventory (with `format_version` = `format_version`), tree
/// and page data area (4 pages: root heap 2, root stack 1, child 1).
pub fn image(format_version: u32) -> (Inventory, TreeImage, Vec<u8>) {
    let pages = fill_pages(4);
    let p = PAGE as usize;
    let run = |start: u64, first: usize, n: usize| PageRun {
        start,
        pages: n as u64,
        offset: (first * p) as u64,
        checksum: checksum(&pages[first * p..(first + n) * p]),
    };
    let root = process(
        ROOT,
        1,
        vec![
            Vma {
                start: 0x40_0000,
                end: 0x40_1000,
                prot: PROT_READ | PROT_EXEC,
                shared: false,
                flags: 0,
                pgoff: 0,
                backing: VmaBacking::File { path: "/usr/bin/compat".into(), dev: 1, ino: 2 },
            },
            anon(ROOT_HEAP, ROOT_HEAP + ROOT_HEAP_PAGES * PAGE),
            anon(ROOT_STACK_TOP - 32 * PAGE, ROOT_STACK_TOP),
        ],
        vec![run(ROOT_HEAP, 0, 2), run(ROOT_STACK_TOP - PAGE, 2, 1)],
    );
    let child = process(
        CHILD,
        ROOT,
        vec![anon(CHILD_MAP, CHILD_MAP + 4 * PAGE)],
        vec![run(CHILD_MAP + PAGE, 3, 1)],
    );
    let inv = Inventory {
        format_version,
        ferry_version: "0.1.0".into(),
        kernel_release: "6.1.0".into(),
        arch: "x86_64".into(),
        xsave_size: 576,
        created_unix_ms: 1_700_000_000_000,
        source_pid: ROOT,
        pages_bytes: pages.len() as u64,
    };
    let t = TreeImage { processes: vec![root, child], ..Default::default() };
    (inv, t, pages)
}
