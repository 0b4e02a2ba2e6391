#!/usr/bin/python3
"""What `ferry checkpoint --verify` (the default: a trial restore of the
image before the tree is killed) costs, next to `--no-verify`: the tiny
listener (examples/counter_server.c) and 100 MiB of written heap
(bench/heap100.c). Images on tmpfs (/dev/shm); for each program and mode,
the median of RUNS runs (alternating the modes) of the checkpoint
command's wall time, the engine's total (its output), which is the
tree's pause when the tree is killed, and the trial's own time.

Usage: bench/verify_cost.py [FERRY] [RUNS]   (root)

The driver is a child subreaper and reaps what the checkpoints kill.
"""
import ctypes
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from counter_driver import reap_forever

if len(sys.argv) > 1 and sys.argv[1] in ("-h", "--help"):
    print(__doc__)
    sys.exit(0)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FERRY = sys.argv[1] if len(sys.argv) > 1 else os.path.join(REPO, "target/release/ferry")
RUNS = int(sys.argv[2]) if len(sys.argv) > 2 else 7
IMAGES = "/dev/shm/ferry-bench-verify"
TOTAL = re.compile(r"in ([0-9.]+) ms; tree killed")
TRIAL = re.compile(r"verified by a trial restore \(([0-9.]+) ms\)")


def start(argv, ready, log):
    # Output to a file: a pipe to this driver would be shared with a
    # process outside the tree, which ferry refuses.
    with open(log, "w") as out:
        p = subprocess.Popen(argv, stdout=out, stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True, close_fds=True)
    deadline = time.time() + 30
    while time.time() < deadline:
        with open(log) as f:
            if ready in f.read():
                return p.pid
        time.sleep(0.01)
    p.kill()
    raise SystemExit(f"{argv[0]} did not start")


def one(argv, ready, log, verify):
    pid = start(argv, ready, log)
    subprocess.run(["rm", "-rf", IMAGES])
    t = time.time()
    r = subprocess.run([FERRY, "checkpoint", "--pid", str(pid), "--images", IMAGES,
                        "--verify" if verify else "--no-verify"],
                       capture_output=True, text=True, close_fds=True)
    wall = (time.time() - t) * 1e3
    if r.returncode != 0:
        # The program runs on after a refused checkpoint: it is ours to end.
        os.kill(pid, 9)
        raise SystemExit(f"checkpoint failed: {r.stderr}")
    total = float(TOTAL.search(r.stdout).group(1))
    trial = TRIAL.search(r.stdout)
    if verify and not trial:
        raise SystemExit(f"no trial: {r.stdout}")
    return wall, total, float(trial.group(1)) if trial else 0.0


def main():
    if os.geteuid() != 0:
        sys.exit("bench/verify_cost.py: needs root")
    ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    threading.Thread(target=reap_forever, daemon=True).start()
    work = tempfile.mkdtemp(prefix="ferry-bench-verify-")
    programs = []
    for name, src in (("tiny listener", "examples/counter_server.c"), ("100 MiB heap", "bench/heap100.c")):
        out = os.path.join(work, os.path.basename(src)[:-2])
        subprocess.run(["gcc", "-O2", "-pthread", "-o", out, os.path.join(REPO, src)], check=True)
        args = [out, "0"] if "counter" in src else [out]
        ready = "listening" if "counter" in src else "READY"
        programs.append((name, args, ready))
    print("| program | mode | command (ms) | engine total = pause (ms) | trial (ms) |")
    print("|---|---|---:|---:|---:|")
    for name, args, ready in programs:
        res = {True: [], False: []}
        for _ in range(RUNS):
            for verify in (False, True):
                res[verify].append(one(args, ready, os.path.join(work, "log"), verify))
        for verify in (False, True):
            med = [statistics.median(r[i] for r in res[verify]) for i in range(3)]
            mode = "--verify" if verify else "--no-verify"
            trial = f"{med[2]:.1f}" if verify else "-"
            print(f"| {name} | {mode} | {med[0]:.1f} | {med[1]:.1f} | {trial} |", flush=True)
    subprocess.run(["rm", "-rf", work, IMAGES])


if __name__ == "__main__":
    main()
