#!/usr/bin/python3
"""What reaping a killed process costs its parent after /proc was read
for each of its fds, as a checkpoint does before it kills a server.

A child opens N descriptors (/dev/null) and waits; this script reads
nothing, each /proc/PID/fdinfo/FD, or each fdinfo and each
/proc/PID/fd/FD link, then SIGKILLs the child, waits until it is a
zombie and times its waitpid: the kernel drops every /proc entry looked
up under the process then, in the reaper, while the PID is still taken
(a restore that needs it waits).

Usage: bench/proc_reap.py [--n 10000] [--runs 3]
"""

import argparse
import os
import resource
import signal
import statistics
import time


def one(n, reads):
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(ready_r)
        resource.setrlimit(resource.RLIMIT_NOFILE, (n + 100, n + 100))
        for _ in range(n):
            os.open("/dev/null", os.O_RDONLY)
        os.write(ready_w, b"x")
        time.sleep(600)
        os._exit(0)
    os.close(ready_w)
    reaped = False
    try:
        os.read(ready_r, 1)
        if reads:
            d = os.open(f"/proc/{pid}/fdinfo", os.O_RDONLY)
            for fd in os.listdir(d):
                f = os.open(fd, os.O_RDONLY, dir_fd=d)
                os.read(f, 4096)
                os.close(f)
            os.close(d)
        if reads > 1:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                os.readlink(f"/proc/{pid}/fd/{fd}")
        os.kill(pid, signal.SIGKILL)
        while open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z":
            time.sleep(0.001)
        t = time.monotonic()
        os.waitpid(pid, 0)
        reaped = True
        return (time.monotonic() - t) * 1e3
    finally:
        os.close(ready_r)
        # Only a child not reaped yet: its PID is still its own.
        if not reaped:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=10000)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    for reads, what in ((0, "nothing read"), (1, "each fdinfo read"), (2, "each fdinfo and fd link read")):
        times = [one(args.n, reads) for _ in range(args.runs)]
        print(f"{args.n} fds, {what}: reaped in {statistics.median(times):.1f} ms "
              f"(median of {args.runs}, {min(times):.1f}-{max(times):.1f})")


if __name__ == "__main__":
    main()
