"""change_clients.py HOST PORT SECONDS FIRST CHANGES READ: against
tests/replication/settings_server.c, changes what a sync reads of the
server between syncs and reads it back after a failover. FIRST and
CHANGES are comma-separated commands of the server: FIRST are asked at
once (e.g. "get,slack 70000"), CHANGES a second later, after syncs that
found nothing changed and kept what the sync before read (e.g.
"cloexec,owner": fcntl alone; "slack 80000,action,altstack": state read
by injected calls); each must answer "ok", which leaves the primary only
once a sync holding the change is stored. Prints "started", "changed"
after the last "ok", then at SECONDS after the start asks READ (of
whichever host runs the server then) and prints one JSON line: its
answer (as "get"), and the first error."""
import json
import socket
import sys
import time

from sockopt_clients import ask


def main():
    host, port, secs = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    first, changes, read = sys.argv[4].split(","), sys.argv[5].split(","), sys.argv[6]
    start = time.time()
    print("started", flush=True)
    out = [{"get": None, "error": None}]
    try:
        s = socket.create_connection((host, port), timeout=30)
        f = s.makefile("r")
        for line in first:
            ask(s, f, line)
        time.sleep(1.0)
        for line in changes:
            if ask(s, f, line) != "ok":
                raise OSError(f"{line} refused")
        print("changed", flush=True)
        time.sleep(max(0.0, start + secs - time.time()))
        out[0]["get"] = ask(s, f, read)
    except OSError as e:
        out[0]["error"] = repr(e)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
