"""The run of the replication client scripts: one thread a connection."""
import json
import threading


def run_all(n, work):
    """Runs work(i, out) for each of n connections, each in its thread
    storing its result in out[i]; prints "started" once all are started,
    then out as one JSON line once all ended."""
    out = [None] * n
    threads = [threading.Thread(target=work, args=(i, out)) for i in range(n)]
    for t in threads:
        t.start()
    print("started", flush=True)
    for t in threads:
        t.join()
    print(json.dumps(out), flush=True)
