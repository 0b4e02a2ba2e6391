"""descriptor_clients.py HOST PORT SECONDS: against
tests/replication/settings_server.c, changes what a sync describes of a
connection with fcntl alone (no setsockopt) between syncs and reads it
back after a failover. The connection first asks "get", then (a second
later, after syncs that found nothing changed and kept the connection's
description of the sync before) has its close-on-exec flag set and the
server made its owner. Each "ok" leaves the primary only once a sync
holding the change is stored. Prints "started", "changed" after the
last "ok", then at SECONDS after the start asks "fd" (of whichever host
runs the server then) and prints one JSON line: what "fd" answered (as
"get"), and the first error."""
import json
import socket
import sys
import time

from sockopt_clients import ask


def main():
    host, port, secs = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    start = time.time()
    print("started", flush=True)
    out = [{"get": None, "error": None}]
    try:
        s = socket.create_connection((host, port), timeout=30)
        f = s.makefile("r")
        ask(s, f, "get")
        time.sleep(1.0)
        for line in ("cloexec", "owner"):
            if ask(s, f, line) != "ok":
                raise OSError(f"{line} refused")
        print("changed", flush=True)
        time.sleep(max(0.0, start + secs - time.time()))
        out[0]["get"] = ask(s, f, "fd")
    except OSError as e:
        out[0]["error"] = repr(e)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
