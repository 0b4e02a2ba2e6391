#!/usr/bin/python3
"""Where the tiny listener's checkpoint + restore wall time goes: N cycles
of `ferry checkpoint` + `ferry restore --detach` of one running
examples/counter_server.c with one client (a PING every 2 ms), images on
tmpfs, as bench/tiny_listener.py runs them, with each command's phase
lines (and their unix-microsecond stamps) read, and printed per phase as
median (min-max) in ms, together with:

- "wall": the command, from before the driver starts it to its exit;
- "engine total": ferry's own figure ("... in X ms": first phase to kill);
- "start": from before the driver starts the command to the start of its
  first phase (the exec of the binary, ferry's start, what runs before);
- "exit": from the end of its last phase to the command's exit.

Usage: bench/tiny_phases.py FERRY[,FERRY...] [N] [checkpoint args...]   (root)
With several builds (comma-separated), each cycle runs every build in
turn on the same server, the order reversed every other cycle, and each
figure is printed per build (0 = the first): a comparison under the
same load, which on a shared machine changes from second to second.
BENCH_PHASE_LINES=all (the default) runs ferry with -v; =phases with
FERRY_LOG=ferry_engine::phases=debug (the phase lines alone); =none with
neither (then only wall and engine total are known). The driver is a
child subreaper, as tiny_listener.py, and reaps what the checkpoints kill.
"""
import collections
import ctypes
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from counter_driver import reap_forever, start_server

if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
    print(__doc__)
    sys.exit(0)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FERRYS = sys.argv[1].split(",")
N = int(sys.argv[2]) if len(sys.argv) > 2 else 9
EXTRA = sys.argv[3:]
IMAGES = "/dev/shm/ferry-bench-tiny-phases"
LINES = os.environ.get("BENCH_PHASE_LINES", "all")
PHASE = re.compile(r"phases\S*: (checkpoint|restore) (.*?)\s+([0-9.]+) ms \(total\s+[0-9.]+ ms\) at (\d+)")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def start_built_server(work):
    binary = os.path.join(work, "counter_server")
    subprocess.run(["gcc", "-O2", "-pthread", "-o", binary,
                    os.path.join(REPO, "examples/counter_server.c")], check=True)
    return start_server(binary)


def client(port, stop):
    f = socket.create_connection(("127.0.0.1", port)).makefile("rwb", buffering=0)
    while not stop.is_set():
        f.write(b"PING\n")
        if f.readline() != b"PONG\n":
            return
        time.sleep(0.002)


def run(cmd, tag, env, res):
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    t1 = time.time()
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed: {r.stderr.strip()}")
    res[f"{tag} wall"].append((t1 - t0) * 1e3)
    total = re.search(r"\) in ([0-9.]+) ms", r.stdout)
    if total:
        res[f"{tag} engine total"].append(float(total.group(1)))
    first = last = None
    for m in PHASE.finditer(ANSI.sub("", r.stderr)):
        op, name, ms, at = m.group(1), m.group(2).strip(), float(m.group(3)), int(m.group(4))
        res[f"{tag}: {op} {name}"].append(ms)
        if first is None:
            first = at / 1e6 - ms / 1e3
        last = at / 1e6
    if first is not None:
        res[f"{tag} start"].append((first - t0) * 1e3)
        res[f"{tag} exit"].append((t1 - last) * 1e3)


def cycle(ferry, tag, pid, verbose, env, res):
    """One checkpoint and restore of the server by `ferry`."""
    shutil.rmtree(IMAGES, ignore_errors=True)
    run([ferry] + verbose + ["checkpoint", "--pid", str(pid), "--images", IMAGES] + EXTRA,
        f"{tag}checkpoint", env, res)
    run([ferry] + verbose + ["restore", "--images", IMAGES, "--detach"], f"{tag}restore", env, res)
    time.sleep(0.1)


def main():
    if os.geteuid() != 0:
        raise SystemExit("bench/tiny_phases.py: needs root")
    ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    threading.Thread(target=reap_forever, daemon=True).start()
    env = dict(os.environ)
    verbose = []
    if LINES == "all":
        verbose = ["-v"]
    elif LINES == "phases":
        env["FERRY_LOG"] = "ferry_engine::phases=debug"
    res = collections.defaultdict(list)
    work = tempfile.mkdtemp(prefix="ferry-bench-tiny-phases-")
    stop = threading.Event()
    pid = None
    try:
        pid, port = start_built_server(work)
        threading.Thread(target=client, args=(port, stop), daemon=True).start()
        time.sleep(0.2)
        for i in range(N):
            for k in (range(len(FERRYS)) if i % 2 == 0 else reversed(range(len(FERRYS)))):
                cycle(FERRYS[k], f"{k} " if len(FERRYS) > 1 else "", pid, verbose, env, res)
    finally:
        stop.set()
        if pid is not None:
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(IMAGES, ignore_errors=True)
    for k, v in sorted(res.items()) if len(FERRYS) > 1 else res.items():
        print(f"{k:58s} {statistics.median(v):8.2f}  ({min(v):.2f}-{max(v):.2f})")


if __name__ == "__main__":
    main()
