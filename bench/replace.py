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
the pause, the median of each part; when the trial was made before the
freeze, the first freeze's own pause is the part "first pause" and the
runs whose final image was tried again in the pause are counted). Failed requests and a counter that is
not exact at the end are reported (the goal is 0).

The script makes itself a child subreaper and reaps each server's old
process as soon as ferry kills it (its PID must come free for the new one;
the new process is reparented to this script when ferry exits).

Usage: bench/replace.py [--servers counter,redis,memcached] [--runs 20] [--gap 0.2]
         [--ferry target/release/ferry] [--out docs/benchmarks-replace-latest.md]
         [--phases] [--raw FILE]

--raw FILE appends one JSON line per replacement (server, ferry, pause,
parts, time, load average), to pool runs of builds measured in turns.

--phases runs `ferry -v replace` and adds a table of the median of every
phase ferry lists (pre-copy, the capture's, the restores', the replace's).

--load (the measure of the issue, after AnT's): --clients connections send
throughout, each INCR on a key of its own (every reply checked), each
request timed by the client's own clock. The server is replaced --runs
times at random intervals (uniform between 0.5 and 1.5 times 1/--rate
seconds: one a second by default); then, with the same clients and no
replacement, the same duration again. It reports the pause (min / median /
max, the median of each part), the longest request the clients saw with
and without replacements (the extra is the difference), the throughput of
both windows and the loss, and failed requests; with matplotlib, a plot of
the longest request per 20 ms through the replacement window
(--plot-dir, docs/ by default).

  bench/replace.py --load --servers redis --runs 100 --clients 4
Needs root, gcc, redis-server (memcached for it), and a release build of ferry
(`cargo build --release`; CARGO_TARGET_DIR is honoured).
"""
import argparse
import ctypes
import json
import os
import re
import shlex
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
    """One connection, INCR after INCR; `redis` selects the protocol. With
    `times`, every request's (end, duration) is kept."""

    def __init__(self, port, redis, key="ferry", times=None):
        super().__init__(daemon=True)
        # `redis` is the protocol: False (the counter), "redis" or "memcached".
        self.port, self.redis, self.key, self.times = port, redis, key, times
        self.stop, self.count, self.failed, self.longest = False, 0, 0, 0.0
        self.last, self.error = None, None

    def request(self, f, sock):
        if self.redis == "memcached":
            if self.last is None:
                sock.sendall(f"set {self.key} 0 0 1\r\n0\r\n".encode())
                f.readline()
            sock.sendall(f"incr {self.key} 1\r\n".encode())
        else:
            sock.sendall(f"INCR {self.key}\r\n".encode() if self.redis else b"INCR\n")
        line = f.readline()
        if not line:
            raise RuntimeError("connection closed")
        text = line.decode().strip()
        return int(text[1:] if self.redis == "redis" else text)

    def run(self):
        sock = socket.create_connection(("127.0.0.1", self.port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        f = sock.makefile("rb")
        try:
            while not self.stop:
                t = time.perf_counter()
                v = self.request(f, sock)
                end = time.perf_counter()
                self.longest = max(self.longest, end - t)
                if self.times is not None:
                    self.times.append((end, end - t))
                if self.last is not None and v != self.last + 1:
                    self.failed += 1
                self.last = v
                self.count += 1
        except Exception as e:  # noqa: BLE001 - reported, not raised
            self.error = str(e)
            self.failed += 1


# Arguments added to every `ferry replace` (--replace-args).
REPLACE_ARGS = []

PAUSE = re.compile(r"pause ([0-9.]+) ms \(([^)]*)\)")


PHASE = re.compile(r"^  (\S.*?)\s+([0-9.]+) ms$", re.M)
# The first freeze's own pause, when the trial was made before the freeze.
FIRST_PAUSE = re.compile(r"first pause (?:of )?([0-9.]+) ms")


def replace_once(ferry, pid, phases=None):
    """(pause, {part: ms}); the parts include the CPU time of ferry and of
    the processes it waited for (wait4 of ferry alone: the server's old
    process, also this script's child, is not counted). With `phases` (a
    dict), `ferry -v` is run and each phase it lists is appended there."""
    argv = [ferry, "-v", "replace"] if phases is not None else [ferry, "replace"]
    p = subprocess.Popen(argv + ["--pid", str(pid)] + REPLACE_ARGS, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, close_fds=True)
    text = p.stdout.read()
    p.stdout.close()
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        raise RuntimeError(f"ferry replace failed: {text.strip()}")
    m = PAUSE.search(text)
    if not m:
        raise RuntimeError(f"no pause in {text!r}")
    parts = {}
    for item in m.group(2).split(", "):
        name, ms = item.rsplit(" ", 1)
        parts[name] = float(ms)
    first = FIRST_PAUSE.search(text)
    if first:
        parts["first pause"] = float(first.group(1))
        # 1 when the final image changed shape and was tried in the pause.
        parts["tried again"] = 1.0 if "tried again in the pause" in text else 0.0
    parts["ferry's cpu"] = (usage.ru_utime + usage.ru_stime) * 1e3
    if phases is not None:
        for name, ms in PHASE.findall(text):
            phases.setdefault(name, []).append(float(ms))
    return float(m.group(1)), parts


def stop_server(pid, reaper):
    """Kills the server (by its PID, ours) and stops reaping for it."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    time.sleep(0.05)
    reaper.stop = True
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)


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
        phases = {} if args.phases else None
        for _ in range(args.runs):
            p, pp = replace_once(args.ferry, pid, phases)
            if args.raw:
                with open(args.raw, "a") as raw:
                    raw.write(json.dumps({"server": name, "ferry": args.ferry, "pause": p,
                                          "parts": pp, "utc": time.time(),
                                          "load": os.getloadavg()[0]}) + "\n")
            pauses.append(p)
            for k, v in pp.items():
                parts.setdefault(k, []).append(v)
            time.sleep(args.gap)
        client.stop = True
        client.join(5)
        return {
            "server": name, "runs": len(pauses), "pauses": pauses, "parts": parts,
            "requests": client.count, "failed": client.failed, "error": client.error,
            "longest_ms": client.longest * 1e3, "phases": phases,
        }
    finally:
        stop_server(pid, reaper)


def window(clients, start, end):
    """(requests, longest request in ms) of requests that ended in [start, end)."""
    n, longest = 0, 0.0
    for c in clients:
        for t, d in c.times:
            if start <= t < end:
                n += 1
                longest = max(longest, d)
    return n, longest * 1e3


def per_replacement(clients, marks):
    """For each replacement, the longest request that ended while ferry
    ran or within 50 ms after: what a client saw of that replacement."""
    import bisect
    ends = sorted(t_d for c in clients for t_d in c.times)
    keys = [t for t, _ in ends]
    out = []
    for s, e in marks:
        lo, hi = bisect.bisect_left(keys, s), bisect.bisect_right(keys, e + 0.05)
        out.append(max((d for _, d in ends[lo:hi]), default=0.0) * 1e3)
    return out


def run_load(name, argv, port, redis, args):
    """Replacements at random intervals under --clients connections, then
    the same duration without; see the module's doc."""
    import random
    pid = spawn(argv, os.path.join(args.work, f"{name}.out"))
    reaper = Reaper(pid)
    reaper.start()
    try:
        wait_port(port)
        clients = [Client(port, redis, key=f"ferry{i}", times=[]) for i in range(args.clients)]
        for c in clients:
            c.start()
        time.sleep(1.0)
        pauses, parts, marks = [], {}, []
        mean = 1.0 / args.rate
        b0 = time.perf_counter()
        for _ in range(args.runs):
            time.sleep(random.uniform(0.5 * mean, 1.5 * mean))
            t = time.perf_counter()
            p, pp = replace_once(args.ferry, pid)
            marks.append((t, time.perf_counter()))
            parts.setdefault("ferry's whole run", []).append((marks[-1][1] - t) * 1e3)
            pauses.append(p)
            for k, v in pp.items():
                parts.setdefault(k, []).append(v)
        time.sleep(random.uniform(0.5 * mean, 1.5 * mean))
        b1 = time.perf_counter()
        time.sleep(b1 - b0)
        a1 = time.perf_counter()
        for c in clients:
            c.stop = True
        for c in clients:
            c.join(5)
        with_n, with_long = window(clients, b0, b1)
        without_n, without_long = window(clients, b1, a1)
        around = per_replacement(clients, marks)
        durations = sorted(d for c in clients for t, d in c.times if b1 <= t < a1)
        result = {
            "server": name, "runs": len(pauses), "pauses": pauses, "parts": parts,
            "clients": args.clients, "seconds": b1 - b0,
            "with": (with_n / (b1 - b0), with_long), "without": (without_n / (a1 - b1), without_long),
            "median_ms": durations[len(durations) // 2] * 1e3 if durations else 0.0,
            "failed": sum(c.failed for c in clients), "around": around,
            "error": "; ".join(c.error for c in clients if c.error) or None,
        }
        plot(name, clients, marks, b0, b1, args)
        return result
    finally:
        stop_server(pid, reaper)


def plot(name, clients, marks, b0, b1, args):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plot", file=sys.stderr)
        return
    step = 0.02
    bins = [0.0] * (int((b1 - b0) / step) + 1)
    for c in clients:
        for t, d in c.times:
            if b0 <= t < b1:
                i = int((t - b0) / step)
                bins[i] = max(bins[i], d * 1e3)
    fig, ax = plt.subplots(figsize=(10, 4))
    ax.plot([i * step for i in range(len(bins))], bins, lw=0.6, label="longest request per 20 ms")
    for i, (s, _) in enumerate(marks):
        ax.axvline(s - b0, color="red", lw=0.3, alpha=0.5, label="replacement" if i == 0 else None)
    ax.set_yscale("log")
    ax.set_xlabel("seconds")
    ax.set_ylabel("ms (client clock)")
    ax.set_title(f"{name}: {len(marks)} replacements under {len(clients)} clients")
    ax.legend(loc="upper right")
    path = os.path.join(args.plot_dir, f"replace-load-{name}.png")
    fig.savefig(path, dpi=100, bbox_inches="tight")
    print(f"plot: {path}")


def load_table(results):
    lines = ["| server | replacements | clients | pause min | median | max | median parts (ms) "
             "| longest request per replacement min / median / max "
             "| longest request with / without replacements | median request "
             "| throughput with / without | loss | failed |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        ps = r["pauses"]
        parts = median_parts(r["parts"])
        (tw, lw), (to, lo) = r["with"], r["without"]
        lines.append(
            f"| {r['server']} | {r['runs']} in {r['seconds']:.0f} s | {r['clients']} | "
            f"{min(ps):.1f} ms | {statistics.median(ps):.1f} ms | {max(ps):.1f} ms | {parts} | "
            f"{min(r['around']):.1f} / {statistics.median(r['around']):.1f} / "
            f"{max(r['around']):.1f} ms | "
            f"{lw:.1f} / {lo:.1f} ms | {r['median_ms']:.3f} ms | "
            f"{tw:.0f} / {to:.0f} req/s | {100 * (1 - tw / to):.1f} % | {r['failed']} |")
    return "\n".join(lines)


def phase_table(results):
    """The median of each phase `ferry -v` lists, one column per server."""
    names = []
    for r in results:
        for k in r.get("phases") or {}:
            if k not in names:
                names.append(k)
    lines = ["| phase (median ms) | " + " | ".join(r["server"] for r in results) + " |",
             "|---|" + "---:|" * len(results)]
    for k in names:
        cells = [f"{statistics.median(r['phases'][k]):.2f}" if k in (r.get("phases") or {})
                 else "-" for r in results]
        lines.append(f"| {k} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def median_parts(parts):
    """`name ms` of each part's median; how many runs tried again."""
    return ", ".join(f"{k} {statistics.median(v):.1f}" if k != "tried again"
                     else f"tried again in the pause in {int(sum(v))} of {len(v)}"
                     for k, v in parts.items())


def table(results):
    lines = ["| server | runs | pause min | median | max | median parts (ms) | client longest request | requests | failed |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        ps = r["pauses"]
        parts = median_parts(r["parts"])
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
    ap.add_argument("--replace-args", default="",
                    help="arguments added to every `ferry replace` (e.g. --single-freeze)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--load", action="store_true")
    ap.add_argument("--raw", default=None,
                    help="append each replacement's pause and parts as a JSON line to this file")
    ap.add_argument("--phases", action="store_true",
                    help="run `ferry -v replace` and add the median of every phase it lists")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--rate", type=float, default=1.0)
    ap.add_argument("--plot-dir", default=os.path.join(ROOT, "docs"))
    args = ap.parse_args()
    REPLACE_ARGS.extend(shlex.split(args.replace_args))
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
                if args.load:
                    sys.exit("--load needs a server with keys (redis, memcached)")
                results.append(run_server(name, [binary, str(port)], port, False, args))
            elif name == "redis":
                argv = ["/usr/bin/redis-server", "--port", str(port), "--bind", "127.0.0.1",
                        "--save", "", "--appendonly", "no", "--daemonize", "no",
                        "--dir", work]
                run = run_load if args.load else run_server
                results.append(run(name, argv, port, "redis", args))
            elif name == "memcached":
                argv = ["/usr/bin/memcached", "-u", "nobody", "-t", "4", "-l", "127.0.0.1",
                        "-p", str(port), "-U", "0"]
                run = run_load if args.load else run_server
                results.append(run(name, argv, port, "memcached", args))
            else:
                sys.exit(f"unknown server {name}")
    text = load_table(results) if args.load else table(results)
    if args.phases and not args.load:
        text += "\n\n" + phase_table(results)
    print(text)
    for r in results:
        if r["error"]:
            print(f"{r['server']}: client error: {r['error']}")
    if args.out:
        with open(args.out, "w") as f:
            mode = (f"--load --clients {args.clients} --rate {args.rate}" if args.load
                    else f"--gap {args.gap}")
            f.write(f"`bench/replace.py --servers {args.servers} --runs {args.runs} {mode}`"
                    f" ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})\n\n{text}\n")


if __name__ == "__main__":
    main()
