//! Writes the seed inputs of every target to seeds/<target>/ (or to the
//! directory given as the first argument).
use std::path::PathBuf;

fn main() {
    let root = std::env::args().nth(1).map(PathBuf::from).unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("seeds"));
    for t in ferry_image_fuzz::TARGETS {
        let dir = root.join(t);
        std::fs::create_dir_all(&dir).expect("create seed dir");
        for (name, bytes) in ferry_image_fuzz::seeds(t) {
            std::fs::write(dir.join(&name), &bytes).expect("write seed");
        }
        println!("{}: {} seeds", dir.display(), ferry_image_fuzz::seeds(t).len());
    }
}
