//! The C conformance programs of tests/conformance/: where they are and
//! how they are compiled (shared by the conformance and migration tests).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

pub fn source_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/conformance")
}

/// The names of every tests/conformance/*.c, sorted.
pub fn programs() -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(source_dir())
        .expect("read tests/conformance")
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let p = e.path();
            (p.extension()? == "c").then(|| p.file_stem().unwrap().to_string_lossy().into_owned())
        })
        .collect();
    v.sort();
    v
}

/// Compiles `tests/conformance/<name>.c` into CARGO_TARGET_TMPDIR and
/// returns the binary path.
pub fn compile(name: &str) -> PathBuf {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let src_dir = source_dir();
    let src = src_dir.join(format!("{name}.c"));
    assert!(src.exists(), "missing conformance source {}", src.display());
    let out_dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("conformance");
    fs::create_dir_all(&out_dir).expect("create conformance build dir");
    let bin = out_dir.join(name);
    // Build under a unique name and rename, so concurrent runs never see a
    // half-written binary.
    let tmp = out_dir.join(format!(
        ".{name}.{}.{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::SeqCst)
    ));
    let out = Command::new("gcc")
        .args(["-O1", "-g", "-pthread", "-Wall"])
        .arg("-I")
        .arg(&src_dir)
        .arg("-o")
        .arg(&tmp)
        .arg(&src)
        .output()
        .unwrap_or_else(|e| panic!("{name}: cannot run gcc: {e}"));
    if !out.status.success() {
        let _ = fs::remove_file(&tmp);
        panic!(
            "{name}: compilation failed ({})\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    fs::rename(&tmp, &bin).expect("rename compiled binary");
    bin
}
