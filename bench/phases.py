#!/usr/bin/env python3
"""Per-phase timings of checkpoint and restore (ferry --verbose), N runs.

usage: bench/phases.py PROGRAM [RUNS]    (as root, from the repository root)

PROGRAM is a binary that prints READY on stdout once its state is set up
(bench/tiny.c, bench/heap100.c built by bench/run.sh into target/c/).
Images go to /dev/shm. FERRY_COPY_THREADS and other FERRY_* variables are
passed through, e.g. FERRY_COPY_THREADS=1 to compare one copy thread.
This script is the parent and a child subreaper of everything it starts,
and kills and reaps it by PID.
"""
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

FERRY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "target", "release", "ferry")


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    prog, runs = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 3
    ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    env = dict(os.environ, FERRY_LOG="debug", NO_COLOR="1")
    work = tempfile.mkdtemp(prefix="ferry-phases-", dir="/dev/shm")
    log = os.path.join(work, "program.log")
    images = os.path.join(work, "images")
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
            r = subprocess.run([FERRY, "checkpoint", "--pid", str(p.pid), "--images", images],
                               env=env, capture_output=True, text=True)
            print(r.stderr.strip())
            if r.returncode:
                p.kill()
                p.wait()
                sys.exit("checkpoint failed")
            p.wait()
            r = subprocess.run([FERRY, "restore", "--images", images, "--detach"], env=env, capture_output=True, text=True)
            print(r.stderr.strip())
            time.sleep(0.2)
            try:
                os.kill(p.pid, signal.SIGKILL)
                os.waitpid(p.pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
            print()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
