//! Speed of the page checksum (XXH3-64) on 100 MiB, in 256 KiB runs (the
//! checkpoint's run size) and in one piece; best of 7.
//!
//! cargo run --release -p ferry-image --example hash_speed
//! RUSTFLAGS="-C target-feature=+avx2" cargo run --release -p ferry-image --example hash_speed --target-dir target/avx2
fn main() {
    let v: Vec<u8> = (0..100u64 << 20).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
    for chunk in [256usize << 10, 100 << 20] {
        let mut best = f64::MAX;
        let mut x = 0u64;
        for _ in 0..7 {
            let t = std::time::Instant::now();
            for c in v.chunks(chunk) {
                x = x.rotate_left(1) ^ ferry_image::container::checksum(c);
            }
            best = best.min(t.elapsed().as_secs_f64() * 1e3);
        }
        println!(
            "runs of {} KiB: 100 MiB in {best:.2} ms ({:.1} GB/s) [{x:x}]",
            chunk >> 10,
            104.857_6 / best
        );
    }
}
