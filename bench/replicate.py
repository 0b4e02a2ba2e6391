#!/usr/bin/python3
"""Hot-standby replication between test hosts: redis's throughput and
latency under replication against unreplicated, the sync rate reached and
where one sync's time goes, the longest wait a client sees when the
primary's host dies, acknowledged writes lost, and split brain under a
partition.

Test hosts as bench/migrate.py builds them (a bridge in a namespace of its
own; hosts a and b with a PID and mount namespace each, ferryd as PID 1,
here with --etcd), plus host w, a network namespace where etcd runs as the
witness (started here, never a system service), and host c for the
clients. redis-server runs in a on the service address; `ferry replicate`
in a protects it with b as the standby.

Parts (--parts):
  load       redis-benchmark from c, GET and SET, at each --clients count,
             --requests each unreplicated, then replicated (fresh hosts
             for each; a fortieth of --requests, at least 100 per
             client). Throughput, p50/p99 latency (redis-benchmark's own
             clock), the syncs per second and bytes per sync from
             `ferry status --json`, and the mean of each capture phase of
             the syncs made during the run (FERRY_SYNC_TRACE=1).
  rate       the curve of overhead against write rate: 50 connections
             offering --rates writes per second in total (bench/
             rate_clients.py, paced by the client's clock), unreplicated
             and replicated (fresh hosts for each rate): the rate reached,
             the write latency p50/p99, the syncs per second; a plot
             (docs/benchmarks-replicate-rate.png).
  failover   --runs times: 10 connections from c each send INCR seq<i> and
             check every reply (tests/replication/seq_clients.py); 2 s in,
             host a's link goes down and its PID 1 is killed (everything
             of it dies); b takes over. The longest wait any client saw,
             b's takeover time, and the increments lost (the counter at b
             against the last value its client was told; goal 0).
  partition  --runs times: a and b are cut from each other (iptables in a)
             while both reach etcd and c; afterwards exactly one host runs
             redis and holds the address (split brain: both or none).

Usage: bench/replicate.py [--parts load,rate,failover,partition] [--clients 1,10,50] [--rates 20,...,2000]
         [--requests 20000] [--runs 20] [--heartbeat-timeout-ms MS]
         [--out docs/benchmarks-replicate-latest.md]
Needs root, target/release/ferry and ferryd, redis-server, redis-benchmark,
etcd (etcd-server) and iptables. Ctrl-C (or any failure) kills every
process it started, by PID, and deletes its namespaces.
"""

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import migrate as m  # noqa: E402  (the test hosts and process helpers)

REPO = m.REPO
SEQ_CLIENTS = os.path.join(REPO, "tests/replication/seq_clients.py")
REDIS_PORT = 6379
# `ferry replicate --heartbeat-timeout-ms` when --heartbeat-timeout-ms is given.
HEARTBEAT = []


def log(msg):
    print(f"[replicate.py {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Hosts(m.Cluster):
    """bench/migrate.py's cluster, with host w running etcd, and ferryd
    started with --etcd."""

    def __init__(self, work):
        super().__init__(work)
        ns = self._netns("w")
        sh_ = m.sh
        sh_("ip", "-n", self.br, "link", "add", "pw", "type", "veth", "peer", "name", "eth0", "netns", ns)
        sh_("ip", "-n", self.br, "link", "set", "pw", "master", "br0", "up")
        self.w = m.Host("w", ns, f"{self.subnet}.9")
        self.w.ip_cmd("addr", "add", f"{self.w.ip}/24", "dev", "eth0")
        self.w.ip_cmd("link", "set", "eth0", "up")
        self.etcd_url = f"http://{self.w.ip}:2379"
        self.etcd = None

    def start_etcd(self):
        data = os.path.join(self.work, "etcd")
        shutil.rmtree(data, ignore_errors=True)
        peer = f"http://{self.w.ip}:2380"
        logpath = os.path.join(self.work, "etcd.log")
        self.etcd = m.spawn(["ip", "netns", "exec", self.w.netns, "etcd", "--name", "w", "--data-dir", data,
                             "--listen-client-urls", self.etcd_url, "--advertise-client-urls", self.etcd_url,
                             "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                             "--initial-cluster", f"w={peer}"], logpath)
        m.wait_line(logpath, r"ready to serve client requests", self.etcd, 30)

    def fresh_hosts(self):
        """New inits for a and b with --etcd, a fresh etcd, the service
        address on a, iptables rules gone."""
        for h in (self.a, self.b):
            h.stop_init()
            h.ip_cmd("addr", "del", f"{self.service}/24", "dev", "eth0", check=False)
            h.ip_cmd("link", "set", "eth0", "up")
            # A ferry replicate killed with its host leaves its output hold
            # in place (fail closed): a new run starts without it.
            for table in ("filter", "mangle"):
                m.sh("ip", "netns", "exec", h.netns, "iptables", "-t", table, "-F", check=False)
        self.c.ip_cmd("neigh", "flush", "all", check=False)
        if self.etcd is not None:
            m.reap(self.etcd)
        self.start_etcd()
        for h in (self.a, self.b):
            start_ferryd(h, self.key, self.work, self.etcd_url)
        self.a.ip_cmd("addr", "add", f"{self.service}/24", "dev", "eth0")

    def close(self):
        if self.etcd is not None:
            m.reap(self.etcd)
        super().close()


def start_ferryd(h, key, work, etcd):
    script = (f"mkdir -p /run/ferry && mount -t tmpfs tmpfs /run/ferry && mount -t bpf bpf /sys/fs/bpf && "
              f"exec {m.FERRYD} --listen {h.ip}:{m.PORT} --key {key} --etcd {etcd}")
    logpath = os.path.join(work, f"ferryd-{h.name}.log")
    h.unshare = m.spawn(["ip", "netns", "exec", h.netns, "unshare", "--pid", "--fork", "--mount-proc", "--kill-child",
                         "sh", "-c", script], logpath)
    m.wait_line(logpath, r"^ferryd listening on", h.unshare, 10)
    kids = m.children_of(h.unshare.pid)
    if len(kids) != 1:
        raise RuntimeError(f"host {h.name}: init not found ({kids})")
    h.init_pid = kids[0]


def enter(h):
    """Into a host: its init's namespaces, or for c and w (no init) the
    network namespace alone."""
    return h.enter() if h.init_pid else ["ip", "netns", "exec", h.netns]


def in_host(h, argv, timeout=120):
    return m.sh(*enter(h), *argv, check=False, timeout=timeout)


def start_redis(cl, work):
    logpath = os.path.join(work, "redis.log")
    p = cl.a.spawn(["redis-server", "--bind", cl.service, "--port", str(REDIS_PORT), "--save", "", "--appendonly", "no",
                    "--protected-mode", "no", "--dir", work], logpath)
    end = time.time() + 15
    while time.time() < end:
        if in_host(cl.c, ["timeout", "2", "redis-cli", "-h", cl.service, "PING"]).stdout.strip() == "PONG":
            kids = m.children_of(p.pid)
            return p, m.nspid(kids[0])[-1]
        time.sleep(0.05)
    raise RuntimeError(f"redis does not answer: {m.tail(logpath)}")


def replicate(cl, work, inner_pid, trace=False):
    out = os.path.join(work, "replicate.out")
    env = ["env", "FERRY_SYNC_TRACE=1"] if trace else []
    p = cl.a.spawn(env + [m.FERRY, "replicate", "--pid", str(inner_pid), "--to", f"{cl.b.ip}:{m.PORT}", "--key", cl.key,
                          "--address", f"{cl.service}/24", "--etcd", cl.etcd_url,
                          # redis's stdout: a log, not replicated state.
                          "--ignore-writes", os.path.join(work, "redis.log")] + HEARTBEAT, out)
    m.wait_line(out, r"in sync", p, 60)
    return p, out


def status(cl, host):
    r = in_host(host, [m.FERRY, "status", "--json"])
    try:
        return json.loads(r.stdout)
    except ValueError:
        return []


def benchmark(cl, test, clients, requests):
    r = in_host(cl.c, ["redis-benchmark", "-h", cl.service, "-p", str(REDIS_PORT), "-c", str(clients), "-n",
                       str(requests), "-t", test, "--csv"], timeout=600)
    for line in r.stdout.splitlines():
        f = [x.strip('"') for x in line.split(",")]
        if len(f) >= 7 and f[0] == test.upper():
            return {"rps": float(f[1]), "p50": float(f[4]), "p99": float(f[6])}
    raise RuntimeError(f"redis-benchmark {test}: {r.stdout[-300:]} {r.stderr[-300:]}")


def sync_phases(out, skip=0):
    """Median of each capture phase over the syncs FERRY_SYNC_TRACE
    printed, leaving out the first `skip` (those before the measured run:
    the first sync installs the network lock's base and presurveys the
    tree, one-time costs that would weigh on a short run), and how many
    syncs were counted. A phase a sync did not report counts as 0 for
    it (a build without that phase)."""
    values, n, seen = {}, 0, 0
    with open(out, errors="replace") as f:
        for line in f:
            if not line.startswith("sync ") or "capture_phases" not in line:
                continue
            seen += 1
            if seen <= skip:
                continue
            n += 1
            part = line.split("capture_phases: [", 1)[1]
            for item in part.split("), ("):
                name, _, ms = item.strip("()]} \n").rpartition(", ")
                try:
                    values.setdefault(name.strip('"'), []).append(float(ms))
                except ValueError:
                    pass
            for key in ("before_freeze_ms", "pause_ms", "send_and_store_ms", "total_ms"):
                v = line.split(f"{key}: ", 1)[1].split(",", 1)[0]
                values.setdefault(key, []).append(float(v))
    return {k: statistics.median(v + [0.0] * (n - len(v))) for k, v in values.items()} if n else {}, n


def part_load(cl, work, args, res):
    for clients in [int(x) for x in args.clients.split(",")]:
        for test in ("set", "get"):
            cl.fresh_hosts()
            redis, inner = start_redis(cl, work)
            plain = benchmark(cl, test, clients, args.requests)
            rp, out = replicate(cl, work, inner, trace=True)
            _, before = sync_phases(out)
            t = time.time()
            # At least a second or two of load at every client count.
            repl = benchmark(cl, test, clients, max(args.requests // 40, 100 * clients))
            secs = time.time() - t
            st = (status(cl, cl.a) or [{}])[0]
            phases, n = sync_phases(out, skip=before)
            row = {"test": test, "clients": clients, "plain": plain, "repl": repl, "syncs": n,
                   "syncs_per_s": n / secs if secs > 0 else 0, "bytes_per_sync": st.get("bytes_per_sync", 0),
                   "phases": phases}
            res["load"].append(row)
            log(f"{test} c={clients}: {plain['rps']:.0f} -> {repl['rps']:.0f} req/s, p50 {plain['p50']} -> {repl['p50']} ms")
            m.reap(rp)
            m.reap(redis)


RATE_CLIENTS = os.path.join(REPO, "bench/rate_clients.py")
RATE_CONNS = 50
RATE_SECS = 8


def offered(cl, rate):
    r = in_host(cl.c, ["python3", RATE_CLIENTS, cl.service, str(REDIS_PORT), str(RATE_CONNS), str(rate),
                       str(RATE_SECS)], timeout=RATE_SECS + 120)
    try:
        return json.loads(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise RuntimeError(f"rate_clients.py at {rate}/s: {r.stdout[-300:]} {r.stderr[-300:]}")


def part_rate(cl, work, args, res):
    for rate in [int(x) for x in args.rates.split(",")]:
        cl.fresh_hosts()
        redis, inner = start_redis(cl, work)
        plain = offered(cl, rate)
        rp, out = replicate(cl, work, inner, trace=True)
        _, before = sync_phases(out)
        repl = offered(cl, rate)
        _, after = sync_phases(out)
        res["rate"].append({"rate": rate, "plain": plain, "repl": repl,
                            "syncs_per_s": (after - before) / RATE_SECS})
        log(f"rate {rate}/s: reached {plain['reached']:.0f} -> {repl['reached']:.0f}, "
            f"p50 {plain['p50_ms']:.2f} -> {repl['p50_ms']:.2f} ms, {(after - before) / RATE_SECS:.0f} syncs/s")
        m.reap(rp)
        m.reap(redis)


def rate_plot(rows, png):
    plt = m.pyplot()
    if plt is None:
        return
    x = [r["rate"] for r in rows]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    ax1.plot(x, [r["repl"]["reached"] / max(r["plain"]["reached"], 1e-9) * 100 for r in rows], marker="o", label="rate reached, % of unreplicated")
    ax1.plot(x, [r["syncs_per_s"] for r in rows], marker="s", linestyle="--", label="syncs per second")
    ax1.set_xscale("log")
    ax1.set_xlabel("writes offered per second (50 connections)")
    ax1.legend(fontsize=8)
    ax1.grid(True, alpha=0.3)
    for key, mark in (("p50_ms", "o"), ("p99_ms", "^")):
        ax2.plot(x, [r["repl"][key] - r["plain"][key] for r in rows], marker=mark, label=f"added latency {key[:3]}")
    ax2.set_xscale("log")
    ax2.set_xlabel("writes offered per second (50 connections)")
    ax2.set_ylabel("ms")
    ax2.legend(fontsize=8)
    ax2.grid(True, alpha=0.3)
    fig.suptitle("redis under replication: overhead against write rate")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    log(f"plot: {os.path.relpath(png, REPO)}")


def takeover_ms(cl):
    text = m.tail(os.path.join(cl.work, "ferryd-b.log"), 4000)
    for line in text.splitlines():
        if "took over" in line and "ms from silence" in line:
            return float(line.rsplit(" ms from silence", 1)[0].rsplit(", ", 1)[1])
    return None


def part_failover(cl, work, args, res):
    for run in range(args.runs):
        cl.fresh_hosts()
        redis, inner = start_redis(cl, work)
        rp, _ = replicate(cl, work, inner)
        cout = os.path.join(work, "clients.out")
        clients = m.spawn(enter(cl.c) + ["python3", SEQ_CLIENTS, cl.service, str(REDIS_PORT), "10", "6"], cout)
        m.wait_line(cout, r"^started", clients, 10)
        time.sleep(2)
        cl.a.ip_cmd("link", "set", "eth0", "down")
        cl.a.stop_init()
        clients.wait(timeout=120)
        results = json.loads(m.tail(cout, 100000).splitlines()[-1])
        lost = errors = 0
        for i, c in enumerate(results):
            if c["error"]:
                errors += 1
                continue
            now = in_host(cl.c, ["timeout", "10", "redis-cli", "-h", cl.service, "GET", f"seq{i}"]).stdout.strip()
            if now != str(c["last"]):
                lost += 1
        row = {"run": run, "longest_ms": max(c["gap_ms"] for c in results), "takeover_ms": takeover_ms(cl),
               "lost": lost, "errors": errors, "increments": sum(c["count"] for c in results)}
        res["failover"].append(row)
        log(f"failover {run}: longest wait {row['longest_ms']:.0f} ms, takeover {row['takeover_ms']} ms, lost {lost}, errors {errors}")
        m.reap(rp)
        m.reap(clients)
        m.reap(redis)


def part_partition(cl, work, args, res):
    for run in range(args.runs):
        cl.fresh_hosts()
        redis, inner = start_redis(cl, work)
        rp, out = replicate(cl, work, inner)
        for rule in (["-A", "INPUT", "-s", cl.b.ip, "-j", "DROP"], ["-A", "OUTPUT", "-d", cl.b.ip, "-j", "DROP"]):
            m.sh("ip", "netns", "exec", cl.a.netns, "iptables", *rule)
        rp.wait(timeout=60)
        time.sleep(3)
        # A zombie (killed, not reaped yet) does not run.
        a_runs = in_host(cl.a, ["pgrep", "-r", "R,S,D,T", "-x", "redis-server"]).returncode == 0
        b_runs = in_host(cl.b, ["pgrep", "-r", "R,S,D,T", "-x", "redis-server"]).returncode == 0
        row = {"run": run, "a": a_runs, "b": b_runs, "split_brain": a_runs == b_runs}
        res["partition"].append(row)
        how = m.tail(out, 300).splitlines()[-1:] or [""]
        log(f"partition {run}: redis in a {a_runs}, in b {b_runs}; ferry replicate exit {rp.returncode}: {how[0]}")
        if row["split_brain"]:
            shutil.copytree(work, f"{work}-split-{run}", ignore=shutil.ignore_patterns("etcd"))
        m.reap(redis)


def write_markdown(res, args, out, started):
    L = ["# Replication benchmark (bench/replicate.py)", "",
         f"Command: `bench/replicate.py --parts {args.parts} --clients {args.clients} --requests {args.requests} --rates {args.rates} "
         f"--runs {args.runs}`; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(started))}, "
         f"load {os.getloadavg()[0]:.1f} at the end, {os.cpu_count()} CPUs.", ""]
    if res["load"]:
        L += ["## redis-benchmark, unreplicated vs replicated", "",
              "| test | clients | req/s plain | req/s replicated | ratio | p50 ms plain → repl. | p99 ms plain → repl. | syncs/s | KiB/sync |",
              "|---|---|---|---|---|---|---|---|---|"]
        for r in res["load"]:
            p, q = r["plain"], r["repl"]
            L.append(f"| {r['test'].upper()} | {r['clients']} | {p['rps']:.0f} | {q['rps']:.0f} | {q['rps'] / p['rps']:.1%} | "
                     f"{p['p50']:.2f} → {q['p50']:.2f} | {p['p99']:.2f} → {q['p99']:.2f} | {r['syncs_per_s']:.0f} | "
                     f"{r['bytes_per_sync'] / 1024:.0f} |")
        L += ["", "Where one sync's time goes (median over the syncs of each run, ms):", "",
              "| test | clients | " + " | ".join(PHASES) + " |", "|---|---|" + "---|" * len(PHASES)]
        for r in res["load"]:
            L.append(f"| {r['test'].upper()} | {r['clients']} | " + " | ".join(f"{r['phases'].get(k, 0):.2f}" for k in PHASES) + " |")
    if res["rate"]:
        L += ["", f"## Overhead against write rate ({RATE_CONNS} connections, SET, {RATE_SECS} s each)", "",
              "| writes/s offered | reached plain | reached replicated | ratio | p50 ms plain → repl. | p99 ms plain → repl. | syncs/s |",
              "|---|---|---|---|---|---|---|"]
        for r in res["rate"]:
            p, q = r["plain"], r["repl"]
            L.append(f"| {r['rate']} | {p['reached']:.0f} | {q['reached']:.0f} | {q['reached'] / max(p['reached'], 1e-9):.0%} | "
                     f"{p['p50_ms']:.2f} → {q['p50_ms']:.2f} | {p['p99_ms']:.2f} → {q['p99_ms']:.2f} | {r['syncs_per_s']:.0f} |")
        L += ["", "![overhead against write rate](benchmarks-replicate-rate.png)"]
    if res["failover"]:
        f = res["failover"]
        longest = [r["longest_ms"] for r in f]
        take = [r["takeover_ms"] for r in f if r["takeover_ms"] is not None]
        L += ["", "## Failover: host a dies under 10 clients", "",
              f"{len(f)} runs. Longest wait a client saw: median {statistics.median(longest):.0f} ms, max {max(longest):.0f} ms. "
              f"b's takeover (silence noticed to running): median {statistics.median(take) if take else float('nan'):.0f} ms. "
              f"Acknowledged increments lost: {sum(r['lost'] for r in f)}; clients with an error: {sum(r['errors'] for r in f)}.", "",
              "| run | longest wait ms | takeover ms | increments | lost | errors |", "|---|---|---|---|---|---|"]
        for r in f:
            L.append(f"| {r['run']} | {r['longest_ms']:.0f} | {r['takeover_ms']} | {r['increments']} | {r['lost']} | {r['errors']} |")
    if res["partition"]:
        p = res["partition"]
        L += ["", "## Partition between a and b (both reach etcd)", "",
              f"{len(p)} runs: b took over {sum(r['b'] and not r['a'] for r in p)}, a ran on {sum(r['a'] and not r['b'] for r in p)}, "
              f"split brain (both or none) {sum(r['split_brain'] for r in p)}."]
    text = "\n".join(L) + "\n"
    print(text)
    with open(out, "w") as fh:
        fh.write(text)


PHASES = ["presurvey", "socket options checked", "connections described", "network lock prepared", "sharing checked", "freeze", "survey",
          "network freeze", "tcp connections", "injected syscalls", "held pages", "pages", "write image", "thaw", "before_freeze_ms",
          "pause_ms", "send_and_store_ms", "total_ms"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--parts", default="load,rate,failover,partition")
    ap.add_argument("--clients", default="1,10,50")
    ap.add_argument("--requests", type=int, default=20000, help="redis-benchmark requests unreplicated (a fortieth replicated, at least 100 per client)")
    ap.add_argument("--runs", type=int, default=20, help="runs of failover and partition")
    ap.add_argument("--rates", default="20,50,100,200,500,1000,2000", help="writes per second offered by part rate")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--heartbeat-timeout-ms", type=int, help="ferry replicate's (its default: 300)")
    ap.add_argument("--out", default=os.path.join(REPO, "docs/benchmarks-replicate-latest.md"))
    args = ap.parse_args()
    if args.heartbeat_timeout_ms:
        HEARTBEAT.extend(["--heartbeat-timeout-ms", str(args.heartbeat_timeout_ms)])
    if os.geteuid() != 0:
        sys.exit("bench/replicate.py: needs root")
    for tool in ("redis-server", "redis-benchmark", "etcd", "iptables"):
        if shutil.which(tool) is None:
            sys.exit(f"bench/replicate.py: {tool} is not installed")
    for b in (m.FERRY, m.FERRYD):
        if not os.access(b, os.X_OK):
            sys.exit(f"bench/replicate.py: {b} missing: cargo build --release")
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda s, f: sys.exit(128 + s))
    signal.signal(signal.SIGINT, signal.default_int_handler)
    work = tempfile.mkdtemp(prefix="ferry-bench-replicate-")
    cl = None
    res = {"load": [], "rate": [], "failover": [], "partition": []}
    started = time.time()
    try:
        cl = Hosts(work)
        parts = args.parts.split(",")
        if "load" in parts:
            part_load(cl, work, args, res)
        if "rate" in parts:
            part_rate(cl, work, args, res)
            rate_plot(res["rate"], os.path.join(os.path.dirname(os.path.abspath(args.out)), "benchmarks-replicate-rate.png"))
        if "failover" in parts:
            part_failover(cl, work, args, res)
        if "partition" in parts:
            part_partition(cl, work, args, res)
        write_markdown(res, args, args.out, started)
    finally:
        m.clean_up(cl, work, args.keep, log)


if __name__ == "__main__":
    main()
