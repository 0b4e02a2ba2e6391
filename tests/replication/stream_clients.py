"""stream_clients.py HOST PORT N SECONDS: N connections to
tests/replication/echo_server.c, each sending the server's byte pattern
for SECONDS while reading the echo back, with up to WINDOW bytes sent and
not yet echoed (so that the server's receive and send queues are full
when a sync reads them). Every echoed byte is checked against what was
sent, offset by offset. Then each connection waits for the rest of its
echo. Prints "started", then one JSON line: per connection the bytes sent
and echoed, the longest wait for echoed bytes (ms) and the first error."""
import socket
import sys
import threading
import time

from client_threads import run_all

PERIOD = 1000003
WINDOW = 256 * 1024
CHUNK = 8192
TABLE = bytes(((i * 2654435761) >> 13) & 0xFF for i in range(PERIOD))


def pattern(offset, n):
    start = offset % PERIOD
    out = TABLE[start:start + n]
    while len(out) < n:
        out += TABLE[:n - len(out)]
    return out


def run(host, port, secs, i, out):
    st = {"sent": 0, "echoed": 0, "gap_ms": 0.0, "error": None}
    out[i] = st
    try:
        s = socket.create_connection((host, port), timeout=30)
    except OSError as e:
        st["error"] = f"connect: {e!r}"
        return
    done = threading.Event()

    def receive():
        last = time.monotonic()
        try:
            while True:
                data = s.recv(65536)
                now = time.monotonic()
                if not data:
                    if not (done.is_set() and st["echoed"] >= st["sent"]):
                        st["error"] = f"the server closed after {st['echoed']} bytes"
                    return
                st["gap_ms"] = max(st["gap_ms"], (now - last) * 1000)
                last = now
                if data != pattern(st["echoed"], len(data)):
                    st["error"] = f"echoed bytes at {st['echoed']} differ from those sent"
                    return
                st["echoed"] += len(data)
        except OSError as e:
            st["error"] = f"receiving at {st['echoed']}: {e!r}"

    rx = threading.Thread(target=receive)
    rx.start()
    end = time.monotonic() + secs
    try:
        while time.monotonic() < end and rx.is_alive():
            if st["sent"] - st["echoed"] >= WINDOW:
                time.sleep(0.001)
                continue
            s.sendall(pattern(st["sent"], CHUNK))
            st["sent"] += CHUNK
    except OSError as e:
        st["error"] = st["error"] or f"sending at {st['sent']}: {e!r}"
    done.set()
    try:
        # The server closes once it echoed everything: the receiver's end.
        s.shutdown(socket.SHUT_WR)
    except OSError:
        pass
    rx.join(60)
    s.close()


def main():
    host, port, n, secs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    run_all(n, lambda i, out: run(host, port, secs, i, out))


if __name__ == "__main__":
    main()
