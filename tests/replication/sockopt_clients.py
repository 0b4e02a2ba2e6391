"""sockopt_clients.py HOST PORT SECONDS: against
tests/replication/settings_server.c, changes socket options between
syncs and reads them back after a failover. Connection 1 has its
TCP_KEEPIDLE set to 77, then (a second later, after syncs that found
nothing changed) to 78; connection 2 is made after the first change and
set to 91. Each "ok" leaves the primary only once a sync holding the
change is stored. Prints "started", "changed" after the last "ok", then
at SECONDS after the start reads both connections' options (from
whichever host runs the server then) and prints one JSON line: per
connection what "get" answered, and the first error."""
import json
import socket
import sys
import time


def ask(s, f, line):
    s.sendall(line.encode() + b"\n")
    answer = f.readline()
    if not answer:
        raise OSError(f"connection closed after {line!r}")
    return answer.strip()


def main():
    host, port, secs = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    start = time.time()
    print("started", flush=True)
    out = [{"get": None, "error": None}, {"get": None, "error": None}]
    try:
        s1 = socket.create_connection((host, port), timeout=30)
        f1 = s1.makefile("r")
        for line in ("get", "keepidle 77"):
            ask(s1, f1, line)
        time.sleep(1.0)
        s2 = socket.create_connection((host, port), timeout=30)
        f2 = s2.makefile("r")
        ask(s2, f2, "keepidle 91")
        time.sleep(1.0)
        if ask(s1, f1, "keepidle 78") != "ok":
            raise OSError("keepidle 78 refused")
        print("changed", flush=True)
        time.sleep(max(0.0, start + secs - time.time()))
        for i, (s, f) in enumerate(((s1, f1), (s2, f2))):
            out[i]["get"] = ask(s, f, "get")
    except OSError as e:
        for c in out:
            if c["get"] is None and c["error"] is None:
                c["error"] = repr(e)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
