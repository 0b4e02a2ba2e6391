//! Post-copy migration (`ferry migrate --lazy`) between two test hosts
//! (tests/common/cluster.rs, each running ferryd as its PID 1): memory
//! arrives intact after the resume, the pause does not grow with memory
//! size, and a program that writes memory faster than any pre-copy could
//! follow keeps running at the destination.

mod common;

use common::cluster::{Cluster, Host};
use ferry_testkit::require_root;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

const FERRY: &str = env!("CARGO_BIN_EXE_ferry");
const FERRYD: &str = env!("CARGO_BIN_EXE_ferryd");

/// `memprog check MIB`: fills MIB MiB with a pattern, and on SIGUSR2
/// checks all of it and prints PASS or FAIL. `memprog busy MIB`:
/// increments every word of MIB MiB in a loop; on SIGUSR2 prints how many
/// passes it made and whether every word agrees. `memprog grow MIB`:
/// writes the pages of MIB MiB one after the other, each with a pattern
/// of its own, about 40 MiB/s, so that pages come into existence all
/// through a migration; on SIGUSR2 checks every page (the written ones
/// hold their pattern, the others zeros) and prints GROW PASS or FAIL
/// with the number of pages written.
const PROGRAM: &str = r#"
#define _GNU_SOURCE
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static volatile sig_atomic_t go;
static void on_usr2(int s) { (void)s; go = 1; }
static uint64_t want(size_t i) { return (i * 0x9E3779B97F4A7C15ull) ^ 0x5eed; }

static size_t check_grown(const uint64_t *m, size_t words, size_t filled) {
    size_t bad = 0;
    for (size_t i = 0; i < words; i++) bad += m[i] != (i < filled * 512 ? want(i) : 0);
    return bad;
}

static int grow(size_t n) {
    size_t words = n / 8, pages = n / 4096, filled = 0;
    uint64_t *m = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) { perror("mmap"); return 1; }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr2;
    sigaction(SIGUSR2, &sa, NULL);
    printf("READY %d 0\n", getpid());
    fflush(stdout);
    for (;;) {
        if (filled < pages) {
            for (size_t w = filled * 512; w < (filled + 1) * 512; w++) m[w] = want(w);
            filled++;
            if (filled % 16 == 0) usleep(1000);
        } else {
            usleep(10000);
        }
        if (go) {
            go = 0;
            size_t bad = check_grown(m, words, filled);
            if (bad) printf("GROW FAIL %zu bad words, %zu pages written\n", bad, filled);
            else printf("GROW PASS %zu pages written\n", filled);
            fflush(stdout);
        }
    }
}

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    int busy = strcmp(argv[1], "busy") == 0;
    if (strcmp(argv[1], "grow") == 0) return grow((size_t)atol(argv[2]) << 20);
    size_t n = (size_t)atol(argv[2]) << 20, words = n / 8;
    uint64_t *m = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) { perror("mmap"); return 1; }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr2;
    sigaction(SIGUSR2, &sa, NULL);
    if (!busy) {
        uint64_t sum = 0;
        for (size_t i = 0; i < words; i++) { m[i] = want(i); sum += m[i]; }
        printf("READY %d %llu\n", getpid(), (unsigned long long)sum);
        fflush(stdout);
        for (;;) {
            if (go) {
                go = 0;
                size_t bad = 0;
                uint64_t s = 0;
                for (size_t i = 0; i < words; i++) { s += m[i]; if (m[i] != want(i)) bad++; }
                if (bad || s != sum) printf("FAIL %zu bad words\n", bad);
                else printf("PASS %llu\n", (unsigned long long)s);
                fflush(stdout);
            }
            usleep(10000);
        }
    }
    memset(m, 0, n);
    printf("READY %d 0\n", getpid());
    fflush(stdout);
    uint64_t passes = 0;
    for (;;) {
        for (size_t i = 0; i < words; i++) m[i]++;
        passes++;
        if (go) {
            go = 0;
            size_t bad = 0;
            for (size_t i = 0; i < words; i++) if (m[i] != passes) bad++;
            printf("COUNT %llu %s\n", (unsigned long long)passes, bad ? "BAD" : "OK");
            fflush(stdout);
        }
    }
}
"#;

fn work_dir() -> PathBuf {
    static N: AtomicU32 = AtomicU32::new(0);
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "postcopy-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    ));
    fs::create_dir_all(&d).expect("create work dir");
    d
}

fn compile(dir: &Path) -> PathBuf {
    let src = dir.join("memprog.c");
    fs::write(&src, PROGRAM).expect("write memprog.c");
    let bin = dir.join("memprog");
    ferry_testkit::compile_c(&src, &bin);
    bin
}

/// Two hosts, a and b, each with ferryd as PID 1, sharing one key.
struct Pair {
    cluster: Cluster,
    dir: PathBuf,
    key: PathBuf,
    prog: PathBuf,
}

impl Pair {
    fn new() -> Pair {
        let cluster = Cluster::new(&["a", "b"]);
        let dir = work_dir();
        let key = dir.join("key");
        let st = Command::new(FERRY).arg("keygen").arg(&key).output().expect("ferry keygen");
        assert!(st.status.success(), "keygen: {}", String::from_utf8_lossy(&st.stderr));
        let prog = compile(&dir);
        for h in cluster.hosts() {
            let log = dir.join(format!("ferryd-{}.log", h.name));
            let script = format!(
                "mkdir -p /run/ferry && mount -t tmpfs tmpfs /run/ferry && mount -t bpf bpf /sys/fs/bpf && FERRY_LOG=info exec {FERRYD} --listen {}:7070 --key {} 2>>{}",
                h.ip,
                key.display(),
                log.display()
            );
            h.start_init(&["sh", "-c", &script]);
        }
        // ferryd listening.
        std::thread::sleep(Duration::from_millis(300));
        Pair { cluster, dir, key, prog }
    }

    fn host(&self, name: &str) -> &Host {
        self.cluster.host(name)
    }

    /// Starts `memprog MODE MIB` in host a, in a session of its own;
    /// returns (its PID in host a, its output file) once it is ready.
    fn start(&self, mode: &str, mib: u64) -> (i32, PathBuf) {
        let out = self.dir.join(format!("{mode}-{mib}.out"));
        let f = fs::File::create(&out).expect("create output");
        let mut child = self
            .host("a")
            .command(&["bash", "-c", "for fd in /proc/$$/fd/*; do fd=${fd##*/}; if [ \"$fd\" -gt 2 ]; then eval \"exec $fd>&-\"; fi; done; exec setsid -f \"$@\"", "sh", self.prog.to_str().expect("utf-8 path"), mode, &mib.to_string()])
            .stdin(Stdio::null())
            .stdout(f.try_clone().expect("dup"))
            .stderr(f)
            .spawn()
            .expect("start memprog");
        let _ = child.wait();
        let line = wait_line(&out, "READY", Duration::from_secs(30));
        let pid =
            line.split_whitespace().nth(1).and_then(|p| p.parse().ok()).expect("pid in READY line");
        (pid, out)
    }

    /// `ferry migrate --lazy` of `pid` from a to b; returns the report JSON.
    fn migrate_lazy(&self, pid: i32, tag: &str) -> String {
        let report = self.dir.join(format!("report-{tag}.json"));
        let to = format!("{}:7070", self.host("b").ip);
        let out = self
            .host("a")
            .command(&[
                FERRY,
                "migrate",
                "--pid",
                &pid.to_string(),
                "--to",
                &to,
                "--key",
                self.key.to_str().expect("utf-8"),
                "--lazy",
                "--report",
            ])
            .arg(&report)
            .output()
            .expect("run ferry migrate");
        let log_b = fs::read_to_string(self.dir.join("ferryd-b.log")).unwrap_or_default();
        assert!(
            out.status.success(),
            "ferry migrate --lazy failed: {}\n{}\nferryd b: {log_b}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        println!("{}", String::from_utf8_lossy(&out.stdout).trim());
        fs::read_to_string(&report).expect("read report")
    }

    /// Sends `sig` to the migrated process, `dest_host_pid` in host b.
    fn signal_b(&self, dest_host_pid: i32, sig: &str) {
        let st = self
            .host("b")
            .command(&["kill", sig, &dest_host_pid.to_string()])
            .status()
            .expect("kill");
        assert!(st.success(), "kill {sig} {dest_host_pid} in host b");
    }
}

fn wait_line(path: &Path, prefix: &str, limit: Duration) -> String {
    let deadline = Instant::now() + limit;
    loop {
        let text = fs::read_to_string(path).unwrap_or_default();
        if let Some(l) = text.lines().rev().find(|l| l.starts_with(prefix)) {
            return l.to_string();
        }
        assert!(
            Instant::now() < deadline,
            "no {prefix} line in {} after {limit:?}: {text}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn lines_with(path: &Path, prefix: &str) -> Vec<String> {
    fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with(prefix))
        .map(String::from)
        .collect()
}

fn json_number(json: &str, key: &str) -> f64 {
    let at = json.find(&format!("\"{key}\"")).unwrap_or_else(|| panic!("no {key} in {json}"));
    let rest = &json[at + key.len() + 2..];
    let rest = rest.trim_start_matches([':', ' ']);
    let end = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-' || c == 'e'))
        .unwrap_or(rest.len());
    rest[..end].parse().unwrap_or_else(|e| panic!("{key} in {json}: {e}"))
}

/// Migrates a `check` program of `mib` MiB lazily, has it verify its
/// memory at the destination; returns the pause in ms.
fn migrate_and_check(pair: &Pair, mib: u64) -> f64 {
    let (pid, out) = pair.start("check", mib);
    let report = pair.migrate_lazy(pid, &format!("check-{mib}"));
    let pause = json_number(&report, "pause_ms");
    let dest = json_number(&report, "dest_host_pid") as i32;
    let passes_before = lines_with(&out, "PASS").len();
    pair.signal_b(dest, "-USR2");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let fails = lines_with(&out, "FAIL");
        assert!(fails.is_empty(), "{mib} MiB: memory differs after the lazy migration: {fails:?}");
        if lines_with(&out, "PASS").len() > passes_before {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{mib} MiB: no PASS after SIGUSR2: {}",
            fs::read_to_string(&out).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    println!("{mib} MiB: PASS at the destination, pause {pause:.1} ms");
    pair.signal_b(dest, "-KILL");
    pause
}

#[test]
fn lazy_migration_keeps_256_mib_intact() {
    require_root!();
    let pair = Pair::new();
    migrate_and_check(&pair, 256);
}

#[test]
fn lazy_pause_does_not_grow_with_memory() {
    require_root!();
    let pair = Pair::new();
    let small = migrate_and_check(&pair, 64);
    let big = migrate_and_check(&pair, 512);
    println!("post-copy pause: 64 MiB {small:.1} ms, 512 MiB {big:.1} ms");
    if std::env::var("FERRY_POSTCOPY_1G").is_ok() {
        let huge = migrate_and_check(&pair, 1024);
        println!("post-copy pause: 1 GiB {huge:.1} ms");
    }
    assert!(
        big < 3.0 * small + 20.0,
        "the pause grew with memory: 64 MiB {small:.1} ms, 512 MiB {big:.1} ms"
    );
}

#[test]
fn busy_writer_keeps_counting_after_lazy_migration() {
    require_root!();
    let pair = Pair::new();
    let (pid, out) = pair.start("busy", 100);
    std::thread::sleep(Duration::from_millis(300));
    let report = pair.migrate_lazy(pid, "busy");
    let dest = json_number(&report, "dest_host_pid") as i32;
    let mut counts = Vec::new();
    for _ in 0..2 {
        let before = lines_with(&out, "COUNT").len();
        pair.signal_b(dest, "-USR2");
        let deadline = Instant::now() + Duration::from_secs(60);
        while lines_with(&out, "COUNT").len() == before {
            assert!(
                Instant::now() < deadline,
                "no COUNT after SIGUSR2: {}",
                fs::read_to_string(&out).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let line = lines_with(&out, "COUNT").pop().expect("a COUNT line");
        assert!(line.ends_with(" OK"), "memory inconsistent at the destination: {line}");
        counts.push(
            line.split_whitespace().nth(1).and_then(|c| c.parse::<u64>().ok()).expect("count"),
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    println!(
        "busy writer at the destination: {} then {} passes over 100 MiB",
        counts[0], counts[1]
    );
    assert!(counts[1] > counts[0], "the writer stopped counting at the destination: {counts:?}");
    pair.signal_b(dest, "-KILL");
}

/// Pages that come into existence all through the migration (before the
/// freeze, and at the destination after it, where the ones the source
/// never had must read as zeros) arrive with their content: every page is
/// checked at the destination, twice (while it still writes and once it
/// wrote all).
#[test]
fn pages_written_during_a_lazy_migration_arrive() {
    require_root!();
    let pair = Pair::new();
    let (pid, out) = pair.start("grow", 128);
    std::thread::sleep(Duration::from_millis(300));
    let report = pair.migrate_lazy(pid, "grow");
    let dest = json_number(&report, "dest_host_pid") as i32;
    for round in 0..2 {
        let before = lines_with(&out, "GROW").len();
        if round == 1 {
            // 128 MiB at about 40 MiB/s.
            std::thread::sleep(Duration::from_secs(4));
        }
        pair.signal_b(dest, "-USR2");
        let deadline = Instant::now() + Duration::from_secs(60);
        while lines_with(&out, "GROW").len() == before {
            assert!(
                Instant::now() < deadline,
                "no GROW line after SIGUSR2: {}",
                fs::read_to_string(&out).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let line = lines_with(&out, "GROW").pop().expect("a GROW line");
        println!("check {round}: {line}");
        assert!(line.starts_with("GROW PASS"), "memory differs at the destination: {line}");
    }
    let last = lines_with(&out, "GROW").pop().expect("a GROW line");
    assert!(last.contains(" 32768 pages"), "the writer did not finish at the destination: {last}");
    pair.signal_b(dest, "-KILL");
}

#[test]
fn source_lost_during_postcopy_kills_the_destination_tree() {
    use std::io::{BufRead, BufReader};
    require_root!();
    let pair = Pair::new();
    let (pid, _out) = pair.start("check", 1024);
    let to = format!("{}:7070", pair.host("b").ip);
    let mut child = pair
        .host("a")
        .command(&[
            FERRY,
            "migrate",
            "--pid",
            &pid.to_string(),
            "--to",
            &to,
            "--key",
            pair.key.to_str().expect("utf-8"),
            "--lazy",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run ferry migrate");
    let (ferry_root, _) = pair.host("a").wait_spawned_pid(&child);
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    loop {
        let line =
            lines.next().expect("ferry migrate ended before post-copy").expect("read stderr");
        if line.contains("post-copy of") {
            break;
        }
    }
    // The source goes away in the middle of the transfer.
    // Kill by PID of the ferry process this test started.
    ferry_testkit::kill(ferry_root, libc::SIGKILL);
    let _ = child.wait();
    let log = pair.dir.join("ferryd-b.log");
    let deadline = Instant::now() + Duration::from_secs(45);
    loop {
        let text = fs::read_to_string(&log).unwrap_or_default();
        if text.contains("the service is lost") {
            break;
        }
        assert!(Instant::now() < deadline, "the destination did not give up the tree: {text}");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Nothing of the tree is left in host b but ferryd and its workers.
    let ps = pair.host("b").command(&["ps", "-e", "-o", "comm="]).output().expect("ps");
    let names = String::from_utf8_lossy(&ps.stdout).into_owned();
    assert!(
        !names.lines().any(|l| l.trim() == "memprog"),
        "the tree still runs at the destination: {names}"
    );
    // The source's copy does not run again either (kept stopped).
    let st = fs::read_to_string(format!(
        "/proc/{}/stat",
        pair.host("a").root_pid(pid).expect("source copy")
    ))
    .unwrap_or_default();
    let state =
        st.rsplit(')').next().and_then(|r| r.split_whitespace().next()).unwrap_or("?").to_string();
    assert!(state == "T" || state == "t", "the source's copy runs again (state {state})");
    println!("source lost mid-transfer: the destination killed the tree, the source's copy stays stopped");
}
