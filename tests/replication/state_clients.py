"""state_clients.py HOST PORT SECONDS: against
tests/replication/settings_server.c, changes state ferry reads by injected
calls between syncs and reads it back after a failover. The timer slack
is set to 70000, then (a second later, after syncs that found nothing
changed and kept the answers of the sync before) to 80000, with a
SIGUSR1 handler and an alternate signal stack installed. Each "ok"
leaves the primary only once a sync holding the change is stored.
Prints "started", "changed" after the last "ok", then at SECONDS after
the start asks "state" (of whichever host runs the server then) and
prints one JSON line: what "state" answered (as "get"), and the first
error."""
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
        for line in ("get", "slack 70000"):
            ask(s, f, line)
        time.sleep(1.0)
        for line in ("slack 80000", "action", "altstack"):
            if ask(s, f, line) != "ok":
                raise OSError(f"{line} refused")
        print("changed", flush=True)
        time.sleep(max(0.0, start + secs - time.time()))
        out[0]["get"] = ask(s, f, "state")
    except OSError as e:
        out[0]["error"] = repr(e)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
