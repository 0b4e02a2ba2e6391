//! The capture/restore pipeline over its image sinks and sources, on a
//! real program (`tests/dirty_target.c`):
//! - a checkpoint into an in-memory image and a restore from it;
//! - an incremental chain on disk (a full image and two children, each
//!   taken with `parent`), restored from its newest image with every page
//!   as the program last wrote it, and refused once a parent changed.
//!
//! Needs root (ptrace). When not root each test prints a message and
//! returns. The checkpoints and restores run in this process, whose
//! forks need it single-threaded: the tests run on the main thread
//! (`harness = false`).

use ferry_engine::capture::{CaptureOptions, LockAfterKill};
use ferry_engine::restore::RestoreOptions;
use ferry_image::{ImageDir, MemoryImage};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

const PG: u64 = 4096;

/// A directory removed on drop, also when the test fails.
struct TempDir(PathBuf);

impl TempDir {
    fn new(what: &str) -> TempDir {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let p =
            std::env::temp_dir().join(format!("ferry-pipeline-{what}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("temp dir");
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The test program, killed on drop (by PID: it is this test's child).
struct Target {
    child: Child,
    input: ChildStdin,
    output: BufReader<ChildStdout>,
    pid: i32,
    a: u64,
    na: u64,
}

impl Target {
    fn start(dir: &Path, mib: u64) -> Target {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/dirty_target.c");
        let bin = dir.join("dirty_target");
        ferry_testkit::compile_c(&src, &bin);
        let mut cmd = Command::new(&bin);
        cmd.arg(mib.to_string());
        // Only stdin, stdout and stderr: a descriptor inherited from the
        // test harness would make a checkpoint refuse it.
        ferry_testkit::only_stdio(&mut cmd);
        let mut child = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().expect("start");
        let input = child.stdin.take().expect("stdin");
        let mut output = BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = String::new();
        output.read_line(&mut line).expect("READY line");
        assert!(line.starts_with("READY"), "unexpected {line:?}");
        let field = |key: &str| {
            line.split_whitespace().find_map(|w| w.strip_prefix(key)).expect("field").to_string()
        };
        let a = u64::from_str_radix(&field("A="), 16).expect("hex");
        let na = field("NA=").parse().expect("pages");
        let pid = child.id() as i32;
        Target { child, input, output, pid, a, na }
    }

    fn cmd(&mut self, c: &str) {
        writeln!(self.input, "{c}").expect("send");
        let mut line = String::new();
        self.output.read_line(&mut line).expect("reply");
        assert!(line.starts_with("ok"), "{c}: {line:?}");
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A restored process, killed and reaped on drop.
struct Restored(i32);

impl Drop for Restored {
    fn drop(&mut self) {
        ferry_testkit::kill_and_reap(self.0);
    }
}

/// Restore options whose stdin and stdout are a FIFO the test holds open
/// both ways: the restored program then waits on it forever.
fn restore_opts(dir: &Path) -> (RestoreOptions, std::fs::File) {
    let fifo = dir.join("stdio");
    ferry_testkit::mkfifo(&fifo);
    let hold = std::fs::OpenOptions::new().read(true).write(true).open(&fifo).expect("fifo");
    (RestoreOptions { tty_to: fifo.to_string_lossy().into_owned(), ..Default::default() }, hold)
}

/// Every page of A in `pid` holds the pattern for `gen(p)` writes.
fn check_pages(pid: i32, a: u64, na: u64, gen: impl Fn(u64) -> u64) {
    let mem = std::fs::File::open(format!("/proc/{pid}/mem")).expect("mem");
    let mut page = vec![0u8; PG as usize];
    for p in 0..na {
        mem.read_exact_at(&mut page, a + p * PG).expect("read restored memory");
        let v = ((p * 31 + gen(p) * 7 + 1) & 0xff) as u8;
        assert!(page.iter().all(|&b| b == v), "restored page {p} differs");
    }
}

fn leave_running() -> CaptureOptions {
    CaptureOptions {
        external_stdio: true,
        parent_sees_exit: true,
        leave_running: true,
        ..Default::default()
    }
}

fn a_checkpoint_into_memory_restores_from_memory() {
    ferry_testkit::require_root!();
    let dir = TempDir::new("memory");
    let mut t = Target::start(&dir.0, 8);
    t.cmd("w 3");
    let mut image = MemoryImage::new();
    let opts =
        CaptureOptions { external_stdio: true, parent_sees_exit: true, ..Default::default() };
    let mut captured =
        ferry_engine::capture::capture(t.pid, &mut image, &opts, None).expect("capture");
    let bytes = captured.write_image(&mut image, None).expect("write image");
    assert!(bytes >= t.na * PG, "image of {bytes} bytes holds less than A");
    captured.kill(LockAfterKill::Release).expect("kill");
    let _ = t.child.wait();
    let (ropts, _hold) = restore_opts(&dir.0);
    let r = ferry_engine::restore::restore_from(&mut image, &ropts).expect("restore from memory");
    let restored = Restored(r.host_pid.0);
    check_pages(restored.0, t.a, t.na, |p| u64::from(p % 3 == 0));
}

fn an_incremental_chain_restores_exactly_and_refuses_a_changed_parent() {
    ferry_testkit::require_root!();
    let dir = TempDir::new("chain");
    let (full, child1, child2) = (dir.0.join("full"), dir.0.join("c1"), dir.0.join("c2"));
    let mut t = Target::start(&dir.0, 16);
    ferry_engine::capture::checkpoint(t.pid, &full, &leave_running()).expect("full checkpoint");
    t.cmd("w 3");
    let opts = CaptureOptions { parent: Some(full.clone()), ..leave_running() };
    ferry_engine::capture::checkpoint(t.pid, &child1, &opts).expect("first child");
    t.cmd("w 5");
    let opts = CaptureOptions {
        parent: Some(child1.clone()),
        external_stdio: true,
        parent_sees_exit: true,
        ..Default::default()
    };
    ferry_engine::capture::checkpoint(t.pid, &child2, &opts).expect("second child, tree killed");
    let _ = t.child.wait();

    // Each child holds little more than the pages written since its parent.
    let size = |d: &Path| ImageDir::new(d).read_meta_full().expect("meta").0.pages_bytes;
    let a_bytes = t.na * PG;
    assert!(size(&full) >= a_bytes, "the full image holds less than A");
    for (d, written) in [(&child1, t.na.div_ceil(3)), (&child2, t.na.div_ceil(5))] {
        let (.., inc) = ImageDir::new(d).read_meta_full().expect("meta");
        assert!(inc.is_some(), "{} is not incremental", d.display());
        assert!(
            size(d) < written * PG + a_bytes / 4,
            "{} holds {} bytes for {written} written pages",
            d.display(),
            size(d)
        );
    }

    // A parent that changed is refused by name.
    let link = child2.join(ferry_image::dir::PARENT_LINK);
    std::fs::remove_file(&link).expect("unlink");
    std::os::unix::fs::symlink(&full, &link).expect("link to the wrong parent");
    let (ropts, _hold) = restore_opts(&dir.0);
    let err = ferry_engine::restore::restore(&child2, &ropts).expect_err("a changed parent");
    assert!(err.to_string().contains("changed since"), "{err}");
    std::fs::remove_file(&link).expect("unlink");
    std::os::unix::fs::symlink(&child1, &link).expect("link back");

    let r = ferry_engine::restore::restore(&child2, &ropts).expect("restore of the chain");
    let restored = Restored(r.host_pid.0);
    check_pages(restored.0, t.a, t.na, |p| u64::from(p % 3 == 0) + u64::from(p % 5 == 0));
}

fn main() {
    ferry_testkit::run_on_main_thread(&[
        (
            "a_checkpoint_into_memory_restores_from_memory",
            a_checkpoint_into_memory_restores_from_memory,
        ),
        (
            "an_incremental_chain_restores_exactly_and_refuses_a_changed_parent",
            an_incremental_chain_restores_exactly_and_refuses_a_changed_parent,
        ),
    ]);
}
