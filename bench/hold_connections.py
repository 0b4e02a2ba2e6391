#!/usr/bin/python3
"""Holds N loopback TCP connections of its own (2N sockets and a listener
in this network namespace) for at most SECONDS, then closes them and
exits: the host's other connections, which every sock_diag dump walks.

Usage: bench/hold_connections.py [N] [SECONDS]   (10000, 600; root for
the fd limit). Prints "holding N" once they are all up. Ends early on
SIGTERM or SIGINT.
"""
import resource
import signal
import socket
import sys
import time


def main():
    if len(sys.argv) > 1 and sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        return
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 10000
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 600
    want = 2 * n + 64
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, max(hard, want)))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1024)
    held = []
    try:
        for _ in range(n):
            c = socket.create_connection(listener.getsockname())
            a, _ = listener.accept()
            held += [c, a]
        print(f"holding {n}", flush=True)
        time.sleep(seconds)
    except KeyboardInterrupt:
        pass
    finally:
        for s in held:
            s.close()
        listener.close()


if __name__ == "__main__":
    main()
