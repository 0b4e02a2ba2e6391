//! Runs the fuzz targets without libFuzzer (works on stable): random and
//! mutated inputs from a xorshift generator, mutation bases being the
//! seeds, the files in seeds/<target>/ and inputs that were interesting
//! enough to keep (new (target, outcome-kind) pairs are not tracked; this is
//! a blind mutational fuzzer, meant as a smoke test and a fallback).
//!
//!   cargo run --release --bin fuzz-stable -- [--target NAME] [--iters N]
//!       [--time SECS] [--seed S] [--artifacts DIR] [FILE...]
//!
//! With FILEs, runs each file through the target once (reproducing a crash).
//! Panics are caught, the input is written to the artifacts directory
//! (default fuzz/artifacts-found/) and the run goes on; the exit code is 1
//! if any target panicked.

use std::panic::{self, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }
}

const INTERESTING: &[u64] = &[0, 1, 0x7f, 0x80, 0xff, 0x1000, 0xffff, 0x7fff_ffff, 0xffff_ffff, 1 << 52, u64::MAX, u64::MAX - 4095];

fn mutate(rng: &mut Rng, base: &[u8], pool: &[Vec<u8>]) -> Vec<u8> {
    let mut v = base.to_vec();
    let n = 1 + rng.below(8);
    for _ in 0..n {
        let len = v.len();
        match rng.below(10) {
            0 if len > 0 => {
                let i = rng.below(len);
                v[i] ^= 1 << rng.below(8);
            }
            1 if len > 0 => {
                let i = rng.below(len);
                v[i] = rng.next() as u8;
            }
            2 => {
                let i = rng.below(len + 1);
                v.insert(i, rng.next() as u8);
            }
            3 if len > 0 => {
                let i = rng.below(len);
                let k = 1 + rng.below(16.min(len - i));
                v.drain(i..i + k);
            }
            4 => v.truncate(rng.below(len + 1)),
            5 if len > 0 => {
                // Write an interesting little-endian integer.
                let x = INTERESTING[rng.below(INTERESTING.len())].to_le_bytes();
                let w = [1, 2, 4, 8][rng.below(4)];
                let i = rng.below(len);
                for k in 0..w {
                    if i + k < v.len() {
                        v[i + k] = x[k];
                    }
                }
            }
            6 if len > 0 => {
                // A long varint: absurd postcard lengths and counts.
                let i = rng.below(len);
                for k in 0..1 + rng.below(10) {
                    if i + k < v.len() {
                        v[i + k] = 0xff;
                    }
                }
            }
            7 if !pool.is_empty() => {
                // Splice with another input.
                let other = &pool[rng.below(pool.len())];
                let cut = rng.below(v.len() + 1);
                let from = rng.below(other.len() + 1);
                v.truncate(cut);
                v.extend_from_slice(&other[from..]);
            }
            8 if len > 0 => {
                let i = rng.below(len);
                v[i] = v[i].wrapping_add(1 + rng.below(3) as u8).wrapping_sub(2);
            }
            _ => {
                let i = rng.below(len + 1);
                let k = rng.below(8);
                for _ in 0..k {
                    v.insert(i.min(v.len()), rng.next() as u8);
                }
            }
        }
    }
    if v.len() > 1 << 16 {
        v.truncate(1 << 16);
    }
    v
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn main() {
    let mut targets: Vec<String> = ferry_image_fuzz::TARGETS.iter().map(|s| s.to_string()).collect();
    let mut iters: u64 = 300_000;
    let mut time: Option<Duration> = None;
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut artifacts = manifest.join("artifacts-found");
    let mut files: Vec<PathBuf> = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--target" => targets = vec![args.next().expect("--target NAME")],
            "--iters" => iters = args.next().expect("--iters N").parse().expect("number"),
            "--time" => time = Some(Duration::from_secs(args.next().expect("--time SECS").parse().expect("number"))),
            "--seed" => seed = args.next().expect("--seed S").parse().expect("number"),
            "--artifacts" => artifacts = PathBuf::from(args.next().expect("--artifacts DIR")),
            f => files.push(PathBuf::from(f)),
        }
    }

    // Keep panic messages out of the way; record the last one.
    let last_panic: Arc<Mutex<String>> = Arc::new(Mutex::new(String::new()));
    {
        let last_panic = last_panic.clone();
        panic::set_hook(Box::new(move |info| {
            *last_panic.lock().unwrap() = info.to_string();
        }));
    }

    if !files.is_empty() {
        let mut failed = false;
        for t in &targets {
            for f in &files {
                let data = std::fs::read(f).expect("read input");
                if panic::catch_unwind(|| ferry_image_fuzz::run_target(t, &data)).is_err() {
                    failed = true;
                    println!("{t} {}: PANIC {}", f.display(), last_panic.lock().unwrap());
                } else {
                    println!("{t} {}: ok", f.display());
                }
            }
        }
        std::process::exit(failed as i32);
    }

    let mut any_panic = false;
    for t in &targets {
        let mut rng = Rng(seed ^ (t.len() as u64).wrapping_mul(0x2545_f491_4f6c_dd1d) | 1);
        let mut pool: Vec<Vec<u8>> = ferry_image_fuzz::seeds(t).into_iter().map(|s| s.1).collect();
        if let Ok(rd) = std::fs::read_dir(manifest.join("seeds").join(t)) {
            for e in rd.flatten() {
                if let Ok(b) = std::fs::read(e.path()) {
                    pool.push(b);
                }
            }
        }
        let start = Instant::now();
        let mut execs = 0u64;
        let mut panics: Vec<String> = Vec::new();
        loop {
            match time {
                Some(d) if start.elapsed() >= d => break,
                None if execs >= iters => break,
                _ => {}
            }
            let input = if rng.below(8) == 0 {
                let len = rng.below(2048);
                (0..len).map(|_| rng.next() as u8).collect()
            } else {
                let base = pool[rng.below(pool.len())].clone();
                mutate(&mut rng, &base, &pool)
            };
            execs += 1;
            let r = panic::catch_unwind(AssertUnwindSafe(|| ferry_image_fuzz::run_target(t, &input)));
            if r.is_err() {
                let msg = last_panic.lock().unwrap().clone();
                // One artifact per distinct panic location.
                let loc = msg.lines().next().unwrap_or("").to_string();
                if !panics.contains(&loc) {
                    std::fs::create_dir_all(&artifacts).ok();
                    let path = artifacts.join(format!("stable-{t}-{}", panics.len()));
                    std::fs::write(&path, &input).ok();
                    println!("{t}: PANIC after {execs} execs: {msg}\n  input ({} bytes) -> {}\n  hex: {}", input.len(), path.display(), hex(&input[..input.len().min(256)]));
                    panics.push(loc);
                }
                any_panic = true;
            } else if rng.below(64) == 0 && pool.len() < 4096 {
                // Keep some inputs as mutation bases (no coverage feedback).
                pool.push(input);
            }
        }
        println!("{t}: {execs} execs in {:.1} s, {} distinct panic(s)", start.elapsed().as_secs_f64(), panics.len());
    }
    std::process::exit(any_panic as i32);
}
