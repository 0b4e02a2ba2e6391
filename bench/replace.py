#!/usr/bin/python3
"""In-place replacement (`ferry replace`): the pause of each replacement and
where it goes, for a small server and for redis, under a client that keeps
sending.

Each server runs on 127.0.0.1 (a port picked free), in a session of its own,
stdio on /dev/null or a file of its own. One client connection sends INCR
in a loop (one request in flight) and checks every reply is the previous
one plus one; it records the longest request. The server is replaced --runs
times in a row, --gap seconds apart; each `ferry replace` prints its pause
and the pause's parts, which this script collects (min / median / max of
the pause, the median of each part). Failed requests and a counter that is
not exact at the end are reported (the goal is 0).

The script makes itself a child subreaper and reaps each server's old
process as soon as ferry kills it (its PID must come free for the new one;
the new process is reparented to this script when ferry exits).

Usage: bench/replace.py [--servers counter,redis] [--runs 20] [--gap 0.2]
         [--ferry target/release/ferry] [--out docs/benchmarks-replace-latest.md]
Needs root, gcc, redis-server, and a release build of ferry
(`cargo build --release`; CARGO_TARGET_DIR is honoured).
"""
import argparse
import ctypes
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PR_SET_CHILD_SUBREAPER = 36


def default_ferry():
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    return os.path.join(target, "release", "ferry")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(argv, out_path):
    with open(out_path, "wb") as out:
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                             stderr=subprocess.STDOUT, start_new_session=True,
                             close_fds=True)
    return p.pid


def wait_port(port, limit=10.0):
    end = time.time() + limit
    while time.time() < end:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.02)
    raise RuntimeError(f"nothing listens on port {port}")


class Reaper(threading.Thread):
    """Reaps `pid` each time a process under that PID ends while it is this
    script's child (the original, and every new one once ferry exited):
    on SIGCHLD, as a service manager does (the restore of a replacement
    waits for the old PID in the pause), and every 5 ms besides."""

    def __init__(self, pid):
        super().__init__(daemon=True)
        self.pid, self.stop = pid, False
        signal.signal(signal.SIGCHLD, lambda *_: self.reap())

    def reap(self):
        try:
            os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            pass

    def run(self):
        while not self.stop:
            self.reap()
            time.sleep(0.005)


class Client(threading.Thread):
    """One connection, INCR after INCR; `redis` selects the protocol."""

    def __init__(self, port, redis):
        super().__init__(daemon=True)
        self.port, self.redis = port, redis
        self.stop, self.count, self.failed, self.longest = False, 0, 0, 0.0
        self.last, self.error = None, None

    def request(self, f, sock):
        sock.sendall(b"INCR ferry\r\n" if self.redis else b"INCR\n")
        line = f.readline()
        if not line:
            raise RuntimeError("connection closed")
        text = line.decode().strip()
        return int(text[1:] if self.redis else text)

    def run(self):
        sock = socket.create_connection(("127.0.0.1", self.port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        f = sock.makefile("rb")
        try:
            while not self.stop:
                t = time.perf_counter()
                v = self.request(f, sock)
                self.longest = max(self.longest, time.perf_counter() - t)
                if self.last is not None and v != self.last + 1:
                    self.failed += 1
                self.last = v
                self.count += 1
        except Exception as e:  # noqa: BLE001 - reported, not raised
            self.error = str(e)
            self.failed += 1


PAUSE = re.compile(r"pause ([0-9.]+) ms \(([^)]*)\)")


def replace_once(ferry, pid):
    out = subprocess.run([ferry, "replace", "--pid", str(pid)], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"ferry replace failed: {out.stderr.strip()}")
    m = PAUSE.search(out.stdout)
    if not m:
        raise RuntimeError(f"no pause in {out.stdout!r}")
    parts = {}
    for item in m.group(2).split(", "):
        name, ms = item.rsplit(" ", 1)
        parts[name] = float(ms)
    return float(m.group(1)), parts


def run_server(name, argv, port, redis, args):
    work = args.work
    pid = spawn(argv, os.path.join(work, f"{name}.out"))
    reaper = Reaper(pid)
    reaper.start()
    try:
        wait_port(port)
        client = Client(port, redis)
        client.start()
        time.sleep(0.5)
        pauses, parts = [], {}
        for _ in range(args.runs):
            p, pp = replace_once(args.ferry, pid)
            pauses.append(p)
            for k, v in pp.items():
                parts.setdefault(k, []).append(v)
            time.sleep(args.gap)
        client.stop = True
        client.join(5)
        return {
            "server": name, "runs": len(pauses), "pauses": pauses, "parts": parts,
            "requests": client.count, "failed": client.failed, "error": client.error,
            "longest_ms": client.longest * 1e3,
        }
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        time.sleep(0.05)
        reaper.stop = True
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)


def table(results):
    lines = ["| server | runs | pause min | median | max | median parts (ms) | client longest request | requests | failed |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        ps = r["pauses"]
        parts = ", ".join(f"{k} {statistics.median(v):.1f}" for k, v in r["parts"].items())
        lines.append(
            f"| {r['server']} | {r['runs']} | {min(ps):.1f} ms | {statistics.median(ps):.1f} ms | "
            f"{max(ps):.1f} ms | {parts} | {r['longest_ms']:.1f} ms | {r['requests']} | {r['failed']} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--servers", default="counter,redis")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--gap", type=float, default=0.2)
    ap.add_argument("--ferry", default=default_ferry())
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root")
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        sys.exit("prctl(PR_SET_CHILD_SUBREAPER) failed")
    results = []
    with tempfile.TemporaryDirectory(prefix="ferry-bench-replace-") as work:
        args.work = work
        for name in args.servers.split(","):
            port = free_port()
            if name == "counter":
                binary = os.path.join(work, "counter_server")
                subprocess.run(["gcc", "-O2", "-pthread", "-o", binary,
                                os.path.join(ROOT, "examples/counter_server.c")], check=True)
                results.append(run_server(name, [binary, str(port)], port, False, args))
            elif name == "redis":
                argv = ["/usr/bin/redis-server", "--port", str(port), "--bind", "127.0.0.1",
                        "--save", "", "--appendonly", "no", "--daemonize", "no",
                        "--dir", work]
                results.append(run_server(name, argv, port, True, args))
            else:
                sys.exit(f"unknown server {name}")
    text = table(results)
    print(text)
    for r in results:
        if r["error"]:
            print(f"{r['server']}: client error: {r['error']}")
    if args.out:
        with open(args.out, "w") as f:
            f.write(f"`bench/replace.py --servers {args.servers} --runs {args.runs} --gap {args.gap}`"
                    f" ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})\n\n{text}\n")


if __name__ == "__main__":
    main()
