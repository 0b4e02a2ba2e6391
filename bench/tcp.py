#!/usr/bin/python3
"""Pause of a checkpoint + restore of a server holding N established TCP
connections, for each network lock method.

Two test hosts (network namespaces A and B on one veth link) are made for
every run. tests/tcp/tcp_hold_server runs in A, tests/tcp/tcp_hold_client
opens N connections to it from B, and each connection has unread data in
both directions. The server is checkpointed (`ferry --verbose checkpoint
--network-lock M`), then restored into A (`ferry --verbose restore`);
afterwards both programs check every byte and every connection, so a run
only counts when all N connections survived.

The phase lines of --verbose carry the wall clock, so the pause is measured
from the moment the lock starts to freeze (checkpoint) to the moment it is
thawed (restore), and split into:
  freeze    installing the lock (one map update / one nft transaction / one
            iptables-restore)
  capture   from the frozen network to the end of `ferry checkpoint`
            (repair-mode capture, memory, image, kill)
  restore   from the start of `ferry restore` to the thaw
  thaw      releasing the lock
(the gap between the two commands, here the time to start `ferry restore`,
is in the pause but not in a part). "service stopped" runs from the moment
the server's threads are frozen to the moment the restore lets them run
(phase "tree released"; with builds that released the tree after the
held packets, the end of phase "held packets"): it adds the survey of
every descriptor, which happens before the lock engages. "longest client wait" is the figure of record: one more connection
(the probe, tcp_stream.h) on which the client sends a request every
millisecond, from READY to 300 ms after the restore, and times each answer of a server
thread with its own clock. "both commands" is the wall time of `ferry checkpoint` (launch
to exit) plus `ferry restore` (launch to pidfile), as CRIU's baseline is
measured.

The eBPF lock's base (its program loaded and attached in the namespace,
once per host: docs/network-lock.md) is installed before each run with
`ferry network-lock --install-base --netns A`, as on a host where ferry
ran before; its time is the column "base installed ahead". With
--cold-base the checkpoint installs it itself (a host's first
checkpoint), and "both commands" holds it.

Usage: bench/tcp.py [--n 0,100,...] [--methods ebpf,nftables,iptables]
                    [--runs 3] [--out docs/benchmarks-tcp-latest.md]
Needs root. Writes a markdown table and a PNG plot (python3-matplotlib).
"""

import argparse
import ctypes
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FERRY = os.environ.get("FERRY_BIN", os.path.join(REPO, "target/release/ferry"))
PHASE = re.compile(r"(checkpoint|restore) (.+?)\s+([0-9.]+) ms \(total\s+([0-9.]+) ms\) at (\d+)")
# Made by main (not at import: --help leaves nothing behind).
IMAGES_ROOT = None
CLIENT_BYTES = 4096
PROBE_PORT = "7101"
PROBE = re.compile(r"# probe: longest wait ([0-9.]+) ms")
SERVER_BYTES = 4096


# --cold-base: the checkpoint installs the eBPF lock's base itself.
COLD_BASE = False
# More arguments of `ferry checkpoint` (--checkpoint-args) and of
# `ferry restore` (--restore-args).
CHECKPOINT_ARGS = []
RESTORE_ARGS = []


def sh(*args, check=True):
    return subprocess.run(args, check=check, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def build(work):
    bins = {}
    for name in ("tcp_hold_server", "tcp_hold_client"):
        out = os.path.join(work, name)
        sh("gcc", "-O2", "-g", "-Wall", "-o", out, os.path.join(REPO, "tests/tcp", name + ".c"))
        bins[name] = out
    return bins


class Hosts:
    """Namespaces A and B on one veth link; removed by close()."""

    def __init__(self, tag):
        self.a = f"ferry-bt-{os.getpid()}-{tag}-a"
        self.b = f"ferry-bt-{os.getpid()}-{tag}-b"
        sh("ip", "netns", "add", self.a)
        sh("ip", "netns", "add", self.b)
        sh("ip", "-n", self.a, "link", "add", "fa", "type", "veth", "peer", "name", "fb", "netns", self.b)
        for ns, dev, addr in ((self.a, "fa", "192.0.2.1/24"), (self.b, "fb", "192.0.2.2/24")):
            sh("ip", "-n", ns, "addr", "add", addr, "dev", dev)
            sh("ip", "-n", ns, "link", "set", dev, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")

    def close(self):
        for ns in (self.a, self.b):
            sh("ip", "netns", "delete", ns, check=False)


def wait_for(path, word, proc, timeout):
    end = time.time() + timeout
    while time.time() < end:
        try:
            with open(path) as f:
                if any(line.strip() == word for line in f):
                    return
        except FileNotFoundError:
            pass
        if proc.poll() is not None:
            raise RuntimeError(f"{path}: exited before {word}: {open(path).read()}")
        time.sleep(0.01)
    raise RuntimeError(f"{path}: no {word} within {timeout} s")


def in_netns(ns):
    fd = os.open(f"/run/netns/{ns}", os.O_RDONLY)

    libc = ctypes.CDLL(None, use_errno=True)

    def pre():
        if libc.setns(fd, 0x40000000) != 0:  # CLONE_NEWNET
            raise OSError(ctypes.get_errno(), "setns")
        os.setsid()
    return pre, fd


def start_in(ns, argv, log):
    """Starts argv in network namespace ns, in a new session, output to log."""
    pre, fd = in_netns(ns)
    try:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                                preexec_fn=pre, close_fds=True)
    finally:
        os.close(fd)


def phases(text):
    out = {}
    for m in PHASE.finditer(text):
        # (phase ms, wall clock at its end in us, wall clock at the command's start in us)
        at = int(m.group(5))
        out[(m.group(1), m.group(2).strip())] = (float(m.group(3)), at, at - float(m.group(4)) * 1e3)
    return out


def one_run(bins, n, method, work):
    hosts = Hosts(f"{method[:3]}{n}")
    procs = []
    try:
        port = "7100"
        base_ms = 0.0
        if method == "ebpf" and not COLD_BASE:
            t = time.time()
            sh(FERRY, "network-lock", "--install-base", "--netns", f"/run/netns/{hosts.a}")
            base_ms = (time.time() - t) * 1e3
        slog, clog = os.path.join(work, "server.log"), os.path.join(work, "client.log")
        # The seventh argument is the probe's port: one more connection on
        # which the client sends a request every millisecond and times the
        # answers with its own clock ("longest client wait").
        args = ["192.0.2.1", port, str(n), str(CLIENT_BYTES), str(SERVER_BYTES), PROBE_PORT]
        server = start_in(hosts.a, [bins["tcp_hold_server"]] + args, slog)
        procs.append(server)
        wait_for(slog, "LISTENING", server, 10)
        client = start_in(hosts.b, [bins["tcp_hold_client"]] + args, clog)
        procs.append(client)
        wait_for(clog, "READY", client, 120)
        wait_for(slog, "READY", server, 120)
        # Images on tmpfs, as in the CRIU baseline.
        images = os.path.join(IMAGES_ROOT, "images")
        # The server's parent reaps it the moment it dies, as a service
        # manager or shell would on SIGCHLD, not after `ferry checkpoint`
        # exits: the kernel's release of a process that had 10,000 fds
        # (their /proc entries) then runs beside ferry's last steps.
        reaped = {}
        reaper = threading.Thread(target=lambda: reaped.update(rc=server.wait(), us=time.time_ns() // 1000))
        reaper.start()
        ck_start = time.time()
        ck = subprocess.run([FERRY, "--verbose", "checkpoint", "--pid", str(server.pid), "--images", images, "--network-lock", method] + CHECKPOINT_ARGS,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        ck_end = time.time_ns() // 1000
        ck_wall = time.time() - ck_start
        if ck.returncode != 0:
            server.kill()
            reaper.join()
            raise RuntimeError(f"checkpoint failed: {ck.stderr}")
        reaper.join()
        reaped_us = reaped["us"]
        procs.remove(server)
        pidfile = os.path.join(work, "pid")
        if os.path.exists(pidfile):
            os.unlink(pidfile)
        rs_start = time.time()
        restore = subprocess.Popen([FERRY, "--verbose", "restore", "--images", images, "--netns", hosts.a, "--pidfile", pidfile] + RESTORE_ARGS,
                                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        procs.append(restore)
        end = time.time() + 60
        while not (os.path.exists(pidfile) and open(pidfile).read().endswith("\n")):
            if restore.poll() is not None or time.time() > end:
                raise RuntimeError(f"restore failed: {restore.stderr.read()}")
            time.sleep(0.001)
        rs_wall = time.time() - rs_start
        pid = int(open(pidfile).read())
        os.kill(pid, signal.SIGUSR2)
        client.send_signal(signal.SIGUSR2)
        client.wait(timeout=180)
        _, rs_err = restore.communicate(timeout=180)
        procs.clear()
        slog_text, clog_text = open(slog).read(), open(clog).read()
        if restore.returncode != 0 or "PASS" not in slog_text.split() or client.returncode != 0:
            raise RuntimeError(f"connections did not survive: server {restore.returncode}: {slog_text[-500:]} client: {clog_text[-500:]}")
        if os.environ.get("BENCH_TCP_PHASES"):
            print("".join(l + "\n" for l in (ck.stderr + rs_err).splitlines() if "phases" in l), file=sys.stderr)
        if os.environ.get("BENCH_TCP_LOG"):
            # Every --verbose line of both commands (the phases' own splits too).
            with open(os.environ["BENCH_TCP_LOG"], "a") as f:
                # Between the commands: the checkpoint's exit as this
                # script saw it, the killed server reaped, the restore started.
                between = f"# checkpoint exited at {ck_end} us, server reaped at {reaped_us} us, restore started at {int(rs_start * 1e6)} us\n"
                f.write(f"# N={n} {FERRY}\n{ck.stderr}{between}{rs_err}")
        cp, rp = phases(ck.stderr), phases(rs_err)
        row = {"n": n, "method": method, "base": base_ms}
        # The lock starts to freeze right after the survey; with no
        # connection there is no lock, and the pause runs to the end of
        # the restore's connection phase.
        start_us = cp[("checkpoint", "survey")][1]
        if n == 0:
            row.update(freeze=0.0, thaw=0.0)
            thaw_end_us = rp[("restore", "tcp resend")][1]
        else:
            row["freeze"] = cp[("checkpoint", "network freeze")][0]
            row["thaw"] = rp[("restore", "network thaw")][0]
            thaw_end_us = rp[("restore", "network thaw")][1]
        restore_start_us = min(v[2] for v in rp.values())
        row["capture"] = (ck_end - start_us) / 1e3 - row["freeze"]
        row["restore"] = (thaw_end_us - restore_start_us) / 1e3 - row["thaw"]
        row["pause"] = (thaw_end_us - start_us) / 1e3
        # Whole commands, as CRIU's baseline is measured: checkpoint from
        # launch to exit, restore from launch to the pidfile.
        row["commands"] = (ck_wall + rs_wall) * 1e3
        # The service's own pause: from the moment its threads stop to the
        # moment the restore lets them run.
        frozen_us = cp[("checkpoint", "freeze")][1] - cp[("checkpoint", "freeze")][0] * 1e3
        released = rp.get(("restore", "tree released")) or rp[("restore", "held packets")]
        row["service"] = (released[1] - frozen_us) / 1e3
        probe = PROBE.search(clog_text)
        if probe is None:
            raise RuntimeError(f"the client printed no probe line: {clog_text[-500:]}")
        row["client"] = float(probe.group(1))
        return row
    finally:
        for p in procs:
            try:
                p.kill()
                p.wait(timeout=10)
            except Exception:
                pass
        hosts.close()
        subprocess.run([FERRY, "network-lock", "--release-stale"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def measure(bins, n, method, work, count):
    """The median of `count` runs with `n` connections under lock `method`."""
    runs = [one_run(bins, n, method, work) for _ in range(count)]
    med = {k: statistics.median(r[k] for r in runs) for k in ("pause", "freeze", "capture", "restore", "thaw", "service", "commands", "client", "base")}
    med.update(n=n, method=method, runs=len(runs), spread=(min(r["pause"] for r in runs), max(r["pause"] for r in runs)))
    print(f"{method:9} N={n:6}: pause {med['pause']:8.1f} ms  freeze {med['freeze']:7.2f}  capture {med['capture']:8.1f}  "
          f"restore {med['restore']:8.1f}  thaw {med['thaw']:7.2f}  longest client wait {med['client']:8.1f} (ms, median of {len(runs)})", flush=True)
    return med


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", default="0,100,500,1000,2000,5000,10000")
    ap.add_argument("--methods", default="ebpf,nftables,iptables")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(REPO, "docs/benchmarks-tcp-latest.md"))
    ap.add_argument("--checkpoint-args", default="", help="more arguments of ferry checkpoint, e.g. --no-verify")
    ap.add_argument("--restore-args", default="", help="more arguments of ferry restore, e.g. --no-check")
    ap.add_argument("--cold-base", action="store_true", help="let the checkpoint install the eBPF lock's base (a host's first checkpoint)")
    args = ap.parse_args()
    global COLD_BASE
    COLD_BASE = args.cold_base
    CHECKPOINT_ARGS.extend(args.checkpoint_args.split())
    RESTORE_ARGS.extend(args.restore_args.split())
    if os.geteuid() != 0:
        sys.exit("bench/tcp.py: needs root")
    ns = [int(x) for x in args.n.split(",")]
    methods = args.methods.split(",")
    global IMAGES_ROOT
    IMAGES_ROOT = tempfile.mkdtemp(prefix="ferry-bench-tcp-", dir="/dev/shm")
    work = tempfile.mkdtemp(prefix="ferry-bench-tcp-")
    results = []
    try:
        bins = build(work)
        for method in methods:
            for n in ns:
                results.append(measure(bins, n, method, work, args.runs))
    finally:
        # Also when a run fails: its images and programs go with it.
        subprocess.run(["rm", "-rf", work, IMAGES_ROOT])
    lines = [
        "| lock | N | pause (ms) | longest client wait (ms) | freeze (ms) | capture (ms) | restore (ms) | thaw (ms) | pause min-max (ms) | service stopped (ms) | both commands (ms) | base installed ahead (ms) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(f"| {r['method']} | {r['n']:,} | {r['pause']:.1f} | {r['client']:.1f} | {r['freeze']:.2f} | {r['capture']:.1f} | {r['restore']:.1f} | "
                     f"{r['thaw']:.2f} | {r['spread'][0]:.1f}-{r['spread'][1]:.1f} | {r['service']:.1f} | {r['commands']:.1f} | "
                     f"{'-' if COLD_BASE or r['method'] != 'ebpf' else format(r['base'], '.1f')} |")
    table = "\n".join(lines)
    print(table)
    with open(args.out, "w") as f:
        extra = f" --checkpoint-args={args.checkpoint_args}" if args.checkpoint_args else ""
        extra += f" --restore-args={args.restore_args}" if args.restore_args else ""
        extra += " --cold-base" if COLD_BASE else ""
        f.write(f"<!-- written by: bench/tcp.py --n {args.n} --methods {args.methods} --runs {args.runs}{extra} -->\n")
        f.write(f"Checkpoint + restore of a server holding N established TCP connections (from another test host, images on tmpfs, "
                f"{CLIENT_BYTES} B unread each way per connection); median of {args.runs} runs; every connection checked "
                f"byte for byte afterwards. \"longest client wait\": the longest answer of the server, timed by the client's own clock, "
                f"on one more connection that sends a request every millisecond throughout.\n\n{table}\n")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for method in methods:
            rs = [r for r in results if r["method"] == method]
            ax.plot([r["n"] for r in rs], [r["pause"] for r in rs], marker="o", label=f"{method}: pause")
            ax.plot([r["n"] for r in rs], [r["client"] for r in rs], marker="s", label=f"{method}: longest client wait")
            ax.plot([r["n"] for r in rs], [r["freeze"] + r["thaw"] for r in rs], linestyle="--", marker=".", label=f"{method}: freeze + thaw")
        # CRIU 4.2 on this machine kind (../shared/criu-baseline.md), dump +
        # restore commands with its unsafe no-lock mode: the reference.
        criu = [(0, 29 + 24), (100, 36 + 27), (500, 49 + 35), (1000, 60 + 37), (2000, 91 + 57), (5000, 213 + 108), (10000, 604 + 173)]
        ax.plot([c[0] for c in criu], [c[1] for c in criu], color="gray", linestyle=":", marker="x", label="CRIU 4.2, no lock (dump + restore)")
        ax.set_xlabel("established connections")
        ax.set_ylabel("ms")
        ax.set_title("ferry: pause of checkpoint + restore vs connections")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
        png = os.path.splitext(args.out)[0] + ".png"
        fig.tight_layout()
        fig.savefig(png, dpi=110)
        print(f"plot: {png}")
    except ImportError:
        print("python3-matplotlib missing: no plot")


if __name__ == "__main__":
    main()
