#!/usr/bin/python3
"""Live migration between two test hosts: pause and total time against
memory size, against established connections, and nginx under ApacheBench
with a migration in the middle.

Test hosts are built as docs/migration.md describes: one bridge in a
network namespace of its own, and per host a network namespace on it plus
a PID and mount namespace of its own whose PID 1 is ferryd, after a tmpfs
on /run/ferry and a bpffs on /sys/fs/bpf. Hosts a and b run ferryd; host c
is a network namespace only, for the clients. `ferry migrate` runs inside
host a (nsenter into its init's network, PID and mount namespaces) and
moves the service to b; every number comes from its `--report` JSON
(pause_ms, total_ms, bytes_sent, rounds) except where said otherwise.
Hosts a and b are started afresh for every run.

Parts (--parts):
  mem    bench/migrate_mem.c at each --sizes MiB: "idle" (written once,
         then sleeps), "hot10-16" (loops over a hot set of 10 % of its pages
         writing one word per page, at most 16 MiB of pages per second),
         "hot10" (the same as fast as it can), and "seed" (seed 001's
         program: increments every byte of 100 MiB in a loop; 100 MiB only),
         under stop-and-copy (--no-precopy), pre-copy (default) and post-copy
         (--lazy; skipped with a note when ferry refuses it). After each
         migration the program at the destination checks all of its memory
         (SIGUSR1, "VERIFY OK"). Sizes of 512 MiB and up get one "first run"
         before the VM's memory is warmed up (kernel-facts.md) and the
         measured runs after; sizes that do not fit in MemAvailable are
         skipped with a note.
  conns  bench/migrate_echo_server.c (epoll echo) in a on a service address,
         bench/migrate_echo_client.c in c with N connections and 2,000
         messages/s in total; the migration (with --address) runs 2 s into
         the traffic; afterwards every connection must echo one more message
         (broken connections are counted; the goal is 0).
  ab     nginx (master + 1 worker) in a on the service address, `ab -t T -c C`
         from c; the migration runs at T/2 s; the same without a migration.

Diagnostics: BENCH_MIGRATE_TW=1 logs the TIME-WAIT sockets of each host
before each connections run; --keep keeps the logs (ferryd, servers,
clients, ab) in the work directory.

Usage: bench/migrate.py [--parts mem,conns,ab] [--sizes 16,64,256,1024,4096]
         [--workloads idle,hot10-16,hot10,seed] [--modes stop,pre,post]
         [--runs 3] [--conns 0,100,1000,5000,10000] [--conn-runs 3]
         [--concurrency 1,4,16,64,256] [--ab-seconds 20] [--insecure]
         [--wait-load 1.5 --wait-max 1800] [--out docs/benchmarks-migrate-latest.md]
Needs root, target/release/ferry and ferryd (`cargo build --release`), gcc,
nginx, ab (apache2-utils) and python3-matplotlib for the plots.
Ctrl-C (or any failure) kills the hosts' inits, the clients and everything
else it started, by PID, and deletes its namespaces.
"""

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FERRY = os.environ.get("FERRY_BIN", os.path.join(REPO, "target/release/ferry"))
FERRYD = os.environ.get("FERRYD_BIN", os.path.join(REPO, "target/release/ferryd"))
NGINX = "/usr/sbin/nginx"
PORT = 7070          # ferryd
SOURCE_PID_BASE = 5000  # --source-pid-base
ECHO_PORT = 7100
ECHO_RATE = 2000     # messages/s in total, all connections together
MODES = {"stop": ("stop-and-copy", ["--no-precopy"]), "pre": ("pre-copy", []), "post": ("post-copy", ["--lazy"])}
WORKLOADS = {
    # name: (description, argv after "migrate_mem" with {mib})
    "idle": ("idle: written once, then sleeps", ["idle", "{mib}"]),
    "hot10-16": ("busy: 10 % hot set, 16 MiB/s of page writes", ["hot", "{mib}", "10", "16"]),
    "hot10": ("busy: 10 % hot set, as fast as it can", ["hot", "{mib}", "10"]),
    "seed": ("busy: every byte incremented in a loop (seed 001's program)", ["seed", "{mib}"]),
}
SEED_MIB = 100

STARTED = []         # every Popen we started (root-namespace processes), killed by PID on exit
LOADS = []           # (time, 1-min load) sampled at every run


def log(msg):
    print(f"[migrate.py {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def sh(*args, check=True, timeout=60):
    return subprocess.run(args, check=check, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout)


def spawn(argv, logpath, **kw):
    """Starts argv in a new session (so Ctrl-C reaches only us and we clean
    up in order), output to logpath; remembered for the cleanup."""
    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=open(logpath, "w"), stderr=subprocess.STDOUT,
                         start_new_session=True, close_fds=True, **kw)
    STARTED.append(p)
    return p


def reap(p, timeout=10):
    """Kills p (by its PID, if it still runs) and reaps it."""
    if p.poll() is None:
        try:
            p.kill()
        except ProcessLookupError:
            pass
    try:
        p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pass
    if p in STARTED and p.poll() is not None:
        STARTED.remove(p)


def children_of(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def nspid(pid):
    """NSpid of pid: its PID in each PID namespace, outermost first."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    return [int(x) for x in line.split()[1:]]
    except OSError:
        pass
    return []


def wait_line(path, pattern, proc=None, timeout=30, after=0):
    """Waits until a line of path (from byte offset `after`) matches pattern;
    returns the match."""
    rx = re.compile(pattern)
    end = time.time() + timeout
    while True:
        try:
            with open(path, errors="replace") as f:
                f.seek(after)
                for line in f:
                    m = rx.search(line)
                    if m:
                        return m
        except FileNotFoundError:
            pass
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{os.path.basename(path)}: exited ({proc.returncode}) before /{pattern}/: {tail(path)}")
        if time.time() > end:
            raise RuntimeError(f"{os.path.basename(path)}: no /{pattern}/ within {timeout} s: {tail(path)}")
        time.sleep(0.02)


def tail(path, n=600):
    try:
        with open(path, errors="replace") as f:
            return f.read()[-n:].strip()
    except OSError:
        return ""


def load1():
    la = os.getloadavg()[0]
    LOADS.append((time.time(), la))
    return la


class Host:
    def __init__(self, name, netns, ip):
        self.name, self.netns, self.ip = name, netns, ip
        self.unshare = None    # `ip netns exec NS unshare ...` (unshare itself: ip execs it)
        self.init_pid = None   # ferryd, PID 1 inside, as seen from here

    def start_init(self, key, work):
        assert self.unshare is None
        script = (f"mkdir -p /run/ferry && mount -t tmpfs tmpfs /run/ferry && mount -t bpf bpf /sys/fs/bpf && "
                  f"exec {FERRYD} --listen {self.ip}:{PORT} --key {key}")
        logpath = os.path.join(work, f"ferryd-{self.name}.log")
        self.unshare = spawn(["ip", "netns", "exec", self.netns, "unshare", "--pid", "--fork", "--mount-proc", "--kill-child",
                              "sh", "-c", script], logpath)
        wait_line(logpath, r"^ferryd listening on", self.unshare, 10)
        kids = children_of(self.unshare.pid)
        if len(kids) != 1:
            raise RuntimeError(f"host {self.name}: init not found ({kids})")
        self.init_pid = kids[0]

    def stop_init(self):
        """SIGKILL to the host's PID 1 ends every process in the host; the
        init is our unshare's child, so its PID cannot have been reused
        while unshare has not been reaped."""
        if self.unshare is None:
            return
        if self.init_pid in children_of(self.unshare.pid):
            try:
                os.kill(self.init_pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            self.unshare.wait(timeout=20)
        except subprocess.TimeoutExpired:
            pass
        reap(self.unshare)
        self.unshare = None
        self.init_pid = None

    def enter(self):
        return ["nsenter", "-t", str(self.init_pid), "-n", "-p", "-m", "--"]

    def spawn(self, argv, logpath):
        """argv inside the host; returns the nsenter Popen (it forks the
        process and waits for it)."""
        return spawn(self.enter() + argv, logpath)

    def spawn_service(self, argv, logpath):
        """Like spawn, for the service to migrate: with --source-pid-base,
        its PIDs start above that number, as on a host that has run for a
        while, rather than right after ferryd's own, where they collide
        with the PID of b's worker (b then restores in a new PID namespace
        under a helper, one more fork of the memory)."""
        if SOURCE_PID_BASE > 0:
            sh(*self.enter(), "sh", "-c", f"echo {SOURCE_PID_BASE} > /proc/sys/kernel/ns_last_pid")
        return self.spawn(argv, logpath)

    def ip_cmd(self, *args, check=True):
        return sh("ip", "-n", self.netns, *args, check=check)


class Cluster:
    """Bridge namespace + hosts a, b (ferryd) and c (clients only)."""

    def __init__(self, work):
        self.work = work
        pid = os.getpid()
        self.tag = f"fbm{pid}"
        self.subnet = f"10.251.{pid % 250}"
        self.made = []
        self.key = os.path.join(work, "key")
        sh(FERRY, "keygen", self.key)
        self.br = self._netns("br")
        sh("ip", "-n", self.br, "link", "add", "br0", "type", "bridge", "mcast_snooping", "0")
        sh("ip", "-n", self.br, "link", "set", "br0", "up")
        self.hosts = {}
        for i, name in enumerate(("a", "b", "c")):
            ns = self._netns(name)
            sh("ip", "-n", self.br, "link", "add", f"p{name}", "type", "veth", "peer", "name", "eth0", "netns", ns)
            sh("ip", "-n", self.br, "link", "set", f"p{name}", "master", "br0", "up")
            h = Host(name, ns, f"{self.subnet}.{i + 1}")
            h.ip_cmd("addr", "add", f"{h.ip}/24", "dev", "eth0")
            h.ip_cmd("link", "set", "eth0", "up")
            self.hosts[name] = h
        self.service = f"{self.subnet}.100"
        # The client host opens many short connections (ab) and 10,000 long ones.
        c = self.hosts["c"].netns
        sh("ip", "netns", "exec", c, "sysctl", "-q", "-w", "net.ipv4.ip_local_port_range=10000 65535")
        sh("ip", "netns", "exec", c, "sysctl", "-q", "-w", "net.ipv4.tcp_tw_reuse=1")
        for h in ("a", "b"):
            sh("ip", "netns", "exec", self.hosts[h].netns, "sysctl", "-q", "-w", "net.core.somaxconn=20000")

    def _netns(self, name):
        ns = f"{self.tag}-{name}"
        sh("ip", "netns", "add", ns)
        self.made.append(ns)
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        return ns

    @property
    def a(self):
        return self.hosts["a"]

    @property
    def b(self):
        return self.hosts["b"]

    @property
    def c(self):
        return self.hosts["c"]

    def fresh(self, service=False):
        """New inits for a and b (nothing left of the last run); the service
        address on a when asked, and c's neighbour cache emptied (it may
        still point the service address at b)."""
        for h in (self.a, self.b):
            h.stop_init()
            h.ip_cmd("addr", "del", f"{self.service}/24", "dev", "eth0", check=False)
        self.c.ip_cmd("neigh", "flush", "all", check=False)
        for h in (self.a, self.b):
            h.start_init(self.key, self.work)
        if service:
            self.a.ip_cmd("addr", "add", f"{self.service}/24", "dev", "eth0")

    def stop(self):
        for h in (self.a, self.b):
            h.stop_init()

    def close(self):
        self.stop()
        for ns in reversed(self.made):
            sh("ip", "netns", "delete", ns, check=False)
        self.made = []

    def migrate(self, pid, extra, report, timeout=900):
        """`ferry migrate` inside a, to b. Returns (report dict or None,
        stdout, stderr, exit code)."""
        if os.path.exists(report):
            os.unlink(report)
        argv = self.a.enter() + [FERRY, "migrate", "--pid", str(pid), "--to", f"{self.b.ip}:{PORT}", "--key", self.key,
                                 "--report", report] + extra
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
        STARTED.append(p)
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            reap(p)  # nsenter; ferry itself ends with host a's init
            return None, "", f"timed out after {timeout} s", -1
        STARTED.remove(p)
        rep = None
        if p.returncode == 0 and os.path.exists(report):
            with open(report) as f:
                rep = json.load(f)
        return rep, out, err, p.returncode

    def signal_in_b(self, inner_pid, sig="USR1"):
        sh(*self.b.enter(), "kill", f"-{sig}", str(inner_pid))


def refused_lazy(err):
    e = err.lower()
    return ("lazy" in e or "post-copy" in e) and ("not supported" in e or "refus" in e or "unexpected argument" in e
                                                  or "not implemented" in e)


def first_error_line(err):
    """ferry's error (without its progress lines), on one line."""
    lines = [l.strip() for l in err.splitlines()
             if l.strip() and (not l.startswith("ferry: ") or l.startswith("ferry: error"))]
    return (" ".join(lines) or err.strip() or "no output").replace("|", "/")[:400]


def guarded(fn, row, *a):
    """Runs one measurement; a failure becomes the row's error instead of
    ending the benchmark (Ctrl-C still ends it)."""
    try:
        return fn(*a)
    except (RuntimeError, OSError, ValueError, subprocess.SubprocessError) as e:
        log(f"run failed: {e}")
        return dict(row, error=str(e).replace("\n", " ").replace("|", "/")[:400], load=os.getloadavg()[0])


def build(work):
    bins = {}
    for name in ("migrate_mem", "migrate_echo_server", "migrate_echo_client"):
        out = os.path.join(work, name)
        sh("gcc", "-O2", "-Wall", "-o", out, os.path.join(REPO, "bench", name + ".c"))
        bins[name] = out
    return bins


def mem_available_mib():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) // 1024
    return 0


def warm_up(bins, mib, work):
    """Touches mib MiB in a helper process that then exits (kernel-facts.md:
    the VM backs guest memory lazily; warm it before timing > 500 MiB)."""
    t = time.time()
    p = spawn([bins["migrate_mem"], "warm", str(mib)], os.path.join(work, "warm.log"))
    p.wait(timeout=600)
    STARTED.remove(p)
    log(f"warmed {mib} MiB in {time.time() - t:.1f} s")


# ---------------------------------------------------------------- memory

def mem_run(cl, bins, work, workload, mib, mode, insecure):
    la = load1()
    cl.fresh()
    logpath = os.path.join(work, f"mem-{workload}-{mib}-{mode}.log")
    argv = [bins["migrate_mem"]] + [a.format(mib=mib) for a in WORKLOADS[workload][1]]
    proc = cl.a.spawn_service(argv, logpath)
    row = {"workload": workload, "mib": mib, "mode": mode, "load": la}
    try:
        pid = int(wait_line(logpath, r"^READY (\d+)", proc, 60 + mib / 50).group(1))
        if workload != "idle":
            time.sleep(1.0)  # the writer's loop in its steady state
        extra = MODES[mode][1] + (["--insecure"] if insecure else [])
        rep, out, err, rc = cl.migrate(pid, extra, os.path.join(work, "report.json"), timeout=300 + mib // 4)
        if rep is None:
            row["error"] = first_error_line(err)
            row["refused_lazy"] = mode == "post" and refused_lazy(err)
            return row
        row.update(pause=rep["pause_ms"], total=rep["total_ms"], sent=rep["bytes_sent"], rounds=len(rep["rounds"]),
                   stop=rep.get("precopy_stop") or "-", report=rep)
        pc = rep.get("postcopy")
        if pc:
            # Post-copy: memory left at the source in the freeze and the time
            # after the resume until its last page had arrived.
            row.update(lazy=pc["lazy_bytes"], push_ms=pc["ms"], requests=pc["requests"])
        # The copy at the destination checks all of its memory.
        size_before = os.path.getsize(logpath)
        cl.signal_in_b(rep["dest_host_pid"])
        m = wait_line(logpath, r"^VERIFY (OK|BAD.*)", None, 60 + mib / 20, after=size_before)
        row["verified"] = m.group(1)
        if proc.poll() is None:
            row["verified"] += " (but the source copy still runs)"
        return row
    finally:
        cl.stop()
        reap(proc)


def part_mem(cl, bins, work, args, res):
    modes = args.modes.split(",")
    workloads = args.workloads.split(",")
    lazy_note = None
    plan = []
    for mib in [int(s) for s in args.sizes.split(",")]:
        for w in workloads:
            if w == "seed":
                continue
            plan.append((w, mib))
    if "seed" in workloads:
        plan.append(("seed", SEED_MIB))
    warmed = set()
    for i, (w, mib) in enumerate(plan):
        need = mib * 3 + 1024  # source + destination's page store + restored copy, plus room
        if mem_available_mib() < need:
            note = f"{w} {mib} MiB skipped: needs about {need} MiB, MemAvailable {mem_available_mib()} MiB"
            log(note)
            res["notes"].append(note)
            continue
        if mib >= args.cold_from and mib not in warmed:
            # One migration before the warm-up: the VM may not back this
            # memory yet (kernel-facts.md). Reported apart.
            r = guarded(mem_run, {"workload": "idle", "mib": mib, "mode": "pre"}, cl, bins, work, "idle", mib, "pre", args.insecure)
            r["cold"] = True
            res["mem_cold"].append(r)
            log(f"first run (before warm-up) idle {mib} MiB pre-copy: " + fmt_mem(r))
            warm_up(bins, mib * 3, work)
            warmed.add(mib)
        runs = 1 if mib >= 4096 else args.runs
        for mode in modes:
            if mode == "post" and lazy_note:
                continue
            rows = []
            for _ in range(runs):
                r = guarded(mem_run, {"workload": w, "mib": mib, "mode": mode}, cl, bins, work, w, mib, mode, args.insecure)
                log(f"{w} {mib} MiB {MODES[mode][0]}: " + fmt_mem(r))
                if r.get("refused_lazy"):
                    lazy_note = r["error"]
                    res["notes"].append(f"post-copy not measured: `ferry migrate --lazy` was refused: \"{lazy_note}\"")
                    break
                rows.append(r)
            if rows:
                res["mem"].append(summarise_mem(rows))


def fmt_mem(r):
    if "error" in r:
        return "FAILED: " + r["error"]
    return (f"pause {r['pause']:.1f} ms, total {r['total']:.1f} ms, {r['sent'] / 2**20:.1f} MiB sent, "
            f"{r['rounds']} rounds ({r['stop']}), "
            + (f"post-copy {r['lazy'] / 2**20:.1f} MiB in {r['push_ms']:.0f} ms after the resume, " if "push_ms" in r else "")
            + f"{r.get('verified', '?')}, load {r['load']:.2f}")


def summarise_mem(rows):
    ok = [r for r in rows if "error" not in r]
    s = {k: rows[0][k] for k in ("workload", "mib", "mode")}
    s["runs"], s["failed"] = len(rows), len(rows) - len(ok)
    s["errors"] = sorted({r["error"] for r in rows if "error" in r})
    s["loads"] = [r["load"] for r in rows]
    if ok:
        for k in ("pause", "total", "sent", "rounds"):
            s[k] = statistics.median(r[k] for r in ok)
        s["pauses"] = [r["pause"] for r in ok]
        if all("push_ms" in r for r in ok):
            s["push_ms"] = statistics.median(r["push_ms"] for r in ok)
            s["lazy"] = statistics.median(r["lazy"] for r in ok)
            s["requests"] = statistics.median(r["requests"] for r in ok)
        s["stop"] = ", ".join(sorted({r["stop"] for r in ok}))
        s["verified"] = "all OK" if all(r.get("verified") == "OK" for r in ok) else "; ".join(r.get("verified", "?") for r in ok)
        med = sorted(ok, key=lambda r: r["pause"])[len(ok) // 2]
        s["phases"] = med["report"]["source_phases"]
        s["dest_phases"] = med["report"]["dest_phases"]
        s["round_list"] = med["report"]["rounds"]
    return s


# ---------------------------------------------------------------- connections

def conn_run(cl, bins, work, n, insecure):
    la = load1()
    cl.fresh(service=True)
    slog, clog = os.path.join(work, f"echo-server-{n}.log"), os.path.join(work, f"echo-client-{n}.log")
    server = cl.a.spawn_service([bins["migrate_echo_server"], cl.service, str(ECHO_PORT)], slog)
    client = None
    row = {"n": n, "load": la}
    try:
        pid = int(wait_line(slog, r"^LISTENING (\d+)", server, 10).group(1))
        client = spawn(["ip", "netns", "exec", cl.c.netns, bins["migrate_echo_client"], cl.service, str(ECHO_PORT), str(n),
                        str(ECHO_RATE)], clog)
        wait_line(clog, r"^READY", client, 180)
        time.sleep(2)
        if os.environ.get("BENCH_MIGRATE_TW"):
            # Diagnostics: sockets left in TIME-WAIT by earlier runs in the hosts' namespaces.
            tw = {h.name: len(sh("ip", "netns", "exec", h.netns, "ss", "-tanH", "state", "time-wait").stdout.splitlines())
                  for h in (cl.a, cl.b, cl.c)}
            log(f"TIME-WAIT sockets before the migration: {tw}")
            log("in b: " + sh("ip", "netns", "exec", cl.b.netns, "ss", "-tanH", "state", "time-wait").stdout.strip().replace("\n", " / "))
        rep, out, err, rc = cl.migrate(pid, ["--address", f"{cl.service}/24"] + (["--insecure"] if insecure else []),
                                       os.path.join(work, "report.json"))
        if rep is None:
            row["error"] = first_error_line(err)
        else:
            row.update(pause=rep["pause_ms"], total=rep["total_ms"], sent=rep["bytes_sent"], report=rep)
        time.sleep(2)
        client.send_signal(signal.SIGUSR1)
        m = wait_line(clog, r"^RESULT conns=(\d+) ok=(\d+) broken=(\d+) msgs=(\d+) max_rtt_ms=([0-9.]+)", client, 120)
        row.update(ok=int(m.group(2)), broken=int(m.group(3)), msgs=int(m.group(4)), max_rtt=float(m.group(5)))
        if row["broken"]:
            row["client_says"] = tail(clog, 400)
        return row
    finally:
        if client is not None:
            reap(client)
        cl.stop()
        reap(server)


def part_conns(cl, bins, work, args, res):
    for n in [int(x) for x in args.conns.split(",")]:
        rows = []
        for _ in range(args.conn_runs):
            r = guarded(conn_run, {"n": n}, cl, bins, work, n, args.insecure)
            if "error" in r:
                log(f"N={n}: migration FAILED: {r['error']}; broken {r.get('broken')}")
            else:
                log(f"N={n}: pause {r['pause']:.1f} ms, total {r['total']:.1f} ms, broken {r['broken']}/{n}, "
                    f"longest client wait {r['max_rtt']:.1f} ms, load {r['load']:.2f}")
            rows.append(r)
        ok = [r for r in rows if "error" not in r]
        s = {"n": n, "runs": len(rows), "failed": len(rows) - len(ok), "loads": [r["load"] for r in rows],
             "broken": sum(r.get("broken", 0) for r in rows), "errors": sorted({r["error"] for r in rows if "error" in r})}
        if ok:
            for k in ("pause", "total", "max_rtt"):
                s[k] = statistics.median(r[k] for r in ok)
            s["pauses"] = [r["pause"] for r in ok]
            med = sorted(ok, key=lambda r: r["pause"])[len(ok) // 2]
            s["phases"] = med["report"]["source_phases"]
            s["dest_phases"] = med["report"]["dest_phases"]
        res["conns"].append(s)


# ---------------------------------------------------------------- nginx + ab

NGINX_CONF = """daemon off;
master_process on;
worker_processes 1;
pid {d}/nginx.pid;
error_log {d}/error.log;
worker_rlimit_nofile 20000;
events {{ worker_connections 10000; }}
http {{
    access_log off;
    default_type text/html;
    client_body_temp_path {d}/tmp/body;
    proxy_temp_path {d}/tmp/proxy;
    fastcgi_temp_path {d}/tmp/fastcgi;
    uwsgi_temp_path {d}/tmp/uwsgi;
    scgi_temp_path {d}/tmp/scgi;
    server {{
        listen {addr}:80 backlog=4096;
        root {d}/html;
    }}
}}
"""


def parse_ab(text):
    def num(pattern, default=None, conv=float):
        m = re.search(pattern, text, re.M)
        return conv(m.group(1)) if m else default
    r = {
        "complete": num(r"^Complete requests:\s+(\d+)", None, int),
        "failed": num(r"^Failed requests:\s+(\d+)", None, int),
        "non2xx": num(r"^Non-2xx responses:\s+(\d+)", 0, int),
        "seconds": num(r"^Time taken for tests:\s+([0-9.]+)"),
        "rps": num(r"^Requests per second:\s+([0-9.]+)"),
        "longest": num(r"^\s*100%\s+(\d+)", None, int),
        "p99": num(r"^\s*99%\s+(\d+)", None, int),
    }
    m = re.search(r"\(Connect: (\d+), Receive: (\d+), Length: (\d+), Exceptions: (\d+)\)", text)
    r["fail_kinds"] = f"connect {m.group(1)}, receive {m.group(2)}, length {m.group(3)}, exceptions {m.group(4)}" if m else ""
    return r


def ab_run(cl, work, conc, seconds, migrate, insecure):
    la = load1()
    cl.fresh(service=True)
    d = os.path.join(work, "nginx")
    shutil.rmtree(d, ignore_errors=True)
    for sub in ("html", "tmp"):
        os.makedirs(os.path.join(d, sub))
    os.chmod(d, 0o755)
    os.chmod(os.path.join(d, "html"), 0o755)
    with open(os.path.join(d, "html", "index.html"), "w") as f:
        f.write("<html><body>" + "ferry " * 100 + "</body></html>\n")  # ~ 630 bytes, like a small static page
    os.chmod(os.path.join(d, "html", "index.html"), 0o644)
    conf = os.path.join(d, "nginx.conf")
    with open(conf, "w") as f:
        f.write(NGINX_CONF.format(d=d, addr=cl.service))
    nlog = os.path.join(work, "nginx.log")
    nginx = cl.a.spawn_service([NGINX, "-c", conf, "-p", d + "/"], nlog)
    ab = None
    row = {"c": conc, "migrate": migrate, "load": la}
    try:
        pidfile = os.path.join(d, "nginx.pid")
        end = time.time() + 10
        while not (os.path.exists(pidfile) and open(pidfile).read().strip()):
            if nginx.poll() is not None or time.time() > end:
                raise RuntimeError(f"nginx did not start: {tail(nlog)} {tail(os.path.join(d, 'error.log'))}")
            time.sleep(0.02)
        pid = int(open(pidfile).read())
        url = f"http://{cl.service}/index.html"
        chk = sh("ip", "netns", "exec", cl.c.netns, "ab", "-n", "1", url, check=False, timeout=30)
        if "Complete requests:      1" not in chk.stdout:
            raise RuntimeError(f"nginx does not answer: {chk.stdout[-300:]} {chk.stderr[-300:]}")
        alog = os.path.join(work, f"ab-{conc}-{int(migrate)}.log")
        # -t before -n: -t implies -n 50000, which would end the run early.
        ab = spawn(["ip", "netns", "exec", cl.c.netns, "ab", "-r", "-s", "30", "-t", str(seconds), "-n", "100000000",
                    "-c", str(conc), url], alog)
        t0 = time.time()
        if migrate:
            time.sleep(seconds / 2)
            row["at"] = time.time() - t0
            rep, out, err, rc = cl.migrate(pid, ["--address", f"{cl.service}/24"] + (["--insecure"] if insecure else []),
                                           os.path.join(work, "report.json"))
            if rep is None:
                row["error"] = first_error_line(err)
            else:
                row.update(pause=rep["pause_ms"], total=rep["total_ms"])
        ab.wait(timeout=seconds + 120)
        STARTED.remove(ab)
        row.update(parse_ab(open(alog).read()))
        row["ab_rc"] = ab.returncode
        if row["complete"] is None:
            row["ab_says"] = tail(alog, 300)
        return row
    finally:
        if ab is not None:
            reap(ab)
        cl.stop()
        reap(nginx)


def part_ab(cl, work, args, res):
    if not shutil.which("ab") or not os.path.exists(NGINX):
        note = "nginx + ab part skipped: ab (apache2-utils) or nginx missing (scripts/install-deps.sh)"
        log(note)
        res["notes"].append(note)
        return
    for conc in [int(x) for x in args.concurrency.split(",")]:
        for migrate in (False, True):
            r = guarded(ab_run, {"c": conc, "migrate": migrate, "complete": None, "failed": None, "non2xx": None},
                        cl, work, conc, args.ab_seconds, migrate, args.insecure)
            what = "with migration" if migrate else "no migration"
            mig = ""
            if migrate:
                mig = f", migration {'FAILED: ' + r['error'] if 'error' in r else 'pause %.1f ms' % r['pause']}"
            log(f"ab -c {conc} {what}: {r.get('complete')} requests, {r.get('failed')} failed ({r.get('fail_kinds')}), "
                f"{r.get('non2xx')} non-2xx, {r.get('rps')} req/s, longest {r.get('longest')} ms{mig}, load {r['load']:.2f}")
            res["ab"].append(r)


# ---------------------------------------------------------------- output

def rng(vals):
    return f"{min(vals):.1f}-{max(vals):.1f}" if len(vals) > 1 else f"{vals[0]:.1f}"


def write_markdown(res, args, out, started, ended):
    rev = sh("git", "-C", REPO, "rev-parse", "--short", "HEAD", check=False).stdout.strip() or "?"
    dirty = sh("git", "-C", REPO, "status", "--porcelain", "--untracked-files=no", check=False).stdout.strip()
    cpu = ""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    loads = [l for _, l in LOADS]
    L = []
    L.append(f"<!-- written by: {' '.join(['bench/migrate.py'] + sys.argv[1:])} -->")
    L.append("# Live migration benchmarks (latest run)")
    L.append("")
    L.append(f"- {time.strftime('%Y-%m-%d %H:%M', time.gmtime(started))}-{time.strftime('%H:%M UTC', time.gmtime(ended))}; "
             f"ferry {rev}{' (with uncommitted changes)' if dirty else ''}; kernel {os.uname().release}; "
             f"{os.cpu_count()} CPUs ({cpu})")
    L.append(f"- command: `/usr/bin/python3 {' '.join(['bench/migrate.py'] + sys.argv[1:])}`")
    if loads:
        L.append(f"- load average (1 min) when each run started: min {min(loads):.2f}, median {statistics.median(loads):.2f}, "
                 f"max {max(loads):.2f} over {len(loads)} runs; other work was running on the machine when it was above ~1")
    L.append(f"- two test hosts (netns on one bridge + own PID/mount namespace, ferryd as PID 1), "
             f"`ferry migrate` run in the source host; {'`--insecure`' if args.insecure else 'encrypted stream (default)'}; "
             "numbers from `ferry migrate --report` (pause_ms: from the freeze to the tree running at the destination)")
    for n in res["notes"]:
        L.append(f"- {n}")
    if res["mem"] or res["mem_cold"]:
        L.append("")
        L.append("## Pause and total time against memory size")
        L.append("")
        L.append("Median of the runs (one run at 4 GiB); memory checked by the migrated program afterwards (\"verified\").")
        L.append("")
        L.append("| workload | memory | mode | pause (ms) | pause min-max | total (ms) | sent (MiB) | pre-copy rounds | pre-copy ended "
                 "| post-copy: last page after resume (ms) | runs | verified | load |")
        L.append("|---|---:|---|---:|---:|---:|---:|---:|---|---:|---:|---|---|")
        for s in res["mem"]:
            name = f"{s['workload']}"
            load = rng(s["loads"])
            if "pause" not in s:
                L.append(f"| {name} | {s['mib']} MiB | {MODES[s['mode']][0]} | failed | | | | | | | {s['runs']} | {'; '.join(s['errors'])} | {load} |")
                continue
            failed = f" ({s['failed']} failed: {'; '.join(s['errors'])})" if s["failed"] else ""
            L.append(f"| {name} | {s['mib']} MiB | {MODES[s['mode']][0]} | {s['pause']:.1f} | {rng(s['pauses'])} | {s['total']:.1f} | "
                     f"{s['sent'] / 2**20:.1f} | {s['rounds'] if s['mode'] == 'pre' else '-'} | "
                     f"{s['stop'] if s['mode'] == 'pre' else '-'} | "
                     f"{'%.0f (%.1f MiB, %d requests)' % (s['push_ms'], s['lazy'] / 2**20, s['requests']) if 'push_ms' in s else '-'} | "
                     f"{s['runs']}{failed} | {s['verified']} | {load} |")
        L.append("")
        L.append("Workloads (bench/migrate_mem.c): " + "; ".join(f"*{k}*: {v[0]}" for k, v in WORKLOADS.items()) + ".")
        if res["mem_cold"]:
            L.append("")
            L.append(f"First migration of each size of {args.cold_from} MiB and more, before the VM's memory was warmed up "
                     "(idle workload, pre-copy; one run each; the machine had been up for a while, so part of its memory "
                     "may have been backed already):")
            L.append("")
            L.append("| memory | pause (ms) | total (ms) | sent (MiB) | load |")
            L.append("|---:|---:|---:|---:|---:|")
            for r in res["mem_cold"]:
                if "error" in r:
                    L.append(f"| {r['mib']} MiB | failed: {r['error']} | | | {r['load']:.2f} |")
                else:
                    L.append(f"| {r['mib']} MiB | {r['pause']:.1f} | {r['total']:.1f} | {r['sent'] / 2**20:.1f} | {r['load']:.2f} |")
        big = [s for s in res["mem"] if "phases" in s and s["mib"] == max(x["mib"] for x in res["mem"] if x["workload"] != "seed")]
        if big:
            L.append("")
            L.append(f"Where the time goes at {big[0]['mib']} MiB (source phases of the median run, ms; "
                     "the pause runs from the freeze to the end of \"destination release\"):")
            L.append("")
            for s in big:
                parts = ", ".join(f"{n} {ms:.1f}" for n, ms in s["phases"])
                rounds = ", ".join(f"{r['bytes'] / 2**20:.1f} MiB in {r['ms']:.0f} ms" for r in s["round_list"])
                dparts = ", ".join(f"{n} {ms:.1f}" for n, ms in s["dest_phases"])
                L.append(f"- {s['workload']}, {MODES[s['mode']][0]}: {parts}" + (f"; rounds: {rounds}" if rounds else "")
                         + f"; destination restore: {dparts}")
    if res["conns"]:
        L.append("")
        L.append("## Pause against established connections")
        L.append("")
        L.append(f"Epoll echo server (bench/migrate_echo_server.c) on the service address, moved with `--address`; "
                 f"N connections from the client host with {ECHO_RATE:,} messages/s in total "
                 f"(bench/migrate_echo_client.c); after the migration every connection must echo one more message. "
                 f"\"longest client wait\": the longest any message waited for its echo during the traffic.")
        L.append("")
        L.append("| connections | pause (ms) | pause min-max | total (ms) | longest client wait (ms) | broken connections | runs | load |")
        L.append("|---:|---:|---:|---:|---:|---:|---:|---|")
        for s in res["conns"]:
            failed = f" ({s['failed']} failed: {'; '.join(s['errors'])})" if s["failed"] else ""
            if "pause" in s:
                L.append(f"| {s['n']:,} | {s['pause']:.1f} | {rng(s['pauses'])} | {s['total']:.1f} | {s['max_rtt']:.1f} | "
                         f"{s['broken']} | {s['runs']}{failed} | {rng(s['loads'])} |")
            else:
                L.append(f"| {s['n']:,} | failed | | | | {s['broken']} | {s['runs']}{failed} | {rng(s['loads'])} |")
        top = [s for s in res["conns"] if "phases" in s]
        if top:
            s = top[-1]
            L.append("")
            L.append(f"Source phases of the median run at {s['n']:,} connections (ms): "
                     + ", ".join(f"{n} {ms:.1f}" for n, ms in s["phases"]) + "; destination restore: "
                     + ", ".join(f"{n} {ms:.1f}" for n, ms in s["dest_phases"]))
    if res["ab"]:
        L.append("")
        L.append("## nginx under ApacheBench, with and without a migration")
        L.append("")
        L.append(f"nginx {nginx_version()} (master + 1 worker) on the service address; "
                 f"`ab -r -s 30 -t {args.ab_seconds} -n 100000000 -c C http://SERVICE/index.html` from the client host "
                 f"(no keep-alive: one connection per request); the migration a -> b with `--address` "
                 f"{args.ab_seconds / 2:g} s into the run.")
        L.append("")
        L.append("| concurrency | migration | requests | failed | non-2xx | time (s) | requests/s | 99 % (ms) | longest (ms) | pause (ms) | load |")
        L.append("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for r in res["ab"]:
            mig = "yes" if r["migrate"] else "no"
            pause = (f"{r['pause']:.1f}" if "pause" in r else ("failed: " + r["error"] if "error" in r else "-"))
            failed = f"{r['failed']}" + (f" ({r['fail_kinds']})" if r.get("failed") else "")
            L.append(f"| {r['c']} | {mig} | {r.get('complete')} | {failed} | {r.get('non2xx')} | {r.get('seconds')} | "
                     f"{r.get('rps')} | {r.get('p99')} | {r.get('longest')} | {pause} | {r['load']:.2f} |")
    L.append("")
    L.append(f"Total benchmark time: {ended - started:.0f} s.")
    text = "\n".join(L) + "\n"
    with open(out, "w") as f:
        f.write(text)
    print(text)


def nginx_version():
    p = sh(NGINX, "-v", check=False)
    m = re.search(r"nginx/([0-9.]+)", p.stderr + p.stdout)
    return m.group(1) if m else "?"


def clean_up(cl, work, keep, say):
    """Every namespace and process a run made, on every way out (signals
    ignored meanwhile); its work directory too unless `keep`."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    say("cleaning up")
    if cl is not None:
        cl.close()
    for p in list(STARTED):
        reap(p)
    if keep:
        say(f"kept {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)


def pyplot():
    """matplotlib's pyplot drawing to files, or None (said once) without it."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        return plt
    except ImportError:
        log("python3-matplotlib missing: no plots")
        return None


def plots(res, out):
    plt = pyplot()
    if plt is None:
        return
    base = os.path.splitext(out)[0]
    rows = [s for s in res["mem"] if "pause" in s and s["workload"] != "seed"]
    if rows:
        styles = {"stop": "-", "pre": "--", "post": ":"}
        markers = {"idle": "o", "hot10-16": "s", "hot10": "^"}
        for key, ylabel, suffix in (("pause", "pause (ms)", "pause"), ("total", "total migration time (ms)", "total")):
            fig, ax = plt.subplots(figsize=(7.5, 4.6))
            for w in WORKLOADS:
                for m in MODES:
                    rs = sorted((s for s in rows if s["workload"] == w and s["mode"] == m), key=lambda s: s["mib"])
                    if rs:
                        ax.plot([s["mib"] for s in rs], [s[key] for s in rs], linestyle=styles[m], marker=markers.get(w, "x"),
                                label=f"{w}, {MODES[m][0]}")
            if key == "pause":
                ax.axhline(10, color="gray", linewidth=0.8, linestyle=":")
                ax.axhline(50, color="gray", linewidth=0.8, linestyle="-.")
                ax.text(17, 10.5, "10 ms goal (small idle)", fontsize=7, color="gray")
                ax.text(17, 52, "50 ms goal (1 GiB, pre-copy, converging)", fontsize=7, color="gray")
            ax.set_xscale("log", base=2)
            sizes = sorted({s["mib"] for s in rows})
            ax.set_xticks(sizes)
            ax.set_xticklabels([f"{m // 1024} GiB" if m >= 1024 else f"{m} MiB" for m in sizes])
            ax.set_yscale("log")
            ax.set_xlabel("memory written by the program")
            ax.set_ylabel(ylabel)
            ax.set_title(f"ferry migrate between two test hosts: {suffix} vs memory size")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7, ncol=2)
            fig.tight_layout()
            png = f"{base}-{suffix}.png"
            fig.savefig(png, dpi=110)
            plt.close(fig)
            log(f"plot: {os.path.relpath(png, REPO)}")
    crs = [s for s in res["conns"] if "pause" in s]
    if crs:
        fig, ax = plt.subplots(figsize=(7, 4.2))
        ax.plot([s["n"] for s in crs], [s["pause"] for s in crs], marker="o", label="pause (report)")
        ax.plot([s["n"] for s in crs], [s["max_rtt"] for s in crs], marker=".", linestyle="--", label="longest client wait")
        ax.set_xlabel("established connections")
        ax.set_ylabel("ms")
        ax.set_title("ferry migrate of an echo server: pause vs connections")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        png = f"{base}-conns.png"
        fig.savefig(png, dpi=110)
        plt.close(fig)
        log(f"plot: {os.path.relpath(png, REPO)}")


def wait_quiet(args):
    if args.wait_load is None:
        return
    end = time.time() + args.wait_max
    while True:
        la = os.getloadavg()[0]
        if la < args.wait_load:
            log(f"load {la:.2f} < {args.wait_load}")
            return
        if time.time() > end:
            log(f"load still {la:.2f} after {args.wait_max} s: running anyway")
            return
        log(f"load {la:.2f} >= {args.wait_load}: waiting")
        time.sleep(30)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--parts", default="mem,conns,ab")
    ap.add_argument("--sizes", default="16,64,256,1024,4096", help="MiB")
    ap.add_argument("--workloads", default="idle,hot10-16,hot10,seed")
    ap.add_argument("--modes", default="stop,pre,post")
    ap.add_argument("--runs", type=int, default=3, help="runs per memory configuration (1 at 4 GiB and more)")
    ap.add_argument("--cold-from", type=int, default=512,
                    help="MiB: from this size on, one run before warming the VM's memory up, reported apart")
    ap.add_argument("--conns", default="0,100,1000,5000,10000")
    ap.add_argument("--conn-runs", type=int, default=3)
    ap.add_argument("--concurrency", default="1,4,16,64,256")
    ap.add_argument("--ab-seconds", type=int, default=20)
    ap.add_argument("--insecure", action="store_true", help="pass --insecure to ferry migrate")
    ap.add_argument("--wait-load", type=float, default=None, help="before each part, wait until the 1-min load is below this")
    ap.add_argument("--wait-max", type=int, default=1800, help="seconds to wait for --wait-load at most")
    ap.add_argument("--source-pid-base", type=int, default=5000,
                    help="the service on host a gets PIDs above this (0: right after ferryd's, colliding with b's worker)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (logs of ferryd, servers, clients, ab)")
    ap.add_argument("--out", default=os.path.join(REPO, "docs/benchmarks-migrate-latest.md"))
    args = ap.parse_args()
    global SOURCE_PID_BASE
    SOURCE_PID_BASE = args.source_pid_base
    if os.geteuid() != 0:
        sys.exit("bench/migrate.py: needs root")
    for b in (FERRY, FERRYD):
        if not os.access(b, os.X_OK):
            sys.exit(f"bench/migrate.py: {b} missing: cargo build --release")
    for w in args.workloads.split(","):
        if w not in WORKLOADS:
            sys.exit(f"bench/migrate.py: unknown workload {w}")
    for m in args.modes.split(","):
        if m not in MODES:
            sys.exit(f"bench/migrate.py: unknown mode {m}")
    # SIGTERM/SIGHUP end us like Ctrl-C: through the finally below.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda s, f: sys.exit(128 + s))
    # Ctrl-C, also when started in the background of a script (which
    # would otherwise leave SIGINT ignored).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    work = tempfile.mkdtemp(prefix="ferry-bench-migrate-")
    os.chmod(work, 0o755)  # nginx's workers (nobody) read their files in here
    cl = None
    res = {"mem": [], "mem_cold": [], "conns": [], "ab": [], "notes": []}
    started = time.time()
    try:
        bins = build(work)
        cl = Cluster(work)
        parts = args.parts.split(",")
        log(f"hosts {cl.tag}-a/b/c on {cl.subnet}.0/24, work dir {work}, load {load1():.2f}")
        if "mem" in parts:
            wait_quiet(args)
            part_mem(cl, bins, work, args, res)
        if "conns" in parts:
            wait_quiet(args)
            part_conns(cl, bins, work, args, res)
        if "ab" in parts:
            wait_quiet(args)
            part_ab(cl, work, args, res)
        ended = time.time()
        write_markdown(res, args, args.out, started, ended)
        plots(res, args.out)
    finally:
        # The cleanup is bounded; a second signal must not cut it short.
        clean_up(cl, work, args.keep, log)


if __name__ == "__main__":
    main()
