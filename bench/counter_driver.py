"""What the tiny-listener benchmarks share: starting examples/counter_server.c
and reaping what ferry leaves to this driver (a subreaper)."""
import os
import subprocess
import time


def reap_forever():
    """Reaps every child (and orphan handed over) for as long as the driver runs."""
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            time.sleep(0.005)


def start_server(binary):
    """Starts a built counter_server; returns its (pid, port)."""
    # stdout to a file: a pipe to this driver would be a descriptor shared
    # with a process outside the tree, which ferry rightly refuses.
    log = binary + ".log"
    with open(log, "w") as out:
        subprocess.Popen([binary, "0"], stdout=out, stdin=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)
    deadline = time.time() + 10
    while time.time() < deadline:
        with open(log) as f:
            words = f.readline().split()
        if len(words) >= 6:
            return int(words[5]), int(words[3].rsplit(":", 1)[1])
        time.sleep(0.01)
    raise SystemExit("counter_server did not start")
