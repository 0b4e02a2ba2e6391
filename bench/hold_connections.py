#!/usr/bin/python3
"""Holds N loopback TCP connections of its own (2N sockets and a listener
per process in this network namespace) for at most SECONDS, then closes
them and exits: the host's other connections, which every sock_diag dump
walks. Past the fd limit the connections are split over child processes
(each its own listener), ended with the parent.

Usage: bench/hold_connections.py [N] [SECONDS]   (10000, 600). Prints
"holding N" once they are all up. Ends early on SIGTERM or SIGINT.
"""
import os
import resource
import signal
import socket
import sys
import time


def hold(n, ready_fd, seconds):
    """Makes n connections, says so on ready_fd, holds them."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1024)
    held = []
    try:
        for _ in range(n):
            c = socket.create_connection(listener.getsockname())
            a, _ = listener.accept()
            held += [c, a]
        os.write(ready_fd, b"x")
        time.sleep(seconds)
    finally:
        for s in held:
            s.close()
        listener.close()


def main():
    if len(sys.argv) > 1 and sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        return
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 10000
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 600
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    per = max(1, (hard - 64) // 2)
    parts = [min(per, n - i) for i in range(0, n, per)]
    r, w = os.pipe()
    children = []
    for part in parts[1:]:
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
            try:
                hold(part, w, seconds)
            finally:
                os._exit(0)
        children.append(pid)

    def end(*_):
        for pid in children:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        sys.exit(0)

    signal.signal(signal.SIGTERM, end)
    try:
        ready = os.fork()
        if ready == 0:
            for _ in parts:
                os.read(r, 1)
            print(f"holding {n}", flush=True)
            os._exit(0)
        os.close(r)
        hold(parts[0], w, seconds)
    except KeyboardInterrupt:
        pass
    finally:
        end()


if __name__ == "__main__":
    main()
