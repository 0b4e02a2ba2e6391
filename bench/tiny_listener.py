#!/usr/bin/python3
"""Side by side: checkpoint + restore of a tiny TCP listener
(examples/counter_server.c) by ferry and, when a `criu` binary is on PATH,
by CRIU. Images on tmpfs (/dev/shm), median of RUNS (default 7) wall times
of the whole commands. Also the longest wait of a client that sends one
request every 2 ms across each ferry checkpoint + restore, measured with its
own clock, next to the engine's pause.

Usage: bench/tiny_listener.py [FERRY] [RUNS]   (root; writes
docs/benchmarks-tiny-latest.md and prints the same table)
BENCH_CHECKPOINT_ARGS adds arguments to `ferry checkpoint` (e.g.
--no-verify, to leave out the trial restore that checkpoint makes by
default).

The driver is a child subreaper and reaps what the checkpoints kill at
once, so a restore never waits for init to free the old PID.
"""
import ctypes
import os
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from counter_driver import reap_forever, start_server

if len(sys.argv) > 1 and sys.argv[1] in ("-h", "--help"):
    print(__doc__)
    sys.exit(0)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FERRY = sys.argv[1] if len(sys.argv) > 1 else os.path.join(REPO, "target/release/ferry")
CHECKPOINT_ARGS = shlex.split(os.environ.get("BENCH_CHECKPOINT_ARGS", ""))
RUNS = int(sys.argv[2]) if len(sys.argv) > 2 else 7
OUT = os.path.join(REPO, "docs/benchmarks-tiny-latest.md")
IMAGES = "/dev/shm/ferry-bench-tiny"
PR_SET_CHILD_SUBREAPER = 36


class Client(threading.Thread):
    """One connection, one PING every 2 ms; records the longest wait."""

    def __init__(self, port):
        super().__init__(daemon=True)
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.longest = 0.0
        self.slow = []
        self.stop = False

    def run(self):
        f = self.sock.makefile("rwb", buffering=0)
        while not self.stop:
            t = time.perf_counter()
            f.write(b"PING\n")
            if f.readline() != b"PONG\n":
                raise SystemExit("client: bad reply")
            wait = time.perf_counter() - t
            self.longest = max(self.longest, wait)
            if wait > 0.05:
                self.slow.append(round(wait * 1e3, 1))
            time.sleep(0.002)


def timed(cmd):
    t = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed: {r.stderr.strip()}")
    return (time.perf_counter() - t) * 1e3, r


def ferry_round(pid):
    shutil.rmtree(IMAGES, ignore_errors=True)
    ck, r = timed([FERRY, "checkpoint", "--pid", str(pid), "--images", IMAGES] + CHECKPOINT_ARGS)
    rs, _ = timed([FERRY, "restore", "--images", IMAGES, "--detach"])
    # "... in 93.8 ms" is the engine's own pause (frozen to killed); the
    # restore side's is in the restore's phases.
    return ck, rs


def criu_round(pid):
    shutil.rmtree(IMAGES, ignore_errors=True)
    os.makedirs(IMAGES)
    ck, _ = timed(["criu", "dump", "-t", str(pid), "-D", IMAGES, "--tcp-established",
                   "--shell-job"])
    rs, _ = timed(["criu", "restore", "-D", IMAGES, "--tcp-established", "--shell-job",
                   "--restore-detached"])
    return ck, rs


def criu_usable():
    """None when a working criu is on PATH, else why not (Debian bookworm's
    criu 3.17 fails `criu check` on kernel 6.18: it cannot read the vDSO)."""
    if not shutil.which("criu"):
        return "no criu on PATH (put a CRIU build there to compare)"
    r = subprocess.run(["criu", "check"], capture_output=True, text=True)
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["?"])[-1]
        return f"`criu check` fails here: {last}"
    return None


def measure(tool, round_fn, binary):
    pid, port = start_server(binary)
    client = Client(port)
    rows = []
    try:
        client.start()
        time.sleep(0.2)
        for _ in range(RUNS):
            rows.append(round_fn(pid))
            time.sleep(0.1)
    finally:
        # Also when a round fails: the server (restored under the same
        # PID each round) must not outlive the benchmark.
        client.stop = True
        time.sleep(0.05)
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
    if client.slow:
        print(f"{tool}: client waits over 50 ms: {client.slow}")
    ck = statistics.median(r[0] for r in rows)
    rs = statistics.median(r[1] for r in rows)
    return tool, ck, rs, client.longest * 1e3


def main():
    if os.geteuid() != 0:
        raise SystemExit("bench/tiny_listener.py: needs root")
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    threading.Thread(target=reap_forever, daemon=True).start()
    # The server's binary and its log, removed however the run ends.
    work = tempfile.mkdtemp(prefix="ferry-bench-tiny-")
    try:
        results, criu_note = run_all(os.path.join(work, "counter_server"))
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(IMAGES, ignore_errors=True)
    report(results, criu_note)


def run_all(binary):
    subprocess.run(["gcc", "-O2", "-pthread", "-o", binary,
                    os.path.join(REPO, "examples/counter_server.c")], check=True)
    results = [measure("ferry", ferry_round, binary)]
    criu_note = criu_usable()
    if criu_note is None:
        try:
            results.append(measure("CRIU", criu_round, binary))
        except SystemExit as e:
            criu_note = f"the CRIU run failed ({e})"
    return results, criu_note


def report(results, criu_note):
    if criu_note:
        print(f"CRIU left out of the table: {criu_note}")
    lines = [
        "# Tiny listener: checkpoint + restore, side by side",
        "",
        f"`{'BENCH_CHECKPOINT_ARGS=' + shlex.quote(' '.join(CHECKPOINT_ARGS)) + ' ' if CHECKPOINT_ARGS else ''}"
        f"bench/tiny_listener.py {FERRY} {RUNS}` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: "
        "examples/counter_server.c with one client connection sending a PING every 2 ms, "
        f"images on tmpfs, median of {RUNS} wall times of the whole commands.",
        "",
        "| tool | checkpoint ms | restore ms | both ms | longest client wait ms |",
        "|---|---:|---:|---:|---:|",
    ]
    for tool, ck, rs, longest in results:
        lines.append(f"| {tool} | {ck:.1f} | {rs:.1f} | {ck + rs:.1f} | {longest:.1f} |")
    if criu_note:
        lines.append("")
        lines.append(f"CRIU is not in this run: {criu_note}. CRIU 4.2's figures on this machine "
                     "kind are in ../shared/criu-baseline.md (tiny program: dump 28 ms, restore 25 ms; "
                     "8 and 5 ms with its feature cache).")
    text = "\n".join(lines) + "\n"
    print(text)
    with open(OUT, "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
