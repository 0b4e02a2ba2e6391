#!/usr/bin/env python3
"""bench/replace_precopy.py: the pause of `ferry replace` with and without
pre-copy, by memory size and writer.

For each size (--memory 16M,1G,4G) and writer (--writer idle,hot) it starts
tests/replace/memory_server.c with that much memory (hot: a 16th of it
rewritten all the time), replaces it --runs times with pre-copy and with
--no-precopy, checks every page and the counter after each replacement,
and prints a table of medians (pause, its parts, what pre-copy copied,
ferry's wall time); --out writes the table to a file too.

  CARGO_TARGET_DIR=... python3 bench/replace_precopy.py --memory 16M,1G,4G \\
      --writer idle,hot --runs 3 --out /tmp/replace-precopy.md

--ferry PATH takes that binary instead of the target dir's; --precopy-only
leaves out the --no-precopy runs; --raw FILE appends one JSON line per
replacement (two builds compared in turns, their runs pooled).
The first freeze of the trial before the freeze is a pause too: its
median (min-max) has a column of its own.

Needs root and a release build of ferry (target dir from CARGO_TARGET_DIR).
"""
import argparse, atexit, ctypes, json, os, re, shutil, signal, socket, statistics, subprocess, sys, tempfile, threading, time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def ferry_bin():
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(REPO, "target"))
    return os.path.join(target, "release", "ferry")


def mib(s):
    m = re.fullmatch(r"(\d+)([MG])", s.strip())
    if not m:
        sys.exit(f"--memory {s}: expected e.g. 16M or 1G")
    return int(m.group(1)) * (1024 if m.group(2) == "G" else 1)


class Server:
    def __init__(self, binary, size_mib, hot):
        Server.n = getattr(Server, "n", 0) + 1
        self.port = 30000 + (os.getpid() * 7 + Server.n * 101) % 20000
        argv = [binary, str(self.port), str(size_mib)] + (["hot"] if hot else [])
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True)
        self.pid = self.proc.pid
        for _ in range(3000):
            try:
                self.sock = socket.create_connection(("127.0.0.1", self.port))
                break
            except OSError:
                time.sleep(0.02)
        else:
            sys.exit("memory_server does not listen")
        self.f = self.sock.makefile("rw")

    def ask(self, line):
        self.f.write(line + "\n")
        self.f.flush()
        return self.f.readline().strip()

    def stop(self):
        try:
            with open(f"/proc/{self.pid}/comm") as c:
                if c.read().strip() == "memory_server":
                    os.kill(self.pid, signal.SIGKILL)
        except OSError:
            pass


def reaper(stop):
    while not stop.is_set():
        try:
            os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            pass
        time.sleep(0.001)


def measure(ferry, srv, runs, precopy, what):
    """`runs` replacements of srv, its memory and counter checked after each."""
    out = []
    for counter in range(1, runs + 1):
        out.append(one(ferry, srv, precopy))
        ok = srv.ask("CHECK")
        if not ok.startswith("OK") or srv.ask("INCR") != str(counter):
            sys.exit(f"{what}: memory or counter wrong after a replacement: {ok}")
    return out


def one(ferry, srv, precopy):
    args = [ferry, "replace", "--pid", str(srv.pid)] + ([] if precopy else ["--no-precopy"])
    t = time.time()
    r = subprocess.run(args, capture_output=True, text=True)
    wall = (time.time() - t) * 1e3
    line = next((l for l in r.stdout.splitlines() if l.startswith("replaced pid")), None)
    if r.returncode != 0 or not line:
        sys.exit(f"ferry replace failed: {r.stdout}{r.stderr}")
    pause = float(re.search(r"pause ([\d.]+) ms", line).group(1))
    inside = line.split("(")[1].split(")")[0]
    parts = dict((k, float(v)) for k, v in (p.rsplit(" ", 1) for p in inside.split(", ")))
    # The first freeze's own pause, when the trial was made before the freeze.
    first = re.search(r"first pause (?:of )?([\d.]+) ms", line)
    if first:
        parts["first pause"] = float(first.group(1))
    pre = re.search(r"pre-copied ([\d.]+) MiB in (\d+) rounds.*?([\d.]+) MiB copied in the pause", line)
    return pause, wall, parts, pre


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--memory", default="16M,1G,4G")
    ap.add_argument("--writer", default="idle,hot")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out")
    ap.add_argument("--ferry", help="the ferry binary (default: the target dir's release build)")
    ap.add_argument("--precopy-only", action="store_true", help="no --no-precopy runs")
    ap.add_argument("--raw", help="append one JSON line per replacement to this file")
    a = ap.parse_args()
    ferry = a.ferry or ferry_bin()
    libc = ctypes.CDLL(None)
    libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: the new root comes back here
    stop = threading.Event()
    threading.Thread(target=reaper, args=(stop,), daemon=True).start()
    tmp = tempfile.mkdtemp(prefix="ferry-bench-precopy-")
    atexit.register(shutil.rmtree, tmp, True)
    binary = os.path.join(tmp, "memory_server")
    subprocess.run(["gcc", "-O2", "-o", binary, os.path.join(REPO, "tests/replace/memory_server.c")], check=True)
    rows = ["| memory | writer | mode | pause median (min-max) | first pause median (min-max) | parts (median run) | pre-copy | ferry wall |",
            "|---|---|---|---|---|---|---|---|"]
    for size in a.memory.split(","):
        for writer in a.writer.split(","):
            for precopy in (True,) if a.precopy_only else (True, False):
                srv = Server(binary, mib(size), writer == "hot")
                try:
                    runs = measure(ferry, srv, a.runs, precopy, f"{size} {writer}")
                finally:
                    # Also on a failed run or ^C: the server is this script's.
                    srv.stop()
                if a.raw:
                    with open(a.raw, "a") as f:
                        for r in runs:
                            f.write(json.dumps({"memory": size, "writer": writer, "precopy": precopy,
                                                "ferry": ferry, "pause": r[0], "parts": r[2],
                                                "in_pause_mib": float(r[3].group(3)) if r[3] else None,
                                                "load": os.getloadavg()[0]}) + "\n")
                runs.sort(key=lambda r: r[0])
                med = runs[len(runs) // 2]
                parts = ", ".join(f"{k} {v:.1f}" for k, v in med[2].items())
                pre = f"{med[3].group(1)} MiB in {med[3].group(2)} rounds, {med[3].group(3)} MiB in the pause" if med[3] else "-"
                firsts = sorted(r[2]["first pause"] for r in runs if "first pause" in r[2])
                first = (f"{statistics.median(firsts):.1f} ms ({firsts[0]:.1f}-{firsts[-1]:.1f})"
                         if firsts else "-")
                row = (f"| {size} | {writer} | {'pre-copy' if precopy else '--no-precopy'} | "
                       f"{med[0]:.1f} ms ({runs[0][0]:.1f}-{runs[-1][0]:.1f}) | {first} | {parts} | {pre} | "
                       f"{statistics.median(r[1] for r in runs):.0f} ms |")
                rows.append(row)
                print(row, flush=True)
    stop.set()
    table = "\n".join(rows) + "\n"
    print(table)
    if a.out:
        with open(a.out, "w") as f:
            f.write(table)


if __name__ == "__main__":
    main()
