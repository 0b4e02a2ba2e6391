//! Mapping flags read in the freeze without smaps
//! (`ferry_engine::capture::vma_flags`), on a real program with many
//! kinds of flags (`tests/vma_flags_target.c`): after a presurvey, the
//! fast read gives exactly what /proc/PID/smaps shows, also once the
//! program has changed a mapping's flags; a flag the presurvey never saw
//! makes it read smaps instead.
//!
//! Needs root (BPF). When not root the test prints a message and returns.

use ferry_engine::capture::vma_flags::{frozen_smaps, presurvey};
use ferry_engine::procfs;
use ferry_testkit::require_root;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};

/// smaps and the fast read, as comparable text.
fn both(pid: i32, pre: &ferry_engine::capture::vma_flags::Presurveyed) -> (String, String, bool) {
    let (fast, without_smaps) = frozen_smaps(pid, Some(pre)).expect("frozen_smaps");
    let slow = procfs::smaps(pid).expect("smaps");
    (format!("{fast:#?}"), format!("{slow:#?}"), without_smaps)
}

fn compile(tag: &str) -> std::path::PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/vma_flags_target.c");
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(dir).expect("target tmpdir");
    let bin = dir.join(format!("vma_flags_target.{}.{tag}", std::process::id()));
    ferry_testkit::compile_c(&src, &bin);
    bin
}

#[test]
fn more_mappings_than_one_iterator_read_holds_are_read_from_smaps() {
    require_root!();
    let bin = compile("many");
    let mut child = Command::new(&bin)
        .arg("many")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start vma_flags_target");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line).expect("READY");
    assert!(line.starts_with("READY"), "{line:?}");
    let pid = child.id() as i32;
    let t = std::time::Instant::now();
    // On 6.18 a second read of the iterator can return the same mappings
    // forever: the presurvey must give up, quickly, rather than loop.
    assert!(
        presurvey(pid).is_none(),
        "a presurvey of {} mappings proved something",
        procfs::maps(pid).map(|m| m.len()).unwrap_or(0)
    );
    assert!(
        t.elapsed() < std::time::Duration::from_secs(5),
        "the presurvey took {:?}",
        t.elapsed()
    );
    let (got, without_smaps) = frozen_smaps(pid, None).expect("frozen_smaps");
    assert!(!without_smaps && got.len() > 3000);
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_file(&bin);
}

#[test]
fn flags_read_without_smaps_are_smaps_flags() {
    require_root!();
    let bin = compile("flags");
    let mut child = Command::new(&bin)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start vma_flags_target");
    let pid = child.id() as i32;
    let mut input = child.stdin.take().expect("stdin");
    let mut output = BufReader::new(child.stdout.take().expect("stdout"));
    let mut ask = |cmd: Option<&str>| {
        if let Some(c) = cmd {
            writeln!(input, "{c}").expect("send");
        }
        let mut line = String::new();
        output.read_line(&mut line).expect("reply");
        line
    };
    assert!(ask(None).starts_with("READY"));

    let pre = presurvey(pid).expect("the presurvey of an idle program proves its flags (BPF task_vma iterator available as root)");
    let (fast, slow, without_smaps) = both(pid, &pre);
    assert!(without_smaps, "nothing changed since the presurvey, yet smaps was read");
    assert_eq!(fast, slow);
    for f in ["dd", "wf", "lo", "hg", "nh", "dc", "sr", "sh"] {
        assert!(
            slow.contains(&format!("\"{f}\"")),
            "the program has no mapping with {f}: the test proves less than it says"
        );
    }

    // A flag the presurvey saw elsewhere: computed, and right.
    assert_eq!(ask(Some("dd")).trim(), "ok");
    let (fast, slow, without_smaps) = both(pid, &pre);
    assert!(without_smaps, "dd was validated by the presurvey");
    assert_eq!(fast, slow);

    // A flag it never saw: smaps is read, and it is right too.
    assert_eq!(ask(Some("random")).trim(), "ok");
    let (fast, slow, without_smaps) = both(pid, &pre);
    assert!(!without_smaps, "rr was never validated, yet smaps was not read");
    assert_eq!(fast, slow);

    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_file(&bin);
}
