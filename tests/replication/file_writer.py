"""file_writer.py DIR ADDR: a service whose memory and files must agree.
It appends to DIR/big.dat and keeps in memory how much it wrote. On one
connection at a time on ADDR:7000 it answers "W N" by appending N MiB
(one write per MiB) and replying "ok SIZE", and "S" with
"S SIZE_IN_MEMORY SIZE_OF_THE_FILE". A copy whose files are behind or
ahead of its memory answers S with two different numbers."""
import os
import socket
import sys


def main():
    d, addr = sys.argv[1], sys.argv[2]
    path = os.path.join(d, "big.dat")
    f = open(path, "ab", buffering=0)
    size = f.tell()
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, 7000))
    s.listen()
    print("up", flush=True)
    chunk = b"x" * (1 << 20)
    while True:
        c, _ = s.accept()
        for line in c.makefile("rb"):
            w = line.split()
            if w and w[0] == b"W":
                for _ in range(int(w[1])):
                    f.write(chunk)
                    size += len(chunk)
                c.sendall(b"ok %d\n" % size)
            elif w and w[0] == b"S":
                c.sendall(b"S %d %d\n" % (size, os.path.getsize(path)))
        c.close()


if __name__ == "__main__":
    main()
