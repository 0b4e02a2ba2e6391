#!/usr/bin/python3
"""rate_clients.py HOST PORT CONNECTIONS RATE SECONDS: CONNECTIONS redis
connections that together offer RATE writes per second (SET k<i> <n>, each
connection paced at RATE/CONNECTIONS by its own clock, one request in
flight per connection) for SECONDS. A connection whose reply comes later
than its next send time sends at once: the rate reached is then below the
rate offered. Prints one JSON line: writes done, the rate reached, and
the latency of each write (send to reply) at p50/p99/max in ms, errors."""
import json
import socket
import sys
import threading
import time


def run(host, port, i, interval, secs, out):
    lat, err = [], None
    try:
        s = socket.create_connection((host, port), timeout=30)
        f = s.makefile("rb")
        start = time.monotonic()
        due, end = start + interval * (i % 97) / 97, start + secs
        n = 0
        while True:
            now = time.monotonic()
            if now >= end:
                break
            if due > now:
                time.sleep(due - now)
            t0 = time.monotonic()
            s.sendall(f"SET k{i} {n}\r\n".encode())
            line = f.readline()
            lat.append(time.monotonic() - t0)
            if not line.startswith(b"+OK"):
                err = f"k{i}: reply {line!r}"
                break
            n += 1
            due += interval
        s.close()
    except Exception as e:  # reported, not raised: the caller reads them all
        err = f"k{i}: {e!r}"
    out[i] = (lat, err)


def pct(xs, q):
    return xs[min(len(xs) - 1, int(q * len(xs)))] * 1000 if xs else 0.0


def main():
    host, port, conns, rate, secs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
    out = {}
    interval = conns / rate
    threads = [threading.Thread(target=run, args=(host, port, i, interval, secs, out)) for i in range(conns)]
    t = time.monotonic()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    took = time.monotonic() - t
    lat = sorted(x for i in out for x in out[i][0])
    errors = [out[i][1] for i in out if out[i][1]]
    print(json.dumps({"offered": rate, "writes": len(lat), "reached": len(lat) / took if took else 0.0,
                      "p50_ms": pct(lat, 0.5), "p99_ms": pct(lat, 0.99), "max_ms": pct(lat, 1.0),
                      "errors": errors[:3]}))


if __name__ == "__main__":
    main()
