"""mc_clients.py HOST PORT N SECONDS: N connections to a memcached server,
each for SECONDS storing a new value under its own key (set k<i>) and
incrementing its own counter (incr c<i>) in one round trip, checking every
reply: STORED, and a counter one more than the last (no acknowledged write
lost, none applied twice). Prints "started", then one JSON line: per
connection the rounds counted, the last counter value, the longest wait
for a reply (ms) and the first error.

mc_clients.py HOST PORT N check RESULTS: reads the JSON line of an earlier
run from the file RESULTS and checks that the server holds, for each
connection, the last value and counter its client was told were stored;
prints "ok" or the differences (exit status 1)."""
import json
import socket
import sys
import time

from client_threads import run_all


def value(i, n):
    return f"v{i}-{n}"


def run(host, port, i, secs, out):
    count, last, gap, err = 0, 0, 0.0, None
    try:
        s = socket.create_connection((host, port), timeout=30)
        f = s.makefile("rb")
        s.sendall(f"set c{i} 0 0 1\r\n0\r\n".encode())
        if f.readline() != b"STORED\r\n":
            raise RuntimeError("the counter was not stored")
        t = time.monotonic()
        end = t + secs
        while time.monotonic() < end:
            n = last + 1
            v = value(i, n)
            s.sendall(f"set k{i} 0 0 {len(v)}\r\n{v}\r\nincr c{i} 1\r\n".encode())
            stored, counted = f.readline(), f.readline()
            now = time.monotonic()
            gap, t = max(gap, now - t), now
            if stored != b"STORED\r\n":
                err = f"k{i}: reply {stored!r}"
                break
            if counted != f"{n}\r\n".encode():
                err = f"c{i}: {counted!r} after {last}"
                break
            last, count = n, count + 1
        s.close()
    except Exception as e:  # reported, not raised: the test reads them all
        err = f"connection {i}: {e!r}"
    out[i] = {"count": count, "last": last, "gap_ms": gap * 1000, "error": err}


def get(f, s, key):
    s.sendall(f"get {key}\r\n".encode())
    head = f.readline()
    if head == b"END\r\n":
        return None
    data = f.readline().rstrip(b"\r\n").decode()
    f.readline()  # END
    return data


def check(host, port, n, path):
    results = json.loads(open(path).read().strip().splitlines()[-1])
    s = socket.create_connection((host, port), timeout=30)
    f = s.makefile("rb")
    bad = []
    for i in range(n):
        last = results[i]["last"]
        want = (value(i, last) if last else None, str(last))
        got = (get(f, s, f"k{i}"), get(f, s, f"c{i}"))
        if got != want:
            bad.append(f"connection {i}: {got} at the server, {want} told to its client")
    print("\n".join(bad) if bad else "ok", flush=True)
    sys.exit(1 if bad else 0)


def main():
    if len(sys.argv) not in (5, 6) or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        sys.exit(0 if len(sys.argv) == 2 else 2)
    host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    if sys.argv[4] == "check":
        check(host, port, n, sys.argv[5])
    secs = float(sys.argv[4])
    run_all(n, lambda i, out: run(host, port, i, secs, out))


if __name__ == "__main__":
    main()
