#!/usr/bin/env python3
"""Per-phase timings of checkpoint and restore (ferry --verbose), N runs.

usage: bench/phases.py PROGRAM [RUNS]    (as root, from the repository root)

With more than one run, a last table gives each phase's median (and
min-max) over the runs, and the engine totals of checkpoint and restore.

PROGRAM is a binary that prints READY on stdout once its state is set up
(bench/tiny.c, bench/heap100.c built by bench/run.sh into target/c/).
Images go to /dev/shm. FERRY_COPY_THREADS and other FERRY_* variables are
passed through, e.g. FERRY_COPY_THREADS=1 to compare one copy thread.
BENCH_CHECKPOINT_ARGS adds arguments to `ferry checkpoint` (e.g. --no-verify).
This script is the parent and a child subreaper of everything it starts,
and kills and reaps it by PID.
"""
import ctypes
import os
import re
import resource
import statistics
import shutil
import signal
import subprocess
import sys
import tempfile
import time

PHASE = re.compile(r"phases: (checkpoint|restore) (.*?)\s+([0-9.]+) ms \(total\s+([0-9.]+) ms\)")


def record(text, runs_phases, command):
    """Adds this output's phase durations and totals to runs_phases. In
    the output of `ferry checkpoint` (command), restore phases are its
    trial restore's."""
    totals = {}
    frozen_at = None
    for m in PHASE.finditer(text):
        op, name, ms, total = m.group(1), m.group(2).strip(), float(m.group(3)), float(m.group(4))
        if op != command:
            op = f"{command} trial {op}"
        runs_phases.setdefault(f"{op}: {name}", []).append(ms)
        totals[op] = total
        if op == "checkpoint" and name == "freeze":
            frozen_at = total - ms
    for op, total in totals.items():
        runs_phases.setdefault(f"{op} TOTAL (engine)", []).append(total)
    if frozen_at is not None and "checkpoint" in totals:
        # From the freeze to the end of the kill: the tree's pause.
        runs_phases.setdefault("checkpoint PAUSE (freeze to kill)", []).append(totals["checkpoint"] - frozen_at)


def cpu_ms():
    """CPU time (user + system) used so far by reaped children."""
    u = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (u.ru_utime + u.ru_stime) * 1e3


def summary(runs_phases):
    print("median over %d runs (min-max), ms:" % max(len(v) for v in runs_phases.values()))
    both = []
    for name, v in runs_phases.items():
        print(f"  {name:<55} {statistics.median(v):8.1f}  ({min(v):.1f}-{max(v):.1f})")
    c, r = runs_phases.get("checkpoint TOTAL (engine)"), runs_phases.get("restore TOTAL (engine)")
    if c and r and len(c) == len(r):
        both = [a + b for a, b in zip(c, r)]
        print(f"  {'checkpoint + restore (engine)':<55} {statistics.median(both):8.1f}  ({min(both):.1f}-{max(both):.1f})")
    c, r = runs_phases.get("checkpoint WALL (launch to exit)"), runs_phases.get("restore WALL (launch to exit, --detach)")
    if c and r and len(c) == len(r):
        both = [a + b for a, b in zip(c, r)]
        print(f"  {'checkpoint + restore (wall)':<55} {statistics.median(both):8.1f}  ({min(both):.1f}-{max(both):.1f})")


FERRY = os.environ.get("FERRY_BIN") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "target", "release", "ferry")


def main():
    if len(sys.argv) > 1 and sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        sys.exit(0)
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    prog, runs = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 3
    ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    env = dict(os.environ, FERRY_LOG="debug", NO_COLOR="1")
    work = tempfile.mkdtemp(prefix="ferry-phases-", dir="/dev/shm")
    log = os.path.join(work, "program.log")
    images = os.path.join(work, "images")
    runs_phases = {}
    extra = os.environ.get("BENCH_CHECKPOINT_ARGS", "").split()
    try:
        for _ in range(runs):
            with open(log, "w") as out:
                p = subprocess.Popen([prog], stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True, close_fds=True)
            deadline = time.monotonic() + 30
            while "READY" not in open(log).read():
                if time.monotonic() > deadline:
                    sys.exit("program never printed READY")
                time.sleep(0.01)
            shutil.rmtree(images, ignore_errors=True)
            c0, w0 = cpu_ms(), time.perf_counter()
            r = subprocess.run([FERRY, "checkpoint", "--pid", str(p.pid), "--images", images] + extra,
                               env=env, capture_output=True, text=True)
            runs_phases.setdefault("checkpoint WALL (launch to exit)", []).append((time.perf_counter() - w0) * 1e3)
            runs_phases.setdefault("checkpoint CPU (user+sys of ferry)", []).append(cpu_ms() - c0)
            print(r.stderr.strip())
            record(r.stderr, runs_phases, "checkpoint")
            if r.returncode:
                p.kill()
                p.wait()
                sys.exit("checkpoint failed")
            p.wait()
            c0, w0 = cpu_ms(), time.perf_counter()
            r = subprocess.run([FERRY, "restore", "--images", images, "--detach"], env=env, capture_output=True, text=True)
            runs_phases.setdefault("restore WALL (launch to exit, --detach)", []).append((time.perf_counter() - w0) * 1e3)
            runs_phases.setdefault("restore CPU (user+sys of ferry)", []).append(cpu_ms() - c0)
            print(r.stderr.strip())
            record(r.stderr, runs_phases, "restore")
            time.sleep(0.2)
            try:
                os.kill(p.pid, signal.SIGKILL)
                os.waitpid(p.pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
            print()
        if runs > 1:
            summary(runs_phases)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
