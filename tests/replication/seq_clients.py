"""seq_clients.py HOST PORT N SECONDS: N connections to a redis server,
each sending INCR seq<i> one after another for SECONDS and checking that
every reply is one more than the last (no acknowledged increment lost, none
applied twice). Prints one JSON line: per connection the replies counted,
the last value, the longest wait for a reply (ms) and the first error."""
import socket
import sys
import time

from client_threads import run_all


def run(host, port, i, secs, out):
    key = f"seq{i}"
    count, prev, gap, err = 0, None, 0.0, None
    try:
        s = socket.create_connection((host, port), timeout=30)
        f = s.makefile("rb")
        last = time.monotonic()
        end = last + secs
        while time.monotonic() < end:
            s.sendall(f"INCR {key}\r\n".encode())
            line = f.readline()
            now = time.monotonic()
            gap, last = max(gap, now - last), now
            if not line.startswith(b":"):
                err = f"{key}: reply {line!r}"
                break
            v = int(line[1:])
            if prev is not None and v != prev + 1:
                err = f"{key}: {v} after {prev}"
                break
            prev, count = v, count + 1
        s.close()
    except Exception as e:  # reported, not raised: the test reads them all
        err = f"{key}: {e!r}"
    out[i] = {"count": count, "last": prev, "gap_ms": gap * 1000, "error": err}


def main():
    if len(sys.argv) != 5 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        sys.exit(0 if len(sys.argv) == 2 else 2)
    host, port, n, secs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    run_all(n, lambda i, out: run(host, port, i, secs, out))


if __name__ == "__main__":
    main()
