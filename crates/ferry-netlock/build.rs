//! Compiles the network lock's BPF program (bpf/netlock.bpf.c) with the
//! system's clang into OUT_DIR/netlock.bpf.o; src/ebpf.rs embeds that object
//! with include_bytes!. clang and libbpf's headers come from Debian packages
//! (clang, libbpf-dev: see scripts/install-deps.sh).

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let source = "bpf/netlock.bpf.c";
    println!("cargo:rerun-if-changed={source}");
    println!("cargo:rerun-if-env-changed=CLANG");
    let clang = std::env::var("CLANG").unwrap_or_else(|_| "clang".to_string());
    let out_dir =
        PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR for build scripts"));
    let object = out_dir.join("netlock.bpf.o");

    // Debian keeps asm/types.h under the multiarch directory, which a
    // `-target bpf` compilation does not search by default.
    let multiarch = format!(
        "/usr/include/{}-linux-gnu",
        std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_else(|_| "x86_64".into())
    );
    // The object's debug info names the source's directory: mapped to
    // ".", so that every checkout of the same source builds the same
    // object. Its hash names the lock's base (src/base.rs): builds from
    // two checkouts share one base instead of each removing the other's
    // as another build's, unused, at every start.
    let crate_dir = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| ".".into());
    let result = Command::new(&clang)
        .args(["-O2", "-g", "-target", "bpf", "-Wall"])
        .arg(format!("-ffile-prefix-map={crate_dir}=."))
        .arg("-I")
        .arg(&multiarch)
        .args(["-c", source, "-o"])
        .arg(&object)
        .status();
    match result {
        Ok(status) if status.success() => {}
        Ok(status) => panic!(
            "\n\nferry-netlock: `{clang} -O2 -g -target bpf -c {source}` failed ({status}).\n\
             The BPF program needs libbpf's headers (<bpf/bpf_helpers.h>) and the kernel UAPI headers:\n\
             install them with `apt-get install libbpf-dev linux-libc-dev` (or run scripts/install-deps.sh).\n\n"
        ),
        Err(e) => panic!(
            "\n\nferry-netlock: cannot run `{clang}` to compile the network lock's BPF program ({source}): {e}.\n\
             Install clang with `apt-get install clang llvm libbpf-dev` (or run scripts/install-deps.sh),\n\
             or point the CLANG environment variable at a clang that can target bpf.\n\n"
        ),
    }
}
