#!/usr/bin/python3
"""What ending N repaired TCP sockets costs: a plain close against a
disconnect (connect with AF_UNSPEC, which in repair mode sends nothing and
takes the socket out of the established hash) followed by the close.

    /usr/bin/python3 bench/repair_close.py [N] [close|disc]

N loopback connections (a forked child holds the clients); the server's
ends are put into repair mode (TCP_REPAIR, root needed) and ended one by
one in this process.
"""
import socket, time, ctypes, sys, resource, os
h = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
resource.setrlimit(resource.RLIMIT_NOFILE, (h, h))
libc = ctypes.CDLL(None, use_errno=True)
N = int(sys.argv[1]) if len(sys.argv) > 1 else 10000
mode = sys.argv[2] if len(sys.argv) > 2 else "disc"
ls = socket.socket(); ls.bind(("127.0.0.1", 0)); ls.listen(4096)
port = ls.getsockname()[1]
r, w = os.pipe(); r2, w2 = os.pipe()
pid = os.fork()
if pid == 0:
    cl = []
    for i in range(N):
        c = socket.socket(); c.connect(("127.0.0.1", port)); c.send(b"x"*100); cl.append(c)
    os.write(w, b"k"); os.read(r2, 1); os._exit(0)
sv = []
import threading
def acc():
    for i in range(N):
        s, _ = ls.accept(); sv.append(s)
th = threading.Thread(target=acc); th.start(); th.join()
os.read(r, 1)
for s in sv:
    s.setsockopt(socket.IPPROTO_TCP, 19, 1)
unspec = (ctypes.c_char*16)()
fds = [s.detach() for s in sv]
t = time.perf_counter()
if mode == "disc":
    for fd in fds:
        if libc.connect(fd, unspec, 16) != 0: print("err", ctypes.get_errno()); break
    t1 = time.perf_counter()
    for fd in fds: os.close(fd)
    t2 = time.perf_counter()
    print(f"disconnect {1e3*(t1-t):.1f} ms, close after {1e3*(t2-t1):.1f} ms")
else:
    for fd in fds: os.close(fd)
    print(f"close {1e3*(time.perf_counter()-t):.1f} ms")
os.write(w2, b"k"); os.waitpid(pid, 0)
