#!/usr/bin/python3
"""What one sock_diag TCP dump (AF_INET) costs here, by the states asked
for: the kernel walks its whole connection table for any state but
LISTEN, and formats only the sockets in the states asked for. And what
one socket asked alone costs (a listener of this script's, by its
address: no NLM_F_DUMP, one hash lookup), with INET_DIAG_INFO. And
both families' TIME_WAIT entries: two SOCK_DIAG_BY_FAMILY dumps against
one legacy TCPDIAG_GETSOCK dump, which lists every family in one walk.

Usage: bench/sockdiag_walk.py [REPS]   (mean ms per dump over REPS, 50)
"""
import socket
import struct
import sys
import time

NETLINK_SOCK_DIAG, SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST_DUMP, NLMSG_DONE = 4, 20, 0x301, 3
TCPDIAG_GETSOCK = 18


def dump(states, family=socket.AF_INET, legacy=False):
    s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_SOCK_DIAG)
    try:
        if legacy:  # inet_diag_req: family (any), lengths, ext; id; states; dbs
            req, kind = bytes(4) + bytes(48) + struct.pack("=II", states, 0), TCPDIAG_GETSOCK
        else:
            req = struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 0, 0, states) + bytes(48)
            kind = SOCK_DIAG_BY_FAMILY
        s.send(struct.pack("=IHHII", 16 + len(req), kind, NLM_F_REQUEST_DUMP, 1, 0) + req)
        n = 0
        while True:
            b = s.recv(65536)
            off = 0
            while off < len(b):
                length, kind = struct.unpack_from("=IH", b, off)
                if kind == NLMSG_DONE:
                    return n
                n += 1
                off += (length + 3) & ~3
    finally:
        s.close()


def ask_alone(s, port):
    """One request naming the listener at 127.0.0.1:port, its answer."""
    req = struct.pack("=BBBBI", socket.AF_INET, socket.IPPROTO_TCP, 2, 0, 0xFFFFFFFF)
    req += struct.pack(">HH", port, 0) + socket.inet_aton("127.0.0.1") + bytes(28)
    req += struct.pack("=I", 0) + b"\xff" * 8
    s.send(struct.pack("=IHHII", 16 + len(req), SOCK_DIAG_BY_FAMILY, 1, 1, 0) + req)
    b = s.recv(65536)
    if struct.unpack_from("=H", b, 4)[0] != SOCK_DIAG_BY_FAMILY:
        raise SystemExit("the listener asked alone was not found")


def main():
    if len(sys.argv) > 1 and sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        return
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 50
    for name, states in [("every state", 0xFFFFFFFF), ("LISTEN", 1 << 10),
                         ("LISTEN, SYN_RECV", (1 << 10) | (1 << 3) | (1 << 12)),
                         ("TIME_WAIT", 1 << 6)]:
        t = time.perf_counter()
        for _ in range(reps):
            n = dump(states)
        ms = (time.perf_counter() - t) / reps * 1e3
        print(f"{name:18s} {ms:.3f} ms per AF_INET dump ({n} sockets)")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_SOCK_DIAG)
    t = time.perf_counter()
    for _ in range(reps * 20):
        ask_alone(s, listener.getsockname()[1])
    us = (time.perf_counter() - t) / (reps * 20) * 1e6
    print(f"{'one asked alone':18s} {us:.1f} us per listener asked alone, with INET_DIAG_INFO")
    for name, run in [("TIME_WAIT, 2 dumps", lambda: dump(1 << 6) + dump(1 << 6, socket.AF_INET6)),
                      ("TIME_WAIT, 1 walk", lambda: dump(1 << 6, legacy=True))]:
        t = time.perf_counter()
        for _ in range(reps):
            n = run()
        ms = (time.perf_counter() - t) / reps * 1e3
        print(f"{name:18s} {ms:.3f} ms for both families ({n} sockets)")


if __name__ == "__main__":
    main()
